//! Write-back: adjacent dirty pages go to the device as coalesced requests (first writes
//! and double-written overwrites alike), injected write errors are typed and lose nothing,
//! and the background cleaner writes the clock's next victims ahead of it so that evictions
//! stop writing — on the default backend (io_uring where the kernel allows it) and on
//! plain pwrite.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use strata::buffer::{Cleaner, CleanerOptions};
use strata::storage::{FaultyBackend, FileBackend, PageId, StorageBackend};
use strata::{BufferManager, Config, Database, Error};

const PAGE: u64 = 4096;

/// Payload word `at` of a latched page.
fn word(data: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(data[at..at + 8].try_into().unwrap())
}

/// The default backend (io_uring where available) and plain pread/pwrite.
fn backends() -> Vec<(&'static str, Arc<dyn StorageBackend>)> {
    vec![("default", strata::buffer::default_backend()), ("posix", Arc::new(FileBackend::default()))]
}

fn config(dir: &std::path::Path, pool: u64, backend: Arc<dyn StorageBackend>) -> Config {
    Config::new(dir).min_page(PAGE).pool_size(pool).backend(backend)
}

fn value(i: u64, round: u64) -> u64 {
    (i ^ (round << 32)).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

fn write_all(bm: &BufferManager, pids: &[PageId], round: u64) {
    for (i, &pid) in pids.iter().enumerate() {
        let mut g = bm.fix_exclusive(pid).unwrap();
        g.write_u64(0, value(i as u64, round));
        g.write_u64(4000, !value(i as u64, round));
    }
}

fn check_all(bm: &BufferManager, pids: &[PageId], round: u64, what: &str) {
    for (i, &pid) in pids.iter().enumerate() {
        let g = bm.fix_shared(pid).unwrap();
        let v = value(i as u64, round);
        assert_eq!(u64::from_le_bytes(g.data()[..8].try_into().unwrap()), v, "{what}: page {pid}");
        assert_eq!(u64::from_le_bytes(g.data()[4000..4008].try_into().unwrap()), !v, "{what}: page {pid}");
    }
}

/// Requests of more than one page, as counted by the write-size histogram.
fn multi_page_writes(bm: &BufferManager) -> u64 {
    bm.stats().io.write_request_bytes.iter().filter(|b| b.le > PAGE).map(|b| b.count).sum()
}

#[test]
fn adjacent_dirty_pages_are_written_in_coalesced_requests_and_read_back_intact() {
    for (name, be) in backends() {
        let dir = tempfile::tempdir().unwrap();
        let bm = BufferManager::create(config(dir.path(), 4 << 20, be.clone())).unwrap();
        let pids: Vec<PageId> = (0..200).map(|_| bm.alloc(4000).unwrap().pid()).collect();
        write_all(&bm, &pids, 1);
        bm.checkpoint().unwrap();
        let st = bm.stats();
        assert!(st.pages_written >= 200, "{name}: {st:?}");
        // 200 adjacent pages in 1 MiB requests: a handful, not 200.
        assert!(st.write_requests * 20 <= st.pages_written, "{name}: {} requests for {} pages", st.write_requests, st.pages_written);
        assert!(multi_page_writes(&bm) > 0, "{name}: {:?}", st.io);
        assert!(st.io.write_queue_depth.iter().map(|b| b.count).sum::<u64>() == st.write_requests, "{name}: {:?}", st.io);
        bm.close().unwrap();

        // Overwrites of pages with a durable copy go through the double-write area first,
        // then home in coalesced requests.
        let bm = BufferManager::open(config(dir.path(), 4 << 20, be.clone())).unwrap();
        check_all(&bm, &pids, 1, name);
        write_all(&bm, &pids, 2);
        bm.checkpoint().unwrap();
        let st = bm.stats();
        assert!(st.write_requests * 20 <= st.pages_written, "{name}: {} requests for {} pages", st.write_requests, st.pages_written);
        bm.close().unwrap();
        let bm = BufferManager::open(config(dir.path(), 4 << 20, be)).unwrap();
        check_all(&bm, &pids, 2, name);
        bm.check_invariants().unwrap();
    }
}

#[test]
fn a_failed_write_back_is_a_typed_error_and_loses_nothing() {
    for (name, be) in backends() {
        let dir = tempfile::tempdir().unwrap();
        let faulty = Arc::new(FaultyBackend::new(be));
        let bm = BufferManager::create(config(dir.path(), 4 << 20, faulty.clone())).unwrap();
        let pids: Vec<PageId> = (0..64).map(|_| bm.alloc(4000).unwrap().pid()).collect();
        write_all(&bm, &pids, 1);
        faulty.faults.write_errno.store(libc::EIO as u64, Ordering::Relaxed);
        match bm.checkpoint() {
            Err(Error::Io { .. }) => {}
            other => panic!("{name}: a failed page write must be Error::Io, got {other:?}"),
        }
        // The pages are still dirty and intact in memory.
        check_all(&bm, &pids, 1, name);
        faulty.faults.write_errno.store(0, Ordering::Relaxed);
        bm.checkpoint().unwrap();
        bm.close().unwrap();
        let bm = BufferManager::open(config(dir.path(), 4 << 20, Arc::new(FileBackend::default()))).unwrap();
        check_all(&bm, &pids, 1, name);
    }
}

/// One thread updates random pages of a data set four times the pool; with
/// `clean_ahead` called every few operations (as the cleaner thread does, but
/// deterministically), the clock's victims are clean when it reaches them: evictions write
/// far fewer pages themselves, and every page holds its last value throughout.
#[test]
fn cleaning_ahead_of_the_clock_takes_the_writes_off_evictions() {
    let run = |clean: bool| {
        let dir = tempfile::tempdir().unwrap();
        let bm = BufferManager::create(config(dir.path(), 1 << 20, strata::buffer::default_backend())).unwrap();
        let pids: Vec<PageId> = (0..1024).map(|_| bm.alloc(4000).unwrap().pid()).collect();
        let mut last = vec![0u64; pids.len()];
        write_all(&bm, &pids, 0);
        let before = bm.stats();
        let mut x = 0x1234_5678_u64;
        for op in 0..6000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let i = (x % pids.len() as u64) as usize;
            {
                let mut g = bm.fix_exclusive(pids[i]).unwrap();
                assert_eq!(word(g.data(), 0), value(i as u64, last[i]), "page {i} lost its last write");
                last[i] = op + 1;
                g.write_u64(0, value(i as u64, last[i]));
            }
            if clean && op % 8 == 0 {
                bm.clean_ahead(64 << 10).unwrap();
            }
        }
        let st = bm.stats();
        for (i, &pid) in pids.iter().enumerate() {
            assert_eq!(word(bm.fix_shared(pid).unwrap().data(), 0), value(i as u64, last[i]));
        }
        bm.check_invariants().unwrap();
        bm.close().unwrap();
        let bm = BufferManager::open(config(dir.path(), 1 << 20, Arc::new(FileBackend::default()))).unwrap();
        for (i, &pid) in pids.iter().enumerate() {
            assert_eq!(word(bm.fix_shared(pid).unwrap().data(), 0), value(i as u64, last[i]), "after reopen");
        }
        (st.dirty_victims - before.dirty_victims, st.pages_cleaned, st.evictions - before.evictions)
    };
    let (dirty_without, cleaned_without, evictions_without) = run(false);
    let (dirty_with, cleaned_with, evictions_with) = run(true);
    assert_eq!(cleaned_without, 0);
    assert!(evictions_without > 1000 && evictions_with > 1000, "the workload must evict: {evictions_without} / {evictions_with}");
    assert!(dirty_without > evictions_without / 2, "without cleaning most victims are dirty: {dirty_without} of {evictions_without}");
    assert!(cleaned_with > 0);
    assert!(
        dirty_with * 3 < dirty_without,
        "cleaning ahead should take most writes off evictions: {dirty_with} dirty victims with it, {dirty_without} without ({cleaned_with} pages cleaned)"
    );
}

/// With a cleaner attached, dirty pages are its work: an eviction takes clean victims and
/// writes nothing itself while clean ones exist. Shown with writes that fail (the cleaner
/// cannot clean, so dirty pages stay dirty): without a cleaner, evictions keep picking the
/// dirty pages and try to write them; with one, no eviction does, and every read succeeds.
#[test]
fn with_a_cleaner_evictions_take_clean_victims_and_write_nothing() {
    let run = |with_cleaner: bool| {
        let dir = tempfile::tempdir().unwrap();
        let faulty = Arc::new(FaultyBackend::new(Arc::new(FileBackend::default())));
        let bm = Arc::new(BufferManager::create(config(dir.path(), 1 << 20, faulty.clone())).unwrap());
        let pids: Vec<PageId> = (0..1024).map(|_| bm.alloc(4000).unwrap().pid()).collect();
        write_all(&bm, &pids, 0);
        bm.checkpoint().unwrap();
        // A few dirty pages among the resident ones, which no write can clean.
        let dirty: Vec<usize> = (0..pids.len()).step_by(41).collect();
        for &i in &dirty {
            let mut g = bm.fix_exclusive(pids[i]).unwrap();
            g.write_u64(0, value(i as u64, 1));
            g.write_u64(4000, !value(i as u64, 1));
        }
        faulty.faults.write_errno.store(libc::EIO as u64, Ordering::Relaxed);
        let cleaner = with_cleaner
            .then(|| Cleaner::start(bm.clone(), CleanerOptions { target: Some(64 << 10), interval: std::time::Duration::from_secs(3600) }).unwrap());
        let before = bm.stats();
        let mut x = 0x5151_u64;
        for _ in 0..4000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let i = (x % pids.len() as u64) as usize;
            if dirty.contains(&i) {
                continue;
            }
            let g = bm.fix_shared(pids[i]).unwrap();
            assert_eq!(word(g.data(), 0), value(i as u64, 0));
        }
        let st = bm.stats();
        drop(cleaner);
        faulty.faults.write_errno.store(0, Ordering::Relaxed);
        for &i in &dirty {
            assert_eq!(word(bm.fix_shared(pids[i]).unwrap().data(), 0), value(i as u64, 1), "dirty page {i} kept its write");
        }
        bm.check_invariants().unwrap();
        (st.dirty_victims - before.dirty_victims, st.evictions - before.evictions)
    };
    let (dirty_without, evictions_without) = run(false);
    let (dirty_with, evictions_with) = run(true);
    assert!(evictions_without > 1000 && evictions_with > 1000, "the reads must evict: {evictions_without} / {evictions_with}");
    assert!(dirty_without > 0, "without a cleaner the clock picks dirty victims ({evictions_without} evictions)");
    assert_eq!(dirty_with, 0, "with a cleaner, evictions took {dirty_with} dirty victims although clean ones were there");
}

/// The cleaner thread through the database façade (`Config::cleaner`), under four writer
/// threads and a pool an eighth of the data: data intact, invariants kept, the cleaner
/// cleaned pages, and close joins it.
#[test]
fn cleaner_thread_under_concurrent_writers() {
    for (name, be) in backends() {
        let dir = tempfile::tempdir().unwrap();
        let db = Database::create(config(dir.path(), 512 << 10, be).cleaner(CleanerOptions { target: Some(64 << 10), ..Default::default() })).unwrap();
        let bm = db.buffer();
        let pids: Vec<PageId> = (0..1024u64)
            .map(|i| {
                let mut g = bm.alloc(4000).unwrap();
                g.write_u64(0, value(i, 0));
                g.pid()
            })
            .collect();
        std::thread::scope(|s| {
            for t in 0..4u64 {
                let pids = &pids;
                s.spawn(move || {
                    // Each thread owns the pages i with i % 4 == t and counts its writes in
                    // word 1; word 0 is a checksum of word 1.
                    let mut x = 0x9E37 + t;
                    for _ in 0..3000 {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let i = ((x % 256) * 4 + t) as usize;
                        let mut g = bm.fix_exclusive(pids[i]).unwrap();
                        let n = word(g.data(), 8);
                        assert_eq!(word(g.data(), 0), value(i as u64, n), "{name}: page {i} after {n} writes");
                        g.write_u64(8, n + 1);
                        g.write_u64(0, value(i as u64, n + 1));
                    }
                });
            }
        });
        // The cleaner runs on its own thread: give it (bounded) time if the writers finished
        // before it was scheduled; the pool still holds dirty pages the clock has marked.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while db.cleaner_stats().unwrap().pages_cleaned == 0 && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        // The cleaner may still be running: the manager counts a round's pages before the
        // cleaner adds them to its own count, so read the cleaner's first.
        let cs = db.cleaner_stats().unwrap();
        let st = bm.stats();
        assert!(cs.pages_cleaned > 0 && st.pages_cleaned >= cs.pages_cleaned, "{name}: {cs:?} {st:?}");
        assert_eq!(cs.errors, 0);
        assert!(st.peak_resident_bytes <= 512 << 10);
        bm.check_invariants().unwrap();
        let total: u64 = pids.iter().map(|&p| word(bm.fix_shared(p).unwrap().data(), 8)).sum();
        assert_eq!(total, 4 * 3000, "{name}: every write counted once");
        db.close().unwrap();
    }
}

/// A cleaner started on a bare buffer manager stops when dropped and leaves no latch.
#[test]
fn a_dropped_cleaner_is_joined() {
    let dir = tempfile::tempdir().unwrap();
    let bm = Arc::new(BufferManager::create(config(dir.path(), 1 << 20, Arc::new(FileBackend::default()))).unwrap());
    let pids: Vec<PageId> = (0..600).map(|_| bm.alloc(4000).unwrap().pid()).collect();
    let cleaner = Cleaner::start(bm.clone(), CleanerOptions::default()).unwrap();
    write_all(&bm, &pids, 3);
    drop(cleaner);
    check_all(&bm, &pids, 3, "after the cleaner stopped");
    bm.check_invariants().unwrap();
    let bm = Arc::try_unwrap(bm).ok().expect("the cleaner thread released its reference");
    bm.close().unwrap();
}
