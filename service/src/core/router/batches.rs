//! A follower's forwarded proposals, batched: each client write that
//! arrives on a follower is proposed by the leader. At most
//! [`CALLS_IN_FLIGHT`] calls to the leader are out at once: a proposal
//! that finds a call slot free and none waiting goes at once as the
//! single `Propose` it stands for (a lone write pays what it did before
//! batching), and proposals that arrive while every slot is taken wait,
//! and one `ProposeBatch` call carries every proposal waiting when it goes
//! out. A thousand concurrent writes therefore take a few calls, not a
//! thousand HTTP/2 streams, each with its headers, its task on the leader
//! and its wake-ups. Each proposal in a batch is admitted, proposed and
//! answered on the leader exactly as its own `Propose` would be: its
//! origin, namespace and deadline travel with it ([`item_headers`]), and
//! its answer or gRPC status comes back in order. A leader of a build
//! before batches answers UNIMPLEMENTED; the batch then goes as one
//! `Propose` per proposal, and the follower sends single proposals for a
//! while ([`UNBATCHED_FOR`]).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use proto::coordstore::node_peer_client::NodePeerClient;
use proto::coordstore::{
    ForwardedProposal, ProposeAnswer, ProposeBatchRequest, ProposeRequest, ProposeResponse,
    StatusHeader,
};
use raft::{LeaderView, RaftNode};
use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::transport::Channel;
use tonic::{Code, Status};

use super::forwarding::{forwarded, peer_call};
use super::Router;
use crate::core::call::{wire_origin, Call, ORIGIN_HEADER};

/// Calls out at once from one follower (a proposal sent alone, or a batch).
pub const CALLS_IN_FLIGHT: usize = 4;

/// Most proposals in one batch (the leader refuses more).
pub const MOST_PER_BATCH: usize = 1024;

/// How long a follower sends single proposals after a leader answered a
/// batch UNIMPLEMENTED (a rolling upgrade's older leader).
const UNBATCHED_FOR: Duration = Duration::from_secs(10);

/// What a proposal's forward is answered with.
type Answer = Result<ProposeResponse, Status>;

/// The proposals waiting to go, and the batches out.
#[derive(Default)]
pub(super) struct ProposeBatches {
    queue: Mutex<Queue>,
}

#[derive(Default)]
struct Queue {
    /// Calls out: proposals sent alone and senders (each sends the next
    /// batch when its own returns).
    out: usize,
    /// The leader as the newest waiting proposal found it.
    leader: Option<(Channel, LeaderView)>,
    waiting: Vec<(ForwardedProposal, tokio::sync::oneshot::Sender<Answer>)>,
    /// Until when proposals go one by one.
    unbatched_until: Option<Instant>,
}

type Batch = (
    (Channel, LeaderView),
    Vec<(ForwardedProposal, tokio::sync::oneshot::Sender<Answer>)>,
);

impl ProposeBatches {
    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The next batch (at most [`MOST_PER_BATCH`] proposals and about
    /// `bytes` of them), or `None`, one sender fewer, when none waits.
    fn next_batch(&self, bytes: usize) -> Option<Batch> {
        let mut q = self.lock();
        let leader = match q.leader.clone() {
            Some(l) if !q.waiting.is_empty() => l,
            _ => {
                q.out -= 1;
                return None;
            }
        };
        let (mut n, mut size) = (0, 0);
        for (p, _) in &q.waiting {
            if n == MOST_PER_BATCH || (n > 0 && size + p.update.len() > bytes) {
                break;
            }
            size += p.update.len();
            n += 1;
        }
        let rest = q.waiting.split_off(n);
        Some((leader, std::mem::replace(&mut q.waiting, rest)))
    }

    /// Whether proposals go one by one now.
    fn unbatched(&self) -> bool {
        self.lock()
            .unbatched_until
            .is_some_and(|t| Instant::now() < t)
    }
}

/// What a batch's sender task needs of the router.
#[derive(Clone)]
struct Sender {
    batches: Arc<ProposeBatches>,
    /// Proposals per batch sent.
    sizes: prometheus::Histogram,
    node: Arc<RaftNode>,
    max_message_bytes: usize,
    /// How long one batch may wait on one leader.
    wait: Duration,
}

impl Router {
    /// Proposal `update` of `call` forwarded to the leader at `ch`: alone
    /// when a call slot is free and none waits, else in the next batch
    /// (see the module).
    pub(super) async fn forward_proposal(&self, ch: Channel, call: &Call, update: Bytes) -> Answer {
        let item = proposal(call, update);
        let sender = Sender {
            batches: self.batches.clone(),
            sizes: self.metrics.forward_batches.clone(),
            node: self.node().clone(),
            max_message_bytes: self.max_message_bytes,
            wait: self.attempt.min(self.leader_wait),
        };
        if self.batches.unbatched() {
            return sender.propose_one(ch, item).await;
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        let view = self.node().leader_view();
        let start = {
            let mut q = self.batches.lock();
            let free = q.out < CALLS_IN_FLIGHT;
            q.out += usize::from(free);
            if free && q.waiting.is_empty() {
                None
            } else {
                q.waiting.push((item.clone(), tx));
                q.leader = Some((ch.clone(), view));
                Some(free)
            }
        };
        match start {
            // A call slot free and nothing waiting: this proposal goes at
            // once, alone, as the single Propose it stands for.
            None => {
                let _slot = Slot(sender.clone());
                return sender.propose_one(ch, item).await;
            }
            Some(true) => {
                tokio::spawn(sender.run());
            }
            Some(false) => {}
        }
        rx.await
            .map_err(|_| Status::unavailable("the batch to the leader stopped"))?
    }
}

/// A call slot taken by a proposal sent alone: given back when the call
/// ends (or its caller stops waiting), and handed to a new sender if
/// proposals wait meanwhile.
struct Slot(Sender);

impl Drop for Slot {
    fn drop(&mut self) {
        let mut q = self.0.batches.lock();
        if q.waiting.is_empty() {
            q.out -= 1;
        } else {
            drop(q);
            tokio::spawn(self.0.clone().run());
        }
    }
}

impl Sender {
    /// One sender: batches until none waits.
    async fn run(self) {
        let bytes = self.max_message_bytes / 4;
        while let Some(((ch, view), batch)) = self.batches.next_batch(bytes) {
            let (items, txs): (Vec<_>, Vec<_>) = batch.into_iter().unzip();
            self.sizes.observe(items.len() as f64);
            let answers = self.send_batch(ch, view, items).await;
            for (tx, a) in txs.into_iter().zip(answers) {
                let _ = tx.send(a);
            }
        }
    }

    /// Sends `items` to the leader at `ch` (found in `view`) as one batch:
    /// each one's answer. The batch ends as a forward does (a leader
    /// change, the forward attempt).
    async fn send_batch(
        &self,
        ch: Channel,
        view: LeaderView,
        items: Vec<ForwardedProposal>,
    ) -> Vec<Answer> {
        let n = items.len();
        let max = self.max_message_bytes;
        let req = forwarded(ProposeBatchRequest {
            proposals: items.clone(),
        });
        let mut client = NodePeerClient::new(ch.clone())
            .max_decoding_message_size(max)
            .max_encoding_message_size(max);
        let r = tokio::select! {
            biased;
            r = tokio::time::timeout(self.wait, client.propose_batch(req)) => match r {
                Ok(r) => r,
                Err(_) => Err(Status::unavailable("the leader did not answer in time")),
            },
            () = self.node.leader_moved(view) => {
                Err(Status::unavailable("the leader changed during the batch"))
            }
        };
        match r {
            Ok(reply) => {
                let answers = reply.into_inner().answers;
                if answers.len() != n {
                    let e = format!("the leader answered {} of {n} proposals", answers.len());
                    return vec![Err(Status::internal(e)); n];
                }
                answers.into_iter().map(answer_of).collect()
            }
            Err(s) if s.code() == Code::Unimplemented => {
                self.batches.lock().unbatched_until = Some(Instant::now() + UNBATCHED_FOR);
                let singles = items.into_iter().map(|p| self.propose_one(ch.clone(), p));
                futures_util::future::join_all(singles).await
            }
            Err(s) => vec![Err(s); n],
        }
    }

    /// `item` as a `Propose` of its own.
    async fn propose_one(&self, ch: Channel, item: ForwardedProposal) -> Answer {
        let max = self.max_message_bytes;
        let request = || {
            let mut req = forwarded(ProposeRequest {
                update: item.update.clone(),
            });
            if let Some(t) = item_headers(req.metadata_mut(), &item) {
                req.set_timeout(t);
            }
            req
        };
        Ok(peer_call!(ch, max, propose, request())?.into_inner())
    }
}

/// `update` of `call`, with what its forward's headers would carry.
fn proposal(call: &Call, update: Bytes) -> ForwardedProposal {
    ForwardedProposal {
        update,
        origin: call
            .origin()
            .map(|o| wire_origin(o).header_value())
            .unwrap_or_default(),
        namespace: match call.namespace_key().is_empty() {
            true => String::new(),
            false => call.namespace().to_string(),
        },
        timeout_us: call.deadline().map_or(0, |d| {
            let left = d.saturating_duration_since(Instant::now());
            u64::try_from(left.as_micros()).unwrap_or(u64::MAX).max(1)
        }),
    }
}

/// Sets in `md` the headers a forward of proposal `p` carries (its origin
/// and namespace; none of another's) and returns its timeout, which the
/// caller sets as `grpc-timeout` where the call is made, or enforces where
/// it is run.
pub fn item_headers(md: &mut MetadataMap, p: &ForwardedProposal) -> Option<Duration> {
    md.remove(ORIGIN_HEADER);
    md.remove(crate::core::call::NAMESPACE_HEADER);
    md.remove("grpc-timeout");
    for (key, value) in [
        (ORIGIN_HEADER, &p.origin),
        (crate::core::call::NAMESPACE_HEADER, &p.namespace),
    ] {
        if let Ok(v) = MetadataValue::try_from(value.as_str()) {
            if !value.is_empty() {
                md.insert(key, v);
            }
        }
    }
    (p.timeout_us > 0).then(|| Duration::from_micros(p.timeout_us))
}

/// A proposal's answer as a batch carries it.
pub fn answer(a: Answer) -> ProposeAnswer {
    match a {
        Ok(response) => ProposeAnswer {
            response: Some(response),
            status: Vec::new(),
        },
        Err(s) => {
            let mut headers = tonic::codegen::http::HeaderMap::new();
            // A status whose message cannot be a header is sent as its code.
            if s.add_header(&mut headers).is_err() {
                let _ = Status::new(s.code(), "").add_header(&mut headers);
            }
            let status = headers
                .iter()
                .map(|(k, v)| StatusHeader {
                    name: k.as_str().to_string(),
                    value: Bytes::copy_from_slice(v.as_bytes()),
                })
                .collect();
            ProposeAnswer {
                response: None,
                status,
            }
        }
    }
}

/// A batch's answer to one proposal.
fn answer_of(a: ProposeAnswer) -> Answer {
    if let Some(r) = a.response {
        return Ok(r);
    }
    let mut headers = tonic::codegen::http::HeaderMap::new();
    for h in a.status {
        if let (Ok(k), Ok(v)) = (
            tonic::codegen::http::HeaderName::from_bytes(h.name.as_bytes()),
            tonic::codegen::http::HeaderValue::from_bytes(&h.value),
        ) {
            headers.append(k, v);
        }
    }
    Err(Status::from_header_map(&headers)
        .unwrap_or_else(|| Status::internal("the leader's answer has no status")))
}
