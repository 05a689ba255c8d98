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

/// A task of a namespace (its key: "" for the default one).
type NsTask = (String, u32);

/// Liveness bookkeeping of the leader, and its error pushes.
#[derive(Default)]
pub struct CoordinationDuty {
    last_seen: Mutex<HashMap<NsTask, Instant>>,
    pusher: ErrorPusher,
}

impl CoordinationDuty {
    /// A duty that pushes propagated errors to the TensorFlow tasks of the
    /// default namespace at `tf_addresses` (job name → addresses by task
    /// id; empty: no pushes); other namespaces name theirs in their spec.
    pub fn new(tf_addresses: BTreeMap<String, Vec<String>>) -> Self {
        CoordinationDuty {
            last_seen: Mutex::default(),
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
    ) -> Result<Result<(), DomainError>, Retry> {
        if !leader.leader_heard_recently() {
            return Err(Retry(
                "this leader has not heard from a quorum recently".into(),
            ));
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
        Ok(match verdict {
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
        })
    }

    async fn fire_timers(&self, leader: &LocalLeader) {
        // Per namespace: its connected tasks, its heartbeat timeout, its
        // pending barrier deadlines.
        type Due = (
            String,
            Vec<(u32, u64)>,
            u64,
            Vec<journal::coordination::BarrierDeadline>,
        );
        let namespaces: Vec<Due> = leader.node().state().read(|s| {
            s.namespaces()
                .map(|n| {
                    let c = n.coordination();
                    let timeout_ms = n.config().map_or(0, |c| c.heartbeat_timeout_ms);
                    let deadlines = c.pending_barrier_deadlines();
                    (
                        n.key().to_string(),
                        c.connected_tasks(),
                        timeout_ms,
                        deadlines,
                    )
                })
                .collect()
        });
        let now = Instant::now();
        let mut stale: Vec<(String, Vec<u32>)> = Vec::new();
        {
            let mut seen = self.seen();
            let connected: std::collections::HashSet<(&str, u32)> = namespaces
                .iter()
                .flat_map(|(ns, c, _, _)| c.iter().map(move |(t, _)| (ns.as_str(), *t)))
                .collect();
            seen.retain(|(ns, t), _| connected.contains(&(ns.as_str(), *t)));
            for (ns, connected, timeout_ms, _) in &namespaces {
                let late: Vec<u32> = connected
                    .iter()
                    .filter_map(|&(task, _)| {
                        let last = *seen.entry((ns.clone(), task)).or_insert(now);
                        let timeout = Duration::from_millis(*timeout_ms);
                        (*timeout_ms > 0 && now.duration_since(last) > timeout).then_some(task)
                    })
                    .collect();
                if !late.is_empty() {
                    stale.push((ns.clone(), late));
                }
            }
        }
        for (ns, tasks) in stale {
            let name = journal::namespace::namespace_name(&ns);
            tracing::warn!(namespace = name, ?tasks, "tasks stopped sending heartbeats");
            let update = in_namespace(&ns, TasksUnhealthy { tasks });
            super::propose(self.name(), leader, &update).await;
        }
        let now_ms = now_ms();
        for (ns, _, _, deadlines) in namespaces {
            for d in deadlines.into_iter().filter(|d| d.deadline_ms <= now_ms) {
                let update = in_namespace(
                    &ns,
                    BarrierExpire {
                        id: d.id,
                        counter: d.counter,
                    },
                );
                super::propose(self.name(), leader, &update).await;
            }
        }
    }
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
