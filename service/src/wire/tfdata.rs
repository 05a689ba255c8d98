//! `tensorflow.data.DispatcherService`, the tf.data service dispatcher as
//! TensorFlow 2.21 workers and clients dial it (`docs/protocols.md`, tf.data
//! dispatcher (TF 2.21)).
//! GetVersion and GetDataServiceConfig are answered by any node; every
//! other call runs on the leader (a follower forwards the whole call there,
//! see `Dispatcher::on_leader`). Distributed snapshots are UNIMPLEMENTED.

use std::sync::Arc;

use proto::tfdata::dispatcher_service_server::{DispatcherService, DispatcherServiceServer};
use proto::tfdata::*;
use tonic::{Request, Response, Status};

use crate::areas::dispatcher::Dispatcher;
use crate::core::Call;

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

/// Writes the service: a row per call run on the leader — the area's method
/// of the same name here, the same call of the leader's dispatcher from a
/// follower — marked `write` when it may change state (it then carries one
/// origin in every attempt) or `read`; then the calls any node answers.
macro_rules! on_leader {
    ($($method:ident($req:ty) -> $resp:ty, $kind:ident;)* { $($more:tt)* }) => {
        #[tonic::async_trait]
        impl DispatcherService for TfDataService {
            $(
                async fn $method(&self, req: Request<$req>) -> Result<Response<$resp>, Status> {
                    let c = Call::from_request(&req)?;
                    let local = |d: Arc<Dispatcher>, c: Call, r| async move { d.$method(&c, r).await };
                    let remote = |mut leader: DispatcherClient, r| async move { leader.$method(r).await };
                    let kind = stringify!($kind) == "write";
                    self.d.on_leader(&c, kind, req.into_inner(), local, remote).await.map(Response::new)
                }
            )*
            $($more)*
        }
    };
}

type DispatcherClient =
    dispatcher_service_client::DispatcherServiceClient<tonic::transport::Channel>;

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
