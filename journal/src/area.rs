//! The seam every area of the state plugs into.
//!
//! An area owns its part of the state (a prost message inside `StateData`)
//! and its command (a oneof inside `Update.command`). [`crate::State::apply`]
//! runs what the areas share — exactly-once sessions, the job epoch — and
//! hands the area's command to [`Area::apply`]. Areas do not call each
//! other: what one area does that matters to the others is reported as an
//! effect in [`Context`] (a task lost) or is a shared command (a job epoch
//! reset), and reaches every area through the hooks below. What an apply
//! changes that a parked call may wait on is reported as [`Object`]s (see
//! `crate::wait`).

use crate::cluster::Cluster;
use crate::pb::Outcome;

/// What an area sees and may change of the shared state while it applies.
pub struct Context<'a> {
    /// The configuration, service incarnation and job epoch.
    pub cluster: Cluster<'a>,
    /// Leader time of the update being applied.
    pub at_ms: u64,
    pub(crate) next_call_id: &'a mut u64,
    pub(crate) lost: &'a mut Vec<u32>,
    /// Where the apply records what it changes, if anywhere.
    pub(crate) touched: Option<&'a mut Touched>,
    /// Bytes of the namespace's KV keys and values: the coordination area
    /// keeps it, the state holds it beside the snapshot (it is derived).
    pub(crate) kv_bytes: &'a mut u64,
    /// Keys and bytes the coordination area's store holds, as the apply
    /// began (the torch store counts them against the namespace's bounds).
    pub(crate) coordination_held: Held,
    /// Keys and bytes the torch store holds, as the apply began (the
    /// coordination area counts them against the namespace's bounds).
    pub(crate) torch_held: Held,
}

/// Keys and bytes an area's store holds, for the namespace's bounds (which
/// count the coordination store's and the torch store's together).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Held {
    /// Keys (a queue counts as one).
    pub keys: u64,
    /// Bytes of keys and values.
    pub bytes: u64,
}

impl Context<'_> {
    /// A new call id (unique in the state, never reused) for a parked call.
    pub fn next_call_id(&mut self) -> u64 {
        *self.next_call_id += 1;
        *self.next_call_id
    }

    /// Reports that `task` was lost: it failed, disconnected, or came back
    /// as a new incarnation. Every other area hears of it through
    /// [`Area::on_task_lost`] once this update has applied.
    pub fn task_lost(&mut self, task: u32) {
        // Repeats are dropped where the list is read (a check here would
        // make a whole job disconnecting at once O(N²)).
        self.lost.push(task);
    }

    /// Reports a change of `object`, which a parked call may wait on (see
    /// [`crate::wait`]); `object` is built only when changes are recorded.
    pub fn touch(&mut self, object: impl FnOnce() -> Object) {
        if let Some(t) = self.touched.as_deref_mut() {
            t.objects
                .push((self.cluster.namespace.to_string(), object()));
        }
    }
}

/// One area of the replicated state.
pub trait Area {
    /// The area's command (the oneof inside `Update.command`).
    type Command;

    /// Applies one command of this area.
    fn apply(&mut self, cx: &mut Context<'_>, command: &Self::Command) -> Outcome;

    /// The service was configured (`InitService`): the first job epoch begins.
    fn on_init(&mut self, cx: &mut Context<'_>);

    /// A new job epoch began (`ResetJobEpoch`): the previous job's state is
    /// gone, the configuration may have changed.
    fn on_epoch_reset(&mut self, cx: &mut Context<'_>);

    /// Another area lost `task` (see [`Context::task_lost`]).
    fn on_task_lost(&mut self, cx: &mut Context<'_>, task: u32);

    /// Checks this area's part of a decoded snapshot against the shared part:
    /// a snapshot that would make a later apply panic is refused on install.
    fn check_snapshot(&self, cluster: Cluster<'_>) -> Result<(), String>;

    /// Checks every invariant of this area's part: what
    /// [`Area::check_snapshot`] checks and what the area's commands keep
    /// besides. Run after every apply in debug builds and by the property
    /// tests ([`crate::State::check_invariants`]); a failure names the
    /// broken rule.
    fn check_invariants(&self, cluster: Cluster<'_>) -> Result<(), String>;
}

/// The conversions an area's commands get: each command message into the
/// area's oneof, into `update::Command` and into an `Update`, so callers
/// write `Update::from(KvInsert { .. })`; and each command's name (`name`,
/// for messages: the list must name every command, or the match is not
/// exhaustive). `$area` is the area's prost module (`pb::$area`) and
/// `$variant` its arm of `Update.command`.
macro_rules! area_commands {
    ($area:ident, $variant:ident, $($t:ident),* $(,)?) => {
        impl crate::pb::$area::command::Command {
            /// The command's name, for messages (no payload formatted).
            pub fn name(&self) -> &'static str {
                match self {
                    $(crate::pb::$area::command::Command::$t(_) => stringify!($t),)*
                }
            }
        }
        impl From<crate::pb::$area::command::Command> for crate::pb::update::Command {
            fn from(c: crate::pb::$area::command::Command) -> Self {
                crate::pb::update::Command::$variant(crate::pb::$area::Command { command: Some(c) })
            }
        }
        impl From<crate::pb::$area::command::Command> for crate::pb::Update {
            fn from(c: crate::pb::$area::command::Command) -> Self {
                crate::pb::Update::from(crate::pb::update::Command::from(c))
            }
        }
        $(
            impl From<crate::pb::$area::$t> for crate::pb::$area::command::Command {
                fn from(c: crate::pb::$area::$t) -> Self {
                    crate::pb::$area::command::Command::$t(c)
                }
            }
            impl From<crate::pb::$area::$t> for crate::pb::update::Command {
                fn from(c: crate::pb::$area::$t) -> Self {
                    crate::pb::update::Command::from(crate::pb::$area::command::Command::$t(c))
                }
            }
            impl From<crate::pb::$area::$t> for crate::pb::Update {
                fn from(c: crate::pb::$area::$t) -> Self {
                    crate::pb::Update::from(crate::pb::$area::command::Command::$t(c))
                }
            }
        )*
    };
}
pub(crate) use area_commands;

/// A part of a namespace a parked call waits on: a change of it may change
/// the call's answer.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Object {
    /// A KV key (normalised).
    Key(String),
    /// A barrier id (every instance of it).
    Barrier(String),
    /// A task's entry.
    Task(u32),
    /// The task-state version (WatchTasks).
    TaskStates,
    /// A GetAliveTasks round (its key).
    AliveRound(String),
    /// A closure queue and its closures.
    Queue(String),
    /// A torch store connection's waits (by its id).
    StoreConnection(u64),
    /// A rendezvous run (by its id).
    Rendezvous(String),
}

/// What an apply changed.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Touched {
    /// A change that concerns every waiter of every namespace (a state
    /// replaced by a snapshot).
    pub all: bool,
    /// Namespaces (keys: "" for the default one) whose every waiter a
    /// change concerns: configured, reset, created or deleted.
    pub namespaces: Vec<String>,
    /// The objects changed with their namespace (key), in order, possibly
    /// repeated.
    pub objects: Vec<(String, Object)>,
    /// A namespace was created or deleted.
    pub namespace_set: bool,
}

impl Touched {
    /// Everything changed.
    pub fn everything() -> Self {
        Touched {
            all: true,
            namespace_set: true,
            ..Default::default()
        }
    }

    /// Forgets what was recorded.
    pub fn clear(&mut self) {
        self.all = false;
        self.namespaces.clear();
        self.objects.clear();
        self.namespace_set = false;
    }

    /// Whether nothing was recorded.
    pub fn is_empty(&self) -> bool {
        !self.all && !self.namespace_set && self.namespaces.is_empty() && self.objects.is_empty()
    }
}

impl crate::Update {
    /// The command's name, for messages: `CreateNamespace`, `KvInsert`, ...
    pub fn command_name(&self) -> String {
        use crate::pb::update::Command;
        let Some(c) = &self.command else {
            return "an update without a command".into();
        };
        let area = match c {
            Command::Coordination(a) => a.command.as_ref().map(|c| c.name()),
            Command::Dispatcher(a) => a.command.as_ref().map(|c| c.name()),
            Command::Closures(a) => a.command.as_ref().map(|c| c.name()),
            Command::Torch(a) => a.command.as_ref().map(|c| c.name()),
            Command::Rendezvous(a) => a.command.as_ref().map(|c| c.name()),
            // The variant's name: what its Debug form starts with.
            shared => {
                let text = format!("{shared:?}");
                return text
                    .split(['(', ' ', '{'])
                    .next()
                    .unwrap_or_default()
                    .to_string();
            }
        };
        area.unwrap_or("an update without a command").to_string()
    }
}
