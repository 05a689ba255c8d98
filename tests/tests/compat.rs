//! What the build before namespaces wrote, read by this one
//! (`tests/fixtures/before-namespaces`): its data dir opens as the default
//! namespace with the same state and every key (plus the one entry this
//! build adds at start, the cluster's journal feature level: the old state
//! with that entry replayed has the node's digest), and takes new
//! namespaces; its backup checks and restores the same way.

use std::path::{Path, PathBuf};
use std::time::Duration;

use coordstore_tests::wait::eventually;
use coordstore_tests::{coordstore_cli, free_port, kv_keys, ns, try_status, workspace, Cluster};

const WAIT: Duration = Duration::from_secs(30);
/// The state digest the build before reported for both.
const DIGEST: &str = "da7b15787615b83295092565e52bb6e64dac2e086b89345298c2f83d8a76a531";
const INCARNATION: u64 = 6788115390435883398;

fn fixture(name: &str) -> PathBuf {
    workspace()
        .join("tests/fixtures/before-namespaces")
        .join(name)
}

/// Waits until the node at `addr` leads and has raised the cluster's
/// journal feature level (its only write of its own at start); returns its
/// digest.
async fn digest(addr: &str) -> String {
    eventually(format!("{addr} to come up"), WAIT, || async {
        match try_status(addr).await {
            Some(s) if s.leader_id != 0 && s.cluster_feature_level == journal::FEATURE_LEVEL => {
                Ok(s.state_digest)
            }
            other => Err(other),
        }
    })
    .await
}

/// The state the build before saved (the backup fixture's, whose digest is
/// [`DIGEST`]).
fn old_state() -> journal::State {
    let b = storage::backup::Backup::read(&fixture("backup.csb")).unwrap();
    let s = journal::State::decode_snapshot(&b.data).unwrap();
    assert_eq!(s.digest_hex(), DIGEST);
    s
}

/// The node at `addr` holds exactly the state the build before wrote, and
/// the one entry this build adds to it at start: the cluster's journal
/// feature level, raised by the leader once every member (this one) applies
/// it. Replaying that entry onto the old state gives the node's digest.
async fn holds_the_old_state_and_its_level(addr: &str) {
    let now = coordstore_tests::journal_state(addr).await;
    let mut want = old_state();
    let raise = journal::Update {
        at_ms: now.clock_ms(),
        command: Some(journal::pb::update::Command::SetFeatureLevel(
            journal::pb::SetFeatureLevel {
                level: journal::FEATURE_LEVEL,
            },
        )),
        ..Default::default()
    };
    assert!(!want.apply(&raise).is_err());
    assert_eq!(now.digest_hex(), want.digest_hex());
    assert_eq!(digest(addr).await, want.digest_hex());
}

/// The default namespace holds what the build before wrote.
async fn holds_the_old_state(addr: &str) {
    let mut c = coordstore_tests::connect(addr, WAIT).await;
    assert_eq!(kv_keys(&mut c, "").await, ["cfg/k1", "cfg/k2", "cfg/k3"]);
    let got = coordstore_tests::kv_get(&mut c, "cfg/k2").await;
    assert_eq!(got.as_deref(), Some(&b"value-2"[..]));
    let info = ns::get(addr, "default").await.unwrap();
    assert_eq!((info.keys, info.service_incarnation), (3, INCARNATION));
    assert_eq!(ns::names(addr).await, ["default"]);
}

fn untar(archive: &Path, into: &Path) {
    let status = std::process::Command::new("tar")
        .arg("xzf")
        .arg(archive)
        .arg("-C")
        .arg(into)
        .status()
        .expect("tar");
    assert!(status.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_dir_of_the_build_before_opens_as_the_default_namespace() {
    let root = tempfile::tempdir().unwrap();
    untar(&fixture("data-dir.tgz"), root.path());
    let addr = format!("127.0.0.1:{}", free_port());
    let mut cluster =
        Cluster::start_at_on(std::slice::from_ref(&addr), &["--tasks", "2"], root.path());
    digest(&addr).await;
    holds_the_old_state_and_its_level(&addr).await;
    holds_the_old_state(&addr).await;
    // It takes namespaces, and keeps them over a restart.
    ns::create(&addr, "new-job", ns::tasks(1)).await.unwrap();
    cluster.restart(0);
    digest(&addr).await;
    assert_eq!(ns::names(&addr).await, ["default", "new-job"]);
    let mut c = coordstore_tests::connect(&addr, WAIT).await;
    assert_eq!(kv_keys(&mut c, "").await.len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_of_the_build_before_checks_and_restores() {
    let file = fixture("backup.csb").display().to_string();
    let (ok, out, err) = coordstore_cli(&["ctl", "snapshot", "status", &file]).await;
    assert!(ok, "{err}");
    let header: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(header["state_digest"], DIGEST);

    let root = tempfile::tempdir().unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let data = root.path().join("node1").display().to_string();
    let (ok, _, err) = coordstore_cli(&[
        "restore",
        &file,
        "--data-dir",
        &data,
        "--node-id",
        "1",
        "--cluster",
        &format!("1={addr}"),
        "--cluster-id",
        "restored",
    ])
    .await;
    assert!(ok, "{err}");
    let cluster = Cluster::start_at_on(
        std::slice::from_ref(&addr),
        &["--tasks", "2", "--cluster-id", "restored"],
        root.path(),
    );
    digest(&addr).await;
    holds_the_old_state_and_its_level(&addr).await;
    holds_the_old_state(&addr).await;
    drop(cluster);
}
