//! What the store answers without a command: the reads of torch's
//! protocol (GET, CHECK, MULTI_GET, GETNUMKEYS, LIST_KEYS, QUEUE_LEN) and
//! what a node reads of a connection's waits.

use bytes::Bytes;

use super::{Data, Held};

/// The store, read-only.
#[derive(Clone, Copy, Debug)]
pub struct Reader<'a> {
    pub(crate) data: &'a Data,
}

/// What a node reads of one connection's waits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionView {
    /// STOP_WAITING the connection has been owed in all.
    pub stops: u64,
    /// Its registrations still standing (0: nothing more will wake it).
    pub registered: u64,
}

impl<'a> Reader<'a> {
    /// The value of `key` (GET: a missing key reads as empty).
    pub fn get(&self, key: &str) -> Option<&'a Bytes> {
        self.data.kv.get(key)
    }

    /// Whether every key is stored, or a non-empty queue (CHECK).
    pub fn check(&self, keys: &[String]) -> bool {
        keys.iter()
            .all(|k| self.data.kv.contains_key(k) || self.data.queues.contains_key(k))
    }

    /// What a COMPARE_SET of `key` would answer when it cannot change the
    /// state — nobody waits on the key, and it would store nothing — or
    /// `None` when it may change it (it stores, or wakes waiters). Such a
    /// COMPARE_SET is a read.
    pub fn compare_set_unchanging(&self, key: &str, expected: &[u8]) -> Option<Bytes> {
        if self.data.waiting.contains_key(key) {
            return None;
        }
        match self.data.kv.get(key) {
            None if expected.is_empty() => None,
            None => Some(Bytes::copy_from_slice(expected)),
            Some(v) if v == expected => None,
            Some(v) => Some(v.clone()),
        }
    }

    /// Number of keys (GETNUMKEYS: queues not counted).
    pub fn num_keys(&self) -> usize {
        self.data.kv.len()
    }

    /// Every key, in order (LIST_KEYS).
    pub fn keys(&self) -> impl Iterator<Item = &'a String> {
        self.data.kv.keys()
    }

    /// Keys and values from `start` on, in key order.
    pub fn entries_from(&self, start: &str) -> impl Iterator<Item = (&'a String, &'a Bytes)> {
        self.data
            .kv
            .range::<str, _>((std::ops::Bound::Included(start), std::ops::Bound::Unbounded))
    }

    /// Items in queue `key` (QUEUE_LEN: 0 for a queue never used).
    pub fn queue_len(&self, key: &str) -> usize {
        self.data.queues.get(key).map_or(0, |q| q.items.len())
    }

    /// Number of queues holding items.
    pub fn queues(&self) -> usize {
        self.data.queues.len()
    }

    /// The waits of connection `id`, if it has a record.
    pub fn connection(&self, id: u64) -> Option<ConnectionView> {
        self.data.connections.get(&id).map(|c| ConnectionView {
            stops: c.stops,
            registered: c.registered,
        })
    }

    /// Connections with a wait registered.
    pub fn waiting_connections(&self) -> usize {
        self.data
            .connections
            .values()
            .filter(|c| c.registered > 0)
            .count()
    }

    /// The keys some connection waits on, in key order, each with its
    /// registrations in order (a connection once per registration).
    pub fn waiters(&self) -> impl Iterator<Item = (&'a String, &'a [u64])> {
        self.data
            .waiting
            .iter()
            .map(|(k, w)| (k, w.connections.as_slice()))
    }

    /// Keys and bytes the store holds (what the namespace's bounds count).
    pub fn held(&self) -> Held {
        Held {
            keys: (self.data.kv.len() + self.data.queues.len()) as u64,
            bytes: self.data.bytes,
        }
    }
}
