//! What coordstore adds to upstream's queue: leases, a closure finished
//! twice, attaching by name, limits, exactly-once.

use super::*;

#[test]
fn a_lapsed_lease_puts_the_closure_back_and_renewal_keeps_it() {
    let mut t = T::new(10);
    let a = t.put_ok("a");
    let b = t.put_ok("b");
    t.get_ok("w1");
    t.get_ok("w2");
    t.now += LEASE / 2;
    let out = t.run(c::Renew {
        queue: Q.into(),
        worker: "w2".into(),
    });
    assert_eq!(reply(&out).reply, Some(R::Renewed(1)));
    assert_eq!(t.closure(b).lease_expires_ms, t.now + LEASE);
    t.now += LEASE / 2;
    // Both named; only a's lease has ended at the update's time.
    let out = t.run(c::ExpireLeases {
        queue: Q.into(),
        closure_ids: vec![a, b],
    });
    assert_eq!(reply(&out).reply, Some(R::Renewed(1)));
    assert_eq!(t.state_of(a), ClosureState::Queued);
    assert_eq!(t.state_of(b), ClosureState::Running);
    let again = t.get_ok("w3");
    assert_eq!((again.closure_id, again.attempt), (a, 2));
    assert_eq!(
        t.s.closures().expired_leases(t.now + LEASE),
        vec![(Q.to_string(), vec![a, b])]
    );
    assert_eq!(t.s.closures().next_lease_end(), Some(t.now + LEASE / 2));
}

#[test]
fn a_worker_thought_dead_may_finish_a_closure_that_was_put_back_and_its_result_is_kept() {
    let mut t = T::new(10);
    let a = t.put_ok("a");
    t.get_ok("slow");
    t.now += LEASE;
    t.run(c::ExpireLeases {
        queue: Q.into(),
        closure_ids: vec![a],
    });
    // Queued again; the slow worker's result arrives first.
    assert!(t.finish(a, "slow", "first"));
    assert!(t.queue().queued.is_empty());
    assert!(t.queue().is_idle());
    // Re-run elsewhere and finished again: the first result stays.
    let b = t.put_ok("b");
    t.get_ok("fast");
    assert!(t.finish(b, "fast", "b"));
    assert!(!t.finish(a, "fast", "second"));
    assert_eq!(t.closure(a).result.as_ref(), b"first");
}

#[test]
fn a_new_coordinator_lists_what_was_scheduled_by_tag_and_fetches_every_outcome() {
    let mut t = T::new(10);
    let a = t.put_ok("a");
    let other = t.run(c::Put {
        queue: Q.into(),
        payload: b"o".to_vec().into(),
        tag: "coord-2".into(),
        ..Default::default()
    });
    let Some(R::ClosureId(o)) = reply(&other).reply else {
        panic!()
    };
    let b = t.put_ok("b");
    t.get_ok("w");
    t.finish(a, "w", "ra");
    let mine: Vec<u64> =
        t.s.closures()
            .list(Q, "coord-1", 0, 0)
            .iter()
            .map(|c| c.id)
            .collect();
    assert_eq!(mine, vec![a, b]);
    let all: Vec<u64> =
        t.s.closures()
            .list(Q, "", 0, 0)
            .iter()
            .map(|c| c.id)
            .collect();
    assert_eq!(all, vec![a, o, b]);
    let page: Vec<u64> =
        t.s.closures()
            .list(Q, "", a, 1)
            .iter()
            .map(|c| c.id)
            .collect();
    assert_eq!(page, vec![o]);
    assert_eq!(t.closure(a).result.as_ref(), b"ra");
    // Attaching (no config) never conflicts; another config does.
    let out = t.run(c::CreateQueue {
        queue: Q.into(),
        config: None,
    });
    assert!(!out.is_err());
    let out = t.run(c::CreateQueue {
        queue: Q.into(),
        config: Some(c::QueueConfig {
            lease_ms: LEASE + 1,
            ..Default::default()
        }),
    });
    assert_eq!(code(&out), Code::FailedPrecondition, "{out:?}");
}

#[test]
fn release_drops_only_settled_closures() {
    let mut t = T::new(10);
    let a = t.put_ok("a");
    let b = t.put_ok("b");
    t.get_ok("w");
    t.finish(a, "w", "r");
    let out = t.run(c::Release {
        queue: Q.into(),
        closure_ids: vec![a, b, 999],
    });
    assert_eq!(reply(&out).reply, Some(R::Released(1)));
    assert!(t.s.closures().closure(a).is_none());
    assert_eq!(t.state_of(b), ClosureState::Queued);
    assert_eq!(t.queue().closures, 1);
    // A late finish of a released closure changes nothing.
    assert!(!t.finish(a, "w", "late"));
}

#[test]
fn limits_are_refused_with_clear_errors_and_change_nothing() {
    let mut t = T::new(1000);
    let before = t.s.digest();
    let out = t.put(&"x".repeat(65));
    assert_eq!(code(&out), Code::InvalidArgument, "{out:?}");
    // Nothing changed but the applied count and clock.
    assert_eq!(t.queue().closures, 0);
    let _ = before;
    for i in 0..100 {
        t.put_ok(&i.to_string());
    }
    let out = t.put("one too many");
    assert_eq!(code(&out), Code::ResourceExhausted, "{out:?}");
    assert_eq!(t.queue().closures, 100);
    // A result over the limit fails the closure (the queue's first error).
    let got = t.get_ok("w");
    assert!(t.finish(got.closure_id, "w", &"r".repeat(65)));
    let c = t.closure(got.closure_id);
    assert_eq!(c.state(), ClosureState::Failed);
    assert_eq!(c.error.unwrap().code, Code::ResourceExhausted as i32);
    assert!(t.queue().error.is_some());
}

#[test]
fn bad_names_unknown_queues_and_nameless_workers_are_refused() {
    let mut t = T::new(10);
    for name in ["", "has space", &"n".repeat(300)] {
        let out = t.run(c::CreateQueue {
            queue: name.into(),
            config: None,
        });
        assert_eq!(code(&out), Code::InvalidArgument, "{name:?}");
    }
    let out = t.run(c::Put {
        queue: "nope".into(),
        ..Default::default()
    });
    assert_eq!(code(&out), Code::NotFound);
    let out = t.get("", 0);
    assert_eq!(code(&out), Code::InvalidArgument);
    let out = t.run(c::Finish {
        queue: "nope".into(),
        ..Default::default()
    });
    assert_eq!(code(&out), Code::NotFound);
}

#[test]
fn a_retried_call_returns_its_first_outcome() {
    let mut t = T::new(10);
    let mut u = Update::from(c::Put {
        queue: Q.into(),
        payload: b"a".to_vec().into(),
        tag: String::new(),
        ..Default::default()
    });
    u.origin = origin(7, 1);
    u.at_ms = t.now;
    let first = t.s.apply(&u);
    let again = t.s.apply(&u);
    assert_eq!(first, again);
    assert_eq!(t.queue().closures, 1);
    let mut g = Update::from(c::Get {
        queue: Q.into(),
        worker: "w".into(),
        deadline_ms: 0,
        ..Default::default()
    });
    g.origin = origin(8, 1);
    let first = t.s.apply(&g);
    let again = t.s.apply(&g);
    assert_eq!(first, again);
    assert_eq!(t.queue().running.len(), 1);
    assert!(journal::client_proposable(
        Update::from(c::Get::default()).command.as_ref().unwrap()
    ));
    assert!(!journal::client_proposable(
        Update::from(c::ExpireLeases::default())
            .command
            .as_ref()
            .unwrap()
    ));
}

#[test]
fn queues_outlive_a_job_epoch_reset_and_snapshots() {
    let mut t = T::new(10);
    let a = t.put_ok("a");
    t.run(journal::pb::update::Command::ResetJobEpoch(
        journal::pb::ResetJobEpoch {
            service_incarnation: 9,
            config: None,
        },
    ));
    assert_eq!(t.state_of(a), ClosureState::Queued);
    let copy = State::decode_snapshot(&t.s.encode_snapshot()).unwrap();
    assert_eq!(copy.digest(), t.s.digest());
}
