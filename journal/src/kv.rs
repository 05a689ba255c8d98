//! The key-value store (reference §3.7): normalised keys, allow_overwrite,
//! increment of decimal values, directory listing and recursive delete. Every
//! change bumps the store revision (for watches).

use bytes::Bytes;

use crate::errors;
use crate::keys::{dir_prefix, normalize_key};
use crate::pb::{KvInsert, KvRecord, Outcome};
use crate::state::State;

impl State {
    pub(crate) fn kv_insert(&mut self, c: &KvInsert) -> Outcome {
        let key = normalize_key(&c.key);
        let limit = self.cfg().max_keys;
        let rev = self.d.kv_revision + 1;
        match self.d.kv.get_mut(&key) {
            Some(_) if !c.allow_overwrite => return Outcome::err(errors::key_exists(&key)),
            Some(e) => {
                e.value = c.value.clone();
                e.mod_revision = rev;
            }
            None => {
                if limit > 0 && self.d.kv.len() as u64 >= limit {
                    return Outcome::err(errors::too_many_keys(limit));
                }
                self.d.kv.insert(
                    key,
                    KvRecord {
                        value: c.value.clone(),
                        create_revision: rev,
                        mod_revision: rev,
                    },
                );
            }
        }
        self.d.kv_revision = rev;
        Outcome::ok()
    }

    /// Deletes the key and everything under it; deleting nothing is OK.
    pub(crate) fn kv_delete(&mut self, key: &str) -> Outcome {
        let key = normalize_key(key);
        let mut removed = self.d.kv.remove(&key).is_some();
        if let Some(prefix) = dir_prefix(&key) {
            let under: Vec<String> = self
                .d
                .kv
                .range(prefix.clone()..)
                .take_while(|(k, _)| k.starts_with(&prefix))
                .map(|(k, _)| k.clone())
                .collect();
            removed |= !under.is_empty();
            for k in under {
                self.d.kv.remove(&k);
            }
        }
        if removed {
            self.d.kv_revision += 1;
        }
        Outcome::ok()
    }

    /// Adds `increment` to the decimal integer at `key` (missing = 0).
    pub(crate) fn kv_increment(&mut self, key: &str, increment: i64) -> Outcome {
        let key = normalize_key(key);
        let current = match self.d.kv.get(&key) {
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
        let limit = self.cfg().max_keys;
        if !self.d.kv.contains_key(&key) && limit > 0 && self.d.kv.len() as u64 >= limit {
            return Outcome::err(errors::too_many_keys(limit));
        }
        let rev = self.d.kv_revision + 1;
        let value = Bytes::from(next.to_string());
        self.d
            .kv
            .entry(key)
            .and_modify(|e| {
                e.value = value.clone();
                e.mod_revision = rev;
            })
            .or_insert(KvRecord {
                value: value.clone(),
                create_revision: rev,
                mod_revision: rev,
            });
        self.d.kv_revision = rev;
        Outcome::value(next)
    }

    /// The value at `key` (normalised), if present.
    pub fn kv_get(&self, key: &str) -> Option<&Bytes> {
        self.d.kv.get(&normalize_key(key)).map(|e| &e.value)
    }

    /// The entry (value and revisions) at `key` (normalised), if present.
    pub fn kv_entry(&self, key: &str) -> Option<&KvRecord> {
        self.d.kv.get(&normalize_key(key))
    }

    /// Every entry strictly under directory `dir`, sorted by key. The empty
    /// directory holds nothing; `dir` itself is not included.
    pub fn kv_dir(&self, dir: &str) -> Vec<(&str, &KvRecord)> {
        let Some(prefix) = dir_prefix(dir) else {
            return Vec::new();
        };
        self.d
            .kv
            .range(prefix.clone()..)
            .take_while(|(k, _)| k.starts_with(&prefix))
            .map(|(k, e)| (k.as_str(), e))
            .collect()
    }

    /// Every entry of the store, sorted by key.
    pub fn kv_all(&self) -> impl Iterator<Item = (&str, &KvRecord)> {
        self.d.kv.iter().map(|(k, e)| (k.as_str(), e))
    }

    /// Number of keys stored.
    pub fn kv_len(&self) -> usize {
        self.d.kv.len()
    }

    /// The store revision, bumped by every change.
    pub fn kv_revision(&self) -> u64 {
        self.d.kv_revision
    }
}
