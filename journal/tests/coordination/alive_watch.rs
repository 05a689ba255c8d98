//! GetAliveTasks rendezvous and WatchTasks versions (`docs/protocols.md`,
//! GetAliveTasks and WatchTasks).

use crate::common::*;
use journal::{
    coordination::{AliveTasks, TaskStatus},
    Code,
};

#[test]
fn requester_outside_the_set_is_invalid_argument_without_payload() {
    let mut s = cluster(3, Opts::default());
    let e = err(
        &apply(&mut s, alive(2, &[0, 1]), 2000),
        Code::InvalidArgument,
    );
    contains(
        &e,
        "Requesting task 2 is not one of the tasks specified in a GetAliveTasks request.",
    );
    assert!(!e.coordination_payload);
}

#[test]
fn alive_tasks_is_a_rendezvous_of_connected_tasks() {
    let mut s = cluster(3, Opts::default());
    let a = apply(&mut s, alive(0, &[1, 0]), 2000);
    parked(&a);
    let gen = a.alive_generation().unwrap();
    assert_eq!(alive_result(&s, &[0, 1], gen), None);
    let b = apply(&mut s, alive(1, &[0, 1]), 2100);
    assert_eq!(b.alive_generation().unwrap(), gen, "same round");
    let expected = AliveTasks {
        tasks: vec![0, 1],
        incarnations: vec![tinc(0), tinc(1)],
    };
    assert_eq!(alive_result(&s, &[1, 0], gen), Some(Ok(expected.clone())));
    assert_eq!(alive_result(&s, &[0, 1], gen), Some(Ok(expected)));
    // A new round starts with the next generation.
    let c = apply(&mut s, alive(0, &[0, 1]), 2200);
    assert_eq!(c.alive_generation().unwrap(), gen + 1);
    assert_eq!(alive_result(&s, &[0, 1], gen + 1), None);
}

#[test]
fn pending_alive_round_finishes_when_a_task_errors() {
    let mut s = cluster(3, Opts::default());
    parked(&apply(&mut s, poll(0), 1500));
    let a = apply(&mut s, alive(0, &[0, 1, 2]), 2000);
    let gen = a.alive_generation().unwrap();
    parked(&apply(&mut s, alive(1, &[0, 1, 2]), 2000));
    assert_eq!(alive_result(&s, &[0, 1, 2], gen), None);
    ok(&apply(&mut s, unhealthy(&[2]), 3000));
    assert_eq!(
        alive_result(&s, &[0, 1, 2], gen),
        Some(Ok(AliveTasks {
            tasks: vec![0, 1],
            incarnations: vec![tinc(0), tinc(1)],
        }))
    );
}

#[test]
fn pending_alive_round_finishes_when_a_task_disconnects() {
    let mut s = cluster(3, Opts::no_shutdown_barrier());
    let gen = apply(&mut s, alive(0, &[0, 2]), 2000)
        .alive_generation()
        .unwrap();
    ok(&apply(&mut s, shutdown(2), 2100));
    let r = alive_result(&s, &[0, 2], gen).unwrap().unwrap();
    assert_eq!(r.tasks, vec![0]);
    assert_eq!(r.incarnations, vec![tinc(0)]);
}

#[test]
fn disconnected_tasks_are_not_waited_for() {
    let mut s = cluster(3, Opts::no_shutdown_barrier());
    ok(&apply(&mut s, shutdown(1), 1500));
    let out = apply(&mut s, alive(0, &[0, 1]), 2000);
    assert!(!out.is_err());
    let r = alive_result(&s, &[0, 1], out.alive_generation().unwrap())
        .unwrap()
        .unwrap();
    assert_eq!(r.tasks, vec![0]);
}

#[test]
fn watch_tasks_answers_old_and_future_versions_and_waits_on_current() {
    let s = cluster(2, Opts::default());
    let v = s.coordination().tasks_version();
    assert!(v > 0, "registration bumped the version");
    assert!(watch_tasks_ready(&s, -1));
    assert!(watch_tasks_ready(&s, v - 1));
    assert!(!watch_tasks_ready(&s, v));
    assert!(
        watch_tasks_ready(&s, v + 5),
        "future version answers at once"
    );
}

#[test]
fn watch_version_bumps_on_every_task_state_change() {
    let mut s = new_state(2, &Opts::no_shutdown_barrier());
    let v0 = s.coordination().tasks_version();
    parked(&apply(&mut s, register(0, 1), 10));
    ok(&apply(&mut s, register(1, 2), 10));
    let v1 = s.coordination().tasks_version();
    assert!(v1 > v0);
    assert!(watch_tasks_ready(&s, v0));
    parked(&apply(&mut s, poll(0), 20));
    ok(&apply(&mut s, report(1, Code::Internal, "x"), 30));
    let v2 = s.coordination().tasks_version();
    assert!(v2 > v1);
    ok(&apply(&mut s, shutdown(0), 40));
    assert!(s.coordination().tasks_version() > v2);
    // Non-state changes do not bump it.
    let v3 = s.coordination().tasks_version();
    ok(&apply(&mut s, insert("k", "v", false), 50));
    assert_eq!(s.coordination().tasks_version(), v3);
    assert_eq!(
        s.coordination().task_status(0),
        Some(TaskStatus::Disconnected)
    );
}

// ---- XLA's WatchTasks / GetAliveTasks scenarios (tests/README.md) ----------

#[test]
fn watch_shows_a_reset_task_disconnected_then_its_new_incarnation() {
    // XLA: WatchTasksReturnsDisconnected, WatchTasksReturnsNewIncarnation.
    let mut s = cluster_jobs(&[("worker", 2)], Opts::no_shutdown_barrier());
    let v0 = s.coordination().tasks_version();
    ok(&apply(&mut s, reset_task(1), 2000));
    assert!(watch_tasks_ready(&s, v0));
    assert_eq!(
        s.coordination().task_status(1),
        Some(TaskStatus::Disconnected)
    );
    let v1 = s.coordination().tasks_version();
    assert!(
        !watch_tasks_ready(&s, v1),
        "a watch on the current version waits"
    );
    ok(&apply(&mut s, register(1, 4242), 2100));
    assert!(watch_tasks_ready(&s, v1));
    assert_eq!(s.coordination().task_status(1), Some(TaskStatus::Connected));
    assert_eq!(s.coordination().task(1).unwrap().incarnation, 4242);
}

#[test]
fn alive_rounds_over_different_sets_run_concurrently() {
    // XLA: GetAliveTasksTest.ConcurrentGetAliveTasks.
    let mut s = cluster(3, Opts::recoverable());
    let a = apply(&mut s, alive(0, &[0, 1]), 2000);
    let b = apply(&mut s, alive(2, &[1, 2]), 2000);
    let (ga, gb) = (a.alive_generation().unwrap(), b.alive_generation().unwrap());
    ok_or_parked(&apply(&mut s, alive(1, &[0, 1]), 2100));
    assert_eq!(
        alive_result(&s, &[0, 1], ga),
        Some(Ok(AliveTasks {
            tasks: vec![0, 1],
            incarnations: vec![tinc(0), tinc(1)],
        }))
    );
    assert_eq!(
        alive_result(&s, &[1, 2], gb),
        None,
        "the other round still waits"
    );
    ok_or_parked(&apply(&mut s, alive(1, &[1, 2]), 2200));
    assert_eq!(
        alive_result(&s, &[1, 2], gb),
        Some(Ok(AliveTasks {
            tasks: vec![1, 2],
            incarnations: vec![tinc(1), tinc(2)],
        }))
    );
}

#[test]
fn a_repeated_alive_call_of_one_task_is_answered_with_its_round() {
    // XLA: GetAliveTasksTest.RedundantGetAliveTasks.
    let mut s = cluster(2, Opts::recoverable());
    let first = apply(&mut s, alive(0, &[0, 1]), 2000);
    let again = apply(&mut s, alive(0, &[0, 1]), 2050);
    assert_eq!(
        first.alive_generation(),
        again.alive_generation(),
        "the same round"
    );
    ok_or_parked(&apply(&mut s, alive(1, &[0, 1]), 2100));
    assert!(matches!(
        alive_result(&s, &[0, 1], first.alive_generation().unwrap()),
        Some(Ok(_))
    ));
}

fn ok_or_parked(out: &journal::Outcome) {
    assert!(!out.is_err(), "{out:?}");
}
