//! PyTorch's c10d TCPStore protocol (torch 2.15; `docs/pytorch.md`) on
//! every client port: the main port (the default namespace) and each
//! namespace's. The port's listener (`super::listener`) hands a connection
//! whose first byte is TCPStore's VALIDATE to [`accept`], which admits it
//! and serves it as a [`conn::Session`].
//!
//! torch's client has no TLS: on a port with TLS a plaintext TCPStore
//! connection is refused (closed at once) unless its namespace allows it
//! (`ctl ns create --torch-plaintext`, or `--torch-plaintext` for the main
//! port and the default namespace). The relay (`coordstore relay`) is the
//! way to such a cluster without that: plaintext on the host's loopback,
//! TLS upstream.

pub mod conn;
pub mod grpc;

use std::sync::Arc;

use crate::areas::torch::Store;
use crate::core::{Access, Call, CallContext};

/// What one client port serves in TCPStore's protocol.
#[derive(Clone)]
pub struct TorchPort {
    /// The store area.
    pub store: Arc<Store>,
    /// The port's namespace.
    pub namespace: String,
    /// The port has TLS: a plaintext TCPStore connection needs leave.
    pub tls: bool,
    /// Leave for the main port (`--torch-plaintext`); a namespace's port
    /// reads its namespace's setting.
    pub main_plaintext: bool,
}

impl TorchPort {
    /// What a connection here needs to be admitted: a port with TLS admits
    /// plaintext TCPStore only where its namespace lets it in.
    fn access(&self) -> Access<'static> {
        match self.tls {
            true => Access::Plaintext {
                default_leave: self.main_plaintext,
            },
            false => Access::Namespace,
        }
    }
}

/// Admits `stream`, a TCPStore connection on `torch`'s port from
/// `remote`, and serves it until it ends.
pub async fn accept<S>(stream: S, remote: Option<std::net::SocketAddr>, torch: TorchPort)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    // Admitted once, as any call: the port's namespace, a session id the
    // router draws; every request is a call made of this one.
    let core = torch.store.core();
    let call = Call::new(CallContext {
        namespace: Some(torch.namespace.clone()),
        ..Default::default()
    })
    .in_session(core.router().new_session());
    if let Err(e) = core.admit(&call, torch.access()).await {
        tracing::info!(
            namespace = torch.namespace,
            "refused a TCPStore connection: {}",
            e.into_plain_status().message()
        );
        return;
    }
    let id = call.origin().map_or(0, |o| o.client_id);
    core.store_sessions().opened(id, &torch.namespace, remote);
    // Forgotten however the connection ends (its port closing drops it).
    let _known = Known(core.clone(), id);
    serve(stream, torch.store, call).await;
}

/// A connection this node's store sessions know, forgotten when dropped.
struct Known(Arc<crate::core::Core>, u64);

impl Drop for Known {
    fn drop(&mut self) {
        self.0.store_sessions().closed(self.1);
    }
}

/// Serves one TCPStore connection, admitted as `call`, until it ends.
async fn serve<S>(stream: S, store: Arc<Store>, call: Call)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let (namespace, id) = (
        call.namespace().to_string(),
        call.origin().map_or(0, |o| o.client_id),
    );
    let ended = conn::serve(stream, store, call).await;
    tracing::debug!(
        namespace,
        connection = format!("{id:x}"),
        "TCPStore connection ended: {ended:?}"
    );
}
