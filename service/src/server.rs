//! Starting a node: bind, open storage, start Raft, serve every gRPC service
//! on one port, bootstrap the static cluster, and run the leader runtime.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use journal::pb::{update::Command, InitService};
use journal::Update;
use raft::{NodeConfig, RaftNode, Role};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::agent_api::AgentApi;
use crate::config::ServeConfig;
use crate::coord::Coordination;
use crate::core::Core;
use crate::dialect::{tf::TfService, xla::XlaService};
use crate::node_api::NodeApi;

/// A running node.
pub struct RunningNode {
    /// The core (tests and the binary use it).
    pub core: Arc<Core>,
    /// The bound address.
    pub addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    server: JoinHandle<Result<(), tonic::transport::Error>>,
    tasks: Vec<JoinHandle<()>>,
}

/// Why a node could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The listen address cannot be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: String,
        /// The error.
        source: std::io::Error,
    },
    /// Storage or Raft refused to start.
    #[error(transparent)]
    Start(#[from] raft::StartError),
}

/// Starts a node with `cfg`.
pub async fn start(cfg: ServeConfig) -> Result<RunningNode, ServeError> {
    let listener = tokio::net::TcpListener::bind(&cfg.listen)
        .await
        .map_err(|source| ServeError::Bind {
            addr: cfg.listen.clone(),
            source,
        })?;
    let addr = listener.local_addr().map_err(|source| ServeError::Bind {
        addr: cfg.listen.clone(),
        source,
    })?;
    let node = RaftNode::start(NodeConfig {
        node_id: cfg.node_id,
        address: cfg.advertise.clone(),
        data_dir: cfg.data_dir.clone(),
        cluster_id: cfg.cluster_id.clone(),
        cache_bytes: cfg.cache_bytes,
        settings: cfg.raft.clone(),
        peer_overrides: cfg.peer_overrides.clone(),
        peer_token: cfg.peer_token.clone(),
    })
    .await?;
    let core = Arc::new(
        Core::new(
            node.clone(),
            Duration::from_millis(cfg.leader_wait_ms),
            cfg.max_message_bytes,
        )
        .with_tf_addresses(cfg.tf_addresses.clone())
        .with_max_parked_calls(cfg.max_parked_calls),
    );

    let coord = Coordination::new(core.clone(), Duration::from_millis(cfg.leader_wait_ms));
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let router = tonic::transport::Server::builder()
        .tcp_nodelay(true)
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .add_service(node.peer_service())
        .add_service(NodeApi::server(core.clone(), cfg.max_message_bytes))
        .add_service(XlaService::server(coord.clone(), cfg.max_message_bytes))
        .add_service(TfService::server(coord.clone(), cfg.max_message_bytes))
        .add_service(AgentApi::server(coord, cfg.max_message_bytes));
    // Nagle off on accepted connections (tonic's own setting only covers the
    // listeners it binds itself): small replies must not wait for ACKs.
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    let server = tokio::spawn(router.serve_with_incoming_shutdown(incoming, async {
        let _ = stop_rx.await;
    }));

    if !cfg.join {
        if let Err(e) = node.bootstrap(&cfg.cluster).await {
            tracing::warn!("bootstrap: {e}");
        }
    }
    let tasks = vec![
        tokio::spawn(init_service_when_leader(core.clone(), cfg.clone())),
        tokio::spawn(core.runtime().clone().run(core.clone())),
        tokio::spawn(crate::wake::run_key_wakeups(core.clone())),
    ];
    Ok(RunningNode {
        core,
        addr,
        stop: Some(stop_tx),
        server,
        tasks,
    })
}

impl RunningNode {
    /// Stops serving and shuts Raft down.
    pub async fn stop(mut self) {
        for t in &self.tasks {
            t.abort();
        }
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        self.core.node().shutdown().await;
        let _ = (&mut self.server).await;
    }
}

/// Waits until a leader is known (or `wait` passes) and returns this node's role.
pub async fn settle(node: &RaftNode, wait: Duration) -> Role {
    let deadline = tokio::time::Instant::now() + wait;
    let mut metrics = node.raft().metrics();
    while metrics.borrow().current_leader.is_none() {
        if tokio::time::timeout_at(deadline, metrics.changed())
            .await
            .is_err()
        {
            break;
        }
    }
    node.role()
}

/// Leader runtime, first duty: the first leader of a fresh cluster configures
/// the service and draws its incarnation (kept by every later leader).
async fn init_service_when_leader(core: Arc<Core>, cfg: ServeConfig) {
    let mut metrics = core.node().raft().metrics();
    loop {
        let leader = metrics.borrow().current_leader == Some(core.node().id());
        if leader && !core.node().state().read(|s| s.is_initialized()) {
            let update = Update {
                command: Some(Command::InitService(InitService {
                    config: Some(cfg.coordination.clone()),
                    service_incarnation: rand::random(),
                })),
                ..Default::default()
            };
            match core.propose(update, false).await {
                Ok(a) => {
                    if let Some(e) = a.outcome.error {
                        tracing::warn!(
                            "the replicated configuration differs from this node's flags: {}",
                            e.message
                        );
                    }
                }
                Err(e) => tracing::warn!("configuring the service failed (will retry): {e}"),
            }
            continue;
        }
        if metrics.changed().await.is_err() {
            return;
        }
    }
}
