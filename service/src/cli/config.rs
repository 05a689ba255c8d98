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
            pub(super) fn over(self, other: $t) -> $t {
                $t {
                    $($opt: self.$opt.or(other.$opt),)*
                    $($($list: if self.$list.is_empty() { other.$list } else { self.$list },)*)?
                }
            }
        }
    };
}

mod groups;
mod security;

use groups::*;
pub use groups::{RaftOptions, TfDataOptions};
pub use security::{PeerTls, SecurityOptions};

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
mod tests;
