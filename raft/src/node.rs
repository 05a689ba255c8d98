//! A replicating node: storage, openraft, the write batcher and the read
//! coalescer, idempotent bootstrap of a static cluster, membership calls.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;

use journal::Update;
use openraft::errors::{InitializeError, RaftError};
use openraft::type_config::async_runtime::WatchReceiver;
use openraft::{BasicNode, RaftMetrics, ServerState};
use proto::coordstore::raft_peer_server::RaftPeerServer;
use storage::{Identity, NodeId, StateHandle, TypeConfig};
use tokio::sync::{mpsc, oneshot};

use crate::batcher::{self, Applied, Pending, ProposeError};
use crate::config::RaftSettings;
use crate::contact::Contact;
use crate::health::{Health, HealthReport};
use crate::network::{Channels, PeerNetwork, PeerService, PeerToken, Raft};
use crate::reads::{self, ReadReply};
use crate::steward::{self, Watched};

/// A receiver of a node's Raft metrics.
pub type MetricsWatch =
    openraft::type_config::alias::WatchReceiverOf<TypeConfig, RaftMetrics<TypeConfig>>;

/// A receiver of a node's server metrics (role, leader, vote, membership).
/// Unlike [`MetricsWatch`], which changes with every write (log index,
/// commit, apply) and so wakes whoever waits on it several times per write,
/// it changes only with those.
pub type ServerWatch = openraft::type_config::alias::WatchReceiverOf<
    TypeConfig,
    openraft::metrics::RaftServerMetrics<TypeConfig>,
>;

/// The term the node of `m` leads in, if it is the leader.
pub fn leading_term(m: &openraft::metrics::RaftServerMetrics<TypeConfig>) -> Option<u64> {
    (m.state == openraft::ServerState::Leader && m.current_leader == Some(m.id))
        .then_some(m.vote.leader_id.term)
}

/// Who leads, as one node sees it: the term of its vote and the leader it
/// knows (none while it votes or campaigns).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaderView {
    /// The term.
    pub term: u64,
    /// The leader, if known.
    pub leader: Option<NodeId>,
}

fn view_of(m: &openraft::metrics::RaftServerMetrics<TypeConfig>) -> LeaderView {
    LeaderView {
        term: m.vote.leader_id.term,
        leader: m.current_leader,
    }
}

/// What a node needs to start.
#[derive(Clone, Debug)]
pub struct NodeConfig {
    /// This node's id (unique in the cluster, > 0).
    pub node_id: NodeId,
    /// The address peers and clients reach this node at (host:port).
    pub address: String,
    /// The data dir: the Raft log's segment files (`wal/`), the sled
    /// metadata database, the snapshot file and the committed marker.
    pub data_dir: PathBuf,
    /// Name of the cluster; a data dir of another cluster is refused.
    pub cluster_id: String,
    /// sled page-cache bound.
    pub cache_bytes: u64,
    /// Replication tunables.
    pub settings: RaftSettings,
    /// Addresses this node uses for some peers instead of their membership
    /// address.
    pub peer_overrides: std::collections::HashMap<NodeId, String>,
    /// The cluster's shared peer token: sent with every peer RPC and
    /// required of every one received. None: peers are not authenticated
    /// (the peer port must then be reachable by trusted hosts only).
    pub peer_token: Option<String>,
    /// TLS of the links this node dials to peers (None: plaintext).
    pub peer_tls: Option<tonic::transport::ClientTlsConfig>,
}

/// Why a node could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The data dir cannot be used.
    #[error(transparent)]
    Storage(#[from] storage::OpenError),
    /// Bad settings or an openraft start-up failure.
    #[error("{0}")]
    Raft(String),
}

/// The role of a node as seen locally.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Leader.
    Leader,
    /// Voter following a leader (or candidate).
    Follower,
    /// Non-voting learner.
    Learner,
    /// Stopped.
    Shutdown,
}

impl Role {
    /// A member's role as a node sees it (the members' list says whether
    /// it votes, the node's view which member leads).
    pub fn of_member(id: NodeId, voter: bool, leader: Option<NodeId>) -> Role {
        match (Some(id) == leader, voter) {
            (true, _) => Role::Leader,
            (false, true) => Role::Follower,
            (false, false) => Role::Learner,
        }
    }

    /// Lowercase name.
    pub fn as_str(&self) -> &'static str {
        match self {
            Role::Leader => "leader",
            Role::Follower => "follower",
            Role::Learner => "learner",
            Role::Shutdown => "shutdown",
        }
    }
}

/// Triggers a snapshot whenever `limit` bytes of log payload were applied
/// since the last one, or as many as the last snapshot holds if that is
/// more (openraft's own policy counts entries only, and a batched entry can
/// carry megabytes). While a build runs, openraft ignores the trigger.
async fn snapshot_by_bytes(raft: Raft, state: StateHandle, limit: u64) {
    let mut tick = tokio::time::interval(std::time::Duration::from_millis(100));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let due = snapshot_due(
            state.log_bytes_since_snapshot(),
            limit,
            state.last_snapshot_bytes(),
        );
        if due && raft.trigger().snapshot().await.is_err() {
            return;
        }
    }
}

/// Whether `log_bytes` of log since the last snapshot call for the next
/// one: at least `floor`, and at least the last snapshot's size. Every
/// snapshot encodes the whole state under a lock that applies wait for;
/// with a fixed interval its cost per written byte grows with the state,
/// here it stays at most one byte of snapshot per byte of log (the rule of
/// Redis's AOF rewrite at 100%). The log kept for it lives in the log files
/// and the page cache, not in the process (the in-memory tail is bounded on
/// its own), and replaying it at start costs about what loading a snapshot
/// of that size does.
fn snapshot_due(log_bytes: u64, floor: u64, last_snapshot: u64) -> bool {
    log_bytes >= floor.max(last_snapshot)
}

/// Keeps `contact`'s voter set in step with the membership.
async fn track_voters(raft: Raft, contact: Arc<Contact>) {
    let mut rx = raft.server_metrics();
    let mut seen = None;
    loop {
        let membership = rx.borrow_and_update().membership_config.clone();
        if seen.as_ref() != Some(&membership) {
            contact.set_voters(membership.membership().voter_ids().collect());
            seen = Some(membership);
        }
        if rx.changed().await.is_err() {
            return;
        }
    }
}

/// Lets a (re)started member of a larger cluster campaign only after a
/// leader lease plus a random part of the election timeout, the time a
/// follower that still counts on its leader waits.
///
/// openraft times a node's first election from its start-up, and a node
/// that led when it stopped starts with an uncommitted vote
/// (`enable_leader_restore` is off, see `config`), so its timer is the bare election timeout
/// (250–750 ms by default), often shorter than the time the current leader
/// takes to reach a restarted peer. Its campaign was then refused for its
/// older log, which sets openraft's seen-a-greater-log flag; the flag is
/// only cleared by the node's next election, so when the leader later died
/// this node's election timer was 2 × the maximum election timeout longer
/// (failover measured 2.8 s instead of 1.5 s). With the same vote term and a
/// higher node id its refused vote could also depose the current leader.
/// A single voter campaigns at once: nobody else can lead.
/// The disk's steward (`steward::watch`) turns elections on after
/// this hold, unless the disk is unhealthy.
fn election_hold(raft: &Raft, settings: &RaftSettings) -> std::time::Duration {
    let (min_ms, max_ms) = (
        settings.election_timeout_min_ms,
        settings.election_timeout_max_ms,
    );
    let voters = raft
        .metrics()
        .borrow_watched()
        .membership_config
        .membership()
        .voter_ids()
        .count();
    match voters > 1 {
        true => std::time::Duration::from_millis(max_ms + rand::random_range(0..=min_ms)),
        false => std::time::Duration::ZERO,
    }
}

/// openraft's configuration of `cfg`, elections off: they stay off until
/// the steward lets them run (see [`election_hold`]).
fn held_config(cfg: &NodeConfig) -> Result<Arc<openraft::Config>, StartError> {
    let config = cfg
        .settings
        .openraft_config(&cfg.cluster_id)
        .map_err(StartError::Raft)?;
    Ok(Arc::new(openraft::Config {
        enable_elect: false,
        ..(*config).clone()
    }))
}

/// Opens `cfg`'s data dir (rebuilding the state from snapshot + log), off
/// the async workers.
async fn open_storage(
    cfg: &NodeConfig,
) -> Result<(storage::LogStore, storage::StateMachine), StartError> {
    let identity = Identity {
        cluster_id: cfg.cluster_id.clone(),
        node_id: cfg.node_id,
    };
    let data_dir = cfg.data_dir.clone();
    let cache = cfg.cache_bytes;
    let opened = tokio::task::spawn_blocking(move || storage::open(&data_dir, cache, &identity))
        .await
        .map_err(|e| StartError::Raft(format!("storage open task failed: {e}")))?;
    Ok(opened?)
}

/// The tasks beside openraft: the disk's health watch (which also holds
/// elections back at start), the voters tracked for the leader's quorum
/// age, snapshots by log size.
fn spawn_helpers(
    raft: &Raft,
    settings: &RaftSettings,
    contact: &Arc<Contact>,
    state: &StateHandle,
    watched: Watched,
) {
    tokio::spawn(steward::watch(watched));
    tokio::spawn(track_voters(raft.clone(), contact.clone()));
    if settings.snapshot_log_bytes > 0 {
        tokio::spawn(snapshot_by_bytes(
            raft.clone(),
            state.clone(),
            settings.snapshot_log_bytes,
        ));
    }
}

/// A running node.
pub struct RaftNode {
    id: NodeId,
    cluster_id: String,
    address: String,
    raft: Raft,
    state: StateHandle,
    writes: mpsc::Sender<Pending>,
    reads: mpsc::Sender<ReadReply>,
    channels: Channels,
    max_message_bytes: usize,
    heartbeat: std::time::Duration,
    election_timeout: std::time::Duration,
    contact: Arc<Contact>,
    peer_token: PeerToken,
    /// Role, leader and membership, read without copying the full metrics.
    server: ServerWatch,
    /// The disk's health (gray failures).
    health: Arc<Health>,
    /// What each member last said of its journal feature level (see
    /// [`RaftNode::member_levels`]).
    levels: std::sync::Mutex<BTreeMap<NodeId, Result<u32, String>>>,
    _runtime: RaftRuntime,
}

/// How often [`RaftNode::failed`] looks whether the Raft core stopped.
const FATAL_CHECK: std::time::Duration = std::time::Duration::from_millis(50);

/// How long a member has to say its journal feature level.
const LEVEL_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// The runtime Raft's tasks run on: one of their own, or the caller's.
struct RaftRuntime(Option<tokio::runtime::Runtime>);

impl RaftRuntime {
    fn new(threads: usize) -> Result<Self, StartError> {
        if threads == 0 {
            return Ok(RaftRuntime(None));
        }
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .thread_name("raft")
            .enable_all()
            .build()
            .map(|rt| RaftRuntime(Some(rt)))
            .map_err(|e| StartError::Raft(format!("cannot start Raft's runtime: {e}")))
    }

    fn handle(&self) -> tokio::runtime::Handle {
        match &self.0 {
            Some(rt) => rt.handle().clone(),
            None => tokio::runtime::Handle::current(),
        }
    }
}

impl Drop for RaftRuntime {
    fn drop(&mut self) {
        // Dropped from async code too, where waiting would panic.
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

impl RaftNode {
    /// Opens the data dir (rebuilding the state from snapshot + log) and starts
    /// openraft. Serve [`RaftNode::peer_service`] on `address` afterwards.
    pub async fn start(cfg: NodeConfig) -> Result<Arc<RaftNode>, StartError> {
        let (log, sm) = open_storage(&cfg).await?;
        let state = sm.handle();
        let health = Arc::new(Health::new(
            cfg.settings.health(),
            cfg.data_dir.clone(),
            log.flush_watch(),
        ));
        // Reads are never served below what this node had logged before it
        // (re)started (see `reads`).
        let read_floor = log.last_index().map_err(StartError::Raft)?;
        let config = held_config(&cfg)?;
        let channels =
            Channels::with_overrides(cfg.peer_overrides.clone()).with_tls(cfg.peer_tls.clone());
        let contact = Arc::new(Contact::new(cfg.node_id));
        let peer_token = PeerToken::new(cfg.peer_token.clone()).for_cluster(&cfg.cluster_id);
        let network = PeerNetwork::new(
            channels.clone(),
            cfg.settings.max_message_bytes,
            contact.clone(),
            peer_token.clone(),
        );
        let runtime = RaftRuntime::new(cfg.settings.raft_threads)?;
        let handle = runtime.handle();
        let node_id = cfg.node_id;
        // openraft spawns its tasks on the runtime it starts on.
        let raft = handle
            .spawn(async move { Raft::new(node_id, config, network, log, sm).await })
            .await
            .map_err(|e| StartError::Raft(format!("openraft's start task failed: {e}")))?
            .map_err(|e| StartError::Raft(format!("openraft failed to start: {e}")))?;
        let election_timeout = cfg.settings.election_timeout();
        let watched = Watched {
            raft: raft.clone(),
            health: health.clone(),
            channels: channels.clone(),
            token: peer_token.clone(),
            election_timeout,
            hold: election_hold(&raft, &cfg.settings),
        };
        spawn_helpers(&raft, &cfg.settings, &contact, &state, watched);
        let (writes, reads) = {
            let _on = handle.enter();
            (
                batcher::spawn(raft.clone(), &cfg.settings),
                reads::spawn(raft.clone(), state.clone(), read_floor),
            )
        };
        let server = raft.server_metrics();
        Ok(Arc::new(RaftNode {
            id: cfg.node_id,
            cluster_id: cfg.cluster_id.clone(),
            address: cfg.address,
            raft,
            state,
            writes,
            reads,
            channels,
            max_message_bytes: cfg.settings.max_message_bytes,
            heartbeat: std::time::Duration::from_millis(cfg.settings.heartbeat_interval_ms),
            election_timeout,
            contact,
            health,
            peer_token,
            server,
            levels: std::sync::Mutex::default(),
            _runtime: runtime,
        }))
    }

    /// The cluster's id.
    pub fn cluster_id(&self) -> &str {
        &self.cluster_id
    }

    /// The cluster's peer token (required of peer RPCs and membership
    /// changes when the cluster has one).
    pub fn peer_token(&self) -> &PeerToken {
        &self.peer_token
    }

    /// This node's id.
    pub fn id(&self) -> NodeId {
        self.id
    }

    /// This node's address.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// The tonic service for peer RPCs, to add to the node's server.
    pub fn peer_service(&self) -> RaftPeerServer<PeerService> {
        PeerService::server(
            self.raft.clone(),
            self.max_message_bytes,
            self.heartbeat,
            self.contact.clone(),
            self.peer_token.clone(),
            self.health.clone(),
        )
    }

    /// This node's disk health: free space against the reserve, fdatasync
    /// latency, and what the node did about them.
    pub fn health(&self) -> HealthReport {
        self.health.report()
    }

    /// Why this node is stalled now (an fdatasync, or its Raft core, stuck
    /// past the slow threshold): it cannot serve now.
    pub fn stalled(&self) -> Option<String> {
        self.health.stalled()
    }

    /// Returns why, once this node is stalled (see [`RaftNode::stalled`]).
    pub async fn stalls(&self) -> String {
        self.health.stalls().await
    }

    /// Why this node, the leader, refuses client writes now (its disk is
    /// below the reserve and no healthy voter can take over); `None`: it
    /// does not.
    pub fn refusing_writes(&self) -> Option<String> {
        self.health.refusing_writes()
    }

    /// The peer channel cache (also used to forward calls to the leader).
    pub fn channels(&self) -> &Channels {
        &self.channels
    }

    /// The applied state.
    pub fn state(&self) -> &StateHandle {
        &self.state
    }

    /// The openraft handle.
    pub fn raft(&self) -> &Raft {
        &self.raft
    }

    /// Bootstraps a static cluster of `members` (id → address). Idempotent: a
    /// node that is already initialised (a restart, or another member did it)
    /// does nothing.
    pub async fn bootstrap(&self, members: &BTreeMap<NodeId, String>) -> Result<(), String> {
        let nodes: BTreeMap<NodeId, BasicNode> = members
            .iter()
            .map(|(id, addr)| (*id, BasicNode::new(addr.clone())))
            .collect();
        if !nodes.contains_key(&self.id) {
            return Err(format!("node {} is not in the cluster list", self.id));
        }
        match self.raft.is_initialized().await {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            Err(e) => return Err(e.to_string()),
        }
        match self.raft.initialize(nodes).await {
            Ok(()) => Ok(()),
            Err(RaftError::APIError(InitializeError::NotAllowed(_))) => Ok(()),
            Err(e) => Err(e.to_string()),
        }
    }

    /// Proposes one update through the write batcher; `NotLeader` on a follower.
    pub async fn propose(&self, update: Update) -> Result<Applied, ProposeError> {
        let (reply, rx) = oneshot::channel();
        let pending = Pending {
            update,
            reply,
            queued: std::time::Instant::now(),
        };
        self.writes
            .send(pending)
            .await
            .map_err(|_| ProposeError::Fatal("the write batcher stopped".into()))?;
        let answer = rx
            .await
            .map_err(|_| ProposeError::Fatal("the write batcher dropped the proposal".into()))?;
        crate::metrics::STAGE_RESUME.observe(batcher::secs(answer.sent, std::time::Instant::now()));
        answer.result
    }

    /// Waits until a linearizable read of the local state is safe (leader
    /// only; ReadIndex): one quorum round serves every read queued before it
    /// started. Returns the read index, which the local state has applied.
    pub async fn read_barrier(&self) -> Result<u64, ProposeError> {
        let (reply, rx) = oneshot::channel();
        self.reads
            .send(reply)
            .await
            .map_err(|_| ProposeError::Fatal("the read coalescer stopped".into()))?;
        rx.await
            .map_err(|_| ProposeError::Fatal("the read coalescer dropped the read".into()))?
    }

    /// The election timeout: a follower that hears no leader for between
    /// this and 1.5× this campaigns.
    pub fn election_timeout(&self) -> std::time::Duration {
        self.election_timeout
    }

    /// How long ago this node knows a leader held a quorum: as leader, since
    /// a majority of voters last acknowledged it; as follower (or candidate),
    /// since the last leader it accepted vouched for its own quorum. `None`
    /// if it never knew one.
    pub fn leader_contact_age(&self) -> Option<std::time::Duration> {
        if self.role() == Role::Leader {
            self.contact.quorum_age()
        } else {
            self.contact.vouched_age()
        }
    }

    /// The latest metrics.
    pub fn metrics(&self) -> RaftMetrics<TypeConfig> {
        self.raft.metrics().borrow_watched().clone()
    }

    /// Waits until the metrics change (any field); false once Raft stopped.
    pub async fn metrics_changed(rx: &mut MetricsWatch) -> bool {
        rx.changed().await.is_ok()
    }

    /// A receiver of metrics changes, for [`RaftNode::metrics_changed`].
    pub fn metrics_watch(&self) -> MetricsWatch {
        self.raft.metrics()
    }

    /// A receiver of role, leader, vote and membership changes only.
    pub fn server_watch(&self) -> ServerWatch {
        self.raft.server_metrics()
    }

    /// The leader as this node sees it now: the term of its vote and the
    /// leader it knows.
    pub fn leader_view(&self) -> LeaderView {
        view_of(&self.server.borrow_watched())
    }

    /// Returns once this node sees another leader than `view` (a new term,
    /// another leader or none), or Raft stopped: a call waiting on the
    /// leader of `view` should be sent again.
    pub async fn leader_moved(&self, view: LeaderView) {
        let mut rx = self.raft.server_metrics();
        loop {
            if view_of(&rx.borrow_watched()) != view || rx.changed().await.is_err() {
                return;
            }
        }
    }

    /// The leader as this node knows it: (id, address).
    pub fn leader(&self) -> Option<(NodeId, String)> {
        let m = self.server.borrow_watched();
        let id = m.current_leader?;
        let addr = m
            .membership_config
            .membership()
            .get_node(&id)
            .map(|n| n.addr.clone())?;
        Some((id, addr))
    }

    /// This node's role.
    pub fn role(&self) -> Role {
        match self.server.borrow_watched().state {
            ServerState::Leader => Role::Leader,
            ServerState::Learner => Role::Learner,
            ServerState::Shutdown => Role::Shutdown,
            ServerState::Follower | ServerState::Candidate => Role::Follower,
        }
    }

    /// Every member: (id, address, is_voter).
    pub fn members(&self) -> Vec<(NodeId, String, bool)> {
        let m = self.server.borrow_watched();
        let membership = m.membership_config.membership();
        let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
        membership
            .nodes()
            .map(|(id, n)| (*id, n.addr.clone(), voters.contains(id)))
            .collect()
    }

    /// Adds a learner (non-voter) and waits until it has caught up.
    pub async fn add_learner(&self, id: NodeId, address: &str) -> Result<(), String> {
        self.raft
            .add_learner(id, BasicNode::new(address), true)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    /// Makes exactly `voters` the voting members (joint consensus); other
    /// members stay learners when `keep_learners`.
    pub async fn change_voters(
        &self,
        voters: BTreeSet<NodeId>,
        keep_learners: bool,
    ) -> Result<(), String> {
        self.raft
            .change_membership(voters, keep_learners)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    /// Removes node `id` from the cluster entirely.
    pub async fn remove(&self, id: NodeId) -> Result<(), String> {
        let voters: BTreeSet<NodeId> = self
            .members()
            .into_iter()
            .filter(|(n, _, voter)| *voter && *n != id)
            .map(|(n, _, _)| n)
            .collect();
        self.change_voters(voters, false).await
    }

    /// Triggers a snapshot now.
    pub async fn snapshot_now(&self) -> Result<(), String> {
        self.raft
            .trigger()
            .snapshot()
            .await
            .map_err(|e| e.to_string())
    }

    /// Asks every member (voters and learners) which journal feature level
    /// it applies, all at once: its level (this node's own is
    /// [`journal::FEATURE_LEVEL`]; a node of a build before namespaces,
    /// which does not know the question, [`journal::LEVEL_BASE`]), or why
    /// it did not answer. Kept for [`RaftNode::known_levels`].
    pub async fn member_levels(&self) -> BTreeMap<NodeId, Result<u32, String>> {
        let asks = self.members().into_iter().map(|(id, addr, _)| async move {
            if id == self.id {
                return (id, Ok(journal::FEATURE_LEVEL));
            }
            let level = match self.channels.get(id, &addr) {
                Ok(ch) => crate::network::ask_feature_level(ch, &self.peer_token, LEVEL_WAIT).await,
                Err(e) => Err(e),
            };
            (id, level.map_err(|e| format!("unreachable: {e}")))
        });
        let levels: BTreeMap<_, _> = futures_util::future::join_all(asks)
            .await
            .into_iter()
            .collect();
        *self.levels.lock().unwrap_or_else(|p| p.into_inner()) = levels.clone();
        levels
    }

    /// What each member said of its journal feature level when last asked
    /// ([`RaftNode::member_levels`]); empty until then.
    pub fn known_levels(&self) -> BTreeMap<NodeId, Result<u32, String>> {
        self.levels
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The journal feature level of the node at `address` (not yet a
    /// member, say), as [`RaftNode::member_levels`] asks it.
    pub async fn level_at(&self, id: NodeId, address: &str) -> Result<u32, String> {
        let ch = Channels::new()
            .with_tls(self.channels.tls().cloned())
            .get(id, address)?;
        crate::network::ask_feature_level(ch, &self.peer_token, LEVEL_WAIT).await
    }

    /// Waits until the Raft core stops on an error of its own (a storage
    /// failure, an entry this build cannot apply); returns the error. A node
    /// whose core stopped serves nothing more: the process should end.
    ///
    /// It looks every [`FATAL_CHECK`] instead of waiting on openraft's
    /// metrics watch, which changes on every append, commit, apply and
    /// acknowledgement: a waiter there was woken several times per call,
    /// on another thread, and cost a 1-client put 0.12 ms of its 0.69 ms
    /// p50 on 2 cores (bench/results/README.md, "The write path since
    /// 67351a4").
    pub async fn failed(&self) -> String {
        use futures_util::FutureExt;
        let mut rx = self.raft.metrics();
        let mut every = tokio::time::interval(FATAL_CHECK);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            if let Err(fatal) = &rx.borrow_watched().running_state {
                return fatal.to_string();
            }
            // Closed: the core is gone (a change seen here is just marked).
            if let Some(Err(_)) = rx.changed().now_or_never() {
                return "the Raft core stopped".into();
            }
        }
    }

    /// Stops openraft.
    pub async fn shutdown(&self) {
        let _ = self.raft.shutdown().await;
    }
}

#[cfg(test)]
mod tests {
    use super::snapshot_due;
    use super::{NodeConfig, ProposeError, RaftNode, RaftSettings};
    use journal::pb::{coordination::KvIncrement, update::Command};
    use journal::Update;
    use std::time::Duration;

    fn increment(key: &str) -> Update {
        Update::from(Command::from(KvIncrement {
            key: key.into(),
            increment: 1,
        }))
    }

    /// The write batcher packs concurrent proposals into shared entries and
    /// answers each caller with its own outcome once applied; once Raft is
    /// shut down a proposal gets an error instead of waiting forever.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn proposals_are_answered_once_applied_and_refused_after_shutdown() {
        proposals_answered_then_refused(RaftSettings::default()).await;
    }

    /// The same with Raft on a runtime of its own, whose thread is there.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn raft_on_a_runtime_of_its_own_answers_the_same() {
        let threads = || {
            std::fs::read_dir("/proc/self/task")
                .unwrap()
                .filter(|t| {
                    let comm = t.as_ref().unwrap().path().join("comm");
                    std::fs::read_to_string(comm).is_ok_and(|c| c.trim() == "raft")
                })
                .count()
        };
        let settings = RaftSettings {
            raft_threads: 1,
            ..RaftSettings::default()
        };
        let before = threads();
        let node = proposals_answered_then_refused(settings).await;
        assert!(threads() > before, "no thread of Raft's own runtime");
        drop(node);
    }

    async fn proposals_answered_then_refused(settings: RaftSettings) -> std::sync::Arc<RaftNode> {
        let dir = tempfile::tempdir().unwrap();
        let node = RaftNode::start(NodeConfig {
            node_id: 1,
            address: "127.0.0.1:1".into(),
            data_dir: dir.path().to_path_buf(),
            cluster_id: "test".into(),
            cache_bytes: 1 << 20,
            settings,
            peer_overrides: Default::default(),
            peer_token: None,
            peer_tls: None,
        })
        .await
        .unwrap();
        node.bootstrap(&[(1, "127.0.0.1:1".to_string())].into())
            .await
            .unwrap();
        // A single voter elects itself at once; wait for that, bounded.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        let first = loop {
            match node.propose(increment("n")).await {
                Ok(a) => break a,
                Err(ProposeError::NotLeader { .. } | ProposeError::Unavailable(_))
                    if tokio::time::Instant::now() < deadline =>
                {
                    tokio::time::sleep(Duration::from_millis(20)).await
                }
                Err(e) => panic!("no leader within 30 s: {e}"),
            }
        };
        assert_eq!(first.outcome.incremented(), Some(1));
        let calls = (0..64).map(|_| {
            let node = node.clone();
            tokio::spawn(async move { node.propose(increment("n")).await })
        });
        let mut values = Vec::new();
        for call in calls.collect::<Vec<_>>() {
            let applied = call.await.unwrap().expect("applied");
            assert!(applied.log_index > first.log_index);
            values.push(applied.outcome.incremented().expect("a value"));
        }
        values.sort();
        assert_eq!(
            values,
            (2..=65).collect::<Vec<i64>>(),
            "each caller its own outcome"
        );
        node.shutdown().await;
        let after = tokio::time::timeout(Duration::from_secs(10), node.propose(increment("n")))
            .await
            .expect("answered, not left waiting");
        assert!(matches!(after, Err(ProposeError::Fatal(_))), "{after:?}");
        node
    }

    #[test]
    fn a_snapshot_is_due_after_the_floor_or_the_last_snapshots_size_whichever_is_more() {
        // A small state: the floor decides.
        assert!(!snapshot_due((8 << 20) - 1, 8 << 20, 1 << 20));
        assert!(snapshot_due(8 << 20, 8 << 20, 1 << 20));
        // A state bigger than the floor: as much log as the last snapshot.
        assert!(!snapshot_due(8 << 20, 8 << 20, 40 << 20));
        assert!(snapshot_due(40 << 20, 8 << 20, 40 << 20));
        // No snapshot yet.
        assert!(snapshot_due(8 << 20, 8 << 20, 0));
    }
}
