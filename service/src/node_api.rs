//! coordstore's own `Node` API: status, raw proposals, linearizable reads.

use std::sync::Arc;

use journal::Update;
use prost::Message;
use proto::coordstore::node_server::{Node, NodeServer};
use proto::coordstore::{
    AddMemberRequest, HeartbeatRequest, HeartbeatResponse, KvGetRequest, KvGetResponse,
    KvListRequest, KvListResponse, KvPair, Member, MembershipResponse, ProposeRequest,
    ProposeResponse, ReadIndexRequest, ReadIndexResponse, RemoveMemberRequest, StateRequest,
    StateResponse, StatusRequest, StatusResponse,
};
use tonic::{Request, Response, Status};

use crate::leader::Retry;
use crate::router::{forwarded, was_forwarded, Router};

/// The `Node` service of one node.
pub struct NodeApi {
    router: Arc<Router>,
}

impl NodeApi {
    /// The tonic service.
    pub fn server(router: Arc<Router>, max_message_bytes: usize) -> NodeServer<NodeApi> {
        NodeServer::new(NodeApi { router })
            .max_decoding_message_size(max_message_bytes)
            .max_encoding_message_size(max_message_bytes)
    }
}

/// An update proposed through the Node API (ctl, tools, and other nodes
/// forwarding their clients' calls): only commands a client may issue (each
/// area's allow-list, `journal::client_proposable`: a command added later is
/// refused until it is listed there), and the time is the leader's to stamp. Timer- and liveness-driven
/// commands (InitService, Heartbeat, TasksUnhealthy, BarrierExpire) belong
/// to the leader runtime, which proposes them locally and never through
/// this API. This holds whatever headers the request carries: a client can
/// set `x-coordstore-forwarded` too, and forwarding nodes only ever forward
/// client commands.
fn check_external(u: &mut Update) -> Result<(), Status> {
    match &u.command {
        None => return Err(Status::invalid_argument("the update has no command")),
        Some(c) if !journal::client_proposable(c) => {
            return Err(Status::permission_denied(
                "this command is proposed by the leader runtime only",
            ))
        }
        Some(_) => {}
    }
    u.at_ms = 0;
    Ok(())
}

/// This node's status.
pub fn status(router: &Router) -> StatusResponse {
    let node = router.node();
    let m = node.metrics();
    let leader = m.current_leader;
    let members = node
        .members()
        .into_iter()
        .map(|(id, address, voter)| Member {
            id,
            role: if Some(id) == leader {
                "leader"
            } else if !voter {
                "learner"
            } else {
                "follower"
            }
            .into(),
            address,
        })
        .collect();
    let state = node.state();
    StatusResponse {
        node_id: node.id(),
        leader_id: leader.unwrap_or(0),
        term: m.current_term,
        members,
        last_applied: m.last_applied.map_or(0, |l| l.index),
        service_incarnation: state.read(|s| s.service_incarnation()),
        address: node.address().to_string(),
        role: node.role().as_str().into(),
        state_digest: state.digest_hex(),
        last_log_index: m.last_log_index.unwrap_or(0),
        snapshot_index: m.snapshot.map_or(0, |l| l.index),
        purged_index: m.purged.map_or(0, |l| l.index),
        parked_calls: router.waits().parked_calls(),
        cluster_id: node.cluster_id().to_string(),
        parked_by_kind: router
            .waits()
            .parked_by_kind()
            .into_iter()
            .filter(|(_, n)| *n > 0)
            .map(|(k, n)| (k.as_str().to_string(), n))
            .collect(),
    }
}

#[tonic::async_trait]
impl Node for NodeApi {
    async fn status(&self, _: Request<StatusRequest>) -> Result<Response<StatusResponse>, Status> {
        Ok(Response::new(status(&self.router)))
    }

    async fn propose(
        &self,
        req: Request<ProposeRequest>,
    ) -> Result<Response<ProposeResponse>, Status> {
        let may_forward = !was_forwarded(&req);
        let mut update = Update::decode(req.into_inner().update.as_ref())
            .map_err(|e| Status::invalid_argument(format!("undecodable journal update: {e}")))?;
        check_external(&mut update)?;
        let applied = self.router.propose(update, may_forward).await?;
        Ok(Response::new(ProposeResponse {
            outcome: applied.outcome.encode_to_vec().into(),
            log_index: applied.log_index,
        }))
    }

    async fn kv_get(&self, req: Request<KvGetRequest>) -> Result<Response<KvGetResponse>, Status> {
        let may_forward = !was_forwarded(&req);
        let r = req.into_inner();
        let key = r.key.clone();
        let router = &self.router;
        let reply = router
            .on_leader(
                may_forward,
                || async {
                    router.leader().read_barrier().await?;
                    let node = router.node();
                    let mut reply = node
                        .state()
                        .read(|s| match s.coordination().kv_entry(&key) {
                            Some(e) => KvGetResponse {
                                found: true,
                                value: e.value.clone(),
                                mod_revision: e.mod_revision,
                                ..Default::default()
                            },
                            None => KvGetResponse::default(),
                        });
                    reply.served_by = node.id();
                    reply.term = node.metrics().current_term;
                    reply.applied_index = router.waits().applied_index();
                    Ok(reply)
                },
                |mut c| {
                    let r = r.clone();
                    async move { Ok(c.kv_get(forwarded(r)).await?.into_inner()) }
                },
            )
            .await?;
        Ok(Response::new(reply))
    }

    async fn kv_list(
        &self,
        req: Request<KvListRequest>,
    ) -> Result<Response<KvListResponse>, Status> {
        let may_forward = !was_forwarded(&req);
        let r = req.into_inner();
        let router = &self.router;
        let (prefix, limit) = (r.prefix.clone(), r.limit as usize);
        let reply = router
            .on_leader(
                may_forward,
                || async {
                    router.leader().read_barrier().await?;
                    Ok(router.node().state().read(|s| {
                        let pair = |(k, e): (&str, &journal::pb::coordination::KvRecord)| KvPair {
                            key: k.to_string(),
                            value: e.value.clone(),
                        };
                        let take = if limit == 0 { usize::MAX } else { limit };
                        let entries = if journal::coordination::normalize_key(&prefix).is_empty() {
                            s.coordination().kv_all().take(take).map(pair).collect()
                        } else {
                            s.coordination()
                                .kv_dir(&prefix)
                                .into_iter()
                                .take(take)
                                .map(pair)
                                .collect()
                        };
                        KvListResponse {
                            entries,
                            revision: s.coordination().kv_revision(),
                        }
                    }))
                },
                |mut c| {
                    let r = r.clone();
                    async move { Ok(c.kv_list(forwarded(r)).await?.into_inner()) }
                },
            )
            .await?;
        Ok(Response::new(reply))
    }

    async fn state(&self, req: Request<StateRequest>) -> Result<Response<StateResponse>, Status> {
        let may_forward = !was_forwarded(&req);
        let router = &self.router;
        let reply = router
            .on_leader(
                may_forward,
                || async {
                    router.leader().read_barrier().await?;
                    let (snapshot, last_applied) = router.node().state().encode_snapshot();
                    Ok(StateResponse {
                        snapshot: snapshot.into(),
                        last_applied,
                    })
                },
                |mut c| async move { Ok(c.state(forwarded(StateRequest {})).await?.into_inner()) },
            )
            .await?;
        Ok(Response::new(reply))
    }

    async fn read_index(
        &self,
        req: Request<ReadIndexRequest>,
    ) -> Result<Response<ReadIndexResponse>, Status> {
        let index = self.router.read_index(!was_forwarded(&req)).await?;
        Ok(Response::new(ReadIndexResponse { index }))
    }

    async fn heartbeat(
        &self,
        req: Request<HeartbeatRequest>,
    ) -> Result<Response<HeartbeatResponse>, Status> {
        let may_forward = !was_forwarded(&req);
        let r = req.into_inner();
        let answer = self
            .router
            .heartbeat(r.task, r.incarnation, may_forward)
            .await?;
        Ok(Response::new(HeartbeatResponse {
            error: answer
                .err()
                .map(|e| e.encode_to_vec().into())
                .unwrap_or_default(),
        }))
    }

    async fn add_member(
        &self,
        req: Request<AddMemberRequest>,
    ) -> Result<Response<MembershipResponse>, Status> {
        self.router.node().peer_token().check(&req)?;
        let may_forward = !was_forwarded(&req);
        let r = req.into_inner();
        let router = &self.router;
        let (id, addr) = (r.id, r.address.clone());
        router
            .on_leader(
                may_forward,
                || {
                    let addr = addr.clone();
                    async move {
                        let node = router.node();
                        node.add_learner(id, &addr).await.map_err(Retry)?;
                        let mut voters: std::collections::BTreeSet<u64> = node
                            .members()
                            .into_iter()
                            .filter(|(_, _, voter)| *voter)
                            .map(|(n, _, _)| n)
                            .collect();
                        voters.insert(id);
                        node.change_voters(voters, false).await.map_err(Retry)?;
                        Ok(())
                    }
                },
                |mut c| {
                    let r = r.clone();
                    async move {
                        let mut req = forwarded(r);
                        router.node().peer_token().attach(&mut req);
                        c.add_member(req).await?;
                        Ok(())
                    }
                },
            )
            .await?;
        Ok(Response::new(MembershipResponse {
            members: status(router).members,
        }))
    }

    async fn remove_member(
        &self,
        req: Request<RemoveMemberRequest>,
    ) -> Result<Response<MembershipResponse>, Status> {
        self.router.node().peer_token().check(&req)?;
        let may_forward = !was_forwarded(&req);
        let id = req.into_inner().id;
        let router = &self.router;
        router
            .on_leader(
                may_forward,
                || async move { router.node().remove(id).await.map_err(Retry) },
                |mut c| async move {
                    let mut req = forwarded(RemoveMemberRequest { id });
                    router.node().peer_token().attach(&mut req);
                    c.remove_member(req).await?;
                    Ok(())
                },
            )
            .await?;
        Ok(Response::new(MembershipResponse {
            members: status(router).members,
        }))
    }
}
