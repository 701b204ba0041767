//! End-to-end tests of the `strata` binary: the command-line contract, bad input, and the
//! memory cap measured on the real process.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

mod common;
use common::{fails, json, ok, p};

fn read_u32s(path: &Path) -> Vec<u32> {
    std::fs::read(path).unwrap().chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect()
}

#[test]
fn create_import_scan_check_stats_round_trip() {
    let t = tempfile::tempdir().unwrap();
    let db = t.path().join("db");
    let input = t.path().join("v.u32");
    ok(&["gen", "ints", "--count", "300000", "--seed", "7", "--out", p(&input), "--max", "1000000"]);
    ok(&["create", p(&db), "--min-page", "4KiB"]);
    fails(&["create", p(&db)]);
    // Two imports append.
    ok(&["import", p(&db), "v", "--from", p(&input), "--format", "u32le", "--pool", "1MiB"]);
    ok(&["import", p(&db), "v", "--from", p(&input), "--format", "u32le", "--pool", "1MiB"]);
    let vals = read_u32s(&input);
    for (gt, threads) in [(-1i64, "1"), (500_000, "3"), (999_999, "2")] {
        let out = json(&["query", p(&db), "--pool", "512KiB", "--threads", threads, "--json", "scan", "v", "--gt", &gt.to_string()]);
        let want: Vec<u64> = vals.iter().map(|&v| v as u64).filter(|&v| v as i64 > gt).collect();
        assert_eq!(out["op"], "scan");
        assert_eq!(out["result"]["count"].as_u64().unwrap(), 2 * want.len() as u64);
        assert_eq!(out["result"]["sum"].as_u64().unwrap(), 2 * want.iter().sum::<u64>());
        assert_eq!(out["pool_bytes"].as_u64().unwrap(), 512 << 10);
        let peak = out["peak_resident_bytes"].as_u64().unwrap();
        assert!(peak > 0 && peak <= 512 << 10, "peak {peak}");
        assert!(out["bytes_read"].as_u64().unwrap() >= 2 * 4 * 300_000, "data is 4.7x the pool: it must be read");
        assert!(out["seconds"].as_f64().unwrap() >= 0.0);
    }
    let check = json(&["check", p(&db), "--json"]);
    assert_eq!(check["ok"], true);
    let stats = json(&["stats", p(&db), "--json"]);
    assert_eq!(stats["columns"]["v"]["values"].as_u64().unwrap(), 600_000);
    assert!(stats["total_file_bytes"].as_u64().unwrap() >= 2_400_000);
}

#[test]
fn signed_and_u64_columns_scan_exactly() {
    let t = tempfile::tempdir().unwrap();
    let db = t.path().join("db");
    ok(&["create", p(&db), "--min-page", "4096"]);
    let vals: Vec<i64> = (0..50_000).map(|i: i64| (i * 7919 % 10_007 - 5000) * 1_000_000_000_000).collect();
    let f = t.path().join("s.i64");
    std::fs::write(&f, vals.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>()).unwrap();
    ok(&["import", p(&db), "s", "--from", p(&f), "--format", "i64le"]);
    let raw = ok(&["query", p(&db), "--pool", "256KiB", "--json", "scan", "s", "--gt", "-3000000000000000"]);
    let want: Vec<i128> = vals.iter().filter(|&&v| v > -3_000_000_000_000_000).map(|&v| v as i128).collect();
    let out: Value = serde_json::from_str(&raw).unwrap();
    assert_eq!(out["result"]["count"].as_u64().unwrap(), want.len() as u64);
    let sum = want.iter().sum::<i128>();
    assert!(sum.abs() > i64::MAX as i128, "the test needs a sum beyond 64 bits");
    assert!(raw.contains(&format!("\"sum\":{sum}")), "exact signed sum {sum}: {raw}");
    let big: Vec<u64> = vec![u64::MAX; 4];
    let f = t.path().join("b.u64");
    std::fs::write(&f, big.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>()).unwrap();
    ok(&["import", p(&db), "b", "--from", p(&f), "--format", "u64le"]);
    let s = ok(&["query", p(&db), "--pool", "256KiB", "--json", "scan", "b", "--gt", "0"]);
    assert!(s.contains(&format!("\"sum\":{}", 4 * u64::MAX as u128)), "exact sum beyond 2^64: {s}");
}

#[test]
fn bad_input_gets_one_line_errors_and_leaves_the_database_consistent() {
    let t = tempfile::tempdir().unwrap();
    let db = t.path().join("db");
    ok(&["create", p(&db), "--min-page", "4KiB"]);
    let odd = t.path().join("odd");
    std::fs::write(&odd, [1u8; 10]).unwrap();
    let e = fails(&["import", p(&db), "v", "--from", p(&odd), "--format", "u32le"]);
    assert!(e.contains("not a multiple"), "{e}");
    let e = fails(&["import", p(&db), "v", "--from", p(&odd), "--format", "u16le"]);
    assert!(e.contains("unknown format"), "{e}");
    let e = fails(&["query", p(&db), "--pool", "1MiB", "scan", "nope", "--gt", "1"]);
    assert!(e.contains("no column named \"nope\""), "{e}");
    let e = fails(&["query", p(&db), "--pool", "1KiB", "scan", "nope", "--gt", "1"]);
    assert!(e.contains("pool too small"), "{e}");
    let e = fails(&["query", p(&t.path().join("nothing")), "--pool", "1MiB", "scan", "v", "--gt", "1"]);
    assert!(e.contains("not a strata database"), "{e}");
    let e = fails(&["create", p(&t.path().join("x")), "--min-page", "3000"]);
    assert!(e.contains("power of two"), "{e}");
    fails(&["query", p(&db), "--pool", "12XB", "scan", "v", "--gt", "1"]);
    ok(&["check", p(&db)]);
}

#[test]
fn corrupted_page_is_reported_by_check_and_query_with_file_and_page() {
    let t = tempfile::tempdir().unwrap();
    let db = t.path().join("db");
    let input = t.path().join("v.u32");
    ok(&["gen", "ints", "--count", "100000", "--out", p(&input)]);
    ok(&["create", p(&db), "--min-page", "4KiB"]);
    ok(&["import", p(&db), "v", "--from", p(&input), "--format", "u32le", "--pool", "1MiB"]);
    ok(&["check", p(&db)]);
    // Flip a byte in the middle of the second page of the (only) class file in use.
    let stats = json(&["stats", p(&db), "--json"]);
    let class = &stats["classes"][0];
    let (c, size) = (class["class"].as_u64().unwrap(), class["page_size"].as_u64().unwrap());
    let file = db.join(format!("class-{c:02}.pages"));
    let mut bytes = std::fs::read(&file).unwrap();
    bytes[(size + size / 2) as usize] ^= 0x40;
    std::fs::write(&file, bytes).unwrap();
    let e = fails(&["check", p(&db)]);
    assert!(e.contains("corruption") && e.contains(&format!("class-{c:02}.pages")) && e.contains(&format!("c{c}:1")), "{e}");
    let e = fails(&["query", p(&db), "--pool", "1MiB", "scan", "v", "--gt", "0"]);
    assert!(e.contains("checksum") && e.contains(&format!("c{c}:1")), "{e}");
    // A truncated file is named as such.
    let len = std::fs::metadata(&file).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&file).unwrap().set_len(len - size / 2).unwrap();
    let e = fails(&["check", p(&db)]);
    assert!(e.contains("corruption"), "{e}");
}

/// Scanning a 1 GiB column through a 64 MiB pool keeps the process's peak RSS (VmHWM)
/// below 64 MiB + 48 MiB, and so does importing it.
#[test]
fn one_gib_scan_through_64_mib_pool_stays_under_the_rss_cap() {
    let t = tempfile::tempdir().unwrap();
    let db = t.path().join("db");
    let input = t.path().join("v.u32");
    let count = (1u64 << 30) / 4;
    ok(&["gen", "ints", "--count", &count.to_string(), "--seed", "3", "--out", p(&input)]);
    ok(&["create", p(&db)]);
    let cap = (64u64 << 20) + (48 << 20);
    let imp = json(&["import", p(&db), "v", "--from", p(&input), "--format", "u32le", "--pool", "64MiB", "--json"]);
    let rss = imp["peak_rss_bytes"].as_u64().expect("VmHWM readable");
    assert!(rss <= cap, "import peak RSS {rss} > {cap}");
    std::fs::remove_file(&input).unwrap();
    for threads in ["1", "2"] {
        let out = json(&["query", p(&db), "--pool", "64MiB", "--threads", threads, "--json", "scan", "v", "--gt", "0"]);
        let rss = out["peak_rss_bytes"].as_u64().expect("VmHWM readable");
        assert!(rss <= cap, "scan peak RSS {rss} > {cap}");
        assert!(out["peak_resident_bytes"].as_u64().unwrap() <= 64 << 20);
        assert!(out["bytes_read"].as_u64().unwrap() >= 1 << 30);
        assert!(out["result"]["count"].as_u64().unwrap() > count - 1000);
    }
}

/// The reservations grow with the database: the whole job runs under `ulimit -v` of
/// 2 x (pool + database) + 256 MiB.
#[test]
fn runs_under_a_virtual_memory_limit() {
    let t = tempfile::tempdir().unwrap();
    let db = t.path().join("db");
    let input = t.path().join("v.u32");
    let data = 128u64 << 20;
    let pool = 16u64 << 20;
    ok(&["gen", "ints", "--count", &(data / 4).to_string(), "--out", p(&input)]);
    ok(&["create", p(&db), "--min-page", "4KiB"]);
    let limit_kib = (2 * (pool + data) + (256 << 20)) / 1024;
    let bin = env!("CARGO_BIN_EXE_strata");
    let script = format!(
        "ulimit -v {limit_kib} && {bin} import {db} v --from {input} --format u32le --pool 16MiB && {bin} query {db} --pool 16MiB --threads 2 --json scan v --gt 100",
        db = p(&db),
        input = p(&input)
    );
    let out = Command::new("sh").arg("-c").arg(&script).output().unwrap();
    assert!(out.status.success(), "under ulimit -v {limit_kib} KiB: {}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_str(String::from_utf8_lossy(&out.stdout).lines().last().unwrap()).unwrap();
    assert!(v["result"]["count"].as_u64().unwrap() > 0);
}

/// The README's main job: builds a database several times the pool, runs every query, checks.
#[test]
fn demo_runs_every_operation_inside_its_pool() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("demo");
    let out = ok(&["demo", "--dir", p(&dir), "--pool", "4MiB", "--count", "1000000"]);
    for op in ["scan", "groupby", "distinct", "sort", "join", "bfs", "check:"] {
        assert!(out.contains(op), "demo output lacks {op}: {out}");
    }
    // A second run replaces its own directory; a foreign directory is refused.
    ok(&["demo", "--dir", p(&dir), "--pool", "4MiB", "--count", "100000"]);
    let foreign = t.path().join("foreign");
    std::fs::create_dir(&foreign).unwrap();
    std::fs::write(foreign.join("precious"), b"x").unwrap();
    fails(&["demo", "--dir", p(&foreign)]);
    assert!(foreign.join("precious").exists());
}

/// The query JSON's `"io"` object says how pages reached the device: the backend (and
/// `STRATA_IO=posix` forcing pread/pwrite), coalesced read requests of a scan's read-ahead
/// and their queue depths, prefetch use; `--cleaner` runs a background cleaner and changes
/// no result.
#[test]
fn query_reports_io_and_runs_with_a_cleaner() {
    let t = tempfile::tempdir().unwrap();
    let db = t.path().join("db");
    let input = t.path().join("v.u32");
    ok(&["gen", "ints", "--count", "400000", "--seed", "3", "--out", p(&input)]);
    ok(&["create", p(&db), "--min-page", "4KiB"]);
    ok(&["import", p(&db), "v", "--from", p(&input), "--format", "u32le", "--pool", "1MiB", "--cleaner"]);
    let scan = json(&["query", p(&db), "--pool", "512KiB", "--json", "scan", "v", "--gt", "0"]);
    let io = &scan["io"];
    let n = |k: &str| io[k].as_u64().unwrap_or_else(|| panic!("io.{k} missing: {io}"));
    assert!(io["backend"].as_str().is_some_and(|b| !b.is_empty()), "{io}");
    assert!(scan["bytes_read"].as_u64().unwrap() >= 1_600_000, "{scan}");
    assert!(n("read_requests") > 0 && n("read_requests") < n("pages_read"), "reads were coalesced: {io}");
    assert!(n("pages_prefetched") > 0 && n("prefetch_hits") > 0 && n("prefetch_hits") + n("prefetch_wasted") <= n("pages_prefetched"), "{io}");
    let sizes = io["read_request_bytes"].as_array().unwrap();
    let largest_page = 64 << 10; // the import's pages are at most a sixteenth of its pool
    assert!(sizes.iter().any(|b| b["le"].as_u64().unwrap() > largest_page), "requests of several pages: {io}");
    let reads: u64 = sizes.iter().map(|b| b["count"].as_u64().unwrap()).sum();
    let depths: u64 = io["read_queue_depth"].as_array().unwrap().iter().map(|b| b["count"].as_u64().unwrap()).sum();
    assert_eq!(reads, n("read_requests"), "{io}");
    assert_eq!(depths, n("read_requests"), "{io}");

    let posix = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["query", p(&db), "--pool", "512KiB", "--json", "scan", "v", "--gt", "0"])
        .env("STRATA_IO", "posix")
        .output()
        .unwrap();
    assert!(posix.status.success());
    let posix: Value = serde_json::from_slice(&posix.stdout).unwrap();
    assert!(posix["io"]["backend"].as_str().unwrap().starts_with("posix"), "{}", posix["io"]);
    assert_eq!(posix["result"], scan["result"]);

    // Sorting spills through the small pool; with a cleaner (the default; `--cleaner` is
    // still accepted) the result is the same as without one (`--no-cleaner`).
    let plain = json(&["query", p(&db), "--pool", "512KiB", "--json", "--no-cleaner", "sort", "v", "--top", "5"]);
    let cleaned = json(&["query", p(&db), "--pool", "512KiB", "--json", "--cleaner", "sort", "v", "--top", "5"]);
    let default = json(&["query", p(&db), "--pool", "512KiB", "--json", "sort", "v", "--top", "5"]);
    assert_eq!(default["result"], plain["result"]);
    assert_eq!(plain["result"], cleaned["result"]);
    assert!(plain["io"]["dirty_victims"].as_u64().unwrap() > 0, "the sort spilled: {}", plain["io"]);
    assert_eq!(plain["io"]["pages_cleaned"], 0);
    assert!(cleaned["io"]["pages_cleaned"].is_u64());
    // The sort's evictions returned every frame's memory: no madvise failed.
    assert_eq!(plain["io"]["madvise_failures"], 0, "{}", plain["io"]);
    // Scan-ring counters are part of the object (a sort over column files reads no table).
    for k in ["ring_pages", "ring_hits", "ring_bytes", "ring_threads_started"] {
        assert!(plain["io"][k].is_u64(), "{k}: {}", plain["io"]);
    }
    assert!(cleaned["peak_resident_bytes"].as_u64().unwrap() <= 512 << 10);
}
