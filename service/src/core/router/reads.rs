//! A follower's linearizable reads: the leader's read index, asked in
//! rounds that serve every read waiting when a round goes out.

use proto::coordstore::ReadIndexRequest;
use raft::LeaderView;
use tonic::transport::Channel;
use tonic::Status;

use super::forwarding::{forwarded, peer_call};
use super::{Attempt, Router};
use crate::core::call::{Call, CallError, CallResult};

/// A follower's reads, coalesced: each linearizable read on a follower
/// needs an index the leader gave after the read arrived. One ReadIndex
/// call to the leader at a time serves every read that was waiting when it
/// was sent; reads that arrive while it is out wait for the next. A job of
/// thousands of tasks parks two long polls per task at once, each after a
/// read: this asks the leader a few times instead of once per poll. The
/// round runs in its own task, so a caller that gives up (its deadline,
/// its stream reset) takes nothing from the others, and a leader that does
/// not answer ends the round after the leader wait.
#[derive(Default)]
pub(super) struct ReadRounds {
    queue: std::sync::Mutex<ReadQueue>,
}

#[derive(Default)]
struct ReadQueue {
    /// A round is out (its task takes the next batch when it returns).
    asking: bool,
    /// The leader as the newest waiting read found it, and the view it was
    /// found in.
    leader: Option<(Channel, LeaderView)>,
    waiting: Vec<tokio::sync::oneshot::Sender<CallResult<u64>>>,
}

type ReadBatch = (
    (Channel, LeaderView),
    Vec<tokio::sync::oneshot::Sender<CallResult<u64>>>,
);

impl ReadRounds {
    fn lock(&self) -> std::sync::MutexGuard<'_, ReadQueue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The next batch of waiting reads and the leader to ask, or `None`
    /// (and no round out) when none waits.
    fn next_batch(&self) -> Option<ReadBatch> {
        let mut q = self.lock();
        debug_assert!(q.asking, "only the round out takes the next batch");
        match q.leader.take() {
            Some(ch) if !q.waiting.is_empty() => Some((ch, std::mem::take(&mut q.waiting))),
            _ => {
                q.asking = false;
                q.waiting.clear();
                None
            }
        }
    }
}

impl Router {
    /// The leader's read index: a log index whose state is safe to read
    /// once applied (the leader has applied it when it answers).
    pub async fn read_index(&self, call: &Call) -> CallResult<u64> {
        self.on_leader_with(
            call,
            (false, Attempt::Short),
            || async { Ok(self.leader.read_barrier().await?) },
            |ch| async move { self.forwarded_read(ch).await },
        )
        .await
    }

    /// A read index from the leader at `ch` (the leader this node sees
    /// now), asked after this call: the next [`ReadRounds`] round's. A
    /// round ends as a forward does (a leader change, the forward attempt),
    /// so a leader that hangs holds no read for longer.
    async fn forwarded_read(&self, ch: Channel) -> CallResult<u64> {
        let view = self.node().leader_view();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let start = {
            let mut q = self.reads.lock();
            q.waiting.push(tx);
            q.leader = Some((ch, view));
            !std::mem::replace(&mut q.asking, true)
        };
        if start {
            let rounds = self.reads.clone();
            let max = self.max_message_bytes;
            let (wait, node) = (self.attempt.min(self.leader_wait), self.node().clone());
            tokio::spawn(async move {
                while let Some(((ch, view), batch)) = rounds.next_batch() {
                    let asked =
                        async { peer_call!(ch, max, read_index, forwarded(ReadIndexRequest {})) };
                    let r = tokio::select! {
                        biased;
                        r = tokio::time::timeout(wait, asked) => match r {
                            Ok(r) => r.map(|r| r.into_inner().index).map_err(CallError::from),
                            Err(_) => Err(Status::unavailable("the leader did not answer in time").into()),
                        },
                        () = node.leader_moved(view) => {
                            Err(Status::unavailable("the leader changed during the read round").into())
                        }
                    };
                    for tx in batch {
                        let _ = tx.send(r.clone());
                    }
                }
            });
        }
        rx.await.map_err(|_| {
            CallError::from(Status::unavailable("the read round to the leader stopped"))
        })?
    }
}
