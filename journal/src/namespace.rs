//! Namespaces: the state holds one namespace per job, each with its own
//! configuration, service incarnation, job epoch and every area's state;
//! a command names its namespace (`Update.namespace`, "" for the default
//! one) and acts on that namespace alone, so two jobs never meet. The
//! default namespace keeps its parts in `StateData`'s own fields, where
//! they were before namespaces existed (a data dir written then is read as
//! the default namespace, its encoding unchanged); every other one is a
//! `NamespaceData` in `StateData.namespaces`.
//!
//! [`Namespace`] is one namespace read-only: the same readers the state has
//! for the default one.

use crate::cluster::Cluster;
use crate::pb::{ClusterConfig, Code, DomainError, NamespaceSpec};
use crate::{closures, coordination, dispatcher, errors, rendezvous, torch};

pub use crate::names::{
    namespace_key, namespace_name, valid_name, DEFAULT_NAMESPACE, MAX_NAME_LEN,
};

/// One namespace, read-only.
#[derive(Clone, Copy, Debug)]
pub struct Namespace<'a> {
    pub(crate) key: &'a str,
    pub(crate) initialized: bool,
    pub(crate) config: Option<&'a ClusterConfig>,
    pub(crate) service_incarnation: u64,
    pub(crate) epoch: u64,
    pub(crate) spec: Option<&'a NamespaceSpec>,
    pub(crate) last_active_ms: u64,
    /// Bytes of its KV keys and values (kept beside the state).
    pub(crate) kv_bytes: u64,
    pub(crate) coordination: &'a coordination::Data,
    pub(crate) dispatcher: &'a dispatcher::Data,
    pub(crate) closures: &'a closures::Data,
    /// Absent until the store's first command.
    pub(crate) torch: Option<&'a torch::Data>,
    /// Absent until the first rendezvous command.
    pub(crate) rendezvous: Option<&'a rendezvous::Data>,
}

/// What a namespace holds, for operators: its tasks by status, its
/// pending barriers, and the keys and bytes of every store together (what
/// its bounds count). Every view (the Node API, the status page, the
/// metrics) shows these.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Tasks by status: disconnected, connected, in error.
    pub tasks: [u64; 3],
    /// Barrier ids whose newest instance is pending.
    pub barriers_pending: u64,
    /// Keys and bytes, the coordination store's and PyTorch's together.
    pub held: crate::area::Held,
}

impl<'a> Namespace<'a> {
    /// What it holds (O(tasks + barriers)).
    pub fn usage(&self) -> Usage {
        let c = self.coordination().stats();
        let t = self.torch().held();
        Usage {
            tasks: c.tasks,
            barriers_pending: c.barriers_pending,
            held: crate::area::Held {
                keys: c.keys + t.keys,
                bytes: c.kv_bytes + t.bytes,
            },
        }
    }

    /// Its name (`default` for the default one).
    pub fn name(&self) -> &'a str {
        namespace_name(self.key)
    }

    /// How the state keys it ("" for the default one).
    pub fn key(&self) -> &'a str {
        self.key
    }

    /// Whether it is the default namespace.
    pub fn is_default(&self) -> bool {
        self.key.is_empty()
    }

    /// What it has besides its configuration (none for the default one,
    /// which the node's flags describe).
    pub fn spec(&self) -> Option<&'a NamespaceSpec> {
        self.spec
    }

    /// Leader time of the last update applied in it (0 for the default one).
    pub fn last_active_ms(&self) -> u64 {
        self.last_active_ms
    }

    /// The shared part: configuration, service incarnation, job epoch.
    pub fn cluster(&self) -> Cluster<'a> {
        Cluster {
            config: self.config,
            service_incarnation: self.service_incarnation,
            epoch: self.epoch,
            namespace: self.key,
            max_bytes: self.spec.map_or(0, |s| s.max_bytes),
        }
    }

    /// The coordination area, read-only.
    pub fn coordination(&self) -> coordination::Reader<'a> {
        coordination::Reader {
            cl: self.cluster(),
            data: self.coordination,
            kv_bytes: self.kv_bytes,
        }
    }

    /// The tf.data dispatcher area, read-only.
    pub fn dispatcher(&self) -> dispatcher::Reader<'a> {
        dispatcher::Reader {
            data: self.dispatcher,
        }
    }

    /// The closure-queue area, read-only.
    pub fn closures(&self) -> closures::Reader<'a> {
        closures::Reader {
            data: self.closures,
        }
    }

    /// The PyTorch store, read-only (empty until its first command).
    pub fn torch(&self) -> torch::Reader<'a> {
        static EMPTY: std::sync::OnceLock<torch::Data> = std::sync::OnceLock::new();
        torch::Reader {
            data: self
                .torch
                .unwrap_or_else(|| EMPTY.get_or_init(Default::default)),
        }
    }

    /// torchrun's rendezvous, read-only (empty until its first command).
    pub fn rendezvous(&self) -> rendezvous::Reader<'a> {
        static EMPTY: std::sync::OnceLock<rendezvous::Data> = std::sync::OnceLock::new();
        rendezvous::Reader {
            data: self
                .rendezvous
                .unwrap_or_else(|| EMPTY.get_or_init(Default::default)),
        }
    }

    /// Whether the service (namespace) is configured.
    pub fn is_initialized(&self) -> bool {
        self.initialized
    }

    /// The service incarnation (0 before initialisation).
    pub fn service_incarnation(&self) -> u64 {
        self.service_incarnation
    }

    /// The job epoch, bumped by every reset.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The configuration, if initialised.
    pub fn config(&self) -> Option<&'a ClusterConfig> {
        self.config
    }

    /// Number of tasks in the configuration.
    pub fn task_count(&self) -> u32 {
        self.cluster().task_count()
    }

    /// Dense index of task `id` of job `job`.
    pub fn task_index(&self, job: &str, id: i32) -> Option<u32> {
        self.cluster().task_index(job, id)
    }

    /// (job, task id) of a dense index.
    pub fn task_id(&self, index: u32) -> Option<(&'a str, i32)> {
        self.cluster().task_id(index)
    }

    /// The TensorFlow-style name of a task: `/job:NAME/replica:0/task:ID`.
    pub fn task_name(&self, index: u32) -> String {
        self.cluster().task_name(index)
    }

    /// How messages name a task (see [`Cluster::label`]).
    pub fn label(&self, index: u32) -> String {
        self.cluster().label(index)
    }

    /// Whether its job is done (the TTL rule's "done"): every task shut
    /// down, or never registered.
    pub fn is_done(&self) -> bool {
        self.coordination
            .tasks
            .iter()
            .all(|t| t.status() == coordination::TaskStatus::Disconnected)
    }
}

/// A namespace name that is not a DNS label.
pub fn bad_name(name: &str) -> DomainError {
    errors::bare(
        Code::InvalidArgument,
        format!(
            "invalid namespace name {name:?}: a namespace is a DNS label \
             ([a-z0-9]([-a-z0-9]{{0,61}}[a-z0-9])?)"
        ),
    )
}

/// A call or command naming a namespace that does not exist. The payload
/// makes a stock jaxlib client fail at once instead of retrying its
/// registration.
pub fn unknown(key: &str) -> DomainError {
    errors::with_payload(
        Code::NotFound,
        format!("namespace {} does not exist", namespace_name(key)),
    )
}

/// A call the namespace does not admit (its client certificate's names
/// match none of the namespace's patterns). The payload makes a stock
/// jaxlib client fail at once instead of retrying its registration.
pub fn not_admitted(name: &str, why: &str) -> DomainError {
    errors::with_payload(
        Code::PermissionDenied,
        format!("namespace {name} does not admit this client: {why}"),
    )
}

/// A call parked in a namespace that was deleted meanwhile: UNAVAILABLE for
/// a coordination call (the code of a service that went away: a stock
/// jaxlib task ends at once), NOT_FOUND for a closure-queue call (its
/// worker and coordinator stop instead of retrying).
pub fn deleted(key: &str, coordination: bool) -> DomainError {
    let message = format!("namespace {} was deleted", namespace_name(key));
    if coordination {
        errors::with_payload(Code::Unavailable, message)
    } else {
        errors::bare(Code::NotFound, message)
    }
}

/// A create of a namespace that exists.
pub fn exists(name: &str) -> DomainError {
    errors::bare(
        Code::AlreadyExists,
        format!("namespace {name} already exists"),
    )
}

/// A create of a namespace with a port another namespace has.
pub fn port_taken(port: u32, by: &str) -> DomainError {
    errors::bare(
        Code::AlreadyExists,
        format!("port {port} is already the port of namespace {by}"),
    )
}

/// A create of a namespace with a port outside the cluster's range.
pub fn port_outside(port: u32, low: u32, high: u32) -> DomainError {
    errors::bare(
        Code::InvalidArgument,
        format!("port {port} is outside the namespace port range {low}-{high}"),
    )
}

/// A create past the cluster's bound on namespaces.
pub fn too_many(max: u64) -> DomainError {
    errors::bare(
        Code::ResourceExhausted,
        format!("the cluster already holds its limit of {max} namespaces (--max-namespaces)"),
    )
}

/// A delete of the default namespace.
pub fn default_kept() -> DomainError {
    errors::bare(
        Code::FailedPrecondition,
        "the default namespace cannot be deleted (reset it instead)",
    )
}

/// A create whose configuration has no task.
pub fn no_tasks(name: &str) -> DomainError {
    errors::bare(
        Code::InvalidArgument,
        format!("namespace {name}: a job needs at least one task"),
    )
}
