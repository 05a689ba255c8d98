//! The parked-call engine: every call that waits on the applied state — a
//! registration, a barrier, a poll, a blocking get, a closure get or fetch,
//! a watch — waits here, and is woken only by a change of one of the
//! objects its answer depends on (its key, barrier, task, queue: see
//! `journal::wait`), as etcd's watchable store wakes the watchers of a key.
//!
//! The state machine tells [`Wakers`] what each run of applies touched
//! (`storage::ApplyObserver`), where it applies them, with no task in
//! between; the wakers wake the waiters of exactly those objects (and of
//! the directories above a key, for watches). What concerns everyone — a
//! job epoch reset, a snapshot installed, the node stopping — wakes
//! everyone. A woken waiter re-reads its answer (`State::wait_result`).
//! Waits are counted, in all, by kind and by namespace, and bounded (per
//! node, and per namespace by its `--max-parked-calls`). Every object is
//! a namespace's: the same key in two namespaces has waiters apart.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use journal::{Answer, DomainError, Object, State, Touched, Wait};
use raft::RaftNode;

use super::{CallError, CallResult};
use tokio::sync::futures::Notified;
use tokio::sync::Notify;
use tokio::time::Instant;
use tonic::Status;

/// Default bound on the client calls parked on one node: a stock jaxlib
/// task keeps two long polls parked (PollForError and the preemption
/// notice's GetKeyValue) and a third call while it registers or waits at a
/// barrier, so this holds a 100,000-task job whose tasks all dial one node.
pub const DEFAULT_MAX_PARKED_CALLS: u64 = 400_000;

/// The kinds of parked calls (`journal::Wait::kind`), in label order: the
/// `kind` label of the parked-calls metric.
pub const KINDS: [&str; 13] = [
    "register",
    "wait_for_all_tasks",
    "alive_tasks",
    "barrier",
    "shutdown",
    "poll_for_error",
    "watch_tasks",
    "kv_get",
    "closure_put",
    "closure_get",
    "closure_fetch",
    "torch_wait",
    "rendezvous",
];

fn kind_index(kind: &str) -> usize {
    KINDS.iter().position(|k| *k == kind).unwrap_or_default()
}

/// A parked wait's answer: `None` when its deadline passed first.
pub type Parked = Option<Result<Answer, DomainError>>;

/// The calls parked on this node's applied state: how they wait, and how
/// The longest a call waits for this node to apply an index its leader
/// gave (see [`Parking::wait_applied`]).
pub const APPLY_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// many there are (in all, by kind and by namespace).
pub struct Parking {
    node: Arc<RaftNode>,
    parked: AtomicU64,
    by_kind: [AtomicU64; KINDS.len()],
    /// Calls parked by namespace (key: "" for the default one).
    by_namespace: Mutex<HashMap<String, u64>>,
    max_parked: u64,
    wakers: Arc<Wakers>,
}

impl Parking {
    /// The parked calls of `node`: their wakers follow the state's changes
    /// from now on (one engine per node).
    pub fn new(node: Arc<RaftNode>) -> Self {
        let wakers = Arc::new(Wakers::default());
        if !node.state().observe(wakers.clone()) {
            tracing::error!(
                "the node's state already has an observer: parked calls would not wake"
            );
        }
        Parking {
            node,
            parked: AtomicU64::new(0),
            by_kind: Default::default(),
            by_namespace: Mutex::default(),
            max_parked: DEFAULT_MAX_PARKED_CALLS,
            wakers,
        }
    }

    /// The same engine with at most `max` calls parked at once (0: no bound).
    pub fn with_max_parked_calls(mut self, max: u64) -> Self {
        self.max_parked = max;
        self
    }

    /// The wakers of parked calls, by object.
    pub fn wakers(&self) -> &Arc<Wakers> {
        &self.wakers
    }

    /// The last applied log index of this node.
    pub fn applied_index(&self) -> u64 {
        self.node.state().last_applied().map_or(0, |l| l.index)
    }

    /// Waits until this node has applied `index`, for at most
    /// [`APPLY_WAIT`]: a node that does not apply what its leader committed
    /// in that time answers UNAVAILABLE (its clients, relays and agents
    /// retry) rather than hold the call.
    pub async fn wait_applied(&self, index: u64) -> CallResult<()> {
        let mut rx = self.node.state().subscribe();
        let applied = async {
            while *rx.borrow_and_update() < index {
                rx.changed().await.map_err(|_| shutting_down())?;
            }
            Ok(())
        };
        match tokio::time::timeout(APPLY_WAIT, applied).await {
            Ok(r) => r,
            Err(_) => Err(Status::unavailable(format!(
                "this node did not apply log index {index} within {} s (it is at {})",
                APPLY_WAIT.as_secs(),
                self.applied_index()
            ))
            .into()),
        }
    }

    /// Waits, on this node's state from log index `index` on, until `wait`
    /// in namespace `ns` (its key) answers, or `deadline` passes (`None`:
    /// no limit; `Ok(None)` then). A wait that belongs to job `epoch` ends
    /// with ABORTED once another epoch began, and every wait ends when its
    /// namespace is deleted. The call counts as parked from the first time
    /// its answer is not there until it ends; past the bound (the node's,
    /// or its namespace's) it is refused with RESOURCE_EXHAUSTED.
    pub async fn park(
        &self,
        ns: &str,
        index: u64,
        epoch: Option<u64>,
        mut wait: Wait,
        deadline: Option<Instant>,
    ) -> CallResult<Parked> {
        let applied = self.wait_applied(index);
        match deadline {
            None => applied.await?,
            Some(d) => match tokio::time::timeout_at(d, applied).await {
                Ok(r) => r?,
                Err(_) => return Ok(None),
            },
        }
        let state = self.node.state();
        let (objects, limit) = state.read(|s| match s.namespace(ns) {
            Some(n) => (wait.objects(&n), n.spec().map_or(0, |p| p.max_parked_calls)),
            None => (Vec::new(), 0),
        });
        let waiting = self.wakers.register(ns, objects, Vec::new());
        let mut parked: Option<Counted<'_>> = None;
        loop {
            // Before looking: a change between the look and the wait wakes it.
            let woken = waiting.notified();
            if let Some(a) = state.read(|s| s.wait_result(ns, epoch, &mut wait)) {
                return Ok(Some(a));
            }
            if parked.is_none() {
                parked = Some(self.count(ns, wait.kind(), limit)?);
            }
            match deadline {
                None => woken.await,
                Some(d) => {
                    if tokio::time::timeout_at(d, woken).await.is_err() {
                        return Ok(None);
                    }
                }
            }
            if self.wakers.is_closed() {
                return Err(shutting_down().into());
            }
        }
    }

    /// Client calls parked on this node right now.
    pub fn parked_calls(&self) -> u64 {
        self.parked.load(Ordering::Relaxed)
    }

    /// The same by kind ([`KINDS`]).
    pub fn parked_by_kind(&self) -> Vec<(&'static str, u64)> {
        KINDS
            .iter()
            .enumerate()
            .map(|(i, k)| (*k, self.by_kind[i].load(Ordering::Relaxed)))
            .collect()
    }

    /// Calls parked on this node in namespace `ns` (its key).
    pub fn parked_in(&self, ns: &str) -> u64 {
        self.namespaces().get(ns).copied().unwrap_or(0)
    }

    fn namespaces(&self) -> MutexGuard<'_, HashMap<String, u64>> {
        self.by_namespace.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts a call of `kind` in namespace `ns` as parked, or refuses it
    /// past the node's bound or the namespace's `limit` (0: none).
    fn count(&self, ns: &str, kind: &str, limit: u64) -> CallResult<Counted<'_>> {
        {
            let mut by_ns = self.namespaces();
            let here = by_ns.entry(ns.to_string()).or_default();
            if limit > 0 && *here >= limit {
                let name = journal::namespace::namespace_name(ns);
                return Err(Status::resource_exhausted(format!(
                    "namespace {name}: {here} calls are already parked in it on this node, \
                     its limit (--max-parked-calls {limit}); retry later or raise the limit"
                ))
                .into());
            }
            *here += 1;
        }
        let before = self.parked.fetch_add(1, Ordering::Relaxed);
        if self.max_parked > 0 && before >= self.max_parked {
            self.parked.fetch_sub(1, Ordering::Relaxed);
            self.uncount_namespace(ns);
            return Err(CallError::from(Status::resource_exhausted(format!(
                "{before} calls are already parked on this node, its limit \
                 (--max-parked-calls {}); retry later or raise the limit",
                self.max_parked
            ))));
        }
        debug_assert!(
            KINDS.contains(&kind),
            "a parked call of a known kind: {kind}"
        );
        let kind = &self.by_kind[kind_index(kind)];
        kind.fetch_add(1, Ordering::Relaxed);
        Ok(Counted {
            parking: self,
            kind,
            ns: ns.to_string(),
        })
    }

    fn uncount_namespace(&self, ns: &str) {
        let mut by_ns = self.namespaces();
        let counted = by_ns.get_mut(ns);
        debug_assert!(
            counted.as_deref().is_some_and(|n| *n > 0),
            "a call uncounted in namespace {ns:?} was counted there"
        );
        if let Some(n) = counted {
            *n -= 1;
            if *n == 0 {
                by_ns.remove(ns);
            }
        }
    }
}

fn shutting_down() -> Status {
    Status::unavailable("the node is shutting down")
}

/// One parked call, counted (in all, in its kind and in its namespace)
/// while it lives.
struct Counted<'a> {
    parking: &'a Parking,
    kind: &'a AtomicU64,
    ns: String,
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        let kind = self.kind.fetch_sub(1, Ordering::Relaxed);
        let all = self.parking.parked.fetch_sub(1, Ordering::Relaxed);
        debug_assert!(
            kind > 0 && all > 0,
            "a parked call counted once, uncounted once"
        );
        self.parking.uncount_namespace(&self.ns);
    }
}

/// The waiters of one object (or directory): woken together.
#[derive(Default)]
pub struct Waiters {
    notify: Notify,
    /// How many times they were woken.
    wakeups: AtomicU64,
}

impl Waiters {
    fn wake(&self) {
        self.wakeups.fetch_add(1, Ordering::Relaxed);
        self.notify.notify_waiters();
    }
}

type Table<K> = Mutex<HashMap<K, Arc<Waiters>>>;

/// A namespace's key ("" for the default one) with what in it is waited on.
type In<K> = (String, K);

/// The waiters of parked calls by object, and of watches by directory, in
/// each namespace.
#[derive(Default)]
pub struct Wakers {
    objects: Table<In<Object>>,
    /// Watches of every key under a directory (normalised; "" is all).
    dirs: Table<In<String>>,
    /// Every waiter of a namespace (woken on its reset, delete, ...).
    namespaces: Table<String>,
    /// Woken on what concerns every waiter.
    all: Notify,
    /// Woken when a namespace is created or deleted.
    namespace_set: Notify,
    /// The node stopped applying (shutting down).
    closed: AtomicBool,
}

fn lock<K>(t: &Table<K>) -> MutexGuard<'_, HashMap<K, Arc<Waiters>>> {
    t.lock().unwrap_or_else(|p| p.into_inner())
}

impl Wakers {
    /// Registers a waiter in namespace `ns` (its key) on `objects`, on
    /// every key under `dirs`, and on what concerns the whole namespace.
    pub fn register(&self, ns: &str, objects: Vec<Object>, dirs: Vec<String>) -> Registration<'_> {
        fn enter<K: Clone + std::hash::Hash + Eq>(
            t: &Table<K>,
            keys: impl IntoIterator<Item = K>,
        ) -> Vec<(K, Arc<Waiters>)> {
            let mut t = lock(t);
            keys.into_iter()
                .map(|k| {
                    let w = t.entry(k.clone()).or_default().clone();
                    (k, w)
                })
                .collect()
        }
        Registration {
            wakers: self,
            objects: enter(
                &self.objects,
                objects.into_iter().map(|o| (ns.to_string(), o)),
            ),
            dirs: enter(&self.dirs, dirs.into_iter().map(|d| (ns.to_string(), d))),
            namespace: enter(&self.namespaces, [ns.to_string()]),
        }
    }

    /// Completes on the next create or delete of a namespace (create it
    /// before looking at the namespaces, as [`Registration::notified`]).
    pub fn namespace_changes(&self) -> Notified<'_> {
        self.namespace_set.notified()
    }

    /// Whether the node stopped applying: waiters give up.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Relaxed)
    }

    /// Objects, directories and namespaces with at least one waiter.
    pub fn waited(&self) -> usize {
        lock(&self.objects).len() + lock(&self.dirs).len() + lock(&self.namespaces).len()
    }

    /// How many times the waiters of `object` in namespace `ns` (its key)
    /// were woken (0 if none wait).
    pub fn wakeups(&self, ns: &str, object: &Object) -> u64 {
        lock(&self.objects)
            .get(&(ns.to_string(), object.clone()))
            .map_or(0, |w| w.wakeups.load(Ordering::Relaxed))
    }

    /// Wakes the waiters of what `touched` names.
    pub fn wake(&self, touched: &Touched) {
        if touched.namespace_set {
            self.namespace_set.notify_waiters();
        }
        if touched.all {
            self.all.notify_waiters();
            return;
        }
        let mut woken: Vec<Arc<Waiters>> = Vec::new();
        if !touched.namespaces.is_empty() {
            let t = lock(&self.namespaces);
            woken.extend(
                touched
                    .namespaces
                    .iter()
                    .filter_map(|ns| t.get(ns).cloned()),
            );
        }
        {
            let t = lock(&self.objects);
            if !t.is_empty() {
                woken.extend(touched.objects.iter().filter_map(|o| t.get(o).cloned()));
            }
        }
        {
            let t = lock(&self.dirs);
            if !t.is_empty() {
                let mut dir = (String::new(), String::new());
                for (ns, o) in &touched.objects {
                    if let Object::Key(key) = o {
                        for d in dirs_of(key) {
                            dir.0.clone_from(ns);
                            dir.1.clear();
                            dir.1.push_str(d);
                            woken.extend(t.get(&dir).cloned());
                        }
                    }
                }
            }
        }
        // An object touched twice is woken once.
        woken.sort_by_key(Arc::as_ptr);
        woken.dedup_by_key(|w| Arc::as_ptr(w));
        for w in woken {
            w.wake();
        }
    }

    fn forget(
        &self,
        objects: &[(In<Object>, Arc<Waiters>)],
        dirs: &[(In<String>, Arc<Waiters>)],
        namespace: &[(String, Arc<Waiters>)],
    ) {
        fn drop_unused<K: std::hash::Hash + Eq>(t: &Table<K>, mine: &[(K, Arc<Waiters>)]) {
            if mine.is_empty() {
                return;
            }
            let mut t = lock(t);
            for (k, w) in mine {
                // The table's reference and this one: nobody else waits.
                if Arc::strong_count(w) == 2 {
                    t.remove(k);
                }
            }
        }
        drop_unused(&self.objects, objects);
        drop_unused(&self.dirs, dirs);
        drop_unused(&self.namespaces, namespace);
    }
}

/// `key` and every directory above it, nearest first, "" last: the
/// directories whose watches cover a change of `key`.
fn dirs_of(key: &str) -> impl Iterator<Item = &str> {
    let mut next = Some(key);
    std::iter::from_fn(move || {
        let d = next?;
        next = match d.rfind('/') {
            Some(i) => Some(&d[..i]),
            None if d.is_empty() => None,
            None => Some(""),
        };
        Some(d)
    })
}

impl storage::ApplyObserver for Wakers {
    fn changed(&self, _state: &State, touched: &Touched) {
        self.wake(touched);
    }

    fn stopped(&self) {
        self.closed.store(true, Ordering::Relaxed);
        self.all.notify_waiters();
        self.namespace_set.notify_waiters();
    }
}

/// One waiter's registration; dropping it forgets the objects nobody else
/// waits on.
pub struct Registration<'a> {
    wakers: &'a Wakers,
    objects: Vec<(In<Object>, Arc<Waiters>)>,
    dirs: Vec<(In<String>, Arc<Waiters>)>,
    namespace: Vec<(String, Arc<Waiters>)>,
}

impl Registration<'_> {
    /// Completes on the next wake-up of one of the registered objects or of
    /// everyone. Create it **before** looking at the state: a wake-up
    /// between the look and the wait is then not lost.
    pub fn notified(&self) -> AnyNotified<'_> {
        let all = std::iter::once(self.wakers.all.notified());
        let each = self
            .objects
            .iter()
            .map(|(_, w)| w)
            .chain(self.dirs.iter().map(|(_, w)| w))
            .chain(self.namespace.iter().map(|(_, w)| w))
            .map(|w| w.notify.notified());
        AnyNotified(all.chain(each).map(Box::pin).collect())
    }
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        self.wakers
            .forget(&self.objects, &self.dirs, &self.namespace);
    }
}

/// The first of several wake-ups.
pub struct AnyNotified<'a>(Vec<Pin<Box<Notified<'a>>>>);

impl Future for AnyNotified<'_> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        for n in &mut self.0 {
            if n.as_mut().poll(cx).is_ready() {
                return Poll::Ready(());
            }
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests;
