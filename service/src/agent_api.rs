//! coordstore's `Agent` service: what the Rust agent needs beyond the
//! tensorflow dialect — error polling and task status for named tasks, and
//! revisioned, resumable KV watches. Errors use the tensorflow dialect's
//! encoding.

use std::pin::Pin;

use journal::coordination::errors::{unknown_task, UnknownTaskIn as U};
use journal::{
    coordination::{normalize_key, TaskStatus},
    task_name,
};
use proto::coordstore::agent_server::{Agent, AgentServer};
use proto::coordstore::{
    AgentPollRequest, AgentPollResponse, PutKeyValueRequest, PutKeyValueResponse, TaskRef,
    TaskStatusRequest, TaskStatusResponse, WatchEvent, WatchRequest, WatchResponse,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use crate::coordination::{CallResult, Coordination};
use crate::dialect::tf::TfService;
use crate::dialect::{read, unary};

/// Most events sent in one watch message.
const WATCH_BATCH: usize = 1024;

/// The `Agent` service of one node.
pub struct AgentApi {
    coord: Coordination,
}

impl AgentApi {
    /// The tonic service.
    pub fn server(coord: Coordination, max_message_bytes: usize) -> AgentServer<AgentApi> {
        AgentServer::new(AgentApi { coord })
            .max_decoding_message_size(max_message_bytes)
            .max_encoding_message_size(max_message_bytes)
    }
}

/// Resolves a named task; `call` picks the unknown-task message.
fn task(c: &Coordination, t: &Option<TaskRef>, call: U) -> CallResult<u32> {
    let t = t.clone().unwrap_or_default();
    c.task_index(&t.job_name, t.task_id)
        .ok_or_else(|| unknown_task(call, &task_name(&t.job_name, t.task_id)).into())
}

/// Whether `key` (normalised) is what a watch of `target` covers.
fn covers(target: &str, is_dir: bool, key: &str) -> bool {
    key == target
        || (is_dir
            && (target.is_empty() || key.strip_prefix(target).is_some_and(|r| r.starts_with('/'))))
}

type WatchStream = Pin<Box<dyn tokio_stream::Stream<Item = Result<WatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Agent for AgentApi {
    async fn poll_for_error(
        &self,
        req: Request<AgentPollRequest>,
    ) -> Result<Response<AgentPollResponse>, Status> {
        unary::<TfService, _, _, _>(&self.coord, req, |c, r| async move {
            let t = task(&c, &r.task, U::PollForError)?;
            Err(c.poll_for_error(t).await)
        })
        .await
    }

    async fn put_key_value(
        &self,
        req: Request<PutKeyValueRequest>,
    ) -> Result<Response<PutKeyValueResponse>, Status> {
        unary::<TfService, _, _, _>(&self.coord, req, |c, r| async move {
            c.kv_insert(r.key, r.value, r.allow_overwrite).await?;
            Ok(PutKeyValueResponse {})
        })
        .await
    }

    async fn task_status(
        &self,
        req: Request<TaskStatusRequest>,
    ) -> Result<Response<TaskStatusResponse>, Status> {
        read::<TfService, _, _, _>(&self.coord, req, |c, r| async move {
            let t = task(&c, &r.task, U::Heartbeat)?;
            let entry = c.task_entries(&[t]).await?.remove(0);
            let e = entry.error.clone().unwrap_or_default();
            Ok(TaskStatusResponse {
                state: match entry.status() {
                    TaskStatus::Disconnected => "DISCONNECTED",
                    TaskStatus::Connected => "CONNECTED",
                    TaskStatus::Error => "ERROR",
                }
                .into(),
                incarnation: entry.incarnation,
                error_code: e.code,
                error_message: e.message,
            })
        })
        .await
    }

    type WatchStream = WatchStream;

    async fn watch(&self, req: Request<WatchRequest>) -> Result<Response<WatchStream>, Status> {
        self.coord.ready().await?;
        let r = req.into_inner();
        let target = normalize_key(&r.key);
        let is_dir = r.is_directory;
        // Start from a linearizable point: every change acknowledged before
        // the watch began is at or below this node's revision now.
        self.coord.router().linearizable().await?;
        let state = self.coord.router().node().state().clone();
        let mut last = if r.start_revision == 0 {
            state.read(|s| s.coordination().kv_revision())
        } else {
            r.start_revision
        };
        let (tx, rx) = mpsc::channel::<Result<WatchResponse, Status>>(16);
        let first = WatchResponse {
            events: Vec::new(),
            revision: last,
            compacted: false,
        };
        tokio::spawn(async move {
            let mut applied = state.subscribe();
            if tx.send(Ok(first)).await.is_err() {
                return;
            }
            loop {
                applied.borrow_and_update();
                // Collect what happened after `last` (bounded batches).
                let batch = state.read(|s| match s.coordination().kv_events_after(last) {
                    Err(c) => Err(c.revision),
                    Ok(events) => {
                        let mut out = Vec::new();
                        let mut upto = last;
                        for e in events {
                            if out.len() >= WATCH_BATCH && e.revision != upto {
                                break;
                            }
                            upto = e.revision;
                            if covers(&target, is_dir, &e.key) {
                                out.push(WatchEvent {
                                    revision: e.revision,
                                    key: e.key.clone(),
                                    value: e.value.clone(),
                                    deleted: e.deleted,
                                });
                            }
                        }
                        Ok((out, upto, upto < s.coordination().kv_revision()))
                    }
                });
                match batch {
                    Err(revision) => {
                        let _ = tx
                            .send(Ok(WatchResponse {
                                events: Vec::new(),
                                revision,
                                compacted: true,
                            }))
                            .await;
                        return;
                    }
                    Ok((events, upto, more)) => {
                        if !events.is_empty() {
                            let msg = WatchResponse {
                                events,
                                revision: upto,
                                compacted: false,
                            };
                            if tx.send(Ok(msg)).await.is_err() {
                                return;
                            }
                        }
                        last = upto;
                        if more {
                            continue;
                        }
                    }
                }
                tokio::select! {
                    changed = applied.changed() => {
                        if changed.is_err() {
                            return;
                        }
                    }
                    _ = tx.closed() => return,
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

#[cfg(test)]
mod tests {
    use super::covers;

    #[test]
    fn watch_coverage() {
        assert!(covers("a", false, "a"));
        assert!(!covers("a", false, "a/b"));
        assert!(covers("a", true, "a/b"));
        assert!(covers("a", true, "a"));
        assert!(!covers("a", true, "ab"));
        assert!(covers("", true, "anything"));
    }
}
