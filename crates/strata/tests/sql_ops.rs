//! SQL operators whose state lives in temporary pages (GROUP BY, DISTINCT, ORDER BY, joins,
//! subqueries) against references computed here with plain Rust over the same generated
//! rows: NULLs, an empty table, duplicate and skewed keys, strings of length 0, ≤ 12,
//! 13..100 and several KiB. Through a 1 MiB pool with 4 KiB pages, so that the operators
//! spill on every run, and once through a larger pool.
#![allow(clippy::type_complexity)]

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use strata::access::table::{Schema, Value};
use strata::util::SplitMix64;
use strata::{Config, Database, Error};

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

fn run(db: &Database, sql: &str) -> Result<Vec<Vec<Value>>, Error> {
    let q = strata::sql::prepare(&db.catalog(), sql)?;
    let mut out = Vec::new();
    q.execute(db.buffer(), &mut |row| {
        out.push(row.to_vec());
        Ok(true)
    })?;
    Ok(out)
}

fn q(db: &Database, sql: &str) -> Vec<Vec<Value>> {
    run(db, sql).unwrap_or_else(|e| panic!("{sql}: {e}"))
}

fn same(x: &Value, y: &Value) -> bool {
    match (x, y) {
        (Value::F64(a), Value::F64(b)) => a == b || (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0),
        _ => x == y,
    }
}

fn show(r: &[Value]) -> String {
    let s = format!("{r:?}");
    if s.len() > 300 {
        format!("{}...", &s[..300])
    } else {
        s
    }
}

fn assert_rows(sql: &str, got: &[Vec<Value>], want: &[Vec<Value>]) {
    assert_eq!(got.len(), want.len(), "{sql}: {} rows, expected {}", got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(g.len() == w.len() && g.iter().zip(w).all(|(a, b)| same(a, b)), "{sql}: row {i}: got {}, expected {}", show(g), show(w));
    }
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
    let before = db.buffer().stats().evictions;
    check_group_by(&db, &rows);
    assert!(db.buffer().stats().evictions > before);
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
    check_order_by(&db, &rows);
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
