//! Uncorrelated subqueries used as values: a scalar subquery `(SELECT ...)` (its one value;
//! NULL for no row, an error for more than one) and `EXISTS (SELECT ...)` where no join
//! can take it. Each is a [`Param`] that the binder puts into the expressions; the plan's
//! root ([`Plan::Scalars`]) runs the subqueries once, before any row of the query, and
//! sets the values. (Correlated subqueries are decorrelated into joins by the binder, see
//! [`super::bind`].)

use std::sync::Arc;

use parking_lot::RwLock;

use super::exec::{Plan, Sink};
use super::expr::{err, Pos};
use crate::access::table::Value;
use crate::buffer::BufferManager;
use crate::error::Result;

/// The value of one subquery, set when the plan runs.
#[derive(Debug)]
pub struct Param {
    /// Its number in the statement (`$1`, `$2`, ... in `EXPLAIN`).
    pub id: usize,
    value: RwLock<Value>,
}

impl Param {
    pub fn new(id: usize) -> Param {
        Param { id, value: RwLock::new(Value::Null) }
    }

    /// The value (NULL before the subquery ran).
    pub fn get(&self) -> Value {
        self.value.read().clone()
    }

    fn set(&self, v: Value) {
        *self.value.write() = v;
    }
}

/// A subquery computed before the rows of the query: its parameter and plan.
#[derive(Clone, Debug)]
pub struct ScalarSub {
    pub param: Arc<Param>,
    pub plan: Plan,
    /// `EXISTS`: the value is whether the plan has a row; else the plan has one column and
    /// the value is its row's (NULL if none, an error if several).
    pub exists: bool,
    /// Where the subquery is in the query text (for the error of several rows).
    pub pos: Pos,
}

/// Runs the subqueries in order (a nested one is listed before the one that uses it), then
/// `input`.
pub fn run_scalars(bm: &BufferManager, subs: &[ScalarSub], input: &Plan, sink: &mut Sink<'_>) -> Result<bool> {
    for s in subs {
        let mut value: Option<Value> = None;
        let mut rows = 0u64;
        s.plan.run(bm, &mut |row| {
            rows += 1;
            if s.exists {
                return Ok(false);
            }
            if rows > 1 {
                return Err(err(s.pos, "a scalar subquery returned more than one row"));
            }
            value = Some(row.first().cloned().unwrap_or(Value::Null));
            Ok(true)
        })?;
        s.param.set(if s.exists { Value::Bool(rows > 0) } else { value.unwrap_or(Value::Null) });
    }
    input.run(bm, sink)
}

/// The `EXPLAIN` lines of the subqueries.
pub fn explain_scalars(subs: &[ScalarSub], s: &mut String, depth: usize, bm: Option<&BufferManager>) {
    let pad = "  ".repeat(depth);
    for sub in subs {
        s.push_str(&format!("{pad}${} := {} (once, before the rows)\n", sub.param.id, if sub.exists { "EXISTS" } else { "scalar subquery" }));
        sub.plan.explain_into(s, depth + 1, bm);
    }
}
