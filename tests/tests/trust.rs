//! A hostile client on the Node API: headers a client can set are not
//! trusted. `x-coordstore-forwarded` (which nodes put on the calls they
//! forward) neither lets a client propose the leader runtime's commands (or
//! a node's bookkeeping of its connections) nor keep a time of its own
//! choosing.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use coordstore_tests::{connect, journal_state, Cluster};
use journal::pb::{
    coordination::{BarrierExpire, KvInsert, TasksUnhealthy},
    update::Command,
    InitService,
};
use journal::Update;
use prost::Message;
use proto::coordstore::ProposeRequest;

const WAIT: Duration = Duration::from_secs(60);

fn as_forwarded(update: Update) -> tonic::Request<ProposeRequest> {
    let mut req = tonic::Request::new(ProposeRequest {
        update: update.encode_to_vec().into(),
    });
    req.metadata_mut()
        .insert("x-coordstore-forwarded", "1".parse().unwrap());
    req
}

fn update(command: Command, at_ms: u64) -> Update {
    Update {
        namespace: String::new(),
        origin: None,
        at_ms,
        epoch: None,
        command: Some(command),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_claiming_to_be_a_node_gets_no_more_than_a_client() {
    let cluster = Cluster::start(3, &["--tasks", "2"]);
    let leader = cluster.wait_leader(&[0, 1, 2], WAIT).await;
    for node in [leader, (leader + 1) % 3] {
        let addr = &cluster.nodes[node].addr;
        let mut c = connect(addr, WAIT).await;
        let leader_only = [
            Command::from(BarrierExpire {
                id: "b".into(),
                counter: 0,
            }),
            Command::InitService(InitService::default()),
            Command::from(TasksUnhealthy { tasks: vec![0, 1] }),
            // A node's bookkeeping of the TCPStore connections it holds:
            // only through NodePeer, never the client's Node API.
            Command::from(journal::pb::torch::Forget {
                connections: vec![1],
            }),
            // The rendezvous duty's: forming a round, dropping agents.
            Command::from(journal::pb::rendezvous::Complete {
                run: "r".into(),
                round: 0,
            }),
            Command::from(journal::pb::rendezvous::Expire {
                run: "r".into(),
                nodes: vec![],
            }),
        ];
        for cmd in leader_only {
            let e = c
                .propose(as_forwarded(update(cmd.clone(), 0)))
                .await
                .unwrap_err();
            assert_eq!(
                e.code(),
                tonic::Code::PermissionDenied,
                "{cmd:?} at node {node}: {e:?}"
            );
        }
        if node != leader {
            // A "forwarded" call is not forwarded again: the follower
            // answers it itself, as not the leader.
            continue;
        }
        // A client command goes through, but at the leader's time.
        let far_future = 4_000_000_000_000u64;
        c.propose(as_forwarded(update(
            Command::from(KvInsert {
                key: format!("hostile/{node}"),
                value: "v".into(),
                allow_overwrite: true,
            }),
            far_future,
        )))
        .await
        .expect("a client command");
        let s = journal_state(addr).await;
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        assert!(
            s.clock_ms() <= now + 60_000,
            "the client's time was kept: {}",
            s.clock_ms()
        );
        assert!(s
            .coordination()
            .kv_get(&format!("hostile/{node}"))
            .is_some());
    }
}

/// With a peer token (--peer-token-file), the nodes elect and replicate as
/// usual, and a peer RPC without the token, or with another, is refused
/// before its payload is even looked at.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_rpcs_need_the_clusters_token() {
    use proto::coordstore::raft_peer_client::RaftPeerClient;
    use proto::coordstore::{AppendFrame, RaftPayload};

    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("peer-token");
    std::fs::write(&token_file, "s3cret-peer-token\n").unwrap();
    let token_flag = token_file.display().to_string();
    let cluster = Cluster::start(3, &["--tasks", "1", "--peer-token-file", &token_flag]);
    let leader = cluster.wait_leader(&[0, 1, 2], WAIT).await;
    let addr = &cluster.nodes[leader].addr;
    // Replication works: a write is applied on every node.
    let mut c = connect(addr, WAIT).await;
    c.propose(tonic::Request::new(ProposeRequest {
        update: update(
            Command::from(KvInsert {
                key: "with-token".into(),
                value: "v".into(),
                allow_overwrite: true,
            }),
            0,
        )
        .encode_to_vec()
        .into(),
    }))
    .await
    .expect("a write");
    cluster.wait_converged(&[0, 1, 2], WAIT).await;

    let mut peer = RaftPeerClient::new(coordstore_tests::wire::channel(addr).await);
    let garbage = || RaftPayload {
        data: vec![0xFF; 16].into(),
    };
    let with_token = |t: Option<&str>| {
        let mut r = tonic::Request::new(garbage());
        if let Some(t) = t {
            r.metadata_mut()
                .insert("x-coordstore-peer-token", t.parse().unwrap());
        }
        r
    };
    let stream_with_token = |t: Option<&str>| {
        let frame = AppendFrame {
            data: vec![0xFF; 16].into(),
            quorum_age_ms: None,
        };
        let mut r = tonic::Request::new(futures_util::stream::iter([frame]));
        if let Some(t) = t {
            r.metadata_mut()
                .insert("x-coordstore-peer-token", t.parse().unwrap());
        }
        r
    };
    for t in [None, Some("not-the-token")] {
        let e = peer.append_stream(stream_with_token(t)).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e:?}");
        let e = peer.vote(with_token(t)).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e:?}");
        let e = peer.append_entries(with_token(t)).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e:?}");
        let e = peer.install_snapshot(with_token(t)).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e:?}");
    }
    // Membership changes need it too (a client could otherwise remove nodes).
    let e = c
        .remove_member(proto::coordstore::RemoveMemberRequest { id: 3 })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e:?}");
    assert_eq!(
        coordstore_tests::try_status(addr)
            .await
            .unwrap()
            .members
            .len(),
        3
    );
    // With the token, the payload is what is refused.
    let e = peer
        .vote(with_token(Some("s3cret-peer-token")))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    // On the replication stream: the frame, after the stream opened.
    let mut answers = peer
        .append_stream(stream_with_token(Some("s3cret-peer-token")))
        .await
        .expect("the stream opens with the token")
        .into_inner();
    let e = tokio::time::timeout(WAIT, answers.message())
        .await
        .expect("an answer in time")
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("undecodable raft payload"), "{e:?}");
    // Nothing of it reached the log: the replicas still agree.
    cluster.wait_converged(&[0, 1, 2], WAIT).await;
}

/// A `ProposeBatch` (a follower's forwarded proposals) is no door around
/// `Propose`: each proposal in it is answered with what its own `NodePeer`
/// `Propose`, carrying the same headers, gets: the leader runtime's
/// commands refused, an undecodable update INVALID_ARGUMENT, a client
/// command applied at the leader's time (and a node's bookkeeping as its
/// `Propose` is on this port). A batch larger than the bound is refused
/// whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_proposals_is_answered_as_each_proposal_alone() {
    use proto::coordstore::node_peer_client::NodePeerClient;
    use proto::coordstore::{ForwardedProposal, ProposeBatchRequest};

    let cluster = Cluster::start(3, &["--tasks", "2"]);
    let leader = cluster.wait_leader(&[0, 1, 2], WAIT).await;
    let addr = &cluster.nodes[leader].addr;
    let mut peer = NodePeerClient::new(coordstore_tests::wire::channel(addr).await);
    let far_future = 4_000_000_000_000u64;
    let commands = [
        Command::from(BarrierExpire {
            id: "b".into(),
            counter: 0,
        }),
        Command::InitService(InitService::default()),
        Command::from(TasksUnhealthy { tasks: vec![0, 1] }),
        Command::from(journal::pb::rendezvous::Complete {
            run: "r".into(),
            round: 0,
        }),
        Command::from(journal::pb::torch::Forget {
            connections: vec![1],
        }),
        Command::from(KvInsert {
            key: "batched".into(),
            value: "v".into(),
            allow_overwrite: true,
        }),
    ];
    let mut updates: Vec<bytes::Bytes> = commands
        .iter()
        .map(|c| update(c.clone(), far_future).encode_to_vec().into())
        .collect();
    updates.push(vec![0xFF; 8].into());
    let proposals: Vec<ForwardedProposal> = updates
        .iter()
        .map(|u| ForwardedProposal {
            update: u.clone(),
            timeout_us: 30_000_000,
            ..Default::default()
        })
        .collect();
    let batch = |proposals| {
        let mut r = tonic::Request::new(ProposeBatchRequest { proposals });
        r.metadata_mut()
            .insert("x-coordstore-forwarded", "1".parse().unwrap());
        r
    };
    let answers = peer
        .propose_batch(batch(proposals.clone()))
        .await
        .expect("the batch is answered")
        .into_inner()
        .answers;
    assert_eq!(answers.len(), updates.len());
    for (u, a) in updates.iter().zip(&answers) {
        let mut alone = tonic::Request::new(ProposeRequest { update: u.clone() });
        alone
            .metadata_mut()
            .insert("x-coordstore-forwarded", "1".parse().unwrap());
        let code = |a: &proto::coordstore::ProposeAnswer| {
            a.status
                .iter()
                .find(|h| h.name == "grpc-status")
                .map(|h| String::from_utf8_lossy(&h.value).parse::<i32>().unwrap())
        };
        match peer.propose(alone).await {
            Ok(_) => assert!(a.response.is_some(), "{a:?}"),
            Err(e) => {
                assert_ne!(e.code(), tonic::Code::Ok);
                assert_eq!(code(a), Some(e.code() as i32), "{e:?} / {a:?}");
            }
        }
    }
    // The client command went through, at the leader's time; the leader
    // runtime's and the undecodable one did not (alone and in the batch
    // alike: their codes match above).
    let s = journal_state(addr).await;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    assert!(s.clock_ms() <= now + 60_000, "{}", s.clock_ms());
    assert!(s.coordination().kv_get("batched").is_some());
    for (c, a) in commands[..4].iter().zip(&answers) {
        assert!(a.response.is_none(), "{c:?} applied: {a:?}");
    }
    assert!(answers[6].response.is_none(), "{:?}", answers[6]);
    let too_many = vec![proposals[5].clone(); 1025];
    let e = peer.propose_batch(batch(too_many)).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("at most 1024"), "{e:?}");
}
