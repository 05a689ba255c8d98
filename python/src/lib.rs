//! `coordstore._native`: the Rust agent, preemption sync and the durable
//! closure queue for Python. Blocking calls release the GIL and run on one
//! shared tokio runtime; a pending signal (Ctrl-C) interrupts the wait.
//! Errors are raised as the classes of `coordstore.errors`, by gRPC code.
//! The Python API users see is the `coordstore` package around this module.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{mpsc, Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime};

use agent::closures::{self as cl, ClosureError, QueueConfig};
use agent::endpoints::Endpoints;
use agent::preemption::{self, ManualNotifier, PreemptionNotifier, SigtermNotifier};
use agent::relay::RelayConfig;
use agent::{AgentConfig, CoordinatedTask};
use bytes::Bytes;
use proto::coordstore::node_client::NodeClient;
use proto::coordstore::{
    CreateNamespaceRequest, NamespaceInfo, NamespaceRequest, NamespaceSettings,
};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use tonic::Status;

mod rendezvous;

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("coordstore")
            .enable_all()
            .build()
            .expect("the coordstore runtime")
    })
}

/// Runs `fut` to its end with the GIL released; a pending Python signal
/// (Ctrl-C) ends the wait with its exception.
fn wait<T: Send, F: Future<Output = T> + Send>(py: Python<'_>, fut: F) -> PyResult<T> {
    py.detach(|| {
        runtime().block_on(async {
            tokio::pin!(fut);
            loop {
                tokio::select! {
                    v = &mut fut => return Ok(v),
                    _ = tokio::time::sleep(Duration::from_millis(100)) => {
                        Python::attach(|py| py.check_signals())?;
                    }
                }
            }
        })
    })
}

/// A `coordstore.errors` instance made by `maker(args)`.
fn py_error<'py>(py: Python<'py>, maker: &str, args: impl pyo3::call::PyCallArgs<'py>) -> PyErr {
    let made = py
        .import("coordstore.errors")
        .and_then(|m| m.getattr(maker))
        .and_then(|f| f.call1(args));
    match made {
        Ok(e) => PyErr::from_value(e),
        Err(e) => e,
    }
}

fn status_args(s: &Status) -> (i32, String) {
    (s.code() as i32, s.message().to_string())
}

/// The exception of a failed call: its gRPC code's class.
fn err(s: Status) -> PyErr {
    Python::attach(|py| py_error(py, "_from_status", status_args(&s)))
}

fn closure_err(e: cl::Error) -> PyErr {
    Python::attach(|py| match e {
        cl::Error::Status(s) => py_error(py, "_from_status", status_args(&s)),
        cl::Error::Cancelled(id) => py_error(py, "_cancelled", (id,)),
        cl::Error::Raised(e) => py_error(
            py,
            "_closure_failed",
            (
                e.code,
                e.message,
                PyBytes::new(py, &e.payload).unbind(),
                e.closure_id,
            ),
        ),
    })
}

fn bytes(py: Python<'_>, b: &[u8]) -> Py<PyBytes> {
    PyBytes::new(py, b).unbind()
}

fn timeout(s: Option<f64>) -> PyResult<Option<Duration>> {
    match s {
        None => Ok(None),
        Some(s) if s.is_finite() && s >= 0.0 => Ok(Some(Duration::from_secs_f64(s))),
        Some(s) => Err(pyo3::exceptions::PyValueError::new_err(format!(
            "a timeout is a non-negative number of seconds, not {s}"
        ))),
    }
}

/// The client TLS of `ca` (the servers' CA) and the client certificate
/// `cert` with its key `key` (PEM files), as the Rust agent and `coordstore
/// ctl --tls-ca/--tls-cert/--tls-key` take them; None (plaintext) when none
/// is given. A certificate needs its key and the CA.
fn tls(
    ca: Option<PathBuf>,
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
) -> PyResult<Option<tonic::transport::ClientTlsConfig>> {
    let bad = |m: &str| pyo3::exceptions::PyValueError::new_err(m.to_string());
    let cert_key = match (cert, key) {
        (Some(c), Some(k)) => Some((c, k)),
        (None, None) => None,
        _ => return Err(bad("tls_cert and tls_key go together")),
    };
    let Some(ca) = ca else {
        return match cert_key {
            Some(_) => Err(bad("a client certificate needs tls_ca (the servers' CA)")),
            None => Ok(None),
        };
    };
    let cert_key = cert_key.as_ref().map(|(c, k)| (c.as_path(), k.as_path()));
    proto::tls::client(&ca, cert_key)
        .map(Some)
        .map_err(pyo3::exceptions::PyValueError::new_err)
}

/// The coordination agent of one task (`docs/protocols.md`,
/// CoordinationServiceAgent API).
#[pyclass(module = "coordstore._native", frozen)]
struct Agent {
    inner: agent::Agent,
}

#[pymethods]
impl Agent {
    #[new]
    #[pyo3(signature = (endpoints, job_name, task_id, *, heartbeat_interval_s = 10.0, retry_for_s = 300.0, on_error = None, namespace = None, tls_ca = None, tls_cert = None, tls_key = None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        endpoints: Vec<String>,
        job_name: &str,
        task_id: i32,
        heartbeat_interval_s: f64,
        retry_for_s: f64,
        on_error: Option<Py<PyAny>>,
        namespace: Option<String>,
        tls_ca: Option<PathBuf>,
        tls_cert: Option<PathBuf>,
        tls_key: Option<PathBuf>,
    ) -> PyResult<Agent> {
        let _rt = runtime().enter();
        let mut cfg = AgentConfig::new(endpoints, job_name, task_id);
        cfg.namespace = namespace;
        cfg.tls = tls(tls_ca, tls_cert, tls_key)?;
        cfg.heartbeat_interval = timeout(Some(heartbeat_interval_s))?.unwrap_or_default();
        cfg.retry_for = timeout(Some(retry_for_s))?.unwrap_or_default();
        let on_error: agent::ErrorCallback = Arc::new(move |s: &Status| {
            let Some(cb) = &on_error else { return };
            Python::attach(|py| {
                let e = py_error(py, "_from_status", status_args(s));
                if let Err(raised) = cb.call1(py, (e.into_value(py),)) {
                    raised.print(py);
                }
            });
        });
        let inner = agent::Agent::new(cfg, on_error).map_err(err)?;
        Ok(Agent { inner })
    }

    /// "UNINITIALIZED", "DISCONNECTED", "CONNECTED" or "ERROR".
    #[getter]
    fn state(&self) -> String {
        format!("{:?}", self.inner.state()).to_uppercase()
    }

    fn connect(&self, py: Python<'_>) -> PyResult<()> {
        wait(py, self.inner.connect())?.map_err(err)
    }

    fn shutdown(&self, py: Python<'_>) -> PyResult<()> {
        wait(py, self.inner.shutdown())?.map_err(err)
    }

    fn reset(&self, py: Python<'_>) -> PyResult<()> {
        wait(py, self.inner.reset())?.map_err(err)
    }

    #[pyo3(signature = (code, message))]
    fn report_error(&self, py: Python<'_>, code: i32, message: String) -> PyResult<()> {
        let s = Status::new(tonic::Code::from_i32(code), message);
        wait(py, self.inner.report_error(s))?.map_err(err)
    }

    /// (state, incarnation, error code, error message) of a task.
    fn task_status(
        &self,
        py: Python<'_>,
        job_name: String,
        task_id: i32,
    ) -> PyResult<(String, u64, i32, String)> {
        let task = CoordinatedTask {
            job_name,
            task_id,
            ..Default::default()
        };
        let s = wait(py, self.inner.task_status(&task))?.map_err(err)?;
        Ok((s.state, s.incarnation, s.error_code, s.error_message))
    }

    #[pyo3(signature = (key, timeout_s = None))]
    fn get(&self, py: Python<'_>, key: &str, timeout_s: Option<f64>) -> PyResult<Py<PyBytes>> {
        let v = match timeout(timeout_s)? {
            None => wait(py, self.inner.get_key_value(key))?,
            Some(t) => wait(py, self.inner.get_key_value_timeout(key, t))?,
        }
        .map_err(err)?;
        Ok(bytes(py, &v))
    }

    fn try_get(&self, py: Python<'_>, key: &str) -> PyResult<Option<Py<PyBytes>>> {
        match wait(py, self.inner.try_get_key_value(key))? {
            Ok(v) => Ok(Some(bytes(py, &v))),
            Err(s) if s.code() == tonic::Code::NotFound => Ok(None),
            Err(s) => Err(err(s)),
        }
    }

    fn get_dir(&self, py: Python<'_>, key: &str) -> PyResult<Vec<(String, Py<PyBytes>)>> {
        let kvs = wait(py, self.inner.get_key_value_dir(key))?.map_err(err)?;
        Ok(kvs.into_iter().map(|(k, v)| (k, bytes(py, &v))).collect())
    }

    fn insert(&self, py: Python<'_>, key: &str, value: Vec<u8>) -> PyResult<()> {
        wait(py, self.inner.insert_key_value(key, value))?.map_err(err)
    }

    fn update(&self, py: Python<'_>, key: &str, value: Vec<u8>) -> PyResult<()> {
        wait(py, self.inner.update_key_value(key, value))?.map_err(err)
    }

    fn increment(&self, py: Python<'_>, key: &str, by: i64) -> PyResult<i64> {
        wait(py, self.inner.increment_key_value(key, by))?.map_err(err)
    }

    fn delete(&self, py: Python<'_>, key: &str) -> PyResult<()> {
        wait(py, self.inner.delete_key_value(key))?.map_err(err)
    }

    /// Starts a watch of `key` and everything under it.
    fn watch(&self, py: Python<'_>, key: String) -> PyResult<Watch> {
        let (tx, rx) = mpsc::channel::<(String, Option<Bytes>)>();
        let tx = Mutex::new(tx);
        let on_change: agent::ChangedKeyValuesCallback =
            Arc::new(move |changes: &BTreeMap<String, Option<Bytes>>| {
                let tx = tx.lock().unwrap_or_else(|p| p.into_inner());
                for (k, v) in changes {
                    let _ = tx.send((k.clone(), v.clone()));
                }
            });
        wait(py, self.inner.start_watch_key(&key, on_change))?.map_err(err)?;
        Ok(Watch {
            agent: self.inner.clone(),
            key,
            rx: Mutex::new(rx),
        })
    }

    /// Waits at barrier `id` with `tasks` ([(job, task id)], empty = all).
    #[pyo3(signature = (id, timeout_s, tasks = Vec::new()))]
    fn barrier(
        &self,
        py: Python<'_>,
        id: &str,
        timeout_s: f64,
        tasks: Vec<(String, i32)>,
    ) -> PyResult<()> {
        let tasks: Vec<CoordinatedTask> = tasks
            .into_iter()
            .map(|(job_name, task_id)| CoordinatedTask {
                job_name,
                task_id,
                ..Default::default()
            })
            .collect();
        let t = timeout(Some(timeout_s))?.unwrap_or_default();
        wait(py, self.inner.wait_at_barrier(id, t, &tasks))?.map_err(err)
    }

    fn cancel_barrier(&self, py: Python<'_>, id: &str) -> PyResult<()> {
        wait(py, self.inner.cancel_barrier(id))?.map_err(err)
    }
}

/// Changes of a watched key: `(key, value)`, `value` None when deleted.
#[pyclass(module = "coordstore._native", frozen)]
struct Watch {
    agent: agent::Agent,
    key: String,
    rx: Mutex<mpsc::Receiver<(String, Option<Bytes>)>>,
}

#[pymethods]
impl Watch {
    /// The next change, waiting up to `timeout_s` (None: no limit); None
    /// when the time passed.
    #[pyo3(signature = (timeout_s = None))]
    fn next(
        &self,
        py: Python<'_>,
        timeout_s: Option<f64>,
    ) -> PyResult<Option<(String, Option<Py<PyBytes>>)>> {
        let deadline = timeout(timeout_s)?.map(|t| std::time::Instant::now() + t);
        loop {
            let step = Duration::from_millis(100);
            let got = py.detach(|| {
                let rx = self.rx.lock().unwrap_or_else(|p| p.into_inner());
                rx.recv_timeout(step)
            });
            match got {
                Ok((k, v)) => return Ok(Some((k, v.map(|v| bytes(py, &v))))),
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(pyo3::exceptions::PyStopIteration::new_err(()))
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
            }
            py.check_signals()?;
            if deadline.is_some_and(|d| std::time::Instant::now() >= d) {
                return Ok(None);
            }
        }
    }

    /// Stops the watch.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        match wait(py, self.agent.stop_watch_key(&self.key))? {
            Ok(()) => Ok(()),
            Err(s) if s.code() == tonic::Code::NotFound => Ok(()),
            Err(s) => Err(err(s)),
        }
    }
}

/// Preemption sync (`docs/protocols.md`, Preemption sync) with JAX's keys
/// and barrier.
#[pyclass(module = "coordstore._native", frozen)]
struct PreemptionSyncManager {
    inner: Mutex<Option<preemption::PreemptionSyncManager>>,
    manual: Option<ManualNotifier>,
    _sigterm: Option<SigtermNotifier>,
}

#[pymethods]
impl PreemptionSyncManager {
    /// `notifier`: "sigterm" (a SIGTERM announces the preemption) or
    /// "manual" (call `notify`).
    #[new]
    #[pyo3(signature = (agent, notifier = "sigterm"))]
    fn new(agent: &Agent, notifier: &str) -> PyResult<PreemptionSyncManager> {
        let _rt = runtime().enter();
        let (manual, sigterm) = match notifier {
            "manual" => (Some(ManualNotifier::default()), None),
            "sigterm" => (
                None,
                Some(SigtermNotifier::new().map_err(|e| {
                    pyo3::exceptions::PyOSError::new_err(format!("listening for SIGTERM: {e}"))
                })?),
            ),
            other => {
                return Err(pyo3::exceptions::PyValueError::new_err(format!(
                    "notifier is \"sigterm\" or \"manual\", not {other:?}"
                )))
            }
        };
        let n: &dyn PreemptionNotifier = match (&manual, &sigterm) {
            (Some(m), _) => m,
            (_, Some(s)) => s,
            _ => unreachable!("one notifier is made"),
        };
        let inner =
            preemption::PreemptionSyncManager::start(agent.inner.clone(), n).map_err(err)?;
        Ok(PreemptionSyncManager {
            inner: Mutex::new(Some(inner)),
            manual,
            _sigterm: sigterm,
        })
    }

    /// Announces this task's preemption at `death_time` (seconds since the
    /// epoch); manual notifier only.
    fn notify(&self, death_time: f64) -> PyResult<()> {
        let Some(m) = &self.manual else {
            return Err(pyo3::exceptions::PyRuntimeError::new_err(
                "notify() needs notifier=\"manual\"",
            ));
        };
        m.notify(SystemTime::UNIX_EPOCH + Duration::from_secs_f64(death_time.max(0.0)));
        Ok(())
    }

    fn reached_sync_point(&self, py: Python<'_>, step: i64) -> PyResult<bool> {
        let guard = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let Some(m) = guard.as_ref() else {
            return Err(pyo3::exceptions::PyRuntimeError::new_err(
                "the manager was shut down",
            ));
        };
        wait(py, m.reached_sync_point(step))
    }

    #[getter]
    fn sync_point(&self) -> Option<i64> {
        let guard = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        guard.as_ref().and_then(|m| m.sync_point())
    }

    fn shutdown(&self, py: Python<'_>) -> PyResult<()> {
        let m = self.inner.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(m) = m {
            wait(py, m.shutdown())?;
        }
        Ok(())
    }
}

/// The coordinator side of a durable closure queue (opaque bytes).
#[pyclass(module = "coordstore._native", frozen)]
struct Coordinator {
    inner: cl::Coordinator,
}

fn outcome(py: Python<'_>, o: cl::Outcome) -> (String, Option<Py<PyAny>>) {
    match o {
        cl::Outcome::Pending => ("pending".into(), None),
        cl::Outcome::Finished(r) => ("finished".into(), Some(bytes(py, &r).into_any())),
        cl::Outcome::Cancelled => ("cancelled".into(), None),
        cl::Outcome::Failed(e) => (
            "failed".into(),
            Some(closure_err(cl::Error::Raised(e)).into_value(py).into_any()),
        ),
    }
}

#[pymethods]
impl Coordinator {
    /// Creates queue `queue` (or checks an existing one has this config;
    /// with no limit given, attaches to it as it is).
    #[staticmethod]
    #[pyo3(signature = (endpoints, queue, tag, *, lease_s = None, max_queued = None, max_closures = None, max_payload_bytes = None, max_result_bytes = None, namespace = None, tls_ca = None, tls_cert = None, tls_key = None))]
    #[allow(clippy::too_many_arguments)]
    fn create(
        py: Python<'_>,
        endpoints: Vec<String>,
        queue: String,
        tag: String,
        lease_s: Option<f64>,
        max_queued: Option<u64>,
        max_closures: Option<u64>,
        max_payload_bytes: Option<u64>,
        max_result_bytes: Option<u64>,
        namespace: Option<String>,
        tls_ca: Option<PathBuf>,
        tls_cert: Option<PathBuf>,
        tls_key: Option<PathBuf>,
    ) -> PyResult<Coordinator> {
        let tls = tls(tls_ca, tls_cert, tls_key)?;
        let given = lease_s.is_some()
            || max_queued.is_some()
            || max_closures.is_some()
            || max_payload_bytes.is_some()
            || max_result_bytes.is_some();
        let config = given.then(|| QueueConfig {
            max_queued: max_queued.unwrap_or(0),
            max_closures: max_closures.unwrap_or(0),
            max_payload_bytes: max_payload_bytes.unwrap_or(0),
            max_result_bytes: max_result_bytes.unwrap_or(0),
            lease_ms: lease_s.map_or(0, |s| (s * 1000.0) as u64),
        });
        let nodes = cl::Nodes {
            addrs: &endpoints,
            namespace: namespace.as_deref(),
            tls: &tls,
        };
        let inner = wait(py, cl::Coordinator::create_at(&nodes, &queue, config, &tag))?
            .map_err(closure_err)?;
        Ok(Coordinator { inner })
    }

    fn schedule(&self, py: Python<'_>, payload: Vec<u8>) -> PyResult<u64> {
        let v = wait(py, self.inner.schedule(payload))?.map_err(closure_err)?;
        Ok(v.id())
    }

    fn schedule_many(&self, py: Python<'_>, payloads: Vec<Vec<u8>>) -> PyResult<Vec<u64>> {
        let vs = wait(py, self.inner.schedule_many(payloads))?.map_err(closure_err)?;
        Ok(vs.iter().map(|v| v.id()).collect())
    }

    fn join(&self, py: Python<'_>) -> PyResult<()> {
        wait(py, self.inner.join())?.map_err(closure_err)
    }

    fn done(&self, py: Python<'_>) -> PyResult<bool> {
        wait(py, self.inner.done())?.map_err(closure_err)
    }

    /// (status, value): "finished" with the result bytes, "failed" with
    /// the exception, "cancelled" or "pending" with None; waits up to
    /// `timeout_s` for an outcome.
    #[pyo3(signature = (id, timeout_s = 0.0))]
    fn outcome(
        &self,
        py: Python<'_>,
        id: u64,
        timeout_s: f64,
    ) -> PyResult<(String, Option<Py<PyAny>>)> {
        let t = timeout(Some(timeout_s))?.unwrap_or_default();
        let o = wait(py, self.inner.remote_value(id).outcome(t))?.map_err(closure_err)?;
        Ok(outcome(py, o))
    }

    /// Waits for closure `id`'s result.
    fn fetch(&self, py: Python<'_>, id: u64) -> PyResult<Py<PyBytes>> {
        let r = wait(py, self.inner.remote_value(id).fetch())?.map_err(closure_err)?;
        Ok(bytes(py, &r))
    }

    /// Waits for every result, in order; raises the first error among them.
    fn fetch_all(&self, py: Python<'_>, ids: Vec<u64>) -> PyResult<Vec<Py<PyBytes>>> {
        let values: Vec<cl::RemoteValue> =
            ids.iter().map(|&id| self.inner.remote_value(id)).collect();
        let rs = wait(py, self.inner.fetch_all(&values))?.map_err(closure_err)?;
        Ok(rs.iter().map(|r| bytes(py, r)).collect())
    }

    /// [(id, status, attempts)] of every closure scheduled under this tag.
    fn scheduled(&self, py: Python<'_>) -> PyResult<Vec<(u64, String, u32)>> {
        let all = wait(py, self.inner.scheduled())?.map_err(closure_err)?;
        Ok(all
            .into_iter()
            .map(|c| {
                let status = match c.status() {
                    cl::ClosureStatus::ClosureFinished => "finished",
                    cl::ClosureStatus::ClosureFailed => "failed",
                    cl::ClosureStatus::ClosureCancelled => "cancelled",
                    _ => "pending",
                };
                (c.closure_id, status.to_string(), c.attempts)
            })
            .collect())
    }

    fn release(&self, py: Python<'_>, ids: Vec<u64>) -> PyResult<u64> {
        wait(py, self.inner.release(&ids))?.map_err(closure_err)
    }
}

/// The worker side of a durable closure queue.
#[pyclass(module = "coordstore._native", frozen)]
struct Worker {
    inner: cl::Worker,
}

type Leased = (u64, Py<PyBytes>, u32, String);

#[pymethods]
impl Worker {
    #[new]
    #[pyo3(signature = (endpoints, queue, name, *, namespace = None, tls_ca = None, tls_cert = None, tls_key = None))]
    fn new(
        endpoints: Vec<String>,
        queue: &str,
        name: &str,
        namespace: Option<String>,
        tls_ca: Option<PathBuf>,
        tls_cert: Option<PathBuf>,
        tls_key: Option<PathBuf>,
    ) -> PyResult<Worker> {
        let tls = tls(tls_ca, tls_cert, tls_key)?;
        let _rt = runtime().enter();
        let nodes = cl::Nodes {
            addrs: &endpoints,
            namespace: namespace.as_deref(),
            tls: &tls,
        };
        let inner = cl::Worker::at(&nodes, queue, name).map_err(err)?;
        Ok(Worker { inner })
    }

    /// Up to `max` closures [(id, payload, attempt, tag)] under one lease,
    /// waiting up to `timeout_s` for the first; and the lease in seconds.
    #[pyo3(signature = (max = 1, timeout_s = 5.0))]
    fn get(&self, py: Python<'_>, max: u32, timeout_s: f64) -> PyResult<(Vec<Leased>, f64)> {
        let t = timeout(Some(timeout_s))?.unwrap_or_default();
        let (got, lease) = wait(py, self.inner.get_many(max, t))?.map_err(err)?;
        let got = got
            .into_iter()
            .map(|c| (c.id, bytes(py, &c.payload), c.attempt, c.tag))
            .collect();
        Ok((got, lease.as_secs_f64()))
    }

    fn renew(&self, py: Python<'_>) -> PyResult<u64> {
        wait(py, self.inner.renew())?.map_err(err)
    }

    fn finish(&self, py: Python<'_>, id: u64, result: Vec<u8>) -> PyResult<bool> {
        wait(py, self.inner.finish(id, result))?.map_err(err)
    }

    fn finish_many(&self, py: Python<'_>, results: Vec<(u64, Vec<u8>)>) -> PyResult<Vec<bool>> {
        let results = results
            .into_iter()
            .map(|(id, r)| (id, Bytes::from(r)))
            .collect();
        wait(py, self.inner.finish_many(results))?.map_err(err)
    }

    #[pyo3(signature = (id, code, message, payload = Vec::new()))]
    fn fail(
        &self,
        py: Python<'_>,
        id: u64,
        code: i32,
        message: String,
        payload: Vec<u8>,
    ) -> PyResult<bool> {
        let e = ClosureError {
            code,
            message,
            payload: payload.into(),
            closure_id: id,
        };
        wait(py, self.inner.fail(id, e))?.map_err(err)
    }

    fn put_back(&self, py: Python<'_>, id: u64) -> PyResult<bool> {
        wait(py, self.inner.put_back(id))?.map_err(err)
    }
}

/// A relay (`coordstore relay`) in this process: stock clients (torch's
/// TCPStore, jaxlib, TensorFlow) dial its plaintext port, it dials the
/// nodes (over TLS when given) and re-issues in-flight calls at a live node.
#[pyclass(module = "coordstore._native", frozen)]
struct Relay {
    addr: SocketAddr,
    stop: Mutex<Option<tokio::sync::oneshot::Sender<()>>>,
    served: Mutex<Option<tokio::task::JoinHandle<Result<(), String>>>>,
}

#[pymethods]
impl Relay {
    /// Starts serving on `listen` (port 0: a free one, see `port`).
    #[new]
    #[pyo3(signature = (endpoints, *, listen = "127.0.0.1:0", namespace = None, tls_ca = None, tls_cert = None, tls_key = None, retry_for_s = 600.0))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        endpoints: Vec<String>,
        listen: &str,
        namespace: Option<String>,
        tls_ca: Option<PathBuf>,
        tls_cert: Option<PathBuf>,
        tls_key: Option<PathBuf>,
        retry_for_s: f64,
    ) -> PyResult<Relay> {
        let bad = pyo3::exceptions::PyValueError::new_err;
        let listen: SocketAddr = listen
            .parse()
            .map_err(|e| bad(format!("listen {listen:?}: {e}")))?;
        let mut cfg = RelayConfig::new(endpoints);
        cfg.namespace = namespace;
        cfg.tls = tls(tls_ca, tls_cert, tls_key)?;
        cfg.retry_for = timeout(Some(retry_for_s))?.unwrap_or_default();
        {
            // The endpoints and the namespace are checked here, not in the
            // serving task (lazy channels: nothing is dialed yet).
            let _rt = runtime().enter();
            Endpoints::with_tls(&cfg.endpoints, cfg.retry_for, cfg.tls.clone())
                .and_then(|e| e.in_namespace(cfg.namespace.as_deref()))
                .map_err(bad)?;
        }
        let listener = wait(py, tokio::net::TcpListener::bind(listen))?.map_err(|e| {
            pyo3::exceptions::PyOSError::new_err(format!("cannot listen on {listen}: {e}"))
        })?;
        let addr = listener
            .local_addr()
            .map_err(|e| pyo3::exceptions::PyOSError::new_err(e.to_string()))?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let served = runtime().spawn(agent::relay::serve_on(listener, cfg, async {
            let _ = stopped.await;
        }));
        Ok(Relay {
            addr,
            stop: Mutex::new(Some(stop)),
            served: Mutex::new(Some(served)),
        })
    }

    /// The address it serves on (HOST:PORT).
    #[getter]
    fn address(&self) -> String {
        self.addr.to_string()
    }

    #[getter]
    fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Stops accepting (connections open already are relayed on until
    /// their clients close them); waits up to `timeout_s` for the server
    /// to end.
    #[pyo3(signature = (timeout_s = 5.0))]
    fn close(&self, py: Python<'_>, timeout_s: f64) -> PyResult<()> {
        if let Some(stop) = self.stop.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = stop.send(());
        }
        let served = self.served.lock().unwrap_or_else(|p| p.into_inner()).take();
        let Some(served) = served else { return Ok(()) };
        let t = timeout(Some(timeout_s))?.unwrap_or_default();
        match wait(py, async move { tokio::time::timeout(t, served).await })? {
            Ok(Ok(Err(e))) => Err(pyo3::exceptions::PyRuntimeError::new_err(e)),
            _ => Ok(()),
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = stop.send(());
        }
    }
}

/// A namespace as Python sees it: (name, port, settings as a dict).
type NamespaceTuple = (String, u32, BTreeMap<String, u64>);

fn namespace_tuple(n: NamespaceInfo) -> NamespaceTuple {
    let s = n.settings.unwrap_or_default();
    let mut settings = BTreeMap::from([("tasks".to_string(), u64::from(s.tasks))]);
    for (k, v) in [
        ("ttl_ms", s.ttl_ms),
        ("max_keys", s.max_keys),
        ("max_bytes", s.max_bytes),
    ] {
        if let Some(v) = v {
            settings.insert(k.to_string(), v);
        }
    }
    (n.name, n.port, settings)
}

/// The Node API of `endpoints` (failover, exactly once), over TLS if given.
fn node_api(
    endpoints: &[String],
    tls_config: Option<tonic::transport::ClientTlsConfig>,
    retry_for_s: f64,
) -> PyResult<Endpoints> {
    let _rt = runtime().enter();
    let retry = timeout(Some(retry_for_s))?.unwrap_or_default();
    Endpoints::with_tls(endpoints, retry, tls_config)
        .map_err(pyo3::exceptions::PyValueError::new_err)
}

fn node_client(ch: tonic::transport::Channel) -> NodeClient<tonic::transport::Channel> {
    NodeClient::new(ch)
}

/// Creates namespace `name` (`coordstore ctl ns create`): `tasks` tasks of
/// job jax_worker, the TTL and quotas given (None: none), on the cluster's
/// range of ports. Raises `AlreadyExists` if it exists, `PermissionDenied`
/// for a client that is not an admin of a cluster with mutual TLS.
/// Returns (name, port, settings).
#[pyfunction]
#[pyo3(signature = (endpoints, name, *, tasks = 1, ttl_ms = None, max_keys = None, max_bytes = None, tls_ca = None, tls_cert = None, tls_key = None, retry_for_s = 60.0))]
#[allow(clippy::too_many_arguments)]
fn create_namespace(
    py: Python<'_>,
    endpoints: Vec<String>,
    name: String,
    tasks: u32,
    ttl_ms: Option<u64>,
    max_keys: Option<u64>,
    max_bytes: Option<u64>,
    tls_ca: Option<PathBuf>,
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
    retry_for_s: f64,
) -> PyResult<NamespaceTuple> {
    let nodes = node_api(&endpoints, tls(tls_ca, tls_cert, tls_key)?, retry_for_s)?;
    let req = CreateNamespaceRequest {
        name,
        settings: Some(NamespaceSettings {
            tasks,
            ttl_ms,
            max_keys,
            max_bytes,
            ..Default::default()
        }),
    };
    let call = nodes.call(req, |ch, r| async move {
        node_client(ch).create_namespace(r).await
    });
    let info = wait(py, call)?.map_err(err)?;
    Ok(namespace_tuple(info))
}

/// Namespace `name` (`coordstore ctl ns get`): (name, port, settings).
/// Raises `NotFound` if there is none.
#[pyfunction]
#[pyo3(signature = (endpoints, name, *, tls_ca = None, tls_cert = None, tls_key = None, retry_for_s = 60.0))]
fn get_namespace(
    py: Python<'_>,
    endpoints: Vec<String>,
    name: String,
    tls_ca: Option<PathBuf>,
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
    retry_for_s: f64,
) -> PyResult<NamespaceTuple> {
    let nodes = node_api(&endpoints, tls(tls_ca, tls_cert, tls_key)?, retry_for_s)?;
    let call = nodes.call(NamespaceRequest { name }, |ch, r| async move {
        node_client(ch).get_namespace(r).await
    });
    let info = wait(py, call)?.map_err(err)?;
    Ok(namespace_tuple(info))
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Agent>()?;
    m.add_class::<Watch>()?;
    m.add_class::<PreemptionSyncManager>()?;
    m.add_class::<Coordinator>()?;
    m.add_class::<Worker>()?;
    m.add_class::<Relay>()?;
    m.add_class::<rendezvous::Rendezvous>()?;
    m.add_function(wrap_pyfunction!(create_namespace, m)?)?;
    m.add_function(wrap_pyfunction!(get_namespace, m)?)?;
    Ok(())
}
