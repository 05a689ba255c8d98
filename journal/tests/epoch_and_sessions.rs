//! Service incarnation, job-epoch reset and exactly-once sessions.
mod common;
use common::*;
use journal::pb::{update::Command, ClusterConfig, JobSpec, ResetJobEpoch};
use journal::{
    coordination::{TaskStatus, REGISTER_BARRIER},
    errors, Code, State, Update,
};

/// Everything a retry must not change (the replicated semantic state).
fn semantic(s: &State) -> String {
    let kv: Vec<(String, Vec<u8>, u64, u64)> = s
        .coordination()
        .kv_all()
        .map(|(k, e)| {
            (
                k.to_string(),
                e.value.to_vec(),
                e.create_revision,
                e.mod_revision,
            )
        })
        .collect();
    let barriers: Vec<String> = s
        .coordination()
        .barriers()
        .map(|(id, b)| format!("{id}={b:?}"))
        .collect();
    let tasks: Vec<String> = (0..s.task_count())
        .map(|t| format!("{:?}", s.coordination().task(t)))
        .collect();
    format!(
        "{kv:?}|{barriers:?}|{tasks:?}|{}|{}|{:?}|{}",
        s.coordination().tasks_version(),
        s.coordination().kv_revision(),
        s.coordination().propagated_error(),
        s.service_incarnation()
    )
}

#[test]
fn init_service_keeps_first_incarnation_and_rejects_other_config() {
    let mut s = new_state(2, &Opts::default());
    let out = apply(&mut s, init(config(2, &Opts::default()), 0xBAD), 5);
    ok(&out);
    assert_eq!(out.service_incarnation(), Some(SVC_INC));
    assert_eq!(s.service_incarnation(), SVC_INC);
    let e = err(
        &apply(&mut s, init(config(3, &Opts::default()), 0xBAD), 6),
        Code::FailedPrecondition,
    );
    contains(
        &e,
        "already configured with a different cluster configuration",
    );
    assert_eq!(s.task_count(), 2);
    assert_eq!(s.service_incarnation(), SVC_INC);
}

#[test]
fn service_incarnation_never_changes_during_a_job() {
    let mut s = cluster(3, Opts::default());
    parked(&apply(&mut s, poll(0), 1500));
    ok(&apply(&mut s, insert("k", "v", false), 1600));
    ok(&apply(&mut s, unhealthy(&[2]), 20_000));
    err(&apply(&mut s, register(1, 1), 21_000), Code::Aborted);
    err(&apply(&mut s, shutdown(0), 22_000), Code::Internal);
    assert_eq!(s.service_incarnation(), SVC_INC);
    assert_eq!(s.epoch(), 0);
}

#[test]
fn job_epoch_reset_clears_everything_and_draws_new_incarnation() {
    let mut s = cluster(3, Opts::default());
    parked(&apply(&mut s, poll(0), 1500));
    ok(&apply(&mut s, insert("k", "v", false), 1600));
    let bc = parked(&apply(&mut s, arrive("b", 0, 60_000, &[], 0), 1700));
    ok(&apply(&mut s, report(1, Code::Internal, "x"), 1800));
    assert!(s.coordination().propagated_error().is_some());
    let v = s.coordination().tasks_version();

    let out = apply(&mut s, reset_epoch(0xE90C, None), 5000);
    ok(&out);
    assert_eq!(out.service_incarnation(), Some(0xE90C));
    assert_eq!(s.service_incarnation(), 0xE90C);
    assert_eq!(s.epoch(), 1);
    assert_eq!(s.coordination().kv_len(), 0);
    assert_eq!(s.coordination().barriers().count(), 0);
    assert!(s.coordination().propagated_error().is_none());
    assert_eq!(statuses(&s), vec![TaskStatus::Disconnected; 3]);
    assert!(
        s.coordination().tasks_version() > v,
        "watchers see the reset"
    );
    // A parked barrier of the previous epoch is told so.
    let e = barrier_result(&s, "b", 0, bc).unwrap().unwrap_err();
    assert_eq!(e, errors::epoch_reset());
    code_is(&e, Code::Aborted);
    // The new job registers through a fresh registration barrier.
    parked(&apply(&mut s, register(0, 1), 6000));
    assert!(s.coordination().barrier(REGISTER_BARRIER).is_some());
    parked(&apply(&mut s, register(1, 2), 6000));
    let last = apply(&mut s, register(2, 3), 6000);
    assert_eq!(last.registered(), Some(0xE90C));
    // Nobody has polled in the new epoch: an error sets everyone to ERROR.
    ok(&apply(&mut s, report(2, Code::Internal, "y"), 7000));
    assert_eq!(statuses(&s), vec![TaskStatus::Error; 3]);
}

#[test]
fn job_epoch_reset_may_install_a_new_config() {
    let mut s = cluster(2, Opts::default());
    ok(&apply(
        &mut s,
        reset_epoch(77, Some(config(4, &Opts::recoverable()))),
        5000,
    ));
    assert_eq!(s.task_count(), 4);
    assert!(s.config().unwrap().recoverable);
    assert_eq!(s.service_incarnation(), 77);
}

#[test]
fn retried_update_returns_recorded_outcome_and_changes_nothing() {
    let mut s = cluster(2, Opts::default());
    let first = apply_from(&mut s, 7, 1, incr("n", 5), 2000);
    assert_eq!(first.incremented().unwrap(), 5);
    let before = semantic(&s);
    let again = apply_from(&mut s, 7, 1, incr("n", 5), 2001);
    assert_eq!(again, first);
    assert_eq!(semantic(&s), before);
    assert_eq!(s.coordination().kv_get("n").unwrap().as_ref(), b"5");

    ok(&apply_from(&mut s, 7, 2, insert("k", "v", false), 2002));
    ok(&apply_from(&mut s, 7, 2, insert("k", "v", false), 2003));
    // Without an origin the same insert is a real second insert.
    err(
        &apply(&mut s, insert("k", "v", false), 2004),
        Code::AlreadyExists,
    );
}

#[test]
fn retried_failure_returns_the_recorded_domain_error() {
    let mut s = cluster(2, Opts::default());
    parked(&apply(&mut s, arrive("b", 0, 60_000, &[0, 1], 0), 2000));
    let first = apply_from(&mut s, 9, 1, arrive("b", 0, 60_000, &[0], 1), 2100);
    let e = err(&first, Code::InvalidArgument);
    assert_eq!(e.barrier.as_ref().unwrap().id, "b");
    let before = semantic(&s);
    assert_eq!(
        apply_from(&mut s, 9, 1, arrive("b", 0, 60_000, &[0], 1), 2200),
        first
    );
    assert_eq!(semantic(&s), before);
}

#[test]
fn retried_parked_call_returns_same_call_id() {
    let mut s = cluster(2, Opts::default());
    let first = apply_from(&mut s, 3, 10, arrive("b", 0, 60_000, &[], 0), 2000);
    let id = parked(&first);
    let again = apply_from(&mut s, 3, 10, arrive("b", 0, 60_000, &[], 0), 2100);
    assert_eq!(again, first);
    // Not a second arrival: the first call was not superseded.
    ok(&apply(&mut s, arrive("b", 0, 60_000, &[], 1), 2200));
    assert_eq!(barrier_result(&s, "b", 0, id), Some(Ok(0)));
}

#[test]
fn sessions_of_different_clients_are_independent() {
    let mut s = State::new();
    assert_eq!(
        apply_from(&mut s, 1, 1, incr("n", 1), 0)
            .incremented()
            .unwrap(),
        1
    );
    assert_eq!(
        apply_from(&mut s, 2, 1, incr("n", 1), 0)
            .incremented()
            .unwrap(),
        2
    );
    assert_eq!(
        apply_from(&mut s, 1, 1, incr("n", 1), 0)
            .incremented()
            .unwrap(),
        1
    );
    assert_eq!(s.session_count(), 2);
}

#[test]
fn client_table_is_bounded_and_evicts_least_recently_used() {
    let o = Opts {
        max_client_sessions: 2,
        ..Default::default()
    };
    let mut s = new_state(1, &o);
    apply_from(&mut s, 1, 1, incr("n", 1), 0);
    apply_from(&mut s, 2, 1, incr("n", 1), 0);
    // Touch client 1 so that client 2 is the least recently used.
    assert_eq!(
        apply_from(&mut s, 1, 1, incr("n", 1), 0)
            .incremented()
            .unwrap(),
        1
    );
    apply_from(&mut s, 3, 1, incr("n", 1), 0);
    assert_eq!(s.session_count(), 2);
    assert_eq!(s.coordination().kv_get("n").unwrap().as_ref(), b"3");
    // Client 1 is still remembered, client 2 was forgotten (applies again).
    assert_eq!(
        apply_from(&mut s, 1, 1, incr("n", 1), 0)
            .incremented()
            .unwrap(),
        1
    );
    assert_eq!(
        apply_from(&mut s, 2, 1, incr("n", 1), 0)
            .incremented()
            .unwrap(),
        4
    );
    assert!(s.session_count() <= 2);
}

#[test]
fn outcomes_per_client_are_bounded_and_retries_older_than_the_window_apply_again() {
    let o = Opts {
        max_outcomes_per_client: 4,
        ..Default::default()
    };
    let mut s = new_state(1, &o);
    for seq in 1..=10 {
        assert_eq!(
            apply_from(&mut s, 5, seq, incr("n", 1), 0)
                .incremented()
                .unwrap(),
            seq as i64
        );
    }
    // The newest 4 are replayed.
    assert_eq!(
        apply_from(&mut s, 5, 7, incr("n", 1), 0)
            .incremented()
            .unwrap(),
        7
    );
    // A retry older than the window is applied again (documented trade-off:
    // refusing it would fail calls that may never have been applied).
    assert_eq!(
        apply_from(&mut s, 5, 2, incr("n", 1), 0)
            .incremented()
            .unwrap(),
        11
    );
    assert_eq!(s.coordination().kv_get("n").unwrap().as_ref(), b"11");
}

#[test]
fn an_oversized_or_duplicate_job_configuration_is_refused_without_change() {
    let mut s = new_state(2, &Opts::default());
    let before = s.digest();
    let huge = ClusterConfig {
        jobs: vec![JobSpec {
            name: "w".into(),
            count: u32::MAX,
        }],
        ..Default::default()
    };
    let e = err(
        &apply(
            &mut s,
            Command::ResetJobEpoch(ResetJobEpoch {
                service_incarnation: 5,
                config: Some(huge),
            }),
            0,
        ),
        Code::InvalidArgument,
    );
    contains(&e, "exceed the limit");
    let twice = ClusterConfig {
        jobs: vec![
            JobSpec {
                name: "w".into(),
                count: 1,
            },
            JobSpec {
                name: "w".into(),
                count: 1,
            },
        ],
        ..Default::default()
    };
    let e = err(
        &apply(
            &mut s,
            Command::ResetJobEpoch(ResetJobEpoch {
                service_incarnation: 5,
                config: Some(twice),
            }),
            0,
        ),
        Code::InvalidArgument,
    );
    contains(&e, "listed twice");
    // Nothing changed but the applied counter.
    assert_eq!(s.task_count(), 2);
    assert_ne!(s.digest(), before); // `applied` counts every update
    assert_eq!(s.epoch(), 0);
}

#[test]
fn a_command_naming_tasks_of_an_earlier_epoch_is_refused_without_change() {
    // Task 1 of a 2-task job; the job is reset to a 4-task layout in which
    // index 1 is another task. A report resolved before the reset must not
    // land on it.
    let mut s = cluster(2, Opts::default());
    let before = s.epoch();
    ok(&apply(
        &mut s,
        reset_epoch(0xE90C, Some(config(4, &Opts::default()))),
        3000,
    ));
    let snapshot = s.clone();
    let stale = s.apply(&Update {
        namespace: String::new(),
        origin: None,
        at_ms: 3100,
        epoch: Some(before),
        command: Some(report(1, Code::Internal, "from the old job")),
    });
    let e = stale.error.expect("refused");
    assert_eq!(e.code, Code::Aborted as i32);
    assert!(
        e.message.contains(&format!(
            "named its tasks in job epoch {before}, but the job epoch is now {}",
            before + 1
        )),
        "{}",
        e.message
    );
    // Nothing changed but the applied counter and the clock.
    assert_eq!(s.coordination().task(1), snapshot.coordination().task(1));
    assert_eq!(
        s.coordination().propagated_error(),
        snapshot.coordination().propagated_error()
    );
    // The same command named in the current epoch applies (task 1 is not
    // connected in the new job: the ordinary answer).
    let current = s.apply(&Update {
        namespace: String::new(),
        origin: None,
        at_ms: 3200,
        epoch: Some(before + 1),
        command: Some(report(1, Code::Internal, "x")),
    });
    assert_ne!(
        current.error.map(|e| e.code),
        Some(Code::Aborted as i32),
        "not refused as stale"
    );
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(32))]

    /// Which clients the table remembers, against a model that scans every
    /// session for the least recently used one (as the table once did):
    /// random clients call at random times, some calls retried, the state
    /// sometimes restored from its snapshot (the recency index is derived
    /// again), clients older than the horizon swept.
    #[test]
    fn the_remembered_clients_are_the_most_recently_heard(
        calls in proptest::collection::vec((0u64..12, 0u64..3, proptest::bool::ANY), 1..1500),
    ) {
        let o = Opts {
            max_client_sessions: 4,
            session_horizon_ms: 5_000,
            ..Default::default()
        };
        let mut s = new_state(1, &o);
        let mut seq = std::collections::BTreeMap::<u64, u64>::new();
        // The model: client → (applied index it was last heard at, at_ms).
        let mut model = std::collections::BTreeMap::<u64, (u64, u64)>::new();
        let mut at = 0;
        for (i, (client, step, restore)) in calls.into_iter().enumerate() {
            at += step * 1_000;
            let next = seq.entry(client + 1).or_insert(0);
            *next += 1;
            let applied = i as u64 + 2; // the init was applied first
            if applied.is_multiple_of(journal::SESSION_SWEEP_EVERY) {
                model.retain(|_, (_, ms)| *ms + 5_000 >= at);
            }
            apply_from(&mut s, client + 1, *next, incr("n", 1), at);
            model.insert(client + 1, (applied, at));
            while model.len() > 4 {
                let oldest = model.iter().min_by_key(|(id, (t, _))| (*t, **id)).map(|(id, _)| *id);
                model.remove(&oldest.unwrap());
            }
            proptest::prop_assert_eq!(s.session_count(), model.len());
            proptest::prop_assert_eq!(s.check_invariants(), Ok(()));
            if restore && i % 64 == 0 {
                let r = State::decode_snapshot(&s.encode_snapshot()).unwrap();
                proptest::prop_assert!(r == s, "a restored state differs");
                s = r;
            }
        }
        // A remembered client's retry is answered from its record; a
        // forgotten one's applies again.
        for (client, last) in seq {
            let mut t = s.clone();
            let before = t.coordination().kv_get("n").unwrap().to_vec();
            apply_from(&mut t, client, last, incr("n", 1), at);
            let changed = t.coordination().kv_get("n").unwrap().to_vec() != before;
            proptest::prop_assert_eq!(changed, !model.contains_key(&client), "client {}", client);
        }
    }
}
