//! `replay`: how long a coordstore node holding 1M journal entries takes to
//! serve again after a SIGKILL, without and with snapshots.
//!
//! The journal is built with the node's own storage code: a 1-node cluster
//! starts and takes a write (so the data dir, vote and membership are real),
//! is SIGKILLed, and `storage::LogStore::write_entries` appends 1M committed
//! entries in the leader's term, each one KV put (keys cycle over 10,000,
//! 100-byte values), as a node that had accepted them would have stored them.
//! Writing them through Raft would take tens of minutes here (one fsync per
//! entry) and is not what this suite measures.
//!
//! * without snapshots: the node starts with snapshots off and replays every
//!   entry;
//! * with snapshots: the node runs with the default policy (one every 50,000
//!   entries or 8 MiB of log, 100 kept behind), is waited for until its
//!   snapshot covers the journal and the log behind it is purged, then
//!   SIGKILLed and restarted.
//!
//! etcd (1 member) gets the same puts through its API ([`run_etcd`]).
//!
//! "Serving" is the first linearizable read (xla TryGetKeyValue) that
//! returns the value of the last entry, polled every 5 ms from the spawn.

use std::time::{Duration, Instant};

use coordstore_tests::wait::{eventually, holds};
use coordstore_tests::{try_status, Cluster};
use journal::pb::{coordination::KvInsert, update::Command as Cmd, UpdateBatch};
use journal::Update;
use openraft::storage::RaftLogStorage;
use openraft::EntryPayload;
use storage::{Entry, Identity, LeaderId, LogId, Proposal};

use crate::etcd::EtcdCluster;
use crate::peers::{KvClient, Peer, PeerKind};

/// One restart.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct ReplayRow {
    /// Peer name.
    pub peer: String,
    /// "without snapshots" / "with snapshots".
    pub case: String,
    /// Journal entries the node holds.
    pub entries: u64,
    /// Log entries left after the snapshot (all of them without); not
    /// known for etcd with snapshots.
    pub log_entries: Option<u64>,
    /// Data dir size, bytes.
    pub data_dir_bytes: u64,
    /// Spawn → the first linearizable read of the last value, ms.
    pub serving_ms: f64,
}

/// etcd, 1 member: `entries` puts (the same keys and values as coordstore's
/// journal) through 256 clients, then SIGKILL and restart; once with
/// `--snapshot-count` above `entries` (the whole WAL is replayed) and once
/// with etcd's default (a snapshot every 100,000 entries).
pub async fn run_etcd(entries: u64) -> anyhow::Result<Vec<ReplayRow>> {
    let mut rows = Vec::new();
    for (case, count) in [
        ("without snapshots", (entries * 2).to_string()),
        ("with snapshots", "100000".to_string()),
    ] {
        eprintln!("replay: etcd 1 member, {entries} puts (--snapshot-count {count})");
        let mut c = EtcdCluster::start_with(1, &["--snapshot-count", &count])?;
        c.wait_leader(&[0], Duration::from_secs(60)).await?;
        let addr = c.members[0].addr.clone();
        let t = Instant::now();
        etcd_puts(&addr, entries).await?;
        eprintln!(
            "replay: {entries} etcd puts in {:.1} s",
            t.elapsed().as_secs_f64()
        );
        let last_i = entries - 1;
        let key = format!("replay/{}", last_i % KEYS);
        let want = value(last_i);
        let size = dir_size(&c.data_dir(0));
        c.members[0].kill();
        let spawned = Instant::now();
        c.restart(0)?;
        let serving_ms = etcd_serving_ms(&addr, &key, &want, spawned).await?;
        eprintln!("replay: etcd {case}: serving after {serving_ms:.0} ms");
        rows.push(ReplayRow {
            peer: "etcd 3.4, 1 member".into(),
            case: case.into(),
            entries,
            log_entries: (case == "without snapshots").then_some(entries),
            data_dir_bytes: size,
            serving_ms,
        });
    }
    Ok(rows)
}

/// Puts `entries` keys (as coordstore's journal holds them) at the etcd
/// member at `addr` through 256 clients over 16 connections.
async fn etcd_puts(addr: &str, entries: u64) -> anyhow::Result<()> {
    let next = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut tasks = Vec::new();
    let channels = {
        let mut v = Vec::new();
        for _ in 0..16 {
            v.push(crate::peers::channel(addr).await);
        }
        v
    };
    for t in 0..256 {
        let mut kv = crate::etcd::kv(channels[t % 16].clone());
        let next = next.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= entries {
                    return Ok::<(), anyhow::Error>(());
                }
                kv.put(crate::etcd::pb::PutRequest {
                    key: format!("replay/{}", i % KEYS).into_bytes(),
                    value: value(i),
                    lease: 0,
                })
                .await?;
            }
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(())
}

/// Milliseconds from `spawned` until the etcd member at `addr` answers a
/// read of `key` (which must hold `want`), asking every 5 ms: the measure
/// itself, so the pace is fixed.
async fn etcd_serving_ms(
    addr: &str,
    key: &str,
    want: &[u8],
    spawned: Instant,
) -> anyhow::Result<f64> {
    let deadline = spawned + Duration::from_secs(600);
    loop {
        if let Ok(ch) = crate::peers::channel_with_timeout(addr, Duration::from_secs(5)).await {
            let mut kv = crate::etcd::kv(ch);
            let r = kv
                .range(crate::etcd::pb::RangeRequest {
                    key: key.as_bytes().to_vec(),
                    ..Default::default()
                })
                .await;
            if let Ok(r) = r {
                let got = r.into_inner().kvs.into_iter().next().map(|kv| kv.value);
                anyhow::ensure!(got.as_deref() == Some(want), "etcd lost {key}");
                return Ok(spawned.elapsed().as_secs_f64() * 1000.0);
            }
        }
        anyhow::ensure!(Instant::now() < deadline, "etcd did not serve within 600 s");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn dir_size(p: &std::path::Path) -> u64 {
    let mut total = 0;
    if let Ok(rd) = std::fs::read_dir(p) {
        for e in rd.flatten() {
            match e.metadata() {
                Ok(m) if m.is_dir() => total += dir_size(&e.path()),
                Ok(m) => total += m.len(),
                Err(_) => {}
            }
        }
    }
    total
}

const KEYS: u64 = 10_000;

fn value(i: u64) -> Vec<u8> {
    let mut v = format!("{i:020}").into_bytes();
    v.resize(100, b'.');
    v
}

/// Appends `entries` committed entries after the node's last one.
async fn append_journal(
    dir: &std::path::Path,
    term: u64,
    after: u64,
    entries: u64,
) -> anyhow::Result<u64> {
    let identity = Identity {
        cluster_id: "coordstore".into(),
        node_id: 1,
    };
    let (mut log, _sm) = storage::open(dir, storage::DEFAULT_CACHE_BYTES, &identity)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let leader = LeaderId { term, node_id: 1 };
    let last = after + entries;
    let entry = |index: u64| {
        let i = index - after - 1;
        Entry {
            log_id: LogId::new(leader, index),
            payload: EntryPayload::Normal(Proposal::new(UpdateBatch {
                updates: vec![Update {
                    command: Some(Cmd::from(KvInsert {
                        key: format!("replay/{}", i % KEYS),
                        value: value(i).into(),
                        allow_overwrite: true,
                    })),
                    ..Default::default()
                }],
            })),
        }
    };
    let batch = 20_000;
    let mut next = after + 1;
    while next <= last {
        let end = (next + batch).min(last + 1);
        if end == last + 1 {
            // Flushed together with the final batch.
            log.save_committed(Some(LogId::new(leader, last)))
                .await
                .map_err(|e| anyhow::anyhow!("{e}"))?;
        }
        log.write_entries((next..end).map(entry))
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        next = end;
    }
    Ok(last)
}

/// Polls the node until a linearizable read returns the last value.
async fn time_to_serve(
    cluster: &mut Cluster,
    service_incarnation: u64,
    key: &str,
    want: &[u8],
) -> anyhow::Result<f64> {
    let spawned = Instant::now();
    cluster.restart(0);
    let addr = cluster.nodes[0].addr.clone();
    let deadline = spawned + Duration::from_secs(600);
    loop {
        if let Ok(ch) = crate::peers::channel_with_timeout(&addr, Duration::from_secs(5)).await {
            let mut c = KvClient::xla(ch, service_incarnation);
            if let Ok(Some(v)) = c.get(key).await {
                anyhow::ensure!(v == want, "replayed state has another value at {key}");
                return Ok(spawned.elapsed().as_secs_f64() * 1000.0);
            }
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "node did not serve within 600 s\n{}",
            cluster.logs()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Runs both cases with `entries` journal entries.
pub async fn run(entries: u64) -> anyhow::Result<Vec<ReplayRow>> {
    let kind = PeerKind::Coordstore1;
    eprintln!("replay: building a journal of {entries} entries");
    let (mut peer, dir, after, last) = journal_of(kind, entries).await?;
    let last_i = last - after - 1;
    let key = format!("replay/{}", last_i % KEYS);
    let want = value(last_i);

    let mut rows = Vec::new();
    // Without snapshots: every entry is replayed.
    let size = dir_size(&dir);
    let si = peer.service_incarnation();
    let cluster = peer.coordstore().expect("coordstore peer");
    let serving_ms = time_to_serve(cluster, si, &key, &want).await?;
    eprintln!("replay: without snapshots: serving after {serving_ms:.0} ms");
    rows.push(ReplayRow {
        peer: kind.name().into(),
        case: "without snapshots".into(),
        entries,
        log_entries: Some(last),
        data_dir_bytes: size,
        serving_ms,
    });

    // With snapshots: the default policy, then wait for the snapshot + purge.
    snapshot_by_default(peer.coordstore().expect("coordstore peer"), last).await;
    let (log_entries, size) = {
        let addr = peer.addr(0);
        let s = try_status(&addr)
            .await
            .ok_or_else(|| anyhow::anyhow!("no status"))?;
        (Some(s.last_log_index - s.purged_index), dir_size(&dir))
    };
    let cluster = peer.coordstore().expect("coordstore peer");
    cluster.kill(0);
    let serving_ms = time_to_serve(cluster, si, &key, &want).await?;
    eprintln!("replay: with snapshots: serving after {serving_ms:.0} ms");
    rows.push(ReplayRow {
        peer: kind.name().into(),
        case: "with snapshots".into(),
        entries,
        log_entries,
        data_dir_bytes: size,
        serving_ms,
    });
    Ok(rows)
}

/// A stopped node of `kind` (never snapshotting) whose log has `entries`
/// more entries written to it directly: the peer, the node's data dir, its
/// last log index before them and the last one after.
async fn journal_of(
    kind: PeerKind,
    entries: u64,
) -> anyhow::Result<(Peer, std::path::PathBuf, u64, u64)> {
    let mut peer = Peer::start_with(
        kind,
        1,
        &[
            "--snapshot-every",
            "1000000000000",
            "--snapshot-log-bytes",
            "0",
        ],
    )
    .await?;
    let (term, after) = {
        let addr = peer.addr(0);
        let s = try_status(&addr)
            .await
            .ok_or_else(|| anyhow::anyhow!("no status"))?;
        (s.term, s.last_log_index)
    };
    let cluster = peer.coordstore().expect("coordstore peer");
    cluster.kill(0);
    let dir = cluster.nodes[0].data_dir.clone();
    let t = Instant::now();
    let last = append_journal(&dir, term, after, entries).await?;
    eprintln!(
        "replay: journal written in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    Ok((peer, dir, after, last))
}

/// Restarts node 0 of `cluster` with the default snapshot policy and waits
/// until its snapshot and purge reach within 50,000 entries of `last`.
async fn snapshot_by_default(cluster: &mut Cluster, last: u64) {
    cluster.nodes[0].remove_arg("--snapshot-every");
    cluster.nodes[0].remove_arg("--snapshot-log-bytes");
    cluster.restart(0);
    let addr = cluster.nodes[0].addr.clone();
    eventually("a snapshot", Duration::from_secs(600), || async {
        let s = try_status(&addr)
            .await
            .map(|s| (s.snapshot_index, s.purged_index));
        holds(
            s.is_some_and(|(snapshot, purged)| {
                snapshot + 50_000 >= last && purged + 50_000 >= last
            }),
            || s,
        )
    })
    .await;
}
