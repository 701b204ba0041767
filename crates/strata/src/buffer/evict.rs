//! Eviction: the clock over the resident set's partitions, across all classes, and the
//! cleaner's round.
//!
//! An unlatched page is first MARKED; a page still MARKED on the next visit is a victim if
//! its exclusive latch can be *taken without waiting*. Dirty victims are written
//! (checksummed) first, then their frames are dropped with `MADV_DONTNEED` (adjacent frames
//! in one call) or, for an eviction on behalf of a load, moved into the recycler's stash for
//! that load to take ([`super::recycle`]), their state set to EVICTED with a new version,
//! and their bytes returned to the budget. Evictors never wait for latches, so a thread holding latches that needs
//! memory cannot deadlock with another; if nothing is evictable the reservation waits a
//! bounded time for unpins and then reports [`Error::OutOfMemory`].

use std::sync::atomic::Ordering;

use super::manager::BufferManager;
use super::region::Discard;
use super::space::Space;
use super::state::{MARKED, PREFETCHED, PREFETCHED_MARKED, UNLOCKED};
use crate::error::Result;
use crate::storage::PageId;

/// How many slots an evictor takes from the clock per step.
pub(super) const CLOCK_BATCH: usize = 64;

impl BufferManager {
    /// Runs the clock until at least `need` bytes were freed or two laps found nothing.
    /// Returns the bytes freed. With `stash: Some(class)` (an eviction for a load of that
    /// class), victims of that class have their frames moved into the recycler's stash
    /// instead of discarded, as far as it has room; their bytes then stay charged, as
    /// stashed frames, and count in the result too.
    pub(super) fn evict(&self, need: u64, stash: Option<u8>) -> Result<u64> {
        self.evictors.fetch_add(1, Ordering::AcqRel);
        let result = self.evict_inner(need, stash);
        self.evictors.fetch_sub(1, Ordering::AcqRel);
        result
    }

    fn evict_inner(&self, need: u64, stash: Option<u8>) -> Result<u64> {
        let rs = &self.resident;
        let mut victims: Vec<(PageId, &Space)> = Vec::new();
        let mut claimed = 0u64;
        // The clock runs partition by partition (see `super::resident`): it starts in the
        // partition this thread's cursor names (the next one at each call), moves on to the
        // next one after a batch that found no victim (outside the clean-only part below)
        // or once it ran two laps of a partition, and stops when `need` is met or it has run
        // two laps of every partition: a page unlatched all along is then marked on one lap
        // and taken on the next, wherever it lies, so nothing evictable is missed before the
        // caller reports OutOfMemory.
        let parts = rs.partitions();
        let lap = 2 * rs.partition_capacity();
        let mut scanned = [0usize; super::resident::MAX_PARTITIONS];
        let mut finished = 0;
        let mut part = rs.home();
        let mut total = 0usize;
        // With a cleaner running, dirty pages are its work: the first quarter lap takes only
        // clean victims (a thread that needs memory then waits for no write and no fsync)
        // and rings the cleaner for the dirty ones it passed; after that, when clean victims
        // ran short, dirty ones are written in the foreground. (Bounded, so that a pool full
        // of dirty pages costs an eviction a quarter of the set's slots, not a whole lap.)
        let cleaner = self.bell.attached.load(Ordering::Relaxed);
        let capacity = rs.capacity();
        let clean_only_slots = (capacity / 4).max(CLOCK_BATCH).min(capacity);
        let mut passed_dirty = false;
        while claimed < need && finished < parts {
            if scanned[part] >= lap {
                part = (part + 1) & (parts - 1);
                continue;
            }
            let clean_only = cleaner && total < clean_only_slots;
            let found = victims.len();
            rs.clock_batch(part, CLOCK_BATCH, |pid| {
                if claimed >= need {
                    return;
                }
                let Some(sp) = self.spaces[pid.space()].get() else { return };
                let st = sp.state(pid.index());
                let w = st.load();
                match w.state() {
                    UNLOCKED | PREFETCHED => {
                        st.try_mark(w);
                    }
                    MARKED | PREFETCHED_MARKED if clean_only && w.dirty() => passed_dirty = true,
                    MARKED | PREFETCHED_MARKED if st.try_lock_exclusive(w) => {
                        if w.state() == PREFETCHED_MARKED {
                            // Loaded ahead and never fixed: the prefetch was wasted.
                            self.counters.prefetch_wasted.add(1);
                        }
                        claimed += sp.page_size();
                        victims.push((pid, sp));
                    }
                    _ => {}
                }
            });
            scanned[part] += CLOCK_BATCH;
            total += CLOCK_BATCH;
            if scanned[part] >= lap {
                finished += 1;
            }
            // Clean victims are first looked for in the starting partition, so a batch
            // without victims moves on only once the clean-only part is over.
            if victims.len() == found && parts > 1 && !clean_only {
                part = (part + 1) & (parts - 1);
                self.counters.clock_moves.add(1);
            }
        }
        if passed_dirty {
            self.bell.ring();
        }
        if victims.is_empty() {
            return Ok(0);
        }
        let mut first_error = None;
        // Write back the dirty victims as one batch; if it fails they stay resident.
        let dirty: Vec<(PageId, &Space)> = victims.iter().copied().filter(|&(pid, sp)| sp.state(pid.index()).load().dirty()).collect();
        if !dirty.is_empty() {
            // Written in the foreground: a cleaner should have got to them first.
            self.counters.dirty_victims.add(dirty.len() as u64);
            self.bell.ring();
            if let Err(e) = self.write_back(&dirty) {
                for &(pid, sp) in &dirty {
                    sp.state(pid.index()).unlock_exclusive_unchanged(false);
                }
                let failed: std::collections::HashSet<PageId> = dirty.iter().map(|d| d.0).collect();
                victims.retain(|v| !failed.contains(&v.0));
                first_error = Some(e);
            }
        }
        self.offer_to_remote(&victims);
        victims.sort_by_key(|&(pid, _)| pid);
        // Victims of the class a load waits for go to the stash, frame by frame.
        let mut stashed = 0;
        let mut to_discard: Vec<(PageId, &Space)> = Vec::with_capacity(victims.len());
        for &(pid, sp) in &victims {
            // SAFETY: the frame of a page of `sp`, a live space registered with the
            // recycler's userfaultfd; we hold the victim's exclusive latch.
            if stash == Some(sp.class) && unsafe { self.recycler.put(sp.class, sp.page_shift, sp.frame(pid.index())) } {
                stashed += sp.page_size();
            } else {
                to_discard.push((pid, sp));
            }
        }
        // Adjacent frames of one space are one range; all ranges go to the kernel together
        // (one TLB flush where it can), while the victims are still latched.
        let mut discard = Discard::default();
        let mut i = 0;
        while i < to_discard.len() {
            let (first, sp) = to_discard[i];
            let mut j = i + 1;
            while j < to_discard.len() && to_discard[j].0.space() == first.space() && to_discard[j].0.index() == first.index() + (j - i) as u64 {
                j += 1;
            }
            sp.frames.discard_later(first.index(), (j - i) as u64, &mut discard);
            i = j;
        }
        discard.run();
        let rs = &self.resident;
        let mut freed = 0;
        for &(pid, sp) in &victims {
            let removed = rs.remove(pid);
            debug_assert!(removed, "victim {pid} not in the resident set");
            sp.resident_bytes.fetch_sub(sp.page_size(), Ordering::Relaxed);
            sp.state(pid.index()).unlock_evicted();
            freed += sp.page_size();
        }
        self.counters.evictions.add(victims.len() as u64);
        // Stashed frames stay charged (as stashed bytes); the rest goes back to the budget.
        self.release(freed - stashed);
        match first_error {
            Some(e) if freed == 0 => Err(e),
            _ => Ok(freed),
        }
    }

    /// One round of the background cleaner (see [`super::cleaner`]): writes back the dirty
    /// MARKED pages among the next `target` bytes of pages ahead of the clock hand, as one
    /// batch, and leaves them MARKED and clean (the clock's next victims, now without a
    /// write). Never waits for a latch. Returns the number of pages written; on error they
    /// stay dirty.
    pub fn clean_ahead(&self, target: u64) -> Result<usize> {
        // Each partition has its own hand: look ahead of each by its share of `target`.
        let rs = &self.resident;
        let parts = rs.partitions();
        let share = target.div_ceil(parts as u64);
        let pcap = rs.partition_capacity();
        let mut latched: Vec<(PageId, &Space)> = Vec::new();
        for part in 0..parts {
            let start = rs.hand(part);
            let mut seen = 0u64;
            let mut scanned = 0usize;
            while seen < share && scanned < pcap {
                rs.peek(part, start.wrapping_add(scanned), CLOCK_BATCH, |pid| {
                    let Some(sp) = self.spaces[pid.space()].get() else { return };
                    let st = sp.state(pid.index());
                    let w = st.load();
                    if !w.is_resident() || seen >= share {
                        return;
                    }
                    seen += sp.page_size();
                    // Dirty is only set under the exclusive latch, so it stays set once we hold it.
                    if w.state() == MARKED && w.dirty() && st.try_lock_exclusive(w) {
                        latched.push((pid, sp));
                    }
                });
                scanned += CLOCK_BATCH;
            }
        }
        if latched.is_empty() {
            return Ok(0);
        }
        let r = self.write_back(&latched);
        for &(pid, sp) in &latched {
            let st = sp.state(pid.index());
            if r.is_ok() {
                st.unlock_cleaned();
            } else {
                st.unlock_exclusive_unchanged(false);
            }
        }
        r?;
        self.counters.pages_cleaned.add(latched.len() as u64);
        Ok(latched.len())
    }
}
