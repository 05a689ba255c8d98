//! [`Cluster`]: what every area reads of the shared state — the cluster
//! configuration (jobs and their tasks), the service incarnation and the job
//! epoch — and how tasks are named.

use crate::pb::ClusterConfig;

/// The job name jaxlib registers its tasks under.
pub const JAX_JOB: &str = "jax_worker";

/// A read-only view of the shared part of the state.
#[derive(Clone, Copy, Debug)]
pub struct Cluster<'a> {
    pub(crate) config: Option<&'a ClusterConfig>,
    pub(crate) service_incarnation: u64,
    pub(crate) epoch: u64,
    /// The namespace's key ("" for the default one).
    pub(crate) namespace: &'a str,
    /// The namespace's bound on KV bytes (0: none).
    pub(crate) max_bytes: u64,
}

impl<'a> Cluster<'a> {
    /// The cluster configuration, if initialised.
    pub fn config(&self) -> Option<&'a ClusterConfig> {
        self.config
    }

    /// The service incarnation (0 before initialisation).
    pub fn service_incarnation(&self) -> u64 {
        self.service_incarnation
    }

    /// The job epoch, bumped by every `ResetJobEpoch`.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The namespace's name (`default` for the default one).
    pub fn namespace(&self) -> &'a str {
        crate::names::namespace_name(self.namespace)
    }

    /// Number of tasks in the configuration.
    pub fn task_count(&self) -> u32 {
        self.config
            .map_or(0, |c| c.jobs.iter().map(|j| j.count).sum())
    }

    /// Dense index of task `id` of job `job`.
    pub fn task_index(&self, job: &str, id: i32) -> Option<u32> {
        let mut offset = 0u32;
        for j in &self.config?.jobs {
            if j.name == job {
                return (id >= 0 && (id as u32) < j.count).then_some(offset + id as u32);
            }
            offset += j.count;
        }
        None
    }

    /// (job, task id) of a dense index.
    pub fn task_id(&self, index: u32) -> Option<(&'a str, i32)> {
        let mut offset = 0u32;
        for j in &self.config?.jobs {
            if index < offset + j.count {
                return Some((&j.name, (index - offset) as i32));
            }
            offset += j.count;
        }
        None
    }

    /// The TensorFlow-style name of a task: `/job:NAME/replica:0/task:ID`.
    pub fn task_name(&self, index: u32) -> String {
        match self.task_id(index) {
            Some((job, id)) => task_name(job, id),
            None => format!("/task_index:{index}"),
        }
    }

    /// How messages name a task: the bare id in a jaxlib-style cluster (one
    /// job named `jax_worker`, as jaxlib 0.12's service prints it), the
    /// TensorFlow name `/job:NAME/replica:0/task:ID` otherwise.
    pub fn label(&self, index: u32) -> String {
        let jax_style = self
            .config
            .is_some_and(|c| c.jobs.len() == 1 && c.jobs[0].name == JAX_JOB);
        match self.task_id(index) {
            Some((_, id)) if jax_style => id.to_string(),
            Some((job, id)) => task_name(job, id),
            None => index.to_string(),
        }
    }

    /// Whether the whole service is recoverable.
    pub(crate) fn recoverable(&self) -> bool {
        self.config.is_some_and(|c| c.recoverable)
    }

    /// Whether propagated errors are delivered to each task (TensorFlow's
    /// service) instead of through PollForError (XLA's).
    pub(crate) fn notify_tasks(&self) -> bool {
        self.config.is_some_and(|c| c.notify_tasks)
    }

    /// The configuration, or the default one before initialisation.
    pub(crate) fn cfg(&self) -> ClusterConfig {
        self.config.cloned().unwrap_or_default()
    }
}

/// `/job:NAME/replica:0/task:ID`, the TensorFlow spelling of a task.
pub fn task_name(job: &str, id: i32) -> String {
    format!("/job:{job}/replica:0/task:{id}")
}
