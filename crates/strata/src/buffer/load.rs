//! The miss path: loading one page into its frame, and prefetching many with coalesced,
//! batched reads. Every load takes one route: charge the frame, fill it from a source (the
//! remote tier where it holds the page's current image, else the disk), verify, install.

use std::sync::atomic::Ordering;

use super::manager::BufferManager;
use super::space::Space;
use crate::error::{Error, Result};
use crate::storage::page;
use crate::storage::{IoBufMut, PageId, ReadReq};

/// Largest read that prefetch coalesces adjacent pages into.
const MAX_COALESCED_READ: u64 = 1 << 20;

/// Pages `first..first + n` of a space, latched by a prefetch and read with one request.
#[derive(Clone, Copy)]
struct Run<'a> {
    sp: &'a Space,
    first: u64,
    n: u64,
}

impl BufferManager {
    /// Loads page `index` of `sp` into its frame. The caller holds the latch taken by
    /// `EVICTED -> LOCKED`; on error the page is left EVICTED and unlatched.
    pub(super) fn load(&self, sp: &Space, index: u64) -> Result<()> {
        self.load_checked(sp, index, false).map(|_| ())
    }

    /// [`load`](Self::load); with `tolerate_damage`, a page that fails verification (never
    /// written, torn) is not an error but loaded as zeros, and `false` is returned (recovery
    /// rebuilds such pages from the log).
    ///
    /// Every miss takes the same route: charge the frame, fill it from a source (the remote
    /// tier where it holds the page's current image, else the disk), verify, install.
    pub(super) fn load_checked(&self, sp: &Space, index: u64, tolerate_damage: bool) -> Result<bool> {
        let pid = sp.pid(index);
        let st = sp.state(index);
        if !sp.is_allocated(index) {
            st.unlock_still_evicted();
            return Err(Error::InvalidPageId { pid, reason: "page is not allocated (never allocated or freed)" });
        }
        let size = sp.page_size();
        if let Err(e) = self.reserve_frame(sp, index) {
            st.unlock_still_evicted();
            return Err(e);
        }
        self.counters.misses.add(1);
        let intact = match self.fill(sp, index) {
            Ok(()) => true,
            Err(Error::Corruption { .. }) if tolerate_damage => {
                // A fresh mapping reads as zeros.
                sp.frames.discard(index, 1);
                false
            }
            Err(e) => {
                sp.frames.discard(index, 1);
                self.release(size);
                st.unlock_still_evicted();
                return Err(e);
            }
        };
        self.install(sp, index);
        Ok(intact)
    }

    /// Fills the latched, charged frame of page `index` with the page's verified image: from
    /// the remote tier if it holds the image of the page's current version (an image that
    /// does not verify there is rejected and the disk asked instead), else from the disk.
    fn fill(&self, sp: &Space, index: u64) -> Result<()> {
        if self.fill_from_remote(sp, index) {
            return Ok(());
        }
        let pid = sp.pid(index);
        let size = sp.page_size();
        // SAFETY: the caller holds the page's exclusive latch (no other writer); the frame is
        // mapped, aligned and `size` bytes long; optimistic readers only load from it.
        let buf = unsafe { IoBufMut::from_frame(sp.frame(index), size as usize) };
        let metered = self.counters.read_io.issue(std::iter::once(size), 1);
        let read = sp.file.read_at(buf, sp.offset(index));
        self.counters.read_io.done(metered);
        let n = read.map_err(|e| Error::io("read page", sp.path(), e))?;
        if (n as u64) < size {
            return Err(Error::corruption(
                sp.path(),
                Some(pid),
                format!("data file truncated: page needs bytes {}..{}, read only {n}", sp.offset(index), sp.offset(index) + size),
            ));
        }
        self.counters.pages_read.add(1);
        self.counters.read_requests.add(1);
        self.counters.bytes_read.add(size);
        self.verify_frame(sp, index).map_err(|f| Error::corruption(sp.path(), Some(pid), f))
    }

    /// Whether the latched frame of page `index` holds a valid image of that page
    /// (checksum, id); why not otherwise.
    pub(super) fn verify_frame(&self, sp: &Space, index: u64) -> Result<(), String> {
        // SAFETY: the caller holds the page's exclusive latch, so no thread writes the frame
        // (mapped, `page_size` bytes); optimistic readers only load from it.
        let image = unsafe { std::slice::from_raw_parts(sp.frame(index), sp.page_size() as usize) };
        page::verify(image, sp.pid(index)).map(|_| ()).map_err(|f| f.to_string())
    }

    /// Whether the remote tier holds `pid`'s current image (the disk's may be older).
    pub(super) fn in_remote_tier(&self, pid: PageId) -> bool {
        self.remote.is_some() && self.remote_versions.contains(pid)
    }

    /// Counts `pages` pages (`bytes` bytes) read outside their frames (into a scan ring).
    pub(super) fn count_ring_hit(&self) {
        self.counters.ring_hits.add(1);
    }

    /// Counts `pages` pages (`bytes` bytes) read outside their frames (into a scan ring).
    pub(super) fn count_ring_read(&self, bytes: u64, pages: u64) {
        self.counters.pages_read.add(pages);
        self.counters.ring_pages.add(pages);
        self.counters.bytes_read.add(bytes);
    }

    /// Makes page `index`, latched, charged and filled, resident: its bytes count and the
    /// clock sees it. The caller then releases the latch in the state it wants.
    pub(super) fn install(&self, sp: &Space, index: u64) {
        sp.resident_bytes.fetch_add(sp.page_size(), Ordering::Relaxed);
        self.resident.insert(sp.pid(index));
    }

    /// Loads those of `pids` that are not resident, coalescing runs of adjacent pages of one
    /// class (contiguous on disk and, within a reservation bucket, in memory) into single
    /// reads of up to `MAX_COALESCED_READ` bytes, and issuing the reads of all runs of a file
    /// at once ([`StorageFile::read_many`](crate::storage::StorageFile::read_many): with
    /// io_uring they are in flight together). Loaded pages are left unlatched and
    /// PREFETCHED: the first fix counts a prefetch hit; one that no fix used before the clock
    /// passed it twice (the one lap any untouched page gets) is evicted and counted as
    /// wasted.
    ///
    /// Best effort: pages that are latched, free or already resident are skipped, a page that
    /// fails verification is dropped (the fix that wants it reports the error), one call
    /// loads at most a quarter of the pool, and when the pool has no room the rest is
    /// skipped. Returns the number of pages loaded.
    pub fn prefetch(&self, pids: &[PageId]) -> usize {
        let mut loaded = 0;
        let mut next = 0;
        while next < pids.len() {
            let (runs, rest, room) = self.latch_runs(pids, next, &mut loaded);
            self.read_runs(&runs, &mut loaded);
            if !room {
                break;
            }
            next = rest;
        }
        self.counters.pages_prefetched.add(loaded as u64);
        loaded
    }

    /// One round of [`prefetch`](Self::prefetch): latches runs of adjacent, evicted,
    /// allocated pages from `pids[i..]` and reserves their frames, up to a quarter of the pool
    /// (prefetching cannot push out more than that of what other threads are using at once),
    /// recycling evicted frames as a load does ([`super::recycle`]).
    /// Pages the remote tier holds are loaded from there at once (counted in `loaded`).
    /// Returns the runs, where the next round starts, and whether the pool had room.
    fn latch_runs(&self, pids: &[PageId], mut i: usize, loaded: &mut usize) -> (Vec<Run<'_>>, usize, bool) {
        let mut runs: Vec<Run<'_>> = Vec::new();
        let mut budget = self.pool_size() / 4;
        while i < pids.len() {
            let Ok(sp) = self.lookup(pids[i]) else {
                i += 1;
                continue;
            };
            let size = sp.page_size();
            if size > budget && !runs.is_empty() {
                return (runs, i, true); // the round is full
            }
            let first = pids[i].index();
            let max_pages = (MAX_COALESCED_READ.min(budget) >> sp.page_shift).max(1);
            let mut n = 0u64;
            let mut from_remote = false;
            while i < pids.len() && n < max_pages {
                let pid = pids[i];
                let index = first + n;
                if pid != sp.pid(index) || !sp.addressable(index) || !sp.frames.same_bucket(first, index) {
                    break;
                }
                let st = sp.state(index);
                let w = st.load();
                if !st.try_lock_evicted(w) {
                    break;
                }
                if !sp.is_allocated(index) {
                    st.unlock_still_evicted();
                    break;
                }
                let in_tier = self.in_remote_tier(pid);
                if in_tier && n > 0 {
                    // A disk run ends before a page the remote tier holds.
                    st.unlock_still_evicted();
                    break;
                }
                if in_tier {
                    // The remote tier has it: load it from there on its own.
                    if self.try_reserve(size).is_err() {
                        st.unlock_still_evicted();
                        return (runs, i, false);
                    }
                    if self.fill_from_remote(sp, index) {
                        self.install(sp, index);
                        st.unlock_prefetched();
                        *loaded += 1;
                        budget = budget.saturating_sub(size);
                        i += 1;
                        from_remote = true;
                        break;
                    }
                    // Not usable there: read it from disk, as the first page of a run.
                    self.release(size);
                }
                n += 1;
                i += 1;
            }
            if n == 0 {
                if !from_remote {
                    i += 1; // resident, latched or free: skip it
                }
                continue;
            }
            if self.try_reserve_frames(sp, first, n).is_err() {
                for k in 0..n {
                    sp.state(first + k).unlock_still_evicted();
                }
                return (runs, i, false);
            }
            budget = budget.saturating_sub(n * size);
            runs.push(Run { sp, first, n });
        }
        (runs, i, true)
    }

    /// Reads latched `runs` (all those of one file as one batch, in file order), verifies
    /// each page and leaves it PREFETCHED (counted in `loaded`), or EVICTED if it failed.
    fn read_runs(&self, runs: &[Run<'_>], loaded: &mut usize) {
        let mut runs = runs.to_vec();
        runs.sort_by_key(|r| (r.sp as *const Space as usize, r.first));
        for group in runs.chunk_by(|a, b| std::ptr::eq(a.sp, b.sp)) {
            let sp = group[0].sp;
            let size = sp.page_size();
            let mut reqs: Vec<ReadReq<'_>> = group
                .iter()
                .map(|r| {
                    // SAFETY: we hold the exclusive latches of pages first..first+n, which lie
                    // in one bucket, so their frames are contiguous, mapped and 4 KiB aligned;
                    // no other thread writes them; optimistic readers only load. The view
                    // lives until the batch below has completed.
                    let buf = unsafe { IoBufMut::from_frame(sp.frame(r.first), (r.n * size) as usize) };
                    ReadReq::new(buf, sp.offset(r.first))
                })
                .collect();
            self.read_batch(sp, &mut reqs);
            for (r, req) in group.iter().zip(&reqs) {
                let got = *req.result.as_ref().unwrap_or(&0) as u64;
                for k in 0..r.n {
                    let index = r.first + k;
                    if (k + 1) * size <= got && self.verify_frame(sp, index).is_ok() {
                        self.install(sp, index);
                        sp.state(index).unlock_prefetched();
                        *loaded += 1;
                    } else {
                        sp.frames.discard(index, 1);
                        self.release(size);
                        sp.state(index).unlock_still_evicted();
                    }
                }
                self.counters.pages_read.add(got.min(r.n * size) / size);
                self.counters.bytes_read.add(got.min(r.n * size));
            }
        }
    }

    /// Issues `reqs` on `sp`'s file as one batch and counts them. Each request's `result`
    /// says how it went.
    pub(super) fn read_batch(&self, sp: &Space, reqs: &mut [ReadReq<'_>]) {
        let n = self.counters.read_io.issue(reqs.iter().map(|r| r.buf.len() as u64), sp.file.queue_depth());
        // Errors are per request (in `result`).
        let _ = sp.file.read_many(reqs);
        self.counters.read_io.done(n);
        self.counters.read_requests.add(n);
    }
}
