//! The client side of the peer RPCs: openraft's network factory and its
//! connections (unary calls, the pipelined `AppendStream`), and asking a
//! peer its journal feature level.

#[allow(unused_imports)]
use super::*;

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
pub(crate) type AppendAnswers<'s> =
    BoxStream<'s, Result<StreamAppendResult<TypeConfig>, RPCError<TypeConfig>>>;

/// When each frame of a stream still unanswered was sent, oldest first.
pub(crate) type Unanswered = Arc<Mutex<VecDeque<Instant>>>;

/// A failed peer RPC as openraft counts it: a peer that cannot be reached
/// (UNAVAILABLE, UNKNOWN: connection refused or reset) or another error.
pub(crate) fn status_error(s: &Status) -> RPCError<TypeConfig> {
    let e = Msg(format!("{}: {}", s.code(), s.message()));
    match s.code() {
        tonic::Code::Unavailable | tonic::Code::Unknown => {
            RPCError::Unreachable(Unreachable::new(&e))
        }
        _ => RPCError::Network(NetworkError::new(&e)),
    }
}

pub(crate) fn overdue(what: &str, ttl: Duration) -> RPCError<TypeConfig> {
    RPCError::Unreachable(Unreachable::new(&Msg(format!(
        "{what}: no answer within {ttl:?}"
    ))))
}

#[derive(Clone, Copy)]
pub(crate) enum Method {
    Append,
    Vote,
    Snapshot,
    TransferLeader,
}

#[derive(Debug)]
pub(crate) struct Msg(String);

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
            Method::TransferLeader => client.transfer_leader(request).await,
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
    pub(crate) async fn open_append_stream<S>(
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
        let frames = append_frames(input.take_until(ended), &self.contact, &unanswered);
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

/// The frames of an `AppendStream`: each request of `input` encoded, with
/// the quorum age `contact` vouches for, its send time noted in
/// `unanswered`. A request that does not encode ends the stream (openraft
/// starts another).
fn append_frames<S>(
    input: S,
    contact: &Arc<Contact>,
    unanswered: &Unanswered,
) -> impl Stream<Item = AppendFrame> + Send + 'static
where
    S: Stream<Item = AppendEntriesRequest<TypeConfig>> + Send + 'static,
{
    let (contact, unanswered) = (contact.clone(), unanswered.clone());
    input.scan((), move |_, rpc| {
        let frame = match bincode::serialize(&rpc) {
            Ok(data) => {
                lock(&unanswered).push_back(Instant::now());
                Some(AppendFrame {
                    data: Bytes::from(data),
                    quorum_age_ms: contact.quorum_age().map(|a| a.as_millis() as u64),
                })
            }
            Err(e) => {
                tracing::error!("cannot encode an AppendEntries: {e}");
                None
            }
        };
        future::ready(frame)
    })
}

impl PeerConnection {
    fn refused(&self, s: &Status) -> RPCError<TypeConfig> {
        stream_refused(self.target, &self.unary_only, s)
    }
}

/// An `AppendStream` that failed with `s`; a peer without it (UNIMPLEMENTED:
/// an older build) gets unary AppendEntries from then on.
pub(crate) fn stream_refused(
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

    /// Asks the peer to let the named voter take over (a build without the
    /// call answers UNIMPLEMENTED: the others then wait out the lease).
    async fn transfer_leader(
        &mut self,
        req: TransferLeaderRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<TransferLeaderResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.call::<_, _, Fatal<TypeConfig>>(Method::TransferLeader, &req, option.hard_ttl())
            .await
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

/// Whether the peer at `ch` is fit to lead (its disk has no problem); a
/// build that does not know the question counts as fit. `Err`: it did not
/// answer within `wait`.
pub async fn ask_health(ch: Channel, token: &PeerToken, wait: Duration) -> Result<bool, String> {
    let mut req = Request::new(HealthRequest {});
    req.set_timeout(wait);
    token.attach(&mut req);
    let mut client = RaftPeerClient::new(ch);
    match tokio::time::timeout(wait, client.health(req)).await {
        Ok(Ok(reply)) => Ok(reply.into_inner().problem.is_empty()),
        Ok(Err(s)) if s.code() == tonic::Code::Unimplemented => Ok(true),
        Ok(Err(s)) => Err(format!("{:?}: {}", s.code(), s.message())),
        Err(_) => Err(format!("no answer within {} ms", wait.as_millis())),
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
