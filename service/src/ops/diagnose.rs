//! Why is this job stuck: each task's state with the age of its last
//! heartbeat, the pending barriers with the tasks they wait for. The
//! replicated state knows who arrived and who is in error; only the leader
//! knows when it last heard each task and since when a barrier has waited
//! (the coordination duty's [`Liveness`]). So these reads run on the leader
//! — after a read barrier there, a follower forwards them over the Node
//! API — and add no log entry. `ctl tasks`, `ctl barriers`, `ctl ns get`,
//! the Node API and the status page all answer through here.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use journal::coordination::TaskStatus;
use journal::pb::coordination::{BarrierEntry, BarrierStatus};
use journal::Namespace;
use proto::coordstore::{
    BarrierWaitsRequest, BarrierWaitsResponse, BarriersRequest, BarriersResponse, NamespaceWait,
    PendingBarrier, TaskHealth, TasksRequest, TasksResponse,
};
use tonic::Status;

use crate::core::router::Forwarding;
use crate::core::{now_ms, Call, CallError, CallResult, Core};
use crate::duties::coordination::{liveness_of, Liveness};

/// Missing tasks listed per barrier unless the caller asks for another
/// number.
pub const MISSING_LIMIT: usize = 20;

/// How long a view that must answer (the page, `ns get`) waits for the
/// leader before it answers from this node's state without the leader's
/// clocks.
pub const ASK_LEADER: Duration = Duration::from_secs(2);

/// A state filter (`--state`, any case): `None` for every state. The
/// names are the journal's (`TaskStatus::as_str_name`), as every view and
/// the agent dialect show them.
fn parse_state(s: &str) -> CallResult<Option<TaskStatus>> {
    if s.is_empty() {
        return Ok(None);
    }
    match TaskStatus::from_str_name(&s.to_ascii_uppercase()) {
        Some(state) => Ok(Some(state)),
        None => Err(CallError::from(Status::invalid_argument(format!(
            "task state {:?}: connected, disconnected or error",
            s.to_ascii_lowercase()
        )))),
    }
}

/// The index of the task `name` names in `n`: `JOB/ID`,
/// `/job:JOB/replica:0/task:ID`, or `ID` in a namespace of one job.
pub fn parse_task(n: &Namespace<'_>, name: &str) -> CallResult<u32> {
    let tf = name
        .strip_prefix("/job:")
        .and_then(|r| r.split_once('/'))
        .and_then(|(job, r)| Some((job, r.rsplit_once("task:")?.1)));
    let (job, id) = match tf.or_else(|| name.rsplit_once('/')) {
        Some((job, id)) => (job.to_string(), id),
        None => {
            let jobs = n.config().map_or(&[][..], |c| &c.jobs[..]);
            match jobs {
                [only] => (only.name.clone(), name),
                _ => {
                    return Err(CallError::from(Status::invalid_argument(format!(
                        "task {name:?}: name it JOB/ID (namespace {} has {} jobs)",
                        n.name(),
                        jobs.len()
                    ))))
                }
            }
        }
    };
    let index = id.parse::<i32>().ok().and_then(|id| n.task_index(&job, id));
    index
        .ok_or_else(|| Status::not_found(format!("namespace {} has no task {name}", n.name())))
        .map_err(CallError::from)
}

/// Task `index` of `n` as the diagnostics show it (`age`: the leader's
/// heartbeat age, if known).
fn health(n: &Namespace<'_>, index: u32, age: Option<u64>, now_ms: u64) -> TaskHealth {
    let entry = n.coordination().task(index).cloned().unwrap_or_default();
    let (job, task_id) = n.task_id(index).unwrap_or(("", index as i32));
    let state = entry.status();
    let connected = state == TaskStatus::Connected;
    let disconnected_age_ms = (state == TaskStatus::Disconnected && entry.disconnected_at_ms > 0)
        .then(|| now_ms.saturating_sub(entry.disconnected_at_ms));
    TaskHealth {
        index,
        job: job.to_string(),
        task_id,
        state: state.as_str_name().into(),
        incarnation: entry.incarnation,
        error: entry
            .error
            .as_ref()
            .map(|e| e.display())
            .unwrap_or_default(),
        heartbeat_age_ms: age.filter(|_| connected),
        disconnected_age_ms,
    }
}

/// `indices` of `n` as the diagnostics show them, with the heartbeat ages
/// `liveness` holds (none without it).
fn healths(n: &Namespace<'_>, indices: &[u32], liveness: Option<&Liveness>) -> Vec<TaskHealth> {
    let ages = match liveness {
        Some(l) => l.heartbeat_ages(n.key(), indices, Instant::now()),
        None => vec![None; indices.len()],
    };
    let now = now_ms();
    indices
        .iter()
        .zip(ages)
        .map(|(&i, age)| health(n, i, age, now))
        .collect()
}

/// The tasks of `n` that `r` asks for, from this node's state and
/// `liveness` (the leader's).
pub fn tasks_here(
    n: &Namespace<'_>,
    liveness: Option<&Liveness>,
    r: &TasksRequest,
) -> CallResult<Vec<TaskHealth>> {
    let state = parse_state(&r.state)?;
    let indices: Vec<u32> = match r.task.as_str() {
        "" => (0..n.task_count()).collect(),
        name => vec![parse_task(n, name)?],
    };
    let c = n.coordination();
    let wanted: Vec<u32> = indices
        .into_iter()
        .filter(|&i| state.is_none_or(|s| c.task_status(i) == Some(s)))
        .collect();
    Ok(healths(n, &wanted, liveness))
}

/// Barrier `id`'s newest instance `b` of `n` with what it waits for: the
/// first `limit` missing tasks, and how long it has waited as `liveness`
/// (the leader's) knows it.
fn pending(
    n: &Namespace<'_>,
    id: &str,
    b: &BarrierEntry,
    liveness: Option<&Liveness>,
    limit: usize,
) -> PendingBarrier {
    let status = b.status();
    let waiting = status == BarrierStatus::Pending;
    let missing: Vec<u32> = match waiting {
        true => b
            .participants
            .iter()
            .copied()
            .filter(|t| !b.arrivals.contains_key(t))
            .collect(),
        false => Vec::new(),
    };
    let shown = &missing[..missing.len().min(limit)];
    let waited = liveness
        .filter(|_| waiting)
        .and_then(|l| l.barrier_waited(n.key(), id, b.counter, Instant::now()));
    PendingBarrier {
        id: id.to_string(),
        counter: b.counter,
        arrived: b.arrivals.len() as u64,
        participants: b.participants.len() as u64,
        waited_ms: waited.map(|w| w.ms),
        waited_at_least: waited.is_some_and(|w| w.at_least),
        deadline_ms: b.deadline_ms,
        missing: healths(n, shown, liveness),
        missing_count: missing.len() as u64,
        status: format!("{status:?}").to_uppercase(),
        error: b.error.as_ref().map(|e| e.display()).unwrap_or_default(),
    }
}

/// The barriers of `n` that `r` asks for (one by id, or every pending one,
/// the longest waiting first), from this node's state and `liveness`.
pub fn barriers_here(
    n: &Namespace<'_>,
    liveness: Option<&Liveness>,
    r: &BarriersRequest,
) -> CallResult<Vec<PendingBarrier>> {
    let limit = match r.missing_limit {
        0 => MISSING_LIMIT,
        l => l as usize,
    };
    let c = n.coordination();
    if !r.id.is_empty() {
        let b = c.barrier(&r.id).ok_or_else(|| {
            Status::not_found(format!("namespace {} has no barrier {}", n.name(), r.id))
        })?;
        return Ok(vec![pending(n, &r.id, b, liveness, limit)]);
    }
    let mut all: Vec<PendingBarrier> = c
        .barriers()
        .filter(|(_, b)| b.status() == BarrierStatus::Pending)
        .map(|(id, b)| pending(n, id, b, liveness, limit))
        .collect();
    all.sort_by(|a, b| b.waited_ms.cmp(&a.waited_ms).then_with(|| a.id.cmp(&b.id)));
    Ok(all)
}

/// The oldest pending barrier of every namespace that admits `c`, as
/// `liveness` (the leader's) knows them.
fn barrier_waits_here(core: &Core, c: &Call, liveness: Option<&Liveness>) -> Vec<NamespaceWait> {
    let Some(l) = liveness else {
        return Vec::new();
    };
    let oldest = l.oldest_barriers(Instant::now());
    let mut waits: Vec<NamespaceWait> = core.state(|s| {
        s.namespaces()
            .filter(|n| core.admits(c, n))
            .filter_map(|n| {
                let (barrier, w) = oldest.get(n.key())?;
                Some(NamespaceWait {
                    namespace: n.name().to_string(),
                    barrier: barrier.clone(),
                    waited_ms: w.ms,
                    waited_at_least: w.at_least,
                })
            })
            .collect()
    });
    waits.sort_by(|a, b| a.namespace.cmp(&b.namespace));
    waits
}

/// This node's [`Liveness`] (the leader's bookkeeping; empty elsewhere).
fn liveness(core: &Core) -> Option<Arc<Liveness>> {
    liveness_of(core.node())
}

/// [`tasks_here`] on the leader, after a read barrier there.
pub async fn tasks(core: &Core, c: &Call, r: TasksRequest) -> CallResult<Vec<TaskHealth>> {
    let router = core.router();
    let local = |c: Call, r: TasksRequest| async move {
        let l = liveness(core);
        let tasks = core.read(&c, |n| tasks_here(&n, l.as_deref(), &r))??;
        Ok(TasksResponse { tasks })
    };
    let remote = |ch, r| async move { router.node_client(ch).tasks(r).await };
    let answer = router.forward_call(c, r, Forwarding::READ, local, remote);
    Ok(answer.await?.tasks)
}

/// [`barriers_here`] on the leader, after a read barrier there.
pub async fn barriers(
    core: &Core,
    c: &Call,
    r: BarriersRequest,
) -> CallResult<Vec<PendingBarrier>> {
    let router = core.router();
    let local = |c: Call, r: BarriersRequest| async move {
        let l = liveness(core);
        let barriers = core.read(&c, |n| barriers_here(&n, l.as_deref(), &r))??;
        Ok(BarriersResponse { barriers })
    };
    let remote = |ch, r| async move { router.node_client(ch).barriers(r).await };
    let answer = router.forward_call(c, r, Forwarding::READ, local, remote);
    Ok(answer.await?.barriers)
}

/// The oldest pending barrier of every namespace that admits `c`, on the
/// leader.
pub async fn barrier_waits(core: &Core, c: &Call) -> CallResult<Vec<NamespaceWait>> {
    let router = core.router();
    let local = |c: Call, _| async move {
        let namespaces = barrier_waits_here(core, &c, liveness(core).as_deref());
        Ok(BarrierWaitsResponse { namespaces })
    };
    let remote = |ch, r| async move { router.node_client(ch).barrier_waits(r).await };
    let how = Forwarding {
        read: false,
        ..Forwarding::READ
    };
    let answer = router.forward_call(c, BarrierWaitsRequest {}, how, local, remote);
    Ok(answer.await?.namespaces)
}

/// The pending barriers of `c`'s namespace for a view that must answer:
/// the leader's within [`ASK_LEADER`] (`true`), else this node's state
/// without the leader's clocks (`false`: no wait ages, no heartbeat ages).
pub async fn barriers_or_here(core: &Core, c: &Call) -> CallResult<(Vec<PendingBarrier>, bool)> {
    let r = BarriersRequest::default();
    match tokio::time::timeout(ASK_LEADER, barriers(core, c, r.clone())).await {
        Ok(Ok(b)) => Ok((b, true)),
        _ => Ok((core.read(c, |n| barriers_here(&n, None, &r))??, false)),
    }
}

/// The oldest pending barrier's wait of every namespace (by name) for a
/// view that must answer: the leader's within [`ASK_LEADER`], else none.
pub async fn waits_or_none(core: &Core, c: &Call) -> HashMap<String, NamespaceWait> {
    match tokio::time::timeout(ASK_LEADER, barrier_waits(core, c)).await {
        Ok(Ok(w)) => w.into_iter().map(|w| (w.namespace.clone(), w)).collect(),
        _ => HashMap::new(),
    }
}
