//! Prometheus metrics. The exposition is Prometheus' text format 0.0.4 (the
//! `prometheus` crate), which `promtool check metrics` lints. Counters and
//! histograms are recorded where things happen (each gRPC call by the
//! [`GrpcMetricsLayer`] around every service, each proposal in the core's
//! router); gauges are read from the node at scrape time.

mod disk;
mod grpc;
mod namespaces;

use disk::*;
use grpc::*;
pub use grpc::{GrpcMetrics, GrpcMetricsLayer};
use namespaces::*;

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
    ns_oldest_store_wait: GaugeVec,
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
            ns_oldest_store_wait: reg(
                &registry,
                GaugeVec::new(
                    Opts::new(
                        "namespace_oldest_store_wait_seconds",
                        "How long the oldest PyTorch store wait (WAIT, a blocking get, BARRIER) of a connection on this node has stood, by namespace (a wait sent again on the same keys after its client's timeout counts from the first; the largest namespaces, the rest as other)",
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
        let core_metrics: Vec<Box<dyn prometheus::core::Collector>> = vec![
            Box::new(proposals.proposals),
            Box::new(proposals.seconds),
            Box::new(proposals.forward_batches),
        ];
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
        self.ns_oldest_store_wait.reset();
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
            if let Some(secs) = r.oldest_store_wait {
                self.ns_oldest_store_wait.with_label_values(&l).set(secs);
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

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

#[cfg(test)]
mod tests;
