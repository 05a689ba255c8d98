//! Wake-ups per key for parked blocking gets, and the bound on parked calls.
//!
//! A call parked on the applied state used to re-run its check after every
//! applied entry: with thousands of parked blocking gets, every write woke
//! every one of them. A blocking get now waits on its key alone: the state
//! machine tells [`KeyWaiters`] of each change where it applies it (see
//! [`storage::ApplyObserver`]), and they read the KV changes since the last
//! one (the journal's bounded change history) and wake the waiters of
//! exactly those keys, with no task in between. Everything else wakes
//! everyone: a job-epoch reset, a history that no longer reaches back far
//! enough, the state machine stopping. The other parked calls (barriers,
//! polls, registrations, rendezvous) are bounded by the number of tasks and
//! keep waiting on every apply.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;
use tonic::Status;

use journal::{DomainError, State};
use raft::RaftNode;

/// Default bound on the client calls parked on one node.
pub const DEFAULT_MAX_PARKED_CALLS: u64 = 100_000;

/// What a parked call waits for (the `kind` of the parked-calls metric).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitKind {
    /// A task's registration (the registration barrier).
    Register,
    /// WaitForAllTasks: every task connected.
    WaitForAllTasks,
    /// GetAliveTasks: the tasks' rendezvous.
    AliveTasks,
    /// A barrier.
    Barrier,
    /// The shutdown barrier.
    Shutdown,
    /// PollForError.
    PollForError,
    /// WatchJobState (a task-state change).
    WatchTasks,
    /// A blocking KV get.
    KvGet,
    /// A closure put waiting for queue space.
    ClosurePut,
    /// A worker's closure get.
    ClosureGet,
    /// A closure result fetch or a join.
    ClosureFetch,
}

impl WaitKind {
    /// Every kind, in label order.
    pub const ALL: [WaitKind; 11] = [
        WaitKind::Register,
        WaitKind::WaitForAllTasks,
        WaitKind::AliveTasks,
        WaitKind::Barrier,
        WaitKind::Shutdown,
        WaitKind::PollForError,
        WaitKind::WatchTasks,
        WaitKind::KvGet,
        WaitKind::ClosurePut,
        WaitKind::ClosureGet,
        WaitKind::ClosureFetch,
    ];

    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            WaitKind::Register => "register",
            WaitKind::WaitForAllTasks => "wait_for_all_tasks",
            WaitKind::AliveTasks => "alive_tasks",
            WaitKind::Barrier => "barrier",
            WaitKind::Shutdown => "shutdown",
            WaitKind::PollForError => "poll_for_error",
            WaitKind::WatchTasks => "watch_tasks",
            WaitKind::KvGet => "kv_get",
            WaitKind::ClosurePut => "closure_put",
            WaitKind::ClosureGet => "closure_get",
            WaitKind::ClosureFetch => "closure_fetch",
        }
    }

    fn index(self) -> usize {
        WaitKind::ALL
            .iter()
            .position(|k| *k == self)
            .unwrap_or_default()
    }
}

/// The calls parked on this node's applied state: how they wait, and how
/// many there are (in all and by kind).
pub struct Waits {
    node: Arc<RaftNode>,
    parked: AtomicU64,
    by_kind: [AtomicU64; WaitKind::ALL.len()],
    max_parked: u64,
    key_waiters: Arc<KeyWaiters>,
}

impl Waits {
    /// The waits on `node`'s applied state. Their key waiters follow the
    /// state's changes from now on (one set of waits per node).
    pub fn new(node: Arc<RaftNode>) -> Self {
        let key_waiters = Arc::new(KeyWaiters::default());
        if !node.state().observe(key_waiters.clone()) {
            tracing::error!(
                "the node's state already has an observer: blocking gets would not wake"
            );
        }
        Waits {
            node,
            parked: AtomicU64::new(0),
            by_kind: Default::default(),
            max_parked: DEFAULT_MAX_PARKED_CALLS,
            key_waiters,
        }
    }

    /// These waits with at most `max` calls parked at once (0: no bound).
    pub fn with_max_parked_calls(mut self, max: u64) -> Self {
        self.max_parked = max;
        self
    }

    /// The waiters of blocking gets, by key.
    pub fn key_waiters(&self) -> &KeyWaiters {
        &self.key_waiters
    }

    /// The last applied log index of this node.
    pub fn applied_index(&self) -> u64 {
        self.node.state().last_applied().map_or(0, |l| l.index)
    }

    /// Waits until this node has applied `index`.
    pub async fn wait_applied(&self, index: u64) -> Result<(), Status> {
        let mut rx = self.node.state().subscribe();
        while *rx.borrow_and_update() < index {
            rx.changed()
                .await
                .map_err(|_| Status::unavailable("the node is shutting down"))?;
        }
        Ok(())
    }

    /// Waits on the local state, from `log_index` on, until `check` answers.
    /// The wait belongs to job `epoch`; a job-epoch reset ends it with ABORTED.
    pub async fn wait_for<T>(
        &self,
        kind: WaitKind,
        log_index: u64,
        epoch: u64,
        mut check: impl FnMut(&State) -> Option<Result<T, DomainError>>,
    ) -> Result<Result<T, DomainError>, Status> {
        let answer = self
            .wait_until(kind, log_index, None, |s| {
                if s.epoch() != epoch {
                    Some(Err(journal::errors::epoch_reset()))
                } else {
                    check(s)
                }
            })
            .await?;
        Ok(answer.expect("a wait without a deadline ends with an answer"))
    }

    /// Waits on the local state, from `log_index` on, until `check` answers
    /// or `deadline` passes (`None`).
    pub async fn wait_until<T>(
        &self,
        kind: WaitKind,
        log_index: u64,
        deadline: Option<tokio::time::Instant>,
        mut check: impl FnMut(&State) -> Option<T>,
    ) -> Result<Option<T>, Status> {
        let applied = self.wait_applied(log_index);
        match deadline {
            None => applied.await?,
            Some(d) => match tokio::time::timeout_at(d, applied).await {
                Ok(r) => r?,
                Err(_) => return Ok(None),
            },
        }
        let state = self.node.state();
        let mut rx = state.subscribe();
        let mut parked: Option<Parked<'_>> = None;
        loop {
            rx.borrow_and_update();
            if let Some(a) = state.read(&mut check) {
                return Ok(Some(a));
            }
            // Counted from the first time the answer is not there yet until
            // the call ends (answered, or dropped with its client).
            if parked.is_none() {
                parked = Some(self.park(kind)?);
            }
            let changed = match deadline {
                None => rx.changed().await,
                Some(d) => match tokio::time::timeout_at(d, rx.changed()).await {
                    Ok(r) => r,
                    Err(_) => return Ok(None),
                },
            };
            changed.map_err(|_| Status::unavailable("the node is shutting down"))?;
        }
    }

    /// Waits on the local state, from `log_index` on, until `key` exists
    /// (its value), woken only by changes of that key (see [`crate::wake`]).
    /// The wait belongs to job `epoch`; a job-epoch reset ends it with
    /// ABORTED.
    pub async fn wait_for_key(
        &self,
        log_index: u64,
        epoch: u64,
        key: &str,
    ) -> Result<Result<bytes::Bytes, DomainError>, Status> {
        self.wait_applied(log_index).await?;
        let state = self.node.state();
        let wait = self
            .key_waiters
            .register(journal::coordination::normalize_key(key));
        let mut parked: Option<Parked<'_>> = None;
        loop {
            let woken = wait.notified();
            let answer = state.read(|s| {
                if s.epoch() != epoch {
                    Some(Err(journal::errors::epoch_reset()))
                } else {
                    s.coordination().kv_get(key).map(|v| Ok(v.clone()))
                }
            });
            if let Some(a) = answer {
                return Ok(a);
            }
            if parked.is_none() {
                parked = Some(self.park(WaitKind::KvGet)?);
            }
            woken.await;
            if self.key_waiters.is_closed() {
                return Err(Status::unavailable("the node is shutting down"));
            }
        }
    }

    /// Client calls parked on this node's applied state right now.
    pub fn parked_calls(&self) -> u64 {
        self.parked.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The same by kind.
    pub fn parked_by_kind(&self) -> Vec<(WaitKind, u64)> {
        WaitKind::ALL
            .iter()
            .map(|k| (*k, self.by_kind[k.index()].load(Ordering::Relaxed)))
            .collect()
    }

    fn park(&self, kind: WaitKind) -> Result<Parked<'_>, Status> {
        Parked::new(&self.parked, &self.by_kind[kind.index()], self.max_parked)
    }
}

/// The waiters of each key, by normalised key.
#[derive(Default)]
pub struct KeyWaiters {
    keys: Mutex<HashMap<String, Arc<Notify>>>,
    /// Woken on what concerns every waiter (epoch reset, lost history,
    /// shutdown).
    all: Notify,
    /// The node stopped applying (shutting down).
    closed: std::sync::atomic::AtomicBool,
    /// The KV revision and job epoch of the state when last told of a
    /// change (`None` before the first).
    seen: Mutex<Option<(u64, u64)>>,
}

/// One waiter's registration; dropping it forgets the key when it was the
/// last waiter.
pub struct KeyWait<'a> {
    waiters: &'a KeyWaiters,
    key: String,
    notify: Arc<Notify>,
}

impl KeyWait<'_> {
    /// Completes on the next wake-up of this key or of everyone. Create it
    /// **before** looking at the state: a wake-up between the look and the
    /// wait is then not lost.
    pub fn notified(&self) -> impl std::future::Future<Output = ()> + '_ {
        let key = self.notify.notified();
        let all = self.waiters.all.notified();
        async move {
            tokio::select! {
                () = key => {}
                () = all => {}
            }
        }
    }
}

impl Drop for KeyWait<'_> {
    fn drop(&mut self) {
        let mut keys = self.waiters.lock();
        // The map's reference and this one: nobody else waits on the key.
        if Arc::strong_count(&self.notify) == 2 {
            keys.remove(&self.key);
        }
    }
}

impl KeyWaiters {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Notify>>> {
        self.keys.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers a waiter on `key` (normalised).
    pub fn register(&self, key: String) -> KeyWait<'_> {
        let notify = self.lock().entry(key.clone()).or_default().clone();
        KeyWait {
            waiters: self,
            key,
            notify,
        }
    }

    /// Whether the node stopped applying: waiters give up.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Relaxed)
    }

    /// Keys with at least one waiter.
    pub fn waited_keys(&self) -> usize {
        self.lock().len()
    }

    fn wake<'k>(&self, keys: impl IntoIterator<Item = &'k str>) {
        let waiters = self.lock();
        for key in keys {
            if let Some(n) = waiters.get(key) {
                n.notify_waiters();
            }
        }
    }

    fn wake_all(&self) {
        self.all.notify_waiters();
    }
}

/// The answer of a parked call waiting for `wait` (see `journal::wait`).
pub(crate) fn answer(
    s: &State,
    mut wait: journal::Wait,
) -> Option<Result<journal::Answer, DomainError>> {
    s.wait_result(None, &mut wait)
}

impl storage::ApplyObserver for KeyWaiters {
    fn changed(&self, state: &State, _touched: &journal::Touched) {
        let now = (state.coordination().kv_revision(), state.epoch());
        let before = self
            .seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .replace(now);
        let Some((revision, epoch)) = before else {
            return;
        };
        if (revision, epoch) == now || self.waited_keys() == 0 {
            return;
        }
        // A job-epoch reset or a snapshot from before `revision` (a
        // reinstalled state) concern every waiter; so does a history that no
        // longer reaches back to `revision`.
        let events = match state.coordination().kv_events_after(revision) {
            Ok(events) if now.1 == epoch && now.0 >= revision => events,
            _ => return self.wake_all(),
        };
        self.wake(events.iter().filter(|e| !e.deleted).map(|e| e.key.as_str()));
    }

    fn stopped(&self) {
        self.closed.store(true, Ordering::Relaxed);
        self.wake_all();
    }
}

/// One parked call, counted (in all and in its kind) while it lives.
pub struct Parked<'a>(&'a AtomicU64, &'a AtomicU64);

impl<'a> Parked<'a> {
    /// Counts a call as parked in `count` and `kind`, or refuses it past
    /// `max` parked calls.
    pub fn new(count: &'a AtomicU64, kind: &'a AtomicU64, max: u64) -> Result<Self, Status> {
        let before = count.fetch_add(1, Ordering::Relaxed);
        if max > 0 && before >= max {
            count.fetch_sub(1, Ordering::Relaxed);
            return Err(Status::resource_exhausted(format!(
                "{before} calls are already parked on this node, its limit \
                 (--max-parked-calls {max}); retry later or raise the limit"
            )));
        }
        kind.fetch_add(1, Ordering::Relaxed);
        Ok(Parked(count, kind))
    }
}

impl Drop for Parked<'_> {
    fn drop(&mut self) {
        self.1.fetch_sub(1, Ordering::Relaxed);
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use journal::pb::{coordination::KvInsert, update::Command, ResetJobEpoch};
    use journal::Update;
    use std::future::Future;
    use storage::ApplyObserver;

    fn insert(key: &str) -> Update {
        Update {
            command: Some(Command::from(KvInsert {
                key: key.into(),
                value: "v".into(),
                allow_overwrite: true,
            })),
            ..Default::default()
        }
    }

    /// Whether `f` wakes a waiter that was waiting before it ran.
    fn woken(wait: &KeyWait<'_>, f: impl FnOnce()) -> bool {
        let mut n = std::pin::pin!(wait.notified());
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        assert!(n.as_mut().poll(&mut cx).is_pending(), "woken before");
        f();
        n.as_mut().poll(&mut cx).is_ready()
    }

    #[test]
    fn a_change_wakes_the_waiters_of_exactly_the_keys_it_wrote() {
        let waiters = KeyWaiters::default();
        let mut state = State::new();
        waiters.changed(&state, &journal::Touched::default());
        let (a, b) = (waiters.register("a".into()), waiters.register("b".into()));
        state.apply(&insert("a"));
        assert!(woken(&a, || waiters.changed(&state, &journal::Touched::default())));
        state.apply(&insert("a"));
        assert!(!woken(&b, || waiters.changed(&state, &journal::Touched::default())));
        state.apply(&insert("c"));
        state.apply(&insert("b"));
        // Every key since the last change it was told of.
        assert!(woken(&b, || waiters.changed(&state, &journal::Touched::default())));
        // Nothing new: nobody.
        assert!(!woken(&a, || waiters.changed(&state, &journal::Touched::default())));
        drop(a);
        assert_eq!(waiters.waited_keys(), 1);
    }

    #[test]
    fn an_epoch_reset_or_an_older_state_wakes_everyone() {
        let waiters = KeyWaiters::default();
        let mut state = State::new();
        state.apply(&insert("x"));
        let older = state.clone();
        state.apply(&insert("y"));
        state.apply(&insert("z"));
        waiters.changed(&state, &journal::Touched::default());
        let a = waiters.register("a".into());
        // A snapshot installed from behind what was seen, same epoch.
        assert!(woken(&a, || waiters.changed(&older, &journal::Touched::default())));
        waiters.changed(&state, &journal::Touched::default());
        state.apply(&Update {
            command: Some(Command::ResetJobEpoch(ResetJobEpoch::default())),
            ..Default::default()
        });
        assert!(woken(&a, || waiters.changed(&state, &journal::Touched::default())));
    }

    #[test]
    fn a_stopped_state_machine_wakes_everyone_and_closes() {
        let waiters = KeyWaiters::default();
        waiters.changed(&State::new(), &journal::Touched::default());
        let a = waiters.register("a".into());
        assert!(woken(&a, || waiters.stopped()));
        assert!(waiters.is_closed());
    }
}
