//! Shared structures without one lock for all threads: a page map split into shards by
//! page id (the dirty-page table, the remote tier's version table), and the per-thread
//! stripe number that striped counters and the resident set's partitions start from.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crossbeam_utils::CachePadded;
use parking_lot::{Mutex, MutexGuard};

use crate::storage::PageId;

const SHARDS: usize = 32;

/// This thread's stripe number (threads take consecutive numbers as they first ask), for
/// structures striped by thread: counters, the resident set's home partitions.
#[inline]
pub(crate) fn stripe() -> usize {
    use std::cell::Cell;
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local!(static MINE: Cell<usize> = const { Cell::new(usize::MAX) });
    MINE.with(|m| {
        if m.get() == usize::MAX {
            m.set(NEXT.fetch_add(1, Ordering::Relaxed));
        }
        m.get()
    })
}

/// One shard of a [`PageMap`].
type Shard<V> = CachePadded<Mutex<HashMap<PageId, V>>>;

/// A map from page ids to `V`, in shards that each have their own lock, so that threads
/// working on different pages rarely meet on one lock or cache line.
pub(crate) struct PageMap<V> {
    shards: Box<[Shard<V>]>,
    /// Lockings that found their shard locked.
    waits: AtomicU64,
}

impl<V> Default for PageMap<V> {
    fn default() -> Self {
        PageMap { shards: (0..SHARDS).map(|_| CachePadded::new(Mutex::new(HashMap::new()))).collect(), waits: AtomicU64::new(0) }
    }
}

impl<V: Copy> PageMap<V> {
    /// The shard of `pid`, locked.
    pub(crate) fn shard(&self, pid: PageId) -> MutexGuard<'_, HashMap<PageId, V>> {
        // Fibonacci hashing: consecutive indices of one class spread over all shards.
        let h = (pid.raw().wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as usize;
        let shard = &self.shards[h % SHARDS];
        shard.try_lock().unwrap_or_else(|| {
            self.waits.fetch_add(1, Ordering::Relaxed);
            shard.lock()
        })
    }

    /// Lockings that found their shard locked (contention).
    pub(crate) fn waits(&self) -> u64 {
        self.waits.load(Ordering::Relaxed)
    }

    pub(crate) fn get(&self, pid: PageId) -> Option<V> {
        self.shard(pid).get(&pid).copied()
    }

    pub(crate) fn contains(&self, pid: PageId) -> bool {
        self.shard(pid).contains_key(&pid)
    }

    /// Inserts; returns the previous value.
    pub(crate) fn insert(&self, pid: PageId, v: V) -> Option<V> {
        self.shard(pid).insert(pid, v)
    }

    /// Inserts unless present.
    pub(crate) fn insert_if_absent(&self, pid: PageId, v: V) {
        self.shard(pid).entry(pid).or_insert(v);
    }

    pub(crate) fn remove(&self, pid: PageId) -> Option<V> {
        self.shard(pid).remove(&pid)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.shards.iter().all(|s| s.lock().is_empty())
    }

    /// Every entry, one shard at a time (not a snapshot of one instant).
    pub(crate) fn entries(&self) -> Vec<(PageId, V)> {
        let mut out = Vec::new();
        for s in self.shards.iter() {
            out.extend(s.lock().iter().map(|(&p, &v)| (p, v)));
        }
        out
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn page_map_keeps_every_entry_in_its_shard() {
        let m: PageMap<u64> = PageMap::default();
        assert!(m.is_empty());
        for i in 0..1000 {
            m.insert_if_absent(PageId::new(0, false, i), i);
            m.insert_if_absent(PageId::new(0, false, i), 7_777);
        }
        assert_eq!(m.get(PageId::new(0, false, 5)), Some(5));
        assert_eq!(m.remove(PageId::new(0, false, 5)), Some(5));
        assert!(!m.contains(PageId::new(0, false, 5)));
        let mut e = m.entries();
        e.sort();
        assert_eq!(e.len(), 999);
        assert!(e.iter().all(|&(p, v)| p.index() == v));
    }
}
