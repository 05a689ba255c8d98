//! `State`: the replicated truth, its `apply`, exactly-once sessions,
//! snapshots and the state digest. The command semantics live in the sibling
//! modules (`tasks`, `barrier`, `kv`, `alive`), each an `impl State` block.

use prost::Message;
use sha2::{Digest, Sha256};

use crate::errors::{self, UnknownTaskIn};
use crate::pb::{
    update::Command, ClientSession, ClusterConfig, DomainError, Origin, Outcome, StateData,
    TaskEntry, TaskStatus, Update,
};

/// The job name jaxlib registers its tasks under.
pub const JAX_JOB: &str = "jax_worker";

/// Default bound on the number of clients the exactly-once table remembers.
pub const DEFAULT_MAX_CLIENT_SESSIONS: u32 = 4096;
/// Default bound on the outcomes remembered per client.
pub const DEFAULT_MAX_OUTCOMES_PER_CLIENT: u32 = 1024;
/// Default age (leader clock) after which an unheard-of client is forgotten.
pub const DEFAULT_SESSION_HORIZON_MS: u64 = 15 * 60 * 1000;
/// Clients older than the horizon are swept out once per this many updates.
pub const SESSION_SWEEP_EVERY: u64 = 1024;
/// Most tasks a cluster configuration may hold.
pub const MAX_TASKS: u64 = 1 << 20;

/// The coordination state machine. `apply` is a pure function of the state and
/// the update: no I/O, no clock, no randomness.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct State {
    pub(crate) data: StateData,
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

    /// A success carrying a number (incremented value, barrier counter).
    pub fn value(v: i64) -> Self {
        Outcome {
            value: v,
            ..Default::default()
        }
    }

    /// A success carrying the service incarnation.
    pub fn incarnation(inc: u64) -> Self {
        Outcome {
            incarnation: inc,
            ..Default::default()
        }
    }

    /// Whether the outcome is a failure.
    pub fn is_err(&self) -> bool {
        self.error.is_some()
    }
}

impl From<Result<Outcome, DomainError>> for Outcome {
    fn from(r: Result<Outcome, DomainError>) -> Self {
        r.unwrap_or_else(Outcome::err)
    }
}

impl State {
    /// An empty, unconfigured state.
    pub fn new() -> Self {
        Self::default()
    }

    /// Applies one update and returns its outcome. A retried update (same
    /// origin) returns the recorded outcome and changes nothing else; a late
    /// copy of an update its client has declared done is refused.
    pub fn apply(&mut self, u: &Update) -> Outcome {
        self.data.applied += 1;
        self.data.clock_ms = self.data.clock_ms.max(u.at_ms);
        if self.data.applied.is_multiple_of(SESSION_SWEEP_EVERY) {
            self.expire_sessions();
        }
        match &u.origin {
            None => {
                let mut out = self.apply_command(u);
                out.epoch = self.data.epoch;
                out
            }
            Some(origin) => {
                if let Some(prev) = self.recorded_outcome(origin) {
                    return prev;
                }
                let mut out = self.apply_command(u);
                out.epoch = self.data.epoch;
                self.record_outcome(origin, &out);
                out
            }
        }
    }

    fn apply_command(&mut self, u: &Update) -> Outcome {
        if let Some(named_in) = u.epoch {
            if named_in != self.data.epoch {
                return Outcome::err(errors::stale_epoch(named_in, self.data.epoch));
            }
        }
        let at = u.at_ms;
        let Some(cmd) = &u.command else {
            return Outcome::ok();
        };
        match cmd {
            Command::InitService(c) => self.init_service(c),
            Command::ResetJobEpoch(c) => self.reset_job_epoch(c),
            Command::RegisterTask(c) => {
                self.register_task(c.task, c.incarnation, c.recoverable, at)
            }
            Command::Heartbeat(c) => self.heartbeat(c.task, c.incarnation, at),
            Command::TasksUnhealthy(c) => self.tasks_unhealthy(&c.tasks, at),
            Command::ReportError(c) => self.report_error(c, at),
            Command::PollForError(c) => self.poll_for_error(c.task, at),
            Command::ShutdownTask(c) => self.shutdown_task(c.task, c.recoverable, at),
            Command::ResetTask(c) => self.reset_task(c.task, at),
            Command::KvInsert(c) => self.kv_insert(c),
            Command::KvDelete(c) => self.kv_delete(&c.key),
            Command::KvIncrement(c) => self.kv_increment(&c.key, c.increment),
            Command::BarrierArrive(c) => self.barrier_arrive(c, at),
            Command::BarrierCancel(c) => self.barrier_cancel(&c.id, c.counter, c.task, at),
            Command::BarrierExpire(c) => self.barrier_expire(&c.id, c.counter, at),
            Command::AliveTasks(c) => self.alive_tasks(c.task, &c.tasks),
            Command::WaitForAllTasks(c) => self.wait_for_all_tasks(c.task, &c.device_info, at),
            Command::Noop(_) => Outcome::ok(),
        }
    }

    // ------------------------------------------------------------ cluster ----

    fn init_service(&mut self, c: &crate::pb::InitService) -> Outcome {
        let config = c.config.clone().unwrap_or_default();
        if let Err(e) = check_config(&config) {
            return Outcome::err(e);
        }
        if self.data.initialized {
            if self.data.config.as_ref() == Some(&config) {
                return Outcome::incarnation(self.data.service_incarnation);
            }
            return Outcome::err(errors::config_mismatch());
        }
        self.data.initialized = true;
        self.data.service_incarnation = c.service_incarnation;
        self.install_config(config);
        Outcome::incarnation(self.data.service_incarnation)
    }

    fn reset_job_epoch(&mut self, c: &crate::pb::ResetJobEpoch) -> Outcome {
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
        self.data.kv.clear();
        self.clear_history();
        self.data.barriers.clear();
        self.data.propagated_error = None;
        self.data.any_polled = false;
        self.data.alive_rounds.clear();
        self.install_config(config);
        self.bump_tasks_version();
        Outcome::incarnation(self.data.service_incarnation)
    }

    fn install_config(&mut self, config: ClusterConfig) {
        let n: usize = config.jobs.iter().map(|j| j.count as usize).sum();
        self.data.tasks = vec![TaskEntry::default(); n];
        self.data.config = Some(config);
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

    /// Decodes a snapshot produced by [`State::encode_snapshot`].
    pub fn decode_snapshot(bytes: &[u8]) -> Result<State, SnapshotError> {
        let d = StateData::decode(bytes).map_err(|e| SnapshotError(e.to_string()))?;
        let n: usize = d
            .config
            .as_ref()
            .map_or(0, |c| c.jobs.iter().map(|j| j.count as usize).sum());
        if d.tasks.len() != n {
            return Err(SnapshotError(format!(
                "{} tasks stored but the configuration has {n}",
                d.tasks.len()
            )));
        }
        if let Some(c) = &d.config {
            check_config(c).map_err(|e| SnapshotError(e.message))?;
        }
        check_task_references(&d)?;
        Ok(State { data: d })
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
        self.data.tasks.len() as u32
    }

    /// Dense index of task `id` of job `job`.
    pub fn task_index(&self, job: &str, id: i32) -> Option<u32> {
        let mut offset = 0u32;
        for j in &self.data.config.as_ref()?.jobs {
            if j.name == job {
                return (id >= 0 && (id as u32) < j.count).then_some(offset + id as u32);
            }
            offset += j.count;
        }
        None
    }

    /// (job, task id) of a dense index.
    pub fn task_id(&self, index: u32) -> Option<(&str, i32)> {
        let mut offset = 0u32;
        for j in &self.data.config.as_ref()?.jobs {
            if index < offset + j.count {
                return Some((&j.name, (index - offset) as i32));
            }
            offset += j.count;
        }
        None
    }

    /// The TensorFlow-style name of a task: `/job:NAME/replica:0/task:ID`.
    pub fn task_name(&self, index: u32) -> String {
        match self.task_id(index) {
            Some((job, id)) => task_name(job, id),
            None => format!("/task_index:{index}"),
        }
    }

    /// The stored entry of a task.
    pub fn task(&self, index: u32) -> Option<&TaskEntry> {
        self.data.tasks.get(index as usize)
    }

    /// The status of a task.
    pub fn task_status(&self, index: u32) -> Option<TaskStatus> {
        self.task(index).map(|t| t.status())
    }

    /// The WatchTasks version, bumped on every task-state change.
    pub fn tasks_version(&self) -> i64 {
        self.data.tasks_version
    }

    /// The error propagated to pollers, if any.
    pub fn propagated_error(&self) -> Option<&DomainError> {
        self.data.propagated_error.as_ref()
    }

    /// How messages name a task: the bare id in a jaxlib-style cluster (one
    /// job named `jax_worker`, as jaxlib 0.12's service prints it), the
    /// TensorFlow name `/job:NAME/replica:0/task:ID` otherwise.
    pub fn label(&self, index: u32) -> String {
        let jax_style = self
            .data
            .config
            .as_ref()
            .is_some_and(|c| c.jobs.len() == 1 && c.jobs[0].name == JAX_JOB);
        match self.task_id(index) {
            Some((_, id)) if jax_style => id.to_string(),
            Some((job, id)) => task_name(job, id),
            None => index.to_string(),
        }
    }

    pub(crate) fn bump_tasks_version(&mut self) {
        self.data.tasks_version += 1;
    }

    pub(crate) fn next_call_id(&mut self) -> u64 {
        self.data.next_call_id += 1;
        self.data.next_call_id
    }

    pub(crate) fn recoverable(&self) -> bool {
        self.data.config.as_ref().is_some_and(|c| c.recoverable)
    }

    /// Whether `task` is recoverable: the whole service is, or the task
    /// declared itself so when it last registered.
    pub(crate) fn task_recoverable(&self, task: u32) -> bool {
        self.recoverable() || self.task(task).is_some_and(|t| t.recoverable)
    }

    /// Whether propagated errors are delivered to each task (TensorFlow's
    /// service) instead of through PollForError (XLA's).
    pub(crate) fn notify_tasks(&self) -> bool {
        self.data.config.as_ref().is_some_and(|c| c.notify_tasks)
    }

    pub(crate) fn cfg(&self) -> ClusterConfig {
        self.data.config.clone().unwrap_or_default()
    }

    pub(crate) fn check_task(&self, task: u32, call: UnknownTaskIn) -> Result<(), DomainError> {
        if (task as usize) < self.data.tasks.len() {
            Ok(())
        } else {
            Err(errors::unknown_task(call, &task.to_string()))
        }
    }

    pub(crate) fn entry(&self, task: u32) -> &TaskEntry {
        &self.data.tasks[task as usize]
    }

    pub(crate) fn entry_mut(&mut self, task: u32) -> &mut TaskEntry {
        &mut self.data.tasks[task as usize]
    }
}

/// Every task index a snapshot stores names a task of its configuration,
/// and every set the code searches is sorted without repeats: a snapshot
/// that breaks either is refused on install, not met by a panic on the
/// next apply.
fn check_task_references(d: &StateData) -> Result<(), SnapshotError> {
    let n = d.tasks.len() as u32;
    let bad = |what: String| Err(SnapshotError(what));
    let sorted_unique = |v: &[u32]| v.windows(2).all(|w| w[0] < w[1]);
    for (id, b) in &d.barriers {
        let mut inst = Some(b);
        while let Some(b) = inst {
            if b.participants.iter().any(|&t| t >= n) || !sorted_unique(&b.participants) {
                return bad(format!("barrier {id}::{}: bad participant set", b.counter));
            }
            if b.arrivals.keys().any(|&t| t >= n) || b.initiating_task >= n {
                return bad(format!("barrier {id}::{}: unknown task", b.counter));
            }
            inst = b.previous.as_deref();
        }
    }
    for (key, r) in &d.alive_rounds {
        let results_ok = r.results.iter().all(|x| x.tasks.iter().all(|&t| t < n));
        if r.tasks.iter().any(|&t| t >= n)
            || !sorted_unique(&r.tasks)
            || r.callers.keys().any(|&t| t >= n)
            || !results_ok
        {
            return bad(format!("GetAliveTasks round {key}: unknown task"));
        }
    }
    let errors = d
        .tasks
        .iter()
        .flat_map(|t| [&t.error, &t.poll_result, &t.notice])
        .chain([&d.propagated_error])
        .flatten();
    for e in errors {
        if e.source_task.is_some_and(|t| t >= n) {
            return bad("an error names an unknown source task".into());
        }
    }
    Ok(())
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

/// `/job:NAME/replica:0/task:ID`, the TensorFlow spelling of a task.
pub fn task_name(job: &str, id: i32) -> String {
    format!("/job:{job}/replica:0/task:{id}")
}
