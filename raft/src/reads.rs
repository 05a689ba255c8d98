//! The read coalescer: linearizable reads by ReadIndex (Raft thesis §6.4),
//! one quorum round for every read queued before the round started.
//!
//! A round asks openraft for its read index (`get_read_log_id`: the greater
//! of the leader's commit index and its first entry of the term, captured
//! *before* the heartbeat round that confirms leadership), raises it to the
//! last log index this node found on disk at start-up (bounded by the log it
//! has now), and waits until the state the service reads has applied it.
//!
//! The start-up floor is belt and braces. The cause of the stale reads the
//! fault suite once recorded is that openraft restores a restarted leader
//! as leader of its old term with a commit index read from disk that may be
//! behind its last acknowledged entry (openraft issue #1511); the Raft
//! config prevents that (`enable_leader_restore` off, see `config`), and the floor
//! keeps a read from being served below anything this node had logged
//! before it restarted, whoever is leader.

use std::sync::Arc;

use openraft::errors::{LinearizableReadError, RaftError};
use openraft::type_config::async_runtime::WatchReceiver;
use storage::StateHandle;
use tokio::sync::{mpsc, oneshot, Semaphore};

use crate::batcher::ProposeError;
use crate::network::Raft;

pub(crate) type ReadReply = oneshot::Sender<Result<u64, ProposeError>>;

/// Quorum rounds in flight at once; reads that arrive meanwhile queue for
/// the next round.
const MAX_INFLIGHT_ROUNDS: usize = 4;

/// Starts the coalescer task; read requests go into the returned queue.
/// `floor` is the last log index found on disk at start-up.
pub(crate) fn spawn(raft: Raft, state: StateHandle, floor: u64) -> mpsc::Sender<ReadReply> {
    let (tx, rx) = mpsc::channel(65_536);
    tokio::spawn(run(raft, state, floor, rx));
    tx
}

async fn run(raft: Raft, state: StateHandle, floor: u64, mut rx: mpsc::Receiver<ReadReply>) {
    let rounds = Arc::new(Semaphore::new(MAX_INFLIGHT_ROUNDS));
    loop {
        let Ok(permit) = rounds.clone().acquire_owned().await else {
            return;
        };
        let Some(first) = rx.recv().await else {
            return;
        };
        let mut waiting = vec![first];
        while let Ok(r) = rx.try_recv() {
            waiting.push(r);
        }
        let (raft, state) = (raft.clone(), state.clone());
        tokio::spawn(async move {
            let result = read_index(&raft, &state, floor).await;
            drop(permit);
            for r in waiting {
                let _ = r.send(result.clone());
            }
        });
    }
}

/// One ReadIndex round: the index every read queued before it may be served
/// at, once this node's state has applied it.
async fn read_index(raft: &Raft, state: &StateHandle, floor: u64) -> Result<u64, ProposeError> {
    let (read_log_id, _) = raft
        .get_read_log_id(openraft::ReadPolicy::ReadIndex)
        .await
        .map_err(|e| match e {
            RaftError::APIError(LinearizableReadError::ForwardToLeader(f)) => {
                ProposeError::not_leader(f)
            }
            RaftError::APIError(LinearizableReadError::QuorumNotEnough(q)) => {
                ProposeError::Unavailable(format!(
                    "no quorum confirmed the leadership (heard from {:?} of {})",
                    q.got, q.cluster
                ))
            }
            RaftError::Fatal(f) => ProposeError::Fatal(f.to_string()),
        })?;
    // Entries logged before a restart and since truncated by another
    // leader cannot hold the read back: the floor is capped by today's log.
    let last_log = raft.metrics().borrow_watched().last_log_index.unwrap_or(0);
    let index = read_log_id.index().max(floor.min(last_log));
    wait_applied(state, index).await?;
    Ok(index)
}

/// Waits until the service's state has applied `index`.
async fn wait_applied(state: &StateHandle, index: u64) -> Result<(), ProposeError> {
    let mut rx = state.subscribe();
    while *rx.borrow_and_update() < index {
        rx.changed()
            .await
            .map_err(|_| ProposeError::Fatal("the state machine stopped".into()))?;
    }
    Ok(())
}
