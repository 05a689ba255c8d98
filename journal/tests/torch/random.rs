//! Random sequences of store commands from a few connections: every
//! invariant holds after each (the byte count, the registrations each
//! connection counts), and a snapshot taken anywhere replays to the same
//! state as the original.

use proptest::prelude::*;

use super::*;

const KEYS: [&str; 4] = ["/a", "/b", "/q", "init/"];

fn key() -> impl Strategy<Value = String> {
    prop::sample::select(&KEYS[..]).prop_map(str::to_string)
}

fn value() -> impl Strategy<Value = Bytes> {
    prop_oneof![
        Just(Bytes::new()),
        Just(Bytes::from_static(b"7")),
        Just(Bytes::from_static(b"x")),
        prop::collection::vec(any::<u8>(), 0..6).prop_map(Bytes::from),
    ]
}

fn command() -> impl Strategy<Value = t::command::Command> {
    use t::command::Command as K;
    let conn = 1u64..4;
    prop_oneof![
        (key(), value()).prop_map(|(key, value)| K::Set(t::Set { key, value })),
        (key(), value(), value()).prop_map(|(key, expected, desired)| K::CompareSet(
            t::CompareSet {
                key,
                expected,
                desired
            }
        )),
        (key(), -3i64..3).prop_map(|(key, delta)| K::Add(t::Add { key, delta })),
        (key(), value()).prop_map(|(key, value)| K::Append(t::Append { key, value })),
        key().prop_map(|key| K::DeleteKey(t::DeleteKey { key })),
        (key(), value()).prop_map(|(key, value)| K::QueuePush(t::QueuePush { key, value })),
        key().prop_map(|key| K::QueuePop(t::QueuePop { key })),
        (conn.clone(), prop::collection::vec(key(), 0..3))
            .prop_map(|(connection, keys)| K::Wait(t::Wait { connection, keys })),
        (conn.clone(), key(), -1i64..4).prop_map(|(connection, key, world_size)| K::Barrier(
            t::Barrier {
                connection,
                key,
                world_size
            }
        )),
        conn.clone()
            .prop_map(|connection| K::CancelWait(t::CancelWait { connection })),
        conn.prop_map(|c| K::Forget(t::Forget {
            connections: vec![c]
        })),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn invariants_hold_and_snapshots_replay(cmds in prop::collection::vec(command(), 1..60), cut in 0usize..60) {
        let mut t = T::new();
        let mut tail = None;
        for (i, c) in cmds.iter().enumerate() {
            if i == cut.min(cmds.len() - 1) {
                tail = Some((State::decode_snapshot(&t.s.encode_snapshot()).unwrap(), i));
            }
            t.now += 10;
            t.run(Update::from(journal::pb::update::Command::from(c.clone())));
        }
        let (mut replayed, from) = tail.unwrap();
        let mut now = 1_000_000 + 10 * from as u64;
        for c in &cmds[from..] {
            now += 10;
            let mut u = Update::from(journal::pb::update::Command::from(c.clone()));
            u.at_ms = now;
            replayed.apply(&u);
        }
        prop_assert_eq!(replayed.digest(), t.s.digest());
        let total: u64 = (1..4).map(|c| t.connection(c).map_or(0, |v| v.registered)).sum();
        prop_assert!(total <= 3 * 60);
    }
}
