//! A hostile client on the Node API: headers a client can set are not
//! trusted. `x-coordstore-forwarded` (which nodes put on the calls they
//! forward) neither lets a client propose the leader runtime's commands nor
//! keep a time of its own choosing.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use coordstore_tests::{connect, journal_state, Cluster};
use journal::pb::{update::Command, BarrierExpire, InitService, KvInsert, TasksUnhealthy};
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
            Command::BarrierExpire(BarrierExpire {
                id: "b".into(),
                counter: 0,
            }),
            Command::InitService(InitService::default()),
            Command::TasksUnhealthy(TasksUnhealthy { tasks: vec![0, 1] }),
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
            Command::KvInsert(KvInsert {
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
        assert!(s.kv_get(&format!("hostile/{node}")).is_some());
    }
}
