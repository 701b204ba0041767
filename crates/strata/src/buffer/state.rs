//! The page-state word: one 64-bit word per page, as in vmcache.
//!
//! ```text
//!  63        56 55   54                                   0
//! +------------+-----+--------------------------------------+
//! |   state    |dirty|               version                |
//! +------------+-----+--------------------------------------+
//! state: 0 EVICTED (not resident; also free pages)   1 UNLOCKED
//!        2..=251 SHARED, holding state-1 shared latches
//!        252 MARKED (resident, unlocked, chosen by the clock: evicted next unless touched)
//!        253 LOCKED (exclusive)
//!        254 PREFETCHED (resident, unlocked, loaded ahead and not fixed since)
//!        255 PREFETCHED_MARKED (a PREFETCHED page the clock has passed once: as MARKED)
//! The two PREFETCHED states are UNLOCKED and MARKED for a page no fix has used yet: the
//! clock gives it the same one lap as any page nobody touches, and tells a prefetch that
//! was used (a fix found the page in one of them) from one that was wasted (evicted from
//! PREFETCHED_MARKED).
//! ```
//!
//! Rules of the protocol (every transition below is a single compare-and-swap or a store
//! by the thread that holds the exclusive latch):
//!
//! * The version changes on every exclusive release that may have modified the payload and
//!   on every eviction, so an optimistic reader that saw version `v` and still sees `v` with
//!   the page neither LOCKED nor EVICTED knows that the payload it read was not modified or
//!   replaced in between.
//! * Shared and exclusive latches pin a page: eviction needs the exclusive latch and only
//!   ever *tries* to take it, so an evictor never waits for a latch (no deadlock with a
//!   thread that holds latches and needs memory).
//! * `EVICTED` + a zeroed, unbacked frame is the state of every non-resident page; a
//!   thread that wants to load a page takes `EVICTED -> LOCKED` and is then the only loader.
//! * Any fix of a MARKED or PREFETCHED(_MARKED) page clears the mark (second chance).

use crate::sync::{fence, AtomicU64, Ordering};

/// Not resident (or free).
pub const EVICTED: u64 = 0;
/// Resident, no latch held.
pub const UNLOCKED: u64 = 1;
/// Largest state value that means "shared"; the count is `state - 1`.
pub const MAX_SHARED: u64 = 251;
/// Resident, unlatched, marked by the clock.
pub const MARKED: u64 = 252;
/// Exclusively latched.
pub const LOCKED: u64 = 253;
/// Resident, unlatched, loaded by a prefetch and not fixed since (UNLOCKED for the clock).
pub const PREFETCHED: u64 = 254;
/// A [`PREFETCHED`] page the clock has passed once (MARKED for the clock): evicting it
/// wastes the prefetch.
pub const PREFETCHED_MARKED: u64 = 255;

const STATE_SHIFT: u32 = 56;
const DIRTY: u64 = 1 << 55;
const VERSION_MASK: u64 = DIRTY - 1;

/// A snapshot of a state word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Word(pub u64);

impl Word {
    /// The state byte.
    #[inline]
    pub fn state(self) -> u64 {
        self.0 >> STATE_SHIFT
    }
    /// The version.
    #[inline]
    pub fn version(self) -> u64 {
        self.0 & VERSION_MASK
    }
    /// Whether the page has been modified since it was last written.
    #[inline]
    pub fn dirty(self) -> bool {
        self.0 & DIRTY != 0
    }
    /// Whether the page is resident (possibly latched).
    #[inline]
    pub fn is_resident(self) -> bool {
        self.state() != EVICTED
    }
    /// Whether the page is resident and no latch is held on it (UNLOCKED, MARKED or one of
    /// the PREFETCHED states): an exclusive latch can be taken with one compare-and-swap.
    #[inline]
    pub fn is_unlatched(self) -> bool {
        matches!(self.state(), UNLOCKED | MARKED | PREFETCHED | PREFETCHED_MARKED)
    }
    /// Whether the page was loaded by a prefetch and no fix has used it since.
    #[inline]
    pub fn is_prefetched(self) -> bool {
        matches!(self.state(), PREFETCHED | PREFETCHED_MARKED)
    }
    #[inline]
    fn with_state(self, s: u64) -> Word {
        Word((self.0 & !(0xff << STATE_SHIFT)) | (s << STATE_SHIFT))
    }
    #[inline]
    fn bumped(self) -> Word {
        Word((self.0 & !VERSION_MASK) | (self.version().wrapping_add(1) & VERSION_MASK))
    }
    /// Number of shared latches held.
    pub fn shared_count(self) -> u64 {
        match self.state() {
            s @ 2..=MAX_SHARED => s - 1,
            _ => 0,
        }
    }
}

/// The state word of one page.
#[repr(transparent)]
#[derive(Debug, Default)]
pub struct PageState(AtomicU64);

impl PageState {
    /// A fresh state (EVICTED, version 0).
    pub fn new() -> PageState {
        PageState(AtomicU64::new(0))
    }

    /// Current word.
    #[inline]
    pub fn load(&self) -> Word {
        Word(self.0.load(Ordering::Acquire))
    }

    #[inline]
    fn cas(&self, old: Word, new: Word) -> bool {
        self.0.compare_exchange(old.0, new.0, Ordering::Acquire, Ordering::Relaxed).is_ok()
    }

    /// UNLOCKED/MARKED/PREFETCHED(_MARKED) -> LOCKED, if the word is still `seen`.
    #[inline]
    pub fn try_lock_exclusive(&self, seen: Word) -> bool {
        let ok = seen.is_unlatched() && self.cas(seen, seen.with_state(LOCKED));
        if ok {
            // Seqlock rule: the LOCKED store must be ordered before the page stores that
            // follow (which are Relaxed), or an optimistic reader could see a new page word
            // and still re-read the old unlocked word with the same version (found by loom;
            // x86's locked CAS hides it, AArch64 does not). A compiler barrier on x86.
            fence(Ordering::Release);
        }
        ok
    }

    /// EVICTED -> LOCKED (the caller becomes the page's only loader / allocator / freer).
    #[inline]
    pub fn try_lock_evicted(&self, seen: Word) -> bool {
        let ok = seen.state() == EVICTED && self.cas(seen, seen.with_state(LOCKED));
        if ok {
            // As in try_lock_exclusive: the load that follows writes the frame.
            fence(Ordering::Release);
        }
        ok
    }

    /// UNLOCKED/MARKED/PREFETCHED(_MARKED)/SHARED(n) -> SHARED(n+1), if the word is still
    /// `seen`.
    #[inline]
    pub fn try_lock_shared(&self, seen: Word) -> bool {
        let next = match seen.state() {
            UNLOCKED | MARKED | PREFETCHED | PREFETCHED_MARKED => 2,
            s if (2..MAX_SHARED).contains(&s) => s + 1,
            _ => return false,
        };
        self.cas(seen, seen.with_state(next))
    }

    /// Releases one shared latch.
    #[inline]
    pub fn unlock_shared(&self) {
        let prev = Word(self.0.fetch_sub(1 << STATE_SHIFT, Ordering::Release));
        debug_assert!((2..=MAX_SHARED).contains(&prev.state()), "unlock_shared in state {}", prev.state());
    }

    /// LOCKED -> UNLOCKED after the payload may have changed: bumps the version, marks dirty.
    #[inline]
    pub fn unlock_exclusive_modified(&self) {
        let w = self.load();
        debug_assert_eq!(w.state(), LOCKED);
        self.0.store(Word(w.bumped().0 | DIRTY).with_state(UNLOCKED).0, Ordering::Release);
    }

    /// LOCKED -> UNLOCKED without a payload change (a load, a write-back that cleaned it
    /// when `clean`): the version stays, so optimistic readers are not disturbed.
    #[inline]
    pub fn unlock_exclusive_unchanged(&self, clean: bool) {
        let w = self.load();
        debug_assert_eq!(w.state(), LOCKED);
        let w = if clean { Word(w.0 & !DIRTY) } else { w };
        self.0.store(w.with_state(UNLOCKED).0, Ordering::Release);
    }

    /// LOCKED -> MARKED and clean, without a payload change: a dirty page the cleaner took
    /// from MARKED and wrote back goes back to being the clock's next victim, now one that
    /// costs no write. The version stays (sealing the header is not a payload change).
    #[inline]
    pub fn unlock_cleaned(&self) {
        let w = self.load();
        debug_assert_eq!(w.state(), LOCKED);
        self.0.store(Word(w.0 & !DIRTY).with_state(MARKED).0, Ordering::Release);
    }

    /// LOCKED -> PREFETCHED without a payload change: a prefetched page that nobody has
    /// asked for yet is the clock's first candidate; the first fix clears the mark.
    #[inline]
    pub fn unlock_prefetched(&self) {
        let w = self.load();
        debug_assert_eq!(w.state(), LOCKED);
        self.0.store(w.with_state(PREFETCHED).0, Ordering::Release);
    }

    /// LOCKED -> SHARED(1) without a payload change (a loader that wanted a shared latch).
    #[inline]
    pub fn downgrade_to_shared(&self) {
        let w = self.load();
        debug_assert_eq!(w.state(), LOCKED);
        self.0.store(w.with_state(2).0, Ordering::Release);
    }

    /// LOCKED -> SHARED(1) after the payload may have changed: bumps the version, marks
    /// dirty, in one store (no window in which an evictor could take the page).
    #[inline]
    pub fn downgrade_modified(&self) {
        let w = self.load();
        debug_assert_eq!(w.state(), LOCKED);
        self.0.store(Word(w.bumped().0 | DIRTY).with_state(2).0, Ordering::Release);
    }

    /// LOCKED -> EVICTED: the frame has been dropped. Bumps the version, clears dirty.
    #[inline]
    pub fn unlock_evicted(&self) {
        let w = self.load();
        debug_assert_eq!(w.state(), LOCKED);
        self.0.store(Word(w.bumped().0 & !DIRTY).with_state(EVICTED).0, Ordering::Release);
    }

    /// LOCKED -> EVICTED when nothing was ever loaded (a failed load or a refused fix of a
    /// free page): the version stays.
    #[inline]
    pub fn unlock_still_evicted(&self) {
        let w = self.load();
        debug_assert_eq!(w.state(), LOCKED);
        self.0.store(Word(w.0 & !DIRTY).with_state(EVICTED).0, Ordering::Release);
    }

    /// UNLOCKED -> MARKED, PREFETCHED -> PREFETCHED_MARKED (the clock's first pass).
    #[inline]
    pub fn try_mark(&self, seen: Word) -> bool {
        match seen.state() {
            UNLOCKED => self.cas(seen, seen.with_state(MARKED)),
            PREFETCHED => self.cas(seen, seen.with_state(PREFETCHED_MARKED)),
            _ => false,
        }
    }

    /// MARKED/PREFETCHED/PREFETCHED_MARKED -> UNLOCKED (an optimistic fix gives the page
    /// its second chance). Returns whether this call cleared it.
    #[inline]
    pub fn clear_mark(&self, seen: Word) -> bool {
        matches!(seen.state(), MARKED | PREFETCHED | PREFETCHED_MARKED) && self.cas(seen, seen.with_state(UNLOCKED))
    }

    /// Whether an optimistic read that started at `seen` is still valid.
    #[inline]
    pub fn validate(&self, seen: Word) -> bool {
        let now = self.load();
        now.version() == seen.version() && !matches!(now.state(), LOCKED | EVICTED)
    }
}

/// Whether an optimistic read may start on a page in this state.
#[inline]
pub fn optimistic_ok(w: Word) -> bool {
    !matches!(w.state(), LOCKED | EVICTED)
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_prefetched_page_is_used_or_passed_by_the_clock_like_an_untouched_one() {
        let s = PageState::new();
        assert!(s.try_lock_evicted(s.load()));
        s.unlock_prefetched();
        let w = s.load();
        assert!(w.is_prefetched() && w.is_unlatched() && optimistic_ok(w));
        // The clock's first pass marks it; it stays "prefetched" (unused).
        assert!(s.try_mark(w));
        assert_eq!(s.load().state(), PREFETCHED_MARKED);
        assert!(s.load().is_prefetched());
        // A fix uses it: back to UNLOCKED, no longer "prefetched".
        assert!(s.try_lock_shared(s.load()));
        s.unlock_shared();
        assert_eq!(s.load().state(), UNLOCKED);
        assert!(!s.load().is_prefetched());
        // An optimistic fix of a prefetched page clears it once.
        assert!(s.try_lock_exclusive(s.load()));
        s.unlock_prefetched();
        let w = s.load();
        assert!(s.clear_mark(w));
        assert!(!s.clear_mark(w), "the word changed: a second clear does nothing");
        assert_eq!(s.load().version(), w.version(), "no payload change");
    }

    #[test]
    fn transitions_follow_the_protocol() {
        let s = PageState::new();
        let w0 = s.load();
        assert_eq!(w0.state(), EVICTED);
        assert!(!s.try_lock_exclusive(w0), "cannot latch a page that is not resident");
        assert!(s.try_lock_evicted(w0));
        s.unlock_exclusive_unchanged(true); // loaded
        let w1 = s.load();
        assert_eq!((w1.state(), w1.version(), w1.dirty()), (UNLOCKED, 0, false));
        assert!(s.try_lock_shared(w1));
        assert!(s.try_lock_shared(s.load()));
        assert_eq!(s.load().shared_count(), 2);
        assert!(!s.try_lock_exclusive(s.load()));
        assert!(s.validate(w1), "shared latches do not invalidate optimistic reads");
        s.unlock_shared();
        s.unlock_shared();
        assert_eq!(s.load().state(), UNLOCKED);
        assert!(s.try_mark(s.load()));
        assert_eq!(s.load().state(), MARKED);
        assert!(s.try_lock_exclusive(s.load()), "a marked page can still be latched");
        assert!(!s.validate(w1), "LOCKED invalidates");
        s.unlock_exclusive_modified();
        let w2 = s.load();
        assert_eq!((w2.state(), w2.version(), w2.dirty()), (UNLOCKED, 1, true));
        assert!(!s.validate(w1));
        assert!(s.validate(w2));
        assert!(s.try_lock_exclusive(w2));
        s.unlock_evicted();
        let w3 = s.load();
        assert_eq!((w3.state(), w3.version(), w3.dirty()), (EVICTED, 2, false));
        assert!(!s.validate(w2), "eviction invalidates");
    }

    #[test]
    fn shared_count_saturates_instead_of_overflowing() {
        let s = PageState::new();
        assert!(s.try_lock_evicted(s.load()));
        s.unlock_exclusive_unchanged(true);
        for _ in 0..(MAX_SHARED - 1) {
            assert!(s.try_lock_shared(s.load()));
        }
        assert_eq!(s.load().shared_count(), MAX_SHARED - 1);
        assert!(!s.try_lock_shared(s.load()), "full: the caller must wait");
        assert!(!s.try_lock_exclusive(s.load()));
    }
}
