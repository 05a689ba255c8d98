//! Wire dialect adapters. Each translates its wire messages to the shared
//! [`Coordination`](crate::coord::Coordination) operations and domain errors
//! back to the exact wire error: status code, message, and the
//! `grpc-status-details-bin` trailer holding a serialized
//! `tensorflow.distributed_runtime.GrpcPayloadContainer` (reference §2.4).
//! Adapters hold no state.

pub mod tf;
pub mod xla;

use std::collections::HashMap;

use prost::Message;
use proto::payloads::GrpcPayloadContainer;
use tonic::{Code, Status};

use crate::coord::CallError;

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
