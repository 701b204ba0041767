//! Write-back: sealing pages (header, LSN, checksum), the write-ahead rule, the double-write
//! area for pages whose durable copy an in-place write could tear, coalesced home writes,
//! and the dirty-page table.

use std::sync::atomic::Ordering;

use super::manager::{frame_lsn, BufferManager};
use super::space::Space;
use crate::error::{Error, Result};
use crate::storage::backend::atomic_word;
use crate::storage::page::{checksum, header_words};
use crate::storage::{PageId, WriteReq, PAGE_HEADER_SIZE};

/// Largest write request write-back makes of adjacent pages.
const MAX_COALESCED_WRITE: u64 = 1 << 20;

impl BufferManager {
    /// Seals page `index` of `sp` (header with its LSN, then the checksum) in its frame and
    /// returns its LSN; the caller holds its exclusive latch.
    fn seal(&self, sp: &Space, index: u64) -> u64 {
        let frame = sp.frame(index);
        let size = sp.page_size() as usize;
        // SAFETY: `frame` is the frame of a page of `sp`, a live space of this manager.
        let lsn = unsafe { frame_lsn(frame) };
        // SAFETY: the caller holds the exclusive latch, so no thread writes the frame; the
        // only concurrent accesses are optimistic atomic loads (reads alongside reads).
        let payload = unsafe { std::slice::from_raw_parts(frame.add(PAGE_HEADER_SIZE), size - PAGE_HEADER_SIZE) };
        let words = header_words(sp.pid(index), lsn, |head| checksum(head, payload));
        for (k, w) in words.iter().enumerate() {
            // Header words are stored as their little-endian byte image.
            #[allow(clippy::host_endian_bytes)]
            let native = u64::from_ne_bytes(w.to_le_bytes());
            // SAFETY: the frame is 4 KiB aligned, so header word k (byte 8k) is aligned and
            // inside the frame; the store is atomic (optimistic readers may load it).
            unsafe { atomic_word(frame.add(8 * k)) }.store(native, Ordering::Relaxed);
        }
        lsn
    }

    /// Seals and writes back `pages`, whose exclusive latches the caller holds; clears
    /// nothing (the caller decides their states afterwards) except their dirty-table entries.
    ///
    /// The log is made durable up to the newest page LSN first (write-ahead rule). Pages whose
    /// durable copy an in-place write could tear (pages allocated in the stored allocation
    /// table) go through the double-write area: batch written and fsynced there, then written
    /// home and fsynced, under `dw_lock`. A page the stored table does not hold has no durable
    /// copy to lose: it was allocated after the checkpoint the log starts from, so if its
    /// write tears, recovery rebuilds it from its logged allocation and changes (a logged
    /// page), or nothing refers to it (an unlogged one, whose owner makes it durable with a
    /// checkpoint before publishing it). So new pages, most of what an import writes, are
    /// written once, not twice. On error nothing is cleaned.
    pub(super) fn write_back(&self, pages: &[(PageId, &Space)]) -> Result<()> {
        self.refuse_if_read_only("writing pages")?;
        let mut max_lsn = 0;
        for &(pid, sp) in pages {
            max_lsn = max_lsn.max(self.seal(sp, pid.index()));
            self.forget_remote(pid);
        }
        self.durability.flush_for(max_lsn)?;
        let image = |pid: PageId, sp: &Space| -> &[u8] {
            // SAFETY: exclusive latch held by the caller (see `seal`); the frame is mapped for
            // the page size and only loaded from by others.
            unsafe { std::slice::from_raw_parts(sp.frame(pid.index()), sp.page_size() as usize) }
        };
        let durable = self.durable.read();
        let guarded = |pid: PageId, sp: &Space| !sp.temp && durable.get(sp.class as usize).is_some_and(|b| b.is_allocated(pid.index()));
        let (torn_risk, unguarded): (Vec<_>, Vec<_>) = pages.iter().copied().partition(|&(pid, sp)| guarded(pid, sp));
        drop(durable);
        self.write_home(&unguarded).map_err(|(_, e)| e)?;
        if !torn_risk.is_empty() {
            let _batch = self.dw_lock.lock();
            // After a failed home write or fsync, the double-write area may hold the only good
            // copy of a page whose home is torn: it must not be overwritten before a reopen
            // restores it.
            if let Some(path) = self.sync_failed.lock().clone() {
                return Err(Error::io(
                    "write page",
                    path,
                    std::io::Error::other("an earlier page write or fsync failed; pages are not overwritten in place again until the database is reopened"),
                ));
            }
            let images: Vec<(PageId, &[u8])> = torn_risk.iter().map(|&(pid, sp)| (pid, image(pid, sp))).collect();
            self.dw.write(&images)?;
            if let Err((sp, e)) = self.write_home(&torn_risk) {
                *self.sync_failed.lock() = Some(sp.path());
                return Err(e);
            }
            let mut files: Vec<&Space> = Vec::new();
            for &(_, sp) in &torn_risk {
                if !files.iter().any(|f| std::ptr::eq(*f, sp)) {
                    files.push(sp);
                }
            }
            for sp in files {
                if let Err(e) = sp.file.sync() {
                    *self.sync_failed.lock() = Some(sp.path());
                    return Err(Error::io("fsync", sp.path(), e));
                }
            }
        }
        for &(pid, _) in pages {
            self.durability.page_clean(pid);
        }
        Ok(())
    }

    /// Writes sealed `pages` (whose exclusive latches the caller holds) to their home
    /// locations: adjacent pages of one file whose frames are contiguous go as one request of
    /// up to `MAX_COALESCED_WRITE` bytes, and all requests of a file are issued as one batch
    /// ([`StorageFile::write_many`](crate::storage::StorageFile::write_many): in flight
    /// together with io_uring). On error, the file that failed and the error; the other
    /// requests of its batch were still carried out.
    fn write_home<'s>(&self, pages: &[(PageId, &'s Space)]) -> std::result::Result<(), (&'s Space, Error)> {
        let mut pages = pages.to_vec();
        pages.sort_by_key(|&(pid, sp)| (sp as *const Space as usize, pid.index()));
        for group in pages.chunk_by(|a, b| std::ptr::eq(a.1, b.1)) {
            let sp = group[0].1;
            let size = sp.page_size();
            let max_pages = (MAX_COALESCED_WRITE / size).max(1) as usize;
            let mut reqs: Vec<WriteReq<'_>> = Vec::new();
            let mut i = 0;
            while i < group.len() {
                let first = group[i].0.index();
                let mut n = 1;
                while i + n < group.len() && n < max_pages && group[i + n].0.index() == first + n as u64 && sp.frames.same_bucket(first, first + n as u64) {
                    n += 1;
                }
                // SAFETY: the caller holds the exclusive latches of pages first..first+n
                // (no thread writes their frames; others only load), which lie in one bucket,
                // so the frames are contiguous and mapped for n pages.
                let buf = unsafe { std::slice::from_raw_parts(sp.frame(first), n * size as usize) };
                reqs.push(WriteReq::new(buf, sp.offset(first)));
                i += n;
            }
            let metered = self.counters.write_io.issue(reqs.iter().map(|r| r.buf.len() as u64), sp.file.queue_depth());
            let outcome = sp.file.write_many(&mut reqs);
            self.counters.write_io.done(metered);
            self.counters.write_requests.add(metered);
            let written: u64 = reqs.iter().filter(|r| r.result.is_ok()).map(|r| r.buf.len() as u64).sum();
            self.counters.pages_written.add(written / size);
            self.counters.bytes_written.add(written);
            outcome.map_err(|e| (sp, Error::io("write page", sp.path(), e)))?;
        }
        Ok(())
    }

    /// Records that persistent page `pid` became dirty: the log may hold changes not on its
    /// disk copy from `lsn` on (`None`: from the current end of the log, for unlogged writes).
    pub(crate) fn note_dirty(&self, pid: PageId, lsn: Option<u64>) {
        if pid.is_temp() {
            return;
        }
        self.durability.note_dirty(pid, lsn);
    }
}
