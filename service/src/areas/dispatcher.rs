//! The tf.data dispatcher area's calls, in the journal's terms: each takes
//! a journal command (or plain values) and answers domain values; the wire
//! (`crate::wire::tfdata`) translates TensorFlow's messages to and from
//! them, and runs every call on the leader. A call reads the replicated
//! state or proposes one update. A NOT_FOUND, which ends a TF client's input
//! pipeline, is only ever answered after a read barrier: a new leader that
//! has not applied everything yet does not deny what exists.

use std::collections::HashSet;
use std::sync::Arc;

use bytes::Bytes;
use journal::pb::dispatcher as cmd;
use journal::pb::update::Command;
use journal::{DomainError, Namespace, Outcome};
use tonic::Status;

use crate::core::{Call, CallError, CallResult, Core};
use crate::duties::dispatcher::{DispatcherDuty, Quorum, TfDataConfig};

/// The static sharding policies (FILE, DATA, FILE_OR_DATA, HINT).
fn static_sharding(policy: i32) -> bool {
    (2..=5).contains(&policy)
}

/// The wire status of a dispatcher domain error (no payloads in this dialect).
pub fn status(e: &DomainError) -> Status {
    Status::new(tonic::Code::from_i32(e.code), e.message.clone())
}

/// A task as a worker runs it: what TensorFlow's TaskDef carries, its
/// dataset inline (workers need no shared file system).
#[derive(Clone, Debug, Default)]
pub struct TaskDefinition {
    /// The dataset's serialized definition.
    pub dataset: Bytes,
    /// The dataset's id.
    pub dataset_id: String,
    /// The task's id.
    pub task_id: i64,
    /// Its iteration.
    pub iteration_id: i64,
    /// The job's consumers, for a coordinated read.
    pub num_consumers: Option<i64>,
    /// The worker that runs it.
    pub worker_address: String,
    /// 1 when the job hands out splits (DYNAMIC), else 0.
    pub num_split_providers: i64,
    /// The job's sharding policy.
    pub sharding_policy: i32,
    /// Static sharding: the workers, and this one's index (-1: not listed).
    pub num_workers: i64,
    /// See `num_workers`.
    pub worker_index: i64,
    /// The job shares elements across trainers.
    pub use_cross_trainer_cache: bool,
}

/// What a worker's heartbeat is answered: the tasks it should start and
/// those it should drop.
#[derive(Debug, Default)]
pub struct WorkerTasks {
    /// Tasks new to the worker.
    pub new: Vec<TaskDefinition>,
    /// Tasks it runs that are gone.
    pub delete: Vec<i64>,
}

/// An iteration client acquired, and the tasks of the iteration if this
/// call created it (to be pushed to their workers).
#[derive(Debug)]
pub struct AcquiredClient {
    /// The client id.
    pub client_id: i64,
    /// The new iteration's tasks (none if it existed).
    pub created: Vec<TaskDefinition>,
}

/// A task of an iteration as a client reads it.
#[derive(Clone, Debug, Default)]
pub struct TaskView {
    /// Its worker.
    pub worker_address: String,
    /// Its id.
    pub task_id: i64,
    /// Its iteration.
    pub iteration_id: i64,
    /// The round a coordinated read starts it at.
    pub starting_round: i64,
    /// The worker's tags.
    pub worker_tags: Vec<String>,
    /// The worker's uid.
    pub worker_uid: i64,
    /// The worker's transfer servers (serialized DataTransferServerInfo).
    pub transfer_servers: Vec<Bytes>,
}

/// What a client's heartbeat is answered: its iteration's tasks, whether it
/// finished, and the round to block at (a coordinated read).
#[derive(Debug, Default)]
pub struct ClientView {
    /// The iteration's tasks.
    pub tasks: Vec<TaskView>,
    /// The iteration finished.
    pub finished: bool,
    /// The round a coordinated read blocks at, if any.
    pub block_round: Option<i64>,
}

/// The dispatcher's calls.
pub struct Dispatcher {
    core: Arc<Core>,
    duty: Arc<DispatcherDuty>,
    config: TfDataConfig,
}

impl Dispatcher {
    /// Calls through `core`, with the leader's `duty` and `config`.
    pub fn new(core: Arc<Core>, duty: Arc<DispatcherDuty>, config: TfDataConfig) -> Self {
        Dispatcher { core, duty, config }
    }

    /// The core.
    pub fn core(&self) -> &Arc<Core> {
        &self.core
    }

    /// The version GetVersion answers.
    pub fn version(&self) -> i64 {
        self.config.version
    }

    /// NOT_FOUND if the call's namespace does not exist here (a call on the
    /// leader after its admission: a delete raced it).
    pub fn namespace_exists(&self, c: &Call) -> CallResult<()> {
        self.core.read(c, |_| ())
    }

    /// Reads the call's namespace (its part of the state as it was before
    /// a delete raced the call: nothing).
    fn read<T: Default>(&self, c: &Call, f: impl FnOnce(Namespace<'_>) -> T) -> T {
        self.core.read(c, f).unwrap_or_default()
    }

    /// Proposes `command` for call `c` on this node (the leader); a domain
    /// error is the call's.
    async fn propose(&self, c: &Call, command: impl Into<Command>) -> CallResult<Outcome> {
        let u = c.update(command);
        let applied = self.core.router().leader().propose(&u).await?;
        match applied.outcome.error {
            Some(e) => Err(e.into()),
            None => Ok(applied.outcome),
        }
    }

    /// `f` of dataset `id`, or NOT_FOUND (confirmed on an up-to-date state).
    async fn dataset<T>(
        &self,
        c: &Call,
        id: &str,
        f: impl Fn(&journal::dispatcher::Dataset) -> T,
    ) -> CallResult<T> {
        let found = self
            .read_confirmed(c, |s| s.dispatcher().dataset(id).map(&f))
            .await?;
        found.ok_or_else(|| Status::not_found(format!("Dataset id {id} not found")).into())
    }

    /// Reads `f` from the state; when it finds nothing, confirms on an
    /// up-to-date state before answering so.
    async fn read_confirmed<T>(
        &self,
        c: &Call,
        f: impl Fn(Namespace<'_>) -> Option<T>,
    ) -> CallResult<Option<T>> {
        if let Some(v) = self.read(c, &f) {
            return Ok(Some(v));
        }
        self.core.router().leader().read_barrier().await?;
        Ok(self.read(c, f))
    }

    // ------------------------------------------------------------ workers ----

    /// WorkerHeartbeat: registers the worker when it is new or changed, and
    /// answers the tasks it should start and those it should drop (it runs
    /// `current`).
    pub async fn worker_heartbeat(
        &self,
        c: &Call,
        hb: cmd::WorkerHeartbeat,
        current: &[i64],
    ) -> CallResult<WorkerTasks> {
        if !self.config.worker_addresses.is_empty() && self.worker_index(&hb.address).is_none() {
            return Err(Status::failed_precondition(format!(
                "Worker {} is not in the static worker list of this dispatcher ({}): static sharding needs a fixed list of workers",
                hb.address,
                self.config.worker_addresses.join(",")
            ))
            .into());
        }
        let address = hb.address.clone();
        if self.read(c, |s| s.dispatcher().worker_heartbeat_changes(&hb)) {
            self.propose(c, hb).await?;
        }
        self.duty.heard_worker(c.namespace_key(), &address);
        let running: HashSet<i64> = current.iter().copied().collect();
        Ok(self.read(c, |s| {
            let mine = s.dispatcher().worker_tasks(&address);
            WorkerTasks {
                new: mine
                    .iter()
                    .filter(|t| !running.contains(&t.id))
                    .filter_map(|t| self.task_definition(s, t))
                    .collect(),
                delete: current
                    .iter()
                    .filter(|id| !mine.iter().any(|t| t.id == **id))
                    .copied()
                    .collect(),
            }
        }))
    }

    /// WorkerUpdate: these tasks completed (unknown ids are ignored).
    pub async fn finish_tasks(&self, c: &Call, finished: cmd::FinishTasks) -> CallResult<()> {
        if !finished.task_ids.is_empty() {
            self.propose(c, finished).await?;
        }
        Ok(())
    }

    /// GetWorkers: every worker's address.
    pub fn workers(&self, c: &Call) -> Vec<String> {
        self.read(c, |s| {
            s.dispatcher()
                .workers()
                .map(|w| w.address.clone())
                .collect()
        })
    }

    /// The index of a worker in the static worker list (`%port%` matches
    /// any port).
    fn worker_index(&self, address: &str) -> Option<usize> {
        self.config.worker_addresses.iter().position(|w| {
            w == address
                || w.strip_suffix("%port%").is_some_and(|host| {
                    address.strip_prefix(host).is_some_and(|port| {
                        !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit())
                    })
                })
        })
    }

    /// The definition of `task`, with its dataset inline.
    fn task_definition(
        &self,
        s: Namespace<'_>,
        task: &journal::dispatcher::Task,
    ) -> Option<TaskDefinition> {
        let d = s.dispatcher();
        let it = d.iteration(task.iteration_id)?;
        let job = d.job(it.job_id)?;
        let dataset = d.dataset(&job.dataset_id)?;
        let (num_workers, worker_index) = if static_sharding(job.sharding_policy) {
            let index = self
                .worker_index(&task.worker_address)
                .map_or(-1, |i| i as i64);
            (self.config.worker_addresses.len() as i64, index)
        } else {
            (0, 0)
        };
        Some(TaskDefinition {
            dataset: dataset.definition.clone(),
            dataset_id: dataset.id.clone(),
            task_id: task.id,
            iteration_id: it.id,
            num_consumers: job.num_consumers,
            worker_address: task.worker_address.clone(),
            num_split_providers: i64::from(job.split_source.is_some()),
            sharding_policy: job.sharding_policy,
            num_workers,
            worker_index,
            use_cross_trainer_cache: job.use_cross_trainer_cache,
        })
    }

    // ----------------------------------------------------------- datasets ----

    /// GetDatasetDef: dataset `id`'s definition.
    pub async fn dataset_definition(&self, c: &Call, id: &str) -> CallResult<Bytes> {
        self.dataset(c, id, |d| d.definition.clone()).await
    }

    /// GetDataServiceMetadata: dataset `id`'s metadata.
    pub async fn dataset_metadata(&self, c: &Call, id: &str) -> CallResult<Bytes> {
        self.dataset(c, id, |d| d.metadata.clone()).await
    }

    /// GetOrRegisterDataset: the dataset's id.
    pub async fn register_dataset(
        &self,
        c: &Call,
        register: cmd::RegisterDataset,
    ) -> CallResult<String> {
        let out = self.propose(c, register).await?;
        Ok(out.dataset_id().unwrap_or_default().to_string())
    }

    /// DisableCompressionAtRuntime: the dataset's decision (the first one
    /// wins): `Some(disabled)`, or `None` when it has no compression.
    pub async fn disable_compression(
        &self,
        c: &Call,
        disable: cmd::DisableCompression,
    ) -> CallResult<Option<bool>> {
        let out = self.propose(c, disable).await?;
        Ok(out.compression_decision().flatten())
    }

    // -------------------------------------------------- jobs and iterations ----

    /// A named job that exists, answered from the state: its parameters
    /// never change, so no proposal is needed. `None`: not there.
    pub fn existing_job(&self, c: &Call, job: &cmd::GetOrCreateJob) -> Option<CallResult<i64>> {
        let found = self.read(c, |s| s.dispatcher().existing_job(job))?;
        Some(found.map_err(CallError::from))
    }

    /// GetOrCreateJob (an anonymous job's name gets the suffix the command
    /// carries): the job's id.
    pub async fn create_job(&self, c: &Call, job: cmd::GetOrCreateJob) -> CallResult<i64> {
        let out = self.propose(c, job).await?;
        Ok(out.job_id().unwrap_or_default())
    }

    /// GetOrCreateIteration: the client acquired, and the new iteration's
    /// tasks if this call created it.
    pub async fn get_or_create_iteration(
        &self,
        c: &Call,
        get: cmd::GetOrCreateIteration,
    ) -> CallResult<AcquiredClient> {
        let out = self.propose(c, get).await?;
        let acquired =
            crate::core::call::required(out.iteration_client(), "GetOrCreateIteration's client")?;
        self.duty.acquired(c.namespace_key(), acquired.client_id);
        let created = if acquired.created {
            self.read(c, |s| {
                let d = s.dispatcher();
                d.iteration(acquired.iteration_id)
                    .map(|it| {
                        d.iteration_tasks(it)
                            .into_iter()
                            .filter_map(|t| self.task_definition(s, t))
                            .collect()
                    })
                    .unwrap_or_default()
            })
        } else {
            Vec::new()
        };
        Ok(AcquiredClient {
            client_id: acquired.client_id,
            created,
        })
    }

    /// ReleaseIterationClient.
    pub async fn release_client(
        &self,
        c: &Call,
        release: cmd::ReleaseIterationClient,
    ) -> CallResult<()> {
        self.propose(c, release).await.map(|_| ())
    }

    /// GetSplit: the next split of a DYNAMIC iteration, journaled before it
    /// is answered, so no split is handed out twice, also across leaders.
    pub async fn next_split(&self, c: &Call, produce: cmd::ProduceSplit) -> CallResult<cmd::Split> {
        let out = self.propose(c, produce).await?;
        Ok(out.split().unwrap_or(cmd::Split {
            value: 0,
            end_of_splits: true,
        }))
    }

    /// MaybeRemoveTask: once every consumer of the coordinated read asked to
    /// remove task `task_id` at the same `round` (within 10 s, upstream's
    /// TaskRemover), the task is removed and every asker hears `true`.
    pub async fn maybe_remove_task(
        &self,
        c: &Call,
        task_id: i64,
        consumer_index: i64,
        round: i64,
    ) -> CallResult<bool> {
        let found = self.read(c, |s| {
            let d = s.dispatcher();
            let t = d.task(task_id)?;
            let consumers = d
                .iteration(t.iteration_id)
                .and_then(|it| d.job(it.job_id))
                .and_then(|j| j.num_consumers);
            Some((t.removed, consumers))
        });
        let consumers = match found {
            // Unknown or already removed: nothing left to remove.
            None | Some((true, _)) => return Ok(true),
            Some((false, None)) => return Ok(false),
            Some((false, Some(consumers))) => consumers,
        };
        let ns = c.namespace_key();
        let quorum = self
            .duty
            .remove_quorum(ns, task_id, consumer_index, round, consumers)
            .await;
        match quorum {
            Quorum::Reached => {
                self.propose(c, cmd::RemoveTask { task_id }).await?;
                self.duty.removed(ns, task_id);
                Ok(true)
            }
            Quorum::Removed => Ok(true),
            Quorum::Failed => Ok(false),
        }
    }

    /// ClientHeartbeat: a coordinated read with a task waiting to join lets
    /// the heartbeat's rounds decide on it (the round-robin protocol, in
    /// the journal); then the iteration's tasks and whether it finished.
    pub async fn client_heartbeat(
        &self,
        c: &Call,
        hb: cmd::ClientHeartbeat,
    ) -> CallResult<ClientView> {
        let client = hb.iteration_client_id;
        let pending = self.read(c, |s| {
            let d = s.dispatcher();
            d.client_iteration(client)
                .is_some_and(|it| !it.pending.is_empty())
        });
        if pending {
            self.propose(c, hb).await?;
        }
        let view = self.read_confirmed(c, |s| client_view(s, client)).await?;
        match view {
            Some(Ok(view)) => {
                self.duty.heard(c.namespace_key(), client);
                Ok(view)
            }
            Some(Err(e)) => Err(e.into()),
            None => Err(journal::dispatcher::errors::unknown_client(client).into()),
        }
    }
}

/// Client `client`'s view of its iteration (`None`: an unknown client).
fn client_view(s: Namespace<'_>, client: i64) -> Option<Result<ClientView, DomainError>> {
    let d = s.dispatcher();
    let it = d.client_iteration(client)?;
    if it.garbage_collected {
        return Some(Err(
            journal::dispatcher::errors::iteration_garbage_collected(it.id),
        ));
    }
    let tasks = d
        .iteration_tasks(it)
        .into_iter()
        .filter_map(|t| {
            let w = d.worker(&t.worker_address)?;
            Some(TaskView {
                worker_address: t.worker_address.clone(),
                task_id: t.id,
                iteration_id: it.id,
                starting_round: t.starting_round,
                worker_tags: w.tags.clone(),
                worker_uid: w.uid,
                transfer_servers: w.transfer_servers.clone(),
            })
        })
        .collect();
    Some(Ok(ClientView {
        tasks,
        finished: it.finished,
        block_round: d.block_round(it),
    }))
}
