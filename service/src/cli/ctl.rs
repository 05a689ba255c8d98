//! `coordstore ctl`: the operator CLI. Every verb talks to one node's `Node`
//! API (reads are linearizable; writes go through the leader) and prints JSON
//! or plain values on stdout; a listing verb prints aligned columns with
//! `-o table` ([`table`], [`show`]).

mod conn;
mod jobs;
mod ns;
mod show;
pub mod table;

use conn::NodeConn;
pub use jobs::KvCommand;
use jobs::*;
use ns::*;
pub use ns::{NsCommand, NsSettings};

use journal::pb::{
    coordination::{KvDelete, KvInsert},
    update::Command,
    ResetJobEpoch,
};
use journal::{State, Update};
use prost::Message;
use proto::coordstore::{
    BarrierWaitsRequest, BarriersRequest, KvGetRequest, KvListRequest, PendingBarrier,
    ProposeRequest, StateRequest, StatusRequest, TaskHealth, TasksRequest,
};
use serde_json::{json, Value};

/// How a listing verb prints.
#[derive(clap::ValueEnum, Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Format {
    /// One JSON value with every field (for scripts).
    #[default]
    Json,
    /// Aligned columns, the few a person scans.
    Table,
}

/// `ctl`'s `-o`: how a listing verb prints. Given anywhere on the command
/// line, before the verb or after it (`ctl -o table status`, etcdctl's
/// `-w table` habit, and `ctl status -o table`); a verb without a table
/// prints JSON or its plain value either way.
#[derive(clap::Args, Debug, Clone, Copy, Default)]
pub struct Output {
    /// json (every field, for scripts) or table (aligned columns; listing
    /// verbs)
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
    Status,
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
    },
    /// Every barrier with its newest instance; a pending one with how long
    /// it has waited and the tasks it waits for (the first 20, each with
    /// its state and last heartbeat).
    Barriers {
        /// One barrier, pending or not
        id: Option<String>,
    },
    /// What the namespace's PyTorch store waits for: the keys ranks wait
    /// on (how many, since when, and who: node, address, pid), the
    /// counters ranks ADD to (a store barrier's, with the number it counts
    /// to where the store tells), the connections by node, the last write.
    Torch {
        /// Keys listed, the most waited-on first (0: 100)
        #[arg(long, default_value_t = 0)]
        keys: u32,
        /// Waiters listed per key (0: 20)
        #[arg(long, default_value_t = 0)]
        waiters: u32,
    },
    /// Cluster membership.
    #[command(subcommand)]
    Member(MemberCommand),
    /// The tf.data dispatcher's state (JSON).
    Tfdata {
        #[command(subcommand)]
        what: TfDataCommand,
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

async fn connect(
    endpoint: &str,
    tls: Option<tonic::transport::ClientTlsConfig>,
) -> anyhow::Result<NodeConn> {
    let mut ep = tonic::transport::Endpoint::from_shared(proto::tls::uri(endpoint, tls.is_some()))?;
    if let Some(tls) = tls {
        ep = ep.tls_config(tls)?;
    }
    let ch = ep
        .connect()
        .await
        .map_err(|e| anyhow::anyhow!("cannot reach {endpoint}: {e}"))?;
    Ok(NodeConn::new(ch))
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
    c: &mut NodeConn,
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
async fn state(c: &mut NodeConn, namespace: &Option<String>) -> anyhow::Result<State> {
    let namespace = namespace
        .as_deref()
        .unwrap_or(journal::DEFAULT_NAMESPACE)
        .to_string();
    let reply = c.state(StateRequest { namespace }).await?.into_inner();
    Ok(State::decode_snapshot(&reply.snapshot)?)
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

/// Runs one command against `endpoint`; returns what to print, as `out`
/// asks. `tls`: dial over TLS (None: plaintext). `ns`: the namespace of the
/// kv, tasks, barriers, tfdata and reset-job verbs (None: the default one).
pub async fn run(
    endpoint: &str,
    tls: Option<tonic::transport::ClientTlsConfig>,
    (ns, out): (Option<String>, Output),
    cmd: CtlCommand,
) -> anyhow::Result<String> {
    // Needs no node.
    if let CtlCommand::Snapshot(SnapshotCommand::Status { file }) = &cmd {
        return Ok(serde_json::to_string_pretty(&backup_header(file)?)?);
    }
    let mut c = connect(endpoint, tls).await?;
    let printed = match cmd {
        CtlCommand::Status => shown(status_json(&mut c).await?, out, show::status),
        CtlCommand::Ns(n) => ns_command(&mut c, n, out).await?,
        CtlCommand::Kv(k) => kv_command(&mut c, (&ns, out), k).await?,
        CtlCommand::Tfdata { what } => {
            let s = state(&mut c, &ns).await?;
            let v = tfdata_json(namespace(&s, &ns)?, what);
            shown(v, out, |v| show::tfdata(what, v))
        }
        CtlCommand::Tasks { task, state } => {
            let v = tasks_json(&mut c, &ns, task, state).await?;
            shown(v, out, show::tasks)
        }
        CtlCommand::Barriers { id } => {
            shown(barriers_json(&mut c, &ns, id).await?, out, show::barriers)
        }
        CtlCommand::Torch { keys, waiters } => {
            let req = proto::coordstore::StoreWaitsRequest {
                key_limit: keys,
                waiter_limit: waiters,
            };
            let r = c.store_waits(in_ns(&ns, req)?).await?.into_inner();
            shown(crate::ops::store_waits::to_json(&r), out, show::torch)
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
async fn status_json(c: &mut NodeConn) -> anyhow::Result<Value> {
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

/// `ctl member add|remove`: the members after the change.
async fn member_command(c: &mut NodeConn, m: MemberCommand) -> anyhow::Result<Value> {
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
async fn snapshot_command(c: &mut NodeConn, cmd: SnapshotCommand) -> anyhow::Result<Value> {
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
    c: &mut NodeConn,
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
