//! `explain` against a live cluster, two ways:
//!
//! * [`Frozen`]: a controller answers from its warm engine at the revision it
//!   had applied when the question came (`GET /explain`), with no snapshot
//!   to read or load, on a thread of its own;
//! * [`snapshot_session`]: one consistent snapshot of what the rules read, at
//!   the latest revision or a past one, loaded into an offline session
//!   (nothing is written).

use crate::etcd::{self, EtcdConfig, EtcdError};
use crate::reconcile::{Held, Reconciler};
use ccattler_engine::explain::{self, ExplainError, Explanation, Options};
use ccattler_engine::{Session, SessionError};
use ccattler_parser::program::Program;
use std::sync::Arc;

#[derive(Debug, thiserror::Error)]
pub enum LiveError {
    #[error(transparent)]
    Etcd(#[from] EtcdError),
    #[error(transparent)]
    Session(#[from] SessionError),
}

/// The rules' inputs and outputs as etcd holds them at `revision` (None:
/// the latest), loaded into a session; with the revision and the raw keys.
pub async fn snapshot_session(cfg: &EtcdConfig, program: Arc<Program>, revision: Option<i64>) -> Result<(Session, i64, Vec<(String, Held)>), LiveError> {
    let mut client = etcd::connect(cfg).await?;
    let (rev, snap) = etcd::snapshot_at(&mut client, &crate::controller::prefixes(&program), 5000, revision).await?;
    let loaded: Vec<(String, String, u64)> = snap.iter().map(|(k, h)| (k.clone(), h.value.clone(), h.mod_revision as u64)).collect();
    let mut session = Session::new(program, 1)?;
    tokio::task::block_in_place(|| session.load(rev as u64, &loaded))?;
    Ok((session, rev, snap))
}

/// One `/explain` question.
#[derive(Clone, Debug, serde::Deserialize)]
pub struct Question {
    pub key: String,
    pub value: Option<String>,
    #[serde(default)]
    pub why_not: bool,
    pub depth: Option<usize>,
}

/// A controller's state frozen at one revision for `/explain`: a cheap copy
/// of the input facts and a snapshot of the engine's derived relations,
/// read on another thread while the controller goes on applying and
/// writing (a slow why-not never delays the write-back).
pub struct Frozen {
    program: Arc<Program>,
    inputs: ccattler_engine::facts::InputFacts,
    revision: u64,
    engine: ccattler_engine::Snapshot,
}

impl Frozen {
    pub fn of(r: &Reconciler) -> Result<Frozen, ccattler_engine::EngineError> {
        Ok(Frozen { program: r.program().clone(), inputs: r.inputs.clone(), revision: r.revision(), engine: r.engine().snapshot()? })
    }

    /// Answers a question: the facts are etcd's at the frozen revision.
    pub fn answer(&self, q: &Question) -> Result<Explanation, ExplainError> {
        // A test hook: `CCATTLER_INJECT_EXPLAIN_DELAY_MS=N` makes every
        // explanation take N ms longer (to test that none delays writes).
        if let Some(ms) = std::env::var("CCATTLER_INJECT_EXPLAIN_DELAY_MS").ok().and_then(|v| v.parse().ok()) {
            std::thread::sleep(std::time::Duration::from_millis(ms));
        }
        let db = explain::Db::over_engine(&self.program, &self.inputs, self.revision, &self.engine);
        let opts = Options { depth: q.depth.unwrap_or(Options::default().depth) };
        explain::explain(&db, &q.key, q.value.as_deref(), q.why_not, opts)
    }
}

/// A question on its way from the HTTP server to the controller's loop.
pub struct Asked {
    pub question: Question,
    pub reply: tokio::sync::oneshot::Sender<Result<Explanation, ExplainError>>,
}
