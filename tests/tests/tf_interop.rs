//! Stock TensorFlow 2.21 tasks (tensorflow-cpu 2.21.0, separate processes)
//! with coordstore as their coordination service leader, on one node and on
//! a follower of three: every task's devices, KV, a reused barrier id,
//! GetTaskState, error propagation (pushed with ReportErrorToTask, or through
//! heartbeats without the tasks' addresses) with the healthy task left
//! CONNECTED, and a MultiWorkerMirroredStrategy training step with the
//! service listed as job `ps`. Needs the venv made by `scripts/setup-tf.sh`
//! (scripts/test.sh runs it).

use std::time::Duration;

use coordstore_tests::jax::{tf_python, PyProc};
use coordstore_tests::{free_port, journal_state, Cluster};
use journal::coordination::TaskStatus;

const WAIT: Duration = Duration::from_secs(60);
const RUN: Duration = Duration::from_secs(200);

/// Two TF workers' addresses (free ports for their own gRPC servers).
fn worker_addrs() -> Vec<String> {
    (0..2)
        .map(|_| format!("127.0.0.1:{}", free_port()))
        .collect()
}

fn spawn(
    cluster: &Cluster,
    service: &str,
    workers: &[String],
    task: usize,
    extra: &[&str],
) -> PyProc {
    let mut args: Vec<String> = [
        "--service",
        service,
        "--workers",
        &workers.join(","),
        "--task",
        &task.to_string(),
        "--deadline",
        "180",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(extra.iter().map(|s| s.to_string()));
    PyProc::spawn_with(&tf_python(), "tf_task.py", &args, cluster.dir.path(), &[])
}

/// Waits for every process and requires each check to have passed; a
/// failure reports every process, not only the first that failed.
fn all_pass(cluster: &Cluster, procs: &mut [PyProc]) {
    let mut failed = false;
    for p in procs.iter_mut() {
        let status = p.wait_exit(RUN);
        let summary_ok = p
            .lines()
            .iter()
            .any(|l| l.contains("\"check\": \"summary\", \"ok\": true"));
        failed |= !(status.success() && p.failed_checks().is_empty() && summary_ok);
    }
    if failed {
        let reports: Vec<String> = procs.iter().map(PyProc::report).collect();
        panic!(
            "a TensorFlow task failed\n{}\n{}",
            reports.join("\n"),
            cluster.logs()
        );
    }
}

/// The node TF tasks dial: the only one, or a follower of three.
fn service_addr(cluster: &Cluster, rt: &tokio::runtime::Runtime) -> String {
    if cluster.nodes.len() == 1 {
        return cluster.nodes[0].addr.clone();
    }
    let leader = rt.block_on(cluster.wait_leader(&[0, 1, 2], WAIT));
    cluster.nodes[(leader + 1) % 3].addr.clone()
}

fn ops(nodes: usize) {
    let cluster = Cluster::start(nodes, &["--job", "worker=2"]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let service = service_addr(&cluster, &rt);
    let workers = worker_addrs();
    let mut procs: Vec<PyProc> = (0..2)
        .map(|k| spawn(&cluster, &service, &workers, k, &["--scenario", "ops"]))
        .collect();
    all_pass(&cluster, &mut procs);
    // The tasks were coordstore's: both registered with it.
    let s = rt.block_on(journal_state(&service));
    for t in 0..2 {
        assert_eq!(
            s.coordination().task_status(t),
            Some(TaskStatus::Connected),
            "task {t}"
        );
        assert_ne!(s.coordination().task(t).unwrap().incarnation, 0);
    }
}

#[test]
fn tensorflow_tasks_against_one_node() {
    ops(1);
}

#[test]
fn tensorflow_tasks_against_a_follower_of_three() {
    ops(3);
}

/// Task 0 reports an error; task 1's agent must enter ERROR while the
/// service keeps task 1 CONNECTED. `push`: the nodes know the tasks'
/// addresses and the TF agents heartbeat only every 300 s, so only the
/// leader's ReportErrorToTask can tell task 1 in time. Otherwise the TF
/// agents heartbeat every 2 s and the heartbeat reply carries the error.
fn error_reaches_the_healthy_task(nodes: usize, push: bool) {
    let workers = worker_addrs();
    let spec = format!(r#"{{"worker": ["{}", "{}"]}}"#, workers[0], workers[1]);
    let mut flags = vec!["--job", "worker=2", "--heartbeat-timeout-ms"];
    let tf_heartbeat = if push {
        flags.extend(["600000", "--tf-cluster-spec", &spec]);
        "600000"
    } else {
        flags.push("4000");
        "4000"
    };
    let cluster = Cluster::start(nodes, &flags);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let service = service_addr(&cluster, &rt);
    let extra = [
        "--scenario",
        "error",
        "--heartbeat-timeout-ms",
        tf_heartbeat,
        "--learn-within-s",
        "30",
    ];
    let mut source = spawn(&cluster, &service, &workers, 0, &extra);
    let mut peer = spawn(&cluster, &service, &workers, 1, &extra);
    peer.wait_line("WAITING", WAIT);
    source.wait_line("REPORTED", WAIT);
    peer.send_line("go");
    peer.wait_line("LEARNED", WAIT);
    let s = rt.block_on(journal_state(&service));
    assert_eq!(s.coordination().task_status(0), Some(TaskStatus::Error));
    assert_eq!(
        s.coordination().task_status(1),
        Some(TaskStatus::Connected),
        "the healthy task stays CONNECTED"
    );
    assert!(s.coordination().task(1).unwrap().notice.is_some());
    source.send_line("done");
    all_pass(&cluster, &mut [source, peer]);
    if push {
        assert!(
            cluster.logs().contains("pushed the propagated error"),
            "{}",
            cluster.logs()
        );
    }
}

#[test]
fn a_reported_error_is_pushed_to_the_other_task_by_the_leader() {
    error_reaches_the_healthy_task(3, true);
}

#[test]
fn without_addresses_a_reported_error_reaches_the_other_task_by_heartbeat() {
    error_reaches_the_healthy_task(1, false);
}

/// A 2-worker MultiWorkerMirroredStrategy training step; TF_CONFIG lists
/// coordstore (a follower of three) as job `ps`, which MWMS picks as its
/// coordination leader by itself.
#[test]
fn a_multi_worker_mirrored_strategy_step_with_the_service_as_ps() {
    let cluster = Cluster::start(3, &["--job", "worker=2"]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let service = service_addr(&cluster, &rt);
    let workers = worker_addrs();
    let mut procs: Vec<PyProc> = (0..2)
        .map(|k| spawn(&cluster, &service, &workers, k, &["--scenario", "mwms"]))
        .collect();
    all_pass(&cluster, &mut procs);
    for p in &procs {
        let line = p
            .lines()
            .into_iter()
            .find(|l| l.contains("\"check\": \"mwms_step\""))
            .unwrap_or_default();
        assert!(line.contains("\"workers\": 2"), "{line}");
        // One all-reduced SGD step from w = 1 on x = 1..4: w = 2.5 on both.
        assert!(line.contains("\"w\": 2.5"), "{line}");
    }
    let s = rt.block_on(journal_state(&service));
    for t in 0..2 {
        assert_ne!(
            s.coordination().task(t).unwrap().incarnation,
            0,
            "task {t} registered"
        );
    }
}
