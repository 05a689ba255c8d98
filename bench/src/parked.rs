//! `parked`: KV put throughput (64 clients, 256-byte values) while N
//! blocking gets are parked on the node (xla.coordination GetKeyValue of
//! keys nobody writes), against the same load with none parked, on one
//! coordstore node. Target: 10,000 parked gets cost at most 10% of the
//! write throughput (parked gets wake per key, not on every write).

use std::time::Duration;

use coordstore_tests::wait::eventually;
use proto::xla::coordination_service_client::CoordinationServiceClient;
use proto::xla::{GetKeyValueRequest, Incarnations};

use crate::kv::{self, KvRow};
use crate::peers::{channel, Peer, PeerKind};

/// Gets parked per connection (well under HTTP/2's stream limits).
const GETS_PER_CONNECTION: usize = 100;

/// One measured configuration.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct ParkedRow {
    /// Peer name.
    pub peer: String,
    /// Blocking gets parked during the load.
    pub parked: usize,
    /// The put load.
    pub put: KvRow,
}

/// Runs the suite on the coordstore peers among `peers`.
pub async fn run(
    peers: &[PeerKind],
    parked: &[usize],
    clients: usize,
    seconds: f64,
) -> anyhow::Result<Vec<ParkedRow>> {
    let mut rows = Vec::new();
    for &kind in peers
        .iter()
        .filter(|k| matches!(k, PeerKind::Coordstore1 | PeerKind::Coordstore3))
    {
        eprintln!("parked: starting {}", kind.name());
        let peer = Peer::start(kind, 1).await?;
        let addr = peer.leader_addr().await?;
        for &n in parked {
            eprintln!(
                "parked: {} put, {clients} clients, {n} parked gets",
                kind.name()
            );
            let gets = park(&peer, &addr, n).await?;
            let put = kv::load_put(&peer, &addr, clients, seconds, 256).await?;
            for g in gets {
                g.abort();
            }
            rows.push(ParkedRow {
                peer: kind.name().into(),
                parked: n,
                put,
            });
        }
    }
    Ok(rows)
}

/// Parks `n` blocking gets at `addr` and waits until the node counts them.
async fn park(
    peer: &Peer,
    addr: &str,
    n: usize,
) -> anyhow::Result<Vec<tokio::task::JoinHandle<()>>> {
    park_by(peer, addr, n, GETS_PER_CONNECTION).await
}

/// Parks `n` blocking gets at `addr`, `per_conn` on each connection, and
/// waits until the node counts them.
async fn park_by(
    peer: &Peer,
    addr: &str,
    n: usize,
    per_conn: usize,
) -> anyhow::Result<Vec<tokio::task::JoinHandle<()>>> {
    let mut handles = Vec::with_capacity(n);
    let conns = n.div_ceil(per_conn);
    let tag = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis();
    for c in 0..conns {
        let ch = channel(addr).await;
        for i in (c * per_conn)..((c + 1) * per_conn).min(n) {
            let mut client = CoordinationServiceClient::new(ch.clone());
            let req = GetKeyValueRequest {
                incarnations: Some(Incarnations {
                    task_id: 0,
                    task_incarnation: 1,
                    service_incarnation: peer.service_incarnation,
                }),
                key: format!("parked/{tag}/{i}"),
            };
            handles.push(tokio::spawn(async move {
                let _ = client.get_key_value(req).await;
            }));
        }
    }
    coordstore_tests::wait_parked(addr, n as u64, Duration::from_secs(120)).await;
    Ok(handles)
}

/// The memory one parked call costs a server: its RSS growth over `calls`
/// calls held open, `per_conn` per HTTP/2 connection.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct ParkedMemoryRow {
    /// What held the calls.
    pub peer: String,
    /// Calls held open.
    pub calls: usize,
    /// Calls per connection.
    pub per_connection: usize,
    /// Server RSS before, bytes.
    pub rss_before: u64,
    /// Server RSS with every call open, bytes.
    pub rss_after: u64,
    /// (after − before) / calls.
    pub bytes_per_call: f64,
}

/// RSS per parked call: `calls` blocking gets parked on one coordstore
/// node, beside the floor of the HTTP/2 stack it is built on — a bare tonic
/// server (this binary's `bare-grpc`: the gRPC health service and nothing
/// else, the system allocator) holding as many open gRPC health `Watch`
/// streams. Each at `per_conn` calls per connection.
pub async fn memory(calls: usize, per_conn: usize) -> anyhow::Result<Vec<ParkedMemoryRow>> {
    let row = |peer: &str, (before, after): (u64, u64)| ParkedMemoryRow {
        peer: peer.into(),
        calls,
        per_connection: per_conn,
        rss_before: before,
        rss_after: after,
        bytes_per_call: after.saturating_sub(before) as f64 / calls as f64,
    };
    eprintln!("parked-memory: coordstore 1 node, {calls} parked gets");
    let parked = coordstore_rss(calls, per_conn).await?;
    eprintln!("parked-memory: bare tonic server, {calls} open health Watch streams");
    let streams = bare_grpc_rss(calls, per_conn).await?;
    Ok(vec![
        row("coordstore 1 node, blocking GetKeyValue", parked),
        row("bare tonic server, health Watch streams", streams),
    ])
}

/// A coordstore node's RSS before and after `calls` blocking gets are
/// parked on it, `per_conn` per connection.
async fn coordstore_rss(calls: usize, per_conn: usize) -> anyhow::Result<(u64, u64)> {
    let peer = Peer::start(PeerKind::Coordstore1, 1).await?;
    let leader = peer.leader().await?;
    let addr = peer.addr(leader);
    let pid = peer
        .pid(leader)
        .ok_or_else(|| anyhow::anyhow!("the node is not running"))?;
    let before = crate::memory::rss(pid)?;
    let gets = park_by(&peer, &addr, calls, per_conn).await?;
    let after = crate::memory::rss(pid)?;
    for g in gets {
        g.abort();
    }
    Ok((before, after))
}

/// A bare tonic server's RSS (this binary's `bare-grpc`) before and after
/// `calls` gRPC health `Watch` streams are open on it, `per_conn` per
/// connection.
async fn bare_grpc_rss(calls: usize, per_conn: usize) -> anyhow::Result<(u64, u64)> {
    let port = coordstore_tests::free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut child = tokio::process::Command::new(std::env::current_exe()?)
        .args(["bare-grpc", "--listen", &listen])
        .kill_on_drop(true)
        .spawn()?;
    let pid = child
        .id()
        .ok_or_else(|| anyhow::anyhow!("bare-grpc exited"))?;
    let first = channel(&listen).await;
    let probe = tonic_health::pb::health_client::HealthClient::new(first);
    eventually("bare-grpc to answer", Duration::from_secs(30), || {
        let mut probe = probe.clone();
        async move {
            probe
                .check(tonic_health::pb::HealthCheckRequest::default())
                .await
                .map(|_| ())
        }
    })
    .await;
    let before = crate::memory::rss(pid)?;
    let mut open = Vec::with_capacity(calls);
    for c in 0..calls.div_ceil(per_conn) {
        let ch = channel(&listen).await;
        let mut watches = Vec::new();
        for _ in (c * per_conn)..((c + 1) * per_conn).min(calls) {
            let mut client = tonic_health::pb::health_client::HealthClient::new(ch.clone());
            watches.push(async move {
                client
                    .watch(tonic_health::pb::HealthCheckRequest::default())
                    .await
            });
        }
        for w in futures_util::future::join_all(watches).await {
            open.push(w?.into_inner());
        }
    }
    let after = crate::memory::rss(pid)?;
    drop(open);
    child.kill().await?;
    Ok((before, after))
}

/// `bare-grpc`: a tonic server with the gRPC health service only, for
/// [`memory`]'s floor; serves until killed.
pub async fn bare_grpc(listen: &str) -> anyhow::Result<()> {
    let (_reporter, health) = tonic_health::server::health_reporter();
    tonic::transport::Server::builder()
        .add_service(health)
        .serve(listen.parse()?)
        .await?;
    Ok(())
}

/// The markdown table of [`memory`]'s rows.
pub fn memory_table(rows: &[ParkedMemoryRow]) -> String {
    let mut s = String::from(
        "| held by | calls | per connection | RSS before, MiB | RSS after, MiB | bytes per call |\n|---|---|---|---|---|---|\n",
    );
    for r in rows {
        s.push_str(&format!(
            "| {} | {} | {} | {:.1} | {:.1} | {:.0} |\n",
            r.peer,
            r.calls,
            r.per_connection,
            r.rss_before as f64 / 1048576.0,
            r.rss_after as f64 / 1048576.0,
            r.bytes_per_call
        ));
    }
    s
}
