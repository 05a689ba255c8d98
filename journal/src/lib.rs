//! coordstore-journal: the replicated command set and the pure state
//! machine. An [`Update`] (a prost message, `proto/journal.proto`) is what the
//! leader proposes; [`State::apply`] is a deterministic function of the state
//! and the update — no I/O, no clock, no randomness — so every replica and
//! every replay computes the same state. The leader puts the time (`at_ms`)
//! and random values (incarnations) into the update.
//!
//! The state has **areas**, each one module with its own command, reply,
//! state and errors: [`coordination`], the tf.data [`dispatcher`], the
//! [`closures`] queue, PyTorch's store ([`torch`]) and torchrun's
//! [`rendezvous`]. `State::apply` handles what the areas share (the
//! cluster configuration and job epoch, exactly-once sessions) and hands an
//! area's command to that area ([`area::Area`]). Areas never call each
//! other: a cross-area effect (a task lost, a job epoch reset) reaches every
//! area through the hooks of [`area::Area`].
//!
//! Calls that wait (registration, barriers, PollForError, GetAliveTasks,
//! shutdown, WaitForAllTasks, blocking gets, closure gets and fetches) apply
//! an update that returns a *parked* outcome with a call id (or only read);
//! the service then re-reads [`State::wait_result`] for the call's
//! [`wait::Wait`] each time one of its objects changes
//! ([`State::apply_traced`] reports what each update changed), until it
//! answers. That keeps the waiting itself out of the replicated state and
//! lets a new leader re-park calls.
//!
//! Snapshots are the prost encoding of the whole state ([`State::encode_snapshot`]);
//! [`State::digest`] hashes that canonical encoding.
//!
//! ```
//! use journal::{pb, State, Update};
//! let mut s = State::new();
//! let kv = pb::coordination::KvInsert { key: "/a//b".into(), value: "1".into(), allow_overwrite: false };
//! let out = s.apply(&Update::from(kv));
//! assert!(!out.is_err());
//! assert_eq!(s.coordination().kv_get("a/b").unwrap().as_ref(), b"1");
//! ```

/// The generated prost types of `proto/*.proto`: the shared messages here,
/// each area's in its own module.
#[allow(missing_docs, clippy::all)]
pub mod pb {
    include!(concat!(env!("OUT_DIR"), "/coordstore.journal.rs"));

    /// The coordination area's messages (`proto/coordination.proto`).
    pub mod coordination {
        include!(concat!(
            env!("OUT_DIR"),
            "/coordstore.journal.coordination.rs"
        ));
    }

    /// The tf.data dispatcher area's messages (`proto/dispatcher.proto`).
    pub mod dispatcher {
        include!(concat!(
            env!("OUT_DIR"),
            "/coordstore.journal.dispatcher.rs"
        ));
    }

    /// The closure-queue area's messages (`proto/closures.proto`).
    pub mod closures {
        include!(concat!(env!("OUT_DIR"), "/coordstore.journal.closures.rs"));
    }

    /// The PyTorch store area's messages (`proto/torch.proto`).
    pub mod torch {
        include!(concat!(env!("OUT_DIR"), "/coordstore.journal.torch.rs"));
    }

    /// The rendezvous area's messages (`proto/rendezvous.proto`).
    pub mod rendezvous {
        include!(concat!(
            env!("OUT_DIR"),
            "/coordstore.journal.rendezvous.rs"
        ));
    }
}

pub mod area;
pub mod closures;
mod cluster;
pub mod coordination;
pub mod dispatcher;
pub mod errors;
pub mod known;
pub mod level;
mod names;
pub mod namespace;
pub mod rendezvous;
mod state;
pub mod torch;
pub mod wait;

pub use cluster::{task_name, Cluster, JAX_JOB};
pub use known::{decode_known, NotKnown};
pub use level::{
    FEATURE_LEVEL, LEVEL_BASE, LEVEL_NAMESPACES, LEVEL_RENDEZVOUS, LEVEL_TORCH, OLDEST_FORMAT,
};
pub use namespace::{Namespace, Usage, DEFAULT_NAMESPACE};
pub use pb::{Code, DomainError, Outcome, Update};
pub use state::{
    client_proposable, node_proposable, SnapshotError, State, DEFAULT_MAX_CLIENT_SESSIONS,
    DEFAULT_MAX_OUTCOMES_PER_CLIENT, DEFAULT_SESSION_HORIZON_MS, INVARIANT_CHECK_EVERY,
    INVARIANT_CHECK_SIZE, SESSION_SWEEP_EVERY,
};
pub use wait::{Answer, Object, Touched, Wait};
