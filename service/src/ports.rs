//! Every namespace's port on this node. A namespace's port is part of the
//! replicated state, so every node serves it: a node opens the listener
//! when the create is applied, closes it when the delete is applied, and
//! opens them all again after a restart (the state holds them). A port this
//! node cannot bind (another process holds it) is retried every few seconds
//! and reported by `ctl ns get` on this node. A namespace port serves the
//! same services and TLS as the main port, each call in the port's
//! namespace whatever header it sets.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use crate::areas::{
    closures::Closures, coordination::Coordination, dispatcher::Dispatcher, rendezvous::Rendezvous,
    torch::Store,
};
use crate::core::connections::Connections;
use crate::core::namespaces::Namespaces;
use crate::core::Core;
use crate::ops::metrics::{GrpcMetricsLayer, Metrics};
use crate::wire::context::{PortNamespace, Tag};
use crate::wire::listener;
use crate::wire::torch::{grpc::TorchApi, TorchPort};
use crate::wire::{
    agent::AgentApi, closures::ClosureApi, rendezvous::RendezvousApi, tf::TfService,
    tfdata::TfDataService, xla::XlaService,
};

/// How often a port that could not be bound is tried again.
const RETRY_BIND: Duration = Duration::from_secs(2);
/// How long a closed port's connections may finish their calls.
const CLOSE_GRACE: Duration = Duration::from_secs(1);

/// What a namespace port serves.
#[derive(Clone)]
pub struct Services {
    /// The coordination area (xla, tf, agent).
    pub coordination: Coordination,
    /// The tf.data dispatcher area.
    pub dispatcher: Arc<Dispatcher>,
    /// The closure queue area.
    pub closures: Closures,
    /// torchrun's rendezvous.
    pub rendezvous: Rendezvous,
    /// The node's message limit.
    pub max_message_bytes: usize,
    /// The node's metrics.
    pub metrics: Arc<Metrics>,
    /// The client port's TLS.
    pub tls: Option<tonic::transport::ServerTlsConfig>,
    /// The PyTorch store area (TCPStore connections on the same ports).
    pub store: Arc<Store>,
    /// With TLS, whether the main port serves TCPStore in plaintext
    /// (`--torch-plaintext`).
    pub torch_plaintext: bool,
    /// The node's connection bounds.
    pub connections: Arc<Connections>,
    /// The accept queue every port is bound with.
    pub backlog: u32,
}

impl Services {
    /// The services every client port serves (the main port and each
    /// namespace's): the coordination dialects (xla, tf, agent), the
    /// tf.data dispatcher and the closure queue; the main port adds its own.
    pub fn client_routes(&self) -> tonic::service::RoutesBuilder {
        let max = self.max_message_bytes;
        let mut routes = tonic::service::RoutesBuilder::default();
        routes
            .add_service(XlaService::server(self.coordination.clone(), max))
            .add_service(TfService::server(self.coordination.clone(), max))
            .add_service(TfDataService::server(self.dispatcher.clone(), max))
            .add_service(ClosureApi::server(self.closures.clone(), max))
            .add_service(RendezvousApi::server(self.rendezvous.clone(), max))
            .add_service(AgentApi::server(self.coordination.clone(), max))
            .add_service(TorchApi::server(self.store.clone(), max));
        routes
    }

    /// What the port of namespace `namespace` serves in TCPStore's protocol.
    pub fn torch_port(&self, namespace: &str) -> TorchPort {
        TorchPort {
            store: self.store.clone(),
            namespace: namespace.to_string(),
            tls: self.tls.is_some(),
            main_plaintext: self.torch_plaintext,
        }
    }

    /// The listener side of namespace `namespace`'s port (see
    /// [`listener::incoming`]), and what closes its TCPStore connections
    /// (a send, or its drop).
    pub fn port(&self, namespace: &str) -> (listener::Port, watch::Sender<()>) {
        let (close, closed) = watch::channel(());
        let port = listener::Port {
            torch: self.torch_port(namespace),
            connections: self.connections.clone(),
            closed,
        };
        (port, close)
    }
}

/// A gRPC server as every port of a node has it: Nagle off, HTTP/2
/// keepalives, and `tls` if given.
pub fn server(
    tls: Option<&tonic::transport::ServerTlsConfig>,
) -> Result<tonic::transport::Server, tonic::transport::Error> {
    let builder = tonic::transport::Server::builder()
        .tcp_nodelay(true)
        .http2_keepalive_interval(Some(Duration::from_secs(30)));
    match tls {
        Some(tls) => builder.tls_config(tls.clone()),
        None => Ok(builder),
    }
}

/// The connections `listener` accepts, Nagle off (tonic's own setting only
/// covers the listeners it binds itself): small replies must not wait for
/// ACKs. (A client port's listener also serves TCPStore and holds the
/// connection bounds: see [`listener::incoming`].)
pub fn incoming(listener: tokio::net::TcpListener) -> tonic::transport::server::TcpIncoming {
    tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true))
}

/// One open port.
struct Open {
    port: u32,
    stop: Option<oneshot::Sender<()>>,
    server: JoinHandle<()>,
    /// Ends its TCPStore connections (on drop).
    _close: watch::Sender<()>,
}

/// Keeps this node's namespace listeners in step with the state.
pub async fn run(core: Arc<Core>, namespaces: Arc<Namespaces>, services: Services) {
    let mut open: HashMap<String, Open> = HashMap::new();
    let wakers = core.parking().wakers().clone();
    loop {
        let changed = wakers.namespace_changes();
        let want: HashMap<String, u32> = core.state(|s| {
            s.namespaces()
                .filter_map(|n| Some((n.name().to_string(), n.spec()?.port)))
                .filter(|(_, port)| *port != 0)
                .collect()
        });
        // Closed: deleted, or moved to another port (an import).
        let gone: Vec<String> = open
            .iter()
            .filter(|(name, o)| want.get(*name) != Some(&o.port))
            .map(|(name, _)| name.clone())
            .collect();
        for name in gone {
            if let Some(o) = open.remove(&name) {
                close(o).await;
                namespaces.set_listener(&name, None);
                tracing::info!(namespace = name, "closed the namespace's port");
            }
        }
        let mut failed = false;
        for (name, port) in want {
            if open.contains_key(&name) {
                continue;
            }
            match serve(&services, &namespaces.policy().host, &name, port).await {
                Ok(o) => {
                    tracing::info!(namespace = name, port, "serving the namespace on its port");
                    namespaces.set_listener(&name, Some("serving".into()));
                    open.insert(name, o);
                }
                Err(e) => {
                    failed = true;
                    tracing::warn!(
                        namespace = name,
                        port,
                        "cannot open the namespace's port: {e}"
                    );
                    namespaces.set_listener(&name, Some(format!("not serving: {e}")));
                }
            }
        }
        if wakers.is_closed() {
            for (_, o) in open.drain() {
                close(o).await;
            }
            return;
        }
        if failed {
            let _ = tokio::time::timeout(RETRY_BIND, changed).await;
        } else {
            changed.await;
        }
    }
}

async fn close(mut o: Open) {
    if let Some(stop) = o.stop.take() {
        let _ = stop.send(());
    }
    if tokio::time::timeout(CLOSE_GRACE, &mut o.server)
        .await
        .is_err()
    {
        o.server.abort();
    }
}

/// Opens namespace `name`'s port on `host`.
async fn serve(services: &Services, host: &str, name: &str, port: u32) -> Result<Open, String> {
    let port16 = u16::try_from(port).map_err(|_| format!("port {port} is not a TCP port"))?;
    let listener = listener::bind_named(&format!("{host}:{port16}"), services.backlog)
        .await
        .map_err(|e| format!("cannot listen on {host}:{port}: {e}"))?;
    let router = server(services.tls.as_ref())
        .map_err(|e| e.to_string())?
        .layer(GrpcMetricsLayer(services.metrics.clone()))
        .layer(Tag(PortNamespace(name.to_string())))
        .add_routes(services.client_routes().routes());
    let (accepting, close) = services.port(name);
    let incoming = listener::incoming(listener, accepting);
    let (stop, stopped) = oneshot::channel::<()>();
    let label = name.to_string();
    let server = tokio::spawn(async move {
        let shutdown = async {
            let _ = stopped.await;
        };
        if let Err(e) = router
            .serve_with_incoming_shutdown(incoming, shutdown)
            .await
        {
            tracing::error!(namespace = label, "namespace port: {e}");
        }
    });
    Ok(Open {
        port,
        stop: Some(stop),
        server,
        _close: close,
    })
}
