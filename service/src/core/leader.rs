//! The local leader: what this node can do when it is the Raft leader, and
//! nothing about other nodes. It stamps an update with the leader's time,
//! proposes it through the local write batcher, and confirms a read index.
//! Forwarding, origins and retries across leader changes are the
//! [`super::router`]'s; the leader runtime's duties (`crate::duties`) use
//! this part directly, since a duty only ever runs on the leader.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use journal::Update;
use raft::{Applied, ProposeError, RaftNode, Role};

/// Wall-clock milliseconds since the epoch (the leader's clock stamps updates).
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A step that could not complete here (not the leader, leadership moving,
/// no quorum in time); the caller may retry while time is left.
#[derive(Debug)]
pub struct Retry(pub String);

/// This node in its leader role.
#[derive(Clone)]
pub struct LocalLeader {
    node: Arc<RaftNode>,
}

impl LocalLeader {
    /// The leader part of `node`.
    pub fn new(node: Arc<RaftNode>) -> Self {
        LocalLeader { node }
    }

    /// The node.
    pub fn node(&self) -> &Arc<RaftNode> {
        &self.node
    }

    /// Whether this node is the leader right now.
    pub fn is_leader(&self) -> bool {
        self.node.role() == Role::Leader
    }

    /// The term this node leads in, if it is the leader.
    pub fn leading_term(&self) -> Option<u64> {
        let m = self.node.metrics();
        (m.current_leader == Some(self.node.id()) && self.is_leader()).then_some(m.current_term)
    }

    /// Proposes `u` here, stamped with the leader's time unless it carries
    /// one, and returns its outcome once applied. One attempt: a node that
    /// is not the leader, or loses leadership meanwhile, answers [`Retry`].
    pub async fn propose(&self, u: &Update) -> Result<Applied, Retry> {
        let mut stamped = u.clone();
        if stamped.at_ms == 0 {
            stamped.at_ms = now_ms();
        }
        match self.node.propose(stamped).await {
            Ok(a) => Ok(a),
            Err(e @ (ProposeError::NotLeader { .. } | ProposeError::Unavailable(_))) => {
                Err(Retry(e.to_string()))
            }
            Err(ProposeError::Fatal(e)) => Err(Retry(e)),
        }
    }

    /// Waits until this node (the leader) may serve a linearizable read;
    /// returns the read index (applied here already).
    pub async fn read_barrier(&self) -> Result<u64, Retry> {
        self.node
            .read_barrier()
            .await
            .map_err(|e| Retry(e.to_string()))
    }

    /// How long after it last knew a leader with a quorum this node may still
    /// vouch for a task's liveness on its own (and the leader for itself): a
    /// quarter of the heartbeat timeout, and at least two election timeouts
    /// (what an election takes here, so heartbeats ride through one) as far
    /// as half the heartbeat timeout allows. The majority declares a task
    /// dead after the whole heartbeat timeout; a cut-off node stops vouching
    /// well before.
    pub fn local_answer_window(&self) -> Duration {
        let hb = Duration::from_millis(
            self.node
                .state()
                .read(|s| s.config().map_or(0, |c| c.heartbeat_timeout_ms)),
        );
        let election = 2 * self.node.election_timeout();
        if hb.is_zero() {
            return election;
        }
        (hb / 4).max(election.min(hb / 2))
    }

    /// Whether this node knew a leader with a quorum within
    /// [`LocalLeader::local_answer_window`].
    pub fn leader_heard_recently(&self) -> bool {
        self.node
            .leader_contact_age()
            .is_some_and(|age| age <= self.local_answer_window())
    }
}
