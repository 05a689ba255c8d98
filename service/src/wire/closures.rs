//! `coordstore.v1.ClosureQueue`, the durable closure queue on the node
//! port. The API's command messages keep the journal's field numbers (a
//! CreateQueueRequest is a `CreateQueue`, a FinishClosureRequest a
//! `Finish`, ...), so a request becomes its journal command by re-reading
//! its encoding ([`command`]); the tests below hold the two in step.

use journal::closures::{Closure, ClosureState};
use journal::pb::closures::{self as cmd, reply::Reply as R};
use prost::Message;
use proto::coordstore::closure_queue_server::{ClosureQueue, ClosureQueueServer};
use proto::coordstore::*;
use tonic::{Request, Response, Status};

use crate::areas::closures::Closures;
use crate::core::call::plain;
use crate::core::{Call, CallResult};

/// The closure-queue service of one node.
pub struct ClosureApi {
    area: Closures,
}

impl ClosureApi {
    /// The tonic service.
    pub fn server(area: Closures, max_message_bytes: usize) -> ClosureQueueServer<Self> {
        ClosureQueueServer::new(ClosureApi { area })
            .max_decoding_message_size(max_message_bytes)
            .max_encoding_message_size(max_message_bytes)
    }
}

/// The journal message with the same field numbers as `m`.
fn command<T: Message + Default>(m: &impl Message) -> CallResult<T> {
    T::decode(m.encode_to_vec().as_slice())
        .map_err(|e| Status::internal(format!("a request did not read as its command: {e}")).into())
}

/// Writes the service: one row per method, each served by the module's
/// handler of the same name, `async fn m(a: &Closures, c: &Call, r: Req) ->
/// CallResult<Resp>`.
macro_rules! queue {
    ($($method:ident($req:ty) -> $resp:ty;)*) => {
        #[tonic::async_trait]
        impl ClosureQueue for ClosureApi {
            $(
                async fn $method(&self, req: Request<$req>) -> Result<Response<$resp>, Status> {
                    let a = &self.area;
                    let in_namespace = super::door(crate::core::Access::Namespace);
                    let errors = |_: &Call, d: &journal::DomainError| plain(d);
                    super::serve(a.core(), req, in_namespace, errors, |c, r| async move {
                        let answer = $method(a, &c, r).await;
                        (c, answer)
                    })
                    .await
                }
            )*
        }
    };
}

queue! {
    create_queue(CreateQueueRequest) -> CreateQueueResponse;
    put(PutClosureRequest) -> PutClosureResponse;
    get(GetClosureRequest) -> GetClosureResponse;
    renew(RenewLeaseRequest) -> RenewLeaseResponse;
    finish(FinishClosureRequest) -> SettleClosureResponse;
    fail(FailClosureRequest) -> SettleClosureResponse;
    put_back(PutBackClosureRequest) -> SettleClosureResponse;
    join(JoinQueueRequest) -> JoinQueueResponse;
    done(DoneQueueRequest) -> DoneQueueResponse;
    fetch(FetchClosureRequest) -> FetchClosureResponse;
    fetch_many(FetchClosuresRequest) -> FetchClosuresResponse;
    list(ListClosuresRequest) -> ListClosuresResponse;
    release(ReleaseClosuresRequest) -> ReleaseClosuresResponse;
}

type Answer<T> = CallResult<T>;

async fn create_queue(
    a: &Closures,
    c: &Call,
    r: CreateQueueRequest,
) -> Answer<CreateQueueResponse> {
    let config = a.create_queue(c, command(&r)?).await?;
    Ok(CreateQueueResponse {
        config: Some(command(&config)?),
    })
}

async fn put(a: &Closures, c: &Call, r: PutClosureRequest) -> Answer<PutClosureResponse> {
    let put = cmd::Put {
        queue: r.queue,
        payload: r.payload,
        tag: r.tag,
        more_payloads: r.more_payloads,
    };
    let reply = a.put(c, put).await?;
    let closure_id = match reply.reply {
        Some(R::ClosureId(id)) => id,
        _ => 0,
    };
    Ok(PutClosureResponse {
        closure_id,
        raised: raised(reply.raised)?,
    })
}

async fn get(a: &Closures, c: &Call, r: GetClosureRequest) -> Answer<GetClosureResponse> {
    let leased = a
        .get(c, r.queue, r.worker, r.timeout_ms, r.max_closures)
        .await?;
    let mut closures = leased.closures.into_iter();
    let Some(first) = closures.next() else {
        return Ok(GetClosureResponse::default());
    };
    let more = closures.map(|m| command(&m)).collect::<Answer<_>>()?;
    let (closure_id, payload, attempt, tag) =
        (first.closure_id, first.payload, first.attempt, first.tag);
    Ok(GetClosureResponse {
        found: true,
        closure_id,
        payload,
        attempt,
        tag,
        lease_ms: leased.lease_ms,
        more,
    })
}

async fn renew(a: &Closures, c: &Call, r: RenewLeaseRequest) -> Answer<RenewLeaseResponse> {
    let reply = a.step(c, command::<cmd::Renew>(&r)?).await?;
    Ok(RenewLeaseResponse {
        renewed: match reply.reply {
            Some(R::Renewed(n)) => n,
            _ => 0,
        },
    })
}

async fn finish(a: &Closures, c: &Call, r: FinishClosureRequest) -> Answer<SettleClosureResponse> {
    settled(a.step(c, command::<cmd::Finish>(&r)?).await?)
}

async fn fail(a: &Closures, c: &Call, r: FailClosureRequest) -> Answer<SettleClosureResponse> {
    settled(a.step(c, command::<cmd::Fail>(&r)?).await?)
}

async fn put_back(
    a: &Closures,
    c: &Call,
    r: PutBackClosureRequest,
) -> Answer<SettleClosureResponse> {
    settled(a.step(c, command::<cmd::PutBack>(&r)?).await?)
}

async fn join(a: &Closures, c: &Call, r: JoinQueueRequest) -> Answer<JoinQueueResponse> {
    let reply = a.join(c, r.queue, r.timeout_ms).await?;
    let idle = matches!(reply.reply, Some(R::Idle(true)));
    Ok(JoinQueueResponse {
        idle,
        raised: raised(reply.raised)?,
    })
}

async fn done(a: &Closures, c: &Call, r: DoneQueueRequest) -> Answer<DoneQueueResponse> {
    let reply = a.step(c, command::<cmd::Done>(&r)?).await?;
    let idle = matches!(reply.reply, Some(R::Idle(true)));
    Ok(DoneQueueResponse {
        idle,
        raised: raised(reply.raised)?,
    })
}

async fn fetch(a: &Closures, c: &Call, r: FetchClosureRequest) -> Answer<FetchClosureResponse> {
    let mut all = a
        .fetch(c, r.queue, vec![r.closure_id], r.timeout_ms)
        .await?;
    fetched(&all.pop().unwrap_or_default())
}

async fn fetch_many(
    a: &Closures,
    c: &Call,
    r: FetchClosuresRequest,
) -> Answer<FetchClosuresResponse> {
    let all = a.fetch(c, r.queue, r.closure_ids, r.timeout_ms).await?;
    Ok(FetchClosuresResponse {
        closures: all.iter().map(fetched).collect::<Answer<_>>()?,
    })
}

async fn list(a: &Closures, c: &Call, r: ListClosuresRequest) -> Answer<ListClosuresResponse> {
    let all = a
        .list(c, &r.queue, &r.tag, r.after_id, r.limit as usize)
        .await?;
    Ok(ListClosuresResponse {
        closures: all.iter().map(info).collect(),
    })
}

async fn release(
    a: &Closures,
    c: &Call,
    r: ReleaseClosuresRequest,
) -> Answer<ReleaseClosuresResponse> {
    let reply = a.step(c, command::<cmd::Release>(&r)?).await?;
    Ok(ReleaseClosuresResponse {
        released: match reply.reply {
            Some(R::Released(n)) => n,
            _ => 0,
        },
    })
}

// ------------------------------------------------------------ replies ----

fn raised(e: Option<cmd::ClosureError>) -> Answer<Option<ClosureError>> {
    e.map(|e| command(&e)).transpose()
}

fn settled(reply: cmd::Reply) -> Answer<SettleClosureResponse> {
    let accepted = matches!(reply.reply, Some(R::Accepted(true)));
    Ok(SettleClosureResponse {
        accepted,
        more_accepted: reply.more_accepted,
    })
}

fn status(s: ClosureState) -> ClosureStatus {
    match s {
        ClosureState::Finished => ClosureStatus::ClosureFinished,
        ClosureState::Failed => ClosureStatus::ClosureFailed,
        ClosureState::Cancelled => ClosureStatus::ClosureCancelled,
        _ => ClosureStatus::ClosurePending,
    }
}

/// A closure's outcome as fetch answers it (PENDING while not settled).
fn fetched(c: &Closure) -> Answer<FetchClosureResponse> {
    let (attempts, tag, status) = (c.attempts, c.tag.clone(), status(c.state()) as i32);
    if !c.is_settled() {
        return Ok(FetchClosureResponse {
            status,
            attempts,
            tag,
            ..Default::default()
        });
    }
    let error = c.error.as_ref().map(command).transpose()?;
    Ok(FetchClosureResponse {
        status,
        result: c.result.clone(),
        error,
        attempts,
        tag,
    })
}

fn info(c: &Closure) -> ClosureInfo {
    let status = status(c.state()) as i32;
    ClosureInfo {
        closure_id: c.id,
        tag: c.tag.clone(),
        status,
        attempts: c.attempts,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    /// Each request and its journal command (and back) lose nothing: their
    /// field numbers and types agree.
    fn same<W: Message + Default + PartialEq + std::fmt::Debug, J: Message + Default>(w: W) {
        let j: J = command(&w).unwrap();
        assert_eq!(j.encoded_len(), w.encoded_len());
        let back: W = command(&j).unwrap();
        assert_eq!(back, w);
    }

    #[test]
    fn requests_and_their_commands_agree_field_by_field() {
        let b = |s: &str| Bytes::from(s.to_string());
        let error = ClosureError {
            code: 3,
            message: "m".into(),
            payload: b("p"),
            closure_id: 7,
        };
        let config = QueueConfig {
            max_queued: 1,
            max_closures: 2,
            max_payload_bytes: 3,
            max_result_bytes: 4,
            lease_ms: 5,
        };
        same::<_, cmd::QueueConfig>(config);
        same::<_, cmd::ClosureError>(error.clone());
        same::<_, cmd::CreateQueue>(CreateQueueRequest {
            queue: "q".into(),
            config: Some(config),
        });
        same::<_, cmd::Renew>(RenewLeaseRequest {
            queue: "q".into(),
            worker: "w".into(),
        });
        let more = vec![ClosureResult {
            closure_id: 8,
            result: b("r2"),
        }];
        let finish = FinishClosureRequest {
            queue: "q".into(),
            closure_id: 7,
            worker: "w".into(),
            result: b("r"),
            more,
        };
        same::<_, cmd::Finish>(finish);
        let fail = FailClosureRequest {
            queue: "q".into(),
            closure_id: 7,
            worker: "w".into(),
            error: Some(error),
        };
        same::<_, cmd::Fail>(fail);
        same::<_, cmd::PutBack>(PutBackClosureRequest {
            queue: "q".into(),
            closure_id: 7,
            worker: "w".into(),
        });
        same::<_, cmd::Done>(DoneQueueRequest { queue: "q".into() });
        same::<_, cmd::Release>(ReleaseClosuresRequest {
            queue: "q".into(),
            closure_ids: vec![1, 2],
        });
        let leased = LeasedClosure {
            closure_id: 1,
            payload: b("p"),
            attempt: 2,
            tag: "t".into(),
        };
        let j: cmd::Assigned = command(&leased).unwrap();
        assert_eq!(command::<LeasedClosure>(&j).unwrap(), leased);
    }
}
