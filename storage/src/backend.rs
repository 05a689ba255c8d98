//! The storage crate's own interface to the disk ([`Backend`]) and the
//! implementation that composes a data dir's three stores: the log's segment
//! files ([`crate::wal`]), sled for metadata ([`crate::meta`]) and the
//! snapshot file ([`crate::snapshot_file`]), plus the committed-index marker.
//! Raft safety rests on three rules kept here: an append is readable when
//! `log_append` returns and durable, with everything written before it, once
//! a later `flush` returns (the log store acknowledges it to Raft only then);
//! a durable meta write is on stable storage before it returns; truncate and
//! purge are single atomic batches, durable when they return.

use crate::health::FlushWatch;
use std::io;
use std::path::{Path, PathBuf};

use crate::meta::SledMeta;
use crate::snapshot_file::SnapshotFile;
pub use crate::snapshot_file::SnapshotFill;
use crate::wal::Wal;

/// Durable operations the log store and state machine need. [`DiskBackend`]
/// is one implementation; another engine can replace it behind this trait.
pub trait Backend: Send + Sync + 'static {
    /// Writes `(index, bytes)` log records, readable when it returns,
    /// durable once a later [`Backend::flush`] returns; after a crash the
    /// log holds a prefix of what was written. Must not wait for a running
    /// flush (the log store writes single records on the Raft core's task).
    fn log_append(&self, records: &[(u64, Vec<u8>)]) -> io::Result<()>;
    /// Records with `from <= index < to`, ascending.
    fn log_range(&self, from: u64, to: u64) -> io::Result<Vec<(u64, Vec<u8>)>>;
    /// The record with the highest index.
    fn log_last(&self) -> io::Result<Option<(u64, Vec<u8>)>>;
    /// The record with the lowest index.
    fn log_first(&self) -> io::Result<Option<(u64, Vec<u8>)>>;
    /// Deletes every record with `index >= from` in one batch, durable when
    /// it returns.
    fn log_truncate(&self, from: u64) -> io::Result<()>;
    /// Deletes every record with `index <= upto` in one batch, durable when
    /// it returns.
    fn log_purge(&self, upto: u64) -> io::Result<()>;
    /// Reads a metadata value.
    fn meta_get(&self, key: &str) -> io::Result<Option<Vec<u8>>>;
    /// Writes a metadata value; with `durable` it is on stable storage
    /// (with everything written before it) when it returns.
    fn meta_put(&self, key: &str, value: &[u8], durable: bool) -> io::Result<()>;
    /// Makes every log record written so far durable (metadata written
    /// without `durable` becomes durable with the next durable write).
    fn flush(&self) -> io::Result<()>;
    /// How the store's durable writes go (the running ones included): a
    /// store that does not time them has a watch that sees none.
    fn sync_watch(&self) -> std::sync::Arc<FlushWatch> {
        std::sync::Arc::default()
    }
    /// Removes a metadata value (not synced: a later durable write carries it).
    fn meta_remove(&self, key: &str) -> io::Result<()>;
    /// Replaces the snapshot with `meta` (an opaque record) and `data`,
    /// durably and atomically: after a crash either the old or the new one
    /// is there, whole.
    fn snapshot_put(&self, meta: &[u8], data: &[u8]) -> io::Result<()> {
        self.snapshot_stage(SNAPSHOT_PUT_SLOT, meta, data.len() as u64, &mut |w| {
            w.write_all(data)
        })?;
        self.snapshot_commit(SNAPSHOT_PUT_SLOT)
    }
    /// Writes a snapshot beside the current one, under the name `slot`, not
    /// yet durable nor in place: `meta`, then the `data_len` bytes `fill`
    /// writes (anything else is an error), so that the data never needs to
    /// be in memory whole.
    fn snapshot_stage(
        &self,
        slot: &str,
        meta: &[u8],
        data_len: u64,
        fill: &mut SnapshotFill<'_>,
    ) -> io::Result<()>;
    /// Makes the snapshot staged under `slot` durable and the current one,
    /// atomically, as [`Backend::snapshot_put`].
    fn snapshot_commit(&self, slot: &str) -> io::Result<()>;
    /// Removes the snapshot staged under `slot`, if any.
    fn snapshot_discard(&self, slot: &str);
    /// The snapshot stored by [`Backend::snapshot_put`]: (meta, data).
    fn snapshot_get(&self) -> io::Result<Option<(Vec<u8>, Vec<u8>)>>;
    /// Notes, outside the database, that the log is committed up to `index`,
    /// so a start-up can tell when the database lost data it had (see
    /// [`DiskBackend::committed_marker`]). May be throttled.
    fn note_committed(&self, index: u64);
    /// Records, durably and before it returns, that the data dir holds (or
    /// is about to hold) data that needs journal feature level `level`:
    /// its journal format, which a build of a lower level refuses to open
    /// (see `journal::level`). A level at or below the recorded one changes
    /// nothing.
    fn record_level(&self, level: u32) -> io::Result<()>;
}

/// What the data dir must belong to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// The cluster this data belongs to.
    pub cluster_id: String,
    /// The node this data belongs to.
    pub node_id: u64,
}

/// A data dir that cannot be used, with the path and the reason.
#[derive(Debug, thiserror::Error)]
#[error("data dir {path}: {reason}")]
pub struct OpenError {
    /// The data dir.
    pub path: PathBuf,
    /// Why it cannot be used.
    pub reason: String,
}

impl OpenError {
    pub(crate) fn new(path: &Path, reason: impl Into<String>) -> Self {
        OpenError {
            path: path.to_path_buf(),
            reason: reason.into(),
        }
    }
}

const IDENTITY_KEY: &str = "identity";
/// The journal format of the data dir: the journal feature level its log
/// and snapshot need (`journal::level`), raised before anything that needs
/// more is written; absent in dirs written before it was recorded (format
/// 1). Builds before namespaces open format 2 only.
const FORMAT_KEY: &str = "journal_format";

/// A data dir's stores: [`Wal`] files for the log, sled for the metadata,
/// the snapshot in a file of its own, and the committed marker. Data dirs
/// written before the log had its own files keep it in sled's tree `log`
/// (big-endian u64 keys); it moves to the files at open.
pub struct DiskBackend {
    log: Wal,
    meta: SledMeta,
    snapshot: SnapshotFile,
    marker_path: PathBuf,
    marker: std::sync::Mutex<(u64, Option<std::time::Instant>)>,
    /// The journal format recorded (see [`FORMAT_KEY`]); raised under its
    /// lock.
    format: std::sync::Mutex<u32>,
    /// Its durable writes, timed (the node's health reads them).
    syncs: std::sync::Arc<FlushWatch>,
}

/// Directory of the log files.
const WAL_DIR: &str = "wal";
/// File beside the database holding the highest committed index noted.
const MARKER_FILE: &str = "COMMITTED";
/// The staging slot of [`Backend::snapshot_put`].
const SNAPSHOT_PUT_SLOT: &str = "put";
/// How often the committed marker is rewritten at most.
const MARKER_INTERVAL: std::time::Duration = std::time::Duration::from_millis(100);

impl DiskBackend {
    /// Opens (or creates) the stores in `dir` with a bounded sled page cache
    /// and checks they belong to `identity`. A dir with foreign, corrupted or
    /// unidentified data is refused; it is never silently started empty.
    pub fn open(dir: &Path, cache_bytes: u64, identity: &Identity) -> Result<Self, OpenError> {
        let fresh = match std::fs::read_dir(dir) {
            Ok(mut entries) => entries.next().is_none(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => true,
            Err(e) => return Err(OpenError::new(dir, format!("cannot read it: {e}"))),
        };
        if !fresh && !SledMeta::exists_in(dir) {
            // (A dir holding only our committed marker has lost its database.)
            return Err(OpenError::new(
                dir,
                "it holds files but no coordstore (sled) database; refusing to start over them",
            ));
        }
        std::fs::create_dir_all(dir)
            .map_err(|e| OpenError::new(dir, format!("cannot create it: {e}")))?;
        let meta = SledMeta::open(dir, cache_bytes).map_err(|r| OpenError::new(dir, r))?;
        let log = Wal::open(&dir.join(WAL_DIR))
            .map_err(|e| OpenError::new(dir, format!("the log files: {e}")))?;
        let backend = DiskBackend {
            log,
            meta,
            snapshot: SnapshotFile::new(dir),
            marker_path: dir.join(MARKER_FILE),
            marker: std::sync::Mutex::new((0, None)),
            format: std::sync::Mutex::new(journal::LEVEL_BASE),
            syncs: std::sync::Arc::default(),
        };
        backend
            .move_sled_log()
            .map_err(|e| OpenError::new(dir, format!("cannot move the log out of sled: {e}")))?;
        backend.check_identity(dir, identity, fresh)?;
        Ok(backend)
    }

    /// The committed index noted in the marker file (0 if none). sled silently
    /// recovers a prefix of a truncated database, so the marker is how a
    /// start-up notices that flushed data is gone. It is written without
    /// fsync: after a power loss it can only be older, never newer.
    pub fn committed_marker(&self) -> u64 {
        std::fs::read_to_string(&self.marker_path)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    }

    /// Moves a log kept in sled's tree (data dirs written before the log had
    /// its own files) into the log files: copied and synced, then removed
    /// from sled. A crash in between leaves the tree whole, and the next
    /// open copies it again over whatever the files got.
    fn move_sled_log(&self) -> io::Result<()> {
        let tree = self.meta.legacy_log()?;
        if tree.is_empty() {
            return Ok(());
        }
        self.log.clear()?;
        let mut batch = Vec::new();
        for r in tree.iter() {
            batch.push(record(r)?);
            if batch.len() == 1024 {
                self.log.append(&batch)?;
                batch.clear();
            }
        }
        self.log.append(&batch)?;
        self.log.sync()?;
        tracing::info!("moved the log out of sled into its own files");
        tree.clear()?;
        self.meta.sync()
    }

    /// The journal format the dir records: one this build reads (see
    /// [`FORMAT_KEY`]), remembered for [`Backend::record_level`].
    fn check_format(&self, dir: &Path) -> Result<(), OpenError> {
        let io = |e: io::Error| OpenError::new(dir, format!("cannot read metadata: {e}"));
        let format = match self.meta.get(FORMAT_KEY).map_err(io)? {
            None => 1,
            Some(raw) => String::from_utf8(raw)
                .ok()
                .and_then(|s| s.parse::<u32>().ok())
                .ok_or_else(|| OpenError::new(dir, "the format record is corrupted"))?,
        };
        if format > journal::FEATURE_LEVEL {
            return Err(OpenError::new(
                dir,
                format!(
                    "it holds journal format {format} ({}), and this coordstore reads formats {} to {}: \
                     a newer build wrote it, and an older one does not open it (a downgrade); \
                     run a build of journal feature level {format} or newer on it",
                    journal::level::describe(format),
                    journal::OLDEST_FORMAT,
                    journal::FEATURE_LEVEL
                ),
            ));
        }
        if format < journal::OLDEST_FORMAT {
            return Err(OpenError::new(
                dir,
                format!(
                    "it holds journal format {format}, and this coordstore reads formats {} to {}; \
                     start the node on an empty data dir so it catches up from its peers",
                    journal::OLDEST_FORMAT,
                    journal::FEATURE_LEVEL
                ),
            ));
        }
        *self.format.lock().unwrap_or_else(|p| p.into_inner()) = format;
        Ok(())
    }

    fn check_identity(&self, dir: &Path, want: &Identity, fresh: bool) -> Result<(), OpenError> {
        let io = |e: io::Error| OpenError::new(dir, format!("cannot read metadata: {e}"));
        match self.meta.get(IDENTITY_KEY).map_err(io)? {
            Some(raw) => {
                let text = String::from_utf8(raw)
                    .map_err(|_| OpenError::new(dir, "the identity record is corrupted"))?;
                let (node, cluster) = text
                    .split_once('@')
                    .ok_or_else(|| OpenError::new(dir, "the identity record is corrupted"))?;
                let node: u64 = node
                    .parse()
                    .map_err(|_| OpenError::new(dir, "the identity record is corrupted"))?;
                if node != want.node_id || cluster != want.cluster_id {
                    return Err(OpenError::new(
                        dir,
                        format!(
                            "it belongs to node {node} of cluster '{cluster}', not node {} of cluster '{}'",
                            want.node_id, want.cluster_id
                        ),
                    ));
                }
                self.check_format(dir)
            }
            None => {
                let empty = self.log.is_empty() && self.meta.is_empty();
                if !fresh && !empty {
                    return Err(OpenError::new(
                        dir,
                        "it holds a database without an identity record (not written by coordstore)",
                    ));
                }
                // A new dir needs the base level until something of a
                // higher one is written into it.
                let format = journal::LEVEL_BASE.to_string();
                self.meta
                    .put(FORMAT_KEY, format.as_bytes(), false)
                    .map_err(|e| OpenError::new(dir, format!("cannot write identity: {e}")))?;
                let record = format!("{}@{}", want.node_id, want.cluster_id);
                self.meta
                    .put(IDENTITY_KEY, record.as_bytes(), true)
                    .map_err(|e| OpenError::new(dir, format!("cannot write identity: {e}")))
            }
        }
    }
}

fn index_of(k: &[u8]) -> io::Result<u64> {
    let arr: [u8; 8] = k
        .try_into()
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "log key is not 8 bytes"))?;
    Ok(u64::from_be_bytes(arr))
}

fn record(r: sled::Result<(sled::IVec, sled::IVec)>) -> io::Result<(u64, Vec<u8>)> {
    let (k, v) = r?;
    Ok((index_of(&k)?, v.to_vec()))
}

impl Backend for DiskBackend {
    fn log_append(&self, records: &[(u64, Vec<u8>)]) -> io::Result<()> {
        self.log.append(records)
    }

    fn log_range(&self, from: u64, to: u64) -> io::Result<Vec<(u64, Vec<u8>)>> {
        self.log.range(from, to)
    }

    fn log_last(&self) -> io::Result<Option<(u64, Vec<u8>)>> {
        self.log.last()
    }

    fn log_first(&self) -> io::Result<Option<(u64, Vec<u8>)>> {
        self.log.first()
    }

    fn log_truncate(&self, from: u64) -> io::Result<()> {
        self.syncs.time(|| self.log.truncate(from))
    }

    fn log_purge(&self, upto: u64) -> io::Result<()> {
        // The metadata written before it (the log store's purge point) first.
        self.syncs.time(|| self.meta.sync())?;
        self.syncs.time(|| self.log.purge(upto))
    }

    fn meta_get(&self, key: &str) -> io::Result<Option<Vec<u8>>> {
        self.meta.get(key)
    }

    fn meta_put(&self, key: &str, value: &[u8], durable: bool) -> io::Result<()> {
        match durable {
            true => self.syncs.time(|| self.meta.put(key, value, true)),
            false => self.meta.put(key, value, false),
        }
    }

    fn flush(&self) -> io::Result<()> {
        self.syncs.time(|| self.log.sync())
    }

    fn sync_watch(&self) -> std::sync::Arc<FlushWatch> {
        self.syncs.clone()
    }

    fn meta_remove(&self, key: &str) -> io::Result<()> {
        self.meta.remove(key)
    }

    fn record_level(&self, level: u32) -> io::Result<()> {
        let mut format = self.format.lock().unwrap_or_else(|p| p.into_inner());
        if level <= *format {
            return Ok(());
        }
        self.meta
            .put(FORMAT_KEY, level.to_string().as_bytes(), true)?;
        tracing::info!(
            "the data dir now holds journal feature level {level} ({}): journal format {level}",
            journal::level::describe(level)
        );
        *format = level;
        Ok(())
    }

    fn snapshot_stage(
        &self,
        slot: &str,
        meta: &[u8],
        data_len: u64,
        fill: &mut SnapshotFill<'_>,
    ) -> io::Result<()> {
        self.snapshot.stage(slot, meta, data_len, fill)
    }

    fn snapshot_commit(&self, slot: &str) -> io::Result<()> {
        self.snapshot.commit(slot)
    }

    fn snapshot_discard(&self, slot: &str) {
        self.snapshot.discard(slot)
    }

    fn snapshot_get(&self) -> io::Result<Option<(Vec<u8>, Vec<u8>)>> {
        self.snapshot.get()
    }

    fn note_committed(&self, index: u64) {
        let mut m = self.marker.lock().unwrap_or_else(|p| p.into_inner());
        let due = m.1.is_none_or(|t| t.elapsed() >= MARKER_INTERVAL);
        if index <= m.0 || !due {
            return;
        }
        let tmp = self.marker_path.with_extension("tmp");
        let written = std::fs::write(&tmp, index.to_string())
            .and_then(|()| std::fs::rename(&tmp, &self.marker_path));
        if let Err(e) = written {
            tracing::warn!(path = %self.marker_path.display(), "cannot write the committed marker: {e}");
            return;
        }
        *m = (index, Some(std::time::Instant::now()));
    }
}
