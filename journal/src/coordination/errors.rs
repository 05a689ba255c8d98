//! Every domain error of the coordination area, with its code and message in
//! one place. Codes follow `docs/protocols.md` (measured against jaxlib 0.12;
//! see its Error table); message texts are the upstream coordination
//! service's (openxla/xla `coordination_service.cc`), so clients print what
//! they would print against the reference service. A task appears in
//! messages by its *label*: the bare task id
//! in a jaxlib-style cluster (one job, `jax_worker`), the TensorFlow name
//! `/job:NAME/replica:0/task:ID` otherwise.

pub use crate::errors::{bare, epoch_reset, with_payload};
use crate::pb::{Code, DomainError};

/// `id::counter`, the upstream spelling of a barrier instance.
pub fn barrier_name(id: &str, counter: i64) -> String {
    format!("{id}::{counter}")
}

/// The call that named a task outside the cluster; each has its own message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnknownTaskIn {
    /// RegisterTask.
    Register,
    /// Heartbeat.
    Heartbeat,
    /// PollForError.
    PollForError,
    /// ReportErrorToService.
    ReportError,
    /// ShutdownTask and ResetTask (upstream: DisconnectTask).
    Disconnect,
    /// Barrier and CancelBarrier (the calling task).
    Barrier,
    /// GetAliveTasks.
    AliveTasks,
    /// WaitForAllTasks.
    WaitForAllTasks,
    /// GetTaskState (TensorFlow 2.21).
    GetTaskState,
}

/// The error for a task `label` that is not in the cluster configuration.
pub fn unknown_task(call: UnknownTaskIn, label: &str) -> DomainError {
    let msg = match call {
        UnknownTaskIn::Register => format!("Unexpected task registered with task={label}"),
        UnknownTaskIn::Heartbeat => format!(
            "Unexpected heartbeat request from task: {label}. This usually implies a configuration error."
        ),
        UnknownTaskIn::PollForError => {
            format!("Unexpected task ({label}) that is not in the cluster polling for errors.")
        }
        UnknownTaskIn::ReportError => format!("Unexpected request from task {label}"),
        UnknownTaskIn::Disconnect => format!("Unexpected disconnect request with task={label}"),
        UnknownTaskIn::Barrier => {
            format!("Unexpected task ({label}) that is not in the cluster called the barrier.")
        }
        UnknownTaskIn::AliveTasks => {
            return bare(
                Code::InvalidArgument,
                format!("Unexpected task ({label}) that is not in the cluster in a GetAliveTasks request."),
            )
        }
        UnknownTaskIn::WaitForAllTasks => {
            format!("Unexpected task ({label}) that is not in the cluster waiting for all tasks.")
        }
        UnknownTaskIn::GetTaskState => {
            format!("Unexpected task ({label}) that is not in the cluster in a GetTaskState request.")
        }
    };
    with_payload(Code::InvalidArgument, msg)
}

// ---------------------------------------------------------------- tasks ----

pub(crate) fn newer_incarnation_connecting() -> DomainError {
    with_payload(
        Code::AlreadyExists,
        "Aborted connect attempt as there is a request from a newer incarnation.",
    )
}

pub(crate) fn different_incarnation(task: &str) -> DomainError {
    with_payload(
        Code::Aborted,
        format!("{task} unexpectedly tried to connect with a different incarnation. It has likely restarted."),
    )
}

pub(crate) fn register_while_in_error(task: &str, existing: &DomainError) -> DomainError {
    with_payload(
        Code::Aborted,
        format!("{task} unexpectedly tried to connect while it is already in error. ResetTask() should be called before a subsequent connect attempt. Existing error: {}", existing.display()),
    )
}

pub(crate) fn registration_failed(barrier_error: &DomainError) -> DomainError {
    with_payload(
        Code::Internal,
        format!(
            "Cluster registration failed with error: {}",
            barrier_error.display()
        ),
    )
}

pub(crate) fn heartbeat_task_in_error(task: &str, existing: &DomainError) -> DomainError {
    with_payload(
        Code::Aborted,
        format!(
            "Unexpected heartbeat request from an already-in-error task: {task} with existing error: {}",
            existing.display()
        ),
    )
}

pub(crate) fn heartbeat_not_registered(task: &str) -> DomainError {
    with_payload(
        Code::InvalidArgument,
        format!("Task with task={task} must be registered before sending heartbeat messages. The service might have restarted, please restart / reset and register again."),
    )
}

pub(crate) fn heartbeat_incarnation_mismatch(task: &str, expected: u64, got: u64) -> DomainError {
    with_payload(
        Code::Aborted,
        format!("{task} Heartbeat: Incarnation ID mismatch: expecting {expected} but got {got}. The task has restarted and likely crashed earlier - check for any earlier errors or any scheduler events (e.g. preemption, eviction) to debug further."),
    )
}

pub(crate) fn heartbeat_timeout(task: &str) -> DomainError {
    with_payload(
        Code::Unavailable,
        format!("Task {task} heartbeat timeout. This indicates that the remote task has failed, got preempted, or crashed unexpectedly. Check the task logs for an earlier error or scheduler events (e.g. preemption, eviction) to debug further."),
    )
}

/// At most this many task names are listed in combined errors.
pub(crate) const STRAGGLER_LOG_LIMIT: usize = 3;

pub(crate) fn unhealthy_tasks(tasks: &[String]) -> DomainError {
    let shown = &tasks[..tasks.len().min(STRAGGLER_LOG_LIMIT)];
    with_payload(
        Code::Unavailable,
        format!("The following tasks are unhealthy (stopped sending heartbeats):\n{}\nThe tasks have crashed. Check the task logs for an earlier error, or scheduler events (e.g. preemption, eviction) to debug further.", shown.join("\n")),
    )
}

pub(crate) fn unable_to_inform(err: &DomainError) -> DomainError {
    with_payload(
        Code::Internal,
        format!("All tasks were set to error because coordination service encountered an error, but was unable to inform clients. Error: {}", err.display()),
    )
}

pub(crate) fn report_not_connected() -> DomainError {
    with_payload(
        Code::FailedPrecondition,
        "The task is not connected or already has an error.",
    )
}

pub(crate) fn poll_not_registered(task: &str) -> DomainError {
    with_payload(
        Code::FailedPrecondition,
        format!(
            "Task ({task}) that has not been registered or has disconnected polling for errors."
        ),
    )
}

pub(crate) fn poll_task_in_error(task: &str, existing: &DomainError) -> DomainError {
    with_payload(
        Code::FailedPrecondition,
        format!(
            "Task ({task}) that is already in error state polling for errors. Current error: {}",
            existing.display()
        ),
    )
}

pub(crate) fn poll_cancelled(reason: &str) -> DomainError {
    with_payload(
        Code::Cancelled,
        format!("Cancelled error polling because: {reason}"),
    )
}

pub(crate) fn already_disconnected(task: &str) -> DomainError {
    with_payload(
        Code::FailedPrecondition,
        format!("The task is already disconnected: {task}"),
    )
}

pub(crate) fn shutdown_barrier_failed(barrier_error: &DomainError) -> DomainError {
    // Upstream opens the quote and never closes it.
    with_payload(
        Code::Internal,
        format!(
            "Shutdown barrier has failed.\nBarrier result: '{}",
            barrier_error.display()
        ),
    )
}

// -------------------------------------------------------------------- kv ----

pub(crate) fn key_exists(normalized_key: &str) -> DomainError {
    // The reference service answers ALREADY_EXISTS without any payload
    // (`docs/protocols.md`, Key-value store).
    bare(
        Code::AlreadyExists,
        format!("key {normalized_key} already exists."),
    )
}

/// NOT_FOUND of TryGetKeyValue; `key` as the caller sent it.
pub fn key_not_found(key: &str) -> DomainError {
    with_payload(Code::NotFound, format!("Config key {key} not found."))
}

pub(crate) fn not_an_integer(key: &str) -> DomainError {
    with_payload(
        Code::FailedPrecondition,
        format!("key {key} holds a value that is not a decimal 64-bit integer; it cannot be incremented."),
    )
}

pub(crate) fn increment_overflow(key: &str) -> DomainError {
    with_payload(
        Code::FailedPrecondition,
        format!("incrementing key {key} overflows a 64-bit integer."),
    )
}

pub(crate) fn too_many_keys(namespace: &str, limit: u64) -> DomainError {
    let message = format!("the key-value store already holds its limit of {limit} keys");
    let message = match namespace {
        "" => message,
        ns => format!("namespace {ns}: {message} (--max-keys)"),
    };
    with_payload(Code::ResourceExhausted, message)
}

pub(crate) fn too_many_bytes(namespace: &str, bytes: u64, limit: u64) -> DomainError {
    with_payload(
        Code::ResourceExhausted,
        format!(
            "namespace {namespace}: the key-value store would hold {bytes} bytes of keys and \
             values, over its limit of {limit} (--max-bytes)"
        ),
    )
}

// -------------------------------------------------------------- barriers ----

pub(crate) fn barrier_timed_out(
    id: &str,
    counter: i64,
    arrived: usize,
    total: usize,
    first_task: &str,
    pending: &[String],
) -> DomainError {
    let mut listed = String::new();
    for t in pending.iter().take(STRAGGLER_LOG_LIMIT - 1) {
        listed.push_str(t);
        listed.push('\n');
    }
    with_payload(
        Code::DeadlineExceeded,
        format!("Barrier timed out. Id: {}. This usually happens because a task triggered the barrier too early or too slowly. Please look at the task logs (both timed out and first task) to debug further.\n# of tasks that reached the barrier: {arrived}/{total}.\nThe first task at the barrier: {first_task}. Some timed out task names:\n{listed}", barrier_name(id, counter)),
    )
    .for_barrier(id, counter)
}

pub(crate) fn barrier_unknown_participant(id: &str, counter: i64, label: &str) -> DomainError {
    with_payload(
        Code::InvalidArgument,
        format!("Unexpected task ({label}) that is not in the cluster called the barrier. Barrier Id: {}", barrier_name(id, counter)),
    )
    .for_barrier(id, counter)
}

pub(crate) fn barrier_conflicting_tasks(id: &str, counter: i64) -> DomainError {
    with_payload(
        Code::InvalidArgument,
        format!("Conflicting tasks specified by different processes for the same barrier: {}. Check that the callers are invoking the barrier with the same arguments.", barrier_name(id, counter)),
    )
    .for_barrier(id, counter)
}

pub(crate) fn barrier_all_vs_subset(id: &str, counter: i64) -> DomainError {
    with_payload(
        Code::InvalidArgument,
        format!("{}: No tasks were specified by the client, which implies that the entire cluster is participating in the barrier. However, the service disagrees. Check that the callers are invoking the barrier with the same arguments.", barrier_name(id, counter)),
    )
    .for_barrier(id, counter)
}

pub(crate) fn barrier_non_participant(id: &str, counter: i64, task: &str) -> DomainError {
    with_payload(
        Code::InvalidArgument,
        format!(
            "A non-participating task ({task}) called the barrier: {}",
            barrier_name(id, counter)
        ),
    )
    .for_barrier(id, counter)
}

pub(crate) fn barrier_counter_mismatch(id: &str, requested: i64, current: i64) -> DomainError {
    let reason = if requested == 0 || current == 0 {
        "The service or task probably restarted, check the earlier logs to debug further. Usually, a restart on the stale tasks will resolve the issue."
    } else {
        "One task is probably way too quick / slow in its execution. For example, one task started a barrier early, which timed out, and started a second barrier before the late task even joined once."
    };
    with_payload(
        Code::Internal,
        format!(
            "Barrier ({}) is invoked by the task, but the service thinks it is the {current}-th instance. {reason}",
            barrier_name(id, requested)
        ),
    )
    .for_barrier(id, current)
}

pub(crate) fn barrier_participant_already_in_error(
    id: &str,
    counter: i64,
    task: &str,
    existing: &DomainError,
) -> DomainError {
    with_payload(
        Code::Internal,
        format!(
            "Task ({task}) is already in error before the barrier was called. Barrier Id: {} Task error: {}",
            barrier_name(id, counter),
            existing.display()
        ),
    )
    .for_barrier(id, counter)
}

/// Why a task left its ongoing barriers.
pub(crate) fn leave_reason_error(err: &DomainError) -> String {
    format!("task is set to ERROR: {}", err.display())
}

pub(crate) const LEAVE_REASON_DISCONNECTED: &str = "task disconnected";
pub(crate) const LEAVE_REASON_RECONNECTED: &str = "recoverable task silently connected again";

pub(crate) fn barrier_failed_because(
    id: &str,
    counter: i64,
    reason: &str,
    task: &str,
) -> DomainError {
    with_payload(
        Code::Internal,
        format!(
            "Barrier failed because: {reason}. Barrier Id: {}, Task: {task}",
            barrier_name(id, counter)
        ),
    )
    .for_barrier(id, counter)
}

pub(crate) fn barrier_stale_invocation(
    id: &str,
    counter: i64,
    reason: &str,
    task: &str,
) -> DomainError {
    // Two spaces after "because:", as upstream.
    with_payload(
        Code::Cancelled,
        format!(
            "Stale barrier invocation is cancelled because:  {reason}. Barrier: {} Task {task}",
            barrier_name(id, counter)
        ),
    )
    .for_barrier(id, counter)
}

pub(crate) fn barrier_duplicate_call(id: &str, counter: i64) -> DomainError {
    // Upstream answers the superseded call CANCELLED without payload.
    bare(
        Code::Cancelled,
        format!(
            "Cancelled because there's a more recent barrier call for {} from the same task.",
            barrier_name(id, counter)
        ),
    )
}

pub(crate) fn barrier_cancelled(id: &str, counter: i64, task: &str) -> DomainError {
    with_payload(
        Code::Cancelled,
        format!(
            "Barrier ({}) is cancelled by task: {task}",
            barrier_name(id, counter)
        ),
    )
    .for_barrier(id, counter)
}

pub(crate) fn cancel_not_current(id: &str, requested: i64, current: i64) -> DomainError {
    with_payload(
        Code::FailedPrecondition,
        format!("Barrier ({}) is cancelled by task, but the service thinks it is the {current}-th instance. This is likely due to a restart in the task or service.", barrier_name(id, requested)),
    )
    .for_barrier(id, current)
}

pub(crate) fn cancel_already_finished(id: &str, counter: i64, code: i32) -> DomainError {
    with_payload(
        Code::FailedPrecondition,
        format!(
            "Barrier ({}) has already been passed with status code: {code}",
            barrier_name(id, counter)
        ),
    )
    .for_barrier(id, counter)
}

pub(crate) fn barrier_instance_gone(id: &str, counter: i64) -> DomainError {
    with_payload(
        Code::Aborted,
        format!(
            "Barrier {} was replaced by a newer instance before this call read its result.",
            barrier_name(id, counter)
        ),
    )
    .for_barrier(id, counter)
}

// --------------------------------------------------------- alive tasks ----

pub(crate) fn alive_requester_not_in_set(task: &str) -> DomainError {
    bare(
        Code::InvalidArgument,
        format!(
            "Requesting task {task} is not one of the tasks specified in a GetAliveTasks request."
        ),
    )
}

pub(crate) fn alive_round_gone() -> DomainError {
    bare(
        Code::Aborted,
        "The GetAliveTasks round of this call finished long ago and its result is no longer kept.",
    )
}
