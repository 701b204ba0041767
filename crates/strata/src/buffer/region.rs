//! Virtual-memory reservations that grow with the database.
//!
//! A [`Region`] maps entry `i` (a page frame or a state word) to an address by arithmetic.
//! It is made of geometrically growing buckets, each one anonymous `MAP_PRIVATE |
//! MAP_ANONYMOUS | MAP_NORESERVE` mapping: bucket `b` holds `2^(c0+b)` entries, so the
//! reservation is never more than twice what the database uses (plus the first bucket) and
//! never terabytes up front, and an address is `bucket_base[b] + offset * entry_size` with
//! `b` found from the position of the highest set bit. Physical memory is taken only when
//! an entry is touched and returned with `madvise(MADV_DONTNEED)`.

use std::ptr;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::error::{Error, Result};

const MAX_BUCKETS: usize = 64;

/// A growable reservation of equally sized entries.
pub(crate) struct Region {
    entry_shift: u32,
    c0: u32,
    buckets: [AtomicPtr<u8>; MAX_BUCKETS],
    /// Entries `0..limit` are mapped (published with Release after mapping).
    limit: AtomicU64,
    grow: Mutex<()>,
    mapped_bytes: AtomicU64,
}

impl Region {
    /// A region of entries of `1 << entry_shift` bytes whose first bucket holds at least
    /// `first_bucket_bytes` bytes (and at least one entry).
    pub(crate) fn new(entry_shift: u32, first_bucket_bytes: u64) -> Region {
        let c0 = first_bucket_bytes.trailing_zeros().saturating_sub(entry_shift);
        Region {
            entry_shift,
            c0,
            buckets: std::array::from_fn(|_| AtomicPtr::new(ptr::null_mut())),
            limit: AtomicU64::new(0),
            grow: Mutex::new(()),
            mapped_bytes: AtomicU64::new(0),
        }
    }

    /// Entries `0..limit()` may be addressed.
    #[inline]
    pub(crate) fn limit(&self) -> u64 {
        self.limit.load(Ordering::Acquire)
    }

    /// Virtual bytes reserved.
    pub(crate) fn mapped_bytes(&self) -> u64 {
        self.mapped_bytes.load(Ordering::Relaxed)
    }

    #[inline]
    fn locate(&self, index: u64) -> (usize, u64) {
        let j = index + (1u64 << self.c0);
        let b = 63 - j.leading_zeros() - self.c0;
        (b as usize, j - (1u64 << (b + self.c0)))
    }

    /// Whether entries `a` and `b` lie in the same bucket (so entries `a..=b` are contiguous
    /// in memory and one I/O can fill them).
    #[inline]
    pub(crate) fn same_bucket(&self, a: u64, b: u64) -> bool {
        self.locate(a).0 == self.locate(b).0
    }

    /// Address of entry `index`. The caller must have checked `index < limit()`.
    #[inline]
    pub(crate) fn addr(&self, index: u64) -> *mut u8 {
        debug_assert!(index < self.limit());
        let (b, off) = self.locate(index);
        let base = self.buckets[b].load(Ordering::Acquire);
        debug_assert!(!base.is_null());
        base.wrapping_add((off << self.entry_shift) as usize)
    }

    /// Maps buckets until entry `index` is addressable.
    pub(crate) fn ensure(&self, index: u64) -> Result<()> {
        if index < self.limit() {
            return Ok(());
        }
        let _g = self.grow.lock();
        while index >= self.limit.load(Ordering::Relaxed) {
            let (b, _) = self.locate(self.limit.load(Ordering::Relaxed));
            let entries = 1u64 << (self.c0 + b as u32);
            let bytes = entries << self.entry_shift;
            // SAFETY: an anonymous private mapping of `bytes` bytes at an address of the
            // kernel's choosing; it aliases nothing. MAP_NORESERVE: no swap is reserved, so
            // only touched pages cost memory.
            let p = unsafe {
                libc::mmap(
                    ptr::null_mut(),
                    bytes as usize,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                    -1,
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                return Err(Error::io(
                    "mmap (reserve virtual memory)",
                    format!("<{} reservation>", crate::util::Bytes(bytes)),
                    std::io::Error::last_os_error(),
                ));
            }
            // Transparent huge pages would back 2 MiB when one 4 KiB page is touched and
            // break the resident-byte accounting; opt out. Failure is harmless.
            // SAFETY: advising a range we just mapped.
            unsafe { libc::madvise(p, bytes as usize, libc::MADV_NOHUGEPAGE) };
            self.buckets[b].store(p.cast(), Ordering::Release);
            self.mapped_bytes.fetch_add(bytes, Ordering::Relaxed);
            self.limit.store((1u64 << self.c0) * ((2u64 << b) - 1), Ordering::Release);
        }
        Ok(())
    }

    /// Returns the physical memory of entries `first..first+count` to the OS; they read as
    /// zero afterwards. Splits at bucket boundaries.
    pub(crate) fn discard(&self, first: u64, count: u64) {
        let mut i = first;
        let end = first + count;
        while i < end {
            let (b, off) = self.locate(i);
            let in_bucket = (1u64 << (self.c0 + b as u32)) - off;
            let n = in_bucket.min(end - i);
            let p = self.addr(i);
            // SAFETY: `p .. p + n entries` lies inside one mapped bucket (n is clipped to the
            // bucket). MADV_DONTNEED on a private anonymous mapping replaces the pages with
            // zero-fill-on-demand pages; the mapping stays valid, so racing optimistic
            // readers read zeros (and then fail validation) instead of faulting.
            unsafe { libc::madvise(p.cast(), (n << self.entry_shift) as usize, libc::MADV_DONTNEED) };
            i += n;
        }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        for (b, bucket) in self.buckets.iter().enumerate() {
            let p = bucket.load(Ordering::Relaxed);
            if !p.is_null() {
                let bytes = (1usize << (self.c0 + b as u32)) << self.entry_shift;
                // SAFETY: `p` was returned by mmap with exactly this length, and no guard can
                // outlive the region (guards borrow the buffer manager that owns it).
                unsafe { libc::munmap(p.cast(), bytes) };
            }
        }
    }
}

// SAFETY: the region only hands out raw addresses; all synchronisation of the memory behind
// them is done by the page-state protocol.
unsafe impl Send for Region {}
// SAFETY: as above; the bucket table itself is atomics plus a mutex.
unsafe impl Sync for Region {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_arithmetic_and_growth_is_geometric() {
        let r = Region::new(12, 16 << 10); // 4 KiB entries, 4 per first bucket
        assert_eq!(r.limit(), 0);
        r.ensure(0).unwrap();
        assert_eq!(r.limit(), 4);
        r.ensure(4).unwrap();
        assert_eq!(r.limit(), 12);
        r.ensure(100).unwrap();
        assert_eq!(r.limit(), 124);
        assert!(r.mapped_bytes() <= 2 * 124 * 4096);
        // Entries inside one bucket are contiguous.
        assert_eq!(r.addr(5) as usize - r.addr(4) as usize, 4096);
        for i in 0..124u64 {
            // SAFETY: entries below limit are mapped and 4 KiB each.
            unsafe { (r.addr(i) as *mut u64).write(i + 1) };
        }
        for i in 0..124u64 {
            // SAFETY: as above.
            assert_eq!(unsafe { (r.addr(i) as *const u64).read() }, i + 1);
        }
        r.discard(2, 20);
        // SAFETY: as above.
        assert_eq!(unsafe { (r.addr(10) as *const u64).read() }, 0, "discarded entries read zero");
        // SAFETY: as above.
        assert_eq!(unsafe { (r.addr(22) as *const u64).read() }, 23);
    }
}
