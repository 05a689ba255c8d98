//! The read coalescer: one read barrier serves every read queued before it
//! started. The barrier goes through the log (a no-op entry committed and
//! applied by this leader, Raft thesis §6.4's simplest form) rather than
//! openraft 0.9's `ensure_linearizable`: the fault suite recorded stale reads
//! after acknowledged writes on a leader under CPU load with the latter
//! (tests/tests/faults.rs, sigkill scenario; never with the log barrier).

use openraft::error::RaftError;
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
        let result = log_barrier(&raft).await;
        for r in waiting {
            let _ = r.send(result.clone());
        }
    }
}

/// A read barrier through the log: a no-op entry committed and applied by
/// this leader; once its response arrives the state machine holds every
/// write acknowledged before the barrier started.
async fn log_barrier(raft: &Raft) -> Result<(), ProposeError> {
    let noop = journal::Update {
        command: Some(journal::pb::update::Command::Noop(journal::pb::Noop {})),
        ..Default::default()
    };
    let proposal = storage::Proposal(journal::pb::UpdateBatch {
        updates: vec![noop],
    });
    match raft.client_write(proposal).await {
        Ok(_) => Ok(()),
        Err(RaftError::APIError(e)) => Err(ProposeError::from_write(e)),
        Err(RaftError::Fatal(f)) => Err(ProposeError::Fatal(f.to_string())),
    }
}
