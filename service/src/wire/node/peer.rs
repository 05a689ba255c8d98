//! What nodes ask each other (besides Raft): a follower's read index and
//! the heartbeats it forwards to its leader, and a node's own facts of a
//! namespace's PyTorch store (for the operators' view on another node). Served as `NodePeer` on the
//! peer port (and as `Node`'s methods of the same names, for builds before
//! `NodePeer`).

use super::*;

impl NodeApi {
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
