//! The tf.data dispatcher area's calls. Each runs on the leader: a follower
//! forwards the whole call there ([`Dispatcher::on_leader`], through the
//! core's router), with an origin drawn once per call so its retries are
//! exactly-once. A call reads the replicated state or proposes one update,
//! and builds TF's answer (TaskDefs carry the dataset definition inline, so
//! workers need no shared file system). A NOT_FOUND, which ends a TF
//! client's input pipeline, is only ever answered after a read barrier: a
//! new leader that has not applied everything yet does not deny what
//! exists.

use std::sync::Arc;
use std::time::Duration;

pub mod tfgraph;

use std::future::Future;

use journal::pb::dispatcher as cmd;
use journal::pb::update::Command;
use journal::{DomainError, Namespace, Outcome};
use proto::tfdata::dispatcher_service_client::DispatcherServiceClient;
use proto::tfdata::{self as wire, task_def};
use tonic::transport::Channel;
use tonic::Status;

use crate::core::{Call, Core, Retry};
use crate::duties::dispatcher::DispatcherDuty;
use crate::duties::dispatcher::TfDataConfig;

/// What a call on the leader gives: the answer (or the error the client
/// gets), or [`Retry`] when this node could not serve it as the leader.
pub type OnLeader<T> = Result<Result<T, Status>, Retry>;

/// Deadline of one ProcessTask push to a worker.
const PUSH_DEADLINE: Duration = Duration::from_secs(5);

/// The static sharding policies (FILE, DATA, FILE_OR_DATA, HINT).
fn static_sharding(policy: i32) -> bool {
    (2..=5).contains(&policy)
}

/// The wire status of a dispatcher domain error (no payloads in this dialect).
pub fn status(e: &DomainError) -> Status {
    Status::new(tonic::Code::from_i32(e.code), e.message.clone())
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

    /// Runs one call on the leader: `local` here when this node leads, or
    /// the whole call forwarded to the leader's dispatcher by `remote`,
    /// across leader changes (the core's router). A call that may change
    /// state (`exactly_once`) carries one origin in every attempt: the
    /// caller's (a relay's), or one drawn here once. While no leader is
    /// known a call gets UNAVAILABLE (which TF retries), never NOT_FOUND or
    /// FAILED_PRECONDITION (which end an input pipeline).
    pub async fn on_leader<Req, Resp, L, LF, R, RF>(
        self: &Arc<Self>,
        c: &Call,
        exactly_once: bool,
        r: Req,
        local: L,
        remote: R,
    ) -> Result<Resp, Status>
    where
        Req: Clone,
        L: Fn(Arc<Dispatcher>, Call, Req) -> LF,
        LF: Future<Output = OnLeader<Resp>>,
        R: Fn(DispatcherServiceClient<Channel>, tonic::Request<Req>) -> RF,
        RF: Future<Output = Result<tonic::Response<Resp>, Status>>,
    {
        let router = self.core.router();
        let plain = |d: &DomainError| status(d);
        self.core
            .admit(c, crate::core::Access::Namespace)
            .await
            .map_err(|e| e.into_status(plain))?;
        let (call, _lane) = if exactly_once {
            c.with_origin(router.lanes())
        } else {
            (c.clone(), None)
        };
        let max = router.max_message_bytes();
        let started = std::time::Instant::now();
        let answer = router
            .on_leader(
                &call,
                || {
                    // A namespace that does not exist ends a TF client's
                    // pipeline (NOT_FOUND), as upstream's unknown ids do.
                    let missing = self.core.read(&call, |_| ()).err();
                    let run = local(self.clone(), call.clone(), r.clone());
                    async move {
                        match missing {
                            Some(e) => Ok(Err(e)),
                            None => run.await,
                        }
                    }
                },
                |ch| {
                    let client = DispatcherServiceClient::new(ch)
                        .max_decoding_message_size(max)
                        .max_encoding_message_size(max);
                    let sent = remote(client, call.forward(r.clone()));
                    async move { sent.await.map(|resp| Ok(resp.into_inner())) }
                },
            )
            .await
            .and_then(|a| a);
        tracing::debug!(
            call = std::any::type_name::<Req>().rsplit("::").next().unwrap_or_default(),
            forwarded = call.forwarded(),
            ms = started.elapsed().as_secs_f64() * 1000.0,
            code = ?answer.as_ref().err().map(|s| s.code()),
            "tf.data call"
        );
        answer
    }

    /// The version GetVersion answers.
    pub fn version(&self) -> i64 {
        self.config.version
    }

    /// Reads the call's namespace (its part of the state as it was before
    /// a delete raced the call: nothing).
    fn read<T: Default>(&self, c: &Call, f: impl FnOnce(Namespace<'_>) -> T) -> T {
        self.core.read(c, f).unwrap_or_default()
    }

    /// Proposes `update` for call `c` on this node (the leader).
    async fn propose(&self, c: &Call, command: impl Into<Command>) -> OnLeader<Outcome> {
        let u = c.update(command);
        let applied = self.core.router().leader().propose(&u).await?;
        Ok(match applied.outcome.error {
            Some(e) => Err(status(&e)),
            None => Ok(applied.outcome),
        })
    }

    /// `f` of dataset `id`, or NOT_FOUND (confirmed on an up-to-date state).
    async fn dataset<T>(
        &self,
        c: &Call,
        id: &str,
        f: impl Fn(&journal::dispatcher::Dataset) -> T,
    ) -> Result<Result<T, Status>, Retry> {
        let found = self
            .read_confirmed(c, |s| s.dispatcher().dataset(id).map(&f))
            .await?;
        Ok(found.ok_or_else(|| Status::not_found(format!("Dataset id {id} not found"))))
    }

    /// Reads `f` from the state; when it finds nothing, confirms on an
    /// up-to-date state before answering so.
    async fn read_confirmed<T>(
        &self,
        c: &Call,
        f: impl Fn(Namespace<'_>) -> Option<T>,
    ) -> Result<Option<T>, Retry> {
        if let Some(v) = self.read(c, &f) {
            return Ok(Some(v));
        }
        self.core.router().leader().read_barrier().await?;
        Ok(self.read(c, f))
    }

    // ------------------------------------------------------------ workers ----

    /// WorkerHeartbeat: registers the worker when it is new or changed, and
    /// answers the tasks it should start and those it should drop.
    pub async fn worker_heartbeat(
        &self,
        c: &Call,
        r: wire::WorkerHeartbeatRequest,
    ) -> OnLeader<wire::WorkerHeartbeatResponse> {
        if !self.config.worker_addresses.is_empty()
            && self.worker_index(&r.worker_address).is_none()
        {
            return Ok(Err(Status::failed_precondition(format!(
                "Worker {} is not in the static worker list of this dispatcher ({}): static sharding needs a fixed list of workers",
                r.worker_address,
                self.config.worker_addresses.join(",")
            ))));
        }
        let hb = cmd::WorkerHeartbeat {
            address: r.worker_address.clone(),
            transfer_servers: r.transfer_servers.clone(),
            tags: r.worker_tags.clone(),
            uid: r.worker_uid,
        };
        if self.read(c, |s| s.dispatcher().worker_heartbeat_changes(&hb)) {
            if let Err(e) = self.propose(c, hb).await? {
                return Ok(Err(e));
            }
        }
        self.duty.heard_worker(c.namespace_key(), &r.worker_address);
        let current: std::collections::HashSet<i64> = r.current_tasks.iter().copied().collect();
        Ok(Ok(self.read(c, |s| {
            let d = s.dispatcher();
            let mine = d.worker_tasks(&r.worker_address);
            let new_tasks = mine
                .iter()
                .filter(|t| !current.contains(&t.id))
                .filter_map(|t| self.task_def(s, t))
                .collect();
            let tasks_to_delete = r
                .current_tasks
                .iter()
                .filter(|id| !mine.iter().any(|t| t.id == **id))
                .copied()
                .collect();
            wire::WorkerHeartbeatResponse {
                new_tasks,
                tasks_to_delete,
            }
        })))
    }

    /// WorkerUpdate: completed tasks finish; unknown ids are ignored.
    pub async fn worker_update(
        &self,
        c: &Call,
        r: wire::WorkerUpdateRequest,
    ) -> OnLeader<wire::WorkerUpdateResponse> {
        let task_ids: Vec<i64> = r
            .updates
            .iter()
            .filter(|u| u.completed)
            .map(|u| u.task_id)
            .collect();
        if !task_ids.is_empty() {
            if let Err(e) = self.propose(c, cmd::FinishTasks { task_ids }).await? {
                return Ok(Err(e));
            }
        }
        Ok(Ok(wire::WorkerUpdateResponse {}))
    }

    /// GetWorkers.
    pub async fn get_workers(
        &self,
        c: &Call,
        _: wire::GetWorkersRequest,
    ) -> OnLeader<wire::GetWorkersResponse> {
        Ok(Ok(self.read(c, |s| wire::GetWorkersResponse {
            workers: s
                .dispatcher()
                .workers()
                .map(|w| wire::WorkerInfo {
                    address: w.address.clone(),
                })
                .collect(),
        })))
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

    /// The TaskDef of `task`, with its dataset inline.
    fn task_def(
        &self,
        s: Namespace<'_>,
        task: &journal::dispatcher::Task,
    ) -> Option<wire::TaskDef> {
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
        Some(wire::TaskDef {
            dataset: Some(task_def::Dataset::DatasetDef(dataset.definition.clone())),
            dataset_id: dataset.id.clone(),
            task_id: task.id,
            iteration_id: it.id,
            optional_num_consumers: job
                .num_consumers
                .map(task_def::OptionalNumConsumers::NumConsumers),
            worker_address: task.worker_address.clone(),
            num_split_providers: i64::from(job.split_source.is_some()),
            processing_mode_def: Some(wire::ProcessingModeDef {
                sharding_policy: job.sharding_policy,
            }),
            num_workers,
            worker_index,
            use_cross_trainer_cache: job.use_cross_trainer_cache,
        })
    }

    /// GetDatasetDef (a worker's fallback when a TaskDef has no dataset).
    pub async fn get_dataset_def(
        &self,
        c: &Call,
        r: wire::GetDatasetDefRequest,
    ) -> OnLeader<wire::GetDatasetDefResponse> {
        let def = self
            .dataset(c, &r.dataset_id, |d| d.definition.clone())
            .await?;
        Ok(def.map(|dataset_def| wire::GetDatasetDefResponse { dataset_def }))
    }

    // ----------------------------------------------------------- datasets ----

    /// GetOrRegisterDataset.
    pub async fn get_or_register_dataset(
        &self,
        c: &Call,
        r: wire::GetOrRegisterDatasetRequest,
    ) -> OnLeader<wire::GetOrRegisterDatasetResponse> {
        let compression =
            <wire::DataServiceMetadataView as prost::Message>::decode(r.metadata.as_ref())
                .map(|m| m.compression)
                .unwrap_or_default();
        let requested_id = r.optional_dataset_id.map(|o| match o {
            wire::get_or_register_dataset_request::OptionalDatasetId::DatasetId(id) => id,
        });
        let command = cmd::RegisterDataset {
            definition: r.dataset,
            metadata: r.metadata,
            compression,
            requested_id,
        };
        Ok(self
            .propose(c, command)
            .await?
            .map(|out| wire::GetOrRegisterDatasetResponse {
                dataset_id: out.dataset_id().unwrap_or_default().to_string(),
            }))
    }

    /// GetDataServiceMetadata.
    pub async fn get_data_service_metadata(
        &self,
        c: &Call,
        r: wire::GetDataServiceMetadataRequest,
    ) -> OnLeader<wire::GetDataServiceMetadataResponse> {
        let meta = self
            .dataset(c, &r.dataset_id, |d| d.metadata.clone())
            .await?;
        Ok(meta.map(|metadata| wire::GetDataServiceMetadataResponse { metadata }))
    }

    /// DisableCompressionAtRuntime: the first decision wins.
    pub async fn disable_compression_at_runtime(
        &self,
        c: &Call,
        r: wire::DisableCompressionAtRuntimeRequest,
    ) -> OnLeader<wire::DisableCompressionAtRuntimeResponse> {
        use wire::disable_compression_at_runtime_response::Decision;
        let command = cmd::DisableCompression {
            dataset_id: r.dataset_id,
            disable: r.disable_compression_at_runtime,
        };
        Ok(self.propose(c, command).await?.map(|out| {
            let decision = match out.compression_decision().flatten() {
                Some(disabled) => Decision::CompressionDisabledAtRuntime(disabled),
                None => Decision::NoCompressionToDisable(true),
            };
            wire::DisableCompressionAtRuntimeResponse {
                decision: Some(decision),
            }
        }))
    }

    // -------------------------------------------------- jobs and iterations ----

    /// GetOrCreateJob (an anonymous job's name gets a suffix the leader draws).
    pub async fn get_or_create_job(
        &self,
        c: &Call,
        r: wire::GetOrCreateJobRequest,
    ) -> OnLeader<wire::GetOrCreateJobResponse> {
        let command = cmd::GetOrCreateJob {
            dataset_id: r.dataset_id,
            sharding_policy: r.processing_mode_def.map_or(0, |m| m.sharding_policy),
            job_name: r.optional_job_name.map(|o| match o {
                wire::get_or_create_job_request::OptionalJobName::JobName(n) => n,
            }),
            num_consumers: r.optional_num_consumers.map(|o| match o {
                wire::get_or_create_job_request::OptionalNumConsumers::NumConsumers(n) => n,
            }),
            use_cross_trainer_cache: r.use_cross_trainer_cache,
            target_workers: r.target_workers,
            anonymous_suffix: rand::random(),
            split_source: None,
        };
        // A named job that exists is answered from the state: its
        // parameters never change, so no proposal is needed.
        if let Some(existing) = self.read(c, |s| s.dispatcher().existing_job(&command)) {
            return Ok(existing
                .map(|job_id| wire::GetOrCreateJobResponse { job_id })
                .map_err(|e| status(&e)));
        }
        let mut command = command;
        if command.sharding_policy == journal::dispatcher::SHARDING_DYNAMIC {
            let def = match self
                .dataset(c, &command.dataset_id, |d| d.definition.clone())
                .await?
            {
                Ok(def) => def,
                Err(e) => return Ok(Err(e)),
            };
            match tfgraph::split_source(&def) {
                Ok(source) => command.split_source = Some(source),
                Err(why) => return Ok(Err(Status::unimplemented(why))),
            }
        }
        Ok(self
            .propose(c, command)
            .await?
            .map(|out| wire::GetOrCreateJobResponse {
                job_id: out.job_id().unwrap_or_default(),
            }))
    }

    /// GetOrCreateIteration: a new iteration's tasks are pushed to their
    /// workers at once (ProcessTask), as upstream does; workers also find
    /// them on their next heartbeat.
    pub async fn get_or_create_iteration(
        &self,
        c: &Call,
        r: wire::GetOrCreateIterationRequest,
    ) -> OnLeader<wire::GetOrCreateIterationResponse> {
        let command = cmd::GetOrCreateIteration {
            job_id: r.job_id,
            repetition: r.repetition,
        };
        let out = match self.propose(c, command).await? {
            Ok(out) => out,
            Err(e) => return Ok(Err(e)),
        };
        let Some(acquired) = out.iteration_client() else {
            return Ok(Err(Status::internal(
                "the journal answered GetOrCreateIteration without its client",
            )));
        };
        self.duty.acquired(c.namespace_key(), acquired.client_id);
        if acquired.created {
            let defs: Vec<wire::TaskDef> = self.read(c, |s| {
                let d = s.dispatcher();
                d.iteration(acquired.iteration_id)
                    .map(|it| {
                        d.iteration_tasks(it)
                            .into_iter()
                            .filter_map(|t| self.task_def(s, t))
                            .collect()
                    })
                    .unwrap_or_default()
            });
            for def in defs {
                tokio::spawn(push_task(def));
            }
        }
        Ok(Ok(wire::GetOrCreateIterationResponse {
            iteration_client_id: acquired.client_id,
        }))
    }

    /// ReleaseIterationClient.
    pub async fn release_iteration_client(
        &self,
        c: &Call,
        r: wire::ReleaseIterationClientRequest,
    ) -> OnLeader<wire::ReleaseIterationClientResponse> {
        let command = cmd::ReleaseIterationClient {
            iteration_client_id: r.iteration_client_id,
        };
        Ok(self
            .propose(c, command)
            .await?
            .map(|_| wire::ReleaseIterationClientResponse {}))
    }

    /// GetSplit: the next split of a DYNAMIC iteration, journaled before it
    /// is answered, so no split is handed out twice, also across leaders.
    pub async fn get_split(
        &self,
        c: &Call,
        r: wire::GetSplitRequest,
    ) -> OnLeader<wire::GetSplitResponse> {
        let command = cmd::ProduceSplit {
            iteration_id: r.iteration_id,
            repetition: r.repetition,
            provider_index: r.split_provider_index,
        };
        Ok(self.propose(c, command).await?.map(|out| {
            let split = out.split().unwrap_or(cmd::Split {
                value: 0,
                end_of_splits: true,
            });
            wire::GetSplitResponse {
                split: if split.end_of_splits {
                    Default::default()
                } else {
                    tfgraph::split_tensor(split.value).into()
                },
                end_of_splits: split.end_of_splits,
            }
        }))
    }

    /// MaybeRemoveTask: once every consumer of the coordinated read asked to
    /// remove the task at the same round (within 10 s, upstream's
    /// TaskRemover), the task is removed and every asker hears `removed`.
    pub async fn maybe_remove_task(
        &self,
        c: &Call,
        r: wire::MaybeRemoveTaskRequest,
    ) -> OnLeader<wire::MaybeRemoveTaskResponse> {
        let found = self.read(c, |s| {
            let d = s.dispatcher();
            let t = d.task(r.task_id)?;
            let consumers = d
                .iteration(t.iteration_id)
                .and_then(|it| d.job(it.job_id))
                .and_then(|j| j.num_consumers);
            Some((t.removed, consumers))
        });
        let removed = match found {
            // Unknown or already removed: nothing left to remove.
            None | Some((true, _)) => true,
            Some((false, None)) => false,
            Some((false, Some(consumers))) => {
                match self
                    .duty
                    .remove_quorum(
                        c.namespace_key(),
                        r.task_id,
                        r.consumer_index,
                        r.round,
                        consumers,
                    )
                    .await
                {
                    crate::duties::dispatcher::Quorum::Reached => {
                        match self
                            .propose(c, cmd::RemoveTask { task_id: r.task_id })
                            .await?
                        {
                            Ok(_) => {
                                self.duty.removed(c.namespace_key(), r.task_id);
                                true
                            }
                            Err(e) => return Ok(Err(e)),
                        }
                    }
                    crate::duties::dispatcher::Quorum::Removed => true,
                    crate::duties::dispatcher::Quorum::Failed => false,
                }
            }
        };
        Ok(Ok(wire::MaybeRemoveTaskResponse { removed }))
    }

    /// ClientHeartbeat: the iteration's tasks and whether it finished.
    pub async fn client_heartbeat(
        &self,
        c: &Call,
        r: wire::ClientHeartbeatRequest,
    ) -> OnLeader<wire::ClientHeartbeatResponse> {
        let client = r.iteration_client_id;
        // A coordinated read with a task waiting to join: the heartbeat's
        // rounds decide on it (the round-robin protocol), in the journal.
        let pending = self.read(c, |s| {
            let d = s.dispatcher();
            d.client_iteration(client)
                .is_some_and(|it| !it.pending.is_empty())
        });
        if pending {
            use wire::client_heartbeat_request::{OptionalBlockedRound, OptionalCurrentRound};
            let command = cmd::ClientHeartbeat {
                iteration_client_id: client,
                current_round: r
                    .optional_current_round
                    .map(|OptionalCurrentRound::CurrentRound(x)| x),
                blocked_round: r
                    .optional_blocked_round
                    .map(|OptionalBlockedRound::BlockedRound(x)| x),
            };
            if let Err(e) = self.propose(c, command).await? {
                return Ok(Err(e));
            }
        }
        let answer = self
            .read_confirmed(c, |s| {
                let d = s.dispatcher();
                let it = d.client_iteration(client)?;
                if it.garbage_collected {
                    return Some(Err(
                        journal::dispatcher::errors::iteration_garbage_collected(it.id),
                    ));
                }
                let task_info = d
                    .iteration_tasks(it)
                    .into_iter()
                    .filter_map(|t| {
                        let w = d.worker(&t.worker_address)?;
                        Some(wire::TaskInfo {
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
                Some(Ok(wire::ClientHeartbeatResponse {
                    task_info,
                    iteration_finished: it.finished,
                    optional_block_round: d
                        .block_round(it)
                        .map(wire::client_heartbeat_response::OptionalBlockRound::BlockRound),
                    deployment_mode: 0,
                }))
            })
            .await?;
        Ok(match answer {
            Some(Ok(resp)) => {
                self.duty.heard(c.namespace_key(), client);
                Ok(resp)
            }
            Some(Err(e)) => Err(status(&e)),
            None => Err(status(&journal::dispatcher::errors::unknown_client(client))),
        })
    }
}

/// Pushes a new task to its worker (`WorkerService.ProcessTask`); a failure
/// only costs latency: the worker finds the task on its next heartbeat.
async fn push_task(def: wire::TaskDef) {
    let address = def.worker_address.clone();
    let push = async {
        let ch = tonic::transport::Endpoint::from_shared(format!("http://{address}"))
            .map_err(|e| e.to_string())?
            .connect_timeout(PUSH_DEADLINE)
            .connect()
            .await
            .map_err(|e| e.to_string())?;
        wire::worker_service_client::WorkerServiceClient::new(ch)
            .max_encoding_message_size(usize::MAX)
            .process_task(wire::ProcessTaskRequest { task: Some(def) })
            .await
            .map_err(|e| e.to_string())
    };
    match tokio::time::timeout(PUSH_DEADLINE, push).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => tracing::debug!(worker = %address, "ProcessTask push failed: {e}"),
        Err(_) => tracing::debug!(worker = %address, "ProcessTask push timed out"),
    }
}
