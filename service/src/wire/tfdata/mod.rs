//! `tensorflow.data.DispatcherService`, the tf.data service dispatcher as
//! TensorFlow 2.21 workers and clients dial it (`docs/protocols.md`, tf.data
//! dispatcher (TF 2.21)): TensorFlow's messages to the dispatcher area's
//! journal commands and back ([`graph`] reads a dataset's graph for the
//! source of a DYNAMIC job).
//!
//! GetVersion and GetDataServiceConfig are answered by any node; every
//! other call runs on the leader: a follower forwards the whole call there
//! ([`on_leader`]), with an origin drawn once per call so its retries are
//! exactly-once. While no leader is known a call gets UNAVAILABLE (which TF
//! retries), never NOT_FOUND or FAILED_PRECONDITION (which end an input
//! pipeline). Distributed snapshots are UNIMPLEMENTED.

pub mod graph;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use journal::pb::dispatcher as cmd;
use proto::tfdata::dispatcher_service_client::DispatcherServiceClient;
use proto::tfdata::dispatcher_service_server::{DispatcherService, DispatcherServiceServer};
use proto::tfdata::*;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use crate::areas::dispatcher::{status, ClientView, Dispatcher, TaskDefinition, TaskView};
use crate::core::router::{Attempt, Forwarding};
use crate::core::{Access, Call, CallResult};

/// Deadline of one ProcessTask push to a worker.
const PUSH_DEADLINE: Duration = Duration::from_secs(5);

/// The tf.data dispatcher service of a node.
#[derive(Clone)]
pub struct TfDataService {
    d: Arc<Dispatcher>,
}

impl TfDataService {
    /// The tonic service.
    pub fn server(d: Arc<Dispatcher>, max_message_bytes: usize) -> DispatcherServiceServer<Self> {
        DispatcherServiceServer::new(TfDataService { d })
            .max_decoding_message_size(max_message_bytes)
            .max_encoding_message_size(max_message_bytes)
    }
}

fn unimplemented(what: &str) -> Status {
    Status::unimplemented(format!(
        "coordstore's tf.data dispatcher does not serve {what} (distributed snapshots are not supported yet)"
    ))
}

type DispatcherClient = DispatcherServiceClient<Channel>;

/// Runs call `c` on the leader: `local` here when this node leads (after
/// checking the namespace still exists: NOT_FOUND ends a TF client's
/// pipeline, as upstream's unknown ids do), or the whole call forwarded to
/// the leader's dispatcher by `remote`, across leader changes. A call that
/// may change state (`exactly_once`) carries one origin in every attempt.
async fn on_leader<Req, Resp, L, LF, R, RF>(
    d: &Arc<Dispatcher>,
    c: &Call,
    exactly_once: bool,
    r: Req,
    local: L,
    remote: R,
) -> CallResult<Resp>
where
    Req: Clone,
    L: Fn(Arc<Dispatcher>, Call, Req) -> LF,
    LF: Future<Output = CallResult<Resp>>,
    R: Fn(DispatcherClient, Request<Req>) -> RF,
    RF: Future<Output = Result<Response<Resp>, Status>>,
{
    let router = d.core().router();
    let max = router.max_message_bytes();
    let started = std::time::Instant::now();
    let how = Forwarding {
        read: false,
        attempt: Attempt::Short,
        exactly_once,
    };
    let here = |call: Call, r| {
        let run = local(d.clone(), call.clone(), r);
        let exists = d.namespace_exists(&call);
        async move {
            exists?;
            run.await
        }
    };
    let there = |ch, r| {
        let client = DispatcherServiceClient::new(ch)
            .max_decoding_message_size(max)
            .max_encoding_message_size(max);
        remote(client, r)
    };
    let answer = router.forward_call(c, r, how, here, there).await;
    tracing::debug!(
        call = std::any::type_name::<Req>()
            .rsplit("::")
            .next()
            .unwrap_or_default(),
        forwarded = c.forwarded(),
        ms = started.elapsed().as_secs_f64() * 1000.0,
        ok = answer.is_ok(),
        "tf.data call"
    );
    answer
}

/// Writes the service: a row per call run on the leader — the handler of
/// the same name below here, the same call of the leader's dispatcher from
/// a follower — marked `write` when it may change state (it then carries
/// one origin in every attempt) or `read`; then the calls any node answers.
/// Every call runs the one pipeline (`super::serve`), admitted to its
/// namespace.
macro_rules! on_leader {
    ($($method:ident($req:ty) -> $resp:ty, $kind:ident;)* { $($more:tt)* }) => {
        #[tonic::async_trait]
        impl DispatcherService for TfDataService {
            $(
                async fn $method(&self, req: Request<$req>) -> Result<Response<$resp>, Status> {
                    let d = &self.d;
                    let in_namespace = super::door(Access::Namespace);
                    let errors = |_: &Call, e: &journal::DomainError| status(e);
                    let local = |d: Arc<Dispatcher>, c: Call, r| async move { $method(&d, &c, r).await };
                    let remote = |mut leader: DispatcherClient, r| async move { leader.$method(r).await };
                    let write = stringify!($kind) == "write";
                    super::serve(d.core(), req, in_namespace, errors, |c, r| async move {
                        let answer = on_leader(d, &c, write, r, local, remote).await;
                        (c, answer)
                    })
                    .await
                }
            )*
            $($more)*
        }
    };
}

on_leader! {
    worker_heartbeat(WorkerHeartbeatRequest) -> WorkerHeartbeatResponse, write;
    worker_update(WorkerUpdateRequest) -> WorkerUpdateResponse, write;
    get_dataset_def(GetDatasetDefRequest) -> GetDatasetDefResponse, read;
    get_split(GetSplitRequest) -> GetSplitResponse, write;
    get_or_register_dataset(GetOrRegisterDatasetRequest) -> GetOrRegisterDatasetResponse, write;
    get_or_create_job(GetOrCreateJobRequest) -> GetOrCreateJobResponse, write;
    get_or_create_iteration(GetOrCreateIterationRequest) -> GetOrCreateIterationResponse, write;
    maybe_remove_task(MaybeRemoveTaskRequest) -> MaybeRemoveTaskResponse, write;
    release_iteration_client(ReleaseIterationClientRequest) -> ReleaseIterationClientResponse, write;
    client_heartbeat(ClientHeartbeatRequest) -> ClientHeartbeatResponse, write;
    get_workers(GetWorkersRequest) -> GetWorkersResponse, read;
    get_data_service_metadata(GetDataServiceMetadataRequest) -> GetDataServiceMetadataResponse, read;
    disable_compression_at_runtime(DisableCompressionAtRuntimeRequest) -> DisableCompressionAtRuntimeResponse, write;
    {
        async fn get_version(&self, _: Request<GetVersionRequest>) -> Result<Response<GetVersionResponse>, Status> {
            Ok(Response::new(GetVersionResponse { version: self.d.version() }))
        }

        async fn get_data_service_config(&self, _: Request<GetDataServiceConfigRequest>) -> Result<Response<GetDataServiceConfigResponse>, Status> {
            let config = Some(DataServiceConfig { deployment_mode: 0 });
            Ok(Response::new(GetDataServiceConfigResponse { config }))
        }

        async fn snapshot(&self, _: Request<SnapshotRequest>) -> Result<Response<SnapshotResponse>, Status> {
            Err(unimplemented("Snapshot"))
        }

        async fn get_snapshot_split(&self, _: Request<GetSnapshotSplitRequest>) -> Result<Response<GetSnapshotSplitResponse>, Status> {
            Err(unimplemented("GetSnapshotSplit"))
        }

        async fn get_snapshot_streams(&self, _: Request<GetSnapshotStreamsRequest>) -> Result<Response<GetSnapshotStreamsResponse>, Status> {
            Err(unimplemented("GetSnapshotStreams"))
        }
    }
}

type Answer<T> = CallResult<T>;

// ------------------------------------------------------------- workers ----

async fn worker_heartbeat(
    d: &Dispatcher,
    c: &Call,
    r: WorkerHeartbeatRequest,
) -> Answer<WorkerHeartbeatResponse> {
    let hb = cmd::WorkerHeartbeat {
        address: r.worker_address,
        transfer_servers: r.transfer_servers,
        tags: r.worker_tags,
        uid: r.worker_uid,
    };
    let tasks = d.worker_heartbeat(c, hb, &r.current_tasks).await?;
    Ok(WorkerHeartbeatResponse {
        new_tasks: tasks.new.into_iter().map(task_def).collect(),
        tasks_to_delete: tasks.delete,
    })
}

async fn worker_update(
    d: &Dispatcher,
    c: &Call,
    r: WorkerUpdateRequest,
) -> Answer<WorkerUpdateResponse> {
    let task_ids = r
        .updates
        .iter()
        .filter(|u| u.completed)
        .map(|u| u.task_id)
        .collect();
    d.finish_tasks(c, cmd::FinishTasks { task_ids }).await?;
    Ok(WorkerUpdateResponse {})
}

async fn get_workers(d: &Dispatcher, c: &Call, _: GetWorkersRequest) -> Answer<GetWorkersResponse> {
    let workers = d.workers(c).into_iter();
    Ok(GetWorkersResponse {
        workers: workers.map(|address| WorkerInfo { address }).collect(),
    })
}

/// A task's TaskDef, its dataset inline.
fn task_def(t: TaskDefinition) -> TaskDef {
    TaskDef {
        dataset: Some(task_def::Dataset::DatasetDef(t.dataset)),
        dataset_id: t.dataset_id,
        task_id: t.task_id,
        iteration_id: t.iteration_id,
        optional_num_consumers: t
            .num_consumers
            .map(task_def::OptionalNumConsumers::NumConsumers),
        worker_address: t.worker_address,
        num_split_providers: t.num_split_providers,
        processing_mode_def: Some(ProcessingModeDef {
            sharding_policy: t.sharding_policy,
        }),
        num_workers: t.num_workers,
        worker_index: t.worker_index,
        use_cross_trainer_cache: t.use_cross_trainer_cache,
    }
}

// ------------------------------------------------------------ datasets ----

async fn get_dataset_def(
    d: &Dispatcher,
    c: &Call,
    r: GetDatasetDefRequest,
) -> Answer<GetDatasetDefResponse> {
    let dataset_def = d.dataset_definition(c, &r.dataset_id).await?;
    Ok(GetDatasetDefResponse { dataset_def })
}

async fn get_or_register_dataset(
    d: &Dispatcher,
    c: &Call,
    r: GetOrRegisterDatasetRequest,
) -> Answer<GetOrRegisterDatasetResponse> {
    let compression = <DataServiceMetadataView as prost::Message>::decode(r.metadata.as_ref())
        .map(|m| m.compression)
        .unwrap_or_default();
    let requested_id = r.optional_dataset_id.map(|o| match o {
        get_or_register_dataset_request::OptionalDatasetId::DatasetId(id) => id,
    });
    let register = cmd::RegisterDataset {
        definition: r.dataset,
        metadata: r.metadata,
        compression,
        requested_id,
    };
    let dataset_id = d.register_dataset(c, register).await?;
    Ok(GetOrRegisterDatasetResponse { dataset_id })
}

async fn get_data_service_metadata(
    d: &Dispatcher,
    c: &Call,
    r: GetDataServiceMetadataRequest,
) -> Answer<GetDataServiceMetadataResponse> {
    let metadata = d.dataset_metadata(c, &r.dataset_id).await?;
    Ok(GetDataServiceMetadataResponse { metadata })
}

async fn disable_compression_at_runtime(
    d: &Dispatcher,
    c: &Call,
    r: DisableCompressionAtRuntimeRequest,
) -> Answer<DisableCompressionAtRuntimeResponse> {
    use disable_compression_at_runtime_response::Decision;
    let disable = cmd::DisableCompression {
        dataset_id: r.dataset_id,
        disable: r.disable_compression_at_runtime,
    };
    let decision = match d.disable_compression(c, disable).await? {
        Some(disabled) => Decision::CompressionDisabledAtRuntime(disabled),
        None => Decision::NoCompressionToDisable(true),
    };
    Ok(DisableCompressionAtRuntimeResponse {
        decision: Some(decision),
    })
}

// -------------------------------------------------- jobs and iterations ----

async fn get_or_create_job(
    d: &Dispatcher,
    c: &Call,
    r: GetOrCreateJobRequest,
) -> Answer<GetOrCreateJobResponse> {
    let mut job = cmd::GetOrCreateJob {
        dataset_id: r.dataset_id,
        sharding_policy: r.processing_mode_def.map_or(0, |m| m.sharding_policy),
        job_name: r.optional_job_name.map(|o| match o {
            get_or_create_job_request::OptionalJobName::JobName(n) => n,
        }),
        num_consumers: r.optional_num_consumers.map(|o| match o {
            get_or_create_job_request::OptionalNumConsumers::NumConsumers(n) => n,
        }),
        use_cross_trainer_cache: r.use_cross_trainer_cache,
        target_workers: r.target_workers,
        anonymous_suffix: rand::random(),
        split_source: None,
    };
    if let Some(existing) = d.existing_job(c, &job) {
        return existing.map(|job_id| GetOrCreateJobResponse { job_id });
    }
    if job.sharding_policy == journal::dispatcher::SHARDING_DYNAMIC {
        let def = d.dataset_definition(c, &job.dataset_id).await?;
        let source = graph::split_source(&def).map_err(Status::unimplemented)?;
        job.split_source = Some(source);
    }
    let job_id = d.create_job(c, job).await?;
    Ok(GetOrCreateJobResponse { job_id })
}

/// GetOrCreateIteration: a new iteration's tasks are pushed to their
/// workers at once (ProcessTask), as upstream does; workers also find them
/// on their next heartbeat.
async fn get_or_create_iteration(
    d: &Dispatcher,
    c: &Call,
    r: GetOrCreateIterationRequest,
) -> Answer<GetOrCreateIterationResponse> {
    let get = cmd::GetOrCreateIteration {
        job_id: r.job_id,
        repetition: r.repetition,
    };
    let acquired = d.get_or_create_iteration(c, get).await?;
    for def in acquired.created {
        tokio::spawn(push_task(task_def(def)));
    }
    Ok(GetOrCreateIterationResponse {
        iteration_client_id: acquired.client_id,
    })
}

async fn release_iteration_client(
    d: &Dispatcher,
    c: &Call,
    r: ReleaseIterationClientRequest,
) -> Answer<ReleaseIterationClientResponse> {
    let release = cmd::ReleaseIterationClient {
        iteration_client_id: r.iteration_client_id,
    };
    d.release_client(c, release).await?;
    Ok(ReleaseIterationClientResponse {})
}

async fn get_split(d: &Dispatcher, c: &Call, r: GetSplitRequest) -> Answer<GetSplitResponse> {
    let produce = cmd::ProduceSplit {
        iteration_id: r.iteration_id,
        repetition: r.repetition,
        provider_index: r.split_provider_index,
    };
    let split = d.next_split(c, produce).await?;
    Ok(GetSplitResponse {
        split: if split.end_of_splits {
            Default::default()
        } else {
            graph::split_tensor(split.value).into()
        },
        end_of_splits: split.end_of_splits,
    })
}

async fn maybe_remove_task(
    d: &Dispatcher,
    c: &Call,
    r: MaybeRemoveTaskRequest,
) -> Answer<MaybeRemoveTaskResponse> {
    let removed = d
        .maybe_remove_task(c, r.task_id, r.consumer_index, r.round)
        .await?;
    Ok(MaybeRemoveTaskResponse { removed })
}

async fn client_heartbeat(
    d: &Dispatcher,
    c: &Call,
    r: ClientHeartbeatRequest,
) -> Answer<ClientHeartbeatResponse> {
    use client_heartbeat_request::{OptionalBlockedRound, OptionalCurrentRound};
    let hb = cmd::ClientHeartbeat {
        iteration_client_id: r.iteration_client_id,
        current_round: r
            .optional_current_round
            .map(|OptionalCurrentRound::CurrentRound(x)| x),
        blocked_round: r
            .optional_blocked_round
            .map(|OptionalBlockedRound::BlockedRound(x)| x),
    };
    let view: ClientView = d.client_heartbeat(c, hb).await?;
    Ok(ClientHeartbeatResponse {
        task_info: view.tasks.into_iter().map(task_info).collect(),
        iteration_finished: view.finished,
        optional_block_round: view
            .block_round
            .map(client_heartbeat_response::OptionalBlockRound::BlockRound),
        deployment_mode: 0,
    })
}

fn task_info(t: TaskView) -> TaskInfo {
    TaskInfo {
        worker_address: t.worker_address,
        task_id: t.task_id,
        iteration_id: t.iteration_id,
        starting_round: t.starting_round,
        worker_tags: t.worker_tags,
        worker_uid: t.worker_uid,
        transfer_servers: t.transfer_servers,
    }
}

/// Pushes a new task to its worker (`WorkerService.ProcessTask`); a failure
/// only costs latency: the worker finds the task on its next heartbeat.
async fn push_task(def: TaskDef) {
    let address = def.worker_address.clone();
    let push = async {
        let ch = tonic::transport::Endpoint::from_shared(format!("http://{address}"))
            .map_err(|e| e.to_string())?
            .connect_timeout(PUSH_DEADLINE)
            .connect()
            .await
            .map_err(|e| e.to_string())?;
        worker_service_client::WorkerServiceClient::new(ch)
            .max_encoding_message_size(usize::MAX)
            .process_task(ProcessTaskRequest { task: Some(def) })
            .await
            .map_err(|e| e.to_string())
    };
    match tokio::time::timeout(PUSH_DEADLINE, push).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => tracing::debug!(worker = %address, "ProcessTask push failed: {e}"),
        Err(_) => tracing::debug!(worker = %address, "ProcessTask push timed out"),
    }
}
