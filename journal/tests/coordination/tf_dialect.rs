//! TensorFlow dialect additions: named jobs, WaitForAllTasks with device
//! info, ResetTask, task status.

use crate::common::*;
use journal::{
    coordination::{
        wait_all_barrier_id, HeartbeatCheck, TaskStatus, WAIT_FOR_ALL_TASKS_TIMEOUT_MS,
    },
    task_name, Code,
};

const JOBS: &[(&str, u32)] = &[("worker", 2), ("chief", 1)];

#[test]
fn named_jobs_map_job_and_task_ids_to_dense_indices() {
    let s = new_state_jobs(JOBS, &Opts::default());
    assert_eq!(s.task_count(), 3);
    assert_eq!(s.task_index("worker", 0), Some(0));
    assert_eq!(s.task_index("worker", 1), Some(1));
    assert_eq!(s.task_index("chief", 0), Some(2));
    assert_eq!(s.task_index("chief", 1), None);
    assert_eq!(s.task_index("worker", -1), None);
    assert_eq!(s.task_index("ps", 0), None);
    assert_eq!(s.task_id(2), Some(("chief", 0)));
    assert_eq!(s.task_id(1), Some(("worker", 1)));
    assert_eq!(s.task_id(3), None);
    assert_eq!(s.task_name(1), "/job:worker/replica:0/task:1");
    assert_eq!(task_name("chief", 0), "/job:chief/replica:0/task:0");
    assert_eq!(s.label(2), "/job:chief/replica:0/task:0");
}

#[test]
fn jax_cluster_labels_tasks_by_bare_id() {
    let s = new_state(2, &Opts::default());
    assert_eq!(s.label(1), "1");
    assert_eq!(s.task_name(1), "/job:jax_worker/replica:0/task:1");
}

#[test]
fn messages_name_tasks_with_tensorflow_names() {
    let mut s = cluster_jobs(JOBS, Opts::default());
    parked(&apply(&mut s, poll(0), 1500));
    ok(&apply(&mut s, unhealthy(&[2]), 20_000));
    let te = s.coordination().task(2).unwrap().error.clone().unwrap();
    contains(&te, "Task /job:chief/replica:0/task:0 heartbeat timeout.");
    let e = err(&apply(&mut s, register(1, 9), 21_000), Code::Aborted);
    contains(
        &e,
        "/job:worker/replica:0/task:1 unexpectedly tried to connect with a different incarnation",
    );
}

#[test]
fn wait_for_all_tasks_aggregates_device_info_by_job_then_task() {
    let mut s = cluster_jobs(JOBS, Opts::default());
    let c2 = parked(&apply(&mut s, wait_all(2, b"chief0"), 2000));
    let c1 = parked(&apply(&mut s, wait_all(1, b"worker1"), 2000));
    assert_eq!(wait_for_all_result(&s, c2), None);
    let id = wait_all_barrier_id(SVC_INC);
    assert_eq!(id, format!("WaitForAllTasks::{SVC_INC}"));
    assert_eq!(
        s.coordination().barrier(&id).unwrap().deadline_ms,
        2000 + WAIT_FOR_ALL_TASKS_TIMEOUT_MS
    );
    ok(&apply(&mut s, wait_all(0, b"worker0"), 2100));
    assert_eq!(wait_for_all_result(&s, c2), Some(Ok(())));
    assert_eq!(wait_for_all_result(&s, c1), Some(Ok(())));
    let infos: Vec<Vec<u8>> = s
        .coordination()
        .cluster_device_info()
        .iter()
        .map(|b| b.to_vec())
        .collect();
    assert_eq!(
        infos,
        vec![b"chief0".to_vec(), b"worker0".to_vec(), b"worker1".to_vec()]
    );
}

#[test]
fn wait_for_all_tasks_keeps_first_device_info() {
    let mut s = cluster_jobs(&[("worker", 2)], Opts::default());
    parked(&apply(&mut s, wait_all(0, b"first"), 2000));
    parked(&apply(&mut s, wait_all(0, b"second"), 2100));
    ok(&apply(&mut s, wait_all(1, b"w1"), 2200));
    let infos: Vec<Vec<u8>> = s
        .coordination()
        .cluster_device_info()
        .iter()
        .map(|b| b.to_vec())
        .collect();
    assert_eq!(infos, vec![b"first".to_vec(), b"w1".to_vec()]);
}

#[test]
fn wait_for_all_tasks_keeps_the_first_call_that_lists_devices() {
    // A task whose first call lists nothing (empty info) is recorded by a
    // later one, even after the barrier passed.
    let mut s = cluster_jobs(&[("worker", 2)], Opts::default());
    parked(&apply(&mut s, wait_all(0, b""), 2000));
    ok(&apply(&mut s, wait_all(1, b"w1"), 2100));
    ok(&apply(&mut s, wait_all(0, b"w0"), 2200));
    let infos: Vec<Vec<u8>> = s
        .coordination()
        .cluster_device_info()
        .iter()
        .map(|b| b.to_vec())
        .collect();
    assert_eq!(infos, vec![b"w0".to_vec(), b"w1".to_vec()]);
}

#[test]
fn wait_for_all_tasks_from_unknown_task_is_invalid_argument() {
    let mut s = cluster_jobs(JOBS, Opts::default());
    let e = err(
        &apply(&mut s, wait_all(3, b"x"), 2000),
        Code::InvalidArgument,
    );
    contains(&e, "not in the cluster waiting for all tasks");
    assert!(s.coordination().cluster_device_info().is_empty());
}

#[test]
fn wait_for_all_tasks_fails_when_a_task_errors() {
    let mut s = cluster_jobs(JOBS, Opts::default());
    parked(&apply(&mut s, poll(0), 1500));
    let c0 = parked(&apply(&mut s, wait_all(0, b"w0"), 2000));
    ok(&apply(
        &mut s,
        report(2, Code::Internal, "chief died"),
        2100,
    ));
    let e = wait_for_all_result(&s, c0).unwrap().unwrap_err();
    code_is(&e, Code::Internal);
    contains(
        &e,
        "Barrier failed because: task is set to ERROR: INTERNAL: chief died",
    );
}

#[test]
fn reset_task_moves_error_task_to_disconnected_and_allows_reregistration() {
    let mut s = cluster_jobs(JOBS, Opts::default());
    parked(&apply(&mut s, poll(0), 1500));
    ok(&apply(&mut s, report(1, Code::Internal, "x"), 2000));
    assert_eq!(s.coordination().task_status(1), Some(TaskStatus::Error));
    let v = s.coordination().tasks_version();
    ok(&apply(&mut s, reset_task(1), 2100));
    assert_eq!(
        s.coordination().task_status(1),
        Some(TaskStatus::Disconnected)
    );
    assert!(s.coordination().task(1).unwrap().error.is_none());
    assert!(s.coordination().tasks_version() > v);
    let out = apply(&mut s, register(1, 5150), 2200);
    ok(&out);
    assert_eq!(s.coordination().task_status(1), Some(TaskStatus::Connected));
    assert_eq!(s.coordination().task(1).unwrap().incarnation, 5150);
}

#[test]
fn reset_task_of_disconnected_task_is_failed_precondition() {
    let mut s = new_state_jobs(JOBS, &Opts::default());
    let e = err(&apply(&mut s, reset_task(0), 10), Code::FailedPrecondition);
    assert_eq!(
        e.message,
        "The task is already disconnected: /job:worker/replica:0/task:0"
    );
    let e = err(&apply(&mut s, reset_task(3), 10), Code::InvalidArgument);
    contains(&e, "Unexpected disconnect request with task=3");
}

#[test]
fn task_status_reports_each_state() {
    let mut s = cluster_jobs(JOBS, Opts::recoverable());
    ok(&apply(&mut s, report(0, Code::Internal, "x"), 2000));
    ok(&apply(&mut s, shutdown(1), 2000));
    assert_eq!(
        statuses(&s),
        vec![
            TaskStatus::Error,
            TaskStatus::Disconnected,
            TaskStatus::Connected
        ]
    );
    assert_eq!(s.coordination().task_status(3), None);
    assert_eq!(
        s.coordination()
            .task(0)
            .unwrap()
            .error
            .as_ref()
            .unwrap()
            .message,
        "x"
    );
}

// ---- TensorFlow 2.21's service semantics (issue #19) -----------------------
// (`docs/protocols.md`, tensorflow.CoordinationService (TF 2.21 and the seed
// protocol), and Error propagation)

#[test]
fn notified_tasks_stay_connected_and_learn_the_error_from_their_heartbeat() {
    // Nobody polls (TF tasks do not): XLA's service would set every task to
    // ERROR; TensorFlow's keeps the healthy ones CONNECTED and tells them.
    let mut s = cluster_jobs(JOBS, Opts::notify_tasks());
    ok(&apply(&mut s, report(0, Code::Internal, "boom"), 2000));
    assert_eq!(
        statuses(&s),
        [
            TaskStatus::Error,
            TaskStatus::Connected,
            TaskStatus::Connected
        ]
    );
    for t in [1, 2] {
        let notice = s
            .coordination()
            .task(t)
            .unwrap()
            .notice
            .clone()
            .expect("notice");
        code_is(&notice, Code::Internal);
        contains(&notice, "boom");
        assert!(notice.is_reported_error);
        assert_eq!(notice.source_task, Some(0));
        match s.coordination().heartbeat_check(t, tinc(t), 2100) {
            HeartbeatCheck::Reject(e) => assert_eq!(e, notice),
            other => panic!("heartbeat of a notified task: {other:?}"),
        }
    }
    // A heartbeat is no state change: the task stays CONNECTED.
    err(&apply(&mut s, heartbeat(1, tinc(1)), 2200), Code::Internal);
    assert_eq!(s.coordination().task_status(1), Some(TaskStatus::Connected));
    // The notice ends when the task goes away and comes back.
    ok(&apply(&mut s, reset_task(1), 2300));
    ok(&apply(&mut s, register(1, 42), 2400));
    assert!(s.coordination().task(1).unwrap().notice.is_none());
    assert_eq!(
        s.coordination().heartbeat_check(1, 42, 2500),
        HeartbeatCheck::Accept
    );
}

#[test]
fn a_heartbeat_timeout_notifies_the_live_tasks_only() {
    let mut s = cluster_jobs(JOBS, Opts::notify_tasks());
    ok(&apply(&mut s, unhealthy(&[2]), 20_000));
    assert_eq!(
        statuses(&s),
        [
            TaskStatus::Connected,
            TaskStatus::Connected,
            TaskStatus::Error
        ]
    );
    let e = s
        .coordination()
        .task(0)
        .unwrap()
        .notice
        .clone()
        .expect("notice");
    code_is(&e, Code::Unavailable);
    assert!(s.coordination().task(2).unwrap().notice.is_none());
    // A late poller gets it too.
    let p = apply(&mut s, poll(1), 20_100);
    assert_eq!(p.error, Some(e));
}

#[test]
fn an_error_of_a_task_that_declared_itself_recoverable_is_not_propagated() {
    let mut s = new_state_jobs(JOBS, &Opts::notify_tasks());
    apply(&mut s, register_recoverable(0, tinc(0)), 1000);
    apply(&mut s, register(1, tinc(1)), 1000);
    apply(&mut s, register(2, tinc(2)), 1000);
    assert!(s.coordination().task(0).unwrap().recoverable);
    ok(&apply(&mut s, report(0, Code::Internal, "boom"), 2000));
    assert_eq!(s.coordination().task_status(0), Some(TaskStatus::Error));
    assert!(s.coordination().task(1).unwrap().notice.is_none());
    assert!(s.coordination().propagated_error().is_none());
    // The same without notify_tasks and without pollers: nobody else errs.
    let mut s = new_state_jobs(JOBS, &Opts::default());
    apply(&mut s, register_recoverable(0, tinc(0)), 1000);
    apply(&mut s, register(1, tinc(1)), 1000);
    apply(&mut s, register(2, tinc(2)), 1000);
    ok(&apply(&mut s, report(0, Code::Internal, "boom"), 2000));
    assert_eq!(
        statuses(&s),
        [
            TaskStatus::Error,
            TaskStatus::Connected,
            TaskStatus::Connected
        ]
    );
}

#[test]
fn a_task_that_declared_itself_recoverable_reconnects_and_leaves_barriers() {
    let mut s = new_state_jobs(JOBS, &Opts::default());
    apply(&mut s, register_recoverable(0, tinc(0)), 1000);
    apply(&mut s, register(1, tinc(1)), 1000);
    apply(&mut s, register(2, tinc(2)), 1000);
    // Its heartbeat with another incarnation is ignored, not an error.
    assert_eq!(
        s.coordination().heartbeat_check(0, 999, 1500),
        HeartbeatCheck::Ignore
    );
    let c0 = parked(&apply(&mut s, arrive("b", 0, 60_000, &[], 0), 2000));
    let c1 = parked(&apply(&mut s, arrive("b", 0, 60_000, &[], 1), 2000));
    // It restarts: a new incarnation connects, its old call is cancelled and
    // the barrier goes on.
    ok(&apply(&mut s, register_recoverable(0, 777), 2100));
    code_is(
        &barrier_result(&s, "b", 0, c0).unwrap().unwrap_err(),
        Code::Cancelled,
    );
    assert_eq!(barrier_result(&s, "b", 0, c1), None);
    parked(&apply(&mut s, arrive("b", 0, 60_000, &[], 0), 2200));
    ok(&apply(&mut s, arrive("b", 0, 60_000, &[], 2), 2300));
    assert_eq!(barrier_result(&s, "b", 0, c1), Some(Ok(0)));
    // A task that did not declare itself recoverable still may not.
    err(&apply(&mut s, register(1, 555), 2400), Code::Aborted);
}

#[test]
fn the_counter_zero_rule_follows_the_callers_own_flag() {
    let mut s = cluster_jobs(JOBS, Opts::default());
    for c in 0..2 {
        for t in 0..3 {
            apply(&mut s, arrive("b", c, 60_000, &[], t), 2000);
        }
    }
    // A restarted recoverable TF task sends counter 0: it opens instance 2.
    let out = apply(&mut s, arrive_recoverable("b", 0, &[], 0), 3000);
    parked(&out);
    assert_eq!(out.barrier_counter(), Some(2));
    // The same call from a task that is not recoverable is a mismatch.
    let mut s = cluster_jobs(JOBS, Opts::default());
    for t in 0..3 {
        apply(&mut s, arrive("b", 0, 60_000, &[], t), 2000);
    }
    apply(&mut s, arrive("b", 1, 60_000, &[], 0), 2100);
    err(
        &apply(&mut s, arrive("b", 0, 60_000, &[], 1), 2200),
        Code::Internal,
    );
}

#[test]
fn the_shutdown_barrier_waits_only_for_tasks_not_declared_recoverable() {
    let mut s = new_state_jobs(JOBS, &Opts::default());
    apply(&mut s, register(0, tinc(0)), 1000);
    apply(&mut s, register(1, tinc(1)), 1000);
    apply(&mut s, register_recoverable(2, tinc(2)), 1000);
    // The recoverable task leaves alone.
    ok(&apply(
        &mut s,
        journal::pb::update::Command::from(journal::pb::coordination::ShutdownTask {
            task: 2,
            recoverable: true,
        }),
        2000,
    ));
    assert_eq!(
        s.coordination().task_status(2),
        Some(TaskStatus::Disconnected)
    );
    let c0 = parked(&apply(&mut s, shutdown(0), 2100));
    ok(&apply(&mut s, shutdown(1), 2200));
    assert_eq!(shutdown_result(&s, c0), Some(Ok(())));
    let id = journal::coordination::shutdown_barrier_id(SVC_INC);
    assert_eq!(
        s.coordination().barrier(&id).unwrap().participants,
        vec![0, 1]
    );
}
