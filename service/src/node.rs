//! Starting a node: bind, open storage, start Raft, assemble the core, the
//! areas and their wire services, serve every gRPC service on one port
//! (peer links on a second one with --peer-listen, each port with its own
//! TLS), bootstrap the static cluster, and run the leader runtime.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use raft::{NodeConfig, RaftNode, Role, WatchReceiver};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::areas::{closures::Closures, coordination::Coordination, dispatcher::Dispatcher};
use crate::cli::config::ServeConfig;
use crate::core::call::{PeerPort, Tag};
use crate::core::namespaces::{NamespacePolicy, Namespaces};
use crate::core::{Core, LocalLeader, Parking, Router};
use crate::duties::{
    closures::ClosuresDuty, cluster::ClusterDuty, coordination::CoordinationDuty,
    dispatcher::DispatcherDuty, levels::LevelDuty, namespaces::NamespaceDuty, LeaderRuntime,
};
use crate::ops::http;
use crate::ops::metrics::{GrpcMetricsLayer, Metrics};
use crate::ports;
use crate::wire::node::NodeApi;

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
    /// A TLS configuration tonic refused.
    #[error("TLS: {0}")]
    Tls(tonic::transport::Error),
}

/// A listener on `addr`, if one is asked for.
async fn bind_optional(
    addr: &Option<String>,
) -> Result<Option<tokio::net::TcpListener>, ServeError> {
    let Some(a) = addr else {
        return Ok(None);
    };
    tokio::net::TcpListener::bind(a)
        .await
        .map(Some)
        .map_err(|source| ServeError::Bind {
            addr: a.clone(),
            source,
        })
}

/// Says at start who may run the cluster's verbs, when calls have an
/// identity (client certificates required).
fn log_admins(admins: &crate::core::Admins) {
    if !admins.identities {
        return;
    }
    if admins.names.is_empty() {
        tracing::info!(
            "mutual TLS and no --admin-client-name: no client may run a cluster verb \
             (namespace create, delete, reset, export, import; reset-job; snapshot save; \
             member add, remove); name the operators' certificates with --admin-client-name"
        );
    } else {
        tracing::info!(
            admins = ?admins.names,
            "mutual TLS: the cluster verbs admit only client certificates named {:?}",
            admins.names
        );
    }
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
    let peer_listener = bind_optional(&cfg.peer_listen).await?;
    let node = RaftNode::start(NodeConfig {
        node_id: cfg.node_id,
        address: cfg.advertise.clone(),
        data_dir: cfg.data_dir.clone(),
        cluster_id: cfg.cluster_id.clone(),
        cache_bytes: cfg.cache_bytes,
        settings: cfg.raft.clone(),
        peer_overrides: cfg.peer_overrides.clone(),
        peer_token: cfg.peer_token.clone(),
        peer_tls: cfg.peer_tls.as_ref().map(|t| t.client.clone()),
    })
    .await?;
    crate::ops::logs::set_node(node.clone());
    let leader = LocalLeader::new(node.clone());
    let coordination_duty = Arc::new(CoordinationDuty::new(cfg.tf_addresses.clone()));
    let dispatcher_duty = Arc::new(DispatcherDuty::new(cfg.tfdata.clone()));
    let duties = Arc::new(LeaderRuntime::new(vec![
        Arc::new(ClusterDuty::new(cfg.coordination.clone())),
        coordination_duty.clone(),
        dispatcher_duty.clone(),
        Arc::new(ClosuresDuty),
        Arc::new(NamespaceDuty),
        Arc::new(LevelDuty::default()),
    ]));
    let parking = Parking::new(node.clone()).with_max_parked_calls(cfg.max_parked_calls);
    let router = Router::new(
        leader.clone(),
        Duration::from_millis(cfg.leader_wait_ms),
        cfg.max_message_bytes,
    )
    .with_slow_request(Duration::from_millis(cfg.slow_request_ms));
    log_admins(&cfg.admins);
    let core = Arc::new(
        Core::new(router, parking, Duration::from_millis(cfg.leader_wait_ms))
            .with_admins(cfg.admins.clone()),
    );
    let metrics = Arc::new(Metrics::new(&core).with_namespace_series(cfg.metrics_namespaces));
    let metrics_listener = bind_optional(&cfg.metrics_listen).await?;

    let coordination = Coordination::new(core.clone(), coordination_duty);
    let dispatcher = Arc::new(Dispatcher::new(
        core.clone(),
        dispatcher_duty,
        cfg.tfdata.clone(),
    ));
    let closures = Closures::new(core.clone());
    let max = cfg.max_message_bytes;
    let namespaces = Arc::new(Namespaces::new(
        core.clone(),
        NamespacePolicy {
            ports: cfg.namespace_ports,
            max_namespaces: cfg.max_namespaces,
            host: addr.ip().to_string(),
        },
    ));
    let ports = ports::Services {
        coordination: coordination.clone(),
        dispatcher: dispatcher.clone(),
        closures: closures.clone(),
        max_message_bytes: max,
        metrics: metrics.clone(),
        tls: cfg.client_tls.clone(),
    };
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let (health_reporter, health) = tonic_health::server::health_reporter();
    let builder = ports::server(cfg.client_tls.as_ref()).map_err(ServeError::Tls)?;
    // Peer links on their own port, with their own TLS, when asked for.
    let peer_server = match peer_listener {
        None => None,
        Some(l) => {
            let peer_tls = cfg.peer_tls.as_ref().map(|t| &t.server);
            let peers = ports::server(peer_tls)
                .map_err(ServeError::Tls)?
                .layer(GrpcMetricsLayer(metrics.clone()))
                .layer(Tag(PeerPort))
                .add_service(node.peer_service())
                .add_service(NodeApi::server(
                    coordination.clone(),
                    namespaces.clone(),
                    max,
                ));
            let incoming = ports::incoming(l);
            Some(tokio::spawn(async move {
                if let Err(e) = peers.serve_with_incoming(incoming).await {
                    tracing::error!("peer port: {e}");
                }
            }))
        }
    };
    // The main port: the client services, the Node API, health, and the
    // peer service unless peers have a port of their own.
    let mut routes = ports.client_routes();
    routes.add_service(health).add_service(NodeApi::server(
        coordination.clone(),
        namespaces.clone(),
        max,
    ));
    if peer_server.is_none() {
        routes.add_service(node.peer_service());
    }
    let grpc = builder
        .layer(GrpcMetricsLayer(metrics.clone()))
        .add_routes(routes.routes());
    let incoming = ports::incoming(listener);
    let server = tokio::spawn(grpc.serve_with_incoming_shutdown(incoming, async {
        let _ = stop_rx.await;
    }));

    if !cfg.join {
        if let Err(e) = node.bootstrap(&cfg.cluster).await {
            tracing::warn!("bootstrap: {e}");
        }
    }
    let mut tasks = vec![
        tokio::spawn(duties.run(leader)),
        tokio::spawn(http::report_health(core.clone(), health_reporter)),
        tokio::spawn(ports::run(core.clone(), namespaces, ports)),
    ];
    tasks.extend(peer_server);
    if let Some(l) = metrics_listener {
        let (core, metrics) = (core.clone(), metrics.clone());
        tasks.push(tokio::spawn(async move {
            if let Err(e) = http::serve_http(l, core, metrics, std::future::pending()).await {
                tracing::error!("metrics and health endpoints: {e}");
            }
        }));
    }
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
    while metrics.borrow_watched().current_leader.is_none() {
        if tokio::time::timeout_at(deadline, metrics.changed())
            .await
            .is_err()
        {
            break;
        }
    }
    node.role()
}
