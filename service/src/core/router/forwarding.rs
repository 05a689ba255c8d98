//! What a forward carries and how it is sent: the request marked
//! forwarded with the call's origin, namespace and deadline; the peer
//! calls (through `NodePeer`, or `Node` for a leader of a build before
//! it); and [`Router::forward_call`], the one way a whole client call runs
//! on the leader or is forwarded to it.

use std::future::Future;
use std::time::Instant;

use prost::Message;
use proto::coordstore::node_client::NodeClient;
use proto::coordstore::HeartbeatRequest;
use tonic::transport::Channel;
use tonic::Status;

use super::{Attempt, Router, FORWARDED};
use crate::core::call::{wire_origin, Call, CallError, CallResult};

/// How a whole call runs on the leader (see [`Router::forward_call`]).
#[derive(Clone, Copy, Debug)]
pub struct Forwarding {
    /// A read: run after a read barrier on the leader.
    pub read: bool,
    /// How long one forward may wait on one leader.
    pub attempt: Attempt,
    /// It may change state: every attempt carries one origin.
    pub exactly_once: bool,
}

impl Forwarding {
    /// A read a healthy leader answers at once.
    pub const READ: Forwarding = Forwarding {
        read: true,
        attempt: Attempt::Short,
        exactly_once: false,
    };
    /// A read that may take long on a healthy leader (a state snapshot).
    pub const LONG_READ: Forwarding = Forwarding {
        attempt: Attempt::Whole,
        ..Forwarding::READ
    };
    /// A call that may take long on a healthy leader and makes its own
    /// retries safe (a membership change).
    pub const LONG: Forwarding = Forwarding {
        read: false,
        ..Forwarding::LONG_READ
    };
}

impl Router {
    /// Runs call `c` of request `r` on the leader: `local` here when this
    /// node leads (after a read barrier for a read), or the whole request
    /// sent by `remote` over a channel to the leader, marked forwarded (see
    /// [`forward`]), across leader changes as [`Router::on_leader_as`]
    /// does. The one way a call of a dialect or of the Node API reaches
    /// the leader.
    pub async fn forward_call<Req, T, E, L, LF, R, RF>(
        &self,
        c: &Call,
        r: Req,
        how: Forwarding,
        local: L,
        remote: R,
    ) -> CallResult<T>
    where
        Req: Clone,
        L: Fn(Call, Req) -> LF,
        LF: Future<Output = CallResult<T>>,
        R: Fn(Channel, tonic::Request<Req>) -> RF,
        RF: Future<Output = std::result::Result<tonic::Response<T>, E>>,
        E: Into<CallError>,
    {
        let (call, _lane) = match how.exactly_once {
            true => self.exactly_once(c),
            false => (c.clone(), None),
        };
        let (call, r, local, remote) = (&call, &r, &local, &remote);
        let here = || async move {
            if how.read {
                self.leader().read_barrier().await?;
            }
            local(call.clone(), r.clone()).await
        };
        let there = |ch| async move {
            let answer = remote(ch, forward(call, r.clone())).await;
            Ok(answer.map_err(Into::into)?.into_inner())
        };
        self.on_leader_as(call, how.attempt, here, there).await
    }

    /// A task's heartbeat forwarded to the leader at `ch` (its
    /// coordination duty records it): the duty's refusal, if any, is the
    /// call's domain error.
    pub async fn forward_heartbeat(
        &self,
        ch: Channel,
        call: &Call,
        task: u32,
        incarnation: u64,
    ) -> CallResult<()> {
        let req = HeartbeatRequest { task, incarnation };
        let max = self.max_message_bytes;
        let reply = peer_call!(ch, max, heartbeat, forward(call, req))?.into_inner();
        if reply.error.is_empty() {
            return Ok(());
        }
        let e = journal::DomainError::decode(reply.error.as_ref())
            .map_err(|e| Status::internal(format!("bad heartbeat answer: {e}")))?;
        Err(e.into())
    }
}

/// A request marked as forwarded by this node.
pub(super) fn forwarded<T>(msg: T) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    req.metadata_mut()
        .insert(FORWARDED, "1".parse().expect("ascii"));
    req
}

/// `msg` as `call` forwarded to the leader: marked forwarded, with the
/// call's origin, namespace and what is left of its deadline.
pub fn forward<M>(call: &Call, msg: M) -> tonic::Request<M> {
    let mut req = forwarded(msg);
    if let Some(o) = call.origin() {
        if let Ok(v) = wire_origin(o).header_value().parse() {
            req.metadata_mut()
                .insert(crate::core::call::ORIGIN_HEADER, v);
        }
    }
    if !call.namespace_key().is_empty() {
        if let Ok(v) = call.namespace().parse() {
            req.metadata_mut()
                .insert(crate::core::call::NAMESPACE_HEADER, v);
        }
    }
    if let Some(d) = call.deadline() {
        req.set_timeout(d.saturating_duration_since(Instant::now()));
    }
    req
}

/// A peer call `method` of `request` (made anew for each try) to the leader
/// at `ch`: through `NodePeer`, or, to a build before it (UNIMPLEMENTED),
/// through `Node`'s method of the same name.
macro_rules! peer_call {
    ($ch:expr, $max:expr, $method:ident, $request:expr) => {{
        let ch: ::tonic::transport::Channel = $ch;
        let asked = ::proto::coordstore::node_peer_client::NodePeerClient::new(ch.clone())
            .max_decoding_message_size($max)
            .max_encoding_message_size($max)
            .$method($request)
            .await;
        match asked {
            Err(s) if s.code() == ::tonic::Code::Unimplemented => {
                $crate::core::router::forwarding::node_client(ch, $max)
                    .$method($request)
                    .await
            }
            answer => answer,
        }
    }};
}
pub(super) use peer_call;

/// A Node API client on `ch` with `max` bytes per message either way.
pub(super) fn node_client(ch: Channel, max: usize) -> NodeClient<Channel> {
    NodeClient::new(ch)
        .max_decoding_message_size(max)
        .max_encoding_message_size(max)
}
