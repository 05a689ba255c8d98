//! `xla.coordination.CoordinationService`, what stock jaxlib 0.12 dials. Task
//! ids are the dense ids of job `jax_worker`. Every call but RegisterTask
//! must carry the service incarnation (reference §1.2).

use std::collections::HashMap;

use bytes::Bytes;
use journal::{coordination::TaskStatus, DomainError, JAX_JOB};
use prost::Message;
use proto::payload_keys;
use proto::xla::coordination_service_server::{CoordinationService, CoordinationServiceServer};
use proto::xla::*;
use tonic::codec::CompressionEncoding;
use tonic::{Request, Response, Status};

use super::{read, status_with_payloads, unary, WireErrors};
use crate::coordination::{CallResult, Coordination};

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
}

impl WireErrors for XlaService {
    /// The wire error of a domain error, payloads in xla encoding.
    fn domain_status(coord: &Coordination, e: &DomainError) -> Status {
        let mut payloads = HashMap::new();
        if e.coordination_payload {
            let source_task_id = e
                .source_task
                .and_then(|i| coord.task_of(i).map(|(_, id)| id))
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
}

/// Resolves a jaxlib task id; `call` picks the unknown-task message.
fn task(c: &Coordination, id: i32, call: U) -> CallResult<u32> {
    c.task_index(JAX_JOB, id)
        .ok_or_else(|| unknown_task(call, &id.to_string()).into())
}

/// The caller's service incarnation matches (every call but RegisterTask).
async fn admit(c: &Coordination, incarnations: &Option<Incarnations>) -> CallResult<()> {
    let requested = incarnations.as_ref().map_or(0, |i| i.service_incarnation);
    c.check_service_incarnation(requested).await
}

fn task_state(s: TaskStatus) -> TaskState {
    match s {
        TaskStatus::Disconnected => TaskState::Disconnected,
        TaskStatus::Connected => TaskState::Connected,
        TaskStatus::Error => TaskState::Error,
    }
}

use journal::coordination::errors::{unknown_task, UnknownTaskIn as U};

type X = XlaService;

#[tonic::async_trait]
impl CoordinationService for XlaService {
    async fn register_task(
        &self,
        req: Request<RegisterTaskRequest>,
    ) -> Reply<RegisterTaskResponse> {
        unary::<X, _, _, _>(&self.coord, req, |c, r| async move {
            let t = task(&c, r.source_task_id, U::Register)?;
            let service_incarnation = c.register(t, r.incarnation, false).await?;
            Ok(RegisterTaskResponse {
                service_incarnation,
            })
        })
        .await
    }

    async fn heartbeat(&self, req: Request<HeartbeatRequest>) -> Reply<HeartbeatResponse> {
        unary::<X, _, _, _>(&self.coord, req, |c, r| async move {
            admit(&c, &r.incarnations).await?;
            let t = task(&c, r.source_task_id, U::Heartbeat)?;
            let service_incarnation = c.heartbeat(t, r.incarnation).await?;
            Ok(HeartbeatResponse {
                service_incarnation,
            })
        })
        .await
    }

    async fn shutdown_task(
        &self,
        req: Request<ShutdownTaskRequest>,
    ) -> Reply<ShutdownTaskResponse> {
        unary::<X, _, _, _>(&self.coord, req, |c, r| async move {
            admit(&c, &r.incarnations).await?;
            let t = task(&c, r.source_task_id, U::Disconnect)?;
            c.shutdown(t, false).await?;
            Ok(ShutdownTaskResponse {})
        })
        .await
    }

    async fn watch_tasks(&self, req: Request<WatchTasksRequest>) -> Reply<WatchTasksResponse> {
        read::<X, _, _, _>(&self.coord, req, |c, r| async move {
            admit(&c, &r.incarnations).await?;
            let (views, version) = c.watch_tasks(r.version_number).await?;
            let id_of = |i: u32| c.task_of(i);
            let task_state = views
                .into_iter()
                .filter_map(|v| {
                    let (job, id) = id_of(v.index)?;
                    (job == JAX_JOB).then(|| {
                        let e = v.entry.error.clone().unwrap_or_default();
                        let payload = v.entry.error.as_ref().map(|e| CoordinationServiceError {
                            is_reported_error: e.is_reported_error,
                            source_task_id: e
                                .source_task
                                .and_then(|i| id_of(i).map(|(_, id)| id))
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
            Ok(WatchTasksResponse {
                task_state,
                version_number: version,
            })
        })
        .await
    }

    async fn insert_key_value(
        &self,
        req: Request<InsertKeyValueRequest>,
    ) -> Reply<InsertKeyValueResponse> {
        unary::<X, _, _, _>(&self.coord, req, |c, r| async move {
            admit(&c, &r.incarnations).await?;
            let kv = r.kv.unwrap_or_default();
            c.kv_insert(kv.key, kv.value, r.allow_overwrite).await?;
            Ok(InsertKeyValueResponse {})
        })
        .await
    }

    async fn get_key_value(&self, req: Request<GetKeyValueRequest>) -> Reply<GetKeyValueResponse> {
        read::<X, _, _, _>(&self.coord, req, |c, r| async move {
            admit(&c, &r.incarnations).await?;
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
        read::<X, _, _, _>(&self.coord, req, |c, r| async move {
            admit(&c, &r.incarnations).await?;
            let value = c.kv_try_get(&r.key).await?;
            Ok(TryGetKeyValueResponse {
                kv: Some(KeyValueEntry { key: r.key, value }),
            })
        })
        .await
    }

    async fn increment_key_value(
        &self,
        req: Request<IncrementKeyValueRequest>,
    ) -> Reply<IncrementKeyValueResponse> {
        unary::<X, _, _, _>(&self.coord, req, |c, r| async move {
            admit(&c, &r.incarnations).await?;
            let v = c.kv_increment(r.key.clone(), r.increment).await?;
            Ok(IncrementKeyValueResponse {
                kv: Some(KeyValueEntry {
                    key: r.key,
                    value: Bytes::from(v.to_string()),
                }),
            })
        })
        .await
    }

    async fn get_key_value_dir(
        &self,
        req: Request<GetKeyValueDirRequest>,
    ) -> Reply<GetKeyValueDirResponse> {
        read::<X, _, _, _>(&self.coord, req, |c, r| async move {
            admit(&c, &r.incarnations).await?;
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
        unary::<X, _, _, _>(&self.coord, req, |c, r| async move {
            admit(&c, &r.incarnations).await?;
            c.kv_delete(r.key).await?;
            Ok(DeleteKeyValueResponse {})
        })
        .await
    }

    async fn barrier(&self, req: Request<BarrierRequest>) -> Reply<BarrierResponse> {
        unary::<X, _, _, _>(&self.coord, req, |c, r| async move {
            admit(&c, &r.incarnations).await?;
            let t = task(&c, r.source_task_id, U::Barrier)?;
            let mut participants = Vec::with_capacity(r.task_ids.len());
            let mut unknown = String::new();
            for id in &r.task_ids {
                match c.task_index(JAX_JOB, *id) {
                    Some(i) => participants.push(i),
                    None if unknown.is_empty() => unknown = id.to_string(),
                    None => {}
                }
            }
            let timeout_ms = r.barrier_timeout_in_ms.max(0) as u64;
            let counter = c
                .barrier(
                    r.barrier_id,
                    r.counter,
                    timeout_ms,
                    participants,
                    unknown,
                    t,
                    false,
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
        unary::<X, _, _, _>(&self.coord, req, |c, r| async move {
            admit(&c, &r.incarnations).await?;
            let t = task(&c, r.source_task_id, U::Barrier)?;
            c.cancel_barrier(r.barrier_id, r.counter, t).await?;
            Ok(CancelBarrierResponse {})
        })
        .await
    }

    async fn get_alive_tasks(
        &self,
        req: Request<GetAliveTasksRequest>,
    ) -> Reply<GetAliveTasksResponse> {
        unary::<X, _, _, _>(&self.coord, req, |c, r| async move {
            admit(&c, &r.incarnations).await?;
            let t = task(&c, r.requesting_task_id, U::AliveTasks)?;
            let mut tasks = Vec::with_capacity(r.task_ids.len());
            for id in &r.task_ids {
                tasks.push(task(&c, *id, U::AliveTasks)?);
            }
            let alive = c.alive_tasks(t, tasks).await?;
            let alive_task_ids = alive
                .tasks
                .iter()
                .map(|&i| c.task_of(i).map_or(i as i32, |(_, id)| id))
                .collect();
            Ok(GetAliveTasksResponse {
                alive_task_ids,
                incarnations: alive.incarnations,
            })
        })
        .await
    }

    async fn poll_for_error(
        &self,
        req: Request<PollForErrorRequest>,
    ) -> Reply<PollForErrorResponse> {
        unary::<X, _, _, _>(&self.coord, req, |c, r| async move {
            admit(&c, &r.incarnations).await?;
            let t = task(&c, r.source_task_id, U::PollForError)?;
            Err(c.poll_for_error(t).await)
        })
        .await
    }

    async fn report_error_to_service(
        &self,
        req: Request<ReportErrorToServiceRequest>,
    ) -> Reply<ReportErrorToServiceResponse> {
        unary::<X, _, _, _>(&self.coord, req, |c, r| async move {
            admit(&c, &r.incarnations).await?;
            let t = task(&c, r.source_task_id, U::ReportError)?;
            c.report_error(t, r.error_code, r.error_message).await?;
            Ok(ReportErrorToServiceResponse {})
        })
        .await
    }
}
