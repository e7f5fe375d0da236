//! The node agent: holds an etcd lease for its node, reports what it observes
//! under `observed/` (and nowhere else: [`keys`]), runs the instances placed
//! on its node as child processes ([`runtime`]), probes them ([`probe`]),
//! and survives its own restarts through a state directory ([`state`]).

pub mod agent;
pub mod confine;
pub mod http_image;
pub mod keys;
pub mod plan;
pub mod probe;
pub mod runtime;
pub mod spec;
pub mod state;
pub mod supervise;
pub mod usage;

pub use agent::{Agent, AgentConfig, AgentError};
