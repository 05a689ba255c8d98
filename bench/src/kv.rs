//! `kv`: KV put with 1, 16, 64 and 256 concurrent clients (closed loop, one
//! operation in flight per client, 256-byte values, fresh keys), then
//! linearizable get of those keys with 1 and 64 clients, against every peer.
//! Clients share connections as in etcd's benchmark shapes: 1 client on 1
//! connection, 16 and 64 on 8, 256 on 16. Clients talk to the leader.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::peers::{channel, KvClient, Peer, PeerKind};
use crate::stats::{summarize, Latency};

/// One measured configuration.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct KvRow {
    /// Peer name.
    pub peer: String,
    /// "put" or "get".
    pub op: String,
    /// Concurrent clients.
    pub clients: usize,
    /// Connections they share.
    pub connections: usize,
    /// Measured seconds.
    pub seconds: f64,
    /// Acknowledged operations per second.
    pub ops_per_s: f64,
    /// Failed operations (not in the latency).
    pub errors: usize,
    /// Latency of acknowledged operations.
    pub latency: Latency,
    /// CPU time (user + system) of all the peer's server processes over the
    /// measured seconds, per acknowledged operation, in µs (none where /proc
    /// could not be read).
    #[serde(default)]
    pub server_cpu_us: Option<f64>,
    /// Where the leader's writes spent their time over the measured seconds
    /// (coordstore puts; from its `/metrics`).
    #[serde(default)]
    pub stages: Option<WriteStages>,
}

/// Means over a measured span, from the leader's histograms (µs unless
/// named otherwise): the write stage metrics and the pieces inside them.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct WriteStages {
    /// An update waiting in the write batcher (`write_stage{queue}`).
    pub queue_us: Option<f64>,
    /// A batch from its proposal until answered (`write_stage{commit}`).
    pub commit_us: Option<f64>,
    /// The answer until the proposer runs (`write_stage{resume}`).
    pub resume_us: Option<f64>,
    /// Updates per Raft entry (`raft_batch_updates`).
    pub updates_per_entry: Option<f64>,
    /// One group fdatasync on the leader (`storage_flush_seconds`).
    pub fdatasync_us: Option<f64>,
    /// Applying a run of entries (`storage_apply_seconds`).
    pub apply_us: Option<f64>,
}

impl WriteStages {
    /// The means between two scrapes of one node's `/metrics`.
    pub fn between(before: &str, after: &str) -> WriteStages {
        let mean = |base: &str, labels: &str, scale: f64| {
            let delta = |suffix: &str| {
                let name = format!("{base}_{suffix}{labels}");
                Some(
                    coordstore_tests::metric_sample(after, &name)?
                        - coordstore_tests::metric_sample(before, &name).unwrap_or(0.0),
                )
            };
            let (sum, count) = (delta("sum")?, delta("count")?);
            (count > 0.0).then(|| sum / count * scale)
        };
        let stage = |s: &str| {
            mean(
                "coordstore_raft_write_stage_seconds",
                &format!("{{stage=\"{s}\"}}"),
                1e6,
            )
        };
        WriteStages {
            queue_us: stage("queue"),
            commit_us: stage("commit"),
            resume_us: stage("resume"),
            updates_per_entry: mean("coordstore_raft_batch_updates", "", 1.0),
            fdatasync_us: mean("coordstore_storage_flush_seconds", "", 1e6),
            apply_us: mean("coordstore_storage_apply_seconds", "", 1e6),
        }
    }
}

/// CPU time used so far by the processes `pids`, in seconds (user + system,
/// every thread; /proc counts it in USER_HZ ticks, 100 per second on Linux).
pub fn cpu_seconds(pids: &[u32]) -> Option<f64> {
    let mut ticks = 0u64;
    for pid in pids {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // After the command name (which may hold spaces): state, ppid, ...,
        // utime and stime are the 12th and 13th fields.
        let rest = stat.rsplit_once(')')?.1;
        let f: Vec<&str> = rest.split_whitespace().collect();
        ticks += f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    }
    Some(ticks as f64 / 100.0)
}

/// Connections for `clients` clients.
pub fn connections(clients: usize) -> usize {
    let c = match clients {
        0..=1 => 1,
        2..=64 => 8,
        _ => 16,
    };
    c.min(clients.max(1))
}

#[derive(Clone, Copy, PartialEq)]
enum Op {
    Put,
    Get,
}

/// Keys each get client writes before it reads them back in a loop.
const GET_KEYS: usize = 20;

/// Runs the suite on `peers`.
pub async fn run(
    peers: &[PeerKind],
    put_clients: &[usize],
    get_clients: &[usize],
    seconds: f64,
    value_bytes: usize,
) -> anyhow::Result<Vec<KvRow>> {
    let mut rows = Vec::new();
    for &kind in peers {
        eprintln!("kv: starting {}", kind.name());
        let peer = Peer::start(kind, 1).await?;
        let addr = peer.leader_addr().await?;
        for &c in put_clients {
            eprintln!("kv: {} put, {c} clients", kind.name());
            rows.push(load(&peer, &addr, Op::Put, c, seconds, value_bytes).await?);
        }
        for &c in get_clients {
            eprintln!("kv: {} linearizable get, {c} clients", kind.name());
            rows.push(load(&peer, &addr, Op::Get, c, seconds, value_bytes).await?);
        }
    }
    Ok(rows)
}

/// The put load of [`run`]: `clients` closed-loop clients writing fresh keys
/// for `seconds`.
pub async fn load_put(
    peer: &Peer,
    addr: &str,
    clients: usize,
    seconds: f64,
    value_bytes: usize,
) -> anyhow::Result<KvRow> {
    load(peer, addr, Op::Put, clients, seconds, value_bytes).await
}

/// Runs `clients` closed-loop clients for `seconds`: puts write fresh keys
/// `kv/<run>/<client>/<i>`; gets read back `GET_KEYS` keys per client that
/// the client writes first.
async fn load(
    peer: &Peer,
    addr: &str,
    op: Op,
    clients: usize,
    seconds: f64,
    value_bytes: usize,
) -> anyhow::Result<KvRow> {
    let conns = connections(clients);
    let mut channels = Vec::new();
    for _ in 0..conns {
        channels.push(channel(addr).await);
    }
    let shared = Shared {
        op,
        tag: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_millis(),
        value: vec![b'v'; value_bytes],
        run: Duration::from_secs_f64(seconds),
        start_line: Arc::new(tokio::sync::Barrier::new(clients + 1)),
        samples: Arc::default(),
        errors: Arc::default(),
    };
    let mut tasks = Vec::new();
    for t in 0..clients {
        let c = peer.client(channels[t % conns].clone());
        tasks.push(tokio::spawn(client(c, t, shared.clone())));
    }
    let pids: Vec<u32> = (0..peer.len()).filter_map(|i| peer.pid(i)).collect();
    // The leader's metrics, for the write stages of puts.
    let leader = (0..peer.len()).find(|&i| peer.addr(i) == addr);
    let scrape = || async {
        match (op, leader) {
            (Op::Put, Some(i)) => peer.metrics(i).await,
            _ => None,
        }
    };
    shared.start_line.wait().await;
    let t0 = Instant::now();
    let cpu0 = cpu_seconds(&pids);
    let metrics0 = scrape().await;
    for t in tasks {
        t.await??;
    }
    let elapsed = t0.elapsed().as_secs_f64();
    let cpu = cpu_seconds(&pids).zip(cpu0).map(|(b, a)| b - a);
    let stages = match (metrics0, scrape().await) {
        (Some(a), Some(b)) => Some(WriteStages::between(&a, &b)),
        _ => None,
    };
    let mut samples = std::mem::take(&mut *shared.samples.lock().unwrap());
    let errors = *shared.errors.lock().unwrap();
    Ok(KvRow {
        peer: peer.kind.name().into(),
        op: match op {
            Op::Put => "put",
            Op::Get => "get",
        }
        .into(),
        clients,
        connections: conns,
        seconds: elapsed,
        ops_per_s: samples.len() as f64 / elapsed,
        errors,
        server_cpu_us: cpu
            .filter(|_| !samples.is_empty())
            .map(|c| c * 1e6 / samples.len() as f64),
        stages,
        latency: summarize(&mut samples),
    })
}

/// What the clients of one [`load`] share.
#[derive(Clone)]
struct Shared {
    op: Op,
    /// The run's key prefix.
    tag: u128,
    value: Vec<u8>,
    /// How long the measured loop runs.
    run: Duration,
    /// Where every client and [`load`] meet once warmed up.
    start_line: Arc<tokio::sync::Barrier>,
    /// Latencies of acknowledged operations.
    samples: Arc<Mutex<Vec<Duration>>>,
    /// Failed operations.
    errors: Arc<Mutex<usize>>,
}

/// Client `t` of a [`load`]: warms up (connections, and the keys gets
/// read), meets the others at the start line, then runs its operation in a
/// closed loop for the run's length.
async fn client(mut c: KvClient, t: usize, s: Shared) -> anyhow::Result<()> {
    let (op, tag) = (s.op, s.tag);
    let key = |i: usize| match op {
        Op::Put => format!("kv/{tag}/{t}/{i}"),
        Op::Get => format!("kvget/{tag}/{t}/{}", i % GET_KEYS),
    };
    // Warm-up, not measured: connections, and the keys gets read.
    let warm = if op == Op::Get { GET_KEYS } else { 5 };
    let mut failed = None;
    for i in 0..warm {
        let k = match op {
            Op::Get => key(i),
            Op::Put => format!("{}w", key(i)),
        };
        if let Err(e) = c.put(&k, &s.value).await {
            failed = Some(e);
        }
    }
    s.start_line.wait().await;
    if let Some(e) = failed {
        return Err(anyhow::anyhow!("warm-up put failed: {e}"));
    }
    let end = Instant::now() + s.run;
    let (mut mine, mut errs, mut i) = (Vec::new(), 0usize, 0usize);
    while Instant::now() < end {
        let t0 = Instant::now();
        let r = match op {
            Op::Put => c.put(&key(i), &s.value).await,
            Op::Get => match c.get(&key(i)).await {
                Ok(Some(_)) => Ok(()),
                Ok(None) => return Err(anyhow::anyhow!("{} vanished", key(i))),
                Err(e) => Err(e),
            },
        };
        match r {
            Ok(()) => mine.push(t0.elapsed()),
            Err(_) => {
                errs += 1;
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
        i += 1;
    }
    s.samples.lock().unwrap().extend(mine);
    *s.errors.lock().unwrap() += errs;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{connections, cpu_seconds, WriteStages};

    #[test]
    fn write_stages_are_the_means_between_two_scrapes() {
        let before = "\
coordstore_raft_write_stage_seconds_sum{stage=\"queue\"} 1
coordstore_raft_write_stage_seconds_count{stage=\"queue\"} 1000
coordstore_raft_write_stage_seconds_sum{stage=\"commit\"} 2
coordstore_raft_write_stage_seconds_count{stage=\"commit\"} 100
coordstore_raft_batch_updates_sum 1000
coordstore_raft_batch_updates_count 100
coordstore_storage_flush_seconds_sum 0.5
coordstore_storage_flush_seconds_count 90
";
        let after = "\
coordstore_raft_write_stage_seconds_sum{stage=\"queue\"} 1.3
coordstore_raft_write_stage_seconds_count{stage=\"queue\"} 2000
coordstore_raft_write_stage_seconds_sum{stage=\"commit\"} 2.05
coordstore_raft_write_stage_seconds_count{stage=\"commit\"} 200
coordstore_raft_write_stage_seconds_sum{stage=\"resume\"} 0.1
coordstore_raft_write_stage_seconds_count{stage=\"resume\"} 1000
coordstore_raft_batch_updates_sum 2500
coordstore_raft_batch_updates_count 200
coordstore_storage_flush_seconds_sum 0.5
coordstore_storage_flush_seconds_count 90
";
        let st = WriteStages::between(before, after);
        let near = |v: Option<f64>, want: f64| v.is_some_and(|v| (v - want).abs() < 1e-6);
        // 0.3 s over 1000 updates; 0.05 s over 100 batches; a stage first
        // exposed in between counts from zero.
        assert!(near(st.queue_us, 300.0), "{st:?}");
        assert!(near(st.commit_us, 500.0), "{st:?}");
        assert!(near(st.resume_us, 100.0), "{st:?}");
        assert!(near(st.updates_per_entry, 15.0), "{st:?}");
        // No flush in between, no apply metric at all: no mean.
        assert_eq!((st.fdatasync_us, st.apply_us), (None, None), "{st:?}");
    }

    #[test]
    fn cpu_seconds_follow_a_busy_process_and_a_missing_one_has_none() {
        let me = [std::process::id()];
        let start = cpu_seconds(&me).expect("this process's /proc/PID/stat");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        let mut spin = 0u64;
        while cpu_seconds(&me).unwrap() < start + 0.05 {
            assert!(std::time::Instant::now() < deadline, "no CPU time counted");
            for i in 0..100_000u64 {
                spin = std::hint::black_box(spin.wrapping_add(i));
            }
        }
        assert!(cpu_seconds(&[u32::MAX]).is_none());
    }

    #[test]
    fn clients_share_connections_in_etcds_shapes() {
        let shapes: Vec<(usize, usize)> = [1, 2, 16, 64, 256]
            .iter()
            .map(|&c| (c, connections(c)))
            .collect();
        assert_eq!(shapes, vec![(1, 1), (2, 2), (16, 8), (64, 8), (256, 16)]);
    }
}
