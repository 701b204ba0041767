//! Bounded fuzzing of everything strata reads back from a database directory (issue 17,
//! item 1): the meta file, catalog, allocation table, log segments and records, the
//! checkpoint record, the double-write area and data pages. Valid files of a small database
//! (a column, a key-value tree, a table, committed and in-flight transactions) are damaged
//! (bit flips, overwritten words, truncation, extension) and then (1) fed to the decoders
//! and (2) opened, recovered and checked as a database. Every outcome must be a value or a
//! typed error: no panic. A fixed seed; `STRATA_FUZZ_FILE_CASES` sets the number of
//! damaged databases (default 400).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use strata::access::catalog::Catalog;
use strata::access::table::{Schema, Value};
use strata::access::ValueFormat;
use strata::storage::wal::record;
use strata::storage::{page, AllocTable, Meta, PageId};
use strata::util::SplitMix64;
use strata::{Config, Database};

fn config(dir: &Path) -> Config {
    Config::new(dir).pool_size(1 << 20).min_page(4096)
}

/// A small database with every kind of object, closed, plus a committed and an in-flight
/// transaction after its last checkpoint (so the log and double-write area hold data).
fn build(dir: &Path) {
    let db = Database::create(config(dir)).unwrap();
    let values: Vec<u8> = (0..20_000u32).flat_map(|v| v.to_le_bytes()).collect();
    db.import("c", ValueFormat::parse("u32le").unwrap(), &mut values.as_slice(), values.len() as u64, &mut |_| {}).unwrap();
    let tree = db.create_tree("kv").unwrap();
    let table = db.create_table("t", Schema::parse("a:i64,s:str,d:date").unwrap()).unwrap();
    let mut tx = db.begin();
    for i in 0..300u64 {
        tree.insert(&mut tx, &i.to_be_bytes(), &vec![i as u8; (i % 90) as usize]).unwrap();
    }
    let rows: Vec<_> = (0..400).map(|i| vec![Value::I64(i), Value::Str(format!("row {i} {}", "s".repeat((i % 30) as usize))), Value::Date(i as i32)]).collect();
    table.append(&mut tx, &rows).unwrap();
    tx.commit().unwrap();
    db.checkpoint().unwrap();
    let mut tx = db.begin();
    for i in 300..400u64 {
        tree.insert(&mut tx, &i.to_be_bytes(), b"after the checkpoint").unwrap();
    }
    tx.commit().unwrap();
    let mut tx = db.begin();
    table.append(&mut tx, &rows[..50]).unwrap();
    std::mem::forget(tx);
    db.crash();
}

fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.file_name().is_some_and(|n| n != "lock") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), &target).unwrap();
        }
    }
}

/// Damages `bytes` in one to four ways.
fn damage(r: &mut SplitMix64, bytes: &mut Vec<u8>) {
    for _ in 0..1 + r.below(4) {
        if bytes.is_empty() {
            bytes.extend((0..1 + r.below(64)).map(|_| r.below(256) as u8));
            continue;
        }
        let len = bytes.len() as u64;
        match r.below(6) {
            0 | 1 => {
                let bit = r.below(len * 8);
                bytes[(bit / 8) as usize] ^= 1 << (bit % 8);
            }
            2 => {
                // A length or offset field: the first 64 bytes hold most of them.
                let at = r.below(len.min(64)) as usize & !3;
                let v = [0u32, 1, u32::MAX, r.next_u64() as u32, 4096][r.below(5) as usize];
                let end = (at + 4).min(bytes.len());
                bytes[at..end].copy_from_slice(&v.to_le_bytes()[..end - at]);
            }
            3 => bytes.truncate(r.below(len) as usize),
            4 => bytes.extend((0..1 + r.below(100)).map(|_| r.below(256) as u8)),
            _ => {
                let at = r.below(len) as usize;
                bytes[at] = r.below(256) as u8;
            }
        }
    }
}

/// The decoders, directly, on damaged copies of each file's bytes.
#[test]
fn decoders_take_damaged_bytes_without_panicking() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("db");
    build(&dir);
    let read = |name: &str| std::fs::read(dir.join(name)).unwrap();
    let (meta, catalog, alloc) = (read("strata.meta"), read("catalog.json"), read("alloc.table"));
    let segments: Vec<Vec<u8>> = files(&dir.join("wal")).iter().map(|p| std::fs::read(p).unwrap()).filter(|b| !b.is_empty()).collect();
    assert!(!segments.is_empty(), "the log holds records after the last checkpoint");
    let pages = read("class-00.pages");
    let mut r = SplitMix64(2024);
    let p = Path::new("x");
    for i in 0..4000 {
        let mut m = meta.clone();
        damage(&mut r, &mut m);
        let _ = Meta::decode(&m, p);
        let mut c = catalog.clone();
        damage(&mut r, &mut c);
        let _ = Catalog::decode(&c, p);
        let mut a = alloc.clone();
        damage(&mut r, &mut a);
        let _ = AllocTable::decode(&a, 1 + (i % 30), p);
        // Log records: walk a damaged segment as recovery does, record by record.
        let mut s = segments[i % segments.len()].clone();
        damage(&mut r, &mut s);
        let mut at = 0usize;
        while at < s.len() {
            match record::decode(&s[at..], at as u64) {
                Ok(_) => at += record::claimed_len(&s[at..]).unwrap(),
                Err(_) => break,
            }
        }
        // A data page (4 KiB) with damage kept inside it.
        let n = pages.len() / 4096;
        let k = r.below(n as u64) as usize;
        let mut img = pages[k * 4096..(k + 1) * 4096].to_vec();
        damage(&mut r, &mut img);
        img.resize(4096, 0);
        let _ = page::verify(&img, PageId::new(0, false, k as u64));
    }
}

/// Whole databases with one damaged file: opening (which recovers) and checking them gives
/// a database or a typed error, never a panic.
#[test]
fn damaged_databases_open_or_fail_cleanly() {
    let cases: u64 = std::env::var("STRATA_FUZZ_FILE_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(400);
    let t = tempfile::tempdir().unwrap();
    let good = t.path().join("good");
    build(&good);
    let targets = files(&good);
    let mut r = SplitMix64(7);
    let (mut opened, mut refused) = (0, 0);
    for case in 0..cases {
        let dir = t.path().join(format!("case-{case}"));
        copy_dir(&good, &dir);
        let rel = targets[r.below(targets.len() as u64) as usize].strip_prefix(&good).unwrap().to_path_buf();
        let path = dir.join(&rel);
        let mut bytes = std::fs::read(&path).unwrap();
        damage(&mut r, &mut bytes);
        std::fs::write(&path, &bytes).unwrap();
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            let db = Database::open(config(&dir))?;
            let report = db.check();
            if let Ok(t) = db.table("t") {
                let _ = t.get(db.buffer(), 10);
            }
            db.crash();
            report.map(|_| ())
        }));
        match outcome {
            Err(_) => panic!("case {case}: damaging {} made strata panic (kept in {})", rel.display(), dir.display()),
            Ok(Ok(())) => opened += 1,
            Ok(Err(_)) => refused += 1,
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
    eprintln!("damaged databases: {cases} cases, {opened} opened and checked, {refused} refused with an error");
    assert!(refused > 0, "no damage was ever noticed: the cases do not reach the decoders");
}
