//! The journal's apply path alone: N KvInsert updates of 256-byte values
//! over 10,000 keys (64 clients' origins) applied to a configured state,
//! timed without the updates' construction. For comparing builds side by
//! side (same machine, same run), e.g. the default namespace's cost:
//!
//!     cargo run --release -p coordstore-journal --example apply_bench -- 300000
//!
//! Prints `N applies in T: X ns/apply`.

use journal::pb::{
    coordination::KvInsert, update::Command, ClusterConfig, InitService, JobSpec, Origin, Update,
};
use journal::State;
use std::time::Instant;

fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(300_000);
    let mut s = State::default();
    let init = Update {
        command: Some(Command::InitService(InitService {
            config: Some(ClusterConfig {
                jobs: vec![JobSpec {
                    name: "jax_worker".into(),
                    count: 1,
                }],
                heartbeat_timeout_ms: 100000,
                register_timeout_ms: 1,
                shutdown_timeout_ms: 1,
                register_with_barrier: true,
                ..Default::default()
            }),
            service_incarnation: 7,
        })),
        ..Default::default()
    };
    let o = s.apply(&init);
    assert!(o.error.is_none(), "{:?}", o.error);
    let value = bytes::Bytes::from(vec![7u8; 256]);
    let ups: Vec<Update> = (0..n)
        .map(|i| Update {
            origin: Some(Origin {
                client_id: 1 + (i % 64),
                seq: i / 64 + 1,
                done_below: i / 64 + 1,
            }),
            at_ms: 1000 + i,
            command: Some(Command::from(KvInsert {
                key: format!("k/{}", i % 10000),
                value: value.clone(),
                allow_overwrite: true,
            })),
            ..Default::default()
        })
        .collect();
    let t0 = Instant::now();
    for u in &ups {
        let o = s.apply(u);
        debug_assert!(o.error.is_none());
    }
    let el = t0.elapsed();
    println!(
        "{} applies in {:?}: {:.0} ns/apply",
        n,
        el,
        el.as_nanos() as f64 / n as f64
    );
}
