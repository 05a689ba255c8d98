//! Pushing propagated errors to TensorFlow tasks, part of the coordination
//! duty of the leader.
//!
//! TensorFlow's own service knows every task's address (the ClusterSpec) and
//! sends each CONNECTED task `ReportErrorToTask` as soon as an error is
//! propagated; the task's agent enters ERROR at once and the service keeps
//! the healthy task CONNECTED (`docs/protocols.md`, Error propagation). Here
//! the journal records which tasks an error was propagated to (each task's
//! `notice`, with `notify_tasks`); the leader pushes every notice it has not
//! pushed in its term, with a deadline per attempt and a few retries. A new
//! leader pushes the notices still standing again: an agent already in ERROR
//! ignores a second report, and a notice ends when its task registers again,
//! is reset or disconnects. Followers never push. A task whose push fails
//! for good still learns the error from its next heartbeat reply.

use std::collections::{BTreeMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;

use journal::{coordination::TaskStatus, DomainError, Namespace, State};
use proto::tf::coordination_service_client::CoordinationServiceClient;
use proto::tf::{CoordinatedTask, CoordinationServiceError, ReportErrorToTaskRequest};

/// Deadline of one ReportErrorToTask (upstream: 10 s).
pub const PUSH_DEADLINE: Duration = Duration::from_secs(10);
/// Attempts per notice before leaving it to the heartbeat reply.
pub const PUSH_ATTEMPTS: u32 = 3;

/// The leader's error pusher.
#[derive(Default)]
pub struct ErrorPusher {
    /// The default namespace's tasks: job name → task addresses by task id
    /// (from --tf-cluster-spec); other namespaces carry theirs in their spec.
    addresses: BTreeMap<String, Vec<String>>,
    /// Notices pushed in this term: (namespace key, task, incarnation).
    pushed: Mutex<HashSet<(String, u32, u64)>>,
}

/// One push to make.
struct Push {
    task: String,
    address: String,
    request: ReportErrorToTaskRequest,
}

impl ErrorPusher {
    /// A pusher for tasks at `addresses`; with none it never pushes.
    pub fn new(addresses: BTreeMap<String, Vec<String>>) -> Self {
        ErrorPusher {
            addresses,
            pushed: Mutex::default(),
        }
    }

    fn pushed(&self) -> std::sync::MutexGuard<'_, HashSet<(String, u32, u64)>> {
        self.pushed.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Forgets what was pushed (a new term: push the standing notices again).
    pub fn reset(&self) {
        self.pushed().clear();
    }

    /// Starts a push for every standing notice not pushed yet in this
    /// term, in every namespace that knows its tasks' addresses.
    pub fn push_new_notices(&self, state: &State) {
        // A deleted namespace's pushes are forgotten with it.
        self.pushed().retain(|(ns, _, _)| {
            state
                .namespace(journal::namespace::namespace_name(ns))
                .is_some()
        });
        for n in state.namespaces() {
            for p in self.new_pushes(n) {
                tokio::spawn(push(p));
            }
        }
    }

    /// The address of task `id` of `job` in namespace `n`.
    fn address(&self, n: &Namespace<'_>, job: &str, id: i32) -> Option<String> {
        let id = usize::try_from(id).ok()?;
        match n.spec() {
            None => self.addresses.get(job)?.get(id).cloned(),
            Some(spec) => spec.tf_addresses.get(job)?.addresses.get(id).cloned(),
        }
    }

    fn new_pushes(&self, state: Namespace<'_>) -> Vec<Push> {
        let has_addresses = match state.spec() {
            None => !self.addresses.is_empty(),
            Some(spec) => !spec.tf_addresses.is_empty(),
        };
        if !has_addresses {
            return Vec::new();
        }
        let mut pushed = self.pushed();
        let mut todo = Vec::new();
        let ns = state.key();
        for i in 0..state.task_count() {
            let Some(t) = state.coordination().task(i) else {
                continue;
            };
            let Some(notice) = t.notice.as_ref() else {
                continue;
            };
            if t.status() != TaskStatus::Connected
                || !pushed.insert((ns.to_string(), i, t.incarnation))
            {
                continue;
            }
            let Some((job, id)) = state.task_id(i) else {
                continue;
            };
            let Some(address) = self.address(&state, job, id) else {
                continue;
            };
            todo.push(Push {
                task: state.task_name(i),
                address,
                request: report_request(state, notice),
            });
        }
        todo
    }
}

/// The ReportErrorToTask TensorFlow's service sends for `e`.
fn report_request(state: Namespace<'_>, e: &DomainError) -> ReportErrorToTaskRequest {
    let source_task = e.source_task.and_then(|i| {
        state.task_id(i).map(|(job, id)| CoordinatedTask {
            job_name: job.to_string(),
            task_id: id,
            recoverable: false,
        })
    });
    ReportErrorToTaskRequest {
        error_code: e.code,
        error_message: e.message.clone(),
        error_payload: Some(CoordinationServiceError {
            is_reported_error: e.is_reported_error,
            source_task,
        }),
    }
}

async fn push(p: Push) {
    let mut backoff = Duration::from_millis(200);
    for attempt in 1..=PUSH_ATTEMPTS {
        match push_once(&p).await {
            Ok(()) => {
                tracing::info!(task = %p.task, address = %p.address, "pushed the propagated error");
                return;
            }
            Err(e) => {
                tracing::warn!(task = %p.task, address = %p.address, attempt, "ReportErrorToTask failed: {e}");
            }
        }
        if attempt < PUSH_ATTEMPTS {
            tokio::time::sleep(backoff).await;
            backoff *= 2;
        }
    }
}

async fn push_once(p: &Push) -> Result<(), String> {
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{}", p.address))
        .map_err(|e| e.to_string())?
        .connect_timeout(PUSH_DEADLINE)
        .timeout(PUSH_DEADLINE);
    let channel = tokio::time::timeout(PUSH_DEADLINE, endpoint.connect())
        .await
        .map_err(|_| "connect timed out".to_string())?
        .map_err(|e| e.to_string())?;
    CoordinationServiceClient::new(channel)
        .report_error_to_task(p.request.clone())
        .await
        .map(|_| ())
        .map_err(|s| format!("{:?}: {}", s.code(), s.message()))
}
