//! Correctness of the baselines (and of strata behind the same trait): every engine returns
//! the right bytes for every page, by single reads, pinned groups and scans, from several
//! threads; the hash-table pools never hold more frames than configured, fail cleanly when
//! asked to pin more, and write dirty pages back.

use std::sync::atomic::{AtomicBool, Ordering};

use strata_bench::dataset::{DataFile, DataSet, FileSpec};
use strata_bench::engines::{HashPool, MmapStore, RawStore, StaticSplit, StrataStore};
use strata_bench::workload::{fill_payload, Rng};
use strata_bench::{Page, PageStore};

const SMALL: u64 = 4096;
const LARGE: u64 = 64 << 10;

fn dataset(dir: &std::path::Path) -> DataSet {
    DataSet::build(&dir.join("db"), SMALL, &[FileSpec { page_size: SMALL, pages: 96 }, FileSpec { page_size: LARGE, pages: 12 }]).unwrap()
}

fn expected(file: u16, index: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    fill_payload(file, index, &mut v);
    v
}

/// Reads every page of `files` (the ones `store` serves) one by one, in random order, in
/// pinned groups, and by scans, checking every byte.
fn check_store(store: &dyn PageStore, files: &[(u16, &DataFile)]) {
    for &(k, f) in files {
        let len = f.payload_len();
        assert_eq!(store.page_size(k), f.page_size);
        for i in 0..f.pages {
            let mut got = Vec::new();
            store.read(Page::new(k, i), &mut |d| got = d.to_vec()).unwrap();
            assert_eq!(got, expected(k, i, len), "{}: file {k} page {i}", store.name());
        }
        let mut rng = Rng::new(k as u64);
        for _ in 0..3 * f.pages {
            let i = rng.below(f.pages);
            store.read(Page::new(k, i), &mut |d| assert!(d == expected(k, i, len).as_slice(), "{}: file {k} page {i} (random)", store.name())).unwrap();
        }
        let group: Vec<Page> = (0..f.pages.min(3)).map(|i| Page::new(k, f.pages - 1 - i)).collect();
        let mut seen = 0;
        store
            .read_pinned(&group, &mut |j, d| {
                assert_eq!(d, expected(k, group[j].index, len).as_slice(), "{}: pinned group", store.name());
                seen += 1;
            })
            .unwrap();
        assert_eq!(seen, group.len());
        for range in [0..f.pages, 1..f.pages - 1, 5..6] {
            let mut next = range.start;
            store
                .scan(k, range.clone(), &mut |i, d| {
                    assert_eq!(i, next, "{}: scan order", store.name());
                    assert_eq!(d, expected(k, i, len).as_slice(), "{}: scan page {i}", store.name());
                    next += 1;
                })
                .unwrap();
            assert_eq!(next, range.end, "{}: scan length", store.name());
        }
        assert!(store.read(Page::new(k, f.pages), &mut |_| {}).is_err(), "{}: page past the end must fail", store.name());
    }
}

#[test]
fn every_engine_returns_the_right_bytes() {
    let t = tempfile::tempdir().unwrap();
    let ds = dataset(t.path());
    let both: Vec<(u16, &DataFile)> = ds.files.iter().enumerate().map(|(k, f)| (k as u16, f)).collect();

    // Pools smaller than the data, so that reads also evict.
    let strata = StrataStore::open(&ds, 512 << 10).unwrap();
    check_store(&strata, &both);
    drop(strata);

    let small = HashPool::open(&ds.files, SMALL as usize, 16 * (SMALL + 200), false).unwrap();
    assert!(small.capacity() < 96);
    check_store(&small, &both[..1]);
    assert!(small.read(Page::new(1, 0), &mut |_| {}).is_err(), "a 4 KiB pool serves no 64 KiB file");
    let large = HashPool::open(&ds.files, LARGE as usize, 5 * (LARGE + 200), false).unwrap();
    check_store(&large, &both[1..]);

    let split = StaticSplit::open(&ds.files, 1 << 20, SMALL as usize, LARGE as usize, 0.75).unwrap();
    check_store(&split, &both);

    let raw = RawStore::open(&ds.files, 3 * LARGE as usize + 5).unwrap();
    check_store(&raw, &both);

    // SAFETY: the data set lives in this test's temporary directory; nothing writes it while
    // it is mapped.
    let mmap = unsafe { MmapStore::open(&ds.files, true) }.unwrap();
    check_store(&mmap, &both);
    assert!(mmap.resident_bytes() > 0);
}

#[test]
fn engines_agree_under_concurrent_readers() {
    let t = tempfile::tempdir().unwrap();
    let ds = dataset(t.path());
    let strata = StrataStore::open(&ds, 256 << 10).unwrap();
    // Few frames for many pages and threads: loads race for frames and for the same page.
    let pool = HashPool::open(&ds.files, SMALL as usize, 6 * (SMALL + 200), false).unwrap();
    let split = StaticSplit::open(&ds.files, 600 << 10, SMALL as usize, LARGE as usize, 0.5).unwrap();
    let stores: [(&dyn PageStore, &[u16]); 3] = [(&strata, &[0, 1]), (&pool, &[0]), (&split, &[0, 1])];
    let ds = &ds;
    for (store, files) in stores {
        std::thread::scope(|s| {
            for t in 0..4u64 {
                s.spawn(move || {
                    let mut rng = Rng::new(100 + t);
                    for _ in 0..3000 {
                        let k = files[rng.below(files.len() as u64) as usize];
                        let f = &ds.files[k as usize];
                        // Skewed: half the reads go to 4 pages, so threads often want the same one.
                        let i = if rng.below(2) == 0 { rng.below(4) } else { rng.below(f.pages) };
                        let want = expected(k, i, f.payload_len());
                        store.read(Page::new(k, i), &mut |d| assert!(d == want.as_slice(), "{}: file {k} page {i}", store.name())).unwrap();
                    }
                });
            }
        });
    }
    assert_eq!(pool.pinned_frames(), 0, "every pin released");
    assert!(pool.mapped_pages() <= pool.capacity());
}

#[test]
fn hashpool_never_holds_more_frames_than_configured() {
    let t = tempfile::tempdir().unwrap();
    let ds = dataset(t.path());
    let budget = 10 * (SMALL + 200);
    let pool = HashPool::open(&ds.files, SMALL as usize, budget, false).unwrap();
    let cap = pool.capacity();
    assert_eq!(cap as u64, HashPool::frames_for(budget, SMALL as usize));
    assert!(cap >= 2 && (cap as u64) * SMALL <= budget, "{cap} frames of {SMALL} in {budget} bytes");
    let described = pool.describe();
    assert_eq!(described["frames"].as_u64(), Some(cap as u64));

    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        // A watcher checks the bound while three readers churn through 96 pages.
        s.spawn(|| {
            while !done.load(Ordering::Relaxed) {
                assert!(pool.mapped_pages() <= cap);
                assert!(pool.pinned_frames() <= cap);
                std::thread::yield_now();
            }
        });
        let readers: Vec<_> = (0..3u64)
            .map(|t| {
                let pool = &pool;
                s.spawn(move || {
                    let mut rng = Rng::new(7 + t);
                    for _ in 0..2000 {
                        let i = rng.below(96);
                        pool.read(Page::new(0, i), &mut |d| assert_eq!(d[..8], i.to_le_bytes())).unwrap();
                    }
                })
            })
            .collect();
        for r in readers {
            r.join().unwrap();
        }
        done.store(true, Ordering::Relaxed);
    });
    assert_eq!(pool.mapped_pages(), cap, "after churning, every frame holds a page");

    // Pinning as many pages as there are frames works; one more fails cleanly and releases
    // what it had pinned.
    let group: Vec<Page> = (0..cap as u64).map(|i| Page::new(0, 50 + i)).collect();
    pool.read_pinned(&group, &mut |_, _| {}).unwrap();
    let too_many: Vec<Page> = (0..cap as u64 + 1).map(|i| Page::new(0, i)).collect();
    let err = pool.read_pinned(&too_many, &mut |_, _| {}).unwrap_err();
    assert!(err.0.contains("no unpinned frame"), "{err}");
    assert_eq!(pool.pinned_frames(), 0);
    assert!(pool.mapped_pages() <= cap);
    // And the pool still works.
    pool.read(Page::new(0, 3), &mut |d| assert_eq!(d, expected(0, 3, 4096 - 32).as_slice())).unwrap();
}

#[test]
fn static_split_honours_its_split_where_strata_shares_one_budget() {
    let t = tempfile::tempdir().unwrap();
    let ds = dataset(t.path());
    let budget: u64 = 1 << 20;
    let split = StaticSplit::open(&ds.files, budget, SMALL as usize, LARGE as usize, 0.75).unwrap();
    let (small, large) = split.pools();
    assert_eq!(small.capacity() as u64, HashPool::frames_for(budget * 3 / 4, SMALL as usize));
    assert_eq!(large.capacity() as u64, HashPool::frames_for(budget / 4, LARGE as usize));
    assert!(small.capacity() as u64 * SMALL + large.capacity() as u64 * LARGE <= budget);

    // Read everything: each pool stays within its own frames.
    for k in 0..2u16 {
        for i in 0..ds.files[k as usize].pages {
            split.read(Page::new(k, i), &mut |_| {}).unwrap();
            assert!(small.mapped_pages() <= small.capacity() && large.mapped_pages() <= large.capacity());
        }
    }
    // Holding 6 large pages (384 KiB of a 1 MiB budget) is more than the large pool's
    // quarter can hold, although the small pool sits idle; strata holds them in its one
    // budget.
    let group: Vec<Page> = (0..6).map(|i| Page::new(1, i)).collect();
    assert!(large.capacity() < 6);
    let err = split.read_pinned(&group, &mut |_, _| {}).unwrap_err();
    assert!(err.0.contains("no unpinned frame"), "{err}");
    assert_eq!(large.pinned_frames(), 0);
    let strata = StrataStore::open(&ds, budget).unwrap();
    let mut n = 0;
    strata
        .read_pinned(&group, &mut |j, d| {
            assert_eq!(d, expected(1, group[j].index, LARGE as usize - 32).as_slice());
            n += 1;
        })
        .unwrap();
    assert_eq!(n, 6);
    // A split whose share cannot hold a single frame is refused up front.
    assert!(StaticSplit::open(&ds.files, 200 << 10, SMALL as usize, LARGE as usize, 0.75).is_err());
}

#[test]
fn hashpool_writes_dirty_pages_back_on_eviction() {
    let t = tempfile::tempdir().unwrap();
    // A plain file of 4 KiB pages (no strata header): payload_offset 0.
    let path = t.path().join("plain.pages");
    let pages = 8u64;
    let mut bytes = vec![0u8; (pages * SMALL) as usize];
    for i in 0..pages {
        fill_payload(0, i, &mut bytes[(i * SMALL) as usize..((i + 1) * SMALL) as usize]);
    }
    std::fs::write(&path, &bytes).unwrap();
    let file = DataFile { path: path.clone(), page_size: SMALL as usize, pages, class: 0, payload_offset: 0 };
    let budget = 2 * (SMALL + 300);
    let pool = HashPool::open(std::slice::from_ref(&file), SMALL as usize, budget, true).unwrap();
    assert_eq!(pool.capacity(), 2);
    pool.write(Page::new(0, 1), &mut |d| d[8..16].copy_from_slice(&0xABCD_u64.to_le_bytes())).unwrap();
    // Evict it by reading the other pages.
    for i in 2..pages {
        pool.read(Page::new(0, i), &mut |_| {}).unwrap();
    }
    assert_eq!(pool.pages_written(), 1);
    pool.read(Page::new(0, 1), &mut |d| assert_eq!(d[8..16], 0xABCD_u64.to_le_bytes())).unwrap();
    let on_disk = std::fs::read(&path).unwrap();
    assert_eq!(on_disk[4096 + 8..4096 + 16], 0xABCD_u64.to_le_bytes());
    assert_eq!(on_disk[..4096], expected(0, 0, 4096)[..], "other pages untouched");

    let ro = HashPool::open(std::slice::from_ref(&file), SMALL as usize, budget, false).unwrap();
    assert!(ro.write(Page::new(0, 0), &mut |_| {}).is_err(), "a read-only pool refuses writes");
}

/// `read_batch` hands out, for index `i` of the batch, exactly the bytes `read` gives for
/// `pages[i]`: batches of random pages of both files (duplicates included, mixed files, the
/// same page twice in a row), against every engine's own `read` and the expected payload.
#[test]
fn read_batch_returns_what_read_returns() {
    let t = tempfile::tempdir().unwrap();
    let ds = dataset(t.path());
    // strata's pool is smaller than the data, so that batches load and evict.
    let strata = StrataStore::open(&ds, 512 << 10).unwrap();
    let raw = RawStore::open(&ds.files, 1 << 20).unwrap();
    let hashpool = HashPool::open(&ds.files, SMALL as usize, 16 * (SMALL + 200), false).unwrap();
    let stores: [(&dyn PageStore, &[u16]); 3] = [(&strata, &[0, 1]), (&raw, &[0, 1]), (&hashpool, &[0])];
    for (store, files) in stores {
        let mut rng = Rng::new(0xBA7C);
        for round in 0..40 {
            let len = 1 + rng.below(if round % 2 == 0 { 8 } else { 70 }) as usize; // up to 70 > a ring's 64 entries
            let mut batch: Vec<Page> = Vec::with_capacity(len + 2);
            for _ in 0..len {
                let k = files[rng.below(files.len() as u64) as usize];
                batch.push(Page::new(k, rng.below(ds.files[k as usize].pages)));
            }
            // Duplicates: a page again later, and one twice in a row.
            batch.push(batch[0]);
            let last = *batch.last().unwrap();
            batch.push(last);
            let mut by_read = Vec::new();
            for &p in &batch {
                let mut got = Vec::new();
                store.read(p, &mut |d| got = d.to_vec()).unwrap();
                assert_eq!(got, expected(p.file, p.index, ds.files[p.file as usize].payload_len()), "{}: read {p:?}", store.name());
                by_read.push(got);
            }
            let mut seen = vec![0u32; batch.len()];
            store
                .read_batch(&batch, &mut |i, d| {
                    seen[i] += 1;
                    assert!(d == by_read[i].as_slice(), "{}: read_batch index {i} ({:?}) differs from read", store.name(), batch[i]);
                })
                .unwrap();
            assert!(seen.iter().all(|&n| n == 1), "{}: every index exactly once: {seen:?}", store.name());
        }
        // An empty batch does nothing; a page past the end fails the batch.
        store.read_batch(&[], &mut |_, _| panic!("an empty batch has no page")).unwrap();
        let bad = [Page::new(0, 1), Page::new(0, ds.files[0].pages)];
        assert!(store.read_batch(&bad, &mut |_, _| {}).is_err(), "{}: a page past the end must fail", store.name());
    }
    // raw says how its batches reach the device, and counted every page of them.
    let d = raw.describe();
    assert!(d["batch_io_uring"].is_boolean(), "{d:?}");
    assert_eq!(d["batch_io_uring"].as_bool() == Some(false), d.contains_key("batch_io_uring_fallback"), "{d:?}");
    assert!(d["batch_ring_calls"].as_u64().unwrap() + d["batch_posix_calls"].as_u64().unwrap() > 0, "{d:?}");
}

/// strata's scans as the scan benchmark runs them (two threads taking morsels from a shared
/// cursor, one stream per pass): with scan rings on, the pages not in memory come from the
/// stream's ring (`ring_hits` in the engine's figures) and every byte is right; with rings
/// off, nothing comes from a ring.
#[test]
fn strata_scans_take_cold_pages_from_the_stream_ring_where_rings_are_on() {
    let t = tempfile::tempdir().unwrap();
    let ds = dataset(t.path());
    let f = &ds.files[0];
    for rings in [true, false] {
        let strata = StrataStore::open_with_rings(&ds, 512 << 10, rings).unwrap();
        for _pass in 0..2 {
            let cursor = std::sync::atomic::AtomicU64::new(0);
            std::thread::scope(|s| {
                for _ in 0..2 {
                    s.spawn(|| loop {
                        let first = cursor.fetch_add(8, Ordering::Relaxed);
                        if first >= f.pages {
                            break;
                        }
                        let range = first..(first + 8).min(f.pages);
                        let mut next = range.start;
                        strata
                            .scan(0, range.clone(), &mut |i, d| {
                                assert_eq!(i, next);
                                assert_eq!(d, expected(0, i, f.payload_len()).as_slice(), "rings {rings}: page {i}");
                                next += 1;
                            })
                            .unwrap();
                        assert_eq!(next, range.end);
                    });
                }
            });
        }
        let d = strata.describe();
        assert_eq!(d["scan_rings"], rings);
        let hits = d["ring_hits"].as_u64().unwrap();
        if rings {
            // (Two passes of 96 pages, none of them loaded into a frame before.)
            assert!(hits >= 150, "{hits} of 192 pages from the ring: {d:?}");
        } else {
            assert_eq!(hits, 0);
        }
    }
}
