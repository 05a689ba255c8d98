//! The Raft log's own append-only files: segments of checksummed records
//! under `<data dir>/wal/`, appended with one positioned write per batch and
//! made durable by one fdatasync per flush.
//!
//! sled kept the log before: its flush writes its buffer and waits for it
//! with `sync_file_range`, and a true fsync of its file then follows, two
//! waits on the disk per flush (150 and 100–150 µs of a 1-client put's
//! 820 µs on the 2-core machine). Here a flush is the one fdatasync.
//!
//! Layout: `{first index:020}.seg` files, each a run of records
//! `[payload length u32 LE][crc32 of index and payload u32 LE][index u64 LE]
//! [payload]` with consecutive indexes, then zeros up to the file's end
//! (space allocated ahead, see [`PREALLOC_BYTES`]); `purged` holds the
//! highest purged index (absent: none). At open every segment is read and
//! checked: zeros end a segment; a torn or corrupted record ends the last
//! segment (it is cut there: an append that never completed its flush);
//! anywhere else it is an error.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::fs::{disk_error, sync_dir};

/// A segment is closed once it holds this many bytes.
const SEGMENT_BYTES: u64 = 64 * 1024 * 1024;
/// Space allocated ahead of the records (`fallocate`), so that an append
/// does not grow the file: an fdatasync after a write that changes the
/// file's size also commits the file system's journal. On the 2-core
/// machine (ext4 on virtio), 300-byte writes each followed by fdatasync:
/// 105-115 µs and 3 context switches per sync appending, 74-84 µs and 2
/// within allocated space (as etcd allocates its WAL segments ahead).
const PREALLOC_BYTES: u64 = 4 * 1024 * 1024;
const HEADER: usize = 16;
const PURGED_FILE: &str = "purged";

struct Segment {
    first: u64,
    file: Arc<File>,
    /// Offset of the record `first + i`.
    offsets: Vec<u64>,
    /// Bytes of whole records.
    len: u64,
    /// The file's size: `len` and the zeros allocated after it.
    alloc: u64,
}

impl Segment {
    fn last(&self) -> Option<u64> {
        (!self.offsets.is_empty()).then(|| self.first + self.offsets.len() as u64 - 1)
    }

    /// (offset, total length) of record `index`, which it holds.
    fn span(&self, index: u64) -> (u64, u64) {
        let i = (index - self.first) as usize;
        let start = self.offsets[i];
        let end = self.offsets.get(i + 1).copied().unwrap_or(self.len);
        (start, end - start)
    }
}

#[derive(Default)]
struct Inner {
    /// Ascending; the last one takes appends.
    segments: VecDeque<Segment>,
    /// Records at or below this index are purged.
    purged: Option<u64>,
    /// Files written since the last sync (the active one included), with
    /// the first index of their segment (which names the file).
    unsynced: Vec<(Arc<File>, u64)>,
    /// Segment files were created or removed since the last sync.
    dir_dirty: bool,
}

impl Inner {
    fn last(&self) -> Option<u64> {
        self.segments.iter().rev().find_map(Segment::last)
    }

    /// The first record not purged (whole segments below the purge point
    /// are deleted; the first one left can still hold purged records).
    fn first(&self) -> Option<u64> {
        let first = self
            .segments
            .iter()
            .find_map(|s| (!s.offsets.is_empty()).then_some(s.first))?;
        let first = match self.purged {
            Some(p) if p >= first => p + 1,
            _ => first,
        };
        self.last().filter(|&l| l >= first).map(|_| first)
    }

    /// Whether the segments hold one run of indexes: each segment's records
    /// start at its name and follow one another, their offsets ascend, and
    /// each non-empty segment starts right after the one before it ends.
    fn contiguous(&self) -> bool {
        let mut next: Option<u64> = None;
        for seg in &self.segments {
            let ascending = seg.offsets.windows(2).all(|w| w[0] < w[1])
                && seg.offsets.last().is_none_or(|o| *o < seg.len.max(1));
            if !ascending {
                return false;
            }
            let Some(last) = seg.last() else {
                continue;
            };
            if next.is_some_and(|n| n != seg.first) {
                return false;
            }
            next = Some(last + 1);
        }
        true
    }

    fn mark_written(&mut self, file: &Arc<File>, first: u64) {
        if !self.unsynced.iter().any(|(f, _)| Arc::ptr_eq(f, file)) {
            self.unsynced.push((file.clone(), first));
        }
    }
}

/// The log files of one data dir.
pub(crate) struct Wal {
    dir: PathBuf,
    inner: Mutex<Inner>,
    segment_bytes: u64,
    /// Bytes allocated ahead at a time; 0 once the file system refused.
    prealloc: std::sync::atomic::AtomicU64,
    /// The first failed sync, for good: a failed fdatasync is never retried
    /// (the kernel may have dropped the dirty pages and marked them clean,
    /// so a later sync that succeeds proves nothing: PostgreSQL's
    /// "fsyncgate"). Every later sync fails with it.
    failed: Mutex<Option<(io::ErrorKind, String)>>,
}

fn corrupt(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// Records to write with no segment to take them (never: a segment is
/// opened before its first record); an error, not a panic, if it happens.
fn no_segment() -> io::Error {
    io::Error::other("the log has no segment to write to")
}

fn checksum(index: u64, payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&index.to_le_bytes());
    h.update(payload);
    h.finalize()
}

fn encode_record(out: &mut Vec<u8>, index: u64, payload: &[u8]) -> io::Result<()> {
    let len = u32::try_from(payload.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a log record over 4 GiB"))?;
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&checksum(index, payload).to_le_bytes());
    out.extend_from_slice(&index.to_le_bytes());
    out.extend_from_slice(payload);
    Ok(())
}

/// Decodes the record at the start of `buf`: (index, payload, total length),
/// or None if it is torn or does not check.
fn decode_record(buf: &[u8]) -> Option<(u64, &[u8], usize)> {
    let header = buf.get(..HEADER)?;
    let len = u32::from_le_bytes(header[0..4].try_into().ok()?) as usize;
    let crc = u32::from_le_bytes(header[4..8].try_into().ok()?);
    let index = u64::from_le_bytes(header[8..16].try_into().ok()?);
    let payload = buf.get(HEADER..HEADER + len)?;
    (checksum(index, payload) == crc).then_some((index, payload, HEADER + len))
}

/// `fallocate` of `len` bytes at `offset` (growing the file; reads as
/// zeros).
#[cfg(target_os = "linux")]
fn allocate(file: &File, offset: u64, len: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let (Ok(offset), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else {
        return Err(io::Error::from_raw_os_error(libc::EFBIG));
    };
    // SAFETY: a plain syscall on a file descriptor this `File` owns.
    let r = unsafe { libc::fallocate(file.as_raw_fd(), 0, offset, len) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(not(target_os = "linux"))]
fn allocate(_file: &File, _offset: u64, _len: u64) -> io::Result<()> {
    Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP))
}

/// The purge point `dir` records, if any.
fn read_purged(dir: &Path) -> io::Result<Option<u64>> {
    match std::fs::read_to_string(dir.join(PURGED_FILE)) {
        Ok(s) => {
            Ok(Some(s.trim().parse::<u64>().map_err(|_| {
                corrupt(format!("{}: not an index", PURGED_FILE))
            })?))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// The first index of every segment file in `dir`, ascending.
fn segment_firsts(dir: &Path) -> io::Result<Vec<u64>> {
    let mut firsts = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let name = e?.file_name();
        let name = name.to_string_lossy();
        if let Some(first) = name
            .strip_suffix(".seg")
            .and_then(|n| n.parse::<u64>().ok())
        {
            firsts.push(first);
        }
    }
    firsts.sort_unstable();
    Ok(firsts)
}

/// Reads the segment at `path` whose first record is `first`: its records
/// up to the space allocated ahead. The `last` segment's tail can be an
/// append whose flush never completed: it is cut off; anything else that
/// does not read is corruption.
fn read_segment(path: &Path, first: u64, last: bool) -> io::Result<Segment> {
    let file = OpenOptions::new().read(true).write(true).open(path)?;
    let data = std::fs::read(path)?;
    let mut seg = Segment {
        first,
        file: Arc::new(file),
        offsets: Vec::new(),
        len: 0,
        alloc: data.len() as u64,
    };
    let mut at = 0usize;
    while at < data.len() {
        let expected = first + seg.offsets.len() as u64;
        match decode_record(&data[at..]) {
            Some((index, _, size)) if index == expected => {
                seg.offsets.push(at as u64);
                at += size;
            }
            // Space allocated ahead: the segment ends here.
            _ if data[at..].iter().all(|&b| b == 0) => break,
            _ if last => {
                tracing::warn!(
                    "{}: dropping an incomplete record at offset {at} (index {expected})",
                    path.display()
                );
                seg.file.set_len(at as u64)?;
                seg.file.sync_data()?;
                seg.alloc = at as u64;
                break;
            }
            _ => {
                return Err(corrupt(format!(
                    "{}: record {expected} at offset {at} is corrupted",
                    path.display()
                )))
            }
        }
    }
    seg.len = at as u64;
    Ok(seg)
}

fn segment_name(first: u64) -> String {
    format!("{first:020}.seg")
}

impl Wal {
    /// Opens (creating) the log files in `dir`, checking every record.
    pub(crate) fn open(dir: &Path) -> io::Result<Wal> {
        Self::open_with(dir, SEGMENT_BYTES)
    }

    fn open_with(dir: &Path, segment_bytes: u64) -> io::Result<Wal> {
        std::fs::create_dir_all(dir)?;
        let purged = read_purged(dir)?;
        let firsts = segment_firsts(dir)?;
        let mut inner = Inner {
            purged,
            ..Inner::default()
        };
        let count = firsts.len();
        for (n, first) in firsts.into_iter().enumerate() {
            let path = dir.join(segment_name(first));
            let seg = read_segment(&path, first, n + 1 == count)?;
            if let (Some(prev), Some(_)) = (inner.last(), seg.last()) {
                if first != prev + 1 {
                    return Err(corrupt(format!(
                        "{}: starts at {first}, the segment before ends at {prev}",
                        path.display()
                    )));
                }
            }
            inner.segments.push_back(seg);
        }
        debug_assert!(inner.contiguous());
        let wal = Wal {
            dir: dir.to_path_buf(),
            inner: Mutex::new(inner),
            segment_bytes,
            prealloc: PREALLOC_BYTES.into(),
            failed: Mutex::new(None),
        };
        if let Some(upto) = purged {
            // A purge whose segment removal a crash interrupted.
            let mut g = wal.lock();
            wal.drop_purged(&mut g, upto)?;
            drop(g);
            wal.sync()?;
        }
        Ok(wal)
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether it holds no record.
    pub(crate) fn is_empty(&self) -> bool {
        self.lock().last().is_none()
    }

    fn new_segment(&self, g: &mut Inner, first: u64) -> io::Result<()> {
        let path = self.dir.join(segment_name(first));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .map_err(|e| disk_error("create of", &path, e))?;
        g.segments.push_back(Segment {
            first,
            file: Arc::new(file),
            offsets: Vec::new(),
            len: 0,
            alloc: 0,
        });
        g.dir_dirty = true;
        Ok(())
    }

    /// Appends `(index, payload)` records, readable when it returns,
    /// durable after the next [`Wal::sync`]. Each index follows the last
    /// one; an index at or below the last replaces the records from it on
    /// (as a truncation would); a gap is refused.
    pub(crate) fn append(&self, records: &[(u64, Vec<u8>)]) -> io::Result<()> {
        debug_assert!(
            records.windows(2).all(|w| w[1].0 == w[0].0 + 1),
            "a log append's records have consecutive indexes"
        );
        let mut g = self.lock();
        let mut buf = Vec::new();
        for (index, payload) in records {
            let index = *index;
            if g.purged.is_some_and(|p| index <= p) {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("log append at {index}, at or below the purge point"),
                ));
            }
            match g.last() {
                Some(last) if index <= last => self.truncate_locked(&mut g, index)?,
                Some(last) if index != last + 1 => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("log append at {index} leaves a gap after {last}"),
                    ))
                }
                _ => {}
            }
            let needs_new = match g.segments.back() {
                None => true,
                Some(s) => {
                    s.len + buf.len() as u64 >= self.segment_bytes
                        || (s.offsets.is_empty() && s.first != index)
                }
            };
            if needs_new {
                self.write_buf(&mut g, &mut buf)?;
                if let Some(s) = g.segments.back().filter(|s| s.offsets.is_empty()) {
                    // An empty segment named for another index: replace it.
                    let first = s.first;
                    g.segments.pop_back();
                    std::fs::remove_file(self.dir.join(segment_name(first)))?;
                }
                self.new_segment(&mut g, index)?;
            }
            let seg = g.segments.back_mut().ok_or_else(no_segment)?;
            seg.offsets.push(seg.len + buf.len() as u64);
            encode_record(&mut buf, index, payload)?;
        }
        self.write_buf(&mut g, &mut buf)?;
        debug_assert!(records.last().is_none_or(|r| g.last() == Some(r.0)));
        debug_assert!(g.contiguous(), "the log's segments hold one run of indexes");
        Ok(())
    }

    /// Writes `buf` at the end of the active segment (whose offsets already
    /// name its records).
    fn write_buf(&self, g: &mut Inner, buf: &mut Vec<u8>) -> io::Result<()> {
        if buf.is_empty() {
            return Ok(());
        }
        let seg = g.segments.back_mut().ok_or_else(no_segment)?;
        let end = seg.len + buf.len() as u64;
        if end > seg.alloc {
            self.allocate(seg, end);
        }
        let written = seg.file.write_all_at(buf, seg.len);
        if let Err(e) = written {
            // Forget the records that did not make it.
            let len = seg.len;
            seg.offsets.retain(|&o| o < len);
            let path = self.dir.join(segment_name(seg.first));
            return Err(disk_error("write of", &path, e));
        }
        seg.len = end;
        seg.alloc = seg.alloc.max(end);
        let (file, first) = (seg.file.clone(), seg.first);
        g.mark_written(&file, first);
        buf.clear();
        Ok(())
    }

    /// Allocates zeros after `seg`'s records to at least `end`, a step
    /// ahead. Best effort: where the file system cannot (or the disk is
    /// full) the write that follows grows the file as it would anyway.
    fn allocate(&self, seg: &mut Segment, end: u64) {
        use std::sync::atomic::Ordering::Relaxed;
        let step = self.prealloc.load(Relaxed);
        if step == 0 {
            return;
        }
        let target = end.max(seg.alloc + step);
        match allocate(&seg.file, seg.alloc, target - seg.alloc) {
            Ok(()) => seg.alloc = target,
            Err(e) if matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP | libc::ENOSYS)) => {
                tracing::info!(
                    "the log's file system cannot allocate ahead; appends grow the files"
                );
                self.prealloc.store(0, Relaxed);
            }
            Err(e) => tracing::debug!("allocating log space ahead: {e}"),
        }
    }

    /// Makes every record appended so far durable. Once a sync failed,
    /// every later one fails with that error, untried (see `failed`).
    pub(crate) fn sync(&self) -> io::Result<()> {
        if let Some(e) = self.failed_before() {
            return Err(e);
        }
        let (files, dir_dirty) = {
            let mut g = self.lock();
            let dir_dirty = std::mem::take(&mut g.dir_dirty);
            (std::mem::take(&mut g.unsynced), dir_dirty)
        };
        let synced = files.iter().try_for_each(|(f, first)| {
            f.sync_data()
                .map_err(|e| disk_error("fdatasync of", &self.dir.join(segment_name(*first)), e))
        });
        let synced = synced.and_then(|()| match dir_dirty {
            true => sync_dir(&self.dir),
            false => Ok(()),
        });
        if let Err(e) = &synced {
            let mut failed = self.failed.lock().unwrap_or_else(|p| p.into_inner());
            failed.get_or_insert_with(|| (e.kind(), e.to_string()));
        }
        synced
    }

    /// The error of the first failed sync, if one failed.
    fn failed_before(&self) -> Option<io::Error> {
        let failed = self.failed.lock().unwrap_or_else(|p| p.into_inner());
        failed.as_ref().map(|(kind, msg)| {
            io::Error::new(
                *kind,
                format!("{msg} (an fdatasync of the log failed before; it is not retried)"),
            )
        })
    }

    /// Records `from <= index < to`, ascending.
    pub(crate) fn range(&self, from: u64, to: u64) -> io::Result<Vec<(u64, Vec<u8>)>> {
        if from >= to {
            return Ok(Vec::new());
        }
        let mut spans = Vec::new();
        {
            let g = self.lock();
            let from = g.first().map_or(from, |f| from.max(f));
            for seg in &g.segments {
                let Some(last) = seg.last() else { continue };
                if last < from || seg.first >= to {
                    continue;
                }
                let (lo, hi) = (from.max(seg.first), to.min(last + 1));
                if lo >= hi {
                    continue;
                }
                let (start, _) = seg.span(lo);
                let (end_start, end_len) = seg.span(hi - 1);
                spans.push((seg.file.clone(), lo, hi, start, end_start + end_len));
            }
        }
        let mut out = Vec::new();
        for (file, lo, hi, start, end) in spans {
            let mut data = vec![0u8; (end - start) as usize];
            file.read_exact_at(&mut data, start)?;
            let mut at = 0;
            for expected in lo..hi {
                match decode_record(&data[at..]) {
                    Some((index, payload, size)) if index == expected => {
                        out.push((index, payload.to_vec()));
                        at += size;
                    }
                    _ => {
                        return Err(corrupt(format!(
                            "log record {expected} does not check (offset {})",
                            start + at as u64
                        )))
                    }
                }
            }
        }
        Ok(out)
    }

    /// The first record, if any.
    pub(crate) fn first(&self) -> io::Result<Option<(u64, Vec<u8>)>> {
        let Some(first) = self.lock().first() else {
            return Ok(None);
        };
        Ok(self.range(first, first + 1)?.pop())
    }

    /// The last record, if any.
    pub(crate) fn last(&self) -> io::Result<Option<(u64, Vec<u8>)>> {
        let Some(last) = self.lock().last() else {
            return Ok(None);
        };
        Ok(self.range(last, last + 1)?.pop())
    }

    /// Removes records `index >= from` from memory and the files (not synced).
    fn truncate_locked(&self, g: &mut Inner, from: u64) -> io::Result<()> {
        while let Some(seg) = g.segments.back_mut() {
            if seg.first >= from {
                let first = seg.first;
                g.segments.pop_back();
                std::fs::remove_file(self.dir.join(segment_name(first)))?;
                g.dir_dirty = true;
                continue;
            }
            if seg.last().is_some_and(|l| l >= from) {
                // Cut, not overwritten later: a record written over the
                // first removed one must never be followed by the rest.
                let (start, _) = seg.span(from);
                seg.file.set_len(start)?;
                seg.offsets.truncate((from - seg.first) as usize);
                seg.len = start;
                seg.alloc = start;
                let (file, first) = (seg.file.clone(), seg.first);
                g.mark_written(&file, first);
            }
            break;
        }
        debug_assert!(g.last().is_none_or(|l| l < from), "truncated from {from}");
        debug_assert!(g.contiguous(), "the log's segments hold one run of indexes");
        Ok(())
    }

    /// Removes every record `index >= from`, durably.
    pub(crate) fn truncate(&self, from: u64) -> io::Result<()> {
        {
            let mut g = self.lock();
            self.truncate_locked(&mut g, from)?;
        }
        self.sync()
    }

    /// Removes every record and the purge point, durably.
    pub(crate) fn clear(&self) -> io::Result<()> {
        {
            let mut g = self.lock();
            self.truncate_locked(&mut g, 0)?;
            match std::fs::remove_file(self.dir.join(PURGED_FILE)) {
                Ok(()) => g.dir_dirty = true,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
            g.purged = None;
        }
        self.sync()
    }

    /// Drops whole segments at or below `upto` (the purge point is noted).
    fn drop_purged(&self, g: &mut Inner, upto: u64) -> io::Result<()> {
        while let Some(seg) = g.segments.front() {
            if seg.last().is_some_and(|l| l > upto) {
                break;
            }
            if seg.last().is_none() && g.segments.len() == 1 && seg.first > upto {
                break;
            }
            let first = seg.first;
            g.segments.pop_front();
            std::fs::remove_file(self.dir.join(segment_name(first)))?;
            g.dir_dirty = true;
        }
        Ok(())
    }

    /// Removes every record `index <= upto`, durably: the purge point is
    /// written first, then the segments it covers whole are deleted.
    pub(crate) fn purge(&self, upto: u64) -> io::Result<()> {
        let mut g = self.lock();
        if g.purged.is_some_and(|p| p >= upto) {
            return Ok(());
        }
        let tmp = self.dir.join(format!("{PURGED_FILE}.tmp"));
        std::fs::write(&tmp, upto.to_string())?;
        File::open(&tmp)?.sync_all()?;
        std::fs::rename(&tmp, self.dir.join(PURGED_FILE))?;
        sync_dir(&self.dir)?;
        // Records of a segment that stays are hidden by `Inner::first`.
        g.purged = Some(upto);
        self.drop_purged(&mut g, upto)?;
        debug_assert!(g.first().is_none_or(|f| f > upto), "purged up to {upto}");
        debug_assert!(g.contiguous(), "the log's segments hold one run of indexes");
        drop(g);
        self.sync()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(i: u64) -> (u64, Vec<u8>) {
        (i, format!("record {i}").into_bytes())
    }

    fn indexes(w: &Wal, from: u64, to: u64) -> Vec<u64> {
        w.range(from, to)
            .unwrap()
            .into_iter()
            .map(|(i, _)| i)
            .collect()
    }

    fn segments(dir: &Path) -> usize {
        std::fs::read_dir(dir)
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .ends_with(".seg")
            })
            .count()
    }

    #[test]
    fn records_come_back_across_segments_and_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let w = Wal::open_with(dir.path(), 64).unwrap();
        assert!(w.is_empty());
        for i in 0..10 {
            w.append(&[rec(i)]).unwrap();
        }
        w.append(&[rec(10), rec(11), rec(12)]).unwrap();
        w.sync().unwrap();
        assert!(segments(dir.path()) > 2);
        assert_eq!(w.range(3, 5).unwrap(), vec![rec(3), rec(4)]);
        assert_eq!(indexes(&w, 0, 100), (0..13).collect::<Vec<_>>());
        drop(w);
        let w = Wal::open_with(dir.path(), 64).unwrap();
        assert_eq!(w.first().unwrap(), Some(rec(0)));
        assert_eq!(w.last().unwrap(), Some(rec(12)));
        assert_eq!(
            w.range(0, 13).unwrap(),
            (0..13).map(rec).collect::<Vec<_>>()
        );
        assert!(w.range(5, 5).unwrap().is_empty());
    }

    #[test]
    fn truncation_and_an_overlapping_append_replace_the_tail_and_a_gap_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let w = Wal::open_with(dir.path(), 64).unwrap();
        w.append(&(1..=9).map(rec).collect::<Vec<_>>()).unwrap();
        w.truncate(6).unwrap();
        assert_eq!(indexes(&w, 0, 100), (1..=5).collect::<Vec<_>>());
        // An append at 4 replaces 4 and 5.
        w.append(&[(4, b"new 4".to_vec())]).unwrap();
        assert_eq!(w.last().unwrap(), Some((4, b"new 4".to_vec())));
        let e = w.append(&[rec(6)]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
        w.sync().unwrap();
        drop(w);
        let w = Wal::open_with(dir.path(), 64).unwrap();
        assert_eq!(indexes(&w, 0, 100), vec![1, 2, 3, 4]);
        w.truncate(0).unwrap();
        assert!(w.is_empty());
        // An empty log starts anywhere.
        w.append(&[rec(40)]).unwrap();
        assert_eq!(indexes(&w, 0, 100), vec![40]);
    }

    #[test]
    fn a_purge_hides_and_deletes_records_and_survives_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let w = Wal::open_with(dir.path(), 64).unwrap();
        w.append(&(0..20).map(rec).collect::<Vec<_>>()).unwrap();
        let before = segments(dir.path());
        w.purge(12).unwrap();
        assert!(segments(dir.path()) < before);
        assert_eq!(w.first().unwrap(), Some(rec(13)));
        assert_eq!(indexes(&w, 0, 100), (13..20).collect::<Vec<_>>());
        let e = w.append(&[rec(12)]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
        drop(w);
        let w = Wal::open_with(dir.path(), 64).unwrap();
        assert_eq!(w.first().unwrap(), Some(rec(13)));
        // Everything purged: the next append may start past the purge point.
        w.purge(19).unwrap();
        assert!(w.is_empty());
        w.append(&[rec(30)]).unwrap();
        assert_eq!(indexes(&w, 0, 100), vec![30]);
    }

    fn file_len(path: &Path) -> u64 {
        std::fs::metadata(path).unwrap().len()
    }

    #[test]
    fn appends_go_into_space_allocated_ahead_whose_zeros_end_a_segment() {
        let dir = tempfile::tempdir().unwrap();
        let seg = dir.path().join(segment_name(0));
        let w = Wal::open_with(dir.path(), 1 << 20).unwrap();
        w.append(&(0..3).map(rec).collect::<Vec<_>>()).unwrap();
        w.sync().unwrap();
        let end: u64 = (0..3).map(|i| (HEADER + rec(i).1.len()) as u64).sum();
        let allocated = w.prealloc.load(std::sync::atomic::Ordering::Relaxed) > 0;
        // Where the file system allocates ahead, the file is a step long.
        let expected = if allocated { PREALLOC_BYTES } else { end };
        assert_eq!(file_len(&seg), expected);
        w.append(&[rec(3)]).unwrap();
        w.sync().unwrap();
        assert_eq!(file_len(&seg), expected.max(end + 24));
        drop(w);
        // The zeros after the records are neither records nor damage: the
        // segment keeps its space.
        let w = Wal::open_with(dir.path(), 1 << 20).unwrap();
        assert_eq!(indexes(&w, 0, 100), vec![0, 1, 2, 3]);
        assert_eq!(file_len(&seg), expected.max(end + 24));
        // A closed segment ends in zeros too (the next one started).
        drop(w);
        let w = Wal::open_with(dir.path(), 1).unwrap();
        w.append(&[rec(4), rec(5)]).unwrap();
        w.sync().unwrap();
        drop(w);
        let w = Wal::open_with(dir.path(), 1).unwrap();
        assert_eq!(indexes(&w, 0, 100), (0..6).collect::<Vec<_>>());
        drop(w);
        // Anything but zeros after a closed segment's records is damage.
        let f = OpenOptions::new().write(true).open(&seg).unwrap();
        f.write_all_at(b"junk", end + 24 + 100).unwrap();
        drop(f);
        let e = Wal::open_with(dir.path(), 1).err().expect("refused");
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
    }

    #[test]
    fn a_record_written_over_a_removed_one_is_not_followed_by_the_rest() {
        // Records of equal length: one written where a removed one began
        // ends exactly where the next removed one began.
        let dir = tempfile::tempdir().unwrap();
        let w = Wal::open_with(dir.path(), 1 << 20).unwrap();
        w.append(&(1..=9).map(rec).collect::<Vec<_>>()).unwrap();
        w.sync().unwrap();
        w.truncate(6).unwrap();
        w.append(&[(6, b"RECORD 6".to_vec())]).unwrap();
        w.sync().unwrap();
        // The same through an overlapping append.
        w.append(&[(7, b"record 7".to_vec()), (8, b"record 8".to_vec())])
            .unwrap();
        w.append(&[(7, b"RECORD 7".to_vec())]).unwrap();
        w.sync().unwrap();
        drop(w);
        let w = Wal::open_with(dir.path(), 1 << 20).unwrap();
        assert_eq!(indexes(&w, 0, 100), (1..=7).collect::<Vec<_>>());
        assert_eq!(w.last().unwrap(), Some((7, b"RECORD 7".to_vec())));
        assert_eq!(w.range(6, 7).unwrap(), vec![(6, b"RECORD 6".to_vec())]);
    }

    #[test]
    fn a_torn_tail_is_cut_and_damage_before_it_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let w = Wal::open_with(dir.path(), 1 << 20).unwrap();
        w.append(&(0..3).map(rec).collect::<Vec<_>>()).unwrap();
        w.sync().unwrap();
        drop(w);
        let seg = dir.path().join(segment_name(0));
        let end: u64 = (0..3).map(|i| (HEADER + rec(i).1.len()) as u64).sum();
        let f = OpenOptions::new().write(true).open(&seg).unwrap();
        f.set_len(end - 3).unwrap();
        drop(f);
        let w = Wal::open_with(dir.path(), 1 << 20).unwrap();
        assert_eq!(indexes(&w, 0, 100), vec![0, 1]);
        // Torn inside allocated space: the record's end is zeros.
        w.append(&[rec(2)]).unwrap();
        w.sync().unwrap();
        drop(w);
        let f = OpenOptions::new().write(true).open(&seg).unwrap();
        f.write_all_at(&[0; 3], end - 3).unwrap();
        drop(f);
        let w = Wal::open_with(dir.path(), 1 << 20).unwrap();
        assert_eq!(indexes(&w, 0, 100), vec![0, 1]);
        w.append(&[rec(2), rec(3)]).unwrap();
        w.sync().unwrap();
        drop(w);
        // A flipped byte in a segment that is not the last one.
        let w = Wal::open_with(dir.path(), 1).unwrap();
        w.append(&[rec(4)]).unwrap();
        w.sync().unwrap();
        drop(w);
        let mut data = std::fs::read(&seg).unwrap();
        data[HEADER + 2] ^= 0xff;
        std::fs::write(&seg, data).unwrap();
        let e = Wal::open_with(dir.path(), 1).err().expect("refused");
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
        assert!(e.to_string().contains("record 0"), "{e}");
    }
}
