//! `static-split`: two hashpools of different page sizes with a fixed split of one memory
//! budget (Kùzu before its variable-size buffer manager: 75 % for small pages, 25 % for large
//! ones). A page is served only by the pool of its size; when that pool cannot hold what is
//! asked of it (more pages pinned at once than it has frames) the request fails, even if the
//! other pool is idle.

use super::hashpool::{HashPool, Pinned};
use crate::dataset::DataFile;
use crate::{EResult, EngineError, IoCounters, MemoryUse, Page, PageStore};

/// Two [`HashPool`]s splitting one budget.
pub struct StaticSplit {
    small: HashPool,
    large: HashPool,
    file_sizes: Vec<usize>,
    small_fraction: f64,
}

impl StaticSplit {
    /// Splits `pool_bytes` into `small_fraction` for `small_page`-byte pages and the rest
    /// for `large_page`-byte pages, over the data files of those two sizes among `files`.
    pub fn open(files: &[DataFile], pool_bytes: u64, small_page: usize, large_page: usize, small_fraction: f64) -> EResult<StaticSplit> {
        if small_page >= large_page {
            return Err(EngineError(format!("static-split needs small < large pages, got {small_page} and {large_page}")));
        }
        let small_bytes = (pool_bytes as f64 * small_fraction) as u64;
        let large_bytes = pool_bytes - small_bytes;
        let small = HashPool::open(files, small_page, small_bytes, false).map_err(|e| EngineError(format!("small-page pool: {e}")))?;
        let large = HashPool::open(files, large_page, large_bytes, false).map_err(|e| EngineError(format!("large-page pool: {e}")))?;
        Ok(StaticSplit { small, large, file_sizes: files.iter().map(|f| f.page_size).collect(), small_fraction })
    }

    fn pool(&self, file: u16) -> EResult<&HashPool> {
        match self.file_sizes.get(file as usize) {
            Some(&s) if s == self.small.frame_size() => Ok(&self.small),
            Some(&s) if s == self.large.frame_size() => Ok(&self.large),
            Some(&s) => Err(EngineError(format!("static-split has no pool for {s}-byte pages"))),
            None => Err(EngineError(format!("no data file {file}"))),
        }
    }

    /// The two pools (small, large).
    pub fn pools(&self) -> (&HashPool, &HashPool) {
        (&self.small, &self.large)
    }
}

impl PageStore for StaticSplit {
    fn name(&self) -> &'static str {
        "static-split"
    }

    fn page_size(&self, file: u16) -> usize {
        self.file_sizes[file as usize]
    }

    fn read(&self, page: Page, f: &mut dyn FnMut(&[u8])) -> EResult<()> {
        self.pool(page.file)?.read(page, f)
    }

    fn read_pinned(&self, pages: &[Page], f: &mut dyn FnMut(usize, &[u8])) -> EResult<()> {
        let mut pins: Vec<(&HashPool, Pinned<'_>)> = Vec::with_capacity(pages.len());
        for &p in pages {
            let pool = self.pool(p.file)?;
            pins.push((pool, pool.fix(p)?));
        }
        for (i, ((pool, pin), &page)) in pins.iter().zip(pages).enumerate() {
            pool.with_frame(pin, page, &mut |d| f(i, d))?;
        }
        Ok(())
    }

    fn counters(&self) -> IoCounters {
        let (a, b) = (self.small.counters(), self.large.counters());
        IoCounters {
            hits: Some(a.hits.unwrap_or(0) + b.hits.unwrap_or(0)),
            misses: Some(a.misses.unwrap_or(0) + b.misses.unwrap_or(0)),
            bytes_read: a.bytes_read + b.bytes_read,
        }
    }

    fn memory(&self) -> Option<MemoryUse> {
        let pools = [&self.small, &self.large];
        Some(MemoryUse {
            resident: pools.iter().map(|p| (p.frame_size() as u64, (p.mapped_pages() * p.frame_size()) as u64)).collect(),
            virtual_bytes: pools.iter().map(|p| (p.capacity() * p.frame_size()) as u64).sum(),
        })
    }

    fn describe(&self) -> serde_json::Map<String, serde_json::Value> {
        let mut m = serde_json::Map::new();
        m.insert("small_fraction".into(), self.small_fraction.into());
        m.insert("small_pool".into(), self.small.describe().into());
        m.insert("large_pool".into(), self.large.describe().into());
        m
    }
}
