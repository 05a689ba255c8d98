//! The namespace series: a row per namespace, the largest few by name and
//! the rest summed as `other`, so the series stay bounded.

use super::*;

/// One namespace's per-namespace series (or the sum of several, `other`).
pub(super) struct Row {
    pub(super) name: String,
    pub(super) keys: u64,
    pub(super) bytes: u64,
    pub(super) tasks: [u64; 3],
    pub(super) parked: u64,
    /// Quotas (0: none; never summed).
    pub(super) max_keys: u64,
    pub(super) max_bytes: u64,
    pub(super) max_parked: u64,
    /// The oldest pending barrier's wait in seconds, as the leader knows it.
    pub(super) oldest_barrier: Option<f64>,
    /// The oldest PyTorch store wait of a connection on this node, in
    /// seconds.
    pub(super) oldest_store_wait: Option<f64>,
}

impl Row {
    pub(super) fn other() -> Row {
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
            oldest_store_wait: None,
        }
    }

    /// Adds `r`'s counts (not its quotas) to this sum.
    pub(super) fn add(&mut self, r: &Row) {
        self.keys += r.keys;
        self.bytes += r.bytes;
        self.parked += r.parked;
        for i in 0..3 {
            self.tasks[i] += r.tasks[i];
        }
        let max = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        self.oldest_barrier = max(self.oldest_barrier, r.oldest_barrier);
        self.oldest_store_wait = max(self.oldest_store_wait, r.oldest_store_wait);
    }
}

/// A gauge vector by namespace in `registry`.
pub(super) fn ns_gauge(registry: &Registry, name: &str, help: &str) -> IntGaugeVec {
    let v = IntGaugeVec::new(Opts::new(name, help), &["namespace"]).expect("valid gauge");
    registry
        .register(Box::new(v.clone()))
        .expect("unique metric names");
    v
}

/// Every namespace of `s` as its series would show it, with the oldest
/// barrier waits this node knows (as the leader) and the oldest store waits
/// of its own connections.
pub(super) fn namespace_rows(core: &Core, s: &journal::State) -> Vec<Row> {
    let oldest = liveness_of(core.node())
        .map(|l| l.oldest_barriers(Instant::now()))
        .unwrap_or_default();
    let store_waits = core.store_sessions().oldest_waits();
    s.namespaces()
        .map(|n| {
            let u = n.usage();
            let spec = n.spec();
            Row {
                name: n.name().to_string(),
                keys: u.held.keys,
                bytes: u.held.bytes,
                tasks: u.tasks,
                parked: core.parking().parked_in(n.key()),
                max_keys: n.config().map_or(0, |c| c.max_keys),
                max_bytes: spec.map_or(0, |p| p.max_bytes),
                max_parked: spec.map_or(0, |p| p.max_parked_calls),
                oldest_barrier: oldest.get(n.key()).map(|(_, w)| w.ms as f64 / 1000.0),
                oldest_store_wait: store_waits.get(n.name()).map(|d| d.as_secs_f64()),
            }
        })
        .collect()
}

/// The `n` largest of `rows` by keys, and the rest (a namespace named
/// `other` among them) summed as [`OTHER`] if there is a rest.
pub(super) fn bucket(mut rows: Vec<Row>, n: usize) -> Vec<Row> {
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
