//! Exactly-once origins as they travel in [`crate::ORIGIN_HEADER`], and the
//! lanes that issue them.
//!
//! An origin is `CLIENT_ID:SEQ[:DONE_BELOW]`: the client's id, the request's
//! sequence number, and optionally the seq below which every request of this
//! client has been answered or given up. The replicated state keeps a
//! client's outcomes from `DONE_BELOW` on and refuses late copies of older
//! ones, so what it remembers is bounded by what the client has in flight,
//! not by how much traffic anyone sends.
//!
//! [`Lanes`] hands each call in flight its own client id (a lane) and
//! declares the lane's previous call done: a lane carries one call at a
//! time, and goes back to the pool when the call ends. The number of lanes
//! is the peak number of calls in flight.

use std::sync::{Arc, Mutex};

/// An origin on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WireOrigin {
    /// The client (lane) id.
    pub client_id: u64,
    /// The request's sequence number.
    pub seq: u64,
    /// Every request of the client below this seq is done (0: not said).
    pub done_below: u64,
}

impl WireOrigin {
    /// The header value: `CLIENT_ID:SEQ:DONE_BELOW`, or `CLIENT_ID:SEQ`
    /// when `done_below` is 0.
    pub fn header_value(&self) -> String {
        if self.done_below == 0 {
            format!("{}:{}", self.client_id, self.seq)
        } else {
            format!("{}:{}:{}", self.client_id, self.seq, self.done_below)
        }
    }

    /// Parses a header value; `done_below` may not exceed `seq` (a request
    /// cannot declare itself done).
    pub fn parse(text: &str) -> Result<WireOrigin, String> {
        let bad = || format!("malformed origin {text:?} (want CLIENT_ID:SEQ[:DONE_BELOW])");
        let mut parts = text.split(':').map(|p| p.trim().parse::<u64>());
        let (Some(Ok(client_id)), Some(Ok(seq))) = (parts.next(), parts.next()) else {
            return Err(bad());
        };
        let done_below = match parts.next() {
            None => 0,
            Some(Ok(d)) => d,
            Some(Err(_)) => return Err(bad()),
        };
        if parts.next().is_some() {
            return Err(bad());
        }
        if done_below > seq {
            return Err(format!(
                "origin {text:?} declares its own request done (DONE_BELOW {done_below} > SEQ {seq})"
            ));
        }
        Ok(WireOrigin {
            client_id,
            seq,
            done_below,
        })
    }
}

/// A pool of lanes; clones share it.
#[derive(Clone, Default)]
pub struct Lanes {
    free: Arc<Mutex<Vec<(u64, u64)>>>,
}

/// A lane checked out for one call; it goes back to the pool on drop, its
/// next call declaring this one done.
pub struct Lane {
    pool: Lanes,
    client_id: u64,
    seq: u64,
}

impl Lanes {
    /// An empty pool.
    pub fn new() -> Self {
        Self::default()
    }

    /// A lane for one call: a free one, or a new one with a random id.
    pub fn checkout(&self) -> Lane {
        let free = self.free.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let (client_id, seq) = free.unwrap_or_else(|| (rand::random::<u64>() >> 1 | 1, 1));
        Lane {
            pool: self.clone(),
            client_id,
            seq,
        }
    }

    /// Lanes in the pool now (not checked out).
    pub fn idle(&self) -> usize {
        self.free.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

impl Lane {
    /// This call's origin: every earlier call of the lane is done.
    pub fn origin(&self) -> WireOrigin {
        WireOrigin {
            client_id: self.client_id,
            seq: self.seq,
            done_below: self.seq,
        }
    }
}

impl Drop for Lane {
    fn drop(&mut self) {
        self.pool
            .free
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((self.client_id, self.seq + 1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trip_and_refusals() {
        for o in [
            WireOrigin {
                client_id: 5,
                seq: 9,
                done_below: 0,
            },
            WireOrigin {
                client_id: 5,
                seq: 9,
                done_below: 9,
            },
        ] {
            assert_eq!(WireOrigin::parse(&o.header_value()), Ok(o));
        }
        assert_eq!(WireOrigin::parse(" 5 : 9 ").unwrap().seq, 9);
        for bad in ["", "5", "5:", "x:1", "5:9:x", "5:9:1:2", "-1:2"] {
            assert!(WireOrigin::parse(bad).is_err(), "{bad}");
        }
        assert!(WireOrigin::parse("5:9:10")
            .unwrap_err()
            .contains("declares its own request done"));
    }

    #[test]
    fn a_lane_carries_one_call_at_a_time_and_declares_the_last_one_done() {
        let lanes = Lanes::new();
        let a = lanes.checkout();
        let b = lanes.checkout();
        assert_ne!(a.origin().client_id, b.origin().client_id);
        assert_eq!(a.origin().seq, 1);
        let id = a.origin().client_id;
        drop(a);
        let again = lanes.checkout();
        assert_eq!(
            again.origin(),
            WireOrigin {
                client_id: id,
                seq: 2,
                done_below: 2
            }
        );
        drop(again);
        drop(b);
        assert_eq!(lanes.idle(), 2);
    }
}
