//! Namespaces against real `coordstore` processes: the lifecycle through
//! `ctl ns` and the Node API; every bad input refused with its exact status
//! and nothing changed; two namespaces that never meet (keys, barriers,
//! task ids, watches, errors, reset, heartbeat timeout, shutdown); quotas;
//! a deleted namespace's parked calls ended at once and nothing of it left;
//! every node serving every namespace port, also after a restart and while
//! another process holds the port on one node; the TTL; export and import.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent::{Agent, AgentConfig};
use bytes::Bytes;
use coordstore_tests::wait::{eventually, holds};
use coordstore_tests::wire::{self, inc};
use coordstore_tests::{coordstore_cli, free_port_range, journal_state, ns, try_status, Cluster};
use proto::coordstore::{JobCount, NamespaceInfo, NamespaceSettings};
use proto::xla::*;
use tonic::{Code, Status};

const WAIT: Duration = Duration::from_secs(60);

type Client = coordination_service_client::CoordinationServiceClient<tonic::transport::Channel>;

/// A one-node cluster whose namespaces get ports from a range of `n`.
fn one_node(n: u16, extra: &[&str]) -> Cluster {
    let (low, high) = free_port_range(&["127.0.0.1"], n);
    let range = format!("{low}-{high}");
    let mut flags = vec!["--tasks", "1", "--namespace-ports", &range];
    flags.extend_from_slice(extra);
    Cluster::start(1, &flags)
}

/// The address of namespace `info` on the only node of `cluster`.
fn port(cluster: &Cluster, info: &NamespaceInfo) -> String {
    ns::addr(cluster, 0, info)
}

/// Registers tasks 0..n at `addr` at once (the registration barrier needs
/// all); returns the service incarnation.
async fn register_all(addr: &str, n: i32) -> u64 {
    let joins: Vec<_> = (0..n)
        .map(|t| {
            let addr = addr.to_string();
            tokio::spawn(async move {
                let mut c = wire::xla(&addr).await;
                let req = RegisterTaskRequest {
                    incarnation: 1000 + t as u64,
                    source_task_id: t,
                };
                c.register_task(req)
                    .await
                    .map(|r| r.into_inner().service_incarnation)
            })
        })
        .collect();
    let mut incarnations = Vec::new();
    for j in joins {
        incarnations.push(j.await.unwrap().expect("register"));
    }
    assert!(incarnations.windows(2).all(|w| w[0] == w[1]));
    incarnations[0]
}

async fn set(c: &mut Client, si: u64, task: i32, key: &str, value: &str) -> Result<(), Status> {
    c.insert_key_value(InsertKeyValueRequest {
        incarnations: inc(task, si),
        kv: Some(KeyValueEntry {
            key: key.into(),
            value: value.as_bytes().to_vec().into(),
        }),
        allow_overwrite: true,
    })
    .await
    .map(|_| ())
}

async fn try_get(c: &mut Client, si: u64, key: &str) -> Result<String, Status> {
    let r = c
        .try_get_key_value(TryGetKeyValueRequest {
            incarnations: inc(0, si),
            key: key.into(),
        })
        .await?;
    let kv = r.into_inner().kv.unwrap_or_default();
    Ok(String::from_utf8_lossy(&kv.value).into_owned())
}

fn barrier(si: u64, task: i32, id: &str, tasks: &[i32]) -> BarrierRequest {
    BarrierRequest {
        incarnations: inc(task, si),
        barrier_id: id.into(),
        barrier_timeout_in_ms: 60_000,
        task_ids: tasks.to_vec(),
        source_task_id: task,
        counter: 0,
    }
}

/// A call of `what` that must have ended with `code` and a message naming
/// every one of `names`.
fn refused<T: std::fmt::Debug>(what: &str, r: Result<T, Status>, code: Code, names: &[&str]) {
    let e = r.expect_err(what);
    assert_eq!(e.code(), code, "{what}: {e:?}");
    for n in names {
        assert!(
            e.message().contains(n),
            "{what}: {:?} does not name {n}",
            e.message()
        );
    }
}

/// The node's state digest and the namespaces' names: what a refused call
/// must leave as they were.
async fn fingerprint(addr: &str) -> (String, Vec<String>) {
    let digest = try_status(addr).await.expect("status").state_digest;
    (digest, ns::names(addr).await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lifecycle_through_ctl() {
    let cluster = one_node(4, &[]);
    let addr = cluster.nodes[0].addr.clone();
    cluster.wait_leader(&[0], WAIT).await;
    let ctl = |args: &[&str]| {
        let mut all = vec!["ctl", "--endpoint", &addr, "ns"];
        all.extend_from_slice(args);
        all.iter().map(|s| s.to_string()).collect::<Vec<_>>()
    };
    let run = |args: Vec<String>| async move {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (ok, out, err) = coordstore_cli(&args).await;
        assert!(ok, "coordstore {args:?}: {err}");
        serde_json::from_str::<serde_json::Value>(&out).expect("one JSON value")
    };
    let created = run(ctl(&[
        "create",
        "train-1",
        "--tasks",
        "2",
        "--max-keys",
        "100",
    ]))
    .await;
    assert_eq!(created["name"], "train-1");
    let port = created["port"].as_u64().expect("a port");
    assert!(port > 0);
    let tf = run(ctl(&[
        "create", "tf-job", "--job", "worker=2", "--job", "chief=1",
    ]))
    .await;
    assert_eq!(tf["port"].as_u64(), Some(port + 1), "the lowest free port");

    let listed = run(ctl(&["ls"])).await;
    let names: Vec<&str> = listed
        .as_array()
        .expect("a list")
        .iter()
        .map(|n| n["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["default", "tf-job", "train-1"]);

    // A job runs in it: two tasks register on its port.
    let info = ns::get(&addr, "train-1").await.unwrap();
    let si = register_all(&format!("127.0.0.1:{port}"), 2).await;
    let mut c = wire::xla(&format!("127.0.0.1:{port}")).await;
    set(&mut c, si, 0, "k", "v").await.unwrap();
    let got = run(ctl(&["get", "train-1"])).await;
    assert_eq!(got["tasks"]["connected"], 2);
    assert_eq!(got["keys"], 1);
    assert_eq!(got["bytes"], 2);
    assert_eq!(got["spec"]["tasks"], 2);
    assert_eq!(got["spec"]["max_keys"], 100);
    assert_eq!(
        got["spec"]["heartbeat_timeout_ms"], 100_000,
        "today's default"
    );
    assert_eq!(got["barriers_pending"], 0);
    assert_eq!(got["listener"], "serving");
    assert_eq!(
        got["service_incarnation"].as_u64(),
        Some(info.service_incarnation)
    );
    let tf = run(ctl(&["get", "tf-job"])).await;
    assert_eq!(tf["spec"]["jobs"][0]["name"], "worker");
    assert_eq!(tf["tasks"]["disconnected"], 3);

    // The kv verbs by name on the main port.
    let (ok, out, err) = coordstore_cli(&[
        "ctl",
        "--endpoint",
        &addr,
        "--namespace",
        "train-1",
        "kv",
        "get",
        "k",
    ])
    .await;
    assert!(ok && out.contains('v'), "{out}{err}");
    let (ok, _, err) = coordstore_cli(&[
        "ctl",
        "--endpoint",
        &addr,
        "--namespace",
        "nope",
        "kv",
        "get",
        "k",
    ])
    .await;
    assert!(!ok && err.contains("nope"), "{err}");

    // Reset: a new epoch and incarnation, three tasks, the keys gone.
    let reset = run(ctl(&["reset", "train-1", "--tasks", "3"])).await;
    assert_ne!(
        reset["service_incarnation"].as_u64(),
        Some(info.service_incarnation)
    );
    assert_eq!(reset["spec"]["tasks"], 3);
    assert_eq!(reset["keys"], 0);
    assert_eq!(reset["tasks"]["disconnected"], 3);

    let deleted = run(ctl(&["delete", "train-1"])).await;
    assert_eq!(deleted["name"], "train-1");
    let (ok, _, err) = coordstore_cli(
        &ctl(&["get", "train-1"])
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    )
    .await;
    assert!(
        !ok && err.contains("train-1") && err.contains("does not exist"),
        "{err}"
    );
    assert_eq!(ns::names(&addr).await, ["default", "tf-job"]);
    let status = try_status(&addr).await.unwrap();
    assert_eq!(status.namespaces, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_its_exact_status_and_changes_nothing() {
    let cluster = one_node(4, &["--max-namespaces", "4"]);
    let addr = cluster.nodes[0].addr.clone();
    // The first leader's InitService (default namespace) lands first: the
    // fingerprints below must see no entry land.
    coordstore_tests::wait_state(&addr, WAIT, |s| s.is_initialized()).await;
    let first = ns::create(&addr, "a", ns::tasks(1)).await.unwrap();
    let (low, high) = (first.port, first.port + 3);
    let before = fingerprint(&addr).await;
    let with = |f: fn(&mut NamespaceSettings)| {
        let mut s = ns::tasks(1);
        f(&mut s);
        s
    };
    let cases: Vec<(&str, NamespaceSettings, Code, Vec<String>)> = vec![
        (
            "Bad_Name",
            ns::tasks(1),
            Code::InvalidArgument,
            vec!["Bad_Name".into()],
        ),
        (
            "-x",
            ns::tasks(1),
            Code::InvalidArgument,
            vec!["DNS label".into()],
        ),
        (
            "a",
            ns::tasks(1),
            Code::AlreadyExists,
            vec!["a already exists".into()],
        ),
        (
            "b",
            ns::tasks(0),
            Code::InvalidArgument,
            vec!["b".into(), "at least one task".into()],
        ),
        (
            "b",
            NamespaceSettings {
                port: low,
                ..ns::tasks(1)
            },
            Code::AlreadyExists,
            vec![low.to_string(), "namespace a".into()],
        ),
        (
            "b",
            NamespaceSettings {
                port: high + 1,
                ..ns::tasks(1)
            },
            Code::InvalidArgument,
            vec![(high + 1).to_string(), format!("{low}-{high}")],
        ),
        (
            "b",
            with(|s| s.max_keys = Some(0)),
            Code::InvalidArgument,
            vec!["--max-keys 0".into()],
        ),
        (
            "b",
            with(|s| s.max_bytes = Some(0)),
            Code::InvalidArgument,
            vec!["--max-bytes 0".into()],
        ),
        (
            "b",
            with(|s| s.max_parked_calls = Some(0)),
            Code::InvalidArgument,
            vec!["--max-parked-calls 0".into()],
        ),
        (
            "b",
            with(|s| s.ttl_ms = Some(0)),
            Code::InvalidArgument,
            vec!["--ttl-ms 0".into()],
        ),
        (
            "b",
            NamespaceSettings {
                jobs: vec![
                    JobCount {
                        name: "worker".into(),
                        count: 1,
                    },
                    JobCount {
                        name: "worker".into(),
                        count: 2,
                    },
                ],
                ..Default::default()
            },
            Code::InvalidArgument,
            vec!["worker".into()],
        ),
        (
            "b",
            with(|s| s.tf_cluster_spec = "not json".into()),
            Code::InvalidArgument,
            vec!["--tf-cluster-spec".into()],
        ),
    ];
    for (name, settings, code, names) in cases {
        let what = format!("create {name} {settings:?}");
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        refused(&what, ns::create(&addr, name, settings).await, code, &names);
        assert_eq!(fingerprint(&addr).await, before, "{what} changed something");
    }

    // A port of the range another process holds on the leader: refused
    // before anything is proposed.
    let held = std::net::TcpListener::bind(("127.0.0.1", (low + 1) as u16)).unwrap();
    let asked = NamespaceSettings {
        port: low + 1,
        ..ns::tasks(1)
    };
    let r = ns::create(&addr, "b", asked.clone()).await;
    refused(
        "a held port",
        r,
        Code::FailedPrecondition,
        &[&(low + 1).to_string(), "another process"],
    );
    assert_eq!(fingerprint(&addr).await, before);
    drop(held);
    ns::create(&addr, "b", asked)
        .await
        .expect("the port is free now");

    // Unknown names; the default namespace is kept.
    refused(
        "get",
        ns::get(&addr, "nope").await,
        Code::NotFound,
        &["nope"],
    );
    refused(
        "delete",
        ns::delete(&addr, "nope").await,
        Code::NotFound,
        &["nope"],
    );
    refused(
        "delete default",
        ns::delete(&addr, "default").await,
        Code::FailedPrecondition,
        &["default"],
    );
    let mut agent_cfg = AgentConfig::new(vec![addr.clone()], "jax_worker", 0);
    agent_cfg.namespace = Some("nope".into());
    agent_cfg.retry_for = Duration::from_secs(5);
    let a = Agent::new(agent_cfg, Arc::new(|_: &Status| {})).unwrap();
    refused(
        "an agent in an unknown namespace",
        a.connect().await,
        Code::NotFound,
        &["nope"],
    );

    // The bound on namespaces: default, a, b, c; a fifth is refused.
    ns::create(&addr, "c", ns::tasks(1)).await.unwrap();
    let before = fingerprint(&addr).await;
    let r = ns::create(&addr, "d", ns::tasks(1)).await;
    refused(
        "a fifth namespace",
        r,
        Code::ResourceExhausted,
        &["4 namespaces"],
    );
    assert_eq!(fingerprint(&addr).await, before);
}

/// Two namespaces with the same key names, barrier ids and task ids.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_namespaces_never_meet() {
    let cluster = one_node(4, &[]);
    let addr = cluster.nodes[0].addr.clone();
    let short = NamespaceSettings {
        heartbeat_timeout_ms: Some(1_500),
        ..ns::tasks(2)
    };
    let a = ns::create(&addr, "a", short.clone()).await.unwrap();
    let b = ns::create(&addr, "b", short).await.unwrap();
    let (pa, pb) = (port(&cluster, &a), port(&cluster, &b));
    let (sa, sb) = (register_all(&pa, 2).await, register_all(&pb, 2).await);
    assert_ne!(sa, sb, "each namespace has its own service incarnation");
    let (mut ca, mut cb) = (wire::xla(&pa).await, wire::xla(&pb).await);
    // B's tasks heartbeat throughout; A's stop after the first checks.
    let beating = tokio::spawn({
        let pb = pb.clone();
        async move {
            let mut c = wire::xla(&pb).await;
            loop {
                for t in 0..2 {
                    let hb = HeartbeatRequest {
                        incarnations: inc(t, sb),
                        incarnation: 1000 + t as u64,
                        source_task_id: t,
                    };
                    if let Err(e) = c.heartbeat(hb).await {
                        return e;
                    }
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    });

    // The same key, each namespace its own value.
    set(&mut ca, sa, 0, "k", "from-a").await.unwrap();
    set(&mut cb, sb, 0, "k", "from-b").await.unwrap();
    assert_eq!(try_get(&mut ca, sa, "k").await.unwrap(), "from-a");
    assert_eq!(try_get(&mut cb, sb, "k").await.unwrap(), "from-b");
    // A's incarnation is not B's: a task of A cannot write into B.
    let e = set(&mut cb, sa, 0, "k", "x").await.unwrap_err();
    assert_eq!(e.code(), Code::Internal, "{e:?}");

    // The same barrier id: A's task 0 waits alone while B's passes.
    let waiting = tokio::spawn({
        let mut c = ca.clone();
        async move { c.barrier(barrier(sa, 0, "B", &[0, 1])).await }
    });
    ns::wait_info(&cluster, 0, "a", WAIT, |n| n.barriers_pending == 1).await;
    let (mut c0, mut c1) = (cb.clone(), cb.clone());
    let (r0, r1) = tokio::join!(
        c0.barrier(barrier(sb, 0, "B", &[0, 1])),
        c1.barrier(barrier(sb, 1, "B", &[0, 1]))
    );
    r0.unwrap();
    r1.unwrap();
    let info = ns::get(&addr, "a").await.unwrap();
    assert_eq!(info.barriers_pending, 1, "B's barrier did not release A's");
    assert!(!waiting.is_finished());

    // A watch in B sees nothing of A: it sees B's one write, and first.
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let mut cfg = AgentConfig::new(vec![addr.clone()], "jax_worker", 1);
    cfg.namespace = Some("b".into());
    let watcher = Agent::new(cfg, Arc::new(|_: &Status| {})).unwrap();
    let sink = seen.clone();
    watcher
        .start_watch_key(
            "w",
            Arc::new(move |changes: &BTreeMap<String, Option<Bytes>>| {
                sink.lock().unwrap().extend(changes.keys().cloned());
            }),
        )
        .await
        .unwrap();
    for i in 0..20 {
        set(&mut ca, sa, 0, &format!("w/a{i}"), "x").await.unwrap();
    }
    set(&mut cb, sb, 0, "w/b", "y").await.unwrap();
    eventually("B's watch to see B's write", WAIT, || {
        let saw = !seen.lock().unwrap().is_empty();
        async move { holds(saw, || "B's watch saw nothing of B") }
    })
    .await;
    assert_eq!(
        seen.lock().unwrap().clone(),
        ["w/b"],
        "B's watch saw A's writes"
    );

    // An error reported in A reaches A's task and none of B's.
    let mut poll_a = ca.clone();
    let polled_a = tokio::spawn(async move {
        let req = PollForErrorRequest {
            incarnations: inc(1, sa),
            source_task_id: 1,
        };
        poll_a.poll_for_error(req).await
    });
    let mut poll_b = cb.clone();
    let polled_b = tokio::spawn(async move {
        let req = PollForErrorRequest {
            incarnations: inc(1, sb),
            source_task_id: 1,
        };
        poll_b.poll_for_error(req).await
    });
    ns::wait_info(&cluster, 0, "b", WAIT, |n| n.parked_calls >= 1).await;
    ns::wait_info(&cluster, 0, "a", WAIT, |n| n.parked_calls >= 2).await;
    ca.report_error_to_service(ReportErrorToServiceRequest {
        incarnations: inc(0, sa),
        source_task_id: 0,
        error_code: Code::Internal as i32,
        error_message: "boom in a".into(),
    })
    .await
    .unwrap();
    let e = polled_a.await.unwrap().unwrap_err();
    assert_eq!((e.code(), e.message()), (Code::Internal, "boom in a"));
    // The barrier of A's task in error fails too.
    assert!(waiting.await.unwrap().is_err());
    let b_now = ns::get(&addr, "b").await.unwrap();
    assert_eq!((b_now.tasks_connected, b_now.tasks_error), (2, 0));
    assert!(!polled_b.is_finished(), "B's poll ended with A's error");

    // A's tasks stop heartbeating: A's timeout marks its other task, not B's.
    ns::wait_info(&cluster, 0, "a", WAIT, |n| n.tasks_error == 2).await;
    let b_now = ns::get(&addr, "b").await.unwrap();
    assert_eq!((b_now.tasks_connected, b_now.tasks_error), (2, 0));

    // A's reset changes nothing of B.
    let b_before = ns::get(&addr, "b").await.unwrap();
    let mut node = cluster.client(0, WAIT).await;
    node.reset_namespace(proto::coordstore::ResetNamespaceRequest {
        name: "a".into(),
        tasks: 0,
    })
    .await
    .unwrap();
    let a_now = ns::get(&addr, "a").await.unwrap();
    assert_eq!((a_now.keys, a_now.tasks_error), (0, 0));
    let b_after = ns::get(&addr, "b").await.unwrap();
    assert_eq!(
        (
            b_after.epoch,
            b_after.service_incarnation,
            b_after.keys,
            b_after.tasks_connected
        ),
        (
            b_before.epoch,
            b_before.service_incarnation,
            b_before.keys,
            2
        )
    );
    assert_eq!(try_get(&mut cb, sb, "k").await.unwrap(), "from-b");

    // A's shutdown barrier (after A re-registers) leaves B's tasks connected.
    let sa = register_all(&pa, 2).await;
    let (mut s0, mut s1) = (ca.clone(), ca.clone());
    let shut = |t: i32| ShutdownTaskRequest {
        incarnations: inc(t, sa),
        source_task_id: t,
    };
    let (r0, r1) = tokio::join!(s0.shutdown_task(shut(0)), s1.shutdown_task(shut(1)));
    r0.unwrap();
    r1.unwrap();
    let a_now = ns::get(&addr, "a").await.unwrap();
    assert_eq!(a_now.tasks_disconnected, 2);
    let b_now = ns::get(&addr, "b").await.unwrap();
    assert_eq!((b_now.tasks_connected, b_now.tasks_error), (2, 0));
    assert!(!beating.is_finished(), "B's heartbeats failed");
    assert!(!polled_b.is_finished());
    beating.abort();
    polled_b.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_over_its_quota_is_refused_and_the_others_go_on() {
    let cluster = one_node(3, &[]);
    let addr = cluster.nodes[0].addr.clone();
    let quota = NamespaceSettings {
        max_keys: Some(2),
        max_bytes: Some(64),
        max_parked_calls: Some(1),
        ..ns::tasks(1)
    };
    let a = ns::create(&addr, "a", quota).await.unwrap();
    let b = ns::create(&addr, "b", ns::tasks(1)).await.unwrap();
    let (pa, pb) = (port(&cluster, &a), port(&cluster, &b));
    let (sa, sb) = (register_all(&pa, 1).await, register_all(&pb, 1).await);
    let (mut ca, mut cb) = (wire::xla(&pa).await, wire::xla(&pb).await);

    set(&mut ca, sa, 0, "k1", "v").await.unwrap();
    set(&mut ca, sa, 0, "k2", "v").await.unwrap();
    let r = set(&mut ca, sa, 0, "k3", "v").await;
    refused(
        "a third key",
        r,
        Code::ResourceExhausted,
        &["namespace a", "limit of 2 keys"],
    );
    let big = "x".repeat(100);
    let r = set(&mut ca, sa, 0, "k1", &big).await;
    refused(
        "100 bytes",
        r,
        Code::ResourceExhausted,
        &["namespace a", "limit of 64"],
    );
    assert_eq!(
        try_get(&mut ca, sa, "k1").await.unwrap(),
        "v",
        "nothing half-applied"
    );
    for i in 0..5 {
        set(&mut cb, sb, 0, &format!("k{i}"), &big).await.unwrap();
    }

    // One parked call in A at most; B parks more.
    let get = |mut c: Client, si: u64, key: &'static str| {
        tokio::spawn(async move {
            c.get_key_value(GetKeyValueRequest {
                incarnations: inc(0, si),
                key: key.into(),
            })
            .await
        })
    };
    let first = get(ca.clone(), sa, "never");
    ns::wait_info(&cluster, 0, "a", WAIT, |n| n.parked_calls == 1).await;
    let e = get(ca.clone(), sa, "never-either")
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert!(e.message().contains("namespace a") && e.message().contains("--max-parked-calls 1"));
    let in_b: Vec<_> = (0..3).map(|_| get(cb.clone(), sb, "later")).collect();
    ns::wait_info(&cluster, 0, "b", WAIT, |n| n.parked_calls == 3).await;
    set(&mut cb, sb, 0, "later", "now").await.unwrap();
    for g in in_b {
        g.await.unwrap().expect("B's get");
    }
    assert!(!first.is_finished());
    first.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_namespace_ends_its_parked_calls_at_once_and_leaves_nothing() {
    let metrics = format!("127.0.0.1:{}", coordstore_tests::free_port());
    let cluster = one_node(2, &["--metrics-listen", &metrics]);
    let addr = cluster.nodes[0].addr.clone();
    let d = ns::create(&addr, "doomed", ns::tasks(2)).await.unwrap();
    let keep = ns::create(&addr, "kept", ns::tasks(1)).await.unwrap();
    let pd = port(&cluster, &d);
    let sd = register_all(&pd, 2).await;
    let mut c = wire::xla(&pd).await;
    set(&mut c, sd, 0, "k", "v").await.unwrap();
    // A blocking get, a barrier and an error poll, all parked.
    let (mut g, mut b, mut p) = (c.clone(), c.clone(), c.clone());
    let get = tokio::spawn(async move {
        let req = GetKeyValueRequest {
            incarnations: inc(0, sd),
            key: "never".into(),
        };
        g.get_key_value(req).await
    });
    let bar = tokio::spawn(async move { b.barrier(barrier(sd, 0, "B", &[0, 1])).await });
    let poll = tokio::spawn(async move {
        let req = PollForErrorRequest {
            incarnations: inc(1, sd),
            source_task_id: 1,
        };
        p.poll_for_error(req).await
    });
    ns::wait_info(&cluster, 0, "doomed", WAIT, |n| n.parked_calls == 3).await;
    let scrape = || {
        coordstore_tests::http_get(&metrics, "/metrics")
            .expect("metrics")
            .1
    };
    assert!(scrape().contains("namespace=\"doomed\""));

    ns::delete(&addr, "doomed").await.unwrap();
    // Each ends with UNAVAILABLE, the code a stock jaxlib task takes for
    // its service gone, long before its own timeout.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let r = tokio::time::timeout_at(deadline, get).await.expect("get");
    refused("get", r.unwrap(), Code::Unavailable, &["doomed", "deleted"]);
    let r = tokio::time::timeout_at(deadline, poll).await.expect("poll");
    refused(
        "poll",
        r.unwrap(),
        Code::Unavailable,
        &["doomed", "deleted"],
    );
    let r = tokio::time::timeout_at(deadline, bar)
        .await
        .expect("barrier")
        .unwrap();
    refused("barrier", r, Code::Unavailable, &["doomed"]);

    // The port is closed; nothing of it in the state, the metrics, the
    // parked calls or the next snapshot.
    eventually("the deleted namespace's port to close", WAIT, || {
        let open = std::net::TcpStream::connect(&pd).is_ok();
        async move { holds(!open, || "the port stays open") }
    })
    .await;
    let s = journal_state(&addr).await;
    assert!(s.namespace("doomed").is_none());
    assert!(s.namespace("kept").is_some());
    let text = scrape();
    assert!(!text.contains("namespace=\"doomed\""), "{text}");
    assert!(text.contains("namespace=\"kept\""), "{text}");
    assert_eq!(
        coordstore_tests::metric_sample(&text, "coordstore_namespaces"),
        Some(2.0)
    );
    assert_eq!(try_status(&addr).await.unwrap().parked_calls, 0);
    // The state as a snapshot encodes it: not a byte of the name left.
    let mut node = cluster.client(0, WAIT).await;
    let snap = node
        .state(proto::coordstore::StateRequest::default())
        .await
        .unwrap()
        .into_inner()
        .snapshot;
    assert!(!snap.windows(6).any(|w| w == b"doomed"));
    let snapshot = journal::State::decode_snapshot(&snap).unwrap();
    assert_eq!(
        snapshot.namespace("kept").map(|n| n.spec().unwrap().port),
        Some(keep.port)
    );
    // Its name and port can be used again.
    let again = ns::create(&addr, "doomed", ns::tasks(1)).await.unwrap();
    assert_eq!(again.keys, 0);
}

/// A namespace created on a follower is served by every node on the same
/// port, and the create is answered once the answering node serves it
/// (leader or follower): a stock-dialect client on a follower's port registers; a node
/// whose port another process holds reports why and serves it once the
/// port is free; a whole-cluster restart reopens every port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_node_serves_every_namespace_port() {
    let hosts = ["127.0.0.1", "127.0.0.2", "127.0.0.3"];
    let (low, high) = free_port_range(&hosts, 3);
    let range = format!("{low}-{high}");
    let mut cluster = Cluster::start_hosts(3, &["--tasks", "1", "--namespace-ports", &range]);
    let leader = cluster.wait_leader(&[0, 1, 2], WAIT).await;
    let (f1, f2) = ((leader + 1) % 3, (leader + 2) % 3);
    // Another process holds the first port on one follower.
    let held = std::net::TcpListener::bind((hosts[f2], low)).unwrap();
    let info = ns::create(&cluster.nodes[f1].addr, "job", ns::tasks(2))
        .await
        .unwrap();
    assert_eq!(info.port, u32::from(low));
    // A create is answered once the answering node serves the new port,
    // on a follower that forwarded it as on the leader: a client that
    // dials the port at once is not refused for being early.
    assert_eq!(info.listener, "serving", "{info:?}");
    std::net::TcpStream::connect(ns::addr(&cluster, f1, &info)).expect("the port answered");
    let second = ns::create(&cluster.nodes[leader].addr, "job-2", ns::tasks(1))
        .await
        .unwrap();
    assert_eq!(second.listener, "serving", "{second:?}");
    std::net::TcpStream::connect(ns::addr(&cluster, leader, &second)).expect("the port answered");
    let why = ns::wait_info(&cluster, f2, "job", WAIT, |n| {
        n.listener.starts_with("not serving")
    })
    .await;
    assert!(why.listener.contains("in use"), "{}", why.listener);
    for i in [leader, f1] {
        ns::wait_info(&cluster, i, "job", WAIT, |n| n.listener == "serving").await;
    }
    // Task 0 on a follower's port, task 1 on the leader's.
    let (a0, a1) = (
        ns::addr(&cluster, f1, &info),
        ns::addr(&cluster, leader, &info),
    );
    let r0 = tokio::spawn(async move {
        let mut c = wire::xla(&a0).await;
        let req = RegisterTaskRequest {
            incarnation: 1,
            source_task_id: 0,
        };
        c.register_task(req)
            .await
            .map(|r| r.into_inner().service_incarnation)
    });
    let mut c1 = wire::xla(&a1).await;
    let si = c1
        .register_task(RegisterTaskRequest {
            incarnation: 2,
            source_task_id: 1,
        })
        .await
        .unwrap()
        .into_inner()
        .service_incarnation;
    assert_eq!(r0.await.unwrap().unwrap(), si);
    set(&mut c1, si, 1, "k", "v").await.unwrap();
    drop(held);
    ns::wait_serving(&cluster, "job", WAIT).await;

    cluster.kill_all();
    for i in 0..3 {
        cluster.restart(i);
    }
    let info = ns::wait_serving(&cluster, "job", WAIT).await;
    assert_eq!((info.keys, info.tasks_connected), (1, 2));
    let mut c = wire::xla(&ns::addr(&cluster, f2, &info)).await;
    assert_eq!(try_get(&mut c, si, "k").await.unwrap(), "v");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_past_its_ttl_is_deleted_once_its_job_is_done() {
    let cluster = one_node(3, &[]);
    let addr = cluster.nodes[0].addr.clone();
    let ttl = |tasks| NamespaceSettings {
        ttl_ms: Some(300),
        ..ns::tasks(tasks)
    };
    let idle = ns::create(&addr, "idle", ttl(1)).await.unwrap();
    let running = ns::create(&addr, "running", ttl(1)).await.unwrap();
    let finished = ns::create(&addr, "finished", ttl(1)).await.unwrap();
    let _ = idle;
    let sr = register_all(&port(&cluster, &running), 1).await;
    let pf = port(&cluster, &finished);
    let sf = register_all(&pf, 1).await;
    // The finished job shuts down; the running one does not.
    let mut c = wire::xla(&pf).await;
    c.shutdown_task(ShutdownTaskRequest {
        incarnations: inc(0, sf),
        source_task_id: 0,
    })
    .await
    .unwrap();
    let names = eventually("the TTL to end idle and finished", WAIT, || async {
        let names = ns::names(&addr).await;
        if names.iter().any(|n| n == "idle" || n == "finished") {
            Err(names)
        } else {
            Ok(names)
        }
    })
    .await;
    assert!(names.iter().any(|n| n == "running"), "{names:?}");
    // The running job's namespace outlived two namespaces of the same TTL
    // created with it; it is still there and serves its task.
    let mut c = wire::xla(&port(&cluster, &running)).await;
    set(&mut c, sr, 0, "k", "v").await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_moves_to_another_cluster_by_export_and_import() {
    let from = one_node(2, &[]);
    let to = one_node(2, &[]);
    let (src, dst) = (from.nodes[0].addr.clone(), to.nodes[0].addr.clone());
    let info = ns::create(&src, "job", ns::tasks(1)).await.unwrap();
    let si = register_all(&port(&from, &info), 1).await;
    let mut c = wire::xla(&port(&from, &info)).await;
    set(&mut c, si, 0, "k", "v").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("job.export");
    let file_s = file.display().to_string();
    let (ok, out, err) =
        coordstore_cli(&["ctl", "--endpoint", &src, "ns", "export", "job", &file_s]).await;
    assert!(ok, "{out}{err}");

    // A damaged file is refused and creates nothing.
    let mut bytes = std::fs::read(&file).unwrap();
    let damaged = dir.path().join("damaged.export");
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&damaged, &bytes).unwrap();
    let damaged_s = damaged.display().to_string();
    let (ok, _, err) =
        coordstore_cli(&["ctl", "--endpoint", &dst, "ns", "import", &damaged_s]).await;
    assert!(!ok && err.contains("checksum"), "{err}");
    assert_eq!(ns::names(&dst).await, ["default"]);

    let (ok, out, err) = coordstore_cli(&[
        "ctl",
        "--endpoint",
        &dst,
        "ns",
        "import",
        &file_s,
        "--as",
        "moved",
    ])
    .await;
    assert!(ok, "{out}{err}");
    let moved = ns::get(&dst, "moved").await.unwrap();
    assert_eq!((moved.keys, moved.tasks_connected), (1, 1));
    assert_eq!(moved.service_incarnation, si, "the job's tasks carry on");
    let mut c = wire::xla(&port(&to, &moved)).await;
    assert_eq!(try_get(&mut c, si, "k").await.unwrap(), "v");
    // Imported again under the same name: ALREADY_EXISTS.
    let (ok, _, err) = coordstore_cli(&[
        "ctl",
        "--endpoint",
        &dst,
        "ns",
        "import",
        &file_s,
        "--as",
        "moved",
    ])
    .await;
    assert!(!ok && err.contains("already exists"), "{err}");
}

/// The tf.data dispatcher and the closure queues are per namespace too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn datasets_and_closure_queues_are_per_namespace() {
    use agent::closures::{Coordinator, QueueConfig, Worker};
    use proto::tfdata::dispatcher_service_client::DispatcherServiceClient;
    use proto::tfdata::{GetDataServiceMetadataRequest, GetOrRegisterDatasetRequest};

    let cluster = one_node(2, &[]);
    let addr = cluster.nodes[0].addr.clone();
    let a = ns::create(&addr, "a", ns::tasks(1)).await.unwrap();
    let b = ns::create(&addr, "b", ns::tasks(1)).await.unwrap();
    let dispatcher = |info: &NamespaceInfo| {
        let at = port(&cluster, info);
        async move { DispatcherServiceClient::new(wire::channel(&at).await) }
    };
    let (mut da, mut db) = (dispatcher(&a).await, dispatcher(&b).await);
    let id = da
        .get_or_register_dataset(GetOrRegisterDatasetRequest {
            dataset: b"graph".to_vec().into(),
            metadata: b"\x10\x02".to_vec().into(),
            optional_dataset_id: None,
        })
        .await
        .unwrap()
        .into_inner()
        .dataset_id;
    let metadata = |id: &str| GetDataServiceMetadataRequest {
        dataset_id: id.into(),
    };
    da.get_data_service_metadata(metadata(&id)).await.unwrap();
    let r = db.get_data_service_metadata(metadata(&id)).await;
    refused("B reads A's dataset", r, Code::NotFound, &[&id]);

    // A queue of A with two closures; B has no such queue, then an empty one.
    let nodes = vec![addr.clone()];
    let qa = Coordinator::create_in(&nodes, Some("a"), "q", Some(QueueConfig::default()), "c")
        .await
        .unwrap();
    qa.schedule(b"one".to_vec()).await.unwrap();
    qa.schedule(b"two".to_vec()).await.unwrap();
    let wb = Worker::new_in(&nodes, Some("b"), "q", "w").unwrap();
    let r = wb.get(Duration::from_millis(100)).await;
    refused(
        "B's worker on A's queue",
        r.map(|_| ()),
        Code::NotFound,
        &["q"],
    );
    Coordinator::create_in(&nodes, Some("b"), "q", Some(QueueConfig::default()), "c")
        .await
        .unwrap();
    let info = ns::get(&addr, "a").await.unwrap();
    assert_eq!(info.closure_queues[0].queued, 2);
    assert_eq!(info.tfdata_jobs, 0);
    // B's worker parks on B's empty queue; A's closures never reach it, and
    // the delete of B ends its wait with NOT_FOUND.
    let waiting = tokio::spawn(async move { wb.get(WAIT).await });
    ns::wait_info(&cluster, 0, "b", WAIT, |n| n.parked_calls == 1).await;
    let wa = Worker::new_in(&nodes, Some("a"), "q", "w").unwrap();
    let (got, _) = wa.get(WAIT).await.unwrap().expect("A's closure");
    assert_eq!(&got.payload[..], b"one");
    ns::delete(&addr, "b").await.unwrap();
    let r = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the wait ends")
        .unwrap();
    refused(
        "a get in a deleted namespace",
        r.map(|_| ()),
        Code::NotFound,
        &["b", "deleted"],
    );
}
