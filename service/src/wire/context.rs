//! The gRPC transport's side of the call context: a [`Call`] made of a
//! request's metadata (the origin, namespace and timeout headers, the
//! forward marker), the port it arrived on and the client's certificate.
//! The dialects on HTTP/2 build every call here; another transport builds
//! its [`CallContext`] its own way.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, Instant};

use journal::pb::Origin;
use proto::origin::WireOrigin;
use tonic::metadata::MetadataMap;
use tonic::{Request, Status};

use crate::core::call::{journal_origin, CallContext, PeerCredentials, DEFAULT_NAMESPACE};
use crate::core::router::FORWARDED;
use crate::core::Call;
pub use proto::{NAMESPACE_HEADER, ORIGIN_HEADER};

/// The namespace of the port a request arrived on: a request extension a
/// namespace port's listener puts on every request, which wins over any
/// header.
#[derive(Clone, Debug)]
pub struct PortNamespace(pub String);

/// A request that arrived on the peer port (another node's forward, over
/// the peers' own mutual TLS): the node that took the call from its client
/// admitted it. A request extension the peer port's server puts on every
/// request; a client cannot set it.
#[derive(Clone, Copy, Debug)]
pub struct PeerPort;

/// The call of `req`: its origin (a malformed [`ORIGIN_HEADER`] is
/// INVALID_ARGUMENT before anything happens), its deadline
/// (`grpc-timeout`), its namespace (the port's, else the header's), whether
/// a node forwarded it, and the client's certificate.
pub fn call_of<T>(req: &Request<T>) -> Result<Call, Status> {
    let md = req.metadata();
    let namespace = match req.extensions().get::<PortNamespace>() {
        Some(PortNamespace(name)) => name.clone(),
        None => header_namespace(md)?.into_owned(),
    };
    let origin = header_origin(md)?;
    let forwarded = md.contains_key(FORWARDED);
    Ok(Call::new(CallContext {
        namespace: Some(namespace),
        retried_elsewhere: origin.is_some() || forwarded,
        origin,
        deadline: grpc_timeout(md).map(|t| Instant::now() + t),
        forwarded,
        peer_certs: req.peer_certs(),
        from_peer: req.extensions().get::<PeerPort>().is_some(),
        peer_credentials: peer_credentials(md),
    }))
}

/// The peer token and cluster id `md` presents, if any.
fn peer_credentials(md: &MetadataMap) -> Option<Arc<PeerCredentials>> {
    let read = |k: &str| md.get(k).map(|v| v.as_bytes().to_vec());
    let (token, cluster) = (
        read(raft::PEER_TOKEN_HEADER),
        read(raft::PEER_CLUSTER_HEADER),
    );
    (token.is_some() || cluster.is_some()).then(|| Arc::new(PeerCredentials { token, cluster }))
}

/// A layer that puts a copy of `T` in every request's extensions: how a
/// listener tells a call where it arrived ([`PortNamespace`], [`PeerPort`]).
#[derive(Clone)]
pub struct Tag<T>(pub T);

impl<S, T: Clone> tower::Layer<S> for Tag<T> {
    type Service = Tagged<S, T>;

    fn layer(&self, inner: S) -> Tagged<S, T> {
        Tagged {
            inner,
            tag: self.0.clone(),
        }
    }
}

/// The service [`Tag`] wraps around each service of a listener.
#[derive(Clone)]
pub struct Tagged<S, T> {
    inner: S,
    tag: T,
}

impl<S, B, T> tower::Service<http::Request<B>> for Tagged<S, T>
where
    S: tower::Service<http::Request<B>>,
    T: Clone + Send + Sync + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<B>) -> Self::Future {
        req.extensions_mut().insert(self.tag.clone());
        self.inner.call(req)
    }
}

/// The origin `md` carries in [`ORIGIN_HEADER`], if any
/// (`CLIENT_ID:SEQ[:DONE_BELOW]`, see [`proto::origin`]).
fn header_origin(md: &MetadataMap) -> Result<Option<Origin>, Status> {
    let Some(v) = md.get(ORIGIN_HEADER) else {
        return Ok(None);
    };
    let text = v.to_str().map_err(|_| {
        Status::invalid_argument(format!(
            "malformed {ORIGIN_HEADER} header (want CLIENT_ID:SEQ[:DONE_BELOW])"
        ))
    })?;
    let o = WireOrigin::parse(text)
        .map_err(|e| Status::invalid_argument(format!("{ORIGIN_HEADER} header: {e}")))?;
    Ok(Some(journal_origin(o)))
}

/// The namespace `md` names in [`NAMESPACE_HEADER`] (a DNS label), or the
/// default one.
fn header_namespace(md: &MetadataMap) -> Result<Cow<'static, str>, Status> {
    let Some(v) = md.get(NAMESPACE_HEADER) else {
        return Ok(Cow::Borrowed(DEFAULT_NAMESPACE));
    };
    let name = v.to_str().unwrap_or_default();
    if !journal::namespace::valid_name(name) {
        return Err(Status::invalid_argument(format!(
            "{NAMESPACE_HEADER}: {:?} is not a namespace name (a DNS label)",
            String::from_utf8_lossy(v.as_bytes())
        )));
    }
    Ok(Cow::Owned(name.to_string()))
}

/// The caller's timeout from `grpc-timeout` (gRPC over HTTP/2: up to eight
/// digits and a unit, H M S m u n).
fn grpc_timeout(md: &MetadataMap) -> Option<Duration> {
    let v = md.get("grpc-timeout")?.to_str().ok()?;
    let (digits, unit) = v.split_at(v.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_reads_its_origin_deadline_and_forward_marker_once() {
        let mut req = Request::new(());
        req.metadata_mut()
            .insert(ORIGIN_HEADER, "7:3:2".parse().unwrap());
        req.metadata_mut()
            .insert("grpc-timeout", "1500m".parse().unwrap());
        let c = call_of(&req).unwrap();
        assert_eq!(
            c.origin(),
            Some(Origin {
                client_id: 7,
                seq: 3,
                done_below: 2
            })
        );
        assert!(!c.forwarded());
        let left = c.deadline().unwrap() - Instant::now();
        assert!(left <= Duration::from_millis(1500) && left > Duration::from_millis(1000));
        // A forward carries the origin, the marker and what is left of the
        // deadline.
        let f = crate::core::router::forward(&c, ());
        assert_eq!(f.metadata().get(ORIGIN_HEADER).unwrap(), "7:3:2");
        let back = call_of(&f).unwrap();
        assert!(back.forwarded());
        assert!(back.deadline().unwrap() <= c.deadline().unwrap() + Duration::from_millis(5));
    }

    #[test]
    fn a_call_names_its_namespace_by_port_over_header() {
        let mut req = Request::new(());
        assert_eq!(call_of(&req).unwrap().namespace_key(), "");
        req.metadata_mut()
            .insert(NAMESPACE_HEADER, "job-a".parse().unwrap());
        let c = call_of(&req).unwrap();
        assert_eq!(c.namespace(), "job-a");
        assert_eq!(
            crate::core::router::forward(&c, ())
                .metadata()
                .get(NAMESPACE_HEADER)
                .unwrap(),
            "job-a"
        );
        req.extensions_mut().insert(PortNamespace("job-b".into()));
        assert_eq!(call_of(&req).unwrap().namespace(), "job-b");
        let mut bad = Request::new(());
        bad.metadata_mut()
            .insert(NAMESPACE_HEADER, "Job_A".parse().unwrap());
        let e = call_of(&bad).unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
    }

    #[test]
    fn a_malformed_origin_is_invalid_argument() {
        let mut req = Request::new(());
        req.metadata_mut()
            .insert(ORIGIN_HEADER, "7".parse().unwrap());
        let e = call_of(&req).unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
    }
}
