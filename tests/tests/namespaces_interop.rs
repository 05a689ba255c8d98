//! Stock clients in namespaces of one 3-node cluster, all at once: two
//! `jax.distributed` jobs (stock jaxlib 0.12) dialing followers by their
//! namespaces' ports with the same key names and barrier ids, the leader
//! SIGKILLed while both wait at a barrier; a stock TensorFlow 2.21
//! two-worker job in a third namespace; a stock tf.data job (two workers and
//! a `distribute()` client, DYNAMIC sharding) in a fourth. Then the first
//! is reset and the second deleted while the TensorFlow and tf.data jobs,
//! held mid-job, go on unchanged. Needs the venvs made by
//! `scripts/setup-jax.sh` and `scripts/setup-tf.sh` (scripts/test.sh runs
//! them).

use std::time::Duration;

use coordstore_tests::jax::{tf_python, PyProc};
use coordstore_tests::{free_port, free_port_range, node_host, ns, Cluster};
use proto::coordstore::{JobCount, NamespaceInfo, NamespaceSettings};

const WAIT: Duration = Duration::from_secs(90);
const RUN: Duration = Duration::from_secs(240);

/// One process of a jax.distributed job of two at `coordinator`, writing
/// values tagged `tag`, held at its first barrier.
fn jax_process(cluster: &Cluster, coordinator: &str, k: usize, tag: &str) -> PyProc {
    let args: Vec<String> = [
        "--coordinator",
        coordinator,
        "--num-processes",
        "2",
        "--process-id",
        &k.to_string(),
        "--tag",
        tag,
        "--hold-at-barrier",
        "--timeout-ms",
        "90000",
        "--deadline",
        "220",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    PyProc::spawn("jax_job.py", &args, cluster.dir.path())
}

fn tf_process(cluster: &Cluster, args: &[&str]) -> PyProc {
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    PyProc::spawn_with(
        &tf_python(),
        args[0].as_str(),
        &args[1..],
        cluster.dir.path(),
        &[],
    )
}

/// Waits for `p` to exit 0 with no failed check; `last` is a line its
/// output must hold.
fn passes(p: &mut PyProc, cluster: &Cluster, last: &str) {
    let status = p.wait_exit(RUN);
    assert!(
        status.success() && p.failed_checks().is_empty(),
        "{status}\n{}\n{}",
        p.report(),
        cluster.logs()
    );
    assert!(
        p.lines().iter().any(|l| l.contains(last)),
        "no {last:?}\n{}",
        p.report()
    );
}

/// What a reset or a delete elsewhere must not change of a namespace.
fn unchanged_part(n: &NamespaceInfo) -> (u64, u64, u64, u64, u64, u64, u64) {
    (
        n.epoch,
        n.service_incarnation,
        n.tasks_connected,
        n.tasks_error,
        n.keys,
        n.tfdata_jobs,
        n.tfdata_workers,
    )
}

#[test]
fn four_stock_jobs_in_four_namespaces_of_one_cluster() {
    let hosts: Vec<String> = (0..3).map(node_host).collect();
    let host_refs: Vec<&str> = hosts.iter().map(String::as_str).collect();
    let (low, high) = free_port_range(&host_refs, 4);
    let range = format!("{low}-{high}");
    let mut cluster = Cluster::start_hosts(3, &["--tasks", "1", "--namespace-ports", &range]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let leader = rt.block_on(cluster.wait_leader(&[0, 1, 2], WAIT));
    let (f1, f2) = ((leader + 1) % 3, (leader + 2) % 3);
    let addrs = cluster.addrs();
    let on = |i: usize| addrs[i].clone();
    let create = |at: usize, name: &str, s: NamespaceSettings| {
        rt.block_on(ns::create(&on(at), name, s))
            .unwrap_or_else(|e| panic!("create {name}: {e:?}"))
    };
    let a = create(f1, "jax-a", ns::tasks(2));
    let b = create(f2, "jax-b", ns::tasks(2));
    let tf_workers = NamespaceSettings {
        jobs: vec![JobCount {
            name: "worker".into(),
            count: 2,
        }],
        ..Default::default()
    };
    let c = create(leader, "tf-c", tf_workers);
    let d = create(f1, "tfdata-d", ns::tasks(1));
    for n in ["jax-a", "jax-b", "tf-c", "tfdata-d"] {
        rt.block_on(ns::wait_serving(&cluster, n, WAIT));
    }

    // D: a tf.data job on a follower's port of namespace D.
    let dispatcher = ns::addr(&cluster, f2, &d);
    let mut workers: Vec<PyProc> = (0..2)
        .map(|_| {
            tf_process(
                &cluster,
                &["tfdata_job.py", "worker", "--dispatcher", &dispatcher],
            )
        })
        .collect();
    for w in &mut workers {
        w.wait_line("READY", WAIT);
    }
    let mut reader = tf_process(
        &cluster,
        &[
            "tfdata_job.py",
            "client",
            "--dispatcher",
            &dispatcher,
            "--scenario",
            "held",
            "--workers",
            "2",
            "--n",
            "60",
            "--deadline",
            "220",
        ],
    );
    // C: a TensorFlow job of two workers on a follower's port of C.
    let service = ns::addr(&cluster, f1, &c);
    let tf_addrs: Vec<String> = (0..2)
        .map(|_| format!("127.0.0.1:{}", free_port()))
        .collect();
    let tf_addrs = tf_addrs.join(",");
    let mut tf: Vec<PyProc> = (0..2)
        .map(|k| {
            tf_process(
                &cluster,
                &[
                    "tf_task.py",
                    "--service",
                    &service,
                    "--workers",
                    &tf_addrs,
                    "--task",
                    &k.to_string(),
                    "--scenario",
                    "ops",
                    "--hold",
                    "--deadline",
                    "220",
                ],
            )
        })
        .collect();
    // A and B: two jax jobs, each on a follower's port, the same keys and
    // barrier ids, values tagged by job.
    let (addr_a, addr_b) = (ns::addr(&cluster, f1, &a), ns::addr(&cluster, f2, &b));
    let mut jax: Vec<PyProc> = Vec::new();
    for (addr, tag) in [(&addr_a, "A:"), (&addr_b, "B:")] {
        for k in 0..2 {
            jax.push(jax_process(&cluster, addr, k, tag));
        }
    }
    for p in &mut jax {
        p.wait_line("AT_BARRIER", WAIT);
    }
    // Process 0 of each job waits at the barrier on its follower.
    rt.block_on(ns::wait_info(&cluster, f1, "jax-a", WAIT, |n| {
        n.parked_calls >= 1
    }));
    rt.block_on(ns::wait_info(&cluster, f2, "jax-b", WAIT, |n| {
        n.parked_calls >= 1
    }));
    cluster.kill(leader);
    let others = [f1, f2];
    rt.block_on(cluster.wait_leader(&others, WAIT));
    for k in [1, 3] {
        jax[k].send_line("go");
    }
    for (i, p) in jax.iter_mut().enumerate() {
        let tag = if i < 2 { "A:" } else { "B:" };
        let values = format!("\"kv_values\": [\"{tag}process-0\", \"{tag}process-1\"]");
        passes(p, &cluster, &values);
    }

    // C and D held mid-job; A reset and B deleted meanwhile.
    for p in &mut tf {
        p.wait_line("HOLDING", WAIT);
    }
    reader.wait_line("HALF", WAIT);
    let get = |at: usize, name: &str| rt.block_on(ns::get(&on(at), name)).unwrap();
    let (c_before, d_before) = (get(f1, "tf-c"), get(f1, "tfdata-d"));
    assert_eq!(c_before.tasks_connected, 2);
    assert_eq!(d_before.tfdata_workers, 2);
    let mut node = rt.block_on(cluster.client(f2, WAIT));
    let reset = proto::coordstore::ResetNamespaceRequest {
        name: "jax-a".into(),
        tasks: 0,
    };
    let a_now = rt
        .block_on(node.reset_namespace(reset))
        .unwrap()
        .into_inner();
    assert_eq!((a_now.keys, a_now.tasks_connected), (0, 0));
    rt.block_on(ns::delete(&on(f1), "jax-b")).unwrap();
    assert_eq!(unchanged_part(&get(f2, "tf-c")), unchanged_part(&c_before));
    assert_eq!(
        unchanged_part(&get(f2, "tfdata-d")),
        unchanged_part(&d_before)
    );
    for p in &mut tf {
        p.send_line("go");
    }
    reader.send_line("go");
    for p in &mut tf {
        passes(p, &cluster, "\"check\": \"summary\", \"ok\": true");
    }
    passes(
        &mut reader,
        &cluster,
        "\"check\": \"summary\", \"ok\": true",
    );
    assert_eq!(
        rt.block_on(ns::names(&on(f1))),
        ["default", "jax-a", "tf-c", "tfdata-d"]
    );
}
