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

use crate::areas::{
    closures::Closures, coordination::Coordination, dispatcher::Dispatcher, rendezvous::Rendezvous,
    torch::Store,
};
use crate::cli::config::ServeConfig;
use crate::core::connections::Connections;
use crate::core::namespaces::{NamespacePolicy, Namespaces};
use crate::core::{Core, LocalLeader, Parking, Router};
use crate::duties::{
    closures::ClosuresDuty, cluster::ClusterDuty, coordination::CoordinationDuty,
    dispatcher::DispatcherDuty, levels::LevelDuty, namespaces::NamespaceDuty,
    rendezvous::RendezvousDuty, LeaderRuntime,
};
use crate::ops::http;
use crate::ops::metrics::{GrpcMetricsLayer, Metrics};
use crate::ports;
use crate::wire::context::{PeerPort, Tag};
use crate::wire::listener;
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

/// Refuses to start on a disk below the reserve (`--disk-reserve-bytes`):
/// a node that would fill its disk at once should not join the quorum.
/// The data dir (or the directory that will hold it) is what is measured.
pub fn check_disk(cfg: &ServeConfig) -> Result<(), String> {
    let reserve = cfg.raft.disk_reserve_bytes;
    if reserve == 0 {
        return Ok(());
    }
    let at = cfg
        .data_dir
        .ancestors()
        .find(|p| p.exists())
        .unwrap_or(std::path::Path::new("."));
    let free = match storage::health::free_bytes(at) {
        Ok(f) => f,
        Err(e) => {
            tracing::warn!("cannot read the free space under {}: {e}", at.display());
            return Ok(());
        }
    };
    if free >= reserve {
        return Ok(());
    }
    Err(format!(
        "the disk of the data dir {} has {free} bytes free, below the reserve of {reserve} \
         (--disk-reserve-bytes): free space (or lower the reserve) and start the node again",
        cfg.data_dir.display()
    ))
}

/// A listener on `addr` with an accept queue of `backlog`, if one is asked
/// for.
async fn bind_optional(
    addr: &Option<String>,
    backlog: u32,
) -> Result<Option<tokio::net::TcpListener>, ServeError> {
    let Some(a) = addr else {
        return Ok(None);
    };
    listener::bind_named(a, backlog)
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

/// What a node listens on: the main port, the peer port and the metrics
/// listener (both if asked for), bound before anything else starts.
struct Listeners {
    main: tokio::net::TcpListener,
    addr: SocketAddr,
    peers: Option<tokio::net::TcpListener>,
    metrics: Option<tokio::net::TcpListener>,
}

/// Binds every listener of `cfg`.
async fn listen(cfg: &ServeConfig) -> Result<Listeners, ServeError> {
    let bind_err = |source| ServeError::Bind {
        addr: cfg.listen.clone(),
        source,
    };
    let main = listener::bind_named(&cfg.listen, cfg.listen_backlog)
        .await
        .map_err(bind_err)?;
    let addr = main.local_addr().map_err(bind_err)?;
    Ok(Listeners {
        main,
        addr,
        peers: bind_optional(&cfg.peer_listen, cfg.listen_backlog).await?,
        metrics: bind_optional(&cfg.metrics_listen, cfg.listen_backlog).await?,
    })
}

/// The node's Raft part: its storage opened, openraft started.
async fn raft_node(cfg: &ServeConfig) -> Result<Arc<RaftNode>, ServeError> {
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
    Ok(node)
}

/// The core over `node`: the router (with the leader part), the parked-call
/// engine, the admins.
fn core(cfg: &ServeConfig, node: &Arc<RaftNode>) -> Arc<Core> {
    let leader = LocalLeader::new(node.clone());
    let parking = Parking::new(node.clone()).with_max_parked_calls(cfg.max_parked_calls);
    let wait = Duration::from_millis(cfg.leader_wait_ms);
    let router = Router::new(leader, wait, cfg.max_message_bytes)
        .with_forward_attempt(Duration::from_millis(cfg.forward_attempt_ms))
        .with_slow_request(Duration::from_millis(cfg.slow_request_ms));
    log_admins(&cfg.admins);
    let core = Core::new(router, parking, wait)
        .with_admins(cfg.admins.clone())
        .with_peer_port(cfg.peer_listen.is_some());
    Arc::new(core)
}

/// The areas over `core`, the leader runtime with every duty, and the
/// namespaces (hosted on `addr`'s address).
struct Parts {
    services: ports::Services,
    namespaces: Arc<Namespaces>,
    duties: Arc<LeaderRuntime>,
}

fn parts(cfg: &ServeConfig, core: &Arc<Core>, metrics: &Arc<Metrics>, addr: SocketAddr) -> Parts {
    let coordination_duty = Arc::new(CoordinationDuty::new(cfg.tf_addresses.clone()));
    let dispatcher_duty = Arc::new(DispatcherDuty::new(cfg.tfdata.clone()));
    let rendezvous_duty = Arc::new(RendezvousDuty::default());
    let duties = Arc::new(LeaderRuntime::new(vec![
        Arc::new(ClusterDuty::new(cfg.coordination.clone())),
        coordination_duty.clone(),
        dispatcher_duty.clone(),
        Arc::new(ClosuresDuty),
        rendezvous_duty.clone(),
        Arc::new(NamespaceDuty),
        Arc::new(LevelDuty::default()),
    ]));
    let namespaces = Arc::new(Namespaces::new(
        core.clone(),
        NamespacePolicy {
            ports: cfg.namespace_ports,
            max_namespaces: cfg.max_namespaces,
            host: addr.ip().to_string(),
        },
    ));
    let services = ports::Services {
        coordination: Coordination::new(core.clone(), coordination_duty),
        dispatcher: Arc::new(Dispatcher::new(
            core.clone(),
            dispatcher_duty,
            cfg.tfdata.clone(),
        )),
        closures: Closures::new(core.clone()),
        rendezvous: Rendezvous::new(core.clone(), rendezvous_duty),
        max_message_bytes: cfg.max_message_bytes,
        metrics: metrics.clone(),
        tls: cfg.client_tls.clone(),
        store: Store::new(core.clone()),
        torch_plaintext: cfg.torch_plaintext,
        connections: metrics.connections().clone(),
        backlog: cfg.listen_backlog,
    };
    Parts {
        services,
        namespaces,
        duties,
    }
}

/// Serves the peer port on `listener`, with its own TLS: Raft's RPCs and
/// the Node API (calls forwarded to the leader).
fn serve_peers(
    cfg: &ServeConfig,
    node: &RaftNode,
    parts: &Parts,
    listener: tokio::net::TcpListener,
) -> Result<JoinHandle<()>, ServeError> {
    let s = &parts.services;
    let peer_tls = cfg.peer_tls.as_ref().map(|t| &t.server);
    let node_api = NodeApi::server(
        s.coordination.clone(),
        parts.namespaces.clone(),
        s.max_message_bytes,
    );
    let node_peer = NodeApi::peer_server(
        s.coordination.clone(),
        parts.namespaces.clone(),
        s.max_message_bytes,
    );
    let peers = ports::server(peer_tls)
        .map_err(ServeError::Tls)?
        .layer(GrpcMetricsLayer(s.metrics.clone()))
        .layer(Tag(PeerPort))
        .add_service(node.peer_service())
        .add_service(node_peer)
        .add_service(node_api);
    let incoming = ports::incoming(listener);
    Ok(tokio::spawn(async move {
        if let Err(e) = peers.serve_with_incoming(incoming).await {
            tracing::error!("peer port: {e}");
        }
    }))
}

/// Serves the main port on `listener` until `stop`: the client services,
/// the Node API, health, and the peer service unless peers have a port of
/// their own.
fn serve_main(
    cfg: &ServeConfig,
    node: &RaftNode,
    parts: &Parts,
    listener: tokio::net::TcpListener,
    with_peers: bool,
    stop: oneshot::Receiver<()>,
) -> Result<(MainServer, tonic_health::server::HealthReporter), ServeError> {
    let s = &parts.services;
    let (health_reporter, health) = tonic_health::server::health_reporter();
    let mut routes = s.client_routes();
    let node_api = NodeApi::server(
        s.coordination.clone(),
        parts.namespaces.clone(),
        s.max_message_bytes,
    );
    let by_audience =
        NodeApi::audience_servers(&s.coordination, &parts.namespaces, s.max_message_bytes);
    routes
        .add_service(health)
        .add_service(node_api)
        .add_service(by_audience.admin)
        .add_service(by_audience.ops)
        .add_service(by_audience.data);
    if with_peers {
        routes.add_service(NodeApi::peer_server(
            s.coordination.clone(),
            parts.namespaces.clone(),
            s.max_message_bytes,
        ));
        routes.add_service(node.peer_service());
    }
    let grpc = ports::server(cfg.client_tls.as_ref())
        .map_err(ServeError::Tls)?
        .layer(GrpcMetricsLayer(s.metrics.clone()))
        .add_routes(routes.routes());
    let (accepting, close) = s.port(journal::DEFAULT_NAMESPACE);
    let incoming = listener::incoming(listener, accepting);
    let server = tokio::spawn(grpc.serve_with_incoming_shutdown(incoming, async {
        let _ = stop.await;
        // The port closes: its TCPStore connections end too.
        drop(close);
    }));
    Ok((server, health_reporter))
}

/// The main port's server task.
type MainServer = JoinHandle<Result<(), tonic::transport::Error>>;

/// Starts a node with `cfg`: binds, opens storage and starts Raft,
/// assembles the core, the areas and their services, serves every port,
/// bootstraps the static cluster, and runs the leader runtime.
pub async fn start(cfg: ServeConfig) -> Result<RunningNode, ServeError> {
    let listeners = listen(&cfg).await?;
    let node = raft_node(&cfg).await?;
    let core = core(&cfg, &node);
    let connections = Connections::new(cfg.max_connections.0, cfg.max_connections.1);
    let metrics = Metrics::new(&core)
        .with_namespace_series(cfg.metrics_namespaces)
        .with_connections(connections);
    let metrics = Arc::new(metrics);
    let parts = parts(&cfg, &core, &metrics, listeners.addr);
    let peer_server = match listeners.peers {
        Some(l) => Some(serve_peers(&cfg, &node, &parts, l)?),
        None => None,
    };
    let (stop, stopped) = oneshot::channel::<()>();
    let (server, health) = serve_main(
        &cfg,
        &node,
        &parts,
        listeners.main,
        peer_server.is_none(),
        stopped,
    )?;
    if !cfg.join {
        if let Err(e) = node.bootstrap(&cfg.cluster).await {
            tracing::warn!("bootstrap: {e}");
        }
    }
    let mut tasks = vec![
        tokio::spawn(parts.services.store.clone().run()),
        tokio::spawn(parts.duties.run(core.router().leader().clone())),
        tokio::spawn(http::report_health(core.clone(), health)),
        tokio::spawn(ports::run(core.clone(), parts.namespaces, parts.services)),
    ];
    tasks.extend(peer_server);
    if let Some(l) = listeners.metrics {
        let core = core.clone();
        tasks.push(tokio::spawn(async move {
            if let Err(e) = http::serve_http(l, core, metrics, std::future::pending()).await {
                tracing::error!("metrics and health endpoints: {e}");
            }
        }));
    }
    Ok(RunningNode {
        core,
        addr: listeners.addr,
        stop: Some(stop),
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
