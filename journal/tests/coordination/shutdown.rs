//! ShutdownTask and the shutdown barrier (`docs/protocols.md`, Shutdown).

use crate::common::*;
use journal::pb::coordination::BarrierStatus;
use journal::{
    coordination::{shutdown_barrier_id, TaskStatus},
    Code,
};

#[test]
fn shutdown_barrier_waits_for_all_then_disconnects_everyone() {
    let mut s = cluster(3, Opts::default());
    let polls: Vec<u64> = (0..3)
        .map(|t| parked(&apply(&mut s, poll(t), 1500)))
        .collect();
    let c0 = parked(&apply(&mut s, shutdown(0), 2000));
    let c1 = parked(&apply(&mut s, shutdown(1), 2100));
    assert_eq!(shutdown_result(&s, c0), None);
    assert_eq!(s.coordination().task_status(0), Some(TaskStatus::Connected));
    let id = shutdown_barrier_id(SVC_INC);
    assert_eq!(id, format!("Shutdown::{SVC_INC}"));
    assert_eq!(
        s.coordination().barrier(&id).unwrap().deadline_ms,
        2000 + 5_000
    );
    ok(&apply(&mut s, shutdown(2), 2200));
    assert_eq!(shutdown_result(&s, c0), Some(Ok(())));
    assert_eq!(shutdown_result(&s, c1), Some(Ok(())));
    assert_eq!(statuses(&s), vec![TaskStatus::Disconnected; 3]);
    for (t, p) in polls.into_iter().enumerate() {
        let e = poll_result(&s, t as u32, p).unwrap();
        code_is(&e, Code::Cancelled);
        contains(&e, "task has disconnected");
    }
    assert!(s.coordination().propagated_error().is_none());
}

#[test]
fn shutdown_barrier_timeout_fails_callers_and_sets_all_tasks_error() {
    let mut s = cluster(3, Opts::default());
    let p2 = parked(&apply(&mut s, poll(2), 1500));
    let c0 = parked(&apply(&mut s, shutdown(0), 2000));
    let id = shutdown_barrier_id(SVC_INC);
    ok(&apply(&mut s, expire(&id, 0), 7000));
    let e = shutdown_result(&s, c0).unwrap().unwrap_err();
    code_is(&e, Code::Internal);
    contains(
        &e,
        "Shutdown barrier has failed.\nBarrier result: 'DEADLINE_EXCEEDED: Barrier timed out.",
    );
    contains(&e, "# of tasks that reached the barrier: 1/3");
    assert!(e.coordination_payload);
    assert_eq!(statuses(&s), vec![TaskStatus::Error; 3]);
    // The straggler's poll is told.
    let pe = poll_result(&s, 2, p2).unwrap();
    code_is(&pe, Code::Internal);
    contains(&pe, "Shutdown barrier has failed.");
    // A late ShutdownTask gets the same INTERNAL.
    let late = err(&apply(&mut s, shutdown(1), 8000), Code::Internal);
    assert_eq!(late.message, e.message);
}

#[test]
fn shutdown_with_a_task_in_error_fails_immediately() {
    let mut s = cluster(3, Opts::default());
    parked(&apply(&mut s, poll(0), 1500));
    ok(&apply(&mut s, report(2, Code::Internal, "dead"), 1600));
    let e = err(&apply(&mut s, shutdown(0), 2000), Code::Internal);
    contains(&e, "Shutdown barrier has failed.");
    contains(&e, "is already in error before the barrier was called");
    assert_eq!(statuses(&s), vec![TaskStatus::Error; 3]);
}

#[test]
fn shutdown_barrier_fails_when_a_participant_errors_while_pending() {
    let mut s = cluster(3, Opts::default());
    parked(&apply(&mut s, poll(1), 1500));
    let c0 = parked(&apply(&mut s, shutdown(0), 2000));
    ok(&apply(&mut s, unhealthy(&[2]), 3000));
    let e = shutdown_result(&s, c0).unwrap().unwrap_err();
    code_is(&e, Code::Internal);
    contains(&e, "Shutdown barrier has failed.");
    contains(&e, "Barrier failed because: task is set to ERROR");
    let id = shutdown_barrier_id(SVC_INC);
    assert_eq!(
        s.coordination().barrier(&id).unwrap().status(),
        BarrierStatus::Failed
    );
}

#[test]
fn repeated_shutdown_after_barrier_passed_is_internal_wrapping_failed_precondition() {
    let mut s = cluster(2, Opts::default());
    parked(&apply(&mut s, shutdown(0), 2000));
    ok(&apply(&mut s, shutdown(1), 2000));
    let e = err(&apply(&mut s, shutdown(0), 3000), Code::Internal);
    contains(&e, "Shutdown barrier has failed.\nBarrier result: 'FAILED_PRECONDITION: The task is already disconnected: 0");
    assert_eq!(statuses(&s), vec![TaskStatus::Disconnected; 2]);
}

#[test]
fn reregistered_task_shutting_down_again_gets_immediate_replay() {
    let mut s = cluster(2, Opts::default());
    parked(&apply(&mut s, shutdown(0), 2000));
    ok(&apply(&mut s, shutdown(1), 2000));
    // The registration barrier has passed: re-registering is immediate.
    ok(&apply(&mut s, register(1, 77), 3000));
    assert_eq!(s.coordination().task_status(1), Some(TaskStatus::Connected));
    ok(&apply(&mut s, shutdown(1), 4000));
    assert_eq!(
        s.coordination().task_status(1),
        Some(TaskStatus::Disconnected)
    );
}

#[test]
fn without_shutdown_barrier_tasks_disconnect_individually() {
    for o in [Opts::no_shutdown_barrier(), Opts::recoverable()] {
        let mut s = cluster(2, o);
        ok(&apply(&mut s, shutdown(1), 2000));
        assert_eq!(
            s.coordination().task_status(1),
            Some(TaskStatus::Disconnected)
        );
        assert_eq!(s.coordination().task_status(0), Some(TaskStatus::Connected));
        let e = err(&apply(&mut s, shutdown(1), 2100), Code::FailedPrecondition);
        assert_eq!(e.message, "The task is already disconnected: 1");
        assert!(s
            .coordination()
            .barrier(&shutdown_barrier_id(SVC_INC))
            .is_none());
    }
}

#[test]
fn disconnect_fails_ongoing_barriers_of_the_task() {
    let mut s = cluster(3, Opts::no_shutdown_barrier());
    let c0 = parked(&apply(&mut s, arrive("b", 0, 60_000, &[], 0), 2000));
    ok(&apply(&mut s, shutdown(2), 2100));
    let e = barrier_result(&s, "b", 0, c0).unwrap().unwrap_err();
    code_is(&e, Code::Internal);
    contains(
        &e,
        "Barrier failed because: task disconnected. Barrier Id: b::0, Task: 2",
    );
    assert_eq!(e.barrier.unwrap().id, "b");
}

#[test]
fn shutdown_of_unknown_task_is_invalid_argument() {
    let mut s = cluster(2, Opts::default());
    let e = err(&apply(&mut s, shutdown(3), 2000), Code::InvalidArgument);
    contains(&e, "Unexpected disconnect request with task=3");
    assert!(s
        .coordination()
        .barrier(&shutdown_barrier_id(SVC_INC))
        .is_none());
}
