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
    replay, scale, tfdata,
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
    #[command(subcommand)]
    suite: Suite,
}

#[derive(Subcommand)]
enum Suite {
    /// Every workload below (not propose / jax-latency), one report.
    All {
        /// Seconds per KV configuration.
        #[arg(long, default_value_t = 5.0)]
        seconds: f64,
        /// Leader kills per replicated peer.
        #[arg(long, default_value_t = 10)]
        kills: usize,
        /// Journal entries for the replay workload.
        #[arg(long, default_value_t = 1_000_000)]
        entries: u64,
    },
    /// KV put with 1/16/64/256 clients, linearizable get with 1/64.
    Kv {
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
    },
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
    Parked {
        /// Parked gets per configuration.
        #[arg(long, value_delimiter = ',', default_value = "0,10000")]
        parked: Vec<usize>,
        /// Concurrent put clients.
        #[arg(long, default_value_t = 64)]
        clients: usize,
        /// Seconds per configuration.
        #[arg(long, default_value_t = 5.0)]
        seconds: f64,
    },
    /// RSS per parked call: N blocking gets parked on one coordstore node,
    /// beside a bare tonic server holding N open gRPC streams (the floor).
    ParkedMemory {
        /// Calls held open.
        #[arg(long, default_value_t = 16384)]
        calls: usize,
        /// Calls per HTTP/2 connection.
        #[arg(long, default_value_t = 16)]
        per_conn: usize,
    },
    /// A bare tonic server (the gRPC health service only), for
    /// parked-memory's floor.
    #[command(hide = true)]
    BareGrpc {
        /// Address to serve.
        #[arg(long)]
        listen: String,
    },
    /// Server RSS holding 100k keys of 1 KiB.
    Memory {
        /// Keys.
        #[arg(long, default_value_t = 100_000)]
        keys: usize,
        /// Value size.
        #[arg(long, default_value_t = 1024)]
        value_bytes: usize,
    },
    /// Renders the markdown and charts of a results JSON again (into --out).
    Report {
        /// A `bench/results/<suite>-<time>.json`.
        json: PathBuf,
    },
    /// Replicated write throughput and latency through the Node API.
    Propose {
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
    },
    /// Stock jaxlib client latency (kv_set, blocking get, 2-task barrier):
    /// jaxlib's built-in service vs coordstore with 1 and 3 nodes.
    JaxLatency {
        /// Iterations per op.
        #[arg(long, default_value_t = 200)]
        iterations: usize,
    },
    /// The durable closure queue through 3 nodes: schedule → result with
    /// 1 and 16 workers, and a dead worker's closure running elsewhere.
    Closures {
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
    },
    /// One job of N simulated jaxlib tasks (or M jobs of N/M in namespaces)
    /// through register, topology exchange, barrier, steady heartbeats and
    /// shutdown: coordstore 1 and 3 nodes beside jaxlib's built-in service.
    Scale {
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
    },
    /// Many jobs on one 3-node cluster: M namespaces of T tasks at once,
    /// against one namespace of M × T tasks and the M one after another;
    /// the RSS of an empty namespace; create → registered on a follower.
    Namespaces {
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
    },
    /// tf.data dispatcher call latency, coordstore beside TensorFlow 2.21's
    /// own dispatcher (in memory and fault tolerant).
    Tfdata {
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
    },
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

async fn run(cli: Cli) -> anyhow::Result<()> {
    std::fs::create_dir_all(&cli.out)?;
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs();
    coordstore_bench::peers::SERVER_FLAGS
        .set(cli.server_flags.clone())
        .expect("set once");
    let peers = if cli.peers.is_empty() {
        PeerKind::ALL.to_vec()
    } else {
        cli.peers.clone()
    };
    let mut report = Report {
        machine: Machine::read(),
        started_unix: stamp,
        ..Default::default()
    };
    let name = match cli.suite {
        Suite::Report { json } => {
            report = serde_json::from_slice(&std::fs::read(&json)?)?;
            let md = report.markdown();
            println!("{md}");
            for chart in report.charts(&cli.out)? {
                eprintln!("chart: {}", chart.display());
            }
            return Ok(());
        }
        Suite::All {
            seconds,
            kills,
            entries,
        } => {
            report.kv = kv::run(&peers, &[1, 16, 64, 256], &[1, 64], seconds, 256).await?;
            report.handoff = handoff::run(&peers, 200).await?;
            report.barrier = barrier::run(&peers, &[2, 64, 1024]).await?;
            report.failover = failover::run(&peers, kills).await?;
            if peers.contains(&PeerKind::Coordstore1) {
                report.replay = replay::run(entries).await?;
            }
            if peers.contains(&PeerKind::Etcd3) {
                report.replay.extend(replay::run_etcd(entries).await?);
            }
            report.memory = memory::run(&peers, 100_000, 1024).await?;
            report.parked = parked::run(&peers, &[0, 10_000], 64, seconds).await?;
            "all"
        }
        Suite::Kv {
            clients,
            get_clients,
            seconds,
            value_bytes,
        } => {
            report.kv = kv::run(&peers, &clients, &get_clients, seconds, value_bytes).await?;
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
            if peers.contains(&PeerKind::Coordstore1) {
                report.replay = replay::run(entries).await?;
            }
            if peers.contains(&PeerKind::Etcd3) {
                report.replay.extend(replay::run_etcd(entries).await?);
            }
            "replay"
        }
        Suite::Parked {
            parked,
            clients,
            seconds,
        } => {
            report.parked = parked::run(&peers, &parked, clients, seconds).await?;
            "parked"
        }
        Suite::ParkedMemory { calls, per_conn } => {
            let rows = parked::memory(calls, per_conn).await?;
            let path = cli.out.join(format!("parked-memory-{stamp}.json"));
            std::fs::write(&path, serde_json::to_string_pretty(&rows)?)?;
            println!("{}", parked::memory_table(&rows));
            eprintln!("results: {}", path.display());
            return Ok(());
        }
        Suite::BareGrpc { listen } => {
            parked::bare_grpc(&listen).await?;
            return Ok(());
        }
        Suite::Memory { keys, value_bytes } => {
            report.memory = memory::run(&peers, keys, value_bytes).await?;
            "memory"
        }
        Suite::Propose {
            nodes,
            clients,
            seconds,
            value_bytes,
        } => {
            let mut results = Vec::new();
            for &n in &nodes {
                for &c in &clients {
                    eprintln!("propose: {n} nodes, {c} proposers, {seconds} s");
                    results.push(propose::run(n, c, seconds, value_bytes).await?);
                }
            }
            let path = cli.out.join(format!("propose-{stamp}.json"));
            std::fs::write(&path, serde_json::to_string_pretty(&results)?)?;
            println!("{}", propose::table(&results));
            eprintln!("results: {}", path.display());
            return Ok(());
        }
        Suite::Tfdata {
            iterations,
            history,
            stall_runs,
            no_calls,
            split_callers,
            split_seconds,
            no_first_element,
        } => {
            let load = tfdata::SplitLoad {
                callers: split_callers,
                seconds: split_seconds,
            };
            let rows = if no_calls {
                Vec::new()
            } else {
                tfdata::run(iterations, &load).await?
            };
            let firsts = if no_calls || no_first_element {
                Vec::new()
            } else {
                tfdata::first_element().await?
            };
            let restarts = if history > 0 {
                tfdata::restart(history).await?
            } else {
                Vec::new()
            };
            let stalls = if stall_runs > 0 {
                tfdata::stall(stall_runs).await?
            } else {
                Vec::new()
            };
            let path = cli.out.join(format!("tfdata-{stamp}.json"));
            std::fs::write(
                &path,
                serde_json::to_string_pretty(
                    &serde_json::json!({"calls": rows, "first_element": firsts, "restart": restarts, "stall": stalls}),
                )?,
            )?;
            let mut md = tfdata::table(&rows);
            md.push_str(
                "\n| distribute() to the first element (fresh job, 2 workers, 10 jobs) | p50, ms | max, ms |\n|---|---|---|\n",
            );
            for r in &firsts {
                md.push_str(&format!(
                    "| {} | {:.0} | {:.0} |\n",
                    r.peer,
                    r.p50_s * 1000.0,
                    r.max_s * 1000.0
                ));
            }
            md.push_str(
                "\n| restart after N journal entries | N | serving after, ms |\n|---|---|---|\n",
            );
            for r in &restarts {
                md.push_str(&format!(
                    "| {} | {} | {:.0} |\n",
                    r.peer, r.entries, r.serving_ms
                ));
            }
            md.push_str(
                "\n| dispatcher death at 90% of an epoch | runs | longest wait for an element, s | last element to the epoch's end: median / worst, s |\n|---|---|---|---|\n",
            );
            for r in &stalls {
                md.push_str(&format!(
                    "| {} | {} | {:.2} | {:.2} / {:.2} |\n",
                    r.peer,
                    r.end_s.len(),
                    r.max_gap_s,
                    r.end_p50(),
                    r.end_max()
                ));
            }
            std::fs::write(cli.out.join("tfdata.md"), &md)?;
            println!("{md}");
            eprintln!("results: {}", path.display());
            return Ok(());
        }
        Suite::Closures {
            workers,
            in_flight,
            batch,
            prefetch,
            seconds,
            deaths,
        } => {
            let load = closures::Load {
                in_flight,
                batch,
                prefetch,
                seconds,
            };
            let r = closures::run(&workers, load, deaths).await?;
            let path = cli.out.join(format!("closures-{stamp}.json"));
            std::fs::write(&path, serde_json::to_string_pretty(&r)?)?;
            let md = closures::table(&r);
            std::fs::write(cli.out.join("closures.md"), &md)?;
            println!("{md}");
            eprintln!("results: {}", path.display());
            return Ok(());
        }
        Suite::Scale {
            tasks,
            namespaces: m,
            tasks_per_conn,
            steady_seconds,
            heartbeat_timeout_s,
            call_timeout_s,
        } => {
            let load = scale::Load {
                tasks,
                namespaces: m,
                tasks_per_conn,
                steady: std::time::Duration::from_secs_f64(steady_seconds),
                heartbeat_timeout: std::time::Duration::from_secs(heartbeat_timeout_s),
                call_timeout: std::time::Duration::from_secs(call_timeout_s),
            };
            let peers: Vec<PeerKind> = if cli.peers.is_empty() {
                vec![
                    PeerKind::Coordstore1,
                    PeerKind::Coordstore3,
                    PeerKind::Builtin,
                ]
            } else {
                cli.peers.clone()
            };
            let rows = scale::run(&peers, &load).await?;
            let name = if m > 1 { "scale-fleet" } else { "scale" };
            let path = cli.out.join(format!("{name}-{stamp}.json"));
            std::fs::write(&path, serde_json::to_string_pretty(&rows)?)?;
            let md = format!("{}\n{}", report.machine.line(), scale::table(&rows));
            std::fs::write(cli.out.join(format!("{name}.md")), &md)?;
            println!("{md}");
            let png = cli.out.join(format!("{name}.png"));
            match scale::chart(&rows, &png) {
                Ok(()) => eprintln!("chart: {}", png.display()),
                Err(e) => eprintln!("no chart: {e:#}"),
            }
            eprintln!("results: {}", path.display());
            return Ok(());
        }
        Suite::Namespaces {
            namespaces: m,
            tasks,
            rounds,
            empty,
            creates,
        } => {
            let load = namespaces::Load {
                namespaces: m,
                tasks,
                rounds,
                empty,
                creates,
            };
            let r = namespaces::run(load).await?;
            let path = cli.out.join(format!("namespaces-{stamp}.json"));
            std::fs::write(&path, serde_json::to_string_pretty(&r)?)?;
            let md = namespaces::table(&r);
            std::fs::write(cli.out.join("namespaces.md"), &md)?;
            println!("{md}");
            eprintln!("results: {}", path.display());
            return Ok(());
        }
        Suite::JaxLatency { iterations } => {
            let results = jax_latency::run(iterations).await?;
            let path = cli.out.join(format!("jax-latency-{stamp}.json"));
            std::fs::write(&path, serde_json::to_string_pretty(&results)?)?;
            println!("{}", jax_latency::table(&results));
            eprintln!("results: {}", path.display());
            return Ok(());
        }
    };
    report.evaluate();
    let json = cli.out.join(format!("{name}-{stamp}.json"));
    std::fs::write(&json, serde_json::to_string_pretty(&report)?)?;
    let md = report.markdown();
    std::fs::write(cli.out.join(format!("{name}.md")), &md)?;
    println!("{md}");
    for chart in report.charts(&cli.out)? {
        eprintln!("chart: {}", chart.display());
    }
    eprintln!("results: {}", json.display());
    Ok(())
}
