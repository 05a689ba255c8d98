//! Journal update decoding and apply: any bytes that decode as updates apply
//! to a configured state without panicking, deterministically, and the
//! state's snapshot restores to the same digest.
#![no_main]

use journal::pb::{update::Command, ClusterConfig, InitService, JobSpec};
use journal::{State, Update};
use libfuzzer_sys::fuzz_target;
use prost::Message;

fn configured() -> State {
    let mut s = State::new();
    let config = ClusterConfig {
        jobs: vec![JobSpec {
            name: "jax_worker".into(),
            count: 3,
        }],
        register_with_barrier: true,
        heartbeat_timeout_ms: 10_000,
        register_timeout_ms: 60_000,
        shutdown_timeout_ms: 5_000,
        ..Default::default()
    };
    s.apply(&Update {
        command: Some(Command::InitService(InitService {
            config: Some(config),
            service_incarnation: 7,
        })),
        ..Default::default()
    });
    s
}

fuzz_target!(|data: &[u8]| {
    let mut a = configured();
    let mut b = configured();
    // Split the input into length-prefixed updates.
    let mut rest = data;
    while let Some((&len, tail)) = rest.split_first() {
        let n = (len as usize).min(tail.len());
        let (chunk, next) = tail.split_at(n);
        rest = next;
        if let Ok(u) = Update::decode(chunk) {
            assert_eq!(a.apply(&u), b.apply(&u));
        }
    }
    assert_eq!(a.digest(), b.digest());
    let restored = State::decode_snapshot(&a.encode_snapshot()).expect("own snapshot");
    assert_eq!(restored.digest(), a.digest());
});
