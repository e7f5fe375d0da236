//! CCattler's etcd layer, shared by the controller (bridge), the node agent
//! and the CLI — and nothing of the engine: an agent links no dataflow.
//!
//! [`etcd`]: connect, paginated snapshots at one revision, watches, fenced
//! compare-and-swap writes. [`leader`]: leadership judged by a heartbeat
//! only the leader's role can write. [`layout`]: the keys of the per-node view an
//! agent reads and writes. [`auth`]: the roles of DESIGN §6 and the commands
//! that create them; [`credentials`]: the 0600 file they go to. [`seal`]:
//! secret values sealed with the cluster key and re-sealed to one node's
//! public key. [`http`]: a small HTTP/1.1 GET (probes, `explain --controller`).

pub mod auth;
pub mod credentials;
pub mod etcd;
pub mod http;
pub mod layout;
pub mod leader;
pub mod seal;

pub use etcd::{EtcdConfig, Held, Op};
