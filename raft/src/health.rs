//! Gray failures of a node's own disk, and what the node does about them.
//!
//! A node watches two things every [`CHECK_EVERY`] (the watch: `steward`): the free space under its
//! data dir against a reserve (`disk_reserve_bytes`), and how long its log's
//! fdatasyncs take (the 99th percentile over [`FSYNC_WINDOW`], the one
//! running counted at its age, against `slow_fsync_ms`). A node with either
//! problem is not fit to lead:
//!
//! * as leader it hands leadership to a healthy voter (openraft's leader
//!   transfer to the voter that answered `network::ask_health` healthy and matched
//!   the most of the log), as TiKV evicts leaders from slow stores; with no
//!   healthy voter and a disk below its reserve it refuses client writes
//!   ([`Health::refusing_writes`]) before the disk is full, and serves them
//!   again by itself once space is freed;
//! * it does not campaign (openraft's elections off) while another node can
//!   lead: after `steward::LEADERLESS_ELECTIONS` election timeouts without a
//!   leader it campaigns anyway, since a slow leader beats none.
//!
//! A node is also *stalled* while an fdatasync has run, or its Raft core
//! has not answered, for longer than the slow threshold: it cannot serve
//! now. Calls whose clients go to another node when told (the relay, the
//! agents, forwards) are then failed at once rather than held
//! ([`Health::stalls`]); a stock client's call waits, since an error would
//! end its job.
//!
//! A failed write or fdatasync is not a gray failure: the node stops (see
//! the storage crate's fail-stop rule).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use proto::coordstore::DiskHealth;
use storage::health::FlushWatch;
use storage::NodeId;

pub use crate::config::HealthSettings;

/// How often a node looks at its disk.
pub const CHECK_EVERY: Duration = Duration::from_millis(250);
/// The window of the fdatasync percentile.
pub const FSYNC_WINDOW: Duration = Duration::from_secs(10);

/// One look at the disk, and what the node did about it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HealthReport {
    /// Free bytes under the data dir (`None`: statvfs failed).
    pub free_bytes: Option<u64>,
    /// The reserve.
    pub reserve_bytes: u64,
    /// Free space is below the reserve.
    pub disk_low: bool,
    /// The fdatasync percentile (see the module doc).
    pub fsync_p99: Option<Duration>,
    /// The slow threshold (zero: not watched).
    pub slow_fsync: Duration,
    /// The percentile is over the threshold.
    pub fsync_slow: bool,
    /// Why this node, the leader, refuses client writes now.
    pub refusing_writes: Option<String>,
    /// Leadership transfers this node started.
    pub transfers: u64,
    /// The last one: to whom and why.
    pub last_transfer: Option<String>,
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64)
}

impl HealthReport {
    /// What is wrong with the disk, in words; `None`: nothing.
    pub fn problem(&self) -> Option<String> {
        let mut p = Vec::new();
        if self.disk_low {
            p.push(format!(
                "free space under the data dir ({}) is below the reserve ({}, --disk-reserve-bytes)",
                self.free_bytes.map_or("unknown".into(), mib),
                mib(self.reserve_bytes)
            ));
        }
        if self.fsync_slow {
            p.push(format!(
                "the log's fdatasync takes {} ms (99th percentile, over --slow-fsync-ms {})",
                self.fsync_p99.unwrap_or_default().as_millis(),
                self.slow_fsync.as_millis()
            ));
        }
        (!p.is_empty()).then(|| p.join("; "))
    }

    /// Its wire form.
    pub fn to_proto(&self) -> DiskHealth {
        DiskHealth {
            free_bytes: self.free_bytes.unwrap_or(0),
            free_known: self.free_bytes.is_some(),
            reserve_bytes: self.reserve_bytes,
            low: self.disk_low,
            fsync_p99_us: self.fsync_p99.map_or(0, |d| d.as_micros() as u64),
            slow_fsync_us: self.slow_fsync.as_micros() as u64,
            slow: self.fsync_slow,
            refusing_writes: self.refusing_writes.clone().unwrap_or_default(),
            transfers: self.transfers,
            last_transfer: self.last_transfer.clone().unwrap_or_default(),
            problem: self.problem().unwrap_or_default(),
        }
    }
}

/// A node's disk health, shared by its watch task, its peer service (which
/// answers `network::ask_health`) and its front door (which reads
/// [`Health::refusing_writes`]).
pub struct Health {
    settings: HealthSettings,
    data_dir: PathBuf,
    flushes: Arc<FlushWatch>,
    report: Mutex<HealthReport>,
    /// Whether this node may campaign (its elections are on).
    may_campaign: AtomicBool,
    /// Why this node is stalled now (`None`: it is not).
    stalled: tokio::sync::watch::Sender<Option<String>>,
    /// Whether `report.refusing_writes` is set: what every proposal reads,
    /// without the lock.
    refusing: AtomicBool,
}

impl Health {
    pub(crate) fn new(
        settings: HealthSettings,
        data_dir: PathBuf,
        flushes: Arc<FlushWatch>,
    ) -> Self {
        let report = HealthReport {
            reserve_bytes: settings.disk_reserve_bytes,
            slow_fsync: settings.slow_fsync,
            ..HealthReport::default()
        };
        Health {
            settings,
            data_dir,
            flushes,
            report: Mutex::new(report),
            may_campaign: AtomicBool::new(true),
            stalled: tokio::sync::watch::Sender::new(None),
            refusing: AtomicBool::new(false),
        }
    }

    /// Why this node is stalled now, if it is (see the module doc).
    pub fn stalled(&self) -> Option<String> {
        self.stalled.borrow().clone()
    }

    /// Returns why, once this node is stalled (at once if it is now).
    pub async fn stalls(&self) -> String {
        let mut rx = self.stalled.subscribe();
        loop {
            if let Some(why) = rx.borrow_and_update().clone() {
                return why;
            }
            if rx.changed().await.is_err() {
                return "the node stops".into();
            }
        }
    }

    /// Notes whether this node is stalled: an fdatasync running, or the
    /// Raft core silent since `core_answered`, for longer than the slow
    /// threshold.
    pub(crate) fn note_stall(&self, core_answered: Instant) {
        let slow = self.settings.slow_fsync;
        let why = match (self.flushes.running(), core_answered.elapsed()) {
            _ if slow.is_zero() => None,
            (Some(f), _) if f > slow => Some(format!(
                "an fdatasync of its log has run for {} ms",
                f.as_millis()
            )),
            (_, c) if c > slow => Some(format!(
                "its Raft core has not answered for {} ms",
                c.as_millis()
            )),
            _ => None,
        };
        self.stalled.send_if_modified(|now| {
            let changed = now.is_some() != why.is_some();
            *now = why;
            changed
        });
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HealthReport> {
        self.report.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The latest look.
    pub fn report(&self) -> HealthReport {
        self.lock().clone()
    }

    /// Why this node, the leader, refuses client writes now.
    pub fn refusing_writes(&self) -> Option<String> {
        if !self.refusing.load(Ordering::Relaxed) {
            return None;
        }
        self.lock().refusing_writes.clone()
    }

    /// Whether this node may campaign now.
    pub(crate) fn may_campaign(&self) -> bool {
        self.may_campaign.load(Ordering::Relaxed)
    }

    /// Notes whether this node may campaign; whether that changed.
    pub(crate) fn set_may_campaign(&self, on: bool) -> bool {
        self.may_campaign.swap(on, Ordering::Relaxed) != on
    }

    /// Looks at the disk now; what is wrong, if anything. Free space below
    /// the reserve clears once it is back above the reserve plus a 16th.
    pub(crate) fn sample(&self) -> Option<String> {
        let free = storage::health::free_bytes(&self.data_dir).ok();
        let p99 = self.flushes.p99(FSYNC_WINDOW);
        let mut r = self.lock();
        let reserve = self.settings.disk_reserve_bytes;
        r.free_bytes = free;
        r.disk_low = match free {
            _ if reserve == 0 => false,
            None => r.disk_low,
            Some(f) if r.disk_low => f < reserve.saturating_add(reserve / 16),
            Some(f) => f < reserve,
        };
        r.fsync_p99 = p99;
        let slow = self.settings.slow_fsync;
        r.fsync_slow = !slow.is_zero() && p99.is_some_and(|d| d > slow);
        r.problem()
    }

    pub(crate) fn set_refusing(&self, why: Option<String>) {
        let mut r = self.lock();
        self.refusing.store(why.is_some(), Ordering::Relaxed);
        r.refusing_writes = why;
    }

    pub(crate) fn transferred(&self, to: NodeId, why: &str) {
        let mut r = self.lock();
        r.transfers += 1;
        r.last_transfer = Some(format!("to node {to}: {why}"));
        self.refusing.store(false, Ordering::Relaxed);
        r.refusing_writes = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn health(reserve: u64, slow_ms: u64) -> (tempfile::TempDir, Health) {
        let dir = tempfile::tempdir().unwrap();
        let h = Health::new(
            HealthSettings {
                disk_reserve_bytes: reserve,
                slow_fsync: Duration::from_millis(slow_ms),
            },
            dir.path().to_path_buf(),
            Arc::default(),
        );
        (dir, h)
    }

    #[test]
    fn a_disk_below_the_reserve_is_a_problem_named_with_both_figures() {
        let (_d, h) = health(u64::MAX / 2, 0);
        let p = h.sample().expect("below an enormous reserve");
        assert!(p.contains("below the reserve") && p.contains("MiB"), "{p}");
        assert!(h.report().disk_low);
        let (_d, h) = health(0, 0);
        assert_eq!(h.sample(), None, "no reserve, no problem");
        let (_d, h) = health(1, 0);
        assert_eq!(h.sample(), None, "one byte is free");
    }

    #[test]
    fn a_running_fdatasync_over_the_threshold_is_slow_and_stalls_the_node() {
        let (_d, h) = health(0, 20);
        let flushes = h.flushes.clone();
        let (started, finish) = (std::sync::mpsc::channel(), std::sync::mpsc::channel::<()>());
        let sync = std::thread::spawn(move || {
            flushes.time(|| {
                started.0.send(()).unwrap();
                finish.1.recv().unwrap();
            })
        });
        started.1.recv().unwrap();
        std::thread::sleep(Duration::from_millis(40));
        assert_eq!(h.stalled(), None);
        h.note_stall(Instant::now());
        let why = h.stalled().expect("stalled while the sync runs");
        assert!(why.contains("fdatasync"), "{why}");
        let p = h.sample().expect("slow");
        assert!(
            p.contains("fdatasync") && p.contains("--slow-fsync-ms 20"),
            "{p}"
        );
        let wire = h.report().to_proto();
        assert!(wire.slow && wire.fsync_p99_us >= 40_000, "{wire:?}");
        assert_eq!(wire.problem, p);
        finish.0.send(()).unwrap();
        sync.join().unwrap();
        h.note_stall(Instant::now());
        assert_eq!(h.stalled(), None, "the sync ended");
        // A Raft core silent past the threshold stalls it too.
        h.note_stall(Instant::now() - Duration::from_millis(50));
        assert!(h.stalled().unwrap().contains("Raft core"));
    }
}
