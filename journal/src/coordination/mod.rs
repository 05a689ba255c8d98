//! The coordination area: what XLA's and TensorFlow's coordination service
//! keep — tasks and their lifecycle (`tasks`), the KV store (`kv`), barriers
//! (`barrier`), GetAliveTasks rounds (`alive`) — with its own command
//! ([`pb::coordination::Command`]), reply, state ([`Data`]) and errors
//! ([`errors`]).
//!
//! Commands apply through a [`Writer`] (the area's state, the shared
//! [`Cluster`] view and the apply [`Context`]); the service reads the area
//! through a [`Reader`] (`State::coordination()`).

mod alive;
mod barrier;
pub mod errors;
mod keys;
mod kv;
mod tasks;

pub use crate::pb::coordination::{Data, TaskStatus};
pub use alive::{alive_round_key, AliveTasks};
pub use barrier::{shutdown_barrier_id, wait_all_barrier_id, BarrierDeadline, REGISTER_BARRIER};
pub use keys::normalize_key;
pub use kv::{kv_bytes, Compacted, DEFAULT_WATCH_HISTORY_BYTES, MAX_WATCH_EVENTS};
pub use tasks::{HeartbeatCheck, WAIT_FOR_ALL_TASKS_TIMEOUT_MS};

use crate::area::Object;
use crate::area::{Area, Context};
use crate::cluster::Cluster;
use crate::pb::coordination::{command::Command, reply::Reply, TaskEntry};
use crate::pb::{self, outcome, DomainError, Outcome};
use errors::UnknownTaskIn;

/// The coordination area, read-only: its state and the shared view.
#[derive(Clone, Copy, Debug)]
pub struct Reader<'a> {
    pub(crate) cl: Cluster<'a>,
    pub(crate) data: &'a Data,
    /// Bytes of the store's keys and values (kept beside the state).
    pub(crate) kv_bytes: u64,
}

/// The coordination area while a command applies.
pub(crate) struct Writer<'a, 'c> {
    pub(crate) cl: Cluster<'a>,
    pub(crate) data: &'a mut Data,
    pub(crate) cx: &'a mut Context<'c>,
}

impl Writer<'_, '_> {
    /// The area read-only, for the readers the commands share with the service.
    pub(crate) fn r(&self) -> Reader<'_> {
        Reader {
            cl: self.cl,
            data: self.data,
            kv_bytes: *self.cx.kv_bytes,
        }
    }

    pub(crate) fn next_call_id(&mut self) -> u64 {
        self.cx.next_call_id()
    }

    pub(crate) fn bump_tasks_version(&mut self) {
        self.data.tasks_version += 1;
        self.cx.touch(|| Object::TaskStates);
    }

    /// A task's entry, to change (the change is reported: see
    /// [`crate::wait`]).
    pub(crate) fn task_mut(&mut self, task: u32) -> &mut TaskEntry {
        self.cx.touch(|| Object::Task(task));
        self.data.entry_mut(task)
    }

    /// Whether `task` is recoverable: the whole service is, or the task
    /// declared itself so when it last registered.
    pub(crate) fn task_recoverable(&self, task: u32) -> bool {
        self.r().task_recoverable(task)
    }
}

impl Data {
    pub(crate) fn task_count(&self) -> u32 {
        self.tasks.len() as u32
    }

    pub(crate) fn check_task(&self, task: u32, call: UnknownTaskIn) -> Result<(), DomainError> {
        if (task as usize) < self.tasks.len() {
            Ok(())
        } else {
            Err(errors::unknown_task(call, &task.to_string()))
        }
    }

    pub(crate) fn entry(&self, task: u32) -> &TaskEntry {
        &self.tasks[task as usize]
    }

    pub(crate) fn entry_mut(&mut self, task: u32) -> &mut TaskEntry {
        &mut self.tasks[task as usize]
    }

    pub(crate) fn task_status(&self, task: u32) -> Option<TaskStatus> {
        self.tasks.get(task as usize).map(|t| t.status())
    }
}

/// What an operator counts of the coordination area.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Tasks by status: disconnected, connected, in error.
    pub tasks: [u64; 3],
    /// Barrier ids whose newest instance is pending.
    pub barriers_pending: u64,
    /// KV keys.
    pub keys: u64,
    /// Bytes of KV keys and values.
    pub kv_bytes: u64,
}

impl<'a> Reader<'a> {
    /// Counts for operators (O(tasks + barriers)).
    pub fn stats(&self) -> Stats {
        let mut tasks = [0u64; 3];
        for t in &self.data.tasks {
            tasks[(t.status() as usize).min(2)] += 1;
        }
        Stats {
            tasks,
            barriers_pending: self
                .data
                .barriers
                .values()
                .filter(|b| b.status() == crate::pb::coordination::BarrierStatus::Pending)
                .count() as u64,
            keys: self.data.kv.len() as u64,
            kv_bytes: self.kv_bytes,
        }
    }

    /// The stored entry of a task.
    pub fn task(&self, index: u32) -> Option<&'a TaskEntry> {
        self.data.tasks.get(index as usize)
    }

    /// The status of a task.
    pub fn task_status(&self, index: u32) -> Option<TaskStatus> {
        self.data.task_status(index)
    }

    /// The WatchTasks version, bumped on every task-state change.
    pub fn tasks_version(&self) -> i64 {
        self.data.tasks_version
    }

    /// The error propagated to pollers, if any.
    pub fn propagated_error(&self) -> Option<&'a DomainError> {
        self.data.propagated_error.as_ref()
    }

    /// Whether `task` is recoverable: the whole service is, or the task
    /// declared itself so when it last registered.
    pub fn task_recoverable(&self, task: u32) -> bool {
        self.cl.recoverable() || self.task(task).is_some_and(|t| t.recoverable)
    }
}

impl Area for Data {
    type Command = pb::coordination::Command;

    fn apply(&mut self, cx: &mut Context<'_>, c: &Self::Command) -> Outcome {
        let Some(cmd) = &c.command else {
            return Outcome::ok();
        };
        let at = cx.at_ms;
        // Pre: the tasks are the configuration's; the KV revision and the
        // task-state version only move forward.
        debug_assert_eq!(self.tasks.len(), cx.cluster.task_count() as usize);
        let (revision, version) = (self.kv_revision, self.tasks_version);
        let out = self.apply_command(cx, cmd, at);
        debug_assert_eq!(self.tasks.len(), cx.cluster.task_count() as usize);
        debug_assert!(self.kv_revision >= revision && self.tasks_version >= version);
        debug_assert!(self.kv_history_start <= self.kv_revision + 1);
        out
    }

    fn on_init(&mut self, cx: &mut Context<'_>) {
        self.tasks = vec![TaskEntry::default(); cx.cluster.task_count() as usize];
    }

    fn on_epoch_reset(&mut self, cx: &mut Context<'_>) {
        let mut w = Writer {
            cl: cx.cluster,
            data: self,
            cx,
        };
        w.data.kv.clear();
        *w.cx.kv_bytes = 0;
        w.clear_history();
        w.data.barriers.clear();
        w.data.propagated_error = None;
        w.data.any_polled = false;
        w.data.alive_rounds.clear();
        w.data.tasks = vec![TaskEntry::default(); w.cl.task_count() as usize];
        w.bump_tasks_version();
    }

    /// Tasks are the coordination area's own: it never hears of them from
    /// another area.
    fn on_task_lost(&mut self, _cx: &mut Context<'_>, _task: u32) {}

    fn check_snapshot(&self, cl: Cluster<'_>) -> Result<(), String> {
        let n = cl.task_count();
        if self.tasks.len() != n as usize {
            return Err(format!(
                "{} tasks stored but the configuration has {n}",
                self.tasks.len()
            ));
        }
        check_task_references(self)
    }

    fn check_invariants(&self, cl: Cluster<'_>) -> Result<(), String> {
        if cl.config.is_some() {
            self.check_snapshot(cl)?;
        } else if !self.tasks.is_empty() {
            return Err("tasks are stored before the service is configured".into());
        }
        for (i, t) in self.tasks.iter().enumerate() {
            if t.status() == TaskStatus::Error && t.error.is_none() {
                return Err(format!("task {i} is in ERROR without its error"));
            }
        }
        for (id, b) in &self.barriers {
            barrier::check_instance(id, b)?;
            if let Some(p) = b.previous.as_deref() {
                barrier::check_instance(id, p)?;
                if p.previous.is_some() {
                    return Err(format!("barrier {id}: an instance before the previous one"));
                }
            }
        }
        kv::check_store(self)
    }
}

/// Every task index a snapshot stores names a task of its configuration,
/// and every set the code searches is sorted without repeats: a snapshot
/// that breaks either is refused on install, not met by a panic on the
/// next apply.
fn check_task_references(d: &Data) -> Result<(), String> {
    let n = d.tasks.len() as u32;
    let bad = |what: String| Err(what);
    let sorted_unique = |v: &[u32]| v.windows(2).all(|w| w[0] < w[1]);
    for (id, b) in &d.barriers {
        let mut inst = Some(b);
        while let Some(b) = inst {
            if b.participants.iter().any(|&t| t >= n) || !sorted_unique(&b.participants) {
                return bad(format!("barrier {id}::{}: bad participant set", b.counter));
            }
            if b.arrivals.keys().any(|&t| t >= n) || b.initiating_task >= n {
                return bad(format!("barrier {id}::{}: unknown task", b.counter));
            }
            inst = b.previous.as_deref();
        }
    }
    for (key, r) in &d.alive_rounds {
        let results_ok = r.results.iter().all(|x| x.tasks.iter().all(|&t| t < n));
        if r.tasks.iter().any(|&t| t >= n)
            || !sorted_unique(&r.tasks)
            || r.callers.keys().any(|&t| t >= n)
            || !results_ok
        {
            return bad(format!("GetAliveTasks round {key}: unknown task"));
        }
    }
    let errors = d
        .tasks
        .iter()
        .flat_map(|t| [&t.error, &t.poll_result, &t.notice])
        .chain([&d.propagated_error])
        .flatten();
    for e in errors {
        if e.source_task.is_some_and(|t| t >= n) {
            return bad("an error names an unknown source task".into());
        }
    }
    Ok(())
}

// ------------------------------------------------------- commands, replies ----

/// Whether a client may propose `command` (the area's allow-list). The
/// timer- and liveness-driven commands (Heartbeat, TasksUnhealthy,
/// BarrierExpire) belong to the leader runtime, which stamps them itself; a
/// command added later is refused until it is listed here.
pub fn client_proposable(command: &Command) -> bool {
    match command {
        Command::RegisterTask(_)
        | Command::ReportError(_)
        | Command::PollForError(_)
        | Command::ShutdownTask(_)
        | Command::ResetTask(_)
        | Command::KvInsert(_)
        | Command::KvDelete(_)
        | Command::KvIncrement(_)
        | Command::BarrierArrive(_)
        | Command::BarrierCancel(_)
        | Command::AliveTasks(_)
        | Command::WaitForAllTasks(_) => true,
        Command::Heartbeat(_) | Command::TasksUnhealthy(_) | Command::BarrierExpire(_) => false,
    }
}

crate::area::area_commands!(
    coordination,
    Coordination,
    RegisterTask,
    Heartbeat,
    TasksUnhealthy,
    ReportError,
    PollForError,
    ShutdownTask,
    ResetTask,
    KvInsert,
    KvDelete,
    KvIncrement,
    BarrierArrive,
    BarrierCancel,
    BarrierExpire,
    AliveTasks,
    WaitForAllTasks,
);

impl Outcome {
    fn coordination(reply: Reply) -> Self {
        Outcome {
            reply: Some(outcome::Reply::Coordination(pb::coordination::Reply {
                reply: Some(reply),
            })),
            ..Default::default()
        }
    }

    fn coordination_reply(&self) -> Option<&Reply> {
        match &self.reply {
            Some(outcome::Reply::Coordination(r)) => r.reply.as_ref(),
            _ => None,
        }
    }

    /// A RegisterTask answered at once: the service incarnation.
    pub fn registered(&self) -> Option<u64> {
        match self.coordination_reply()? {
            Reply::Registered(inc) => Some(*inc),
            _ => None,
        }
    }

    /// A KvIncrement: the new value.
    pub fn incremented(&self) -> Option<i64> {
        match self.coordination_reply()? {
            Reply::Incremented(v) => Some(*v),
            _ => None,
        }
    }

    /// A BarrierArrive: the instance (counter) the call arrived at.
    pub fn barrier_counter(&self) -> Option<i64> {
        match self.coordination_reply()? {
            Reply::BarrierCounter(c) => Some(*c),
            _ => None,
        }
    }

    /// An AliveTasks call: the round generation it waits on.
    pub fn alive_generation(&self) -> Option<u64> {
        match self.coordination_reply()? {
            Reply::AliveGeneration(g) => Some(*g),
            _ => None,
        }
    }
}

/// Reply constructors for the area's commands.
pub(crate) fn registered(inc: u64) -> Outcome {
    Outcome::coordination(Reply::Registered(inc))
}

pub(crate) fn incremented(v: i64) -> Outcome {
    Outcome::coordination(Reply::Incremented(v))
}

pub(crate) fn barrier_counter(counter: i64) -> Outcome {
    Outcome::coordination(Reply::BarrierCounter(counter))
}

pub(crate) fn alive_generation(generation: u64) -> Outcome {
    Outcome::coordination(Reply::AliveGeneration(generation))
}

impl Data {
    /// One command of the area, applied (see [`Area::apply`]).
    fn apply_command(&mut self, cx: &mut Context<'_>, cmd: &Command, at: u64) -> Outcome {
        let mut w = Writer {
            cl: cx.cluster,
            data: self,
            cx,
        };
        match cmd {
            Command::RegisterTask(c) => w.register_task(c.task, c.incarnation, c.recoverable, at),
            Command::Heartbeat(c) => w.heartbeat(c.task, c.incarnation, at),
            Command::TasksUnhealthy(c) => w.tasks_unhealthy(&c.tasks, at),
            Command::ReportError(c) => w.report_error(c, at),
            Command::PollForError(c) => w.poll_for_error(c.task, at),
            Command::ShutdownTask(c) => w.shutdown_task(c.task, c.recoverable, at),
            Command::ResetTask(c) => w.reset_task(c.task, at),
            Command::KvInsert(c) => w.kv_insert(c),
            Command::KvDelete(c) => w.kv_delete(&c.key),
            Command::KvIncrement(c) => w.kv_increment(&c.key, c.increment),
            Command::BarrierArrive(c) => w.barrier_arrive(c, at),
            Command::BarrierCancel(c) => w.barrier_cancel(&c.id, c.counter, c.task, at),
            Command::BarrierExpire(c) => w.barrier_expire(&c.id, c.counter, at),
            Command::AliveTasks(c) => w.alive_tasks(c.task, &c.tasks),
            Command::WaitForAllTasks(c) => w.wait_for_all_tasks(c.task, &c.device_info, at),
        }
    }
}
