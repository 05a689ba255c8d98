//! PyTorch's c10d TCPStore protocol (torch 2.15; `docs/pytorch.md`) on
//! every client port: the main port (the default namespace) and each
//! namespace's. A connection is told apart by its first byte — HTTP/2's
//! preface (`P`) or a TLS ClientHello (`0x16`) goes to gRPC, TCPStore's
//! VALIDATE (`0x00`) to a [`conn::Session`] — so a job has one address for
//! every framework.
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

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::areas::torch::Store;
use crate::core::{Access, Call, CallContext};

/// The first byte of a TCPStore connection (its VALIDATE).
const TORCH_FIRST_BYTE: u8 = 0;
/// Accepted gRPC connections not yet taken by the server.
const BACKLOG: usize = 1024;

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

/// The connections `listener` accepts that are not TCPStore's, Nagle off,
/// for the port's gRPC server; TCPStore connections are served here, by
/// `torch`. Accepting stops when the gRPC server drops the stream.
pub fn incoming(
    listener: TcpListener,
    torch: TorchPort,
) -> ReceiverStream<std::io::Result<TcpStream>> {
    let (tx, rx) = mpsc::channel(BACKLOG);
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                () = tx.closed() => return,
                a = listener.accept() => a,
            };
            match accepted {
                Ok((stream, _)) => {
                    let _ = stream.set_nodelay(true);
                    let (tx, torch) = (tx.clone(), torch.clone());
                    tokio::spawn(split(stream, tx, torch));
                }
                Err(e) => {
                    tracing::debug!("accept: {e}");
                    if tx.send(Err(e)).await.is_err() {
                        return;
                    }
                }
            }
        }
    });
    ReceiverStream::new(rx)
}

/// Hands `stream` to gRPC or serves it as a TCPStore connection, by its
/// first byte.
async fn split(
    stream: TcpStream,
    grpc: mpsc::Sender<std::io::Result<TcpStream>>,
    torch: TorchPort,
) {
    let mut first = [0u8; 1];
    match stream.peek(&mut first).await {
        Ok(1) if first[0] == TORCH_FIRST_BYTE => {}
        // gRPC (or whatever it is: the gRPC server answers it).
        Ok(_) => {
            let _ = grpc.send(Ok(stream)).await;
            return;
        }
        Err(_) => return,
    }
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
            peer = ?stream.peer_addr().ok(),
            "refused a TCPStore connection: {}",
            e.into_plain_status().message()
        );
        return;
    }
    serve(stream, torch.store, call).await;
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
