//! The relay: a local proxy a stock client dials instead of a node. jaxlib
//! aborts its whole process when its connection to the service breaks, so
//! the relay keeps that connection (it runs on the client's host and shares
//! its fate) and re-issues every in-flight call to a live node when its node
//! dies. Each call carries an exactly-once origin (`x-coordstore-origin`), so
//! a re-issued call that had already been applied returns its first outcome.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use proto::xla::coordination_service_client::CoordinationServiceClient;
use proto::xla::coordination_service_server::{CoordinationService, CoordinationServiceServer};
use proto::xla::*;
use tonic::codec::CompressionEncoding;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Request, Response, Status};

use proto::ORIGIN_HEADER;

/// Relay settings.
#[derive(Clone, Debug)]
pub struct RelayConfig {
    /// Nodes to relay to (HOST:PORT), tried in turn.
    pub endpoints: Vec<String>,
    /// How long one call keeps trying nodes before it fails UNAVAILABLE.
    pub retry_for: Duration,
    /// Largest message in either direction.
    pub max_message_bytes: usize,
}

impl RelayConfig {
    /// Defaults for `endpoints`: keep trying for 10 minutes, 1 GiB messages.
    pub fn new(endpoints: Vec<String>) -> Self {
        RelayConfig {
            endpoints,
            retry_for: Duration::from_secs(600),
            max_message_bytes: 1 << 30,
        }
    }
}

/// Forwards calls to the nodes, moving to the next one when a node fails.
pub struct Relay {
    clients: Vec<CoordinationServiceClient<Channel>>,
    current: AtomicUsize,
    client_id: u64,
    seq: AtomicU64,
    retry_for: Duration,
}

/// Whether a failed call may be re-issued at another node: a transport or
/// availability failure, never a domain error (those carry a payload trailer).
pub fn is_transport_failure(s: &Status) -> bool {
    s.details().is_empty()
        && matches!(
            s.code(),
            Code::Unavailable
                | Code::Unknown
                | Code::Cancelled
                | Code::Internal
                | Code::DeadlineExceeded
        )
}

impl Relay {
    /// A relay over `cfg.endpoints` (connections are made lazily).
    pub fn new(cfg: &RelayConfig) -> Result<Arc<Relay>, String> {
        if cfg.endpoints.is_empty() {
            return Err("the relay needs at least one endpoint".into());
        }
        let mut clients = Vec::new();
        for addr in &cfg.endpoints {
            let ch = Endpoint::from_shared(format!("http://{addr}"))
                .map_err(|e| format!("bad endpoint {addr}: {e}"))?
                .connect_timeout(Duration::from_millis(500))
                .tcp_nodelay(true)
                .http2_keep_alive_interval(Duration::from_secs(2))
                .keep_alive_timeout(Duration::from_secs(2))
                .connect_lazy();
            clients.push(
                CoordinationServiceClient::new(ch)
                    .max_decoding_message_size(cfg.max_message_bytes)
                    .max_encoding_message_size(cfg.max_message_bytes),
            );
        }
        Ok(Arc::new(Relay {
            clients,
            current: AtomicUsize::new(0),
            client_id: rand::random::<u64>() >> 1,
            seq: AtomicU64::new(0),
            retry_for: cfg.retry_for,
        }))
    }

    /// Sends `msg` with `method` to the current node, moving on to the next
    /// node (same origin) after a transport failure.
    pub async fn call<M, R, F, Fut>(&self, msg: M, method: F) -> Result<Response<R>, Status>
    where
        M: Clone,
        F: Fn(CoordinationServiceClient<Channel>, Request<M>) -> Fut,
        Fut: std::future::Future<Output = Result<Response<R>, Status>>,
    {
        let origin = format!(
            "{}:{}",
            self.client_id,
            self.seq.fetch_add(1, Ordering::Relaxed) + 1
        );
        let deadline = Instant::now() + self.retry_for;
        let mut failures = 0usize;
        loop {
            let idx = self.current.load(Ordering::Relaxed) % self.clients.len();
            let mut req = Request::new(msg.clone());
            req.metadata_mut()
                .insert(ORIGIN_HEADER, origin.parse().expect("ascii digits"));
            match method(self.clients[idx].clone(), req).await {
                Err(s) if is_transport_failure(&s) && Instant::now() < deadline => {
                    tracing::debug!(node = idx, "relay: {}; trying the next node", s.message());
                    // Move on unless another call already did.
                    let _ = self.current.compare_exchange(
                        idx,
                        (idx + 1) % self.clients.len(),
                        Ordering::Relaxed,
                        Ordering::Relaxed,
                    );
                    failures += 1;
                    if failures.is_multiple_of(self.clients.len()) {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
                other => return other,
            }
        }
    }
}

/// The xla dialect served by the relay.
pub struct XlaRelay {
    relay: Arc<Relay>,
}

macro_rules! forward {
    ($($method:ident($req:ty) -> $resp:ty;)*) => {
        #[tonic::async_trait]
        impl CoordinationService for XlaRelay {
            $(
                async fn $method(&self, req: Request<$req>) -> Result<Response<$resp>, Status> {
                    self.relay
                        .call(req.into_inner(), |mut c, r| async move { c.$method(r).await })
                        .await
                }
            )*
        }
    };
}

forward! {
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

/// Serves the relay on `listen` until `shutdown` resolves.
pub async fn serve(
    listen: SocketAddr,
    cfg: RelayConfig,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), String> {
    let relay = Relay::new(&cfg)?;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| format!("cannot listen on {listen}: {e}"))?;
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    let svc = CoordinationServiceServer::new(XlaRelay { relay })
        .accept_compressed(CompressionEncoding::Gzip)
        .max_decoding_message_size(cfg.max_message_bytes)
        .max_encoding_message_size(cfg.max_message_bytes);
    tracing::info!(%listen, endpoints = ?cfg.endpoints, "coordstore relay serving");
    tonic::transport::Server::builder()
        .tcp_nodelay(true)
        .add_service(svc)
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
        .map_err(|e| format!("relay server failed: {e}"))
}
