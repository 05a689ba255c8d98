//! The coordination area's semantics, one file per part as in
//! `journal/src/coordination/`: registration, heartbeats, KV, barriers,
//! GetAliveTasks and WatchTasks, shutdown, errors and polls, the error table
//! of `docs/protocols.md`, and the TensorFlow dialect's rules.

#[path = "../common/mod.rs"]
mod common;

mod alive_watch;
mod barriers;
mod error_table;
mod errors_and_polls;
mod heartbeat;
mod kv;
mod registration;
mod shutdown;
mod tf_dialect;
