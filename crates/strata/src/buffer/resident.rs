//! The set of resident pages, over which the clock hand runs.
//!
//! An open-addressing hash set of page ids (vmcache's `ResidentPageSet`): lock-free insert
//! and remove by compare-and-swap, tombstones on removal, and a clock hand that hands out
//! batches of slots to evictors. Its capacity is at least twice the number of pages the
//! pool can hold, so probes stay short; the buffer manager rebuilds it when the pool grows.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crate::storage::PageId;

const EMPTY: u64 = u64::MAX;
const TOMBSTONE: u64 = u64::MAX - 1;

pub(crate) struct ResidentSet {
    slots: Box<[AtomicU64]>,
    mask: usize,
    hand: AtomicUsize,
}

#[inline]
fn hash(pid: u64) -> usize {
    // Fibonacci hashing spreads consecutive indices of every class.
    (pid.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 20) as usize
}

impl ResidentSet {
    /// A set for at least `max_pages` resident pages.
    #[cfg(test)]
    pub(crate) fn with_capacity(max_pages: u64) -> ResidentSet {
        Self::try_with_capacity(max_pages).expect("resident set allocation")
    }

    /// Number of slots of a set for `max_pages` pages.
    fn slots_for(max_pages: u64) -> u64 {
        (max_pages.saturating_mul(2)).max(64).next_power_of_two()
    }

    /// Memory a set for `max_pages` pages occupies, without building it.
    pub(crate) fn memory_bytes_for(max_pages: u64) -> u64 {
        Self::slots_for(max_pages).saturating_mul(8)
    }

    /// A set for at least `max_pages` resident pages, or `None` if its slots cannot be
    /// allocated (an absurdly large pool must be a configuration error, not an abort).
    pub(crate) fn try_with_capacity(max_pages: u64) -> Option<ResidentSet> {
        let cap = usize::try_from(Self::slots_for(max_pages)).ok()?;
        let mut slots = Vec::new();
        slots.try_reserve_exact(cap).ok()?;
        slots.extend((0..cap).map(|_| AtomicU64::new(EMPTY)));
        Some(ResidentSet { slots: slots.into_boxed_slice(), mask: cap - 1, hand: AtomicUsize::new(0) })
    }

    /// Number of slots.
    pub(crate) fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// Memory the set occupies.
    pub(crate) fn memory_bytes(&self) -> u64 {
        (self.slots.len() * 8) as u64
    }

    /// Adds `pid` (which must not be present).
    pub(crate) fn insert(&self, pid: PageId) {
        let mut i = hash(pid.raw()) & self.mask;
        loop {
            let cur = self.slots[i].load(Ordering::Relaxed);
            debug_assert_ne!(cur, pid.raw(), "{pid} inserted twice");
            if (cur == EMPTY || cur == TOMBSTONE) && self.slots[i].compare_exchange(cur, pid.raw(), Ordering::AcqRel, Ordering::Relaxed).is_ok() {
                return;
            }
            i = (i + 1) & self.mask;
        }
    }

    /// Removes `pid`; returns whether it was present.
    pub(crate) fn remove(&self, pid: PageId) -> bool {
        let mut i = hash(pid.raw()) & self.mask;
        for _ in 0..self.slots.len() {
            match self.slots[i].load(Ordering::Relaxed) {
                EMPTY => return false,
                v if v == pid.raw() => {
                    self.slots[i].store(TOMBSTONE, Ordering::Release);
                    return true;
                }
                _ => i = (i + 1) & self.mask,
            }
        }
        false
    }

    /// The next `n` slots under the clock hand: calls `f` on each page id found.
    pub(crate) fn clock_batch(&self, n: usize, mut f: impl FnMut(PageId)) {
        let start = self.hand.fetch_add(n, Ordering::Relaxed);
        for k in 0..n {
            let v = self.slots[(start + k) & self.mask].load(Ordering::Acquire);
            if v != EMPTY && v != TOMBSTONE {
                f(PageId::from_raw(v));
            }
        }
    }

    /// The clock hand: the slot counter the next [`ResidentSet::clock_batch`] starts at (it
    /// only grows; slot = hand modulo the capacity).
    pub(crate) fn hand(&self) -> usize {
        self.hand.load(Ordering::Relaxed)
    }

    /// Calls `f` on each page id in the `n` slots from slot counter `start` on, without
    /// moving the hand (the cleaner looks ahead of the evictors with it).
    pub(crate) fn peek(&self, start: usize, n: usize, mut f: impl FnMut(PageId)) {
        for k in 0..n {
            let v = self.slots[start.wrapping_add(k) & self.mask].load(Ordering::Acquire);
            if v != EMPTY && v != TOMBSTONE {
                f(PageId::from_raw(v));
            }
        }
    }

    /// Every page id in the set (a snapshot; concurrent changes may or may not be seen).
    pub(crate) fn for_each(&self, mut f: impl FnMut(PageId)) {
        for s in self.slots.iter() {
            let v = s.load(Ordering::Acquire);
            if v != EMPTY && v != TOMBSTONE {
                f(PageId::from_raw(v));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_remove_and_clock_see_each_page_once_per_lap() {
        let s = ResidentSet::with_capacity(100);
        let ids: Vec<PageId> = (0..150).map(|i| PageId::new((i % 3) as u8, i % 2 == 0, i)).collect();
        for &p in &ids {
            s.insert(p);
        }
        for &p in &ids[..50] {
            assert!(s.remove(p));
        }
        assert!(!s.remove(ids[0]));
        for &p in &ids[..10] {
            s.insert(p); // reuses tombstones
        }
        let mut seen = Vec::new();
        s.clock_batch(s.capacity(), |p| seen.push(p));
        seen.sort();
        let mut want: Vec<PageId> = ids[..10].iter().chain(&ids[50..]).copied().collect();
        want.sort();
        assert_eq!(seen, want);
    }
}
