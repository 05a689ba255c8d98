//! The server side of the peer RPCs: the `RaftPeer` service.

#[allow(unused_imports)]
use super::*;

/// The server side of the peer RPCs.
pub struct PeerService {
    raft: Raft,
    contact: Arc<Contact>,
    token: PeerToken,
    /// When an AppendEntries (entries or heartbeat) last arrived.
    last_append: Arc<Mutex<Option<Instant>>>,
    /// How long without one before this node counts the leader as silent.
    silent_after: Duration,
    /// The disk's health (what [`RaftPeer::health`] answers; an unhealthy
    /// node does not campaign after a refusal either).
    health: Arc<Health>,
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
        health: Arc<Health>,
    ) -> RaftPeerServer<PeerService> {
        RaftPeerServer::new(PeerService {
            raft,
            contact,
            token,
            last_append: Arc::default(),
            silent_after: 3 * heartbeat,
            health,
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
pub(crate) async fn campaign_above(raft: Raft, term: u64) {
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
pub(crate) fn campaign_after_refusal(
    req: &VoteRequest<TypeConfig>,
    resp: &VoteResponse<TypeConfig>,
    leader_silent: bool,
) -> bool {
    leader_silent && !resp.vote_granted && resp.last_log_id > req.last_log_id
}

pub(crate) fn decode_bytes<T: DeserializeOwned>(data: &[u8]) -> Result<T, Status> {
    bincode::deserialize(data)
        .map_err(|e| Status::invalid_argument(format!("undecodable raft payload: {e}")))
}

pub(crate) fn decode<T: DeserializeOwned>(req: Request<RaftPayload>) -> Result<T, Status> {
    decode_bytes(&req.into_inner().data)
}

pub(crate) fn encode_payload<T: Serialize>(v: &T) -> Result<RaftPayload, Status> {
    let data = bincode::serialize(v)
        .map_err(|e| Status::internal(format!("cannot encode raft reply: {e}")))?;
    Ok(RaftPayload {
        data: Bytes::from(data),
    })
}

pub(crate) fn encode<T: Serialize>(v: &T) -> Result<Response<RaftPayload>, Status> {
    encode_payload(v).map(Response::new)
}

/// The answers of an `AppendStream`.
pub(crate) type AnswerStream = BoxStream<'static, Result<RaftPayload, Status>>;

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
            let silent = self.leader_silent();
            if campaign_after_refusal(&asked, resp, silent) && self.health.may_campaign() {
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

    async fn transfer_leader(
        &self,
        req: Request<RaftPayload>,
    ) -> Result<Response<RaftPayload>, Status> {
        self.token.check(&req)?;
        let rpc: TransferLeaderRequest<TypeConfig> = decode(req)?;
        encode(&self.raft.handle_transfer_leader(rpc).await)
    }

    async fn health(&self, req: Request<HealthRequest>) -> Result<Response<DiskHealth>, Status> {
        self.token.check(&req)?;
        Ok(Response::new(self.health.report().to_proto()))
    }
}
