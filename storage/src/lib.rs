//! coordstore-storage: the node's durable journal. One sled database per node
//! holds the Raft log (big-endian u64 keys), the vote, the committed index and
//! the newest snapshot. The state machine is a `journal::State` held in memory
//! and rebuilt at start from that snapshot plus the log after it: restart is
//! journal replay. sled sits behind the crate's own [`Backend`] trait, with a
//! bounded cache; a data dir of another cluster or node, or a corrupted one,
//! is refused with an error naming the path and the reason.
//!
//! The openraft type configuration ([`TypeConfig`]) lives here too: an entry
//! carries a [`Proposal`] (a batch of journal updates), its response the
//! [`Outcomes`] in order.

mod backend;
pub mod backup;
mod log_store;
pub mod metrics;
mod state_machine;
mod types;
mod wal;

use std::path::Path;
use std::sync::Arc;

pub use backend::{Backend, Identity, OpenError, SledBackend, SnapshotFill};
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
    let sled = SledBackend::open(dir, cache_bytes, identity)?;
    let marker = sled.committed_marker();
    let backend: Arc<dyn Backend> = Arc::new(sled);
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
