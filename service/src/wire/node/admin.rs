//! The Node API's administration: the namespace lifecycle (create,
//! delete, reset, export, import), membership changes, and the whole state
//! for a backup — cluster verbs, admitted for the cluster's admins only.

use super::*;

impl NodeApi {
    pub(super) async fn create_namespace(
        &self,
        req: Request<CreateNamespaceRequest>,
    ) -> Reply<NamespaceInfo> {
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

    pub(super) async fn delete_namespace(
        &self,
        req: Request<NamespaceRequest>,
    ) -> Reply<NamespaceInfo> {
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

    pub(super) async fn reset_namespace(
        &self,
        req: Request<ResetNamespaceRequest>,
    ) -> Reply<NamespaceInfo> {
        let ns = &self.namespaces;
        let at = door(Access::Cluster("namespace reset"));
        self.call(req, at, |c, r: ResetNamespaceRequest| async move {
            ns.reset(&c, &r.name, r.tasks).await?;
            namespaces::info(ns, &c, &r.name)
        })
        .await
    }

    pub(super) async fn export_namespace(
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

    pub(super) async fn import_namespace(
        &self,
        req: Request<ImportNamespaceRequest>,
    ) -> Reply<NamespaceInfo> {
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

    pub(super) async fn add_member(
        &self,
        req: Request<AddMemberRequest>,
    ) -> Reply<MembershipResponse> {
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
            self.on_leader(&c, r, Forwarding::LONG, local, remote)
                .await?;
            Ok(MembershipResponse {
                members: status(core).members,
            })
        })
        .await
    }

    pub(super) async fn remove_member(
        &self,
        req: Request<RemoveMemberRequest>,
    ) -> Reply<MembershipResponse> {
        let (core, node) = (self.core(), self.core().node());
        let local =
            |r: RemoveMemberRequest| async move { Ok(node.remove(r.id).await.map_err(Retry)?) };
        let remote = |mut l: NodeClient<Channel>, mut r| async move {
            node.peer_token().attach(&mut r);
            l.remove_member(r).await.map(|_| Response::new(()))
        };
        let at = door(Access::Membership("member remove"));
        self.call(req, at, |c, r| async move {
            self.on_leader(&c, r, Forwarding::LONG, local, remote)
                .await?;
            Ok(MembershipResponse {
                members: status(core).members,
            })
        })
        .await
    }

    pub(super) async fn state(&self, req: Request<StateRequest>) -> Reply<StateResponse> {
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
            self.on_leader(&c, r, Forwarding::LONG_READ, local, remote)
                .await
        })
        .await
    }
}

/// How long AddMember keeps asking a new node for its journal feature
/// level before it gives up (UNAVAILABLE).
const LEVEL_ASK_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

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

impl NodeApi {
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
        let how = Forwarding {
            exactly_once: true,
            ..Forwarding::LONG
        };
        let remote = |ch, r| remote(router.node_client(ch), r);
        router.forward_call(c, r, how, local, remote).await
    }
}
