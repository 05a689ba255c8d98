//! Peer transport over tonic: the client side (`RaftNetworkFactory` with one
//! cached channel per peer) and the server side (the `RaftPeer` service).
//! Payloads are the bincode encoding of openraft's RPC types.
//!
//! Replication runs on openraft 0.10's pipelined stream: one `AppendStream`
//! gRPC stream per leader and follower carries AppendEntries frames as the
//! leader's log grows, without waiting for the answer to the one before
//! (the follower answers each, in order, once it is on its disk). A
//! heartbeat (a one-frame stream) and a peer without `AppendStream` use the
//! unary `AppendEntries`.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::{future, stream, Stream, StreamExt};
use openraft::base::{BoxFuture, BoxStream};
use openraft::errors::{
    Fatal, NetworkError, RPCError, RaftError, ReplicationClosed, StreamingError, Unreachable,
};
use openraft::network::{
    stream_append_sequential, v2::RaftNetworkV2, RPCOption, RaftNetworkFactory,
};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, StreamAppendError,
    StreamAppendResult, VoteRequest, VoteResponse,
};
use openraft::type_config::async_runtime::WatchReceiver;
use openraft::OptionalSend;
use proto::coordstore::raft_peer_client::RaftPeerClient;
use proto::coordstore::raft_peer_server::{RaftPeer, RaftPeerServer};
use proto::coordstore::{AppendFrame, FeatureLevelRequest, FeatureLevelResponse, RaftPayload};
use serde::de::DeserializeOwned;
use serde::Serialize;
use storage::{Node, NodeId, Snapshot, SnapshotData, SnapshotMeta, StateMachine, TypeConfig, Vote};

use crate::contact::{Contact, QUORUM_AGE_HEADER};
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Response, Status};

/// The openraft handle of a node.
pub type Raft = openraft::Raft<TypeConfig, StateMachine>;

/// A whole snapshot as it travels to a follower: the leader's vote, the
/// metadata and the encoded state.
type SnapshotTransfer = (Vote, SnapshotMeta, Vec<u8>);

/// Connection timeout of peer channels.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

/// Lazily connected tonic channels to peers, cached by node id and address.
/// An override replaces the membership address of a peer for this node only
/// (a proxy in front of the peer, a different network path).
#[derive(Clone)]
pub struct Channels {
    cache: Arc<Mutex<HashMap<NodeId, (String, Channel)>>>,
    overrides: Arc<HashMap<NodeId, String>>,
    tls: Option<tonic::transport::ClientTlsConfig>,
}

impl Default for Channels {
    fn default() -> Self {
        Self::new()
    }
}

impl Channels {
    /// An empty cache.
    pub fn new() -> Self {
        Self::with_overrides(HashMap::new())
    }

    /// An empty cache that reaches the peers in `overrides` at those addresses.
    pub fn with_overrides(overrides: HashMap<NodeId, String>) -> Self {
        Channels {
            cache: Arc::new(Mutex::new(HashMap::new())),
            overrides: Arc::new(overrides),
            tls: None,
        }
    }

    /// The same, dialing peers over TLS with `tls` (None: plaintext).
    pub fn with_tls(mut self, tls: Option<tonic::transport::ClientTlsConfig>) -> Self {
        self.tls = tls;
        self
    }

    /// The TLS peers are dialed with, if any.
    pub fn tls(&self) -> Option<&tonic::transport::ClientTlsConfig> {
        self.tls.as_ref()
    }

    /// The channel to node `id` at `addr` (host:port), created on first use
    /// and replaced when the address changes.
    pub fn get(&self, id: NodeId, addr: &str) -> Result<Channel, String> {
        let addr = self.overrides.get(&id).map_or(addr, String::as_str);
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((a, ch)) = cache.get(&id) {
            if a == addr {
                return Ok(ch.clone());
            }
        }
        let mut endpoint = Endpoint::from_shared(proto::tls::uri(addr, self.tls.is_some()))
            .map_err(|e| format!("bad peer address {addr}: {e}"))?;
        if let Some(tls) = &self.tls {
            endpoint = endpoint
                .tls_config(tls.clone())
                .map_err(|e| format!("peer TLS for {addr}: {e}"))?;
        }
        let endpoint = endpoint
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(5))
            .keep_alive_timeout(Duration::from_secs(5));
        let ch = endpoint.connect_lazy();
        cache.insert(id, (addr.to_string(), ch.clone()));
        Ok(ch)
    }
}

/// gRPC metadata key of the cluster's peer token on peer RPCs.
pub const PEER_TOKEN_HEADER: &str = "x-coordstore-peer-token";

/// gRPC metadata key of the sender's cluster id on peer RPCs.
pub const PEER_CLUSTER_HEADER: &str = "x-coordstore-cluster-id";

/// The cluster's shared peer token, if the cluster has one, and the cluster
/// id peers present.
#[derive(Clone, Default)]
pub struct PeerToken {
    token: Option<Arc<str>>,
    cluster: Option<Arc<str>>,
}

impl PeerToken {
    /// `token`, or none (peers not authenticated).
    pub fn new(token: Option<String>) -> Self {
        PeerToken {
            token: token.map(Arc::from),
            cluster: None,
        }
    }

    /// The same, also presenting (and requiring of peers that present one)
    /// the cluster id `cluster`: a node of another cluster (one restored
    /// from a backup of this one, say) is refused.
    pub fn for_cluster(mut self, cluster: &str) -> Self {
        self.cluster = Some(Arc::from(cluster));
        self
    }

    /// Puts the token and the cluster id on an outgoing request.
    pub fn attach<T>(&self, req: &mut Request<T>) {
        if let Some(t) = &self.token {
            if let Ok(v) = t.parse() {
                req.metadata_mut().insert(PEER_TOKEN_HEADER, v);
            }
        }
        if let Some(c) = &self.cluster {
            if let Ok(v) = c.parse() {
                req.metadata_mut().insert(PEER_CLUSTER_HEADER, v);
            }
        }
    }

    /// Refuses a peer RPC without this cluster's token (when it has one) or
    /// from a node of another cluster (FAILED_PRECONDITION; a sender that
    /// names no cluster, an operator's `ctl`, passes this check).
    pub fn check<T>(&self, req: &Request<T>) -> Result<(), Status> {
        if let (Some(want), Some(got)) = (&self.cluster, req.metadata().get(PEER_CLUSTER_HEADER)) {
            if got.as_bytes() != want.as_bytes() {
                return Err(Status::failed_precondition(format!(
                    "this node is in cluster '{want}', the caller in cluster '{}'",
                    String::from_utf8_lossy(got.as_bytes())
                )));
            }
        }
        let Some(want) = &self.token else {
            return Ok(());
        };
        let got = req
            .metadata()
            .get(PEER_TOKEN_HEADER)
            .map(|v| v.as_bytes())
            .unwrap_or_default();
        // Compare every byte, whatever matches first.
        let same = got.len() == want.len()
            && got
                .iter()
                .zip(want.as_bytes())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0;
        if same {
            Ok(())
        } else {
            Err(Status::unauthenticated(
                "peer RPCs need this cluster's peer token (--peer-token-file)",
            ))
        }
    }
}

/// Creates peer connections for openraft.
#[derive(Clone)]
pub struct PeerNetwork {
    channels: Channels,
    max_message_bytes: usize,
    contact: Arc<Contact>,
    token: PeerToken,
}

impl PeerNetwork {
    /// A factory over `channels` that records acknowledgements in `contact`
    /// and sends `token` with every RPC.
    pub(crate) fn new(
        channels: Channels,
        max_message_bytes: usize,
        contact: Arc<Contact>,
        token: PeerToken,
    ) -> Self {
        PeerNetwork {
            channels,
            max_message_bytes,
            contact,
            token,
        }
    }
}

impl RaftNetworkFactory<TypeConfig> for PeerNetwork {
    type Network = PeerConnection;

    async fn new_client(&mut self, target: NodeId, node: &Node) -> PeerConnection {
        let client = self.channels.get(target, &node.addr).map(|ch| {
            RaftPeerClient::new(ch)
                .max_decoding_message_size(self.max_message_bytes)
                .max_encoding_message_size(self.max_message_bytes)
        });
        PeerConnection {
            target,
            client,
            contact: self.contact.clone(),
            token: self.token.clone(),
            unary_only: Arc::default(),
        }
    }
}

/// One peer as openraft sees it.
pub struct PeerConnection {
    target: NodeId,
    client: Result<RaftPeerClient<Channel>, String>,
    contact: Arc<Contact>,
    token: PeerToken,
    /// The peer answered `AppendStream` with UNIMPLEMENTED (a build from
    /// before it): replicate to it with unary calls.
    unary_only: Arc<std::sync::atomic::AtomicBool>,
}

/// What openraft's `stream_append` hands back.
type AppendAnswers<'s> =
    BoxStream<'s, Result<StreamAppendResult<TypeConfig>, RPCError<TypeConfig>>>;

/// When each frame of a stream still unanswered was sent, oldest first.
type Unanswered = Arc<Mutex<VecDeque<Instant>>>;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A failed peer RPC as openraft counts it: a peer that cannot be reached
/// (UNAVAILABLE, UNKNOWN: connection refused or reset) or another error.
fn status_error(s: &Status) -> RPCError<TypeConfig> {
    let e = Msg(format!("{}: {}", s.code(), s.message()));
    match s.code() {
        tonic::Code::Unavailable | tonic::Code::Unknown => {
            RPCError::Unreachable(Unreachable::new(&e))
        }
        _ => RPCError::Network(NetworkError::new(&e)),
    }
}

fn overdue(what: &str, ttl: Duration) -> RPCError<TypeConfig> {
    RPCError::Unreachable(Unreachable::new(&Msg(format!(
        "{what}: no answer within {ttl:?}"
    ))))
}

#[derive(Clone, Copy)]
enum Method {
    Append,
    Vote,
    Snapshot,
}

#[derive(Debug)]
struct Msg(String);

impl std::fmt::Display for Msg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Msg {}

impl PeerConnection {
    /// One peer RPC: the request's bincode, the reply's bincode of
    /// `Result<Resp, E>` (the remote Raft's own error, which openraft 0.10's
    /// network API reports as a network error).
    async fn call<Req, Resp, E>(
        &mut self,
        method: Method,
        req: &Req,
        ttl: Duration,
    ) -> Result<Resp, RPCError<TypeConfig>>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::fmt::Display + DeserializeOwned,
    {
        let client = match &mut self.client {
            Ok(c) => c,
            Err(e) => return Err(RPCError::Unreachable(Unreachable::new(&Msg(e.clone())))),
        };
        let data = bincode::serialize(req).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        let mut request = Request::new(RaftPayload {
            data: Bytes::from(data),
        });
        request.set_timeout(ttl);
        self.token.attach(&mut request);
        if let (Method::Append, Some(age)) = (method, self.contact.quorum_age()) {
            let ms = age.as_millis().to_string();
            request
                .metadata_mut()
                .insert(QUORUM_AGE_HEADER, ms.parse().expect("ascii digits"));
        }
        let reply = match method {
            Method::Append => client.append_entries(request).await,
            Method::Vote => client.vote(request).await,
            Method::Snapshot => client.install_snapshot(request).await,
        };
        let reply = reply.map_err(|s| status_error(&s))?;
        let result: Result<Resp, E> = bincode::deserialize(&reply.into_inner().data)
            .map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        result.map_err(|e| {
            RPCError::Network(NetworkError::new(&Msg(format!(
                "node {} answered: {e}",
                self.target
            ))))
        })
    }
}

impl PeerConnection {
    /// Opens an `AppendStream` that sends `input`'s requests as they come.
    /// `ttl` bounds the setup and the wait for each answer (the deadline a
    /// unary AppendEntries has): a peer that stops answering ends the
    /// stream with an error, and openraft opens another after its backoff.
    async fn open_append_stream<S>(
        &mut self,
        input: S,
        ttl: Duration,
    ) -> Result<AppendAnswers<'static>, RPCError<TypeConfig>>
    where
        S: Stream<Item = AppendEntriesRequest<TypeConfig>> + Send + Unpin + 'static,
    {
        let mut client = match &self.client {
            Ok(c) => c.clone(),
            Err(e) => return Err(RPCError::Unreachable(Unreachable::new(&Msg(e.clone())))),
        };
        let unanswered = Unanswered::default();
        // The request side lives no longer than the answers: openraft's
        // sessions to a peer share one log cursor, and a request body hyper
        // still reads after its answers were dropped (an answer overdue, the
        // stream ended) takes frames the next session then never sends —
        // the follower waits for them until the next write (docs/faults.md).
        let (alive, ended) = tokio::sync::oneshot::channel::<()>();
        let frames = {
            let (contact, unanswered) = (self.contact.clone(), unanswered.clone());
            input.take_until(ended).scan((), move |_, rpc| {
                let frame = match bincode::serialize(&rpc) {
                    Ok(data) => {
                        lock(&unanswered).push_back(Instant::now());
                        Some(AppendFrame {
                            data: Bytes::from(data),
                            quorum_age_ms: contact.quorum_age().map(|a| a.as_millis() as u64),
                        })
                    }
                    Err(e) => {
                        // Ends the stream; openraft starts another.
                        tracing::error!("cannot encode an AppendEntries: {e}");
                        None
                    }
                };
                future::ready(frame)
            })
        };
        let mut request = Request::new(frames);
        self.token.attach(&mut request);
        let answers = match tokio::time::timeout(ttl, client.append_stream(request)).await {
            Err(_) => return Err(overdue("opening the append stream", ttl)),
            Ok(Err(s)) => return Err(self.refused(&s)),
            Ok(Ok(r)) => r.into_inner(),
        };
        let (target, contact) = (self.target, self.contact.clone());
        let unary_only = self.unary_only.clone();
        let answers = stream::unfold(Some((answers, alive)), move |state| {
            let (unanswered, contact) = (unanswered.clone(), contact.clone());
            let unary_only = unary_only.clone();
            async move {
                // Every way out but the last drops `alive`, ending the requests.
                let (mut answers, alive) = state?;
                let payload = loop {
                    match tokio::time::timeout(ttl, answers.message()).await {
                        Ok(Ok(Some(p))) => break p,
                        Ok(Ok(None)) => return None,
                        Ok(Err(s)) => {
                            return Some((Err(stream_refused(target, &unary_only, &s)), None))
                        }
                        Err(_) => {
                            let late = lock(&unanswered)
                                .front()
                                .is_some_and(|t| t.elapsed() >= ttl);
                            if late {
                                return Some((Err(overdue("AppendEntries", ttl)), None));
                            }
                        }
                    }
                };
                lock(&unanswered).pop_front();
                let result: StreamAppendResult<TypeConfig> =
                    match bincode::deserialize(&payload.data) {
                        Ok(r) => r,
                        Err(e) => {
                            return Some((Err(RPCError::Network(NetworkError::new(&e))), None))
                        }
                    };
                if !matches!(result, Err(StreamAppendError::HigherVote(_))) {
                    contact.acked(target);
                }
                // Conflict and HigherVote end the stream (openraft's rule).
                let next = result.is_ok().then_some((answers, alive));
                Some((Ok(result), next))
            }
        });
        Ok(Box::pin(answers))
    }
}

impl PeerConnection {
    fn refused(&self, s: &Status) -> RPCError<TypeConfig> {
        stream_refused(self.target, &self.unary_only, s)
    }
}

/// An `AppendStream` that failed with `s`; a peer without it (UNIMPLEMENTED:
/// an older build) gets unary AppendEntries from then on.
fn stream_refused(
    target: NodeId,
    unary_only: &std::sync::atomic::AtomicBool,
    s: &Status,
) -> RPCError<TypeConfig> {
    if s.code() == tonic::Code::Unimplemented
        && !unary_only.swap(true, std::sync::atomic::Ordering::Relaxed)
    {
        tracing::warn!(
            target_node = target,
            "the peer has no AppendStream (an older build): unary AppendEntries to it"
        );
    }
    status_error(s)
}

impl RaftNetworkV2<TypeConfig> for PeerConnection {
    type SnapshotData = SnapshotData;

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        let resp: AppendEntriesResponse<TypeConfig> = self
            .call::<_, _, RaftError<TypeConfig>>(Method::Append, &rpc, option.hard_ttl())
            .await?;
        if !matches!(resp, AppendEntriesResponse::HigherVote(_)) {
            self.contact.acked(self.target);
        }
        Ok(resp)
    }

    /// Pipelined: frames go out as openraft produces them; each answer is
    /// awaited with the RPC deadline while frames are unanswered.
    fn stream_append<'s, S>(
        &'s mut self,
        input: S,
        option: RPCOption,
    ) -> BoxFuture<'s, Result<AppendAnswers<'s>, RPCError<TypeConfig>>>
    where
        S: Stream<Item = AppendEntriesRequest<TypeConfig>> + OptionalSend + Unpin + 'static,
    {
        // One frame (a heartbeat): a unary call costs what a stream's setup does.
        let unary_only = self.unary_only.load(std::sync::atomic::Ordering::Relaxed);
        if unary_only || input.size_hint().1 == Some(1) {
            return stream_append_sequential(self, input, option);
        }
        Box::pin(async move {
            let answers = self.open_append_stream(input, option.hard_ttl()).await?;
            Ok(answers as AppendAnswers<'s>)
        })
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        let resp: VoteResponse<TypeConfig> = self
            .call::<_, _, RaftError<TypeConfig>>(Method::Vote, &rpc, option.hard_ttl())
            .await?;
        if resp.vote_granted {
            self.contact.acked(self.target);
        }
        Ok(resp)
    }

    /// The whole snapshot in one message (the message limit is the node's
    /// `max_message_bytes`), abandoned when replication closes.
    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: Snapshot,
        cancel: impl std::future::Future<Output = ReplicationClosed> + openraft::OptionalSend + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        let transfer: SnapshotTransfer = (vote, snapshot.meta, snapshot.snapshot.into_inner());
        let send = self.call::<_, SnapshotResponse<TypeConfig>, Fatal<TypeConfig>>(
            Method::Snapshot,
            &transfer,
            option.hard_ttl(),
        );
        tokio::select! {
            closed = cancel => Err(StreamingError::Closed(closed)),
            r = send => r.map_err(StreamingError::from),
        }
    }
}

/// The server side of the peer RPCs.
pub struct PeerService {
    raft: Raft,
    contact: Arc<Contact>,
    token: PeerToken,
    /// When an AppendEntries (entries or heartbeat) last arrived.
    last_append: Arc<Mutex<Option<Instant>>>,
    /// How long without one before this node counts the leader as silent.
    silent_after: Duration,
}

impl PeerService {
    /// The tonic service for `raft`, with the message limits of the node;
    /// the leader counts as silent after three missed heartbeats. What the
    /// leader vouches for goes to `contact`.
    pub(crate) fn server(
        raft: Raft,
        max_message_bytes: usize,
        heartbeat: Duration,
        contact: Arc<Contact>,
        token: PeerToken,
    ) -> RaftPeerServer<PeerService> {
        RaftPeerServer::new(PeerService {
            raft,
            contact,
            token,
            last_append: Arc::default(),
            silent_after: 3 * heartbeat,
        })
        .max_decoding_message_size(max_message_bytes)
        .max_encoding_message_size(max_message_bytes)
    }

    fn leader_silent(&self) -> bool {
        let last = *self.last_append.lock().unwrap_or_else(|p| p.into_inner());
        last.is_none_or(|t| t.elapsed() >= self.silent_after)
    }
}

/// Campaigns until this node's term is above `term` (the refused
/// candidate's): openraft's election takes the current term + 1, which can
/// equal the candidate's term, and two candidates of one term split the
/// vote. Bounded to 3 elections; leaders and learners ignore the trigger.
async fn campaign_above(raft: Raft, term: u64) {
    for _ in 0..3 {
        let now = raft.metrics().borrow_watched().current_term;
        if now > term || raft.trigger().elect(false).await.is_err() {
            return;
        }
        let _ = raft
            .wait(Some(Duration::from_millis(100)))
            .metrics(|m| m.current_term > now, "campaign")
            .await;
    }
}

/// Whether this node should campaign at once after answering `req` with
/// `resp`: it refused a candidate whose log is behind its own (so that
/// candidate cannot win) while it has not heard from a leader itself for
/// a while. openraft restarts the refusing node's election timer
/// (leader lease + timeout, 1–1.5 s by default) on such a request, so
/// without this a leader crash that leaves the less up-to-date follower to
/// time out first costs a second full timeout. Campaigning never affects
/// safety; a node that hears a leader, a leader and a learner never do.
fn campaign_after_refusal(
    req: &VoteRequest<TypeConfig>,
    resp: &VoteResponse<TypeConfig>,
    leader_silent: bool,
) -> bool {
    leader_silent && !resp.vote_granted && resp.last_log_id > req.last_log_id
}

fn decode_bytes<T: DeserializeOwned>(data: &[u8]) -> Result<T, Status> {
    bincode::deserialize(data)
        .map_err(|e| Status::invalid_argument(format!("undecodable raft payload: {e}")))
}

fn decode<T: DeserializeOwned>(req: Request<RaftPayload>) -> Result<T, Status> {
    decode_bytes(&req.into_inner().data)
}

fn encode_payload<T: Serialize>(v: &T) -> Result<RaftPayload, Status> {
    let data = bincode::serialize(v)
        .map_err(|e| Status::internal(format!("cannot encode raft reply: {e}")))?;
    Ok(RaftPayload {
        data: Bytes::from(data),
    })
}

fn encode<T: Serialize>(v: &T) -> Result<Response<RaftPayload>, Status> {
    encode_payload(v).map(Response::new)
}

/// The answers of an `AppendStream`.
type AnswerStream = BoxStream<'static, Result<RaftPayload, Status>>;

#[tonic::async_trait]
impl RaftPeer for PeerService {
    async fn append_entries(
        &self,
        req: Request<RaftPayload>,
    ) -> Result<Response<RaftPayload>, Status> {
        self.token.check(&req)?;
        let vouched = req
            .metadata()
            .get(QUORUM_AGE_HEADER)
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
            .map(Duration::from_millis);
        let rpc: AppendEntriesRequest<TypeConfig> = decode(req)?;
        let reply = self.raft.append_entries(rpc).await;
        *self.last_append.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
        if let (Ok(resp), Some(age)) = (&reply, vouched) {
            // Accepted (not from a deposed leader): its quorum is ours to know.
            if !matches!(resp, AppendEntriesResponse::HigherVote(_)) {
                self.contact.leader_vouched(age);
            }
        }
        encode(&reply)
    }

    type AppendStreamStream = AnswerStream;

    /// Feeds the frames to openraft's pipelined `stream_append` and answers
    /// each in order. An undecodable frame ends the stream with
    /// INVALID_ARGUMENT after the answers to the frames before it; a Raft
    /// core that stopped ends it with UNAVAILABLE.
    async fn append_stream(
        &self,
        req: Request<tonic::Streaming<AppendFrame>>,
    ) -> Result<Response<AnswerStream>, Status> {
        self.token.check(&req)?;
        // The quorum age each frame vouched for, oldest first; the answers
        // come in the frames' order.
        let vouched: Arc<Mutex<VecDeque<Option<Duration>>>> = Arc::default();
        let refused: Arc<Mutex<Option<Status>>> = Arc::default();
        let requests = {
            let (vouched, refused) = (vouched.clone(), refused.clone());
            req.into_inner().scan((), move |_, frame| {
                let rpc = frame.and_then(|f| {
                    let rpc = decode_bytes::<AppendEntriesRequest<TypeConfig>>(&f.data)?;
                    Ok((rpc, f.quorum_age_ms.map(Duration::from_millis)))
                });
                future::ready(match rpc {
                    Ok((rpc, age)) => {
                        lock(&vouched).push_back(age);
                        Some(rpc)
                    }
                    Err(status) => {
                        *lock(&refused) = Some(status);
                        None
                    }
                })
            })
        };
        let (contact, last_append) = (self.contact.clone(), self.last_append.clone());
        let answers = self.raft.stream_append(requests).map(move |answer| {
            *lock(&last_append) = Some(Instant::now());
            let age = lock(&vouched).pop_front().flatten();
            match answer {
                Ok(result) => {
                    // Accepted (not from a deposed leader): its quorum is ours to know.
                    if let (false, Some(age)) =
                        (matches!(result, Err(StreamAppendError::HigherVote(_))), age)
                    {
                        contact.leader_vouched(age);
                    }
                    encode_payload(&result)
                }
                Err(fatal) => Err(Status::unavailable(format!(
                    "the Raft core stopped: {fatal}"
                ))),
            }
        });
        let refusal = stream::once(async move { lock(&refused).take() })
            .filter_map(|s| future::ready(s.map(Err)));
        Ok(Response::new(Box::pin(answers.chain(refusal))))
    }

    async fn vote(&self, req: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        self.token.check(&req)?;
        let rpc: VoteRequest<TypeConfig> = decode(req)?;
        let asked = rpc.clone();
        let reply = self.raft.vote(rpc).await;
        if let Ok(resp) = &reply {
            if campaign_after_refusal(&asked, resp, self.leader_silent()) {
                tracing::info!(
                    candidate = %asked.vote,
                    "refused a candidate with an older log and no leader heard for {:?}: campaigning",
                    self.silent_after
                );
                tokio::spawn(campaign_above(self.raft.clone(), asked.vote.leader_id.term));
            }
        }
        encode(&reply)
    }

    async fn install_snapshot(
        &self,
        req: Request<RaftPayload>,
    ) -> Result<Response<RaftPayload>, Status> {
        self.token.check(&req)?;
        let (vote, meta, data): SnapshotTransfer = decode(req)?;
        let snapshot = Snapshot {
            meta,
            snapshot: std::io::Cursor::new(data),
        };
        encode(&self.raft.install_full_snapshot(vote, snapshot).await)
    }

    async fn feature_level(
        &self,
        req: Request<FeatureLevelRequest>,
    ) -> Result<Response<FeatureLevelResponse>, Status> {
        self.token.check(&req)?;
        Ok(Response::new(FeatureLevelResponse {
            level: journal::FEATURE_LEVEL,
        }))
    }
}

/// The journal feature level the peer at `ch` applies: what it answers,
/// [`journal::LEVEL_BASE`] if it does not know the call (a build before
/// namespaces), or why it could not be asked within `wait`.
pub async fn ask_feature_level(
    ch: Channel,
    token: &PeerToken,
    wait: Duration,
) -> Result<u32, String> {
    let mut req = Request::new(FeatureLevelRequest {});
    req.set_timeout(wait);
    token.attach(&mut req);
    let mut client = RaftPeerClient::new(ch);
    match tokio::time::timeout(wait, client.feature_level(req)).await {
        Ok(Ok(reply)) => Ok(reply.into_inner().level),
        Ok(Err(s)) if s.code() == tonic::Code::Unimplemented => Ok(journal::LEVEL_BASE),
        Ok(Err(s)) => Err(format!("{:?}: {}", s.code(), s.message())),
        Err(_) => Err(format!("no answer within {} ms", wait.as_millis())),
    }
}

#[cfg(test)]
mod tests {
    use storage::{LeaderId, LogId};

    use super::*;

    fn log(index: u64) -> Option<LogId> {
        Some(LogId::new(
            LeaderId {
                term: 2,
                node_id: 1,
            },
            index,
        ))
    }

    fn req(last: u64) -> VoteRequest<TypeConfig> {
        VoteRequest::new(Vote::new(3, 2), log(last))
    }

    fn resp(granted: bool, last: u64) -> VoteResponse<TypeConfig> {
        VoteResponse::new(Vote::new(3, 2), log(last), granted)
    }

    #[test]
    fn campaigns_only_after_refusing_an_older_log_with_the_leader_silent() {
        // Refused a candidate one entry behind, leader silent: campaign.
        assert!(campaign_after_refusal(&req(9), &resp(false, 10), true));
        // The leader is still heard: leave it alone.
        assert!(!campaign_after_refusal(&req(9), &resp(false, 10), false));
        // Granted: the candidate can win.
        assert!(!campaign_after_refusal(&req(10), &resp(true, 10), true));
        // Refused for another reason (lease, vote) with an equal or newer
        // candidate log: that candidate or a later one can win.
        assert!(!campaign_after_refusal(&req(10), &resp(false, 10), true));
        assert!(!campaign_after_refusal(&req(11), &resp(false, 10), true));
    }

    /// A peer of an older build: its RaftPeer has no AppendStream.
    struct OldPeer {
        appends: Arc<std::sync::atomic::AtomicUsize>,
    }

    #[tonic::async_trait]
    impl RaftPeer for OldPeer {
        async fn append_entries(
            &self,
            req: Request<RaftPayload>,
        ) -> Result<Response<RaftPayload>, Status> {
            let rpc: AppendEntriesRequest<TypeConfig> = decode(req)?;
            self.appends
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let reply: Result<AppendEntriesResponse<TypeConfig>, RaftError<TypeConfig>> =
                Ok(AppendEntriesResponse::Success);
            let _ = rpc;
            encode(&reply)
        }
        type AppendStreamStream = AnswerStream;
        async fn append_stream(
            &self,
            _: Request<tonic::Streaming<AppendFrame>>,
        ) -> Result<Response<AnswerStream>, Status> {
            Err(Status::unimplemented("not in this build"))
        }
        async fn vote(&self, _: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
            Err(Status::unimplemented("not used"))
        }
        async fn install_snapshot(
            &self,
            _: Request<RaftPayload>,
        ) -> Result<Response<RaftPayload>, Status> {
            Err(Status::unimplemented("not used"))
        }
        async fn feature_level(
            &self,
            _: Request<FeatureLevelRequest>,
        ) -> Result<Response<FeatureLevelResponse>, Status> {
            Err(Status::unimplemented("not in this build"))
        }
    }

    fn heartbeat() -> AppendEntriesRequest<TypeConfig> {
        AppendEntriesRequest {
            vote: Vote::new(3, 1),
            prev_log_id: None,
            leader_commit: None,
            entries: vec![],
        }
    }

    /// Against a peer without AppendStream the first stream fails with
    /// UNIMPLEMENTED, and every later one goes out as unary AppendEntries.
    #[tokio::test]
    async fn a_peer_without_the_append_stream_gets_unary_calls() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let appends = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let server = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(RaftPeerServer::new(OldPeer {
                    appends: appends.clone(),
                }))
                .serve_with_incoming(tokio_stream_of(listener)),
        );
        let mut factory = PeerNetwork::new(
            Channels::new(),
            1 << 20,
            Arc::new(Contact::new(1)),
            PeerToken::default(),
        );
        let mut conn = factory.new_client(2, &Node::new(addr)).await;
        let option = RPCOption::new(Duration::from_secs(5));
        // An endless stream (as replication's): opened as an AppendStream.
        let input = || stream::iter([heartbeat(), heartbeat()]).chain(stream::pending());
        let refused = conn.stream_append(input(), option.clone()).await.is_err();
        assert!(refused, "the old peer refuses the stream");
        assert_eq!(appends.load(std::sync::atomic::Ordering::SeqCst), 0);
        let mut answers = conn.stream_append(input(), option).await.unwrap();
        for _ in 0..2 {
            let answer = answers
                .next()
                .await
                .expect("an answer")
                .expect("no RPC error");
            assert_eq!(answer, Ok(None));
        }
        drop(answers);
        assert_eq!(appends.load(std::sync::atomic::Ordering::SeqCst), 2);
        server.abort();
    }

    /// A peer that takes an AppendStream's frames and never answers.
    struct MutePeer;

    #[tonic::async_trait]
    impl RaftPeer for MutePeer {
        async fn append_entries(
            &self,
            _: Request<RaftPayload>,
        ) -> Result<Response<RaftPayload>, Status> {
            Err(Status::unimplemented("not used"))
        }
        type AppendStreamStream = AnswerStream;
        async fn append_stream(
            &self,
            req: Request<tonic::Streaming<AppendFrame>>,
        ) -> Result<Response<AnswerStream>, Status> {
            let mut frames = req.into_inner();
            // Reads (and holds) the request side for as long as it lasts.
            tokio::spawn(async move { while let Ok(Some(_)) = frames.message().await {} });
            Ok(Response::new(Box::pin(stream::pending())))
        }
        async fn vote(&self, _: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
            Err(Status::unimplemented("not used"))
        }
        async fn install_snapshot(
            &self,
            _: Request<RaftPayload>,
        ) -> Result<Response<RaftPayload>, Status> {
            Err(Status::unimplemented("not used"))
        }
        async fn feature_level(
            &self,
            _: Request<FeatureLevelRequest>,
        ) -> Result<Response<FeatureLevelResponse>, Status> {
            Err(Status::unimplemented("not in this build"))
        }
    }

    /// Once an AppendStream's answers end (here: an answer overdue), its
    /// request side stops taking frames from openraft: the input is dropped.
    /// Before, hyper kept reading it, and the next stream to the peer missed
    /// the frames this dead one took (a follower then lagged until the next
    /// write).
    #[tokio::test]
    async fn a_stream_whose_answers_ended_takes_no_more_frames() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let server = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(RaftPeerServer::new(MutePeer))
                .serve_with_incoming(tokio_stream_of(listener)),
        );
        let mut factory = PeerNetwork::new(
            Channels::new(),
            1 << 20,
            Arc::new(Contact::new(1)),
            PeerToken::default(),
        );
        let mut conn = factory.new_client(2, &Node::new(addr)).await;
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let input = Box::pin(stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|r| (r, rx))
        }));
        tx.send(heartbeat()).await.unwrap();
        let mut answers = conn
            .open_append_stream(input, Duration::from_millis(200))
            .await
            .expect("the stream opens");
        let first = answers.next().await.expect("an item");
        assert!(
            first.is_err(),
            "an overdue answer ends the stream with an error"
        );
        drop(answers);
        tokio::time::timeout(Duration::from_secs(10), tx.closed())
            .await
            .expect("the request side still holds openraft's input");
        server.abort();
    }

    fn tokio_stream_of(
        l: tokio::net::TcpListener,
    ) -> impl Stream<Item = std::io::Result<tokio::net::TcpStream>> {
        stream::unfold(l, |l| async move {
            let conn = l.accept().await.map(|(s, _)| s);
            Some((conn, l))
        })
    }
}
