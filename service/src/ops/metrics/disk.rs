//! The disk's gauges: free bytes, the reserve, fdatasync latency, whether
//! writes are refused.

use super::*;

/// The disk's health, read off the node at scrape time.
pub(super) struct DiskGauges {
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
    pub(super) fn new(r: &Registry) -> DiskGauges {
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

    pub(super) fn render(&self, node: &raft::RaftNode) {
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
