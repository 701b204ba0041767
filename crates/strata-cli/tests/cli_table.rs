//! Tables through the command line: `import-csv` (RFC 4180 edge cases, inferred and given
//! schemas, bad rows), `import-parquet`, `export`, `query get|rows`, a 4 KiB smallest class,
//! a 50 MiB string, and a load far larger than the pool under the RSS cap.

mod common;

use std::path::Path;
use std::sync::Arc;

use common::{fails, json, ok, p};
use serde_json::json as j;

fn db(dir: &Path, min_page: &str) -> std::path::PathBuf {
    let db = dir.join("db");
    ok(&["create", p(&db), "--min-page", min_page]);
    db
}

/// Imports `csv` as table `t` (with `extra` arguments), exports it, returns the export.
fn round_trip(dir: &Path, db: &Path, name: &str, csv: &[u8], extra: &[&str]) -> String {
    let input = dir.join(format!("{name}.csv"));
    std::fs::write(&input, csv).unwrap();
    let mut args = vec!["import-csv", p(db), name, "--from", p(&input), "--pool", "1MiB", "--json"];
    args.extend_from_slice(extra);
    json(&args);
    let out = dir.join(format!("{name}.out.csv"));
    ok(&["export", p(db), name, "--to", p(&out), "--pool", "1MiB"]);
    std::fs::read_to_string(out).unwrap()
}

fn get(db: &Path, table: &str, row: u64) -> serde_json::Value {
    json(&["query", p(db), "--pool", "1MiB", "--json", "get", table, "--row", &row.to_string()])["row"].clone()
}

fn rows(db: &Path, table: &str) -> u64 {
    json(&["query", p(db), "--pool", "1MiB", "--json", "rows", table])["rows"].as_u64().unwrap()
}

#[test]
fn csv_edge_cases_import_and_export_to_the_same_values() {
    let tmp = tempfile::tempdir().unwrap();
    let db = db(tmp.path(), "64KiB");
    // Quoted delimiters, newlines and quotes; empty string vs NULL; UTF-8. Written in the
    // export's own form, so the export must give back the same bytes.
    let canonical = "id,name,score,day,ok\n1,\"a,b\",0.1,2024-02-29,true\n2,\"line1\nline2\",-0.0,1969-12-31,false\n3,\"say \"\"hi\"\"\",1e300,,\n4,\"\",NaN,1970-01-01,true\n5,,inf,2000-01-01,false\n6,東京 café ☕,-2.5,0001-01-01,true\n";
    assert_eq!(round_trip(tmp.path(), &db, "edge", canonical.as_bytes(), &[]), canonical);
    assert_eq!(get(&db, "edge", 0), j!({"id": 1, "name": "a,b", "score": 0.1, "day": "2024-02-29", "ok": true}));
    assert_eq!(get(&db, "edge", 2), j!({"id": 3, "name": "say \"hi\"", "score": 1e300, "day": null, "ok": null}));
    assert_eq!(get(&db, "edge", 3)["name"], j!(""));
    assert_eq!(get(&db, "edge", 4)["name"], j!(null));
    assert_eq!(get(&db, "edge", 5)["name"], j!("東京 café ☕"));
    // Column order in the object is the schema's.
    let s = ok(&["query", p(&db), "--pool", "1MiB", "--json", "get", "edge", "--row", "1"]);
    let at = |k: &str| s.find(&format!("\"{k}\"")).unwrap();
    assert!(at("id") < at("name") && at("name") < at("score") && at("score") < at("day") && at("day") < at("ok"), "{s}");
    let stats = json(&["query", p(&db), "--pool", "1MiB", "--json", "rows", "edge"]);
    assert_eq!(stats["rows"], 6);

    // One column with a NULL line; no final newline; a header only; an integer too large for
    // i64 (kept as a string); CRLF line ends.
    assert_eq!(round_trip(tmp.path(), &db, "one", b"x\n1\n\n3\n", &[]), "x\n1\n\n3\n");
    assert_eq!(get(&db, "one", 1), j!({"x": null}));
    assert_eq!(round_trip(tmp.path(), &db, "nofinal", b"a,b\n1,2\n3,4", &[]), "a,b\n1,2\n3,4\n");
    assert_eq!(round_trip(tmp.path(), &db, "header", b"a,b\n", &[]), "a,b\n");
    assert_eq!(rows(&db, "header"), 0);
    assert_eq!(round_trip(tmp.path(), &db, "big", b"n\n1\n99999999999999999999\n", &[]), "n\n1\n99999999999999999999\n");
    assert_eq!(get(&db, "big", 0), j!({"n": "1"}));
    assert_eq!(round_trip(tmp.path(), &db, "crlf", b"a,b\r\n1,x\r\n2,y\r\n", &[]), "a,b\n1,x\n2,y\n");

    // No header, other delimiters.
    assert_eq!(round_trip(tmp.path(), &db, "semi", b"1;2\n3;\"4;5\"\n", &["--no-header", "--delimiter", ";"]), "c0,c1\n1,2\n3,4;5\n");
    assert_eq!(get(&db, "semi", 1), j!({"c0": 3, "c1": "4;5"}));
    assert_eq!(round_trip(tmp.path(), &db, "tab", b"a\tb\n1\t2.5\n", &["--delimiter", "\\t"]), "a,b\n1,2.5\n");
    // A given schema (bytes and str where inference would choose numbers).
    assert_eq!(round_trip(tmp.path(), &db, "given", b"k,v\n1,\\x00ff\n", &["--schema", "k:str,v:bytes"]), "k,v\n1,\\x00ff\n");
    assert_eq!(get(&db, "given", 0), j!({"k": "1", "v": "\\x00ff"}));
}

#[test]
fn bad_rows_fail_naming_file_line_and_column_and_change_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let db = db(tmp.path(), "64KiB");
    let good = tmp.path().join("good.csv");
    std::fs::write(&good, "a,b\n1,2\n3,4\n").unwrap();
    ok(&["import-csv", p(&db), "t", "--from", p(&good), "--pool", "1MiB"]);
    // A ragged row, a value of the wrong type for the existing table, a bad --schema value.
    let ragged = tmp.path().join("ragged.csv");
    std::fs::write(&ragged, "a,b\n5,6\n7\n").unwrap();
    let err = fails(&["import-csv", p(&db), "t", "--from", p(&ragged), "--pool", "1MiB"]);
    assert!(err.contains("ragged.csv") && err.contains("line 3"), "{err}");
    let typed = tmp.path().join("typed.csv");
    std::fs::write(&typed, "a,b\n5,6\n7,eight\n").unwrap();
    let err = fails(&["import-csv", p(&db), "t", "--from", p(&typed), "--pool", "1MiB"]);
    assert!(err.contains("typed.csv") && err.contains("line 3") && err.contains("\"b\""), "{err}");
    let err = fails(&["import-csv", p(&db), "new", "--from", p(&typed), "--pool", "1MiB", "--schema", "a:i64,b:i64"]);
    assert!(err.contains("line 3") && err.contains("\"b\""), "{err}");
    let err = fails(&["import-csv", p(&db), "t", "--from", p(&good), "--pool", "1MiB", "--schema", "a:i64,b:f64"]);
    assert!(err.contains("a:i64,b:i64"), "{err}");
    let err = fails(&["import-csv", p(&db), "t", "--from", p(&good), "--delimiter", "ab"]);
    assert!(err.contains("--delimiter"), "{err}");
    // Nothing changed: the table has its two rows, the new one does not exist.
    assert_eq!(rows(&db, "t"), 2);
    let err = fails(&["query", p(&db), "--pool", "1MiB", "--json", "rows", "new"]);
    assert!(err.contains("new"), "{err}");
    let err = fails(&["query", p(&db), "--pool", "1MiB", "--json", "get", "t", "--row", "2"]);
    assert!(err.contains("2 rows"), "{err}");
    // Appending with the same columns works and the ids continue.
    ok(&["import-csv", p(&db), "t", "--from", p(&good), "--pool", "1MiB"]);
    assert_eq!(get(&db, "t", 3), j!({"a": 3, "b": 4}));
    let check = json(&["check", p(&db), "--json"]);
    assert_eq!(check["report"]["tables"]["t"]["entries"], 4);
    assert_eq!(check["report"]["unreferenced_pages"], 0);
}

#[test]
fn parquet_imports_and_exports_the_same_values() {
    use parquet::data_type::{BoolType, ByteArray, ByteArrayType, DoubleType, Int32Type, Int64Type};
    use parquet::file::properties::WriterProperties;
    use parquet::file::writer::SerializedFileWriter;
    use parquet::schema::parser::parse_message_type;

    let tmp = tempfile::tempdir().unwrap();
    let db = db(tmp.path(), "64KiB");
    let path = tmp.path().join("t.parquet");
    let schema = Arc::new(
        parse_message_type("message m { required int64 id; optional double x; optional int32 d (DATE); optional boolean b; optional binary s (UTF8); }")
            .unwrap(),
    );
    let n = 5000usize;
    let def = |k: usize| -> Vec<i16> { (0..n).map(|i| i16::from(i % k != 0)).collect() };
    let mut w = SerializedFileWriter::new(std::fs::File::create(&path).unwrap(), schema, Arc::new(WriterProperties::builder().build())).unwrap();
    let mut rg = w.next_row_group().unwrap();
    let ids: Vec<i64> = (0..n as i64).collect();
    let mut col = rg.next_column().unwrap().unwrap();
    col.typed::<Int64Type>().write_batch(&ids, None, None).unwrap();
    col.close().unwrap();
    let xs: Vec<f64> = (0..n).filter(|i| i % 3 != 0).map(|i| i as f64 / 8.0).collect();
    let mut col = rg.next_column().unwrap().unwrap();
    col.typed::<DoubleType>().write_batch(&xs, Some(&def(3)), None).unwrap();
    col.close().unwrap();
    let ds: Vec<i32> = (0..n).filter(|i| i % 4 != 0).map(|i| i as i32 * 3).collect();
    let mut col = rg.next_column().unwrap().unwrap();
    col.typed::<Int32Type>().write_batch(&ds, Some(&def(4)), None).unwrap();
    col.close().unwrap();
    let bs: Vec<bool> = (0..n).filter(|i| i % 5 != 0).map(|i| i % 2 == 0).collect();
    let mut col = rg.next_column().unwrap().unwrap();
    col.typed::<BoolType>().write_batch(&bs, Some(&def(5)), None).unwrap();
    col.close().unwrap();
    let ss: Vec<ByteArray> = (0..n).filter(|i| i % 6 != 0).map(|i| ByteArray::from(format!("s{i},{}", "é".repeat(i % 9)).as_str())).collect();
    let mut col = rg.next_column().unwrap().unwrap();
    col.typed::<ByteArrayType>().write_batch(&ss, Some(&def(6)), None).unwrap();
    col.close().unwrap();
    rg.close().unwrap();
    w.close().unwrap();

    let imp = json(&["import-parquet", p(&db), "pq", "--from", p(&path), "--pool", "1MiB", "--json"]);
    assert_eq!(imp["rows"], n as u64);
    assert_eq!(imp["schema"], "id:i64,x:f64,d:date,b:bool,s:str");
    assert_eq!(get(&db, "pq", 7), j!({"id": 7, "x": 0.875, "d": "1970-01-22", "b": false, "s": "s7,ééééééé"}));
    assert_eq!(get(&db, "pq", 60), j!({"id": 60, "x": null, "d": null, "b": null, "s": null}));
    let out = tmp.path().join("pq.csv");
    ok(&["export", p(&db), "pq", "--to", p(&out), "--pool", "1MiB"]);
    // The export reads back (as CSV) to the same rows.
    json(&["import-csv", p(&db), "again", "--from", p(&out), "--pool", "1MiB", "--json", "--schema", "id:i64,x:f64,d:date,b:bool,s:str"]);
    for row in [0, 1, 7, 60, 4999] {
        assert_eq!(get(&db, "again", row), get(&db, "pq", row));
    }
    // Appending the file again continues the ids.
    json(&["import-parquet", p(&db), "pq", "--from", p(&path), "--pool", "1MiB", "--json"]);
    assert_eq!(rows(&db, "pq"), 2 * n as u64);
    assert_eq!(get(&db, "pq", n as u64 + 7), get(&db, "pq", 7));
}

#[test]
fn a_4_kib_smallest_class_and_a_50_mib_string_work() {
    let tmp = tempfile::tempdir().unwrap();
    let db = db(tmp.path(), "4KiB");
    // Rows of every size class: short, a few KiB (larger than a 4 KiB page), 50 MiB.
    let mut csv = String::from("k,v\n");
    for i in 0..300 {
        let len = [3, 40, 5000, 70_000][i % 4];
        csv.push_str(&format!("{i},{}\n", "x".repeat(len)));
    }
    let huge: String = (0..50u32 << 20).map(|i| char::from(b'a' + (i % 26) as u8)).collect();
    csv.push_str(&format!("300,{huge}\n301,after\n"));
    let input = tmp.path().join("sizes.csv");
    std::fs::write(&input, &csv).unwrap();
    let imp = json(&["import-csv", p(&db), "t", "--from", p(&input), "--pool", "160MiB", "--json"]);
    assert_eq!(imp["rows"], 302);
    // The 50 MiB row needs a pool that holds a 64 MiB page: a small pool says so.
    let err = fails(&["import-csv", p(&db), "t", "--from", p(&input), "--pool", "16MiB"]);
    assert!(err.contains("raise the pool size"), "{err}");
    let out = tmp.path().join("sizes.out.csv");
    ok(&["export", p(&db), "t", "--to", p(&out), "--pool", "160MiB"]);
    let back = std::fs::read_to_string(&out).unwrap();
    if back != csv {
        let (a, b): (Vec<&str>, Vec<&str>) = (csv.lines().collect(), back.lines().collect());
        let i = a.iter().zip(&b).position(|(x, y)| x != y);
        panic!(
            "export differs: {} vs {} lines, first difference at line {i:?}: {:?} vs {:?}",
            a.len(),
            b.len(),
            i.map(|i| &a[i][..a[i].len().min(80)]),
            i.map(|i| &b[i][..b[i].len().min(80)])
        );
    }
    assert_eq!(get(&db, "t", 2)["v"].as_str().unwrap().len(), 5000);
    let check = json(&["check", p(&db), "--pool", "160MiB", "--json"]);
    let per_class = check["report"]["tables"]["t"]["leaves_per_class"].as_array().unwrap().clone();
    assert!(per_class.iter().filter(|c| c.as_u64().unwrap() > 0).count() >= 3, "leaves of several classes: {per_class:?}");
    // stats reports the same shape from the inner nodes alone, read-only.
    let stats = json(&["stats", p(&db), "--json"]);
    let t = &stats["tables"]["t"];
    assert_eq!(t["rows"], 302);
    assert_eq!(t["leaves_per_class"].as_array().unwrap(), &per_class);
    assert_eq!(t["height"], check["report"]["tables"]["t"]["height"]);
    assert_eq!(t["bytes"], check["report"]["tables"]["t"]["bytes"]);
    assert_eq!(t["schema"], "k:i64,v:str");
    assert_eq!(rows(&db, "t"), 302);
}

#[test]
fn a_load_far_larger_than_the_pool_stays_under_the_rss_cap() {
    let tmp = tempfile::tempdir().unwrap();
    let db = db(tmp.path(), "64KiB");
    let input = tmp.path().join("large.csv");
    // Every type, NULLs, quoted fields, strings up to ~1.3 KB: 40 MiB, ten times the pool.
    ok(&["gen", "csv", "--size", "40MiB", "--seed", "3", "--out", p(&input)]);
    let n = std::fs::read_to_string(&input).unwrap().lines().count() as u64 - 1;
    let imp = json(&["import-csv", p(&db), "t", "--from", p(&input), "--pool", "4MiB", "--json"]);
    assert_eq!(imp["rows"], n);
    assert_eq!(imp["schema"], "id:i64,amount:f64,day:date,flag:bool,name:str,comment:str,blob:str");
    let rss = imp["peak_rss_bytes"].as_u64().unwrap();
    assert!(rss <= (4 + 48) << 20, "peak RSS {rss} above pool + 48 MiB");
    assert!(imp["peak_resident_bytes"].as_u64().unwrap() <= 4 << 20);
    let out = tmp.path().join("large.out.csv");
    let exp = json(&["export", p(&db), "t", "--to", p(&out), "--pool", "4MiB", "--json"]);
    assert_eq!(exp["rows"], n);
    assert!(exp["peak_rss_bytes"].as_u64().unwrap() <= (4 + 48) << 20);
    assert_eq!(get(&db, "t", n - 1)["id"], j!(n - 1));
    // The generator writes every value in its canonical form: the export is the same file.
    assert!(std::fs::read(&out).unwrap() == std::fs::read(&input).unwrap(), "export differs from the imported file");
}
