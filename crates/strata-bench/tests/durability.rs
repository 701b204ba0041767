//! The durability benchmarks (`commit`, `recovery`) with tiny parameters through the library
//! API: the report has both engines per run, positive throughputs, the ratios, and the
//! benchmark's own checks passed (`verified`: every commit counted in the pages; after the
//! crash and recovery, every committed value present and every loser change gone).

use serde_json::Value;
use strata_bench::{run, Options};

fn opts(dir: &std::path::Path) -> Options {
    Options { ops: Some(20), dir: Some(dir.to_owned()), ..Options::default() }
}

fn num(v: &Value, what: &str) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("{what} is not a number: {v}"))
}

#[test]
fn commit_reports_both_engines_and_counts_every_commit() {
    let t = tempfile::tempdir().unwrap();
    let o = Options { threads: Some(vec![1, 3]), data: Some(64 << 10), pool: Some(4 << 20), ..opts(t.path()) };
    let r = run("commit", &o).unwrap();
    assert_eq!(r["bench"], "commit");
    let runs = r["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    for (run, threads) in runs.iter().zip([1u64, 3]) {
        assert_eq!(run["params"]["threads"], threads);
        assert_eq!(run["verified"], true, "{run}");
        for engine in ["group-commit", "no-group-commit"] {
            let e = &run["engines"][engine];
            assert!(e.get("failed").is_none(), "{engine} failed: {e}");
            assert_eq!(e["ops"], 20 * threads, "{engine}: --ops 20 per thread");
            assert!(num(&e["ops_per_sec"], "ops_per_sec") > 0.0);
            assert_eq!(e["commits_per_sec"], e["ops_per_sec"]);
            assert!(num(&e["mean_us"], "mean_us") > 0.0);
            assert!(num(&e["p99_us"], "p99_us") >= num(&e["p50_us"], "p50_us"));
            // Every durable commit needs a log fsync, shared or not.
            assert!(num(&e["log_fsyncs"], "log_fsyncs") >= 1.0, "{engine}: {e}");
            assert!(num(&e["log_fsyncs_per_commit"], "fsyncs per commit") > 0.0);
            assert!(num(&e["log_bytes_per_commit"], "log bytes per commit") > 0.0);
            assert_eq!(e["verified"], true);
        }
        // Without group commit every commit fsyncs by itself.
        let alone = &run["engines"]["no-group-commit"];
        assert!(num(&alone["log_fsyncs_per_commit"], "fsyncs per commit") >= 1.0, "{alone}");
        assert!(num(&run["ratios"]["group-commit/no-group-commit"], "ratio") > 0.0);
    }
}

#[test]
fn recovery_recovers_the_committed_state() {
    let t = tempfile::tempdir().unwrap();
    // 1024 pages of 4 KiB (8x the pool) behind a 512 KiB pool: recovery has to evict. Three
    // log sizes (64 KiB, 256 KiB, 1 MiB), but --ops fixes the transactions per size.
    let o = Options { pool: Some(512 << 10), data: Some(1 << 20), ..opts(t.path()) };
    let r = run("recovery", &o).unwrap();
    assert_eq!(r["bench"], "recovery");
    let runs = r["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 3, "{r}");
    for run in runs {
        assert_eq!(run["verified"], true, "{run}");
        let p = &run["params"];
        assert_eq!(p["committed_txns"], 21, "--ops 20 plus the one that flushes the late losers");
        // 21 transactions of eight 1 KiB ranges each log at least their after-images (ranges
        // written over zeros are logged without the before-image, the others with it).
        assert!(num(&p["log_bytes"], "log_bytes") > 21.0 * 8.0 * 1024.0, "{p}");
        let rec = &run["engines"]["recovery"];
        let clean = &run["engines"]["clean-open"];
        for (name, e) in [("recovery", rec), ("clean-open", clean)] {
            assert!(e.get("failed").is_none(), "{name}: {e}");
            assert!(num(&e["open_seconds"], "open_seconds") > 0.0);
            assert!(num(&e["ops_per_sec"], "ops_per_sec") > 0.0);
            assert_eq!(e["verified"], true, "{name}");
        }
        assert_eq!(rec["log_bytes_replayed"], p["log_bytes"]);
        assert!(num(&rec["log_mb_per_sec"], "MB/s") > 0.0);
        // Recovery read the log; the clean open found nothing to replay.
        assert!(num(&rec["log_bytes_read"], "log read") >= num(&p["log_bytes"], "log_bytes"), "{rec}");
        assert_eq!(clean["log_bytes_replayed"], 0);
        assert!(num(&run["ratios"]["recovery/clean-open"], "ratio") > 0.0);
    }
}

#[test]
fn unknown_benchmark_lists_the_durability_ones() {
    let e = run("nope", &Options::default()).unwrap_err();
    assert!(e.contains("commit") && e.contains("recovery"), "{e}");
}
