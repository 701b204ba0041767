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
