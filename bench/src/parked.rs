//! `parked`: KV put throughput (64 clients, 256-byte values) while N
//! blocking gets are parked on the node (xla.coordination GetKeyValue of
//! keys nobody writes), against the same load with none parked, on one
//! coordstore node. Target: 10,000 parked gets cost at most 10% of the
//! write throughput (parked gets wake per key, not on every write).

use std::time::{Duration, Instant};

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
    let mut handles = Vec::with_capacity(n);
    let conns = n.div_ceil(GETS_PER_CONNECTION);
    let tag = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis();
    for c in 0..conns {
        let ch = channel(addr).await;
        for i in (c * GETS_PER_CONNECTION)..((c + 1) * GETS_PER_CONNECTION).min(n) {
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
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let parked = coordstore_tests::parked_calls(addr).await;
        if parked >= n as u64 {
            return Ok(handles);
        }
        if Instant::now() > deadline {
            anyhow::bail!("only {parked} of {n} gets parked after 120 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
