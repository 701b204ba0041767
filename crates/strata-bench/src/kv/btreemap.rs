//! `btreemap`: `std::collections::BTreeMap<[u8; 8], Vec<u8>>` in memory, the upper bound:
//! no I/O, no durability, no memory limit. 16 shards, each behind a `parking_lot::RwLock`,
//! that partition the key space by range (the first key byte's high nibble), so that a scan
//! runs on from one shard into the next.

use parking_lot::RwLock;
use serde_json::{Map, Value};
use std::collections::BTreeMap;

use super::{Key, KvSession, KvStore, Val};
use crate::EResult;

const SHARDS: usize = 16;

/// Sharded in-memory `BTreeMap`s.
pub struct BTreeMapStore {
    shards: Vec<RwLock<BTreeMap<Key, Vec<u8>>>>,
}

fn shard(key: &Key) -> usize {
    (key[0] >> 4) as usize
}

impl BTreeMapStore {
    /// An empty store.
    pub fn new() -> BTreeMapStore {
        BTreeMapStore { shards: (0..SHARDS).map(|_| RwLock::new(BTreeMap::new())).collect() }
    }
}

impl Default for BTreeMapStore {
    fn default() -> Self {
        Self::new()
    }
}

struct Session<'a> {
    store: &'a BTreeMapStore,
}

impl KvStore for BTreeMapStore {
    fn name(&self) -> &'static str {
        "btreemap"
    }

    fn session(&self) -> EResult<Box<dyn KvSession + '_>> {
        Ok(Box::new(Session { store: self }))
    }

    fn describe(&self) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert("capped".into(), false.into());
        m.insert("uncapped_because".into(), "in-memory upper bound: no memory limit, no I/O, no durability".into());
        m.insert("shards".into(), SHARDS.into());
        m
    }
}

impl KvSession for Session<'_> {
    fn get(&mut self, key: &Key, out: &mut Vec<u8>) -> EResult<bool> {
        let g = self.store.shards[shard(key)].read();
        match g.get(key) {
            Some(v) => {
                out.clear();
                out.extend_from_slice(v);
                Ok(true)
            }
            None => Ok(false),
        }
    }

    fn scan(&mut self, start: &Key, n: usize, f: &mut dyn FnMut(&[u8], &[u8])) -> EResult<usize> {
        let mut seen = 0;
        for s in shard(start)..SHARDS {
            let g = self.store.shards[s].read();
            for (k, v) in g.range(*start..).take(n - seen) {
                f(k, v);
                seen += 1;
            }
            if seen == n {
                break;
            }
        }
        Ok(seen)
    }

    fn put(&mut self, entries: &[(Key, Val)]) -> EResult<()> {
        // Grouped by shard: one lock per shard touched (a batch of random keys touches all).
        let mut by_shard: [Vec<usize>; SHARDS] = Default::default();
        for (i, (k, _)) in entries.iter().enumerate() {
            by_shard[shard(k)].push(i);
        }
        for (s, idx) in by_shard.iter().enumerate() {
            if idx.is_empty() {
                continue;
            }
            let mut g = self.store.shards[s].write();
            for &i in idx {
                let (k, v) = &entries[i];
                g.insert(*k, v.to_vec());
            }
        }
        Ok(())
    }
}
