//! The dispatcher's commands, applied: datasets registered, jobs and
//! iterations made, tasks for workers, splits handed out, clients heard.

use super::*;

/// The dispatcher area while a command applies.
pub(super) struct Writer<'a, 'c> {
    pub(super) data: &'a mut Data,
    pub(super) cx: &'a mut Context<'c>,
}

impl Writer<'_, '_> {
    pub(super) fn register_dataset(&mut self, c: &pb::dispatcher::RegisterDataset) -> Outcome {
        if c.definition.len() > MAX_DATASET_DEF_BYTES {
            return Outcome::err(errors::dataset_too_large(
                c.definition.len(),
                MAX_DATASET_DEF_BYTES,
            ));
        }
        if let Some(id) = &c.requested_id {
            if let Some(d) = self.data.datasets.get(id) {
                if d.metadata != c.metadata {
                    return Outcome::err(errors::dataset_mismatch(id));
                }
                return reply(Reply::DatasetId(id.clone()));
            }
            if let Ok(n) = id.parse::<i64>() {
                if n >= self.data.next_dataset_id {
                    self.data.next_dataset_id = n.saturating_add(1);
                }
            }
            self.insert_dataset(id.clone(), c);
            return reply(Reply::DatasetId(id.clone()));
        }
        let content = content_key(c);
        if let Some(id) = self.data.datasets_by_content.get(&content) {
            return reply(Reply::DatasetId(id.clone()));
        }
        let id = loop {
            let id = draw(&mut self.data.next_dataset_id, FIRST_DATASET_ID).to_string();
            if !self.data.datasets.contains_key(&id) {
                break id;
            }
        };
        self.data.datasets_by_content.insert(content, id.clone());
        self.insert_dataset(id.clone(), c);
        reply(Reply::DatasetId(id))
    }

    pub(super) fn insert_dataset(&mut self, id: String, c: &pb::dispatcher::RegisterDataset) {
        self.data.datasets.insert(
            id.clone(),
            Dataset {
                id,
                definition: c.definition.clone(),
                metadata: c.metadata.clone(),
                compression: c.compression,
                compression_disabled: None,
            },
        );
    }

    pub(super) fn get_or_create_job(&mut self, c: &pb::dispatcher::GetOrCreateJob) -> Outcome {
        // As upstream: an existing name is checked first (its parameters
        // never change), then what a new job needs.
        if let Some(existing) = (Reader { data: self.data }).existing_job(c) {
            return match existing {
                Ok(id) => reply(Reply::JobId(id)),
                Err(e) => Outcome::err(e),
            };
        }
        if !self.data.datasets.contains_key(&c.dataset_id) {
            return Outcome::err(errors::dataset_not_found(&c.dataset_id));
        }
        if c.sharding_policy == SHARDING_DYNAMIC && c.split_source.is_none() {
            return Outcome::err(errors::dynamic_without_source());
        }
        let id = draw(&mut self.data.next_job_id, FIRST_JOB_ID);
        let name = c
            .job_name
            .clone()
            .unwrap_or_else(|| format!("anonymous_job_{id}_{}", c.anonymous_suffix));
        self.data.jobs_by_name.insert(name.clone(), id);
        self.data.jobs.insert(
            id,
            Job {
                id,
                name,
                dataset_id: c.dataset_id.clone(),
                sharding_policy: c.sharding_policy,
                num_consumers: c.num_consumers,
                use_cross_trainer_cache: c.use_cross_trainer_cache,
                target_workers: c.target_workers,
                split_source: c
                    .split_source
                    .filter(|_| c.sharding_policy == SHARDING_DYNAMIC),
            },
        );
        reply(Reply::JobId(id))
    }

    pub(super) fn get_or_create_iteration(&mut self, job_id: i64, repetition: i64) -> Outcome {
        if !self.data.jobs.contains_key(&job_id) {
            return Outcome::err(errors::job_not_found(job_id));
        }
        let key = iteration_key(job_id, repetition);
        let existing = self
            .data
            .iterations_by_key
            .get(&key)
            .filter(|id| {
                self.data
                    .iterations
                    .get(id)
                    .is_some_and(|it| !it.garbage_collected)
            })
            .copied();
        let (iteration_id, created) = match existing {
            Some(id) => (id, false),
            None => {
                let id = draw(&mut self.data.next_iteration_id, FIRST_ITERATION_ID);
                let dynamic = self.data.jobs.get(&job_id).and_then(|j| j.split_source);
                let workers: Vec<String> = self.data.workers.keys().cloned().collect();
                let tasks = workers
                    .into_iter()
                    .map(|w| self.create_task(id, w))
                    .collect();
                self.data.iterations.insert(
                    id,
                    Iteration {
                        id,
                        job_id,
                        repetition,
                        tasks,
                        split_provider: dynamic.map(|_| pb::dispatcher::SplitProvider::default()),
                        ..Default::default()
                    },
                );
                self.data.iterations_by_key.insert(key, id);
                (id, true)
            }
        };
        let client_id = draw(&mut self.data.next_client_id, FIRST_CLIENT_ID);
        self.data.clients.insert(client_id, iteration_id);
        if let Some(it) = self.data.iterations.get_mut(&iteration_id) {
            it.num_clients += 1;
        }
        reply(Reply::IterationClient(AcquiredClient {
            client_id,
            iteration_id,
            created,
        }))
    }

    pub(super) fn create_task(&mut self, iteration_id: i64, worker_address: String) -> i64 {
        let id = draw(&mut self.data.next_task_id, FIRST_TASK_ID);
        self.data.tasks.insert(
            id,
            Task {
                id,
                iteration_id,
                worker_address,
                finished: false,
                starting_round: 0,
                removed: false,
            },
        );
        id
    }

    pub(super) fn release_iteration_client(&mut self, client: i64) -> Outcome {
        let Some(iteration) = self.data.clients.remove(&client) else {
            return Outcome::err(errors::client_not_found(client));
        };
        if let Some(it) = self.data.iterations.get_mut(&iteration) {
            it.num_clients = (it.num_clients - 1).max(0);
            it.last_released_ms = self.cx.at_ms.max(1);
        }
        Outcome::ok()
    }

    pub(super) fn worker_heartbeat(&mut self, hb: &pb::dispatcher::WorkerHeartbeat) -> Outcome {
        let known = self.data.workers.contains_key(&hb.address);
        // Coordinated reads take a worker in through a pending task (new,
        // or back after its task was removed).
        let coordinated = Reader { data: self.data }.coordinated_reads_without(&hb.address);
        self.data.workers.insert(
            hb.address.clone(),
            Worker {
                address: hb.address.clone(),
                transfer_servers: hb.transfer_servers.clone(),
                tags: hb.tags.clone(),
                uid: hb.uid,
            },
        );
        if !known {
            // A new worker gets a task of every running iteration that is
            // not a coordinated read (those need the pending-task protocol).
            let running: Vec<i64> = self
                .data
                .iterations
                .values()
                .filter(|it| !it.finished && !it.garbage_collected)
                .filter(|it| {
                    self.data
                        .jobs
                        .get(&it.job_id)
                        .is_some_and(|j| j.num_consumers.is_none())
                })
                .map(|it| it.id)
                .collect();
            for iteration in running {
                let task = self.create_task(iteration, hb.address.clone());
                if let Some(it) = self.data.iterations.get_mut(&iteration) {
                    it.tasks.push(task);
                }
            }
        }
        for iteration in coordinated {
            let task = self.create_task(iteration, hb.address.clone());
            if let Some(it) = self.data.iterations.get_mut(&iteration) {
                it.pending.push(pb::dispatcher::PendingTask {
                    task_id: task,
                    target_round: 1,
                    ready_consumers: Vec::new(),
                    failures: 0,
                });
            }
        }
        let ids = Reader { data: self.data }
            .worker_tasks(&hb.address)
            .iter()
            .map(|t| t.id)
            .collect();
        reply(Reply::WorkerTasks(TaskIds { ids }))
    }

    pub(super) fn finish_tasks(&mut self, ids: &[i64]) -> Outcome {
        for id in ids {
            let Some(task) = self.data.tasks.get_mut(id) else {
                continue;
            };
            if task.finished {
                continue;
            }
            task.finished = true;
            let iteration = task.iteration_id;
            let tasks = &self.data.tasks;
            if let Some(it) = self.data.iterations.get_mut(&iteration) {
                if it
                    .tasks
                    .iter()
                    .all(|t| tasks.get(t).is_none_or(|t| t.finished))
                {
                    it.finished = true;
                }
            }
        }
        Outcome::ok()
    }

    pub(super) fn disable_compression(&mut self, dataset: &str, disable: bool) -> Outcome {
        let Some(d) = self.data.datasets.get_mut(dataset) else {
            return Outcome::err(errors::dataset_not_found(dataset));
        };
        if d.compression != COMPRESSION_SNAPPY {
            return reply(Reply::NoCompressionToDisable(true));
        }
        let decision = *d.compression_disabled.get_or_insert(disable);
        reply(Reply::CompressionDisabled(decision))
    }

    /// Hands out the next split of a DYNAMIC iteration (upstream's
    /// `GetSplit` + `ProduceSplitUpdate`, decided here so every replica
    /// agrees on which split went out).
    pub(super) fn produce_split(&mut self, c: &pb::dispatcher::ProduceSplit) -> Outcome {
        let Some(it) = self.data.iterations.get_mut(&c.iteration_id) else {
            return Outcome::err(errors::iteration_not_found(c.iteration_id));
        };
        let source = self.data.jobs.get(&it.job_id).and_then(|j| j.split_source);
        let (Some(source), Some(p)) = (source, it.split_provider.as_mut()) else {
            return Outcome::err(errors::not_dynamic(c.iteration_id));
        };
        if c.provider_index != 0 {
            return Outcome::err(errors::bad_split_provider(c.provider_index));
        }
        let end = || {
            reply(Reply::Split(pb::dispatcher::Split {
                value: 0,
                end_of_splits: true,
            }))
        };
        if c.repetition < p.repetition {
            return end();
        }
        if c.repetition > p.repetition {
            p.repetition = c.repetition;
            p.next = 0;
        }
        if p.next >= source.count {
            // The repetition is over: the next one starts afresh.
            p.repetition += 1;
            p.next = 0;
            return end();
        }
        let value = source
            .start
            .saturating_add(p.next.saturating_mul(source.step));
        p.next += 1;
        reply(Reply::Split(pb::dispatcher::Split {
            value,
            end_of_splits: false,
        }))
    }

    /// The round-robin protocol's decision on the front pending task of the
    /// client's iteration (upstream's ClientHeartbeatUpdate).
    pub(super) fn client_heartbeat(&mut self, c: &pb::dispatcher::ClientHeartbeat) -> Outcome {
        let client = c.iteration_client_id;
        let Some(&iteration) = self.data.clients.get(&client) else {
            return Outcome::err(errors::unknown_client(client));
        };
        let consumers = self
            .data
            .iterations
            .get(&iteration)
            .and_then(|it| self.data.jobs.get(&it.job_id))
            .and_then(|j| j.num_consumers)
            .unwrap_or(1);
        let Some(it) = self.data.iterations.get_mut(&iteration) else {
            return Outcome::ok();
        };
        let Some(front) = it.pending.first_mut() else {
            return Outcome::ok();
        };
        if let Some(current) = c.current_round {
            if current >= front.target_round {
                // Too late for this round: aim further ahead, twice as far
                // each time, and start collecting acceptances again.
                let delta = 2i64.saturating_mul(1i64 << front.failures.clamp(0, 30));
                front.target_round = current.saturating_add(delta);
                front.failures += 1;
                front.ready_consumers.clear();
                return Outcome::ok();
            }
        }
        if let Some(blocked) = c.blocked_round {
            if blocked <= front.target_round && !front.ready_consumers.contains(&client) {
                front.ready_consumers.push(client);
            }
        }
        if front.ready_consumers.len() as i64 >= consumers {
            let promoted = it.pending.remove(0);
            it.tasks.push(promoted.task_id);
            if let Some(t) = self.data.tasks.get_mut(&promoted.task_id) {
                t.starting_round = promoted.target_round;
            }
        }
        Outcome::ok()
    }

    /// MaybeRemoveTask after every consumer asked: the task leaves its
    /// iteration and its worker.
    pub(super) fn remove_task(&mut self, task_id: i64) -> Outcome {
        let Some(task) = self.data.tasks.get_mut(&task_id) else {
            return Outcome::ok();
        };
        if task.removed {
            return Outcome::ok();
        }
        task.removed = true;
        let iteration = task.iteration_id;
        if let Some(it) = self.data.iterations.get_mut(&iteration) {
            it.tasks.retain(|t| *t != task_id);
            it.pending.retain(|p| p.task_id != task_id);
        }
        Outcome::ok()
    }

    pub(super) fn garbage_collect_iteration(&mut self, id: i64, released_at_ms: u64) -> Outcome {
        let Some(it) = self.data.iterations.get_mut(&id) else {
            return Outcome::ok();
        };
        // DYNAMIC iterations are never collected (upstream's default,
        // gc_dynamic_sharding_jobs = false): a new one would hand out every
        // split again.
        if it.split_provider.is_some() {
            return Outcome::ok();
        }
        let idle = it.num_clients == 0 && it.last_released_ms != 0;
        if it.finished || it.garbage_collected || !idle || it.last_released_ms != released_at_ms {
            return Outcome::ok();
        }
        it.finished = true;
        it.garbage_collected = true;
        let tasks = it.tasks.clone();
        for t in tasks {
            if let Some(task) = self.data.tasks.get_mut(&t) {
                task.finished = true;
            }
        }
        Outcome::ok()
    }
}

/// The content key of a definition and its metadata (deduplication).
pub(super) fn content_key(c: &pb::dispatcher::RegisterDataset) -> String {
    let mut h = Sha256::new();
    h.update((c.definition.len() as u64).to_le_bytes());
    h.update(&c.definition);
    h.update(&c.metadata);
    h.update(c.compression.to_le_bytes());
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}
