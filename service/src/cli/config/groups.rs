//! Raft's tuning and the tf.data dispatcher's settings.

use super::*;

/// Raft's tuning.
#[derive(clap::Args, Deserialize, Default, Debug, Clone)]
#[serde(default)]
pub struct RaftOptions {
    /// Snapshot after this many log entries [default: 50000]
    #[arg(long)]
    pub snapshot_every: Option<u64>,
    /// Also snapshot after this many bytes of log since the last one; 0 = by entries only [default: 8388608]
    #[arg(long)]
    pub snapshot_log_bytes: Option<u64>,
    /// Log entries kept behind a snapshot [default: 100]
    #[arg(long)]
    pub keep_behind_snapshot: Option<u64>,
    /// Write batches handed to Raft before the earlier ones are applied
    /// (group commit: updates queued meanwhile share the next entry) [default: 2]
    #[arg(long)]
    pub max_inflight_batches: Option<usize>,
    /// Threads of a runtime of Raft's own (core, state machine, replication,
    /// write batcher); 0 runs them on the node's runtime [default: 0]
    #[arg(long)]
    pub raft_threads: Option<usize>,
    /// Raft heartbeat interval [default: 100]
    #[arg(long)]
    pub raft_heartbeat_ms: Option<u64>,
    /// A follower that hears no leader for this long to 1.5× campaigns [default: 1000]
    #[arg(long)]
    pub election_timeout_ms: Option<u64>,
    /// Free bytes kept under the data dir: below it the node hands
    /// leadership to a healthy voter and does not campaign, a leader no
    /// voter can replace refuses client writes, and a node does not start;
    /// 0 = no reserve [default: 67108864]
    #[arg(long)]
    pub disk_reserve_bytes: Option<u64>,
    /// A log fdatasync slower than this (99th percentile over 10 s, a
    /// running one at its age) makes the node hand leadership to a healthy
    /// voter and not campaign; 0 = not watched [default: 1000]
    #[arg(long)]
    pub slow_fsync_ms: Option<u64>,
}
layered!(RaftOptions {
    snapshot_every,
    snapshot_log_bytes,
    keep_behind_snapshot,
    max_inflight_batches,
    raft_threads,
    raft_heartbeat_ms,
    election_timeout_ms,
    disk_reserve_bytes,
    slow_fsync_ms
});

/// The tf.data dispatcher's settings.
#[derive(clap::Args, Deserialize, Default, Debug, Clone)]
#[serde(default)]
pub struct TfDataOptions {
    /// The tf.data service version GetVersion answers; clients and workers
    /// require their own (TensorFlow 2.21: 9) [default: 9]
    #[arg(long)]
    pub tfdata_version: Option<i64>,
    /// A tf.data client with no heartbeat for this long is released [default: 300000]
    #[arg(long)]
    pub tfdata_client_timeout_ms: Option<u64>,
    /// An iteration without clients for this long is garbage collected; 0 = never [default: 300000]
    #[arg(long)]
    pub tfdata_gc_timeout_ms: Option<u64>,
    /// A tf.data worker with no heartbeat for this long is logged as lost
    /// (its tasks are kept, as upstream) [default: 600000]
    #[arg(long)]
    pub tfdata_worker_timeout_ms: Option<u64>,
    /// The tf.data workers of static sharding (FILE, DATA, FILE_OR_DATA,
    /// HINT), in worker-index order, comma-separated; a `%port%` in an entry
    /// matches any port [default: none]
    #[arg(long)]
    pub tfdata_worker_addresses: Option<String>,
}
layered!(TfDataOptions {
    tfdata_version,
    tfdata_client_timeout_ms,
    tfdata_gc_timeout_ms,
    tfdata_worker_timeout_ms,
    tfdata_worker_addresses
});

/// `--tf-cluster-spec` gives an address to every task of each `--job`, and
/// is given only with `--job`.
pub(super) fn check_tf_addresses(
    jobs: &[JobSpec],
    tf_addresses: &BTreeMap<String, Vec<String>>,
) -> Result<(), String> {
    if tf_addresses.is_empty() {
        return Ok(());
    }
    for j in jobs {
        let have = tf_addresses.get(&j.name).map_or(0, Vec::len);
        if have < j.count as usize {
            return Err(format!(
                "--tf-cluster-spec lists {have} address(es) for job {}, --job says {}",
                j.name, j.count
            ));
        }
    }
    if jobs.is_empty() {
        return Err("--tf-cluster-spec needs the coordinated jobs named with --job".into());
    }
    Ok(())
}

impl RaftOptions {
    /// Raft's settings: the defaults, with what is set.
    pub(super) fn settings(&self) -> raft::RaftSettings {
        let mut raft = raft::RaftSettings::default();
        if let Some(v) = self.snapshot_every {
            raft.snapshot_every_entries = v.max(1);
        }
        if let Some(v) = self.snapshot_log_bytes {
            raft.snapshot_log_bytes = v;
        }
        if let Some(v) = self.keep_behind_snapshot {
            raft.keep_entries_behind_snapshot = v;
        }
        if let Some(v) = self.max_inflight_batches {
            raft.max_inflight_batches = v.max(1);
        }
        if let Some(v) = self.raft_threads {
            raft.raft_threads = v;
        }
        if let Some(v) = self.raft_heartbeat_ms {
            raft.heartbeat_interval_ms = v;
        }
        if let Some(v) = self.election_timeout_ms {
            raft = raft.with_election_timeout(v);
        }
        if let Some(v) = self.disk_reserve_bytes {
            raft.disk_reserve_bytes = v;
        }
        if let Some(v) = self.slow_fsync_ms {
            raft.slow_fsync_ms = v;
        }
        raft
    }
}

impl TfDataOptions {
    /// The dispatcher's settings: the defaults, with what is set.
    pub(super) fn config(&self) -> TfDataConfig {
        let d = TfDataConfig::default();
        TfDataConfig {
            version: self.tfdata_version.unwrap_or(d.version),
            client_timeout_ms: self.tfdata_client_timeout_ms.unwrap_or(d.client_timeout_ms),
            gc_timeout_ms: self.tfdata_gc_timeout_ms.unwrap_or(d.gc_timeout_ms),
            worker_timeout_ms: self.tfdata_worker_timeout_ms.unwrap_or(d.worker_timeout_ms),
            worker_addresses: self
                .tfdata_worker_addresses
                .as_deref()
                .map(|l| {
                    l.split(',')
                        .map(str::trim)
                        .filter(|a| !a.is_empty())
                        .map(str::to_string)
                        .collect()
                })
                .unwrap_or_default(),
        }
    }
}
