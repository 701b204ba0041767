//! Statistics: counters striped over cache lines so that counting on the hot path does not
//! become a point of contention between threads.

use std::sync::atomic::{AtomicU64, Ordering};

use crossbeam_utils::CachePadded;
use serde::Serialize;

const STRIPES: usize = 64;

/// A counter summed over stripes. The stripes live on the heap: 64 cache lines per counter,
/// for some 30 counters, would make the manager a struct of several hundred KiB, built on
/// the stack of whichever thread opens it.
pub(crate) struct Counter(Box<[CachePadded<AtomicU64>; STRIPES]>);

impl Default for Counter {
    fn default() -> Counter {
        Counter(Box::new(std::array::from_fn(|_| CachePadded::new(AtomicU64::new(0)))))
    }
}

#[inline]
fn stripe() -> usize {
    crate::sharded::stripe() % STRIPES
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
    pub prefetch_hits: Counter,
    pub prefetch_wasted: Counter,
    pub ring_pages: Counter,
    pub ring_hits: Counter,
    pub bytes_read: Counter,
    pub pages_written: Counter,
    pub bytes_written: Counter,
    pub evictions: Counter,
    pub remote_hits: Counter,
    pub remote_misses: Counter,
    pub remote_rejected: Counter,
    pub remote_errors: Counter,
    pub remote_puts: Counter,
    pub write_requests: Counter,
    pub dirty_victims: Counter,
    pub pages_cleaned: Counter,
    pub sequential_windows: Counter,
    pub latch_waits: Counter,
    pub optimistic_restarts: Counter,
    pub reservation_waits: Counter,
    pub clock_moves: Counter,
    pub read_io: IoMeter,
    pub write_io: IoMeter,
}

/// Where threads waited for each other (all counts since open).
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct Contention {
    /// Fixes that found the page latched by another thread and had to wait for it.
    pub latch_waits: u64,
    /// Optimistic reads (`read_optimistic`) that failed validation and started again.
    pub optimistic_restarts: u64,
    /// Reservations that found nothing to evict at once and waited (for another evictor
    /// or for pages to be unpinned).
    pub reservation_waits: u64,
    /// Lock acquisitions that found the lock held, per shared structure: the dirty-page
    /// table's shards and the remote tier's version table's shards. `resident_set_waits` is
    /// always 0 and kept for the JSON's sake: the resident set is partitioned and grows
    /// without a lock (see the buffer manager's `resident` module), so loads and evictions
    /// never wait on it.
    pub dirty_table_waits: u64,
    pub remote_versions_waits: u64,
    pub resident_set_waits: u64,
    /// Clock batches that found no victim in a partition of the resident set, after which
    /// the evictor moved on to the next partition (always 0 with one partition).
    pub clock_moves: u64,
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
    /// Prefetched pages that a fix used (the first fix after the load).
    pub prefetch_hits: u64,
    /// Windows loaded ahead because a thread missed consecutive pages of one file (their
    /// pages count in `pages_prefetched`).
    pub sequential_windows: u64,
    /// Prefetched pages evicted before any fix used them.
    pub prefetch_wasted: u64,
    /// Pages scans read ahead into their rings, outside the pool (see
    /// [`crate::buffer::ring`]; they count in `pages_read` too).
    pub ring_pages: u64,
    /// Pages scans took from their rings.
    pub ring_hits: u64,
    /// Bytes of scan rings (in use or kept for the next scan; charged to the pool).
    pub ring_bytes: u64,
    /// Threads started for the I/O of scan rings (kept for the next rings; a thread ends
    /// after two seconds without work).
    pub ring_threads_started: u64,
    /// Read and write requests: queue depth and size histograms, and the I/O backend.
    pub io: IoStats,
    /// Pages written to disk.
    pub pages_written: u64,
    /// Write requests of page write-back (adjacent pages written together are one request;
    /// the double-write area's writes are not counted).
    pub write_requests: u64,
    /// Evicted pages that were dirty, so the evicting thread (a fix waiting for memory)
    /// wrote them first.
    pub dirty_victims: u64,
    /// Pages written back ahead of the clock by [`crate::buffer::BufferManager::clean_ahead`]
    /// (the background cleaner).
    pub pages_cleaned: u64,
    /// Bytes written to disk.
    pub bytes_written: u64,
    /// Pages evicted.
    pub evictions: u64,
    /// Virtual memory reserved for frames and state words.
    pub reserved_bytes: u64,
    /// `madvise` calls that failed, in this process (all buffer managers together): mostly
    /// `MADV_DONTNEED` of evicted or freed frames, whose memory then stayed resident
    /// although the pool no longer counts it. Expected to be 0.
    pub madvise_failures: u64,
    /// Whether data files bypass the OS page cache.
    pub direct_io: bool,
    /// How loads recycle the frames of evicted pages: `"uffd-move"`, or `"off (why)"`.
    pub frame_recycling: String,
    /// Where threads waited for each other.
    pub contention: Contention,
    /// Loads that took an evicted page's frame instead of fresh zeroed memory.
    pub frames_recycled: u64,
    /// Moves of frames that failed (the frame was then discarded and loaded as before).
    pub frame_moves_failed: u64,
    /// Bytes of evicted frames waiting in the stash for a load now (counted in
    /// `used_bytes`, not in `resident_bytes`).
    pub stashed_bytes: u64,
    /// Per size class (only classes in use).
    pub classes: Vec<ClassStats>,
    /// The second memory tier, if one is configured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remote: Option<super::tier::RemoteStats>,
}

/// Log2 buckets: bucket `k` counts values in `(2^(k-1), 2^k]` (bucket 0: values 0 and 1).
const BUCKETS: usize = 64;

fn bucket(v: u64) -> usize {
    (64 - v.saturating_sub(1).leading_zeros()) as usize
}

/// A histogram of values over power-of-two buckets. Recorded once per I/O request, not on
/// the fix path, so plain shared atomics are cheap enough.
pub(crate) struct Histogram([AtomicU64; BUCKETS]);

impl Default for Histogram {
    fn default() -> Histogram {
        Histogram(std::array::from_fn(|_| AtomicU64::new(0)))
    }
}

impl Histogram {
    pub(crate) fn record(&self, v: u64) {
        self.0[bucket(v)].fetch_add(1, Ordering::Relaxed);
    }

    /// The non-empty buckets, ascending.
    pub(crate) fn snapshot(&self) -> Vec<Bucket> {
        self.0
            .iter()
            .enumerate()
            .filter_map(|(k, c)| {
                let count = c.load(Ordering::Relaxed);
                (count > 0).then(|| Bucket { le: if k == 0 { 1 } else { 1u64 << k.min(63) }, count })
            })
            .collect()
    }
}

/// One bucket of a histogram: `count` values that were at most `le` (and more than the
/// previous bucket's `le`).
#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq, Eq)]
pub struct Bucket {
    /// Upper bound (inclusive) of the bucket: a power of two.
    pub le: u64,
    /// Values in the bucket.
    pub count: u64,
}

/// Requests of one direction (reads or writes) as the device saw them.
#[derive(Default)]
pub(crate) struct IoMeter {
    in_flight: AtomicU64,
    depth: Histogram,
    size: Histogram,
}

impl IoMeter {
    /// Records the issue of requests of `sizes` bytes, of which the file keeps at most
    /// `at_once` in flight together: each one's size, and the number of strata's requests of
    /// this direction in flight when it was issued (itself included). Returns the count to
    /// pass to [`IoMeter::done`].
    pub(crate) fn issue(&self, sizes: impl Iterator<Item = u64>, at_once: usize) -> u64 {
        let before = self.in_flight.load(Ordering::Relaxed);
        let mut n = 0;
        for len in sizes {
            self.depth.record(before + n % at_once.max(1) as u64 + 1);
            self.size.record(len);
            n += 1;
        }
        self.in_flight.fetch_add(n, Ordering::Relaxed);
        n
    }

    /// `n` requests from [`IoMeter::issue`] have completed.
    pub(crate) fn done(&self, n: u64) {
        self.in_flight.fetch_sub(n, Ordering::Relaxed);
    }

    /// (queue depth histogram, request size histogram)
    pub(crate) fn snapshot(&self) -> (Vec<Bucket>, Vec<Bucket>) {
        (self.depth.snapshot(), self.size.snapshot())
    }
}

/// Page reads and writes: how deep the queue was and how large the requests were.
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct IoStats {
    /// The storage backend of the data files (`io_uring`, or `posix` and why).
    pub backend: String,
    /// Read requests by the number of strata's reads outstanding when each was issued,
    /// itself included (1 = nothing else in flight).
    pub read_queue_depth: Vec<Bucket>,
    /// Read requests by size in bytes (adjacent pages read together are one request).
    pub read_request_bytes: Vec<Bucket>,
    /// Write-back requests by the number of strata's writes outstanding when each was
    /// issued, itself included.
    pub write_queue_depth: Vec<Bucket>,
    /// Write-back requests by size in bytes (adjacent pages written together are one).
    pub write_request_bytes: Vec<Bucket>,
}

#[cfg(test)]
mod histogram_tests {
    use super::*;

    #[test]
    fn buckets_are_powers_of_two_upper_bounds() {
        let h = Histogram::default();
        for v in [0, 1, 2, 3, 4, 5, 4096, 4097, 1 << 20] {
            h.record(v);
        }
        let got: Vec<(u64, u64)> = h.snapshot().iter().map(|b| (b.le, b.count)).collect();
        assert_eq!(got, vec![(1, 2), (2, 1), (4, 2), (8, 1), (4096, 1), (8192, 1), (1 << 20, 1)]);
    }

    #[test]
    fn meter_counts_depth_including_the_request_itself() {
        let m = IoMeter::default();
        let n = m.issue([4096u64, 4096, 65536].into_iter(), 64);
        assert_eq!(n, 3);
        let n2 = m.issue(std::iter::once(4096), 1);
        m.done(n);
        m.done(n2);
        let (depth, size) = m.snapshot();
        let depths: Vec<(u64, u64)> = depth.iter().map(|b| (b.le, b.count)).collect();
        assert_eq!(depths, vec![(1, 1), (2, 1), (4, 2)]);
        let sizes: Vec<(u64, u64)> = size.iter().map(|b| (b.le, b.count)).collect();
        assert_eq!(sizes, vec![(4096, 3), (65536, 1)]);
        assert_eq!(m.issue([1u64, 1, 1].into_iter(), 1), 3, "nothing left in flight, one at a time");
        assert_eq!(m.depth.snapshot()[0], Bucket { le: 1, count: 4 });
    }
}
