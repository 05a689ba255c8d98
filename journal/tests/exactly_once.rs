//! The exactly-once table: how long an outcome is kept depends on its own
//! client (what it declared done) and on time, never on anyone else's
//! traffic; a late copy of a request declared done is refused, not applied.
mod common;
use common::*;
use journal::{Code, State, DEFAULT_SESSION_HORIZON_MS, SESSION_SWEEP_EVERY};
use proptest::prelude::*;

fn counter(s: &State, key: &str) -> i64 {
    s.coordination()
        .kv_get(key)
        .map(|v| std::str::from_utf8(v).unwrap().parse().unwrap())
        .unwrap_or(0)
}

/// Traffic from other clients: `lanes` clients that keep one call in flight
/// and declare the previous one done (as nodes, relays and agents do), and
/// `free` clients that never declare anything done, `volume` updates in all,
/// spread over `span_ms` of leader clock from `t0`.
fn other_traffic(s: &mut State, volume: u64, lanes: u64, free: u64, t0: u64, span_ms: u64) {
    let mut seqs = vec![0u64; (lanes + free) as usize];
    for i in 0..volume {
        let c = i % (lanes + free);
        seqs[c as usize] += 1;
        let seq = seqs[c as usize];
        let done = if c < lanes { seq } else { 0 };
        let at = t0 + span_ms * i / volume.max(1);
        let out = apply_done(s, 1000 + c, seq, done, incr("other", 1), at);
        assert!(!out.is_err(), "{out:?}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]

    /// A retry inside the horizon returns the first outcome, whatever the
    /// volume and mix of other traffic in between.
    #[test]
    fn a_retry_inside_the_horizon_is_never_reapplied_under_any_volume_of_other_traffic(
        volume in prop_oneof![Just(0u64), 1u64..5_000, Just(60_000u64)],
        lanes in 1u64..64,
        free in 0u64..4,
        declared in any::<bool>(),
    ) {
        let mut s = new_state(1, &Opts::default());
        let done = if declared { 1 } else { 0 };
        let first = apply_done(&mut s, 7, 1, done, incr("mine", 1), 1_000);
        prop_assert_eq!(first.incremented().unwrap(), 1);
        // Everything else happens within the horizon.
        other_traffic(&mut s, volume, lanes, free, 1_000, DEFAULT_SESSION_HORIZON_MS - 10);
        let again = apply_done(&mut s, 7, 1, done, incr("mine", 1), DEFAULT_SESSION_HORIZON_MS);
        prop_assert_eq!(again, first);
        prop_assert_eq!(counter(&s, "mine"), 1);
        prop_assert_eq!(counter(&s, "other"), volume as i64);
    }
}

#[test]
fn a_late_copy_of_a_request_declared_done_is_refused_and_not_applied() {
    let mut s = new_state(1, &Opts::default());
    assert_eq!(
        apply_done(&mut s, 7, 1, 1, incr("n", 1), 10)
            .incremented()
            .unwrap(),
        1
    );
    // The client moved on: seq 2 declares seq 1 done.
    assert_eq!(
        apply_done(&mut s, 7, 2, 2, incr("n", 1), 20)
            .incremented()
            .unwrap(),
        2
    );
    // A copy of seq 1 still travelling (a retry the sender gave up on).
    let late = apply_done(&mut s, 7, 1, 1, incr("n", 1), 30);
    let e = err(&late, Code::Aborted);
    contains(&e, "7:1 was already answered or given up");
    assert_eq!(counter(&s, "n"), 2);
    // Seq 2 itself is still replayed.
    assert_eq!(
        apply_done(&mut s, 7, 2, 2, incr("n", 1), 40)
            .incremented()
            .unwrap(),
        2
    );
}

#[test]
fn a_request_cannot_declare_itself_done() {
    let mut s = new_state(1, &Opts::default());
    // done_below beyond its own seq counts only up to its seq.
    assert_eq!(
        apply_done(&mut s, 7, 3, 9, incr("n", 1), 10)
            .incremented()
            .unwrap(),
        1
    );
    assert_eq!(
        apply_done(&mut s, 7, 3, 9, incr("n", 1), 20)
            .incremented()
            .unwrap(),
        1
    );
    assert_eq!(
        apply_done(&mut s, 7, 4, 4, incr("n", 1), 30)
            .incremented()
            .unwrap(),
        2
    );
}

#[test]
fn outcomes_declared_done_are_dropped() {
    let mut s = new_state(1, &Opts::default());
    let held = s.outcomes_held();
    for seq in 1..=500 {
        apply_done(&mut s, 7, seq, seq, incr("n", 1), seq);
    }
    // One call in flight per client: one outcome held.
    assert_eq!(s.outcomes_held(), held + 1);
    // A client that declares nothing keeps its newest outcomes (bounded).
    for seq in 1..=500 {
        apply_done(&mut s, 8, seq, 0, incr("n", 1), 1_000 + seq);
    }
    assert_eq!(s.outcomes_held(), held + 1 + 500);
}

#[test]
fn a_client_unheard_of_for_the_horizon_is_forgotten() {
    let o = Opts {
        session_horizon_ms: 60_000,
        ..Default::default()
    };
    let mut s = new_state(1, &o);
    assert_eq!(
        apply_done(&mut s, 7, 1, 1, incr("n", 1), 1_000)
            .incremented()
            .unwrap(),
        1
    );
    // Past the horizon, the next sweep forgets client 7 (and keeps the
    // clients heard of since).
    other_traffic(&mut s, SESSION_SWEEP_EVERY, 4, 0, 62_000, 10);
    assert_eq!(s.session_count(), 4);
    // Client 8 was heard of just inside the horizon and stays.
    let mut s = new_state(1, &o);
    apply_done(&mut s, 7, 1, 1, incr("n", 1), 1_000);
    apply_done(&mut s, 8, 1, 1, incr("n", 1), 59_000);
    other_traffic(&mut s, SESSION_SWEEP_EVERY, 4, 0, 62_000, 10);
    assert_eq!(s.session_count(), 5);
}

#[test]
fn the_table_survives_a_snapshot() {
    let mut s = new_state(1, &Opts::default());
    apply_done(&mut s, 7, 1, 1, incr("n", 1), 10);
    apply_done(&mut s, 7, 2, 2, incr("n", 1), 20);
    let mut r = State::decode_snapshot(&s.encode_snapshot()).unwrap();
    assert_eq!(r.digest(), s.digest());
    // Replayed and refused exactly as before the snapshot.
    assert_eq!(
        apply_done(&mut r, 7, 2, 2, incr("n", 1), 30)
            .incremented()
            .unwrap(),
        2
    );
    err(
        &apply_done(&mut r, 7, 1, 1, incr("n", 1), 30),
        Code::Aborted,
    );
    assert_eq!(counter(&r, "n"), 2);
}
