//! End-to-end tests of `strata query ... sort`, `strata import-edges`, `strata query ... bfs`
//! and `strata gen rmat` against in-memory references, bad edge lists, and the memory cap
//! of a full sort measured on the real process.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::Path;

use serde_json::Value;

mod common;
use common::{fails, json, ok, p};

/// `first`, `last` and `checksum` of the contract, computed in memory.
fn sort_reference(mut vals: Vec<i128>, k: usize) -> (Vec<i128>, Vec<i128>, u64) {
    vals.sort_unstable();
    let k = k.min(vals.len());
    let checksum = vals.iter().enumerate().fold(0u64, |s, (i, &v)| s.wrapping_add((i as u64 + 1).wrapping_mul(v as u64)));
    (vals[..k].to_vec(), vals[vals.len() - k..].to_vec(), checksum)
}

fn ints(v: &Value) -> Vec<i128> {
    // Exact integers (serde_json keeps them exact with arbitrary_precision).
    v.as_array().unwrap().iter().map(|x| x.to_string().parse::<i128>().unwrap()).collect()
}

fn check_sort_output(out: &Value, want: &(Vec<i128>, Vec<i128>, u64)) {
    assert_eq!(out["op"], "sort");
    assert_eq!(ints(&out["result"]["first"]), want.0);
    assert_eq!(ints(&out["result"]["last"]), want.1);
    assert_eq!(out["result"]["checksum"].as_u64().unwrap(), want.2);
}

#[test]
fn sort_matches_a_reference_for_every_format() {
    let t = tempfile::tempdir().unwrap();
    let db = t.path().join("db");
    ok(&["create", p(&db), "--min-page", "4KiB"]);
    let input = t.path().join("v.u32");
    ok(&["gen", "ints", "--count", "600000", "--seed", "9", "--out", p(&input), "--max", "100000"]);
    ok(&["import", p(&db), "v", "--from", p(&input), "--format", "u32le", "--pool", "1MiB"]);
    let vals: Vec<i128> = std::fs::read(&input).unwrap().chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().unwrap()) as i128).collect();
    for (threads, top) in [("1", None), ("2", Some("3")), ("3", Some("0"))] {
        let mut args = vec!["query", p(&db), "--pool", "1MiB", "--threads", threads, "--json", "sort", "v"];
        if let Some(k) = top {
            args.extend(["--top", k]);
        }
        let out = json(&args);
        check_sort_output(&out, &sort_reference(vals.clone(), top.map_or(10, |k| k.parse().unwrap())));
        assert!(out["peak_resident_bytes"].as_u64().unwrap() <= 1 << 20);
        assert!(out["bytes_written"].as_u64().unwrap() > 0, "2.3 MiB of values through a 1 MiB pool spill");
    }
    let text = ok(&["query", p(&db), "--pool", "1MiB", "sort", "v", "--top", "2"]);
    assert!(text.starts_with("sort: first"), "{text}");

    let u64s = t.path().join("v.u64");
    ok(&["gen", "ints", "--count", "100000", "--seed", "4", "--out", p(&u64s), "--format", "u64le"]);
    ok(&["import", p(&db), "w", "--from", p(&u64s), "--format", "u64le"]);
    let vals: Vec<i128> = std::fs::read(&u64s).unwrap().chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap()) as i128).collect();
    check_sort_output(&json(&["query", p(&db), "--pool", "1MiB", "--json", "sort", "w", "--top", "4"]), &sort_reference(vals, 4));

    let signed: Vec<i128> = (0..100_000i128).map(|i| (i * 7919 % 100_003 - 50_000) * 1_000_000_000_000).collect();
    let f = t.path().join("s.i64");
    std::fs::write(&f, signed.iter().flat_map(|&v| (v as i64).to_le_bytes()).collect::<Vec<u8>>()).unwrap();
    ok(&["import", p(&db), "s", "--from", p(&f), "--format", "i64le"]);
    let raw = ok(&["query", p(&db), "--pool", "1MiB", "--threads", "2", "--json", "sort", "s"]);
    let want = sort_reference(signed, 10);
    assert!(raw.contains(&format!("{}", want.0[0])) && want.0[0] < 0, "negative values are printed exactly: {raw}");
    check_sort_output(&serde_json::from_str(&raw).unwrap(), &want);

    let e = fails(&["query", p(&db), "--pool", "1MiB", "sort", "nope"]);
    assert!(e.contains("no column named \"nope\""), "{e}");
    ok(&["check", p(&db)]);
}

/// Edges of a SNAP text file.
fn read_edges(path: &Path) -> Vec<(u64, u64)> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let mut it = l.split_whitespace().map(|t| t.parse::<u64>().unwrap());
            (it.next().unwrap(), it.next().unwrap())
        })
        .collect()
}

fn bfs_reference(adj: &BTreeMap<u64, Vec<u64>>, s: u64) -> (u64, u64, u64) {
    let mut dist = BTreeMap::from([(s, 0u64)]);
    let mut q = VecDeque::from([s]);
    while let Some(u) = q.pop_front() {
        let d = dist[&u];
        for &v in adj.get(&u).map(|v| v.as_slice()).unwrap_or(&[]) {
            dist.entry(v).or_insert_with(|| {
                q.push_back(v);
                d + 1
            });
        }
    }
    (dist.len() as u64, dist.values().copied().max().unwrap(), dist.values().fold(0u64, |a, &d| a.wrapping_add(d)))
}

#[test]
fn rmat_import_and_bfs_match_a_reference() {
    let t = tempfile::tempdir().unwrap();
    let db = t.path().join("db");
    let file = t.path().join("g.txt");
    ok(&["gen", "rmat", "--scale", "14", "--edgefactor", "8", "--seed", "5", "--out", p(&file)]);
    let edges = read_edges(&file);
    assert_eq!(edges.len(), 8 << 14);
    assert!(edges.iter().all(|&(u, v)| u < 1 << 14 && v < 1 << 14));
    ok(&["create", p(&db), "--min-page", "4KiB"]);
    let imp = json(&["import-edges", p(&db), "g", "--from", p(&file), "--pool", "1MiB", "--json"]);
    let ids: BTreeSet<u64> = edges.iter().flat_map(|&(u, v)| [u, v]).collect();
    assert_eq!(imp["edges"].as_u64().unwrap(), edges.len() as u64);
    assert_eq!(imp["vertices"].as_u64().unwrap(), ids.len() as u64);
    assert!(imp["peak_resident_bytes"].as_u64().unwrap() <= 1 << 20);
    let mut adj: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for &(u, v) in &edges {
        adj.entry(u).or_default().push(v);
    }
    // The biggest hub, an ordinary vertex, and a sink (in-edges only).
    let hub = *adj.iter().max_by_key(|(_, l)| l.len()).unwrap().0;
    let sink = *ids.iter().find(|v| !adj.contains_key(v)).expect("R-MAT has sinks");
    for (s, threads) in [(hub, "2"), (edges[100].0, "1"), (sink, "2")] {
        let out = json(&["query", p(&db), "--pool", "512KiB", "--threads", threads, "--json", "bfs", "g", "--source", &s.to_string()]);
        let (reached, max_depth, depth_sum) = bfs_reference(&adj, s);
        assert_eq!(out["op"], "bfs");
        assert_eq!(out["result"]["reached"].as_u64().unwrap(), reached, "source {s}");
        assert_eq!(out["result"]["max_depth"].as_u64().unwrap(), max_depth, "source {s}");
        assert_eq!(out["result"]["depth_sum"].as_u64().unwrap(), depth_sum, "source {s}");
        assert!(out["peak_resident_bytes"].as_u64().unwrap() <= 512 << 10);
    }
    let missing = (0..1u64 << 14).find(|v| !ids.contains(v)).expect("R-MAT leaves ids unused");
    let e = fails(&["query", p(&db), "--pool", "1MiB", "bfs", "g", "--source", &missing.to_string()]);
    assert!(e.contains("does not exist") && e.contains(&missing.to_string()), "{e}");
    let e = fails(&["query", p(&db), "--pool", "1MiB", "bfs", "g", "--source", &(1u64 << 40).to_string()]);
    assert!(e.contains("does not exist"), "{e}");
    let e = fails(&["query", p(&db), "--pool", "1MiB", "bfs", "nope", "--source", "1"]);
    assert!(e.contains("no graph named \"nope\""), "{e}");
    let check = json(&["check", p(&db), "--json"]);
    assert_eq!(check["ok"], true);
    assert_eq!(check["report"]["graphs"], 1);
}

#[test]
fn bad_edge_lists_fail_with_the_line_and_leave_the_database_consistent() {
    let t = tempfile::tempdir().unwrap();
    let db = t.path().join("db");
    ok(&["create", p(&db), "--min-page", "4KiB"]);
    let good: String = (0..20_000u64).map(|i| format!("{} {}\n", i * 13 % 4099, i * 7 % 4093)).collect();
    for (name, text, line, what) in [
        ("malformed", format!("# header\n{good}1 2 x\n"), 20_002, "two vertex ids"),
        ("letters", format!("{good}\n\nabc 1\n"), 20_003, "not a non-negative integer"),
        ("overflow", format!("1 2\n3 99999999999999999999\n{good}"), 2, "does not fit"),
    ] {
        let f = t.path().join(name);
        std::fs::write(&f, text).unwrap();
        let e = fails(&["import-edges", p(&db), "g", "--from", p(&f), "--pool", "1MiB"]);
        assert!(e.contains(&format!("line {line}")) && e.contains(what), "{name}: {e}");
        let check = json(&["check", p(&db), "--json"]);
        assert_eq!(check["ok"], true);
        assert_eq!(check["report"]["graphs"], 0);
        assert_eq!(check["report"]["unreferenced_pages"], 0, "a failed import frees its pages");
    }
    let e = fails(&["import-edges", p(&db), "g", "--from", p(&t.path().join("absent"))]);
    assert!(e.contains("absent"), "{e}");
    let e = fails(&["query", p(&db), "--pool", "1MiB", "bfs", "g", "--source", "1"]);
    assert!(e.contains("no graph named \"g\""), "{e}");
    let f = t.path().join("good");
    std::fs::write(&f, &good).unwrap();
    ok(&["import-edges", p(&db), "g", "--from", p(&f), "--pool", "1MiB"]);
    let e = fails(&["import-edges", p(&db), "g", "--from", p(&f)]);
    assert!(e.contains("already exists"), "{e}");
    ok(&["check", p(&db)]);
}

/// A full sort of 8 M u32 values (30.5 MiB) through an 8 MiB pool keeps the process's peak
/// RSS (VmHWM) within 8 MiB + 48 MiB, also when the result holds millions of values.
#[test]
fn full_sort_stays_under_the_rss_cap() {
    let t = tempfile::tempdir().unwrap();
    let db = t.path().join("db");
    let input = t.path().join("v.u32");
    ok(&["gen", "ints", "--count", "8000000", "--seed", "21", "--out", p(&input)]);
    ok(&["create", p(&db)]);
    ok(&["import", p(&db), "v", "--from", p(&input), "--format", "u32le", "--pool", "8MiB"]);
    let vals: Vec<i128> = std::fs::read(&input).unwrap().chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().unwrap()) as i128).collect();
    std::fs::remove_file(&input).unwrap();
    let cap = (8u64 << 20) + (48 << 20);
    // --top 2000000: 4 M values in the result, streamed from the merge (the last ones from a
    // run of temporary pages), never held in the heap as values or as text.
    for (threads, top) in [("1", "10"), ("2", "10"), ("2", "2000000")] {
        let out = json(&["query", p(&db), "--pool", "8MiB", "--threads", threads, "--json", "sort", "v", "--top", top]);
        check_sort_output(&out, &sort_reference(vals.clone(), top.parse().unwrap()));
        let rss = out["peak_rss_bytes"].as_u64().expect("VmHWM readable");
        assert!(rss <= cap, "sort --top {top} peak RSS {rss} > {cap}");
        assert!(out["peak_resident_bytes"].as_u64().unwrap() <= 8 << 20);
    }
}
