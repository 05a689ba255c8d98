//! Prometheus metrics. The exposition is Prometheus' text format 0.0.4 (the
//! `prometheus` crate), which `promtool check metrics` lints. Counters and
//! histograms are recorded where things happen (each gRPC call by the
//! [`GrpcMetricsLayer`] around every service, each proposal in the core's
//! router); gauges are read from the node at scrape time.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use prometheus::{
    exponential_buckets, Encoder, GaugeVec, HistogramOpts, HistogramVec, IntCounter, IntCounterVec,
    IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};

use crate::core::connections::Connections;
use crate::core::Core;
use crate::duties::coordination::liveness_of;

/// The label of the series that sums the namespaces without series of
/// their own. A namespace of that name is always summed there: it could
/// not be told apart from the rest.
const OTHER: &str = "other";

/// The exposition's content type (Prometheus text format 0.0.4).
pub const CONTENT_TYPE: &str = prometheus::TEXT_FORMAT;

fn latency_opts(name: &str, help: &str) -> HistogramOpts {
    // 50 µs to ~26 s.
    HistogramOpts::new(name, help)
        .buckets(exponential_buckets(0.000_05, 2.0, 20).expect("valid buckets"))
}

/// Every metric of one node.
pub struct Metrics {
    registry: Registry,
    grpc_calls: IntCounterVec,
    grpc_seconds: HistogramVec,
    leader_changes: IntCounter,
    last_leader: AtomicU64,
    term: IntGauge,
    leader_id: IntGauge,
    is_leader: IntGauge,
    last_log_index: IntGauge,
    applied_index: IntGauge,
    snapshot_index: IntGauge,
    tasks: IntGaugeVec,
    barriers_pending: IntGauge,
    parked_calls: IntGaugeVec,
    kv_keys: IntGauge,
    kv_bytes: IntGauge,
    sessions: IntGauge,
    outcomes: IntGauge,
    closures: IntGaugeVec,
    tfdata_jobs: IntGauge,
    tfdata_workers: IntGauge,
    rss_bytes: IntGauge,
    feature_level: IntGauge,
    cluster_feature_level: IntGauge,
    namespaces: IntGauge,
    ns_keys: IntGaugeVec,
    ns_bytes: IntGaugeVec,
    ns_tasks: IntGaugeVec,
    ns_parked: IntGaugeVec,
    ns_max_keys: IntGaugeVec,
    ns_max_bytes: IntGaugeVec,
    ns_max_parked: IntGaugeVec,
    ns_oldest_barrier: GaugeVec,
    ready: IntGauge,
    /// The node's bound on parked calls, once told (`--max-parked-calls`).
    max_parked_calls: Option<IntGauge>,
    /// Namespaces with series of their own (the largest by keys).
    ns_series: usize,
    /// The disk's health (gray failures).
    disk: DiskGauges,
    /// The node's client connections and their bounds.
    connections: Arc<Connections>,
    open_connections: IntGauge,
    refused_connections: IntCounterVec,
}

/// The disk's health, read off the node at scrape time.
struct DiskGauges {
    free: IntGauge,
    reserve: IntGauge,
    below_reserve: IntGauge,
    fsync_p99: prometheus::Gauge,
    fsync_slow: IntGauge,
    stalled: IntGauge,
    writes_refused: IntGauge,
    transfers: IntCounter,
}

impl DiskGauges {
    fn new(r: &Registry) -> DiskGauges {
        let gauge = |name: &str, help: &str| {
            let g = IntGauge::new(name, help).expect("valid gauge");
            r.register(Box::new(g.clone()))
                .expect("unique metric names");
            g
        };
        let fsync_p99 = prometheus::Gauge::new(
            "disk_fsync_p99_seconds",
            "99th percentile of this node's fdatasyncs over the last 10 s (running ones at their age)",
        )
        .expect("valid gauge");
        r.register(Box::new(fsync_p99.clone()))
            .expect("unique metric names");
        let transfers = IntCounter::new(
            "leader_transfers_total",
            "Leadership transfers this node started because its disk was unhealthy",
        )
        .expect("valid counter");
        r.register(Box::new(transfers.clone()))
            .expect("unique metric names");
        DiskGauges {
            free: gauge("disk_free_bytes", "Bytes free under this node's data dir"),
            reserve: gauge(
                "disk_reserve_bytes",
                "Bytes this node keeps free under its data dir (--disk-reserve-bytes)",
            ),
            below_reserve: gauge(
                "disk_below_reserve",
                "1 while free space under the data dir is below the reserve",
            ),
            fsync_p99,
            fsync_slow: gauge(
                "disk_fsync_slow",
                "1 while the fdatasync percentile is over --slow-fsync-ms",
            ),
            stalled: gauge(
                "disk_stalled",
                "1 while an fdatasync or the Raft core has been stuck past --slow-fsync-ms",
            ),
            writes_refused: gauge(
                "writes_refused",
                "1 while this node, the leader, refuses client writes (disk below its reserve, no healthy voter)",
            ),
            transfers,
        }
    }

    fn render(&self, node: &raft::RaftNode) {
        let h = node.health();
        self.free.set(h.free_bytes.unwrap_or(0) as i64);
        self.reserve.set(h.reserve_bytes as i64);
        self.below_reserve.set(i64::from(h.disk_low));
        self.fsync_p99
            .set(h.fsync_p99.map_or(0.0, |d| d.as_secs_f64()));
        self.fsync_slow.set(i64::from(h.fsync_slow));
        self.stalled.set(i64::from(node.stalled().is_some()));
        self.writes_refused
            .set(i64::from(h.refusing_writes.is_some()));
        self.transfers
            .inc_by(h.transfers.saturating_sub(self.transfers.get()));
    }
}

/// One namespace's per-namespace series (or the sum of several, `other`).
struct Row {
    name: String,
    keys: u64,
    bytes: u64,
    tasks: [u64; 3],
    parked: u64,
    /// Quotas (0: none; never summed).
    max_keys: u64,
    max_bytes: u64,
    max_parked: u64,
    /// The oldest pending barrier's wait in seconds, as the leader knows it.
    oldest_barrier: Option<f64>,
}

impl Row {
    fn other() -> Row {
        Row {
            name: OTHER.into(),
            keys: 0,
            bytes: 0,
            tasks: [0; 3],
            parked: 0,
            max_keys: 0,
            max_bytes: 0,
            max_parked: 0,
            oldest_barrier: None,
        }
    }

    /// Adds `r`'s counts (not its quotas) to this sum.
    fn add(&mut self, r: &Row) {
        self.keys += r.keys;
        self.bytes += r.bytes;
        self.parked += r.parked;
        for i in 0..3 {
            self.tasks[i] += r.tasks[i];
        }
        self.oldest_barrier = match (self.oldest_barrier, r.oldest_barrier) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
    }
}

impl Metrics {
    /// A registry with every metric, values zero; the core's proposals
    /// among them.
    #[allow(clippy::too_many_lines)] // A declarative list: one entry per metric.
    pub fn new(core: &Core) -> Metrics {
        let registry =
            Registry::new_custom(Some("coordstore".into()), None).expect("a valid prefix");
        fn reg<M: prometheus::core::Collector + Clone + 'static>(r: &Registry, m: M) -> M {
            r.register(Box::new(m.clone()))
                .expect("unique metric names");
            m
        }
        let gauge = |name: &str, help: &str| {
            reg(&registry, IntGauge::new(name, help).expect("valid gauge"))
        };
        let counter = |name: &str, help: &str| {
            reg(
                &registry,
                IntCounter::new(name, help).expect("valid counter"),
            )
        };
        let m = Metrics {
            grpc_calls: reg(
                &registry,
                IntCounterVec::new(
                    Opts::new(
                        "grpc_calls_total",
                        "gRPC calls answered, by method and status code",
                    ),
                    &["method", "code"],
                )
                .expect("valid counter"),
            ),
            grpc_seconds: reg(
                &registry,
                HistogramVec::new(
                    latency_opts(
                        "grpc_call_seconds",
                        "gRPC call latency to the response headers, by method",
                    ),
                    &["method"],
                )
                .expect("valid histogram"),
            ),
            leader_changes: counter(
                "raft_leader_changes_total",
                "Leader changes this node saw (at scrapes)",
            ),
            last_leader: AtomicU64::new(0),
            term: gauge("raft_term", "Current Raft term"),
            leader_id: gauge(
                "raft_leader_id",
                "Node id of the leader this node knows (0: none)",
            ),
            is_leader: gauge("raft_is_leader", "1 on the leader"),
            last_log_index: gauge(
                "raft_last_log_index",
                "Index of the last entry in this node's log",
            ),
            applied_index: gauge(
                "raft_applied_index",
                "Index of the last entry applied to this node's state",
            ),
            snapshot_index: gauge("raft_snapshot_index", "Index the newest snapshot covers"),
            tasks: reg(
                &registry,
                IntGaugeVec::new(
                    Opts::new("tasks", "Coordination tasks by state"),
                    &["state"],
                )
                .expect("valid gauge"),
            ),
            barriers_pending: gauge("barriers_pending", "Barriers waiting for tasks"),
            parked_calls: reg(
                &registry,
                IntGaugeVec::new(
                    Opts::new(
                        "parked_calls",
                        "Client calls waiting on this node, by what they wait for",
                    ),
                    &["kind"],
                )
                .expect("valid gauge"),
            ),
            kv_keys: gauge("kv_keys", "Keys in the KV store"),
            kv_bytes: gauge("kv_bytes", "Bytes of keys and values in the KV store"),
            sessions: gauge("exactly_once_clients", "Clients in the exactly-once table"),
            outcomes: gauge(
                "exactly_once_outcomes",
                "Outcomes held by the exactly-once table",
            ),
            closures: reg(
                &registry,
                IntGaugeVec::new(
                    Opts::new(
                        "closures",
                        "Closures by queue and state (pending, queued, running; records: all kept)",
                    ),
                    &["queue", "state"],
                )
                .expect("valid gauge"),
            ),
            tfdata_jobs: gauge("tfdata_jobs", "tf.data service jobs"),
            tfdata_workers: gauge("tfdata_workers", "tf.data service workers known"),
            namespaces: gauge(
                "namespaces",
                "Namespaces in the cluster, the default one included",
            ),
            ns_keys: reg(
                &registry,
                IntGaugeVec::new(
                    Opts::new(
                        "namespace_keys",
                        "KV keys by namespace (the largest namespaces; the rest as other)",
                    ),
                    &["namespace"],
                )
                .expect("valid gauge"),
            ),
            ns_bytes: reg(
                &registry,
                IntGaugeVec::new(
                    Opts::new(
                        "namespace_kv_bytes",
                        "Bytes of KV keys and values by namespace (the largest; the rest as other)",
                    ),
                    &["namespace"],
                )
                .expect("valid gauge"),
            ),
            ns_tasks: reg(
                &registry,
                IntGaugeVec::new(
                    Opts::new(
                        "namespace_tasks",
                        "Tasks by namespace and state (the largest namespaces; the rest as other)",
                    ),
                    &["namespace", "state"],
                )
                .expect("valid gauge"),
            ),
            ns_parked: reg(
                &registry,
                IntGaugeVec::new(
                    Opts::new(
                        "namespace_parked_calls",
                        "Client calls parked on this node by namespace (the largest; the rest as other)",
                    ),
                    &["namespace"],
                )
                .expect("valid gauge"),
            ),
            ns_max_keys: ns_gauge(
                &registry,
                "namespace_max_keys",
                "The KV key quota by namespace (--max-keys; namespaces with one, and series of their own)",
            ),
            ns_max_bytes: ns_gauge(
                &registry,
                "namespace_max_bytes",
                "The KV bytes quota by namespace (--max-bytes; as namespace_max_keys)",
            ),
            ns_max_parked: ns_gauge(
                &registry,
                "namespace_max_parked_calls",
                "The parked-call quota per node by namespace (--max-parked-calls; as namespace_max_keys)",
            ),
            ns_oldest_barrier: reg(
                &registry,
                GaugeVec::new(
                    Opts::new(
                        "namespace_oldest_barrier_seconds",
                        "How long the oldest pending barrier has waited, by namespace (on the leader; the largest namespaces, the rest as other)",
                    ),
                    &["namespace"],
                )
                .expect("valid gauge"),
            ),
            ready: gauge(
                "ready",
                "1 while this node is ready (what /readyz answers), 0 otherwise",
            ),
            max_parked_calls: None,
            ns_series: 20,
            rss_bytes: gauge(
                "process_resident_memory_bytes",
                "Resident memory of this process",
            ),
            feature_level: gauge(
                "feature_level",
                "The journal feature level this node's build applies",
            ),
            cluster_feature_level: gauge(
                "cluster_feature_level",
                "The journal feature level the cluster runs at (the lowest its members apply, once raised)",
            ),
            disk: DiskGauges::new(&registry),
            connections: Connections::new(0, 0),
            open_connections: gauge(
                "connections",
                "Connections open on this node's client ports (TCPStore and gRPC)",
            ),
            refused_connections: reg(
                &registry,
                IntCounterVec::new(
                    Opts::new(
                        "connections_refused_total",
                        "Connections closed at accept, by the bound they met (node, namespace)",
                    ),
                    &["bound"],
                )
                .expect("valid counter"),
            ),
            registry,
        };
        let proposals = core.router().metrics().clone();
        let core_metrics: Vec<Box<dyn prometheus::core::Collector>> =
            vec![Box::new(proposals.proposals), Box::new(proposals.seconds)];
        for c in core_metrics
            .into_iter()
            .chain(storage::metrics::collectors())
            .chain(raft::metrics::collectors())
        {
            m.registry.register(c).expect("unique metric names");
        }
        m
    }

    /// The same metrics reading the node's connections off `connections`.
    pub fn with_connections(mut self, connections: Arc<Connections>) -> Self {
        self.connections = connections;
        self
    }

    /// The node's connections and their bounds.
    pub fn connections(&self) -> &Arc<Connections> {
        &self.connections
    }

    /// The same metrics with series of their own for at most `n` namespaces
    /// (the largest by keys), the others summed as `other`.
    pub fn with_namespace_series(mut self, n: usize) -> Self {
        self.ns_series = n;
        self
    }

    /// The same metrics with `coordstore_max_parked_calls`, the node's bound
    /// on parked calls (`--max-parked-calls`; 0: none).
    pub fn with_max_parked_calls(mut self, max: u64) -> Self {
        let g = IntGauge::new(
            "max_parked_calls",
            "The node's bound on client calls parked at once (--max-parked-calls; 0: none)",
        )
        .expect("valid gauge");
        if self.registry.register(Box::new(g.clone())).is_ok() {
            g.set(max as i64);
            self.max_parked_calls = Some(g);
        }
        self
    }

    /// Records whether this node is ready (`coordstore_ready`), as the
    /// scrape found it.
    pub fn set_ready(&self, ready: bool) {
        self.ready.set(i64::from(ready));
    }

    /// The per-namespace series: the `ns_series` largest namespaces by
    /// keys, and every other one summed as `other`; a deleted namespace
    /// leaves no series behind (the series are made anew at each scrape).
    fn render_namespaces(&self, core: &Core, s: &journal::State) {
        self.namespaces.set(s.namespace_count() as i64);
        let rows = bucket(namespace_rows(core, s), self.ns_series);
        for v in [
            &self.ns_keys,
            &self.ns_bytes,
            &self.ns_parked,
            &self.ns_max_keys,
            &self.ns_max_bytes,
            &self.ns_max_parked,
        ] {
            v.reset();
        }
        self.ns_tasks.reset();
        self.ns_oldest_barrier.reset();
        for r in rows {
            let l = [r.name.as_str()];
            self.ns_keys.with_label_values(&l).set(r.keys as i64);
            self.ns_bytes.with_label_values(&l).set(r.bytes as i64);
            self.ns_parked.with_label_values(&l).set(r.parked as i64);
            for (v, quota) in [
                (&self.ns_max_keys, r.max_keys),
                (&self.ns_max_bytes, r.max_bytes),
                (&self.ns_max_parked, r.max_parked),
            ] {
                if quota > 0 {
                    v.with_label_values(&l).set(quota as i64);
                }
            }
            if let Some(secs) = r.oldest_barrier {
                self.ns_oldest_barrier.with_label_values(&l).set(secs);
            }
            for (i, state) in ["disconnected", "connected", "error"].iter().enumerate() {
                self.ns_tasks
                    .with_label_values(&[r.name.as_str(), *state])
                    .set(r.tasks[i] as i64);
            }
        }
    }

    fn record_call(&self, method: &str, code: i32, took: Duration) {
        // The path is the client's: only methods that exist become labels
        // (an unknown one is answered UNIMPLEMENTED), so a client cannot
        // grow the label set.
        let method = if code == tonic::Code::Unimplemented as i32 || !known_path(method) {
            "other"
        } else {
            method
        };
        let code = format!("{:?}", tonic::Code::from_i32(code));
        self.grpc_calls.with_label_values(&[method, &code]).inc();
        self.grpc_seconds
            .with_label_values(&[method])
            .observe(took.as_secs_f64());
    }

    /// Reads the gauges off the node and renders the text exposition.
    pub fn render(&self, core: &Core) -> String {
        let node = core.node();
        let m = node.metrics();
        let leader = m.current_leader.unwrap_or(0);
        if self.last_leader.swap(leader, Ordering::Relaxed) != leader && leader != 0 {
            self.leader_changes.inc();
        }
        self.term.set(m.current_term as i64);
        self.leader_id.set(leader as i64);
        self.is_leader.set(i64::from(leader == node.id()));
        self.last_log_index
            .set(m.last_log_index.unwrap_or(0) as i64);
        self.applied_index
            .set(m.last_applied.map_or(0, |l| l.index) as i64);
        self.snapshot_index
            .set(m.snapshot.map_or(0, |l| l.index) as i64);
        for (kind, n) in core.parking().parked_by_kind() {
            self.parked_calls.with_label_values(&[kind]).set(n as i64);
        }
        node.state().read(|s| {
            let c = s.coordination().stats();
            for (i, name) in ["disconnected", "connected", "error"].iter().enumerate() {
                self.tasks
                    .with_label_values(&[*name])
                    .set(c.tasks[i] as i64);
            }
            self.barriers_pending.set(c.barriers_pending as i64);
            self.kv_keys.set(c.keys as i64);
            self.kv_bytes.set(c.kv_bytes as i64);
            self.sessions.set(s.session_count() as i64);
            self.outcomes.set(s.outcomes_held() as i64);
            for q in s.closures().stats() {
                for (state, n) in [
                    ("pending", q.pending),
                    ("queued", q.queued),
                    ("running", q.running),
                    ("records", q.records),
                ] {
                    self.closures
                        .with_label_values(&[q.name.as_str(), state])
                        .set(n as i64);
                }
            }
            let d = s.dispatcher();
            self.tfdata_jobs.set(d.jobs().count() as i64);
            self.tfdata_workers.set(d.workers().count() as i64);
            self.render_namespaces(core, s);
            self.cluster_feature_level.set(i64::from(s.feature_level()));
        });
        self.feature_level.set(i64::from(journal::FEATURE_LEVEL));
        self.disk.render(node);
        self.open_connections.set(self.connections.open() as i64);
        let (at_node, at_namespace) = self.connections.refused();
        for (bound, n) in [("node", at_node), ("namespace", at_namespace)] {
            let c = self.refused_connections.with_label_values(&[bound]);
            c.inc_by(n.saturating_sub(c.get()));
        }
        self.rss_bytes.set(rss_bytes() as i64);
        let mut out = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut out)
            .expect("writing to a Vec");
        String::from_utf8(out).expect("the text format is UTF-8")
    }
}

/// A gauge vector by namespace in `registry`.
fn ns_gauge(registry: &Registry, name: &str, help: &str) -> IntGaugeVec {
    let v = IntGaugeVec::new(Opts::new(name, help), &["namespace"]).expect("valid gauge");
    registry
        .register(Box::new(v.clone()))
        .expect("unique metric names");
    v
}

/// Every namespace of `s` as its series would show it, with the oldest
/// barrier waits this node knows (as the leader).
fn namespace_rows(core: &Core, s: &journal::State) -> Vec<Row> {
    let oldest = liveness_of(core.node())
        .map(|l| l.oldest_barriers(Instant::now()))
        .unwrap_or_default();
    s.namespaces()
        .map(|n| {
            let c = n.coordination().stats();
            let spec = n.spec();
            Row {
                name: n.name().to_string(),
                keys: c.keys,
                bytes: c.kv_bytes,
                tasks: c.tasks,
                parked: core.parking().parked_in(n.key()),
                max_keys: n.config().map_or(0, |c| c.max_keys),
                max_bytes: spec.map_or(0, |p| p.max_bytes),
                max_parked: spec.map_or(0, |p| p.max_parked_calls),
                oldest_barrier: oldest.get(n.key()).map(|(_, w)| w.ms as f64 / 1000.0),
            }
        })
        .collect()
}

/// The `n` largest of `rows` by keys, and the rest (a namespace named
/// `other` among them) summed as [`OTHER`] if there is a rest.
fn bucket(mut rows: Vec<Row>, n: usize) -> Vec<Row> {
    rows.sort_by(|a, b| {
        (a.name == OTHER)
            .cmp(&(b.name == OTHER))
            .then_with(|| b.keys.cmp(&a.keys))
            .then_with(|| a.name.cmp(&b.name))
    });
    let own = rows.iter().take(n).filter(|r| r.name != OTHER).count();
    let rest: Vec<Row> = rows.drain(own..).collect();
    if !rest.is_empty() {
        let mut other = Row::other();
        for r in &rest {
            other.add(r);
        }
        rows.push(other);
    }
    rows
}

/// Whether `path` names a method of a service this node serves.
fn known_path(path: &str) -> bool {
    const SERVICES: [&str; 10] = [
        "/xla.coordination.CoordinationService/",
        "/tensorflow.CoordinationService/",
        "/tensorflow.data.DispatcherService/",
        "/coordstore.v1.Node/",
        "/coordstore.v1.NodePeer/",
        "/coordstore.v1.Agent/",
        "/coordstore.v1.TorchStore/",
        "/coordstore.v1.ClosureQueue/",
        "/coordstore.v1.RaftPeer/",
        "/grpc.health.v1.Health/",
    ];
    SERVICES.iter().any(|s| {
        path.strip_prefix(s).is_some_and(|m| {
            !m.is_empty() && m.len() <= 64 && m.bytes().all(|b| b.is_ascii_alphanumeric())
        })
    })
}

fn rss_bytes() -> u64 {
    // statm: size resident shared ... in pages.
    let pages = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| {
            s.split_whitespace()
                .nth(1)
                .and_then(|p| p.parse::<u64>().ok())
        })
        .unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    pages * page.max(0) as u64
}

/// Records every gRPC call (method, status code, latency) in [`Metrics`].
#[derive(Clone)]
pub struct GrpcMetricsLayer(pub Arc<Metrics>);

impl<S> tower::Layer<S> for GrpcMetricsLayer {
    type Service = GrpcMetrics<S>;

    fn layer(&self, inner: S) -> GrpcMetrics<S> {
        GrpcMetrics {
            inner,
            metrics: self.0.clone(),
        }
    }
}

/// The service [`GrpcMetricsLayer`] wraps around each gRPC service.
#[derive(Clone)]
pub struct GrpcMetrics<S> {
    inner: S,
    metrics: Arc<Metrics>,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B, RB> tower::Service<http::Request<B>> for GrpcMetrics<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<RB>>,
    S::Future: Send + 'static,
    S::Error: 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let method = req.uri().path().to_string();
        let metrics = self.metrics.clone();
        let t0 = Instant::now();
        let fut = self.inner.call(req);
        Box::pin(async move {
            let r = fut.await;
            // tonic answers an error as trailers-only: the status is in the
            // headers; a success carries it in the trailers (OK).
            let code = match &r {
                Ok(resp) => resp
                    .headers()
                    .get("grpc-status")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0),
                Err(_) => tonic::Code::Unknown as i32,
            };
            metrics.record_call(&method, code, t0.elapsed());
            r
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(name: &str, keys: u64, oldest: Option<f64>) -> Row {
        Row {
            name: name.into(),
            keys,
            max_keys: 100,
            oldest_barrier: oldest,
            ..Row::other()
        }
    }

    #[test]
    fn the_largest_get_series_and_a_namespace_named_other_joins_the_rest() {
        let rows = vec![
            row("a", 5, None),
            row("other", 9, Some(3.0)),
            row("b", 1, Some(7.5)),
            row("c", 3, None),
        ];
        let out = bucket(rows, 2);
        let names: Vec<&str> = out.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["a", "c", "other"]);
        let other = &out[2];
        assert_eq!(other.keys, 10, "the namespace named other and b");
        assert_eq!(other.max_keys, 0, "quotas are never summed");
        assert_eq!(other.oldest_barrier, Some(7.5), "the oldest of the rest");
        // Room for all: no bucket, but a namespace named other still is one.
        let out = bucket(vec![row("a", 5, None), row("b", 1, None)], 20);
        assert_eq!(out.len(), 2);
        let out = bucket(vec![row("other", 5, None)], 20);
        assert_eq!((out.len(), out[0].max_keys), (1, 0));
    }
}
