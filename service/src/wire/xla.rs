//! `xla.coordination.CoordinationService`, what stock jaxlib 0.12 dials.
//! Task ids are the dense ids of job `jax_worker`. Every call but
//! RegisterTask must carry the service incarnation (`docs/protocols.md`,
//! Service incarnation), checked once for the whole dialect ([`admit`]).

use bytes::Bytes;
use journal::coordination::errors::UnknownTaskIn as U;
use journal::coordination::TaskStatus;
use journal::pb::coordination as cmd;
use journal::{DomainError, JAX_JOB};
use prost::Message;
use proto::payload_keys;
use proto::xla::coordination_service_server::{CoordinationService, CoordinationServiceServer};
use proto::xla::*;
use tonic::Status;

use super::{arrival, dialect, participants, payloads, status_with_payloads, Area};
use crate::areas::coordination::{report_error, TaskView};
use crate::core::{Call, CallResult};

dialect! {
    /// The xla dialect service.
    XlaService: CoordinationService in CoordinationServiceServer, errors = errors, admit = admit;
    kv;
    register_task(RegisterTaskRequest) -> RegisterTaskResponse;
    heartbeat(HeartbeatRequest) -> HeartbeatResponse;
    shutdown_task(ShutdownTaskRequest) -> ShutdownTaskResponse;
    watch_tasks(WatchTasksRequest) -> WatchTasksResponse;
    increment_key_value(IncrementKeyValueRequest) -> IncrementKeyValueResponse;
    barrier(BarrierRequest) -> BarrierResponse;
    cancel_barrier(CancelBarrierRequest) -> CancelBarrierResponse;
    get_alive_tasks(GetAliveTasksRequest) -> GetAliveTasksResponse;
    poll_for_error(PollForErrorRequest) -> PollForErrorResponse;
    report_error_to_service(ReportErrorToServiceRequest) -> ReportErrorToServiceResponse;
}

type Answer<T> = CallResult<T>;

async fn register_task(a: &Area, c: &Call, r: RegisterTaskRequest) -> Answer<RegisterTaskResponse> {
    let task = task(a, c, r.source_task_id, U::Register)?;
    let register = cmd::RegisterTask {
        task,
        incarnation: r.incarnation,
        recoverable: false,
    };
    let service_incarnation = a.register(c, register).await?;
    Ok(RegisterTaskResponse {
        service_incarnation,
    })
}

async fn heartbeat(a: &Area, c: &Call, r: HeartbeatRequest) -> Answer<HeartbeatResponse> {
    let t = task(a, c, r.source_task_id, U::Heartbeat)?;
    let service_incarnation = a.heartbeat(c, t, r.incarnation).await?;
    Ok(HeartbeatResponse {
        service_incarnation,
    })
}

async fn shutdown_task(a: &Area, c: &Call, r: ShutdownTaskRequest) -> Answer<ShutdownTaskResponse> {
    let task = task(a, c, r.source_task_id, U::Disconnect)?;
    let recoverable = false;
    a.shutdown(c, cmd::ShutdownTask { task, recoverable })
        .await?;
    Ok(ShutdownTaskResponse {})
}

async fn watch_tasks(a: &Area, c: &Call, r: WatchTasksRequest) -> Answer<WatchTasksResponse> {
    let (views, version_number) = a.watch_tasks(c, r.version_number).await?;
    let task_state = views
        .into_iter()
        .filter_map(|v| task_info(a, c, v))
        .collect();
    Ok(WatchTasksResponse {
        task_state,
        version_number,
    })
}

async fn increment_key_value(
    a: &Area,
    c: &Call,
    r: IncrementKeyValueRequest,
) -> Answer<IncrementKeyValueResponse> {
    let n = a
        .kv_increment(
            c,
            cmd::KvIncrement {
                key: r.key.clone(),
                increment: r.increment,
            },
        )
        .await?;
    Ok(IncrementKeyValueResponse {
        kv: Some(KeyValueEntry {
            key: r.key,
            value: Bytes::from(n.to_string()),
        }),
    })
}

async fn barrier(a: &Area, c: &Call, r: BarrierRequest) -> Answer<BarrierResponse> {
    let task = task(a, c, r.source_task_id, U::Barrier)?;
    let named = participants(
        &r.task_ids,
        |&id| self::task(a, c, id, U::Barrier),
        i32::to_string,
    );
    let call = (r.barrier_id, r.counter, r.barrier_timeout_in_ms);
    let counter = a.barrier(c, arrival(task, false, call, named)).await?;
    Ok(BarrierResponse { counter })
}

async fn cancel_barrier(
    a: &Area,
    c: &Call,
    r: CancelBarrierRequest,
) -> Answer<CancelBarrierResponse> {
    let task = task(a, c, r.source_task_id, U::Barrier)?;
    let (id, counter) = (r.barrier_id, r.counter);
    a.apply(c, cmd::BarrierCancel { id, counter, task }).await?;
    Ok(CancelBarrierResponse {})
}

async fn get_alive_tasks(
    a: &Area,
    c: &Call,
    r: GetAliveTasksRequest,
) -> Answer<GetAliveTasksResponse> {
    let task = task(a, c, r.requesting_task_id, U::AliveTasks)?;
    let tasks = r
        .task_ids
        .iter()
        .map(|&id| self::task(a, c, id, U::AliveTasks))
        .collect::<Answer<_>>()?;
    let alive = a.alive_tasks(c, cmd::AliveTasks { task, tasks }).await?;
    let alive_task_ids = alive
        .tasks
        .iter()
        .map(|&i| a.task_of(c, i).map_or(i as i32, |(_, id)| id))
        .collect();
    Ok(GetAliveTasksResponse {
        alive_task_ids,
        incarnations: alive.incarnations,
    })
}

async fn poll_for_error(
    a: &Area,
    c: &Call,
    r: PollForErrorRequest,
) -> Answer<PollForErrorResponse> {
    let task = task(a, c, r.source_task_id, U::PollForError)?;
    Err(a.poll_for_error(c, task).await)
}

async fn report_error_to_service(
    a: &Area,
    c: &Call,
    r: ReportErrorToServiceRequest,
) -> Answer<ReportErrorToServiceResponse> {
    let task = task(a, c, r.source_task_id, U::ReportError)?;
    a.apply(c, report_error(task, r.error_code, r.error_message))
        .await?;
    Ok(ReportErrorToServiceResponse {})
}

// ------------------------------------------------------------- rules ----

/// The dialect's precondition: the caller's service incarnation matches
/// (every call but RegisterTask).
async fn admit<R: Incarnated>(a: &Area, c: &Call, r: &R) -> CallResult<()> {
    match r.service_incarnation() {
        Some(requested) => a.check_service_incarnation(c, requested).await,
        None => Ok(()),
    }
}

/// A request and the service incarnation it must carry (`None`: not
/// checked, RegisterTask).
trait Incarnated {
    fn service_incarnation(&self) -> Option<u64>;
}

impl Incarnated for RegisterTaskRequest {
    fn service_incarnation(&self) -> Option<u64> {
        None
    }
}

macro_rules! incarnated {
    ($($req:ty),*) => {$(
        impl Incarnated for $req {
            fn service_incarnation(&self) -> Option<u64> {
                Some(self.incarnations.as_ref().map_or(0, |i| i.service_incarnation))
            }
        }
    )*};
}

incarnated!(
    HeartbeatRequest,
    ShutdownTaskRequest,
    WatchTasksRequest,
    InsertKeyValueRequest,
    GetKeyValueRequest,
    TryGetKeyValueRequest,
    IncrementKeyValueRequest,
    GetKeyValueDirRequest,
    DeleteKeyValueRequest,
    BarrierRequest,
    CancelBarrierRequest,
    GetAliveTasksRequest,
    PollForErrorRequest,
    ReportErrorToServiceRequest
);

/// The wire error of a domain error, payloads in xla encoding.
fn errors(a: &Area, c: &Call, e: &DomainError) -> Status {
    let source_task_id = source_task_id(a, c, e.source_task);
    let is_reported_error = e.is_reported_error;
    let coordination = || CoordinationServiceError {
        is_reported_error,
        source_task_id,
    };
    let barrier = |barrier_id, counter| {
        BarrierError {
            barrier_id,
            counter,
        }
        .encode_to_vec()
    };
    let mut payloads = payloads(e, || coordination().encode_to_vec(), barrier);
    if let Some(service_incarnation) = e.service_mismatch {
        let p = ServiceMismatchError {
            service_incarnation,
        };
        payloads.insert(
            payload_keys::SERVICE_MISMATCH_ERROR.to_string(),
            p.encode_to_vec(),
        );
    }
    status_with_payloads(e.code, &e.message, payloads)
}

// ------------------------------------------------------------- names ----

/// Resolves a jaxlib task id; `call` picks the unknown-task message.
fn task(a: &Area, c: &Call, id: i32, call: U) -> CallResult<u32> {
    a.task_id(c, JAX_JOB, id, call)
}

/// The jaxlib id of a source task (0 if none).
fn source_task_id(a: &Area, c: &Call, index: Option<u32>) -> i32 {
    index.and_then(|i| a.task_of(c, i)).map_or(0, |(_, id)| id)
}

/// One jaxlib task as WatchTasks reports it (tasks of other jobs are left
/// out).
fn task_info(a: &Area, c: &Call, v: TaskView) -> Option<TaskInfo> {
    let (job, task_id) = a.task_of(c, v.index)?;
    if job != JAX_JOB {
        return None;
    }
    let error = v.entry.error.clone().unwrap_or_default();
    let error_payload = v.entry.error.as_ref().map(|e| CoordinationServiceError {
        is_reported_error: e.is_reported_error,
        source_task_id: source_task_id(a, c, e.source_task),
    });
    let state = match v.entry.status() {
        TaskStatus::Disconnected => TaskState::Disconnected,
        TaskStatus::Connected => TaskState::Connected,
        TaskStatus::Error => TaskState::Error,
    } as i32;
    Some(TaskInfo {
        task_id,
        incarnation: v.entry.incarnation,
        state,
        error_code: error.code,
        error_message: error.message,
        error_payload,
    })
}
