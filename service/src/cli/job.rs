//! A job's shape and settings, as flags: the same struct for `coordstore
//! serve` (the default namespace's job) and `coordstore ctl ns create`
//! (another namespace's), so the two take the same flags with the same
//! meanings. Unset values default as `serve` documents.

use journal::pb::JobSpec;
use serde::Deserialize;

/// The job's shape (`--tasks` or `--job`) and its coordination settings.
#[derive(clap::Args, Deserialize, Default, Debug, Clone, PartialEq)]
#[serde(default)]
pub struct JobSettings {
    /// N tasks in job `jax_worker`, what jaxlib registers [serve: 1; ns
    /// create: give this or --job]
    #[arg(long, conflicts_with = "job")]
    pub tasks: Option<u32>,
    /// A TensorFlow-style job NAME=COUNT (repeatable; also NAME=COUNT,...)
    #[arg(long)]
    pub job: Vec<String>,
    /// A task whose heartbeats stop this long is set to ERROR [default: 100000]
    #[arg(long)]
    pub heartbeat_timeout_ms: Option<u64>,
    /// Registration barrier timeout; 0 = none [default: 3600000]
    #[arg(long)]
    pub register_timeout_ms: Option<u64>,
    /// Shutdown barrier timeout; 0 = no shutdown barrier [default: 300000]
    #[arg(long)]
    pub shutdown_timeout_ms: Option<u64>,
    /// RegisterTask waits for every task [default: true]
    #[arg(long)]
    pub register_with_barrier: Option<bool>,
    /// Tasks may reconnect with a new incarnation; errors are not propagated
    /// (`--recoverable` alone means true) [default: false]
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub recoverable: Option<bool>,
    /// Deliver a propagated error to each connected task as TensorFlow's
    /// service does (its heartbeat reply, and a ReportErrorToTask push when
    /// --tf-cluster-spec gives its address); the tasks stay CONNECTED. Off:
    /// XLA's PollForError delivery [default: true with --job, false with --tasks]
    #[arg(long)]
    pub notify_tasks: Option<bool>,
    /// The TensorFlow tasks' addresses, for pushing errors: the ClusterSpec
    /// JSON ({"worker": ["host:port", ...], ...}) or a whole TF_CONFIG
    /// ({"cluster": {...}, ...}), inline or as @FILE. Jobs not named by --job
    /// (the service's own entry, e.g. "ps") are ignored
    #[arg(long)]
    pub tf_cluster_spec: Option<String>,
    /// Most KV keys; 0 = no limit [serve: 0; ns create: none]
    #[arg(long)]
    pub max_keys: Option<u64>,
}

impl JobSettings {
    /// The TensorFlow-style jobs `--job` names, in order (none with
    /// `--tasks`).
    pub fn jobs(&self) -> Result<Vec<JobSpec>, String> {
        let mut jobs: Vec<JobSpec> = Vec::new();
        for spec in &self.job {
            for pair in spec.split(',').filter(|p| !p.trim().is_empty()) {
                let (name, count) = pair
                    .split_once('=')
                    .ok_or_else(|| format!("--job: expected NAME=COUNT, got '{pair}'"))?;
                let name = name.trim();
                let count: u32 = count
                    .trim()
                    .parse()
                    .map_err(|_| format!("--job {name}: bad count '{count}'"))?;
                if jobs.iter().any(|j| j.name == name) {
                    return Err(format!("--job {name} given twice"));
                }
                jobs.push(JobSpec {
                    name: name.to_string(),
                    count,
                });
            }
        }
        Ok(jobs)
    }

    /// These flags where set, else `other`'s (flags over a config file).
    pub fn over(self, other: JobSettings) -> JobSettings {
        JobSettings {
            tasks: self.tasks.or(other.tasks),
            job: if self.job.is_empty() {
                other.job
            } else {
                self.job
            },
            heartbeat_timeout_ms: self.heartbeat_timeout_ms.or(other.heartbeat_timeout_ms),
            register_timeout_ms: self.register_timeout_ms.or(other.register_timeout_ms),
            shutdown_timeout_ms: self.shutdown_timeout_ms.or(other.shutdown_timeout_ms),
            register_with_barrier: self.register_with_barrier.or(other.register_with_barrier),
            recoverable: self.recoverable.or(other.recoverable),
            notify_tasks: self.notify_tasks.or(other.notify_tasks),
            tf_cluster_spec: self.tf_cluster_spec.or(other.tf_cluster_spec),
            max_keys: self.max_keys.or(other.max_keys),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(clap::Parser)]
    struct Flags {
        #[command(flatten)]
        job: JobSettings,
    }

    fn parse(args: &[&str]) -> JobSettings {
        Flags::try_parse_from(std::iter::once("x").chain(args.iter().copied()))
            .unwrap()
            .job
    }

    #[test]
    fn jobs_are_named_once_each_in_one_flag_or_many() {
        let j = parse(&["--job", "worker=2,ps=1", "--job", "chief=1"]);
        let names: Vec<_> = j.jobs().unwrap().into_iter().map(|j| j.name).collect();
        assert_eq!(names, ["worker", "ps", "chief"]);
        let twice = parse(&["--job", "worker=2", "--job", "worker=3"]);
        assert!(twice.jobs().unwrap_err().contains("given twice"));
        assert!(parse(&["--job", "worker"]).jobs().is_err());
        assert!(parse(&["--tasks", "2"]).jobs().unwrap().is_empty());
    }

    #[test]
    fn recoverable_alone_or_with_a_value() {
        assert_eq!(parse(&["--recoverable"]).recoverable, Some(true));
        assert_eq!(parse(&["--recoverable", "false"]).recoverable, Some(false));
        assert_eq!(parse(&[]).recoverable, None);
    }
}
