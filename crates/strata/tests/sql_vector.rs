//! The column-pruned, vectorized scan (`strata::sql::scan`): scan filters evaluated leaf by
//! leaf over the PAX column arrays must select exactly the rows that the row-at-a-time
//! evaluator selects. The oracle is the row path itself, forced by wrapping the predicate
//! in `COALESCE(p, FALSE)` (which the vectorized scan does not take), and an independent
//! count computed here for some predicates. The table has NULLs in every column, strings
//! of every length class (inline, long, multi-byte), several thousand rows over many 4 KiB
//! leaves read through a 1 MiB pool; also the order of errors with row-wise conjuncts, and
//! aggregates over pruned scans.

#![allow(clippy::type_complexity)] // reference tables of closures and tuples

mod sql_common;
use sql_common::{assert_rows, q, run, run_threads};

use strata::access::table::{Schema, Value};
use strata::util::SplitMix64;
use strata::{Config, Database};

#[derive(Clone, Debug)]
struct R {
    id: i64,
    a: Option<i64>,
    b: Option<f64>,
    d: Option<i32>,
    f: Option<bool>,
    s: Option<String>,
    pad: String,
}

fn text(r: &mut SplitMix64) -> String {
    let len = match r.below(8) {
        0 => 0,
        1..=4 => 1 + r.below(12) as usize,
        5 | 6 => 13 + r.below(40) as usize,
        _ => 100 + r.below(300) as usize,
    };
    (0..len).map(|_| if r.below(40) == 0 { 'é' } else { char::from(b'a' + r.below(4) as u8) }).collect()
}

fn rows(n: usize) -> Vec<R> {
    let mut r = SplitMix64(7);
    (0..n)
        .map(|i| {
            let null = |r: &mut SplitMix64| r.below(7) == 0;
            R {
                id: i as i64,
                a: (!null(&mut r)).then(|| r.below(41) as i64 - 20),
                b: (!null(&mut r)).then(|| (r.below(401) as f64 - 200.0) / 8.0),
                d: (!null(&mut r)).then(|| r.below(400) as i32 + 9000),
                f: (!null(&mut r)).then(|| r.below(2) == 0),
                s: (!null(&mut r)).then(|| text(&mut r)),
                pad: "p".repeat(r.below(30) as usize),
            }
        })
        .collect()
}

fn open(dir: &std::path::Path, data: &[R]) -> Database {
    let db = Database::create(Config::new(dir).pool_size(1 << 20).min_page(4096)).unwrap();
    let t = db.create_table("t", Schema::parse("id:i64,a:i64,b:f64,d:date,f:bool,s:str,pad:str").unwrap()).unwrap();
    for chunk in data.chunks(300) {
        let mut tx = db.begin();
        let vals: Vec<Vec<Value>> = chunk
            .iter()
            .map(|r| {
                vec![
                    Value::I64(r.id),
                    r.a.map_or(Value::Null, Value::I64),
                    r.b.map_or(Value::Null, Value::F64),
                    r.d.map_or(Value::Null, Value::Date),
                    r.f.map_or(Value::Null, Value::Bool),
                    r.s.clone().map_or(Value::Null, Value::Str),
                    Value::Str(r.pad.clone()),
                ]
            })
            .collect();
        t.append(&mut tx, &vals).unwrap();
        tx.commit().unwrap();
    }
    db
}

const PREDICATES: &[&str] = &[
    "a > 3",
    "3 > a",
    "a = 0",
    "a <> 0",
    "a >= -5 AND a <= 5",
    "a BETWEEN -5 AND 5",
    "a NOT BETWEEN -5 AND 5",
    "b < 2",
    "b >= 2.5",
    "2.5 <= b",
    "a < b",
    "a = id",
    "d < DATE '1995-01-01'",
    "d >= DATE '1994-09-01' AND d < DATE '1994-09-01' + INTERVAL '1' MONTH",
    "d < d",
    "f",
    "NOT f",
    "f = TRUE",
    "f IS NULL",
    "s IS NOT NULL",
    "a IS NULL OR b IS NULL",
    "s = 'abc'",
    "s > 'b'",
    "s < 'abcdabcdabcdab'",
    "s = pad",
    "s LIKE 'a%'",
    "s LIKE '%a'",
    "s LIKE '%ab%ba%'",
    "s LIKE 'a%b%c'",
    "s LIKE 'ab'",
    "s LIKE '%'",
    "s LIKE ''",
    "s LIKE '_b%'",
    "s LIKE '%é%'",
    "s NOT LIKE '%a%'",
    "a IN (1, 2, 3, -7)",
    "a NOT IN (1, 2, 3)",
    "a IN (1, NULL)",
    "a NOT IN (1, NULL)",
    "b IN (1, 2.5, -3)",
    "s IN ('a', 'ab', 'abc', 'dddd')",
    "s NOT IN ('a', 'b')",
    "a > 0 OR b > 0",
    "NOT (a > 0 OR b > 0)",
    "(a > 0 AND s LIKE 'a%') OR (b < 0 AND f)",
    "NOT (a > 0 AND f)",
    "a > NULL",
    "a > 0 AND NULL",
    "a > 0 OR NULL",
    "a > 0 AND a + 1 > 3",
    "a + 1 > 3 AND b > 0",
    "length(s) > 20 AND a <> 1",
    "a <> 0 AND 100 / a > 5",
    "s LIKE 'a%' AND substring(s from 2 for 2) = 'bc'",
];

/// Every predicate selects the same rows through the vectorized scan as through the row
/// path, also with the unused string column `pad` pruned away.
#[test]
fn vector_filters_select_what_the_row_path_selects() {
    let dir = tempfile::tempdir().unwrap();
    let data = rows(6000);
    let db = open(dir.path(), &data);
    // Most leaves are packed, so the leaf-wise conjuncts run on stored columns (and the
    // rows that pass are decoded alone where few pass), the row path on expanded leaves.
    let t = db.table("t").unwrap();
    let (packed, all) = t.packed_leaves(db.buffer()).unwrap();
    assert!(packed * 2 > all, "{packed} of {all} leaves packed");
    for p in PREDICATES {
        let fast = format!("SELECT id, a, s FROM t WHERE {p}");
        let slow = format!("SELECT id, a, s FROM t WHERE COALESCE({p}, FALSE)");
        let (x, y) = (q(&db, &fast), q(&db, &slow));
        assert_rows(&fast, &x, &y);
        let fast = format!("SELECT count(*), sum(a), min(s), max(b) FROM t WHERE {p}");
        let slow = format!("SELECT count(*), sum(a), min(s), max(b) FROM t WHERE COALESCE({p}, FALSE)");
        assert_rows(&fast, &q(&db, &fast), &q(&db, &slow));
    }
}

/// Independent counts for a few predicates (three-valued logic evaluated here).
#[test]
fn vector_filters_against_a_reference() {
    let dir = tempfile::tempdir().unwrap();
    let data = rows(5000);
    let db = open(dir.path(), &data);
    let count = |sql: &str| match q(&db, sql)[0][0] {
        Value::I64(n) => n as usize,
        ref v => panic!("{v:?}"),
    };
    let n = |f: &dyn Fn(&R) -> bool| data.iter().filter(|r| f(r)).count();
    assert_eq!(count("SELECT count(*) FROM t WHERE a > 3"), n(&|r| r.a.is_some_and(|a| a > 3)));
    assert_eq!(count("SELECT count(*) FROM t WHERE b < 2"), n(&|r| r.b.is_some_and(|b| b < 2.0)));
    assert_eq!(count("SELECT count(*) FROM t WHERE a < b"), n(&|r| matches!((r.a, r.b), (Some(a), Some(b)) if (a as f64) < b)));
    assert_eq!(
        count("SELECT count(*) FROM t WHERE s LIKE '%ab%ba%'"),
        n(&|r| r.s.as_ref().is_some_and(|s| s.find("ab").is_some_and(|i| s[i + 2..].contains("ba"))))
    );
    assert_eq!(count("SELECT count(*) FROM t WHERE s NOT LIKE '%a%'"), n(&|r| r.s.as_ref().is_some_and(|s| !s.contains('a'))));
    assert_eq!(count("SELECT count(*) FROM t WHERE a NOT IN (1, 2, 3)"), n(&|r| r.a.is_some_and(|a| !(1..=3).contains(&a))));
    assert_eq!(count("SELECT count(*) FROM t WHERE a NOT IN (1, NULL)"), 0);
    assert_eq!(count("SELECT count(*) FROM t WHERE a IN (1, NULL)"), n(&|r| r.a == Some(1)));
    // NOT (a > 0 OR f): true only where both are known false.
    assert_eq!(count("SELECT count(*) FROM t WHERE NOT (a > 0 OR f)"), n(&|r| r.a.is_some_and(|a| a <= 0) && r.f == Some(false)));
    // OR: true where either is true, NULLs notwithstanding.
    assert_eq!(count("SELECT count(*) FROM t WHERE a > 0 OR f"), n(&|r| r.a.is_some_and(|a| a > 0) || r.f == Some(true)));
    assert_eq!(count("SELECT count(*) FROM t WHERE s IS NULL"), n(&|r| r.s.is_none()));
    let sum: i64 = data.iter().filter(|r| r.d.is_some_and(|d| d < 9100) && r.f == Some(true)).filter_map(|r| r.a).sum();
    let sql = format!("SELECT sum(a) FROM t WHERE d < DATE '{}' AND f", strata::access::table::text::format_date(9100));
    assert_eq!(q(&db, &sql)[0][0], Value::I64(sum));
}

/// A conjunct evaluated row by row sees the rows the row path would evaluate it on: after
/// a vectorized conjunct that is false it is skipped (no division by zero), after one that
/// is NULL it is evaluated (the error comes), and before one it is evaluated on every row.
#[test]
fn row_conjuncts_fail_on_the_same_rows() {
    let dir = tempfile::tempdir().unwrap();
    let data = rows(3000);
    let db = open(dir.path(), &data);
    assert!(run(&db, "SELECT count(*) FROM t WHERE a <> 0 AND 100 / a > 5").is_ok());
    let e = run(&db, "SELECT count(*) FROM t WHERE 100 / a > 5 AND a <> 0").unwrap_err().to_string();
    assert!(e.contains("division by zero"), "{e}");
    // `a > 1000` is false or NULL: false rows skip the division, NULL rows (a is NULL) give
    // NULL / ... = NULL, no error; b = 0 where a is NULL would matter only through b.
    assert!(run(&db, "SELECT count(*) FROM t WHERE a > 1000 AND 1 / a > 0").is_ok());
    // Rows where `b > 1000` is NULL (b NULL) still evaluate `1 / a`, and a = 0 is among them.
    assert!(data.iter().any(|r| r.b.is_none() && r.a == Some(0)));
    let e = run(&db, "SELECT count(*) FROM t WHERE b > 1000 AND 1 / a > 0").unwrap_err().to_string();
    assert!(e.contains("division by zero"), "{e}");
    // LIMIT stops the scan before a failing row of a later leaf.
    let first_zero = data.iter().position(|r| r.a == Some(0)).unwrap();
    assert!(first_zero > 0);
    let got = q(&db, "SELECT id FROM t WHERE a IS NOT NULL AND 1 / (a + 100) >= 0 LIMIT 1");
    assert_eq!(got.len(), 1);
}

/// Only the used columns are decoded: joins, grouping and sorting over pruned scans give
/// the same rows as with every column in use.
#[test]
fn pruned_scans_feed_joins_groups_and_sorts() {
    let dir = tempfile::tempdir().unwrap();
    let data = rows(2500);
    let db = open(dir.path(), &data);
    let cases = [
        (
            "SELECT x.id, y.s FROM t x JOIN t y ON x.a = y.id WHERE x.f ORDER BY x.id",
            "SELECT id, s2 FROM (SELECT x.*, y.s AS s2 FROM t x JOIN t y ON x.a = y.id) AS j WHERE COALESCE(f, FALSE) ORDER BY id",
        ),
        (
            "SELECT f, count(*), sum(a), avg(b), min(s), max(d) FROM t WHERE d > DATE '1994-09-01' GROUP BY f ORDER BY f",
            "SELECT f, count(*), sum(a), avg(b), min(s), max(d) FROM (SELECT * FROM t) AS u WHERE COALESCE(d > DATE '1994-09-01', FALSE) GROUP BY f ORDER BY f",
        ),
        (
            "SELECT s FROM t WHERE a BETWEEN 1 AND 2 ORDER BY s DESC, id LIMIT 50",
            "SELECT s FROM t WHERE COALESCE(a BETWEEN 1 AND 2, FALSE) ORDER BY s DESC, id LIMIT 50",
        ),
    ];
    for (fast, slow) in cases {
        assert_rows(fast, &q(&db, fast), &q(&db, slow));
    }
    // The reference for the first: every x with f, joined on a = id.
    let mut want: Vec<(i64, Option<String>)> =
        data.iter().filter(|r| r.f == Some(true)).filter_map(|r| r.a.filter(|&a| a >= 0).map(|a| (r.id, data[a as usize].s.clone()))).collect();
    want.sort_by_key(|w| w.0);
    let got = q(&db, cases[0].0);
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(&want) {
        assert_eq!(g[0], Value::I64(w.0));
        assert_eq!(g[1], w.1.clone().map_or(Value::Null, Value::Str));
    }
}

/// Grouped aggregates through the pre-aggregation table: more groups than it holds (it
/// flushes), nearly unique keys (it steps aside), few groups with a NULL key; against
/// sums and counts computed here. An i64 sum that overflows is still an error.
#[test]
fn grouped_aggregates_through_the_pre_aggregation() {
    use std::collections::BTreeMap;
    let dir = tempfile::tempdir().unwrap();
    let data = rows(6000);
    let db = open(dir.path(), &data);
    // Keys spread (more groups than the pre-aggregation holds), unique (it steps aside),
    // with NULLs, and clustered (runs of equal keys: the row before's group is reused;
    // id / 3 also fills the pre-aggregation in the middle of a leaf).
    let keyings: [(&str, &dyn Fn(&R) -> Option<i64>); 5] =
        [("id % 1500", &|r| Some(r.id % 1500)), ("id", &|r| Some(r.id)), ("a", &|r| r.a), ("id / 7", &|r| Some(r.id / 7)), ("id / 3", &|r| Some(r.id / 3))];
    for (k, f) in keyings {
        let sql = format!("SELECT {k}, count(*), count(s), sum(a), min(a) FROM t GROUP BY {k} ORDER BY 1");
        let mut want: BTreeMap<Option<i64>, (i64, i64, Option<i64>, Option<i64>)> = BTreeMap::new();
        for r in &data {
            let e = want.entry(f(r)).or_insert((0, 0, None, None));
            e.0 += 1;
            e.1 += r.s.is_some() as i64;
            if let Some(a) = r.a {
                e.2 = Some(e.2.unwrap_or(0) + a);
                e.3 = Some(e.3.map_or(a, |m: i64| m.min(a)));
            }
        }
        // ORDER BY puts NULL last.
        let mut want: Vec<Vec<Value>> = want
            .into_iter()
            .map(|(k, (n, ns, s, m))| {
                vec![k.map_or(Value::Null, Value::I64), Value::I64(n), Value::I64(ns), s.map_or(Value::Null, Value::I64), m.map_or(Value::Null, Value::I64)]
            })
            .collect();
        want.sort_by_key(|r| matches!(r[0], Value::Null));
        assert_rows(&sql, &q(&db, &sql), &want);
    }
    let t = db.create_table("big", Schema::parse("k:i64,v:i64").unwrap()).unwrap();
    let mut tx = db.begin();
    let vals: Vec<Vec<Value>> = (0..3000).map(|i| vec![Value::I64(i % 3), Value::I64(if i == 2500 { i64::MAX } else { 1 })]).collect();
    t.append(&mut tx, &vals).unwrap();
    tx.commit().unwrap();
    let e = run(&db, "SELECT k, sum(v) FROM big GROUP BY k").unwrap_err().to_string();
    assert!(e.contains("overflow"), "{e}");
    assert_eq!(q(&db, "SELECT k, sum(v) FROM big WHERE v < 2 GROUP BY k ORDER BY k").len(), 3);
}

/// Keys of one or two columns of integers, dates, booleans and short strings go to their
/// group through the small-key map (packed keys), the others (NULLs, strings longer than 7
/// bytes) through the general path, in one batch: the groups are the reference's. With
/// more distinct keys than the map or the pre-aggregation holds, the map fills up and the
/// pre-aggregation empties itself (the map forgets its groups).
#[test]
fn small_keys_find_the_same_groups_as_the_general_path() {
    use std::collections::BTreeMap;
    let dir = tempfile::tempdir().unwrap();
    let data = rows(6000);
    let db = open(dir.path(), &data);
    let short = |r: &R| r.s.clone().map(|s| s.chars().take(2 + (r.id % 9) as usize).collect::<String>());
    type Key = (Option<String>, Option<i64>);
    let keyings: [(&str, &dyn Fn(&R) -> Key); 5] = [
        ("s, a", &|r| (r.s.clone(), r.a)),
        ("substring(s, 1, 2 + id % 9), a", &|r| (short(r), r.a)),
        ("f, d", &|r| (r.f.map(|f| f.to_string()), r.d.map(i64::from))),
        ("a, id % 1200", &|r| (r.a.map(|a| a.to_string()), Some(r.id % 1200))),
        ("id % 700, f", &|r| (Some((r.id % 700).to_string()), r.f.map(i64::from))),
    ];
    for (k, f) in keyings {
        let sql = format!("SELECT count(*), sum(a), min(id), max(id) FROM t GROUP BY {k}");
        let mut want: BTreeMap<Key, (i64, Option<i64>, i64, i64)> = BTreeMap::new();
        for r in &data {
            let e = want.entry(f(r)).or_insert((0, None, i64::MAX, i64::MIN));
            e.0 += 1;
            if let Some(a) = r.a {
                e.1 = Some(e.1.unwrap_or(0) + a);
            }
            e.2 = e.2.min(r.id);
            e.3 = e.3.max(r.id);
        }
        // Each group is named by its smallest id (unique per group).
        let mut want: Vec<Vec<Value>> =
            want.into_values().map(|(n, sa, lo, hi)| vec![Value::I64(n), sa.map_or(Value::Null, Value::I64), Value::I64(lo), Value::I64(hi)]).collect();
        let mut got = q(&db, &sql);
        let by_min = |r: &Vec<Value>| match r[2] {
            Value::I64(v) => v,
            _ => panic!("min(id) is not an integer: {r:?}"),
        };
        want.sort_by_key(by_min);
        got.sort_by_key(by_min);
        assert_rows(&sql, &got, &want);
    }
    // Short keys (in the map) among long ones (not): the long ones fill the pre-aggregation,
    // which empties itself and stays on (each key repeats), so the map must forget the
    // groups it knew.
    let t = db.create_table("g", Schema::parse("k:str,v:i64").unwrap()).unwrap();
    let key = |i: i64| if i % 2 == 0 { format!("s{}", i % 50) } else { format!("a long key {}", i / 8) };
    for chunk in (0..20_000i64).collect::<Vec<_>>().chunks(2000) {
        let mut tx = db.begin();
        t.append(&mut tx, &chunk.iter().map(|&i| vec![Value::Str(key(i)), Value::I64(i)]).collect::<Vec<_>>()).unwrap();
        tx.commit().unwrap();
    }
    let mut want: BTreeMap<String, (i64, i64)> = BTreeMap::new();
    for i in 0..20_000i64 {
        let e = want.entry(key(i)).or_default();
        e.0 += 1;
        e.1 += i;
    }
    let want: Vec<Vec<Value>> = want.into_iter().map(|(k, (n, s))| vec![Value::Str(k), Value::I64(n), Value::I64(s)]).collect();
    let sql = "SELECT k, count(*), sum(v) FROM g GROUP BY k ORDER BY k";
    assert_rows(sql, &q(&db, sql), &want);
}

/// Grouped aggregates whose groups outgrow the hash table of the 1 MiB pool: unique keys
/// (the pre-aggregation steps aside; the rows reach the hash aggregation in batches and
/// pass its table by), keys that come back after a few thousand rows, and pairs (through
/// the pre-aggregation), with string minima and maxima (states that grow) and NULLs;
/// against values computed here.
#[test]
fn grouped_aggregates_spill_in_batches() {
    use std::collections::BTreeMap;
    let dir = tempfile::tempdir().unwrap();
    let data = rows(20_000);
    let db = open(dir.path(), &data);
    type Acc = (i64, Option<i64>, Option<String>, Option<String>, String);
    let keyings: [(&str, &dyn Fn(&R) -> i64); 3] = [("id", &|r| r.id), ("id % 7000", &|r| r.id % 7000), ("id / 2", &|r| r.id / 2)];
    for (k, f) in keyings {
        let sql = format!("SELECT {k}, count(*), sum(a), min(s), max(s), max(pad) FROM t GROUP BY {k} ORDER BY 1");
        let mut want: BTreeMap<i64, Acc> = BTreeMap::new();
        for r in &data {
            let e = want.entry(f(r)).or_insert((0, None, None, None, String::new()));
            e.0 += 1;
            if let Some(a) = r.a {
                e.1 = Some(e.1.unwrap_or(0) + a);
            }
            if let Some(s) = &r.s {
                e.2 = Some(e.2.take().map_or(s.clone(), |m| m.min(s.clone())));
                e.3 = Some(e.3.take().map_or(s.clone(), |m| m.max(s.clone())));
            }
            e.4 = e.4.clone().max(r.pad.clone());
        }
        let str_or_null = |s: &Option<String>| s.clone().map_or(Value::Null, Value::Str);
        let want: Vec<Vec<Value>> = want
            .iter()
            .map(|(k, (n, sa, mn, mx, pad))| {
                vec![Value::I64(*k), Value::I64(*n), sa.map_or(Value::Null, Value::I64), str_or_null(mn), str_or_null(mx), Value::Str(pad.clone())]
            })
            .collect();
        assert_rows(&sql, &q(&db, &sql), &want);
    }
}

/// Aggregates computed a leaf at a time over a vectorized scan (arguments as vectors):
/// NULLs in the arguments, i64 and f64 arithmetic, count(*), avg, min/max of expressions,
/// grouped by a boolean and by strings of every length (more groups than the
/// pre-aggregation holds), against values computed here and against the row path (the
/// same query over a derived table, which the batch path does not take); an error in a
/// vector (division by zero, overflow) is the row path's error.
#[test]
fn aggregates_over_batches() {
    use std::collections::BTreeMap;
    let dir = tempfile::tempdir().unwrap();
    let data = rows(6000);
    let db = open(dir.path(), &data);
    let day = strata::access::table::text::format_date(9100);
    let sel: Vec<&R> = data.iter().filter(|r| r.d.is_some_and(|d| d >= 9100)).collect();
    let sql = format!(
        "SELECT count(*), count(a), sum(a), sum(a * 2 + 1), sum(b), sum(a * b), avg(a), avg(b - 1), min(a - 3), max(-b), sum(a / 3), sum(a % 7) FROM t WHERE d >= DATE '{day}'"
    );
    let a: Vec<i64> = sel.iter().filter_map(|r| r.a).collect();
    let b: Vec<f64> = sel.iter().filter_map(|r| r.b).collect();
    let ab: f64 = sel.iter().filter_map(|r| Some(r.a? as f64 * r.b?)).sum();
    let want = vec![
        Value::I64(sel.len() as i64),
        Value::I64(a.len() as i64),
        Value::I64(a.iter().sum()),
        Value::I64(a.iter().map(|x| x * 2 + 1).sum()),
        Value::F64(b.iter().sum()),
        Value::F64(ab),
        Value::F64(a.iter().sum::<i64>() as f64 / a.len() as f64),
        Value::F64(b.iter().map(|x| x - 1.0).sum::<f64>() / b.len() as f64),
        Value::I64(a.iter().map(|x| x - 3).min().unwrap()),
        Value::F64(b.iter().map(|x| -x).fold(f64::MIN, f64::max)),
        Value::I64(a.iter().map(|x| x / 3).sum()),
        Value::I64(a.iter().map(|x| x % 7).sum()),
    ];
    assert_rows(&sql, &q(&db, &sql), &[want]);
    let slow = sql.replace("FROM t", "FROM (SELECT * FROM t) AS u");
    assert_rows(&sql, &q(&db, &sql), &q(&db, &slow));
    // No rows pass: count 0, the others NULL.
    let none = "SELECT count(*), sum(a), avg(b) FROM t WHERE a > 1000";
    assert_eq!(q(&db, none), vec![vec![Value::I64(0), Value::Null, Value::Null]]);

    // Grouped by a boolean column and by the strings.
    let g = "SELECT f, count(*), sum(a * 2), avg(b), max(b * 2) FROM t WHERE a > -10 GROUP BY f ORDER BY f";
    assert_rows(g, &q(&db, g), &q(&db, &g.replace("FROM t", "FROM (SELECT * FROM t) AS u")));
    let g = "SELECT s, count(*), sum(a), sum(b) FROM t WHERE id >= 0 GROUP BY s ORDER BY s";
    let mut want: BTreeMap<Option<String>, (i64, Option<i64>)> = BTreeMap::new();
    for r in &data {
        let e = want.entry(r.s.clone()).or_insert((0, None));
        e.0 += 1;
        if let Some(a) = r.a {
            e.1 = Some(e.1.unwrap_or(0) + a);
        }
    }
    assert!(want.len() > 1024, "{} groups", want.len());
    let got = q(&db, g);
    let mut want: Vec<(Option<String>, (i64, Option<i64>))> = want.into_iter().collect();
    want.sort_by_key(|w| w.0.is_none());
    assert_eq!(got.len(), want.len());
    for (x, (s, (n, sa))) in got.iter().zip(&want) {
        assert_eq!(x[0], s.clone().map_or(Value::Null, Value::Str));
        assert_eq!(x[1], Value::I64(*n));
        assert_eq!(x[2], sa.map_or(Value::Null, Value::I64));
    }
    assert_rows(g, &got, &q(&db, &g.replace("FROM t", "FROM (SELECT * FROM t) AS u")));

    // Errors inside a vector: the row path's message.
    for e in ["SELECT sum(100 / a) FROM t", "SELECT f, sum(100 % a) FROM t GROUP BY f", "SELECT sum(b / (a - a)) FROM t"] {
        let fast = run(&db, e).unwrap_err().to_string();
        let slow = run(&db, &e.replace("FROM t", "FROM (SELECT * FROM t) AS u")).unwrap_err().to_string();
        assert!(fast.contains("division by zero"), "{fast}");
        assert_eq!(fast, slow);
    }
    let t = db.create_table("big2", Schema::parse("k:i64,v:i64").unwrap()).unwrap();
    let mut tx = db.begin();
    let vals: Vec<Vec<Value>> = (0..2000).map(|i| vec![Value::I64(i % 2), Value::I64(if i == 1500 { i64::MAX / 2 + 1 } else { i })]).collect();
    t.append(&mut tx, &vals).unwrap();
    tx.commit().unwrap();
    for e in ["SELECT sum(v * 2) FROM big2", "SELECT k, sum(v * 2) FROM big2 GROUP BY k", "SELECT sum(-(v * 2 - 1)) FROM big2"] {
        let fast = run(&db, e).unwrap_err().to_string();
        let slow = run(&db, &e.replace("FROM big2", "FROM (SELECT * FROM big2) AS u")).unwrap_err().to_string();
        assert!(fast.contains("overflow"), "{fast}");
        assert_eq!(fast, slow);
    }
    let ok = "SELECT k, sum(v - 1), count(*) FROM big2 WHERE v < 100000 GROUP BY k ORDER BY k";
    let want = [
        vec![Value::I64(0), Value::I64((0..2000).step_by(2).filter(|&i| i != 1500).map(|i| i - 1).sum()), Value::I64(999)],
        vec![Value::I64(1), Value::I64((1..2000).step_by(2).map(|i| i - 1).sum()), Value::I64(1000)],
    ];
    assert_rows(ok, &q(&db, ok), &want);
}

/// `set_threads`: aggregations straight over a scan run on several workers over morsels
/// of rows (boundaries inside leaves); the results equal those of one thread (groups
/// sorted, floats to 1e-9) and errors are still errors.
#[test]
fn parallel_aggregation_matches_one_thread() {
    let dir = tempfile::tempdir().unwrap();
    let data = rows(7000);
    let db = open(dir.path(), &data);
    let with = |sql: &str, threads: usize| run_threads(&db, sql, threads);
    for sql in [
        "SELECT count(*), sum(a), sum(a * b), avg(b), min(a), max(b - 1) FROM t",
        "SELECT count(*), sum(a) FROM t WHERE d >= DATE '1994-09-01' AND s LIKE '%a%'",
        "SELECT f, count(*), sum(a * 2), avg(b) FROM t WHERE a > -10 GROUP BY f ORDER BY f",
        "SELECT s, count(*), sum(a) FROM t GROUP BY s ORDER BY s",
        "SELECT a, count(*), sum(b) FROM t GROUP BY a ORDER BY a",
    ] {
        let one = with(sql, 1).unwrap();
        for threads in [2, 3, 8] {
            assert_rows(sql, &with(sql, threads).unwrap(), &one);
        }
    }
    let n: i64 = data.iter().filter_map(|r| r.a).sum();
    assert_eq!(with("SELECT sum(a) FROM t", 4).unwrap()[0][0], Value::I64(n));
    // Narrow rows: hundreds per leaf, so morsel boundaries cut leaves in their middle words.
    let t = db.create_table("nums", Schema::parse("k:i64,v:i64").unwrap()).unwrap();
    let mut tx = db.begin();
    t.append(&mut tx, &(0..20_000i64).map(|i| vec![Value::I64(i % 7), Value::I64(i)]).collect::<Vec<_>>()).unwrap();
    tx.commit().unwrap();
    for threads in [1, 2, 3] {
        let got = with("SELECT k, count(*), sum(v) FROM nums WHERE v >= 5 GROUP BY k ORDER BY k", threads).unwrap();
        let want: Vec<Vec<Value>> = (0..7i64)
            .map(|k| {
                let vs: Vec<i64> = (5..20_000i64).filter(|i| i % 7 == k).collect();
                vec![Value::I64(k), Value::I64(vs.len() as i64), Value::I64(vs.iter().sum())]
            })
            .collect();
        assert_eq!(got, want, "{threads} threads");
        assert_eq!(with("SELECT count(*), sum(v) FROM nums", threads).unwrap(), vec![vec![Value::I64(20_000), Value::I64(19_999 * 10_000)]]);
    }
    let e = with("SELECT sum(100 / a) FROM t", 3).unwrap_err().to_string();
    assert!(e.contains("division by zero"), "{e}");
    // Sums of floats whose value depends on the order of additions, computed twice in one
    // query (a WITH query used twice, as TPC-H Q15 does): both agree to the last bit with
    // any number of workers, so the group with the largest sum is found.
    let t = db.create_table("fl", Schema::parse("k:i64,v:f64").unwrap()).unwrap();
    let mut r = strata::util::SplitMix64(5);
    let mut tx = db.begin();
    let fl: Vec<Vec<Value>> = (0..60_000i64).map(|i| vec![Value::I64(i % 50), Value::F64((r.below(1_000_000) as f64) * 0.01 + 1e9 * (i % 3) as f64)]).collect();
    t.append(&mut tx, &fl).unwrap();
    tx.commit().unwrap();
    let sql = "WITH r (k, s) AS (SELECT k, sum(v) FROM fl GROUP BY k) SELECT k FROM r WHERE s = (SELECT max(s) FROM r)";
    let best = with(sql, 1).unwrap();
    assert_eq!(best.len(), 1, "{best:?}");
    for threads in [2, 3, 4, 2, 3, 4] {
        assert_eq!(with(sql, threads).unwrap(), best, "{threads} threads");
    }
}

/// A grouping by one integer or date column over rows that come in runs of equal keys
/// streams the runs (`sql::vagg::runs`): groups in the middle of a worker's morsel skip
/// the hash table when every key is proven to occur in one run only. Against a reference
/// computed here, at 1, 2, 3 and 8 workers, through a 1 MiB pool (the streamed groups
/// spill): keys sorted (also negative ones and dates before 1970, with a filter that
/// leaves holes), sorted but with a key that comes back far later, sorted with NULL keys
/// between and inside runs, runs in random order, unsorted keys, keys sorted within
/// each of two halves, and keys that rise within each block of 4096 rows (sorted within
/// each morsel of several workers, overlapping across morsels).
#[test]
fn runs_of_equal_keys_stream_and_merge() {
    use std::collections::BTreeMap;
    let dir = tempfile::tempdir().unwrap();
    let db = Database::create(Config::new(dir.path()).pool_size(1 << 20).min_page(4096)).unwrap();
    let n = 30_000i64;
    let mut r = SplitMix64(11);
    // Sorted runs of 1-6 rows from -4000 on.
    let mut sorted = Vec::new();
    let mut k = -4000i64;
    while (sorted.len() as i64) < n {
        for _ in 0..1 + r.below(6) {
            sorted.push(k);
        }
        k += 1 + r.below(3) as i64;
    }
    sorted.truncate(n as usize);
    // The same runs in random order.
    let mut runs: Vec<Vec<i64>> = Vec::new();
    for &x in &sorted {
        match runs.last_mut() {
            Some(l) if l[0] == x => l.push(x),
            _ => runs.push(vec![x]),
        }
    }
    for i in (1..runs.len()).rev() {
        runs.swap(i, r.below(i as u64 + 1) as usize);
    }
    let shuffled: Vec<i64> = runs.concat();
    let mut back = sorted.clone();
    back[25_000] = sorted[100];
    back[29_999] = sorted[15_000];
    let cols: Vec<(&str, Vec<Option<i64>>)> = vec![
        ("sorted", sorted.iter().map(|&x| Some(x)).collect()),
        ("back", back.iter().map(|&x| Some(x)).collect()),
        ("nulls", sorted.iter().map(|&x| (r.below(9) != 0).then_some(x)).collect()),
        ("shuffled", shuffled.iter().map(|&x| Some(x)).collect()),
        ("random", (0..n).map(|_| Some(r.below(3000) as i64)).collect()),
        ("halves", (0..n).map(|i| Some((i % (n / 2)) / 3)).collect()),
        ("blocks", (0..n).map(|i| Some((i % 4096) / 3)).collect()),
        ("day", sorted.iter().map(|&x| Some(x / 2)).collect()),
    ];
    let a: Vec<Option<i64>> = (0..n).map(|_| (r.below(7) != 0).then(|| r.below(2001) as i64 - 1000)).collect();
    let b: Vec<Option<f64>> = (0..n).map(|_| (r.below(7) != 0).then(|| (r.below(801) as f64 - 400.0) / 4.0)).collect();
    let schema = "sorted:i64,back:i64,nulls:i64,shuffled:i64,random:i64,halves:i64,blocks:i64,day:date,a:i64,b:f64";
    let t = db.create_table("t", Schema::parse(schema).unwrap()).unwrap();
    for chunk in (0..n as usize).collect::<Vec<_>>().chunks(5000) {
        let mut tx = db.begin();
        let vals: Vec<Vec<Value>> = chunk
            .iter()
            .map(|&i| {
                let mut row: Vec<Value> = cols.iter().map(|(_, c)| c[i].map_or(Value::Null, Value::I64)).collect();
                row[7] = cols[7].1[i].map_or(Value::Null, |d| Value::Date(d as i32));
                row.push(a[i].map_or(Value::Null, Value::I64));
                row.push(b[i].map_or(Value::Null, Value::F64));
                row
            })
            .collect();
        t.append(&mut tx, &vals).unwrap();
        tx.commit().unwrap();
    }
    let with = |sql: &str, threads: usize| -> Vec<Vec<Value>> { run_threads(&db, sql, threads).unwrap_or_else(|e| panic!("{sql}: {e}")) };
    type Acc = (i64, i64, Option<i64>, Option<f64>, Option<i64>, Option<f64>, i64);
    for (ci, (name, keys)) in cols.iter().enumerate() {
        for filter in ["", " WHERE a > -700"] {
            let sql = format!("SELECT {name}, count(*), count(a), sum(a), sum(b), min(a), max(b), avg(a), avg(b) FROM t{filter} GROUP BY {name} ORDER BY 1");
            let mut want: BTreeMap<Option<i64>, Acc> = BTreeMap::new();
            for i in 0..n as usize {
                if !filter.is_empty() && a[i].is_none_or(|a| a <= -700) {
                    continue;
                }
                let e = want.entry(keys[i]).or_insert((0, 0, None, None, None, None, 0));
                e.0 += 1;
                if let Some(x) = a[i] {
                    e.1 += 1;
                    e.2 = Some(e.2.unwrap_or(0) + x);
                    e.4 = Some(e.4.map_or(x, |m| m.min(x)));
                }
                if let Some(y) = b[i] {
                    e.3 = Some(e.3.unwrap_or(0.0) + y);
                    e.5 = Some(e.5.map_or(y, |m| m.max(y)));
                    e.6 += 1;
                }
            }
            let key = |k: Option<i64>| match k {
                None => Value::Null,
                Some(k) if ci == 7 => Value::Date(k as i32),
                Some(k) => Value::I64(k),
            };
            let opt_i = |x: Option<i64>| x.map_or(Value::Null, Value::I64);
            let opt_f = |x: Option<f64>| x.map_or(Value::Null, Value::F64);
            let mut want: Vec<Vec<Value>> = want
                .into_iter()
                .map(|(k, (c, ca, sa, sb, mn, mx, cb))| {
                    vec![
                        key(k),
                        Value::I64(c),
                        Value::I64(ca),
                        opt_i(sa),
                        opt_f(sb),
                        opt_i(mn),
                        opt_f(mx),
                        if ca == 0 { Value::Null } else { Value::F64(sa.unwrap_or(0) as f64 / ca as f64) },
                        if cb == 0 { Value::Null } else { Value::F64(sb.unwrap_or(0.0) / cb as f64) },
                    ]
                })
                .collect();
            // ORDER BY puts NULL last.
            want.sort_by_key(|r| matches!(r[0], Value::Null));
            for threads in [1, 2, 3, 8] {
                assert_rows(&format!("{sql} ({threads} threads)"), &with(&sql, threads), &want);
            }
        }
    }
    // An i64 sum that overflows in a streamed group is still an error.
    let t = db.create_table("big", Schema::parse("k:i64,v:i64").unwrap()).unwrap();
    let mut tx = db.begin();
    let vals: Vec<Vec<Value>> = (0..6000).map(|i| vec![Value::I64(i / 4), Value::I64(if i == 3001 || i == 3002 { i64::MAX / 2 + 1 } else { 1 })]).collect();
    t.append(&mut tx, &vals).unwrap();
    tx.commit().unwrap();
    let e = run(&db, "SELECT k, sum(v) FROM big GROUP BY k").unwrap_err().to_string();
    assert!(e.contains("overflow"), "{e}");
    assert_eq!(q(&db, "SELECT k, sum(v) FROM big WHERE v < 2 GROUP BY k ORDER BY k").len(), 1500);
}

/// A scan reads of each cold packed leaf only the blocks of the columns its query names
/// (the leaf's directory says where they lie): over a table twice the pool, a query on two
/// small columns reads under a quarter of the bytes that one reading a long string column
/// too reads (under half with two threads), its leaves come from the scan rings (not fixed one by one after a failed
/// check), and both give the answers computed here, with one thread and with two.
#[test]
fn a_scan_reads_only_the_columns_it_names() {
    let dir = tempfile::tempdir().unwrap();
    let config = || Config::new(dir.path()).pool_size(2 << 20).scan_rings(true).partial_reads(strata::buffer::PartialReads::Always);
    let mut r = SplitMix64(11);
    let rows: Vec<(i64, f64, String)> = (0..60_000)
        .map(|_| {
            let s: String = (0..60 + r.below(60)).map(|_| char::from(b'a' + r.below(26) as u8)).collect();
            (r.below(100) as i64, r.below(10_000) as f64 / 100.0, s)
        })
        .collect();
    {
        let db = Database::create(config()).unwrap();
        let t = db.create_table("t", Schema::parse("a:i64,b:f64,s:str").unwrap()).unwrap();
        for chunk in rows.chunks(5000) {
            let mut tx = db.begin();
            let vals: Vec<Vec<Value>> = chunk.iter().map(|(a, b, s)| vec![Value::I64(*a), Value::F64(*b), Value::Str(s.clone())]).collect();
            t.append(&mut tx, &vals).unwrap();
            tx.commit().unwrap();
        }
        let (packed, leaves) = t.packed_leaves(db.buffer()).unwrap();
        assert!(packed * 10 >= leaves * 9 && leaves > 64, "{packed} of {leaves} leaves packed");
    }
    let pass = rows.iter().filter(|x| x.0 > 10);
    let count = pass.clone().count() as i64;
    let sum_a: i64 = pass.clone().map(|x| x.0).sum();
    let sum_len: i64 = pass.clone().map(|x| x.2.len() as i64).sum();
    let cents: i64 = pass.map(|x| (x.1 * 100.0).round() as i64).sum();
    // (bytes read, leaves taken from rings) of a query on a freshly opened database.
    let measure = |sql: &str, threads: usize| {
        let db = Database::open(config()).unwrap();
        let before = db.buffer().stats();
        let got = run_threads(&db, sql, threads).unwrap();
        let after = db.buffer().stats();
        (got, after.bytes_read - before.bytes_read, after.ring_hits - before.ring_hits)
    };
    for threads in [1, 2] {
        let (got, narrow, hits) = measure("SELECT count(*), sum(a), sum(b) FROM t WHERE a > 10", threads);
        assert_eq!(got.len(), 1);
        assert_eq!((&got[0][0], &got[0][1]), (&Value::I64(count), &Value::I64(sum_a)));
        let Value::F64(b) = got[0][2] else { panic!("sum(b) is {:?}", got[0][2]) };
        assert!((b * 100.0 - cents as f64).abs() < 1.0, "sum(b) {b}, want {}", cents as f64 / 100.0);
        let (got, wide, _) = measure("SELECT count(*), sum(a), sum(length(s)) FROM t WHERE a > 10", threads);
        assert_eq!(got, vec![vec![Value::I64(count), Value::I64(sum_a), Value::I64(sum_len)]]);
        assert!(hits > 32, "{threads} threads: {hits} leaves from the rings");
        // (Each morsel's first leaf, about 8 of 70 with two threads, is read into the pool
        // whole: scans start a ring only once a leaf ahead is not in memory.)
        let share = if threads == 1 { 4 } else { 2 };
        assert!(narrow * share < wide, "{threads} threads: {narrow} bytes read for two small columns, {wide} with the strings");
    }
}
