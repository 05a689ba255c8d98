//! The coordination duty: task liveness and barrier deadlines, and pushing
//! propagated errors to TensorFlow tasks ([`super::push`]). Heartbeat
//! last-seen times are reset to "now" on takeover (a new leader never
//! declares everyone dead); barrier deadlines come from the absolute
//! deadline stored in the replicated state. When a timer fires the leader
//! proposes an update (tasks unhealthy, barrier expired) and the state
//! machine decides.
//!
//! What the leader alone knows — when it last heard each task, since when
//! each pending barrier has waited — is kept in a [`Liveness`] that
//! operators read ([`liveness_of`]: `ctl tasks`, `ctl barriers`, the status
//! page, the metrics); reading it changes nothing.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
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
    liveness: Arc<Liveness>,
    /// When the leader last looked for tasks whose heartbeats stopped.
    last_scan: Mutex<Option<Instant>>,
    pusher: ErrorPusher,
}

/// What the leader knows of a namespace's tasks and barriers beyond the
/// replicated state: when it last heard each connected task, and since
/// when each pending barrier instance has waited (as this leader saw it).
/// Empty on a follower.
#[derive(Default)]
pub struct Liveness {
    last_seen: Mutex<HashMap<NsTask, Instant>>,
    barriers: Mutex<BarrierClock>,
}

/// When the leader first saw each pending barrier instance: by namespace
/// key, then barrier id.
#[derive(Default)]
struct BarrierClock {
    by_ns: HashMap<String, HashMap<String, Opened>>,
    /// The current look (entries not seen in it are gone).
    look: u64,
}

/// A pending barrier instance as the leader first saw it.
#[derive(Clone, Copy)]
struct Opened {
    counter: i64,
    since: Instant,
    /// Already pending when this leader took over.
    at_takeover: bool,
    look: u64,
}

/// How long a pending barrier has waited, as the leader knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Waited {
    pub ms: u64,
    /// Pending since before this leader took over: at least `ms`.
    pub at_least: bool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Liveness {
    /// Milliseconds since the leader last heard task `task` of namespace
    /// `ns` (its key), for each of `tasks`; `None`: not heard since it
    /// took over, or not connected.
    pub fn heartbeat_ages(&self, ns: &str, tasks: &[u32], now: Instant) -> Vec<Option<u64>> {
        let seen = lock(&self.last_seen);
        let mut key = (ns.to_string(), 0);
        tasks
            .iter()
            .map(|&t| {
                key.1 = t;
                seen.get(&key)
                    .map(|at| now.saturating_duration_since(*at).as_millis() as u64)
            })
            .collect()
    }

    /// How long instance `counter` of barrier `id` in namespace `ns` (its
    /// key) has waited, if the leader has seen it pending.
    pub fn barrier_waited(&self, ns: &str, id: &str, counter: i64, now: Instant) -> Option<Waited> {
        let clock = lock(&self.barriers);
        let o = clock
            .by_ns
            .get(ns)?
            .get(id)
            .filter(|o| o.counter == counter)?;
        Some(Waited {
            ms: now.saturating_duration_since(o.since).as_millis() as u64,
            at_least: o.at_takeover,
        })
    }

    /// The longest-waiting pending barrier of every namespace (its key)
    /// that has one: (barrier id, how long).
    pub fn oldest_barriers(&self, now: Instant) -> HashMap<String, (String, Waited)> {
        let clock = lock(&self.barriers);
        clock
            .by_ns
            .iter()
            .filter_map(|(ns, ids)| {
                let (id, o) = ids.iter().min_by_key(|(id, o)| (o.since, id.as_str()))?;
                let waited = Waited {
                    ms: now.saturating_duration_since(o.since).as_millis() as u64,
                    at_least: o.at_takeover,
                };
                Some((ns.clone(), (id.clone(), waited)))
            })
            .collect()
    }

    /// Notes every pending barrier instance of `s` as seen `now` (the first
    /// time only; `at_takeover` marks those found when taking over) and
    /// forgets those no longer pending. O(barriers), no allocation for
    /// barriers already known.
    fn note_barriers(&self, s: &journal::State, now: Instant, at_takeover: bool) {
        use journal::pb::coordination::BarrierStatus;
        let mut clock = lock(&self.barriers);
        clock.look += 1;
        let look = clock.look;
        for n in s.namespaces() {
            let pending = n
                .coordination()
                .barriers()
                .filter(|(_, b)| b.status() == BarrierStatus::Pending);
            for (id, b) in pending {
                if !clock.by_ns.contains_key(n.key()) {
                    clock.by_ns.insert(n.key().to_string(), HashMap::new());
                }
                let ids = clock.by_ns.get_mut(n.key()).expect("inserted above");
                match ids.get_mut(id.as_str()) {
                    Some(o) if o.counter == b.counter => o.look = look,
                    _ => {
                        let o = Opened {
                            counter: b.counter,
                            since: now,
                            at_takeover,
                            look,
                        };
                        ids.insert(id.clone(), o);
                    }
                }
            }
        }
        clock.by_ns.retain(|_, ids| {
            ids.retain(|_, o| o.look == look);
            !ids.is_empty()
        });
    }

    fn clear(&self) {
        lock(&self.last_seen).clear();
        *lock(&self.barriers) = BarrierClock::default();
    }
}

/// The leader's [`Liveness`] of each node of this process (one in a
/// `coordstore serve`), found by its Raft node: how the metrics and the
/// status page, which the node assembly does not hand the duty, read it.
static LIVENESS: Mutex<Vec<(Weak<raft::RaftNode>, Weak<Liveness>)>> = Mutex::new(Vec::new());

/// The [`Liveness`] of `node`'s coordination duty, once the node has led
/// (empty again on a follower).
pub fn liveness_of(node: &Arc<raft::RaftNode>) -> Option<Arc<Liveness>> {
    let all = lock(&LIVENESS);
    all.iter()
        .find(|(n, _)| std::ptr::eq(n.as_ptr(), Arc::as_ptr(node)))
        .and_then(|(_, l)| l.upgrade())
}

fn publish(node: &Arc<raft::RaftNode>, liveness: &Arc<Liveness>) {
    let mut all = lock(&LIVENESS);
    all.retain(|(n, l)| n.strong_count() > 0 && l.strong_count() > 0);
    if !all
        .iter()
        .any(|(n, _)| std::ptr::eq(n.as_ptr(), Arc::as_ptr(node)))
    {
        all.push((Arc::downgrade(node), Arc::downgrade(liveness)));
    }
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
            liveness: Arc::default(),
            last_scan: Mutex::default(),
            pusher: ErrorPusher::new(tf_addresses),
        }
    }

    /// What this leader knows of tasks and barriers (empty on a follower).
    pub fn liveness(&self) -> &Arc<Liveness> {
        &self.liveness
    }

    fn seen(&self) -> MutexGuard<'_, HashMap<NsTask, Instant>> {
        lock(&self.liveness.last_seen)
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
            self.liveness.clear();
            let mut seen = self.seen();
            for task in connected {
                seen.insert(task, now);
            }
            drop(seen);
            let state = leader.node().state();
            state.read(|s| self.liveness.note_barriers(s, now, true));
            publish(leader.node(), &self.liveness);
            self.pusher.reset();
        })
    }

    fn tick<'a>(&'a self, leader: &'a LocalLeader) -> DutyFuture<'a> {
        Box::pin(async move {
            let now = Instant::now();
            let state = leader.node().state();
            state.read(|s| self.liveness.note_barriers(s, now, false));
            self.fire_timers(leader).await;
            leader
                .node()
                .state()
                .read(|s| self.pusher.push_new_notices(s));
        })
    }

    fn on_step_down(&self) {
        self.liveness.clear();
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
