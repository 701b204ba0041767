//! Automatic read-ahead for sequential misses: a consumer that fixes pages `i, i+1, i+2, …`
//! of one file without saying so (a merge reading a run, a graph traversal walking CSR
//! pages, a caller's own loop) gets them loaded in windows, with coalesced requests and
//! several in flight, instead of one small synchronous read per page.
//!
//! Each thread remembers its last few streams (per buffer manager and space): the index the
//! stream's next miss is expected at and the current window. A miss of a page
//! that is not expected starts (or restarts) a stream and loads only that page, as before.
//! After two more misses each at the next index, the thread is walking the file: the window
//! doubles at every expected miss
//! (from 4 pages, up to 2 MiB and a sixteenth of the pool) and that many pages from the
//! missed one on are loaded with [`BufferManager::prefetch`]; the stream then expects its
//! next miss right after the window. Its pages are PREFETCHED, so a window the consumer
//! abandons is the first thing the clock takes (and counts as wasted); the missed page itself
//! is fixed right after, as a prefetch hit.
//!
//! The detector is per thread and needs no synchronisation. Several threads walking one
//! file (a parallel scan taking morsels) each see gaps and mostly do not trigger it; they are
//! served by [`super::readahead`] streams, which know the whole range.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};

use super::manager::BufferManager;
use super::space::Space;

/// Streams a thread tracks at once (a merge of a few runs, a join reading two columns).
const STREAMS: usize = 4;
/// Consecutive misses (after the first) before windows start: two, so that random misses
/// that happen to hit the next page (1 in N) rarely trigger one (1 in N²).
const START_AFTER: u64 = 2;
/// The first window, in pages.
const FIRST_WINDOW: u64 = 4;
/// The largest window in bytes (also at most a sixteenth of the pool).
const MAX_WINDOW_BYTES: u64 = 2 << 20;

/// A source of manager ids, so that a thread's streams of one manager are never taken for
/// another's (0 is never handed out).
static NEXT_MANAGER: AtomicU64 = AtomicU64::new(1);

/// A fresh id for a buffer manager.
pub(crate) fn manager_id() -> u64 {
    NEXT_MANAGER.fetch_add(1, Ordering::Relaxed)
}

#[derive(Clone, Copy, Default)]
struct Stream {
    manager: u64,
    /// The space's identity (its address: stable while the manager lives).
    space: usize,
    /// The index the stream's next miss is expected at.
    next: u64,
    /// Consecutive misses so far, after the first (windows start at [`START_AFTER`]).
    streak: u64,
    /// Pages loaded at the last detected miss (0: not yet sequential).
    window: u64,
    /// For replacement: the thread's miss count when last used.
    used: u64,
}

#[derive(Default)]
struct Streams {
    slots: [Stream; STREAMS],
    misses: u64,
}

thread_local! {
    static STREAMS_OF_THREAD: RefCell<Streams> = RefCell::new(Streams::default());
}

impl Streams {
    /// Records a miss of page `index` of `space`; returns how many pages to load from
    /// `index` on (0: just this one, as usual).
    fn miss(&mut self, manager: u64, space: usize, index: u64, max_window: u64) -> u64 {
        self.misses += 1;
        let now = self.misses;
        if let Some(s) = self.slots.iter_mut().find(|s| s.manager == manager && s.space == space && s.next == index) {
            s.used = now;
            s.streak += 1;
            if s.streak < START_AFTER {
                s.next = index + 1;
                return 0;
            }
            // Sequential: grow the window and expect the next miss right after it.
            s.window = (s.window * 2).max(FIRST_WINDOW).min(max_window);
            s.next = index + s.window;
            return s.window;
        }
        // A new stream (or a jump in an old one) replaces the least recently used slot.
        let s = self.slots.iter_mut().min_by_key(|s| s.used).expect("STREAMS > 0");
        *s = Stream { manager, space, next: index + 1, streak: 0, window: 0, used: now };
        0
    }
}

impl BufferManager {
    /// Called on a miss of page `index` of `sp` before the page is loaded on its own: if it
    /// continues one of this thread's sequential streams, loads a window of pages from
    /// `index` on and returns true (the caller then finds the page resident, or loads it
    /// itself if the window could not take it).
    pub(super) fn sequential_miss(&self, sp: &Space, index: u64) -> bool {
        if !self.sequential_readahead {
            return false;
        }
        let page = sp.page_size();
        let max_window = (MAX_WINDOW_BYTES.min(self.pool_size() / 16) / page).max(1);
        if max_window < 2 {
            return false; // pages too large for the pool to read ahead
        }
        let window = STREAMS_OF_THREAD
            .try_with(|s| s.try_borrow_mut().map(|mut s| s.miss(self.id, sp as *const Space as usize, index, max_window)).unwrap_or(0))
            .unwrap_or(0);
        if window < 2 {
            return false;
        }
        // Ids past the end of the file or not allocated are skipped by the prefetch.
        let pids: Vec<_> = (index..index + window).map(|i| sp.pid(i)).collect();
        self.counters.sequential_windows.add(1);
        self.prefetch(&pids) > 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_start_after_three_consecutive_misses_and_double() {
        let mut s = Streams::default();
        assert_eq!(s.miss(1, 10, 100, 32), 0, "a first miss loads one page");
        assert_eq!(s.miss(1, 10, 101, 32), 0, "one more at the next index: not yet");
        assert_eq!(s.miss(1, 10, 102, 32), 4, "the third in a row: sequential, first window");
        assert_eq!(s.miss(1, 10, 106, 32), 8, "right after the window: doubled");
        assert_eq!(s.miss(1, 10, 114, 32), 16);
        assert_eq!(s.miss(1, 10, 130, 32), 32);
        assert_eq!(s.miss(1, 10, 162, 32), 32, "capped");
        assert_eq!(s.miss(1, 10, 500, 32), 0, "a jump starts a new stream");
        assert_eq!(s.miss(1, 10, 501, 32), 0);
        assert_eq!(s.miss(1, 10, 502, 32), 4);
        // A pool too small for the first window gets smaller windows.
        let mut s = Streams::default();
        for i in 0..2 {
            assert_eq!(s.miss(1, 10, i, 2), 0);
        }
        assert_eq!(s.miss(1, 10, 2, 2), 2);
        assert_eq!(s.miss(1, 10, 4, 2), 2);
    }

    #[test]
    fn streams_are_per_manager_and_space_and_interleave() {
        let mut s = Streams::default();
        // Two runs merged: their misses alternate.
        for i in 0..2 {
            assert_eq!(s.miss(1, 10, i, 32), 0);
            assert_eq!(s.miss(1, 20, i, 32), 0);
        }
        assert_eq!(s.miss(1, 10, 2, 32), 4);
        assert_eq!(s.miss(1, 20, 2, 32), 4);
        // Same space and index, other manager: unrelated.
        assert_eq!(s.miss(2, 10, 5, 32), 0);
        // Random misses never trigger.
        let mut x = 7u64;
        let mut s = Streams::default();
        for _ in 0..1000 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            assert_eq!(s.miss(1, 10, (x >> 33) % 1_000_000 * 2, 32), 0);
        }
    }
}
