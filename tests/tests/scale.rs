//! A large job through its whole life with a fault: 2,048 simulated jaxlib
//! tasks (`coordstore_tests::jaxsim`, the calls of a stock jaxlib 0.12
//! client) on 3 nodes, dialing the followers, the leader SIGKILLed while the
//! registration barrier waits for its last task. Every task registers once
//! with its own incarnation, the topology exchange and the barrier pass,
//! shutdown ends every task's PollForError, and nothing is lost.

use std::time::Duration;

use coordstore_tests::jaxsim::{JobSpec, PhaseReport, Sim, SimConfig};
use coordstore_tests::wait::{eventually_blocking, holds, wait};
use coordstore_tests::{
    free_port, http_get, journal_state, metric_sample, parked_calls, wait_parked, Cluster,
};
use journal::coordination::TaskStatus;

const WAIT: Duration = Duration::from_secs(120);
const TASKS: usize = 2048;

fn clean(r: &PhaseReport, cluster: &Cluster) {
    assert_eq!(
        r.errors(),
        0,
        "{}: {:?}\n{}",
        r.phase,
        r.first_error(),
        cluster.logs()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_2048_task_job_rides_through_a_leader_kill_during_registration() {
    let n = TASKS.to_string();
    let mut cluster = Cluster::start(3, &["--tasks", &n, "--heartbeat-timeout-ms", "600000"]);
    let leader = cluster.wait_leader(&[0, 1, 2], WAIT).await;
    let followers: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    let cfg = SimConfig {
        jobs: vec![JobSpec {
            tasks: TASKS,
            addrs: followers
                .iter()
                .map(|&i| cluster.nodes[i].addr.clone())
                .collect(),
        }],
        tasks_per_conn: 16,
        heartbeat_interval: Duration::from_secs(1),
        call_timeout: WAIT,
    };
    let mut sim = Sim::connect(cfg).await.expect("connect");
    // Every task but the last registers; the leader dies while they wait
    // for it; then the last one registers.
    let (open, gate) = tokio::sync::watch::channel(false);
    let registering = tokio::spawn(async move {
        let r = sim.register_gated(1, Some(gate)).await;
        (sim, r)
    });
    // Registered tasks wait at the registration barrier, each parked on the
    // follower it dialed.
    let want = (TASKS - 1) as u64;
    wait(format!("{want} registered tasks parked"), WAIT)
        .context(|| cluster.logs())
        .until(|| async {
            let mut parked = 0;
            for &i in &followers {
                parked += parked_calls(&cluster.nodes[i].addr).await;
            }
            holds(parked >= want, || format!("{parked} of {want} registered"))
        })
        .await;
    cluster.kill(leader);
    let f = followers[0];
    open.send(true).expect("the registration waits");
    let (mut sim, r) = registering.await.unwrap();
    clean(&r, &cluster);

    clean(&sim.exchange().await, &cluster);
    clean(&sim.barrier("after-failover").await, &cluster);
    // Every task registered once, with its own incarnation; every key is
    // there (one per task and the global topology).
    let s = journal_state(&cluster.nodes[f].addr).await;
    let c = s.coordination();
    for t in 0..TASKS {
        let task = c.task(t as u32).expect("a task");
        assert_eq!(task.status(), TaskStatus::Connected, "task {t}");
        assert_eq!(Some(task.incarnation), sim.incarnation(0, t), "task {t}");
    }
    assert_eq!(c.stats().keys, TASKS as u64 + 1);
    assert_eq!(s.service_incarnation(), sim.service_incarnation(0));
    // A few heartbeats went by, answered.
    let steady = sim.steady(Duration::from_millis(2500)).await;
    clean(&steady, &cluster);
    assert!(steady
        .calls
        .get("heartbeat")
        .is_some_and(|h| h.ok >= TASKS as u64));
    let down = sim.shutdown().await;
    clean(&down, &cluster);
    assert_eq!(down.calls["poll_for_error"].ok, TASKS as u64);
    let s = journal_state(&cluster.nodes[f].addr).await;
    assert_eq!(
        s.coordination().stats().tasks[0],
        TASKS as u64,
        "all shut down"
    );
}

/// A follower forwards what thousands of tasks send at once over its one
/// HTTP/2 connection to the leader. Each is a small request; h2 closes a
/// connection (GOAWAY ENHANCE_YOUR_CALM) whose received-but-unread small
/// frames exceed its budget, which failed every forwarded call on it with
/// RESOURCE_EXHAUSTED. 16,384 writes sent to a follower at once (1,024
/// connections × 16 streams) must all succeed and all be there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_16384_writes_through_a_follower_all_land() {
    const CONNS: usize = 1024;
    const PER_CONN: usize = 16;
    let cluster = Cluster::start(3, &[]);
    let leader = cluster.wait_leader(&[0, 1, 2], WAIT).await;
    let follower = cluster.nodes[(leader + 1) % 3].addr.clone();
    let mut clients = Vec::with_capacity(CONNS);
    for _ in 0..CONNS {
        clients.push(coordstore_tests::wire::tf(&follower).await);
    }
    let start = std::sync::Arc::new(tokio::sync::Barrier::new(CONNS * PER_CONN));
    let mut writes = Vec::new();
    for (i, c) in clients.into_iter().enumerate() {
        for j in 0..PER_CONN {
            let (mut c, start) = (c.clone(), start.clone());
            writes.push(tokio::spawn(async move {
                start.wait().await;
                let req = proto::tf::InsertKeyValueRequest {
                    kv: Some(proto::tf::KeyValueEntry {
                        key: format!("burst/{i}/{j}"),
                        value: vec![7u8; 16].into(),
                    }),
                    allow_overwrite: false,
                };
                tokio::time::timeout(WAIT, c.insert_key_value(req))
                    .await
                    .map_err(|_| "no answer in time".to_string())?
                    .map(|_| ())
                    .map_err(|s| format!("{:?}: {}", s.code(), s.message()))
            }));
        }
    }
    let mut failed = Vec::new();
    for w in writes {
        if let Err(e) = w.await.expect("the write task ran") {
            failed.push(e);
        }
    }
    assert!(
        failed.is_empty(),
        "{} of {} writes failed, first: {:?}",
        failed.len(),
        CONNS * PER_CONN,
        failed.first()
    );
    let state = journal_state(&cluster.nodes[leader].addr).await;
    let keys = state
        .coordination()
        .kv_all()
        .filter(|(k, _)| k.starts_with("burst/"))
        .count();
    assert_eq!(keys, CONNS * PER_CONN, "every write is in the state");
}

/// ReadIndex calls the node whose metrics listen at `http` has answered
/// (peers ask through NodePeer; builds before it through Node).
fn read_index_calls(http: &str) -> f64 {
    eventually_blocking(format!("metrics at {http}"), WAIT, || {
        match http_get(http, "/metrics") {
            Some((200, text)) => Ok(["NodePeer", "Node"]
                .iter()
                .map(|service| {
                    let name = format!(
                        r#"coordstore_grpc_calls_total{{code="Ok",method="/coordstore.v1.{service}/ReadIndex"}}"#
                    );
                    metric_sample(&text, &name).unwrap_or(0.0)
                })
                .sum::<f64>()),
            other => Err(other),
        }
    })
}

/// A follower asks the leader for read indexes in rounds, each serving
/// every read waiting when it was sent: 4,096 blocking gets arriving at a
/// follower at once (as a large job's long polls do) cost the leader far
/// fewer ReadIndex calls than gets (one each before), and every get answers
/// with the value set after they parked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_through_a_follower_ask_the_leader_in_rounds() {
    const CONNS: usize = 256;
    const PER_CONN: usize = 16;
    const GETS: usize = CONNS * PER_CONN;
    let http: Vec<String> = (0..3)
        .map(|_| format!("127.0.0.1:{}", free_port()))
        .collect();
    let h = http.clone();
    let cluster = Cluster::start_each(3, &[], move |i| {
        vec!["--metrics-listen".into(), h[i].clone()]
    });
    let leader = cluster.wait_leader(&[0, 1, 2], WAIT).await;
    let follower = cluster.nodes[(leader + 1) % 3].addr.clone();
    let before = read_index_calls(&http[leader]);
    let mut gets = Vec::with_capacity(GETS);
    for _ in 0..CONNS {
        let c = coordstore_tests::wire::tf(&follower).await;
        for _ in 0..PER_CONN {
            let mut c = c.clone();
            gets.push(tokio::spawn(async move {
                let req = proto::tf::GetKeyValueRequest {
                    key: "round/k".into(),
                };
                tokio::time::timeout(WAIT, c.get_key_value(req))
                    .await
                    .map_err(|_| "no answer in time".to_string())?
                    .map(|r| r.into_inner().kv.map(|kv| kv.value.to_vec()))
                    .map_err(|s| format!("{:?}: {}", s.code(), s.message()))
            }));
        }
    }
    wait_parked(&follower, GETS as u64, WAIT).await;
    let asked = read_index_calls(&http[leader]) - before;
    assert!(
        asked >= 1.0 && asked * 4.0 < GETS as f64,
        "{GETS} gets on a follower asked the leader {asked} times"
    );
    let mut w = coordstore_tests::wire::tf(&cluster.nodes[leader].addr).await;
    w.insert_key_value(proto::tf::InsertKeyValueRequest {
        kv: Some(proto::tf::KeyValueEntry {
            key: "round/k".into(),
            value: b"v".to_vec().into(),
        }),
        allow_overwrite: false,
    })
    .await
    .expect("set the key");
    for g in gets {
        let got = g.await.expect("the get task ran");
        assert_eq!(got, Ok(Some(b"v".to_vec())));
    }
}
