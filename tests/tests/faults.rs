//! Fault injection with history checks (in the manner of etcd's robustness
//! tests and the Jepsen analyses): 3 real nodes on loopback, concurrent KV
//! writers and readers, an incrementer and barrier participants talking to
//! random nodes while faults are injected; afterwards every acknowledged
//! write is present, per-key histories are linearizable (WGL), increments
//! were applied exactly once, barrier participants agree, the service
//! incarnation never changed, and all replicas converge to one digest.
//!
//! `COORDSTORE_SOAK_SECS=N` runs each scenario's fault phase for N seconds
//! (default 12).

use std::time::Duration;

use std::collections::HashMap;

use coordstore_tests::proxy::Proxy;
use coordstore_tests::workload::{self, AnyNode};
use coordstore_tests::{free_port, Cluster};
use proto::coordstore::{AddMemberRequest, RemoveMemberRequest};
use rand::Rng;

const WAIT: Duration = Duration::from_secs(60);

fn fault_phase() -> Duration {
    let secs = std::env::var("COORDSTORE_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(12u64);
    Duration::from_secs(secs)
}

/// Starts a cluster and the workload, runs `faults` for the fault phase,
/// heals everything, and checks.
async fn scenario<F, Fut>(extra: &[&str], faults: F)
where
    F: FnOnce(Cluster, Duration) -> Fut,
    Fut: std::future::Future<Output = Cluster>,
{
    let mut flags = vec!["--tasks", "3"];
    flags.extend_from_slice(extra);
    scenario_on(Cluster::start(3, &flags), faults).await;
}

/// [`scenario`] on a cluster the caller started (with `--tasks 3`).
async fn scenario_on<F, Fut>(cluster: Cluster, faults: F)
where
    F: FnOnce(Cluster, Duration) -> Fut,
    Fut: std::future::Future<Output = Cluster>,
{
    cluster.wait_leader(&[0, 1, 2], WAIT).await;
    let nodes = AnyNode::new(&cluster.addrs());
    let load = workload::start(&nodes, 4, 3);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let cluster = faults(cluster, fault_phase()).await;
    // Healed: everyone is up again.
    cluster.wait_leader(&[0, 1, 2], WAIT).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (recorder, observed) = load.stop().await;
    let problems = workload::check(&nodes, &recorder, &observed).await;
    cluster.wait_converged(&[0, 1, 2], WAIT).await;
    let sizes = recorder.sizes();
    assert!(
        sizes.values().all(|&n| n > 5),
        "too little traffic to check: {sizes:?}\n{}",
        cluster.logs()
    );
    assert!(
        *observed.acked_increments.lock().unwrap() > 5,
        "too few increments"
    );
    assert!(problems.is_empty(), "{problems:#?}\n{}", cluster.logs());
}

async fn leader(cluster: &Cluster, among: &[usize]) -> usize {
    cluster.wait_leader(among, WAIT).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_leaders_and_followers_at_random() {
    scenario(&[], |mut cluster, phase| async move {
        let end = tokio::time::Instant::now() + phase;
        while tokio::time::Instant::now() < end {
            let victim = if rand::random::<bool>() {
                leader(&cluster, &[0, 1, 2]).await
            } else {
                rand::rng().random_range(0..3)
            };
            let wait = rand::rng().random_range(200..1500);
            tokio::time::sleep(Duration::from_millis(wait)).await;
            cluster.kill(victim);
            let down = rand::rng().random_range(300..2000);
            tokio::time::sleep(Duration::from_millis(down)).await;
            cluster.restart(victim);
            cluster.wait_leader(&[0, 1, 2], WAIT).await;
        }
        cluster
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigstop_the_leader_longer_than_an_election_timeout() {
    scenario(&[], |cluster, phase| async move {
        let end = tokio::time::Instant::now() + phase;
        while tokio::time::Instant::now() < end {
            let l = leader(&cluster, &[0, 1, 2]).await;
            cluster.nodes[l].signal(libc::SIGSTOP);
            // Election timeout is 800–1600 ms in the harness.
            tokio::time::sleep(Duration::from_millis(3000)).await;
            cluster.nodes[l].signal(libc::SIGCONT);
            tokio::time::sleep(Duration::from_millis(1000)).await;
        }
        cluster
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_whole_cluster_killed_and_restarted() {
    scenario(&[], |mut cluster, phase| async move {
        let end = tokio::time::Instant::now() + phase;
        while tokio::time::Instant::now() < end {
            tokio::time::sleep(Duration::from_millis(1500)).await;
            for i in 0..3 {
                cluster.kill(i);
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
            for i in 0..3 {
                cluster.restart(i);
            }
            cluster.wait_leader(&[0, 1, 2], WAIT).await;
        }
        cluster
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_isolating_the_leader_then_healing() {
    // Every node reaches every peer through its own proxy (i -> j), so a
    // node's links can be cut both ways while clients still reach it.
    let addrs: Vec<String> = (0..3)
        .map(|_| format!("127.0.0.1:{}", free_port()))
        .collect();
    let mut proxies: HashMap<(usize, usize), Proxy> = HashMap::new();
    for i in 0..3 {
        for j in (0..3).filter(|&j| j != i) {
            proxies.insert((i, j), Proxy::start(&addrs[j]).await);
        }
    }
    let per_node = |i: usize| {
        let spec = (0..3)
            .filter(|&j| j != i)
            .map(|j| format!("{}={}", j + 1, proxies[&(i, j)].addr))
            .collect::<Vec<_>>()
            .join(",");
        vec!["--peer-address".to_string(), spec]
    };
    let cluster = Cluster::start_at(&addrs, &["--tasks", "3"], per_node);
    let proxies = std::sync::Arc::new(proxies);
    // The links must outlive the fault phase (the checks run over them).
    let links = proxies.clone();
    scenario_on(cluster, |cluster, phase| async move {
        let end = tokio::time::Instant::now() + phase;
        while tokio::time::Instant::now() < end {
            let l = leader(&cluster, &[0, 1, 2]).await;
            for ((i, j), p) in proxies.iter() {
                if *i == l || *j == l {
                    p.cut();
                }
            }
            // The majority elects a new leader meanwhile.
            let others: Vec<usize> = (0..3).filter(|&i| i != l).collect();
            cluster.wait_leader(&others, WAIT).await;
            tokio::time::sleep(Duration::from_millis(1500)).await;
            for p in proxies.values() {
                p.heal();
            }
            cluster.wait_leader(&[0, 1, 2], WAIT).await;
            tokio::time::sleep(Duration::from_millis(1000)).await;
        }
        cluster
    })
    .await;
    drop(links);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wiped_node_rejoins_as_a_new_member() {
    scenario(&[], |mut cluster, _phase| async move {
        let l = leader(&cluster, &[0, 1, 2]).await;
        let victim = (l + 1) % 3;
        let old_id = cluster.nodes[victim].id;
        cluster.kill(victim);
        let mut admin = cluster.client(l, WAIT).await;
        admin
            .remove_member(RemoveMemberRequest { id: old_id })
            .await
            .expect("remove the dead node");
        // Its data is gone; it comes back as node 4 with an empty dir.
        std::fs::remove_dir_all(&cluster.nodes[victim].data_dir).unwrap();
        let addr = cluster.nodes[victim].addr.clone();
        cluster.replace_with_joiner(victim, 4, &addr, &[]);
        let mut admin = cluster
            .client(cluster.wait_leader(&[l], WAIT).await, WAIT)
            .await;
        let members = admin
            .add_member(AddMemberRequest {
                id: 4,
                address: addr,
            })
            .await
            .expect("add the new member")
            .into_inner()
            .members;
        let ids: Vec<u64> = members.iter().map(|m| m.id).collect();
        assert!(ids.contains(&4) && !ids.contains(&old_id), "{members:?}");
        cluster
    })
    .await;
}
