//! PyTorch's TCPStore protocol on the client side of coordstore
//! (`docs/pytorch.md`): a small client of the protocol (tests and the
//! benchmark), and the relay's TCPStore side: it holds a stock torch
//! client's connection and sends each request to a live node over gRPC
//! (`coordstore.v1.TorchStore`) with the connection's session as the
//! origin, so the client — which never reconnects — survives the death of
//! any node, the relay's own included.

use bytes::{Buf, Bytes, BytesMut};
use proto::coordstore::torch_store_client::TorchStoreClient;
use proto::coordstore::{TorchCloseRequest, TorchRequest, TorchStopsRequest};
use proto::origin::WireOrigin;
use proto::torch::{encode, Decoder, Op, STOP_WAITING, VALIDATE_MAGIC};
pub use proto::torch::{handshake, Refused};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::endpoints::Endpoints;

/// A TCPStore client speaking the protocol as torch's does (one request at
/// a time), for tests and the benchmark.
pub struct StoreClient {
    stream: TcpStream,
    inbuf: BytesMut,
    out: BytesMut,
}

impl StoreClient {
    /// Connects to `addr` and shakes hands (VALIDATE, then PING with `nonce`).
    pub async fn connect(addr: &str, nonce: u32) -> std::io::Result<StoreClient> {
        let stream = TcpStream::connect(addr).await?;
        Self::shake(stream, nonce).await
    }

    /// [`StoreClient::connect`] from local address `from` (many clients on
    /// one host need more than one source address's ephemeral ports).
    pub async fn connect_from(
        addr: std::net::SocketAddr,
        from: std::net::IpAddr,
        nonce: u32,
    ) -> std::io::Result<StoreClient> {
        let socket = match from {
            std::net::IpAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
            std::net::IpAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
        };
        // A port still in TIME_WAIT from an earlier connection may be taken.
        socket.set_reuseaddr(true)?;
        socket.bind(std::net::SocketAddr::new(from, 0))?;
        Self::shake(socket.connect(addr).await?, nonce).await
    }

    async fn shake(stream: TcpStream, nonce: u32) -> std::io::Result<StoreClient> {
        stream.set_nodelay(true)?;
        let mut c = StoreClient {
            stream,
            inbuf: BytesMut::new(),
            out: BytesMut::new(),
        };
        c.send(&Op::Validate(VALIDATE_MAGIC)).await?;
        c.send(&Op::Ping(nonce)).await?;
        let echo = c.u32().await?;
        if echo != nonce {
            return Err(std::io::Error::other(format!(
                "PING {nonce} answered {echo}"
            )));
        }
        Ok(c)
    }

    /// Sends one request.
    pub async fn send(&mut self, op: &Op) -> std::io::Result<()> {
        self.out.clear();
        encode(op, &mut self.out);
        self.stream.write_all(&self.out).await
    }

    /// Sends raw bytes (bad input, in tests).
    pub async fn send_raw(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.stream.write_all(bytes).await
    }

    async fn fill(&mut self, n: usize) -> std::io::Result<()> {
        while self.inbuf.len() < n {
            if self.stream.read_buf(&mut self.inbuf).await? == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
        }
        Ok(())
    }

    /// Reads a one-byte reply.
    pub async fn u8(&mut self) -> std::io::Result<u8> {
        self.fill(1).await?;
        Ok(self.inbuf.get_u8())
    }

    /// Reads a u32 reply (PING's).
    pub async fn u32(&mut self) -> std::io::Result<u32> {
        self.fill(4).await?;
        Ok(self.inbuf.get_u32_le())
    }

    /// Reads an i64 reply.
    pub async fn i64(&mut self) -> std::io::Result<i64> {
        self.fill(8).await?;
        Ok(self.inbuf.get_i64_le())
    }

    /// Reads a string reply.
    pub async fn bytes(&mut self) -> std::io::Result<Bytes> {
        let n = self.i64().await? as usize;
        self.fill(n).await?;
        Ok(self.inbuf.split_to(n).freeze())
    }

    /// Waits for the server to close the connection (EOF or reset);
    /// anything it sends first is returned as an error.
    pub async fn closed(&mut self) -> std::io::Result<()> {
        match self.stream.read_buf(&mut self.inbuf).await {
            Ok(0) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => Ok(()),
            Err(e) => Err(e),
            Ok(n) => Err(std::io::Error::other(format!(
                "{n} bytes instead of a close"
            ))),
        }
    }

    /// SET.
    pub async fn set(&mut self, key: &str, value: &[u8]) -> std::io::Result<()> {
        let op = Op::Set {
            key: key.into(),
            value: Bytes::copy_from_slice(value),
        };
        self.send(&op).await
    }

    /// GET (a missing key reads as empty).
    pub async fn get(&mut self, key: &str) -> std::io::Result<Bytes> {
        self.send(&Op::Get { key: key.into() }).await?;
        self.bytes().await
    }

    /// ADD: the new value.
    pub async fn add(&mut self, key: &str, delta: i64) -> std::io::Result<i64> {
        self.send(&Op::Add {
            key: key.into(),
            delta,
        })
        .await?;
        self.i64().await
    }

    /// CHECK: whether every key is there.
    pub async fn check(&mut self, keys: &[&str]) -> std::io::Result<bool> {
        let keys = keys.iter().map(|k| k.to_string()).collect();
        self.send(&Op::Check { keys }).await?;
        Ok(self.u8().await? == proto::torch::READY)
    }

    /// WAIT, until released.
    pub async fn wait(&mut self, keys: &[&str]) -> std::io::Result<()> {
        let keys = keys.iter().map(|k| k.to_string()).collect();
        self.send(&Op::Wait { keys }).await?;
        match self.u8().await? {
            STOP_WAITING => Ok(()),
            b => Err(std::io::Error::other(format!("WAIT answered {b}"))),
        }
    }

    /// COMPARE_SET: the value it answers.
    pub async fn compare_set(
        &mut self,
        key: &str,
        expected: &[u8],
        desired: &[u8],
    ) -> std::io::Result<Bytes> {
        self.send(&Op::CompareSet {
            key: key.into(),
            expected: Bytes::copy_from_slice(expected),
            desired: Bytes::copy_from_slice(desired),
        })
        .await?;
        self.bytes().await
    }

    /// BARRIER, until released.
    pub async fn barrier(&mut self, key: &str, world_size: i64) -> std::io::Result<()> {
        self.send(&Op::Barrier {
            key: key.into(),
            world_size,
        })
        .await?;
        match self.u8().await? {
            STOP_WAITING => Ok(()),
            b => Err(std::io::Error::other(format!("BARRIER answered {b}"))),
        }
    }

    /// GETNUMKEYS.
    pub async fn num_keys(&mut self) -> std::io::Result<i64> {
        self.send(&Op::NumKeys).await?;
        self.i64().await
    }
}

/// Serves one TCPStore connection of a stock client on the relay's port:
/// each request goes to a live node (the next one when a node fails, with
/// the same origin), the answers and STOP_WAITING come back to the client.
/// The connection stays open through any node's death.
pub async fn relay<S>(mut stream: S, nodes: Endpoints, max_message_bytes: usize)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut buf = BytesMut::new();
    if let Err(e) = handshake(&mut stream, &mut buf).await {
        tracing::debug!("relay: TCPStore handshake refused: {e:?}");
        return;
    }
    let mut s = RelaySession {
        nodes,
        max: max_message_bytes,
        id: rand::random(),
        seq: 0,
        written: 0,
        recorded: false,
        waiting: None,
    };
    let why = s.serve(&mut stream, buf).await;
    tracing::debug!(
        connection = format!("{:x}", s.id),
        "relay: TCPStore connection ended: {why}"
    );
    if s.recorded {
        let _ = s
            .call(
                None,
                |mut c, r| async move { c.close(r).await },
                TorchCloseRequest {},
            )
            .await;
    }
}

/// The relay's side of one connection's session.
struct RelaySession {
    nodes: Endpoints,
    max: usize,
    id: u64,
    /// The last sequence number used.
    seq: u64,
    written: u64,
    recorded: bool,
    /// A wait stands: watch it from this log index.
    waiting: Option<u64>,
}

type Client = TorchStoreClient<tonic::transport::Channel>;

impl RelaySession {
    async fn serve<S>(&mut self, stream: &mut S, mut buf: BytesMut) -> String
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let mut decoder = Decoder::default();
        loop {
            loop {
                let op = match decoder.decode(&mut buf) {
                    Ok(Some(op)) => op,
                    Ok(None) => break,
                    Err(bad) => return bad.to_string(),
                };
                let reply = match op {
                    // Answered here: the handshake is the relay's.
                    Op::Validate(_) => return "VALIDATE after the handshake".into(),
                    Op::Ping(n) => Ok(n.to_le_bytes().to_vec()),
                    op => self.request(&op).await,
                };
                match reply {
                    Ok(bytes) => {
                        if let Err(e) = stream.write_all(&bytes).await {
                            return e.to_string();
                        }
                    }
                    Err(why) => return why,
                }
            }
            let watched = async {
                match self.waiting {
                    Some(index) => self.stops(index).await,
                    None => std::future::pending().await,
                }
            };
            let event = tokio::select! {
                read = stream.read_buf(&mut buf) => Event::Read(read),
                stops = watched => Event::Stops(stops),
            };
            match event {
                Event::Read(Ok(0)) => return "closed by the client".into(),
                Event::Read(Ok(_)) => {}
                Event::Read(Err(e)) => return e.to_string(),
                Event::Stops(Err(why)) => return why,
                Event::Stops(Ok((stops, waiting))) => {
                    let owed = stops.saturating_sub(self.written) as usize;
                    self.written = self.written.max(stops);
                    self.waiting = waiting.then_some(0);
                    if let Err(e) = stream.write_all(&vec![STOP_WAITING; owed]).await {
                        return e.to_string();
                    }
                }
            }
        }
    }

    /// A call of the connection's session with origin seq `seq` (`None`: a
    /// call that applies nothing), at the live nodes.
    async fn call<M, R, F, Fut>(&self, seq: Option<u64>, method: F, msg: M) -> Result<R, String>
    where
        M: Clone,
        F: Fn(Client, tonic::Request<M>) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<R>, tonic::Status>>,
    {
        let origin = WireOrigin {
            client_id: self.id,
            seq: seq.unwrap_or(0),
            done_below: seq.map_or(0, |s| s.saturating_sub(1)),
        };
        let max = self.max;
        self.nodes
            .call_as(origin, msg, |ch, r| {
                let c = TorchStoreClient::new(ch)
                    .max_decoding_message_size(max)
                    .max_encoding_message_size(max);
                method(c, r)
            })
            .await
            .map_err(|s| format!("{:?}: {}", s.code(), s.message()))
    }

    /// One request at a live node: the bytes to answer with.
    async fn request(&mut self, op: &Op) -> Result<Vec<u8>, String> {
        let mut request = BytesMut::new();
        encode(op, &mut request);
        let msg = TorchRequest {
            request: request.freeze(),
            written: self.written,
            recorded: self.recorded,
        };
        let first = self.seq + 1;
        let r = self
            .call(
                Some(first),
                |mut c, r| async move { c.request(r).await },
                msg,
            )
            .await?;
        if r.close {
            return Err(r.why);
        }
        self.seq = r.last_seq.max(self.seq);
        self.written = r.written;
        self.recorded = r.recorded;
        self.waiting = r.waiting.then_some(r.index);
        Ok(r.reply.to_vec())
    }

    /// Waits at a live node until the connection is owed more STOP_WAITING,
    /// or no wait stands: (owed in all, whether a wait still stands).
    async fn stops(&self, index: u64) -> Result<(u64, bool), String> {
        let msg = TorchStopsRequest {
            seen: self.written,
            index,
        };
        let r = self
            .call(None, |mut c, r| async move { c.stops(r).await }, msg)
            .await?;
        if r.gone {
            return Err("the connection's waits were dropped (its job was reset)".into());
        }
        Ok((r.stops, r.waiting))
    }
}

enum Event {
    Read(std::io::Result<usize>),
    Stops(Result<(u64, bool), String>),
}

/// The relay's listener for one port: TCPStore connections (first byte
/// 0, VALIDATE) are relayed here, every other connection goes to `grpc`.
pub async fn split(
    stream: TcpStream,
    grpc: tokio::sync::mpsc::Sender<std::io::Result<TcpStream>>,
    nodes: Endpoints,
    max_message_bytes: usize,
) {
    let mut first = [0u8; 1];
    match stream.peek(&mut first).await {
        Ok(1) if first[0] == 0 => relay(stream, nodes, max_message_bytes).await,
        Ok(_) => {
            let _ = grpc.send(Ok(stream)).await;
        }
        Err(_) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BufMut;

    fn validate(magic: u32) -> Vec<u8> {
        let mut b = BytesMut::new();
        encode(&Op::Validate(magic), &mut b);
        b.to_vec()
    }

    #[tokio::test]
    async fn a_whole_validate_with_the_number_passes_and_keeps_what_follows() {
        let (mut client, mut server) = tokio::io::duplex(64);
        let mut first = validate(VALIDATE_MAGIC);
        first.put_u8(13);
        client.write_all(&first).await.unwrap();
        let mut buf = BytesMut::new();
        handshake(&mut server, &mut buf).await.unwrap();
        assert_eq!(&buf[..], &[13]);
    }

    #[tokio::test]
    async fn a_validate_cut_short_or_wrong_is_refused_when_more_comes() {
        for (first, rest) in [
            (
                validate(VALIDATE_MAGIC)[..1].to_vec(),
                validate(VALIDATE_MAGIC)[1..].to_vec(),
            ),
            (validate(0xdead_beef), vec![13, 1, 0, 0, 0]),
        ] {
            let (mut client, mut server) = tokio::io::duplex(64);
            // What the server's first read holds.
            let mut buf = BytesMut::from(&first[..]);
            let refused = tokio::spawn(async move { handshake(&mut server, &mut buf).await });
            client.write_all(&rest).await.unwrap();
            assert!(matches!(refused.await.unwrap(), Err(Refused::Bad(_))));
        }
    }
}
