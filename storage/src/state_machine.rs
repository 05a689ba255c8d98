//! The state machine: `journal::State` in memory, snapshots on the
//! [`Backend`]. At start it is rebuilt from the newest snapshot; openraft then
//! re-applies the committed log after it (journal replay).
//!
//! A snapshot is encoded once, under the read lock, when openraft asks for a
//! builder (serialised with `apply`, so it is a point-in-time view without a
//! copy of the state), straight into a staged file of its own in pieces of
//! 64 KiB (not into sled, whose cache would keep it; never whole in memory:
//! the fresh pages of a buffer that size cost as much as the encoding),
//! with the worker's other tasks moved to another thread meanwhile. The
//! builder then makes the file durable and puts it in place, off the apply
//! path. The log bytes applied since the last snapshot are counted, so that
//! the node can also snapshot by log size.

use std::io::Cursor;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock, RwLockReadGuard};

use futures_util::TryStreamExt;
use journal::{State, Touched};
use openraft::storage::{EntryResponder, RaftStateMachine};
use openraft::{EntryPayload, OptionalSend, RaftSnapshotBuilder};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::backend::Backend;
use crate::log_store::{blocking, decode, encode, in_place, io_err};
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
    /// Encoded size of the newest snapshot (built, installed or loaded).
    snapshot_bytes: AtomicU64,
    /// Told of every change of the state, where it is made.
    observer: OnceLock<Arc<dyn ApplyObserver>>,
}

/// Told of every change of the applied state where it is made: on the state
/// machine's task, right after the change and before it is published (the
/// applied index's watch, the writes' answers). What it wakes therefore needs
/// no task in between that follows the state. It must be quick: applies wait
/// for it.
pub trait ApplyObserver: Send + Sync {
    /// `state` changed (entries applied, or a snapshot installed); also
    /// called once with the state as it is when the observer is set.
    /// `touched` holds what the applies changed (`journal::wait`): every
    /// object, or `all` (a snapshot installed, the first call).
    fn changed(&self, state: &State, touched: &Touched);
    /// The state machine stopped (Raft shut down): nothing changes any more.
    fn stopped(&self);
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

    /// Sets the observer of the state's changes (see [`ApplyObserver`]);
    /// false if one is set already (it stays).
    pub fn observe(&self, observer: Arc<dyn ApplyObserver>) -> bool {
        // Under the write lock: no change falls between the observer's first
        // look and the first change it is told of.
        let d = self.0.write();
        if self.0.observer.set(observer).is_err() {
            return false;
        }
        if let Some(o) = self.0.observer.get() {
            o.changed(&d.state, &Touched::everything());
        }
        true
    }

    /// The state's snapshot encoding and the log index it was applied up
    /// to, read together.
    pub fn encode_snapshot(&self) -> (Vec<u8>, u64) {
        in_place(|| {
            let d = self.0.read();
            (
                d.state.encode_snapshot(),
                d.last_applied.map_or(0, |l| l.index),
            )
        })
    }

    /// The digest of the current state.
    pub fn digest_hex(&self) -> String {
        in_place(|| self.read(|s| s.digest_hex()))
    }

    /// Bytes of log payload applied since the last snapshot was started.
    pub fn log_bytes_since_snapshot(&self) -> u64 {
        self.0.log_bytes.load(Ordering::Relaxed)
    }

    /// Encoded size of the newest snapshot (0: none yet).
    pub fn last_snapshot_bytes(&self) -> u64 {
        self.0.snapshot_bytes.load(Ordering::Relaxed)
    }
}

/// The state machine of one node.
pub struct StateMachine {
    shared: Arc<Shared>,
    backend: Arc<dyn Backend>,
    /// The last log id of the stored snapshot; serialises storing.
    stored: Arc<Mutex<Option<LogId>>>,
    /// What the applies since the observer was last told changed.
    touched: Touched,
}

impl StateMachine {
    /// Loads the newest snapshot, if any, from `backend`.
    pub(crate) fn open(backend: Arc<dyn Backend>) -> Result<Self, String> {
        let mut data = SmData::default();
        let stored = load_snapshot(backend.as_ref())?;
        let snapshot_bytes = stored.as_ref().map_or(0, |s| s.data.len() as u64);
        if let Some(stored) = &stored {
            data.state = State::decode_snapshot(&stored.data)
                .map_err(|e| format!("the snapshot cannot be read: {e}"))?;
            // A dir an earlier build wrote may hold a state that needs more
            // than its format says.
            backend
                .record_level(data.state.feature_level())
                .map_err(|e| format!("cannot record the journal format: {e}"))?;
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
                snapshot_bytes: AtomicU64::new(snapshot_bytes),
                observer: OnceLock::new(),
            }),
            backend,
            stored: Arc::new(Mutex::new(stored.and_then(|s| s.meta.last_log_id))),
            touched: Touched::default(),
        })
    }

    /// The read handle shared with the service.
    pub fn handle(&self) -> StateHandle {
        StateHandle(self.shared.clone())
    }

    /// Tells the observer of a change, under the read lock: what it wakes
    /// can read the state at once. Only this task changes the state, so the
    /// observer sees every change, in order.
    fn changed(&mut self) {
        if let Some(o) = self.shared.observer.get() {
            o.changed(&self.shared.read().state, &self.touched);
        }
        self.touched.clear();
    }
}

impl Drop for StateMachine {
    fn drop(&mut self) {
        if let Some(o) = self.shared.observer.get() {
            o.stopped();
        }
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

/// Checks that this build can apply `entry` in full; returns the journal
/// feature level it needs. An entry holding a field this build does not
/// know, or an update of a higher level, is an error naming its index and
/// what this build did not know.
fn check_entry(entry: &crate::types::Entry) -> std::io::Result<u32> {
    let EntryPayload::Normal(p) = &entry.payload else {
        return Ok(journal::LEVEL_BASE);
    };
    let index = entry.log_id.index;
    if let Some(unknown) = p.unknown() {
        return Err(std::io::Error::other(format!(
            "log entry {index} cannot be applied in full: {unknown}"
        )));
    }
    let mut level = journal::LEVEL_BASE;
    for u in &p.batch().updates {
        let needs = u.required_level();
        if needs > journal::FEATURE_LEVEL {
            return Err(std::io::Error::other(format!(
                "log entry {index} cannot be applied: its {} needs journal feature level {needs}, \
                 and this build applies up to {} (run a newer build on this node)",
                u.command_name(),
                journal::FEATURE_LEVEL
            )));
        }
        level = level.max(needs);
    }
    Ok(level)
}

/// Where a snapshot being built is staged (see [`Backend::snapshot_stage`]).
const BUILD_SLOT: &str = "build";

/// Puts a snapshot in place (`put`) unless a newer one is stored already
/// (then `stale` runs instead). A build runs beside later applies and can
/// finish after a newer snapshot was installed from the leader (and the log
/// purged behind it); writing the older one over it would leave the node
/// unable to restart. `stored` serialises the compare-and-write between
/// builds and installs.
async fn replace_snapshot(
    backend: Arc<dyn Backend>,
    stored: Arc<Mutex<Option<LogId>>>,
    new_last: Option<LogId>,
    put: impl FnOnce(&dyn Backend) -> std::io::Result<()> + Send + 'static,
    stale: impl FnOnce(&dyn Backend) + Send + 'static,
) -> std::io::Result<()> {
    blocking(move || {
        let mut current = stored.lock().unwrap_or_else(|p| p.into_inner());
        if current.is_some() && *current > new_last {
            stale(backend.as_ref());
            return Ok(());
        }
        put(backend.as_ref())?;
        // A snapshot of an older version's data dir lived in sled.
        backend.meta_remove(LEGACY_SNAPSHOT_KEY)?;
        *current = new_last;
        Ok(())
    })
    .await
}

/// Writes the snapshot of `state` as `meta` describes it into the build
/// slot, encoding it straight into the file in pieces: no allocation of the
/// whole encoding (fresh pages for it cost as much as the encoding), and no
/// second copy of the state in memory. Returns the encoding's length.
fn stage_snapshot(
    backend: &dyn Backend,
    meta: &SnapshotMeta,
    state: &State,
) -> std::io::Result<u64> {
    let meta_bytes = encode(meta).map_err(|e| io_err("encoding snapshot metadata", e))?;
    let len = state.snapshot_len() as u64;
    backend.snapshot_stage(BUILD_SLOT, &meta_bytes, len, &mut |w| {
        let mut out = WriteBuf::new(w);
        state
            .encode_snapshot_into(&mut out)
            .map_err(|e| io_err("encoding the snapshot", e))?;
        out.finish()
    })?;
    Ok(len)
}

/// Size of the pieces [`WriteBuf`] passes on.
const WRITE_BUF_BYTES: usize = 1 << 16;

/// A `BufMut` that passes what is put into it on to a writer in pieces of
/// [`WRITE_BUF_BYTES`]. The first write error is kept (and returned by
/// [`WriteBuf::finish`]); what comes after it is dropped.
struct WriteBuf<'a> {
    out: &'a mut dyn std::io::Write,
    buf: Vec<u8>,
    error: Option<std::io::Error>,
}

impl<'a> WriteBuf<'a> {
    fn new(out: &'a mut dyn std::io::Write) -> Self {
        WriteBuf {
            out,
            buf: Vec::with_capacity(WRITE_BUF_BYTES),
            error: None,
        }
    }

    fn pass_on(&mut self, bytes: &[u8]) {
        if self.error.is_none() {
            if let Err(e) = self.out.write_all(bytes) {
                self.error = Some(e);
            }
        }
    }

    fn drain(&mut self) {
        let buf = std::mem::take(&mut self.buf);
        self.pass_on(&buf);
        self.buf = buf;
        self.buf.clear();
    }

    fn finish(mut self) -> std::io::Result<()> {
        self.drain();
        self.error.map_or(Ok(()), Err)
    }
}

// SAFETY: `chunk_mut` hands out only the spare capacity of `buf`, and
// `advance_mut` extends `buf`'s length by at most that (checked), so every
// byte below the length was written.
unsafe impl bytes::BufMut for WriteBuf<'_> {
    fn remaining_mut(&self) -> usize {
        isize::MAX as usize
    }

    unsafe fn advance_mut(&mut self, cnt: usize) {
        let len = self.buf.len() + cnt;
        assert!(len <= self.buf.capacity(), "advanced past the chunk");
        // SAFETY: the caller wrote `cnt` bytes of the chunk (the contract of
        // `advance_mut`), and the chunk is the spare capacity after `len`.
        unsafe { self.buf.set_len(len) }
    }

    fn chunk_mut(&mut self) -> &mut bytes::buf::UninitSlice {
        if self.buf.len() == self.buf.capacity() {
            self.drain();
        }
        bytes::buf::UninitSlice::uninit(self.buf.spare_capacity_mut())
    }

    fn put_slice(&mut self, src: &[u8]) {
        if src.len() > self.buf.capacity() - self.buf.len() {
            self.drain();
            if src.len() >= WRITE_BUF_BYTES {
                self.pass_on(src);
                return;
            }
        }
        self.buf.extend_from_slice(src);
    }
}

/// Builds a snapshot staged when it was created.
pub struct SnapshotBuilder {
    meta: SnapshotMeta,
    /// The staged encoding's length, or why staging failed.
    staged: Option<std::io::Result<u64>>,
    backend: Arc<dyn Backend>,
    stored: Arc<Mutex<Option<LogId>>>,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    type SnapshotData = SnapshotData;

    /// Puts the staged snapshot in place. The snapshot returned carries its
    /// metadata only: openraft (0.10) keeps nothing else of a built
    /// snapshot, and a follower that needs it gets the stored file through
    /// `get_current_snapshot`.
    async fn build_snapshot(&mut self) -> std::io::Result<Snapshot> {
        let len = self
            .staged
            .take()
            .unwrap_or_else(|| Err(std::io::Error::other("this snapshot was built already")))?;
        replace_snapshot(
            self.backend.clone(),
            self.stored.clone(),
            self.meta.last_log_id,
            |b| b.snapshot_commit(BUILD_SLOT),
            |b| b.snapshot_discard(BUILD_SLOT),
        )
        .await?;
        crate::metrics::SNAPSHOT_BUILDS.inc();
        crate::metrics::SNAPSHOT_BYTES.set(len as i64);
        Ok(Snapshot {
            meta: self.meta.clone(),
            snapshot: Cursor::new(Vec::new()),
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
        let started = std::time::Instant::now();
        // An entry this build cannot apply in full stops the node (openraft
        // stops on the error): the entries before it are applied, nothing
        // of it or after it.
        let mut refused = None;
        let mut answers = Vec::with_capacity(entries.len());
        // What changed is recorded only for an observer.
        let traced = self.shared.observer.get().is_some();
        let last_index = {
            let mut d = self.shared.write();
            for (entry, responder) in entries {
                match check_entry(&entry).and_then(|l| self.backend.record_level(l)) {
                    Ok(()) => {}
                    Err(e) => {
                        refused = Some(e);
                        break;
                    }
                }
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
                        let batch = p.batch().updates.iter();
                        Outcomes(if traced {
                            batch
                                .map(|u| d.state.apply_traced(u, &mut self.touched))
                                .collect()
                        } else {
                            batch.map(|u| d.state.apply(u)).collect()
                        })
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
        self.changed();
        self.shared.applied.send_replace(last_index);
        crate::metrics::APPLY_SECONDS.observe(started.elapsed().as_secs_f64());
        for (r, outcomes) in answers {
            r.send(outcomes);
        }
        refused.map_or(Ok(()), Err)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        // Serialised with apply: encoding here is a point-in-time view.
        let d = self.shared.read();
        self.shared.log_bytes.store(0, Ordering::Relaxed);
        let meta = SnapshotMeta {
            last_log_id: d.last_applied,
            last_membership: d.membership.clone(),
        };
        let staged = in_place(|| stage_snapshot(self.backend.as_ref(), &meta, &d.state));
        drop(d);
        if let Ok(len) = &staged {
            self.shared.snapshot_bytes.store(*len, Ordering::Relaxed);
        }
        SnapshotBuilder {
            meta,
            staged: Some(staged),
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
        let len = data.len() as u64;
        let state = in_place(|| State::decode_snapshot(&data))
            .map_err(|e| io_err("decoding the snapshot from the leader", e))?;
        self.backend.record_level(state.feature_level())?;
        let meta_bytes = encode(meta).map_err(|e| io_err("encoding snapshot metadata", e))?;
        replace_snapshot(
            self.backend.clone(),
            self.stored.clone(),
            meta.last_log_id,
            move |b| b.snapshot_put(&meta_bytes, &data),
            |_| {},
        )
        .await?;
        self.shared.log_bytes.store(0, Ordering::Relaxed);
        self.shared.snapshot_bytes.store(len, Ordering::Relaxed);
        tracing::warn!(last_log_id = ?meta.last_log_id, "installing a snapshot");
        let index = {
            let mut d = self.shared.write();
            d.state = state;
            d.last_applied = meta.last_log_id;
            d.membership = meta.last_membership.clone();
            d.last_applied.map_or(0, |l| l.index)
        };
        self.touched = Touched::everything();
        self.changed();
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

#[cfg(test)]
mod tests {
    use super::*;
    use journal::pb::coordination::KvInsert;
    use journal::Update;

    fn state_with_values(sizes: &[usize]) -> State {
        let mut s = State::new();
        for (i, &n) in sizes.iter().enumerate() {
            let out = s.apply(&Update::from(KvInsert {
                key: format!("k{i}"),
                value: vec![i as u8; n].into(),
                allow_overwrite: false,
            }));
            assert!(!out.is_err());
        }
        s
    }

    #[test]
    fn a_snapshot_encoded_in_pieces_is_the_snapshot_encoding() {
        // Small values that fill pieces, values across piece boundaries and
        // values bigger than a piece (passed on directly).
        let sizes: Vec<usize> = (0..300)
            .map(|i| match i % 7 {
                0 => WRITE_BUF_BYTES + 3,
                1 => WRITE_BUF_BYTES - 1,
                2 => 3 * WRITE_BUF_BYTES,
                n => n * 97,
            })
            .collect();
        let s = state_with_values(&sizes);
        let mut out = Vec::new();
        let mut w = WriteBuf::new(&mut out);
        s.encode_snapshot_into(&mut w).unwrap();
        w.finish().unwrap();
        assert_eq!(out.len(), s.snapshot_len());
        assert!(out == s.encode_snapshot(), "encodings differ");
    }

    struct FailsAfter(usize);

    impl std::io::Write for FailsAfter {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            if self.0 < buf.len() {
                return Err(std::io::Error::other("disk full"));
            }
            self.0 -= buf.len();
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_write_error_while_encoding_in_pieces_is_returned() {
        let s = state_with_values(&[WRITE_BUF_BYTES; 4]);
        let mut out = FailsAfter(WRITE_BUF_BYTES);
        let mut w = WriteBuf::new(&mut out);
        s.encode_snapshot_into(&mut w).unwrap();
        let err = w.finish().unwrap_err();
        assert_eq!(err.to_string(), "disk full");
    }
}
