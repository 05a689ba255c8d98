//! Wire dialect adapters. Each translates its wire messages to the shared
//! [`Coordination`](crate::coordination::Coordination) operations and domain errors
//! back to the exact wire error: status code, message, and the
//! `grpc-status-details-bin` trailer holding a serialized
//! `tensorflow.distributed_runtime.GrpcPayloadContainer` (reference §2.4).
//! Adapters hold no state.

pub mod tf;
pub mod tfdata;
pub mod xla;

use std::collections::HashMap;
use std::future::Future;

use journal::DomainError;
use prost::Message;
use proto::payloads::GrpcPayloadContainer;
use tonic::{Code, Request, Response, Status};

use crate::coordination::{CallError, CallResult, Coordination};

/// A status with the payload container trailer (or none when `payloads` is
/// empty).
pub(crate) fn status_with_payloads(
    code: i32,
    message: &str,
    payloads: HashMap<String, Vec<u8>>,
) -> Status {
    let code = Code::from_i32(code);
    if payloads.is_empty() {
        return Status::new(code, message.to_string());
    }
    let container = GrpcPayloadContainer { payloads };
    Status::with_details(code, message.to_string(), container.encode_to_vec().into())
}

/// A dialect's wire encoding of domain errors.
pub(crate) trait WireErrors {
    /// The wire error of `e` (code, message, payload trailer).
    fn domain_status(coord: &Coordination, e: &DomainError) -> Status;
}

/// Runs one unary call that may change state, the shape every such handler
/// shares: binds the request's exactly-once origin (a malformed one is
/// INVALID_ARGUMENT before anything happens), waits until the service is
/// configured, runs `body` with the bound operations and the message, and
/// maps a failure to the dialect's wire error. A handler cannot bind the
/// origin wrongly: only `body`'s operations carry it.
pub(crate) async fn unary<E, Req, Resp, Fut>(
    coord: &Coordination,
    req: Request<Req>,
    body: impl FnOnce(Coordination, Req) -> Fut,
) -> Result<Response<Resp>, Status>
where
    E: WireErrors,
    Fut: Future<Output = CallResult<Resp>>,
{
    let call = coord.for_request(&req)?;
    coord.ready().await?;
    reply::<E, _>(coord, body(call, req.into_inner()).await)
}

/// [`unary`] for a call that only reads: no origin is bound.
pub(crate) async fn read<E, Req, Resp, Fut>(
    coord: &Coordination,
    req: Request<Req>,
    body: impl FnOnce(Coordination, Req) -> Fut,
) -> Result<Response<Resp>, Status>
where
    E: WireErrors,
    Fut: Future<Output = CallResult<Resp>>,
{
    coord.ready().await?;
    reply::<E, _>(coord, body(coord.clone(), req.into_inner()).await)
}

/// A call's answer on the wire: the reply, or the dialect's error.
fn reply<E: WireErrors, Resp>(
    coord: &Coordination,
    answer: CallResult<Resp>,
) -> Result<Response<Resp>, Status> {
    answer
        .map(Response::new)
        .map_err(|e| to_status(e, |d| E::domain_status(coord, d)))
}

/// Maps a call error with the dialect's domain-error encoder.
pub(crate) fn to_status(
    e: CallError,
    domain: impl FnOnce(&journal::DomainError) -> Status,
) -> Status {
    match e {
        CallError::Domain(d) => domain(&d),
        CallError::Status(s) => s,
    }
}
