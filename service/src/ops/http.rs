//! What an operator probes: liveness (`/healthz`), readiness (`/readyz`),
//! the metrics (`/metrics`) and the status page (`/ui`, [`super::ui`]) over
//! HTTP on `--metrics-listen`, and the standard gRPC health service
//! (`grpc.health.v1.Health`) on the node port.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use super::metrics::{Metrics, CONTENT_TYPE};
use crate::core::Core;

pub use super::{ready, READY_WAIT};

/// Serves `/metrics`, `/healthz`, `/readyz` and the status page on
/// `listener` until `stop`. A scrape checks readiness too
/// (`coordstore_ready`).
pub async fn serve_http(
    listener: tokio::net::TcpListener,
    core: Arc<Core>,
    metrics: Arc<Metrics>,
    stop: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    use axum::http::{header, StatusCode};
    use axum::routing::get;

    let c1 = core.clone();
    let page = super::ui::routes(core.clone());
    let app = axum::Router::new()
        .route(
            "/metrics",
            get(move || {
                let (core, metrics) = (c1.clone(), metrics.clone());
                async move {
                    metrics.set_ready(ready(&core).await.is_ok());
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
        )
        .merge(page);
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
