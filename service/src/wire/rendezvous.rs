//! `coordstore.v1.Rendezvous`, torchrun's native rendezvous on the node
//! port (journal area `rendezvous`). The API's messages keep the journal's
//! field numbers (a RendezvousNode is a `Node`, a RendezvousView a `View`),
//! so a message becomes the journal's by re-reading its encoding
//! ([`journal_of`]); the tests below hold the two in step. A keep-alive
//! runs on the leader, forwarded whole from a follower.

use journal::pb::rendezvous::{self as cmd, Node, View};
use journal::DomainError;
use prost::Message;
use proto::coordstore::rendezvous_client::RendezvousClient;
use proto::coordstore::rendezvous_server::{Rendezvous as Service, RendezvousServer};
use proto::coordstore::*;
use tonic::{Request, Response, Status};

use crate::areas::rendezvous::Rendezvous;
use crate::core::call::plain;
use crate::core::router::{Attempt, Forwarding};
use crate::core::{Access, Call, CallResult};

/// The rendezvous service of one node.
pub struct RendezvousApi {
    area: Rendezvous,
}

impl RendezvousApi {
    /// The tonic service.
    pub fn server(area: Rendezvous, max_message_bytes: usize) -> RendezvousServer<Self> {
        RendezvousServer::new(RendezvousApi { area })
            .max_decoding_message_size(max_message_bytes)
            .max_encoding_message_size(max_message_bytes)
    }
}

/// The message with the same field numbers as `m`.
fn journal_of<T: Message + Default>(m: &impl Message) -> CallResult<T> {
    T::decode(m.encode_to_vec().as_slice())
        .map_err(|e| Status::internal(format!("a message did not read as its twin: {e}")).into())
}

fn node(n: Option<RendezvousNode>) -> CallResult<Node> {
    journal_of(&n.unwrap_or_default())
}

fn answer(v: View) -> CallResult<RendezvousView> {
    journal_of(&v)
}

/// Writes the service: one row per method, each served by the module's
/// handler of the same name, `async fn m(a: &Rendezvous, c: &Call, r: Req)
/// -> CallResult<Resp>`, admitted to the call's namespace.
macro_rules! rendezvous {
    ($($method:ident($req:ty) -> $resp:ty;)*) => {
        #[tonic::async_trait]
        impl Service for RendezvousApi {
            $(
                async fn $method(&self, req: Request<$req>) -> Result<Response<$resp>, Status> {
                    let a = &self.area;
                    let in_namespace = super::door(Access::Namespace);
                    let errors = |_: &Call, d: &DomainError| plain(d);
                    super::serve(a.core(), req, in_namespace, errors, |c, r| async move {
                        let answer = $method(a, &c, r).await;
                        (c, answer)
                    })
                    .await
                }
            )*
        }
    };
}

rendezvous! {
    join(RendezvousJoinRequest) -> RendezvousView;
    leave(RendezvousLeaveRequest) -> RendezvousView;
    close(RendezvousCloseRequest) -> RendezvousView;
    watch(RendezvousWatchRequest) -> RendezvousView;
    keep_alive(RendezvousKeepAliveRequest) -> RendezvousKeepAliveResponse;
}

type Answer<T> = CallResult<T>;

async fn join(a: &Rendezvous, c: &Call, r: RendezvousJoinRequest) -> Answer<RendezvousView> {
    let settings: cmd::Settings = journal_of(&r.settings.unwrap_or_default())?;
    let j = crate::areas::rendezvous::join(r.run, node(r.node)?, settings);
    answer(a.step(c, j).await?)
}

async fn leave(a: &Rendezvous, c: &Call, r: RendezvousLeaveRequest) -> Answer<RendezvousView> {
    let l = cmd::Leave {
        run: r.run,
        node: Some(node(r.node)?),
    };
    answer(a.step(c, l).await?)
}

async fn close(a: &Rendezvous, c: &Call, r: RendezvousCloseRequest) -> Answer<RendezvousView> {
    answer(a.step(c, cmd::Close { run: r.run }).await?)
}

async fn watch(a: &Rendezvous, c: &Call, r: RendezvousWatchRequest) -> Answer<RendezvousView> {
    let n = node(r.node)?;
    let wait = std::time::Duration::from_millis(r.wait_ms);
    answer(a.watch(c, &r.run, &n, r.epoch, Some(wait)).await?)
}

/// Recorded by the leader's rendezvous duty: here when this node leads,
/// else the whole call forwarded to the leader's service.
async fn keep_alive(
    a: &Rendezvous,
    c: &Call,
    r: RendezvousKeepAliveRequest,
) -> Answer<RendezvousKeepAliveResponse> {
    let router = a.core().router();
    let max = router.max_message_bytes();
    let how = Forwarding {
        read: false,
        attempt: Attempt::Short,
        exactly_once: false,
    };
    let here = |c: Call, r: RendezvousKeepAliveRequest| async move {
        a.keep_alive_here(&c, &r.run, &node(r.node)?);
        Ok(RendezvousKeepAliveResponse {})
    };
    let there = |ch, r| async move {
        let mut leader = RendezvousClient::new(ch)
            .max_decoding_message_size(max)
            .max_encoding_message_size(max);
        leader.keep_alive(r).await
    };
    router.forward_call(c, r, how, here, there).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_api_and_the_journal_read_each_other() {
        let v = View {
            round: 3,
            complete: true,
            closed: true,
            place: cmd::Place::Redundant as i32,
            rank: 2,
            world_size: 5,
            waiting: 1,
            participants: 5,
            epoch: 9,
            exists: true,
        };
        let wire = answer(v).expect("reads");
        assert_eq!(wire.place(), RendezvousPlace::Redundant);
        assert_eq!(
            (wire.round, wire.rank, wire.world_size, wire.epoch),
            (3, 2, 5, 9)
        );
        assert!(wire.complete && wire.closed && wire.exists);
        assert_eq!((wire.waiting, wire.participants), (1, 5));
        let n = RendezvousNode {
            addr: "10.0.0.1".into(),
            pid: 7,
            local_id: 2,
        };
        let j: Node = node(Some(n)).expect("reads");
        assert_eq!((j.addr.as_str(), j.pid, j.local_id), ("10.0.0.1", 7, 2));
        let s = RendezvousSettings {
            min_nodes: 1,
            max_nodes: 4,
            last_call_ms: 30_000,
            liveness_ms: 15_000,
        };
        let js: cmd::Settings = journal_of(&s).expect("reads");
        assert_eq!(
            (js.min_nodes, js.max_nodes, js.last_call_ms, js.liveness_ms),
            (1, 4, 30_000, 15_000)
        );
    }
}
