//! Upstream `_CoordinatedClosureQueue`'s rules, one test each.

use super::*;

#[test]
fn get_hands_out_the_oldest_closure_under_a_lease_the_leader_stamps() {
    let mut t = T::new(10);
    let a = t.put_ok("a");
    let b = t.put_ok("b");
    let got = t.get_ok("w1");
    assert_eq!(got.closure_id, a);
    assert_eq!(got.payload.as_ref(), b"a");
    assert_eq!(got.attempt, 1);
    assert_eq!(got.tag, "coord-1");
    assert_eq!(got.lease_expires_ms, t.now + LEASE);
    assert_eq!(t.state_of(a), ClosureState::Running);
    assert_eq!(t.closure(a).worker, "w1");
    assert_eq!(t.get_ok("w2").closure_id, b);
    assert_eq!(t.queue().running.len(), 2);
}

#[test]
fn put_waits_while_the_queue_is_full_and_is_admitted_in_order() {
    let mut t = T::new(2);
    let a = t.put_ok("a");
    t.put_ok("b");
    let out = t.put("c");
    assert!(out.parked, "{out:?}");
    let Some(R::ClosureId(c)) = reply(&out).reply else {
        panic!("{out:?}")
    };
    let d_out = t.put("d");
    let Some(R::ClosureId(d)) = reply(&d_out).reply else {
        panic!()
    };
    assert_eq!(t.state_of(c), ClosureState::Pending);
    assert_eq!(t.state_of(d), ClosureState::Pending);
    // A get frees a slot: the oldest pending put is admitted.
    assert_eq!(t.get_ok("w").closure_id, a);
    assert_eq!(t.state_of(c), ClosureState::Queued);
    assert_eq!(t.state_of(d), ClosureState::Pending);
    assert_eq!(t.queue().queued.len(), 2);
}

#[test]
fn get_with_nothing_queued_waits_and_the_next_put_goes_to_the_oldest_waiter() {
    let mut t = T::new(10);
    let first = t.get("w1", 0);
    assert!(first.parked);
    let second = t.get("w2", 0);
    assert!(second.parked);
    assert_eq!(t.get_answer(first.call_id), None);
    let a = t.put_ok("a");
    assert_eq!(t.get_answer(first.call_id), Some(a));
    assert_eq!(t.closure(a).worker, "w1");
    assert_eq!(t.get_answer(second.call_id), None);
    let b = t.put_ok("b");
    assert_eq!(t.get_answer(second.call_id), Some(b));
    assert!(t.queue().get_waiters.is_empty());
    assert!(t.queue().queued.is_empty());
}

#[test]
fn a_waiter_past_its_deadline_gets_nothing() {
    let mut t = T::new(10);
    let late = t.get("dead", t.now + 100);
    let live = t.get("live", 0);
    t.now += 100;
    let a = t.put_ok("a");
    assert_eq!(t.get_answer(late.call_id), Some(0), "gone");
    assert_eq!(t.get_answer(live.call_id), Some(a));
}

#[test]
fn mark_finished_keeps_the_result_and_a_second_finish_does_not_count() {
    let mut t = T::new(10);
    let a = t.put_ok("a");
    t.get_ok("w1");
    assert!(t.finish(a, "w1", "r1"));
    assert!(!t.finish(a, "w1", "r2"));
    let c = t.closure(a);
    assert_eq!(c.state(), ClosureState::Finished);
    assert_eq!(c.result.as_ref(), b"r1");
    assert!(t.queue().is_idle());
}

#[test]
fn put_back_queues_the_closure_again_at_the_back_and_counts_the_attempt() {
    let mut t = T::new(10);
    let a = t.put_ok("a");
    let b = t.put_ok("b");
    t.get_ok("w1");
    assert!(
        !t.put_back(a, "someone-else"),
        "only its holder puts it back"
    );
    assert!(t.put_back(a, "w1"));
    assert!(!t.put_back(a, "w1"), "not in flight any more");
    assert_eq!(t.state_of(a), ClosureState::Queued);
    assert_eq!(t.get_ok("w2").closure_id, b);
    let again = t.get_ok("w2");
    assert_eq!((again.closure_id, again.attempt), (a, 2));
}

#[test]
fn the_first_error_wins_and_cancels_what_is_queued_and_in_flight() {
    let mut t = T::new(10);
    let a = t.put_ok("a");
    let b = t.put_ok("b");
    let c = t.put_ok("c");
    t.get_ok("w1");
    t.get_ok("w2");
    assert!(t.fail(a, "w1", "boom"));
    let err = t.queue().error.clone().expect("pending error");
    assert_eq!((err.closure_id, err.message.as_str()), (a, "boom"));
    assert_eq!(err.payload.as_ref(), b"pickled");
    assert_eq!(t.queue().generation, 1);
    assert_eq!(t.state_of(a), ClosureState::Failed);
    // b was in flight: out of generation, its late result does not count.
    assert_eq!(t.state_of(b), ClosureState::Cancelled);
    assert!(!t.finish(b, "w2", "late"));
    assert!(!t.fail(b, "w2", "second"));
    assert_eq!(t.state_of(c), ClosureState::Cancelled);
    assert!(t.queue().is_idle());
    assert_eq!(t.queue().error.as_ref().unwrap().message, "boom");
}

#[test]
fn put_raises_the_pending_error_once_and_its_closure_is_cancelled() {
    let mut t = T::new(10);
    let a = t.put_ok("a");
    t.get_ok("w");
    t.fail(a, "w", "boom");
    let out = t.put("x");
    let e = raised(&out).expect("raised");
    assert_eq!(e.message, "boom");
    let Some(R::ClosureId(x)) = reply(&out).reply else {
        panic!()
    };
    assert_eq!(t.state_of(x), ClosureState::Cancelled);
    assert!(t.queue().error.is_none(), "raised errors are cleared");
    let y = t.put_ok("y");
    assert_eq!(t.state_of(y), ClosureState::Queued);
}

#[test]
fn join_is_ready_when_nothing_is_queued_or_in_flight() {
    let mut t = T::new(10);
    assert!(common::join_ready(&t.s, Q));
    let a = t.put_ok("a");
    let b = t.put_ok("b");
    assert!(!common::join_ready(&t.s, Q));
    t.get_ok("w");
    t.finish(a, "w", "r");
    assert!(!common::join_ready(&t.s, Q));
    t.get_ok("w");
    assert!(!common::join_ready(&t.s, Q), "in flight");
    t.finish(b, "w", "r");
    assert!(common::join_ready(&t.s, Q));
    assert_eq!(reply(&t.done()).reply, Some(R::Idle(true)));
}

#[test]
fn join_is_ready_at_the_first_error_which_one_call_raises_and_clears() {
    let mut t = T::new(10);
    let a = t.put_ok("a");
    t.put_ok("b");
    t.get_ok("w");
    t.fail(a, "w", "boom");
    assert!(common::join_ready(&t.s, Q));
    // Two joiners step: the first raises, the second finds the queue idle.
    let first = t.done();
    assert_eq!(raised(&first).expect("raised").message, "boom");
    let second = t.done();
    assert!(raised(&second).is_none());
    assert_eq!(reply(&second).reply, Some(R::Idle(true)));
    assert!(t.queue().error.is_none());
}

#[test]
fn done_raises_the_pending_error_else_answers_idleness() {
    let mut t = T::new(10);
    assert_eq!(reply(&t.done()).reply, Some(R::Idle(true)));
    let a = t.put_ok("a");
    assert_eq!(reply(&t.done()).reply, Some(R::Idle(false)));
    t.get_ok("w");
    assert_eq!(reply(&t.done()).reply, Some(R::Idle(false)));
    t.fail(a, "w", "boom");
    let out = t.done();
    assert_eq!(raised(&out).expect("raised").message, "boom");
    assert_eq!(reply(&t.done()).reply, Some(R::Idle(true)));
}

#[test]
fn a_pending_put_is_cancelled_by_the_first_error() {
    let mut t = T::new(1);
    let a = t.put_ok("a");
    let out = t.put("b");
    assert!(out.parked);
    let Some(R::ClosureId(b)) = reply(&out).reply else {
        panic!()
    };
    t.get_ok("w");
    assert_eq!(t.state_of(b), ClosureState::Queued);
    let out = t.put("c");
    let Some(R::ClosureId(c)) = reply(&out).reply else {
        panic!()
    };
    assert_eq!(t.state_of(c), ClosureState::Pending);
    t.fail(a, "w", "boom");
    assert_eq!(t.state_of(b), ClosureState::Cancelled);
    assert_eq!(t.state_of(c), ClosureState::Cancelled);
    assert!(t.queue().pending.is_empty());
}
