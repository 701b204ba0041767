//! Read-only opens ([`Database::open_read_only`]): they read everything, refuse every change
//! with [`Error::ReadOnly`], write no file (bytes and modification times unchanged, nothing
//! created), share the directory lock with each other but not with a writer, and refuse with
//! [`Error::RecoveryPending`] when a crash left work for recovery, which a read-write open
//! then does. (Separate processes: the CLI test `cli_inspect.rs`.)

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use strata::{BufferManager, Config, Database, Error};

fn config(dir: &Path) -> Config {
    Config::new(dir).min_page(4096).pool_size(1 << 20)
}

/// Every file and directory under `dir`: bytes (files) and modification time.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, (Option<Vec<u8>>, SystemTime)> {
    let mut out = BTreeMap::new();
    let mut todo = vec![dir.to_owned()];
    while let Some(d) = todo.pop() {
        out.insert(d.clone(), (None, fs::metadata(&d).unwrap().modified().unwrap()));
        for e in fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let meta = e.metadata().unwrap();
            if meta.is_dir() {
                todo.push(e.path());
            } else {
                out.insert(e.path(), (Some(fs::read(e.path()).unwrap()), meta.modified().unwrap()));
            }
        }
    }
    out
}

fn expect_read_only<T>(r: strata::Result<T>) {
    match r {
        Err(Error::ReadOnly { .. }) => {}
        Err(e) => panic!("expected ReadOnly, got {e:?}"),
        Ok(_) => panic!("expected ReadOnly, got Ok"),
    }
}

/// A database with a column, a tree with a key, and a few loose pages (one freed).
fn build(dir: &Path) -> Vec<strata::PageId> {
    let db = Database::create(config(dir)).unwrap();
    let values: Vec<u8> = (0..20_000u64).flat_map(|v| v.to_le_bytes()).collect();
    db.import("v", strata::access::ValueFormat::U64le, &mut &values[..], values.len() as u64, &mut |_| {}).unwrap();
    let tree = db.create_tree("t").unwrap();
    let mut tx = db.begin();
    tree.insert(&mut tx, b"key", b"value").unwrap();
    tx.commit().unwrap();
    let bm = db.buffer();
    let pids: Vec<_> = (0..4)
        .map(|i| {
            let mut g = bm.alloc(3000).unwrap();
            g.write_u64(0, i);
            g.pid()
        })
        .collect();
    bm.free(pids[1]).unwrap();
    db.close().unwrap();
    pids
}

#[test]
fn a_read_only_open_reads_everything_refuses_changes_and_writes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("db");
    let pids = build(&dir);
    let before = snapshot(&dir);
    let db = Database::open_read_only(config(&dir)).unwrap();
    let bm = db.buffer();
    assert!(bm.is_read_only());
    assert_eq!(bm.fix_shared(pids[2]).unwrap().data()[..8], 2u64.to_le_bytes());
    let report = db.check().unwrap();
    assert_eq!((report.columns, report.trees.len()), (1, 1));
    let mut out = Vec::new();
    assert!(db.tree("t").unwrap().get(bm, b"key", &mut out).unwrap());
    assert_eq!(out, b"value");
    // Allocation: the loose pages (pids[1] freed) and the others.
    let alloc = bm.allocation();
    let class = pids[0].class();
    let c = alloc.iter().find(|c| c.class == class).unwrap();
    assert!(c.allocated.iter().any(|&(a, b)| a <= pids[0].index() && pids[0].index() <= b));
    assert!(c.free.contains(&(pids[1].index(), pids[1].index())), "{c:?}");
    assert_eq!(c.pages_allocated, bm.allocated_pages().iter().filter(|p| p.class() == class).count() as u64);
    let page = bm.inspect_page(pids[2]).unwrap();
    assert!(page.verdict.is_ok() && page.header.page_id == pids[2].raw());
    assert!(matches!(bm.inspect_page(pids[1]), Err(Error::InvalidPageId { .. })));
    // Every change is refused.
    expect_read_only(bm.alloc(100));
    expect_read_only(bm.alloc_temp(100));
    expect_read_only(bm.free(pids[0]));
    expect_read_only(bm.fix_exclusive(pids[0]));
    expect_read_only(db.create_tree("u"));
    let values = 7u64.to_le_bytes();
    expect_read_only(db.import("w", strata::access::ValueFormat::U64le, &mut &values[..], 8, &mut |_| {}));
    let mut tx = db.begin();
    let r = db.tree("t").unwrap().insert(&mut tx, b"other", b"x");
    assert!(matches!(r, Err(Error::ReadOnly { .. })), "{r:?}");
    drop(tx);
    // Nothing was changed, so there is nothing to checkpoint: close succeeds and writes nothing.
    db.checkpoint().unwrap();
    db.close().unwrap();
    assert_eq!(snapshot(&dir), before, "a read-only open changed the database directory");
    // The database is intact for a writer.
    let db = Database::open(config(&dir)).unwrap();
    assert_eq!(db.check().unwrap().columns, 1);
    db.close().unwrap();
}

#[test]
fn readers_share_the_lock_and_exclude_writers() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("db");
    build(&dir);
    let before = snapshot(&dir);
    let r1 = Database::open_read_only(config(&dir)).unwrap();
    let r2 = BufferManager::open_read_only(config(&dir)).unwrap();
    for r in [Database::open(config(&dir)).map(|_| ()), BufferManager::open(config(&dir)).map(|_| ())] {
        match r {
            Err(e @ Error::LockedByReaders { .. }) => assert!(e.to_string().contains(&dir.display().to_string()), "{e}"),
            other => panic!("expected LockedByReaders, got {other:?}"),
        }
    }
    drop(r1);
    assert!(matches!(Database::open(config(&dir)), Err(Error::LockedByReaders { .. })));
    drop(r2);
    assert_eq!(snapshot(&dir), before, "refused writers and readers changed nothing");
    let w = Database::open(config(&dir)).unwrap();
    match Database::open_read_only(config(&dir)) {
        Err(Error::Locked { pid, .. }) => assert_eq!(pid, Some(std::process::id())),
        Err(e) => panic!("expected Locked, got {e:?}"),
        Ok(_) => panic!("expected Locked, got Ok"),
    }
    w.close().unwrap();
}

#[test]
fn after_a_crash_read_only_opens_refuse_until_a_read_write_open_recovers() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("db");
    build(&dir);
    let db = Database::open(config(&dir)).unwrap();
    assert_eq!(db.buffer().recovery_report(), Default::default(), "a clean database needs no recovery");
    let tree = db.tree("t").unwrap();
    // A transaction that never ends, whose records the next commit makes durable (group
    // commit flushes the whole log tail): recovery rolls it back.
    let mut loser = db.begin();
    let page = loser.alloc(100).unwrap();
    loser.write_u64(page, 0, 99).unwrap();
    let mut tx = db.begin();
    tree.insert(&mut tx, b"committed", b"1").unwrap();
    tx.commit().unwrap();
    std::mem::forget(loser);
    db.crash();
    let before = snapshot(&dir);
    for _ in 0..2 {
        match Database::open_read_only(config(&dir)) {
            Err(e @ Error::RecoveryPending { .. }) => {
                let msg = e.to_string();
                assert!(msg.contains("needs recovery") && msg.contains("strata recover") && msg.contains("log holds"), "{msg}");
            }
            Err(e) => panic!("expected RecoveryPending, got {e:?}"),
            Ok(_) => panic!("expected RecoveryPending, got Ok"),
        }
    }
    assert_eq!(snapshot(&dir), before, "a refused read-only open changed the database directory");
    let db = Database::open(config(&dir)).unwrap();
    let r = db.buffer().recovery_report();
    assert!(r.records > 0 && r.losers == 1, "{r:?}");
    db.close().unwrap();
    let db = Database::open_read_only(config(&dir)).unwrap();
    let mut out = Vec::new();
    let tree = db.tree("t").unwrap();
    assert!(tree.get(db.buffer(), b"committed", &mut out).unwrap());
    assert!(!db.buffer().is_allocated(page), "the loser's allocation was rolled back");
    db.check().unwrap();
}
