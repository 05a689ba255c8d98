//! The metadata store of a data dir: sled, tree `meta` (the vote, the log
//! store's purge point, the data dir's identity and journal format).
//!
//! "Durable" means fdatasync'd. sled 0.34.7's `Db::flush` ends in
//! `sync_file_range(WAIT_BEFORE | WRITE | WAIT_AFTER)` (`pagecache/iobuf.rs`
//! in sled's source), which neither flushes the device's write cache nor the
//! file's size, and writes large values as separate blob files it never
//! syncs (`pagecache/blob_io.rs`); only its background flusher calls
//! `sync_all`, every 500 ms. So every durable write here is `flush` (the
//! data reaches the file) followed by [`SledMeta::sync`]: the new blob files
//! and their directory, then `fdatasync` of the database file, through a
//! descriptor kept open for it. Opening makes sled's files and directory
//! entries durable once.

use std::collections::HashSet;
use std::ffi::OsString;
use std::io;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::fs::{disk_error, sync_dir};

/// sled's error `e` as the I/O error under it, when it is one (so its errno
/// shows), else as a plain one.
fn sled_io(e: sled::Error) -> io::Error {
    match e {
        sled::Error::Io(e) => e,
        other => io::Error::other(other.to_string()),
    }
}

/// How long an open waits for sled's lock on the database to be released.
const LOCK_WAIT: Duration = Duration::from_secs(2);

/// sled's metadata tree, and what it takes to make it durable.
pub(crate) struct SledMeta {
    db: sled::Db,
    meta: sled::Tree,
    /// The database file, kept open to fdatasync it.
    db_file: std::fs::File,
    /// sled's blob directory and the blob files already synced.
    blobs_dir: PathBuf,
    synced_blobs: Mutex<HashSet<OsString>>,
    /// The database's directory (errors name it).
    dir: PathBuf,
    /// The first failed sync, for good: never retried (see the log's).
    failed: Mutex<Option<(io::ErrorKind, String)>>,
}

impl SledMeta {
    /// Whether `dir` holds a sled database.
    pub(crate) fn exists_in(dir: &Path) -> bool {
        dir.join("conf").is_file() && dir.join("db").is_file()
    }

    /// Opens (or creates) the database in `dir` with a bounded page cache,
    /// and makes its files durable. `Err` says why it cannot be used.
    pub(crate) fn open(dir: &Path, cache_bytes: u64) -> Result<Self, String> {
        let config = sled::Config::new().path(dir).cache_capacity(cache_bytes);
        // sled's lock on its file outlives the last handle for a moment:
        // dropping it flushes the last buffer through a job on sled's own
        // thread pool, which holds the file until it returns. A reopen in the
        // same process (a restart in place, tests) waits that out; a node
        // still running on the dir keeps the lock and is named below.
        let deadline = Instant::now() + LOCK_WAIT;
        let opened = loop {
            // sled can panic on some corruptions; a refused start is the answer.
            let opened = std::panic::catch_unwind(AssertUnwindSafe(|| config.open()));
            match &opened {
                Ok(Err(e))
                    if e.to_string().contains("could not acquire lock")
                        && Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(10));
                }
                _ => break opened,
            }
        };
        let db = match opened {
            Ok(Ok(db)) => db,
            Ok(Err(e)) if e.to_string().contains("could not acquire lock") => {
                return Err("it is in use by another process (another coordstore node?)".into())
            }
            Ok(Err(e)) => return Err(format!("the database is corrupted or truncated: {e}")),
            Err(_) => {
                return Err(
                    "the database is corrupted or truncated: sled panicked while opening it".into(),
                )
            }
        };
        let meta = db
            .open_tree("meta")
            .map_err(|e| format!("cannot open tree meta: {e}"))?;
        let db_file = std::fs::File::open(dir.join("db"))
            .map_err(|e| format!("cannot open the database file: {e}"))?;
        let store = SledMeta {
            db,
            meta,
            db_file,
            blobs_dir: dir.join("blobs"),
            synced_blobs: Default::default(),
            dir: dir.to_path_buf(),
            failed: Mutex::new(None),
        };
        store
            .sync_files(dir)
            .map_err(|e| format!("cannot sync the database: {e}"))?;
        Ok(store)
    }

    /// The tree where data dirs written before the log had its own files
    /// keep it (big-endian u64 keys).
    pub(crate) fn legacy_log(&self) -> sled::Result<sled::Tree> {
        self.db.open_tree("log")
    }

    /// Whether the metadata tree holds nothing.
    pub(crate) fn is_empty(&self) -> bool {
        self.meta.is_empty()
    }

    /// Reads a value.
    pub(crate) fn get(&self, key: &str) -> io::Result<Option<Vec<u8>>> {
        let got = self.meta.get(key);
        let got = got.map_err(|e| disk_error("sled read from", &self.dir, sled_io(e)))?;
        Ok(got.map(|v| v.to_vec()))
    }

    /// Writes a value; with `durable` it is on stable storage (with
    /// everything written before it) when this returns.
    pub(crate) fn put(&self, key: &str, value: &[u8], durable: bool) -> io::Result<()> {
        self.meta
            .insert(key, value)
            .map_err(|e| disk_error("sled insert into", &self.dir, sled_io(e)))?;
        if durable {
            self.sync()?;
        }
        Ok(())
    }

    /// Removes a value (not synced: a later durable write carries it).
    pub(crate) fn remove(&self, key: &str) -> io::Result<()> {
        self.meta
            .remove(key)
            .map_err(|e| disk_error("sled remove from", &self.dir, sled_io(e)))?;
        Ok(())
    }

    /// Makes everything sled wrote so far durable: its buffers reach the
    /// files (`flush`), then new blob files, the blob directory and the
    /// database file are synced.
    /// Once a sync failed, every later one fails with that error, untried.
    pub(crate) fn sync(&self) -> io::Result<()> {
        let mut failed = self.failed.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((kind, msg)) = failed.as_ref() {
            let msg = format!("{msg} (a sync of the database failed before; it is not retried)");
            return Err(io::Error::new(*kind, msg));
        }
        let synced = self
            .db
            .flush()
            .map_err(|e| disk_error("sled flush of", &self.dir, sled_io(e)))
            .and_then(|_| self.sync_blobs())
            .and_then(|()| {
                self.db_file
                    .sync_data()
                    .map_err(|e| disk_error("fdatasync of", &self.dir.join("db"), e))
            });
        if let Err(e) = &synced {
            *failed = Some((e.kind(), e.to_string()));
        }
        synced
    }

    /// fsyncs blob files not synced yet, then their directory if any was new.
    fn sync_blobs(&self) -> io::Result<()> {
        let entries = match std::fs::read_dir(&self.blobs_dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        };
        let mut synced = self.synced_blobs.lock().unwrap_or_else(|p| p.into_inner());
        let mut present = HashSet::new();
        let mut new = false;
        for e in entries {
            let e = e?;
            let name = e.file_name();
            if !synced.contains(&name) {
                match std::fs::File::open(e.path()) {
                    Ok(f) => f
                        .sync_all()
                        .map_err(|err| disk_error("fsync of", &e.path(), err))?,
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
}
