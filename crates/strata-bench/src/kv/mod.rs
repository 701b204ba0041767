//! Key-value stores for `bench btree`: strata's B+-tree and its baselines (redb, LMDB through
//! heed, a `BTreeMap` in memory), all behind one small trait, [`KvStore`].
//!
//! The data: 8-byte keys (a `u64` as 8 big-endian bytes, so that byte order is numeric
//! order) and 100-byte values. Entry `i` has key [`key_of`]`(i)`, a bijective scramble of
//! `i` (keys are spread over the whole key space and arrive in random order, as YCSB's
//! "hashed" insert order), and a value that starts with `i` itself, so that any entry read
//! back can be checked against its key ([`entry_ok`]).

mod btreemap;
mod lmdb;
mod redb;
mod strata;

pub use self::btreemap::BTreeMapStore;
pub use self::lmdb::LmdbStore;
pub use self::redb::RedbStore;
pub use self::strata::StrataKv;

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use serde_json::{Map, Value};

use crate::workload::mix64;
use crate::{EResult, IoCounters};

/// Key length in bytes.
pub const KEY_LEN: usize = 8;
/// Value length in bytes.
pub const VALUE_LEN: usize = 100;
/// Bytes of one entry (key and value), the unit of `data_bytes`.
pub const ENTRY_BYTES: u64 = (KEY_LEN + VALUE_LEN) as u64;

/// A key.
pub type Key = [u8; KEY_LEN];
/// A value.
pub type Val = [u8; VALUE_LEN];

const KEY_SALT: u64 = 0x6b65_795f_7361_6c74;

/// The key of entry `i`: a bijection of `u64` (SplitMix64's finaliser is invertible), as 8
/// big-endian bytes.
#[inline]
pub fn key_of(i: u64) -> Key {
    mix64(i ^ KEY_SALT).to_be_bytes()
}

/// The value of entry `i` in its `version`: `i` (8 bytes LE), `version` (8 bytes LE), then
/// bytes derived from both.
pub fn value_of(i: u64, version: u64) -> Val {
    let mut v = [0u8; VALUE_LEN];
    v[..8].copy_from_slice(&i.to_le_bytes());
    v[8..16].copy_from_slice(&version.to_le_bytes());
    for (w, c) in v[16..].chunks_mut(8).enumerate() {
        let x = mix64(i.rotate_left(17) ^ version ^ w as u64).to_le_bytes();
        c.copy_from_slice(&x[..c.len()]);
    }
    v
}

/// The entry index a value names (its first 8 bytes), if it has the right length.
#[inline]
pub fn index_of(value: &[u8]) -> Option<u64> {
    (value.len() == VALUE_LEN).then(|| u64::from_le_bytes(value[..8].try_into().expect("8 bytes")))
}

/// Whether `value` is a value of the entry whose key is `key`.
#[inline]
pub fn entry_ok(key: &[u8], value: &[u8]) -> bool {
    index_of(value).is_some_and(|i| key_of(i) == key)
}

/// A key-value store under test. Sessions are per thread.
pub trait KvStore: Sync {
    /// The engine's name in the JSON output.
    fn name(&self) -> &'static str;

    /// A session for one thread (a thread's read transaction, buffers).
    fn session(&self) -> EResult<Box<dyn KvSession + '_>>;

    /// Cache hits and misses where the engine counts them (strata).
    fn counters(&self) -> Option<IoCounters> {
        None
    }

    /// Engine facts for the JSON output (cache size, whether memory is capped, ...).
    fn describe(&self) -> Map<String, Value> {
        Map::new()
    }
}

/// One thread's access to a [`KvStore`].
pub trait KvSession {
    /// Looks `key` up; on a hit its value is copied into `out` and `true` returned.
    fn get(&mut self, key: &Key, out: &mut Vec<u8>) -> EResult<bool>;

    /// Calls `f` on up to `n` entries in key order, from the first key `>= start`; returns
    /// how many it visited.
    fn scan(&mut self, start: &Key, n: usize, f: &mut dyn FnMut(&[u8], &[u8])) -> EResult<usize>;

    /// Inserts (or replaces) every entry in one durable transaction: when it returns, the
    /// entries survive a crash.
    fn put(&mut self, entries: &[(Key, Val)]) -> EResult<()>;
}

/// A thread that drops a file's pages from the OS page cache every `every` (clean pages
/// only: `posix_fadvise(POSIX_FADV_DONTNEED)`), so that an engine reading through the page
/// cache (redb's buffered `pread`s) does not get memory beyond its own budget from the OS.
/// Stopped and joined on drop.
pub struct CacheDropper {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl CacheDropper {
    /// Starts dropping `path`'s cached pages every `every`.
    pub fn start(path: &Path, every: Duration) -> EResult<CacheDropper> {
        let file = File::open(path)?;
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::Builder::new().name("cache-dropper".into()).spawn(move || {
            while !s.load(Ordering::Relaxed) {
                // SAFETY: advisory call on an open descriptor; it changes no memory of ours.
                unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
                std::thread::sleep(every);
            }
        })?;
        Ok(CacheDropper { stop, thread: Some(thread) })
    }
}

impl Drop for CacheDropper {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_distinct_and_values_name_them() {
        let mut keys: Vec<Key> = (0..10_000).map(key_of).collect();
        keys.sort_unstable();
        keys.dedup();
        assert_eq!(keys.len(), 10_000);
        let v = value_of(77, 3);
        assert_eq!(index_of(&v), Some(77));
        assert!(entry_ok(&key_of(77), &v));
        assert!(!entry_ok(&key_of(78), &v));
        assert!(!entry_ok(&key_of(77), &v[..99]));
        assert_ne!(value_of(77, 3), value_of(77, 4));
    }
}
