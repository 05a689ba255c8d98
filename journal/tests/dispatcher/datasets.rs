//! Datasets: ids, deduplication, requested ids, the size bound, compression.

use crate::common::{err, ok};
use crate::*;
use journal::dispatcher::MAX_DATASET_DEF_BYTES;
use journal::Code;

fn register_req(def: &[u8], meta: &str, id: Option<&str>, compression: i32) -> d::RegisterDataset {
    d::RegisterDataset {
        definition: def.to_vec().into(),
        metadata: meta.as_bytes().to_vec().into(),
        compression,
        requested_id: id.map(Into::into),
    }
}

#[test]
fn ids_start_at_1000_and_identical_datasets_are_one() {
    let mut s = state();
    let a = register(&mut s, "graph a", "meta");
    assert_eq!(a, "1000");
    assert_eq!(register(&mut s, "graph a", "meta"), a, "deduplicated");
    assert_eq!(register(&mut s, "graph b", "meta"), "1001");
    assert_eq!(register(&mut s, "graph a", "other meta"), "1002");
    assert_eq!(s.dispatcher().datasets().count(), 3);
    assert_eq!(
        s.dispatcher().dataset("1000").unwrap().definition.as_ref(),
        b"graph a"
    );
}

#[test]
fn a_requested_id_is_reused_when_its_metadata_matches() {
    let mut s = state();
    let out = run(&mut s, register_req(b"g", "m", Some("mine"), 0), 1);
    assert_eq!(out.dataset_id(), Some("mine"));
    let again = run(
        &mut s,
        register_req(b"other graph", "m", Some("mine"), 0),
        1,
    );
    assert_eq!(again.dataset_id(), Some("mine"));
    let e = err(
        &run(&mut s, register_req(b"g", "different", Some("mine"), 0), 1),
        Code::InvalidArgument,
    );
    assert!(e.message.contains("same structure"), "{}", e.message);
    // A numeric id asked for is skipped by later drawn ids.
    ok(&run(&mut s, register_req(b"g", "m", Some("1000"), 0), 1));
    assert_eq!(register(&mut s, "fresh", "m"), "1001");
}

#[test]
fn a_definition_over_the_bound_is_refused_and_nothing_is_stored() {
    let mut s = state();
    let big = vec![0u8; MAX_DATASET_DEF_BYTES + 1];
    let e = err(
        &run(&mut s, register_req(&big, "m", None, 0), 1),
        Code::InvalidArgument,
    );
    assert!(e.message.contains("more than the limit"), "{}", e.message);
    assert_eq!(s.dispatcher().datasets().count(), 0);
}

#[test]
fn the_first_compression_decision_wins_and_uncompressed_datasets_have_none() {
    let mut s = state();
    let snappy = run(&mut s, register_req(b"g", "m", None, 2), 1)
        .dataset_id()
        .unwrap()
        .to_string();
    let plain = run(&mut s, register_req(b"h", "m", None, 1), 1)
        .dataset_id()
        .unwrap()
        .to_string();
    let decide = |s: &mut State, id: &str, disable| {
        run(
            s,
            d::DisableCompression {
                dataset_id: id.into(),
                disable,
            },
            1,
        )
    };
    assert_eq!(
        decide(&mut s, &snappy, true).compression_decision(),
        Some(Some(true))
    );
    assert_eq!(
        decide(&mut s, &snappy, false).compression_decision(),
        Some(Some(true))
    );
    assert_eq!(
        decide(&mut s, &plain, true).compression_decision(),
        Some(None)
    );
    err(&decide(&mut s, "nope", true), Code::NotFound);
}
