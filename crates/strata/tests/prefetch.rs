//! Prefetch: coalesced reads of adjacent pages, skipped pages, corruption, tiny pools.

use std::io::{Seek, SeekFrom, Write};

use strata::{BufferManager, Config, PageId};

fn build(dir: &std::path::Path, pages: u64) -> Vec<PageId> {
    let bm = BufferManager::create(Config::new(dir).min_page(4096).pool_size(4 << 20)).unwrap();
    let pids = (0..pages)
        .map(|i| {
            let mut g = bm.alloc(4000).unwrap();
            g.write_u64(0, i * 31 + 7);
            g.write_u64(3984, !i);
            g.pid()
        })
        .collect();
    bm.close().unwrap();
    pids
}

fn check(bm: &BufferManager, pids: &[PageId]) {
    for (i, &p) in pids.iter().enumerate() {
        let g = bm.fix_shared(p).unwrap();
        let i = i as u64;
        assert_eq!(u64::from_le_bytes(g.data()[..8].try_into().unwrap()), i * 31 + 7, "page {p}");
        assert_eq!(u64::from_le_bytes(g.data()[3984..3992].try_into().unwrap()), !i, "page {p}");
    }
}

#[test]
fn adjacent_pages_are_read_with_one_request_and_then_hit() {
    let dir = tempfile::tempdir().unwrap();
    let pids = build(dir.path(), 200);
    let bm = BufferManager::open(Config::new(dir.path()).pool_size(2 << 20)).unwrap();
    assert_eq!(bm.prefetch(&pids[..64]), 64);
    let st = bm.stats();
    assert_eq!((st.read_requests, st.pages_read, st.pages_prefetched), (1, 64, 64), "{st:?}");
    assert_eq!(bm.prefetch(&pids[..64]), 0, "resident pages are skipped");
    check(&bm, &pids[..64]);
    let st = bm.stats();
    assert_eq!((st.misses, st.read_requests), (0, 1), "every fix hit a prefetched page");
    bm.check_invariants().unwrap();
    // A gap splits the run: pages 100..110 and 120..130 take two requests.
    let gapped: Vec<PageId> = pids[100..110].iter().chain(&pids[120..130]).copied().collect();
    assert_eq!(bm.prefetch(&gapped), 20);
    assert_eq!(bm.stats().read_requests, 3);
}

#[test]
fn a_pool_too_small_for_the_prefetch_evicts_prefetched_pages_first_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let pids = build(dir.path(), 400);
    let bm = BufferManager::open(Config::new(dir.path()).pool_size(256 << 10)).unwrap();
    // Pin a few pages; prefetch far more than the pool can hold.
    let pinned: Vec<_> = pids[390..395].iter().map(|&p| bm.fix_shared(p).unwrap()).collect();
    let loaded = bm.prefetch(&pids[..390]);
    assert_eq!(loaded, 390, "every run fits a quarter of the pool");
    assert!(bm.used_bytes() <= 256 << 10);
    assert!(bm.stats().evictions >= 300, "earlier prefetched pages made room for later ones: {:?}", bm.stats());
    assert!(bm.stats().read_requests < 390 / 4, "coalesced: {:?}", bm.stats());
    drop(pinned);
    check(&bm, &pids);
    assert!(bm.peak_bytes() <= 256 << 10);
    bm.check_invariants().unwrap();
}

#[test]
fn corrupt_or_missing_pages_are_skipped_and_reported_by_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let pids = build(dir.path(), 32);
    let file = dir.path().join(format!("class-{:02}.pages", pids[0].class()));
    let mut f = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
    f.seek(SeekFrom::Start(pids[5].index() * 4096 + 100)).unwrap();
    f.write_all(b"garbage").unwrap();
    // Cut the last two pages off the file.
    f.set_len(pids[30].index() * 4096).unwrap();
    drop(f);
    let bm = BufferManager::open(Config::new(dir.path()).pool_size(1 << 20)).unwrap();
    assert_eq!(bm.prefetch(&pids), 29, "the corrupt page and the two cut off are skipped");
    check(&bm, &pids[..5]);
    for (i, &pid) in pids.iter().enumerate().take(30).skip(6) {
        let g = bm.fix_shared(pid).unwrap();
        assert_eq!(u64::from_le_bytes(g.data()[..8].try_into().unwrap()), i as u64 * 31 + 7);
    }
    let e = bm.fix_shared(pids[5]).err().expect("corrupt page");
    assert!(matches!(e, strata::Error::Corruption { .. }), "{e}");
    let e = bm.fix_shared(pids[31]).err().expect("truncated page");
    assert!(e.to_string().contains("truncated"), "{e}");
    bm.check_invariants().unwrap();
}

#[test]
fn prefetch_ignores_bad_ids() {
    let dir = tempfile::tempdir().unwrap();
    let pids = build(dir.path(), 8);
    let bm = BufferManager::open(Config::new(dir.path()).pool_size(1 << 20)).unwrap();
    bm.free(pids[3]).unwrap();
    let bogus = [PageId::new(9, false, 0), PageId::new(pids[0].class(), false, 1 << 40)];
    assert_eq!(bm.prefetch(&bogus), 0);
    assert_eq!(bm.prefetch(&pids), 7, "the freed page is skipped");
    bm.check_invariants().unwrap();
}
