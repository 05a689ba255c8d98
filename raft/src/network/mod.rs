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
    StreamAppendResult, TransferLeaderRequest, TransferLeaderResponse, VoteRequest, VoteResponse,
};
use openraft::type_config::async_runtime::WatchReceiver;
use openraft::OptionalSend;
use proto::coordstore::raft_peer_client::RaftPeerClient;
use proto::coordstore::raft_peer_server::{RaftPeer, RaftPeerServer};
use proto::coordstore::{
    AppendFrame, DiskHealth, FeatureLevelRequest, FeatureLevelResponse, HealthRequest, RaftPayload,
};
use serde::de::DeserializeOwned;
use serde::Serialize;
use storage::{Node, NodeId, Snapshot, SnapshotData, SnapshotMeta, StateMachine, TypeConfig, Vote};

use crate::contact::{Contact, QUORUM_AGE_HEADER};
use crate::health::Health;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Response, Status};

mod channels;
mod client;
mod server;
mod token;

pub use channels::Channels;
pub use client::{ask_feature_level, ask_health, PeerNetwork};
pub use server::PeerService;
pub use token::{PeerToken, PEER_CLUSTER_HEADER, PEER_TOKEN_HEADER};

/// A mutex's guard, whether or not a holder panicked.
pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The openraft handle of a node.
pub type Raft = openraft::Raft<TypeConfig, StateMachine>;

/// A whole snapshot as it travels to a follower: the leader's vote, the
/// metadata and the encoded state.
type SnapshotTransfer = (Vote, SnapshotMeta, Vec<u8>);

#[cfg(test)]
mod tests {
    use storage::{LeaderId, LogId};

    use super::client::*;
    use super::server::*;
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
        async fn transfer_leader(
            &self,
            _: Request<RaftPayload>,
        ) -> Result<Response<RaftPayload>, Status> {
            Err(Status::unimplemented("not in this build"))
        }
        async fn health(&self, _: Request<HealthRequest>) -> Result<Response<DiskHealth>, Status> {
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

    /// A peer of a build before gray-failure handling does not know the
    /// health question: it counts as fit to lead; a peer that does not
    /// answer is not.
    #[tokio::test]
    async fn a_peer_that_does_not_know_the_health_question_counts_as_fit() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let server = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(RaftPeerServer::new(OldPeer {
                    appends: Arc::default(),
                }))
                .serve_with_incoming(tokio_stream_of(listener)),
        );
        let ch = Channels::new().get(2, &addr).unwrap();
        let wait = Duration::from_secs(5);
        assert_eq!(ask_health(ch, &PeerToken::default(), wait).await, Ok(true));
        server.abort();
        let gone = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = gone.local_addr().unwrap().to_string();
        drop(gone);
        let ch = Channels::new().get(3, &addr).unwrap();
        let short = Duration::from_millis(500);
        assert!(ask_health(ch, &PeerToken::default(), short).await.is_err());
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
        async fn transfer_leader(
            &self,
            _: Request<RaftPayload>,
        ) -> Result<Response<RaftPayload>, Status> {
            Err(Status::unimplemented("not in this build"))
        }
        async fn health(&self, _: Request<HealthRequest>) -> Result<Response<DiskHealth>, Status> {
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
