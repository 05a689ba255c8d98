//! File-system helpers shared by the stores of a data dir: syncing a
//! directory's entries, naming a failed disk operation (what, which file,
//! which errno), and a writer that counts and checksums what passes through
//! it.

use std::io;
use std::path::Path;

/// fsyncs a directory (its entries: files created, renamed or removed in it).
pub(crate) fn sync_dir(dir: &Path) -> io::Result<()> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| disk_error("fsync of the directory", dir, e))
}

/// `e`, a failed `op` on `path`, as the error a node stops with: the
/// operation, the path and the errno by name (`ENOSPC`, `EIO`), so an
/// operator reads in one line what failed where. The kind is kept.
pub fn disk_error(op: &str, path: &Path, e: io::Error) -> io::Error {
    let errno = e
        .raw_os_error()
        .map(errno_name)
        .or_else(|| errno_of_kind(e.kind()).map(str::to_string))
        .map(|n| format!(" [{n}]"))
        .unwrap_or_default();
    let what = plain_message(&e.to_string());
    io::Error::new(e.kind(), format!("{op} {}: {what}{errno}", path.display()))
}

/// The errno an error of `kind` stands for, where one does alone (sled
/// hands an error it saw earlier on as its kind and its debug text only).
fn errno_of_kind(kind: io::ErrorKind) -> Option<&'static str> {
    Some(match kind {
        io::ErrorKind::StorageFull => "ENOSPC",
        io::ErrorKind::QuotaExceeded => "EDQUOT",
        io::ErrorKind::ReadOnlyFilesystem => "EROFS",
        io::ErrorKind::FileTooLarge => "EFBIG",
        _ => return None,
    })
}

/// The message of an error text that is an `io::Error`'s debug form
/// (`Os { code: 28, kind: StorageFull, message: "No space left on device" }`,
/// as sled passes one on): the message and the code; any other text as it is.
fn plain_message(text: &str) -> String {
    let Some(rest) = text.strip_prefix("Os { code: ") else {
        return text.to_string();
    };
    let code = rest.split(',').next().unwrap_or_default();
    match rest
        .split_once("message: \"")
        .and_then(|(_, m)| m.split_once('"'))
    {
        Some((message, _)) => format!("{message} (os error {code})"),
        None => text.to_string(),
    }
}

/// The symbolic name of errno `n` for the errors a disk gives.
pub fn errno_name(n: i32) -> String {
    let name = match n {
        libc::ENOSPC => "ENOSPC",
        libc::EIO => "EIO",
        libc::EDQUOT => "EDQUOT",
        libc::EROFS => "EROFS",
        libc::EFBIG => "EFBIG",
        libc::ENOENT => "ENOENT",
        libc::EACCES => "EACCES",
        libc::EPERM => "EPERM",
        libc::EBADF => "EBADF",
        libc::EINVAL => "EINVAL",
        libc::ENOTCONN => "ENOTCONN",
        libc::EMFILE => "EMFILE",
        libc::ENFILE => "ENFILE",
        libc::ENOMEM => "ENOMEM",
        _ => return format!("errno {n}"),
    };
    name.to_string()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_disk_error_names_the_operation_the_path_and_the_errno() {
        let e = disk_error(
            "fdatasync of",
            Path::new("/d/wal/1.seg"),
            io::Error::from_raw_os_error(libc::EIO),
        );
        assert_eq!(e.kind(), io::Error::from_raw_os_error(libc::EIO).kind());
        let text = e.to_string();
        assert!(text.starts_with("fdatasync of /d/wal/1.seg: "), "{text}");
        assert!(text.ends_with("(os error 5) [EIO]"), "{text}");
        // sled's copy of an error it saw: its kind and debug text only.
        let copied = io::Error::new(
            io::ErrorKind::StorageFull,
            "Os { code: 28, kind: StorageFull, message: \"No space left on device\" }",
        );
        let text = disk_error("sled insert into", Path::new("/d"), copied).to_string();
        assert_eq!(
            text,
            "sled insert into /d: No space left on device (os error 28) [ENOSPC]"
        );
    }
}
