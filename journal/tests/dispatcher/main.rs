//! The tf.data dispatcher area's semantics, one file per part: datasets,
//! jobs and iterations, workers and tasks.

#[path = "../common/mod.rs"]
mod common;

mod datasets;
mod iterations;
mod workers;

use journal::pb::dispatcher as d;
use journal::{Outcome, State};

/// A configured state (the dispatcher does not need tasks).
pub fn state() -> State {
    common::new_state(1, &common::Opts::default())
}

pub fn run(s: &mut State, cmd: impl Into<journal::Update>, at: u64) -> Outcome {
    let mut u = cmd.into();
    u.at_ms = at;
    s.apply(&u)
}

pub fn register(s: &mut State, def: &str, meta: &str) -> String {
    let out = run(
        s,
        d::RegisterDataset {
            definition: def.as_bytes().to_vec().into(),
            metadata: meta.as_bytes().to_vec().into(),
            compression: 0,
            requested_id: None,
        },
        1,
    );
    common::ok(&out);
    out.dataset_id().unwrap().to_string()
}

pub fn job(dataset: &str, name: Option<&str>, suffix: u64) -> d::GetOrCreateJob {
    d::GetOrCreateJob {
        dataset_id: dataset.into(),
        sharding_policy: 0,
        job_name: name.map(Into::into),
        num_consumers: None,
        use_cross_trainer_cache: false,
        target_workers: 0,
        anonymous_suffix: suffix,
        split_source: None,
    }
}

pub fn new_job(s: &mut State, dataset: &str, name: Option<&str>) -> i64 {
    let out = run(s, job(dataset, name, 77), 1);
    common::ok(&out);
    out.job_id().unwrap()
}

pub fn worker(address: &str) -> d::WorkerHeartbeat {
    d::WorkerHeartbeat {
        address: address.into(),
        transfer_servers: vec![format!("grpc {address}").into_bytes().into()],
        tags: vec![],
        uid: -1,
    }
}

/// GetOrCreateIteration: (client id, iteration id, created).
pub fn iterate(s: &mut State, job: i64, repetition: i64) -> (i64, i64, bool) {
    let out = run(
        s,
        d::GetOrCreateIteration {
            job_id: job,
            repetition,
        },
        1,
    );
    common::ok(&out);
    let c = out.iteration_client().unwrap();
    (c.client_id, c.iteration_id, c.created)
}
