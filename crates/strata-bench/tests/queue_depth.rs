//! `random-read` with a queue depth larger than the thread count, with tiny sizes through the
//! library API: every measured operation is a batch of `queue_depth / threads` pages, the
//! parameters say so, and every engine completes. No timing is asserted.

use serde_json::Value;
use strata_bench::{run, Options};

const PS: u64 = 4096;

fn opts(dir: &std::path::Path, queue_depth: Option<usize>) -> Options {
    // 512 pages of 4 KiB out of memory behind a 1 MiB pool.
    Options {
        threads: Some(vec![1, 2]),
        pool: Some(1 << 20),
        data: Some(2 << 20),
        page_sizes: Some(vec![PS]),
        ops: Some(20),
        dir: Some(dir.to_owned()),
        queue_depth,
        ..Options::default()
    }
}

fn num(v: &Value, key: &str) -> u64 {
    v.get(key).and_then(Value::as_u64).unwrap_or_else(|| panic!("{key} missing or not an integer in {v}"))
}

#[test]
fn random_read_batches_at_the_queue_depth() {
    let t = tempfile::tempdir().unwrap();
    let r = run("random-read", &opts(t.path(), Some(8))).unwrap();
    let runs = r["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2 * 2 * 2, "in/out x uniform/zipf x 2 thread counts: {r}");
    let mut prefetched_out = 0;
    let mut cpu_seconds = 0.0;
    for run in runs {
        let p = &run["params"];
        let threads = num(p, "threads");
        let batch = num(p, "batch");
        assert_eq!(batch, 8 / threads, "{p}");
        assert_eq!(num(p, "queue_depth"), 8, "{p}");
        for name in ["strata", "hashpool", "mmap", "raw"] {
            let e = &run["engines"][name];
            assert!(e.get("failed").is_none(), "{name} failed: {run}");
            assert_eq!(num(e, "ops"), 20 * threads, "{name}: --ops counts batches per thread: {e}");
            assert!(e["pages_per_sec"].as_f64().is_some_and(|x| x > 0.0), "{name}: {e}");
            // The CPU the window cost, per batch and per page.
            let f = |k: &str| e[k].as_f64().unwrap_or_else(|| panic!("{name}: {k} missing in {e}"));
            let (user, sys, per_op, per_page) = (f("cpu_user_seconds"), f("cpu_sys_seconds"), f("cpu_us_per_op"), f("cpu_us_per_page"));
            assert!(user >= 0.0 && sys >= 0.0, "{name}: {e}");
            assert!((per_page * batch as f64 - per_op).abs() <= 1e-3 * batch as f64 + 1e-9, "{name}: per page = per batch / batch: {e}");
            cpu_seconds += user + sys;
        }
        assert!(run["ratios"]["raw"].as_f64().is_some_and(|x| x > 0.0), "strata/raw ratio: {run}");
        // raw is never warmed and has no cache: its window read exactly the batches' pages.
        let raw = &run["engines"]["raw"];
        assert_eq!(num(raw, "bytes_read"), 20 * threads * batch * PS, "{raw}");
        assert_eq!(num(raw, "reads"), 20 * threads * batch, "{raw}");
        assert!(raw["batch_io_uring"].is_boolean(), "{raw}");
        assert!(num(raw, "batch_ring_calls") + num(raw, "batch_posix_calls") >= 20 * threads, "{raw}");
        if p["memory"] == "out" {
            prefetched_out += num(&run["engines"]["strata"], "pages_prefetched");
        }
    }
    assert!(cpu_seconds > 0.0, "the windows' CPU time is measured: {r}");
    assert!(prefetched_out > 0, "strata's batches load pages through prefetch out of memory: {r}");
    assert!(r["notes"].as_array().unwrap().iter().any(|n| n.as_str().is_some_and(|s| s.contains("--queue-depth 8"))), "a note explains the batches");
}

#[test]
fn a_queue_depth_up_to_the_thread_count_changes_nothing() {
    let t = tempfile::tempdir().unwrap();
    for qd in [None, Some(1)] {
        let r = run("random-read", &opts(t.path(), qd)).unwrap();
        for run in r["runs"].as_array().unwrap() {
            let p = &run["params"];
            assert_eq!(p["queue_depth"], p["threads"], "{p}");
            assert_eq!(p.get("batch").is_some(), qd.is_some(), "batch is recorded only with --queue-depth: {p}");
            if qd.is_some() {
                assert_eq!(p["batch"], 1);
            }
            for name in ["strata", "raw"] {
                let e = &run["engines"][name];
                assert!(e.get("failed").is_none(), "{name} failed: {run}");
                assert!(e.get("pages_per_sec").is_none(), "{name}: synchronous reads add no pages_per_sec: {e}");
            }
            let raw = &run["engines"]["raw"];
            assert_eq!(num(raw, "bytes_read"), 20 * num(p, "threads") * PS, "one page per operation: {raw}");
        }
    }
}

#[test]
fn queue_depth_is_checked() {
    let t = tempfile::tempdir().unwrap();
    let e = run("random-read", &opts(t.path(), Some(0))).unwrap_err();
    assert!(e.contains("--queue-depth"), "{e}");
    let e = run("scan", &Options { queue_depth: Some(8), ..opts(t.path(), None) }).unwrap_err();
    assert!(e.contains("random-read only"), "{e}");
}
