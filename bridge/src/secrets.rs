//! Secret values to the nodes that need them. The rules say which node needs
//! which secret (`effective/node/N/secret/X`, rules/nodeview.rules); this
//! module does the one thing rules cannot: it opens `secret/value/X` with the
//! cluster key and seals it to node N's public key (`observed/node/N/pubkey`)
//! as `secret/node/N/X`, and deletes that copy once N needs it no more.
//!
//! Level-triggered like the write-back, over what etcd holds: a sealed copy
//! is right while it names the value's current version and the node's
//! current key (sealing is randomised, so "right" cannot mean "equal"); a
//! restarted controller re-seals nothing that is right.

use crate::reconcile::Held;
use ccattler_store::etcd::Op;
use ccattler_store::layout;
use ccattler_store::seal::{self, ClusterKeys, NodeSealed};
use std::collections::{BTreeMap, BTreeSet};

/// What etcd holds that sealing depends on, kept up to date from the
/// controller's snapshot and watch.
#[derive(Default)]
pub struct SecretBook {
    /// `secret/value/X` by X.
    values: BTreeMap<String, Held>,
    /// `observed/node/N/pubkey` by N.
    pubkeys: BTreeMap<String, String>,
    /// `effective/node/N/secret/X` as (N, X).
    needs: BTreeSet<(String, String)>,
    /// `secret/node/N/X` by (N, X).
    sealed: BTreeMap<(String, String), Held>,
    /// Something changed since the last plan.
    dirty: bool,
}

/// Why a needed secret could not be sealed to a node this time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unsealable {
    pub node: String,
    pub secret: String,
    pub why: String,
}

impl SecretBook {
    /// Forgets everything (before a snapshot is read again).
    pub fn clear(&mut self) {
        *self = SecretBook { dirty: true, ..SecretBook::default() };
    }

    /// Takes in one key as etcd now holds it (None: deleted); keys it does
    /// not care about are ignored.
    pub fn observe(&mut self, key: &str, value: Option<&Held>) {
        let changed = if let Some(name) = layout::secret_value_name(key) {
            set(&mut self.values, name.to_string(), value.cloned())
        } else if let Some((node, secret)) = layout::node_secret(key) {
            set(&mut self.sealed, (node.to_string(), secret.to_string()), value.cloned())
        } else if let Some((node, secret)) = layout::node_secret_need(key) {
            let k = (node.to_string(), secret.to_string());
            if value.is_some() {
                self.needs.insert(k)
            } else {
                self.needs.remove(&k)
            }
        } else if let Some(node) = layout::pubkey_node(key) {
            set(&mut self.pubkeys, node.to_string(), value.map(|h| h.value.clone()))
        } else {
            false
        };
        self.dirty |= changed;
    }

    /// Whether anything changed since the last plan.
    pub fn is_dirty(&self) -> bool {
        self.dirty
    }

    /// The writes that make `secret/node/` hold exactly what the nodes need,
    /// each sealed to its node's current key; and what could not be sealed.
    /// Without the cluster key nothing can be sealed, but copies no longer
    /// needed are still deleted.
    pub fn plan(&mut self, keys: Option<&ClusterKeys>) -> (Vec<Op>, Vec<Unsealable>) {
        self.dirty = false;
        let (mut ops, mut problems) = (Vec::new(), Vec::new());
        for (node, secret) in &self.needs {
            let key = format!("{}{secret}", layout::secret_prefix(node));
            let held = self.sealed.get(&(node.clone(), secret.clone()));
            let (Some(value), Some(pubkey)) = (self.values.get(secret), self.pubkeys.get(node)) else {
                if self.values.get(secret).is_none() {
                    // The value is gone (`secret rm`): no copy may outlive it.
                    if let Some(h) = held {
                        ops.push(Op::Delete { key, mod_revision: h.mod_revision });
                    }
                }
                let why =
                    if self.values.contains_key(secret) { "the node has published no public key yet" } else { "the secret has no value (ccattler secret set)" };
                problems.push(Unsealable { node: node.clone(), secret: secret.clone(), why: why.into() });
                continue;
            };
            let right = held.and_then(|h| NodeSealed::parse(&h.value)).is_some_and(|s| s.version == value.mod_revision && s.pubkey == pubkey);
            if right {
                continue;
            }
            let Some(keys) = keys else {
                problems.push(Unsealable { node: node.clone(), secret: secret.clone(), why: "the controller has no --secret-key".into() });
                continue;
            };
            let sealed = keys.open(secret, &value.value).and_then(|plain| seal::seal_to_node(pubkey, secret, &plain, value.mod_revision));
            match (sealed, held) {
                (Ok(v), None) => ops.push(Op::Create { key, value: v }),
                (Ok(v), Some(h)) => ops.push(Op::Update { key, value: v, mod_revision: h.mod_revision }),
                (Err(e), _) => problems.push(Unsealable { node: node.clone(), secret: secret.clone(), why: e.to_string() }),
            }
        }
        for ((node, secret), h) in &self.sealed {
            if !self.needs.contains(&(node.clone(), secret.clone())) {
                ops.push(Op::Delete { key: format!("{}{secret}", layout::secret_prefix(node)), mod_revision: h.mod_revision });
            }
        }
        (ops, problems)
    }

    /// Records writes that committed at `rev`, so they are not planned again
    /// before the watch brings them back.
    pub fn written(&mut self, ops: &[Op], rev: i64) {
        for op in ops {
            let Some((node, secret)) = layout::node_secret(op.key()) else { continue };
            let k = (node.to_string(), secret.to_string());
            match op {
                Op::Create { value, .. } | Op::Update { value, .. } => {
                    self.sealed.insert(k, Held { value: value.clone(), mod_revision: rev, create_revision: rev });
                }
                Op::Delete { .. } => {
                    self.sealed.remove(&k);
                }
            }
        }
    }

    /// A refused write: plan again once the watch has caught up.
    pub fn refused(&mut self) {
        self.dirty = true;
    }
}

/// Sets or removes `k`; whether that changed anything.
fn set<K: Ord, V: PartialEq>(map: &mut BTreeMap<K, V>, k: K, v: Option<V>) -> bool {
    match v {
        Some(v) => match map.get(&k) {
            Some(old) if *old == v => false,
            _ => {
                map.insert(k, v);
                true
            }
        },
        None => map.remove(&k).is_some(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ccattler_store::seal::NodeKey;

    fn held(v: &str, rev: i64) -> Held {
        Held { value: v.into(), mod_revision: rev, create_revision: rev }
    }

    #[test]
    fn a_needed_secret_is_sealed_to_its_node_once_and_again_when_its_value_or_key_moves() {
        let dir = std::env::temp_dir().join(format!("ccattler-book-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let keys = ClusterKeys::create(&dir.join("cluster")).unwrap();
        let n1 = NodeKey::load_or_create(&dir.join("n1")).unwrap();
        let mut book = SecretBook::default();
        book.observe("secret/value/db", Some(&held(&keys.seal("db", b"hunter2").unwrap(), 5)));
        book.observe("effective/node/n1/secret/db", Some(&held("", 6)));
        // No public key yet: nothing to do but say why.
        let (ops, problems) = book.plan(Some(&keys));
        assert!(ops.is_empty());
        assert_eq!(problems[0].why, "the node has published no public key yet");
        book.observe("observed/node/n1/pubkey", Some(&held(&n1.public(), 7)));
        assert!(book.is_dirty());
        let (ops, problems) = book.plan(Some(&keys));
        assert!(problems.is_empty());
        let [Op::Create { key, value }] = ops.as_slice() else { panic!("{ops:?}") };
        assert_eq!(key, "secret/node/n1/db");
        assert!(!value.contains("hunter2"));
        let (version, plain) = n1.open("db", value).unwrap();
        assert_eq!((version, plain.as_slice()), (5, &b"hunter2"[..]));
        book.written(&ops, 8);
        assert!(book.plan(Some(&keys)).0.is_empty(), "right copies are not sealed again");
        // A new value: sealed again, as an update at the revision held.
        book.observe("secret/value/db", Some(&held(&keys.seal("db", b"correct horse").unwrap(), 9)));
        let (ops, _) = book.plan(Some(&keys));
        assert!(matches!(&ops[..], [Op::Update { mod_revision: 8, value, .. }] if n1.open("db", value).unwrap().0 == 9));
        book.written(&ops, 10);
        // The node no longer needs it: deleted.
        book.observe("effective/node/n1/secret/db", None);
        assert_eq!(book.plan(Some(&keys)).0, vec![Op::Delete { key: "secret/node/n1/db".into(), mod_revision: 10 }]);
    }

    #[test]
    fn a_removed_value_takes_its_sealed_copies_with_it_even_without_the_cluster_key() {
        let mut book = SecretBook::default();
        book.observe("effective/node/n1/secret/db", Some(&held("", 2)));
        book.observe("observed/node/n1/pubkey", Some(&held("pk", 2)));
        book.observe("secret/node/n1/db", Some(&held("ccattler-node-v1 1 pk x", 3)));
        let (ops, problems) = book.plan(None);
        assert_eq!(ops, vec![Op::Delete { key: "secret/node/n1/db".into(), mod_revision: 3 }]);
        assert_eq!(problems[0].why, "the secret has no value (ccattler secret set)");
        book.observe("desired/service/web/image", Some(&held("x", 4)));
        assert!(!book.is_dirty(), "other keys are none of its business");
    }
}
