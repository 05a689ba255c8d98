//! `barrier`: N tasks (N = 2, 64, 1024) register with an xla peer, then run
//! barrier rounds: every task calls Barrier on a fresh id at once; a round
//! lasts until the last task's call returns. The load generator multiplexes
//! the tasks over ⌈N/128⌉ connections (a tonic server admits 200 concurrent
//! streams per connection, and a barrier's calls all wait together). etcd
//! has no barrier primitive and is not measured here.

use std::time::{Duration, Instant};

use proto::xla::{BarrierRequest, Incarnations};

use crate::peers::{channel, Peer, PeerKind};
use crate::stats::{summarize, Latency};

/// One (peer, N) measurement.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct BarrierRow {
    /// Peer name.
    pub peer: String,
    /// Tasks.
    pub tasks: usize,
    /// Connections they share.
    pub connections: usize,
    /// Registering all N tasks concurrently, ms.
    pub register_ms: f64,
    /// Barrier round time.
    pub round: Latency,
}

/// Rounds measured for `n` tasks (after 2 unmeasured).
fn rounds(n: usize) -> usize {
    match n {
        0..=2 => 100,
        3..=64 => 50,
        _ => 20,
    }
}

/// Runs every N on every xla peer of `peers`.
pub async fn run(peers: &[PeerKind], sizes: &[usize]) -> anyhow::Result<Vec<BarrierRow>> {
    let mut rows = Vec::new();
    for &kind in peers.iter().filter(|k| k.is_xla()) {
        for &n in sizes {
            eprintln!("barrier: {}, {n} tasks", kind.name());
            let peer = Peer::start(kind, n as u32).await?;
            let addr = peer.leader_addr().await?;
            let conns = n.div_ceil(128).max(1);
            let mut clients = Vec::new();
            for _ in 0..conns {
                clients.push(
                    proto::xla::coordination_service_client::CoordinationServiceClient::new(
                        channel(&addr).await,
                    ),
                );
            }
            let si = peer.service_incarnation();
            let inc = move |task: usize| {
                Some(Incarnations {
                    task_id: task as i32,
                    task_incarnation: 1,
                    service_incarnation: si,
                })
            };
            let register_ms = peer.register_ms;
            let mut samples = Vec::new();
            for r in 0..rounds(n) + 2 {
                let t0 = Instant::now();
                let mut calls = Vec::new();
                for task in 0..n {
                    let mut c = clients[task % conns].clone();
                    let req = BarrierRequest {
                        incarnations: inc(task),
                        barrier_id: format!("bench/{r}"),
                        barrier_timeout_in_ms: 120_000,
                        task_ids: Vec::new(),
                        source_task_id: task as i32,
                        counter: 0,
                    };
                    calls.push(tokio::spawn(async move { c.barrier(req).await }));
                }
                for c in calls {
                    tokio::time::timeout(Duration::from_secs(150), c).await???;
                }
                if r >= 2 {
                    samples.push(t0.elapsed());
                }
            }
            rows.push(BarrierRow {
                peer: kind.name().into(),
                tasks: n,
                connections: conns,
                register_ms,
                round: summarize(&mut samples),
            });
        }
    }
    Ok(rows)
}
