//! What nodes ask each other (besides Raft): a follower's read index and
//! the heartbeats it forwards to its leader, and a node's own facts of a
//! namespace's PyTorch store (for the operators' view on another node). Served as `NodePeer` on the
//! peer port (and as `Node`'s methods of the same names, for builds before
//! `NodePeer`).

use super::*;
use crate::core::router::{batch_answer, item_headers, MOST_PER_BATCH};

impl NodeApi {
    /// A follower's forwarded proposals: each one run as the `Propose` of
    /// its own it stands for (its headers, the batch's peer identity; see
    /// `crate::core::router::item_headers`), all at once, answered in order.
    pub(super) async fn propose_batch(
        &self,
        req: Request<ProposeBatchRequest>,
    ) -> Reply<ProposeBatchResponse> {
        let (md, ext, batch) = req.into_parts();
        if batch.proposals.len() > MOST_PER_BATCH {
            return Err(Status::invalid_argument(format!(
                "{} proposals in one batch; at most {MOST_PER_BATCH}",
                batch.proposals.len()
            )));
        }
        let answers = batch.proposals.into_iter().map(|p| {
            let mut md = md.clone();
            let timeout = item_headers(&mut md, &p);
            let req = Request::from_parts(md, ext.clone(), ProposeRequest { update: p.update });
            async move {
                let answer = match timeout {
                    // As tonic's server ends a call at its grpc-timeout.
                    Some(t) => tokio::time::timeout(t, self.propose(req))
                        .await
                        .unwrap_or_else(|_| Err(Status::cancelled("Timeout expired"))),
                    None => self.propose(req).await,
                };
                batch_answer(answer.map(Response::into_inner))
            }
        });
        let answers = futures_util::future::join_all(answers).await;
        Ok(Response::new(ProposeBatchResponse { answers }))
    }

    pub(super) async fn read_index(
        &self,
        req: Request<ReadIndexRequest>,
    ) -> Reply<ReadIndexResponse> {
        let router = self.core().router();
        self.call(req, door(Access::Peer(&Access::Open)), |c, _| async move {
            let index = router.read_index(&c).await?;
            Ok(ReadIndexResponse { index })
        })
        .await
    }

    pub(super) async fn heartbeat(
        &self,
        req: Request<HeartbeatRequest>,
    ) -> Reply<HeartbeatResponse> {
        let area = &self.area;
        self.call(
            req,
            door(Access::Peer(&Access::Namespace)),
            |c, r: HeartbeatRequest| async move {
                // The leader's verdict travels in the reply.
                let error = match area.leader_heartbeat(&c, r.task, r.incarnation).await {
                    Ok(()) => Default::default(),
                    Err(CallError::Domain(e)) => e.encode_to_vec().into(),
                    Err(e) => return Err(e),
                };
                Ok(HeartbeatResponse { error })
            },
        )
        .await
    }

    pub(super) async fn store_facts(
        &self,
        req: Request<StoreFactsRequest>,
    ) -> Reply<StoreFactsResponse> {
        let core = self.core();
        let at = door(Access::Peer(&Access::Namespace));
        self.call(req, at, |c, _| async move {
            Ok(crate::ops::store_waits::store_facts(core, c.namespace()))
        })
        .await
    }
}
