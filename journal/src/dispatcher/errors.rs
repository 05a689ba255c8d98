//! Every domain error of the dispatcher area. Codes and texts follow TF 2.21's
//! dispatcher (`dispatcher_impl.cc`, `dispatcher_state.cc`), which stock
//! clients and workers react to: NOT_FOUND and FAILED_PRECONDITION end a
//! client's input pipeline, so they are used only where upstream uses them.

use crate::errors::bare;
use crate::pb::{Code, DomainError};

pub(crate) fn dataset_not_found(id: &str) -> DomainError {
    bare(Code::NotFound, format!("Dataset id {id} not found"))
}

pub(crate) fn dataset_mismatch(id: &str) -> DomainError {
    bare(
        Code::InvalidArgument,
        format!(
            "Datasets with the same ID should have the same structure; dataset {id} was registered with different metadata"
        ),
    )
}

pub(crate) fn dataset_too_large(bytes: usize, limit: usize) -> DomainError {
    bare(
        Code::InvalidArgument,
        format!("The dataset definition has {bytes} bytes, more than the limit of {limit}"),
    )
}

pub(crate) fn job_not_found(id: i64) -> DomainError {
    bare(Code::NotFound, format!("Job with id {id} not found"))
}

pub(crate) fn job_mismatch(name: &str, what: &str) -> DomainError {
    bare(
        Code::InvalidArgument,
        format!(
            "Tried to create job with name {name}, but found an existing job with different parameters: {what}"
        ),
    )
}

pub(crate) fn dynamic_without_source() -> DomainError {
    bare(
        Code::Unimplemented,
        "DYNAMIC sharding needs a source coordstore can split (range, from_tensor_slices, from_tensors with constant inputs)",
    )
}

pub(crate) fn iteration_not_found(id: i64) -> DomainError {
    bare(Code::NotFound, format!("Iteration id {id} not found"))
}

pub(crate) fn not_dynamic(id: i64) -> DomainError {
    bare(
        Code::FailedPrecondition,
        format!("Iteration {id} does not use DYNAMIC sharding: it has no splits"),
    )
}

pub(crate) fn bad_split_provider(index: i64) -> DomainError {
    bare(
        Code::InvalidArgument,
        format!("Split provider index {index} is out of range: the iteration has 1"),
    )
}

pub(crate) fn client_not_found(id: i64) -> DomainError {
    bare(
        Code::NotFound,
        format!("Iteration client id not found: {id}"),
    )
}

/// ClientHeartbeat of an unknown client (upstream's text, which blames a
/// dispatcher restart; here ids survive every restart and failover).
pub fn unknown_client(id: i64) -> DomainError {
    bare(Code::NotFound, format!("Unknown iteration client id {id}."))
}

/// ClientHeartbeat of a client whose iteration was garbage collected.
pub fn iteration_garbage_collected(iteration: i64) -> DomainError {
    bare(
        Code::FailedPrecondition,
        format!(
            "The requested iteration {iteration} has been garbage collected due to inactivity. Consider configuring the dispatcher with a higher `iteration_gc_timeout_ms`."
        ),
    )
}
