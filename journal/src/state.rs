//! `State`: the replicated truth and its `apply`. This file holds what the
//! areas share — the cluster configuration and job epoch, exactly-once
//! sessions, snapshots and the state digest — and hands each area's command
//! to its area (`crate::coordination`, ...).

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
    }
}

/// Which area an effect came from (an area does not hear its own effects).
#[derive(Clone, Copy, PartialEq, Eq)]
enum AreaId {
    Coordination,
    Dispatcher,
    Closures,
}

/// Every area's state of one namespace, borrowed apart from the shared part.
struct Areas<'s> {
    coordination: &'s mut coordination::Data,
    dispatcher: &'s mut dispatcher::Data,
    closures: &'s mut closures::Data,
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

    /// Checks every invariant of the state: the shared part's and each
    /// area's ([`Area::check_invariants`]). `Err` names the broken rule. Run
    /// after every apply in debug builds, and by the property tests.
    pub fn check_invariants(&self) -> Result<(), String> {
        if self.feature_level() > crate::FEATURE_LEVEL {
            return Err(format!(
                "the state needs journal feature level {}, above this build's {}",
                self.feature_level(),
                crate::FEATURE_LEVEL
            ));
        }
        if let Some(c) = &self.data.config {
            check_config(c).map_err(|e| e.message)?;
        }
        if !self.data.initialized && (self.data.config.is_some() || self.data.epoch > 0) {
            return Err("a configuration or job epoch before the service is configured".into());
        }
        for (id, s) in &self.data.sessions {
            if s.outcomes
                .keys()
                .next()
                .is_some_and(|&seq| seq < s.done_below)
            {
                return Err(format!(
                    "client {id} keeps an outcome below what it declared done"
                ));
            }
        }
        if self.session_lru != session_lru(&self.data.sessions) {
            return Err("the sessions' recency index does not match the sessions".into());
        }
        let mut ports = std::collections::BTreeMap::new();
        for n in self.namespaces() {
            let cl = n.cluster();
            let name = n.name();
            let named = |e: String| format!("namespace {name}: {e}");
            if !n.is_default() {
                if !namespace::valid_name(name) || !n.initialized {
                    return Err(named("an invalid or unconfigured namespace".into()));
                }
                if let Some(c) = n.config {
                    check_config(c).map_err(|e| named(e.message))?;
                }
                let port = n.spec.map_or(0, |s| s.port);
                if port != 0 {
                    if let Some(other) = ports.insert(port, name) {
                        return Err(format!("namespaces {other} and {name} share port {port}"));
                    }
                }
            }
            n.coordination.check_invariants(cl).map_err(named)?;
            let counted = coordination::kv_bytes(n.coordination);
            if n.kv_bytes != counted {
                return Err(named(format!(
                    "the store counts {} bytes of keys and values and holds {counted}",
                    n.kv_bytes
                )));
            }
            n.dispatcher.check_invariants(cl).map_err(named)?;
            n.closures.check_invariants(cl).map_err(named)?;
        }
        Ok(())
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
        };
        let areas = Areas {
            coordination: parts.coordination.get_or_insert_with(Default::default),
            dispatcher: parts.dispatcher.get_or_insert_with(Default::default),
            closures: parts.closures.get_or_insert_with(Default::default),
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
        Outcome::with_service_incarnation(self.epoch_incarnation(key))
    }

    fn epoch_incarnation(&self, key: &str) -> u64 {
        self.namespace(key).map_or(0, |n| n.service_incarnation)
    }

    // --------------------------------------------------------- namespaces ----

    /// Checks `CreateNamespace` `c` against this state without applying it:
    /// the namespace's data as the create would insert it (its spec's
    /// creation time `at_ms`), or why it is refused. The leader runs it
    /// before proposing, so a refused create proposes nothing; the apply
    /// runs it again.
    pub fn check_create(
        &self,
        c: &CreateNamespace,
        at_ms: u64,
    ) -> Result<NamespaceData, DomainError> {
        let name = c.name.as_str();
        if !namespace::valid_name(name) {
            return Err(namespace::bad_name(name));
        }
        if name == namespace::DEFAULT_NAMESPACE || self.data.namespaces.contains_key(name) {
            return Err(namespace::exists(name));
        }
        let count = 1 + self.data.namespaces.len() as u64;
        if c.max_namespaces > 0 && count >= c.max_namespaces {
            return Err(namespace::too_many(c.max_namespaces));
        }
        let mut data = c.data.clone().unwrap_or_default();
        let config = match &c.data {
            Some(d) => d.config.clone().unwrap_or_default(),
            None => c.config.clone().unwrap_or_default(),
        };
        check_config(&config)?;
        if total_tasks(&config) == 0 {
            return Err(namespace::no_tasks(name));
        }
        let mut spec = c.spec.clone().unwrap_or_default();
        if let Some(imported) = &data.spec {
            // An import keeps what it had but the port (the cluster's).
            let port = spec.port;
            spec = NamespaceSpec {
                port,
                ..imported.clone()
            };
        }
        if c.port_low > 0 && !(c.port_low..=c.port_high).contains(&spec.port) {
            return Err(namespace::port_outside(spec.port, c.port_low, c.port_high));
        }
        // Port 0: no port of its own (reached by name on the main port).
        if let Some(other) = self
            .data
            .namespaces
            .iter()
            .filter(|_| spec.port != 0)
            .find(|(_, n)| n.spec.as_ref().is_some_and(|s| s.port == spec.port))
        {
            return Err(namespace::port_taken(spec.port, other.0));
        }
        spec.created_ms = at_ms;
        data.initialized = true;
        data.config = Some(config);
        data.spec = Some(spec);
        data.last_active_ms = at_ms;
        if c.data.is_none() {
            data.service_incarnation = c.service_incarnation;
            data.epoch = 0;
        }
        data.coordination.get_or_insert_with(Default::default);
        data.dispatcher.get_or_insert_with(Default::default);
        data.closures.get_or_insert_with(Default::default);
        check_namespace(name, &data).map_err(errors::bad_config)?;
        Ok(data)
    }

    fn create_namespace(
        &mut self,
        c: &CreateNamespace,
        at_ms: u64,
        mut touched: Option<&mut Touched>,
    ) -> Outcome {
        let data = match self.check_create(c, at_ms) {
            Ok(d) => d,
            Err(e) => return Outcome::err(e),
        };
        let name = c.name.as_str();
        let bytes = data.coordination.as_ref().map_or(0, coordination::kv_bytes);
        self.kv_bytes.insert(name.to_string(), bytes);
        self.data.namespaces.insert(name.to_string(), data);
        if c.data.is_none() {
            self.init_areas(name, at_ms);
        }
        touch_namespace(&mut touched, name);
        if let Some(t) = touched {
            t.namespace_set = true;
        }
        Outcome::with_service_incarnation(self.epoch_incarnation(name))
    }

    fn delete_namespace(
        &mut self,
        c: &DeleteNamespace,
        mut touched: Option<&mut Touched>,
    ) -> Outcome {
        let key = namespace_key(&c.name);
        if key.is_empty() {
            return Outcome::err(namespace::default_kept());
        }
        self.kv_bytes.remove(key);
        if self.data.namespaces.remove(key).is_none() {
            return Outcome::err(namespace::unknown(key));
        }
        touch_namespace(&mut touched, key);
        if let Some(t) = touched {
            t.namespace_set = true;
        }
        Outcome::ok()
    }

    // ----------------------------------------------------------- sessions ----

    fn limits(&self) -> (usize, usize) {
        let c = self.data.config.as_ref();
        let sessions = c.map_or(0, |c| c.max_client_sessions);
        let outcomes = c.map_or(0, |c| c.max_outcomes_per_client);
        let or_default = |v: u32, d: u32| if v == 0 { d } else { v } as usize;
        (
            or_default(sessions, DEFAULT_MAX_CLIENT_SESSIONS),
            or_default(outcomes, DEFAULT_MAX_OUTCOMES_PER_CLIENT),
        )
    }

    fn session_horizon_ms(&self) -> u64 {
        match self
            .data
            .config
            .as_ref()
            .map_or(0, |c| c.session_horizon_ms)
        {
            0 => DEFAULT_SESSION_HORIZON_MS,
            h => h,
        }
    }

    /// The recorded outcome of a retried update, or the refusal of a late
    /// copy of one its client has declared done; `None` for a new update.
    ///
    /// How long an outcome is kept does not depend on anyone else's traffic:
    /// until its client declares it done (`done_below`; coordstore's nodes,
    /// relay and agent do, and keep one call per client id in flight, so they
    /// hold one outcome each), or until the client has not been heard of for
    /// the session horizon (leader clock). Two bounds remain for clients that
    /// never declare anything done: a client keeps its newest
    /// `max_outcomes_per_client` outcomes (a retry older than that is applied
    /// again: refusing it would fail a call that may never have been
    /// applied), and the table keeps the `max_client_sessions` most recently
    /// heard of clients.
    fn recorded_outcome(&mut self, o: &Origin) -> Option<Outcome> {
        let (applied, now) = (self.data.applied, self.data.clock_ms);
        let s = self.data.sessions.entry(o.client_id).or_default();
        self.session_lru.remove(&(s.touched, o.client_id));
        self.session_lru.insert((applied, o.client_id));
        s.touched = applied;
        s.touched_ms = now;
        // A request cannot declare itself done.
        let done_below = o.done_below.min(o.seq);
        if done_below > s.done_below {
            s.done_below = done_below;
            s.outcomes = s.outcomes.split_off(&done_below);
        }
        if let Some(out) = s.outcomes.get(&o.seq) {
            return Some(out.clone());
        }
        if o.seq < s.done_below {
            return Some(Outcome::err(errors::late_copy(o.client_id, o.seq)));
        }
        None
    }

    fn record_outcome(&mut self, o: &Origin, out: &Outcome) {
        let (max_sessions, max_outcomes) = self.limits();
        let s = self.data.sessions.entry(o.client_id).or_default();
        s.outcomes.insert(o.seq, out.clone());
        while s.outcomes.len() > max_outcomes {
            s.outcomes.pop_first();
        }
        while self.data.sessions.len() > max_sessions {
            // Evict the least recently used client (deterministic: ties by id).
            match self.session_lru.pop_first() {
                Some((_, id)) => {
                    self.data.sessions.remove(&id);
                }
                None => break,
            }
        }
    }

    /// Forgets every client not heard of for the session horizon.
    fn expire_sessions(&mut self) {
        let horizon = self.session_horizon_ms();
        let Some(cutoff) = self.data.clock_ms.checked_sub(horizon) else {
            return;
        };
        let lru = &mut self.session_lru;
        self.data.sessions.retain(|id, s| {
            let keep = s.touched_ms >= cutoff;
            if !keep {
                lru.remove(&(s.touched, *id));
            }
            keep
        });
    }

    /// Number of clients the exactly-once table remembers.
    pub fn session_count(&self) -> usize {
        self.data.sessions.len()
    }

    /// Number of outcomes the exactly-once table holds, over all clients.
    pub fn outcomes_held(&self) -> usize {
        self.data.sessions.values().map(|s| s.outcomes.len()).sum()
    }

    // ------------------------------------------------ snapshots and digest ----

    /// Encodes the whole state (the snapshot format).
    pub fn encode_snapshot(&self) -> Vec<u8> {
        self.data.encode_to_vec()
    }

    /// The length of [`State::encode_snapshot`]'s encoding.
    pub fn snapshot_len(&self) -> usize {
        self.data.encoded_len()
    }

    /// Writes [`State::encode_snapshot`]'s encoding into `buf` piece by
    /// piece (a buffer that passes it on, so the whole encoding never needs
    /// to be in memory at once).
    /// Fails only if `buf` has less room than [`State::snapshot_len`].
    pub fn encode_snapshot_into(
        &self,
        buf: &mut impl bytes::BufMut,
    ) -> Result<(), prost::EncodeError> {
        self.data.encode(buf)
    }

    /// Decodes a snapshot produced by [`State::encode_snapshot`], and checks
    /// it: the configuration, and each area's part against it.
    ///
    /// A snapshot holding a field this build does not know, or a state that
    /// needs a higher journal feature level than this build applies, is
    /// refused (see [`crate::known`], [`crate::level`]): it is never read in
    /// part.
    pub fn decode_snapshot(bytes: &[u8]) -> Result<State, SnapshotError> {
        let mut data =
            crate::decode_known::<StateData>(bytes).map_err(|e| SnapshotError(e.to_string()))?;
        let needs = state_level(&data);
        if needs > crate::FEATURE_LEVEL {
            return Err(SnapshotError(format!(
                "the state needs journal feature level {needs}, and this build applies up to {}",
                crate::FEATURE_LEVEL
            )));
        }
        let c = data.coordination.get_or_insert_with(Default::default);
        let default_kv_bytes = coordination::kv_bytes(c);
        let mut kv_bytes = BTreeMap::new();
        data.dispatcher.get_or_insert_with(Default::default);
        data.closures.get_or_insert_with(Default::default);
        if let Some(c) = &data.config {
            check_config(c).map_err(|e| SnapshotError(e.message))?;
        }
        for (name, n) in &mut data.namespaces {
            let c = n.coordination.get_or_insert_with(Default::default);
            kv_bytes.insert(name.clone(), coordination::kv_bytes(c));
            n.dispatcher.get_or_insert_with(Default::default);
            n.closures.get_or_insert_with(Default::default);
            check_namespace(name, n).map_err(SnapshotError)?;
        }
        let session_lru = session_lru(&data.sessions);
        let s = State {
            data,
            default_kv_bytes,
            kv_bytes,
            session_lru,
        };
        for n in s.namespaces() {
            let cl = n.cluster();
            let named = |e: String| SnapshotError(format!("namespace {}: {e}", n.name()));
            n.coordination.check_snapshot(cl).map_err(named)?;
            n.dispatcher.check_snapshot(cl).map_err(named)?;
            n.closures.check_snapshot(cl).map_err(named)?;
        }
        Ok(s)
    }

    /// The journal feature level the cluster runs at (see
    /// [`crate::level`]): the level the leader last raised it to (the
    /// lowest its members apply), or the level of what the state already
    /// holds if that is higher — a state with namespaces was written by
    /// members that apply them, before the cluster had a level of its own.
    /// It is also the level a node needs to hold this state.
    pub fn feature_level(&self) -> u32 {
        state_level(&self.data)
    }

    /// The level the leader last raised the cluster to
    /// ([`crate::pb::SetFeatureLevel`]), or the base level.
    pub fn raised_level(&self) -> u32 {
        self.data.feature_level.max(crate::LEVEL_BASE)
    }

    /// The leader clock: the newest update time applied.
    pub fn clock_ms(&self) -> u64 {
        self.data.clock_ms
    }

    /// SHA-256 of the canonical encoding: equal states have equal digests.
    pub fn digest(&self) -> [u8; 32] {
        Sha256::digest(self.encode_snapshot()).into()
    }

    /// The digest as lowercase hex.
    pub fn digest_hex(&self) -> String {
        self.digest().iter().map(|b| format!("{b:02x}")).collect()
    }

    // -------------------------------------------------------------- reads ----

    /// Bytes of KV keys and values in namespace `key`.
    fn bytes(&self, key: &str) -> u64 {
        if key.is_empty() {
            return self.default_kv_bytes;
        }
        self.kv_bytes.get(key).copied().unwrap_or(0)
    }

    /// The default namespace.
    pub fn default_namespace(&self) -> Namespace<'_> {
        let d = &self.data;
        Namespace {
            key: "",
            initialized: d.initialized,
            config: d.config.as_ref(),
            service_incarnation: d.service_incarnation,
            epoch: d.epoch,
            spec: None,
            last_active_ms: 0,
            kv_bytes: self.bytes(""),
            // Present from `State::default` and `decode_snapshot` on, the
            // only ways a state is made.
            coordination: d
                .coordination
                .as_ref()
                .expect("every area's part is present"),
            dispatcher: d.dispatcher.as_ref().expect("every area's part is present"),
            closures: d.closures.as_ref().expect("every area's part is present"),
        }
    }

    /// Namespace `name` ("" or `default`: the default one), if it exists.
    pub fn namespace(&self, name: &str) -> Option<Namespace<'_>> {
        let key = namespace_key(name);
        if key.is_empty() {
            return Some(self.default_namespace());
        }
        let (key, n) = self.data.namespaces.get_key_value(key)?;
        Some(namespace_of(key, n, self.bytes(key)))
    }

    /// Every namespace, the default one first, then by name.
    pub fn namespaces(&self) -> impl Iterator<Item = Namespace<'_>> + '_ {
        std::iter::once(self.default_namespace()).chain(
            self.data
                .namespaces
                .iter()
                .map(|(key, n)| namespace_of(key, n, self.bytes(key))),
        )
    }

    /// How many namespaces there are, the default one included.
    pub fn namespace_count(&self) -> usize {
        1 + self.data.namespaces.len()
    }

    /// A namespace's whole state as `NamespaceData` (what an export holds);
    /// `None` if it does not exist.
    pub fn namespace_data(&self, name: &str) -> Option<NamespaceData> {
        let key = namespace_key(name);
        if key.is_empty() {
            let d = &self.data;
            return Some(NamespaceData {
                initialized: d.initialized,
                config: d.config.clone(),
                service_incarnation: d.service_incarnation,
                epoch: d.epoch,
                spec: None,
                last_active_ms: 0,
                coordination: d.coordination.clone(),
                dispatcher: d.dispatcher.clone(),
                closures: d.closures.clone(),
            });
        }
        self.data.namespaces.get(key).cloned()
    }

    /// Namespace `name`'s own parts as a snapshot of a state that holds
    /// only it (no other namespace, no client sessions): what a client
    /// admitted to one namespace may read of the state, decoded with
    /// [`State::decode_snapshot`]. `None` if it does not exist.
    pub fn namespace_snapshot(&self, name: &str) -> Option<Vec<u8>> {
        let key = namespace_key(name);
        let n = self.namespace_data(name)?;
        let mut data = StateData {
            clock_ms: self.data.clock_ms,
            next_call_id: self.data.next_call_id,
            ..State::default().data
        };
        if key.is_empty() {
            data.initialized = n.initialized;
            data.config = n.config;
            data.service_incarnation = n.service_incarnation;
            data.epoch = n.epoch;
            data.coordination = n.coordination;
            data.dispatcher = n.dispatcher;
            data.closures = n.closures;
        } else {
            data.namespaces.insert(key.to_string(), n);
        }
        Some(data.encode_to_vec())
    }

    /// The default namespace's shared part: configuration, service
    /// incarnation, job epoch.
    pub fn cluster(&self) -> Cluster<'_> {
        self.default_namespace().cluster()
    }

    /// The default namespace's coordination area, read-only.
    pub fn coordination(&self) -> coordination::Reader<'_> {
        self.default_namespace().coordination()
    }

    /// The default namespace's tf.data dispatcher area, read-only.
    pub fn dispatcher(&self) -> dispatcher::Reader<'_> {
        self.default_namespace().dispatcher()
    }

    /// The default namespace's closure-queue area, read-only.
    pub fn closures(&self) -> closures::Reader<'_> {
        self.default_namespace().closures()
    }

    /// Whether an `InitService` has been applied.
    pub fn is_initialized(&self) -> bool {
        self.data.initialized
    }

    /// The default namespace's service incarnation (0 before initialisation).
    pub fn service_incarnation(&self) -> u64 {
        self.data.service_incarnation
    }

    /// The default namespace's job epoch, bumped by every `ResetJobEpoch`.
    pub fn epoch(&self) -> u64 {
        self.data.epoch
    }

    /// Number of updates applied (including retried ones).
    pub fn applied_count(&self) -> u64 {
        self.data.applied
    }

    /// The default namespace's configuration, if initialised (it also holds
    /// the cluster-wide bounds of the exactly-once table).
    pub fn config(&self) -> Option<&ClusterConfig> {
        self.data.config.as_ref()
    }

    /// Number of tasks in the default namespace's configuration.
    pub fn task_count(&self) -> u32 {
        self.cluster().task_count()
    }

    /// Dense index of task `id` of job `job` (default namespace).
    pub fn task_index(&self, job: &str, id: i32) -> Option<u32> {
        self.cluster().task_index(job, id)
    }

    /// (job, task id) of a dense index (default namespace).
    pub fn task_id(&self, index: u32) -> Option<(&str, i32)> {
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
    };
    Some((parts, next_call_id))
}

/// The view of namespace `key` stored as `n`.
fn namespace_of<'a>(key: &'a str, n: &'a NamespaceData, kv_bytes: u64) -> Namespace<'a> {
    Namespace {
        key,
        kv_bytes,
        initialized: n.initialized,
        config: n.config.as_ref(),
        service_incarnation: n.service_incarnation,
        epoch: n.epoch,
        spec: n.spec.as_ref(),
        last_active_ms: n.last_active_ms,
        coordination: n
            .coordination
            .as_ref()
            .expect("every area's part is present"),
        dispatcher: n.dispatcher.as_ref().expect("every area's part is present"),
        closures: n.closures.as_ref().expect("every area's part is present"),
    }
}

/// A namespace other than the default one: a valid name, configured, with
/// a valid configuration and every area's part.
fn check_namespace(name: &str, n: &NamespaceData) -> Result<(), String> {
    if !namespace::valid_name(name) || name == namespace::DEFAULT_NAMESPACE {
        return Err(format!("namespace {name:?}: not a valid namespace name"));
    }
    if !n.initialized || n.config.is_none() || n.spec.is_none() {
        return Err(format!("namespace {name}: not configured"));
    }
    if let Some(c) = &n.config {
        check_config(c).map_err(|e| format!("namespace {name}: {}", e.message))?;
    }
    if n.coordination.is_none() || n.dispatcher.is_none() || n.closures.is_none() {
        return Err(format!("namespace {name}: an area's part is missing"));
    }
    Ok(())
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

/// The journal feature level state `data` needs (see
/// [`State::required_level`]).
fn state_level(data: &StateData) -> u32 {
    let namespaces = if data.namespaces.is_empty() {
        crate::LEVEL_BASE
    } else {
        crate::LEVEL_NAMESPACES
    };
    data.feature_level.max(namespaces)
}

/// The recency index of `sessions`: (last touched, client id) of each.
fn session_lru(sessions: &BTreeMap<u64, ClientSession>) -> BTreeSet<(u64, u64)> {
    sessions.iter().map(|(id, s)| (s.touched, *id)).collect()
}
