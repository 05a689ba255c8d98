//! The coordination area's calls, which every coordination dialect shares
//! (xla, tensorflow, coordstore's own Agent and Node APIs): tasks, KV,
//! barriers, errors, alive rounds. A call that changes state proposes the
//! journal command its adapter built, through the core (leader, forwarding,
//! exactly-once retries), and a call that waits parks on this node's
//! applied state — so a wait never depends on which node is leader, and
//! survives a failover untouched.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use journal::coordination::errors::{key_not_found, unknown_task, UnknownTaskIn};
use journal::coordination::{normalize_key, AliveTasks, HeartbeatCheck};
use journal::pb::coordination::{self as cmd, KvRecord, TaskEntry};
use journal::pb::update::Command;
use journal::{errors, Answer, Outcome, Wait};
use tokio::sync::mpsc;
use tonic::Status;

use crate::core::call::required;
use crate::core::{now_ms, Call, CallError, CallResult, Core};
use crate::duties::coordination::CoordinationDuty;

/// How long a heartbeat looks for the leader before the node considers
/// answering it itself.
const HEARTBEAT_LEADER_BUDGET: Duration = Duration::from_millis(100);

/// Most events sent in one watch message.
const WATCH_BATCH: usize = 1024;

/// A task as WatchTasks reports it.
#[derive(Clone, Debug)]
pub struct TaskView {
    /// Dense index.
    pub index: u32,
    /// Stored entry.
    pub entry: TaskEntry,
}

/// A proposed command's outcome and, for a call that waits, its answer.
struct Executed {
    outcome: Outcome,
    answer: Option<Answer>,
}

/// The coordination area of one node.
#[derive(Clone)]
pub struct Coordination {
    core: Arc<Core>,
    duty: Arc<CoordinationDuty>,
}

impl Coordination {
    /// Calls through `core`; heartbeats that reach the leader go to `duty`.
    pub fn new(core: Arc<Core>, duty: Arc<CoordinationDuty>) -> Self {
        Coordination { core, duty }
    }

    /// The core.
    pub fn core(&self) -> &Arc<Core> {
        &self.core
    }

    // ------------------------------------------------------------ names ----

    /// The index of task `id` of job `job`, resolved in the current job
    /// epoch, which the call's updates then carry; `call` picks the
    /// message naming an unknown task.
    pub fn task(&self, c: &Call, job: &str, id: i32, call: UnknownTaskIn) -> CallResult<u32> {
        let (index, epoch) = self.core.read(c, |s| (s.task_index(job, id), s.epoch()))?;
        c.named_in(epoch);
        index.ok_or_else(|| unknown_task(call, &journal::task_name(job, id)).into())
    }

    /// [`Coordination::task`] for a task named by its id alone (what the
    /// unknown-task message shows).
    pub fn task_id(&self, c: &Call, job: &str, id: i32, call: UnknownTaskIn) -> CallResult<u32> {
        self.task(c, job, id, call)
            .map_err(|_| unknown_task(call, &id.to_string()).into())
    }

    /// (job name, task id) of the task at `index`, for replies.
    pub fn task_of(&self, c: &Call, index: u32) -> Option<(String, i32)> {
        let task = |s: journal::Namespace<'_>| s.task_id(index).map(|(j, id)| (j.to_string(), id));
        self.core.read(c, task).ok().flatten()
    }

    /// The service incarnation, for replies (0 if the namespace is gone).
    pub fn service_incarnation(&self, c: &Call) -> u64 {
        self.core.read(c, |s| s.service_incarnation()).unwrap_or(0)
    }

    /// The caller's service incarnation must be the service's. A mismatch
    /// seen locally is confirmed with a linearizable read before it is
    /// reported.
    pub async fn check_service_incarnation(&self, c: &Call, requested: u64) -> CallResult<()> {
        if self.service_incarnation(c) == requested {
            return Ok(());
        }
        self.core.linearizable(c).await?;
        let current = self.service_incarnation(c);
        if current == requested {
            Ok(())
        } else {
            Err(errors::wrong_service_incarnation(requested, current).into())
        }
    }

    // ----------------------------------------------------------- writes ----

    /// Proposes `command` and, for a call that waits (`Wait::after`), parks
    /// until it answers. A domain error (of the update or of the wait) is
    /// the call's.
    async fn execute(&self, c: &Call, command: impl Into<Command>) -> CallResult<Executed> {
        let mut u = c.update(command.into());
        let applied = self.core.propose(c, &mut u).await?;
        let outcome = applied.outcome;
        if let Some(e) = outcome.error {
            return Err(CallError::Domain(e));
        }
        let wait = u
            .command
            .as_ref()
            .and_then(|cmd| Wait::after(cmd, &outcome));
        let answer = match wait {
            None => None,
            Some(w) => {
                let parked = self
                    .core
                    .park(c, applied.log_index, Some(outcome.epoch), w, None)
                    .await?;
                let answered = parked.expect("a wait without a deadline ends with an answer");
                Some(answered?)
            }
        };
        Ok(Executed { outcome, answer })
    }

    /// Proposes `command`, which answers nothing but success or an error.
    pub async fn apply(&self, c: &Call, command: impl Into<Command>) -> CallResult<()> {
        self.execute(c, command).await.map(|_| ())
    }

    /// RegisterTask: the service incarnation once the task is connected
    /// (after the registration barrier, if configured).
    pub async fn register(&self, c: &Call, r: cmd::RegisterTask) -> CallResult<u64> {
        let (task, incarnation) = (r.task, r.incarnation);
        let x = self.execute(c, r).await?;
        let inc = match x.answer {
            Some(Answer::Incarnation(i)) => i,
            _ => required(x.outcome.registered(), "RegisterTask")?,
        };
        // A (re)registration counts as a heartbeat for the leader's liveness.
        let _ = self.leader_heartbeat(c, task, incarnation).await;
        Ok(inc)
    }

    /// ShutdownTask (waits at the shutdown barrier if configured, unless
    /// the task declares itself recoverable).
    pub async fn shutdown(&self, c: &Call, r: cmd::ShutdownTask) -> CallResult<()> {
        self.apply(c, r).await
    }

    /// PollForError: ends only with an error (the propagated one, or
    /// CANCELLED on disconnect / a newer poll).
    pub async fn poll_for_error(&self, c: &Call, task: u32) -> CallError {
        match self.execute(c, cmd::PollForError { task }).await {
            Ok(_) => CallError::Status(Status::internal("PollForError ended without an error")),
            Err(e) => e,
        }
    }

    /// IncrementKeyValue: the new value.
    pub async fn kv_increment(&self, c: &Call, r: cmd::KvIncrement) -> CallResult<i64> {
        let x = self.execute(c, r).await?;
        required(x.outcome.incremented(), "IncrementKeyValue")
    }

    /// Barrier: the instance counter once it passed.
    pub async fn barrier(&self, c: &Call, r: cmd::BarrierArrive) -> CallResult<i64> {
        match self.execute(c, r).await? {
            Executed {
                answer: Some(Answer::Counter(n)),
                ..
            } => Ok(n),
            x => required(x.outcome.barrier_counter(), "Barrier"),
        }
    }

    /// GetAliveTasks rendezvous.
    pub async fn alive_tasks(&self, c: &Call, r: cmd::AliveTasks) -> CallResult<AliveTasks> {
        match self.execute(c, r).await?.answer {
            Some(Answer::Alive(a)) => Ok(a),
            _ => required(None, "GetAliveTasks"),
        }
    }

    /// WaitForAllTasks (TensorFlow dialect): every task's device info,
    /// from a state that has applied the call (and, when it waits, the
    /// barrier's end): on a follower the call's own entry may not be
    /// applied yet when the leader answers it.
    pub async fn wait_for_all_tasks(
        &self,
        c: &Call,
        r: cmd::WaitForAllTasks,
    ) -> CallResult<Vec<Bytes>> {
        self.execute(c, r).await?;
        self.core
            .read(c, |s| s.coordination().cluster_device_info())
    }

    // ------------------------------------------------------------ reads ----

    /// A linearizable point of `c`: this node's applied index after a read
    /// barrier, and the job epoch there.
    async fn linearizable(&self, c: &Call) -> CallResult<(u64, u64)> {
        let index = self.core.linearizable(c).await?;
        Ok((index, self.core.read(c, |s| s.epoch())?))
    }

    /// Parks a read call (after a linearizable read) until `wait` answers.
    async fn wait_read(&self, c: &Call, wait: Wait) -> CallResult<Answer> {
        let (index, epoch) = self.linearizable(c).await?;
        let parked = self.core.park(c, index, Some(epoch), wait, None).await?;
        Ok(parked.expect("a wait without a deadline ends with an answer")?)
    }

    /// WatchTasks: every task at a version other than `version`, waiting for
    /// the next change when `version` is the current one.
    pub async fn watch_tasks(&self, c: &Call, version: i64) -> CallResult<(Vec<TaskView>, i64)> {
        self.wait_read(c, Wait::TaskStates { version }).await?;
        self.core.read(c, |s| {
            let views = (0..s.task_count())
                .map(|i| TaskView {
                    index: i,
                    entry: s.coordination().task(i).cloned().unwrap_or_default(),
                })
                .collect();
            (views, s.coordination().tasks_version())
        })
    }

    /// The stored entries of `tasks` (linearizable), for GetTaskState.
    pub async fn task_entries(&self, c: &Call, tasks: &[u32]) -> CallResult<Vec<TaskEntry>> {
        self.linearizable(c).await?;
        self.core.read(c, |s| {
            tasks
                .iter()
                .map(|&i| s.coordination().task(i).cloned().unwrap_or_default())
                .collect()
        })
    }

    /// GetKeyValue: the value once the key exists (no server-side timeout).
    pub async fn kv_get(&self, c: &Call, key: &str) -> CallResult<Bytes> {
        match self.wait_read(c, Wait::Key { key: key.into() }).await? {
            Answer::Value(v) => Ok(v),
            _ => required(None, "GetKeyValue"),
        }
    }

    /// TryGetKeyValue: NOT_FOUND if absent.
    pub async fn kv_try_get(&self, c: &Call, key: &str) -> CallResult<Bytes> {
        self.linearizable(c).await?;
        self.core
            .read(c, |s| s.coordination().kv_get(key).cloned())?
            .ok_or_else(|| key_not_found(key).into())
    }

    /// GetKeyValueDir: entries under `dir`, stored (normalised) keys.
    pub async fn kv_dir(&self, c: &Call, dir: &str) -> CallResult<Vec<(String, Bytes)>> {
        self.linearizable(c).await?;
        self.core.read(c, |s| {
            s.coordination()
                .kv_dir(dir)
                .into_iter()
                .map(|(k, e)| (k.to_string(), e.value.clone()))
                .collect()
        })
    }

    /// A key's record in this node's state (the Node API reads it on the
    /// leader after a read barrier).
    pub fn kv_record_here(&self, c: &Call, key: &str) -> CallResult<Option<KvRecord>> {
        self.core
            .read(c, |s| s.coordination().kv_entry(key).cloned())
    }

    /// Up to `limit` entries (0: all) under `prefix` ("": every key) and the
    /// store's revision, in this node's state (as [`Self::kv_record_here`]).
    pub fn kv_list_here(
        &self,
        c: &Call,
        prefix: &str,
        limit: usize,
    ) -> CallResult<(Vec<(String, Bytes)>, u64)> {
        let take = if limit == 0 { usize::MAX } else { limit };
        self.core.read(c, |s| {
            let kv = s.coordination();
            let pair = |(k, e): (&str, &KvRecord)| (k.to_string(), e.value.clone());
            let entries = if normalize_key(prefix).is_empty() {
                kv.kv_all().take(take).map(pair).collect()
            } else {
                kv.kv_dir(prefix).into_iter().take(take).map(pair).collect()
            };
            (entries, kv.kv_revision())
        })
    }

    /// A revisioned, resumable watch of `key` (of every key under it with
    /// `is_dir`) from `start_revision` (0: now), as a stream of batches.
    /// It starts from a linearizable point (every change acknowledged
    /// before the watch began is at or below this node's revision then) and
    /// wakes only on changes of what it watches.
    pub async fn watch(
        &self,
        c: &Call,
        key: &str,
        is_dir: bool,
        start_revision: u64,
    ) -> CallResult<mpsc::Receiver<CallResult<WatchBatch>>> {
        self.linearizable(c).await?;
        let target = normalize_key(key);
        let last = match start_revision {
            0 => self.core.read(c, |s| s.coordination().kv_revision())?,
            r => r,
        };
        let (tx, rx) = mpsc::channel::<CallResult<WatchBatch>>(16);
        let watch = Watching {
            target,
            is_dir,
            last,
        };
        tokio::spawn(watch.send_changes(self.core.clone(), c.clone(), tx));
        Ok(rx)
    }

    // -------------------------------------------------------- heartbeats ----

    /// Heartbeat, checked and recorded by the leader runtime. Clients give a
    /// heartbeat a short deadline (jaxlib: half the heartbeat timeout) and die
    /// when it fails, so while no leader answers quickly (an election) a node
    /// that knew a leader with a quorum within the local answer window
    /// accepts it from its own state: a heartbeat lost then costs nothing,
    /// since a new leader counts every connected task as seen at takeover.
    /// It only ever accepts that way: a refusal, and anything past the
    /// window (this node cut off from the majority), waits for a leader, so
    /// the task learns its fate from the majority.
    pub async fn heartbeat(&self, c: &Call, task: u32, incarnation: u64) -> CallResult<u64> {
        let area = self.clone();
        let call = Call::internal().in_namespace(c.namespace());
        // The leader gets the heartbeat even when it is answered here first.
        let mut to_leader =
            tokio::spawn(async move { area.leader_heartbeat(&call, task, incarnation).await });
        let early = tokio::time::timeout(HEARTBEAT_LEADER_BUDGET, &mut to_leader)
            .await
            .ok();
        // Answered by the leader in time (a refusal included; not a
        // failure to reach one).
        if let Some(Ok(answer)) = &early {
            if !matches!(answer, Err(CallError::Status(_) | CallError::Retry(_))) {
                if let Err(CallError::Domain(e)) = answer {
                    return Err(e.clone().into());
                }
                return Ok(self.service_incarnation(c));
            }
        }
        let leader = self.core.router().leader();
        let accepted = leader.leader_heard_recently()
            && matches!(
                self.core.read(c, |s| s.coordination().heartbeat_check(
                    task,
                    incarnation,
                    now_ms()
                )),
                Ok(HeartbeatCheck::Accept | HeartbeatCheck::Ignore)
            );
        if !accepted {
            let answer = match early {
                // Still looking for a leader: keep waiting for it.
                None => to_leader
                    .await
                    .map_err(|e| Status::internal(format!("heartbeat task failed: {e}")))?,
                Some(_) => self.leader_heartbeat(c, task, incarnation).await,
            };
            answer?;
        }
        Ok(self.service_incarnation(c))
    }

    /// Delivers a task's heartbeat to the leader's coordination duty (here,
    /// or forwarded to the leader's Node API).
    pub async fn leader_heartbeat(&self, c: &Call, task: u32, incarnation: u64) -> CallResult<()> {
        let router = self.core.router();
        let ns = c.namespace_key();
        router
            .on_leader(
                c,
                || self.duty.heartbeat(router.leader(), ns, task, incarnation),
                |ch| router.forward_heartbeat(ch, c, task, incarnation),
            )
            .await
    }
}

/// The ReportError command of a task's report: an unknown code is UNKNOWN.
pub fn report_error(task: u32, code: i32, message: String) -> cmd::ReportError {
    let code = journal::Code::try_from(code).unwrap_or(journal::Code::Unknown) as i32;
    cmd::ReportError {
        task,
        code,
        message,
    }
}

/// Whether `key` (normalised) is what a watch of `target` covers.
fn covers(target: &str, is_dir: bool, key: &str) -> bool {
    key == target
        || (is_dir
            && (target.is_empty() || key.strip_prefix(target).is_some_and(|r| r.starts_with('/'))))
}

/// One message of a watch: the changes of what it watches in revision
/// order (none in the first, which reports the revision the watch starts
/// after), everything up to `revision` delivered; `compacted`: the history
/// it needed is gone, and it ends.
#[derive(Clone, Debug, PartialEq)]
pub struct WatchBatch {
    /// The changes.
    pub events: Vec<KvChange>,
    /// Delivered up to here.
    pub revision: u64,
    /// The history is gone (the last message).
    pub compacted: bool,
}

/// One change of a watched key.
#[derive(Clone, Debug, PartialEq)]
pub struct KvChange {
    /// Its revision.
    pub revision: u64,
    /// The key, normalised.
    pub key: String,
    /// The value set (empty for a delete).
    pub value: Bytes,
    /// A delete.
    pub deleted: bool,
}

/// What a watch of `target` gets after revision `last`: the events it
/// covers (a bounded batch), the revision they reach, and whether there is
/// more; or the revision to start over from if the history no longer
/// reaches back to `last`.
fn watch_batch(
    s: journal::Namespace<'_>,
    target: &str,
    is_dir: bool,
    last: u64,
) -> Result<(Vec<KvChange>, u64, bool), u64> {
    let kv = s.coordination();
    let events = kv.kv_events_after(last).map_err(|c| c.revision)?;
    let mut out = Vec::new();
    let mut upto = last;
    for e in events {
        if out.len() >= WATCH_BATCH && e.revision != upto {
            break;
        }
        upto = e.revision;
        if covers(target, is_dir, &e.key) {
            out.push(KvChange {
                revision: e.revision,
                key: e.key.clone(),
                value: e.value.clone(),
                deleted: e.deleted,
            });
        }
    }
    Ok((out, upto, upto < kv.kv_revision()))
}

/// A KV watch being served: what it watches, and the newest revision it
/// has sent.
struct Watching {
    target: String,
    is_dir: bool,
    last: u64,
}

impl Watching {
    /// Sends the watch's first message (its baseline revision), then every
    /// change of what it watches as it is applied here, until the receiver
    /// goes, the history it needs is gone (a `compacted` message), or its
    /// namespace is deleted.
    async fn send_changes(
        mut self,
        core: Arc<Core>,
        call: Call,
        tx: mpsc::Sender<CallResult<WatchBatch>>,
    ) {
        let first = WatchBatch {
            events: Vec::new(),
            revision: self.last,
            compacted: false,
        };
        if tx.send(Ok(first)).await.is_err() {
            return;
        }
        let (objects, dirs) = if self.is_dir {
            (Vec::new(), vec![self.target.clone()])
        } else {
            (vec![journal::Object::Key(self.target.clone())], Vec::new())
        };
        let wakers = core.parking().wakers().clone();
        let watching = wakers.register(call.namespace_key(), objects, dirs);
        loop {
            let woken = watching.notified();
            let Ok(batch) = core.read(&call, |s| {
                watch_batch(s, &self.target, self.is_dir, self.last)
            }) else {
                let gone = format!("namespace {} was deleted", call.namespace());
                let _ = tx.send(Err(Status::not_found(gone).into())).await;
                return;
            };
            match batch {
                Err(revision) => {
                    let compacted = WatchBatch {
                        events: Vec::new(),
                        revision,
                        compacted: true,
                    };
                    let _ = tx.send(Ok(compacted)).await;
                    return;
                }
                Ok((events, upto, more)) => {
                    if !events.is_empty() {
                        let msg = WatchBatch {
                            events,
                            revision: upto,
                            compacted: false,
                        };
                        if tx.send(Ok(msg)).await.is_err() {
                            return;
                        }
                    }
                    self.last = upto;
                    if more {
                        continue;
                    }
                }
            }
            tokio::select! {
                () = woken => {
                    if wakers.is_closed() {
                        return;
                    }
                }
                () = tx.closed() => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::covers;

    #[test]
    fn watch_coverage() {
        assert!(covers("a", false, "a"));
        assert!(!covers("a", false, "a/b"));
        assert!(covers("a", true, "a/b"));
        assert!(covers("a", true, "a"));
        assert!(!covers("a", true, "ab"));
        assert!(covers("", true, "anything"));
    }
}
