//! One test per row of the error-code table (`docs/protocols.md`, Error
//! table), named after the RPC and the code.

use crate::common::*;
use journal::{
    coordination::{shutdown_barrier_id, TaskStatus, REGISTER_BARRIER},
    errors, Code,
};

// ------------------------------------------------------------ RegisterTask --

#[test]
fn register_task_ok() {
    let mut s = new_state(1, &Opts::default());
    let out = apply(&mut s, register(0, 1), 1);
    ok(&out);
    assert_eq!(out.registered(), Some(SVC_INC));
}

#[test]
fn register_task_invalid_argument_unknown_task() {
    let mut s = new_state(1, &Opts::default());
    let e = err(&apply(&mut s, register(1, 1), 1), Code::InvalidArgument);
    assert!(e.coordination_payload);
}

#[test]
fn register_task_already_exists_superseded() {
    let mut s = new_state(2, &Opts::default());
    parked(&apply(&mut s, register(0, 1), 1));
    parked(&apply(&mut s, register(0, 2), 2));
    let e = registration_result(&s, 0, 1).unwrap().unwrap_err();
    code_is(&e, Code::AlreadyExists);
    assert!(e.coordination_payload);
}

#[test]
fn register_task_aborted_different_incarnation() {
    let mut s = cluster(2, Opts::default());
    let e = err(&apply(&mut s, register(0, 99), 2000), Code::Aborted);
    assert_eq!(e.source_task, Some(0));
    assert!(e.coordination_payload);
}

#[test]
fn register_task_aborted_in_error() {
    let mut s = cluster(2, Opts::default());
    ok(&apply(&mut s, report(0, Code::Internal, "x"), 2000));
    let e = err(&apply(&mut s, register(0, tinc(0)), 2100), Code::Aborted);
    assert_eq!(e.source_task, Some(0));
    assert!(e.coordination_payload);
}

#[test]
fn register_task_deadline_exceeded_registration_barrier_timeout() {
    let o = Opts {
        register_timeout_ms: 500,
        ..Default::default()
    };
    let mut s = new_state(2, &o);
    parked(&apply(&mut s, register(0, 10), 100));
    ok(&apply(&mut s, expire(REGISTER_BARRIER, 0), 600));
    // The waiting RegisterTask gets the barrier's DEADLINE_EXCEEDED
    // (+BarrierError{[Init]Wait_for_all_tasks_to_register, 0}) even though the
    // failure also set every task to ERROR (`docs/protocols.md`, Registration
    // and incarnations / Error table).
    let e = registration_result(&s, 0, 10)
        .expect("answered")
        .unwrap_err();
    code_is(&e, Code::DeadlineExceeded);
    contains(
        &e,
        "Barrier timed out. Id: [Init]Wait_for_all_tasks_to_register::0.",
    );
    let b = e.barrier.expect("BarrierError payload");
    assert_eq!((b.id.as_str(), b.counter), (REGISTER_BARRIER, 0));
}

// --------------------------------------------------------------- Heartbeat --

#[test]
fn heartbeat_ok() {
    let mut s = cluster(1, Opts::default());
    ok(&apply(&mut s, heartbeat(0, tinc(0)), 2000));
}

#[test]
fn heartbeat_aborted_incarnation_mismatch() {
    let mut s = cluster(2, Opts::default());
    let e = err(&apply(&mut s, heartbeat(0, 3), 2000), Code::Aborted);
    assert!(e.coordination_payload);
    assert_eq!(s.coordination().task_status(0), Some(TaskStatus::Error));
}

#[test]
fn heartbeat_aborted_task_in_error() {
    let mut s = cluster(2, Opts::default());
    ok(&apply(&mut s, report(0, Code::Internal, "x"), 2000));
    err(&apply(&mut s, heartbeat(0, tinc(0)), 2100), Code::Aborted);
}

#[test]
fn heartbeat_invalid_argument_unknown_task() {
    let mut s = cluster(2, Opts::default());
    err(&apply(&mut s, heartbeat(2, 1), 2000), Code::InvalidArgument);
}

#[test]
fn heartbeat_invalid_argument_not_registered() {
    let mut s = new_state(2, &Opts::default());
    err(&apply(&mut s, heartbeat(0, 1), 2000), Code::InvalidArgument);
}

// ------------------------------------------------------------ PollForError --

#[test]
fn poll_for_error_unavailable_heartbeat_timeout() {
    let mut s = cluster(2, Opts::default());
    let p = parked(&apply(&mut s, poll(0), 1500));
    ok(&apply(&mut s, unhealthy(&[1]), 20_000));
    code_is(&poll_result(&s, 0, p).unwrap(), Code::Unavailable);
}

#[test]
fn poll_for_error_aborted_incarnation() {
    let mut s = cluster(2, Opts::default());
    let p = parked(&apply(&mut s, poll(0), 1500));
    err(&apply(&mut s, heartbeat(1, 5), 2000), Code::Aborted);
    code_is(&poll_result(&s, 0, p).unwrap(), Code::Aborted);
}

#[test]
fn poll_for_error_internal_shutdown_barrier_failure() {
    let mut s = cluster(2, Opts::default());
    let p = parked(&apply(&mut s, poll(1), 1500));
    parked(&apply(&mut s, shutdown(0), 2000));
    ok(&apply(
        &mut s,
        expire(&shutdown_barrier_id(SVC_INC), 0),
        7000,
    ));
    let e = poll_result(&s, 1, p).unwrap();
    code_is(&e, Code::Internal);
    contains(&e, "Shutdown barrier has failed.");
}

#[test]
fn poll_for_error_reported_code() {
    let mut s = cluster(2, Opts::default());
    let p = parked(&apply(&mut s, poll(0), 1500));
    ok(&apply(
        &mut s,
        report(1, Code::ResourceExhausted, "oom"),
        2000,
    ));
    let e = poll_result(&s, 0, p).unwrap();
    code_is(&e, Code::ResourceExhausted);
    assert!(e.is_reported_error);
    assert_eq!(e.source_task, Some(1));
}

#[test]
fn poll_for_error_cancelled_disconnect_and_repoll() {
    let mut s = cluster(2, Opts::no_shutdown_barrier());
    let a = parked(&apply(&mut s, poll(0), 1500));
    let b = parked(&apply(&mut s, poll(0), 1600));
    code_is(&poll_result(&s, 0, a).unwrap(), Code::Cancelled);
    ok(&apply(&mut s, shutdown(0), 2000));
    code_is(&poll_result(&s, 0, b).unwrap(), Code::Cancelled);
}

#[test]
fn poll_for_error_failed_precondition_not_registered_or_in_error() {
    let mut s = new_state(2, &Opts::default());
    err(&apply(&mut s, poll(0), 1), Code::FailedPrecondition);
    let mut s = cluster(2, Opts::default());
    parked(&apply(&mut s, poll(0), 1500));
    ok(&apply(&mut s, report(1, Code::Internal, "x"), 2000));
    err(&apply(&mut s, poll(1), 2100), Code::FailedPrecondition);
}

#[test]
fn poll_for_error_invalid_argument_unknown_task() {
    let mut s = cluster(1, Opts::default());
    err(&apply(&mut s, poll(1), 2000), Code::InvalidArgument);
}

// ---------------------------------------------------- ReportErrorToService --

#[test]
fn report_error_to_service_ok() {
    let mut s = cluster(2, Opts::default());
    ok(&apply(&mut s, report(0, Code::Internal, "x"), 2000));
    assert_eq!(s.coordination().task_status(0), Some(TaskStatus::Error));
}

#[test]
fn report_error_to_service_failed_precondition_not_connected() {
    let mut s = new_state(2, &Opts::default());
    err(
        &apply(&mut s, report(0, Code::Internal, "x"), 1),
        Code::FailedPrecondition,
    );
}

#[test]
fn report_error_to_service_invalid_argument_unknown_task() {
    let mut s = cluster(2, Opts::default());
    err(
        &apply(&mut s, report(2, Code::Internal, "x"), 2000),
        Code::InvalidArgument,
    );
}

// ------------------------------------------------------------ ShutdownTask --

#[test]
fn shutdown_task_ok() {
    let mut s = cluster(1, Opts::default());
    ok(&apply(&mut s, shutdown(0), 2000));
    assert_eq!(
        s.coordination().task_status(0),
        Some(TaskStatus::Disconnected)
    );
}

#[test]
fn shutdown_task_internal_barrier_failed() {
    let mut s = cluster(2, Opts::default());
    let c = parked(&apply(&mut s, shutdown(0), 2000));
    ok(&apply(
        &mut s,
        expire(&shutdown_barrier_id(SVC_INC), 0),
        7000,
    ));
    code_is(
        &shutdown_result(&s, c).unwrap().unwrap_err(),
        Code::Internal,
    );
}

#[test]
fn shutdown_task_failed_precondition_wrapped_in_internal_with_barrier() {
    let mut s = cluster(1, Opts::default());
    ok(&apply(&mut s, shutdown(0), 2000));
    let e = err(&apply(&mut s, shutdown(0), 2100), Code::Internal);
    contains(&e, "FAILED_PRECONDITION: The task is already disconnected");
}

#[test]
fn shutdown_task_failed_precondition_without_barrier() {
    let mut s = cluster(1, Opts::no_shutdown_barrier());
    ok(&apply(&mut s, shutdown(0), 2000));
    err(&apply(&mut s, shutdown(0), 2100), Code::FailedPrecondition);
}

#[test]
fn shutdown_task_invalid_argument_unknown_task() {
    let mut s = cluster(1, Opts::default());
    err(&apply(&mut s, shutdown(1), 2000), Code::InvalidArgument);
}

// ---------------------------------------------------------------------- KV --

#[test]
fn insert_key_value_ok_and_already_exists_without_payload() {
    let mut s = cluster(1, Opts::default());
    ok(&apply(&mut s, insert("k", "v", false), 2000));
    let e = err(
        &apply(&mut s, insert("k", "v", false), 2000),
        Code::AlreadyExists,
    );
    assert!(!e.coordination_payload);
}

#[test]
fn get_key_value_ok() {
    let mut s = cluster(1, Opts::default());
    assert!(
        s.coordination().kv_get("k").is_none(),
        "a GetKeyValue would park"
    );
    ok(&apply(&mut s, insert("/k/", "v", false), 2000));
    assert_eq!(s.coordination().kv_get("k").unwrap().as_ref(), b"v");
}

#[test]
fn try_get_key_value_not_found() {
    let e = journal::coordination::errors::key_not_found("k");
    code_is(&e, Code::NotFound);
    assert!(e.coordination_payload);
}

#[test]
fn increment_key_value_ok_and_failed_precondition() {
    let mut s = cluster(1, Opts::default());
    assert_eq!(apply(&mut s, incr("n", 3), 2000).incremented(), Some(3));
    ok(&apply(&mut s, insert("s", "x", false), 2000));
    let e = err(&apply(&mut s, incr("s", 3), 2000), Code::FailedPrecondition);
    assert!(e.coordination_payload);
}

#[test]
fn get_key_value_dir_and_delete_key_value_ok() {
    let mut s = cluster(1, Opts::default());
    ok(&apply(&mut s, insert("d/a", "1", false), 2000));
    assert_eq!(s.coordination().kv_dir("d").len(), 1);
    ok(&apply(&mut s, delete("d"), 2000));
    ok(&apply(&mut s, delete("d"), 2000));
    assert!(s.coordination().kv_dir("d").is_empty());
}

// ----------------------------------------------------------------- Barrier --

#[test]
fn barrier_ok() {
    let mut s = cluster(1, Opts::default());
    let out = apply(&mut s, arrive("b", 0, 1000, &[], 0), 2000);
    ok(&out);
    assert_eq!(out.barrier_counter(), Some(0));
}

#[test]
fn barrier_deadline_exceeded_timeout() {
    let mut s = cluster(2, Opts::default());
    let c = parked(&apply(&mut s, arrive("b", 0, 1000, &[], 0), 2000));
    ok(&apply(&mut s, expire("b", 0), 3000));
    let e = barrier_result(&s, "b", 0, c).unwrap().unwrap_err();
    code_is(&e, Code::DeadlineExceeded);
    assert!(e.barrier.is_some());
}

#[test]
fn barrier_invalid_argument_task_set() {
    let mut s = cluster(2, Opts::default());
    parked(&apply(&mut s, arrive("b", 0, 1000, &[0, 1], 0), 2000));
    let e = err(
        &apply(&mut s, arrive("b", 0, 1000, &[1], 1), 2000),
        Code::InvalidArgument,
    );
    assert!(e.barrier.is_some());
}

#[test]
fn barrier_internal_counter_mismatch_and_participant_error() {
    let mut s = cluster(2, Opts::default());
    let e = err(
        &apply(&mut s, arrive("b", 1, 1000, &[], 0), 2000),
        Code::Internal,
    );
    assert!(e.barrier.is_some());
    parked(&apply(&mut s, poll(0), 1500));
    let c = parked(&apply(&mut s, arrive("c", 0, 1000, &[], 0), 2000));
    ok(&apply(&mut s, report(1, Code::Internal, "x"), 2100));
    let e = barrier_result(&s, "c", 0, c).unwrap().unwrap_err();
    code_is(&e, Code::Internal);
    assert!(e.barrier.is_some());
}

#[test]
fn barrier_cancelled_via_cancel_barrier_with_payload() {
    let mut s = cluster(2, Opts::default());
    let c = parked(&apply(&mut s, arrive("b", 0, 1000, &[], 0), 2000));
    ok(&apply(&mut s, cancel("b", 0, 0), 2100));
    let e = barrier_result(&s, "b", 0, c).unwrap().unwrap_err();
    code_is(&e, Code::Cancelled);
    assert!(e.barrier.is_some() && e.coordination_payload);
}

#[test]
fn barrier_cancelled_superseded_duplicate_without_payload() {
    let mut s = cluster(2, Opts::default());
    let c = parked(&apply(&mut s, arrive("b", 0, 1000, &[], 0), 2000));
    parked(&apply(&mut s, arrive("b", 0, 1000, &[], 0), 2000));
    let e = barrier_result(&s, "b", 0, c).unwrap().unwrap_err();
    code_is(&e, Code::Cancelled);
    assert!(e.barrier.is_none() && !e.coordination_payload);
}

// ----------------------------------------------------------- CancelBarrier --

#[test]
fn cancel_barrier_ok() {
    let mut s = cluster(2, Opts::default());
    parked(&apply(&mut s, arrive("b", 0, 1000, &[], 0), 2000));
    ok(&apply(&mut s, cancel("b", 0, 1), 2000));
}

#[test]
fn cancel_barrier_failed_precondition_wrong_counter_or_finished() {
    let mut s = cluster(1, Opts::default());
    ok(&apply(&mut s, arrive("b", 0, 1000, &[], 0), 2000));
    let e = err(
        &apply(&mut s, cancel("b", 0, 0), 2000),
        Code::FailedPrecondition,
    );
    assert!(e.barrier.is_some());
    let e = err(
        &apply(&mut s, cancel("b", 4, 0), 2000),
        Code::FailedPrecondition,
    );
    assert!(e.barrier.is_some());
}

// ---------------------------------------------------- GetAliveTasks / Watch --

#[test]
fn get_alive_tasks_ok() {
    let mut s = cluster(1, Opts::default());
    let out = apply(&mut s, alive(0, &[0]), 2000);
    assert!(!out.is_err());
    let r = alive_result(&s, &[0], out.alive_generation().unwrap())
        .unwrap()
        .unwrap();
    assert_eq!(r.tasks, vec![0]);
}

#[test]
fn get_alive_tasks_invalid_argument_requester_not_in_set() {
    let mut s = cluster(2, Opts::default());
    let e = err(&apply(&mut s, alive(0, &[1]), 2000), Code::InvalidArgument);
    assert!(!e.coordination_payload);
}

#[test]
fn watch_tasks_ok() {
    let s = cluster(1, Opts::default());
    assert!(watch_tasks_ready(&s, -1));
}

// ------------------------------------------------------ every RPC but one --

#[test]
fn any_rpc_internal_wrong_service_incarnation() {
    let e = errors::wrong_service_incarnation(1, SVC_INC);
    code_is(&e, Code::Internal);
    assert_eq!(
        e.message,
        format!("wrong service incarnation: requested 1, currently {SVC_INC}")
    );
    assert_eq!(e.service_mismatch, Some(SVC_INC));
    assert!(e.coordination_payload);
}
