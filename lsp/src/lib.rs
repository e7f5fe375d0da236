//! `ccattler lsp`: a language server for rule files over stdio. Diagnostics
//! are the checker's own (with their help text) as the author types; go to
//! definition, find references, hover (a relation's key pattern, columns,
//! doc and rules, as `ccattler describe` shows them) and completion.
//!
//! [`analysis`] answers from text alone; [`server`] speaks the protocol.
//! A document's program is the rule files of its directory and below, as
//! `ccattler check DIR` sees them, with open buffers in place of the disk.

pub mod analysis;
mod position;
pub mod server;

use lsp_server::Connection;

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("language server protocol: {0}")]
    Protocol(#[from] lsp_server::ProtocolError),
    #[error("the editor closed the connection")]
    Disconnected,
    #[error("reading or writing stdio: {0}")]
    Io(#[from] std::io::Error),
}

/// Serves one editor on stdin/stdout until it says `exit`.
pub fn run_stdio() -> Result<(), ServerError> {
    let (connection, io_threads) = Connection::stdio();
    let capabilities = serde_json::to_value(server::capabilities()).expect("serialisable");
    let info = serde_json::json!({ "name": "ccattler", "version": env!("CARGO_PKG_VERSION") });
    let (id, _params) = connection.initialize_start()?;
    connection.initialize_finish(id, serde_json::json!({ "capabilities": capabilities, "serverInfo": info }))?;
    tracing::info!("language server ready");
    server::serve(&connection)?;
    drop(connection);
    io_threads.join()?;
    Ok(())
}
