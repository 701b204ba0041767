//! Tables (`strata::access::table`): rows of every type (NULLs, strings of every length
//! class, huge values) appended in batches and read back by id and by scan through tiny
//! pools, rollbacks, reopen, every crash point of a load, and appenders and readers at once.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use strata::access::table::{Schema, Table, Value};
use strata::storage::{CrashMode, SimBackend};
use strata::util::SplitMix64;
use strata::{Config, Database, Error};

fn schema() -> Schema {
    Schema::parse("id:i64,x:f64,day:date,flag:bool,name:str,raw:bytes").unwrap()
}

/// A string of a length class chosen by `r`: empty, inline (≤ 12 bytes), a bit longer,
/// long, very long.
fn text(r: &mut SplitMix64, tag: u64) -> String {
    let len = match r.below(10) {
        0 => 0,
        1..=4 => r.below(13) as usize,
        5..=7 => 13 + r.below(40) as usize,
        8 => 200 + r.below(800) as usize,
        _ => 3000 + r.below(3000) as usize,
    };
    let mut s = format!("{tag}:é");
    while s.len() < len {
        s.push(char::from(b'a' + (s.len() % 26) as u8));
    }
    s.truncate(s.char_indices().map(|(i, _)| i).take_while(|&i| i <= len).last().unwrap_or(0));
    s
}

/// Row `i` of a deterministic sequence: every type, NULLs in every column now and then.
fn row(i: u64) -> Vec<Value> {
    let mut r = SplitMix64(i * 7919 + 1);
    let mut v = vec![
        Value::I64(i as i64 * 3 - 1_000),
        Value::F64(i as f64 / 7.0),
        Value::Date((i % 40_000) as i32 - 20_000),
        Value::Bool(i.is_multiple_of(3)),
        Value::Str(text(&mut r, i)),
        Value::Bytes((0..r.below(30)).map(|b| (b as u8) ^ (i as u8)).collect()),
    ];
    for (c, val) in v.iter_mut().enumerate() {
        if r.below(11) == c as u64 {
            *val = Value::Null;
        }
    }
    v
}

fn config(dir: &std::path::Path, pool: u64) -> Config {
    Config::new(dir).pool_size(pool).min_page(4096)
}

fn append_range(db: &Database, t: &Table, range: std::ops::Range<u64>, batch: u64) {
    let mut next = range.start;
    while next < range.end {
        let end = (next + batch).min(range.end);
        let rows: Vec<_> = (next..end).map(row).collect();
        let mut tx = db.begin();
        let ids = t.append(&mut tx, &rows).unwrap();
        assert_eq!(ids, next..end);
        tx.commit().unwrap();
        next = end;
    }
}

fn assert_rows(db: &Database, t: &Table, n: u64) {
    assert_eq!(t.rows(db.buffer()).unwrap(), n);
    let mut seen = 0;
    t.scan(db.buffer(), 0, &mut |id, r| {
        assert_eq!(id, seen, "scan out of order");
        assert_eq!(r, &row(id)[..], "row {id} by scan");
        seen += 1;
        true
    })
    .unwrap();
    assert_eq!(seen, n);
    for id in (0..n).step_by(7).chain(n.saturating_sub(3)..n) {
        assert_eq!(t.get(db.buffer(), id).unwrap().as_deref(), Some(&row(id)[..]), "row {id} by id");
    }
    assert_eq!(t.get(db.buffer(), n).unwrap(), None);
    assert_eq!(t.get(db.buffer(), u64::MAX).unwrap(), None);
    // A scan from the middle starts there.
    let from = n / 2;
    let mut first = None;
    t.scan(db.buffer(), from, &mut |id, _| {
        first = Some(id);
        false
    })
    .unwrap();
    assert_eq!(first, (n > 0).then_some(from));
}

#[test]
fn rows_of_every_type_read_back_by_id_and_scan_through_a_tiny_pool() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("db");
    let db = Database::create(config(&dir, 256 << 10)).unwrap();
    let t = db.create_table("t", schema()).unwrap();
    assert_rows(&db, &t, 0);
    // Batches of every size: single rows (in-place appends), small and large batches.
    append_range(&db, &t, 0..40, 1);
    append_range(&db, &t, 40..400, 37);
    append_range(&db, &t, 400..3000, 900);
    assert_rows(&db, &t, 3000);
    let report = db.check().unwrap();
    let r = &report.tables["t"];
    assert_eq!(r.entries, 3000);
    assert!(r.height >= 3, "a tree of several levels: {r:?}");
    assert!(db.buffer().stats().evictions > 0, "the pool is smaller than the table");
    db.close().unwrap();
    let db = Database::open(config(&dir, 256 << 10)).unwrap();
    let t = db.table("t").unwrap();
    assert_rows(&db, &t, 3000);
    append_range(&db, &t, 3000..3100, 50);
    assert_rows(&db, &t, 3100);
    db.check().unwrap();
}

/// A table written before the committed-row count was kept (its root's word is 0) counts
/// every appended row as committed, across a reopen; its next committed append starts the
/// count, after which an append in flight is no longer counted.
#[test]
fn a_table_from_before_the_committed_count_counts_every_appended_row() {
    use strata::access::btree::node::W_COMMITTED;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("db");
    let db = Database::create(config(&dir, 512 << 10)).unwrap();
    let t = db.create_table("t", schema()).unwrap();
    append_range(&db, &t, 0..300, 100);
    // The root as such a table has it (a logged change: it survives the reopen).
    let mut tx = db.begin();
    tx.write_u64(t.root(), W_COMMITTED, 0).unwrap();
    tx.commit().unwrap();
    db.close().unwrap();
    let db = Database::open(config(&dir, 512 << 10)).unwrap();
    let t = db.table("t").unwrap();
    assert_rows(&db, &t, 300);
    // Without the count, an append in flight is counted (as such tables always did).
    let mut tx = db.begin();
    t.append(&mut tx, &(300..320).map(row).collect::<Vec<_>>()).unwrap();
    assert_eq!(t.rows(db.buffer()).unwrap(), 320);
    tx.abort().unwrap();
    assert_rows(&db, &t, 300);
    // A committed append starts the count.
    append_range(&db, &t, 300..350, 50);
    assert_rows(&db, &t, 350);
    let mut tx = db.begin();
    t.append(&mut tx, &(350..360).map(row).collect::<Vec<_>>()).unwrap();
    assert_eq!((t.rows(db.buffer()).unwrap(), t.appended(db.buffer()).unwrap()), (350, 360), "readers see committed rows only");
    tx.abort().unwrap();
    assert_rows(&db, &t, 350);
    db.check().unwrap();
}

#[test]
fn a_rolled_back_append_leaves_the_table_as_it_was() {
    let tmp = tempfile::tempdir().unwrap();
    let db = Database::create(config(tmp.path(), 512 << 10)).unwrap();
    let t = db.create_table("t", schema()).unwrap();
    append_range(&db, &t, 0..500, 100);
    for batch in [1u64, 30, 2000] {
        let mut tx = db.begin();
        let rows: Vec<_> = (500..500 + batch).map(|i| row(i + 1)).collect();
        t.append(&mut tx, &rows).unwrap();
        assert_eq!(t.rows(db.buffer()).unwrap(), 500, "readers see committed rows only");
        assert_eq!(t.appended(db.buffer()).unwrap(), 500 + batch, "the append in flight is there");
        tx.abort().unwrap();
        assert_eq!(t.appended(db.buffer()).unwrap(), 500);
        assert_rows(&db, &t, 500);
        db.check().unwrap();
    }
    // Dropped without commit: rolled back too.
    {
        let mut tx = db.begin();
        t.append(&mut tx, &[row(9)]).unwrap();
    }
    append_range(&db, &t, 500..700, 64);
    assert_rows(&db, &t, 700);
    let report = db.check().unwrap();
    assert_eq!(report.unreferenced_pages, 0, "rolled-back leaves were freed");
}

#[test]
fn bad_rows_are_refused_whole_and_limits_are_named() {
    let tmp = tempfile::tempdir().unwrap();
    let db = Database::create(Config::new(tmp.path()).pool_size(64 << 20)).unwrap();
    let t = db.create_table("t", Schema::parse("a:i64,s:str").unwrap()).unwrap();
    let mut tx = db.begin();
    let err = t.append(&mut tx, &[vec![Value::I64(1), Value::Null], vec![Value::Str("x".into()), Value::Null]]).unwrap_err();
    assert!(matches!(err, Error::InvalidInput(ref m) if m.contains("row 1") && m.contains("\"a\"") && m.contains("str") && m.contains("i64")), "{err}");
    let err = t.append(&mut tx, &[vec![Value::I64(1)]]).unwrap_err();
    assert!(err.to_string().contains("1 values") && err.to_string().contains("2 columns"), "{err}");
    let err = t.append(&mut tx, &[vec![Value::I64(1), Value::Str("y".repeat(60 << 20))]]).unwrap_err();
    assert!(matches!(err, Error::InvalidInput(ref m) if m.contains("raise the pool")), "{err}");
    tx.abort().unwrap();
    assert_eq!(t.rows(db.buffer()).unwrap(), 0);
    assert!(matches!(db.create_table("t", Schema::parse("a:i64").unwrap()), Err(Error::InvalidInput(_))));
    assert!(matches!(db.table("nope"), Err(Error::NotFound { .. })));
}

#[test]
fn a_huge_string_gets_a_leaf_of_its_own_class_and_reads_back_whole() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("db");
    let db = Database::create(Config::new(&dir).pool_size(96 << 20)).unwrap();
    let t = db.create_table("blobs", Schema::parse("k:i64,v:str").unwrap()).unwrap();
    let big: String = (0..50u32 << 20).map(|i| char::from(b'a' + (i % 23) as u8)).collect();
    let mut tx = db.begin();
    t.append(&mut tx, &[vec![Value::I64(0), Value::Str("small".into())]]).unwrap();
    t.append(&mut tx, &[vec![Value::I64(1), Value::Str(big.clone())], vec![Value::I64(2), Value::Null]]).unwrap();
    t.append(&mut tx, &[vec![Value::I64(3), Value::Str("after".into())]]).unwrap();
    tx.commit().unwrap();
    let report = db.check().unwrap();
    let r = &report.tables["blobs"];
    let classes = db.buffer().classes();
    let class_of_big = (0..classes.count()).find(|&c| classes.page_size(c as u8) > 50 << 20).unwrap();
    assert_eq!(r.leaves_per_class[class_of_big], 1, "{r:?}");
    db.close().unwrap();
    let db = Database::open(Config::new(&dir).pool_size(96 << 20)).unwrap();
    let t = db.table("blobs").unwrap();
    let got = t.get(db.buffer(), 1).unwrap().unwrap();
    assert!(got[1] == Value::Str(big), "the 50 MiB string reads back whole");
    assert_eq!(t.get(db.buffer(), 3).unwrap().unwrap()[1], Value::Str("after".into()));
    let mut ids = Vec::new();
    t.scan(db.buffer(), 0, &mut |id, _| {
        ids.push(id);
        true
    })
    .unwrap();
    assert_eq!(ids, vec![0, 1, 2, 3]);
}

#[test]
fn a_failed_load_drops_the_table_it_created() {
    let tmp = tempfile::tempdir().unwrap();
    let db = Database::create(config(tmp.path(), 1 << 20)).unwrap();
    let sc = schema();
    let err = db
        .load_table(
            "t",
            &sc,
            &mut |sink| {
                for i in 0..5000 {
                    sink(&row(i))?;
                }
                Err(Error::InvalidInput("the input broke".into()))
            },
            &mut |_| {},
        )
        .unwrap_err();
    assert!(err.to_string().contains("the input broke"));
    assert!(matches!(db.table("t"), Err(Error::NotFound { .. })));
    assert_eq!(db.check().unwrap().unreferenced_pages, 0, "its pages were freed");
    // A good load, then an append with another schema is refused.
    let mut reported = Vec::new();
    let n = db
        .load_table(
            "t",
            &sc,
            &mut |sink| {
                for i in 0..20_000 {
                    sink(&row(i))?;
                }
                Ok(20_000)
            },
            &mut |c| reported.push(c),
        )
        .unwrap();
    assert_eq!(n, 20_000);
    assert!(reported.len() > 1 && reported.windows(2).all(|w| w[0] < w[1]) && *reported.last().unwrap() == 20_000, "{reported:?}");
    let t = db.table("t").unwrap();
    assert_rows(&db, &t, 20_000);
    let err = db.load_table("t", &Schema::parse("a:i64").unwrap(), &mut |_| Ok(0), &mut |_| {}).unwrap_err();
    assert!(err.to_string().contains("a:i64"), "{err}");
}

/// Three appenders (rows tagged with their thread, every fifth batch aborted) and two readers
/// at once through a pool far smaller than the table. Readers check at every moment: every
/// row below `rows()` (the committed rows) is readable and whole (its columns agree with each
/// other) and stays so at a second look, `rows()` never decreases, scans are dense and
/// ordered.
#[test]
fn appenders_and_readers_at_once() {
    let tmp = tempfile::tempdir().unwrap();
    let db = Arc::new(Database::create(config(tmp.path(), 192 << 10)).unwrap());
    let t = db.create_table("t", Schema::parse("thread:i64,seq:i64,check:str").unwrap()).unwrap();
    let tagged = |th: u64, seq: u64| vec![Value::I64(th as i64), Value::I64(seq as i64), Value::Str(format!("{th}/{seq}/{}", "z".repeat((seq % 50) as usize)))];
    let done = Arc::new(AtomicBool::new(false));
    let committed = Arc::new(AtomicU64::new(0));
    let mut readers = Vec::new();
    for r in 0..2u64 {
        let (db, t, done) = (db.clone(), t.clone(), done.clone());
        readers.push(std::thread::spawn(move || {
            let mut rng = SplitMix64(r + 100);
            let mut checks = 0u64;
            let mut last = 0;
            while !done.load(Ordering::Acquire) {
                let n = t.rows(db.buffer()).unwrap();
                assert!(n >= last, "rows() went back from {last} to {n}");
                last = n;
                if n > 0 {
                    let id = rng.below(n);
                    // Committed: there now and at any later look.
                    let got = t.get(db.buffer(), id).unwrap().unwrap_or_else(|| panic!("row {id} missing below the committed count {n}"));
                    let (Value::I64(th), Value::I64(seq)) = (&got[0], &got[1]) else { panic!("row {id}: {got:?}") };
                    assert_eq!(got, tagged(*th as u64, *seq as u64), "row {id} is not whole");
                    std::thread::yield_now();
                    assert_eq!(t.get(db.buffer(), id).unwrap().as_ref(), Some(&got), "row {id} changed or vanished");
                    checks += 1;
                }
                if rng.below(20) == 0 {
                    let mut next = 0;
                    t.scan(db.buffer(), 0, &mut |id, _| {
                        assert_eq!(id, next);
                        next += 1;
                        next < 2000
                    })
                    .unwrap();
                }
            }
            checks
        }));
    }
    let mut writers = Vec::new();
    for th in 0..3u64 {
        let (db, t, committed) = (db.clone(), t.clone(), committed.clone());
        writers.push(std::thread::spawn(move || {
            let mut seq = 0u64;
            let mut rng = SplitMix64(th);
            for b in 0..25 {
                let n = 1 + rng.below(60);
                let rows: Vec<_> = (seq..seq + n).map(|s| tagged(th, s)).collect();
                let mut tx = db.begin();
                tx.set_lock_wait(std::time::Duration::from_secs(30));
                t.append(&mut tx, &rows).unwrap();
                if b % 5 == 4 {
                    tx.abort().unwrap();
                    continue;
                }
                tx.commit().unwrap();
                seq += n;
                committed.fetch_add(n, Ordering::Relaxed);
            }
            seq
        }));
    }
    let per_thread: Vec<u64> = writers.into_iter().map(|w| w.join().unwrap()).collect();
    done.store(true, Ordering::Release);
    let checks: u64 = readers.into_iter().map(|r| r.join().unwrap()).sum();
    assert!(checks > 0);
    let total = committed.load(Ordering::Relaxed);
    assert_eq!(t.rows(db.buffer()).unwrap(), total);
    // Every committed row exactly once, each thread's rows in its order.
    let mut next_seq = [0u64; 3];
    t.scan(db.buffer(), 0, &mut |_, r| {
        let (Value::I64(th), Value::I64(seq)) = (&r[0], &r[1]) else { panic!() };
        assert_eq!(*seq as u64, next_seq[*th as usize], "thread {th}'s rows out of order");
        next_seq[*th as usize] += 1;
        true
    })
    .unwrap();
    assert_eq!(next_seq.to_vec(), per_thread);
    assert_eq!(db.check().unwrap().unreferenced_pages, 0);
}

/// Four appenders, a third of whose batches roll back (after holding their rows a while),
/// and six readers at once. Rows say whether their batch is doomed. Readers check that
/// `rows()` never decreases, never counts a row of a batch that had not begun to commit (it
/// stays at or below the end of the latest batch that called commit), is at least every
/// commit acknowledged before it was read, and that no row below it is a doomed one.
#[test]
fn readers_see_committed_rows_only() {
    let tmp = tempfile::tempdir().unwrap();
    let db = Arc::new(Database::create(config(tmp.path(), 256 << 10)).unwrap());
    let t = db.create_table("t", Schema::parse("thread:i64,seq:i64,doomed:bool").unwrap()).unwrap();
    let done = Arc::new(AtomicBool::new(false));
    // The end of the latest batch that called commit, and of the latest acknowledged one.
    let committing = Arc::new(AtomicU64::new(0));
    let acked = Arc::new(AtomicU64::new(0));
    let mut readers = Vec::new();
    for r in 0..6u64 {
        let (db, t, done, committing, acked) = (db.clone(), t.clone(), done.clone(), committing.clone(), acked.clone());
        readers.push(std::thread::spawn(move || {
            let mut rng = SplitMix64(r + 1000);
            let (mut last, mut checks) = (0u64, 0u64);
            while !done.load(Ordering::Acquire) {
                let floor = acked.load(Ordering::SeqCst);
                let n = t.rows(db.buffer()).unwrap();
                let ceiling = committing.load(Ordering::SeqCst);
                assert!(n >= last, "rows() went back from {last} to {n}");
                assert!(n >= floor, "rows() = {n} below an acknowledged commit ending at {floor}");
                assert!(n <= ceiling, "rows() = {n} counts rows of a batch that has not begun to commit (latest commit ends at {ceiling})");
                last = n;
                for id in [n.saturating_sub(1), rng.below(n.max(1))] {
                    if id >= n {
                        continue;
                    }
                    let row = t.get(db.buffer(), id).unwrap().unwrap_or_else(|| panic!("row {id} missing below the committed count {n}"));
                    assert_eq!(row[2], Value::Bool(false), "row {id} of a rolled-back batch seen below the committed count {n}: {row:?}");
                    checks += 1;
                }
            }
            checks
        }));
    }
    let mut writers = Vec::new();
    for th in 0..4u64 {
        let (db, t, committing, acked) = (db.clone(), t.clone(), committing.clone(), acked.clone());
        writers.push(std::thread::spawn(move || {
            let mut rng = SplitMix64(th + 7);
            let mut kept = 0u64;
            for seq in 0..30u64 {
                let doomed = rng.below(3) == 0;
                let n = 1 + rng.below(40);
                let rows: Vec<_> = (0..n).map(|_| vec![Value::I64(th as i64), Value::I64(seq as i64), Value::Bool(doomed)]).collect();
                let mut tx = db.begin();
                tx.set_lock_wait(std::time::Duration::from_secs(60));
                let ids = t.append(&mut tx, &rows).unwrap();
                // Hold the rows a while, for readers to (not) see them.
                std::thread::sleep(std::time::Duration::from_micros(200 + rng.below(800)));
                if doomed {
                    tx.abort().unwrap();
                    continue;
                }
                committing.fetch_max(ids.end, Ordering::SeqCst);
                tx.commit().unwrap();
                acked.fetch_max(ids.end, Ordering::SeqCst);
                kept += n;
            }
            kept
        }));
    }
    let kept: u64 = writers.into_iter().map(|w| w.join().unwrap()).sum();
    done.store(true, Ordering::Release);
    let checks: u64 = readers.into_iter().map(|r| r.join().unwrap()).sum();
    assert!(checks > 100, "only {checks} rows checked");
    assert_eq!(t.rows(db.buffer()).unwrap(), kept);
    assert_eq!(t.appended(db.buffer()).unwrap(), kept);
    let mut seen = 0;
    t.scan(db.buffer(), 0, &mut |_, r| {
        assert_eq!(r[2], Value::Bool(false));
        seen += 1;
        true
    })
    .unwrap();
    assert_eq!(seen, kept);
    db.check().unwrap();
}

/// A load in batches through the simulated filesystem, crashed at every sync point (three
/// ways): each image recovers to a table holding exactly the rows committed before the
/// crash, or those plus the batch in flight, and it verifies.
#[test]
fn every_crash_point_of_a_load_recovers_a_prefix() {
    let cfg =
        |be: SimBackend| Config::new("/db").pool_size(192 << 10).min_page(4096).wal_segment_size(64 << 10).checkpoint_every(48 << 10).backend(Arc::new(be));
    let be = SimBackend::new();
    let db = Database::create(cfg(be.clone())).unwrap();
    let t = db.create_table("t", schema()).unwrap();
    db.checkpoint().unwrap();
    let mut committed = vec![0u64];
    be.set_label(0);
    be.capture_at_syncs(1, 9, vec![CrashMode::DropUnsynced, CrashMode::KeepUnsynced, CrashMode::Torn { sector: 512 }]);
    let mut images = 0;
    let mut rng = SplitMix64(17);
    for b in 1..=16u64 {
        let start = *committed.last().unwrap();
        let n = 1 + rng.below(150);
        let rows: Vec<_> = (start..start + n).map(row).collect();
        let mut tx = db.begin();
        t.append(&mut tx, &rows).unwrap();
        tx.commit().unwrap();
        committed.push(start + n);
        be.set_label(b);
        for cap in be.take_captures() {
            images += 1;
            let db = Database::open(cfg(cap.image)).unwrap_or_else(|e| panic!("sync point {}: {e}", cap.sync_point));
            let t = db.table("t").unwrap();
            let n = t.rows(db.buffer()).unwrap();
            let l = cap.label as usize;
            assert!(
                n == committed[l] || committed.get(l + 1) == Some(&n),
                "sync point {}: {n} rows, committed {} or {:?}",
                cap.sync_point,
                committed[l],
                committed.get(l + 1)
            );
            assert_eq!(t.appended(db.buffer()).unwrap(), n, "sync point {}: every row left after recovery is committed", cap.sync_point);
            assert_rows(&db, &t, n);
            db.check().unwrap_or_else(|e| panic!("sync point {}: {e}", cap.sync_point));
            std::mem::forget(db);
        }
    }
    be.stop_capturing();
    assert!(images >= 60, "only {images} crash images");
    eprintln!("table crash consistency: 16 batches, {images} crash images recovered");
}

/// A load that meets a full disk (every data, log and metadata write fails with ENOSPC, as
/// the fault-injecting backend does) fails with the disk-full error; the database then
/// opens in its last durable state (the table with the rows of the commits reported, and
/// nothing else), verifies, and the same load succeeds once there is space again.
#[test]
fn a_load_that_meets_a_full_disk_loses_nothing_and_can_be_redone() {
    use strata::storage::{FaultyBackend, FileBackend};
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("db");
    let fb = Arc::new(FaultyBackend::new(Arc::new(FileBackend::default())));
    let faults = fb.faults.clone();
    let cfg = |be: Arc<FaultyBackend>| Config::new(&dir).pool_size(512 << 10).min_page(4096).backend(be);
    let db = Database::create(cfg(fb.clone())).unwrap();
    let sc = schema();
    let feed = |from: u64, to: u64| {
        move |sink: &mut dyn FnMut(&[Value]) -> Result<(), Error>| -> Result<u64, Error> {
            for i in from..to {
                sink(&row(i))?;
            }
            Ok(to - from)
        }
    };
    db.load_table("t", &sc, &mut feed(0, 3000), &mut |_| {}).unwrap();
    db.checkpoint().unwrap();
    // The disk fills up in the middle of the next load.
    let mut reported = vec![3000u64];
    let mut fed = 0u64;
    let err = db
        .load_table(
            "t",
            &sc,
            &mut |sink| {
                for i in 3000..40_000u64 {
                    if i == 9000 {
                        for e in [&faults.write_errno, &faults.meta_errno] {
                            e.store(libc::ENOSPC as u64, std::sync::atomic::Ordering::Relaxed);
                        }
                    }
                    sink(&row(i))?;
                    fed += 1;
                }
                Ok(fed)
            },
            &mut |c| reported.push(3000 + c),
        )
        .unwrap_err();
    assert!(err.to_string().contains("disk full"), "{err}");
    drop(db);
    // Space again: the database opens in its last durable state.
    for e in [&faults.write_errno, &faults.meta_errno] {
        e.store(0, std::sync::atomic::Ordering::Relaxed);
    }
    let db = Database::open(cfg(fb.clone())).unwrap();
    let t = db.table("t").unwrap();
    let n = t.rows(db.buffer()).unwrap();
    assert!(reported.contains(&n) || n == 3000, "{n} rows after the failed load; commits reported at {reported:?}");
    assert_rows(&db, &t, n);
    db.check().unwrap();
    // The rest loads now.
    db.load_table("t", &sc, &mut feed(n, 40_000), &mut |_| {}).unwrap();
    assert_rows(&db, &t, 40_000);
    assert_eq!(db.check().unwrap().unreferenced_pages, 0);
}

/// A row of a compressible table (TPC-H-like: keys, small counts, prices with cents,
/// dates, flags and comments), NULLs now and then.
fn lineitem_row(i: u64) -> Vec<Value> {
    let mut r = SplitMix64(i * 31 + 7);
    let mut v = vec![
        Value::I64(i as i64 / 4),
        Value::I64(1 + r.below(50) as i64),
        Value::F64((r.below(10_000_000) as f64) / 100.0),
        Value::F64([0.0, 0.04, 0.1, 1.0 / 3.0][r.below(4) as usize]),
        Value::Date(8000 + r.below(2500) as i32),
        Value::Str(["R", "A", "N"][r.below(3) as usize].into()),
        Value::Str(["DELIVER IN PERSON", "COLLECT COD", "NONE", "TAKE BACK RETURN"][r.below(4) as usize].into()),
        Value::Str(format!("comment {} of row {i}", "quickly ".repeat(r.below(5) as usize))),
        Value::Bool(r.below(2) == 0),
    ];
    if i % 97 == 5 {
        v[(i % 9) as usize] = Value::Null;
    }
    v
}

fn sql_rows(db: &Database, sql: &str) -> Vec<Vec<Value>> {
    let q = strata::sql::prepare_in(&db.catalog(), Some(db.buffer()), sql).unwrap();
    let mut out = Vec::new();
    q.execute(db.buffer(), &mut |row| {
        out.push(row.to_vec());
        Ok(true)
    })
    .unwrap();
    out
}

fn assert_lineitem(db: &Database, t: &Table, n: u64) {
    assert_eq!(t.rows(db.buffer()).unwrap(), n);
    let mut seen = 0;
    t.scan(db.buffer(), 0, &mut |id, r| {
        assert_eq!(id, seen, "scan out of order");
        assert_eq!(format!("{r:?}"), format!("{:?}", lineitem_row(id)), "row {id} by scan");
        seen += 1;
        true
    })
    .unwrap();
    assert_eq!(seen, n);
    for id in (0..n).step_by(13).chain(n.saturating_sub(3)..n) {
        let got = t.get(db.buffer(), id).unwrap().unwrap();
        assert_eq!(format!("{got:?}"), format!("{:?}", lineitem_row(id)), "row {id} by id");
    }
    assert_eq!(t.get(db.buffer(), n).unwrap(), None);
    // SQL (the vectorized scan, decoding only the columns it needs) sees the same rows.
    let want_qty: i64 = (0..n).filter_map(|i| if let Value::I64(q) = lineitem_row(i)[1] { Some(q) } else { None }).sum();
    let want_r = (0..n).filter(|&i| lineitem_row(i)[5] == Value::Str("R".into())).count() as i64;
    let got = sql_rows(db, "SELECT sum(qty), count(*) FROM li");
    assert_eq!(got, vec![vec![Value::I64(want_qty), Value::I64(n as i64)]]);
    let got = sql_rows(db, "SELECT count(*) FROM li WHERE flag = 'R'");
    assert_eq!(got, vec![vec![Value::I64(want_r)]]);
    let got = sql_rows(db, "SELECT id, price, comment FROM li WHERE id = 7");
    let want: Vec<_> = (0..n)
        .filter(|&i| i / 4 == 7 && lineitem_row(i)[0] != Value::Null)
        .map(|i| vec![Value::I64(7), lineitem_row(i)[2].clone(), lineitem_row(i)[7].clone()])
        .collect();
    assert_eq!(format!("{got:?}"), format!("{want:?}"));
}

#[test]
fn large_imports_are_packed_and_read_back_like_plain_leaves() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("db");
    let cfg = || Config::new(&dir).pool_size(4 << 20).min_page(16384);
    let db = Database::create(cfg()).unwrap();
    let schema = Schema::parse("id:i64,qty:i64,price:f64,disc:f64,ship:date,flag:str,instr:str,comment:str,ok:bool").unwrap();
    let t = db.create_table("li", schema).unwrap();
    let mut next = 0u64;
    // Single rows (in place), batches crossing leaves, a large batch, single rows again.
    for batch in [1, 1, 1, 37, 500, 3000, 1, 1, 20_000, 250, 1, 7000, 1] {
        let rows: Vec<_> = (next..next + batch).map(lineitem_row).collect();
        let mut tx = db.begin();
        assert_eq!(t.append(&mut tx, &rows).unwrap(), next..next + batch);
        tx.commit().unwrap();
        next += batch;
    }
    assert_lineitem(&db, &t, next);
    db.check().unwrap();
    let (packed, all) = t.packed_leaves(db.buffer()).unwrap();
    assert!(packed * 10 >= all * 8, "most leaves are packed: {packed} of {all}");
    // Packing beats plain leaves by far on this data.
    let plain_rows_per_leaf = strata::access::table::pax::plan(&t.schema, 16384 - 32, &(0..2000).map(lineitem_row).collect::<Vec<_>>()).0 as u64;
    assert!(next / all > 2 * plain_rows_per_leaf, "{} rows per leaf, plain {plain_rows_per_leaf}", next / all);
    db.close().unwrap();
    let db = Database::open(cfg()).unwrap();
    let t = db.table("li").unwrap();
    assert_lineitem(&db, &t, next);
    // A rolled-back append that repacked the last leaf leaves it as it was.
    let mut tx = db.begin();
    t.append(&mut tx, &(next..next + 5000).map(lineitem_row).collect::<Vec<_>>()).unwrap();
    tx.abort().unwrap();
    assert_lineitem(&db, &t, next);
    db.check().unwrap();
    append_li(&db, &t, next, 900);
    assert_lineitem(&db, &t, next + 900);
    db.check().unwrap();
}

fn append_li(db: &Database, t: &Table, from: u64, n: u64) {
    let mut tx = db.begin();
    t.append(&mut tx, &(from..from + n).map(lineitem_row).collect::<Vec<_>>()).unwrap();
    tx.commit().unwrap();
}

/// Packed leaves get a column directory in a database of format version 2 (what this build
/// creates), and none in one of version 1 (which builds that know only version 1 read):
/// appending to an old database keeps its format. Both read back every row, and
/// `check` passes both.
#[test]
fn packed_leaves_follow_the_databases_format_version() {
    use strata::access::table::packed;
    use strata::storage::meta::{Meta, FORMAT_VERSION};
    assert_eq!(FORMAT_VERSION, 2);
    for version in [1, 2] {
        let dir = tempfile::tempdir().unwrap();
        let cfg = || Config::new(dir.path()).pool_size(8 << 20);
        Database::create(cfg()).unwrap().close().unwrap();
        if version == 1 {
            let be = strata::storage::FileBackend::default();
            let meta = Meta::load(&be, dir.path()).unwrap();
            Meta { version: 1, ..meta }.store(&be, dir.path()).unwrap();
        }
        let db = Database::open(cfg()).unwrap();
        assert_eq!(db.buffer().format_version(), version);
        let t = db.create_table("t", schema()).unwrap();
        append_range(&db, &t, 0..3000, 1000);
        let (mut with, mut without) = (0, 0);
        t.check(db.buffer(), &mut |pid| {
            let g = db.buffer().fix_shared(pid).unwrap();
            if let Ok(h) = packed::header(g.data(), &t.schema) {
                if h.dir {
                    with += 1;
                } else {
                    without += 1;
                }
            }
        })
        .unwrap();
        if version == 1 {
            assert!(with == 0 && without > 3, "version 1: {with} leaves with a directory, {without} without");
        } else {
            assert!(without == 0 && with > 3, "version 2: {with} leaves with a directory, {without} without");
        }
        for i in (0..3000).step_by(97) {
            assert_eq!(t.get(db.buffer(), i).unwrap(), Some(row(i)), "version {version}, row {i}");
        }
        // A scan of some columns (leaves opened for those only), filtered on another.
        let want: Vec<Vec<Value>> = (0..3000).map(row).filter(|r| matches!(r[3], Value::Bool(true))).map(|r| vec![r[0].clone(), r[4].clone()]).collect();
        let q = strata::sql::prepare_in(&db.catalog(), Some(db.buffer()), "SELECT id, name FROM t WHERE flag").unwrap();
        let mut got = Vec::new();
        q.execute(db.buffer(), &mut |r| {
            got.push(r.to_vec());
            Ok(true)
        })
        .unwrap();
        assert_eq!(got, want, "version {version}");
        db.close().unwrap();
        // The version stays what it was.
        assert_eq!(Database::open(cfg()).unwrap().buffer().format_version(), version);
    }
}
