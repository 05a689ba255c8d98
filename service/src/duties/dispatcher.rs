//! The dispatcher duty: what TF's dispatcher keeps only in memory and
//! decides from the wall clock — when each iteration client last
//! heartbeated, releasing clients that stopped, collecting iterations
//! nobody reads any more, and noticing workers that stopped heartbeating
//! (logged as lost; their tasks are kept, as upstream). On takeover every
//! active client and every worker counts as seen now, as an upstream
//! dispatcher restart does (nothing is released or collected early because
//! leadership moved). The decisions are proposed;
//! the state checks them again.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use journal::pb::dispatcher::{GarbageCollectIteration, ReleaseIterationClient};

use super::coordination::in_namespace;
use super::{Duty, DutyFuture};

use crate::core::{now_ms, LocalLeader};

/// The tf.data dispatcher's settings (the same on every node).
#[derive(Clone, Debug)]
pub struct TfDataConfig {
    /// What GetVersion answers.
    pub version: i64,
    /// Release a client unheard of for this long.
    pub client_timeout_ms: u64,
    /// Collect an iteration without clients for this long (0: never).
    pub gc_timeout_ms: u64,
    /// Log a worker unheard of for this long as lost.
    pub worker_timeout_ms: u64,
    /// Static sharding's workers, by index.
    pub worker_addresses: Vec<String>,
}

impl Default for TfDataConfig {
    fn default() -> Self {
        TfDataConfig {
            version: 9,
            client_timeout_ms: 300_000,
            gc_timeout_ms: 300_000,
            worker_timeout_ms: 600_000,
            worker_addresses: Vec::new(),
        }
    }
}

/// How often the timeouts are checked (upstream: every 10 minutes).
const CHECK_EVERY: Duration = Duration::from_secs(1);

/// How long MaybeRemoveTask waits for every consumer (upstream: 10 s).
pub const REMOVE_QUORUM_WAIT: Duration = Duration::from_secs(10);

/// What a MaybeRemoveTask request learns from the quorum.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Quorum {
    /// This request completed it: propose the removal.
    Reached,
    /// Another request completed it and the task was removed.
    Removed,
    /// A different round was asked, or not every consumer asked in time.
    Failed,
}

/// The consumers that asked to remove one task, at one round.
struct RemoveRequests {
    round: i64,
    consumers: std::collections::BTreeSet<i64>,
    done: std::sync::Arc<tokio::sync::Notify>,
    removed: bool,
}

/// Something of a namespace (its key: "" for the default one): ids are
/// drawn per namespace, so the same client id or worker address in two
/// namespaces are two.
type In<K> = (String, K);

/// The leader's memory of tf.data clients.
pub struct DispatcherDuty {
    config: TfDataConfig,
    /// Client id -> its last heartbeat (`None`: acquired, not heard from
    /// yet; never timed out, as upstream).
    clients: Mutex<HashMap<In<i64>, Option<Instant>>>,
    /// Worker address -> its last heartbeat, and whether it was reported
    /// lost since.
    workers: Mutex<HashMap<In<String>, (Instant, bool)>>,
    last_check: Mutex<Option<Instant>>,
    /// MaybeRemoveTask quorums in progress, by task (lost on a leader
    /// change; the consumers ask again).
    removals: Mutex<HashMap<In<i64>, RemoveRequests>>,
}

impl DispatcherDuty {
    /// The duty with `config`'s timeouts.
    pub fn new(config: TfDataConfig) -> Self {
        DispatcherDuty {
            config,
            clients: Mutex::default(),
            workers: Mutex::default(),
            last_check: Mutex::default(),
            removals: Mutex::default(),
        }
    }

    fn removals(&self) -> std::sync::MutexGuard<'_, HashMap<In<i64>, RemoveRequests>> {
        self.removals.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts `consumer`'s request to remove `task` at `round`; waits (up to
    /// [`REMOVE_QUORUM_WAIT`]) until all `consumers` asked for that round.
    pub async fn remove_quorum(
        &self,
        ns: &str,
        task: i64,
        consumer: i64,
        round: i64,
        consumers: i64,
    ) -> Quorum {
        let task = (ns.to_string(), task);
        let done = {
            let mut all = self.removals();
            let r = all.entry(task.clone()).or_insert_with(|| RemoveRequests {
                round,
                consumers: Default::default(),
                done: Default::default(),
                removed: false,
            });
            if r.removed {
                return Quorum::Removed;
            }
            if r.round != round {
                return Quorum::Failed;
            }
            r.consumers.insert(consumer);
            if r.consumers.len() as i64 >= consumers {
                return Quorum::Reached;
            }
            r.done.clone()
        };
        // Registered before the flag is read again, so a removal between
        // the two is not missed.
        let notified = done.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if self.removals().get(&task).is_some_and(|r| r.removed) {
            return Quorum::Removed;
        }
        let _ = tokio::time::timeout(REMOVE_QUORUM_WAIT, notified).await;
        let mut all = self.removals();
        match all.get(&task) {
            Some(r) if r.removed => Quorum::Removed,
            Some(_) => {
                // Not every consumer asked in time: start over.
                all.remove(&task);
                Quorum::Failed
            }
            None => Quorum::Failed,
        }
    }

    /// The quorum's removal was applied: every waiting request hears it.
    pub fn removed(&self, ns: &str, task: i64) {
        let mut all = self.removals();
        if let Some(r) = all.get_mut(&(ns.to_string(), task)) {
            r.removed = true;
            r.done.notify_waiters();
        }
    }

    fn clients(&self) -> std::sync::MutexGuard<'_, HashMap<In<i64>, Option<Instant>>> {
        self.clients.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A client was acquired: it is not timed out before its first heartbeat.
    pub fn acquired(&self, ns: &str, client: i64) {
        self.clients().insert((ns.to_string(), client), None);
    }

    /// A client heartbeat reached the leader.
    pub fn heard(&self, ns: &str, client: i64) {
        self.clients()
            .insert((ns.to_string(), client), Some(Instant::now()));
    }

    /// A worker heartbeat reached the leader.
    pub fn heard_worker(&self, ns: &str, address: &str) {
        self.heard_worker_at((ns.to_string(), address.to_string()), Instant::now());
    }

    fn heard_worker_at(&self, worker: In<String>, now: Instant) {
        let mut workers = self.workers.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, true)) = workers.get(&worker) {
            tracing::info!(
                worker = worker.1,
                "a tf.data worker reported lost is heartbeating again"
            );
        }
        workers.insert(worker, (now, false));
    }

    /// Workers silent for longer than the worker timeout, each reported once
    /// (a worker this leader never heard of counts as seen now).
    fn lost_workers(&self, known: Vec<In<String>>, now: Instant) -> Vec<In<String>> {
        let timeout = Duration::from_millis(self.config.worker_timeout_ms);
        let mut workers = self.workers.lock().unwrap_or_else(|p| p.into_inner());
        let live: std::collections::HashSet<&In<String>> = known.iter().collect();
        workers.retain(|w, _| live.contains(w));
        let mut lost = Vec::new();
        for w in known {
            let (seen, reported) = workers.entry(w.clone()).or_insert((now, false));
            if !*reported && now.duration_since(*seen) > timeout {
                *reported = true;
                lost.push(w);
            }
        }
        lost
    }

    async fn check(&self, leader: &LocalLeader) {
        let now = Instant::now();
        {
            let mut last = self.last_check.lock().unwrap_or_else(|p| p.into_inner());
            if last.is_some_and(|t| now.duration_since(t) < CHECK_EVERY) {
                return;
            }
            *last = Some(now);
        }
        let watched = leader.node().state().read(Watched::of);
        for (ns, worker) in self.lost_workers(watched.workers, now) {
            tracing::warn!(
                namespace = journal::namespace::namespace_name(&ns),
                worker,
                timeout_ms = self.config.worker_timeout_ms,
                "a tf.data worker stopped heartbeating; it is lost (its tasks are kept, as upstream)"
            );
        }
        for (ns, client) in self.stale_clients(&watched.clients, now) {
            tracing::info!(
                namespace = journal::namespace::namespace_name(&ns),
                client,
                "releasing a tf.data client that stopped heartbeating"
            );
            let release = ReleaseIterationClient {
                iteration_client_id: client,
            };
            let update = in_namespace(&ns, release);
            super::propose(self.name(), leader, &update).await;
        }
        self.collect_idle(leader, watched.idle).await;
    }

    /// The clients of `active` unheard of for the client timeout (one this
    /// leader never heard of counts as seen now); forgets the others.
    fn stale_clients(&self, active: &[In<i64>], now: Instant) -> Vec<In<i64>> {
        let timeout = Duration::from_millis(self.config.client_timeout_ms);
        let mut clients = self.clients();
        let live: std::collections::HashSet<&In<i64>> = active.iter().collect();
        clients.retain(|c, _| live.contains(c));
        active
            .iter()
            .filter(|c| {
                let seen = clients.entry((*c).clone()).or_insert(Some(now));
                seen.is_some_and(|t| now.duration_since(t) > timeout)
            })
            .cloned()
            .collect()
    }

    /// Garbage collects the `idle` iterations released longer ago than the
    /// GC timeout (none with a timeout of 0).
    async fn collect_idle(&self, leader: &LocalLeader, idle: Vec<(String, i64, u64)>) {
        if self.config.gc_timeout_ms == 0 {
            return;
        }
        let now_ms = now_ms();
        for (ns, iteration, released) in idle {
            if now_ms < released.saturating_add(self.config.gc_timeout_ms) {
                continue;
            }
            tracing::info!(iteration, "garbage collecting an idle tf.data iteration");
            let gc = GarbageCollectIteration {
                iteration_id: iteration,
                released_at_ms: released,
            };
            super::propose(self.name(), leader, &in_namespace(&ns, gc)).await;
        }
    }
}

/// What the timeouts watch, over every namespace: the clients of running
/// iterations, the iterations without clients (and when they lost their
/// last), the workers.
#[derive(Default)]
struct Watched {
    clients: Vec<In<i64>>,
    idle: Vec<(String, i64, u64)>,
    workers: Vec<In<String>>,
}

impl Watched {
    fn of(s: &journal::State) -> Watched {
        let mut w = Watched::default();
        for n in s.namespaces() {
            let (ns, d) = (n.key(), n.dispatcher());
            w.workers
                .extend(d.workers().map(|x| (ns.to_string(), x.address.clone())));
            w.clients.extend(
                d.clients()
                    .filter(|(_, it)| d.iteration(*it).is_some_and(|it| !it.finished))
                    .map(|(c, _)| (ns.to_string(), c)),
            );
            w.idle.extend(
                d.iterations()
                    .filter(|it| {
                        !it.finished
                            && !it.garbage_collected
                            && it.num_clients == 0
                            && it.last_released_ms != 0
                            && it.split_provider.is_none()
                    })
                    .map(|it| (ns.to_string(), it.id, it.last_released_ms)),
            );
        }
        w
    }
}

impl Duty for DispatcherDuty {
    fn name(&self) -> &'static str {
        "dispatcher"
    }

    fn on_takeover<'a>(&'a self, leader: &'a LocalLeader) -> DutyFuture<'a> {
        Box::pin(async move {
            let active: Vec<In<i64>> = leader.node().state().read(|s| {
                s.namespaces()
                    .flat_map(|n| {
                        let ns = n.key().to_string();
                        let clients: Vec<i64> = n.dispatcher().clients().map(|(c, _)| c).collect();
                        clients.into_iter().map(move |c| (ns.clone(), c))
                    })
                    .collect()
            });
            let now = Instant::now();
            let mut clients = self.clients();
            clients.clear();
            for c in active {
                clients.insert(c, Some(now));
            }
        })
    }

    fn tick<'a>(&'a self, leader: &'a LocalLeader) -> DutyFuture<'a> {
        Box::pin(self.check(leader))
    }

    fn on_step_down(&self) {
        self.clients().clear();
        self.removals().clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_silent_worker_is_reported_lost_once_and_found_again_by_a_heartbeat() {
        let duty = DispatcherDuty::new(TfDataConfig {
            worker_timeout_ms: 1_000,
            ..Default::default()
        });
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let w = |a: &str| (String::new(), a.to_string());
        let known = || vec![w("w:1"), w("w:2")];
        // Never heard of by this leader: seen now, not lost.
        assert!(duty.lost_workers(known(), t0).is_empty());
        duty.heard_worker_at(w("w:2"), at(900));
        assert_eq!(duty.lost_workers(known(), at(1_500)), vec![w("w:1")]);
        // Reported once.
        assert!(duty.lost_workers(known(), at(1_600)).is_empty());
        duty.heard_worker_at(w("w:1"), at(1_700));
        assert_eq!(duty.lost_workers(known(), at(2_000)), vec![w("w:2")]);
        assert!(duty.lost_workers(known(), at(2_600)).is_empty());
        assert_eq!(duty.lost_workers(known(), at(2_800)), vec![w("w:1")]);
        // A worker no longer in the state is forgotten.
        assert!(duty.lost_workers(vec![w("w:1")], at(3_000)).is_empty());
        assert!(!duty.workers.lock().unwrap().contains_key(&w("w:2")));
    }
}
