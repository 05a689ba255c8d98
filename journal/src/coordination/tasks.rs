//! Task lifecycle (`docs/protocols.md`: Registration and incarnations,
//! Heartbeats, Error propagation, Shutdown): registration and incarnations,
//! heartbeats, error reporting and propagation, PollForError, shutdown, reset
//! and the TensorFlow dialect's WaitForAllTasks.

use bytes::Bytes;

use super::barrier::{shutdown_barrier_id, wait_all_barrier_id, Arrival, REGISTER_BARRIER};
use super::errors::{self, UnknownTaskIn};
use super::{Reader, Writer};
use crate::pb::coordination::{ReportError, TaskStatus};
use crate::pb::{Code, DomainError, Outcome};

/// Timeout of the WaitForAllTasks device-propagation barrier (upstream: 1 h).
pub const WAIT_FOR_ALL_TASKS_TIMEOUT_MS: u64 = 3_600_000;

/// What a heartbeat would do, decided from the state alone (the leader checks
/// this without proposing; only [`HeartbeatCheck::Mismatch`] needs an update).
#[derive(Clone, Debug, PartialEq)]
pub enum HeartbeatCheck {
    /// Record the heartbeat.
    Accept,
    /// Answer OK but do not record it (recoverable task, other incarnation).
    Ignore,
    /// Answer with this error; nothing changes.
    Reject(DomainError),
    /// Incarnation mismatch of a non-recoverable task: propose a `Heartbeat`
    /// update, which sets the task to ERROR and propagates the error.
    Mismatch(DomainError),
}

impl Writer<'_, '_> {
    // ------------------------------------------------------ registration ----

    pub(crate) fn register_task(
        &mut self,
        task: u32,
        incarnation: u64,
        declared_recoverable: bool,
        at: u64,
    ) -> Outcome {
        if let Err(e) = self.data.check_task(task, UnknownTaskIn::Register) {
            return Outcome::err(e);
        }
        let label = self.cl.label(task);
        // Upstream records the task's own flag on every registration, before
        // looking at its state.
        self.task_mut(task).recoverable = declared_recoverable;
        let recoverable = self.task_recoverable(task);
        let t = self.data.entry(task).clone();
        match t.status() {
            TaskStatus::Error => {
                let existing = t.error.clone().unwrap_or_default();
                let may_return = recoverable
                    && existing.status() == Code::Unavailable
                    && existing.coordination_payload;
                if !may_return {
                    let e =
                        errors::register_while_in_error(&label, &existing).with_source_task(task);
                    self.set_task_error(task, e.clone(), at);
                    self.propagate_error(e.clone(), &[task], at);
                    return Outcome::err(e);
                }
                // A recoverable task whose heartbeats timed out comes back.
                self.register_disconnected(task, incarnation, at)
            }
            TaskStatus::Connected => {
                if t.incarnation == incarnation {
                    return super::registered(self.cl.service_incarnation);
                }
                if recoverable {
                    self.leave_ongoing_barriers(task, errors::LEAVE_REASON_RECONNECTED, at);
                    self.cx.task_lost(task);
                    self.task_mut(task).incarnation = incarnation;
                    self.task_mut(task).notice = None;
                    self.bump_tasks_version();
                    return super::registered(self.cl.service_incarnation);
                }
                let e = errors::different_incarnation(&label).with_source_task(task);
                self.set_task_error(task, e.clone(), at);
                self.propagate_error(e.clone(), &[task], at);
                Outcome::err(e)
            }
            TaskStatus::Disconnected => self.register_disconnected(task, incarnation, at),
        }
    }

    fn register_disconnected(&mut self, task: u32, incarnation: u64, at: u64) -> Outcome {
        let cfg = self.cl.cfg();
        let barrier_open = cfg.register_with_barrier
            && self
                .data
                .barriers
                .get(REGISTER_BARRIER)
                .is_none_or(|b| b.status() == crate::pb::coordination::BarrierStatus::Pending);
        if !barrier_open {
            self.connect_task(task, incarnation);
            return super::registered(self.cl.service_incarnation);
        }
        if self.data.entry(task).pending_incarnation == Some(incarnation) {
            // The same registration again (a retry): keep waiting.
            return Outcome::parked(0);
        }
        // A newer registration supersedes a pending older one (which then
        // answers ALREADY_EXISTS through `registration_result`).
        self.task_mut(task).pending_incarnation = Some(incarnation);
        let timeout = (cfg.register_timeout_ms > 0).then_some(cfg.register_timeout_ms);
        let arrival = Arrival {
            timeout_ms: timeout,
            ..Arrival::new(REGISTER_BARRIER, 0, task)
        };
        let out = self.arrive(&arrival, at);
        if out.is_err() {
            return out;
        }
        match self.r().registration_result(task, incarnation) {
            Some(Ok(inc)) => super::registered(inc),
            Some(Err(e)) => Outcome::err(e),
            None => Outcome::parked(out.call_id),
        }
    }

    pub(crate) fn connect_task(&mut self, task: u32, incarnation: u64) {
        let t = self.task_mut(task);
        t.set_status(TaskStatus::Connected);
        t.incarnation = incarnation;
        t.pending_incarnation = None;
        t.error = None;
        t.notice = None;
        self.bump_tasks_version();
        self.reevaluate_alive_rounds();
    }

    // -------------------------------------------------------- heartbeats ----

    pub(crate) fn heartbeat(&mut self, task: u32, incarnation: u64, at: u64) -> Outcome {
        match self.r().heartbeat_check(task, incarnation, at) {
            HeartbeatCheck::Accept | HeartbeatCheck::Ignore => Outcome::ok(),
            HeartbeatCheck::Reject(e) => Outcome::err(e),
            HeartbeatCheck::Mismatch(e) => {
                self.set_task_error(task, e.clone(), at);
                self.propagate_error(e.clone(), &[task], at);
                Outcome::err(e)
            }
        }
    }

    pub(crate) fn tasks_unhealthy(&mut self, tasks: &[u32], at: u64) -> Outcome {
        let mut stale = Vec::new();
        let mut sources = Vec::new();
        for &task in tasks {
            if self.data.task_status(task) != Some(TaskStatus::Connected) {
                continue;
            }
            let label = self.cl.label(task);
            self.set_task_error(task, errors::heartbeat_timeout(&label), at);
            stale.push(label);
            sources.push(task);
        }
        if !stale.is_empty() {
            self.propagate_error(errors::unhealthy_tasks(&stale), &sources, at);
        }
        Outcome::ok()
    }

    // ---------------------------------------------------- errors and polls ----

    pub(crate) fn report_error(&mut self, c: &ReportError, at: u64) -> Outcome {
        if let Err(e) = self.data.check_task(c.task, UnknownTaskIn::ReportError) {
            return Outcome::err(e);
        }
        if self.data.entry(c.task).status() != TaskStatus::Connected {
            return Outcome::err(errors::report_not_connected());
        }
        let mut e = errors::with_payload(c.code(), c.message.clone()).with_source_task(c.task);
        e.is_reported_error = true;
        self.set_task_error(c.task, e.clone(), at);
        self.propagate_error(e, &[c.task], at);
        Outcome::ok()
    }

    /// Sets a task to ERROR (a task already in ERROR keeps its first error),
    /// fails the barriers it takes part in and re-evaluates rendezvous.
    pub(crate) fn set_task_error(&mut self, task: u32, e: DomainError, at: u64) {
        if self.data.entry(task).status() == TaskStatus::Error {
            return;
        }
        let reason = errors::leave_reason_error(&e);
        let t = self.task_mut(task);
        t.set_status(TaskStatus::Error);
        t.error = Some(e);
        // `pending_incarnation` stays: a registration waiting at a barrier
        // that now fails must still find its answer (the barrier's error).
        self.cx.task_lost(task);
        self.bump_tasks_version();
        self.leave_ongoing_barriers(task, &reason, at);
        self.reevaluate_alive_rounds();
    }

    pub(crate) fn set_all_tasks_error(&mut self, e: &DomainError, at: u64) {
        for task in 0..self.data.task_count() {
            self.set_task_error(task, e.clone(), at);
        }
    }

    /// Error propagation (`docs/protocols.md`, Error propagation): skipped in
    /// recoverable mode and when every source task is recoverable. Delivered
    /// once to every pending PollForError and remembered for later polls.
    /// Then, with `notify_tasks` (TensorFlow's service), every other
    /// CONNECTED task gets a notice and stays CONNECTED; without it (XLA's),
    /// if nobody ever polled every task is set to ERROR.
    pub(crate) fn propagate_error(&mut self, e: DomainError, sources: &[u32], at: u64) {
        if self.cl.recoverable() {
            return;
        }
        if !sources.is_empty() && sources.iter().all(|&t| self.task_recoverable(t)) {
            return;
        }
        if self.cl.notify_tasks() {
            for i in 0..self.data.task_count() {
                let t = self.data.entry(i);
                let polled = t.poll_id != 0 && t.poll_result.is_none();
                let noticed = t.status() == TaskStatus::Connected && t.notice.is_none();
                if !polled && !noticed {
                    continue;
                }
                let t = self.task_mut(i);
                if polled {
                    t.poll_result = Some(e.clone());
                }
                if noticed {
                    t.notice = Some(e.clone());
                }
            }
            if self.data.propagated_error.is_none() {
                self.data.propagated_error = Some(e);
            }
            return;
        }
        if !self.data.any_polled {
            let unheard = errors::unable_to_inform(&e);
            self.set_all_tasks_error(&unheard, at);
            return;
        }
        if self.data.propagated_error.is_some() {
            return;
        }
        for i in 0..self.data.task_count() {
            let t = self.data.entry(i);
            if t.poll_id != 0 && t.poll_result.is_none() {
                self.task_mut(i).poll_result = Some(e.clone());
            }
        }
        self.data.propagated_error = Some(e);
    }

    pub(crate) fn poll_for_error(&mut self, task: u32, at: u64) -> Outcome {
        self.data.any_polled = true;
        if let Err(e) = self.data.check_task(task, UnknownTaskIn::PollForError) {
            return Outcome::err(e);
        }
        let label = self.cl.label(task);
        let t = self.data.entry(task);
        if t.status() == TaskStatus::Disconnected && self.r().beyond_grace(task, at) {
            return Outcome::err(errors::poll_not_registered(&label));
        }
        if t.status() == TaskStatus::Error {
            let existing = t.error.clone().unwrap_or_default();
            return Outcome::err(errors::poll_task_in_error(&label, &existing));
        }
        if let Some(e) = &self.data.propagated_error {
            return Outcome::err(e.clone());
        }
        let call = self.next_call_id();
        let t = self.task_mut(task);
        t.poll_id = call;
        t.poll_result = None;
        Outcome::parked(call)
    }

    // ---------------------------------------------------------- shutdown ----

    /// Disconnects a task: cancels its poll, makes it leave its barriers.
    pub(crate) fn disconnect_task(&mut self, task: u32, at: u64) {
        let t = self.task_mut(task);
        t.set_status(TaskStatus::Disconnected);
        t.disconnected_at_ms = at.max(1);
        t.error = None;
        t.notice = None;
        t.pending_incarnation = None;
        if t.poll_id != 0 && t.poll_result.is_none() {
            t.poll_result = Some(errors::poll_cancelled("task has disconnected."));
        }
        self.cx.task_lost(task);
        self.bump_tasks_version();
        self.leave_ongoing_barriers(task, errors::LEAVE_REASON_DISCONNECTED, at);
        self.reevaluate_alive_rounds();
    }

    pub(crate) fn shutdown_task(
        &mut self,
        task: u32,
        declared_recoverable: bool,
        at: u64,
    ) -> Outcome {
        if let Err(e) = self.data.check_task(task, UnknownTaskIn::Disconnect) {
            return Outcome::err(e);
        }
        let label = self.cl.label(task);
        // A task that declares itself recoverable leaves alone (upstream reads
        // the flag from the ShutdownTask request).
        if !self.r().uses_shutdown_barrier() || declared_recoverable {
            if self.data.entry(task).status() == TaskStatus::Disconnected {
                return Outcome::err(errors::already_disconnected(&label));
            }
            self.disconnect_task(task, at);
            return Outcome::ok();
        }
        let id = shutdown_barrier_id(self.cl.service_incarnation);
        if let Some(b) = self.data.barriers.get(&id) {
            match b.status() {
                crate::pb::coordination::BarrierStatus::Pending => {}
                crate::pb::coordination::BarrierStatus::Passed => {
                    // Replay: a task that registered again disconnects now.
                    if self.data.entry(task).status() == TaskStatus::Disconnected {
                        let e = errors::already_disconnected(&label);
                        return Outcome::err(errors::shutdown_barrier_failed(&e));
                    }
                    self.disconnect_task(task, at);
                    return Outcome::ok();
                }
                crate::pb::coordination::BarrierStatus::Failed => {
                    let e = b.error.clone().unwrap_or_default();
                    return Outcome::err(errors::shutdown_barrier_failed(&e));
                }
            }
        }
        let timeout = self.cl.cfg().shutdown_timeout_ms;
        let participants = self.r().shutdown_participants(&id);
        let arrival = Arrival {
            timeout_ms: Some(timeout),
            participants: &participants,
            ..Arrival::new(&id, 0, task)
        };
        let mut out = self.arrive(&arrival, at);
        if let Some(e) = out.error.take() {
            out.error = Some(errors::shutdown_barrier_failed(&e));
        }
        out
    }

    pub(crate) fn reset_task(&mut self, task: u32, at: u64) -> Outcome {
        if let Err(e) = self.data.check_task(task, UnknownTaskIn::Disconnect) {
            return Outcome::err(e);
        }
        if self.data.entry(task).status() == TaskStatus::Disconnected {
            return Outcome::err(errors::already_disconnected(&self.cl.label(task)));
        }
        self.disconnect_task(task, at);
        Outcome::ok()
    }

    // ------------------------------------------------- WaitForAllTasks (tf) ----

    pub(crate) fn wait_for_all_tasks(&mut self, task: u32, info: &Bytes, at: u64) -> Outcome {
        if let Err(e) = self.data.check_task(task, UnknownTaskIn::WaitForAllTasks) {
            return Outcome::err(e);
        }
        // Upstream keeps the device info of a task's first call that lists
        // any (empty `info`: none listed).
        let t = self.task_mut(task);
        if t.device_info.is_none() && !info.is_empty() {
            t.device_info = Some(info.clone());
        }
        let id = wait_all_barrier_id(self.cl.service_incarnation);
        let arrival = Arrival {
            timeout_ms: Some(WAIT_FOR_ALL_TASKS_TIMEOUT_MS),
            ..Arrival::new(&id, 0, task)
        };
        self.arrive(&arrival, at)
    }
}

impl<'a> Reader<'a> {
    fn heartbeat_timeout_ms(&self) -> u64 {
        self.cl.config.map_or(0, |c| c.heartbeat_timeout_ms)
    }

    /// A DISCONNECTED task is "beyond the grace period" once one heartbeat
    /// timeout has passed since it disconnected (or if it never connected).
    pub(crate) fn beyond_grace(&self, task: u32, now_ms: u64) -> bool {
        let t = self.data.entry(task);
        t.disconnected_at_ms == 0
            || now_ms
                >= t.disconnected_at_ms
                    .saturating_add(self.heartbeat_timeout_ms())
    }

    /// The answer of a parked RegisterTask of `task` with `incarnation`, or
    /// `None` while it must keep waiting.
    pub(crate) fn registration_result(
        &self,
        task: u32,
        incarnation: u64,
    ) -> Option<Result<u64, DomainError>> {
        let t = self.task(task)?;
        if t.status() == TaskStatus::Connected && t.incarnation == incarnation {
            return Some(Ok(self.cl.service_incarnation));
        }
        if t.pending_incarnation == Some(incarnation) {
            return match self.data.barriers.get(REGISTER_BARRIER) {
                Some(b) if b.status() == crate::pb::coordination::BarrierStatus::Failed => {
                    Some(Err(b.error.clone().unwrap_or_default()))
                }
                Some(b) if b.status() == crate::pb::coordination::BarrierStatus::Pending => None,
                _ => Some(Err(errors::newer_incarnation_connecting())),
            };
        }
        Some(Err(errors::newer_incarnation_connecting()))
    }

    /// Decides a heartbeat of `task` with `incarnation` at `now_ms`.
    pub fn heartbeat_check(&self, task: u32, incarnation: u64, now_ms: u64) -> HeartbeatCheck {
        if let Err(e) = self.data.check_task(task, UnknownTaskIn::Heartbeat) {
            return HeartbeatCheck::Reject(e);
        }
        let label = self.cl.label(task);
        let t = self.data.entry(task);
        match t.status() {
            TaskStatus::Error => {
                return HeartbeatCheck::Reject(errors::heartbeat_task_in_error(
                    &label,
                    t.error.as_ref().unwrap_or(&DomainError::default()),
                ))
            }
            TaskStatus::Disconnected if self.beyond_grace(task, now_ms) => {
                return HeartbeatCheck::Reject(errors::heartbeat_not_registered(&label))
            }
            _ => {}
        }
        if t.incarnation == incarnation {
            match &t.notice {
                // An error propagated to this task (notify_tasks): its
                // heartbeat carries it; the task stays CONNECTED.
                Some(e) if t.status() == TaskStatus::Connected => HeartbeatCheck::Reject(e.clone()),
                _ => HeartbeatCheck::Accept,
            }
        } else if self.task_recoverable(task) {
            HeartbeatCheck::Ignore
        } else {
            HeartbeatCheck::Mismatch(errors::heartbeat_incarnation_mismatch(
                &label,
                t.incarnation,
                incarnation,
            ))
        }
    }

    /// The answer of a parked PollForError (`poll_id` from its outcome), or
    /// `None` while it keeps waiting. A poll only ever ends with an error.
    pub(crate) fn poll_result(&self, task: u32, poll_id: u64) -> Option<DomainError> {
        let Some(t) = self.task(task) else {
            return Some(errors::epoch_reset());
        };
        if t.poll_id != poll_id {
            return Some(errors::poll_cancelled("new request from the same task"));
        }
        t.poll_result.clone()
    }

    fn uses_shutdown_barrier(&self) -> bool {
        let cfg = self.cl.cfg();
        !cfg.recoverable && cfg.shutdown_timeout_ms > 0
    }

    /// The shutdown barrier's participants: every task not declared
    /// recoverable, fixed by the barrier's first caller (empty = all tasks).
    fn shutdown_participants(&self, id: &str) -> Vec<u32> {
        if let Some(b) = self.data.barriers.get(id) {
            return if b.all_tasks {
                Vec::new()
            } else {
                b.participants.clone()
            };
        }
        let n = self.data.task_count();
        let set: Vec<u32> = (0..n)
            .filter(|&i| !self.data.entry(i).recoverable)
            .collect();
        if set.len() == n as usize {
            Vec::new()
        } else {
            set
        }
    }

    /// The answer of a parked ShutdownTask (`call_id` from its outcome).
    pub(crate) fn shutdown_result(&self, call_id: u64) -> Option<Result<(), DomainError>> {
        let id = shutdown_barrier_id(self.cl.service_incarnation);
        self.barrier_result(&id, 0, call_id).map(|r| {
            r.map(|_| ())
                .map_err(|e| errors::shutdown_barrier_failed(&e))
        })
    }

    /// The answer of a parked WaitForAllTasks (`call_id` from its outcome).
    pub(crate) fn wait_for_all_result(&self, call_id: u64) -> Option<Result<(), DomainError>> {
        let id = wait_all_barrier_id(self.cl.service_incarnation);
        self.barrier_result(&id, 0, call_id).map(|r| r.map(|_| ()))
    }

    /// Device info of every task that sent some, ordered by job name, then
    /// task id (the upstream aggregation order).
    pub fn cluster_device_info(&self) -> Vec<Bytes> {
        let mut infos: Vec<(&str, i32, Bytes)> = (0..self.data.task_count())
            .filter_map(|i| {
                let info = self.data.entry(i).device_info.clone()?;
                let (job, id) = self.cl.task_id(i)?;
                Some((job, id, info))
            })
            .collect();
        infos.sort_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
        infos.into_iter().map(|(_, _, info)| info).collect()
    }

    /// Tasks CONNECTED right now with their incarnations (liveness tracking).
    pub fn connected_tasks(&self) -> Vec<(u32, u64)> {
        (0..self.data.task_count())
            .filter(|&i| self.data.entry(i).status() == TaskStatus::Connected)
            .map(|i| (i, self.data.entry(i).incarnation))
            .collect()
    }
}
