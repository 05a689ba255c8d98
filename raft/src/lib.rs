//! coordstore-raft: replication of the journal across the nodes with openraft
//! 0.10 (alpha.37). A [`RaftNode`] owns the storage, openraft, a **write
//! batcher** that packs every update queued while earlier entries are in
//! flight into one Raft entry (group commit),
//! and a **read coalescer** that serves every read queued before a quorum
//! round started with that one round (ReadIndex: the read index is captured
//! before the round, and the read waits until the state the service reads
//! has applied it). Peer RPCs (append, vote, snapshot) travel
//! over tonic with one cached channel per peer. Bootstrap of a static cluster
//! is idempotent; membership changes are library calls.

// openraft fixes the error types of its API (some are large).
#![allow(clippy::result_large_err)]

mod batcher;
mod config;
mod contact;
pub mod health;
pub mod metrics;
mod network;
mod node;
mod reads;
mod steward;

pub use batcher::{Applied, ProposeError};
pub use config::{RaftSettings, DEFAULT_DISK_RESERVE_BYTES, DEFAULT_SLOW_FSYNC_MS};
pub use contact::QUORUM_AGE_HEADER;
pub use network::{
    Channels, PeerNetwork, PeerService, PeerToken, Raft, PEER_CLUSTER_HEADER, PEER_TOKEN_HEADER,
};
pub use node::{
    leading_term, LeaderView, MetricsWatch, NodeConfig, RaftNode, Role, ServerWatch, StartError,
};
/// The trait of [`MetricsWatch`] (`borrow_watched`, `changed`).
pub use openraft::type_config::async_runtime::WatchReceiver;
