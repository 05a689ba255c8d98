//! Namespaces in the state: lifecycle, isolation (the same keys, barriers
//! and task ids in two namespaces never meet), quotas, what a parked call in
//! a deleted namespace reads, export and import, and the default namespace
//! keeping the encoding it had before namespaces existed.
mod common;
use common::*;
use journal::pb::{self, update::Command, CreateNamespace, DeleteNamespace, NamespaceSpec};
use journal::{Code, Object, State, Touched, Update, Wait};

/// The update of `cmd` in namespace `ns` at time `at`.
fn in_ns(ns: &str, cmd: Command, at: u64) -> Update {
    Update {
        namespace: ns.into(),
        ..upd(cmd, at)
    }
}

fn create(name: &str, tasks: u32, port: u32, inc: u64) -> Command {
    Command::CreateNamespace(Box::new(CreateNamespace {
        name: name.into(),
        config: Some(config(tasks, &Opts::default())),
        spec: Some(NamespaceSpec {
            port,
            ..Default::default()
        }),
        service_incarnation: inc,
        ..Default::default()
    }))
}

fn delete(name: &str) -> Command {
    Command::DeleteNamespace(DeleteNamespace { name: name.into() })
}

/// A default namespace of 2 tasks (registered), and namespaces `a` and `b`
/// of 2 tasks each on ports 9001 and 9002, their tasks registered too.
fn two_jobs() -> State {
    let mut s = cluster(2, Opts::default());
    ok(&apply(&mut s, create("a", 2, 9001, 0xA), 10));
    ok(&apply(&mut s, create("b", 2, 9002, 0xB), 10));
    for ns in ["a", "b"] {
        for t in 0..2 {
            // The first waits at the registration barrier for the second.
            assert!(!s.apply(&in_ns(ns, register(t, tinc(t)), 20)).is_err());
        }
        let connected = journal::coordination::TaskStatus::Connected;
        let n = s.namespace(ns).unwrap();
        assert!((0..2).all(|t| n.coordination().task_status(t) == Some(connected)));
    }
    s
}

fn kv(s: &State, ns: &str, key: &str) -> Option<Vec<u8>> {
    let n = s.namespace(ns).expect("namespace");
    n.coordination().kv_get(key).map(|v| v.to_vec())
}

#[test]
fn a_created_namespace_has_its_own_incarnation_epoch_and_tasks() {
    let s = two_jobs();
    let a = s.namespace("a").unwrap();
    assert_eq!(a.service_incarnation(), 0xA);
    assert_eq!(a.task_count(), 2);
    assert_eq!(a.spec().unwrap().port, 9001);
    assert!(a.coordination().task(1).is_some());
    assert_eq!(
        s.namespace("default").unwrap().service_incarnation(),
        SVC_INC
    );
    assert_eq!(s.namespace_count(), 3);
    let names: Vec<_> = s.namespaces().map(|n| n.name()).collect();
    assert_eq!(names, ["default", "a", "b"]);
    assert_eq!(s.check_invariants(), Ok(()));
}

#[test]
fn the_same_keys_barriers_and_task_ids_in_two_namespaces_never_meet() {
    let mut s = two_jobs();
    ok(&s.apply(&in_ns("a", insert("k", "in-a", false), 30)));
    ok(&s.apply(&in_ns("b", insert("k", "in-b", false), 30)));
    assert_eq!(kv(&s, "a", "k").unwrap(), b"in-a");
    assert_eq!(kv(&s, "b", "k").unwrap(), b"in-b");
    assert_eq!(kv(&s, "default", "k"), None);
    // Barrier "x" with both tasks: task 0 of a and task 1 of b arrive; each
    // namespace's instance waits for its own task.
    let a0 = s.apply(&in_ns("a", arrive("x", 0, 5000, &[], 0), 40));
    let b1 = s.apply(&in_ns("b", arrive("x", 0, 5000, &[], 1), 40));
    assert!(a0.parked && b1.parked);
    let mut wait_a = Wait::Barrier {
        id: "x".into(),
        counter: 0,
        call: a0.call_id,
    };
    assert_eq!(s.wait_result("a", None, &mut wait_a), None);
    ok(&s.apply(&in_ns("a", arrive("x", 0, 5000, &[], 1), 50)));
    assert!(s.wait_result("a", None, &mut wait_a).is_some());
    let mut wait_b = Wait::Barrier {
        id: "x".into(),
        counter: 0,
        call: b1.call_id,
    };
    assert_eq!(s.wait_result("b", None, &mut wait_b), None, "b still waits");
}

#[test]
fn an_error_reported_in_one_namespace_reaches_only_its_tasks() {
    let mut s = two_jobs();
    let pa = s.apply(&in_ns("a", poll(1), 30));
    let pb = s.apply(&in_ns("b", poll(1), 30));
    ok(&s.apply(&in_ns("a", report(0, Code::Internal, "boom"), 40)));
    let mut wa = Wait::Poll {
        task: 1,
        call: pa.call_id,
    };
    let mut wb = Wait::Poll {
        task: 1,
        call: pb.call_id,
    };
    let e = s.wait_result("a", None, &mut wa).unwrap().unwrap_err();
    assert!(e.message.contains("boom"), "{e:?}");
    assert_eq!(s.wait_result("b", None, &mut wb), None);
    assert!(s
        .namespace("b")
        .unwrap()
        .coordination()
        .propagated_error()
        .is_none());
}

#[test]
fn a_reset_or_delete_of_one_namespace_changes_no_other() {
    let mut s = two_jobs();
    ok(&s.apply(&in_ns("b", insert("k", "v", false), 30)));
    let b_before = s.namespace_data("b").unwrap();
    let default_before = s.namespace_data("default").unwrap();
    ok(&s.apply(&in_ns("a", reset_epoch(0xA2, None), 40)));
    assert_eq!(s.namespace("a").unwrap().epoch(), 1);
    assert_eq!(s.namespace("a").unwrap().service_incarnation(), 0xA2);
    let mut b_after = s.namespace_data("b").unwrap();
    b_after.last_active_ms = b_before.last_active_ms;
    assert_eq!(b_after, b_before);
    ok(&apply(&mut s, delete("a"), 50));
    assert!(s.namespace("a").is_none());
    assert_eq!(s.namespace_data("default").unwrap(), default_before);
    assert_eq!(kv(&s, "b", "k").unwrap(), b"v");
    assert_eq!(s.check_invariants(), Ok(()));
}

#[test]
fn a_parked_call_in_a_deleted_namespace_ends_at_once() {
    let mut s = two_jobs();
    let p = s.apply(&in_ns("a", poll(0), 30));
    let mut touched = Touched::default();
    s.apply_traced(&in_ns("", delete("a"), 40), &mut touched);
    assert!(touched.namespace_set);
    assert_eq!(touched.namespaces, ["a"]);
    let mut w = Wait::Poll {
        task: 0,
        call: p.call_id,
    };
    let e = s.wait_result("a", None, &mut w).unwrap().unwrap_err();
    assert_eq!(e.status(), Code::Unavailable);
    assert!(e.message.contains("namespace a was deleted"), "{e:?}");
    let mut q = Wait::JoinReady { queue: "q".into() };
    let e = s.wait_result("a", None, &mut q).unwrap().unwrap_err();
    assert_eq!(e.status(), Code::NotFound);
}

#[test]
fn a_command_in_an_unknown_namespace_is_not_found_and_changes_nothing() {
    let mut s = two_jobs();
    let before = s.digest();
    let applied_before = s.applied_count();
    let out = s.apply(&in_ns("nope", insert("k", "v", false), 30));
    let e = err(&out, Code::NotFound);
    contains(&e, "namespace nope does not exist");
    // Only the applied counter moved.
    assert_eq!(s.applied_count(), applied_before + 1);
    assert_ne!(before, s.digest(), "the applied counter is in the state");
    assert!(kv(&s, "default", "k").is_none());
}

#[test]
fn lifecycle_refusals_are_precise_and_change_nothing() {
    let mut s = two_jobs();
    let cases = [
        (
            create("Bad_Name", 1, 9003, 1),
            Code::InvalidArgument,
            "invalid namespace name",
        ),
        (
            create("-x", 1, 9003, 1),
            Code::InvalidArgument,
            "invalid namespace name",
        ),
        (
            create(&"x".repeat(64), 1, 9003, 1),
            Code::InvalidArgument,
            "invalid namespace name",
        ),
        (
            create("a", 1, 9003, 1),
            Code::AlreadyExists,
            "namespace a already exists",
        ),
        (
            create("default", 1, 9003, 1),
            Code::AlreadyExists,
            "namespace default already exists",
        ),
        (
            create("c", 1, 9001, 1),
            Code::AlreadyExists,
            "port 9001 is already the port of namespace a",
        ),
        (
            create("c", 0, 9003, 1),
            Code::InvalidArgument,
            "at least one task",
        ),
        (
            delete("nope"),
            Code::NotFound,
            "namespace nope does not exist",
        ),
        (
            delete("default"),
            Code::FailedPrecondition,
            "cannot be deleted",
        ),
    ];
    for (cmd, code, text) in cases {
        let before = s.namespace_data("a");
        let count = s.namespace_count();
        let out = apply(&mut s, cmd, 30);
        contains(&err(&out, code), text);
        assert_eq!(s.namespace_count(), count);
        assert_eq!(s.namespace_data("a"), before);
    }
    let out = apply(
        &mut s,
        Command::CreateNamespace(Box::new(CreateNamespace {
            port_low: 9500,
            port_high: 9600,
            ..match create("c", 1, 9003, 1) {
                Command::CreateNamespace(c) => *c,
                _ => unreachable!(),
            }
        })),
        30,
    );
    contains(
        &err(&out, Code::InvalidArgument),
        "outside the namespace port range 9500-9600",
    );
    let out = apply(
        &mut s,
        Command::CreateNamespace(Box::new(CreateNamespace {
            max_namespaces: 3,
            ..match create("c", 1, 9003, 1) {
                Command::CreateNamespace(c) => *c,
                _ => unreachable!(),
            }
        })),
        30,
    );
    contains(&err(&out, Code::ResourceExhausted), "limit of 3 namespaces");
    assert_eq!(s.check_invariants(), Ok(()));
}

#[test]
fn quotas_name_the_namespace_and_the_limit_and_spare_the_others() {
    let mut s = cluster(1, Opts::default());
    let quota = |name: &str, port, max_keys, max_bytes| {
        let o = Opts {
            max_keys,
            ..Opts::default()
        };
        Command::CreateNamespace(Box::new(CreateNamespace {
            name: String::from(name),
            config: Some(config(1, &o)),
            spec: Some(NamespaceSpec {
                port,
                max_bytes,
                ..Default::default()
            }),
            service_incarnation: 7,
            ..Default::default()
        }))
    };
    ok(&apply(&mut s, quota("a", 9001, 2, 0), 1));
    ok(&apply(&mut s, quota("b", 9002, 0, 10), 1));
    ok(&s.apply(&in_ns("a", insert("k1", "v", false), 2)));
    ok(&s.apply(&in_ns("a", insert("k2", "v", false), 2)));
    let e = err(
        &s.apply(&in_ns("a", insert("k3", "v", false), 3)),
        Code::ResourceExhausted,
    );
    contains(&e, "namespace a: ");
    contains(&e, "limit of 2 keys (--max-keys)");
    // Overwriting an existing key is no new key.
    ok(&s.apply(&in_ns("a", insert("k1", "w", true), 3)));
    // b: 10 bytes of keys and values.
    ok(&s.apply(&in_ns("b", insert("kk", "12345678", false), 4)));
    let e = err(
        &s.apply(&in_ns("b", insert("x", "y", false), 4)),
        Code::ResourceExhausted,
    );
    contains(&e, "namespace b: ");
    contains(&e, "limit of 10 (--max-bytes)");
    let e = err(
        &s.apply(&in_ns("b", incr("n", 1), 4)),
        Code::ResourceExhausted,
    );
    contains(&e, "--max-bytes");
    // A write that shrinks the store passes; a delete frees room.
    ok(&s.apply(&in_ns("b", insert("kk", "1", true), 5)));
    ok(&s.apply(&in_ns("b", insert("x", "y", false), 5)));
    assert_eq!(s.namespace("b").unwrap().coordination().stats().kv_bytes, 5);
    ok(&s.apply(&in_ns(
        "b",
        journal::pb::update::Command::from(pb::coordination::KvDelete { key: "kk".into() }),
        6,
    )));
    assert_eq!(s.namespace("b").unwrap().coordination().stats().kv_bytes, 2);
    // The default namespace is unbounded by either.
    for i in 0..5 {
        ok(&apply(
            &mut s,
            insert(&format!("d{i}"), "0123456789", false),
            7,
        ));
    }
    assert_eq!(s.check_invariants(), Ok(()));
}

#[test]
fn an_apply_reports_touches_with_their_namespace() {
    let mut s = two_jobs();
    let mut t = Touched::default();
    s.apply_traced(&in_ns("b", insert("k", "v", false), 30), &mut t);
    assert_eq!(t.objects, [("b".to_string(), Object::Key("k".into()))]);
    let mut t = Touched::default();
    s.apply_traced(&in_ns("default", insert("k", "v", false), 30), &mut t);
    assert_eq!(t.objects, [(String::new(), Object::Key("k".into()))]);
    let mut t = Touched::default();
    s.apply_traced(&in_ns("a", reset_epoch(3, None), 30), &mut t);
    assert_eq!(t.namespaces, ["a"]);
    assert!(!t.all);
}

#[test]
fn an_export_imported_under_another_name_keeps_the_whole_job() {
    let mut s = two_jobs();
    ok(&s.apply(&in_ns("a", insert("k", "v", false), 30)));
    let exported = s.namespace_data("a").unwrap();
    let import = Command::CreateNamespace(Box::new(CreateNamespace {
        name: "a2".into(),
        spec: Some(NamespaceSpec {
            port: 9010,
            ..Default::default()
        }),
        data: Some(exported.clone()),
        ..Default::default()
    }));
    ok(&apply(&mut s, import, 40));
    let a2 = s.namespace("a2").unwrap();
    assert_eq!(a2.service_incarnation(), 0xA);
    assert_eq!(a2.spec().unwrap().port, 9010);
    assert_eq!(kv(&s, "a2", "k").unwrap(), b"v");
    assert_eq!(
        s.namespace("a2").unwrap().coordination().task(1),
        s.namespace("a").unwrap().coordination().task(1)
    );
    assert_eq!(s.check_invariants(), Ok(()));
}

#[test]
fn a_state_without_namespaces_encodes_as_before_and_every_snapshot_round_trips() {
    // A state that never saw a namespace has no field 9: its encoding is
    // the one a build without namespaces wrote (StateData fields 1-8, 20,
    // 100, 200), so such a data dir reads as the default namespace.
    let s = cluster(3, Opts::default());
    let bytes = s.encode_snapshot();
    let d = <pb::StateData as prost::Message>::decode(bytes.as_slice()).unwrap();
    assert!(d.namespaces.is_empty());
    let t = two_jobs();
    let back = State::decode_snapshot(&t.encode_snapshot()).unwrap();
    assert_eq!(back, t);
    assert_eq!(back.digest(), t.digest());
    // The byte count of the KV store is derived: not in the snapshot (so a
    // digest covers only the state), counted again when one is read.
    let mut t = t;
    ok(&t.apply(&in_ns("a", insert("key", "value", false), 30)));
    let back = State::decode_snapshot(&t.encode_snapshot()).unwrap();
    assert_eq!(back, t);
    assert_eq!(back.digest(), t.digest());
    let bytes = |s: &State| s.namespace("a").unwrap().coordination().stats().kv_bytes;
    assert_eq!((bytes(&t), bytes(&back)), (8, 8));
}

#[test]
fn a_namespace_is_done_when_no_task_is_connected() {
    let mut s = two_jobs();
    assert!(!s.namespace("a").unwrap().is_done());
    ok(&apply(&mut s, create("idle", 2, 9005, 1), 30));
    assert!(s.namespace("idle").unwrap().is_done());
}

#[test]
fn a_namespace_snapshot_holds_that_namespace_and_nothing_of_the_others() {
    let mut s = two_jobs();
    ok(&s.apply(&in_ns("a", insert("secret-a", "1", false), 30)));
    ok(&s.apply(&in_ns("b", insert("secret-b", "2", false), 30)));
    ok(&s.apply(&upd(insert("secret-default", "3", false), 30)));
    for (name, key, others) in [
        ("a", "secret-a", ["secret-b", "secret-default"]),
        ("b", "secret-b", ["secret-a", "secret-default"]),
        ("default", "secret-default", ["secret-a", "secret-b"]),
    ] {
        let bytes = s.namespace_snapshot(name).unwrap();
        for other in others {
            assert!(
                !bytes.windows(other.len()).any(|w| w == other.as_bytes()),
                "{name}'s snapshot holds {other}"
            );
        }
        let one = State::decode_snapshot(&bytes).unwrap();
        let (mine, theirs) = (one.namespace(name).unwrap(), s.namespace(name).unwrap());
        assert_eq!(kv(&one, name, key), kv(&s, name, key));
        assert_eq!(mine.coordination().task(1), theirs.coordination().task(1));
        assert_eq!(mine.service_incarnation(), theirs.service_incarnation());
        assert_eq!(one.session_count(), 0);
        let names: Vec<_> = one.namespaces().map(|n| n.name().to_string()).collect();
        let want: Vec<_> = ["default", name].iter().map(|n| n.to_string()).collect();
        assert_eq!(
            names.iter().collect::<std::collections::BTreeSet<_>>(),
            want.iter().collect()
        );
    }
    assert!(s.namespace_snapshot("nope").is_none());
}
