use super::*;

fn opts() -> ServeOptions {
    ServeOptions::default()
}

#[test]
fn no_flags_is_a_single_local_node() {
    let c = opts().resolve().unwrap();
    assert_eq!(c.node_id, 1);
    assert_eq!(c.listen, "127.0.0.1:7470");
    assert_eq!(c.cluster.len(), 1);
    assert_eq!(c.data_dir, PathBuf::from("coordstore-data"));
    assert_eq!(c.coordination.jobs[0].name, "jax_worker");
}

#[test]
fn the_gray_failure_settings_have_defaults_a_file_and_flags() {
    let c = opts().resolve().unwrap();
    assert_eq!(c.raft.disk_reserve_bytes, 64 << 20);
    assert_eq!(c.raft.slow_fsync_ms, 1000);
    assert_eq!(c.forward_attempt_ms, 2000);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("c.toml");
    std::fs::write(&file, "disk_reserve_bytes = 0\nslow_fsync_ms = 250\n").unwrap();
    let mut o = opts();
    o.config = Some(file);
    o.forward_attempt_ms = Some(0);
    let c = o.resolve().unwrap();
    assert_eq!((c.raft.disk_reserve_bytes, c.raft.slow_fsync_ms), (0, 250));
    // A forward needs some time: at least 1 ms.
    assert_eq!(c.forward_attempt_ms, 1);
}

#[test]
fn flags_win_over_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("c.toml");
    std::fs::write(
        &file,
        "node_id = 2\ntasks = 8\ncluster = \"1=a:1,2=b:2\"\nheartbeat_timeout_ms = 5000\n",
    )
    .unwrap();
    let mut o = opts();
    o.config = Some(file);
    o.job.heartbeat_timeout_ms = Some(7000);
    let c = o.resolve().unwrap();
    assert_eq!(c.node_id, 2);
    assert_eq!(c.coordination.jobs[0].count, 8);
    assert_eq!(c.coordination.heartbeat_timeout_ms, 7000);
    assert_eq!(c.cluster.get(&1).map(String::as_str), Some("a:1"));
}

#[test]
fn unknown_file_keys_and_bad_clusters_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("c.toml");
    std::fs::write(&file, "no_such_key = 1\n").unwrap();
    let mut o = opts();
    o.config = Some(file);
    assert!(o.resolve().unwrap_err().contains("no_such_key"));
    let mut o = opts();
    o.cluster = Some("2=a:1".into());
    assert!(o.resolve().unwrap_err().contains("does not list this node"));
}

#[test]
fn raft_tuning_reaches_the_raft_settings() {
    assert_eq!(opts().resolve().unwrap().raft.max_inflight_batches, 2);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("c.toml");
    std::fs::write(
        &file,
        "max_inflight_batches = 8\nsnapshot_log_bytes = 0\nraft_threads = 1\n",
    )
    .unwrap();
    let mut o = opts();
    o.config = Some(file);
    let c = o.resolve().unwrap();
    assert_eq!(c.raft.max_inflight_batches, 8);
    assert_eq!(c.raft.snapshot_log_bytes, 0);
    assert_eq!(c.raft.raft_threads, 1);
    assert_eq!(opts().resolve().unwrap().raft.raft_threads, 0);
    // None in flight would never propose: at least one.
    let mut o = opts();
    o.raft.max_inflight_batches = Some(0);
    assert_eq!(o.resolve().unwrap().raft.max_inflight_batches, 1);
}

#[test]
fn worker_threads_follow_the_flag_over_the_file() {
    // 0: tokio's default, one per CPU.
    assert_eq!(opts().resolve().unwrap().worker_threads, 0);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("c.toml");
    std::fs::write(&file, "worker_threads = 4\n").unwrap();
    let mut o = opts();
    o.config = Some(file.clone());
    assert_eq!(o.resolve().unwrap().worker_threads, 4);
    let mut o = opts();
    o.config = Some(file);
    o.worker_threads = Some(2);
    assert_eq!(o.resolve().unwrap().worker_threads, 2);
}

#[test]
fn jobs_are_named() {
    let mut o = opts();
    o.job.job = vec!["worker=2".into(), "ps=1".into()];
    let c = o.resolve().unwrap();
    let names: Vec<_> = c
        .coordination
        .jobs
        .iter()
        .map(|j| j.name.as_str())
        .collect();
    assert_eq!(names, ["worker", "ps"]);
    assert!(c.coordination.notify_tasks, "TensorFlow jobs get notices");
    assert!(!opts().resolve().unwrap().coordination.notify_tasks);
}

#[test]
fn tf_cluster_spec_from_a_cluster_spec_or_a_tf_config() {
    let mut o = opts();
    o.job.job = vec!["worker=2".into()];
    o.job.tf_cluster_spec =
        Some(r#"{"worker": ["127.0.0.1:1", "127.0.0.1:2"], "ps": ["127.0.0.1:9"]}"#.into());
    let c = o.resolve().unwrap();
    assert_eq!(c.tf_addresses["worker"], ["127.0.0.1:1", "127.0.0.1:2"]);

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tf_config.json");
    std::fs::write(
        &file,
        r#"{"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 0}}"#,
    )
    .unwrap();
    let mut o = opts();
    o.job.job = vec!["worker=2".into()];
    o.job.tf_cluster_spec = Some(format!("@{}", file.display()));
    assert_eq!(o.resolve().unwrap().tf_addresses["worker"], ["a:1", "b:2"]);

    // Too few addresses, not JSON, no --job: clear errors.
    let mut o = opts();
    o.job.job = vec!["worker=3".into()];
    o.job.tf_cluster_spec = Some(r#"{"worker": ["a:1"]}"#.into());
    assert!(o
        .resolve()
        .unwrap_err()
        .contains("1 address(es) for job worker"));
    let mut o = opts();
    o.job.job = vec!["worker=1".into()];
    o.job.tf_cluster_spec = Some("worker=a:1".into());
    assert!(o.resolve().unwrap_err().contains("not JSON"));
    let mut o = opts();
    o.job.tf_cluster_spec = Some(r#"{"worker": ["a:1"]}"#.into());
    assert!(o.resolve().unwrap_err().contains("--job"));
}
