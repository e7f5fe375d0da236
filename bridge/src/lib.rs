//! CCattler's bridge: etcd in, the engine, the rules' outputs back to etcd.
//!
//! [`reconcile`] is the synchronous core (no I/O): what etcd holds, what the
//! rules derive, the writes between them. [`controller`] is the daemon around
//! it: snapshot and watch, fenced transactions, leadership; [`etcd`] the
//! etcd calls; [`watch`] reads and decodes the watch, [`gate`] says when a
//! leader may write; [`http`] and [`metrics`] what operators scrape;
//! [`counts`] keeps the cluster's gauges; [`explain`] answers `explain` from a controller's warm engine or a
//! snapshot.

pub mod autoscaler;
pub mod console;
pub mod controller;
pub mod counts;
pub mod explain;
pub mod gate;
pub mod http;
pub mod metrics;
pub mod reconcile;
pub mod secrets;
pub mod view;
pub mod watch;

pub use ccattler_store::etcd;
pub use reconcile::{Event, Held, Op, Reconciler};
