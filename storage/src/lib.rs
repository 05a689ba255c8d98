//! coordstore-storage: the node's durable journal. A data dir holds three
//! stores behind the crate's own [`Backend`] trait ([`DiskBackend`]): the Raft
//! log in segment files of its own (`wal/`, allocated ahead, one fdatasync
//! per group of appends), sled for metadata (the vote, the purge point, the
//! dir's identity and journal format; bounded cache), and the newest
//! snapshot in a file of its own; beside them a marker of the highest
//! committed index. The state machine is a `journal::State` held in memory
//! and rebuilt at start from that snapshot plus the log after it: restart is
//! journal replay. A data dir of another cluster or node, or a corrupted one,
//! is refused with an error naming the path and the reason.
//!
//! The openraft type configuration ([`TypeConfig`]) lives here too: an entry
//! carries a [`Proposal`] (a batch of journal updates), its response the
//! [`Outcomes`] in order.

mod backend;
pub mod backup;
mod fs;
pub mod health;
mod log_store;
mod meta;
pub mod metrics;
mod snapshot_file;
mod state_machine;
mod types;
mod wal;

use std::path::Path;
use std::sync::Arc;

pub use backend::{Backend, DiskBackend, Identity, OpenError, SnapshotFill};
pub use fs::{disk_error, errno_name};
pub use log_store::LogStore;
pub use state_machine::{ApplyObserver, SnapshotBuilder, StateHandle, StateMachine};
pub use types::{
    CallbackResponder, Entry, LeaderId, LogId, Node, NodeId, Outcomes, Proposal, Snapshot,
    SnapshotData, SnapshotMeta, StorageError, StoredMembership, TypeConfig, Vote,
};

/// Default sled page-cache bound: 64 MiB.
pub const DEFAULT_CACHE_BYTES: u64 = 64 * 1024 * 1024;

/// Opens the data dir of one node: the log store and the state machine
/// rebuilt from the newest snapshot.
pub fn open(
    dir: &Path,
    cache_bytes: u64,
    identity: &Identity,
) -> Result<(LogStore, StateMachine), OpenError> {
    let disk = DiskBackend::open(dir, cache_bytes, identity)?;
    let marker = disk.committed_marker();
    let backend: Arc<dyn Backend> = Arc::new(disk);
    let log = LogStore::new(backend.clone(), identity.node_id);
    log.check_readable().map_err(|r| OpenError::new(dir, r))?;
    let sm = StateMachine::open(backend).map_err(|r| OpenError::new(dir, r))?;
    let have = log
        .last_index()
        .map_err(|r| OpenError::new(dir, r))?
        .max(sm.handle().last_applied().map_or(0, |l| l.index));
    if marker > have {
        return Err(OpenError::new(
            dir,
            format!(
                "the database lost data: this node had committed log index {marker}, but its log and snapshot end at {have} (truncated or corrupted files)"
            ),
        ));
    }
    Ok((log, sm))
}
