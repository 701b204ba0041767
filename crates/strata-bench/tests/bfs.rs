//! `bench bfs`: both engines (read-ahead on and off) run a cold and a warm BFS over the
//! generated graph, out of memory, and report the BFS result an in-memory BFS over the same
//! generated edges computes; the plot is drawn.

use std::collections::VecDeque;

use serde_json::Value;
use strata_bench::benchmarks::bfs_edges;
use strata_bench::Options;

/// (reached, max_depth, depth_sum) of a BFS from `source` over `vertices` vertices.
fn reference(vertices: u64, seed: u64, source: u64) -> (u64, u64, u64) {
    let mut adj: Vec<Vec<u32>> = vec![Vec::new(); vertices as usize];
    for (u, v) in bfs_edges(vertices, seed) {
        adj[u as usize].push(v as u32);
    }
    let mut dist = vec![u64::MAX; vertices as usize];
    dist[source as usize] = 0;
    let mut q = VecDeque::from([source as u32]);
    let (mut reached, mut max_depth, mut depth_sum) = (1u64, 0u64, 0u64);
    while let Some(u) = q.pop_front() {
        let d = dist[u as usize] + 1;
        for &v in &adj[u as usize] {
            if dist[v as usize] == u64::MAX {
                dist[v as usize] = d;
                reached += 1;
                max_depth = max_depth.max(d);
                depth_sum = depth_sum.wrapping_add(d);
                q.push_back(v);
            }
        }
    }
    (reached, max_depth, depth_sum)
}

#[test]
fn bfs_bench_engines_agree_with_an_in_memory_bfs() {
    let t = tempfile::tempdir().unwrap();
    let opts =
        Options { threads: Some(vec![1, 2]), pool: Some(2 << 20), data: Some(6 << 20), rounds: Some(2), dir: Some(t.path().to_owned()), ..Options::default() };
    let v = strata_bench::run("bfs", &opts).unwrap();
    assert_eq!(v["bench"], "bfs");
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 4, "cold and warm x 2 thread counts: {v}");
    let p = &runs[0]["params"];
    let n = p["generated_vertices"].as_u64().unwrap();
    let want = reference(n, p["seed"].as_u64().unwrap(), p["source"].as_u64().unwrap());
    assert!(want.0 > n / 2 && want.1 >= 2, "the source reaches most of the graph: {want:?}");
    for r in runs {
        let p = &r["params"];
        assert!(["cold", "warm"].contains(&p["phase"].as_str().unwrap()), "{p}");
        assert_eq!(p["rounds"], 2);
        assert!(p["data_bytes"].as_u64().unwrap() >= 2 * p["pool_bytes"].as_u64().unwrap(), "the CSR is larger than the pool: {p}");
        assert!(p["edges"].as_u64().unwrap() >= 8 * n, "{p}");
        assert_eq!(r["results_agree"], true);
        for name in ["strata", "strata-noprefetch"] {
            let e = &r["engines"][name];
            assert!(e.get("failed").is_none(), "{name}: {r}");
            let got = (e["reached"].as_u64().unwrap(), e["max_depth"].as_u64().unwrap(), e["depth_sum"].as_u64().unwrap());
            assert_eq!(got, want, "{name}: {r}");
            for k in ["seconds", "ops_per_sec", "bytes_per_sec", "cpu_seconds", "p50_us"] {
                assert!(e[k].as_f64().is_some_and(|x| x > 0.0), "{name}.{k}: {r}");
            }
            assert_eq!(e["rounds_seconds"].as_array().unwrap().len(), 2, "{r}");
            // Out of memory: the BFS reads the graph.
            assert!(e["bytes_read"].as_u64().unwrap() >= p["data_bytes"].as_u64().unwrap() / 2, "{name}: {r}");
        }
        assert_eq!(r["engines"]["strata-noprefetch"]["pages_prefetched"], 0, "no read-ahead: {r}");
        assert_eq!(r["engines"]["strata-noprefetch"]["sequential_windows"], 0, "{r}");
        assert!(r["ratios"]["strata-noprefetch"].as_f64().is_some_and(|x| x > 0.0), "{r}");
    }
    let png = t.path().join("bfs.png");
    strata_bench::plot::plot_bfs(&v, &png).unwrap();
    assert!(std::fs::read(&png).unwrap().starts_with(b"\x89PNG"));
    // One engine alone, and an engine bfs does not know.
    let one = Options { engines: Some(vec!["strata-noprefetch".into()]), threads: Some(vec![1]), rounds: Some(1), ..opts.clone() };
    let v = strata_bench::run("bfs", &one).unwrap();
    let r: &Value = &v["runs"][0];
    assert_eq!(r["engines"].as_object().unwrap().len(), 1, "{r}");
    let bad = Options { engines: Some(vec!["raw".into()]), ..opts };
    assert!(strata_bench::run("bfs", &bad).unwrap_err().contains("no engine \"raw\""));
}
