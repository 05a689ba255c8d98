//! Bounded fuzzing inside the test suite: arbitrary bytes decoded as journal
//! updates (and as snapshots) never panic, and whatever decodes applies to a
//! configured state without panicking and deterministically. Longer runs:
//! `PROPTEST_CASES=100000 cargo test -p coordstore-journal --test fuzz_decode_apply`.

mod common;

use common::*;
use journal::{State, Update};
use proptest::prelude::*;
use prost::Message;

fn configured() -> State {
    let mut s = new_state(3, &Opts::default());
    register_all(&mut s, 1);
    s
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_decode_and_apply_without_panic(chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..64), 1..16)) {
        let mut a = configured();
        let mut b = configured();
        for bytes in &chunks {
            if let Ok(u) = Update::decode(bytes.as_slice()) {
                let out_a = a.apply(&u);
                let out_b = b.apply(&u);
                prop_assert_eq!(out_a, out_b);
            }
        }
        prop_assert_eq!(a.digest(), b.digest());
    }

    #[test]
    fn arbitrary_bytes_never_panic_as_snapshots(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = State::decode_snapshot(&bytes);
    }

    #[test]
    fn mutated_valid_updates_apply_without_panic(seed in proptest::collection::vec((0usize..64, any::<u8>()), 0..8)) {
        // Start from real commands and flip bytes in their encodings.
        let mut s = configured();
        let cmds = vec![
            insert("a/b", "1", false),
            incr("n", 3),
            delete("a"),
            register(1, tinc(1)),
            arrive("b", 0, 1000, &[], 0),
        ];
        for cmd in cmds {
            let mut bytes = Update { command: Some(cmd), ..Default::default() }.encode_to_vec();
            for (pos, val) in &seed {
                if !bytes.is_empty() {
                    let i = pos % bytes.len();
                    bytes[i] ^= val;
                }
            }
            if let Ok(u) = Update::decode(bytes.as_slice()) {
                let _ = s.apply(&u);
            }
        }
        let restored = State::decode_snapshot(&s.encode_snapshot()).expect("own snapshot decodes");
        prop_assert_eq!(restored.digest(), s.digest());
    }
}
