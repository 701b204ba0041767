//! SQL operators whose state lives in temporary pages (GROUP BY, DISTINCT, ORDER BY, joins,
//! subqueries) against references computed here with plain Rust over the same generated
//! rows: NULLs, an empty table, duplicate and skewed keys, strings of length 0, ≤ 12,
//! 13..100 and several KiB. Through a 1 MiB pool with 4 KiB pages, so that the operators
//! spill on every run, and once through a larger pool.
#![allow(clippy::type_complexity)]

mod sql_common;
use sql_common::{assert_rows, q, run};
use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use strata::access::table::{Schema, Value};
use strata::util::SplitMix64;
use strata::{Config, Database};

const POOL: u64 = 1 << 20;

#[derive(Clone, Debug)]
struct R {
    id: i64,
    k: Option<i64>,
    g: Option<String>,
    x: Option<i64>,
    y: Option<f64>,
    d: Option<i32>,
}

impl R {
    fn values(&self) -> Vec<Value> {
        vec![
            Value::I64(self.id),
            self.k.map_or(Value::Null, Value::I64),
            self.g.clone().map_or(Value::Null, Value::Str),
            self.x.map_or(Value::Null, Value::I64),
            self.y.map_or(Value::Null, Value::F64),
            self.d.map_or(Value::Null, Value::Date),
        ]
    }
}

/// A pool of strings of every length class; rows draw from it with a skew, so that keys
/// repeat (and a few repeat very often).
fn string_pool(r: &mut SplitMix64, n: usize) -> Vec<String> {
    (0..n)
        .map(|i| {
            let len = match i % 10 {
                0 => 0,
                1..=4 => 1 + r.below(12) as usize,
                5..=7 => 13 + r.below(88) as usize,
                _ => 1000 + r.below(4000) as usize,
            };
            let mut s: String = (0..len).map(|_| char::from(b'a' + r.below(4) as u8)).collect();
            if len > 0 {
                s.push_str(&i.to_string()); // distinct
            }
            s
        })
        .collect()
}

fn skewed(r: &mut SplitMix64, n: u64) -> u64 {
    // Half the draws among the first few values.
    if r.below(2) == 0 {
        r.below(n.min(4))
    } else {
        r.below(n)
    }
}

fn random_rows(seed: u64, n: usize, keys: u64, strings: usize) -> Vec<R> {
    let mut r = SplitMix64(seed);
    let pool = string_pool(&mut r, strings);
    (0..n)
        .map(|i| {
            let null = |r: &mut SplitMix64| r.below(9) == 0;
            R {
                id: i as i64,
                k: (!null(&mut r)).then(|| skewed(&mut r, keys) as i64 - 3),
                g: (!null(&mut r)).then(|| pool[skewed(&mut r, pool.len() as u64) as usize].clone()),
                x: (!null(&mut r)).then(|| r.below(2001) as i64 - 1000),
                y: (!null(&mut r)).then(|| (r.below(4001) as f64 - 2000.0) / 4.0),
                d: (!null(&mut r)).then(|| r.below(3000) as i32),
            }
        })
        .collect()
}

fn open(dir: &Path, pool: u64, tables: &[(&str, &[R])]) -> Database {
    let db = Database::create(Config::new(dir).pool_size(pool).min_page(4096)).unwrap();
    for (name, rows) in tables {
        let t = db.create_table(name, Schema::parse("id:i64,k:i64,g:str,x:i64,y:f64,d:date").unwrap()).unwrap();
        for chunk in rows.chunks(200) {
            let mut tx = db.begin();
            t.append(&mut tx, &chunk.iter().map(R::values).collect::<Vec<_>>()).unwrap();
            tx.commit().unwrap();
        }
    }
    db
}

/// A total order on values for sorting result sets (NULL first; floats by their bits'
/// order for the non-NaN values used here).
fn vcmp(a: &Value, b: &Value) -> Ordering {
    let rank = |v: &Value| match v {
        Value::Null => 0,
        Value::I64(_) => 1,
        Value::F64(_) => 2,
        Value::Date(_) => 3,
        Value::Bool(_) => 4,
        Value::Str(_) => 5,
        Value::Bytes(_) => 6,
    };
    match (a, b) {
        (Value::I64(x), Value::I64(y)) => x.cmp(y),
        (Value::F64(x), Value::F64(y)) => x.total_cmp(y),
        (Value::Date(x), Value::Date(y)) => x.cmp(y),
        (Value::Bool(x), Value::Bool(y)) => x.cmp(y),
        (Value::Str(x), Value::Str(y)) => x.cmp(y),
        _ => rank(a).cmp(&rank(b)),
    }
}

/// Sorts rows by their first `n` columns (a key that is unique in the result).
fn sorted(mut rows: Vec<Vec<Value>>, n: usize) -> Vec<Vec<Value>> {
    rows.sort_by(|a, b| a[..n].iter().zip(&b[..n]).map(|(x, y)| vcmp(x, y)).find(|o| o.is_ne()).unwrap_or(Ordering::Equal));
    rows
}

fn assert_set(sql: &str, got: Vec<Vec<Value>>, want: Vec<Vec<Value>>, n: usize) {
    assert_rows(sql, &sorted(got, n), &sorted(want, n));
}

/// The plan `EXPLAIN` prints for `sql`, one line per operator.
fn explain(db: &Database, sql: &str) -> String {
    q(db, &format!("EXPLAIN {sql}")).into_iter().map(|r| format!("{:?}", r[0])).collect::<Vec<_>>().join("\n")
}

/// The rows (t.id, u.id, w.id) of t.k = u.k = w.k with w.x > 900 and u.id < 400.
fn chain_join(t: &[R], u: &[R], w: &[R]) -> Vec<Vec<Value>> {
    let mut want = Vec::new();
    for c in w.iter().filter(|c| c.x.is_some_and(|x| x > 900)) {
        for b in u.iter().filter(|b| b.id < 400 && eq(&b.k, &c.k)) {
            want.extend(t.iter().filter(|a| eq(&a.k, &b.k)).map(|a| vec![id(a), id(b), id(c)]));
        }
    }
    assert!(!want.is_empty());
    want
}

fn i(v: Option<i64>) -> Value {
    v.map_or(Value::Null, Value::I64)
}
fn st(v: Option<&String>) -> Value {
    v.map_or(Value::Null, |s| Value::Str(s.clone()))
}

/// Aggregates of a group, as the reference computes them.
#[derive(Default, Clone)]
struct Agg {
    n: i64,
    xs: Vec<i64>,
    ys: Vec<f64>,
    gs: Vec<String>,
    ds: Vec<i32>,
    ks: Vec<i64>,
}

impl Agg {
    fn add(&mut self, r: &R) {
        self.n += 1;
        self.xs.extend(r.x);
        self.ys.extend(r.y);
        self.gs.extend(r.g.clone());
        self.ds.extend(r.d);
        self.ks.extend(r.k);
    }
    fn sum_x(&self) -> Value {
        if self.xs.is_empty() {
            Value::Null
        } else {
            Value::I64(self.xs.iter().sum())
        }
    }
    fn avg_x(&self) -> Value {
        if self.xs.is_empty() {
            Value::Null
        } else {
            Value::F64(self.xs.iter().sum::<i64>() as f64 / self.xs.len() as f64)
        }
    }
    fn sum_y(&self) -> Value {
        if self.ys.is_empty() {
            Value::Null
        } else {
            Value::F64(self.ys.iter().sum())
        }
    }
    fn min_g(&self) -> Value {
        st(self.gs.iter().min())
    }
    fn max_g(&self) -> Value {
        st(self.gs.iter().max())
    }
    fn min_d(&self) -> Value {
        self.ds.iter().min().map_or(Value::Null, |d| Value::Date(*d))
    }
    fn max_d(&self) -> Value {
        self.ds.iter().max().map_or(Value::Null, |d| Value::Date(*d))
    }
    fn distinct_k(&self) -> Value {
        Value::I64(self.ks.iter().collect::<BTreeSet<_>>().len() as i64)
    }
    fn distinct_g(&self) -> Value {
        Value::I64(self.gs.iter().collect::<BTreeSet<_>>().len() as i64)
    }
    fn sum_distinct_x(&self) -> Value {
        if self.xs.is_empty() {
            Value::Null
        } else {
            Value::I64(self.xs.iter().collect::<BTreeSet<_>>().into_iter().sum())
        }
    }
}

/// Groups `rows` by `key` (a Debug-able value key) in the reference.
fn groups<K: Ord + Clone>(rows: &[R], key: impl Fn(&R) -> K) -> BTreeMap<K, Agg> {
    let mut m: BTreeMap<K, Agg> = BTreeMap::new();
    for r in rows {
        m.entry(key(r)).or_default().add(r);
    }
    m
}

fn setup(pool: u64, n: usize) -> (tempfile::TempDir, Database, Vec<R>) {
    let dir = tempfile::tempdir().unwrap();
    let rows = random_rows(11, n, 40, 400);
    let db = open(&dir.path().join("db"), pool, &[("t", &rows), ("empty", &[])]);
    (dir, db, rows)
}

fn check_group_by(db: &Database, rows: &[R]) {
    // One integer key with NULLs and skew; every aggregate.
    let sql = "SELECT k, count(*), count(x), sum(x), avg(x), min(g), max(g), sum(y), min(d), max(d), count(DISTINCT g), sum(DISTINCT x) FROM t GROUP BY k";
    let want: Vec<Vec<Value>> = groups(rows, |r| r.k)
        .into_iter()
        .map(|(k, a)| {
            vec![
                i(k),
                Value::I64(a.n),
                Value::I64(a.xs.len() as i64),
                a.sum_x(),
                a.avg_x(),
                a.min_g(),
                a.max_g(),
                a.sum_y(),
                a.min_d(),
                a.max_d(),
                a.distinct_g(),
                a.sum_distinct_x(),
            ]
        })
        .collect();
    assert_set(sql, q(db, sql), want, 1);

    // Strings of every length as the key (multi-KiB ones included), DISTINCT counts.
    let sql = "SELECT g, count(*), count(DISTINCT k), max(x), min(y) FROM t GROUP BY g";
    let want: Vec<Vec<Value>> = groups(rows, |r| r.g.clone())
        .into_iter()
        .map(|(g, a)| {
            vec![
                st(g.as_ref()),
                Value::I64(a.n),
                a.distinct_k(),
                i(a.xs.iter().max().copied()),
                a.ys.iter().copied().reduce(f64::min).map_or(Value::Null, Value::F64),
            ]
        })
        .collect();
    assert_set(sql, q(db, sql), want, 1);

    // Several keys, expressions as keys, an expression over keys and aggregates, HAVING.
    let sql = "SELECT k % 3, g IS NULL, count(*), (k % 3) * 10 + count(*) FROM t GROUP BY k % 3, g IS NULL HAVING count(*) > 2";
    let want: Vec<Vec<Value>> = groups(rows, |r| (r.k.map(|k| k % 3), r.g.is_none()))
        .into_iter()
        .filter(|(_, a)| a.n > 2)
        .map(|((k, gnull), a)| vec![i(k), Value::Bool(gnull), Value::I64(a.n), i(k.map(|k| k * 10 + a.n))])
        .collect();
    assert_set(sql, q(db, sql), want, 2);

    // Many small groups (more than one table page holds): the table is flushed to
    // partitions and aggregated partition by partition.
    let sql = "SELECT id % 7000 AS m, g, count(*), sum(x) FROM t GROUP BY m, g";
    let want: Vec<Vec<Value>> =
        groups(rows, |r| (r.id % 7000, r.g.clone())).into_iter().map(|((m, g), a)| vec![Value::I64(m), st(g.as_ref()), Value::I64(a.n), a.sum_x()]).collect();
    assert_set(sql, q(db, sql), want, 2);

    // GROUP BY position, a key not selected.
    let sql = "SELECT x / 100, count(*) FROM t GROUP BY 1";
    let want: Vec<Vec<Value>> = groups(rows, |r| r.x.map(|x| x / 100)).into_iter().map(|(x, a)| vec![i(x), Value::I64(a.n)]).collect();
    assert_set(sql, q(db, sql), want, 1);
    let sql = "SELECT count(*) FROM t GROUP BY d";
    let mut want: Vec<Vec<Value>> = groups(rows, |r| r.d).into_values().map(|a| vec![Value::I64(a.n)]).collect();
    let mut got = q(db, sql);
    want.sort_by(|a, b| vcmp(&a[0], &b[0]));
    got.sort_by(|a, b| vcmp(&a[0], &b[0]));
    assert_rows(sql, &got, &want);

    // DISTINCT aggregates without GROUP BY; over the empty table.
    let all = groups(rows, |_| ()).remove(&()).unwrap_or_default();
    let sql = "SELECT count(DISTINCT g), count(DISTINCT k), count(*), sum(DISTINCT x) FROM t";
    assert_rows(sql, &q(db, sql), &[vec![all.distinct_g(), all.distinct_k(), Value::I64(all.n), all.sum_distinct_x()]]);
    let sql = "SELECT count(DISTINCT g), sum(DISTINCT x) FROM empty";
    assert_rows(sql, &q(db, sql), &[vec![Value::I64(0), Value::Null]]);
    assert_rows("empty group by", &q(db, "SELECT k, count(*) FROM empty GROUP BY k"), &[]);
    let sql = "SELECT k, count(*) FROM t WHERE false GROUP BY k";
    assert_rows(sql, &q(db, sql), &[]);

    // SELECT DISTINCT.
    let sql = "SELECT DISTINCT k, g FROM t";
    let want: Vec<Vec<Value>> = groups(rows, |r| (r.k, r.g.clone())).into_keys().map(|(k, g)| vec![i(k), st(g.as_ref())]).collect();
    assert_set(sql, q(db, sql), want, 2);
    let sql = "SELECT DISTINCT g FROM t";
    let want: Vec<Vec<Value>> = groups(rows, |r| r.g.clone()).into_keys().map(|g| vec![st(g.as_ref())]).collect();
    assert_set(sql, q(db, sql), want, 1);
    assert_rows("distinct empty", &q(db, "SELECT DISTINCT g FROM empty"), &[]);
}

#[test]
fn group_by_and_distinct_match_the_reference_through_a_tiny_pool() {
    let (_dir, db, rows) = setup(POOL, 12_000);
    let before = (db.buffer().stats().evictions, strata::sql::spill_counters());
    check_group_by(&db, &rows);
    assert!(db.buffer().stats().evictions > before.0);
    assert!(strata::sql::spill_counters().agg_flushes > before.1.agg_flushes, "more groups than a table page holds");
    let st = db.buffer().stats();
    assert!(st.peak_resident_bytes <= POOL, "peak {} > pool", st.peak_resident_bytes);
}

#[test]
fn group_by_and_order_by_with_a_larger_pool() {
    let (_dir, db, rows) = setup(64 << 20, 6_000);
    check_group_by(&db, &rows);
    check_order_by(&db, &rows);
}

/// `a` before `b` in SQL's order for one key: NULLS LAST ascending, FIRST descending.
fn ord_key<T: PartialOrd>(a: &Option<T>, b: &Option<T>, desc: bool) -> Ordering {
    let o = match (a, b) {
        (None, None) => Ordering::Equal,
        (None, Some(_)) => Ordering::Greater,
        (Some(_), None) => Ordering::Less,
        (Some(x), Some(y)) => x.partial_cmp(y).unwrap_or(Ordering::Equal),
    };
    if desc {
        o.reverse()
    } else {
        o
    }
}

fn check_order_by(db: &Database, rows: &[R]) {
    let cases: Vec<(&str, Box<dyn Fn(&R, &R) -> Ordering>, Box<dyn Fn(&R) -> Vec<Value>>)> = vec![
        (
            "SELECT id, k, g FROM t ORDER BY k DESC, g, id",
            Box::new(|a, b| ord_key(&a.k, &b.k, true).then(ord_key(&a.g, &b.g, false)).then(a.id.cmp(&b.id))),
            Box::new(|r| vec![Value::I64(r.id), i(r.k), st(r.g.as_ref())]),
        ),
        (
            "SELECT id, y FROM t ORDER BY y NULLS FIRST, id DESC",
            Box::new(|a, b| {
                let o = match (a.y, b.y) {
                    (None, None) => Ordering::Equal,
                    (None, _) => Ordering::Less,
                    (_, None) => Ordering::Greater,
                    (Some(x), Some(y)) => x.partial_cmp(&y).unwrap(),
                };
                o.then(b.id.cmp(&a.id))
            }),
            Box::new(|r| vec![Value::I64(r.id), r.y.map_or(Value::Null, Value::F64)]),
        ),
        (
            "SELECT id FROM t ORDER BY x * 2 DESC, g DESC, id",
            Box::new(|a, b| ord_key(&a.x, &b.x, true).then(ord_key(&a.g, &b.g, true)).then(a.id.cmp(&b.id))),
            Box::new(|r| vec![Value::I64(r.id)]),
        ),
        (
            "SELECT g AS name, d, id FROM t ORDER BY name DESC, 2, 3 DESC",
            Box::new(|a, b| ord_key(&a.g, &b.g, true).then(ord_key(&a.d, &b.d, false)).then(b.id.cmp(&a.id))),
            Box::new(|r| vec![st(r.g.as_ref()), r.d.map_or(Value::Null, Value::Date), Value::I64(r.id)]),
        ),
    ];
    for (sql, cmp, proj) in &cases {
        let mut want: Vec<&R> = rows.iter().collect();
        want.sort_by(|a, b| cmp(a, b));
        let want: Vec<Vec<Value>> = want.into_iter().map(proj).collect();
        assert_rows(sql, &q(db, sql), &want);
        // LIMIT: top-k in memory when small, the external sort when not.
        for (limit, offset) in [(10usize, 0usize), (5, 3), (0, 0), (1500, 20)] {
            let sql2 = format!("{sql} LIMIT {limit} OFFSET {offset}");
            let end = (offset + limit).min(want.len());
            assert_rows(&sql2, &q(db, &sql2), &want[offset.min(end)..end]);
        }
        let sql3 = sql.replace("FROM t", "FROM empty");
        assert_rows(&sql3, &q(db, &sql3), &[]);
    }
    // Aggregates ordered by an aggregate; DISTINCT ordered.
    let sql = "SELECT k, count(*) AS c FROM t GROUP BY k ORDER BY c DESC, k NULLS FIRST";
    let mut want: Vec<(Option<i64>, i64)> = groups(rows, |r| r.k).into_iter().map(|(k, a)| (k, a.n)).collect();
    want.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    assert_rows(sql, &q(db, sql), &want.iter().map(|(k, c)| vec![i(*k), Value::I64(*c)]).collect::<Vec<_>>());
    let sql = "SELECT k, sum(x) FROM t GROUP BY k ORDER BY sum(x) DESC NULLS LAST, k LIMIT 3";
    let mut want: Vec<(Option<i64>, Option<i64>)> =
        groups(rows, |r| r.k).into_iter().map(|(k, a)| (k, (!a.xs.is_empty()).then(|| a.xs.iter().sum()))).collect();
    want.sort_by(|a, b| ord_key(&a.1, &b.1, false).reverse().then(ord_key(&a.0, &b.0, false)));
    // DESC NULLS LAST: NULL sums go last.
    want.sort_by(|a, b| match (a.1, b.1) {
        (None, None) => ord_key(&a.0, &b.0, false),
        (None, _) => Ordering::Greater,
        (_, None) => Ordering::Less,
        (Some(x), Some(y)) => y.cmp(&x).then(ord_key(&a.0, &b.0, false)),
    });
    assert_rows(sql, &q(db, sql), &want[..3.min(want.len())].iter().map(|(k, s)| vec![i(*k), i(*s)]).collect::<Vec<_>>());
    let sql = "SELECT DISTINCT g FROM t ORDER BY g DESC";
    let mut want: Vec<Option<String>> = groups(rows, |r| r.g.clone()).into_keys().collect();
    want.sort_by(|a, b| ord_key(a, b, true));
    assert_rows(sql, &q(db, sql), &want.iter().map(|g| vec![st(g.as_ref())]).collect::<Vec<_>>());
}

#[test]
fn order_by_matches_the_reference_through_a_tiny_pool() {
    let (_dir, db, rows) = setup(POOL, 8_000);
    let before = strata::sql::spill_counters();
    check_order_by(&db, &rows);
    assert!(strata::sql::spill_counters().sort_runs > before.sort_runs + 16, "several merge passes");
    let st = db.buffer().stats();
    assert!(st.peak_resident_bytes <= POOL, "peak {} > pool", st.peak_resident_bytes);
}

#[test]
fn explain_shows_the_operators() {
    let (_dir, db, _) = setup(POOL, 10);
    let lines: Vec<String> = q(&db, "EXPLAIN SELECT DISTINCT k, count(*) FROM t GROUP BY k ORDER BY 2 DESC LIMIT 3")
        .into_iter()
        .map(|r| if let Value::Str(s) = &r[0] { s.clone() } else { panic!() })
        .collect();
    assert_eq!(
        lines,
        [
            "Limit 3",
            "  Sort (top 3 in memory) #2 DESC",
            "    HashDistinct (temp pages, spills by partition) keys k, count(*)",
            "      Project k, count(*)",
            "        HashAggregate (temp pages, spills by partition) keys k aggs count(*)",
            "          Scan t",
        ]
    );
}

fn join_setup(pool: u64) -> (tempfile::TempDir, Database, Vec<R>, Vec<R>, Vec<R>) {
    let dir = tempfile::tempdir().unwrap();
    let t = random_rows(21, 3000, 40, 300);
    let u = random_rows(22, 800, 40, 300);
    let w = random_rows(23, 200, 10, 50);
    let db = open(&dir.path().join("db"), pool, &[("t", &t), ("u", &u), ("w", &w), ("empty", &[])]);
    (dir, db, t, u, w)
}

fn id(r: &R) -> Value {
    Value::I64(r.id)
}

fn eq<T: PartialEq>(a: &Option<T>, b: &Option<T>) -> bool {
    matches!((a, b), (Some(x), Some(y)) if x == y)
}

fn check_joins(db: &Database, t: &[R], u: &[R], w: &[R]) {
    let pairs =
        |f: &dyn Fn(&R, &R) -> bool| -> Vec<Vec<Value>> { t.iter().flat_map(|a| u.iter().filter(move |b| f(a, b)).map(move |b| vec![id(a), id(b)])).collect() };
    // Comma join with the key in WHERE (skewed integer keys, NULLs).
    let sql = "SELECT t.id, u.id FROM t, u WHERE t.k = u.k";
    assert_set(sql, q(db, sql), pairs(&|a, b| eq(&a.k, &b.k)), 2);
    // JOIN ... ON on strings of every length, with a non-equality too; aliases.
    let sql = "SELECT a.id, b.id FROM t AS a JOIN u b ON a.g = b.g AND a.x > b.x";
    assert_set(sql, q(db, sql), pairs(&|a, b| eq(&a.g, &b.g) && a.x.zip(b.x).is_some_and(|(x, y)| x > y)), 2);
    // An i64 key against an f64 key.
    let sql = "SELECT t.id, u.id FROM t JOIN u ON t.x = u.y WHERE t.x BETWEEN -50 AND 50";
    assert_set(sql, q(db, sql), pairs(&|a, b| a.x.is_some_and(|x| (-50..=50).contains(&x) && b.y == Some(x as f64))), 2);
    // LEFT JOIN: a condition on the right alone, and one over both sides.
    let left = |f: &dyn Fn(&R, &R) -> bool| -> Vec<Vec<Value>> {
        let mut out = Vec::new();
        for a in t {
            let m: Vec<&R> = u.iter().filter(|b| f(a, b)).collect();
            if m.is_empty() {
                out.push(vec![id(a), Value::Null, Value::Null]);
            }
            out.extend(m.into_iter().map(|b| vec![id(a), id(b), st(b.g.as_ref())]));
        }
        out
    };
    let sql = "SELECT t.id, u.id, u.g FROM t LEFT JOIN u ON t.k = u.k AND u.x > 600";
    assert_set(sql, q(db, sql), left(&|a, b| eq(&a.k, &b.k) && b.x.is_some_and(|x| x > 600)), 2);
    let sql = "SELECT t.id, u.id, u.g FROM t LEFT OUTER JOIN u ON t.k = u.k AND t.x < u.x - 1500";
    assert_set(sql, q(db, sql), left(&|a, b| eq(&a.k, &b.k) && a.x.zip(b.x).is_some_and(|(x, y)| x < y - 1500)), 2);
    // WHERE over the padded side filters after the join.
    let sql = "SELECT t.id, u.id, u.g FROM t LEFT JOIN u ON t.id = u.id WHERE u.id IS NULL OR u.x > 0";
    let want: Vec<Vec<Value>> = left(&|a, b| a.id == b.id)
        .into_iter()
        .filter(|r| {
            matches!(r[1], Value::Null)
                || u[match r[1] {
                    Value::I64(i) => i as usize,
                    _ => 0,
                }]
                .x
                .is_some_and(|x| x > 0)
        })
        .collect();
    assert_set(sql, q(db, sql), want, 2);
    // One key for all rows (a build side far larger than a table, in one partition: taken
    // in chunks, a bitmap remembering which probe rows matched).
    let sql = "SELECT t.id, count(u.id), max(u.g) FROM t LEFT JOIN u ON t.k * 0 = u.k * 0 AND t.x < u.x WHERE t.id < 300 GROUP BY t.id";
    let want: Vec<Vec<Value>> = t[..300]
        .iter()
        .map(|a| {
            let m: Vec<&R> = u.iter().filter(|b| a.k.is_some() && b.k.is_some() && a.x.zip(b.x).is_some_and(|(x, y)| x < y)).collect();
            vec![id(a), Value::I64(m.len() as i64), st(m.iter().filter_map(|b| b.g.as_ref()).max())]
        })
        .collect();
    assert_set(sql, q(db, sql), want, 1);
    // 8 keys over a build side of several times the pool: partitions that hold several
    // keys and do not fit are partitioned again. (Both sides carry their strings: records
    // carry only the columns used above the join.)
    let sql = "SELECT count(*), sum(b.x), max(b.g), max(a.g) FROM t AS a JOIN t AS b ON a.id % 8 = b.id % 8 WHERE a.id < 1000";
    let (mut n, mut sum, mut mx, mut mxa) = (0i64, 0i64, None::<&String>, None::<&String>);
    for a in &t[..1000] {
        for b in t.iter().filter(|b| b.id % 8 == a.id % 8) {
            n += 1;
            sum += b.x.unwrap_or(0);
            mx = mx.max(b.g.as_ref());
            mxa = mxa.max(a.g.as_ref());
        }
    }
    assert_rows(sql, &q(db, sql), &[vec![Value::I64(n), Value::I64(sum), st(mx), st(mxa)]]);
    // Three tables, a pushed-down filter, the join order from the equalities.
    let sql = "SELECT t.id, u.id, w.id FROM t, w, u WHERE w.x > 0 AND u.id = w.id AND t.k = u.k";
    let want: Vec<Vec<Value>> = t
        .iter()
        .flat_map(|a| {
            u.iter()
                .filter(move |b| eq(&a.k, &b.k))
                .flat_map(move |b| w.iter().filter(move |c| c.id == b.id && c.x.is_some_and(|x| x > 0)).map(move |c| vec![id(a), id(b), id(c)]))
        })
        .collect();
    assert_set(sql, q(db, sql), want, 3);
    // A TPC-H Q3 shape: three tables, filters, several group keys, ORDER BY an aggregate
    // DESC, LIMIT.
    let sql = "SELECT t.k, w.d, sum(u.x * 2) AS rev, count(*) FROM t, u, w WHERE t.id = u.id AND u.k = w.k AND t.g IS NOT NULL AND w.x > 0 \
               GROUP BY t.k, w.d ORDER BY rev DESC NULLS LAST, t.k, 2 LIMIT 10";
    let mut g: BTreeMap<(Option<i64>, Option<i32>), (Option<i64>, i64)> = BTreeMap::new();
    for b in u.iter().filter(|b| (b.id as usize) < t.len()) {
        let a = &t[b.id as usize];
        if a.g.is_none() {
            continue;
        }
        for c in w.iter().filter(|c| eq(&b.k, &c.k) && c.x.is_some_and(|x| x > 0)) {
            let e = g.entry((a.k, c.d)).or_insert((None, 0));
            if let Some(x) = b.x {
                e.0 = Some(e.0.unwrap_or(0) + x * 2);
            }
            e.1 += 1;
        }
    }
    let mut want: Vec<((Option<i64>, Option<i32>), (Option<i64>, i64))> = g.into_iter().collect();
    // DESC NULLS LAST, then the keys ascending (NULLS LAST).
    want.sort_by(|x, y| {
        let rev = match (x.1 .0, y.1 .0) {
            (None, None) => Ordering::Equal,
            (None, _) => Ordering::Greater,
            (_, None) => Ordering::Less,
            (Some(p), Some(q)) => q.cmp(&p),
        };
        rev.then(ord_key(&x.0 .0, &y.0 .0, false)).then(ord_key(&x.0 .1, &y.0 .1, false))
    });
    let want: Vec<Vec<Value>> = want.into_iter().take(10).map(|((k, d), (r, n))| vec![i(k), d.map_or(Value::Null, Value::Date), i(r), Value::I64(n)]).collect();
    assert!(want.len() == 10);
    assert_rows(sql, &q(db, sql), &want);
    // A derived table (an aggregate) joined to a table.
    let sql = "SELECT s.k, s.c, u.id FROM (SELECT k, count(*) AS c FROM t WHERE k IS NOT NULL GROUP BY k) AS s JOIN u ON s.k = u.k";
    let counts = groups(t, |r| r.k);
    let want: Vec<Vec<Value>> = u.iter().filter_map(|b| b.k.and_then(|k| counts.get(&Some(k)).map(|a| vec![Value::I64(k), Value::I64(a.n), id(b)]))).collect();
    assert_set(sql, q(db, sql), want, 3);
    // Empty sides; a cross join.
    assert_rows("join empty", &q(db, "SELECT * FROM t JOIN empty ON t.k = empty.k"), &[]);
    let sql = "SELECT t.id, empty.id FROM t LEFT JOIN empty ON t.k = empty.k";
    assert_set(sql, q(db, sql), t.iter().map(|a| vec![id(a), Value::Null]).collect(), 1);
    assert_rows("cross", &q(db, "SELECT count(*) FROM w, w AS w2"), &[vec![Value::I64((w.len() * w.len()) as i64)]]);
    let sql = "SELECT w.id, w2.id FROM w CROSS JOIN w AS w2 WHERE w.id < 5 AND w2.id < 3";
    let want: Vec<Vec<Value>> = (0..5).flat_map(|a| (0..3).map(move |b| vec![Value::I64(a), Value::I64(b)])).collect();
    assert_set(sql, q(db, sql), want, 2);
    // Joins under GROUP BY and ORDER BY.
    let sql = "SELECT u.k, count(*), sum(t.x) FROM t JOIN u ON t.id = u.id GROUP BY u.k ORDER BY u.k";
    let mut want: Vec<Vec<Value>> =
        groups(&u.iter().filter(|b| (b.id as usize) < t.len()).map(|b| R { x: t[b.id as usize].x, ..b.clone() }).collect::<Vec<_>>(), |r| r.k)
            .into_iter()
            .map(|(k, a)| vec![i(k), Value::I64(a.n), a.sum_x()])
            .collect();
    want.sort_by(|a, b| match (&a[0], &b[0]) {
        (Value::Null, Value::Null) => Ordering::Equal,
        (Value::Null, _) => Ordering::Greater,
        (_, Value::Null) => Ordering::Less,
        (x, y) => vcmp(x, y),
    });
    assert_rows(sql, &q(db, sql), &want);

    // Subqueries: IN, NOT IN (with and without NULLs in the list), EXISTS.
    let ks = |f: &dyn Fn(&R) -> bool| -> Vec<Option<i64>> { u.iter().filter(|b| f(b)).map(|b| b.k).collect() };
    let ids_where = |f: &dyn Fn(&R) -> bool| -> Vec<Vec<Value>> { t.iter().filter(|a| f(a)).map(|a| vec![id(a)]).collect() };
    let inl = ks(&|b| b.x.is_some_and(|x| x > 500));
    let sql = "SELECT id FROM t WHERE k IN (SELECT k FROM u WHERE x > 500)";
    assert_set(sql, q(db, sql), ids_where(&|a| a.k.is_some_and(|k| inl.contains(&Some(k)))), 1);
    let with_null = ks(&|b| b.x.is_some_and(|x| x > 900));
    assert!(with_null.contains(&None), "the test wants a NULL in the list");
    let sql = "SELECT id FROM t WHERE k NOT IN (SELECT k FROM u WHERE x > 900)";
    assert_set(sql, q(db, sql), Vec::new(), 1);
    let no_null = ks(&|b| b.k.is_some() && b.x.is_some_and(|x| x > 0));
    let sql = "SELECT id FROM t WHERE k NOT IN (SELECT k FROM u WHERE k IS NOT NULL AND x > 0) AND id < 2000";
    assert_set(sql, q(db, sql), ids_where(&|a| a.id < 2000 && a.k.is_some_and(|k| !no_null.contains(&Some(k)))), 1);
    let sql = "SELECT id FROM t WHERE NOT (k IN (SELECT k FROM u WHERE k IS NOT NULL AND x > 0)) AND id < 2000";
    assert_set(sql, q(db, sql), ids_where(&|a| a.id < 2000 && a.k.is_some_and(|k| !no_null.contains(&Some(k)))), 1);
    let sql = "SELECT id FROM t WHERE (k IN (SELECT k FROM u WHERE x > 500))";
    assert_set(sql, q(db, sql), ids_where(&|a| a.k.is_some_and(|k| inl.contains(&Some(k)))), 1);
    let sql = "SELECT id FROM t WHERE k NOT IN (SELECT k FROM u WHERE false)";
    assert_set(sql, q(db, sql), ids_where(&|_| true), 1);
    let sql = "SELECT id FROM t WHERE x IN (SELECT y FROM u) AND EXISTS (SELECT 1 FROM w WHERE x > 0)";
    assert_set(sql, q(db, sql), ids_where(&|a| a.x.is_some_and(|x| u.iter().any(|b| b.y == Some(x as f64)))), 1);
    assert_rows("not exists", &q(db, "SELECT id FROM t WHERE NOT EXISTS (SELECT 1 FROM u) "), &[]);
    assert_rows("exists empty", &q(db, "SELECT count(*) FROM t WHERE EXISTS (SELECT * FROM empty)"), &[vec![Value::I64(0)]]);
}

#[test]
fn joins_and_subqueries_match_the_reference_through_a_tiny_pool() {
    let (_dir, db, t, u, w) = join_setup(POOL);
    let before = strata::sql::spill_counters();
    check_joins(&db, &t, &u, &w);
    let after = strata::sql::spill_counters();
    assert!(after.grace_joins > before.grace_joins, "the build sides are larger than an eighth of the pool");
    assert!(after.chunked_partitions > before.chunked_partitions, "skewed keys make partitions larger than a table");
    assert!(after.join_repartitions > before.join_repartitions, "a partition of several keys larger than a table");
    let st = db.buffer().stats();
    assert!(st.peak_resident_bytes <= POOL, "peak {} > pool", st.peak_resident_bytes);
}

/// Whether the plan of `sql` aggregates below a join (a HashAggregate under the first
/// HashJoin: eager aggregation).
fn pre_aggregated(db: &Database, sql: &str) -> bool {
    let plan = explain(db, sql);
    let lines: Vec<&str> = plan.lines().collect();
    let join = lines.iter().position(|l| l.contains("HashJoin"));
    join.is_some_and(|j| lines[j..].iter().any(|l| l.contains("HashAggregate")))
}

/// Groupings over joins whose aggregates read only the right side and whose keys only the
/// left one: the right side is aggregated by its join keys before the join (see
/// `strata::sql::eager`), and the results are those of aggregating after it: left rows
/// with equal keys (each joins the same partial), LEFT joins' unmatched rows (counts 0,
/// the rest NULL), NULL keys on either side, strings and f64 under min/max/sum.
fn check_eager_aggregation(db: &Database, t: &[R], u: &[R]) {
    let matches = |a: &R, f: &dyn Fn(&R) -> bool| -> Agg {
        let mut g = Agg::default();
        for b in u.iter().filter(|b| eq(&a.k, &b.k) && f(b)) {
            g.add(b);
        }
        g
    };
    let count = |xs: usize| Value::I64(xs as i64);
    let max_y = |g: &Agg| g.ys.iter().copied().reduce(f64::max).map_or(Value::Null, Value::F64);
    let min_x = |g: &Agg| g.xs.iter().min().map_or(Value::Null, |x| Value::I64(*x));
    // TPC-H Q13's inner query: a count per left row, 0 without a match.
    let sql = "SELECT t.id, count(u.x) FROM t LEFT JOIN u ON t.k = u.k AND u.x > 0 GROUP BY t.id";
    assert!(pre_aggregated(db, sql), "{sql}: {}", explain(db, sql));
    let want = t.iter().map(|a| vec![id(a), count(matches(a, &|b| b.x.is_some_and(|x| x > 0)).xs.len())]).collect();
    assert_set(sql, q(db, sql), want, 1);
    // Grouped by a left key that repeats (every left row of a group joins the same
    // partial), NULL keys, every mergeable aggregate.
    let sql = "SELECT t.k, count(u.g), sum(u.x), min(u.g), max(u.y), max(u.d) FROM t LEFT JOIN u ON t.k = u.k GROUP BY t.k";
    assert!(pre_aggregated(db, sql), "{sql}: {}", explain(db, sql));
    let mut by_k: BTreeMap<Option<i64>, Agg> = BTreeMap::new();
    for a in t {
        let g = by_k.entry(a.k).or_default();
        for b in u.iter().filter(|b| eq(&a.k, &b.k)) {
            g.add(b);
        }
    }
    let want = by_k.iter().map(|(k, g)| vec![i(*k), count(g.gs.len()), g.sum_x(), g.min_g(), max_y(g), g.max_d()]).collect();
    assert_set(sql, q(db, sql), want, 1);
    // An inner join: count(*) too; only groups with a match.
    let sql = "SELECT t.g, count(*), sum(u.y), min(u.x) FROM t JOIN u ON t.k = u.k GROUP BY t.g";
    assert!(pre_aggregated(db, sql), "{sql}: {}", explain(db, sql));
    let mut by_g: BTreeMap<Option<String>, Agg> = BTreeMap::new();
    for a in t {
        let m = matches(a, &|_| true);
        if m.n > 0 {
            let g = by_g.entry(a.g.clone()).or_default();
            for b in u.iter().filter(|b| eq(&a.k, &b.k)) {
                g.add(b);
            }
        }
    }
    let want = by_g.iter().map(|(k, g)| vec![st(k.as_ref()), Value::I64(g.n), g.sum_y(), min_x(g)]).collect();
    assert_set(sql, q(db, sql), want, 1);
    // Q13 whole: the distribution of those counts.
    let sql = "SELECT c, count(*) FROM (SELECT t.id, count(u.x) AS c FROM t LEFT JOIN u ON t.k = u.k GROUP BY t.id) AS s GROUP BY c";
    let mut dist: BTreeMap<i64, i64> = BTreeMap::new();
    for a in t {
        *dist.entry(matches(a, &|_| true).xs.len() as i64).or_default() += 1;
    }
    assert_set(sql, q(db, sql), dist.into_iter().map(|(c, n)| vec![Value::I64(c), Value::I64(n)]).collect(), 1);
    // Not taken: avg (no mergeable partial), count(*) over a LEFT join (it counts the
    // padded row), DISTINCT, a right side whose join key is unique (nothing to save) ...
    for sql in [
        "SELECT t.id, avg(u.x) FROM t LEFT JOIN u ON t.k = u.k GROUP BY t.id",
        "SELECT t.id, count(*) FROM t LEFT JOIN u ON t.k = u.k GROUP BY t.id",
        "SELECT t.id, count(DISTINCT u.x) FROM t LEFT JOIN u ON t.k = u.k GROUP BY t.id",
        "SELECT t.k, count(u.x) FROM t LEFT JOIN u ON t.k = u.id GROUP BY t.k",
        // ... nor an argument that is not a plain column (non-NULL on the padded row, or
        // able to fail on rows that join nothing) ...
        "SELECT t.id, count(1) FROM t LEFT JOIN u ON t.k = u.k GROUP BY t.id",
        "SELECT t.id, sum(coalesce(u.x, 0)) FROM t LEFT JOIN u ON t.k = u.k GROUP BY t.id",
        // ... nor one whose other side has fewer rows than it has groups (3 rows of t
        // against ~40 keys of u: the join drops most of u).
        "SELECT t.id, count(u.x) FROM t JOIN u ON t.k = u.k WHERE t.id < 3 GROUP BY t.id",
    ] {
        assert!(!pre_aggregated(db, sql), "{sql}: {}", explain(db, sql));
    }
    for sql in ["SELECT t.id, count(*) FROM t LEFT JOIN u ON t.k = u.k GROUP BY t.id", "SELECT t.id, count(1) FROM t LEFT JOIN u ON t.k = u.k GROUP BY t.id"] {
        let want = t.iter().map(|a| vec![id(a), count(matches(a, &|_| true).n.max(1) as usize)]).collect();
        assert_set(sql, q(db, sql), want, 1);
    }
}

/// A chain of seven in-memory joins, each table up to an eighth of a 1 MiB pool, under a
/// grouping: the joins may not all keep their tables latched while rows go up (together
/// they would pin the pool), found in review.
#[test]
fn a_chain_of_joins_runs_through_a_tiny_pool() {
    let dir = tempfile::tempdir().unwrap();
    let db = Database::create(Config::new(dir.path().join("db")).pool_size(POOL).min_page(4096)).unwrap();
    let schema = Schema::parse("id:i64,k:i64").unwrap();
    let fill = |name: &str, rows: i64, keys: i64| {
        let t = db.create_table(name, schema.clone()).unwrap();
        let all: Vec<Vec<Value>> = (0..rows).map(|i| vec![Value::I64(i), Value::I64(i % keys)]).collect();
        for chunk in all.chunks(200) {
            let mut tx = db.begin();
            t.append(&mut tx, chunk).unwrap();
            tx.commit().unwrap();
        }
    };
    fill("a", 20_000, 2000);
    let joins: Vec<String> = (1..=7).map(|i| format!("JOIN b{i} ON a.k = b{i}.k")).collect();
    for i in 1..=7 {
        fill(&format!("b{i}"), 2000, 2000);
    }
    let sql = format!("SELECT count(*) FROM a {}", joins.join(" "));
    assert_rows(&sql, &q(&db, &sql), &[vec![Value::I64(20_000)]]);
    let st = db.buffer().stats();
    assert!(st.peak_resident_bytes <= POOL, "peak {} > pool", st.peak_resident_bytes);
}

#[test]
fn computed_projections_fold_into_groupings_over_joins() {
    let (_dir, db, t, u, _) = join_setup(POOL);
    // The operator under the grouping: its line in the plan follows the grouping's.
    let under = |sql: &str| {
        let plan = explain(&db, sql);
        let lines: Vec<&str> = plan.lines().collect();
        let g = lines.iter().position(|l| l.contains("HashAggregate")).unwrap_or_else(|| panic!("{sql}: {plan}"));
        lines[g + 1].to_owned()
    };
    let mut want: BTreeMap<Option<i64>, (i64, Option<f64>, Option<i64>)> = BTreeMap::new();
    for a in &t {
        for b in u.iter().filter(|b| eq(&a.k, &b.k)) {
            let m = a.x.zip(b.x).map(|(x, y)| (x + y) % 7);
            let e = want.entry(m).or_default();
            e.0 += 1;
            if let Some(y) = a.y {
                e.1 = Some(e.1.unwrap_or(0.0) + y * 2.0);
            }
            if let Some(m) = m {
                e.2 = Some(e.2.unwrap_or(0) + m);
            }
        }
    }
    // Each computed expression read once: the projection goes, the grouping computes them.
    let sql = "SELECT m, count(*), sum(y) FROM (SELECT (t.x + u.x) % 7 AS m, t.y * 2 AS y FROM t JOIN u ON t.k = u.k) AS d GROUP BY m";
    assert!(under(sql).contains("HashJoin"), "{sql}: {}", explain(&db, sql));
    let rows = want.iter().map(|(m, (n, y, _))| vec![i(*m), Value::I64(*n), y.map_or(Value::Null, Value::F64)]).collect();
    assert_set(sql, q(&db, sql), rows, 1);
    // One read twice (key and argument): the projection stays, computed once per row.
    let sql = "SELECT m, sum(m) FROM (SELECT (t.x + u.x) % 7 AS m FROM t JOIN u ON t.k = u.k) AS d GROUP BY m";
    assert!(under(sql).contains("Project"), "{sql}: {}", explain(&db, sql));
    let rows = want.iter().map(|(m, (_, _, s))| vec![i(*m), i(*s)]).collect();
    assert_set(sql, q(&db, sql), rows, 1);
}

#[test]
fn eager_aggregation_matches_the_reference_through_a_tiny_pool() {
    let (_dir, db, t, u, _) = join_setup(POOL);
    check_eager_aggregation(&db, &t, &u);
    let st = db.buffer().stats();
    assert!(st.peak_resident_bytes <= POOL, "peak {} > pool", st.peak_resident_bytes);
}

/// Joins whose records carry only some columns of each side (the others NULL in the
/// rows they give), decoded into one reused row: wide string columns kept or not, keys of
/// several columns (strings of every length class and integers, with NULLs), a LEFT join
/// padding a wide side, semi joins that mark entries, a join under a reordering
/// projection that reads a few of its columns.
fn check_kept_columns(db: &Database, t: &[R], u: &[R], w: &[R]) {
    let pairs = |f: &dyn Fn(&R, &R) -> bool, out: &dyn Fn(&R, &R) -> Vec<Value>| -> Vec<Vec<Value>> {
        t.iter().flat_map(|a| u.iter().filter(move |b| f(a, b)).map(move |b| out(a, b))).collect()
    };
    // A two-column key (string, integer), wide columns of both sides in the output.
    let sql = "SELECT a.id, a.g, b.id, b.g, b.d FROM t AS a JOIN u AS b ON a.g = b.g AND a.k = b.k";
    let want =
        pairs(&|a, b| eq(&a.g, &b.g) && eq(&a.k, &b.k), &|a, b| vec![id(a), st(a.g.as_ref()), id(b), st(b.g.as_ref()), b.d.map_or(Value::Null, Value::Date)]);
    assert!(!want.is_empty());
    assert_set(sql, q(db, sql), want, 3);
    // The same key, the wide columns only in the key (records without them), and no column
    // at all of one side.
    let sql = "SELECT a.id, b.x FROM t AS a JOIN u AS b ON a.g = b.g AND a.d = b.d";
    assert_set(sql, q(db, sql), pairs(&|a, b| eq(&a.g, &b.g) && eq(&a.d, &b.d), &|a, b| vec![id(a), i(b.x)]), 2);
    let sql = "SELECT count(*) FROM t JOIN u ON t.g = u.g";
    let n = pairs(&|a, b| eq(&a.g, &b.g), &|_, _| Vec::new()).len() as i64;
    assert_rows(sql, &q(db, sql), &[vec![Value::I64(n)]]);
    // A LEFT join that pads a wide side, keyed on a date and an integer.
    let sql = "SELECT t.id, t.g, u.g, u.y FROM t LEFT JOIN u ON t.d = u.d AND t.k = u.k WHERE t.id < 1500";
    let mut want = Vec::new();
    for a in &t[..1500] {
        let m: Vec<&R> = u.iter().filter(|b| eq(&a.d, &b.d) && eq(&a.k, &b.k)).collect();
        if m.is_empty() {
            want.push(vec![id(a), st(a.g.as_ref()), Value::Null, Value::Null]);
        }
        want.extend(m.into_iter().map(|b| vec![id(a), st(a.g.as_ref()), st(b.g.as_ref()), b.y.map_or(Value::Null, Value::F64)]));
    }
    assert_set(sql, q(db, sql), want, 4);
    // Semi joins: u (the smaller) is built on and its entries marked; its wide column is
    // in the result.
    let tk: BTreeSet<i64> = t.iter().filter_map(|a| a.k).collect();
    let sql = "SELECT id, g FROM u WHERE k IN (SELECT k FROM t)";
    let want: Vec<Vec<Value>> = u.iter().filter(|b| b.k.is_some_and(|k| tk.contains(&k))).map(|b| vec![id(b), st(b.g.as_ref())]).collect();
    assert_set(sql, q(db, sql), want, 1);
    let sql = "SELECT id, g FROM u WHERE NOT EXISTS (SELECT 1 FROM t WHERE t.g = u.g AND t.x > u.x)";
    let want: Vec<Vec<Value>> =
        u.iter().filter(|b| !t.iter().any(|a| eq(&a.g, &b.g) && a.x.zip(b.x).is_some_and(|(x, y)| x > y))).map(|b| vec![id(b), st(b.g.as_ref())]).collect();
    assert_set(sql, q(db, sql), want, 1);
    // Three tables joined in another order than written: a projection puts the columns
    // back; only two of them are read.
    let sql = "SELECT w.g, t.id FROM t, u, w WHERE t.k = u.k AND u.id = w.id AND w.x > 900";
    let mut want = Vec::new();
    for c in w.iter().filter(|c| c.x.is_some_and(|x| x > 900)) {
        for b in u.iter().filter(|b| b.id == c.id) {
            want.extend(t.iter().filter(|a| eq(&a.k, &b.k)).map(|a| vec![st(c.g.as_ref()), id(a)]));
        }
    }
    assert!(!want.is_empty());
    assert_set(sql, q(db, sql), want, 2);
}

#[test]
fn joins_keep_only_the_columns_used_through_a_tiny_pool() {
    let (_dir, db, t, u, w) = join_setup(POOL);
    let before = strata::sql::spill_counters();
    check_kept_columns(&db, &t, &u, &w);
    let after = strata::sql::spill_counters();
    assert!(after.grace_joins > before.grace_joins, "wide build sides are larger than an eighth of the pool");
    let st = db.buffer().stats();
    assert!(st.peak_resident_bytes <= POOL, "peak {} > pool", st.peak_resident_bytes);
}

#[test]
fn joins_keep_only_the_columns_used_with_a_larger_pool() {
    let (_dir, db, t, u, w) = join_setup(64 << 20);
    check_kept_columns(&db, &t, &u, &w);
}

/// `x [NOT] IN (SELECT ...)` over one relation of a join filters that relation before it
/// is joined, except when a LEFT join pads it (then the joined rows are filtered).
#[test]
fn in_subqueries_filter_their_relation_before_its_joins() {
    let (_dir, db, t, u, w) = join_setup(POOL);
    let wx: BTreeSet<i64> = w.iter().filter(|c| c.y.is_some_and(|y| y > 0.0)).filter_map(|c| c.x).collect();
    let all_wx: BTreeSet<i64> = w.iter().filter_map(|c| c.x).collect();
    assert!(w.iter().any(|c| c.x.is_none()), "the test wants a NULL among w.x");
    let pairs =
        |f: &dyn Fn(&R, &R) -> bool| -> Vec<Vec<Value>> { t.iter().flat_map(|a| u.iter().filter(move |b| f(a, b)).map(move |b| vec![id(a), id(b)])).collect() };
    let sql = "SELECT t.id, u.id FROM t, u WHERE t.k = u.k AND u.x IN (SELECT x FROM w WHERE y > 0)";
    let want = pairs(&|a, b| eq(&a.k, &b.k) && b.x.is_some_and(|x| wx.contains(&x)));
    assert!(!want.is_empty());
    assert_set(sql, q(&db, sql), want, 2);
    let lines: Vec<String> = q(&db, &format!("EXPLAIN {sql}")).into_iter().map(|r| format!("{:?}", r[0])).collect();
    let at = |what: &str| lines.iter().position(|l| l.contains(what)).unwrap_or_else(|| panic!("{what}: {lines:?}"));
    assert!(at("HashJoin semi") > at("HashJoin inner"), "the semi join is below the inner one: {lines:?}");
    let sql = "SELECT t.id, u.id FROM t, u WHERE t.k = u.k AND u.x NOT IN (SELECT x FROM w WHERE x IS NOT NULL AND y > 0)";
    assert_set(sql, q(&db, sql), pairs(&|a, b| eq(&a.k, &b.k) && b.x.is_some_and(|x| !wx.contains(&x))), 2);
    // A NULL in the list: NOT IN is never true.
    assert_rows("not in null", &q(&db, "SELECT t.id, u.id FROM t, u WHERE t.k = u.k AND u.x NOT IN (SELECT x FROM w)"), &[]);
    // The padded side of a LEFT join: its NULLs fail IN after the join.
    let sql = "SELECT t.id, u.id FROM t LEFT JOIN u ON t.k = u.k WHERE u.x IN (SELECT x FROM w)";
    assert_set(sql, q(&db, sql), pairs(&|a, b| eq(&a.k, &b.k) && b.x.is_some_and(|x| all_wx.contains(&x))), 2);
    // The preserved side: filtered first, its rows still padded.
    let sql = "SELECT t.id, u.id FROM t LEFT JOIN u ON t.k = u.k AND u.x > 0 WHERE t.x IN (SELECT x FROM w)";
    let mut want = Vec::new();
    for a in t.iter().filter(|a| a.x.is_some_and(|x| all_wx.contains(&x))) {
        let m: Vec<&R> = u.iter().filter(|b| eq(&a.k, &b.k) && b.x.is_some_and(|x| x > 0)).collect();
        if m.is_empty() {
            want.push(vec![id(a), Value::Null]);
        }
        want.extend(m.into_iter().map(|b| vec![id(a), id(b)]));
    }
    assert!(!want.is_empty());
    assert_set(sql, q(&db, sql), want, 2);
}

/// Relations joined in another order than written need no projection putting their
/// columns back: the grouping and the projection above read the join's rows directly.
#[test]
fn reordered_joins_feed_their_consumers_directly() {
    let (_dir, db, t, u, w) = join_setup(POOL);
    let sql = "SELECT w.g, count(*), sum(t.x) FROM t, u, w WHERE t.k = u.k AND u.id = w.id AND w.x > 900 GROUP BY w.g";
    let lines: Vec<String> = q(&db, &format!("EXPLAIN {sql}"))
        .into_iter()
        .map(|r| match &r[0] {
            Value::Str(l) => l.trim_start().to_owned(),
            v => panic!("{v:?}"),
        })
        .collect();
    let scans: Vec<&str> = lines.iter().filter_map(|l| l.strip_prefix("Scan ")).map(|s| s.split(' ').next().unwrap_or("")).collect();
    assert_ne!(scans, ["t", "u", "w"], "joined in another order than written: {lines:?}");
    let agg = lines.iter().position(|l| l.starts_with("HashAggregate")).unwrap_or_else(|| panic!("{lines:?}"));
    assert!(lines[agg + 1].starts_with("HashJoin"), "no projection between the grouping and the join: {lines:?}");
    let mut g: BTreeMap<Option<String>, (i64, Option<i64>)> = BTreeMap::new();
    for c in w.iter().filter(|c| c.x.is_some_and(|x| x > 900)) {
        for b in u.iter().filter(|b| b.id == c.id) {
            for a in t.iter().filter(|a| eq(&a.k, &b.k)) {
                let e = g.entry(c.g.clone()).or_insert((0, None));
                e.0 += 1;
                if let Some(x) = a.x {
                    e.1 = Some(e.1.unwrap_or(0) + x);
                }
            }
        }
    }
    assert!(!g.is_empty());
    let want: Vec<Vec<Value>> = g.into_iter().map(|(k, (n, s))| vec![st(k.as_ref()), Value::I64(n), i(s)]).collect();
    assert_set(sql, q(&db, sql), want, 1);
}

/// `t.k = u.k AND u.k = w.k` implies `t.k = w.k`: the join order may join t to w
/// directly, and the implied equality is a key of the join that brings the second of them.
#[test]
fn implied_equalities_join_relations_directly() {
    let (_dir, db, t, u, w) = join_setup(POOL);
    let sql = "SELECT t.id, u.id, w.id FROM t, u, w WHERE t.k = u.k AND u.k = w.k AND w.x > 900 AND u.id < 400";
    // The join order w, u, t: t's keys are u.k = t.k and the implied w.k = t.k, which
    // the rows below make redundant (w.k = u.k is applied): one key, the one written.
    // (The implied equalities' use in join orders shows in TPC-H Q5: customer joins
    // nation through c_nationkey = n_nationkey, which the query does not write.)
    let p = explain(&db, sql);
    assert!(p.contains("on u.k = t.k (") || p.contains("on t.k = u.k (") || p.contains("t.k = w.k") || p.contains("w.k = t.k"), "{p}");
    assert_set(sql, q(&db, sql), chain_join(&t, &u, &w), 3);
    // With a LEFT join nothing is implied (a padded NULL equals nothing).
    let sql = "SELECT t.id, u.id, w.id FROM w JOIN u ON u.k = w.k LEFT JOIN t ON t.k = u.k WHERE w.x > 900 AND u.id < 400";
    let mut want = Vec::new();
    for c in w.iter().filter(|c| c.x.is_some_and(|x| x > 900)) {
        for b in u.iter().filter(|b| b.id < 400 && eq(&b.k, &c.k)) {
            let m: Vec<Vec<Value>> = t.iter().filter(|a| eq(&a.k, &b.k)).map(|a| vec![id(a), id(b), id(c)]).collect();
            if m.is_empty() {
                want.push(vec![Value::Null, id(b), id(c)]);
            }
            want.extend(m);
        }
    }
    assert_set(sql, q(&db, sql), want, 3);
}

/// Key equalities of one join step that the rows below already imply are not hashed
/// twice: with `t.k = w.k`, `u.k = w.k` and `t.k = u.k`, the last relation joined needs one
/// of its two equalities as a key (the other two relations' keys are equal already). Two
/// columns of one relation equated to one column are not equal below: both stay keys.
#[test]
fn implied_join_keys_are_hashed_once() {
    let (_dir, db, t, u, w) = join_setup(POOL);
    let keys = |sql: &str| -> usize {
        explain(&db, sql).lines().filter_map(|l| l.split(" on ").nth(1)).map(|on| on.split(" (build").next().unwrap().split(", ").count()).sum()
    };
    let sql = "SELECT t.id, u.id, w.id FROM t, u, w WHERE t.k = w.k AND u.k = w.k AND t.k = u.k AND w.x > 900 AND u.id < 400";
    assert_eq!(keys(sql), 2, "two joins, one key each");
    assert_set(sql, q(&db, sql), chain_join(&t, &u, &w), 3);
    // t.k and t.x are not equal in t's rows: both equalities with u.k are keys.
    let sql = "SELECT t.id, u.id FROM t, u WHERE t.k = u.k AND t.x = u.k";
    assert_eq!(keys(sql), 2);
    let want: Vec<Vec<Value>> = t.iter().flat_map(|a| u.iter().filter(move |b| eq(&a.k, &b.k) && eq(&a.x, &b.k)).map(move |b| vec![id(a), id(b)])).collect();
    assert_set(sql, q(&db, sql), want, 2);
}

#[test]
fn joins_with_a_larger_pool() {
    let (_dir, db, t, u, w) = join_setup(64 << 20);
    check_joins(&db, &t, &u, &w);
}

/// Join filters pushed into probe scans (inner and semi joins, NOT EXISTS that marks a
/// left build side) drop the rows whose keys are not in the build side, on integer,
/// string and two-column keys, with and without row-at-a-time conjuncts in the scan, and
/// under projections and anti joins; LEFT and NOT IN keep their unmatched rows. Against references; the
/// counters show that filters were installed and rows dropped.
#[test]
fn join_filters_drop_probe_rows_that_cannot_match() {
    let (_dir, db, t, _u, w) = join_setup(64 << 20);
    let before = strata::sql::join_filter_counters();
    let ids = |f: &dyn Fn(&R) -> bool| -> Vec<Vec<Value>> { t.iter().filter(|a| f(a)).map(|a| vec![id(a)]).collect() };
    let pairs =
        |f: &dyn Fn(&R, &R) -> bool| -> Vec<Vec<Value>> { t.iter().flat_map(|a| w.iter().filter(move |c| f(a, c)).map(move |c| vec![id(a), id(c)])).collect() };
    // A selective build side (w, few rows pass) probed by t's scan.
    let sql = "SELECT t.id, w.id FROM t JOIN w ON t.k = w.k WHERE w.x > 800";
    assert_set(sql, q(&db, sql), pairs(&|a, c| eq(&a.k, &c.k) && c.x.is_some_and(|x| x > 800)), 2);
    let mid = strata::sql::join_filter_counters();
    assert!(mid.installed > before.installed && mid.rows_dropped > before.rows_dropped, "{before:?} -> {mid:?}");
    // A row-at-a-time conjunct in the probe scan (evaluated before the join filter).
    let sql = "SELECT t.id, w.id FROM t JOIN w ON t.k = w.k WHERE w.x > 800 AND t.x % 3 = 1";
    assert_set(sql, q(&db, sql), pairs(&|a, c| eq(&a.k, &c.k) && c.x.is_some_and(|x| x > 800) && a.x.is_some_and(|x| x % 3 == 1)), 2);
    // String keys of every length class; two-column keys.
    let sql = "SELECT t.id, w.id FROM t JOIN w ON t.g = w.g WHERE w.x > 0";
    assert_set(sql, q(&db, sql), pairs(&|a, c| eq(&a.g, &c.g) && c.x.is_some_and(|x| x > 0)), 2);
    let sql = "SELECT t.id, w.id FROM t JOIN w ON t.k = w.k AND t.g = w.g";
    assert_set(sql, q(&db, sql), pairs(&|a, c| eq(&a.k, &c.k) && eq(&a.g, &c.g)), 2);
    // Two integer columns (hashed from the values), NULLs in both.
    let sql = "SELECT t.id, w.id FROM t JOIN w ON t.k = w.k AND t.x = w.x WHERE w.id < 300";
    let pair = strata::sql::join_filter_counters();
    assert_set(sql, q(&db, sql), pairs(&|a, c| eq(&a.k, &c.k) && eq(&a.x, &c.x) && c.id < 300), 2);
    let after_pair = strata::sql::join_filter_counters();
    assert!(after_pair.installed > pair.installed && after_pair.rows_dropped > pair.rows_dropped, "{pair:?} -> {after_pair:?}");
    // Semi join (IN), NOT EXISTS, and the joins whose unmatched probe rows are results.
    let inw: Vec<i64> = w.iter().filter(|c| c.x.is_some_and(|x| x > 800)).filter_map(|c| c.k).collect();
    let sql = "SELECT id FROM t WHERE k IN (SELECT k FROM w WHERE x > 800)";
    assert_set(sql, q(&db, sql), ids(&|a| a.k.is_some_and(|k| inw.contains(&k))), 1);
    let sql = "SELECT id FROM t WHERE k NOT IN (SELECT k FROM w WHERE x > 800 AND k IS NOT NULL)";
    assert_set(sql, q(&db, sql), ids(&|a| a.k.is_some_and(|k| !inw.contains(&k))), 1);
    let sql = "SELECT w.id FROM w WHERE NOT EXISTS (SELECT 1 FROM t WHERE t.k = w.k AND t.x > 990)";
    let want: Vec<Vec<Value>> = w.iter().filter(|c| !t.iter().any(|a| eq(&a.k, &c.k) && a.x.is_some_and(|x| x > 990))).map(|c| vec![id(c)]).collect();
    assert_set(sql, q(&db, sql), want, 1);
    let sql = "SELECT t.id, w.id FROM t LEFT JOIN w ON t.k = w.k AND w.x > 800";
    let want: Vec<Vec<Value>> = t
        .iter()
        .flat_map(|a| {
            let m: Vec<Vec<Value>> = w.iter().filter(|c| eq(&a.k, &c.k) && c.x.is_some_and(|x| x > 800)).map(|c| vec![id(a), id(c)]).collect();
            if m.is_empty() {
                vec![vec![id(a), Value::Null]]
            } else {
                m
            }
        })
        .collect();
    assert_set(sql, q(&db, sql), want, 2);
    // Through anti joins (NOT IN, NOT EXISTS) on the probe side, as in TPC-H Q16: the
    // inner join's filter reaches t's scan under them.
    let small: Vec<i64> = w.iter().filter_map(|c| c.x).filter(|&x| x < 100).collect();
    assert!(!small.is_empty());
    let sql = "SELECT t.id, w.id FROM t JOIN w ON t.k = w.k WHERE w.x > 800 AND t.x NOT IN (SELECT x FROM w WHERE x < 100)";
    let before = strata::sql::join_filter_counters();
    assert_set(sql, q(&db, sql), pairs(&|a, c| eq(&a.k, &c.k) && c.x.is_some_and(|x| x > 800) && a.x.is_some_and(|x| !small.contains(&x))), 2);
    let after = strata::sql::join_filter_counters();
    assert!(after.installed > before.installed && after.rows_dropped > before.rows_dropped, "{sql}: {before:?} -> {after:?}");
    let sql = "SELECT t.id, w.id FROM t JOIN w ON t.k = w.k WHERE w.x > 800 AND NOT EXISTS (SELECT 1 FROM w AS v WHERE v.k = t.k AND v.x < 100)";
    let before = strata::sql::join_filter_counters();
    let none_small = |a: &R| !w.iter().any(|v| eq(&v.k, &a.k) && v.x.is_some_and(|x| x < 100));
    assert_set(sql, q(&db, sql), pairs(&|a, c| eq(&a.k, &c.k) && c.x.is_some_and(|x| x > 800) && none_small(a)), 2);
    let after = strata::sql::join_filter_counters();
    assert!(after.installed > before.installed && after.rows_dropped > before.rows_dropped, "{sql}: {before:?} -> {after:?}");
    // Through a projection of plain columns (a derived table), grouped above the join.
    let sql = "SELECT count(*), sum(s.x) FROM (SELECT k, x FROM t) AS s JOIN w ON s.k = w.k WHERE w.x > 800";
    let m: Vec<(&R, &R)> = t.iter().flat_map(|a| w.iter().filter(move |c| eq(&a.k, &c.k) && c.x.is_some_and(|x| x > 800)).map(move |c| (a, c))).collect();
    let sum = m.iter().filter_map(|(a, _)| a.x).reduce(|p, q| p + q);
    assert_rows(sql, &q(&db, sql), &[vec![Value::I64(m.len() as i64), sum.map_or(Value::Null, Value::I64)]]);
    // Through a grouping on the join key (the groups that cannot join are never formed),
    // with and without HAVING; the grouping straight over the scan and over a filtered one.
    let counts = groups(&t, |r| r.k);
    let build: Vec<&R> = w.iter().filter(|c| c.x.is_some_and(|x| x > 800)).collect();
    for (sql, min) in [
        ("SELECT w.id, s.k, s.c FROM w JOIN (SELECT k, count(*) AS c FROM t GROUP BY k) AS s ON s.k = w.k WHERE w.x > 800", 0),
        ("SELECT w.id, s.k, s.c FROM w JOIN (SELECT k, count(*) AS c FROM t WHERE x > -2000 OR x IS NULL GROUP BY k HAVING count(*) > 20) AS s ON s.k = w.k WHERE w.x > 800", 21),
    ] {
        let want: Vec<Vec<Value>> = build
            .iter()
            .filter_map(|c| c.k.and_then(|k| counts.get(&Some(k)).filter(|a| a.n >= min).map(|a| vec![id(c), Value::I64(k), Value::I64(a.n)])))
            .collect();
        let before = strata::sql::join_filter_counters();
        assert_set(sql, q(&db, sql), want, 3);
        let after = strata::sql::join_filter_counters();
        assert!(after.rows_dropped > before.rows_dropped, "{sql}: {before:?} -> {after:?}");
    }
}

#[test]
fn joins_build_on_the_smaller_side() {
    let (_dir, db, ..) = join_setup(POOL);
    let plan = |sql: &str| q(&db, &format!("EXPLAIN {sql}")).into_iter().map(|r| format!("{:?}", r[0])).collect::<Vec<_>>().join("\n");
    for sql in ["SELECT t.id FROM t JOIN u ON t.k = u.k", "SELECT t.id FROM u JOIN t ON t.k = u.k", "SELECT t.id FROM t, u WHERE t.k = u.k"] {
        // Whatever the order written, u (the smaller) is joined first and built on.
        let p = plan(sql);
        assert!(p.contains("build: left, ~800 rows vs ~3000") && p.find("Scan u") < p.find("Scan t"), "{sql}: {p}");
    }
    // A LEFT JOIN builds on its right side whatever the sizes.
    assert!(plan("SELECT t.id FROM u LEFT JOIN t ON t.k = u.k").contains("HashJoin left on u.k = t.k (build: right;"));
}

#[test]
fn joins_start_from_the_smallest_filtered_relation() {
    // t (3000 rows), u (800), w (200) but only 3 rows of w pass its filter: the estimates
    // (w's filter evaluated on a sample of its rows) put w first, then u (joined to w),
    // then t; the tables' sizes alone would start from t, the largest, as written.
    let (_dir, db, t, u, w) = join_setup(POOL);
    let sql = "SELECT t.id, u.id, w.id FROM t, u, w WHERE t.k = u.k AND u.id = w.id AND w.id < 3";
    let lines: Vec<String> = q(&db, &format!("EXPLAIN {sql}"))
        .into_iter()
        .map(|r| match &r[0] {
            Value::Str(l) => l.clone(),
            v => panic!("{v:?}"),
        })
        .collect();
    let p = lines.join("\n");
    // The relation joined first is the first scan shown (a join's left input comes first).
    let scans: Vec<&str> = lines.iter().filter_map(|l| l.trim_start().strip_prefix("Scan ")).map(|s| s.split(' ').next().unwrap_or("")).collect();
    assert_eq!(scans, ["w", "u", "t"], "{p}");
    assert!(p.contains("build: left, ~3 rows vs ~800"), "w's filtered estimate builds the first join: {p}");
    let mut want: Vec<Vec<Value>> = Vec::new();
    for a in &t {
        for b in u.iter().filter(|b| eq(&a.k, &b.k) && b.id < 3) {
            for c in w.iter().filter(|c| c.id == b.id) {
                want.push(vec![id(a), id(b), id(c)]);
            }
        }
    }
    assert!(!want.is_empty());
    assert_set(sql, q(&db, sql), want, 3);
}

#[test]
fn join_errors_name_the_problem() {
    let (_dir, db, ..) = join_setup(POOL);
    let cases = [
        ("SELECT id FROM t, u", "column name \"id\" is ambiguous"),
        ("SELECT t.nope FROM t, u", "no column named \"nope\" in table \"t\""),
        ("SELECT z.id FROM t, u", "no table named \"z\" in this query"),
        ("SELECT * FROM t LEFT JOIN u", "LEFT JOIN needs ON"),
        ("SELECT * FROM t JOIN u USING (id)", "JOIN ... USING is not supported yet"),
        ("SELECT id FROM t WHERE k IN (SELECT k, x FROM u)", "the subquery of IN must return one column, not 2"),
        ("SELECT id FROM t WHERE k IN (SELECT g FROM u)", "cannot compare i64 and str"),
        ("SELECT * FROM t JOIN u ON t.k = u.g", "cannot compare i64 and str"),
        (
            "SELECT id FROM t WHERE k = 1 OR k IN (SELECT k FROM u)",
            "x IN (SELECT ...) other than as a condition of WHERE (joined to the others by AND) is not supported yet",
        ),
    ];
    for (sql, want) in cases {
        let e = match run(&db, sql) {
            Ok(r) => panic!("{sql}: expected an error, got {} rows", r.len()),
            Err(e) => e.to_string(),
        };
        assert!(e.contains(want), "{sql:?}: {e:?} does not contain {want:?}");
    }
}

fn avg(xs: impl Iterator<Item = i64>) -> Option<f64> {
    let v: Vec<i64> = xs.collect();
    (!v.is_empty()).then(|| v.iter().sum::<i64>() as f64 / v.len() as f64)
}

/// Scalar subqueries (uncorrelated: once, NULL for no row), correlated EXISTS / NOT EXISTS /
/// IN (semi and anti joins with residuals), correlated aggregate subqueries (grouped and
/// joined) and WITH, against references evaluated row by row here, with NULL keys and
/// values, duplicate and skewed keys.
fn check_subqueries(db: &Database, t: &[R], u: &[R], w: &[R]) {
    let ids_where = |f: &dyn Fn(&R) -> bool| -> Vec<Vec<Value>> { t.iter().filter(|a| f(a)).map(|a| vec![id(a)]).collect() };
    // Uncorrelated scalar subqueries: in WHERE (pushed into the scan), SELECT and HAVING.
    let avg_u = avg(u.iter().filter_map(|b| b.x)).unwrap();
    let sql = "SELECT id FROM t WHERE x > (SELECT avg(x) FROM u)";
    assert_set(sql, q(db, sql), ids_where(&|a| a.x.is_some_and(|x| x as f64 > avg_u)), 1);
    let max_w = w.iter().filter_map(|c| c.x).max().unwrap();
    let sql = "SELECT id, x - (SELECT max(x) FROM w) FROM t WHERE id < 50";
    assert_set(sql, q(db, sql), t[..50].iter().map(|a| vec![id(a), i(a.x.map(|x| x - max_w))]).collect(), 1);
    let sql = "SELECT k, count(*) FROM t GROUP BY k HAVING count(*) > (SELECT count(*) FROM w) / 2";
    let want: Vec<Vec<Value>> = groups(t, |r| r.k).into_iter().filter(|(_, a)| a.n > w.len() as i64 / 2).map(|(k, a)| vec![i(k), Value::I64(a.n)]).collect();
    assert!(!want.is_empty());
    assert_set(sql, q(db, sql), want, 1);
    // No row: NULL (so the comparison is unknown); EXISTS as a value in an OR.
    assert_rows("no row", &q(db, "SELECT id FROM t WHERE x > (SELECT x FROM u WHERE false)"), &[]);
    assert_rows("null", &q(db, "SELECT (SELECT x FROM empty), (SELECT count(*) FROM empty)"), &[vec![Value::Null, Value::I64(0)]]);
    let sql = "SELECT id FROM t WHERE k = 1 OR EXISTS (SELECT 1 FROM empty)";
    assert_set(sql, q(db, sql), ids_where(&|a| a.k == Some(1)), 1);
    let sql = "SELECT count(*) FROM t WHERE NOT EXISTS (SELECT 1 FROM empty) OR k = 1";
    assert_rows(sql, &q(db, sql), &[vec![Value::I64(t.len() as i64)]]);
    // Nested: a scalar subquery inside a scalar subquery.
    let sql = "SELECT count(*) FROM t WHERE x > (SELECT max(x) FROM u WHERE x < (SELECT avg(x) FROM w))";
    let avg_w = avg(w.iter().filter_map(|c| c.x)).unwrap();
    let m = u.iter().filter_map(|b| b.x).filter(|x| (*x as f64) < avg_w).max().unwrap();
    assert_rows(sql, &q(db, sql), &[vec![Value::I64(t.iter().filter(|a| a.x.is_some_and(|x| x > m)).count() as i64)]]);

    // Correlated EXISTS with a residual (a non-equality over both sides).
    let sql = "SELECT id FROM t WHERE EXISTS (SELECT * FROM u WHERE u.k = t.k AND u.x > t.x)";
    assert_set(sql, q(db, sql), ids_where(&|a| u.iter().any(|b| eq(&a.k, &b.k) && a.x.zip(b.x).is_some_and(|(x, y)| y > x))), 1);
    // NOT EXISTS: a NULL key matches nothing, so those rows stay (unlike NOT IN).
    let sql = "SELECT id FROM t WHERE NOT EXISTS (SELECT 1 FROM u WHERE u.k = t.k AND u.g <> t.g)";
    let want = ids_where(&|a| !u.iter().any(|b| eq(&a.k, &b.k) && a.g.is_some() && b.g.is_some() && a.g != b.g));
    assert!(want.iter().any(|r| t[match r[0] {
        Value::I64(i) => i as usize,
        _ => 0,
    }]
    .k
    .is_none()));
    assert_set(sql, q(db, sql), want, 1);
    // TPC-H Q21's shape: EXISTS and NOT EXISTS on the same key with residuals.
    let sql = "SELECT id FROM t WHERE EXISTS (SELECT * FROM u WHERE u.k = t.k AND u.id <> t.id) \
               AND NOT EXISTS (SELECT * FROM u AS u3 WHERE u3.k = t.k AND u3.id <> t.id AND u3.x > 900)";
    let want =
        ids_where(&|a| u.iter().any(|b| eq(&a.k, &b.k) && b.id != a.id) && !u.iter().any(|b| eq(&a.k, &b.k) && b.id != a.id && b.x.is_some_and(|x| x > 900)));
    assert!(!want.is_empty());
    assert_set(sql, q(db, sql), want, 1);
    // Correlated IN: a semi join on both keys.
    let sql = "SELECT id FROM t WHERE x IN (SELECT x FROM u WHERE u.k = t.k)";
    assert_set(sql, q(db, sql), ids_where(&|a| u.iter().any(|b| eq(&a.k, &b.k) && eq(&a.x, &b.x))), 1);
    // The left side smaller than the right: semi and anti joins build on the left (the
    // right rows mark what they match), through grace partitions and, for one key
    // shared by all rows, in chunks.
    let u_where = |f: &dyn Fn(&R) -> bool| -> Vec<Vec<Value>> { u.iter().filter(|b| f(b)).map(|b| vec![id(b)]).collect() };
    let before = strata::sql::spill_counters();
    let sql = "SELECT id FROM u WHERE NOT EXISTS (SELECT 1 FROM t WHERE t.k = u.k AND t.x > u.x + 900)";
    let want = u_where(&|b| !t.iter().any(|a| eq(&a.k, &b.k) && a.x.zip(b.x).is_some_and(|(x, y)| x > y + 900)));
    assert!(want.len() > 10 && want.len() < u.len() - 10);
    assert_set(sql, q(db, sql), want, 1);
    let sql = "SELECT id, g FROM u WHERE EXISTS (SELECT 1 FROM t WHERE t.g = u.g AND t.id <> u.id)";
    let want: Vec<Vec<Value>> = u.iter().filter(|b| t.iter().any(|a| eq(&a.g, &b.g) && a.id != b.id)).map(|b| vec![id(b), st(b.g.as_ref())]).collect();
    assert_set(sql, q(db, sql), want, 1);
    // One key for all rows: the build side (u, with its long strings g, which the scan must
    // decode because the result has them) does not fit the pool and is joined in chunks.
    let u_where_g = |f: &dyn Fn(&R) -> bool| -> Vec<Vec<Value>> { u.iter().filter(|b| f(b)).map(|b| vec![id(b), st(b.g.as_ref())]).collect() };
    let sql = "SELECT id, g FROM u WHERE EXISTS (SELECT 1 FROM t WHERE t.id * 0 = u.id * 0 AND t.x > u.x + 1500)";
    assert_set(sql, q(db, sql), u_where_g(&|b| t.iter().any(|a| a.x.zip(b.x).is_some_and(|(x, y)| x > y + 1500))), 1);
    let sql = "SELECT id, g FROM u WHERE NOT EXISTS (SELECT 1 FROM t WHERE t.id * 0 = u.id * 0 AND t.x > u.x + 1500)";
    assert_set(sql, q(db, sql), u_where_g(&|b| !t.iter().any(|a| a.x.zip(b.x).is_some_and(|(x, y)| x > y + 1500))), 1);
    let sql = "SELECT id FROM u WHERE k IN (SELECT k FROM t WHERE x > 0)";
    assert_set(sql, q(db, sql), u_where(&|b| t.iter().any(|a| eq(&a.k, &b.k) && a.x.is_some_and(|x| x > 0))), 1);
    let after = strata::sql::spill_counters();
    assert!(after.grace_joins > before.grace_joins && after.chunked_partitions > before.chunked_partitions, "{before:?} {after:?}");
    // An uncorrelated-looking name: inside, `t` is the subquery's own table.
    let sql = "SELECT count(*) FROM w WHERE EXISTS (SELECT 1 FROM t WHERE t.id = 7)";
    assert_rows(sql, &q(db, sql), &[vec![Value::I64(w.len() as i64)]]);

    // Correlated aggregate subqueries, grouped by the correlation key and joined.
    let sql = "SELECT id FROM t WHERE x > (SELECT avg(x) FROM u WHERE u.k = t.k)";
    let want = ids_where(&|a| a.x.is_some_and(|x| avg(u.iter().filter(|b| eq(&a.k, &b.k)).filter_map(|b| b.x)).is_some_and(|m| x as f64 > m)));
    assert!(!want.is_empty());
    assert_set(sql, q(db, sql), want, 1);
    // Q17's shape: the same table inside and out (aliased), an expression of the aggregate.
    let sql = "SELECT sum(x) FROM t AS a WHERE a.id < 2000 AND y < (SELECT 0.5 * max(y) FROM t WHERE k = a.k AND d IS NOT NULL)";
    let mut sum = None::<i64>;
    for a in t.iter().filter(|a| a.id < 2000) {
        let m = t.iter().filter(|b| eq(&b.k, &a.k) && b.d.is_some()).filter_map(|b| b.y).fold(None::<f64>, |m, y| Some(m.map_or(y, |m| m.max(y))));
        if a.y.zip(m).is_some_and(|(y, m)| y < 0.5 * m) {
            if let Some(x) = a.x {
                sum = Some(sum.unwrap_or(0) + x);
            }
        }
    }
    assert_rows(sql, &q(db, sql), &[vec![i(sum)]]);
    // Q2's shape: two correlation keys, the subquery on the left of =.
    let sql = "SELECT t.id FROM t, w WHERE t.k = w.k AND (SELECT min(u.x) FROM u WHERE u.k = t.k AND u.g = w.g) = t.x";
    let mut want = Vec::new();
    for a in t {
        for c in w.iter().filter(|c| eq(&a.k, &c.k)) {
            let m = u.iter().filter(|b| eq(&b.k, &a.k) && eq(&b.g, &c.g)).filter_map(|b| b.x).min();
            if m.is_some() && m == a.x {
                want.push(vec![id(a)]);
            }
        }
    }
    assert_set(sql, q(db, sql), want, 1);
    // Q20's shape: a correlated aggregate inside an IN subquery, correlated to it.
    let sql = "SELECT id FROM w WHERE k IN (SELECT u.k FROM u WHERE u.x > (SELECT sum(t.x) / 100 FROM t WHERE t.k = u.k AND t.g = u.g))";
    let inner: Vec<i64> = u
        .iter()
        .filter(|b| {
            let s: Vec<i64> = t.iter().filter(|a| eq(&a.k, &b.k) && eq(&a.g, &b.g)).filter_map(|a| a.x).collect();
            !s.is_empty() && b.x.is_some_and(|x| x > s.iter().sum::<i64>() / 100)
        })
        .filter_map(|b| b.k)
        .collect();
    let want: Vec<Vec<Value>> = w.iter().filter(|c| c.k.is_some_and(|k| inner.contains(&k))).map(|c| vec![id(c)]).collect();
    assert!(!want.is_empty());
    assert_set(sql, q(db, sql), want, 1);

    // WITH: inlined where it is used (twice here, once in a scalar subquery); a column list;
    // one WITH query over another.
    let sql = "WITH s AS (SELECT k, sum(x) AS total FROM t WHERE k IS NOT NULL GROUP BY k) SELECT k, total FROM s WHERE total = (SELECT max(total) FROM s)";
    let sums: Vec<(i64, i64)> = groups(t, |r| r.k).into_iter().filter_map(|(k, a)| Some((k?, a.xs.iter().sum::<i64>()))).collect();
    let best = sums.iter().map(|s| s.1).max().unwrap();
    assert_set(sql, q(db, sql), sums.iter().filter(|s| s.1 == best).map(|s| vec![Value::I64(s.0), Value::I64(s.1)]).collect(), 1);
    let sql = "WITH a (kk) AS (SELECT k FROM w WHERE k IS NOT NULL), b AS (SELECT kk FROM a WHERE kk > 0) SELECT count(*), (SELECT count(*) FROM a) FROM b";
    let n = |f: &dyn Fn(i64) -> bool| w.iter().filter(|c| c.k.is_some_and(f)).count() as i64;
    assert_rows(sql, &q(db, sql), &[vec![Value::I64(n(&|k| k > 0)), Value::I64(n(&|_| true))]]);
}

#[test]
fn subqueries_match_the_reference_through_a_tiny_pool() {
    let (_dir, db, t, u, w) = join_setup(POOL);
    check_subqueries(&db, &t, &u, &w);
    assert!(db.buffer().stats().peak_resident_bytes <= POOL);
}

#[test]
fn subquery_errors_name_the_problem() {
    let (_dir, db, ..) = join_setup(POOL);
    let cases = [
        ("SELECT (SELECT x FROM u)", "1:9: a scalar subquery returned more than one row"),
        ("SELECT id FROM t WHERE x = (SELECT x, y FROM u)", "a scalar subquery must return one column, not 2"),
        ("SELECT id, (SELECT max(x) FROM u WHERE u.k = t.k) FROM t", "1:13: a correlated subquery is not supported here"),
        ("SELECT id FROM t WHERE x > (SELECT max(x) FROM u WHERE u.k < t.k)", "can only be correlated by equalities"),
        ("SELECT id FROM t WHERE x > (SELECT count(*) FROM u WHERE u.k = t.k)", "whose value over no rows is not NULL (as with count)"),
        ("SELECT id FROM t WHERE x > (SELECT x FROM u WHERE u.k = t.k)", "a correlated scalar subquery without an aggregate"),
        ("SELECT id FROM t WHERE k NOT IN (SELECT k FROM u WHERE u.x = t.x)", "NOT IN with a correlated subquery"),
        ("SELECT id FROM t WHERE EXISTS (SELECT count(*) FROM u WHERE u.k = t.k)", "EXISTS over a correlated subquery with aggregates"),
        ("SELECT id FROM t WHERE EXISTS (SELECT k FROM u WHERE u.k = t.k GROUP BY k)", "GROUP BY or HAVING in a correlated subquery"),
        ("SELECT id FROM t WHERE EXISTS (SELECT k FROM u WHERE u.k = t.k LIMIT 1)", "ORDER BY, LIMIT or OFFSET in a correlated subquery"),
        ("WITH RECURSIVE r AS (SELECT 1) SELECT * FROM r", "WITH RECURSIVE is not supported yet"),
        ("WITH a AS (SELECT 1), A AS (SELECT 2) SELECT * FROM a", "1:23: WITH names \"A\" twice"),
        ("WITH a AS (SELECT * FROM a) SELECT * FROM a", "no table named \"a\" in this database"),
        ("WITH a (p, q) AS (SELECT 1) SELECT * FROM a", "has 1 columns, the alias names 2"),
        (
            "SELECT id FROM t WHERE EXISTS (SELECT 1 FROM u WHERE EXISTS (SELECT 1 FROM w WHERE w.k = t.k))",
            "1:90: \"t.k\" is a column of an enclosing query; a subquery reads those only in its WHERE, and only of the query directly around it",
        ),
        ("SELECT id FROM t WHERE EXISTS (SELECT t.id FROM u JOIN w ON w.k = t.k WHERE u.k = t.k)", "1:67: \"t.k\" is a column of an enclosing query"),
        ("SELECT id FROM t WHERE EXISTS (SELECT 1 FROM u WHERE u.nope = t.k)", "no column named \"nope\" in table \"u\""),
    ];
    for (sql, want) in cases {
        let e = match run(&db, sql) {
            Ok(r) => panic!("{sql}: expected an error, got {} rows", r.len()),
            Err(e) => e.to_string(),
        };
        assert!(e.contains(want), "{sql:?}: {e:?} does not contain {want:?}");
        assert!(!e.contains('\n'), "{e:?}");
    }
    // WITH cannot make planning exponential.
    let mut sql = "WITH c0 AS (SELECT 1 AS v)".to_owned();
    for k in 1..16 {
        sql.push_str(&format!(", c{k} AS (SELECT a.v FROM c{} AS a, c{} AS b)", k - 1, k - 1));
    }
    sql.push_str(" SELECT * FROM c15");
    let e = run(&db, &sql).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(e.contains("more than 1000 subqueries"), "{e}");
}

#[test]
fn decorrelated_subqueries_are_joins_in_the_plan() {
    let (_dir, db, ..) = join_setup(POOL);
    let plan = |sql: &str| {
        let lines: Vec<String> = q(&db, &format!("EXPLAIN {sql}"))
            .into_iter()
            .map(|r| match &r[0] {
                Value::Str(s) => s.clone(),
                v => panic!("{v:?}"),
            })
            .collect();
        lines.join("\n")
    };
    let p = plan("SELECT id FROM t WHERE NOT EXISTS (SELECT 1 FROM u WHERE u.k = t.k AND u.x > t.x)");
    assert!(p.contains("HashJoin notexists on t.k = u.k (build: right, ~800 rows vs ~3000,") && p.contains("and (u.x > t.x)"), "{p}");
    // Only the subquery's columns that the keys and the residual read are kept.
    assert!(p.contains("    Project k, x\n      Scan u"), "{p}");
    // A semi join builds on the left side when it has fewer rows.
    let p = plan("SELECT id FROM u WHERE EXISTS (SELECT 1 FROM t WHERE u.k = t.k)");
    assert!(p.contains("HashJoin semi on u.k = t.k (build: left, ~800 rows vs ~3000,"), "{p}");
    let p = plan("SELECT id FROM t WHERE x IN (SELECT x FROM u WHERE u.k = t.k)");
    assert!(p.contains("HashJoin semi on x = x, t.k = u.k"), "{p}");
    // A correlated aggregate: grouped by its key, joined; its groups restricted to the keys
    // of the filtered outer relation (a semi join before the grouping).
    let p = plan("SELECT id FROM t WHERE t.id < 100 AND x > (SELECT avg(x) FROM u WHERE u.k = t.k)");
    assert!(p.contains("HashJoin inner on t.k = #key1"), "{p}");
    assert!(p.contains("HashAggregate (temp pages, spills by partition) keys u.k aggs avg(x)"), "{p}");
    assert!(p.contains("HashJoin semi on u.k = #key1") && p.contains("Project t.k\n              Scan t filter (t.id < 100)"), "{p}");
    // An uncorrelated scalar: once, before the rows, its value pushed into the scan.
    let p = plan("SELECT id FROM t WHERE x > (SELECT avg(x) FROM u)");
    assert!(p.starts_with("$1 := scalar subquery (once, before the rows)") && p.contains("Scan t filter (x > $1)"), "{p}");
}

/// A grouping's row estimate is the number of groups its sample shows, not its input's
/// rows: clustered keys (each value in a run of four rows) scale from the sampled windows to
/// the table, a small domain (25 values met in every window) stays at its size, unique keys
/// give one group per row. The estimate decides which side an IN-subquery's semi join
/// builds on (TPC-H Q18: the subquery's groups, not the orders).
#[test]
fn group_estimates_follow_the_sampled_groups() {
    let dir = tempfile::tempdir().unwrap();
    let row = |i: i64, k: i64, x: i64| R { id: i, k: Some(k), g: None, x: Some(x), y: None, d: None };
    let items: Vec<R> = (0..6000).map(|i| row(i, i / 4, i % 25)).collect();
    let o: Vec<R> = (0..1000).map(|i| row(i, i, i)).collect();
    let db = open(&dir.path().join("db"), 8 << 20, &[("items", &items), ("o", &o)]);
    for (col, having, build, want) in [
        // 1500 groups of four rows (~750 after the filter, < 1000 rows of o).
        ("k", "count(*) > 3", "right", 1000),
        // 25 groups of 240 rows.
        ("x", "count(*) > 3", "right", 25),
        // 6000 groups of one row (~3000 after the filter): builds on o.
        ("id", "count(*) > 0", "left", 1000),
    ] {
        let sql = format!("SELECT o.id FROM o WHERE o.id IN (SELECT {col} FROM items GROUP BY {col} HAVING {having})");
        let p = q(&db, &format!("EXPLAIN {sql}")).into_iter().map(|r| format!("{:?}", r[0])).collect::<Vec<_>>().join("\n");
        assert!(p.contains(&format!("HashJoin semi on o.id = subquery (build: {build},")), "{col}: {p}");
        assert_eq!(q(&db, &sql).len(), want, "{sql}");
    }
}
