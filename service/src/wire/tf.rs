//! `tensorflow.CoordinationService` as TensorFlow 2.21 and the older seed
//! protocol speak it (`docs/protocols.md`, tensorflow.CoordinationService
//! (TF 2.21 and the seed protocol)): named jobs addressed as
//! `CoordinatedTask{job_name, task_id}`, WaitForAllTasks with device-info
//! aggregation, ResetTask, GetTaskState, PollForError. No
//! service-incarnation check on requests (the dialect carries none). Both
//! message generations are read and answered: the seed's fields and 2.21's
//! share numbers except device info (seed 4/3, 2.21 6/4), and a seed client
//! sends no barrier counter (0: a finished id replays its result, as the seed
//! protocol documents; `docs/protocols.md`, Barriers) while a 2.21 client
//! counts instances per id as jaxlib does.

use bytes::{Bytes, BytesMut};
use journal::coordination::errors::UnknownTaskIn as U;
use journal::pb::coordination as cmd;
use journal::{task_name, DomainError};
use prost::Message;
use proto::tf::coordination_service_device_info::Type as DeviceType;
use proto::tf::coordination_service_server::{CoordinationService, CoordinationServiceServer};
use proto::tf::*;
use tonic::Status;

use super::{arrival, dialect, participants, payloads, status_with_payloads, Area};
use crate::areas::coordination::report_error;
use crate::core::{Call, CallResult};

dialect! {
    /// The tensorflow dialect service.
    TfService: CoordinationService in CoordinationServiceServer, errors = errors;
    kv;
    register_task(RegisterTaskRequest) -> RegisterTaskResponse;
    heartbeat(HeartbeatRequest) -> HeartbeatResponse;
    wait_for_all_tasks(WaitForAllTasksRequest) -> WaitForAllTasksResponse;
    shutdown_task(ShutdownTaskRequest) -> ShutdownTaskResponse;
    reset_task(ResetTaskRequest) -> ResetTaskResponse;
    report_error_to_task(ReportErrorToTaskRequest) -> ReportErrorToTaskResponse;
    report_error_to_service(ReportErrorToServiceRequest) -> ReportErrorToServiceResponse;
    get_task_state(GetTaskStateRequest) -> GetTaskStateResponse;
    barrier(BarrierRequest) -> BarrierResponse;
    cancel_barrier(CancelBarrierRequest) -> CancelBarrierResponse;
    poll_for_error(PollForErrorRequest) -> PollForErrorResponse;
}

type Answer<T> = CallResult<T>;

async fn register_task(a: &Area, c: &Call, r: RegisterTaskRequest) -> Answer<RegisterTaskResponse> {
    let (task, recoverable) = (
        task(a, c, &r.source_task, U::Register)?,
        recoverable(&r.source_task),
    );
    let register = cmd::RegisterTask {
        task,
        incarnation: r.incarnation,
        recoverable,
    };
    let leader_incarnation = a.register(c, register).await?;
    Ok(RegisterTaskResponse { leader_incarnation })
}

async fn heartbeat(a: &Area, c: &Call, r: HeartbeatRequest) -> Answer<HeartbeatResponse> {
    let task = task(a, c, &r.source_task, U::Heartbeat)?;
    let leader_incarnation = a.heartbeat(c, task, r.incarnation).await?;
    Ok(HeartbeatResponse { leader_incarnation })
}

async fn wait_for_all_tasks(
    a: &Area,
    c: &Call,
    r: WaitForAllTasksRequest,
) -> Answer<WaitForAllTasksResponse> {
    let task = task(a, c, &r.source_task, U::WaitForAllTasks)?;
    let infos = a
        .wait_for_all_tasks(
            c,
            cmd::WaitForAllTasks {
                task,
                device_info: stored_devices(&r),
            },
        )
        .await?;
    let (seed, all) = cluster_devices(infos);
    let leader_incarnation = a.service_incarnation(c);
    Ok(WaitForAllTasksResponse {
        leader_incarnation,
        cluster_device_info: Some(seed),
        device_info: Some(all),
    })
}

async fn shutdown_task(a: &Area, c: &Call, r: ShutdownTaskRequest) -> Answer<ShutdownTaskResponse> {
    let (task, recoverable) = (
        task(a, c, &r.source_task, U::Disconnect)?,
        recoverable(&r.source_task),
    );
    a.shutdown(c, cmd::ShutdownTask { task, recoverable })
        .await?;
    Ok(ShutdownTaskResponse {})
}

async fn reset_task(a: &Area, c: &Call, r: ResetTaskRequest) -> Answer<ResetTaskResponse> {
    let task = task(a, c, &r.source_task, U::Disconnect)?;
    a.apply(c, cmd::ResetTask { task }).await?;
    Ok(ResetTaskResponse {})
}

async fn report_error_to_task(
    _: &Area,
    _: &Call,
    _: ReportErrorToTaskRequest,
) -> Answer<ReportErrorToTaskResponse> {
    let why = "ReportErrorToTask is served by coordination agents, not by the service";
    Err(Status::unimplemented(why).into())
}

async fn report_error_to_service(
    a: &Area,
    c: &Call,
    r: ReportErrorToServiceRequest,
) -> Answer<ReportErrorToServiceResponse> {
    let task = task(a, c, &r.error_origin, U::ReportError)?;
    a.apply(c, report_error(task, r.error_code, r.error_message))
        .await?;
    Ok(ReportErrorToServiceResponse {})
}

async fn get_task_state(
    a: &Area,
    c: &Call,
    r: GetTaskStateRequest,
) -> Answer<GetTaskStateResponse> {
    let tasks = r
        .source_task
        .iter()
        .map(|t| task(a, c, &Some(t.clone()), U::GetTaskState))
        .collect::<Answer<Vec<_>>>()?;
    let entries = a.task_entries(c, &tasks).await?;
    let task_state = r
        .source_task
        .into_iter()
        .zip(entries)
        .map(|(t, e)| task_state_info(a, c, t, &e))
        .collect();
    Ok(GetTaskStateResponse { task_state })
}

async fn barrier(a: &Area, c: &Call, r: BarrierRequest) -> Answer<BarrierResponse> {
    let (task, recoverable) = (
        task(a, c, &r.source_task, U::Barrier)?,
        recoverable(&r.source_task),
    );
    let named = participants(
        &r.tasks,
        |t| self::task(a, c, &Some(t.clone()), U::Barrier),
        name,
    );
    let call = (r.barrier_id, r.counter, r.barrier_timeout_in_ms);
    let counter = a
        .barrier(c, arrival(task, recoverable, call, named))
        .await?;
    Ok(BarrierResponse { counter })
}

async fn cancel_barrier(
    a: &Area,
    c: &Call,
    r: CancelBarrierRequest,
) -> Answer<CancelBarrierResponse> {
    let task = task(a, c, &r.source_task, U::Barrier)?;
    let (id, counter) = (r.barrier_id, r.counter);
    a.apply(c, cmd::BarrierCancel { id, counter, task }).await?;
    Ok(CancelBarrierResponse {})
}

async fn poll_for_error(
    a: &Area,
    c: &Call,
    r: PollForErrorRequest,
) -> Answer<PollForErrorResponse> {
    let task = task(a, c, &r.source_task, U::PollForError)?;
    Err(a.poll_for_error(c, task).await)
}

// ------------------------------------------------------------- rules ----

/// The wire error of a domain error, payload in the tensorflow encoding
/// (CoordinationServiceError with the source task's job and id).
pub(crate) fn errors(a: &Area, c: &Call, e: &DomainError) -> Status {
    let source_task = e.source_task.and_then(|i| wire_task(a, c, i));
    let is_reported_error = e.is_reported_error;
    let coordination = || CoordinationServiceError {
        is_reported_error,
        source_task,
    };
    let barrier = |barrier_id, counter| {
        BarrierError {
            barrier_id,
            counter,
        }
        .encode_to_vec()
    };
    let payloads = payloads(e, || coordination().encode_to_vec(), barrier);
    status_with_payloads(e.code, &e.message, payloads)
}

// ------------------------------------------------------------- names ----

/// Resolves a wire task; `call` picks the unknown-task message.
fn task(a: &Area, c: &Call, t: &Option<CoordinatedTask>, call: U) -> CallResult<u32> {
    let t = t.clone().unwrap_or_default();
    a.task(c, &t.job_name, t.task_id, call)
}

/// The wire name of the task at `index`.
fn wire_task(a: &Area, c: &Call, index: u32) -> Option<CoordinatedTask> {
    a.task_of(c, index)
        .map(|(job_name, task_id)| CoordinatedTask {
            job_name,
            task_id,
            recoverable: false,
        })
}

/// How messages name a wire task that names no task.
fn name(t: &CoordinatedTask) -> String {
    task_name(&t.job_name, t.task_id)
}

/// Whether the calling task declares itself recoverable (TF 2.21).
fn recoverable(t: &Option<CoordinatedTask>) -> bool {
    t.as_ref().is_some_and(|t| t.recoverable)
}

/// One task's state as GetTaskState reports it: the error's code, message
/// and payload for a task in ERROR, none for the others.
fn task_state_info(
    a: &Area,
    c: &Call,
    task: CoordinatedTask,
    entry: &journal::pb::coordination::TaskEntry,
) -> CoordinatedTaskStateInfo {
    use journal::coordination::TaskStatus as S;
    let state = match entry.status() {
        S::Disconnected => CoordinatedTaskState::TaskstateDisconnected,
        S::Connected => CoordinatedTaskState::TaskstateConnected,
        S::Error => CoordinatedTaskState::TaskstateError,
    };
    let mut info = CoordinatedTaskStateInfo {
        task: Some(task),
        state: state as i32,
        ..Default::default()
    };
    if let (S::Error, Some(e)) = (entry.status(), entry.error.as_ref()) {
        info.error_code = e.code;
        info.error_message = e.message.clone();
        info.error_payload = Some(CoordinationServiceError {
            is_reported_error: e.is_reported_error,
            source_task: e.source_task.and_then(|i| wire_task(a, c, i)),
        });
    }
    info
}

// ------------------------------------------------------- device info ----

/// What the journal keeps of a task's WaitForAllTasks: both generations'
/// device fields of its request (seed field 4, TF 2.21 field 6), encoded as
/// the request message itself without its source task; empty when the
/// request lists no device (the journal then keeps waiting for a call that
/// does, as upstream does).
fn stored_devices(r: &WaitForAllTasksRequest) -> Bytes {
    let seed_has = r
        .local_device_info
        .as_ref()
        .is_some_and(|d| d.r#type.is_some());
    let tf_has = r.device_info.as_ref().is_some_and(|d| !d.device.is_empty());
    if !seed_has && !tf_has {
        return Bytes::new();
    }
    WaitForAllTasksRequest {
        local_device_info: r.local_device_info.clone(),
        device_info: r.device_info.clone(),
        source_task: None,
    }
    .encode_to_vec()
    .into()
}

/// The cluster's devices in both generations from every task's stored
/// request (task order): the seed's aggregate, and TF 2.21's list, each
/// task's devices concatenated.
fn cluster_devices(stored: Vec<Bytes>) -> (CoordinationServiceDeviceInfo, DeviceInfo) {
    let requests: Vec<WaitForAllTasksRequest> = stored
        .iter()
        .filter_map(|raw| WaitForAllTasksRequest::decode(raw.as_ref()).ok())
        .collect();
    let all = DeviceInfo {
        device: requests
            .iter()
            .filter_map(|r| r.device_info.as_ref())
            .flat_map(|d| d.device.iter().cloned())
            .collect(),
    };
    let seed = aggregate_devices(requests.into_iter().filter_map(|r| r.local_device_info));
    (seed, all)
}

/// Aggregates per-task device info (the seed's CoordinationServiceDeviceInfo)
/// into the cluster's: TF device lists are concatenated; XLA topologies are
/// merged the protobuf way (concatenating serialized messages merges them,
/// which appends their repeated nodes).
fn aggregate_devices(
    infos: impl Iterator<Item = CoordinationServiceDeviceInfo>,
) -> CoordinationServiceDeviceInfo {
    let mut tf_devices = Vec::new();
    let mut xla = BytesMut::new();
    let mut any_tf = false;
    for info in infos {
        match info.r#type {
            Some(DeviceType::Tf(list)) => {
                any_tf = true;
                tf_devices.extend(list.devices);
            }
            Some(DeviceType::Xla(list)) => xla.extend_from_slice(&list.devices),
            None => {}
        }
    }
    let r#type = if any_tf || xla.is_empty() {
        Some(DeviceType::Tf(TfDeviceList {
            devices: tf_devices,
        }))
    } else {
        Some(DeviceType::Xla(XlaDeviceList {
            devices: xla.to_vec(),
        }))
    };
    CoordinationServiceDeviceInfo { r#type }
}
