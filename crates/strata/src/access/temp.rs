//! Temporary storage for operator state: pages from the same budget as cached data, written
//! to a scratch file when evicted, freed when dropped.
//!
//! [`TempRun`] is an append-only sequence of fixed-size records spread over temporary pages
//! of one size class; it holds at most one page latched while appending and one while
//! reading, so any number of runs can coexist in a pool that holds a few pages each.

use crate::buffer::{BufferManager, ExclusiveGuard, SharedGuard};
use crate::error::Result;
use crate::storage::PageId;

/// A temporary page freed when dropped.
pub struct TempPage<'a> {
    bm: &'a BufferManager,
    pid: PageId,
}

impl<'a> TempPage<'a> {
    /// Allocates a temporary page whose payload holds at least `bytes` bytes; returns it
    /// with its exclusive guard (zeroed). Drop the guard before the `TempPage`: freeing a
    /// page waits for its latches, including one held by the same thread (a tuple drops its
    /// first field first, so don't keep the pair as it is returned).
    pub fn alloc(bm: &'a BufferManager, bytes: usize) -> Result<(TempPage<'a>, ExclusiveGuard<'a>)> {
        let g = bm.alloc_temp(bytes)?;
        Ok((TempPage { bm, pid: g.pid() }, g))
    }
    /// The page id.
    pub fn pid(&self) -> PageId {
        self.pid
    }
    /// Latches it exclusively (loading it back from the scratch file if it was evicted).
    pub fn exclusive(&self) -> Result<ExclusiveGuard<'a>> {
        self.bm.fix_exclusive(self.pid)
    }
    /// Latches it shared.
    pub fn shared(&self) -> Result<SharedGuard<'a>> {
        self.bm.fix_shared(self.pid)
    }
}

impl Drop for TempPage<'_> {
    fn drop(&mut self) {
        let _ = self.bm.free(self.pid);
    }
}

/// An append-only run of `record`-byte records in temporary pages.
pub struct TempRun<'a> {
    bm: &'a BufferManager,
    record: usize,
    per_page: usize,
    page_bytes: usize,
    pages: Vec<(PageId, u32)>,
    tail: Option<ExclusiveGuard<'a>>,
    tail_count: usize,
    len: u64,
}

impl<'a> TempRun<'a> {
    /// A run of `record`-byte records in pages with payloads of at least `page_bytes`.
    pub fn new(bm: &'a BufferManager, record: usize, page_bytes: usize) -> TempRun<'a> {
        assert!(record > 0 && record <= page_bytes, "record must fit a page");
        let page_bytes = bm.payload_size(bm.classes().class_for(page_bytes as u64 + 32).unwrap_or(0));
        TempRun { bm, record, per_page: page_bytes / record, page_bytes, pages: Vec::new(), tail: None, tail_count: 0, len: 0 }
    }

    /// Number of records.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the run is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Number of pages used.
    pub fn page_count(&self) -> usize {
        self.pages.len() + self.tail.is_some() as usize
    }

    /// Appends one record.
    pub fn push(&mut self, rec: &[u8]) -> Result<()> {
        debug_assert_eq!(rec.len(), self.record);
        if self.tail.is_none() {
            let g = self.bm.alloc_temp(self.page_bytes)?;
            self.tail = Some(g);
            self.tail_count = 0;
        }
        let at = self.tail_count * self.record;
        let g = self.tail.as_mut().expect("tail page");
        g.data_mut().expect("temporary page")[at..at + self.record].copy_from_slice(rec);
        self.tail_count += 1;
        self.len += 1;
        if self.tail_count == self.per_page {
            self.seal_tail();
        }
        Ok(())
    }

    /// Appends a u64 (for runs of 8-byte records).
    pub fn push_u64(&mut self, v: u64) -> Result<()> {
        self.push(&v.to_le_bytes())
    }

    fn seal_tail(&mut self) {
        if let Some(g) = self.tail.take() {
            self.pages.push((g.pid(), self.tail_count as u32));
            self.tail_count = 0;
        }
    }

    /// Finishes appending and returns a reader that yields the records in order.
    pub fn reader(mut self) -> TempRunReader<'a> {
        self.seal_tail();
        let pages = std::mem::take(&mut self.pages);
        TempRunReader { bm: self.bm, record: self.record, pages, next_page: 0, cur: None, cur_count: 0, pos: 0 }
    }
}

impl Drop for TempRun<'_> {
    fn drop(&mut self) {
        if let Some(g) = self.tail.take() {
            let _ = g.free();
        }
        for &(pid, _) in &self.pages {
            let _ = self.bm.free(pid);
        }
    }
}

/// Reads a finished [`TempRun`] in order, freeing each page once it has been read.
pub struct TempRunReader<'a> {
    bm: &'a BufferManager,
    record: usize,
    pages: Vec<(PageId, u32)>,
    next_page: usize,
    cur: Option<SharedGuard<'a>>,
    cur_count: usize,
    pos: usize,
}

impl<'a> TempRunReader<'a> {
    /// Calls `f` with the next record, or returns `Ok(false)` at the end.
    pub fn next_with(&mut self, f: impl FnOnce(&[u8])) -> Result<bool> {
        loop {
            if let Some(g) = &self.cur {
                if self.pos < self.cur_count {
                    let at = self.pos * self.record;
                    f(&g.data()[at..at + self.record]);
                    self.pos += 1;
                    return Ok(true);
                }
                let pid = g.pid();
                self.cur = None;
                self.bm.free(pid)?;
            }
            let Some(&(pid, count)) = self.pages.get(self.next_page) else { return Ok(false) };
            self.next_page += 1;
            self.cur = Some(self.bm.fix_shared(pid)?);
            self.cur_count = count as usize;
            self.pos = 0;
        }
    }

    /// The next u64 record.
    pub fn next_u64(&mut self) -> Result<Option<u64>> {
        let mut out = None;
        self.next_with(|r| out = Some(u64::from_le_bytes(r.try_into().expect("8-byte records"))))?;
        Ok(out)
    }
}

impl Drop for TempRunReader<'_> {
    fn drop(&mut self) {
        if let Some(g) = self.cur.take() {
            let pid = g.pid();
            drop(g);
            let _ = self.bm.free(pid);
        }
        for &(pid, _) in &self.pages[self.next_page..] {
            let _ = self.bm.free(pid);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Config;

    #[test]
    fn runs_spill_through_a_tiny_pool_and_free_their_pages() {
        let dir = tempfile::tempdir().unwrap();
        let bm = BufferManager::create(Config::new(dir.path().join("db")).min_page(4096).pool_size(128 << 10)).unwrap();
        let mut runs: Vec<TempRun> = (0..3).map(|_| TempRun::new(&bm, 8, 4000)).collect();
        for i in 0..30_000u64 {
            runs[(i % 3) as usize].push_u64(i * 3).unwrap();
        }
        assert!(bm.stats().evictions > 0, "300 KiB of runs through a 128 KiB pool must spill");
        for (r, run) in runs.into_iter().enumerate() {
            assert_eq!(run.len(), 10_000);
            let mut rd = run.reader();
            let mut k = r as u64;
            while let Some(v) = rd.next_u64().unwrap() {
                assert_eq!(v, k * 3);
                k += 3;
            }
            assert_eq!(k, 30_000 + r as u64);
        }
        assert_eq!(bm.stats().resident_bytes, 0, "every temporary page was freed");
        assert_eq!(crate::testutil::temp_pages(&bm), 0);
        let mut run = TempRun::new(&bm, 8, 4000);
        run.push_u64(1).unwrap();
        drop(run);
        assert_eq!(bm.stats().resident_bytes, 0, "dropping an unread run frees it");
        bm.check_invariants().unwrap();
    }

    #[test]
    fn temp_pages_refuse_optimistic_reads_and_offer_mut_slices() {
        let dir = tempfile::tempdir().unwrap();
        let bm = BufferManager::create(Config::new(dir.path().join("db")).min_page(4096).pool_size(1 << 20)).unwrap();
        let (page, mut g) = TempPage::alloc(&bm, 100).unwrap();
        g.data_mut().unwrap()[..3].copy_from_slice(b"abc");
        drop(g);
        assert!(bm.fix_optimistic(page.pid()).is_err());
        assert_eq!(&page.shared().unwrap().data()[..3], b"abc");
        let pid = page.pid();
        drop(page);
        assert!(bm.fix_shared(pid).is_err(), "freed on drop");
        let mut p = bm.alloc(100).unwrap();
        assert!(p.data_mut().is_none(), "persistent pages are written through atomics only");
    }
}
