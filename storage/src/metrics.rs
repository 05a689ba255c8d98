//! Storage metrics, process-wide (one node per process in production): the
//! node's registry (`service::ops`) exposes them.

use std::sync::LazyLock;

use prometheus::{exponential_buckets, Histogram, HistogramOpts, IntCounter, IntGauge};

/// Duration of each log flush (sled flush + fdatasync): one per group of
/// appends.
pub static FLUSH_SECONDS: LazyLock<Histogram> = LazyLock::new(|| {
    Histogram::with_opts(
        HistogramOpts::new(
            "storage_flush_seconds",
            "Log flush (sled flush and fdatasync) duration, one per group of appends",
        )
        .buckets(exponential_buckets(0.000_05, 2.0, 20).expect("valid buckets")),
    )
    .expect("valid histogram")
});

/// Appended batches made durable by one flush (group commit size).
pub static FLUSH_APPENDS: LazyLock<Histogram> = LazyLock::new(|| {
    Histogram::with_opts(
        HistogramOpts::new(
            "storage_flush_appends",
            "Appended batches of Raft entries made durable by one flush",
        )
        .buckets(exponential_buckets(1.0, 2.0, 12).expect("valid buckets")),
    )
    .expect("valid histogram")
});

/// From an append (written, not yet durable) until the flusher reports it
/// durable: the flush it waits for, and the one in progress before it.
pub static APPEND_DURABLE_SECONDS: LazyLock<Histogram> = LazyLock::new(|| {
    Histogram::with_opts(
        HistogramOpts::new(
            "storage_append_durable_seconds",
            "Time from a log append until it is reported durable (fdatasync)",
        )
        .buckets(exponential_buckets(0.000_01, 2.0, 20).expect("valid buckets")),
    )
    .expect("valid histogram")
});

/// Applying a run of committed entries to the state (the answers to their
/// writers excluded).
pub static APPLY_SECONDS: LazyLock<Histogram> = LazyLock::new(|| {
    Histogram::with_opts(
        HistogramOpts::new(
            "storage_apply_seconds",
            "Time to apply a run of committed entries to the state",
        )
        .buckets(exponential_buckets(0.000_001, 2.0, 24).expect("valid buckets")),
    )
    .expect("valid histogram")
});

/// Snapshots built.
pub static SNAPSHOT_BUILDS: LazyLock<IntCounter> = LazyLock::new(|| {
    IntCounter::new("storage_snapshot_builds_total", "Snapshots built").expect("valid counter")
});

/// Size of the newest snapshot built.
pub static SNAPSHOT_BYTES: LazyLock<IntGauge> = LazyLock::new(|| {
    IntGauge::new(
        "storage_snapshot_bytes",
        "Size of the newest snapshot built",
    )
    .expect("valid gauge")
});

/// Every storage metric, to register.
pub fn collectors() -> Vec<Box<dyn prometheus::core::Collector>> {
    vec![
        Box::new(FLUSH_SECONDS.clone()),
        Box::new(FLUSH_APPENDS.clone()),
        Box::new(APPEND_DURABLE_SECONDS.clone()),
        Box::new(APPLY_SECONDS.clone()),
        Box::new(SNAPSHOT_BUILDS.clone()),
        Box::new(SNAPSHOT_BYTES.clone()),
    ]
}
