//! How recently this node knows a leader held a quorum: the fact a node
//! needs before it answers anything about liveness on its own.
//!
//! * On a leader: the time by which a majority of the voters (itself
//!   included) last acknowledged it — an AppendEntries (entries or
//!   heartbeat) answered without a higher vote, or a granted vote.
//! * On a follower: the leader relays its own quorum age on every
//!   AppendEntries (the [`QUORUM_AGE_HEADER`] of the peer RPC); the follower
//!   keeps "now − that age" from the last one it accepted. A leader that lost
//!   its quorum therefore stops vouching for its followers too, even where
//!   it still reaches some of them (written for openraft 0.9, which had no
//!   CheckQuorum; it does not rely on 0.10's quorum lease).

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use storage::NodeId;

/// Peer-RPC metadata key: the sending leader's quorum age in milliseconds.
pub const QUORUM_AGE_HEADER: &str = "x-coordstore-quorum-age-ms";

#[derive(Default)]
struct Inner {
    voters: BTreeSet<NodeId>,
    acks: HashMap<NodeId, Instant>,
    leader_quorum_at: Option<Instant>,
}

/// The contact record of one node.
pub(crate) struct Contact {
    me: NodeId,
    inner: Mutex<Inner>,
}

impl Contact {
    pub(crate) fn new(me: NodeId) -> Self {
        Contact {
            me,
            inner: Mutex::new(Inner::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The voting members, as the membership changes.
    pub(crate) fn set_voters(&self, voters: BTreeSet<NodeId>) {
        let mut g = self.lock();
        g.acks.retain(|id, _| voters.contains(id));
        g.voters = voters;
    }

    /// Peer `id` acknowledged this node as leader (or granted it a vote).
    pub(crate) fn acked(&self, id: NodeId) {
        self.lock().acks.insert(id, Instant::now());
    }

    /// As a leader: how long ago a majority of the voters last acknowledged
    /// this node (`None` if never, or if this node is no voter).
    pub(crate) fn quorum_age(&self) -> Option<Duration> {
        let g = self.lock();
        if !g.voters.contains(&self.me) {
            return None;
        }
        let now = Instant::now();
        let mut times: Vec<Instant> = g
            .voters
            .iter()
            .filter_map(|v| {
                if *v == self.me {
                    Some(now)
                } else {
                    g.acks.get(v).copied()
                }
            })
            .collect();
        let majority = g.voters.len() / 2 + 1;
        if times.len() < majority {
            return None;
        }
        // Newest first: the majority-th newest acknowledgement.
        times.sort_unstable_by(|a, b| b.cmp(a));
        Some(now.saturating_duration_since(times[majority - 1]))
    }

    /// As a follower: the leader vouched, in an accepted AppendEntries, that
    /// it heard from a quorum `age` ago.
    pub(crate) fn leader_vouched(&self, age: Duration) {
        let at = Instant::now().checked_sub(age);
        let mut g = self.lock();
        if let Some(at) = at {
            if g.leader_quorum_at.is_none_or(|t| t < at) {
                g.leader_quorum_at = Some(at);
            }
        }
    }

    /// As a follower: how long ago the last leader it accepted had a quorum.
    pub(crate) fn vouched_age(&self) -> Option<Duration> {
        self.lock().leader_quorum_at.map(|t| t.elapsed())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leader_counts_itself_and_needs_a_majority() {
        let c = Contact::new(1);
        c.set_voters([1].into());
        // A single voter is its own quorum.
        assert!(c.quorum_age().unwrap() < Duration::from_millis(5));
        c.set_voters([1, 2, 3].into());
        assert_eq!(c.quorum_age(), None);
        c.acked(3);
        assert!(c.quorum_age().unwrap() < Duration::from_millis(5));
        // A non-voter's acknowledgement does not count.
        c.set_voters([1, 2, 3, 4, 5].into());
        c.acked(9);
        assert_eq!(c.quorum_age(), None);
        c.acked(4);
        std::thread::sleep(Duration::from_millis(30));
        // The majority-th newest acknowledgement sets the age.
        assert!(c.quorum_age().unwrap() >= Duration::from_millis(30));
        c.acked(2);
        assert!(c.quorum_age().unwrap() >= Duration::from_millis(30));
        c.acked(5);
        assert!(c.quorum_age().unwrap() < Duration::from_millis(30));
        // Removed voters are forgotten.
        c.set_voters([1, 2, 3].into());
        assert!(c.quorum_age().unwrap() < Duration::from_millis(30));
    }

    #[test]
    fn a_follower_keeps_the_newest_vouched_time() {
        let c = Contact::new(2);
        assert_eq!(c.vouched_age(), None);
        c.leader_vouched(Duration::from_millis(500));
        assert!(c.vouched_age().unwrap() >= Duration::from_millis(500));
        c.leader_vouched(Duration::ZERO);
        assert!(c.vouched_age().unwrap() < Duration::from_millis(100));
        // An older vouching (a stale leader's) does not move it back.
        c.leader_vouched(Duration::from_millis(900));
        assert!(c.vouched_age().unwrap() < Duration::from_millis(100));
    }
}
