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
    let mut app = Router::new()
        .route("/healthz", routing::get(healthz))
        .route("/readyz", routing::get(readyz))
        .route("/metrics", routing::get(metrics))
        .route("/explain", routing::get(explain));
    if shared.console.is_some() {
        let html = || ui_asset("text/html; charset=utf-8", crate::console::INDEX_HTML);
        // Every console route behind one gate: its own credential.
        let console = Router::new()
            .route("/ui", html())
            .route("/ui/", html())
            .route("/ui/app.js", ui_asset("text/javascript; charset=utf-8", crate::console::APP_JS))
            .route("/ui/app.css", ui_asset("text/css; charset=utf-8", crate::console::APP_CSS))
            .route("/api/state", routing::get(api_state))
            .route("/api/rules", routing::get(api_rules))
            .route("/api/events", routing::get(api_events))
            .route_layer(axum::middleware::from_fn_with_state(shared.clone(), console_gate));
        app = app.merge(console);
    }
    let app = app.with_state(shared);
    if let Err(e) = axum::serve(listener, app).await {
        tracing::error!(error = %e, "HTTP server stopped");
    }
}

/// The console's gate: 401 (asking for basic auth) unless the console's
/// credential is presented.
async fn console_gate(State(s): State<Arc<Shared>>, request: axum::extract::Request, next: axum::middleware::Next) -> axum::response::Response {
    let auth = request.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    if s.console.as_ref().is_some_and(|c| c.admits(auth)) {
        return next.run(request).await;
    }
    (StatusCode::UNAUTHORIZED, [(header::WWW_AUTHENTICATE, "Basic realm=\"ccattler console\"")], "the console needs its credential (--ui-credentials)\n")
        .into_response()
}

/// One embedded file of the page.
fn ui_asset(kind: &'static str, body: &'static str) -> routing::MethodRouter<Arc<Shared>> {
    routing::get(move || async move { ([(header::CONTENT_TYPE, kind), (header::CACHE_CONTROL, "no-cache")], body) })
}

fn console(s: &Shared) -> &crate::console::Console {
    s.console.as_ref().expect("routed only with the console")
}

/// `GET /api/state`: the newest tables (JSON).
async fn api_state(State(s): State<Arc<Shared>>) -> axum::response::Response {
    let state = console(&s).state.borrow().clone();
    axum::Json(&*state).into_response()
}

/// `GET /api/rules`: the rule files run, and each output's size.
async fn api_rules(State(s): State<Arc<Shared>>) -> axum::response::Response {
    let rules = console(&s).rules.borrow().clone();
    axum::Json(&*rules).into_response()
}

/// `GET /api/events`: a server-sent event (`state`) with the tables each time
/// they change — one stream a page, not a poll a row.
async fn api_events(State(s): State<Arc<Shared>>) -> axum::response::Response {
    use axum::response::sse::{Event, KeepAlive, Sse};
    let mut rx = console(&s).state.subscribe();
    rx.mark_changed(); // the current state first
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.changed().await.ok()?;
        let state = rx.borrow_and_update().clone();
        let event = Event::default().event("state").json_data(&*state).ok()?;
        Some((Ok::<_, std::convert::Infallible>(event), rx))
    });
    Sse::new(stream).keep_alive(KeepAlive::default()).into_response()
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
