//! The newest snapshot, in a file of its own beside the database (not in
//! sled, whose page cache would keep the whole value).
//!
//! The file: the magic `CSSNAP1\n`, the meta length (u64 LE), the meta (an
//! opaque record), the data length (u64 LE), the data, and a CRC-32 of
//! everything before it (u32 LE). A new snapshot is staged under a slot name
//! (`snapshot.SLOT.tmp`), then synced and renamed over the current one, and
//! the directory synced: after a crash either the old or the new one is
//! there, whole.

use std::io::{self, Write};
use std::path::{Path, PathBuf};

use crate::fs::{sync_dir, CrcWriter};

/// What writes a staged snapshot's data (see [`SnapshotFile::stage`]).
pub type SnapshotFill<'a> = dyn FnMut(&mut dyn io::Write) -> io::Result<()> + 'a;

/// Name of the snapshot file in the data dir.
pub(crate) const SNAPSHOT_FILE: &str = "snapshot";
/// First bytes of a snapshot file (format version 1).
const SNAPSHOT_MAGIC: &[u8; 8] = b"CSSNAP1\n";

/// The snapshot file of one data dir.
pub(crate) struct SnapshotFile {
    dir: PathBuf,
}

fn corrupted(what: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.into())
}

impl SnapshotFile {
    /// The snapshot file in `dir`.
    pub(crate) fn new(dir: &Path) -> Self {
        SnapshotFile {
            dir: dir.to_path_buf(),
        }
    }

    /// Where a snapshot staged under `slot` is written.
    fn staged(&self, slot: &str) -> PathBuf {
        self.dir.join(format!("{SNAPSHOT_FILE}.{slot}.tmp"))
    }

    /// Writes a snapshot under `slot`, not yet durable nor in place: `meta`,
    /// then the `data_len` bytes `fill` writes (anything else is an error).
    pub(crate) fn stage(
        &self,
        slot: &str,
        meta: &[u8],
        data_len: u64,
        fill: &mut SnapshotFill<'_>,
    ) -> io::Result<()> {
        let file = std::fs::File::create(self.staged(slot))?;
        let mut w = CrcWriter::new(io::BufWriter::with_capacity(1 << 16, file));
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

    /// Makes the snapshot staged under `slot` durable and the current one.
    pub(crate) fn commit(&self, slot: &str) -> io::Result<()> {
        let staged = self.staged(slot);
        std::fs::File::open(&staged)?.sync_all()?;
        std::fs::rename(&staged, self.dir.join(SNAPSHOT_FILE))?;
        sync_dir(&self.dir)
    }

    /// Removes the snapshot staged under `slot`, if any.
    pub(crate) fn discard(&self, slot: &str) {
        let _ = std::fs::remove_file(self.staged(slot));
    }

    /// The current snapshot: (meta, data).
    pub(crate) fn get(&self) -> io::Result<Option<(Vec<u8>, Vec<u8>)>> {
        match std::fs::read(self.dir.join(SNAPSHOT_FILE)) {
            Ok(raw) => decode(raw).map(Some),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// Decodes a snapshot file (see the module's documentation).
fn decode(mut raw: Vec<u8>) -> io::Result<(Vec<u8>, Vec<u8>)> {
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
