//! `lmdb`: LMDB through heed: a copy-on-write B+-tree in a read-only shared memory map,
//! written with `pwrite` and synced at every commit (default flags). The OS page cache
//! decides what stays in memory, so its memory cannot be limited from inside the process:
//! the benchmark caps it with a cgroup v2 `memory.max` where the machine allows (as the
//! `mmap` engine), else it runs **uncapped** and says so (`"capped": false`).
//!
//! Reads go through a read transaction that each session keeps for [`READ_TXN_OPS`]
//! operations; writes drop it first.

use std::ops::Bound;
use std::path::Path;

use heed::types::Bytes;
use heed::{CommitOrAbort, Database, Env, EnvOpenOptions, RoTxn, WithoutTls};
use serde_json::{Map, Value};

use super::{Key, KvSession, KvStore, Val};
use crate::{EResult, EngineError};

/// Operations served by one read transaction before a session begins a new one.
pub const READ_TXN_OPS: u32 = 64;

fn err(e: impl std::fmt::Display) -> EngineError {
    EngineError(format!("lmdb: {e}"))
}

/// An LMDB environment with one (unnamed) database.
pub struct LmdbStore {
    env: Env<WithoutTls>,
    db: Database<'static, Bytes, Bytes>,
    map_size: u64,
    cap: Map<String, Value>,
}

impl LmdbStore {
    /// Creates an environment in `dir` whose map (address space, not memory) is `map_size`
    /// bytes, for `readers` concurrent read transactions.
    pub fn create(dir: &Path, map_size: u64, readers: u32) -> EResult<LmdbStore> {
        let mut opts = EnvOpenOptions::new().read_txn_without_tls();
        opts.map_size(map_size as usize).max_readers(readers.max(126)).max_dbs(1);
        // SAFETY: the environment lives in this run's private scratch directory; nothing
        // else opens, modifies or truncates its files while it is open.
        let env = unsafe { opts.open(dir) }.map_err(err)?;
        let tx = env.write_txn().map_err(err)?;
        let db = env
            .create_databases_and_commit(tx, |opener, tx| opener.create_database::<Bytes, Bytes>(tx, None).map(CommitOrAbort::<_, ()>::Commit))
            .map_err(err)?
            .unwrap_commit();
        let mut cap = Map::new();
        cap.insert("capped".into(), false.into());
        Ok(LmdbStore { env, db, map_size, cap })
    }

    /// Records how the engine's memory was capped (for [`KvStore::describe`]).
    pub fn set_cap_info(&mut self, info: Map<String, Value>) {
        self.cap = info;
    }
}

struct Session<'a> {
    store: &'a LmdbStore,
    read: Option<(RoTxn<'a, WithoutTls>, u32)>,
}

impl<'a> Session<'a> {
    fn txn(&mut self) -> EResult<&RoTxn<'a, WithoutTls>> {
        if let Some((_, left)) = &mut self.read {
            if *left > 0 {
                *left -= 1;
            } else {
                self.read = None;
            }
        }
        if self.read.is_none() {
            self.read = Some((self.store.env.read_txn().map_err(err)?, READ_TXN_OPS - 1));
        }
        Ok(&self.read.as_ref().expect("just begun").0)
    }
}

impl KvStore for LmdbStore {
    fn name(&self) -> &'static str {
        "lmdb"
    }

    fn session(&self) -> EResult<Box<dyn KvSession + '_>> {
        Ok(Box::new(Session { store: self, read: None }))
    }

    fn describe(&self) -> Map<String, Value> {
        let mut m = self.cap.clone();
        m.insert("map_size".into(), self.map_size.into());
        m.insert("read_txn_ops".into(), READ_TXN_OPS.into());
        if let Ok(b) = self.env.real_disk_size() {
            m.insert("file_bytes".into(), b.into());
        }
        m
    }
}

impl KvSession for Session<'_> {
    fn get(&mut self, key: &Key, out: &mut Vec<u8>) -> EResult<bool> {
        let db = self.store.db;
        match db.get(self.txn()?, key.as_slice()).map_err(err)? {
            Some(v) => {
                out.clear();
                out.extend_from_slice(v);
                Ok(true)
            }
            None => Ok(false),
        }
    }

    fn scan(&mut self, start: &Key, n: usize, f: &mut dyn FnMut(&[u8], &[u8])) -> EResult<usize> {
        let db = self.store.db;
        let range: (Bound<&[u8]>, Bound<&[u8]>) = (Bound::Included(start.as_slice()), Bound::Unbounded);
        let mut seen = 0;
        for e in db.range(self.txn()?, &range).map_err(err)?.take(n) {
            let (k, v) = e.map_err(err)?;
            f(k, v);
            seen += 1;
        }
        Ok(seen)
    }

    fn put(&mut self, entries: &[(Key, Val)]) -> EResult<()> {
        self.read = None;
        let mut tx = self.store.env.write_txn().map_err(err)?;
        for (k, v) in entries {
            self.store.db.put(&mut tx, k.as_slice(), v.as_slice()).map_err(err)?;
        }
        tx.commit().map_err(err)
    }
}
