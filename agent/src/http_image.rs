//! The built-in `builtin:http` image: a tiny HTTP server, so demos and tests
//! need nothing but the `ccattler` binary. It listens on `HOST:PORT` (from
//! its environment), answers `GET /` with the instance, service and node
//! names, `GET /healthz` with `ok`, `GET /burn?ms=N` by keeping a core busy
//! for N ms (at most 10 s; load for autoscaling tests and demos), anything
//! else with 404, and exits 0 on SIGTERM.

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

#[derive(serde::Deserialize)]
struct Burn {
    ms: Option<u64>,
}

/// Keeps a core busy for `ms` milliseconds (at most 10 s).
async fn burn(axum::extract::Query(b): axum::extract::Query<Burn>) -> String {
    let ms = b.ms.unwrap_or(100).min(10_000);
    let spun = tokio::task::spawn_blocking(move || {
        let until = std::time::Instant::now() + std::time::Duration::from_millis(ms);
        let mut x: u64 = 0;
        while std::time::Instant::now() < until {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        x
    })
    .await
    .unwrap_or(0);
    format!("burned {ms} ms ({})\n", spun % 10)
}

pub async fn serve(instance: String) -> Result<(), ServeError> {
    let env = |k: &'static str| std::env::var(k).map_err(|_| ServeError::Env(k));
    let port = env("PORT")?;
    let port: u16 = port.parse().map_err(|_| ServeError::Port(port.clone()))?;
    let host = std::env::var("HOST").unwrap_or_else(|_| "127.0.0.1".into());
    let service = std::env::var("CCATTLER_SERVICE").unwrap_or_default();
    let node = std::env::var("CCATTLER_NODE").unwrap_or_default();
    let hello = format!("{instance} of {service} on {node}\n");
    let app = axum::Router::new().route("/", get(move || async move { hello })).route("/healthz", get(|| async { "ok\n" })).route("/burn", get(burn));
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
