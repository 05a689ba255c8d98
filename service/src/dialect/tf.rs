//! `tensorflow.CoordinationService` as seed 003 and TensorFlow 2.21 speak it
//! (reference coordination-service.md §8): named jobs addressed as
//! `CoordinatedTask{job_name, task_id}`, WaitForAllTasks with device-info
//! aggregation, ResetTask, GetTaskState, PollForError. No
//! service-incarnation check on requests (the dialect carries none). Both
//! message generations are read and answered: the seed's fields and 2.21's
//! share numbers except device info (seed 4/3, 2.21 6/4), and a seed client
//! sends no barrier counter (0: a finished id replays its result, as the seed
//! documents) while a 2.21 client counts instances per id as jaxlib does.

use std::collections::HashMap;

use bytes::{Bytes, BytesMut};
use journal::coordination::errors::{unknown_task, UnknownTaskIn as U};
use journal::{task_name, DomainError};
use prost::Message;
use proto::payload_keys;
use proto::tf::coordination_service_device_info::Type as DeviceType;
use proto::tf::coordination_service_server::{CoordinationService, CoordinationServiceServer};
use proto::tf::*;
use tonic::codec::CompressionEncoding;
use tonic::{Request, Response, Status};

use super::{read, status_with_payloads, unary, WireErrors};
use crate::coordination::{CallResult, Coordination};

type Reply<T> = Result<Response<T>, Status>;

/// The tensorflow dialect service.
pub struct TfService {
    coord: Coordination,
}

impl TfService {
    /// The tonic service: gzip accepted, message limits from the node config.
    pub fn server(
        coord: Coordination,
        max_message_bytes: usize,
    ) -> CoordinationServiceServer<TfService> {
        CoordinationServiceServer::new(TfService { coord })
            .accept_compressed(CompressionEncoding::Gzip)
            .max_decoding_message_size(max_message_bytes)
            .max_encoding_message_size(max_message_bytes)
    }
}

impl WireErrors for TfService {
    fn domain_status(coord: &Coordination, e: &DomainError) -> Status {
        domain_status(coord, e)
    }
}

/// Resolves a wire task; `call` picks the unknown-task message.
fn task(c: &Coordination, t: &Option<CoordinatedTask>, call: U) -> CallResult<u32> {
    let t = t.clone().unwrap_or_default();
    c.task_index(&t.job_name, t.task_id)
        .ok_or_else(|| unknown_task(call, &task_name(&t.job_name, t.task_id)).into())
}

/// The wire name of the task at `index`.
fn wire_task(c: &Coordination, index: u32) -> Option<CoordinatedTask> {
    c.task_of(index).map(|(job_name, task_id)| CoordinatedTask {
        job_name,
        task_id,
        recoverable: false,
    })
}

/// Whether the calling task declares itself recoverable (TF 2.21).
fn recoverable(t: &Option<CoordinatedTask>) -> bool {
    t.as_ref().is_some_and(|t| t.recoverable)
}

/// The wire error of a domain error, payload in the tensorflow encoding
/// (CoordinationServiceError with the source task's job and id).
pub(crate) fn domain_status(coord: &Coordination, e: &DomainError) -> Status {
    let mut payloads = HashMap::new();
    if e.coordination_payload {
        let source_task = e.source_task.and_then(|i| wire_task(coord, i));
        let p = CoordinationServiceError {
            is_reported_error: e.is_reported_error,
            source_task,
        };
        payloads.insert(
            payload_keys::COORDINATION_SERVICE_ERROR.to_string(),
            p.encode_to_vec(),
        );
    }
    if let Some(b) = &e.barrier {
        let p = BarrierError {
            barrier_id: b.id.clone(),
            counter: b.counter,
        };
        payloads.insert(payload_keys::BARRIER_ERROR.to_string(), p.encode_to_vec());
    }
    status_with_payloads(e.code, &e.message, payloads)
}

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

type T = TfService;

#[tonic::async_trait]
impl CoordinationService for TfService {
    async fn register_task(
        &self,
        req: Request<RegisterTaskRequest>,
    ) -> Reply<RegisterTaskResponse> {
        unary::<T, _, _, _>(&self.coord, req, |c, r| async move {
            let t = task(&c, &r.source_task, U::Register)?;
            let leader_incarnation = c
                .register(t, r.incarnation, recoverable(&r.source_task))
                .await?;
            Ok(RegisterTaskResponse { leader_incarnation })
        })
        .await
    }

    async fn heartbeat(&self, req: Request<HeartbeatRequest>) -> Reply<HeartbeatResponse> {
        unary::<T, _, _, _>(&self.coord, req, |c, r| async move {
            let t = task(&c, &r.source_task, U::Heartbeat)?;
            let leader_incarnation = c.heartbeat(t, r.incarnation).await?;
            Ok(HeartbeatResponse { leader_incarnation })
        })
        .await
    }

    async fn wait_for_all_tasks(
        &self,
        req: Request<WaitForAllTasksRequest>,
    ) -> Reply<WaitForAllTasksResponse> {
        unary::<T, _, _, _>(&self.coord, req, |c, r| async move {
            let t = task(&c, &r.source_task, U::WaitForAllTasks)?;
            tracing::debug!(
                task = t,
                seed_devices = r.local_device_info.is_some(),
                devices = r.device_info.as_ref().map_or(0, |d| d.device.len()),
                "WaitForAllTasks"
            );
            let infos = c.wait_for_all_tasks(t, stored_devices(&r)).await?;
            let stored = infos.len();
            let (seed, all) = cluster_devices(infos);
            tracing::debug!(
                task = t,
                stored,
                devices = all.device.len(),
                "WaitForAllTasks answered"
            );
            Ok(WaitForAllTasksResponse {
                leader_incarnation: c.service_incarnation(),
                cluster_device_info: Some(seed),
                device_info: Some(all),
            })
        })
        .await
    }

    async fn shutdown_task(
        &self,
        req: Request<ShutdownTaskRequest>,
    ) -> Reply<ShutdownTaskResponse> {
        unary::<T, _, _, _>(&self.coord, req, |c, r| async move {
            let t = task(&c, &r.source_task, U::Disconnect)?;
            c.shutdown(t, recoverable(&r.source_task)).await?;
            Ok(ShutdownTaskResponse {})
        })
        .await
    }

    async fn reset_task(&self, req: Request<ResetTaskRequest>) -> Reply<ResetTaskResponse> {
        unary::<T, _, _, _>(&self.coord, req, |c, r| async move {
            let t = task(&c, &r.source_task, U::Disconnect)?;
            c.reset(t).await?;
            Ok(ResetTaskResponse {})
        })
        .await
    }

    async fn report_error_to_task(
        &self,
        _: Request<ReportErrorToTaskRequest>,
    ) -> Reply<ReportErrorToTaskResponse> {
        Err(Status::unimplemented(
            "ReportErrorToTask is served by coordination agents, not by the service",
        ))
    }

    async fn report_error_to_service(
        &self,
        req: Request<ReportErrorToServiceRequest>,
    ) -> Reply<ReportErrorToServiceResponse> {
        unary::<T, _, _, _>(&self.coord, req, |c, r| async move {
            let t = task(&c, &r.error_origin, U::ReportError)?;
            c.report_error(t, r.error_code, r.error_message).await?;
            Ok(ReportErrorToServiceResponse {})
        })
        .await
    }

    async fn insert_key_value(
        &self,
        req: Request<InsertKeyValueRequest>,
    ) -> Reply<InsertKeyValueResponse> {
        unary::<T, _, _, _>(&self.coord, req, |c, r| async move {
            let kv = r.kv.unwrap_or_default();
            c.kv_insert(kv.key, kv.value, r.allow_overwrite).await?;
            Ok(InsertKeyValueResponse {})
        })
        .await
    }

    async fn get_key_value(&self, req: Request<GetKeyValueRequest>) -> Reply<GetKeyValueResponse> {
        read::<T, _, _, _>(&self.coord, req, |c, r| async move {
            let value = c.kv_get_blocking(&r.key).await?;
            Ok(GetKeyValueResponse {
                kv: Some(KeyValueEntry { key: r.key, value }),
            })
        })
        .await
    }

    async fn try_get_key_value(
        &self,
        req: Request<TryGetKeyValueRequest>,
    ) -> Reply<TryGetKeyValueResponse> {
        read::<T, _, _, _>(&self.coord, req, |c, r| async move {
            let value = c.kv_try_get(&r.key).await?;
            Ok(TryGetKeyValueResponse {
                kv: Some(KeyValueEntry { key: r.key, value }),
            })
        })
        .await
    }

    async fn get_key_value_dir(
        &self,
        req: Request<GetKeyValueDirRequest>,
    ) -> Reply<GetKeyValueDirResponse> {
        read::<T, _, _, _>(&self.coord, req, |c, r| async move {
            let entries = c.kv_dir(&r.directory_key).await?;
            Ok(GetKeyValueDirResponse {
                directory_key: r.directory_key,
                kv: entries
                    .into_iter()
                    .map(|(key, value)| KeyValueEntry { key, value })
                    .collect(),
            })
        })
        .await
    }

    async fn delete_key_value(
        &self,
        req: Request<DeleteKeyValueRequest>,
    ) -> Reply<DeleteKeyValueResponse> {
        unary::<T, _, _, _>(&self.coord, req, |c, r| async move {
            c.kv_delete(r.key).await?;
            Ok(DeleteKeyValueResponse {})
        })
        .await
    }

    async fn barrier(&self, req: Request<BarrierRequest>) -> Reply<BarrierResponse> {
        unary::<T, _, _, _>(&self.coord, req, |c, r| async move {
            let t = task(&c, &r.source_task, U::Barrier)?;
            let mut participants = Vec::with_capacity(r.tasks.len());
            let mut unknown = String::new();
            for p in &r.tasks {
                match c.task_index(&p.job_name, p.task_id) {
                    Some(i) => participants.push(i),
                    None if unknown.is_empty() => unknown = task_name(&p.job_name, p.task_id),
                    None => {}
                }
            }
            let timeout_ms = r.barrier_timeout_in_ms.max(0) as u64;
            let caller_recoverable = recoverable(&r.source_task);
            let counter = c
                .barrier(
                    r.barrier_id,
                    r.counter,
                    timeout_ms,
                    participants,
                    unknown,
                    t,
                    caller_recoverable,
                )
                .await?;
            Ok(BarrierResponse { counter })
        })
        .await
    }

    async fn cancel_barrier(
        &self,
        req: Request<CancelBarrierRequest>,
    ) -> Reply<CancelBarrierResponse> {
        unary::<T, _, _, _>(&self.coord, req, |c, r| async move {
            let t = task(&c, &r.source_task, U::Barrier)?;
            c.cancel_barrier(r.barrier_id, r.counter, t).await?;
            Ok(CancelBarrierResponse {})
        })
        .await
    }

    async fn get_task_state(
        &self,
        req: Request<GetTaskStateRequest>,
    ) -> Reply<GetTaskStateResponse> {
        read::<T, _, _, _>(&self.coord, req, |c, r| async move {
            let tasks = r.source_task;
            let mut indices = Vec::with_capacity(tasks.len());
            for t in &tasks {
                indices.push(task(&c, &Some(t.clone()), U::GetTaskState)?);
            }
            let entries = c.task_entries(&indices).await?;
            let task_state = tasks
                .into_iter()
                .zip(entries)
                .map(|(t, entry)| task_state_info(&c, t, &entry))
                .collect();
            Ok(GetTaskStateResponse { task_state })
        })
        .await
    }

    async fn poll_for_error(
        &self,
        req: Request<PollForErrorRequest>,
    ) -> Reply<PollForErrorResponse> {
        unary::<T, _, _, _>(&self.coord, req, |c, r| async move {
            let t = task(&c, &r.source_task, U::PollForError)?;
            Err(c.poll_for_error(t).await)
        })
        .await
    }
}

/// One task's state as GetTaskState reports it: the error's code, message
/// and payload for a task in ERROR, none for the others.
fn task_state_info(
    coord: &Coordination,
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
            source_task: e.source_task.and_then(|i| wire_task(coord, i)),
        });
    }
    info
}
