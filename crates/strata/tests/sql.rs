//! SQL (`strata::sql`): every construct of the first slice against a reference evaluated
//! here, row at a time, on random tables (NULLs in every column, negative numbers, dates,
//! strings of every length class, an empty table) read through a 1 MiB pool with 4 KiB
//! pages so that pages are evicted during the scans; the error messages; and a bounded
//! fuzz run of random and mutated queries that must never panic.
#![allow(clippy::type_complexity)] // the reference cases are tables of closures

mod sql_common;
use sql_common::{assert_rows, q, run};
use std::path::Path;

use strata::access::table::text::{format_date, parse_date};
use strata::access::table::{Schema, Value};
use strata::util::SplitMix64;
use strata::{Config, Database, Error};

const POOL: u64 = 1 << 20;

#[derive(Clone, Debug)]
struct R {
    id: i64,
    a: Option<i64>,
    b: Option<f64>,
    d: Option<i32>,
    f: Option<bool>,
    s: Option<String>,
}

impl R {
    fn values(&self) -> Vec<Value> {
        vec![
            Value::I64(self.id),
            self.a.map_or(Value::Null, Value::I64),
            self.b.map_or(Value::Null, Value::F64),
            self.d.map_or(Value::Null, Value::Date),
            self.f.map_or(Value::Null, Value::Bool),
            self.s.clone().map_or(Value::Null, Value::Str),
        ]
    }
}

/// A string of a length class: empty, inline (≤ 12 bytes), a bit longer, long, very long;
/// letters a–e with an occasional multi-byte character.
fn text(r: &mut SplitMix64) -> String {
    let len = match r.below(10) {
        0 => 0,
        1..=4 => 1 + r.below(12) as usize,
        5..=7 => 13 + r.below(40) as usize,
        8 => 200 + r.below(800) as usize,
        _ => 2000 + r.below(3000) as usize,
    };
    (0..len).map(|_| if r.below(50) == 0 { 'é' } else { char::from(b'a' + r.below(5) as u8) }).collect()
}

fn random_rows(seed: u64, n: usize) -> Vec<R> {
    let mut r = SplitMix64(seed);
    (0..n)
        .map(|i| {
            let null = |r: &mut SplitMix64| r.below(8) == 0;
            R {
                id: i as i64,
                a: (!null(&mut r)).then(|| r.below(201) as i64 - 100),
                b: (!null(&mut r)).then(|| (r.below(20001) as f64 - 10000.0) / 8.0),
                d: (!null(&mut r)).then(|| r.below(36525) as i32 - 7305),
                f: (!null(&mut r)).then(|| r.below(2) == 0),
                s: (!null(&mut r)).then(|| text(&mut r)),
            }
        })
        .collect()
}

fn open(dir: &Path, tables: &[(&str, &[R])]) -> Database {
    let db = Database::create(Config::new(dir).pool_size(POOL).min_page(4096)).unwrap();
    for (name, rows) in tables {
        let t = db.create_table(name, Schema::parse("id:i64,a:i64,b:f64,d:date,f:bool,s:str").unwrap()).unwrap();
        for chunk in rows.chunks(200) {
            let mut tx = db.begin();
            t.append(&mut tx, &chunk.iter().map(R::values).collect::<Vec<_>>()).unwrap();
            tx.commit().unwrap();
        }
    }
    db
}

fn err_of(db: &Database, sql: &str) -> String {
    match run(db, sql) {
        Ok(r) => panic!("{sql}: expected an error, got {} rows", r.len()),
        Err(e @ Error::Sql { .. }) => e.to_string(),
        Err(e) => panic!("{sql}: not a SQL error: {e}"),
    }
}

// ---- the reference: three-valued logic, row at a time ----

type B3 = Option<bool>;

fn and(x: B3, y: B3) -> B3 {
    match (x, y) {
        (Some(false), _) | (_, Some(false)) => Some(false),
        (Some(true), Some(true)) => Some(true),
        _ => None,
    }
}

fn or(x: B3, y: B3) -> B3 {
    match (x, y) {
        (Some(true), _) | (_, Some(true)) => Some(true),
        (Some(false), Some(false)) => Some(false),
        _ => None,
    }
}

fn like(s: &str, p: &str) -> bool {
    // Recursive reference (the library's is iterative).
    let (s, p): (Vec<char>, Vec<char>) = (s.chars().collect(), p.chars().collect());
    fn m(s: &[char], p: &[char]) -> bool {
        match p.first() {
            None => s.is_empty(),
            Some('%') => (0..=s.len()).any(|i| m(&s[i..], &p[1..])),
            Some('_') => !s.is_empty() && m(&s[1..], &p[1..]),
            Some(c) => s.first() == Some(c) && m(&s[1..], &p[1..]),
        }
    }
    m(&s, &p)
}

fn ymd(d: i32) -> (i64, u32, u32) {
    let s = format_date(d);
    (s[0..4].parse().unwrap(), s[5..7].parse().unwrap(), s[8..10].parse().unwrap())
}

fn add_months(d: i32, n: i64) -> i32 {
    let (y, m, day) = ymd(d);
    let t = y * 12 + i64::from(m) - 1 + n;
    let (y, m) = (t.div_euclid(12), t.rem_euclid(12) + 1);
    (0..4).find_map(|k| parse_date(&format!("{y:04}-{m:02}-{:02}", day - k))).unwrap()
}

fn substr(s: &str, from: i64, len: i64) -> String {
    s.chars().enumerate().filter(|(i, _)| (*i as i64 + 1) >= from && (*i as i64 + 1) < from + len).map(|(_, c)| c).collect()
}

fn ids(rows: &[R], pred: impl Fn(&R) -> B3) -> Vec<Vec<Value>> {
    rows.iter().filter(|r| pred(r) == Some(true)).map(|r| vec![Value::I64(r.id)]).collect()
}

fn setup(n: usize) -> (tempfile::TempDir, Database, Vec<R>) {
    let dir = tempfile::tempdir().unwrap();
    let rows = random_rows(42, n);
    let db = open(&dir.path().join("db"), &[("t", &rows), ("empty", &[])]);
    (dir, db, rows)
}

#[test]
fn scans_projections_limits_through_a_tiny_pool() {
    let (_dir, db, rows) = setup(6000);
    let all: Vec<Vec<Value>> = rows.iter().map(R::values).collect();
    // The table is several times the pool, so the scan evicts.
    let bytes: usize = rows.iter().map(|r| r.s.as_ref().map_or(0, |s| s.len()) + 48).sum();
    assert!(bytes as u64 > 2 * POOL, "{bytes} bytes of rows");
    assert_rows("*", &q(&db, "SELECT * FROM t"), &all);
    assert_rows("limit", &q(&db, "SELECT * FROM t LIMIT 7 OFFSET 3"), &all[3..10]);
    assert_rows("limit 0", &q(&db, "SELECT * FROM t LIMIT 0"), &[]);
    assert_rows("offset past", &q(&db, "SELECT id FROM t LIMIT 5 OFFSET 6000"), &[]);
    assert_rows("empty", &q(&db, "SELECT * FROM empty"), &[]);
    assert_rows(
        "alias",
        &q(&db, "SELECT x.s, x.id AS n FROM t AS x WHERE x.id < 3"),
        &rows[..3].iter().map(|r| vec![r.values()[5].clone(), Value::I64(r.id)]).collect::<Vec<_>>(),
    );
    let st = db.buffer().stats();
    assert!(st.peak_resident_bytes <= POOL, "peak {} > pool", st.peak_resident_bytes);
    assert!(st.evictions > 0, "the scans should have evicted pages");
    // Column names: the column, the alias, else the expression's text.
    let p = strata::sql::prepare(&db.catalog(), "SELECT id, a + 1, b AS bee, count(*) FROM empty").err();
    assert!(p.is_some()); // id outside an aggregate
    let p = strata::sql::prepare(&db.catalog(), "SELECT ID, a + 1, b AS bee FROM T").unwrap();
    let names: Vec<_> = p.columns.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["id", "a + 1", "bee"]);
}

#[test]
fn expressions_match_the_reference() {
    let (_dir, db, rows) = setup(1500);
    let num = |v: Option<i64>| v.map_or(Value::Null, Value::I64);
    let flt = |v: Option<f64>| v.map_or(Value::Null, Value::F64);
    let st = |v: Option<String>| v.map_or(Value::Null, Value::Str);
    let dt = |v: Option<i32>| v.map_or(Value::Null, Value::Date);
    let cases: Vec<(&str, Box<dyn Fn(&R) -> Vec<Value>>)> = vec![
        (
            "a + 2, a - 3, a * -4, a / 7, a % 7, -a",
            Box::new(move |r| {
                vec![
                    num(r.a.map(|a| a + 2)),
                    num(r.a.map(|a| a - 3)),
                    num(r.a.map(|a| a * -4)),
                    num(r.a.map(|a| a / 7)),
                    num(r.a.map(|a| a % 7)),
                    num(r.a.map(|a| -a)),
                ]
            }),
        ),
        (
            "a + b, b * 2, a - b / 4",
            Box::new(move |r| {
                vec![flt(r.a.zip(r.b).map(|(a, b)| a as f64 + b)), flt(r.b.map(|b| b * 2.0)), flt(r.a.zip(r.b).map(|(a, b)| a as f64 - b / 4.0))]
            }),
        ),
        (
            "a > 10, a = b, s < 'b', d >= DATE '2000-01-01', f = true",
            Box::new(move |r| {
                let b = |x: Option<bool>| x.map_or(Value::Null, Value::Bool);
                vec![
                    b(r.a.map(|a| a > 10)),
                    b(r.a.zip(r.b).map(|(a, x)| a as f64 == x)),
                    b(r.s.as_ref().map(|s| s.as_str() < "b")),
                    b(r.d.map(|d| d >= parse_date("2000-01-01").unwrap())),
                    b(r.f),
                ]
            }),
        ),
        (
            "CASE WHEN a > 0 THEN 'pos' WHEN a < 0 THEN 'neg' END, CASE a WHEN 1 THEN 1.5 ELSE a END",
            Box::new(move |r| {
                let c1 = match r.a {
                    Some(a) if a > 0 => Value::Str("pos".into()),
                    Some(a) if a < 0 => Value::Str("neg".into()),
                    _ => Value::Null,
                };
                let c2 = match r.a {
                    Some(1) => Value::F64(1.5),
                    a => flt(a.map(|a| a as f64)),
                };
                vec![c1, c2]
            }),
        ),
        (
            "EXTRACT(YEAR FROM d), EXTRACT(MONTH FROM d), EXTRACT(DAY FROM d)",
            Box::new(move |r| {
                let p = r.d.map(ymd);
                vec![num(p.map(|p| p.0)), num(p.map(|p| i64::from(p.1))), num(p.map(|p| i64::from(p.2)))]
            }),
        ),
        (
            "d + INTERVAL '1' MONTH, d - INTERVAL '2' YEAR, d + INTERVAL '10' DAY, d - 3, d - DATE '1970-01-01'",
            Box::new(move |r| {
                vec![
                    dt(r.d.map(|d| add_months(d, 1))),
                    dt(r.d.map(|d| add_months(d, -24))),
                    dt(r.d.map(|d| d + 10)),
                    dt(r.d.map(|d| d - 3)),
                    num(r.d.map(i64::from)),
                ]
            }),
        ),
        (
            "SUBSTRING(s FROM 2 FOR 3), SUBSTRING(s FROM 0 FOR 2), SUBSTRING(s, 4), s || '!'",
            Box::new(move |r| {
                vec![
                    st(r.s.as_ref().map(|s| substr(s, 2, 3))),
                    st(r.s.as_ref().map(|s| substr(s, 0, 2))),
                    st(r.s.as_ref().map(|s| substr(s, 4, i64::MAX / 2))),
                    st(r.s.as_ref().map(|s| format!("{s}!"))),
                ]
            }),
        ),
        (
            "CAST(a AS DOUBLE), CAST(b AS BIGINT), CAST(a AS VARCHAR), CAST(d AS TEXT), CAST(CAST(a AS VARCHAR) AS BIGINT)",
            Box::new(move |r| {
                vec![flt(r.a.map(|a| a as f64)), num(r.b.map(|b| b.round() as i64)), st(r.a.map(|a| a.to_string())), st(r.d.map(format_date)), num(r.a)]
            }),
        ),
        (
            "a IS NULL, s IS NOT NULL, coalesce(a, 0), length(s), abs(a)",
            Box::new(move |r| {
                vec![
                    Value::Bool(r.a.is_none()),
                    Value::Bool(r.s.is_some()),
                    Value::I64(r.a.unwrap_or(0)),
                    num(r.s.as_ref().map(|s| s.chars().count() as i64)),
                    num(r.a.map(i64::abs)),
                ]
            }),
        ),
    ];
    for (sel, f) in &cases {
        let sql = format!("SELECT {sel} FROM t");
        let want: Vec<Vec<Value>> = rows.iter().map(f).collect();
        assert_rows(&sql, &q(&db, &sql), &want);
    }
    // Without FROM.
    assert_rows(
        "consts",
        &q(&db, "SELECT 1 + 2, 7 / 2, 7.0 / 2, NULL + 1, 'x', DATE '2024-02-29' + INTERVAL '1' YEAR"),
        &[vec![Value::I64(3), Value::I64(3), Value::F64(3.5), Value::Null, Value::Str("x".into()), Value::Date(parse_date("2025-02-28").unwrap())]],
    );
}

#[test]
fn where_clauses_match_the_reference() {
    let (_dir, db, rows) = setup(1500);
    let d0 = parse_date("2000-01-01").unwrap();
    let d1 = parse_date("1990-06-01").unwrap();
    let cases: Vec<(&str, Box<dyn Fn(&R) -> B3>)> = vec![
        ("a > 10", Box::new(|r| r.a.map(|a| a > 10))),
        ("a > 10 AND s IS NOT NULL", Box::new(|r| and(r.a.map(|a| a > 10), Some(r.s.is_some())))),
        ("a < 0 OR f", Box::new(|r| or(r.a.map(|a| a < 0), r.f))),
        ("NOT (a > 0)", Box::new(|r| r.a.map(|a| a <= 0))),
        ("NOT f AND NOT a = 3", Box::new(|r| and(r.f.map(|f| !f), r.a.map(|a| a != 3)))),
        ("a BETWEEN -5 AND 20", Box::new(|r| r.a.map(|a| (-5..=20).contains(&a)))),
        ("a NOT BETWEEN -5 AND 20", Box::new(|r| r.a.map(|a| !(-5..=20).contains(&a)))),
        ("a IN (1, 2, 3, NULL)", Box::new(|r| r.a.and_then(|a| if [1, 2, 3].contains(&a) { Some(true) } else { None }))),
        ("a NOT IN (1, 2, 3)", Box::new(|r| r.a.map(|a| ![1, 2, 3].contains(&a)))),
        ("a NOT IN (1, NULL)", Box::new(|r| r.a.and_then(|a| if a == 1 { Some(false) } else { None }))),
        ("s LIKE 'a%'", Box::new(|r| r.s.as_ref().map(|s| like(s, "a%")))),
        ("s LIKE '_b%c'", Box::new(|r| r.s.as_ref().map(|s| like(s, "_b%c")))),
        ("s NOT LIKE '%cd%'", Box::new(|r| r.s.as_ref().map(|s| !like(s, "%cd%")))),
        ("s LIKE '%é%'", Box::new(|r| r.s.as_ref().map(|s| like(s, "%é%")))),
        ("s = ''", Box::new(|r| r.s.as_ref().map(|s| s.is_empty()))),
        ("d >= DATE '2000-01-01'", Box::new(move |r| r.d.map(|d| d >= d0))),
        ("d < '1990-06-01'", Box::new(move |r| r.d.map(|d| d < d1))),
        ("b IS NULL", Box::new(|r| Some(r.b.is_none()))),
        ("f IS NOT NULL AND b < 0", Box::new(|r| and(Some(r.f.is_some()), r.b.map(|b| b < 0.0)))),
        ("EXTRACT(YEAR FROM d) = 1995", Box::new(|r| r.d.map(|d| ymd(d).0 == 1995))),
        ("d + INTERVAL '1' MONTH > DATE '2000-01-01'", Box::new(move |r| r.d.map(|d| add_months(d, 1) > d0))),
        ("a * 2 + b > 3.5", Box::new(|r| r.a.zip(r.b).map(|(a, b)| (a * 2) as f64 + b > 3.5))),
        (
            "CASE WHEN a > 0 THEN s ELSE 'neg' END LIKE 'n%'",
            Box::new(|r| match r.a {
                Some(a) if a > 0 => r.s.as_ref().map(|s| like(s, "n%")),
                _ => Some(true),
            }),
        ),
        ("SUBSTRING(s FROM 2 FOR 2) = 'ab'", Box::new(|r| r.s.as_ref().map(|s| substr(s, 2, 2) == "ab"))),
        // A prefix IN a list is compared in the leaf (characters, not bytes: 'é' is two).
        ("SUBSTRING(s FROM 1 FOR 2) IN ('ab', 'éa', 'c', '')", Box::new(|r| r.s.as_ref().map(|s| ["ab", "éa", "c", ""].contains(&substr(s, 1, 2).as_str())))),
        ("SUBSTRING(s FOR 1) NOT IN ('a', 'é')", Box::new(|r| r.s.as_ref().map(|s| !["a", "é"].contains(&substr(s, 1, 1).as_str())))),
        ("SUBSTRING(s FROM 1 FOR 3) IN ('abc', NULL)", Box::new(|r| r.s.as_ref().and_then(|s| if substr(s, 1, 3) == "abc" { Some(true) } else { None }))),
        ("SUBSTRING(s FROM 1 FOR 0) IN ('')", Box::new(|r| r.s.as_ref().map(|_| true))),
        ("CAST(a AS DOUBLE) / 2 > 1.5", Box::new(|r| r.a.map(|a| a as f64 / 2.0 > 1.5))),
        ("a = a", Box::new(|r| r.a.map(|_| true))),
        ("NULL", Box::new(|_| None)),
        ("true OR NULL", Box::new(|_| Some(true))),
        ("false", Box::new(|_| Some(false))),
    ];
    for (w, pred) in &cases {
        let sql = format!("SELECT id FROM t WHERE {w}");
        let want = ids(&rows, pred);
        assert_rows(&sql, &q(&db, &sql), &want);
        // The same filter over the empty table.
        assert_rows(&sql, &q(&db, &format!("SELECT id FROM empty WHERE {w}")), &[]);
    }
}

#[test]
fn aggregates_match_the_reference() {
    let (_dir, db, rows) = setup(2000);
    let sel = "count(*), count(a), sum(a), avg(a), min(a), max(a), sum(b), avg(b), min(s), max(s), min(d), max(d), count(s), sum(a) * 2 + 1";
    let wheres: [(&str, &dyn Fn(&R) -> bool); 4] = [
        ("true", &|_| true),
        ("a > 50", &|r| r.a.is_some_and(|a| a > 50)),
        ("false", &|_| false),
        ("s LIKE 'e%'", &|r| r.s.as_ref().is_some_and(|s| like(s, "e%"))),
    ];
    for (table, rows) in [("t", &rows[..]), ("empty", &[][..])] {
        for (w, keep) in wheres {
            let sql = format!("SELECT {sel} FROM {table} WHERE {w}");
            let rs: Vec<&R> = rows.iter().filter(|r| keep(r)).collect();
            let a: Vec<i64> = rs.iter().filter_map(|r| r.a).collect();
            let b: Vec<f64> = rs.iter().filter_map(|r| r.b).collect();
            let s: Vec<&String> = rs.iter().filter_map(|r| r.s.as_ref()).collect();
            let d: Vec<i32> = rs.iter().filter_map(|r| r.d).collect();
            let opt = |x: Option<Value>| x.unwrap_or(Value::Null);
            let sum_a = (!a.is_empty()).then(|| a.iter().sum::<i64>());
            let want = vec![
                Value::I64(rs.len() as i64),
                Value::I64(a.len() as i64),
                opt(sum_a.map(Value::I64)),
                opt((!a.is_empty()).then(|| Value::F64(a.iter().sum::<i64>() as f64 / a.len() as f64))),
                opt(a.iter().min().map(|x| Value::I64(*x))),
                opt(a.iter().max().map(|x| Value::I64(*x))),
                opt((!b.is_empty()).then(|| Value::F64(b.iter().sum()))),
                opt((!b.is_empty()).then(|| Value::F64(b.iter().sum::<f64>() / b.len() as f64))),
                opt(s.iter().min().map(|x| Value::Str((*x).clone()))),
                opt(s.iter().max().map(|x| Value::Str((*x).clone()))),
                opt(d.iter().min().map(|x| Value::Date(*x))),
                opt(d.iter().max().map(|x| Value::Date(*x))),
                Value::I64(s.len() as i64),
                opt(sum_a.map(|x| Value::I64(x * 2 + 1))),
            ];
            assert_rows(&sql, &q(&db, &sql), &[want]);
        }
    }
    // HAVING on the one group, LIMIT on the aggregate row.
    assert_rows("having", &q(&db, "SELECT count(*) FROM t HAVING count(*) > 1000000"), &[]);
    assert_eq!(q(&db, "SELECT count(*) FROM t HAVING count(*) > 1").len(), 1);
    assert_rows("limit 0", &q(&db, "SELECT count(*) FROM t LIMIT 0"), &[]);
}

#[test]
fn explain_prints_the_plan() {
    let (_dir, db, _) = setup(10);
    let p = q(&db, "EXPLAIN SELECT count(*) FROM t WHERE a > 5 LIMIT 3");
    let lines: Vec<String> = p.iter().map(|r| if let Value::Str(s) = &r[0] { s.clone() } else { panic!() }).collect();
    assert_eq!(lines, ["Limit 3", "  Project count(*)", "    Aggregate (no groups, constant state) count(*)", "      Scan t filter (a > 5)"]);
}

#[test]
fn errors_name_the_position_and_the_problem() {
    let (_dir, db, _) = setup(50);
    let cases = [
        ("SELECT a FROM t WHERE", "SQL error at 1:22: expected an expression, found the end of the query"),
        ("SELECT a FROM t\nWHERE a >> ", "SQL error at 2:"),
        ("SELEC a FROM t", "SQL error at 1:1: expected an SQL statement, found SELEC"),
        ("SELECT nope FROM t", "SQL error at 1:8: no column named \"nope\" in table \"t\""),
        ("SELECT a FROM nope", "SQL error at 1:15: no table named \"nope\" in this database"),
        ("SELECT z.a FROM t", "SQL error at 1:8: no table named \"z\" in this query"),
        ("SELECT a + s FROM t", "SQL error at 1:8: cannot add i64 and str"),
        ("SELECT s - d FROM t", "cannot subtract date from str"),
        ("SELECT a FROM t WHERE a = 'x'", "cannot compare i64 and str"),
        ("SELECT a FROM t WHERE a", "WHERE needs a bool operand, not i64"),
        ("SELECT a AND f FROM t", "AND needs bool operands, not i64 and bool"),
        ("SELECT sum(s) FROM t", "sum() needs a number, not str"),
        ("SELECT a, count(*) FROM t", "SQL error at 1:8: column \"a\" must be inside an aggregate function or appear in GROUP BY"),
        ("SELECT b FROM t GROUP BY a", "SQL error at 1:8: column \"b\" must appear in the GROUP BY clause or be used in an aggregate function"),
        ("SELECT a FROM t ORDER BY 3", "ORDER BY position 3 is not in the select list"),
        ("SELECT DISTINCT a FROM t ORDER BY b", "for SELECT DISTINCT, ORDER BY expressions must appear in the select list"),
        ("SELECT count(DISTINCT *) FROM t", "count(DISTINCT *)"),
        ("SELECT a FROM t WHERE a > (SELECT a FROM t)", "1:28: a scalar subquery returned more than one row"),
        ("SELECT * FROM t FULL JOIN empty ON t.id = empty.id", "this kind of join"),
        ("SELECT a FROM t WHERE sum(a) > 1", "aggregate functions are not allowed in WHERE"),
        ("SELECT 9223372036854775807 + 1", "SQL error at 1:8: i64 overflow: 9223372036854775807 + 1"),
        ("SELECT -9223372036854775807 - 2", "i64 overflow"),
        ("SELECT 1 / 0", "SQL error at 1:8: division by zero"),
        ("SELECT 1.5 / 0", "division by zero"),
        ("SELECT a / (a - a) FROM t WHERE a IS NOT NULL", "division by zero"),
        ("SELECT CAST('x1' AS BIGINT)", "cannot cast str \"x1\" to i64"),
        ("SELECT DATE '2023-02-29'", "\"2023-02-29\" is not a date (YYYY-MM-DD)"),
        ("SELECT d + INTERVAL '1' HOUR FROM t", "an interval must be INTERVAL 'n' DAY, MONTH or YEAR"),
        ("SELECT a FROM t LIMIT -1", "LIMIT must be a non-negative integer"),
        ("SELECT 1; SELECT 2", "one statement at a time"),
        ("INSERT INTO t VALUES (1)", "only SELECT and EXPLAIN are supported"),
        ("", "no statement given"),
        ("SELECT nosuch(a) FROM t", "no function named nosuch"),
        ("SELECT CAST(d AS BIGINT) FROM t", "cannot cast date to i64"),
    ];
    for (sql, want) in cases {
        let e = err_of(&db, sql);
        assert!(e.contains(want), "{sql:?}: {e:?} does not contain {want:?}");
        assert!(!e.contains('\n'), "{sql:?}: not one line: {e:?}");
    }
    // A sum that overflows is an error, not a wrapped value.
    let dir = tempfile::tempdir().unwrap();
    let big = vec![R { id: 0, a: Some(i64::MAX), b: None, d: None, f: None, s: None }, R { id: 1, a: Some(1), b: None, d: None, f: None, s: None }];
    let db2 = open(&dir.path().join("db"), &[("big", &big)]);
    assert!(err_of(&db2, "SELECT sum(a) FROM big").contains("i64 overflow in sum(a)"));
    assert_rows("avg", &q(&db2, "SELECT avg(a) FROM big"), &[vec![Value::F64((i64::MAX as f64 + 1.0) / 2.0)]]);
}

/// Bounded fuzzing: seed queries, their random mutations (bytes and tokens replaced,
/// dropped, repeated, spliced) and random token soups; none may panic. Counted, not timed,
/// so that the run is the same everywhere (well under 5 s in release builds).
#[test]
fn random_and_mutated_queries_never_panic() {
    let (_dir, db, _) = setup(40);
    let seeds = [
        "SELECT * FROM t",
        "SELECT a + 1, b * 2.5, s || 'x' FROM t WHERE a > 0 AND s LIKE 'a%' LIMIT 10",
        "SELECT count(*), sum(a), avg(b), min(s), max(d) FROM t WHERE d BETWEEN DATE '1990-01-01' AND DATE '2000-01-01'",
        "SELECT CASE WHEN a IN (1, 2, NULL) THEN 'x' ELSE s END FROM t",
        "SELECT EXTRACT(YEAR FROM d + INTERVAL '3' MONTH), SUBSTRING(s FROM 2 FOR 3) FROM t WHERE NOT f IS NULL",
        "SELECT CAST(a AS VARCHAR), CAST(s AS BIGINT) FROM t",
        "EXPLAIN SELECT a FROM t WHERE a / 0 > 1 OFFSET 2",
        "SELECT 9223372036854775807 * 2, -a, a % 0 FROM t",
        "SELECT coalesce(a, 1), abs(a), length(s), upper(s) FROM t HAVING count(*) > 1",
        "SELECT a % 3 AS m, s, count(*), count(DISTINCT d), sum(b) FROM t WHERE a > 0 GROUP BY m, s HAVING count(*) > 1 ORDER BY 3 DESC, m NULLS FIRST LIMIT 5",
        "SELECT DISTINCT s, f FROM t ORDER BY s DESC OFFSET 2",
        "SELECT x.id, y.s FROM t AS x JOIN t AS y ON x.a = y.a AND x.b < y.b LEFT JOIN empty ON empty.id = x.id WHERE y.f",
        "SELECT e.n, t.s FROM (SELECT a, count(*) AS n FROM t GROUP BY a) AS e, t WHERE e.a = t.a ORDER BY e.n",
        "SELECT id FROM t WHERE a IN (SELECT a FROM empty) AND NOT EXISTS (SELECT 1 FROM t WHERE f) AND d NOT IN (SELECT d FROM t)",
        "SELECT id, (SELECT max(a) FROM empty) FROM t WHERE b > (SELECT avg(b) FROM t) OR EXISTS (SELECT 1 FROM empty)",
        "SELECT id FROM t AS x WHERE EXISTS (SELECT * FROM t WHERE t.a = x.a AND t.b > x.b) AND NOT EXISTS (SELECT 1 FROM empty AS e WHERE e.id = x.id)",
        "SELECT id FROM t AS x WHERE x.b < (SELECT 0.5 * avg(b) FROM t WHERE a = x.a AND s = x.s) AND x.a IN (SELECT a FROM t WHERE t.d = x.d)",
        "WITH w (k, n) AS (SELECT a, count(*) FROM t GROUP BY a), v AS (SELECT k FROM w WHERE n > 1) SELECT * FROM w, v WHERE w.k = v.k AND w.n = (SELECT max(n) FROM w)",
        "SELECT a FROM t GROUP BY a HAVING sum(b) > (SELECT sum(b) * 0.1 FROM t) ORDER BY a",
    ];
    let tokens = [
        "SELECT",
        "FROM",
        "WHERE",
        "t",
        "empty",
        "a",
        "b",
        "d",
        "f",
        "s",
        "*",
        "(",
        ")",
        ",",
        "+",
        "-",
        "/",
        "%",
        "||",
        "=",
        "<",
        ">=",
        "<>",
        "AND",
        "OR",
        "NOT",
        "NULL",
        "IS",
        "IN",
        "BETWEEN",
        "LIKE",
        "CASE",
        "WHEN",
        "THEN",
        "ELSE",
        "END",
        "CAST",
        "AS",
        "BIGINT",
        "DATE",
        "'2020-01-01'",
        "INTERVAL",
        "'1'",
        "DAY",
        "MONTH",
        "EXTRACT",
        "YEAR",
        "SUBSTRING",
        "FOR",
        "count",
        "sum",
        "avg",
        "min",
        "max",
        "LIMIT",
        "OFFSET",
        "GROUP",
        "BY",
        "ORDER",
        "0",
        "1",
        "-1",
        "9223372036854775807",
        "1e308",
        "'%_'",
        "''",
        "é",
        "\"a\"",
        ";",
        "EXPLAIN",
        "JOIN",
        "LEFT",
        "ON",
        "DISTINCT",
        "EXISTS",
        "DESC",
        "NULLS",
        "HAVING",
        "x.a",
        "(SELECT a FROM t)",
        ".",
        "x.id",
        "WITH",
        "w",
        "(SELECT max(a) FROM t AS y WHERE y.a = x.a)",
        "EXISTS (SELECT 1 FROM t AS y WHERE y.id = x.id AND y.b < x.b)",
    ];
    let mut r = SplitMix64(7);
    let mut tried = 0;
    let mut check = |sql: &str| {
        // Any result is fine; a panic fails the test.
        let _ = run(&db, sql);
        tried += 1;
    };
    for s in seeds {
        check(s);
    }
    for _ in 0..3000 {
        let base = seeds[r.below(seeds.len() as u64) as usize];
        let mut words: Vec<String> = base.split(' ').map(str::to_owned).collect();
        for _ in 0..=r.below(4) {
            let i = r.below(words.len() as u64) as usize;
            match r.below(6) {
                0 => drop(words.remove(i)),
                1 => words.insert(i, tokens[r.below(tokens.len() as u64) as usize].to_owned()),
                2 => words[i] = tokens[r.below(tokens.len() as u64) as usize].to_owned(),
                3 => {
                    let w = words[i].clone();
                    words.insert(i, w);
                }
                4 => {
                    // Replace one byte (may break UTF-8: then keep the text valid lossily).
                    let mut b = words[i].clone().into_bytes();
                    if !b.is_empty() {
                        let j = r.below(b.len() as u64) as usize;
                        b[j] = r.below(128) as u8;
                    }
                    words[i] = String::from_utf8_lossy(&b).into_owned();
                }
                _ => words.truncate(i),
            }
            if words.is_empty() {
                words.push("SELECT".into());
            }
        }
        check(&words.join(" "));
        let n = 1 + r.below(12) as usize;
        let soup: Vec<&str> = (0..n).map(|_| tokens[r.below(tokens.len() as u64) as usize]).collect();
        check(&format!("SELECT {}", soup.join(" ")));
    }
    // Deep nesting is an error, not a stack overflow.
    check(&format!("SELECT {}1{}", "(".repeat(5000), ")".repeat(5000)));
    check(&format!("SELECT {}1", "-".repeat(5000)));
    check(&format!("SELECT 1{}", " + 1".repeat(5000)));
    check(&format!("SELECT a FROM t WHERE {}", vec!["a > 1"; 3000].join(" AND ")));
    assert!(tried > 6000);
}

#[test]
fn an_or_over_two_relations_gives_its_common_join_key_and_per_relation_filters() {
    let (_dir, db, rows) = setup(300);
    let sql = "SELECT x.id, y.id FROM t AS x, t AS y WHERE (x.id = y.id AND x.a > 0 AND y.b > 0) OR (x.id = y.id AND x.a < -50 AND y.f)";
    let plan: Vec<String> = q(&db, &format!("EXPLAIN {sql}")).iter().map(|r| if let Value::Str(s) = &r[0] { s.clone() } else { panic!() }).collect();
    let text = plan.join("\n");
    assert!(text.contains("HashJoin inner on x.id = y.id"), "{text}");
    assert!(text.contains("Scan t filter ((x.a > 0) OR (x.a < -50))"), "{text}");
    assert!(text.contains("Scan t filter ((y.b > 0) OR y.f)"), "{text}");
    let got = q(&db, &format!("{sql} ORDER BY 1"));
    let want: Vec<Vec<Value>> = rows
        .iter()
        .filter(|r| {
            let (a, b, f) = (r.a, r.b, r.f);
            (a.is_some_and(|a| a > 0) && b.is_some_and(|b| b > 0.0)) || (a.is_some_and(|a| a < -50) && f == Some(true))
        })
        .map(|r| vec![Value::I64(r.id), Value::I64(r.id)])
        .collect();
    assert_rows(sql, &got, &want);
}

#[test]
fn decimal_literal_arithmetic_is_exact() {
    let (_dir, db, _) = setup(1);
    let got = q(&db, "SELECT 0.06 + 0.01 = 0.07, 0.06 - 0.01 = 0.05, 0.1 * 3 = 0.3, 1 + 0.5, -0.25 - 0.5, 0.05 - 0.06 FROM t");
    assert_rows("decimals", &got, &[vec![Value::Bool(true), Value::Bool(true), Value::Bool(true), Value::F64(1.5), Value::F64(-0.75), Value::F64(-0.01)]]);
}

/// Constant subexpressions are computed once at planning (EXPLAIN shows the value), and one
/// whose evaluation fails stays in the plan: it fails on the first row, as before, and not
/// at all on an empty table.
#[test]
fn constant_subexpressions_are_folded_but_errors_wait_for_a_row() {
    let (_dir, db, rows) = setup(50);
    let text: Vec<String> = q(&db, "EXPLAIN SELECT a FROM t WHERE d < DATE '1994-01-01' + INTERVAL '1' YEAR AND a > 2 * 3 - 1")
        .iter()
        .map(|r| if let Value::Str(s) = &r[0] { s.clone() } else { panic!() })
        .collect();
    let text = text.join("\n");
    assert!(text.contains("'1995-01-01'") && text.contains("(a > 5)"), "{text}");
    let want = rows.iter().filter(|r| r.d.is_some_and(|d| d < 9131) && r.a.is_some_and(|a| a > 5)).count();
    assert_eq!(q(&db, "SELECT count(*) FROM t WHERE d < DATE '1994-01-01' + INTERVAL '1' YEAR AND a > 2 * 3 - 1"), vec![vec![Value::I64(want as i64)]]);
    let e = run(&db, "SELECT count(*) FROM t WHERE a > 1 / 0").unwrap_err();
    assert!(e.to_string().contains("division by zero"), "{e}");
    assert_eq!(q(&db, "SELECT count(*) FROM empty WHERE a > 1 / 0"), vec![vec![Value::I64(0)]]);
}
