//! How a data dir's disk is doing, for the node that decides whether it
//! should lead: how long its fdatasyncs take (the log's, the metadata's;
//! those running now included, so a sync that hangs counts before it ends),
//! and how much space is left under the data dir.

use std::collections::VecDeque;
use std::io;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Most recent flushes kept for the percentile.
const KEPT: usize = 256;

/// A data dir's durable writes (each an fdatasync or more): those running,
/// and the recent ones.
#[derive(Default)]
pub struct FlushWatch {
    inner: Mutex<Flushes>,
}

#[derive(Default)]
struct Flushes {
    /// When each running one started, by a number of its own.
    running: Vec<(u64, Instant)>,
    next: u64,
    /// (when it ended, how long it took), oldest first.
    recent: VecDeque<(Instant, Duration)>,
}

impl FlushWatch {
    fn lock(&self) -> std::sync::MutexGuard<'_, Flushes> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `sync`, a durable write, timed.
    pub fn time<T>(&self, sync: impl FnOnce() -> T) -> T {
        let id = {
            let mut g = self.lock();
            g.next += 1;
            let id = g.next;
            g.running.push((id, Instant::now()));
            id
        };
        let r = sync();
        let mut g = self.lock();
        if let Some(p) = g.running.iter().position(|(i, _)| *i == id) {
            let (_, since) = g.running.swap_remove(p);
            let now = Instant::now();
            g.recent
                .push_back((now, now.saturating_duration_since(since)));
            while g.recent.len() > KEPT {
                g.recent.pop_front();
            }
        }
        r
    }

    /// How long the oldest sync running now has run, if one runs.
    pub fn running(&self) -> Option<Duration> {
        self.lock().running.iter().map(|(_, s)| s.elapsed()).max()
    }

    /// The 99th percentile of the flushes that ended within `window`, and
    /// the one running now counted at its age so far; `None` with neither.
    pub fn p99(&self, window: Duration) -> Option<Duration> {
        let g = self.lock();
        let now = Instant::now();
        let mut took: Vec<Duration> = g
            .recent
            .iter()
            .filter(|(at, _)| now.saturating_duration_since(*at) <= window)
            .map(|(_, d)| *d)
            .collect();
        took.extend(
            g.running
                .iter()
                .map(|(_, s)| now.saturating_duration_since(*s)),
        );
        if took.is_empty() {
            return None;
        }
        took.sort_unstable();
        // The smallest value at or above 99 % of the samples.
        let rank = (took.len() * 99).div_ceil(100).max(1);
        Some(took[rank - 1])
    }
}

/// Bytes an unprivileged writer can still use on the file system holding
/// `path` (`statvfs`: available blocks × fragment size).
pub fn free_bytes(path: &Path) -> io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: statvfs fills the struct we pass, from a NUL-terminated path.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut s) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((s.f_bavail as u64).saturating_mul(s.f_frsize as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_percentile_counts_the_running_flush_at_its_age() {
        let w = std::sync::Arc::new(FlushWatch::default());
        assert_eq!(w.p99(Duration::from_secs(10)), None);
        for _ in 0..10 {
            w.time(|| ());
        }
        let quick = w.p99(Duration::from_secs(10)).expect("samples");
        assert!(quick < Duration::from_millis(50), "{quick:?}");
        let (started, finish) = (std::sync::mpsc::channel(), std::sync::mpsc::channel::<()>());
        let slow = {
            let w = w.clone();
            std::thread::spawn(move || {
                w.time(|| {
                    started.0.send(()).unwrap();
                    finish.1.recv().unwrap();
                })
            })
        };
        started.1.recv().unwrap();
        std::thread::sleep(Duration::from_millis(30));
        assert!(w.running().expect("running") >= Duration::from_millis(30));
        // 11 samples: the 99th percentile is the largest, the running one.
        assert!(w.p99(Duration::from_secs(10)).unwrap() >= Duration::from_millis(30));
        finish.0.send(()).unwrap();
        slow.join().unwrap();
        assert_eq!(w.running(), None);
        // Out of the window, nothing counts.
        assert_eq!(w.p99(Duration::ZERO), None);
    }

    #[test]
    fn free_bytes_reads_the_file_system_and_names_a_missing_path() {
        let dir = tempfile::tempdir().unwrap();
        assert!(free_bytes(dir.path()).unwrap() > 0);
        assert!(free_bytes(&dir.path().join("missing")).is_err());
    }
}
