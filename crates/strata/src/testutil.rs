//! Helpers shared by the crate's unit tests.

use crate::buffer::{BufferManager, Config};

/// A fresh buffer manager over a temporary database directory (kept alive by the TempDir).
pub(crate) fn bm(pool: u64, min_page: u64) -> (tempfile::TempDir, BufferManager) {
    let dir = tempfile::tempdir().unwrap();
    let bm = BufferManager::create(Config::new(dir.path().join("db")).min_page(min_page).pool_size(pool)).unwrap();
    (dir, bm)
}

/// SplitMix64 step: deterministic test data.
pub(crate) fn rng(seed: &mut u64) -> u64 {
    *seed = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *seed;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Temporary pages currently allocated (0 once an operator has cleaned up).
pub(crate) fn temp_pages(bm: &BufferManager) -> u64 {
    bm.stats().classes.iter().map(|c| c.temp_pages).sum()
}

/// Points in the library where a unit test can run code of its own, to force an
/// interleaving that threads would reach only by chance (a checkpoint between a commit and
/// its frees, say). A hook belongs to the thread that set it and runs once.
pub(crate) mod hooks {
    use std::cell::RefCell;

    /// Where a hook runs.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub(crate) enum Point {
        /// A transaction ends: its commit (or rollback) is logged; its frees are not applied
        /// yet and it still holds its locks.
        FreesPending,
        /// A transaction ends: its frees are applied and it still holds its locks.
        LocksPending,
        /// A checkpoint wrote the dirty pages and is about to copy the allocation bitmaps.
        CheckpointCopiesBitmaps,
        /// A checkpoint copied the allocation bitmaps and has not stored them yet.
        CheckpointCopiedBitmaps,
    }

    type Hook = (Point, Box<dyn FnOnce()>);

    thread_local! {
        static HOOKS: RefCell<Vec<Hook>> = const { RefCell::new(Vec::new()) };
    }

    /// Runs `f` the next time this thread reaches `at`.
    pub(crate) fn set(at: Point, f: impl FnOnce() + 'static) {
        HOOKS.with(|h| h.borrow_mut().push((at, Box::new(f))));
    }

    /// Called by the library at `at`.
    pub(crate) fn run(at: Point) {
        let hook = HOOKS.with(|h| {
            let mut h = h.borrow_mut();
            h.iter().position(|(p, _)| *p == at).map(|i| h.remove(i).1)
        });
        if let Some(f) = hook {
            f();
        }
    }
}
