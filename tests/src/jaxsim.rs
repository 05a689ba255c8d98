//! Simulated jaxlib 0.12 tasks: the `xla.coordination` calls a stock jaxlib
//! client makes over a job's life (`docs/protocols.md`, "A stock jaxlib
//! job's calls"), in one process, for jobs far larger than one Python
//! process per task allows. Per task:
//!
//! 1. `RegisterTask` with a random incarnation (held until all N
//!    registered);
//! 2. from then on, as jaxlib does right after: a `PollForError` long poll
//!    and the preemption manager's `GetKeyValue RECEIVED_PREEMPTION_NOTICE`
//!    long poll (both without a deadline), and a `Heartbeat` every
//!    heartbeat_timeout / 2, the first one interval after registration;
//! 3. topology exchange, as XLA's `ExchangeTopologies`: `InsertKeyValue
//!    cuda:local_topology/cuda/<i>`; task 0 reads every task's key with
//!    blocking `GetKeyValue`s from a pool of [`EXCHANGE_READERS`] threads
//!    (XLA's pool has one per CPU of the host) and sets
//!    `cuda:global_topology/cuda`; the others block on that key;
//! 4. a `Barrier` of all N;
//! 5. shutdown: the preemption get is cancelled (the stream reset), then
//!    `ShutdownTask` (the shutdown barrier); `PollForError` then ends
//!    CANCELLED.
//!
//! The driver runs the phases one after another; each ends when its
//! slowest task is done. Task t dials `addrs[t % addrs.len()]`; K tasks
//! share one HTTP/2 connection (`tasks_per_conn`, 1 = one each, as real
//! tasks).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use proto::xla::coordination_service_client::CoordinationServiceClient;
use proto::xla::{
    BarrierRequest, GetKeyValueRequest, HeartbeatRequest, Incarnations, InsertKeyValueRequest,
    KeyValueEntry, PollForErrorRequest, RegisterTaskRequest, ShutdownTaskRequest,
};
use tokio::task::JoinHandle;
use tonic::transport::{Channel, Endpoint};
use tonic::Code;

type Client = CoordinationServiceClient<Channel>;

/// The threads task 0 reads the local topologies with (XLA sizes its pool
/// by the host's CPUs; 32 is a modest host).
pub const EXCHANGE_READERS: usize = 32;

/// Task `t`'s local topology key, as XLA names it on a GPU.
fn local_key(t: usize) -> String {
    format!("cuda:local_topology/cuda/{t}")
}

/// The global topology key task 0 sets.
const GLOBAL_KEY: &str = "cuda:global_topology/cuda";

/// The key jaxlib's preemption sync manager long-polls.
pub const PREEMPTION_KEY: &str = "RECEIVED_PREEMPTION_NOTICE";

/// One job: its tasks and where they dial.
#[derive(Clone, Debug)]
pub struct JobSpec {
    /// Tasks (N).
    pub tasks: usize,
    /// The service's addresses for this job (its namespace's port on each
    /// node, or each node's main port); task t dials `addrs[t % len]`.
    pub addrs: Vec<String>,
}

/// What to simulate: one job, or a fleet of jobs run at once.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// The jobs.
    pub jobs: Vec<JobSpec>,
    /// Tasks per HTTP/2 connection (1: a connection each).
    pub tasks_per_conn: usize,
    /// jaxlib's heartbeat interval (heartbeat_timeout / 2: 50 s by default).
    pub heartbeat_interval: Duration,
    /// How long one call may take before it counts as an error.
    pub call_timeout: Duration,
}

/// Calls of one kind in one phase.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct CallStats {
    /// Calls that returned OK.
    pub ok: u64,
    /// Calls that failed (error or timeout).
    pub errors: u64,
    /// The first failure.
    pub first_error: Option<String>,
    /// Latencies of the OK calls, ms (sorted when reported).
    #[serde(skip)]
    pub samples_ms: Vec<f64>,
    /// Median, ms.
    pub p50_ms: f64,
    /// 99th percentile, ms.
    pub p99_ms: f64,
    /// Slowest, ms.
    pub max_ms: f64,
}

impl CallStats {
    fn record(&mut self, took: Duration, r: Result<(), String>) {
        match r {
            Ok(()) => {
                self.ok += 1;
                self.samples_ms.push(took.as_secs_f64() * 1000.0);
            }
            Err(e) => {
                self.errors += 1;
                self.first_error.get_or_insert(e);
            }
        }
    }

    /// Adds `other`'s calls to these.
    fn merge(&mut self, other: CallStats) {
        self.ok += other.ok;
        self.errors += other.errors;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
        self.samples_ms.extend(other.samples_ms);
        self.finish();
    }

    fn finish(&mut self) {
        self.samples_ms.sort_by(f64::total_cmp);
        let q = |p: f64| -> f64 {
            let s = &self.samples_ms;
            if s.is_empty() {
                return 0.0;
            }
            s[((s.len() - 1) as f64 * p).round() as usize]
        };
        self.p50_ms = q(0.5);
        self.p99_ms = q(0.99);
        self.max_ms = self.samples_ms.last().copied().unwrap_or(0.0);
    }
}

/// One phase: how long its slowest task took, and its calls by kind.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct PhaseReport {
    /// `register`, `exchange`, `barrier`, `steady` or `shutdown`.
    pub phase: String,
    /// From the phase's start to its slowest task's end, s.
    pub seconds: f64,
    /// Calls by kind (the background heartbeats and long polls included).
    pub calls: BTreeMap<String, CallStats>,
}

impl PhaseReport {
    /// Failed calls of every kind.
    pub fn errors(&self) -> u64 {
        self.calls.values().map(|c| c.errors).sum()
    }

    /// The first failure, if any.
    pub fn first_error(&self) -> Option<String> {
        self.calls
            .iter()
            .find_map(|(k, c)| c.first_error.as_ref().map(|e| format!("{k}: {e}")))
    }
}

/// Calls recorded since the current phase began (background tasks record
/// into it too).
#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<BTreeMap<String, CallStats>>>);

impl Recorder {
    fn record(&self, kind: &str, took: Duration, r: Result<(), String>) {
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        m.entry(kind.to_string()).or_default().record(took, r);
    }

    fn take(&self) -> BTreeMap<String, CallStats> {
        let mut m = std::mem::take(&mut *self.0.lock().unwrap_or_else(|p| p.into_inner()));
        for c in m.values_mut() {
            c.finish();
        }
        m
    }
}

/// One simulated task.
struct Task {
    /// Its place among every job's tasks.
    index: usize,
    /// Its job (index into the config's jobs).
    job: usize,
    /// Its task id in the job.
    id: usize,
    client: Client,
    incarnation: u64,
}

/// A simulated job, or fleet of jobs.
pub struct Sim {
    cfg: SimConfig,
    tasks: Vec<Task>,
    /// Each job's service incarnation, learnt at registration.
    service_incarnations: Vec<u64>,
    recorder: Recorder,
    /// Heartbeat loops.
    heartbeats: Vec<JoinHandle<()>>,
    /// PollForError calls, answered at shutdown.
    polls: Vec<JoinHandle<()>>,
    /// The preemption gets, cancelled at shutdown.
    preemption: Vec<JoinHandle<()>>,
}

fn status_text(s: &tonic::Status) -> String {
    format!("{:?}: {}", s.code(), s.message())
}

/// `f` within `to`, its error as text.
async fn timed<T>(
    to: Duration,
    f: impl std::future::Future<Output = Result<T, tonic::Status>>,
) -> Result<T, String> {
    match tokio::time::timeout(to, f).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(s)) => Err(status_text(&s)),
        Err(_) => Err(format!("no answer within {to:?}")),
    }
}

impl Sim {
    /// Opens the connections (not timed): K consecutive tasks of a job
    /// share one, dialing the job's addresses in turn.
    pub async fn connect(cfg: SimConfig) -> anyhow::Result<Sim> {
        let per = cfg.tasks_per_conn.max(1);
        let mut tasks = Vec::new();
        for (j, job) in cfg.jobs.iter().enumerate() {
            anyhow::ensure!(!job.addrs.is_empty(), "job {j}: no address to dial");
            let mut shared: Option<Channel> = None;
            for t in 0..job.tasks {
                if t % per == 0 || shared.is_none() {
                    let addr = &job.addrs[(t / per) % job.addrs.len()];
                    let ch = Endpoint::from_shared(format!("http://{addr}"))?
                        .connect_timeout(Duration::from_secs(20))
                        .tcp_nodelay(true)
                        .connect()
                        .await
                        .map_err(|e| {
                            anyhow::anyhow!("job {j} task {t}: cannot connect to {addr}: {e}")
                        })?;
                    shared = Some(ch);
                }
                let client = CoordinationServiceClient::new(shared.clone().expect("a channel"))
                    .max_decoding_message_size(1 << 30)
                    .max_encoding_message_size(1 << 30);
                tasks.push(Task {
                    index: tasks.len(),
                    job: j,
                    id: t,
                    client,
                    incarnation: rand::random::<u64>() | 1,
                });
            }
        }
        let jobs = cfg.jobs.len();
        Ok(Sim {
            cfg,
            tasks,
            service_incarnations: vec![0; jobs],
            recorder: Recorder::default(),
            heartbeats: Vec::new(),
            polls: Vec::new(),
            preemption: Vec::new(),
        })
    }

    /// Tasks in all jobs.
    pub fn len(&self) -> usize {
        self.tasks.len()
    }

    /// Whether there is no task.
    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    /// Job `j`'s service incarnation (after [`Sim::register`]).
    pub fn service_incarnation(&self, j: usize) -> u64 {
        self.service_incarnations[j]
    }

    /// The incarnation of task `t` of job `j`.
    pub fn incarnation(&self, j: usize, t: usize) -> Option<u64> {
        self.tasks
            .iter()
            .find(|x| x.job == j && x.id == t)
            .map(|x| x.incarnation)
    }

    fn inc(&self, task: &Task) -> Option<Incarnations> {
        Some(Incarnations {
            task_id: task.id as i32,
            task_incarnation: task.incarnation,
            service_incarnation: self.service_incarnations[task.job],
        })
    }

    /// Runs `call(task)` for every task at once and waits for all; the
    /// phase's report.
    async fn phase<F, Fut>(&self, name: &str, call: F) -> PhaseReport
    where
        F: Fn(&Task) -> Fut,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let t0 = Instant::now();
        let joins: Vec<JoinHandle<()>> = self.tasks.iter().map(|t| tokio::spawn(call(t))).collect();
        for j in joins {
            let _ = j.await;
        }
        PhaseReport {
            phase: name.into(),
            seconds: t0.elapsed().as_secs_f64(),
            calls: self.recorder.take(),
        }
    }

    /// Phase 1: every task registers (held until all of its job have);
    /// then each starts its heartbeats and long polls.
    pub async fn register(&mut self) -> PhaseReport {
        self.register_gated(0, None).await
    }

    /// [`Sim::register`], the last `held` tasks calling only once `gate`
    /// says true (a test acts while the rest are registered and waiting).
    pub async fn register_gated(
        &mut self,
        held: usize,
        gate: Option<tokio::sync::watch::Receiver<bool>>,
    ) -> PhaseReport {
        let got: Arc<Mutex<Vec<(usize, u64)>>> = Arc::default();
        let first_held = self.tasks.len().saturating_sub(held);
        let mut report = self
            .phase("register", |task| {
                let gate = (task.index >= first_held).then(|| gate.clone()).flatten();
                let mut c = task.client.clone();
                let (rec, got, to, job) = (
                    self.recorder.clone(),
                    got.clone(),
                    self.cfg.call_timeout,
                    task.job,
                );
                let req = RegisterTaskRequest {
                    incarnation: task.incarnation,
                    source_task_id: task.id as i32,
                };
                async move {
                    if let Some(mut g) = gate {
                        let _ = g.wait_for(|open| *open).await;
                    }
                    let t0 = Instant::now();
                    let r = timed(to, c.register_task(req)).await.map(|resp| {
                        let si = resp.into_inner().service_incarnation;
                        got.lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .push((job, si));
                    });
                    rec.record("register", t0.elapsed(), r);
                }
            })
            .await;
        let got = got.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let mut mixed = false;
        for (job, si) in got {
            let known = &mut self.service_incarnations[job];
            mixed |= *known != 0 && *known != si;
            *known = si;
        }
        if mixed {
            let stats = report.calls.entry("register".into()).or_default();
            stats.errors += 1;
            stats.first_error =
                Some("a job's tasks were given different service incarnations".into());
        }
        self.start_background();
        report
    }

    fn start_background(&mut self) {
        let (every, to) = (self.cfg.heartbeat_interval, self.cfg.call_timeout);
        for task in &self.tasks {
            let (inc, id, incarnation) = (self.inc(task), task.id as i32, task.incarnation);
            // Heartbeats: the first an interval after registration.
            let (mut c, rec) = (task.client.clone(), self.recorder.clone());
            self.heartbeats.push(tokio::spawn(async move {
                let start = tokio::time::Instant::now() + every;
                let mut tick = tokio::time::interval_at(start, every);
                loop {
                    tick.tick().await;
                    let req = HeartbeatRequest {
                        incarnations: inc,
                        incarnation,
                        source_task_id: id,
                    };
                    let t0 = Instant::now();
                    let r = timed(to, c.heartbeat(req)).await.map(|_| ());
                    rec.record("heartbeat", t0.elapsed(), r);
                }
            }));
            // PollForError: never OK; CANCELLED at shutdown is the clean end.
            let (mut c, rec) = (task.client.clone(), self.recorder.clone());
            self.polls.push(tokio::spawn(async move {
                let req = PollForErrorRequest {
                    incarnations: inc,
                    source_task_id: id,
                };
                let t0 = Instant::now();
                let r = match c.poll_for_error(req).await {
                    Err(s) if s.code() == Code::Cancelled => Ok(()),
                    Err(s) => Err(status_text(&s)),
                    Ok(_) => Err("PollForError answered OK".into()),
                };
                rec.record("poll_for_error", t0.elapsed(), r);
            }));
            // The preemption notice get: pending until cancelled.
            let (mut c, rec) = (task.client.clone(), self.recorder.clone());
            self.preemption.push(tokio::spawn(async move {
                let req = GetKeyValueRequest {
                    incarnations: inc,
                    key: PREEMPTION_KEY.into(),
                };
                let t0 = Instant::now();
                let r = match c.get_key_value(req).await {
                    Ok(_) => Err("a preemption notice arrived".into()),
                    Err(s) => Err(status_text(&s)),
                };
                rec.record("preemption_get", t0.elapsed(), r);
            }));
        }
    }

    /// Phase 2: the topology exchange, in every job.
    pub async fn exchange(&self) -> PhaseReport {
        self.phase("exchange", |task| {
            let c = task.client.clone();
            let (rec, to, inc) = (self.recorder.clone(), self.cfg.call_timeout, self.inc(task));
            let (t, n) = (task.id, self.cfg.jobs[task.job].tasks);
            async move {
                let set = |key: String, value: Vec<u8>| {
                    let mut c = c.clone();
                    async move {
                        let req = InsertKeyValueRequest {
                            incarnations: inc,
                            kv: Some(KeyValueEntry {
                                key,
                                value: value.into(),
                            }),
                            allow_overwrite: false,
                        };
                        timed(to, c.insert_key_value(req)).await.map(|_| ())
                    }
                };
                let get = |key: String| {
                    let mut c = c.clone();
                    async move {
                        let req = GetKeyValueRequest {
                            incarnations: inc,
                            key,
                        };
                        timed(to, c.get_key_value(req)).await.map(|_| ())
                    }
                };
                let t0 = Instant::now();
                let local = format!("local topology of task {t}").into_bytes();
                let r = set(local_key(t), local).await;
                rec.record("kv_set", t0.elapsed(), r);
                if t == 0 {
                    let readers = (0..EXCHANGE_READERS.min(n)).map(|r| {
                        let (get, rec) = (&get, &rec);
                        async move {
                            for i in (r..n).step_by(EXCHANGE_READERS) {
                                let t0 = Instant::now();
                                let r = get(local_key(i)).await;
                                rec.record("kv_get", t0.elapsed(), r);
                            }
                        }
                    });
                    futures_util::future::join_all(readers).await;
                    let t0 = Instant::now();
                    let global = format!("global topology of {n} tasks").into_bytes();
                    let r = set(GLOBAL_KEY.into(), global).await;
                    rec.record("kv_set", t0.elapsed(), r);
                } else {
                    let t0 = Instant::now();
                    let r = get(GLOBAL_KEY.into()).await;
                    rec.record("kv_get_global", t0.elapsed(), r);
                }
            }
        })
        .await
    }

    /// Phase 3: a barrier of every task, in every job.
    pub async fn barrier(&self, id: &str) -> PhaseReport {
        self.phase("barrier", |task| {
            let mut c = task.client.clone();
            let (rec, to) = (self.recorder.clone(), self.cfg.call_timeout);
            let req = BarrierRequest {
                incarnations: self.inc(task),
                barrier_id: id.into(),
                barrier_timeout_in_ms: to.as_millis() as i64,
                task_ids: Vec::new(),
                source_task_id: task.id as i32,
                counter: 0,
            };
            async move {
                let t0 = Instant::now();
                let r = timed(to, c.barrier(req)).await.map(|_| ());
                rec.record("barrier", t0.elapsed(), r);
            }
        })
        .await
    }

    /// The steady phase: `length` of heartbeats and waiting long polls.
    pub async fn steady(&self, length: Duration) -> PhaseReport {
        let t0 = Instant::now();
        tokio::time::sleep(length).await;
        PhaseReport {
            phase: "steady".into(),
            seconds: t0.elapsed().as_secs_f64(),
            calls: self.recorder.take(),
        }
    }

    /// Phase 4: shutdown. The heartbeats stop, the preemption gets are
    /// cancelled, every task calls ShutdownTask (the shutdown barrier);
    /// the phase also waits for every PollForError to end.
    pub async fn shutdown(&mut self) -> PhaseReport {
        for h in self.heartbeats.drain(..).chain(self.preemption.drain(..)) {
            h.abort();
        }
        let polls = std::mem::take(&mut self.polls);
        let mut report = self
            .phase("shutdown", |task| {
                let mut c = task.client.clone();
                let (rec, to) = (self.recorder.clone(), self.cfg.call_timeout);
                let req = ShutdownTaskRequest {
                    incarnations: self.inc(task),
                    source_task_id: task.id as i32,
                };
                async move {
                    let t0 = Instant::now();
                    let r = timed(to, c.shutdown_task(req)).await.map(|_| ());
                    rec.record("shutdown", t0.elapsed(), r);
                }
            })
            .await;
        let to = self.cfg.call_timeout;
        for p in polls {
            if tokio::time::timeout(to, p).await.is_err() {
                let e = Err("PollForError did not end at shutdown".into());
                self.recorder.record("poll_for_error", to, e);
            }
        }
        for (k, c) in self.recorder.take() {
            report.calls.entry(k).or_default().merge(c);
        }
        report
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        let all = self
            .heartbeats
            .drain(..)
            .chain(self.polls.drain(..))
            .chain(self.preemption.drain(..));
        for h in all {
            h.abort();
        }
    }
}
