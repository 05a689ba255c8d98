//! coordstore's `Agent` service: what the Rust agent needs beyond the
//! tensorflow dialect — error polling and task status for named tasks, and
//! revisioned, resumable KV watches. Errors use the tensorflow dialect's
//! encoding.

use std::pin::Pin;

use journal::coordination::errors::UnknownTaskIn as U;
use journal::pb::coordination as cmd;
use proto::coordstore::agent_server::{Agent, AgentServer};
use proto::coordstore::*;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;
use tonic::{Request, Response, Status};

use super::{dialect, tf, Area};
use crate::areas::coordination::WatchBatch;
use crate::core::{Call, CallError, CallResult};

type WatchStream = Pin<Box<dyn tokio_stream::Stream<Item = Result<WatchResponse, Status>> + Send>>;

dialect! {
    /// The `Agent` service of one node.
    AgentApi: Agent in AgentServer, errors = tf::errors;
    poll_for_error(AgentPollRequest) -> AgentPollResponse;
    put_key_value(PutKeyValueRequest) -> PutKeyValueResponse;
    task_status(TaskStatusRequest) -> TaskStatusResponse;
    {
        type WatchStream = WatchStream;

        async fn watch(&self, req: Request<WatchRequest>) -> Result<Response<WatchStream>, Status> {
            let a = &self.area;
            let errors = |c: &Call, d: &journal::DomainError| tf::errors(a, c, d);
            let configured = super::door(crate::core::Access::Configured);
            super::serve(a.core(), req, configured, errors, |c, r| async move {
                let watch = a.watch(&c, &r.key, r.is_directory, r.start_revision).await;
                let stream: WatchStream = match watch {
                    Ok(rx) => Box::pin(ReceiverStream::new(rx).map(watch_response)),
                    Err(e) => return (c, Err(e)),
                };
                (c, Ok(stream))
            })
            .await
        }
    }
}

/// A watch's message as the Agent API has it (a failure as its plain
/// status: the watch ends).
fn watch_response(b: CallResult<WatchBatch>) -> Result<WatchResponse, Status> {
    let b = b.map_err(CallError::into_plain_status)?;
    let events = b
        .events
        .into_iter()
        .map(|e| WatchEvent {
            revision: e.revision,
            key: e.key,
            value: e.value,
            deleted: e.deleted,
        })
        .collect();
    Ok(WatchResponse {
        events,
        revision: b.revision,
        compacted: b.compacted,
    })
}

async fn poll_for_error(a: &Area, c: &Call, r: AgentPollRequest) -> CallResult<AgentPollResponse> {
    let task = task(a, c, &r.task, U::PollForError)?;
    Err(a.poll_for_error(c, task).await)
}

async fn put_key_value(
    a: &Area,
    c: &Call,
    r: PutKeyValueRequest,
) -> CallResult<PutKeyValueResponse> {
    a.apply(
        c,
        cmd::KvInsert {
            key: r.key,
            value: r.value,
            allow_overwrite: r.allow_overwrite,
        },
    )
    .await?;
    Ok(PutKeyValueResponse {})
}

async fn task_status(a: &Area, c: &Call, r: TaskStatusRequest) -> CallResult<TaskStatusResponse> {
    let task = task(a, c, &r.task, U::Heartbeat)?;
    let entry = a.task_entries(c, &[task]).await?.remove(0);
    let (state, e) = (
        // The journal's names are the dialect's.
        entry.status().as_str_name().into(),
        entry.error.clone().unwrap_or_default(),
    );
    Ok(TaskStatusResponse {
        state,
        incarnation: entry.incarnation,
        error_code: e.code,
        error_message: e.message,
    })
}

/// Resolves a named task; `call` picks the unknown-task message.
fn task(a: &Area, c: &Call, t: &Option<TaskRef>, call: U) -> CallResult<u32> {
    let t = t.clone().unwrap_or_default();
    a.task(c, &t.job_name, t.task_id, call)
}
