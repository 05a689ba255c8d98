//! The relay: a local proxy a stock client dials instead of a node. jaxlib
//! aborts its whole process when its connection to the service breaks, so
//! the relay keeps that connection (it runs on the client's host and shares
//! its fate) and re-issues every in-flight call to a live node when its node
//! dies. Each call carries an exactly-once origin (`x-coordstore-origin`), so
//! a re-issued call that had already been applied returns its first outcome.
//! Every dialect is relayed on the one port: what jaxlib dials
//! (`xla.coordination`), what TensorFlow tasks dial (`tensorflow`), what
//! tf.data service workers and clients dial (`tensorflow.data`), and
//! PyTorch's TCPStore protocol (told apart by the connection's first byte,
//! as on a node; see [`crate::torch`]).

use std::net::SocketAddr;
use std::time::Duration;

use proto::{tf, tfdata, xla};
use tonic::codec::CompressionEncoding;
use tonic::{Request, Response, Status};

use crate::endpoints::Endpoints;

/// Relay settings.
#[derive(Clone, Debug)]
pub struct RelayConfig {
    /// Nodes to relay to (HOST:PORT), tried in turn.
    pub endpoints: Vec<String>,
    /// How long one call keeps trying nodes before it fails UNAVAILABLE.
    pub retry_for: Duration,
    /// Largest message in either direction.
    pub max_message_bytes: usize,
    /// Dial the nodes over TLS with this; None: plaintext. The relay's own
    /// port stays plaintext: keep it on the client's host, the TLS end.
    pub tls: Option<tonic::transport::ClientTlsConfig>,
    /// Every relayed call acts in this namespace (the nodes' main port,
    /// header `x-coordstore-namespace`); None: the default one.
    pub namespace: Option<String>,
}

impl RelayConfig {
    /// Defaults for `endpoints`: keep trying for 10 minutes, 1 GiB messages.
    pub fn new(endpoints: Vec<String>) -> Self {
        RelayConfig {
            endpoints,
            retry_for: Duration::from_secs(600),
            max_message_bytes: 1 << 30,
            tls: None,
            namespace: None,
        }
    }
}

/// The xla dialect served by the relay.
pub struct XlaRelay {
    nodes: Endpoints,
    max_message_bytes: usize,
}

/// The tensorflow dialect served by the relay.
pub struct TfRelay {
    nodes: Endpoints,
    max_message_bytes: usize,
}

macro_rules! forward {
    ($relay:ident, $dialect:ident, $($method:ident($req:ident) -> $resp:ident;)*) => {
        forward! { $relay, $dialect,
            $dialect::coordination_service_server::CoordinationService,
            $dialect::coordination_service_client::CoordinationServiceClient<tonic::transport::Channel>,
            $($method($req) -> $resp;)*
        }
    };
    ($relay:ident, $dialect:ident, $server:path, $client:ty, $($method:ident($req:ident) -> $resp:ident;)*) => {
        #[tonic::async_trait]
        impl $server for $relay {
            $(
                async fn $method(
                    &self,
                    req: Request<$dialect::$req>,
                ) -> Result<Response<$dialect::$resp>, Status> {
                    let max = self.max_message_bytes;
                    self.nodes
                        .call(req.into_inner(), |ch, r| async move {
                            <$client>::new(ch)
                                .max_decoding_message_size(max)
                                .max_encoding_message_size(max)
                                .$method(r)
                                .await
                        })
                        .await
                        .map(Response::new)
                }
            )*
        }
    };
}

forward! { XlaRelay, xla,
    register_task(RegisterTaskRequest) -> RegisterTaskResponse;
    heartbeat(HeartbeatRequest) -> HeartbeatResponse;
    shutdown_task(ShutdownTaskRequest) -> ShutdownTaskResponse;
    watch_tasks(WatchTasksRequest) -> WatchTasksResponse;
    insert_key_value(InsertKeyValueRequest) -> InsertKeyValueResponse;
    get_key_value(GetKeyValueRequest) -> GetKeyValueResponse;
    try_get_key_value(TryGetKeyValueRequest) -> TryGetKeyValueResponse;
    increment_key_value(IncrementKeyValueRequest) -> IncrementKeyValueResponse;
    get_key_value_dir(GetKeyValueDirRequest) -> GetKeyValueDirResponse;
    delete_key_value(DeleteKeyValueRequest) -> DeleteKeyValueResponse;
    barrier(BarrierRequest) -> BarrierResponse;
    cancel_barrier(CancelBarrierRequest) -> CancelBarrierResponse;
    get_alive_tasks(GetAliveTasksRequest) -> GetAliveTasksResponse;
    poll_for_error(PollForErrorRequest) -> PollForErrorResponse;
    report_error_to_service(ReportErrorToServiceRequest) -> ReportErrorToServiceResponse;
}

forward! { TfRelay, tf,
    register_task(RegisterTaskRequest) -> RegisterTaskResponse;
    heartbeat(HeartbeatRequest) -> HeartbeatResponse;
    wait_for_all_tasks(WaitForAllTasksRequest) -> WaitForAllTasksResponse;
    shutdown_task(ShutdownTaskRequest) -> ShutdownTaskResponse;
    reset_task(ResetTaskRequest) -> ResetTaskResponse;
    report_error_to_task(ReportErrorToTaskRequest) -> ReportErrorToTaskResponse;
    report_error_to_service(ReportErrorToServiceRequest) -> ReportErrorToServiceResponse;
    get_task_state(GetTaskStateRequest) -> GetTaskStateResponse;
    insert_key_value(InsertKeyValueRequest) -> InsertKeyValueResponse;
    get_key_value(GetKeyValueRequest) -> GetKeyValueResponse;
    try_get_key_value(TryGetKeyValueRequest) -> TryGetKeyValueResponse;
    get_key_value_dir(GetKeyValueDirRequest) -> GetKeyValueDirResponse;
    delete_key_value(DeleteKeyValueRequest) -> DeleteKeyValueResponse;
    barrier(BarrierRequest) -> BarrierResponse;
    cancel_barrier(CancelBarrierRequest) -> CancelBarrierResponse;
    poll_for_error(PollForErrorRequest) -> PollForErrorResponse;
}

/// The tf.data dispatcher dialect served by the relay. GetVersion and
/// GetDataServiceConfig are relayed too: any node answers them.
pub struct TfDataRelay {
    nodes: Endpoints,
    max_message_bytes: usize,
}

forward! { TfDataRelay, tfdata,
    tfdata::dispatcher_service_server::DispatcherService,
    tfdata::dispatcher_service_client::DispatcherServiceClient<tonic::transport::Channel>,
    worker_heartbeat(WorkerHeartbeatRequest) -> WorkerHeartbeatResponse;
    worker_update(WorkerUpdateRequest) -> WorkerUpdateResponse;
    get_dataset_def(GetDatasetDefRequest) -> GetDatasetDefResponse;
    get_split(GetSplitRequest) -> GetSplitResponse;
    get_version(GetVersionRequest) -> GetVersionResponse;
    get_or_register_dataset(GetOrRegisterDatasetRequest) -> GetOrRegisterDatasetResponse;
    get_or_create_job(GetOrCreateJobRequest) -> GetOrCreateJobResponse;
    get_or_create_iteration(GetOrCreateIterationRequest) -> GetOrCreateIterationResponse;
    maybe_remove_task(MaybeRemoveTaskRequest) -> MaybeRemoveTaskResponse;
    release_iteration_client(ReleaseIterationClientRequest) -> ReleaseIterationClientResponse;
    client_heartbeat(ClientHeartbeatRequest) -> ClientHeartbeatResponse;
    get_workers(GetWorkersRequest) -> GetWorkersResponse;
    get_data_service_metadata(GetDataServiceMetadataRequest) -> GetDataServiceMetadataResponse;
    get_data_service_config(GetDataServiceConfigRequest) -> GetDataServiceConfigResponse;
    snapshot(SnapshotRequest) -> SnapshotResponse;
    get_snapshot_split(GetSnapshotSplitRequest) -> GetSnapshotSplitResponse;
    get_snapshot_streams(GetSnapshotStreamsRequest) -> GetSnapshotStreamsResponse;
    disable_compression_at_runtime(DisableCompressionAtRuntimeRequest) -> DisableCompressionAtRuntimeResponse;
}

/// The connections `listener` accepts, Nagle off: TCPStore connections are
/// relayed by [`crate::torch::relay`], the others go to the gRPC server.
/// Accepting stops when the server drops the stream.
fn split_torch(
    listener: tokio::net::TcpListener,
    nodes: Endpoints,
    max_message_bytes: usize,
) -> tokio_stream::wrappers::ReceiverStream<std::io::Result<tokio::net::TcpStream>> {
    let (tx, rx) = tokio::sync::mpsc::channel(1024);
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                () = tx.closed() => return,
                a = listener.accept() => a,
            };
            match accepted {
                Ok((stream, _)) => {
                    let _ = stream.set_nodelay(true);
                    let split =
                        crate::torch::split(stream, tx.clone(), nodes.clone(), max_message_bytes);
                    tokio::spawn(split);
                }
                Err(e) => {
                    if tx.send(Err(e)).await.is_err() {
                        return;
                    }
                }
            }
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

/// Serves the relay on `listen` until `shutdown` resolves.
pub async fn serve(
    listen: SocketAddr,
    cfg: RelayConfig,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), String> {
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| format!("cannot listen on {listen}: {e}"))?;
    serve_on(listener, cfg, shutdown).await
}

/// [`serve`] on a listener bound already (port 0, say: its
/// `local_addr` is the port the relay serves on) until `shutdown` resolves.
pub async fn serve_on(
    listener: tokio::net::TcpListener,
    cfg: RelayConfig,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), String> {
    let nodes = Endpoints::with_tls(&cfg.endpoints, cfg.retry_for, cfg.tls.clone())?
        .in_namespace(cfg.namespace.as_deref())?;
    let listen = listener
        .local_addr()
        .map_err(|e| format!("the relay's listener: {e}"))?;
    let incoming = split_torch(listener, nodes.clone(), cfg.max_message_bytes);
    let svc = xla::coordination_service_server::CoordinationServiceServer::new(XlaRelay {
        nodes: nodes.clone(),
        max_message_bytes: cfg.max_message_bytes,
    })
    .accept_compressed(CompressionEncoding::Gzip)
    .max_decoding_message_size(cfg.max_message_bytes)
    .max_encoding_message_size(cfg.max_message_bytes);
    let tfdata_svc = tfdata::dispatcher_service_server::DispatcherServiceServer::new(TfDataRelay {
        nodes: nodes.clone(),
        max_message_bytes: cfg.max_message_bytes,
    })
    .max_decoding_message_size(cfg.max_message_bytes)
    .max_encoding_message_size(cfg.max_message_bytes);
    let tf_svc = tf::coordination_service_server::CoordinationServiceServer::new(TfRelay {
        nodes,
        max_message_bytes: cfg.max_message_bytes,
    })
    .accept_compressed(CompressionEncoding::Gzip)
    .max_decoding_message_size(cfg.max_message_bytes)
    .max_encoding_message_size(cfg.max_message_bytes);
    tracing::info!(%listen, endpoints = ?cfg.endpoints, "coordstore relay serving");
    tonic::transport::Server::builder()
        .tcp_nodelay(true)
        .add_service(svc)
        .add_service(tf_svc)
        .add_service(tfdata_svc)
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
        .map_err(|e| format!("relay server failed: {e}"))
}
