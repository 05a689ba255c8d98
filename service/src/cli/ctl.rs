//! `coordstore ctl`: the operator CLI. Every verb talks to one node's `Node`
//! API (reads are linearizable; writes go through the leader) and prints JSON
//! or plain values on stdout.

use journal::pb::{
    coordination::{KvDelete, KvInsert},
    update::Command,
    ClusterConfig, ResetJobEpoch,
};
use journal::{coordination::TaskStatus, State, Update};
use prost::Message;
use proto::coordstore::node_client::NodeClient;
use proto::coordstore::{KvGetRequest, KvListRequest, ProposeRequest, StateRequest, StatusRequest};
use serde_json::{json, Value};
use tonic::transport::Channel;

/// An operator command.
#[derive(clap::Subcommand, Debug, Clone)]
pub enum CtlCommand {
    /// Node status as one JSON object.
    Status,
    /// Key-value store verbs.
    #[command(subcommand)]
    Kv(KvCommand),
    /// Every task with its state, incarnation and error (JSON).
    Tasks,
    /// Every barrier with its newest instance (JSON).
    Barriers,
    /// Cluster membership.
    #[command(subcommand)]
    Member(MemberCommand),
    /// The tf.data dispatcher's state (JSON).
    #[command(subcommand)]
    Tfdata(TfDataCommand),
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
fn tfdata_json(s: &State, what: TfDataCommand) -> Value {
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

async fn propose(
    c: &mut NodeClient<Channel>,
    command: Command,
) -> anyhow::Result<journal::Outcome> {
    let u = Update {
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

async fn state(c: &mut NodeClient<Channel>) -> anyhow::Result<State> {
    let reply = c.state(StateRequest {}).await?.into_inner();
    Ok(State::decode_snapshot(&reply.snapshot)?)
}

/// The header of the backup `file`, once the file checks out.
fn backup_header(file: &std::path::Path) -> anyhow::Result<storage::backup::Header> {
    Ok(storage::backup::Backup::read(file)
        .map_err(anyhow::Error::msg)?
        .header)
}

/// Runs one command against `endpoint`; returns what to print.
/// `tls`: dial over TLS (None: plaintext).
pub async fn run(
    endpoint: &str,
    tls: Option<tonic::transport::ClientTlsConfig>,
    cmd: CtlCommand,
) -> anyhow::Result<String> {
    // Needs no node.
    if let CtlCommand::Snapshot(SnapshotCommand::Status { file }) = &cmd {
        return Ok(serde_json::to_string_pretty(&backup_header(file)?)?);
    }
    let mut c = connect(endpoint, tls).await?;
    let out: Value = match cmd {
        CtlCommand::Status => {
            let s = c.status(StatusRequest {}).await?.into_inner();
            json!({
                "node_id": s.node_id,
                "leader_id": if s.leader_id == 0 { Value::Null } else { json!(s.leader_id) },
                "term": s.term,
                "members": s.members.iter().map(|m| json!({"id": m.id, "address": m.address, "role": m.role})).collect::<Vec<_>>(),
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
            })
        }
        CtlCommand::Kv(KvCommand::Get { key }) => {
            let r = c
                .kv_get(KvGetRequest { key: key.clone() })
                .await?
                .into_inner();
            if !r.found {
                anyhow::bail!("key {key} not found");
            }
            return Ok(String::from_utf8_lossy(&r.value).into_owned());
        }
        CtlCommand::Kv(KvCommand::Put {
            key,
            value,
            no_overwrite,
        }) => {
            propose(
                &mut c,
                Command::from(KvInsert {
                    key,
                    value: value.into_bytes().into(),
                    allow_overwrite: !no_overwrite,
                }),
            )
            .await?;
            return Ok("OK".into());
        }
        CtlCommand::Kv(KvCommand::Delete { key }) => {
            propose(&mut c, Command::from(KvDelete { key })).await?;
            return Ok("OK".into());
        }
        CtlCommand::Kv(KvCommand::Ls { prefix }) => {
            let r = c
                .kv_list(KvListRequest { prefix, limit: 0 })
                .await?
                .into_inner();
            json!(r
                .entries
                .iter()
                .map(|e| json!({"key": e.key, "value": String::from_utf8_lossy(&e.value)}))
                .collect::<Vec<_>>())
        }
        CtlCommand::Tfdata(what) => tfdata_json(&state(&mut c).await?, what),
        CtlCommand::Tasks => {
            let s = state(&mut c).await?;
            json!((0..s.task_count())
                .map(|i| {
                    let t = s.coordination().task(i).expect("index in range");
                    let (job, id) = s.task_id(i).expect("index in range");
                    json!({
                        "job": job,
                        "task_id": id,
                        "state": match t.status() {
                            TaskStatus::Connected => "CONNECTED",
                            TaskStatus::Disconnected => "DISCONNECTED",
                            TaskStatus::Error => "ERROR",
                        },
                        "incarnation": t.incarnation,
                        "error": t.error.as_ref().map(|e| e.display()),
                    })
                })
                .collect::<Vec<_>>())
        }
        CtlCommand::Barriers => {
            let s = state(&mut c).await?;
            json!(s
                .coordination()
                .barriers()
                .map(|(id, b)| json!({
                    "id": id,
                    "counter": b.counter,
                    "status": format!("{:?}", b.status()).to_uppercase(),
                    "participants": b.participants,
                    "arrived": b.arrivals.keys().collect::<Vec<_>>(),
                    "deadline_ms": b.deadline_ms,
                    "error": b.error.as_ref().map(|e| e.display()),
                }))
                .collect::<Vec<_>>())
        }
        CtlCommand::Member(m) => {
            let r = match m {
                MemberCommand::Add {
                    id,
                    address,
                    peer_token_file,
                } => c
                    .add_member(with_token(
                        proto::coordstore::AddMemberRequest { id, address },
                        &peer_token_file,
                    )?)
                    .await?
                    .into_inner(),
                MemberCommand::Remove {
                    id,
                    peer_token_file,
                } => c
                    .remove_member(with_token(
                        proto::coordstore::RemoveMemberRequest { id },
                        &peer_token_file,
                    )?)
                    .await?
                    .into_inner(),
            };
            json!(r
                .members
                .iter()
                .map(|m| json!({"id": m.id, "address": m.address, "role": m.role}))
                .collect::<Vec<_>>())
        }
        CtlCommand::Snapshot(SnapshotCommand::Save { file }) => {
            let cluster_id = c.status(StatusRequest {}).await?.into_inner().cluster_id;
            let reply = c.state(StateRequest {}).await?.into_inner();
            let b = storage::backup::Backup::new(
                reply.snapshot.to_vec(),
                reply.last_applied,
                &cluster_id,
                crate::core::now_ms(),
            )
            .map_err(anyhow::Error::msg)?;
            b.write(&file)
                .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", file.display()))?;
            json!({"file": file.display().to_string(), "header": b.header})
        }
        CtlCommand::Snapshot(SnapshotCommand::Status { file }) => json!(backup_header(&file)?),
        CtlCommand::ResetJob { tasks } => {
            let config = match tasks {
                Some(n) => {
                    let mut cfg = state(&mut c)
                        .await?
                        .config()
                        .cloned()
                        .unwrap_or_else(ClusterConfig::default);
                    cfg.jobs = vec![journal::pb::JobSpec {
                        name: journal::JAX_JOB.into(),
                        count: n,
                    }];
                    Some(cfg)
                }
                None => None,
            };
            let out = propose(
                &mut c,
                Command::ResetJobEpoch(ResetJobEpoch {
                    service_incarnation: rand::random(),
                    config,
                }),
            )
            .await?;
            json!({"service_incarnation": out.service_incarnation()})
        }
    };
    Ok(serde_json::to_string_pretty(&out)?)
}
