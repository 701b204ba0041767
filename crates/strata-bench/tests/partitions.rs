//! `bench partitions`: every partition count runs in and out of memory at each thread count,
//! reports its partitions and the measured phase's contention counters, and the speedups
//! are relative to one partition.

use strata_bench::Options;

#[test]
fn partitions_bench_runs_every_count_in_and_out_of_memory() {
    let t = tempfile::tempdir().unwrap();
    let opts = Options {
        threads: Some(vec![1, 2]),
        pool: Some(1 << 20),
        ops: Some(50),
        dir: Some(t.path().to_owned()),
        partitions: Some(vec![1, 4]),
        ..Options::default()
    };
    let v = strata_bench::run("partitions", &opts).unwrap();
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 4, "in and out x 2 thread counts: {v}");
    for r in runs {
        assert_eq!(r["params"]["partitions"], serde_json::json!([1, 4]));
        for (name, parts) in [("strata-p1", 1), ("strata-p4", 4)] {
            let e = &r["engines"][name];
            assert!(e.get("failed").is_none(), "{name}: {r}");
            assert_eq!(e["clock_partitions"], parts, "{name}: {r}");
            assert!(e["ops_per_sec"].as_f64().is_some_and(|x| x > 0.0), "{name}: {r}");
            let c = &e["measured_contention"];
            for k in ["latch_waits", "reservation_waits", "resident_set_waits", "clock_moves"] {
                assert!(c[k].is_u64(), "{name}: {k} missing: {r}");
            }
            assert_eq!(c["resident_set_waits"], 0);
        }
        assert_eq!(r["speedup_vs_one_partition"]["strata-p1"], 1.0);
        assert!(r["speedup_vs_one_partition"]["strata-p4"].as_f64().is_some_and(|x| x > 0.0), "{r}");
    }
    let out = runs.iter().find(|r| r["params"]["memory"] == "out").unwrap();
    assert!(out["engines"]["strata-p4"]["evictions"].as_u64().is_some_and(|n| n > 0), "the clock ran out of memory: {out}");
    let png = t.path().join("p.png");
    strata_bench::plot::plot_partitions(&v, &png).unwrap();
    assert!(std::fs::metadata(&png).unwrap().len() > 1000);
}

#[test]
fn partitions_options_are_checked() {
    let bad = |o: Options, name: &str| strata_bench::run(name, &o).unwrap_err();
    let e = bad(Options { partitions: Some(vec![3]), ..Options::default() }, "partitions");
    assert!(e.contains("power of two"), "{e}");
    let e = bad(Options { partitions: Some(vec![2]), ..Options::default() }, "random-read");
    assert!(e.contains("partitions only"), "{e}");
}
