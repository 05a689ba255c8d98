//! Replication metrics, process-wide (one node per process in production):
//! the node's registry (`service::ops`) exposes them.

use std::sync::LazyLock;

use prometheus::{exponential_buckets, Histogram, HistogramOpts, HistogramVec};

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

/// Where a write's time goes on the leader, by stage: `queue` (an update
/// waits in the write batcher until a batch takes it), `commit` (a batch,
/// from its proposal to Raft until it is applied and answered: append,
/// fdatasync, replication, commit, apply) and `resume` (an answered update
/// until its proposer runs again: the scheduler's hand-off). A proposal's
/// time (`coordstore_raft_proposal_seconds`) is about the three together.
pub static WRITE_STAGE_SECONDS: LazyLock<HistogramVec> = LazyLock::new(|| {
    HistogramVec::new(
        HistogramOpts::new(
            "raft_write_stage_seconds",
            "Time of a write on the leader by stage: queue (in the write batcher), \
             commit (a batch from proposal to answer), resume (answer to proposer)",
        )
        .buckets(exponential_buckets(0.000_01, 2.0, 20).expect("valid buckets")),
        &["stage"],
    )
    .expect("valid histogram")
});

/// The `queue` stage of [`WRITE_STAGE_SECONDS`] (one sample per update).
pub(crate) static STAGE_QUEUE: LazyLock<Histogram> =
    LazyLock::new(|| WRITE_STAGE_SECONDS.with_label_values(&["queue"]));
/// The `commit` stage of [`WRITE_STAGE_SECONDS`] (one sample per batch).
pub(crate) static STAGE_COMMIT: LazyLock<Histogram> =
    LazyLock::new(|| WRITE_STAGE_SECONDS.with_label_values(&["commit"]));
/// The `resume` stage of [`WRITE_STAGE_SECONDS`] (one sample per update).
pub(crate) static STAGE_RESUME: LazyLock<Histogram> =
    LazyLock::new(|| WRITE_STAGE_SECONDS.with_label_values(&["resume"]));

/// Every replication metric, to register.
pub fn collectors() -> Vec<Box<dyn prometheus::core::Collector>> {
    vec![
        Box::new(BATCH_UPDATES.clone()),
        Box::new(WRITE_STAGE_SECONDS.clone()),
    ]
}
