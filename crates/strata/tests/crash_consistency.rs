//! Crash consistency against simulated power failures (in the style of redb's
//! `tests/crash_consistency.rs`).
//!
//! The bank workload runs on [`SimBackend`], an in-memory filesystem that keeps what is
//! durable apart from what was merely written. At every sync point (fsync of a data file,
//! the log or the double-write area, atomic file replacement) it builds the images a power
//! failure just before and just after it would leave: unsynced writes dropped, all applied,
//! or a random subset applied with writes torn at 512-byte or 4 KiB granularity. Each image
//! is opened (which recovers it) and compared with a model: the balances after every
//! acknowledged commit. A recovered image must hold exactly the state after commit `s`,
//! where `s` is the number of commits acknowledged when the crash happened, or one more (the
//! commit in flight); money is conserved, and no page is leaked or lost. Some images are
//! crashed again during their recovery (every sync point of the recovery) and reopened.
//!
//! Seeded and reproducible: `STRATA_CRASH_SEED` picks the seed, `STRATA_CRASH_TRANSFERS` the
//! length of the run (default 60 transfers, several thousand crash points).

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use strata::ops::torture::{self, Bank, Outcome, Rng};
use strata::storage::{CrashMode, SimBackend};
use strata::{Config, Database};

const POOL: u64 = 136 << 10;
const ACCOUNTS: u64 = 200;

fn config(be: SimBackend) -> Config {
    // Small log segments and automatic checkpoints every 16 KiB of log: crash points inside
    // checkpoints and log truncation are part of every run.
    Config::new("/db").pool_size(POOL).min_page(4096).wal_segment_size(64 << 10).checkpoint_every(16 << 10).backend(Arc::new(be))
}

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// The balances of every account, read in one transaction.
fn balances(db: &Database, bank: &Bank) -> Vec<u64> {
    let mut tx = db.begin();
    let out = (0..bank.accounts)
        .map(|i| {
            let (pid, at) = bank.account(db.buffer(), i);
            tx.read_u64(pid, at).unwrap()
        })
        .collect();
    tx.commit().unwrap();
    out
}

struct Checker {
    /// Balances after commit `s` (index 0: after setup).
    model: Vec<Vec<u64>>,
    images: u64,
    nested: u64,
    at_label: u64,
    at_next: u64,
}

impl Checker {
    /// Opens a crash image, checks it against the model; returns the image's backend so
    /// that it can be crashed again.
    fn check(&mut self, image: SimBackend, label: u64, what: &str) {
        let db = match Database::open(config(image.clone())) {
            Ok(db) => db,
            Err(e) => panic!("{what}: recovery failed: {e}\n{}", diagnose(&image)),
        };
        let bank = Bank::load(db.buffer(), db.locks()).unwrap_or_else(|e| panic!("{what}: bank unreadable: {e}"));
        let v = torture::verify(db.buffer(), db.locks()).unwrap_or_else(|e| panic!("{what}: verify failed: {e}"));
        assert!(v.ok, "{what}: {v:?}");
        let s = v.last_committed;
        assert!(s == label || s == label + 1, "{what}: recovered commit {s}, but {label} were acknowledged at the crash");
        let expected = self.model.get(s as usize).unwrap_or_else(|| panic!("{what}: recovered commit {s}, which never happened"));
        assert_eq!(&balances(&db, &bank), expected, "{what}: balances differ from the model after commit {s}");
        db.buffer().check_invariants().unwrap_or_else(|e| panic!("{what}: {e}"));
        if s == label {
            self.at_label += 1;
        } else {
            self.at_next += 1;
        }
        self.images += 1;
        drop(db);
    }
}

/// What a failing image holds: files, checkpoint record, double-write entries, log records.
fn diagnose(image: &SimBackend) -> String {
    use std::fmt::Write;
    use strata::storage::wal::{Body, CheckpointInfo, Wal, WalOptions};
    use strata::storage::StorageBackend;
    let img = image.crash_image(0, CrashMode::KeepUnsynced);
    let dir = std::path::Path::new("/db");
    let mut out = String::new();
    let cp = CheckpointInfo::load(&img, dir);
    writeln!(out, "checkpoint: {cp:?}").unwrap();
    for name in img.list_dir(dir).unwrap_or_default().into_iter().chain(img.list_dir(&dir.join("wal")).unwrap_or_default()) {
        write!(out, "{name} ").unwrap();
    }
    if let Ok(dw) = strata::storage::doublewrite::DoubleWrite::open(&img, dir) {
        for s in dw.saved().unwrap_or_default() {
            write!(out, "\ndouble-write: {} lsn {}", s.pid, s.lsn).unwrap();
        }
    }
    for class in 0..5u8 {
        let path = dir.join(format!("class-{class:02}.pages"));
        if let Ok(f) = img.open(&path, strata::storage::backend::OpenMode::Buffered, false) {
            write!(out, "\n{}: {} bytes", path.display(), f.len().unwrap_or(0)).unwrap();
            let size = 4096usize << class;
            let n = f.len().unwrap_or(0) as usize / size;
            for i in 0..n {
                let mut buf = strata::storage::AlignedBuf::zeroed(size);
                f.read_at(buf.io(), (i * size) as u64).unwrap();
                let v = strata::storage::page::verify(&buf, strata::storage::PageId::new(class, false, i as u64));
                write!(out, " [{i}: {v:?}]").unwrap();
            }
        }
    }
    let start = cp.ok().flatten().map_or(1, |c| c.start_lsn);
    match Wal::open(Arc::new(img), dir, start, WalOptions { segment_size: 64 << 10, group_commit: true }) {
        Ok(wal) => {
            for r in wal.reader(start).flatten() {
                let body = match &r.body {
                    Body::Update { pid, offset, after, .. } => format!("update {pid} @{offset} len {}", after.len()),
                    b => format!("{b:?}"),
                };
                write!(out, "\n{} tx {} prev {} {body}", r.lsn, r.txid, r.prev_lsn).unwrap();
            }
        }
        Err(e) => write!(out, "\nlog unreadable: {e}").unwrap(),
    }
    out
}

#[test]
fn every_crash_point_recovers_to_an_acknowledged_state() {
    let seed = env("STRATA_CRASH_SEED", 42);
    let transfers = env("STRATA_CRASH_TRANSFERS", 60);
    let modes = vec![CrashMode::DropUnsynced, CrashMode::KeepUnsynced, CrashMode::Torn { sector: 512 }, CrashMode::Torn { sector: 4096 }];
    let be = SimBackend::new();
    let db = Database::create(config(be.clone())).unwrap();
    let bank = Bank::setup(db.buffer(), db.locks(), ACCOUNTS, 1000, 1).unwrap();
    let mut checker = Checker { model: vec![balances(&db, &bank)], images: 0, nested: 0, at_label: 0, at_next: 0 };
    be.set_label(0);
    be.capture_at_syncs(1, seed, modes.clone());
    let seq = AtomicU64::new(0);
    let mut rng = Rng(seed);
    let mut committed = 0u64;
    let mut aborted = 0u64;
    let mut recheck = 0u64;
    while committed < transfers {
        match torture::transfer(db.buffer(), db.locks(), &bank, 0, &mut rng, &seq, Duration::from_secs(1)).unwrap() {
            Outcome::Committed(s) => {
                committed += 1;
                assert_eq!(s, committed);
                checker.model.push(balances(&db, &bank));
                be.set_label(committed);
            }
            Outcome::Aborted => aborted += 1,
            Outcome::Conflict => unreachable!("one worker cannot conflict"),
        }
        if committed % 20 == 19 {
            db.checkpoint().unwrap();
        }
        for cap in be.take_captures() {
            let what = format!("seed {seed}, sync point {} ({}), {:?}", cap.sync_point, if cap.after { "after" } else { "before" }, cap.mode);
            recheck += 1;
            if recheck.is_multiple_of(16) {
                // Crash the recovery of this image at each of its sync points, too.
                let nested = cap.image.crash_image(seed ^ recheck, CrashMode::DropUnsynced);
                nested.set_label(cap.label);
                nested.capture_at_syncs(1, seed ^ recheck, vec![CrashMode::Torn { sector: 512 }]);
                checker.check(nested.clone(), cap.label, &what);
                for inner in nested.take_captures() {
                    checker.nested += 1;
                    checker.check(inner.image, cap.label, &format!("{what}, crashed during recovery at its sync point {}", inner.sync_point));
                }
            } else {
                checker.check(cap.image, cap.label, &what);
            }
        }
    }
    be.stop_capturing();
    let v = torture::verify(db.buffer(), db.locks()).unwrap();
    assert!(v.ok && v.last_committed == committed, "{v:?}");
    db.close().unwrap();
    eprintln!(
        "crash consistency: seed {seed}, {committed} commits, {aborted} rollbacks, {} crash images recovered ({} of them crashed again during recovery); \
         {} recovered the acknowledged state, {} also the commit in flight",
        checker.images, checker.nested, checker.at_label, checker.at_next
    );
    assert!(checker.images >= 1000, "too few crash points ({}) to mean anything", checker.images);
}
