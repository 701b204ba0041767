//! Shared structures without one lock for all threads: a page map split into shards by
//! page id (the dirty-page table, the remote tier's version table), and a reader-writer lock
//! whose readers take one of several stripes (the resident set, read on every miss and
//! eviction, written only when the pool grows).

use std::cell::UnsafeCell;
use std::collections::HashMap;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crossbeam_utils::CachePadded;
use parking_lot::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::storage::PageId;

const SHARDS: usize = 32;

/// This thread's stripe number (threads take consecutive numbers as they first ask), for
/// structures striped by thread: counters, the striped lock.
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

const STRIPES: usize = 16;

/// A reader-writer lock whose readers lock one of `STRIPES` locks (chosen by thread) and
/// whose writer locks them all, in order: readers on different stripes share no cache line.
pub(crate) struct StripedRwLock<T> {
    stripes: Box<[CachePadded<RwLock<()>>]>,
    /// Read lockings that found their stripe write-locked.
    waits: AtomicU64,
    value: UnsafeCell<T>,
}

// SAFETY: the value is only reached through the guards below: shared references while some
// stripe is read-locked (any number of readers, as for `RwLock<T>`, so `T: Sync` is
// needed), a mutable one while every stripe is write-locked (so no reader or other writer
// exists); moving the lock between threads moves the `T` (`T: Send`).
unsafe impl<T: Send + Sync> Sync for StripedRwLock<T> {}
// SAFETY: as above: sending the lock sends the `T`.
unsafe impl<T: Send> Send for StripedRwLock<T> {}

/// Shared access to a [`StripedRwLock`]'s value.
pub(crate) struct StripedRead<'a, T> {
    _stripe: RwLockReadGuard<'a, ()>,
    value: &'a T,
}

/// Exclusive access to a [`StripedRwLock`]'s value.
pub(crate) struct StripedWrite<'a, T> {
    _stripes: Vec<RwLockWriteGuard<'a, ()>>,
    value: &'a mut T,
}

impl<T> StripedRwLock<T> {
    pub(crate) fn new(value: T) -> Self {
        StripedRwLock { stripes: (0..STRIPES).map(|_| CachePadded::new(RwLock::new(()))).collect(), waits: AtomicU64::new(0), value: UnsafeCell::new(value) }
    }

    pub(crate) fn read(&self) -> StripedRead<'_, T> {
        let lock = &self.stripes[stripe() % STRIPES];
        let stripe = lock.try_read().unwrap_or_else(|| {
            self.waits.fetch_add(1, Ordering::Relaxed);
            lock.read()
        });
        // SAFETY: a stripe is read-locked for as long as the returned guard lives, so no
        // writer (which needs every stripe write-locked) holds a mutable reference.
        StripedRead { _stripe: stripe, value: unsafe { &*self.value.get() } }
    }

    /// Read lockings that found their stripe write-locked (contention).
    pub(crate) fn waits(&self) -> u64 {
        self.waits.load(Ordering::Relaxed)
    }

    pub(crate) fn write(&self) -> StripedWrite<'_, T> {
        let stripes: Vec<_> = self.stripes.iter().map(|s| s.write()).collect();
        // SAFETY: every stripe is write-locked for as long as the returned guard lives, so
        // no reader and no other writer holds a reference to the value.
        StripedWrite { _stripes: stripes, value: unsafe { &mut *self.value.get() } }
    }
}

impl<T> Deref for StripedRead<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        self.value
    }
}

impl<T> Deref for StripedWrite<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        self.value
    }
}

impl<T> DerefMut for StripedWrite<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        self.value
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::Arc;

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

    /// Writers swap the value while readers check it is never seen half-changed.
    #[test]
    fn striped_lock_excludes_writers_from_readers() {
        let l = Arc::new(StripedRwLock::new((0u64, 0u64)));
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let l = l.clone();
                std::thread::spawn(move || {
                    for i in 0..20_000u64 {
                        if t == 0 && i % 16 == 0 {
                            let mut w = l.write();
                            w.0 += 1;
                            std::hint::black_box(&mut *w);
                            w.1 += 1;
                        } else {
                            let r = l.read();
                            assert_eq!(r.0, r.1, "a reader saw a half-done write");
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(l.read().0, 20_000 / 16);
    }
}
