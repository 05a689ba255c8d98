//! coordstore's own `Node` API, three kinds of calls on one service:
//!
//! * status and reads for operators and tools (`coordstore ctl`, tests):
//!   Status, KvGet, KvList, State — a read runs on the leader after a read
//!   barrier (a follower forwards the whole call);
//! * the namespace lifecycle (create, delete, reset, get, list, export,
//!   import);
//! * diagnostics (Tasks, Barriers, BarrierWaits: why a job is stuck, read
//!   on the leader, which alone knows heartbeat times; see
//!   [`crate::ops::diagnose`]) and a node's readiness (Ready);
//! * membership changes (AddMember, RemoveMember), refused without the
//!   cluster's peer token when it has one;
//! * what nodes ask each other (Propose, ReadIndex, Heartbeat): a follower
//!   forwards its clients' calls to the leader through them. Propose admits
//!   only commands a client may issue, whatever headers the request carries
//!   (see [`propose_door`]).
//!
//! Every method runs the one pipeline of every service (`super::serve`):
//! the call's context, its admission for what the method needs ([`Access`],
//! through [`Core::admit`]), the method's body, the error as its status.
//! What each needs: the status and a read index are open to anyone who
//! reached the port; a namespace's views and data admit its own clients and
//! the admins; the cluster verbs (namespace create, delete, reset, export
//! and import, a job epoch reset, the whole state for a backup, membership
//! changes) admit only the admins.

use std::future::Future;
use std::sync::Arc;

use journal::Update;
use prost::Message;
use proto::coordstore::node_client::NodeClient;
use proto::coordstore::node_server::{Node, NodeServer};
use proto::coordstore::*;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use super::{door, serve, Door};
use crate::areas::coordination::Coordination;
use crate::core::call::plain;
use crate::core::namespaces::Namespaces;
use crate::core::router::{forward, Attempt};
use crate::core::{Access, Call, CallError, CallResult, Core, Retry, UpdateKind};
use crate::ops::diagnose;
use crate::wire::namespaces;

/// The `Node` service of one node.
pub struct NodeApi {
    area: Coordination,
    namespaces: Arc<Namespaces>,
}

/// What a Node API method answers.
type Reply<T> = Result<Response<T>, Status>;

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

    /// Serves `req` through the pipeline (see the module), admitted at the
    /// door `at` chooses; a domain error is its code and message.
    async fn call<Req, In, Resp, Fut>(
        &self,
        req: Request<Req>,
        at: impl FnOnce(Req) -> Result<(Door, In), Status>,
        body: impl FnOnce(Call, In) -> Fut,
    ) -> Reply<Resp>
    where
        Fut: Future<Output = CallResult<Resp>>,
    {
        let errors = |_: &Call, d: &journal::DomainError| plain(d);
        serve(self.core(), req, at, errors, |c, r| async move {
            let answer = body(c.clone(), r).await;
            (c, answer)
        })
        .await
    }

    /// Runs `local` on the leader (after a read barrier there when `read`),
    /// or `remote` against the leader's Node API with the request forwarded,
    /// each forward waiting as `attempt` says.
    async fn on_leader<Req: Clone, T, L, LF, R, RF>(
        &self,
        c: &Call,
        r: Req,
        (read, attempt): (bool, Attempt),
        local: L,
        remote: R,
    ) -> CallResult<T>
    where
        L: Fn(Req) -> LF,
        LF: Future<Output = CallResult<T>>,
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
            let sent = remote(router.node_client(ch), forward(c, r.clone()));
            async move { Ok(sent.await?.into_inner()) }
        };
        router.on_leader_as(c, attempt, run_local, run_remote).await
    }

    /// `info` of a namespace just created or imported, once this node has
    /// tried to open its port (see `Namespaces::opened`), read again then.
    async fn opened(&self, c: &Call, info: NamespaceInfo) -> CallResult<NamespaceInfo> {
        self.namespaces.opened(&info.name, info.port).await;
        Ok(namespaces::info(&self.namespaces, c, &info.name).unwrap_or(info))
    }

    /// Runs a namespace lifecycle call on the leader: `local` here, or the
    /// whole call forwarded; the call carries one origin in every attempt.
    /// While the cluster runs below the namespaces' journal level it is
    /// refused here, before anything is forwarded (`what` names it; see
    /// [`crate::core::levels`]).
    async fn lifecycle<Req: Clone, L, LF, R, RF>(
        &self,
        what: &str,
        c: &Call,
        r: Req,
        local: L,
        remote: R,
    ) -> CallResult<NamespaceInfo>
    where
        L: Fn(Call, Req) -> LF,
        LF: Future<Output = CallResult<NamespaceInfo>>,
        R: Fn(NodeClient<Channel>, Request<Req>) -> RF,
        RF: Future<Output = Result<Response<NamespaceInfo>, Status>>,
    {
        let need = journal::LEVEL_NAMESPACES;
        crate::core::levels::require(self.core().node(), need, || what.to_string()).await?;
        let router = self.core().router();
        let (c, _lane) = router.exactly_once(c);
        router
            .on_leader_as(
                &c,
                Attempt::Whole,
                || local(c.clone(), r.clone()),
                |ch| {
                    let sent = remote(router.node_client(ch), forward(&c, r.clone()));
                    async move { Ok(sent.await?.into_inner()) }
                },
            )
            .await
    }
}

/// The door of a call in the namespace its message names.
fn named(
    name: impl Fn(&NamespaceRequest) -> &str,
    access: Access<'static>,
) -> impl FnOnce(NamespaceRequest) -> Result<(Door, NamespaceRequest), Status> {
    move |r| Ok((Door::into_namespace(name(&r), access), r))
}

/// How long AddMember keeps asking a new node for its journal feature
/// level before it gives up (UNAVAILABLE).
const LEVEL_ASK_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Where an update proposed through the Node API (ctl, tools, other nodes
/// forwarding their clients' calls) is admitted: as its command's kind
/// says (`Access::Update`: a client command in its namespace, a job epoch
/// reset as a cluster verb, a leader runtime's command never). The time is
/// the leader's to stamp. A command-less update is INVALID_ARGUMENT.
fn propose_door(u: &mut Update) -> Result<Door, Status> {
    let Some(command) = &u.command else {
        return Err(Status::invalid_argument("the update has no command"));
    };
    let access = Access::Update(UpdateKind::of(command));
    u.at_ms = 0;
    let ns = journal::namespace::namespace_name(&u.namespace);
    Ok(Door::into_namespace(ns, access))
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
        disk: Some(node.health().to_proto()),
    }
}

#[tonic::async_trait]
impl Node for NodeApi {
    async fn status(&self, req: Request<StatusRequest>) -> Reply<StatusResponse> {
        let core = self.core();
        self.call(req, door(Access::Open), |_, _| async { Ok(status(core)) })
            .await
    }

    async fn create_namespace(&self, req: Request<CreateNamespaceRequest>) -> Reply<NamespaceInfo> {
        let ns = &self.namespaces;
        let local = |c: Call, r: CreateNamespaceRequest| async move {
            let parts = namespaces::settings_to_parts(&r.settings.unwrap_or_default())?;
            ns.create_here(&c, &r.name, parts, None).await?;
            namespaces::info(ns, &c, &r.name)
        };
        let remote = |mut l: NodeClient<Channel>, r| async move { l.create_namespace(r).await };
        let at = door(Access::Cluster("namespace create"));
        self.call(req, at, |c, r| async move {
            let info = self.lifecycle("namespace create", &c, r, local, remote);
            self.opened(&c, info.await?).await
        })
        .await
    }

    async fn delete_namespace(&self, req: Request<NamespaceRequest>) -> Reply<NamespaceInfo> {
        let ns = &self.namespaces;
        let local = |c: Call, r: NamespaceRequest| async move {
            let info = || namespaces::info(ns, &c, &r.name);
            ns.delete_here(&c, &r.name, info).await
        };
        let remote = |mut l: NodeClient<Channel>, r| async move { l.delete_namespace(r).await };
        let at = door(Access::Cluster("namespace delete"));
        self.call(req, at, |c, r| async move {
            self.lifecycle("namespace delete", &c, r, local, remote)
                .await
        })
        .await
    }

    async fn reset_namespace(&self, req: Request<ResetNamespaceRequest>) -> Reply<NamespaceInfo> {
        let ns = &self.namespaces;
        let at = door(Access::Cluster("namespace reset"));
        self.call(req, at, |c, r: ResetNamespaceRequest| async move {
            ns.reset(&c, &r.name, r.tasks).await?;
            namespaces::info(ns, &c, &r.name)
        })
        .await
    }

    async fn get_namespace(&self, req: Request<NamespaceRequest>) -> Reply<NamespaceInfo> {
        let ns = &self.namespaces;
        let at = named(|r| &r.name, Access::Namespace);
        self.call(req, at, |c, r| async move {
            self.core().linearizable(&c).await?;
            namespaces::info(ns, &c, &r.name)
        })
        .await
    }

    async fn list_namespaces(
        &self,
        req: Request<ListNamespacesRequest>,
    ) -> Reply<ListNamespacesResponse> {
        // Open, but it lists only the namespaces that admit the caller.
        let ns = &self.namespaces;
        self.call(req, door(Access::Open), |c, _| async move {
            let names = ns.list(&c).await?;
            let namespaces = names
                .iter()
                .filter_map(|name| namespaces::info(ns, &c, name).ok())
                .collect();
            Ok(ListNamespacesResponse { namespaces })
        })
        .await
    }

    async fn export_namespace(
        &self,
        req: Request<NamespaceRequest>,
    ) -> Reply<ExportNamespaceResponse> {
        let ns = &self.namespaces;
        let at = door(Access::Cluster("namespace export"));
        self.call(req, at, |c, r: NamespaceRequest| async move {
            let file = ns.export(&c, &r.name).await?;
            Ok(ExportNamespaceResponse { file: file.into() })
        })
        .await
    }

    async fn import_namespace(&self, req: Request<ImportNamespaceRequest>) -> Reply<NamespaceInfo> {
        let ns = &self.namespaces;
        let local = |c: Call, r: ImportNamespaceRequest| async move {
            let (export, data) = storage::backup::Export::parse(r.file.to_vec())
                .map_err(|e| Status::invalid_argument(format!("the export file: {e}")))?;
            let name = match r.name.is_empty() {
                true => export.header.name,
                false => r.name,
            };
            let settings = NamespaceSettings {
                port: r.port,
                tasks: 1,
                ..Default::default()
            };
            let parts = namespaces::settings_to_parts(&settings)?;
            ns.create_here(&c, &name, parts, Some(data)).await?;
            namespaces::info(ns, &c, &name)
        };
        let remote = |mut l: NodeClient<Channel>, r| async move { l.import_namespace(r).await };
        let at = door(Access::Cluster("namespace import"));
        self.call(req, at, |c, r| async move {
            let info = self.lifecycle("namespace import", &c, r, local, remote);
            self.opened(&c, info.await?).await
        })
        .await
    }

    async fn propose(&self, req: Request<ProposeRequest>) -> Reply<ProposeResponse> {
        // Whole or not at all: a field this build does not know (a newer
        // ctl's, a newer node's forward) is refused, never dropped. The call
        // is admitted in the update's namespace, as its command needs (a
        // peer's forward was admitted where it arrived).
        let at = |r: ProposeRequest| {
            let mut u = journal::decode_known::<Update>(&r.update)
                .map_err(|e| Status::invalid_argument(format!("the journal update: {e}")))?;
            Ok((propose_door(&mut u)?, u))
        };
        let core = self.core();
        self.call(req, at, |c, mut u| async move {
            let applied = core.propose(&c, &mut u).await?;
            Ok(ProposeResponse {
                outcome: applied.outcome.encode_to_vec().into(),
                log_index: applied.log_index,
            })
        })
        .await
    }

    async fn kv_get(&self, req: Request<KvGetRequest>) -> Reply<KvGetResponse> {
        let (area, core) = (&self.area, self.core());
        let local = |c: Call| {
            move |r: KvGetRequest| {
                let c = c.clone();
                async move {
                    let record = area.kv_record_here(&c, &r.key).unwrap_or_default();
                    let mut reply = record.map_or_else(KvGetResponse::default, |e| KvGetResponse {
                        found: true,
                        value: e.value,
                        mod_revision: e.mod_revision,
                        ..Default::default()
                    });
                    let node = core.node();
                    (reply.served_by, reply.term) = (node.id(), node.metrics().current_term);
                    reply.applied_index = core.parking().applied_index();
                    Ok(reply)
                }
            }
        };
        let remote = |mut l: NodeClient<Channel>, r| async move { l.kv_get(r).await };
        self.call(req, door(Access::Namespace), |c, r| async move {
            self.on_leader(&c, r, (true, Attempt::Short), local(c.clone()), remote)
                .await
        })
        .await
    }

    async fn kv_list(&self, req: Request<KvListRequest>) -> Reply<KvListResponse> {
        let area = &self.area;
        let local = |c: Call| {
            move |r: KvListRequest| {
                let c = c.clone();
                async move {
                    let limit = r.limit as usize;
                    let (entries, revision) = match r.torch {
                        true => torch_list_here(area.core(), &c, &r.prefix, limit),
                        false => area.kv_list_here(&c, &r.prefix, limit),
                    }
                    .unwrap_or_default();
                    let entries = entries
                        .into_iter()
                        .map(|(key, value)| KvPair { key, value })
                        .collect();
                    Ok(KvListResponse { entries, revision })
                }
            }
        };
        let remote = |mut l: NodeClient<Channel>, r| async move { l.kv_list(r).await };
        self.call(req, door(Access::Namespace), |c, r| async move {
            self.on_leader(&c, r, (true, Attempt::Short), local(c.clone()), remote)
                .await
        })
        .await
    }

    async fn state(&self, req: Request<StateRequest>) -> Reply<StateResponse> {
        // The whole state is the backup's (a cluster verb); one namespace's
        // part is that namespace's view.
        let at = |r: StateRequest| {
            let door = match r.namespace.as_str() {
                "" => Door::at(Access::Cluster("snapshot save")),
                name => Door::into_namespace(name, Access::Namespace),
            };
            Ok((door, r))
        };
        let state = self.core().node().state();
        let local = |r: StateRequest| async move {
            let last_applied = state.last_applied().map_or(0, |l| l.index);
            let snapshot = match r.namespace.as_str() {
                "" => state.encode_snapshot().0,
                name => state
                    .read(|s| s.namespace_snapshot(name))
                    .unwrap_or_default(),
            };
            Ok(StateResponse {
                snapshot: snapshot.into(),
                last_applied,
            })
        };
        let remote = |mut l: NodeClient<Channel>, r| async move { l.state(r).await };
        self.call(req, at, |c, r| async move {
            self.on_leader(&c, r, (true, Attempt::Whole), local, remote)
                .await
        })
        .await
    }

    async fn read_index(&self, req: Request<ReadIndexRequest>) -> Reply<ReadIndexResponse> {
        let router = self.core().router();
        self.call(req, door(Access::Open), |c, _| async move {
            let index = router.read_index(&c).await?;
            Ok(ReadIndexResponse { index })
        })
        .await
    }

    async fn heartbeat(&self, req: Request<HeartbeatRequest>) -> Reply<HeartbeatResponse> {
        let area = &self.area;
        self.call(
            req,
            door(Access::Namespace),
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

    async fn tasks(&self, req: Request<TasksRequest>) -> Reply<TasksResponse> {
        let core = self.core();
        self.call(req, door(Access::Namespace), |c, r| async move {
            let tasks = diagnose::tasks(core, &c, r).await?;
            Ok(TasksResponse { tasks })
        })
        .await
    }

    async fn barriers(&self, req: Request<BarriersRequest>) -> Reply<BarriersResponse> {
        let core = self.core();
        self.call(req, door(Access::Namespace), |c, r| async move {
            let barriers = diagnose::barriers(core, &c, r).await?;
            Ok(BarriersResponse { barriers })
        })
        .await
    }

    async fn barrier_waits(
        &self,
        req: Request<BarrierWaitsRequest>,
    ) -> Reply<BarrierWaitsResponse> {
        // Open, but it names only the namespaces that admit the caller.
        let core = self.core();
        self.call(req, door(Access::Open), |c, _| async move {
            let namespaces = diagnose::barrier_waits(core, &c).await?;
            Ok(BarrierWaitsResponse { namespaces })
        })
        .await
    }

    async fn ready(&self, req: Request<ReadyRequest>) -> Reply<ReadyResponse> {
        let core = self.core();
        self.call(req, door(Access::Open), |_, _| async move {
            let (ready, not_ready) = match crate::ops::ready(core).await {
                Ok(_) => (true, String::new()),
                Err(why) => (false, why),
            };
            let applied_index = core.parking().applied_index();
            Ok(ReadyResponse {
                ready,
                not_ready,
                applied_index,
                disk: Some(core.node().health().to_proto()),
            })
        })
        .await
    }

    async fn add_member(&self, req: Request<AddMemberRequest>) -> Reply<MembershipResponse> {
        let (core, node) = (self.core(), self.core().node());
        let local = |r: AddMemberRequest| async move {
            node.add_learner(r.id, &r.address).await.map_err(Retry)?;
            let mut voters: std::collections::BTreeSet<u64> = node
                .members()
                .into_iter()
                .filter(|(_, _, voter)| *voter)
                .map(|(n, _, _)| n)
                .collect();
            voters.insert(r.id);
            Ok(node.change_voters(voters, false).await.map_err(Retry)?)
        };
        let remote = |mut l: NodeClient<Channel>, mut r| async move {
            node.peer_token().attach(&mut r);
            l.add_member(r).await.map(|_| Response::new(()))
        };
        let at = door(Access::Membership("member add"));
        self.call(req, at, |c, r: AddMemberRequest| async move {
            // A node that could not apply the cluster's state is not added.
            check_joiner_level(core, r.id, &r.address).await?;
            self.on_leader(&c, r, (false, Attempt::Whole), local, remote)
                .await?;
            Ok(MembershipResponse {
                members: status(core).members,
            })
        })
        .await
    }

    async fn remove_member(&self, req: Request<RemoveMemberRequest>) -> Reply<MembershipResponse> {
        let (core, node) = (self.core(), self.core().node());
        let local =
            |r: RemoveMemberRequest| async move { Ok(node.remove(r.id).await.map_err(Retry)?) };
        let remote = |mut l: NodeClient<Channel>, mut r| async move {
            node.peer_token().attach(&mut r);
            l.remove_member(r).await.map(|_| Response::new(()))
        };
        let at = door(Access::Membership("member remove"));
        self.call(req, at, |c, r| async move {
            self.on_leader(&c, r, (false, Attempt::Whole), local, remote)
                .await?;
            Ok(MembershipResponse {
                members: status(core).members,
            })
        })
        .await
    }
}

/// Refuses to add node `id` at `address` unless it applies the journal
/// feature level the cluster runs at (asked until it answers: a node just
/// started may not listen yet).
async fn check_joiner_level(core: &Core, id: u64, address: &str) -> CallResult<()> {
    let node = core.node();
    let level = crate::core::levels::level_of(node, id, address, LEVEL_ASK_WAIT).await;
    let have = crate::core::levels::cluster_level(node);
    match level {
        Ok(l) if l >= have => Ok(()),
        Ok(l) => Err(Status::failed_precondition(format!(
            "node {id} applies journal feature level {l} ({}), below the cluster's level {have}: \
             it could not apply the cluster's state; run a build of level {have} or newer on it",
            journal::level::describe(l)
        ))
        .into()),
        Err(e) => Err(Status::unavailable(format!(
            "cannot ask node {id} at {address} for its journal feature level: {e}"
        ))
        .into()),
    }
}

/// The PyTorch store's keys starting with `prefix` and their values, in key
/// order (at most `limit`; 0: all), as this node has them: what `ctl kv ls
/// --torch` shows of the namespace (revision 0: that store has none).
fn torch_list_here(
    core: &Core,
    c: &Call,
    prefix: &str,
    limit: usize,
) -> CallResult<(Vec<(String, bytes::Bytes)>, u64)> {
    let take = if limit == 0 { usize::MAX } else { limit };
    core.read(c, |s| {
        let entries = s
            .torch()
            .entries_from(prefix)
            .take_while(|(k, _)| k.starts_with(prefix))
            .take(take)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        (entries, 0)
    })
}
