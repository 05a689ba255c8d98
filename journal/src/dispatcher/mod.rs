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
mod reader;
mod replies;
mod writer;

pub use reader::Reader;
use replies::reply;
use writer::Writer;

use sha2::{Digest, Sha256};

pub use crate::pb::dispatcher::{Data, Dataset, Iteration, Job, Task, Worker};

use crate::area::{Area, Context};
use crate::cluster::Cluster;
use crate::pb::dispatcher::{command::Command, reply::Reply, AcquiredClient, TaskIds};
use crate::pb::{self, Outcome};

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

impl Area for Data {
    type Command = pb::dispatcher::Command;

    fn apply(&mut self, cx: &mut Context<'_>, c: &Self::Command) -> Outcome {
        let Some(cmd) = &c.command else {
            return Outcome::ok();
        };
        // Ids are drawn from counters that only move forward.
        let counters = |d: &Data| {
            [
                d.next_dataset_id,
                d.next_job_id,
                d.next_iteration_id,
                d.next_client_id,
                d.next_task_id,
            ]
        };
        let before = counters(self);
        let out = self.apply_command(cx, cmd);
        debug_assert!(before.iter().zip(counters(self)).all(|(b, a)| a >= *b));
        out
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

impl Data {
    /// One command of the area, applied (see [`Area::apply`]).
    fn apply_command(&mut self, cx: &mut Context<'_>, cmd: &Command) -> Outcome {
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
}
