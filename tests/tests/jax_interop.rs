//! Stock jaxlib 0.12.0.1 against real `coordstore` processes: every client
//! method against one node and against a follower of three, a real
//! `jax.distributed` job of two CPU processes, and jaxlib clients that wait
//! on a follower while the leader is SIGKILLed. Needs the venv made by
//! `scripts/setup-jax.sh` (scripts/test.sh runs it).

use std::time::Duration;

use coordstore_tests::jax::PyProc;
use coordstore_tests::Cluster;

const WAIT: Duration = Duration::from_secs(60);
const RUN: Duration = Duration::from_secs(180);

fn client_args(sub: &str, addr: &str, task: usize, tasks: usize, extra: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = [
        sub,
        "--address",
        addr,
        "--node-id",
        &task.to_string(),
        "--num-tasks",
        &tasks.to_string(),
        "--deadline",
        "150",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}

/// Runs `ops` on N tasks against `addr`; every check must pass.
fn all_ops_pass(cluster: &Cluster, addr: &str, tasks: usize) {
    let mut procs: Vec<PyProc> = (0..tasks)
        .map(|t| {
            PyProc::spawn(
                "jax_client.py",
                &client_args("ops", addr, t, tasks, &[]),
                cluster.dir.path(),
            )
        })
        .collect();
    for p in &mut procs {
        let status = p.wait_exit(RUN);
        assert!(
            status.success() && p.failed_checks().is_empty(),
            "{status}: {:?}\n{}\n{}",
            p.failed_checks(),
            p.report(),
            cluster.logs()
        );
        assert!(
            p.lines()
                .iter()
                .any(|l| l.contains("\"check\": \"summary\", \"ok\": true")),
            "{}",
            p.report()
        );
    }
}

#[test]
fn every_client_method_against_one_node() {
    let cluster = Cluster::start(1, &["--tasks", "2"]);
    let addr = cluster.nodes[0].addr.clone();
    all_ops_pass(&cluster, &addr, 2);
}

#[test]
fn every_client_method_against_a_follower_of_three() {
    let cluster = Cluster::start(3, &["--tasks", "2"]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let leader = rt.block_on(cluster.wait_leader(&[0, 1, 2], WAIT));
    let addr = cluster.nodes[(leader + 1) % 3].addr.clone();
    all_ops_pass(&cluster, &addr, 2);
}

#[test]
fn a_jax_distributed_job_of_two_processes() {
    let cluster = Cluster::start(1, &["--tasks", "2"]);
    let addr = cluster.nodes[0].addr.clone();
    let mut procs: Vec<PyProc> = (0..2)
        .map(|k| {
            PyProc::spawn(
                "jax_job.py",
                &[
                    "--coordinator".to_string(),
                    addr.clone(),
                    "--num-processes".into(),
                    "2".into(),
                    "--process-id".into(),
                    k.to_string(),
                ],
                cluster.dir.path(),
            )
        })
        .collect();
    for p in &mut procs {
        let status = p.wait_exit(RUN);
        assert!(
            status.success(),
            "{status}\n{}\n{}",
            p.report(),
            cluster.logs()
        );
        let line = p
            .lines()
            .into_iter()
            .find(|l| l.contains("\"check\": \"jax_job\""))
            .unwrap_or_default();
        assert!(line.contains("\"ok\": true"), "{}", p.report());
        assert!(line.contains("\"process_count\": 2"), "{line}");
        assert!(
            line.contains("\"kv_values\": [\"process-0\", \"process-1\"]"),
            "{line}"
        );
    }
}

#[test]
fn jaxlib_clients_waiting_on_a_follower_survive_a_leader_kill() {
    let mut cluster = Cluster::start(3, &["--tasks", "3"]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let leader = rt.block_on(cluster.wait_leader(&[0, 1, 2], WAIT));
    let follower = (leader + 1) % 3;
    let addr = cluster.nodes[follower].addr.clone();
    // Heartbeats every second: a failed one aborts the jaxlib process.
    let common = ["--heartbeat-timeout", "2", "--namespace", "failover"];
    let spawn = |task: usize, extra: &[&str]| {
        let mut args: Vec<&str> = common.to_vec();
        args.extend_from_slice(extra);
        PyProc::spawn(
            "jax_client.py",
            &client_args("hold", &addr, task, 3, &args),
            cluster.dir.path(),
        )
    };
    let mut waiter = spawn(
        0,
        &[
            "--action",
            "barrier",
            "--barrier-id",
            "B",
            "--process-ids",
            "0,2",
        ],
    );
    let mut getter = spawn(1, &["--action", "get", "--key", "K"]);
    let mut setter = spawn(
        2,
        &[
            "--wait-stdin",
            "--action",
            "set",
            "--action",
            "barrier",
            "--key",
            "K",
            "--value",
            "V",
            "--barrier-id",
            "B",
            "--process-ids",
            "0,2",
        ],
    );
    for p in [&mut waiter, &mut getter, &mut setter] {
        p.wait_line("READY", WAIT);
    }
    cluster.kill(leader);
    let others: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    rt.block_on(cluster.wait_leader(&others, WAIT));
    // Several heartbeat intervals pass with the new leader in charge.
    std::thread::sleep(Duration::from_secs(3));
    setter.send_line("go");
    for p in [&mut waiter, &mut getter, &mut setter] {
        let status = p.wait_exit(RUN);
        assert!(
            status.success() && p.failed_checks().is_empty(),
            "{status}\n{}\n{}",
            p.report(),
            cluster.logs()
        );
    }
    let got = getter
        .lines()
        .into_iter()
        .find(|l| l.contains("hold_get"))
        .unwrap_or_default();
    assert!(got.contains("\"value\": \"V\""), "{}", getter.report());
}
