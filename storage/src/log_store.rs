//! The Raft log, vote and committed index on a [`Backend`]: openraft's
//! `RaftLogStorage`.
//!
//! An append is written to the log files and returns at once (the entries are
//! readable, so replication can send them); a flusher thread makes them
//! durable and only then tells Raft (`IOFlushed`), so the leader's own
//! fsync runs while the entries are on their way to the followers, and the
//! leader counts itself toward a commit only after it (openraft 0.10 submits
//! log writes without waiting for them). Appends that arrive while a flush
//! runs share the next one (group commit). Vote, truncate and purge stay
//! synchronous and durable when they return, which also covers every append
//! before them, so vote and log writes never reorder on disk.

use std::collections::VecDeque;
use std::fmt::Debug;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use openraft::storage::{IOFlushed, LogState, RaftLogStorage};
use openraft::{EntryPayload, OptionalSend, RaftLogReader};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::backend::Backend;
use crate::health::FlushWatch;
use crate::types::{Entry, LogId, NodeId, TypeConfig, Vote};

const VOTE_KEY: &str = "vote";
const COMMITTED_KEY: &str = "committed";
const LAST_PURGED_KEY: &str = "last_purged";

/// An I/O error with what was being done.
pub(crate) fn io_err(what: &str, e: impl std::fmt::Display) -> io::Error {
    io::Error::other(format!("{what}: {e}"))
}

pub(crate) fn encode<T: Serialize>(v: &T) -> Result<Vec<u8>, bincode::Error> {
    bincode::serialize(v)
}

pub(crate) fn decode<T: DeserializeOwned>(b: &[u8]) -> Result<T, bincode::Error> {
    bincode::deserialize(b)
}

/// Runs a blocking disk operation off the async executor.
pub(crate) async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    match tokio::task::spawn_blocking(f).await {
        Ok(v) => v,
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    }
}

/// Runs `f`, long CPU or disk work that must stay on this task (it borrows
/// what the task holds), without stalling the runtime: on a multi-threaded
/// runtime the worker's other tasks move to another thread first (a node
/// may run a single worker, see the service's `--worker-threads`).
pub(crate) fn in_place<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
    }
}

/// The log store of one node. Clones share the same backend, flusher and
/// tail.
#[derive(Clone)]
pub struct LogStore {
    backend: Arc<dyn Backend>,
    flusher: mpsc::Sender<Flush>,
    /// The committed index + 1 (0: none), for the flusher to note in the
    /// marker file once every append before it is durable (openraft commits
    /// entries this node has only submitted, and the marker must never get
    /// ahead of the durable log: a start-up refuses a log that ends before
    /// it). Read at each flush, not sent: a send would wake the flusher
    /// thread once more per write.
    committed: Arc<AtomicU64>,
    tail: Arc<Mutex<Tail>>,
}

/// Most entries the in-memory tail keeps.
const TAIL_MAX_ENTRIES: usize = 4096;
/// Most payload bytes the in-memory tail keeps: it serves replication
/// reads of the newest entries; older ones come from the log files (the
/// page cache). Snapshots purge it, but a state larger than the snapshot
/// interval spaces them out, so the bound is what holds it.
const TAIL_MAX_BYTES: usize = 8 << 20;

/// The newest appended entries, contiguous, as appended: replication reads
/// what was just appended from here, without a disk read and a decode per
/// follower (etcd's unstable log plays this part). Always a suffix of what
/// the backend holds: appends, truncations and purges change both.
#[derive(Default)]
struct Tail {
    entries: VecDeque<Entry>,
    bytes: usize,
}

fn payload_len(e: &Entry) -> usize {
    match &e.payload {
        EntryPayload::Normal(p) => p.encoded_len(),
        _ => 0,
    }
}

impl Tail {
    fn first_index(&self) -> Option<u64> {
        self.entries.front().map(|e| e.log_id.index)
    }

    fn clear(&mut self) {
        self.entries.clear();
        self.bytes = 0;
    }

    fn pop_front(&mut self) {
        if let Some(e) = self.entries.pop_front() {
            self.bytes -= payload_len(&e);
        }
    }

    /// Adds entries just written after the last one (anything else starts
    /// the tail again), then trims it to its bounds.
    fn push(&mut self, entries: &[Entry]) {
        let Some(first) = entries.first() else {
            return;
        };
        let next = self.entries.back().map(|e| e.log_id.index + 1);
        if next != Some(first.log_id.index) {
            self.clear();
        }
        for e in entries {
            self.bytes += payload_len(e);
            self.entries.push_back(e.clone());
        }
        while self.entries.len() > TAIL_MAX_ENTRIES
            || (self.bytes > TAIL_MAX_BYTES && self.entries.len() > 1)
        {
            self.pop_front();
        }
    }

    /// Drops entries from index `from` on.
    fn truncate(&mut self, from: u64) {
        while self.entries.back().is_some_and(|e| e.log_id.index >= from) {
            if let Some(e) = self.entries.pop_back() {
                self.bytes -= payload_len(&e);
            }
        }
    }

    /// Drops entries up to index `upto`.
    fn purge(&mut self, upto: u64) {
        while self.first_index().is_some_and(|i| i <= upto) {
            self.pop_front();
        }
    }

    /// Entries `from..to` if the tail holds all of them.
    fn range(&self, from: u64, to: u64) -> Option<Vec<Entry>> {
        let first = self.first_index()?;
        let end = first + self.entries.len() as u64;
        if from < first || to > end || from > to {
            return None;
        }
        let skip = (from - first) as usize;
        Some(
            self.entries
                .range(skip..skip + (to - from) as usize)
                .cloned()
                .collect(),
        )
    }
}

/// Work for the flusher thread.
enum Flush {
    /// An append to make durable and report, and when it was written.
    Append(IOFlushed<TypeConfig>, Instant),
    /// Report every append queued before this, then answer.
    Barrier(tokio::sync::oneshot::Sender<()>),
}

impl LogStore {
    pub(crate) fn new(backend: Arc<dyn Backend>, node_id: NodeId) -> Self {
        let (flusher, queue) = mpsc::channel();
        // Weak: the store's owners decide when the database closes (a
        // reopen in the same process must not find it still held here).
        let b = Arc::downgrade(&backend);
        let committed = Arc::new(AtomicU64::new(0));
        let noted = committed.clone();
        std::thread::Builder::new()
            .name(format!("log-flusher-{node_id}"))
            .spawn(move || flush_loop(&b, queue, &noted))
            .expect("spawn the log flusher thread");
        LogStore {
            backend,
            flusher,
            committed,
            tail: Arc::default(),
        }
    }

    /// How the data dir's fdatasyncs go (those running included).
    pub fn flush_watch(&self) -> Arc<FlushWatch> {
        self.backend.sync_watch()
    }

    fn tail(&self) -> MutexGuard<'_, Tail> {
        self.tail.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn meta<T: DeserializeOwned>(&self, key: &str) -> io::Result<Option<T>> {
        let raw = self.backend.meta_get(key)?;
        raw.map(|b| decode(&b).map_err(|e| io_err(key, e)))
            .transpose()
    }

    async fn put_meta<T: Serialize>(
        &self,
        key: &'static str,
        value: &T,
        durable: bool,
    ) -> io::Result<()> {
        let bytes = encode(value).map_err(|e| io_err(key, e))?;
        if !durable {
            // An insert into sled's memory: no reason to leave this task.
            return self.backend.meta_put(key, &bytes, false);
        }
        let backend = self.backend.clone();
        blocking(move || backend.meta_put(key, &bytes, true)).await
    }

    fn last_purged(&self) -> io::Result<Option<LogId>> {
        self.meta(LAST_PURGED_KEY)
    }

    fn encode_entries<'a>(
        entries: impl IntoIterator<Item = &'a Entry>,
    ) -> io::Result<Vec<(u64, Vec<u8>)>> {
        entries
            .into_iter()
            .map(|e| {
                encode(e)
                    .map(|bytes| (e.log_id.index, bytes))
                    .map_err(|err| io_err("encoding a log entry", err))
            })
            .collect()
    }

    /// The journal feature level `entries` need (see
    /// [`Backend::record_level`]).
    fn required_level<'a>(entries: impl IntoIterator<Item = &'a Entry>) -> u32 {
        entries
            .into_iter()
            .filter_map(|e| match &e.payload {
                EntryPayload::Normal(p) => Some(p.required_level()),
                _ => None,
            })
            .max()
            .unwrap_or(journal::LEVEL_BASE)
    }

    /// Writes entries in one batch and flushes before returning. For tools
    /// and tests that build a journal without a running Raft node.
    pub async fn write_entries(&self, entries: impl IntoIterator<Item = Entry>) -> io::Result<()> {
        let entries: Vec<Entry> = entries.into_iter().collect();
        self.backend.record_level(Self::required_level(&entries))?;
        let records = Self::encode_entries(&entries)?;
        self.tail().clear();
        let backend = self.backend.clone();
        blocking(move || {
            backend.log_append(&records)?;
            backend.flush()
        })
        .await
    }

    /// Waits until every append and commit note queued so far was flushed
    /// and reported.
    pub async fn wait_flushed(&self) -> io::Result<()> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.flusher
            .send(Flush::Barrier(tx))
            .map_err(|_| io::Error::other("the log flusher stopped"))?;
        rx.await
            .map_err(|_| io::Error::other("the log flusher stopped"))
    }

    /// Decodes one stored entry.
    fn decode_entry(bytes: &[u8]) -> io::Result<Entry> {
        decode(bytes).map_err(|e| io_err("decoding a log entry", e))
    }

    /// The highest log index this store can account for: its last entry, or
    /// the last purged one.
    pub fn last_index(&self) -> Result<u64, String> {
        let last = match self.backend.log_last() {
            Ok(Some((i, _))) => i,
            Ok(None) => 0,
            Err(e) => return Err(format!("cannot read the log: {e}")),
        };
        let purged = self
            .last_purged()
            .map_err(|e| format!("cannot read the log metadata: {e}"))?
            .map_or(0, |l| l.index);
        Ok(last.max(purged))
    }

    /// Checks the first and last stored entries decode (start-up sanity).
    pub(crate) fn check_readable(&self) -> Result<(), String> {
        for rec in [self.backend.log_first(), self.backend.log_last()] {
            match rec {
                Err(e) => return Err(format!("cannot read the log: {e}")),
                Ok(Some((index, bytes))) => match Self::decode_entry(&bytes) {
                    Ok(e) if e.log_id.index == index => {}
                    Ok(_) => {
                        return Err(format!("log entry {index} is stored under the wrong index"))
                    }
                    Err(_) => return Err(format!("log entry {index} is corrupted")),
                },
                Ok(None) => {}
            }
        }
        Ok(())
    }
}

/// The flusher: waits for appended batches, makes everything written so far
/// durable once for all that queued meanwhile, then reports each, in order,
/// and notes the committed index read before the queue was taken (every
/// append at or below it was queued before it was set). Ends when every
/// store clone is gone.
fn flush_loop(
    backend: &std::sync::Weak<dyn Backend>,
    queue: mpsc::Receiver<Flush>,
    committed: &AtomicU64,
) {
    while let Ok(first) = queue.recv() {
        let mut done = Vec::new();
        let mut barriers = Vec::new();
        let committed = committed.load(AtomicOrdering::Acquire).checked_sub(1);
        for job in std::iter::once(first).chain(queue.try_iter()) {
            match job {
                Flush::Append(cb, written) => done.push((cb, written)),
                Flush::Barrier(tx) => barriers.push(tx),
            }
        }
        // Appends queued before this pass were flushed by an earlier one.
        let mut flushed = Ok(());
        if !done.is_empty() {
            let t0 = Instant::now();
            flushed = match backend.upgrade() {
                Some(b) => b.flush(),
                None => Err(io::Error::other("the database is closed")),
            };
            crate::metrics::FLUSH_SECONDS.observe(t0.elapsed().as_secs_f64());
            crate::metrics::FLUSH_APPENDS.observe(done.len() as f64);
            match &flushed {
                Ok(()) => {
                    let now = Instant::now();
                    for (cb, written) in done {
                        crate::metrics::APPEND_DURABLE_SECONDS
                            .observe(now.saturating_duration_since(written).as_secs_f64());
                        cb.io_completed(Ok(()));
                    }
                }
                Err(e) => {
                    tracing::error!("flushing the log failed: {e}");
                    for (cb, _) in done {
                        cb.io_completed(Err(io::Error::new(e.kind(), e.to_string())));
                    }
                }
            }
        }
        if let (Ok(()), Some(index), Some(b)) = (&flushed, committed, backend.upgrade()) {
            b.note_committed(index);
        }
        for b in barriers {
            let _ = b.send(());
        }
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> io::Result<Vec<Entry>> {
        let from = match range.start_bound() {
            Bound::Included(x) => *x,
            Bound::Excluded(x) => x.saturating_add(1),
            Bound::Unbounded => 0,
        };
        let to = match range.end_bound() {
            Bound::Included(x) => x.saturating_add(1),
            Bound::Excluded(x) => *x,
            Bound::Unbounded => u64::MAX,
        };
        if let Some(entries) = self.tail().range(from, to) {
            return Ok(entries);
        }
        let backend = self.backend.clone();
        let records = blocking(move || backend.log_range(from, to)).await?;
        records
            .iter()
            .map(|(_, bytes)| Self::decode_entry(bytes))
            .collect()
    }

    /// The saved vote, as saved. (A node restarted with its own committed
    /// vote does not come back as leader of that term: the Raft config sets
    /// `enable_leader_restore` off, see `raft::config`.)
    async fn read_vote(&mut self) -> io::Result<Option<Vote>> {
        self.meta(VOTE_KEY)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> io::Result<LogState<TypeConfig>> {
        let last_purged = self.last_purged()?;
        let last_log_id = match self.backend.log_last()? {
            Some((_, bytes)) => Some(Self::decode_entry(&bytes)?.log_id),
            None => last_purged,
        };
        Ok(LogState {
            last_purged_log_id: last_purged,
            last_log_id,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> io::Result<()> {
        self.put_meta(VOTE_KEY, vote, true).await
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> io::Result<()> {
        // Not flushed: losing it only means re-applying a little less at start.
        self.put_meta(COMMITTED_KEY, &committed, false).await?;
        if let Some(c) = committed {
            // Noted at the next flush, after every append queued before it.
            self.committed
                .fetch_max(c.index + 1, AtomicOrdering::Release);
        }
        Ok(())
    }

    /// The saved committed id, never past the last entry the log holds (or
    /// its purge point): it is saved without a sync, and it can reach the
    /// disk before the log records it covers do (they are in other files).
    async fn read_committed(&mut self) -> io::Result<Option<LogId>> {
        let committed = self.meta::<Option<LogId>>(COMMITTED_KEY)?.flatten();
        let held = match self.backend.log_last()? {
            Some((_, bytes)) => Some(Self::decode_entry(&bytes)?.log_id),
            None => self.last_purged()?,
        };
        Ok(match (committed, held) {
            (Some(c), Some(h)) if h.index < c.index => Some(h),
            (Some(_), None) => None,
            (c, _) => c,
        })
    }

    /// Writes the entries (readable at once) and queues their flush: the
    /// callback fires once they are durable.
    async fn append<I>(&mut self, entries: I, callback: IOFlushed<TypeConfig>) -> io::Result<()>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries: Vec<Entry> = entries.into_iter().collect();
        debug_assert!(
            entries
                .windows(2)
                .all(|w| w[1].log_id.index == w[0].log_id.index + 1),
            "openraft appends consecutive entries"
        );
        // The data dir says what its log needs before the log holds it (a
        // sync, once per level): an older build refuses the dir instead of
        // misreading it.
        self.backend.record_level(Self::required_level(&entries))?;
        let records = Self::encode_entries(&entries)?;
        // A write into the page cache, on this task (a running flush does
        // not hold it up): the follower answers and the leader replicates
        // without a thread hop.
        self.backend.log_append(&records)?;
        self.tail().push(&entries);
        if let Err(mpsc::SendError(Flush::Append(callback, _))) =
            self.flusher.send(Flush::Append(callback, Instant::now()))
        {
            let e = io::Error::other("the log flusher stopped");
            callback.io_completed(Err(io::Error::other(e.to_string())));
            return Err(e);
        }
        Ok(())
    }

    /// Truncation waits until every earlier append was flushed and
    /// reported, so no report ever covers entries already removed.
    async fn truncate_after(&mut self, last_log_id: Option<LogId>) -> io::Result<()> {
        self.wait_flushed().await?;
        let from = last_log_id.map_or(0, |l| l.index + 1);
        self.tail().truncate(from);
        let backend = self.backend.clone();
        blocking(move || backend.log_truncate(from)).await
    }

    async fn purge(&mut self, log_id: LogId) -> io::Result<()> {
        // Record the purge point first; the batch delete and its flush follow.
        self.put_meta(LAST_PURGED_KEY, &log_id, false).await?;
        self.tail().purge(log_id.index);
        let backend = self.backend.clone();
        blocking(move || backend.log_purge(log_id.index)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{LeaderId, Proposal};
    use journal::pb::{coordination::KvInsert, update::Command as Cmd, UpdateBatch};

    /// On a runtime of one worker, a task busy in `in_place` (a snapshot
    /// being encoded) leaves the worker to the others: here the task it
    /// waits for runs meanwhile. Without it the two would wait on each
    /// other until the deadline.
    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn work_in_place_leaves_the_runtime_to_other_tasks() {
        use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
        let flag = Arc::new(AtomicBool::new(false));
        let (started, running) = tokio::sync::oneshot::channel();
        let seen = flag.clone();
        let busy = tokio::spawn(async move {
            in_place(move || {
                let _ = started.send(());
                let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
                while !seen.load(SeqCst) && std::time::Instant::now() < deadline {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                seen.load(SeqCst)
            })
        });
        running.await.unwrap();
        tokio::spawn(async move { flag.store(true, SeqCst) });
        assert!(busy.await.unwrap(), "the other task never ran");
    }

    /// Outside a multi-threaded runtime the work just runs.
    #[tokio::test(flavor = "current_thread")]
    async fn work_in_place_runs_on_a_current_thread_runtime() {
        assert_eq!(in_place(|| 7), 7);
        assert_eq!(std::thread::spawn(|| in_place(|| 8)).join().unwrap(), 8);
    }

    fn entry(index: u64) -> Entry {
        Entry {
            log_id: LogId::new(
                LeaderId {
                    term: 1,
                    node_id: 1,
                },
                index,
            ),
            payload: EntryPayload::Normal(Proposal::default()),
        }
    }

    fn entries(r: std::ops::Range<u64>) -> Vec<Entry> {
        r.map(entry).collect()
    }

    fn indexes(v: Option<Vec<Entry>>) -> Option<Vec<u64>> {
        v.map(|v| v.iter().map(|e| e.log_id.index).collect())
    }

    #[test]
    fn the_tail_serves_only_ranges_it_holds_whole() {
        let mut t = Tail::default();
        assert_eq!(indexes(t.range(1, 2)), None);
        t.push(&entries(5..10));
        assert_eq!(indexes(t.range(5, 10)), Some((5..10).collect()));
        assert_eq!(indexes(t.range(7, 9)), Some(vec![7, 8]));
        assert_eq!(indexes(t.range(7, 7)), Some(vec![]));
        assert_eq!(indexes(t.range(4, 9)), None, "starts before the tail");
        assert_eq!(indexes(t.range(6, 11)), None, "ends after the tail");
        assert_eq!(indexes(t.range(8, 7)), None);
    }

    #[test]
    fn a_gap_or_overlap_starts_the_tail_again() {
        let mut t = Tail::default();
        t.push(&entries(1..4));
        t.push(&entries(4..6));
        assert_eq!(indexes(t.range(1, 6)), Some((1..6).collect()));
        t.push(&entries(8..9));
        assert_eq!(indexes(t.range(5, 6)), None);
        assert_eq!(indexes(t.range(8, 9)), Some(vec![8]));
        t.push(&entries(3..5));
        assert_eq!(indexes(t.range(8, 9)), None);
        assert_eq!(indexes(t.range(3, 5)), Some(vec![3, 4]));
    }

    #[test]
    fn truncate_and_purge_cut_the_tail() {
        let mut t = Tail::default();
        t.push(&entries(1..11));
        t.truncate(8);
        assert_eq!(indexes(t.range(1, 8)), Some((1..8).collect()));
        assert_eq!(indexes(t.range(7, 9)), None);
        t.purge(3);
        assert_eq!(indexes(t.range(3, 5)), None);
        assert_eq!(indexes(t.range(4, 8)), Some((4..8).collect()));
        // After a truncation the next append continues where it cut.
        t.push(&entries(8..9));
        assert_eq!(indexes(t.range(4, 9)), Some((4..9).collect()));
        t.purge(100);
        assert_eq!(indexes(t.range(8, 9)), None);
        assert_eq!(t.bytes, 0);
    }

    #[test]
    fn the_tail_keeps_to_its_bounds() {
        let mut t = Tail::default();
        let n = TAIL_MAX_ENTRIES as u64;
        t.push(&entries(1..n + 11));
        assert_eq!(t.entries.len(), TAIL_MAX_ENTRIES);
        assert_eq!(t.first_index(), Some(11));
        // Bytes: one big entry pushes out everything before it.
        let big = Entry {
            payload: EntryPayload::Normal(Proposal::new(UpdateBatch {
                updates: vec![journal::Update {
                    command: Some(Cmd::from(KvInsert {
                        key: "k".into(),
                        value: vec![0; TAIL_MAX_BYTES].into(),
                        allow_overwrite: true,
                    })),
                    ..Default::default()
                }],
            })),
            ..entry(n + 11)
        };
        t.push(&[big]);
        assert_eq!(t.entries.len(), 1);
        assert_eq!(indexes(t.range(n + 11, n + 12)), Some(vec![n + 11]));
    }
}
