//! The status page on the metrics listener (`/ui`): the cluster, every
//! namespace, one namespace's tasks as a grid with its pending barriers and
//! the tasks they wait for. Read-only, and self-contained (the page, its
//! script and its style are in the binary: clusters run air-gapped). The
//! JSON it refreshes itself from (`/ui/api/...`) reads this node's state
//! and asks the leader only what the leader alone knows; nothing here
//! proposes anything.
//!
//! | path | what |
//! |---|---|
//! | `/ui`, `/ui/ns/NAME`, `/ui/ns/NAME/task/TASK`, `/ui/ns/NAME/barrier/ID` | the page (404 when the namespace, task or barrier does not exist) |
//! | `/ui/api/cluster` | members, roles, term, each node's applied index and readiness |
//! | `/ui/api/namespaces` | every namespace's summary |
//! | `/ui/api/namespaces/NAME` | one namespace in full (404: `{"error": ...}`) |
//! | `/ui/api/namespaces/NAME/tasks/TASK`, `.../barriers/ID` | one task, one barrier |
//!
//! The page builds its DOM with `textContent` only (every string a user
//! chose — keys, job names, error messages, barrier ids — shows as text),
//! and the policy sent with it runs no script or style but its own.

mod views;

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{header, HeaderName, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::{json, Value};

use super::diagnose;
use crate::core::Core;

const PAGE: &str = include_str!("page.html");
const SCRIPT: &str = include_str!("page.js");
const STYLE: &str = include_str!("page.css");

/// Only the page's own script, style and JSON: nothing from elsewhere, no
/// inline script, no framing.
const POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; \
     frame-ancestors 'none'";

type Ui = State<Arc<Core>>;

/// The page's routes over `core`.
pub fn routes(core: Arc<Core>) -> axum::Router {
    axum::Router::new()
        .route("/ui", get(page))
        .route("/ui/", get(page))
        .route(
            "/ui/page.js",
            get(|| async { asset(SCRIPT, "text/javascript") }),
        )
        .route("/ui/page.css", get(|| async { asset(STYLE, "text/css") }))
        .route("/ui/ns/{name}", get(namespace_page))
        .route("/ui/ns/{name}/task/{*task}", get(task_page))
        .route("/ui/ns/{name}/barrier/{*id}", get(barrier_page))
        .route("/ui/api/cluster", get(cluster))
        .route("/ui/api/namespaces", get(namespaces))
        .route("/ui/api/namespaces/{name}", get(namespace))
        .route("/ui/api/namespaces/{name}/tasks/{*task}", get(task))
        .route("/ui/api/namespaces/{name}/barriers/{*id}", get(barrier))
        .with_state(core)
}

/// The headers every answer carries: not cached, not sniffed.
fn headers(content_type: &'static str) -> [(HeaderName, &'static str); 4] {
    [
        (header::CONTENT_TYPE, content_type),
        (header::CACHE_CONTROL, "no-store"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "no-referrer"),
    ]
}

fn asset(body: &'static str, content_type: &'static str) -> Response {
    (headers(content_type), body).into_response()
}

/// The page, with `status` (404: it then says what does not exist).
fn html(status: StatusCode) -> Response {
    let policy = [
        (header::CONTENT_SECURITY_POLICY, POLICY),
        (header::X_FRAME_OPTIONS, "DENY"),
    ];
    (status, headers("text/html; charset=utf-8"), policy, PAGE).into_response()
}

fn json_answer(status: StatusCode, v: &Value) -> Response {
    (status, headers("application/json"), v.to_string()).into_response()
}

/// A failed read as JSON: `{"error": ...}` with the HTTP status of its code.
fn failed(s: &tonic::Status) -> Response {
    let status = match s.code() {
        tonic::Code::NotFound => StatusCode::NOT_FOUND,
        tonic::Code::InvalidArgument => StatusCode::BAD_REQUEST,
        tonic::Code::Unavailable | tonic::Code::DeadlineExceeded => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    json_answer(status, &json!({"error": s.message()}))
}

fn answer(r: crate::core::CallResult<Value>) -> Response {
    match r {
        Ok(v) => json_answer(StatusCode::OK, &v),
        Err(e) => failed(&e.into_plain_status()),
    }
}

fn no_namespace(name: &str) -> tonic::Status {
    crate::core::call::plain(&journal::namespace::unknown(
        journal::namespace::namespace_key(name),
    ))
}

fn found(yes: bool) -> StatusCode {
    if yes {
        StatusCode::OK
    } else {
        StatusCode::NOT_FOUND
    }
}

async fn page() -> Response {
    html(StatusCode::OK)
}

async fn namespace_page(State(core): Ui, Path(name): Path<String>) -> Response {
    html(found(views::exists(&core, &name, |_| true)))
}

async fn task_page(State(core): Ui, Path((name, task)): Path<(String, String)>) -> Response {
    let known = views::exists(&core, &name, |n| diagnose::parse_task(n, &task).is_ok());
    html(found(known))
}

async fn barrier_page(State(core): Ui, Path((name, id)): Path<(String, String)>) -> Response {
    let known = views::exists(&core, &name, |n| n.coordination().barrier(&id).is_some());
    html(found(known))
}

async fn cluster(State(core): Ui) -> Response {
    json_answer(StatusCode::OK, &views::cluster(&core).await)
}

async fn namespaces(State(core): Ui) -> Response {
    json_answer(StatusCode::OK, &views::namespaces(&core).await)
}

async fn namespace(State(core): Ui, Path(name): Path<String>) -> Response {
    if !views::exists(&core, &name, |_| true) {
        return failed(&no_namespace(&name));
    }
    answer(views::namespace(&core, &name).await)
}

async fn task(State(core): Ui, Path((name, task)): Path<(String, String)>) -> Response {
    answer(views::one_task(&core, &name, &task).await)
}

async fn barrier(State(core): Ui, Path((name, id)): Path<(String, String)>) -> Response {
    answer(views::one_barrier(&core, &name, &id).await)
}
