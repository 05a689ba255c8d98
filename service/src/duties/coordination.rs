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
use crate::core::{now_ms, CallResult, LocalLeader, Retry};

/// A task of a namespace (its key: "" for the default one).
type NsTask = (String, u32);

/// Liveness bookkeeping of the leader, and its error pushes.
#[derive(Default)]
pub struct CoordinationDuty {
    last_seen: Mutex<HashMap<NsTask, Instant>>,
    /// When the leader last looked for tasks whose heartbeats stopped.
    last_scan: Mutex<Option<Instant>>,
    pusher: ErrorPusher,
}

/// How often the leader looks for tasks whose heartbeats stopped, given
/// the shortest heartbeat timeout of any namespace: a twentieth of it,
/// from one tick to a second. A look reads every connected task, so a job
/// of 16,384 tasks with jax's 100 s timeout is looked at once a second,
/// not ten times (a task is declared dead at most 5% of its timeout late).
fn liveness_every(min_timeout_ms: u64) -> Duration {
    Duration::from_millis(min_timeout_ms / 20).clamp(super::TICK, Duration::from_secs(1))
}

impl CoordinationDuty {
    /// A duty that pushes propagated errors to the TensorFlow tasks of the
    /// default namespace at `tf_addresses` (job name → addresses by task
    /// id; empty: no pushes); other namespaces name theirs in their spec.
    pub fn new(tf_addresses: BTreeMap<String, Vec<String>>) -> Self {
        CoordinationDuty {
            last_seen: Mutex::default(),
            last_scan: Mutex::default(),
            pusher: ErrorPusher::new(tf_addresses),
        }
    }

    fn seen(&self) -> std::sync::MutexGuard<'_, HashMap<NsTask, Instant>> {
        self.last_seen.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records that `task` of namespace `ns` is alive now (heartbeat or
    /// registration).
    pub fn touch(&self, ns: &str, task: u32) {
        self.seen().insert((ns.to_string(), task), Instant::now());
    }

    /// Handles a heartbeat on the leader: checks it against the state and
    /// records it, or proposes the update an incarnation mismatch needs. A
    /// leader that has not heard from a quorum within the local answer
    /// window (cut off from the majority) answers nothing: the caller waits
    /// for a leader that can. A heartbeat never becomes a log entry unless
    /// the state must change.
    pub async fn heartbeat(
        &self,
        leader: &LocalLeader,
        ns: &str,
        task: u32,
        incarnation: u64,
    ) -> CallResult<()> {
        if !leader.leader_heard_recently() {
            return Err(Retry("this leader has not heard from a quorum recently".into()).into());
        }
        let check = || {
            leader.node().state().read(|s| match s.namespace(ns) {
                Some(n) => n
                    .coordination()
                    .heartbeat_check(task, incarnation, now_ms()),
                None => HeartbeatCheck::Reject(journal::namespace::deleted(ns, true)),
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
        let answer: Result<(), DomainError> = match verdict {
            HeartbeatCheck::Accept => {
                self.touch(ns, task);
                Ok(())
            }
            HeartbeatCheck::Ignore => Ok(()),
            HeartbeatCheck::Reject(e) => Err(e),
            HeartbeatCheck::Mismatch(e) => {
                let update = in_namespace(ns, Heartbeat { task, incarnation });
                match super::propose(self.name(), leader, &update).await {
                    Some(outcome) => outcome.error.map_or(Ok(()), Err),
                    None => Err(e),
                }
            }
        };
        Ok(answer?)
    }

    /// Whether the leader looks for tasks whose heartbeats stopped now
    /// (see [`liveness_every`]); `min_timeout_ms` 0: no namespace has one.
    fn scan_due(&self, min_timeout_ms: u64, now: Instant) -> bool {
        let mut last = self.last_scan.lock().unwrap_or_else(|p| p.into_inner());
        let due = min_timeout_ms > 0
            && last.is_none_or(|l| now.duration_since(l) >= liveness_every(min_timeout_ms));
        if due {
            *last = Some(now);
        }
        due
    }

    async fn fire_timers(&self, leader: &LocalLeader) {
        let now = Instant::now();
        let min_timeout_ms = leader.node().state().read(|s| {
            s.namespaces()
                .filter_map(|n| n.config().map(|c| c.heartbeat_timeout_ms))
                .filter(|&t| t > 0)
                .min()
                .unwrap_or(0)
        });
        let scan = self.scan_due(min_timeout_ms, now);
        let namespaces = timers_due(leader, scan);
        let stale = match scan {
            true => self.stale_tasks(&namespaces, now),
            false => Vec::new(),
        };
        for (ns, tasks) in stale {
            let name = journal::namespace::namespace_name(&ns);
            tracing::warn!(namespace = name, ?tasks, "tasks stopped sending heartbeats");
            let update = in_namespace(&ns, TasksUnhealthy { tasks });
            super::propose(self.name(), leader, &update).await;
        }
        let now_ms = now_ms();
        for (ns, _, _, deadlines) in namespaces {
            for d in deadlines.into_iter().filter(|d| d.deadline_ms <= now_ms) {
                let expire = BarrierExpire {
                    id: d.id,
                    counter: d.counter,
                };
                super::propose(self.name(), leader, &in_namespace(&ns, expire)).await;
            }
        }
    }

    /// The tasks of each namespace in `namespaces` whose heartbeats stopped
    /// longer ago than its timeout (first seen now, if never).
    fn stale_tasks(&self, namespaces: &[Due], now: Instant) -> Vec<(String, Vec<u32>)> {
        let mut seen = self.seen();
        let connected: std::collections::HashSet<(&str, u32)> = namespaces
            .iter()
            .flat_map(|(ns, c, _, _)| c.iter().map(move |(t, _)| (ns.as_str(), *t)))
            .collect();
        seen.retain(|(ns, t), _| connected.contains(&(ns.as_str(), *t)));
        let mut stale = Vec::new();
        for (ns, connected, timeout_ms, _) in namespaces {
            let timeout = Duration::from_millis(*timeout_ms);
            let late: Vec<u32> = connected
                .iter()
                .filter_map(|&(task, _)| {
                    let last = *seen.entry((ns.clone(), task)).or_insert(now);
                    (*timeout_ms > 0 && now.duration_since(last) > timeout).then_some(task)
                })
                .collect();
            if !late.is_empty() {
                stale.push((ns.clone(), late));
            }
        }
        stale
    }
}

/// Per namespace (its key): its connected tasks (read only when the
/// liveness look is due), its heartbeat timeout, its pending barrier
/// deadlines.
type Due = (
    String,
    Vec<(u32, u64)>,
    u64,
    Vec<journal::coordination::BarrierDeadline>,
);

/// What the timers of every namespace need now (see [`Due`]).
fn timers_due(leader: &LocalLeader, scan: bool) -> Vec<Due> {
    leader.node().state().read(|s| {
        s.namespaces()
            .map(|n| {
                let c = n.coordination();
                let timeout_ms = n.config().map_or(0, |c| c.heartbeat_timeout_ms);
                let connected = match scan {
                    true => c.connected_tasks(),
                    false => Vec::new(),
                };
                (
                    n.key().to_string(),
                    connected,
                    timeout_ms,
                    c.pending_barrier_deadlines(),
                )
            })
            .collect()
    })
}

/// The update of `command` in namespace `ns` (its key).
pub(crate) fn in_namespace(ns: &str, command: impl Into<Update>) -> Update {
    Update {
        namespace: ns.to_string(),
        ..command.into()
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
            let connected: Vec<NsTask> = leader.node().state().read(|s| {
                s.namespaces()
                    .flat_map(|n| {
                        let ns = n.key().to_string();
                        let tasks = n.coordination().connected_tasks();
                        tasks.into_iter().map(move |(t, _)| (ns.clone(), t))
                    })
                    .collect()
            });
            let mut seen = self.seen();
            seen.clear();
            for task in connected {
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

#[cfg(test)]
mod liveness_tests {
    use super::*;

    #[test]
    fn the_liveness_look_is_a_twentieth_of_the_shortest_timeout_within_bounds() {
        assert_eq!(liveness_every(100_000), Duration::from_secs(1));
        assert_eq!(liveness_every(4_000), Duration::from_millis(200));
        assert_eq!(liveness_every(1_000), super::super::TICK);
        let duty = CoordinationDuty::default();
        let t0 = Instant::now();
        assert!(!duty.scan_due(0, t0), "no timeout: nothing to look for");
        assert!(duty.scan_due(4_000, t0));
        assert!(!duty.scan_due(4_000, t0 + Duration::from_millis(199)));
        assert!(duty.scan_due(4_000, t0 + Duration::from_millis(200)));
    }
}
