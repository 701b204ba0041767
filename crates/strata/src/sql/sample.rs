//! What the planner learns from samples of a table's rows: the share passing a filter
//! ([`sampled_share`]), whether an expression's values repeat ([`sampled_domain`]), how many
//! groups a GROUP BY forms ([`sampled_groups`]) and the mean encoded width of each column
//! ([`sampled_widths`]). Each reads at most a few hundred
//! rows, whatever the table's size, and is remembered (one bounded memo for all three), so a
//! table is sampled once however often the planner and the joins ask.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use super::expr::BExpr;
use super::rows::encode_value;
use super::width::{encoded, FIXED};
use crate::access::table::{Table, Value};
use crate::buffer::BufferManager;
use crate::error::Result;

/// Rows per sampled window (three windows: the first rows, the middle and the last ones).
const SAMPLE_WINDOW: u64 = 256;

/// Entries the memo keeps before it starts again.
const MEMO_ENTRIES: usize = 4096;

/// Sampled figures by what was sampled: kind, database directory, buffer manager, table
/// root, row count (a table that grew is sampled again) and expression.
/// Process-global for now; owned by the Database it would need no keying by directory.
static MEMO: Mutex<Option<HashMap<String, Vec<f64>>>> = Mutex::new(None);

/// The memo's key for `kind` of `table` (and `what`, an expression's text or "").
fn key(kind: &str, bm: &BufferManager, table: &Table, rows: u64, what: &dyn std::fmt::Display) -> String {
    format!("{kind}|{}|{:p}|{:?}|{rows}|{what}", bm.dir().display(), bm, table.root())
}

fn recall(key: &str) -> Option<Vec<f64>> {
    MEMO.lock().ok().and_then(|m| m.as_ref().and_then(|m| m.get(key).cloned()))
}

fn remember(key: String, figures: Vec<f64>) {
    if let Ok(mut m) = MEMO.lock() {
        let m = m.get_or_insert_with(HashMap::new);
        if m.len() > MEMO_ENTRIES {
            m.clear();
        }
        m.insert(key, figures);
    }
}

/// Calls `f(window, row)` on the rows of at most three windows of [`SAMPLE_WINDOW`] rows of
/// a table of `rows` rows (one window of all of them if it has at most three windows'
/// worth); returns the rows seen.
fn sample_windows(bm: &BufferManager, table: &Table, rows: u64, f: &mut dyn FnMut(usize, &[Value])) -> Result<u64> {
    sample_windows_of(bm, table, rows, SAMPLE_WINDOW, f)
}

/// [`sample_windows`] with windows of `window` rows.
fn sample_windows_of(bm: &BufferManager, table: &Table, rows: u64, window: u64, f: &mut dyn FnMut(usize, &[Value])) -> Result<u64> {
    let (starts, per) = if rows <= 3 * window { (vec![0], rows) } else { (vec![0, rows / 2, rows - window], window) };
    let mut seen = 0;
    for (w, s) in starts.into_iter().enumerate() {
        let mut k = 0u64;
        table.scan(bm, s, &mut |_, row| {
            k += 1;
            f(w, row);
            k < per
        })?;
        seen += k;
    }
    Ok(seen)
}

/// The share of a table's rows that pass `filter`, from the sampled windows. A sample with
/// no passing row counts half a row (a filter never makes a relation look empty); a row on
/// which the filter cannot be evaluated yet (a subquery's value not computed) passes, and
/// such a share is not remembered.
pub fn sampled_share(bm: &BufferManager, table: &Table, filter: &BExpr) -> Result<f64> {
    let n = table.rows(bm)?;
    let key = key("share", bm, table, n, filter);
    if let Some(s) = recall(&key) {
        return Ok(s[0]);
    }
    let (mut hit, mut unknown) = (0u64, false);
    let seen = sample_windows(bm, table, n, &mut |_, row| match filter.eval(row) {
        Ok(Value::Bool(true)) => hit += 1,
        Ok(_) => {}
        Err(_) => {
            unknown = true;
            hit += 1;
        }
    })?;
    if seen == 0 {
        return Ok(1.0);
    }
    let share = (hit as f64).max(0.5) / seen as f64;
    if !unknown {
        remember(key, vec![share]);
    }
    Ok(share)
}

/// The distinct values of `expr` over the sampled windows when they repeat (at most half as
/// many as the rows sampled: a small domain, such as a nation key in a table of customers),
/// else `None` (key-like values). For the join order: a join on such values on both sides
/// multiplies rows.
pub fn sampled_domain(bm: &BufferManager, table: &Table, expr: &BExpr) -> Result<Option<f64>> {
    let n = table.rows(bm)?;
    let key = key("domain", bm, table, n, expr);
    if let Some(d) = recall(&key) {
        return Ok((d[0] >= 0.0).then_some(d[0]));
    }
    let (mut values, mut buf) = (HashSet::new(), Vec::new());
    let seen = sample_windows(bm, table, n, &mut |_, row| {
        if let Ok(v) = expr.eval(row) {
            buf.clear();
            encode_value(&v, &mut buf);
            if !values.contains(&buf) {
                values.insert(buf.clone());
            }
        }
    })?;
    let d = values.len() as f64;
    let out = (seen > 0 && d * 2.0 <= seen as f64).then_some(d.max(1.0));
    remember(key, vec![out.unwrap_or(-1.0)]);
    Ok(out)
}

/// The sampled windows of `window` rows of `table` (of `rows` rows; see
/// [`sample_windows`]): per distinct tuple of `keys` over the rows that pass `filter`, the
/// windows it was met in (bit `w`); with the rows seen and the rows that passed.
fn key_windows(bm: &BufferManager, table: &Table, rows: u64, window: u64, filter: Option<&BExpr>, keys: &[BExpr]) -> Result<(u64, u64, HashMap<Vec<u8>, u8>)> {
    let (mut windows_of, mut buf, mut passed) = (HashMap::<Vec<u8>, u8>::new(), Vec::new(), 0u64);
    let seen = sample_windows_of(bm, table, rows, window, &mut |w, row| {
        if let Some(f) = filter {
            if !matches!(f.eval(row), Ok(Value::Bool(true))) {
                return;
            }
        }
        passed += 1;
        buf.clear();
        for k in keys {
            match k.eval(row) {
                Ok(v) => encode_value(&v, &mut buf),
                Err(_) => buf.push(0xff),
            }
        }
        match windows_of.get_mut(buf.as_slice()) {
            Some(b) => *b |= 1 << w,
            None => {
                windows_of.insert(buf.clone(), 1 << w);
            }
        }
    })?;
    Ok((seen, passed, windows_of))
}

/// An estimate of the distinct values of the tuple `keys` over all of `table`'s rows (the
/// groups of a GROUP BY on them). The sampled windows tell two kinds of values apart:
/// values that every window meets again form a domain that repeats across the table (a
/// nation key: as many groups as the sample shows), values that each window has to itself
/// are clustered or unique (the order keys of line items: each window's share of distinct
/// values carries over to the whole table). The overlap between the windows weighs the two;
/// a table sampled whole gives its exact count.
pub fn sampled_groups(bm: &BufferManager, table: &Table, keys: &[BExpr]) -> Result<f64> {
    let n = table.rows(bm)?;
    let what = keys.iter().map(|k| k.to_string()).collect::<Vec<_>>().join(",");
    let key = key("groups", bm, table, n, &what);
    if let Some(g) = recall(&key) {
        return Ok(g[0]);
    }
    let (seen, _, seen_in) = key_windows(bm, table, n, SAMPLE_WINDOW, None, keys)?;
    // Distinct tuples met per window, and how many windows met any.
    let mut per_window = [0u64; 3];
    for bits in seen_in.values() {
        for (w, c) in per_window.iter_mut().enumerate() {
            *c += u64::from(bits >> w & 1);
        }
    }
    let windows = 8 - seen_in.values().fold(0u8, |a, &b| a | b).leading_zeros() as usize;
    let d = seen_in.len() as f64;
    let groups = if seen == 0 {
        1.0
    } else if seen >= n || windows < 2 {
        d
    } else {
        // 1: every window met the same values; 0: no value was met twice.
        let (sum, max) = (per_window.iter().sum::<u64>() as f64, *per_window.iter().max().unwrap() as f64);
        let overlap = if sum > max { ((sum - d) / (sum - max)).clamp(0.0, 1.0) } else { 1.0 };
        let scaled = n as f64 * d / seen as f64;
        (overlap * d + (1.0 - overlap) * scaled).clamp(d.max(1.0), n as f64)
    };
    remember(key, vec![groups]);
    Ok(groups)
}

/// Rows per window for [`sampled_rows_per_group`]: keys drawn at random from a domain of
/// 100 K values meet again about a hundred times across three such windows, and not at
/// all when they are unique.
const REPEAT_WINDOW: u64 = 4096;

/// An estimate of the rows per group of a GROUP BY on `keys` over the rows of `table` that
/// pass `filter` (1: the keys are unique), from three windows of [`REPEAT_WINDOW`] rows
/// (the whole table if it is smaller: then exact). The distinct values of the whole are
/// extrapolated from the sample by how many of them it met only once (Haas and Stokes'
/// `Duj1`: `d / (1 - (1 - q) f1 / r)` for `d` distinct values, `f1` of them met once, in
/// `r` sampled values, a share `q` of the rows), counting a value once per window: keys
/// clustered in the table (the line items of one order side by side) repeat within a
/// window however many values there are, so only a value met again in another window says
/// that values repeat across the table.
pub fn sampled_rows_per_group(bm: &BufferManager, table: &Table, filter: Option<&BExpr>, keys: &[BExpr]) -> Result<f64> {
    let n = table.rows(bm)?;
    let what = format!("{}|{}", keys.iter().map(|k| k.to_string()).collect::<Vec<_>>().join(","), filter.map(|f| f.to_string()).unwrap_or_default());
    let key = key("repeats", bm, table, n, &what);
    if let Some(g) = recall(&key) {
        return Ok(g[0]);
    }
    let (seen, passed, windows_of) = key_windows(bm, table, n, REPEAT_WINDOW, filter, keys)?;
    let d = windows_of.len() as f64;
    let per_group = if passed == 0 {
        1.0
    } else if seen >= n {
        passed as f64 / d
    } else {
        let r = windows_of.values().map(|b| b.count_ones() as f64).sum::<f64>();
        let f1 = windows_of.values().filter(|b| b.count_ones() == 1).count() as f64;
        let q = seen as f64 / n as f64;
        let distinct = d / (1.0 - (1.0 - q) * f1 / r);
        (passed as f64 / q / distinct).max(1.0)
    };
    remember(key, vec![per_group]);
    Ok(per_group)
}

/// The mean encoded size of each column of `table` over its first [`SAMPLE_WINDOW`] rows
/// (a fixed size for an empty table).
pub fn sampled_widths(bm: &BufferManager, table: &Table) -> Result<Vec<f64>> {
    let n = table.rows(bm)?;
    let key = key("widths", bm, table, n, &"");
    if let Some(w) = recall(&key) {
        return Ok(w);
    }
    let cols = table.schema.len();
    let (mut sum, mut k) = (vec![0.0f64; cols], 0u64);
    table.scan(bm, 0, &mut |_, row| {
        k += 1;
        for (s, v) in sum.iter_mut().zip(row) {
            *s += encoded(v);
        }
        k < SAMPLE_WINDOW
    })?;
    let w: Vec<f64> = if k == 0 { vec![FIXED; cols] } else { sum.into_iter().map(|s| s / k as f64).collect() };
    remember(key, w.clone());
    Ok(w)
}
