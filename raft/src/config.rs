//! Replication settings and their mapping to `openraft::Config`.

use std::sync::Arc;

/// Tunables of one node's replication. Defaults suit a loaded 2-core machine
/// (heartbeat 100 ms; a follower that hears no leader for 1–1.5 s campaigns,
/// see [`RaftSettings::with_election_timeout`]) and snapshot rarely.
#[derive(Clone, Debug)]
pub struct RaftSettings {
    /// Leader heartbeat interval.
    pub heartbeat_interval_ms: u64,
    /// openraft's lower bound of the randomised election timeout.
    pub election_timeout_min_ms: u64,
    /// openraft's upper bound of the election timeout; also its leader lease.
    pub election_timeout_max_ms: u64,
    /// Build a snapshot after this many entries since the last one.
    pub snapshot_every_entries: u64,
    /// Also build one once this many bytes of log payload were applied since
    /// the last (0 = by entries only). The log stays in its segment files
    /// (`wal/`) until a snapshot lets it be purged, and a restart replays
    /// all of it after the snapshot.
    pub snapshot_log_bytes: u64,
    /// Entries kept in the log behind a snapshot (for lagging followers).
    pub keep_entries_behind_snapshot: u64,
    /// Most updates the write batcher packs into one entry.
    pub max_batch_updates: usize,
    /// Most bytes (encoded updates) the write batcher packs into one entry.
    pub max_batch_bytes: usize,
    /// Batches handed to Raft before the previous ones are applied.
    pub max_inflight_batches: usize,
    /// Largest peer RPC message, both directions.
    pub max_message_bytes: usize,
    /// Queued proposals before callers wait.
    pub proposal_queue: usize,
    /// Threads of a runtime of Raft's own (its core, state machine,
    /// replication streams, the write batcher and read coalescer); 0 runs
    /// them on the caller's runtime.
    pub raft_threads: usize,
    /// Free bytes kept under the data dir: below it the node is unfit to
    /// lead, hands leadership over, and as a leader no voter can replace
    /// refuses client writes (0: no reserve; see `health`).
    pub disk_reserve_bytes: u64,
    /// A log fdatasync percentile above this makes the node unfit to lead
    /// (0: not watched).
    pub slow_fsync_ms: u64,
}

impl Default for RaftSettings {
    fn default() -> Self {
        RaftSettings {
            heartbeat_interval_ms: 100,
            election_timeout_min_ms: 250,
            election_timeout_max_ms: 750,
            snapshot_every_entries: 50_000,
            snapshot_log_bytes: 8 << 20,
            keep_entries_behind_snapshot: 100,
            max_batch_updates: 4096,
            max_batch_bytes: 32 << 20,
            max_inflight_batches: 2,
            max_message_bytes: 1 << 30,
            proposal_queue: 65_536,
            raft_threads: 0,
            disk_reserve_bytes: DEFAULT_DISK_RESERVE_BYTES,
            slow_fsync_ms: DEFAULT_SLOW_FSYNC_MS,
        }
    }
}

/// What a node watches its disk for.
#[derive(Clone, Debug)]
pub struct HealthSettings {
    /// Free bytes kept under the data dir; below it the node is unhealthy
    /// (0: no reserve).
    pub disk_reserve_bytes: u64,
    /// An fdatasync percentile above this is slow (zero: not watched).
    pub slow_fsync: std::time::Duration,
}

/// The default disk reserve: 64 MiB, room for a few log segments (4 MiB
/// allocated ahead each) and a snapshot of a coordination state.
pub const DEFAULT_DISK_RESERVE_BYTES: u64 = 64 << 20;
/// The default slow-fdatasync threshold (a healthy disk syncs in
/// milliseconds).
pub const DEFAULT_SLOW_FSYNC_MS: u64 = 1000;

impl RaftSettings {
    /// The election timeout the settings give: a follower that hears no
    /// leader for between this and 1.5× this campaigns.
    pub fn election_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_millis(
            self.election_timeout_min_ms + self.election_timeout_max_ms,
        )
    }

    /// What the disk's health watch looks for.
    pub fn health(&self) -> HealthSettings {
        HealthSettings {
            disk_reserve_bytes: self.disk_reserve_bytes,
            slow_fsync: std::time::Duration::from_millis(self.slow_fsync_ms),
        }
    }

    /// Sets the election timeout `e`: a follower that hears nothing from a
    /// leader for between `e` and 1.5·`e` campaigns. openraft (0.9 and 0.10) waits its
    /// leader lease (= `election_timeout_max`) *plus* a random election
    /// timeout in [min, max) after the last message of a known leader, so
    /// `e` maps to min = e/4 and max = 3e/4 (the default 1000 ms gives 250 /
    /// 750). A split vote is retried after [e/4, 3e/4).
    pub fn with_election_timeout(mut self, e: u64) -> Self {
        self.election_timeout_min_ms = e / 4;
        self.election_timeout_max_ms = 3 * e / 4;
        self
    }

    /// The validated openraft configuration.
    pub fn openraft_config(&self, cluster_name: &str) -> Result<Arc<openraft::Config>, String> {
        let config = openraft::Config {
            cluster_name: cluster_name.to_string(),
            heartbeat_interval: self.heartbeat_interval_ms,
            election_timeout_min: self.election_timeout_min_ms,
            election_timeout_max: self.election_timeout_max_ms,
            // openraft 0.10 sends a snapshot whole: the limit covers the
            // transfer and the install of all of it.
            install_snapshot_timeout: 60_000.max(self.election_timeout_max_ms),
            snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(self.snapshot_every_entries),
            max_in_snapshot_log_to_keep: self.keep_entries_behind_snapshot,
            // Keep replication streaming (not snapshotting) for lagging peers
            // up to the snapshot interval.
            replication_lag_threshold: self.snapshot_every_entries.max(5000),
            // Purging is considered after each snapshot only: purge then
            // whatever the snapshot covers beyond the entries kept.
            purge_batch_size: 1,
            // A node restarted with its own committed vote starts as a
            // follower and campaigns in a new term, committing a fresh entry
            // before it serves: restored as leader of its old term, it would
            // serve reads with the commit index it found on disk, which can
            // be behind what it acknowledged (openraft #1511). Required for
            // safety with the log flusher too: a restored leader that lost
            // its unflushed tail would propose another entry under a log id
            // its followers already hold. Never turn it back on.
            enable_leader_restore: Some(false),
            ..Default::default()
        };
        config
            .validate()
            .map(Arc::new)
            .map_err(|e| format!("invalid raft settings: {e}"))
    }
}
