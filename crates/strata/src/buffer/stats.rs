//! Statistics: counters striped over cache lines so that counting on the hot path does not
//! become a point of contention between threads.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crossbeam_utils::CachePadded;
use serde::Serialize;

const STRIPES: usize = 64;

/// A counter summed over stripes.
pub(crate) struct Counter([CachePadded<AtomicU64>; STRIPES]);

impl Default for Counter {
    fn default() -> Counter {
        Counter(std::array::from_fn(|_| CachePadded::new(AtomicU64::new(0))))
    }
}

fn stripe() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local!(static MINE: Cell<usize> = const { Cell::new(usize::MAX) });
    MINE.with(|m| {
        if m.get() == usize::MAX {
            m.set(NEXT.fetch_add(1, Ordering::Relaxed) % STRIPES);
        }
        m.get()
    })
}

impl Counter {
    #[inline]
    pub(crate) fn add(&self, n: u64) {
        self.0[stripe()].fetch_add(n, Ordering::Relaxed);
    }
    /// Adds without a locked instruction (a relaxed load and store). Each thread has its own
    /// stripe as long as there are at most 64 counting threads; beyond that a rare increment
    /// may be lost. For counters on the hot path (hits), where a `lock xadd` would cost more
    /// than the fix itself and serialise the surrounding loads.
    #[inline]
    pub(crate) fn add_cheap(&self, n: u64) {
        let c = &self.0[stripe()];
        c.store(c.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
    }
    pub(crate) fn get(&self) -> u64 {
        self.0.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }
}

/// The buffer manager's counters.
#[derive(Default)]
pub(crate) struct Counters {
    pub hits: Counter,
    pub misses: Counter,
    pub pages_read: Counter,
    pub read_requests: Counter,
    pub pages_prefetched: Counter,
    pub bytes_read: Counter,
    pub pages_written: Counter,
    pub bytes_written: Counter,
    pub evictions: Counter,
    pub remote_hits: Counter,
    pub remote_misses: Counter,
    pub remote_rejected: Counter,
    pub remote_errors: Counter,
    pub remote_puts: Counter,
}

/// Resident and allocated figures of one size class.
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct ClassStats {
    /// The class number.
    pub class: u8,
    /// Its page size in bytes.
    pub page_size: u64,
    /// Allocated persistent pages.
    pub allocated_pages: u64,
    /// Allocated temporary pages.
    pub temp_pages: u64,
    /// Bytes of its pages resident now (persistent and temporary).
    pub resident_bytes: u64,
    /// Size of its data file.
    pub file_bytes: u64,
}

/// A snapshot of the buffer manager's statistics.
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct Stats {
    /// The configured cap.
    pub pool_bytes: u64,
    /// Bytes counted against the cap now (resident pages plus metadata).
    pub used_bytes: u64,
    /// Of which the buffer manager's own metadata (state words, bitmaps, resident set).
    pub metadata_bytes: u64,
    /// Resident page bytes now.
    pub resident_bytes: u64,
    /// High-water mark of `used_bytes`.
    pub peak_resident_bytes: u64,
    /// Fixes that found the page resident.
    pub hits: u64,
    /// Fixes that had to load the page.
    pub misses: u64,
    /// Pages read from disk.
    pub pages_read: u64,
    /// Bytes read from disk.
    pub bytes_read: u64,
    /// Read requests sent to the device (adjacent pages read together count once).
    pub read_requests: u64,
    /// Pages loaded by [`crate::BufferManager::prefetch`].
    pub pages_prefetched: u64,
    /// Pages written to disk.
    pub pages_written: u64,
    /// Bytes written to disk.
    pub bytes_written: u64,
    /// Pages evicted.
    pub evictions: u64,
    /// Virtual memory reserved for frames and state words.
    pub reserved_bytes: u64,
    /// Whether data files bypass the OS page cache.
    pub direct_io: bool,
    /// Per size class (only classes in use).
    pub classes: Vec<ClassStats>,
    /// The second memory tier, if one is configured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remote: Option<super::tier::RemoteStats>,
}
