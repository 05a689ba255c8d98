//! The Node API's namespace messages: a create's settings as the state's
//! configuration and spec (with `coordstore serve`'s defaults), and a
//! namespace as `ctl ns get` shows it. The lifecycle itself is
//! `crate::core::namespaces`'.

use std::collections::BTreeMap;

use journal::pb::{ClusterConfig, JobSpec, NamespaceSpec, TaskAddresses};
use journal::Namespace;
use proto::coordstore::{JobCount, NamespaceInfo, NamespaceSettings, QueueInfo};
use tonic::Status;

use crate::core::namespaces::{
    Namespaces, DEFAULT_HEARTBEAT_TIMEOUT_MS, DEFAULT_REGISTER_TIMEOUT_MS,
    DEFAULT_SHUTDOWN_TIMEOUT_MS,
};
use crate::core::{Call, CallError, CallResult};

/// What `ctl ns get` shows of namespace `name` on this node.
pub fn info(ns: &Namespaces, c: &Call, name: &str) -> CallResult<NamespaceInfo> {
    let c = c.clone().in_namespace(name);
    let core = ns.core();
    let parked = core.parking().parked_in(c.namespace_key());
    core.read(&c, |n| {
        let listener = ns.listener(name, n.spec().map_or(0, |s| s.port));
        describe(n, parked, listener)
    })
}

/// A namespace's settings as the state's configuration and spec, with
/// `coordstore serve`'s defaults for what is unset.
pub fn settings_to_parts(s: &NamespaceSettings) -> CallResult<(ClusterConfig, NamespaceSpec)> {
    for (flag, value) in [
        ("--max-keys", s.max_keys),
        ("--max-bytes", s.max_bytes),
        ("--max-parked-calls", s.max_parked_calls),
        ("--ttl-ms", s.ttl_ms),
    ] {
        if value == Some(0) {
            return Err(CallError::from(Status::invalid_argument(format!(
                "{flag} 0 means nothing: leave it out for no limit"
            ))));
        }
    }
    let mut jobs: Vec<JobSpec> = Vec::new();
    for j in &s.jobs {
        if jobs.iter().any(|k| k.name == j.name) {
            return Err(CallError::from(Status::invalid_argument(format!(
                "job {} is given twice",
                j.name
            ))));
        }
        jobs.push(JobSpec {
            name: j.name.clone(),
            count: j.count,
        });
    }
    let tf_jobs = !jobs.is_empty();
    if tf_jobs && s.tasks > 0 {
        return Err(CallError::from(Status::invalid_argument(
            "give --tasks or --job, not both",
        )));
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
    let u = n.usage();
    let (d, t) = (n.dispatcher(), n.torch());
    NamespaceInfo {
        name: n.name().to_string(),
        port: spec.port,
        settings: Some(settings),
        service_incarnation: n.service_incarnation(),
        epoch: n.epoch(),
        tasks_disconnected: u.tasks[0],
        tasks_connected: u.tasks[1],
        tasks_error: u.tasks[2],
        barriers_pending: u.barriers_pending,
        keys: u.held.keys,
        bytes: u.held.bytes,
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
