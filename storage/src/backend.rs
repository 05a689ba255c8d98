//! The storage crate's own interface to the disk ([`Backend`]) and its sled
//! implementation. Raft safety rests on three rules kept here: an append is
//! readable when `log_append` returns and durable, with everything written
//! before it, once a later `flush` returns (the log store acknowledges it to
//! Raft only then); a durable meta write is on stable storage before it
//! returns; truncate and purge are single atomic batches, durable when they
//! return.
//!
//! "Durable" means fdatasync'd. sled 0.34.7's `Db::flush` ends in
//! `sync_file_range(WAIT_BEFORE | WRITE | WAIT_AFTER)` (`pagecache/iobuf.rs`),
//! which neither flushes the device's write cache nor the file's size, and
//! writes large values as separate blob files it never syncs
//! (`pagecache/blob_io.rs`); only its background flusher calls `sync_all`,
//! every 500 ms. So every durable write here is `flush` (the data reaches the
//! file) followed by [`SledBackend::sync`]: the new blob files and their
//! directory, then `fdatasync` of the database file, through a descriptor kept
//! open for it. Opening a data dir makes sled's files and directory entries
//! durable once.

use std::io;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};

use crate::wal::Wal;

/// What writes a staged snapshot's data (see [`Backend::snapshot_stage`]).
pub type SnapshotFill<'a> = dyn FnMut(&mut dyn io::Write) -> io::Result<()> + 'a;

/// Durable key-value operations the log store and state machine need. sled is
/// one implementation; another engine can replace it behind this trait.
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
    /// [`SledBackend::committed_marker`]). May be throttled.
    fn note_committed(&self, index: u64);
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
/// The journal format the log and snapshots are encoded in
/// ([`journal::FORMAT_VERSION`]); absent in dirs written before it was
/// recorded (format 1).
const FORMAT_KEY: &str = "journal_format";

/// sled for the metadata (tree `meta`) and [`Wal`] files for the log. Data
/// dirs written before the log had its own files keep it in sled's tree
/// `log` (big-endian u64 keys); it moves to the files at open.
pub struct SledBackend {
    db: sled::Db,
    log: Wal,
    meta: sled::Tree,
    /// The database file, kept open to fdatasync it.
    db_file: std::fs::File,
    /// sled's blob directory and the blob files already synced.
    blobs_dir: PathBuf,
    synced_blobs: std::sync::Mutex<std::collections::HashSet<std::ffi::OsString>>,
    marker_path: PathBuf,
    marker: std::sync::Mutex<(u64, Option<std::time::Instant>)>,
    dir: PathBuf,
}

/// Directory of the log files.
const WAL_DIR: &str = "wal";
/// File beside the database holding the highest committed index noted.
const MARKER_FILE: &str = "COMMITTED";
/// File beside the database holding the snapshot. Snapshots stay out of
/// sled: sled would keep the whole value in its page cache.
const SNAPSHOT_FILE: &str = "snapshot";
/// First bytes of a snapshot file (format version 1).
const SNAPSHOT_MAGIC: &[u8; 8] = b"CSSNAP1\n";
/// The staging slot of [`Backend::snapshot_put`].
const SNAPSHOT_PUT_SLOT: &str = "put";
/// How long an open waits for sled's lock on the database to be released.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(2);
/// How often the committed marker is rewritten at most.
const MARKER_INTERVAL: std::time::Duration = std::time::Duration::from_millis(100);

impl SledBackend {
    /// Opens (or creates) the database in `dir` with a bounded page cache and
    /// checks it belongs to `identity`. A dir with foreign, corrupted or
    /// unidentified data is refused; it is never silently started empty.
    pub fn open(dir: &Path, cache_bytes: u64, identity: &Identity) -> Result<Self, OpenError> {
        let fresh = match std::fs::read_dir(dir) {
            Ok(mut entries) => entries.next().is_none(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => true,
            Err(e) => return Err(OpenError::new(dir, format!("cannot read it: {e}"))),
        };
        let has_db = dir.join("conf").is_file() && dir.join("db").is_file();
        if !fresh && !has_db {
            // (A dir holding only our committed marker has lost its database.)
            return Err(OpenError::new(
                dir,
                "it holds files but no coordstore (sled) database; refusing to start over them",
            ));
        }
        std::fs::create_dir_all(dir)
            .map_err(|e| OpenError::new(dir, format!("cannot create it: {e}")))?;
        let config = sled::Config::new().path(dir).cache_capacity(cache_bytes);
        // sled's lock on its file outlives the last handle for a moment:
        // dropping it flushes the last buffer through a job on sled's own
        // thread pool, which holds the file until it returns. A reopen in the
        // same process (a restart in place, tests) waits that out; a node
        // still running on the dir keeps the lock and is named below.
        let deadline = std::time::Instant::now() + LOCK_WAIT;
        let opened = loop {
            // sled can panic on some corruptions; a refused start is the answer.
            let opened = std::panic::catch_unwind(AssertUnwindSafe(|| config.open()));
            match &opened {
                Ok(Err(e))
                    if e.to_string().contains("could not acquire lock")
                        && std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                _ => break opened,
            }
        };
        let db = match opened {
            Ok(Ok(db)) => db,
            Ok(Err(e)) if e.to_string().contains("could not acquire lock") => {
                return Err(OpenError::new(
                    dir,
                    "it is in use by another process (another coordstore node?)",
                ))
            }
            Ok(Err(e)) => {
                return Err(OpenError::new(
                    dir,
                    format!("the database is corrupted or truncated: {e}"),
                ))
            }
            Err(_) => {
                return Err(OpenError::new(
                    dir,
                    "the database is corrupted or truncated: sled panicked while opening it",
                ))
            }
        };
        let tree = |name: &str| {
            db.open_tree(name)
                .map_err(|e| OpenError::new(dir, format!("cannot open tree {name}: {e}")))
        };
        let db_file = std::fs::File::open(dir.join("db"))
            .map_err(|e| OpenError::new(dir, format!("cannot open the database file: {e}")))?;
        let (meta, sled_log) = (tree("meta")?, tree("log")?);
        let log = Wal::open(&dir.join(WAL_DIR))
            .map_err(|e| OpenError::new(dir, format!("the log files: {e}")))?;
        let backend = SledBackend {
            log,
            meta,
            db,
            db_file,
            blobs_dir: dir.join("blobs"),
            synced_blobs: Default::default(),
            marker_path: dir.join(MARKER_FILE),
            marker: std::sync::Mutex::new((0, None)),
            dir: dir.to_path_buf(),
        };
        move_sled_log(&backend, &sled_log)
            .map_err(|e| OpenError::new(dir, format!("cannot move the log out of sled: {e}")))?;
        backend
            .sync_files(dir)
            .map_err(|e| OpenError::new(dir, format!("cannot sync the database: {e}")))?;
        backend.check_identity(dir, identity, fresh)?;
        Ok(backend)
    }

    /// Where a snapshot staged under `slot` is written.
    fn staged_snapshot(&self, slot: &str) -> PathBuf {
        self.dir.join(format!("{SNAPSHOT_FILE}.{slot}.tmp"))
    }

    /// Makes everything sled wrote so far durable: its buffers reach the
    /// files (`flush`), then new blob files, the blob directory and the
    /// database file are synced.
    pub fn sync(&self) -> io::Result<()> {
        self.db.flush()?;
        self.sync_blobs()?;
        self.db_file.sync_data()
    }

    /// fsyncs blob files not synced yet, then their directory if any was new.
    fn sync_blobs(&self) -> io::Result<()> {
        let entries = match std::fs::read_dir(&self.blobs_dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        };
        let mut synced = self.synced_blobs.lock().unwrap_or_else(|p| p.into_inner());
        let mut present = std::collections::HashSet::new();
        let mut new = false;
        for e in entries {
            let e = e?;
            let name = e.file_name();
            if !synced.contains(&name) {
                match std::fs::File::open(e.path()) {
                    Ok(f) => f.sync_all()?,
                    // Collected by sled meanwhile.
                    Err(err) if err.kind() == io::ErrorKind::NotFound => continue,
                    Err(err) => return Err(err),
                }
                new = true;
            }
            present.insert(name);
        }
        if new {
            sync_dir(&self.blobs_dir)?;
        }
        *synced = present;
        Ok(())
    }

    /// At open: sled's configuration, database, blobs and the directory
    /// entries naming them, and the data dir's own entry, made durable (sled
    /// writes its `conf` without a sync).
    fn sync_files(&self, dir: &Path) -> io::Result<()> {
        std::fs::File::open(dir.join("conf"))?.sync_all()?;
        self.sync()?;
        sync_dir(dir)?;
        if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
            sync_dir(parent)?;
        }
        Ok(())
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

    fn check_identity(&self, dir: &Path, want: &Identity, fresh: bool) -> Result<(), OpenError> {
        let io = |e: io::Error| OpenError::new(dir, format!("cannot read metadata: {e}"));
        match self.meta_get(IDENTITY_KEY).map_err(io)? {
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
                let format = match self.meta_get(FORMAT_KEY).map_err(io)? {
                    None => 1,
                    Some(raw) => String::from_utf8(raw)
                        .ok()
                        .and_then(|s| s.parse::<u32>().ok())
                        .ok_or_else(|| OpenError::new(dir, "the format record is corrupted"))?,
                };
                if format != journal::FORMAT_VERSION {
                    return Err(OpenError::new(
                        dir,
                        format!(
                            "it holds journal format {format}, and this coordstore reads format {}; \
                             start the node on an empty data dir so it catches up from its peers",
                            journal::FORMAT_VERSION
                        ),
                    ));
                }
                Ok(())
            }
            None => {
                let empty = self.log.is_empty() && self.meta.is_empty();
                if !fresh && !empty {
                    return Err(OpenError::new(
                        dir,
                        "it holds a database without an identity record (not written by coordstore)",
                    ));
                }
                let format = journal::FORMAT_VERSION.to_string();
                self.meta_put(FORMAT_KEY, format.as_bytes(), false)
                    .map_err(|e| OpenError::new(dir, format!("cannot write identity: {e}")))?;
                let record = format!("{}@{}", want.node_id, want.cluster_id);
                self.meta_put(IDENTITY_KEY, record.as_bytes(), true)
                    .map_err(|e| OpenError::new(dir, format!("cannot write identity: {e}")))
            }
        }
    }
}

fn corrupted(what: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.into())
}

/// Decodes a snapshot file: magic, meta length (u64 LE), meta, data length
/// (u64 LE), data, CRC-32 of everything before it (u32 LE).
fn decode_snapshot_file(mut raw: Vec<u8>) -> io::Result<(Vec<u8>, Vec<u8>)> {
    let body_len = raw
        .len()
        .checked_sub(4)
        .ok_or_else(|| corrupted("the snapshot file is truncated"))?;
    let crc = u32::from_le_bytes(raw[body_len..].try_into().expect("4 bytes"));
    if crc32fast::hash(&raw[..body_len]) != crc {
        return Err(corrupted("the snapshot file fails its checksum"));
    }
    let body = &raw[..body_len];
    let field = |at: usize| -> io::Result<(usize, usize)> {
        let len = body
            .get(at..at + 8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")) as usize)
            .ok_or_else(|| corrupted("the snapshot file is truncated"))?;
        let start = at + 8;
        let end = start
            .checked_add(len)
            .filter(|&e| e <= body.len())
            .ok_or_else(|| corrupted("the snapshot file is truncated"))?;
        Ok((start, end))
    };
    if !body.starts_with(SNAPSHOT_MAGIC) {
        return Err(corrupted("the snapshot file has an unknown format"));
    }
    let (ms, me) = field(SNAPSHOT_MAGIC.len())?;
    let (ds, de) = field(me)?;
    if de != body.len() {
        return Err(corrupted("the snapshot file has trailing bytes"));
    }
    let meta = raw[ms..me].to_vec();
    raw.truncate(de);
    raw.drain(..ds);
    Ok((meta, raw))
}

/// A writer that counts and checksums what passes through it.
struct CrcWriter<W> {
    inner: W,
    crc: crc32fast::Hasher,
    written: u64,
}

impl<W: io::Write> io::Write for CrcWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.crc.update(&buf[..n]);
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// fsyncs a directory (its entries).
pub(crate) fn sync_dir(dir: &Path) -> io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

/// Moves a log kept in sled's tree (data dirs written before the log had
/// its own files) into `wal`: copied and synced, then removed from sled.
/// A crash in between leaves the tree whole, and the next open copies it
/// again over whatever the files got.
fn move_sled_log(backend: &SledBackend, tree: &sled::Tree) -> io::Result<()> {
    if tree.is_empty() {
        return Ok(());
    }
    let wal = &backend.log;
    wal.clear()?;
    let mut batch = Vec::new();
    for r in tree.iter() {
        batch.push(record(r)?);
        if batch.len() == 1024 {
            wal.append(&batch)?;
            batch.clear();
        }
    }
    wal.append(&batch)?;
    wal.sync()?;
    tracing::info!("moved the log out of sled into its own files");
    tree.clear()?;
    backend.sync()
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

impl Backend for SledBackend {
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
        self.log.truncate(from)
    }

    fn log_purge(&self, upto: u64) -> io::Result<()> {
        // The metadata written before it (the log store's purge point) first.
        self.sync()?;
        self.log.purge(upto)
    }

    fn meta_get(&self, key: &str) -> io::Result<Option<Vec<u8>>> {
        Ok(self.meta.get(key)?.map(|v| v.to_vec()))
    }

    fn meta_put(&self, key: &str, value: &[u8], durable: bool) -> io::Result<()> {
        self.meta.insert(key, value)?;
        if durable {
            self.sync()?;
        }
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        self.log.sync()
    }

    fn meta_remove(&self, key: &str) -> io::Result<()> {
        self.meta.remove(key)?;
        Ok(())
    }

    fn snapshot_stage(
        &self,
        slot: &str,
        meta: &[u8],
        data_len: u64,
        fill: &mut SnapshotFill<'_>,
    ) -> io::Result<()> {
        use std::io::Write;
        let file = std::fs::File::create(self.staged_snapshot(slot))?;
        let mut w = CrcWriter {
            inner: std::io::BufWriter::with_capacity(1 << 16, file),
            crc: crc32fast::Hasher::new(),
            written: 0,
        };
        w.write_all(SNAPSHOT_MAGIC)?;
        w.write_all(&(meta.len() as u64).to_le_bytes())?;
        w.write_all(meta)?;
        w.write_all(&data_len.to_le_bytes())?;
        let start = w.written;
        fill(&mut w)?;
        let filled = w.written - start;
        if filled != data_len {
            return Err(io::Error::other(format!(
                "the snapshot data came to {filled} bytes where {data_len} were announced"
            )));
        }
        let crc = w.crc.finalize();
        w.inner.write_all(&crc.to_le_bytes())?;
        w.inner.flush()
    }

    fn snapshot_commit(&self, slot: &str) -> io::Result<()> {
        let staged = self.staged_snapshot(slot);
        std::fs::File::open(&staged)?.sync_all()?;
        std::fs::rename(&staged, self.dir.join(SNAPSHOT_FILE))?;
        sync_dir(&self.dir)
    }

    fn snapshot_discard(&self, slot: &str) {
        let _ = std::fs::remove_file(self.staged_snapshot(slot));
    }

    fn snapshot_get(&self) -> io::Result<Option<(Vec<u8>, Vec<u8>)>> {
        match std::fs::read(self.dir.join(SNAPSHOT_FILE)) {
            Ok(raw) => decode_snapshot_file(raw).map(Some),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
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
