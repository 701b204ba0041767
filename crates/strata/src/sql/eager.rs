//! Eager aggregation: a grouping over a join whose aggregates read only the join's right
//! side, and whose keys only its left side, aggregates the right side by its join keys
//! first (for an inner join, also the other way round), and the join then meets one row per key instead of every row (TPC-H Q13: the
//! orders of each customer are counted before the 150 K customers are joined with 100 K
//! counts, not after 1.5 M orders went through a LEFT join).
//!
//! Why it is exact: every left row `l` of a group joins the rows `R(k)` of the right side
//! whose keys equal its key `k`, so the group's aggregate is the merge, over its left rows,
//! of the aggregate of `R(k)`; with the right side aggregated by key, each left row joins
//! exactly that partial aggregate (or nothing), and merging the partials gives the same
//! value: counts add (`count(x)` becomes the `sum` of partial counts), sums add, minima
//! and maxima compare. A LEFT join's left row without a match joins NULLs: a sum of
//! partial counts that saw only NULLs is NULL where `count` is 0, so those are wrapped in
//! `coalesce(.., 0)`. Aggregates must read a plain column of the side (an expression
//! could be non-NULL on the padded row, as `count(1)` or `coalesce(x, 0)`, or fail on a
//! row that joins nothing, as `10 / x`, which the join never evaluated); a partial sum of
//! a key that joins nothing can still overflow where the join would have skipped it.
//! Not taken: `DISTINCT` and `avg` aggregates (a partial average does
//! not merge as one value), `count(*)` over a LEFT join (it counts the padded row), joins
//! with a residual condition, sides that are not a table scan, sides whose rows are not
//! at least [`MIN_REDUCTION`] times their groups by a sample (see
//! [`sampled_rows_per_group`](super::sample::sampled_rows_per_group); with unique keys the
//! pre-aggregation would be an extra pass that saves the join nothing), and, for inner
//! joins, sides with more groups than the other side has rows, by the estimates and with
//! a margin (the join would drop most of them; see [`rewrite`]).

use super::exec::{AggFunc, AggSpec, Plan};
use super::expr::BExpr;
use super::join::JoinKind;
use crate::access::table::{ColumnType, Value};
use crate::buffer::BufferManager;
use crate::error::Result;

/// Estimated rows per group of the right side at least, for the pre-aggregation to be worth a pass.
const MIN_REDUCTION: f64 = 2.0;

/// For an inner join, the estimated rows of the other side per group of this one at least.
const OTHER_MARGIN: f64 = 2.0;

/// Rewrites every grouping of `plan` over a join that qualifies (see the module
/// documentation), with the estimates of `bm`'s tables. Without a buffer manager there are
/// no estimates, and nothing is rewritten.
pub fn push_down(plan: &mut Plan, bm: Option<&BufferManager>) -> Result<()> {
    let Some(bm) = bm else { return Ok(()) };
    for input in plan.inputs_mut() {
        push_down(input, Some(bm))?;
    }
    if let Some(eager) = rewrite(plan, bm)? {
        *plan = eager;
    }
    Ok(())
}

fn reads_only(e: &BExpr, cols: std::ops::Range<usize>) -> bool {
    let mut read = Vec::new();
    e.cols(&mut read);
    read.iter().all(|c| cols.contains(c))
}

/// The plan that aggregates eagerly, if `plan` is a grouping that may (else `None`).
fn rewrite(plan: &Plan, bm: &BufferManager) -> Result<Option<Plan>> {
    let Plan::HashAggregate { input, keys, aggs } = plan else { return Ok(None) };
    let Plan::HashJoin { left, right, kind, left_keys, right_keys, residual: None, right_width, keep } = &**input else { return Ok(None) };
    let outer = match kind {
        JoinKind::Inner => false,
        JoinKind::Left => true,
        _ => return Ok(None),
    };
    if keys.is_empty() || aggs.is_empty() || !keep.is_empty() {
        return Ok(None);
    }
    let lw = super::scan::width(left);
    let (lcols, rcols) = (0..lw, lw..lw + right_width);
    let takes = |a: &AggSpec, side: &std::ops::Range<usize>| {
        // A plain column: NULL on a LEFT join's padded row (a constant or `coalesce(x, 0)`
        // is not, and the padded row would count), and it cannot fail on rows that join
        // nothing (`10 / x` would, where the join never evaluated it).
        let arg_in_side = matches!(&a.arg, Some(BExpr::Col(c, _)) if side.contains(c));
        !a.distinct
            && match a.func {
                AggFunc::Count | AggFunc::Sum | AggFunc::Min | AggFunc::Max => arg_in_side,
                AggFunc::CountStar => !outer,
                AggFunc::Avg => false,
            }
    };
    let fits = |key_side: &std::ops::Range<usize>, agg_side: &std::ops::Range<usize>| {
        keys.iter().all(|k| reads_only(k, key_side.clone())) && aggs.iter().all(|a| takes(a, agg_side))
    };
    // The side aggregated first: the right one, or (inner joins) the left one.
    let right_first = if fits(&lcols, &rcols) {
        true
    } else if !outer && fits(&rcols, &lcols) {
        false
    } else {
        return Ok(None);
    };
    let (side, side_keys, side_cols) = if right_first { (right, right_keys, rcols) } else { (left, left_keys, lcols) };
    let (table, filter) = match &**side {
        Plan::Scan { table, filter, .. } => (table, filter.as_ref()),
        Plan::ColScan(s) => (&s.table, s.filter.as_ref()),
        _ => return Ok(None),
    };
    let per_group = super::sample::sampled_rows_per_group(bm, table, filter, side_keys)?;
    if per_group < MIN_REDUCTION {
        return Ok(None);
    }
    // A LEFT join builds its table from the right side whatever the left one holds, so
    // aggregating that side first trades a table insert per row for an aggregate update and
    // builds a smaller table. An inner join may instead probe with this side, and when the
    // other side is small, the join filter drops most of its rows in the scan (TPC-H Q18:
    // 57 orders against 1.5 M groups of line items): there, aggregating all of them first
    // is the larger cost. So the other side must have rows for most groups, with a margin
    // for the estimates (Q18's IN subquery with HAVING is estimated at half its groups).
    if !outer {
        let other = if right_first { left } else { right };
        let groups = side.estimate(bm)?.0 / per_group;
        if other.estimate(bm)?.0 < groups * OTHER_MARGIN {
            return Ok(None);
        }
    }
    // The side aggregated by its join keys: keys first, then a partial per aggregate.
    let partials = aggs
        .iter()
        .map(|a| AggSpec {
            arg: a.arg.clone().map(|mut e| {
                e.map_cols(&|c| c - side_cols.start);
                e
            }),
            distinct: false,
            ..a.clone()
        })
        .collect();
    let nk = side_keys.len();
    let key_name = |i: usize, k: &BExpr| match k {
        BExpr::Col(_, n) => n.clone(),
        _ => format!("key{i}"),
    };
    let pre = Box::new(Plan::HashAggregate { input: side.clone(), keys: side_keys.clone(), aggs: partials });
    let pre_keys = side_keys.iter().enumerate().map(|(i, k)| BExpr::Col(i, key_name(i, k))).collect();
    let pre_width = nk + aggs.len();
    let (join, first_partial, keys) = if right_first {
        let join = Plan::HashJoin {
            left: left.clone(),
            right: pre,
            kind: *kind,
            left_keys: left_keys.clone(),
            right_keys: pre_keys,
            residual: None,
            right_width: pre_width,
            keep: Vec::new(),
        };
        (join, lw + nk, keys.clone())
    } else {
        let join = Plan::HashJoin {
            left: pre,
            right: right.clone(),
            kind: *kind,
            left_keys: pre_keys,
            right_keys: right_keys.clone(),
            residual: None,
            right_width: *right_width,
            keep: Vec::new(),
        };
        // The grouping keys read the right side's columns, which now follow the partials.
        let mut keys = keys.clone();
        for k in &mut keys {
            k.map_cols(&|c| c - lw + pre_width);
        }
        (join, nk, keys)
    };
    let counts = |a: &AggSpec| matches!(a.func, AggFunc::Count | AggFunc::CountStar);
    let merged = aggs
        .iter()
        .enumerate()
        .map(|(i, a)| AggSpec {
            func: if counts(a) { AggFunc::Sum } else { a.func },
            arg: Some(BExpr::Col(first_partial + i, a.label.clone())),
            arg_ty: if counts(a) { Some(ColumnType::I64) } else { a.arg_ty },
            distinct: false,
            ..a.clone()
        })
        .collect();
    let nkeys = keys.len();
    let names: Vec<String> = keys.iter().enumerate().map(|(i, k)| key_name(i, k)).collect();
    let grouped = Plan::HashAggregate { input: Box::new(join), keys, aggs: merged };
    if !(outer && aggs.iter().any(counts)) {
        return Ok(Some(grouped));
    }
    // A count over a LEFT join is 0, not NULL, for a group whose rows all found no match.
    let exprs = names
        .into_iter()
        .enumerate()
        .map(|(i, n)| BExpr::Col(i, n))
        .chain(aggs.iter().enumerate().map(|(i, a)| {
            let col = BExpr::Col(nkeys + i, a.label.clone());
            if counts(a) {
                BExpr::Coalesce(vec![col, BExpr::Lit(Value::I64(0))])
            } else {
                col
            }
        }))
        .collect();
    Ok(Some(Plan::Project { input: Box::new(grouped), exprs }))
}
