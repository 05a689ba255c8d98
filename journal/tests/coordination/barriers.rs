//! Barriers (`docs/protocols.md`, Barriers).

use crate::common::*;
use journal::pb::coordination::BarrierStatus;
use journal::{Code, DomainError, State};

#[track_caller]
fn failed(s: &State, id: &str, counter: i64, call: u64) -> DomainError {
    barrier_result(s, id, counter, call)
        .expect("answered")
        .expect_err("failed")
}

#[track_caller]
fn barrier_payload(e: &DomainError, id: &str, counter: i64) {
    assert!(e.coordination_payload, "{e:?}");
    let b = e.barrier.as_ref().expect("BarrierError payload");
    assert_eq!((b.id.as_str(), b.counter), (id, counter));
}

#[test]
fn barrier_over_all_tasks_passes_when_last_arrives() {
    let mut s = cluster(3, Opts::default());
    let c0 = parked(&apply(&mut s, arrive("b", 0, 60_000, &[], 0), 2000));
    let c1 = parked(&apply(&mut s, arrive("b", 0, 60_000, &[], 1), 2000));
    assert_eq!(barrier_result(&s, "b", 0, c0), None);
    let out = apply(&mut s, arrive("b", 0, 60_000, &[], 2), 2000);
    ok(&out);
    assert_eq!(out.barrier_counter().unwrap(), 0);
    assert_eq!(barrier_result(&s, "b", 0, c0), Some(Ok(0)));
    assert_eq!(barrier_result(&s, "b", 0, c1), Some(Ok(0)));
    let b = s.coordination().barrier("b").unwrap();
    assert_eq!(b.status(), BarrierStatus::Passed);
    assert!(b.all_tasks);
    assert_eq!(b.participants, vec![0, 1, 2]);
    assert!(s.coordination().pending_barrier_deadlines().is_empty());
}

#[test]
fn next_counter_creates_a_new_instance_and_returns_its_counter() {
    let mut s = cluster(2, Opts::default());
    for c in 0..3i64 {
        let p = parked(&apply(&mut s, arrive("b", c, 60_000, &[], 0), 2000));
        let out = apply(&mut s, arrive("b", c, 60_000, &[], 1), 2000);
        ok(&out);
        assert_eq!(out.barrier_counter().unwrap(), c);
        assert_eq!(barrier_result(&s, "b", c, p), Some(Ok(c)));
        assert_eq!(s.coordination().barrier("b").unwrap().counter, c);
    }
}

#[test]
fn finished_instance_replays_its_result() {
    let mut s = cluster(2, Opts::default());
    parked(&apply(&mut s, arrive("b", 0, 60_000, &[], 0), 2000));
    ok(&apply(&mut s, arrive("b", 0, 60_000, &[], 1), 2000));
    let again = apply(&mut s, arrive("b", 0, 60_000, &[], 0), 3000);
    ok(&again);
    assert_eq!(again.barrier_counter().unwrap(), 0);
    // A failed instance replays its error.
    parked(&apply(&mut s, arrive("t", 0, 100, &[], 0), 2000));
    ok(&apply(&mut s, expire("t", 0), 2100));
    let e = err(
        &apply(&mut s, arrive("t", 0, 100, &[], 1), 3000),
        Code::DeadlineExceeded,
    );
    contains(&e, "Barrier timed out. Id: t::0.");
    barrier_payload(&e, "t", 0);
}

#[test]
fn counter_on_unused_id_is_internal_mismatch() {
    let mut s = cluster(2, Opts::default());
    let e = err(
        &apply(&mut s, arrive("b", 3, 60_000, &[], 0), 2000),
        Code::Internal,
    );
    contains(&e, "Barrier (b::3) is invoked by the task, but the service thinks it is the 0-th instance. The service or task probably restarted");
    barrier_payload(&e, "b", 0);
}

#[test]
fn counter_mismatch_fails_the_current_pending_instance() {
    let mut s = cluster(3, Opts::default());
    let c0 = parked(&apply(&mut s, arrive("b", 0, 60_000, &[], 0), 2000));
    let e = err(
        &apply(&mut s, arrive("b", 2, 60_000, &[], 1), 2000),
        Code::Internal,
    );
    contains(&e, "the service thinks it is the 0-th instance");
    // The waiter gets the same error.
    assert_eq!(failed(&s, "b", 0, c0), e);
    assert_eq!(
        s.coordination().barrier("b").unwrap().status(),
        BarrierStatus::Failed
    );
    // Next instance while the current is pending is a mismatch too.
    parked(&apply(&mut s, arrive("c", 0, 60_000, &[], 0), 2000));
    let e = err(
        &apply(&mut s, arrive("c", 1, 60_000, &[], 1), 2000),
        Code::Internal,
    );
    contains(
        &e,
        "Barrier (c::1) is invoked by the task, but the service thinks it is the 0-th instance",
    );
}

#[test]
fn counter_mismatch_overwrites_a_passed_result() {
    let mut s = cluster(2, Opts::default());
    for c in 0..2 {
        parked(&apply(&mut s, arrive("b", c, 60_000, &[], 0), 2000));
        ok(&apply(&mut s, arrive("b", c, 60_000, &[], 1), 2000));
    }
    let e = err(
        &apply(&mut s, arrive("b", 5, 60_000, &[], 0), 3000),
        Code::Internal,
    );
    contains(
        &e,
        "the service thinks it is the 1-th instance. One task is probably way too quick / slow",
    );
    barrier_payload(&e, "b", 1);
    let replay = err(
        &apply(&mut s, arrive("b", 1, 60_000, &[], 1), 3000),
        Code::Internal,
    );
    assert_eq!(replay, e);
}

#[test]
fn subset_barrier_needs_only_its_participants() {
    let mut s = cluster(4, Opts::default());
    let c = parked(&apply(&mut s, arrive("s", 0, 60_000, &[3, 1], 1), 2000));
    let b = s.coordination().barrier("s").unwrap();
    assert!(!b.all_tasks);
    assert_eq!(b.participants, vec![1, 3]);
    let out = apply(&mut s, arrive("s", 0, 60_000, &[1, 3], 3), 2000);
    ok(&out);
    assert_eq!(barrier_result(&s, "s", 0, c), Some(Ok(0)));
}

#[test]
fn unknown_participant_is_invalid_argument_and_fails_instance() {
    let mut s = cluster(2, Opts::default());
    let e = err(
        &apply(&mut s, arrive_unknown("b", 0, &[0], "7", 0), 2000),
        Code::InvalidArgument,
    );
    contains(
        &e,
        "Unexpected task (7) that is not in the cluster called the barrier. Barrier Id: b::0",
    );
    barrier_payload(&e, "b", 0);
    assert_eq!(
        s.coordination().barrier("b").unwrap().status(),
        BarrierStatus::Failed
    );
}

#[test]
fn unknown_calling_task_is_invalid_argument() {
    let mut s = cluster(2, Opts::default());
    let e = err(
        &apply(&mut s, arrive("b", 0, 1000, &[], 9), 2000),
        Code::InvalidArgument,
    );
    contains(
        &e,
        "Unexpected task (9) that is not in the cluster called the barrier.",
    );
    assert!(s.coordination().barrier("b").is_none());
}

#[test]
fn conflicting_task_sets_fail_the_instance_for_all_waiters() {
    let mut s = cluster(3, Opts::default());
    let c0 = parked(&apply(&mut s, arrive("b", 0, 60_000, &[0, 1], 0), 2000));
    let e = err(
        &apply(&mut s, arrive("b", 0, 60_000, &[0, 1, 2], 1), 2000),
        Code::InvalidArgument,
    );
    contains(
        &e,
        "Conflicting tasks specified by different processes for the same barrier: b::0.",
    );
    barrier_payload(&e, "b", 0);
    assert_eq!(failed(&s, "b", 0, c0), e);
}

#[test]
fn all_tasks_versus_explicit_subset_is_invalid_argument() {
    let mut s = cluster(3, Opts::default());
    let c0 = parked(&apply(&mut s, arrive("b", 0, 60_000, &[0, 1], 0), 2000));
    let e = err(
        &apply(&mut s, arrive("b", 0, 60_000, &[], 1), 2000),
        Code::InvalidArgument,
    );
    contains(&e, "b::0: No tasks were specified by the client, which implies that the entire cluster is participating in the barrier. However, the service disagrees.");
    barrier_payload(&e, "b", 0);
    assert_eq!(failed(&s, "b", 0, c0), e);
}

#[test]
fn subset_against_all_tasks_instance_is_conflicting() {
    let mut s = cluster(3, Opts::default());
    let c0 = parked(&apply(&mut s, arrive("b", 0, 60_000, &[], 0), 2000));
    let e = err(
        &apply(&mut s, arrive("b", 0, 60_000, &[0, 1], 1), 2000),
        Code::InvalidArgument,
    );
    contains(&e, "Conflicting tasks");
    assert_eq!(failed(&s, "b", 0, c0), e);
}

#[test]
fn non_participating_caller_is_invalid_argument() {
    let mut s = cluster(3, Opts::default());
    let c0 = parked(&apply(&mut s, arrive("b", 0, 60_000, &[0, 1], 0), 2000));
    let e = err(
        &apply(&mut s, arrive("b", 0, 60_000, &[0, 1], 2), 2000),
        Code::InvalidArgument,
    );
    contains(&e, "A non-participating task (2) called the barrier: b::0");
    barrier_payload(&e, "b", 0);
    assert_eq!(failed(&s, "b", 0, c0), e);
}

#[test]
fn deadline_is_set_by_first_caller_and_timeout_fails_all_waiters() {
    let mut s = cluster(3, Opts::default());
    let c0 = parked(&apply(&mut s, arrive("b", 0, 1000, &[], 0), 2000));
    let c1 = parked(&apply(&mut s, arrive("b", 0, 10_000, &[], 1), 2500));
    let d = s.coordination().pending_barrier_deadlines();
    assert_eq!(d.len(), 1);
    assert_eq!(
        (d[0].id.as_str(), d[0].counter, d[0].deadline_ms),
        ("b", 0, 3000)
    );
    // Too early, or the wrong counter: nothing happens.
    ok(&apply(&mut s, expire("b", 0), 2999));
    ok(&apply(&mut s, expire("b", 1), 5000));
    assert_eq!(barrier_result(&s, "b", 0, c0), None);
    ok(&apply(&mut s, expire("b", 0), 3000));
    let e = failed(&s, "b", 0, c0);
    code_is(&e, Code::DeadlineExceeded);
    contains(&e, "Barrier timed out. Id: b::0.");
    contains(&e, "# of tasks that reached the barrier: 2/3.");
    contains(
        &e,
        "The first task at the barrier: 0. Some timed out task names:\n2\n",
    );
    barrier_payload(&e, "b", 0);
    assert_eq!(failed(&s, "b", 0, c1), e);
}

#[test]
fn same_task_arriving_twice_cancels_its_earlier_call() {
    let mut s = cluster(2, Opts::default());
    let first = parked(&apply(&mut s, arrive("b", 0, 60_000, &[], 0), 2000));
    let second = parked(&apply(&mut s, arrive("b", 0, 60_000, &[], 0), 2100));
    let e = failed(&s, "b", 0, first);
    code_is(&e, Code::Cancelled);
    contains(
        &e,
        "Cancelled because there's a more recent barrier call for b::0 from the same task.",
    );
    assert!(!e.coordination_payload);
    assert!(e.barrier.is_none());
    // The duplicate did not count as a second arrival.
    assert_eq!(
        s.coordination().barrier("b").unwrap().status(),
        BarrierStatus::Pending
    );
    ok(&apply(&mut s, arrive("b", 0, 60_000, &[], 1), 2200));
    assert_eq!(barrier_result(&s, "b", 0, second), Some(Ok(0)));
}

#[test]
fn participant_already_in_error_fails_new_instance_immediately() {
    let mut s = cluster(3, Opts::default());
    parked(&apply(&mut s, poll(0), 1500));
    ok(&apply(&mut s, report(2, Code::Internal, "dead"), 1600));
    let e = err(
        &apply(&mut s, arrive("b", 0, 60_000, &[], 0), 2000),
        Code::Internal,
    );
    contains(&e, "Task (2) is already in error before the barrier was called. Barrier Id: b::0 Task error: INTERNAL: dead");
    barrier_payload(&e, "b", 0);
    // A subset without the failed task is unaffected.
    parked(&apply(&mut s, arrive("s", 0, 60_000, &[0, 1], 0), 2000));
    ok(&apply(&mut s, arrive("s", 0, 60_000, &[0, 1], 1), 2000));
}

#[test]
fn participant_erroring_while_pending_fails_barrier_for_all() {
    let mut s = cluster(3, Opts::default());
    parked(&apply(&mut s, poll(0), 1500));
    let c0 = parked(&apply(&mut s, arrive("b", 0, 60_000, &[], 0), 2000));
    let c1 = parked(&apply(&mut s, arrive("b", 0, 60_000, &[], 1), 2000));
    ok(&apply(&mut s, unhealthy(&[2]), 3000));
    let e = failed(&s, "b", 0, c0);
    code_is(&e, Code::Internal);
    contains(
        &e,
        "Barrier failed because: task is set to ERROR: UNAVAILABLE: Task 2 heartbeat timeout.",
    );
    barrier_payload(&e, "b", 0);
    assert_eq!(failed(&s, "b", 0, c1), e);
}

#[test]
fn participant_disconnecting_while_pending_fails_barrier() {
    let mut s = cluster(3, Opts::no_shutdown_barrier());
    let c0 = parked(&apply(&mut s, arrive("b", 0, 60_000, &[0, 1], 0), 2000));
    let other = parked(&apply(&mut s, arrive("o", 0, 60_000, &[0, 2], 0), 2000));
    ok(&apply(&mut s, shutdown(1), 2100));
    let e = failed(&s, "b", 0, c0);
    code_is(&e, Code::Internal);
    contains(&e, "task disconnected");
    assert_eq!(barrier_result(&s, "o", 0, other), None);
}

#[test]
fn cancel_fails_pending_instance_for_all_waiters() {
    let mut s = cluster(3, Opts::default());
    let c0 = parked(&apply(&mut s, arrive("b", 0, 60_000, &[], 0), 2000));
    let c1 = parked(&apply(&mut s, arrive("b", 0, 60_000, &[], 1), 2000));
    ok(&apply(&mut s, cancel("b", 0, 1), 2100));
    let e = failed(&s, "b", 0, c0);
    code_is(&e, Code::Cancelled);
    contains(&e, "Barrier (b::0) is cancelled by task: 1");
    barrier_payload(&e, "b", 0);
    assert_eq!(failed(&s, "b", 0, c1), e);
    // Cancelling the finished instance is FAILED_PRECONDITION.
    let e = err(
        &apply(&mut s, cancel("b", 0, 1), 2200),
        Code::FailedPrecondition,
    );
    contains(
        &e,
        "Barrier (b::0) has already been passed with status code: 1",
    );
    barrier_payload(&e, "b", 0);
}

#[test]
fn cancel_with_wrong_counter_is_failed_precondition() {
    let mut s = cluster(2, Opts::default());
    let c0 = parked(&apply(&mut s, arrive("b", 0, 60_000, &[], 0), 2000));
    let e = err(
        &apply(&mut s, cancel("b", 3, 0), 2100),
        Code::FailedPrecondition,
    );
    contains(
        &e,
        "Barrier (b::3) is cancelled by task, but the service thinks it is the 0-th instance.",
    );
    barrier_payload(&e, "b", 0);
    assert_eq!(barrier_result(&s, "b", 0, c0), None, "still pending");
}

#[test]
fn cancel_of_passed_instance_is_failed_precondition() {
    let mut s = cluster(2, Opts::default());
    parked(&apply(&mut s, arrive("b", 0, 60_000, &[], 0), 2000));
    ok(&apply(&mut s, arrive("b", 0, 60_000, &[], 1), 2000));
    let e = err(
        &apply(&mut s, cancel("b", 0, 0), 2100),
        Code::FailedPrecondition,
    );
    contains(&e, "has already been passed with status code: 0");
    assert_eq!(
        s.coordination().barrier("b").unwrap().status(),
        BarrierStatus::Passed
    );
}

#[test]
fn cancel_of_unused_id_is_ok_and_first_wait_fails() {
    let mut s = cluster(2, Opts::default());
    ok(&apply(&mut s, cancel("fresh", 0, 0), 2000));
    let b = s.coordination().barrier("fresh").unwrap();
    assert!(b.created_by_cancel);
    assert_ne!(b.status(), BarrierStatus::Pending);
    let e = err(
        &apply(&mut s, arrive("fresh", 0, 60_000, &[], 0), 2100),
        Code::InvalidArgument,
    );
    barrier_payload(&e, "fresh", 0);
    // The next counter works normally.
    parked(&apply(&mut s, arrive("fresh", 1, 60_000, &[], 0), 2200));
    let out = apply(&mut s, arrive("fresh", 1, 60_000, &[], 1), 2200);
    ok(&out);
    assert_eq!(out.barrier_counter().unwrap(), 1);
}

#[test]
fn recoverable_restarted_task_rejoins_current_instance_with_counter_zero() {
    let mut s = cluster(2, Opts::recoverable());
    parked(&apply(&mut s, arrive("b", 0, 60_000, &[], 0), 2000));
    ok(&apply(&mut s, arrive("b", 0, 60_000, &[], 1), 2000));
    let c0 = parked(&apply(&mut s, arrive("b", 1, 60_000, &[], 0), 3000));
    // Task 1 restarted and lost its counter.
    ok(&apply(&mut s, register(1, 4444), 3100));
    let out = apply(&mut s, arrive("b", 0, 60_000, &[], 1), 3200);
    ok(&out);
    assert_eq!(out.barrier_counter().unwrap(), 1);
    assert_eq!(barrier_result(&s, "b", 1, c0), Some(Ok(1)));
}

// ---- XLA's order of checks (`docs/protocols.md`, Barriers; issue #19) -------

#[test]
fn conflicting_list_against_a_finished_instance_fails_it() {
    // Task 0 passes B alone with [0]; task 1 then calls B with [1].
    let mut s = cluster(2, Opts::default());
    let out = apply(&mut s, arrive("B", 0, 60_000, &[0], 0), 2000);
    ok(&out);
    assert_eq!(out.barrier_counter().unwrap(), 0);
    let e = err(
        &apply(&mut s, arrive("B", 0, 60_000, &[1], 1), 2100),
        Code::InvalidArgument,
    );
    contains(
        &e,
        "Conflicting tasks specified by different processes for the same barrier: B::0.",
    );
    barrier_payload(&e, "B", 0);
    // The stored result is now that error: task 0's replay gets it too.
    assert_eq!(
        s.coordination().barrier("B").unwrap().status(),
        BarrierStatus::Failed
    );
    let replay = err(
        &apply(&mut s, arrive("B", 0, 60_000, &[0], 0), 2200),
        Code::InvalidArgument,
    );
    assert_eq!(replay, e);
}

#[test]
fn non_participant_against_a_finished_instance_is_invalid_argument() {
    let mut s = cluster(3, Opts::default());
    parked(&apply(&mut s, arrive("b", 0, 60_000, &[0, 1], 0), 2000));
    ok(&apply(&mut s, arrive("b", 0, 60_000, &[0, 1], 1), 2000));
    let e = err(
        &apply(&mut s, arrive("b", 0, 60_000, &[0, 1], 2), 2100),
        Code::InvalidArgument,
    );
    contains(&e, "A non-participating task (2) called the barrier: b::0");
    // All tasks against a finished subset instance.
    parked(&apply(&mut s, arrive("c", 0, 60_000, &[0, 1], 0), 2000));
    ok(&apply(&mut s, arrive("c", 0, 60_000, &[0, 1], 1), 2000));
    let e = err(
        &apply(&mut s, arrive("c", 0, 60_000, &[], 0), 2100),
        Code::InvalidArgument,
    );
    contains(&e, "c::0: No tasks were specified by the client");
}

#[test]
fn later_counters_keep_the_first_instance_task_set() {
    let mut s = cluster(3, Opts::default());
    for t in 0..3 {
        apply(&mut s, arrive("all", 0, 60_000, &[], t), 2000);
    }
    assert_eq!(
        s.coordination().barrier("all").unwrap().status(),
        BarrierStatus::Passed
    );
    // Instance 1 opened with a subset still has every task: the subset conflicts.
    let e = err(
        &apply(&mut s, arrive("all", 1, 60_000, &[0, 1], 0), 2100),
        Code::InvalidArgument,
    );
    contains(
        &e,
        "Conflicting tasks specified by different processes for the same barrier: all::1.",
    );
    barrier_payload(&e, "all", 1);
    assert_eq!(
        s.coordination().barrier("all").unwrap().participants,
        vec![0, 1, 2]
    );

    // A subset id: its next instance asked for by "all tasks" disagrees.
    parked(&apply(&mut s, arrive("sub", 0, 60_000, &[0, 1], 0), 2000));
    ok(&apply(&mut s, arrive("sub", 0, 60_000, &[0, 1], 1), 2000));
    let e = err(
        &apply(&mut s, arrive("sub", 1, 60_000, &[], 0), 2100),
        Code::InvalidArgument,
    );
    contains(&e, "sub::1: No tasks were specified by the client");
    // The same subset works for counter 2.
    parked(&apply(&mut s, arrive("sub", 2, 60_000, &[1, 0], 0), 2200));
    let out = apply(&mut s, arrive("sub", 2, 60_000, &[0, 1], 1), 2200);
    ok(&out);
    assert_eq!(out.barrier_counter().unwrap(), 2);
}

#[test]
fn recoverable_restarted_task_opens_the_next_instance_of_a_finished_barrier() {
    // Two tasks pass B three times; task 0 restarts (its counter for B is
    // 0 again) and calls first, task 1 then calls with counter 3.
    let mut s = cluster(2, Opts::recoverable());
    for c in 0..3 {
        parked(&apply(&mut s, arrive("B", c, 60_000, &[], 0), 2000));
        ok(&apply(&mut s, arrive("B", c, 60_000, &[], 1), 2000));
    }
    ok(&apply(&mut s, register(0, 7777), 3000));
    let first = apply(&mut s, arrive("B", 0, 60_000, &[], 0), 3100);
    let c0 = parked(&first);
    assert_eq!(
        first.barrier_counter().unwrap(),
        3,
        "the call waits at instance 3"
    );
    assert_eq!(barrier_result(&s, "B", 3, c0), None);
    let out = apply(&mut s, arrive("B", 3, 60_000, &[], 1), 3200);
    ok(&out);
    assert_eq!(out.barrier_counter().unwrap(), 3);
    assert_eq!(barrier_result(&s, "B", 3, c0), Some(Ok(3)));
    // The restarted agent adopted 3 and goes on with 4.
    parked(&apply(&mut s, arrive("B", 4, 60_000, &[], 0), 3300));
    ok(&apply(&mut s, arrive("B", 4, 60_000, &[], 1), 3300));
}

#[test]
fn recoverable_counter_zero_opens_instance_one_after_instance_zero_and_after_a_failure() {
    let mut s = cluster(2, Opts::recoverable());
    parked(&apply(&mut s, arrive("b", 0, 60_000, &[], 0), 2000));
    ok(&apply(&mut s, arrive("b", 0, 60_000, &[], 1), 2000));
    let again = apply(&mut s, arrive("b", 0, 60_000, &[], 0), 2100);
    parked(&again);
    assert_eq!(again.barrier_counter().unwrap(), 1);

    // A timed-out instance is not replayed to a counter-0 caller either.
    parked(&apply(&mut s, arrive("t", 0, 100, &[], 0), 2000));
    ok(&apply(&mut s, expire("t", 0), 2100));
    let next = apply(&mut s, arrive("t", 0, 60_000, &[], 1), 2200);
    parked(&next);
    assert_eq!(next.barrier_counter().unwrap(), 1);
    assert_eq!(
        s.coordination().barrier("t").unwrap().status(),
        BarrierStatus::Pending
    );
}

#[test]
fn without_recoverable_a_counter_zero_call_on_a_later_instance_is_a_mismatch() {
    let mut s = cluster(2, Opts::default());
    for c in 0..3 {
        parked(&apply(&mut s, arrive("B", c, 60_000, &[], 0), 2000));
        ok(&apply(&mut s, arrive("B", c, 60_000, &[], 1), 2000));
    }
    let e = err(
        &apply(&mut s, arrive("B", 0, 60_000, &[], 0), 3000),
        Code::Internal,
    );
    contains(
        &e,
        "Barrier (B::0) is invoked by the task, but the service thinks it is the 2-th instance. The service or task probably restarted",
    );
    barrier_payload(&e, "B", 2);
}

#[test]
fn recoverable_counter_zero_rule_spares_the_device_barrier() {
    // A second WaitForAllTasks replays: it must not open instance 1.
    let mut s = cluster(2, Opts::recoverable());
    parked(&apply(&mut s, wait_all(0, b"d0"), 2000));
    ok(&apply(&mut s, wait_all(1, b"d1"), 2000));
    let again = apply(&mut s, wait_all(0, b"d0"), 2100);
    ok(&again);
    let id = journal::coordination::wait_all_barrier_id(SVC_INC);
    assert_eq!(s.coordination().barrier(&id).unwrap().counter, 0);
    assert_eq!(
        s.coordination().barrier(&id).unwrap().status(),
        BarrierStatus::Passed
    );
}

#[test]
fn counter_mismatch_cancels_the_callers_own_earlier_call_first() {
    let mut s = cluster(3, Opts::default());
    let c0 = parked(&apply(&mut s, arrive("b", 0, 60_000, &[], 0), 2000));
    let c1 = parked(&apply(&mut s, arrive("b", 0, 60_000, &[], 1), 2000));
    let e = err(
        &apply(&mut s, arrive("b", 5, 60_000, &[], 0), 2100),
        Code::Internal,
    );
    // Task 0's earlier call is superseded (CANCELLED, no payload) ...
    let first = failed(&s, "b", 0, c0);
    assert_eq!(first.code, Code::Cancelled as i32, "{first:?}");
    assert!(!first.coordination_payload);
    // ... and everyone else gets the mismatch.
    assert_eq!(failed(&s, "b", 0, c1), e);
}

#[test]
fn counter_zero_after_a_mismatch_on_an_unused_id_fails_the_task_check() {
    let mut s = cluster(2, Opts::default());
    err(
        &apply(&mut s, arrive("u", 2, 60_000, &[], 0), 2000),
        Code::Internal,
    );
    let e = err(
        &apply(&mut s, arrive("u", 0, 60_000, &[], 0), 2100),
        Code::InvalidArgument,
    );
    contains(&e, "u::0: No tasks were specified by the client");
    let e = err(
        &apply(&mut s, arrive("u", 0, 60_000, &[0, 1], 1), 2200),
        Code::InvalidArgument,
    );
    contains(&e, "Conflicting tasks specified");
    // The next counter opens a normal instance.
    parked(&apply(&mut s, arrive("u", 1, 60_000, &[], 0), 2300));
    ok(&apply(&mut s, arrive("u", 1, 60_000, &[], 1), 2300));
}

#[test]
fn a_barrier_of_a_task_that_is_itself_in_error_fails_at_once() {
    // XLA: BarrierWithParticipatingTasksFailsIfTaskIsStale,
    // BarrierWithSubsetFailsIfTaskIsStale.
    let mut s = cluster(2, Opts::default());
    parked(&apply(&mut s, poll(1), 1500));
    ok(&apply(&mut s, unhealthy(&[0]), 20_000));
    let e = err(
        &apply(&mut s, arrive("b", 0, 60_000, &[0], 0), 20_100),
        Code::Internal,
    );
    contains(
        &e,
        "Task (0) is already in error before the barrier was called",
    );
    barrier_payload(&e, "b", 0);
}

#[test]
fn a_timeout_of_a_hundred_tasks_is_deadline_exceeded_with_a_bounded_message() {
    // XLA: BarrierTimeout_ManyLateTasks_ReturnsCorrectError.
    let mut s = cluster(100, Opts::default());
    parked(&apply(&mut s, arrive("b", 0, 100, &[], 0), 2000));
    ok(&apply(&mut s, expire("b", 0), 2100));
    let e = err(
        &apply(&mut s, arrive("b", 0, 100, &[], 1), 2200),
        Code::DeadlineExceeded,
    );
    contains(&e, "Barrier timed out. Id: b::0.");
    contains(&e, "1/100");
    assert!(e.message.len() < 2000, "{} bytes", e.message.len());
}

#[test]
fn a_participant_index_past_the_cluster_is_an_unknown_participant() {
    // An update that did not come through an adapter (fuzzed, or a hostile
    // client on the Node API) may name any index: it is refused like an
    // unknown name, and the state stays one a snapshot can hold.
    let mut s = cluster(2, Opts::recoverable());
    let e = err(
        &apply(&mut s, arrive("b", 0, 60_000, &[0, 99], 0), 2000),
        Code::InvalidArgument,
    );
    contains(&e, "99");
    let b = s.coordination().barrier("b").unwrap();
    assert!(
        b.participants.iter().all(|&p| p < 2),
        "{:?}",
        b.participants
    );
    State::decode_snapshot(&s.encode_snapshot()).expect("a valid snapshot");
}
