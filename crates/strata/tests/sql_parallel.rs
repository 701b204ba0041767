//! Parallel join pipelines (`strata::sql::pipeline`, `Prepared::set_threads`): an
//! aggregation over hash joins runs on several workers over morsels of the probe scan, the
//! joins' tables built once and probed by every worker. Its results must equal a reference
//! computed here from the rows themselves (row-at-a-time, in the test) and the results of
//! one thread, for inner, LEFT, semi (IN) and anti (NOT IN) joins, chains of joins,
//! filters and projections in between, NULL keys on both sides, duplicate and skewed keys;
//! a join too large for a table (a 1 MiB pool) sends the pipeline back to one thread with
//! the same results.

mod sql_common;
use sql_common::{assert_rows, run_threads};

use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;

use strata::sql::pipeline::parallel_here;

use strata::access::table::{Schema, Value};
use strata::util::SplitMix64;
use strata::{Config, Database};

/// Fact rows: (id, k: dimension key or NULL, j: second key or NULL, v, s).
type Fact = (i64, Option<i64>, Option<i64>, Option<f64>, String);
/// Dimension rows: (k or NULL, group, weight).
type Dim = (Option<i64>, String, i64);

fn facts(n: usize, r: &mut SplitMix64) -> Vec<Fact> {
    (0..n)
        .map(|i| {
            // Skewed keys: a third of the rows have key 0.
            let k = match r.below(12) {
                0 => None,
                1..=4 => Some(0),
                _ => Some(r.below(400) as i64),
            };
            let j = (r.below(9) != 0).then(|| r.below(50) as i64);
            let v = (r.below(10) != 0).then(|| (r.below(10_000) as f64) / 16.0 - 100.0);
            let s = "x".repeat(r.below(20) as usize);
            (i as i64, k, j, v, s)
        })
        .collect()
}

/// Dimension rows over keys `0..keys` (some missing, some twice, one NULL).
fn dims(keys: i64, r: &mut SplitMix64) -> Vec<Dim> {
    let mut out = Vec::new();
    for k in 0..keys {
        let copies = match r.below(10) {
            0 => 0,
            1 => 2,
            _ => 1,
        };
        for _ in 0..copies {
            out.push((Some(k), format!("g{}", r.below(6)), r.below(100) as i64));
        }
    }
    out.push((None, "gnull".into(), 7));
    out
}

fn open(dir: &std::path::Path, pool: u64, f: &[Fact], d: &[Dim], e: &[Dim]) -> Database {
    let db = Database::create(Config::new(dir).pool_size(pool).min_page(4096)).unwrap();
    let t = db.create_table("f", Schema::parse("id:i64,k:i64,j:i64,v:f64,s:str").unwrap()).unwrap();
    for chunk in f.chunks(2000) {
        let mut tx = db.begin();
        let rows: Vec<Vec<Value>> = chunk
            .iter()
            .map(|(id, k, j, v, s)| {
                vec![
                    Value::I64(*id),
                    k.map_or(Value::Null, Value::I64),
                    j.map_or(Value::Null, Value::I64),
                    v.map_or(Value::Null, Value::F64),
                    Value::Str(s.clone()),
                ]
            })
            .collect();
        t.append(&mut tx, &rows).unwrap();
        tx.commit().unwrap();
    }
    for (name, rows) in [("d", d), ("e", e)] {
        let t = db.create_table(name, Schema::parse("k:i64,g:str,w:i64").unwrap()).unwrap();
        let mut tx = db.begin();
        let rows: Vec<Vec<Value>> = rows.iter().map(|(k, g, w)| vec![k.map_or(Value::Null, Value::I64), Value::Str(g.clone()), Value::I64(*w)]).collect();
        t.append(&mut tx, &rows).unwrap();
        tx.commit().unwrap();
    }
    db
}

fn with(db: &Database, sql: &str, threads: usize) -> Vec<Vec<Value>> {
    run_threads(db, sql, threads).unwrap_or_else(|e| panic!("{sql}: {e}"))
}

fn f64v(x: f64) -> Value {
    Value::F64(x)
}

/// The queries and their references computed from the rows.
fn cases(f: &[Fact], d: &[Dim], e: &[Dim]) -> Vec<(&'static str, Vec<Vec<Value>>)> {
    let dk: HashMap<i64, Vec<&Dim>> = d.iter().filter_map(|x| x.0.map(|k| (k, x))).fold(HashMap::new(), |mut m, (k, x)| {
        m.entry(k).or_default().push(x);
        m
    });
    let ek: HashMap<i64, Vec<&Dim>> = e.iter().filter_map(|x| x.0.map(|k| (k, x))).fold(HashMap::new(), |mut m, (k, x)| {
        m.entry(k).or_default().push(x);
        m
    });
    let matches = |k: Option<i64>| k.and_then(|k| dk.get(&k)).map_or(&[][..], |v| &v[..]);
    let mut out = Vec::new();

    // Inner join, whole-table aggregates.
    let (mut n, mut nv, mut sum, mut sw, mut mn, mut mx) = (0i64, 0i64, 0.0, 0i64, f64::INFINITY, f64::NEG_INFINITY);
    for x in f {
        for dm in matches(x.1) {
            n += 1;
            sw += dm.2;
            if let Some(v) = x.3 {
                nv += 1;
                sum += v;
                mn = mn.min(v);
                mx = mx.max(v);
            }
        }
    }
    out.push((
        "SELECT count(*), count(v), sum(v), sum(w), min(v), max(v) FROM f, d WHERE f.k = d.k",
        vec![vec![Value::I64(n), Value::I64(nv), f64v(sum), Value::I64(sw), f64v(mn), f64v(mx)]],
    ));

    // Inner join grouped by a build column, with a filter on the probe side and an
    // expression argument.
    let mut g: std::collections::BTreeMap<String, (i64, f64)> = Default::default();
    for x in f.iter().filter(|x| x.0 % 3 != 0) {
        for dm in matches(x.1) {
            let e = g.entry(dm.1.clone()).or_default();
            e.0 += 1;
            if let Some(v) = x.3 {
                e.1 += v * 2.0 + dm.2 as f64;
            }
        }
    }
    out.push((
        "SELECT g, count(*), sum(v * 2 + w) FROM f JOIN d ON f.k = d.k WHERE f.id % 3 <> 0 GROUP BY g ORDER BY g",
        g.into_iter().map(|(k, (c, s))| vec![Value::Str(k), Value::I64(c), f64v(s)]).collect(),
    ));

    // LEFT join: unmatched probe rows padded (count(w) skips them), grouped by a probe
    // column.
    let mut g: std::collections::BTreeMap<i64, (i64, i64, i64)> = Default::default();
    for x in f {
        let Some(j) = x.2 else { continue };
        let e = g.entry(j).or_default();
        let m = matches(x.1);
        if m.is_empty() {
            e.0 += 1;
        }
        for dm in m {
            e.0 += 1;
            e.1 += 1;
            e.2 += dm.2;
        }
    }
    out.push((
        "SELECT j, count(*), count(w), sum(w) FROM f LEFT JOIN d ON f.k = d.k WHERE j IS NOT NULL GROUP BY j ORDER BY j",
        g.into_iter().map(|(j, (c, cw, sw))| vec![Value::I64(j), Value::I64(c), Value::I64(cw), if cw == 0 { Value::Null } else { Value::I64(sw) }]).collect(),
    ));

    // A chain of two joins (f -> d on k, f -> e on j), grouped by both build sides'
    // columns, with a projection between (a derived table).
    let mut g: std::collections::BTreeMap<(String, String), (i64, i64)> = Default::default();
    for x in f {
        let es = x.2.and_then(|j| ek.get(&j)).map_or(&[][..], |v| &v[..]);
        for dm in matches(x.1) {
            for em in es {
                let e = g.entry((dm.1.clone(), em.1.clone())).or_default();
                e.0 += 1;
                e.1 += dm.2 * em.2;
            }
        }
    }
    out.push((
        "SELECT dg, eg, count(*), sum(p) FROM (SELECT d.g AS dg, e.g AS eg, d.w * e.w AS p FROM f, d, e WHERE f.k = d.k AND f.j = e.k) AS t GROUP BY dg, eg ORDER BY dg, eg",
        g.into_iter().map(|((a, b), (c, s))| vec![Value::Str(a), Value::Str(b), Value::I64(c), Value::I64(s)]).collect(),
    ));

    // Semi join (IN) and anti join (NOT IN, the subquery without NULLs) over the probe.
    let in_e: std::collections::HashSet<i64> = e.iter().filter(|x| x.2 < 50).filter_map(|x| x.0).collect();
    let (mut si, mut ai) = (0i64, 0i64);
    for x in f {
        match x.2 {
            Some(j) if in_e.contains(&j) => si += 1,
            Some(_) => ai += 1,
            None => {}
        }
    }
    out.push(("SELECT count(*) FROM f WHERE j IN (SELECT k FROM e WHERE w < 50)", vec![vec![Value::I64(si)]]));
    out.push(("SELECT count(*) FROM f WHERE j NOT IN (SELECT k FROM e WHERE w < 50 AND k IS NOT NULL)", vec![vec![Value::I64(ai)]]));
    out
}

/// Every query on 1, 2, 3 and 8 workers equals its reference; with several workers the
/// pipelines ran in parallel.
#[test]
fn parallel_join_pipelines_match_the_reference() {
    let mut r = SplitMix64(11);
    let f = facts(30_000, &mut r);
    let (d, e) = (dims(400, &mut r), dims(50, &mut r));
    let dir = tempfile::tempdir().unwrap();
    let db = open(dir.path(), 16 << 20, &f, &d, &e);
    for (sql, want) in cases(&f, &d, &e) {
        for threads in [1, 2, 3, 8] {
            let (aggs, _) = parallel_here();
            let got = with(&db, sql, threads);
            assert_rows(&format!("{sql} ({threads} threads)"), &got, &want);
            // The aggregation's pipeline (the probes of the joins) ran on several workers.
            assert_eq!(parallel_here().0, aggs + u64::from(threads > 1), "{sql}: {threads} threads");
        }
    }
    // A join whose build side is itself a join pipeline builds on the workers too.
    let builds = parallel_here().1;
    with(&db, "SELECT count(*) FROM f JOIN (SELECT e.k AS ek FROM f AS g JOIN e ON g.j = e.k WHERE g.id < 40) AS t ON f.j = t.ek", 3);
    assert!(parallel_here().1 > builds, "no build ran on several workers");
}

/// In a 1 MiB pool the dimension tables are too large for a join table (an eighth of the
/// pool): the joins partition (grace), the pipelines go back to one thread, and the
/// results stay those of the reference; a tiny pool with small tables runs in parallel
/// and spills its partial aggregations.
#[test]
fn parallel_pipelines_in_a_tiny_pool() {
    let mut r = SplitMix64(12);
    let f = facts(20_000, &mut r);
    let (d, e) = (dims(6000, &mut r), dims(50, &mut r));
    let dir = tempfile::tempdir().unwrap();
    let db = open(dir.path(), 1 << 20, &f, &d, &e);
    let fallbacks = strata::sql::pipeline::FALLBACKS.load(Relaxed);
    for (sql, want) in cases(&f, &d, &e) {
        for threads in [1, 3] {
            assert_rows(&format!("{sql} ({threads} threads)"), &with(&db, sql, threads), &want);
        }
    }
    assert!(strata::sql::pipeline::FALLBACKS.load(Relaxed) > fallbacks, "no pipeline met a grace join");
    // Many groups from a small join in a 1 MiB pool: each worker's hash aggregation spills.
    let sql = "SELECT f.id, count(*), sum(w) FROM f JOIN e ON f.j = e.k GROUP BY f.id ORDER BY f.id";
    let ek: HashMap<i64, Vec<i64>> = e.iter().filter_map(|x| x.0.map(|k| (k, x.2))).fold(HashMap::new(), |mut m, (k, w)| {
        m.entry(k).or_default().push(w);
        m
    });
    let want: Vec<Vec<Value>> = f
        .iter()
        .filter_map(|x| {
            let ws = ek.get(&x.2?)?;
            Some(vec![Value::I64(x.0), Value::I64(ws.len() as i64), Value::I64(ws.iter().sum())])
        })
        .collect();
    let (aggs, _) = parallel_here();
    assert_rows(sql, &with(&db, sql, 3), &want);
    assert_eq!(parallel_here().0, aggs + 1);
}

/// An error raised in a worker other than the calling thread's (a division by zero in an
/// aggregate's argument above a join, on the table's last row only: the last morsel, dealt
/// to worker 3 of 4) is the query's error, and the prepared query runs again afterwards
/// (no join filter left installed in the scan).
#[test]
fn an_error_in_a_worker_is_the_querys_error() {
    let mut r = SplitMix64(13);
    let mut f = facts(16_000, &mut r);
    let (d, e) = (dims(400, &mut r), dims(50, &mut r));
    // The last row joins (the first dimension row's key).
    f.last_mut().unwrap().1 = d[0].0;
    let dir = tempfile::tempdir().unwrap();
    let db = open(dir.path(), 8 << 20, &f, &d, &e);
    let last = f.len() - 1;
    let sql = format!("SELECT sum(100 / (f.id - {last})) FROM f, d WHERE f.k = d.k");
    let mut p = strata::sql::prepare_in(&db.catalog(), Some(db.buffer()), &sql).unwrap();
    p.set_threads(4);
    let (aggs, _) = parallel_here();
    let err = p.execute(db.buffer(), &mut |_| Ok(true)).unwrap_err().to_string();
    assert!(err.contains("division by zero"), "{err}");
    assert_eq!(parallel_here().0, aggs, "an aggregation that failed is not counted");
    let fine = "SELECT count(*) FROM f, d WHERE f.k = d.k";
    assert_eq!(with(&db, fine, 4), with(&db, fine, 1));
}

/// The same queries on one thread and on 2, 3 and 8 workers (rows compared as sets; a
/// second run with as many workers gives the same rows bit for bit): NOT IN with and
/// without a NULL in the subquery and with an empty one, EXISTS / NOT EXISTS, LEFT joins
/// whose build side is a parallel join pipeline, self-joins, computed join keys, filters
/// the scan evaluates row by row, literal projections, chains of semi joins (queries from
/// the review of the parallel pipelines).
#[test]
fn serial_and_parallel_runs_agree() {
    let mut r = SplitMix64(11);
    let f = facts(30_000, &mut r);
    let (d, e) = (dims(400, &mut r), dims(50, &mut r));
    let dir = tempfile::tempdir().unwrap();
    let db = open(dir.path(), 16 << 20, &f, &d, &e);
    let unordered = |mut v: Vec<Vec<Value>>| {
        v.sort_by_key(|r| format!("{r:?}"));
        v
    };
    for sql in [
        "SELECT count(*) FROM f WHERE j NOT IN (SELECT k FROM e)",
        "SELECT count(*) FROM f WHERE j NOT IN (SELECT k FROM e WHERE w < 0)",
        "SELECT count(*) FROM f WHERE NOT EXISTS (SELECT 1 FROM e WHERE e.k = f.j)",
        "SELECT count(*) FROM f WHERE EXISTS (SELECT 1 FROM e WHERE e.k = f.j)",
        "SELECT count(*) FROM d WHERE k NOT IN (SELECT k FROM f)",
        "SELECT count(*) FROM d WHERE k NOT IN (SELECT k FROM f WHERE k IS NOT NULL)",
        "SELECT count(*), count(b.id), sum(b.v) FROM d LEFT JOIN f b ON d.w = b.id",
        "SELECT count(*), count(b.id), sum(b.v) FROM f a LEFT JOIN f b ON a.j = b.id",
        "SELECT count(*), sum(a.v), sum(b.v) FROM f a JOIN f b ON a.id = b.id WHERE b.id % 5 = 0",
        "SELECT count(*), count(t.j) FROM e LEFT JOIN (SELECT f.j AS j FROM f JOIN d ON f.k = d.k) t ON e.k = t.j",
        "SELECT sum(x), sum(w), count(*) FROM (SELECT 1 AS x, d.w AS w FROM f JOIN d ON f.k = d.k) t",
        "SELECT g, sum(v), count(*) FROM f JOIN d ON f.k + 0 = d.k GROUP BY g ORDER BY g",
        "SELECT g, sum(v), count(*) FROM f JOIN d ON f.k = d.k WHERE f.s LIKE 'xx%' GROUP BY g ORDER BY g",
        "SELECT d.g, e.g, count(*), sum(v) FROM f LEFT JOIN d ON f.k = d.k JOIN e ON f.j = e.k GROUP BY d.g, e.g ORDER BY 1, 2",
        "SELECT count(*) FROM f WHERE j IN (SELECT k FROM e) AND k IN (SELECT k FROM d)",
        "SELECT s, count(*) FROM f JOIN d ON f.k = d.k GROUP BY s ORDER BY s",
        "SELECT j, count(DISTINCT g), sum(v) FROM f JOIN d ON f.k = d.k GROUP BY j ORDER BY j",
    ] {
        let one = unordered(with(&db, sql, 1));
        for threads in [2, 3, 8] {
            let got = with(&db, sql, threads);
            assert_rows(&format!("{sql} ({threads} threads)"), &unordered(got.clone()), &one);
            assert_eq!(format!("{got:?}"), format!("{:?}", with(&db, sql, threads)), "{sql}: two runs on {threads} workers differ");
        }
    }
}

/// A grouped aggregation whose every worker sees (nearly) every key merges the workers'
/// partial aggregations partition by partition on several threads
/// (`strata::sql::merge`): the groups equal a reference computed here, for integer keys
/// (vectorized, and streamed runs that are proven distinct or not), string keys longer
/// than 255 bytes and computed keys (the row pipeline), in a pool where nothing spills
/// and in a 1 MiB pool where the partitions do; a second run with as many workers gives
/// the same f64 sums bit for bit.
#[test]
fn partial_aggregations_merge_by_partition_on_several_threads() {
    use std::collections::BTreeMap;
    const N: i64 = 30_000;
    let mut r = SplitMix64(31);
    // (k: every morsel sees every key, o: sorted, p: sorted within 2500 rows, s, v)
    let rows: Vec<(i64, i64, i64, String, f64)> = (0..N)
        .map(|i| {
            let k = i % 3001;
            let s = format!("{k:05}{}", "x".repeat((k % 7) as usize * 90));
            (k, i / 7, i % 2500, s, r.below(1_000_000) as f64 / 64.0 - 7000.0)
        })
        .collect();
    type Groups<K> = BTreeMap<K, (i64, f64)>;
    fn group<K: Ord>(rows: impl Iterator<Item = (K, f64)>) -> Groups<K> {
        let mut m: Groups<K> = BTreeMap::new();
        for (k, v) in rows {
            let e = m.entry(k).or_insert((0, 0.0));
            e.0 += 1;
            e.1 += v;
        }
        m
    }
    let ints = |m: Groups<i64>| -> Vec<Vec<Value>> { m.into_iter().map(|(k, (c, s))| vec![Value::I64(k), Value::I64(c), Value::F64(s)]).collect() };
    let cases: Vec<(&str, Vec<Vec<Value>>)> = vec![
        ("SELECT k, count(*), sum(v) FROM g GROUP BY k ORDER BY k", ints(group(rows.iter().map(|x| (x.0, x.4))))),
        ("SELECT o, count(*), sum(v) FROM g GROUP BY o ORDER BY o", ints(group(rows.iter().map(|x| (x.1, x.4))))),
        ("SELECT p, count(*), sum(v) FROM g GROUP BY p ORDER BY p", ints(group(rows.iter().map(|x| (x.2, x.4))))),
        ("SELECT k % 101, count(*), sum(v) FROM g WHERE k % 5 <> 1 GROUP BY k % 101 ORDER BY 1", {
            ints(group(rows.iter().filter(|x| x.0 % 5 != 1).map(|x| (x.0 % 101, x.4))))
        }),
        (
            "SELECT s, count(*), sum(v) FROM g GROUP BY s ORDER BY s",
            group(rows.iter().map(|x| (x.3.clone(), x.4))).into_iter().map(|(k, (c, s))| vec![Value::Str(k), Value::I64(c), Value::F64(s)]).collect(),
        ),
    ];
    assert!(rows.iter().any(|x| x.3.len() > 500), "no key longer than 255 bytes");
    for pool in [64 << 20, 1 << 20] {
        let dir = tempfile::tempdir().unwrap();
        let db = Database::create(Config::new(dir.path()).pool_size(pool).min_page(4096)).unwrap();
        let t = db.create_table("g", Schema::parse("k:i64,o:i64,p:i64,s:str,v:f64").unwrap()).unwrap();
        for chunk in rows.chunks(3000) {
            let mut tx = db.begin();
            let vals: Vec<Vec<Value>> =
                chunk.iter().map(|(k, o, p, s, v)| vec![Value::I64(*k), Value::I64(*o), Value::I64(*p), Value::Str(s.clone()), Value::F64(*v)]).collect();
            t.append(&mut tx, &vals).unwrap();
            tx.commit().unwrap();
        }
        for (sql, want) in &cases {
            for threads in [1, 2, 3, 8] {
                let merges = strata::sql::merge::merges_here();
                let got = with(&db, sql, threads);
                assert_rows(&format!("{sql} ({threads} threads, pool {pool})"), &got, want);
                let merged = strata::sql::merge::merges_here() - merges;
                assert_eq!(merged, u64::from(threads > 1), "{sql} ({threads} threads, pool {pool}): merges by partition");
                if threads > 1 {
                    let again = with(&db, sql, threads);
                    let bits = |rows: &[Vec<Value>]| -> Vec<u64> {
                        rows.iter().map(|r| if let Value::F64(f) = r[2] { f.to_bits() } else { panic!("{r:?}") }).collect()
                    };
                    assert_eq!(bits(&got), bits(&again), "{sql} ({threads} threads, pool {pool}): sums differ between runs");
                }
            }
        }
    }
}

/// Grace joins inside parallel pipelines: a build side too large for a join table (a 1 MiB
/// pool) no longer sends the pipeline back to one thread for inner joins and semi joins that
/// build on their right: the pairs are joined on the workers (`pipeline::grace_here`), with
/// the stages above (a small join, filters, the aggregation) on each worker. The results
/// equal a reference computed here on 1, 2, 3 and 8 workers; a second run with as many
/// workers gives the same sums bit for bit; a LEFT join's grace join still runs on one
/// thread, with the reference's result.
#[test]
fn grace_joins_join_their_pairs_on_the_workers() {
    use std::collections::{BTreeMap, HashSet};
    let mut r = SplitMix64(77);
    const KEYS: i64 = 20_000;
    // f: (id, k or NULL, v); d: (k or NULL, name, w), keys missing, twice, one NULL.
    let f: Vec<(i64, Option<i64>, f64)> =
        (0..60_000).map(|i| (i, (r.below(15) != 0).then(|| r.below(KEYS as u64 + 500) as i64), r.below(100_000) as f64 / 8.0)).collect();
    let mut d: Vec<Dim> = Vec::new();
    for k in 0..KEYS {
        for _ in 0..[0, 2, 1, 1, 1, 1, 1][r.below(7) as usize] {
            d.push((Some(k), format!("name-{k:06}-{}", "y".repeat(r.below(30) as usize)), r.below(1000) as i64));
        }
    }
    d.push((None, "nameless".into(), 4));
    let e: Vec<(i64, String)> = (0..10).map(|k| (k, format!("e{}", k % 4))).collect();

    let dk: HashMap<i64, Vec<&Dim>> = d.iter().filter_map(|x| x.0.map(|k| (k, x))).fold(HashMap::new(), |mut m, (k, x)| {
        m.entry(k).or_default().push(x);
        m
    });
    let matches = |k: Option<i64>| k.and_then(|k| dk.get(&k)).map_or(&[][..], |v| &v[..]);
    // (a) inner, grouped by a build-side expression.
    let mut a: BTreeMap<i64, (i64, f64, String)> = BTreeMap::new();
    for x in &f {
        for dm in matches(x.1) {
            let g = a.entry(dm.2 % 7).or_insert((0, 0.0, dm.1.clone()));
            g.0 += 1;
            g.1 += x.2;
            g.2 = g.2.clone().min(dm.1.clone());
        }
    }
    let a: Vec<Vec<Value>> = a.into_iter().map(|(k, (n, s, m))| vec![Value::I64(k), Value::I64(n), f64v(s), Value::Str(m)]).collect();
    // (b) semi join on the subquery's keys.
    let even: HashSet<i64> = d.iter().filter(|x| x.2 % 2 == 0).filter_map(|x| x.0).collect();
    let (bn, bs) = f.iter().filter(|x| x.1.is_some_and(|k| even.contains(&k))).fold((0i64, 0.0), |(n, s), x| (n + 1, s + x.2));
    let b = vec![vec![Value::I64(bn), f64v(bs)]];
    // (c) the grace join below a small join and a filter.
    let mut c: BTreeMap<String, (i64, f64)> = BTreeMap::new();
    for x in f.iter().filter(|x| x.0 % 4 != 1) {
        for dm in matches(x.1) {
            let g = c.entry(e[(dm.2 % 10) as usize].1.clone()).or_default();
            g.0 += 1;
            g.1 += x.2;
        }
    }
    let c: Vec<Vec<Value>> = c.into_iter().map(|(k, (n, s))| vec![Value::Str(k), Value::I64(n), f64v(s)]).collect();
    // (d) a LEFT join (its grace join stays on one thread).
    let dn: i64 = f.iter().map(|x| matches(x.1).len().max(1) as i64).sum();
    let dw: i64 = f.iter().flat_map(|x| matches(x.1)).map(|dm| dm.2).sum();
    let dd = vec![vec![Value::I64(dn), Value::I64(dw)]];
    let cases: Vec<(&str, Vec<Vec<Value>>, bool)> = vec![
        ("SELECT d.w % 7, count(*), sum(f.v), min(d.name) FROM f JOIN d ON f.k = d.k GROUP BY d.w % 7 ORDER BY 1", a, true),
        ("SELECT count(*), sum(v) FROM f WHERE k IN (SELECT k FROM d WHERE w % 2 = 0)", b, true),
        ("SELECT e.g, count(*), sum(f.v) FROM f JOIN d ON f.k = d.k JOIN e ON d.w % 10 = e.k WHERE f.id % 4 <> 1 GROUP BY e.g ORDER BY 1", c, true),
        ("SELECT count(*), sum(d.w) FROM f LEFT JOIN d ON f.k = d.k", dd, false),
    ];

    let dir = tempfile::tempdir().unwrap();
    let db = Database::create(Config::new(dir.path()).pool_size(1 << 20).min_page(4096)).unwrap();
    let tf = db.create_table("f", Schema::parse("id:i64,k:i64,v:f64").unwrap()).unwrap();
    for chunk in f.chunks(5000) {
        let mut tx = db.begin();
        let rows: Vec<Vec<Value>> = chunk.iter().map(|x| vec![Value::I64(x.0), x.1.map_or(Value::Null, Value::I64), Value::F64(x.2)]).collect();
        tf.append(&mut tx, &rows).unwrap();
        tx.commit().unwrap();
    }
    let td = db.create_table("d", Schema::parse("k:i64,name:str,w:i64").unwrap()).unwrap();
    for chunk in d.chunks(5000) {
        let mut tx = db.begin();
        let rows: Vec<Vec<Value>> = chunk.iter().map(|x| vec![x.0.map_or(Value::Null, Value::I64), Value::Str(x.1.clone()), Value::I64(x.2)]).collect();
        td.append(&mut tx, &rows).unwrap();
        tx.commit().unwrap();
    }
    let te = db.create_table("e", Schema::parse("k:i64,g:str").unwrap()).unwrap();
    let mut tx = db.begin();
    te.append(&mut tx, &e.iter().map(|x| vec![Value::I64(x.0), Value::Str(x.1.clone())]).collect::<Vec<_>>()).unwrap();
    tx.commit().unwrap();

    for (sql, want, parallel) in &cases {
        for threads in [1, 2, 3, 8] {
            let (grace, graces) = (strata::sql::pipeline::grace_here(), strata::sql::spill_counters().grace_joins);
            let got = with(&db, sql, threads);
            assert_rows(&format!("{sql} ({threads} threads)"), &got, want);
            assert!(strata::sql::spill_counters().grace_joins > graces, "{sql}: no grace join");
            let on_workers = strata::sql::pipeline::grace_here() - grace;
            assert_eq!(on_workers, u64::from(*parallel && threads > 1), "{sql} ({threads} threads): grace joins on several workers");
            if threads > 1 {
                assert_eq!(format!("{got:?}"), format!("{:?}", with(&db, sql, threads)), "{sql} ({threads} threads): runs differ");
            }
        }
    }
}

/// Semi joins and NOT EXISTS that build on their left side (the smaller) and mark the left
/// rows that probe rows match: the probe side runs on the workers, each marking in its own
/// bits (`pipeline::marks_here`), and the marked (or unmarked) left rows are the result.
/// Grouped by a left column, so that a row marked in the place of another shows; with a
/// residual that reads both sides; NULL keys on both sides; 1, 2, 3 and 8 workers against a
/// reference computed here.
#[test]
fn marking_joins_probe_on_the_workers() {
    use std::collections::BTreeMap;
    let mut r = SplitMix64(91);
    // d: (k or NULL, g, w), some keys twice; f: (k or NULL, v).
    let mut d: Vec<Dim> = (0..3000)
        .flat_map(|k| {
            let n = if k % 11 == 0 { 2 } else { 1 };
            (0..n).map(move |i| (Some(k), format!("g{}", (k * 7 + i) % 13), (k * 31 + i) % 100))
        })
        .collect();
    d.push((None, "gnull".into(), 5));
    let f: Vec<Fact2> = (0..50_000).map(|_| ((r.below(20) != 0).then(|| r.below(4500) as i64), r.below(100) as i64)).collect();
    let group = |keep: &dyn Fn(&Dim) -> bool| -> Vec<Vec<Value>> {
        let mut m: BTreeMap<String, (i64, i64)> = BTreeMap::new();
        for x in d.iter().filter(|x| keep(x)) {
            let e = m.entry(x.1.clone()).or_default();
            e.0 += 1;
            e.1 += x.2;
        }
        m.into_iter().map(|(g, (n, w))| vec![Value::Str(g), Value::I64(n), Value::I64(w)]).collect()
    };
    type Fact2 = (Option<i64>, i64);
    let any = |x: &Dim, pred: &dyn Fn(&Fact2) -> bool| x.0.is_some_and(|k| f.iter().any(|y| y.0 == Some(k) && pred(y)));
    let cases: Vec<(&str, Vec<Vec<Value>>)> = vec![
        ("SELECT g, count(*), sum(w) FROM d WHERE EXISTS (SELECT 1 FROM f WHERE f.k = d.k) GROUP BY g ORDER BY g", group(&|x| any(x, &|_| true))),
        ("SELECT g, count(*), sum(w) FROM d WHERE NOT EXISTS (SELECT 1 FROM f WHERE f.k = d.k) GROUP BY g ORDER BY g", group(&|x| !any(x, &|_| true))),
        (
            "SELECT g, count(*), sum(w) FROM d WHERE EXISTS (SELECT 1 FROM f WHERE f.k = d.k AND f.v > d.w + 40) GROUP BY g ORDER BY g",
            group(&|x| any(x, &|y| y.1 > x.2 + 40)),
        ),
        (
            "SELECT g, count(*), sum(w) FROM d WHERE NOT EXISTS (SELECT 1 FROM f WHERE f.k = d.k AND f.v < d.w) GROUP BY g ORDER BY g",
            group(&|x| !any(x, &|y| y.1 < x.2)),
        ),
        ("SELECT g, count(*), sum(w) FROM d WHERE k IN (SELECT k FROM f WHERE v >= 20) GROUP BY g ORDER BY g", group(&|x| any(x, &|y| y.1 >= 20))),
    ];
    let dir = tempfile::tempdir().unwrap();
    let db = Database::create(Config::new(dir.path()).pool_size(16 << 20).min_page(4096)).unwrap();
    let td = db.create_table("d", Schema::parse("k:i64,g:str,w:i64").unwrap()).unwrap();
    let mut tx = db.begin();
    td.append(&mut tx, &d.iter().map(|x| vec![x.0.map_or(Value::Null, Value::I64), Value::Str(x.1.clone()), Value::I64(x.2)]).collect::<Vec<_>>()).unwrap();
    tx.commit().unwrap();
    let tf = db.create_table("f", Schema::parse("k:i64,v:i64").unwrap()).unwrap();
    for chunk in f.chunks(10_000) {
        let mut tx = db.begin();
        tf.append(&mut tx, &chunk.iter().map(|x| vec![x.0.map_or(Value::Null, Value::I64), Value::I64(x.1)]).collect::<Vec<_>>()).unwrap();
        tx.commit().unwrap();
    }
    for (sql, want) in &cases {
        for threads in [1, 2, 3, 8] {
            let marks = strata::sql::pipeline::marks_here();
            assert_rows(&format!("{sql} ({threads} threads)"), &with(&db, sql, threads), want);
            assert_eq!(strata::sql::pipeline::marks_here() - marks, u64::from(threads > 1), "{sql} ({threads} threads): marks on several workers");
        }
    }
}
