//! Helpers shared by the SQL test files (`sql.rs`, `sql_ops.rs`, `tpch.rs`): run a query through
//! `strata::sql`, and compare result rows (floats to a relative 1e-9). Each test file uses
//! some of them.
#![allow(dead_code)]

use strata::access::table::Value;
use strata::{Database, Error};

/// The rows of `sql` on `db`, or its error.
pub fn run(db: &Database, sql: &str) -> Result<Vec<Vec<Value>>, Error> {
    run_threads(db, sql, 1)
}

/// [`run`] with up to `threads` workers (`Prepared::set_threads`).
pub fn run_threads(db: &Database, sql: &str, threads: usize) -> Result<Vec<Vec<Value>>, Error> {
    let mut q = strata::sql::prepare_in(&db.catalog(), Some(db.buffer()), sql)?;
    q.set_threads(threads);
    let mut out = Vec::new();
    q.execute(db.buffer(), &mut |row| {
        out.push(row.to_vec());
        Ok(true)
    })?;
    Ok(out)
}

/// The rows of `sql` on `db`; panics (naming the query) on an error.
pub fn q(db: &Database, sql: &str) -> Vec<Vec<Value>> {
    run(db, sql).unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// Equal values, floats to a relative 1e-9.
pub fn same(x: &Value, y: &Value) -> bool {
    match (x, y) {
        (Value::F64(a), Value::F64(b)) => a == b || (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0),
        _ => x == y,
    }
}

/// A row for a failure message, cut at 300 characters.
fn show(r: &[Value]) -> String {
    let s = format!("{r:?}");
    match s.char_indices().nth(300) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s,
    }
}

/// `got` equals `want` row by row (in order).
pub fn assert_rows(sql: &str, got: &[Vec<Value>], want: &[Vec<Value>]) {
    assert_eq!(got.len(), want.len(), "{sql}: {} rows, expected {}", got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(g.len() == w.len() && g.iter().zip(w).all(|(a, b)| same(a, b)), "{sql}: row {i}: got {}, expected {}", show(g), show(w));
    }
}
