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
    ResetJobEpoch,
};
use journal::Update;
use prost::Message;
use tokio::sync::watch;
use tonic::Status;

use super::{now_ms, Call, CallError, CallResult, Core};

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

    /// Waits until this node has tried to open the port `port` of namespace
    /// `name`, just created or imported (here, or by the leader): serving,
    /// or saying why not. So a client that dials the port of the reply on
    /// the node that answered is not refused for being early. At most
    /// [`OPEN_WAIT`].
    pub async fn opened(&self, name: &str, port: u32) {
        if port == 0 {
            return;
        }
        let mut changes = self.listener_changes.subscribe();
        let tried = async {
            loop {
                let seen = self.listeners().contains_key(name);
                if seen || changes.changed().await.is_err() {
                    return;
                }
            }
        };
        let _ = tokio::time::timeout(OPEN_WAIT, tried).await;
    }

    /// This node's listener on namespace `name`'s port `port`: "serving",
    /// or why not.
    pub fn listener(&self, name: &str, port: u32) -> String {
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

    /// CreateNamespace of `name` with its configuration and spec, or an
    /// import of `data` (its own configuration, the spec's port and
    /// quotas), on the leader (see the module). A follower's caller runs it
    /// through the router with `remote` forwarding the whole call.
    pub async fn create_here(
        &self,
        c: &Call,
        name: &str,
        parts: (ClusterConfig, NamespaceSpec),
        data: Option<journal::pb::NamespaceData>,
    ) -> CallResult<()> {
        if !valid_name(name) {
            return Err(journal::namespace::bad_name(name).into());
        }
        let (config, mut spec) = match (&data, parts) {
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
        self.propose_here(&c.update(Command::CreateNamespace(Box::new(create))))
            .await?;
        Ok(())
    }

    /// DeleteNamespace, on the leader: what `last` reads of the namespace
    /// on an up-to-date state before it goes.
    pub async fn delete_here<T>(
        &self,
        c: &Call,
        name: &str,
        last: impl FnOnce() -> CallResult<T>,
    ) -> CallResult<T> {
        self.core.router().leader().read_barrier().await?;
        let before = last()?;
        let delete = DeleteNamespace {
            name: name.to_string(),
        };
        self.propose_here(&c.update(Command::DeleteNamespace(delete)))
            .await?;
        Ok(before)
    }

    /// ResetNamespace: a new job epoch in namespace `name` (optionally
    /// with `tasks` tasks of job jax_worker), proposed from here.
    pub async fn reset(&self, c: &Call, name: &str, tasks: u32) -> CallResult<()> {
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
        self.core.parking().wait_applied(applied.log_index).await
    }

    /// ListNamespaces (linearizable): the names of every namespace that
    /// admits the caller (all of them for an admin).
    pub async fn list(&self, c: &Call) -> CallResult<Vec<String>> {
        self.core.linearizable(c).await?;
        Ok(self.core.state(|s| {
            s.namespaces()
                .filter(|n| self.core.admits(c, n))
                .map(|n| n.name().to_string())
                .collect()
        }))
    }

    /// The core these namespaces live in.
    pub fn core(&self) -> &Arc<Core> {
        &self.core
    }

    /// ExportNamespace: the namespace's whole state at a linearizable
    /// point, as an export file.
    pub async fn export(&self, c: &Call, name: &str) -> CallResult<Vec<u8>> {
        let index = self.core.linearizable(c).await?;
        let data = self
            .core
            .state(|s| s.namespace_data(name))
            .ok_or_else(|| CallError::Domain(journal::namespace::unknown(namespace_key(name))))?;
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

    /// The lowest port of the range no namespace has and this node can
    /// bind.
    fn free_port(&self, (low, high): (u16, u16)) -> CallResult<u32> {
        let used = self.used_ports();
        (low..=high)
            .map(u32::from)
            .find(|p| !used.contains_key(p) && self.can_bind(*p))
            .ok_or_else(|| {
                Status::resource_exhausted(format!(
                    "every port of the namespace range {low}-{high} is taken"
                ))
            })
            .map_err(CallError::from)
    }

    /// A port asked for: inside the range (if one is configured), no other
    /// namespace's, and free on this node.
    fn check_port(&self, port: u32) -> CallResult<()> {
        if let Some((low, high)) = self.policy.ports {
            if !(u32::from(low)..=u32::from(high)).contains(&port) {
                return Err(CallError::Domain(journal::namespace::port_outside(
                    port,
                    u32::from(low),
                    u32::from(high),
                )));
            }
        }
        if let Some(by) = self.used_ports().get(&port) {
            return Err(CallError::Domain(journal::namespace::port_taken(port, by)));
        }
        if !self.can_bind(port) {
            return Err(CallError::from(Status::failed_precondition(format!(
                "port {port} is held by another process on the leader (node {})",
                self.core.node().id()
            ))));
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
