//! Every client port's listener (`service::wire::listener`): bound with a
//! deep accept queue, each connection held to the node's and the
//! namespace's bounds (refused at once past them, and counted), and every
//! TCPStore connection on a port ended when the port closes.

use std::time::{Duration, Instant};

use agent::torch::StoreClient;
use coordstore_tests::wait::{holds, wait};
use coordstore_tests::{
    connect, free_port, http_get, listen_overflows, metric_sample, node_host, ns, Cluster,
};

const WAIT: Duration = Duration::from_secs(60);

/// The accept queue `ss` reports for the listener on `port` (its Send-Q).
fn backlog(port: u16) -> Option<u32> {
    let out = std::process::Command::new("ss")
        .args(["-Hltn", &format!("sport = :{port}")])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines().next()?.split_whitespace().nth(2)?.parse().ok()
}

fn port_of(addr: &str) -> u16 {
    addr.rsplit_once(':').unwrap().1.parse().unwrap()
}

/// The main, peer and namespace ports listen with an accept queue of
/// somaxconn (at least 4,096; tokio's default is 128, which dropped 78 of
/// 4,096 torch ranks' connects into a 1 s SYN retry), and 4,096 TCPStore
/// clients connecting at once all get their handshake answered, with no
/// overflow of the accept queue (no client waits out a SYN retry).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_port_listens_deep_and_4096_clients_connect_at_once() {
    let want = std::fs::read_to_string("/proc/sys/net/core/somaxconn")
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        .unwrap_or(4096)
        .min(4096);
    let host = node_host(0);
    let peer = format!("{host}:{}", free_port());
    let ns_port = free_port();
    let cluster = Cluster::start_at(
        &[format!("{host}:{}", free_port())],
        &["--peer-listen", &peer, "--advertise", &peer],
        |_| vec!["--cluster".into(), format!("1={peer}")],
    );
    let main = cluster.nodes[0].addr.clone();
    cluster.wait_leader(&[0], WAIT).await;
    let mut settings = ns::tasks(1);
    settings.port = u32::from(ns_port);
    ns::create(&main, "deep", settings).await.expect("create");
    ns::wait_serving(&cluster, "deep", WAIT).await;
    for (what, port) in [
        ("main", port_of(&main)),
        ("peer", port_of(&peer)),
        ("namespace", ns_port),
    ] {
        let got = backlog(port);
        assert!(
            got.is_some_and(|b| b >= want),
            "the {what} port's accept queue: {got:?}, want at least {want}"
        );
    }
    peer_calls_are_answered_on_the_peer_port_only(&main, &peer).await;
    let overflows = listen_overflows();
    let t0 = Instant::now();
    let connects = (0..4096u32).map(|i| {
        let addr = main.clone();
        tokio::spawn(async move {
            let t = Instant::now();
            let c = StoreClient::connect(&addr, i).await;
            (c.map(|_| ()).map_err(|e| e.to_string()), t.elapsed())
        })
    });
    let mut slowest = Duration::ZERO;
    let mut failed = Vec::new();
    for c in connects.collect::<Vec<_>>() {
        let (r, took) = c.await.expect("the connect task ran");
        slowest = slowest.max(took);
        if let Err(e) = r {
            failed.push(e);
        }
    }
    eprintln!(
        "4,096 TCPStore connects in {:?}, the slowest {slowest:?}",
        t0.elapsed()
    );
    assert!(
        failed.is_empty(),
        "{} failed, first: {:?}",
        failed.len(),
        failed.first()
    );
    // None of them waited out a SYN retry (the queue never overflowed).
    if let (Some(before), Some(after)) = (overflows, listen_overflows()) {
        assert_eq!(
            after, before,
            "accept-queue overflows while 4,096 connected"
        );
    }
}

/// A node-to-node call is answered on the peer port only, where a node's
/// peers have a port of their own: the client port does not serve NodePeer,
/// and refuses Node's method of the same name (which builds before NodePeer
/// call).
async fn peer_calls_are_answered_on_the_peer_port_only(main: &str, peer: &str) {
    use proto::coordstore::node_peer_client::NodePeerClient;
    use proto::coordstore::ReadIndexRequest;
    let channel = |addr: &str| {
        tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .expect("endpoint")
            .connect_lazy()
    };
    let on_main = NodePeerClient::new(channel(main))
        .read_index(ReadIndexRequest {})
        .await;
    assert_eq!(
        on_main.as_ref().map_err(tonic::Status::code).err(),
        Some(tonic::Code::Unimplemented),
        "NodePeer on the client port: {on_main:?}"
    );
    let legacy = connect(main, WAIT)
        .await
        .read_index(ReadIndexRequest {})
        .await;
    assert_eq!(
        legacy.as_ref().map_err(tonic::Status::code).err(),
        Some(tonic::Code::PermissionDenied),
        "Node's ReadIndex on the client port: {legacy:?}"
    );
    NodePeerClient::new(channel(peer))
        .read_index(ReadIndexRequest {})
        .await
        .expect("NodePeer on the peer port");
    connect(peer, WAIT)
        .await
        .read_index(ReadIndexRequest {})
        .await
        .expect("Node's ReadIndex on the peer port");
}

/// On a node whose peers share its one port, a node-to-node call is
/// admitted as it was before NodePeer: a read index to anyone who reached
/// the port, a heartbeat only into a namespace that exists (and admits the
/// caller), never passed through on the strength of being "a peer's".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_one_port_a_peer_call_is_admitted_as_a_clients_would_be() {
    use proto::coordstore::{HeartbeatRequest, ReadIndexRequest};
    let cluster = Cluster::start(1, &[]);
    let addr = cluster.nodes[0].addr.clone();
    cluster.wait_leader(&[0], WAIT).await;
    let mut c = connect(&addr, WAIT).await;
    c.read_index(ReadIndexRequest {})
        .await
        .expect("a read index on the shared port");
    let mut hb = tonic::Request::new(HeartbeatRequest {
        task: 0,
        incarnation: 1,
    });
    hb.metadata_mut()
        .insert("x-coordstore-namespace", "nope".parse().unwrap());
    let got = c.heartbeat(hb).await;
    assert_eq!(
        got.as_ref().map_err(tonic::Status::code).err(),
        Some(tonic::Code::NotFound),
        "a heartbeat into a namespace that does not exist: {got:?}"
    );
}

/// The connections the node whose metrics listen at `metrics` holds, and
/// those it refused past its own bound.
fn connections(metrics: &str) -> (Option<f64>, Option<f64>) {
    let text = http_get(metrics, "/metrics")
        .map(|(_, t)| t)
        .unwrap_or_default();
    (
        metric_sample(&text, "coordstore_connections"),
        metric_sample(
            &text,
            "coordstore_connections_refused_total{bound=\"node\"}",
        ),
    )
}

/// Past the node's bound (`--max-connections`) and a namespace's
/// (`--max-connections-per-namespace`) a connection is closed at once,
/// counted in the metrics; a place given back is taken again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_past_a_bound_is_closed_at_once_and_counted() {
    let metrics = format!("127.0.0.1:{}", free_port());
    let cluster = Cluster::start(1, &["--max-connections", "3", "--metrics-listen", &metrics]);
    let addr = cluster.nodes[0].addr.clone();
    cluster.wait_leader(&[0], WAIT).await;
    // wait_leader's own gRPC connections are gone once it returns; wait
    // until the node holds none.
    let open = || connections(&metrics);
    wait("no connection open", WAIT)
        .until(|| async { holds(open().0 == Some(0.0), open) })
        .await;
    let mut held = Vec::new();
    for i in 0..3 {
        held.push(
            StoreClient::connect(&addr, i)
                .await
                .expect("within the bound"),
        );
    }
    let refused = StoreClient::connect(&addr, 9).await;
    assert!(refused.is_err(), "a fourth connection was served");
    wait("the refusal counted", WAIT)
        .until(|| async { holds(open() == (Some(3.0), Some(1.0)), open) })
        .await;
    held.pop();
    wait("the place given back", WAIT)
        .until(|| async {
            let again = StoreClient::connect(&addr, 10).await;
            holds(again.is_ok(), || again.err().map(|e| e.to_string()))
        })
        .await;
    drop(cluster);
    // Per namespace: the default namespace's bound on the main port.
    let metrics = format!("127.0.0.1:{}", free_port());
    let cluster = Cluster::start(
        1,
        &[
            "--max-connections-per-namespace",
            "2",
            "--metrics-listen",
            &metrics,
        ],
    );
    let addr = cluster.nodes[0].addr.clone();
    cluster.wait_leader(&[0], WAIT).await;
    let open = || connections(&metrics);
    wait("wait_leader's connections gone", WAIT)
        .until(|| async { holds(open().0 == Some(0.0), open) })
        .await;
    let a = StoreClient::connect(&addr, 1).await.expect("first");
    let b = StoreClient::connect(&addr, 2).await.expect("second");
    assert!(
        StoreClient::connect(&addr, 3).await.is_err(),
        "a third in the namespace"
    );
    let log = cluster.nodes[0].log();
    assert!(
        log.contains("--max-connections-per-namespace 2"),
        "the refusal names the bound:\n{log}"
    );
    drop((a, b));
}

/// A namespace deleted closes its port: the TCPStore connections on it end
/// (the client sees its connection closed) instead of lingering.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tcpstore_connections_of_a_closed_port_end() {
    let cluster = Cluster::start_hosts(1, &[]);
    let main = cluster.nodes[0].addr.clone();
    cluster.wait_leader(&[0], WAIT).await;
    let mut settings = ns::tasks(1);
    settings.port = u32::from(free_port());
    ns::create(&main, "brief", settings).await.expect("create");
    let info = ns::wait_serving(&cluster, "brief", WAIT).await;
    let mut c = StoreClient::connect(&ns::addr(&cluster, 0, &info), 1)
        .await
        .expect("connected on the namespace's port");
    ns::delete(&main, "brief").await.expect("delete");
    tokio::time::timeout(WAIT, c.closed())
        .await
        .expect("the connection ended with its port")
        .expect("closed, not broken");
}
