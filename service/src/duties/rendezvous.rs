//! The rendezvous duty: what the leader alone decides of torchrun's
//! rendezvous. A round whose last call passed (by the leader's clock) is
//! formed (`Complete`); an agent the leader has not heard from for its
//! run's liveness window is dropped (`Expire`). Keep-alives are recorded
//! here, in memory, and never become entries; an agent the leader has not
//! heard from since it took over counts as heard then (a new leader never
//! drops everyone), as task heartbeats do.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use journal::pb::rendezvous::{Complete, Expire, Node};

use super::coordination::in_namespace;
use super::{Duty, DutyFuture};
use crate::core::{now_ms, LocalLeader};

/// How often the leader looks for silent agents.
const SCAN_EVERY: Duration = Duration::from_millis(500);

/// An agent of a run of a namespace (its key).
type Agent = (String, String, String, u64, u64);

fn agent(ns: &str, run: &str, n: &Node) -> Agent {
    (
        ns.to_string(),
        run.to_string(),
        n.addr.clone(),
        n.pid,
        n.local_id,
    )
}

/// Rounds to form and agents to drop, found in one look.
#[derive(Default)]
struct Found {
    complete: Vec<(String, Complete)>,
    expire: Vec<(String, Expire)>,
}

/// The leader's keep-alives of rendezvous agents.
#[derive(Default)]
pub struct RendezvousDuty {
    seen: Mutex<HashMap<Agent, Instant>>,
    last_scan: Mutex<Option<Instant>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl RendezvousDuty {
    /// `node` of run `run` in namespace `ns` (its key) is alive now.
    pub fn keep_alive(&self, ns: &str, run: &str, node: &Node) {
        lock(&self.seen).insert(agent(ns, run, node), Instant::now());
    }

    /// What is due: rounds whose last call passed; with `scan`, agents not
    /// heard within their run's window (an agent first seen now counts as
    /// heard now; agents no longer in a run are forgotten).
    fn look(&self, s: &journal::State, now_ms: u64, scan: bool) -> Found {
        let mut found = Found::default();
        let now = Instant::now();
        let mut seen = lock(&self.seen);
        let mut kept = HashMap::with_capacity(if scan { seen.len() } else { 0 });
        for n in s.namespaces() {
            for (name, r) in n.rendezvous().runs().filter(|(_, r)| !r.closed) {
                let due = r.last_call_ends_ms;
                if !r.complete && due != 0 && now_ms >= due {
                    let c = Complete {
                        run: name.clone(),
                        round: r.round,
                    };
                    found.complete.push((n.key().to_string(), c));
                }
                if !scan {
                    continue;
                }
                let window = Duration::from_millis(r.settings.unwrap_or_default().liveness_ms);
                let mut silent = Vec::new();
                let all = r.participants.iter().chain(&r.wait_list);
                for node in all.chain(&r.redundancy_list) {
                    let key = agent(n.key(), name, node);
                    let at = seen.get(&key).copied().unwrap_or(now);
                    if now.saturating_duration_since(at) > window {
                        silent.push(node.clone());
                    }
                    kept.insert(key, at);
                }
                if !silent.is_empty() {
                    let e = Expire {
                        run: name.clone(),
                        nodes: silent,
                    };
                    found.expire.push((n.key().to_string(), e));
                }
            }
        }
        if scan {
            *seen = kept;
        }
        found
    }

    fn scan_due(&self, now: Instant) -> bool {
        let mut last = lock(&self.last_scan);
        let due = last.is_none_or(|l| now.duration_since(l) >= SCAN_EVERY);
        if due {
            *last = Some(now);
        }
        due
    }
}

impl Duty for RendezvousDuty {
    fn name(&self) -> &'static str {
        "rendezvous"
    }

    /// Every agent counts as heard now.
    fn on_takeover<'a>(&'a self, _leader: &'a LocalLeader) -> DutyFuture<'a> {
        Box::pin(async move {
            lock(&self.seen).clear();
            *lock(&self.last_scan) = None;
        })
    }

    fn tick<'a>(&'a self, leader: &'a LocalLeader) -> DutyFuture<'a> {
        Box::pin(async move {
            let scan = self.scan_due(Instant::now());
            let now = now_ms();
            let found = leader.node().state().read(|s| self.look(s, now, scan));
            for (ns, c) in found.complete {
                let update = in_namespace(&ns, c);
                super::propose(self.name(), leader, &update).await;
            }
            for (ns, e) in found.expire {
                tracing::info!(
                    namespace = journal::namespace::namespace_name(&ns),
                    run = e.run,
                    agents = ?e.nodes.iter().map(|n| format!("{}_{}_{}", n.addr, n.pid, n.local_id)).collect::<Vec<_>>(),
                    "rendezvous agents stopped keeping alive: dropping them"
                );
                let update = in_namespace(&ns, e);
                super::propose(self.name(), leader, &update).await;
            }
        })
    }

    fn on_step_down(&self) {
        lock(&self.seen).clear();
    }
}
