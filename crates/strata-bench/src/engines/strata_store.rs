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
