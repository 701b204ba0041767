//! `strata gen tpch`, `strata import-tpch` and `strata demo --tpch` at SF 0.01 (the answers
//! themselves are checked by crates/strata/tests/tpch.rs against a naive evaluation).

mod common;

use common::{fails, json, ok, p};

#[test]
fn gen_import_and_query_tpch() {
    let tmp = tempfile::tempdir().unwrap();
    let (csv, db) = (tmp.path().join("csv"), tmp.path().join("db"));
    ok(&["gen", "tpch", "--sf", "0.01", "--out", p(&csv)]);
    let head = std::fs::read_to_string(csv.join("lineitem.csv")).unwrap();
    assert!(head.starts_with("l_orderkey,l_partkey,l_suppkey,l_linenumber,l_quantity,l_extendedprice,l_discount,l_tax,"), "{}", &head[..200]);
    let v = json(&["import-tpch", p(&db), "--from", p(&csv), "--pool", "4MiB", "--json"]);
    let tables: Vec<(String, u64)> =
        v["tables"].as_array().unwrap().iter().map(|t| (t["table"].as_str().unwrap().to_owned(), t["rows"].as_u64().unwrap())).collect();
    assert_eq!(
        tables,
        [("region", 5), ("nation", 25), ("supplier", 100), ("customer", 1500), ("part", 2000), ("partsupp", 8000), ("orders", 15000), ("lineitem", 60175)]
            .map(|(t, n)| (t.to_owned(), n))
    );
    // Bad scale factors and a directory without the tables are errors, not panics.
    for sf in ["0", "0.00001", "-1", "nan", "1e9"] {
        assert!(fails(&["gen", "tpch", &format!("--sf={sf}"), "--out", p(&tmp.path().join("bad"))]).contains("--sf must be"), "{sf}");
    }
    assert!(fails(&["import-tpch", p(&tmp.path().join("db2")), "--from", p(tmp.path())]).contains("region.csv is missing"));
    assert!(!tmp.path().join("db2").exists());
    // Importing again is refused (the tables exist), not appended.
    assert!(fails(&["import-tpch", p(&db), "--from", p(&csv)]).contains("exists already"));
    let q1 = concat!(env!("CARGO_MANIFEST_DIR"), "/../strata/tests/tpch/q1.sql");
    let v = json(&["sql", p(&db), "--pool", "4MiB", "--json", "--file", q1]);
    assert_eq!(v["columns"][0], "l_returnflag");
    assert_eq!(v["rows"].as_array().unwrap().len(), 4);
    let demo = tmp.path().join("demo");
    let out = ok(&["demo", "--tpch", "--sf", "0.01", "--pool", "4MiB", "--dir", p(&demo)]);
    assert!(out.contains("-- TPC-H Q19") && out.contains("times: q1 "), "{out}");
    // The generator's 300 MiB text pool lives in a child process: the peak RSS the demo
    // reports is the engine's (pool + its own memory), not the generator's.
    let rss = out.lines().find_map(|l| l.split("peak RSS ").nth(1)).and_then(|r| r.split(" MiB").next()).and_then(|m| m.parse::<f64>().ok());
    assert!(rss.is_some_and(|m| m < 4.0 + 48.0), "peak RSS within pool + 48 MiB: {out}");
}
