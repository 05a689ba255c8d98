//! Small builders shared by the journal integration tests.
#![allow(dead_code)]

use journal::pb::{self, update::Command, ClusterConfig, JobSpec, Origin};
use journal::{coordination::TaskStatus, Code, DomainError, Outcome, State, Update};

/// The service incarnation every test cluster starts with.
pub const SVC_INC: u64 = 0x5EED_0001;

/// Options of a test cluster (reasonable jax-like defaults).
#[derive(Clone, Debug)]
pub struct Opts {
    pub recoverable: bool,
    pub heartbeat_timeout_ms: u64,
    pub register_timeout_ms: u64,
    pub shutdown_timeout_ms: u64,
    pub register_with_barrier: bool,
    pub max_client_sessions: u32,
    pub max_outcomes_per_client: u32,
    pub max_keys: u64,
    pub watch_history_bytes: u64,
    pub session_horizon_ms: u64,
    pub notify_tasks: bool,
}

impl Default for Opts {
    fn default() -> Self {
        Opts {
            recoverable: false,
            heartbeat_timeout_ms: 10_000,
            register_timeout_ms: 60_000,
            shutdown_timeout_ms: 5_000,
            register_with_barrier: true,
            max_client_sessions: 0,
            max_outcomes_per_client: 0,
            max_keys: 0,
            watch_history_bytes: 0,
            session_horizon_ms: 0,
            notify_tasks: false,
        }
    }
}

impl Opts {
    pub fn recoverable() -> Self {
        Opts {
            recoverable: true,
            ..Default::default()
        }
    }
    /// TensorFlow's error delivery: notices to connected tasks.
    pub fn notify_tasks() -> Self {
        Opts {
            notify_tasks: true,
            ..Default::default()
        }
    }
    /// No shutdown barrier: tasks disconnect one by one.
    pub fn no_shutdown_barrier() -> Self {
        Opts {
            shutdown_timeout_ms: 0,
            ..Default::default()
        }
    }
}

pub fn config_jobs(jobs: &[(&str, u32)], o: &Opts) -> ClusterConfig {
    ClusterConfig {
        jobs: jobs
            .iter()
            .map(|(name, count)| JobSpec {
                name: (*name).into(),
                count: *count,
            })
            .collect(),
        recoverable: o.recoverable,
        heartbeat_timeout_ms: o.heartbeat_timeout_ms,
        register_timeout_ms: o.register_timeout_ms,
        shutdown_timeout_ms: o.shutdown_timeout_ms,
        register_with_barrier: o.register_with_barrier,
        max_client_sessions: o.max_client_sessions,
        max_outcomes_per_client: o.max_outcomes_per_client,
        max_keys: o.max_keys,
        watch_history_bytes: o.watch_history_bytes,
        session_horizon_ms: o.session_horizon_ms,
        notify_tasks: o.notify_tasks,
    }
}

pub fn config(n: u32, o: &Opts) -> ClusterConfig {
    config_jobs(&[(journal::JAX_JOB, n)], o)
}

pub fn upd(cmd: Command, at_ms: u64) -> Update {
    Update {
        namespace: String::new(),
        origin: None,
        at_ms,
        epoch: None,
        command: Some(cmd),
    }
}

/// Applies `cmd` at time `at` without an origin.
pub fn apply(s: &mut State, cmd: Command, at: u64) -> Outcome {
    s.apply(&upd(cmd, at))
}

/// Applies `cmd` at time `at` with origin (client, seq).
pub fn apply_from(s: &mut State, client: u64, seq: u64, cmd: Command, at: u64) -> Outcome {
    apply_done(s, client, seq, 0, cmd, at)
}

/// Applies `cmd` at time `at` with origin (client, seq) declaring every seq
/// below `done_below` done.
pub fn apply_done(
    s: &mut State,
    client: u64,
    seq: u64,
    done_below: u64,
    cmd: Command,
    at: u64,
) -> Outcome {
    s.apply(&Update {
        namespace: String::new(),
        origin: Some(Origin {
            client_id: client,
            seq,
            done_below,
        }),
        at_ms: at,
        epoch: None,
        command: Some(cmd),
    })
}

/// A configured state whose tasks have not registered yet.
pub fn new_state_jobs(jobs: &[(&str, u32)], o: &Opts) -> State {
    let mut s = State::new();
    let out = apply(&mut s, init(config_jobs(jobs, o), SVC_INC), 0);
    assert!(!out.is_err(), "init failed: {out:?}");
    assert_eq!(out.service_incarnation(), Some(SVC_INC));
    s
}

pub fn new_state(n: u32, o: &Opts) -> State {
    new_state_jobs(&[(journal::JAX_JOB, n)], o)
}

/// The incarnation task `t` registers with in the helpers.
pub fn tinc(t: u32) -> u64 {
    1000 + t as u64
}

/// Registers every task (incarnation `tinc(t)`) at time `at`; all CONNECTED.
pub fn register_all(s: &mut State, at: u64) {
    let n = s.task_count();
    for t in 0..n {
        let out = apply(s, register(t, tinc(t)), at);
        assert!(!out.is_err(), "register {t} failed: {out:?}");
    }
    for t in 0..n {
        assert_eq!(
            registration_result(s, t, tinc(t)),
            Some(Ok(SVC_INC)),
            "task {t}"
        );
        assert_eq!(s.coordination().task_status(t), Some(TaskStatus::Connected));
    }
}

/// A jax-style cluster of `n` tasks, all registered and CONNECTED at t=1000.
pub fn cluster(n: u32, o: Opts) -> State {
    let mut s = new_state(n, &o);
    register_all(&mut s, 1000);
    s
}

/// A cluster with named jobs, all registered.
pub fn cluster_jobs(jobs: &[(&str, u32)], o: Opts) -> State {
    let mut s = new_state_jobs(jobs, &o);
    register_all(&mut s, 1000);
    s
}

// ------------------------------------------------------------ commands ----

pub fn init(config: ClusterConfig, inc: u64) -> Command {
    Command::InitService(pb::InitService {
        config: Some(config),
        service_incarnation: inc,
    })
}

pub fn reset_epoch(inc: u64, config: Option<ClusterConfig>) -> Command {
    Command::ResetJobEpoch(pb::ResetJobEpoch {
        service_incarnation: inc,
        config,
    })
}

pub fn register(task: u32, incarnation: u64) -> Command {
    Command::from(pb::coordination::RegisterTask {
        task,
        incarnation,
        recoverable: false,
    })
}

/// RegisterTask of a task that declares itself recoverable (TensorFlow).
pub fn register_recoverable(task: u32, incarnation: u64) -> Command {
    Command::from(pb::coordination::RegisterTask {
        task,
        incarnation,
        recoverable: true,
    })
}

pub fn heartbeat(task: u32, incarnation: u64) -> Command {
    Command::from(pb::coordination::Heartbeat { task, incarnation })
}

pub fn unhealthy(tasks: &[u32]) -> Command {
    Command::from(pb::coordination::TasksUnhealthy {
        tasks: tasks.to_vec(),
    })
}

pub fn report(task: u32, code: Code, message: &str) -> Command {
    Command::from(pb::coordination::ReportError {
        task,
        code: code as i32,
        message: message.into(),
    })
}

pub fn poll(task: u32) -> Command {
    Command::from(pb::coordination::PollForError { task })
}

pub fn shutdown(task: u32) -> Command {
    Command::from(pb::coordination::ShutdownTask {
        task,
        recoverable: false,
    })
}

pub fn reset_task(task: u32) -> Command {
    Command::from(pb::coordination::ResetTask { task })
}

pub fn insert(key: &str, value: &str, allow_overwrite: bool) -> Command {
    Command::from(pb::coordination::KvInsert {
        key: key.into(),
        value: value.to_string().into_bytes().into(),
        allow_overwrite,
    })
}

pub fn delete(key: &str) -> Command {
    Command::from(pb::coordination::KvDelete { key: key.into() })
}

pub fn incr(key: &str, increment: i64) -> Command {
    Command::from(pb::coordination::KvIncrement {
        key: key.into(),
        increment,
    })
}

pub fn arrive(id: &str, counter: i64, timeout_ms: u64, participants: &[u32], task: u32) -> Command {
    Command::from(pb::coordination::BarrierArrive {
        id: id.into(),
        counter,
        timeout_ms,
        participants: participants.to_vec(),
        task,
        unknown_participant: String::new(),
        recoverable: false,
    })
}

/// A barrier arrival of a caller that declares itself recoverable.
pub fn arrive_recoverable(id: &str, counter: i64, participants: &[u32], task: u32) -> Command {
    Command::from(pb::coordination::BarrierArrive {
        id: id.into(),
        counter,
        timeout_ms: 60_000,
        participants: participants.to_vec(),
        task,
        unknown_participant: String::new(),
        recoverable: true,
    })
}

pub fn arrive_unknown(
    id: &str,
    counter: i64,
    participants: &[u32],
    unknown: &str,
    task: u32,
) -> Command {
    Command::from(pb::coordination::BarrierArrive {
        id: id.into(),
        counter,
        timeout_ms: 10_000,
        participants: participants.to_vec(),
        task,
        unknown_participant: unknown.into(),
        recoverable: false,
    })
}

pub fn cancel(id: &str, counter: i64, task: u32) -> Command {
    Command::from(pb::coordination::BarrierCancel {
        id: id.into(),
        counter,
        task,
    })
}

pub fn expire(id: &str, counter: i64) -> Command {
    Command::from(pb::coordination::BarrierExpire {
        id: id.into(),
        counter,
    })
}

pub fn alive(task: u32, tasks: &[u32]) -> Command {
    Command::from(pb::coordination::AliveTasks {
        task,
        tasks: tasks.to_vec(),
    })
}

pub fn wait_all(task: u32, info: &[u8]) -> Command {
    Command::from(pb::coordination::WaitForAllTasks {
        task,
        device_info: info.to_vec().into(),
    })
}

pub fn noop() -> Command {
    Command::Noop(pb::Noop {})
}

// ---------------------------------------------------------- assertions ----

/// The error of `out`, asserting its code.
#[track_caller]
pub fn err(out: &Outcome, code: Code) -> DomainError {
    let e = out
        .error
        .clone()
        .unwrap_or_else(|| panic!("expected {code:?}, got success {out:?}"));
    assert_eq!(e.status(), code, "unexpected error: {e:?}");
    assert!(!out.parked, "an error outcome must not be parked");
    e
}

/// Asserts a domain error's code.
#[track_caller]
pub fn code_is(e: &DomainError, code: Code) -> DomainError {
    assert_eq!(e.status(), code, "unexpected error: {e:?}");
    e.clone()
}

/// Asserts `out` is a non-parked success.
#[track_caller]
pub fn ok(out: &Outcome) {
    assert!(out.error.is_none(), "expected success, got {out:?}");
    assert!(!out.parked, "expected an immediate answer, got {out:?}");
}

/// Asserts `out` is parked and returns its call id.
#[track_caller]
pub fn parked(out: &Outcome) -> u64 {
    assert!(out.error.is_none(), "expected parked, got {out:?}");
    assert!(out.parked, "expected parked, got {out:?}");
    out.call_id
}

#[track_caller]
pub fn contains(e: &DomainError, needle: &str) {
    assert!(
        e.message.contains(needle),
        "message {:?} does not contain {:?}",
        e.message,
        needle
    );
}

pub fn statuses(s: &State) -> Vec<TaskStatus> {
    (0..s.task_count())
        .map(|t| s.coordination().task_status(t).unwrap())
        .collect()
}

// ------------------------------------------------- parked calls' answers ----
// Each reads `State::wait_result` for one kind of wait (no epoch check).

/// The answer of a parked call waiting for `w`.
pub fn wait(s: &State, mut w: journal::Wait) -> Option<Result<journal::Answer, DomainError>> {
    s.wait_result("", None, &mut w)
}

/// A parked RegisterTask's answer: the service incarnation.
pub fn registration_result(
    s: &State,
    task: u32,
    incarnation: u64,
) -> Option<Result<u64, DomainError>> {
    wait(s, journal::Wait::Registration { task, incarnation }).map(|r| {
        r.map(|a| match a {
            journal::Answer::Incarnation(i) => i,
            other => panic!("a registration answered {other:?}"),
        })
    })
}

/// A parked barrier call's answer: the instance that passed.
pub fn barrier_result(
    s: &State,
    id: &str,
    counter: i64,
    call: u64,
) -> Option<Result<i64, DomainError>> {
    wait(
        s,
        journal::Wait::Barrier {
            id: id.into(),
            counter,
            call,
        },
    )
    .map(|r| {
        r.map(|a| match a {
            journal::Answer::Counter(c) => c,
            other => panic!("a barrier answered {other:?}"),
        })
    })
}

/// A parked ShutdownTask's answer.
pub fn shutdown_result(s: &State, call: u64) -> Option<Result<(), DomainError>> {
    wait(s, journal::Wait::Shutdown { call }).map(|r| r.map(|_| ()))
}

/// A parked WaitForAllTasks' answer.
pub fn wait_for_all_result(s: &State, call: u64) -> Option<Result<(), DomainError>> {
    wait(s, journal::Wait::WaitForAll { call }).map(|r| r.map(|_| ()))
}

/// A parked PollForError's answer (it only ever ends with an error).
pub fn poll_result(s: &State, task: u32, call: u64) -> Option<DomainError> {
    wait(s, journal::Wait::Poll { task, call }).map(|r| r.expect_err("a poll ends with an error"))
}

/// A parked GetAliveTasks' answer.
pub fn alive_result(
    s: &State,
    tasks: &[u32],
    generation: u64,
) -> Option<Result<journal::coordination::AliveTasks, DomainError>> {
    wait(
        s,
        journal::Wait::AliveTasks {
            tasks: tasks.to_vec(),
            generation,
        },
    )
    .map(|r| {
        r.map(|a| match a {
            journal::Answer::Alive(a) => a,
            other => panic!("GetAliveTasks answered {other:?}"),
        })
    })
}

/// Whether a WatchTasks that knows `version` answers now.
pub fn watch_tasks_ready(s: &State, version: i64) -> bool {
    wait(s, journal::Wait::TaskStates { version }).is_some()
}

/// Whether a join of `queue` answers now.
pub fn join_ready(s: &State, queue: &str) -> bool {
    wait(
        s,
        journal::Wait::JoinReady {
            queue: queue.into(),
        },
    )
    .is_some()
}
