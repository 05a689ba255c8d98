//! `ctl`'s connection to a node: each call through the service of its
//! audience (`NodeAdmin`, `NodeOps`, `NodeData`), or, on a node of a build
//! before the split (UNIMPLEMENTED: the service does not exist there),
//! through `Node`, which serves every method. Nothing reached a handler
//! when UNIMPLEMENTED comes back, so the second try is the call's only one.

use proto::coordstore::node_admin_client::NodeAdminClient;
use proto::coordstore::node_client::NodeClient;
use proto::coordstore::node_data_client::NodeDataClient;
use proto::coordstore::node_ops_client::NodeOpsClient;
use proto::coordstore::*;
use tonic::transport::Channel;
use tonic::Request;

/// The largest message either way.
const MAX: usize = 1 << 30;

/// A connection to one node (see the module).
pub struct NodeConn {
    channel: Channel,
}

impl NodeConn {
    /// `ctl`'s calls over `channel`.
    pub fn new(channel: Channel) -> NodeConn {
        NodeConn { channel }
    }
}

/// `req` and a copy of it for a second try (metadata and message; a
/// request made here carries no extensions).
fn twice<T: Clone>(req: Request<T>) -> (Request<T>, Request<T>) {
    let (meta, ext, msg) = req.into_parts();
    let again = Request::from_parts(meta.clone(), tonic::Extensions::new(), msg.clone());
    (Request::from_parts(meta, ext, msg), again)
}

/// Writes a method of [`NodeConn`] for each call: through `$client` (its
/// audience's service), or through `Node` on a node of a build before.
macro_rules! calls {
    ($($client:ident :: $method:ident($req:ty) -> $resp:ty;)*) => {
        impl NodeConn {
            $(
                pub async fn $method(
                    &mut self,
                    req: impl tonic::IntoRequest<$req>,
                ) -> anyhow::Result<tonic::Response<$resp>> {
                    let (first, again) = twice(req.into_request());
                    let asked = $client::new(self.channel.clone())
                        .max_decoding_message_size(MAX)
                        .max_encoding_message_size(MAX)
                        .$method(first)
                        .await;
                    let answer = match asked {
                        Err(s) if s.code() == tonic::Code::Unimplemented => {
                            NodeClient::new(self.channel.clone())
                                .max_decoding_message_size(MAX)
                                .max_encoding_message_size(MAX)
                                .$method(again)
                                .await
                        }
                        answer => answer,
                    };
                    Ok(answer?)
                }
            )*
        }
    };
}

calls! {
    NodeOpsClient::status(StatusRequest) -> StatusResponse;
    NodeOpsClient::get_namespace(NamespaceRequest) -> NamespaceInfo;
    NodeOpsClient::list_namespaces(ListNamespacesRequest) -> ListNamespacesResponse;
    NodeOpsClient::tasks(TasksRequest) -> TasksResponse;
    NodeOpsClient::barriers(BarriersRequest) -> BarriersResponse;
    NodeOpsClient::barrier_waits(BarrierWaitsRequest) -> BarrierWaitsResponse;
    NodeAdminClient::create_namespace(CreateNamespaceRequest) -> NamespaceInfo;
    NodeAdminClient::delete_namespace(NamespaceRequest) -> NamespaceInfo;
    NodeAdminClient::reset_namespace(ResetNamespaceRequest) -> NamespaceInfo;
    NodeAdminClient::export_namespace(NamespaceRequest) -> ExportNamespaceResponse;
    NodeAdminClient::import_namespace(ImportNamespaceRequest) -> NamespaceInfo;
    NodeAdminClient::state(StateRequest) -> StateResponse;
    NodeAdminClient::add_member(AddMemberRequest) -> MembershipResponse;
    NodeAdminClient::remove_member(RemoveMemberRequest) -> MembershipResponse;
    NodeDataClient::propose(ProposeRequest) -> ProposeResponse;
    NodeDataClient::kv_get(KvGetRequest) -> KvGetResponse;
    NodeDataClient::kv_list(KvListRequest) -> KvListResponse;
}

impl NodeConn {
    /// `NodeOps.StoreWaits` (no build before it has it in `Node`).
    pub async fn store_waits(
        &mut self,
        req: impl tonic::IntoRequest<StoreWaitsRequest>,
    ) -> anyhow::Result<tonic::Response<StoreWaitsResponse>> {
        let asked = NodeOpsClient::new(self.channel.clone())
            .max_decoding_message_size(MAX)
            .store_waits(req)
            .await;
        match asked {
            Err(s) if s.code() == tonic::Code::Unimplemented => Err(anyhow::anyhow!(
                "this node's build has no StoreWaits (it is older than ctl torch)"
            )),
            answer => Ok(answer?),
        }
    }
}
