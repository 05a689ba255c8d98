//! A job whose tasks a test drives one by one over the `xla.coordination`
//! dialect (raw gRPC, as stock jaxlib sends it), in a namespace named by
//! header on a node's main port: register them all, report one task's
//! error, send some of them to a barrier and leave others out — the shapes
//! an operator's views must explain.

use std::time::Duration;

use proto::xla::coordination_service_client::CoordinationServiceClient;
use proto::xla::{BarrierRequest, RegisterTaskRequest, ReportErrorToServiceRequest};
use tokio::task::JoinHandle;
use tonic::transport::Channel;

use crate::{ns, wire};

type Client = CoordinationServiceClient<Channel>;

/// Tasks that share one HTTP/2 connection (a server takes a few hundred
/// streams on one connection at once).
const TASKS_PER_CONN: usize = 32;

/// A job of `n` tasks (job `jax_worker`) in namespace `ns`.
pub struct XlaJob {
    ns: String,
    clients: Vec<Client>,
    /// The service incarnation the tasks registered with.
    pub service_incarnation: u64,
}

impl XlaJob {
    fn client(&self, task: i32) -> Client {
        self.clients[task as usize / TASKS_PER_CONN % self.clients.len()].clone()
    }

    /// Registers tasks `0..n` of namespace `ns` through `addr`, all at once
    /// (the registration barrier holds each until all arrived).
    pub async fn register(addr: &str, namespace: &str, n: i32) -> XlaJob {
        let conns = (n as usize).div_ceil(TASKS_PER_CONN).max(1);
        let mut clients = Vec::new();
        for _ in 0..conns {
            clients.push(wire::xla(addr).await);
        }
        let mut job = XlaJob {
            ns: namespace.to_string(),
            clients,
            service_incarnation: 0,
        };
        let calls: Vec<JoinHandle<Result<u64, tonic::Status>>> = (0..n)
            .map(|t| {
                let mut c = job.client(t);
                let req = ns::request(
                    namespace,
                    RegisterTaskRequest {
                        incarnation: 1000 + t as u64,
                        source_task_id: t,
                    },
                );
                tokio::spawn(async move {
                    let r = c.register_task(req).await?;
                    Ok(r.into_inner().service_incarnation)
                })
            })
            .collect();
        for call in calls {
            job.service_incarnation = call.await.expect("join").expect("RegisterTask");
        }
        job
    }

    /// Task `task` reports an error (`message`) to the service.
    pub async fn report_error(&self, task: i32, message: &str) {
        let req = ReportErrorToServiceRequest {
            incarnations: wire::inc(task, self.service_incarnation),
            source_task_id: task,
            error_code: tonic::Code::Internal as i32,
            error_message: message.to_string(),
        };
        self.client(task)
            .report_error_to_service(ns::request(&self.ns, req))
            .await
            .expect("ReportErrorToService");
    }

    /// Sends each of `arriving` to barrier `id` (participants: `of`, empty
    /// for every task; no deadline but `timeout`); the calls stay parked
    /// until the barrier ends.
    pub fn arrive(
        &self,
        id: &str,
        arriving: impl IntoIterator<Item = i32>,
        of: &[i32],
        timeout: Duration,
    ) -> Vec<JoinHandle<Result<i64, tonic::Status>>> {
        arriving
            .into_iter()
            .map(|t| {
                let mut c = self.client(t);
                let req = ns::request(
                    &self.ns,
                    BarrierRequest {
                        incarnations: wire::inc(t, self.service_incarnation),
                        barrier_id: id.to_string(),
                        barrier_timeout_in_ms: timeout.as_millis() as i64,
                        task_ids: of.to_vec(),
                        source_task_id: t,
                        counter: 0,
                    },
                );
                tokio::spawn(async move { Ok(c.barrier(req).await?.into_inner().counter) })
            })
            .collect()
    }
}
