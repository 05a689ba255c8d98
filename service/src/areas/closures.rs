//! The closure-queue area's calls (journal area `closures`): every call
//! proposes one update through the core (a follower forwards the proposal
//! to the leader) with the caller's origin, so a retried call is
//! exactly-once. Calls that wait — a put into a full queue, a get with
//! nothing queued, a join, a fetch — park on this node's applied state, so
//! they ride through leader changes. A join proposes one `Done` step and
//! then waits until the queue is idle or has an error; the caller steps
//! again (with its own origin), so the error is raised by a call the
//! caller proposed.

use std::sync::Arc;
use std::time::Duration;

use journal::closures::Closure;
use journal::pb::closures::{self as cmd, command::Command, reply::Reply as R};
use journal::pb::outcome;
use journal::{Answer, Wait};
use raft::Applied;
use tokio::time::Instant;
use tonic::Status;

use crate::core::{now_ms, Call, CallError, CallResult, Core};

/// Longest a get, join or fetch waits in one call.
pub const MAX_WAIT: Duration = Duration::from_secs(60);
/// Most closures one List or fetch answers.
pub const MAX_LIST: usize = 10_000;

/// A wait of at most `ms` (and [`MAX_WAIT`]).
fn capped(ms: u64) -> Duration {
    Duration::from_millis(ms).min(MAX_WAIT)
}

/// What a get was handed: its closures (none if nothing came in time) and
/// the queue's lease.
pub struct Leased {
    /// The closures, each under the lease.
    pub closures: Vec<cmd::Assigned>,
    /// The queue's lease, ms.
    pub lease_ms: u64,
}

/// The closure-queue area of one node.
#[derive(Clone)]
pub struct Closures {
    core: Arc<Core>,
}

impl Closures {
    /// Calls through `core`.
    pub fn new(core: Arc<Core>) -> Self {
        Closures { core }
    }

    /// The core.
    pub fn core(&self) -> &Arc<Core> {
        &self.core
    }

    /// Proposes `command` for call `c`: its reply, and where it applied. A
    /// domain error is the call's status.
    async fn propose(
        &self,
        c: &Call,
        command: impl Into<Command>,
    ) -> CallResult<(cmd::Reply, Applied)> {
        let mut u = c.update(command.into());
        let applied = self.core.propose(c, &mut u).await?;
        if let Some(e) = &applied.outcome.error {
            return Err(CallError::Domain(e.clone()));
        }
        let reply = match &applied.outcome.reply {
            Some(outcome::Reply::Closures(r)) => r.clone(),
            _ => cmd::Reply::default(),
        };
        Ok((reply, applied))
    }

    /// Proposes one step (renew, finish, fail, put back, done, release):
    /// its reply.
    pub async fn step(&self, c: &Call, command: impl Into<Command>) -> CallResult<cmd::Reply> {
        Ok(self.propose(c, command).await?.0)
    }

    /// Parks until `wait` answers, from `index` on, for at most `wait_for`
    /// (`None`: no limit); `None` if it did not answer in time.
    async fn park(
        &self,
        c: &Call,
        index: u64,
        wait: Wait,
        wait_for: Option<Duration>,
    ) -> CallResult<Option<Answer>> {
        let deadline = wait_for.map(|w| Instant::now() + w);
        match self.core.park(c, index, None, wait, deadline).await? {
            None => Ok(None),
            Some(answer) => answer.map(Some).map_err(CallError::Domain),
        }
    }

    /// CreateQueue: the queue's configuration as stored (the first
    /// create's).
    pub async fn create_queue(
        &self,
        c: &Call,
        q: cmd::CreateQueue,
    ) -> CallResult<cmd::QueueConfig> {
        let name = q.queue.clone();
        let (_, applied) = self.propose(c, q).await?;
        self.core.parking().wait_applied(applied.log_index).await?;
        self.queue_config(c, &name)
    }

    fn queue_config(&self, c: &Call, queue: &str) -> CallResult<cmd::QueueConfig> {
        self.core
            .read(c, |s| s.closures().queue(queue).and_then(|q| q.config))?
            .ok_or_else(|| CallError::Domain(journal::closures::errors::queue_not_found(queue)))
    }

    /// Put: the first closure's id, and the error it raised, if any. Into a
    /// full queue it waits, as upstream's put does, until every closure is
    /// admitted (or cancelled by the first error).
    pub async fn put(&self, c: &Call, p: cmd::Put) -> CallResult<cmd::Reply> {
        let queue = p.queue.clone();
        let n = 1 + p.more_payloads.len() as u64;
        let (reply, applied) = self.propose(c, p).await?;
        let Some(R::ClosureId(id)) = reply.reply else {
            return Err(Status::internal("a put answered no closure id").into());
        };
        if applied.outcome.parked {
            // They are admitted in order: the last one decides.
            let wait = Wait::ClosurePut {
                queue,
                last: id + n - 1,
            };
            self.park(c, applied.log_index, wait, None).await?;
        }
        Ok(reply)
    }

    /// Get: up to `max_closures` queued closures under the lease, waiting
    /// up to `timeout_ms` for one. A closure handed to this call after it
    /// gave up goes back to the queue when its lease ends.
    pub async fn get(
        &self,
        c: &Call,
        queue: String,
        worker: String,
        timeout_ms: u64,
        max_closures: u32,
    ) -> CallResult<Leased> {
        let wait = capped(timeout_ms);
        let lease_ms = self.queue_config(c, &queue).map_or(0, |q| q.lease_ms);
        let get = cmd::Get {
            queue: queue.clone(),
            worker,
            deadline_ms: now_ms() + wait.as_millis() as u64,
            max_closures,
        };
        let (reply, applied) = self.propose(c, get).await?;
        let mut closures = Vec::new();
        if let Some(R::Assigned(a)) = reply.reply {
            closures.push(a);
            closures.extend(reply.more_assigned);
        } else {
            let call = applied.outcome.call_id;
            let answer = self
                .park(
                    c,
                    applied.log_index,
                    Wait::ClosureGet { queue, call },
                    Some(wait),
                )
                .await?;
            if let Some(Answer::Assigned(Some(a))) = answer {
                closures.push(a);
            }
        }
        Ok(Leased { closures, lease_ms })
    }

    /// Join: one `Done` step; when the queue is busy, waits up to
    /// `timeout_ms` until a step would answer (the caller steps again).
    pub async fn join(&self, c: &Call, queue: String, timeout_ms: u64) -> CallResult<cmd::Reply> {
        let done = cmd::Done {
            queue: queue.clone(),
        };
        let (reply, applied) = self.propose(c, done).await?;
        let idle = matches!(reply.reply, Some(R::Idle(true)));
        if reply.raised.is_none() && !idle {
            let wait = Wait::JoinReady { queue };
            self.park(c, applied.log_index, wait, Some(capped(timeout_ms)))
                .await?;
            return Ok(cmd::Reply::default());
        }
        Ok(reply)
    }

    /// The records of closures `ids` of `queue` once every one is settled
    /// or `timeout_ms` passed (0: at once), read from a linearizable point
    /// on; an unknown queue or closure is the call's error.
    pub async fn fetch(
        &self,
        c: &Call,
        queue: String,
        ids: Vec<u64>,
        timeout_ms: u64,
    ) -> CallResult<Vec<Closure>> {
        if ids.len() > MAX_LIST {
            return Err(Status::invalid_argument(format!(
                "{} closure ids in one fetch; at most {MAX_LIST}",
                ids.len()
            ))
            .into());
        }
        let index = self.core.linearizable(c).await?;
        // 0: answered at once, settled or not.
        if timeout_ms > 0 {
            let wait = Wait::ClosuresSettled {
                queue: queue.clone(),
                ids: ids.clone(),
                settled: 0,
            };
            self.park(c, index, wait, Some(capped(timeout_ms))).await?;
        }
        self.core.read(c, |s| {
            let q = s.closures();
            ids.iter()
                .map(|&id| match q.settled(&queue, id) {
                    Err(e) => Err(CallError::Domain(e)),
                    Ok(Some(closure)) => Ok(closure.clone()),
                    Ok(None) => Ok(q.closure(id).cloned().unwrap_or_default()),
                })
                .collect()
        })?
    }

    /// List: up to `limit` (0: [`MAX_LIST`]) closures of `queue` with ids
    /// above `after`, with `tag` when it is not empty (linearizable).
    pub async fn list(
        &self,
        c: &Call,
        queue: &str,
        tag: &str,
        after: u64,
        limit: usize,
    ) -> CallResult<Vec<Closure>> {
        self.core.linearizable(c).await?;
        let limit = match limit {
            0 => MAX_LIST,
            n => n.min(MAX_LIST),
        };
        self.core
            .read(c, |s| {
                let q = s.closures();
                q.queue(queue).map(|_| {
                    q.list(queue, tag, after, limit)
                        .into_iter()
                        .cloned()
                        .collect()
                })
            })?
            .ok_or_else(|| CallError::Domain(journal::closures::errors::queue_not_found(queue)))
    }
}
