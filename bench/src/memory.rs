//! `memory`: server RSS holding 100k keys of 1 KiB. 64 clients over 8
//! connections put the keys through the leader; then, after 3 s of rest,
//! every server process's VmRSS is read from /proc. The raw data held is
//! the sum of key and value bytes. The built-in service lives inside a
//! Python process with jaxlib loaded, so its RSS growth is the fair figure
//! there (reported beside the total).

use std::sync::Arc;
use std::time::Duration;

use crate::peers::{channel, Peer, PeerKind};

/// One peer's memory.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct MemoryRow {
    /// Peer name.
    pub peer: String,
    /// Keys held.
    pub keys: usize,
    /// Key + value bytes held.
    pub raw_bytes: u64,
    /// Leader's RSS before loading, bytes.
    pub rss_before: u64,
    /// Leader's RSS after loading, bytes.
    pub rss_leader: u64,
    /// Largest RSS over the servers after loading, bytes.
    pub rss_max: u64,
    /// rss_leader / raw_bytes.
    pub ratio: f64,
    /// (rss_leader - rss_before) / raw_bytes.
    pub growth_ratio: f64,
}

/// VmRSS of `pid` in bytes.
pub fn rss(pid: u32) -> anyhow::Result<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kb: u64 = s
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no VmRSS for pid {pid}"))?;
    Ok(kb * 1024)
}

/// Loads `keys` keys of `value_bytes` into every peer and reads RSS.
pub async fn run(
    peers: &[PeerKind],
    keys: usize,
    value_bytes: usize,
) -> anyhow::Result<Vec<MemoryRow>> {
    let mut rows = Vec::new();
    for &kind in peers {
        eprintln!(
            "memory: {}, {keys} keys of {value_bytes} bytes",
            kind.name()
        );
        let peer = Peer::start(kind, 1).await?;
        let leader = peer.leader().await?;
        let pid = peer
            .pid(leader)
            .ok_or_else(|| anyhow::anyhow!("leader not running"))?;
        let rss_before = rss(pid)?;
        let addr = peer.addr(leader);
        let raw_bytes = load_keys(&peer, &addr, keys, value_bytes).await?;
        tokio::time::sleep(Duration::from_secs(3)).await;
        let rss_leader = rss(pid)?;
        let mut rss_max = rss_leader;
        for i in 0..peer.len() {
            if let Some(p) = peer.pid(i) {
                rss_max = rss_max.max(rss(p)?);
            }
        }
        rows.push(MemoryRow {
            peer: kind.name().into(),
            keys,
            raw_bytes,
            rss_before,
            rss_leader,
            rss_max,
            ratio: rss_leader as f64 / raw_bytes as f64,
            growth_ratio: rss_leader.saturating_sub(rss_before) as f64 / raw_bytes as f64,
        });
    }
    Ok(rows)
}

/// Puts `keys` keys of `value_bytes` at `addr` with 64 clients over 8
/// connections; the key and value bytes put.
async fn load_keys(
    peer: &Peer,
    addr: &str,
    keys: usize,
    value_bytes: usize,
) -> anyhow::Result<u64> {
    let clients = 64;
    let mut channels = Vec::new();
    for _ in 0..8 {
        channels.push(channel(addr).await);
    }
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let raw = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut tasks = Vec::new();
    for t in 0..clients {
        let mut c = peer.client(channels[t % 8].clone());
        let (next, raw) = (next.clone(), raw.clone());
        tasks.push(tokio::spawn(async move {
            let value = vec![b'm'; value_bytes];
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= keys {
                    return Ok::<(), anyhow::Error>(());
                }
                let key = format!("mem/{i:07}");
                let mut tries = 0;
                while let Err(e) = c.put(&key, &value).await {
                    tries += 1;
                    anyhow::ensure!(tries < 10, "put {key}: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                raw.fetch_add(
                    (key.len() + value.len()) as u64,
                    std::sync::atomic::Ordering::Relaxed,
                );
            }
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(raw.load(std::sync::atomic::Ordering::Relaxed))
}
