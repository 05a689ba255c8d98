//! Wake-ups per key for parked blocking gets, and the bound on parked calls.
//!
//! A call parked on the applied state used to re-run its check after every
//! applied entry: with thousands of parked blocking gets, every write woke
//! every one of them. A blocking get now waits on its key alone: one task
//! per node follows the applied state, reads the KV changes since it last
//! looked (the journal's bounded change history) and wakes the waiters of
//! exactly those keys. Everything else wakes everyone: a job-epoch reset, a
//! history that no longer reaches back far enough, the node shutting down.
//! The other parked calls (barriers, polls, registrations, rendezvous) are
//! bounded by the number of tasks and keep waiting on every apply.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;
use tonic::Status;

use crate::core::Core;

/// Default bound on the client calls parked on one node.
pub const DEFAULT_MAX_PARKED_CALLS: u64 = 100_000;

/// The waiters of each key, by normalised key.
#[derive(Default)]
pub struct KeyWaiters {
    keys: Mutex<HashMap<String, Arc<Notify>>>,
    /// Woken on what concerns every waiter (epoch reset, lost history,
    /// shutdown).
    all: Notify,
    /// The node stopped applying (shutting down).
    closed: std::sync::atomic::AtomicBool,
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

    fn wake(&self, key: &str) {
        if let Some(n) = self.lock().get(key) {
            n.notify_waiters();
        }
    }

    fn wake_all(&self) {
        self.all.notify_waiters();
    }
}

/// Follows this node's applied state and wakes the waiters of the keys that
/// changed. Runs for the life of the node.
pub async fn run_key_wakeups(core: Arc<Core>) {
    let state = core.node().state();
    let mut rx = state.subscribe();
    let (mut revision, mut epoch) = state.read(|s| (s.coordination().kv_revision(), s.epoch()));
    loop {
        if rx.changed().await.is_err() {
            core.key_waiters().closed.store(true, Ordering::Relaxed);
            core.key_waiters().wake_all();
            return;
        }
        rx.borrow_and_update();
        let waiters = core.key_waiters();
        if waiters.waited_keys() == 0 {
            (revision, epoch) = state.read(|s| (s.coordination().kv_revision(), s.epoch()));
            continue;
        }
        let (changed, now_revision, now_epoch) = state.read(|s| {
            let changed = match s.coordination().kv_events_after(revision) {
                Ok(events) => Some(
                    events
                        .iter()
                        .filter(|e| !e.deleted)
                        .map(|e| e.key.clone())
                        .collect::<Vec<_>>(),
                ),
                Err(_) => None,
            };
            (changed, s.coordination().kv_revision(), s.epoch())
        });
        match changed {
            Some(keys) if now_epoch == epoch => {
                for k in keys {
                    waiters.wake(&k);
                }
            }
            _ => waiters.wake_all(),
        }
        (revision, epoch) = (now_revision, now_epoch);
    }
}

/// One parked call, counted while it lives.
pub struct Parked<'a>(&'a AtomicU64);

impl<'a> Parked<'a> {
    /// Counts a call as parked, or refuses it past `max` parked calls.
    pub fn new(count: &'a AtomicU64, max: u64) -> Result<Self, Status> {
        let before = count.fetch_add(1, Ordering::Relaxed);
        if max > 0 && before >= max {
            count.fetch_sub(1, Ordering::Relaxed);
            return Err(Status::resource_exhausted(format!(
                "{before} calls are already parked on this node, its limit \
                 (--max-parked-calls {max}); retry later or raise the limit"
            )));
        }
        Ok(Parked(count))
    }
}

impl Drop for Parked<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}
