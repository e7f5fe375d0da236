//! CCattler's engine: a checked program compiled to one incremental
//! differential dataflow whose logical time is the etcd revision.
//!
//! Stages: [`plan`] (rules → join plans) → [`dataflow`] (plans → operators) →
//! [`runtime`] (worker threads behind the [`Engine`] handle). [`facts`] maps etcd
//! keys and values to input tuples and output tuples back to keys.

pub mod arrangements;
pub mod builtin;
pub mod cluster;
pub mod cowmap;
pub mod dataflow;
pub mod explain;
pub mod factfile;
pub mod facts;
pub mod plan;
pub mod rows;
pub mod ruletest;
pub mod runtime;
pub mod session;
pub mod synth;
pub mod temporal;
pub mod value;

pub use runtime::{default_workers, disable_huge_pages, serve, Change, Cluster, Engine, EngineError, Reads, Snapshot};
pub use session::{Session, SessionError};
pub use value::{Row, Value};
