//! Backup and restore with the real binary: `coordstore ctl snapshot save`
//! from a 3-node cluster under a write load, `coordstore restore` of that
//! file into three new data dirs, a new cluster started on them; and the
//! refusals (a damaged file, the old cluster id, a used data dir, a peer of
//! another cluster).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use coordstore_tests::coordstore_cli as coordstore;
use coordstore_tests::wait::{eventually, holds};
use coordstore_tests::{coordstore_bin, free_port, kv_get, try_status, Cluster, Writer};

/// Acknowledged puts: key, value, when acknowledged.
type Acked = Arc<Mutex<Vec<(String, String, Instant)>>>;

/// Restores `file` as node `id` of `cluster` into `dir`.
async fn restore(
    file: &str,
    dir: &std::path::Path,
    id: u64,
    cluster: &str,
    cluster_id: &str,
) -> (bool, String, String) {
    coordstore(&[
        "restore",
        file,
        "--data-dir",
        &dir.display().to_string(),
        "--node-id",
        &id.to_string(),
        "--cluster",
        cluster,
        "--cluster-id",
        cluster_id,
    ])
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_backup_saved_under_load_restores_a_new_cluster_with_every_acknowledged_write() {
    let wait = Duration::from_secs(30);
    let old = Cluster::start(3, &[]);
    old.wait_leader(&[0, 1, 2], wait).await;

    // Four writers, each its own client and keys; every acknowledged put is
    // noted with the time it was acknowledged.
    let acked: Acked = Default::default();
    let stop = Arc::new(AtomicBool::new(false));
    let mut writers = Vec::new();
    for w in 0..4 {
        let addr = old.nodes[w % 3].addr.clone();
        let (acked, stop) = (acked.clone(), stop.clone());
        writers.push(tokio::spawn(async move {
            let mut c = coordstore_tests::connect(&addr, Duration::from_secs(10)).await;
            let mut writer = Writer::new();
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let (key, value) = (format!("w{w}/{i}"), format!("v{w}-{i}"));
                writer
                    .put(&mut c, &key, value.as_bytes(), Duration::from_secs(10))
                    .await
                    .expect("put");
                acked.lock().unwrap().push((key, value, Instant::now()));
                i += 1;
            }
        }));
    }
    let count = |acked: &Acked| acked.lock().unwrap().len();
    eventually("200 writes acknowledged", wait, || async {
        let n = count(&acked);
        holds(n >= 200, || format!("{n} acknowledged"))
    })
    .await;

    // Save through a follower (the read goes to the leader) while writing.
    let backup_dir = tempfile::tempdir().unwrap();
    let file = backup_dir.path().join("backup.csb").display().to_string();
    let follower = {
        let leader = old.wait_leader(&[0, 1, 2], wait).await;
        (leader + 1) % 3
    };
    let save_began = Instant::now();
    let (ok, stdout, stderr) = coordstore(&[
        "ctl",
        "--endpoint",
        &old.nodes[follower].addr,
        "snapshot",
        "save",
        &file,
    ])
    .await;
    assert!(ok, "snapshot save failed: {stderr}");
    let saved: serde_json::Value = serde_json::from_str(&stdout).expect("save prints JSON");
    let header = &saved["header"];
    let index = header["index"].as_u64().unwrap();
    let digest = header["state_digest"].as_str().unwrap().to_string();
    assert_eq!(header["cluster_id"], "coordstore");
    // The load goes on after the save, then stops.
    let after_save = count(&acked);
    eventually(
        "100 more writes acknowledged after the save",
        wait,
        || async {
            let n = count(&acked);
            holds(n >= after_save + 100, || {
                format!("{n} acknowledged, {after_save} at the save")
            })
        },
    )
    .await;
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.await.unwrap();
    }
    let acked = acked.lock().unwrap().clone();
    let before: Vec<_> = acked.iter().filter(|(_, _, t)| *t < save_began).collect();
    assert!(before.len() >= 200);

    // `ctl snapshot status` checks the file and agrees with the save.
    let (ok, stdout, stderr) = coordstore(&["ctl", "snapshot", "status", &file]).await;
    assert!(ok, "snapshot status failed: {stderr}");
    let status: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(&status, header);
    // Its reader gone before it prints (`| head -1` that already left): a
    // quiet, successful end, not a panic.
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = std::process::Command::new(coordstore_bin())
        .args(["ctl", "snapshot", "status", &file])
        .stdout(writer)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stderr.is_empty(),
        "{:?}: {stderr}",
        out.status
    );

    // Restore into three new data dirs: a new cluster on new ports.
    let root = tempfile::tempdir().unwrap();
    let addrs: Vec<String> = (0..3)
        .map(|_| format!("127.0.0.1:{}", free_port()))
        .collect();
    let members = addrs
        .iter()
        .enumerate()
        .map(|(i, a)| format!("{}={a}", i + 1))
        .collect::<Vec<_>>()
        .join(",");
    for id in 1..=3u64 {
        let dir = root.path().join(format!("node{id}"));
        let (ok, stdout, stderr) = restore(&file, &dir, id, &members, "restored").await;
        assert!(ok, "restore of node {id} failed: {stderr}");
        let out: serde_json::Value = serde_json::from_str(&stdout).unwrap();
        assert_eq!(out["index"].as_u64(), Some(index));
    }
    // A restored dir is the new cluster's: started under the old id it is
    // refused, naming the dir.
    let (ok, _, stderr) = coordstore(&[
        "serve",
        "--node-id",
        "1",
        "--listen",
        &format!("127.0.0.1:{}", free_port()),
        "--data-dir",
        &root.path().join("node1").display().to_string(),
        "--cluster",
        &members,
    ])
    .await;
    assert!(!ok);
    assert!(
        stderr.contains("cluster 'restored'") && stderr.contains("node1"),
        "{stderr}"
    );

    let new = Cluster::start_at_on(&addrs, &["--cluster-id", "restored"], root.path());
    new.wait_leader(&[0, 1, 2], wait).await;
    let converged = new.wait_converged(&[0, 1, 2], wait).await;
    assert_eq!(converged, digest, "the restored state is the saved one");
    let st = try_status(&new.nodes[0].addr).await.expect("status");
    assert_eq!(st.cluster_id, "restored");
    assert!(
        st.last_applied > index,
        "the log goes on after the saved index"
    );

    // Every write acknowledged before the save began is there, with its
    // value; nothing the old cluster did not have.
    let mut c = coordstore_tests::connect(&new.nodes[1].addr, wait).await;
    for (key, value, _) in &before {
        assert_eq!(
            kv_get(&mut c, key).await.as_deref(),
            Some(value.as_bytes()),
            "{key} acknowledged before the save is missing"
        );
    }
    let latest: HashMap<&str, &str> = acked
        .iter()
        .map(|(k, v, _)| (k.as_str(), v.as_str()))
        .collect();
    for key in coordstore_tests::kv_keys(&mut c, "").await {
        assert!(latest.contains_key(key.as_str()), "{key} was never written");
    }
    // The new cluster takes writes.
    Writer::new()
        .put(&mut c, "after-restore", b"x", wait)
        .await
        .unwrap();
    assert_eq!(
        kv_get(&mut c, "after-restore").await.as_deref(),
        Some(&b"x"[..])
    );

    // A peer of another cluster (the old one, say) is refused before its
    // message is read; the same call naming this cluster gets as far as
    // decoding its (empty) payload.
    let peer = |cluster: &'static str| {
        let addr = new.nodes[0].addr.clone();
        async move {
            let ch = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
                .unwrap()
                .connect()
                .await
                .unwrap();
            let mut client = proto::coordstore::raft_peer_client::RaftPeerClient::new(ch);
            let mut req = tonic::Request::new(proto::coordstore::RaftPayload::default());
            req.metadata_mut()
                .insert(raft::PEER_CLUSTER_HEADER, cluster.parse().unwrap());
            client.vote(req).await.unwrap_err()
        }
    };
    let other = peer("coordstore").await;
    assert_eq!(other.code(), tonic::Code::FailedPrecondition, "{other:?}");
    assert!(other.message().contains("cluster 'restored'"));
    let same = peer("restored").await;
    assert_ne!(same.code(), tonic::Code::FailedPrecondition, "{same:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_backups_and_bad_restores_are_refused_and_write_nothing() {
    let wait = Duration::from_secs(30);
    let old = Cluster::start(1, &[]);
    old.wait_leader(&[0], wait).await;
    let mut c = coordstore_tests::connect(&old.nodes[0].addr, wait).await;
    Writer::new().put(&mut c, "k", b"v", wait).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("b.csb");
    let file_s = file.display().to_string();
    let (ok, _, stderr) = coordstore(&[
        "ctl",
        "--endpoint",
        &old.nodes[0].addr,
        "snapshot",
        "save",
        &file_s,
    ])
    .await;
    assert!(ok, "{stderr}");
    let members = "1=127.0.0.1:1";

    // A file saved into a directory that does not exist: an error, no file.
    let (ok, _, stderr) = coordstore(&[
        "ctl",
        "--endpoint",
        &old.nodes[0].addr,
        "snapshot",
        "save",
        &dir.path().join("nope/b.csb").display().to_string(),
    ])
    .await;
    assert!(!ok);
    assert!(stderr.contains("cannot write"), "{stderr}");

    // One flipped byte in the state: the checksum refuses it.
    let mut raw = std::fs::read(&file).unwrap();
    let last = raw.len() - 1;
    raw[last] ^= 0x40;
    let damaged = dir.path().join("damaged.csb");
    std::fs::write(&damaged, &raw).unwrap();
    let damaged_s = damaged.display().to_string();
    let target = dir.path().join("target");
    let (ok, _, stderr) = restore(&damaged_s, &target, 1, members, "new").await;
    assert!(!ok);
    assert!(stderr.contains("checksum mismatch"), "{stderr}");
    let (ok, _, stderr) = coordstore(&["ctl", "snapshot", "status", &damaged_s]).await;
    assert!(!ok && stderr.contains("checksum mismatch"), "{stderr}");
    // Cut short.
    std::fs::write(&damaged, &raw[..raw.len() - 3]).unwrap();
    let (ok, _, stderr) = restore(&damaged_s, &target, 1, members, "new").await;
    assert!(!ok);
    assert!(stderr.contains("truncated"), "{stderr}");
    // The cluster id it was saved from.
    let (ok, _, stderr) = restore(&file_s, &target, 1, members, "coordstore").await;
    assert!(!ok);
    assert!(stderr.contains("needs a new cluster id"), "{stderr}");
    // A node that is not a member.
    let (ok, _, stderr) = restore(&file_s, &target, 2, members, "new").await;
    assert!(!ok);
    assert!(stderr.contains("not in the member list"), "{stderr}");
    // A bad member list.
    let (ok, _, stderr) = restore(&file_s, &target, 1, "1=a,0=b", "new").await;
    assert!(!ok);
    assert!(stderr.contains("node ids must be > 0"), "{stderr}");
    assert!(!target.exists(), "a refused restore wrote nothing");
    // A data dir in use (the running node's own).
    let (ok, _, stderr) = restore(&file_s, &old.nodes[0].data_dir, 1, members, "new").await;
    assert!(!ok);
    assert!(stderr.contains("not empty"), "{stderr}");
    // And the good file restores.
    let (ok, _, stderr) = restore(&file_s, &target, 1, members, "new").await;
    assert!(ok, "{stderr}");
}

/// A backup carries every namespace: restored, the new node serves each on
/// its port with its keys and settings.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_restores_every_namespace_on_its_port() {
    use coordstore_tests::ns;
    let wait = Duration::from_secs(30);
    let (low, high) = coordstore_tests::free_port_range(&["127.0.0.1"], 2);
    let range = format!("{low}-{high}");
    let old = Cluster::start(1, &["--tasks", "1", "--namespace-ports", &range]);
    let addr = old.nodes[0].addr.clone();
    old.wait_leader(&[0], wait).await;
    let mut client = old.client(0, wait).await;
    for (name, keys) in [("job-a", 2), ("job-b", 3)] {
        let settings = proto::coordstore::NamespaceSettings {
            max_keys: Some(10),
            ..ns::tasks(2)
        };
        ns::create(&addr, name, settings).await.unwrap();
        let mut w = Writer::in_namespace(name);
        for k in 0..keys {
            w.put(&mut client, &format!("k{k}"), b"v", wait)
                .await
                .unwrap();
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("backup.csb").display().to_string();
    let (ok, _, stderr) =
        coordstore(&["ctl", "--endpoint", &addr, "snapshot", "save", &file]).await;
    assert!(ok, "{stderr}");
    drop(old);

    let new_addr = format!("127.0.0.1:{}", free_port());
    let data = dir.path().join("restored");
    let (ok, _, stderr) = restore(&file, &data, 1, &format!("1={new_addr}"), "restored").await;
    assert!(ok, "{stderr}");
    let root = dir.path().join("cluster");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::rename(&data, root.join("node1")).unwrap();
    let new = Cluster::start_at_on(
        std::slice::from_ref(&new_addr),
        &[
            "--tasks",
            "1",
            "--namespace-ports",
            &range,
            "--cluster-id",
            "restored",
        ],
        &root,
    );
    for (name, keys) in [("job-a", 2), ("job-b", 3)] {
        let info = ns::wait_serving(&new, name, wait).await;
        assert_eq!(info.keys, keys);
        assert_eq!(info.settings.unwrap().max_keys, Some(10));
        let got = info.port;
        assert!((u32::from(low)..=u32::from(high)).contains(&got));
    }
}
