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

use journal::{coordination::TaskStatus, DomainError, State};
use proto::tf::coordination_service_client::CoordinationServiceClient;
use proto::tf::{CoordinatedTask, CoordinationServiceError, ReportErrorToTaskRequest};

/// Deadline of one ReportErrorToTask (upstream: 10 s).
pub const PUSH_DEADLINE: Duration = Duration::from_secs(10);
/// Attempts per notice before leaving it to the heartbeat reply.
pub const PUSH_ATTEMPTS: u32 = 3;

/// The leader's error pusher.
#[derive(Default)]
pub struct ErrorPusher {
    /// job name → task addresses by task id (from --tf-cluster-spec).
    addresses: BTreeMap<String, Vec<String>>,
    /// Notices pushed in this term: (task, incarnation).
    pushed: Mutex<HashSet<(u32, u64)>>,
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

    fn pushed(&self) -> std::sync::MutexGuard<'_, HashSet<(u32, u64)>> {
        self.pushed.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Forgets what was pushed (a new term: push the standing notices again).
    pub fn reset(&self) {
        self.pushed().clear();
    }

    /// Starts a push for every standing notice not pushed yet in this term.
    pub fn push_new_notices(&self, state: &State) {
        if self.addresses.is_empty() {
            return;
        }
        let todo = self.new_pushes(state);
        for p in todo {
            tokio::spawn(push(p));
        }
    }

    fn new_pushes(&self, state: &State) -> Vec<Push> {
        let mut pushed = self.pushed();
        let mut todo = Vec::new();
        for i in 0..state.task_count() {
            let Some(t) = state.coordination().task(i) else {
                continue;
            };
            let Some(notice) = t.notice.as_ref() else {
                continue;
            };
            if t.status() != TaskStatus::Connected || !pushed.insert((i, t.incarnation)) {
                continue;
            }
            let Some((job, id)) = state.task_id(i) else {
                continue;
            };
            let Some(address) = self
                .addresses
                .get(job)
                .and_then(|a| a.get(id as usize))
                .cloned()
            else {
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
fn report_request(state: &State, e: &DomainError) -> ReportErrorToTaskRequest {
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
