//! The Node API's data calls for tools and `ctl`: a journal update
//! proposed (only a command a client may issue; see [`propose_door`]),
//! and linearizable reads of a namespace's keys.

use super::*;

impl NodeApi {
    pub(super) async fn propose(&self, req: Request<ProposeRequest>) -> Reply<ProposeResponse> {
        // Whole or not at all: a field this build does not know (a newer
        // ctl's, a newer node's forward) is refused, never dropped. The call
        // is admitted in the update's namespace, as its command needs (a
        // peer's forward was admitted where it arrived).
        let at = |r: ProposeRequest| {
            let mut u = journal::decode_known::<Update>(&r.update)
                .map_err(|e| Status::invalid_argument(format!("the journal update: {e}")))?;
            Ok((propose_door(&mut u, self.peer)?, u))
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

    pub(super) async fn kv_get(&self, req: Request<KvGetRequest>) -> Reply<KvGetResponse> {
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
            self.on_leader(&c, r, Forwarding::READ, local(c.clone()), remote)
                .await
        })
        .await
    }

    pub(super) async fn kv_list(&self, req: Request<KvListRequest>) -> Reply<KvListResponse> {
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
            self.on_leader(&c, r, Forwarding::READ, local(c.clone()), remote)
                .await
        })
        .await
    }
}

/// Where an update proposed through the Node API (ctl, tools, other nodes
/// forwarding their clients' calls) is admitted: as its command's kind
/// says (`Access::Update`: a client command in its namespace, a job epoch
/// reset as a cluster verb, a leader runtime's command never; a node's
/// bookkeeping for the clients it holds only through `NodePeer`, `peer`, as
/// a node-to-node call into its namespace). The time is the leader's to
/// stamp. A command-less update is INVALID_ARGUMENT.
fn propose_door(u: &mut Update, peer: bool) -> Result<Door, Status> {
    let Some(command) = &u.command else {
        return Err(Status::invalid_argument("the update has no command"));
    };
    let access = match UpdateKind::of(command) {
        UpdateKind::Node if peer => Access::Peer(&Access::Namespace),
        kind => Access::Update(kind),
    };
    u.at_ms = 0;
    let ns = journal::namespace::namespace_name(&u.namespace);
    Ok(Door::into_namespace(ns, access))
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
