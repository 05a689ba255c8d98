//! coordstore-journal: the replicated command set and the pure coordination
//! state machine. An [`Update`] (a prost message, `proto/journal.proto`) is
//! what the leader proposes; [`State::apply`] is a deterministic function of
//! the state and the update — no I/O, no clock, no randomness — so every
//! replica and every replay computes the same state. The leader puts the time
//! (`at_ms`) and random values (incarnations) into the update.
//!
//! Calls that wait (registration, barriers, PollForError, GetAliveTasks,
//! shutdown, WaitForAllTasks) apply an update that returns a *parked* outcome
//! with a call id; the service then re-reads the state after each apply with
//! the matching `*_result` function until it answers. That keeps the waiting
//! itself out of the replicated state and lets a new leader re-park calls.
//!
//! Snapshots are the prost encoding of the whole state ([`State::encode_snapshot`]);
//! [`State::digest`] hashes that canonical encoding.
//!
//! ```
//! use journal::{pb, State, Update};
//! let mut s = State::new();
//! let kv = pb::KvInsert { key: "/a//b".into(), value: "1".into(), allow_overwrite: false };
//! let out = s.apply(&Update { command: Some(pb::update::Command::KvInsert(kv)), ..Default::default() });
//! assert!(!out.is_err());
//! assert_eq!(s.kv_get("a/b").unwrap().as_ref(), b"1");
//! ```

/// The generated prost types of `proto/journal.proto`.
#[allow(missing_docs, clippy::all)]
pub mod pb {
    include!(concat!(env!("OUT_DIR"), "/coordstore.journal.rs"));
}

mod alive;
mod barrier;
pub mod errors;
mod keys;
mod kv;
mod state;
mod tasks;

pub use alive::AliveTasks;
pub use barrier::{shutdown_barrier_id, wait_all_barrier_id, BarrierDeadline, REGISTER_BARRIER};
pub use keys::normalize_key;
pub use kv::{Compacted, DEFAULT_WATCH_HISTORY_BYTES, MAX_WATCH_EVENTS};
pub use pb::{Code, DomainError, Outcome, TaskStatus, Update};
pub use state::{
    task_name, SnapshotError, State, DEFAULT_MAX_CLIENT_SESSIONS, DEFAULT_MAX_OUTCOMES_PER_CLIENT,
    DEFAULT_SESSION_HORIZON_MS, JAX_JOB, SESSION_SWEEP_EVERY,
};
pub use tasks::{HeartbeatCheck, WAIT_FOR_ALL_TASKS_TIMEOUT_MS};
