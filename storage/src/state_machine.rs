//! The state machine: `journal::State` in memory, snapshots on the
//! [`Backend`]. At start it is rebuilt from the newest snapshot; openraft then
//! re-applies the committed log after it (journal replay).
//!
//! A snapshot is encoded once, under the read lock, when openraft asks for a
//! builder (serialised with `apply`, so it is a point-in-time view without a
//! copy of the state), written to its own file (not into sled, whose cache
//! would keep it), and handed to openraft without another copy. The log
//! bytes applied since the last snapshot are counted, so that the node can
//! also snapshot by log size.

use std::io::Cursor;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard};

use futures_util::TryStreamExt;
use journal::State;
use openraft::storage::{EntryResponder, RaftStateMachine};
use openraft::{EntryPayload, OptionalSend, RaftSnapshotBuilder};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::backend::Backend;
use crate::log_store::{blocking, decode, encode, io_err};
use crate::types::{
    LogId, Outcomes, Snapshot, SnapshotData, SnapshotMeta, StoredMembership, TypeConfig,
};

/// Where snapshots lived in sled before they got their own file; still read
/// at start, and removed once a newer snapshot is stored.
const LEGACY_SNAPSHOT_KEY: &str = "snapshot";

#[derive(Serialize, Deserialize)]
struct StoredSnapshot {
    meta: SnapshotMeta,
    data: Vec<u8>,
}

#[derive(Clone, Default)]
struct SmData {
    state: State,
    last_applied: Option<LogId>,
    membership: StoredMembership,
}

struct Shared {
    data: RwLock<SmData>,
    applied: watch::Sender<u64>,
    /// Encoded log payload bytes applied since the last snapshot began.
    log_bytes: AtomicU64,
}

impl Shared {
    fn read(&self) -> RwLockReadGuard<'_, SmData> {
        self.data.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, SmData> {
        self.data.write().unwrap_or_else(|p| p.into_inner())
    }
}

/// A read handle on the applied state, shared with the service: read the
/// state and wait for applies.
#[derive(Clone)]
pub struct StateHandle(Arc<Shared>);

impl StateHandle {
    /// Runs `f` on the current state.
    pub fn read<T>(&self, f: impl FnOnce(&State) -> T) -> T {
        f(&self.0.read().state)
    }

    /// A receiver of the last applied log index, changed after every apply.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.0.applied.subscribe()
    }

    /// The last applied log id.
    pub fn last_applied(&self) -> Option<LogId> {
        self.0.read().last_applied
    }

    /// The membership as last applied.
    pub fn membership(&self) -> StoredMembership {
        self.0.read().membership.clone()
    }

    /// The state's snapshot encoding and the log index it was applied up
    /// to, read together.
    pub fn encode_snapshot(&self) -> (Vec<u8>, u64) {
        let d = self.0.read();
        (
            d.state.encode_snapshot(),
            d.last_applied.map_or(0, |l| l.index),
        )
    }

    /// The digest of the current state.
    pub fn digest_hex(&self) -> String {
        self.read(|s| s.digest_hex())
    }

    /// Bytes of log payload applied since the last snapshot was started.
    pub fn log_bytes_since_snapshot(&self) -> u64 {
        self.0.log_bytes.load(Ordering::Relaxed)
    }
}

/// The state machine of one node.
pub struct StateMachine {
    shared: Arc<Shared>,
    backend: Arc<dyn Backend>,
    /// The last log id of the stored snapshot; serialises storing.
    stored: Arc<Mutex<Option<LogId>>>,
}

impl StateMachine {
    /// Loads the newest snapshot, if any, from `backend`.
    pub(crate) fn open(backend: Arc<dyn Backend>) -> Result<Self, String> {
        let mut data = SmData::default();
        let stored = load_snapshot(backend.as_ref())?;
        if let Some(stored) = &stored {
            data.state = State::decode_snapshot(&stored.data)
                .map_err(|e| format!("the snapshot is corrupted: {e}"))?;
            data.last_applied = stored.meta.last_log_id;
            data.membership = stored.meta.last_membership.clone();
        }
        let applied = data.last_applied.map_or(0, |l| l.index);
        let (tx, _) = watch::channel(applied);
        Ok(StateMachine {
            shared: Arc::new(Shared {
                data: RwLock::new(data),
                applied: tx,
                log_bytes: AtomicU64::new(0),
            }),
            backend,
            stored: Arc::new(Mutex::new(stored.and_then(|s| s.meta.last_log_id))),
        })
    }

    /// The read handle shared with the service.
    pub fn handle(&self) -> StateHandle {
        StateHandle(self.shared.clone())
    }
}

/// The stored snapshot: its own file, or (data dirs of older versions) the
/// sled record it used to be.
fn load_snapshot(backend: &dyn Backend) -> Result<Option<StoredSnapshot>, String> {
    match backend.snapshot_get() {
        Err(e) => return Err(format!("cannot read the snapshot: {e}")),
        Ok(Some((meta, data))) => {
            let meta =
                decode(&meta).map_err(|e| format!("the snapshot metadata is corrupted: {e}"))?;
            return Ok(Some(StoredSnapshot { meta, data }));
        }
        Ok(None) => {}
    }
    match backend.meta_get(LEGACY_SNAPSHOT_KEY) {
        Err(e) => Err(format!("cannot read the snapshot: {e}")),
        Ok(None) => Ok(None),
        Ok(Some(raw)) => decode(&raw)
            .map(Some)
            .map_err(|e| format!("the snapshot record is corrupted: {e}")),
    }
}

/// Stores a snapshot unless a newer one is stored already. A build runs
/// beside later applies and can finish after a newer snapshot was installed
/// from the leader (and the log purged behind it); writing the older one
/// over it would leave the node unable to restart. `stored` serialises the
/// compare-and-write between builds and installs.
async fn store_snapshot(
    backend: Arc<dyn Backend>,
    stored: Arc<Mutex<Option<LogId>>>,
    meta: SnapshotMeta,
    data: Vec<u8>,
) -> std::io::Result<Vec<u8>> {
    let meta_bytes = encode(&meta).map_err(|e| io_err("encoding snapshot metadata", e))?;
    let new_last = meta.last_log_id;
    blocking(move || {
        let mut current = stored.lock().unwrap_or_else(|p| p.into_inner());
        if current.is_some() && *current > new_last {
            return Ok(data);
        }
        backend.snapshot_put(&meta_bytes, &data)?;
        // A snapshot of an older version's data dir lived in sled.
        backend.meta_remove(LEGACY_SNAPSHOT_KEY)?;
        *current = new_last;
        Ok(data)
    })
    .await
}

/// Builds a snapshot from the encoding taken when it was created.
pub struct SnapshotBuilder {
    meta: SnapshotMeta,
    data: Vec<u8>,
    backend: Arc<dyn Backend>,
    stored: Arc<Mutex<Option<LogId>>>,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    type SnapshotData = SnapshotData;

    async fn build_snapshot(&mut self) -> std::io::Result<Snapshot> {
        let data = std::mem::take(&mut self.data);
        let data = store_snapshot(
            self.backend.clone(),
            self.stored.clone(),
            self.meta.clone(),
            data,
        )
        .await?;
        crate::metrics::SNAPSHOT_BUILDS.inc();
        crate::metrics::SNAPSHOT_BYTES.set(data.len() as i64);
        Ok(Snapshot {
            meta: self.meta.clone(),
            snapshot: Cursor::new(data),
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotData = SnapshotData;
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> std::io::Result<(Option<LogId>, StoredMembership)> {
        let d = self.shared.read();
        Ok((d.last_applied, d.membership.clone()))
    }

    /// Applies a run of committed entries under one write lock, publishes
    /// the new applied index, then answers each entry's waiter (the write
    /// batcher checks the state is applied when it is answered).
    async fn apply<S>(&mut self, entries: S) -> std::io::Result<()>
    where
        S: futures_util::Stream<Item = std::io::Result<EntryResponder<TypeConfig>>>
            + Unpin
            + OptionalSend,
    {
        let entries: Vec<EntryResponder<TypeConfig>> = entries.try_collect().await?;
        let mut answers = Vec::with_capacity(entries.len());
        let last_index = {
            let mut d = self.shared.write();
            for (entry, responder) in entries {
                if let Some(prev) = d.last_applied {
                    if entry.log_id.index <= prev.index {
                        tracing::error!(
                            "non-monotonic apply: entry {} after {}",
                            entry.log_id,
                            prev
                        );
                    }
                }
                d.last_applied = Some(entry.log_id);
                let outcomes = match entry.payload {
                    EntryPayload::Blank => Outcomes::default(),
                    EntryPayload::Normal(p) => {
                        self.shared
                            .log_bytes
                            .fetch_add(p.encoded_len() as u64, Ordering::Relaxed);
                        Outcomes(p.batch().updates.iter().map(|u| d.state.apply(u)).collect())
                    }
                    EntryPayload::Membership(m) => {
                        d.membership = StoredMembership::new(Some(entry.log_id), m);
                        Outcomes::default()
                    }
                };
                if let Some(r) = responder {
                    answers.push((r, outcomes));
                }
            }
            d.last_applied.map_or(0, |l| l.index)
        };
        self.shared.applied.send_replace(last_index);
        for (r, outcomes) in answers {
            r.send(outcomes);
        }
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        // Serialised with apply: encoding here is a point-in-time view.
        let d = self.shared.read();
        self.shared.log_bytes.store(0, Ordering::Relaxed);
        SnapshotBuilder {
            meta: SnapshotMeta {
                last_log_id: d.last_applied,
                last_membership: d.membership.clone(),
            },
            data: d.state.encode_snapshot(),
            backend: self.backend.clone(),
            stored: self.stored.clone(),
        }
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: SnapshotData,
    ) -> std::io::Result<()> {
        let data = snapshot.into_inner();
        let state = State::decode_snapshot(&data)
            .map_err(|e| io_err("decoding the snapshot from the leader", e))?;
        store_snapshot(
            self.backend.clone(),
            self.stored.clone(),
            meta.clone(),
            data,
        )
        .await?;
        self.shared.log_bytes.store(0, Ordering::Relaxed);
        tracing::warn!(last_log_id = ?meta.last_log_id, "installing a snapshot");
        let index = {
            let mut d = self.shared.write();
            d.state = state;
            d.last_applied = meta.last_log_id;
            d.membership = meta.last_membership.clone();
            d.last_applied.map_or(0, |l| l.index)
        };
        self.shared.applied.send_replace(index);
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> std::io::Result<Option<Snapshot>> {
        let backend = self.backend.clone();
        let stored = blocking(move || load_snapshot(backend.as_ref()))
            .await
            .map_err(std::io::Error::other)?;
        Ok(stored.map(|s| Snapshot {
            meta: s.meta,
            snapshot: Cursor::new(s.data),
        }))
    }
}
