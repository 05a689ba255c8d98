//! Namespaces from a test: the Node API's lifecycle calls, requests in a
//! namespace by header, and waits on what a node reports of them.

use std::time::Duration;

use proto::coordstore::{
    CreateNamespaceRequest, ListNamespacesRequest, NamespaceInfo, NamespaceRequest,
    NamespaceSettings,
};
use tonic::Status;

use crate::{connect, Cluster};

/// The header coordstore's own clients name their namespace with.
pub const HEADER: &str = proto::NAMESPACE_HEADER;

/// Settings of a namespace of `tasks` jaxlib tasks, every other setting
/// at its default.
pub fn tasks(tasks: u32) -> NamespaceSettings {
    NamespaceSettings {
        tasks,
        ..Default::default()
    }
}

/// `msg` as a request in namespace `ns` (by header).
pub fn request<T>(ns: &str, msg: T) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    req.metadata_mut()
        .insert(HEADER, ns.parse().expect("a header value"));
    req
}

/// CreateNamespace through the node at `addr`.
pub async fn create(
    addr: &str,
    name: &str,
    settings: NamespaceSettings,
) -> Result<NamespaceInfo, Status> {
    let mut c = connect(addr, Duration::from_secs(30)).await;
    let req = CreateNamespaceRequest {
        name: name.into(),
        settings: Some(settings),
    };
    c.create_namespace(req).await.map(|r| r.into_inner())
}

/// GetNamespace through the node at `addr`.
pub async fn get(addr: &str, name: &str) -> Result<NamespaceInfo, Status> {
    let mut c = connect(addr, Duration::from_secs(30)).await;
    let req = NamespaceRequest { name: name.into() };
    c.get_namespace(req).await.map(|r| r.into_inner())
}

/// DeleteNamespace through the node at `addr`.
pub async fn delete(addr: &str, name: &str) -> Result<NamespaceInfo, Status> {
    let mut c = connect(addr, Duration::from_secs(30)).await;
    let req = NamespaceRequest { name: name.into() };
    c.delete_namespace(req).await.map(|r| r.into_inner())
}

/// The names of every namespace (ListNamespaces through `addr`).
pub async fn names(addr: &str) -> Vec<String> {
    let mut c = connect(addr, Duration::from_secs(30)).await;
    let all = c
        .list_namespaces(ListNamespacesRequest {})
        .await
        .expect("ListNamespaces");
    all.into_inner()
        .namespaces
        .into_iter()
        .map(|n| n.name)
        .collect()
}

/// Waits until `cond` holds of namespace `name` as node `i` of `cluster`
/// reports it (GetNamespace there), or panics after `wait`.
pub async fn wait_info(
    cluster: &Cluster,
    i: usize,
    name: &str,
    wait: Duration,
    cond: impl Fn(&NamespaceInfo) -> bool,
) -> NamespaceInfo {
    let what = format!(
        "namespace {name} on node {} to reach the condition",
        cluster.nodes[i].id
    );
    crate::wait::wait(what, wait)
        .context(|| cluster.logs())
        .until(|| async {
            match get(&cluster.nodes[i].addr, name).await {
                Ok(info) if cond(&info) => Ok(info),
                other => Err(other),
            }
        })
        .await
}

/// Waits until every node of `cluster` serves namespace `name` on its
/// port (each node's GetNamespace says so).
pub async fn wait_serving(cluster: &Cluster, name: &str, wait: Duration) -> NamespaceInfo {
    let mut info = None;
    for i in 0..cluster.nodes.len() {
        info = Some(wait_info(cluster, i, name, wait, |n| n.listener == "serving").await);
    }
    info.expect("a node")
}

/// `host:port` of namespace `info` on node index `i` of `cluster`.
pub fn addr(cluster: &Cluster, i: usize, info: &NamespaceInfo) -> String {
    format!("{}:{}", cluster.hosts()[i], info.port)
}
