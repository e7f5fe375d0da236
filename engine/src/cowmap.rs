//! A string-keyed map whose clone is cheap: its keys are spread over shards
//! by hash, each shard shared until one side changes it (then only that
//! shard is copied). The controller's input facts live in one, so a reader
//! (an `/explain` answered off the write-back path) takes a consistent copy
//! in microseconds while the loop goes on applying revisions.

use std::collections::BTreeMap;
use std::hash::BuildHasher;
use std::sync::Arc;

/// Shards: a write to a shard a snapshot shares copies 1/SHARDS of the map.
const SHARDS: usize = 64;

#[derive(Clone)]
pub struct CowMap<V: Clone> {
    shards: Arc<[Arc<BTreeMap<String, V>>]>,
    len: usize,
}

impl<V: Clone> Default for CowMap<V> {
    fn default() -> Self {
        CowMap { shards: (0..SHARDS).map(|_| Arc::new(BTreeMap::new())).collect(), len: 0 }
    }
}

fn shard_of(key: &str) -> usize {
    // Fixed seed: the shard of a key must not change between calls.
    (foldhash::fast::FixedState::with_seed(0x5eed).hash_one(key) as usize) % SHARDS
}

impl<V: Clone> CowMap<V> {
    pub fn get(&self, key: &str) -> Option<&V> {
        self.shards[shard_of(key)].get(key)
    }

    pub fn contains_key(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    fn shard_mut(&mut self, i: usize) -> &mut BTreeMap<String, V> {
        // The shard list itself is shared by clones too.
        if Arc::get_mut(&mut self.shards).is_none() {
            self.shards = self.shards.iter().cloned().collect();
        }
        let shards = Arc::get_mut(&mut self.shards).expect("unique");
        Arc::make_mut(&mut shards[i])
    }

    pub fn insert(&mut self, key: String, value: V) -> Option<V> {
        let old = self.shard_mut(shard_of(&key)).insert(key, value);
        if old.is_none() {
            self.len += 1;
        }
        old
    }

    pub fn remove(&mut self, key: &str) -> Option<V> {
        let i = shard_of(key);
        if !self.shards[i].contains_key(key) {
            return None; // no copy of a shared shard for nothing
        }
        let old = self.shard_mut(i).remove(key);
        self.len -= old.is_some() as usize;
        old
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Every key, in no particular order.
    pub fn keys(&self) -> impl Iterator<Item = &String> {
        self.shards.iter().flat_map(|s| s.keys())
    }

    /// Every entry whose key starts with `prefix`, sorted by key.
    pub fn with_prefix(&self, prefix: &str) -> Vec<(&String, &V)> {
        let mut out: Vec<(&String, &V)> = self
            .shards
            .iter()
            .flat_map(|s| s.range::<str, _>((std::ops::Bound::Included(prefix), std::ops::Bound::Unbounded)).take_while(|(k, _)| k.starts_with(prefix)))
            .collect();
        out.sort_unstable_by(|a, b| a.0.cmp(b.0));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Against a BTreeMap, with a clone taken midway that must not change.
        #[test]
        fn behaves_like_a_btreemap_and_clones_stay_put(ops in prop::collection::vec((0u8..3, "[ab/]{0,4}", 0u32..5), 0..200), cut in 0usize..200) {
            let (mut m, mut want) = (CowMap::default(), BTreeMap::new());
            let mut frozen = None;
            for (i, (op, k, v)) in ops.iter().enumerate() {
                if i == cut {
                    frozen = Some((m.clone(), want.clone()));
                }
                match op {
                    0 | 1 => prop_assert_eq!(m.insert(k.clone(), *v), want.insert(k.clone(), *v)),
                    _ => prop_assert_eq!(m.remove(k), want.remove(k)),
                }
                prop_assert_eq!(m.len(), want.len());
            }
            for prefix in ["", "a", "a/", "b", "/"] {
                let got: Vec<(String, u32)> = m.with_prefix(prefix).into_iter().map(|(k, v)| (k.clone(), *v)).collect();
                let expected: Vec<(String, u32)> = want.iter().filter(|(k, _)| k.starts_with(prefix)).map(|(k, v)| (k.clone(), *v)).collect();
                prop_assert_eq!(got, expected);
            }
            if let Some((m, want)) = frozen {
                prop_assert_eq!(m.len(), want.len());
                for (k, v) in &want {
                    prop_assert_eq!(m.get(k), Some(v));
                }
            }
        }
    }
}
