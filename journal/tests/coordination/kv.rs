//! The key-value store (`docs/protocols.md`, Key-value store).

use crate::common::*;
use journal::coordination::{errors, normalize_key};
use journal::{Code, State};

fn keys(s: &State, dir: &str) -> Vec<String> {
    s.coordination()
        .kv_dir(dir)
        .into_iter()
        .map(|(k, _)| k.to_string())
        .collect()
}

#[test]
fn keys_are_normalised() {
    assert_eq!(normalize_key("///a//b/"), "a/b");
    let mut s = State::new();
    ok(&apply(&mut s, insert("///a//b/", "1", false), 0));
    assert_eq!(s.coordination().kv_get("a/b").unwrap().as_ref(), b"1");
    assert_eq!(s.coordination().kv_get("/a/b").unwrap().as_ref(), b"1");
    let e = err(
        &apply(&mut s, insert("a/b", "2", false), 0),
        Code::AlreadyExists,
    );
    assert_eq!(e.message, "key a/b already exists.");
    assert_eq!(keys(&s, "a"), vec!["a/b"]);
    assert_eq!(s.coordination().kv_len(), 1);
}

#[test]
fn empty_key_is_legal() {
    let mut s = State::new();
    ok(&apply(&mut s, insert("", "root", false), 0));
    assert_eq!(s.coordination().kv_get("").unwrap().as_ref(), b"root");
    assert_eq!(s.coordination().kv_get("//").unwrap().as_ref(), b"root");
    assert!(keys(&s, "").is_empty(), "the empty directory holds nothing");
}

#[test]
fn insert_existing_without_overwrite_is_already_exists_without_payload() {
    let mut s = State::new();
    ok(&apply(&mut s, insert("k", "v1", false), 0));
    let rev = s.coordination().kv_revision();
    let e = err(
        &apply(&mut s, insert("k", "v2", false), 0),
        Code::AlreadyExists,
    );
    assert_eq!(e.message, "key k already exists.");
    assert!(!e.coordination_payload);
    assert!(e.barrier.is_none() && e.source_task.is_none());
    assert_eq!(s.coordination().kv_get("k").unwrap().as_ref(), b"v1");
    assert_eq!(s.coordination().kv_revision(), rev);
}

#[test]
fn insert_with_overwrite_replaces_value() {
    let mut s = State::new();
    ok(&apply(&mut s, insert("k", "v1", false), 0));
    let created = s.coordination().kv_entry("k").unwrap().create_revision;
    ok(&apply(&mut s, insert("k", "v2", true), 0));
    assert_eq!(s.coordination().kv_get("k").unwrap().as_ref(), b"v2");
    let e = s.coordination().kv_entry("k").unwrap();
    assert_eq!(e.create_revision, created);
    assert!(e.mod_revision > created);
    // allow_overwrite on a missing key simply inserts.
    ok(&apply(&mut s, insert("new", "x", true), 0));
    assert_eq!(s.coordination().kv_get("new").unwrap().as_ref(), b"x");
}

#[test]
fn try_get_of_missing_key_is_not_found_with_payload() {
    let s = State::new();
    assert!(s.coordination().kv_get("nope").is_none());
    let e = errors::key_not_found("/nope/");
    code_is(&e, Code::NotFound);
    assert_eq!(e.message, "Config key /nope/ not found.");
    assert!(e.coordination_payload);
}

#[test]
fn increment_treats_missing_as_zero_and_stores_decimal() {
    let mut s = State::new();
    let out = apply(&mut s, incr("/c", 5), 0);
    ok(&out);
    assert_eq!(out.incremented().unwrap(), 5);
    assert_eq!(s.coordination().kv_get("c").unwrap().as_ref(), b"5");
    let out = apply(&mut s, incr("c", -7), 0);
    assert_eq!(out.incremented().unwrap(), -2);
    assert_eq!(s.coordination().kv_get("c").unwrap().as_ref(), b"-2");
    ok(&apply(&mut s, insert("d", "40", false), 0));
    assert_eq!(apply(&mut s, incr("d", 2), 0).incremented().unwrap(), 42);
}

#[test]
fn increment_of_non_integer_is_failed_precondition() {
    let mut s = State::new();
    ok(&apply(&mut s, insert("k", "abc", false), 0));
    let e = err(&apply(&mut s, incr("k", 1), 0), Code::FailedPrecondition);
    assert!(e.coordination_payload);
    contains(
        &e,
        "key k holds a value that is not a decimal 64-bit integer",
    );
    assert_eq!(s.coordination().kv_get("k").unwrap().as_ref(), b"abc");
}

#[test]
fn increment_overflow_is_failed_precondition() {
    let mut s = State::new();
    ok(&apply(&mut s, insert("k", &i64::MAX.to_string(), false), 0));
    let e = err(&apply(&mut s, incr("k", 1), 0), Code::FailedPrecondition);
    assert!(e.coordination_payload);
    contains(&e, "overflows a 64-bit integer");
    assert_eq!(
        s.coordination().kv_get("k").unwrap().as_ref(),
        i64::MAX.to_string().as_bytes()
    );
}

#[test]
fn directory_listing_is_sorted_strict_and_prefix_exact() {
    let mut s = State::new();
    for k in ["dir/b", "dir/a", "dir", "dirx/c", "dir/sub/z", "other"] {
        ok(&apply(&mut s, insert(k, k, false), 0));
    }
    assert_eq!(keys(&s, "dir"), vec!["dir/a", "dir/b", "dir/sub/z"]);
    assert_eq!(keys(&s, "//dir//"), vec!["dir/a", "dir/b", "dir/sub/z"]);
    assert_eq!(keys(&s, "dir/sub"), vec!["dir/sub/z"]);
    assert!(keys(&s, "").is_empty());
    assert!(keys(&s, "missing").is_empty());
    assert_eq!(s.coordination().kv_dir("dir")[0].1.value.as_ref(), b"dir/a");
}

#[test]
fn delete_removes_key_and_everything_under_it() {
    let mut s = State::new();
    for k in ["dir", "dir/a", "dir/sub/b", "dirx/c", "keep"] {
        ok(&apply(&mut s, insert(k, "v", false), 0));
    }
    ok(&apply(&mut s, delete("/dir/"), 0));
    assert!(s.coordination().kv_get("dir").is_none());
    assert!(s.coordination().kv_get("dir/a").is_none());
    assert!(s.coordination().kv_get("dir/sub/b").is_none());
    assert!(s.coordination().kv_get("dirx/c").is_some());
    assert!(s.coordination().kv_get("keep").is_some());
    assert_eq!(s.coordination().kv_len(), 2);
    // Deleting something missing is OK and changes nothing.
    let rev = s.coordination().kv_revision();
    ok(&apply(&mut s, delete("missing"), 0));
    assert_eq!(s.coordination().kv_revision(), rev);
    assert_eq!(s.coordination().kv_len(), 2);
}

#[test]
fn key_limit_is_resource_exhausted() {
    let o = Opts {
        max_keys: 2,
        ..Default::default()
    };
    let mut s = new_state(1, &o);
    ok(&apply(&mut s, insert("a", "1", false), 0));
    ok(&apply(&mut s, insert("b", "1", false), 0));
    let e = err(
        &apply(&mut s, insert("c", "1", false), 0),
        Code::ResourceExhausted,
    );
    contains(&e, "limit of 2 keys");
    err(&apply(&mut s, incr("d", 1), 0), Code::ResourceExhausted);
    // Overwriting an existing key is still fine.
    ok(&apply(&mut s, insert("a", "2", true), 0));
    assert_eq!(s.coordination().kv_len(), 2);
}

#[test]
fn kv_is_untouched_by_task_errors() {
    let mut s = cluster(2, Opts::default());
    ok(&apply(&mut s, insert("k", "v", false), 1500));
    ok(&apply(&mut s, report(1, Code::Internal, "boom"), 2000));
    assert_eq!(s.coordination().kv_get("k").unwrap().as_ref(), b"v");
    ok(&apply(&mut s, insert("k2", "v", false), 2100));
}

// ------------------------------------------------------- watch history ----

fn events(s: &State, after: u64) -> Vec<(u64, String, String, bool)> {
    s.coordination()
        .kv_events_after(after)
        .expect("history complete")
        .iter()
        .map(|e| {
            (
                e.revision,
                e.key.clone(),
                String::from_utf8(e.value.to_vec()).unwrap(),
                e.deleted,
            )
        })
        .collect()
}

#[test]
fn every_change_is_an_event_with_its_own_revision() {
    let mut s = new_state(1, &Opts::default());
    ok(&apply(&mut s, insert("/a//x", "1", false), 0));
    ok(&apply(&mut s, insert("a/y", "2", false), 0));
    ok(&apply(&mut s, incr("n", 5), 0));
    ok(&apply(&mut s, insert("a/x", "3", true), 0));
    // A failed insert and a delete of nothing change nothing.
    assert!(apply(&mut s, insert("a/x", "4", false), 0).is_err());
    ok(&apply(&mut s, delete("nothing"), 0));
    // A recursive delete is one revision with an event per key.
    ok(&apply(&mut s, delete("a"), 0));
    assert_eq!(s.coordination().kv_revision(), 5);
    assert_eq!(
        events(&s, 0),
        vec![
            (1, "a/x".into(), "1".into(), false),
            (2, "a/y".into(), "2".into(), false),
            (3, "n".into(), "5".into(), false),
            (4, "a/x".into(), "3".into(), false),
            (5, "a/x".into(), "".into(), true),
            (5, "a/y".into(), "".into(), true),
        ]
    );
    // Resuming after revision 3 yields exactly the later events.
    assert_eq!(events(&s, 3).len(), 3);
    assert!(events(&s, 5).is_empty());
}

#[test]
fn the_history_is_bounded_and_reports_compaction() {
    let o = Opts {
        watch_history_bytes: 2_000,
        ..Default::default()
    };
    let mut s = new_state(1, &o);
    for i in 0..200 {
        ok(&apply(
            &mut s,
            insert(&format!("k{i}"), &"v".repeat(20), true),
            0,
        ));
    }
    let c = s.coordination().kv_events_after(0).unwrap_err();
    assert_eq!(c.revision, 200);
    assert!(c.history_start > 1);
    // Everything from the history start on is still there, in order.
    let tail = s
        .coordination()
        .kv_events_after(c.history_start - 1)
        .unwrap();
    assert_eq!(tail.first().unwrap().revision, c.history_start);
    assert_eq!(tail.last().unwrap().revision, 200);
    assert_eq!(tail.len() as u64, 200 - c.history_start + 1);
}

#[test]
fn a_job_epoch_reset_compacts_the_history() {
    let mut s = new_state(1, &Opts::default());
    ok(&apply(&mut s, insert("a", "1", false), 0));
    ok(&apply(&mut s, reset_epoch(77, None), 0));
    assert!(s.coordination().kv_events_after(0).is_err());
    assert!(s.coordination().kv_events_after(1).unwrap().is_empty());
    ok(&apply(&mut s, insert("b", "2", false), 0));
    assert_eq!(events(&s, 1), vec![(2, "b".into(), "2".into(), false)]);
}

/// A value that arrives as a slice of a larger buffer (a gRPC read buffer,
/// a whole log entry) is stored as a copy of its own: keeping the slice
/// would keep the whole buffer alive.
#[test]
fn a_stored_value_does_not_share_the_update_buffer() {
    let buffer = bytes::Bytes::from(vec![7u8; 8192]);
    let value = buffer.slice(1024..2048);
    let mut s = State::new();
    ok(&apply(
        &mut s,
        journal::pb::update::Command::from(journal::pb::coordination::KvInsert {
            key: "k".into(),
            value,
            allow_overwrite: false,
        }),
        0,
    ));
    let stored = s.coordination().kv_get("k").unwrap();
    assert_eq!(stored.as_ref(), &[7u8; 1024][..]);
    let within = buffer.as_ptr_range();
    assert!(
        !within.contains(&stored.as_ptr()),
        "the stored value points into the update's buffer"
    );
}
