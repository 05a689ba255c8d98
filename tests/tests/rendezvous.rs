//! torchrun's native rendezvous (`coordstore.v1.Rendezvous`, the journal's
//! rendezvous area) on a real 3-node cluster, through the agent library's
//! `next_rendezvous` (torch's, decided by the cluster): rounds form by
//! torch's rules, late agents wait and join the next round, a silent agent
//! is dropped by the leader, a closed run ends every wait, and a
//! rendezvous rides through its leader's death.

use std::time::Duration;

use agent::closures::Nodes;
use agent::rendezvous::{Agent, Error, Formed, Place, Run, Settings};
use coordstore_tests::wait::{eventually, holds};
use coordstore_tests::Cluster;
use tokio::task::JoinHandle;

const JOIN_TIMEOUT: Duration = Duration::from_secs(60);

fn agent(i: u64) -> Agent {
    Agent {
        addr: format!("10.0.0.{}", 1 + i % 3),
        pid: 1000 + i,
        local_id: 0,
    }
}

/// Run `run` through the cluster's nodes, starting at node `first` (so
/// agents spread over every node).
fn run_at(nodes: &[String], first: usize, run: &str) -> Run {
    let mut order = nodes.to_vec();
    order.rotate_left(first % nodes.len());
    Run::new(&Nodes::plain(&order, None), run).expect("a run")
}

fn quick(min: u32, max: u32) -> Settings {
    Settings {
        last_call: Duration::from_millis(500),
        keep_alive_every: Duration::from_millis(300),
        keep_alive_max_attempt: 3,
        ..Settings::torch(min, max)
    }
}

fn spawn(
    nodes: &[String],
    i: u64,
    run: &str,
    s: Settings,
    rejoin: bool,
) -> JoinHandle<Result<Formed, Error>> {
    let r = run_at(nodes, i as usize, run);
    tokio::spawn(async move { r.next_rendezvous(&agent(i), &s, JOIN_TIMEOUT, rejoin).await })
}

async fn formed(h: Vec<JoinHandle<Result<Formed, Error>>>) -> Vec<Formed> {
    let mut out = Vec::new();
    for h in h {
        out.push(h.await.expect("joined").expect("formed"));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rounds_form_by_torchs_rules_and_late_agents_join_the_next() {
    let cluster = Cluster::start(3, &[]);
    cluster
        .wait_leader(&[0, 1, 2], Duration::from_secs(30))
        .await;
    let nodes = cluster.addrs();

    // max_nodes: formed at the last join, ranks in torch's order.
    let s = quick(1, 6);
    let all: Vec<_> = (0..6).map(|i| spawn(&nodes, i, "full", s, false)).collect();
    let got = formed(all).await;
    let mut order: Vec<u64> = (0..6).collect();
    order.sort_by_key(|&i| {
        let a = agent(i);
        (a.addr, a.pid)
    });
    for (i, f) in got.iter().enumerate() {
        let rank = order.iter().position(|&o| o == i as u64).unwrap() as u32;
        assert_eq!((f.round, f.rank, f.world_size), (0, rank, 6), "agent {i}");
    }

    // min_nodes and the last call: 3 of 2..4 form once it passed.
    let s = quick(2, 4);
    let three: Vec<_> = (0..3)
        .map(|i| spawn(&nodes, i, "elastic", s, false))
        .collect();
    let got = formed(three).await;
    assert!(got.iter().all(|f| f.world_size == 3 && f.round == 0));
    // A fourth agent waits (there is room), and the others see it waiting
    // (torch's num_nodes_waiting).
    let late = spawn(&nodes, 3, "elastic", s, false);
    let probe = run_at(&nodes, 1, "elastic");
    eventually("the late agent waits", Duration::from_secs(10), || async {
        let v = probe
            .watch(&agent(0), 0, Duration::ZERO)
            .await
            .expect("watch");
        holds(v.waiting == 1, || v)
    })
    .await;
    // torch's scale-up: every agent of the round runs next_rendezvous
    // again; the last out moves the run to round 1, which forms at max.
    let again: Vec<_> = (0..3)
        .map(|i| spawn(&nodes, i, "elastic", s, true))
        .collect();
    let mut got = formed(again).await;
    got.push(late.await.expect("joined").expect("formed"));
    assert!(
        got.iter().all(|f| f.world_size == 4 && f.round == 1),
        "{got:?}"
    );
    let mut ranks: Vec<u32> = got.iter().map(|f| f.rank).collect();
    ranks.sort();
    assert_eq!(ranks, [0, 1, 2, 3]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_agent_is_dropped_and_closing_ends_every_wait() {
    let cluster = Cluster::start(3, &[]);
    cluster
        .wait_leader(&[0, 1, 2], Duration::from_secs(30))
        .await;
    let nodes = cluster.addrs();
    let s = quick(4, 4);
    // Agent 9 joins and never keeps alive: the leader drops it after 3
    // missed keep-alives (0.9 s); the two that wait keep alive.
    let silent = run_at(&nodes, 0, "r");
    let v = silent.join(&agent(9), &s).await.expect("join");
    assert_eq!(v.place(), Place::Participant);
    let waiting: Vec<_> = (0..2).map(|i| spawn(&nodes, i, "r", s, false)).collect();
    let probe = run_at(&nodes, 2, "r");
    eventually(
        "the silent agent is dropped",
        Duration::from_secs(10),
        || async {
            let v = probe
                .watch(&agent(9), 0, Duration::ZERO)
                .await
                .expect("watch");
            holds(v.place() == Place::None && v.participants == 2, || v)
        },
    )
    .await;
    // The two that keep alive are still there a liveness window later.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let v = probe
        .watch(&agent(0), 0, Duration::ZERO)
        .await
        .expect("watch");
    assert_eq!((v.place(), v.participants), (Place::Participant, 2));
    // Closing wakes both: torch's RendezvousClosedError.
    probe.close().await.expect("close");
    for h in waiting {
        let e = h.await.expect("joined").unwrap_err();
        assert!(matches!(e, Error::Closed), "{e:?}");
    }
    let e = silent
        .next_rendezvous(&agent(9), &s, JOIN_TIMEOUT, false)
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Closed), "{e:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rendezvous_rides_through_its_leaders_death() {
    let mut cluster = Cluster::start(3, &[]);
    let leader = cluster
        .wait_leader(&[0, 1, 2], Duration::from_secs(30))
        .await;
    let nodes = cluster.addrs();
    let s = Settings {
        keep_alive_every: Duration::from_secs(1),
        ..quick(4, 4)
    };
    // Three agents wait, each starting at a different node.
    let three: Vec<_> = (0..3).map(|i| spawn(&nodes, i, "r", s, false)).collect();
    let probe = run_at(&nodes, leader + 1, "r");
    eventually("three agents joined", Duration::from_secs(10), || async {
        let v = probe
            .watch(&agent(0), 0, Duration::ZERO)
            .await
            .expect("watch");
        holds(v.participants == 3, || v)
    })
    .await;
    cluster.kill(leader);
    let others: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    cluster.wait_leader(&others, Duration::from_secs(30)).await;
    // The fourth forms the round; nobody was dropped by the new leader.
    let fourth = spawn(&nodes, 3, "r", s, false);
    let mut all = formed(three).await;
    all.push(fourth.await.expect("joined").expect("formed"));
    assert!(all.iter().all(|f| f.world_size == 4), "{all:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_settings_are_refused_and_change_nothing() {
    let cluster = Cluster::start(1, &[]);
    cluster.wait_leader(&[0], Duration::from_secs(30)).await;
    let nodes = cluster.addrs();
    let r = run_at(&nodes, 0, "r");
    let e = r.join(&agent(0), &quick(3, 2)).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    r.join(&agent(0), &quick(2, 3)).await.expect("join");
    let e = r.join(&agent(1), &quick(2, 5)).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("takes 2 to 3 agents"), "{e:?}");
    let v = r.watch(&agent(1), 0, Duration::ZERO).await.expect("watch");
    assert_eq!((v.participants, v.place()), (1, Place::None));
}

/// torch 2.15's own handler tests' cases (IntegrationTest and the handler
/// tests a real server can run) on the native handler, made through
/// torch's registry as torchrun makes it, against a 3-node cluster.
#[test]
fn torchs_own_rendezvous_cases_pass_on_the_native_handler() {
    use coordstore_tests::jax::{torch_python, PyProc};
    let cluster = Cluster::start(3, &[]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(cluster.wait_leader(&[0, 1, 2], Duration::from_secs(30)));
    let mut p = PyProc::spawn_with(
        &torch_python(),
        "torch_rendezvous.py",
        &[cluster.addrs().join(",")],
        cluster.dir.path(),
        &[],
    );
    let status = p.wait_exit(Duration::from_secs(300));
    assert!(
        status.success() && p.lines().iter().any(|l| l == "all ok"),
        "{status}\n{}\n{}",
        p.report(),
        cluster.logs()
    );
}
