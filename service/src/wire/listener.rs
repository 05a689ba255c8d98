//! Every client port's listener (the main port and each namespace's): it
//! binds with a deep accept queue, accepts, holds each connection to the
//! node's and the port's namespace's connection bounds, and sorts it by its
//! first byte — HTTP/2's preface (`P`) or a TLS ClientHello (`0x16`) goes to
//! the port's gRPC server, TCPStore's VALIDATE (`0x00`) to a TCPStore
//! session ([`super::torch`]) — so a job has one address for every
//! framework. When the port closes, every TCPStore connection on it ends
//! (the gRPC server ends its own).

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;

use super::torch::TorchPort;
use crate::core::connections::{Connections, Held};

/// The first byte of a TCPStore connection (its VALIDATE).
const TORCH_FIRST_BYTE: u8 = 0;
/// Accepted gRPC connections not yet taken by the server.
const HANDOFF: usize = 1024;
/// The least accept queue a port is bound with: a job of thousands of
/// ranks connects at once, and a connection the queue drops waits out a
/// 1 s SYN retry.
pub const MIN_BACKLOG: u32 = 4096;

/// The accept queue ports are bound with by default: the system's
/// `net.core.somaxconn` (which caps what `listen` asks for), and at least
/// [`MIN_BACKLOG`].
pub fn default_backlog() -> u32 {
    std::fs::read_to_string("/proc/sys/net/core/somaxconn")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(MIN_BACKLOG)
        .max(MIN_BACKLOG)
}

/// A listener on `addr` with an accept queue of `backlog` (the kernel caps
/// it at `net.core.somaxconn`).
pub fn bind(addr: SocketAddr, backlog: u32) -> std::io::Result<TcpListener> {
    let socket = match addr {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(backlog)
}

/// [`bind`] of a `HOST:PORT` (the first address it resolves to).
pub async fn bind_named(addr: &str, backlog: u32) -> std::io::Result<TcpListener> {
    let mut last = None;
    for a in tokio::net::lookup_host(addr).await? {
        match bind(a, backlog) {
            Ok(l) => return Ok(l),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other(format!("{addr} resolves to no address"))))
}

/// An accepted connection holding its place for as long as it is open.
pub struct Conn {
    stream: TcpStream,
    _held: Held,
}

impl AsyncRead for Conn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

impl tonic::transport::server::Connected for Conn {
    type ConnectInfo = <TcpStream as tonic::transport::server::Connected>::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.stream.connect_info()
    }
}

/// What one port's listener needs beside its socket.
#[derive(Clone)]
pub struct Port {
    /// What the port serves in TCPStore's protocol (its namespace).
    pub torch: TorchPort,
    /// The node's connection bounds.
    pub connections: Arc<Connections>,
    /// Changes when the port closes: every TCPStore connection on it ends.
    pub closed: watch::Receiver<()>,
}

/// The connections `listener` accepts that are not TCPStore's, Nagle off,
/// for the port's gRPC server; TCPStore connections are served here.
/// A connection past a bound is closed at once (logged once a second at
/// most; counted in the metrics). Accepting stops when the gRPC server
/// drops the stream.
pub fn incoming(listener: TcpListener, port: Port) -> ReceiverStream<std::io::Result<Conn>> {
    let (tx, rx) = mpsc::channel(HANDOFF);
    tokio::spawn(async move {
        let mut said = None::<tokio::time::Instant>;
        loop {
            let accepted = tokio::select! {
                () = tx.closed() => return,
                a = listener.accept() => a,
            };
            let stream = match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    tracing::debug!("accept: {e}");
                    if tx.send(Err(e)).await.is_err() {
                        return;
                    }
                    continue;
                }
            };
            let held = match port.connections.hold(&port.torch.namespace) {
                Ok(h) => h,
                Err(why) => {
                    if said.is_none_or(|t| t.elapsed() >= std::time::Duration::from_secs(1)) {
                        tracing::warn!(peer = ?stream.peer_addr().ok(), "refused a connection: {why}");
                        said = Some(tokio::time::Instant::now());
                    }
                    continue;
                }
            };
            let _ = stream.set_nodelay(true);
            let conn = Conn {
                stream,
                _held: held,
            };
            tokio::spawn(split(conn, tx.clone(), port.clone()));
        }
    });
    ReceiverStream::new(rx)
}

/// Hands `conn` to gRPC or serves it as a TCPStore connection, by its
/// first byte, until the port closes.
async fn split(conn: Conn, grpc: mpsc::Sender<std::io::Result<Conn>>, mut port: Port) {
    let mut first = [0u8; 1];
    match conn.stream.peek(&mut first).await {
        Ok(1) if first[0] == TORCH_FIRST_BYTE => {}
        // gRPC (or whatever it is: the gRPC server answers it).
        Ok(_) => {
            let _ = grpc.send(Ok(conn)).await;
            return;
        }
        Err(_) => return,
    }
    let remote = conn.stream.peer_addr().ok();
    tokio::select! {
        () = super::torch::accept(conn, remote, port.torch) => {}
        _ = port.closed.changed() => {}
    }
}
