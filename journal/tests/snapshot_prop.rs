//! Snapshots: encode/decode of the whole state and the replay property.
mod common;
use common::*;
use journal::pb::{self, update::Command, Origin};
use journal::{Code, State, Update};
use proptest::prelude::*;
use prost::Message;

fn busy_state() -> State {
    let mut s = cluster(3, Opts::default());
    parked(&apply(&mut s, poll(0), 1500));
    ok(&apply(&mut s, insert("a/b", "1", false), 1600));
    apply_from(&mut s, 1, 1, incr("n", 2), 1700);
    parked(&apply(&mut s, arrive("b", 0, 5000, &[0, 1], 0), 1800));
    parked(&apply(&mut s, alive(0, &[0, 1, 2]), 1900));
    ok(&apply(&mut s, report(2, Code::Internal, "x"), 2000));
    s
}

#[test]
fn snapshot_roundtrip_keeps_state_and_digest() {
    let s = busy_state();
    let bytes = s.encode_snapshot();
    let r = State::decode_snapshot(&bytes).expect("decodes");
    assert_eq!(r, s);
    assert_eq!(r.digest(), s.digest());
    assert_eq!(r.digest_hex().len(), 64);
    assert_eq!(r.coordination().kv_get("a/b").unwrap().as_ref(), b"1");
    assert_eq!(
        r.coordination().propagated_error(),
        s.coordination().propagated_error()
    );
    // The restored session table still de-duplicates.
    let mut r = r;
    assert_eq!(
        apply_from(&mut r, 1, 1, incr("n", 2), 3000)
            .incremented()
            .unwrap(),
        2
    );
    assert_eq!(r.coordination().kv_get("n").unwrap().as_ref(), b"2");
}

#[test]
fn digest_differs_when_state_differs() {
    let s = busy_state();
    let mut t = s.clone();
    ok(&apply(&mut t, insert("other", "v", false), 3000));
    assert_ne!(s.digest(), t.digest());
}

#[test]
fn garbage_snapshot_is_rejected() {
    assert!(State::decode_snapshot(&[0xff, 0xff, 0xff, 0x01]).is_err());
}

#[test]
fn snapshot_with_inconsistent_task_count_is_rejected() {
    let s = cluster(3, Opts::default());
    let mut d = pb::StateData::decode(s.encode_snapshot().as_slice()).unwrap();
    d.coordination.as_mut().unwrap().tasks.pop();
    let e = State::decode_snapshot(&d.encode_to_vec()).unwrap_err();
    assert!(
        e.to_string()
            .contains("2 tasks stored but the configuration has 3"),
        "{e}"
    );
}

// ------------------------------------------------------------ property ----

const N: u32 = 3;
const KEYS: &[&str] = &["a", "a/b", "/a//c/", "n", ""];
const BARRIERS: &[&str] = &["x", "y"];

fn command() -> impl Strategy<Value = Command> {
    let task = 0..N + 1; // includes one unknown task
    let key = prop::sample::select(KEYS);
    let bid = prop::sample::select(BARRIERS);
    let subset = prop::sample::subsequence(vec![0u32, 1, 2], 0..=3);
    prop_oneof![
        3 => (task.clone(), 0u64..3).prop_map(|(t, i)| register(t, 100 + i)),
        1 => (task.clone(), 0u64..3).prop_map(|(t, i)| heartbeat(t, 100 + i)),
        1 => subset.clone().prop_map(|ts| unhealthy(&ts)),
        1 => (task.clone(), prop::sample::select(vec![Code::Internal, Code::Unavailable, Code::Aborted]))
            .prop_map(|(t, c)| report(t, c, "boom")),
        2 => task.clone().prop_map(poll),
        1 => task.clone().prop_map(shutdown),
        1 => task.clone().prop_map(reset_task),
        3 => (key.clone(), any::<bool>(), prop::sample::select(vec!["1", "v", "-3"]))
            .prop_map(|(k, ow, v)| insert(k, v, ow)),
        1 => key.clone().prop_map(delete),
        2 => (key, -3i64..4).prop_map(|(k, n)| incr(k, n)),
        4 => (bid.clone(), 0i64..3, subset.clone(), task.clone())
            .prop_map(|(b, c, p, t)| arrive(b, c, 2000, &p, t)),
        1 => (bid.clone(), 0i64..3, task.clone()).prop_map(|(b, c, t)| cancel(b, c, t)),
        1 => (bid, 0i64..3).prop_map(|(b, c)| expire(b, c)),
        1 => Just(expire(journal::coordination::REGISTER_BARRIER, 0)),
        1 => (task.clone(), subset).prop_map(|(t, p)| alive(t, &p)),
        1 => (task, prop::collection::vec(any::<u8>(), 0..4)).prop_map(|(t, d)| wait_all(t, &d)),
        1 => (1u64..3).prop_map(|i| reset_epoch(0xABC0 + i, None)),
        1 => Just(noop()),
    ]
}

/// A command, a time step and, sometimes, an origin (client, seq).
type Step = (Command, u64, Option<(u64, u64)>);

/// A step; origins repeat, so some updates are retries.
fn update() -> impl Strategy<Value = Step> {
    (
        command(),
        0u64..1500,
        prop::option::weighted(0.3, (1u64..3, 1u64..6)),
    )
}

fn build(seq: &[Step], recoverable: bool) -> Vec<Update> {
    let o = Opts {
        recoverable,
        heartbeat_timeout_ms: 1000,
        register_timeout_ms: 3000,
        shutdown_timeout_ms: 2000,
        max_outcomes_per_client: 3,
        ..Default::default()
    };
    let mut out = vec![upd(init(config(N, &o), SVC_INC), 0)];
    let mut at = 0;
    for (cmd, dt, origin) in seq {
        at += dt;
        out.push(Update {
            namespace: String::new(),
            origin: origin.map(|(client_id, seq)| Origin {
                client_id,
                seq,
                done_below: 0,
            }),
            at_ms: at,
            epoch: None,
            command: Some(cmd.clone()),
        });
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn snapshot_at_any_cut_then_replay_gives_the_same_digest(
        seq in prop::collection::vec(update(), 1..60),
        cut in any::<prop::sample::Index>(),
        recoverable in any::<bool>(),
    ) {
        let updates = build(&seq, recoverable);
        let mut straight = State::new();
        let mut outcomes = Vec::with_capacity(updates.len());
        for u in &updates {
            outcomes.push(straight.apply(u));
            // Every state on the way keeps every invariant (also in release
            // builds, where `apply` does not check them).
            prop_assert_eq!(straight.check_invariants(), Ok(()));
        }

        let k = cut.index(updates.len() + 1);
        let mut head = State::new();
        for u in &updates[..k] {
            head.apply(u);
        }
        let mut restored = State::decode_snapshot(&head.encode_snapshot()).expect("decodes");
        prop_assert_eq!(restored.digest(), head.digest());
        for (u, expected) in updates[k..].iter().zip(&outcomes[k..]) {
            let got = restored.apply(u);
            prop_assert_eq!(&got, expected);
        }
        prop_assert_eq!(restored.digest(), straight.digest());
        prop_assert_eq!(&restored, &straight);
        // The service incarnation changes only through a job-epoch reset.
        let resets = updates.iter().any(|u| matches!(u.command, Some(Command::ResetJobEpoch(_))));
        if !resets {
            prop_assert_eq!(straight.service_incarnation(), SVC_INC);
        }
    }
}

/// Every parked call's answer, with the objects it waits on.
struct Waiter {
    wait: journal::Wait,
    answer: Option<Result<journal::Answer, journal::DomainError>>,
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// The parked-call engine wakes a waiter only when an apply touched one
    /// of its objects (or everything): so an answer must never change
    /// without that. Waiters: every call a command parks (`Wait::after`), a
    /// blocking get of every key, and a WatchTasks at each version seen.
    #[test]
    fn an_answer_changes_only_where_an_apply_touched_its_objects(
        seq in prop::collection::vec(update(), 1..60),
        recoverable in any::<bool>(),
    ) {
        let updates = build(&seq, recoverable);
        let mut s = State::new();
        let mut waiters: Vec<Waiter> = KEYS
            .iter()
            .map(|k| journal::Wait::Key { key: k.to_string() })
            .map(|wait| Waiter { wait, answer: None })
            .collect();
        for u in &updates {
            let mut touched = journal::Touched::default();
            let out = s.apply_traced(u, &mut touched);
            for w in &mut waiters {
                let now = s.wait_result("", None, &mut w.wait);
                if now != w.answer {
                    let objects = w.wait.objects(&s.default_namespace());
                    let default = |ns: &String| ns.is_empty();
                    prop_assert!(
                        touched.all
                            || touched.namespaces.iter().any(default)
                            || objects
                                .iter()
                                .any(|o| touched.objects.iter().any(|(ns, t)| default(ns) && t == o)),
                        "{:?} changed from {:?} to {:?} after {:?}, which touched only {:?}",
                        w.wait, w.answer, now, u.command, touched
                    );
                    w.answer = now;
                }
            }
            let mut new = Vec::new();
            if let Some(cmd) = &u.command {
                new.extend(journal::Wait::after(cmd, &out));
            }
            new.push(journal::Wait::TaskStates { version: s.coordination().tasks_version() });
            for mut wait in new {
                let answer = s.wait_result("", None, &mut wait);
                waiters.push(Waiter { wait, answer });
            }
        }
    }
}

#[test]
fn a_snapshot_naming_unknown_tasks_is_refused_on_install() {
    let good = busy_state().encode_snapshot();
    let tamper = |f: &dyn Fn(&mut pb::coordination::Data)| {
        let mut d = pb::StateData::decode(good.as_slice()).unwrap();
        f(d.coordination.as_mut().unwrap());
        State::decode_snapshot(&d.encode_to_vec())
    };
    assert!(tamper(&|_| {}).is_ok());
    let e = tamper(&|d| d.barriers.get_mut("b").unwrap().participants = vec![0, 7]).unwrap_err();
    assert!(e.to_string().contains("barrier b::0"), "{e}");
    let e = tamper(&|d| d.barriers.get_mut("b").unwrap().participants = vec![1, 0]).unwrap_err();
    assert!(e.to_string().contains("bad participant set"), "{e}");
    let e = tamper(&|d| {
        d.barriers.get_mut("b").unwrap().arrivals.insert(9, 1);
    })
    .unwrap_err();
    assert!(e.to_string().contains("unknown task"), "{e}");
    let e = tamper(&|d| {
        for r in d.alive_rounds.values_mut() {
            r.tasks.push(3);
        }
    })
    .unwrap_err();
    assert!(e.to_string().contains("GetAliveTasks round"), "{e}");
    let e = tamper(&|d| {
        d.tasks[0].error = Some(pb::DomainError {
            source_task: Some(5),
            ..Default::default()
        })
    })
    .unwrap_err();
    assert!(e.to_string().contains("unknown source task"), "{e}");
    let mut d = pb::StateData::decode(good.as_slice()).unwrap();
    let c = d.config.as_mut().unwrap();
    c.jobs.push(c.jobs[0].clone());
    let e = State::decode_snapshot(&d.encode_to_vec()).unwrap_err();
    assert!(
        e.to_string().contains("listed twice") || e.to_string().contains("tasks stored"),
        "{e}"
    );
}
