//! Namespace lifecycle: create, delete, reset, describe, list, export and
//! import — what a launcher, an operator (`coordstore ctl ns`) or a
//! Kubernetes operator calls through the Node API. Creates, deletes and
//! imports run on the leader (a follower forwards the whole call): the
//! leader picks the port (the one asked for, or the lowest free one of the
//! cluster's range that it can bind), draws the service incarnation and
//! proposes the command; the state checks it again. Each node keeps the
//! state of its own listener on every namespace's port
//! ([`Namespaces::set_listener`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use journal::namespace::{namespace_key, valid_name};
use journal::pb::{
    update::Command, ClusterConfig, CreateNamespace, DeleteNamespace, JobSpec, NamespaceSpec,
    ResetJobEpoch, TaskAddresses,
};
use journal::{Namespace, Update};
use prost::Message;
use proto::coordstore::{JobCount, NamespaceInfo, NamespaceSettings, QueueInfo};
use tokio::sync::watch;
use tonic::Status;

use super::call::plain;
use super::{now_ms, Call, CallResult, Core};

/// Defaults of a namespace's settings: `coordstore serve`'s.
pub const DEFAULT_HEARTBEAT_TIMEOUT_MS: u64 = 100_000;
/// See [`DEFAULT_HEARTBEAT_TIMEOUT_MS`].
pub const DEFAULT_REGISTER_TIMEOUT_MS: u64 = 3_600_000;
/// See [`DEFAULT_HEARTBEAT_TIMEOUT_MS`].
pub const DEFAULT_SHUTDOWN_TIMEOUT_MS: u64 = 300_000;
/// Default bound on the namespaces of a cluster (the default one included).
pub const DEFAULT_MAX_NAMESPACES: u64 = 10_000;

/// How long a create or an import waits, on the node that answers it, for
/// that node's listener on the new namespace's port ([`Namespaces::opened`]).
const OPEN_WAIT: Duration = Duration::from_secs(5);

/// The cluster's namespace settings (the same on every node).
#[derive(Clone, Debug, Default)]
pub struct NamespacePolicy {
    /// The ports namespaces get (inclusive); `None`: only `--port` ones.
    pub ports: Option<(u16, u16)>,
    /// Most namespaces, the default one included (0: no bound).
    pub max_namespaces: u64,
    /// The host namespace listeners bind (this node's listen address).
    pub host: String,
}

/// The namespaces of one node: the lifecycle calls, and its listeners.
pub struct Namespaces {
    core: Arc<Core>,
    policy: NamespacePolicy,
    /// This node's listener on each namespace's port: "serving" or why not.
    listeners: Mutex<HashMap<String, String>>,
    /// Told of every change of `listeners`.
    listener_changes: watch::Sender<()>,
}

impl Namespaces {
    /// The lifecycle of `core`'s namespaces under `policy`.
    pub fn new(core: Arc<Core>, policy: NamespacePolicy) -> Self {
        Namespaces {
            core,
            policy,
            listeners: Mutex::default(),
            listener_changes: watch::Sender::new(()),
        }
    }

    /// The policy.
    pub fn policy(&self) -> &NamespacePolicy {
        &self.policy
    }

    /// Records this node's listener state on namespace `name`'s port.
    pub fn set_listener(&self, name: &str, state: Option<String>) {
        {
            let mut l = self.listeners();
            match state {
                Some(s) => l.insert(name.to_string(), s),
                None => l.remove(name),
            };
        }
        self.listener_changes.send_replace(());
    }

    fn listeners(&self) -> MutexGuard<'_, HashMap<String, String>> {
        self.listeners.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `info` of a namespace this node has just created or imported (or
    /// learned of from the leader that did), once this node has tried to
    /// open its port: serving, or saying why not. So a client that dials
    /// the port of the reply on the node that answered is not refused for
    /// being early. At most [`OPEN_WAIT`], then `info` as it was.
    pub async fn opened(&self, c: &Call, info: NamespaceInfo) -> NamespaceInfo {
        if info.port == 0 {
            return info;
        }
        let mut changes = self.listener_changes.subscribe();
        let tried = async {
            loop {
                let seen = self.listeners().contains_key(&info.name);
                if seen || changes.changed().await.is_err() {
                    return;
                }
            }
        };
        if tokio::time::timeout(OPEN_WAIT, tried).await.is_err() {
            return info;
        }
        self.info(c, &info.name).unwrap_or(info)
    }

    fn listener(&self, name: &str, port: u32) -> String {
        if namespace_key(name).is_empty() {
            return "serving (the main port)".into();
        }
        if port == 0 {
            return "no port (by name on the main port)".into();
        }
        self.listeners()
            .get(name)
            .cloned()
            .unwrap_or_else(|| "not opened yet".into())
    }

    /// Proposes `u` on the leader (here): its outcome; a domain error is
    /// the call's.
    async fn propose_here(&self, u: &Update) -> CallResult<journal::Outcome> {
        let applied = self.core.router().leader().propose(u).await?;
        match applied.outcome.error {
            Some(e) => Err(e.into()),
            None => Ok(applied.outcome),
        }
    }

    /// CreateNamespace, on the leader (see the module). A follower's caller
    /// runs it through the router with `remote` forwarding the whole call.
    pub async fn create_here(
        &self,
        c: &Call,
        name: &str,
        settings: &NamespaceSettings,
        data: Option<journal::pb::NamespaceData>,
    ) -> CallResult<NamespaceInfo> {
        if !valid_name(name) {
            return Err(journal::namespace::bad_name(name).into());
        }
        let (config, mut spec) = match (&data, settings_to_parts(settings)?) {
            (Some(d), (_, spec)) => (d.config.clone().unwrap_or_default(), spec),
            (None, parts) => parts,
        };
        self.core.router().leader().read_barrier().await?;
        if let (0, Some(range)) = (spec.port, self.policy.ports) {
            spec.port = self.free_port(range)?;
        } else if spec.port != 0 {
            self.check_port(spec.port)?;
        }
        let (low, high) = self.policy.ports.unwrap_or((0, 0));
        let create = CreateNamespace {
            name: name.to_string(),
            config: Some(config),
            spec: Some(spec),
            service_incarnation: rand::random(),
            max_namespaces: self.policy.max_namespaces,
            port_low: u32::from(low),
            port_high: u32::from(high),
            data,
        };
        // Checked here too, so a refused create proposes nothing.
        self.core.state(|s| s.check_create(&create, now_ms()))?;
        self.propose_here(&c.update(Command::CreateNamespace(create)))
            .await?;
        self.info(c, name)
    }

    /// DeleteNamespace, on the leader.
    pub async fn delete_here(&self, c: &Call, name: &str) -> CallResult<NamespaceInfo> {
        self.core.router().leader().read_barrier().await?;
        let info = self.info(c, name)?;
        let delete = DeleteNamespace {
            name: name.to_string(),
        };
        self.propose_here(&c.update(Command::DeleteNamespace(delete)))
            .await?;
        Ok(info)
    }

    /// ResetNamespace: a new job epoch in namespace `name` (optionally
    /// with `tasks` tasks of job jax_worker), proposed from here.
    pub async fn reset(&self, c: &Call, name: &str, tasks: u32) -> CallResult<NamespaceInfo> {
        let c = c.clone().in_namespace(name);
        let config = (tasks > 0)
            .then(|| {
                self.core.read(&c, |n| ClusterConfig {
                    jobs: vec![JobSpec {
                        name: journal::JAX_JOB.into(),
                        count: tasks,
                    }],
                    ..n.config().cloned().unwrap_or_default()
                })
            })
            .transpose()?;
        let reset = ResetJobEpoch {
            service_incarnation: rand::random(),
            config,
        };
        let mut u = c.update(Command::ResetJobEpoch(reset));
        let applied = self.core.propose(&c, &mut u).await?;
        if let Some(e) = applied.outcome.error {
            return Err(e.into());
        }
        self.core.parking().wait_applied(applied.log_index).await?;
        self.info(&c, name)
    }

    /// GetNamespace (linearizable).
    pub async fn get(&self, c: &Call, name: &str) -> CallResult<NamespaceInfo> {
        self.core.linearizable(c).await?;
        self.info(c, name)
    }

    /// ListNamespaces (linearizable): every namespace that admits the
    /// caller (all of them for an admin).
    pub async fn list(&self, c: &Call) -> CallResult<Vec<NamespaceInfo>> {
        self.core.linearizable(c).await?;
        let names: Vec<String> = self.core.state(|s| {
            s.namespaces()
                .filter(|n| self.core.admits(c, n))
                .map(|n| n.name().to_string())
                .collect()
        });
        Ok(names
            .iter()
            .filter_map(|name| self.info(c, name).ok())
            .collect())
    }

    /// ExportNamespace: the namespace's whole state at a linearizable
    /// point, as an export file.
    pub async fn export(&self, c: &Call, name: &str) -> CallResult<Vec<u8>> {
        let index = self.core.linearizable(c).await?;
        let data = self
            .core
            .state(|s| s.namespace_data(name))
            .ok_or_else(|| not_found(name))?;
        let node = self.core.node();
        let export = storage::backup::Export::new(
            journal::namespace::namespace_name(namespace_key(name)),
            data.encode_to_vec(),
            index,
            node.cluster_id(),
            now_ms(),
        );
        Ok(export.encode().map_err(Status::internal)?)
    }

    /// What `ctl ns get` shows of namespace `name` on this node.
    pub fn info(&self, c: &Call, name: &str) -> CallResult<NamespaceInfo> {
        let c = c.clone().in_namespace(name);
        let parked = self.core.parking().parked_in(c.namespace_key());
        Ok(self.core.read(&c, |n| {
            let listener = self.listener(name, n.spec().map_or(0, |s| s.port));
            describe(n, parked, listener)
        })?)
    }

    /// The lowest port of the range no namespace has and this node can
    /// bind.
    fn free_port(&self, (low, high): (u16, u16)) -> Result<u32, Status> {
        let used = self.used_ports();
        (low..=high)
            .map(u32::from)
            .find(|p| !used.contains_key(p) && self.can_bind(*p))
            .ok_or_else(|| {
                Status::resource_exhausted(format!(
                    "every port of the namespace range {low}-{high} is taken"
                ))
            })
    }

    /// A port asked for: inside the range (if one is configured), no other
    /// namespace's, and free on this node.
    fn check_port(&self, port: u32) -> Result<(), Status> {
        if let Some((low, high)) = self.policy.ports {
            if !(u32::from(low)..=u32::from(high)).contains(&port) {
                return Err(plain(&journal::namespace::port_outside(
                    port,
                    u32::from(low),
                    u32::from(high),
                )));
            }
        }
        if let Some(by) = self.used_ports().get(&port) {
            return Err(plain(&journal::namespace::port_taken(port, by)));
        }
        if !self.can_bind(port) {
            return Err(Status::failed_precondition(format!(
                "port {port} is held by another process on the leader (node {})",
                self.core.node().id()
            )));
        }
        Ok(())
    }

    fn used_ports(&self) -> BTreeMap<u32, String> {
        self.core.state(|s| {
            s.namespaces()
                .filter_map(|n| Some((n.spec()?.port, n.name().to_string())))
                .filter(|(port, _)| *port != 0)
                .collect()
        })
    }

    fn can_bind(&self, port: u32) -> bool {
        let Ok(port) = u16::try_from(port) else {
            return false;
        };
        std::net::TcpListener::bind((self.policy.host.as_str(), port)).is_ok()
    }
}

fn not_found(name: &str) -> Status {
    Status::not_found(format!("namespace {name} does not exist"))
}

/// A namespace's settings as the state's configuration and spec, with
/// `coordstore serve`'s defaults for what is unset.
pub fn settings_to_parts(s: &NamespaceSettings) -> Result<(ClusterConfig, NamespaceSpec), Status> {
    for (flag, value) in [
        ("--max-keys", s.max_keys),
        ("--max-bytes", s.max_bytes),
        ("--max-parked-calls", s.max_parked_calls),
        ("--ttl-ms", s.ttl_ms),
    ] {
        if value == Some(0) {
            return Err(Status::invalid_argument(format!(
                "{flag} 0 means nothing: leave it out for no limit"
            )));
        }
    }
    let mut jobs: Vec<JobSpec> = Vec::new();
    for j in &s.jobs {
        if jobs.iter().any(|k| k.name == j.name) {
            return Err(Status::invalid_argument(format!(
                "job {} is given twice",
                j.name
            )));
        }
        jobs.push(JobSpec {
            name: j.name.clone(),
            count: j.count,
        });
    }
    let tf_jobs = !jobs.is_empty();
    if tf_jobs && s.tasks > 0 {
        return Err(Status::invalid_argument("give --tasks or --job, not both"));
    }
    if !tf_jobs {
        jobs.push(JobSpec {
            name: journal::JAX_JOB.into(),
            count: s.tasks,
        });
    }
    let tf_addresses = if s.tf_cluster_spec.is_empty() {
        BTreeMap::new()
    } else {
        let spec = parse_tf_cluster_spec(&s.tf_cluster_spec).map_err(Status::invalid_argument)?;
        spec.into_iter()
            .map(|(job, addresses)| (job, TaskAddresses { addresses }))
            .collect()
    };
    let config = ClusterConfig {
        jobs,
        recoverable: s.recoverable,
        heartbeat_timeout_ms: s
            .heartbeat_timeout_ms
            .unwrap_or(DEFAULT_HEARTBEAT_TIMEOUT_MS),
        register_timeout_ms: s.register_timeout_ms.unwrap_or(DEFAULT_REGISTER_TIMEOUT_MS),
        shutdown_timeout_ms: s.shutdown_timeout_ms.unwrap_or(DEFAULT_SHUTDOWN_TIMEOUT_MS),
        register_with_barrier: s.register_with_barrier.unwrap_or(true),
        max_keys: s.max_keys.unwrap_or(0),
        notify_tasks: s.notify_tasks.unwrap_or(tf_jobs),
        ..Default::default()
    };
    let spec = NamespaceSpec {
        port: s.port,
        max_bytes: s.max_bytes.unwrap_or(0),
        max_parked_calls: s.max_parked_calls.unwrap_or(0),
        allow_client_names: s.allow_client_names.clone(),
        ttl_ms: s.ttl_ms.unwrap_or(0),
        created_ms: 0,
        tf_addresses,
        torch_plaintext: s.torch_plaintext,
    };
    Ok((config, spec))
}

/// A quota as the wire has it: `None` for none (0 in the state).
fn nonzero(v: u64) -> Option<u64> {
    (v != 0).then_some(v)
}

/// A namespace's settings as the wire has them, from its configuration
/// and spec (a JAX job as `tasks`, TensorFlow-style jobs by name).
fn settings_of(config: &ClusterConfig, spec: &NamespaceSpec) -> NamespaceSettings {
    let tf_jobs = !(config.jobs.len() == 1 && config.jobs[0].name == journal::JAX_JOB);
    let jobs = match tf_jobs {
        true => config
            .jobs
            .iter()
            .map(|j| JobCount {
                name: j.name.clone(),
                count: j.count,
            })
            .collect(),
        false => Vec::new(),
    };
    let tf_cluster_spec = match spec.tf_addresses.is_empty() {
        true => String::new(),
        false => {
            let jobs: BTreeMap<&String, &Vec<String>> = spec
                .tf_addresses
                .iter()
                .map(|(j, a)| (j, &a.addresses))
                .collect();
            serde_json::to_string(&jobs).unwrap_or_default()
        }
    };
    NamespaceSettings {
        jobs,
        tasks: if tf_jobs { 0 } else { config.jobs[0].count },
        heartbeat_timeout_ms: Some(config.heartbeat_timeout_ms),
        register_timeout_ms: Some(config.register_timeout_ms),
        shutdown_timeout_ms: Some(config.shutdown_timeout_ms),
        register_with_barrier: Some(config.register_with_barrier),
        recoverable: config.recoverable,
        notify_tasks: Some(config.notify_tasks),
        tf_cluster_spec,
        max_keys: nonzero(config.max_keys),
        max_bytes: nonzero(spec.max_bytes),
        max_parked_calls: nonzero(spec.max_parked_calls),
        allow_client_names: spec.allow_client_names.clone(),
        ttl_ms: nonzero(spec.ttl_ms),
        port: spec.port,
        torch_plaintext: spec.torch_plaintext,
    }
}

/// Namespace `n` as `ctl ns get` shows it.
fn describe(n: Namespace<'_>, parked: u64, listener: String) -> NamespaceInfo {
    let spec = n.spec().cloned().unwrap_or_default();
    let settings = settings_of(&n.config().cloned().unwrap_or_default(), &spec);
    let c = n.coordination().stats();
    let d = n.dispatcher();
    let t = n.torch();
    NamespaceInfo {
        name: n.name().to_string(),
        port: spec.port,
        settings: Some(settings),
        service_incarnation: n.service_incarnation(),
        epoch: n.epoch(),
        tasks_disconnected: c.tasks[0],
        tasks_connected: c.tasks[1],
        tasks_error: c.tasks[2],
        barriers_pending: c.barriers_pending,
        keys: c.keys + t.held().keys,
        bytes: c.kv_bytes + t.held().bytes,
        parked_calls: parked,
        tfdata_jobs: d.jobs().count() as u64,
        tfdata_workers: d.workers().count() as u64,
        closure_queues: n
            .closures()
            .stats()
            .into_iter()
            .map(|q| QueueInfo {
                name: q.name,
                pending: q.pending,
                queued: q.queued,
                running: q.running,
                records: q.records,
            })
            .collect(),
        created_ms: spec.created_ms,
        last_active_ms: n.last_active_ms(),
        listener,
        torch_keys: t.num_keys() as u64,
        torch_queues: t.queues() as u64,
        torch_waiting: t.waiting_connections() as u64,
    }
}

/// Reads a ClusterSpec (`{"job": ["host:port", ...]}`) or a TF_CONFIG
/// (`{"cluster": {...}, "task": {...}}`), inline JSON or `@FILE`.
pub fn parse_tf_cluster_spec(value: &str) -> Result<BTreeMap<String, Vec<String>>, String> {
    let text = match value.strip_prefix('@') {
        Some(path) => {
            std::fs::read_to_string(path).map_err(|e| format!("--tf-cluster-spec {path}: {e}"))?
        }
        None => value.to_string(),
    };
    let json: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("--tf-cluster-spec: not JSON: {e}"))?;
    let cluster = json.get("cluster").unwrap_or(&json);
    let jobs = cluster
        .as_object()
        .ok_or("--tf-cluster-spec: expected an object of job name -> [addresses]")?;
    let mut out = BTreeMap::new();
    for (job, addrs) in jobs {
        let list = addrs
            .as_array()
            .ok_or_else(|| format!("--tf-cluster-spec: job {job}: expected a list of addresses"))?
            .iter()
            .map(|a| {
                a.as_str().map(str::to_string).ok_or_else(|| {
                    format!("--tf-cluster-spec: job {job}: addresses must be strings")
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        out.insert(job.clone(), list);
    }
    Ok(out)
}
