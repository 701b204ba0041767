//! The `remote` benchmark with tiny parameters through the library API. It starts its own
//! private Valkey/Redis server, so this test needs `valkey-server` or `redis-server` on PATH
//! and fails (saying so) without one.

use serde_json::Value;
use strata_bench::{run, Options};

fn num(v: &Value, what: &str) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("{what} is not a number: {v}"))
}

#[test]
fn remote_tier_serves_misses_and_warms_restarts() {
    let t = tempfile::tempdir().unwrap();
    // 128 pages of 64 KiB behind a 2 MiB pool (32 frames): most reads miss the pool.
    let o =
        Options { threads: Some(vec![1, 2]), pool: Some(2 << 20), data: Some(8 << 20), ops: Some(300), dir: Some(t.path().to_owned()), ..Options::default() };
    let r = run("remote", &o).unwrap_or_else(|e| panic!("the remote benchmark failed (is redis-server or valkey-server installed?): {e}"));
    assert_eq!(r["bench"], "remote");
    let runs = r["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 3, "two read runs and the restart run: {r}");

    for (run, threads) in runs[..2].iter().zip([1u64, 2]) {
        let p = &run["params"];
        assert_eq!(p["phase"], "reads");
        assert_eq!(p["threads"], threads);
        assert_eq!(p["pages"], 128);
        assert_eq!(run["verified"], true, "{run}");
        for engine in ["strata-disk", "strata-remote"] {
            let e = &run["engines"][engine];
            assert!(e.get("failed").is_none(), "{engine}: {e}");
            assert_eq!(e["ops"], 300 * threads, "{engine}: --ops 300 per thread");
            assert!(num(&e["ops_per_sec"], "ops_per_sec") > 0.0, "{engine}: {e}");
            assert_eq!(e["reads_per_sec"], e["ops_per_sec"]);
            assert!(num(&e["p99_us"], "p99") >= num(&e["p50_us"], "p50"));
            assert!(num(&e["misses"], "misses") > 0.0, "{engine}: the data is 4x the pool: {e}");
            assert_eq!(e["verified"], true);
            assert_eq!(e["mismatches"], 0);
            assert_eq!(e["warmup"]["pages"], 128);
        }
        let disk = &run["engines"]["strata-disk"];
        let remote = &run["engines"]["strata-remote"];
        assert_eq!(disk["remote_tier"], false);
        assert!(disk.get("remote_hits").is_none());
        // Misses of strata-disk go to the disk (two threads missing one page read it once),
        // plus the windows of the sequential read-ahead when random misses happen to hit
        // consecutive pages.
        let disk_reads = num(&disk["pages_read_from_disk"], "disk reads");
        assert!(disk_reads > 0.0 && disk_reads <= num(&disk["misses"], "misses") + num(&disk["pages_prefetched"], "prefetched"), "{disk}");
        // The tier engine: the warm-up offered the evicted pages, the measurement's misses
        // were served by the tier.
        assert_eq!(remote["remote_tier"], true);
        assert_eq!(remote["warmup"]["tier_flushed"], true);
        assert!(num(&remote["warmup"]["remote_puts"], "warm-up puts") > 0.0, "{remote}");
        assert!(num(&remote["warmup"]["remote_bytes_sent"], "warm-up bytes sent") > 0.0, "{remote}");
        let hits = num(&remote["remote_hits"], "remote_hits");
        assert!(hits > 0.0, "{remote}");
        assert!(num(&remote["remote_bytes_received"], "bytes received") >= hits * 65536.0, "{remote}");
        assert_eq!(remote["remote_rejected"], 0, "{remote}");
        assert_eq!(remote["remote_errors"], 0, "{remote}");
        // Most misses are tier hits (all pages were offered during the warm-up; a page evicted
        // and missed again before the writer stored it is a tier miss).
        assert!(num(&remote["remote_hit_rate_of_misses"], "hit rate") > 0.5, "{remote}");
        assert!(num(&run["ratios"]["strata-remote/strata-disk"], "ratio") > 0.0, "{run}");
        assert!(num(&run["ratios"]["p50_us strata-remote/strata-disk"], "p50 ratio") > 0.0, "{run}");
    }

    let restart = &runs[2];
    assert_eq!(restart["params"]["phase"], "restart");
    assert_eq!(restart["verified"], true, "{restart}");
    let hot = num(&restart["params"]["hot_set_pages"], "hot set");
    assert!(hot > 0.0);
    let cold = &restart["engines"]["cold"];
    let warm = &restart["engines"]["warm"];
    for (name, e) in [("cold", cold), ("warm", warm)] {
        assert!(e.get("failed").is_none(), "{name}: {e}");
        assert!(num(&e["seconds"], "seconds") > 0.0, "{name}");
        assert!(num(&e["seconds"], "seconds") >= num(&e["open_seconds"], "open_seconds"), "{name}");
        assert!(num(&e["ops_per_sec"], "ops_per_sec") > 0.0, "{name}");
        assert_eq!(e["verified"], true, "{name}");
        assert_eq!(e["mismatches"], 0, "{name}");
        assert_eq!(num(&e["read_hits"], "hits") + num(&e["read_misses"], "misses"), hot, "{name}: one fix per hot page");
    }
    // Cold: nothing loaded at open, every hot page read from disk afterwards.
    assert_eq!(cold["open_pages_loaded"], 0, "{cold}");
    assert_eq!(num(&cold["read_pages_from_disk"], "cold disk reads"), hot, "{cold}");
    // Warm: the snapshot was valid and the open loaded the hot set from the tier, so the
    // reads after it hit the pool.
    assert_eq!(warm["snapshot_valid"], true, "{warm}");
    assert!(num(&warm["snapshot_pages"], "snapshot pages") >= hot, "{warm}");
    assert!(num(&warm["open_remote_hits"], "remote hits at open") >= hot, "{warm}");
    assert_eq!(warm["read_misses"], 0, "{warm}");
    assert_eq!(warm["open_remote_rejected"], 0, "{warm}");
    assert!(num(&restart["ratios"]["warm/cold"], "ratio") > 0.0, "{restart}");
}
