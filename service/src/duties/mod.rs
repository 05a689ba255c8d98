//! The leader runtime: what depends on wall-clock time or liveness lives only
//! on the leader and is rebuilt when a node becomes leader. It is a list of
//! duties, one per area (and one for the cluster as a whole), each told when
//! this node takes over and ticked while it leads. A duty acts through the
//! [`LocalLeader`] only: it proposes an update (tasks unhealthy, barrier
//! expired, closures put back, ...) and the state machine decides.

pub mod closures;
pub mod cluster;
pub mod coordination;
pub mod dispatcher;
pub mod levels;
pub mod namespaces;
pub mod push;
pub mod rendezvous;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use journal::Update;

use crate::core::LocalLeader;
use raft::WatchReceiver;

/// Timer granularity of the leader runtime.
pub const TICK: Duration = Duration::from_millis(100);
/// Most time one duty's proposal may take before the next tick.
pub const PROPOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// What a duty's hooks return.
pub type DutyFuture<'a> = Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

/// One area's work on the leader.
pub trait Duty: Send + Sync {
    /// A name for logs.
    fn name(&self) -> &'static str;

    /// This node became the leader in a new term: rebuild what lives only
    /// on the leader (from the replicated state, or as "now").
    fn on_takeover<'a>(&'a self, leader: &'a LocalLeader) -> DutyFuture<'a>;

    /// Runs every [`TICK`] while this node leads.
    fn tick<'a>(&'a self, leader: &'a LocalLeader) -> DutyFuture<'a>;

    /// This node stopped leading: forget the leader-only bookkeeping.
    fn on_step_down(&self);
}

/// The duties of this node, run while it leads.
pub struct LeaderRuntime {
    duties: Vec<Arc<dyn Duty>>,
}

impl LeaderRuntime {
    /// A runtime running `duties` in order, each tick.
    pub fn new(duties: Vec<Arc<dyn Duty>>) -> Self {
        LeaderRuntime { duties }
    }

    /// Runs the duties while this node is the leader; idles otherwise. A
    /// takeover is noticed as soon as Raft reports it (not at the next
    /// tick), so a fresh cluster is configured at once.
    pub async fn run(self: Arc<Self>, leader: LocalLeader) {
        // The term this node last took over in: a new term is a new takeover,
        // even if this node lost and regained leadership between two ticks.
        let mut led_term: Option<u64> = None;
        // Role and leader changes only: the full metrics change with every
        // write, and waking here for each cost a task wake per write.
        let mut metrics = leader.node().server_watch();
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let ticked = tokio::select! {
                _ = tick.tick() => true,
                changed = metrics.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    false
                }
            };
            let Some(term) = raft::leading_term(&metrics.borrow_watched()) else {
                if led_term.take().is_some() {
                    for d in &self.duties {
                        d.on_step_down();
                    }
                }
                continue;
            };
            if led_term != Some(term) {
                led_term = Some(term);
                for d in &self.duties {
                    d.on_takeover(&leader).await;
                }
            } else if !ticked {
                continue;
            }
            for d in &self.duties {
                d.tick(&leader).await;
            }
        }
    }
}

/// Proposes `update` for a duty, within [`PROPOSE_TIMEOUT`]; a failure is
/// logged and left to the next tick, which decides again from the state.
pub async fn propose(
    duty: &str,
    leader: &LocalLeader,
    update: &Update,
) -> Option<journal::Outcome> {
    match tokio::time::timeout(PROPOSE_TIMEOUT, leader.propose(update)).await {
        Ok(Ok(applied)) => Some(applied.outcome),
        Ok(Err(e)) => {
            tracing::debug!("{duty} duty: proposal failed: {}", e.0);
            None
        }
        Err(_) => {
            tracing::debug!("{duty} duty: proposal timed out");
            None
        }
    }
}
