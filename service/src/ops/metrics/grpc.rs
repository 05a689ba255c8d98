//! Every gRPC call counted by method and code, and timed (a tower layer
//! on each port).

use super::*;

/// Whether `path` names a method of a service this node serves.
pub(super) fn known_path(path: &str) -> bool {
    const SERVICES: [&str; 14] = [
        "/xla.coordination.CoordinationService/",
        "/tensorflow.CoordinationService/",
        "/tensorflow.data.DispatcherService/",
        "/coordstore.v1.Node/",
        "/coordstore.v1.NodePeer/",
        "/coordstore.v1.NodeAdmin/",
        "/coordstore.v1.NodeOps/",
        "/coordstore.v1.NodeData/",
        "/coordstore.v1.Agent/",
        "/coordstore.v1.TorchStore/",
        "/coordstore.v1.ClosureQueue/",
        "/coordstore.v1.Rendezvous/",
        "/coordstore.v1.RaftPeer/",
        "/grpc.health.v1.Health/",
    ];
    SERVICES.iter().any(|s| {
        path.strip_prefix(s).is_some_and(|m| {
            !m.is_empty() && m.len() <= 64 && m.bytes().all(|b| b.is_ascii_alphanumeric())
        })
    })
}

/// Records every gRPC call (method, status code, latency) in [`Metrics`].
#[derive(Clone)]
pub struct GrpcMetricsLayer(pub Arc<Metrics>);

impl<S> tower::Layer<S> for GrpcMetricsLayer {
    type Service = GrpcMetrics<S>;

    fn layer(&self, inner: S) -> GrpcMetrics<S> {
        GrpcMetrics {
            inner,
            metrics: self.0.clone(),
        }
    }
}

/// The service [`GrpcMetricsLayer`] wraps around each gRPC service.
#[derive(Clone)]
pub struct GrpcMetrics<S> {
    inner: S,
    metrics: Arc<Metrics>,
}

impl<S, B, RB> tower::Service<http::Request<B>> for GrpcMetrics<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<RB>>,
    S::Future: Send + 'static,
    S::Error: 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let method = req.uri().path().to_string();
        let metrics = self.metrics.clone();
        let t0 = Instant::now();
        let fut = self.inner.call(req);
        Box::pin(async move {
            let r = fut.await;
            // tonic answers an error as trailers-only: the status is in the
            // headers; a success carries it in the trailers (OK).
            let code = match &r {
                Ok(resp) => resp
                    .headers()
                    .get("grpc-status")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0),
                Err(_) => tonic::Code::Unknown as i32,
            };
            metrics.record_call(&method, code, t0.elapsed());
            r
        })
    }
}
