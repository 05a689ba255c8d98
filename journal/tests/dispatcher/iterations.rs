//! Jobs, iterations, clients and garbage collection.

use crate::common::{err, ok};
use crate::*;
use journal::Code;

#[test]
fn jobs_named_are_shared_and_anonymous_ones_never_are() {
    let mut s = state();
    let ds = register(&mut s, "g", "m");
    let a = new_job(&mut s, &ds, None);
    let b = new_job(&mut s, &ds, None);
    assert_eq!((a, b), (5000, 5001));
    assert_ne!(
        s.dispatcher().job(a).unwrap().name,
        s.dispatcher().job(b).unwrap().name
    );
    assert_eq!(s.dispatcher().job(a).unwrap().name, "anonymous_job_5000_77");
    let named = new_job(&mut s, &ds, Some("shared"));
    assert_eq!(new_job(&mut s, &ds, Some("shared")), named);
    let mut other = job(&ds, Some("shared"), 1);
    other.sharding_policy = 3;
    let e = err(&run(&mut s, other, 1), Code::InvalidArgument);
    assert!(e.message.contains("different parameters"), "{}", e.message);
}

#[test]
fn a_job_needs_a_known_dataset_and_dynamic_sharding_is_refused() {
    let mut s = state();
    let e = err(&run(&mut s, job("nope", None, 1), 1), Code::NotFound);
    assert_eq!(e.message, "Dataset id nope not found");
    let ds = register(&mut s, "g", "m");
    let mut dynamic = job(&ds, None, 1);
    dynamic.sharding_policy = journal::dispatcher::SHARDING_DYNAMIC;
    err(&run(&mut s, dynamic, 1), Code::Unimplemented);
    assert_eq!(s.dispatcher().jobs().count(), 0);
}

#[test]
fn an_iteration_has_one_task_per_worker_and_clients_join_it() {
    let mut s = state();
    ok(&run(&mut s, worker("w2:1"), 1));
    ok(&run(&mut s, worker("w1:1"), 1));
    let ds = register(&mut s, "g", "m");
    let j = new_job(&mut s, &ds, Some("j"));
    let e = err(
        &run(
            &mut s,
            d::GetOrCreateIteration {
                job_id: 9,
                repetition: 1,
            },
            1,
        ),
        Code::NotFound,
    );
    assert_eq!(e.message, "Job with id 9 not found");
    let (c1, it, created) = iterate(&mut s, j, 1);
    assert_eq!((c1, it, created), (3000, 2000, true));
    let (c2, it2, created2) = iterate(&mut s, j, 1);
    assert_eq!((c2, it2, created2), (3001, 2000, false));
    let r = s.dispatcher();
    let iteration = r.iteration(it).unwrap();
    assert_eq!(iteration.num_clients, 2);
    let tasks: Vec<(i64, &str)> = r
        .iteration_tasks(iteration)
        .iter()
        .map(|t| (t.id, t.worker_address.as_str()))
        .collect();
    assert_eq!(tasks, vec![(4000, "w1:1"), (4001, "w2:1")]);
    assert_eq!(r.client_iteration(c2).unwrap().id, it);
    // The next repetition is a new iteration with new tasks.
    let (_, it3, created3) = iterate(&mut s, j, 2);
    assert!(created3 && it3 == 2001);
    assert_eq!(
        s.dispatcher().iteration(it3).unwrap().tasks,
        vec![4002, 4003]
    );
}

#[test]
fn finishing_every_task_finishes_the_iteration_and_unknown_ids_are_ignored() {
    let mut s = state();
    ok(&run(&mut s, worker("a:1"), 1));
    ok(&run(&mut s, worker("b:1"), 1));
    let ds = register(&mut s, "g", "m");
    let j = new_job(&mut s, &ds, None);
    let (_, it, _) = iterate(&mut s, j, 1);
    ok(&run(
        &mut s,
        d::FinishTasks {
            task_ids: vec![4000, 99],
        },
        1,
    ));
    assert!(!s.dispatcher().iteration(it).unwrap().finished);
    assert!(s.dispatcher().task(4000).unwrap().finished);
    ok(&run(
        &mut s,
        d::FinishTasks {
            task_ids: vec![4001],
        },
        1,
    ));
    assert!(s.dispatcher().iteration(it).unwrap().finished);
}

#[test]
fn releasing_clients_and_garbage_collection() {
    let mut s = state();
    ok(&run(&mut s, worker("a:1"), 1));
    let ds = register(&mut s, "g", "m");
    let j = new_job(&mut s, &ds, Some("j"));
    let (c, it, _) = iterate(&mut s, j, 1);
    let release = |id| d::ReleaseIterationClient {
        iteration_client_id: id,
    };
    let e = err(&run(&mut s, release(42), 5), Code::NotFound);
    assert_eq!(e.message, "Iteration client id not found: 42");
    ok(&run(&mut s, release(c), 7_000));
    let iteration = s.dispatcher().iteration(it).unwrap().clone();
    assert_eq!(
        (iteration.num_clients, iteration.last_released_ms),
        (0, 7_000)
    );
    assert!(s.dispatcher().client_iteration(c).is_none());
    // A GC decided on an older release time changes nothing.
    let gc = |at| d::GarbageCollectIteration {
        iteration_id: it,
        released_at_ms: at,
    };
    ok(&run(&mut s, gc(6_000), 400_000));
    assert!(!s.dispatcher().iteration(it).unwrap().garbage_collected);
    ok(&run(&mut s, gc(7_000), 400_000));
    let gone = s.dispatcher().iteration(it).unwrap();
    assert!(gone.garbage_collected && gone.finished);
    assert!(s.dispatcher().task(4000).unwrap().finished);
    // The same key now starts a fresh iteration.
    let (_, fresh, created) = iterate(&mut s, j, 1);
    assert!(created && fresh != it);
}

#[test]
fn an_iteration_with_a_client_is_not_collected() {
    let mut s = state();
    let ds = register(&mut s, "g", "m");
    let j = new_job(&mut s, &ds, None);
    let (c1, it, _) = iterate(&mut s, j, 1);
    iterate(&mut s, j, 1);
    ok(&run(
        &mut s,
        d::ReleaseIterationClient {
            iteration_client_id: c1,
        },
        10,
    ));
    ok(&run(
        &mut s,
        d::GarbageCollectIteration {
            iteration_id: it,
            released_at_ms: 10,
        },
        1_000_000,
    ));
    assert!(!s.dispatcher().iteration(it).unwrap().garbage_collected);
}

#[test]
fn garbage_collection_is_the_leaders_and_the_state_survives_a_snapshot() {
    let gc = journal::pb::update::Command::from(d::GarbageCollectIteration {
        iteration_id: 1,
        released_at_ms: 1,
    });
    assert!(!journal::client_proposable(&gc));
    let reg = journal::pb::update::Command::from(d::FinishTasks { task_ids: vec![] });
    assert!(journal::client_proposable(&reg));
    let mut s = state();
    ok(&run(&mut s, worker("a:1"), 1));
    let ds = register(&mut s, "g", "m");
    let j = new_job(&mut s, &ds, None);
    iterate(&mut s, j, 1);
    let back = State::decode_snapshot(&s.encode_snapshot()).unwrap();
    assert_eq!(back.digest(), s.digest());
    assert_eq!(back.dispatcher().tasks().count(), 1);
}

#[test]
fn dynamic_splits_are_handed_out_once_per_repetition() {
    let mut s = state();
    ok(&run(&mut s, worker("a:1"), 1));
    let ds = register(&mut s, "g", "m");
    let mut dynamic = job(&ds, Some("dyn"), 1);
    dynamic.sharding_policy = journal::dispatcher::SHARDING_DYNAMIC;
    dynamic.split_source = Some(d::SplitSource {
        start: 10,
        step: 5,
        count: 3,
    });
    let j = run(&mut s, dynamic, 1).job_id().unwrap();
    let (_, it, _) = iterate(&mut s, j, 1);
    let split = |s: &mut State, repetition| {
        run(
            s,
            d::ProduceSplit {
                iteration_id: it,
                repetition,
                provider_index: 0,
            },
            1,
        )
        .split()
        .map(|x| (!x.end_of_splits).then_some(x.value))
    };
    let got: Vec<Option<Option<i64>>> = (0..4).map(|_| split(&mut s, 0)).collect();
    assert_eq!(
        got,
        vec![Some(Some(10)), Some(Some(15)), Some(Some(20)), Some(None)]
    );
    // The repetition ended: a late request for it gets the end again; the
    // next repetition starts over.
    assert_eq!(split(&mut s, 0), Some(None));
    assert_eq!(split(&mut s, 1), Some(Some(10)));
    // A jump ahead starts that repetition.
    assert_eq!(split(&mut s, 5), Some(Some(10)));
    assert_eq!(split(&mut s, 5), Some(Some(15)));
    let bad = run(
        &mut s,
        d::ProduceSplit {
            iteration_id: it,
            repetition: 5,
            provider_index: 1,
        },
        1,
    );
    err(&bad, Code::InvalidArgument);
    // A DYNAMIC iteration is never collected; an OFF one has no splits.
    ok(&run(
        &mut s,
        d::ReleaseIterationClient {
            iteration_client_id: 3000,
        },
        5,
    ));
    ok(&run(
        &mut s,
        d::GarbageCollectIteration {
            iteration_id: it,
            released_at_ms: 5,
        },
        1_000_000,
    ));
    assert!(!s.dispatcher().iteration(it).unwrap().garbage_collected);
    let off = new_job(&mut s, &ds, None);
    let (_, off_it, _) = iterate(&mut s, off, 1);
    let e = err(
        &run(
            &mut s,
            d::ProduceSplit {
                iteration_id: off_it,
                repetition: 0,
                provider_index: 0,
            },
            1,
        ),
        Code::FailedPrecondition,
    );
    assert!(e.message.contains("DYNAMIC"), "{}", e.message);
    err(
        &run(
            &mut s,
            d::ProduceSplit {
                iteration_id: 1,
                repetition: 0,
                provider_index: 0,
            },
            1,
        ),
        Code::NotFound,
    );
}
