//! The router: runs a call on the leader wherever it arrives. On the leader
//! it hands the call to the [`LocalLeader`]; on a follower it forwards it to
//! the leader; in between it waits out leader changes, so a caller connected
//! to any surviving node never sees one. Every update gets an origin on the
//! first node it reaches ([`super::call`]), so the retries here are
//! exactly-once: a call without one proposes on a lane of its own
//! (`proto::origin::Lanes`), which declares the lane's previous call done,
//! so the replicated state holds one outcome per call in flight here,
//! whatever the traffic.
//!
//! A forward never waits on one leader for long (a leader that hangs, lost
//! its quorum or stopped is a gray failure, not a crash: its connections
//! stay open): an attempt ends as soon as this node's own Raft view names
//! another leader or term, or after the forward attempt
//! (`--forward-attempt-ms`) for the calls a healthy leader answers at once,
//! and the call goes to the leader this node then knows. A client on a
//! follower therefore waits for an election and one attempt at most.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use journal::Update;
use prometheus::{exponential_buckets, Histogram, HistogramOpts, IntCounter};
use prost::Message;
use proto::coordstore::node_client::NodeClient;
use proto::origin::Lanes;
use raft::{Applied, LeaderView, RaftNode};
use tonic::transport::Channel;
use tonic::{Code, Status};

use super::call::{Call, CallError, CallResult};
use super::leader::{LocalLeader, Retry};

mod batches;
mod forwarding;
mod reads;

pub use batches::{answer as batch_answer, item_headers, MOST_PER_BATCH};
use forwarding::node_client;
pub use forwarding::{forward, Forwarding};
use reads::ReadRounds;

/// gRPC metadata key marking a call forwarded by another node; such a call
/// is never forwarded again (no forwarding loops while leadership moves).
/// A client can set it too: all it gets is an UNAVAILABLE from a follower.
pub const FORWARDED: &str = "x-coordstore-forwarded";

/// Pause between attempts while no leader is reachable.
const RETRY_PAUSE: Duration = Duration::from_millis(50);

/// The default forward attempt (`--forward-attempt-ms`): a healthy leader
/// answers a proposal or a read index in milliseconds, an election here
/// takes one to two seconds.
pub const DEFAULT_FORWARD_ATTEMPT_MS: u64 = 2000;

/// How long one attempt of a call may wait on one leader.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attempt {
    /// At most the forward attempt: what a healthy leader answers at once
    /// (proposals, read indexes, heartbeats, the dialects' calls).
    Short,
    /// The whole leader wait: calls that take long on a healthy leader
    /// (a state snapshot, a membership change, a namespace's lifecycle).
    Whole,
}

/// Calls this node forwards to the leader at once; more wait here for a
/// slot. All of them share one HTTP/2 connection, and the leader's h2 server
/// closes a connection (GOAWAY `ENHANCE_YOUR_CALM`, every call on it failing
/// with RESOURCE_EXHAUSTED) once the small DATA frames it has received but
/// not yet handed to a handler cost more than half its connection window
/// (h2 0.4.20 counts 256 − payload bytes per frame under 256 bytes against
/// 512 KiB with hyper's 1 MiB window: about 2,000–4,000 small requests).
/// A follower forwarding the registrations and long polls of thousands of
/// tasks at once crossed it (`bench/results/README.md`, "Scale"); 1,024 small
/// requests stay well inside it, and the leader batches what it holds.
pub const FORWARDS_IN_FLIGHT: usize = 1024;

/// Where a call runs.
pub enum Route {
    /// Here: this node is the leader.
    Local,
    /// At the leader, through this channel to it, as this node's view
    /// names it.
    Remote(Channel, LeaderView),
}

/// What the router records of the proposals made through it (the
/// operations layer registers them with its metrics).
#[derive(Clone)]
pub struct ProposalMetrics {
    /// Proposals this node made (its own and forwarded ones).
    pub proposals: IntCounter,
    /// Proposal → applied outcome, seconds.
    pub seconds: Histogram,
    /// Proposals in each batch this node forwarded to its leader.
    pub forward_batches: Histogram,
}

impl Default for ProposalMetrics {
    fn default() -> Self {
        // 50 µs to ~26 s.
        let buckets = exponential_buckets(0.000_05, 2.0, 20).expect("valid buckets");
        ProposalMetrics {
            proposals: IntCounter::new(
                "raft_proposals_total",
                "Updates proposed through this node",
            )
            .expect("valid counter"),
            seconds: Histogram::with_opts(
                HistogramOpts::new(
                    "raft_proposal_seconds",
                    "Proposal to applied outcome, through this node",
                )
                .buckets(buckets),
            )
            .expect("valid histogram"),
            forward_batches: Histogram::with_opts(
                HistogramOpts::new(
                    "raft_forward_batch_proposals",
                    "Proposals in each batch this node forwarded to its leader",
                )
                .buckets(exponential_buckets(1.0, 2.0, 11).expect("valid buckets")),
            )
            .expect("valid histogram"),
        }
    }
}

/// The router of one node.
pub struct Router {
    leader: LocalLeader,
    lanes: Lanes,
    forwards: tokio::sync::Semaphore,
    reads: Arc<ReadRounds>,
    batches: Arc<batches::ProposeBatches>,
    leader_wait: Duration,
    attempt: Duration,
    max_message_bytes: usize,
    metrics: ProposalMetrics,
    slow: Duration,
}

impl Router {
    /// A router over `leader` that keeps looking for a leader for
    /// `leader_wait`, with `max_message_bytes` on forwarded calls.
    pub fn new(leader: LocalLeader, leader_wait: Duration, max_message_bytes: usize) -> Self {
        Router {
            leader,
            lanes: Lanes::new(),
            forwards: tokio::sync::Semaphore::new(FORWARDS_IN_FLIGHT),
            reads: Arc::default(),
            batches: Arc::default(),
            leader_wait,
            attempt: Duration::from_millis(DEFAULT_FORWARD_ATTEMPT_MS),
            max_message_bytes,
            metrics: ProposalMetrics::default(),
            slow: Duration::from_secs(1),
        }
    }

    /// The same router ending a short attempt on one leader after `attempt`
    /// (see [`Attempt`]).
    pub fn with_forward_attempt(mut self, attempt: Duration) -> Self {
        self.attempt = attempt;
        self
    }

    /// The same router logging each proposal slower than `slow`.
    pub fn with_slow_request(mut self, slow: Duration) -> Self {
        self.slow = slow;
        self
    }

    /// What the router records of its proposals.
    pub fn metrics(&self) -> &ProposalMetrics {
        &self.metrics
    }

    /// The node.
    pub fn node(&self) -> &Arc<RaftNode> {
        self.leader.node()
    }

    /// This node in its leader role.
    pub fn leader(&self) -> &LocalLeader {
        &self.leader
    }

    /// The lanes origins are drawn on.
    pub fn lanes(&self) -> &Lanes {
        &self.lanes
    }

    /// The largest gRPC message this node sends or receives.
    pub fn max_message_bytes(&self) -> usize {
        self.max_message_bytes
    }

    /// Where the next attempt goes, or why it must wait.
    pub fn route(&self) -> Result<Route, Retry> {
        if self.leader.is_leader() {
            return Ok(Route::Local);
        }
        let node = self.node();
        let view = node.leader_view();
        let (Some(id), Some((known, addr))) = (view.leader, node.leader()) else {
            return Err(Retry("no leader is known".into()));
        };
        if id == node.id() || id != known {
            return Err(Retry("leadership is changing".into()));
        }
        let ch = node.channels().get(id, &addr).map_err(Retry)?;
        Ok(Route::Remote(ch, view))
    }

    /// A Node API client on `ch`, with this node's message limits.
    pub fn node_client(&self, ch: Channel) -> NodeClient<Channel> {
        node_client(ch, self.max_message_bytes)
    }

    /// Runs `local` on the leader or `remote` over a channel to it,
    /// retrying across leader changes until the leader wait runs out. No
    /// attempt outlives the wait: a forward to a leader that hangs ends as
    /// UNAVAILABLE, never as the caller's deadline. A forward ends as soon
    /// as this node sees another leader or term, and after the forward
    /// attempt ([`Attempt::Short`]), and goes to the leader this node then
    /// knows. A forwarded call is not forwarded again: on a node that is
    /// not the leader it answers UNAVAILABLE.
    pub async fn on_leader<T, L, LF, R, RF>(
        &self,
        call: &Call,
        local: L,
        remote: R,
    ) -> CallResult<T>
    where
        L: FnMut() -> LF,
        LF: Future<Output = CallResult<T>>,
        R: FnMut(Channel) -> RF,
        RF: Future<Output = CallResult<T>>,
    {
        self.on_leader_with(call, (true, Attempt::Short), local, remote)
            .await
    }

    /// [`Router::on_leader`] with each forward waiting as `attempt` says
    /// ([`Attempt::Whole`]: a call that takes long on a healthy leader ends
    /// a forward on a leader change only).
    pub async fn on_leader_as<T, L, LF, R, RF>(
        &self,
        call: &Call,
        attempt: Attempt,
        local: L,
        remote: R,
    ) -> CallResult<T>
    where
        L: FnMut() -> LF,
        LF: Future<Output = CallResult<T>>,
        R: FnMut(Channel) -> RF,
        RF: Future<Output = CallResult<T>>,
    {
        self.on_leader_with(call, (true, attempt), local, remote)
            .await
    }

    /// A new session's client id (a TCPStore connection's: its requests'
    /// origins are `(id, seq)`; see `Call::request`): drawn here, as every
    /// origin is; a random 63-bit id, as a lane's is.
    pub fn new_session(&self) -> u64 {
        rand::random::<u64>() >> 1 | 1
    }

    /// `call` with an origin, so that every attempt of it, here or
    /// forwarded, is one exactly-once write: the caller's origin, or one
    /// drawn on one of this node's lanes, held until the returned lane
    /// drops (when the call is over). The one place an origin is drawn.
    pub fn exactly_once(&self, call: &Call) -> (Call, Option<proto::origin::Lane>) {
        call.with_origin(&self.lanes)
    }

    /// [`Router::on_leader`]; a `bounded` forward takes one of the
    /// [`FORWARDS_IN_FLIGHT`] slots while it is out (a read joining a
    /// [`ReadRounds`] round sends nothing of its own); each forward waits
    /// on its leader as `attempt` says.
    async fn on_leader_with<T, L, LF, R, RF>(
        &self,
        call: &Call,
        (bounded, attempt): (bool, Attempt),
        mut local: L,
        mut remote: R,
    ) -> CallResult<T>
    where
        L: FnMut() -> LF,
        LF: Future<Output = CallResult<T>>,
        R: FnMut(Channel) -> RF,
        RF: Future<Output = CallResult<T>>,
    {
        let (deadline, callers) = self.attempts_end(call);
        debug_assert!(!callers || call.deadline() == Some(deadline));
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let (why, moved) = match self.route() {
                // An attempt never outlives the leader wait (a leader cut off
                // from its quorum would hold it forever); the retry after it
                // is exactly-once by origin.
                Ok(Route::Local) => {
                    match tokio::time::timeout(left, self.local(call, local())).await {
                        Ok(Err(CallError::Retry(why))) => (why, false),
                        Ok(answer) => return answer,
                        Err(_) => ("the leader did not commit in time".to_string(), false),
                    }
                }
                Ok(Route::Remote(..)) | Err(_) if call.forwarded() => {
                    return Err(Status::unavailable(format!(
                        "node {} is not the leader",
                        self.node().id()
                    ))
                    .into())
                }
                Ok(Route::Remote(ch, view)) => {
                    // Waiting for a slot is this node's queue, not the
                    // leader's silence: it does not count against the
                    // attempt.
                    let slot = match bounded {
                        true => tokio::time::timeout(left, self.forwards.acquire()).await,
                        false => Ok(Ok(self.no_slot())),
                    };
                    let Ok(Ok(_slot)) = slot else {
                        return Err(self.gave_up(callers, "no forward slot in time").into());
                    };
                    let attempt = (attempt == Attempt::Short).then_some(self.attempt);
                    match self.forward_once(view, (attempt, left), remote(ch)).await {
                        Ok(answer) => return answer,
                        Err(gone) => gone,
                    }
                }
                Err(Retry(why)) => (why, false),
            };
            if Instant::now() >= deadline {
                return Err(self.gave_up(callers, &why).into());
            }
            if !moved {
                tokio::time::sleep(RETRY_PAUSE).await;
            }
        }
    }

    /// `here`, the call run on this node as the leader; a call whose client
    /// goes elsewhere when told ends UNAVAILABLE once this node stalls
    /// (see [`super::Core::unless_stalled`]).
    async fn local<T>(
        &self,
        call: &Call,
        here: impl Future<Output = CallResult<T>>,
    ) -> CallResult<T> {
        if !call.retried_elsewhere() {
            return here.await;
        }
        tokio::select! {
            biased;
            r = here => r,
            why = self.node().stalls() => Err(super::stalled(self.node().id(), &why).into()),
        }
    }

    /// A forward slot for a call that takes none (a read joining a round).
    fn no_slot(&self) -> tokio::sync::SemaphorePermit<'_> {
        // Zero permits: nothing held, nothing to give back.
        self.forwards
            .try_acquire_many(0)
            .expect("zero permits are always there")
    }

    /// One forward, `sent`, to the leader of `view`: its answer, or why the
    /// call should go again (and whether the leader moved, when it should go
    /// at once). It ends when this node sees another leader or term, after
    /// `left`, and, every `attempt` (a short one), once this node has not
    /// heard from the leader for that long: a leader that is heard from is
    /// alive and still the one to ask, so the call keeps its place there (a
    /// busy leader is not asked twice, which would cost it twice and an
    /// exactly-once table entry more).
    async fn forward_once<T>(
        &self,
        view: LeaderView,
        (attempt, left): (Option<Duration>, Duration),
        sent: impl Future<Output = CallResult<T>>,
    ) -> Result<CallResult<T>, (String, bool)> {
        let leader = view.leader.unwrap_or_default();
        let end = tokio::time::Instant::now() + left;
        let every = attempt.unwrap_or(left).min(left);
        let mut check = tokio::time::Instant::now() + every;
        tokio::pin!(sent);
        loop {
            tokio::select! {
                biased;
                answer = &mut sent => return match answer {
                    Err(CallError::Status(s)) if retryable(&s) => {
                        Err((format!("forwarding to node {leader} failed: {}", s.message()), false))
                    }
                    Err(CallError::Retry(why)) => Err((why, false)),
                    answer => Ok(answer),
                },
                () = self.node().leader_moved(view) => return Err((
                    format!("node {leader} stopped leading (term {}) while it had the call", view.term),
                    true,
                )),
                () = tokio::time::sleep_until(check) => {
                    let heard = self.node().leader_contact_age().is_some_and(|a| a < every);
                    if check >= end || attempt.is_some() && !heard {
                        return Err((format!(
                            "the leader (node {leader}) did not answer within {} ms{}",
                            every.as_millis(),
                            if heard { "" } else { " and was not heard from" }
                        ), false));
                    }
                    check = (check + every).min(end);
                }
            }
        }
    }

    /// When the attempts of `call` end: after the leader wait, or at the
    /// caller's deadline if that comes first (`true` then).
    fn attempts_end(&self, call: &Call) -> (Instant, bool) {
        let wait = Instant::now() + self.leader_wait;
        match call.deadline() {
            Some(d) if d < wait => (d, true),
            _ => (wait, false),
        }
    }

    /// The status of a call whose attempts ended (see
    /// [`Router::attempts_end`]): DEADLINE_EXCEEDED at the caller's
    /// deadline, UNAVAILABLE after the leader wait.
    fn gave_up(&self, callers: bool, why: &str) -> Status {
        if callers {
            return Status::deadline_exceeded(format!(
                "the caller's deadline passed before a leader served the call: {why}"
            ));
        }
        Status::unavailable(format!(
            "no leader could serve the call within {} ms: {why}",
            self.leader_wait.as_millis()
        ))
    }

    /// Proposes `u` (stamping an origin if it has none and, on the leader,
    /// the time) and returns its outcome once applied.
    ///
    /// An update that needs a journal feature level the cluster does not run
    /// at is refused here, before it is proposed or forwarded (see
    /// [`super::levels`]).
    pub async fn propose(&self, call: &Call, u: &mut Update) -> CallResult<Applied> {
        super::levels::require(self.node(), u.required_level(), || describe(u)).await?;
        let t0 = Instant::now();
        self.metrics.proposals.inc();
        let (call, _lane) = self.exactly_once(call);
        if u.origin.is_none() {
            u.origin = call.origin();
        }
        let u = &*u;
        let call = &call;
        let r = self
            .on_leader(
                call,
                || async {
                    // A leader whose disk is below its reserve, with no
                    // healthy voter to take over, takes no client writes.
                    if let Some(why) = self.node().refusing_writes() {
                        return Err(Status::resource_exhausted(why).into());
                    }
                    Ok(self.leader.propose(u).await?)
                },
                |ch| {
                    // Encoded for a forward only: the leader proposes `u` itself.
                    let update = bytes::Bytes::from(u.encode_to_vec());
                    async move {
                        let reply = self.forward_proposal(ch, call, update).await?;
                        let outcome =
                            journal::Outcome::decode(reply.outcome.as_ref()).map_err(|e| {
                                Status::internal(format!("bad outcome from leader: {e}"))
                            })?;
                        Ok(Applied {
                            outcome,
                            log_index: reply.log_index,
                        })
                    }
                },
            )
            .await;
        let took = t0.elapsed();
        if r.is_ok() {
            self.metrics.seconds.observe(took.as_secs_f64());
        }
        if took >= self.slow {
            let error = r
                .as_ref()
                .err()
                .map(|e| e.clone().into_plain_status())
                .map(|s| format!("{:?}: {}", s.code(), s.message()));
            tracing::warn!(
                ms = took.as_millis() as u64,
                ok = r.is_ok(),
                error,
                "slow request: a proposal took {} ms to apply",
                took.as_millis()
            );
        }
        r
    }
}

/// How a refusal names update `u`: its command, and its namespace.
fn describe(u: &Update) -> String {
    match u.namespace.as_str() {
        "" => u.command_name(),
        ns => format!("{} in namespace {ns}", u.command_name()),
    }
}

/// Whether a failed forward may be retried (possibly at another leader).
fn retryable(s: &Status) -> bool {
    matches!(
        s.code(),
        Code::Unavailable | Code::Unknown | Code::Cancelled | Code::DeadlineExceeded
    )
}
