//! The PyTorch store area's calls (journal area `torch`): what one request
//! of torch's TCPStore protocol does, whichever transport brought it (a
//! connection on a client port, or the relay's gRPC calls). Every write is
//! one proposal with the connection's own origin (the connection is a
//! client session: its id and a sequence number per request), so it is
//! exactly-once across a leader change; every read is linearizable; a
//! connection's waits live in the state, and the node that holds the
//! connection watches what it is owed on its own applied state.
//!
//! A request is served in the order this node received it, as torch's
//! one-threaded server serves it: a read waits until every write this node
//! received before it has applied (SET has no reply, so a client's SET and
//! another client's GET right after it are otherwise concurrent).
//!
//! The area also keeps the state's records of connections honest: a
//! connection that closes is forgotten (its waits dropped), batched; a
//! connection with waits is said alive every minute, so the waits of a
//! connection whose node died are dropped after
//! [`journal::torch::DEFAULT_CONNECTION_HORIZON_MS`].

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use journal::pb::outcome;
use journal::pb::torch::{self as cmd, command::Command, reply::Reply};
use journal::torch::{ConnectionView, Reader};
use journal::{Answer, Wait};
use tokio::sync::Notify;

use crate::core::{Call, CallError, CallResult, Core};

/// How often the connections with waits are said alive.
pub const TOUCH_EVERY: Duration = Duration::from_secs(60);
/// How long closed connections gather before they are forgotten at once.
const FORGET_EVERY: Duration = Duration::from_millis(200);

/// The PyTorch store area of one node.
pub struct Store {
    core: Arc<Core>,
    /// Connections of this node with a record in the state (they waited),
    /// by id: their namespace.
    live: Mutex<HashMap<u64, String>>,
    /// Closed connections to forget, by namespace.
    closed: Mutex<BTreeMap<String, Vec<u64>>>,
    closing: Notify,
    /// The writes received and not yet applied, by ticket (in arrival
    /// order), and the next ticket.
    writing: Mutex<(BTreeSet<u64>, u64)>,
    written: Notify,
}

/// A relayed connection's wait being watched on this node.
pub struct Watching<'a> {
    store: &'a Store,
    connection: u64,
}

impl Drop for Watching<'_> {
    fn drop(&mut self) {
        self.store
            .live
            .lock()
            .expect("live")
            .remove(&self.connection);
    }
}

/// A write received: it leaves the writes in flight when dropped.
struct Ticket<'a> {
    store: &'a Store,
    ticket: u64,
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        self.store
            .writing
            .lock()
            .expect("writing")
            .0
            .remove(&self.ticket);
        self.store.written.notify_waiters();
    }
}

/// A request's outcome: its reply (if the command has one), and the log
/// index it applied at.
pub struct Written {
    /// The command's reply.
    pub reply: Option<Reply>,
    /// Where it applied.
    pub index: u64,
}

impl Store {
    /// Calls through `core`; [`Store::run`] keeps the records.
    pub fn new(core: Arc<Core>) -> Arc<Self> {
        Arc::new(Store {
            core,
            live: Mutex::default(),
            closed: Mutex::default(),
            closing: Notify::new(),
            writing: Mutex::default(),
            written: Notify::new(),
        })
    }

    /// The core.
    pub fn core(&self) -> &Arc<Core> {
        &self.core
    }

    /// Proposes `command` for `call`; a domain error (a counter that is not
    /// a number, the namespace's bounds) is the call's error.
    pub async fn write(&self, call: &Call, command: impl Into<Command>) -> CallResult<Written> {
        let _ticket = self.received();
        let command: Command = command.into();
        let mut u = call.update(command);
        let applied = self.core.propose(call, &mut u).await?;
        if let Some(e) = applied.outcome.error {
            return Err(CallError::Domain(e));
        }
        let reply = match applied.outcome.reply {
            Some(outcome::Reply::Torch(r)) => r.reply,
            _ => None,
        };
        Ok(Written {
            reply,
            index: applied.log_index,
        })
    }

    /// Reads the call's namespace's store once the state is up to date (a
    /// linearizable read): what the read saw, and the index it read at.
    pub async fn read<T>(&self, call: &Call, f: impl FnOnce(Reader<'_>) -> T) -> CallResult<T> {
        self.after_earlier_writes().await;
        self.core.linearizable(call).await?;
        self.core.read(call, |n| f(n.torch()))
    }

    /// A write received now.
    fn received(&self) -> Ticket<'_> {
        let mut w = self.writing.lock().expect("writing");
        let ticket = w.1;
        w.1 += 1;
        w.0.insert(ticket);
        Ticket {
            store: self,
            ticket,
        }
    }

    /// Waits until every write received before now has applied (or failed).
    async fn after_earlier_writes(&self) {
        let before = self.writing.lock().expect("writing").1;
        loop {
            let written = self.written.notified();
            tokio::pin!(written);
            written.as_mut().enable();
            let pending = {
                let w = self.writing.lock().expect("writing");
                w.0.first().is_some_and(|first| *first < before)
            };
            if !pending {
                return;
            }
            written.await;
        }
    }

    /// Waits, from log index `index` on, until connection `connection` is
    /// owed more than `seen` STOP_WAITING or has no wait left: its view, or
    /// `None` when its record is gone (forgotten, or the job reset).
    pub async fn watch(
        &self,
        call: &Call,
        connection: u64,
        seen: u64,
        index: u64,
    ) -> CallResult<Option<ConnectionView>> {
        let wait = Wait::StoreConnection { connection, seen };
        match self.core.park(call, index, None, wait, None).await? {
            Some(Ok(Answer::Connection(view))) => Ok(view),
            Some(Ok(other)) => Err(CallError::Status(tonic::Status::internal(format!(
                "a torch wait answered {other:?}"
            )))),
            Some(Err(e)) => Err(CallError::Domain(e)),
            // No deadline: it answers or fails.
            None => Ok(None),
        }
    }

    /// Connection `connection` of namespace `namespace` has a record in the
    /// state: it is said alive until it closes.
    pub fn waited(&self, namespace: &str, connection: u64) {
        let mut live = self.live.lock().expect("live");
        live.entry(connection)
            .or_insert_with(|| namespace.to_string());
    }

    /// A relayed connection's wait is watched here until `watched` drops:
    /// this node says it is alive meanwhile.
    pub fn watching(&self, namespace: &str, connection: u64) -> Watching<'_> {
        self.waited(namespace, connection);
        Watching {
            store: self,
            connection,
        }
    }

    /// A relayed connection closed: it is forgotten (with the others closed
    /// about now).
    pub fn relayed_closed(&self, namespace: &str, connection: u64) {
        self.waited(namespace, connection);
        self.closed(connection);
    }

    /// Connection `connection` closed: if it has a record, it is forgotten
    /// (with the others closed about now).
    pub fn closed(&self, connection: u64) {
        self.core.store_sessions().closed(connection);
        let Some(ns) = self.live.lock().expect("live").remove(&connection) else {
            return;
        };
        self.closed
            .lock()
            .expect("closed")
            .entry(ns)
            .or_default()
            .push(connection);
        self.closing.notify_one();
    }

    /// Keeps the state's records of this node's connections: forgets the
    /// closed ones, and says the others alive every [`TOUCH_EVERY`]. Runs
    /// until the node stops.
    pub async fn run(self: Arc<Self>) {
        let mut touch = tokio::time::interval(TOUCH_EVERY);
        touch.tick().await;
        loop {
            tokio::select! {
                () = self.closing.notified() => {
                    tokio::time::sleep(FORGET_EVERY).await;
                    self.forget().await;
                }
                _ = touch.tick() => self.touch().await,
            }
            if self.core.parking().wakers().is_closed() {
                return;
            }
        }
    }

    async fn forget(&self) {
        let closed = std::mem::take(&mut *self.closed.lock().expect("closed"));
        for (ns, connections) in closed {
            let call = Call::internal().in_namespace(&ns);
            if let Err(e) = self.write(&call, cmd::Forget { connections }).await {
                tracing::debug!(namespace = ns, "forgetting closed torch connections: {e:?}");
            }
        }
    }

    async fn touch(&self) {
        let mut by_ns: BTreeMap<String, Vec<u64>> = BTreeMap::new();
        for (id, ns) in self.live.lock().expect("live").iter() {
            by_ns.entry(ns.clone()).or_default().push(*id);
        }
        for (ns, connections) in by_ns {
            let call = Call::internal().in_namespace(&ns);
            let touch = cmd::Touch {
                connections,
                horizon_ms: 0,
            };
            if let Err(e) = self.write(&call, touch).await {
                tracing::debug!(namespace = ns, "saying torch connections alive: {e:?}");
            }
        }
    }
}
