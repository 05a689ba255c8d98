//! The PyTorch store area's semantics, one test per rule of torch 2.15's
//! libuv server as measured on the wire (`docs/pytorch.md`), then what
//! coordstore adds (bounds, connections forgotten, exactly-once, levels).

#[path = "../common/mod.rs"]
mod common;

mod random;
mod rules;
mod waits;

use bytes::Bytes;
use journal::pb::torch::{self as t, reply::Reply as R, Popped, Waited};
use journal::pb::{outcome, Code, Origin};
use journal::torch::ConnectionView;
use journal::{Outcome, State, Update};

/// Connections of the tests.
pub const A: u64 = 0xA;
pub const B: u64 = 0xB;
pub const C: u64 = 0xC;

/// A state to drive the store with, and its leader clock.
pub struct T {
    pub s: State,
    pub now: u64,
}

impl Default for T {
    fn default() -> Self {
        T::new()
    }
}

impl T {
    pub fn new() -> T {
        T {
            s: common::new_state(1, &common::Opts::default()),
            now: 1_000_000,
        }
    }

    /// A state whose default namespace allows `max_keys` keys.
    pub fn with_max_keys(max_keys: u64) -> T {
        let o = common::Opts {
            max_keys,
            ..Default::default()
        };
        T {
            s: common::new_state(1, &o),
            now: 1_000_000,
        }
    }

    pub fn run(&mut self, c: impl Into<Update>) -> Outcome {
        let mut u: Update = c.into();
        u.at_ms = self.now;
        let out = self.s.apply(&u);
        self.s.check_invariants().expect("invariants hold");
        out
    }

    pub fn run_as(&mut self, client_id: u64, seq: u64, c: impl Into<Update>) -> Outcome {
        let mut u: Update = c.into();
        u.at_ms = self.now;
        u.origin = Some(Origin {
            client_id,
            seq,
            done_below: 0,
        });
        self.s.apply(&u)
    }

    fn reply(out: Outcome) -> R {
        assert!(!out.is_err(), "{out:?}");
        match out.reply {
            Some(outcome::Reply::Torch(r)) => r.reply.expect("a reply"),
            other => panic!("not a store reply: {other:?}"),
        }
    }

    pub fn set(&mut self, key: &str, value: &[u8]) {
        let out = self.run(t::Set {
            key: key.into(),
            value: Bytes::copy_from_slice(value),
        });
        assert!(!out.is_err(), "{out:?}");
    }

    pub fn get(&self, key: &str) -> Option<Vec<u8>> {
        let ns = self.s.default_namespace();
        ns.torch().get(key).map(|v| v.to_vec())
    }

    pub fn cas(&mut self, key: &str, expected: &[u8], desired: &[u8]) -> Vec<u8> {
        match Self::reply(self.run(t::CompareSet {
            key: key.into(),
            expected: Bytes::copy_from_slice(expected),
            desired: Bytes::copy_from_slice(desired),
        })) {
            R::Value(v) => v.to_vec(),
            other => panic!("{other:?}"),
        }
    }

    pub fn add(&mut self, key: &str, delta: i64) -> Result<i64, Code> {
        let out = self.run(t::Add {
            key: key.into(),
            delta,
        });
        if let Some(e) = out.error {
            return Err(e.code());
        }
        match Self::reply(out) {
            R::Number(n) => Ok(n),
            other => panic!("{other:?}"),
        }
    }

    pub fn append(&mut self, key: &str, value: &[u8]) {
        let out = self.run(t::Append {
            key: key.into(),
            value: Bytes::copy_from_slice(value),
        });
        assert!(!out.is_err(), "{out:?}");
    }

    pub fn delete(&mut self, key: &str) -> i64 {
        match Self::reply(self.run(t::DeleteKey { key: key.into() })) {
            R::Number(n) => n,
            other => panic!("{other:?}"),
        }
    }

    pub fn push(&mut self, key: &str, value: &[u8]) {
        let out = self.run(t::QueuePush {
            key: key.into(),
            value: Bytes::copy_from_slice(value),
        });
        assert!(!out.is_err(), "{out:?}");
    }

    pub fn pop(&mut self, key: &str) -> Popped {
        match Self::reply(self.run(t::QueuePop { key: key.into() })) {
            R::Popped(p) => p,
            other => panic!("{other:?}"),
        }
    }

    pub fn wait(&mut self, conn: u64, keys: &[&str]) -> Waited {
        match Self::reply(self.run(t::Wait {
            connection: conn,
            keys: keys.iter().map(|k| k.to_string()).collect(),
        })) {
            R::Waited(w) => w,
            other => panic!("{other:?}"),
        }
    }

    pub fn barrier(&mut self, conn: u64, key: &str, world_size: i64) -> Waited {
        match Self::reply(self.run(t::Barrier {
            connection: conn,
            key: key.into(),
            world_size,
        })) {
            R::Waited(w) => w,
            other => panic!("{other:?}"),
        }
    }

    pub fn cancel(&mut self, conn: u64) -> Waited {
        match Self::reply(self.run(t::CancelWait { connection: conn })) {
            R::Waited(w) => w,
            other => panic!("{other:?}"),
        }
    }

    /// The STOP_WAITING owed to `conn` in all (0 without a record).
    pub fn stops(&self, conn: u64) -> u64 {
        self.connection(conn).map_or(0, |c| c.stops)
    }

    pub fn connection(&self, conn: u64) -> Option<ConnectionView> {
        self.s.default_namespace().torch().connection(conn)
    }

    pub fn check(&self, keys: &[&str]) -> bool {
        let keys: Vec<String> = keys.iter().map(|k| k.to_string()).collect();
        self.s.default_namespace().torch().check(&keys)
    }
}

/// Waited answered at once.
pub fn ready() -> Waited {
    Waited {
        ready: true,
        stops: 0,
    }
}

/// Waited registered, with `stops` owed before.
pub fn parked(stops: u64) -> Waited {
    Waited {
        ready: false,
        stops,
    }
}
