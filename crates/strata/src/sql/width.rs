//! Estimated bytes per column of a plan's rows, for estimates in bytes: a hash join's
//! build side is the side whose kept columns take fewer bytes (estimated rows times the
//! width of the columns its records carry, see [`super::join`]), and the join order weighs
//! the rows of each join by the width of the columns the query reads.
//!
//! A table's column widths are the mean encoded sizes (see [`super::rows::encode_value`])
//! over a sample of its first rows ([`sampled_widths`]); a computed column counts as a
//! fixed-size value.

use super::exec::Plan;
use super::expr::BExpr;
use super::join::JoinKind;
use super::sample::sampled_widths;
use crate::access::table::Value;
use crate::buffer::BufferManager;
use crate::error::Result;

/// The bytes of a computed (fixed-size) value's encoding.
pub(super) const FIXED: f64 = 9.0;

/// Bytes per record besides its columns: hash, lengths, key, hash table slot.
pub const RECORD: f64 = 32.0;

/// The encoded size of `v` (see [`super::rows::encode_value`]).
pub(super) fn encoded(v: &Value) -> f64 {
    match v {
        Value::Null | Value::Bool(_) => 1.0,
        Value::I64(_) | Value::F64(_) => 9.0,
        Value::Date(_) => 5.0,
        Value::Str(s) => 5.0 + s.len() as f64,
        Value::Bytes(b) => 5.0 + b.len() as f64,
    }
}

fn expr_widths(bm: &BufferManager, input: &Plan, exprs: &mut dyn Iterator<Item = &BExpr>) -> Result<Vec<f64>> {
    let inner = col_widths(bm, input)?;
    Ok(exprs
        .map(|e| match e {
            BExpr::Col(i, _) => inner.get(*i).copied().unwrap_or(FIXED),
            _ => FIXED,
        })
        .collect())
}

/// The estimated bytes of each column of `plan`'s rows (before pruning: every column).
pub fn col_widths(bm: &BufferManager, plan: &Plan) -> Result<Vec<f64>> {
    Ok(match plan {
        Plan::Scan { table, .. } => sampled_widths(bm, table)?,
        Plan::ColScan(s) => sampled_widths(bm, &s.table)?,
        Plan::OneRow { .. } => Vec::new(),
        Plan::Project { input, exprs } => expr_widths(bm, input, &mut exprs.iter())?,
        Plan::Filter { input, .. } | Plan::Sort { input, .. } | Plan::Limit { input, .. } | Plan::Exists { input, .. } | Plan::Scalars { input, .. } => {
            col_widths(bm, input)?
        }
        Plan::Aggregate { aggs, .. } => vec![FIXED; aggs.len()],
        Plan::HashAggregate { input, keys, aggs } => {
            let mut w = expr_widths(bm, input, &mut keys.iter())?;
            w.resize(keys.len() + aggs.len(), FIXED);
            w
        }
        Plan::HashJoin { left, right, kind, .. } => {
            let mut w = col_widths(bm, left)?;
            if matches!(kind, JoinKind::Inner | JoinKind::Left) {
                w.extend(col_widths(bm, right)?);
            }
            w
        }
    })
}

/// The estimated bytes of `plan`'s rows as records that carry the columns `keep` says
/// (`keep(i)`: column `i` is carried): rows times the kept columns' widths and
/// [`RECORD`].
pub fn estimate_bytes(bm: &BufferManager, plan: &Plan, keep: &dyn Fn(usize) -> bool) -> Result<f64> {
    let (rows, _) = plan.estimate(bm)?;
    let w: f64 = col_widths(bm, plan)?.iter().enumerate().filter(|(i, _)| keep(*i)).map(|(_, w)| w).sum();
    Ok(rows * (w + RECORD))
}
