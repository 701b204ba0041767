//! `strata`: strata's B+-tree ([`strata::access::btree::BTree`]) in a database of its own,
//! through a pool of the benchmark's memory: optimistic lock coupling for reads (no
//! transaction, no latch written), every change a logged write of a transaction whose
//! commit waits for the log's fsync (group commit).
//!
//! A transaction locks every page it changes until it ends. A lock wait that would close a
//! deadlock between writers is refused at once (`strata::Error::Deadlock`), and one that lasts
//! [`LOCK_WAIT`] times out: either way the batch is rolled back and retried after a short
//! random pause (counted in `lock_retries`).

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde_json::{Map, Value};
use strata::access::btree::BTree;
use strata::{Config, Database};

use super::{Key, KvSession, KvStore, Val};
use crate::workload::Rng;
use crate::{EResult, EngineError, IoCounters};

/// How long a writer waits for a page lock before it rolls back and retries.
pub const LOCK_WAIT: Duration = Duration::from_millis(50);
/// Retries of one batch before the run fails.
const MAX_RETRIES: u32 = 10_000;

/// strata's B+-tree in its own database.
pub struct StrataKv {
    db: Database,
    tree: BTree,
    lock_retries: AtomicU64,
}

impl StrataKv {
    /// Creates a database in `dir` with a pool of `pool` bytes (pages and strata's own
    /// metadata) and smallest page `min_page`, and a tree in it.
    pub fn create(dir: &Path, pool: u64, min_page: u64) -> EResult<StrataKv> {
        let db = Database::create(Config::new(dir).pool_size(pool).min_page(min_page))?;
        let tree = db.create_tree("t")?;
        Ok(StrataKv { db, tree, lock_retries: AtomicU64::new(0) })
    }
}

struct Session<'a> {
    kv: &'a StrataKv,
    rng: Rng,
}

impl KvStore for StrataKv {
    fn name(&self) -> &'static str {
        "strata"
    }

    fn session(&self) -> EResult<Box<dyn KvSession + '_>> {
        static SEED: AtomicU64 = AtomicU64::new(1);
        Ok(Box::new(Session { kv: self, rng: Rng::new(SEED.fetch_add(1, Ordering::Relaxed)) }))
    }

    fn counters(&self) -> Option<IoCounters> {
        let s = self.db.buffer().stats();
        Some(IoCounters { hits: Some(s.hits), misses: Some(s.misses), bytes_read: s.bytes_read })
    }

    fn describe(&self) -> Map<String, Value> {
        let s = self.db.buffer().stats();
        let mut m = Map::new();
        m.insert("pool_bytes".into(), s.pool_bytes.into());
        m.insert("metadata_bytes".into(), s.metadata_bytes.into());
        m.insert("peak_resident_bytes".into(), s.peak_resident_bytes.into());
        m.insert("evictions".into(), s.evictions.into());
        m.insert("direct_io".into(), s.direct_io.into());
        m.insert("lock_retries".into(), self.lock_retries.load(Ordering::Relaxed).into());
        m
    }
}

impl KvSession for Session<'_> {
    fn get(&mut self, key: &Key, out: &mut Vec<u8>) -> EResult<bool> {
        Ok(self.kv.tree.get(self.kv.db.buffer(), key, out)?)
    }

    fn scan(&mut self, start: &Key, n: usize, f: &mut dyn FnMut(&[u8], &[u8])) -> EResult<usize> {
        let mut seen = 0;
        if n > 0 {
            self.kv.tree.scan(self.kv.db.buffer(), start, &mut |k, v| {
                f(k, v);
                seen += 1;
                seen < n
            })?;
        }
        Ok(seen)
    }

    fn put(&mut self, entries: &[(Key, Val)]) -> EResult<()> {
        let kv = self.kv;
        for _ in 0..MAX_RETRIES {
            let mut tx = kv.db.begin();
            tx.set_lock_wait(LOCK_WAIT);
            let r = entries.iter().try_for_each(|(k, v)| kv.tree.insert(&mut tx, k, v));
            match r {
                Ok(()) => return Ok(tx.commit()?),
                Err(e) if e.is_lock_conflict() => {
                    // Roll back (drop), then let the other writer finish before retrying.
                    drop(tx);
                    kv.lock_retries.fetch_add(1, Ordering::Relaxed);
                    std::thread::sleep(Duration::from_micros(100 + self.rng.below(5_000)));
                }
                Err(e) => return Err(e.into()),
            }
        }
        Err(EngineError(format!("a batch of {} inserts lost a lock conflict (timeout or deadlock) {MAX_RETRIES} times in a row", entries.len())))
    }
}
