//! Every domain error of the closure-queue area.

use crate::errors::bare;
use crate::pb::{Code, DomainError};

/// A queue that does not exist.
pub fn queue_not_found(name: &str) -> DomainError {
    bare(
        Code::NotFound,
        format!("closure queue {name:?} does not exist (create it first)"),
    )
}

pub(crate) fn bad_queue_name(name: &str, max: usize) -> DomainError {
    bare(
        Code::InvalidArgument,
        format!(
            "closure queue name {name:?} must be 1 to {max} bytes of letters, digits and -_./:"
        ),
    )
}

pub(crate) fn config_conflict(name: &str, what: &str) -> DomainError {
    bare(
        Code::FailedPrecondition,
        format!("closure queue {name:?} exists with another {what}"),
    )
}

pub(crate) fn payload_too_large(bytes: usize, limit: u64) -> DomainError {
    bare(
        Code::InvalidArgument,
        format!("the closure has {bytes} bytes, more than the queue's limit of {limit}"),
    )
}

pub(crate) fn too_many_closures(name: &str, limit: u64) -> DomainError {
    bare(
        Code::ResourceExhausted,
        format!(
            "closure queue {name:?} keeps {limit} closures, its limit: release the outcomes already fetched"
        ),
    )
}

pub(crate) fn no_worker() -> DomainError {
    bare(Code::InvalidArgument, "a worker must name itself")
}

/// What a closure whose result is over the limit fails with.
pub(crate) fn result_too_large(bytes: usize, limit: u64) -> (Code, String) {
    (
        Code::ResourceExhausted,
        format!("the closure's result has {bytes} bytes, more than the queue's limit of {limit}"),
    )
}

/// A closure that does not exist in the queue (or was released).
pub fn closure_not_found(queue: &str, id: u64) -> DomainError {
    bare(
        Code::NotFound,
        format!("closure {id} of queue {queue:?} does not exist (or was released)"),
    )
}
