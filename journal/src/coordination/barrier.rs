//! Barriers (reference §3.8): instances identified by (id, counter), the
//! participant checks, first-caller deadlines, cancel, replay of a finished
//! result, failure when a participant errors or disconnects, and the special
//! registration, shutdown and WaitForAllTasks barriers.

use super::errors::{self, UnknownTaskIn};
use super::{Reader, Writer};
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

/// Sorted, de-duplicated task indices.
pub(crate) fn sorted_set(tasks: &[u32]) -> Vec<u32> {
    let mut v = tasks.to_vec();
    v.sort_unstable();
    v.dedup();
    v
}

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
            &a.id,
            a.counter,
            Some(a.timeout_ms),
            &participants,
            &unknown,
            a.task,
            a.recoverable,
            at,
        )
    }

    /// One task arrives at instance `counter` of barrier `id`. `participants`
    /// empty means every task; `timeout_ms` None means no deadline. Returns the
    /// result if the barrier finished (now or earlier), else parked with the
    /// call id to wait on through [`State::barrier_result`]. Either way the
    /// outcome's `value` is the **effective** instance counter (a recoverable
    /// caller's counter 0 becomes the instance it joined or opened).
    ///
    /// The order of the checks is XLA's (`BarrierAsyncLocked`, reference
    /// §3.8): (1) open a new instance if the rules say so; (2) counter
    /// mismatch; (3) argument checks, against a finished instance too;
    /// (4) finished instance and same counter: replay; (5) arrive.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn arrive(
        &mut self,
        id: &str,
        counter: i64,
        timeout_ms: Option<u64>,
        participants: &[u32],
        unknown_participant: &str,
        task: u32,
        caller_recoverable: bool,
        at: u64,
    ) -> Outcome {
        let n = self.data.task_count();
        // The counter-0 rule is the caller's: the service's flag, or the
        // task's own (TensorFlow sends it with every call).
        let recoverable = self.cl.recoverable() || caller_recoverable;
        // The registration, shutdown and device barriers are exempt from the
        // recoverable counter-0 rule (XLA and TSL exclude them by id).
        let special = id == REGISTER_BARRIER
            || id == shutdown_barrier_id(self.cl.service_incarnation)
            || id == wait_all_barrier_id(self.cl.service_incarnation);

        // 1. Which instance: a new one, the current one, or a mismatch.
        let (create, counter) = match self.data.barriers.get(id) {
            None if counter == 0 => (true, 0),
            None => {
                // Upstream: the uninitialised instance (counter 0, nobody
                // listed) fails, and stays failed with an empty task set.
                let e = errors::barrier_counter_mismatch(id, counter, 0);
                self.data.barriers.insert(
                    id.to_string(),
                    BarrierEntry {
                        status: BarrierStatus::Failed as i32,
                        error: Some(e.clone()),
                        initiating_task: task,
                        ..Default::default()
                    },
                );
                return Outcome::err(e);
            }
            Some(b) => {
                let finished = b.status() != BarrierStatus::Pending;
                if finished && counter == b.counter + 1 {
                    (true, counter)
                } else if finished && recoverable && counter == 0 && !special {
                    // A restarted recoverable task (its agent forgot its
                    // counters) opens the next instance and waits there.
                    (true, b.counter + 1)
                } else if counter == b.counter || (recoverable && counter == 0) {
                    // The current instance (a recoverable counter 0 joins a
                    // pending one whatever its counter).
                    (false, b.counter)
                } else {
                    let e = errors::barrier_counter_mismatch(id, counter, b.counter);
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
                    return Outcome::err(e);
                }
            }
        };

        if create {
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
                if participants.is_empty() {
                    ((0..n).collect(), true)
                } else {
                    (sorted_set(participants), false)
                }
            });
            let previous = self.data.barriers.remove(id).map(|mut p| {
                p.previous = None;
                Box::new(p)
            });
            self.data.barriers.insert(
                id.to_string(),
                BarrierEntry {
                    counter,
                    all_tasks,
                    participants: set.clone(),
                    deadline_ms: timeout_ms.map_or(0, |t| at.saturating_add(t).max(1)),
                    previous,
                    initiating_task: task,
                    ..Default::default()
                },
            );
            if from_args && !unknown_participant.is_empty() {
                let e = errors::barrier_unknown_participant(id, counter, unknown_participant);
                self.finish_barrier(id, counter, Err(e.clone()), false, at);
                return Outcome::err(e);
            }
            {
                for &p in &set {
                    if !self.task_recoverable(p)
                        && self.data.task_status(p) == Some(TaskStatus::Error)
                    {
                        let existing = self.data.entry(p).error.clone().unwrap_or_default();
                        let e = errors::barrier_participant_already_in_error(
                            id,
                            counter,
                            &self.cl.label(p),
                            &existing,
                        );
                        self.finish_barrier(id, counter, Err(e.clone()), false, at);
                        return Outcome::err(e);
                    }
                }
            }
        }

        // 2. The caller's arguments must agree with the instance, finished or
        // not: a disagreeing call fails it for every waiter and replaces a
        // stored result.
        let b = &self.data.barriers[id];
        let mine = if participants.is_empty() {
            (0..n).collect::<Vec<_>>()
        } else {
            sorted_set(participants)
        };
        let mismatch = if participants.is_empty() && b.participants.len() != n as usize {
            Some(errors::barrier_all_vs_subset(id, counter))
        } else if !unknown_participant.is_empty() || mine != b.participants {
            Some(errors::barrier_conflicting_tasks(id, counter))
        } else if b.participants.binary_search(&task).is_err() {
            Some(errors::barrier_non_participant(
                id,
                counter,
                &self.cl.label(task),
            ))
        } else {
            None
        };
        if let Some(e) = mismatch {
            self.finish_barrier(id, counter, Err(e.clone()), true, at);
            return Outcome::err(e);
        }

        // 3. A finished instance replays its result.
        match b.status() {
            BarrierStatus::Pending => {}
            BarrierStatus::Passed => return super::barrier_counter(counter),
            BarrierStatus::Failed => return Outcome::err(b.error.clone().unwrap_or_default()),
        }

        // 4. Record the arrival; a second call of the same task supersedes the first.
        let call = self.next_call_id();
        let b = self.data.barriers.get_mut(id).expect("instance exists");
        if let Some(old) = b.arrivals.insert(task, call) {
            b.cancelled_calls
                .insert(old, errors::barrier_duplicate_call(id, counter));
        }
        if b.arrivals.len() == b.participants.len() {
            self.finish_barrier(id, counter, Ok(()), false, at);
            let mut out = super::barrier_counter(counter);
            out.call_id = call;
            return out;
        }
        let mut out = super::barrier_counter(counter);
        out.parked = true;
        out.call_id = call;
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
    pub fn barrier_result(
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
