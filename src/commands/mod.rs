//! One file per command (as cargo's `commands/`): each turns parsed
//! arguments into calls of the library crates.

pub(crate) mod agent;
pub(crate) mod apply;
pub(crate) mod auth;
pub(crate) mod autoscaler;
pub(crate) mod check;
pub(crate) mod controller;
pub(crate) mod describe;
pub(crate) mod docs;
pub(crate) mod eval;
pub(crate) mod explain;
pub(crate) mod get;
pub(crate) mod node;
pub(crate) mod plan;
pub(crate) mod rollout;
pub(crate) mod secret;
pub(crate) mod status;
pub(crate) mod test;
