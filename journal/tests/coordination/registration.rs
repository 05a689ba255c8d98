//! RegisterTask and incarnations (`docs/protocols.md`, Registration and
//! incarnations).

use crate::common::*;
use journal::{
    coordination::{TaskStatus, REGISTER_BARRIER},
    Code,
};

#[test]
fn registration_waits_at_barrier_until_all_tasks_registered() {
    let mut s = new_state(3, &Opts::default());
    assert_eq!(statuses(&s), vec![TaskStatus::Disconnected; 3]);
    parked(&apply(&mut s, register(0, 10), 100));
    parked(&apply(&mut s, register(1, 11), 100));
    assert_eq!(registration_result(&s, 0, 10), None);
    assert_eq!(registration_result(&s, 1, 11), None);
    // Nobody is connected while the barrier is open.
    assert_eq!(statuses(&s), vec![TaskStatus::Disconnected; 3]);
    let b = s
        .coordination()
        .barrier(REGISTER_BARRIER)
        .expect("registration barrier");
    assert_eq!(b.counter, 0);
    assert_eq!(b.participants, vec![0, 1, 2]);
    assert_eq!(b.deadline_ms, 100 + 60_000, "deadline = register timeout");

    let last = apply(&mut s, register(2, 12), 200);
    ok(&last);
    assert_eq!(last.registered(), Some(SVC_INC));
    for (t, inc) in [(0, 10), (1, 11), (2, 12)] {
        assert_eq!(registration_result(&s, t, inc), Some(Ok(SVC_INC)));
        assert_eq!(s.coordination().task_status(t), Some(TaskStatus::Connected));
        assert_eq!(s.coordination().task(t).unwrap().incarnation, inc);
    }
    assert_eq!(
        s.coordination().connected_tasks(),
        vec![(0, 10), (1, 11), (2, 12)]
    );
}

#[test]
fn registration_without_barrier_connects_immediately() {
    let o = Opts {
        register_with_barrier: false,
        ..Default::default()
    };
    let mut s = new_state(3, &o);
    let out = apply(&mut s, register(1, 7), 5);
    ok(&out);
    assert_eq!(out.registered(), Some(SVC_INC));
    assert_eq!(s.coordination().task_status(1), Some(TaskStatus::Connected));
    assert_eq!(
        s.coordination().task_status(0),
        Some(TaskStatus::Disconnected)
    );
    assert!(s.coordination().barrier(REGISTER_BARRIER).is_none());
}

#[test]
fn registration_after_barrier_passed_only_replays() {
    // No shutdown barrier: a task disconnects on its own and comes back.
    let mut s = cluster(3, Opts::no_shutdown_barrier());
    ok(&apply(&mut s, shutdown(1), 2000));
    assert_eq!(
        s.coordination().task_status(1),
        Some(TaskStatus::Disconnected)
    );
    let out = apply(&mut s, register(1, 99), 3000);
    ok(&out);
    assert_eq!(out.registered(), Some(SVC_INC));
    assert_eq!(s.coordination().task_status(1), Some(TaskStatus::Connected));
    assert_eq!(s.coordination().task(1).unwrap().incarnation, 99);
}

#[test]
fn unknown_task_registration_is_invalid_argument_and_changes_nothing() {
    let mut s = new_state(2, &Opts::default());
    parked(&apply(&mut s, register(0, 10), 1));
    let version = s.coordination().tasks_version();
    let e = err(&apply(&mut s, register(5, 1), 2), Code::InvalidArgument);
    assert!(e.coordination_payload);
    contains(&e, "Unexpected task registered with task=5");
    assert_eq!(s.coordination().tasks_version(), version);
    assert_eq!(registration_result(&s, 0, 10), None, "still waiting");
    assert!(s.coordination().propagated_error().is_none());
    assert_eq!(statuses(&s), vec![TaskStatus::Disconnected; 2]);
}

#[test]
fn newer_pending_registration_supersedes_older_with_already_exists() {
    let mut s = new_state(2, &Opts::default());
    parked(&apply(&mut s, register(0, 10), 1));
    parked(&apply(&mut s, register(0, 20), 2));
    let e = registration_result(&s, 0, 10)
        .expect("older call answered")
        .unwrap_err();
    code_is(&e, Code::AlreadyExists);
    assert!(e.coordination_payload);
    contains(
        &e,
        "Aborted connect attempt as there is a request from a newer incarnation",
    );
    assert_eq!(registration_result(&s, 0, 20), None, "newer one waits");
    ok(&apply(&mut s, register(1, 11), 3));
    assert_eq!(registration_result(&s, 0, 20), Some(Ok(SVC_INC)));
    assert_eq!(s.coordination().task(0).unwrap().incarnation, 20);
    // The superseded one stays superseded.
    code_is(
        &registration_result(&s, 0, 10).unwrap().unwrap_err(),
        Code::AlreadyExists,
    );
}

#[test]
fn retried_pending_registration_keeps_waiting() {
    let mut s = new_state(2, &Opts::default());
    parked(&apply(&mut s, register(0, 10), 1));
    parked(&apply(&mut s, register(0, 10), 2));
    assert_eq!(registration_result(&s, 0, 10), None);
    ok(&apply(&mut s, register(1, 11), 3));
    assert_eq!(registration_result(&s, 0, 10), Some(Ok(SVC_INC)));
}

#[test]
fn reregistration_with_same_incarnation_is_ok_and_changes_nothing() {
    let mut s = cluster(2, Opts::default());
    let v = s.coordination().tasks_version();
    let out = apply(&mut s, register(1, tinc(1)), 5000);
    ok(&out);
    assert_eq!(out.registered(), Some(SVC_INC));
    assert_eq!(s.coordination().tasks_version(), v);
    assert_eq!(s.coordination().task_status(1), Some(TaskStatus::Connected));
}

#[test]
fn different_incarnation_while_connected_aborts_sets_error_and_propagates() {
    let mut s = cluster(3, Opts::default());
    let p0 = parked(&apply(&mut s, poll(0), 1500));
    let e = err(&apply(&mut s, register(1, 555), 2000), Code::Aborted);
    contains(
        &e,
        "1 unexpectedly tried to connect with a different incarnation. It has likely restarted.",
    );
    assert!(e.coordination_payload);
    assert_eq!(e.source_task, Some(1));
    assert!(!e.is_reported_error);
    assert_eq!(s.coordination().task_status(1), Some(TaskStatus::Error));
    assert_eq!(s.coordination().task(1).unwrap().error.as_ref(), Some(&e));
    // Propagated to the poller with the same code and message.
    let pe = poll_result(&s, 0, p0).expect("poll answered");
    assert_eq!(pe, e);
    assert_eq!(s.coordination().task_status(0), Some(TaskStatus::Connected));
}

#[test]
fn recoverable_task_reconnects_with_new_incarnation_and_leaves_barriers() {
    let mut s = cluster(3, Opts::recoverable());
    let c1 = parked(&apply(&mut s, arrive("b", 0, 60_000, &[], 1), 2000));
    parked(&apply(&mut s, arrive("b", 0, 60_000, &[], 0), 2000));
    let v = s.coordination().tasks_version();
    let out = apply(&mut s, register(1, 777), 2100);
    ok(&out);
    assert_eq!(out.registered(), Some(SVC_INC));
    assert_eq!(s.coordination().task_status(1), Some(TaskStatus::Connected));
    assert_eq!(s.coordination().task(1).unwrap().incarnation, 777);
    assert!(s.coordination().tasks_version() > v);
    // The stale barrier call is cancelled, the barrier itself goes on.
    let e = barrier_result(&s, "b", 0, c1).unwrap().unwrap_err();
    code_is(&e, Code::Cancelled);
    contains(&e, "Stale barrier invocation is cancelled because:");
    assert_eq!(e.barrier.as_ref().map(|b| b.id.as_str()), Some("b"));
    assert_eq!(
        s.coordination().barrier("b").unwrap().status(),
        journal::pb::coordination::BarrierStatus::Pending
    );
    assert!(s.coordination().propagated_error().is_none());
}

#[test]
fn registration_of_task_in_error_is_aborted_with_existing_error() {
    let mut s = cluster(2, Opts::default());
    parked(&apply(&mut s, poll(0), 1500));
    ok(&apply(&mut s, report(1, Code::Internal, "boom"), 2000));
    let e = err(&apply(&mut s, register(1, 4242), 3000), Code::Aborted);
    contains(&e, "1 unexpectedly tried to connect while it is already in error. ResetTask() should be called before a subsequent connect attempt.");
    contains(&e, "Existing error: INTERNAL: boom");
    assert_eq!(e.source_task, Some(1));
    assert!(e.coordination_payload);
    assert_eq!(s.coordination().task_status(1), Some(TaskStatus::Error));
    // The task keeps its first error.
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
}

#[test]
fn recoverable_task_after_heartbeat_timeout_may_register_again() {
    let mut s = cluster(3, Opts::recoverable());
    ok(&apply(&mut s, unhealthy(&[2]), 50_000));
    assert_eq!(s.coordination().task_status(2), Some(TaskStatus::Error));
    let out = apply(&mut s, register(2, 31337), 51_000);
    ok(&out);
    assert_eq!(out.registered(), Some(SVC_INC));
    assert_eq!(s.coordination().task_status(2), Some(TaskStatus::Connected));
    assert_eq!(s.coordination().task(2).unwrap().incarnation, 31337);
    assert!(s.coordination().task(2).unwrap().error.is_none());
}

#[test]
fn recoverable_task_in_non_unavailable_error_cannot_register() {
    let mut s = cluster(2, Opts::recoverable());
    ok(&apply(&mut s, report(1, Code::Internal, "bad"), 2000));
    let e = err(&apply(&mut s, register(1, 9), 3000), Code::Aborted);
    contains(&e, "already in error");
    assert_eq!(s.coordination().task_status(1), Some(TaskStatus::Error));
}

#[test]
fn nonrecoverable_task_after_heartbeat_timeout_cannot_register() {
    let mut s = cluster(2, Opts::default());
    parked(&apply(&mut s, poll(0), 1500));
    ok(&apply(&mut s, unhealthy(&[1]), 50_000));
    let e = err(&apply(&mut s, register(1, 9), 51_000), Code::Aborted);
    contains(&e, "Existing error: UNAVAILABLE: Task 1 heartbeat timeout");
}

#[test]
fn registration_barrier_timeout_sets_every_task_error_and_later_registration_aborts() {
    let o = Opts {
        register_timeout_ms: 1000,
        ..Default::default()
    };
    let mut s = new_state(3, &o);
    parked(&apply(&mut s, register(0, 10), 100));
    parked(&apply(&mut s, register(1, 11), 200));
    // Not yet due.
    ok(&apply(&mut s, expire(REGISTER_BARRIER, 0), 1099));
    assert_eq!(registration_result(&s, 0, 10), None);
    ok(&apply(&mut s, expire(REGISTER_BARRIER, 0), 1100));
    for t in 0..3 {
        assert_eq!(
            s.coordination().task_status(t),
            Some(TaskStatus::Error),
            "task {t}"
        );
        let te = s.coordination().task(t).unwrap().error.clone().unwrap();
        code_is(&te, Code::Internal);
        contains(&te, "Cluster registration failed with error: DEADLINE_EXCEEDED: Barrier timed out. Id: [Init]Wait_for_all_tasks_to_register::0.");
    }
    let e = err(&apply(&mut s, register(2, 12), 1200), Code::Aborted);
    contains(&e, "already in error");
    contains(&e, "Cluster registration failed");
    assert_eq!(e.source_task, Some(2));
}
