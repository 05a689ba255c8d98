//! What this node alone knows of the store sessions it holds (a PyTorch
//! TCPStore connection, or a relayed one whose request reached it): the
//! client's address and the pid its handshake's PING sent, the wait it
//! stands in and since when, the keys its clients ADD to (what a store
//! barrier counts) and when a client last wrote. The replicated state
//! knows which connection waits on which key; only the node that holds a
//! connection knows who and since when. Memory only, bounded, never a log
//! entry: the operators' view asks every node for it (`StoreFacts`).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Counters remembered per namespace: past it the least recently added to
/// is forgotten.
pub const MAX_COUNTERS: usize = 256;

/// One session as its node knows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionFacts {
    /// The session id (the state's record of the connection).
    pub id: u64,
    /// The client's address ("" for a relayed connection: the relay knows).
    pub address: String,
    /// The pid the client's handshake sent (0: none yet).
    pub pid: u32,
    /// How long it has stood in its wait, if it waits.
    pub waited: Option<Duration>,
    /// A relayed connection (its relay holds the socket).
    pub relayed: bool,
}

/// A key clients ADD to, as this node saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CounterFacts {
    /// The key.
    pub key: String,
    /// ADDs (and BARRIER arrivals) this node served.
    pub adds: u64,
    /// Since the last of them.
    pub since_last: Duration,
    /// The world size a BARRIER on it named (0: none).
    pub world_size: i64,
}

/// This node's facts of one namespace's sessions.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NamespaceFacts {
    /// Its sessions, by id.
    pub sessions: Vec<SessionFacts>,
    /// Its counters, by key.
    pub counters: Vec<CounterFacts>,
    /// Since a client last wrote through this node.
    pub since_write: Option<Duration>,
}

#[derive(Debug)]
struct Wait {
    keys: Vec<String>,
    since: Instant,
}

#[derive(Debug)]
struct Session {
    namespace: String,
    address: Option<SocketAddr>,
    pid: u32,
    relayed: bool,
    wait: Option<Wait>,
    /// The wait its client last cancelled (a timeout): a wait on the same
    /// keys right after it goes on counting from its start, as a store
    /// barrier's loop of timed waits is one wait.
    cancelled: Option<Wait>,
}

#[derive(Debug)]
struct Counter {
    adds: u64,
    last: Instant,
    world_size: i64,
}

#[derive(Debug, Default)]
struct Namespace {
    counters: HashMap<String, Counter>,
    last_write: Option<Instant>,
}

#[derive(Debug, Default)]
struct Inner {
    sessions: HashMap<u64, Session>,
    namespaces: HashMap<String, Namespace>,
}

/// The store sessions of this node (see the module).
#[derive(Debug, Default)]
pub struct StoreSessions {
    inner: Mutex<Inner>,
}

impl StoreSessions {
    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn session(&self, id: u64, namespace: &str, relayed: bool) -> SessionGuard<'_> {
        let mut inner = self.inner();
        inner.sessions.entry(id).or_insert_with(|| Session {
            namespace: namespace.to_string(),
            address: None,
            pid: 0,
            relayed,
            wait: None,
            cancelled: None,
        });
        SessionGuard { inner, id }
    }

    /// Connection `id` of `namespace` opened from `address`.
    pub fn opened(&self, id: u64, namespace: &str, address: Option<SocketAddr>) {
        self.session(id, namespace, false).get().address = address;
    }

    /// Its client's handshake PING sent `pid` (the first PING only).
    pub fn pinged(&self, id: u64, namespace: &str, relayed: bool, pid: u32) {
        let mut s = self.session(id, namespace, relayed);
        let s = s.get();
        if s.pid == 0 {
            s.pid = pid;
        }
    }

    /// It stands in a wait on `keys` from now (a relayed connection's wait
    /// is known to the node that served its WAIT).
    pub fn waiting(&self, id: u64, namespace: &str, relayed: bool, keys: Vec<String>) {
        let now = Instant::now();
        let mut s = self.session(id, namespace, relayed);
        let s = s.get();
        let since = match s.cancelled.take() {
            Some(c) if c.keys == keys => c.since,
            _ => s
                .wait
                .as_ref()
                .filter(|w| w.keys == keys)
                .map_or(now, |w| w.since),
        };
        s.wait = Some(Wait { keys, since });
    }

    /// Its wait ended: released (every key written).
    pub fn released(&self, id: u64) {
        if let Some(s) = self.inner().sessions.get_mut(&id) {
            s.wait = None;
            s.cancelled = None;
        }
    }

    /// Its client cancelled its wait (its timeout).
    pub fn cancelled(&self, id: u64) {
        if let Some(s) = self.inner().sessions.get_mut(&id) {
            s.cancelled = s.wait.take().or(s.cancelled.take());
        }
    }

    /// It closed: forgotten.
    pub fn closed(&self, id: u64) {
        self.inner().sessions.remove(&id);
    }

    /// A client wrote to `namespace`'s store through this node; an ADD (or a
    /// BARRIER arrival, with its world size) to `counter`.
    pub fn wrote(&self, namespace: &str, counter: Option<(&str, Option<i64>)>) {
        let now = Instant::now();
        let mut inner = self.inner();
        let ns = inner.namespaces.entry(namespace.to_string()).or_default();
        ns.last_write = Some(now);
        let Some((key, world_size)) = counter else {
            return;
        };
        if !ns.counters.contains_key(key) && ns.counters.len() >= MAX_COUNTERS {
            let oldest = ns.counters.iter().min_by_key(|(_, c)| c.last);
            if let Some(k) = oldest.map(|(k, _)| k.clone()) {
                ns.counters.remove(&k);
            }
        }
        let c = ns.counters.entry(key.to_string()).or_insert(Counter {
            adds: 0,
            last: now,
            world_size: 0,
        });
        c.adds += 1;
        c.last = now;
        if let Some(w) = world_size {
            c.world_size = w;
        }
    }

    /// This node's facts of `namespace`'s sessions.
    pub fn of(&self, namespace: &str) -> NamespaceFacts {
        let now = Instant::now();
        let inner = self.inner();
        let mut sessions: Vec<SessionFacts> = inner
            .sessions
            .iter()
            .filter(|(_, s)| s.namespace == namespace)
            .map(|(id, s)| SessionFacts {
                id: *id,
                address: s.address.map(|a| a.to_string()).unwrap_or_default(),
                pid: s.pid,
                waited: s
                    .wait
                    .as_ref()
                    .map(|w| now.saturating_duration_since(w.since)),
                relayed: s.relayed,
            })
            .collect();
        sessions.sort_by_key(|s| s.id);
        let ns = inner.namespaces.get(namespace);
        let mut counters: Vec<CounterFacts> = ns
            .map(|n| {
                n.counters
                    .iter()
                    .map(|(k, c)| CounterFacts {
                        key: k.clone(),
                        adds: c.adds,
                        since_last: now.saturating_duration_since(c.last),
                        world_size: c.world_size,
                    })
                    .collect()
            })
            .unwrap_or_default();
        counters.sort_by(|a, b| a.key.cmp(&b.key));
        NamespaceFacts {
            sessions,
            counters,
            since_write: ns
                .and_then(|n| n.last_write)
                .map(|t| now.saturating_duration_since(t)),
        }
    }

    /// The longest wait of this node's sessions, by namespace (the metrics'
    /// gauge of stuck store waits).
    pub fn oldest_waits(&self) -> HashMap<String, Duration> {
        let now = Instant::now();
        let mut by: HashMap<String, Duration> = HashMap::new();
        for s in self.inner().sessions.values() {
            if let Some(w) = &s.wait {
                let d = now.saturating_duration_since(w.since);
                let e = by.entry(s.namespace.clone()).or_default();
                *e = (*e).max(d);
            }
        }
        by
    }
}

/// A session, held under the lock.
struct SessionGuard<'a> {
    inner: std::sync::MutexGuard<'a, Inner>,
    id: u64,
}

impl SessionGuard<'_> {
    fn get(&mut self) -> &mut Session {
        self.inner
            .sessions
            .get_mut(&self.id)
            .expect("the session was just made")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(k: &[&str]) -> Vec<String> {
        k.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_connection_is_known_by_its_address_pid_and_wait_until_it_closes() {
        let s = StoreSessions::default();
        let addr: SocketAddr = "127.0.0.1:4242".parse().unwrap();
        s.opened(7, "ns", Some(addr));
        s.pinged(7, "ns", false, 1234);
        s.pinged(7, "ns", false, 99); // only the handshake's PING is the pid
        s.waiting(7, "ns", false, keys(&["/k"]));
        let f = s.of("ns");
        assert_eq!(f.sessions.len(), 1);
        let c = &f.sessions[0];
        assert_eq!(
            (c.id, c.address.as_str(), c.pid),
            (7, "127.0.0.1:4242", 1234)
        );
        assert!(c.waited.is_some());
        assert!(s.of("other").sessions.is_empty());
        assert_eq!(s.oldest_waits().keys().collect::<Vec<_>>(), vec!["ns"]);
        s.released(7);
        assert_eq!(s.of("ns").sessions[0].waited, None);
        assert!(s.oldest_waits().is_empty());
        s.closed(7);
        assert!(s.of("ns").sessions.is_empty());
    }

    #[test]
    fn a_wait_sent_again_on_the_same_keys_after_a_timeout_counts_from_the_first() {
        let s = StoreSessions::default();
        s.opened(1, "ns", None);
        s.waiting(1, "ns", false, keys(&["/last_worker"]));
        let first = s.inner().sessions[&1].wait.as_ref().unwrap().since;
        s.cancelled(1);
        assert_eq!(s.of("ns").sessions[0].waited, None);
        s.waiting(1, "ns", false, keys(&["/last_worker"]));
        assert_eq!(s.inner().sessions[&1].wait.as_ref().unwrap().since, first);
        // Another key starts anew.
        s.cancelled(1);
        std::thread::sleep(Duration::from_millis(2));
        s.waiting(1, "ns", false, keys(&["/other"]));
        assert!(s.inner().sessions[&1].wait.as_ref().unwrap().since > first);
        // A release forgets the cancelled wait too.
        s.released(1);
        s.waiting(1, "ns", false, keys(&["/last_worker"]));
        assert!(s.inner().sessions[&1].wait.as_ref().unwrap().since > first);
    }

    #[test]
    fn counters_keep_their_adds_and_barrier_size_and_stay_bounded() {
        let s = StoreSessions::default();
        assert_eq!(s.of("ns").since_write, None);
        s.wrote("ns", None);
        assert!(s.of("ns").since_write.is_some());
        assert!(s.of("ns").counters.is_empty());
        s.wrote("ns", Some(("/c", None)));
        s.wrote("ns", Some(("/c", None)));
        s.wrote("ns", Some(("/b", Some(4))));
        let f = s.of("ns");
        let by: HashMap<_, _> = f.counters.iter().map(|c| (c.key.as_str(), c)).collect();
        assert_eq!((by["/c"].adds, by["/c"].world_size), (2, 0));
        assert_eq!((by["/b"].adds, by["/b"].world_size), (1, 4));
        for i in 0..MAX_COUNTERS + 10 {
            s.wrote("ns", Some((&format!("/k{i}"), None)));
        }
        assert_eq!(s.of("ns").counters.len(), MAX_COUNTERS);
        // The most recent is kept.
        let last = format!("/k{}", MAX_COUNTERS + 9);
        assert!(s.of("ns").counters.iter().any(|c| c.key == last));
    }
}
