//! `strata sql` through the command line: the `--json` object (keys, order, value forms),
//! `--csv`, the text table, `--file`, `EXPLAIN`, one-line errors with positions, and a
//! table larger than the 1 MiB pool streamed out.

mod common;

use std::path::{Path, PathBuf};

use common::{fails, json, ok, p};
use serde_json::json as j;

fn setup(dir: &Path) -> PathBuf {
    let db = dir.join("db");
    ok(&["create", p(&db), "--min-page", "4KiB"]);
    let csv = dir.join("t.csv");
    std::fs::write(
        &csv,
        "id,x,day,ok,name\n1,0.5,2024-02-29,true,\"a,b\"\n2,-2.25,1969-12-31,false,\n3,,2000-01-01,,\"say \"\"hi\"\"\"\n-4,1e300,,true,\"\"\n",
    )
    .unwrap();
    ok(&["import-csv", p(&db), "t", "--from", p(&csv), "--schema", "id:i64,x:f64,day:date,ok:bool,name:str", "--pool", "1MiB"]);
    db
}

#[test]
fn json_object_has_the_documented_shape() {
    let tmp = tempfile::tempdir().unwrap();
    let db = setup(tmp.path());
    let out = ok(&[
        "sql",
        p(&db),
        "--pool",
        "1MiB",
        "--json",
        "SELECT id, x * 2 AS x2, day, ok, name, day + INTERVAL '1' MONTH AS next FROM t WHERE id <> 3 OR name IS NULL",
    ]);
    assert_eq!(out.trim().lines().count(), 1, "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["columns"], j!(["id", "x2", "day", "ok", "name", "next"]));
    assert_eq!(
        v["rows"],
        j!([[1, 1.0, "2024-02-29", true, "a,b", "2024-03-29"], [2, -4.5, "1969-12-31", false, null, "1970-01-31"], [-4, 2e300, null, true, "", null]])
    );
    // Keys in the documented order, numbers as numbers.
    let at = |k: &str| out.find(&format!("\"{k}\"")).unwrap_or_else(|| panic!("{k} missing: {out}"));
    assert!(at("columns") < at("rows") && at("rows") < at("seconds") && at("seconds") < at("pool_bytes"));
    assert!(at("pool_bytes") < at("peak_resident_bytes") && at("peak_resident_bytes") < at("peak_rss_bytes"));
    assert_eq!(v["pool_bytes"], 1 << 20);
    assert!(v["seconds"].is_f64() && v["peak_resident_bytes"].as_u64().unwrap() <= 1 << 20 && v["peak_rss_bytes"].as_u64().unwrap() > 0);
    // Aggregates; an empty result.
    let v = json(&["sql", p(&db), "--pool", "1MiB", "--json", "SELECT count(*), count(x), sum(id), avg(x), min(name), max(day) FROM t"]);
    assert_eq!(v["rows"], j!([[4, 3, 2, (0.5 - 2.25 + 1e300) / 3.0, "", "2024-02-29"]]));
    let v = json(&["sql", p(&db), "--pool", "1MiB", "--json", "SELECT id FROM t WHERE false"]);
    assert_eq!(v["rows"], j!([]));
    assert_eq!(v["columns"], j!(["id"]));
}

#[test]
fn csv_text_file_and_explain() {
    let tmp = tempfile::tempdir().unwrap();
    let db = setup(tmp.path());
    let csv = ok(&["sql", p(&db), "--pool", "1MiB", "--csv", "SELECT id, name, x FROM t LIMIT 3"]);
    assert_eq!(csv, "id,name,x\n1,\"a,b\",0.5\n2,,-2.25\n3,\"say \"\"hi\"\"\",\n");
    let text = ok(&["sql", p(&db), "--pool", "1MiB", "SELECT id, name FROM t WHERE id > 0"]);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "id | name");
    assert!(lines[1].starts_with("---+-"), "{text}");
    assert_eq!(lines[2], " 1 | a,b");
    assert_eq!(lines[3], " 2 | NULL");
    assert_eq!(lines.last().unwrap().split(',').next().unwrap(), "(3 rows");
    let q = tmp.path().join("q.sql");
    std::fs::write(&q, "-- a comment\nSELECT count(*)\n  FROM t\n WHERE ok;\n").unwrap();
    assert_eq!(json(&["sql", p(&db), "--pool", "1MiB", "--json", "--file", p(&q)])["rows"], j!([[2]]));
    let plan = ok(&["sql", p(&db), "--pool", "1MiB", "EXPLAIN SELECT name FROM t WHERE id > 1 LIMIT 2"]);
    assert_eq!(plan, "Limit 2\n  Project name\n    Scan t filter (id > 1)\n");
    let plan = ok(&[
        "sql",
        p(&db),
        "--pool",
        "1MiB",
        "EXPLAIN SELECT a.name, count(*) FROM t AS a JOIN t AS b ON a.id = b.id WHERE b.ok GROUP BY a.name ORDER BY 2 DESC",
    ]);
    // b's filter keeps 2 of t's 4 rows (estimated on a sample): b is joined first and built
    // on; the aggregation reads the join's rows directly (no projection putting the columns
    // back in FROM's order).
    assert_eq!(
        plan,
        "Sort (external, temp pages) #2 DESC\n  Project a.name, count(*)\n    HashAggregate (temp pages, spills by partition) keys a.name aggs count(*)\n      \
         HashJoin inner on b.id = a.id (build: left, ~2 rows vs ~4, ~1 KiB vs ~1 KiB; grace partitions in temp pages)\n        \
         Scan t filter b.ok\n        Scan t\n"
    );
    let v = json(&["sql", p(&db), "--pool", "1MiB", "--json", "SELECT a.id, b.name FROM t AS a LEFT JOIN t AS b ON a.id = b.id + 1 ORDER BY a.id"]);
    assert_eq!(v["rows"], j!([[-4, null], [1, null], [2, "a,b"], [3, null]]));
}

#[test]
fn errors_are_one_line_with_positions() {
    let tmp = tempfile::tempdir().unwrap();
    let db = setup(tmp.path());
    let e = fails(&["sql", p(&db), "--pool", "1MiB", "SELECT id FROM t WHERE"]);
    assert!(e.contains("SQL error at 1:23: expected an expression, found the end of the query"), "{e}");
    let e = fails(&["sql", p(&db), "--pool", "1MiB", "SELECT nope FROM t"]);
    assert!(e.contains("at 1:8: no column named \"nope\" in table \"t\""), "{e}");
    let e = fails(&["sql", p(&db), "--pool", "1MiB", "SELECT * FROM missing"]);
    assert!(e.contains("no table named \"missing\""), "{e}");
    let e = fails(&["sql", p(&db), "--pool", "1MiB", "--json", "SELECT id + name FROM t"]);
    assert!(e.contains("cannot add i64 and str"), "{e}");
    let e = fails(&["sql", p(&db), "--pool", "1MiB", "WITH RECURSIVE w AS (SELECT 1) SELECT * FROM w"]);
    assert!(e.contains("SQL error at 1:1: WITH RECURSIVE is not supported yet"), "{e}");
    let e = fails(&["sql", p(&db), "--pool", "1MiB", "SELECT id FROM t AS a JOIN t AS b ON a.id = b.id"]);
    assert!(e.contains("at 1:8: column name \"id\" is ambiguous"), "{e}");
    let e = fails(&["sql", p(&db), "--pool", "1MiB", "SELECT id / 0 FROM t"]);
    assert!(e.contains("division by zero"), "{e}");
    fails(&["sql", p(&db), "--pool", "1MiB", "--json", "--csv", "SELECT 1"]);
    fails(&["sql", p(&db), "--pool", "1MiB"]);
}

#[test]
fn a_table_larger_than_the_pool_streams_out() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("db");
    ok(&["create", p(&db), "--min-page", "4KiB"]);
    let csv = tmp.path().join("big.csv");
    ok(&["gen", "csv", "--size", "6MiB", "--out", p(&csv)]);
    ok(&["import-csv", p(&db), "big", "--from", p(&csv), "--pool", "1MiB"]);
    let rows = json(&["query", p(&db), "--pool", "1MiB", "--json", "rows", "big"])["rows"].as_u64().unwrap();
    let out = ok(&["sql", p(&db), "--pool", "1MiB", "--csv", "SELECT * FROM big"]);
    // gen csv writes no line breaks inside fields: one line per row after the header.
    assert_eq!(out.lines().count() as u64, rows + 1, "{rows} rows");
    let v = json(&["sql", p(&db), "--pool", "1MiB", "--json", "SELECT count(*), count(name) FROM big WHERE id >= 0"]);
    assert_eq!(v["rows"][0][0], rows);
    assert!(v["peak_resident_bytes"].as_u64().unwrap() <= 1 << 20);
    // GROUP BY, DISTINCT, ORDER BY and a self-join of a table six times the pool: their
    // state spills through the 1 MiB pool.
    let v = json(&["sql", p(&db), "--pool", "1MiB", "--json", "SELECT count(*), sum(n), max(n) FROM (SELECT name, count(*) AS n FROM big GROUP BY name) AS g"]);
    assert_eq!(v["rows"][0][1], rows);
    assert!(v["peak_resident_bytes"].as_u64().unwrap() <= 1 << 20);
    let v = json(&["sql", p(&db), "--pool", "1MiB", "--json", "SELECT count(*) FROM big AS a JOIN big AS b ON a.id = b.id AND a.name = b.name"]);
    assert_eq!(v["rows"][0][0], rows);
    assert!(v["peak_resident_bytes"].as_u64().unwrap() <= 1 << 20);
    let v = json(&["sql", p(&db), "--pool", "1MiB", "--json", "SELECT count(*) FROM (SELECT DISTINCT id FROM big) AS d"]);
    assert_eq!(v["rows"][0][0], rows);
    let out = ok(&["sql", p(&db), "--pool", "1MiB", "--csv", "SELECT id, comment FROM big ORDER BY comment DESC, id"]);
    assert_eq!(out.lines().count() as u64, rows + 1);
    let v = json(&["sql", p(&db), "--pool", "1MiB", "--json", "SELECT id FROM big ORDER BY id DESC LIMIT 1"]);
    assert_eq!(v["rows"][0][0], json(&["sql", p(&db), "--pool", "1MiB", "--json", "SELECT max(id) FROM big"])["rows"][0][0]);
}
