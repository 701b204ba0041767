//! `strata`: the buffer manager under test, behind [`PageStore`].

use std::sync::{Arc, Mutex};

use strata::buffer::{FilePages, ReadAhead};
use strata::{BufferManager, Config, PageId, SharedGuard};

use crate::dataset::DataSet;
use crate::{EResult, EngineError, IoCounters, MemoryUse, Page, PageStore};

#[derive(Clone, Copy)]
struct FileInfo {
    class: u8,
    page_size: usize,
    pages: u64,
}

/// strata's buffer manager over a data set's database, with one memory budget for every
/// page size.
pub struct StrataStore {
    /// The read-ahead stream of the scan under way (first: dropped, and its thread joined,
    /// before the buffer manager).
    stream: Mutex<Option<Stream>>,
    bm: Arc<BufferManager>,
    files: Vec<FileInfo>,
    /// Whether scans use a read-ahead stream (else they fix page by page and rely on the
    /// manager's detection of sequential misses).
    streams: bool,
}

/// A scan's read-ahead stream over one file.
struct Stream {
    file: u16,
    /// The furthest page a morsel started at.
    furthest: u64,
    /// Shared with the consumers waiting on it (the last one to let go joins its threads).
    ra: Arc<ReadAhead<'static>>,
}

impl StrataStore {
    /// Opens the data set's database with a pool of `pool_bytes` (pages plus strata's own
    /// metadata, which strata charges to the same budget).
    pub fn open(ds: &DataSet, pool_bytes: u64) -> EResult<StrataStore> {
        StrataStore::open_with(ds, pool_bytes, true)
    }

    /// [`StrataStore::open`]; without `streams`, scans fix page by page with no hint (the
    /// `strata-auto` engine: only the detection of sequential misses reads ahead).
    pub fn open_with(ds: &DataSet, pool_bytes: u64, streams: bool) -> EResult<StrataStore> {
        StrataStore::open_config(ds, Config::new(&ds.db_dir).pool_size(pool_bytes), streams)
    }

    /// [`StrataStore::open`] with no read-ahead at all: no hints and no detection of
    /// sequential misses (the `strata-noprefetch` engine: every miss is one page read when
    /// it is fixed).
    pub fn open_without_prefetch(ds: &DataSet, pool_bytes: u64) -> EResult<StrataStore> {
        StrataStore::open_config(ds, Config::new(&ds.db_dir).pool_size(pool_bytes).sequential_readahead(false), false)
    }

    /// [`StrataStore::open`] with scan rings off (the `strata-noring` engine: its scan
    /// stream reads ahead into the pages' frames whatever `STRATA_SCAN_RINGS` says).
    pub fn open_without_rings(ds: &DataSet, pool_bytes: u64) -> EResult<StrataStore> {
        StrataStore::open_with_rings(ds, pool_bytes, false)
    }

    /// [`StrataStore::open`] with scan rings on or off, whatever `STRATA_SCAN_RINGS` says.
    pub fn open_with_rings(ds: &DataSet, pool_bytes: u64, rings: bool) -> EResult<StrataStore> {
        StrataStore::open_config(ds, Config::new(&ds.db_dir).pool_size(pool_bytes).scan_rings(rings), true)
    }

    /// [`StrataStore::open_with`] with frame recycling for every page size (the
    /// `strata-recycle` engine: loads take the frames of evicted pages through `UFFDIO_MOVE`
    /// where the kernel has it; `frame_recycling` in its figures says whether it did).
    /// Plain `strata` recycles only pages of `DEFAULT_RECYCLE_MIN_PAGE` and more.
    pub fn open_with_recycling(ds: &DataSet, pool_bytes: u64) -> EResult<StrataStore> {
        StrataStore::open_config(ds, Config::new(&ds.db_dir).pool_size(pool_bytes).frame_recycling(Some(0)), true)
    }

    /// [`StrataStore::open`] with the resident set and clock in `partitions` partitions
    /// (`Config::clock_partitions`; the `strata-pN` engines of the `partitions` benchmark).
    pub fn open_with_partitions(ds: &DataSet, pool_bytes: u64, partitions: usize) -> EResult<StrataStore> {
        StrataStore::open_config(ds, Config::new(&ds.db_dir).pool_size(pool_bytes).clock_partitions(partitions), true)
    }

    fn open_config(ds: &DataSet, config: Config, streams: bool) -> EResult<StrataStore> {
        let bm = BufferManager::open(config.min_page(ds.min_page))?;
        let files = ds.files.iter().map(|f| FileInfo { class: f.class, page_size: f.page_size, pages: f.pages }).collect();
        Ok(StrataStore { bm: Arc::new(bm), files, stream: Mutex::new(None), streams })
    }

    /// The buffer manager.
    pub fn bm(&self) -> &BufferManager {
        &self.bm
    }

    /// strata's id of `page`.
    pub fn pid(&self, page: Page) -> EResult<PageId> {
        let f = self.files.get(page.file as usize).ok_or_else(|| EngineError(format!("no data file {}", page.file)))?;
        if page.index >= f.pages {
            return Err(EngineError(format!("page {} of file {} is beyond its {} pages", page.index, page.file, f.pages)));
        }
        Ok(PageId::new(f.class, false, page.index))
    }
}

impl PageStore for StrataStore {
    fn name(&self) -> &'static str {
        "strata"
    }

    fn page_size(&self, file: u16) -> usize {
        self.files[file as usize].page_size
    }

    fn read(&self, page: Page, f: &mut dyn FnMut(&[u8])) -> EResult<()> {
        let g = self.bm.fix_shared(self.pid(page)?)?;
        f(g.data());
        Ok(())
    }

    fn read_pinned(&self, pages: &[Page], f: &mut dyn FnMut(usize, &[u8])) -> EResult<()> {
        let mut guards: Vec<SharedGuard<'_>> = Vec::with_capacity(pages.len());
        for &p in pages {
            guards.push(self.bm.fix_shared(self.pid(p)?)?);
        }
        for (i, g) in guards.iter().enumerate() {
            f(i, g.data());
        }
        Ok(())
    }

    /// Random access at a queue depth larger than the thread count: one batch load of the
    /// pages that are not resident ([`BufferManager::prefetch`], best effort: what it could
    /// not load, the fix loads), then a shared fix of each page in batch order, one guard at
    /// a time.
    fn read_batch(&self, pages: &[Page], f: &mut dyn FnMut(usize, &[u8])) -> EResult<()> {
        let pids = pages.iter().map(|&p| self.pid(p)).collect::<EResult<Vec<PageId>>>()?;
        if pids.len() > 1 {
            self.bm.prefetch(&pids);
        }
        for (i, &pid) in pids.iter().enumerate() {
            let g = self.bm.fix_shared(pid)?;
            f(i, g.data());
        }
        Ok(())
    }

    /// Sequential access, as strata's scan operator does it: a read-ahead stream over the
    /// file (its I/O thread loads the pages ahead of the morsels being consumed, in coalesced
    /// reads with several in flight, at a depth that adapts), then fix page by page — or,
    /// with scan rings on, a stream in ring mode (pages not in memory read ahead into the
    /// stream's ring and taken from there; the others fixed). A scan that starts again from
    /// the front (the next pass) gets a new stream.
    fn scan(&self, file: u16, range: std::ops::Range<u64>, f: &mut dyn FnMut(u64, &[u8])) -> EResult<()> {
        let first = self.pid(Page::new(file, range.start))?;
        let info = self.files[file as usize];
        if range.end > info.pages {
            return Err(EngineError(format!("pages {range:?} of file {file} run past its {} pages", info.pages)));
        }
        if self.streams {
            let mut slot = self.stream.lock().unwrap_or_else(|e| e.into_inner());
            let fresh = match &*slot {
                Some(s) => s.file != file || range.start < s.furthest / 2,
                None => true,
            };
            if fresh {
                // Drop the old stream first: its thread is joined before the new one starts.
                *slot = None;
                let source = Arc::new(FilePages { class: first.class(), first: 0, count: info.pages });
                // Ring mode where rings are on (`STRATA_SCAN_RINGS`, `Config::scan_rings`).
                *slot = Some(Stream { file, furthest: 0, ra: Arc::new(ReadAhead::spawn_ring(self.bm.clone(), source)) });
            }
            let s = slot.as_mut().expect("a stream was just made");
            s.furthest = s.furthest.max(range.start);
            s.ra.advance(range.start as usize..range.end as usize);
            let ra = s.ra.clone();
            drop(slot);
            // Sleep until the I/O threads have the morsel, rather than poll its latches.
            ra.wait(range.start as usize..range.end as usize);
            if ra.ring_mode() {
                // Pages the ring read are taken from it; the rest are fixed.
                let mut m = ra.morsel(range.start as usize..range.end as usize);
                for index in range {
                    match m.ring_page(index as usize) {
                        Some(data) => f(index, data),
                        None => f(index, self.bm.fix_shared(PageId::new(first.class(), false, index))?.data()),
                    }
                }
                return Ok(());
            }
        }
        for index in range {
            let g = self.bm.fix_shared(PageId::new(first.class(), false, index))?;
            f(index, g.data());
        }
        Ok(())
    }

    fn counters(&self) -> IoCounters {
        let s = self.bm.stats();
        IoCounters { hits: Some(s.hits), misses: Some(s.misses), bytes_read: s.bytes_read }
    }

    fn memory(&self) -> Option<MemoryUse> {
        let s = self.bm.stats();
        let mut resident: Vec<(u64, u64)> = Vec::new();
        for c in s.classes.iter().filter(|c| c.resident_bytes > 0) {
            match resident.iter_mut().find(|(size, _)| *size == c.page_size) {
                Some((_, b)) => *b += c.resident_bytes,
                None => resident.push((c.page_size, c.resident_bytes)),
            }
        }
        Some(MemoryUse { resident, virtual_bytes: s.reserved_bytes })
    }

    fn describe(&self) -> serde_json::Map<String, serde_json::Value> {
        let s = self.bm.stats();
        let mut m = serde_json::Map::new();
        m.insert("pool_bytes".into(), s.pool_bytes.into());
        m.insert("metadata_bytes".into(), s.metadata_bytes.into());
        m.insert("peak_resident_bytes".into(), s.peak_resident_bytes.into());
        m.insert("evictions".into(), s.evictions.into());
        m.insert("direct_io".into(), s.direct_io.into());
        // Totals since the engine was opened (fills and warm-ups included). A fix of a page
        // that a batch's prefetch loaded counts as a hit in `hits`.
        m.insert("pages_prefetched".into(), s.pages_prefetched.into());
        m.insert("prefetch_hits".into(), s.prefetch_hits.into());
        m.insert("prefetch_wasted".into(), s.prefetch_wasted.into());
        m.insert("scan_rings".into(), self.bm.scan_rings().into());
        m.insert("ring_pages".into(), s.ring_pages.into());
        m.insert("ring_hits".into(), s.ring_hits.into());
        m.insert("sequential_windows".into(), s.sequential_windows.into());
        m.insert("read_requests".into(), s.read_requests.into());
        m.insert("frame_recycling".into(), s.frame_recycling.into());
        m.insert("frames_recycled".into(), s.frames_recycled.into());
        m.insert("clock_partitions".into(), self.bm.clock_partitions().into());
        m.insert("contention".into(), serde_json::to_value(&s.contention).unwrap_or_default());
        m
    }
}
