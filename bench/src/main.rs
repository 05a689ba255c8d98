//! `coordstore-bench <suite>`: runs a benchmark suite with every peer in the
//! same run, and writes `bench/results/<suite>-<unix time>.json`, the
//! markdown table (stdout and `bench/results/<suite>.md`) and one PNG chart
//! per workload (`bench/results/<workload>.png`).

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use coordstore_bench::peers::PeerKind;
use coordstore_bench::report::{Machine, Report};
use coordstore_bench::{
    barrier, closures, failover, handoff, jax_latency, kv, memory, namespaces, parked, propose,
    replay, scale, tfdata, torch, torch_real,
};

#[derive(Parser)]
#[command(name = "coordstore-bench")]
struct Cli {
    /// Where results are written.
    #[arg(long, default_value = "bench/results")]
    out: PathBuf,
    /// Peers to compare (default: all that the workload applies to).
    #[arg(long, value_enum, value_delimiter = ',', global = true)]
    peers: Vec<PeerKind>,
    /// Extra `coordstore serve` flags for the coordstore peers, e.g.
    /// `--server-flags=--cache-bytes,16777216`.
    #[arg(long, value_delimiter = ',', allow_hyphen_values = true, global = true)]
    server_flags: Vec<String>,
    /// Tokio worker threads of the load generator (this process: every
    /// client's calls). Few by default, since on a small machine they take
    /// cores from the servers; on a large one the default can cap the
    /// throughput of every peer at many clients (compare with the jaxlib
    /// built-in peer, in memory, which then does not run faster either).
    #[arg(long, default_value_t = coordstore_bench::DEFAULT_LOAD_THREADS, global = true)]
    load_threads: usize,
    /// Keep the status page refreshing on every coordstore node while a
    /// peer runs: fetch its JSON views every this many ms (the page itself
    /// refreshes every 2000).
    #[arg(long, global = true)]
    ui_refresh_ms: Option<u64>,
    #[command(subcommand)]
    suite: Suite,
}

#[derive(Subcommand)]
enum Suite {
    /// Every workload below (not propose / jax-latency), one report.
    All(AllArgs),
    /// KV put with 1/16/64/256 clients, linearizable get with 1/64.
    Kv(KvArgs),
    /// Blocking-get hand-off: a set in one client wakes a waiting get.
    Handoff {
        /// Measured hand-offs per peer.
        #[arg(long, default_value_t = 200)]
        iterations: usize,
    },
    /// Registration of N tasks, then barrier rounds.
    Barrier {
        /// Task counts.
        #[arg(long, value_delimiter = ',', default_value = "2,64,1024")]
        tasks: Vec<usize>,
    },
    /// SIGKILL of the leader under writes → writes succeed again.
    Failover {
        /// Leader kills per peer.
        #[arg(long, default_value_t = 10)]
        kills: usize,
    },
    /// Restart of a node holding 1M journal entries, without/with snapshots.
    Replay {
        /// Journal entries.
        #[arg(long, default_value_t = 1_000_000)]
        entries: u64,
    },
    /// KV put with 64 clients while 0 / 10,000 blocking gets are parked.
    Parked(ParkedArgs),
    /// RSS per parked call: N blocking gets parked on one coordstore node,
    /// beside a bare tonic server holding N open gRPC streams (the floor).
    ParkedMemory(ParkedMemoryArgs),
    /// A bare tonic server (the gRPC health service only), for
    /// parked-memory's floor.
    #[command(hide = true)]
    BareGrpc {
        /// Address to serve.
        #[arg(long)]
        listen: String,
    },
    /// A bare TCPStore responder (handshake, PING, CHECK; no store), for
    /// torch's floor peer.
    #[command(hide = true)]
    BareTorch {
        /// Address to serve.
        #[arg(long)]
        listen: String,
    },
    /// Server RSS holding 100k keys of 1 KiB.
    Memory(MemoryArgs),
    /// Renders the markdown and charts of a results JSON again (into --out).
    Report {
        /// A `bench/results/<suite>-<time>.json`.
        json: PathBuf,
    },
    /// Replicated write throughput and latency through the Node API.
    Propose(ProposeArgs),
    /// Stock jaxlib client latency (kv_set, blocking get, 2-task barrier):
    /// jaxlib's built-in service vs coordstore with 1 and 3 nodes.
    JaxLatency {
        /// Iterations per op.
        #[arg(long, default_value_t = 200)]
        iterations: usize,
    },
    /// The durable closure queue through 3 nodes: schedule → result with
    /// 1 and 16 workers, and a dead worker's closure running elsewhere.
    Closures(ClosuresArgs),
    /// One job of N simulated jaxlib tasks (or M jobs of N/M in namespaces)
    /// through register, topology exchange, barrier, steady heartbeats and
    /// shutdown: coordstore 1 and 3 nodes beside jaxlib's built-in service.
    Scale(ScaleArgs),
    /// N simulated PyTorch ranks (TCPStore connections) through a torchrun +
    /// NCCL start-up (connect, init/, rendezvous compare-and-set, NCCL id
    /// hand-off, barrier) and steady dump-flag polling: coordstore 1 and 3
    /// nodes beside torch's own libuv server; and one SET→WAIT+GET hand-off.
    Torch(TorchArgs),
    /// Many jobs on one 3-node cluster: M namespaces of T tasks at once,
    /// against one namespace of M × T tasks and the M one after another;
    /// the RSS of an empty namespace; create → registered on a follower.
    Namespaces(NamespacesArgs),
    /// tf.data dispatcher call latency, coordstore beside TensorFlow 2.21's
    /// own dispatcher (in memory and fault tolerant).
    Tfdata(TfdataArgs),
}

// The options of `coordstore-bench all`.
#[derive(clap::Args)]
struct AllArgs {
    /// Seconds per KV configuration.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Leader kills per replicated peer.
    #[arg(long, default_value_t = 10)]
    kills: usize,
    /// Journal entries for the replay workload.
    #[arg(long, default_value_t = 1_000_000)]
    entries: u64,
}

// The options of `coordstore-bench kv`.
#[derive(clap::Args)]
struct KvArgs {
    /// Concurrent put clients.
    #[arg(long, value_delimiter = ',', default_value = "1,16,64,256")]
    clients: Vec<usize>,
    /// Concurrent get clients.
    #[arg(long, value_delimiter = ',', default_value = "1,64")]
    get_clients: Vec<usize>,
    /// Seconds per configuration.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Value size.
    #[arg(long, default_value_t = 256)]
    value_bytes: usize,
}

// The options of `coordstore-bench parked`.
#[derive(clap::Args)]
struct ParkedArgs {
    /// Parked gets per configuration.
    #[arg(long, value_delimiter = ',', default_value = "0,10000")]
    parked: Vec<usize>,
    /// Concurrent put clients.
    #[arg(long, default_value_t = 64)]
    clients: usize,
    /// Seconds per configuration.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
}

// The options of `coordstore-bench parked-memory`.
#[derive(clap::Args)]
struct ParkedMemoryArgs {
    /// Calls held open.
    #[arg(long, default_value_t = 16384)]
    calls: usize,
    /// Calls per HTTP/2 connection.
    #[arg(long, default_value_t = 16)]
    per_conn: usize,
}

// The options of `coordstore-bench memory`.
#[derive(clap::Args)]
struct MemoryArgs {
    /// Keys.
    #[arg(long, default_value_t = 100_000)]
    keys: usize,
    /// Value size.
    #[arg(long, default_value_t = 1024)]
    value_bytes: usize,
}

// The options of `coordstore-bench propose`.
#[derive(clap::Args)]
struct ProposeArgs {
    /// Cluster sizes.
    #[arg(long, value_delimiter = ',', default_value = "3")]
    nodes: Vec<usize>,
    /// Concurrent proposers.
    #[arg(long, value_delimiter = ',', default_value = "1,64")]
    clients: Vec<usize>,
    /// Seconds per configuration.
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// Value size.
    #[arg(long, default_value_t = 256)]
    value_bytes: usize,
}

// The options of `coordstore-bench closures`.
#[derive(clap::Args)]
struct ClosuresArgs {
    /// Worker counts.
    #[arg(long, value_delimiter = ',', default_value = "1,16")]
    workers: Vec<usize>,
    /// Closures the coordinator keeps in flight in the batched runs
    /// (the per-closure runs keep 64).
    #[arg(long, default_value_t = 1024)]
    in_flight: usize,
    /// Closures per schedule_many in the batched runs.
    #[arg(long, default_value_t = 256)]
    batch: usize,
    /// Closures per worker get in the batched runs.
    #[arg(long, default_value_t = 16)]
    prefetch: u32,
    /// Seconds per worker count.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Worker deaths (lease 1 s).
    #[arg(long, default_value_t = 6)]
    deaths: usize,
}

// The options of `coordstore-bench scale`.
#[derive(clap::Args)]
struct ScaleArgs {
    /// Task counts (N).
    #[arg(long, value_delimiter = ',', default_value = "1024,4096,16384,65536")]
    tasks: Vec<usize>,
    /// Jobs (namespaces) the N tasks are split into.
    #[arg(long, default_value_t = 1)]
    namespaces: usize,
    /// Tasks per HTTP/2 connection [default: 1, or as many as the
    /// file-descriptor limit needs]
    #[arg(long)]
    tasks_per_conn: Option<usize>,
    /// Seconds of the steady phase.
    #[arg(long, default_value_t = 60.0)]
    steady_seconds: f64,
    /// The job's heartbeat timeout, s (jaxlib heartbeats every half:
    /// jax's default 100 s → every 50 s).
    #[arg(long, default_value_t = 100)]
    heartbeat_timeout_s: u64,
    /// A call slower than this counts as an error, s.
    #[arg(long, default_value_t = 300)]
    call_timeout_s: u64,
}

// The options of `coordstore-bench torch`.
#[derive(clap::Args)]
struct TorchArgs {
    /// Rank counts (N).
    #[arg(long, value_delimiter = ',', default_value = "1024,4096,16384,65536")]
    ranks: Vec<usize>,
    /// Ranks per torchrun agent (GPUs per host): N / this agents contend
    /// on the rendezvous key.
    #[arg(long, default_value_t = 8)]
    ranks_per_agent: usize,
    /// Seconds of the steady phase.
    #[arg(long, default_value_t = 30.0)]
    steady_seconds: f64,
    /// Connects in flight at once.
    #[arg(long, default_value_t = 512)]
    connect_parallel: usize,
    /// A phase slower than this fails, s.
    #[arg(long, default_value_t = 600)]
    phase_timeout_s: u64,
    /// Peers: coordstore-1, coordstore-3, torch, floor (a bare responder:
    /// connect and steady only) [default: the first three]
    #[arg(long, value_delimiter = ',')]
    torch_peers: Vec<String>,
    /// Only the SET→WAIT+GET hand-off, no rank counts.
    #[arg(long)]
    handoff_only: bool,
    /// Only the rendezvous of N / ranks-per-agent agents (one connection
    /// each): torch's c10d compare-and-set on every peer, and on
    /// coordstore the native rendezvous too.
    #[arg(long)]
    rendezvous_only: bool,
    /// Stock torch's own TCPStore clients (bench/python/torch_clients.py,
    /// in the torch venv) make the start-up instead of the generator:
    /// connect, init, torch's store-based barrier, the id, a second barrier.
    #[arg(long)]
    real_clients: bool,
    /// Processes of the real clients (one thread per rank in each).
    #[arg(long, default_value_t = 8)]
    client_procs: usize,
}

// The options of `coordstore-bench namespaces`.
#[derive(clap::Args)]
struct NamespacesArgs {
    /// Namespaces (M).
    #[arg(long, default_value_t = 100)]
    namespaces: usize,
    /// Tasks in each (T).
    #[arg(long, default_value_t = 16)]
    tasks: usize,
    /// Rounds of the three runs.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Empty namespaces for the RSS measurement.
    #[arg(long, default_value_t = 1000)]
    empty: usize,
    /// Create → registered samples.
    #[arg(long, default_value_t = 50)]
    creates: usize,
}

// The options of `coordstore-bench tfdata`.
#[derive(clap::Args)]
struct TfdataArgs {
    /// Calls per kind.
    #[arg(long, default_value_t = 500)]
    iterations: usize,
    /// Journal entries before the restart measurement (0: skip it).
    #[arg(long, default_value_t = 100_000)]
    history: usize,
    /// Runs of the stall across a dispatcher death, per peer (0: skip it).
    #[arg(long, default_value_t = 3)]
    stall_runs: usize,
    /// Skip the call latencies and time to the first element (to run
    /// only the restart and stall parts).
    #[arg(long)]
    no_calls: bool,
    /// GetSplit callers pulling at once (a connection each).
    #[arg(long, value_delimiter = ',', default_value = "16,64,256")]
    split_callers: Vec<usize>,
    /// Seconds per split caller count.
    #[arg(long, default_value_t = 3.0)]
    split_seconds: f64,
    /// Skip the time to the first element.
    #[arg(long)]
    no_first_element: bool,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    coordstore_bench::set_load_threads(cli.load_threads);
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(coordstore_bench::load_threads())
        .enable_all()
        .build()?
        .block_on(run(cli))
}

/// The options every coordstore peer of this run starts with.
fn set_peer_options(cli: &Cli) {
    coordstore_bench::peers::SERVER_FLAGS
        .set(cli.server_flags.clone())
        .expect("set once");
    if let Some(ms) = cli.ui_refresh_ms {
        coordstore_bench::peers::UI_REFRESH_MS
            .set(ms)
            .expect("set once");
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    std::fs::create_dir_all(&cli.out)?;
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs();
    set_peer_options(&cli);
    let peers = if cli.peers.is_empty() {
        PeerKind::ALL.to_vec()
    } else {
        cli.peers.clone()
    };
    let out = Out {
        dir: cli.out.clone(),
        stamp,
    };
    let mut report = Report {
        machine: Machine::read(),
        started_unix: stamp,
        ..Default::default()
    };
    let name = match cli.suite {
        Suite::Report { json } => return render_again(&json, &out.dir),
        Suite::BareGrpc { listen } => return parked::bare_grpc(&listen).await,
        Suite::BareTorch { listen } => return torch::bare_torch(&listen).await,
        Suite::ParkedMemory(a) => return parked_memory(&out, a).await,
        Suite::Propose(a) => return proposes(&out, a).await,
        Suite::Tfdata(a) => return tfdata_suite(&out, a).await,
        Suite::Closures(a) => return closures_suite(&out, a).await,
        Suite::Scale(a) => return scale_suite(&out, a, &cli.peers, &report.machine).await,
        Suite::Torch(a) => return torch_suite(&out, a, &report.machine).await,
        Suite::Namespaces(a) => return namespaces_suite(&out, a).await,
        Suite::JaxLatency { iterations } => return jax_latency_suite(&out, iterations).await,
        Suite::All(a) => {
            all(&mut report, &peers, a).await?;
            "all"
        }
        Suite::Kv(a) => {
            report.kv =
                kv::run(&peers, &a.clients, &a.get_clients, a.seconds, a.value_bytes).await?;
            "kv"
        }
        Suite::Handoff { iterations } => {
            report.handoff = handoff::run(&peers, iterations).await?;
            "handoff"
        }
        Suite::Barrier { tasks } => {
            report.barrier = barrier::run(&peers, &tasks).await?;
            "barrier"
        }
        Suite::Failover { kills } => {
            report.failover = failover::run(&peers, kills).await?;
            "failover"
        }
        Suite::Replay { entries } => {
            replays(&mut report, &peers, entries).await?;
            "replay"
        }
        Suite::Parked(a) => {
            report.parked = parked::run(&peers, &a.parked, a.clients, a.seconds).await?;
            "parked"
        }
        Suite::Memory(a) => {
            report.memory = memory::run(&peers, a.keys, a.value_bytes).await?;
            "memory"
        }
    };
    save_report(&mut report, name, &out)
}

/// Where a run's results go: the directory, and the run's time stamp in
/// the JSON file names.
struct Out {
    dir: PathBuf,
    stamp: u64,
}

impl Out {
    /// Writes `value` as `<dir>/<name>-<stamp>.json`; its path.
    fn json(&self, name: &str, value: &impl serde::Serialize) -> anyhow::Result<PathBuf> {
        let path = self.dir.join(format!("{name}-{}.json", self.stamp));
        std::fs::write(&path, serde_json::to_string_pretty(value)?)?;
        Ok(path)
    }
}

/// `report`: the markdown and charts of a results JSON again, into `dir`.
fn render_again(json: &std::path::Path, dir: &std::path::Path) -> anyhow::Result<()> {
    let report: Report = serde_json::from_slice(&std::fs::read(json)?)?;
    let md = report.markdown();
    println!("{md}");
    for chart in report.charts(dir)? {
        eprintln!("chart: {}", chart.display());
    }
    Ok(())
}

/// `all`: every workload of the report into `report`.
async fn all(report: &mut Report, peers: &[PeerKind], a: AllArgs) -> anyhow::Result<()> {
    report.kv = kv::run(peers, &[1, 16, 64, 256], &[1, 64], a.seconds, 256).await?;
    report.handoff = handoff::run(peers, 200).await?;
    report.barrier = barrier::run(peers, &[2, 64, 1024]).await?;
    report.failover = failover::run(peers, a.kills).await?;
    replays(report, peers, a.entries).await?;
    report.memory = memory::run(peers, 100_000, 1024).await?;
    report.parked = parked::run(peers, &[0, 10_000], 64, a.seconds).await?;
    Ok(())
}

/// `replay`, for the peers among `peers` it runs on, into `report`.
async fn replays(report: &mut Report, peers: &[PeerKind], entries: u64) -> anyhow::Result<()> {
    if peers.contains(&PeerKind::Coordstore1) {
        report.replay = replay::run(entries).await?;
    }
    if peers.contains(&PeerKind::Etcd3) {
        report.replay.extend(replay::run_etcd(entries).await?);
    }
    Ok(())
}

/// Evaluates `report` and writes it as `<name>-<stamp>.json`, `<name>.md`
/// (printed too) and its charts.
fn save_report(report: &mut Report, name: &str, out: &Out) -> anyhow::Result<()> {
    report.evaluate();
    let json = out.json(name, &*report)?;
    let md = report.markdown();
    std::fs::write(out.dir.join(format!("{name}.md")), &md)?;
    println!("{md}");
    for chart in report.charts(&out.dir)? {
        eprintln!("chart: {}", chart.display());
    }
    eprintln!("results: {}", json.display());
    Ok(())
}

/// `parked-memory`.
async fn parked_memory(out: &Out, a: ParkedMemoryArgs) -> anyhow::Result<()> {
    let rows = parked::memory(a.calls, a.per_conn).await?;
    let path = out.json("parked-memory", &rows)?;
    println!("{}", parked::memory_table(&rows));
    eprintln!("results: {}", path.display());
    Ok(())
}

/// `propose`: every cluster size with every proposer count.
async fn proposes(out: &Out, a: ProposeArgs) -> anyhow::Result<()> {
    let mut results = Vec::new();
    for &n in &a.nodes {
        for &c in &a.clients {
            eprintln!("propose: {n} nodes, {c} proposers, {} s", a.seconds);
            results.push(propose::run(n, c, a.seconds, a.value_bytes).await?);
        }
    }
    let path = out.json("propose", &results)?;
    println!("{}", propose::table(&results));
    eprintln!("results: {}", path.display());
    Ok(())
}

/// `tfdata`.
async fn tfdata_suite(out: &Out, a: TfdataArgs) -> anyhow::Result<()> {
    let load = tfdata::SplitLoad {
        callers: a.split_callers,
        seconds: a.split_seconds,
    };
    let rows = if a.no_calls {
        Vec::new()
    } else {
        tfdata::run(a.iterations, &load).await?
    };
    let firsts = if a.no_calls || a.no_first_element {
        Vec::new()
    } else {
        tfdata::first_element().await?
    };
    let restarts = if a.history > 0 {
        tfdata::restart(a.history).await?
    } else {
        Vec::new()
    };
    let stalls = if a.stall_runs > 0 {
        tfdata::stall(a.stall_runs).await?
    } else {
        Vec::new()
    };
    let path = out.json(
        "tfdata",
        &serde_json::json!({"calls": rows, "first_element": firsts, "restart": restarts, "stall": stalls}),
    )?;
    let md = tfdata_markdown(&rows, &firsts, &restarts, &stalls);
    std::fs::write(out.dir.join("tfdata.md"), &md)?;
    println!("{md}");
    eprintln!("results: {}", path.display());
    Ok(())
}

/// The markdown of `tfdata`'s parts.
fn tfdata_markdown(
    rows: &[tfdata::Row],
    firsts: &[tfdata::FirstRow],
    restarts: &[tfdata::RestartRow],
    stalls: &[tfdata::StallRow],
) -> String {
    let mut md = tfdata::table(rows);
    md.push_str(
        "\n| distribute() to the first element (fresh job, 2 workers, 10 jobs) | p50, ms | max, ms |\n|---|---|---|\n",
    );
    for r in firsts {
        md.push_str(&format!(
            "| {} | {:.0} | {:.0} |\n",
            r.peer,
            r.p50_s * 1000.0,
            r.max_s * 1000.0
        ));
    }
    md.push_str("\n| restart after N journal entries | N | serving after, ms |\n|---|---|---|\n");
    for r in restarts {
        md.push_str(&format!(
            "| {} | {} | {:.0} |\n",
            r.peer, r.entries, r.serving_ms
        ));
    }
    md.push_str(
        "\n| dispatcher death at 90% of an epoch | runs | longest wait for an element, s | last element to the epoch's end: median / worst, s |\n|---|---|---|---|\n",
    );
    for r in stalls {
        md.push_str(&format!(
            "| {} | {} | {:.2} | {:.2} / {:.2} |\n",
            r.peer,
            r.end_s.len(),
            r.max_gap_s,
            r.end_p50(),
            r.end_max()
        ));
    }
    md
}

/// `closures`.
async fn closures_suite(out: &Out, a: ClosuresArgs) -> anyhow::Result<()> {
    let load = closures::Load {
        in_flight: a.in_flight,
        batch: a.batch,
        prefetch: a.prefetch,
        seconds: a.seconds,
    };
    let r = closures::run(&a.workers, load, a.deaths).await?;
    let path = out.json("closures", &r)?;
    let md = closures::table(&r);
    std::fs::write(out.dir.join("closures.md"), &md)?;
    println!("{md}");
    eprintln!("results: {}", path.display());
    Ok(())
}

/// `scale` (`scale-fleet` with more than one namespace): on `peers`, or
/// coordstore 1 and 3 nodes and jaxlib's built-in service when none are
/// named.
async fn scale_suite(
    out: &Out,
    a: ScaleArgs,
    peers: &[PeerKind],
    machine: &Machine,
) -> anyhow::Result<()> {
    let load = scale::Load {
        tasks: a.tasks,
        namespaces: a.namespaces,
        tasks_per_conn: a.tasks_per_conn,
        steady: std::time::Duration::from_secs_f64(a.steady_seconds),
        heartbeat_timeout: std::time::Duration::from_secs(a.heartbeat_timeout_s),
        call_timeout: std::time::Duration::from_secs(a.call_timeout_s),
    };
    let peers: Vec<PeerKind> = if peers.is_empty() {
        vec![
            PeerKind::Coordstore1,
            PeerKind::Coordstore3,
            PeerKind::Builtin,
        ]
    } else {
        peers.to_vec()
    };
    let rows = scale::run(&peers, &load).await?;
    let name = if a.namespaces > 1 {
        "scale-fleet"
    } else {
        "scale"
    };
    let path = out.json(name, &rows)?;
    let md = format!("{}\n{}", machine.line(), scale::table(&rows));
    std::fs::write(out.dir.join(format!("{name}.md")), &md)?;
    println!("{md}");
    let png = out.dir.join(format!("{name}.png"));
    match scale::chart(&rows, &png) {
        Ok(()) => eprintln!("chart: {}", png.display()),
        Err(e) => eprintln!("no chart: {e:#}"),
    }
    eprintln!("results: {}", path.display());
    Ok(())
}

/// `torch`.
async fn torch_suite(out: &Out, a: TorchArgs, machine: &Machine) -> anyhow::Result<()> {
    let load = torch::Load {
        ranks: if a.handoff_only { Vec::new() } else { a.ranks },
        ranks_per_agent: a.ranks_per_agent,
        steady: std::time::Duration::from_secs_f64(a.steady_seconds),
        connect_parallel: a.connect_parallel,
        phase_timeout: std::time::Duration::from_secs(a.phase_timeout_s),
        rendezvous_only: a.rendezvous_only,
    };
    let names = if a.torch_peers.is_empty() {
        vec!["coordstore-1".into(), "coordstore-3".into(), "torch".into()]
    } else {
        a.torch_peers
    };
    let peers = names
        .iter()
        .map(|n| match n.as_str() {
            "coordstore-1" => Ok(torch::Peer::Coordstore(1)),
            "coordstore-3" => Ok(torch::Peer::Coordstore(3)),
            "torch" => Ok(torch::Peer::Torch),
            "floor" => Ok(torch::Peer::Floor),
            other => Err(anyhow::anyhow!("unknown torch peer {other}")),
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    if a.real_clients {
        let rows = torch_real::run(&peers, &load, a.client_procs).await;
        let path = out.json("torch-real", &rows)?;
        let md = format!(
            "{}\n{}\n{}",
            machine.line(),
            torch::RESOLUTION,
            torch_real::table(&rows)
        );
        std::fs::write(out.dir.join("torch-real.md"), &md)?;
        println!("{md}");
        eprintln!("results: {}", path.display());
        return Ok(());
    }
    let (rows, handoffs) = torch::run(&peers, &load).await?;
    let path = out.json("torch", &(&rows, &handoffs))?;
    let md = format!(
        "{}\n{}\n{}",
        machine.line(),
        torch::RESOLUTION,
        torch::table(&rows, &handoffs)
    );
    std::fs::write(out.dir.join("torch.md"), &md)?;
    println!("{md}");
    eprintln!("results: {}", path.display());
    Ok(())
}

/// `namespaces`.
async fn namespaces_suite(out: &Out, a: NamespacesArgs) -> anyhow::Result<()> {
    let load = namespaces::Load {
        namespaces: a.namespaces,
        tasks: a.tasks,
        rounds: a.rounds,
        empty: a.empty,
        creates: a.creates,
    };
    let r = namespaces::run(load).await?;
    let path = out.json("namespaces", &r)?;
    let md = namespaces::table(&r);
    std::fs::write(out.dir.join("namespaces.md"), &md)?;
    println!("{md}");
    eprintln!("results: {}", path.display());
    Ok(())
}

/// `jax-latency`.
async fn jax_latency_suite(out: &Out, iterations: usize) -> anyhow::Result<()> {
    let results = jax_latency::run(iterations).await?;
    let path = out.json("jax-latency", &results)?;
    println!("{}", jax_latency::table(&results));
    eprintln!("results: {}", path.display());
    Ok(())
}
