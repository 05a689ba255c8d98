//! The durable closure queue from Rust: a [`Coordinator`] schedules closures
//! (opaque bytes: the caller picks the encoding) and collects their results,
//! a [`Worker`] runs them. TensorFlow's `ClusterCoordinator` semantics
//! (`docs/protocols.md`, ClusterCoordinator closure queue semantics): a
//! closure runs at least once (a worker that dies has its closures put back
//! when its lease lapses), the first error is raised by the next
//! `schedule`, `join` or `done` and cancels what was queued. The
//! queue lives in the cluster, so a coordinator that dies loses nothing: a
//! new one [`Coordinator::attach`]es by name, lists what was scheduled under
//! its tag and fetches every result.
//!
//! ```no_run
//! # async fn demo() -> Result<(), agent::closures::Error> {
//! use std::time::Duration;
//! use agent::closures::{Coordinator, Worker, WorkError};
//!
//! let nodes = vec!["10.0.0.1:7470".to_string(), "10.0.0.2:7470".into(), "10.0.0.3:7470".into()];
//! let coordinator = Coordinator::create(&nodes, "train", None, "coordinator-0").await?;
//! let value = coordinator.schedule(b"step 1".to_vec()).await?;
//! coordinator.join().await?;
//! let result = value.fetch().await?;
//!
//! // In each worker process:
//! let worker = Worker::new(&nodes, "train", "worker-0")?;
//! worker
//!     .run(|closure| async move { Ok::<_, WorkError>(closure.payload.to_vec()) }, std::future::pending())
//!     .await?;
//! # let _ = result; Ok(()) }
//! ```

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use proto::coordstore::closure_queue_client::ClosureQueueClient;
use proto::coordstore::*;
use tokio::sync::oneshot;
use tonic::transport::Channel;
use tonic::Status;

pub use proto::coordstore::{ClosureError, ClosureInfo, ClosureStatus, QueueConfig};

use crate::endpoints::Endpoints;

/// How long calls keep trying other nodes through a failover.
const RETRY_FOR: Duration = Duration::from_secs(60);
/// How long one get, join or fetch call waits at the node.
const WAIT_STEP: Duration = Duration::from_secs(30);
/// Most closures one put or fetch call carries.
const MAX_BATCH: usize = 1000;
/// Most payload bytes one put call carries (a single larger closure goes
/// alone).
const MAX_BATCH_BYTES: usize = 4 << 20;

/// What a coordinator's call can fail with.
#[derive(Clone, Debug, thiserror::Error)]
pub enum Error {
    /// A scheduled closure failed: the queue's first error, raised once by
    /// this call (what was queued is cancelled).
    #[error("a closure failed: {}", .0.message)]
    Raised(ClosureError),
    /// The closure was cancelled (by an earlier error).
    #[error("closure {0} was cancelled")]
    Cancelled(u64),
    /// The call itself failed.
    #[error(transparent)]
    Status(#[from] Status),
}

/// A closure's outcome as `fetch` finds it.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// Not settled yet (pending, queued or running).
    Pending,
    /// Its result.
    Finished(Bytes),
    /// The error it raised.
    Failed(ClosureError),
    /// Cancelled by an earlier error.
    Cancelled,
}

fn client(ch: Channel) -> ClosureQueueClient<Channel> {
    ClosureQueueClient::new(ch)
        .max_decoding_message_size(1 << 30)
        .max_encoding_message_size(1 << 30)
}

fn outcome(r: FetchClosureResponse) -> Outcome {
    match r.status() {
        ClosureStatus::ClosureFinished => Outcome::Finished(r.result),
        ClosureStatus::ClosureFailed => Outcome::Failed(r.error.unwrap_or_default()),
        ClosureStatus::ClosureCancelled => Outcome::Cancelled,
        _ => Outcome::Pending,
    }
}

/// How many of `payloads` (at least one) go in one put.
fn batch_len<'a>(payloads: impl Iterator<Item = &'a Bytes>) -> usize {
    let mut bytes = 0;
    let mut n = 0;
    for p in payloads.take(MAX_BATCH) {
        bytes += p.len();
        if n > 0 && bytes > MAX_BATCH_BYTES {
            break;
        }
        n += 1;
    }
    n.max(1)
}

/// Where a queue lives: the cluster's nodes (HOST:PORT), the namespace
/// (`None`: the default one), and the TLS to dial them with (`None`:
/// plaintext).
#[derive(Clone, Copy)]
pub struct Nodes<'a> {
    /// Every node.
    pub addrs: &'a [String],
    /// The queue's namespace.
    pub namespace: Option<&'a str>,
    /// The client TLS (the nodes' CA, this client's certificate).
    pub tls: &'a Option<tonic::transport::ClientTlsConfig>,
}

impl<'a> Nodes<'a> {
    /// `addrs` in the default namespace, in plaintext.
    pub fn plain(addrs: &'a [String], namespace: Option<&'a str>) -> Nodes<'a> {
        const PLAIN: Option<tonic::transport::ClientTlsConfig> = None;
        Nodes {
            addrs,
            namespace,
            tls: &PLAIN,
        }
    }
}

/// One queue on a cluster.
#[derive(Clone)]
struct Queue {
    endpoints: Endpoints,
    name: String,
}

impl Queue {
    fn new(nodes: &Nodes<'_>, name: &str) -> Result<Queue, Status> {
        let endpoints = Endpoints::with_tls(nodes.addrs, RETRY_FOR, nodes.tls.clone())
            .and_then(|e| e.in_namespace(nodes.namespace))
            .map_err(Status::invalid_argument)?;
        Ok(Queue {
            endpoints,
            name: name.to_string(),
        })
    }

    async fn fetch_many(&self, ids: &[u64], wait: Duration) -> Result<Vec<Outcome>, Status> {
        let r = self
            .endpoints
            .call(
                FetchClosuresRequest {
                    queue: self.name.clone(),
                    closure_ids: ids.to_vec(),
                    timeout_ms: wait.as_millis() as u64,
                },
                |ch, req| async move { client(ch).fetch_many(req).await },
            )
            .await?;
        Ok(r.closures.into_iter().map(outcome).collect())
    }

    async fn fetch(&self, id: u64, wait: Duration) -> Result<Outcome, Status> {
        let r = self
            .endpoints
            .call(
                FetchClosureRequest {
                    queue: self.name.clone(),
                    closure_id: id,
                    timeout_ms: wait.as_millis() as u64,
                },
                |ch, req| async move { client(ch).fetch(req).await },
            )
            .await?;
        Ok(outcome(r))
    }
}

/// Schedules closures into a queue and collects their outcomes.
#[derive(Clone)]
pub struct Coordinator {
    q: Queue,
    tag: String,
    batch: Arc<Mutex<Batch>>,
}

type Scheduled = oneshot::Sender<Result<u64, Error>>;

/// `schedule` calls waiting for the put in flight to end (group commit: they
/// go together in the next put).
#[derive(Default)]
struct Batch {
    waiting: Vec<(Bytes, Scheduled)>,
    in_flight: bool,
}

impl Coordinator {
    /// Creates the queue `queue` with `config` (`None`: the defaults), or
    /// checks an existing one has it; closures scheduled here carry `tag`.
    pub async fn create(
        nodes: &[String],
        queue: &str,
        config: Option<QueueConfig>,
        tag: &str,
    ) -> Result<Coordinator, Error> {
        Self::create_in(nodes, None, queue, config, tag).await
    }

    /// [`Coordinator::create`] in namespace `namespace` (None: the default
    /// one).
    pub async fn create_in(
        nodes: &[String],
        namespace: Option<&str>,
        queue: &str,
        config: Option<QueueConfig>,
        tag: &str,
    ) -> Result<Coordinator, Error> {
        Self::create_at(&Nodes::plain(nodes, namespace), queue, config, tag).await
    }

    /// [`Coordinator::create`] at `nodes` (namespace, TLS).
    pub async fn create_at(
        nodes: &Nodes<'_>,
        queue: &str,
        config: Option<QueueConfig>,
        tag: &str,
    ) -> Result<Coordinator, Error> {
        let q = Queue::new(nodes, queue)?;
        q.endpoints
            .call(
                CreateQueueRequest {
                    queue: queue.to_string(),
                    config,
                },
                |ch, req| async move { client(ch).create_queue(req).await },
            )
            .await?;
        Ok(Coordinator {
            q,
            tag: tag.to_string(),
            batch: Arc::default(),
        })
    }

    /// Takes over the queue of a coordinator that died (same `tag` to find
    /// what it scheduled).
    pub async fn attach(nodes: &[String], queue: &str, tag: &str) -> Result<Coordinator, Error> {
        Self::create(nodes, queue, None, tag).await
    }

    /// `schedule`: queues a closure (waits while the queue is full). Raises
    /// the queue's first error, if any, instead (the closure is cancelled).
    ///
    /// Calls made while another put of this coordinator is in flight go
    /// together in the next put (one replicated write for all): when two or
    /// more of them meet the first error, the first raises it and the
    /// others answer [`Error::Cancelled`].
    pub async fn schedule(&self, payload: impl Into<Bytes>) -> Result<RemoteValue, Error> {
        let (tx, rx) = oneshot::channel();
        let lead = {
            let mut b = self.batch.lock().expect("schedule batch");
            b.waiting.push((payload.into(), tx));
            !std::mem::replace(&mut b.in_flight, true)
        };
        if lead {
            // A task of its own: a caller that gives up does not strand the
            // others.
            tokio::spawn(self.clone().put_waiting());
        }
        let id = rx
            .await
            .map_err(|_| Status::cancelled("the coordinator's put was dropped"))??;
        Ok(self.remote_value(id))
    }

    /// Puts what `schedule` calls left until none is left.
    async fn put_waiting(self) {
        loop {
            let batch = {
                let mut b = self.batch.lock().expect("schedule batch");
                if b.waiting.is_empty() {
                    b.in_flight = false;
                    return;
                }
                let n = batch_len(b.waiting.iter().map(|(p, _)| p));
                b.waiting.drain(..n).collect::<Vec<_>>()
            };
            let (payloads, senders): (Vec<Bytes>, Vec<Scheduled>) = batch.into_iter().unzip();
            match self.put(payloads).await {
                Ok((first, raised)) => {
                    for (i, tx) in senders.into_iter().enumerate() {
                        let id = first + i as u64;
                        let r = match (&raised, i) {
                            (Some(e), 0) => Err(Error::Raised(e.clone())),
                            (Some(_), _) => Err(Error::Cancelled(id)),
                            (None, _) => Ok(id),
                        };
                        let _ = tx.send(r);
                    }
                }
                Err(e) => {
                    for tx in senders {
                        let _ = tx.send(Err(e.clone().into()));
                    }
                }
            }
        }
    }

    /// One put of `payloads`: the first id, and the error it raised.
    async fn put(&self, mut payloads: Vec<Bytes>) -> Result<(u64, Option<ClosureError>), Status> {
        let more = payloads.split_off(1);
        let r = self
            .q
            .endpoints
            .call(
                PutClosureRequest {
                    queue: self.q.name.clone(),
                    payload: payloads.pop().unwrap_or_default(),
                    tag: self.tag.clone(),
                    more_payloads: more,
                },
                |ch, req| async move { client(ch).put(req).await },
            )
            .await?;
        Ok((r.closure_id, r.raised))
    }

    /// `schedule` of every payload, in order, in as few puts as their size
    /// allows. Raises the first error instead (what this call had not put
    /// yet is not scheduled; what it had is cancelled).
    pub async fn schedule_many(
        &self,
        payloads: impl IntoIterator<Item = impl Into<Bytes>>,
    ) -> Result<Vec<RemoteValue>, Error> {
        let mut payloads: Vec<Bytes> = payloads.into_iter().map(Into::into).collect();
        let mut out = Vec::with_capacity(payloads.len());
        while !payloads.is_empty() {
            let n = batch_len(payloads.iter());
            let rest = payloads.split_off(n);
            let (first, raised) = self.put(payloads).await?;
            if let Some(e) = raised {
                return Err(Error::Raised(e));
            }
            out.extend((first..first + n as u64).map(|id| self.remote_value(id)));
            payloads = rest;
        }
        Ok(out)
    }

    /// `fetch(values)`: waits for every result, in order; the first error
    /// among them (a closure's error, or [`Error::Cancelled`]).
    pub async fn fetch_all(&self, values: &[RemoteValue]) -> Result<Vec<Bytes>, Error> {
        let ids: Vec<u64> = values.iter().map(RemoteValue::id).collect();
        let mut out = Vec::with_capacity(ids.len());
        for chunk in ids.chunks(MAX_BATCH) {
            let outcomes = loop {
                let o = self.q.fetch_many(chunk, WAIT_STEP).await?;
                if !o.contains(&Outcome::Pending) {
                    break o;
                }
            };
            for (id, o) in chunk.iter().zip(outcomes) {
                out.push(match o {
                    Outcome::Finished(r) => r,
                    Outcome::Failed(e) => return Err(Error::Raised(e)),
                    Outcome::Cancelled | Outcome::Pending => return Err(Error::Cancelled(*id)),
                });
            }
        }
        Ok(out)
    }

    /// The outcomes of closures `ids` now, or once all are settled if that
    /// happens within `wait` (at most 1000 ids).
    pub async fn outcomes(&self, ids: &[u64], wait: Duration) -> Result<Vec<Outcome>, Error> {
        Ok(self.q.fetch_many(ids, wait).await?)
    }

    /// The handle of closure `id` (e.g. one found by [`Coordinator::scheduled`]).
    pub fn remote_value(&self, id: u64) -> RemoteValue {
        RemoteValue {
            q: self.q.clone(),
            id,
        }
    }

    /// `join`: waits until nothing is queued or running; raises the first
    /// error (once).
    pub async fn join(&self) -> Result<(), Error> {
        loop {
            let r = self
                .q
                .endpoints
                .call(
                    JoinQueueRequest {
                        queue: self.q.name.clone(),
                        timeout_ms: WAIT_STEP.as_millis() as u64,
                    },
                    |ch, req| async move { client(ch).join(req).await },
                )
                .await?;
            if let Some(e) = r.raised {
                return Err(Error::Raised(e));
            }
            if r.idle {
                return Ok(());
            }
        }
    }

    /// `done`: whether nothing is queued or running; raises the first error.
    pub async fn done(&self) -> Result<bool, Error> {
        let r = self
            .q
            .endpoints
            .call(
                DoneQueueRequest {
                    queue: self.q.name.clone(),
                },
                |ch, req| async move { client(ch).done(req).await },
            )
            .await?;
        match r.raised {
            Some(e) => Err(Error::Raised(e)),
            None => Ok(r.idle),
        }
    }

    /// Every closure scheduled under this coordinator's tag, in order.
    pub async fn scheduled(&self) -> Result<Vec<ClosureInfo>, Error> {
        let mut out = Vec::new();
        loop {
            let after = out.last().map_or(0, |c: &ClosureInfo| c.closure_id);
            let r = self
                .q
                .endpoints
                .call(
                    ListClosuresRequest {
                        queue: self.q.name.clone(),
                        tag: self.tag.clone(),
                        after_id: after,
                        limit: 0,
                    },
                    |ch, req| async move { client(ch).list(req).await },
                )
                .await?;
            if r.closures.is_empty() {
                return Ok(out);
            }
            out.extend(r.closures);
        }
    }

    /// Drops the records of settled closures (their results were fetched).
    pub async fn release(&self, ids: &[u64]) -> Result<u64, Error> {
        let r = self
            .q
            .endpoints
            .call(
                ReleaseClosuresRequest {
                    queue: self.q.name.clone(),
                    closure_ids: ids.to_vec(),
                },
                |ch, req| async move { client(ch).release(req).await },
            )
            .await?;
        Ok(r.released)
    }
}

/// The future result of a scheduled closure.
#[derive(Clone)]
pub struct RemoteValue {
    q: Queue,
    id: u64,
}

impl RemoteValue {
    /// The closure's id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The outcome now, or after waiting up to `wait` for it.
    pub async fn outcome(&self, wait: Duration) -> Result<Outcome, Error> {
        Ok(self.q.fetch(self.id, wait).await?)
    }

    /// `fetch`: waits for the result; the closure's error, or
    /// [`Error::Cancelled`].
    pub async fn fetch(&self) -> Result<Bytes, Error> {
        loop {
            match self.q.fetch(self.id, WAIT_STEP).await? {
                Outcome::Pending => continue,
                Outcome::Finished(r) => return Ok(r),
                Outcome::Failed(e) => return Err(Error::Raised(e)),
                Outcome::Cancelled => return Err(Error::Cancelled(self.id)),
            }
        }
    }
}

/// A closure handed to a worker.
#[derive(Clone, Debug)]
pub struct Closure {
    /// Its id.
    pub id: u64,
    /// What the coordinator scheduled.
    pub payload: Bytes,
    /// 1 for the first run, more after put-backs.
    pub attempt: u32,
    /// The coordinator's tag.
    pub tag: String,
}

/// How a worker's function ends a closure other than with a result.
#[derive(Debug, thiserror::Error)]
pub enum WorkError {
    /// The closure failed (the queue's first error wins).
    #[error("{}", .0.message)]
    Failed(ClosureError),
    /// The closure could not run here: put it back for another worker.
    #[error("put back")]
    PutBack,
}

/// Runs closures of one queue.
#[derive(Clone)]
pub struct Worker {
    q: Queue,
    name: String,
}

impl Worker {
    /// A worker named `name` (unique among the queue's workers) on `queue`.
    pub fn new(nodes: &[String], queue: &str, name: &str) -> Result<Worker, Status> {
        Self::new_in(nodes, None, queue, name)
    }

    /// [`Worker::new`] in namespace `namespace` (None: the default one).
    pub fn new_in(
        nodes: &[String],
        namespace: Option<&str>,
        queue: &str,
        name: &str,
    ) -> Result<Worker, Status> {
        Self::at(&Nodes::plain(nodes, namespace), queue, name)
    }

    /// [`Worker::new`] at `nodes` (namespace, TLS).
    pub fn at(nodes: &Nodes<'_>, queue: &str, name: &str) -> Result<Worker, Status> {
        Ok(Worker {
            q: Queue::new(nodes, queue)?,
            name: name.to_string(),
        })
    }

    /// `get`: the oldest queued closure, leased to this worker, waiting up
    /// to `wait` for one. Returns the lease too.
    pub async fn get(&self, wait: Duration) -> Result<Option<(Closure, Duration)>, Status> {
        let (mut got, lease) = self.get_many(1, wait).await?;
        Ok(got.pop().map(|c| (c, lease)))
    }

    /// Up to `max` of the oldest queued closures, all leased to this worker
    /// (a prefetch: if this worker dies, each runs again elsewhere), waiting
    /// up to `wait` for the first. Returns the lease too.
    pub async fn get_many(
        &self,
        max: u32,
        wait: Duration,
    ) -> Result<(Vec<Closure>, Duration), Status> {
        let r = self
            .q
            .endpoints
            .call(
                GetClosureRequest {
                    queue: self.q.name.clone(),
                    worker: self.name.clone(),
                    timeout_ms: wait.as_millis() as u64,
                    max_closures: max,
                },
                |ch, req| async move { client(ch).get(req).await },
            )
            .await?;
        let lease = Duration::from_millis(r.lease_ms);
        if !r.found {
            return Ok((Vec::new(), lease));
        }
        let first = Closure {
            id: r.closure_id,
            payload: r.payload,
            attempt: r.attempt,
            tag: r.tag,
        };
        let more = r.more.into_iter().map(|c| Closure {
            id: c.closure_id,
            payload: c.payload,
            attempt: c.attempt,
            tag: c.tag,
        });
        Ok((std::iter::once(first).chain(more).collect(), lease))
    }

    /// Extends the lease of every closure this worker holds.
    pub async fn renew(&self) -> Result<u64, Status> {
        let r = self
            .q
            .endpoints
            .call(
                RenewLeaseRequest {
                    queue: self.q.name.clone(),
                    worker: self.name.clone(),
                },
                |ch, req| async move { client(ch).renew(req).await },
            )
            .await?;
        Ok(r.renewed)
    }

    /// `mark_finished` with the result; false if the closure already had an
    /// outcome (the first is kept) or was cancelled.
    pub async fn finish(&self, id: u64, result: impl Into<Bytes>) -> Result<bool, Status> {
        let accepted = self.finish_many(vec![(id, result.into())]).await?;
        Ok(accepted.first().copied().unwrap_or(false))
    }

    /// `mark_finished` of several closures in one call, in order: whether
    /// each was accepted.
    pub async fn finish_many(&self, results: Vec<(u64, Bytes)>) -> Result<Vec<bool>, Status> {
        let mut all = results.into_iter();
        let Some((closure_id, result)) = all.next() else {
            return Ok(Vec::new());
        };
        let r = self
            .q
            .endpoints
            .call(
                FinishClosureRequest {
                    queue: self.q.name.clone(),
                    closure_id,
                    worker: self.name.clone(),
                    result,
                    more: all
                        .map(|(closure_id, result)| ClosureResult { closure_id, result })
                        .collect(),
                },
                |ch, req| async move { client(ch).finish(req).await },
            )
            .await?;
        Ok(std::iter::once(r.accepted).chain(r.more_accepted).collect())
    }

    /// `mark_failed`.
    pub async fn fail(&self, id: u64, error: ClosureError) -> Result<bool, Status> {
        let r = self
            .q
            .endpoints
            .call(
                FailClosureRequest {
                    queue: self.q.name.clone(),
                    closure_id: id,
                    worker: self.name.clone(),
                    error: Some(error),
                },
                |ch, req| async move { client(ch).fail(req).await },
            )
            .await?;
        Ok(r.accepted)
    }

    /// `put_back`.
    pub async fn put_back(&self, id: u64) -> Result<bool, Status> {
        let r = self
            .q
            .endpoints
            .call(
                PutBackClosureRequest {
                    queue: self.q.name.clone(),
                    closure_id: id,
                    worker: self.name.clone(),
                },
                |ch, req| async move { client(ch).put_back(req).await },
            )
            .await?;
        Ok(r.accepted)
    }

    /// Runs closures with `f` until `stop` completes: get, run (renewing
    /// the lease meanwhile), then finish, fail or put back.
    pub async fn run<F, Fut, R>(&self, f: F, stop: impl Future<Output = ()>) -> Result<(), Status>
    where
        F: Fn(Closure) -> Fut,
        Fut: Future<Output = Result<R, WorkError>>,
        R: Into<Bytes>,
    {
        self.run_prefetching(1, f, stop).await
    }

    /// [`Worker::run`], taking up to `prefetch` closures per get and
    /// finishing them in one call: fewer calls per closure, and up to
    /// `prefetch` re-runs elsewhere if this worker dies.
    pub async fn run_prefetching<F, Fut, R>(
        &self,
        prefetch: u32,
        f: F,
        stop: impl Future<Output = ()>,
    ) -> Result<(), Status>
    where
        F: Fn(Closure) -> Fut,
        Fut: Future<Output = Result<R, WorkError>>,
        R: Into<Bytes>,
    {
        tokio::pin!(stop);
        loop {
            let got = tokio::select! {
                _ = &mut stop => return Ok(()),
                got = self.get_many(prefetch.max(1), Duration::from_secs(5)) => got?,
            };
            let (closures, lease) = got;
            let renew_every = (lease / 3).max(Duration::from_millis(10));
            let mut finished = Vec::with_capacity(closures.len());
            let mut renew_at = tokio::time::Instant::now() + renew_every;
            for closure in closures {
                let id = closure.id;
                let work = f(closure);
                tokio::pin!(work);
                let outcome = loop {
                    tokio::select! {
                        out = &mut work => break out,
                        _ = tokio::time::sleep_until(renew_at) => {
                            renew_at += renew_every;
                            if let Err(e) = self.renew().await {
                                tracing::warn!("renewing the lease of closure {id}: {e}");
                            }
                        }
                    }
                };
                match outcome {
                    Ok(result) => finished.push((id, result.into())),
                    Err(WorkError::Failed(e)) => {
                        self.fail(id, e).await?;
                    }
                    Err(WorkError::PutBack) => {
                        self.put_back(id).await?;
                    }
                }
            }
            self.finish_many(finished).await?;
        }
    }
}
