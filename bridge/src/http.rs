//! `/healthz` (the process runs), `/readyz` (connected, snapshot loaded,
//! watching), `/metrics` (Prometheus text), served with axum.

use crate::controller::Shared;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use std::sync::atomic::Ordering;
use std::sync::Arc;

pub async fn serve(listener: tokio::net::TcpListener, shared: Arc<Shared>) {
    let app = Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(shared);
    if let Err(e) = axum::serve(listener, app).await {
        tracing::error!(error = %e, "HTTP server stopped");
    }
}

async fn readyz(State(s): State<Arc<Shared>>) -> impl IntoResponse {
    if s.ready.load(Ordering::SeqCst) {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready: connecting to etcd or loading the snapshot\n")
    }
}

async fn metrics(State(s): State<Arc<Shared>>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], s.metrics.encode())
}
