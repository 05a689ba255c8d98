//! Stock jaxlib 0.12.0.1 against real `coordstore` processes: every client
//! method against one node and against a follower of three, a real
//! `jax.distributed` job of two CPU processes, and jaxlib clients that wait
//! on a follower while the leader is SIGKILLed. Needs the venv made by
//! `scripts/setup-jax.sh` (scripts/test.sh runs it).

use std::time::Duration;

use coordstore_tests::jax::PyProc;
use coordstore_tests::wait::{holds, wait};
use coordstore_tests::{free_port, http_get, metric_sample, Cluster};

const WAIT: Duration = Duration::from_secs(60);
const RUN: Duration = Duration::from_secs(180);
/// The xla Heartbeat calls a node answered OK (its metrics).
const HEARTBEATS_ANSWERED: &str = r#"coordstore_grpc_calls_total{code="Ok",method="/xla.coordination.CoordinationService/Heartbeat"}"#;

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
        exits_passing(p, cluster, "summary");
    }
}

/// Waits for `p` to exit cleanly with no failed check and its final check
/// `last` passed.
fn exits_passing(p: &mut PyProc, cluster: &Cluster, last: &str) {
    p.assert_passes(last, RUN, || cluster.logs());
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
    let metrics: Vec<String> = (0..3)
        .map(|_| format!("127.0.0.1:{}", free_port()))
        .collect();
    let mut cluster = Cluster::start_each(3, &["--tasks", "3"], |i| {
        vec!["--metrics-listen".into(), metrics[i].clone()]
    });
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
    // Several heartbeat intervals pass with the new leader in charge: the
    // follower the tasks dial answers three more heartbeats per task (a
    // heartbeat is answered only once a leader took it).
    let heartbeats = || {
        http_get(&metrics[follower], "/metrics")
            .and_then(|(_, text)| metric_sample(&text, HEARTBEATS_ANSWERED))
            .unwrap_or(0.0)
    };
    let at_failover = heartbeats();
    wait(
        "three heartbeats per task answered after the failover",
        WAIT,
    )
    .context(|| cluster.logs())
    .until_blocking(|| {
        let answered = heartbeats();
        holds(answered >= at_failover + 9.0, || {
            format!("{answered} answered, {at_failover} at the failover")
        })
    });
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

/// Liveness comes from the majority. A jaxlib task whose node is cut off from
/// the other two must not keep being told that all is well: once its node
/// stops vouching (it no longer knows a leader with a quorum), its
/// heartbeats wait for a leader, time out, and jaxlib ends the process,
/// while the majority marks the task unhealthy. A task on the majority
/// side is not disturbed, during the partition or after it heals (the job
/// is recoverable, so the lost task's error is not propagated to it).
#[test]
fn a_jaxlib_client_on_a_cut_off_node_learns_its_fate_from_the_majority() {
    use coordstore_tests::proxy::Links;
    let rt = tokio::runtime::Runtime::new().unwrap();
    let addrs: Vec<String> = (0..3)
        .map(|_| format!("127.0.0.1:{}", coordstore_tests::free_port()))
        .collect();
    let links = rt.block_on(Links::start(&addrs));
    let cluster = Cluster::start_at(
        &addrs,
        &[
            "--tasks",
            "2",
            "--recoverable",
            "true",
            "--heartbeat-timeout-ms",
            "4000",
        ],
        |i| links.peer_flags(i),
    );
    let leader = rt.block_on(cluster.wait_leader(&[0, 1, 2], WAIT));
    let (cut, majority) = ((leader + 1) % 3, (leader + 2) % 3);
    let common = ["--heartbeat-timeout", "4", "--namespace", "cutoff"];
    let spawn = |node: usize, task: usize, extra: &[&str]| {
        let mut args: Vec<&str> = common.to_vec();
        args.extend_from_slice(extra);
        PyProc::spawn(
            "jax_client.py",
            &client_args("alive", &cluster.nodes[node].addr, task, 2, &args),
            cluster.dir.path(),
        )
    };
    let mut lone = spawn(cut, 0, &["--seconds", "90"]);
    let mut kept = spawn(majority, 1, &["--seconds", "40", "--kv"]);
    lone.wait_line("READY", WAIT);
    kept.wait_line("READY", WAIT);
    let rounds = |p: &PyProc| {
        p.lines()
            .iter()
            .filter(|l| l.contains("\"alive_round\""))
            .count()
    };
    let cut_at = std::time::Instant::now();
    links.isolate(cut);
    let at_cut = rounds(&kept);
    // Heartbeat timeout 4 s: jaxlib heartbeats every 2 s with a 2 s
    // deadline and gives up 1 s after a failed one.
    let status = lone.wait_exit(Duration::from_secs(30));
    let took = cut_at.elapsed();
    assert!(
        !status.success(),
        "the cut-off task ended cleanly ({status}) instead of failing\n{}",
        lone.report()
    );
    assert!(
        rounds(&kept) > at_cut + 3,
        "the majority-side task stalled during the partition\n{}\n{}",
        kept.report(),
        cluster.logs()
    );
    links.heal();
    let at_heal = rounds(&kept);
    let status = kept.wait_exit(RUN);
    assert!(
        status.success() && kept.failed_checks().is_empty() && rounds(&kept) > at_heal,
        "{status}: the majority-side task was disturbed\n{}\n{}",
        kept.report(),
        cluster.logs()
    );
    eprintln!("the cut-off task ended {took:?} after the partition began");
}

/// A recoverable job passes a barrier id three times; task 0's process dies
/// without shutting down and a new one takes its place (its agent's counter
/// for the id is 0 again) and calls the id first, then task 1 calls it with
/// counter 3 (XLA's RecoverableClient_RestartsAndStartsBarrier). Both pass
/// together, then an all-task barrier and shutdown pass. Clients on a
/// follower of three.
#[test]
fn a_restarted_recoverable_task_rejoins_a_reused_barrier() {
    let cluster = Cluster::start(3, &["--tasks", "2", "--recoverable", "true"]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let leader = rt.block_on(cluster.wait_leader(&[0, 1, 2], WAIT));
    let addr = cluster.nodes[(leader + 1) % 3].addr.clone();
    let spawn = |task: usize, role: &str| {
        PyProc::spawn(
            "jax_client.py",
            &client_args(
                "rejoin",
                &addr,
                task,
                2,
                &["--role", role, "--namespace", "rejoin"],
            ),
            cluster.dir.path(),
        )
    };
    let mut first = spawn(0, "first");
    let mut peer = spawn(1, "peer");
    let status = first.wait_exit(RUN);
    assert!(status.success(), "{status}\n{}", first.report());
    peer.wait_line("PASSED", WAIT);

    // The restarted task calls first: wait until its call is parked at
    // instance 3 of the id, then let task 1 in.
    let mut again = spawn(0, "again");
    rt.block_on(coordstore_tests::wait_state(&addr, WAIT, |s| {
        s.coordination()
            .barrier("rejoin/b/rejoin")
            .is_some_and(|b| {
                b.counter == 3
                    && b.status() == journal::pb::coordination::BarrierStatus::Pending
                    && b.arrivals.contains_key(&0)
            })
    }));
    peer.send_line("go");
    for p in [&mut again, &mut peer] {
        exits_passing(p, &cluster, "rejoin");
    }
}
