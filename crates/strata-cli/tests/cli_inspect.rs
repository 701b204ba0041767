//! Inspection that never writes, through the binary: `stats`, `check`, `dump alloc-table` and
//! `dump page` leave every file's bytes and modification time unchanged (and create nothing),
//! share the database with each other and refuse to run while recovery is pending (a crash
//! left work in the log), which `strata recover` does. `stats --json` counts every allocated
//! page; `dump alloc-table` lists allocated and free ranges; `dump page` verifies a page or
//! says what is wrong with it, never panicking on a damaged page or a bad id.

use std::collections::BTreeMap;
use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::SystemTime;

use serde_json::Value;

mod common;
use common::{fails, json, ok, p, strata};

/// Every file and directory under `dir` with its bytes (files) and modification time.
type Snapshot = BTreeMap<PathBuf, (Option<Vec<u8>>, SystemTime)>;

fn snapshot(dir: &Path) -> Snapshot {
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

fn assert_unchanged(before: &Snapshot, dir: &Path, what: &str) {
    let after = snapshot(dir);
    for (path, (bytes, mtime)) in before {
        match after.get(path) {
            None => panic!("{what} removed {}", path.display()),
            Some((b, m)) => {
                assert!(b == bytes, "{what} changed the bytes of {}", path.display());
                assert_eq!(m, mtime, "{what} changed the modification time of {}", path.display());
            }
        }
    }
    let created: Vec<_> = after.keys().filter(|k| !before.contains_key(*k)).collect();
    assert!(created.is_empty(), "{what} created {created:?}");
}

/// Writes `n` little-endian u64 values to `path`.
fn write_values(path: &Path, n: u64) {
    let bytes: Vec<u8> = (0..n).flat_map(|i| (i.wrapping_mul(0x9E37_79B9_7F4A_7C15)).to_le_bytes()).collect();
    fs::write(path, bytes).unwrap();
}

/// A database with 4 KiB pages and column `v` of `n` u64 values (508 per page).
fn database(t: &Path, n: u64) -> PathBuf {
    let db = t.join("db");
    let input = t.join("v.u64");
    write_values(&input, n);
    ok(&["create", p(&db), "--min-page", "4KiB"]);
    ok(&["import", p(&db), "v", "--from", p(&input), "--format", "u64le"]);
    db
}

/// Every read-only command, text and JSON.
fn read_only_commands(db: &Path) -> Vec<Vec<String>> {
    let d = p(db).to_owned();
    let v = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    vec![
        v(&["stats", &d]),
        v(&["stats", &d, "--json"]),
        v(&["check", &d]),
        v(&["check", &d, "--json"]),
        v(&["dump", "alloc-table", &d]),
        v(&["dump", "alloc-table", &d, "--json"]),
        v(&["dump", "page", &d, "c0:0"]),
        v(&["dump", "page", &d, "1", "--json"]),
    ]
}

fn args(a: &[String]) -> Vec<&str> {
    a.iter().map(String::as_str).collect()
}

#[test]
fn stats_check_and_dump_never_change_the_database() {
    let t = tempfile::tempdir().unwrap();
    let db = database(t.path(), 5000);
    let before = snapshot(&db);
    for cmd in read_only_commands(&db) {
        ok(&args(&cmd));
        assert_unchanged(&before, &db, &format!("strata {cmd:?}"));
    }
    // Twice in a row: reading does not prepare anything for the next reader either.
    for cmd in read_only_commands(&db) {
        ok(&args(&cmd));
    }
    assert_unchanged(&before, &db, "the read-only commands, run again");
    // A refused command (bad page id, unallocated page) writes nothing either.
    fails(&["dump", "page", p(&db), "c0:999"]);
    fails(&["dump", "page", p(&db), "nonsense"]);
    assert_unchanged(&before, &db, "refused dump page");
}

/// Opens `db` in this process and allocates pages of two classes, freeing some, so that the
/// allocation has holes: returns (class 0 pages, class 1 pages) allocated.
fn add_loose_pages(db: &Path) -> (Vec<strata::PageId>, Vec<strata::PageId>) {
    let d = strata::Database::open(strata::Config::new(db).pool_size(1 << 20)).unwrap();
    let bm = d.buffer();
    let alloc = |bytes: usize, n: usize| -> Vec<strata::PageId> {
        (0..n)
            .map(|i| {
                let mut g = bm.alloc(bytes).unwrap();
                g.write_u64(0, i as u64);
                g.pid()
            })
            .collect()
    };
    let small = alloc(3000, 5);
    let big = alloc(6000, 3);
    bm.free(small[1]).unwrap();
    bm.free(small[3]).unwrap();
    bm.free(big[0]).unwrap();
    d.close().unwrap();
    (small, big)
}

#[test]
fn stats_counts_every_allocated_page_and_dump_alloc_table_lists_the_ranges() {
    let t = tempfile::tempdir().unwrap();
    // 5000 values: 10 pages of class 0 (0..9).
    let db = database(t.path(), 5000);
    let table = json(&["dump", "alloc-table", p(&db), "--json"]);
    assert_eq!(table["pages_allocated"], 10);
    assert_eq!(table["classes"].as_array().unwrap().len(), 1);
    let c0 = &table["classes"][0];
    assert_eq!((c0["class"].as_u64(), c0["page_size"].as_u64(), c0["pages_allocated"].as_u64()), (Some(0), Some(4096), Some(10)));
    assert_eq!(c0["allocated"], serde_json::json!([[0, 9]]));
    assert_eq!(c0["free"], serde_json::json!([]));
    assert_eq!(c0["high_water"], 10);
    let text = ok(&["dump", "alloc-table", p(&db)]);
    assert!(text.contains("allocated: 0..9") && text.contains("free:      none"), "{text}");

    let (small, big) = add_loose_pages(&db);
    assert_eq!(small.iter().map(|p| (p.class(), p.index())).collect::<Vec<_>>(), vec![(0, 10), (0, 11), (0, 12), (0, 13), (0, 14)]);
    assert_eq!(big.iter().map(|p| (p.class(), p.index())).collect::<Vec<_>>(), vec![(1, 0), (1, 1), (1, 2)]);
    // Class 0: the column's 10 pages and 10, 12, 14 (11 and 13 freed); class 1: 1 and 2.
    let stats = json(&["stats", p(&db), "--json"]);
    assert_eq!(stats["pages_allocated"], 15, "the total number of allocated pages, not the number of classes: {stats}");
    assert_eq!(stats["total_pages_allocated"], 15);
    let per_class: Vec<u64> = stats["classes"].as_array().unwrap().iter().map(|c| c["pages_allocated"].as_u64().unwrap()).collect();
    assert_eq!(per_class, vec![13, 2]);
    let table = json(&["dump", "alloc-table", p(&db), "--json"]);
    assert_eq!(table["pages_allocated"], 15);
    let classes: Vec<&Value> = table["classes"].as_array().unwrap().iter().collect();
    assert_eq!(classes.len(), 2);
    assert_eq!(classes[0]["allocated"], serde_json::json!([[0, 10], [12, 12], [14, 14]]));
    assert_eq!(classes[0]["free"], serde_json::json!([[11, 11], [13, 13]]));
    assert_eq!((classes[0]["pages_allocated"].as_u64(), classes[0]["high_water"].as_u64()), (Some(13), Some(15)));
    assert_eq!((classes[1]["class"].as_u64(), classes[1]["page_size"].as_u64()), (Some(1), Some(8192)));
    assert_eq!(classes[1]["allocated"], serde_json::json!([[1, 2]]));
    assert_eq!(classes[1]["free"], serde_json::json!([[0, 0]]));
    for c in &classes {
        assert!(c["file_pages"].as_u64().unwrap() >= c["high_water"].as_u64().unwrap(), "{c}");
    }
    let text = ok(&["dump", "alloc-table", p(&db)]);
    assert!(text.contains("allocated: 0..10, 12, 14") && text.contains("free:      11, 13"), "{text}");
    assert!(text.contains("allocated: 1..2") && text.contains("free:      0\n"), "{text}");
    // check agrees: 15 pages verified, the 5 loose ones unreferenced.
    let check = json(&["check", p(&db), "--json"]);
    assert_eq!((check["report"]["pages_verified"].as_u64(), check["report"]["unreferenced_pages"].as_u64()), (Some(15), Some(5)));
}

const PENDING: &str = "needs recovery";

/// Every read-only command is refused with the one-line recovery-pending error, and changes
/// nothing.
fn assert_all_refuse_pending(db: &Path) {
    let before = snapshot(db);
    for cmd in read_only_commands(db) {
        let err = fails(&args(&cmd));
        assert!(err.contains(PENDING) && err.contains(&format!("strata recover {}", p(db))), "strata {cmd:?}: {err}");
    }
    assert_unchanged(&before, db, "a read-only command refused for pending recovery");
}

#[test]
fn after_a_crash_inspection_refuses_and_recover_fixes_it() {
    let t = tempfile::tempdir().unwrap();
    let db = database(t.path(), 5000);
    // A crash with committed work and an unfinished transaction in the log (durable: the
    // commit's flush takes the whole log tail).
    let loser_page = {
        let d = strata::Database::open(strata::Config::new(&db).pool_size(1 << 20)).unwrap();
        let tree = d.create_tree("t").unwrap();
        let mut loser = d.begin();
        let page = loser.alloc(100).unwrap();
        loser.write_u64(page, 0, 1).unwrap();
        let mut tx = d.begin();
        tree.insert(&mut tx, b"k", b"committed").unwrap();
        tx.commit().unwrap();
        std::mem::forget(loser);
        d.crash();
        page
    };
    let wal: u64 = fs::read_dir(db.join("wal"))
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".log"))
        .map(|e| e.metadata().unwrap().len())
        .sum();
    assert!(wal > 0, "the crash left the log non-empty");
    assert_all_refuse_pending(&db);

    let r = json(&["recover", p(&db), "--json"]);
    assert_eq!((r["op"].as_str(), r["recovered"].as_bool()), (Some("recover"), Some(true)), "{r}");
    assert!(r["log_records"].as_u64().unwrap() > 0 && r["redone"].as_u64().is_some(), "{r}");
    assert_eq!(r["rolled_back"], 1, "{r}");
    // Now everything reads, and still writes nothing.
    let before = snapshot(&db);
    for cmd in read_only_commands(&db) {
        ok(&args(&cmd));
    }
    assert_unchanged(&before, &db, "the read-only commands after recover");
    let check = json(&["check", p(&db), "--json"]);
    assert_eq!(check["report"]["trees"]["t"]["entries"], 1, "{check}");
    let e = fails(&["dump", "page", p(&db), &loser_page.to_string()]);
    assert!(e.contains("not allocated"), "the rolled-back allocation is free again: {e}");
    // A second recover has nothing to do.
    let r = json(&["recover", p(&db), "--json"]);
    assert_eq!((r["recovered"].as_bool(), r["log_records"].as_u64()), (Some(false), Some(0)), "{r}");
    let text = ok(&["recover", p(&db)]);
    assert!(text.contains("nothing to recover"), "{text}");
}

#[test]
fn a_killed_writer_process_leaves_recovery_to_recover() {
    let t = tempfile::tempdir().unwrap();
    let db = t.path().join("bank");
    // No checkpoint after the bank is set up: every commit stays in the log.
    let mut child = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["torture", "run", p(&db), "--pool", "4MiB", "--accounts", "64", "--threads", "2", "--checkpoint-every", "1GiB"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn strata torture run");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut commits = 0;
    while commits < 20 {
        match lines.next() {
            Some(Ok(l)) if l.starts_with("committed ") => commits += 1,
            Some(Ok(_)) => {}
            _ => break,
        }
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    assert_eq!(commits, 20, "torture run stopped before 20 commits");
    assert_all_refuse_pending(&db);
    let r = json(&["recover", p(&db), "--json"]);
    assert_eq!(r["recovered"], true, "{r}");
    ok(&["stats", p(&db)]);
    assert_eq!(json(&["check", p(&db), "--json"])["ok"], true);
    let v = json(&["torture", "verify", p(&db), "--json"]);
    assert_eq!(v["ok"], true, "{v}");
}

#[test]
fn readers_run_together_and_a_writer_is_refused_while_they_do() {
    let t = tempfile::tempdir().unwrap();
    let db = database(t.path(), 5000);
    let input = t.path().join("w.u64");
    write_values(&input, 100);
    let before = snapshot(&db);
    // This process holds a read-only open (a shared lock), as a running `strata check` would.
    let reader = strata::Database::open_read_only(strata::Config::new(&db).pool_size(1 << 20)).unwrap();
    // Other readers run beside it, several at once.
    let children: Vec<_> = read_only_commands(&db)
        .into_iter()
        .chain(read_only_commands(&db))
        .map(|cmd| {
            let child = Command::new(env!("CARGO_BIN_EXE_strata")).args(&cmd).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
            (cmd, child)
        })
        .collect();
    for (cmd, child) in children {
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "strata {cmd:?} beside a reader: {}", String::from_utf8_lossy(&out.stderr));
    }
    // A writer is refused while a reader holds the database, and changes nothing.
    for cmd in [
        vec!["import", p(&db), "w", "--from", p(&input), "--format", "u64le"],
        vec!["recover", p(&db)],
        vec!["query", p(&db), "--pool", "1MiB", "scan", "v", "--gt", "0"],
    ] {
        let err = fails(&cmd);
        assert!(err.contains("in use by read-only processes") && err.contains(p(&db)), "strata {cmd:?}: {err}");
    }
    assert_unchanged(&before, &db, "readers and refused writers");
    drop(reader);
    // Released: the writer runs.
    ok(&["import", p(&db), "w", "--from", p(&input), "--format", "u64le"]);
    assert_eq!(json(&["stats", p(&db), "--json"])["columns"]["w"]["values"], 100);
}

#[test]
fn a_reader_is_refused_while_a_writer_holds_the_database() {
    let t = tempfile::tempdir().unwrap();
    let db = database(t.path(), 1000);
    let writer = strata::Database::open(strata::Config::new(&db).pool_size(1 << 20)).unwrap();
    let before = snapshot(&db);
    for cmd in read_only_commands(&db) {
        let err = fails(&args(&cmd));
        assert!(err.contains(&format!("in use by process {}", std::process::id())), "strata {cmd:?}: {err}");
    }
    assert_unchanged(&before, &db, "readers refused by a writer");
    writer.close().unwrap();
    ok(&["stats", p(&db)]);
}

fn page_json(db: &Path, id: &str) -> Value {
    json(&["dump", "page", p(db), id, "--json"])
}

#[test]
fn dump_page_verifies_good_pages_and_reports_damaged_ones() {
    let t = tempfile::tempdir().unwrap();
    let db = database(t.path(), 5000);
    let good = page_json(&db, "c0:3");
    assert_eq!(
        (good["ok"].as_bool(), good["checksum_ok"].as_bool(), good["magic_ok"].as_bool(), good["id_ok"].as_bool()),
        (Some(true), Some(true), Some(true), Some(true))
    );
    assert_eq!((good["page"].as_str(), good["raw"].as_u64(), good["class"].as_u64(), good["index"].as_u64()), (Some("c0:3"), Some(3), Some(0), Some(3)));
    assert_eq!((good["offset"].as_u64(), good["page_size"].as_u64(), good["bytes_on_disk"].as_u64()), (Some(3 * 4096), Some(4096), Some(4096)));
    assert_eq!(good["header"]["page_id"], "c0:3");
    assert_eq!(good["header"]["checksum"], good["computed_checksum"]);
    assert_eq!(good["header"]["magic"], u32::from_le_bytes(*b"SPG1"));
    assert!(good["fault"].is_null());
    // The same page by its raw id, decimal and hexadecimal.
    assert_eq!(page_json(&db, "3"), good);
    assert_eq!(page_json(&db, "0x3"), good);
    let text = ok(&["dump", "page", p(&db), "c0:3"]);
    assert!(text.contains("page c0:3") && text.contains("verifies: yes") && text.contains("lsn"), "{text}");

    let data = db.join("class-00.pages");
    let pristine = fs::read(&data).unwrap();
    // A flipped payload byte: the checksum no longer matches.
    let mut bytes = pristine.clone();
    bytes[3 * 4096 + 1000] ^= 0x40;
    fs::write(&data, &bytes).unwrap();
    let before = snapshot(&db);
    let bad = page_json(&db, "c0:3");
    assert_eq!((bad["ok"].as_bool(), bad["checksum_ok"].as_bool(), bad["id_ok"].as_bool()), (Some(false), Some(false), Some(true)), "{bad}");
    assert!(bad["fault"].as_str().unwrap().contains("checksum mismatch"), "{bad}");
    assert_eq!(bad["header"]["checksum"], good["header"]["checksum"], "the stored checksum is shown as stored");
    let text = ok(&["dump", "page", p(&db), "c0:3"]);
    assert!(text.contains("verifies: no: checksum mismatch") && text.contains("BAD"), "{text}");
    assert_eq!(page_json(&db, "c0:4")["ok"], true, "its neighbour is fine");
    assert_unchanged(&before, &db, "dump page of a damaged page");
    let e = fails(&["check", p(&db)]);
    assert!(e.contains("checksum") && e.contains("c0:3"), "{e}");

    // Page 4's intact image in page 3's slot: it verifies as a page, but it is another one.
    let mut bytes = pristine.clone();
    bytes.copy_within(4 * 4096..5 * 4096, 3 * 4096);
    fs::write(&data, &bytes).unwrap();
    let moved = page_json(&db, "c0:3");
    assert_eq!((moved["ok"].as_bool(), moved["checksum_ok"].as_bool(), moved["id_ok"].as_bool()), (Some(false), Some(true), Some(false)), "{moved}");
    assert_eq!(moved["header"]["page_id"], "c0:4");
    assert!(moved["fault"].as_str().unwrap().contains("names another page"), "{moved}");

    // A data file that ends inside the last page.
    let mut bytes = pristine;
    bytes.truncate(9 * 4096 + 100);
    fs::write(&data, &bytes).unwrap();
    let short = page_json(&db, "c0:9");
    assert_eq!((short["ok"].as_bool(), short["bytes_on_disk"].as_u64()), (Some(false), Some(100)), "{short}");
    assert!(short["fault"].as_str().unwrap().contains("data file ends 100 bytes into the page"), "{short}");
    let beyond = page_json(&db, "c0:8");
    assert_eq!(beyond["ok"], true);
}

#[test]
fn bad_page_ids_are_one_line_errors() {
    let t = tempfile::tempdir().unwrap();
    let db = database(t.path(), 5000);
    for (id, want) in [
        ("c0:10", "not allocated"),
        ("c0:999999", "not allocated"),
        ("10", "not allocated"),
        ("c1:0", "not allocated"),
        ("t0:1", "temporary pages"),
        ("c40:0", "no such size class"),
        ("c63:144115188075855871", "no such size class"),
        ("c64:0", "class must be below 64"),
        ("c0:144115188075855872", "index must be at most"),
        ("18446744073709551615", "temporary pages"),
        ("c0", "is not a page id"),
        ("c0:", "is not a page id"),
        ("0:3", "is not a page id"),
        ("c0:3x", "is not a page id"),
        ("-1", "is not a page id"),
        ("0xZZ", "is not a page id"),
        ("", "is not a page id"),
    ] {
        let out = strata(&["dump", "page", p(&db), id]);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(1), "dump page {id:?}: a clean failure, not a panic: {err}");
        assert_eq!(err.trim().lines().count(), 1, "one-line error expected: {err}");
        assert!(err.contains(want), "dump page {id:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    // Not a database at all.
    let e = fails(&["dump", "page", p(t.path()), "c0:0"]);
    assert!(e.contains("is not a strata database"), "{e}");
    let e = fails(&["dump", "alloc-table", p(&t.path().join("missing"))]);
    assert!(e.contains("is not a strata database"), "{e}");
    assert!(!t.path().join("missing").exists(), "inspection created the directory");
}

/// Unmounts a test filesystem however the test ends.
struct Mounted(PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

fn run_quiet(cmd: &mut Command) -> bool {
    cmd.stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success())
}

#[test]
fn read_only_commands_work_on_a_read_only_filesystem() {
    let t = tempfile::tempdir().unwrap();
    let db = database(t.path(), 5000);
    let mnt = t.path().join("ro");
    fs::create_dir(&mnt).unwrap();
    if !run_quiet(Command::new("mount").args(["-t", "tmpfs", "-o", "size=16m", "tmpfs", p(&mnt)])) {
        println!("skipped: cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN)");
        return;
    }
    let _mounted = Mounted(mnt.clone());
    let copy = mnt.join("db");
    assert!(run_quiet(Command::new("cp").args(["-a", p(&db), p(&copy)])));
    assert!(run_quiet(Command::new("mount").args(["-o", "remount,ro", p(&mnt)])), "remount read-only");
    for cmd in read_only_commands(&copy) {
        ok(&args(&cmd));
    }
    assert_eq!(json(&["stats", p(&copy), "--json"])["columns"]["v"]["values"], 5000);
    // A writer cannot work there, and says why in one line.
    let e = fails(&["recover", p(&copy)]);
    assert!(e.contains("Read-only file system"), "{e}");
}
