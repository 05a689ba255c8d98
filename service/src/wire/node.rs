//! coordstore's own `Node` API, three kinds of calls on one service:
//!
//! * status and reads for operators and tools (`coordstore ctl`, tests):
//!   Status, KvGet, KvList, State — a read runs on the leader after a read
//!   barrier (a follower forwards the whole call);
//! * membership changes (AddMember, RemoveMember), refused without the
//!   cluster's peer token when it has one;
//! * what nodes ask each other (Propose, ReadIndex, Heartbeat): a follower
//!   forwards its clients' calls to the leader through them. Propose admits
//!   only commands a client may issue, whatever headers the request carries
//!   (see [`check_external`]).

use std::future::Future;

use journal::Update;
use prost::Message;
use proto::coordstore::node_client::NodeClient;
use proto::coordstore::node_server::{Node, NodeServer};
use proto::coordstore::*;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use crate::areas::coordination::Coordination;
use crate::core::{Call, Core, Retry};

/// The `Node` service of one node.
pub struct NodeApi {
    area: Coordination,
}

impl NodeApi {
    /// The tonic service.
    pub fn server(area: Coordination, max_message_bytes: usize) -> NodeServer<NodeApi> {
        NodeServer::new(NodeApi { area })
            .max_decoding_message_size(max_message_bytes)
            .max_encoding_message_size(max_message_bytes)
    }

    fn core(&self) -> &Core {
        self.area.core()
    }

    /// Runs `local` on the leader (after a read barrier there when `read`),
    /// or `remote` against the leader's Node API with the request forwarded.
    async fn on_leader<Req: Clone, T, L, LF, R, RF>(
        &self,
        c: &Call,
        r: Req,
        read: bool,
        local: L,
        remote: R,
    ) -> Result<Response<T>, Status>
    where
        L: Fn(Req) -> LF,
        LF: Future<Output = Result<T, Retry>>,
        R: Fn(NodeClient<Channel>, Request<Req>) -> RF,
        RF: Future<Output = Result<Response<T>, Status>>,
    {
        let router = self.core().router();
        let run_local = || async {
            if read {
                router.leader().read_barrier().await?;
            }
            local(r.clone()).await
        };
        let run_remote = |ch| {
            let sent = remote(router.node_client(ch), c.forward(r.clone()));
            async move { sent.await.map(Response::into_inner) }
        };
        router
            .on_leader(c, run_local, run_remote)
            .await
            .map(Response::new)
    }
}

/// An update proposed through the Node API (ctl, tools, and other nodes
/// forwarding their clients' calls): only commands a client may issue (each
/// area's allow-list, `journal::client_proposable`: a command added later is
/// refused until it is listed there), and the time is the leader's to stamp.
/// Timer- and liveness-driven commands (InitService, Heartbeat,
/// TasksUnhealthy, BarrierExpire) belong to the leader runtime, which
/// proposes them locally and never through this API. This holds whatever
/// headers the request carries: a client can set `x-coordstore-forwarded`
/// too, and forwarding nodes only ever forward client commands.
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
pub fn status(core: &Core) -> StatusResponse {
    let node = core.node();
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
    let parking = core.parking();
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
        parked_calls: parking.parked_calls(),
        cluster_id: node.cluster_id().to_string(),
        parked_by_kind: parking
            .parked_by_kind()
            .into_iter()
            .filter(|(_, n)| *n > 0)
            .map(|(k, n)| (k.to_string(), n))
            .collect(),
    }
}

#[tonic::async_trait]
impl Node for NodeApi {
    async fn status(&self, _: Request<StatusRequest>) -> Result<Response<StatusResponse>, Status> {
        Ok(Response::new(status(self.core())))
    }

    async fn propose(
        &self,
        req: Request<ProposeRequest>,
    ) -> Result<Response<ProposeResponse>, Status> {
        let c = Call::from_request(&req)?;
        let mut update = Update::decode(req.into_inner().update.as_ref())
            .map_err(|e| Status::invalid_argument(format!("undecodable journal update: {e}")))?;
        check_external(&mut update)?;
        let applied = self.core().propose(&c, &mut update).await?;
        let outcome = applied.outcome.encode_to_vec().into();
        Ok(Response::new(ProposeResponse {
            outcome,
            log_index: applied.log_index,
        }))
    }

    async fn kv_get(&self, req: Request<KvGetRequest>) -> Result<Response<KvGetResponse>, Status> {
        let (c, area, node) = (&Call::from_request(&req)?, &self.area, self.core().node());
        let local = |r: KvGetRequest| async move {
            let mut reply = match area.kv_record_here(c, &r.key) {
                Some(e) => KvGetResponse {
                    found: true,
                    value: e.value,
                    mod_revision: e.mod_revision,
                    ..Default::default()
                },
                None => KvGetResponse::default(),
            };
            (reply.served_by, reply.term) = (node.id(), node.metrics().current_term);
            reply.applied_index = self.core().parking().applied_index();
            Ok(reply)
        };
        let remote = |mut l: NodeClient<Channel>, r| async move { l.kv_get(r).await };
        self.on_leader(c, req.into_inner(), true, local, remote)
            .await
    }

    async fn kv_list(
        &self,
        req: Request<KvListRequest>,
    ) -> Result<Response<KvListResponse>, Status> {
        let (c, area) = (&Call::from_request(&req)?, &self.area);
        let local = |r: KvListRequest| async move {
            let (entries, revision) = area.kv_list_here(c, &r.prefix, r.limit as usize);
            let entries = entries
                .into_iter()
                .map(|(key, value)| KvPair { key, value })
                .collect();
            Ok(KvListResponse { entries, revision })
        };
        let remote = |mut l: NodeClient<Channel>, r| async move { l.kv_list(r).await };
        self.on_leader(c, req.into_inner(), true, local, remote)
            .await
    }

    async fn state(&self, req: Request<StateRequest>) -> Result<Response<StateResponse>, Status> {
        let (c, state) = (&Call::from_request(&req)?, self.core().node().state());
        let local = |_| async move {
            let (snapshot, last_applied) = state.encode_snapshot();
            Ok(StateResponse {
                snapshot: snapshot.into(),
                last_applied,
            })
        };
        let remote = |mut l: NodeClient<Channel>, r| async move { l.state(r).await };
        self.on_leader(c, req.into_inner(), true, local, remote)
            .await
    }

    async fn read_index(
        &self,
        req: Request<ReadIndexRequest>,
    ) -> Result<Response<ReadIndexResponse>, Status> {
        let c = Call::from_request(&req)?;
        let index = self.core().router().read_index(&c).await?;
        Ok(Response::new(ReadIndexResponse { index }))
    }

    async fn heartbeat(
        &self,
        req: Request<HeartbeatRequest>,
    ) -> Result<Response<HeartbeatResponse>, Status> {
        let c = Call::from_request(&req)?;
        let r = req.into_inner();
        let answer = self
            .area
            .leader_heartbeat(&c, r.task, r.incarnation)
            .await?;
        let error = answer
            .err()
            .map(|e| e.encode_to_vec().into())
            .unwrap_or_default();
        Ok(Response::new(HeartbeatResponse { error }))
    }

    async fn add_member(
        &self,
        req: Request<AddMemberRequest>,
    ) -> Result<Response<MembershipResponse>, Status> {
        let (c, node) = (&Call::from_request(&req)?, self.core().node());
        node.peer_token().check(&req)?;
        let local = |r: AddMemberRequest| async move {
            node.add_learner(r.id, &r.address).await.map_err(Retry)?;
            let mut voters: std::collections::BTreeSet<u64> = node
                .members()
                .into_iter()
                .filter(|(_, _, voter)| *voter)
                .map(|(n, _, _)| n)
                .collect();
            voters.insert(r.id);
            node.change_voters(voters, false).await.map_err(Retry)
        };
        let remote = |mut l: NodeClient<Channel>, mut r| async move {
            node.peer_token().attach(&mut r);
            l.add_member(r).await.map(|_| Response::new(()))
        };
        self.on_leader(c, req.into_inner(), false, local, remote)
            .await?;
        Ok(Response::new(MembershipResponse {
            members: status(self.core()).members,
        }))
    }

    async fn remove_member(
        &self,
        req: Request<RemoveMemberRequest>,
    ) -> Result<Response<MembershipResponse>, Status> {
        let (c, node) = (&Call::from_request(&req)?, self.core().node());
        node.peer_token().check(&req)?;
        let local = |r: RemoveMemberRequest| async move { node.remove(r.id).await.map_err(Retry) };
        let remote = |mut l: NodeClient<Channel>, mut r| async move {
            node.peer_token().attach(&mut r);
            l.remove_member(r).await.map(|_| Response::new(()))
        };
        self.on_leader(c, req.into_inner(), false, local, remote)
            .await?;
        Ok(Response::new(MembershipResponse {
            members: status(self.core()).members,
        }))
    }
}
