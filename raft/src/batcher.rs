//! The write batcher (group commit): every update queued while earlier
//! batches are in flight is packed into one Raft entry, so an entry's
//! encoding, append and replication are paid once per batch, not per update.

use std::sync::Arc;
use std::time::Instant;

use journal::pb::UpdateBatch;
use journal::{Outcome, Update};
use openraft::errors::{ClientWriteError, ForwardReason, ForwardToLeader};
use prost::Message;
use storage::{CallbackResponder, NodeId, Proposal, TypeConfig};
use tokio::sync::{mpsc, oneshot, Semaphore};

use crate::config::RaftSettings;
use crate::network::Raft;

/// An applied update.
#[derive(Clone, Debug, PartialEq)]
pub struct Applied {
    /// Its outcome.
    pub outcome: Outcome,
    /// The log index of the entry that carried it.
    pub log_index: u64,
}

/// Why a proposal was not applied.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProposeError {
    /// This node is not the leader; the leader, if known.
    #[error("not the leader (leader: {leader_id:?} at {leader_addr:?})")]
    NotLeader {
        /// The leader's id.
        leader_id: Option<NodeId>,
        /// The leader's address.
        leader_addr: Option<String>,
    },
    /// No quorum confirmed this node's leadership right now; retry.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// Raft stopped or failed; the outcome is unknown.
    #[error("replication failed: {0}")]
    Fatal(String),
}

impl ProposeError {
    pub(crate) fn not_leader(f: ForwardToLeader<TypeConfig>) -> Self {
        if f.reason == ForwardReason::LeaseExpired {
            // This node leads, but no quorum acknowledged it within its lease
            // (also right after an election, until the first round trip).
            return ProposeError::Unavailable("the leader's quorum lease expired; retry".into());
        }
        ProposeError::NotLeader {
            leader_id: f.leader_id,
            leader_addr: f.leader_node.map(|n| n.addr),
        }
    }

    pub(crate) fn from_write(e: ClientWriteError<TypeConfig>) -> Self {
        match e {
            // Discarded by a leader change: the outcome is unknown, but every
            // update carries an origin, so proposing it again is exactly-once.
            ClientWriteError::ForwardToLeader(f) | ClientWriteError::LogEntryDiscarded(f) => {
                ProposeError::not_leader(f)
            }
            ClientWriteError::ChangeMembershipError(e) => ProposeError::Unavailable(e.to_string()),
            // Only conditional membership changes carry preconditions.
            ClientWriteError::PreconditionFailed(e) => ProposeError::Unavailable(e.to_string()),
        }
    }
}

pub(crate) struct Pending {
    pub(crate) update: Update,
    pub(crate) reply: oneshot::Sender<Answer>,
    /// When it was queued.
    pub(crate) queued: Instant,
}

/// A proposal's answer and when it was sent (for the `resume` stage).
pub(crate) struct Answer {
    pub(crate) result: Result<Applied, ProposeError>,
    pub(crate) sent: Instant,
}

/// Starts the batcher task; proposals go into the returned queue.
pub(crate) fn spawn(raft: Raft, settings: &RaftSettings) -> mpsc::Sender<Pending> {
    let (tx, rx) = mpsc::channel(settings.proposal_queue.max(1));
    tokio::spawn(run(raft, rx, settings.clone()));
    tx
}

async fn run(raft: Raft, mut rx: mpsc::Receiver<Pending>, settings: RaftSettings) {
    let inflight = Arc::new(Semaphore::new(settings.max_inflight_batches.max(1)));
    loop {
        // Wait for a slot first: proposals pile up in the queue meanwhile.
        let Ok(permit) = inflight.clone().acquire_owned().await else {
            return;
        };
        let Some(first) = rx.recv().await else {
            return;
        };
        let mut bytes = first.update.encoded_len();
        let mut batch = vec![first];
        while batch.len() < settings.max_batch_updates && bytes < settings.max_batch_bytes {
            match rx.try_recv() {
                Ok(p) => {
                    bytes += p.update.encoded_len();
                    batch.push(p);
                }
                Err(_) => break,
            }
        }
        let formed = Instant::now();
        let (updates, replies): (Vec<Update>, Vec<_>) = batch
            .into_iter()
            .map(|p| {
                crate::metrics::STAGE_QUEUE.observe(secs(p.queued, formed));
                (p.update, p.reply)
            })
            .unzip();
        crate::metrics::BATCH_UPDATES.observe(updates.len() as f64);
        debug_assert!(!updates.is_empty() && updates.len() == replies.len());
        debug_assert!(updates.len() <= settings.max_batch_updates.max(1));
        let proposal = Proposal::new(UpdateBatch { updates });
        // Answered where the entry is applied (see `CallbackResponder`);
        // the slot is free again once it is.
        let responder = CallbackResponder::new(move |result: Option<WriteResult>| {
            drop(permit);
            let sent = Instant::now();
            crate::metrics::STAGE_COMMIT.observe(secs(formed, sent));
            deliver(result, replies, sent);
        });
        if let Err(fatal) = raft.client_write_ff(proposal, Some(responder)).await {
            // The responder went with the refused write and answered its
            // updates (`None`): the outcome of a write Raft stopped on is
            // unknown.
            tracing::debug!("write batch refused: {fatal}");
        }
    }
}

type WriteResult =
    Result<openraft::raft::ClientWriteResponse<TypeConfig>, ClientWriteError<TypeConfig>>;

/// Seconds from `from` to `to`.
pub(crate) fn secs(from: Instant, to: Instant) -> f64 {
    to.saturating_duration_since(from).as_secs_f64()
}

fn deliver(result: Option<WriteResult>, replies: Vec<oneshot::Sender<Answer>>, sent: Instant) {
    let error = match result {
        Some(Ok(resp)) if resp.data.0.len() == replies.len() => {
            let log_index = resp.log_id.index;
            for (r, outcome) in replies.into_iter().zip(resp.data.0) {
                let _ = r.send(Answer {
                    result: Ok(Applied { outcome, log_index }),
                    sent,
                });
            }
            return;
        }
        Some(Ok(resp)) => {
            debug_assert!(false, "the state machine answers every update of a batch");
            ProposeError::Fatal(format!(
                "{} outcomes for {} updates",
                resp.data.0.len(),
                replies.len()
            ))
        }
        Some(Err(e)) => ProposeError::from_write(e),
        None => ProposeError::Fatal("raft stopped".into()),
    };
    for r in replies {
        let _ = r.send(Answer {
            result: Err(error.clone()),
            sent,
        });
    }
}
