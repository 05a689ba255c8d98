//! Every node of the cluster as one target: a call goes to the current node
//! and, after a transport failure, to the next one, with the same
//! exactly-once origin (`x-coordstore-origin`). Each call in flight has a
//! lane of its own (`proto::origin::Lanes`) that declares its previous call
//! done, so the cluster keeps one outcome per call in flight here however
//! many calls pass. Shared by the relay and the agent.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use proto::origin::Lanes;
use proto::ORIGIN_HEADER;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Request, Response, Status};

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

/// The HTTP/2 ping interval while calls are out, and how long a ping may
/// go unanswered: a node that hangs is left after 1-2 s (a node that
/// answers nothing for a second while it runs is rare: the ping is
/// answered by the connection's own task, not by a call).
pub const KEEP_ALIVE: Duration = Duration::from_secs(1);

struct Inner {
    channels: Vec<Channel>,
    current: AtomicUsize,
    lanes: Lanes,
    retry_for: Duration,
    /// The namespace every call names (`x-coordstore-namespace`); `None`:
    /// the default one.
    namespace: Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>,
}

/// The nodes of one cluster, with failover and origins.
#[derive(Clone)]
pub struct Endpoints {
    inner: Arc<Inner>,
}

impl Endpoints {
    /// Lazily connected channels to `addrs` (HOST:PORT); a call keeps trying
    /// nodes for up to `retry_for`.
    pub fn new(addrs: &[String], retry_for: Duration) -> Result<Endpoints, String> {
        Self::with_tls(addrs, retry_for, None)
    }

    /// [`Endpoints::new`], dialing over TLS with `tls` (None: plaintext).
    pub fn with_tls(
        addrs: &[String],
        retry_for: Duration,
        tls: Option<tonic::transport::ClientTlsConfig>,
    ) -> Result<Endpoints, String> {
        if addrs.is_empty() {
            return Err("at least one endpoint is needed".into());
        }
        let mut channels = Vec::new();
        for addr in addrs {
            let mut ep = Endpoint::from_shared(proto::tls::uri(addr, tls.is_some()))
                .map_err(|e| format!("bad endpoint {addr}: {e}"))?;
            if let Some(tls) = &tls {
                ep = ep
                    .tls_config(tls.clone())
                    .map_err(|e| format!("TLS for {addr}: {e}"))?;
            }
            // A node that hangs (a paused VM, a process stuck on its disk)
            // keeps its connections open: an HTTP/2 ping unanswered within
            // KEEP_ALIVE fails every call on the connection, and the call
            // goes to the next node.
            let ch = ep
                .connect_timeout(Duration::from_millis(500))
                .tcp_nodelay(true)
                .http2_keep_alive_interval(KEEP_ALIVE)
                .keep_alive_timeout(KEEP_ALIVE)
                .connect_lazy();
            channels.push(ch);
        }
        Ok(Endpoints {
            inner: Arc::new(Inner {
                channels,
                current: AtomicUsize::new(0),
                lanes: Lanes::new(),
                retry_for,
                namespace: None,
            }),
        })
    }

    /// The same nodes, every call in namespace `namespace` (`None`: the
    /// default one). Call it before the endpoints are cloned.
    pub fn in_namespace(mut self, namespace: Option<&str>) -> Result<Endpoints, String> {
        let value = match namespace {
            None => None,
            Some(ns) => Some(
                ns.parse()
                    .map_err(|_| format!("namespace {ns:?} is not a header value"))?,
            ),
        };
        let inner = Arc::get_mut(&mut self.inner)
            .ok_or("the endpoints are shared already; name the namespace first")?;
        inner.namespace = value;
        Ok(self)
    }

    /// `msg` as a request of these endpoints (in their namespace).
    pub fn request<M>(&self, msg: M) -> Request<M> {
        let mut req = Request::new(msg);
        if let Some(ns) = &self.inner.namespace {
            req.metadata_mut()
                .insert(proto::NAMESPACE_HEADER, ns.clone());
        }
        req
    }

    /// The node calls go to now, and its channel.
    pub fn current(&self) -> (usize, Channel) {
        let i = self.inner.current.load(Ordering::Relaxed) % self.inner.channels.len();
        (i, self.inner.channels[i].clone())
    }

    /// Marks node `idx` as failed: calls move on to the next one (unless
    /// another call already moved them).
    pub fn failed(&self, idx: usize) {
        let n = self.inner.channels.len();
        let _ = self.inner.current.compare_exchange(
            idx,
            (idx + 1) % n,
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
    }

    /// Sends `msg` through `method` with a fresh origin, moving from node to
    /// node on transport failures until the retry time runs out.
    pub async fn call<M, R, F, Fut>(&self, msg: M, method: F) -> Result<R, Status>
    where
        M: Clone,
        F: Fn(Channel, Request<M>) -> Fut,
        Fut: Future<Output = Result<Response<R>, Status>>,
    {
        // The lane is held until this call is over, retries included.
        let lane = self.inner.lanes.checkout();
        self.call_as(lane.origin(), msg, method).await
    }

    /// [`Endpoints::call`] with the caller's own `origin` (a session of its
    /// own, as a relayed TCPStore connection is).
    pub async fn call_as<M, R, F, Fut>(
        &self,
        origin: proto::origin::WireOrigin,
        msg: M,
        method: F,
    ) -> Result<R, Status>
    where
        M: Clone,
        F: Fn(Channel, Request<M>) -> Fut,
        Fut: Future<Output = Result<Response<R>, Status>>,
    {
        let origin = origin.header_value();
        let deadline = Instant::now() + self.inner.retry_for;
        let mut failures = 0usize;
        loop {
            let (idx, ch) = self.current();
            let mut req = self.request(msg.clone());
            req.metadata_mut()
                .insert(ORIGIN_HEADER, origin.parse().expect("ascii digits"));
            match method(ch, req).await {
                Ok(r) => return Ok(r.into_inner()),
                Err(s) if is_transport_failure(&s) && Instant::now() < deadline => {
                    tracing::debug!(node = idx, "{}; trying the next node", s.message());
                    self.failed(idx);
                    failures += 1;
                    if failures.is_multiple_of(self.inner.channels.len()) {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
                Err(s) => return Err(s),
            }
        }
    }
}
