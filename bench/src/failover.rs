//! `failover`: SIGKILL of the leader under a write load, then the time until
//! writes succeed again: from the kill to the acknowledgement of the first
//! put that was sent after the kill. Two writers per server put in a loop
//! (1 s timeout per put, 20 ms pause after a failure), so the surviving
//! servers always carry load. After each kill the dead server is restarted
//! on its data dir and the next kill waits until all servers agree on a
//! leader again. Peers with replicas only: coordstore 3 nodes, etcd 3
//! members, each with its own default election timing.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use coordstore_tests::wait::wait;

use crate::peers::{channel_with_timeout, Peer, PeerKind};
use crate::stats::{summarize, Latency};

/// One peer's failovers.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct FailoverRow {
    /// Peer name.
    pub peer: String,
    /// Leader kills.
    pub kills: usize,
    /// Kill → first acknowledged put sent after it.
    pub failover: Latency,
    /// Every measured failover, ms.
    pub samples_ms: Vec<f64>,
}

/// Acknowledged puts: (sent, acknowledged).
type Acks = Arc<Mutex<Vec<(Instant, Instant)>>>;

/// Runs `kills` leader kills on each replicated peer of `peers`.
pub async fn run(peers: &[PeerKind], kills: usize) -> anyhow::Result<Vec<FailoverRow>> {
    let mut rows = Vec::new();
    for &kind in peers
        .iter()
        .filter(|k| matches!(k, PeerKind::Coordstore3 | PeerKind::Etcd3))
    {
        eprintln!("failover: {}, {kills} leader kills", kind.name());
        let mut peer = Peer::start(kind, 1).await?;
        let acks: Acks = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let writers = start_writers(&peer, &acks, &stop).await?;
        let mut samples = Vec::new();
        for k in 0..kills {
            let leader = peer.leader().await?;
            // Steady load first.
            tokio::time::sleep(Duration::from_secs(1)).await;
            let killed = Instant::now();
            peer.kill(leader);
            let what = format!(
                "{}: a write to succeed after killing the leader (server {leader})",
                kind.name()
            );
            // The acknowledgement's own time is measured, not the wait's.
            let recovered = wait(what, Duration::from_secs(60))
                .context(|| peer.logs())
                .until(|| {
                    let first = acks
                        .lock()
                        .unwrap()
                        .iter()
                        .filter(|(sent, _)| *sent >= killed)
                        .map(|(_, acked)| *acked)
                        .min();
                    async move { first.ok_or("no write succeeded") }
                })
                .await;
            let d = recovered.duration_since(killed);
            eprintln!("failover: {} kill {}: {:?}", kind.name(), k + 1, d);
            samples.push(d);
            peer.restart(leader)?;
            acks.lock().unwrap().clear();
        }
        stop.store(true, Ordering::Relaxed);
        for w in writers {
            w.await?;
        }
        let samples_ms = samples.iter().map(|d| d.as_secs_f64() * 1000.0).collect();
        rows.push(FailoverRow {
            peer: kind.name().into(),
            kills,
            failover: summarize(&mut samples),
            samples_ms,
        });
    }
    Ok(rows)
}

/// Starts two writers per server of `peer`, each putting in a loop until
/// `stop` (1 s timeout per put, 20 ms pause after a failure) and noting
/// every acknowledged put in `acks`.
async fn start_writers(
    peer: &Peer,
    acks: &Acks,
    stop: &Arc<AtomicBool>,
) -> anyhow::Result<Vec<tokio::task::JoinHandle<()>>> {
    let mut writers = Vec::new();
    for server in 0..peer.len() {
        for w in 0..2 {
            let ch = channel_with_timeout(&peer.addr(server), Duration::from_secs(1)).await?;
            let mut c = peer.client(ch);
            let (acks, stop) = (acks.clone(), stop.clone());
            writers.push(tokio::spawn(async move {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    let sent = Instant::now();
                    let key = format!("failover/{server}/{w}/{i}");
                    let put = c.put(&key, &[b'v'; 256]);
                    match tokio::time::timeout(Duration::from_secs(1), put).await {
                        Ok(Ok(())) => acks.lock().unwrap().push((sent, Instant::now())),
                        _ => tokio::time::sleep(Duration::from_millis(20)).await,
                    }
                }
            }));
        }
    }
    Ok(writers)
}
