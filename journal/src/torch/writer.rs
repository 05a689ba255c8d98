//! The store's commands: each changes [`Data`] as torch's server changes
//! its maps, and reports every connection whose waits it changed.

use std::collections::BTreeSet;

use bytes::Bytes;

use super::{answer, not_a_number, number, Data, Held, Popped, Waited};
use crate::area::{Context, Object};
use crate::cluster::Cluster;
use crate::coordination::errors::{too_many_bytes, too_many_keys};
use crate::pb::torch::{command::Command, reply, Connection};
use crate::pb::{DomainError, Outcome};

/// The store while a command applies.
pub(super) struct Writer<'a, 'c> {
    pub(super) cl: Cluster<'a>,
    pub(super) data: &'a mut Data,
    pub(super) cx: &'a mut Context<'c>,
}

impl Writer<'_, '_> {
    pub(super) fn apply(&mut self, cmd: &Command) -> Outcome {
        let result = match cmd {
            Command::Set(c) => self.set(&c.key, c.value.clone()).map(|()| Outcome::ok()),
            Command::CompareSet(c) => self
                .compare_set(&c.key, &c.expected, &c.desired)
                .map(|v| answer(reply::Reply::Value(v))),
            Command::Add(c) => self
                .add(&c.key, c.delta)
                .map(|n| answer(reply::Reply::Number(n))),
            Command::Append(c) => self.append(&c.key, &c.value).map(|()| Outcome::ok()),
            Command::DeleteKey(c) => Ok(answer(reply::Reply::Number(self.delete(&c.key)))),
            Command::MultiSet(c) => c
                .pairs
                .iter()
                .try_for_each(|p| self.set(&p.key, p.value.clone()))
                .map(|()| Outcome::ok()),
            Command::QueuePush(c) => self.queue_push(&c.key, &c.value).map(|()| Outcome::ok()),
            Command::QueuePop(c) => Ok(answer(reply::Reply::Popped(self.queue_pop(&c.key)))),
            Command::Wait(c) => Ok(waited(self.wait(c.connection, &c.keys))),
            Command::Barrier(c) => self.barrier(c.connection, &c.key, c.world_size).map(waited),
            Command::CancelWait(c) => Ok(waited(self.cancel(c.connection))),
            Command::Forget(c) => {
                self.forget(c.connections.iter().copied().collect());
                Ok(Outcome::ok())
            }
            Command::Touch(c) => {
                self.touch(&c.connections, c.horizon_ms);
                Ok(Outcome::ok())
            }
        };
        result.unwrap_or_else(Outcome::err)
    }

    // ------------------------------------------------------------ values ----

    /// Refuses a change that takes the namespace past its bounds: one more
    /// key (`new_key`) or `grow` more bytes (a change that adds no key and
    /// no byte always passes).
    fn check_bounds(&self, new_key: bool, grow: u64) -> Result<(), DomainError> {
        let elsewhere: Held = self.cx.coordination_held;
        let max_keys = self.cl.config().map_or(0, |c| c.max_keys);
        let keys = elsewhere.keys + (self.data.kv.len() + self.data.queues.len()) as u64;
        if new_key && max_keys > 0 && keys >= max_keys {
            return Err(too_many_keys(self.cl.namespace, max_keys));
        }
        let bytes = elsewhere.bytes + self.data.bytes + grow;
        if grow > 0 && self.cl.max_bytes > 0 && bytes > self.cl.max_bytes {
            return Err(too_many_bytes(
                self.cl.namespace(),
                bytes,
                self.cl.max_bytes,
            ));
        }
        Ok(())
    }

    /// Stores `value` under `key` (counted, bounded), waking nobody.
    fn put(&mut self, key: &str, value: Bytes) -> Result<(), DomainError> {
        let old = self.data.kv.get(key).map(|v| (key.len() + v.len()) as u64);
        let new = (key.len() + value.len()) as u64;
        self.check_bounds(old.is_none(), new.saturating_sub(old.unwrap_or(0)))?;
        self.data.bytes = self.data.bytes - old.unwrap_or(0) + new;
        self.data.kv.insert(key.to_string(), value);
        Ok(())
    }

    fn set(&mut self, key: &str, value: Bytes) -> Result<(), DomainError> {
        self.put(key, value)?;
        self.wake_all(key);
        Ok(())
    }

    fn compare_set(
        &mut self,
        key: &str,
        expected: &Bytes,
        desired: &Bytes,
    ) -> Result<Bytes, DomainError> {
        let answer = match self.data.kv.get(key) {
            None if expected.is_empty() => {
                self.put(key, desired.clone())?;
                desired.clone()
            }
            // torch's server answers `expected` and stores nothing.
            None => expected.clone(),
            Some(v) if v == expected => {
                self.put(key, desired.clone())?;
                desired.clone()
            }
            Some(v) => v.clone(),
        };
        self.wake_all(key);
        Ok(answer)
    }

    fn add(&mut self, key: &str, delta: i64) -> Result<i64, DomainError> {
        let sum = number::add(self.data.kv.get(key).map(|v| &v[..]), delta)
            .ok_or_else(|| not_a_number(key))?;
        self.put(key, Bytes::from(sum.to_string()))?;
        self.wake_all(key);
        Ok(sum)
    }

    fn append(&mut self, key: &str, value: &Bytes) -> Result<(), DomainError> {
        let joined = match self.data.kv.get(key) {
            Some(v) => {
                let mut joined = Vec::with_capacity(v.len() + value.len());
                joined.extend_from_slice(v);
                joined.extend_from_slice(value);
                Bytes::from(joined)
            }
            None => value.clone(),
        };
        self.put(key, joined)?;
        self.wake_all(key);
        Ok(())
    }

    fn delete(&mut self, key: &str) -> i64 {
        match self.data.kv.remove(key) {
            Some(v) => {
                self.data.bytes -= (key.len() + v.len()) as u64;
                1
            }
            None => 0,
        }
    }

    // ------------------------------------------------------------ queues ----

    fn queue_push(&mut self, key: &str, value: &Bytes) -> Result<(), DomainError> {
        let new_key = !self.data.queues.contains_key(key);
        let grow = value.len() + if new_key { key.len() } else { 0 };
        self.check_bounds(new_key, grow as u64)?;
        self.data.bytes += grow as u64;
        self.data
            .queues
            .entry(key.to_string())
            .or_default()
            .items
            .push(value.clone());
        self.wake_one(key);
        Ok(())
    }

    fn queue_pop(&mut self, key: &str) -> Popped {
        let Some(q) = self.data.queues.get_mut(key) else {
            return Popped {
                length: 0,
                value: None,
            };
        };
        let length = q.items.len() as i64;
        let value = q.items.remove(0);
        self.data.bytes -= value.len() as u64;
        if q.items.is_empty() {
            self.data.queues.remove(key);
            self.data.bytes -= key.len() as u64;
        }
        Popped {
            length,
            value: Some(value),
        }
    }

    // ------------------------------------------------------------- waits ----

    /// Counts down every connection registered on `key` and drops the key's
    /// registrations.
    fn wake_all(&mut self, key: &str) {
        let Some(w) = self.data.waiting.remove(key) else {
            return;
        };
        for id in w.connections {
            if let Some(c) = self.data.connections.get_mut(&id) {
                c.registered -= 1;
                count_down(c);
                self.cx.touch(|| Object::StoreConnection(id));
            }
        }
    }

    /// Counts down the connections registered on `key`, in order, up to
    /// the first that reaches zero; drops nothing (as torch's server).
    fn wake_one(&mut self, key: &str) {
        let Some(w) = self.data.waiting.get(key) else {
            return;
        };
        for id in &w.connections {
            if let Some(c) = self.data.connections.get_mut(id) {
                let id = *id;
                self.cx.touch(|| Object::StoreConnection(id));
                if count_down(c) {
                    return;
                }
            }
        }
    }

    /// Whether every key is stored, or a non-empty queue.
    fn all_present(&self, keys: &[String]) -> bool {
        keys.iter()
            .all(|k| self.data.kv.contains_key(k) || self.data.queues.contains_key(k))
    }

    /// The record of connection `id` (made if new), marked alive now.
    fn connection(&mut self, id: u64) -> &mut Connection {
        let now = self.cx.at_ms;
        let c = self.data.connections.entry(id).or_default();
        c.touched_ms = now;
        c
    }

    fn register(&mut self, id: u64, key: &str) {
        self.data
            .waiting
            .entry(key.to_string())
            .or_default()
            .connections
            .push(id);
        self.connection(id).registered += 1;
    }

    fn wait(&mut self, id: u64, keys: &[String]) -> Waited {
        if self.all_present(keys) {
            let stops = self.data.connections.get(&id).map_or(0, |c| c.stops);
            return Waited { ready: true, stops };
        }
        let mut awaited = 0;
        for key in keys {
            if !self.data.kv.contains_key(key) {
                self.register(id, key);
                awaited += 1;
            }
        }
        let c = self.connection(id);
        c.awaited = awaited;
        Waited {
            ready: false,
            stops: c.stops,
        }
    }

    fn barrier(&mut self, id: u64, key: &str, world_size: i64) -> Result<Waited, DomainError> {
        let count = number::add(self.data.kv.get(key).map(|v| &v[..]), 1)
            .ok_or_else(|| not_a_number(key))?;
        self.put(key, Bytes::from(count.to_string()))?;
        let stops = self.data.connections.get(&id).map_or(0, |c| c.stops);
        if count >= world_size {
            self.wake_all(key);
            return Ok(Waited { ready: true, stops });
        }
        self.register(id, key);
        let c = self.connection(id);
        c.awaited = 1;
        Ok(Waited {
            ready: false,
            stops: c.stops,
        })
    }

    fn cancel(&mut self, id: u64) -> Waited {
        let stops = self.data.connections.get(&id).map_or(0, |c| c.stops);
        self.drop_registrations(&BTreeSet::from([id]));
        if let Some(c) = self.data.connections.get_mut(&id) {
            c.awaited = 0;
        }
        self.cx.touch(|| Object::StoreConnection(id));
        Waited {
            ready: false,
            stops,
        }
    }

    /// Drops the records and registrations of `ids`.
    fn forget(&mut self, ids: BTreeSet<u64>) {
        let ids: BTreeSet<u64> = ids
            .into_iter()
            .filter(|id| self.data.connections.contains_key(id))
            .collect();
        self.drop_registrations(&ids);
        for id in ids {
            self.data.connections.remove(&id);
            self.cx.touch(|| Object::StoreConnection(id));
        }
    }

    /// Marks `ids` alive now, then forgets every connection not marked
    /// alive for `horizon_ms` (0: the default horizon).
    fn touch(&mut self, ids: &[u64], horizon_ms: u64) {
        let now = self.cx.at_ms;
        for id in ids {
            if let Some(c) = self.data.connections.get_mut(id) {
                c.touched_ms = now;
            }
        }
        let horizon = match horizon_ms {
            0 => super::DEFAULT_CONNECTION_HORIZON_MS,
            h => h,
        };
        let stale = self
            .data
            .connections
            .iter()
            .filter(|(_, c)| c.touched_ms.saturating_add(horizon) < now)
            .map(|(id, _)| *id)
            .collect();
        self.forget(stale);
    }

    /// Removes every registration of `ids` (one pass over the lists).
    fn drop_registrations(&mut self, ids: &BTreeSet<u64>) {
        if ids.is_empty() {
            return;
        }
        self.data.waiting.retain(|_, w| {
            w.connections.retain(|c| !ids.contains(c));
            !w.connections.is_empty()
        });
        for id in ids {
            if let Some(c) = self.data.connections.get_mut(id) {
                c.registered = 0;
            }
        }
    }
}

/// One wake of a connection: its count of awaited keys goes down by one
/// (wrapping below zero, as torch's unsigned counter); at zero it is owed a
/// STOP_WAITING. Returns whether it reached zero.
fn count_down(c: &mut Connection) -> bool {
    c.awaited = c.awaited.wrapping_sub(1);
    if c.awaited == 0 {
        c.stops += 1;
        return true;
    }
    false
}

fn waited(w: Waited) -> Outcome {
    answer(reply::Reply::Waited(w))
}

#[cfg(test)]
mod tests {
    use super::super::counted_bytes;
    use super::*;
    use crate::pb::torch::Queue;

    #[test]
    fn byte_count_follows_queues() {
        let mut d = Data::default();
        d.queues.insert(
            "/q".into(),
            Queue {
                items: vec![Bytes::from_static(b"ab")],
            },
        );
        d.bytes = 4;
        assert_eq!(counted_bytes(&d), 4);
    }
}
