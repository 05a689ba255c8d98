//! Barriers (`docs/protocols.md`, Barriers): instances identified by (id,
//! counter), the participant checks, first-caller deadlines, cancel, replay
//! of a finished result, failure when a participant errors or disconnects,
//! and the special registration, shutdown and WaitForAllTasks barriers.

use super::errors::{self, UnknownTaskIn};
use super::{Reader, Writer};
use crate::area::Object;
use crate::pb::coordination::{BarrierArrive, BarrierEntry, BarrierStatus, TaskStatus};
use crate::pb::{DomainError, Outcome};

/// The registration barrier every RegisterTask joins (counter 0, all tasks).
pub const REGISTER_BARRIER: &str = "[Init]Wait_for_all_tasks_to_register";

/// The shutdown barrier of a service incarnation.
pub fn shutdown_barrier_id(service_incarnation: u64) -> String {
    format!("Shutdown::{service_incarnation}")
}

/// The WaitForAllTasks device-propagation barrier of a service incarnation.
pub fn wait_all_barrier_id(service_incarnation: u64) -> String {
    format!("WaitForAllTasks::{service_incarnation}")
}

/// A pending barrier deadline, for the leader's timers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BarrierDeadline {
    /// Barrier id.
    pub id: String,
    /// Instance counter.
    pub counter: i64,
    /// Absolute deadline in ms.
    pub deadline_ms: u64,
}

/// The rules every stored barrier instance keeps: arrivals come from its
/// participants; a pending instance still misses someone (the last arrival
/// passes it); a finished one carries its error exactly when it failed.
pub(crate) fn check_instance(id: &str, b: &BarrierEntry) -> Result<(), String> {
    let name = errors::barrier_name(id, b.counter);
    if b.arrivals
        .keys()
        .any(|t| b.participants.binary_search(t).is_err())
    {
        return Err(format!("barrier {name}: an arrival from a non-participant"));
    }
    match b.status() {
        BarrierStatus::Pending if b.arrivals.len() >= b.participants.len() => Err(format!(
            "barrier {name}: pending with every participant arrived"
        )),
        BarrierStatus::Pending | BarrierStatus::Passed if b.error.is_some() => Err(format!(
            "barrier {name}: an error on an instance that did not fail"
        )),
        BarrierStatus::Failed if b.error.is_none() => {
            Err(format!("barrier {name}: failed without its error"))
        }
        _ => Ok(()),
    }
}

/// Sorted, de-duplicated task indices.
pub(crate) fn sorted_set(tasks: &[u32]) -> Vec<u32> {
    let mut v = tasks.to_vec();
    v.sort_unstable();
    v.dedup();
    v
}

/// One task's arrival at a barrier, as the commands that arrive describe it.
pub(crate) struct Arrival<'a> {
    /// Barrier id.
    pub(crate) id: &'a str,
    /// The instance the caller names.
    pub(crate) counter: i64,
    /// The caller's timeout (`None`: no deadline).
    pub(crate) timeout_ms: Option<u64>,
    /// The caller's participant set (empty: every task).
    pub(crate) participants: &'a [u32],
    /// A participant the caller named that does not exist ("" if none).
    pub(crate) unknown_participant: &'a str,
    /// The arriving task.
    pub(crate) task: u32,
    /// The caller declares itself recoverable (TensorFlow).
    pub(crate) caller_recoverable: bool,
}

impl<'a> Arrival<'a> {
    /// An arrival of `task` at instance `counter` of `id`, for every task,
    /// with no deadline and nothing unknown.
    pub(crate) fn new(id: &'a str, counter: i64, task: u32) -> Self {
        Arrival {
            id,
            counter,
            timeout_ms: None,
            participants: &[],
            unknown_participant: "",
            task,
            caller_recoverable: false,
        }
    }
}

/// How a step of an arrival ends the call early: with this outcome (boxed:
/// an outcome is large, and most arrivals go on).
type Ended = Box<Outcome>;

impl Writer<'_, '_> {
    pub(crate) fn barrier_arrive(&mut self, a: &BarrierArrive, at: u64) -> Outcome {
        if let Err(e) = self.data.check_task(a.task, UnknownTaskIn::Barrier) {
            return Outcome::err(e);
        }
        // Adapters resolve names and leave unknown ones out; an index past
        // the cluster (an update from elsewhere) is an unknown participant
        // too, so no barrier ever stores a task that does not exist.
        let n = self.data.task_count();
        let participants: Vec<u32> = a.participants.iter().copied().filter(|&p| p < n).collect();
        let unknown = match a.participants.iter().find(|&&p| p >= n) {
            Some(p) if a.unknown_participant.is_empty() => p.to_string(),
            _ => a.unknown_participant.clone(),
        };
        self.arrive(
            &Arrival {
                id: &a.id,
                counter: a.counter,
                timeout_ms: Some(a.timeout_ms),
                participants: &participants,
                unknown_participant: &unknown,
                task: a.task,
                caller_recoverable: a.recoverable,
            },
            at,
        )
    }

    /// One task arrives at a barrier instance. Returns the result if the
    /// barrier finished (now or earlier), else parked with the call id to
    /// wait on (`Wait::Barrier`). Either way the outcome carries the
    /// **effective** instance counter (a recoverable caller's counter 0
    /// becomes the instance it joined or opened).
    ///
    /// The order of the checks is XLA's (`BarrierAsyncLocked`, see
    /// `docs/protocols.md`, Barriers), one step each: (1) select the
    /// instance, opening a new one if the rules say so, or fail on a counter
    /// mismatch; (2) validate the arguments, against a finished instance
    /// too, and replay a finished instance's result; (3) record the arrival.
    pub(crate) fn arrive(&mut self, a: &Arrival<'_>, at: u64) -> Outcome {
        self.cx.touch(|| Object::Barrier(a.id.to_string()));
        let step = self
            .select_instance(a, at)
            .and_then(|counter| self.validate_arrival(a, counter, at).map(|()| counter));
        match step {
            Ok(counter) => self.record_arrival(a, counter, at),
            Err(ended) => *ended,
        }
    }

    /// Step 1: the instance the arrival joins (its counter): a new one, the
    /// current one, or a counter mismatch that fails the call (and the
    /// current instance, for everyone).
    fn select_instance(&mut self, a: &Arrival<'_>, at: u64) -> Result<i64, Ended> {
        let (id, task) = (a.id, a.task);
        // The counter-0 rule is the caller's: the service's flag, or the
        // task's own (TensorFlow sends it with every call).
        let recoverable = self.cl.recoverable() || a.caller_recoverable;
        // The registration, shutdown and device barriers are exempt from the
        // recoverable counter-0 rule (XLA and TSL exclude them by id).
        let special = id == REGISTER_BARRIER
            || id == shutdown_barrier_id(self.cl.service_incarnation)
            || id == wait_all_barrier_id(self.cl.service_incarnation);
        let (create, counter) = match self.data.barriers.get(id) {
            None if a.counter == 0 => (true, 0),
            None => {
                // Upstream: the uninitialised instance (counter 0, nobody
                // listed) fails, and stays failed with an empty task set.
                let e = errors::barrier_counter_mismatch(id, a.counter, 0);
                self.data.barriers.insert(
                    id.to_string(),
                    BarrierEntry {
                        status: BarrierStatus::Failed as i32,
                        error: Some(e.clone()),
                        initiating_task: task,
                        ..Default::default()
                    },
                );
                return Err(Box::new(Outcome::err(e)));
            }
            Some(b) => {
                let finished = b.status() != BarrierStatus::Pending;
                if finished && a.counter == b.counter + 1 {
                    (true, a.counter)
                } else if finished && recoverable && a.counter == 0 && !special {
                    // A restarted recoverable task (its agent forgot its
                    // counters) opens the next instance and waits there.
                    (true, b.counter + 1)
                } else if a.counter == b.counter || (recoverable && a.counter == 0) {
                    // The current instance (a recoverable counter 0 joins a
                    // pending one whatever its counter).
                    (false, b.counter)
                } else {
                    let e = errors::barrier_counter_mismatch(id, a.counter, b.counter);
                    let current = b.counter;
                    // The caller's own earlier call is superseded first
                    // (CANCELLED), then the instance fails for everyone.
                    let b = self.data.barriers.get_mut(id).expect("present");
                    if b.status() == BarrierStatus::Pending {
                        if let Some(old) = b.arrivals.remove(&task) {
                            b.cancelled_calls
                                .insert(old, errors::barrier_duplicate_call(id, current));
                        }
                    }
                    self.finish_barrier(id, current, Err(e.clone()), true, at);
                    return Err(Box::new(Outcome::err(e)));
                }
            }
        };
        if create {
            self.open_instance(a, counter, at)?;
        }
        Ok(counter)
    }

    /// Opens instance `counter` of the arrival's barrier, the current one
    /// becoming its `previous`. It fails at once when the caller named an
    /// unknown participant or a participant is already in error.
    fn open_instance(&mut self, a: &Arrival<'_>, counter: i64, at: u64) -> Result<(), Ended> {
        let (id, n) = (a.id, self.data.task_count());
        // Every later instance of an id keeps the first instance's task
        // set; only an id that never had one takes the caller's.
        let inherited = self
            .data
            .barriers
            .get(id)
            .filter(|p| !p.participants.is_empty())
            .map(|p| (p.participants.clone(), p.all_tasks));
        let from_args = inherited.is_none();
        let (set, all_tasks) = inherited.unwrap_or_else(|| {
            if a.participants.is_empty() {
                ((0..n).collect(), true)
            } else {
                (sorted_set(a.participants), false)
            }
        });
        let previous = self.data.barriers.remove(id).map(|mut p| {
            p.previous = None;
            Box::new(p)
        });
        let failed_participant = set.iter().copied().find(|&p| {
            !self.task_recoverable(p) && self.data.task_status(p) == Some(TaskStatus::Error)
        });
        self.data.barriers.insert(
            id.to_string(),
            BarrierEntry {
                counter,
                all_tasks,
                participants: set,
                deadline_ms: a.timeout_ms.map_or(0, |t| at.saturating_add(t).max(1)),
                previous,
                initiating_task: a.task,
                ..Default::default()
            },
        );
        let failure = if from_args && !a.unknown_participant.is_empty() {
            Some(errors::barrier_unknown_participant(
                id,
                counter,
                a.unknown_participant,
            ))
        } else {
            failed_participant.map(|p| {
                let existing = self.data.entry(p).error.clone().unwrap_or_default();
                errors::barrier_participant_already_in_error(
                    id,
                    counter,
                    &self.cl.label(p),
                    &existing,
                )
            })
        };
        match failure {
            Some(e) => {
                self.finish_barrier(id, counter, Err(e.clone()), false, at);
                Err(Box::new(Outcome::err(e)))
            }
            None => Ok(()),
        }
    }

    /// Step 2: the caller's arguments must agree with the instance, finished
    /// or not: a disagreeing call fails it for every waiter and replaces a
    /// stored result. A finished instance then replays its result.
    fn validate_arrival(&mut self, a: &Arrival<'_>, counter: i64, at: u64) -> Result<(), Ended> {
        let (id, n) = (a.id, self.data.task_count());
        let b = &self.data.barriers[id];
        // The stored set is sorted and unique within 0..n, so "every task"
        // matches it exactly when it holds n tasks.
        let same_set = if a.participants.is_empty() {
            b.participants.len() == n as usize
        } else {
            sorted_set(a.participants) == b.participants
        };
        let mismatch = if a.participants.is_empty() && b.participants.len() != n as usize {
            Some(errors::barrier_all_vs_subset(id, counter))
        } else if !a.unknown_participant.is_empty() || !same_set {
            Some(errors::barrier_conflicting_tasks(id, counter))
        } else if b.participants.binary_search(&a.task).is_err() {
            Some(errors::barrier_non_participant(
                id,
                counter,
                &self.cl.label(a.task),
            ))
        } else {
            None
        };
        if let Some(e) = mismatch {
            self.finish_barrier(id, counter, Err(e.clone()), true, at);
            return Err(Box::new(Outcome::err(e)));
        }
        match b.status() {
            BarrierStatus::Pending => Ok(()),
            BarrierStatus::Passed => Err(Box::new(super::barrier_counter(counter))),
            BarrierStatus::Failed => {
                Err(Box::new(Outcome::err(b.error.clone().unwrap_or_default())))
            }
        }
    }

    /// Step 3: records the arrival (a second call of the same task
    /// supersedes the first); the last participant passes the instance.
    fn record_arrival(&mut self, a: &Arrival<'_>, counter: i64, at: u64) -> Outcome {
        let (id, task) = (a.id, a.task);
        let call = self.next_call_id();
        let b = self.data.barriers.get_mut(id).expect("instance exists");
        if let Some(old) = b.arrivals.insert(task, call) {
            b.cancelled_calls
                .insert(old, errors::barrier_duplicate_call(id, counter));
        }
        let mut out = super::barrier_counter(counter);
        out.call_id = call;
        if b.arrivals.len() == b.participants.len() {
            self.finish_barrier(id, counter, Ok(()), false, at);
        } else {
            out.parked = true;
        }
        out
    }

    /// Ends instance `counter` of `id` with `result`. Only a pending instance
    /// changes, unless `overwrite` (a counter mismatch overwrites even a stored
    /// result). Runs the special barriers' effects when a pending one ends.
    pub(crate) fn finish_barrier(
        &mut self,
        id: &str,
        counter: i64,
        result: Result<(), DomainError>,
        overwrite: bool,
        at: u64,
    ) {
        let Some(b) = self.data.barriers.get_mut(id) else {
            return;
        };
        if b.counter != counter {
            return;
        }
        let was_pending = b.status() == BarrierStatus::Pending;
        if !was_pending && !overwrite {
            return;
        }
        self.cx.touch(|| Object::Barrier(id.to_string()));
        let b = self.data.barriers.get_mut(id).expect("present");
        match result {
            Ok(()) => {
                b.set_status(BarrierStatus::Passed);
                b.error = None;
            }
            Err(e) => {
                b.set_status(BarrierStatus::Failed);
                b.error = Some(e);
            }
        }
        if was_pending {
            self.on_special_barrier_done(id, at);
        }
    }

    fn on_special_barrier_done(&mut self, id: &str, at: u64) {
        let b = &self.data.barriers[id];
        let passed = b.status() == BarrierStatus::Passed;
        let error = b.error.clone().unwrap_or_default();
        if id == REGISTER_BARRIER {
            if passed {
                for task in 0..self.data.task_count() {
                    if let Some(inc) = self.data.entry(task).pending_incarnation {
                        self.connect_task(task, inc);
                    }
                }
            } else {
                let e = errors::registration_failed(&error);
                self.set_all_tasks_error(&e, at);
            }
        } else if id == shutdown_barrier_id(self.cl.service_incarnation) {
            if passed {
                for task in 0..self.data.task_count() {
                    if self.data.entry(task).status() != TaskStatus::Disconnected {
                        self.disconnect_task(task, at);
                    }
                }
            } else {
                let e = errors::shutdown_barrier_failed(&error);
                self.propagate_error(e.clone(), &[], at);
                self.set_all_tasks_error(&e, at);
            }
        }
    }

    /// A task that errors or disconnects leaves every pending barrier it takes
    /// part in: the barrier fails (non-recoverable), or its call is cancelled
    /// and its arrival forgotten (recoverable).
    pub(crate) fn leave_ongoing_barriers(&mut self, task: u32, reason: &str, at: u64) {
        let label = self.cl.label(task);
        let ongoing: Vec<(String, i64)> = self
            .data
            .barriers
            .iter()
            .filter(|(_, b)| {
                b.status() == BarrierStatus::Pending && b.participants.binary_search(&task).is_ok()
            })
            .map(|(id, b)| (id.clone(), b.counter))
            .collect();
        let recoverable = self.task_recoverable(task);
        for (id, counter) in ongoing {
            if recoverable {
                self.cx.touch(|| Object::Barrier(id.clone()));
                let b = self.data.barriers.get_mut(&id).expect("listed above");
                if let Some(call) = b.arrivals.remove(&task) {
                    let e = errors::barrier_stale_invocation(&id, counter, reason, &label);
                    b.cancelled_calls.insert(call, e);
                }
            } else {
                let e = errors::barrier_failed_because(&id, counter, reason, &label);
                self.finish_barrier(&id, counter, Err(e), false, at);
            }
        }
    }

    pub(crate) fn barrier_cancel(
        &mut self,
        id: &str,
        counter: i64,
        task: u32,
        _at: u64,
    ) -> Outcome {
        if let Err(e) = self.data.check_task(task, UnknownTaskIn::Barrier) {
            return Outcome::err(e);
        }
        let label = self.cl.label(task);
        match self.data.barriers.get(id) {
            None if counter == 0 => {
                self.cx.touch(|| Object::Barrier(id.to_string()));
                let e = errors::barrier_cancelled(id, 0, &label);
                self.data.barriers.insert(
                    id.to_string(),
                    BarrierEntry {
                        status: BarrierStatus::Failed as i32,
                        error: Some(e),
                        created_by_cancel: true,
                        initiating_task: task,
                        ..Default::default()
                    },
                );
                Outcome::ok()
            }
            None => Outcome::err(errors::cancel_not_current(id, counter, 0)),
            Some(b) if b.counter != counter => {
                Outcome::err(errors::cancel_not_current(id, counter, b.counter))
            }
            Some(b) if b.status() != BarrierStatus::Pending => {
                let code = b.error.as_ref().map_or(0, |e| e.code);
                Outcome::err(errors::cancel_already_finished(id, counter, code))
            }
            Some(_) => {
                let e = errors::barrier_cancelled(id, counter, &label);
                self.finish_barrier(id, counter, Err(e), false, _at);
                Outcome::ok()
            }
        }
    }

    pub(crate) fn barrier_expire(&mut self, id: &str, counter: i64, at: u64) -> Outcome {
        let Some(b) = self.data.barriers.get(id) else {
            return Outcome::ok();
        };
        let due = b.counter == counter
            && b.status() == BarrierStatus::Pending
            && b.deadline_ms > 0
            && at >= b.deadline_ms;
        if !due {
            return Outcome::ok();
        }
        let pending: Vec<String> = b
            .participants
            .iter()
            .filter(|p| !b.arrivals.contains_key(p))
            .map(|&p| self.cl.label(p))
            .collect();
        let e = errors::barrier_timed_out(
            id,
            counter,
            b.arrivals.len(),
            b.participants.len(),
            &self.cl.label(b.initiating_task),
            &pending,
        );
        self.finish_barrier(id, counter, Err(e), false, at);
        Outcome::ok()
    }
}

impl<'a> Reader<'a> {
    /// The answer of a parked barrier call (`call_id` from its outcome):
    /// `Ok(counter)`, the error, or `None` while the instance is pending.
    pub(crate) fn barrier_result(
        &self,
        id: &str,
        counter: i64,
        call_id: u64,
    ) -> Option<Result<i64, DomainError>> {
        let Some(cur) = self.data.barriers.get(id) else {
            return Some(Err(errors::epoch_reset()));
        };
        let inst = if cur.counter == counter {
            cur
        } else {
            match cur.previous.as_deref() {
                Some(p) if p.counter == counter => p,
                _ => return Some(Err(errors::barrier_instance_gone(id, counter))),
            }
        };
        if let Some(e) = inst.cancelled_calls.get(&call_id) {
            return Some(Err(e.clone()));
        }
        match inst.status() {
            BarrierStatus::Pending => None,
            BarrierStatus::Passed => Some(Ok(inst.counter)),
            BarrierStatus::Failed => Some(Err(inst.error.clone().unwrap_or_default())),
        }
    }

    /// Deadlines of every pending barrier instance, for the leader's timers.
    pub fn pending_barrier_deadlines(&self) -> Vec<BarrierDeadline> {
        self.data
            .barriers
            .iter()
            .filter(|(_, b)| b.status() == BarrierStatus::Pending && b.deadline_ms > 0)
            .map(|(id, b)| BarrierDeadline {
                id: id.clone(),
                counter: b.counter,
                deadline_ms: b.deadline_ms,
            })
            .collect()
    }

    /// The stored entry of a barrier id (its newest instance).
    pub fn barrier(&self, id: &str) -> Option<&'a BarrierEntry> {
        self.data.barriers.get(id)
    }

    /// Every barrier id with its newest instance.
    pub fn barriers(&self) -> impl Iterator<Item = (&'a String, &'a BarrierEntry)> + 'a {
        self.data.barriers.iter()
    }
}
