//! `State::check_invariants`: a state every command keeps it on (the
//! property tests check it after each apply), and a state broken on purpose
//! fails it with the rule named. The broken states are made by editing a
//! snapshot's encoding; each still decodes (the snapshot checks cover less).
mod common;
use common::*;
use journal::pb::{self, coordination::BarrierStatus};
use journal::State;
use prost::Message;

/// A state with a pending barrier, a key, a propagated error and a session.
fn sample() -> State {
    let mut s = cluster(3, Opts::default());
    parked(&apply(&mut s, arrive("b", 0, 5000, &[0, 1], 0), 1800));
    ok(&apply(&mut s, insert("a/b", "1", false), 1600));
    apply_from(&mut s, 1, 5, incr("n", 2), 1700);
    s
}

/// `sample()` edited by `f`, decoded again, and its invariant check's error.
fn broken(f: impl FnOnce(&mut pb::StateData)) -> String {
    let mut d = pb::StateData::decode(sample().encode_snapshot().as_slice()).unwrap();
    f(&mut d);
    let s = State::decode_snapshot(&d.encode_to_vec()).expect("still a valid snapshot");
    s.check_invariants().expect_err("an invariant is broken")
}

fn coordination(d: &mut pb::StateData) -> &mut pb::coordination::Data {
    d.coordination.as_mut().unwrap()
}

#[test]
fn a_state_built_by_commands_keeps_every_invariant() {
    assert_eq!(sample().check_invariants(), Ok(()));
    assert_eq!(State::new().check_invariants(), Ok(()));
}

#[test]
fn a_pending_barrier_everyone_arrived_at_is_named() {
    let e = broken(|d| {
        let b = coordination(d).barriers.get_mut("b").unwrap();
        b.arrivals.insert(1, 99);
    });
    assert!(e.contains("pending with every participant arrived"), "{e}");
}

#[test]
fn a_failed_barrier_without_its_error_is_named() {
    let e = broken(|d| {
        let b = coordination(d).barriers.get_mut("b").unwrap();
        b.set_status(BarrierStatus::Failed);
    });
    assert!(e.contains("failed without its error"), "{e}");
}

#[test]
fn an_arrival_from_a_non_participant_is_named() {
    let e = broken(|d| {
        let b = coordination(d).barriers.get_mut("b").unwrap();
        b.arrivals.clear();
        b.arrivals.insert(2, 7);
    });
    assert!(e.contains("an arrival from a non-participant"), "{e}");
}

#[test]
fn a_task_in_error_without_its_error_is_named() {
    let e = broken(|d| {
        let t = &mut coordination(d).tasks[2];
        t.set_status(journal::coordination::TaskStatus::Error);
        t.error = None;
    });
    assert!(e.contains("task 2 is in ERROR without its error"), "{e}");
}

#[test]
fn a_key_newer_than_the_store_is_named() {
    let e = broken(|d| {
        let c = coordination(d);
        c.kv.get_mut("a/b").unwrap().mod_revision = c.kv_revision + 1;
    });
    assert!(e.contains("key a/b: revisions out of order"), "{e}");
}

#[test]
fn a_history_ahead_of_the_store_is_named() {
    let e = broken(|d| coordination(d).kv_revision = 0);
    assert!(
        e.contains("revisions out of order") || e.contains("ahead"),
        "{e}"
    );
}

#[test]
fn an_outcome_kept_below_what_its_client_declared_done_is_named() {
    let e = broken(|d| d.sessions.get_mut(&1).unwrap().done_below = 9);
    assert!(e.contains("client 1 keeps an outcome below"), "{e}");
}
