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
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};

use parking_lot::Mutex;
use std::sync::Arc;

use super::recycle::Uffd;

use crate::error::{Error, Result};

const MAX_BUCKETS: usize = 64;

/// log2 of a transparent huge page (2 MiB on x86-64 and arm64 with 4 KiB pages).
pub(crate) const HUGE_SHIFT: u32 = 21;

/// A fresh private anonymous mapping of `len` bytes (`MAP_NORESERVE`: only touched pages
/// cost memory). `huge`: it starts on a 2 MiB boundary (cut out of a mapping one huge page
/// larger, the rest unmapped) and is advised to be backed by transparent huge pages;
/// otherwise advised not to be. A refused advice is counted (but EINVAL: a kernel without
/// THP, where there is nothing to advise) and the mapping works the same.
pub(crate) fn map_anonymous(len: usize, huge: bool) -> std::io::Result<*mut u8> {
    let unit = 1usize << HUGE_SHIFT;
    let map = if huge { len + unit } else { len };
    // SAFETY: an anonymous private mapping at an address of the kernel's choosing; it
    // aliases nothing.
    let m =
        unsafe { libc::mmap(ptr::null_mut(), map, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE, -1, 0) };
    if m == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    let m = m.cast::<u8>();
    let lead = if huge { (unit - m as usize % unit) % unit } else { 0 };
    // SAFETY: `lead` bytes and the tail past `lead + len` lie inside the mapping just made,
    // outside the range kept; unmapping them touches nothing else. `m + lead` is inside it.
    let p = unsafe {
        if lead > 0 {
            libc::munmap(m.cast(), lead);
        }
        if map - lead - len > 0 {
            libc::munmap(m.add(lead + len).cast(), map - lead - len);
        }
        m.add(lead)
    };
    let advice = if huge { libc::MADV_HUGEPAGE } else { libc::MADV_NOHUGEPAGE };
    // SAFETY: advising a range we just mapped.
    if unsafe { libc::madvise(p.cast(), len, advice) } != 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINVAL) {
        MADVISE_FAILURES.fetch_add(1, Ordering::Relaxed);
    }
    Ok(p)
}

/// A growable reservation of equally sized entries.
pub(crate) struct Region {
    entry_shift: u32,
    c0: u32,
    buckets: [AtomicPtr<u8>; MAX_BUCKETS],
    /// Entries `0..limit` are mapped (published with Release after mapping).
    limit: AtomicU64,
    grow: Mutex<()>,
    mapped_bytes: AtomicU64,
    /// Every bucket is registered with this userfaultfd when mapped, so that frames can be
    /// moved into it ([`super::recycle`]).
    uffd: Option<Arc<Uffd>>,
}

impl Region {
    /// A region of entries of `1 << entry_shift` bytes whose first bucket holds at least
    /// `first_bucket_bytes` bytes (and at least one entry).
    pub(crate) fn new(entry_shift: u32, first_bucket_bytes: u64) -> Region {
        Self::registered(entry_shift, first_bucket_bytes, None)
    }

    /// Like [`new`](Self::new); each bucket is registered with `uffd` when it is mapped (a
    /// failed registration only means that moves into that bucket fail, and the recycler
    /// falls back to discarding).
    pub(crate) fn registered(entry_shift: u32, first_bucket_bytes: u64, uffd: Option<Arc<Uffd>>) -> Region {
        let c0 = first_bucket_bytes.trailing_zeros().saturating_sub(entry_shift);
        Region {
            entry_shift,
            c0,
            buckets: std::array::from_fn(|_| AtomicPtr::new(ptr::null_mut())),
            limit: AtomicU64::new(0),
            grow: Mutex::new(()),
            mapped_bytes: AtomicU64::new(0),
            uffd,
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
        // Checked in release builds too: the callers' SAFETY arguments rest on the entry
        // lying in a mapped bucket, and a caller's bad index must panic, not reach memory.
        assert!(!base.is_null(), "entry {index} of an unmapped bucket");
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
            // Transparent huge pages would back 2 MiB when one 4 KiB page is touched and
            // break the resident-byte accounting of smaller entries: opted out. Entries of
            // whole huge pages are resident whole units at most, inside what their pages
            // are charged: opted in (a first touch of a 2 MiB unit is then one fault, not
            // 512).
            let p = map_anonymous(bytes as usize, self.entry_shift >= HUGE_SHIFT)
                .map_err(|e| Error::io("mmap (reserve virtual memory)", format!("<{} reservation>", crate::util::Bytes(bytes)), e))?;
            if let Some(uffd) = &self.uffd {
                let _ = uffd.register(p, bytes as usize);
            }
            self.buckets[b].store(p.cast(), Ordering::Release);
            self.mapped_bytes.fetch_add(bytes, Ordering::Relaxed);
            self.limit.store((1u64 << self.c0) * ((2u64 << b) - 1), Ordering::Release);
        }
        Ok(())
    }

    /// Returns the physical memory of entries `first..first+count` to the OS; they read as
    /// zero afterwards.
    pub(crate) fn discard(&self, first: u64, count: u64) {
        let mut batch = Discard::default();
        self.discard_later(first, count, &mut batch);
        batch.run();
    }

    /// Adds entries `first..first+count` to `batch` (split at bucket boundaries); their
    /// memory is returned when the batch runs. The caller keeps them unused until then.
    pub(crate) fn discard_later(&self, first: u64, count: u64, batch: &mut Discard) {
        let mut i = first;
        let end = first + count;
        while i < end {
            let (b, off) = self.locate(i);
            let in_bucket = (1u64 << (self.c0 + b as u32)) - off;
            let n = in_bucket.min(end - i);
            batch.ranges.push(libc::iovec { iov_base: self.addr(i).cast(), iov_len: (n << self.entry_shift) as usize });
            i += n;
        }
    }
}

/// Address ranges of mapped buckets whose physical memory is to be returned to the OS with
/// `MADV_DONTNEED` together.
///
/// One `madvise` per range costs a TLB shootdown (an inter-processor interrupt to every CPU
/// running a thread of the process) each; `process_madvise` on the process itself
/// (Linux 6.13+, `PIDFD_SELF` 6.14+) takes up to `IOV_MAX` ranges in one call, and Linux
/// 6.16+ flushes the TLB once for all of them (measured here, 2 CPUs busy: 0.9 us per 4 KiB
/// range instead of 6.5 us). Where the kernel refuses it, the ranges go one `madvise` each.
#[derive(Default)]
pub(crate) struct Discard {
    ranges: Vec<libc::iovec>,
}

/// `process_madvise` on this process is refused by the kernel (found once, then not tried
/// again).
static NO_PROCESS_MADVISE: AtomicBool = AtomicBool::new(false);

/// `madvise` calls of this process that failed: `MADV_DONTNEED` of a discarded range (its
/// memory was not returned) and `MADV_NOHUGEPAGE` of a new bucket (but for EINVAL: no THP).
/// A refused `process_madvise` is not counted (its ranges then go through `madvise`).
static MADVISE_FAILURES: AtomicU64 = AtomicU64::new(0);

/// How many `madvise` calls failed in this process so far (every region of every buffer
/// manager: the kernel's answer to advice is a property of the process, not of a pool).
pub(crate) fn madvise_failures() -> u64 {
    MADVISE_FAILURES.load(Ordering::Relaxed)
}

/// `PIDFD_SELF` (Linux 6.14+): a pidfd meaning the calling process, never a real descriptor.
const PIDFD_SELF: libc::c_int = -10000;

/// Most ranges one `process_madvise` call takes (`UIO_MAXIOV`).
const IOV_MAX: usize = 1024;

impl Discard {
    /// Returns the memory of every queued range to the OS (they read as zero afterwards) and
    /// empties the batch.
    pub(crate) fn run(&mut self) {
        let mut done = 0;
        while done < self.ranges.len() && !NO_PROCESS_MADVISE.load(Ordering::Relaxed) {
            let chunk = &self.ranges[done..self.ranges.len().min(done + IOV_MAX)];
            // SAFETY: every iovec describes a range inside one mapped bucket of a live
            // region (`discard_later`), which stays mapped while the batch exists (regions
            // outlive the evictions that build batches). MADV_DONTNEED on a private anonymous
            // mapping replaces the pages with zero-fill-on-demand pages; the mapping stays
            // valid, so racing optimistic readers read zeros (and fail validation) instead of
            // faulting. The kernel only reads the iovec array.
            let r = unsafe { libc::syscall(libc::SYS_process_madvise, PIDFD_SELF, chunk.as_ptr(), chunk.len(), libc::MADV_DONTNEED, 0) };
            if r < 0 {
                // ENOSYS (before 5.10), EINVAL (advice refused before 6.13), EBADF (no
                // PIDFD_SELF before 6.14), EPERM (seccomp): plain madvise from now on.
                NO_PROCESS_MADVISE.store(true, Ordering::Relaxed);
                break;
            }
            // It may stop early (returning the bytes advised): skip the ranges it covered,
            // and shorten a range it covered only in part.
            let mut advised = r as usize;
            while advised > 0 && done < self.ranges.len() {
                let range = &mut self.ranges[done];
                if advised >= range.iov_len {
                    advised -= range.iov_len;
                    done += 1;
                } else {
                    range.iov_base = range.iov_base.cast::<u8>().wrapping_add(advised).cast();
                    range.iov_len -= advised;
                    advised = 0;
                }
            }
            if r == 0 {
                break; // no progress: finish with madvise
            }
        }
        for range in &self.ranges[done..] {
            // SAFETY: as above, for one range.
            if unsafe { libc::madvise(range.iov_base, range.iov_len, libc::MADV_DONTNEED) } != 0 {
                // The memory stays resident (and keeps its bytes) although the pool no
                // longer counts it: nothing to retry, but it must show.
                MADVISE_FAILURES.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.ranges.clear();
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

    /// A batch of scattered ranges (across buckets) is discarded together, through
    /// `process_madvise` where the kernel takes it and through one `madvise` per range
    /// where it does not; nothing outside the ranges changes.
    #[test]
    fn a_discard_batch_zeroes_exactly_its_ranges_either_way() {
        let r = Region::new(12, 16 << 10);
        r.ensure(3500).unwrap();
        let limit = r.limit();
        for fallback in [false, true] {
            if fallback {
                NO_PROCESS_MADVISE.store(true, Ordering::Relaxed);
            }
            for i in 0..limit {
                // SAFETY: entries below limit are mapped and 4 KiB each.
                unsafe { (r.addr(i) as *mut u64).write(i + 1) };
            }
            let mut batch = Discard::default();
            // Every third entry, then one run over a bucket boundary (entries 4..12 are the
            // second bucket), and more ranges than one process_madvise call takes.
            let scattered: Vec<u64> = (0..limit).step_by(3).collect();
            for &i in &scattered {
                r.discard_later(i, 1, &mut batch);
            }
            r.discard_later(10, 4, &mut batch);
            assert!(batch.ranges.len() > IOV_MAX, "{}", batch.ranges.len());
            batch.run();
            assert!(batch.ranges.is_empty());
            for i in 0..limit {
                // SAFETY: as above.
                let v = unsafe { (r.addr(i) as *const u64).read() };
                let discarded = i % 3 == 0 || (10..14).contains(&i);
                assert_eq!(v, if discarded { 0 } else { i + 1 }, "entry {i} (fallback {fallback})");
            }
        }
        NO_PROCESS_MADVISE.store(false, Ordering::Relaxed);
    }

    /// A range the kernel refuses (not page-aligned) is counted as a failed madvise, and
    /// the other ranges of the batch are still discarded.
    #[test]
    fn a_failed_madvise_is_counted() {
        let r = Region::new(12, 16 << 10);
        r.ensure(8).unwrap();
        for i in 0..8 {
            // SAFETY: entries below limit are mapped and 4 KiB each.
            unsafe { (r.addr(i) as *mut u64).write(i + 1) };
        }
        let before = madvise_failures();
        let mut batch = Discard::default();
        r.discard_later(1, 1, &mut batch);
        // EINVAL: the start is not page-aligned (process_madvise, where tried, refuses the
        // whole batch the same way, and the ranges then go through madvise one by one).
        batch.ranges.push(libc::iovec { iov_base: r.addr(3).wrapping_add(8).cast(), iov_len: 4096 });
        r.discard_later(5, 1, &mut batch);
        batch.run();
        assert_eq!(madvise_failures(), before + 1);
        for i in 0..8u64 {
            // SAFETY: as above.
            let v = unsafe { (r.addr(i) as *const u64).read() };
            assert_eq!(v, if i == 1 || i == 5 { 0 } else { i + 1 }, "entry {i}");
        }
        NO_PROCESS_MADVISE.store(false, Ordering::Relaxed);
    }
}
