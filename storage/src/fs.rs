//! File-system helpers shared by the stores of a data dir: syncing a
//! directory's entries, and a writer that counts and checksums what passes
//! through it.

use std::io;
use std::path::Path;

/// fsyncs a directory (its entries: files created, renamed or removed in it).
pub(crate) fn sync_dir(dir: &Path) -> io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

/// fsyncs the directory holding `path` (`.` for a bare file name).
pub(crate) fn sync_parent(path: &Path) -> io::Result<()> {
    match path.parent().filter(|p| !p.as_os_str().is_empty()) {
        Some(dir) => sync_dir(dir),
        None => sync_dir(Path::new(".")),
    }
}

/// A writer that counts and checksums (CRC-32) what passes through it.
pub(crate) struct CrcWriter<W> {
    pub(crate) inner: W,
    pub(crate) crc: crc32fast::Hasher,
    pub(crate) written: u64,
}

impl<W> CrcWriter<W> {
    pub(crate) fn new(inner: W) -> Self {
        CrcWriter {
            inner,
            crc: crc32fast::Hasher::new(),
            written: 0,
        }
    }
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
