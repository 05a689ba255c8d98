//! What an operator scrapes and probes, on a real 3-node cluster: the
//! Prometheus exposition (checked by `promtool check metrics`, values
//! against what the test did), `/healthz`, `/readyz` and the gRPC health
//! service through the loss of quorum and its return.

use std::io::Write;
use std::time::{Duration, Instant};

use coordstore_tests::wait::{eventually, eventually_blocking, holds, wait};
use coordstore_tests::{http_get, metric_sample as sample, Cluster, Writer};

fn wait_http(addr: &str, path: &str, want: u16, wait: Duration) -> String {
    eventually_blocking(
        format!("{addr}{path} to answer {want}"),
        wait,
        || match http_get(addr, path) {
            Some((status, body)) if status == want => Ok(body),
            got => Err(got),
        },
    )
}

/// Three nodes, each serving metrics on an address of the list, and the
/// leader's index once one is elected.
async fn with_metrics() -> (Cluster, Vec<String>, usize) {
    let http = coordstore_tests::free_addrs(3);
    let h = http.clone();
    let cluster = Cluster::start_each(3, &[], move |i| {
        vec!["--metrics-listen".into(), h[i].clone()]
    });
    let leader = cluster
        .wait_leader(&[0, 1, 2], Duration::from_secs(30))
        .await;
    (cluster, http, leader)
}

fn promtool() -> String {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = std::process::Command::new("bash")
        .arg(root.join("scripts/setup-prometheus.sh"))
        .stderr(std::process::Stdio::inherit())
        .output()
        .expect("scripts/setup-prometheus.sh");
    assert!(out.status.success(), "setup-prometheus.sh failed");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .expect("promtool path")
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_pass_promtool_and_count_what_was_done() {
    let promtool = promtool();
    let (cluster, http, leader) = with_metrics().await;
    let mut client = cluster.client(leader, Duration::from_secs(30)).await;
    let mut w = Writer::new();
    for i in 0..25 {
        w.put(
            &mut client,
            &format!("m/{i}"),
            b"0123456789",
            Duration::from_secs(30),
        )
        .await
        .expect("put");
    }
    let text = wait_http(&http[leader], "/metrics", 200, Duration::from_secs(10));

    let mut check = std::process::Command::new(&promtool)
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool");
    check
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = check.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics: {}{}\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    assert_eq!(sample(&text, "coordstore_kv_keys"), Some(25.0), "{text}");
    // Keys "m/0".."m/24" and 10-byte values.
    let key_bytes: usize = (0..25).map(|i| format!("m/{i}").len()).sum();
    assert_eq!(
        sample(&text, "coordstore_kv_bytes"),
        Some((key_bytes + 250) as f64)
    );
    assert_eq!(sample(&text, "coordstore_raft_is_leader"), Some(1.0));
    let proposals = sample(&text, "coordstore_raft_proposals_total").unwrap();
    assert!(proposals >= 25.0, "{proposals} proposals");
    let calls = sample(
        &text,
        r#"coordstore_grpc_calls_total{code="Ok",method="/coordstore.v1.Node/Propose"}"#,
    )
    .unwrap_or(0.0);
    assert!(calls >= 25.0, "{calls} Propose calls:\n{text}");
    assert!(sample(&text, "coordstore_process_resident_memory_bytes").unwrap() > 1e6);
    // Every put was made durable by a flush (fdatasync) on the leader.
    let flushes = sample(&text, "coordstore_storage_flush_seconds_count").unwrap();
    let appends = sample(&text, "coordstore_storage_flush_appends_sum").unwrap();
    assert!(
        flushes >= 1.0 && appends >= 25.0,
        "{flushes} flushes of {appends} appends"
    );
    // A follower knows the same leader and the same keys once applied.
    let follower = (leader + 1) % 3;
    let t = wait_http(&http[follower], "/metrics", 200, Duration::from_secs(10));
    assert_eq!(sample(&t, "coordstore_raft_is_leader"), Some(0.0));
    assert_eq!(
        sample(&t, "coordstore_raft_leader_id"),
        Some(cluster.nodes[leader].id as f64)
    );
    // A method no service has is counted as "other", not as a new label.
    let ch = coordstore_tests::wire::channel(&cluster.nodes[leader].addr).await;
    let mut g = tonic::client::Grpc::new(ch);
    g.ready().await.unwrap();
    let r: Result<tonic::Response<proto::coordstore::StatusResponse>, tonic::Status> = g
        .unary(
            tonic::Request::new(proto::coordstore::StatusRequest {}),
            tonic::codegen::http::uri::PathAndQuery::from_static("/coordstore.v1.Node/Nope"),
            tonic_prost::ProstCodec::default(),
        )
        .await;
    assert_eq!(r.unwrap_err().code(), tonic::Code::Unimplemented);
    let text = wait_http(&http[leader], "/metrics", 200, Duration::from_secs(10));
    assert!(!text.contains("Nope"), "{text}");
    assert_eq!(
        sample(
            &text,
            r#"coordstore_grpc_calls_total{code="Unimplemented",method="other"}"#
        ),
        Some(1.0),
        "{text}"
    );
    // The write batcher's entries carried every put.
    let batched = sample(&text, "coordstore_raft_batch_updates_sum").unwrap();
    let entries = sample(&text, "coordstore_raft_batch_updates_count").unwrap();
    assert!(
        batched >= 25.0 && entries >= 1.0,
        "{batched} updates in {entries} entries"
    );
    // Where the writes' time went, by stage: each put waited in the queue
    // and resumed once, each batch committed once; each append became
    // durable, each run of entries was applied.
    let stage = |s: &str| {
        sample(
            &text,
            &format!("coordstore_raft_write_stage_seconds_count{{stage=\"{s}\"}}"),
        )
        .unwrap_or(-1.0)
    };
    assert!(stage("queue") >= 25.0, "{text}");
    assert!(stage("resume") >= 25.0, "{text}");
    assert!(
        stage("commit") >= 1.0 && stage("commit") <= entries,
        "{text}"
    );
    assert!(sample(&text, "coordstore_storage_append_durable_seconds_count").unwrap() >= 1.0);
    assert!(sample(&text, "coordstore_storage_apply_seconds_count").unwrap() >= 1.0);

    // Parked calls by kind: the agent's standing PollForError and a
    // blocking get of a missing key, each under its own kind; the get
    // leaves once answered.
    let parked = |text: &str, kind: &str| {
        sample(text, &format!("coordstore_parked_calls{{kind=\"{kind}\"}}")).unwrap_or(-1.0)
    };
    assert_eq!(parked(&text, "kv_get"), 0.0, "{text}");
    let mut cfg =
        agent::AgentConfig::new(vec![cluster.nodes[leader].addr.clone()], "jax_worker", 0);
    cfg.heartbeat_interval = Duration::from_millis(500);
    let a = agent::Agent::new(cfg, std::sync::Arc::new(|_| {})).unwrap();
    a.connect().await.unwrap();
    let get = a.get_key_value_async("later");
    let scrape_until = |want: &'static [(&'static str, f64)]| {
        let addr = http[leader].clone();
        let what = format!("the parked calls to become {want:?}");
        eventually(what, Duration::from_secs(30), move || {
            let t = wait_http(&addr, "/metrics", 200, Duration::from_secs(10));
            let reached = want.iter().all(|(k, n)| parked(&t, k) == *n);
            async move {
                if reached {
                    Ok(t)
                } else {
                    Err(t)
                }
            }
        })
    };
    scrape_until(&[("kv_get", 1.0), ("poll_for_error", 1.0), ("barrier", 0.0)]).await;
    let st = coordstore_tests::try_status(&cluster.nodes[leader].addr)
        .await
        .unwrap();
    assert_eq!(st.parked_by_kind.len(), 2, "{:?}", st.parked_by_kind);
    assert_eq!(st.parked_by_kind.get("kv_get"), Some(&1));
    assert_eq!(st.parked_calls, 2);
    a.insert_key_value("later", "x").await.unwrap();
    assert_eq!(&get.wait().await.unwrap()[..], b"x");
    scrape_until(&[("kv_get", 0.0), ("poll_for_error", 1.0)]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_follows_the_quorum_and_liveness_the_process() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{health_client::HealthClient, HealthCheckRequest};

    let http = coordstore_tests::free_addrs(3);
    let h = http.clone();
    let mut cluster = Cluster::start_each(3, &[], move |i| {
        vec!["--metrics-listen".into(), h[i].clone()]
    });
    let leader = cluster
        .wait_leader(&[0, 1, 2], Duration::from_secs(30))
        .await;
    for a in &http {
        wait_http(a, "/healthz", 200, Duration::from_secs(10));
        wait_http(a, "/readyz", 200, Duration::from_secs(30));
    }
    let grpc_status = |addr: String| async move {
        let ch = coordstore_tests::wire::channel(&addr).await;
        HealthClient::new(ch)
            .check(HealthCheckRequest {
                service: String::new(),
            })
            .await
            .map(|r| r.into_inner().status())
    };
    let survivor = (leader + 1) % 3;
    let survivor_addr = cluster.nodes[survivor].addr.clone();
    let health_becomes = |want: ServingStatus| {
        let addr = survivor_addr.clone();
        eventually(
            format!("gRPC health {want:?}"),
            Duration::from_secs(30),
            move || {
                let status = grpc_status(addr.clone());
                async move {
                    let got = status.await.ok();
                    holds(got == Some(want), || got)
                }
            },
        )
    };
    health_becomes(ServingStatus::Serving).await;

    // The leader and another node die: the survivor has no quorum.
    let other = (leader + 2) % 3;
    cluster.kill(leader);
    cluster.kill(other);
    let why = wait_http(&http[survivor], "/readyz", 503, Duration::from_secs(30));
    assert!(why.starts_with("not ready"), "{why}");
    wait_http(&http[survivor], "/healthz", 200, Duration::from_secs(5));
    health_becomes(ServingStatus::NotServing).await;

    // One comes back: a quorum again, ready again.
    cluster.restart(other);
    wait_http(&http[survivor], "/readyz", 200, Duration::from_secs(60));
    wait_http(&http[other], "/readyz", 200, Duration::from_secs(60));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_log_lines_carry_node_term_and_role_and_slow_requests() {
    let cluster = Cluster::start(1, &["--log-format", "json", "--slow-request-ms", "0"]);
    cluster.wait_leader(&[0], Duration::from_secs(30)).await;
    let mut client = cluster.client(0, Duration::from_secs(30)).await;
    Writer::new()
        .put(&mut client, "k", b"v", Duration::from_secs(30))
        .await
        .unwrap();
    // With a 0 ms threshold every proposal is logged as slow.
    let slow = eventually_blocking("a slow-request line", Duration::from_secs(10), || {
        let log = cluster.nodes[0].log();
        let lines: Vec<serde_json::Value> = log
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
            .collect();
        match lines.into_iter().find(|l| {
            l["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("slow request"))
        }) {
            Some(l) => Ok(l),
            None => Err(log),
        }
    });
    assert_eq!(slow["level"], "WARN", "{slow}");
    assert_eq!(slow["node_id"], 1, "{slow}");
    assert_eq!(slow["role"], "leader", "{slow}");
    assert!(slow["term"].as_u64().unwrap() >= 1, "{slow}");
    assert!(slow["ms"].is_u64(), "{slow}");

    // A format the node does not know is refused before it starts.
    let out = std::process::Command::new(coordstore_tests::coordstore_bin())
        .args(["serve", "--log-format", "xml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--log-format is text or json"));
}

/// Per-namespace series for the `--metrics-namespaces` largest namespaces
/// (by keys) and one `other` for the rest, so a fleet of namespaces cannot
/// blow up a Prometheus server; `coordstore_namespaces` counts them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespace_series_are_bounded_and_the_rest_is_other() {
    use coordstore_tests::ns;
    let promtool = promtool();
    let http = coordstore_tests::free_addrs(1);
    let cluster = Cluster::start(
        1,
        &[
            "--tasks",
            "1",
            "--metrics-listen",
            &http[0],
            "--metrics-namespaces",
            "2",
        ],
    );
    let addr = cluster.nodes[0].addr.clone();
    cluster.wait_leader(&[0], Duration::from_secs(30)).await;
    // The default namespace's task is counted once the leader configured
    // the service (its first duty tick); the writes below need not wait.
    eventually(
        "the service to be configured",
        Duration::from_secs(30),
        || async {
            let incarnation = coordstore_tests::try_status(&addr)
                .await
                .map(|s| s.service_incarnation);
            holds(incarnation.is_some_and(|i| i != 0), || incarnation)
        },
    )
    .await;
    let mut client = cluster.client(0, Duration::from_secs(30)).await;
    // Keys: big 3, mid 2, small 1, tiny 1, default 0.
    for (name, keys) in [("big", 3), ("mid", 2), ("small", 1), ("tiny", 1)] {
        ns::create(&addr, name, ns::tasks(1)).await.unwrap();
        let mut w = Writer::in_namespace(name);
        for k in 0..keys {
            w.put(&mut client, &format!("k{k}"), b"v", Duration::from_secs(30))
                .await
                .unwrap();
        }
    }
    let text = wait_http(&http[0], "/metrics", 200, Duration::from_secs(10));
    let out = {
        let mut check = std::process::Command::new(&promtool)
            .args(["check", "metrics"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("promtool");
        check
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
        check.wait_with_output().unwrap()
    };
    assert!(
        out.status.success(),
        "{}{text}",
        String::from_utf8_lossy(&out.stdout)
    );
    let keys = |ns: &str| {
        sample(
            &text,
            &format!("coordstore_namespace_keys{{namespace=\"{ns}\"}}"),
        )
    };
    assert_eq!(sample(&text, "coordstore_namespaces"), Some(5.0), "{text}");
    assert_eq!(keys("big"), Some(3.0), "{text}");
    assert_eq!(keys("mid"), Some(2.0), "{text}");
    assert_eq!(keys("other"), Some(2.0), "small, tiny and default: {text}");
    assert_eq!(keys("small"), None, "{text}");
    let series = text
        .lines()
        .filter(|l| l.starts_with("coordstore_namespace_keys{"))
        .count();
    assert_eq!(series, 3, "{text}");
    let connected = sample(
        &text,
        r#"coordstore_namespace_tasks{namespace="other",state="disconnected"}"#,
    );
    assert_eq!(connected, Some(3.0), "{text}");
}

/// A newcomer's first screen: a clean start of a single node, and of a
/// 3-node cluster, logs nothing at WARN or above (openraft's notices about
/// stale messages of an election are not trouble; see `ops::logs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_start_logs_no_warning() {
    for n in [1, 3] {
        let cluster = Cluster::start(n, &[]);
        let all: Vec<usize> = (0..n).collect();
        cluster.wait_leader(&all, Duration::from_secs(60)).await;
        // Settled: every node applied the cluster's level (the leader's
        // first writes) and they agree.
        let deadline = Instant::now() + Duration::from_secs(60);
        for node in &cluster.nodes {
            let left = deadline.saturating_duration_since(Instant::now());
            wait(
                format!("node {} to apply the cluster's level", node.id),
                left,
            )
            .context(|| cluster.logs())
            .until(|| async {
                let level = coordstore_tests::try_status(&node.addr)
                    .await
                    .map(|s| s.cluster_feature_level);
                holds(level == Some(journal::FEATURE_LEVEL), || level)
            })
            .await;
        }
        cluster.wait_converged(&all, Duration::from_secs(60)).await;
        for node in &cluster.nodes {
            let log = node.log();
            let loud: Vec<&str> = log
                .lines()
                .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
                .collect();
            assert!(loud.is_empty(), "{n} node(s), node {}: {loud:#?}", node.id);
        }
    }
}

/// `coordstore ctl ARGS...` against `endpoint`: its stdout, or a panic
/// with its stderr.
async fn ctl_ok(endpoint: &str, args: &[&str]) -> String {
    let mut all = vec!["ctl", "--endpoint", endpoint];
    all.extend_from_slice(args);
    let (ok, out, err) = coordstore_tests::coordstore_cli(&all).await;
    assert!(ok, "ctl {args:?}: {err}");
    out
}

/// `ctl ARGS...` as JSON.
async fn ctl_json(endpoint: &str, args: &[&str]) -> serde_json::Value {
    let out = ctl_ok(endpoint, args).await;
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("ctl {args:?}: {e}: {out}"))
}

/// `ctl ARGS...` that must fail: its stderr.
async fn ctl_err(endpoint: &str, args: &[&str]) -> String {
    let mut all = vec!["ctl", "--endpoint", endpoint];
    all.extend_from_slice(args);
    let (ok, out, err) = coordstore_tests::coordstore_cli(&all).await;
    assert!(!ok, "ctl {args:?} succeeded: {out}");
    err
}

/// Why a job is stuck, from the CLI of a follower: `ctl barriers` names the
/// task a barrier waits for, with its state and last heartbeat (which only
/// the leader knows); `ctl tasks --state`, `ctl ns get`, `-o table` on the
/// listing verbs, NOT_FOUND for what does not exist; and the metrics of the
/// oldest barrier's wait, the quotas and readiness.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_says_why_a_barrier_waits() {
    use coordstore_tests::{job::XlaJob, ns};
    let (cluster, http, leader) = with_metrics().await;
    let f = (leader + 1) % 3;
    let addr = cluster.nodes[f].addr.clone();
    let settings = proto::coordstore::NamespaceSettings {
        tasks: 4,
        recoverable: true,
        max_keys: Some(10),
        heartbeat_timeout_ms: Some(3_600_000),
        ..Default::default()
    };
    ns::create(&addr, "stuck", settings).await.unwrap();
    let job = XlaJob::register(&addr, "stuck", 4).await;
    job.report_error(2, "oom on host 2").await;
    let _parked = job.arrive("sync", [0, 1], &[0, 1, 3], Duration::from_secs(3600));
    let b = eventually("two arrivals, timed", Duration::from_secs(30), || async {
        let v = ctl_json(&addr, &["--namespace", "stuck", "barriers"]).await;
        let sync = v.as_array().unwrap().iter().find(|b| b["id"] == "sync");
        // The leader notes a new barrier at its next look (100 ms).
        let arrived = sync.and_then(|b| b["arrived_count"].as_u64());
        let timed = sync.is_some_and(|b| b["waited_ms"].is_u64());
        holds(arrived == Some(2) && timed, || v.clone())?;
        Ok::<_, serde_json::Value>(sync.unwrap().clone())
    })
    .await;
    let sync = &b;
    assert_eq!(sync["status"], "PENDING", "{b}");
    assert_eq!(sync["participant_count"], 3, "{b}");
    assert_eq!(sync["missing_count"], 1, "{b}");
    let missing = &sync["missing"][0];
    assert_eq!(
        (&missing["job"], &missing["task_id"]),
        (&"jax_worker".into(), &3.into())
    );
    assert_eq!(missing["state"], "CONNECTED", "{b}");
    assert!(
        missing["heartbeat_age_ms"].is_u64(),
        "the leader's age: {b}"
    );
    assert!(sync["waited_ms"].is_u64(), "{b}");
    let table = ctl_ok(&addr, &["--namespace", "stuck", "barriers", "-o", "table"]).await;
    for want in [
        "sync",
        "PENDING",
        "2/3",
        "jax_worker/3",
        "CONNECTED",
        " ago",
    ] {
        assert!(table.contains(want), "{want:?} in\n{table}");
    }
    let one = ctl_json(&addr, &["--namespace", "stuck", "barriers", "sync"]).await;
    assert_eq!(one.as_array().map(Vec::len), Some(1), "{one}");
    let err = ctl_err(&addr, &["--namespace", "stuck", "barriers", "nope"]).await;
    assert!(
        err.contains("NOT_FOUND: namespace stuck has no barrier nope"),
        "{err}"
    );

    // Tasks by state, and one by name.
    let errors = ctl_json(
        &addr,
        &["--namespace", "stuck", "tasks", "--state", "error"],
    )
    .await;
    assert_eq!(errors.as_array().map(Vec::len), Some(1), "{errors}");
    assert_eq!(errors[0]["task_id"], 2, "{errors}");
    assert!(
        errors[0]["error"]
            .as_str()
            .unwrap()
            .contains("oom on host 2"),
        "{errors}"
    );
    let args = [
        "--namespace",
        "stuck",
        "tasks",
        "--state",
        "connected",
        "-o",
        "table",
    ];
    let connected = ctl_ok(&addr, &args).await;
    assert_eq!(
        connected.lines().count(),
        4,
        "a header and 3 tasks:\n{connected}"
    );
    assert!(
        connected.contains("jax_worker/3") && connected.contains(" ago"),
        "{connected}"
    );
    let three = ctl_json(&addr, &["--namespace", "stuck", "tasks", "3"]).await;
    assert_eq!(three[0]["task_id"], 3, "{three}");
    let err = ctl_err(&addr, &["--namespace", "stuck", "tasks", "jax_worker/9"]).await;
    assert!(
        err.contains("NOT_FOUND: namespace stuck has no task jax_worker/9"),
        "{err}"
    );

    // The namespace's own view.
    let got = ctl_json(&addr, &["ns", "get", "stuck"]).await;
    assert_eq!(
        got["pending_barriers"][0]["missing"][0]["task_id"], 3,
        "{got}"
    );
    let got = ctl_ok(&addr, &["ns", "get", "stuck", "-o", "table"]).await;
    assert!(
        got.contains("1 in error") && got.contains("jax_worker/3"),
        "{got}"
    );
    let err = ctl_err(&addr, &["ns", "get", "nope"]).await;
    assert!(err.contains("NOT_FOUND"), "{err}");
    let all = ctl_json(&addr, &["ns", "ls"]).await;
    let stuck = all
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["name"] == "stuck");
    assert!(stuck.unwrap()["oldest_barrier_ms"].is_u64(), "{all}");
    let all = ctl_ok(&addr, &["ns", "ls", "-o", "table"]).await;
    assert!(
        all.lines()
            .any(|l| l.starts_with("stuck ") && l.contains("0/10")),
        "{all}"
    );
    // `-o` after the verb or before it (etcdctl's `-w table` habit).
    for args in [["status", "-o", "table"], ["-o", "table", "status"]] {
        let status = ctl_ok(&addr, &args).await;
        assert_eq!(
            status.matches("leader").count(),
            2,
            "{args:?}: the leader line and member:\n{status}"
        );
    }
    let first = ctl_ok(&addr, &["-o", "table", "--namespace", "stuck", "barriers"]).await;
    assert!(
        first.contains("PENDING") && serde_json::from_str::<serde_json::Value>(&first).is_err(),
        "a table, not JSON: {first}"
    );

    // A user's control characters stay inert in a table.
    let key = [
        "--namespace",
        "stuck",
        "kv",
        "put",
        "k",
        "red\u{1b}[31mtext",
    ];
    ctl_ok(&addr, &key).await;
    let keys = ctl_ok(&addr, &["--namespace", "stuck", "kv", "ls", "-o", "table"]).await;
    assert!(
        !keys.contains('\u{1b}') && keys.contains("red\\u{1b}[31mtext"),
        "{keys}"
    );
    let jobs = ctl_ok(
        &addr,
        &["--namespace", "stuck", "tfdata", "jobs", "-o", "table"],
    )
    .await;
    assert!(jobs.starts_with("JOB"), "{jobs}");

    // The leader's metrics: the barrier's wait, the quota, readiness.
    let text = wait_http(&http[leader], "/metrics", 200, Duration::from_secs(10));
    let waited = sample(
        &text,
        r#"coordstore_namespace_oldest_barrier_seconds{namespace="stuck"}"#,
    );
    assert!(waited.is_some_and(|s| s >= 0.0), "{text}");
    let quota = sample(&text, r#"coordstore_namespace_max_keys{namespace="stuck"}"#);
    assert_eq!(quota, Some(10.0), "{text}");
    assert_eq!(sample(&text, "coordstore_ready"), Some(1.0), "{text}");
    let errors = sample(
        &text,
        r#"coordstore_namespace_tasks{namespace="stuck",state="error"}"#,
    );
    assert_eq!(errors, Some(1.0), "{text}");
}

/// A follower's client writes go to the leader in batches: 256 writes at
/// once through a follower reach the leader in fewer calls than writes (a
/// few alone as `NodePeer/Propose`, the rest in `ProposeBatch` calls of
/// more than one: the follower's `coordstore_raft_forward_batch_proposals`
/// histogram and the leader's call counts), and every write is applied,
/// once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_followers_concurrent_writes_reach_the_leader_in_batches() {
    use journal::pb::coordination::KvInsert;
    use prost::Message;

    let (cluster, http, leader) = with_metrics().await;
    let follower = (leader + 1) % 3;
    let client = cluster.client(follower, Duration::from_secs(30)).await;
    const WRITES: usize = 256;
    let writes = (0..WRITES).map(|i| {
        let mut c = client.clone();
        async move {
            let update = journal::Update::from(journal::pb::update::Command::from(KvInsert {
                key: format!("batched/{i}"),
                value: "v".into(),
                allow_overwrite: false,
            }));
            let req = proto::coordstore::ProposeRequest {
                update: update.encode_to_vec().into(),
            };
            c.propose(req).await.map(|r| r.into_inner())
        }
    });
    for answer in futures_util::future::join_all(writes).await {
        let answer = answer.expect("a write through the follower");
        let outcome = journal::Outcome::decode(answer.outcome.as_ref()).unwrap();
        assert!(outcome.error.is_none(), "{outcome:?}");
    }
    let t = wait_http(&http[follower], "/metrics", 200, Duration::from_secs(10));
    let sent = sample(&t, "coordstore_raft_forward_batch_proposals_sum").unwrap();
    let batches = sample(&t, "coordstore_raft_forward_batch_proposals_count").unwrap();
    assert!(
        batches >= 1.0 && batches < sent,
        "{sent} in {batches} batches"
    );
    let t = wait_http(&http[leader], "/metrics", 200, Duration::from_secs(10));
    let calls = |method: &str| {
        sample(
            &t,
            &format!(r#"coordstore_grpc_calls_total{{code="Ok",method="/coordstore.v1.NodePeer/{method}"}}"#),
        )
        .unwrap_or(0.0)
    };
    let alone = calls("Propose");
    assert_eq!(calls("ProposeBatch"), batches, "{t}");
    assert!(
        alone + sent >= WRITES as f64,
        "{alone} alone, {sent} batched"
    );
    assert!(alone + batches < WRITES as f64, "{alone} + {batches} calls");
    assert_eq!(sample(&t, "coordstore_kv_keys"), Some(WRITES as f64));
}
