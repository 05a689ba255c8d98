//! coordstore's own Node API, by audience, each a service of its own and a
//! file of this module:
//!
//! * `NodeAdmin` ([`admin`]): the cluster's administration: the namespace
//!   lifecycle (create, delete, reset, export, import), the state for a
//!   backup or one namespace's part (State), membership changes
//!   (AddMember, RemoveMember, refused without the cluster's peer token
//!   when it has one);
//! * `NodeOps` ([`ops`]): operators' views: the node's status and
//!   readiness (Status, Ready), the namespaces (GetNamespace,
//!   ListNamespaces), diagnostics (Tasks, Barriers, BarrierWaits:
//!   why a job is stuck, read on the leader, which alone knows heartbeat
//!   times; see [`crate::ops::diagnose`]);
//! * `NodeData` ([`data`]): applications and tools: Propose (admits only
//!   commands a client may issue, whatever headers the request carries; see
//!   [`propose_door`]), KvGet, KvList (linearizable: on the leader after a
//!   read barrier, a follower forwarding the whole call);
//! * `NodePeer` ([`peer`]): what nodes ask each other besides Raft (a
//!   follower forwards its clients' proposals, read indexes and heartbeats
//!   to its leader), on the peer port only.
//!
//! `Node` is all of them in one service, as builds before the split call
//! them (and as a follower forwards a whole call to its leader); a node
//! serves both, and `ctl` falls back to `Node` on a node of a build before.
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
use proto::coordstore::node_admin_server::{NodeAdmin, NodeAdminServer};
use proto::coordstore::node_client::NodeClient;
use proto::coordstore::node_data_server::{NodeData, NodeDataServer};
use proto::coordstore::node_ops_server::{NodeOps, NodeOpsServer};
use proto::coordstore::node_peer_server::{NodePeer, NodePeerServer};
use proto::coordstore::node_server::{Node, NodeServer};
use proto::coordstore::*;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use super::{door, serve, Door};
use crate::areas::coordination::Coordination;
use crate::core::call::plain;
use crate::core::namespaces::Namespaces;
use crate::core::router::Forwarding;
use crate::core::{Access, Call, CallError, CallResult, Core, Retry, UpdateKind};
use crate::ops::diagnose;
use crate::wire::namespaces;

mod admin;
mod data;
mod ops;
mod peer;

pub use ops::status;

/// The `Node` service of one node.
pub struct NodeApi {
    area: Coordination,
    namespaces: Arc<Namespaces>,
    /// Serves `NodePeer`: a proposal may carry a node's bookkeeping
    /// ([`UpdateKind::Node`]).
    peer: bool,
}

/// Writes `$name`, one audience's part of a node's [`NodeApi`] (see the
/// module).
macro_rules! audience {
    ($($(#[$doc:meta])* $name:ident;)*) => {$(
        $(#[$doc])*
        pub struct $name(NodeApi);

        impl $name {
            fn api(&self) -> &NodeApi {
                &self.0
            }
        }
    )*};
}

audience! {
    /// The peer calls (`NodePeer`) of one node.
    PeerApi;
    /// The administration (`NodeAdmin`) of one node.
    AdminApi;
    /// The operators' views (`NodeOps`) of one node.
    OpsApi;
    /// The data calls (`NodeData`) of one node.
    DataApi;
}

/// A node's Node API by audience, each a tonic service (see the module).
pub struct Audiences {
    /// `NodeAdmin`.
    pub admin: NodeAdminServer<AdminApi>,
    /// `NodeOps`.
    pub ops: NodeOpsServer<OpsApi>,
    /// `NodeData`.
    pub data: NodeDataServer<DataApi>,
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
        NodeServer::new(NodeApi {
            area,
            namespaces,
            peer: false,
        })
        .max_decoding_message_size(max_message_bytes)
        .max_encoding_message_size(max_message_bytes)
    }

    /// The peer calls' tonic service (see `NodePeer`): the same API.
    pub fn peer_server(
        area: Coordination,
        namespaces: Arc<Namespaces>,
        max_message_bytes: usize,
    ) -> NodePeerServer<PeerApi> {
        NodePeerServer::new(PeerApi(NodeApi {
            area,
            namespaces,
            peer: true,
        }))
        .max_decoding_message_size(max_message_bytes)
        .max_encoding_message_size(max_message_bytes)
    }

    /// The administration, operations and data services (see the module):
    /// the same API.
    pub fn audience_servers(
        area: &Coordination,
        namespaces: &Arc<Namespaces>,
        max: usize,
    ) -> Audiences {
        let api = || NodeApi {
            area: area.clone(),
            namespaces: namespaces.clone(),
            peer: false,
        };
        Audiences {
            admin: NodeAdminServer::new(AdminApi(api()))
                .max_decoding_message_size(max)
                .max_encoding_message_size(max),
            ops: NodeOpsServer::new(OpsApi(api()))
                .max_decoding_message_size(max)
                .max_encoding_message_size(max),
            data: NodeDataServer::new(DataApi(api()))
                .max_decoding_message_size(max)
                .max_encoding_message_size(max),
        }
    }

    fn api(&self) -> &NodeApi {
        self
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

    /// Runs `local` on the leader, or `remote` against the leader's Node
    /// API with the request forwarded, as `how` says (see
    /// [`crate::core::router::Router::forward_call`]).
    async fn on_leader<Req: Clone, T, L, LF, R, RF>(
        &self,
        c: &Call,
        r: Req,
        how: Forwarding,
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
        let local = |_, r| local(r);
        let remote = |ch, r| remote(router.node_client(ch), r);
        router.forward_call(c, r, how, local, remote).await
    }
}

/// Writes `$service`, a tonic service over the [`NodeApi`] whose every
/// method is the one of the same name in this module's audience files.
macro_rules! delegate {
    ($trait:path, $ty:ty => $($method:ident($req:ty) -> $resp:ty;)*) => {
        #[tonic::async_trait]
        impl $trait for $ty {
            $(
                async fn $method(&self, req: Request<$req>) -> Reply<$resp> {
                    NodeApi::$method(self.api(), req).await
                }
            )*
        }
    };
}

// The whole Node API, as builds before the split by audience know it.
delegate! { Node, NodeApi =>
    status(StatusRequest) -> StatusResponse;
    create_namespace(CreateNamespaceRequest) -> NamespaceInfo;
    delete_namespace(NamespaceRequest) -> NamespaceInfo;
    reset_namespace(ResetNamespaceRequest) -> NamespaceInfo;
    get_namespace(NamespaceRequest) -> NamespaceInfo;
    list_namespaces(ListNamespacesRequest) -> ListNamespacesResponse;
    export_namespace(NamespaceRequest) -> ExportNamespaceResponse;
    import_namespace(ImportNamespaceRequest) -> NamespaceInfo;
    propose(ProposeRequest) -> ProposeResponse;
    kv_get(KvGetRequest) -> KvGetResponse;
    kv_list(KvListRequest) -> KvListResponse;
    state(StateRequest) -> StateResponse;
    read_index(ReadIndexRequest) -> ReadIndexResponse;
    heartbeat(HeartbeatRequest) -> HeartbeatResponse;
    tasks(TasksRequest) -> TasksResponse;
    barriers(BarriersRequest) -> BarriersResponse;
    barrier_waits(BarrierWaitsRequest) -> BarrierWaitsResponse;
    ready(ReadyRequest) -> ReadyResponse;
    add_member(AddMemberRequest) -> MembershipResponse;
    remove_member(RemoveMemberRequest) -> MembershipResponse;
}

// The peer calls, on the peer port.
delegate! { NodePeer, PeerApi =>
    propose(ProposeRequest) -> ProposeResponse;
    propose_batch(ProposeBatchRequest) -> ProposeBatchResponse;
    read_index(ReadIndexRequest) -> ReadIndexResponse;
    heartbeat(HeartbeatRequest) -> HeartbeatResponse;
    store_facts(StoreFactsRequest) -> StoreFactsResponse;
}

delegate! { NodeAdmin, AdminApi =>
    create_namespace(CreateNamespaceRequest) -> NamespaceInfo;
    delete_namespace(NamespaceRequest) -> NamespaceInfo;
    reset_namespace(ResetNamespaceRequest) -> NamespaceInfo;
    export_namespace(NamespaceRequest) -> ExportNamespaceResponse;
    import_namespace(ImportNamespaceRequest) -> NamespaceInfo;
    state(StateRequest) -> StateResponse;
    add_member(AddMemberRequest) -> MembershipResponse;
    remove_member(RemoveMemberRequest) -> MembershipResponse;
}

delegate! { NodeOps, OpsApi =>
    status(StatusRequest) -> StatusResponse;
    get_namespace(NamespaceRequest) -> NamespaceInfo;
    list_namespaces(ListNamespacesRequest) -> ListNamespacesResponse;
    ready(ReadyRequest) -> ReadyResponse;
    tasks(TasksRequest) -> TasksResponse;
    barriers(BarriersRequest) -> BarriersResponse;
    barrier_waits(BarrierWaitsRequest) -> BarrierWaitsResponse;
    store_waits(StoreWaitsRequest) -> StoreWaitsResponse;
}

delegate! { NodeData, DataApi =>
    propose(ProposeRequest) -> ProposeResponse;
    kv_get(KvGetRequest) -> KvGetResponse;
    kv_list(KvListRequest) -> KvListResponse;
}
