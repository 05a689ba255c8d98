//! Storage metrics, process-wide (one node per process in production): the
//! node's registry (`service::ops`) exposes them.

use std::sync::LazyLock;

use prometheus::{exponential_buckets, Histogram, HistogramOpts, IntCounter, IntGauge};

/// A histogram of `count` buckets: the first bound `first`, each next bound
/// twice the one before.
fn histogram(name: &str, help: &str, first: f64, count: usize) -> Histogram {
    Histogram::with_opts(
        HistogramOpts::new(name, help)
            .buckets(exponential_buckets(first, 2.0, count).expect("valid buckets")),
    )
    .expect("valid histogram")
}

/// Duration of each log flush (the segment files' fdatasync): one per group of
/// appends.
pub static FLUSH_SECONDS: LazyLock<Histogram> = LazyLock::new(|| {
    histogram(
        "storage_flush_seconds",
        "Log flush (sled flush and fdatasync) duration, one per group of appends",
        0.000_05,
        20,
    )
});

/// Appended batches made durable by one flush (group commit size).
pub static FLUSH_APPENDS: LazyLock<Histogram> = LazyLock::new(|| {
    histogram(
        "storage_flush_appends",
        "Appended batches of Raft entries made durable by one flush",
        1.0,
        12,
    )
});

/// From an append (written, not yet durable) until the flusher reports it
/// durable: the flush it waits for, and the one in progress before it.
pub static APPEND_DURABLE_SECONDS: LazyLock<Histogram> = LazyLock::new(|| {
    histogram(
        "storage_append_durable_seconds",
        "Time from a log append until it is reported durable (fdatasync)",
        0.000_01,
        20,
    )
});

/// Applying a run of committed entries to the state (the answers to their
/// writers excluded).
pub static APPLY_SECONDS: LazyLock<Histogram> = LazyLock::new(|| {
    histogram(
        "storage_apply_seconds",
        "Time to apply a run of committed entries to the state",
        0.000_001,
        24,
    )
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
