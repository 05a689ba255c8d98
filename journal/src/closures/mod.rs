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

/// The closure-queue area, read-only.
#[derive(Clone, Copy, Debug)]
pub struct Reader<'a> {
    pub(crate) data: &'a Data,
}

/// What an operator counts of one queue.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QueueStats {
    /// The queue.
    pub name: String,
    /// Closures waiting for room in the queue.
    pub pending: u64,
    /// Closures queued for a worker.
    pub queued: u64,
    /// Closures in flight.
    pub running: u64,
    /// Records kept (every state).
    pub records: u64,
}

impl<'a> Reader<'a> {
    /// Counts of every queue, by name.
    pub fn stats(&self) -> Vec<QueueStats> {
        self.data
            .queues
            .values()
            .map(|q| QueueStats {
                name: q.name.clone(),
                pending: q.pending.len() as u64,
                queued: q.queued.len() as u64,
                running: q.running.len() as u64,
                records: q.closures,
            })
            .collect()
    }

    /// A queue by name.
    pub fn queue(&self, name: &str) -> Option<&'a Queue> {
        self.data.queues.get(name)
    }

    /// Every queue, by name.
    pub fn queues(&self) -> impl Iterator<Item = &'a Queue> + 'a {
        self.data.queues.values()
    }

    /// A closure by id.
    pub fn closure(&self, id: u64) -> Option<&'a Closure> {
        self.data.closures.get(&id)
    }

    /// Closures of `queue` with ids above `after`, in id order, with
    /// `tag` when it is not empty; at most `limit` (0 = all).
    pub fn list(&self, queue: &str, tag: &str, after: u64, limit: usize) -> Vec<&'a Closure> {
        let it = self
            .data
            .closures
            .range(after.saturating_add(1)..)
            .map(|(_, c)| c)
            .filter(|c| c.queue == queue && (tag.is_empty() || c.tag == tag));
        if limit == 0 {
            it.collect()
        } else {
            it.take(limit).collect()
        }
    }

    /// The answer of a parked get.
    pub(crate) fn get_answer(&self, queue: &str, call_id: u64) -> GetAnswer<'a> {
        let Some(q) = self.queue(queue) else {
            return GetAnswer::Gone;
        };
        if let Some(a) = q.answers.iter().rev().find(|a| a.call_id == call_id) {
            return match self.closure(a.closure_id) {
                Some(c) => GetAnswer::Assigned(c),
                None => GetAnswer::Gone,
            };
        }
        if q.get_waiters.iter().any(|w| w.call_id == call_id) {
            GetAnswer::Waiting
        } else {
            GetAnswer::Gone
        }
    }

    /// Whether a join of `queue` would answer now: it has an error to
    /// raise, or nothing queued, pending or in flight (or it is gone).
    pub(crate) fn join_ready(&self, queue: &str) -> bool {
        self.queue(queue)
            .is_none_or(|q| q.error.is_some() || q.is_idle())
    }

    /// Closure `id` of `queue` if it is settled, `None` while it is not;
    /// an error if the queue or the closure (in that queue) is unknown.
    pub fn settled(&self, queue: &str, id: u64) -> Result<Option<&'a Closure>, DomainError> {
        if self.queue(queue).is_none() {
            return Err(errors::queue_not_found(queue));
        }
        let Some(c) = self.closure(id).filter(|c| c.queue == queue) else {
            return Err(errors::closure_not_found(queue, id));
        };
        Ok(c.is_settled().then_some(c))
    }

    /// Closures in flight whose lease ended at or before `now_ms`, by queue.
    pub fn expired_leases(&self, now_ms: u64) -> Vec<(String, Vec<u64>)> {
        self.data
            .queues
            .values()
            .filter_map(|q| {
                let ids: Vec<u64> = q
                    .running
                    .iter()
                    .filter(|(_, until)| **until <= now_ms)
                    .map(|(id, _)| *id)
                    .collect();
                (!ids.is_empty()).then(|| (q.name.clone(), ids))
            })
            .collect()
    }

    /// The earliest lease end of any closure in flight.
    pub fn next_lease_end(&self) -> Option<u64> {
        self.data
            .queues
            .values()
            .flat_map(|q| q.running.values())
            .min()
            .copied()
    }
}

/// Applies closure-queue commands.
struct Writer<'d, 'c, 'x> {
    queues: &'d mut BTreeMap<String, Queue>,
    closures: &'d mut BTreeMap<u64, Closure>,
    next_closure_id: &'d mut u64,
    cx: &'c mut Context<'x>,
}

/// One queue and the closures, borrowed apart.
struct Q<'d> {
    q: &'d mut Queue,
    closures: &'d mut BTreeMap<u64, Closure>,
    at_ms: u64,
}

impl Q<'_> {
    fn closure(&mut self, id: u64) -> &mut Closure {
        self.closures
            .get_mut(&id)
            .expect("a queue names only closures it holds")
    }

    fn next_order(&mut self) -> u64 {
        self.q.next_order += 1;
        self.q.next_order
    }

    fn enqueue(&mut self, id: u64) {
        let order = self.next_order();
        let c = self.closure(id);
        c.set_state(ClosureState::Queued);
        c.order = order;
        c.worker.clear();
        c.lease_expires_ms = 0;
        self.q.queued.insert(order, id);
    }

    /// Takes the closure out of the queue's pending, queued or running set.
    fn unlink(&mut self, id: u64) {
        let (state, order) = {
            let c = self.closure(id);
            (c.state(), c.order)
        };
        match state {
            ClosureState::Pending => {
                self.q.pending.remove(&order);
            }
            ClosureState::Queued => {
                self.q.queued.remove(&order);
            }
            ClosureState::Running => {
                self.q.running.remove(&id);
            }
            _ => {}
        }
    }

    /// Hands the oldest queued closure to `worker`.
    fn hand_out(&mut self, worker: &str) -> Option<Assigned> {
        let (_, id) = self.q.queued.pop_first()?;
        let until = self.at_ms.saturating_add(self.q.config().lease_ms);
        let c = self.closure(id);
        c.set_state(ClosureState::Running);
        c.worker = worker.to_string();
        c.lease_expires_ms = until;
        c.attempts += 1;
        let a = Assigned {
            closure_id: id,
            payload: c.payload.clone(),
            attempt: c.attempts,
            tag: c.tag.clone(),
            lease_expires_ms: until,
        };
        self.q.running.insert(id, until);
        Some(a)
    }

    fn push_answer(&mut self, a: Answer) {
        self.q.answers.push(a);
        let over = self.q.answers.len().saturating_sub(MAX_ANSWERS);
        if over > 0 {
            self.q.answers.drain(..over);
        }
    }

    /// Restores the queue's invariants after a change: pending closures
    /// fill free slots, and queued closures go to live get waiters.
    fn settle(&mut self) {
        let at = self.at_ms;
        self.q
            .get_waiters
            .retain(|w| w.deadline_ms == 0 || w.deadline_ms > at);
        loop {
            let max = self.q.config().max_queued;
            while (self.q.queued.len() as u64) < max {
                let Some((_, id)) = self.q.pending.pop_first() else {
                    break;
                };
                self.enqueue(id);
            }
            if self.q.get_waiters.is_empty() || self.q.queued.is_empty() {
                break;
            }
            let w = self.q.get_waiters.remove(0);
            if let Some(a) = self.hand_out(&w.worker) {
                self.push_answer(Answer {
                    call_id: w.call_id,
                    closure_id: a.closure_id,
                });
            }
        }
    }

    /// The first error: kept until raised; everything pending, queued or in
    /// flight is cancelled (closures in flight are out of generation).
    fn first_error(&mut self, e: ClosureError) {
        if self.q.error.is_some() {
            return;
        }
        self.q.error = Some(e);
        self.q.generation += 1;
        let ids: Vec<u64> = self
            .q
            .pending
            .values()
            .chain(self.q.queued.values())
            .copied()
            .chain(self.q.running.keys().copied())
            .collect();
        self.q.pending.clear();
        self.q.queued.clear();
        self.q.running.clear();
        for id in ids {
            let c = self.closure(id);
            c.set_state(ClosureState::Cancelled);
            c.lease_expires_ms = 0;
        }
    }

    /// Whether `id` is a closure of this queue that a finish or a failure
    /// may still settle (queued, or in flight, in this generation).
    fn settleable(&self, id: u64) -> bool {
        self.closures.get(&id).is_some_and(|c| {
            c.queue == self.q.name
                && matches!(c.state(), ClosureState::Queued | ClosureState::Running)
        })
    }
}

impl Writer<'_, '_, '_> {
    fn queue(&mut self, name: &str) -> Result<Q<'_>, pb::DomainError> {
        match self.queues.get_mut(name) {
            Some(q) => Ok(Q {
                q,
                closures: self.closures,
                at_ms: self.cx.at_ms,
            }),
            None => Err(errors::queue_not_found(name)),
        }
    }

    fn create_queue(&mut self, c: &pb::closures::CreateQueue) -> Result<Outcome, pb::DomainError> {
        if !valid_name(&c.queue) {
            return Err(errors::bad_queue_name(&c.queue, MAX_QUEUE_NAME_BYTES));
        }
        let wanted = c.config.as_ref().map(effective_config);
        if let Some(q) = self.queues.get(&c.queue) {
            if let Some(w) = wanted {
                let have = q.config();
                for (what, a, b) in [
                    ("max_queued", w.max_queued, have.max_queued),
                    ("max_closures", w.max_closures, have.max_closures),
                    (
                        "max_payload_bytes",
                        w.max_payload_bytes,
                        have.max_payload_bytes,
                    ),
                    (
                        "max_result_bytes",
                        w.max_result_bytes,
                        have.max_result_bytes,
                    ),
                    ("lease_ms", w.lease_ms, have.lease_ms),
                ] {
                    if a != b {
                        return Err(errors::config_conflict(
                            &c.queue,
                            &format!("{what} ({b}, not {a})"),
                        ));
                    }
                }
            }
            return Ok(Outcome::ok());
        }
        self.queues.insert(
            c.queue.clone(),
            Queue {
                name: c.queue.clone(),
                config: Some(wanted.unwrap_or_else(|| effective_config(&QueueConfig::default()))),
                ..Default::default()
            },
        );
        Ok(Outcome::ok())
    }

    fn put(&mut self, c: &pb::closures::Put) -> Result<Outcome, pb::DomainError> {
        let first = *self.next_closure_id + 1;
        let call_id = self.cx.next_call_id();
        let mut q = self.queue(&c.queue)?;
        let config = q.q.config();
        let payloads = || std::iter::once(&c.payload).chain(&c.more_payloads);
        if let Some(p) = payloads().find(|p| p.len() as u64 > config.max_payload_bytes) {
            return Err(errors::payload_too_large(p.len(), config.max_payload_bytes));
        }
        let n = 1 + c.more_payloads.len() as u64;
        if q.q.closures.saturating_add(n) > config.max_closures {
            return Err(errors::too_many_closures(&c.queue, config.max_closures));
        }
        q.q.closures += n;
        // Upstream puts, then raises: the closures are cancelled with the
        // rest, the error raised and cleared.
        let raised = q.q.error.take();
        let mut parked = false;
        for (id, payload) in (first..).zip(payloads()) {
            q.closures.insert(
                id,
                Closure {
                    id,
                    queue: c.queue.clone(),
                    payload: payload.clone(),
                    tag: c.tag.clone(),
                    ..Default::default()
                },
            );
            if raised.is_some() {
                q.closure(id).set_state(ClosureState::Cancelled);
            } else if q.q.queued.len() as u64 >= config.max_queued {
                let order = q.next_order();
                let cl = q.closure(id);
                cl.set_state(ClosureState::Pending);
                cl.order = order;
                q.q.pending.insert(order, id);
                parked = true;
            } else {
                q.enqueue(id);
            }
            q.settle();
        }
        *self.next_closure_id = first + n - 1;
        let mut reply = Reply::of(reply::Reply::ClosureId(first));
        reply.raised = raised;
        let mut out = answer(reply);
        if parked {
            out.parked = true;
            out.call_id = call_id;
        }
        Ok(out)
    }

    fn get(&mut self, c: &pb::closures::Get) -> Result<Outcome, pb::DomainError> {
        if c.worker.is_empty() {
            return Err(errors::no_worker());
        }
        let call_id = self.cx.next_call_id();
        let mut q = self.queue(&c.queue)?;
        q.settle();
        if let Some(a) = q.hand_out(&c.worker) {
            q.settle();
            let mut reply = Reply::of(reply::Reply::Assigned(a));
            for _ in 1..c.max_closures.max(1) {
                let Some(a) = q.hand_out(&c.worker) else {
                    break;
                };
                reply.more_assigned.push(a);
                q.settle();
            }
            return Ok(answer(reply));
        }
        q.q.get_waiters.push(GetWaiter {
            call_id,
            worker: c.worker.clone(),
            deadline_ms: c.deadline_ms,
        });
        Ok(Outcome::parked(call_id))
    }

    fn renew(&mut self, c: &pb::closures::Renew) -> Result<Outcome, pb::DomainError> {
        let mut q = self.queue(&c.queue)?;
        let until = q.at_ms.saturating_add(q.q.config().lease_ms);
        let mut renewed = 0;
        let ids: Vec<u64> = q.q.running.keys().copied().collect();
        for id in ids {
            if q.closures.get(&id).is_some_and(|cl| cl.worker == c.worker) {
                q.closure(id).lease_expires_ms = until;
                q.q.running.insert(id, until);
                renewed += 1;
            }
        }
        Ok(answer(Reply::of(reply::Reply::Renewed(renewed))))
    }

    fn finish(&mut self, c: &pb::closures::Finish) -> Result<Outcome, pb::DomainError> {
        let mut q = self.queue(&c.queue)?;
        let first = finish(&mut q, c.closure_id, &c.worker, &c.result);
        let mut reply = Reply::of(reply::Reply::Accepted(first));
        reply.more_accepted = c
            .more
            .iter()
            .map(|r| finish(&mut q, r.closure_id, &c.worker, &r.result))
            .collect();
        Ok(answer(reply))
    }

    fn fail(&mut self, c: &pb::closures::Fail) -> Result<Outcome, pb::DomainError> {
        let mut q = self.queue(&c.queue)?;
        if !q.settleable(c.closure_id) {
            return Ok(answer(Reply::of(reply::Reply::Accepted(false))));
        }
        let mut e = c.error.clone().unwrap_or_default();
        if e.code == Code::Ok as i32 {
            e.code = Code::Unknown as i32;
        }
        Ok(fail(&mut q, c.closure_id, &c.worker, e))
    }

    fn put_back(&mut self, c: &pb::closures::PutBack) -> Result<Outcome, pb::DomainError> {
        let mut q = self.queue(&c.queue)?;
        let held = q.closures.get(&c.closure_id).is_some_and(|cl| {
            cl.queue == c.queue && cl.state() == ClosureState::Running && cl.worker == c.worker
        });
        if held {
            q.unlink(c.closure_id);
            q.enqueue(c.closure_id);
            q.settle();
        }
        Ok(answer(Reply::of(reply::Reply::Accepted(held))))
    }

    fn expire_leases(
        &mut self,
        c: &pb::closures::ExpireLeases,
    ) -> Result<Outcome, pb::DomainError> {
        let mut q = self.queue(&c.queue)?;
        let at = q.at_ms;
        let mut expired = 0;
        for &id in &c.closure_ids {
            if q.q.running.get(&id).is_some_and(|until| *until <= at) {
                q.unlink(id);
                q.enqueue(id);
                expired += 1;
            }
        }
        q.settle();
        Ok(answer(Reply::of(reply::Reply::Renewed(expired))))
    }

    fn done(&mut self, c: &pb::closures::Done) -> Result<Outcome, pb::DomainError> {
        let q = self.queue(&c.queue)?;
        if let Some(e) = q.q.error.take() {
            return Ok(answer(Reply {
                raised: Some(e),
                ..Default::default()
            }));
        }
        Ok(answer(Reply::of(reply::Reply::Idle(q.q.is_idle()))))
    }

    fn release(&mut self, c: &pb::closures::Release) -> Result<Outcome, pb::DomainError> {
        let q = self.queue(&c.queue)?;
        let mut released = 0;
        for id in &c.closure_ids {
            let drop = q
                .closures
                .get(id)
                .is_some_and(|cl| cl.queue == c.queue && cl.is_settled());
            if drop {
                q.closures.remove(id);
                q.q.closures -= 1;
                released += 1;
            }
        }
        Ok(answer(Reply::of(reply::Reply::Released(released))))
    }
}

/// `mark_finished` of one closure: whether it was accepted (a result over
/// the limit fails the closure instead).
fn finish(q: &mut Q<'_>, id: u64, worker: &str, result: &Bytes) -> bool {
    if !q.settleable(id) {
        return false;
    }
    let limit = q.q.config().max_result_bytes;
    if result.len() as u64 > limit {
        let (code, message) = errors::result_too_large(result.len(), limit);
        let e = ClosureError {
            code: code as i32,
            message,
            ..Default::default()
        };
        fail(q, id, worker, e);
        return true;
    }
    q.unlink(id);
    let cl = q.closure(id);
    cl.set_state(ClosureState::Finished);
    cl.result = result.clone();
    cl.worker = worker.to_string();
    cl.lease_expires_ms = 0;
    q.settle();
    true
}

/// Fails a settleable closure with `e` (the queue's first error if none is
/// pending).
fn fail(q: &mut Q<'_>, id: u64, worker: &str, mut e: ClosureError) -> Outcome {
    e.closure_id = id;
    q.unlink(id);
    let cl = q.closure(id);
    cl.set_state(ClosureState::Failed);
    cl.error = Some(e.clone());
    cl.worker = worker.to_string();
    cl.lease_expires_ms = 0;
    q.first_error(e);
    q.settle();
    answer(Reply::of(reply::Reply::Accepted(true)))
}

impl Area for Data {
    type Command = pb::closures::Command;

    fn apply(&mut self, cx: &mut Context<'_>, c: &Self::Command) -> Outcome {
        let Some(cmd) = &c.command else {
            return Outcome::ok();
        };
        // Every command acts on the one queue it names, and on its closures.
        cx.touch(|| Object::Queue(queue_of(cmd).to_string()));
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

    /// What a snapshot must hold is every rule the queues keep.
    fn check_invariants(&self, cluster: Cluster<'_>) -> Result<(), String> {
        self.check_snapshot(cluster)
    }
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
