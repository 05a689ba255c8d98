//! The tf.data dispatcher area: what TF's `DispatcherState` keeps —
//! datasets, workers, jobs, iterations and their clients, tasks — replicated
//! instead of journaled by one process (`docs/protocols.md`, Dispatcher state
//! and journal).
//! Its own command ([`pb::dispatcher::Command`]), reply, state ([`Data`])
//! and errors ([`errors`]).
//!
//! Served: sharding OFF and the static policies (FILE, DATA, FILE_OR_DATA,
//! HINT: the worker index is the service's to fill in), named and anonymous
//! jobs, repetitions, iteration clients, task completion, compression
//! decisions, journaled garbage collection, and DYNAMIC sharding of a
//! source the service can describe as a [`pb::dispatcher::SplitSource`]
//! (every split handed out once, journaled), and coordinated reads
//! (`num_consumers`) with the pending-task protocol for workers that join
//! later and task removal. Snapshots are not served yet.

pub mod errors;

use sha2::{Digest, Sha256};

pub use crate::pb::dispatcher::{Data, Dataset, Iteration, Job, Task, Worker};

use crate::area::{Area, Context};
use crate::cluster::Cluster;
use crate::pb::dispatcher::{command::Command, reply::Reply, AcquiredClient, TaskIds};
use crate::pb::{self, outcome, Outcome};

/// Largest dataset definition (serialized `DatasetDef`) a dataset may have.
pub const MAX_DATASET_DEF_BYTES: usize = 64 << 20;
/// The DYNAMIC sharding policy (`distributed_epoch`).
pub const SHARDING_DYNAMIC: i32 = 1;
/// DataServiceMetadata compression SNAPPY (the only one that can be disabled).
pub const COMPRESSION_SNAPPY: i32 = 2;

const FIRST_DATASET_ID: i64 = 1000;
const FIRST_ITERATION_ID: i64 = 2000;
const FIRST_CLIENT_ID: i64 = 3000;
const FIRST_TASK_ID: i64 = 4000;
const FIRST_JOB_ID: i64 = 5000;

/// The next id from `counter` (upstream's first id when unset).
fn draw(counter: &mut i64, first: i64) -> i64 {
    let id = (*counter).max(first);
    *counter = id + 1;
    id
}

fn iteration_key(job_id: i64, repetition: i64) -> String {
    format!("{job_id}/{repetition}")
}

/// The dispatcher area, read-only.
#[derive(Clone, Copy, Debug)]
pub struct Reader<'a> {
    pub(crate) data: &'a Data,
}

impl<'a> Reader<'a> {
    /// A dataset.
    pub fn dataset(&self, id: &str) -> Option<&'a Dataset> {
        self.data.datasets.get(id)
    }

    /// A job.
    pub fn job(&self, id: i64) -> Option<&'a Job> {
        self.data.jobs.get(&id)
    }

    /// An iteration.
    pub fn iteration(&self, id: i64) -> Option<&'a Iteration> {
        self.data.iterations.get(&id)
    }

    /// The iteration an iteration client reads.
    pub fn client_iteration(&self, client: i64) -> Option<&'a Iteration> {
        self.iteration(*self.data.clients.get(&client)?)
    }

    /// A task.
    pub fn task(&self, id: i64) -> Option<&'a Task> {
        self.data.tasks.get(&id)
    }

    /// A worker.
    pub fn worker(&self, address: &str) -> Option<&'a Worker> {
        self.data.workers.get(address)
    }

    /// Every worker, by address.
    pub fn workers(&self) -> impl Iterator<Item = &'a Worker> + 'a {
        self.data.workers.values()
    }

    /// Every dataset, by id.
    pub fn datasets(&self) -> impl Iterator<Item = &'a Dataset> + 'a {
        self.data.datasets.values()
    }

    /// Every job, by id.
    pub fn jobs(&self) -> impl Iterator<Item = &'a Job> + 'a {
        self.data.jobs.values()
    }

    /// Every iteration, by id.
    pub fn iterations(&self) -> impl Iterator<Item = &'a Iteration> + 'a {
        self.data.iterations.values()
    }

    /// Every task, by id.
    pub fn tasks(&self) -> impl Iterator<Item = &'a Task> + 'a {
        self.data.tasks.values()
    }

    /// Every iteration client with its iteration id.
    pub fn clients(&self) -> impl Iterator<Item = (i64, i64)> + 'a {
        self.data.clients.iter().map(|(c, i)| (*c, *i))
    }

    /// The tasks of an iteration, in creation order.
    pub fn iteration_tasks(&self, iteration: &Iteration) -> Vec<&'a Task> {
        let tasks = &self.data.tasks;
        iteration
            .tasks
            .iter()
            .filter_map(|t| tasks.get(t))
            .collect()
    }

    /// The tasks a worker runs (unfinished, not removed; pending ones
    /// included), by id.
    pub fn worker_tasks(&self, address: &str) -> Vec<&'a Task> {
        self.data
            .tasks
            .values()
            .filter(|t| t.worker_address == address && !t.finished && !t.removed)
            .collect()
    }

    /// The running coordinated reads a worker has no live task of (a new
    /// worker, or one whose task was removed): each gets a pending task.
    fn coordinated_reads_without(&self, address: &str) -> Vec<i64> {
        let mine: Vec<i64> = self
            .worker_tasks(address)
            .iter()
            .map(|t| t.iteration_id)
            .collect();
        self.data
            .iterations
            .values()
            .filter(|it| !it.finished && !it.garbage_collected)
            .filter(|it| {
                self.data
                    .jobs
                    .get(&it.job_id)
                    .is_some_and(|j| j.num_consumers.is_some())
            })
            .filter(|it| !mine.contains(&it.id))
            .map(|it| it.id)
            .collect()
    }

    /// The round a coordinated read's clients are told to block at: the
    /// front pending task's target.
    pub fn block_round(&self, iteration: &Iteration) -> Option<i64> {
        iteration.pending.first().map(|p| p.target_round)
    }

    /// What GetOrCreateJob answers for a name that exists: its id when the
    /// parameters match, INVALID_ARGUMENT when not; `None` for an
    /// anonymous job or a new name (the command creates it). Lets the
    /// service answer a repeated GetOrCreateJob without proposing.
    pub fn existing_job(
        &self,
        c: &pb::dispatcher::GetOrCreateJob,
    ) -> Option<Result<i64, crate::DomainError>> {
        let name = c.job_name.as_ref()?;
        let job = self.job(*self.data.jobs_by_name.get(name)?)?;
        let mismatch = if job.sharding_policy != c.sharding_policy {
            Some(format!(
                "existing sharding policy {}, requested {}",
                job.sharding_policy, c.sharding_policy
            ))
        } else if job.use_cross_trainer_cache != c.use_cross_trainer_cache {
            Some(format!(
                "existing cross-trainer cache {}, requested {}",
                job.use_cross_trainer_cache, c.use_cross_trainer_cache
            ))
        } else if job.target_workers != c.target_workers {
            Some(format!(
                "existing target workers {}, requested {}",
                job.target_workers, c.target_workers
            ))
        } else {
            None
        };
        Some(match mismatch {
            Some(what) => Err(errors::job_mismatch(name, &what)),
            None => Ok(job.id),
        })
    }

    /// Whether a worker heartbeat would change the state (an unknown
    /// worker, or new transfer servers, tags or uid): only then is it
    /// proposed.
    pub fn worker_heartbeat_changes(&self, hb: &pb::dispatcher::WorkerHeartbeat) -> bool {
        match self.worker(&hb.address) {
            None => true,
            Some(w) => {
                w.transfer_servers != hb.transfer_servers
                    || w.tags != hb.tags
                    || w.uid != hb.uid
                    || !self.coordinated_reads_without(&hb.address).is_empty()
            }
        }
    }
}

/// The dispatcher area while a command applies.
struct Writer<'a, 'c> {
    data: &'a mut Data,
    cx: &'a mut Context<'c>,
}

impl Writer<'_, '_> {
    fn register_dataset(&mut self, c: &pb::dispatcher::RegisterDataset) -> Outcome {
        if c.definition.len() > MAX_DATASET_DEF_BYTES {
            return Outcome::err(errors::dataset_too_large(
                c.definition.len(),
                MAX_DATASET_DEF_BYTES,
            ));
        }
        if let Some(id) = &c.requested_id {
            if let Some(d) = self.data.datasets.get(id) {
                if d.metadata != c.metadata {
                    return Outcome::err(errors::dataset_mismatch(id));
                }
                return reply(Reply::DatasetId(id.clone()));
            }
            if let Ok(n) = id.parse::<i64>() {
                if n >= self.data.next_dataset_id {
                    self.data.next_dataset_id = n.saturating_add(1);
                }
            }
            self.insert_dataset(id.clone(), c);
            return reply(Reply::DatasetId(id.clone()));
        }
        let content = content_key(c);
        if let Some(id) = self.data.datasets_by_content.get(&content) {
            return reply(Reply::DatasetId(id.clone()));
        }
        let id = loop {
            let id = draw(&mut self.data.next_dataset_id, FIRST_DATASET_ID).to_string();
            if !self.data.datasets.contains_key(&id) {
                break id;
            }
        };
        self.data.datasets_by_content.insert(content, id.clone());
        self.insert_dataset(id.clone(), c);
        reply(Reply::DatasetId(id))
    }

    fn insert_dataset(&mut self, id: String, c: &pb::dispatcher::RegisterDataset) {
        self.data.datasets.insert(
            id.clone(),
            Dataset {
                id,
                definition: c.definition.clone(),
                metadata: c.metadata.clone(),
                compression: c.compression,
                compression_disabled: None,
            },
        );
    }

    fn get_or_create_job(&mut self, c: &pb::dispatcher::GetOrCreateJob) -> Outcome {
        // As upstream: an existing name is checked first (its parameters
        // never change), then what a new job needs.
        if let Some(existing) = (Reader { data: self.data }).existing_job(c) {
            return match existing {
                Ok(id) => reply(Reply::JobId(id)),
                Err(e) => Outcome::err(e),
            };
        }
        if !self.data.datasets.contains_key(&c.dataset_id) {
            return Outcome::err(errors::dataset_not_found(&c.dataset_id));
        }
        if c.sharding_policy == SHARDING_DYNAMIC && c.split_source.is_none() {
            return Outcome::err(errors::dynamic_without_source());
        }
        let id = draw(&mut self.data.next_job_id, FIRST_JOB_ID);
        let name = c
            .job_name
            .clone()
            .unwrap_or_else(|| format!("anonymous_job_{id}_{}", c.anonymous_suffix));
        self.data.jobs_by_name.insert(name.clone(), id);
        self.data.jobs.insert(
            id,
            Job {
                id,
                name,
                dataset_id: c.dataset_id.clone(),
                sharding_policy: c.sharding_policy,
                num_consumers: c.num_consumers,
                use_cross_trainer_cache: c.use_cross_trainer_cache,
                target_workers: c.target_workers,
                split_source: c
                    .split_source
                    .filter(|_| c.sharding_policy == SHARDING_DYNAMIC),
            },
        );
        reply(Reply::JobId(id))
    }

    fn get_or_create_iteration(&mut self, job_id: i64, repetition: i64) -> Outcome {
        if !self.data.jobs.contains_key(&job_id) {
            return Outcome::err(errors::job_not_found(job_id));
        }
        let key = iteration_key(job_id, repetition);
        let existing = self
            .data
            .iterations_by_key
            .get(&key)
            .filter(|id| {
                self.data
                    .iterations
                    .get(id)
                    .is_some_and(|it| !it.garbage_collected)
            })
            .copied();
        let (iteration_id, created) = match existing {
            Some(id) => (id, false),
            None => {
                let id = draw(&mut self.data.next_iteration_id, FIRST_ITERATION_ID);
                let dynamic = self.data.jobs.get(&job_id).and_then(|j| j.split_source);
                let workers: Vec<String> = self.data.workers.keys().cloned().collect();
                let tasks = workers
                    .into_iter()
                    .map(|w| self.create_task(id, w))
                    .collect();
                self.data.iterations.insert(
                    id,
                    Iteration {
                        id,
                        job_id,
                        repetition,
                        tasks,
                        split_provider: dynamic.map(|_| pb::dispatcher::SplitProvider::default()),
                        ..Default::default()
                    },
                );
                self.data.iterations_by_key.insert(key, id);
                (id, true)
            }
        };
        let client_id = draw(&mut self.data.next_client_id, FIRST_CLIENT_ID);
        self.data.clients.insert(client_id, iteration_id);
        if let Some(it) = self.data.iterations.get_mut(&iteration_id) {
            it.num_clients += 1;
        }
        reply(Reply::IterationClient(AcquiredClient {
            client_id,
            iteration_id,
            created,
        }))
    }

    fn create_task(&mut self, iteration_id: i64, worker_address: String) -> i64 {
        let id = draw(&mut self.data.next_task_id, FIRST_TASK_ID);
        self.data.tasks.insert(
            id,
            Task {
                id,
                iteration_id,
                worker_address,
                finished: false,
                starting_round: 0,
                removed: false,
            },
        );
        id
    }

    fn release_iteration_client(&mut self, client: i64) -> Outcome {
        let Some(iteration) = self.data.clients.remove(&client) else {
            return Outcome::err(errors::client_not_found(client));
        };
        if let Some(it) = self.data.iterations.get_mut(&iteration) {
            it.num_clients = (it.num_clients - 1).max(0);
            it.last_released_ms = self.cx.at_ms.max(1);
        }
        Outcome::ok()
    }

    fn worker_heartbeat(&mut self, hb: &pb::dispatcher::WorkerHeartbeat) -> Outcome {
        let known = self.data.workers.contains_key(&hb.address);
        // Coordinated reads take a worker in through a pending task (new,
        // or back after its task was removed).
        let coordinated = Reader { data: self.data }.coordinated_reads_without(&hb.address);
        self.data.workers.insert(
            hb.address.clone(),
            Worker {
                address: hb.address.clone(),
                transfer_servers: hb.transfer_servers.clone(),
                tags: hb.tags.clone(),
                uid: hb.uid,
            },
        );
        if !known {
            // A new worker gets a task of every running iteration that is
            // not a coordinated read (those need the pending-task protocol).
            let running: Vec<i64> = self
                .data
                .iterations
                .values()
                .filter(|it| !it.finished && !it.garbage_collected)
                .filter(|it| {
                    self.data
                        .jobs
                        .get(&it.job_id)
                        .is_some_and(|j| j.num_consumers.is_none())
                })
                .map(|it| it.id)
                .collect();
            for iteration in running {
                let task = self.create_task(iteration, hb.address.clone());
                if let Some(it) = self.data.iterations.get_mut(&iteration) {
                    it.tasks.push(task);
                }
            }
        }
        for iteration in coordinated {
            let task = self.create_task(iteration, hb.address.clone());
            if let Some(it) = self.data.iterations.get_mut(&iteration) {
                it.pending.push(pb::dispatcher::PendingTask {
                    task_id: task,
                    target_round: 1,
                    ready_consumers: Vec::new(),
                    failures: 0,
                });
            }
        }
        let ids = Reader { data: self.data }
            .worker_tasks(&hb.address)
            .iter()
            .map(|t| t.id)
            .collect();
        reply(Reply::WorkerTasks(TaskIds { ids }))
    }

    fn finish_tasks(&mut self, ids: &[i64]) -> Outcome {
        for id in ids {
            let Some(task) = self.data.tasks.get_mut(id) else {
                continue;
            };
            if task.finished {
                continue;
            }
            task.finished = true;
            let iteration = task.iteration_id;
            let tasks = &self.data.tasks;
            if let Some(it) = self.data.iterations.get_mut(&iteration) {
                if it
                    .tasks
                    .iter()
                    .all(|t| tasks.get(t).is_none_or(|t| t.finished))
                {
                    it.finished = true;
                }
            }
        }
        Outcome::ok()
    }

    fn disable_compression(&mut self, dataset: &str, disable: bool) -> Outcome {
        let Some(d) = self.data.datasets.get_mut(dataset) else {
            return Outcome::err(errors::dataset_not_found(dataset));
        };
        if d.compression != COMPRESSION_SNAPPY {
            return reply(Reply::NoCompressionToDisable(true));
        }
        let decision = *d.compression_disabled.get_or_insert(disable);
        reply(Reply::CompressionDisabled(decision))
    }

    /// Hands out the next split of a DYNAMIC iteration (upstream's
    /// `GetSplit` + `ProduceSplitUpdate`, decided here so every replica
    /// agrees on which split went out).
    fn produce_split(&mut self, c: &pb::dispatcher::ProduceSplit) -> Outcome {
        let Some(it) = self.data.iterations.get_mut(&c.iteration_id) else {
            return Outcome::err(errors::iteration_not_found(c.iteration_id));
        };
        let source = self.data.jobs.get(&it.job_id).and_then(|j| j.split_source);
        let (Some(source), Some(p)) = (source, it.split_provider.as_mut()) else {
            return Outcome::err(errors::not_dynamic(c.iteration_id));
        };
        if c.provider_index != 0 {
            return Outcome::err(errors::bad_split_provider(c.provider_index));
        }
        let end = || {
            reply(Reply::Split(pb::dispatcher::Split {
                value: 0,
                end_of_splits: true,
            }))
        };
        if c.repetition < p.repetition {
            return end();
        }
        if c.repetition > p.repetition {
            p.repetition = c.repetition;
            p.next = 0;
        }
        if p.next >= source.count {
            // The repetition is over: the next one starts afresh.
            p.repetition += 1;
            p.next = 0;
            return end();
        }
        let value = source
            .start
            .saturating_add(p.next.saturating_mul(source.step));
        p.next += 1;
        reply(Reply::Split(pb::dispatcher::Split {
            value,
            end_of_splits: false,
        }))
    }

    /// The round-robin protocol's decision on the front pending task of the
    /// client's iteration (upstream's ClientHeartbeatUpdate).
    fn client_heartbeat(&mut self, c: &pb::dispatcher::ClientHeartbeat) -> Outcome {
        let client = c.iteration_client_id;
        let Some(&iteration) = self.data.clients.get(&client) else {
            return Outcome::err(errors::unknown_client(client));
        };
        let consumers = self
            .data
            .iterations
            .get(&iteration)
            .and_then(|it| self.data.jobs.get(&it.job_id))
            .and_then(|j| j.num_consumers)
            .unwrap_or(1);
        let Some(it) = self.data.iterations.get_mut(&iteration) else {
            return Outcome::ok();
        };
        let Some(front) = it.pending.first_mut() else {
            return Outcome::ok();
        };
        if let Some(current) = c.current_round {
            if current >= front.target_round {
                // Too late for this round: aim further ahead, twice as far
                // each time, and start collecting acceptances again.
                let delta = 2i64.saturating_mul(1i64 << front.failures.clamp(0, 30));
                front.target_round = current.saturating_add(delta);
                front.failures += 1;
                front.ready_consumers.clear();
                return Outcome::ok();
            }
        }
        if let Some(blocked) = c.blocked_round {
            if blocked <= front.target_round && !front.ready_consumers.contains(&client) {
                front.ready_consumers.push(client);
            }
        }
        if front.ready_consumers.len() as i64 >= consumers {
            let promoted = it.pending.remove(0);
            it.tasks.push(promoted.task_id);
            if let Some(t) = self.data.tasks.get_mut(&promoted.task_id) {
                t.starting_round = promoted.target_round;
            }
        }
        Outcome::ok()
    }

    /// MaybeRemoveTask after every consumer asked: the task leaves its
    /// iteration and its worker.
    fn remove_task(&mut self, task_id: i64) -> Outcome {
        let Some(task) = self.data.tasks.get_mut(&task_id) else {
            return Outcome::ok();
        };
        if task.removed {
            return Outcome::ok();
        }
        task.removed = true;
        let iteration = task.iteration_id;
        if let Some(it) = self.data.iterations.get_mut(&iteration) {
            it.tasks.retain(|t| *t != task_id);
            it.pending.retain(|p| p.task_id != task_id);
        }
        Outcome::ok()
    }

    fn garbage_collect_iteration(&mut self, id: i64, released_at_ms: u64) -> Outcome {
        let Some(it) = self.data.iterations.get_mut(&id) else {
            return Outcome::ok();
        };
        // DYNAMIC iterations are never collected (upstream's default,
        // gc_dynamic_sharding_jobs = false): a new one would hand out every
        // split again.
        if it.split_provider.is_some() {
            return Outcome::ok();
        }
        let idle = it.num_clients == 0 && it.last_released_ms != 0;
        if it.finished || it.garbage_collected || !idle || it.last_released_ms != released_at_ms {
            return Outcome::ok();
        }
        it.finished = true;
        it.garbage_collected = true;
        let tasks = it.tasks.clone();
        for t in tasks {
            if let Some(task) = self.data.tasks.get_mut(&t) {
                task.finished = true;
            }
        }
        Outcome::ok()
    }
}

/// The content key of a definition and its metadata (deduplication).
fn content_key(c: &pb::dispatcher::RegisterDataset) -> String {
    let mut h = Sha256::new();
    h.update((c.definition.len() as u64).to_le_bytes());
    h.update(&c.definition);
    h.update(&c.metadata);
    h.update(c.compression.to_le_bytes());
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

impl Area for Data {
    type Command = pb::dispatcher::Command;

    fn apply(&mut self, cx: &mut Context<'_>, c: &Self::Command) -> Outcome {
        let Some(cmd) = &c.command else {
            return Outcome::ok();
        };
        let mut w = Writer { data: self, cx };
        match cmd {
            Command::RegisterDataset(c) => w.register_dataset(c),
            Command::GetOrCreateJob(c) => w.get_or_create_job(c),
            Command::GetOrCreateIteration(c) => w.get_or_create_iteration(c.job_id, c.repetition),
            Command::ReleaseIterationClient(c) => w.release_iteration_client(c.iteration_client_id),
            Command::WorkerHeartbeat(c) => w.worker_heartbeat(c),
            Command::FinishTasks(c) => w.finish_tasks(&c.task_ids),
            Command::DisableCompression(c) => w.disable_compression(&c.dataset_id, c.disable),
            Command::GarbageCollectIteration(c) => {
                w.garbage_collect_iteration(c.iteration_id, c.released_at_ms)
            }
            Command::ProduceSplit(c) => w.produce_split(c),
            Command::ClientHeartbeat(c) => w.client_heartbeat(c),
            Command::RemoveTask(c) => w.remove_task(c.task_id),
        }
    }

    /// The tf.data service starts empty with the service.
    fn on_init(&mut self, _cx: &mut Context<'_>) {}

    /// The tf.data service outlives a coordination job: its clients and
    /// workers are not tasks of the job, and its ids are never reused.
    fn on_epoch_reset(&mut self, _cx: &mut Context<'_>) {}

    /// tf.data workers are not coordination tasks.
    fn on_task_lost(&mut self, _cx: &mut Context<'_>, _task: u32) {}

    fn check_snapshot(&self, _cluster: Cluster<'_>) -> Result<(), String> {
        for (name, id) in &self.jobs_by_name {
            if !self.jobs.contains_key(id) {
                return Err(format!("job name {name} names an unknown job"));
            }
        }
        for (client, it) in &self.clients {
            if !self.iterations.contains_key(it) {
                return Err(format!("iteration client {client}: unknown iteration"));
            }
        }
        for it in self.iterations.values() {
            if !self.jobs.contains_key(&it.job_id) {
                return Err(format!("iteration {}: unknown job", it.id));
            }
        }
        Ok(())
    }

    fn check_invariants(&self, cluster: Cluster<'_>) -> Result<(), String> {
        self.check_snapshot(cluster)?;
        for job in self.jobs.values() {
            if !self.datasets.contains_key(&job.dataset_id) {
                return Err(format!("job {}: unknown dataset", job.id));
            }
        }
        for it in self.iterations.values() {
            if let Some(t) = it.tasks.iter().find(|t| !self.tasks.contains_key(t)) {
                return Err(format!("iteration {}: unknown task {t}", it.id));
            }
        }
        for t in self.tasks.values() {
            if !self.iterations.contains_key(&t.iteration_id) {
                return Err(format!("task {}: unknown iteration", t.id));
            }
        }
        Ok(())
    }
}

fn reply(r: Reply) -> Outcome {
    Outcome {
        reply: Some(outcome::Reply::Dispatcher(pb::dispatcher::Reply {
            reply: Some(r),
        })),
        ..Default::default()
    }
}

impl Outcome {
    fn dispatcher_reply(&self) -> Option<&Reply> {
        match &self.reply {
            Some(outcome::Reply::Dispatcher(r)) => r.reply.as_ref(),
            _ => None,
        }
    }

    /// RegisterDataset: the dataset id.
    pub fn dataset_id(&self) -> Option<&str> {
        match self.dispatcher_reply()? {
            Reply::DatasetId(id) => Some(id),
            _ => None,
        }
    }

    /// GetOrCreateJob: the job id.
    pub fn job_id(&self) -> Option<i64> {
        match self.dispatcher_reply()? {
            Reply::JobId(id) => Some(*id),
            _ => None,
        }
    }

    /// GetOrCreateIteration: the client acquired.
    pub fn iteration_client(&self) -> Option<&AcquiredClient> {
        match self.dispatcher_reply()? {
            Reply::IterationClient(c) => Some(c),
            _ => None,
        }
    }

    /// WorkerHeartbeat: the worker's unfinished tasks.
    pub fn worker_tasks(&self) -> Option<&[i64]> {
        match self.dispatcher_reply()? {
            Reply::WorkerTasks(t) => Some(&t.ids),
            _ => None,
        }
    }

    /// ProduceSplit: the split handed out, or the end of the repetition.
    pub fn split(&self) -> Option<pb::dispatcher::Split> {
        match self.dispatcher_reply()? {
            Reply::Split(s) => Some(*s),
            _ => None,
        }
    }

    /// DisableCompression: `Some(decision)`, or `Some(None)` when the
    /// dataset is not compressed.
    pub fn compression_decision(&self) -> Option<Option<bool>> {
        match self.dispatcher_reply()? {
            Reply::CompressionDisabled(d) => Some(Some(*d)),
            Reply::NoCompressionToDisable(_) => Some(None),
            _ => None,
        }
    }
}

/// Whether a client may propose `command`. Garbage collection and task
/// removal (decided by a quorum of consumers) are the leader's.
pub fn client_proposable(command: &Command) -> bool {
    !matches!(
        command,
        Command::GarbageCollectIteration(_) | Command::RemoveTask(_)
    )
}

crate::area::area_commands!(
    dispatcher,
    Dispatcher,
    RegisterDataset,
    GetOrCreateJob,
    GetOrCreateIteration,
    ReleaseIterationClient,
    WorkerHeartbeat,
    FinishTasks,
    DisableCompression,
    GarbageCollectIteration,
    ProduceSplit,
    ClientHeartbeat,
    RemoveTask,
);
