//! Replicated journal with real processes and real sled dirs: a node killed
//! mid-stream catches up, a whole-cluster crash keeps every acknowledged
//! write, a node that missed purged log entries catches up by snapshot, and
//! a foreign data dir is refused.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use coordstore_tests::wait::{eventually, holds, wait};
use coordstore_tests::{coordstore_bin, free_port, kv_keys, try_status, Cluster, Writer};

const WAIT: Duration = Duration::from_secs(60);

/// Writer tasks, the keys they had acknowledged, and a live count of acks.
type Writers = (
    Vec<tokio::task::JoinHandle<()>>,
    Arc<Mutex<Vec<String>>>,
    Arc<AtomicUsize>,
);

/// Runs `writers` concurrent writers of `per_writer` keys each against node
/// `target`.
fn spawn_writers(
    cluster: &Cluster,
    target: usize,
    writers: usize,
    per_writer: usize,
    give_up: Duration,
) -> Writers {
    let acked = Arc::new(Mutex::new(Vec::new()));
    let count = Arc::new(AtomicUsize::new(0));
    let addr = cluster.nodes[target].addr.clone();
    let handles = (0..writers)
        .map(|w| {
            let (acked, count, addr) = (acked.clone(), count.clone(), addr.clone());
            tokio::spawn(async move {
                let mut client = coordstore_tests::connect(&addr, WAIT).await;
                let mut writer = Writer::new();
                for i in 0..per_writer {
                    let key = format!("w{w}/k{i}");
                    match writer.put(&mut client, &key, key.as_bytes(), give_up).await {
                        Ok(()) => {
                            acked.lock().unwrap().push(key);
                            count.fetch_add(1, Ordering::SeqCst);
                        }
                        Err(_) => return,
                    }
                }
            })
        })
        .collect();
    (handles, acked, count)
}

async fn wait_count(count: &AtomicUsize, at_least: usize) {
    eventually(format!("{at_least} writes acknowledged"), WAIT, || async {
        let acked = count.load(Ordering::SeqCst);
        holds(acked >= at_least, || format!("{acked} acknowledged"))
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_killed_mid_stream_catches_up_with_the_same_digest() {
    let mut cluster = Cluster::start(3, &[]);
    let leader = cluster.wait_leader(&[0, 1, 2], WAIT).await;
    let follower = (leader + 1) % 3;
    let (writers, _acked, count) = spawn_writers(&cluster, leader, 16, 625, WAIT);
    wait_count(&count, 2500).await;
    cluster.kill(follower);
    for w in writers {
        w.await.unwrap();
    }
    assert_eq!(count.load(Ordering::SeqCst), 10_000, "{}", cluster.logs());
    cluster.restart(follower);
    cluster.wait_converged(&[0, 1, 2], WAIT).await;
    let mut client = cluster.client(leader, WAIT).await;
    assert_eq!(kv_keys(&mut client, "").await.len(), 10_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_cluster_crash_keeps_every_acknowledged_write() {
    let mut cluster = Cluster::start(3, &[]);
    let leader = cluster.wait_leader(&[0, 1, 2], WAIT).await;
    // Writers give up soon after the crash; only acknowledged keys count.
    let (writers, acked, count) =
        spawn_writers(&cluster, leader, 8, 100_000, Duration::from_millis(500));
    wait_count(&count, 1500).await;
    for i in 0..3 {
        cluster.kill(i);
    }
    for w in writers {
        w.await.unwrap();
    }
    let acked: BTreeSet<String> = acked.lock().unwrap().iter().cloned().collect();
    assert!(acked.len() >= 1500);
    for i in 0..3 {
        cluster.restart(i);
    }
    let leader = cluster.wait_leader(&[0, 1, 2], WAIT).await;
    let mut client = cluster.client(leader, WAIT).await;
    let present: BTreeSet<String> = kv_keys(&mut client, "").await.into_iter().collect();
    let lost: Vec<&String> = acked.difference(&present).collect();
    assert!(
        lost.is_empty(),
        "{} acknowledged writes lost, e.g. {:?}",
        lost.len(),
        &lost[..lost.len().min(5)]
    );
    cluster.wait_converged(&[0, 1, 2], WAIT).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_behind_a_purged_log_catches_up_by_snapshot() {
    let mut cluster = Cluster::start(
        3,
        &["--snapshot-every", "50", "--keep-behind-snapshot", "10"],
    );
    let leader = cluster.wait_leader(&[0, 1, 2], WAIT).await;
    let lagging = (leader + 1) % 3;
    let before = try_status(&cluster.nodes[lagging].addr)
        .await
        .expect("status of the node to stop");
    cluster.kill(lagging);
    let (writers, _, count) = spawn_writers(&cluster, leader, 8, 250, WAIT);
    for w in writers {
        w.await.unwrap();
    }
    assert_eq!(count.load(Ordering::SeqCst), 2000);
    // Snapshots and purges run in the background: wait (bounded) until the
    // leader's log no longer holds what the stopped node lacks.
    eventually(
        "the leader to purge past the stopped node's log",
        WAIT,
        || async {
            let leader_status = try_status(&cluster.nodes[leader].addr).await;
            let purged = leader_status.as_ref().map_or(0, |s| s.purged_index);
            holds(purged > before.last_log_index, || {
                format!("purged {purged} vs {}", before.last_log_index)
            })
        },
    )
    .await;
    cluster.restart(lagging);
    cluster.wait_converged(&[0, 1, 2], WAIT).await;
    let after = try_status(&cluster.nodes[lagging].addr).await.unwrap();
    assert!(
        after.snapshot_index > before.last_log_index,
        "the node must hold an installed snapshot: {after:?}"
    );
}

#[test]
fn a_data_dir_of_another_node_is_refused_with_its_path() {
    let mut cluster = Cluster::start(1, &[]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(cluster.wait_leader(&[0], WAIT));
    cluster.kill(0);
    let dir = cluster.nodes[0].data_dir.clone();
    let addr = format!("127.0.0.1:{}", free_port());
    let out = std::process::Command::new(coordstore_bin())
        .args(["serve", "--node-id", "2", "--listen", &addr, "--data-dir"])
        .arg(&dir)
        .args(["--cluster", &format!("2={addr}")])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&dir.display().to_string()), "{stderr}");
    assert!(stderr.contains("belongs to node 1"), "{stderr}");
}

/// The log is compacted by its size as well as by its entry count: with the
/// entry policy out of reach, 200 KiB of writes against a 64 KiB bound make
/// the node snapshot and purge, and a restart rebuilds the state from that
/// snapshot (its own file) plus the log after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_is_snapshotted_by_bytes_and_replayed_from_that_snapshot() {
    let mut cluster = Cluster::start(
        1,
        &[
            "--snapshot-every",
            "1000000",
            "--snapshot-log-bytes",
            "65536",
            "--keep-behind-snapshot",
            "10",
        ],
    );
    cluster.wait_leader(&[0], WAIT).await;
    let mut client = cluster.client(0, WAIT).await;
    let mut writer = Writer::new();
    let value = vec![b'v'; 1024];
    for i in 0..200 {
        writer
            .put(&mut client, &format!("big/{i}"), &value, WAIT)
            .await
            .unwrap();
    }
    let status = wait("a snapshot by bytes", WAIT)
        .context(|| cluster.logs())
        .until(|| async {
            let s = try_status(&cluster.nodes[0].addr).await.expect("status");
            if s.snapshot_index > 0 && s.purged_index > 0 {
                Ok(s)
            } else {
                Err(s)
            }
        })
        .await;
    assert!(cluster.nodes[0].data_dir.join("snapshot").is_file());
    cluster.kill(0);
    cluster.restart(0);
    cluster.wait_leader(&[0], WAIT).await;
    let mut client = cluster.client(0, WAIT).await;
    assert_eq!(
        coordstore_tests::kv_get(&mut client, "big/199").await,
        Some(value.clone())
    );
    assert_eq!(
        coordstore_tests::kv_keys(&mut client, "big").await.len(),
        200
    );
    let after = try_status(&cluster.nodes[0].addr).await.unwrap();
    assert!(after.snapshot_index >= status.snapshot_index, "{after:?}");
}
