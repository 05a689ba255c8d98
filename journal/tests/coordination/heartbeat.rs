//! Heartbeats and heartbeat-timeout marking (`docs/protocols.md`, Heartbeats).

use crate::common::*;
use journal::{
    coordination::{HeartbeatCheck, TaskStatus},
    Code,
};

#[test]
fn heartbeat_of_connected_task_with_its_incarnation_is_accepted() {
    let mut s = cluster(2, Opts::default());
    assert_eq!(
        s.coordination().heartbeat_check(1, tinc(1), 2000),
        HeartbeatCheck::Accept
    );
    let v = s.coordination().tasks_version();
    ok(&apply(&mut s, heartbeat(1, tinc(1)), 2000));
    assert_eq!(s.coordination().tasks_version(), v);
    assert_eq!(s.coordination().task_status(1), Some(TaskStatus::Connected));
}

#[test]
fn heartbeat_from_unknown_task_is_invalid_argument() {
    let s = cluster(2, Opts::default());
    match s.coordination().heartbeat_check(9, 1, 2000) {
        HeartbeatCheck::Reject(e) => {
            code_is(&e, Code::InvalidArgument);
            contains(&e, "Unexpected heartbeat request from task: 9. This usually implies a configuration error.");
            assert!(e.coordination_payload);
        }
        other => panic!("expected reject, got {other:?}"),
    }
}

#[test]
fn heartbeat_before_registration_is_invalid_argument() {
    let mut s = new_state(2, &Opts::default());
    let e = err(&apply(&mut s, heartbeat(0, 5), 10), Code::InvalidArgument);
    contains(
        &e,
        "Task with task=0 must be registered before sending heartbeat messages.",
    );
    assert_eq!(
        s.coordination().task_status(0),
        Some(TaskStatus::Disconnected)
    );
}

#[test]
fn heartbeat_after_disconnect_accepted_within_grace_rejected_after() {
    let mut s = cluster(2, Opts::no_shutdown_barrier());
    ok(&apply(&mut s, shutdown(1), 20_000));
    // Grace period = one heartbeat timeout (10 s).
    assert_eq!(
        s.coordination().heartbeat_check(1, tinc(1), 29_999),
        HeartbeatCheck::Accept
    );
    ok(&apply(&mut s, heartbeat(1, tinc(1)), 29_999));
    let e = err(
        &apply(&mut s, heartbeat(1, tinc(1)), 30_000),
        Code::InvalidArgument,
    );
    contains(&e, "must be registered before sending heartbeat");
    assert_eq!(
        s.coordination().task_status(1),
        Some(TaskStatus::Disconnected)
    );
}

#[test]
fn heartbeat_incarnation_mismatch_aborts_sets_error_and_propagates() {
    let mut s = cluster(3, Opts::default());
    let p2 = parked(&apply(&mut s, poll(2), 1500));
    assert!(matches!(
        s.coordination().heartbeat_check(1, 4, 2000),
        HeartbeatCheck::Mismatch(_)
    ));
    let e = err(&apply(&mut s, heartbeat(1, 4), 2000), Code::Aborted);
    contains(
        &e,
        &format!(
            "1 Heartbeat: Incarnation ID mismatch: expecting {} but got 4.",
            tinc(1)
        ),
    );
    assert!(e.coordination_payload);
    assert_eq!(s.coordination().task_status(1), Some(TaskStatus::Error));
    assert_eq!(poll_result(&s, 2, p2), Some(e.clone()));
    assert_eq!(s.coordination().propagated_error(), Some(&e));
}

#[test]
fn recoverable_heartbeat_mismatch_is_ok_but_ignored() {
    let mut s = cluster(2, Opts::recoverable());
    assert_eq!(
        s.coordination().heartbeat_check(1, 4, 2000),
        HeartbeatCheck::Ignore
    );
    let v = s.coordination().tasks_version();
    ok(&apply(&mut s, heartbeat(1, 4), 2000));
    assert_eq!(s.coordination().task_status(1), Some(TaskStatus::Connected));
    assert_eq!(s.coordination().task(1).unwrap().incarnation, tinc(1));
    assert_eq!(s.coordination().tasks_version(), v);
}

#[test]
fn heartbeat_of_task_in_error_is_aborted() {
    let mut s = cluster(2, Opts::default());
    parked(&apply(&mut s, poll(0), 1500));
    ok(&apply(&mut s, report(1, Code::Unknown, "oops"), 2000));
    let e = err(&apply(&mut s, heartbeat(1, tinc(1)), 2100), Code::Aborted);
    contains(&e, "Unexpected heartbeat request from an already-in-error task: 1 with existing error: UNKNOWN: oops");
}

#[test]
fn heartbeat_timeout_marks_stale_tasks_and_propagates_combined_error() {
    let mut s = cluster(4, Opts::default());
    let p0 = parked(&apply(&mut s, poll(0), 1500));
    let v = s.coordination().tasks_version();
    ok(&apply(&mut s, unhealthy(&[1, 3]), 20_000));
    assert!(s.coordination().tasks_version() > v);
    for t in [1, 3] {
        let te = s.coordination().task(t).unwrap().error.clone().unwrap();
        code_is(&te, Code::Unavailable);
        contains(&te, &format!("Task {t} heartbeat timeout. This indicates that the remote task has failed, got preempted, or crashed unexpectedly."));
        assert!(te.coordination_payload);
        assert_eq!(s.coordination().task_status(t), Some(TaskStatus::Error));
    }
    // The others keep working.
    assert_eq!(s.coordination().task_status(0), Some(TaskStatus::Connected));
    assert_eq!(s.coordination().task_status(2), Some(TaskStatus::Connected));
    let pe = poll_result(&s, 0, p0).expect("poller told");
    code_is(&pe, Code::Unavailable);
    contains(&pe, "The following tasks are unhealthy (stopped sending heartbeats):\n1\n3\nThe tasks have crashed.");
    assert!(pe.coordination_payload);
    ok(&apply(&mut s, insert("still", "works", false), 20_001));
    assert_eq!(s.coordination().kv_get("still").unwrap().as_ref(), b"works");
}

#[test]
fn heartbeat_timeout_lists_at_most_three_tasks() {
    let mut s = cluster(5, Opts::default());
    parked(&apply(&mut s, poll(0), 1500));
    ok(&apply(&mut s, unhealthy(&[1, 2, 3, 4]), 20_000));
    let pe = s.coordination().propagated_error().unwrap();
    contains(pe, "heartbeats):\n1\n2\n3\nThe tasks");
    assert!(!pe.message.contains("\n4\n"));
    assert_eq!(s.coordination().task_status(4), Some(TaskStatus::Error));
}

#[test]
fn heartbeat_timeout_ignores_tasks_not_connected() {
    let mut s = cluster(3, Opts::no_shutdown_barrier());
    parked(&apply(&mut s, poll(0), 1500));
    ok(&apply(&mut s, shutdown(2), 2000));
    let v = s.coordination().tasks_version();
    ok(&apply(&mut s, unhealthy(&[2]), 20_000));
    assert_eq!(
        s.coordination().task_status(2),
        Some(TaskStatus::Disconnected)
    );
    assert_eq!(s.coordination().tasks_version(), v);
    assert!(s.coordination().propagated_error().is_none());
}
