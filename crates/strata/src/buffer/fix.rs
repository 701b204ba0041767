//! Fixing pages: exclusive, shared and optimistic latches on the page-state word, loading
//! the page on a miss.
//!
//! A resident page is latched with one compare-and-swap on its state word (see
//! [`super::state`]); nothing global is touched except a striped hit counter. On a miss the
//! fixing thread takes `EVICTED -> LOCKED` and loads the page ([`super::load`]).

use super::budget::Backoff;
use super::guard::{ExclusiveGuard, OptimisticGuard, Restart, SharedGuard};
use super::manager::BufferManager;
use super::state::{PageState, EVICTED, LOCKED, MAX_SHARED, UNLOCKED};
use crate::error::{Error, Result};
use crate::storage::{PageId, PAGE_HEADER_SIZE};
use crate::util::prefetch;

impl BufferManager {
    /// For recovery: latches allocated page `pid` exclusively, loading it if needed; a copy
    /// that fails verification is loaded as zeros and reported as `false`.
    pub(crate) fn fix_for_recovery(&self, pid: PageId) -> Result<(ExclusiveGuard<'_>, bool)> {
        let sp = self.lookup(pid)?;
        let index = pid.index();
        let st = sp.state(index);
        let mut backoff = Backoff(0);
        let intact = loop {
            let w = st.load();
            match w.state() {
                _ if w.is_unlatched() && st.try_lock_exclusive(w) => break true,
                EVICTED if st.try_lock_evicted(w) => break self.load_checked(sp, index, true)?,
                _ => self.latch_wait(&mut backoff),
            }
        };
        Ok((ExclusiveGuard { bm: self, sp, index, frame: sp.frame(index), _not_send: Default::default() }, intact))
    }

    /// Counts a fix that found the page resident in word `w` (a prefetch hit if it was
    /// loaded ahead and not fixed since).
    #[inline]
    fn count_hit(&self, w: super::state::Word) {
        self.counters.hits.add_cheap(1);
        if w.is_prefetched() {
            self.counters.prefetch_hits.add(1);
        }
    }

    /// Waits a little for another thread's latch on a page (counted once per fix that had
    /// to wait, in [`Contention::latch_waits`](super::stats::Contention::latch_waits)).
    #[inline]
    fn latch_wait(&self, backoff: &mut Backoff) {
        if backoff.0 == 0 {
            self.counters.latch_waits.add(1);
        }
        backoff.snooze();
    }

    /// Latches `pid` exclusively, loading it if needed.
    #[inline]
    pub fn fix_exclusive(&self, pid: PageId) -> Result<ExclusiveGuard<'_>> {
        // The hit path, inlined into the caller: a resident page nobody latches or marks.
        if let Some(sp) = self.addressable_space(pid).filter(|_| !self.read_only) {
            let index = pid.index();
            let st = sp.state(index);
            let w = st.load();
            // The CAS below orders every later load after it: start loading the payload's
            // first line now, so that its miss overlaps the CAS instead of following it.
            prefetch(sp.frame(index).wrapping_add(PAGE_HEADER_SIZE));
            if w.state() == UNLOCKED && st.try_lock_exclusive(w) {
                self.counters.hits.add_cheap(1);
                return Ok(ExclusiveGuard { bm: self, sp, index, frame: sp.frame(index), _not_send: Default::default() });
            }
        }
        self.fix_exclusive_slow(pid)
    }

    /// [`fix_exclusive`](Self::fix_exclusive) when the hit path does not apply: errors,
    /// misses, latched, marked and prefetched pages.
    #[cold]
    #[inline(never)]
    fn fix_exclusive_slow(&self, pid: PageId) -> Result<ExclusiveGuard<'_>> {
        self.refuse_if_read_only("latching pages for changes")?;
        let sp = self.lookup(pid)?;
        let index = pid.index();
        let st = sp.state(index);
        let mut backoff = Backoff(0);
        loop {
            let w = st.load();
            match w.state() {
                _ if w.is_unlatched() => {
                    if st.try_lock_exclusive(w) {
                        self.count_hit(w);
                        break;
                    }
                }
                EVICTED if self.sequential_miss(sp, index) => {}
                EVICTED => {
                    if st.try_lock_evicted(w) {
                        self.load(sp, index)?;
                        break;
                    }
                }
                _ => self.latch_wait(&mut backoff),
            }
        }
        Ok(ExclusiveGuard { bm: self, sp, index, frame: sp.frame(index), _not_send: Default::default() })
    }

    /// Latches `pid` exclusively if no other latch is held on it (loading it if needed);
    /// `None` if one is. For callers that latch several pages together: they must never
    /// wait for a latch while holding another (rollback of an atomic section).
    pub(crate) fn try_fix_exclusive(&self, pid: PageId) -> Result<Option<ExclusiveGuard<'_>>> {
        self.refuse_if_read_only("latching pages for changes")?;
        let sp = self.lookup(pid)?;
        let index = pid.index();
        let st = sp.state(index);
        let w = st.load();
        let got = match w.state() {
            _ if w.is_unlatched() => {
                let got = st.try_lock_exclusive(w);
                if got {
                    self.count_hit(w);
                }
                got
            }
            EVICTED => {
                let got = st.try_lock_evicted(w);
                if got {
                    self.load(sp, index)?;
                }
                got
            }
            _ => false,
        };
        Ok(got.then(|| ExclusiveGuard { bm: self, sp, index, frame: sp.frame(index), _not_send: Default::default() }))
    }

    /// Latches `pid` shared, loading it if needed.
    #[inline]
    pub fn fix_shared(&self, pid: PageId) -> Result<SharedGuard<'_>> {
        // The hit path, inlined into the caller: a resident page, unlatched or shared, not
        // marked or prefetched.
        if let Some(sp) = self.addressable_space(pid) {
            let index = pid.index();
            let st = sp.state(index);
            let w = st.load();
            // As in fix_exclusive: the payload's first line loads while the CAS runs.
            prefetch(sp.frame(index).wrapping_add(PAGE_HEADER_SIZE));
            if (UNLOCKED..MAX_SHARED).contains(&w.state()) && st.try_lock_shared(w) {
                self.counters.hits.add_cheap(1);
                return Ok(SharedGuard { sp, index, frame: sp.frame(index), _not_send: Default::default() });
            }
        }
        self.fix_shared_slow(pid)
    }

    /// [`fix_shared`](Self::fix_shared) when the hit path does not apply.
    #[cold]
    #[inline(never)]
    fn fix_shared_slow(&self, pid: PageId) -> Result<SharedGuard<'_>> {
        let sp = self.lookup(pid)?;
        let index = pid.index();
        let st = sp.state(index);
        let mut backoff = Backoff(0);
        loop {
            let w = st.load();
            match w.state() {
                EVICTED if self.sequential_miss(sp, index) => {}
                EVICTED => {
                    if st.try_lock_evicted(w) {
                        self.load(sp, index)?;
                        st.downgrade_to_shared();
                        break;
                    }
                }
                LOCKED => self.latch_wait(&mut backoff),
                _ => {
                    if st.try_lock_shared(w) {
                        self.count_hit(w);
                        break;
                    }
                    self.latch_wait(&mut backoff);
                }
            }
        }
        Ok(SharedGuard { sp, index, frame: sp.frame(index), _not_send: Default::default() })
    }

    /// Hints that `pid` is about to be fixed: starts loading its state word and the first
    /// line of its frame into the CPU cache, so that the two loads a fix makes overlap with
    /// other work instead of following each other (a B+-tree descent calls this as soon as
    /// it knows the child). Does nothing for a page that is not addressable.
    #[inline]
    pub fn prefetch_hint(&self, pid: PageId) {
        let Ok(sp) = self.lookup(pid) else { return };
        let index = pid.index();
        let state: *const PageState = sp.state(index);
        prefetch(state.cast());
        prefetch(sp.frame(index).wrapping_add(PAGE_HEADER_SIZE));
    }

    /// Whether `pid` is in memory now (a hint for read-ahead: it may be evicted or loaded
    /// the next moment). False for an id that names no page.
    pub fn is_resident(&self, pid: PageId) -> bool {
        self.addressable_space(pid).is_some_and(|sp| sp.state(pid.index()).load().is_resident())
    }

    /// Starts an optimistic read of `pid`, loading it if needed. No latch is held.
    #[inline]
    pub fn fix_optimistic(&self, pid: PageId) -> Result<OptimisticGuard<'_>> {
        // The hit path, inlined into the caller: a resident page, unlatched or shared, not
        // marked or prefetched. Nothing is written but this thread's hit counter.
        if let Some(sp) = self.addressable_space(pid).filter(|_| !pid.is_temp()) {
            let index = pid.index();
            let w = sp.state(index).load();
            if (UNLOCKED..=MAX_SHARED).contains(&w.state()) {
                self.counters.hits.add_cheap(1);
                return Ok(OptimisticGuard { bm: self, sp, index, frame: sp.frame(index), seen: w });
            }
        }
        self.fix_optimistic_slow(pid)
    }

    /// [`fix_optimistic`](Self::fix_optimistic) when the hit path does not apply.
    #[cold]
    #[inline(never)]
    fn fix_optimistic_slow(&self, pid: PageId) -> Result<OptimisticGuard<'_>> {
        if pid.is_temp() {
            // Their owners write them through `&mut [u8]` (ExclusiveGuard::data_mut).
            return Err(Error::InvalidPageId { pid, reason: "temporary pages are private to their owner and cannot be read optimistically" });
        }
        let sp = self.lookup(pid)?;
        let index = pid.index();
        let st = sp.state(index);
        let mut backoff = Backoff(0);
        loop {
            let w = st.load();
            match w.state() {
                EVICTED if self.sequential_miss(sp, index) => {}
                EVICTED => {
                    if st.try_lock_evicted(w) {
                        self.load(sp, index)?;
                        st.unlock_exclusive_unchanged(false);
                    }
                }
                LOCKED => self.latch_wait(&mut backoff),
                _ => {
                    self.counters.hits.add_cheap(1);
                    if st.clear_mark(w) && w.is_prefetched() {
                        self.counters.prefetch_hits.add(1);
                    }
                    return Ok(OptimisticGuard { bm: self, sp, index, frame: sp.frame(index), seen: w });
                }
            }
        }
    }

    /// Runs `f` on an optimistic view of `pid` until it completes without interference
    /// (`f` returns `Err(Restart)` or validation fails: retry). After 64 failed tries the
    /// read falls back to a shared latch, so it always terminates.
    pub fn read_optimistic<T>(&self, pid: PageId, mut f: impl FnMut(&OptimisticGuard<'_>) -> Result<T, Restart>) -> Result<T> {
        for _ in 0..64 {
            let g = self.fix_optimistic(pid)?;
            if let Ok(v) = f(&g) {
                if g.validate() {
                    return Ok(v);
                }
            }
            self.counters.optimistic_restarts.add(1);
        }
        let s = self.fix_shared(pid)?;
        // Under the shared latch nothing can change, so the view validates.
        let g = OptimisticGuard { bm: self, sp: s.sp, index: s.index, frame: s.frame, seen: s.sp.state(s.index).load() };
        f(&g).map_err(|_| Error::Inconsistent(format!("optimistic read of {pid} restarted under a shared latch")))
    }
}
