//! `ctl ns`: a fleet's namespaces (list, get, create, import, export,
//! reset, delete) and how a namespace prints.

use super::*;

/// Namespace verbs (each prints JSON).
#[derive(clap::Subcommand, Debug, Clone)]
pub enum NsCommand {
    /// Create a namespace; prints it (with its port).
    Create {
        /// A DNS label: [a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?
        name: String,
        #[command(flatten)]
        settings: Box<NsSettings>,
    },
    /// Every namespace (with its oldest pending barrier's wait).
    Ls,
    /// One namespace: its settings, port, tasks by state, the pending
    /// barriers with the tasks they wait for, keys, bytes, parked calls,
    /// tf.data jobs and workers, closure queues.
    Get { name: String },
    /// A new job epoch in the namespace (clears tasks, barriers, errors and
    /// KV; a new service incarnation).
    Reset {
        name: String,
        /// N tasks in job `jax_worker` from now on.
        #[arg(long)]
        tasks: Option<u32>,
    },
    /// Delete the namespace and everything in it.
    Delete { name: String },
    /// Save the namespace's whole state (read at a linearizable point,
    /// checksummed) to FILE, to import into another cluster.
    Export {
        name: String,
        file: std::path::PathBuf,
    },
    /// Create a namespace from an export file.
    Import {
        file: std::path::PathBuf,
        /// Its name here [default: the exported one]
        #[arg(long = "as")]
        as_name: Option<String>,
        /// Its port here [default: the lowest free one]
        #[arg(long, default_value_t = 0)]
        port: u32,
    },
}

/// A namespace's settings: its job's (the same flags as `coordstore
/// serve`'s, defaulting as they do) and what only a namespace has.
#[derive(clap::Args, Debug, Clone)]
pub struct NsSettings {
    #[command(flatten)]
    pub job: crate::cli::job::JobSettings,
    /// The port [default: the lowest free one of the cluster's range; none
    /// without a range: the namespace is then reached by name on the main port]
    #[arg(long)]
    pub port: Option<u32>,
    /// Most bytes of KV keys and values [default: none]
    #[arg(long)]
    pub max_bytes: Option<u64>,
    /// Most calls parked in the namespace on one node [default: the node's]
    #[arg(long)]
    pub max_parked_calls: Option<u64>,
    /// With mutual TLS: a client certificate name admitted (subject CN or
    /// a SAN; `*` matches any run of characters; repeatable) [default: any]
    #[arg(long)]
    pub allow_client_name: Vec<String>,
    /// Delete the namespace once its job is done and it has been quiet this
    /// long [default: never]
    #[arg(long)]
    pub ttl_ms: Option<u64>,
    /// With TLS: the namespace's port also serves PyTorch's TCPStore
    /// protocol in plaintext (torch's client has no TLS; a relay is the
    /// other way) [default: false]
    #[arg(long)]
    pub torch_plaintext: bool,
}

/// A namespace as JSON.
pub(super) fn namespace_json(n: &proto::coordstore::NamespaceInfo) -> Value {
    let s = n.settings.clone().unwrap_or_default();
    json!({
        "name": n.name,
        "port": n.port,
        "service_incarnation": n.service_incarnation,
        "epoch": n.epoch,
        "spec": {
            "tasks": s.tasks,
            "jobs": s.jobs.iter().map(|j| json!({"name": j.name, "count": j.count})).collect::<Vec<_>>(),
            "heartbeat_timeout_ms": s.heartbeat_timeout_ms,
            "register_timeout_ms": s.register_timeout_ms,
            "shutdown_timeout_ms": s.shutdown_timeout_ms,
            "register_with_barrier": s.register_with_barrier,
            "recoverable": s.recoverable,
            "notify_tasks": s.notify_tasks,
            "tf_cluster_spec": s.tf_cluster_spec,
            "max_keys": s.max_keys,
            "max_bytes": s.max_bytes,
            "max_parked_calls": s.max_parked_calls,
            "allow_client_names": s.allow_client_names,
            "ttl_ms": s.ttl_ms,
            "torch_plaintext": s.torch_plaintext,
        },
        "tasks": {
            "disconnected": n.tasks_disconnected,
            "connected": n.tasks_connected,
            "error": n.tasks_error,
        },
        "barriers_pending": n.barriers_pending,
        "torch": {
            "keys": n.torch_keys,
            "queues": n.torch_queues,
            "waiting": n.torch_waiting,
        },
        "keys": n.keys,
        "bytes": n.bytes,
        "parked_calls": n.parked_calls,
        "tfdata": {"jobs": n.tfdata_jobs, "workers": n.tfdata_workers},
        "closure_queues": n.closure_queues.iter().map(|q| json!({
            "name": q.name, "pending": q.pending, "queued": q.queued,
            "running": q.running, "records": q.records,
        })).collect::<Vec<_>>(),
        "created_ms": n.created_ms,
        "last_active_ms": n.last_active_ms,
        "listener": n.listener,
    })
}

/// Namespace `namespace` (the default one if `None`) of `s`.
pub(super) fn namespace<'a>(
    s: &'a State,
    namespace: &Option<String>,
) -> anyhow::Result<journal::Namespace<'a>> {
    let name = namespace.as_deref().unwrap_or(journal::DEFAULT_NAMESPACE);
    s.namespace(name)
        .ok_or_else(|| anyhow::anyhow!("namespace {name} does not exist"))
}

/// A namespace verb.
pub(super) async fn ns_command(
    c: &mut NodeConn,
    cmd: NsCommand,
    out: Output,
) -> anyhow::Result<Printed> {
    match cmd {
        NsCommand::Ls => Ok(shown(ns_list(c).await?, out, show::namespaces)),
        NsCommand::Get { name } => Ok(shown(ns_get(c, name).await?, out, show::namespace)),
        change => Ok(Printed::Json(ns_change(c, change).await?)),
    }
}

/// `ctl ns ls`: every namespace, each with its oldest pending barrier's
/// wait as the leader knows it (`oldest_barrier_ms`, null if none).
pub(super) async fn ns_list(c: &mut NodeConn) -> anyhow::Result<Value> {
    use proto::coordstore::ListNamespacesRequest;
    let all = c.list_namespaces(ListNamespacesRequest {}).await?;
    let waits = match c.barrier_waits(BarrierWaitsRequest {}).await {
        Ok(w) => w.into_inner().namespaces,
        Err(_) => Vec::new(),
    };
    Ok(json!(all
        .into_inner()
        .namespaces
        .iter()
        .map(|n| {
            let mut v = namespace_json(n);
            let wait = waits.iter().find(|w| w.namespace == n.name);
            v["oldest_barrier_ms"] = json!(wait.map(|w| w.waited_ms));
            v["oldest_barrier_at_least"] = json!(wait.is_some_and(|w| w.waited_at_least));
            v
        })
        .collect::<Vec<_>>()))
}

/// `ctl ns get NAME`: the namespace, with its pending barriers and the
/// tasks they wait for (`pending_barriers`; `pending_barriers_error` if
/// the node could not say), and the PyTorch store keys most waited on
/// (`torch_waits`, the first 5; `torch_waits_error`).
pub(super) async fn ns_get(c: &mut NodeConn, name: String) -> anyhow::Result<Value> {
    use proto::coordstore::NamespaceRequest;
    let info = c
        .get_namespace(NamespaceRequest { name: name.clone() })
        .await?
        .into_inner();
    let mut v = namespace_json(&info);
    let asked = c
        .barriers(in_ns(&Some(name.clone()), BarriersRequest::default())?)
        .await;
    match asked {
        Ok(b) => {
            let pending = b.into_inner().barriers.iter().map(pending_json).collect();
            v["pending_barriers"] = Value::Array(pending);
        }
        Err(e) => v["pending_barriers_error"] = json!(describe_error(&e)),
    }
    let req = proto::coordstore::StoreWaitsRequest {
        key_limit: 5,
        waiter_limit: 1,
    };
    match c.store_waits(in_ns(&Some(name), req)?).await {
        Ok(r) => {
            let r = r.into_inner();
            let keys: Vec<Value> = r
                .keys
                .iter()
                .map(|k| json!({"key": k.key, "waiting": k.waiting, "oldest_wait_ms": k.oldest_wait_ms}))
                .collect();
            v["torch_waits"] = json!({
                "keys_waited_on": r.keys_waited_on,
                "waiting_connections": r.waiting_connections,
                "keys": keys,
            });
        }
        Err(e) => v["torch_waits_error"] = json!(format!("{e:#}")),
    }
    Ok(v)
}

/// A namespace verb that changes something (or exports it).
pub(super) async fn ns_change(c: &mut NodeConn, cmd: NsCommand) -> anyhow::Result<Value> {
    use proto::coordstore::{
        CreateNamespaceRequest, ImportNamespaceRequest, NamespaceRequest, ResetNamespaceRequest,
    };
    let one = |n: proto::coordstore::NamespaceInfo| namespace_json(&n);
    Ok(match cmd {
        NsCommand::Create { name, settings } => {
            let settings = Some(settings.to_wire()?);
            let req = CreateNamespaceRequest { name, settings };
            one(c.create_namespace(req).await?.into_inner())
        }
        NsCommand::Ls => ns_list(c).await?,
        NsCommand::Get { name, .. } => ns_get(c, name).await?,
        NsCommand::Reset { name, tasks } => {
            let req = ResetNamespaceRequest {
                name,
                tasks: tasks.unwrap_or(0),
            };
            one(c.reset_namespace(req).await?.into_inner())
        }
        NsCommand::Delete { name } => one(c
            .delete_namespace(NamespaceRequest { name })
            .await?
            .into_inner()),
        NsCommand::Export { name, file } => {
            let bytes = c
                .export_namespace(NamespaceRequest { name })
                .await?
                .into_inner()
                .file;
            let (export, _) =
                storage::backup::Export::parse(bytes.to_vec()).map_err(anyhow::Error::msg)?;
            write_durably(&file, &bytes)
                .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", file.display()))?;
            json!({"file": file.display().to_string(), "header": export.header})
        }
        NsCommand::Import {
            file,
            as_name,
            port,
        } => {
            let bytes =
                std::fs::read(&file).map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
            storage::backup::Export::parse(bytes.clone())
                .map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
            let req = ImportNamespaceRequest {
                name: as_name.unwrap_or_default(),
                file: bytes.into(),
                port,
            };
            one(c.import_namespace(req).await?.into_inner())
        }
    })
}

impl NsSettings {
    /// The settings as the Node API takes them.
    pub fn to_wire(&self) -> anyhow::Result<proto::coordstore::NamespaceSettings> {
        let job = &self.job;
        let jobs = job
            .jobs()
            .map_err(anyhow::Error::msg)?
            .into_iter()
            .map(|j| proto::coordstore::JobCount {
                name: j.name,
                count: j.count,
            })
            .collect::<Vec<_>>();
        if jobs.is_empty() && job.tasks.is_none() {
            anyhow::bail!("give the job's shape: --tasks N or --job NAME=N");
        }
        Ok(proto::coordstore::NamespaceSettings {
            jobs,
            tasks: job.tasks.unwrap_or(0),
            heartbeat_timeout_ms: job.heartbeat_timeout_ms,
            register_timeout_ms: job.register_timeout_ms,
            shutdown_timeout_ms: job.shutdown_timeout_ms,
            register_with_barrier: job.register_with_barrier,
            recoverable: job.recoverable.unwrap_or(false),
            notify_tasks: job.notify_tasks,
            tf_cluster_spec: job.tf_cluster_spec.clone().unwrap_or_default(),
            max_keys: job.max_keys,
            max_bytes: self.max_bytes,
            max_parked_calls: self.max_parked_calls,
            allow_client_names: self.allow_client_name.clone(),
            ttl_ms: self.ttl_ms,
            port: self.port.unwrap_or(0),
            torch_plaintext: self.torch_plaintext,
        })
    }
}
