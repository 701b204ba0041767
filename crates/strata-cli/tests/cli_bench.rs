//! Smoke test of `strata bench`: every benchmark runs with tiny sizes and prints one JSON
//! object of the documented shape (docs/cli.md). No timing is asserted.

use std::process::Command;

use serde_json::Value;

fn bench(args: &[&str]) -> Value {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().to_str().unwrap().to_owned();
    let mut all = vec!["bench"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--json", "--dir", &dir]);
    let out = Command::new(env!("CARGO_BIN_EXE_strata")).args(&all).output().expect("run strata");
    assert!(out.status.success(), "strata {all:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    let s = String::from_utf8(out.stdout).unwrap();
    assert_eq!(s.trim().lines().count(), 1, "exactly one JSON object: {s}");
    let v: Value = serde_json::from_str(&s).unwrap();
    // The scratch directory inside --dir is removed afterwards.
    assert_eq!(std::fs::read_dir(t.path()).unwrap().count(), 0, "data files left behind in --dir");
    v
}

fn num(v: &Value, key: &str) -> f64 {
    v.get(key).and_then(Value::as_f64).unwrap_or_else(|| panic!("{key} missing or not a number in {v}"))
}

/// Checks the common shape; returns the runs.
fn check_shape(v: &Value, name: &str, engines: &[&str]) -> Vec<Value> {
    assert_eq!(v["bench"], name);
    let m = &v["machine"];
    assert!(num(m, "cores") >= 1.0);
    assert!(m["memory_bytes"].is_number() && m["kernel"].is_string(), "{m}");
    let runs = v["runs"].as_array().unwrap().clone();
    assert!(!runs.is_empty());
    for r in &runs {
        let p = &r["params"];
        for k in ["threads", "pool_bytes", "data_bytes"] {
            assert!(num(p, k) > 0.0, "{k} in {p}");
        }
        assert!(!p["page_size"].is_null(), "page_size in {p}");
        let e = r["engines"].as_object().unwrap();
        for name in engines {
            let f = e.get(*name).unwrap_or_else(|| panic!("engine {name} missing in {r}"));
            if let Some(reason) = f.get("failed") {
                assert!(reason.as_str().is_some_and(|s| !s.is_empty()), "failed needs a reason: {f}");
                continue;
            }
            for k in ["ops_per_sec", "bytes_per_sec", "p50_us", "p99_us"] {
                assert!(num(f, k) >= 0.0, "{name}.{k}");
            }
            assert!(num(f, "ops") > 0.0, "{name} did no operation");
            assert!(num(f, "p99_us") >= num(f, "p50_us"));
        }
        let ratios = r["ratios"].as_object().unwrap();
        for (b, x) in ratios {
            assert!(e.contains_key(b) && b != "strata");
            assert!(x.as_f64().is_some_and(|x| x > 0.0), "ratio {b} = {x}");
        }
        // A ratio for every baseline that completed, when strata completed.
        if e["strata"].get("failed").is_none() {
            for (b, f) in e {
                if b != "strata" && f.get("failed").is_none() {
                    assert!(ratios.contains_key(b), "ratio for {b} missing in {r}");
                }
            }
        }
    }
    runs
}

fn ok(r: &Value, engine: &str) -> bool {
    r["engines"][engine].get("failed").is_none()
}

#[test]
fn bench_fix() {
    let v = bench(&["fix", "--pool", "1MiB", "--data", "256KiB", "--ops", "300", "--threads", "1,2"]);
    let runs = check_shape(&v, "fix", &["strata", "hashpool", "memory"]);
    assert_eq!(runs.len(), 6, "3 modes x 2 thread counts");
    for r in &runs {
        assert!(["optimistic", "shared", "exclusive"].contains(&r["params"]["mode"].as_str().unwrap()));
        assert_eq!(r["params"]["phase"], "warm");
        for e in ["strata", "hashpool", "memory"] {
            assert!(ok(r, e), "{e} failed: {r}");
        }
    }
}

#[test]
fn bench_random_read_and_plot() {
    let t = tempfile::tempdir().unwrap();
    let png = t.path().join("rr.png");
    let v = bench(&[
        "random-read",
        "--pool",
        "1MiB",
        "--data",
        "2MiB",
        "--page-size",
        "4KiB,16KiB",
        "--ops",
        "100",
        "--threads",
        "2",
        "--plot",
        png.to_str().unwrap(),
    ]);
    let runs = check_shape(&v, "random-read", &["strata", "hashpool", "mmap", "raw"]);
    assert_eq!(runs.len(), 2 * 2 * 2, "page sizes x in/out x uniform/zipf");
    for r in &runs {
        let p = &r["params"];
        assert!(["uniform", "zipf"].contains(&p["distribution"].as_str().unwrap()));
        assert_eq!(p["queue_depth"], 2);
        for e in ["strata", "hashpool", "mmap", "raw"] {
            assert!(ok(r, e), "{e} failed: {r}");
        }
        assert!(r["engines"]["mmap"]["capped"].is_boolean(), "mmap says whether it was capped");
    }
    let bytes = std::fs::read(&png).unwrap();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
}

#[test]
fn bench_scan() {
    let v = bench(&["scan", "--pool", "1MiB", "--data", "4MiB", "--page-size", "64KiB", "--threads", "1,2"]);
    let runs = check_shape(&v, "scan", &["strata", "mmap", "raw"]);
    assert_eq!(runs.len(), 4, "cold and warm x 2 thread counts");
    for r in &runs {
        assert!(["cold", "warm"].contains(&r["params"]["phase"].as_str().unwrap()));
        assert_eq!(r["checksums_agree"], true, "{r}");
        for e in ["strata", "mmap", "raw"] {
            assert!(ok(r, e), "{e} failed: {r}");
            assert_eq!(num(&r["engines"][e], "ops"), 4.0, "4 MiB in 1 MiB morsels");
        }
        assert!(r["engines"].get("strata-noprefetch").is_none(), "runs only when named: {r}");
    }
    // Prefetch off: the engine without read-ahead reads the same file, page by page.
    let v = bench(&[
        "scan",
        "--pool",
        "1MiB",
        "--data",
        "4MiB",
        "--page-size",
        "64KiB",
        "--threads",
        "1",
        "--engines",
        "strata,strata-noprefetch",
        "--rounds",
        "1",
    ]);
    for r in &check_shape(&v, "scan", &["strata", "strata-noprefetch"]) {
        assert!(ok(r, "strata-noprefetch"), "{r}");
        assert_eq!(num(&r["engines"]["strata-noprefetch"], "ops"), 4.0, "{r}");
        assert_eq!(r["checksums_agree"], true, "{r}");
    }
}

/// `bench bfs`: strata and strata-noprefetch find the same BFS result, cold and warm, out of
/// memory; the text table and the plot (tests/bfs.rs in strata-bench checks the result
/// against an in-memory BFS).
#[test]
fn bench_bfs_and_plot() {
    let t = tempfile::tempdir().unwrap();
    let png = t.path().join("bfs.png");
    let v = bench(&["bfs", "--pool", "2MiB", "--data", "4MiB", "--threads", "2", "--rounds", "1", "--plot", png.to_str().unwrap()]);
    let runs = check_shape(&v, "bfs", &["strata", "strata-noprefetch"]);
    assert_eq!(runs.len(), 2, "cold and warm");
    for r in &runs {
        assert_eq!(r["results_agree"], true, "{r}");
        let (a, b) = (&r["engines"]["strata"], &r["engines"]["strata-noprefetch"]);
        assert!(ok(r, "strata") && ok(r, "strata-noprefetch"), "{r}");
        for k in ["reached", "max_depth", "depth_sum"] {
            assert_eq!(a[k], b[k], "{k}: {r}");
        }
        assert!(num(a, "reached") > 1.0 && num(a, "cpu_seconds") >= 0.0 && num(a, "bytes_read") > 0.0, "{r}");
    }
    assert!(std::fs::read(&png).unwrap().starts_with(b"\x89PNG"));
    let out = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["bench", "bfs", "--pool", "2MiB", "--data", "4MiB", "--threads", "1", "--rounds", "1", "--engines", "strata-noprefetch", "--dir"])
        .arg(t.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.starts_with("bench bfs on ") && text.contains("strata-noprefetch") && text.contains("max_depth"), "{text}");
}

#[test]
fn bench_mixed_size() {
    let png_dir = tempfile::tempdir().unwrap();
    let png = png_dir.path().join("mixed.png");
    let v = bench(&["mixed-size", "--pool", "4MiB", "--ops", "40", "--threads", "1", "--plot", png.to_str().unwrap()]);
    let runs = check_shape(&v, "mixed-size", &["strata", "static-split"]);
    // The memory timeline: the bar chart and a second PNG beside it.
    for path in [png.clone(), png_dir.path().join("mixed-memory.png")] {
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(bytes.starts_with(b"\x89PNG"), "{} is a PNG", path.display());
    }
    let pool = 4u64 << 20;
    let timeline = |r: &Value, engine: &str| -> Vec<Vec<u64>> {
        let t = &r["engines"][engine]["memory_timeline"];
        assert_eq!(t["page_sizes"], serde_json::json!([4096, 262144]), "{r}");
        let rows: Vec<Vec<u64>> = t["samples"]
            .as_array()
            .unwrap_or_else(|| panic!("{engine} has a memory timeline: {r}"))
            .iter()
            .map(|row| row.as_array().unwrap().iter().skip(1).map(|x| x.as_u64().unwrap()).collect())
            .collect();
        assert!(rows.len() >= 2 && rows.iter().all(|row| row.len() == 3), "{r}");
        rows
    };
    for r in &runs {
        // The cap, sampled over time: strata's resident pages never exceed the pool.
        for row in timeline(r, "strata") {
            assert!(row[0] + row[1] <= pool, "strata resident {row:?} over the {pool}-byte pool: {r}");
        }
    }
    // static-split's large pages never outgrow their quarter; strata's do, when the work
    // needs them (the working set is 80 % of the memory, 90 % of it in large pages).
    let large_pool = pool / 4;
    assert!(timeline(&runs[0], "static-split").iter().all(|row| row[1] <= large_pool), "{}", runs[0]);
    let strata_large = timeline(&runs[0], "strata").last().unwrap()[1];
    assert!(strata_large > large_pool, "strata holds {strata_large} bytes of large pages, more than the split's {large_pool}: {}", runs[0]);
    let phases: Vec<&str> = runs.iter().map(|r| r["params"]["phase"].as_str().unwrap()).collect();
    assert_eq!(phases, ["large-heavy", "small-heavy", "large-pinned"]);
    for r in &runs {
        assert!(ok(r, "strata"), "strata holds every phase in one budget: {r}");
    }
    // Half the memory pinned in 256 KiB pages does not fit the large pool's quarter.
    let pinned = &runs[2]["engines"]["static-split"]["failed"];
    assert!(pinned.as_str().is_some_and(|s| s.contains("no unpinned frame")), "{}", runs[2]);
}

#[test]
fn bench_rejects_unknown_names_in_one_line() {
    let out = Command::new(env!("CARGO_BIN_EXE_strata")).args(["bench", "nope", "--json"]).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr).unwrap();
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("unknown benchmark"), "{err}");
}

/// `--engines` runs only the named engines, `--rounds` sets the scan's rounds (each listed,
/// the median reported), `--memory` picks random-read's data set; misuse is one clear line.
#[test]
fn bench_engine_selection_rounds_and_memory() {
    let v = bench(&["scan", "--pool", "1MiB", "--data", "4MiB", "--page-size", "64KiB", "--threads", "1", "--engines", "raw,strata", "--rounds", "2"]);
    let runs = check_shape(&v, "scan", &["strata", "raw"]);
    for r in &runs {
        let e = r["engines"].as_object().unwrap();
        assert_eq!(e.len(), 2, "only strata and raw: {r}");
        assert_eq!(r["params"]["rounds"], 2);
        for name in ["strata", "raw"] {
            let rounds = e[name]["rounds_bytes_per_sec"].as_array().unwrap();
            assert_eq!(rounds.len(), 2, "{r}");
            let median = num(&e[name], "bytes_per_sec");
            assert!(rounds.iter().any(|x| x.as_f64() == Some(median)), "the reported round is one of the rounds: {r}");
        }
        assert!(r["ratios"].get("raw").is_some(), "{r}");
        assert_eq!(r["checksums_agree"], true);
    }
    let v = bench(&["random-read", "--pool", "1MiB", "--page-size", "4KiB", "--ops", "50", "--threads", "1", "--memory", "out", "--engines", "strata"]);
    let runs = check_shape(&v, "random-read", &["strata"]);
    assert_eq!(runs.len(), 2, "out of memory x uniform/zipf");
    for r in &runs {
        assert_eq!(r["params"]["memory"], "out");
        assert_eq!(r["engines"].as_object().unwrap().len(), 1);
        assert!(r["ratios"].as_object().unwrap().is_empty(), "no baseline, no ratio");
    }
    let v = bench(&[
        "random-read",
        "--pool",
        "1MiB",
        "--page-size",
        "4KiB",
        "--ops",
        "50",
        "--threads",
        "1",
        "--memory",
        "in",
        "--engines",
        "strata,raw",
        "--rounds",
        "3",
    ]);
    for r in &check_shape(&v, "random-read", &["strata", "raw"]) {
        assert_eq!(r["params"]["rounds"], 3);
        for name in ["strata", "raw"] {
            assert_eq!(r["engines"][name]["rounds_ops_per_sec"].as_array().unwrap().len(), 3, "{r}");
        }
    }
    for (args, want) in [
        (&["scan", "--engines", "strata,hashpool"][..], "no engine \"hashpool\""),
        (&["scan", "--rounds", "0"][..], "--rounds must be at least 1"),
        (&["fix", "--rounds", "2"][..], "--rounds applies to scan, random-read, btree, partitions and bfs only"),
        (&["partitions", "--partitions", "1,3"][..], "3 is not a power of two"),
        (&["random-read", "--partitions", "2"][..], "--partitions applies to partitions only"),
        (&["random-read", "--memory", "sideways"][..], "--memory must be in or out"),
        (&["fix", "--engines", "strata"][..], "--engines applies to random-read, scan, btree and bfs only"),
        (&["btree", "--engines", "strata,hashpool"][..], "no engine \"hashpool\""),
        (&["bfs", "--engines", "strata,raw"][..], "bfs has no engine \"raw\""),
        (&["btree", "--page-size", "4KiB,8KiB"][..], "takes one --page-size"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_strata")).arg("bench").args(args).arg("--json").output().unwrap();
        assert!(!out.status.success(), "{args:?}");
        let err = String::from_utf8(out.stderr).unwrap();
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
}

/// `bench partitions`: strata-p1 and strata-p2 in and out of memory at one thread, with the
/// speedups and the line plot.
#[test]
fn bench_partitions_and_plot() {
    let t = tempfile::tempdir().unwrap();
    let png = t.path().join("partitions.png");
    let v = bench(&["partitions", "--partitions", "1,2", "--pool", "1MiB", "--threads", "1", "--ops", "30", "--plot", png.to_str().unwrap()]);
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2, "{v}");
    for r in runs {
        assert_eq!(r["engines"]["strata-p2"]["clock_partitions"], 2, "{r}");
        assert!(r["speedup_vs_one_partition"]["strata-p2"].as_f64().is_some_and(|x| x > 0.0), "{r}");
    }
    assert!(std::fs::metadata(&png).unwrap().len() > 1000);
}

/// `bench btree`: every engine runs every phase (each in a child process of its own) and
/// finds every key it loaded; the PNG is drawn. Tiny: 4854 keys in memory, 19418 out.
#[test]
fn bench_btree() {
    let t = tempfile::tempdir().unwrap();
    let png = t.path().join("btree.png");
    let v = bench(&["btree", "--pool", "1MiB", "--data", "2MiB", "--threads", "2", "--seconds", "0.05", "--plot", png.to_str().unwrap()]);
    let all = ["strata", "redb", "lmdb", "btreemap"];
    let runs = check_shape(&v, "btree", &["strata", "redb", "lmdb"]);
    let phases = ["load", "C", "C", "E", "B", "insert-only"];
    assert_eq!(runs.len(), 2 * phases.len(), "in/out x phases: {v}");
    for (i, r) in runs.iter().enumerate() {
        let p = &r["params"];
        let memory = if i < phases.len() { "in" } else { "out" };
        assert_eq!(p["memory"], memory);
        assert_eq!(p["workload"], phases[i % phases.len()]);
        assert_eq!(p["threads"], 2);
        assert_eq!(p["page_size"], 4096);
        assert_eq!(num(p, "data_bytes"), num(p, "keys") * 108.0);
        assert_eq!(p["rss"], "per engine: one child process per engine and run");
        if p["workload"] == "C" || p["workload"] == "B" || p["workload"] == "E" {
            assert!(["uniform", "zipf"].contains(&p["distribution"].as_str().unwrap()), "{p}");
        }
        let engines = r["engines"].as_object().unwrap();
        let expected: Vec<&str> = all.iter().copied().filter(|e| memory == "in" || *e != "btreemap").collect();
        assert_eq!(engines.len(), expected.len(), "{r}");
        for e in expected {
            let f = &r["engines"][e];
            assert!(ok(r, e), "{e} failed: {r}");
            assert!(num(f, "ops_per_sec") > 0.0 && num(f, "ops") > 0.0, "{e}: {f}");
            assert!(num(f, "peak_rss_bytes") > 0.0, "{e}: {f}");
            assert!(f["cpu_us_per_op"].is_number(), "{e}: {f}");
            // The correctness checks inside the run: every lookup found its key with a value
            // that names it, scans were ordered, and the final scan found every entry ever
            // inserted exactly once.
            assert_eq!(num(f, "not_found"), 0.0, "{e} missed keys: {r}");
            assert_eq!(num(f, "wrong_values"), 0.0, "{e} returned wrong values: {r}");
            assert_eq!(num(f, "verify_missing"), 0.0, "{e}: {f}");
            assert_eq!(num(f, "verify_wrong"), 0.0, "{e}: {f}");
            assert!(num(f, "verified_keys") >= num(p, "keys"), "{e}: {f}");
            if p["workload"] == "load" {
                assert_eq!(num(f, "ops"), num(p, "keys"), "{e} loaded every key");
            }
        }
        assert!(r["engines"]["lmdb"]["capped"].is_boolean(), "lmdb says whether it was capped");
    }
    let bytes = std::fs::read(&png).unwrap();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
}
