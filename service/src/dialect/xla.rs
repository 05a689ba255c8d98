//! `xla.coordination.CoordinationService`, what stock jaxlib 0.12 dials. Task
//! ids are the dense ids of job `jax_worker`. Every call but RegisterTask
//! must carry the service incarnation (reference §1.2).

use std::collections::HashMap;

use bytes::Bytes;
use journal::{DomainError, TaskStatus, JAX_JOB};
use prost::Message;
use proto::payload_keys;
use proto::xla::coordination_service_server::{CoordinationService, CoordinationServiceServer};
use proto::xla::*;
use tonic::codec::CompressionEncoding;
use tonic::{Request, Response, Status};

use super::{status_with_payloads, to_status};
use crate::coord::{CallError, Coordination};

type Reply<T> = Result<Response<T>, Status>;

/// The xla dialect service.
pub struct XlaService {
    coord: Coordination,
}

impl XlaService {
    /// The tonic service: gzip accepted, message limits from the node config.
    pub fn server(
        coord: Coordination,
        max_message_bytes: usize,
    ) -> CoordinationServiceServer<XlaService> {
        CoordinationServiceServer::new(XlaService { coord })
            .accept_compressed(CompressionEncoding::Gzip)
            .max_decoding_message_size(max_message_bytes)
            .max_encoding_message_size(max_message_bytes)
    }

    fn status(&self, e: CallError) -> Status {
        to_status(e, |d| self.domain_status(d))
    }

    /// The wire error of a domain error, payloads in xla encoding.
    fn domain_status(&self, e: &DomainError) -> Status {
        let mut payloads = HashMap::new();
        if e.coordination_payload {
            let source_task_id = e
                .source_task
                .and_then(|i| self.coord.read(|s| s.task_id(i).map(|(_, id)| id)))
                .unwrap_or(0);
            let p = CoordinationServiceError {
                is_reported_error: e.is_reported_error,
                source_task_id,
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
        if let Some(inc) = e.service_mismatch {
            let p = ServiceMismatchError {
                service_incarnation: inc,
            };
            payloads.insert(
                payload_keys::SERVICE_MISMATCH_ERROR.to_string(),
                p.encode_to_vec(),
            );
        }
        status_with_payloads(e.code, &e.message, payloads)
    }

    /// Resolves a jaxlib task id; `call` picks the unknown-task message.
    fn task(&self, id: i32, call: journal::errors::UnknownTaskIn) -> Result<u32, Status> {
        self.coord
            .read(|s| s.task_index(JAX_JOB, id))
            .ok_or_else(|| {
                self.domain_status(&journal::errors::unknown_task(call, &id.to_string()))
            })
    }

    /// Configured service, and the caller's service incarnation matches.
    async fn admit(&self, incarnations: &Option<Incarnations>) -> Result<(), Status> {
        self.coord.ready().await?;
        let requested = incarnations.as_ref().map_or(0, |i| i.service_incarnation);
        self.coord
            .check_service_incarnation(requested)
            .await
            .map_err(|e| self.status(e))
    }
}

fn task_state(s: TaskStatus) -> TaskState {
    match s {
        TaskStatus::Disconnected => TaskState::Disconnected,
        TaskStatus::Connected => TaskState::Connected,
        TaskStatus::Error => TaskState::Error,
    }
}

use journal::errors::UnknownTaskIn as U;

#[tonic::async_trait]
impl CoordinationService for XlaService {
    async fn register_task(
        &self,
        req: Request<RegisterTaskRequest>,
    ) -> Reply<RegisterTaskResponse> {
        let coord = self.coord.for_request(&req)?;
        self.coord.ready().await?;
        let r = req.into_inner();
        let task = self.task(r.source_task_id, U::Register)?;
        let inc = coord
            .register(task, r.incarnation, false)
            .await
            .map_err(|e| self.status(e))?;
        Ok(Response::new(RegisterTaskResponse {
            service_incarnation: inc,
        }))
    }

    async fn heartbeat(&self, req: Request<HeartbeatRequest>) -> Reply<HeartbeatResponse> {
        let coord = self.coord.for_request(&req)?;
        let r = req.into_inner();
        self.admit(&r.incarnations).await?;
        let task = self.task(r.source_task_id, U::Heartbeat)?;
        let inc = coord
            .heartbeat(task, r.incarnation)
            .await
            .map_err(|e| self.status(e))?;
        Ok(Response::new(HeartbeatResponse {
            service_incarnation: inc,
        }))
    }

    async fn shutdown_task(
        &self,
        req: Request<ShutdownTaskRequest>,
    ) -> Reply<ShutdownTaskResponse> {
        let coord = self.coord.for_request(&req)?;
        let r = req.into_inner();
        self.admit(&r.incarnations).await?;
        let task = self.task(r.source_task_id, U::Disconnect)?;
        coord
            .shutdown(task, false)
            .await
            .map_err(|e| self.status(e))?;
        Ok(Response::new(ShutdownTaskResponse {}))
    }

    async fn watch_tasks(&self, req: Request<WatchTasksRequest>) -> Reply<WatchTasksResponse> {
        let r = req.into_inner();
        self.admit(&r.incarnations).await?;
        let (views, version) = self
            .coord
            .watch_tasks(r.version_number)
            .await
            .map_err(|e| self.status(e))?;
        let task_state = views
            .into_iter()
            .filter_map(|v| {
                let (job, id) = self
                    .coord
                    .read(|s| s.task_id(v.index).map(|(j, id)| (j.to_string(), id)))?;
                (job == JAX_JOB).then(|| {
                    let e = v.entry.error.clone().unwrap_or_default();
                    let payload = v.entry.error.as_ref().map(|e| CoordinationServiceError {
                        is_reported_error: e.is_reported_error,
                        source_task_id: e
                            .source_task
                            .and_then(|i| self.coord.read(|s| s.task_id(i).map(|(_, id)| id)))
                            .unwrap_or(0),
                    });
                    TaskInfo {
                        task_id: id,
                        incarnation: v.entry.incarnation,
                        state: task_state(v.entry.status()) as i32,
                        error_code: e.code,
                        error_message: e.message,
                        error_payload: payload,
                    }
                })
            })
            .collect();
        Ok(Response::new(WatchTasksResponse {
            task_state,
            version_number: version,
        }))
    }

    async fn insert_key_value(
        &self,
        req: Request<InsertKeyValueRequest>,
    ) -> Reply<InsertKeyValueResponse> {
        let coord = self.coord.for_request(&req)?;
        let r = req.into_inner();
        self.admit(&r.incarnations).await?;
        let kv = r.kv.unwrap_or_default();
        coord
            .kv_insert(kv.key, kv.value, r.allow_overwrite)
            .await
            .map_err(|e| self.status(e))?;
        Ok(Response::new(InsertKeyValueResponse {}))
    }

    async fn get_key_value(&self, req: Request<GetKeyValueRequest>) -> Reply<GetKeyValueResponse> {
        let r = req.into_inner();
        self.admit(&r.incarnations).await?;
        let value = self
            .coord
            .kv_get_blocking(&r.key)
            .await
            .map_err(|e| self.status(e))?;
        Ok(Response::new(GetKeyValueResponse {
            kv: Some(KeyValueEntry { key: r.key, value }),
        }))
    }

    async fn try_get_key_value(
        &self,
        req: Request<TryGetKeyValueRequest>,
    ) -> Reply<TryGetKeyValueResponse> {
        let r = req.into_inner();
        self.admit(&r.incarnations).await?;
        let value = self
            .coord
            .kv_try_get(&r.key)
            .await
            .map_err(|e| self.status(e))?;
        Ok(Response::new(TryGetKeyValueResponse {
            kv: Some(KeyValueEntry { key: r.key, value }),
        }))
    }

    async fn increment_key_value(
        &self,
        req: Request<IncrementKeyValueRequest>,
    ) -> Reply<IncrementKeyValueResponse> {
        let coord = self.coord.for_request(&req)?;
        let r = req.into_inner();
        self.admit(&r.incarnations).await?;
        let v = coord
            .kv_increment(r.key.clone(), r.increment)
            .await
            .map_err(|e| self.status(e))?;
        Ok(Response::new(IncrementKeyValueResponse {
            kv: Some(KeyValueEntry {
                key: r.key,
                value: Bytes::from(v.to_string()),
            }),
        }))
    }

    async fn get_key_value_dir(
        &self,
        req: Request<GetKeyValueDirRequest>,
    ) -> Reply<GetKeyValueDirResponse> {
        let r = req.into_inner();
        self.admit(&r.incarnations).await?;
        let entries = self
            .coord
            .kv_dir(&r.directory_key)
            .await
            .map_err(|e| self.status(e))?;
        Ok(Response::new(GetKeyValueDirResponse {
            directory_key: r.directory_key,
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
        let r = req.into_inner();
        self.admit(&r.incarnations).await?;
        coord.kv_delete(r.key).await.map_err(|e| self.status(e))?;
        Ok(Response::new(DeleteKeyValueResponse {}))
    }

    async fn barrier(&self, req: Request<BarrierRequest>) -> Reply<BarrierResponse> {
        let coord = self.coord.for_request(&req)?;
        let r = req.into_inner();
        self.admit(&r.incarnations).await?;
        let task = self.task(r.source_task_id, U::Barrier)?;
        let mut participants = Vec::with_capacity(r.task_ids.len());
        let mut unknown = String::new();
        for id in &r.task_ids {
            match self.coord.read(|s| s.task_index(JAX_JOB, *id)) {
                Some(i) => participants.push(i),
                None if unknown.is_empty() => unknown = id.to_string(),
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
                false,
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
        let r = req.into_inner();
        self.admit(&r.incarnations).await?;
        let task = self.task(r.source_task_id, U::Barrier)?;
        coord
            .cancel_barrier(r.barrier_id, r.counter, task)
            .await
            .map_err(|e| self.status(e))?;
        Ok(Response::new(CancelBarrierResponse {}))
    }

    async fn get_alive_tasks(
        &self,
        req: Request<GetAliveTasksRequest>,
    ) -> Reply<GetAliveTasksResponse> {
        let coord = self.coord.for_request(&req)?;
        let r = req.into_inner();
        self.admit(&r.incarnations).await?;
        let task = self.task(r.requesting_task_id, U::AliveTasks)?;
        let mut tasks = Vec::with_capacity(r.task_ids.len());
        for id in &r.task_ids {
            tasks.push(self.task(*id, U::AliveTasks)?);
        }
        let alive = coord
            .alive_tasks(task, tasks)
            .await
            .map_err(|e| self.status(e))?;
        let ids = alive
            .tasks
            .iter()
            .map(|&i| {
                self.coord
                    .read(|s| s.task_id(i).map_or(i as i32, |(_, id)| id))
            })
            .collect();
        Ok(Response::new(GetAliveTasksResponse {
            alive_task_ids: ids,
            incarnations: alive.incarnations,
        }))
    }

    async fn poll_for_error(
        &self,
        req: Request<PollForErrorRequest>,
    ) -> Reply<PollForErrorResponse> {
        let coord = self.coord.for_request(&req)?;
        let r = req.into_inner();
        self.admit(&r.incarnations).await?;
        let task = self.task(r.source_task_id, U::PollForError)?;
        Err(self.status(coord.poll_for_error(task).await))
    }

    async fn report_error_to_service(
        &self,
        req: Request<ReportErrorToServiceRequest>,
    ) -> Reply<ReportErrorToServiceResponse> {
        let coord = self.coord.for_request(&req)?;
        let r = req.into_inner();
        self.admit(&r.incarnations).await?;
        let task = self.task(r.source_task_id, U::ReportError)?;
        coord
            .report_error(task, r.error_code, r.error_message)
            .await
            .map_err(|e| self.status(e))?;
        Ok(Response::new(ReportErrorToServiceResponse {}))
    }
}
