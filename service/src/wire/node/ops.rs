//! The Node API's operations and diagnostics: the node's status and
//! readiness, a namespace's description and the list of those that admit
//! the caller, and why a job is stuck (tasks, barriers, barrier waits: read
//! on the leader, which alone knows heartbeat times; see
//! [`crate::ops::diagnose`]; what a PyTorch store waits for, from the state
//! and every member: [`crate::ops::store_waits`]).

use super::*;

impl NodeApi {
    pub(super) async fn status(&self, req: Request<StatusRequest>) -> Reply<StatusResponse> {
        let core = self.core();
        self.call(req, door(Access::Open), |_, _| async { Ok(status(core)) })
            .await
    }

    pub(super) async fn get_namespace(
        &self,
        req: Request<NamespaceRequest>,
    ) -> Reply<NamespaceInfo> {
        let ns = &self.namespaces;
        let at = named(|r| &r.name, Access::Namespace);
        self.call(req, at, |c, r| async move {
            self.core().linearizable(&c).await?;
            namespaces::info(ns, &c, &r.name)
        })
        .await
    }

    pub(super) async fn list_namespaces(
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

    pub(super) async fn tasks(&self, req: Request<TasksRequest>) -> Reply<TasksResponse> {
        let core = self.core();
        self.call(req, door(Access::Namespace), |c, r| async move {
            let tasks = diagnose::tasks(core, &c, r).await?;
            Ok(TasksResponse { tasks })
        })
        .await
    }

    pub(super) async fn barriers(&self, req: Request<BarriersRequest>) -> Reply<BarriersResponse> {
        let core = self.core();
        self.call(req, door(Access::Namespace), |c, r| async move {
            let barriers = diagnose::barriers(core, &c, r).await?;
            Ok(BarriersResponse { barriers })
        })
        .await
    }

    pub(super) async fn barrier_waits(
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

    pub(super) async fn store_waits(
        &self,
        req: Request<StoreWaitsRequest>,
    ) -> Reply<StoreWaitsResponse> {
        let core = self.core();
        self.call(req, door(Access::Namespace), |c, r| async move {
            crate::ops::store_waits::store_waits(core, &c, r).await
        })
        .await
    }

    pub(super) async fn ready(&self, req: Request<ReadyRequest>) -> Reply<ReadyResponse> {
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
}

/// The door of a call in the namespace its message names.
fn named(
    name: impl Fn(&NamespaceRequest) -> &str,
    access: Access<'static>,
) -> impl FnOnce(NamespaceRequest) -> Result<(Door, NamespaceRequest), Status> {
    move |r| Ok((Door::into_namespace(name(&r), access), r))
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
            role: raft::Role::of_member(id, voter, leader).as_str().into(),
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
