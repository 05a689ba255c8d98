//! The key-value store (`docs/protocols.md`, Key-value store): normalised
//! keys, allow_overwrite, increment of decimal values, directory listing and
//! recursive delete. Every change bumps the store revision (for watches).

use bytes::Bytes;

use super::errors;
use super::keys::{dir_prefix, normalize_key};
use super::{Reader, Writer};
use crate::area::Object;
use crate::cluster::Cluster;
use crate::pb::coordination::{KvEvent, KvInsert, KvRecord};
use crate::pb::Outcome;

/// Default bound of the watch history in bytes.
pub const DEFAULT_WATCH_HISTORY_BYTES: u64 = 16 << 20;
/// Most events the watch history keeps.
pub const MAX_WATCH_EVENTS: usize = 65_536;

/// A watch asked for changes older than the history keeps: re-read the
/// current state and watch from its revision.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Compacted {
    /// The oldest revision the history still has complete.
    pub history_start: u64,
    /// The current store revision.
    pub revision: u64,
}

fn event_bytes(e: &KvEvent) -> u64 {
    (e.key.len() + e.value.len() + 16) as u64
}

/// Bytes a key and its value count for the namespace's bound.
fn entry_bytes(key: &str, value: &[u8]) -> u64 {
    (key.len() + value.len()) as u64
}

/// Bytes of every key and value in the store (what the state counts).
pub fn kv_bytes(d: &super::Data) -> u64 {
    d.kv.iter().map(|(k, r)| entry_bytes(k, &r.value)).sum()
}

/// The rules the store keeps: no record is newer than the store's revision
/// nor modified before it was created; the history is ordered, starts at
/// its declared start and ends at or before the revision. (The state checks
/// that its byte count counts every key and value.)
pub(crate) fn check_store(d: &super::Data) -> Result<(), String> {
    for (key, r) in &d.kv {
        if r.mod_revision > d.kv_revision || r.create_revision > r.mod_revision {
            return Err(format!("key {key}: revisions out of order"));
        }
    }
    if d.kv_events
        .windows(2)
        .any(|w| w[0].revision > w[1].revision)
    {
        return Err("the KV history is out of order".into());
    }
    match (d.kv_events.first(), d.kv_events.last()) {
        (Some(first), _) if first.revision < d.kv_history_start => {
            Err("the KV history starts before its declared start".into())
        }
        (_, Some(last)) if last.revision > d.kv_revision => {
            Err("the KV history is ahead of the store".into())
        }
        _ => Ok(()),
    }
}

/// Refuses a write that takes the store from `before` to `after` bytes
/// past the namespace's bound (a write that shrinks it always passes);
/// `elsewhere` are the bytes the namespace's torch store holds.
fn check_bytes(
    cl: Cluster<'_>,
    elsewhere: u64,
    before: u64,
    after: u64,
) -> Result<(), crate::DomainError> {
    let (before, after) = (before + elsewhere, after + elsewhere);
    let max = cl.max_bytes;
    if max > 0 && after > max && after > before {
        return Err(errors::too_many_bytes(cl.namespace(), after, max));
    }
    Ok(())
}

impl Writer<'_, '_> {
    /// Refuses a new key past the namespace's bound on keys (the torch
    /// store's count too).
    fn check_keys(&self) -> Result<(), crate::DomainError> {
        let limit = self.cl.cfg().max_keys;
        if limit > 0 && self.data.kv.len() as u64 + self.cx.torch_held.keys >= limit {
            return Err(errors::too_many_keys(self.cl.namespace, limit));
        }
        Ok(())
    }

    /// Sets `key` (normalised) to `value` at the next revision, counted in
    /// the store's bytes and its history, if the namespace's bounds allow:
    /// an overwrite looks the key up once, a new key twice (the look and
    /// the insert), as the store did before it counted bytes.
    fn kv_set(
        &mut self,
        key: String,
        value: &Bytes,
        allow_overwrite: bool,
    ) -> Result<(), crate::DomainError> {
        let rev = self.data.kv_revision + 1;
        let (before, added) = (*self.cx.kv_bytes, entry_bytes(&key, value));
        if let Some(e) = self.data.kv.get_mut(&key) {
            if !allow_overwrite {
                return Err(errors::key_exists(&key));
            }
            let after = before - entry_bytes(&key, &e.value) + added;
            check_bytes(self.cl, self.cx.torch_held.bytes, before, after)?;
            e.value = value.clone();
            e.mod_revision = rev;
            *self.cx.kv_bytes = after;
        } else {
            self.check_keys()?;
            check_bytes(self.cl, self.cx.torch_held.bytes, before, before + added)?;
            let record = KvRecord {
                value: value.clone(),
                create_revision: rev,
                mod_revision: rev,
            };
            self.record_event(rev, &key, value, false);
            self.data.kv.insert(key, record);
            *self.cx.kv_bytes = before + added;
            self.data.kv_revision = rev;
            return Ok(());
        }
        self.record_event(rev, &key, value, false);
        self.data.kv_revision = rev;
        Ok(())
    }

    pub(crate) fn kv_insert(&mut self, c: &KvInsert) -> Outcome {
        let key = normalize_key(&c.key);
        match self.kv_set(key, &c.value, c.allow_overwrite) {
            Ok(()) => Outcome::ok(),
            Err(e) => Outcome::err(e),
        }
    }

    /// Deletes the key and everything under it; deleting nothing is OK.
    pub(crate) fn kv_delete(&mut self, key: &str) -> Outcome {
        let key = normalize_key(key);
        let mut removed: Vec<(String, KvRecord)> = Vec::new();
        if let Some(r) = self.data.kv.remove(&key) {
            removed.push((key.clone(), r));
        }
        if let Some(prefix) = dir_prefix(&key) {
            let under: Vec<String> = self
                .data
                .kv
                .range(prefix.clone()..)
                .take_while(|(k, _)| k.starts_with(&prefix))
                .map(|(k, _)| k.clone())
                .collect();
            for k in under {
                if let Some(r) = self.data.kv.remove(&k) {
                    removed.push((k, r));
                }
            }
        }
        if !removed.is_empty() {
            let rev = self.data.kv_revision + 1;
            for (k, r) in &removed {
                *self.cx.kv_bytes -= entry_bytes(k, &r.value);
                self.record_event(rev, k, &Bytes::new(), true);
            }
            self.data.kv_revision = rev;
        }
        Outcome::ok()
    }

    /// Appends a change to the watch history and drops whole revisions from
    /// its front while it is over its bounds.
    pub(crate) fn record_event(&mut self, revision: u64, key: &str, value: &Bytes, deleted: bool) {
        self.cx.touch(|| Object::Key(key.to_string()));
        let e = KvEvent {
            revision,
            key: key.to_string(),
            value: value.clone(),
            deleted,
        };
        self.data.kv_history_bytes += event_bytes(&e);
        self.data.kv_events.push(e);
        let limit = match self.cl.cfg().watch_history_bytes {
            0 => DEFAULT_WATCH_HISTORY_BYTES,
            n => n,
        };
        let over =
            |d: &super::Data| d.kv_history_bytes > limit || d.kv_events.len() > MAX_WATCH_EVENTS;
        if !over(self.data) {
            return;
        }
        // Drop a quarter (whole revisions) at once: front removal is O(n).
        let target = self.data.kv_events.len() - self.data.kv_events.len() / 4;
        let mut cut = 0;
        while cut < self.data.kv_events.len()
            && (over(self.data) || self.data.kv_events.len() - cut > target)
        {
            let rev = self.data.kv_events[cut].revision;
            while cut < self.data.kv_events.len() && self.data.kv_events[cut].revision == rev {
                self.data.kv_history_bytes -= event_bytes(&self.data.kv_events[cut]);
                cut += 1;
            }
            if self.data.kv_history_bytes <= limit && self.data.kv_events.len() - cut <= target {
                break;
            }
        }
        self.data.kv_events.drain(..cut);
        self.data.kv_history_start = self
            .data
            .kv_events
            .first()
            .map_or(self.data.kv_revision + 1, |e| e.revision);
    }

    /// Forgets the whole history (job epoch reset): watches resuming from
    /// before now must re-read the store.
    pub(crate) fn clear_history(&mut self) {
        self.data.kv_events.clear();
        self.data.kv_history_bytes = 0;
        self.data.kv_history_start = self.data.kv_revision + 1;
    }

    /// Adds `increment` to the decimal integer at `key` (missing = 0).
    pub(crate) fn kv_increment(&mut self, key: &str, increment: i64) -> Outcome {
        let key = normalize_key(key);
        let current = match self.data.kv.get(&key) {
            None => 0,
            Some(e) => match std::str::from_utf8(&e.value)
                .ok()
                .and_then(|s| s.parse::<i64>().ok())
            {
                Some(v) => v,
                None => return Outcome::err(errors::not_an_integer(&key)),
            },
        };
        let Some(next) = current.checked_add(increment) else {
            return Outcome::err(errors::increment_overflow(&key));
        };
        let value = Bytes::from(next.to_string());
        match self.kv_set(key, &value, true) {
            Ok(()) => super::incremented(next),
            Err(e) => Outcome::err(e),
        }
    }
}

impl<'a> Reader<'a> {
    /// Every change after revision `after`, oldest first, or [`Compacted`] if
    /// the history no longer holds all of them.
    pub fn kv_events_after(&self, after: u64) -> Result<&'a [KvEvent], Compacted> {
        if after + 1 < self.data.kv_history_start {
            return Err(Compacted {
                history_start: self.data.kv_history_start,
                revision: self.data.kv_revision,
            });
        }
        let i = self.data.kv_events.partition_point(|e| e.revision <= after);
        Ok(&self.data.kv_events[i..])
    }

    /// The value at `key` (normalised), if present.
    pub fn kv_get(&self, key: &str) -> Option<&'a Bytes> {
        self.data.kv.get(&normalize_key(key)).map(|e| &e.value)
    }

    /// The entry (value and revisions) at `key` (normalised), if present.
    pub fn kv_entry(&self, key: &str) -> Option<&'a KvRecord> {
        self.data.kv.get(&normalize_key(key))
    }

    /// Every entry strictly under directory `dir`, sorted by key. The empty
    /// directory holds nothing; `dir` itself is not included.
    pub fn kv_dir(&self, dir: &str) -> Vec<(&'a str, &'a KvRecord)> {
        let Some(prefix) = dir_prefix(dir) else {
            return Vec::new();
        };
        self.data
            .kv
            .range(prefix.clone()..)
            .take_while(|(k, _)| k.starts_with(&prefix))
            .map(|(k, e)| (k.as_str(), e))
            .collect()
    }

    /// Every entry of the store, sorted by key.
    pub fn kv_all(&self) -> impl Iterator<Item = (&'a str, &'a KvRecord)> + 'a {
        self.data.kv.iter().map(|(k, e)| (k.as_str(), e))
    }

    /// Number of keys stored.
    pub fn kv_len(&self) -> usize {
        self.data.kv.len()
    }

    /// The store revision, bumped by every change.
    pub fn kv_revision(&self) -> u64 {
        self.data.kv_revision
    }
}
