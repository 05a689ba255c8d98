//! Replication metrics, process-wide (one node per process in production):
//! the node's registry (`service::ops`) exposes them.

use std::sync::LazyLock;

use prometheus::{exponential_buckets, Histogram, HistogramOpts};

/// Updates the write batcher packed into one Raft entry (group commit).
pub static BATCH_UPDATES: LazyLock<Histogram> = LazyLock::new(|| {
    Histogram::with_opts(
        HistogramOpts::new(
            "raft_batch_updates",
            "Updates packed into one Raft entry by the write batcher",
        )
        .buckets(exponential_buckets(1.0, 2.0, 14).expect("valid buckets")),
    )
    .expect("valid histogram")
});

/// Every replication metric, to register.
pub fn collectors() -> Vec<Box<dyn prometheus::core::Collector>> {
    vec![Box::new(BATCH_UPDATES.clone())]
}
