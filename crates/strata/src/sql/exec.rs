//! Plans and their execution: push-based pipelines (a scan hands each row to the operators
//! above it, which hand theirs to the caller's sink), so every plan of this slice runs in
//! constant memory: one row at a time, the aggregates' fixed-size states, no buffered
//! results. A sink that returns `false` stops the scan (`LIMIT`).

use std::fmt::Write as _;

use super::agg::{encode_states, finish_states_into, AggKind, HashAgg, St};
use super::expr::{BExpr, Pos};
use super::join::{JoinArgs, JoinKind};
use super::rows::{assign, corrupt, decode_row, decode_row_into, encode_row, encode_sort_key, encode_value, hash_bytes};
use super::sample::sampled_share;
use super::sort::Sorter;
use super::vagg::GroupCache;
use crate::access::table::{ColumnType, Table, Value};
use crate::buffer::BufferManager;
use crate::error::{Error, Result};

/// Where rows go: `Ok(false)` asks the producer to stop.
pub type Sink<'a> = dyn FnMut(&[Value]) -> Result<bool> + 'a;

/// An aggregate function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AggFunc {
    CountStar,
    Count,
    Sum,
    Avg,
    Min,
    Max,
}

/// One aggregate of an aggregation: its function, argument (none for `count(*)`), the type
/// of the argument and where it is in the query.
#[derive(Clone, Debug)]
pub struct AggSpec {
    pub func: AggFunc,
    pub arg: Option<BExpr>,
    pub arg_ty: Option<ColumnType>,
    pub pos: Pos,
    pub label: String,
    /// `agg(DISTINCT x)`: duplicates of the argument (within a group) count once.
    pub distinct: bool,
}

/// One `ORDER BY` key: a column of the input, descending?, NULLs first?
#[derive(Clone, Copy, Debug)]
pub struct SortKey {
    pub col: usize,
    pub desc: bool,
    pub nulls_first: bool,
}

/// A query plan.
#[derive(Clone, Debug)]
pub enum Plan {
    /// Every row of a table, with the rows that fail `filter` dropped in the scan.
    Scan { name: String, table: Table, filter: Option<BExpr> },
    /// A table scan that decodes only the columns used above it and filters leaf by leaf
    /// (what [`super::scan::optimize`] makes of every `Scan`; see [`super::scan`]).
    ColScan(Box<super::scan::ColScan>),
    /// One row of no columns (`SELECT` without `FROM`), if `filter` holds.
    OneRow { filter: Option<BExpr> },
    /// Expressions over the input's rows.
    Project { input: Box<Plan>, exprs: Vec<BExpr> },
    /// Rows for which `pred` is true.
    Filter { input: Box<Plan>, pred: BExpr },
    /// One row of aggregates over all of the input (no GROUP BY): constant state.
    Aggregate { input: Box<Plan>, aggs: Vec<AggSpec> },
    /// `GROUP BY` (and `DISTINCT`, and aggregates with `DISTINCT`): rows of the key values
    /// followed by the aggregates, by hash aggregation in temporary pages (see
    /// [`super::agg`]). With no keys, one row even for no input.
    HashAggregate { input: Box<Plan>, keys: Vec<BExpr>, aggs: Vec<AggSpec> },
    /// `ORDER BY`: the input's rows sorted by `keys` (an external sort in temporary pages,
    /// see [`super::sort`]; a top-k heap when only the first `top` rows are wanted and they
    /// are few).
    Sort { input: Box<Plan>, keys: Vec<SortKey>, top: Option<u64> },
    /// An equi-join by hash (see [`super::join`]): rows of the left's columns then the
    /// right's (semi and anti joins: the left's only).
    /// `keep`: per column of the left rows then the right ones, whether it is read above
    /// the join or by the residual (set by [`super::scan::prune`]; empty: all are).
    HashJoin {
        left: Box<Plan>,
        right: Box<Plan>,
        kind: JoinKind,
        left_keys: Vec<BExpr>,
        right_keys: Vec<BExpr>,
        residual: Option<BExpr>,
        right_width: usize,
        keep: Vec<bool>,
    },
    /// The input if `sub` has a row (`EXISTS`), or if it has none (`negated`).
    Exists { input: Box<Plan>, sub: Box<Plan>, negated: bool },
    /// Skips `offset` rows, then passes at most `limit`.
    Limit { input: Box<Plan>, limit: Option<u64>, offset: u64 },
    /// Runs the uncorrelated subqueries whose values the expressions of `input` read
    /// (see [`super::subquery`]), then `input`.
    Scalars { subs: Vec<super::subquery::ScalarSub>, input: Box<Plan> },
}

fn holds(pred: &BExpr, row: &[Value]) -> Result<bool> {
    pred.holds(row)
}

impl Plan {
    /// The plans whose rows this one reads (subqueries' plans included).
    pub fn inputs_mut(&mut self) -> Vec<&mut Plan> {
        match self {
            Plan::Scan { .. } | Plan::ColScan(_) | Plan::OneRow { .. } => Vec::new(),
            Plan::Project { input, .. }
            | Plan::Filter { input, .. }
            | Plan::Aggregate { input, .. }
            | Plan::HashAggregate { input, .. }
            | Plan::Sort { input, .. }
            | Plan::Limit { input, .. } => vec![&mut **input],
            Plan::Exists { input, sub, .. } => vec![&mut **input, &mut **sub],
            Plan::Scalars { subs, input } => subs.iter_mut().map(|s| &mut s.plan).chain(std::iter::once(&mut **input)).collect(),
            Plan::HashJoin { left, right, .. } => vec![&mut **left, &mut **right],
        }
    }

    /// A hash join's description, if this is one.
    pub fn join_args(&self) -> Option<JoinArgs<'_>> {
        match self {
            Plan::HashJoin { left, right, kind, left_keys, right_keys, residual, right_width, keep } => {
                Some(JoinArgs { left, right, kind: *kind, left_keys, right_keys, residual: residual.as_ref(), right_width: *right_width, keep })
            }
            _ => None,
        }
    }

    /// Runs the plan, handing every result row to `sink`; returns `false` if the sink asked
    /// to stop.
    pub fn run(&self, bm: &BufferManager, sink: &mut Sink<'_>) -> Result<bool> {
        match self {
            Plan::Scan { table, filter, .. } => {
                let mut failed: Option<Error> = None;
                let mut go = true;
                table.scan(bm, 0, &mut |_, row| {
                    let r = match filter {
                        Some(f) => holds(f, row).and_then(|ok| if ok { sink(row) } else { Ok(true) }),
                        None => sink(row),
                    };
                    match r {
                        Ok(true) => true,
                        Ok(false) => {
                            go = false;
                            false
                        }
                        Err(e) => {
                            failed = Some(e);
                            false
                        }
                    }
                })?;
                match failed {
                    Some(e) => Err(e),
                    None => Ok(go),
                }
            }
            Plan::ColScan(s) => s.run(bm, sink),
            Plan::OneRow { filter } => match filter {
                Some(f) if !holds(f, &[])? => Ok(true),
                _ => sink(&[]),
            },
            Plan::Project { input, exprs } => {
                let mut out = Projection::new(exprs);
                input.run(bm, &mut |row| sink(out.of(row)?))
            }
            Plan::Filter { input, pred } => input.run(bm, &mut |row| if holds(pred, row)? { sink(row) } else { Ok(true) }),
            Plan::Aggregate { input, aggs } => {
                // The same partial states as the grouped aggregation, with one group.
                let kinds: Vec<AggKind> = aggs.iter().map(|a| AggKind::of(a.func, a.arg_ty, a.pos, &a.label)).collect();
                let mut states: Vec<St> = kinds.iter().map(|k| St::empty(k.kind)).collect();
                let done =
                    super::vagg::fused_aggregate(bm, input, aggs, &kinds, &mut states)? || super::pipeline::aggregate(bm, input, aggs, &kinds, &mut states)?;
                if !done {
                    input.run(bm, &mut |row| {
                        agg_row(aggs, &kinds, &mut states, row)?;
                        Ok(true)
                    })?;
                }
                let row: Vec<Value> = states.into_iter().map(St::finish).collect();
                sink(&row)
            }
            Plan::HashAggregate { input, keys, aggs } => run_hash_aggregate(bm, input, keys, aggs, sink),
            Plan::HashJoin { .. } => super::join::run(bm, &self.join_args().ok_or_else(|| corrupt("join plan"))?, sink),
            Plan::Exists { input, sub, negated } => {
                let mut any = false;
                sub.run(bm, &mut |_| {
                    any = true;
                    Ok(false)
                })?;
                if any == *negated {
                    return Ok(true);
                }
                input.run(bm, sink)
            }
            Plan::Sort { input, keys, top } => {
                let mut sorter = Sorter::new(bm, *top);
                let (mut kb, mut rb) = (Vec::new(), Vec::new());
                input.run(bm, &mut |row| {
                    kb.clear();
                    for k in keys {
                        encode_sort_key(row.get(k.col).ok_or_else(|| corrupt("sort key column"))?, k.desc, k.nulls_first, &mut kb);
                    }
                    rb.clear();
                    encode_row(row, &mut rb);
                    sorter.push(&kb, &rb)?;
                    Ok(true)
                })?;
                sorter.finish(&mut |rb| sink(&decode_row(rb)?))
            }
            Plan::Scalars { subs, input } => super::subquery::run_scalars(bm, subs, input, sink),
            Plan::Limit { input, limit, offset } => {
                if *limit == Some(0) {
                    return Ok(true);
                }
                let (mut skipped, mut passed) = (0u64, 0u64);
                let mut done = false;
                let go = input.run(bm, &mut |row| {
                    if skipped < *offset {
                        skipped += 1;
                        return Ok(true);
                    }
                    passed += 1;
                    if !sink(row)? {
                        return Ok(false);
                    }
                    if Some(passed) == *limit {
                        done = true;
                        return Ok(false);
                    }
                    Ok(true)
                })?;
                Ok(go || done)
            }
        }
    }

    /// An estimate of the rows the plan produces, to order inner joins and choose a hash
    /// join's build side: see [`estimate`](Self::estimate).
    pub fn estimate_rows(&self, bm: &BufferManager) -> Result<u64> {
        let (rows, _) = self.estimate(bm)?;
        Ok(if rows.is_finite() { rows.ceil().max(0.0) as u64 } else { u64::MAX })
    }

    /// Estimated rows of the plan's output, and the row count of the largest table below
    /// it (for the join rule). A filtered scan: the table's rows times the share of a small
    /// sample of its rows that pass the filter (see [`sampled_share`](super::sample::sampled_share)); a filter above a
    /// scan: half its input; an inner equi-join: `left * right / min(left base, right
    /// base)` (a foreign key joined with the key of the smaller table, whose filtered share
    /// carries over), without keys the product; semi, anti and LEFT joins: the left; a
    /// grouping of a scan: the groups its sample shows ([`sampled_groups`](super::sample::sampled_groups)), at most its input; other
    /// groupings: their input.
    pub fn estimate(&self, bm: &BufferManager) -> Result<(f64, f64)> {
        Ok(match self {
            Plan::Scan { table, filter, .. } => scan_estimate(bm, table, filter.as_ref())?,
            Plan::ColScan(s) => scan_estimate(bm, &s.table, s.filter.as_ref())?,
            Plan::OneRow { .. } | Plan::Aggregate { .. } => (1.0, 1.0),
            Plan::HashAggregate { keys, input, .. } if !keys.is_empty() => {
                let (r, b) = input.estimate(bm)?;
                let table = match &**input {
                    Plan::Scan { table, .. } => Some(table),
                    Plan::ColScan(s) => Some(&s.table),
                    _ => None,
                };
                match table {
                    Some(t) => (super::sample::sampled_groups(bm, t, keys)?.min(r).max(1.0), b),
                    None => (r, b),
                }
            }
            Plan::HashAggregate { .. } => (1.0, 1.0),
            Plan::Filter { input, .. } => {
                let (r, b) = input.estimate(bm)?;
                ((r / 2.0).max(1.0), b)
            }
            Plan::Project { input, .. } | Plan::Sort { input, .. } | Plan::Exists { input, .. } | Plan::Scalars { input, .. } => input.estimate(bm)?,
            Plan::Limit { input, limit, .. } => {
                let (r, b) = input.estimate(bm)?;
                (r.min(limit.map_or(f64::INFINITY, |l| l as f64)), b)
            }
            Plan::HashJoin { left, right, kind, left_keys, .. } => match kind {
                JoinKind::Inner => join_estimate(left.estimate(bm)?, right.estimate(bm)?, !left_keys.is_empty()),
                _ => left.estimate(bm)?,
            },
        })
    }

    /// The plan as indented lines, the root first (`EXPLAIN`).
    pub fn explain(&self) -> String {
        let mut s = String::new();
        self.explain_into(&mut s, 0, None);
        s
    }

    /// [`explain`](Self::explain) with the row estimates of the tables in `bm`: each
    /// inner hash join says which side it builds on.
    pub fn explain_with(&self, bm: &BufferManager) -> String {
        let mut s = String::new();
        self.explain_into(&mut s, 0, Some(bm));
        s
    }

    pub(crate) fn explain_into(&self, s: &mut String, depth: usize, bm: Option<&BufferManager>) {
        let pad = "  ".repeat(depth);
        let list = |v: &mut dyn Iterator<Item = String>| v.collect::<Vec<_>>().join(", ");
        let input = match self {
            Plan::Scan { .. } | Plan::ColScan(_) => {
                let (name, filter) = match self {
                    Plan::ColScan(c) => (&c.name, &c.filter),
                    Plan::Scan { name, filter, .. } => (name, filter),
                    _ => unreachable!(),
                };
                let _ = write!(s, "{pad}Scan {name}");
                if let Some(f) = filter {
                    let _ = write!(s, " filter {f}");
                }
                s.push('\n');
                None
            }
            Plan::OneRow { filter } => {
                let _ = write!(s, "{pad}OneRow");
                if let Some(f) = filter {
                    let _ = write!(s, " filter {f}");
                }
                s.push('\n');
                None
            }
            Plan::Project { input, exprs } => {
                let _ = writeln!(s, "{pad}Project {}", list(&mut exprs.iter().map(|e| e.to_string())));
                Some(input)
            }
            Plan::Filter { input, pred } => {
                let _ = writeln!(s, "{pad}Filter {pred}");
                Some(input)
            }
            Plan::Aggregate { input, aggs } => {
                let _ = writeln!(s, "{pad}Aggregate (no groups, constant state) {}", list(&mut aggs.iter().map(|a| a.label.clone())));
                Some(input)
            }
            Plan::HashAggregate { input, keys, aggs } => {
                let what = if aggs.is_empty() && !keys.is_empty() { "HashDistinct" } else { "HashAggregate" };
                let _ = write!(s, "{pad}{what} (temp pages, spills by partition)");
                if !keys.is_empty() {
                    let _ = write!(s, " keys {}", list(&mut keys.iter().map(|e| e.to_string())));
                }
                if !aggs.is_empty() {
                    let _ = write!(s, " aggs {}", list(&mut aggs.iter().map(|a| a.label.clone())));
                }
                s.push('\n');
                Some(input)
            }
            Plan::HashJoin { left, right, kind, left_keys, right_keys, residual, keep, .. } => {
                let on = list(&mut left_keys.iter().zip(right_keys).map(|(l, r)| format!("{l} = {r}")));
                let est = |p: &Plan| bm.and_then(|bm| p.estimate_rows(bm).ok());
                let side = bm.and_then(|bm| super::join::build_side(bm, left, right, *kind, keep).ok());
                let either = matches!(kind, JoinKind::Inner | JoinKind::Semi | JoinKind::NotExists);
                let kib = |b: f64| (b / 1024.0).ceil() as u64;
                let build = match (either, est(left), est(right), side) {
                    (true, Some(l), Some(r), Some((true, lb, rb))) => format!("build: left, ~{l} rows vs ~{r}, ~{} KiB vs ~{} KiB", kib(lb), kib(rb)),
                    (true, Some(l), Some(r), Some((false, lb, rb))) => format!("build: right, ~{r} rows vs ~{l}, ~{} KiB vs ~{} KiB", kib(rb), kib(lb)),
                    (true, ..) => "build: the side whose records take fewer bytes".to_owned(),
                    _ => "build: right".to_owned(),
                };
                let _ = write!(
                    s,
                    "{pad}HashJoin {} on {} ({build}; grace partitions in temp pages)",
                    format!("{kind:?}").to_lowercase(),
                    if on.is_empty() { "true".to_owned() } else { on }
                );
                if let Some(r) = residual {
                    let _ = write!(s, " and {r}");
                }
                s.push('\n');
                left.explain_into(s, depth + 1, bm);
                Some(right)
            }
            Plan::Exists { input, sub, negated } => {
                let _ = writeln!(s, "{pad}{}Exists", if *negated { "Not" } else { "" });
                sub.explain_into(s, depth + 2, bm);
                Some(input)
            }
            Plan::Sort { input, keys, top } => {
                let how = match top {
                    Some(k) if *k <= super::sort::TOP_K_MAX => format!("top {k} in memory"),
                    _ => "external, temp pages".to_owned(),
                };
                let ks = list(&mut keys.iter().map(|k| {
                    format!(
                        "#{}{}{}",
                        k.col + 1,
                        if k.desc { " DESC" } else { "" },
                        if k.nulls_first != k.desc {
                            if k.nulls_first {
                                " NULLS FIRST"
                            } else {
                                " NULLS LAST"
                            }
                        } else {
                            ""
                        }
                    )
                }));
                let _ = writeln!(s, "{pad}Sort ({how}) {ks}");
                Some(input)
            }
            Plan::Scalars { subs, input } => {
                super::subquery::explain_scalars(subs, s, depth, bm);
                input.explain_into(s, depth, bm);
                None
            }
            Plan::Limit { input, limit, offset } => {
                let _ = write!(s, "{pad}Limit {}", limit.map_or("ALL".to_owned(), |l| l.to_string()));
                if *offset > 0 {
                    let _ = write!(s, " offset {offset}");
                }
                s.push('\n');
                Some(input)
            }
        };
        if let Some(i) = input {
            i.explain_into(s, depth + 1, bm);
        }
    }
}

/// The estimated rows of an inner join of inputs with these estimates (see
/// [`Plan::estimate`]); `keyed`: an equi-join (else a cross product).
pub fn join_estimate((l, bl): (f64, f64), (r, br): (f64, f64), keyed: bool) -> (f64, f64) {
    let rows = if keyed { l * r / bl.min(br).max(1.0) } else { l * r };
    (rows.max(1.0), bl.max(br))
}

fn scan_estimate(bm: &BufferManager, table: &Table, filter: Option<&BExpr>) -> Result<(f64, f64)> {
    let rows = table.rows(bm)? as f64;
    Ok(match filter {
        None => (rows, rows),
        Some(f) => ((rows * sampled_share(bm, table, f)?).max(1.0), rows),
    })
}

/// The output row of a projection, reused from row to row: literals set once; per row a
/// plain column is copied into its slot (a string reuses the slot's buffer), anything else
/// evaluated.
pub(super) struct Projection<'e> {
    out: Vec<Value>,
    live: Vec<(usize, &'e BExpr)>,
}

impl<'e> Projection<'e> {
    pub(super) fn new(exprs: &'e [BExpr]) -> Projection<'e> {
        Projection {
            out: exprs.iter().map(|e| if let BExpr::Lit(v) = e { v.clone() } else { Value::Null }).collect(),
            live: exprs.iter().enumerate().filter(|(_, e)| !matches!(e, BExpr::Lit(_))).collect(),
        }
    }

    /// The projection of `row`.
    pub(super) fn of(&mut self, row: &[Value]) -> Result<&[Value]> {
        for &(k, e) in &self.live {
            match e {
                BExpr::Col(i, _) => assign(&mut self.out[k], row.get(*i).ok_or_else(|| corrupt("projected column"))?),
                e => self.out[k] = e.eval(row)?,
            }
        }
        Ok(&self.out)
    }
}

/// Merges one row into the states of an aggregation without groups.
pub(super) fn agg_row(aggs: &[AggSpec], kinds: &[AggKind], states: &mut [St], row: &[Value]) -> Result<()> {
    for ((s, a), k) in states.iter_mut().zip(aggs).zip(kinds) {
        // count(*) has no argument: every row counts (any non-NULL value).
        let v = match &a.arg {
            Some(e) => e.eval(row)?,
            None => Value::Bool(true),
        };
        s.merge(St::one(k.kind, v), k)?;
    }
    Ok(())
}

/// A grouping fed a row at a time: the row's key encoded, its aggregates merged into the
/// group's states in the small pre-aggregation table where that takes it, else pushed to
/// the hash aggregation as states of one row (the arguments of DISTINCT aggregates go to
/// `dist` as (key, aggregate, value), deduplicated there and counted after).
pub(super) struct RowGroups<'a> {
    keys: &'a [BExpr],
    aggs: &'a [AggSpec],
    kinds: &'a [AggKind],
    kb: Vec<u8>,
    sb: Vec<u8>,
    db: Vec<u8>,
    sts: Vec<St>,
}

impl<'a> RowGroups<'a> {
    pub(super) fn new(keys: &'a [BExpr], aggs: &'a [AggSpec], kinds: &'a [AggKind]) -> RowGroups<'a> {
        RowGroups { keys, aggs, kinds, kb: Vec::new(), sb: Vec::new(), db: Vec::new(), sts: Vec::with_capacity(aggs.len()) }
    }

    pub(super) fn push(&mut self, cache: Option<&mut GroupCache>, main: &mut HashAgg<'_>, dist: Option<&mut HashAgg<'_>>, row: &[Value]) -> Result<()> {
        let RowGroups { keys, aggs, kinds, kb, sb, db, sts } = self;
        kb.clear();
        for k in keys.iter() {
            match k {
                BExpr::Col(i, _) => encode_value(row.get(*i).ok_or_else(|| corrupt("group key column"))?, kb),
                k => encode_value(&k.eval(row)?, kb),
            }
        }
        if let Some(c) = cache {
            if let Some(states) = c.states(kb, main)? {
                return agg_row(aggs, kinds, states, row);
            }
        }
        sts.clear();
        let mut dist = dist;
        for (i, (a, k)) in aggs.iter().zip(kinds.iter()).enumerate() {
            let v = match &a.arg {
                None => Value::Bool(true),
                Some(e) => e.eval(row)?,
            };
            if a.distinct {
                sts.push(St::empty(k.kind));
                if let (false, Some(d)) = (matches!(v, Value::Null), dist.as_deref_mut()) {
                    // (group key, which aggregate, value): deduplicated first, counted after.
                    db.clear();
                    db.extend_from_slice(kb);
                    encode_value(&Value::I64(i as i64), db);
                    encode_value(&v, db);
                    d.push(db, hash_bytes(db), &[])?;
                }
            } else {
                sts.push(St::one(k.kind, v));
            }
        }
        sb.clear();
        encode_states(sts, sb);
        main.push(kb, hash_bytes(kb), sb)
    }
}

fn run_hash_aggregate(bm: &BufferManager, input: &Plan, keys: &[BExpr], aggs: &[AggSpec], sink: &mut Sink<'_>) -> Result<bool> {
    let kinds: Vec<AggKind> = aggs.iter().map(|a| AggKind::of(a.func, a.arg_ty, a.pos, &a.label)).collect();
    let mut main = HashAgg::new(bm, kinds.clone());
    let mut dist = aggs.iter().any(|a| a.distinct).then(|| HashAgg::new(bm, Vec::new()));
    let (mut kb, mut sb) = (Vec::new(), Vec::new());
    let mut sts: Vec<St> = Vec::with_capacity(aggs.len());
    // Without DISTINCT aggregates, rows first meet a small pre-aggregation table.
    let mut cache = (!aggs.iter().any(|a| a.distinct)).then(|| GroupCache::new(kinds.clone()));
    let done = match cache.as_mut() {
        Some(c) => super::vagg::fused_grouped(bm, input, keys, aggs, c, &mut main)? || super::pipeline::grouped(bm, input, keys, aggs, &kinds, &mut main)?,
        None => false,
    };
    if !done {
        let mut rg = RowGroups::new(keys, aggs, &kinds);
        input.run(bm, &mut |row| {
            rg.push(cache.as_mut(), &mut main, dist.as_mut(), row)?;
            Ok(true)
        })?;
    }
    if let Some(c) = cache.as_mut() {
        c.flush(&mut main)?;
    }
    if let Some(d) = dist {
        let nk = keys.len();
        d.finish(&mut |key, _| {
            let mut vals = decode_row(key)?;
            if vals.len() != nk + 2 {
                return Err(corrupt("distinct aggregate record"));
            }
            let x = vals.pop().unwrap_or(Value::Null);
            let i = match vals.pop() {
                Some(Value::I64(i)) => i as usize,
                _ => return Err(corrupt("distinct aggregate record")),
            };
            kb.clear();
            encode_row(&vals, &mut kb);
            sts.clear();
            for (j, k) in kinds.iter().enumerate() {
                sts.push(if j == i { St::one(k.kind, x.clone()) } else { St::empty(k.kind) });
            }
            sb.clear();
            encode_states(&sts, &mut sb);
            main.push(&kb, hash_bytes(&kb), &sb)?;
            Ok(true)
        })?;
    }
    let mut emitted = false;
    // (One row reused for every group: no allocation per group.)
    let mut out = Vec::with_capacity(keys.len() + kinds.len());
    let go = main.finish_encoded(&mut |key, states| {
        emitted = true;
        out.clear();
        decode_row_into(key, &mut out)?;
        finish_states_into(&kinds, states, &mut out)?;
        sink(&out)
    })?;
    if !emitted && keys.is_empty() {
        // Aggregates over no rows: one row (count 0, the others NULL).
        let row: Vec<Value> = kinds.iter().map(|k| St::empty(k.kind).finish()).collect();
        return sink(&row);
    }
    Ok(go)
}
