//! The state machine: `journal::State` in memory, snapshots on the
//! [`Backend`]. At start it is rebuilt from the newest snapshot; openraft then
//! re-applies the committed log after it (journal replay).

use std::io::Cursor;
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard};

use journal::State;
use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{EntryPayload, ErrorSubject, ErrorVerb, OptionalSend, RaftSnapshotBuilder};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::backend::Backend;
use crate::log_store::{blocking, decode, encode, io_err};
use crate::types::{
    Entry, LogId, Outcomes, SnapshotMeta, StorageError, StoredMembership, TypeConfig,
};

const SNAPSHOT_KEY: &str = "snapshot";

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

    /// The digest of the current state.
    pub fn digest_hex(&self) -> String {
        self.read(|s| s.digest_hex())
    }
}

/// The state machine of one node.
pub struct StateMachine {
    shared: Arc<Shared>,
    backend: Arc<dyn Backend>,
    snapshot_guard: Arc<Mutex<()>>,
    snapshot_seq: u64,
}

impl StateMachine {
    /// Loads the newest snapshot, if any, from `backend`.
    pub(crate) fn open(backend: Arc<dyn Backend>) -> Result<Self, String> {
        let mut data = SmData::default();
        if let Some(stored) = load_snapshot(backend.as_ref())? {
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
            }),
            backend,
            snapshot_guard: Arc::new(Mutex::new(())),
            snapshot_seq: 0,
        })
    }

    /// The read handle shared with the service.
    pub fn handle(&self) -> StateHandle {
        StateHandle(self.shared.clone())
    }
}

fn load_snapshot(backend: &dyn Backend) -> Result<Option<StoredSnapshot>, String> {
    match backend.meta_get(SNAPSHOT_KEY) {
        Err(e) => Err(format!("cannot read the snapshot: {e}")),
        Ok(None) => Ok(None),
        Ok(Some(raw)) => decode(&raw)
            .map(Some)
            .map_err(|e| format!("the snapshot record is corrupted: {e}")),
    }
}

/// Stores `snap` as the current snapshot unless a newer one is stored
/// already. A build runs beside later applies and can finish after a newer
/// snapshot was installed from the leader (and the log purged behind it);
/// writing the older one over it would leave the node unable to restart.
/// `guard` serialises the compare-and-write between builds and installs.
async fn store_snapshot(
    backend: Arc<dyn Backend>,
    guard: Arc<Mutex<()>>,
    snap: StoredSnapshot,
) -> Result<(), StorageError> {
    let subject = ErrorSubject::Snapshot(Some(snap.meta.signature()));
    let bytes = encode(&snap).map_err(|e| io_err(subject.clone(), ErrorVerb::Write, e))?;
    let new_last = snap.meta.last_log_id;
    blocking(move || {
        let _g = guard.lock().unwrap_or_else(|p| p.into_inner());
        if let Ok(Some(stored)) = load_snapshot(backend.as_ref()) {
            if stored.meta.last_log_id > new_last {
                return Ok(());
            }
        }
        backend.meta_put(SNAPSHOT_KEY, &bytes, true)
    })
    .await
    .map_err(|e| io_err(subject, ErrorVerb::Write, e))
}

/// Builds a snapshot from a point-in-time copy taken when it was created.
pub struct SnapshotBuilder {
    copy: SmData,
    backend: Arc<dyn Backend>,
    guard: Arc<Mutex<()>>,
    seq: u64,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError> {
        let data = self.copy.state.encode_snapshot();
        let last = self.copy.last_applied;
        let snapshot_id = match last {
            Some(l) => format!("{}-{}-{}", l.leader_id, l.index, self.seq),
            None => format!("--{}", self.seq),
        };
        let meta = SnapshotMeta {
            last_log_id: last,
            last_membership: self.copy.membership.clone(),
            snapshot_id,
        };
        store_snapshot(
            self.backend.clone(),
            self.guard.clone(),
            StoredSnapshot {
                meta: meta.clone(),
                data: data.clone(),
            },
        )
        .await?;
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), StorageError> {
        let d = self.shared.read();
        Ok((d.last_applied, d.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Outcomes>, StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut responses = Vec::new();
        let last_index = {
            let mut d = self.shared.write();
            for entry in entries {
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
                match entry.payload {
                    EntryPayload::Blank => responses.push(Outcomes::default()),
                    EntryPayload::Normal(p) => {
                        let outs = p.0.updates.iter().map(|u| d.state.apply(u)).collect();
                        responses.push(Outcomes(outs));
                    }
                    EntryPayload::Membership(m) => {
                        d.membership = StoredMembership::new(Some(entry.log_id), m);
                        responses.push(Outcomes::default());
                    }
                }
            }
            d.last_applied.map_or(0, |l| l.index)
        };
        self.shared.applied.send_replace(last_index);
        Ok(responses)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.snapshot_seq += 1;
        SnapshotBuilder {
            copy: self.shared.read().clone(),
            backend: self.backend.clone(),
            guard: self.snapshot_guard.clone(),
            seq: self.snapshot_seq,
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError> {
        let data = snapshot.into_inner();
        let subject = ErrorSubject::Snapshot(Some(meta.signature()));
        let state =
            State::decode_snapshot(&data).map_err(|e| io_err(subject, ErrorVerb::Read, e))?;
        store_snapshot(
            self.backend.clone(),
            self.snapshot_guard.clone(),
            StoredSnapshot {
                meta: meta.clone(),
                data,
            },
        )
        .await?;
        tracing::warn!(snapshot = %meta.snapshot_id, "installing a snapshot");
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

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError> {
        let backend = self.backend.clone();
        let stored = blocking(move || load_snapshot(backend.as_ref()))
            .await
            .map_err(|e| {
                io_err(
                    ErrorSubject::Snapshot(None),
                    ErrorVerb::Read,
                    std::io::Error::other(e),
                )
            })?;
        Ok(stored.map(|s| Snapshot {
            meta: s.meta,
            snapshot: Box::new(Cursor::new(s.data)),
        }))
    }
}
