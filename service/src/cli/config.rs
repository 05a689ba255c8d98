//! `coordstore serve` configuration: command-line flags over an optional TOML
//! file (same keys, snake_case) over built-in defaults. With no flags at all a
//! node runs alone on 127.0.0.1:7470 with its data in `./coordstore-data`.
//!
//! The flags come in groups, each a struct of its own flattened into
//! [`ServeOptions`] and turned into its part of [`ServeConfig`] by its own
//! function: the job ([`JobSettings`], shared with `ctl ns create`), the
//! journal's bounds, Raft's tuning, security (peer token, TLS, admins),
//! tf.data, and the node itself. A config file's keys are the flags' names;
//! one no flag has is an error.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use journal::pb::{ClusterConfig, JobSpec};
use serde::Deserialize;

pub use super::job::JobSettings;
use crate::duties::dispatcher::TfDataConfig;

/// The documented default client and peer port.
pub const DEFAULT_PORT: u16 = 7470;
/// The default bound on a node's client connections (`--max-connections`):
/// far above what a job's ranks need, below what exhausts a host's memory.
pub const DEFAULT_MAX_CONNECTIONS: usize = 262_144;
/// The default bound on one namespace's connections on a node.
pub const DEFAULT_MAX_CONNECTIONS_PER_NAMESPACE: usize = 131_072;

/// Writes `over`, the merge of two option groups: each of `opt` (Options)
/// set here wins, else `other`'s; each of `list` (Vecs) here if non-empty.
macro_rules! layered {
    ($t:ident { $($opt:ident),* $(; $($list:ident),*)? }) => {
        impl $t {
            /// These flags where set, else `other`'s (flags over a file).
            fn over(self, other: $t) -> $t {
                $t {
                    $($opt: self.$opt.or(other.$opt),)*
                    $($($list: if self.$list.is_empty() { other.$list } else { self.$list },)*)?
                }
            }
        }
    };
}

/// Every serve option. Flags and config-file keys share these names; a flag
/// wins over the file, the file over the default.
#[derive(clap::Args, Deserialize, Default, Debug, Clone)]
#[serde(default)]
pub struct ServeOptions {
    /// This node's id (> 0) [default: 1]
    #[arg(long)]
    pub node_id: Option<u64>,
    /// Address to listen on for clients and peers [default: 127.0.0.1:7470]
    #[arg(long)]
    pub listen: Option<String>,
    /// Address peers and forwarded calls reach this node at [default: --listen]
    #[arg(long)]
    pub advertise: Option<String>,
    /// The data dir: log segments (wal/), sled metadata, snapshot [default: ./coordstore-data]
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Every voting member: ID=HOST:PORT,ID=HOST:PORT,... [default: this node alone]
    #[arg(long)]
    pub cluster: Option<String>,
    /// Reach some peers at other addresses than their advertised ones:
    /// ID=HOST:PORT,... (a proxy or another network path; this node only)
    #[arg(long)]
    pub peer_address: Option<String>,
    /// Join an existing cluster instead of bootstrapping one: wait to be
    /// added with `coordstore ctl member add` [default: false]
    #[arg(long)]
    pub join: Option<bool>,
    /// Name of the cluster; data dirs of another cluster are refused [default: coordstore]
    #[arg(long)]
    pub cluster_id: Option<String>,
    /// Largest gRPC message in either direction [default: 536870912]
    #[arg(long)]
    pub max_message_bytes: Option<usize>,
    /// sled page-cache bound [default: 67108864]
    #[arg(long)]
    pub cache_bytes: Option<u64>,
    /// Threads of the node's async runtime (gRPC serving, Raft, applies);
    /// the log flusher and blocking work have threads of their own. Caps
    /// the node's CPUs beside ML tasks or other nodes on the same host
    /// [default: one per CPU]
    #[arg(long)]
    pub worker_threads: Option<usize>,
    /// How long a call keeps looking for a leader before UNAVAILABLE [default: 30000]
    #[arg(long)]
    pub leader_wait_ms: Option<u64>,
    /// How long one forward of a call waits on the leader before the call
    /// is sent again to the leader this node then knows (a leader change
    /// re-sends it at once) [default: 2000]
    #[arg(long)]
    pub forward_attempt_ms: Option<u64>,
    /// Most client calls parked on this node at once (blocking gets,
    /// barriers, polls...); past it RESOURCE_EXHAUSTED; 0 = no bound [default: 400000]
    #[arg(long)]
    pub max_parked_calls: Option<u64>,
    /// Most connections open at once on this node's client ports; past it a
    /// new connection is closed at once; 0 = no bound [default: 262144]
    #[arg(long)]
    pub max_connections: Option<usize>,
    /// Most connections open at once in one namespace (its port, or the
    /// main port for the default namespace) on this node; 0 = no bound [default: 131072]
    #[arg(long)]
    pub max_connections_per_namespace: Option<usize>,
    /// The accept queue of every port this node listens on (the kernel caps
    /// it at net.core.somaxconn) [default: somaxconn, at least 4096]
    #[arg(long)]
    pub listen_backlog: Option<u32>,
    /// HOST:PORT to serve Prometheus `/metrics`, `/healthz` and `/readyz`
    /// on (HTTP) [default: none]
    #[arg(long)]
    pub metrics_listen: Option<String>,
    /// Log lines as `text` or `json`, each with the node id, term and role [default: text]
    #[arg(long)]
    pub log_format: Option<String>,
    /// Log a warning for each proposal that takes longer than this to
    /// apply; 0 = every one [default: 1000]
    #[arg(long)]
    pub slow_request_ms: Option<u64>,
    /// The ports namespaces are served on, LOW-HIGH: a namespace gets the
    /// port its create names or the lowest free one [default: none, only
    /// namespaces created with a port]
    #[arg(long)]
    pub namespace_ports: Option<String>,
    /// Most namespaces in the cluster, the default one included; past it a
    /// create is RESOURCE_EXHAUSTED; 0 = no bound [default: 10000]
    #[arg(long)]
    pub max_namespaces: Option<u64>,
    /// Namespaces with series of their own in the metrics (the largest by
    /// keys), the others summed as `other` [default: 20]
    #[arg(long)]
    pub metrics_namespaces: Option<usize>,
    /// A TOML file with any of these keys
    #[arg(long)]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// The default namespace's job.
    #[command(flatten, next_help_heading = "The job (the default namespace's)")]
    #[serde(flatten)]
    pub job: JobSettings,
    /// The journal's bounds.
    #[command(flatten, next_help_heading = "The journal")]
    #[serde(flatten)]
    pub journal: JournalOptions,
    /// Raft's tuning.
    #[command(flatten, next_help_heading = "Replication")]
    #[serde(flatten)]
    pub raft: RaftOptions,
    /// Peer token, TLS and admins.
    #[command(flatten, next_help_heading = "Security")]
    #[serde(flatten)]
    pub security: SecurityOptions,
    /// The tf.data dispatcher.
    #[command(flatten, next_help_heading = "tf.data")]
    #[serde(flatten)]
    pub tfdata: TfDataOptions,
}

/// The journal's bounds (the exactly-once table, watch history).
#[derive(clap::Args, Deserialize, Default, Debug, Clone)]
#[serde(default)]
pub struct JournalOptions {
    /// Clients the exactly-once table remembers [default: 4096]
    #[arg(long)]
    pub max_client_sessions: Option<u32>,
    /// Outcomes remembered per client that does not declare its requests done [default: 1024]
    #[arg(long)]
    pub max_outcomes_per_client: Option<u32>,
    /// A client unheard of for this long is forgotten by the exactly-once table [default: 900000]
    #[arg(long)]
    pub session_horizon_ms: Option<u64>,
    /// Bytes of KV change history kept for resumable watches [default: 16777216]
    #[arg(long)]
    pub watch_history_bytes: Option<u64>,
}
layered!(JournalOptions {
    max_client_sessions,
    max_outcomes_per_client,
    session_horizon_ms,
    watch_history_bytes
});

/// Raft's tuning.
#[derive(clap::Args, Deserialize, Default, Debug, Clone)]
#[serde(default)]
pub struct RaftOptions {
    /// Snapshot after this many log entries [default: 50000]
    #[arg(long)]
    pub snapshot_every: Option<u64>,
    /// Also snapshot after this many bytes of log since the last one; 0 = by entries only [default: 8388608]
    #[arg(long)]
    pub snapshot_log_bytes: Option<u64>,
    /// Log entries kept behind a snapshot [default: 100]
    #[arg(long)]
    pub keep_behind_snapshot: Option<u64>,
    /// Write batches handed to Raft before the earlier ones are applied
    /// (group commit: updates queued meanwhile share the next entry) [default: 2]
    #[arg(long)]
    pub max_inflight_batches: Option<usize>,
    /// Threads of a runtime of Raft's own (core, state machine, replication,
    /// write batcher); 0 runs them on the node's runtime [default: 0]
    #[arg(long)]
    pub raft_threads: Option<usize>,
    /// Raft heartbeat interval [default: 100]
    #[arg(long)]
    pub raft_heartbeat_ms: Option<u64>,
    /// A follower that hears no leader for this long to 1.5× campaigns [default: 1000]
    #[arg(long)]
    pub election_timeout_ms: Option<u64>,
    /// Free bytes kept under the data dir: below it the node hands
    /// leadership to a healthy voter and does not campaign, a leader no
    /// voter can replace refuses client writes, and a node does not start;
    /// 0 = no reserve [default: 67108864]
    #[arg(long)]
    pub disk_reserve_bytes: Option<u64>,
    /// A log fdatasync slower than this (99th percentile over 10 s, a
    /// running one at its age) makes the node hand leadership to a healthy
    /// voter and not campaign; 0 = not watched [default: 1000]
    #[arg(long)]
    pub slow_fsync_ms: Option<u64>,
}
layered!(RaftOptions {
    snapshot_every,
    snapshot_log_bytes,
    keep_behind_snapshot,
    max_inflight_batches,
    raft_threads,
    raft_heartbeat_ms,
    election_timeout_ms,
    disk_reserve_bytes,
    slow_fsync_ms
});

/// Who may talk to the node: the peer token, TLS on both ports, admins.
#[derive(clap::Args, Deserialize, Default, Debug, Clone)]
#[serde(default)]
pub struct SecurityOptions {
    /// A file holding the cluster's shared peer token (any text; the same on
    /// every node): peer RPCs carry it and are refused without it. Without
    /// it peers are not authenticated [default: none]
    #[arg(long)]
    pub peer_token_file: Option<PathBuf>,
    /// HOST:PORT for peer links only (Raft RPCs and calls forwarded to the
    /// leader), apart from clients; --cluster and --advertise then name
    /// this port [default: none, peers share --listen]
    #[arg(long)]
    pub peer_listen: Option<String>,
    /// PEM certificate chain the client port presents (TLS on; needs
    /// --tls-key) [default: none, plaintext]
    #[arg(long)]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert
    #[arg(long)]
    pub tls_key: Option<PathBuf>,
    /// PEM CA: clients must present a certificate it signed (mutual TLS)
    /// [default: none, any client]
    #[arg(long)]
    pub tls_client_ca: Option<PathBuf>,
    /// With mutual TLS: a client certificate name that may run the
    /// cluster's verbs (namespace create, delete, reset, export, import;
    /// reset-job; snapshot save; member add and remove) and see every
    /// namespace: subject CN or a SAN, `*` matching any run of characters;
    /// repeatable. Without it, with --tls-client-ca no client may run them
    /// [default: none]
    #[arg(long)]
    pub admin_client_name: Vec<String>,
    /// With TLS on the client port: serve PyTorch's TCPStore protocol in
    /// plaintext there too, for the default namespace (torch's client has
    /// no TLS; a relay on the client host is the other way)
    /// (`--torch-plaintext` alone means true) [default: false]
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub torch_plaintext: Option<bool>,
    /// PEM certificate chain of this node on peer links: presented by the
    /// peer port and when dialing peers (needs --peer-listen, --peer-tls-key
    /// and --peer-tls-ca) [default: none, plaintext]
    #[arg(long)]
    pub peer_tls_cert: Option<PathBuf>,
    /// PEM private key of --peer-tls-cert
    #[arg(long)]
    pub peer_tls_key: Option<PathBuf>,
    /// PEM CA every peer's certificate must be signed by, both ways
    #[arg(long)]
    pub peer_tls_ca: Option<PathBuf>,
}
layered!(SecurityOptions {
    peer_token_file,
    peer_listen,
    tls_cert,
    tls_key,
    tls_client_ca,
    torch_plaintext,
    peer_tls_cert,
    peer_tls_key,
    peer_tls_ca;
    admin_client_name
});

/// The tf.data dispatcher's settings.
#[derive(clap::Args, Deserialize, Default, Debug, Clone)]
#[serde(default)]
pub struct TfDataOptions {
    /// The tf.data service version GetVersion answers; clients and workers
    /// require their own (TensorFlow 2.21: 9) [default: 9]
    #[arg(long)]
    pub tfdata_version: Option<i64>,
    /// A tf.data client with no heartbeat for this long is released [default: 300000]
    #[arg(long)]
    pub tfdata_client_timeout_ms: Option<u64>,
    /// An iteration without clients for this long is garbage collected; 0 = never [default: 300000]
    #[arg(long)]
    pub tfdata_gc_timeout_ms: Option<u64>,
    /// A tf.data worker with no heartbeat for this long is logged as lost
    /// (its tasks are kept, as upstream) [default: 600000]
    #[arg(long)]
    pub tfdata_worker_timeout_ms: Option<u64>,
    /// The tf.data workers of static sharding (FILE, DATA, FILE_OR_DATA,
    /// HINT), in worker-index order, comma-separated; a `%port%` in an entry
    /// matches any port [default: none]
    #[arg(long)]
    pub tfdata_worker_addresses: Option<String>,
}
layered!(TfDataOptions {
    tfdata_version,
    tfdata_client_timeout_ms,
    tfdata_gc_timeout_ms,
    tfdata_worker_timeout_ms,
    tfdata_worker_addresses
});

/// The resolved configuration of one node.
#[derive(Clone, Debug)]
pub struct ServeConfig {
    /// Node id.
    pub node_id: u64,
    /// Listen address.
    pub listen: String,
    /// Advertised address (peers, forwarding).
    pub advertise: String,
    /// Data dir.
    pub data_dir: PathBuf,
    /// Voting members: id → address.
    pub cluster: BTreeMap<u64, String>,
    /// Cluster name.
    pub cluster_id: String,
    /// The replicated coordination configuration.
    pub coordination: ClusterConfig,
    /// gRPC message limit.
    pub max_message_bytes: usize,
    /// sled cache bound.
    pub cache_bytes: u64,
    /// Replication tunables.
    pub raft: raft::RaftSettings,
    /// Leader wait of forwarded calls.
    pub leader_wait_ms: u64,
    /// Longest wait of one forward on one leader.
    pub forward_attempt_ms: u64,
    /// Peer address overrides.
    pub peer_overrides: std::collections::HashMap<u64, String>,
    /// Join instead of bootstrapping.
    pub join: bool,
    /// Each TensorFlow task's address (job name → addresses by task id),
    /// from --tf-cluster-spec; empty when not given.
    pub tf_addresses: BTreeMap<String, Vec<String>>,
    /// Most client calls parked at once (0: no bound).
    pub max_parked_calls: u64,
    /// Most connections on the client ports, and per namespace (0: none).
    pub max_connections: (usize, usize),
    /// The accept queue of every port.
    pub listen_backlog: u32,
    /// Where `/metrics`, `/healthz` and `/readyz` are served, if anywhere.
    pub metrics_listen: Option<String>,
    /// How log lines look.
    pub log_format: crate::ops::logs::LogFormat,
    /// Proposals slower than this are logged.
    pub slow_request_ms: u64,
    /// The cluster's peer token, from --peer-token-file.
    pub peer_token: Option<String>,
    /// Where peers connect, when not at `listen`.
    pub peer_listen: Option<String>,
    /// The client port's TLS (certificate, client CA), loaded.
    pub client_tls: Option<tonic::transport::ServerTlsConfig>,
    /// The peer links' TLS, loaded: the peer port's and the dialing side's.
    pub peer_tls: Option<PeerTls>,
    /// Who may run the cluster's verbs.
    pub admins: crate::core::Admins,
    /// With TLS, whether the main port serves TCPStore in plaintext.
    pub torch_plaintext: bool,
    /// The tf.data dispatcher's settings.
    pub tfdata: TfDataConfig,
    /// Threads of the async runtime (0: one per CPU).
    pub worker_threads: usize,
    /// The namespace port range (inclusive), if any.
    pub namespace_ports: Option<(u16, u16)>,
    /// Most namespaces (0: no bound).
    pub max_namespaces: u64,
    /// Namespaces with metric series of their own.
    pub metrics_namespaces: usize,
}

/// TLS of the peer links: what the peer port serves and how peers are
/// dialed (both mutual, with one CA).
#[derive(Clone, Debug)]
pub struct PeerTls {
    /// The peer port: this node's certificate; peers must present one the
    /// peer CA signed.
    pub server: tonic::transport::ServerTlsConfig,
    /// Dialing peers: their certificate must be the peer CA's; this node
    /// presents its own.
    pub client: tonic::transport::ClientTlsConfig,
}

pub use crate::wire::namespaces::parse_tf_cluster_spec;

fn parse_pairs(s: &str, what: &str) -> Result<Vec<(String, String)>, String> {
    s.split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|p| {
            p.split_once('=')
                .map(|(a, b)| (a.trim().to_string(), b.trim().to_string()))
                .ok_or_else(|| format!("{what}: expected NAME=VALUE, got '{p}'"))
        })
        .collect()
}

/// `--namespace-ports LOW-HIGH`.
pub fn parse_port_range(s: &str) -> Result<(u16, u16), String> {
    let bad =
        || format!("--namespace-ports: expected LOW-HIGH (TCP ports, LOW <= HIGH), got '{s}'");
    let (low, high) = s.split_once('-').ok_or_else(bad)?;
    let low: u16 = low.trim().parse().map_err(|_| bad())?;
    let high: u16 = high.trim().parse().map_err(|_| bad())?;
    if low == 0 || low > high {
        return Err(bad());
    }
    Ok((low, high))
}

/// `--cluster ID=HOST:PORT,...`: the voting members, id → address.
pub fn parse_cluster(spec: &str) -> Result<BTreeMap<u64, String>, String> {
    let mut cluster = BTreeMap::new();
    for (id, addr) in parse_pairs(spec, "--cluster")? {
        let id: u64 = id
            .parse()
            .map_err(|_| format!("--cluster: bad node id '{id}'"))?;
        if id == 0 {
            return Err("--cluster: node ids must be > 0".into());
        }
        if cluster.insert(id, addr).is_some() {
            return Err(format!("--cluster: node {id} is listed twice"));
        }
    }
    Ok(cluster)
}

impl ServeOptions {
    /// Reads `--config FILE` (if given) and lays these flags over it.
    pub fn resolve(self) -> Result<ServeConfig, String> {
        let file = match &self.config {
            Some(path) => load_file(path)?,
            None => ServeOptions::default(),
        };
        self.over(file).finish()
    }

    /// `self` where set, else `other`.
    fn over(self, other: ServeOptions) -> ServeOptions {
        macro_rules! pick {
            ($($f:ident),*) => { ServeOptions {
                $($f: self.$f.or(other.$f),)*
                job: self.job.over(other.job),
                journal: self.journal.over(other.journal),
                raft: self.raft.over(other.raft),
                security: self.security.over(other.security),
                tfdata: self.tfdata.over(other.tfdata),
                config: self.config,
            } };
        }
        pick!(
            node_id,
            listen,
            advertise,
            data_dir,
            cluster,
            peer_address,
            join,
            cluster_id,
            max_message_bytes,
            cache_bytes,
            worker_threads,
            leader_wait_ms,
            forward_attempt_ms,
            max_parked_calls,
            max_connections,
            max_connections_per_namespace,
            listen_backlog,
            metrics_listen,
            log_format,
            slow_request_ms,
            namespace_ports,
            max_namespaces,
            metrics_namespaces
        )
    }

    /// `--max-connections` and `--max-connections-per-namespace`.
    fn connection_bounds(&self) -> (usize, usize) {
        (
            self.max_connections.unwrap_or(DEFAULT_MAX_CONNECTIONS),
            self.max_connections_per_namespace
                .unwrap_or(DEFAULT_MAX_CONNECTIONS_PER_NAMESPACE),
        )
    }

    fn finish(self) -> Result<ServeConfig, String> {
        let max_connections = self.connection_bounds();
        let node_id = self.node_id.unwrap_or(1);
        if node_id == 0 {
            return Err("--node-id must be > 0".into());
        }
        let security = self.security.resolve()?;
        let listen = self
            .listen
            .unwrap_or_else(|| format!("127.0.0.1:{DEFAULT_PORT}"));
        let advertise = self
            .advertise
            .clone()
            .or_else(|| self.security.peer_listen.clone())
            .unwrap_or_else(|| listen.clone());
        let cluster = members(self.cluster.as_deref(), node_id, &advertise)?;
        let (coordination, tf_addresses) = default_job(&self.job, &self.journal)?;
        let max_message_bytes = self.max_message_bytes.unwrap_or(512 << 20);
        let mut raft = self.raft.settings();
        raft.max_message_bytes = raft.max_message_bytes.max(max_message_bytes);
        Ok(ServeConfig {
            node_id,
            listen,
            advertise,
            data_dir: self
                .data_dir
                .unwrap_or_else(|| PathBuf::from("coordstore-data")),
            cluster,
            cluster_id: self.cluster_id.unwrap_or_else(|| "coordstore".into()),
            coordination,
            max_message_bytes,
            cache_bytes: self.cache_bytes.unwrap_or(storage::DEFAULT_CACHE_BYTES),
            raft,
            leader_wait_ms: self.leader_wait_ms.unwrap_or(30_000),
            forward_attempt_ms: self
                .forward_attempt_ms
                .unwrap_or(crate::core::router::DEFAULT_FORWARD_ATTEMPT_MS)
                .max(1),
            peer_overrides: peer_overrides(self.peer_address.as_deref())?,
            join: self.join.unwrap_or(false),
            tf_addresses,
            max_parked_calls: self
                .max_parked_calls
                .unwrap_or(crate::core::park::DEFAULT_MAX_PARKED_CALLS),
            max_connections,
            listen_backlog: self
                .listen_backlog
                .unwrap_or_else(crate::wire::listener::default_backlog),
            peer_token: security.peer_token,
            tfdata: self.tfdata.config(),
            metrics_listen: self.metrics_listen,
            log_format: self.log_format.as_deref().unwrap_or("text").parse()?,
            slow_request_ms: self.slow_request_ms.unwrap_or(1000),
            peer_listen: self.security.peer_listen,
            client_tls: security.client_tls,
            peer_tls: security.peer_tls,
            admins: security.admins,
            torch_plaintext: self.security.torch_plaintext.unwrap_or(false),
            worker_threads: self.worker_threads.unwrap_or(0),
            namespace_ports: self
                .namespace_ports
                .as_deref()
                .map(parse_port_range)
                .transpose()?,
            max_namespaces: self
                .max_namespaces
                .unwrap_or(crate::core::namespaces::DEFAULT_MAX_NAMESPACES),
            metrics_namespaces: self.metrics_namespaces.unwrap_or(20),
        })
    }
}

/// `--cluster`, or this node alone at `advertise`.
fn members(
    spec: Option<&str>,
    node_id: u64,
    advertise: &str,
) -> Result<BTreeMap<u64, String>, String> {
    let Some(spec) = spec else {
        return Ok(BTreeMap::from([(node_id, advertise.to_string())]));
    };
    let cluster = parse_cluster(spec)?;
    if !cluster.contains_key(&node_id) {
        return Err(format!("--cluster does not list this node ({node_id})"));
    }
    Ok(cluster)
}

/// `--peer-address ID=HOST:PORT,...`.
fn peer_overrides(spec: Option<&str>) -> Result<std::collections::HashMap<u64, String>, String> {
    let mut overrides = std::collections::HashMap::new();
    for (id, addr) in parse_pairs(spec.unwrap_or_default(), "--peer-address")? {
        let id: u64 = id
            .parse()
            .map_err(|_| format!("--peer-address: bad node id '{id}'"))?;
        overrides.insert(id, addr);
    }
    Ok(overrides)
}

/// The default namespace's configuration from the job's flags and the
/// journal's bounds, and the TensorFlow tasks' addresses.
fn default_job(
    job: &JobSettings,
    journal: &JournalOptions,
) -> Result<(ClusterConfig, BTreeMap<String, Vec<String>>), String> {
    let mut jobs = job.jobs()?;
    let tf_jobs = !jobs.is_empty();
    let tf_addresses = match &job.tf_cluster_spec {
        Some(v) => parse_tf_cluster_spec(v)?,
        None => BTreeMap::new(),
    };
    check_tf_addresses(&jobs, &tf_addresses)?;
    if jobs.is_empty() {
        jobs.push(JobSpec {
            name: journal::JAX_JOB.into(),
            count: job.tasks.unwrap_or(1),
        });
    }
    let config = ClusterConfig {
        jobs,
        recoverable: job.recoverable.unwrap_or(false),
        heartbeat_timeout_ms: job.heartbeat_timeout_ms.unwrap_or(100_000),
        register_timeout_ms: job.register_timeout_ms.unwrap_or(3_600_000),
        shutdown_timeout_ms: job.shutdown_timeout_ms.unwrap_or(300_000),
        register_with_barrier: job.register_with_barrier.unwrap_or(true),
        max_client_sessions: journal.max_client_sessions.unwrap_or(0),
        max_outcomes_per_client: journal.max_outcomes_per_client.unwrap_or(0),
        max_keys: job.max_keys.unwrap_or(0),
        session_horizon_ms: journal
            .session_horizon_ms
            .unwrap_or(journal::DEFAULT_SESSION_HORIZON_MS),
        watch_history_bytes: journal
            .watch_history_bytes
            .unwrap_or(journal::coordination::DEFAULT_WATCH_HISTORY_BYTES),
        notify_tasks: job.notify_tasks.unwrap_or(tf_jobs),
    };
    Ok((config, tf_addresses))
}

/// `--tf-cluster-spec` gives an address to every task of each `--job`, and
/// is given only with `--job`.
fn check_tf_addresses(
    jobs: &[JobSpec],
    tf_addresses: &BTreeMap<String, Vec<String>>,
) -> Result<(), String> {
    if tf_addresses.is_empty() {
        return Ok(());
    }
    for j in jobs {
        let have = tf_addresses.get(&j.name).map_or(0, Vec::len);
        if have < j.count as usize {
            return Err(format!(
                "--tf-cluster-spec lists {have} address(es) for job {}, --job says {}",
                j.name, j.count
            ));
        }
    }
    if jobs.is_empty() {
        return Err("--tf-cluster-spec needs the coordinated jobs named with --job".into());
    }
    Ok(())
}

impl RaftOptions {
    /// Raft's settings: the defaults, with what is set.
    fn settings(&self) -> raft::RaftSettings {
        let mut raft = raft::RaftSettings::default();
        if let Some(v) = self.snapshot_every {
            raft.snapshot_every_entries = v.max(1);
        }
        if let Some(v) = self.snapshot_log_bytes {
            raft.snapshot_log_bytes = v;
        }
        if let Some(v) = self.keep_behind_snapshot {
            raft.keep_entries_behind_snapshot = v;
        }
        if let Some(v) = self.max_inflight_batches {
            raft.max_inflight_batches = v.max(1);
        }
        if let Some(v) = self.raft_threads {
            raft.raft_threads = v;
        }
        if let Some(v) = self.raft_heartbeat_ms {
            raft.heartbeat_interval_ms = v;
        }
        if let Some(v) = self.election_timeout_ms {
            raft = raft.with_election_timeout(v);
        }
        if let Some(v) = self.disk_reserve_bytes {
            raft.disk_reserve_bytes = v;
        }
        if let Some(v) = self.slow_fsync_ms {
            raft.slow_fsync_ms = v;
        }
        raft
    }
}

impl TfDataOptions {
    /// The dispatcher's settings: the defaults, with what is set.
    fn config(&self) -> TfDataConfig {
        let d = TfDataConfig::default();
        TfDataConfig {
            version: self.tfdata_version.unwrap_or(d.version),
            client_timeout_ms: self.tfdata_client_timeout_ms.unwrap_or(d.client_timeout_ms),
            gc_timeout_ms: self.tfdata_gc_timeout_ms.unwrap_or(d.gc_timeout_ms),
            worker_timeout_ms: self.tfdata_worker_timeout_ms.unwrap_or(d.worker_timeout_ms),
            worker_addresses: self
                .tfdata_worker_addresses
                .as_deref()
                .map(|l| {
                    l.split(',')
                        .map(str::trim)
                        .filter(|a| !a.is_empty())
                        .map(str::to_string)
                        .collect()
                })
                .unwrap_or_default(),
        }
    }
}

/// The security flags, checked and their files loaded.
struct Security {
    peer_token: Option<String>,
    client_tls: Option<tonic::transport::ServerTlsConfig>,
    peer_tls: Option<PeerTls>,
    admins: crate::core::Admins,
}

impl SecurityOptions {
    fn resolve(&self) -> Result<Security, String> {
        let (client_tls, peer_tls) = self.tls()?;
        if !self.admin_client_name.is_empty() && self.tls_client_ca.is_none() {
            return Err(
                "--admin-client-name needs --tls-client-ca: without client certificates no call has a name"
                    .into(),
            );
        }
        Ok(Security {
            peer_token: self.peer_token()?,
            client_tls,
            peer_tls,
            admins: crate::core::Admins {
                identities: self.tls_client_ca.is_some(),
                names: self.admin_client_name.clone(),
            },
        })
    }

    /// `--peer-token-file`'s token: non-empty printable ASCII.
    fn peer_token(&self) -> Result<Option<String>, String> {
        let Some(path) = &self.peer_token_file else {
            return Ok(None);
        };
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("--peer-token-file {}: {e}", path.display()))?;
        let token = text.trim().to_string();
        if token.is_empty() || token.parse::<tonic::metadata::MetadataValue<_>>().is_err() {
            return Err(format!(
                "--peer-token-file {}: the token must be non-empty printable ASCII",
                path.display()
            ));
        }
        Ok(Some(token))
    }

    /// The TLS flags, checked and their files loaded.
    fn tls(&self) -> Result<(Option<tonic::transport::ServerTlsConfig>, Option<PeerTls>), String> {
        let client = match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Some(proto::tls::server(
                cert,
                key,
                self.tls_client_ca.as_deref(),
            )?),
            (None, None) if self.tls_client_ca.is_some() => {
                return Err("--tls-client-ca needs --tls-cert and --tls-key".into())
            }
            (None, None) => None,
            _ => return Err("--tls-cert and --tls-key go together".into()),
        };
        let peer = match (&self.peer_tls_cert, &self.peer_tls_key, &self.peer_tls_ca) {
            (None, None, None) => None,
            (Some(cert), Some(key), Some(ca)) => {
                if self.peer_listen.is_none() {
                    return Err(
                        "--peer-tls-* needs --peer-listen: peer links get a port of their own"
                            .into(),
                    );
                }
                Some(PeerTls {
                    server: proto::tls::server(cert, key, Some(ca))?,
                    client: proto::tls::client(ca, Some((cert, key)))?,
                })
            }
            _ => {
                return Err("--peer-tls-cert, --peer-tls-key and --peer-tls-ca go together".into())
            }
        };
        if client.is_some() && self.peer_listen.is_none() {
            return Err(
                "with --tls-cert, peer links need a port of their own: give --peer-listen (and --peer-tls-* to secure it)"
                    .into(),
            );
        }
        Ok((client, peer))
    }
}

/// The keys a config file may hold: the flags' names.
fn known_keys() -> std::collections::BTreeSet<String> {
    use clap::Args;
    ServeOptions::augment_args(clap::Command::new("serve"))
        .get_arguments()
        .map(|a| a.get_id().to_string())
        .filter(|id| id != "config")
        .collect()
}

fn load_file(path: &Path) -> Result<ServeOptions, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("config file {}: {e}", path.display()))?;
    let table: toml::Table =
        toml::from_str(&text).map_err(|e| format!("config file {}: {e}", path.display()))?;
    let known = known_keys();
    if let Some(key) = table.keys().find(|k| !known.contains(*k)) {
        return Err(format!(
            "config file {}: unknown key `{key}` (the keys are the flags' names, with underscores)",
            path.display()
        ));
    }
    ServeOptions::deserialize(toml::Value::Table(table))
        .map_err(|e| format!("config file {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts() -> ServeOptions {
        ServeOptions::default()
    }

    #[test]
    fn no_flags_is_a_single_local_node() {
        let c = opts().resolve().unwrap();
        assert_eq!(c.node_id, 1);
        assert_eq!(c.listen, "127.0.0.1:7470");
        assert_eq!(c.cluster.len(), 1);
        assert_eq!(c.data_dir, PathBuf::from("coordstore-data"));
        assert_eq!(c.coordination.jobs[0].name, "jax_worker");
    }

    #[test]
    fn the_gray_failure_settings_have_defaults_a_file_and_flags() {
        let c = opts().resolve().unwrap();
        assert_eq!(c.raft.disk_reserve_bytes, 64 << 20);
        assert_eq!(c.raft.slow_fsync_ms, 1000);
        assert_eq!(c.forward_attempt_ms, 2000);
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        std::fs::write(&file, "disk_reserve_bytes = 0\nslow_fsync_ms = 250\n").unwrap();
        let mut o = opts();
        o.config = Some(file);
        o.forward_attempt_ms = Some(0);
        let c = o.resolve().unwrap();
        assert_eq!((c.raft.disk_reserve_bytes, c.raft.slow_fsync_ms), (0, 250));
        // A forward needs some time: at least 1 ms.
        assert_eq!(c.forward_attempt_ms, 1);
    }

    #[test]
    fn flags_win_over_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        std::fs::write(
            &file,
            "node_id = 2\ntasks = 8\ncluster = \"1=a:1,2=b:2\"\nheartbeat_timeout_ms = 5000\n",
        )
        .unwrap();
        let mut o = opts();
        o.config = Some(file);
        o.job.heartbeat_timeout_ms = Some(7000);
        let c = o.resolve().unwrap();
        assert_eq!(c.node_id, 2);
        assert_eq!(c.coordination.jobs[0].count, 8);
        assert_eq!(c.coordination.heartbeat_timeout_ms, 7000);
        assert_eq!(c.cluster.get(&1).map(String::as_str), Some("a:1"));
    }

    #[test]
    fn unknown_file_keys_and_bad_clusters_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        std::fs::write(&file, "no_such_key = 1\n").unwrap();
        let mut o = opts();
        o.config = Some(file);
        assert!(o.resolve().unwrap_err().contains("no_such_key"));
        let mut o = opts();
        o.cluster = Some("2=a:1".into());
        assert!(o.resolve().unwrap_err().contains("does not list this node"));
    }

    #[test]
    fn raft_tuning_reaches_the_raft_settings() {
        assert_eq!(opts().resolve().unwrap().raft.max_inflight_batches, 2);
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        std::fs::write(
            &file,
            "max_inflight_batches = 8\nsnapshot_log_bytes = 0\nraft_threads = 1\n",
        )
        .unwrap();
        let mut o = opts();
        o.config = Some(file);
        let c = o.resolve().unwrap();
        assert_eq!(c.raft.max_inflight_batches, 8);
        assert_eq!(c.raft.snapshot_log_bytes, 0);
        assert_eq!(c.raft.raft_threads, 1);
        assert_eq!(opts().resolve().unwrap().raft.raft_threads, 0);
        // None in flight would never propose: at least one.
        let mut o = opts();
        o.raft.max_inflight_batches = Some(0);
        assert_eq!(o.resolve().unwrap().raft.max_inflight_batches, 1);
    }

    #[test]
    fn worker_threads_follow_the_flag_over_the_file() {
        // 0: tokio's default, one per CPU.
        assert_eq!(opts().resolve().unwrap().worker_threads, 0);
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        std::fs::write(&file, "worker_threads = 4\n").unwrap();
        let mut o = opts();
        o.config = Some(file.clone());
        assert_eq!(o.resolve().unwrap().worker_threads, 4);
        let mut o = opts();
        o.config = Some(file);
        o.worker_threads = Some(2);
        assert_eq!(o.resolve().unwrap().worker_threads, 2);
    }

    #[test]
    fn jobs_are_named() {
        let mut o = opts();
        o.job.job = vec!["worker=2".into(), "ps=1".into()];
        let c = o.resolve().unwrap();
        let names: Vec<_> = c
            .coordination
            .jobs
            .iter()
            .map(|j| j.name.as_str())
            .collect();
        assert_eq!(names, ["worker", "ps"]);
        assert!(c.coordination.notify_tasks, "TensorFlow jobs get notices");
        assert!(!opts().resolve().unwrap().coordination.notify_tasks);
    }

    #[test]
    fn tf_cluster_spec_from_a_cluster_spec_or_a_tf_config() {
        let mut o = opts();
        o.job.job = vec!["worker=2".into()];
        o.job.tf_cluster_spec =
            Some(r#"{"worker": ["127.0.0.1:1", "127.0.0.1:2"], "ps": ["127.0.0.1:9"]}"#.into());
        let c = o.resolve().unwrap();
        assert_eq!(c.tf_addresses["worker"], ["127.0.0.1:1", "127.0.0.1:2"]);

        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("tf_config.json");
        std::fs::write(
            &file,
            r#"{"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 0}}"#,
        )
        .unwrap();
        let mut o = opts();
        o.job.job = vec!["worker=2".into()];
        o.job.tf_cluster_spec = Some(format!("@{}", file.display()));
        assert_eq!(o.resolve().unwrap().tf_addresses["worker"], ["a:1", "b:2"]);

        // Too few addresses, not JSON, no --job: clear errors.
        let mut o = opts();
        o.job.job = vec!["worker=3".into()];
        o.job.tf_cluster_spec = Some(r#"{"worker": ["a:1"]}"#.into());
        assert!(o
            .resolve()
            .unwrap_err()
            .contains("1 address(es) for job worker"));
        let mut o = opts();
        o.job.job = vec!["worker=1".into()];
        o.job.tf_cluster_spec = Some("worker=a:1".into());
        assert!(o.resolve().unwrap_err().contains("not JSON"));
        let mut o = opts();
        o.job.tf_cluster_spec = Some(r#"{"worker": ["a:1"]}"#.into());
        assert!(o.resolve().unwrap_err().contains("--job"));
    }
}
