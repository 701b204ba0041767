//! A disk that really fills up (issue 17, item 2): the fault-injecting backend's space model
//! (`Faults::limit_space`) gives the database a small file system whose files take space as
//! they grow and give it back when cut or removed, and writes that do not fit fail with
//! `ENOSPC`, as on a real one. (`strata-cli`'s `cli_disk_full` does the same on a real
//! tmpfs where mounting is allowed.)
//!
//! What must hold on every write path: a clear `DiskFull` error, nothing committed lost,
//! the database opens afterwards (recovery needs no free space), readers never need free
//! space, and the next write succeeds once there is space again.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use strata::access::table::{Schema, Value};
use strata::storage::{FaultyBackend, FileBackend};
use strata::{Config, Database, Error};

fn schema() -> Schema {
    Schema::parse("id:i64,x:f64,name:str").unwrap()
}

/// Row `i`: its string of up to 128 pseudo-random letters does not compress (packed leaves
/// compress repetitive text several times over, and these tests need the bytes to fill
/// their small disks as they did).
fn row(i: u64) -> Vec<Value> {
    let mut r = strata::util::SplitMix64(i);
    let tail: String =
        (0..10 * (i % 13)).map(|_| char::from(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-+"[r.below(64) as usize])).collect();
    let name = format!("row {i} ") + &tail;
    vec![Value::I64(i as i64), Value::F64(i as f64 / 4.0), Value::Str(name)]
}

struct Fixture {
    _tmp: tempfile::TempDir,
    dir: PathBuf,
    fb: Arc<FaultyBackend>,
}

impl Fixture {
    fn new() -> Fixture {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("db");
        let fb = Arc::new(FaultyBackend::new(Arc::new(FileBackend::default())));
        Fixture { _tmp: tmp, dir, fb }
    }

    fn config(&self) -> Config {
        Config::new(&self.dir).pool_size(1 << 20).min_page(4096).backend(self.fb.clone())
    }

    fn create(&self) -> Database {
        Database::create(self.config()).unwrap()
    }

    fn open(&self) -> Database {
        Database::open(self.config()).unwrap_or_else(|e| panic!("open with {:?} bytes left: {e}", self.fb.faults.space_left()))
    }

    fn limit(&self, bytes: Option<u64>) {
        self.fb.faults.limit_space(bytes);
    }
}

/// Loads rows `from..to` into `table` (created if absent); the rows committed so far are
/// pushed to `reported`.
fn load(db: &Database, table: &str, from: u64, to: u64, reported: &mut Vec<u64>) -> Result<u64, Error> {
    db.load_table(
        table,
        &schema(),
        &mut |sink| {
            for i in from..to {
                sink(&row(i))?;
            }
            Ok(to - from)
        },
        &mut |n| reported.push(from + n),
    )
}

/// The rows of `table`, checked to be `0..n` for some n, which is returned.
fn rows_of(db: &Database, table: &str) -> u64 {
    let t = db.table(table).unwrap();
    let mut n = 0u64;
    t.scan(db.buffer(), 0, &mut |id, r| {
        assert_eq!(id, n);
        assert_eq!(r, row(n).as_slice(), "row {n} of {table}");
        n += 1;
        true
    })
    .unwrap();
    assert_eq!(t.rows(db.buffer()).unwrap(), n);
    n
}

fn assert_disk_full<T: std::fmt::Debug>(r: Result<T, Error>) -> PathBuf {
    match r {
        Err(Error::DiskFull { path }) => path,
        other => panic!("expected a disk-full error, got {other:?}"),
    }
}

/// Every file's bytes and modification time under `dir` (but the lock file, whose
/// holder's pid is rewritten by each writer).
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, (Vec<u8>, std::time::SystemTime)> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            let md = e.metadata().unwrap();
            if md.is_dir() {
                stack.push(p.clone());
                out.insert(p, (Vec::new(), md.modified().unwrap()));
            } else if e.file_name() != "lock" {
                out.insert(p.clone(), (std::fs::read(&p).unwrap(), md.modified().unwrap()));
            }
        }
    }
    out
}

/// The case that used to stop readers: an import fills the disk (the log and the data
/// file compete for the last bytes); the error is `DiskFull`; then, with the disk still
/// full, the database opens (recovery needs no free space: it neither rebuilds the failed
/// import's pages nor writes them), the earlier table is whole, `check` passes, and the
/// space the failed import took is given back, so that after a little more space the
/// import runs to its end.
#[test]
fn an_import_that_fills_the_disk_stops_only_itself() {
    let f = Fixture::new();
    let db = f.create();
    let mut reported = Vec::new();
    assert_eq!(load(&db, "a", 0, 3000, &mut reported).unwrap(), 3000);
    db.close().unwrap();

    for (round, space) in [(0, 400u64 << 10), (1, 1 << 20), (2, 2 << 20)] {
        let db = f.open();
        f.limit(Some(space));
        let mut reported = Vec::new();
        let table = format!("b{round}");
        let path = assert_disk_full(load(&db, &table, 0, 60_000, &mut reported));
        assert!(path.starts_with(&f.dir), "{}", path.display());
        // The process ends with the error (dropping a database checkpoints, ignoring errors).
        drop(db);
        let left = f.fb.faults.space_left().unwrap();

        // Still full: a read-write open recovers without needing space, and reads.
        let db = f.open();
        assert_eq!(rows_of(&db, "a"), 3000);
        // The table the failed import created is gone, and so are its pages (some of them
        // committed): an import's new table is invisible until it finishes, and the open
        // drops what a failed one left.
        assert!(db.table(&table).is_err(), "round {round}: {table} survived ({reported:?} reported)");
        let report = db.check().unwrap();
        assert!(report.tables.contains_key("a"));
        assert_eq!(report.unreferenced_pages, 0, "round {round}: pages of the failed import left behind");
        db.close().unwrap();
        // The log of the failed import is given back.
        assert!(f.fb.faults.space_left().unwrap() > left, "round {round}: nothing given back");
        // A read-only open sees the same.
        let ro = Database::open_read_only(f.config()).unwrap();
        assert_eq!(rows_of(&ro, "a"), 3000);
        drop(ro);
    }

    // With space again, the import runs to its end and everything is there after a restart.
    f.limit(None);
    let db = f.open();
    let mut reported = Vec::new();
    assert_eq!(load(&db, "c", 0, 20_000, &mut reported).unwrap(), 20_000);
    db.close().unwrap();
    let db = f.open();
    assert_eq!(rows_of(&db, "a"), 3000);
    assert_eq!(rows_of(&db, "c"), 20_000);
    db.check().unwrap();
}

/// Reading needs no space: on a disk with no byte left, a read-write open, reads, a SQL
/// query and a close succeed and change no file (bytes and modification times).
#[test]
fn readers_need_no_free_space_and_write_nothing() {
    let f = Fixture::new();
    let db = f.create();
    let mut reported = Vec::new();
    load(&db, "a", 0, 5000, &mut reported).unwrap();
    db.close().unwrap();
    let before = snapshot(&f.dir);

    f.limit(Some(0));
    std::thread::sleep(std::time::Duration::from_millis(20));
    for _ in 0..2 {
        let db = f.open();
        assert_eq!(rows_of(&db, "a"), 5000);
        let q = strata::sql::prepare(&db.catalog(), "SELECT count(*), sum(id) FROM a WHERE x >= 10").unwrap();
        let mut out = Vec::new();
        q.execute(db.buffer(), &mut |r| {
            out.push(r.to_vec());
            Ok(true)
        })
        .unwrap();
        assert_eq!(out, vec![vec![Value::I64(4960), Value::I64((40..5000).sum::<i64>())]]);
        db.checkpoint().unwrap();
        db.close().unwrap();
    }
    assert_eq!(f.fb.faults.space_left(), Some(0));
    let after = snapshot(&f.dir);
    assert_eq!(before.keys().collect::<Vec<_>>(), after.keys().collect::<Vec<_>>());
    for (p, (bytes, mtime)) in &before {
        let (b2, m2) = &after[p];
        assert!(bytes == b2, "{} changed", p.display());
        assert_eq!(mtime, m2, "{} was written", p.display());
    }
}

/// A commit that finds no space for its log records fails with `DiskFull`; what was
/// committed before is there after a restart (with the disk still full), and the next
/// commit succeeds once there is space.
#[test]
fn a_commit_on_a_full_disk_fails_and_loses_nothing() {
    let f = Fixture::new();
    let db = f.create();
    let t = db.create_table("t", schema()).unwrap();
    let mut tx = db.begin();
    t.append(&mut tx, &(0..200).map(row).collect::<Vec<_>>()).unwrap();
    tx.commit().unwrap();
    f.limit(Some(0));
    let mut tx = db.begin();
    // The append may fail already (a new leaf needs space), or the commit's log write.
    let r = t.append(&mut tx, &(200..400).map(row).collect::<Vec<_>>()).and_then(|_| tx.commit());
    let path = assert_disk_full(r);
    assert!(path.starts_with(&f.dir));
    drop(db);
    let db = f.open();
    assert_eq!(rows_of(&db, "t"), 200);
    db.check().unwrap();
    f.limit(None);
    let t = db.table("t").unwrap();
    let mut tx = db.begin();
    t.append(&mut tx, &(200..400).map(row).collect::<Vec<_>>()).unwrap();
    tx.commit().unwrap();
    db.close().unwrap();
    let db = f.open();
    assert_eq!(rows_of(&db, "t"), 400);
}

/// Log segment creation: with small segments, the disk fills at a segment's first write;
/// the error names the log, and the database keeps what was committed.
#[test]
fn a_new_log_segment_on_a_full_disk_fails_cleanly() {
    let f = Fixture::new();
    let cfg = || f.config().wal_segment_size(64 << 10);
    let db = Database::create(cfg()).unwrap();
    let t = db.create_table("t", schema()).unwrap();
    let mut tx = db.begin();
    t.append(&mut tx, &(0..100).map(row).collect::<Vec<_>>()).unwrap();
    tx.commit().unwrap();
    let segments =
        |dir: &Path| std::fs::read_dir(dir.join("wal")).unwrap().filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().ends_with(".log")).count();
    let first = segments(&f.dir);
    // Enough for the data pages of many commits, but the log runs out.
    f.limit(Some(96 << 10));
    let mut committed = 100;
    let mut failed = None;
    for b in 0..200u64 {
        let mut tx = db.begin();
        let rows: Vec<_> = (committed..committed + 20).map(row).collect();
        match t.append(&mut tx, &rows).and_then(|_| tx.commit()) {
            Ok(()) => committed += 20,
            Err(e) => {
                failed = Some((b, e));
                break;
            }
        }
    }
    let (_, e) = failed.expect("the disk never filled");
    let path = assert_disk_full(Err::<(), _>(e));
    // The log ran out (a segment's first write or a write into the current one).
    assert!(path.starts_with(f.dir.join("wal")), "{}", path.display());
    drop(db);
    let db = Database::open(cfg()).unwrap();
    assert_eq!(rows_of(&db, "t"), committed);
    db.check().unwrap();
    assert!(segments(&f.dir) >= 1 && first >= 1);
}

/// A checkpoint must write dirty pages that already have a durable copy through the
/// double-write area; when that area cannot grow, the checkpoint fails with `DiskFull`,
/// and a restart (still full) recovers everything committed from the log.
#[test]
fn a_checkpoint_whose_double_writes_do_not_fit_loses_nothing() {
    let f = Fixture::new();
    let db = f.create();
    let t = db.create_table("t", schema()).unwrap();
    let mut tx = db.begin();
    t.append(&mut tx, &(0..2000).map(row).collect::<Vec<_>>()).unwrap();
    tx.commit().unwrap();
    db.checkpoint().unwrap();
    // Rewrite pages that have a durable copy: a second table's appends do not, so change
    // the rows of the first one by appending to its last leaf and growing its inner nodes.
    let mut tx = db.begin();
    t.append(&mut tx, &(2000..2600).map(row).collect::<Vec<_>>()).unwrap();
    tx.commit().unwrap();
    f.limit(Some(0));
    let path = assert_disk_full(db.checkpoint());
    assert!(path.starts_with(&f.dir));
    drop(db);
    let db = f.open();
    assert_eq!(rows_of(&db, "t"), 2600);
    db.check().unwrap();
    f.limit(None);
    db.checkpoint().unwrap();
    db.close().unwrap();
    let db = f.open();
    assert_eq!(rows_of(&db, "t"), 2600);
}

/// Operator state spills to temporary files: a query whose state outgrows the pool on a
/// full disk fails with `DiskFull`, leaves no temporary file behind once closed, and the
/// database is untouched.
#[test]
fn a_spilling_query_on_a_full_disk_fails_and_leaves_nothing() {
    let f = Fixture::new();
    let cfg = || Config::new(&f.dir).pool_size(256 << 10).min_page(4096).backend(f.fb.clone());
    let db = Database::create(cfg()).unwrap();
    let mut reported = Vec::new();
    load(&db, "a", 0, 20_000, &mut reported).unwrap();
    db.close().unwrap();
    f.limit(Some(0));
    let db = Database::open(cfg()).unwrap();
    let q = strata::sql::prepare(&db.catalog(), "SELECT name, count(*) FROM a GROUP BY id, name ORDER BY 2 DESC, 1").unwrap();
    let path = assert_disk_full(q.execute(db.buffer(), &mut |_| Ok(true)));
    assert!(path.starts_with(f.dir.join("tmp")), "{}", path.display());
    db.close().unwrap();
    let tmp: Vec<_> = std::fs::read_dir(f.dir.join("tmp")).unwrap().collect();
    assert!(tmp.is_empty(), "temporary files left: {tmp:?}");
    f.limit(None);
    let db = Database::open(cfg()).unwrap();
    assert_eq!(rows_of(&db, "a"), 20_000);
}

/// Replacing the catalog (creating a table) or the allocation table (a checkpoint after
/// allocations) on a full disk fails with `DiskFull` naming the file; the previous
/// version stays in force.
#[test]
fn catalog_and_allocation_table_replacements_on_a_full_disk_keep_the_old_version() {
    let f = Fixture::new();
    let db = f.create();
    let mut reported = Vec::new();
    load(&db, "a", 0, 1000, &mut reported).unwrap();
    db.checkpoint().unwrap();
    f.limit(Some(0));
    let path = assert_disk_full(db.create_table("b", schema()));
    // The new table's root page or the catalog: both are in the database directory.
    assert!(path.starts_with(&f.dir));
    assert!(db.table("b").is_err());
    drop(db);

    // Room for data pages but not for a new allocation table.
    f.limit(None);
    let db = f.open();
    let t = db.table("a").unwrap();
    let mut tx = db.begin();
    t.append(&mut tx, &(1000..3000).map(row).collect::<Vec<_>>()).unwrap();
    tx.commit().unwrap();
    let alloc = f.dir.join(strata::storage::alloc_table::ALLOC_FILE);
    let alloc_len = std::fs::metadata(&alloc).unwrap().len();
    // Less than the table's new copy needs (the data pages' space was reserved when they
    // were allocated; the double-write area may run out first, which is as good a test).
    f.limit(Some(alloc_len - 1));
    let r = db.checkpoint();
    match r {
        Err(Error::DiskFull { path }) => assert!(path.starts_with(&f.dir)),
        other => panic!("expected DiskFull, got {other:?}"),
    }
    drop(db);
    let db = f.open();
    assert_eq!(rows_of(&db, "a"), 3000);
    assert!(db.table("b").is_err());
    db.check().unwrap();
}

/// A small disk: the log keeps itself small. With automatic checkpoints off, committing a
/// few MiB of rows (in many transactions) into a file system with 4 MiB free fills it (the
/// log and the data compete for the space); with the defaults (a checkpoint also when the log
/// since the last one exceeds a quarter of the free space, and log segments of an eighth of
/// it) the same commits fit.
#[test]
fn on_a_small_disk_the_log_checkpoints_before_it_fills_the_disk() {
    const BATCHES: u64 = 30;
    const BATCH: u64 = 1000;
    for automatic in [false, true] {
        let f = Fixture::new();
        let cfg = || if automatic { f.config() } else { f.config().checkpoint_every(u64::MAX) };
        let db = Database::create(cfg()).unwrap();
        db.create_table("t", schema()).unwrap();
        db.close().unwrap();
        f.limit(Some(4 << 20));
        // Opened on the small disk: the log's segment size follows the free space.
        let db = Database::open(cfg()).unwrap();
        let t = db.table("t").unwrap();
        let mut outcome = Ok(());
        for b in 0..BATCHES {
            let mut tx = db.begin();
            let rows: Vec<_> = (b * BATCH..(b + 1) * BATCH).map(row).collect();
            outcome = t.append(&mut tx, &rows).and_then(|_| tx.commit());
            if outcome.is_err() {
                break;
            }
        }
        if automatic {
            outcome.unwrap_or_else(|e| panic!("{e} with {:?} bytes left", f.fb.faults.space_left()));
            db.close().unwrap();
            let db = f.open();
            assert_eq!(rows_of(&db, "t"), BATCHES * BATCH);
            db.check().unwrap();
        } else {
            assert_disk_full(outcome);
        }
    }
}
