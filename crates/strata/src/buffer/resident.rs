//! The set of resident pages, over which the clock hands run.
//!
//! An open-addressing hash set of page ids (vmcache's `ResidentPageSet`) split into `P`
//! **partitions** (a power of two, [`super::Config::clock_partitions`]): a page id belongs to
//! the partition named by the top bits of its hash, and each partition has its own slot
//! array and its own clock hand, on cache lines of their own. Insert and remove are
//! lock-free (compare-and-swap, tombstones on removal); an evictor takes batches of slots
//! from the hand of the partition it starts in (a per-thread cursor that advances by one
//! partition per eviction, [`ResidentSet::home`]) and moves on to the next partitions when
//! that one yields nothing, so evictors on different cores rarely meet on one hand. Each partition has at least twice its share of the pages the pool
//! can hold, so probes stay short; if an unlucky spread of page ids fills a partition, an
//! insert spills into the next one (and removes then look there too), so an insert always
//! finds a slot: the set as a whole has at least twice as many slots as the pool has pages.
//!
//! # Growing without a lock on the hot path
//!
//! When the pool grows the set must grow with it, and every miss (insert) and every eviction
//! (clock, remove) uses the set, so growing must not need them to take a lock word. Each
//! partition's slot array is **segmented**: segment 0 holds the first capacity `C0`,
//! segment `k >= 1` the slots `C0 * 2^(k-1) .. C0 * 2^k`, and a segment, once published,
//! never moves or changes size. Growing (only [`ResidentSet::grow`], serialised by its own
//! mutex, which nothing else takes) allocates the next segments of every partition, fills
//! them with EMPTY, publishes them, and then publishes the larger capacity mask with a
//! Release store. Nothing is copied or rehashed: an entry stays in the slot it was
//! inserted into, under the mask its insert read. Inserts use the mask they load (Acquire:
//! the new segments are visible before the mask is); a remove probes with the current
//! mask and then with each smaller one down to the first (the masks only ever double). That
//! finds every entry, because a slot never becomes EMPTY again once used (removal leaves a
//! tombstone), so the probe chain an insert walked under some mask stays unbroken; and a
//! remove sees at least the mask its insert used, because the two are ordered by the page's
//! exclusive latch. The clock and the cleaner scan `0..capacity` under the current mask,
//! which covers every segment in use.
//!
//! The alternative, a slot array sized up front for the largest pool the pool could grow to
//! and only faulted in as needed, needs such a bound, and pools have none (the page spaces
//! grow geometrically, see [`super::region`]); an epoch or seqlock scheme would need a
//! migration of live entries under concurrent inserts and removes. Segments need neither;
//! they cost one shift and one `leading_zeros` per slot address. The memory is exactly
//! that of one array of the same capacity, charged to the budget as before.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;

use crossbeam_utils::CachePadded;
use parking_lot::{Mutex, MutexGuard};

use crate::storage::PageId;

const EMPTY: u64 = u64::MAX;
const TOMBSTONE: u64 = u64::MAX - 1;

/// The most partitions a set may have.
pub(crate) const MAX_PARTITIONS: usize = 64;
/// The fewest slots per partition.
const MIN_PARTITION_SLOTS: u64 = 64;
/// Segments per partition: capacities up to `C0 * 2^(SEGMENTS-1)` slots.
const SEGMENTS: usize = 58;

/// One partition: its clock hand (written by every evictor of the partition) and its slot
/// segments (read by everyone, written once each), each on cache lines of their own.
struct Partition {
    hand: CachePadded<AtomicUsize>,
    segments: CachePadded<[OnceLock<Box<[AtomicU64]>>; SEGMENTS]>,
}

pub(crate) struct ResidentSet {
    parts: Box<[Partition]>,
    /// log2 of the number of partitions.
    part_bits: u32,
    /// log2 of segment 0's slot count (the first capacity of each partition).
    first_bits: u32,
    /// Slots per partition minus one (all partitions have the same capacity). Read on every
    /// operation, written only by `grow`: alone on its cache line.
    mask: CachePadded<AtomicUsize>,
    /// Set once an insert spilled into a partition other than its page's own.
    spilled: AtomicBool,
    grow: Mutex<()>,
}

#[inline]
fn hash(pid: u64) -> u64 {
    // Fibonacci hashing spreads consecutive indices of every class.
    pid.wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// Slots per partition of a set for `max_pages` pages in `parts` partitions.
fn partition_slots_for(max_pages: u64, parts: usize) -> u64 {
    (max_pages.saturating_mul(2).div_ceil(parts as u64)).max(MIN_PARTITION_SLOTS).next_power_of_two()
}

/// A boxed slice of `n` EMPTY slots, or `None` if it cannot be allocated.
fn empty_slots(n: u64) -> Option<Box<[AtomicU64]>> {
    let n = usize::try_from(n).ok()?;
    let mut v = Vec::new();
    v.try_reserve_exact(n).ok()?;
    v.extend((0..n).map(|_| AtomicU64::new(EMPTY)));
    Some(v.into_boxed_slice())
}

impl Partition {
    /// Segment and offset of slot `i` of a partition whose segment 0 has `1 << first_bits`.
    #[inline]
    fn slot(&self, first_bits: u32, i: usize) -> Option<&AtomicU64> {
        let q = i >> first_bits;
        let (seg, off) = if q == 0 {
            (0, i)
        } else {
            let k = (usize::BITS - q.leading_zeros()) as usize;
            (k, i - ((1usize << first_bits) << (k - 1)))
        };
        // A slot below the capacity read with Acquire lies in a published segment.
        self.segments.get(seg)?.get()?.get(off)
    }
}

impl ResidentSet {
    /// A set of one partition for at least `max_pages` resident pages.
    #[cfg(test)]
    pub(crate) fn with_capacity(max_pages: u64) -> ResidentSet {
        Self::try_new(max_pages, 1).expect("resident set allocation")
    }

    /// The number of partitions to use when none is configured: the number of CPUs rounded
    /// up to a power of two, at most [`MAX_PARTITIONS`], and no more than keep every
    /// partition at its minimum size or above for a pool of `max_pages` pages (so the set
    /// costs no more memory than one unpartitioned set).
    pub(crate) fn default_partitions(max_pages: u64) -> usize {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()).next_power_of_two().min(MAX_PARTITIONS);
        let by_size = (max_pages.saturating_mul(2) / MIN_PARTITION_SLOTS).max(1);
        let by_size = 1usize << (63 - by_size.leading_zeros()).min(6);
        cpus.min(by_size).max(1)
    }

    /// Memory a set of `parts` partitions for `max_pages` pages occupies, without building it.
    pub(crate) fn memory_bytes_for(max_pages: u64, parts: usize) -> u64 {
        partition_slots_for(max_pages, parts).saturating_mul(parts as u64).saturating_mul(8)
    }

    /// A set of `parts` partitions (a power of two, at most [`MAX_PARTITIONS`]) for at least
    /// `max_pages` resident pages, or `None` if its slots cannot be allocated (an absurdly
    /// large pool must be a configuration error, not an abort).
    pub(crate) fn try_new(max_pages: u64, parts: usize) -> Option<ResidentSet> {
        if !parts.is_power_of_two() || parts > MAX_PARTITIONS {
            return None;
        }
        let cap = partition_slots_for(max_pages, parts);
        let mask = usize::try_from(cap).ok()? - 1;
        let mut v = Vec::with_capacity(parts);
        for _ in 0..parts {
            let p = Partition { hand: CachePadded::new(AtomicUsize::new(0)), segments: CachePadded::new(std::array::from_fn(|_| OnceLock::new())) };
            p.segments[0].set(empty_slots(cap)?).ok()?;
            v.push(p);
        }
        Some(ResidentSet {
            parts: v.into_boxed_slice(),
            part_bits: parts.trailing_zeros(),
            first_bits: cap.trailing_zeros(),
            mask: CachePadded::new(AtomicUsize::new(mask)),
            spilled: AtomicBool::new(false),
            grow: Mutex::new(()),
        })
    }

    /// Number of partitions.
    pub(crate) fn partitions(&self) -> usize {
        self.parts.len()
    }

    /// Slots per partition now.
    pub(crate) fn partition_capacity(&self) -> usize {
        self.mask.load(Ordering::Acquire) + 1
    }

    /// Number of slots, over all partitions.
    pub(crate) fn capacity(&self) -> usize {
        self.partition_capacity() * self.parts.len()
    }

    /// Memory the set occupies.
    pub(crate) fn memory_bytes(&self) -> u64 {
        self.capacity() as u64 * 8
    }

    /// The partition this thread's next eviction starts in: a per-thread cursor that starts
    /// at the thread's stripe number and advances by one partition per eviction, so that
    /// threads evicting at once are spread over the partitions, and one thread alone still
    /// sweeps every partition in turn (an eviction that stayed in one partition would leave
    /// the pages of the others unmarked and, in effect, protected).
    #[inline]
    pub(crate) fn home(&self) -> usize {
        use std::cell::Cell;
        thread_local!(static NEXT: Cell<usize> = const { Cell::new(usize::MAX) });
        let n = NEXT.with(|c| {
            let v = if c.get() == usize::MAX { crate::sharded::stripe() } else { c.get() };
            c.set(v.wrapping_add(1));
            v
        });
        n & (self.parts.len() - 1)
    }

    #[inline]
    fn partition_of(&self, h: u64) -> usize {
        if self.part_bits == 0 {
            0
        } else {
            (h >> (64 - self.part_bits)) as usize
        }
    }

    /// The mutex that serialises growth; hold it across [`ResidentSet::grow_bytes`], the
    /// charge of those bytes and [`ResidentSet::grow`].
    pub(crate) fn grow_lock(&self) -> MutexGuard<'_, ()> {
        self.grow.lock()
    }

    /// The extra memory growing to room for `max_pages` pages takes (0: big enough now).
    pub(crate) fn grow_bytes(&self, max_pages: u64) -> u64 {
        let want = partition_slots_for(max_pages, self.parts.len());
        let have = self.partition_capacity() as u64;
        if want <= have {
            0
        } else {
            (want - have).saturating_mul(self.parts.len() as u64).saturating_mul(8)
        }
    }

    /// Grows every partition to room for `max_pages` pages (see the module documentation);
    /// the caller holds [`ResidentSet::grow_lock`]. Returns false, changing nothing visible,
    /// if the slots cannot be allocated.
    pub(crate) fn grow(&self, _lock: &MutexGuard<'_, ()>, max_pages: u64) -> bool {
        let want = partition_slots_for(max_pages, self.parts.len());
        let Ok(want) = usize::try_from(want) else { return false };
        let mut cap = self.partition_capacity();
        while cap < want {
            let seg = (cap >> self.first_bits).trailing_zeros() as usize + 1;
            if seg >= SEGMENTS {
                return false;
            }
            for p in self.parts.iter() {
                if p.segments[seg].get().is_none() {
                    let Some(slots) = empty_slots(cap as u64) else { return false };
                    // Only growers, serialised by the lock, set segments.
                    let _ = p.segments[seg].set(slots);
                }
            }
            cap *= 2;
            // Release: the segments set above are visible to whoever reads this mask.
            self.mask.store(cap - 1, Ordering::Release);
        }
        true
    }

    /// Adds `pid` (which must not be present).
    pub(crate) fn insert(&self, pid: PageId) {
        let raw = pid.raw();
        let h = hash(raw);
        let home = self.partition_of(h);
        let mask = self.mask.load(Ordering::Acquire);
        let n = self.parts.len();
        for k in 0..n {
            let part = &self.parts[(home + k) & (n - 1)];
            if k == 1 {
                self.spilled.store(true, Ordering::Relaxed);
            }
            let mut i = (h >> 20) as usize & mask;
            for _ in 0..=mask {
                let Some(slot) = part.slot(self.first_bits, i) else { break };
                let cur = slot.load(Ordering::Relaxed);
                debug_assert_ne!(cur, raw, "{pid} inserted twice");
                if (cur == EMPTY || cur == TOMBSTONE) && slot.compare_exchange(cur, raw, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
                    return;
                }
                i = (i + 1) & mask;
            }
        }
        // The budget keeps the resident pages at no more than half the slots.
        debug_assert!(false, "resident set full inserting {pid}");
    }

    /// Removes `raw` from partition `part`, probing under `mask`.
    fn remove_in(&self, part: &Partition, h: u64, raw: u64, mask: usize) -> bool {
        let mut i = (h >> 20) as usize & mask;
        for _ in 0..=mask {
            let Some(slot) = part.slot(self.first_bits, i) else { return false };
            match slot.load(Ordering::Relaxed) {
                EMPTY => return false,
                v if v == raw => {
                    slot.store(TOMBSTONE, Ordering::Release);
                    return true;
                }
                _ => i = (i + 1) & mask,
            }
        }
        false
    }

    /// Removes `raw` from partition `part`, under every mask the set has had.
    fn remove_from(&self, part: &Partition, h: u64, raw: u64) -> bool {
        let first = (1usize << self.first_bits) - 1;
        let mut mask = self.mask.load(Ordering::Acquire);
        loop {
            if self.remove_in(part, h, raw, mask) {
                return true;
            }
            if mask <= first {
                return false;
            }
            mask >>= 1;
        }
    }

    /// Removes `pid`; returns whether it was present.
    pub(crate) fn remove(&self, pid: PageId) -> bool {
        let raw = pid.raw();
        let h = hash(raw);
        let home = self.partition_of(h);
        if self.remove_from(&self.parts[home], h, raw) {
            return true;
        }
        // Relaxed: an insert that spilled set the flag before its page's latch was released,
        // and the caller holds that latch now.
        if self.spilled.load(Ordering::Relaxed) {
            let n = self.parts.len();
            return (1..n).any(|k| self.remove_from(&self.parts[(home + k) & (n - 1)], h, raw));
        }
        false
    }

    /// Visits the `n` slots of partition `part` from slot counter `start` on.
    #[inline]
    fn visit(&self, part: usize, start: usize, n: usize, mut f: impl FnMut(PageId)) {
        let mask = self.mask.load(Ordering::Acquire);
        let p = &self.parts[part];
        for k in 0..n {
            let Some(slot) = p.slot(self.first_bits, start.wrapping_add(k) & mask) else { continue };
            let v = slot.load(Ordering::Acquire);
            if v != EMPTY && v != TOMBSTONE {
                f(PageId::from_raw(v));
            }
        }
    }

    /// The next `n` slots under partition `part`'s clock hand: calls `f` on each page id found.
    pub(crate) fn clock_batch(&self, part: usize, n: usize, f: impl FnMut(PageId)) {
        let start = self.parts[part].hand.fetch_add(n, Ordering::Relaxed);
        self.visit(part, start, n, f);
    }

    /// Partition `part`'s clock hand: the slot counter its next [`ResidentSet::clock_batch`]
    /// starts at (it only grows; slot = hand modulo the partition's capacity).
    pub(crate) fn hand(&self, part: usize) -> usize {
        self.parts[part].hand.load(Ordering::Relaxed)
    }

    /// Calls `f` on each page id in the `n` slots of partition `part` from slot counter
    /// `start` on, without moving the hand (the cleaner looks ahead of the evictors with it).
    pub(crate) fn peek(&self, part: usize, start: usize, n: usize, f: impl FnMut(PageId)) {
        self.visit(part, start, n, f);
    }

    /// Every page id in the set (a snapshot; concurrent changes may or may not be seen).
    pub(crate) fn for_each(&self, mut f: impl FnMut(PageId)) {
        let cap = self.partition_capacity();
        for part in 0..self.parts.len() {
            self.visit(part, 0, cap, &mut f);
        }
    }

    /// Every page id in partition `part` (a snapshot, as [`ResidentSet::for_each`]).
    #[cfg(test)]
    fn for_each_in(&self, part: usize, f: impl FnMut(PageId)) {
        self.visit(part, 0, self.partition_capacity(), f);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn ids(n: u64) -> Vec<PageId> {
        (0..n).map(|i| PageId::new((i % 3) as u8, i % 2 == 0, i)).collect()
    }

    /// Every page the clock visits in one lap of every partition, sorted.
    fn one_lap(s: &ResidentSet) -> Vec<PageId> {
        let mut seen = Vec::new();
        for p in 0..s.partitions() {
            s.clock_batch(p, s.partition_capacity(), |pid| seen.push(pid));
        }
        seen.sort();
        seen
    }

    #[test]
    fn insert_remove_and_clock_see_each_page_once_per_lap() {
        for parts in [1, 2, 4, 8] {
            let s = ResidentSet::try_new(100, parts).unwrap();
            assert_eq!(s.partitions(), parts);
            let ids = ids(150);
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
            let mut want: Vec<PageId> = ids[..10].iter().chain(&ids[50..]).copied().collect();
            want.sort();
            assert_eq!(one_lap(&s), want, "{parts} partitions");
            // A lap that starts elsewhere sees the same pages.
            for p in 0..parts {
                s.clock_batch(p, 17, |_| {});
            }
            assert_eq!(one_lap(&s), want, "{parts} partitions, second lap");
        }
    }

    #[test]
    fn tombstones_are_reused() {
        let s = ResidentSet::with_capacity(32); // 64 slots
        let ids = ids(32);
        for _ in 0..100 {
            for &p in &ids {
                s.insert(p);
            }
            for &p in &ids {
                assert!(s.remove(p));
            }
        }
        // Had tombstones not been reused, the 64 slots would have run out long ago.
        let mut n = 0;
        s.for_each(|_| n += 1);
        assert_eq!(n, 0);
    }

    #[test]
    fn each_page_lives_in_its_own_partition() {
        let s = ResidentSet::try_new(1000, 4).unwrap();
        for &p in &ids(1000) {
            s.insert(p);
        }
        let mut all = HashSet::new();
        for part in 0..4 {
            s.for_each_in(part, |pid| {
                assert_eq!(s.partition_of(hash(pid.raw())), part);
                assert!(all.insert(pid));
            });
        }
        assert_eq!(all.len(), 1000);
    }

    #[test]
    fn a_full_partition_spills_and_removes_find_the_spilled_pages() {
        // Two partitions of 64 slots; 100 pages that all hash to partition 0.
        let s = ResidentSet::try_new(64, 2).unwrap();
        assert_eq!(s.partition_capacity(), 64);
        let mine: Vec<PageId> = ids(10_000).into_iter().filter(|p| s.partition_of(hash(p.raw())) == 0).take(100).collect();
        for &p in &mine {
            s.insert(p);
        }
        assert_eq!(one_lap(&s), {
            let mut m = mine.clone();
            m.sort();
            m
        });
        for &p in &mine {
            assert!(s.remove(p), "{p}");
        }
        assert!(one_lap(&s).is_empty());
    }

    #[test]
    fn growing_keeps_every_page_findable_and_visits_each_once() {
        for parts in [1, 4] {
            let s = ResidentSet::try_new(64, parts).unwrap();
            let before = s.memory_bytes();
            let ids = ids(3000);
            let mut present: Vec<PageId> = Vec::new();
            for (round, chunk) in ids.chunks(500).enumerate() {
                let lock = s.grow_lock();
                // Room for every page present after this round's inserts, twice over.
                let pages = 600u64 << round;
                let extra = s.grow_bytes(pages);
                let mem = s.memory_bytes();
                assert!(s.grow(&lock, pages));
                assert_eq!(s.memory_bytes(), mem + extra);
                assert_eq!(s.memory_bytes(), ResidentSet::memory_bytes_for(pages, parts));
                drop(lock);
                for &p in chunk {
                    s.insert(p);
                }
                present.extend_from_slice(chunk);
                // Remove every third page: some inserted under every mask so far.
                let (gone, kept): (Vec<_>, Vec<_>) = present.iter().enumerate().partition(|(i, _)| i % 3 == 0);
                for (_, &p) in &gone {
                    assert!(s.remove(p), "{p} lost after growing");
                }
                present = kept.into_iter().map(|(_, &p)| p).collect();
                let mut want = present.clone();
                want.sort();
                assert_eq!(one_lap(&s), want);
            }
            assert!(s.memory_bytes() > before);
            assert_eq!(s.grow_bytes(10), 0, "never shrinks");
        }
    }

    #[test]
    fn concurrent_inserts_removes_and_growth_lose_nothing() {
        let s = std::sync::Arc::new(ResidentSet::try_new(64, 4).unwrap());
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let s = s.clone();
                std::thread::spawn(move || {
                    // At most 4 x 30 pages at once: the 256 slots the set starts with hold them.
                    let mine: Vec<PageId> = (0..30).map(|i| PageId::new(0, false, t * 1_000_000 + i)).collect();
                    for round in 0..3000 {
                        let n = round % 30 + 1;
                        for &p in &mine[..n] {
                            s.insert(p);
                        }
                        for &p in &mine[..n] {
                            assert!(s.remove(p), "{p} lost");
                        }
                    }
                })
            })
            .collect();
        for pages in [128u64, 512, 2048, 8192, 20_000] {
            let lock = s.grow_lock();
            assert!(s.grow(&lock, pages));
            drop(lock);
            std::thread::yield_now();
        }
        for t in threads {
            t.join().unwrap();
        }
        assert!(one_lap(&s).is_empty());
    }

    #[test]
    fn default_partitions_cost_no_extra_memory() {
        for pages in [1u64, 31, 32, 100, 4096, 1 << 20] {
            let p = ResidentSet::default_partitions(pages);
            assert!(p.is_power_of_two() && p <= MAX_PARTITIONS);
            assert_eq!(ResidentSet::memory_bytes_for(pages, p), ResidentSet::memory_bytes_for(pages, 1), "{pages} pages, {p} partitions");
        }
        assert!(ResidentSet::try_new(10, 3).is_none());
        assert!(ResidentSet::try_new(10, 128).is_none());
    }
}
