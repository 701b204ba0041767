//! The contention counters (`Stats::contention`) count real waits: a fix that meets another
//! thread's exclusive latch, an optimistic read that restarts, a reservation that finds
//! every page pinned.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use strata::buffer::Restart;
use strata::{BufferManager, Config, Error};

fn manager(dir: &std::path::Path, pool: u64) -> BufferManager {
    BufferManager::create(Config::new(dir).min_page(4096).pool_size(pool).pin_wait(Duration::from_millis(50))).unwrap()
}

#[test]
fn a_fix_that_meets_an_exclusive_latch_counts_one_wait() {
    let dir = tempfile::tempdir().unwrap();
    let bm = manager(dir.path(), 1 << 20);
    let pid = bm.alloc(100).unwrap().pid();
    assert_eq!(bm.stats().contention.latch_waits, 0);
    let g = bm.fix_exclusive(pid).unwrap();
    let started = AtomicBool::new(false);
    std::thread::scope(|s| {
        let reader = s.spawn(|| {
            started.store(true, Ordering::SeqCst);
            // The writer holds the latch from before this thread started until it sees
            // `started` and a little more: this fix must wait.
            let r = bm.fix_shared(pid).unwrap();
            r.pid()
        });
        while !started.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
        std::thread::sleep(Duration::from_millis(20));
        drop(g);
        assert_eq!(reader.join().unwrap(), pid);
    });
    assert_eq!(bm.stats().contention.latch_waits, 1, "{:?}", bm.stats().contention);
}

#[test]
fn an_optimistic_read_that_restarts_is_counted() {
    let dir = tempfile::tempdir().unwrap();
    let bm = manager(dir.path(), 1 << 20);
    let pid = bm.alloc(100).unwrap().pid();
    let mut tries = 0;
    let v = bm
        .read_optimistic(pid, |g| {
            tries += 1;
            if tries < 3 {
                Err(Restart)
            } else {
                Ok(g.read_u64(0))
            }
        })
        .unwrap();
    assert_eq!(v, 0);
    assert_eq!(bm.stats().contention.optimistic_restarts, 2);
}

#[test]
fn a_reservation_that_finds_everything_pinned_counts_a_wait() {
    let dir = tempfile::tempdir().unwrap();
    let bm = manager(dir.path(), 256 << 10);
    let mut held = Vec::new();
    let err = loop {
        match bm.alloc(4000) {
            Ok(g) => held.push(g),
            Err(e) => break e,
        }
    };
    assert!(matches!(err, Error::OutOfMemory { .. }), "{err:?}");
    assert!(bm.stats().contention.reservation_waits >= 1);
}
