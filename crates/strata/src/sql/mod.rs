//! SQL over tables: the text is parsed by the `sqlparser` crate; binding (names, types),
//! planning and execution are strata's own.
//!
//! ```no_run
//! # fn demo(db: &strata::Database) -> strata::Result<()> {
//! let q = strata::sql::prepare(&db.catalog(), "SELECT name, score * 2 AS s FROM people WHERE born < DATE '1900-01-01' LIMIT 10")?;
//! println!("{:?}", q.columns);                    // [OutColumn { name: "name", .. }, ..]
//! q.execute(db.buffer(), &mut |row| { println!("{row:?}"); Ok(true) })?;
//! # Ok(()) }
//! ```
//!
//! The dialect: `SELECT [DISTINCT]` lists of expressions (`+ - * / %`, `||`,
//! comparisons, `AND OR NOT`, `IS [NOT] NULL`, `[NOT] BETWEEN`, `[NOT] IN (list)`,
//! `[NOT] LIKE` with `%`, `_` and `ESCAPE`, `CASE`, `EXTRACT(YEAR|MONTH|DAY FROM d)`,
//! `SUBSTRING(s FROM a [FOR n])`, `DATE 'YYYY-MM-DD'`, `d ± INTERVAL 'n' DAY|MONTH|YEAR`,
//! `d ± n` (days), `d - d` (days), `CAST`, `abs`, `length`, `upper`, `lower`, `coalesce`),
//! `*`, `t.*`, aliases; `FROM` tables and derived tables (`(SELECT ...) AS t [(cols)]`),
//! comma-separated or with `[INNER] JOIN ... ON`, `LEFT [OUTER] JOIN ... ON`, `CROSS JOIN`,
//! qualified names `t.col`; `WITH name [(cols)] AS (SELECT ...), ...` (not recursive; each
//! use of a name is bound as a derived table there, so a query used twice is computed
//! twice); `WHERE`; `GROUP BY` expressions,
//! positions or SELECT aliases; the aggregates `count(*)`, `count`, `sum`, `avg`, `min`,
//! `max`, each also with `DISTINCT`; `HAVING`; `ORDER BY` expressions, positions or
//! output names `ASC|DESC [NULLS FIRST|LAST]` (default as in PostgreSQL: NULLs last
//! ascending, first descending); `LIMIT`, `OFFSET`; `EXPLAIN`.
//!
//! Subqueries ([`subquery`], [`bind`]): an uncorrelated scalar subquery `(SELECT ...)`
//! wherever an expression may be (WHERE, HAVING, SELECT, ON, ...) is computed once, before
//! the query's rows: its one value, NULL if it has no row, an error if it has more than
//! one; so is `[NOT] EXISTS (SELECT ...)` used as a value (inside an `OR`, in SELECT).
//! As conditions of WHERE joined by `AND`: `x [NOT] IN (SELECT ...)` (a semi or anti join
//! with SQL's NULL semantics for `NOT IN`, of the one relation `x` reads before its joins
//! when a LEFT join does not pad it) and `[NOT] EXISTS (SELECT ...)`, uncorrelated or
//! correlated: a correlated one (its WHERE reads columns of the enclosing query; names are
//! looked up in the subquery's own FROM first) is decorrelated into a semi join (`EXISTS`,
//! `x IN`) or an anti join (`NOT EXISTS`, where a NULL key just matches nothing), its
//! equalities between an expression of each side as the keys and its other correlated
//! conditions as the join's residual. `x op (SELECT agg ...)` with a correlated aggregate
//! subquery (TPC-H Q2, Q17, Q20) is decorrelated into the subquery grouped by its sides of
//! the correlated equalities, joined to the enclosing query like one more table (its rows
//! first semi-joined with the keys of the enclosing query's table that the equalities
//! name, when WHERE restricts that table). All of
//! them run on the spilling operators (hash joins, hash aggregation). Refused with
//! [`Error::Sql`] naming the position: a correlated subquery elsewhere (in SELECT, inside
//! an `OR`), one correlated by anything but equalities when it is an aggregate, one whose
//! value over no rows is not NULL (`count`), `NOT IN` with a correlated subquery,
//! `GROUP BY`, `HAVING`, `ORDER BY` or `LIMIT` in a correlated subquery, a reference to a
//! query two levels out, `x IN (SELECT ...)` other than as a WHERE condition.
//!
//! Refused with [`Error::Sql`] naming the position: `WITH RECURSIVE`, set operations,
//! window functions, `RIGHT`/`FULL` joins, `USING`/`NATURAL`.
//!
//! An `OR` over several relations in `WHERE` also contributes what it implies to the plan
//! (a conjunct of every branch as a join key, per relation the `OR` of its restrictions as
//! a scan filter), and `+ - *` of two decimal literals is computed exactly (`0.06 + 0.01`
//! is the `f64` of 0.07): TPC-H Q19 and Q6 as the specification writes them.
//!
//! Rewrites before execution: projections over joins fold into the operators above them
//! ([`fold`]), and a grouping over a join whose aggregates read plain columns of one side
//! and whose keys the other aggregates that side by its join keys first when a sample
//! says it repeats its keys ([`eager`]; TPC-H Q13).
//!
//! Execution is push-based: a scan hands each row to the operators above it. Scans are
//! column-pruned and vectorized ([`scan`]): only the columns used above are decoded, and
//! simple filters are evaluated over a leaf's column arrays before any row is decoded; an
//! aggregation straight over such a scan takes its rows a leaf at a time and computes its
//! arguments as vectors ([`vagg`]), after a small pre-aggregation table. With
//! [`Prepared::set_threads`], aggregations over a scan, or over filters, projections and
//! hash-join probes above one, run on several workers over morsels of the scan's rows
//! ([`pipeline`]: join tables built once, by the workers where the build side is such a
//! pipeline too; a join too large for a table joins its partition pairs on the workers;
//! partial aggregates merged in worker order, by partition on several threads). Operators
//! whose state grows with the input keep it in temporary pages of the pool and spill by
//! eviction ([`rows::RowRun`]: variable-size byte records): hash aggregation
//! ([`agg`]: `GROUP BY`, `DISTINCT`, distinct aggregates), sort ([`sort`]: runs and a
//! k-way merge; a top-k heap for `LIMIT` ≤ 1000), hash join ([`join`]: grace partitioning,
//! recursive for partitions that do not fit, chunks for a key too frequent to split; inner, semi and `NOT EXISTS` joins build on the side whose records take fewer
//! bytes: estimated rows times the width of the columns kept, see [`width`]). The Rust heap holds per-partition bookkeeping and a few rows at a
//! time, not the input. [`spill_counters`] tells how often each spill path was taken.
//!
//! Types: `i64` arithmetic is checked (overflow is an error, never a wrapped value),
//! `i64` with `f64` gives `f64`, `i64 / i64` is integer division truncated toward zero, and
//! division (or `%`) by zero is an error for both types. Decimal numbers are `f64`. NULL
//! follows standard SQL: comparisons with NULL are unknown, `AND`/`OR` are three-valued,
//! aggregates skip NULLs, `sum`/`avg`/`min`/`max` of no values are NULL, `count` is 0.

pub mod accum;
pub mod agg;
pub mod bind;
pub mod eager;
pub mod exec;
pub mod expr;
pub mod fold;
pub mod join;
pub mod keyfilter;
pub mod merge;
pub mod pipeline;
pub mod rows;
pub mod sample;
pub mod scan;
pub mod sort;
pub mod subquery;
pub mod vagg;
pub mod width;

use sqlparser::dialect::GenericDialect;
use sqlparser::parser::{Parser, ParserError};

pub use bind::OutColumn;
pub use exec::Plan;

use crate::access::catalog::Catalog;
use crate::access::table::Value;
use crate::buffer::BufferManager;
use crate::error::{Error, Result};

/// How often the operators of this module spilled, process-wide (for tests and tuning):
/// hash-aggregation tables flushed to partitions, sorted runs written, hash joins that
/// partitioned their inputs (grace), join partitions taken in several chunks, join
/// partitions partitioned again.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpillCounters {
    pub agg_flushes: u64,
    pub sort_runs: u64,
    pub grace_joins: u64,
    pub chunked_partitions: u64,
    pub join_repartitions: u64,
}

pub(crate) mod counters {
    use std::sync::atomic::AtomicU64;
    pub static AGG_FLUSHES: AtomicU64 = AtomicU64::new(0);
    pub static SORT_RUNS: AtomicU64 = AtomicU64::new(0);
    pub static GRACE_JOINS: AtomicU64 = AtomicU64::new(0);
    pub static CHUNKED: AtomicU64 = AtomicU64::new(0);
    pub static REPARTITIONS: AtomicU64 = AtomicU64::new(0);
    pub static JOIN_FILTERS: AtomicU64 = AtomicU64::new(0);
    pub static JOIN_FILTERED_ROWS: AtomicU64 = AtomicU64::new(0);
}

/// Join filters pushed into scans so far, process-wide (see [`keyfilter`]): how many
/// joins installed one, and how many scanned rows they dropped.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct JoinFilterCounters {
    pub installed: u64,
    pub rows_dropped: u64,
}

/// The join-filter counters so far.
pub fn join_filter_counters() -> JoinFilterCounters {
    use std::sync::atomic::Ordering::Relaxed;
    JoinFilterCounters { installed: counters::JOIN_FILTERS.load(Relaxed), rows_dropped: counters::JOIN_FILTERED_ROWS.load(Relaxed) }
}

/// The spill counters so far.
pub fn spill_counters() -> SpillCounters {
    use std::sync::atomic::Ordering::Relaxed;
    SpillCounters {
        agg_flushes: counters::AGG_FLUSHES.load(Relaxed),
        sort_runs: counters::SORT_RUNS.load(Relaxed),
        grace_joins: counters::GRACE_JOINS.load(Relaxed),
        chunked_partitions: counters::CHUNKED.load(Relaxed),
        join_repartitions: counters::REPARTITIONS.load(Relaxed),
    }
}

/// The deepest nesting of expressions and subqueries the parser accepts (deeper input is an
/// error, not a stack overflow).
pub const MAX_DEPTH: usize = 50;

/// A query ready to run: its result columns and plan.
pub struct Prepared {
    /// The result's columns, in order.
    pub columns: Vec<OutColumn>,
    plan: Plan,
    explain: Option<String>,
}

/// Splits sqlparser's "... at Line: L, Column: C" into the message and the position.
fn parse_error(e: ParserError) -> Error {
    let text = match e {
        ParserError::TokenizerError(s) | ParserError::ParserError(s) => s,
        ParserError::RecursionLimitExceeded => return Error::Sql { pos: None, msg: format!("the query is nested too deeply (at most {MAX_DEPTH} levels)") },
    };
    if let Some(i) = text.rfind(" at Line: ") {
        let tail = &text[i + " at Line: ".len()..];
        if let Some((l, c)) = tail.split_once(", Column: ") {
            if let (Ok(l), Ok(c)) = (l.trim().parse::<u64>(), c.trim().parse::<u64>()) {
                return Error::Sql { pos: Some((l, c)), msg: tidy(&text[..i]) };
            }
        }
    }
    Error::Sql { pos: None, msg: tidy(&text) }
}

/// sqlparser's "Expected: X, found: Y" as "expected X, found Y", on one line.
fn tidy(s: &str) -> String {
    let s = s.replace("Expected: ", "expected ").replace(", found: ", ", found ");
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The (line, column) just after the last character of `sql`.
fn end_of(sql: &str) -> (u64, u64) {
    let line = sql.matches('\n').count() as u64 + 1;
    let last = sql.rsplit('\n').next().unwrap_or("");
    (line, last.chars().count() as u64 + 1)
}

/// The most operator tokens (`+`, `AND`, `::`, keywords, ...) a query may have. The
/// parser builds chains like `a + b + c ...` and `x AND y AND z ...` without recursion
/// but as a tree as deep as the chain is long, and binding, spans, evaluation and drops
/// recurse over that tree: bounding the operators bounds the depth, so that no input can
/// overflow the stack. (Literals, names, commas and parentheses do not count: an `IN` list
/// of 100,000 values is fine; parentheses are bounded by [`MAX_DEPTH`].)
pub const MAX_OPERATORS: usize = 500;

/// Stack for parsing and binding (a thread of its own): enough for [`MAX_OPERATORS`]
/// nested [`MAX_DEPTH`] deep. Only the part that is used becomes resident.
const PREPARE_STACK: usize = 64 << 20;

fn count_operators(sql: &str) -> Result<()> {
    use sqlparser::keywords::Keyword;
    use sqlparser::tokenizer::{Token, Tokenizer};
    let tokens = Tokenizer::new(&GenericDialect {}, sql).tokenize_with_location().map_err(|e| parse_error(ParserError::TokenizerError(e.to_string())))?;
    let mut n = 0usize;
    for t in &tokens {
        let counts = !matches!(
            &t.token,
            Token::EOF
                | Token::Whitespace(_)
                | Token::Comma
                | Token::Number(..)
                | Token::SingleQuotedString(_)
                | Token::DoubleQuotedString(_)
                | Token::LParen
                | Token::RParen
                | Token::Period
                | Token::SemiColon
        ) && !matches!(&t.token, Token::Word(w) if w.keyword == Keyword::NoKeyword || w.quote_style.is_some());
        if counts {
            n += 1;
            if n > MAX_OPERATORS {
                return Err(Error::Sql {
                    pos: Some((t.span.start.line, t.span.start.column)),
                    msg: format!("the query has more than {MAX_OPERATORS} operators and keywords; split it up"),
                });
            }
        }
    }
    Ok(())
}

/// Parses and binds one statement (`SELECT ...` or `EXPLAIN SELECT ...`; a trailing `;` is
/// allowed) against the tables of `catalog`. Errors are [`Error::Sql`] with the position.
pub fn prepare(catalog: &Catalog, sql: &str) -> Result<Prepared> {
    prepare_in(catalog, None, sql)
}

/// [`prepare`] with the database's buffer manager: inner joins are then ordered by
/// estimates of the rows each relation has after its filters (a small sample of its rows;
/// see [`exec::Plan::estimate_rows`]), weighed by the width of the columns the query reads
/// (see [`width`]), not by the tables' sizes alone.
pub fn prepare_in(catalog: &Catalog, bm: Option<&crate::buffer::BufferManager>, sql: &str) -> Result<Prepared> {
    count_operators(sql)?;
    std::thread::scope(|s| {
        let worker = std::thread::Builder::new().name("sql-prepare".into()).stack_size(PREPARE_STACK).spawn_scoped(s, || prepare_here(catalog, bm, sql));
        match worker {
            Ok(h) => h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)),
            // No thread to be had: parse here (the operator bound keeps it shallow).
            Err(_) => prepare_here(catalog, bm, sql),
        }
    })
}

fn prepare_here(catalog: &Catalog, bm: Option<&crate::buffer::BufferManager>, sql: &str) -> Result<Prepared> {
    let dialect = GenericDialect {};
    let stmts =
        Parser::new(&dialect).with_recursion_limit(MAX_DEPTH).try_with_sql(sql).and_then(|mut p| p.parse_statements()).map_err(|e| match parse_error(e) {
            // sqlparser gives no position for the end of the input: it is the end of the text.
            Error::Sql { pos: None, msg } if msg.ends_with("found EOF") => {
                Error::Sql { pos: Some(end_of(sql)), msg: msg.replace("found EOF", "found the end of the query") }
            }
            e => e,
        })?;
    let stmt = match stmts.as_slice() {
        [] => return Err(Error::Sql { pos: None, msg: "no statement given".into() }),
        [s] => s,
        [_, s, ..] => {
            use sqlparser::ast::Spanned;
            return Err(Error::Sql { pos: bind::at(s.span()), msg: "one statement at a time".into() });
        }
    };
    let (mut bound, explain) = bind::statement(catalog, bm, stmt)?;
    fold::fold_projects(&mut bound.plan);
    eager::push_down(&mut bound.plan, bm)?;
    scan::optimize(&mut bound.plan);
    if explain {
        let text = bound.plan.explain();
        return Ok(Prepared {
            columns: vec![OutColumn { name: "plan".into(), ty: Some(crate::access::table::ColumnType::Str) }],
            plan: bound.plan,
            explain: Some(text),
        });
    }
    Ok(Prepared { columns: bound.columns, plan: bound.plan, explain: None })
}

impl Prepared {
    /// The plan (what `EXPLAIN` prints).
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// Lets the query use up to `threads` worker threads where its plan can (an aggregation
    /// over a table scan, or over filters, projections and hash-join probes above one:
    /// morsels of the scan's rows, join tables built once, partial aggregates merged at the
    /// end; see [`pipeline`]; the rest runs on the calling thread). The default is 1. With
    /// more than one, the groups of a `GROUP BY` without `ORDER BY` may come in another
    /// order, and f64 sums may differ in their last bits from a run with another count.
    pub fn set_threads(&mut self, threads: usize) {
        scan::set_threads(&mut self.plan, threads);
    }

    /// Whether this is an `EXPLAIN`: its rows are the lines of the plan.
    pub fn is_explain(&self) -> bool {
        self.explain.is_some()
    }

    /// Runs the query, handing each result row to `sink` as it is produced (in the query's
    /// order); `sink` returns `Ok(false)` to stop early. Nothing is buffered: memory stays
    /// constant however many rows there are.
    pub fn execute(&self, bm: &BufferManager, sink: &mut dyn FnMut(&[Value]) -> Result<bool>) -> Result<()> {
        if self.explain.is_some() {
            let text = self.plan.explain_with(bm);
            for line in text.lines() {
                if !sink(&[Value::Str(line.to_owned())])? {
                    break;
                }
            }
            return Ok(());
        }
        self.plan.run(bm, sink).map(|_| ())
    }
}
