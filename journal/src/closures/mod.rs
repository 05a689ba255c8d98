//! The closure-queue area: TensorFlow's `_CoordinatedClosureQueue`
//! (the queue behind `ClusterCoordinator`; `docs/protocols.md`,
//! ClusterCoordinator closure queue semantics) replicated, so the
//! coordinator, a worker or the Raft leader can die without losing a closure
//! or a result. Its own command ([`pb::closures::Command`]), reply, state
//! ([`Data`]) and errors ([`errors`]).
//!
//! Upstream's rules, one for one:
//! * `put` waits while the queue is full (here: the closure is PENDING and
//!   admitted in order when a slot frees) and raises the pending error (the
//!   closure is then cancelled);
//! * `get` hands out the oldest queued closure (here: under a lease the
//!   leader stamps; with nothing queued the call waits as a waiter and the
//!   next queued closure is handed to it);
//! * `mark_finished`, `put_back`, `mark_failed`: the first error wins; what
//!   is queued is cancelled; closures in flight when it struck are out of
//!   generation: they are cancelled and their late results do not count;
//! * `done` raises the first error and clears it, else answers whether
//!   nothing is queued or in flight; `wait` (join) is `done` repeated by its
//!   caller until it raises or answers idle (so the error is raised by a
//!   call its caller proposed: a coordinator that died while joining never
//!   swallows it).
//!
//! Beyond upstream: a closure whose lease lapses (its worker died) is put
//! back by the leader ([`pb::closures::ExpireLeases`]); a closure finished
//! twice keeps its first result (a worker thought dead may finish one that
//! was put back); every closure keeps its outcome until released, so a new
//! coordinator can attach to the queue and fetch every result.

pub mod errors;
mod queue;
mod reader;
mod writer;

pub use reader::{QueueStats, Reader};
use writer::Writer;

use bytes::Bytes;
use std::collections::BTreeMap;

pub use crate::pb::closures::{
    Answer, Closure, ClosureError, ClosureState, Data, GetWaiter, Queue, QueueConfig,
};

use crate::area::Object;
use crate::area::{Area, Context};
use crate::cluster::Cluster;
use crate::pb::closures::{command::Command, reply, Assigned, Reply};
use crate::pb::{self, outcome, Code, DomainError, Outcome};

/// Default bound on queued closures (upstream's `_CLOSURE_QUEUE_MAX_SIZE`).
pub const DEFAULT_MAX_QUEUED: u64 = 256 * 1024;
/// Default bound on the closure records a queue keeps.
pub const DEFAULT_MAX_CLOSURES: u64 = 1_000_000;
/// Default bound on a closure's payload.
pub const DEFAULT_MAX_PAYLOAD_BYTES: u64 = 4 << 20;
/// Default bound on a closure's result.
pub const DEFAULT_MAX_RESULT_BYTES: u64 = 4 << 20;
/// Default lease of a closure handed out.
pub const DEFAULT_LEASE_MS: u64 = 10_000;
/// Longest queue name.
pub const MAX_QUEUE_NAME_BYTES: usize = 256;
/// Answers of parked calls a queue keeps (a waiter reads its own soon after
/// it is written; one evicted before is read as "nothing for you").
const MAX_ANSWERS: usize = 4096;

/// `config` with every 0 replaced by its default.
pub fn effective_config(config: &QueueConfig) -> QueueConfig {
    let or = |v: u64, d: u64| if v == 0 { d } else { v };
    QueueConfig {
        max_queued: or(config.max_queued, DEFAULT_MAX_QUEUED),
        max_closures: or(config.max_closures, DEFAULT_MAX_CLOSURES),
        max_payload_bytes: or(config.max_payload_bytes, DEFAULT_MAX_PAYLOAD_BYTES),
        max_result_bytes: or(config.max_result_bytes, DEFAULT_MAX_RESULT_BYTES),
        lease_ms: or(config.lease_ms, DEFAULT_LEASE_MS),
    }
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_QUEUE_NAME_BYTES
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./:".contains(&b))
}

impl Closure {
    /// Whether the closure has its outcome (finished, failed or cancelled).
    pub fn is_settled(&self) -> bool {
        matches!(
            self.state(),
            ClosureState::Finished | ClosureState::Failed | ClosureState::Cancelled
        )
    }
}

impl Queue {
    /// Nothing pending, queued or in flight.
    pub fn is_idle(&self) -> bool {
        self.pending.is_empty() && self.queued.is_empty() && self.running.is_empty()
    }

    fn config(&self) -> QueueConfig {
        self.config.unwrap_or_default()
    }
}

impl Reply {
    fn of(r: reply::Reply) -> Reply {
        Reply {
            reply: Some(r),
            ..Default::default()
        }
    }
}

fn answer(r: Reply) -> Outcome {
    Outcome {
        reply: Some(outcome::Reply::Closures(r)),
        ..Default::default()
    }
}

/// What a parked get reads of its call.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum GetAnswer<'a> {
    /// Still waiting for a closure.
    Waiting,
    /// This closure was handed to the call.
    Assigned(&'a Closure),
    /// Nothing will come: the call's deadline passed, or its answer is gone.
    Gone,
}

impl Area for Data {
    type Command = pb::closures::Command;

    fn apply(&mut self, cx: &mut Context<'_>, c: &Self::Command) -> Outcome {
        let Some(cmd) = &c.command else {
            return Outcome::ok();
        };
        // Every command acts on the one queue it names, and on its closures.
        let name = queue_of(cmd);
        cx.touch(|| Object::Queue(name.to_string()));
        let next_id = self.next_closure_id;
        let out = self.apply_command(cx, cmd);
        // Post: ids are never reused, and the queue keeps its rules.
        debug_assert!(self.next_closure_id >= next_id);
        debug_assert!(self
            .queues
            .get(name)
            .is_none_or(|q| check_queue(q, &self.closures).is_ok()));
        out
    }

    /// Queues start empty with the service.
    fn on_init(&mut self, _cx: &mut Context<'_>) {}

    /// Closure queues outlive a coordination job: their coordinators and
    /// workers are not tasks of the job.
    fn on_epoch_reset(&mut self, _cx: &mut Context<'_>) {}

    /// Workers are found dead by their leases, not as tasks.
    fn on_task_lost(&mut self, _cx: &mut Context<'_>, _task: u32) {}

    fn check_snapshot(&self, _cluster: Cluster<'_>) -> Result<(), String> {
        let mut counts: BTreeMap<&str, u64> = BTreeMap::new();
        for (id, c) in &self.closures {
            if *id != c.id || *id > self.next_closure_id {
                return Err(format!("closure {id} is stored under the wrong id"));
            }
            let Some(q) = self.queues.get(&c.queue) else {
                return Err(format!("closure {id} names an unknown queue"));
            };
            let linked = match c.state() {
                ClosureState::Pending => q.pending.get(&c.order) == Some(id),
                ClosureState::Queued => q.queued.get(&c.order) == Some(id),
                ClosureState::Running => q.running.contains_key(id),
                _ => true,
            };
            if !linked {
                return Err(format!("closure {id} is not where its state says"));
            }
            *counts.entry(&c.queue).or_default() += 1;
        }
        for (name, q) in &self.queues {
            if q.config.is_none() {
                return Err(format!("closure queue {name} has no config"));
            }
            if counts.get(name.as_str()).copied().unwrap_or(0) != q.closures {
                return Err(format!("closure queue {name} miscounts its closures"));
            }
            let linked = q
                .pending
                .values()
                .chain(q.queued.values())
                .chain(q.running.keys())
                .all(|id| self.closures.get(id).is_some_and(|c| &c.queue == name));
            if !linked {
                return Err(format!(
                    "closure queue {name} names a closure it does not hold"
                ));
            }
        }
        Ok(())
    }

    /// What a snapshot must hold, and the rules every apply keeps (see
    /// [`check_queue`]).
    fn check_invariants(&self, cluster: Cluster<'_>) -> Result<(), String> {
        self.check_snapshot(cluster)?;
        for (name, q) in &self.queues {
            check_queue(q, &self.closures).map_err(|e| format!("closure queue {name}: {e}"))?;
        }
        for (id, c) in &self.closures {
            let has_error = c.error.is_some();
            match c.state() {
                ClosureState::Failed if !has_error => {
                    return Err(format!("closure {id} failed without an error"))
                }
                ClosureState::Finished if has_error => {
                    return Err(format!("closure {id} finished with an error"))
                }
                _ => {}
            }
        }
        Ok(())
    }
}

impl Data {
    /// One command of the area, applied (see [`Area::apply`]).
    fn apply_command(&mut self, cx: &mut Context<'_>, cmd: &Command) -> Outcome {
        let Data {
            queues,
            closures,
            next_closure_id,
        } = self;
        let mut w = Writer {
            queues,
            closures,
            next_closure_id,
            cx,
        };
        match cmd {
            Command::CreateQueue(c) => w.create_queue(c),
            Command::Put(c) => w.put(c),
            Command::Get(c) => w.get(c),
            Command::Renew(c) => w.renew(c),
            Command::Finish(c) => w.finish(c),
            Command::Fail(c) => w.fail(c),
            Command::PutBack(c) => w.put_back(c),
            Command::ExpireLeases(c) => w.expire_leases(c),
            Command::Done(c) => w.done(c),
            Command::Release(c) => w.release(c),
        }
        .into()
    }
}

/// The rules one queue keeps after every apply: each closure it names is in
/// the state of the set it is in; a closure waits as pending only while
/// the queue is full, and a get waits only while nothing is queued; a
/// pending first error leaves nothing pending, queued or in flight; a
/// closure in flight has its worker and its lease; order numbers come from
/// the queue's counter; the record and answer bounds hold.
fn check_queue(q: &Queue, closures: &BTreeMap<u64, Closure>) -> Result<(), String> {
    let config = effective_config(&q.config());
    let in_state = |id: &u64, s: ClosureState| closures.get(id).is_some_and(|c| c.state() == s);
    let sets = [
        (&q.pending, ClosureState::Pending),
        (&q.queued, ClosureState::Queued),
    ];
    for (set, state) in sets {
        if let Some((order, id)) = set.iter().find(|(_, id)| !in_state(id, state)) {
            return Err(format!(
                "closure {id} (order {order}) is listed {state:?} but is not"
            ));
        }
        if set.keys().any(|o| *o > q.next_order) {
            return Err("an order number above the queue's counter".into());
        }
    }
    for (id, lease) in &q.running {
        let c = closures
            .get(id)
            .filter(|c| c.state() == ClosureState::Running);
        let Some(c) = c else {
            return Err(format!("closure {id} is listed in flight but is not"));
        };
        if c.worker.is_empty() || c.lease_expires_ms != *lease {
            return Err(format!(
                "closure {id} is in flight without its worker or lease"
            ));
        }
    }
    if !q.pending.is_empty() && (q.queued.len() as u64) < config.max_queued {
        return Err("closures wait as pending while the queue has room".into());
    }
    // (Queued closures can outnumber `max_queued`: a closure put back, or
    // whose lease lapsed, goes back to the queue at once, where upstream's
    // put_back waits for a free slot; an apply cannot wait.)
    if q.closures > config.max_closures {
        return Err("keeps more closures than its bound".into());
    }
    if !q.get_waiters.is_empty() && !q.queued.is_empty() {
        return Err("a get waits while closures are queued".into());
    }
    if q.error.is_some() && !q.is_idle() {
        return Err(
            "a first error is pending with closures still pending, queued or in flight".into(),
        );
    }
    if q.answers.len() > MAX_ANSWERS {
        return Err("keeps more answers than its bound".into());
    }
    Ok(())
}

/// The queue a command acts on.
fn queue_of(cmd: &Command) -> &str {
    match cmd {
        Command::CreateQueue(c) => &c.queue,
        Command::Put(c) => &c.queue,
        Command::Get(c) => &c.queue,
        Command::Renew(c) => &c.queue,
        Command::Finish(c) => &c.queue,
        Command::Fail(c) => &c.queue,
        Command::PutBack(c) => &c.queue,
        Command::ExpireLeases(c) => &c.queue,
        Command::Done(c) => &c.queue,
        Command::Release(c) => &c.queue,
    }
}

/// Whether a client may propose `command` (lease expiry is the leader's).
pub fn client_proposable(command: &Command) -> bool {
    !matches!(command, Command::ExpireLeases(_))
}

crate::area::area_commands!(
    closures,
    Closures,
    CreateQueue,
    Put,
    Get,
    Renew,
    Finish,
    Fail,
    PutBack,
    ExpireLeases,
    Done,
    Release,
);
