//! Errors every area shares: how a [`DomainError`] is built and printed,
//! and the errors of the shared part of the state (configuration, job
//! epochs, exactly-once sessions). Each area keeps its own errors in its own
//! module (`coordination::errors`).

use crate::pb::{BarrierRef, Code, DomainError};

/// Builds a [`DomainError`] with the CoordinationServiceError payload.
pub fn with_payload(code: Code, message: impl Into<String>) -> DomainError {
    DomainError {
        code: code as i32,
        message: message.into(),
        coordination_payload: true,
        ..Default::default()
    }
}

/// Builds a [`DomainError`] without any payload.
pub fn bare(code: Code, message: impl Into<String>) -> DomainError {
    DomainError {
        code: code as i32,
        message: message.into(),
        ..Default::default()
    }
}

impl DomainError {
    /// The status code as the enum.
    pub fn status(&self) -> Code {
        Code::try_from(self.code).unwrap_or(Code::Unknown)
    }

    /// Attaches the source task of the CoordinationServiceError payload.
    pub(crate) fn with_source_task(mut self, task: u32) -> Self {
        self.coordination_payload = true;
        self.source_task = Some(task);
        self
    }

    /// Attaches the BarrierError payload (and the CoordinationServiceError one).
    pub(crate) fn for_barrier(mut self, id: &str, counter: i64) -> Self {
        self.coordination_payload = true;
        self.barrier = Some(BarrierRef {
            id: id.to_string(),
            counter,
        });
        self
    }

    /// `CODE: message`, the way absl prints a status (`Status::ToString`,
    /// without the payload suffix).
    pub fn display(&self) -> String {
        format!("{}: {}", code_name(self.status()), self.message)
    }
}

/// The absl/gRPC spelling of a code (`DEADLINE_EXCEEDED`).
pub fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

/// INTERNAL "wrong service incarnation" with the ServiceMismatchError payload
/// (checked by the wire adapter on every call but RegisterTask).
pub fn wrong_service_incarnation(requested: u64, current: u64) -> DomainError {
    let mut e = with_payload(
        Code::Internal,
        format!("wrong service incarnation: requested {requested}, currently {current}"),
    );
    e.service_mismatch = Some(current);
    e
}

pub(crate) fn bad_config(why: String) -> DomainError {
    bare(
        Code::InvalidArgument,
        format!("invalid cluster configuration: {why}"),
    )
}

pub(crate) fn config_mismatch() -> DomainError {
    bare(
        Code::FailedPrecondition,
        "the service is already configured with a different cluster configuration; reset the job epoch to change it",
    )
}

/// Answer to a parked call whose job epoch was reset underneath it.
pub fn epoch_reset() -> DomainError {
    with_payload(
        Code::Aborted,
        "The coordination job epoch was reset; this call belonged to the previous job.",
    )
}

/// A command whose task names were resolved in job epoch `named_in` while
/// the job is now in `current`: not applied.
pub fn stale_epoch(named_in: u64, current: u64) -> DomainError {
    with_payload(
        Code::Aborted,
        format!(
            "This call named its tasks in job epoch {named_in}, but the job epoch is now {current} (the job was reset); the call was not applied."
        ),
    )
}

/// Answer to a late copy of a request its client had declared done
/// (answered or given up): it is not applied.
pub fn late_copy(client_id: u64, seq: u64) -> DomainError {
    bare(
        Code::Aborted,
        format!(
            "Request {client_id}:{seq} was already answered or given up by its sender; this late copy is not applied."
        ),
    )
}
