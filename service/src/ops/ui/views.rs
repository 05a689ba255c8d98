//! What the status page shows, as JSON: the cluster (members, roles, each
//! node's applied index and readiness), every namespace's summary, one
//! namespace in full. Everything is read from this node's state, except
//! what only the leader knows (barrier waits, heartbeat ages), which is
//! asked of it through the diagnostics ([`super::super::diagnose`]). A
//! namespace caught half-built (not configured yet) shows what it has.

use std::sync::Arc;
use std::time::Duration;

use journal::coordination::TaskStatus;
use journal::Namespace;
use proto::coordstore::{NamespaceWait, PendingBarrier, ReadyRequest, TaskHealth};
use serde_json::{json, Value};
use tonic::Status;

use crate::core::{now_ms, Call, CallResult, Core};
use crate::ops::diagnose;

/// How long the cluster view waits for each member's readiness.
const MEMBER_WAIT: Duration = Duration::from_millis(1500);
/// Tasks in error the namespace view lists.
const ERRORS_SHOWN: usize = 50;

/// A quota as JSON: `null` for none (0 in the state).
fn quota(v: u64) -> Value {
    if v == 0 {
        Value::Null
    } else {
        json!(v)
    }
}

/// The cluster as this node sees it, each member asked for its readiness
/// (in parallel, [`MEMBER_WAIT`] each).
pub async fn cluster(core: &Arc<Core>) -> Value {
    let node = core.node();
    let m = node.metrics();
    let leader = m.current_leader;
    let checks: Vec<_> = node
        .members()
        .into_iter()
        .map(|(id, address, voter)| {
            let role = raft::Role::of_member(id, voter, leader).as_str();
            let check = tokio::spawn(member_ready(core.clone(), id, address.clone()));
            (id, address, role, check)
        })
        .collect();
    let mut members = Vec::new();
    for (id, address, role, check) in checks {
        let ready = check
            .await
            .unwrap_or_else(|e| json!({"error": e.to_string()}));
        let mut member = json!({"id": id, "address": address, "role": role});
        if let (Some(into), Some(from)) = (member.as_object_mut(), ready.as_object()) {
            into.extend(from.clone());
        }
        members.push(member);
    }
    let state = node.state();
    json!({
        "node_id": node.id(),
        "leader_id": leader.unwrap_or(0),
        "term": m.current_term,
        "cluster_id": node.cluster_id(),
        "feature_level": journal::FEATURE_LEVEL,
        "cluster_feature_level": state.read(|s| s.feature_level()),
        "last_log_index": m.last_log_index.unwrap_or(0),
        "now_ms": now_ms(),
        "members": members,
    })
}

/// Member `id`'s readiness and applied index: this node's own check, or
/// the member's answer to the Node API's Ready (an error if it does not
/// answer in time).
async fn member_ready(core: Arc<Core>, id: u64, address: String) -> Value {
    if id == core.node().id() {
        let ready = super::super::ready(&core).await;
        return json!({
            "ready": ready.is_ok(),
            "not_ready": ready.err(),
            "applied_index": core.parking().applied_index(),
            "disk": crate::ops::disk_json(&core.node().health().to_proto()),
        });
    }
    let asked = async {
        let ch = core
            .node()
            .channels()
            .get(id, &address)
            .map_err(Status::unavailable)?;
        let mut client = core.router().node_client(ch);
        client.ready(ReadyRequest {}).await
    };
    match tokio::time::timeout(MEMBER_WAIT, asked).await {
        Ok(Ok(r)) => {
            let r = r.into_inner();
            let not_ready = (!r.ready).then_some(r.not_ready);
            let disk = r.disk.as_ref().map(crate::ops::disk_json);
            json!({"ready": r.ready, "not_ready": not_ready, "applied_index": r.applied_index, "disk": disk})
        }
        Ok(Err(s)) => json!({"ready": false, "error": format!("unreachable: {}", s.message())}),
        Err(_) => json!({
            "ready": false,
            "error": format!("no answer within {} ms", MEMBER_WAIT.as_millis()),
        }),
    }
}

/// Namespace `n`'s summary: tasks by state, keys and bytes against their
/// quotas, parked calls on this node, barriers pending and the oldest
/// one's wait (the leader's `wait`), TTL, created.
fn summary(n: &Namespace<'_>, parked: u64, wait: Option<&NamespaceWait>) -> Value {
    let spec = n.spec().cloned().unwrap_or_default();
    let u = n.usage();
    json!({
        "name": n.name(),
        "port": spec.port,
        "initialized": n.is_initialized(),
        "epoch": n.epoch(),
        "tasks": {
            "disconnected": u.tasks[0],
            "connected": u.tasks[1],
            "error": u.tasks[2],
            "total": n.task_count(),
        },
        "keys": u.held.keys,
        "max_keys": quota(n.config().map_or(0, |c| c.max_keys)),
        "bytes": u.held.bytes,
        "max_bytes": quota(spec.max_bytes),
        "parked_calls": parked,
        "max_parked_calls": quota(spec.max_parked_calls),
        "barriers_pending": u.barriers_pending,
        "oldest_barrier_ms": wait.map(|w| w.waited_ms),
        "oldest_barrier_at_least": wait.is_some_and(|w| w.waited_at_least),
        "oldest_barrier": wait.map(|w| w.barrier.clone()),
        "ttl_ms": quota(spec.ttl_ms),
        "created_ms": spec.created_ms,
        "last_active_ms": n.last_active_ms(),
    })
}

/// Every namespace's summary, by name.
pub async fn namespaces(core: &Core) -> Value {
    let waits = diagnose::waits_or_none(core, &Call::internal()).await;
    let parking = core.parking();
    let all: Vec<Value> = core.state(|s| {
        s.namespaces()
            .map(|n| summary(&n, parking.parked_in(n.key()), waits.get(n.name())))
            .collect()
    });
    Value::Array(all)
}

/// One letter per task, by index: C(onnected), D(isconnected), E(rror).
fn states(n: &Namespace<'_>) -> String {
    let c = n.coordination();
    (0..n.task_count())
        .map(|i| match c.task_status(i) {
            Some(TaskStatus::Connected) => 'C',
            Some(TaskStatus::Disconnected) => 'D',
            Some(TaskStatus::Error) => 'E',
            None => '?',
        })
        .collect()
}

/// The jobs of `n` with the index of their first task.
fn jobs(n: &Namespace<'_>) -> Value {
    let mut first = 0u32;
    let jobs = n.config().map_or(&[][..], |c| &c.jobs[..]);
    Value::Array(
        jobs.iter()
            .map(|j| {
                let v = json!({"name": j.name, "count": j.count, "first_index": first});
                first = first.saturating_add(j.count);
                v
            })
            .collect(),
    )
}

/// The tasks of `n` in error (the first [`ERRORS_SHOWN`]) and the error
/// propagated to its tasks, if any.
fn errors(n: &Namespace<'_>) -> Value {
    let c = n.coordination();
    let shown: Vec<Value> = (0..n.task_count())
        .filter_map(|i| {
            let e = c.task(i)?.error.as_ref()?;
            Some(json!({
                "index": i,
                "name": n.task_name(i),
                "code": journal::errors::code_name(e.status()),
                "message": e.message,
            }))
        })
        .take(ERRORS_SHOWN)
        .collect();
    Value::Array(shown)
}

/// The tf.data service's jobs and workers of `n`.
fn tfdata(n: &Namespace<'_>) -> Value {
    let d = n.dispatcher();
    let jobs: Vec<Value> = d
        .jobs()
        .map(|j| {
            json!({
                "job_id": j.id,
                "name": j.name,
                "dataset_id": j.dataset_id,
                "num_consumers": j.num_consumers,
            })
        })
        .collect();
    let workers: Vec<Value> = d
        .workers()
        .map(|w| json!({"address": w.address, "tags": w.tags}))
        .collect();
    json!({"jobs": jobs, "workers": workers})
}

/// The closure queues of `n`.
fn queues(n: &Namespace<'_>) -> Value {
    let q: Vec<Value> = n
        .closures()
        .stats()
        .into_iter()
        .map(|q| {
            json!({
                "name": q.name,
                "pending": q.pending,
                "queued": q.queued,
                "running": q.running,
                "records": q.records,
            })
        })
        .collect();
    Value::Array(q)
}

/// A task of the diagnostics as the page shows it.
pub fn task(t: &TaskHealth) -> Value {
    json!({
        "index": t.index,
        "name": journal::task_name(&t.job, t.task_id),
        "job": t.job,
        "task_id": t.task_id,
        "state": t.state,
        "incarnation": format!("{:016x}", t.incarnation),
        "error": (!t.error.is_empty()).then_some(&t.error),
        "heartbeat_age_ms": t.heartbeat_age_ms,
        "disconnected_age_ms": t.disconnected_age_ms,
    })
}

/// A barrier of the diagnostics as the page shows it.
pub fn barrier(b: &PendingBarrier) -> Value {
    json!({
        "id": b.id,
        "counter": b.counter,
        "status": b.status,
        "error": (!b.error.is_empty()).then_some(&b.error),
        "waited_ms": b.waited_ms,
        "waited_at_least": b.waited_at_least,
        "arrived": b.arrived,
        "expected": b.participants,
        "deadline_ms": b.deadline_ms,
        "missing_count": b.missing_count,
        "missing": b.missing.iter().map(task).collect::<Vec<_>>(),
    })
}

/// Namespace `name` in full, or NOT_FOUND.
pub async fn namespace(core: &Core, name: &str) -> CallResult<Value> {
    let c = Call::internal().in_namespace(name);
    let (barriers, from_leader) = diagnose::barriers_or_here(core, &c).await?;
    let oldest = barriers.iter().filter_map(|b| b.waited_ms).max();
    let wait = oldest.map(|ms| NamespaceWait {
        namespace: name.to_string(),
        barrier: String::new(),
        waited_ms: ms,
        waited_at_least: barriers.iter().any(|b| b.waited_at_least),
    });
    let parked = core.parking().parked_in(c.namespace_key());
    let mut view = core.read(&c, |n| {
        let mut v = summary(&n, parked, wait.as_ref());
        v["tasks"]["states"] = json!(states(&n));
        v["tasks"]["jobs"] = jobs(&n);
        v["errors"] = errors(&n);
        v["tfdata"] = tfdata(&n);
        v["closure_queues"] = queues(&n);
        v
    })?;
    view["barriers"] = Value::Array(barriers.iter().map(barrier).collect());
    view["ages_from_leader"] = json!(from_leader);
    // The PyTorch store: keys, addresses and counts, never a value.
    let asked = crate::ops::store_waits::store_waits(core, &c, Default::default());
    view["torch"] = match asked.await {
        Ok(r) => crate::ops::store_waits::to_json(&r),
        Err(e) => json!({"error": e.into_plain_status().message()}),
    };
    view["now_ms"] = json!(now_ms());
    Ok(view)
}

/// One barrier of namespace `name` (pending or not), or NOT_FOUND.
pub async fn one_barrier(core: &Core, name: &str, id: &str) -> CallResult<Value> {
    let c = Call::internal().in_namespace(name);
    let r = proto::coordstore::BarriersRequest {
        id: id.to_string(),
        missing_limit: 0,
    };
    // The barrier must exist here; how long it waited is the leader's.
    let here = core.read(&c, |n| diagnose::barriers_here(&n, None, &r))??;
    let asked = tokio::time::timeout(diagnose::ASK_LEADER, diagnose::barriers(core, &c, r));
    let found = match asked.await {
        Ok(Ok(b)) if !b.is_empty() => b,
        _ => here,
    };
    Ok(found.first().map(barrier).unwrap_or(Value::Null))
}

/// One task of namespace `name`, or NOT_FOUND.
pub async fn one_task(core: &Core, name: &str, task_name: &str) -> CallResult<Value> {
    let c = Call::internal().in_namespace(name);
    let r = proto::coordstore::TasksRequest {
        state: String::new(),
        task: task_name.to_string(),
    };
    // The task must exist here; its heartbeat age is the leader's.
    let here = core.read(&c, |n| diagnose::tasks_here(&n, None, &r))??;
    let asked = tokio::time::timeout(diagnose::ASK_LEADER, diagnose::tasks(core, &c, r));
    let tasks = match asked.await {
        Ok(Ok(t)) if !t.is_empty() => t,
        _ => here,
    };
    Ok(tasks.first().map(task).unwrap_or(Value::Null))
}

/// Whether namespace `name` exists here, and whether `check` finds what
/// the page asks for in it (a task, a barrier): the page's 200 or 404.
pub fn exists(core: &Core, name: &str, check: impl FnOnce(&Namespace<'_>) -> bool) -> bool {
    core.state(|s| s.namespace(name).is_some_and(|n| check(&n)))
}
