//! The controller's Prometheus metrics (prometheus-client).

use crate::reconcile::Reconciler;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TxnLabels {
    pub result: &'static str,
}

pub struct Metrics {
    pub registry: Registry,
    pub facts: Gauge,
    pub revision: Gauge,
    pub watch_lag: Gauge,
    pub evaluation: Histogram,
    pub transactions: Family<TxnLabels, Counter>,
    pub keys_written: Counter,
    /// Range-guarded transactions refused and retried key by key.
    pub range_retried: Counter,
    pub conflicts: Gauge,
    pub rejected: Gauge,
    pub leader: Gauge,
    /// 1 while etcd refuses writes for want of space (its NOSPACE alarm).
    pub nospace: Gauge,
    pub settled: Gauge,
    pub write_failures: Family<FailureLabels, Counter>,
    pub blocked: Gauge,
    pub explaining: Gauge,
    /// Strings longer than a value holds inline, interned while any fact
    /// holds them, and their bytes.
    pub interned: Gauge,
    pub interned_bytes: Gauge,
    /// The cluster as the rules see it (kept as keys change, published every 2 s).
    pub nodes: Family<StateLabels, Gauge>,
    pub instances: Family<StateLabels, Gauge>,
    pub unplaced: Gauge,
    pub rollouts: Family<StateLabels, Gauge>,
    pub rejected_by_prefix: Family<PrefixLabels, Gauge>,
    pub blocked_by_prefix: Family<PrefixLabels, Gauge>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabels {
    pub state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PrefixLabels {
    pub prefix: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FailureLabels {
    pub kind: &'static str,
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("ccattler");
        let m = Metrics {
            facts: Gauge::default(),
            revision: Gauge::default(),
            watch_lag: Gauge::default(),
            evaluation: Histogram::new(exponential_buckets(0.0001, 2.0, 18)),
            transactions: Family::default(),
            keys_written: Counter::default(),
            range_retried: Counter::default(),
            conflicts: Gauge::default(),
            rejected: Gauge::default(),
            leader: Gauge::default(),
            nospace: Gauge::default(),
            settled: Gauge::default(),
            write_failures: Family::default(),
            blocked: Gauge::default(),
            explaining: Gauge::default(),
            interned: Gauge::default(),
            interned_bytes: Gauge::default(),
            nodes: Family::default(),
            instances: Family::default(),
            unplaced: Gauge::default(),
            rollouts: Family::default(),
            rejected_by_prefix: Family::default(),
            blocked_by_prefix: Family::default(),
            registry: Registry::default(),
        };
        registry.register("facts_held", "Input facts plus derived keys held", m.facts.clone());
        registry.register("revision", "Last etcd revision applied to the engine", m.revision.clone());
        registry.register("watch_lag_revisions", "etcd's revision minus the last applied one", m.watch_lag.clone());
        registry.register("evaluation_seconds", "Time to apply one revision to the engine", m.evaluation.clone());
        registry.register("transactions", "Write-back transactions by result", m.transactions.clone());
        registry.register("keys_written", "Keys written or deleted by write-back", m.keys_written.clone());
        registry.register(
            "range_guard_retries",
            "Write-back transactions guarded by one compare over their keys' range, refused, and retried with a compare per key",
            m.range_retried.clone(),
        );
        registry.register("conflicts", "Output keys with more than one derived value", m.conflicts.clone());
        registry.register("rejected_facts", "Input facts rejected (see status/rejected/)", m.rejected.clone());
        registry.register("leader", "1 while this controller leads", m.leader.clone());
        registry.register("etcd_nospace", "1 while etcd refuses writes for want of space (NOSPACE alarm)", m.nospace.clone());
        registry.register("settled_revision", "Last revision at which the leader found nothing to write", m.settled.clone());
        registry.register("write_failures", "Writes etcd failed or refused for good, by kind", m.write_failures.clone());
        registry.register("blocked_keys", "Derived keys etcd refuses to write (status/blocked/)", m.blocked.clone());
        registry.register("explanations_running", "/explain questions being answered (off the write-back path)", m.explaining.clone());
        registry.register("interned_strings", "Long strings interned while a fact holds them", m.interned.clone());
        registry.register("interned_bytes", "Bytes of the interned strings (released with the last fact that holds each)", m.interned_bytes.clone());
        registry.register("nodes", "Nodes by state (effective/node/N/state)", m.nodes.clone());
        registry.register("instances", "Instances by state (effective/instance/I/state; pending: not placed)", m.instances.clone());
        registry.register("unplaced_instances", "Instances waiting for a node (status/unplaced/)", m.unplaced.clone());
        registry.register("rollouts", "Rollouts by state (status/rollout/S/state; stalled and its reason as `stalled`)", m.rollouts.clone());
        registry.register("rejected_facts_by_prefix", "Rejected input facts by the first two segments of their key", m.rejected_by_prefix.clone());
        registry.register("blocked_keys_by_prefix", "Derived keys etcd refuses, by the first two segments of their key", m.blocked_by_prefix.clone());
        Metrics { registry, ..m }
    }

    pub fn observe(&self, r: &Reconciler, etcd_revision: u64) {
        self.facts.set(r.facts_held() as i64);
        self.revision.set(r.revision() as i64);
        self.watch_lag.set(etcd_revision.saturating_sub(r.revision()) as i64);
        self.conflicts.set(r.outputs.conflicts.len() as i64);
        self.rejected.set(r.inputs.rejected.len() as i64);
        self.blocked.set(r.blocked().count() as i64);
        let (strings, bytes) = ccattler_engine::value::interned();
        self.interned.set(strings as i64);
        self.interned_bytes.set(bytes as i64);
    }

    /// Sets the cluster's gauges from the reconciler's counts (kept as
    /// keys change) and its few rejected and blocked keys.
    pub fn observe_cluster(&self, r: &Reconciler) {
        use std::collections::BTreeMap;
        let counts = r.counts();
        let prefix = |k: &str| k.split('/').take(2).collect::<Vec<_>>().join("/") + "/";
        let mut rejected: BTreeMap<String, i64> = BTreeMap::new();
        for k in r.inputs.rejected.keys() {
            *rejected.entry(prefix(k)).or_default() += 1;
        }
        let mut blocked: BTreeMap<String, i64> = BTreeMap::new();
        for (k, _) in r.blocked() {
            *blocked.entry(prefix(k)).or_default() += 1;
        }
        // States no longer seen go to 0 (kept, so a series does not vanish).
        let set = |family: &Family<StateLabels, Gauge>, counts: &BTreeMap<String, i64>, known: &[&str]| {
            family.clear();
            for s in known {
                family.get_or_create(&StateLabels { state: s.to_string() }).set(0);
            }
            for (state, n) in counts {
                family.get_or_create(&StateLabels { state: state.clone() }).set(*n);
            }
        };
        set(&self.nodes, &counts.nodes, &["ready", "unreachable", "cordoned", "draining", "drained", "impaired"]);
        set(&self.instances, &counts.instances, &["pending", "running", "crashed", "waiting", "stopping", "failed"]);
        set(&self.rollouts, &counts.rollouts, &["progressing", "complete", "paused", "stalled"]);
        self.unplaced.set(counts.unplaced);
        self.rejected_by_prefix.clear();
        for (p, n) in rejected {
            self.rejected_by_prefix.get_or_create(&PrefixLabels { prefix: p }).set(n);
        }
        self.blocked_by_prefix.clear();
        for (p, n) in blocked {
            self.blocked_by_prefix.get_or_create(&PrefixLabels { prefix: p }).set(n);
        }
    }

    /// A write that failed: `split` (a transaction refused for good, halved
    /// to find the key), `blocked` (a key etcd refuses), `connection`.
    pub fn write_failure(&self, kind: &'static str) {
        self.write_failures.get_or_create(&FailureLabels { kind }).inc();
    }

    pub fn txn(&self, committed: bool, keys: usize) {
        self.transactions.get_or_create(&TxnLabels { result: if committed { "committed" } else { "refused" } }).inc();
        self.keys_written.inc_by(keys as u64);
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
