//! Transactions through the public API: commit, rollback, allocation and free, steal under a
//! pool far smaller than the working set, concurrent transfers, durability across reopen,
//! recovery of uncommitted work, and a disk that fills up during commit.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use strata::ops::torture::{self, Bank, Outcome, Rng};
use strata::storage::{atomic_write_temp, FaultyBackend, FileBackend, PageId};
use strata::{Config, Database, Error};

fn config(dir: &std::path::Path, pool: u64) -> Config {
    Config::new(dir).pool_size(pool).min_page(4096)
}

#[test]
fn commit_is_durable_and_abort_leaves_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("db");
    let db = Database::create(config(&dir, 1 << 20)).unwrap();
    let mut tx = db.begin();
    let a = tx.alloc(100).unwrap();
    let b = tx.alloc(50_000).unwrap();
    assert_ne!(a.class(), b.class(), "two size classes in one transaction");
    tx.write_u64(a, 0, 11).unwrap();
    tx.write(b, 40_000, b"hello").unwrap();
    tx.commit().unwrap();

    let mut tx = db.begin();
    tx.write_u64(a, 0, 99).unwrap();
    let c = tx.alloc(10).unwrap();
    tx.free(b).unwrap();
    tx.abort().unwrap();
    assert!(!db.buffer().is_allocated(c), "rolled-back allocation is freed");
    assert!(db.buffer().is_allocated(b), "rolled-back free never happened");
    let mut tx = db.begin();
    assert_eq!(tx.read_u64(a, 0).unwrap(), 11);
    tx.commit().unwrap();

    // Dropping without close: no checkpoint beyond what Drop does; the log carries it anyway.
    drop(db);
    let db = Database::open(config(&dir, 1 << 20)).unwrap();
    let mut tx = db.begin();
    assert_eq!(tx.read_u64(a, 0).unwrap(), 11);
    let mut buf = [0u8; 5];
    tx.read(b, 40_000, &mut buf).unwrap();
    assert_eq!(&buf, b"hello");
    tx.free(b).unwrap();
    tx.commit().unwrap();
    assert!(!db.buffer().is_allocated(b));
    db.close().unwrap();
    let db = Database::open(config(&dir, 1 << 20)).unwrap();
    assert!(!db.buffer().is_allocated(b), "committed free survives reopen");
    assert_eq!(db.buffer().allocated_pages(), vec![a]);
}

/// Simulates a crash: the process dies with dirty pages in memory and uncommitted changes,
/// by leaking the database (no checkpoint, no rollback, nothing written at "death"; the
/// directory lock is released, as at a process's death).
fn crash(db: Database) {
    db.crash();
}

#[test]
fn recovery_redoes_committed_and_undoes_uncommitted_work() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("db");
    // 96 KiB of pool for 40 pages of 4..64 KiB: most changes are evicted (stolen) before
    // commit, so recovery has to undo changes that reached the data files.
    let db = Database::create(config(&dir, 160 << 10)).unwrap();
    let mut pages = Vec::new();
    let mut tx = db.begin();
    for i in 0..40u64 {
        let pid = tx.alloc(4000 << (i % 5)).unwrap();
        tx.write_u64(pid, 0, i).unwrap();
        pages.push(pid);
    }
    tx.commit().unwrap();
    db.checkpoint().unwrap();
    let mut tx = db.begin();
    for (i, &pid) in pages.iter().enumerate() {
        tx.write_u64(pid, 8, 1000 + i as u64).unwrap();
    }
    tx.commit().unwrap();
    // A loser that touches every page and allocates some, while a small pool steals them.
    let mut loser = db.begin();
    for &pid in &pages {
        loser.write_u64(pid, 0, 0xdead).unwrap();
        loser.write_u64(pid, 8, 0xbeef).unwrap();
    }
    let extra = loser.alloc(30_000).unwrap();
    loser.write_u64(extra, 0, 7).unwrap();
    loser.free(pages[3]).unwrap();
    assert!(db.buffer().stats().pages_written > 0, "the pool is small enough to steal");
    std::mem::forget(loser);
    crash(db);

    for round in 0..2 {
        let db = Database::open(config(&dir, 160 << 10)).unwrap();
        let mut tx = db.begin();
        for (i, &pid) in pages.iter().enumerate() {
            assert_eq!(tx.read_u64(pid, 0).unwrap(), i as u64, "round {round} page {pid}");
            assert_eq!(tx.read_u64(pid, 8).unwrap(), 1000 + i as u64, "round {round} page {pid}");
        }
        tx.commit().unwrap();
        assert!(!db.buffer().is_allocated(extra), "the loser's allocation is undone");
        assert_eq!(db.buffer().allocated_pages().len(), 40);
        db.buffer().check_invariants().unwrap();
        crash(db);
    }
}

/// Threads run transactions that lock a few random pages in random order (reading each,
/// then moving money between them and counting the visit), with a lock wait far longer
/// than the test: the deadlocks this makes are refused at once with `Error::Deadlock`, whose
/// victim rolls back and retries. At the end no money was made or lost, every committed
/// visit is counted exactly once, deadlocks did happen, and no wait timed out (without
/// detection each deadlock would stall for the whole wait).
#[test]
fn random_order_writers_detect_deadlocks_and_conserve_money() {
    const PAGES: usize = 6;
    const THREADS: u64 = 4;
    const TXS: u64 = 60;
    const TOUCH: usize = 3;
    const INITIAL: u64 = 1_000_000;
    let tmp = tempfile::tempdir().unwrap();
    let db = Database::create(config(&tmp.path().join("db"), 1 << 20)).unwrap();
    let mut tx = db.begin();
    let pages: Vec<PageId> = (0..PAGES).map(|_| tx.alloc(16).unwrap()).collect();
    for &p in &pages {
        tx.write_u64(p, 0, INITIAL).unwrap();
    }
    tx.commit().unwrap();
    let (deadlocks, timeouts, visits) = (AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0));
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (db, pages, deadlocks, timeouts, visits) = (&db, &pages, &deadlocks, &timeouts, &visits);
            s.spawn(move || {
                let mut rng = Rng(t * 7919 + 3);
                for _ in 0..TXS {
                    // Distinct pages in random order (a partial Fisher-Yates shuffle).
                    let mut order: Vec<usize> = (0..PAGES).collect();
                    for i in 0..TOUCH {
                        let j = i + rng.below((PAGES - i) as u64) as usize;
                        order.swap(i, j);
                    }
                    let amount = rng.below(100);
                    loop {
                        let mut tx = db.begin();
                        tx.set_lock_wait(Duration::from_secs(20));
                        let me = tx.id();
                        let r = (|| {
                            let mut money = Vec::new();
                            for &i in &order[..TOUCH] {
                                money.push(tx.read_u64(pages[i], 0)?);
                                // Widen the window in which another transaction takes the next page.
                                std::thread::sleep(Duration::from_micros(200));
                            }
                            for (k, &i) in order[..TOUCH].iter().enumerate() {
                                let v = if k == 0 {
                                    money[k] - amount
                                } else if k == 1 {
                                    money[k] + amount
                                } else {
                                    money[k]
                                };
                                tx.write_u64(pages[i], 0, v)?;
                                let seen = tx.read_u64(pages[i], 8)?;
                                tx.write_u64(pages[i], 8, seen + 1)?;
                            }
                            Ok::<_, Error>(())
                        })();
                        match r {
                            Ok(()) => {
                                tx.commit().unwrap();
                                visits.fetch_add(TOUCH as u64, Ordering::Relaxed);
                                break;
                            }
                            Err(Error::Deadlock { txid, cycle, .. }) => {
                                assert_eq!((txid, cycle[0]), (me, me), "the victim is the requester");
                                assert!(cycle.len() >= 2, "{cycle:?}");
                                deadlocks.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(e @ Error::LockTimeout { .. }) => {
                                assert!(e.is_lock_conflict());
                                timeouts.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(e) => panic!("{e}"),
                        }
                        // The victim rolls back (the drop) and retries.
                        drop(tx);
                    }
                }
            });
        }
    });
    assert!(db.locks().is_empty(), "every transaction released its locks");
    let mut tx = db.begin();
    let (mut money, mut seen) = (0, 0);
    for &p in &pages {
        money += tx.read_u64(p, 0).unwrap();
        seen += tx.read_u64(p, 8).unwrap();
    }
    tx.commit().unwrap();
    assert_eq!(money, INITIAL * PAGES as u64, "money was made or lost");
    assert_eq!(seen, visits.load(Ordering::Relaxed), "a committed visit was lost or counted twice");
    assert_eq!(seen, THREADS * TXS * TOUCH as u64);
    assert_eq!(timeouts.load(Ordering::Relaxed), 0, "a lock wait timed out");
    assert!(deadlocks.load(Ordering::Relaxed) > 0, "no deadlock was detected: the test did not contend");
    db.close().unwrap();
}

#[test]
fn concurrent_transfers_conserve_money_across_reopen() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("db");
    let threads = 4;
    let db = Database::create(config(&dir, 512 << 10)).unwrap();
    let bank = Bank::setup(db.buffer(), db.locks(), 600, 1000, threads).unwrap();
    let seq = AtomicU64::new(0);
    let committed = AtomicU64::new(0);
    std::thread::scope(|s| {
        for t in 0..threads as usize {
            let (db, bank, seq, committed) = (&db, &bank, &seq, &committed);
            s.spawn(move || {
                let mut rng = Rng(t as u64 * 7919 + 1);
                for _ in 0..150 {
                    match torture::transfer(db.buffer(), db.locks(), bank, t, &mut rng, seq, Duration::from_millis(200)).unwrap() {
                        Outcome::Committed(_) => {
                            committed.fetch_add(1, Ordering::Relaxed);
                        }
                        Outcome::Aborted | Outcome::Conflict => {}
                    }
                }
            });
        }
    });
    let v = torture::verify(db.buffer(), db.locks()).unwrap();
    assert!(v.ok, "{v:?}");
    assert_eq!(v.last_committed, seq.load(Ordering::Relaxed));
    assert!(db.locks().is_empty(), "every transaction released its locks");
    let last = v.last_committed;
    crash(db);
    let db = Database::open(config(&dir, 512 << 10)).unwrap();
    let v = torture::verify(db.buffer(), db.locks()).unwrap();
    assert!(v.ok, "{v:?}");
    assert_eq!(v.last_committed, last, "every acknowledged commit survived the crash");
    db.close().unwrap();
}

#[test]
fn disk_full_during_commit_fails_cleanly_and_the_database_reopens() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("db");
    let faulty = Arc::new(FaultyBackend::new(Arc::new(FileBackend::default())));
    let db = Database::create(config(&dir, 1 << 20).backend(faulty.clone())).unwrap();
    let mut tx = db.begin();
    let a = tx.alloc(100).unwrap();
    tx.write_u64(a, 0, 1).unwrap();
    tx.commit().unwrap();
    let mut tx = db.begin();
    tx.write_u64(a, 0, 2).unwrap();
    faulty.faults.write_errno.store(libc::ENOSPC as u64, Ordering::Relaxed);
    let err = tx.commit().unwrap_err();
    assert!(matches!(err, Error::DiskFull { .. }), "{err}");
    // The log refuses further work instead of risking a commit after a lost write.
    let mut tx = db.begin();
    let err = tx.write_u64(a, 0, 3).unwrap_err();
    assert!(matches!(err, Error::LogFailed(_)), "{err}");
    drop(tx);
    faulty.faults.write_errno.store(0, Ordering::Relaxed);
    assert!(db.close().is_err(), "close cannot claim durability after the failure");
    let db = Database::open(config(&dir, 1 << 20)).unwrap();
    let mut tx = db.begin();
    assert_eq!(tx.read_u64(a, 0).unwrap(), 1, "the failed commit left no trace");
    tx.write_u64(a, 0, 4).unwrap();
    tx.commit().unwrap();
    db.close().unwrap();
}

#[test]
fn lock_conflicts_time_out_and_bad_requests_are_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let db = Database::create(config(&tmp.path().join("db"), 1 << 20)).unwrap();
    let mut t1 = db.begin();
    let p = t1.alloc(8).unwrap();
    t1.commit().unwrap();
    let mut t1 = db.begin();
    t1.write_u64(p, 0, 5).unwrap();
    let mut t2 = db.begin();
    t2.set_lock_wait(Duration::from_millis(30));
    assert!(matches!(t2.read_u64(p, 0), Err(Error::LockTimeout { .. })));
    drop(t2);
    assert!(matches!(t1.write(p, 5000, b"x"), Err(Error::InvalidInput(_))), "write past the payload");
    assert!(matches!(t1.write_u64(PageId::new(9, false, 9), 0, 1), Err(Error::InvalidPageId { .. })));
    t1.commit().unwrap();
    let mut t3 = db.begin();
    assert_eq!(t3.read_u64(p, 0).unwrap(), 5);
}

fn wal_segment(dir: &std::path::Path) -> std::path::PathBuf {
    let wal = dir.join("wal");
    let mut segs: Vec<_> = std::fs::read_dir(&wal).unwrap().map(|e| e.unwrap().path()).filter(|p| p.extension().is_some_and(|e| e == "log")).collect();
    segs.sort();
    assert_eq!(segs.len(), 1, "one segment expected: {segs:?}");
    segs.pop().unwrap()
}

/// Five committed transactions, then a crash (no checkpoint): the log holds them all.
fn five_commits(dir: &std::path::Path) -> PageId {
    let db = Database::create(config(dir, 1 << 20)).unwrap();
    let mut tx = db.begin();
    let p = tx.alloc(64).unwrap();
    tx.commit().unwrap();
    db.checkpoint().unwrap();
    for v in 1..=5u64 {
        let mut tx = db.begin();
        tx.write_u64(p, 0, v).unwrap();
        tx.commit().unwrap();
    }
    crash(db);
    p
}

#[test]
fn torn_log_tail_loses_only_the_torn_transaction() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("db");
    let p = five_commits(&dir);
    let seg = wal_segment(&dir);
    let len = std::fs::metadata(&seg).unwrap().len();
    // The last flushed chunk is the fifth commit: update (65 bytes), commit (33), flush mark
    // (41). Cutting 80 bytes tears its commit record.
    std::fs::OpenOptions::new().write(true).open(&seg).unwrap().set_len(len - 80).unwrap();
    let db = Database::open(config(&dir, 1 << 20)).unwrap();
    let mut tx = db.begin();
    assert_eq!(tx.read_u64(p, 0).unwrap(), 4, "the fourth commit survives, the torn fifth does not");
}

#[test]
fn corrupt_record_in_the_middle_of_the_log_is_a_typed_error() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("db");
    five_commits(&dir);
    let seg = wal_segment(&dir);
    let mut bytes = std::fs::read(&seg).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x40;
    std::fs::write(&seg, &bytes).unwrap();
    let err = Database::open(config(&dir, 1 << 20)).err().expect("a damaged durable record must not be skipped");
    assert!(matches!(err, Error::Corruption { .. }), "{err}");
    // Nothing was changed by the failed open: the damage is still reported the same way.
    assert_eq!(std::fs::read(&seg).unwrap(), bytes);
    assert!(matches!(Database::open(config(&dir, 1 << 20)), Err(Error::Corruption { .. })));
}

#[test]
fn a_create_interrupted_before_the_meta_file_can_be_repeated() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("db");
    // What creates killed at each step before writing the meta file leave behind: the lock
    // file, then a half-written allocation table (its temporary file, named as the
    // filesystem backend names it), then the table and a half-written catalog.
    let alloc = dir.join("alloc.table");
    let catalog = dir.join(strata::access::catalog::CATALOG_FILE);
    let leftovers: [&[&std::path::Path]; 3] = [&[], &[&atomic_write_temp(&alloc)], &[&alloc, &atomic_write_temp(&catalog)]];
    for files in leftovers {
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(strata::storage::dirlock::LOCK_FILE), b"1234\n").unwrap();
        for f in files {
            std::fs::write(f, b"partial").unwrap();
        }
        assert!(matches!(Database::open(config(&dir, 1 << 20)), Err(Error::NotADatabase { .. })));
        let db = Database::create(config(&dir, 1 << 20)).unwrap_or_else(|e| panic!("create over {files:?}: {e}"));
        db.close().unwrap();
        Database::open(config(&dir, 1 << 20)).unwrap().close().unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
    // Anyone else's file still makes it refuse.
    let other = tmp.path().join("other");
    std::fs::create_dir_all(&other).unwrap();
    std::fs::write(other.join("alloc.table"), b"x").unwrap();
    std::fs::write(other.join("notes.txt"), b"mine").unwrap();
    assert!(matches!(Database::create(config(&other, 1 << 20)), Err(Error::AlreadyExists { .. })));
}

#[test]
fn a_failed_home_write_stops_in_place_writes_until_reopen_and_loses_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("db");
    let faulty = Arc::new(FaultyBackend::new(Arc::new(FileBackend::default())));
    let cfg = || config(&dir, 96 << 10).backend(faulty.clone());
    let db = Database::create(cfg()).unwrap();
    let mut tx = db.begin();
    let pages: Vec<PageId> = (0..120u64).map(|_| tx.alloc(100).unwrap()).collect();
    for (i, &p) in pages.iter().enumerate() {
        tx.write_u64(p, 0, i as u64).unwrap();
    }
    tx.commit().unwrap();
    db.checkpoint().unwrap();
    // Home writes of pages 100.. fail (the log and the double-write area sit at lower offsets).
    faulty.faults.write_from_offset.store(100 * 4096, Ordering::Relaxed);
    faulty.faults.write_errno.store(libc::EIO as u64, Ordering::Relaxed);
    let mut failed = None;
    for round in 1..4u64 {
        let mut tx = db.begin();
        let r = pages.iter().enumerate().try_for_each(|(i, &p)| tx.write_u64(p, 0, round * 1000 + i as u64));
        match r.and_then(|_| tx.commit()) {
            Ok(()) => {}
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
    }
    let err = failed.expect("evicting a page whose home write fails must fail");
    assert!(matches!(err, Error::Io { .. }), "{err}");
    faulty.faults.write_errno.store(0, Ordering::Relaxed);
    // The disk is fine again, but a torn home may exist: in-place writes stay refused.
    assert!(db.checkpoint().is_err());
    drop(db);
    let db = Database::open(cfg()).unwrap();
    let mut tx = db.begin();
    let v: Vec<u64> = pages.iter().map(|&p| tx.read_u64(p, 0).unwrap()).collect();
    // Every page holds the value of the same committed round.
    let round = v[0] / 1000;
    for (i, &x) in v.iter().enumerate() {
        assert_eq!(x, round * 1000 + i as u64, "page {i} after reopen");
    }
    tx.commit().unwrap();
    db.close().unwrap();
}
