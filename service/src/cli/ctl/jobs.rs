//! A job's views and data through `ctl`: its tasks, its pending barriers
//! and its keys.

use super::*;

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
    },
    /// Delete a key and everything under it.
    Delete { key: String },
}

/// `ctl kv ...`.
pub(super) async fn kv_command(
    c: &mut NodeConn,
    (ns, out): (&Option<String>, Output),
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
        KvCommand::Ls { prefix, torch } => {
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
pub(super) fn health_json(t: &TaskHealth) -> Value {
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
pub(super) async fn tasks_json(
    c: &mut NodeConn,
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
pub(super) fn pending_json(b: &PendingBarrier) -> Value {
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
pub(super) async fn barriers_json(
    c: &mut NodeConn,
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
