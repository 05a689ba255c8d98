//! The fault suite's clients and checks: concurrent KV writers and readers,
//! increments and barrier participants talk to random nodes (moving on when
//! one fails, retrying writes with their exactly-once origin) and record
//! histories; the checks run on those histories after the faults.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use journal::pb::{
    coordination::{KvDelete, KvIncrement, KvInsert},
    update::Command as Cmd,
    Origin,
};
use journal::Update;
use prost::Message;
use proto::coordstore::node_client::NodeClient;
use proto::coordstore::{KvGetRequest, ProposeRequest};
use proto::xla::coordination_service_client::CoordinationServiceClient;
use rand::Rng;
use todc_utils::linearizability::history::{Action, History};
use todc_utils::linearizability::WGLChecker;
use todc_utils::specifications::Specification;
use tonic::transport::{Channel, Endpoint};

/// How long one operation keeps retrying through faults.
pub const OP_RETRY: Duration = Duration::from_secs(90);

fn channel(addr: &str) -> Channel {
    Endpoint::from_shared(format!("http://{addr}"))
        .expect("endpoint")
        .connect_timeout(Duration::from_millis(300))
        .timeout(Duration::from_secs(20))
        .connect_lazy()
}

/// A client of every node: calls go to a random node and move on when it
/// fails.
#[derive(Clone)]
pub struct AnyNode {
    addrs: Vec<String>,
    channels: Vec<Channel>,
}

impl AnyNode {
    /// Clients of `addrs`.
    pub fn new(addrs: &[String]) -> AnyNode {
        AnyNode {
            addrs: addrs.to_vec(),
            channels: addrs.iter().map(|a| channel(a)).collect(),
        }
    }

    fn pick(&self) -> usize {
        rand::rng().random_range(0..self.channels.len())
    }

    /// A Node-API client of a random node.
    pub fn node(&self) -> NodeClient<Channel> {
        NodeClient::new(self.channels[self.pick()].clone())
    }

    /// An xla-dialect client of a random node.
    pub fn xla(&self) -> CoordinationServiceClient<Channel> {
        CoordinationServiceClient::new(self.channels[self.pick()].clone())
    }

    /// The node addresses.
    pub fn addrs(&self) -> &[String] {
        &self.addrs
    }
}

/// One client's exactly-once origins.
pub struct Origins {
    client_id: u64,
    seq: u64,
}

impl Default for Origins {
    fn default() -> Self {
        Origins {
            client_id: rand::random::<u64>() >> 1,
            seq: 0,
        }
    }
}

impl Origins {
    /// The next origin (one call at a time: every earlier one is done).
    pub fn take(&mut self) -> Origin {
        self.seq += 1;
        Origin {
            client_id: self.client_id,
            seq: self.seq,
            done_below: self.seq,
        }
    }

    /// As the `x-coordstore-origin` header value.
    pub fn header(o: &Origin) -> String {
        proto::origin::WireOrigin {
            client_id: o.client_id,
            seq: o.seq,
            done_below: o.done_below,
        }
        .header_value()
    }
}

/// Proposes `cmd` with origin `origin` at random nodes until it is applied
/// (or `OP_RETRY` passes: `None`, outcome unknown).
pub async fn propose(nodes: &AnyNode, origin: Origin, cmd: Cmd) -> Option<journal::Outcome> {
    propose_at(nodes, origin, cmd).await.map(|(o, _)| o)
}

/// [`propose`], also returning the log index the update was applied at.
pub async fn propose_at(
    nodes: &AnyNode,
    origin: Origin,
    cmd: Cmd,
) -> Option<(journal::Outcome, u64)> {
    let u = Update {
        origin: Some(origin),
        command: Some(cmd),
        ..Default::default()
    };
    let bytes = u.encode_to_vec();
    let deadline = Instant::now() + OP_RETRY;
    while Instant::now() < deadline {
        let r = nodes
            .node()
            .propose(ProposeRequest {
                update: bytes.clone().into(),
            })
            .await;
        if let Ok(reply) = r {
            let reply = reply.into_inner();
            let out = journal::Outcome::decode(reply.outcome.as_ref()).ok()?;
            return Some((out, reply.log_index));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}

/// A linearizable read of `key` at a random node (retried until answered).
pub async fn read(nodes: &AnyNode, key: &str) -> Option<Option<Vec<u8>>> {
    read_diag(nodes, key).await.map(|(v, _)| v)
}

/// [`read`], also returning who served it: "node N term T applied I".
pub async fn read_diag(nodes: &AnyNode, key: &str) -> Option<(Option<Vec<u8>>, String)> {
    let deadline = Instant::now() + OP_RETRY;
    while Instant::now() < deadline {
        if let Ok(r) = nodes.node().kv_get(KvGetRequest { key: key.into() }).await {
            let r = r.into_inner();
            let diag = format!(
                "node {} term {} applied {}",
                r.served_by, r.term, r.applied_index
            );
            return Some((r.found.then(|| r.value.to_vec()), diag));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}

/// A blocking get (tensorflow dialect: no incarnation needed) at random
/// nodes, re-issued after transport failures.
pub async fn blocking_get(nodes: &AnyNode, key: &str) -> Option<Vec<u8>> {
    let deadline = Instant::now() + OP_RETRY;
    while Instant::now() < deadline {
        let ch = nodes.channels[nodes.pick()].clone();
        let mut c = proto::tf::coordination_service_client::CoordinationServiceClient::new(ch);
        let req = proto::tf::GetKeyValueRequest { key: key.into() };
        if let Ok(r) = c.get_key_value(req).await {
            return r.into_inner().kv.map(|kv| kv.value.to_vec());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

// ------------------------------------------------------ linearizability ----

/// A key as a register: `None` while absent.
pub struct KeySpec;

/// An operation on one key.
#[derive(Clone, Debug)]
pub enum KeyOp {
    /// Put a value.
    Put(u32),
    /// Delete the key.
    Delete,
    /// A read that saw this value (None = absent).
    Get(Option<u32>),
}

impl Specification for KeySpec {
    type State = Option<u32>;
    type Operation = KeyOp;

    fn init() -> Self::State {
        None
    }

    fn apply(op: &KeyOp, state: &Option<u32>) -> (bool, Option<u32>) {
        match op {
            KeyOp::Put(v) => (true, Some(*v)),
            KeyOp::Delete => (true, None),
            KeyOp::Get(seen) => (seen == state, *state),
        }
    }
}

/// One key's history: (process, call or response) in real-time order.
type KeyHistory = Vec<(usize, Action<KeyOp>)>;

/// Per-key histories: (process, call/response) in real-time order.
#[derive(Default, Clone)]
pub struct Recorder {
    inner: Arc<Mutex<BTreeMap<String, KeyHistory>>>,
    diag: Arc<Mutex<BTreeMap<String, Vec<String>>>>,
}

impl Recorder {
    fn note(&self, key: &str, line: String) {
        self.diag
            .lock()
            .unwrap()
            .entry(key.to_string())
            .or_default()
            .push(line);
    }

    /// Appends one call or response of `process` to `key`'s history.
    pub fn push(&self, key: &str, process: usize, action: Action<KeyOp>) {
        self.inner
            .lock()
            .unwrap()
            .entry(key.to_string())
            .or_default()
            .push((process, action));
    }

    /// Operations recorded per key.
    pub fn sizes(&self) -> BTreeMap<String, usize> {
        self.inner
            .lock()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), v.len() / 2))
            .collect()
    }

    /// Checks every key's history with the WGL checker; returns the keys
    /// whose history is not linearizable.
    pub fn non_linearizable_keys(&self) -> Vec<String> {
        let map = self.inner.lock().unwrap().clone();
        map.into_iter()
            .filter(|(key, actions)| {
                let done = complete(actions);
                let ok =
                    WGLChecker::<KeySpec>::is_linearizable(History::from_actions(done.clone()));
                if !ok {
                    if let Some(dir) = std::env::var_os("COORDSTORE_HISTORY_DIR") {
                        let path = std::path::Path::new(&dir).join(key.replace('/', "_"));
                        let text: Vec<String> =
                            done.iter().map(|(p, a)| format!("{p} {a:?}")).collect();
                        let _ = std::fs::write(&path, text.join("\n"));
                        let diag = self
                            .diag
                            .lock()
                            .unwrap()
                            .get(key)
                            .cloned()
                            .unwrap_or_default();
                        let _ = std::fs::write(path.with_extension("diag"), diag.join("\n"));
                    }
                }
                !ok
            })
            .map(|(k, _)| k)
            .collect()
    }
}

/// Closes calls that never returned: a put with an unknown outcome may have
/// taken effect at any time after its call, so it returns at the end of the
/// history; an unanswered get constrains nothing and is dropped.
fn complete(actions: &[(usize, Action<KeyOp>)]) -> Vec<(usize, Action<KeyOp>)> {
    let mut open: BTreeMap<usize, usize> = BTreeMap::new();
    for (i, (p, a)) in actions.iter().enumerate() {
        match a {
            Action::Call(_) => {
                open.insert(*p, i);
            }
            Action::Response(_) => {
                open.remove(p);
            }
        }
    }
    let mut out = Vec::with_capacity(actions.len() + open.len());
    let mut pending_puts = Vec::new();
    for (i, (p, a)) in actions.iter().enumerate() {
        if open.get(p) == Some(&i) {
            match a {
                Action::Call(KeyOp::Put(v)) => {
                    out.push((*p, Action::Call(KeyOp::Put(*v))));
                    pending_puts.push((*p, Action::Response(KeyOp::Put(*v))));
                }
                Action::Call(KeyOp::Delete) => {
                    out.push((*p, Action::Call(KeyOp::Delete)));
                    pending_puts.push((*p, Action::Response(KeyOp::Delete)));
                }
                _ => {}
            }
            continue;
        }
        out.push((*p, a.clone()));
    }
    out.extend(pending_puts);
    out
}

/// Everything the workload observed, for the checks.
#[derive(Default)]
pub struct Observed {
    /// Writes acknowledged: key → last acknowledged value per writer.
    pub acked_puts: Mutex<Vec<(String, u32)>>,
    /// Increments acknowledged.
    pub acked_increments: Mutex<u64>,
    /// Increments whose outcome stayed unknown.
    pub unknown_increments: Mutex<u64>,
    /// Barrier outcomes: (barrier id, counter) → per task result.
    pub barriers: Mutex<BTreeMap<(String, i64), BTreeMap<i32, String>>>,
    /// Service incarnations seen by status polls.
    pub incarnations: Mutex<BTreeSet<u64>>,
    /// Blocking gets that completed.
    pub blocking_gets: Mutex<u64>,
    /// Blocking gets that returned something else than what was set.
    pub blocking_mismatches: Mutex<Vec<String>>,
}

/// What the workload has had answered so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Progress {
    /// Keys with at least one operation answered.
    pub keys_answered: usize,
    /// Key operations answered (puts, deletes, reads).
    pub key_ops: usize,
    /// Increments acknowledged.
    pub increments: u64,
    /// Blocking gets completed.
    pub blocking_gets: u64,
}

/// The running workload.
pub struct Workload {
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    /// Per-key histories.
    pub recorder: Recorder,
    /// Other observations.
    pub observed: Arc<Observed>,
}

/// Starts `keys` keys with 3 processes each (put / get at random), one
/// incrementer, and `barrier_tasks` barrier participants (the cluster must be
/// started with `--tasks barrier_tasks`).
pub fn start(nodes: &AnyNode, keys: usize, barrier_tasks: usize) -> Workload {
    let stop = Arc::new(AtomicBool::new(false));
    let recorder = Recorder::default();
    let observed = Arc::new(Observed::default());
    let mut tasks = Vec::new();
    for k in 0..keys {
        for p in 0..3 {
            tasks.push(tokio::spawn(key_process(
                nodes.clone(),
                format!("lin/k{k}"),
                p,
                stop.clone(),
                recorder.clone(),
                observed.clone(),
            )));
        }
    }
    tasks.push(tokio::spawn(incrementer(
        nodes.clone(),
        stop.clone(),
        observed.clone(),
    )));
    tasks.push(tokio::spawn(blocking_getter(
        nodes.clone(),
        stop.clone(),
        observed.clone(),
    )));
    tasks.push(tokio::spawn(status_poller(
        nodes.clone(),
        stop.clone(),
        observed.clone(),
    )));
    if barrier_tasks > 0 {
        tasks.extend(barrier_participants(
            nodes,
            barrier_tasks,
            stop.clone(),
            observed.clone(),
        ));
    }
    Workload {
        stop,
        tasks,
        recorder,
        observed,
    }
}

/// Process `p` of `key`: puts, deletes and reads at random, each recorded
/// in the key's history, until stopped, 300 operations (a bounded history:
/// WGL is exponential in the worst case), or an unknown outcome.
async fn key_process(
    nodes: AnyNode,
    key: String,
    p: usize,
    stop: Arc<AtomicBool>,
    rec: Recorder,
    obs: Arc<Observed>,
) {
    let mut origins = Origins::default();
    let mut next_value = (p as u32 + 1) * 1_000_000;
    let mut ops = 0;
    while !stop.load(Ordering::Relaxed) && ops < 300 {
        ops += 1;
        let dice = rand::rng().random_range(0..10u32);
        if dice < 5 {
            next_value += 1;
            let v = next_value;
            rec.push(&key, p, Action::Call(KeyOp::Put(v)));
            let cmd = Cmd::from(KvInsert {
                key: key.clone(),
                value: v.to_string().into_bytes().into(),
                allow_overwrite: true,
            });
            match propose_at(&nodes, origins.take(), cmd).await {
                Some((out, index)) if out.error.is_none() => {
                    rec.push(&key, p, Action::Response(KeyOp::Put(v)));
                    rec.note(&key, format!("{p} put {v} applied at {index}"));
                    obs.acked_puts.lock().unwrap().push((key.clone(), v));
                }
                // Unknown outcome: the call stays open (the process stops
                // issuing operations).
                _ => return,
            }
        } else if dice == 5 {
            rec.push(&key, p, Action::Call(KeyOp::Delete));
            let cmd = Cmd::from(KvDelete { key: key.clone() });
            match propose_at(&nodes, origins.take(), cmd).await {
                Some((out, index)) if out.error.is_none() => {
                    rec.push(&key, p, Action::Response(KeyOp::Delete));
                    rec.note(&key, format!("{p} delete applied at {index}"));
                }
                _ => return,
            }
        } else {
            rec.push(&key, p, Action::Call(KeyOp::Get(None)));
            match read_diag(&nodes, &key).await {
                Some((seen, diag)) => {
                    let v = seen.and_then(|b| String::from_utf8(b).ok()?.parse().ok());
                    rec.push(&key, p, Action::Response(KeyOp::Get(v)));
                    rec.note(&key, format!("{p} get {v:?} by {diag}"));
                }
                // An unanswered read constrains nothing.
                None => return,
            }
        }
        let pause = rand::rng().random_range(0..15u64);
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
}

/// Increments, each retried with its origin until applied.
async fn incrementer(nodes: AnyNode, stop: Arc<AtomicBool>, obs: Arc<Observed>) {
    let mut origins = Origins::default();
    while !stop.load(Ordering::Relaxed) {
        let cmd = Cmd::from(KvIncrement {
            key: "counter".into(),
            increment: 1,
        });
        match propose(&nodes, origins.take(), cmd).await {
            Some(out) if out.error.is_none() => *obs.acked_increments.lock().unwrap() += 1,
            _ => {
                *obs.unknown_increments.lock().unwrap() += 1;
                return;
            }
        }
    }
}

/// Blocking gets: a getter parks on a key before its setter sets it.
async fn blocking_getter(nodes: AnyNode, stop: Arc<AtomicBool>, obs: Arc<Observed>) {
    let mut origins = Origins::default();
    let mut i = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let key = format!("blk/{i}");
        let getter = {
            let (nodes, key) = (nodes.clone(), key.clone());
            tokio::spawn(async move { blocking_get(&nodes, &key).await })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        let cmd = Cmd::from(KvInsert {
            key: key.clone(),
            value: i.to_string().into_bytes().into(),
            allow_overwrite: false,
        });
        if propose(&nodes, origins.take(), cmd).await.is_none() {
            getter.abort();
            return;
        }
        match tokio::time::timeout(OP_RETRY, getter).await {
            Ok(Ok(Some(v))) if v == i.to_string().into_bytes() => {
                *obs.blocking_gets.lock().unwrap() += 1;
            }
            Ok(Ok(Some(v))) => obs.blocking_mismatches.lock().unwrap().push(format!(
                "blocking get of {key} returned {:?}",
                String::from_utf8_lossy(&v)
            )),
            _ => obs
                .blocking_mismatches
                .lock()
                .unwrap()
                .push(format!("blocking get of {key} never returned")),
        }
        i += 1;
    }
}

/// Status polls: the service incarnation.
async fn status_poller(nodes: AnyNode, stop: Arc<AtomicBool>, obs: Arc<Observed>) {
    while !stop.load(Ordering::Relaxed) {
        for addr in nodes.addrs() {
            if let Some(s) = crate::try_status(addr).await {
                if s.service_incarnation != 0 {
                    obs.incarnations
                        .lock()
                        .unwrap()
                        .insert(s.service_incarnation);
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn barrier_participants(
    nodes: &AnyNode,
    n: usize,
    stop: Arc<AtomicBool>,
    obs: Arc<Observed>,
) -> Vec<tokio::task::JoinHandle<()>> {
    use proto::xla::{BarrierRequest, Incarnations, RegisterTaskRequest};
    let registered = Arc::new(tokio::sync::Barrier::new(n));
    (0..n as i32)
        .map(|t| {
            let (nodes, stop, obs, registered) =
                (nodes.clone(), stop.clone(), obs.clone(), registered.clone());
            tokio::spawn(async move {
                let mut origins = Origins::default();
                // Register (the registration barrier needs everyone).
                let si = loop {
                    let o = origins.take();
                    let mut req = tonic::Request::new(RegisterTaskRequest {
                        incarnation: 500 + t as u64,
                        source_task_id: t,
                    });
                    req.metadata_mut()
                        .insert(proto::ORIGIN_HEADER, Origins::header(&o).parse().unwrap());
                    match nodes.xla().register_task(req).await {
                        Ok(r) => break r.into_inner().service_incarnation,
                        Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                    }
                };
                registered.wait().await;
                let mut counter = 0i64;
                while !stop.load(Ordering::Relaxed) {
                    let o = origins.take();
                    let msg = BarrierRequest {
                        incarnations: Some(Incarnations {
                            task_id: t,
                            task_incarnation: 0,
                            service_incarnation: si,
                        }),
                        barrier_id: "fault-barrier".into(),
                        barrier_timeout_in_ms: 15_000,
                        task_ids: vec![],
                        source_task_id: t,
                        counter,
                    };
                    // Re-issued with the same origin until a node answers.
                    let deadline = Instant::now() + OP_RETRY;
                    let result = loop {
                        let mut req = tonic::Request::new(msg.clone());
                        req.metadata_mut()
                            .insert(proto::ORIGIN_HEADER, Origins::header(&o).parse().unwrap());
                        match nodes.xla().barrier(req).await {
                            Ok(r) => break Some(format!("OK counter {}", r.into_inner().counter)),
                            Err(s) if s.details().is_empty() && Instant::now() < deadline => {
                                tokio::time::sleep(Duration::from_millis(50)).await;
                            }
                            Err(s) if s.details().is_empty() => break None,
                            Err(s) => break Some(format!("{:?}: {}", s.code(), s.message())),
                        }
                    };
                    let Some(result) = result else { return };
                    obs.barriers
                        .lock()
                        .unwrap()
                        .entry(("fault-barrier".into(), counter))
                        .or_default()
                        .insert(t, result);
                    counter += 1;
                }
            })
        })
        .collect()
}

impl Workload {
    /// What has been answered so far.
    pub fn progress(&self) -> Progress {
        let answered: Vec<usize> = self
            .recorder
            .inner
            .lock()
            .unwrap()
            .values()
            .map(|h| {
                h.iter()
                    .filter(|(_, a)| matches!(a, Action::Response(_)))
                    .count()
            })
            .collect();
        Progress {
            keys_answered: answered.iter().filter(|&&n| n > 0).count(),
            key_ops: answered.iter().sum(),
            increments: *self.observed.acked_increments.lock().unwrap(),
            blocking_gets: *self.observed.blocking_gets.lock().unwrap(),
        }
    }

    /// Stops the clients: each finishes its operation in progress, or is
    /// abandoned after a grace period (its open call is then completed as an
    /// unknown outcome by the checker).
    pub async fn stop(self) -> (Recorder, Arc<Observed>) {
        self.stop.store(true, Ordering::Relaxed);
        let grace = Instant::now() + Duration::from_secs(20);
        for t in self.tasks {
            let left = grace.saturating_duration_since(Instant::now());
            if tokio::time::timeout(left, &mut { t }).await.is_err() {
                // (dropped: the task is detached and stops at its next await)
            }
        }
        (self.recorder, self.observed)
    }
}

/// Runs every check; returns the violations found (empty = all good).
pub async fn check(nodes: &AnyNode, recorder: &Recorder, observed: &Observed) -> Vec<String> {
    let mut problems = Vec::new();
    // Acknowledged writes: a final read of every key joins its history, so
    // the linearizability check below also proves no acknowledged write (or
    // delete) was lost.
    let acked = observed.acked_puts.lock().unwrap().clone();
    let keys: BTreeSet<String> = acked.iter().map(|(k, _)| k.clone()).collect();
    for key in &keys {
        recorder.push(key, 99, Action::Call(KeyOp::Get(None)));
        match read(nodes, key).await {
            Some(seen) => {
                let v = seen.and_then(|b| String::from_utf8(b).ok()?.parse().ok());
                recorder.push(key, 99, Action::Response(KeyOp::Get(v)));
            }
            None => problems.push(format!("final read of {key} failed")),
        }
    }
    // Blocking gets returned exactly the value that was set.
    for m in observed.blocking_mismatches.lock().unwrap().iter() {
        problems.push(m.clone());
    }
    if *observed.blocking_gets.lock().unwrap() == 0 {
        problems.push("no blocking get completed".into());
    }
    let bad = recorder.non_linearizable_keys();
    if !bad.is_empty() {
        problems.push(format!("non-linearizable histories for keys {bad:?}"));
    }
    // Increments: never applied twice (nor lost).
    let acked_inc = *observed.acked_increments.lock().unwrap();
    let unknown_inc = *observed.unknown_increments.lock().unwrap();
    let value: u64 = read(nodes, "counter")
        .await
        .flatten()
        .and_then(|b| String::from_utf8(b).ok()?.parse().ok())
        .unwrap_or(0);
    if value < acked_inc || value > acked_inc + unknown_inc {
        problems.push(format!(
            "counter is {value} after {acked_inc} acknowledged (+{unknown_inc} unknown) increments"
        ));
    }
    // Barriers: every participant saw the same outcome of each instance.
    for ((id, counter), results) in observed.barriers.lock().unwrap().iter() {
        let distinct: BTreeSet<&String> = results.values().collect();
        if distinct.len() > 1 {
            problems.push(format!(
                "barrier {id}::{counter} outcomes differ: {results:?}"
            ));
        }
    }
    // The service incarnation never changed.
    let incs = observed.incarnations.lock().unwrap().clone();
    if incs.len() > 1 {
        problems.push(format!("the service incarnation changed: {incs:?}"));
    }
    problems
}
