//! The core: stamps and proposes updates on the leader, forwards from
//! followers, and waits out leader changes, so a caller connected to any
//! surviving node never sees one. Every update gets an origin on the first
//! node it reaches, so the retries here are exactly-once: a call without one
//! proposes on a lane of its own (`proto::origin::Lanes`), which declares
//! the lane's previous call done, so the replicated state holds one outcome
//! per call in flight here, whatever the traffic.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use journal::pb::Origin;
use journal::{DomainError, State, Update};
use prost::Message;
use proto::coordstore::node_client::NodeClient;
use proto::coordstore::{HeartbeatRequest, ProposeRequest, ReadIndexRequest};
use proto::origin::{Lane, Lanes};
use raft::{Applied, ProposeError, RaftNode, Role};
use tonic::transport::Channel;
use tonic::{Code, Status};

use crate::runtime::LeaderRuntime;
use crate::wake::{KeyWaiters, Parked};

/// gRPC metadata key marking a call forwarded by another node; such a call
/// is never forwarded again (no forwarding loops while leadership moves).
pub const FORWARDED: &str = "x-coordstore-forwarded";

/// Pause between attempts while no leader is reachable.
const RETRY_PAUSE: Duration = Duration::from_millis(50);

/// Wall-clock milliseconds since the epoch (the leader's clock stamps updates).
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Where a call runs.
pub enum Route {
    /// Here: this node is the leader.
    Local,
    /// At the leader, through this client.
    Remote(NodeClient<Channel>),
}

/// A step that could not complete; retry while time is left.
pub struct Retry(pub String);

/// The core of one node.
pub struct Core {
    node: Arc<RaftNode>,
    parked: std::sync::atomic::AtomicU64,
    max_parked: u64,
    key_waiters: KeyWaiters,
    runtime: Arc<LeaderRuntime>,
    lanes: Lanes,
    leader_wait: Duration,
    max_message_bytes: usize,
}

impl Core {
    /// A core over `node`.
    pub fn new(node: Arc<RaftNode>, leader_wait: Duration, max_message_bytes: usize) -> Self {
        Core {
            node,
            parked: std::sync::atomic::AtomicU64::new(0),
            max_parked: crate::wake::DEFAULT_MAX_PARKED_CALLS,
            key_waiters: KeyWaiters::default(),
            runtime: Arc::new(LeaderRuntime::default()),
            lanes: Lanes::new(),
            leader_wait,
            max_message_bytes,
        }
    }

    /// This core with a leader runtime that pushes errors to the
    /// TensorFlow tasks at `tf_addresses` (see [`crate::push`]).
    pub fn with_tf_addresses(
        mut self,
        tf_addresses: std::collections::BTreeMap<String, Vec<String>>,
    ) -> Self {
        self.runtime = Arc::new(LeaderRuntime::new(tf_addresses));
        self
    }

    /// This core with at most `max` client calls parked at once (0: no
    /// bound); past it a call that would park gets RESOURCE_EXHAUSTED.
    pub fn with_max_parked_calls(mut self, max: u64) -> Self {
        self.max_parked = max;
        self
    }

    /// The waiters of blocking gets, by key.
    pub fn key_waiters(&self) -> &KeyWaiters {
        &self.key_waiters
    }

    /// The node.
    pub fn node(&self) -> &Arc<RaftNode> {
        &self.node
    }

    /// The leader runtime (idle while this node follows).
    pub fn runtime(&self) -> &Arc<LeaderRuntime> {
        &self.runtime
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
        if self.node.role() == Role::Leader {
            return Ok(Route::Local);
        }
        let Some((id, addr)) = self.node.leader() else {
            return Err(Retry("no leader is known".into()));
        };
        if id == self.node.id() {
            return Err(Retry("leadership is changing".into()));
        }
        let ch = self.node.channels().get(id, &addr).map_err(Retry)?;
        Ok(Route::Remote(
            NodeClient::new(ch)
                .max_decoding_message_size(self.max_message_bytes)
                .max_encoding_message_size(self.max_message_bytes),
        ))
    }

    /// Runs `local` on the leader or `remote` against it, retrying across
    /// leader changes until the leader wait runs out. With `may_forward`
    /// false (a forwarded call) a non-leader answers UNAVAILABLE instead.
    pub async fn on_leader<T, L, LF, R, RF>(
        &self,
        may_forward: bool,
        mut local: L,
        mut remote: R,
    ) -> Result<T, Status>
    where
        L: FnMut() -> LF,
        LF: Future<Output = Result<T, Retry>>,
        R: FnMut(NodeClient<Channel>) -> RF,
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
                        self.node.id()
                    )))
                }
                Ok(Route::Remote(client)) => match remote(client).await {
                    Ok(v) => return Ok(v),
                    Err(s) if retryable(&s) => format!("forwarding failed: {}", s.message()),
                    Err(s) => return Err(s),
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
    pub async fn propose(&self, mut u: Update, may_forward: bool) -> Result<Applied, Status> {
        let _lane = self.stamp_origin(&mut u);
        let bytes = u.encode_to_vec();
        let u = &u;
        self.on_leader(
            may_forward,
            || async move {
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
            },
            |mut client| {
                let bytes = bytes.clone();
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

    /// Waits until this node (the leader) may serve a linearizable read;
    /// returns the read index (applied here already).
    pub async fn read_barrier(&self) -> Result<u64, Retry> {
        self.node
            .read_barrier()
            .await
            .map_err(|e| Retry(e.to_string()))
    }

    /// The leader's read index: a log index whose state is safe to read
    /// once applied (the leader has applied it when it answers).
    pub async fn read_index(&self, may_forward: bool) -> Result<u64, Status> {
        self.on_leader(
            may_forward,
            || async { self.read_barrier().await },
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
        self.wait_applied(index).await
    }

    /// The last applied log index of this node.
    pub fn applied_index(&self) -> u64 {
        self.node.state().last_applied().map_or(0, |l| l.index)
    }

    /// Waits until this node has applied `index`.
    pub async fn wait_applied(&self, index: u64) -> Result<(), Status> {
        let mut rx = self.node.state().subscribe();
        while *rx.borrow_and_update() < index {
            rx.changed()
                .await
                .map_err(|_| Status::unavailable("the node is shutting down"))?;
        }
        Ok(())
    }

    /// Waits on the local state, from `log_index` on, until `check` answers.
    /// The wait belongs to job `epoch`; a job-epoch reset ends it with ABORTED.
    pub async fn wait_for<T>(
        &self,
        log_index: u64,
        epoch: u64,
        mut check: impl FnMut(&State) -> Option<Result<T, DomainError>>,
    ) -> Result<Result<T, DomainError>, Status> {
        self.wait_applied(log_index).await?;
        let state = self.node.state();
        let mut rx = state.subscribe();
        let mut parked: Option<Parked<'_>> = None;
        loop {
            rx.borrow_and_update();
            let answer = state.read(|s| {
                if s.epoch() != epoch {
                    Some(Err(journal::errors::epoch_reset()))
                } else {
                    check(s)
                }
            });
            if let Some(a) = answer {
                return Ok(a);
            }
            // Counted from the first time the answer is not there yet until
            // the call ends (answered, or dropped with its client).
            if parked.is_none() {
                parked = Some(Parked::new(&self.parked, self.max_parked)?);
            }
            rx.changed()
                .await
                .map_err(|_| Status::unavailable("the node is shutting down"))?;
        }
    }

    /// Waits on the local state, from `log_index` on, until `key` exists
    /// (its value), woken only by changes of that key (see [`crate::wake`]).
    /// The wait belongs to job `epoch`; a job-epoch reset ends it with
    /// ABORTED.
    pub async fn wait_for_key(
        &self,
        log_index: u64,
        epoch: u64,
        key: &str,
    ) -> Result<Result<bytes::Bytes, DomainError>, Status> {
        self.wait_applied(log_index).await?;
        let state = self.node.state();
        let wait = self
            .key_waiters
            .register(journal::coordination::normalize_key(key));
        let mut parked: Option<Parked<'_>> = None;
        loop {
            let woken = wait.notified();
            let answer = state.read(|s| {
                if s.epoch() != epoch {
                    Some(Err(journal::errors::epoch_reset()))
                } else {
                    s.coordination().kv_get(key).map(|v| Ok(v.clone()))
                }
            });
            if let Some(a) = answer {
                return Ok(a);
            }
            if parked.is_none() {
                parked = Some(Parked::new(&self.parked, self.max_parked)?);
            }
            woken.await;
            if self.key_waiters.is_closed() {
                return Err(Status::unavailable("the node is shutting down"));
            }
        }
    }

    /// Client calls parked on this node's applied state right now.
    pub fn parked_calls(&self) -> u64 {
        self.parked.load(std::sync::atomic::Ordering::Relaxed)
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
    /// [`Core::local_answer_window`].
    pub fn leader_heard_recently(&self) -> bool {
        self.node
            .leader_contact_age()
            .is_some_and(|age| age <= self.local_answer_window())
    }

    /// Delivers a task's heartbeat to the leader runtime.
    pub async fn heartbeat(
        &self,
        task: u32,
        incarnation: u64,
        may_forward: bool,
    ) -> Result<Result<(), DomainError>, Status> {
        self.on_leader(
            may_forward,
            || async { self.runtime.heartbeat(self, task, incarnation).await },
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
