//! `torch`: N simulated PyTorch ranks (one TCPStore connection each, the
//! protocol spoken by `agent::torch::StoreClient`) doing what a torchrun +
//! NCCL start-up does to its store, in phases, each timed by its slowest
//! rank:
//!
//! * `connect`: connect, VALIDATE, PING; a connect that fails is retried
//!   with torch 2.15's client backoff (500 ms, times 1.5 each time, ±50 %,
//!   at most 60 s) until the phase's timeout, and the kernel's count of
//!   connects dropped from a full accept queue is recorded;
//! * `init`: every rank ADDs `init/` (a TCPStore client given the world
//!   size);
//! * `rendezvous`: M = N / `ranks_per_agent` agents join by
//!   compare-and-set on one key, each retrying with the value the last
//!   attempt answered until its own lands (torch's c10d rendezvous backend);
//!   the value grows by [`STATE_BYTES_PER_AGENT`] per agent joined, as
//!   torch's pickled state does;
//! * `native-rendezvous` (coordstore only): the same M agents through the
//!   cluster's rendezvous service (`agent::rendezvous`, the loop of the
//!   native torchrun handler), `min_nodes = max_nodes = M`: what
//!   `--rdzv-backend coordstore` does, so a full run times it, not the
//!   c10d one, for coordstore;
//! * `nccl-id`: ranks 1..N WAIT for the id, rank 0 SETs it (128 bytes), every
//!   rank GETs it once released;
//! * `barrier`: every rank BARRIERs on one key;
//! * `steady`: every rank CHECKs its dump flag once a second (NCCL's
//!   heartbeat monitor), spread over the second.
//!
//! Peers: coordstore with 1 and 3 nodes (ranks spread over every node;
//! followers forward) and torch's own libuv TCPStore server (the torch
//! venv's Python), driven by the same generator; and `floor`, this binary's
//! `bare-torch` (a tokio server with as many workers as coordstore's by
//! default, answering the handshake, PING and CHECK with no store behind):
//! the connect and steady phases only, the cost of answering the polls at
//! all (the kernel's sockets and wake-ups, tokio's scheduling). Per phase: time, errors,
//! each server's CPU seconds and RSS; in the steady phase each serving
//! node's CPU and the Raft entries per second. A second measure, `handoff`:
//! one rank SETs a key, another (on a follower) WAITs and GETs it, 200
//! times: the hand-off's median and p99.
//!
//! `--real-clients` runs the start-up with stock torch's own clients
//! instead of this generator (see `torch_real`).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agent::torch::StoreClient;
use bytes::Bytes;
use coordstore_tests::wait::eventually;
use coordstore_tests::{listen_overflows, try_status, Cluster};
use proto::torch::{Op, STOP_WAITING};
use tokio::sync::Semaphore;

use crate::memory::rss;
use crate::scale::{cpu_seconds, raise_nofile, ServerUse};

/// What to run.
#[derive(Clone, Debug)]
pub struct Load {
    /// Rank counts (N).
    pub ranks: Vec<usize>,
    /// Ranks per torchrun agent (GPUs per host): M = N / this.
    pub ranks_per_agent: usize,
    /// Length of the steady phase.
    pub steady: Duration,
    /// Connects in flight at once (the same for every peer).
    pub connect_parallel: usize,
    /// A phase taking longer than this fails.
    pub phase_timeout: Duration,
    /// Only the rendezvous: one connection per agent, then torch's c10d
    /// compare-and-set and, on coordstore, the native rendezvous.
    pub rendezvous_only: bool,
}

/// The peers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Peer {
    /// coordstore, this many nodes.
    Coordstore(usize),
    /// torch's own libuv TCPStore server.
    Torch,
    /// `bare-torch`: answers the polls, no store (the steady phase's floor).
    Floor,
}

impl Peer {
    pub(crate) fn name(self) -> String {
        match self {
            Peer::Coordstore(n) => format!("coordstore-{n}"),
            Peer::Torch => "torch-libuv".into(),
            Peer::Floor => "floor".into(),
        }
    }
}

/// One phase of one run.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct PhaseRow {
    /// The phase.
    pub phase: String,
    /// Its slowest rank, s.
    pub seconds: f64,
    /// Each server.
    pub servers: Vec<ServerUse>,
    /// Failed requests (a closed connection, a timeout).
    pub errors: u64,
    /// The first failure.
    pub first_error: Option<String>,
    /// Raft log entries appended during the phase (coordstore).
    pub log_entries: Option<u64>,
    /// Connects the kernel dropped from a full accept queue during the
    /// phase (`TcpExt ListenOverflows` of /proc/net/netstat: the whole
    /// machine's, and each peer runs alone).
    #[serde(default)]
    pub listen_overflows: Option<u64>,
    /// Connects retried with torch's backoff (connect phase).
    #[serde(default)]
    pub connect_retries: u64,
}

/// One (peer, N) run.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Row {
    /// Peer name.
    pub peer: String,
    /// Ranks.
    pub ranks: usize,
    /// Agents (compare-and-set contenders).
    pub agents: usize,
    /// `ok`, or how the run failed.
    pub outcome: String,
    /// The phases run.
    pub phases: Vec<PhaseRow>,
}

impl Row {
    /// Adds `phase`; whether it failed (the row's outcome then says how).
    pub(crate) fn record(&mut self, phase: PhaseRow) -> bool {
        let failed = phase.errors > 0;
        if failed {
            self.outcome = format!(
                "{}: {} errors, first: {}",
                phase.phase,
                phase.errors,
                phase.first_error.clone().unwrap_or_default()
            );
        }
        self.phases.push(phase);
        failed
    }
}

/// The SET → WAIT+GET hand-off of one peer.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Handoff {
    /// Peer name.
    pub peer: String,
    /// Median, ms.
    pub p50_ms: f64,
    /// 99th percentile, ms.
    pub p99_ms: f64,
    /// Median of its first part, SET until the STOP_WAITING arrived (the
    /// write's commit reaching the waiter's server and its apply), ms.
    #[serde(default)]
    pub wake_p50_ms: f64,
    /// Median of its second part, the GET after the STOP_WAITING (a
    /// linearizable read on the waiter's server), ms.
    #[serde(default)]
    pub get_p50_ms: f64,
}

/// The servers of one run.
pub(crate) struct Servers {
    /// Each server's client address and pid.
    pub(crate) addrs: Vec<(SocketAddr, Option<u32>)>,
    cluster: Option<Cluster>,
    torch: Option<std::process::Child>,
}

impl Drop for Servers {
    fn drop(&mut self) {
        if let Some(c) = &mut self.torch {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Servers {
    pub(crate) async fn start(peer: Peer, ranks: usize) -> anyhow::Result<Servers> {
        match peer {
            Peer::Coordstore(nodes) => {
                let parked = (ranks * 2 + 1024).to_string();
                let mut flags = vec![
                    "--raft-heartbeat-ms",
                    "100",
                    "--election-timeout-ms",
                    "1000",
                    "--max-parked-calls",
                    &parked,
                ];
                let extra = crate::peers::SERVER_FLAGS
                    .get()
                    .cloned()
                    .unwrap_or_default();
                flags.extend(extra.iter().map(String::as_str));
                let cluster = Cluster::start_hosts(nodes, &flags);
                let all: Vec<usize> = (0..nodes).collect();
                cluster.wait_leader(&all, Duration::from_secs(60)).await;
                let addrs = cluster
                    .nodes
                    .iter()
                    .map(|n| Ok((n.addr.parse()?, n.pid())))
                    .collect::<anyhow::Result<_>>()?;
                Ok(Servers {
                    addrs,
                    cluster: Some(cluster),
                    torch: None,
                })
            }
            Peer::Torch => start_torch().await,
            Peer::Floor => start_floor().await,
        }
    }

    pub(crate) fn pids(&self) -> Vec<Option<u32>> {
        self.addrs.iter().map(|(_, p)| *p).collect()
    }

    /// Each server's role now.
    async fn roles(&self) -> Vec<String> {
        let Some(c) = &self.cluster else {
            return vec!["torch".into()];
        };
        let mut roles = Vec::new();
        for n in &c.nodes {
            let leads = try_status(&n.addr)
                .await
                .is_some_and(|s| s.leader_id == n.id);
            roles.push(if leads { "leader" } else { "follower" }.to_string());
        }
        roles
    }

    /// The highest last log index of any node (coordstore).
    async fn log_index(&self) -> Option<u64> {
        let c = self.cluster.as_ref()?;
        let mut best = None;
        for n in &c.nodes {
            if let Some(s) = try_status(&n.addr).await {
                best = best.max(Some(s.last_log_index));
            }
        }
        best
    }

    /// A follower's index (the leader's if there is no follower).
    async fn follower(&self) -> usize {
        let roles = self.roles().await;
        roles.iter().position(|r| r == "follower").unwrap_or(0)
    }

    /// The leader's index (0 for a server of one).
    async fn leader(&self) -> usize {
        let roles = self.roles().await;
        roles.iter().position(|r| r == "leader").unwrap_or(0)
    }
}

/// How every peer resolves names, as the report states it.
pub const RESOLUTION: &str = "Name lookups numeric for every peer: coordstore does none; torch's \
     server runs with a shim that makes its getnameinfo numeric (bench/shim), so its reverse \
     lookup of each accepted connection does not time this machine's resolver.\n";

/// The source of the shim that makes every `getnameinfo` of torch's server
/// numeric (see the file's comment).
const NUMERIC_SHIM: &str = include_str!("../shim/numeric_getnameinfo.c");

/// The numeric-`getnameinfo` shim, compiled with `cc` once into
/// `target/bench-shim/` (or the temp dir where that is not writable).
pub(crate) fn numeric_shim() -> anyhow::Result<std::path::PathBuf> {
    let dir = coordstore_tests::workspace().join("target/bench-shim");
    let dir = match std::fs::create_dir_all(&dir) {
        Ok(()) => dir,
        Err(_) => std::env::temp_dir().join("coordstore-bench-shim"),
    };
    std::fs::create_dir_all(&dir)?;
    let (src, lib) = (
        dir.join("numeric_getnameinfo.c"),
        dir.join("numeric_getnameinfo.so"),
    );
    let current = std::fs::read_to_string(&src).is_ok_and(|s| s == NUMERIC_SHIM);
    if !current || !lib.exists() {
        std::fs::write(&src, NUMERIC_SHIM)?;
        let out = std::process::Command::new("cc")
            .args(["-shared", "-fPIC", "-O2", "-o"])
            .arg(&lib)
            .arg(&src)
            .arg("-ldl")
            .output()
            .map_err(|e| anyhow::anyhow!("cc (for torch's server's numeric lookups): {e}"))?;
        anyhow::ensure!(
            out.status.success(),
            "cc could not build {}: {}",
            lib.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(lib)
}

/// torch's libuv TCPStore server in the torch venv's Python, on a free port,
/// its name lookups numeric ([`numeric_shim`], preloaded): without it the
/// server's reverse lookup of each accepted connection times this
/// machine's resolver.
async fn start_torch() -> anyhow::Result<Servers> {
    let python = torch_python()?;
    let port = coordstore_tests::free_port();
    let script = format!(
        "import sys, datetime, torch.distributed as d\n\
         s = d.TCPStore('127.0.0.1', {port}, is_master=True, use_libuv=True, \
         wait_for_workers=False, timeout=datetime.timedelta(hours=1))\n\
         print('LISTENING', flush=True)\n\
         sys.stdin.read()\n"
    );
    let mut child = std::process::Command::new(python)
        .args(["-c", &script])
        .env("LD_PRELOAD", numeric_shim()?)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::fs::File::create(
            std::env::temp_dir().join("coordstore-bench-torch-server.err"),
        )?)
        .spawn()?;
    let stdout = child.stdout.take().expect("piped");
    let listening = tokio::task::spawn_blocking(move || {
        use std::io::BufRead;
        std::io::BufReader::new(stdout)
            .lines()
            .any(|l| l.is_ok_and(|l| l == "LISTENING"))
    });
    anyhow::ensure!(
        tokio::time::timeout(Duration::from_secs(120), listening).await??,
        "torch's server did not start (its stderr: {})",
        std::env::temp_dir()
            .join("coordstore-bench-torch-server.err")
            .display()
    );
    let pid = child.id();
    Ok(Servers {
        addrs: vec![(SocketAddr::from(([127, 0, 0, 1], port)), Some(pid))],
        cluster: None,
        torch: Some(child),
    })
}

/// The torch venv's Python (`scripts/setup-torch.sh` makes it).
pub(crate) fn torch_python() -> anyhow::Result<std::path::PathBuf> {
    let python = coordstore_tests::workspace().join("target/torch-venv/bin/python");
    anyhow::ensure!(
        python.exists(),
        "{} is missing: run scripts/setup-torch.sh",
        python.display()
    );
    Ok(python)
}

/// This binary's `bare-torch` on a free port, with one tokio worker per
/// core (coordstore's default).
async fn start_floor() -> anyhow::Result<Servers> {
    let port = coordstore_tests::free_port();
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let child = std::process::Command::new(std::env::current_exe()?)
        .args(["--load-threads", &cores.to_string(), "bare-torch"])
        .args(["--listen", &addr.to_string()])
        .spawn()?;
    let pid = child.id();
    let servers = Servers {
        addrs: vec![(addr, Some(pid))],
        cluster: None,
        torch: Some(child),
    };
    eventually("bare-torch to answer", Duration::from_secs(30), || {
        StoreClient::connect_from(addr, IpAddr::V4(Ipv4Addr::LOCALHOST), 0)
    })
    .await;
    Ok(servers)
}

/// `bare-torch`: TCPStore's handshake, PING and CHECK (never ready) answered
/// with no store behind, anything else ends the connection; serves until
/// killed.
pub async fn bare_torch(listen: &str) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(listen).await?;
    loop {
        let (stream, _) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        tokio::spawn(bare_connection(stream));
    }
}

/// One connection of `bare-torch`.
async fn bare_connection(mut stream: tokio::net::TcpStream) {
    use bytes::BufMut;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = bytes::BytesMut::new();
    if agent::torch::handshake(&mut stream, &mut buf)
        .await
        .is_err()
    {
        return;
    }
    let mut decoder = proto::torch::Decoder::default();
    let mut out = bytes::BytesMut::new();
    loop {
        loop {
            match decoder.decode(&mut buf) {
                Ok(Some(Op::Ping(n))) => out.put_u32_le(n),
                Ok(Some(Op::Check { .. })) => out.put_u8(proto::torch::NOT_READY),
                Ok(None) => break,
                _ => return,
            }
        }
        if !out.is_empty() {
            if stream.write_all(&out).await.is_err() {
                return;
            }
            out.clear();
        }
        match stream.read_buf(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}

/// The local address client `i` connects from: 127.1.x.y, so that many
/// clients do not run out of one address's ephemeral ports.
fn source(i: usize) -> IpAddr {
    // 4,096 ranks per source address: a run's ports and the TIME_WAIT of the
    // run before it fit one address's ephemeral range (28,232 ports).
    let k = i / 4_096;
    IpAddr::V4(Ipv4Addr::new(127, 1, (k / 250) as u8, (k % 250 + 1) as u8))
}

/// Per-rank outcome of a phase.
type RankResult = Result<(), String>;

/// One rank's part of a phase.
type RankFuture<'a> = std::pin::Pin<Box<dyn std::future::Future<Output = RankResult> + Send + 'a>>;

/// Runs `f` for every rank at once; (slowest rank, errors, first error).
async fn all_ranks<F>(
    clients: &mut [StoreClient],
    timeout: Duration,
    f: F,
) -> (f64, u64, Option<String>)
where
    F: for<'a> Fn(usize, &'a mut StoreClient) -> RankFuture<'a>,
{
    let t0 = Instant::now();
    let futs = clients.iter_mut().enumerate().map(|(i, c)| {
        let fut = f(i, c);
        async move {
            match tokio::time::timeout(timeout, fut).await {
                Ok(r) => r,
                Err(_) => Err("timed out".into()),
            }
        }
    });
    let results = futures_util::future::join_all(futs).await;
    let errors: Vec<String> = results.into_iter().filter_map(Result::err).collect();
    (
        t0.elapsed().as_secs_f64(),
        errors.len() as u64,
        errors.into_iter().next(),
    )
}

fn io(e: std::io::Error) -> String {
    e.to_string()
}

/// Every peer, every N.
pub async fn run(peers: &[Peer], load: &Load) -> anyhow::Result<(Vec<Row>, Vec<Handoff>)> {
    raise_nofile();
    let mut rows = Vec::new();
    let mut handoffs = Vec::new();
    for &peer in peers {
        // The floor answers no SET, WAIT or GET.
        let measured = match peer {
            Peer::Floor => None,
            _ => Some(handoffs_of(peer).await),
        };
        match measured {
            None => {}
            Some(Ok(h)) => handoffs.extend(h),
            Some(Err(e)) => eprintln!("torch: {} handoff: {e:#}", peer.name()),
        }
        for &n in &load.ranks {
            eprintln!("torch: {}, {n} ranks", peer.name());
            let row = one(peer, n, load).await.unwrap_or_else(|e| Row {
                peer: peer.name(),
                ranks: n,
                agents: 0,
                outcome: format!("failed to start: {e:#}"),
                phases: Vec::new(),
            });
            eprintln!("torch: {} {n}: {}", peer.name(), row.outcome);
            rows.push(row);
        }
    }
    Ok((rows, handoffs))
}

/// One peer, one N.
async fn one(peer: Peer, n: usize, load: &Load) -> anyhow::Result<Row> {
    let servers = Servers::start(peer, n).await?;
    let agents = (n / load.ranks_per_agent.max(1)).max(1);
    let mut row = Row {
        peer: peer.name(),
        ranks: n,
        agents,
        outcome: "ok".into(),
        phases: Vec::new(),
    };
    let pids = servers.pids();
    let mut clients = Vec::new();
    let connects = if load.rendezvous_only { agents } else { n };
    let mut retries = 0;
    let mut phase = timed(&servers, &pids, "connect", async {
        connect_all(&servers, connects, load, &mut clients, &mut retries).await
    })
    .await;
    phase.connect_retries = retries;
    let failed = phase.errors > 0;
    row.phases.push(phase);
    if failed {
        row.outcome = "connect failed".into();
        return Ok(row);
    }
    let phases: &[&str] = match (peer, load.rendezvous_only) {
        (Peer::Floor, _) => &["steady"],
        (Peer::Coordstore(_), true) => &["rendezvous", "native-rendezvous"],
        (_, true) => &["rendezvous"],
        (Peer::Coordstore(_), false) => {
            &["init", "native-rendezvous", "nccl-id", "barrier", "steady"]
        }
        _ => &["init", "rendezvous", "nccl-id", "barrier", "steady"],
    };
    let nodes: Vec<String> = servers.addrs.iter().map(|(a, _)| a.to_string()).collect();
    for &name in phases {
        let t = load.phase_timeout;
        let phase = if name == "native-rendezvous" {
            let fut = native_rendezvous(&nodes, agents, t);
            timed(&servers, &pids, name, fut).await
        } else {
            let fut = run_phase(name, &mut clients, agents, load, t);
            timed(&servers, &pids, name, fut).await
        };
        let failed = row.record(phase);
        // A phase that timed out leaves replies unread on its connections
        // (the next phase would read them); the rendezvous-only runs'
        // native phase does not use them.
        if failed && !load.rendezvous_only {
            break;
        }
    }
    Ok(row)
}

/// Runs `fut` (a phase) measuring the servers around it.
pub(crate) async fn timed(
    servers: &Servers,
    pids: &[Option<u32>],
    name: &str,
    fut: impl std::future::Future<Output = (f64, u64, Option<String>)>,
) -> PhaseRow {
    let cpu0: Vec<f64> = pids.iter().map(|p| p.map_or(0.0, cpu_seconds)).collect();
    let log0 = servers.log_index().await;
    let over0 = listen_overflows();
    let (seconds, errors, first_error) = fut.await;
    let over1 = listen_overflows();
    let log1 = servers.log_index().await;
    let roles = servers.roles().await;
    let servers = pids
        .iter()
        .zip(cpu0)
        .zip(roles)
        .map(|((p, c0), role)| ServerUse {
            role,
            cpu_s: p.map_or(0.0, cpu_seconds) - c0,
            rss_mib: p.and_then(|p| rss(p).ok()).unwrap_or(0) as f64 / (1024.0 * 1024.0),
        })
        .collect();
    eprintln!("torch:   {name}: {seconds:.2} s, {errors} errors");
    PhaseRow {
        phase: name.into(),
        seconds,
        servers,
        errors,
        first_error,
        log_entries: log0.zip(log1).map(|(a, b)| b.saturating_sub(a)),
        listen_overflows: over0.zip(over1).map(|(a, b)| b.saturating_sub(a)),
        connect_retries: 0,
    }
}

/// torch 2.15's client backoff between connect attempts: 500 ms, times
/// 1.5 each attempt, ±50 %, at most 60 s.
fn backoff(attempt: u32, jitter: f64) -> Duration {
    let base = 0.5 * 1.5f64.powi(attempt as i32);
    let jittered = base * (0.5 + jitter);
    Duration::from_secs_f64(jittered.min(60.0))
}

/// Connects rank `i` to `addr`, retrying with torch's backoff until
/// `within` passed: the client, and how many retries it took.
async fn connect_retrying(
    addr: SocketAddr,
    i: usize,
    within: Duration,
) -> (std::io::Result<StoreClient>, u64) {
    let until = Instant::now() + within;
    let mut attempt = 0u32;
    loop {
        match StoreClient::connect_from(addr, source(i), i as u32).await {
            Ok(c) => return (Ok(c), u64::from(attempt)),
            Err(e) if Instant::now() >= until => return (Err(e), u64::from(attempt)),
            Err(_) => {
                // A deterministic spread per rank and attempt, in [0, 1).
                let h = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ u64::from(attempt);
                let jitter =
                    (h.wrapping_mul(0xBF58_476D_1CE4_E5B9) >> 11) as f64 / (1u64 << 53) as f64;
                tokio::time::sleep(backoff(attempt, jitter)).await;
                attempt += 1;
            }
        }
    }
}

/// Connects N clients, spread over the servers, `connect_parallel` at once.
async fn connect_all(
    servers: &Servers,
    n: usize,
    load: &Load,
    clients: &mut Vec<StoreClient>,
    retries: &mut u64,
) -> (f64, u64, Option<String>) {
    let t0 = Instant::now();
    let gate = Arc::new(Semaphore::new(load.connect_parallel.max(1)));
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let (addr, _) = servers.addrs[i % servers.addrs.len()];
            let gate = gate.clone();
            let within = load.phase_timeout;
            tokio::spawn(async move {
                let _permit = gate.acquire().await.expect("open");
                connect_retrying(addr, i, within).await
            })
        })
        .collect();
    let mut errors = Vec::new();
    for t in tasks {
        match t.await {
            Ok((Ok(c), tries)) => {
                *retries += tries;
                clients.push(c)
            }
            Ok((Err(e), tries)) => {
                *retries += tries;
                errors.push(e.to_string())
            }
            Err(e) => errors.push(e.to_string()),
        }
    }
    (
        t0.elapsed().as_secs_f64(),
        errors.len() as u64,
        errors.into_iter().next(),
    )
}

/// One phase after connect.
async fn run_phase(
    name: &str,
    clients: &mut [StoreClient],
    agents: usize,
    load: &Load,
    t: Duration,
) -> (f64, u64, Option<String>) {
    let n = clients.len();
    match name {
        "init" => {
            all_ranks(clients, t, |_, c| {
                Box::pin(async move { c.add("init/", 1).await.map(|_| ()).map_err(io) })
            })
            .await
        }
        "rendezvous" => {
            let every = (n / agents).max(1);
            all_ranks(clients, t, move |i, c| {
                Box::pin(async move {
                    if i % every != 0 {
                        return Ok(());
                    }
                    join(c, i / every).await
                })
            })
            .await
        }
        "nccl-id" => nccl_id(clients, t).await,
        "barrier" => {
            all_ranks(clients, t, move |_, c| {
                Box::pin(async move { c.barrier("/bench/barrier", n as i64).await.map_err(io) })
            })
            .await
        }
        _ => {
            let steady = load.steady;
            all_ranks(clients, steady + t, move |i, c| {
                Box::pin(poll_dump_flag(c, i, n, steady))
            })
            .await
        }
    }
}

/// Bytes torch 2.15's pickled, base64-encoded rendezvous state grows by
/// per agent (a node descriptor in participants and in last_heartbeats;
/// upstream checks 1,000 agents stay under 160 KB).
pub const STATE_BYTES_PER_AGENT: usize = 150;

/// One agent's join: compare-and-set on the rendezvous key, retrying with
/// what the last attempt answered, until its own value lands; the value
/// is the count and [`STATE_BYTES_PER_AGENT`] per agent counted, as
/// torch's state.
async fn join(c: &mut StoreClient, agent: usize) -> RankResult {
    const KEY: &str = "/torch.rendezvous.bench";
    let mut expected = Bytes::new();
    loop {
        let count = std::str::from_utf8(&expected[..expected.len().min(24)])
            .ok()
            .and_then(|s| s.split(':').next()?.parse::<u64>().ok())
            .unwrap_or(0);
        let mut desired = format!("{}:agent-{agent}:", count + 1);
        let size = STATE_BYTES_PER_AGENT * (count as usize + 1);
        desired.extend(std::iter::repeat_n('.', size.saturating_sub(desired.len())));
        let got = c
            .compare_set(KEY, &expected, desired.as_bytes())
            .await
            .map_err(io)?;
        if got.as_ref() == desired.as_bytes() {
            return Ok(());
        }
        expected = got;
    }
}

/// M agents through the cluster's rendezvous service (the native torchrun
/// handler's loop), spread over `nodes`, until each has its round.
async fn native_rendezvous(nodes: &[String], m: usize, t: Duration) -> (f64, u64, Option<String>) {
    use agent::closures::Nodes;
    use agent::rendezvous::{Agent, Run, Settings};
    let run = format!("bench-{}", std::process::id());
    let t0 = Instant::now();
    let tasks: Vec<_> = (0..m)
        .map(|i| {
            let mut order = nodes.to_vec();
            order.rotate_left(i % nodes.len());
            let run = run.clone();
            tokio::spawn(async move {
                let r = Run::new(&Nodes::plain(&order, None), &run).map_err(|e| e.to_string())?;
                let me = Agent {
                    addr: format!("10.{}.{}.{}", i >> 16, (i >> 8) & 255, i & 255),
                    pid: 1000,
                    local_id: 0,
                };
                let s = Settings::torch(m as u32, m as u32);
                match tokio::time::timeout(t, r.next_rendezvous(&me, &s, t, false)).await {
                    Ok(Ok(f)) if f.world_size as usize == m => Ok(()),
                    Ok(Ok(f)) => Err(format!("formed {f:?}")),
                    Ok(Err(e)) => Err(e.to_string()),
                    Err(_) => Err("timed out".to_string()),
                }
            })
        })
        .collect();
    let mut errors = Vec::new();
    for task in tasks {
        match task.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => errors.push(e),
            Err(e) => errors.push(e.to_string()),
        }
    }
    (
        t0.elapsed().as_secs_f64(),
        errors.len() as u64,
        errors.into_iter().next(),
    )
}

/// Ranks 1..N WAIT for the id, rank 0 SETs it once every WAIT is sent,
/// every rank GETs it once released.
async fn nccl_id(clients: &mut [StoreClient], t: Duration) -> (f64, u64, Option<String>) {
    const KEY: &str = "/bench/nccl-id";
    let t0 = Instant::now();
    let (first, rest) = clients.split_first_mut().expect("ranks");
    let wait = Op::Wait {
        keys: vec![KEY.into()],
    };
    let mut errors = Vec::new();
    for c in rest.iter_mut() {
        if let Err(e) = c.send(&wait).await {
            errors.push(e.to_string());
        }
    }
    if let Err(e) = first.set(KEY, &[7u8; 128]).await {
        errors.push(e.to_string());
    }
    let (_, more, first_error) = all_ranks(rest, t, |_, c| {
        Box::pin(async move {
            match c.u8().await.map_err(io)? {
                STOP_WAITING => {}
                b => return Err(format!("WAIT answered {b}")),
            }
            let id = c.get(KEY).await.map_err(io)?;
            (id.len() == 128).then_some(()).ok_or("a short id".into())
        })
    })
    .await;
    let total = errors.len() as u64 + more;
    (
        t0.elapsed().as_secs_f64(),
        total,
        errors.into_iter().next().or(first_error),
    )
}

/// CHECK of the rank's dump flag once a second for `steady`, rank `i` of
/// `n` at its own offset in each second.
async fn poll_dump_flag(c: &mut StoreClient, i: usize, n: usize, steady: Duration) -> RankResult {
    let key = format!("/bench/dump/{i}");
    let start = tokio::time::Instant::now() + Duration::from_secs_f64(i as f64 / n as f64);
    let rounds = steady.as_secs().max(1);
    for r in 0..rounds {
        tokio::time::sleep_until(start + Duration::from_secs(r)).await;
        if c.check(&[key.as_str()]).await.map_err(io)? {
            return Err("the dump flag is set".into());
        }
    }
    Ok(())
}

/// The SET → WAIT+GET hand-off: a setter on the leader, a getter on a
/// follower (on one server: both there), 200 times; on 3 nodes also with
/// the getter on the leader (`… waiter on the leader`): what the follower
/// adds.
async fn handoffs_of(peer: Peer) -> anyhow::Result<Vec<Handoff>> {
    let servers = Servers::start(peer, 2).await?;
    let (l, f) = (servers.leader().await, servers.follower().await);
    let mut rows = vec![handoff(&servers, peer.name(), l, f).await?];
    if l != f {
        let name = format!("{} waiter on the leader", peer.name());
        rows.push(handoff(&servers, name, l, l).await?);
    }
    Ok(rows)
}

/// 200 hand-offs from a setter on server `s` to a getter on server `g`.
async fn handoff(servers: &Servers, name: String, s: usize, g: usize) -> anyhow::Result<Handoff> {
    let from = source(0);
    let mut setter = StoreClient::connect_from(servers.addrs[s].0, from, 1).await?;
    let mut getter = StoreClient::connect_from(servers.addrs[g].0, from, 2).await?;
    let (mut ms, mut wake, mut get) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..200 {
        let key = format!("/handoff/{name}/{i}");
        getter
            .send(&Op::Wait {
                keys: vec![key.clone()],
            })
            .await?;
        let t0 = Instant::now();
        setter.set(&key, b"id").await?;
        anyhow::ensure!(getter.u8().await? == STOP_WAITING, "WAIT answered");
        let woken = t0.elapsed();
        let v = getter.get(&key).await?;
        let took = t0.elapsed();
        ms.push(took.as_secs_f64() * 1e3);
        wake.push(woken.as_secs_f64() * 1e3);
        get.push((took - woken).as_secs_f64() * 1e3);
        anyhow::ensure!(v.as_ref() == b"id", "GET answered {v:?}");
    }
    for v in [&mut ms, &mut wake, &mut get] {
        v.sort_by(f64::total_cmp);
    }
    Ok(Handoff {
        peer: name,
        p50_ms: ms[ms.len() / 2],
        p99_ms: ms[ms.len() * 99 / 100],
        wake_p50_ms: wake[wake.len() / 2],
        get_p50_ms: get[get.len() / 2],
    })
}

/// A run's start-up (init..barrier), s; — for a peer that runs none.
fn startup(r: &Row) -> String {
    let phases: Vec<f64> = r
        .phases
        .iter()
        .filter(|p| {
            [
                "init",
                "rendezvous",
                "native-rendezvous",
                "nccl-id",
                "barrier",
            ]
            .contains(&p.phase.as_str())
        })
        .map(|p| p.seconds)
        .collect();
    match phases.is_empty() {
        true => "—".to_string(),
        false => format!("{:.2}", phases.iter().sum::<f64>()),
    }
}

/// A phase's table cells of each server's CPU seconds and RSS (MiB).
pub(crate) fn server_cells(p: &PhaseRow) -> (String, String) {
    let cpu: Vec<String> = p
        .servers
        .iter()
        .map(|s| format!("{:.2}", s.cpu_s))
        .collect();
    let mem: Vec<String> = p
        .servers
        .iter()
        .map(|s| format!("{:.0}", s.rss_mib))
        .collect();
    (cpu.join(" / "), mem.join(" / "))
}

/// The connect phase's listen overflows and connect retries.
fn overflows(p: &PhaseRow) -> String {
    match (p.phase.as_str(), p.listen_overflows) {
        ("connect", Some(o)) => format!("{o} / {}", p.connect_retries),
        ("connect", None) => format!("? / {}", p.connect_retries),
        _ => "—".into(),
    }
}

/// The markdown tables.
pub fn table(rows: &[Row], handoffs: &[Handoff]) -> String {
    let mut md = String::from(
        "| peer | ranks | agents | phase | s | server CPU s | server RSS MiB | Raft entries | errors | listen overflows / connect retries |\n\
         |---|---:|---:|---|---:|---|---|---:|---:|---:|\n",
    );
    for r in rows {
        if r.phases.is_empty() {
            md.push_str(&format!(
                "| {} | {} | {} | — | — | — | — | — | {} | — |\n",
                r.peer, r.ranks, r.agents, r.outcome
            ));
        }
        for p in &r.phases {
            let (cpu, mem) = server_cells(p);
            md.push_str(&format!(
                "| {} | {} | {} | {} | {:.2} | {} | {} | {} | {} | {} |\n",
                r.peer,
                r.ranks,
                r.agents,
                p.phase,
                p.seconds,
                cpu,
                mem,
                p.log_entries.map_or("—".into(), |e| e.to_string()),
                p.errors,
                overflows(p)
            ));
        }
    }
    md.push_str("\n| peer | start-up s (init..barrier) | steady: CPU % per server | steady: Raft entries/s |\n|---|---:|---|---:|\n");
    for r in rows {
        let startup = startup(r);
        let steady = r.phases.iter().find(|p| p.phase == "steady");
        let (cpu, entries) = steady.map_or(("—".into(), "—".into()), |p| {
            let cpu: Vec<String> = p
                .servers
                .iter()
                .map(|s| format!("{:.1}", 100.0 * s.cpu_s / p.seconds))
                .collect();
            let e = p
                .log_entries
                .map_or("—".into(), |e| format!("{:.2}", e as f64 / p.seconds));
            (cpu.join(" / "), e)
        });
        md.push_str(&format!(
            "| {} {} | {startup} | {cpu} | {entries} |\n",
            r.peer, r.ranks
        ));
    }
    md.push_str(
        "\n| peer | SET→WAIT+GET p50 ms | p99 ms | of which SET→STOP_WAITING p50 | GET p50 |\n|---|---:|---:|---:|---:|\n",
    );
    for h in handoffs {
        md.push_str(&format!(
            "| {} | {:.3} | {:.3} | {:.3} | {:.3} |\n",
            h.peer, h.p50_ms, h.p99_ms, h.wake_p50_ms, h.get_p50_ms
        ));
    }
    md
}
