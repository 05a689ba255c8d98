//! One TCPStore connection: the handshake as torch 2.15's libuv server
//! reads it, then each request in order, each answered (or not: SET,
//! APPEND, MULTI_SET, QUEUE_PUSH have no reply) only once it has applied,
//! so the client never reads behind its own write. The STOP_WAITING the
//! connection is owed (its WAITs and BARRIERs, woken by anyone's writes)
//! are written as this node applies the wakes, between requests; a request
//! behind a pending WAIT is served at once, as torch's server serves it.
//! Input torch's server refuses ends the connection and nothing else.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use journal::pb::torch::{self as cmd, reply::Reply};
use journal::torch::ConnectionView;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::areas::torch::{Store, Written};
use crate::core::{Call, CallError, CallResult};
use proto::torch::{handshake, Refused};
use proto::torch::{
    put_bytes, put_i64, Decoder, Op, NOT_READY, READY, STOP_WAITING, WAIT_CANCELED,
};

/// Why a connection ended early (logged at debug: torch's clients see a
/// closed connection, as from torch's own server).
#[derive(Debug)]
pub enum Ended {
    /// The client closed it.
    Closed,
    /// Input torch's server refuses.
    Bad(String),
    /// A request failed (a counter that is not a number, the namespace's
    /// bounds, no leader in time).
    Failed(String),
    /// This node cannot serve the request now (UNAVAILABLE): a relayed
    /// connection's relay sends it to another node; a connection of its
    /// own ends.
    Unavailable(tonic::Status),
    /// The connection broke.
    Io(std::io::Error),
}

impl From<std::io::Error> for Ended {
    fn from(e: std::io::Error) -> Self {
        Ended::Io(e)
    }
}

impl From<CallError> for Ended {
    fn from(e: CallError) -> Self {
        if let CallError::Status(s) = &e {
            if s.code() == tonic::Code::Unavailable {
                return Ended::Unavailable(s.clone());
            }
        }
        Ended::Failed(match e {
            CallError::Domain(d) => d.message,
            CallError::Status(s) => format!("{:?}: {}", s.code(), s.message()),
            CallError::Retry(why) => why,
        })
    }
}

/// A watch of the connection's waits (see [`Store::watch`]).
type Watch = Pin<Box<dyn Future<Output = CallResult<Option<ConnectionView>>> + Send>>;

/// Serves one TCPStore connection, admitted as `call` (its namespace, and
/// its session's id as its origin's client id), until it closes or fails;
/// its waits are forgotten after.
pub async fn serve<S>(mut stream: S, store: Arc<Store>, call: Call) -> Ended
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut buf = BytesMut::new();
    let id = Session::id_of(&call);
    let ended = match handshake(&mut stream, &mut buf).await {
        Ok(()) => requests(&mut stream, Session::new(store.clone(), call), buf).await,
        Err(Refused::Closed) => Ended::Closed,
        Err(Refused::Bad(why)) => Ended::Bad(why.into()),
        Err(Refused::Io(e)) => Ended::Io(e),
    };
    store.closed(id);
    ended
}

/// Each request of the connection in turn; between them, the STOP_WAITING
/// its waits are owed.
async fn requests<S>(stream: &mut S, mut s: Session, mut buf: BytesMut) -> Ended
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut decoder = Decoder::default();
    let mut watch: Option<Watch> = None;
    loop {
        loop {
            match decoder.decode(&mut buf) {
                Ok(Some(op)) => {
                    if let Err(e) = s.run(op).await {
                        return e;
                    }
                }
                Ok(None) => break,
                Err(bad) => return Ended::Bad(bad.to_string()),
            }
        }
        if let Some(index) = s.watch_at.take() {
            watch = Some(s.watch(index));
        } else if s.cancelled {
            watch = None;
        }
        s.cancelled = false;
        if !s.out.is_empty() {
            if let Err(e) = stream.write_all(&s.out).await {
                return Ended::Io(e);
            }
            s.out.clear();
        }
        let watched = async {
            match watch.as_mut() {
                Some(w) => w.await,
                None => std::future::pending().await,
            }
        };
        let seen = tokio::select! {
            read = stream.read_buf(&mut buf) => match read {
                Ok(0) => return Ended::Closed,
                Ok(_) => continue,
                Err(e) => return Ended::Io(e),
            },
            seen = watched => seen,
        };
        watch = None;
        match seen {
            Ok(Some(view)) => {
                s.stops_to(view.stops);
                if view.registered > 0 {
                    watch = Some(s.watch(0));
                } else {
                    s.sessions().released(s.id);
                }
            }
            // The record is gone (the job was reset): nothing will answer
            // what the client waits for.
            Ok(None) => return Ended::Failed("the connection's waits were dropped".into()),
            Err(e) => return e.into(),
        }
    }
}

/// What a relayed request leaves for its relay (see [`Session::carried`]).
pub struct Carried {
    /// The bytes to answer the client with.
    pub reply: bytes::Bytes,
    /// The last sequence number used.
    pub seq: u64,
    /// STOP_WAITING written so far.
    pub written: u64,
    /// The state has a record of the connection.
    pub recorded: bool,
    /// A wait stands: watch it from this index.
    pub watch_at: Option<u64>,
}

/// One connection's session: what its requests need to be run, by the
/// node that holds the connection or, for a relayed one, by whichever
/// node a request reaches (the relay carries the rest).
pub struct Session {
    store: Arc<Store>,
    /// The connection's admitted call: each request's call is made of it
    /// ([`Call::request`]).
    call: Call,
    namespace: String,
    /// The session's client id (the state knows the connection by it).
    id: u64,
    /// The last sequence number used.
    seq: u64,
    /// STOP_WAITING written so far (the state counts those owed).
    written: u64,
    /// Whether the state has a record of the connection (it waited).
    recorded: bool,
    /// A wait stands since the last request: watch it from this index.
    watch_at: Option<u64>,
    /// The last request cancelled the waits.
    cancelled: bool,
    /// What to write to the client.
    out: BytesMut,
    /// A relayed connection: its node is whichever its relay reaches (the
    /// node watching its waits says it is alive).
    relayed: bool,
}

impl Session {
    /// The session id of a connection admitted as `call`.
    fn id_of(call: &Call) -> u64 {
        call.origin().map_or(0, |o| o.client_id)
    }

    /// The session of a new connection, admitted as `call`.
    pub fn new(store: Arc<Store>, call: Call) -> Session {
        Session {
            store,
            namespace: call.namespace().to_string(),
            id: Self::id_of(&call),
            call,
            seq: 0,
            written: 0,
            recorded: false,
            watch_at: None,
            cancelled: false,
            out: BytesMut::new(),
            relayed: false,
        }
    }

    /// What a relayed request leaves for its relay to carry: the bytes to
    /// answer with, and the session after it (the last sequence number,
    /// STOP_WAITING written, whether the state has a record, and the index
    /// a standing wait is watched from).
    pub fn carried(&mut self) -> Carried {
        Carried {
            reply: self.out.split().freeze(),
            seq: self.seq,
            written: self.written,
            recorded: self.recorded,
            watch_at: self.watch_at,
        }
    }

    /// The session of a relayed connection, as its relay carries it in
    /// the admitted call `call` (the connection's id is its origin's client
    /// id): the last sequence number used, STOP_WAITING written, and
    /// whether the state has a record of it.
    pub fn relayed(
        store: Arc<Store>,
        call: Call,
        (seq, written, recorded): (u64, u64, bool),
    ) -> Session {
        Session {
            seq,
            written,
            recorded,
            relayed: true,
            ..Session::new(store, call)
        }
    }

    /// What this node knows of the store sessions it holds.
    fn sessions(&self) -> &crate::core::sessions::StoreSessions {
        self.store.core().store_sessions()
    }

    /// A watch of the connection's waits from log index `index`.
    fn watch(&self, index: u64) -> Watch {
        let store = self.store.clone();
        let call = self.call.request(0);
        let (id, seen) = (self.id, self.written);
        Box::pin(async move { store.watch(&call, id, seen, index).await })
    }

    /// Writes STOP_WAITING up to `stops` owed in all.
    pub fn stops_to(&mut self, stops: u64) {
        for _ in self.written..stops {
            self.out.put_u8(STOP_WAITING);
        }
        self.written = self.written.max(stops);
    }

    /// The connection waited on `keys`: the state holds a record of it,
    /// and its waits are watched.
    fn waiting(&mut self, w: cmd::Waited, index: u64, keys: Vec<String>) {
        if w.ready {
            self.out.put_u8(STOP_WAITING);
            self.sessions().released(self.id);
            return;
        }
        self.sessions()
            .waiting(self.id, &self.namespace, self.relayed, keys);
        if !self.recorded {
            self.recorded = true;
            if !self.relayed {
                self.store.waited(&self.namespace, self.id);
            }
        }
        // A record made anew (the old one was dropped) counts from 0.
        self.written = self.written.min(w.stops);
        self.watch_at = Some(index);
    }

    async fn write(&mut self, command: impl Into<cmd::command::Command>) -> CallResult<Written> {
        use cmd::command::Command as C;
        self.seq += 1;
        let call = self.call.request(self.seq);
        let command: C = command.into();
        // What the operators' view counts: a client's write, and the keys
        // ranks ADD to (a store barrier's counter).
        let counter = match &command {
            C::Add(a) => Some(Some((a.key.clone(), None))),
            C::Barrier(b) => Some(Some((b.key.clone(), Some(b.world_size)))),
            C::Wait(_) | C::CancelWait(_) | C::Forget(_) | C::Touch(_) => None,
            _ => Some(None),
        };
        let written = self.store.write(&call, command).await?;
        if let Some(counter) = counter {
            let counter = counter.as_ref().map(|(k, w)| (k.as_str(), *w));
            self.sessions().wrote(&self.namespace, counter);
        }
        Ok(written)
    }

    async fn read<T>(&mut self, f: impl FnOnce(journal::torch::Reader<'_>) -> T) -> CallResult<T> {
        let call = self.call.request(0);
        self.store.read(&call, f).await
    }

    /// Runs one request, its answer into the output.
    pub async fn run(&mut self, op: Op) -> Result<(), Ended> {
        match op {
            // A second VALIDATE: torch's server closes.
            Op::Validate(_) => return Err(Ended::Bad("VALIDATE after the handshake".into())),
            Op::Ping(n) => {
                // A client's first PING, in its handshake, sends its pid.
                self.sessions()
                    .pinged(self.id, &self.namespace, self.relayed, n);
                self.out.put_u32_le(n);
            }
            Op::Wait { keys } => self.wait(keys).await?,
            Op::CancelWait => self.cancel().await?,
            Op::MultiSet { pairs } => self.multi_set(pairs).await?,
            Op::Barrier { key, world_size } => {
                let connection = self.id;
                let w = self
                    .write(cmd::Barrier {
                        connection,
                        key: key.clone(),
                        world_size,
                    })
                    .await?;
                self.waited(w, "BARRIER", vec![key])?;
            }
            Op::Get { .. }
            | Op::Check { .. }
            | Op::NumKeys
            | Op::MultiGet { .. }
            | Op::QueueLen { .. }
            | Op::ListKeys => self.read_request(op).await?,
            write => self.write_request(write).await?,
        }
        Ok(())
    }

    /// A request that only reads.
    async fn read_request(&mut self, op: Op) -> Result<(), Ended> {
        match op {
            Op::Get { key } => {
                let v = self.read(|r| r.get(&key).cloned()).await?;
                put_bytes(&mut self.out, v.as_deref().unwrap_or_default());
            }
            Op::Check { keys } => {
                let ready = self.read(|r| r.check(&keys)).await?;
                self.out.put_u8(if ready { READY } else { NOT_READY });
            }
            Op::NumKeys => {
                let n = self.read(|r| r.num_keys()).await?;
                put_i64(&mut self.out, n as i64);
            }
            Op::MultiGet { keys } => {
                let values: Vec<Bytes> = self
                    .read(|r| {
                        keys.iter()
                            .map(|k| r.get(k).cloned().unwrap_or_default())
                            .collect()
                    })
                    .await?;
                for v in values {
                    put_bytes(&mut self.out, &v);
                }
            }
            Op::QueueLen { key } => {
                let n = self.read(|r| r.queue_len(&key)).await?;
                put_i64(&mut self.out, n as i64);
            }
            Op::ListKeys => {
                let keys: Vec<String> = self.read(|r| r.keys().cloned().collect()).await?;
                put_i64(&mut self.out, keys.len() as i64);
                for k in keys {
                    put_bytes(&mut self.out, k.as_bytes());
                }
            }
            other => return Err(Ended::Failed(format!("{} is not a read", other.name()))),
        }
        Ok(())
    }

    /// A request that writes one key or queue.
    async fn write_request(&mut self, op: Op) -> Result<(), Ended> {
        match op {
            Op::Set { key, value } => {
                self.write(cmd::Set { key, value }).await?;
            }
            Op::Append { key, value } => {
                self.write(cmd::Append { key, value }).await?;
            }
            Op::QueuePush { key, value } => {
                self.write(cmd::QueuePush { key, value }).await?;
            }
            Op::CompareSet {
                key,
                expected,
                desired,
            } => {
                // One that cannot change the state is a read (the many a
                // rendezvous' contended key sees lose nothing to Raft).
                let read = self.read(|r| r.compare_set_unchanging(&key, &expected));
                if let Some(current) = read.await? {
                    put_bytes(&mut self.out, &current);
                    return Ok(());
                }
                let cas = cmd::CompareSet {
                    key,
                    expected,
                    desired,
                };
                let Some(Reply::Value(v)) = self.write(cas).await?.reply else {
                    return Err(missing("COMPARE_SET"));
                };
                put_bytes(&mut self.out, &v);
            }
            Op::Add { key, delta } => {
                let w = self.write(cmd::Add { key, delta }).await?;
                put_i64(&mut self.out, number(w, "ADD")?);
            }
            Op::DeleteKey { key } => {
                let w = self.write(cmd::DeleteKey { key }).await?;
                put_i64(&mut self.out, number(w, "DELETE_KEY")?);
            }
            Op::QueuePop { key } => {
                let Some(Reply::Popped(p)) = self.write(cmd::QueuePop { key }).await?.reply else {
                    return Err(missing("QUEUE_POP"));
                };
                put_i64(&mut self.out, p.length);
                if let Some(v) = p.value {
                    put_bytes(&mut self.out, &v);
                }
            }
            other => return Err(Ended::Failed(format!("{} is not a write", other.name()))),
        }
        Ok(())
    }

    /// WAIT: answered at once when every key is there (a read: no
    /// proposal), else registered in the state.
    async fn wait(&mut self, keys: Vec<String>) -> Result<(), Ended> {
        if self.read(|r| r.check(&keys)).await? {
            self.out.put_u8(STOP_WAITING);
            return Ok(());
        }
        let connection = self.id;
        let w = self
            .write(cmd::Wait {
                connection,
                keys: keys.clone(),
            })
            .await?;
        self.waited(w, "WAIT", keys)
    }

    fn waited(&mut self, w: Written, op: &str, keys: Vec<String>) -> Result<(), Ended> {
        let Some(Reply::Waited(waited)) = w.reply else {
            return Err(missing(op));
        };
        self.waiting(waited, w.index, keys);
        Ok(())
    }

    /// CANCEL_WAIT: what was owed before it, then WAIT_CANCELED.
    async fn cancel(&mut self) -> Result<(), Ended> {
        if self.recorded {
            let connection = self.id;
            let w = self.write(cmd::CancelWait { connection }).await?;
            let Some(Reply::Waited(waited)) = w.reply else {
                return Err(missing("CANCEL_WAIT"));
            };
            self.stops_to(waited.stops);
            self.watch_at = None;
            self.cancelled = true;
            self.sessions().cancelled(self.id);
        }
        self.out.put_u8(WAIT_CANCELED);
        Ok(())
    }

    /// MULTI_SET pairs, in proposals of at most a few MiB each.
    async fn multi_set(&mut self, pairs: Vec<(String, Bytes)>) -> Result<(), Ended> {
        const CHUNK_BYTES: usize = 4 << 20;
        let mut chunk = Vec::new();
        let mut bytes = 0;
        for (key, value) in pairs {
            bytes += key.len() + value.len();
            chunk.push(cmd::Set { key, value });
            if bytes >= CHUNK_BYTES {
                let pairs = std::mem::take(&mut chunk);
                self.write(cmd::MultiSet { pairs }).await?;
                bytes = 0;
            }
        }
        if !chunk.is_empty() {
            self.write(cmd::MultiSet { pairs: chunk }).await?;
        }
        Ok(())
    }
}

/// A reply an outcome must carry.
fn missing(op: &str) -> Ended {
    Ended::Failed(format!("{op} applied without its reply"))
}

fn number(w: Written, op: &str) -> Result<i64, Ended> {
    match w.reply {
        Some(Reply::Number(n)) => Ok(n),
        _ => Err(missing(op)),
    }
}
