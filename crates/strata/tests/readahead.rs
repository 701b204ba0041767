//! Read-ahead streams and the prefetch statistics: every position handed out once, data
//! intact under pools far smaller than the stream, prefetched pages evicted before use
//! counted as wasted, streams dropped half-way leave no latch behind, queue depth and
//! request sizes measured, injected read errors typed — on the default backend (io_uring
//! where the kernel allows it) and on plain pread.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use strata::buffer::{FilePages, ReadAhead};
use strata::storage::{FaultyBackend, FileBackend, PageId, StorageBackend};
use strata::{BufferManager, Config, Error};

const PAGE: u64 = 4096;

fn value(i: u64) -> u64 {
    i.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x55
}

/// A database of `pages` 4 KiB pages (allocated in order, so adjacent on disk): word 0 of
/// page i holds `value(i)`, its last word `!i`.
fn build(dir: &std::path::Path, pages: u64) -> Vec<PageId> {
    let bm = BufferManager::create(Config::new(dir).min_page(PAGE).pool_size(8 << 20)).unwrap();
    let pids = (0..pages)
        .map(|i| {
            let mut g = bm.alloc(4000).unwrap();
            g.write_u64(0, value(i));
            g.write_u64(3984, !i);
            g.pid()
        })
        .collect();
    bm.close().unwrap();
    pids
}

fn check_page(bm: &BufferManager, pids: &[PageId], i: usize) {
    let g = bm.fix_shared(pids[i]).unwrap();
    assert_eq!(u64::from_le_bytes(g.data()[..8].try_into().unwrap()), value(i as u64), "page {}", pids[i]);
    assert_eq!(u64::from_le_bytes(g.data()[3984..3992].try_into().unwrap()), !(i as u64), "page {}", pids[i]);
}

/// The default backend (io_uring where available) and plain pread/pwrite.
fn backends() -> Vec<(&'static str, Arc<dyn StorageBackend>)> {
    vec![("default", strata::buffer::default_backend()), ("posix", Arc::new(FileBackend::default()))]
}

fn open(dir: &std::path::Path, pool: u64, backend: Arc<dyn StorageBackend>) -> BufferManager {
    BufferManager::open(Config::new(dir).pool_size(pool).backend(backend)).unwrap()
}

#[test]
fn four_consumers_get_every_position_once_with_intact_data_in_a_pool_a_tenth_of_the_stream() {
    let dir = tempfile::tempdir().unwrap();
    let pids = build(dir.path(), 2048); // 8 MiB of pages
    for (name, be) in backends() {
        let bm = open(dir.path(), 800 << 10, be);
        let seen = Mutex::new(HashSet::new());
        let stats = bm.read_ahead(&pids[..], |ra| {
            std::thread::scope(|s| {
                for _ in 0..4 {
                    s.spawn(|| {
                        while let Some(r) = ra.claim(7) {
                            for i in r {
                                check_page(&bm, &pids, i);
                                assert!(seen.lock().unwrap().insert(i), "{name}: position {i} handed out twice");
                            }
                        }
                    });
                }
            });
            ra.stats()
        });
        assert_eq!(seen.lock().unwrap().len(), pids.len(), "{name}: every position once");
        let st = bm.stats();
        assert!(st.peak_resident_bytes <= 800 << 10, "{name}: cap kept: {st:?}");
        assert!(stats.pages_loaded > 0 && st.prefetch_hits > 0, "{name}: the I/O thread loaded pages that fixes then used: {stats:?} {st:?}");
        assert!(st.prefetch_hits <= st.pages_prefetched, "{name}: {st:?}");
        bm.check_invariants().unwrap();
    }
}

#[test]
fn a_single_consumer_is_mostly_served_by_the_read_ahead() {
    let dir = tempfile::tempdir().unwrap();
    let pids = build(dir.path(), 1024);
    let bm = open(dir.path(), 2 << 20, strata::buffer::default_backend());
    let rs = bm.read_ahead(&pids[..], |ra| {
        while let Some(r) = ra.claim(4) {
            for i in r {
                check_page(&bm, &pids, i);
            }
        }
        ra.stats()
    });
    let st = bm.stats();
    assert_eq!(st.hits + st.misses, 1024, "{st:?}");
    // The consumer only loads what the I/O thread has not reached; most pages come from it
    // in coalesced requests.
    assert!(st.read_requests < 1024 / 2, "reads were coalesced: {st:?} {rs:?}");
    assert!(rs.depth >= 1 && rs.max_depth_reached <= (2 << 20) / 4 / 4096, "depth bounded by a quarter of the pool: {rs:?}");
}

/// Without any hint: a thread fixing consecutive pages gets windows loaded ahead (fewer,
/// larger reads, the pages fixed as prefetch hits), on both backends and with all three
/// fixes; a thread fixing pages out of order never triggers a window; the switch turns it
/// off.
#[test]
fn sequential_misses_are_detected_and_read_ahead_in_windows() {
    let dir = tempfile::tempdir().unwrap();
    let pids = build(dir.path(), 2048); // 8 MiB of 4 KiB pages
    for (name, be) in backends() {
        for fix in 0..3 {
            let bm = open(dir.path(), 1 << 20, be.clone());
            for i in 0..pids.len() {
                match fix {
                    0 => check_page(&bm, &pids, i),
                    1 => drop(bm.fix_exclusive(pids[i]).unwrap()),
                    _ => assert_eq!(bm.read_optimistic(pids[i], |g| Ok(g.read_u64(0))).unwrap(), value(i as u64)),
                }
            }
            let st = bm.stats();
            assert!(st.sequential_windows > 0 && st.pages_prefetched > 1900, "{name}/{fix}: {st:?}");
            assert!(st.prefetch_hits > 1900 && st.misses < 100, "{name}/{fix}: the pages were fixed as prefetch hits: {st:?}");
            assert!(st.read_requests * 8 < st.pages_read, "{name}/{fix}: coalesced windows: {st:?}");
            assert!(st.peak_resident_bytes <= 1 << 20);
            bm.check_invariants().unwrap();
        }
        // Out of order (a stride that never visits i+1 right after i): no window.
        let bm = open(dir.path(), 1 << 20, be.clone());
        for k in 0..pids.len() {
            check_page(&bm, &pids, (k * 7) % pids.len());
        }
        let st = bm.stats();
        assert_eq!((st.sequential_windows, st.pages_prefetched), (0, 0), "{name}: {st:?}");
        assert_eq!(st.misses, 2048 - st.hits);
    }
    let bm = BufferManager::open(Config::new(dir.path()).pool_size(1 << 20).sequential_readahead(false)).unwrap();
    for i in 0..pids.len() {
        check_page(&bm, &pids, i);
    }
    let st = bm.stats();
    assert_eq!((st.sequential_windows, st.pages_prefetched, st.read_requests), (0, 0, 2048), "switched off: {st:?}");
}

#[test]
fn prefetched_pages_evicted_before_use_count_as_wasted_and_the_data_survives() {
    let dir = tempfile::tempdir().unwrap();
    let pids = build(dir.path(), 512);
    let bm = open(dir.path(), 256 << 10, Arc::new(FileBackend::default()));
    // Prefetch far more than the pool holds: the earlier prefetched pages are evicted
    // (unused) to make room for the later ones.
    assert_eq!(bm.prefetch(&pids[..400]), 400);
    let st = bm.stats();
    assert!(st.prefetch_wasted >= 300, "{st:?}");
    assert_eq!(st.prefetch_hits, 0);
    assert!(st.peak_resident_bytes <= 256 << 10);
    for i in 0..512 {
        check_page(&bm, &pids, i);
    }
    let after = bm.stats();
    assert!(after.prefetch_hits > 0 && after.prefetch_hits + after.prefetch_wasted <= after.pages_prefetched, "{after:?}");
    bm.check_invariants().unwrap();
}

#[test]
fn hits_on_prefetched_pages_are_counted_once_whatever_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let pids = build(dir.path(), 8);
    let bm = open(dir.path(), 1 << 20, Arc::new(FileBackend::default()));
    assert_eq!(bm.prefetch(&pids), 8);
    drop(bm.fix_shared(pids[0]).unwrap());
    drop(bm.fix_shared(pids[0]).unwrap());
    drop(bm.fix_exclusive(pids[1]).unwrap());
    let v = bm.read_optimistic(pids[2], |g| Ok(g.read_u64(0))).unwrap();
    assert_eq!(v, value(2));
    let _ = bm.fix_optimistic(pids[2]).unwrap();
    let st = bm.stats();
    assert_eq!((st.pages_prefetched, st.prefetch_hits, st.hits, st.misses), (8, 3, 5, 0), "{st:?}");
}

#[test]
fn queue_depth_and_request_sizes_are_measured() {
    let dir = tempfile::tempdir().unwrap();
    let pids = build(dir.path(), 256);
    for (name, be) in backends() {
        let bm = open(dir.path(), 4 << 20, be);
        // 32 runs of one page each (every other page), then one run of 64 adjacent pages.
        let scattered: Vec<PageId> = pids[..64].iter().step_by(2).copied().collect();
        assert_eq!(bm.prefetch(&scattered), 32);
        assert_eq!(bm.prefetch(&pids[128..192]), 64);
        check_page(&bm, &pids, 200); // one plain miss
        let io = bm.stats().io;
        let sizes: Vec<(u64, u64)> = io.read_request_bytes.iter().map(|b| (b.le, b.count)).collect();
        assert_eq!(sizes, vec![(4096, 33), (256 << 10, 1)], "{name}: {io:?}");
        let total: u64 = io.read_queue_depth.iter().map(|b| b.count).sum();
        assert_eq!(total, 34, "{name}: {io:?}");
        let deepest = io.read_queue_depth.last().unwrap().le;
        if io.backend == "io_uring" {
            assert_eq!(deepest, 32, "{name}: 32 reads in flight together: {io:?}");
        } else {
            assert_eq!(deepest, 1, "{name}: pread is one at a time: {io:?}");
        }
    }
}

#[test]
fn dropping_a_stream_half_way_stops_its_thread_and_leaves_no_latch() {
    let dir = tempfile::tempdir().unwrap();
    let pids = build(dir.path(), 1024);
    let bm = Arc::new(open(dir.path(), 1 << 20, strata::buffer::default_backend()));
    // Scoped: the consumer stops after a few morsels (as on an error).
    bm.read_ahead(&pids[..], |ra| {
        for _ in 0..3 {
            let r = ra.claim(8).unwrap();
            check_page(&bm, &pids, r.start);
        }
    });
    // Owned: dropped while its I/O thread is busy.
    for _ in 0..20 {
        let ra = ReadAhead::spawn(bm.clone(), Arc::new(FilePages { class: pids[0].class(), first: pids[0].index(), count: 1024 }));
        ra.advance(0..1);
        ra.advance(100..101);
        drop(ra);
    }
    // Nothing is latched: every page can be taken exclusively at once, and the data is intact.
    for (i, &p) in pids.iter().enumerate() {
        drop(bm.fix_exclusive(p).unwrap());
        if i % 97 == 0 {
            check_page(&bm, &pids, i);
        }
    }
    bm.check_invariants().unwrap();
}

#[test]
fn an_injected_read_error_reaches_the_consumer_as_a_typed_error_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let pids = build(dir.path(), 512);
    let faulty = Arc::new(FaultyBackend::new(strata::buffer::default_backend()));
    let bm = open(dir.path(), 512 << 10, faulty.clone());
    faulty.faults.read_errno.store(libc::EIO as u64, Ordering::Relaxed);
    let r = bm.read_ahead(&pids[..], |ra| -> Result<(), Error> {
        while let Some(r) = ra.claim(8) {
            for i in r {
                bm.fix_shared(pids[i])?;
            }
        }
        Ok(())
    });
    assert!(matches!(r, Err(Error::Io { .. })), "{r:?}");
    faulty.faults.read_errno.store(0, Ordering::Relaxed);
    bm.read_ahead(&pids[..], |ra| {
        while let Some(r) = ra.claim(8) {
            for i in r {
                check_page(&bm, &pids, i);
            }
        }
    });
    bm.check_invariants().unwrap();
}

// ---- Ring mode (`read_ahead_ring`, `ReadAhead::spawn_ring`) ----

fn open_rings(dir: &std::path::Path, pool: u64, rings: bool) -> BufferManager {
    BufferManager::open(Config::new(dir).pool_size(pool).scan_rings(rings)).unwrap()
}

fn word0(data: &[u8]) -> u64 {
    u64::from_le_bytes(data[..8].try_into().unwrap())
}

/// Checks one page's payload as the stream handed it out.
fn check_data(data: &[u8], i: usize) {
    assert_eq!(word0(data), value(i as u64), "position {i}");
    assert_eq!(u64::from_le_bytes(data[3984..3992].try_into().unwrap()), !(i as u64), "position {i}");
}

/// A ring-mode stream hands every position out once, from the ring when the page was not
/// in memory (and then without loading its frame) and through a fix when it was; its bytes
/// are charged to the pool with the resident pages, and four consumers see intact data.
#[test]
fn a_ring_stream_hands_out_every_page_from_the_ring_without_loading_its_frame() {
    let dir = tempfile::tempdir().unwrap();
    let pids = build(dir.path(), 2048); // 8 MiB of pages
    let bm = open_rings(dir.path(), 1 << 20, true);
    // Some pages resident before the scan: those go through fix.
    let resident: HashSet<usize> = (0..2048).filter(|i| i % 50 == 7).take(16).collect();
    for &i in &resident {
        drop(bm.fix_shared(pids[i]).unwrap());
    }
    let before = bm.stats();
    let seen = Mutex::new(HashSet::new());
    let from_ring = Mutex::new(Vec::new());
    let fixed_resident = std::sync::atomic::AtomicUsize::new(0);
    bm.read_ahead_ring(&pids[..], |ra| {
        assert!(ra.ring_mode(), "rings are on and a 1 MiB pool has room for one");
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    while let Some(mut m) = ra.claim_morsel(8) {
                        for i in m.range() {
                            assert!(seen.lock().unwrap().insert(i), "position {i} twice");
                            let resident_now = bm.is_resident(pids[i]);
                            match m.ring_page(i) {
                                Some(data) => {
                                    assert!(!resident_now, "position {i}: a resident page's image from the ring");
                                    check_data(data, i);
                                    from_ring.lock().unwrap().push(i);
                                }
                                None => {
                                    check_data(bm.fix_shared(pids[i]).unwrap().data(), i);
                                    if resident_now {
                                        fixed_resident.fetch_add(1, Ordering::Relaxed);
                                    }
                                }
                            }
                            assert!(bm.used_bytes() <= bm.pool_size(), "resident + ring bytes over the pool");
                        }
                    }
                });
            }
        });
    });
    assert_eq!(seen.into_inner().unwrap().len(), 2048);
    let from_ring = from_ring.into_inner().unwrap();
    let after = bm.stats();
    assert!(from_ring.len() >= 1500, "{} of 2048 pages from the ring: {after:?}", from_ring.len());
    assert_eq!(after.ring_hits - before.ring_hits, from_ring.len() as u64);
    // (The pages made resident before may have been evicted for the ring's memory, but
    // not all of them.)
    assert!(fixed_resident.into_inner() > 0, "no resident page was fixed");
    // No frame was loaded for a page served from the ring: the loads are the fixed pages.
    let loaded = after.misses - before.misses;
    assert!(loaded <= (2048 - from_ring.len()) as u64, "{loaded} loads for {} fixed pages", 2048 - from_ring.len());
    bm.check_invariants().unwrap();
}

/// A page changed after the ring read it (before the consumer takes it) is not handed out
/// from the ring: the consumer fixes it and sees the change.
#[test]
fn a_ring_stream_never_hands_out_an_image_older_than_a_change() {
    let dir = tempfile::tempdir().unwrap();
    let pids = build(dir.path(), 512);
    let bm = open_rings(dir.path(), 1 << 20, true);
    bm.read_ahead_ring(&pids[..], |ra| {
        assert!(ra.ring_mode());
        let mut m = ra.claim_morsel(64).unwrap();
        // Position 0 waits for the first batch (positions 0 and 1 among it) to be read.
        check_data(m.ring_page(0).expect("a cold page read into the ring"), 0);
        {
            let mut g = bm.fix_exclusive(pids[1]).unwrap();
            g.write_u64(0, 0xdead_beef);
        }
        assert!(m.ring_page(1).is_none(), "an image older than the page's change was handed out");
        assert_eq!(word0(bm.fix_shared(pids[1]).unwrap().data()), 0xdead_beef);
        let mut hits = 0;
        for i in 2..64 {
            match m.ring_page(i) {
                Some(d) => {
                    check_data(d, i);
                    hits += 1;
                }
                None => check_page(&bm, &pids, i),
            }
        }
        assert!(hits > 0);
    });
    bm.check_invariants().unwrap();
}

/// Consumers that stop early — one gives up a morsel untouched, the scan then stops half
/// way, another stream panics — leave no thread, no stall and nothing charged beyond the
/// ring's kept buffer; the later consumers are still served from the ring.
#[test]
fn a_ring_stream_survives_consumers_that_stop_early_or_panic() {
    let dir = tempfile::tempdir().unwrap();
    let pids = build(dir.path(), 1024);
    let bm = Arc::new(open_rings(dir.path(), 1 << 20, true));
    let hits = bm.read_ahead_ring(&pids[..], |ra| {
        // Given up untouched: its positions go back to the ring, which reads on past them.
        drop(ra.claim_morsel(16).unwrap());
        let mut hits = 0;
        for _ in 0..20 {
            let mut m = ra.claim_morsel(16).unwrap();
            for i in m.range().take(3) {
                match m.ring_page(i) {
                    Some(d) => {
                        check_data(d, i);
                        hits += 1;
                    }
                    None => check_page(&bm, &pids, i),
                }
            }
        }
        hits
    });
    assert!(hits > 30, "{hits} of 60 pages from the ring after an abandoned morsel");
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        bm.read_ahead_ring(&pids[..], |ra| {
            let mut m = ra.claim_morsel(8).unwrap();
            let _ = m.ring_page(0);
            panic!("consumer fails");
        })
    }));
    assert!(r.is_err());
    // Owned streams dropped half way, with their I/O threads busy.
    for _ in 0..10 {
        let ra = ReadAhead::spawn_ring(bm.clone(), Arc::new(FilePages { class: pids[0].class(), first: pids[0].index(), count: 1024 }));
        assert!(ra.ring_mode());
        let mut m = ra.morsel(0..4);
        if let Some(d) = m.ring_page(0) {
            check_data(d, 0);
        }
        drop(m);
        drop(ra);
    }
    // Nothing is latched, the data is intact, the charges add up.
    for (i, &p) in pids.iter().enumerate() {
        drop(bm.fix_exclusive(p).unwrap());
        if i % 97 == 0 {
            check_page(&bm, &pids, i);
        }
    }
    assert!(bm.stats().ring_bytes <= 2 * (128 << 10), "{:?}", bm.stats());
    bm.check_invariants().unwrap();
}

/// With rings off the stream is a plain read-ahead stream: nothing comes from a ring.
#[test]
fn a_ring_stream_with_rings_off_fixes_every_page() {
    let dir = tempfile::tempdir().unwrap();
    let pids = build(dir.path(), 512);
    let bm = open_rings(dir.path(), 1 << 20, false);
    bm.read_ahead_ring(&pids[..], |ra| {
        assert!(!ra.ring_mode());
        while let Some(mut m) = ra.claim_morsel(8) {
            for i in m.range() {
                assert!(m.ring_page(i).is_none());
                check_page(&bm, &pids, i);
            }
        }
    });
    let s = bm.stats();
    assert_eq!((s.ring_pages, s.ring_hits, s.ring_bytes), (0, 0, 0));
    assert!(s.pages_prefetched > 0, "{s:?}");
}

/// Read errors in ring mode: the ring hands nothing out, the consumer's fix returns the
/// typed error; once the device is healthy again every page reads intact.
#[test]
fn a_ring_stream_read_error_reaches_the_consumer_as_a_typed_error() {
    let dir = tempfile::tempdir().unwrap();
    let pids = build(dir.path(), 512);
    let faulty = Arc::new(FaultyBackend::new(strata::buffer::default_backend()));
    let bm = BufferManager::open(Config::new(dir.path()).pool_size(512 << 10).backend(faulty.clone()).scan_rings(true)).unwrap();
    faulty.faults.read_errno.store(libc::EIO as u64, Ordering::Relaxed);
    let r = bm.read_ahead_ring(&pids[..], |ra| -> Result<(), Error> {
        assert!(ra.ring_mode());
        while let Some(mut m) = ra.claim_morsel(8) {
            for i in m.range() {
                assert!(m.ring_page(i).is_none(), "position {i} from the ring although every read fails");
                bm.fix_shared(pids[i])?;
            }
        }
        Ok(())
    });
    assert!(matches!(r, Err(Error::Io { .. })), "{r:?}");
    faulty.faults.read_errno.store(0, Ordering::Relaxed);
    bm.read_ahead_ring(&pids[..], |ra| {
        while let Some(mut m) = ra.claim_morsel(8) {
            for i in m.range() {
                match m.ring_page(i) {
                    Some(d) => check_data(d, i),
                    None => check_page(&bm, &pids, i),
                }
            }
        }
    });
    bm.check_invariants().unwrap();
}

/// Two morsels over the same positions (a misuse, but a safe one): a position whose image
/// one of them holds is not given back when the other is dropped, so the ring reads no
/// other page into its buffer while the image is in use, and a position given back is not
/// handed out again.
#[test]
fn a_held_ring_image_stays_intact_when_another_morsel_gives_its_position_back() {
    let dir = tempfile::tempdir().unwrap();
    let pids = build(dir.path(), 256);
    let bm = open_rings(dir.path(), 1 << 20, true);
    bm.read_ahead_ring(&pids[..], |ra| {
        assert!(ra.ring_mode());
        let mut a = ra.morsel(0..8);
        let image = a.ring_page(0).expect("a cold page read into the ring");
        check_data(image, 0);
        // Gives back 0..8, but 0 is held.
        drop(ra.morsel(0..8));
        // The ring reads on over the positions given back (as far as the held one allows).
        let mut c = ra.morsel(8..24);
        let mut hits = 0;
        for i in 8..24 {
            match c.ring_page(i) {
                Some(d) => {
                    check_data(d, i);
                    hits += 1;
                }
                None => check_page(&bm, &pids, i),
            }
        }
        assert!(hits > 0);
        drop(c);
        // Still page 0's bytes: its buffer was not reused.
        check_data(image, 0);
        let mut again = ra.morsel(0..8);
        assert!(again.ring_page(1).is_none(), "a position given back was handed out again");
        assert!(again.ring_page(2).is_none());
    });
    bm.check_invariants().unwrap();
}

/// Positions nobody takes (a consumer that starts past them, as when a stream is restarted
/// under a consumer) do not stall a ring-mode stream: after a short wait the ring skips
/// them and serves the consumer from the ring.
#[test]
fn a_ring_stream_skips_positions_nobody_takes() {
    let dir = tempfile::tempdir().unwrap();
    let pids = build(dir.path(), 512);
    let bm = open_rings(dir.path(), 1 << 20, true);
    bm.read_ahead_ring(&pids[..], |ra| {
        assert!(ra.ring_mode());
        // The ring has 32 buffers: position 100 is past its first window.
        let mut m = ra.morsel(100..400);
        let mut hits = 0;
        for i in 100..400 {
            match m.ring_page(i) {
                Some(d) => {
                    check_data(d, i);
                    hits += 1;
                }
                None => check_page(&bm, &pids, i),
            }
        }
        assert!(hits >= 250, "{hits} of 300 pages from the ring");
    });
    bm.check_invariants().unwrap();
}
