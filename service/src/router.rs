//! The router: runs a call on the leader wherever it arrives. On the leader
//! it hands the call to the [`LocalLeader`]; on a follower it forwards it
//! to the leader; in between it waits out leader changes, so a caller
//! connected to any surviving node never sees one. Every update gets an
//! origin on the first node it reaches, so the retries here are
//! exactly-once: a call without one proposes on a lane of its own
//! (`proto::origin::Lanes`), which declares the lane's previous call done, so
//! the replicated state holds one outcome per call in flight here, whatever
//! the traffic.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use journal::pb::Origin;
use journal::{DomainError, Update};
use prost::Message;
use proto::coordstore::node_client::NodeClient;
use proto::coordstore::{HeartbeatRequest, ProposeRequest, ReadIndexRequest};
use proto::origin::{Lane, Lanes};
use raft::{Applied, RaftNode};
use tonic::transport::Channel;
use tonic::{Code, Status};

use crate::duties::coordination::CoordinationDuty;
use crate::leader::{LocalLeader, Retry};
use crate::wake::Waits;

/// gRPC metadata key marking a call forwarded by another node; such a call
/// is never forwarded again (no forwarding loops while leadership moves).
pub const FORWARDED: &str = "x-coordstore-forwarded";

/// Pause between attempts while no leader is reachable.
const RETRY_PAUSE: Duration = Duration::from_millis(50);

/// Where a call runs.
pub enum Route {
    /// Here: this node is the leader.
    Local,
    /// At the leader, through this channel to it.
    Remote(Channel),
}

/// The router of one node.
pub struct Router {
    leader: LocalLeader,
    coordination: Arc<CoordinationDuty>,
    waits: Arc<Waits>,
    lanes: Lanes,
    leader_wait: Duration,
    max_message_bytes: usize,
    metrics: Arc<crate::ops::Metrics>,
    slow: Duration,
}

impl Router {
    /// A router over `leader`, giving heartbeats that reach the leader to
    /// its `coordination` duty; its calls park through `waits`.
    pub fn new(
        leader: LocalLeader,
        coordination: Arc<CoordinationDuty>,
        waits: Arc<Waits>,
        leader_wait: Duration,
        max_message_bytes: usize,
    ) -> Self {
        Router {
            waits,
            leader,
            coordination,
            lanes: Lanes::new(),
            leader_wait,
            max_message_bytes,
            metrics: Arc::default(),
            slow: Duration::from_secs(1),
        }
    }

    /// The same router logging each proposal slower than `slow`.
    pub fn with_slow_request(mut self, slow: Duration) -> Self {
        self.slow = slow;
        self
    }

    /// The same router recording its proposals in `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<crate::ops::Metrics>) -> Self {
        self.metrics = metrics;
        self
    }

    /// This node's metrics.
    pub fn metrics(&self) -> &Arc<crate::ops::Metrics> {
        &self.metrics
    }

    /// The waits of parked calls on this node's applied state.
    pub fn waits(&self) -> &Waits {
        &self.waits
    }

    /// The node.
    pub fn node(&self) -> &Arc<RaftNode> {
        self.leader.node()
    }

    /// This node in its leader role.
    pub fn leader(&self) -> &LocalLeader {
        &self.leader
    }

    /// Gives `u` an origin on a lane of its own if it has none; the lane is
    /// held until the returned guard drops (when the call is over).
    pub fn stamp_origin(&self, u: &mut Update) -> Option<Lane> {
        if u.origin.is_some() {
            return None;
        }
        let lane = self.lanes.checkout();
        let o = lane.origin();
        u.origin = Some(Origin {
            client_id: o.client_id,
            seq: o.seq,
            done_below: o.done_below,
        });
        Some(lane)
    }

    /// Where the next attempt goes, or why it must wait.
    pub fn route(&self) -> Result<Route, Retry> {
        if self.leader.is_leader() {
            return Ok(Route::Local);
        }
        let node = self.node();
        let Some((id, addr)) = node.leader() else {
            return Err(Retry("no leader is known".into()));
        };
        if id == node.id() {
            return Err(Retry("leadership is changing".into()));
        }
        let ch = node.channels().get(id, &addr).map_err(Retry)?;
        Ok(Route::Remote(ch))
    }

    /// A Node API client on `ch`, with this node's message limits.
    fn node_client(&self, ch: Channel) -> NodeClient<Channel> {
        NodeClient::new(ch)
            .max_decoding_message_size(self.max_message_bytes)
            .max_encoding_message_size(self.max_message_bytes)
    }

    /// The largest gRPC message this node sends or receives.
    pub fn max_message_bytes(&self) -> usize {
        self.max_message_bytes
    }

    /// Runs `local` on the leader or `remote` against its Node API,
    /// retrying across leader changes until the leader wait runs out (see
    /// [`Router::on_leader_via`]).
    pub async fn on_leader<T, L, LF, R, RF>(
        &self,
        may_forward: bool,
        local: L,
        mut remote: R,
    ) -> Result<T, Status>
    where
        L: FnMut() -> LF,
        LF: Future<Output = Result<T, Retry>>,
        R: FnMut(NodeClient<Channel>) -> RF,
        RF: Future<Output = Result<T, Status>>,
    {
        self.on_leader_via(may_forward, local, |ch| remote(self.node_client(ch)))
            .await
    }

    /// Runs `local` on the leader or `remote` over a channel to it,
    /// retrying across leader changes until the leader wait runs out. No
    /// attempt outlives the wait: a forward to a leader that hangs ends as
    /// UNAVAILABLE, never as the caller's deadline. With `may_forward` false
    /// (a forwarded call) a non-leader answers UNAVAILABLE instead.
    pub async fn on_leader_via<T, L, LF, R, RF>(
        &self,
        may_forward: bool,
        mut local: L,
        mut remote: R,
    ) -> Result<T, Status>
    where
        L: FnMut() -> LF,
        LF: Future<Output = Result<T, Retry>>,
        R: FnMut(Channel) -> RF,
        RF: Future<Output = Result<T, Status>>,
    {
        let deadline = Instant::now() + self.leader_wait;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let why = match self.route() {
                // An attempt never outlives the leader wait (a leader cut off
                // from its quorum would hold it forever); the retry after it
                // is exactly-once by origin.
                Ok(Route::Local) => match tokio::time::timeout(left, local()).await {
                    Ok(Ok(v)) => return Ok(v),
                    Ok(Err(Retry(why))) => why,
                    Err(_) => "the leader did not commit in time".to_string(),
                },
                Ok(Route::Remote(_)) | Err(_) if !may_forward => {
                    return Err(Status::unavailable(format!(
                        "node {} is not the leader",
                        self.node().id()
                    )))
                }
                Ok(Route::Remote(ch)) => match tokio::time::timeout(left, remote(ch)).await {
                    Ok(Ok(v)) => return Ok(v),
                    Ok(Err(s)) if retryable(&s) => format!("forwarding failed: {}", s.message()),
                    Ok(Err(s)) => return Err(s),
                    Err(_) => "the leader did not answer in time".to_string(),
                },
                Err(Retry(why)) => why,
            };
            if Instant::now() >= deadline {
                return Err(Status::unavailable(format!(
                    "no leader could serve the call within {} ms: {why}",
                    self.leader_wait.as_millis()
                )));
            }
            tokio::time::sleep(RETRY_PAUSE).await;
        }
    }

    /// Proposes `u` (stamping origin and, on the leader, time) and returns its
    /// outcome once applied.
    pub async fn propose(&self, u: Update, may_forward: bool) -> Result<Applied, Status> {
        let t0 = std::time::Instant::now();
        self.metrics.proposals.inc();
        let r = self.propose_inner(u, may_forward).await;
        let took = t0.elapsed();
        if r.is_ok() {
            self.metrics.proposal_seconds.observe(took.as_secs_f64());
        }
        if took >= self.slow {
            tracing::warn!(
                ms = took.as_millis() as u64,
                ok = r.is_ok(),
                "slow request: a proposal took {} ms to apply",
                took.as_millis()
            );
        }
        r
    }

    async fn propose_inner(&self, mut u: Update, may_forward: bool) -> Result<Applied, Status> {
        let _lane = self.stamp_origin(&mut u);
        let u = &u;
        self.on_leader(
            may_forward,
            || self.leader.propose(u),
            |mut client| {
                // Encoded for a forward only: the leader proposes `u` itself.
                let bytes = u.encode_to_vec();
                async move {
                    let req = forwarded(ProposeRequest {
                        update: bytes.into(),
                    });
                    let reply = client.propose(req).await?.into_inner();
                    let outcome = journal::Outcome::decode(reply.outcome.as_ref())
                        .map_err(|e| Status::internal(format!("bad outcome from leader: {e}")))?;
                    Ok(Applied {
                        outcome,
                        log_index: reply.log_index,
                    })
                }
            },
        )
        .await
    }

    /// The leader's read index: a log index whose state is safe to read
    /// once applied (the leader has applied it when it answers).
    pub async fn read_index(&self, may_forward: bool) -> Result<u64, Status> {
        self.on_leader(
            may_forward,
            || self.leader.read_barrier(),
            |mut c| async move {
                Ok(c.read_index(forwarded(ReadIndexRequest {}))
                    .await?
                    .into_inner()
                    .index)
            },
        )
        .await
    }

    /// Makes the local state safe for a linearizable read (ReadIndex: the
    /// leader confirms its leadership; this node then waits until it has
    /// applied up to the leader's index).
    pub async fn linearizable(&self) -> Result<(), Status> {
        let index = self.read_index(true).await?;
        self.waits.wait_applied(index).await
    }

    /// Delivers a task's heartbeat to the leader's coordination duty.
    pub async fn heartbeat(
        &self,
        task: u32,
        incarnation: u64,
        may_forward: bool,
    ) -> Result<Result<(), DomainError>, Status> {
        self.on_leader(
            may_forward,
            || self.coordination.heartbeat(&self.leader, task, incarnation),
            |mut c| async move {
                let reply = c
                    .heartbeat(forwarded(HeartbeatRequest { task, incarnation }))
                    .await?
                    .into_inner();
                if reply.error.is_empty() {
                    return Ok(Ok(()));
                }
                let e = DomainError::decode(reply.error.as_ref())
                    .map_err(|e| Status::internal(format!("bad heartbeat answer: {e}")))?;
                Ok(Err(e))
            },
        )
        .await
    }
}

/// A request marked as forwarded by this node.
pub fn forwarded<T>(msg: T) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    req.metadata_mut()
        .insert(FORWARDED, "1".parse().expect("ascii"));
    req
}

/// Whether a failed forward may be retried (possibly at another leader).
fn retryable(s: &Status) -> bool {
    matches!(
        s.code(),
        Code::Unavailable | Code::Unknown | Code::Cancelled | Code::DeadlineExceeded
    )
}

/// Whether a request was forwarded by another node.
pub fn was_forwarded<T>(req: &tonic::Request<T>) -> bool {
    req.metadata().contains_key(FORWARDED)
}
