//! The coordination area's calls, which every wire dialect shares. An
//! adapter calls these with wire task names resolved here; each call
//! proposes its update through the router (leader, forwarding, exactly-once
//! retries) and,
//! for calls that wait, waits on this node's applied state — so a wait never
//! depends on which node is leader, and survives a failover untouched.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use journal::pb::{
    coordination::{
        AliveTasks as AliveCmd, BarrierArrive, BarrierCancel, KvDelete, KvIncrement, KvInsert,
        PollForError, RegisterTask, ReportError, ResetTask, ShutdownTask, TaskEntry,
        WaitForAllTasks,
    },
    update::Command,
    Code, Origin,
};
use journal::{
    coordination::{AliveTasks, HeartbeatCheck},
    errors, Answer, DomainError, Outcome, State, Update, Wait,
};
use raft::Applied;
use tonic::Status;

use crate::leader::now_ms;
use crate::router::Router;
use crate::wake::WaitKind;

/// How long a heartbeat looks for the leader before the node considers
/// answering it itself.
const HEARTBEAT_LEADER_BUDGET: Duration = Duration::from_millis(100);

/// A failed coordination call: a domain error (mapped to the dialect's wire
/// error) or a transport-level status (no leader, shutting down).
#[derive(Debug)]
pub enum CallError {
    /// The state machine's answer.
    Domain(DomainError),
    /// The call could not be carried out.
    Status(Status),
}

impl From<Status> for CallError {
    fn from(s: Status) -> Self {
        CallError::Status(s)
    }
}

impl From<DomainError> for CallError {
    fn from(e: DomainError) -> Self {
        CallError::Domain(e)
    }
}

/// Result of a coordination call.
pub type CallResult<T> = Result<T, CallError>;

/// A task as WatchTasks reports it.
#[derive(Clone, Debug)]
pub struct TaskView {
    /// Dense index.
    pub index: u32,
    /// Stored entry.
    pub entry: TaskEntry,
}

/// The shared coordination operations of one node. A copy made for one
/// call ([`Coordination::for_request`]) also remembers the job epoch in which
/// the call's task names were resolved ([`Coordination::task_index`]); its
/// updates carry that epoch, so a call that raced a job reset is refused
/// instead of landing on whatever task has the index now.
pub struct Coordination {
    router: Arc<Router>,
    ready_wait: Duration,
    origin: Option<Origin>,
    /// The epoch of the first task resolution (`NOT_NAMED`: none yet).
    named_in: AtomicU64,
}

const NOT_NAMED: u64 = u64::MAX;

impl Clone for Coordination {
    fn clone(&self) -> Self {
        Coordination {
            router: self.router.clone(),
            ready_wait: self.ready_wait,
            origin: self.origin,
            named_in: AtomicU64::new(self.named_in.load(Ordering::Relaxed)),
        }
    }
}

pub use proto::ORIGIN_HEADER;

/// The origin a request carries in [`ORIGIN_HEADER`], if any
/// (`CLIENT_ID:SEQ[:DONE_BELOW]`, see [`proto::origin`]).
pub fn request_origin<T>(req: &tonic::Request<T>) -> Result<Option<Origin>, Status> {
    let Some(v) = req.metadata().get(ORIGIN_HEADER) else {
        return Ok(None);
    };
    let text = v.to_str().map_err(|_| {
        Status::invalid_argument(format!(
            "malformed {ORIGIN_HEADER} header (want CLIENT_ID:SEQ[:DONE_BELOW])"
        ))
    })?;
    let o = proto::origin::WireOrigin::parse(text)
        .map_err(|e| Status::invalid_argument(format!("{ORIGIN_HEADER} header: {e}")))?;
    Ok(Some(Origin {
        client_id: o.client_id,
        seq: o.seq,
        done_below: o.done_below,
    }))
}

fn flatten<T>(r: Result<Result<T, DomainError>, Status>) -> CallResult<T> {
    match r {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(CallError::Domain(e)),
        Err(s) => Err(CallError::Status(s)),
    }
}

impl Coordination {
    /// Calls through `router`; a call waits up to `ready_wait` for the
    /// service to be configured before answering UNAVAILABLE.
    pub fn new(router: Arc<Router>, ready_wait: Duration) -> Self {
        Coordination {
            router,
            ready_wait,
            origin: None,
            named_in: AtomicU64::new(NOT_NAMED),
        }
    }

    /// These operations for one call: its update gets the caller's origin
    /// (from [`ORIGIN_HEADER`]) instead of one stamped by this node.
    pub fn for_request<T>(&self, req: &tonic::Request<T>) -> Result<Coordination, Status> {
        Ok(Coordination {
            router: self.router.clone(),
            ready_wait: self.ready_wait,
            origin: request_origin(req)?,
            named_in: AtomicU64::new(NOT_NAMED),
        })
    }

    /// The router.
    pub fn router(&self) -> &Arc<Router> {
        &self.router
    }

    /// The index of task `id` of job `job`, resolved in the current job
    /// epoch, which this call's updates then carry.
    pub fn task_index(&self, job: &str, id: i32) -> Option<u32> {
        let (index, epoch) = self.read(|s| (s.task_index(job, id), s.epoch()));
        let _ =
            self.named_in
                .compare_exchange(NOT_NAMED, epoch, Ordering::Relaxed, Ordering::Relaxed);
        index
    }

    /// (job name, task id) of the task at `index`, for replies.
    pub fn task_of(&self, index: u32) -> Option<(String, i32)> {
        self.read(|s| s.task_id(index).map(|(job, id)| (job.to_string(), id)))
    }

    /// The service incarnation, for replies.
    pub fn service_incarnation(&self) -> u64 {
        self.read(|s| s.service_incarnation())
    }

    fn named_in(&self) -> Option<u64> {
        match self.named_in.load(Ordering::Relaxed) {
            NOT_NAMED => None,
            e => Some(e),
        }
    }

    /// Reads the local state.
    pub fn read<T>(&self, f: impl FnOnce(&State) -> T) -> T {
        self.router.node().state().read(f)
    }

    /// Waits until this node has applied the service configuration (the
    /// first leader proposes it). UNAVAILABLE (no payload: clients retry)
    /// if it does not come in time.
    pub async fn ready(&self) -> Result<(), Status> {
        if self.read(|s| s.is_initialized()) {
            return Ok(());
        }
        let deadline = Instant::now() + self.ready_wait;
        let mut rx = self.router.node().state().subscribe();
        loop {
            rx.borrow_and_update();
            if self.read(|s| s.is_initialized()) {
                return Ok(());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || tokio::time::timeout(left, rx.changed()).await.is_err() {
                return Err(Status::unavailable(
                    "the coordination service is not configured yet (no leader has been elected)",
                ));
            }
        }
    }

    /// The service incarnation, checked against a caller's. A mismatch seen
    /// locally is confirmed with a linearizable read before it is reported.
    pub async fn check_service_incarnation(&self, requested: u64) -> CallResult<()> {
        if self.read(|s| s.service_incarnation()) == requested {
            return Ok(());
        }
        self.router.linearizable().await?;
        let current = self.read(|s| s.service_incarnation());
        if current == requested {
            Ok(())
        } else {
            Err(errors::wrong_service_incarnation(requested, current).into())
        }
    }

    async fn propose(&self, command: Command) -> CallResult<(Applied, Outcome)> {
        let applied = self
            .router
            .propose(
                Update {
                    origin: self.origin,
                    command: Some(command),
                    epoch: self.named_in(),
                    ..Default::default()
                },
                true,
            )
            .await?;
        let outcome = applied.outcome.clone();
        if let Some(e) = outcome.error.clone() {
            return Err(CallError::Domain(e));
        }
        Ok((applied, outcome))
    }

    async fn wait<T>(
        &self,
        kind: WaitKind,
        applied: &Applied,
        check: impl FnMut(&State) -> Option<Result<T, DomainError>>,
    ) -> CallResult<T> {
        let epoch = applied.outcome.epoch;
        flatten(
            self.router
                .waits()
                .wait_for(kind, applied.log_index, epoch, check)
                .await,
        )
    }

    /// Waits, after a linearizable read, until `check` answers.
    async fn wait_read<T>(
        &self,
        kind: WaitKind,
        check: impl FnMut(&State) -> Option<Result<T, DomainError>>,
    ) -> CallResult<T> {
        self.router.linearizable().await?;
        let index = self.router.waits().applied_index();
        let epoch = self.read(|s| s.epoch());
        flatten(
            self.router
                .waits()
                .wait_for(kind, index, epoch, check)
                .await,
        )
    }

    /// RegisterTask: answers the service incarnation once the task is
    /// connected (after the registration barrier, if configured).
    /// `recoverable`: the task declares itself recoverable (TensorFlow).
    pub async fn register(
        &self,
        task: u32,
        incarnation: u64,
        recoverable: bool,
    ) -> CallResult<u64> {
        let (applied, out) = self
            .propose(Command::from(RegisterTask {
                task,
                incarnation,
                recoverable,
            }))
            .await?;
        let inc = if out.parked {
            self.wait(WaitKind::Register, &applied, |s| {
                crate::wake::answer(s, Wait::Registration { task, incarnation }).map(|r| {
                    r.map(|a| match a {
                        Answer::Incarnation(i) => i,
                        _ => 0,
                    })
                })
            })
            .await?
        } else {
            reply(out.registered(), "RegisterTask")?
        };
        // A (re)registration counts as a heartbeat for the leader's liveness.
        let _ = self.router.heartbeat(task, incarnation, true).await;
        Ok(inc)
    }

    /// Heartbeat, checked and recorded by the leader runtime. Clients give a
    /// heartbeat a short deadline (jaxlib: half the heartbeat timeout) and die
    /// when it fails, so while no leader answers quickly (an election) a node
    /// that knew a leader with a quorum within the local answer window
    /// accepts it from its own state: a heartbeat lost then costs nothing,
    /// since a new leader counts every connected task as seen at takeover.
    /// It only ever accepts that way: a refusal, and anything past the
    /// window (this node cut off from the majority), waits for a leader, so
    /// the task learns its fate from the majority.
    pub async fn heartbeat(&self, task: u32, incarnation: u64) -> CallResult<u64> {
        let router = self.router.clone();
        // The leader gets the heartbeat even when it is answered here first.
        let mut to_leader =
            tokio::spawn(async move { router.heartbeat(task, incarnation, true).await });
        let early = tokio::time::timeout(HEARTBEAT_LEADER_BUDGET, &mut to_leader)
            .await
            .ok();
        if let Some(Ok(Ok(answer))) = early {
            answer?;
            return Ok(self.read(|s| s.service_incarnation()));
        }
        let accepted = self.router.leader().leader_heard_recently()
            && matches!(
                self.read(|s| s
                    .coordination()
                    .heartbeat_check(task, incarnation, now_ms())),
                HeartbeatCheck::Accept | HeartbeatCheck::Ignore
            );
        if !accepted {
            let answer = match early {
                // Still looking for a leader: keep waiting for it.
                None => to_leader
                    .await
                    .map_err(|e| Status::internal(format!("heartbeat task failed: {e}")))?,
                Some(_) => self.router.heartbeat(task, incarnation, true).await,
            };
            flatten(answer)?;
        }
        Ok(self.read(|s| s.service_incarnation()))
    }

    /// ShutdownTask (waits at the shutdown barrier if configured, unless
    /// the task declares itself recoverable).
    pub async fn shutdown(&self, task: u32, recoverable: bool) -> CallResult<()> {
        let (applied, out) = self
            .propose(Command::from(ShutdownTask { task, recoverable }))
            .await?;
        if out.parked {
            let call = out.call_id;
            self.wait(WaitKind::Shutdown, &applied, |s| {
                crate::wake::answer(s, Wait::Shutdown { call }).map(|r| r.map(|_| ()))
            })
            .await?;
        }
        Ok(())
    }

    /// ResetTask (TensorFlow dialect).
    pub async fn reset(&self, task: u32) -> CallResult<()> {
        self.propose(Command::from(ResetTask { task })).await?;
        Ok(())
    }

    /// ReportErrorToService.
    pub async fn report_error(&self, task: u32, code: i32, message: String) -> CallResult<()> {
        let code = Code::try_from(code).unwrap_or(Code::Unknown);
        self.propose(Command::from(ReportError {
            task,
            code: code as i32,
            message,
        }))
        .await?;
        Ok(())
    }

    /// PollForError: ends only with an error (the propagated one, or
    /// CANCELLED on disconnect / a newer poll).
    pub async fn poll_for_error(&self, task: u32) -> CallError {
        let (applied, out) = match self.propose(Command::from(PollForError { task })).await {
            Ok(v) => v,
            Err(e) => return e,
        };
        let call = out.call_id;
        match self
            .wait(WaitKind::PollForError, &applied, |s| {
                crate::wake::answer(s, Wait::Poll { task, call }).map(|r| r.map(|_| ()))
            })
            .await
        {
            Ok(()) => CallError::Status(Status::internal("PollForError ended without an error")),
            Err(e) => e,
        }
    }

    /// WatchTasks: every task at a version other than `version`, waiting for
    /// the next change when `version` is the current one.
    pub async fn watch_tasks(&self, version: i64) -> CallResult<(Vec<TaskView>, i64)> {
        self.wait_read(WaitKind::WatchTasks, |s| {
            crate::wake::answer(s, Wait::TaskStates { version }).map(|_| {
                let views = (0..s.task_count())
                    .map(|i| TaskView {
                        index: i,
                        entry: s.coordination().task(i).cloned().unwrap_or_default(),
                    })
                    .collect();
                Ok((views, s.coordination().tasks_version()))
            })
        })
        .await
    }

    /// The stored entries of `tasks` (linearizable), for GetTaskState.
    pub async fn task_entries(&self, tasks: &[u32]) -> CallResult<Vec<TaskEntry>> {
        self.router.linearizable().await?;
        Ok(self.read(|s| {
            tasks
                .iter()
                .map(|&i| s.coordination().task(i).cloned().unwrap_or_default())
                .collect()
        }))
    }

    /// InsertKeyValue.
    pub async fn kv_insert(
        &self,
        key: String,
        value: Bytes,
        allow_overwrite: bool,
    ) -> CallResult<()> {
        self.propose(Command::from(KvInsert {
            key,
            value,
            allow_overwrite,
        }))
        .await?;
        Ok(())
    }

    /// GetKeyValue: the value once the key exists (no server-side timeout).
    pub async fn kv_get_blocking(&self, key: &str) -> CallResult<Bytes> {
        self.router.linearizable().await?;
        let index = self.router.waits().applied_index();
        let epoch = self.read(|s| s.epoch());
        flatten(self.router.waits().wait_for_key(index, epoch, key).await)
    }

    /// TryGetKeyValue: NOT_FOUND if absent.
    pub async fn kv_try_get(&self, key: &str) -> CallResult<Bytes> {
        self.router.linearizable().await?;
        self.read(|s| s.coordination().kv_get(key).cloned())
            .ok_or_else(|| CallError::Domain(journal::coordination::errors::key_not_found(key)))
    }

    /// GetKeyValueDir: entries under `dir`, stored (normalised) keys.
    pub async fn kv_dir(&self, dir: &str) -> CallResult<Vec<(String, Bytes)>> {
        self.router.linearizable().await?;
        Ok(self.read(|s| {
            s.coordination()
                .kv_dir(dir)
                .into_iter()
                .map(|(k, e)| (k.to_string(), e.value.clone()))
                .collect()
        }))
    }

    /// IncrementKeyValue: the new value.
    pub async fn kv_increment(&self, key: String, increment: i64) -> CallResult<i64> {
        let (_, out) = self
            .propose(Command::from(KvIncrement { key, increment }))
            .await?;
        reply(out.incremented(), "IncrementKeyValue")
    }

    /// DeleteKeyValue (always recursive).
    pub async fn kv_delete(&self, key: String) -> CallResult<()> {
        self.propose(Command::from(KvDelete { key })).await?;
        Ok(())
    }

    /// Barrier: the instance counter once it passed. `recoverable`: the
    /// caller declares itself recoverable (TensorFlow).
    #[allow(clippy::too_many_arguments)]
    pub async fn barrier(
        &self,
        id: String,
        counter: i64,
        timeout_ms: u64,
        participants: Vec<u32>,
        unknown_participant: String,
        task: u32,
        recoverable: bool,
    ) -> CallResult<i64> {
        let (applied, out) = self
            .propose(Command::from(BarrierArrive {
                id: id.clone(),
                counter,
                timeout_ms,
                participants,
                task,
                unknown_participant,
                recoverable,
            }))
            .await?;
        let instance = reply(out.barrier_counter(), "Barrier")?;
        if !out.parked {
            return Ok(instance);
        }
        // The waiter parks on the instance the call joined or opened.
        let call = out.call_id;
        self.wait(WaitKind::Barrier, &applied, |s| {
            crate::wake::answer(
                s,
                Wait::Barrier {
                    id: id.clone(),
                    counter: instance,
                    call,
                },
            )
            .map(|r| {
                r.map(|a| match a {
                    Answer::Counter(c) => c,
                    _ => instance,
                })
            })
        })
        .await
    }

    /// CancelBarrier.
    pub async fn cancel_barrier(&self, id: String, counter: i64, task: u32) -> CallResult<()> {
        self.propose(Command::from(BarrierCancel { id, counter, task }))
            .await?;
        Ok(())
    }

    /// GetAliveTasks rendezvous.
    pub async fn alive_tasks(&self, task: u32, tasks: Vec<u32>) -> CallResult<AliveTasks> {
        let (applied, out) = self
            .propose(Command::from(AliveCmd {
                task,
                tasks: tasks.clone(),
            }))
            .await?;
        let generation = reply(out.alive_generation(), "GetAliveTasks")?;
        self.wait(WaitKind::AliveTasks, &applied, |s| {
            crate::wake::answer(
                s,
                Wait::AliveTasks {
                    tasks: tasks.clone(),
                    generation,
                },
            )
            .map(|r| {
                r.map(|a| match a {
                    Answer::Alive(a) => a,
                    _ => AliveTasks {
                        tasks: Vec::new(),
                        incarnations: Vec::new(),
                    },
                })
            })
        })
        .await
    }

    /// WaitForAllTasks (TensorFlow dialect): every task's device info.
    pub async fn wait_for_all_tasks(
        &self,
        task: u32,
        device_info: Bytes,
    ) -> CallResult<Vec<Bytes>> {
        let (applied, out) = self
            .propose(Command::from(WaitForAllTasks { task, device_info }))
            .await?;
        // Answer from a state that has applied this call (and, when it
        // waits, the barrier's end): on a follower the call's own entry may
        // not be applied yet when the leader answers it.
        let call = out.call_id;
        self.wait(WaitKind::WaitForAllTasks, &applied, |s| {
            crate::wake::answer(s, Wait::WaitForAll { call })
                .map(|r| r.map(|_| s.coordination().cluster_device_info()))
        })
        .await
    }
}

/// The area's reply an outcome must carry; its absence is a bug between
/// this service and the journal, not the caller's.
fn reply<T>(value: Option<T>, call: &str) -> CallResult<T> {
    value.ok_or_else(|| {
        CallError::Status(Status::internal(format!(
            "the journal answered {call} without its result"
        )))
    })
}
