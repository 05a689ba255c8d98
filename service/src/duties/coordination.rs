//! The coordination duty: task liveness and barrier deadlines, and pushing
//! propagated errors to TensorFlow tasks ([`super::push`]). Heartbeat
//! last-seen times are reset to "now" on takeover (a new leader never
//! declares everyone dead); barrier deadlines come from the absolute
//! deadline stored in the replicated state. When a timer fires the leader
//! proposes an update (tasks unhealthy, barrier expired) and the state
//! machine decides.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use journal::pb::coordination::{BarrierExpire, Heartbeat, TasksUnhealthy};
use journal::{coordination::HeartbeatCheck, DomainError, Update};

use super::push::ErrorPusher;
use super::{Duty, DutyFuture};
use crate::core::{now_ms, LocalLeader, Retry};

/// Liveness bookkeeping of the leader, and its error pushes.
#[derive(Default)]
pub struct CoordinationDuty {
    last_seen: Mutex<HashMap<u32, Instant>>,
    pusher: ErrorPusher,
}

impl CoordinationDuty {
    /// A duty that pushes propagated errors to the TensorFlow tasks at
    /// `tf_addresses` (job name → addresses by task id; empty: no pushes).
    pub fn new(tf_addresses: BTreeMap<String, Vec<String>>) -> Self {
        CoordinationDuty {
            last_seen: Mutex::default(),
            pusher: ErrorPusher::new(tf_addresses),
        }
    }

    fn seen(&self) -> std::sync::MutexGuard<'_, HashMap<u32, Instant>> {
        self.last_seen.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records that `task` is alive now (heartbeat or registration).
    pub fn touch(&self, task: u32) {
        self.seen().insert(task, Instant::now());
    }

    /// Handles a heartbeat on the leader: checks it against the state and
    /// records it, or proposes the update an incarnation mismatch needs. A
    /// leader that has not heard from a quorum within the local answer
    /// window (cut off from the majority) answers nothing: the caller waits
    /// for a leader that can.
    pub async fn heartbeat(
        &self,
        leader: &LocalLeader,
        task: u32,
        incarnation: u64,
    ) -> Result<Result<(), DomainError>, Retry> {
        if !leader.leader_heard_recently() {
            return Err(Retry(
                "this leader has not heard from a quorum recently".into(),
            ));
        }
        let check = || {
            leader.node().state().read(|s| {
                s.coordination()
                    .heartbeat_check(task, incarnation, now_ms())
            })
        };
        let mut verdict = check();
        if matches!(
            verdict,
            HeartbeatCheck::Reject(_) | HeartbeatCheck::Mismatch(_)
        ) {
            // A new leader may not have applied a just-committed registration
            // yet: confirm on an up-to-date state before refusing.
            if leader.read_barrier().await.is_ok() {
                verdict = check();
            }
        }
        Ok(match verdict {
            HeartbeatCheck::Accept => {
                self.touch(task);
                Ok(())
            }
            HeartbeatCheck::Ignore => Ok(()),
            HeartbeatCheck::Reject(e) => Err(e),
            HeartbeatCheck::Mismatch(e) => {
                let update = Update::from(Heartbeat { task, incarnation });
                match super::propose(self.name(), leader, &update).await {
                    Some(outcome) => outcome.error.map_or(Ok(()), Err),
                    None => Err(e),
                }
            }
        })
    }

    async fn fire_timers(&self, leader: &LocalLeader) {
        let (connected, timeout_ms, deadlines) = leader.node().state().read(|s| {
            (
                s.coordination().connected_tasks(),
                s.config().map_or(0, |c| c.heartbeat_timeout_ms),
                s.coordination().pending_barrier_deadlines(),
            )
        });
        let now = Instant::now();
        let stale: Vec<u32> = {
            let mut seen = self.seen();
            seen.retain(|t, _| connected.iter().any(|(c, _)| c == t));
            connected
                .iter()
                .filter_map(|&(task, _)| {
                    let last = *seen.entry(task).or_insert(now);
                    (timeout_ms > 0 && now.duration_since(last) > Duration::from_millis(timeout_ms))
                        .then_some(task)
                })
                .collect()
        };
        if !stale.is_empty() {
            tracing::warn!(?stale, "tasks stopped sending heartbeats");
            let update = Update::from(TasksUnhealthy { tasks: stale });
            super::propose(self.name(), leader, &update).await;
        }
        let now_ms = now_ms();
        for d in deadlines.into_iter().filter(|d| d.deadline_ms <= now_ms) {
            let update = Update::from(BarrierExpire {
                id: d.id,
                counter: d.counter,
            });
            super::propose(self.name(), leader, &update).await;
        }
    }
}

impl Duty for CoordinationDuty {
    fn name(&self) -> &'static str {
        "coordination"
    }

    /// Everyone connected counts as seen now; standing error notices are
    /// pushed again.
    fn on_takeover<'a>(&'a self, leader: &'a LocalLeader) -> DutyFuture<'a> {
        Box::pin(async move {
            let now = Instant::now();
            let connected = leader
                .node()
                .state()
                .read(|s| s.coordination().connected_tasks());
            let mut seen = self.seen();
            seen.clear();
            for (task, _) in connected {
                seen.insert(task, now);
            }
            drop(seen);
            self.pusher.reset();
        })
    }

    fn tick<'a>(&'a self, leader: &'a LocalLeader) -> DutyFuture<'a> {
        Box::pin(async move {
            self.fire_timers(leader).await;
            leader
                .node()
                .state()
                .read(|s| self.pusher.push_new_notices(s));
        })
    }

    fn on_step_down(&self) {
        self.seen().clear();
        self.pusher.reset();
    }
}
