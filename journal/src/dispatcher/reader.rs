//! The dispatcher area, read-only: datasets, jobs, iterations, tasks,
//! workers and clients, and what a call or the leader runtime reads of them.

use super::*;

/// The dispatcher area, read-only.
#[derive(Clone, Copy, Debug)]
pub struct Reader<'a> {
    pub(crate) data: &'a Data,
}

impl<'a> Reader<'a> {
    /// A dataset.
    pub fn dataset(&self, id: &str) -> Option<&'a Dataset> {
        self.data.datasets.get(id)
    }

    /// A job.
    pub fn job(&self, id: i64) -> Option<&'a Job> {
        self.data.jobs.get(&id)
    }

    /// An iteration.
    pub fn iteration(&self, id: i64) -> Option<&'a Iteration> {
        self.data.iterations.get(&id)
    }

    /// The iteration an iteration client reads.
    pub fn client_iteration(&self, client: i64) -> Option<&'a Iteration> {
        self.iteration(*self.data.clients.get(&client)?)
    }

    /// A task.
    pub fn task(&self, id: i64) -> Option<&'a Task> {
        self.data.tasks.get(&id)
    }

    /// A worker.
    pub fn worker(&self, address: &str) -> Option<&'a Worker> {
        self.data.workers.get(address)
    }

    /// Every worker, by address.
    pub fn workers(&self) -> impl Iterator<Item = &'a Worker> + 'a {
        self.data.workers.values()
    }

    /// Every dataset, by id.
    pub fn datasets(&self) -> impl Iterator<Item = &'a Dataset> + 'a {
        self.data.datasets.values()
    }

    /// Every job, by id.
    pub fn jobs(&self) -> impl Iterator<Item = &'a Job> + 'a {
        self.data.jobs.values()
    }

    /// Every iteration, by id.
    pub fn iterations(&self) -> impl Iterator<Item = &'a Iteration> + 'a {
        self.data.iterations.values()
    }

    /// Every task, by id.
    pub fn tasks(&self) -> impl Iterator<Item = &'a Task> + 'a {
        self.data.tasks.values()
    }

    /// Every iteration client with its iteration id.
    pub fn clients(&self) -> impl Iterator<Item = (i64, i64)> + 'a {
        self.data.clients.iter().map(|(c, i)| (*c, *i))
    }

    /// The tasks of an iteration, in creation order.
    pub fn iteration_tasks(&self, iteration: &Iteration) -> Vec<&'a Task> {
        let tasks = &self.data.tasks;
        iteration
            .tasks
            .iter()
            .filter_map(|t| tasks.get(t))
            .collect()
    }

    /// The tasks a worker runs (unfinished, not removed; pending ones
    /// included), by id.
    pub fn worker_tasks(&self, address: &str) -> Vec<&'a Task> {
        self.data
            .tasks
            .values()
            .filter(|t| t.worker_address == address && !t.finished && !t.removed)
            .collect()
    }

    /// The running coordinated reads a worker has no live task of (a new
    /// worker, or one whose task was removed): each gets a pending task.
    pub(super) fn coordinated_reads_without(&self, address: &str) -> Vec<i64> {
        let mine: Vec<i64> = self
            .worker_tasks(address)
            .iter()
            .map(|t| t.iteration_id)
            .collect();
        self.data
            .iterations
            .values()
            .filter(|it| !it.finished && !it.garbage_collected)
            .filter(|it| {
                self.data
                    .jobs
                    .get(&it.job_id)
                    .is_some_and(|j| j.num_consumers.is_some())
            })
            .filter(|it| !mine.contains(&it.id))
            .map(|it| it.id)
            .collect()
    }

    /// The round a coordinated read's clients are told to block at: the
    /// front pending task's target.
    pub fn block_round(&self, iteration: &Iteration) -> Option<i64> {
        iteration.pending.first().map(|p| p.target_round)
    }

    /// What GetOrCreateJob answers for a name that exists: its id when the
    /// parameters match, INVALID_ARGUMENT when not; `None` for an
    /// anonymous job or a new name (the command creates it). Lets the
    /// service answer a repeated GetOrCreateJob without proposing.
    pub fn existing_job(
        &self,
        c: &pb::dispatcher::GetOrCreateJob,
    ) -> Option<Result<i64, crate::DomainError>> {
        let name = c.job_name.as_ref()?;
        let job = self.job(*self.data.jobs_by_name.get(name)?)?;
        let mismatch = if job.sharding_policy != c.sharding_policy {
            Some(format!(
                "existing sharding policy {}, requested {}",
                job.sharding_policy, c.sharding_policy
            ))
        } else if job.use_cross_trainer_cache != c.use_cross_trainer_cache {
            Some(format!(
                "existing cross-trainer cache {}, requested {}",
                job.use_cross_trainer_cache, c.use_cross_trainer_cache
            ))
        } else if job.target_workers != c.target_workers {
            Some(format!(
                "existing target workers {}, requested {}",
                job.target_workers, c.target_workers
            ))
        } else {
            None
        };
        Some(match mismatch {
            Some(what) => Err(errors::job_mismatch(name, &what)),
            None => Ok(job.id),
        })
    }

    /// Whether a worker heartbeat would change the state (an unknown
    /// worker, or new transfer servers, tags or uid): only then is it
    /// proposed.
    pub fn worker_heartbeat_changes(&self, hb: &pb::dispatcher::WorkerHeartbeat) -> bool {
        match self.worker(&hb.address) {
            None => true,
            Some(w) => {
                w.transfer_servers != hb.transfer_servers
                    || w.tags != hb.tags
                    || w.uid != hb.uid
                    || !self.coordinated_reads_without(&hb.address).is_empty()
            }
        }
    }
}
