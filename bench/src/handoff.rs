//! `handoff`: blocking-get hand-off. One client waits for a key (xla
//! GetKeyValue, which the server parks; etcd: a watch on the key), another
//! sets it 2 ms later; measured from the set's start to the waiter's wake-up,
//! both in this process. Clients are on separate connections to the leader.

use std::time::{Duration, Instant};

use crate::peers::{channel, Peer, PeerKind};
use crate::stats::{summarize, Latency};

/// One peer's hand-off latency.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct HandoffRow {
    /// Peer name.
    pub peer: String,
    /// Set start → waiter woken.
    pub latency: Latency,
}

/// Runs `iterations` hand-offs (after 20 unmeasured) on every peer.
pub async fn run(peers: &[PeerKind], iterations: usize) -> anyhow::Result<Vec<HandoffRow>> {
    let mut rows = Vec::new();
    for &kind in peers {
        eprintln!("handoff: {}", kind.name());
        let peer = Peer::start(kind, 1).await?;
        let addr = peer.leader_addr().await?;
        let mut waiter = peer.client(channel(&addr).await);
        let mut setter = peer.client(channel(&addr).await);
        let mut samples = Vec::new();
        for i in 0..iterations + 20 {
            let key = format!("handoff/{i}");
            let wait = waiter.wait_for(&key).await?;
            let woke = tokio::spawn(async move {
                let v = wait.await;
                (v, Instant::now())
            });
            tokio::time::sleep(Duration::from_millis(2)).await;
            let t0 = Instant::now();
            setter.put(&key, b"x").await?;
            let (v, t1) = tokio::time::timeout(Duration::from_secs(30), woke).await??;
            anyhow::ensure!(v? == b"x", "{}: waiter got another value", kind.name());
            if i >= 20 {
                samples.push(t1.duration_since(t0));
            }
        }
        rows.push(HandoffRow {
            peer: kind.name().into(),
            latency: summarize(&mut samples),
        });
    }
    Ok(rows)
}
