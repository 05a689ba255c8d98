//! `propose`: replicated write throughput through the Node API. C concurrent
//! proposers (one connection each) insert KV pairs at the leader of an N-node
//! cluster on loopback; reports updates/s, Raft entries/s (how well the write
//! batcher groups commits) and per-update latency.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use coordstore_tests::{connect, try_status, Cluster, Writer};

use crate::stats::{summarize, Latency};

/// One measured configuration.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ProposeResult {
    /// Cluster size.
    pub nodes: usize,
    /// Concurrent proposers.
    pub clients: usize,
    /// Value size in bytes.
    pub value_bytes: usize,
    /// Measured seconds.
    pub seconds: f64,
    /// Acknowledged updates.
    pub updates: usize,
    /// Updates per second.
    pub updates_per_s: f64,
    /// Raft log entries per second (leader's log growth).
    pub entries_per_s: f64,
    /// Mean updates packed per entry.
    pub updates_per_entry: f64,
    /// Per-update latency.
    pub latency: Latency,
}

/// Runs one configuration.
pub async fn run(
    nodes: usize,
    clients: usize,
    seconds: f64,
    value_bytes: usize,
) -> anyhow::Result<ProposeResult> {
    let cluster = Cluster::start(nodes, &[]);
    let all: Vec<usize> = (0..nodes).collect();
    let leader = cluster.wait_leader(&all, Duration::from_secs(60)).await;
    let addr = cluster.nodes[leader].addr.clone();
    let value = vec![b'v'; value_bytes];
    warm_up(&addr, &value).await?;
    let before = try_status(&addr).await.map_or(0, |s| s.last_log_index);
    let samples = Arc::new(Mutex::new(Vec::new()));
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(seconds);
    let mut tasks = Vec::new();
    for t in 0..clients {
        let (addr, samples, value) = (addr.clone(), samples.clone(), value.clone());
        tasks.push(tokio::spawn(async move {
            let mut c = connect(&addr, Duration::from_secs(30)).await;
            let mut w = Writer::new();
            let mut mine = Vec::new();
            let mut i = 0u64;
            while Instant::now() < end {
                let t0 = Instant::now();
                if w.put(
                    &mut c,
                    &format!("c{t}/{i}"),
                    &value,
                    Duration::from_secs(10),
                )
                .await
                .is_err()
                {
                    break;
                }
                mine.push(t0.elapsed());
                i += 1;
            }
            samples.lock().unwrap().extend(mine);
        }));
    }
    for t in tasks {
        t.await?;
    }
    let elapsed = start.elapsed().as_secs_f64();
    let after = try_status(&addr).await.map_or(0, |s| s.last_log_index);
    let mut samples = std::mem::take(&mut *samples.lock().unwrap());
    let updates = samples.len();
    let entries = after.saturating_sub(before).max(1) as f64;
    drop(cluster);
    Ok(ProposeResult {
        nodes,
        clients,
        value_bytes,
        seconds: elapsed,
        updates,
        updates_per_s: updates as f64 / elapsed,
        entries_per_s: entries / elapsed,
        updates_per_entry: updates as f64 / entries,
        latency: summarize(&mut samples),
    })
}

/// Warms up (connections, first entries): 50 puts of `value` at `addr`.
async fn warm_up(addr: &str, value: &[u8]) -> anyhow::Result<()> {
    let mut c = connect(addr, Duration::from_secs(30)).await;
    let mut w = Writer::new();
    for i in 0..50 {
        w.put(&mut c, &format!("warm/{i}"), value, Duration::from_secs(30))
            .await
            .map_err(anyhow::Error::msg)?;
    }
    Ok(())
}

/// A markdown table of results.
pub fn table(results: &[ProposeResult]) -> String {
    let mut s = String::from(
        "| nodes | proposers | updates/s | entries/s | updates/entry | p50 ms | p99 ms |\n|---|---|---|---|---|---|---|\n",
    );
    for r in results {
        s.push_str(&format!(
            "| {} | {} | {:.0} | {:.0} | {:.1} | {:.2} | {:.2} |\n",
            r.nodes,
            r.clients,
            r.updates_per_s,
            r.entries_per_s,
            r.updates_per_entry,
            r.latency.p50_ms,
            r.latency.p99_ms
        ));
    }
    s
}
