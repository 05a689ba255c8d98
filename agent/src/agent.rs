//! The coordination agent of one task, with the API of TensorFlow's
//! `CoordinationServiceAgent` (`docs/protocols.md`, CoordinationServiceAgent
//! API), on tokio. It speaks the `tensorflow` dialect plus coordstore's
//! `Agent` service, knows every node of the cluster and rides through
//! failovers and node restarts: a call that fails in transport is re-issued
//! at the next node with the same origin, so it is applied exactly once.
//!
//! State machine (as upstream):
//!
//! ```text
//!                 initialize          connect             error
//!   UNINITIALIZED ---------> DISCONNECTED ---------> CONNECTED ------> ERROR
//!                                 ^                                    |
//!                                 |____________________________________|
//!                                                reset
//! ```

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use proto::coordstore::agent_client::AgentClient;
use proto::coordstore::{
    AgentPollRequest, PutKeyValueRequest, TaskRef, TaskStatusRequest, WatchRequest,
};
use proto::tf::coordination_service_client::CoordinationServiceClient;
use proto::tf::*;
use tokio::task::JoinHandle;
use tonic::transport::Channel;
use tonic::{Code, Status};

use crate::endpoints::Endpoints;

/// The agent's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AgentState {
    /// Not initialised.
    Uninitialized,
    /// Initialised, not connected.
    Disconnected,
    /// Registered with the service, heartbeating.
    Connected,
    /// An error was reported or propagated; `reset` returns to DISCONNECTED.
    Error,
}

/// A task's state as the service reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskStatusInfo {
    /// "DISCONNECTED", "CONNECTED" or "ERROR".
    pub state: String,
    /// The task's incarnation.
    pub incarnation: u64,
    /// Its error code (0 without error).
    pub error_code: i32,
    /// Its error message.
    pub error_message: String,
}

/// Settings of one agent.
#[derive(Clone, Debug)]
pub struct AgentConfig {
    /// Every node (HOST:PORT).
    pub endpoints: Vec<String>,
    /// This task's job.
    pub job_name: String,
    /// This task's id in its job.
    pub task_id: i32,
    /// Interval of the heartbeat task.
    pub heartbeat_interval: Duration,
    /// How long a call keeps trying nodes through an outage.
    pub retry_for: Duration,
    /// Largest message in either direction.
    pub max_message_bytes: usize,
    /// Dial the nodes over TLS with this (see `proto::tls::client`); None:
    /// plaintext.
    pub tls: Option<tonic::transport::ClientTlsConfig>,
    /// The namespace of the task's job (None: the default one).
    pub namespace: Option<String>,
}

impl AgentConfig {
    /// Defaults for task `task_id` of `job_name` on `endpoints`: heartbeat
    /// every 10 s, ride through outages of up to 5 minutes.
    pub fn new(endpoints: Vec<String>, job_name: &str, task_id: i32) -> Self {
        AgentConfig {
            endpoints,
            job_name: job_name.into(),
            task_id,
            heartbeat_interval: Duration::from_secs(10),
            retry_for: Duration::from_secs(300),
            max_message_bytes: 1 << 30,
            tls: None,
            namespace: None,
        }
    }
}

/// Callback invoked when the agent enters ERROR (reported, or propagated by
/// the service from any task).
pub type ErrorCallback = Arc<dyn Fn(&Status) + Send + Sync>;

/// Callback invoked with changed keys: value, or `None` when deleted.
pub type ChangedKeyValuesCallback = Arc<dyn Fn(&BTreeMap<String, Option<Bytes>>) + Send + Sync>;

struct Inner {
    cfg: AgentConfig,
    nodes: Endpoints,
    on_error: ErrorCallback,
    state: Mutex<AgentState>,
    error: Mutex<Option<Status>>,
    incarnation: Mutex<u64>,
    service_incarnation: Mutex<u64>,
    background: Mutex<Vec<JoinHandle<()>>>,
    cluster_devices: Mutex<CoordinationServiceDeviceInfo>,
    watches: Mutex<HashMap<String, JoinHandle<()>>>,
}

/// The coordination agent of one task. Cheap to clone (shared).
#[derive(Clone)]
pub struct Agent {
    inner: Option<Arc<Inner>>,
}

fn precondition(msg: impl Into<String>) -> Status {
    Status::failed_precondition(msg.into())
}

impl Default for Agent {
    fn default() -> Self {
        Agent::uninitialized()
    }
}

impl Agent {
    /// An agent in state UNINITIALIZED (every call but `initialize` fails).
    pub fn uninitialized() -> Agent {
        Agent { inner: None }
    }

    /// An initialised agent (DISCONNECTED). `on_error` is called whenever
    /// the agent enters ERROR.
    pub fn new(cfg: AgentConfig, on_error: ErrorCallback) -> Result<Agent, Status> {
        let mut a = Agent::uninitialized();
        a.initialize(cfg, on_error)?;
        Ok(a)
    }

    /// UNINITIALIZED → DISCONNECTED. FAILED_PRECONDITION if initialised already.
    pub fn initialize(&mut self, cfg: AgentConfig, on_error: ErrorCallback) -> Result<(), Status> {
        if self.inner.is_some() {
            return Err(precondition("the agent is already initialized"));
        }
        let nodes = Endpoints::with_tls(&cfg.endpoints, cfg.retry_for, cfg.tls.clone())
            .and_then(|e| e.in_namespace(cfg.namespace.as_deref()))
            .map_err(Status::invalid_argument)?;
        self.inner = Some(Arc::new(Inner {
            cfg,
            nodes,
            on_error,
            state: Mutex::new(AgentState::Disconnected),
            error: Mutex::new(None),
            incarnation: Mutex::new(0),
            service_incarnation: Mutex::new(0),
            background: Mutex::new(Vec::new()),
            cluster_devices: Mutex::new(CoordinationServiceDeviceInfo::default()),
            watches: Mutex::new(HashMap::new()),
        }));
        Ok(())
    }

    /// Whether `initialize` has run.
    pub fn is_initialized(&self) -> bool {
        self.inner.is_some()
    }

    fn inner(&self) -> Result<&Arc<Inner>, Status> {
        self.inner
            .as_ref()
            .ok_or_else(|| precondition("the agent is not initialized"))
    }

    /// The agent's state.
    pub fn state(&self) -> AgentState {
        match &self.inner {
            None => AgentState::Uninitialized,
            Some(i) => *lock(&i.state),
        }
    }

    /// The error that put the agent into ERROR, if any.
    pub fn error(&self) -> Option<Status> {
        self.inner.as_ref().and_then(|i| lock(&i.error).clone())
    }

    /// This task.
    pub fn own_task(&self) -> Result<CoordinatedTask, Status> {
        let i = self.inner()?;
        Ok(CoordinatedTask {
            job_name: i.cfg.job_name.clone(),
            task_id: i.cfg.task_id,
            recoverable: false,
        })
    }

    fn require(&self, want: AgentState, what: &str) -> Result<&Arc<Inner>, Status> {
        let i = self.inner()?;
        let st = *lock(&i.state);
        if st != want {
            return Err(precondition(format!(
                "{what} needs the agent to be {want:?}, but it is {st:?}"
            )));
        }
        Ok(i)
    }

    /// Registers the task (waiting for the whole cluster if the service uses
    /// a registration barrier), then starts heartbeats and error polling.
    /// FAILED_PRECONDITION unless DISCONNECTED.
    pub async fn connect(&self) -> Result<(), Status> {
        let i = self.require(AgentState::Disconnected, "connect")?.clone();
        let incarnation = rand::random::<u64>();
        *lock(&i.incarnation) = incarnation;
        let req = RegisterTaskRequest {
            incarnation,
            source_task: Some(i.task()),
        };
        let reply = i
            .nodes
            .call(req, |ch, r| async move { i_tf(ch).register_task(r).await })
            .await?;
        *lock(&i.service_incarnation) = reply.leader_incarnation;
        *lock(&i.state) = AgentState::Connected;
        *lock(&i.error) = None;
        let hb = tokio::spawn(heartbeats(i.clone(), incarnation));
        let poll = tokio::spawn(poll_errors(i.clone()));
        lock(&i.background).extend([hb, poll]);
        Ok(())
    }

    /// Waits until every task is up; sends this task's devices and keeps the
    /// cluster's. FAILED_PRECONDITION unless CONNECTED.
    pub async fn wait_for_all_tasks(
        &self,
        local_devices: CoordinationServiceDeviceInfo,
    ) -> Result<(), Status> {
        let i = self
            .require(AgentState::Connected, "wait_for_all_tasks")?
            .clone();
        let req = WaitForAllTasksRequest {
            local_device_info: Some(local_devices),
            source_task: Some(i.task()),
            device_info: None,
        };
        let reply = i
            .nodes
            .call(
                req,
                |ch, r| async move { i_tf(ch).wait_for_all_tasks(r).await },
            )
            .await?;
        *lock(&i.cluster_devices) = reply.cluster_device_info.unwrap_or_default();
        Ok(())
    }

    /// The cluster's devices from the last `wait_for_all_tasks`.
    pub fn cluster_device_info(&self) -> CoordinationServiceDeviceInfo {
        self.inner
            .as_ref()
            .map(|i| lock(&i.cluster_devices).clone())
            .unwrap_or_default()
    }

    /// The state of any task of the cluster.
    pub async fn task_status(&self, task: &CoordinatedTask) -> Result<TaskStatusInfo, Status> {
        let i = self.inner()?;
        let req = TaskStatusRequest {
            task: Some(TaskRef {
                job_name: task.job_name.clone(),
                task_id: task.task_id,
            }),
        };
        let r = i
            .nodes
            .call(req, |ch, r| async move { i_agent(ch).task_status(r).await })
            .await?;
        Ok(TaskStatusInfo {
            state: r.state,
            incarnation: r.incarnation,
            error_code: r.error_code,
            error_message: r.error_message,
        })
    }

    /// Reports `error` to the service (which sets this task to ERROR and
    /// propagates it) and puts the agent into ERROR. FAILED_PRECONDITION
    /// unless CONNECTED.
    pub async fn report_error(&self, error: Status) -> Result<(), Status> {
        let i = self.require(AgentState::Connected, "report_error")?.clone();
        let req = ReportErrorToServiceRequest {
            error_code: error.code() as i32,
            error_message: error.message().to_string(),
            error_origin: Some(i.task()),
        };
        i.nodes
            .call(req, |ch, r| async move {
                i_tf(ch).report_error_to_service(r).await
            })
            .await?;
        i.set_error(error);
        Ok(())
    }

    /// Disconnects from the service (at the shutdown barrier, if the service
    /// uses one) and stops heartbeats. In ERROR the agent still shuts down
    /// locally and answers FAILED_PRECONDITION.
    pub async fn shutdown(&self) -> Result<(), Status> {
        let i = self.inner()?.clone();
        let st = *lock(&i.state);
        match st {
            AgentState::Connected => {}
            AgentState::Error => {
                i.stop_background();
                *lock(&i.state) = AgentState::Disconnected;
                return Err(precondition(
                    "the task was in error state; the agent shut down without the service",
                ));
            }
            other => {
                return Err(precondition(format!(
                    "shutdown of an agent that is {other:?}"
                )))
            }
        }
        let req = ShutdownTaskRequest {
            source_task: Some(i.task()),
        };
        let result = i
            .nodes
            .call(req, |ch, r| async move { i_tf(ch).shutdown_task(r).await })
            .await;
        i.stop_background();
        *lock(&i.state) = AgentState::Disconnected;
        result.map(|_| ())
    }

    /// ERROR → DISCONNECTED: resets the task at the service so it can
    /// connect again. FAILED_PRECONDITION unless in ERROR.
    pub async fn reset(&self) -> Result<(), Status> {
        let i = self.require(AgentState::Error, "reset")?.clone();
        let req = ResetTaskRequest {
            source_task: Some(i.task()),
        };
        i.nodes
            .call(req, |ch, r| async move { i_tf(ch).reset_task(r).await })
            .await?;
        i.stop_background();
        *lock(&i.error) = None;
        *lock(&i.state) = AgentState::Disconnected;
        Ok(())
    }

    /// The value of `key`, waiting until it is set.
    pub async fn get_key_value(&self, key: &str) -> Result<Bytes, Status> {
        let i = self.inner()?;
        let req = GetKeyValueRequest { key: key.into() };
        let r = i
            .nodes
            .call(req, |ch, r| async move { i_tf(ch).get_key_value(r).await })
            .await?;
        Ok(r.kv.unwrap_or_default().value)
    }

    /// [`Agent::get_key_value`] with a timeout: DEADLINE_EXCEEDED when it passes.
    pub async fn get_key_value_timeout(
        &self,
        key: &str,
        timeout: Duration,
    ) -> Result<Bytes, Status> {
        match tokio::time::timeout(timeout, self.get_key_value(key)).await {
            Ok(r) => r,
            Err(_) => Err(Status::deadline_exceeded(format!(
                "timed out after {timeout:?} waiting for key {key}"
            ))),
        }
    }

    /// Starts a blocking get in the background; cancel it with
    /// [`KeyValueGet::cancel`].
    pub fn get_key_value_async(&self, key: &str) -> KeyValueGet {
        let agent = self.clone();
        let key = key.to_string();
        KeyValueGet {
            handle: tokio::spawn(async move { agent.get_key_value(&key).await }),
        }
    }

    /// The value of `key`, or NOT_FOUND.
    pub async fn try_get_key_value(&self, key: &str) -> Result<Bytes, Status> {
        let i = self.inner()?;
        let req = TryGetKeyValueRequest { key: key.into() };
        let r = i
            .nodes
            .call(
                req,
                |ch, r| async move { i_tf(ch).try_get_key_value(r).await },
            )
            .await?;
        Ok(r.kv.unwrap_or_default().value)
    }

    /// Every entry under directory `key`, sorted by key (never blocks).
    pub async fn get_key_value_dir(&self, key: &str) -> Result<Vec<(String, Bytes)>, Status> {
        let i = self.inner()?;
        let req = GetKeyValueDirRequest {
            directory_key: key.into(),
        };
        let r = i
            .nodes
            .call(
                req,
                |ch, r| async move { i_tf(ch).get_key_value_dir(r).await },
            )
            .await?;
        Ok(r.kv.into_iter().map(|e| (e.key, e.value)).collect())
    }

    /// [`Agent::get_key_value_dir`] in the background.
    pub fn get_key_value_dir_async(
        &self,
        key: &str,
    ) -> JoinHandle<Result<Vec<(String, Bytes)>, Status>> {
        let agent = self.clone();
        let key = key.to_string();
        tokio::spawn(async move { agent.get_key_value_dir(&key).await })
    }

    async fn put(&self, key: &str, value: Bytes, allow_overwrite: bool) -> Result<(), Status> {
        let i = self.inner()?;
        let req = PutKeyValueRequest {
            key: key.into(),
            value,
            allow_overwrite,
        };
        i.nodes
            .call(
                req,
                |ch, r| async move { i_agent(ch).put_key_value(r).await },
            )
            .await?;
        Ok(())
    }

    /// Inserts `key`; ALREADY_EXISTS if it is set.
    pub async fn insert_key_value(&self, key: &str, value: impl Into<Bytes>) -> Result<(), Status> {
        self.put(key, value.into(), false).await
    }

    /// Sets `key`, replacing any value.
    pub async fn update_key_value(&self, key: &str, value: impl Into<Bytes>) -> Result<(), Status> {
        self.put(key, value.into(), true).await
    }

    /// Adds `increment` to the integer value of `key` (an absent key
    /// counts as 0) and returns the new value; exactly once across
    /// failovers. FAILED_PRECONDITION if the value is not an integer.
    pub async fn increment_key_value(&self, key: &str, increment: i64) -> Result<i64, Status> {
        let i = self.inner()?;
        let req = proto::xla::IncrementKeyValueRequest {
            incarnations: Some(proto::xla::Incarnations {
                task_id: i.cfg.task_id,
                task_incarnation: *lock(&i.incarnation),
                service_incarnation: *lock(&i.service_incarnation),
            }),
            key: key.into(),
            increment,
        };
        let r = i
            .nodes
            .call(req, |ch, r| async move {
                proto::xla::coordination_service_client::CoordinationServiceClient::new(ch)
                    .increment_key_value(r)
                    .await
            })
            .await?;
        let value = r.kv.map(|kv| kv.value).unwrap_or_default();
        std::str::from_utf8(&value)
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .ok_or_else(|| Status::internal("IncrementKeyValue answered no integer"))
    }

    /// Deletes `key` and everything under it.
    pub async fn delete_key_value(&self, key: &str) -> Result<(), Status> {
        let i = self.inner()?;
        let req = DeleteKeyValueRequest {
            key: key.into(),
            is_directory: true,
        };
        i.nodes
            .call(
                req,
                |ch, r| async move { i_tf(ch).delete_key_value(r).await },
            )
            .await?;
        Ok(())
    }

    /// Calls `on_change` with every change of `key` or anything under it from
    /// now on, in revision order, without gaps or repeats across node
    /// failures (the watch resumes from its last revision). Returns once the
    /// service watches: every change acknowledged after this returns is
    /// delivered. If the service no longer has the history to resume from,
    /// the current values are re-read and delivered, with deletions for keys
    /// that disappeared.
    pub async fn start_watch_key(
        &self,
        key: &str,
        on_change: ChangedKeyValuesCallback,
    ) -> Result<(), Status> {
        let i = self.inner()?.clone();
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        {
            let mut watches = lock(&i.watches);
            if watches.contains_key(key) {
                return Err(Status::already_exists(format!(
                    "key {key} is already watched"
                )));
            }
            let handle = tokio::spawn(watch_loop(
                self.clone(),
                key.to_string(),
                on_change,
                ready_tx,
            ));
            watches.insert(key.to_string(), handle);
        }
        let started = match ready_rx.await {
            Ok(r) => r,
            Err(_) => Err(Status::cancelled("the watch was stopped before it started")),
        };
        if started.is_err() {
            lock(&i.watches).remove(key);
        }
        started
    }

    /// Stops a watch started with [`Agent::start_watch_key`]; NOT_FOUND if none.
    pub async fn stop_watch_key(&self, key: &str) -> Result<(), Status> {
        let i = self.inner()?;
        match lock(&i.watches).remove(key) {
            Some(h) => {
                h.abort();
                Ok(())
            }
            None => Err(Status::not_found(format!("key {key} is not watched"))),
        }
    }

    /// Waits at barrier `id` with `tasks` (empty = the whole cluster) for up
    /// to `timeout` (enforced by the service). FAILED_PRECONDITION unless
    /// CONNECTED.
    pub async fn wait_at_barrier(
        &self,
        id: &str,
        timeout: Duration,
        tasks: &[CoordinatedTask],
    ) -> Result<(), Status> {
        let i = self
            .require(AgentState::Connected, "wait_at_barrier")?
            .clone();
        let req = BarrierRequest {
            barrier_id: id.into(),
            barrier_timeout_in_ms: timeout.as_millis() as i64,
            tasks: tasks.to_vec(),
            source_task: Some(i.task()),
            // The seed protocol's barrier (`docs/protocols.md`, Barriers): no
            // instance counter, a finished id replays.
            counter: 0,
        };
        i.nodes
            .call(req, |ch, r| async move { i_tf(ch).barrier(r).await })
            .await?;
        Ok(())
    }

    /// [`Agent::wait_at_barrier`] in the background.
    pub fn wait_at_barrier_async(
        &self,
        id: &str,
        timeout: Duration,
        tasks: &[CoordinatedTask],
    ) -> JoinHandle<Result<(), Status>> {
        let agent = self.clone();
        let (id, tasks) = (id.to_string(), tasks.to_vec());
        tokio::spawn(async move { agent.wait_at_barrier(&id, timeout, &tasks).await })
    }

    /// Cancels barrier `id`: every waiter gets CANCELLED.
    pub async fn cancel_barrier(&self, id: &str) -> Result<(), Status> {
        let i = self.inner()?.clone();
        let req = CancelBarrierRequest {
            barrier_id: id.into(),
            source_task: Some(i.task()),
            counter: 0,
        };
        i.nodes
            .call(req, |ch, r| async move { i_tf(ch).cancel_barrier(r).await })
            .await?;
        Ok(())
    }
}

/// A blocking get running in the background.
pub struct KeyValueGet {
    handle: JoinHandle<Result<Bytes, Status>>,
}

impl KeyValueGet {
    /// Cancels the get; awaiting it then yields CANCELLED.
    pub fn cancel(&self) {
        self.handle.abort();
    }

    /// Waits for the value (or the error).
    pub async fn wait(self) -> Result<Bytes, Status> {
        match self.handle.await {
            Ok(r) => r,
            Err(e) if e.is_cancelled() => Err(Status::cancelled("the get was cancelled")),
            Err(e) => Err(Status::internal(format!("the get failed: {e}"))),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn i_tf(ch: Channel) -> CoordinationServiceClient<Channel> {
    CoordinationServiceClient::new(ch)
        .max_decoding_message_size(1 << 30)
        .max_encoding_message_size(1 << 30)
}

fn i_agent(ch: Channel) -> AgentClient<Channel> {
    AgentClient::new(ch)
        .max_decoding_message_size(1 << 30)
        .max_encoding_message_size(1 << 30)
}

impl Inner {
    fn task(&self) -> CoordinatedTask {
        CoordinatedTask {
            job_name: self.cfg.job_name.clone(),
            task_id: self.cfg.task_id,
            recoverable: false,
        }
    }

    /// Enters ERROR (once) and tells the error callback.
    fn set_error(&self, error: Status) {
        {
            let mut st = lock(&self.state);
            if *st == AgentState::Error {
                return;
            }
            *st = AgentState::Error;
            *lock(&self.error) = Some(error.clone());
        }
        (self.on_error)(&error);
    }

    fn stop_background(&self) {
        for h in lock(&self.background).drain(..) {
            h.abort();
        }
    }
}

async fn heartbeats(i: Arc<Inner>, incarnation: u64) {
    let mut tick = tokio::time::interval(i.cfg.heartbeat_interval);
    tick.tick().await;
    loop {
        tick.tick().await;
        let req = HeartbeatRequest {
            incarnation,
            source_task: Some(i.task()),
        };
        match i
            .nodes
            .call(req, |ch, r| async move { i_tf(ch).heartbeat(r).await })
            .await
        {
            Ok(r) => {
                let known = *lock(&i.service_incarnation);
                if r.leader_incarnation != known {
                    i.set_error(Status::aborted(format!(
                        "Leader incarnation ID mismatch: the service was restarted or reset (was {known}, now {})",
                        r.leader_incarnation
                    )));
                    return;
                }
            }
            Err(s) => {
                i.set_error(s);
                return;
            }
        }
    }
}

async fn poll_errors(i: Arc<Inner>) {
    let req = AgentPollRequest {
        task: Some(TaskRef {
            job_name: i.cfg.job_name.clone(),
            task_id: i.cfg.task_id,
        }),
    };
    let result = i
        .nodes
        .call(
            req,
            |ch, r| async move { i_agent(ch).poll_for_error(r).await },
        )
        .await;
    match result {
        // CANCELLED: the task disconnected or polled again; not an error.
        Err(s) if s.code() == Code::Cancelled => {}
        Err(s) => i.set_error(s),
        Ok(_) => {}
    }
}

/// What a watch has seen: the keys known under it (for deletions after a
/// re-read) and the newest revision delivered.
#[derive(Default)]
struct Watched {
    known: BTreeMap<String, Bytes>,
    last: u64,
}

impl Watched {
    /// Applies one watch message's events newer than what was delivered;
    /// the changes to deliver.
    fn events(&mut self, msg: proto::coordstore::WatchResponse) -> BTreeMap<String, Option<Bytes>> {
        let mut changes = BTreeMap::new();
        if self.last != 0 && msg.revision <= self.last {
            return changes;
        }
        for e in msg.events {
            if e.revision <= self.last {
                continue;
            }
            if e.deleted {
                self.known.remove(&e.key);
                changes.insert(e.key, None);
            } else {
                self.known.insert(e.key.clone(), e.value.clone());
                changes.insert(e.key, Some(e.value));
            }
        }
        self.last = msg.revision;
        changes
    }

    /// The history is gone: `now` (the keys read again at `revision`)
    /// replaces what was known; the changes to deliver.
    fn reread(
        &mut self,
        now: BTreeMap<String, Bytes>,
        revision: u64,
    ) -> BTreeMap<String, Option<Bytes>> {
        let mut changes = BTreeMap::new();
        for (k, v) in &now {
            if self.known.get(k) != Some(v) {
                changes.insert(k.clone(), Some(v.clone()));
            }
        }
        for k in self.known.keys() {
            if !now.contains_key(k) {
                changes.insert(k.clone(), None);
            }
        }
        self.known = now;
        self.last = revision;
        changes
    }
}

async fn watch_loop(
    agent: Agent,
    key: String,
    on_change: ChangedKeyValuesCallback,
    ready: tokio::sync::oneshot::Sender<Result<(), Status>>,
) {
    let Some(i) = agent.inner.clone() else {
        let _ = ready.send(Err(Status::failed_precondition(
            "the agent is not initialized",
        )));
        return;
    };
    // Told once the first stream's opening message (the baseline revision)
    // has arrived: from then on the service has every change for us.
    let mut ready = Some(ready);
    let mut watched = Watched::default();
    loop {
        let (idx, ch) = i.nodes.current();
        let req = i.nodes.request(WatchRequest {
            key: key.clone(),
            is_directory: true,
            start_revision: watched.last,
        });
        let mut stream = match i_agent(ch).watch(req).await {
            Ok(s) => s.into_inner(),
            Err(s) if crate::endpoints::is_transport_failure(&s) => {
                i.nodes.failed(idx);
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            Err(s) => {
                tracing::warn!("watch of {key} ended: {s}");
                if let Some(r) = ready.take() {
                    let _ = r.send(Err(s));
                }
                return;
            }
        };
        loop {
            let msg = match stream.message().await {
                Ok(Some(msg)) => msg,
                Ok(None) | Err(_) => {
                    i.nodes.failed(idx);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    break;
                }
            };
            if let Some(r) = ready.take() {
                let _ = r.send(Ok(()));
            }
            if !msg.compacted {
                let changes = watched.events(msg);
                if !changes.is_empty() {
                    on_change(&changes);
                }
                continue;
            }
            // History gone: deliver the current state instead.
            let Ok(now) = agent.get_key_value_dir(&key).await else {
                break;
            };
            let changes = watched.reread(now.into_iter().collect(), msg.revision);
            if !changes.is_empty() {
                on_change(&changes);
            }
            break;
        }
    }
}
