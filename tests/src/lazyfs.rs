//! A FUSE pass-through file system that loses, at a simulated power cut,
//! every write that was not fsynced — what LazyFS does for Jepsen. The data
//! dirs of the nodes live on it, so a test can cut power to all of them at
//! once and see what a real power loss would leave on disk.
//!
//! Writes go straight through to a backing directory (the kernel sends them
//! to us one by one: no FUSE write-back cache), and before a write or a
//! truncate first changes a page of a file since its last fsync, the
//! page's durable content is saved. `fsync`/`fdatasync` (what
//! `sync_file_range`, sled's bare flush, never sends) make a file's
//! current content durable: its saved pages are dropped. A power cut puts
//! every saved page back and cuts each file to its durable length, then
//! unmounts. The state at the cut is therefore exactly what was fsynced, the
//! harshest outcome a disk may give.
//!
//! Metadata (create, rename, unlink, mkdir) is durable at once, as a
//! journalling file system usually makes it within seconds; a created file
//! whose data was never fsynced comes back empty.
//!
//! It also fails the way a sick disk does, switched on and off while it is
//! mounted (gray failures, [`LazyFs::set_fsync_delay`],
//! [`LazyFs::fail_fsyncs`], [`LazyFs::limit_space`]): fsyncs answered late
//! (the kernel holds the file's inode lock meanwhile, so writes to that
//! file wait too, as on a process stuck on its disk), fsyncs that fail with
//! an errno (their data is not made durable), and a disk that fills: once
//! the space left is used, anything that needs new blocks (a write or an
//! allocation past a file's end, a truncate that grows it) fails with
//! ENOSPC, while writes over existing blocks still succeed, and `statfs`
//! reports the space left.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    AccessFlags, BackgroundSession, BsdFileFlags, Config, Errno, FileAttr, FileHandle, FileType,
    Filesystem, FopenFlags, Generation, INodeNo, LockOwner, MountOption, OpenFlags, RenameFlags,
    ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen,
    ReplyStatfs, ReplyWrite, Request, TimeOrNow, WriteFlags,
};

const PAGE: u64 = 4096;
const TTL: Duration = Duration::from_secs(1);

/// The durable image of a file changed since its last fsync.
struct Dirty {
    /// Its length at the last fsync.
    durable_len: u64,
    /// Durable content of each page changed since (clipped to durable_len).
    pages: HashMap<u64, Vec<u8>>,
}

#[derive(Default)]
struct Tables {
    /// Our inode number → backing path.
    paths: HashMap<u64, PathBuf>,
    /// Open files by handle: (inode, file).
    files: HashMap<u64, (u64, Arc<File>)>,
    next_fh: u64,
    /// Files changed since their last fsync, by inode.
    dirty: HashMap<u64, Dirty>,
    /// Statistics: fsyncs seen, bytes written.
    fsyncs: u64,
    written: u64,
    /// The faults switched on.
    faults: Faults,
}

/// Faults the file system injects (see the module doc).
#[derive(Default)]
struct Faults {
    /// Each fsync is answered after this (on a thread of its own).
    fsync_delay: Duration,
    /// The next `count` fsyncs fail with this errno.
    fail_fsyncs: Option<(i32, u32)>,
    /// Bytes new blocks may still take; `None`: as the backing disk has.
    space_left: Option<u64>,
}

impl Tables {
    /// Takes `grow` bytes of the space left: ENOSPC when there is not that
    /// much.
    fn take_space(&mut self, grow: u64) -> Result<(), Errno> {
        match &mut self.faults.space_left {
            Some(left) if *left < grow => Err(Errno::from_i32(libc::ENOSPC)),
            Some(left) => {
                *left -= grow;
                Ok(())
            }
            None => Ok(()),
        }
    }
}

struct Fs {
    root_ino: u64,
    tables: Arc<Mutex<Tables>>,
}

/// A mounted lazy file system.
pub struct LazyFs {
    backing: PathBuf,
    mountpoint: PathBuf,
    tables: Arc<Mutex<Tables>>,
    session: Option<BackgroundSession>,
}

/// What a power cut threw away.
#[derive(Debug, Default, Clone, Copy)]
pub struct CutReport {
    /// Files whose unsynced changes were dropped.
    pub files: usize,
    /// Bytes of unsynced data dropped (pages restored plus lengths cut).
    pub bytes: u64,
    /// fsync/fdatasync calls seen while mounted.
    pub fsyncs: u64,
}

fn lock(t: &Mutex<Tables>) -> MutexGuard<'_, Tables> {
    t.lock().unwrap_or_else(|p| p.into_inner())
}

impl LazyFs {
    /// Mounts a lazy view of `backing` (a directory) at `mountpoint` (an
    /// empty directory). Needs /dev/fuse and the right to mount (root).
    pub fn mount(backing: &Path, mountpoint: &Path) -> io::Result<LazyFs> {
        std::fs::create_dir_all(backing)?;
        std::fs::create_dir_all(mountpoint)?;
        let backing = backing.canonicalize()?;
        let root_ino = std::fs::metadata(&backing)?.ino();
        let tables = Arc::new(Mutex::new(Tables::default()));
        lock(&tables).paths.insert(1, backing.clone());
        let fs = Fs {
            root_ino,
            tables: tables.clone(),
        };
        let mut config = Config::default();
        config.mount_options = vec![
            MountOption::FSName("coordstore-lazyfs".into()),
            MountOption::DefaultPermissions,
        ];
        let session = fuser::spawn_mount(fs, mountpoint, &config)?;
        Ok(LazyFs {
            backing,
            mountpoint: mountpoint.to_path_buf(),
            tables,
            session: Some(session),
        })
    }

    /// Where the file system is mounted.
    pub fn path(&self) -> &Path {
        &self.mountpoint
    }

    /// The power cut: everything not fsynced is lost, then the file system
    /// is unmounted. Every process writing to it must be dead already.
    pub fn power_cut(mut self) -> io::Result<CutReport> {
        let report = {
            let mut t = lock(&self.tables);
            let mut report = CutReport {
                fsyncs: t.fsyncs,
                ..Default::default()
            };
            let dirty: Vec<(u64, Dirty)> = t.dirty.drain().collect();
            for (ino, d) in dirty {
                let Some(path) = t.paths.get(&ino) else {
                    continue;
                };
                // Gone or replaced since: nothing left to restore.
                match std::fs::symlink_metadata(path) {
                    Ok(m) if m.ino() == ino && m.is_file() => {}
                    _ => continue,
                }
                let f = OpenOptions::new().write(true).open(path)?;
                let len = f.metadata()?.len();
                report.bytes += len.saturating_sub(d.durable_len);
                f.set_len(d.durable_len)?;
                for (page, bytes) in &d.pages {
                    f.write_all_at(bytes, page * PAGE)?;
                    report.bytes += bytes.len() as u64;
                }
                report.files += 1;
            }
            report
        };
        self.unmount()?;
        Ok(report)
    }

    /// Unmounts, keeping every write (a clean shutdown).
    pub fn unmount(&mut self) -> io::Result<()> {
        match self.session.take() {
            Some(s) => match s.umount_and_join() {
                // The session's last read of /dev/fuse ends with ENODEV once
                // the mount is gone, but on the 6.18 kernel the full suite
                // ran on it once ended with ECONNABORTED (the connection
                // aborted by the unmount): with the mount gone, that is the
                // same clean end.
                Err(e) if e.kind() == io::ErrorKind::ConnectionAborted && !self.is_mounted() => {
                    Ok(())
                }
                r => r,
            },
            None => Ok(()),
        }
    }

    /// Whether the mount point is still mounted (per /proc/self/mountinfo).
    fn is_mounted(&self) -> bool {
        let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
            return true;
        };
        let point = self.mountpoint.to_string_lossy();
        info.lines()
            .any(|l| l.split_whitespace().nth(4) == Some(point.as_ref()))
    }

    /// The backing directory.
    pub fn backing(&self) -> &Path {
        &self.backing
    }

    /// Answers every fsync `delay` late from now on (zero: at once).
    pub fn set_fsync_delay(&self, delay: Duration) {
        lock(&self.tables).faults.fsync_delay = delay;
    }

    /// Fails the next `count` fsyncs with `errno` (e.g. `libc::EIO`).
    pub fn fail_fsyncs(&self, errno: i32, count: u32) {
        lock(&self.tables).faults.fail_fsyncs = Some((errno, count));
    }

    /// Leaves `bytes` for new blocks from now on (`Some(0)`: the disk is
    /// full); `None` frees the disk again.
    pub fn limit_space(&self, bytes: Option<u64>) {
        lock(&self.tables).faults.space_left = bytes;
    }

    /// fsyncs seen so far.
    pub fn fsyncs(&self) -> u64 {
        lock(&self.tables).fsyncs
    }
}

impl Drop for LazyFs {
    fn drop(&mut self) {
        if self.session.is_some() {
            if let Err(e) = self.unmount() {
                eprintln!("lazyfs: unmounting {}: {e}", self.mountpoint.display());
                // Leave nothing mounted behind a failed test.
                if let Ok(c) =
                    std::ffi::CString::new(self.mountpoint.as_os_str().as_encoded_bytes())
                {
                    // SAFETY: umount2 on a path we mounted.
                    unsafe {
                        libc::umount2(c.as_ptr(), libc::MNT_DETACH);
                    }
                }
            }
        }
    }
}

fn errno(e: &io::Error) -> Errno {
    Errno::from_i32(e.raw_os_error().unwrap_or(libc::EIO))
}

fn time(secs: i64, nsecs: i64) -> SystemTime {
    if secs >= 0 {
        UNIX_EPOCH + Duration::new(secs as u64, nsecs as u32)
    } else {
        UNIX_EPOCH
    }
}

impl Fs {
    fn ino_of(&self, m: &std::fs::Metadata) -> u64 {
        if m.ino() == self.root_ino {
            1
        } else {
            m.ino()
        }
    }

    fn attr(&self, m: &std::fs::Metadata) -> FileAttr {
        let kind = if m.is_dir() {
            FileType::Directory
        } else if m.file_type().is_symlink() {
            FileType::Symlink
        } else {
            FileType::RegularFile
        };
        FileAttr {
            ino: INodeNo(self.ino_of(m)),
            size: m.size(),
            blocks: m.blocks(),
            atime: time(m.atime(), m.atime_nsec()),
            mtime: time(m.mtime(), m.mtime_nsec()),
            ctime: time(m.ctime(), m.ctime_nsec()),
            crtime: UNIX_EPOCH,
            kind,
            perm: (m.mode() & 0o7777) as u16,
            nlink: m.nlink() as u32,
            uid: m.uid(),
            gid: m.gid(),
            rdev: m.rdev() as u32,
            blksize: 4096,
            flags: 0,
        }
    }

    fn path(&self, ino: INodeNo) -> Result<PathBuf, Errno> {
        lock(&self.tables)
            .paths
            .get(&ino.0)
            .cloned()
            .ok_or(Errno::ENOENT)
    }

    fn child(&self, parent: INodeNo, name: &OsStr) -> Result<PathBuf, Errno> {
        Ok(self.path(parent)?.join(name))
    }

    /// Stats `path` and remembers it under its inode.
    fn remember(&self, path: PathBuf) -> io::Result<FileAttr> {
        let m = std::fs::symlink_metadata(&path)?;
        let attr = self.attr(&m);
        lock(&self.tables).paths.insert(attr.ino.0, path);
        Ok(attr)
    }

    /// Saves the durable content of the pages of `ino` that [from, to)
    /// touches, unless saved since the last fsync.
    fn save_pages(t: &mut Tables, ino: u64, f: &File, from: u64, to: u64) -> io::Result<()> {
        if from >= to {
            return Ok(());
        }
        Fs::touch_len(t, ino, f)?;
        let d = t.dirty.get_mut(&ino).expect("touched");
        let end = to.min(d.durable_len);
        let mut page = from / PAGE;
        while page * PAGE < end {
            if let std::collections::hash_map::Entry::Vacant(v) = d.pages.entry(page) {
                let start = page * PAGE;
                let n = (start + PAGE).min(d.durable_len) - start;
                let mut buf = vec![0u8; n as usize];
                f.read_exact_at(&mut buf, start)?;
                v.insert(buf);
            }
            page += 1;
        }
        Ok(())
    }

    /// Marks `ino` as changed since its last fsync (its length at least).
    fn touch_len(t: &mut Tables, ino: u64, f: &File) -> io::Result<()> {
        if let std::collections::hash_map::Entry::Vacant(v) = t.dirty.entry(ino) {
            v.insert(Dirty {
                durable_len: f.metadata()?.len(),
                pages: HashMap::new(),
            });
        }
        Ok(())
    }

    fn open_file(&self, path: &Path, flags: i32) -> io::Result<File> {
        let acc = flags & libc::O_ACCMODE;
        let mut o = OpenOptions::new();
        // Always readable: a write first saves the durable page it changes.
        o.read(true)
            .write(acc == libc::O_WRONLY || acc == libc::O_RDWR)
            // Offsets come from the kernel; truncation comes as setattr.
            .custom_flags(
                flags
                    & !(libc::O_ACCMODE
                        | libc::O_APPEND
                        | libc::O_TRUNC
                        | libc::O_CREAT
                        | libc::O_EXCL),
            );
        o.open(path)
    }

    fn add_handle(&self, ino: u64, f: File) -> u64 {
        let mut t = lock(&self.tables);
        t.next_fh += 1;
        let fh = t.next_fh;
        t.files.insert(fh, (ino, Arc::new(f)));
        fh
    }

    fn handle(&self, fh: FileHandle) -> Result<(u64, Arc<File>), Errno> {
        lock(&self.tables)
            .files
            .get(&fh.0)
            .cloned()
            .ok_or(Errno::EBADF)
    }

    /// The backing path's last link went away: its changes cannot come back.
    fn forget_if_gone(&self, ino: u64, path: &Path) {
        let gone = std::fs::symlink_metadata(path).map_or(true, |m| m.ino() != ino);
        if gone {
            lock(&self.tables).dirty.remove(&ino);
        }
    }
}

macro_rules! tri {
    ($reply:ident, $e:expr) => {
        match $e {
            Ok(v) => v,
            Err(e) => return $reply.error(e),
        }
    };
}

macro_rules! io {
    ($reply:ident, $e:expr) => {
        match $e {
            Ok(v) => v,
            Err(e) => return $reply.error(errno(&e)),
        }
    };
}

impl Filesystem for Fs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let path = tri!(reply, self.child(parent, name));
        let attr = io!(reply, self.remember(path));
        reply.entry(&TTL, &attr, Generation(0));
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        let m = match fh.and_then(|fh| self.handle(fh).ok()) {
            Some((_, f)) => io!(reply, f.metadata()),
            None => io!(
                reply,
                std::fs::symlink_metadata(tri!(reply, self.path(ino)))
            ),
        };
        reply.attr(&TTL, &self.attr(&m));
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let path = tri!(reply, self.path(ino));
        if let Some(size) = size {
            let f = match fh.and_then(|fh| self.handle(fh).ok()) {
                Some((_, f)) => f,
                None => Arc::new(io!(
                    reply,
                    OpenOptions::new().read(true).write(true).open(&path)
                )),
            };
            let mut t = lock(&self.tables);
            let len = io!(reply, f.metadata()).len();
            tri!(reply, t.take_space(size.saturating_sub(len)));
            io!(reply, Fs::touch_len(&mut t, ino.0, &f));
            if size < len {
                io!(reply, Fs::save_pages(&mut t, ino.0, &f, size, len));
            }
            io!(reply, f.set_len(size));
        }
        if let Some(mode) = mode {
            use std::os::unix::fs::PermissionsExt;
            io!(
                reply,
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode & 0o7777))
            );
        }
        let m = io!(reply, std::fs::symlink_metadata(&path));
        reply.attr(&TTL, &self.attr(&m));
    }

    fn mkdir(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        _mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        let path = tri!(reply, self.child(parent, name));
        io!(reply, std::fs::create_dir(&path));
        let attr = io!(reply, self.remember(path));
        reply.entry(&TTL, &attr, Generation(0));
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let path = tri!(reply, self.child(parent, name));
        let ino = io!(reply, std::fs::symlink_metadata(&path)).ino();
        io!(reply, std::fs::remove_file(&path));
        self.forget_if_gone(ino, &path);
        reply.ok();
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let path = tri!(reply, self.child(parent, name));
        io!(reply, std::fs::remove_dir(&path));
        reply.ok();
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        _flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let from = tri!(reply, self.child(parent, name));
        let to = tri!(reply, self.child(newparent, newname));
        let replaced = std::fs::symlink_metadata(&to).ok().map(|m| m.ino());
        io!(reply, std::fs::rename(&from, &to));
        let mut t = lock(&self.tables);
        if let Some(old) = replaced {
            t.dirty.remove(&old);
        }
        // Re-point the moved entry and everything below it.
        for p in t.paths.values_mut() {
            if let Ok(rest) = p.strip_prefix(&from) {
                *p = if rest.as_os_str().is_empty() {
                    to.clone()
                } else {
                    to.join(rest)
                };
            }
        }
        reply.ok();
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let path = tri!(reply, self.path(ino));
        let f = io!(reply, self.open_file(&path, flags.0));
        let fh = self.add_handle(ino.0, f);
        reply.opened(FileHandle(fh), FopenFlags::empty());
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let (_, f) = tri!(reply, self.handle(fh));
        let mut buf = vec![0u8; size as usize];
        let mut n = 0;
        while n < buf.len() {
            match f.read_at(&mut buf[n..], offset + n as u64) {
                Ok(0) => break,
                Ok(k) => n += k,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return reply.error(errno(&e)),
            }
        }
        reply.data(&buf[..n]);
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let (ino, f) = tri!(reply, self.handle(fh));
        let mut t = lock(&self.tables);
        let len = io!(reply, f.metadata()).len();
        tri!(
            reply,
            t.take_space((offset + data.len() as u64).saturating_sub(len))
        );
        io!(reply, Fs::touch_len(&mut t, ino, &f));
        io!(
            reply,
            Fs::save_pages(&mut t, ino, &f, offset, offset + data.len() as u64)
        );
        io!(reply, f.write_all_at(data, offset));
        t.written += data.len() as u64;
        reply.written(data.len() as u32);
    }

    /// Allocation that grows the file with zeros (mode 0; the log
    /// allocates its segments ahead). Like a write past the end, the new
    /// length is durable at the file's next fsync: a power cut before it
    /// cuts the file back.
    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        if mode != 0 {
            return reply.error(Errno::from_i32(libc::EOPNOTSUPP));
        }
        let (ino, f) = tri!(reply, self.handle(fh));
        let (Ok(offset), Ok(length)) = (i64::try_from(offset), i64::try_from(length)) else {
            return reply.error(Errno::from_i32(libc::EFBIG));
        };
        let mut t = lock(&self.tables);
        let len = io!(reply, f.metadata()).len();
        let end = (offset + length) as u64;
        tri!(reply, t.take_space(end.saturating_sub(len)));
        io!(reply, Fs::touch_len(&mut t, ino, &f));
        use std::os::fd::AsRawFd;
        // SAFETY: a plain syscall on the backing file this handle owns.
        if unsafe { libc::fallocate(f.as_raw_fd(), 0, offset, length) } != 0 {
            return reply.error(errno(&io::Error::last_os_error()));
        }
        reply.ok();
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        lock(&self.tables).files.remove(&fh.0);
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        // Durable now. (The backing file system is not losing power, so its
        // own fsync is not needed to model this one.)
        let mut t = lock(&self.tables);
        t.fsyncs += 1;
        if let Some((errno, count)) = t.faults.fail_fsyncs {
            t.faults.fail_fsyncs = (count > 1).then_some((errno, count - 1));
            return reply.error(Errno::from_i32(errno));
        }
        let delay = t.faults.fsync_delay;
        if delay.is_zero() {
            t.dirty.remove(&ino.0);
            return reply.ok();
        }
        drop(t);
        // Answered late, from a thread of its own: the file system serves
        // other requests meanwhile.
        let tables = self.tables.clone();
        std::thread::spawn(move || {
            std::thread::sleep(delay);
            lock(&tables).dirty.remove(&ino.0);
            reply.ok();
        });
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let path = tri!(reply, self.path(ino));
        let mut entries: Vec<(u64, FileType, std::ffi::OsString)> = vec![
            (ino.0, FileType::Directory, ".".into()),
            (ino.0, FileType::Directory, "..".into()),
        ];
        for e in io!(reply, std::fs::read_dir(&path)) {
            let e = io!(reply, e);
            let m = io!(reply, e.metadata());
            let kind = if m.is_dir() {
                FileType::Directory
            } else {
                FileType::RegularFile
            };
            entries.push((self.ino_of(&m), kind, e.file_name()));
        }
        for (i, (ino, kind, name)) in entries.into_iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(ino), (i + 1) as u64, kind, &name) {
                break;
            }
        }
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let path = tri!(reply, self.path(INodeNo(1)));
        let c = match std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) {
            Ok(c) => c,
            Err(_) => return reply.error(Errno::EINVAL),
        };
        // SAFETY: statvfs fills the struct we pass.
        let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
        if unsafe { libc::statvfs(c.as_ptr(), &mut s) } != 0 {
            return reply.error(errno(&io::Error::last_os_error()));
        }
        // A limited disk reports the space left.
        let (mut bfree, mut bavail) = (s.f_bfree, s.f_bavail);
        if let Some(left) = lock(&self.tables).faults.space_left {
            let blocks = left / (s.f_frsize.max(1) as u64);
            (bfree, bavail) = (bfree.min(blocks), bavail.min(blocks));
        }
        reply.statfs(
            s.f_blocks,
            bfree,
            bavail,
            s.f_files,
            s.f_ffree,
            s.f_bsize as u32,
            s.f_namemax as u32,
            s.f_frsize as u32,
        );
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        reply.ok();
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let path = tri!(reply, self.child(parent, name));
        let mut o = OpenOptions::new();
        o.read(true).write(true).mode(mode & 0o7777);
        if flags & libc::O_EXCL != 0 {
            o.create_new(true);
        } else {
            o.create(true);
        }
        let f = io!(reply, o.open(&path));
        let attr = io!(reply, self.remember(path));
        {
            // A new file holds nothing durable until it is fsynced.
            let mut t = lock(&self.tables);
            t.dirty.insert(
                attr.ino.0,
                Dirty {
                    durable_len: 0,
                    pages: HashMap::new(),
                },
            );
        }
        if flags & libc::O_TRUNC != 0 {
            io!(reply, f.set_len(0));
        }
        let fh = self.add_handle(attr.ino.0, f);
        reply.created(
            &TTL,
            &attr,
            Generation(0),
            FileHandle(fh),
            FopenFlags::empty(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// Mounting needs root and /dev/fuse; the tests that need it say why
    /// they stop when neither is there.
    fn mount(dir: &Path) -> LazyFs {
        LazyFs::mount(&dir.join("backing"), &dir.join("mnt"))
            .expect("mounting a FUSE file system (needs /dev/fuse and root, as on the CI machines)")
    }

    #[test]
    fn a_power_cut_keeps_exactly_what_was_fsynced() {
        let dir = tempfile::tempdir().unwrap();
        let fs = mount(dir.path());
        let p = fs.path().join("f");
        let mut f = File::create(&p).unwrap();
        f.write_all(&vec![1u8; 10_000]).unwrap();
        f.sync_data().unwrap();
        // Overwrite part of it, grow it, and leave that unsynced.
        f.write_all_at(&[2u8; 100], 5_000).unwrap();
        f.write_all_at(&[3u8; 3_000], 10_000).unwrap();
        // A second file: synced once, then truncated without a sync.
        let q = fs.path().join("g");
        std::fs::write(&q, b"kept").unwrap();
        File::open(&q).unwrap().sync_all().unwrap();
        OpenOptions::new()
            .write(true)
            .open(&q)
            .unwrap()
            .set_len(1)
            .unwrap();
        // A third one never synced at all.
        std::fs::create_dir(fs.path().join("d")).unwrap();
        std::fs::write(fs.path().join("d/h"), b"lost").unwrap();
        assert_eq!(std::fs::read(&p).unwrap().len(), 13_000);
        drop(f);
        let report = fs.power_cut().unwrap();
        assert_eq!(report.files, 3, "{report:?}");
        let b = dir.path().join("backing");
        assert_eq!(std::fs::read(b.join("f")).unwrap(), vec![1u8; 10_000]);
        assert_eq!(std::fs::read(b.join("g")).unwrap(), b"kept");
        assert_eq!(std::fs::read(b.join("d/h")).unwrap(), b"");
    }

    #[test]
    fn space_allocated_ahead_is_durable_at_the_next_fsync_and_writes_into_it_are_not() {
        use std::os::fd::AsRawFd;
        let allocate = |f: &File, offset: i64, len: i64| {
            // SAFETY: fallocate on a file this test holds open.
            let r = unsafe { libc::fallocate(f.as_raw_fd(), 0, offset, len) };
            assert_eq!(r, 0, "fallocate: {}", io::Error::last_os_error());
        };
        let dir = tempfile::tempdir().unwrap();
        let fs = mount(dir.path());
        let (p, q) = (fs.path().join("seg"), fs.path().join("unsynced"));
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&p)
            .unwrap();
        f.write_all_at(b"record", 0).unwrap();
        allocate(&f, 0, 3 * PAGE as i64);
        f.sync_data().unwrap();
        // Written into the allocated zeros, not synced.
        f.write_all_at(b"lost", 6).unwrap();
        // Allocated, never synced: the length goes back.
        let g = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&q)
            .unwrap();
        g.write_all_at(b"kept", 0).unwrap();
        g.sync_data().unwrap();
        allocate(&g, 0, PAGE as i64);
        assert_eq!(g.metadata().unwrap().len(), PAGE);
        drop((f, g));
        fs.power_cut().unwrap();
        let b = dir.path().join("backing");
        let mut want = b"record".to_vec();
        want.resize(3 * PAGE as usize, 0);
        assert_eq!(std::fs::read(b.join("seg")).unwrap(), want);
        assert_eq!(std::fs::read(b.join("unsynced")).unwrap(), b"kept");
    }

    #[test]
    fn a_full_disk_refuses_new_blocks_but_not_overwrites_and_frees_again() {
        let dir = tempfile::tempdir().unwrap();
        let fs = mount(dir.path());
        let p = fs.path().join("f");
        std::fs::write(&p, vec![1u8; 8192]).unwrap();
        fs.limit_space(Some(4096));
        let avail = storage::health::free_bytes(fs.path()).unwrap();
        assert!(avail <= 4096, "statfs reports the space left: {avail}");
        let f = OpenOptions::new().write(true).open(&p).unwrap();
        f.write_all_at(&[2u8; 4096], 8192).expect("4096 bytes fit");
        let e = f.write_all_at(&[3u8; 10], 12_288).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
        f.write_all_at(&[4u8; 100], 0)
            .expect("an overwrite needs no new block");
        fs.limit_space(None);
        f.write_all_at(&[5u8; 10], 12_288).expect("space freed");
    }

    #[test]
    fn failing_and_late_fsyncs_are_what_was_asked() {
        let dir = tempfile::tempdir().unwrap();
        let fs = mount(dir.path());
        let f = File::create(fs.path().join("f")).unwrap();
        fs.fail_fsyncs(libc::EIO, 1);
        let e = f.sync_data().unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
        f.sync_data().expect("only the next one failed");
        fs.set_fsync_delay(Duration::from_millis(300));
        let t0 = std::time::Instant::now();
        // Another file's write goes on while the fsync waits.
        let other = fs.path().join("g");
        let writer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            let t = std::time::Instant::now();
            std::fs::write(other, b"x").unwrap();
            t.elapsed()
        });
        f.sync_data().unwrap();
        assert!(t0.elapsed() >= Duration::from_millis(300));
        assert!(writer.join().unwrap() < Duration::from_millis(250));
    }

    #[test]
    fn synced_data_survives_renames_and_a_remount() {
        let dir = tempfile::tempdir().unwrap();
        let fs = mount(dir.path());
        let tmp = fs.path().join("x.tmp");
        let mut f = File::create(&tmp).unwrap();
        f.write_all(b"value").unwrap();
        f.sync_all().unwrap();
        std::fs::rename(&tmp, fs.path().join("x")).unwrap();
        // Renamed without a sync of its new content: the old content stays.
        f.write_all(b"-more").unwrap();
        drop(f);
        fs.power_cut().unwrap();
        let fs = mount(dir.path());
        assert_eq!(std::fs::read(fs.path().join("x")).unwrap(), b"value");
        assert!(!fs.path().join("x.tmp").exists());
        drop(fs);
    }
}
