//! Values, counters, compare-and-set, deletes and queues.

use super::*;

#[test]
fn get_of_a_missing_key_is_empty_and_values_are_bytes() {
    let mut t = T::new();
    assert_eq!(t.get("/k"), None);
    t.set("/k", b"\x00\x01bin\xff\x80");
    assert_eq!(t.get("/k").unwrap(), b"\x00\x01bin\xff\x80");
    // Keys are bytes as sent: "/a", "a" and "a//b" are three keys.
    t.set("a", b"1");
    t.set("a//b", b"2");
    assert_eq!(t.get("/a"), None);
    assert_eq!(t.s.default_namespace().torch().num_keys(), 3);
}

#[test]
fn compare_set_follows_torchs_four_cases() {
    let mut t = T::new();
    // Missing, expected empty: stores and answers desired.
    assert_eq!(t.cas("/c1", b"", b"d1"), b"d1");
    assert_eq!(t.get("/c1").unwrap(), b"d1");
    // Missing, expected not empty: answers expected, stores nothing.
    assert_eq!(t.cas("/c2", b"x", b"d2"), b"x");
    assert_eq!(t.get("/c2"), None);
    assert!(!t.check(&["/c2"]));
    // Present and equal: replaced.
    assert_eq!(t.cas("/c1", b"d1", b"d3"), b"d3");
    // Present and not equal (expected empty included): the current value.
    assert_eq!(t.cas("/c1", b"zz", b"d4"), b"d3");
    assert_eq!(t.cas("/c1", b"", b"d4"), b"d3");
    // A present empty value matches an empty expected.
    t.set("/e", b"");
    assert_eq!(t.cas("/e", b"", b"full"), b"full");
    // A retried CAS whose first copy committed answers the new value.
    assert_eq!(t.cas("/c1", b"d1", b"d3"), b"d3");
}

#[test]
fn add_reads_with_stoll_and_stores_canonical_decimal() {
    let mut t = T::new();
    assert_eq!(t.add("/n", 5), Ok(5));
    assert_eq!(t.add("/n", -2), Ok(3));
    assert_eq!(t.get("/n").unwrap(), b"3");
    for (stored, after) in [
        (&b" 7"[..], 8),
        (b"+5", 6),
        (b"12abc", 13),
        (b"3.9", 4),
        (b"0x10", 1),
    ] {
        t.set("/s", stored);
        assert_eq!(t.add("/s", 1), Ok(after), "{stored:?}");
        assert_eq!(t.get("/s").unwrap(), after.to_string().as_bytes());
    }
    t.set("/max", b"9223372036854775807");
    assert_eq!(t.add("/max", 1), Ok(i64::MIN));
    assert_eq!(t.get("/max").unwrap(), b"-9223372036854775808");
    // Not a number: refused, the value unchanged.
    for bad in [&b""[..], b"abc", b"\x00\x01", b"99999999999999999999"] {
        t.set("/bad", bad);
        assert_eq!(t.add("/bad", 1), Err(Code::InvalidArgument), "{bad:?}");
        assert_eq!(t.get("/bad").unwrap(), bad);
    }
}

#[test]
fn append_creates_or_concatenates_and_delete_answers_the_count() {
    let mut t = T::new();
    t.append("/ap", b"a1");
    t.append("/ap", b"a2");
    assert_eq!(t.get("/ap").unwrap(), b"a1a2");
    assert_eq!(t.delete("/ap"), 1);
    assert_eq!(t.delete("/ap"), 0);
    assert_eq!(t.get("/ap"), None);
}

#[test]
fn multi_set_sets_in_order_the_last_duplicate_winning() {
    let mut t = T::new();
    let pairs = [("/m1", "v1"), ("/m2", "v2"), ("/m1", "v3")]
        .iter()
        .map(|(k, v)| t::Set {
            key: k.to_string(),
            value: Bytes::from(v.to_string()),
        })
        .collect();
    assert!(!t.run(t::MultiSet { pairs }).is_err());
    assert_eq!(t.get("/m1").unwrap(), b"v3");
    assert_eq!(t.get("/m2").unwrap(), b"v2");
}

#[test]
fn queues_pop_in_order_and_answer_the_length_before() {
    let mut t = T::new();
    assert_eq!(
        t.pop("/q"),
        Popped {
            length: 0,
            value: None
        }
    );
    t.push("/q", b"x");
    t.push("/q", b"y");
    assert_eq!(t.s.default_namespace().torch().queue_len("/q"), 2);
    assert_eq!(
        t.pop("/q"),
        Popped {
            length: 2,
            value: Some(Bytes::from_static(b"x"))
        }
    );
    assert_eq!(t.pop("/q").length, 1);
    assert_eq!(t.pop("/q").length, 0);
    // Queues and keys are apart for GET and DELETE, shared for CHECK.
    t.push("/q", b"z");
    assert_eq!(t.get("/q"), None);
    assert_eq!(t.delete("/q"), 0);
    assert!(t.check(&["/q"]));
    assert_eq!(t.s.default_namespace().torch().num_keys(), 0);
    t.pop("/q");
    assert!(!t.check(&["/q"]));
}

#[test]
fn keys_and_bytes_count_against_the_namespaces_bounds_with_the_coordination_store() {
    let mut t = T::with_max_keys(3);
    let kv = journal::pb::coordination::KvInsert {
        key: "jax".into(),
        value: "1".into(),
        allow_overwrite: false,
    };
    assert!(!t.run(kv).is_err());
    t.set("/a", b"1");
    t.push("/q", b"1");
    let out = t.run(t::Set {
        key: "/b".into(),
        value: Bytes::from_static(b"1"),
    });
    assert_eq!(out.error.unwrap().code(), Code::ResourceExhausted);
    assert_eq!(t.get("/b"), None);
    // An overwrite adds no key; a coordination key is refused too.
    t.set("/a", b"2");
    let kv = journal::pb::coordination::KvInsert {
        key: "jax2".into(),
        value: "1".into(),
        allow_overwrite: false,
    };
    assert_eq!(t.run(kv).error.unwrap().code(), Code::ResourceExhausted);
    // A refused MULTI_SET leaves its earlier pairs (torch applies pair by pair).
    assert_eq!(t.delete("/a"), 1);
    let pairs = ["/x", "/y"]
        .iter()
        .map(|k| t::Set {
            key: k.to_string(),
            value: Bytes::from_static(b"v"),
        })
        .collect();
    assert!(t.run(t::MultiSet { pairs }).is_err());
    assert_eq!(t.get("/x").unwrap(), b"v");
    assert_eq!(t.get("/y"), None);
}

#[test]
fn a_job_epoch_reset_empties_the_store_and_ends_its_waits() {
    let mut t = T::new();
    t.set("/k", b"v");
    t.push("/q", b"x");
    assert_eq!(t.wait(A, &["/missing"]), parked(0));
    let reset = journal::pb::ResetJobEpoch {
        service_incarnation: 7,
        config: None,
    };
    assert!(!t
        .run(journal::pb::update::Command::ResetJobEpoch(reset))
        .is_err());
    assert_eq!(t.get("/k"), None);
    assert_eq!(t.s.default_namespace().torch().queue_len("/q"), 0);
    assert_eq!(t.connection(A), None);
}

#[test]
fn retried_updates_apply_once() {
    let mut t = T::new();
    let add = t::Add {
        key: "/ctr".into(),
        delta: 1,
    };
    let first = t.run_as(77, 1, add.clone());
    let again = t.run_as(77, 1, add.clone());
    assert_eq!(first, again);
    assert!(!t.run_as(77, 2, add).is_err());
    assert_eq!(t.get("/ctr").unwrap(), b"2");
    let push = t::QueuePush {
        key: "/q".into(),
        value: Bytes::from_static(b"x"),
    };
    t.run_as(78, 1, push.clone());
    t.run_as(78, 1, push);
    assert_eq!(t.s.default_namespace().torch().queue_len("/q"), 1);
}

#[test]
fn the_store_needs_level_four_and_a_state_that_used_it_says_so() {
    let u = Update::from(t::Set {
        key: "/k".into(),
        value: Bytes::new(),
    });
    assert_eq!(u.required_level(), journal::LEVEL_TORCH);
    assert_eq!(u.command_name(), "Set");
    let mut t = T::new();
    assert!(t.s.feature_level() < journal::LEVEL_TORCH);
    let before = t.s.encode_snapshot();
    t.set("/k", b"v");
    assert_eq!(t.s.feature_level(), journal::LEVEL_TORCH);
    // A state that never served torch encodes as before (no empty part).
    let fresh = T::new();
    assert_eq!(fresh.s.encode_snapshot(), before);
    // A snapshot round trip keeps the store.
    let back = State::decode_snapshot(&t.s.encode_snapshot()).unwrap();
    assert_eq!(back.digest(), t.s.digest());
    assert_eq!(
        back.default_namespace().torch().get("/k").unwrap().as_ref(),
        b"v"
    );
}

#[test]
fn a_compare_set_that_cannot_change_the_state_is_known_as_a_read() {
    let mut t = T::new();
    let r = |t: &T, key: &str, expected: &[u8]| {
        t.s.default_namespace()
            .torch()
            .compare_set_unchanging(key, expected)
            .map(|b| b.to_vec())
    };
    // Missing key, empty expected: it stores.
    assert_eq!(r(&t, "/k", b""), None);
    // Missing key, expected not empty: answers expected, stores nothing.
    assert_eq!(r(&t, "/k", b"x"), Some(b"x".to_vec()));
    t.set("/k", b"v");
    assert_eq!(r(&t, "/k", b"v"), None);
    assert_eq!(r(&t, "/k", b"w"), Some(b"v".to_vec()));
    // With a waiter on the key every CAS wakes it: not a read.
    t.wait(A, &["/k2"]);
    assert_eq!(r(&t, "/k2", b"x"), None);
    // What the read answers is what the command answers.
    let mut t = T::new();
    t.set("/k", b"v");
    assert_eq!(t.cas("/k", b"w", b"z"), r(&t, "/k", b"w").unwrap());
    assert_eq!(t.cas("/m", b"x", b"z"), r(&t, "/m", b"x").unwrap());
}
