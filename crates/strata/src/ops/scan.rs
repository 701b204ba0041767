//! Filtered scan of a column: count and exact sum of the values greater than a threshold.
//!
//! Morsel-driven: worker threads take the next page from a shared counter, fix it shared,
//! and fold its values; results are combined at the end. Each thread holds at most one page
//! latch at a time, so any pool that fits `threads` pages of the column completes.

use serde::Serialize;

use crate::access::{Column, ValueFormat};
use crate::buffer::BufferManager;
use crate::error::Result;
use crate::storage::PageId;

/// Result of [`scan_gt`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ScanResult {
    /// Values greater than the threshold.
    pub count: u64,
    /// Their exact sum.
    pub sum: i128,
}

impl ScanResult {
    fn merge(self, o: ScanResult) -> ScanResult {
        ScanResult { count: self.count + o.count, sum: self.sum + o.sum }
    }
}

fn fold_page(format: ValueFormat, bytes: &[u8], n: usize, gt: i128) -> ScanResult {
    let bytes = &bytes[..n * format.width()];
    match format {
        ValueFormat::U32le => {
            if gt < 0 {
                let sum: u64 = bytes.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().unwrap()) as u64).sum();
                return ScanResult { count: n as u64, sum: sum as i128 };
            }
            if gt >= u32::MAX as i128 {
                return ScanResult::default();
            }
            let t = gt as u32;
            let (mut count, mut sum) = (0u64, 0u64);
            for c in bytes.chunks_exact(4) {
                let v = u32::from_le_bytes(c.try_into().unwrap());
                let hit = (v > t) as u64;
                count += hit;
                sum += hit * v as u64;
            }
            ScanResult { count, sum: sum as i128 }
        }
        ValueFormat::U64le => {
            let (mut count, mut sum) = (0u64, 0u128);
            for c in bytes.chunks_exact(8) {
                let v = u64::from_le_bytes(c.try_into().unwrap());
                if v as i128 > gt {
                    count += 1;
                    sum += v as u128;
                }
            }
            ScanResult { count, sum: sum as i128 }
        }
        ValueFormat::I64le => {
            let (mut count, mut sum) = (0u64, 0i128);
            for c in bytes.chunks_exact(8) {
                let v = i64::from_le_bytes(c.try_into().unwrap());
                if v as i128 > gt {
                    count += 1;
                    sum += v as i128;
                }
            }
            ScanResult { count, sum }
        }
    }
}

/// Pages per morsel: up to 1 MiB, but all workers' morsels together at most a quarter of
/// the pool.
fn morsel_pages(bm: &BufferManager, column: &Column, threads: usize) -> usize {
    let Some(first) = column.pages.first() else { return 1 };
    let page = bm.classes().page_size(first.page_id().class());
    // Not `clamp(page, 1 MiB)`: a column's pages are at most 1 MiB when imported, but a
    // damaged catalog can name a larger class (and clamp panics when min > max).
    let window = (bm.pool_size() / (4 * threads as u64)).min(1 << 20).max(page);
    (window / page).max(1) as usize
}

/// Counts and sums the values of `column` greater than `gt`, with `threads` workers.
///
/// Workers take morsels of pages from a read-ahead stream over the column
/// ([`BufferManager::read_ahead_ring`]): its I/O threads read the pages ahead of the
/// workers with large coalesced reads, several in flight, while they fold the current ones —
/// into a scan ring where rings are on (a page not in memory is folded from the ring's
/// image of it, never loaded into its frame), else into the pages' frames.
pub fn scan_gt(bm: &BufferManager, column: &Column, gt: i128, threads: usize) -> Result<ScanResult> {
    column.check_shape(bm)?;
    let threads = threads.max(1);
    let morsel = morsel_pages(bm, column, threads);
    let pids: Vec<PageId> = column.pages.iter().map(|p| p.page_id()).collect();
    bm.read_ahead_ring(&pids, |stream| {
        let worker = || -> Result<ScanResult> {
            let mut acc = ScanResult::default();
            while let Some(mut m) = stream.claim_morsel(morsel) {
                for pos in m.range() {
                    let page = &column.pages[pos];
                    let n = page.count as usize;
                    let r = match m.ring_page(pos) {
                        Some(data) => fold_page(column.format, data, n, gt),
                        None => fold_page(column.format, bm.fix_shared(page.page_id())?.data(), n, gt),
                    };
                    acc = acc.merge(r);
                }
            }
            Ok(acc)
        };
        if threads == 1 {
            return worker();
        }
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..threads).map(|_| s.spawn(worker)).collect();
            let mut acc = ScanResult::default();
            for h in handles {
                acc = acc.merge(h.join().expect("scan worker panicked")?);
            }
            Ok(acc)
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fold_matches_a_plain_filter_for_every_format() {
        let vals: Vec<u32> = vec![0, 1, 5, u32::MAX, 7, 7];
        let bytes: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
        for gt in [-3i128, 0, 5, 6, u32::MAX as i128, 1 << 40] {
            let want: Vec<u64> = vals.iter().map(|&v| v as u64).filter(|&v| v as i128 > gt).collect();
            let r = fold_page(ValueFormat::U32le, &bytes, vals.len(), gt);
            assert_eq!(r, ScanResult { count: want.len() as u64, sum: want.iter().map(|&v| v as i128).sum() }, "gt {gt}");
        }
        let signed: Vec<i64> = vec![-5, 3, i64::MIN, i64::MAX];
        let bytes: Vec<u8> = signed.iter().flat_map(|v| v.to_le_bytes()).collect();
        let r = fold_page(ValueFormat::I64le, &bytes, 4, -6);
        assert_eq!(r, ScanResult { count: 3, sum: -5 + 3 + i64::MAX as i128 });
        let big: Vec<u64> = vec![u64::MAX, u64::MAX];
        let bytes: Vec<u8> = big.iter().flat_map(|v| v.to_le_bytes()).collect();
        let r = fold_page(ValueFormat::U64le, &bytes, 2, 0);
        assert_eq!(r.sum, 2 * u64::MAX as i128, "sums are exact beyond 2^64");
    }

    /// A column twice the pool, scanned cold with rings on (its pages folded from the
    /// stream's ring, none loaded into a frame) and off, by one and three workers: the same
    /// exact count and sum as a plain filter over the values.
    #[test]
    fn a_cold_column_scan_from_the_ring_gives_the_same_answer_as_one_through_frames() {
        let dir = tempfile::tempdir().unwrap();
        let config = |rings: bool| crate::buffer::Config::new(dir.path().join("db")).min_page(4096).pool_size(4 << 20).scan_rings(rings);
        let values: Vec<u64> = (0..1u64 << 20).map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15) % 1_000_003).collect();
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let mut column = Column::new(ValueFormat::U64le);
        {
            let bm = BufferManager::create(config(true)).unwrap();
            column.append(&bm, &mut &bytes[..], bytes.len() as u64, &mut |_| {}).unwrap();
            bm.close().unwrap();
        }
        let gt = 500_000i128;
        let hits: Vec<u64> = values.iter().copied().filter(|&v| v as i128 > gt).collect();
        let want = ScanResult { count: hits.len() as u64, sum: hits.iter().map(|&v| v as i128).sum() };
        for rings in [true, false] {
            for threads in [1, 3] {
                let bm = BufferManager::open(config(rings)).unwrap();
                assert_eq!(scan_gt(&bm, &column, gt, threads).unwrap(), want, "rings {rings}, {threads} threads");
                let s = bm.stats();
                if rings {
                    // (All of them but on a machine so loaded that a worker waited a
                    // second for an image and fixed the page instead.)
                    let pages = column.pages.len() as u64;
                    assert!(s.ring_hits * 10 >= pages * 9, "{} of {pages} cold pages from the ring: {s:?}", s.ring_hits);
                    assert!(s.misses <= pages - s.ring_hits, "a page from the ring was loaded into a frame too: {s:?}");
                } else {
                    assert_eq!((s.ring_pages, s.ring_hits), (0, 0), "{s:?}");
                }
                bm.check_invariants().unwrap();
                bm.close().unwrap();
            }
        }
    }
}
