//! `strata query ... groupby / distinct / join` through the binary: results against references
//! computed here from the generated files, bad input, and the memory cap of the process
//! (VmHWM) while the operators spill through a small pool.

use std::collections::HashMap;
use std::path::Path;

use serde_json::Value;

mod common;
use common::{fails, json, ok, p};

/// Values of a raw file as i128 (exact for every format).
fn read(path: &Path, format: &str) -> Vec<i128> {
    let bytes = std::fs::read(path).unwrap();
    match format {
        "u32le" => bytes.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().unwrap()) as i128).collect(),
        "u64le" => bytes.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap()) as i128).collect(),
        _ => bytes.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap()) as i128).collect(),
    }
}

fn counts(vals: &[i128]) -> HashMap<i128, u64> {
    let mut m = HashMap::new();
    for &v in vals {
        *m.entry(v).or_insert(0u64) += 1;
    }
    m
}

/// The expected `result` objects.
fn want_groupby(vals: &[i128], m: u64) -> Value {
    let mut c = vec![0u64; m as usize];
    for &v in vals {
        c[v.rem_euclid(m as i128) as usize] += 1;
    }
    serde_json::json!({"groups": c.iter().filter(|&&x| x > 0).count(), "counts": c})
}

fn want_distinct(vals: &[i128]) -> Value {
    let m = counts(vals);
    let top = m.iter().map(|(&v, &c)| (std::cmp::Reverse(c), v)).min();
    match top {
        Some((std::cmp::Reverse(c), v)) => serde_json::json!({"groups": m.len(), "top_value": v, "top_count": c}),
        None => serde_json::json!({"groups": 0, "top_value": null, "top_count": 0}),
    }
}

fn want_join(a: &[i128], b: &[i128]) -> Value {
    let m = counts(b);
    let (mut matches, mut checksum) = (0u128, 0u64);
    for v in a {
        if let Some(&c) = m.get(v) {
            matches += c as u128;
            checksum = checksum.wrapping_add((*v as u64).wrapping_mul(c));
        }
    }
    serde_json::json!({"matches": matches, "checksum": checksum})
}

fn query(db: &Path, pool: &str, threads: usize, op: &[&str]) -> Value {
    let t = threads.to_string();
    let mut args = vec!["query", p(db), "--pool", pool, "--threads", &t, "--json"];
    args.extend_from_slice(op);
    let out = json(&args);
    let peak = out["peak_resident_bytes"].as_u64().unwrap();
    assert!(peak <= out["pool_bytes"].as_u64().unwrap(), "{out}");
    out
}

#[test]
fn groupby_distinct_join_match_references_for_every_format() {
    let t = tempfile::tempdir().unwrap();
    let db = t.path().join("db");
    ok(&["create", p(&db), "--min-page", "4KiB"]);
    // u32: 400 K values with many duplicates, and 200 K overlapping values.
    let a = t.path().join("a.u32");
    let b = t.path().join("b.u32");
    ok(&["gen", "ints", "--count", "400000", "--seed", "11", "--out", p(&a), "--max", "150000"]);
    ok(&["gen", "ints", "--count", "200000", "--seed", "12", "--out", p(&b), "--max", "300000"]);
    // u64: full range (all distinct) and a copy of it, so every value matches once.
    let c = t.path().join("c.u64");
    ok(&["gen", "ints", "--count", "300000", "--seed", "13", "--out", p(&c), "--format", "u64le"]);
    // i64: negative and positive values.
    let s = t.path().join("s.i64");
    let signed: Vec<i64> = (0..250_000i64).map(|i| (i * 7919 % 20_011 - 10_000) * 1_000_003).collect();
    std::fs::write(&s, signed.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>()).unwrap();
    for (name, file, format) in [("a", &a, "u32le"), ("b", &b, "u32le"), ("c", &c, "u64le"), ("c2", &c, "u64le"), ("s", &s, "i64le")] {
        ok(&["import", p(&db), name, "--from", p(file), "--format", format, "--pool", "4MiB"]);
    }
    let (va, vb, vc, vs) = (read(&a, "u32le"), read(&b, "u32le"), read(&c, "u64le"), read(&s, "i64le"));

    for (pool, threads) in [("1MiB", 1usize), ("3MiB", 3), ("64MiB", 2)] {
        for (col, vals) in [("a", &va), ("c", &vc), ("s", &vs)] {
            for m in [1u64, 7, 256, 1000] {
                let out = query(&db, pool, threads, &["groupby", col, "--mod", &m.to_string()]);
                assert_eq!(out["op"], "groupby");
                assert_eq!(out["result"], want_groupby(vals, m), "groupby {col} --mod {m} pool {pool}");
            }
            let out = query(&db, pool, threads, &["distinct", col]);
            assert_eq!(out["op"], "distinct");
            assert_eq!(out["result"], want_distinct(vals), "distinct {col} pool {pool}");
        }
        for (x, y, vx, vy) in [("a", "b", &va, &vb), ("b", "a", &vb, &va), ("c", "c2", &vc, &vc), ("s", "s", &vs, &vs), ("a", "s", &va, &vs)] {
            let out = query(&db, pool, threads, &["join", x, y]);
            assert_eq!(out["op"], "join");
            assert_eq!(out["result"], want_join(vx, vy), "join {x} {y} pool {pool}");
        }
    }
    // Negative values come out as negative JSON integers.
    let out = query(&db, "2MiB", 1, &["distinct", "s"]);
    assert!(out["result"]["top_value"].as_i64().is_some());
    assert!(vs.iter().any(|&v| v < 0));
    // The join of a column with its copy matches each (distinct) value once.
    let out = query(&db, "1MiB", 2, &["join", "c", "c2"]);
    assert_eq!(out["result"]["matches"].as_u64().unwrap(), counts(&vc).values().map(|&n| n * n).sum::<u64>());

    // Bad input: one-line errors, database unchanged.
    let err = fails(&["query", p(&db), "--pool", "4MiB", "groupby", "a", "--mod", "0"]);
    assert!(err.contains("--mod"), "{err}");
    fails(&["query", p(&db), "--pool", "4MiB", "groupby", "a", "--mod", "-3"]);
    fails(&["query", p(&db), "--pool", "4MiB", "groupby", "a"]);
    let err = fails(&["query", p(&db), "--pool", "4MiB", "distinct", "nope"]);
    assert!(err.contains("nope"), "{err}");
    fails(&["query", p(&db), "--pool", "4MiB", "join", "a", "nope"]);
    fails(&["query", p(&db), "--pool", "4MiB", "join", "a"]);
    assert_eq!(json(&["check", p(&db), "--json"])["ok"], true);
}

#[test]
fn eight_million_values_through_an_8_mib_pool_stay_under_the_rss_cap() {
    let t = tempfile::tempdir().unwrap();
    let db = t.path().join("db");
    let v = t.path().join("v.u32");
    let x = t.path().join("x.u32");
    let y = t.path().join("y.u32");
    ok(&["gen", "ints", "--count", "8000000", "--seed", "5", "--out", p(&v)]);
    // Two 4 M columns over a range where about half of the values find a partner.
    ok(&["gen", "ints", "--count", "4000000", "--seed", "6", "--out", p(&x), "--max", "8000000"]);
    ok(&["gen", "ints", "--count", "4000000", "--seed", "7", "--out", p(&y), "--max", "8000000"]);
    ok(&["create", p(&db)]);
    for (name, file) in [("v", &v), ("x", &x), ("y", &y)] {
        ok(&["import", p(&db), name, "--from", p(file), "--format", "u32le", "--pool", "8MiB"]);
    }
    let pool: u64 = 8 << 20;
    let cap = pool + (48 << 20);
    let check_rss = |out: &Value| {
        let rss = out["peak_rss_bytes"].as_u64().expect("VmHWM readable");
        assert!(rss <= cap, "peak RSS {} MiB exceeds pool + 48 MiB: {out}", rss >> 20);
        assert!(out["peak_resident_bytes"].as_u64().unwrap() <= pool);
    };

    let vals: Vec<u32> = std::fs::read(&v).unwrap().chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect();
    let out = query(&db, "8MiB", 2, &["groupby", "v", "--mod", "256"]);
    check_rss(&out);
    let mut want = vec![0u64; 256];
    for &x in &vals {
        want[(x % 256) as usize] += 1;
    }
    assert_eq!(out["result"]["counts"], serde_json::json!(want));
    assert_eq!(out["result"]["groups"], 256);

    // 2^22 counts: 32 MiB as a heap array, far more as JSON text or a JSON value; streamed
    // from a merge in temporary pages, the process stays under the cap.
    let m = 1usize << 22;
    let out = query(&db, "8MiB", 2, &["groupby", "v", "--mod", &m.to_string()]);
    check_rss(&out);
    let mut want = vec![0u64; m];
    for &x in &vals {
        want[x as usize % m] += 1;
    }
    let got = out["result"]["counts"].as_array().expect("counts");
    assert_eq!(got.len(), m);
    assert!(got.iter().zip(&want).all(|(g, &w)| g.as_u64() == Some(w)), "counts differ from the reference");
    assert_eq!(out["result"]["groups"].as_u64(), Some(want.iter().filter(|&&c| c > 0).count() as u64));
    drop((want, out));

    let out = query(&db, "8MiB", 2, &["distinct", "v"]);
    check_rss(&out);
    assert!(out["bytes_written"].as_u64().unwrap() > 0, "distinct of 8 M values spills through an 8 MiB pool");
    let mut sorted = vals;
    sorted.sort_unstable();
    let (mut groups, mut top, mut top_count, mut i) = (0u64, 0u32, 0u64, 0usize);
    while i < sorted.len() {
        let mut j = i;
        while j < sorted.len() && sorted[j] == sorted[i] {
            j += 1;
        }
        groups += 1;
        if (j - i) as u64 > top_count {
            top_count = (j - i) as u64;
            top = sorted[i];
        }
        i = j;
    }
    assert_eq!(out["result"], serde_json::json!({"groups": groups, "top_value": top, "top_count": top_count}));
    drop(sorted);

    let out = query(&db, "8MiB", 2, &["join", "x", "y"]);
    check_rss(&out);
    let (vx, vy) = (read(&x, "u32le"), read(&y, "u32le"));
    assert_eq!(out["result"], want_join(&vx, &vy));
}
