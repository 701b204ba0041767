//! The database directory lock in one process: a second open of a database while the first
//! is open is refused with [`Error::Locked`] (naming this process) and changes nothing; the
//! lock is released by drop, close and a simulated crash. (Separate processes: the CLI test
//! `cli_lock.rs`.)

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use strata::storage::dirlock::LOCK_FILE;
use strata::{BufferManager, Config, Database, Error};

fn config(dir: &Path) -> Config {
    Config::new(dir).min_page(4096).pool_size(1 << 20)
}

/// Every file under `dir` with its bytes and modification time.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, (Vec<u8>, SystemTime)> {
    let mut out = BTreeMap::new();
    let mut todo = vec![dir.to_owned()];
    while let Some(d) = todo.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let meta = e.metadata().unwrap();
            if meta.is_dir() {
                todo.push(e.path());
            } else {
                out.insert(e.path(), (fs::read(e.path()).unwrap(), meta.modified().unwrap()));
            }
        }
    }
    out
}

fn expect_locked<T>(r: strata::Result<T>, dir: &Path) -> String {
    match r {
        Err(e @ Error::Locked { .. }) => {
            let Error::Locked { dir: d, pid } = &e else { unreachable!() };
            assert_eq!(d, dir);
            assert_eq!(*pid, Some(std::process::id()), "the holder is this process");
            let msg = e.to_string();
            assert!(msg.contains(&dir.display().to_string()) && msg.contains(&format!("process {}", std::process::id())), "{msg}");
            assert!(msg.contains("in use") && msg.contains("retry"), "{msg}");
            msg
        }
        Err(e) => panic!("expected Locked, got {e:?}"),
        Ok(_) => panic!("expected Locked, got Ok"),
    }
}

#[test]
fn second_open_in_the_same_process_is_locked_and_changes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("db");
    let bm = BufferManager::create(config(&dir)).unwrap();
    let pid = {
        let mut g = bm.alloc(1000).unwrap();
        g.write_u64(0, 42);
        g.pid()
    };
    bm.checkpoint().unwrap();
    assert_eq!(fs::read_to_string(dir.join(LOCK_FILE)).unwrap().trim(), std::process::id().to_string());
    let before = snapshot(&dir);
    expect_locked(BufferManager::open(config(&dir)), &dir);
    expect_locked(Database::open(config(&dir)), &dir);
    // A create on the open database is refused as before (it holds a database).
    assert!(matches!(BufferManager::create(config(&dir)), Err(Error::AlreadyExists { .. })));
    assert_eq!(snapshot(&dir), before, "a refused open writes nothing");
    // Dropping releases the lock (and checkpoints, as before).
    drop(bm);
    let bm = BufferManager::open(config(&dir)).unwrap();
    assert_eq!(bm.fix_shared(pid).unwrap().data()[..8], 42u64.to_le_bytes());
    expect_locked(BufferManager::open(config(&dir)), &dir);
    // So does close.
    bm.close().unwrap();
    BufferManager::open(config(&dir)).unwrap().close().unwrap();
}

#[test]
fn database_close_and_crash_release_the_lock() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("db");
    let db = Database::create(config(&dir)).unwrap();
    expect_locked(Database::open(config(&dir)), &dir);
    db.close().unwrap();
    let db = Database::open(config(&dir)).unwrap();
    let mut tx = db.begin();
    let pid = tx.alloc(100).unwrap();
    tx.write_u64(pid, 0, 7).unwrap();
    tx.commit().unwrap();
    expect_locked(Database::open(config(&dir)), &dir);
    // A simulated crash releases the lock as a dying process would; the reopen recovers.
    db.crash();
    let db = Database::open(config(&dir)).unwrap();
    let mut tx = db.begin();
    assert_eq!(tx.read_u64(pid, 0).unwrap(), 7);
    tx.commit().unwrap();
    db.close().unwrap();
}

#[test]
fn a_directory_without_a_database_gets_no_lock_file_and_a_left_lock_file_is_reused() {
    let tmp = tempfile::tempdir().unwrap();
    let junk = tmp.path().join("junk");
    fs::create_dir(&junk).unwrap();
    assert!(matches!(BufferManager::open(config(&junk)), Err(Error::NotADatabase { .. })));
    assert!(!junk.join(LOCK_FILE).exists(), "open put a lock file into a directory that holds no database");
    // A create interrupted right after taking the lock left only the lock file (with a pid
    // of a process long gone): creating again works.
    let dir = tmp.path().join("db");
    fs::create_dir(&dir).unwrap();
    fs::write(dir.join(LOCK_FILE), "2000000000\n").unwrap();
    BufferManager::create(config(&dir)).unwrap().close().unwrap();
    BufferManager::open(config(&dir)).unwrap().close().unwrap();
}
