//! `strata`: the buffer manager under test, behind [`PageStore`].

use strata::{BufferManager, Config, PageId, SharedGuard};

use crate::dataset::DataSet;
use crate::{EResult, EngineError, IoCounters, Page, PageStore};

#[derive(Clone, Copy)]
struct FileInfo {
    class: u8,
    page_size: usize,
    pages: u64,
}

/// strata's buffer manager over a data set's database, with one memory budget for every
/// page size.
pub struct StrataStore {
    bm: BufferManager,
    files: Vec<FileInfo>,
}

impl StrataStore {
    /// Opens the data set's database with a pool of `pool_bytes` (pages plus strata's own
    /// metadata, which strata charges to the same budget).
    pub fn open(ds: &DataSet, pool_bytes: u64) -> EResult<StrataStore> {
        let bm = BufferManager::open(Config::new(&ds.db_dir).pool_size(pool_bytes).min_page(ds.min_page))?;
        let files = ds.files.iter().map(|f| FileInfo { class: f.class, page_size: f.page_size, pages: f.pages }).collect();
        Ok(StrataStore { bm, files })
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

    /// Sequential access: prefetch windows of adjacent pages (one coalesced read each, up to
    /// 1 MiB and a quarter of the pool), then fix them one by one — as strata's scan operator.
    fn scan(&self, file: u16, range: std::ops::Range<u64>, f: &mut dyn FnMut(u64, &[u8])) -> EResult<()> {
        let page = self.page_size(file) as u64;
        let window = ((1u64 << 20).min(self.bm.pool_size() / 4) / page).max(1);
        let mut pids = Vec::with_capacity(window as usize);
        let mut start = range.start;
        while start < range.end {
            let end = (start + window).min(range.end);
            pids.clear();
            for index in start..end {
                pids.push(self.pid(Page::new(file, index))?);
            }
            if pids.len() > 1 {
                self.bm.prefetch(&pids);
            }
            for (k, &pid) in pids.iter().enumerate() {
                let g = self.bm.fix_shared(pid)?;
                f(start + k as u64, g.data());
            }
            start = end;
        }
        Ok(())
    }

    fn counters(&self) -> IoCounters {
        let s = self.bm.stats();
        IoCounters { hits: Some(s.hits), misses: Some(s.misses), bytes_read: s.bytes_read }
    }

    fn describe(&self) -> serde_json::Map<String, serde_json::Value> {
        let s = self.bm.stats();
        let mut m = serde_json::Map::new();
        m.insert("pool_bytes".into(), s.pool_bytes.into());
        m.insert("metadata_bytes".into(), s.metadata_bytes.into());
        m.insert("peak_resident_bytes".into(), s.peak_resident_bytes.into());
        m.insert("evictions".into(), s.evictions.into());
        m.insert("direct_io".into(), s.direct_io.into());
        m
    }
}
