//! `coordstore.v1.ClosureQueue`: the durable closure queue (journal area
//! `closures`) on the node port. Every call proposes one update through the
//! router (a follower forwards the proposal to the leader), with the origin
//! the caller sent in its header, so a retried call is exactly-once. Calls
//! that wait (a put into a full queue, a get with nothing queued, a join, a
//! fetch) wait on this node's applied state, so they ride through leader
//! changes. A join proposes one `Done` step and then waits until the queue
//! is idle or has an error; the caller steps again (with its own origin),
//! so the error is raised by a call the caller proposed.

use std::sync::Arc;
use std::time::Duration;

use journal::closures::ClosureState;
use journal::pb::closures::{self as cmd, reply::Reply as R};
use journal::pb::{outcome, Origin};
use journal::{DomainError, State, Update};
use proto::coordstore::closure_queue_server::{ClosureQueue, ClosureQueueServer};
use proto::coordstore::*;
use raft::Applied;
use tokio::time::Instant;
use tonic::{Request, Response, Status};

use crate::coordination::request_origin;
use crate::leader::now_ms;
use crate::router::Router;
use crate::wake::WaitKind;

/// Longest a get, join or fetch waits in one call.
pub const MAX_WAIT: Duration = Duration::from_secs(60);
/// Most closures one List answers.
pub const MAX_LIST: usize = 10_000;

/// The closure-queue service of one node.
pub struct ClosureApi {
    router: Arc<Router>,
}

impl ClosureApi {
    /// The tonic service.
    pub fn server(router: Arc<Router>, max_message_bytes: usize) -> ClosureQueueServer<Self> {
        ClosureQueueServer::new(ClosureApi { router })
            .max_decoding_message_size(max_message_bytes)
            .max_encoding_message_size(max_message_bytes)
    }

    fn read<T>(&self, f: impl FnOnce(&State) -> T) -> T {
        self.router.node().state().read(f)
    }

    /// Proposes `command` with the caller's origin; a domain error is the
    /// call's status.
    async fn propose(
        &self,
        origin: Option<Origin>,
        command: impl Into<Update>,
    ) -> Result<Applied, Status> {
        let mut u = command.into();
        u.origin = origin;
        let applied = self.router.propose(u, true).await?;
        if let Some(e) = &applied.outcome.error {
            return Err(status(e));
        }
        Ok(applied)
    }

    /// Proposes the command `make` builds from the request, with the origin
    /// its header carries.
    async fn step<Req, C: Into<Update>>(
        &self,
        req: Request<Req>,
        make: impl FnOnce(Req) -> C,
    ) -> Result<Applied, Status> {
        let origin = request_origin(&req)?;
        self.propose(origin, make(req.into_inner())).await
    }

    /// Waits on the local state from `index` on until `check` answers, or
    /// `wait` passes (`None`: no limit).
    async fn wait<T>(
        &self,
        kind: WaitKind,
        index: u64,
        wait: Option<Duration>,
        check: impl FnMut(&State) -> Option<T>,
    ) -> Result<Option<T>, Status> {
        let deadline = wait.map(|w| Instant::now() + w);
        self.router
            .waits()
            .wait_until(kind, index, deadline, check)
            .await
    }

    /// A linearizable point on this node: its applied index after a read
    /// barrier.
    async fn linearizable(&self) -> Result<u64, Status> {
        self.router.linearizable().await?;
        Ok(self.router.waits().applied_index())
    }

    /// The outcomes of `ids` once every one is settled or `timeout_ms`
    /// passed (0: at once), from a linearizable point on.
    async fn fetch_many(
        &self,
        queue: String,
        ids: Vec<u64>,
        timeout_ms: u64,
    ) -> Result<Vec<FetchClosureResponse>, Status> {
        let index = self.linearizable().await?;
        // Settled outcomes never change: a cursor over the ids settled so
        // far keeps each wake-up's check short.
        let mut done = 0;
        let mut all_settled = |s: &State| -> Option<Result<(), DomainError>> {
            while let Some(&id) = ids.get(done) {
                match settled(s, &queue, id) {
                    Err(e) => return Some(Err(e)),
                    Ok(None) => return None,
                    Ok(Some(_)) => done += 1,
                }
            }
            Some(Ok(()))
        };
        let ready = match self.read(&mut all_settled) {
            Some(r) => Some(r),
            None if timeout_ms == 0 => None,
            None => {
                self.wait(
                    WaitKind::ClosureFetch,
                    index,
                    Some(capped(timeout_ms)),
                    &mut all_settled,
                )
                .await?
            }
        };
        if let Some(Err(e)) = ready {
            return Err(status(&e));
        }
        self.read(|s| {
            ids.iter()
                .map(|&id| match settled(s, &queue, id) {
                    Ok(Some(r)) => Ok(r),
                    Ok(None) => Ok(pending(s, id)),
                    Err(e) => Err(status(&e)),
                })
                .collect()
        })
    }

    fn queue_config(&self, queue: &str) -> Result<cmd::QueueConfig, Status> {
        self.read(|s| s.closures().queue(queue).and_then(|q| q.config))
            .ok_or_else(|| status(&journal::closures::errors::queue_not_found(queue)))
    }
}

/// The wire status of a closure-queue domain error.
pub fn status(e: &DomainError) -> Status {
    Status::new(tonic::Code::from_i32(e.code), e.message.clone())
}

fn capped(ms: u64) -> Duration {
    Duration::from_millis(ms).min(MAX_WAIT)
}

fn reply(a: &Applied) -> cmd::Reply {
    match &a.outcome.reply {
        Some(outcome::Reply::Closures(r)) => r.clone(),
        _ => cmd::Reply::default(),
    }
}

fn wire_error(e: cmd::ClosureError) -> ClosureError {
    ClosureError {
        code: e.code,
        message: e.message,
        payload: e.payload,
        closure_id: e.closure_id,
    }
}

fn journal_error(e: ClosureError) -> cmd::ClosureError {
    cmd::ClosureError {
        code: e.code,
        message: e.message,
        payload: e.payload,
        closure_id: e.closure_id,
    }
}

fn wire_config(c: cmd::QueueConfig) -> QueueConfig {
    QueueConfig {
        max_queued: c.max_queued,
        max_closures: c.max_closures,
        max_payload_bytes: c.max_payload_bytes,
        max_result_bytes: c.max_result_bytes,
        lease_ms: c.lease_ms,
    }
}

fn wire_status(s: ClosureState) -> ClosureStatus {
    match s {
        ClosureState::Finished => ClosureStatus::ClosureFinished,
        ClosureState::Failed => ClosureStatus::ClosureFailed,
        ClosureState::Cancelled => ClosureStatus::ClosureCancelled,
        _ => ClosureStatus::ClosurePending,
    }
}

fn accepted(a: &Applied) -> Response<SettleClosureResponse> {
    let r = reply(a);
    Response::new(SettleClosureResponse {
        accepted: matches!(r.reply, Some(R::Accepted(true))),
        more_accepted: r.more_accepted,
    })
}

/// A closure's outcome for fetch: `None` while it is not settled.
fn settled(s: &State, queue: &str, id: u64) -> Result<Option<FetchClosureResponse>, DomainError> {
    let reader = s.closures();
    if reader.queue(queue).is_none() {
        return Err(journal::closures::errors::queue_not_found(queue));
    }
    let Some(c) = reader.closure(id).filter(|c| c.queue == queue) else {
        return Err(journal::closures::errors::closure_not_found(queue, id));
    };
    Ok(c.is_settled().then(|| FetchClosureResponse {
        status: wire_status(c.state()) as i32,
        result: c.result.clone(),
        error: c.error.clone().map(wire_error),
        attempts: c.attempts,
        tag: c.tag.clone(),
    }))
}

/// What fetch answers for a closure that is not settled (yet).
fn pending(s: &State, id: u64) -> FetchClosureResponse {
    let c = s.closures().closure(id);
    FetchClosureResponse {
        status: ClosureStatus::ClosurePending as i32,
        attempts: c.map_or(0, |c| c.attempts),
        tag: c.map(|c| c.tag.clone()).unwrap_or_default(),
        ..Default::default()
    }
}

#[tonic::async_trait]
impl ClosureQueue for ClosureApi {
    async fn create_queue(
        &self,
        req: Request<CreateQueueRequest>,
    ) -> Result<Response<CreateQueueResponse>, Status> {
        let origin = request_origin(&req)?;
        let r = req.into_inner();
        let config = r.config.map(|c| cmd::QueueConfig {
            max_queued: c.max_queued,
            max_closures: c.max_closures,
            max_payload_bytes: c.max_payload_bytes,
            max_result_bytes: c.max_result_bytes,
            lease_ms: c.lease_ms,
        });
        let applied = self
            .propose(
                origin,
                cmd::CreateQueue {
                    queue: r.queue.clone(),
                    config,
                },
            )
            .await?;
        self.router.waits().wait_applied(applied.log_index).await?;
        Ok(Response::new(CreateQueueResponse {
            config: Some(wire_config(self.queue_config(&r.queue)?)),
        }))
    }

    async fn put(
        &self,
        req: Request<PutClosureRequest>,
    ) -> Result<Response<PutClosureResponse>, Status> {
        let origin = request_origin(&req)?;
        let r = req.into_inner();
        let n = 1 + r.more_payloads.len() as u64;
        let applied = self
            .propose(
                origin,
                cmd::Put {
                    queue: r.queue,
                    payload: r.payload,
                    tag: r.tag,
                    more_payloads: r.more_payloads,
                },
            )
            .await?;
        let rep = reply(&applied);
        let Some(R::ClosureId(id)) = rep.reply else {
            return Err(Status::internal("a put answered no closure id"));
        };
        if applied.outcome.parked {
            // The queue is full: wait, as upstream's put does, until every
            // closure is admitted (or cancelled by the first error). They
            // are admitted in order: the last one decides.
            let last = id + n - 1;
            self.wait(WaitKind::ClosurePut, applied.log_index, None, |s| {
                let c = s.closures().closure(last);
                c.is_none_or(|c| c.state() != ClosureState::Pending)
                    .then_some(())
            })
            .await?;
        }
        Ok(Response::new(PutClosureResponse {
            closure_id: id,
            raised: rep.raised.map(wire_error),
        }))
    }

    async fn get(
        &self,
        req: Request<GetClosureRequest>,
    ) -> Result<Response<GetClosureResponse>, Status> {
        let origin = request_origin(&req)?;
        let r = req.into_inner();
        let wait = capped(r.timeout_ms);
        let lease_ms = self.queue_config(&r.queue).map_or(0, |c| c.lease_ms);
        let applied = self
            .propose(
                origin,
                cmd::Get {
                    queue: r.queue.clone(),
                    worker: r.worker,
                    deadline_ms: now_ms() + wait.as_millis() as u64,
                    max_closures: r.max_closures,
                },
            )
            .await?;
        let found = |a: cmd::Assigned| GetClosureResponse {
            found: true,
            closure_id: a.closure_id,
            payload: a.payload,
            attempt: a.attempt,
            tag: a.tag,
            lease_ms,
            more: Vec::new(),
        };
        let rep = reply(&applied);
        if let Some(R::Assigned(a)) = rep.reply {
            let mut resp = found(a);
            resp.more = rep
                .more_assigned
                .into_iter()
                .map(|a| LeasedClosure {
                    closure_id: a.closure_id,
                    payload: a.payload,
                    attempt: a.attempt,
                    tag: a.tag,
                })
                .collect();
            return Ok(Response::new(resp));
        }
        let call_id = applied.outcome.call_id;
        let queue = r.queue;
        let answer = self
            .wait(WaitKind::ClosureGet, applied.log_index, Some(wait), |s| {
                let w = journal::Wait::ClosureGet {
                    queue: queue.clone(),
                    call: call_id,
                };
                match crate::wake::answer(s, w)? {
                    Ok(journal::Answer::Assigned(a)) => Some(a),
                    _ => Some(None),
                }
            })
            .await?
            .flatten();
        // A closure handed to this call after it gave up goes back to the
        // queue when its lease ends.
        Ok(Response::new(answer.map(found).unwrap_or_default()))
    }

    async fn renew(
        &self,
        req: Request<RenewLeaseRequest>,
    ) -> Result<Response<RenewLeaseResponse>, Status> {
        let applied = self
            .step(req, |r| cmd::Renew {
                queue: r.queue,
                worker: r.worker,
            })
            .await?;
        let renewed = match reply(&applied).reply {
            Some(R::Renewed(n)) => n,
            _ => 0,
        };
        Ok(Response::new(RenewLeaseResponse { renewed }))
    }

    async fn finish(
        &self,
        req: Request<FinishClosureRequest>,
    ) -> Result<Response<SettleClosureResponse>, Status> {
        let applied = self
            .step(req, |r| cmd::Finish {
                queue: r.queue,
                closure_id: r.closure_id,
                worker: r.worker,
                result: r.result,
                more: r
                    .more
                    .into_iter()
                    .map(|m| cmd::Result {
                        closure_id: m.closure_id,
                        result: m.result,
                    })
                    .collect(),
            })
            .await?;
        Ok(accepted(&applied))
    }

    async fn fail(
        &self,
        req: Request<FailClosureRequest>,
    ) -> Result<Response<SettleClosureResponse>, Status> {
        let applied = self
            .step(req, |r| cmd::Fail {
                queue: r.queue,
                closure_id: r.closure_id,
                worker: r.worker,
                error: r.error.map(journal_error),
            })
            .await?;
        Ok(accepted(&applied))
    }

    async fn put_back(
        &self,
        req: Request<PutBackClosureRequest>,
    ) -> Result<Response<SettleClosureResponse>, Status> {
        let applied = self
            .step(req, |r| cmd::PutBack {
                queue: r.queue,
                closure_id: r.closure_id,
                worker: r.worker,
            })
            .await?;
        Ok(accepted(&applied))
    }

    async fn join(
        &self,
        req: Request<JoinQueueRequest>,
    ) -> Result<Response<JoinQueueResponse>, Status> {
        let origin = request_origin(&req)?;
        let r = req.into_inner();
        let applied = self
            .propose(
                origin,
                cmd::Done {
                    queue: r.queue.clone(),
                },
            )
            .await?;
        let rep = reply(&applied);
        let idle = matches!(rep.reply, Some(R::Idle(true)));
        if rep.raised.is_some() || idle {
            return Ok(Response::new(JoinQueueResponse {
                idle,
                raised: rep.raised.map(wire_error),
            }));
        }
        // Busy: wait until a step would answer; the caller steps again.
        let queue = r.queue;
        self.wait(
            WaitKind::ClosureFetch,
            applied.log_index,
            Some(capped(r.timeout_ms)),
            |s| {
                crate::wake::answer(
                    s,
                    journal::Wait::JoinReady {
                        queue: queue.clone(),
                    },
                )
                .map(|_| ())
            },
        )
        .await?;
        Ok(Response::new(JoinQueueResponse {
            idle: false,
            raised: None,
        }))
    }

    async fn done(
        &self,
        req: Request<DoneQueueRequest>,
    ) -> Result<Response<DoneQueueResponse>, Status> {
        let applied = self.step(req, |r| cmd::Done { queue: r.queue }).await?;
        let rep = reply(&applied);
        Ok(Response::new(DoneQueueResponse {
            idle: matches!(rep.reply, Some(R::Idle(true))),
            raised: rep.raised.map(wire_error),
        }))
    }

    async fn fetch(
        &self,
        req: Request<FetchClosureRequest>,
    ) -> Result<Response<FetchClosureResponse>, Status> {
        let r = req.into_inner();
        let mut all = self
            .fetch_many(r.queue, vec![r.closure_id], r.timeout_ms)
            .await?;
        Ok(Response::new(all.pop().unwrap_or_default()))
    }

    async fn fetch_many(
        &self,
        req: Request<FetchClosuresRequest>,
    ) -> Result<Response<FetchClosuresResponse>, Status> {
        let r = req.into_inner();
        if r.closure_ids.len() > MAX_LIST {
            return Err(Status::invalid_argument(format!(
                "{} closure ids in one fetch; at most {MAX_LIST}",
                r.closure_ids.len()
            )));
        }
        let closures = self
            .fetch_many(r.queue, r.closure_ids, r.timeout_ms)
            .await?;
        Ok(Response::new(FetchClosuresResponse { closures }))
    }

    async fn list(
        &self,
        req: Request<ListClosuresRequest>,
    ) -> Result<Response<ListClosuresResponse>, Status> {
        let r = req.into_inner();
        self.linearizable().await?;
        let limit = match r.limit as usize {
            0 => MAX_LIST,
            n => n.min(MAX_LIST),
        };
        let closures = self.read(|s| {
            let reader = s.closures();
            reader.queue(&r.queue).map(|_| {
                reader
                    .list(&r.queue, &r.tag, r.after_id, limit)
                    .into_iter()
                    .map(|c| ClosureInfo {
                        closure_id: c.id,
                        tag: c.tag.clone(),
                        status: wire_status(c.state()) as i32,
                        attempts: c.attempts,
                    })
                    .collect()
            })
        });
        match closures {
            Some(closures) => Ok(Response::new(ListClosuresResponse { closures })),
            None => Err(status(&journal::closures::errors::queue_not_found(
                &r.queue,
            ))),
        }
    }

    async fn release(
        &self,
        req: Request<ReleaseClosuresRequest>,
    ) -> Result<Response<ReleaseClosuresResponse>, Status> {
        let applied = self
            .step(req, |r| cmd::Release {
                queue: r.queue,
                closure_ids: r.closure_ids,
            })
            .await?;
        let released = match reply(&applied).reply {
            Some(R::Released(n)) => n,
            _ => 0,
        };
        Ok(Response::new(ReleaseClosuresResponse { released }))
    }
}
