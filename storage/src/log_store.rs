//! The Raft log, vote and committed index on a [`Backend`]: openraft's
//! `RaftLogStorage` (storage-v2).

use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::sync::Arc;

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{
    AnyError, ErrorSubject, ErrorVerb, OptionalSend, RaftLogReader, StorageIOError, Vote,
};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::backend::Backend;
use crate::types::{Entry, LogId, NodeId, StorageError, TypeConfig};

const VOTE_KEY: &str = "vote";
const COMMITTED_KEY: &str = "committed";
const LAST_PURGED_KEY: &str = "last_purged";

pub(crate) fn io_err(
    subject: ErrorSubject<NodeId>,
    verb: ErrorVerb,
    e: impl std::error::Error + 'static,
) -> StorageError {
    StorageIOError::new(subject, verb, AnyError::new(&e)).into()
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

/// The log store of one node. Clones share the same backend.
#[derive(Clone)]
pub struct LogStore {
    backend: Arc<dyn Backend>,
    node_id: NodeId,
}

impl LogStore {
    pub(crate) fn new(backend: Arc<dyn Backend>, node_id: NodeId) -> Self {
        LogStore { backend, node_id }
    }

    fn meta<T: DeserializeOwned>(
        &self,
        key: &str,
        subject: ErrorSubject<NodeId>,
    ) -> Result<Option<T>, StorageError> {
        let raw = self
            .backend
            .meta_get(key)
            .map_err(|e| io_err(subject.clone(), ErrorVerb::Read, e))?;
        raw.map(|b| decode(&b).map_err(|e| io_err(subject, ErrorVerb::Read, e)))
            .transpose()
    }

    async fn put_meta<T: Serialize>(
        &self,
        key: &'static str,
        value: &T,
        durable: bool,
        subject: ErrorSubject<NodeId>,
    ) -> Result<(), StorageError> {
        let bytes = encode(value).map_err(|e| io_err(subject.clone(), ErrorVerb::Write, e))?;
        let backend = self.backend.clone();
        blocking(move || backend.meta_put(key, &bytes, durable))
            .await
            .map_err(|e| io_err(subject, ErrorVerb::Write, e))
    }

    fn last_purged(&self) -> Result<Option<LogId>, StorageError> {
        self.meta(LAST_PURGED_KEY, ErrorSubject::Store)
    }

    /// Writes entries in one batch and flushes before returning (what
    /// `append` does before firing its callback). Also used by tools and tests
    /// that build a journal without a running Raft node.
    pub async fn write_entries(
        &self,
        entries: impl IntoIterator<Item = Entry>,
    ) -> Result<(), StorageError> {
        let mut records = Vec::new();
        for e in entries {
            let bytes =
                encode(&e).map_err(|err| io_err(ErrorSubject::Logs, ErrorVerb::Write, err))?;
            records.push((e.log_id.index, bytes));
        }
        let backend = self.backend.clone();
        blocking(move || backend.log_append(&records))
            .await
            .map_err(|e| io_err(ErrorSubject::Logs, ErrorVerb::Write, e))
    }

    /// Decodes one stored entry.
    fn decode_entry(bytes: &[u8]) -> Result<Entry, StorageError> {
        decode(bytes).map_err(|e| io_err(ErrorSubject::Logs, ErrorVerb::Read, e))
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

    fn is_own_leadership(&self, v: &Vote<NodeId>) -> bool {
        v.is_committed() && v.leader_id().voted_for() == Some(self.node_id)
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

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
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
        let backend = self.backend.clone();
        let records = blocking(move || backend.log_range(from, to))
            .await
            .map_err(|e| io_err(ErrorSubject::Logs, ErrorVerb::Read, e))?;
        records
            .iter()
            .map(|(_, bytes)| Self::decode_entry(bytes))
            .collect()
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let last_purged = self.last_purged()?;
        let last = self
            .backend
            .log_last()
            .map_err(|e| io_err(ErrorSubject::Logs, ErrorVerb::Read, e))?;
        let last_log_id = match last {
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

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), StorageError> {
        self.put_meta(VOTE_KEY, vote, true, ErrorSubject::Vote)
            .await
    }

    /// The saved vote, except that this node's own committed vote comes back
    /// uncommitted (in memory only; what is stored stays as it is).
    ///
    /// openraft 0.9 restores a node whose saved vote is committed and its own
    /// straight back as leader of that term (`Engine::startup`), appending no
    /// new entry, with the commit index read from disk (`get_initial_state`)
    /// — which `save_committed` does not flush, so after a crash it can be
    /// behind the last entry the node had acknowledged. A read served before
    /// the first replication round trip would then miss acknowledged writes
    /// (openraft issue #1511; fixed upstream after 0.9 by
    /// `Config::enable_leader_restore`). The uncommitted vote for itself in
    /// the same term is equally binding (no other candidate of that term can
    /// get this node's vote) but is not leadership: the node starts as a
    /// follower, campaigns in a higher term, and commits a fresh blank entry
    /// before it serves anything.
    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError> {
        let vote: Option<Vote<NodeId>> = self.meta(VOTE_KEY, ErrorSubject::Vote)?;
        Ok(vote.map(|v| {
            if self.is_own_leadership(&v) {
                Vote::new(v.leader_id().get_term(), self.node_id)
            } else {
                v
            }
        }))
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        // Not flushed: losing it only means re-applying a little less at start.
        self.put_meta(COMMITTED_KEY, &committed, false, ErrorSubject::Store)
            .await?;
        if let Some(c) = committed {
            self.backend.note_committed(c.index);
        }
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        Ok(self
            .meta::<Option<LogId>>(COMMITTED_KEY, ErrorSubject::Store)?
            .flatten())
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        // The flush happens inside write_entries; only then is the callback fired.
        match self.write_entries(entries).await {
            Ok(()) => {
                callback.log_io_completed(Ok(()));
                Ok(())
            }
            Err(e) => {
                callback.log_io_completed(Err(std::io::Error::other(e.to_string())));
                Err(e)
            }
        }
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let backend = self.backend.clone();
        blocking(move || backend.log_truncate(log_id.index))
            .await
            .map_err(|e| io_err(ErrorSubject::Logs, ErrorVerb::Delete, e))
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        // Record the purge point first; the batch delete and its flush follow.
        self.put_meta(LAST_PURGED_KEY, &log_id, false, ErrorSubject::Store)
            .await?;
        let backend = self.backend.clone();
        blocking(move || backend.log_purge(log_id.index))
            .await
            .map_err(|e| io_err(ErrorSubject::Logs, ErrorVerb::Delete, e))
    }
}
