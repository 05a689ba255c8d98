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
use journal::errors::UnknownTaskIn as U;
use journal::{task_name, DomainError};
use prost::Message;
use proto::payload_keys;
use proto::tf::coordination_service_device_info::Type as DeviceType;
use proto::tf::coordination_service_server::{CoordinationService, CoordinationServiceServer};
use proto::tf::*;
use tonic::codec::CompressionEncoding;
use tonic::{Request, Response, Status};

use super::{status_with_payloads, to_status};
use crate::coord::{CallError, Coordination};

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

    fn status(&self, e: CallError) -> Status {
        to_status(e, |d| domain_status(&self.coord, d))
    }

    fn task(&self, t: &Option<CoordinatedTask>, call: U) -> Result<u32, Status> {
        let t = t.clone().unwrap_or_default();
        task_index(&self.coord, &t.job_name, t.task_id, call)
    }
}

/// The wire error of a domain error, payload in the tensorflow encoding
/// (CoordinationServiceError with the source task's job and id).
pub(crate) fn domain_status(coord: &Coordination, e: &DomainError) -> Status {
    let mut payloads = HashMap::new();
    if e.coordination_payload {
        let source_task = e.source_task.and_then(|i| {
            coord.read(|s| {
                s.task_id(i).map(|(job, id)| CoordinatedTask {
                    job_name: job.to_string(),
                    task_id: id,
                    recoverable: false,
                })
            })
        });
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

/// The index of task `id` of job `job`, or the unknown-task error of `call`.
pub(crate) fn task_index(coord: &Coordination, job: &str, id: i32, call: U) -> Result<u32, Status> {
    coord.read(|s| s.task_index(job, id)).ok_or_else(|| {
        domain_status(
            coord,
            &journal::errors::unknown_task(call, &task_name(job, id)),
        )
    })
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

#[tonic::async_trait]
impl CoordinationService for TfService {
    async fn register_task(
        &self,
        req: Request<RegisterTaskRequest>,
    ) -> Reply<RegisterTaskResponse> {
        let coord = self.coord.for_request(&req)?;
        self.coord.ready().await?;
        let r = req.into_inner();
        let task = self.task(&r.source_task, U::Register)?;
        let recoverable = r.source_task.as_ref().is_some_and(|t| t.recoverable);
        let inc = coord
            .register(task, r.incarnation, recoverable)
            .await
            .map_err(|e| self.status(e))?;
        Ok(Response::new(RegisterTaskResponse {
            leader_incarnation: inc,
        }))
    }

    async fn heartbeat(&self, req: Request<HeartbeatRequest>) -> Reply<HeartbeatResponse> {
        let coord = self.coord.for_request(&req)?;
        self.coord.ready().await?;
        let r = req.into_inner();
        let task = self.task(&r.source_task, U::Heartbeat)?;
        let inc = coord
            .heartbeat(task, r.incarnation)
            .await
            .map_err(|e| self.status(e))?;
        Ok(Response::new(HeartbeatResponse {
            leader_incarnation: inc,
        }))
    }

    async fn wait_for_all_tasks(
        &self,
        req: Request<WaitForAllTasksRequest>,
    ) -> Reply<WaitForAllTasksResponse> {
        let coord = self.coord.for_request(&req)?;
        self.coord.ready().await?;
        let r = req.into_inner();
        let task = self.task(&r.source_task, U::WaitForAllTasks)?;
        tracing::debug!(
            task,
            seed_devices = r.local_device_info.is_some(),
            devices = r.device_info.as_ref().map_or(0, |d| d.device.len()),
            "WaitForAllTasks"
        );
        let infos = coord
            .wait_for_all_tasks(task, stored_devices(&r))
            .await
            .map_err(|e| self.status(e))?;
        let stored = infos.len();
        let (seed, all) = cluster_devices(infos);
        tracing::debug!(
            task,
            stored,
            devices = all.device.len(),
            "WaitForAllTasks answered"
        );
        Ok(Response::new(WaitForAllTasksResponse {
            leader_incarnation: self.coord.read(|s| s.service_incarnation()),
            cluster_device_info: Some(seed),
            device_info: Some(all),
        }))
    }

    async fn shutdown_task(
        &self,
        req: Request<ShutdownTaskRequest>,
    ) -> Reply<ShutdownTaskResponse> {
        let coord = self.coord.for_request(&req)?;
        self.coord.ready().await?;
        let source = req.into_inner().source_task;
        let task = self.task(&source, U::Disconnect)?;
        let recoverable = source.as_ref().is_some_and(|t| t.recoverable);
        coord
            .shutdown(task, recoverable)
            .await
            .map_err(|e| self.status(e))?;
        Ok(Response::new(ShutdownTaskResponse {}))
    }

    async fn reset_task(&self, req: Request<ResetTaskRequest>) -> Reply<ResetTaskResponse> {
        let coord = self.coord.for_request(&req)?;
        self.coord.ready().await?;
        let task = self.task(&req.into_inner().source_task, U::Disconnect)?;
        coord.reset(task).await.map_err(|e| self.status(e))?;
        Ok(Response::new(ResetTaskResponse {}))
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
        let coord = self.coord.for_request(&req)?;
        self.coord.ready().await?;
        let r = req.into_inner();
        let task = self.task(&r.error_origin, U::ReportError)?;
        coord
            .report_error(task, r.error_code, r.error_message)
            .await
            .map_err(|e| self.status(e))?;
        Ok(Response::new(ReportErrorToServiceResponse {}))
    }

    async fn insert_key_value(
        &self,
        req: Request<InsertKeyValueRequest>,
    ) -> Reply<InsertKeyValueResponse> {
        let coord = self.coord.for_request(&req)?;
        self.coord.ready().await?;
        let r = req.into_inner();
        let kv = r.kv.unwrap_or_default();
        coord
            .kv_insert(kv.key, kv.value, r.allow_overwrite)
            .await
            .map_err(|e| self.status(e))?;
        Ok(Response::new(InsertKeyValueResponse {}))
    }

    async fn get_key_value(&self, req: Request<GetKeyValueRequest>) -> Reply<GetKeyValueResponse> {
        self.coord.ready().await?;
        let key = req.into_inner().key;
        let value = self
            .coord
            .kv_get_blocking(&key)
            .await
            .map_err(|e| self.status(e))?;
        Ok(Response::new(GetKeyValueResponse {
            kv: Some(KeyValueEntry { key, value }),
        }))
    }

    async fn try_get_key_value(
        &self,
        req: Request<TryGetKeyValueRequest>,
    ) -> Reply<TryGetKeyValueResponse> {
        self.coord.ready().await?;
        let key = req.into_inner().key;
        let value = self
            .coord
            .kv_try_get(&key)
            .await
            .map_err(|e| self.status(e))?;
        Ok(Response::new(TryGetKeyValueResponse {
            kv: Some(KeyValueEntry { key, value }),
        }))
    }

    async fn get_key_value_dir(
        &self,
        req: Request<GetKeyValueDirRequest>,
    ) -> Reply<GetKeyValueDirResponse> {
        self.coord.ready().await?;
        let dir = req.into_inner().directory_key;
        let entries = self.coord.kv_dir(&dir).await.map_err(|e| self.status(e))?;
        Ok(Response::new(GetKeyValueDirResponse {
            directory_key: dir,
            kv: entries
                .into_iter()
                .map(|(key, value)| KeyValueEntry { key, value })
                .collect(),
        }))
    }

    async fn delete_key_value(
        &self,
        req: Request<DeleteKeyValueRequest>,
    ) -> Reply<DeleteKeyValueResponse> {
        let coord = self.coord.for_request(&req)?;
        self.coord.ready().await?;
        let key = req.into_inner().key;
        coord.kv_delete(key).await.map_err(|e| self.status(e))?;
        Ok(Response::new(DeleteKeyValueResponse {}))
    }

    async fn barrier(&self, req: Request<BarrierRequest>) -> Reply<BarrierResponse> {
        let coord = self.coord.for_request(&req)?;
        self.coord.ready().await?;
        let r = req.into_inner();
        let task = self.task(&r.source_task, U::Barrier)?;
        let mut participants = Vec::with_capacity(r.tasks.len());
        let mut unknown = String::new();
        for t in &r.tasks {
            match self.coord.read(|s| s.task_index(&t.job_name, t.task_id)) {
                Some(i) => participants.push(i),
                None if unknown.is_empty() => unknown = task_name(&t.job_name, t.task_id),
                None => {}
            }
        }
        let counter = coord
            .barrier(
                r.barrier_id,
                r.counter,
                r.barrier_timeout_in_ms.max(0) as u64,
                participants,
                unknown,
                task,
                r.source_task.as_ref().is_some_and(|t| t.recoverable),
            )
            .await
            .map_err(|e| self.status(e))?;
        Ok(Response::new(BarrierResponse { counter }))
    }

    async fn cancel_barrier(
        &self,
        req: Request<CancelBarrierRequest>,
    ) -> Reply<CancelBarrierResponse> {
        let coord = self.coord.for_request(&req)?;
        self.coord.ready().await?;
        let r = req.into_inner();
        let task = self.task(&r.source_task, U::Barrier)?;
        coord
            .cancel_barrier(r.barrier_id, r.counter, task)
            .await
            .map_err(|e| self.status(e))?;
        Ok(Response::new(CancelBarrierResponse {}))
    }

    async fn get_task_state(
        &self,
        req: Request<GetTaskStateRequest>,
    ) -> Reply<GetTaskStateResponse> {
        self.coord.ready().await?;
        let tasks = req.into_inner().source_task;
        let mut indices = Vec::with_capacity(tasks.len());
        for t in &tasks {
            indices.push(task_index(
                &self.coord,
                &t.job_name,
                t.task_id,
                U::GetTaskState,
            )?);
        }
        let entries = self
            .coord
            .task_entries(&indices)
            .await
            .map_err(|e| self.status(e))?;
        let task_state = tasks
            .into_iter()
            .zip(entries)
            .map(|(task, entry)| task_state_info(&self.coord, task, &entry))
            .collect();
        Ok(Response::new(GetTaskStateResponse { task_state }))
    }

    async fn poll_for_error(
        &self,
        req: Request<PollForErrorRequest>,
    ) -> Reply<PollForErrorResponse> {
        let coord = self.coord.for_request(&req)?;
        self.coord.ready().await?;
        let task = self.task(&req.into_inner().source_task, U::PollForError)?;
        Err(self.status(coord.poll_for_error(task).await))
    }
}

/// One task's state as GetTaskState reports it: the error's code, message
/// and payload for a task in ERROR, none for the others.
fn task_state_info(
    coord: &Coordination,
    task: CoordinatedTask,
    entry: &journal::pb::TaskEntry,
) -> CoordinatedTaskStateInfo {
    use journal::TaskStatus as S;
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
            source_task: e.source_task.and_then(|i| {
                coord.read(|s| {
                    s.task_id(i).map(|(job, id)| CoordinatedTask {
                        job_name: job.to_string(),
                        task_id: id,
                        recoverable: false,
                    })
                })
            }),
        });
    }
    info
}
