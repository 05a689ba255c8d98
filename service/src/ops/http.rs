//! What an operator probes: liveness (`/healthz`), readiness (`/readyz`)
//! and the metrics (`/metrics`) over HTTP on `--metrics-listen`, and the
//! standard gRPC health service (`grpc.health.v1.Health`) on the node port.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use super::metrics::{Metrics, CONTENT_TYPE};
use crate::core::{Call, Core};

/// How long a readiness check waits for the leader's read index.
pub const READY_WAIT: Duration = Duration::from_secs(1);

/// Whether this node is ready: it knows a leader and has applied the
/// leader's commit index as of now (a ReadIndex round), within
/// [`READY_WAIT`]. `Err` says why not.
pub async fn ready(core: &Core) -> Result<u64, String> {
    match tokio::time::timeout(READY_WAIT, core.linearizable(&Call::local())).await {
        Ok(Ok(index)) => Ok(index),
        Ok(Err(s)) => Err(s.message().to_string()),
        Err(_) => Err(format!(
            "no read index from a leader within {} ms",
            READY_WAIT.as_millis()
        )),
    }
}

/// Serves `/metrics`, `/healthz` and `/readyz` on `listener` until `stop`.
pub async fn serve_http(
    listener: tokio::net::TcpListener,
    core: Arc<Core>,
    metrics: Arc<Metrics>,
    stop: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    use axum::http::{header, StatusCode};
    use axum::routing::get;

    let c1 = core.clone();
    let app = axum::Router::new()
        .route(
            "/metrics",
            get(move || {
                let (core, metrics) = (c1.clone(), metrics.clone());
                async move {
                    (
                        [(header::CONTENT_TYPE, CONTENT_TYPE)],
                        metrics.render(&core),
                    )
                }
            }),
        )
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/readyz",
            get(move || {
                let core = core.clone();
                async move {
                    match ready(&core).await {
                        Ok(index) => (StatusCode::OK, format!("ready: applied {index}\n")),
                        Err(why) => (
                            StatusCode::SERVICE_UNAVAILABLE,
                            format!("not ready: {why}\n"),
                        ),
                    }
                }
            }),
        );
    axum::serve(listener, app)
        .with_graceful_shutdown(stop)
        .await
}

/// Keeps the gRPC health service's overall status ("") at SERVING while
/// [`ready`] holds, NOT_SERVING otherwise; checked every second.
pub async fn report_health(core: Arc<Core>, reporter: tonic_health::server::HealthReporter) {
    loop {
        let status = match ready(&core).await {
            Ok(_) => tonic_health::ServingStatus::Serving,
            Err(_) => tonic_health::ServingStatus::NotServing,
        };
        reporter.set_service_status("", status).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
