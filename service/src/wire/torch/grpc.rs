//! `coordstore.v1.TorchStore`: PyTorch's TCPStore protocol over gRPC, for
//! the relay. Each call runs one request of a relayed connection as this
//! node's own TCPStore server runs it ([`super::conn::Session`]); the relay
//! carries the session between calls (its sequence numbers, the
//! STOP_WAITING written) and the connection's id is the call's origin's
//! client id, so a request re-sent to another node after a failover is
//! applied once.

use std::sync::Arc;

use bytes::BytesMut;
use proto::coordstore::torch_store_server::{TorchStore, TorchStoreServer};
use proto::coordstore::{
    TorchCloseReply, TorchCloseRequest, TorchReply, TorchRequest, TorchStopsReply,
    TorchStopsRequest,
};
use proto::torch::Decoder;
use tonic::{Request, Response, Status};

use super::conn::{Ended, Session};
use crate::areas::torch::Store;
use crate::core::call::plain;
use crate::core::{Access, Call, CallError, CallResult};

/// The TorchStore service of one node.
pub struct TorchApi {
    store: Arc<Store>,
}

impl TorchApi {
    /// The tonic service.
    pub fn server(store: Arc<Store>, max_message_bytes: usize) -> TorchStoreServer<Self> {
        TorchStoreServer::new(TorchApi { store })
            .max_decoding_message_size(max_message_bytes)
            .max_encoding_message_size(max_message_bytes)
    }
}

/// The relayed connection a call speaks for: its origin's client id, and
/// the origin's seq.
fn connection(c: &Call) -> CallResult<(u64, u64)> {
    let o = c.origin().ok_or_else(|| {
        CallError::Status(Status::invalid_argument(
            "a TorchStore call needs an origin (x-coordstore-origin): the connection's session",
        ))
    })?;
    Ok((o.client_id, o.seq))
}

impl TorchApi {
    /// One call of the relay's API through the pipeline: admitted to the
    /// namespace, then `body` with the store.
    async fn serve<Req, Resp, Fut>(
        &self,
        req: Request<Req>,
        body: impl FnOnce(Arc<Store>, Call, Req) -> Fut,
    ) -> Result<Response<Resp>, Status>
    where
        Fut: std::future::Future<Output = CallResult<Resp>>,
    {
        let store = &self.store;
        let errors = |_: &Call, d: &journal::DomainError| plain(d);
        super::super::serve(
            store.core(),
            req,
            super::super::door(Access::Namespace),
            errors,
            |c, r| async move {
                let answer = body(store.clone(), c.clone(), r).await;
                (c, answer)
            },
        )
        .await
    }
}

#[tonic::async_trait]
impl TorchStore for TorchApi {
    async fn request(&self, req: Request<TorchRequest>) -> Result<Response<TorchReply>, Status> {
        self.serve(
            req,
            |store, c, r| async move { request(&store, &c, r).await },
        )
        .await
    }

    async fn stops(
        &self,
        req: Request<TorchStopsRequest>,
    ) -> Result<Response<TorchStopsReply>, Status> {
        self.serve(req, |store, c, r| async move { stops(&store, &c, r).await })
            .await
    }

    async fn close(
        &self,
        req: Request<TorchCloseRequest>,
    ) -> Result<Response<TorchCloseReply>, Status> {
        self.serve(req, |store, c, _| async move {
            connection(&c).map(|(id, _)| {
                store.relayed_closed(c.namespace(), id);
                TorchCloseReply {}
            })
        })
        .await
    }
}

async fn request(store: &Arc<Store>, c: &Call, r: TorchRequest) -> CallResult<TorchReply> {
    let (_, first) = connection(c)?;
    let carried = (first.saturating_sub(1), r.written, r.recorded);
    let mut s = Session::relayed(store.clone(), c.clone(), carried);
    let mut buf = BytesMut::from(&r.request[..]);
    let ended = match Decoder::default().decode(&mut buf) {
        Ok(Some(op)) if buf.is_empty() => s.run(op).await.err(),
        Ok(_) => Some(Ended::Bad("not one whole request".into())),
        Err(bad) => Some(Ended::Bad(bad.to_string())),
    };
    // The relay sends the request again to another node (with the same
    // origins: exactly once); the client's connection stays.
    if let Some(Ended::Unavailable(status)) = ended {
        return Err(status.into());
    }
    let after = s.carried();
    Ok(TorchReply {
        reply: after.reply,
        written: after.written,
        recorded: after.recorded,
        waiting: after.watch_at.is_some(),
        index: after.watch_at.unwrap_or(0),
        last_seq: after.seq,
        close: ended.is_some(),
        why: ended.map(|e| format!("{e:?}")).unwrap_or_default(),
    })
}

async fn stops(store: &Store, c: &Call, r: TorchStopsRequest) -> CallResult<TorchStopsReply> {
    let (id, _) = connection(c)?;
    let _alive = store.watching(c.namespace(), id);
    let view = store.watch(c, id, r.seen, r.index).await?;
    Ok(match view {
        None => TorchStopsReply {
            gone: true,
            ..Default::default()
        },
        Some(v) => {
            if v.registered == 0 {
                store.core().store_sessions().released(id);
            }
            TorchStopsReply {
                stops: v.stops,
                waiting: v.registered > 0,
                gone: false,
            }
        }
    })
}
