//! coordstore's own `Node` API, three kinds of calls on one service:
//!
//! * status and reads for operators and tools (`coordstore ctl`, tests):
//!   Status, KvGet, KvList, State — a read runs on the leader after a read
//!   barrier (a follower forwards the whole call);
//! * the namespace lifecycle (create, delete, reset, get, list, export,
//!   import);
//! * membership changes (AddMember, RemoveMember), refused without the
//!   cluster's peer token when it has one;
//! * what nodes ask each other (Propose, ReadIndex, Heartbeat): a follower
//!   forwards its clients' calls to the leader through them. Propose admits
//!   only commands a client may issue, whatever headers the request carries
//!   (see [`check_external`]).
//!
//! Every method first reads its call's context and admits it for what the
//! method needs ([`Access`], through [`Core::admit`]: the rule every service
//! runs): the status and a read index are open to anyone who reached the
//! port; a namespace's views and data admit its own clients and the admins;
//! the cluster verbs (namespace create, delete, reset, export and import, a
//! job epoch reset, the whole state for a backup, membership changes) admit
//! only the admins.

use std::future::Future;
use std::sync::Arc;

use journal::Update;
use prost::Message;
use proto::coordstore::node_client::NodeClient;
use proto::coordstore::node_server::{Node, NodeServer};
use proto::coordstore::*;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use crate::areas::coordination::Coordination;
use crate::core::namespaces::Namespaces;
use crate::core::{Access, Call, Core, Retry};

/// The `Node` service of one node.
pub struct NodeApi {
    area: Coordination,
    namespaces: Arc<Namespaces>,
}

impl NodeApi {
    /// The tonic service.
    pub fn server(
        area: Coordination,
        namespaces: Arc<Namespaces>,
        max_message_bytes: usize,
    ) -> NodeServer<NodeApi> {
        NodeServer::new(NodeApi { area, namespaces })
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

    /// Runs a namespace lifecycle call `c` on the leader: `local` here, or
    /// the whole call forwarded; the call carries one origin in every
    /// attempt.
    async fn namespace_call<Req: Clone, L, LF, R, RF>(
        &self,
        call: Call,
        r: Req,
        local: L,
        remote: R,
    ) -> Result<Response<NamespaceInfo>, Status>
    where
        L: Fn(Call, Req) -> LF,
        LF: Future<Output = Result<Result<NamespaceInfo, Status>, Retry>>,
        R: Fn(NodeClient<Channel>, Request<Req>) -> RF,
        RF: Future<Output = Result<Response<NamespaceInfo>, Status>>,
    {
        let (c, _lane) = call.with_origin(self.core().router().lanes());
        let router = self.core().router();
        let answer = router
            .on_leader(
                &c,
                || local(c.clone(), r.clone()),
                |ch| {
                    let sent = remote(router.node_client(ch), c.forward(r.clone()));
                    async move { sent.await.map(|resp| Ok(resp.into_inner())) }
                },
            )
            .await?;
        answer.map(Response::new)
    }

    /// Refuses namespace lifecycle call `what` (forwarded whole to the
    /// leader, so checked here first) while the cluster runs below the
    /// namespaces' journal level (see [`crate::core::levels`]).
    async fn namespaces_level(&self, what: &str) -> Result<(), Status> {
        let need = journal::LEVEL_NAMESPACES;
        crate::core::levels::require(self.core().node(), need, || what.to_string()).await
    }

    /// The context of `req`'s call (in namespace `namespace` when the
    /// request names one in its body), admitted for `access` (see
    /// [`Core::admit`]): every method of this API passes here first.
    async fn admitted<T>(
        &self,
        req: &Request<T>,
        namespace: Option<&str>,
        access: Access<'_>,
    ) -> Result<Call, Status> {
        let mut c = Call::from_request(req)?;
        if let Some(name) = namespace {
            c = c.in_namespace(name);
        }
        let plain = |d: &journal::DomainError| {
            Status::new(tonic::Code::from_i32(d.code), d.message.clone())
        };
        self.core()
            .admit(&c, access)
            .await
            .map_err(|e| e.into_status(plain))?;
        Ok(c)
    }
}

/// How long AddMember keeps asking a new node for its journal feature
/// level before it gives up (UNAVAILABLE).
const LEVEL_ASK_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// What Propose needs of its caller: a job epoch reset is a cluster verb
/// (`ctl reset-job`, like `ctl ns reset`); every other client command acts
/// in its namespace.
fn propose_access(u: &Update) -> Access<'static> {
    match &u.command {
        Some(journal::pb::update::Command::ResetJobEpoch(_)) => Access::Cluster("reset-job"),
        _ => Access::Namespace,
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
    let levels = node.known_levels();
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
            feature_level: match levels.get(&id) {
                Some(Ok(level)) => *level,
                _ if id == node.id() => journal::FEATURE_LEVEL,
                _ => 0,
            },
        })
        .collect();
    let state = node.state();
    let parking = core.parking();
    StatusResponse {
        node_id: node.id(),
        leader_id: leader.unwrap_or(0),
        term: m.current_term,
        members,
        // The state machine's own index: a call's reply leaves from the
        // apply, before Raft's metrics learn of it.
        last_applied: state.last_applied().map_or(0, |l| l.index),
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
        namespaces: state.read(|s| s.namespace_count() as u64),
        feature_level: journal::FEATURE_LEVEL,
        cluster_feature_level: state.read(|s| s.feature_level()),
    }
}

#[tonic::async_trait]
impl Node for NodeApi {
    async fn status(
        &self,
        req: Request<StatusRequest>,
    ) -> Result<Response<StatusResponse>, Status> {
        self.admitted(&req, None, Access::Open).await?;
        Ok(Response::new(status(self.core())))
    }

    async fn create_namespace(
        &self,
        req: Request<CreateNamespaceRequest>,
    ) -> Result<Response<NamespaceInfo>, Status> {
        let c = self
            .admitted(&req, None, Access::Cluster("namespace create"))
            .await?;
        self.namespaces_level("namespace create").await?;
        let ns = &self.namespaces;
        let local = |c: Call, r: CreateNamespaceRequest| async move {
            ns.create_here(&c, &r.name, &r.settings.unwrap_or_default(), None)
                .await
        };
        let remote = |mut l: NodeClient<Channel>, r| async move { l.create_namespace(r).await };
        self.namespace_call(c, req.into_inner(), local, remote)
            .await
    }

    async fn delete_namespace(
        &self,
        req: Request<NamespaceRequest>,
    ) -> Result<Response<NamespaceInfo>, Status> {
        let c = self
            .admitted(&req, None, Access::Cluster("namespace delete"))
            .await?;
        self.namespaces_level("namespace delete").await?;
        let ns = &self.namespaces;
        let local = |c: Call, r: NamespaceRequest| async move { ns.delete_here(&c, &r.name).await };
        let remote = |mut l: NodeClient<Channel>, r| async move { l.delete_namespace(r).await };
        self.namespace_call(c, req.into_inner(), local, remote)
            .await
    }

    async fn reset_namespace(
        &self,
        req: Request<ResetNamespaceRequest>,
    ) -> Result<Response<NamespaceInfo>, Status> {
        let c = self
            .admitted(&req, None, Access::Cluster("namespace reset"))
            .await?;
        let r = req.into_inner();
        Ok(Response::new(
            self.namespaces.reset(&c, &r.name, r.tasks).await?,
        ))
    }

    async fn get_namespace(
        &self,
        req: Request<NamespaceRequest>,
    ) -> Result<Response<NamespaceInfo>, Status> {
        let name = req.get_ref().name.clone();
        let c = self.admitted(&req, Some(&name), Access::Namespace).await?;
        Ok(Response::new(self.namespaces.get(&c, &name).await?))
    }

    async fn list_namespaces(
        &self,
        req: Request<ListNamespacesRequest>,
    ) -> Result<Response<ListNamespacesResponse>, Status> {
        // Open, but it lists only the namespaces that admit the caller.
        let c = self.admitted(&req, None, Access::Open).await?;
        let namespaces = self.namespaces.list(&c).await?;
        Ok(Response::new(ListNamespacesResponse { namespaces }))
    }

    async fn export_namespace(
        &self,
        req: Request<NamespaceRequest>,
    ) -> Result<Response<ExportNamespaceResponse>, Status> {
        let c = self
            .admitted(&req, None, Access::Cluster("namespace export"))
            .await?;
        let file = self.namespaces.export(&c, &req.into_inner().name).await?;
        Ok(Response::new(ExportNamespaceResponse { file: file.into() }))
    }

    async fn import_namespace(
        &self,
        req: Request<ImportNamespaceRequest>,
    ) -> Result<Response<NamespaceInfo>, Status> {
        let c = self
            .admitted(&req, None, Access::Cluster("namespace import"))
            .await?;
        self.namespaces_level("namespace import").await?;
        let ns = &self.namespaces;
        let local = |c: Call, r: ImportNamespaceRequest| async move {
            let (export, data) = match storage::backup::Export::parse(r.file.to_vec()) {
                Ok(parsed) => parsed,
                Err(e) => {
                    return Ok(Err(Status::invalid_argument(format!(
                        "the export file: {e}"
                    ))))
                }
            };
            let name = if r.name.is_empty() {
                export.header.name
            } else {
                r.name
            };
            let settings = NamespaceSettings {
                port: r.port,
                tasks: 1,
                ..Default::default()
            };
            ns.create_here(&c, &name, &settings, Some(data)).await
        };
        let remote = |mut l: NodeClient<Channel>, r| async move { l.import_namespace(r).await };
        self.namespace_call(c, req.into_inner(), local, remote)
            .await
    }

    async fn propose(
        &self,
        req: Request<ProposeRequest>,
    ) -> Result<Response<ProposeResponse>, Status> {
        // Whole or not at all: a field this build does not know (a newer
        // ctl's, a newer node's forward) is refused, never dropped.
        let mut update = journal::decode_known::<Update>(req.get_ref().update.as_ref())
            .map_err(|e| Status::invalid_argument(format!("the journal update: {e}")))?;
        check_external(&mut update)?;
        // In the update's namespace (a peer's forward was admitted where it
        // arrived).
        let ns = journal::namespace::namespace_name(&update.namespace).to_string();
        let c = self
            .admitted(&req, Some(&ns), propose_access(&update))
            .await?;
        let applied = self.core().propose(&c, &mut update).await?;
        let outcome = applied.outcome.encode_to_vec().into();
        Ok(Response::new(ProposeResponse {
            outcome,
            log_index: applied.log_index,
        }))
    }

    async fn kv_get(&self, req: Request<KvGetRequest>) -> Result<Response<KvGetResponse>, Status> {
        let c = &self.admitted(&req, None, Access::Namespace).await?;
        let (area, node) = (&self.area, self.core().node());
        let local = |r: KvGetRequest| async move {
            let mut reply = match area.kv_record_here(c, &r.key).unwrap_or_default() {
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
        let c = &self.admitted(&req, None, Access::Namespace).await?;
        let area = &self.area;
        let local = |r: KvListRequest| async move {
            let (entries, revision) = area
                .kv_list_here(c, &r.prefix, r.limit as usize)
                .unwrap_or_default();
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
        // The whole state is the backup's (a cluster verb); one namespace's
        // part is that namespace's view.
        let name = req.get_ref().namespace.clone();
        let c = &match name.as_str() {
            "" => self.admitted(&req, None, Access::Cluster("snapshot save")),
            name => self.admitted(&req, Some(name), Access::Namespace),
        }
        .await?;
        let state = self.core().node().state();
        let local = |r: StateRequest| async move {
            if r.namespace.is_empty() {
                let (snapshot, last_applied) = state.encode_snapshot();
                return Ok(StateResponse {
                    snapshot: snapshot.into(),
                    last_applied,
                });
            }
            let last_applied = state.last_applied().map_or(0, |l| l.index);
            let snapshot = state
                .read(|s| s.namespace_snapshot(&r.namespace))
                .unwrap_or_default();
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
        let c = self.admitted(&req, None, Access::Open).await?;
        let index = self.core().router().read_index(&c).await?;
        Ok(Response::new(ReadIndexResponse { index }))
    }

    async fn heartbeat(
        &self,
        req: Request<HeartbeatRequest>,
    ) -> Result<Response<HeartbeatResponse>, Status> {
        let c = self.admitted(&req, None, Access::Namespace).await?;
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
        let c = &self
            .admitted(&req, None, Access::Cluster("member add"))
            .await?;
        let node = self.core().node();
        node.peer_token().check(&req)?;
        // A node that could not apply the cluster's state is not added.
        let (id, address) = (req.get_ref().id, req.get_ref().address.clone());
        // A node just started may not listen yet: asked until it answers,
        // as long as a leader is looked for.
        let level = crate::core::levels::level_of(node, id, &address, LEVEL_ASK_WAIT).await;
        let have = crate::core::levels::cluster_level(node);
        match level {
            Ok(l) if l >= have => {}
            Ok(l) => {
                return Err(Status::failed_precondition(format!(
                    "node {} applies journal feature level {l} ({}), below the cluster's level {have}: \
                     it could not apply the cluster's state; run a build of level {have} or newer on it",
                    id,
                    journal::level::describe(l)
                )))
            }
            Err(e) => {
                return Err(Status::unavailable(format!(
                    "cannot ask node {id} at {address} for its journal feature level: {e}"
                )))
            }
        }
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
        let c = &self
            .admitted(&req, None, Access::Cluster("member remove"))
            .await?;
        let node = self.core().node();
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
