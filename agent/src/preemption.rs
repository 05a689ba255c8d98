//! The preemption sync manager (`docs/protocols.md`, Preemption sync): when
//! any task learns it will be preempted, every task agrees on one step to
//! stop at — the fastest task's step counter + 1 — so they all checkpoint
//! the same step. Same keys, barrier and windows as upstream, so Rust tasks
//! and stock JAX tasks can share a job:
//!
//! 1. A task's notifier fires: it inserts `RECEIVED_PREEMPTION_NOTICE` = the
//!    death time (RFC 3339).
//! 2. Every task blocks on that key; once it appears (and the death time is
//!    within the 15-minute protocol window) each task inserts its current step
//!    counter at `PREEMPTION_CURRENT_COUNTER//job:NAME/task:ID`, waits at
//!    `PREEMPTION_SYNC_BARRIER` (3 minutes), reads every counter and sets the
//!    sync point to max + 1.
//! 3. `reached_sync_point(step)` is true exactly at that step.
//!
//! A failure midway cancels the barrier so no task hangs at it.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::{watch, Mutex};
use tokio::task::JoinHandle;

use crate::agent::Agent;

/// Key holding the death time once any task received a notice.
pub const PREEMPTION_NOTICE_KEY: &str = "RECEIVED_PREEMPTION_NOTICE";
/// Directory of every task's step counter.
pub const PREEMPTION_COUNTER_DIR: &str = "PREEMPTION_CURRENT_COUNTER/";
/// The barrier all tasks meet at.
pub const PREEMPTION_BARRIER: &str = "PREEMPTION_SYNC_BARRIER";
/// Barrier timeout.
pub const PREEMPTION_BARRIER_TIMEOUT: Duration = Duration::from_secs(180);
/// The protocol starts when the death time is this close.
pub const PROTOCOL_DURATION: Duration = Duration::from_secs(15 * 60);
/// The sync point before the protocol decided one.
pub const UNSET: i64 = -1;

/// Tells a task when it will be preempted.
pub trait PreemptionNotifier: Send + Sync + 'static {
    /// A receiver that turns `Some(death time)` once a notice arrives.
    fn subscribe(&self) -> watch::Receiver<Option<SystemTime>>;
}

/// A notifier a test (or any code) drives by hand.
pub struct ManualNotifier {
    tx: watch::Sender<Option<SystemTime>>,
}

impl Default for ManualNotifier {
    fn default() -> Self {
        ManualNotifier {
            tx: watch::channel(None).0,
        }
    }
}

impl ManualNotifier {
    /// Announces preemption at `death_time`.
    pub fn notify(&self, death_time: SystemTime) {
        self.tx.send_replace(Some(death_time));
    }
}

impl PreemptionNotifier for ManualNotifier {
    fn subscribe(&self) -> watch::Receiver<Option<SystemTime>> {
        self.tx.subscribe()
    }
}

/// A notifier that fires on SIGTERM (death time = the signal's time), the
/// notice schedulers send before preempting a task.
pub struct SigtermNotifier {
    inner: ManualNotifier,
    _listener: JoinHandle<()>,
}

impl SigtermNotifier {
    /// Listens for SIGTERM (needs a tokio runtime).
    pub fn new() -> std::io::Result<SigtermNotifier> {
        let inner = ManualNotifier::default();
        let tx = inner.tx.clone();
        let mut sig = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        let listener = tokio::spawn(async move {
            if sig.recv().await.is_some() {
                tx.send_replace(Some(SystemTime::now()));
            }
        });
        Ok(SigtermNotifier {
            inner,
            _listener: listener,
        })
    }
}

impl PreemptionNotifier for SigtermNotifier {
    fn subscribe(&self) -> watch::Receiver<Option<SystemTime>> {
        self.inner.subscribe()
    }
}

/// How the protocol went.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProtocolStatus {
    /// No notice yet.
    Idle,
    /// Running.
    Running,
    /// Decided the sync point.
    Synced(i64),
    /// Failed (the barrier was cancelled or timed out, ...).
    Failed(String),
}

struct State {
    call_counter: Mutex<i64>,
    sync_counter: AtomicI64,
    status: std::sync::Mutex<ProtocolStatus>,
}

/// The preemption sync manager of one task.
pub struct PreemptionSyncManager {
    agent: Agent,
    state: Arc<State>,
    tasks: Vec<JoinHandle<()>>,
}

fn set_status(state: &State, s: ProtocolStatus) {
    *state.status.lock().unwrap_or_else(|p| p.into_inner()) = s;
}

impl PreemptionSyncManager {
    /// Starts listening to `notifier` and to the service's notice key.
    pub fn start(
        agent: Agent,
        notifier: &dyn PreemptionNotifier,
    ) -> Result<PreemptionSyncManager, tonic::Status> {
        let own = agent.own_task()?;
        let counter_key = format!(
            "{PREEMPTION_COUNTER_DIR}/job:{}/task:{}",
            own.job_name, own.task_id
        );
        let state = Arc::new(State {
            call_counter: Mutex::new(UNSET),
            sync_counter: AtomicI64::new(UNSET),
            status: std::sync::Mutex::new(ProtocolStatus::Idle),
        });
        // This task's notice → the service.
        let mut notices = notifier.subscribe();
        let a = agent.clone();
        let announce = tokio::spawn(async move {
            loop {
                let death = *notices.borrow_and_update();
                if let Some(t) = death {
                    let text = humantime::format_rfc3339_nanos(t).to_string();
                    match a.insert_key_value(PREEMPTION_NOTICE_KEY, text).await {
                        Ok(()) => tracing::info!("notified the service of preemption at {t:?}"),
                        Err(e) if e.code() == tonic::Code::AlreadyExists => {}
                        Err(e) => tracing::error!("cannot announce preemption: {e}"),
                    }
                    return;
                }
                if notices.changed().await.is_err() {
                    return;
                }
            }
        });
        // Any task's notice → the protocol.
        let (a, st) = (agent.clone(), state.clone());
        let protocol = tokio::spawn(async move {
            let notice = match a.get_key_value(PREEMPTION_NOTICE_KEY).await {
                Ok(v) => v,
                Err(e) => {
                    tracing::error!("cannot read the preemption notice: {e}");
                    let _ = a.cancel_barrier(PREEMPTION_BARRIER).await;
                    return;
                }
            };
            let death = std::str::from_utf8(&notice)
                .ok()
                .and_then(|s| humantime::parse_rfc3339_weak(s.trim()).ok());
            let Some(death) = death else {
                set_status(&st, ProtocolStatus::Failed("unparsable death time".into()));
                let _ = a.cancel_barrier(PREEMPTION_BARRIER).await;
                return;
            };
            compute_sync_point(&a, &st, &counter_key, death).await;
        });
        Ok(PreemptionSyncManager {
            agent,
            state,
            tasks: vec![announce, protocol],
        })
    }

    /// Records `step` as this task's current step and tells whether it is the
    /// agreed sync point. Waits while the protocol is deciding (so the
    /// counter it reported cannot move under it).
    pub async fn reached_sync_point(&self, step: i64) -> bool {
        let mut c = self.state.call_counter.lock().await;
        *c = step;
        self.state.sync_counter.load(Ordering::SeqCst) == step
    }

    /// The agreed sync point, if decided.
    pub fn sync_point(&self) -> Option<i64> {
        let v = self.state.sync_counter.load(Ordering::SeqCst);
        (v != UNSET).then_some(v)
    }

    /// How the protocol is doing.
    pub fn status(&self) -> ProtocolStatus {
        self.state
            .status
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Stops the manager; cancels the barrier so no other task waits at it
    /// for a task that will not come.
    pub async fn shutdown(self) {
        for t in &self.tasks {
            t.abort();
        }
        if self.sync_point().is_none() {
            let _ = self.agent.cancel_barrier(PREEMPTION_BARRIER).await;
        }
    }
}

async fn compute_sync_point(a: &Agent, st: &State, counter_key: &str, death: SystemTime) {
    if let Ok(left) = death.duration_since(SystemTime::now()) {
        if left > PROTOCOL_DURATION {
            tokio::time::sleep(left - PROTOCOL_DURATION).await;
        }
    }
    set_status(st, ProtocolStatus::Running);
    // Hold the counter until the sync point is decided (or the protocol fails).
    let counter = st.call_counter.lock().await;
    let fail = |why: String| async move {
        tracing::error!("preemption sync failed: {why}");
        set_status(st, ProtocolStatus::Failed(why));
        let _ = a.cancel_barrier(PREEMPTION_BARRIER).await;
    };
    if let Err(e) = a.insert_key_value(counter_key, counter.to_string()).await {
        return fail(format!("cannot report the call counter: {e}")).await;
    }
    if let Err(e) = a
        .wait_at_barrier(PREEMPTION_BARRIER, PREEMPTION_BARRIER_TIMEOUT, &[])
        .await
    {
        set_status(st, ProtocolStatus::Failed(format!("barrier failed: {e}")));
        return;
    }
    let counters = match a.get_key_value_dir(PREEMPTION_COUNTER_DIR).await {
        Ok(c) => c,
        Err(e) => return fail(format!("cannot read the call counters: {e}")).await,
    };
    let mut max = UNSET;
    for (k, v) in counters {
        match std::str::from_utf8(&v)
            .ok()
            .and_then(|s| s.trim().parse::<i64>().ok())
        {
            Some(c) => max = max.max(c),
            None => return fail(format!("unparsable counter at {k}")).await,
        }
    }
    if max == UNSET {
        return fail("no call counters found".into()).await;
    }
    st.sync_counter.store(max + 1, Ordering::SeqCst);
    set_status(st, ProtocolStatus::Synced(max + 1));
    drop(counter);
}
