//! `/healthz` (the process runs), `/readyz` (connected, snapshot loaded,
//! watching), `/metrics` (Prometheus text), served with axum.

use crate::controller::Shared;
use axum::extract::{Query, State};
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing;
use axum::Router;
use std::sync::atomic::Ordering;
use std::sync::Arc;

pub async fn serve(listener: tokio::net::TcpListener, shared: Arc<Shared>) {
    let app = Router::new()
        .route("/healthz", routing::get(healthz))
        .route("/readyz", routing::get(readyz))
        .route("/metrics", routing::get(metrics))
        .route("/explain", routing::get(explain))
        .with_state(shared);
    if let Err(e) = axum::serve(listener, app).await {
        tracing::error!(error = %e, "HTTP server stopped");
    }
}

/// 200 while the controller makes progress; 503 with why once it has made
/// none for longer than its bound (docs: `--stall-bound`).
async fn healthz(State(s): State<Arc<Shared>>) -> impl IntoResponse {
    match s.health.problem() {
        None => (StatusCode::OK, "ok\n".to_string()),
        Some(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("unhealthy: {why}\n")),
    }
}

async fn readyz(State(s): State<Arc<Shared>>) -> impl IntoResponse {
    if s.ready.load(Ordering::SeqCst) {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready: connecting to etcd or loading the snapshot\n")
    }
}

/// `GET /explain?key=K[&value=V][&why_not=true][&depth=N][&format=text]`:
/// the explanation (JSON, docs/explain.md; or text) at the revision this
/// controller has applied. 404 for a key no rule knows, 503 while loading.
async fn explain(State(s): State<Arc<Shared>>, Query(q): Query<crate::explain::Question>, Query(f): Query<FormatParam>) -> axum::response::Response {
    use ccattler_engine::explain::ExplainError;
    if !s.ready.load(Ordering::SeqCst) {
        return (StatusCode::SERVICE_UNAVAILABLE, "not ready: connecting to etcd or loading the snapshot\n").into_response();
    }
    let (reply, answer) = tokio::sync::oneshot::channel();
    if s.explain.send(crate::explain::Asked { question: q, reply }).await.is_err() {
        return (StatusCode::SERVICE_UNAVAILABLE, "the controller is stopping\n").into_response();
    }
    match answer.await {
        Ok(Ok(e)) if f.format.as_deref() == Some("text") => ccattler_engine::explain::render::text(&e).into_response(),
        Ok(Ok(e)) => axum::Json(e).into_response(),
        Ok(Err(e @ (ExplainError::UnknownKey(_) | ExplainError::BadValue { .. }))) => (StatusCode::NOT_FOUND, format!("{e}\n")).into_response(),
        Ok(Err(e)) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")).into_response(),
        // The loop dropped the question: it is reconnecting or reloading rules.
        Err(_) => (StatusCode::SERVICE_UNAVAILABLE, "the controller is resynchronising; ask again\n").into_response(),
    }
}

#[derive(serde::Deserialize)]
struct FormatParam {
    format: Option<String>,
}

async fn metrics(State(s): State<Arc<Shared>>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], s.metrics.encode())
}

pub use ccattler_store::http::{encode_query, get};
