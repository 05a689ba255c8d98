//! `State`: the replicated truth and its `apply`. This file holds what the
//! areas share — the cluster configuration and job epoch, exactly-once
//! sessions, snapshots and the state digest — and hands each area's command
//! to its area (`crate::coordination`, ...).

use prost::Message;
use sha2::{Digest, Sha256};

use crate::area::Touched;
use crate::area::{Area, Context};
use crate::closures;
use crate::cluster::Cluster;
use crate::coordination;
use crate::dispatcher;
use crate::errors;
use crate::pb::{
    outcome, update::Command, ClientSession, ClusterConfig, DomainError, Origin, Outcome,
    StateData, Update,
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
        Command::InitService(_) => false,
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

/// Every area's state, borrowed apart from the shared part.
struct Areas<'s> {
    coordination: &'s mut coordination::Data,
    dispatcher: &'s mut dispatcher::Data,
    closures: &'s mut closures::Data,
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
        let c = self.coordination_data();
        let size = c.tasks.len()
            + c.kv.len()
            + c.kv_events.len()
            + c.barriers.len()
            + self.data.sessions.len()
            + self.closures_data().closures.len()
            + self.dispatcher_data().tasks.len();
        size <= INVARIANT_CHECK_SIZE || self.data.applied.is_multiple_of(INVARIANT_CHECK_EVERY)
    }

    fn apply_unchecked(&mut self, u: &Update, touched: Option<&mut Touched>) -> Outcome {
        self.data.applied += 1;
        self.data.clock_ms = self.data.clock_ms.max(u.at_ms);
        if self.data.applied.is_multiple_of(SESSION_SWEEP_EVERY) {
            self.expire_sessions();
        }
        match &u.origin {
            None => {
                let mut out = self.apply_command(u, touched);
                out.epoch = self.data.epoch;
                out
            }
            Some(origin) => {
                if let Some(prev) = self.recorded_outcome(origin) {
                    return prev;
                }
                let mut out = self.apply_command(u, touched);
                out.epoch = self.data.epoch;
                self.record_outcome(origin, &out);
                out
            }
        }
    }

    /// Checks every invariant of the state: the shared part's and each
    /// area's ([`Area::check_invariants`]). `Err` names the broken rule. Run
    /// after every apply in debug builds, and by the property tests.
    pub fn check_invariants(&self) -> Result<(), String> {
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
        let cl = self.cluster();
        self.coordination_data().check_invariants(cl)?;
        self.dispatcher_data().check_invariants(cl)?;
        self.closures_data().check_invariants(cl)
    }

    fn apply_command(&mut self, u: &Update, mut touched: Option<&mut Touched>) -> Outcome {
        if let Some(named_in) = u.epoch {
            if named_in != self.data.epoch {
                return Outcome::err(errors::stale_epoch(named_in, self.data.epoch));
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
        let mut lost = Vec::new();
        let (out, from) = match cmd {
            Command::InitService(c) => {
                let out = self.init_service(c, at);
                if !out.is_err() {
                    touch_all(&mut touched);
                }
                return out;
            }
            Command::ResetJobEpoch(c) => {
                let out = self.reset_job_epoch(c, at);
                if !out.is_err() {
                    touch_all(&mut touched);
                }
                return out;
            }
            Command::Noop(_) => return Outcome::ok(),
            Command::Coordination(c) => {
                let (mut cx, areas) = self.split(at, &mut lost, touched.as_deref_mut());
                (areas.coordination.apply(&mut cx, c), AreaId::Coordination)
            }
            Command::Dispatcher(c) => {
                let (mut cx, areas) = self.split(at, &mut lost, touched.as_deref_mut());
                (areas.dispatcher.apply(&mut cx, c), AreaId::Dispatcher)
            }
            Command::Closures(c) => {
                let (mut cx, areas) = self.split(at, &mut lost, touched.as_deref_mut());
                (areas.closures.apply(&mut cx, c), AreaId::Closures)
            }
        };
        self.tell_task_lost(from, &lost, at, touched);
        out
    }

    /// The shared context and every area, borrowed apart.
    fn split<'s>(
        &'s mut self,
        at_ms: u64,
        lost: &'s mut Vec<u32>,
        touched: Option<&'s mut Touched>,
    ) -> (Context<'s>, Areas<'s>) {
        let StateData {
            config,
            service_incarnation,
            epoch,
            next_call_id,
            coordination,
            dispatcher,
            closures,
            ..
        } = &mut self.data;
        let cx = Context {
            cluster: Cluster {
                config: config.as_ref(),
                service_incarnation: *service_incarnation,
                epoch: *epoch,
            },
            at_ms,
            next_call_id,
            lost,
            touched,
        };
        let areas = Areas {
            coordination: coordination.get_or_insert_with(Default::default),
            dispatcher: dispatcher.get_or_insert_with(Default::default),
            closures: closures.get_or_insert_with(Default::default),
        };
        (cx, areas)
    }

    /// Every area other than `from` hears that these tasks were lost.
    fn tell_task_lost(
        &mut self,
        from: AreaId,
        lost: &[u32],
        at_ms: u64,
        mut touched: Option<&mut Touched>,
    ) {
        for &task in lost {
            let mut more = Vec::new();
            let (mut cx, areas) = self.split(at_ms, &mut more, touched.as_deref_mut());
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
        let mut lost = Vec::new();
        let (mut cx, areas) = self.split(at_ms, &mut lost, None);
        areas.coordination.on_init(&mut cx);
        areas.dispatcher.on_init(&mut cx);
        areas.closures.on_init(&mut cx);
        Outcome::with_service_incarnation(self.data.service_incarnation)
    }

    fn reset_job_epoch(&mut self, c: &crate::pb::ResetJobEpoch, at_ms: u64) -> Outcome {
        let config = c
            .config
            .clone()
            .or_else(|| self.data.config.clone())
            .unwrap_or_default();
        if let Err(e) = check_config(&config) {
            return Outcome::err(e);
        }
        self.data.initialized = true;
        self.data.epoch += 1;
        self.data.service_incarnation = c.service_incarnation;
        self.data.config = Some(config);
        let mut lost = Vec::new();
        let (mut cx, areas) = self.split(at_ms, &mut lost, None);
        areas.coordination.on_epoch_reset(&mut cx);
        areas.dispatcher.on_epoch_reset(&mut cx);
        areas.closures.on_epoch_reset(&mut cx);
        Outcome::with_service_incarnation(self.data.service_incarnation)
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
            let victim = self
                .data
                .sessions
                .iter()
                .min_by_key(|(id, s): &(&u64, &ClientSession)| (s.touched, **id))
                .map(|(id, _)| *id);
            match victim {
                Some(id) => {
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
        self.data.sessions.retain(|_, s| s.touched_ms >= cutoff);
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
    pub fn decode_snapshot(bytes: &[u8]) -> Result<State, SnapshotError> {
        let mut data = StateData::decode(bytes).map_err(|e| SnapshotError(e.to_string()))?;
        data.coordination.get_or_insert_with(Default::default);
        data.dispatcher.get_or_insert_with(Default::default);
        data.closures.get_or_insert_with(Default::default);
        if let Some(c) = &data.config {
            check_config(c).map_err(|e| SnapshotError(e.message))?;
        }
        let s = State { data };
        s.coordination_data()
            .check_snapshot(s.cluster())
            .map_err(SnapshotError)?;
        s.dispatcher_data()
            .check_snapshot(s.cluster())
            .map_err(SnapshotError)?;
        s.closures_data()
            .check_snapshot(s.cluster())
            .map_err(SnapshotError)?;
        Ok(s)
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

    /// The shared part: configuration, service incarnation, job epoch.
    pub fn cluster(&self) -> Cluster<'_> {
        Cluster {
            config: self.data.config.as_ref(),
            service_incarnation: self.data.service_incarnation,
            epoch: self.data.epoch,
        }
    }

    /// The coordination area, read-only.
    pub fn coordination(&self) -> coordination::Reader<'_> {
        coordination::Reader {
            cl: self.cluster(),
            data: self.coordination_data(),
        }
    }

    /// The tf.data dispatcher area, read-only.
    pub fn dispatcher(&self) -> dispatcher::Reader<'_> {
        dispatcher::Reader {
            data: self.dispatcher_data(),
        }
    }

    /// The closure-queue area, read-only.
    pub fn closures(&self) -> closures::Reader<'_> {
        closures::Reader {
            data: self.closures_data(),
        }
    }

    fn closures_data(&self) -> &closures::Data {
        self.data
            .closures
            .as_ref()
            .expect("every area's part is present")
    }

    fn dispatcher_data(&self) -> &dispatcher::Data {
        self.data
            .dispatcher
            .as_ref()
            .expect("every area's part is present")
    }

    fn coordination_data(&self) -> &coordination::Data {
        // Present from `State::default` and `decode_snapshot` on, the only
        // ways a state is made.
        self.data
            .coordination
            .as_ref()
            .expect("every area's part is present")
    }

    /// Whether an `InitService` has been applied.
    pub fn is_initialized(&self) -> bool {
        self.data.initialized
    }

    /// The service incarnation (0 before initialisation).
    pub fn service_incarnation(&self) -> u64 {
        self.data.service_incarnation
    }

    /// The job epoch, bumped by every `ResetJobEpoch`.
    pub fn epoch(&self) -> u64 {
        self.data.epoch
    }

    /// Number of updates applied (including retried ones).
    pub fn applied_count(&self) -> u64 {
        self.data.applied
    }

    /// The cluster configuration, if initialised.
    pub fn config(&self) -> Option<&ClusterConfig> {
        self.data.config.as_ref()
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

/// Records a change that concerns every waiter.
fn touch_all(touched: &mut Option<&mut Touched>) {
    if let Some(t) = touched.as_deref_mut() {
        t.all = true;
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
