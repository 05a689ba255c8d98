//! The leader runtime: what depends on wall-clock time or liveness lives only
//! on the leader and is rebuilt when a node becomes leader. Heartbeat
//! last-seen times are reset to "now" on takeover (a new leader never declares
//! everyone dead); barrier deadlines come from the absolute deadline stored in
//! the replicated state. When a timer fires the leader proposes an update
//! (tasks unhealthy, barrier expired) and the state machine decides.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use journal::pb::{
    coordination::{BarrierExpire, Heartbeat, TasksUnhealthy},
    update::Command,
};
use journal::{coordination::HeartbeatCheck, DomainError, Update};
use raft::Role;

use crate::core::{now_ms, Core, Retry};
use crate::push::ErrorPusher;

/// Timer granularity of the leader runtime.
pub const TICK: Duration = Duration::from_millis(100);
/// Most time one timer-driven proposal may take before the next tick.
const PROPOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// Liveness bookkeeping of the leader, and its error pushes.
#[derive(Default)]
pub struct LeaderRuntime {
    last_seen: Mutex<HashMap<u32, Instant>>,
    pusher: ErrorPusher,
}

impl LeaderRuntime {
    /// A runtime that pushes propagated errors to the TensorFlow tasks at
    /// `tf_addresses` (job name → addresses by task id; empty: no pushes).
    pub fn new(tf_addresses: std::collections::BTreeMap<String, Vec<String>>) -> Self {
        LeaderRuntime {
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
        core: &Core,
        task: u32,
        incarnation: u64,
    ) -> Result<Result<(), DomainError>, Retry> {
        if !core.leader_heard_recently() {
            return Err(Retry(
                "this leader has not heard from a quorum recently".into(),
            ));
        }
        let check = |core: &Core| {
            core.node().state().read(|s| {
                s.coordination()
                    .heartbeat_check(task, incarnation, now_ms())
            })
        };
        let mut verdict = check(core);
        if matches!(
            verdict,
            HeartbeatCheck::Reject(_) | HeartbeatCheck::Mismatch(_)
        ) {
            // A new leader may not have applied a just-committed registration
            // yet: confirm on an up-to-date state before refusing.
            if core.read_barrier().await.is_ok() {
                verdict = check(core);
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
                let update = Update {
                    command: Some(Command::from(Heartbeat { task, incarnation })),
                    ..Default::default()
                };
                match core.propose(update, false).await {
                    Ok(applied) => applied.outcome.error.map_or(Ok(()), Err),
                    Err(_) => Err(e),
                }
            }
        })
    }

    /// Runs the timers while this node is the leader; idles otherwise.
    pub async fn run(self: Arc<Self>, core: Arc<Core>) {
        // The term this node last took over in: a new term is a new takeover,
        // even if this node lost and regained leadership between two ticks.
        let mut led_term: Option<u64> = None;
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let (leader, term) = {
                let m = core.node().metrics();
                (m.current_leader == Some(core.node().id()), m.current_term)
            };
            if !leader || core.node().role() != Role::Leader {
                if led_term.take().is_some() {
                    self.seen().clear();
                    self.pusher.reset();
                }
                continue;
            }
            if led_term != Some(term) {
                // Takeover: everyone connected counts as seen now.
                let now = Instant::now();
                let connected = core
                    .node()
                    .state()
                    .read(|s| s.coordination().connected_tasks());
                let mut seen = self.seen();
                seen.clear();
                for (task, _) in connected {
                    seen.insert(task, now);
                }
                led_term = Some(term);
                drop(seen);
                self.pusher.reset();
            }
            self.fire_timers(&core).await;
            core.node()
                .state()
                .read(|s| self.pusher.push_new_notices(s));
        }
    }

    async fn fire_timers(&self, core: &Core) {
        let (connected, timeout_ms, deadlines) = core.node().state().read(|s| {
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
            self.propose(core, Command::from(TasksUnhealthy { tasks: stale }))
                .await;
        }
        let now_ms = now_ms();
        for d in deadlines.into_iter().filter(|d| d.deadline_ms <= now_ms) {
            self.propose(
                core,
                Command::from(BarrierExpire {
                    id: d.id,
                    counter: d.counter,
                }),
            )
            .await;
        }
    }

    async fn propose(&self, core: &Core, command: Command) {
        let update = Update {
            command: Some(command),
            ..Default::default()
        };
        match tokio::time::timeout(PROPOSE_TIMEOUT, core.propose(update, false)).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::debug!("leader runtime proposal failed: {e}"),
            Err(_) => tracing::debug!("leader runtime proposal timed out"),
        }
    }
}
