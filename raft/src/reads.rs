//! The read coalescer. Each `ensure_linearizable` in openraft 0.9 costs a
//! heartbeat round, so one call serves every read queued before it started.

use openraft::error::{CheckIsLeaderError, RaftError};
use storage::{Node, NodeId};
use tokio::sync::{mpsc, oneshot};

use crate::batcher::ProposeError;
use crate::network::Raft;

pub(crate) type ReadReply = oneshot::Sender<Result<(), ProposeError>>;

/// Starts the coalescer task; read barriers go into the returned queue.
pub(crate) fn spawn(raft: Raft) -> mpsc::Sender<ReadReply> {
    let (tx, rx) = mpsc::channel(65_536);
    tokio::spawn(run(raft, rx));
    tx
}

async fn run(raft: Raft, mut rx: mpsc::Receiver<ReadReply>) {
    while let Some(first) = rx.recv().await {
        let mut waiting = vec![first];
        while let Ok(r) = rx.try_recv() {
            waiting.push(r);
        }
        let result = raft
            .ensure_linearizable()
            .await
            .map(|_| ())
            .map_err(map_err);
        for r in waiting {
            let _ = r.send(result.clone());
        }
    }
}

fn map_err(e: RaftError<NodeId, CheckIsLeaderError<NodeId, Node>>) -> ProposeError {
    match e {
        RaftError::APIError(CheckIsLeaderError::ForwardToLeader(f)) => ProposeError::not_leader(f),
        RaftError::APIError(CheckIsLeaderError::QuorumNotEnough(q)) => {
            ProposeError::Unavailable(format!("leadership not confirmed: {q}"))
        }
        RaftError::Fatal(f) => ProposeError::Fatal(f.to_string()),
    }
}
