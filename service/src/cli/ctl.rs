//! `coordstore ctl`: the operator CLI. Every verb talks to one node's `Node`
//! API (reads are linearizable; writes go through the leader) and prints JSON
//! or plain values on stdout; a listing verb prints aligned columns with
//! `-o table` ([`table`], [`show`]).

mod show;
pub mod table;

use journal::pb::{
    coordination::{KvDelete, KvInsert},
    update::Command,
    ResetJobEpoch,
};
use journal::{State, Update};
use prost::Message;
use proto::coordstore::node_client::NodeClient;
use proto::coordstore::{
    BarrierWaitsRequest, BarriersRequest, KvGetRequest, KvListRequest, PendingBarrier,
    ProposeRequest, StateRequest, StatusRequest, TaskHealth, TasksRequest,
};
use serde_json::{json, Value};
use tonic::transport::Channel;

/// How a listing verb prints.
#[derive(clap::ValueEnum, Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Format {
    /// One JSON value with every field (for scripts).
    #[default]
    Json,
    /// Aligned columns, the few a person scans.
    Table,
}

/// The `-o` of a listing verb.
#[derive(clap::Args, Debug, Clone, Copy, Default)]
pub struct Output {
    /// json (every field, for scripts) or table (aligned columns)
    #[arg(
        short = 'o',
        long = "output",
        value_enum,
        default_value_t,
        global = true
    )]
    pub output: Format,
}

/// An operator command.
#[derive(clap::Subcommand, Debug, Clone)]
pub enum CtlCommand {
    /// Node status as one JSON object.
    Status {
        #[command(flatten)]
        out: Output,
    },
    /// Key-value store verbs.
    #[command(subcommand)]
    Kv(KvCommand),
    /// Every task with its state, incarnation, error and the age of its
    /// last heartbeat (the leader's).
    Tasks {
        /// One task: JOB/ID, or ID in a namespace of one job
        task: Option<String>,
        /// Only the tasks in this state
        #[arg(long, value_parser = ["connected", "disconnected", "error"])]
        state: Option<String>,
        #[command(flatten)]
        out: Output,
    },
    /// Every barrier with its newest instance; a pending one with how long
    /// it has waited and the tasks it waits for (the first 20, each with
    /// its state and last heartbeat).
    Barriers {
        /// One barrier, pending or not
        id: Option<String>,
        #[command(flatten)]
        out: Output,
    },
    /// Cluster membership.
    #[command(subcommand)]
    Member(MemberCommand),
    /// The tf.data dispatcher's state (JSON).
    Tfdata {
        #[command(subcommand)]
        what: TfDataCommand,
        #[command(flatten)]
        out: Output,
    },
    /// Start a new job epoch: clear tasks, barriers, errors and KV and draw a
    /// new service incarnation (optionally with a new task layout).
    ResetJob {
        /// N tasks in job `jax_worker`.
        #[arg(long)]
        tasks: Option<u32>,
    },
    /// Backups: save the state to a file, or check one.
    #[command(subcommand)]
    Snapshot(SnapshotCommand),
    /// Namespaces: one job each, on a port of its own.
    #[command(subcommand)]
    Ns(NsCommand),
}

/// Namespace verbs (each prints JSON).
#[derive(clap::Subcommand, Debug, Clone)]
pub enum NsCommand {
    /// Create a namespace; prints it (with its port).
    Create {
        /// A DNS label: [a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?
        name: String,
        #[command(flatten)]
        settings: Box<NsSettings>,
    },
    /// Every namespace (with its oldest pending barrier's wait).
    Ls {
        #[command(flatten)]
        out: Output,
    },
    /// One namespace: its settings, port, tasks by state, the pending
    /// barriers with the tasks they wait for, keys, bytes, parked calls,
    /// tf.data jobs and workers, closure queues.
    Get {
        name: String,
        #[command(flatten)]
        out: Output,
    },
    /// A new job epoch in the namespace (clears tasks, barriers, errors and
    /// KV; a new service incarnation).
    Reset {
        name: String,
        /// N tasks in job `jax_worker` from now on.
        #[arg(long)]
        tasks: Option<u32>,
    },
    /// Delete the namespace and everything in it.
    Delete { name: String },
    /// Save the namespace's whole state (read at a linearizable point,
    /// checksummed) to FILE, to import into another cluster.
    Export {
        name: String,
        file: std::path::PathBuf,
    },
    /// Create a namespace from an export file.
    Import {
        file: std::path::PathBuf,
        /// Its name here [default: the exported one]
        #[arg(long = "as")]
        as_name: Option<String>,
        /// Its port here [default: the lowest free one]
        #[arg(long, default_value_t = 0)]
        port: u32,
    },
}

/// A namespace's settings: its job's (the same flags as `coordstore
/// serve`'s, defaulting as they do) and what only a namespace has.
#[derive(clap::Args, Debug, Clone)]
pub struct NsSettings {
    #[command(flatten)]
    pub job: crate::cli::job::JobSettings,
    /// The port [default: the lowest free one of the cluster's range; none
    /// without a range: the namespace is then reached by name on the main port]
    #[arg(long)]
    pub port: Option<u32>,
    /// Most bytes of KV keys and values [default: none]
    #[arg(long)]
    pub max_bytes: Option<u64>,
    /// Most calls parked in the namespace on one node [default: the node's]
    #[arg(long)]
    pub max_parked_calls: Option<u64>,
    /// With mutual TLS: a client certificate name admitted (subject CN or
    /// a SAN; `*` matches any run of characters; repeatable) [default: any]
    #[arg(long)]
    pub allow_client_name: Vec<String>,
    /// Delete the namespace once its job is done and it has been quiet this
    /// long [default: never]
    #[arg(long)]
    pub ttl_ms: Option<u64>,
    /// With TLS: the namespace's port also serves PyTorch's TCPStore
    /// protocol in plaintext (torch's client has no TLS; a relay is the
    /// other way) [default: false]
    #[arg(long)]
    pub torch_plaintext: bool,
}

impl NsSettings {
    /// The settings as the Node API takes them.
    pub fn to_wire(&self) -> anyhow::Result<proto::coordstore::NamespaceSettings> {
        let job = &self.job;
        let jobs = job
            .jobs()
            .map_err(anyhow::Error::msg)?
            .into_iter()
            .map(|j| proto::coordstore::JobCount {
                name: j.name,
                count: j.count,
            })
            .collect::<Vec<_>>();
        if jobs.is_empty() && job.tasks.is_none() {
            anyhow::bail!("give the job's shape: --tasks N or --job NAME=N");
        }
        Ok(proto::coordstore::NamespaceSettings {
            jobs,
            tasks: job.tasks.unwrap_or(0),
            heartbeat_timeout_ms: job.heartbeat_timeout_ms,
            register_timeout_ms: job.register_timeout_ms,
            shutdown_timeout_ms: job.shutdown_timeout_ms,
            register_with_barrier: job.register_with_barrier,
            recoverable: job.recoverable.unwrap_or(false),
            notify_tasks: job.notify_tasks,
            tf_cluster_spec: job.tf_cluster_spec.clone().unwrap_or_default(),
            max_keys: job.max_keys,
            max_bytes: self.max_bytes,
            max_parked_calls: self.max_parked_calls,
            allow_client_names: self.allow_client_name.clone(),
            ttl_ms: self.ttl_ms,
            port: self.port.unwrap_or(0),
            torch_plaintext: self.torch_plaintext,
        })
    }
}

/// A namespace as JSON.
fn namespace_json(n: &proto::coordstore::NamespaceInfo) -> Value {
    let s = n.settings.clone().unwrap_or_default();
    json!({
        "name": n.name,
        "port": n.port,
        "service_incarnation": n.service_incarnation,
        "epoch": n.epoch,
        "spec": {
            "tasks": s.tasks,
            "jobs": s.jobs.iter().map(|j| json!({"name": j.name, "count": j.count})).collect::<Vec<_>>(),
            "heartbeat_timeout_ms": s.heartbeat_timeout_ms,
            "register_timeout_ms": s.register_timeout_ms,
            "shutdown_timeout_ms": s.shutdown_timeout_ms,
            "register_with_barrier": s.register_with_barrier,
            "recoverable": s.recoverable,
            "notify_tasks": s.notify_tasks,
            "tf_cluster_spec": s.tf_cluster_spec,
            "max_keys": s.max_keys,
            "max_bytes": s.max_bytes,
            "max_parked_calls": s.max_parked_calls,
            "allow_client_names": s.allow_client_names,
            "ttl_ms": s.ttl_ms,
            "torch_plaintext": s.torch_plaintext,
        },
        "tasks": {
            "disconnected": n.tasks_disconnected,
            "connected": n.tasks_connected,
            "error": n.tasks_error,
        },
        "barriers_pending": n.barriers_pending,
        "torch": {
            "keys": n.torch_keys,
            "queues": n.torch_queues,
            "waiting": n.torch_waiting,
        },
        "keys": n.keys,
        "bytes": n.bytes,
        "parked_calls": n.parked_calls,
        "tfdata": {"jobs": n.tfdata_jobs, "workers": n.tfdata_workers},
        "closure_queues": n.closure_queues.iter().map(|q| json!({
            "name": q.name, "pending": q.pending, "queued": q.queued,
            "running": q.running, "records": q.records,
        })).collect::<Vec<_>>(),
        "created_ms": n.created_ms,
        "last_active_ms": n.last_active_ms,
        "listener": n.listener,
    })
}

/// Backup verbs (restore a backup with `coordstore restore`).
#[derive(clap::Subcommand, Debug, Clone)]
pub enum SnapshotCommand {
    /// Save a consistent copy of the state, read on the leader after every
    /// write acknowledged before the call, to FILE (written to FILE.tmp,
    /// synced, then renamed); prints its index, size and checksum.
    Save { file: std::path::PathBuf },
    /// Check a backup file (form, size, checksum, journal format, digest)
    /// and print its header; needs no node.
    Status { file: std::path::PathBuf },
}

/// Membership verbs. A cluster started with --peer-token-file takes them
/// only with the same token.
#[derive(clap::Subcommand, Debug, Clone)]
pub enum MemberCommand {
    /// Add a node started with --join: learner until caught up, then voter.
    Add {
        id: u64,
        address: String,
        /// The cluster's peer token file, if it has one.
        #[arg(long)]
        peer_token_file: Option<std::path::PathBuf>,
    },
    /// Remove a node from the cluster.
    Remove {
        id: u64,
        /// The cluster's peer token file, if it has one.
        #[arg(long)]
        peer_token_file: Option<std::path::PathBuf>,
    },
}

/// A request carrying the peer token of `file`, if given.
fn with_token<T>(msg: T, file: &Option<std::path::PathBuf>) -> anyhow::Result<tonic::Request<T>> {
    let mut req = tonic::Request::new(msg);
    if let Some(path) = file {
        let token = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("--peer-token-file {}: {e}", path.display()))?;
        raft::PeerToken::new(Some(token.trim().to_string())).attach(&mut req);
    }
    Ok(req)
}

/// What of the tf.data dispatcher to list.
#[derive(clap::Subcommand, Debug, Clone, Copy)]
pub enum TfDataCommand {
    /// Registered datasets (ids, sizes, compression).
    Datasets,
    /// Jobs (named and anonymous).
    Jobs,
    /// Iterations with their clients and tasks.
    Iterations,
    /// Registered workers.
    Workers,
    /// Tasks.
    Tasks,
}

/// The tf.data dispatcher's state as JSON.
fn tfdata_json(s: journal::Namespace<'_>, what: TfDataCommand) -> Value {
    let d = s.dispatcher();
    match what {
        TfDataCommand::Datasets => json!(d
            .datasets()
            .map(|x| json!({
                "dataset_id": x.id,
                "definition_bytes": x.definition.len(),
                "compression": x.compression,
                "compression_disabled": x.compression_disabled,
            }))
            .collect::<Vec<_>>()),
        TfDataCommand::Jobs => json!(d
            .jobs()
            .map(|j| json!({
                "job_id": j.id,
                "name": j.name,
                "dataset_id": j.dataset_id,
                "sharding_policy": j.sharding_policy,
                "num_consumers": j.num_consumers,
                "target_workers": j.target_workers,
            }))
            .collect::<Vec<_>>()),
        TfDataCommand::Iterations => json!(d
            .iterations()
            .map(|it| {
                let clients: Vec<i64> = d
                    .clients()
                    .filter(|(_, i)| *i == it.id)
                    .map(|(c, _)| c)
                    .collect();
                json!({
                    "iteration_id": it.id,
                    "job_id": it.job_id,
                    "repetition": it.repetition,
                    "tasks": it.tasks,
                    "clients": clients,
                    "num_clients": it.num_clients,
                    "finished": it.finished,
                    "garbage_collected": it.garbage_collected,
                })
            })
            .collect::<Vec<_>>()),
        TfDataCommand::Workers => json!(d
            .workers()
            .map(|w| json!({"address": w.address, "tags": w.tags, "uid": w.uid}))
            .collect::<Vec<_>>()),
        TfDataCommand::Tasks => json!(d
            .tasks()
            .map(|t| json!({
                "task_id": t.id,
                "iteration_id": t.iteration_id,
                "worker_address": t.worker_address,
                "finished": t.finished,
            }))
            .collect::<Vec<_>>()),
    }
}

/// KV verbs.
#[derive(clap::Subcommand, Debug, Clone)]
pub enum KvCommand {
    /// Print a value.
    Get { key: String },
    /// Set a value (overwrites unless --no-overwrite).
    Put {
        key: String,
        value: String,
        #[arg(long)]
        no_overwrite: bool,
    },
    /// List keys under a directory ("" = every key) as JSON.
    Ls {
        #[arg(default_value = "")]
        prefix: String,
        /// The PyTorch store's keys (TCPStore) starting with PREFIX instead
        #[arg(long)]
        torch: bool,
        #[command(flatten)]
        out: Output,
    },
    /// Delete a key and everything under it.
    Delete { key: String },
}

async fn connect(
    endpoint: &str,
    tls: Option<tonic::transport::ClientTlsConfig>,
) -> anyhow::Result<NodeClient<Channel>> {
    let mut ep = tonic::transport::Endpoint::from_shared(proto::tls::uri(endpoint, tls.is_some()))?;
    if let Some(tls) = tls {
        ep = ep.tls_config(tls)?;
    }
    let ch = ep
        .connect()
        .await
        .map_err(|e| anyhow::anyhow!("cannot reach {endpoint}: {e}"))?;
    Ok(NodeClient::new(ch)
        .max_decoding_message_size(1 << 30)
        .max_encoding_message_size(1 << 30))
}

/// `msg` as a request in `namespace` (header `x-coordstore-namespace`).
fn in_ns<T>(namespace: &Option<String>, msg: T) -> anyhow::Result<tonic::Request<T>> {
    let mut req = tonic::Request::new(msg);
    if let Some(ns) = namespace {
        req.metadata_mut()
            .insert(crate::core::call::NAMESPACE_HEADER, ns.parse()?);
    }
    Ok(req)
}

async fn propose(
    c: &mut NodeClient<Channel>,
    namespace: &Option<String>,
    command: Command,
) -> anyhow::Result<journal::Outcome> {
    let u = Update {
        namespace: namespace.clone().unwrap_or_default(),
        command: Some(command),
        ..Default::default()
    };
    let reply = c
        .propose(ProposeRequest {
            update: u.encode_to_vec().into(),
        })
        .await?
        .into_inner();
    let out = journal::Outcome::decode(reply.outcome.as_ref())?;
    if let Some(e) = &out.error {
        anyhow::bail!("{}", e.display());
    }
    Ok(out)
}

/// Namespace `namespace`'s part of the state (the default one if `None`):
/// what a client the namespace admits may read.
async fn state(c: &mut NodeClient<Channel>, namespace: &Option<String>) -> anyhow::Result<State> {
    let namespace = namespace
        .as_deref()
        .unwrap_or(journal::DEFAULT_NAMESPACE)
        .to_string();
    let reply = c.state(StateRequest { namespace }).await?.into_inner();
    Ok(State::decode_snapshot(&reply.snapshot)?)
}

/// Namespace `namespace` (the default one if `None`) of `s`.
fn namespace<'a>(
    s: &'a State,
    namespace: &Option<String>,
) -> anyhow::Result<journal::Namespace<'a>> {
    let name = namespace.as_deref().unwrap_or(journal::DEFAULT_NAMESPACE);
    s.namespace(name)
        .ok_or_else(|| anyhow::anyhow!("namespace {name} does not exist"))
}

/// A namespace verb.
async fn ns_command(c: &mut NodeClient<Channel>, cmd: NsCommand) -> anyhow::Result<Printed> {
    match cmd {
        NsCommand::Ls { out } => Ok(shown(ns_list(c).await?, out, show::namespaces)),
        NsCommand::Get { name, out } => Ok(shown(ns_get(c, name).await?, out, show::namespace)),
        change => Ok(Printed::Json(ns_change(c, change).await?)),
    }
}

/// `ctl ns ls`: every namespace, each with its oldest pending barrier's
/// wait as the leader knows it (`oldest_barrier_ms`, null if none).
async fn ns_list(c: &mut NodeClient<Channel>) -> anyhow::Result<Value> {
    use proto::coordstore::ListNamespacesRequest;
    let all = c.list_namespaces(ListNamespacesRequest {}).await?;
    let waits = match c.barrier_waits(BarrierWaitsRequest {}).await {
        Ok(w) => w.into_inner().namespaces,
        Err(_) => Vec::new(),
    };
    Ok(json!(all
        .into_inner()
        .namespaces
        .iter()
        .map(|n| {
            let mut v = namespace_json(n);
            let wait = waits.iter().find(|w| w.namespace == n.name);
            v["oldest_barrier_ms"] = json!(wait.map(|w| w.waited_ms));
            v["oldest_barrier_at_least"] = json!(wait.is_some_and(|w| w.waited_at_least));
            v
        })
        .collect::<Vec<_>>()))
}

/// `ctl ns get NAME`: the namespace, with its pending barriers and the
/// tasks they wait for (`pending_barriers`; `pending_barriers_error` if
/// the node could not say).
async fn ns_get(c: &mut NodeClient<Channel>, name: String) -> anyhow::Result<Value> {
    use proto::coordstore::NamespaceRequest;
    let info = c
        .get_namespace(NamespaceRequest { name: name.clone() })
        .await?
        .into_inner();
    let mut v = namespace_json(&info);
    let asked = c
        .barriers(in_ns(&Some(name), BarriersRequest::default())?)
        .await;
    match asked {
        Ok(b) => {
            let pending = b.into_inner().barriers.iter().map(pending_json).collect();
            v["pending_barriers"] = Value::Array(pending);
        }
        Err(e) => v["pending_barriers_error"] = json!(describe_error(&e.into())),
    }
    Ok(v)
}

/// A namespace verb that changes something (or exports it).
async fn ns_change(c: &mut NodeClient<Channel>, cmd: NsCommand) -> anyhow::Result<Value> {
    use proto::coordstore::{
        CreateNamespaceRequest, ImportNamespaceRequest, NamespaceRequest, ResetNamespaceRequest,
    };
    let one = |n: proto::coordstore::NamespaceInfo| namespace_json(&n);
    Ok(match cmd {
        NsCommand::Create { name, settings } => {
            let settings = Some(settings.to_wire()?);
            let req = CreateNamespaceRequest { name, settings };
            one(c.create_namespace(req).await?.into_inner())
        }
        NsCommand::Ls { .. } => ns_list(c).await?,
        NsCommand::Get { name, .. } => ns_get(c, name).await?,
        NsCommand::Reset { name, tasks } => {
            let req = ResetNamespaceRequest {
                name,
                tasks: tasks.unwrap_or(0),
            };
            one(c.reset_namespace(req).await?.into_inner())
        }
        NsCommand::Delete { name } => one(c
            .delete_namespace(NamespaceRequest { name })
            .await?
            .into_inner()),
        NsCommand::Export { name, file } => {
            let bytes = c
                .export_namespace(NamespaceRequest { name })
                .await?
                .into_inner()
                .file;
            let (export, _) =
                storage::backup::Export::parse(bytes.to_vec()).map_err(anyhow::Error::msg)?;
            write_durably(&file, &bytes)
                .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", file.display()))?;
            json!({"file": file.display().to_string(), "header": export.header})
        }
        NsCommand::Import {
            file,
            as_name,
            port,
        } => {
            let bytes =
                std::fs::read(&file).map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
            storage::backup::Export::parse(bytes.clone())
                .map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
            let req = ImportNamespaceRequest {
                name: as_name.unwrap_or_default(),
                file: bytes.into(),
                port,
            };
            one(c.import_namespace(req).await?.into_inner())
        }
    })
}

/// Writes `bytes` to `path` durably: a temporary file beside it, synced,
/// renamed over it.
fn write_durably(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut tmp = path.as_os_str().to_os_string();
    tmp.push(".tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

/// The header of the backup `file`, once the file checks out.
fn backup_header(file: &std::path::Path) -> anyhow::Result<storage::backup::Header> {
    Ok(storage::backup::Backup::read(file)
        .map_err(anyhow::Error::msg)?
        .header)
}

/// How `ctl` prints a failure: a node's refusal as its gRPC code and
/// message (`PERMISSION_DENIED: ...`), anything else as it reads.
pub fn describe_error(e: &anyhow::Error) -> String {
    match e.downcast_ref::<tonic::Status>() {
        Some(s) => format!("{}: {}", code_name(s.code()), s.message()),
        None => e.to_string(),
    }
}

/// The canonical name of a gRPC code (`PERMISSION_DENIED`).
fn code_name(code: tonic::Code) -> String {
    let mut name = String::new();
    for (i, ch) in format!("{code:?}").chars().enumerate() {
        if ch.is_uppercase() && i > 0 {
            name.push('_');
        }
        name.push(ch.to_ascii_uppercase());
    }
    name
}

/// What a verb prints: JSON (pretty), or a plain value.
enum Printed {
    Json(Value),
    Text(String),
}

/// `v` as `out` asks: the JSON, or `table` of it.
fn shown(v: Value, out: Output, table: impl FnOnce(&Value) -> String) -> Printed {
    match out.output {
        Format::Json => Printed::Json(v),
        Format::Table => Printed::Text(table(&v).trim_end().to_string()),
    }
}

/// Runs one command against `endpoint`; returns what to print.
/// `tls`: dial over TLS (None: plaintext). `ns`: the namespace of the kv,
/// tasks, barriers, tfdata and reset-job verbs (None: the default one).
pub async fn run(
    endpoint: &str,
    tls: Option<tonic::transport::ClientTlsConfig>,
    ns: Option<String>,
    cmd: CtlCommand,
) -> anyhow::Result<String> {
    // Needs no node.
    if let CtlCommand::Snapshot(SnapshotCommand::Status { file }) = &cmd {
        return Ok(serde_json::to_string_pretty(&backup_header(file)?)?);
    }
    let mut c = connect(endpoint, tls).await?;
    let printed = match cmd {
        CtlCommand::Status { out } => shown(status_json(&mut c).await?, out, show::status),
        CtlCommand::Ns(n) => ns_command(&mut c, n).await?,
        CtlCommand::Kv(k) => kv_command(&mut c, &ns, k).await?,
        CtlCommand::Tfdata { what, out } => {
            let s = state(&mut c, &ns).await?;
            let v = tfdata_json(namespace(&s, &ns)?, what);
            shown(v, out, |v| show::tfdata(what, v))
        }
        CtlCommand::Tasks { task, state, out } => {
            let v = tasks_json(&mut c, &ns, task, state).await?;
            shown(v, out, show::tasks)
        }
        CtlCommand::Barriers { id, out } => {
            shown(barriers_json(&mut c, &ns, id).await?, out, show::barriers)
        }
        CtlCommand::Member(m) => Printed::Json(member_command(&mut c, m).await?),
        CtlCommand::Snapshot(s) => Printed::Json(snapshot_command(&mut c, s).await?),
        CtlCommand::ResetJob { tasks } => Printed::Json(reset_job(&mut c, &ns, tasks).await?),
    };
    Ok(match printed {
        Printed::Json(v) => serde_json::to_string_pretty(&v)?,
        Printed::Text(t) => t,
    })
}

/// `ctl status`: the node's status as JSON.
async fn status_json(c: &mut NodeClient<Channel>) -> anyhow::Result<Value> {
    let s = c.status(StatusRequest {}).await?.into_inner();
    Ok(json!({
        "node_id": s.node_id,
        "leader_id": if s.leader_id == 0 { Value::Null } else { json!(s.leader_id) },
        "term": s.term,
        "members": s.members.iter().map(|m| json!({
            "id": m.id, "address": m.address, "role": m.role,
            "feature_level": (m.feature_level != 0).then_some(m.feature_level),
        })).collect::<Vec<_>>(),
        "last_applied": s.last_applied,
        "service_incarnation": s.service_incarnation,
        "address": s.address,
        "role": s.role,
        "last_log_index": s.last_log_index,
        "snapshot_index": s.snapshot_index,
        "purged_index": s.purged_index,
        "parked_calls": s.parked_calls,
        "parked_by_kind": s.parked_by_kind,
        "state_digest": s.state_digest,
        "namespaces": s.namespaces,
        "feature_level": s.feature_level,
        "cluster_feature_level": s.cluster_feature_level,
        "disk": s.disk.map(|d| crate::ops::disk_json(&d)),
    }))
}

/// `ctl kv ...`.
async fn kv_command(
    c: &mut NodeClient<Channel>,
    ns: &Option<String>,
    cmd: KvCommand,
) -> anyhow::Result<Printed> {
    Ok(match cmd {
        KvCommand::Get { key } => {
            let r = c
                .kv_get(in_ns(ns, KvGetRequest { key: key.clone() })?)
                .await?
                .into_inner();
            if !r.found {
                anyhow::bail!("key {key} not found");
            }
            Printed::Text(String::from_utf8_lossy(&r.value).into_owned())
        }
        KvCommand::Put {
            key,
            value,
            no_overwrite,
        } => {
            let insert = KvInsert {
                key,
                value: value.into_bytes().into(),
                allow_overwrite: !no_overwrite,
            };
            propose(c, ns, Command::from(insert)).await?;
            Printed::Text("OK".into())
        }
        KvCommand::Delete { key } => {
            propose(c, ns, Command::from(KvDelete { key })).await?;
            Printed::Text("OK".into())
        }
        KvCommand::Ls { prefix, torch, out } => {
            let list = KvListRequest {
                prefix,
                limit: 0,
                torch,
            };
            let r = c.kv_list(in_ns(ns, list)?).await?.into_inner();
            let v = json!(r
                .entries
                .iter()
                .map(|e| json!({"key": e.key, "value": String::from_utf8_lossy(&e.value)}))
                .collect::<Vec<_>>());
            shown(v, out, show::keys)
        }
    })
}

/// A task of the diagnostics as `ctl tasks` prints it.
fn health_json(t: &TaskHealth) -> Value {
    json!({
        "job": t.job,
        "task_id": t.task_id,
        "state": t.state,
        "incarnation": t.incarnation,
        "error": (!t.error.is_empty()).then_some(&t.error),
        "heartbeat_age_ms": t.heartbeat_age_ms,
        "disconnected_age_ms": t.disconnected_age_ms,
    })
}

/// `ctl tasks [TASK] [--state S]`: the tasks with their state, incarnation,
/// error and the age of their last heartbeat (the leader's; null when not
/// connected or not heard since it took over). NOT_FOUND for a task the
/// namespace does not have.
async fn tasks_json(
    c: &mut NodeClient<Channel>,
    ns: &Option<String>,
    task: Option<String>,
    state: Option<String>,
) -> anyhow::Result<Value> {
    let req = TasksRequest {
        state: state.unwrap_or_default(),
        task: task.unwrap_or_default(),
    };
    let r = c.tasks(in_ns(ns, req)?).await?.into_inner();
    Ok(Value::Array(r.tasks.iter().map(health_json).collect()))
}

/// What `ctl barriers` adds to a pending barrier: how long it has waited
/// (the leader's; `waited_at_least` when it counts from the leader's
/// takeover), arrived of expected, and the first tasks it waits for with
/// their state and last heartbeat.
fn pending_json(b: &PendingBarrier) -> Value {
    json!({
        "id": b.id,
        "counter": b.counter,
        "waited_ms": b.waited_ms,
        "waited_at_least": b.waited_at_least,
        "arrived_count": b.arrived,
        "participant_count": b.participants,
        "deadline_ms": b.deadline_ms,
        "missing_count": b.missing_count,
        "missing": b.missing.iter().map(health_json).collect::<Vec<_>>(),
    })
}

/// `ctl barriers [ID]`: every barrier with its newest instance (or the one
/// named: NOT_FOUND if there is none), a pending one with [`pending_json`]'s
/// fields too.
async fn barriers_json(
    c: &mut NodeClient<Channel>,
    ns: &Option<String>,
    id: Option<String>,
) -> anyhow::Result<Value> {
    let req = BarriersRequest {
        id: id.clone().unwrap_or_default(),
        missing_limit: 0,
    };
    let pending = c.barriers(in_ns(ns, req)?).await?.into_inner().barriers;
    let s = state(c, ns).await?;
    let s = namespace(&s, ns)?;
    let coordination = s.coordination();
    let all: Vec<Value> = coordination
        .barriers()
        .filter(|(b, _)| id.as_ref().is_none_or(|id| id == *b))
        .map(|(id, b)| {
            let mut v = json!({
                "id": id,
                "counter": b.counter,
                "status": format!("{:?}", b.status()).to_uppercase(),
                "participants": b.participants,
                "arrived": b.arrivals.keys().collect::<Vec<_>>(),
                "deadline_ms": b.deadline_ms,
                "error": b.error.as_ref().map(|e| e.display()),
            });
            let diag = pending
                .iter()
                .find(|p| p.id == *id && p.status == "PENDING");
            if let (Some(p), Some(o)) = (diag.map(pending_json), v.as_object_mut()) {
                let extra = p.as_object().cloned().unwrap_or_default();
                o.extend(
                    extra
                        .into_iter()
                        .filter(|(k, _)| k != "id" && k != "counter"),
                );
            }
            v
        })
        .collect();
    Ok(Value::Array(all))
}

/// `ctl member add|remove`: the members after the change.
async fn member_command(c: &mut NodeClient<Channel>, m: MemberCommand) -> anyhow::Result<Value> {
    let r = match m {
        MemberCommand::Add {
            id,
            address,
            peer_token_file,
        } => {
            let req = proto::coordstore::AddMemberRequest { id, address };
            c.add_member(with_token(req, &peer_token_file)?).await?
        }
        MemberCommand::Remove {
            id,
            peer_token_file,
        } => {
            let req = proto::coordstore::RemoveMemberRequest { id };
            c.remove_member(with_token(req, &peer_token_file)?).await?
        }
    };
    Ok(json!(r
        .into_inner()
        .members
        .iter()
        .map(|m| json!({"id": m.id, "address": m.address, "role": m.role}))
        .collect::<Vec<_>>()))
}

/// `ctl snapshot save|status`.
async fn snapshot_command(
    c: &mut NodeClient<Channel>,
    cmd: SnapshotCommand,
) -> anyhow::Result<Value> {
    let file = match cmd {
        SnapshotCommand::Status { file } => return Ok(json!(backup_header(&file)?)),
        SnapshotCommand::Save { file } => file,
    };
    let cluster_id = c.status(StatusRequest {}).await?.into_inner().cluster_id;
    let reply = c.state(StateRequest::default()).await?.into_inner();
    let b = storage::backup::Backup::new(
        reply.snapshot.to_vec(),
        reply.last_applied,
        &cluster_id,
        crate::core::now_ms(),
    )
    .map_err(anyhow::Error::msg)?;
    b.write(&file)
        .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", file.display()))?;
    Ok(json!({"file": file.display().to_string(), "header": b.header}))
}

/// `ctl reset-job [--tasks N]`: a new job epoch; its service incarnation.
async fn reset_job(
    c: &mut NodeClient<Channel>,
    ns: &Option<String>,
    tasks: Option<u32>,
) -> anyhow::Result<Value> {
    let config = match tasks {
        Some(n) => {
            let s = state(c, ns).await?;
            let mut cfg = namespace(&s, ns)?.config().cloned().unwrap_or_default();
            cfg.jobs = vec![journal::pb::JobSpec {
                name: journal::JAX_JOB.into(),
                count: n,
            }];
            Some(cfg)
        }
        None => None,
    };
    let reset = ResetJobEpoch {
        service_incarnation: rand::random(),
        config,
    };
    let out = propose(c, ns, Command::ResetJobEpoch(reset)).await?;
    Ok(json!({"service_incarnation": out.service_incarnation()}))
}
