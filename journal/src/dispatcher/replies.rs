//! The dispatcher's replies, in an outcome and read back from one.

use super::*;
use crate::pb::outcome;

pub(super) fn reply(r: Reply) -> Outcome {
    Outcome {
        reply: Some(outcome::Reply::Dispatcher(pb::dispatcher::Reply {
            reply: Some(r),
        })),
        ..Default::default()
    }
}

impl Outcome {
    pub(super) fn dispatcher_reply(&self) -> Option<&Reply> {
        match &self.reply {
            Some(outcome::Reply::Dispatcher(r)) => r.reply.as_ref(),
            _ => None,
        }
    }

    /// RegisterDataset: the dataset id.
    pub fn dataset_id(&self) -> Option<&str> {
        match self.dispatcher_reply()? {
            Reply::DatasetId(id) => Some(id),
            _ => None,
        }
    }

    /// GetOrCreateJob: the job id.
    pub fn job_id(&self) -> Option<i64> {
        match self.dispatcher_reply()? {
            Reply::JobId(id) => Some(*id),
            _ => None,
        }
    }

    /// GetOrCreateIteration: the client acquired.
    pub fn iteration_client(&self) -> Option<&AcquiredClient> {
        match self.dispatcher_reply()? {
            Reply::IterationClient(c) => Some(c),
            _ => None,
        }
    }

    /// WorkerHeartbeat: the worker's unfinished tasks.
    pub fn worker_tasks(&self) -> Option<&[i64]> {
        match self.dispatcher_reply()? {
            Reply::WorkerTasks(t) => Some(&t.ids),
            _ => None,
        }
    }

    /// ProduceSplit: the split handed out, or the end of the repetition.
    pub fn split(&self) -> Option<pb::dispatcher::Split> {
        match self.dispatcher_reply()? {
            Reply::Split(s) => Some(*s),
            _ => None,
        }
    }

    /// DisableCompression: `Some(decision)`, or `Some(None)` when the
    /// dataset is not compressed.
    pub fn compression_decision(&self) -> Option<Option<bool>> {
        match self.dispatcher_reply()? {
            Reply::CompressionDisabled(d) => Some(Some(*d)),
            Reply::NoCompressionToDisable(_) => Some(None),
            _ => None,
        }
    }
}
