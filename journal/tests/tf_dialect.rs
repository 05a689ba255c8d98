//! TensorFlow dialect additions: named jobs, WaitForAllTasks with device
//! info, ResetTask, task status.
mod common;
use common::*;
use journal::{task_name, wait_all_barrier_id, Code, TaskStatus, WAIT_FOR_ALL_TASKS_TIMEOUT_MS};

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
    let te = s.task(2).unwrap().error.clone().unwrap();
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
    assert_eq!(s.wait_for_all_result(2, c2), None);
    let id = wait_all_barrier_id(SVC_INC);
    assert_eq!(id, format!("WaitForAllTasks::{SVC_INC}"));
    assert_eq!(
        s.barrier(&id).unwrap().deadline_ms,
        2000 + WAIT_FOR_ALL_TASKS_TIMEOUT_MS
    );
    ok(&apply(&mut s, wait_all(0, b"worker0"), 2100));
    assert_eq!(s.wait_for_all_result(2, c2), Some(Ok(())));
    assert_eq!(s.wait_for_all_result(1, c1), Some(Ok(())));
    let infos: Vec<Vec<u8>> = s.cluster_device_info().iter().map(|b| b.to_vec()).collect();
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
    let infos: Vec<Vec<u8>> = s.cluster_device_info().iter().map(|b| b.to_vec()).collect();
    assert_eq!(infos, vec![b"first".to_vec(), b"w1".to_vec()]);
}

#[test]
fn wait_for_all_tasks_from_unknown_task_is_invalid_argument() {
    let mut s = cluster_jobs(JOBS, Opts::default());
    let e = err(
        &apply(&mut s, wait_all(3, b"x"), 2000),
        Code::InvalidArgument,
    );
    contains(&e, "not in the cluster waiting for all tasks");
    assert!(s.cluster_device_info().is_empty());
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
    let e = s.wait_for_all_result(0, c0).unwrap().unwrap_err();
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
    assert_eq!(s.task_status(1), Some(TaskStatus::Error));
    let v = s.tasks_version();
    ok(&apply(&mut s, reset_task(1), 2100));
    assert_eq!(s.task_status(1), Some(TaskStatus::Disconnected));
    assert!(s.task(1).unwrap().error.is_none());
    assert!(s.tasks_version() > v);
    let out = apply(&mut s, register(1, 5150), 2200);
    ok(&out);
    assert_eq!(s.task_status(1), Some(TaskStatus::Connected));
    assert_eq!(s.task(1).unwrap().incarnation, 5150);
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
    assert_eq!(s.task_status(3), None);
    assert_eq!(s.task(0).unwrap().error.as_ref().unwrap().message, "x");
}
