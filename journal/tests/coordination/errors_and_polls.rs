//! Error reporting, propagation and PollForError (`docs/protocols.md`, Error
//! propagation).

use crate::common::*;
use journal::pb::coordination::BarrierStatus;
use journal::{coordination::TaskStatus, Code};

#[test]
fn reported_error_is_delivered_to_pending_pollers_with_payload() {
    let mut s = cluster(3, Opts::default());
    let p0 = parked(&apply(&mut s, poll(0), 1500));
    let p1 = parked(&apply(&mut s, poll(1), 1500));
    assert_eq!(poll_result(&s, 0, p0), None);
    ok(&apply(
        &mut s,
        report(2, Code::Internal, "boom from 2"),
        2000,
    ));
    for (t, p) in [(0, p0), (1, p1)] {
        let e = poll_result(&s, t, p).expect("answered");
        code_is(&e, Code::Internal);
        assert_eq!(e.message, "boom from 2");
        assert!(e.coordination_payload);
        assert!(e.is_reported_error);
        assert_eq!(e.source_task, Some(2));
    }
    assert_eq!(s.coordination().task_status(2), Some(TaskStatus::Error));
    let te = s.coordination().task(2).unwrap().error.clone().unwrap();
    assert!(te.is_reported_error);
    // Other tasks are not set to ERROR when someone polls.
    assert_eq!(s.coordination().task_status(0), Some(TaskStatus::Connected));
    assert_eq!(s.coordination().task_status(1), Some(TaskStatus::Connected));
}

#[test]
fn later_poll_gets_remembered_error_immediately() {
    let mut s = cluster(3, Opts::default());
    parked(&apply(&mut s, poll(0), 1500));
    ok(&apply(&mut s, report(2, Code::DataLoss, "lost"), 2000));
    let e = err(&apply(&mut s, poll(1), 3000), Code::DataLoss);
    assert_eq!(e.message, "lost");
    assert_eq!(e.source_task, Some(2));
}

#[test]
fn error_is_propagated_only_once() {
    let mut s = cluster(3, Opts::default());
    let p0 = parked(&apply(&mut s, poll(0), 1500));
    ok(&apply(&mut s, report(1, Code::Internal, "first"), 2000));
    ok(&apply(&mut s, report(2, Code::Aborted, "second"), 2100));
    assert_eq!(poll_result(&s, 0, p0).unwrap().message, "first");
    assert_eq!(
        s.coordination().propagated_error().unwrap().message,
        "first"
    );
}

#[test]
fn nobody_ever_polled_sets_all_tasks_to_error() {
    let mut s = cluster(3, Opts::default());
    ok(&apply(&mut s, report(1, Code::Internal, "boom"), 2000));
    assert_eq!(statuses(&s), vec![TaskStatus::Error; 3]);
    for t in [0, 2] {
        let te = s.coordination().task(t).unwrap().error.clone().unwrap();
        code_is(&te, Code::Internal);
        contains(&te, "All tasks were set to error because coordination service encountered an error, but was unable to inform clients. Error: INTERNAL: boom");
        assert!(te.coordination_payload);
    }
    // The source keeps its own first error.
    assert_eq!(
        s.coordination()
            .task(1)
            .unwrap()
            .error
            .as_ref()
            .unwrap()
            .message,
        "boom"
    );
    assert!(s.coordination().propagated_error().is_none());
    // A late poller is told it is in error.
    let e = err(&apply(&mut s, poll(0), 3000), Code::FailedPrecondition);
    contains(&e, "already in error state polling for errors");
}

#[test]
fn report_error_requires_connected_task() {
    let mut s = new_state(2, &Opts::default());
    let e = err(
        &apply(&mut s, report(0, Code::Internal, "x"), 1),
        Code::FailedPrecondition,
    );
    contains(&e, "The task is not connected or already has an error.");
    assert_eq!(
        s.coordination().task_status(0),
        Some(TaskStatus::Disconnected)
    );
    let e = err(
        &apply(&mut s, report(4, Code::Internal, "x"), 1),
        Code::InvalidArgument,
    );
    contains(&e, "Unexpected request from task 4");
}

#[test]
fn report_error_twice_is_failed_precondition() {
    let mut s = cluster(2, Opts::default());
    parked(&apply(&mut s, poll(0), 1500));
    ok(&apply(&mut s, report(1, Code::Internal, "x"), 2000));
    err(
        &apply(&mut s, report(1, Code::Internal, "y"), 2100),
        Code::FailedPrecondition,
    );
    assert_eq!(
        s.coordination()
            .task(1)
            .unwrap()
            .error
            .as_ref()
            .unwrap()
            .message,
        "x"
    );
}

#[test]
fn second_poll_of_same_task_cancels_the_first() {
    let mut s = cluster(2, Opts::default());
    let a = parked(&apply(&mut s, poll(0), 1500));
    let b = parked(&apply(&mut s, poll(0), 1600));
    assert_ne!(a, b);
    let e = poll_result(&s, 0, a).unwrap();
    code_is(&e, Code::Cancelled);
    assert_eq!(
        e.message,
        "Cancelled error polling because: new request from the same task"
    );
    assert_eq!(poll_result(&s, 0, b), None);
}

#[test]
fn poll_of_unregistered_task_is_failed_precondition() {
    let mut s = new_state(2, &Opts::default());
    let e = err(&apply(&mut s, poll(1), 1), Code::FailedPrecondition);
    contains(
        &e,
        "Task (1) that has not been registered or has disconnected polling for errors.",
    );
}

#[test]
fn poll_of_unknown_task_is_invalid_argument() {
    let mut s = cluster(2, Opts::default());
    let e = err(&apply(&mut s, poll(2), 1), Code::InvalidArgument);
    contains(
        &e,
        "Unexpected task (2) that is not in the cluster polling for errors.",
    );
}

#[test]
fn poll_is_cancelled_when_task_disconnects() {
    let mut s = cluster(2, Opts::no_shutdown_barrier());
    let p = parked(&apply(&mut s, poll(1), 1500));
    ok(&apply(&mut s, shutdown(1), 2000));
    let e = poll_result(&s, 1, p).unwrap();
    code_is(&e, Code::Cancelled);
    assert_eq!(
        e.message,
        "Cancelled error polling because: task has disconnected."
    );
}

#[test]
fn recoverable_service_does_not_propagate_errors() {
    let mut s = cluster(3, Opts::recoverable());
    let p0 = parked(&apply(&mut s, poll(0), 1500));
    ok(&apply(&mut s, report(1, Code::Internal, "boom"), 2000));
    assert_eq!(poll_result(&s, 0, p0), None);
    assert!(s.coordination().propagated_error().is_none());
    assert_eq!(s.coordination().task_status(1), Some(TaskStatus::Error));
    assert_eq!(s.coordination().task_status(0), Some(TaskStatus::Connected));
    assert_eq!(s.coordination().task_status(2), Some(TaskStatus::Connected));
}

#[test]
fn recoverable_service_with_nobody_polling_keeps_other_tasks_alive() {
    let mut s = cluster(3, Opts::recoverable());
    ok(&apply(&mut s, unhealthy(&[2]), 20_000));
    assert_eq!(
        statuses(&s),
        vec![
            TaskStatus::Connected,
            TaskStatus::Connected,
            TaskStatus::Error
        ]
    );
}

#[test]
fn task_error_fails_barriers_that_include_it_only() {
    let mut s = cluster(3, Opts::default());
    parked(&apply(&mut s, poll(0), 1500));
    let all = parked(&apply(&mut s, arrive("all", 0, 60_000, &[], 0), 2000));
    let sub = parked(&apply(&mut s, arrive("sub", 0, 60_000, &[0, 1], 0), 2000));
    let v = s.coordination().tasks_version();
    ok(&apply(&mut s, report(2, Code::Internal, "dead"), 2100));
    assert!(s.coordination().tasks_version() > v);
    let e = barrier_result(&s, "all", 0, all).unwrap().unwrap_err();
    code_is(&e, Code::Internal);
    contains(
        &e,
        "Barrier failed because: task is set to ERROR: INTERNAL: dead. Barrier Id: all::0, Task: 2",
    );
    assert_eq!(e.barrier.as_ref().unwrap().id, "all");
    assert_eq!(e.barrier.as_ref().unwrap().counter, 0);
    assert_eq!(barrier_result(&s, "sub", 0, sub), None);
    assert_eq!(
        s.coordination().barrier("sub").unwrap().status(),
        BarrierStatus::Pending
    );
    let out = apply(&mut s, arrive("sub", 0, 60_000, &[0, 1], 1), 2200);
    ok(&out);
    assert_eq!(barrier_result(&s, "sub", 0, sub), Some(Ok(0)));
}

// ---- XLA's PollForError-after-shutdown scenarios (tests/README.md) ---------

#[test]
fn a_poll_right_after_shutdown_waits_and_one_after_the_grace_period_is_refused() {
    // XLA: AllowPollForErrorWithinGracePeriodIfTaskHasShutDown,
    // DoNotAllowPollForErrorIfTaskHasShutDown, DoNotAllowPollForErrorAfterReset.
    let mut s = cluster(2, Opts::no_shutdown_barrier());
    ok(&apply(&mut s, shutdown(1), 2000));
    parked(&apply(&mut s, poll(1), 2100));
    // The grace period is one heartbeat timeout (10 s here).
    let e = err(
        &apply(&mut s, poll(1), 2000 + 10_000),
        Code::FailedPrecondition,
    );
    contains(
        &e,
        "that has not been registered or has disconnected polling for errors",
    );
    ok(&apply(&mut s, reset_task(0), 30_000));
    let e = err(
        &apply(&mut s, poll(0), 30_000 + 10_000),
        Code::FailedPrecondition,
    );
    contains(&e, "has disconnected polling for errors");
}
