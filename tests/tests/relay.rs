//! The relay makes a node's death invisible to stock jaxlib clients: a
//! 2-process jaxlib job, each process through its own relay, keeps running
//! KV operations and barriers in lock-step while every coordstore node is
//! SIGKILLed and restarted in turn (a rolling restart, leader included). No
//! client process dies and every acknowledged write is read back at the end.

use std::time::Duration;

use coordstore_tests::jax::PyProc;
use coordstore_tests::wait::{holds, wait};
use coordstore_tests::{free_port, Cluster, NodeProc};

const WAIT: Duration = Duration::from_secs(60);

#[test]
fn a_jaxlib_job_through_relays_survives_a_rolling_restart() {
    let mut cluster = Cluster::start(3, &["--tasks", "2"]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(cluster.wait_leader(&[0, 1, 2], WAIT));
    let endpoints: Vec<String> = cluster.nodes.iter().map(|n| n.addr.clone()).collect();
    let relays: Vec<NodeProc> = (0..2)
        .map(|_| {
            let addr = format!("127.0.0.1:{}", free_port());
            NodeProc::relay(&addr, &endpoints, cluster.dir.path())
        })
        .collect();
    let seconds = 40;
    let mut clients: Vec<PyProc> = (0..2)
        .map(|t| {
            let acked = cluster.dir.path().join(format!("acked-{t}.txt"));
            PyProc::spawn(
                "jax_client.py",
                &[
                    "loop".to_string(),
                    "--address".into(),
                    relays[t].addr.clone(),
                    "--node-id".into(),
                    t.to_string(),
                    "--num-tasks".into(),
                    "2".into(),
                    "--seconds".into(),
                    seconds.to_string(),
                    "--pause-ms".into(),
                    "5".into(),
                    "--heartbeat-timeout".into(),
                    "4".into(),
                    "--acked".into(),
                    acked.display().to_string(),
                    "--deadline".into(),
                    "170".into(),
                ],
                cluster.dir.path(),
            )
        })
        .collect();
    // Let the job get going, then restart every node in turn; the job must
    // go on with the node down and again once it is back.
    progress(&cluster, 50, &clients);
    for i in 0..3 {
        cluster.kill(i);
        let others: Vec<usize> = (0..3).filter(|&j| j != i).collect();
        rt.block_on(cluster.wait_leader(&others, WAIT));
        progress(&cluster, 20, &clients);
        cluster.restart(i);
        rt.block_on(cluster.wait_leader(&[0, 1, 2], WAIT));
        rt.block_on(cluster.wait_converged(&[0, 1, 2], WAIT));
        progress(&cluster, 20, &clients);
    }
    for p in &mut clients {
        let status = p.wait_exit(Duration::from_secs(180));
        assert!(
            status.success() && p.failed_checks().is_empty(),
            "{status}\n{}\n{}",
            p.report(),
            cluster.logs()
        );
        let summary = p
            .lines()
            .into_iter()
            .find(|l| l.contains("\"check\": \"loop\""))
            .unwrap_or_default();
        assert!(summary.contains("\"ok\": true"), "{}", p.report());
    }
    for t in 0..2 {
        let acked = std::fs::read_to_string(cluster.dir.path().join(format!("acked-{t}.txt")))
            .unwrap_or_default();
        assert!(
            acked.lines().count() > 50,
            "task {t} acknowledged too little"
        );
    }
}

/// Acknowledged writes so far of client `t` (its --acked file).
fn acked(cluster: &Cluster, t: usize) -> usize {
    std::fs::read_to_string(cluster.dir.path().join(format!("acked-{t}.txt")))
        .map_or(0, |s| s.lines().count())
}

/// Waits until both clients have had `rounds` more writes acknowledged.
fn progress(cluster: &Cluster, rounds: usize, clients: &[PyProc]) {
    let start: Vec<usize> = (0..2).map(|t| acked(cluster, t)).collect();
    wait(
        format!("{rounds} more writes acknowledged by each client"),
        WAIT,
    )
    .context(|| {
        let reports: Vec<String> = clients.iter().map(PyProc::report).collect();
        format!("{}\n{}", reports.join("\n"), cluster.logs())
    })
    .until_blocking(|| {
        let now: Vec<usize> = (0..2).map(|t| acked(cluster, t)).collect();
        holds((0..2).all(|t| now[t] >= start[t] + rounds), || {
            format!("{now:?} acknowledged, from {start:?}")
        })
    });
}

/// TensorFlow tasks can dial a relay too: a `tensorflow` dialect client
/// registers, writes and waits through one while the node it relays to is
/// SIGKILLed; the calls after the kill are answered by the others.
#[test]
fn the_tensorflow_dialect_through_a_relay_survives_its_node() {
    use proto::tf::*;
    let mut cluster = Cluster::start(3, &["--job", "worker=1"]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(cluster.wait_leader(&[0, 1, 2], WAIT));
    let endpoints: Vec<String> = cluster.nodes.iter().map(|n| n.addr.clone()).collect();
    let relay = NodeProc::relay(
        &format!("127.0.0.1:{}", free_port()),
        &endpoints,
        cluster.dir.path(),
    );
    let me = || {
        Some(CoordinatedTask {
            job_name: "worker".into(),
            task_id: 0,
            recoverable: false,
        })
    };
    let mut c = rt.block_on(coordstore_tests::wire::tf(&relay.addr));
    rt.block_on(c.register_task(RegisterTaskRequest {
        incarnation: 7,
        source_task: me(),
    }))
    .expect("register through the relay");
    rt.block_on(c.insert_key_value(InsertKeyValueRequest {
        kv: Some(KeyValueEntry {
            key: "before".into(),
            value: "1".into(),
        }),
        allow_overwrite: false,
    }))
    .expect("insert");
    // The relay dials the first endpoint first.
    cluster.kill(0);
    let got = rt
        .block_on(c.get_key_value(GetKeyValueRequest {
            key: "before".into(),
        }))
        .expect("get after the kill")
        .into_inner();
    assert_eq!(got.kv.unwrap().value.as_ref(), b"1");
    let passed = rt
        .block_on(c.barrier(BarrierRequest {
            barrier_id: "after".into(),
            barrier_timeout_in_ms: 30_000,
            tasks: vec![],
            source_task: me(),
            counter: 0,
        }))
        .expect("barrier after the kill")
        .into_inner();
    assert_eq!(passed.counter, 0);
    rt.block_on(c.heartbeat(HeartbeatRequest {
        incarnation: 7,
        source_task: me(),
    }))
    .expect("heartbeat after the kill");
}

/// A stock jax.distributed job through `coordstore relay --namespace`: its
/// state lands in the namespace, none of it in the default one.
#[test]
fn a_jax_job_through_a_relay_runs_in_the_relays_namespace() {
    let cluster = Cluster::start(3, &["--tasks", "1"]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(cluster.wait_leader(&[0, 1, 2], WAIT));
    let endpoints = cluster.addrs();
    // Created by name on the main port: the relay needs no namespace port.
    rt.block_on(coordstore_tests::ns::create(
        &endpoints[0],
        "relayed",
        coordstore_tests::ns::tasks(2),
    ))
    .expect("create");
    let addr = format!("127.0.0.1:{}", free_port());
    let _relay = NodeProc::relay_with(
        &addr,
        &endpoints,
        &["--namespace".to_string(), "relayed".to_string()],
        cluster.dir.path(),
    );
    let mut procs: Vec<PyProc> = (0..2)
        .map(|k| {
            let args: Vec<String> = [
                "--coordinator",
                addr.as_str(),
                "--num-processes",
                "2",
                "--process-id",
                &k.to_string(),
                "--tag",
                "relayed:",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            PyProc::spawn("jax_job.py", &args, cluster.dir.path())
        })
        .collect();
    for p in &mut procs {
        p.assert_passes("jax_job", Duration::from_secs(180), || cluster.logs());
    }
    let s = rt.block_on(coordstore_tests::journal_state(&endpoints[1]));
    let relayed = s.namespace("relayed").expect("the namespace");
    assert!(relayed.coordination().stats().keys >= 2);
    assert_eq!(s.default_namespace().coordination().stats().keys, 0);
}
