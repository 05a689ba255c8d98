//! The `coordstore` binary: `serve` (a node) and `ctl` (the operator CLI).

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};

/// jemalloc, not glibc's malloc: a node frees buffers (decoded log entries,
/// sled pages) in between the values it keeps, and glibc does not hand
/// the holes back. `coordstore-bench --peers coordstore1 memory` (100k × 1 KiB
/// keys), this build otherwise unchanged: 183–192 MiB RSS with glibc,
/// 142–149 MiB with jemalloc configured as below.
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options (read at start-up; `_RJEM_MALLOC_CONF` overrides): one
/// arena (a node's threads share one heap instead of one each), thread
/// caches for small objects only (up to 1 KiB), and freed pages returned to
/// the system within a second by a background thread.
#[allow(non_upper_case_globals)]
#[export_name = "_rjem_malloc_conf"]
pub static malloc_conf: &[u8; 86] =
    b"narenas:1,tcache_max:1024,background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0\0";

use service::cli::config::{ServeConfig, ServeOptions};
use service::cli::ctl::CtlCommand;
use service::ops::logs::{LogFormat, NodeLines, QuietNotices};

#[derive(Parser)]
#[command(
    name = "coordstore",
    version,
    about = "A replicated coordination store for JAX and TensorFlow jobs"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Cmd>,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a node (the default when no command is given).
    Serve(Box<ServeOptions>),
    /// A local proxy for stock clients: dial it instead of a node; it keeps
    /// the client's connection and re-issues in-flight calls to a live node
    /// when a node dies.
    Relay {
        /// Where the client connects (keep it on the client's host).
        #[arg(long, default_value = "127.0.0.1:7480")]
        listen: std::net::SocketAddr,
        /// Every node: HOST:PORT,HOST:PORT,...
        #[arg(long, value_delimiter = ',', required = true)]
        endpoints: Vec<String>,
        /// Relay every call into this namespace [default: the default one]
        #[arg(long)]
        namespace: Option<String>,
        #[command(flatten)]
        tls: TlsDial,
    },
    /// Seed a new cluster's data dir from a backup (`ctl snapshot save`):
    /// run it for every member with the same FILE, --cluster and
    /// --cluster-id, then start each node with that --cluster-id.
    Restore {
        /// The backup file.
        file: std::path::PathBuf,
        /// The new data dir (must not exist, or be empty).
        #[arg(long)]
        data_dir: std::path::PathBuf,
        /// This node's id in the new cluster.
        #[arg(long)]
        node_id: u64,
        /// Every voting member of the new cluster: ID=HOST:PORT,...
        #[arg(long)]
        cluster: String,
        /// The new cluster's id: any name but the backed-up cluster's.
        #[arg(long)]
        cluster_id: String,
    },
    /// Operator commands against a running node.
    Ctl {
        /// A node's HOST:PORT.
        #[arg(long, default_value = "127.0.0.1:7470")]
        endpoint: String,
        /// The namespace of the kv, tasks, barriers, tfdata and reset-job
        /// verbs [default: the default namespace]
        #[arg(long)]
        namespace: Option<String>,
        #[command(flatten)]
        tls: TlsDial,
        #[command(flatten)]
        out: service::cli::ctl::Output,
        #[command(subcommand)]
        command: CtlCommand,
    },
}

/// How to dial nodes whose client port has TLS on.
#[derive(clap::Args)]
struct TlsDial {
    /// PEM CA that signed the nodes' certificates: dial them over TLS
    #[arg(long)]
    tls_ca: Option<std::path::PathBuf>,
    /// PEM certificate to present (nodes started with --tls-client-ca)
    #[arg(long, requires = "tls_key", requires = "tls_ca")]
    tls_cert: Option<std::path::PathBuf>,
    /// PEM private key of --tls-cert
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<std::path::PathBuf>,
}

impl TlsDial {
    fn load(&self) -> Result<Option<tonic::transport::ClientTlsConfig>, String> {
        let Some(ca) = &self.tls_ca else {
            return Ok(None);
        };
        let pair = self.tls_cert.as_deref().zip(self.tls_key.as_deref());
        proto::tls::client(ca, pair).map(Some)
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let command = cli.command.unwrap_or_else(|| Cmd::Serve(Box::default()));
    // A node's settings (its log format among them) before the first line.
    let serve_cfg = match &command {
        Cmd::Serve(opts) => match opts.as_ref().clone().resolve() {
            Ok(c) => Some(c),
            Err(e) => {
                eprintln!("coordstore serve: {e}");
                return ExitCode::from(2);
            }
        },
        _ => None,
    };
    init_logs(serve_cfg.as_ref().map_or(LogFormat::Text, |c| c.log_format));
    let rt = match runtime(serve_cfg.as_ref()) {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("coordstore: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match command {
        Cmd::Serve(_) => rt.block_on(serve(serve_cfg.expect("resolved above"))),
        Cmd::Relay {
            listen,
            endpoints,
            namespace,
            tls,
        } => relay(&rt, listen, endpoints, namespace, &tls),
        Cmd::Restore {
            file,
            data_dir,
            node_id,
            cluster,
            cluster_id,
        } => match restore(&file, &data_dir, node_id, &cluster, cluster_id) {
            Ok(out) => print_out("restore", &out),
            Err(e) => {
                eprintln!("coordstore restore: {e}");
                ExitCode::FAILURE
            }
        },
        Cmd::Ctl {
            endpoint,
            namespace,
            tls,
            out,
            command,
        } => ctl(&rt, &endpoint, (namespace, out), &tls, command),
    }
}

/// Log lines on stderr in `format`, filtered by `COORDSTORE_LOG`, without
/// openraft's stale-message notices.
fn init_logs(format: LogFormat) {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("COORDSTORE_LOG")
                .unwrap_or_else(|_| "info,openraft=warn".into()),
        )
        .event_format(NodeLines(format))
        .finish()
        .with(QuietNotices)
        .init();
}

/// The async runtime: a node's `--worker-threads`, else tokio's default
/// (one per CPU, or `TOKIO_WORKER_THREADS`).
fn runtime(serve_cfg: Option<&ServeConfig>) -> std::io::Result<tokio::runtime::Runtime> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all();
    if let Some(n) = serve_cfg.map(|c| c.worker_threads).filter(|&n| n > 0) {
        builder.worker_threads(n);
    }
    builder.build()
}

/// `coordstore relay`.
fn relay(
    rt: &tokio::runtime::Runtime,
    listen: std::net::SocketAddr,
    endpoints: Vec<String>,
    namespace: Option<String>,
    tls: &TlsDial,
) -> ExitCode {
    let mut cfg = agent::relay::RelayConfig::new(endpoints);
    cfg.namespace = namespace;
    cfg.tls = match tls.load() {
        Ok(t) => t,
        Err(e) => {
            eprintln!("coordstore relay: {e}");
            return ExitCode::from(2);
        }
    };
    match rt.block_on(agent::relay::serve(listen, cfg, wait_for_signal())) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("coordstore relay: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `coordstore ctl`.
fn ctl(
    rt: &tokio::runtime::Runtime,
    endpoint: &str,
    (namespace, out): (Option<String>, service::cli::ctl::Output),
    tls: &TlsDial,
    command: CtlCommand,
) -> ExitCode {
    let tls = match tls.load() {
        Ok(t) => t,
        Err(e) => {
            eprintln!("coordstore ctl: {e}");
            return ExitCode::from(2);
        }
    };
    match rt.block_on(service::cli::ctl::run(
        endpoint,
        tls,
        (namespace, out),
        command,
    )) {
        Ok(out) => print_out("ctl", &out),
        Err(e) => {
            eprintln!("coordstore ctl: {}", service::cli::ctl::describe_error(&e));
            ExitCode::FAILURE
        }
    }
}

/// Prints a command's answer. A reader that left (`| head -1`) ends the
/// command quietly and successfully, as ripgrep does; `println!` would
/// panic.
fn print_out(what: &str, out: &str) -> ExitCode {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    match writeln!(stdout, "{out}").and_then(|()| stdout.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("coordstore {what}: cannot write the answer: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `coordstore restore`: checks the backup, then seeds the data dir.
fn restore(
    file: &std::path::Path,
    data_dir: &std::path::Path,
    node_id: u64,
    cluster: &str,
    cluster_id: String,
) -> Result<String, String> {
    let members = service::cli::config::parse_cluster(cluster)?;
    let backup = storage::backup::Backup::read(file)?;
    let identity = storage::Identity {
        cluster_id,
        node_id,
    };
    let log_id = storage::backup::restore(data_dir, &identity, &backup, &members)
        .map_err(|e| e.to_string())?;
    Ok(serde_json::json!({
        "data_dir": data_dir.display().to_string(),
        "node_id": node_id,
        "cluster_id": identity.cluster_id,
        "index": log_id.index,
        "state_digest": backup.header.state_digest,
        "restored_from_cluster": backup.header.cluster_id,
    })
    .to_string())
}

async fn serve(cfg: ServeConfig) -> ExitCode {
    // Every task holds a connection (jaxlib: one each), so the soft limit
    // of open files goes up to the hard one.
    match service::ops::raise_open_files() {
        Ok((old, new)) if new > old => {
            tracing::info!("open-file limit raised from {old} to {new} (the hard limit)")
        }
        Ok((_, now)) => tracing::info!("open-file limit {now}"),
        Err(e) => tracing::warn!("cannot raise the open-file limit: {e}"),
    }
    if let Err(e) = service::node::check_disk(&cfg) {
        eprintln!("coordstore serve: {e}");
        return ExitCode::FAILURE;
    }
    let node = match service::node::start(cfg.clone()).await {
        Ok(n) => n,
        Err(e) => {
            eprintln!("coordstore serve: {e}");
            return ExitCode::FAILURE;
        }
    };
    let role = service::node::settle(node.core.node(), Duration::from_secs(5)).await;
    tracing::info!(
        "coordstore node {} serving on {} as {} (cluster '{}', {} voting members, data dir {})",
        cfg.node_id,
        node.addr,
        role.as_str(),
        cfg.cluster_id,
        cfg.cluster.len(),
        cfg.data_dir.display()
    );
    tokio::select! {
        _ = wait_for_signal() => {}
        why = node.core.node().failed() => {
            // Its Raft core stopped (an entry this build cannot apply, a
            // disk that fails): a node that cannot apply or persist the log
            // serves nothing more, and leaves at once. The process ends
            // without a graceful stop, which closes every listener and
            // connection now: calls in flight here fail at once, so their
            // clients and the nodes forwarding them go to another node (a
            // drain would answer them with retries for as long as they wait).
            tracing::error!("coordstore node {} stops: {why}", cfg.node_id);
            eprintln!("coordstore serve: node {} stops: {why}", cfg.node_id);
            std::process::exit(1);
        }
    }
    tracing::info!("coordstore node {} stopping", cfg.node_id);
    node.stop().await;
    ExitCode::SUCCESS
}

async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
