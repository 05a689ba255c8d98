//! `State`: the replicated truth and its `apply`. This module holds what the
//! areas share — the cluster configuration and job epoch — and hands each
//! area's command to its area (`crate::coordination`, ...); the rest lives
//! by concern beside it: the namespace lifecycle ([`namespaces`]),
//! exactly-once sessions ([`sessions`]), snapshots, the digest, levels and
//! invariants ([`snapshot`]), and reads ([`reads`]).

mod namespaces;
mod reads;
mod sessions;
mod snapshot;

use namespaces::check_namespace;
use sessions::session_lru;

use std::collections::{BTreeMap, BTreeSet};

use prost::Message;
use sha2::{Digest, Sha256};

use crate::area::Touched;
use crate::area::{Area, Context};
use crate::closures;
use crate::cluster::Cluster;
use crate::coordination;
use crate::dispatcher;
use crate::errors;
use crate::namespace::{self, namespace_key, namespace_name, Namespace};
use crate::pb::{
    outcome, update::Command, ClientSession, ClusterConfig, CreateNamespace, DeleteNamespace,
    DomainError, NamespaceData, NamespaceSpec, Origin, Outcome, StateData, Update,
};
use crate::{rendezvous, torch};

/// Default bound on the number of clients the exactly-once table remembers.
pub const DEFAULT_MAX_CLIENT_SESSIONS: u32 = 4096;
/// Default bound on the outcomes remembered per client.
pub const DEFAULT_MAX_OUTCOMES_PER_CLIENT: u32 = 1024;
/// Default age (leader clock) after which an unheard-of client is forgotten.
pub const DEFAULT_SESSION_HORIZON_MS: u64 = 15 * 60 * 1000;
/// Clients older than the horizon are swept out once per this many updates.
pub const SESSION_SWEEP_EVERY: u64 = 1024;
/// Debug builds check every invariant after each apply on a state of at
/// most this many objects (tasks, keys, history events, barriers, client
/// sessions, closures, tf.data tasks)...
pub const INVARIANT_CHECK_SIZE: usize = 1024;
/// ...and after every this many applies on a larger one.
pub const INVARIANT_CHECK_EVERY: u64 = 1024;
/// Most tasks a cluster configuration may hold.
pub const MAX_TASKS: u64 = 1 << 20;

/// The replicated state machine. `apply` is a pure function of the state and
/// the update: no I/O, no clock, no randomness.
#[derive(Clone, Debug, PartialEq)]
pub struct State {
    /// Every area's part is always present (`Some`), so equal states encode
    /// equally.
    pub(crate) data: StateData,
    /// Bytes of KV keys and values in the default namespace, and by key in
    /// the others: derived from `data` (counted again when a snapshot is
    /// decoded), kept beside it so that a snapshot and its digest hold only
    /// the state itself.
    pub(crate) default_kv_bytes: u64,
    pub(crate) kv_bytes: BTreeMap<String, u64>,
    /// The client sessions by (last touched, client id), oldest first:
    /// derived from `data.sessions` like the byte counts, so that evicting
    /// the least recently used client is a lookup, not a scan of the table
    /// (which a job of many thousand tasks keeps full).
    pub(crate) session_lru: BTreeSet<(u64, u64)>,
}

impl Default for State {
    fn default() -> Self {
        State {
            data: StateData {
                coordination: Some(Default::default()),
                dispatcher: Some(Default::default()),
                closures: Some(Default::default()),
                ..Default::default()
            },
            default_kv_bytes: 0,
            kv_bytes: BTreeMap::new(),
            session_lru: BTreeSet::new(),
        }
    }
}

/// A snapshot that could not be decoded.
#[derive(Debug)]
pub struct SnapshotError(pub String);

impl std::fmt::Display for SnapshotError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "invalid journal snapshot: {}", self.0)
    }
}

impl std::error::Error for SnapshotError {}

impl Outcome {
    /// A plain success.
    pub fn ok() -> Self {
        Outcome::default()
    }

    /// A failure.
    pub fn err(e: DomainError) -> Self {
        Outcome {
            error: Some(e),
            ..Default::default()
        }
    }

    /// The call waits on the state; `call_id` identifies it.
    pub fn parked(call_id: u64) -> Self {
        Outcome {
            parked: true,
            call_id,
            ..Default::default()
        }
    }

    /// Whether the outcome is a failure.
    pub fn is_err(&self) -> bool {
        self.error.is_some()
    }

    /// The service incarnation an `InitService` or `ResetJobEpoch` answered.
    pub fn service_incarnation(&self) -> Option<u64> {
        match self.reply {
            Some(outcome::Reply::ServiceIncarnation(inc)) => Some(inc),
            _ => None,
        }
    }

    fn with_service_incarnation(inc: u64) -> Self {
        Outcome {
            reply: Some(outcome::Reply::ServiceIncarnation(inc)),
            ..Default::default()
        }
    }
}

impl From<Result<Outcome, DomainError>> for Outcome {
    fn from(r: Result<Outcome, DomainError>) -> Self {
        r.unwrap_or_else(Outcome::err)
    }
}

impl From<Command> for Update {
    /// An update of `command` with no origin, time or epoch.
    fn from(command: Command) -> Self {
        Update {
            command: Some(command),
            ..Default::default()
        }
    }
}

/// Whether a client may propose `command`: the shared commands a client
/// issues (a job epoch reset, a no-op) and each area's own allow-list.
/// `InitService` is the node's to propose at start-up.
pub fn client_proposable(command: &Command) -> bool {
    match command {
        Command::ResetJobEpoch(_) | Command::Noop(_) => true,
        // The node's to propose: the leader stamps the port, the service
        // incarnation and the cluster's bounds.
        Command::InitService(_)
        | Command::CreateNamespace(_)
        | Command::DeleteNamespace(_)
        | Command::SetFeatureLevel(_) => false,
        Command::Coordination(c) => c
            .command
            .as_ref()
            .is_some_and(coordination::client_proposable),
        Command::Dispatcher(c) => c
            .command
            .as_ref()
            .is_some_and(dispatcher::client_proposable),
        Command::Closures(c) => c.command.as_ref().is_some_and(closures::client_proposable),
        Command::Torch(c) => c.command.as_ref().is_some_and(torch::client_proposable),
        Command::Rendezvous(c) => c
            .command
            .as_ref()
            .is_some_and(rendezvous::client_proposable),
    }
}

/// Whether `command` is bookkeeping a node proposes for the clients it
/// holds (a follower forwards it to its leader): the PyTorch store's
/// closing and keeping alive of its connections.
pub fn node_proposable(command: &Command) -> bool {
    match command {
        Command::Torch(c) => c.command.as_ref().is_some_and(torch::node_proposable),
        _ => false,
    }
}

/// Which area an effect came from (an area does not hear its own effects).
#[derive(Clone, Copy, PartialEq, Eq)]
enum AreaId {
    Coordination,
    Dispatcher,
    Closures,
    Torch,
    Rendezvous,
}

/// Every area's state of one namespace, borrowed apart from the shared part.
struct Areas<'s> {
    coordination: &'s mut coordination::Data,
    dispatcher: &'s mut dispatcher::Data,
    closures: &'s mut closures::Data,
    /// Absent until the store's first command.
    torch: &'s mut Option<torch::Data>,
    /// Absent until the first rendezvous command.
    rendezvous: &'s mut Option<rendezvous::Data>,
}

/// One namespace's own parts, borrowed: the default namespace's are
/// `StateData`'s own fields, another's its `NamespaceData`.
struct Parts<'s> {
    initialized: &'s mut bool,
    config: &'s mut Option<ClusterConfig>,
    service_incarnation: &'s mut u64,
    epoch: &'s mut u64,
    spec: Option<&'s NamespaceSpec>,
    last_active_ms: Option<&'s mut u64>,
    coordination: &'s mut Option<coordination::Data>,
    dispatcher: &'s mut Option<dispatcher::Data>,
    closures: &'s mut Option<closures::Data>,
    torch: &'s mut Option<torch::Data>,
    rendezvous: &'s mut Option<rendezvous::Data>,
}

impl State {
    /// An empty, unconfigured state.
    pub fn new() -> Self {
        Self::default()
    }

    /// Applies one update and returns its outcome. A retried update (same
    /// origin) returns the recorded outcome and changes nothing else; a late
    /// copy of an update its client has declared done is refused.
    ///
    /// Debug builds check every invariant ([`State::check_invariants`])
    /// after the apply while the state is small, and after every
    /// [`INVARIANT_CHECK_EVERY`]th apply beyond that, so a check costs
    /// O(1) objects per apply amortised whatever the state's size.
    pub fn apply(&mut self, u: &Update) -> Outcome {
        self.apply_with(u, None)
    }

    /// [`State::apply`], recording in `touched` every object the update
    /// changed (see [`crate::wait`]): what the waiters of parked calls need
    /// to know to wake only those whose answer may have changed.
    pub fn apply_traced(&mut self, u: &Update, touched: &mut Touched) -> Outcome {
        self.apply_with(u, Some(touched))
    }

    fn apply_with(&mut self, u: &Update, touched: Option<&mut Touched>) -> Outcome {
        let out = self.apply_unchecked(u, touched);
        if cfg!(debug_assertions) && self.invariant_check_due() {
            if let Err(e) = self.check_invariants() {
                panic!("a broken invariant after applying {u:?}: {e}");
            }
        }
        out
    }

    /// Whether a debug build checks the invariants after this apply.
    fn invariant_check_due(&self) -> bool {
        let size = self.data.sessions.len()
            + self
                .namespaces()
                .map(|n| {
                    let c = n.coordination;
                    c.tasks.len()
                        + c.kv.len()
                        + c.kv_events.len()
                        + c.barriers.len()
                        + n.closures.closures.len()
                        + n.dispatcher.tasks.len()
                })
                .sum::<usize>();
        size <= INVARIANT_CHECK_SIZE || self.data.applied.is_multiple_of(INVARIANT_CHECK_EVERY)
    }

    fn apply_unchecked(&mut self, u: &Update, touched: Option<&mut Touched>) -> Outcome {
        self.data.applied += 1;
        self.data.clock_ms = self.data.clock_ms.max(u.at_ms);
        if self.data.applied.is_multiple_of(SESSION_SWEEP_EVERY) {
            self.expire_sessions();
        }
        let ns = namespace_key(&u.namespace);
        match &u.origin {
            None => {
                let mut out = self.apply_command(u, touched);
                out.epoch = self.epoch_of(ns);
                out
            }
            Some(origin) => {
                if let Some(prev) = self.recorded_outcome(origin) {
                    return prev;
                }
                let mut out = self.apply_command(u, touched);
                out.epoch = self.epoch_of(ns);
                self.record_outcome(origin, &out);
                out
            }
        }
    }

    /// The job epoch of namespace `key` (0 if it does not exist).
    fn epoch_of(&self, key: &str) -> u64 {
        if key.is_empty() {
            return self.data.epoch;
        }
        self.data.namespaces.get(key).map_or(0, |n| n.epoch)
    }

    fn apply_command(&mut self, u: &Update, mut touched: Option<&mut Touched>) -> Outcome {
        let ns = namespace_key(&u.namespace);
        if let Some(named_in) = u.epoch {
            let epoch = self.epoch_of(ns);
            if named_in != epoch {
                return Outcome::err(errors::stale_epoch(named_in, epoch));
            }
        }
        let Some(cmd) = &u.command else {
            return Outcome::ok();
        };
        // The state keeps its own copy of every byte string it stores: an
        // update's `Bytes` can be slices of a larger buffer (a gRPC read
        // buffer on the leader, a whole log entry on a follower), which a
        // 1 KiB value kept in the state would keep alive whole.
        let owned = owned_command(cmd);
        let cmd = &owned;
        let at = u.at_ms;
        match cmd {
            Command::InitService(c) if ns.is_empty() => {
                let out = self.init_service(c, at);
                if !out.is_err() {
                    touch_namespace(&mut touched, ns);
                }
                return out;
            }
            Command::InitService(_) => {
                return Outcome::err(errors::bad_config(
                    "InitService configures the default namespace only".into(),
                ))
            }
            Command::SetFeatureLevel(c) => {
                // A node of this build never gets here with a level above
                // its own (it stops first: storage checks every entry's
                // level), so a state never needs more than its build applies.
                if c.level > crate::FEATURE_LEVEL {
                    return Outcome::err(errors::bad_config(format!(
                        "journal feature level {} is above this build's {}",
                        c.level,
                        crate::FEATURE_LEVEL
                    )));
                }
                // Cluster-wide, and it only rises.
                self.data.feature_level = self.data.feature_level.max(c.level);
                return Outcome::ok();
            }
            Command::CreateNamespace(c) => return self.create_namespace(c, at, touched),
            Command::DeleteNamespace(c) => return self.delete_namespace(c, touched),
            Command::Noop(_) => return Outcome::ok(),
            _ => {}
        }
        let Some(parts) = self.parts(ns) else {
            return Outcome::err(namespace::unknown(ns));
        };
        if let Some(t) = parts.last_active_ms {
            *t = (*t).max(at);
        }
        if let Command::ResetJobEpoch(c) = cmd {
            let out = self.reset_job_epoch(ns, c, at);
            if !out.is_err() {
                touch_namespace(&mut touched, ns);
            }
            return out;
        }
        self.apply_area(ns, cmd, at, touched)
    }

    /// Hands an area's command to its area in namespace `ns` (which
    /// exists), then tells the other areas of the tasks it lost.
    fn apply_area(
        &mut self,
        ns: &str,
        cmd: &Command,
        at: u64,
        mut touched: Option<&mut Touched>,
    ) -> Outcome {
        let mut lost = Vec::new();
        let (mut cx, areas) = self
            .split(ns, at, &mut lost, touched.as_deref_mut())
            .expect("the namespace exists");
        let (out, from) = match cmd {
            Command::Coordination(c) => {
                (areas.coordination.apply(&mut cx, c), AreaId::Coordination)
            }
            Command::Dispatcher(c) => (areas.dispatcher.apply(&mut cx, c), AreaId::Dispatcher),
            Command::Closures(c) => (areas.closures.apply(&mut cx, c), AreaId::Closures),
            Command::Torch(c) => (
                areas
                    .torch
                    .get_or_insert_with(Default::default)
                    .apply(&mut cx, c),
                AreaId::Torch,
            ),
            Command::Rendezvous(c) => (
                areas
                    .rendezvous
                    .get_or_insert_with(Default::default)
                    .apply(&mut cx, c),
                AreaId::Rendezvous,
            ),
            _ => unreachable!("shared commands were handled above"),
        };
        self.tell_task_lost(ns, from, &lost, at, touched);
        out
    }

    /// Namespace `key`'s own parts, borrowed apart; `None` if it does not
    /// exist.
    fn parts(&mut self, key: &str) -> Option<Parts<'_>> {
        split_parts(&mut self.data, key).map(|(p, _)| p)
    }

    /// The shared context and every area of namespace `key`, borrowed
    /// apart; `None` if it does not exist.
    fn split<'s>(
        &'s mut self,
        key: &'s str,
        at_ms: u64,
        lost: &'s mut Vec<u32>,
        touched: Option<&'s mut Touched>,
    ) -> Option<(Context<'s>, Areas<'s>)> {
        let (parts, next_call_id) = split_parts(&mut self.data, key)?;
        let kv_bytes = if key.is_empty() {
            &mut self.default_kv_bytes
        } else {
            // Every namespace has its count from its create on.
            if !self.kv_bytes.contains_key(key) {
                self.kv_bytes.insert(key.to_string(), 0);
            }
            self.kv_bytes.get_mut(key)?
        };
        let coordination_held = torch::Held {
            keys: parts.coordination.as_ref().map_or(0, |c| c.kv.len() as u64),
            bytes: *kv_bytes,
        };
        let torch_held = parts
            .torch
            .as_ref()
            .map_or_else(Default::default, |t| torch::Reader { data: t }.held());
        let cx = Context {
            cluster: Cluster {
                config: parts.config.as_ref(),
                service_incarnation: *parts.service_incarnation,
                epoch: *parts.epoch,
                namespace: key,
                max_bytes: parts.spec.map_or(0, |s| s.max_bytes),
            },
            at_ms,
            next_call_id,
            lost,
            touched,
            kv_bytes,
            coordination_held,
            torch_held,
        };
        let areas = Areas {
            coordination: parts.coordination.get_or_insert_with(Default::default),
            dispatcher: parts.dispatcher.get_or_insert_with(Default::default),
            closures: parts.closures.get_or_insert_with(Default::default),
            torch: parts.torch,
            rendezvous: parts.rendezvous,
        };
        Some((cx, areas))
    }

    /// Every area other than `from` hears that these tasks were lost.
    fn tell_task_lost(
        &mut self,
        key: &str,
        from: AreaId,
        lost: &[u32],
        at_ms: u64,
        mut touched: Option<&mut Touched>,
    ) {
        let mut told = std::collections::BTreeSet::new();
        for &task in lost.iter().filter(|&&t| told.insert(t)) {
            let mut more = Vec::new();
            let Some((mut cx, areas)) = self.split(key, at_ms, &mut more, touched.as_deref_mut())
            else {
                return;
            };
            if from != AreaId::Coordination {
                areas.coordination.on_task_lost(&mut cx, task);
            }
            if from != AreaId::Dispatcher {
                areas.dispatcher.on_task_lost(&mut cx, task);
            }
            if from != AreaId::Closures {
                areas.closures.on_task_lost(&mut cx, task);
            }
        }
    }

    // ------------------------------------------------------------ cluster ----

    fn init_service(&mut self, c: &crate::pb::InitService, at_ms: u64) -> Outcome {
        let config = c.config.clone().unwrap_or_default();
        if let Err(e) = check_config(&config) {
            return Outcome::err(e);
        }
        if self.data.initialized {
            if self.data.config.as_ref() == Some(&config) {
                return Outcome::with_service_incarnation(self.data.service_incarnation);
            }
            return Outcome::err(errors::config_mismatch());
        }
        self.data.initialized = true;
        self.data.service_incarnation = c.service_incarnation;
        self.data.config = Some(config);
        self.init_areas("", at_ms);
        Outcome::with_service_incarnation(self.data.service_incarnation)
    }

    /// Every area of namespace `key` starts its first job epoch.
    fn init_areas(&mut self, key: &str, at_ms: u64) {
        let mut lost = Vec::new();
        if let Some((mut cx, areas)) = self.split(key, at_ms, &mut lost, None) {
            areas.coordination.on_init(&mut cx);
            areas.dispatcher.on_init(&mut cx);
            areas.closures.on_init(&mut cx);
        }
    }

    fn reset_job_epoch(&mut self, key: &str, c: &crate::pb::ResetJobEpoch, at_ms: u64) -> Outcome {
        let Some(p) = self.parts(key) else {
            return Outcome::err(namespace::unknown(key));
        };
        let config = c
            .config
            .clone()
            .or_else(|| p.config.clone())
            .unwrap_or_default();
        if let Err(e) = check_config(&config) {
            return Outcome::err(e);
        }
        if !key.is_empty() && total_tasks(&config) == 0 {
            return Outcome::err(namespace::no_tasks(namespace_name(key)));
        }
        *p.initialized = true;
        *p.epoch += 1;
        *p.service_incarnation = c.service_incarnation;
        *p.config = Some(config);
        let mut lost = Vec::new();
        let (mut cx, areas) = self
            .split(key, at_ms, &mut lost, None)
            .expect("the namespace exists");
        areas.coordination.on_epoch_reset(&mut cx);
        areas.dispatcher.on_epoch_reset(&mut cx);
        areas.closures.on_epoch_reset(&mut cx);
        if let Some(t) = areas.torch {
            t.on_epoch_reset(&mut cx);
        }
        if let Some(r) = areas.rendezvous {
            r.on_epoch_reset(&mut cx);
        }
        Outcome::with_service_incarnation(self.epoch_incarnation(key))
    }

    fn epoch_incarnation(&self, key: &str) -> u64 {
        self.namespace(key).map_or(0, |n| n.service_incarnation)
    }
}

/// Namespace `key`'s own parts and the shared call-id counter, borrowed
/// apart from `data`; `None` if the namespace does not exist.
fn split_parts<'s>(data: &'s mut StateData, key: &str) -> Option<(Parts<'s>, &'s mut u64)> {
    let StateData {
        initialized,
        config,
        service_incarnation,
        epoch,
        coordination,
        dispatcher,
        closures,
        torch,
        rendezvous,
        namespaces,
        next_call_id,
        ..
    } = data;
    if key.is_empty() {
        let parts = Parts {
            initialized,
            config,
            service_incarnation,
            epoch,
            spec: None,
            last_active_ms: None,
            coordination,
            dispatcher,
            closures,
            torch,
            rendezvous,
        };
        return Some((parts, next_call_id));
    }
    let n = namespaces.get_mut(key)?;
    let parts = Parts {
        initialized: &mut n.initialized,
        config: &mut n.config,
        service_incarnation: &mut n.service_incarnation,
        epoch: &mut n.epoch,
        spec: n.spec.as_ref(),
        last_active_ms: Some(&mut n.last_active_ms),
        coordination: &mut n.coordination,
        dispatcher: &mut n.dispatcher,
        closures: &mut n.closures,
        torch: &mut n.torch,
        rendezvous: &mut n.rendezvous,
    };
    Some((parts, next_call_id))
}

/// Tasks of a configuration.
fn total_tasks(c: &ClusterConfig) -> u64 {
    c.jobs.iter().map(|j| u64::from(j.count)).sum()
}

/// A configuration must name each job once and hold at most [`MAX_TASKS`].
fn check_config(c: &ClusterConfig) -> Result<(), DomainError> {
    let total: u64 = c.jobs.iter().map(|j| u64::from(j.count)).sum();
    if total > MAX_TASKS {
        return Err(errors::bad_config(format!(
            "{total} tasks exceed the limit of {MAX_TASKS}"
        )));
    }
    for (i, j) in c.jobs.iter().enumerate() {
        if c.jobs[..i].iter().any(|k| k.name == j.name) {
            return Err(errors::bad_config(format!(
                "job {} is listed twice",
                j.name
            )));
        }
    }
    Ok(())
}

/// Records a change that concerns every waiter of namespace `key`.
fn touch_namespace(touched: &mut Option<&mut Touched>, key: &str) {
    if let Some(t) = touched.as_deref_mut() {
        t.namespaces.push(key.to_string());
    }
}

/// `cmd` with every byte string in an allocation of its own (decoded from a
/// slice, prost copies each `bytes` field out).
fn owned_command(cmd: &Command) -> Command {
    let wrapped = Update {
        command: Some(cmd.clone()),
        ..Default::default()
    };
    let buf = wrapped.encode_to_vec();
    match Update::decode(buf.as_slice()) {
        Ok(Update {
            command: Some(c), ..
        }) => c,
        // Cannot happen (it was just encoded); keep the original.
        _ => cmd.clone(),
    }
}
