//! The admin identity, with real certificates (rcgen) and real nodes: with
//! mutual TLS only a certificate `--admin-client-name` names runs the
//! cluster's verbs (namespace create, delete, reset, export, import;
//! reset-job; snapshot save; membership), a namespace's own views admit its
//! clients and the admins, and `ns ls` shows each caller only what admits
//! it. Every verb is tried as an admin, as the namespace's own job and as
//! another job, through the raw Node API and through `ctl`; after every
//! refused attempt the victim namespace is intact. A follower forwarding a
//! create or a delete does not turn a job into an admin, and without
//! `--admin-client-name` no client runs a cluster verb.

use std::path::Path;
use std::time::Duration;

use coordstore_tests::pki::{self, dial, wait_leader, Leaf, Pki};
use coordstore_tests::wait::{holds, wait};
use coordstore_tests::{coordstore_cli, ns};
use journal::pb::{coordination::KvInsert, update::Command, ResetJobEpoch};
use journal::Update;
use prost::Message;
use proto::coordstore::node_client::NodeClient;
use proto::coordstore::{
    CreateNamespaceRequest, ImportNamespaceRequest, KvGetRequest, KvListRequest,
    ListNamespacesRequest, NamespaceInfo, NamespaceRequest, NamespaceSettings, ProposeRequest,
    RemoveMemberRequest, ResetNamespaceRequest, StateRequest, StatusRequest,
};
use tonic::transport::Channel;
use tonic::{Code, Status};

const WAIT: Duration = Duration::from_secs(60);
const SECRET: &[u8] = b"b's secret";

fn s(p: &Path) -> String {
    p.display().to_string()
}

/// The certificates: the cluster's, and three clients: the operator
/// (`ops`, the admin) and two jobs.
struct Certs {
    pki: Pki,
    ops: Leaf,
    job_a: Leaf,
    job_b: Leaf,
}

impl std::ops::Deref for Certs {
    type Target = Pki;
    fn deref(&self) -> &Pki {
        &self.pki
    }
}

impl Certs {
    fn new() -> Certs {
        let pki = Pki::new();
        Certs {
            ops: pki.client("ops-alice", &[]),
            // Job A by its CN, job B by a SAN.
            job_a: pki.client("job-a", &[]),
            job_b: pki.client("trainer", &["job-b.fleet.example"]),
            pki,
        }
    }

    /// Every node's flags: mutual TLS on both ports, and `admins`.
    fn node_flags(&self, admins: &[&str]) -> Vec<String> {
        let mut flags = self.pki.node_flags();
        for a in admins {
            flags.extend(["--admin-client-name".to_string(), a.to_string()]);
        }
        flags
    }
}

/// A Node API client on `addr` as `who`.
async fn node_as(certs: &Certs, addr: &str, who: &Leaf) -> NodeClient<Channel> {
    NodeClient::new(dial(addr, certs.tls(who)).await.unwrap())
        .max_decoding_message_size(1 << 30)
        .max_encoding_message_size(1 << 30)
}

/// `msg` in namespace `ns` by header.
fn in_ns<T>(namespace: &str, msg: T) -> tonic::Request<T> {
    ns::request(namespace, msg)
}

fn create(name: &str, allow: &str) -> CreateNamespaceRequest {
    CreateNamespaceRequest {
        name: name.into(),
        settings: Some(NamespaceSettings {
            tasks: 2,
            allow_client_names: vec![allow.into()],
            ..Default::default()
        }),
    }
}

fn named(name: &str) -> NamespaceRequest {
    NamespaceRequest { name: name.into() }
}

fn propose(namespace: &str, command: Command) -> ProposeRequest {
    let u = Update {
        namespace: namespace.into(),
        command: Some(command),
        ..Default::default()
    };
    ProposeRequest {
        update: u.encode_to_vec().into(),
    }
}

fn put_secret() -> Command {
    Command::from(KvInsert {
        key: "secret".into(),
        value: SECRET.to_vec().into(),
        allow_overwrite: true,
    })
}

fn reset_job() -> Command {
    Command::ResetJobEpoch(ResetJobEpoch {
        service_incarnation: 7,
        config: None,
    })
}

/// `msg` marked as forwarded by a node, as a client can set it.
fn forwarded<T>(msg: T) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    req.metadata_mut()
        .insert("x-coordstore-forwarded", "1".parse().unwrap());
    req
}

/// A refusal of a cluster verb: PERMISSION_DENIED naming the verb and the
/// certificate's name.
#[track_caller]
fn refused_verb<T: std::fmt::Debug>(r: Result<T, Status>, verb: &str, cert_name: &str) {
    let e = r.expect_err(verb);
    assert_eq!(e.code(), Code::PermissionDenied, "{verb}: {e:?}");
    assert!(
        e.message().contains(verb) && e.message().contains(cert_name),
        "{verb}: the refusal names neither the verb nor the certificate: {e:?}"
    );
}

/// A refusal by a namespace's allow-list: PERMISSION_DENIED naming the
/// namespace.
#[track_caller]
fn refused_entry<T: std::fmt::Debug>(r: Result<T, Status>, namespace: &str, what: &str) {
    let e = r.expect_err(what);
    assert_eq!(e.code(), Code::PermissionDenied, "{what}: {e:?}");
    assert!(
        e.message()
            .contains(&format!("namespace {namespace} does not admit")),
        "{what}: {e:?}"
    );
}

/// What must not change in the victim namespace: its whole description
/// (tasks, keys, bytes, epoch, incarnation, settings) and its secret.
#[derive(Debug, PartialEq)]
struct Victim {
    info: NamespaceInfo,
    secret: Option<Vec<u8>>,
}

async fn victim(admin: &mut NodeClient<Channel>, name: &str) -> Victim {
    let mut info = admin
        .get_namespace(named(name))
        .await
        .expect("the victim exists")
        .into_inner();
    info.parked_calls = 0;
    let got = admin
        .kv_get(in_ns(
            name,
            KvGetRequest {
                key: "secret".into(),
            },
        ))
        .await
        .unwrap()
        .into_inner();
    Victim {
        info,
        secret: got.found.then_some(got.value.to_vec()),
    }
}

fn names(list: Vec<NamespaceInfo>) -> Vec<String> {
    list.into_iter().map(|n| n.name).collect()
}

/// One node, namespaces `a` (job A's) and `b` (job B's, holding a secret):
/// every verb through the raw Node API as another job, as the namespace's
/// own job and as the admin.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_jobs_certificate_runs_no_cluster_verb_and_sees_only_what_admits_it() {
    let certs = Certs::new();
    let (cluster, _) = pki::cluster(&certs.node_flags(&["ops-*"]), 1, &[]);
    let addr = cluster.nodes[0].addr.clone();
    wait_leader(std::slice::from_ref(&addr), &[0], &certs.tls(&certs.ops)).await;
    let mut admin = node_as(&certs, &addr, &certs.ops).await;
    let mut job_a = node_as(&certs, &addr, &certs.job_a).await;
    let mut job_b = node_as(&certs, &addr, &certs.job_b).await;
    admin.create_namespace(create("a", "job-a")).await.unwrap();
    admin
        .create_namespace(create("b", "job-b.fleet.example"))
        .await
        .unwrap();
    job_b
        .propose(propose("b", put_secret()))
        .await
        .expect("job B writes into its namespace");
    let before = victim(&mut admin, "b").await;
    assert_eq!(before.secret.as_deref(), Some(SECRET));
    let export_a = admin
        .export_namespace(named("a"))
        .await
        .unwrap()
        .into_inner()
        .file;

    // Job A, against B and the cluster: every attempt refused, B intact
    // after each.
    let import = |name: &str| ImportNamespaceRequest {
        name: name.into(),
        file: export_a.clone(),
        port: 0,
    };
    refused_verb(
        job_a.create_namespace(create("c", "job-a")).await,
        "namespace create",
        "job-a",
    );
    refused_verb(
        job_a.export_namespace(named("b")).await,
        "namespace export",
        "job-a",
    );
    refused_verb(
        job_a.import_namespace(import("b2")).await,
        "namespace import",
        "job-a",
    );
    let reset = ResetNamespaceRequest {
        name: "b".into(),
        tasks: 0,
    };
    refused_verb(
        job_a.reset_namespace(reset.clone()).await,
        "namespace reset",
        "job-a",
    );
    refused_verb(
        job_a.delete_namespace(named("b")).await,
        "namespace delete",
        "job-a",
    );
    refused_verb(
        job_a.state(StateRequest::default()).await,
        "snapshot save",
        "job-a",
    );
    refused_verb(
        job_a.propose(propose("", reset_job())).await,
        "reset-job",
        "job-a",
    );
    refused_verb(
        job_a.propose(propose("b", reset_job())).await,
        "reset-job",
        "job-a",
    );
    refused_verb(
        job_a.remove_member(RemoveMemberRequest { id: 9 }).await,
        "member remove",
        "job-a",
    );
    refused_entry(job_a.get_namespace(named("b")).await, "b", "ns get");
    let state_b = StateRequest {
        namespace: "b".into(),
    };
    refused_entry(job_a.state(state_b.clone()).await, "b", "tasks");
    let get = KvGetRequest {
        key: "secret".into(),
    };
    refused_entry(job_a.kv_get(in_ns("b", get.clone())).await, "b", "kv get");
    let list = KvListRequest {
        prefix: String::new(),
        limit: 0,
        ..Default::default()
    };
    refused_entry(job_a.kv_list(in_ns("b", list.clone())).await, "b", "kv ls");
    refused_entry(
        job_a.propose(propose("b", put_secret())).await,
        "b",
        "kv put",
    );
    assert_eq!(victim(&mut admin, "b").await, before, "a refusal changed b");
    assert_eq!(
        names(
            admin
                .list_namespaces(ListNamespacesRequest {})
                .await
                .unwrap()
                .into_inner()
                .namespaces
        ),
        ["default", "a", "b"]
    );
    let seen_by_a = job_a.list_namespaces(ListNamespacesRequest {}).await;
    assert_eq!(
        names(seen_by_a.unwrap().into_inner().namespaces),
        ["default", "a"]
    );
    // The status is open to every client the TLS layer admits.
    job_a.status(StatusRequest {}).await.unwrap();

    // Job B in its own namespace: its views, its data; no cluster verb,
    // not even on its own namespace.
    assert_eq!(
        job_b
            .get_namespace(named("b"))
            .await
            .unwrap()
            .into_inner()
            .keys,
        1
    );
    let mine = job_b.state(state_b.clone()).await.unwrap().into_inner();
    let mine = journal::State::decode_snapshot(&mine.snapshot).unwrap();
    assert!(mine.namespace("a").is_none(), "b's view holds a");
    assert_eq!(
        mine.namespace("b")
            .unwrap()
            .coordination()
            .kv_get("secret")
            .map(|v| v.to_vec()),
        Some(SECRET.to_vec())
    );
    let got = job_b.kv_get(in_ns("b", get.clone())).await.unwrap();
    assert_eq!(got.into_inner().value.as_ref(), SECRET);
    assert_eq!(
        job_b
            .kv_list(in_ns("b", list))
            .await
            .unwrap()
            .into_inner()
            .entries
            .len(),
        1
    );
    let seen_by_b = job_b.list_namespaces(ListNamespacesRequest {}).await;
    assert_eq!(
        names(seen_by_b.unwrap().into_inner().namespaces),
        ["default", "b"]
    );
    refused_verb(
        job_b.export_namespace(named("b")).await,
        "namespace export",
        "job-b.fleet.example",
    );
    refused_verb(
        job_b.reset_namespace(reset.clone()).await,
        "namespace reset",
        "trainer",
    );
    refused_verb(
        job_b.delete_namespace(named("b")).await,
        "namespace delete",
        "trainer",
    );
    refused_verb(
        job_b.propose(propose("b", reset_job())).await,
        "reset-job",
        "trainer",
    );
    assert_eq!(victim(&mut admin, "b").await, before, "a refusal changed b");

    // The admin: every view of every namespace, and every verb.
    let as_admin = admin.state(state_b).await.unwrap().into_inner();
    assert!(journal::State::decode_snapshot(&as_admin.snapshot).is_ok());
    let whole = admin
        .state(StateRequest::default())
        .await
        .unwrap()
        .into_inner();
    let whole = journal::State::decode_snapshot(&whole.snapshot).unwrap();
    assert_eq!(whole.namespace_count(), 3);
    admin.propose(propose("", reset_job())).await.unwrap();
    let file = admin
        .export_namespace(named("b"))
        .await
        .unwrap()
        .into_inner()
        .file;
    assert!(file.windows(SECRET.len()).any(|w| w == SECRET));
    admin.import_namespace(import("a2")).await.unwrap();
    admin.create_namespace(create("c", "job-a")).await.unwrap();
    let epoch = admin
        .reset_namespace(reset)
        .await
        .unwrap()
        .into_inner()
        .epoch;
    assert_eq!(epoch, before.info.epoch + 1);
    admin.delete_namespace(named("b")).await.unwrap();
    assert_eq!(
        names(
            admin
                .list_namespaces(ListNamespacesRequest {})
                .await
                .unwrap()
                .into_inner()
                .namespaces
        ),
        ["default", "a", "a2", "c"]
    );
}

/// Runs `coordstore ctl` against `addr` as `who` in `namespace` (if any).
async fn ctl(
    certs: &Certs,
    addr: &str,
    who: &Leaf,
    namespace: Option<&str>,
    verb: &[&str],
) -> (bool, String, String) {
    let mut args: Vec<String> = vec!["ctl".into(), "--endpoint".into(), addr.into()];
    args.extend(certs.ctl_tls(who));
    if let Some(n) = namespace {
        args.extend(["--namespace".to_string(), n.to_string()]);
    }
    args.extend(verb.iter().map(|v| v.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    coordstore_cli(&args).await
}

/// The scenario as an operator tries it with `ctl`: job A's certificate is
/// refused every verb on job B's namespace and every cluster verb; the
/// admin's runs all of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn through_ctl_only_the_admin_exports_resets_or_deletes_another_jobs_namespace() {
    let certs = Certs::new();
    let (cluster, _) = pki::cluster(&certs.node_flags(&["ops-alice"]), 1, &[]);
    let addr = cluster.nodes[0].addr.clone();
    wait_leader(std::slice::from_ref(&addr), &[0], &certs.tls(&certs.ops)).await;
    let (ops, a, b) = (&certs.ops, &certs.job_a, &certs.job_b);
    for (name, allow) in [("a", "job-a"), ("b", "job-b.fleet.example")] {
        let created = ctl(
            &certs,
            &addr,
            ops,
            None,
            &[
                "ns",
                "create",
                name,
                "--tasks",
                "2",
                "--allow-client-name",
                allow,
            ],
        )
        .await;
        assert!(created.0, "{created:?}");
    }
    let put = ctl(
        &certs,
        &addr,
        b,
        Some("b"),
        &["kv", "put", "secret", "b's secret"],
    )
    .await;
    assert!(put.0, "{put:?}");
    let mut admin = node_as(&certs, &addr, ops).await;
    let before = victim(&mut admin, "b").await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("b.export");
    let backup = dir.path().join("backup.csb");
    let (f, backup_file) = (s(&file), s(&backup));

    // Job A: nothing on B, no cluster verb; B unchanged after each.
    let refused: Vec<(Option<&str>, Vec<&str>)> = vec![
        (None, vec!["ns", "export", "b", &f]),
        (None, vec!["ns", "get", "b"]),
        (None, vec!["ns", "reset", "b"]),
        (None, vec!["ns", "delete", "b"]),
        (None, vec!["ns", "create", "c", "--tasks", "1"]),
        (Some("b"), vec!["kv", "get", "secret"]),
        (Some("b"), vec!["kv", "ls"]),
        (Some("b"), vec!["kv", "put", "secret", "overwritten"]),
        (Some("b"), vec!["tasks"]),
        (Some("b"), vec!["barriers"]),
        (Some("b"), vec!["torch"]),
        (Some("b"), vec!["tfdata", "jobs"]),
        (Some("b"), vec!["reset-job"]),
        (None, vec!["reset-job"]),
        (None, vec!["snapshot", "save", &backup_file]),
        (None, vec!["member", "remove", "9"]),
    ];
    for (namespace, verb) in &refused {
        let (ok, out, err) = ctl(&certs, &addr, a, *namespace, verb).await;
        assert!(!ok, "job A ran {verb:?} in {namespace:?}: {out}");
        assert!(err.contains("PERMISSION_DENIED: "), "{verb:?}: {err}");
        assert!(
            err.contains("job-a"),
            "{verb:?} does not name the certificate: {err}"
        );
        assert_eq!(victim(&mut admin, "b").await, before, "{verb:?} changed b");
    }
    assert!(
        !file.exists() && !backup.exists(),
        "a refused verb wrote a file"
    );
    let (ok, out, err) = ctl(&certs, &addr, a, None, &["ns", "ls"]).await;
    assert!(ok, "{err}");
    let listed: Vec<serde_json::Value> = serde_json::from_str(&out).unwrap();
    let listed: Vec<&str> = listed.iter().map(|n| n["name"].as_str().unwrap()).collect();
    assert_eq!(listed, ["default", "a"]);
    // Its own namespace's views and data, yes.
    for verb in [
        vec!["tasks"],
        vec!["barriers"],
        vec!["torch"],
        vec!["kv", "ls"],
        vec!["tfdata", "workers"],
    ] {
        let (ok, _, err) = ctl(&certs, &addr, a, Some("a"), &verb).await;
        assert!(ok, "job A in its own namespace, {verb:?}: {err}");
    }

    // The admin: all of it.
    let ran: Vec<(Option<&str>, Vec<&str>)> = vec![
        (None, vec!["ns", "ls"]),
        (None, vec!["ns", "get", "b"]),
        (Some("b"), vec!["kv", "get", "secret"]),
        (Some("b"), vec!["tasks"]),
        (Some("b"), vec!["barriers"]),
        (Some("b"), vec!["torch"]),
        (Some("b"), vec!["tfdata", "jobs"]),
        (None, vec!["ns", "export", "b", &f]),
        (None, vec!["ns", "import", &f, "--as", "b2"]),
        (None, vec!["snapshot", "save", &backup_file]),
        (None, vec!["reset-job"]),
        (Some("b"), vec!["reset-job", "--tasks", "3"]),
        (None, vec!["ns", "reset", "b"]),
        (None, vec!["ns", "create", "c", "--tasks", "1"]),
        (None, vec!["ns", "delete", "b"]),
    ];
    for (namespace, verb) in &ran {
        let (ok, out, err) = ctl(&certs, &addr, ops, *namespace, verb).await;
        assert!(
            ok,
            "the admin could not run {verb:?} in {namespace:?}: {err}"
        );
        if verb[..] == ["kv", "get", "secret"] {
            assert_eq!(out.trim_end_matches('\n').as_bytes(), SECRET);
        }
    }
    assert!(file.exists() && backup.exists());
    let (_, out, _) = ctl(&certs, &addr, ops, None, &["ns", "ls"]).await;
    let listed: Vec<serde_json::Value> = serde_json::from_str(&out).unwrap();
    let listed: Vec<&str> = listed.iter().map(|n| n["name"].as_str().unwrap()).collect();
    assert_eq!(listed, ["default", "a", "b2", "c"]);
}

/// Three nodes: a job's create or delete sent to a follower is refused
/// there, and one sent to the leader marked as forwarded is refused too (a
/// forward is trusted only on the peer port); the admin's, through the
/// follower, is forwarded and runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_follower_that_forwards_a_create_or_delete_makes_no_job_an_admin() {
    let certs = Certs::new();
    let (cluster, _) = pki::cluster(&certs.node_flags(&["ops-*"]), 3, &[]);
    let addrs = cluster.addrs();
    let leader = wait_leader(&addrs, &[0, 1, 2], &certs.tls(&certs.ops)).await;
    let follower = (leader + 1) % 3;
    let mut admin_at_follower = node_as(&certs, &addrs[follower], &certs.ops).await;
    let mut job_at_follower = node_as(&certs, &addrs[follower], &certs.job_a).await;
    let mut job_at_leader = node_as(&certs, &addrs[leader], &certs.job_a).await;

    refused_verb(
        job_at_follower.create_namespace(create("c", "job-a")).await,
        "namespace create",
        "job-a",
    );
    refused_verb(
        job_at_follower
            .create_namespace(forwarded(create("c", "job-a")))
            .await,
        "namespace create",
        "job-a",
    );
    refused_verb(
        job_at_leader
            .create_namespace(forwarded(create("c", "job-a")))
            .await,
        "namespace create",
        "job-a",
    );
    let mut admin_at_leader = node_as(&certs, &addrs[leader], &certs.ops).await;
    let list = |c: &mut NodeClient<Channel>| {
        let mut c = c.clone();
        async move {
            names(
                c.list_namespaces(ListNamespacesRequest {})
                    .await
                    .unwrap()
                    .into_inner()
                    .namespaces,
            )
        }
    };
    assert_eq!(list(&mut admin_at_leader).await, ["default"]);

    admin_at_follower
        .create_namespace(create("c", "job-b.fleet.example"))
        .await
        .expect("the admin's create, forwarded by the follower");
    admin_at_follower
        .propose(propose("c", put_secret()))
        .await
        .unwrap();
    let before = victim(&mut admin_at_leader, "c").await;
    refused_verb(
        job_at_follower.delete_namespace(named("c")).await,
        "namespace delete",
        "job-a",
    );
    refused_verb(
        job_at_leader.delete_namespace(forwarded(named("c"))).await,
        "namespace delete",
        "job-a",
    );
    refused_verb(
        job_at_follower
            .export_namespace(forwarded(named("c")))
            .await,
        "namespace export",
        "job-a",
    );
    assert_eq!(victim(&mut admin_at_leader, "c").await, before);
    admin_at_follower
        .delete_namespace(named("c"))
        .await
        .expect("the admin's delete, forwarded by the follower");
    // Every node has applied the delete, and nothing else.
    pki::wait_converged(&addrs, &certs.tls(&certs.ops)).await;
    assert_eq!(list(&mut admin_at_leader).await, ["default"]);
}

/// With mutual TLS and no `--admin-client-name`, no client runs a cluster
/// verb — the node says so at start — while the data verbs go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_mutual_tls_and_no_admin_named_no_client_runs_a_cluster_verb() {
    let certs = Certs::new();
    let (cluster, _) = pki::cluster(&certs.node_flags(&[]), 1, &[]);
    let addr = cluster.nodes[0].addr.clone();
    wait_leader(std::slice::from_ref(&addr), &[0], &certs.tls(&certs.ops)).await;
    wait("the node to say it names no admin", WAIT)
        .context(|| cluster.logs())
        .until(|| async {
            holds(
                cluster.nodes[0].log().contains("no --admin-client-name"),
                || (),
            )
        })
        .await;
    let mut ops = node_as(&certs, &addr, &certs.ops).await;
    let e = ops
        .create_namespace(create("c", "job-a"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);
    assert!(e.message().contains("names no admin"), "{e:?}");
    refused_verb(
        ops.state(StateRequest::default()).await,
        "snapshot save",
        "ops-alice",
    );
    refused_verb(
        ops.propose(propose("", reset_job())).await,
        "reset-job",
        "ops-alice",
    );
    ops.propose(propose("", put_secret()))
        .await
        .expect("the data verbs go on");
    let got = ops
        .kv_get(KvGetRequest {
            key: "secret".into(),
        })
        .await
        .unwrap();
    assert_eq!(got.into_inner().value.as_ref(), SECRET);
    assert_eq!(
        names(
            ops.list_namespaces(ListNamespacesRequest {})
                .await
                .unwrap()
                .into_inner()
                .namespaces
        ),
        ["default"]
    );
}

/// `--admin-client-name` names certificates: without client certificates
/// there are none, and the node refuses to start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_names_without_client_certificates_are_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d");
    let (ok, _, err) = coordstore_cli(&[
        "serve",
        "--data-dir",
        &s(&data),
        "--admin-client-name",
        "ops",
    ])
    .await;
    assert!(!ok);
    assert!(
        err.contains("--admin-client-name needs --tls-client-ca"),
        "{err}"
    );
}
