//! Projections that only copy columns, folded into the operator above them: the binder
//! puts one above a join whose relations it joined in another order than written (every
//! column of every relation, put back in FROM's order); a projection, grouping or
//! aggregate over it reads the join's rows directly, its column references mapped, and
//! no row is copied for it. A projection that computes expressions over a join's rows
//! under a grouping or aggregate is folded into it too, its expressions put in the
//! places that read them (each computed expression read once at most, so that nothing is
//! computed twice): the grouping encodes a key column straight from the join's row, where
//! the projection cloned it into a row of its own (TPC-H Q9: a nation's name per joined
//! line item).

use super::exec::Plan;
use super::expr::BExpr;

/// Where each output column of a projection of plain columns comes from; `None` if the
/// projection computes anything.
fn column_map(exprs: &[BExpr]) -> Option<Vec<usize>> {
    exprs
        .iter()
        .map(|e| match e {
            BExpr::Col(i, _) => Some(*i),
            _ => None,
        })
        .collect()
}

/// Whether `p` is a join's rows, filtered or not.
fn over_join(p: &Plan) -> bool {
    match p {
        Plan::HashJoin { .. } => true,
        Plan::Filter { input, .. } => matches!(**input, Plan::HashJoin { .. }),
        _ => false,
    }
}

/// If `input` is a projection of plain columns of a join's rows (filtered or not), replaces it by its input and maps the
/// column references of `exprs` (which read `input`'s rows) through it.
fn fold_into(input: &mut Box<Plan>, exprs: &mut [&mut BExpr]) {
    let Plan::Project { input: inner, exprs: cols } = &mut **input else { return };
    if !over_join(inner) {
        return;
    }
    let Some(map) = column_map(cols) else { return };
    for e in exprs.iter_mut() {
        e.map_cols(&|i| map.get(i).copied().unwrap_or(i));
    }
    let below = std::mem::replace(&mut **inner, Plan::OneRow { filter: None });
    **input = below;
}

/// If `input` is a projection of a join's rows (filtered or not) whose computed
/// expressions `exprs` read at most once each, replaces it by its input and puts its
/// expressions in their places in `exprs`.
fn inline_into(input: &mut Box<Plan>, exprs: &mut [&mut BExpr]) {
    if let Plan::Project { input: inner, exprs: cols } = &**input {
        let mut reads = vec![0usize; cols.len()];
        for e in exprs.iter() {
            let mut read = Vec::new();
            e.cols(&mut read);
            for c in read {
                match reads.get_mut(c) {
                    Some(n) => *n += 1,
                    None => return,
                }
            }
        }
        let once = cols.iter().zip(&reads).all(|(c, &n)| n <= 1 || matches!(c, BExpr::Col(..) | BExpr::Lit(_)));
        if !over_join(inner) || !once {
            return;
        }
    } else {
        return;
    }
    let Plan::Project { input: inner, exprs: cols } = std::mem::replace(&mut **input, Plan::OneRow { filter: None }) else { unreachable!("checked above") };
    for e in exprs.iter_mut() {
        substitute(e, &cols);
    }
    *input = inner;
}

/// Replaces every column reference `i` of `e` by `cols[i]`.
fn substitute(e: &mut BExpr, cols: &[BExpr]) {
    if let BExpr::Col(i, _) = e {
        *e = cols[*i].clone();
        return;
    }
    for c in e.children_mut() {
        substitute(c, cols);
    }
}

/// Folds every projection of plain columns of a join's rows that is the input of a
/// projection, a grouping or an aggregate of `plan`, and every projection of a join's rows
/// that is the input of a grouping or an aggregate.
pub fn fold_projects(plan: &mut Plan) {
    match plan {
        Plan::Scan { .. } | Plan::ColScan(_) | Plan::OneRow { .. } => {}
        Plan::Project { input, exprs } => {
            fold_projects(input);
            fold_into(input, &mut exprs.iter_mut().collect::<Vec<_>>());
        }
        Plan::Aggregate { input, aggs } => {
            fold_projects(input);
            fold_into(input, &mut aggs.iter_mut().filter_map(|a| a.arg.as_mut()).collect::<Vec<_>>());
            inline_into(input, &mut aggs.iter_mut().filter_map(|a| a.arg.as_mut()).collect::<Vec<_>>());
        }
        Plan::HashAggregate { input, keys, aggs } => {
            fold_projects(input);
            fold_into(input, &mut keys.iter_mut().chain(aggs.iter_mut().filter_map(|a| a.arg.as_mut())).collect::<Vec<_>>());
            inline_into(input, &mut keys.iter_mut().chain(aggs.iter_mut().filter_map(|a| a.arg.as_mut())).collect::<Vec<_>>());
        }
        Plan::Filter { input, .. } | Plan::Sort { input, .. } | Plan::Limit { input, .. } => fold_projects(input),
        Plan::Exists { input, sub, .. } => {
            fold_projects(input);
            fold_projects(sub);
        }
        Plan::Scalars { subs, input } => {
            for s in subs.iter_mut() {
                fold_projects(&mut s.plan);
            }
            fold_projects(input);
        }
        Plan::HashJoin { left, right, .. } => {
            fold_projects(left);
            fold_projects(right);
        }
    }
}
