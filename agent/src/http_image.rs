//! The built-in `builtin:http` image: a tiny HTTP server, so demos and tests
//! need nothing but the `ccattler` binary. It listens on `HOST:PORT` (from
//! its environment), answers `GET /` with the instance, service and node
//! names, `GET /healthz` with `ok`, anything else with 404, and exits 0 on
//! SIGTERM.

use axum::routing::get;

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("serve-http: {0} is not set (the agent sets it)")]
    Env(&'static str),
    #[error("serve-http: PORT={0:?} is not a port")]
    Port(String),
    #[error("serve-http: cannot listen on {addr}: {source}")]
    Bind { addr: String, source: std::io::Error },
    #[error("serve-http: {0}")]
    Io(#[from] std::io::Error),
}

pub async fn serve(instance: String) -> Result<(), ServeError> {
    let env = |k: &'static str| std::env::var(k).map_err(|_| ServeError::Env(k));
    let port = env("PORT")?;
    let port: u16 = port.parse().map_err(|_| ServeError::Port(port.clone()))?;
    let host = std::env::var("HOST").unwrap_or_else(|_| "127.0.0.1".into());
    let service = std::env::var("CCATTLER_SERVICE").unwrap_or_default();
    let node = std::env::var("CCATTLER_NODE").unwrap_or_default();
    let hello = format!("{instance} of {service} on {node}\n");
    let app = axum::Router::new().route("/", get(move || async move { hello })).route("/healthz", get(|| async { "ok\n" }));
    let addr = format!("{host}:{port}");
    let listener = tokio::net::TcpListener::bind(&addr).await.map_err(|source| ServeError::Bind { addr: addr.clone(), source })?;
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            term.recv().await;
        })
        .await?;
    Ok(())
}
