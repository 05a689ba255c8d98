//! TLS with real processes and certificates (rcgen): a 3-node cluster with
//! mutual TLS on the client port and on a separate peer port, served through
//! a leader kill, with every wrong certificate refused (clients without
//! one, clients and peers of another CA, a node restarted with a foreign
//! peer certificate); stock jaxlib 0.12 dialing with its own mTLS options,
//! and through the relay as the TLS end on the client's host.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use agent::{Agent, AgentConfig};
use coordstore_tests::jax::PyProc;
use coordstore_tests::pki::{dial, status, wait_leader, Ca, Leaf, Pki};
use coordstore_tests::wait::{eventually, holds};
use coordstore_tests::{coordstore_bin, free_port, Cluster, NodeProc};
use proto::coordstore::node_client::NodeClient;
use proto::coordstore::raft_peer_client::RaftPeerClient;
use proto::coordstore::RaftPayload;
use tonic::transport::{Channel, ClientTlsConfig};

const WAIT: Duration = Duration::from_secs(60);

fn s(p: &Path) -> String {
    p.display().to_string()
}

/// The cluster's certificates, a good client's, and a rogue CA with a
/// client and a peer certificate of its own.
struct Certs {
    pki: Pki,
    client: Leaf,
    rogue_client: Leaf,
    rogue_peer: Leaf,
    rogue: Ca,
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
        let rogue = Ca::new(pki.dir.path(), "rogue");
        Certs {
            client: pki.client("client", &[]),
            rogue_client: rogue.issue("client", &[]),
            rogue_peer: rogue.issue("peer", &["127.0.0.1", "localhost"]),
            rogue,
            pki,
        }
    }

    /// What a good client dials with.
    fn client_tls(&self) -> ClientTlsConfig {
        self.tls(&self.client)
    }
}

/// Starts `n` TLS nodes, each with a peer port; returns the cluster and the
/// peer addresses.
fn tls_cluster(pki: &Pki, n: usize, extra: &[&str]) -> (Cluster, Vec<String>) {
    coordstore_tests::pki::cluster(&pki.node_flags(), n, extra)
}

fn agent(addrs: &[String], tls: ClientTlsConfig) -> Agent {
    let mut cfg = AgentConfig::new(addrs.to_vec(), "jax_worker", 0);
    cfg.tls = Some(tls);
    Agent::new(cfg, Arc::new(|_| {})).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cluster_with_tls_everywhere_refuses_every_wrong_certificate_and_fails_over() {
    let pki = Certs::new();
    let (mut cluster, peers) = tls_cluster(&pki, 3, &[]);
    let addrs = cluster.addrs();
    let good = pki.client_tls();
    let leader = wait_leader(&addrs, &[0, 1, 2], &good).await;

    // The Rust agent dials TLS and presents its certificate.
    let a = agent(&addrs, good.clone());
    a.connect().await.expect("agent connect over TLS");
    a.insert_key_value("a", "1").await.unwrap();
    assert_eq!(&a.get_key_value("a").await.unwrap()[..], b"1");

    // So does ctl.
    let out = tokio::process::Command::new(coordstore_bin())
        .args(["ctl", "--endpoint", &addrs[(leader + 1) % 3]])
        .args(["--tls-ca", &s(&pki.servers.cert)])
        .args(["--tls-cert", &s(&pki.client.cert)])
        .args(["--tls-key", &s(&pki.client.key), "status"])
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let st: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(st["leader_id"].as_u64(), Some(leader as u64 + 1));

    // The client port: plaintext, no certificate, a certificate of another
    // CA, and a server the client does not trust are all refused.
    let addr = &addrs[0];
    let plain = status(addr, None).await;
    assert!(plain.is_err(), "plaintext got through: {plain:?}");
    let anonymous = proto::tls::client(&pki.servers.cert, None).unwrap();
    let r = status(addr, Some(anonymous)).await;
    assert!(
        r.is_err(),
        "a client without a certificate got through: {r:?}"
    );
    let foreign = proto::tls::client(
        &pki.servers.cert,
        Some((&pki.rogue_client.cert, &pki.rogue_client.key)),
    )
    .unwrap();
    let r = status(addr, Some(foreign)).await;
    assert!(r.is_err(), "a client of another CA got through: {r:?}");
    let distrust =
        proto::tls::client(&pki.rogue.cert, Some((&pki.client.cert, &pki.client.key))).unwrap();
    let r = status(addr, Some(distrust)).await;
    assert!(r.is_err(), "a server of another CA was trusted: {r:?}");
    assert!(status(addr, Some(good.clone())).await.is_ok());

    // The peer port: only certificates of the peer CA get to the service
    // (an empty vote then fails to decode: INVALID_ARGUMENT, not transport).
    let peer_call = |cert: &Leaf| {
        let tls = proto::tls::client(&pki.peers.cert, Some((&cert.cert, &cert.key))).unwrap();
        let addr = peers[0].clone();
        async move {
            let ch = dial(&addr, tls).await?;
            RaftPeerClient::new(ch)
                .vote(RaftPayload::default())
                .await
                .map(|_| ())
                .map_err(|e| format!("{e:?}"))
        }
    };
    let r = peer_call(&pki.rogue_peer).await;
    assert!(
        r.is_err() && !r.as_ref().unwrap_err().contains("InvalidArgument"),
        "{r:?}"
    );
    let r = peer_call(&pki.client).await;
    assert!(
        r.is_err() && !r.as_ref().unwrap_err().contains("InvalidArgument"),
        "{r:?}"
    );
    let r = peer_call(&pki.peer).await;
    assert!(r.unwrap_err().contains("InvalidArgument"));

    // The leader dies; the agent's next write lands on the new one.
    cluster.kill(leader);
    let rest: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    let new_leader = wait_leader(&addrs, &rest, &good).await;
    a.insert_key_value("b", "2").await.unwrap();
    assert_eq!(&a.get_key_value("a").await.unwrap()[..], b"1");
    assert_eq!(&a.get_key_value("b").await.unwrap()[..], b"2");
    let before = status(&addrs[new_leader], Some(good.clone()))
        .await
        .unwrap();

    // The old leader comes back with a peer certificate of another CA: it
    // can neither hear the leader nor win a vote. It campaigns in vain (its
    // term climbs) while the cluster's term stays where it was, and it
    // never gets "b".
    cluster.nodes[leader].set_arg("--peer-tls-cert", &s(&pki.rogue_peer.cert));
    cluster.nodes[leader].set_arg("--peer-tls-key", &s(&pki.rogue_peer.key));
    cluster.nodes[leader].set_arg("--peer-tls-ca", &s(&pki.rogue.cert));
    cluster.restart(leader);
    let rogue = eventually("the restarted node to campaign", WAIT, || async {
        match status(&addrs[leader], Some(good.clone())).await {
            Ok(st) if st.term >= before.term + 3 => Ok(st),
            other => Err(other),
        }
    })
    .await;
    let after = status(&addrs[new_leader], Some(good.clone()))
        .await
        .unwrap();
    assert_eq!(
        after.term, before.term,
        "a foreign peer's vote request got through"
    );
    assert_eq!(after.leader_id, before.leader_id);
    assert!(rogue.last_applied < before.last_applied);

    // With the right certificate again it rejoins and catches up.
    cluster.nodes[leader].set_arg("--peer-tls-cert", &s(&pki.peer.cert));
    cluster.nodes[leader].set_arg("--peer-tls-key", &s(&pki.peer.key));
    cluster.nodes[leader].set_arg("--peer-tls-ca", &s(&pki.peers.cert));
    cluster.restart(leader);
    eventually("the node to catch up", WAIT, || async {
        let st = status(&addrs[leader], Some(good.clone())).await;
        holds(
            st.as_ref()
                .is_ok_and(|st| st.last_applied >= before.last_applied && st.leader_id != 0),
            || st,
        )
    })
    .await;
}

#[test]
fn tls_flags_that_do_not_fit_together_are_refused_at_start() {
    let pki = Certs::new();
    let node = [s(&pki.node.cert), s(&pki.node.key)];
    for (args, want) in [
        (
            vec!["--tls-cert", &node[0]],
            "--tls-cert and --tls-key go together",
        ),
        (
            vec!["--tls-cert", &node[0], "--tls-key", &node[1]],
            "peer links need a port of their own",
        ),
        (
            vec!["--tls-client-ca", &node[0]],
            "--tls-client-ca needs --tls-cert",
        ),
        (
            vec!["--peer-tls-cert", &node[0], "--peer-tls-key", &node[1]],
            "go together",
        ),
        (
            vec![
                "--tls-cert",
                "/nonexistent.pem",
                "--tls-key",
                &node[1],
                "--peer-listen",
                "127.0.0.1:1",
            ],
            "/nonexistent.pem",
        ),
        (
            vec![
                "--tls-cert",
                &node[1],
                "--tls-key",
                &node[1],
                "--peer-listen",
                "127.0.0.1:1",
                "--tls-client-ca",
                "/etc/hostname",
            ],
            "not a PEM file",
        ),
    ] {
        let out = std::process::Command::new(coordstore_bin())
            .arg("serve")
            .args(&args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
}

#[test]
fn stock_jaxlib_dials_mutual_tls_and_through_the_relay() {
    let pki = Certs::new();
    let (cluster, _) = tls_cluster(&pki, 1, &[]);
    let addr = cluster.nodes[0].addr.clone();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(wait_leader(
        std::slice::from_ref(&addr),
        &[0],
        &pki.client_tls(),
    ));
    let ops = |addr: &str, extra: &[String]| {
        let mut args: Vec<String> = [
            "ops",
            "--address",
            addr,
            "--node-id",
            "0",
            "--num-tasks",
            "1",
            "--deadline",
            "150",
            "--init-timeout",
            "20",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.extend(extra.iter().cloned());
        PyProc::spawn("jax_client.py", &args, cluster.dir.path())
    };
    // jaxlib's own mTLS options (verify_secure_credentials on).
    let mtls = vec![
        "--mtls-ca".to_string(),
        s(&pki.servers.cert),
        "--mtls-cert".into(),
        s(&pki.client.cert),
        "--mtls-key".into(),
        s(&pki.client.key),
    ];
    ops(&addr, &mtls).assert_passes("summary", Duration::from_secs(180), || cluster.logs());

    // Plaintext jaxlib against the TLS port gets nowhere.
    let mut plain = ops(&addr, &["--init-timeout".into(), "5".into()]);
    assert!(!plain.wait_exit(Duration::from_secs(120)).success());

    // The relay on the client's host as the TLS end: jaxlib dials it in
    // plaintext on loopback, the relay dials the node with a certificate.
    let relay_addr = format!("127.0.0.1:{}", free_port());
    let _relay = NodeProc::relay_with(
        &relay_addr,
        std::slice::from_ref(&addr),
        &[
            "--tls-ca".into(),
            s(&pki.servers.cert),
            "--tls-cert".into(),
            s(&pki.client.cert),
            "--tls-key".into(),
            s(&pki.client.key),
        ],
        cluster.dir.path(),
    );
    ops(&relay_addr, &["--namespace".into(), "via-relay".into()]).assert_passes(
        "summary",
        Duration::from_secs(180),
        || cluster.logs(),
    );
}

/// `--allow-client-name`: a namespace admits a call only if the client
/// certificate's subject CN or a SAN matches one of its patterns. Stock
/// jaxlib with job A's certificate runs on A's port and is refused on B's
/// (PERMISSION_DENIED, nothing changed); namespace ports serve the client
/// port's TLS.
#[test]
fn a_namespace_admits_only_the_client_certificates_it_names() {
    use proto::coordstore::{CreateNamespaceRequest, NamespaceRequest, NamespaceSettings};
    use proto::xla::coordination_service_client::CoordinationServiceClient;
    use proto::xla::RegisterTaskRequest;

    let pki = Certs::new();
    let job_a = pki.clients.issue("job-a-worker-0", &[]);
    let job_b = pki.clients.issue("someone", &["job-b.example"]);
    let (low, high) = coordstore_tests::free_port_range(&["127.0.0.1"], 2);
    let range = format!("{low}-{high}");
    // The operator's certificate runs the cluster verbs (creates).
    let operator = pki.clients.issue("ops", &[]);
    let (cluster, _) = tls_cluster(
        &pki,
        1,
        &[
            "--tasks",
            "1",
            "--namespace-ports",
            &range,
            "--admin-client-name",
            "ops",
        ],
    );
    let addr = cluster.nodes[0].addr.clone();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(wait_leader(
        std::slice::from_ref(&addr),
        &[0],
        &pki.client_tls(),
    ));
    let tls_as =
        |leaf: &Leaf| proto::tls::client(&pki.servers.cert, Some((&leaf.cert, &leaf.key))).unwrap();
    let mut node = NodeClient::new(rt.block_on(dial(&addr, tls_as(&operator))).unwrap());
    let mut create = |name: &str, allow: &str| {
        let req = CreateNamespaceRequest {
            name: name.into(),
            settings: Some(NamespaceSettings {
                tasks: 1,
                allow_client_names: vec![allow.into()],
                ..Default::default()
            }),
        };
        rt.block_on(node.create_namespace(req))
            .unwrap()
            .into_inner()
    };
    let a = create("job-a", "job-a-*");
    let b = create("job-b", "job-b.example");
    let (port_a, port_b) = (
        format!("127.0.0.1:{}", a.port),
        format!("127.0.0.1:{}", b.port),
    );

    // Exact status, by a gRPC client of the xla dialect.
    let register = |at: &str, leaf: &Leaf| {
        let ch = rt.block_on(dial(at, tls_as(leaf))).unwrap();
        let mut c = CoordinationServiceClient::new(ch);
        rt.block_on(c.register_task(RegisterTaskRequest {
            incarnation: 1,
            source_task_id: 0,
        }))
    };
    let e = register(&port_b, &job_a).unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    assert!(
        e.message().contains("job-b") && e.message().contains("job-a-worker-0"),
        "{e:?}"
    );
    let e = register(&port_a, &pki.client).unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    let get = |node: &mut NodeClient<Channel>, name: &str| {
        let req = NamespaceRequest { name: name.into() };
        rt.block_on(node.get_namespace(req)).unwrap().into_inner()
    };
    let b_info = get(&mut node, "job-b");
    assert_eq!(
        (b_info.tasks_connected, b_info.keys),
        (0, 0),
        "a refused call changed B"
    );
    // B's certificate (by its SAN) on B's port.
    register(&port_b, &job_b).expect("B's certificate on B's port");

    // Stock jaxlib with jaxlib's own mTLS options.
    let ops = |at: &str, leaf: &Leaf| {
        let args: Vec<String> = [
            "ops",
            "--address",
            at,
            "--node-id",
            "0",
            "--num-tasks",
            "1",
            "--deadline",
            "150",
            "--init-timeout",
            "20",
            "--mtls-ca",
            &s(&pki.servers.cert),
            "--mtls-cert",
            &s(&leaf.cert),
            "--mtls-key",
            &s(&leaf.key),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        PyProc::spawn("jax_client.py", &args, cluster.dir.path())
    };
    ops(&port_a, &job_a).assert_passes("summary", Duration::from_secs(180), || cluster.logs());
    let mut refused = ops(&port_b, &job_a);
    assert!(!refused.wait_exit(Duration::from_secs(120)).success());
    // jaxlib ends the process at once on the refused registration.
    let report = refused.report();
    assert!(
        report.contains("PERMISSION_DENIED: namespace job-b does not admit this client"),
        "{report}"
    );
    let b_after = get(&mut node, "job-b");
    assert_eq!((b_after.tasks_connected, b_after.keys), (1, 0));
}

/// torch's TCPStore client has no TLS: on a TLS port its plaintext
/// connection is closed unanswered, unless the operator allows it
/// (`--torch-plaintext`); the relay on the client's host is the way in
/// with mutual TLS upstream and nothing allowed.
#[test]
fn a_plaintext_torch_connection_needs_leave_on_a_tls_port_and_the_relay_needs_none() {
    use agent::torch::StoreClient;

    let pki = Certs::new();
    let (mut cluster, _) = tls_cluster(&pki, 1, &[]);
    let addr = cluster.nodes[0].addr.clone();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let tls = pki.client_tls();
    rt.block_on(wait_leader(std::slice::from_ref(&addr), &[0], &tls));
    let refused = rt.block_on(StoreClient::connect(&addr, 1));
    assert!(
        refused.is_err(),
        "a plaintext TCPStore handshake was answered"
    );

    let relay_addr = format!("127.0.0.1:{}", free_port());
    let _relay = NodeProc::relay_with(
        &relay_addr,
        std::slice::from_ref(&addr),
        &[
            "--tls-ca".into(),
            s(&pki.servers.cert),
            "--tls-cert".into(),
            s(&pki.client.cert),
            "--tls-key".into(),
            s(&pki.client.key),
        ],
        cluster.dir.path(),
    );
    rt.block_on(async {
        let mut c = eventually(
            "the relay to take a TCPStore connection",
            Duration::from_secs(30),
            || StoreClient::connect(&relay_addr, 2),
        )
        .await;
        assert_eq!(c.add("/via-relay", 5).await.unwrap(), 5);
        c.set("/k", b"v").await.unwrap();
        assert_eq!(c.get("/k").await.unwrap().as_ref(), b"v");
    });

    // The operator's leave: the same client, dialing the node itself.
    cluster.nodes[0].stop(Duration::from_secs(20));
    cluster.nodes[0].set_arg("--torch-plaintext", "true");
    cluster.nodes[0].start();
    rt.block_on(wait_leader(std::slice::from_ref(&addr), &[0], &tls));
    rt.block_on(async {
        let mut c = StoreClient::connect(&addr, 3).await.unwrap();
        assert_eq!(c.add("/via-relay", 1).await.unwrap(), 6);
    });
}
