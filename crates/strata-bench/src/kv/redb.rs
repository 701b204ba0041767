//! `redb`: the Rust ecosystem's embedded B-tree store (copy-on-write B-trees, its own page
//! cache over buffered `pread`/`pwrite`), with its cache set to the pool
//! (`Builder::set_cache_size`: 90 % read cache, 10 % write cache) and durable commits
//! (`Durability::Immediate`, its default).
//!
//! Reads go through a read transaction that each session keeps for [`READ_TXN_OPS`]
//! operations (a fresh one per lookup costs more than the lookup: a mutex-protected
//! registration); writes drop it first. redb reads its file through the OS page cache,
//! which is memory outside its budget, so a [`CacheDropper`] drops the file from the page
//! cache every [`DROP_EVERY`] (misses then cost a read from the device, as strata's).

use std::path::{Path, PathBuf};
use std::time::Duration;

use ::redb::{Builder, Database, ReadOnlyTable, TableDefinition};
use serde_json::{Map, Value};

use super::{CacheDropper, Key, KvSession, KvStore, Val};
use crate::{EResult, EngineError};

const TABLE: TableDefinition<'static, &'static [u8; 8], &'static [u8]> = TableDefinition::new("kv");

/// The table as a read transaction sees it.
type ReadTable = ReadOnlyTable<&'static [u8; 8], &'static [u8]>;

/// Operations served by one read transaction before a session begins a new one.
pub const READ_TXN_OPS: u32 = 64;
/// How often the file's pages are dropped from the OS page cache.
pub const DROP_EVERY: Duration = Duration::from_millis(50);

fn err(e: impl std::fmt::Display) -> EngineError {
    EngineError(format!("redb: {e}"))
}

/// A redb database with one table.
pub struct RedbStore {
    // Declared first: the dropper thread stops before the database closes.
    _dropper: CacheDropper,
    db: Database,
    path: PathBuf,
    cache_bytes: u64,
}

impl RedbStore {
    /// Creates a database file in `dir` with a cache of `cache_bytes`.
    pub fn create(dir: &Path, cache_bytes: u64) -> EResult<RedbStore> {
        let path = dir.join("redb.db");
        let db = Builder::new().set_cache_size(cache_bytes as usize).create(&path).map_err(err)?;
        let tx = db.begin_write().map_err(err)?;
        tx.open_table(TABLE).map_err(err)?;
        tx.commit().map_err(err)?;
        let dropper = CacheDropper::start(&path, DROP_EVERY)?;
        Ok(RedbStore { _dropper: dropper, db, path, cache_bytes })
    }
}

struct Session<'a> {
    store: &'a RedbStore,
    /// The current read transaction's table and the operations left on it.
    read: Option<(ReadTable, u32)>,
}

impl Session<'_> {
    fn table(&mut self) -> EResult<&ReadTable> {
        if let Some((_, left)) = &mut self.read {
            if *left > 0 {
                *left -= 1;
            } else {
                self.read = None;
            }
        }
        if self.read.is_none() {
            let tx = self.store.db.begin_read().map_err(err)?;
            self.read = Some((tx.open_table(TABLE).map_err(err)?, READ_TXN_OPS - 1));
        }
        Ok(&self.read.as_ref().expect("just opened").0)
    }
}

impl KvStore for RedbStore {
    fn name(&self) -> &'static str {
        "redb"
    }

    fn session(&self) -> EResult<Box<dyn KvSession + '_>> {
        Ok(Box::new(Session { store: self, read: None }))
    }

    fn describe(&self) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert("cache_bytes".into(), self.cache_bytes.into());
        m.insert("read_txn_ops".into(), READ_TXN_OPS.into());
        m.insert("os_page_cache".into(), format!("dropped every {} ms (posix_fadvise DONTNEED)", DROP_EVERY.as_millis()).into());
        if let Ok(meta) = std::fs::metadata(&self.path) {
            m.insert("file_bytes".into(), meta.len().into());
        }
        m
    }
}

impl KvSession for Session<'_> {
    fn get(&mut self, key: &Key, out: &mut Vec<u8>) -> EResult<bool> {
        match self.table()?.get(key).map_err(err)? {
            Some(v) => {
                out.clear();
                out.extend_from_slice(v.value());
                Ok(true)
            }
            None => Ok(false),
        }
    }

    fn scan(&mut self, start: &Key, n: usize, f: &mut dyn FnMut(&[u8], &[u8])) -> EResult<usize> {
        let mut seen = 0;
        for e in self.table()?.range::<&[u8; 8]>(start..).map_err(err)?.take(n) {
            let (k, v) = e.map_err(err)?;
            f(k.value(), v.value());
            seen += 1;
        }
        Ok(seen)
    }

    fn put(&mut self, entries: &[(Key, Val)]) -> EResult<()> {
        self.read = None;
        let tx = self.store.db.begin_write().map_err(err)?;
        {
            let mut t = tx.open_table(TABLE).map_err(err)?;
            for (k, v) in entries {
                t.insert(k, v.as_slice()).map_err(err)?;
            }
        }
        tx.commit().map_err(err)
    }
}
