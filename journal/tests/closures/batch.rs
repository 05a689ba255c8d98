//! Batched calls: one put of many closures, a get of several, a finish of
//! several — each the same as the single calls in a row, in one update.

use super::*;

fn ids(out: &Outcome) -> u64 {
    match reply(out).reply {
        Some(R::ClosureId(id)) => id,
        other => panic!("{other:?} {out:?}"),
    }
}

#[test]
fn one_put_schedules_many_closures_with_consecutive_ids_in_order() {
    let mut t = T::new(3);
    let out = t.put_many("p", 5);
    assert!(!out.is_err(), "{out:?}");
    let first = ids(&out);
    // Three fit; two wait as pending, so the put is parked.
    assert!(out.parked);
    for (i, id) in (first..first + 5).enumerate() {
        let c = t.closure(id);
        assert_eq!(c.payload.as_ref(), format!("p-{i}").as_bytes());
        assert_eq!(c.tag, "coord-1");
        let want = if i < 3 {
            ClosureState::Queued
        } else {
            ClosureState::Pending
        };
        assert_eq!(c.state(), want, "closure {i}");
    }
    assert_eq!(t.queue().closures, 5);
    // The next put's ids follow (it waits too).
    assert_eq!(ids(&t.put("after")), first + 5);
    // Handed out in put order.
    let got: Vec<u64> = (0..3).map(|_| t.get_ok("w").closure_id).collect();
    assert_eq!(got, vec![first, first + 1, first + 2]);
    assert_eq!(t.state_of(first + 3), ClosureState::Queued);
    assert_eq!(t.state_of(first + 5), ClosureState::Queued);
}

#[test]
fn a_put_with_one_bad_closure_or_too_many_is_refused_whole() {
    let mut t = T::new(1000);
    let digest = t.s.closures().list(Q, "", 0, 0).len();
    let out = t.run(c::Put {
        queue: Q.into(),
        payload: b"ok".to_vec().into(),
        tag: String::new(),
        more_payloads: vec![b"ok".to_vec().into(), "x".repeat(65).into_bytes().into()],
    });
    assert_eq!(code(&out), Code::InvalidArgument, "{out:?}");
    assert_eq!(t.queue().closures, 0);
    assert_eq!(t.s.closures().list(Q, "", 0, 0).len(), digest);
    // 100 records at most: 98 + a put of 3 is refused whole.
    assert!(!t.put_many("a", 98).is_err());
    let out = t.put_many("b", 3);
    assert_eq!(code(&out), Code::ResourceExhausted, "{out:?}");
    assert_eq!(t.queue().closures, 98);
    assert!(!t.put_many("c", 2).is_err());
}

#[test]
fn a_put_of_many_raises_the_pending_error_once_and_all_are_cancelled() {
    let mut t = T::new(10);
    let a = t.put_ok("a");
    t.get_ok("w");
    assert!(t.fail(a, "w", "boom"));
    let out = t.put_many("late", 3);
    let first = ids(&out);
    assert_eq!(raised(&out).map(|e| e.closure_id), Some(a));
    for id in first..first + 3 {
        assert_eq!(t.state_of(id), ClosureState::Cancelled);
    }
    // Raised once.
    let out = t.put_many("next", 2);
    assert_eq!(raised(&out), None);
}

#[test]
fn a_get_of_several_leases_each_and_a_waiter_is_handed_one() {
    let mut t = T::new(10);
    let first = ids(&t.put_many("p", 4));
    let out = t.run(c::Get {
        queue: Q.into(),
        worker: "w".into(),
        max_closures: 3,
        ..Default::default()
    });
    let r = reply(&out);
    let Some(R::Assigned(a)) = r.reply else {
        panic!("{out:?}")
    };
    let got: Vec<u64> = std::iter::once(&a)
        .chain(&r.more_assigned)
        .map(|a| a.closure_id)
        .collect();
    assert_eq!(got, vec![first, first + 1, first + 2]);
    for a in std::iter::once(&a).chain(&r.more_assigned) {
        assert_eq!(a.lease_expires_ms, t.now + LEASE);
        assert_eq!(t.closure(a.closure_id).worker, "w");
    }
    // Fewer queued than asked: what there is.
    let out = t.run(c::Get {
        queue: Q.into(),
        worker: "v".into(),
        max_closures: 3,
        ..Default::default()
    });
    assert!(reply(&out).more_assigned.is_empty());
    // Nothing queued: a waiter, handed one closure by the next put.
    let out = t.run(c::Get {
        queue: Q.into(),
        worker: "u".into(),
        max_closures: 3,
        ..Default::default()
    });
    assert!(out.parked);
    let next = ids(&t.put_many("q", 2));
    assert_eq!(t.get_answer(out.call_id), Some(next));
    assert_eq!(t.state_of(next + 1), ClosureState::Queued);
    // A lapsed lease puts back each closure of the batch.
    t.now += LEASE;
    t.run(c::ExpireLeases {
        queue: Q.into(),
        closure_ids: vec![first, first + 1, first + 2],
    });
    for id in first..first + 3 {
        assert_eq!(t.state_of(id), ClosureState::Queued);
    }
}

#[test]
fn a_finish_of_several_settles_each_in_order() {
    let mut t = T::new(10);
    let first = ids(&t.put_many("p", 4));
    for _ in 0..4 {
        t.get_ok("w");
    }
    assert!(t.finish(first, "w", "done"));
    let got = t.finish_many(
        "w",
        &[
            (first + 1, "one".into()),
            // Already finished: not accepted, first result kept.
            (first, "again".into()),
            // Too large: fails the closure (the queue's first error)...
            (first + 2, "r".repeat(65)),
            // ...which cancels the one still in flight.
            (first + 3, "three".into()),
        ],
    );
    assert_eq!(got, vec![true, false, true, false]);
    assert_eq!(t.closure(first).result.as_ref(), b"done");
    assert_eq!(t.closure(first + 1).result.as_ref(), b"one");
    assert_eq!(t.state_of(first + 2), ClosureState::Failed);
    assert_eq!(t.state_of(first + 3), ClosureState::Cancelled);
}
