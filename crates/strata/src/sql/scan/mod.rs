//! Column-pruned, vectorized table scans.
//!
//! After binding, [`prune`] walks the plan from the root and works out which columns of
//! each table scan its consumers read (expressions, keys, join keys, residuals, the scan's
//! own filter); each [`Plan::Scan`] becomes a [`Plan::ColScan`] that decodes only those
//! columns. The others stay NULL in the rows it hands on, so rows keep the table's layout
//! and no column index above the scan changes (and a hash join's or a sort's records of
//! such rows get smaller).
//!
//! A [`ColScan`] works a leaf at a time: the scan filter's top-level conjuncts that are
//! simple (comparisons of a column with a constant or with another column of the same
//! type, `IN` lists of constants, `LIKE` with a constant pattern, `IS [NOT] NULL`, boolean
//! columns, and `AND`/`OR`/`NOT` of those) are evaluated over the leaf's column arrays
//! into bitmaps of the rows where they are true and where they are unknown (NULL), read
//! straight from the PAX bytes without decoding rows. Only rows that can pass are decoded,
//! and only their needed columns, into one reused row (strings reuse their buffers). Any
//! other conjunct is evaluated row by row, after the simple ones before it, on exactly the
//! rows where the row-at-a-time filter would evaluate it (SQL's `AND` evaluates a conjunct
//! only when no earlier one is false), so errors such as a division by zero come from the
//! same rows as before. The simple conjuncts cannot fail, so evaluating them eagerly over a
//! whole leaf changes nothing but speed.

use std::cmp::Ordering;

use super::exec::{Plan, Sink};
use super::expr::{compare, like, BExpr, CmpOp};
use super::join::JoinKind;
use super::keyfilter::{date_key_hash, fixed_date, fixed_f64, fixed_i64, i64_key_hash, i64_pair_key_hash, key_hash, FixedKeyHash, KeyFilter};
use super::rows::{encode_ref, encode_str_bytes, ValueRef};
use crate::access::table::packed::Fill;
use crate::access::table::pax::{self, Leaf};
use crate::access::table::LeafPage;
use crate::access::table::{ColumnType, Schema, Table, Value};
use crate::buffer::BufferManager;
use crate::error::{Error, Result};

mod stored;

/// A scan that decodes only the columns its consumers use and filters leaves a column at a
/// time.
#[derive(Clone, Debug)]
pub struct ColScan {
    pub name: String,
    pub table: Table,
    pub filter: Option<BExpr>,
    /// Per column of the table: read by the scan (its consumers or its filter).
    pub need: Vec<bool>,
    /// Per column of the table: read by the scan's consumers (decoded into the rows it
    /// hands on; the others are left NULL).
    pub out: Vec<bool>,
    /// Worker threads an aggregation straight over this scan may use (morsels of rows).
    pub threads: usize,
    conjs: Vec<Conj>,
    /// The leaf-wise conjuncts (indexes into `conjs`) in groups evaluated together on a
    /// packed leaf: the comparisons of one numeric column with constants (other than
    /// `<>`) form one group (one range of its stored values), any other is alone.
    groups: Vec<Vec<usize>>,
    /// A join's filter on its keys while the join probes with this scan's rows (see
    /// [`super::keyfilter`]).
    pub(crate) keys: super::keyfilter::Slot,
}

#[derive(Clone, Debug)]
enum Conj {
    /// Evaluated over a whole leaf.
    Vec(VPred),
    /// Evaluated row by row.
    Row(BExpr),
}

/// A predicate evaluated over a leaf into bitmaps (true, unknown).
#[derive(Clone, Debug)]
enum VPred {
    Const(Option<bool>),
    /// A column compared with a non-NULL constant.
    CmpLit {
        col: usize,
        op: CmpOp,
        lit: Value,
    },
    /// Two columns of the same type compared.
    CmpCols {
        a: usize,
        op: CmpOp,
        b: usize,
    },
    IsNull {
        col: usize,
        negated: bool,
    },
    BoolCol(usize),
    /// `col [NOT] IN (constants)`: the non-NULL constants, whether one was NULL. With
    /// `prefix: Some(k)`, a string column's first `k` characters are compared
    /// (`SUBSTRING(col FROM 1 FOR k) IN (...)`, as in TPC-H Q22), without making them a
    /// string per row.
    InList {
        col: usize,
        prefix: Option<usize>,
        lits: Vec<Value>,
        has_null: bool,
        negated: bool,
    },
    Like {
        col: usize,
        pattern: Pattern,
        negated: bool,
    },
    And(Box<VPred>, Box<VPred>),
    Or(Box<VPred>, Box<VPred>),
    Not(Box<VPred>),
}

/// A compiled `LIKE` pattern.
#[derive(Clone, Debug)]
enum Pattern {
    /// Only literal characters and `%`: the pieces between the `%`s, whether the pattern
    /// starts and ends with `%`. Matched on bytes (UTF-8 makes a byte match of a literal
    /// piece a character match). Each piece's searcher is built once (building one per
    /// search cost as much as the search, on strings of a few dozen bytes).
    Pieces { pieces: Vec<memchr::memmem::Finder<'static>>, open_start: bool, open_end: bool },
    /// Anything else: [`like`].
    General { pattern: String, escape: Option<char> },
}

impl Pattern {
    fn compile(p: &str, escape: Option<char>) -> Pattern {
        if p.contains('_') || escape.is_some_and(|e| p.contains(e)) {
            return Pattern::General { pattern: p.to_owned(), escape };
        }
        let pieces = p.split('%').filter(|s| !s.is_empty()).map(|s| memchr::memmem::Finder::new(s.as_bytes()).into_owned()).collect();
        Pattern::Pieces { open_start: p.starts_with('%'), open_end: p.ends_with('%'), pieces }
    }

    fn matches(&self, t: &[u8]) -> Option<bool> {
        match self {
            Pattern::Pieces { pieces, open_start, open_end } => {
                if pieces.is_empty() {
                    // "" matches only ""; "%", "%%" anything.
                    return Some(*open_start || t.is_empty());
                }
                let mut lo = 0usize;
                let mut hi = t.len();
                let mut inner = &pieces[..];
                if !open_start {
                    let first = pieces[0].needle();
                    if !t.starts_with(first) {
                        return Some(false);
                    }
                    lo = first.len();
                    inner = &inner[1..];
                }
                if !open_end {
                    let Some((last, rest)) = inner.split_last() else {
                        // One piece, no % at all: the whole text.
                        return Some(lo == t.len());
                    };
                    let last = last.needle();
                    if t.len() < lo + last.len() || !t.ends_with(last) {
                        return Some(false);
                    }
                    hi = t.len() - last.len();
                    inner = rest;
                }
                for piece in inner {
                    match piece.find(&t[lo..hi]) {
                        Some(at) => lo += at + piece.needle().len(),
                        None => return Some(false),
                    }
                }
                Some(true)
            }
            Pattern::General { pattern, escape } => Some(like(std::str::from_utf8(t).ok()?, pattern, *escape)),
        }
    }
}

fn comparable_lit(ty: ColumnType, v: &Value) -> bool {
    match (ty, v) {
        (ColumnType::I64 | ColumnType::F64, Value::I64(_) | Value::F64(_)) => true,
        (t, v) => v.ty() == Some(t),
    }
}

fn col_of(e: &BExpr, schema: &Schema) -> Option<(usize, ColumnType)> {
    match e {
        BExpr::Col(i, _) => schema.columns.get(*i).map(|c| (*i, c.ty)),
        _ => None,
    }
}

/// `e` as a leaf-wise predicate, if it is simple enough.
fn compile(e: &BExpr, schema: &Schema) -> Option<VPred> {
    Some(match e {
        BExpr::Lit(Value::Bool(b)) => VPred::Const(Some(*b)),
        BExpr::Lit(Value::Null) => VPred::Const(None),
        BExpr::Col(..) => match col_of(e, schema)? {
            (i, ColumnType::Bool) => VPred::BoolCol(i),
            _ => return None,
        },
        BExpr::Cmp(op, a, b) => match (&**a, &**b) {
            (BExpr::Col(..), BExpr::Lit(v)) | (BExpr::Lit(v), BExpr::Col(..)) => {
                let (col, ty) = col_of(if matches!(**a, BExpr::Col(..)) { a } else { b }, schema)?;
                let op = if matches!(**a, BExpr::Col(..)) { *op } else { op.flip() };
                if matches!(v, Value::Null) {
                    return Some(VPred::Const(None));
                }
                if !comparable_lit(ty, v) {
                    return None;
                }
                VPred::CmpLit { col, op, lit: v.clone() }
            }
            (BExpr::Col(..), BExpr::Col(..)) => {
                let ((x, tx), (y, ty)) = (col_of(a, schema)?, col_of(b, schema)?);
                if tx != ty {
                    return None;
                }
                VPred::CmpCols { a: x, op: *op, b: y }
            }
            _ => return None,
        },
        BExpr::And(a, b) => VPred::And(Box::new(compile(a, schema)?), Box::new(compile(b, schema)?)),
        BExpr::Or(a, b) => VPred::Or(Box::new(compile(a, schema)?), Box::new(compile(b, schema)?)),
        BExpr::Not(a) => VPred::Not(Box::new(compile(a, schema)?)),
        BExpr::IsNull(x, negated) => VPred::IsNull { col: col_of(x, schema)?.0, negated: *negated },
        BExpr::InList(x, list, negated) => {
            let (col, ty, prefix) = match &**x {
                BExpr::Substring { expr, from, len: Some(len), .. } => {
                    let (col, ty) = col_of(expr, schema)?;
                    let from_one = matches!(from.as_deref(), None | Some(BExpr::Lit(Value::I64(1))));
                    match (ty, &**len) {
                        (ColumnType::Str, BExpr::Lit(Value::I64(k))) if from_one && *k >= 0 => (col, ty, Some(usize::try_from(*k).ok()?)),
                        _ => return None,
                    }
                }
                _ => {
                    let (col, ty) = col_of(x, schema)?;
                    (col, ty, None)
                }
            };
            let mut lits = Vec::new();
            let mut has_null = false;
            for e in list {
                match e {
                    BExpr::Lit(Value::Null) => has_null = true,
                    BExpr::Lit(v) if comparable_lit(ty, v) => lits.push(v.clone()),
                    _ => return None,
                }
            }
            VPred::InList { col, prefix, lits, has_null, negated: *negated }
        }
        BExpr::Like { expr, pattern, escape, negated, .. } => {
            let (col, ty) = col_of(expr, schema)?;
            match (ty, &**pattern) {
                (ColumnType::Str, BExpr::Lit(Value::Str(p))) => VPred::Like { col, pattern: Pattern::compile(p, *escape), negated: *negated },
                _ => return None,
            }
        }
        _ => return None,
    })
}

fn conjuncts(e: &BExpr, out: &mut Vec<BExpr>) {
    match e {
        BExpr::And(a, b) => {
            conjuncts(a, out);
            conjuncts(b, out);
        }
        e => out.push(e.clone()),
    }
}

impl ColScan {
    /// A scan of `table` whose consumers read the columns `out` marks.
    pub fn new(name: String, table: Table, filter: Option<BExpr>, out: Vec<bool>) -> ColScan {
        let mut parts = Vec::new();
        let mut need = out.clone();
        if let Some(f) = &filter {
            conjuncts(f, &mut parts);
            mark(f, &mut need);
        }
        let conjs: Vec<Conj> = parts.into_iter().map(|c| compile(&c, &table.schema).map_or(Conj::Row(c), Conj::Vec)).collect();
        let mut groups: Vec<Vec<usize>> = Vec::new();
        let mut by_col: Vec<(usize, usize)> = Vec::new();
        for (k, c) in conjs.iter().enumerate() {
            match c {
                Conj::Vec(VPred::CmpLit { col, op, .. })
                    if *op != CmpOp::Ne && table.schema.columns[*col].ty != ColumnType::Str && table.schema.columns[*col].ty != ColumnType::Bytes =>
                {
                    match by_col.iter().find(|(c, _)| c == col) {
                        Some(&(_, g)) => groups[g].push(k),
                        None => {
                            by_col.push((*col, groups.len()));
                            groups.push(vec![k]);
                        }
                    }
                }
                Conj::Vec(_) => groups.push(vec![k]),
                Conj::Row(_) => {}
            }
        }
        ColScan { name, table, filter, need, out, threads: 1, conjs, groups, keys: Default::default() }
    }

    /// Runs the scan, handing each row that passes the filter to `sink`: the committed
    /// rows ([`Table::rows`](crate::access::table::Table::rows)), as a parallel scan's
    /// morsels cover them.
    pub fn run(&self, bm: &BufferManager, sink: &mut Sink<'_>) -> Result<bool> {
        self.run_range(bm, 0, self.table.rows(bm)?, sink)
    }

    /// [`run`](Self::run) over the rows with ids in `from..to` (a morsel).
    pub fn run_range(&self, bm: &BufferManager, from: u64, to: u64, sink: &mut Sink<'_>) -> Result<bool> {
        let schema = &self.table.schema;
        let ncols = schema.len();
        let mut row: Vec<Value> = vec![Value::Null; ncols];
        let needed: Vec<usize> = (0..ncols).filter(|&c| self.need[c]).collect();
        let out = self.needed();
        let mut bits = Bits::default();
        let mut scratch = Scratch::default();
        let any_row = self.conjs.iter().any(|c| matches!(c, Conj::Row(_)));
        // A join's filter, while it drops enough rows to pay for itself (at least one in
        // JOIN_FILTER_MIN_DROP of the first JOIN_FILTER_PROBATION rows it tests).
        let mut jf = JoinFiltering::new(self.keys.get());
        let mut go = true;
        self.table.scan_pages(bm, from, (to != u64::MAX).then_some(to), Some(&self.need), &mut |pid, leaf, start| {
            if leaf.first() >= to {
                return Ok(false);
            }
            let n = leaf.count();
            // Rows at and above `to` belong to the next morsel.
            let end = n.min(usize::try_from(to - leaf.first()).unwrap_or(usize::MAX));
            if start >= end {
                return Ok(true);
            }
            let bad = |what: &str| self.table.corrupt_leaf(bm, pid, what);
            let first = leaf.first();
            let unreadable = |i: usize| bad(&format!("row {} is unreadable", first + i as u64));
            if !any_row {
                let Some((lf, mut all)) = self.filter_leaf(&leaf, start, end, &mut bits, &mut scratch).map_err(&bad)? else {
                    return Ok(true);
                };
                jf.leaf(&lf, &mut all).map_err(|_| bad(UNREADABLE))?;
                for i in crate::util::set_bits(&all) {
                    lf.decode(i, &out, &mut row).map_err(|_| unreadable(i))?;
                    if !sink(&row)? {
                        go = false;
                        return Ok(false);
                    }
                }
                bits.give(all);
                return Ok(true);
            }
            // Row-by-row conjuncts: every column the scan reads, expanded whole; per
            // leaf-wise conjunct its (true, unknown) bitmaps.
            let lf = self.whole_view(&leaf, &mut scratch).map_err(&bad)?;
            let words = n.div_ceil(64);
            let mut per: Vec<(Vec<u64>, Vec<u64>)> = Vec::new();
            for c in &self.conjs {
                if let Conj::Vec(p) = c {
                    per.push(p.eval(&lf, &mut bits, words).map_err(|_| bad(UNREADABLE))?);
                }
            }
            'rows: for i in start..end {
                let (w, b) = (i / 64, 1u64 << (i % 64));
                let mut all_true = true;
                let mut decoded = false;
                let mut k = 0;
                for c in &self.conjs {
                    match c {
                        Conj::Vec(_) => {
                            let (t, u) = &per[k];
                            k += 1;
                            if t[w] & b != 0 {
                            } else if u[w] & b != 0 {
                                all_true = false;
                            } else {
                                continue 'rows;
                            }
                        }
                        Conj::Row(e) => {
                            if !decoded {
                                lf.decode(i, &needed, &mut row).map_err(|_| unreadable(i))?;
                                decoded = true;
                            }
                            match e.eval(&row)? {
                                Value::Bool(true) => {}
                                Value::Bool(false) => continue 'rows,
                                _ => all_true = false,
                            }
                        }
                    }
                }
                if all_true {
                    // The join filter last: every conjunct was evaluated on this row,
                    // as without it.
                    if !jf.row(&lf, i).map_err(|_| bad(UNREADABLE))? {
                        continue 'rows;
                    }
                    if !decoded {
                        lf.decode(i, &needed, &mut row).map_err(|_| unreadable(i))?;
                    }
                    if !sink(&row)? {
                        go = false;
                        return Ok(false);
                    }
                }
            }
            for (t, u) in per.drain(..) {
                bits.give(t);
                bits.give(u);
            }
            Ok(true)
        })?;
        jf.count();
        Ok(go)
    }

    /// The view of `leaf` with every column the scan reads (a packed leaf expanded whole).
    fn whole_view<'s>(&'s self, leaf: &'s LeafPage<'s>, sc: &'s mut Scratch) -> std::result::Result<LeafView<'s>, &'static str> {
        let schema = &self.table.schema;
        let Scratch { img, at, fill, .. } = sc;
        let (page, hdr) = match leaf {
            LeafPage::Plain(page, hdr) => (*page, *hdr),
            LeafPage::Packed(pl) => {
                fill.clear();
                fill.extend(self.need.iter().map(|&x| if x { Fill::All } else { Fill::No }));
                let hdr = pl.expand(schema, fill, &[], img).map_err(|_| "impossible packed leaf")?;
                (&img[..], hdr)
            }
        };
        column_offsets(schema, hdr.cap, at);
        Ok(LeafView { page, leaf: hdr, at, schema })
    }
}

/// A join's filter as a scan applies it (see [`super::keyfilter`]): while it drops enough
/// rows to pay for itself (at least one in [`JOIN_FILTER_MIN_DROP`] of the first
/// [`JOIN_FILTER_PROBATION`] rows it tests).
struct JoinFiltering {
    filter: Option<std::sync::Arc<KeyFilter>>,
    kb: Vec<u8>,
    tested: u64,
    dropped: u64,
}

impl JoinFiltering {
    fn new(filter: Option<std::sync::Arc<KeyFilter>>) -> JoinFiltering {
        JoinFiltering { filter, kb: Vec::new(), tested: 0, dropped: 0 }
    }

    fn tested(&mut self, tested: u64, dropped: u64) {
        self.tested += tested;
        self.dropped += dropped;
        if self.tested >= JOIN_FILTER_PROBATION && self.dropped * JOIN_FILTER_MIN_DROP < self.tested {
            self.filter = None;
        }
    }

    /// Clears the bits of `all` whose rows cannot join.
    fn leaf(&mut self, lf: &LeafView<'_>, all: &mut [u64]) -> std::result::Result<(), Bad> {
        if let Some(f) = &self.filter {
            let (t, d) = key_filter(f, lf, all, &mut self.kb)?;
            self.tested(t, d);
        }
        Ok(())
    }

    /// Whether row `i` may join.
    fn row(&mut self, lf: &LeafView<'_>, i: usize) -> std::result::Result<bool, Bad> {
        let Some(f) = &self.filter else { return Ok(true) };
        let ok = key_may_match(f, lf, i, &mut self.kb)?;
        self.tested(1, !ok as u64);
        Ok(ok)
    }

    /// Adds the rows dropped to the process-wide counter.
    fn count(&self) {
        super::counters::JOIN_FILTERED_ROWS.fetch_add(self.dropped, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Whether row `i`'s key may be in the join's build side (a NULL key matches nothing).
#[inline]
fn key_may_match(kf: &KeyFilter, lf: &LeafView<'_>, i: usize, kb: &mut Vec<u8>) -> std::result::Result<bool, Bad> {
    kb.clear();
    for &c in &kf.cols {
        if lf.is_null(c, i) {
            return Ok(false);
        }
        lf.encode_col(c, i, kb)?;
    }
    Ok(kf.may_contain(key_hash(kb)))
}

/// Rows a join filter is tested on before it may be given up.
const JOIN_FILTER_PROBATION: u64 = 1 << 14;
/// A join filter is given up if it dropped fewer than one row in this many.
const JOIN_FILTER_MIN_DROP: u64 = 16;

/// Clears the bits of `all` whose rows' keys cannot be in the join's build side; returns
/// how many rows it tested and how many it cleared.
fn key_filter(kf: &KeyFilter, lf: &LeafView<'_>, all: &mut [u64], kb: &mut Vec<u8>) -> std::result::Result<(u64, u64), Bad> {
    // One integer or date column (most join keys): the hash from the value.
    if let [c] = kf.cols[..] {
        let ty = lf.schema.columns[c].ty;
        if matches!(ty, ColumnType::I64 | ColumnType::Date) {
            let hash = |i: usize| if ty == ColumnType::I64 { i64_key_hash(lf.i64_at(c, i)) } else { date_key_hash(lf.date_at(c, i)) };
            return Ok(clear_unmatched(all, |w| lf.null_word(c, w), |i| kf.may_contain(hash(i))));
        }
    }
    // Two integer columns: the hash from the values.
    if let [c, d] = kf.cols[..] {
        if lf.schema.columns[c].ty == ColumnType::I64 && lf.schema.columns[d].ty == ColumnType::I64 {
            let nulls = |w: usize| lf.null_word(c, w) | lf.null_word(d, w);
            return Ok(clear_unmatched(all, nulls, |i| kf.may_contain(i64_pair_key_hash(lf.i64_at(c, i), lf.i64_at(d, i)))));
        }
    }
    // Integer, double and date columns: the key's encoding on the stack.
    if kf.cols.len() <= 8 && kf.cols.iter().all(|&c| matches!(lf.schema.columns[c].ty, ColumnType::I64 | ColumnType::F64 | ColumnType::Date)) {
        let key = |i: usize| {
            let mut h = FixedKeyHash::default();
            for &c in &kf.cols {
                match lf.schema.columns[c].ty {
                    ColumnType::I64 => h.push(fixed_i64(lf.i64_at(c, i)), 9),
                    ColumnType::F64 => h.push(fixed_f64(lf.f64_at(c, i)), 9),
                    _ => h.push(fixed_date(lf.date_at(c, i)), 5),
                }
            }
            h.finish()
        };
        let nulls = |w: usize| kf.cols.iter().fold(0, |n, &c| n | lf.null_word(c, w));
        return Ok(clear_unmatched(all, nulls, |i| kf.may_contain(key(i))));
    }
    let (mut tested, mut dropped) = (0, 0);
    for (w, x) in all.iter_mut().enumerate() {
        let mut rest = *x;
        while rest != 0 {
            let b = rest.trailing_zeros() as usize;
            rest &= rest - 1;
            tested += 1;
            if !key_may_match(kf, lf, w * 64 + b, kb)? {
                *x &= !(1u64 << b);
                dropped += 1;
            }
        }
    }
    Ok((tested, dropped))
}

/// Clears the bits of `all` whose rows are NULL (`nulls(w)`: the NULL bits of word `w`) or
/// fail `test`; returns how many rows it tested and how many it cleared.
#[inline]
fn clear_unmatched(all: &mut [u64], nulls: impl Fn(usize) -> u64, test: impl Fn(usize) -> bool) -> (u64, u64) {
    let (mut tested, mut dropped) = (0, 0);
    for (w, x) in all.iter_mut().enumerate() {
        if *x == 0 {
            continue;
        }
        let n = nulls(w);
        let mut keep = *x & !n;
        let mut rest = keep;
        tested += x.count_ones() as u64;
        while rest != 0 {
            let b = rest.trailing_zeros() as usize;
            rest &= rest - 1;
            if !test(w * 64 + b) {
                keep &= !(1u64 << b);
            }
        }
        dropped += (*x & !keep).count_ones() as u64;
        *x = keep;
    }
    (tested, dropped)
}

/// A leaf's rows that passed the scan filter (see [`ColScan::run_batches`]).
pub struct Batch<'a> {
    pub(crate) lf: LeafView<'a>,
    /// The rows, by index within the leaf, in order.
    pub sel: &'a [u32],
    bad: &'a dyn Fn(&str) -> Error,
}

impl Batch<'_> {
    /// Decodes the `cols` of row `i` of the leaf into `row`.
    pub fn decode(&self, i: usize, cols: &[usize], row: &mut [Value]) -> Result<()> {
        self.lf.decode(i, cols, row).map_err(|_| (self.bad)(&format!("row {} is unreadable", self.lf.leaf.first + i as u64)))
    }

    /// Appends the encoding of the `cols` of row `i` ([`encode_value`](super::rows::encode_value)
    /// of each, in order) straight from the leaf's bytes.
    pub(crate) fn encode(&self, i: usize, cols: &[usize], out: &mut Vec<u8>) -> Result<()> {
        for &c in cols {
            self.lf.encode_col(c, i, out).map_err(|_| (self.bad)(&format!("row {} is unreadable", self.lf.leaf.first + i as u64)))?;
        }
        Ok(())
    }
}

impl ColScan {
    /// Whether the whole filter is evaluated leaf-wise (then [`run_batches`](Self::run_batches)
    /// may be used).
    pub fn batchable(&self) -> bool {
        self.conjs.iter().all(|c| matches!(c, Conj::Vec(_)))
    }

    /// The columns decoded for the consumers.
    pub fn needed(&self) -> Vec<usize> {
        (0..self.out.len()).filter(|&c| self.out[c]).collect()
    }

    /// Hands the rows that pass the filter to `f` a leaf at a time, until it returns false.
    /// Only for a [`batchable`](Self::batchable) scan.
    pub fn run_batches(&self, bm: &BufferManager, f: &mut dyn FnMut(&Batch<'_>) -> Result<bool>) -> Result<bool> {
        self.run_batches_range(bm, 0, self.table.rows(bm)?, f)
    }

    /// [`run_batches`](Self::run_batches) over the rows with ids in `from..to` (a morsel).
    pub fn run_batches_range(&self, bm: &BufferManager, from: u64, to: u64, f: &mut dyn FnMut(&Batch<'_>) -> Result<bool>) -> Result<bool> {
        debug_assert!(self.batchable());
        let mut scratch = Scratch::default();
        let mut bits = Bits::default();
        let mut sel: Vec<u32> = Vec::new();
        let mut go = true;
        let mut jf = JoinFiltering::new(self.keys.get());
        self.table.scan_pages(bm, from, (to != u64::MAX).then_some(to), Some(&self.need), &mut |pid, leaf, start| {
            if leaf.first() >= to {
                return Ok(false);
            }
            // Rows at and above `to` belong to the next morsel.
            let end = leaf.count().min(usize::try_from(to - leaf.first()).unwrap_or(usize::MAX));
            if start >= end {
                return Ok(true);
            }
            let bad = |what: &str| self.table.corrupt_leaf(bm, pid, what);
            let Some((lf, mut all)) = self.filter_leaf(&leaf, start, end, &mut bits, &mut scratch).map_err(&bad)? else {
                return Ok(true);
            };
            jf.leaf(&lf, &mut all).map_err(|_| bad("a value is unreadable"))?;
            sel.clear();
            sel.extend(crate::util::set_bits(&all).map(|i| i as u32));
            bits.give(all);
            if sel.is_empty() {
                return Ok(true);
            }
            let more = f(&Batch { lf, sel: &sel, bad: &bad })?;
            go = more;
            Ok(more)
        })?;
        jf.count();
        Ok(go)
    }

    /// Filters rows `start .. end` of `leaf` with the leaf-wise conjuncts and returns the
    /// view the rows are read from with the bitmap of those that pass (`None` if none
    /// does). A packed leaf's conjuncts are evaluated on its columns as stored where they
    /// can be ([`stored`]); then only the columns read are expanded: those of the
    /// conjuncts left, whole; the consumers' ones, whole or (when few rows passed) only at
    /// the rows that passed.
    fn filter_leaf<'s>(
        &'s self,
        leaf: &'s LeafPage<'s>,
        start: usize,
        end: usize,
        bits: &mut Bits,
        sc: &'s mut Scratch,
    ) -> std::result::Result<Option<(LeafView<'s>, Vec<u64>)>, &'static str> {
        let schema = &self.table.schema;
        let n = leaf.count();
        let words = n.div_ceil(64);
        let Scratch { img, at, fill, later } = sc;
        let mut all = bits.take(words, !0);
        mask_range(&mut all, start, end);
        // ANDs a conjunct's true bits into `all` (giving its bitmaps back); true if no row
        // is left.
        let and_into = |all: &mut [u64], bits: &mut Bits, t: Vec<u64>, u: Option<Vec<u64>>| {
            for (a, x) in all.iter_mut().zip(&t) {
                *a &= x;
            }
            bits.give(t);
            if let Some(u) = u {
                bits.give(u);
            }
            all.iter().all(|&w| w == 0)
        };
        let (page, hdr) = match leaf {
            LeafPage::Plain(page, hdr) => (*page, *hdr),
            LeafPage::Packed(pl) => {
                later.clear();
                fill.clear();
                fill.resize(schema.len(), Fill::No);
                {
                    let mut st = stored::Stored::new(pl, schema.len());
                    for g in &self.groups {
                        let preds = g.iter().filter_map(|&k| if let Conj::Vec(p) = &self.conjs[k] { Some(p) } else { None });
                        if let Some(t) = stored::eval_range(preds.clone(), &mut st, schema, bits, words, &all).map_err(|_| UNREADABLE)? {
                            if and_into(&mut all, bits, t, None) {
                                bits.give(all);
                                return Ok(None);
                            }
                            continue;
                        }
                        for (&k, p) in g.iter().zip(preds) {
                            match p.eval_stored(&mut st, schema, bits, words).map_err(|_| UNREADABLE)? {
                                Some((t, u)) => {
                                    if and_into(&mut all, bits, t, Some(u)) {
                                        bits.give(all);
                                        return Ok(None);
                                    }
                                }
                                None => {
                                    later.push(k);
                                    let mut cols = Vec::new();
                                    p.cols(&mut cols);
                                    for c in cols {
                                        fill[c] = Fill::All;
                                    }
                                }
                            }
                        }
                    }
                    // Few rows left: decode the consumers' columns at those rows only.
                    let passed: usize = all.iter().map(|w| w.count_ones() as usize).sum();
                    let how = if passed * SPARSE_SHARE <= n { Fill::Rows } else { Fill::All };
                    for (c, f) in fill.iter_mut().enumerate() {
                        if self.out[c] && *f == Fill::No {
                            *f = how;
                        }
                    }
                }
                let hdr = pl.expand(schema, fill, &all, img).map_err(|_| "impossible packed leaf")?;
                (&img[..], hdr)
            }
        };
        column_offsets(schema, hdr.cap, at);
        let lf = LeafView { page, leaf: hdr, at, schema };
        let packed = matches!(leaf, LeafPage::Packed(_));
        for (k, c) in self.conjs.iter().enumerate() {
            let Conj::Vec(p) = c else { continue };
            if packed && !later.contains(&k) {
                continue;
            }
            let (t, u) = p.eval(&lf, bits, words).map_err(|_| UNREADABLE)?;
            if and_into(&mut all, bits, t, Some(u)) {
                break;
            }
        }
        Ok(Some((lf, all)))
    }
}

/// What a value that cannot be read makes of a leaf.
const UNREADABLE: &str = "a value is unreadable";

/// Rows that pass per leaf row below which a packed leaf's consumer columns are decoded
/// only at the rows that passed (1 in 4).
const SPARSE_SHARE: usize = 4;

/// A scan's buffers, reused from leaf to leaf.
#[derive(Default)]
struct Scratch {
    /// A packed leaf's expansion.
    img: Vec<u8>,
    /// Column offsets of the leaf read.
    at: Vec<(usize, usize)>,
    fill: Vec<Fill>,
    /// Conjuncts left to evaluate on the expanded leaf.
    later: Vec<usize>,
}

/// Clears the bits at and above `n`.
/// Clears the bits of rows below `start` and at or above `end`.
fn mask_range(v: &mut [u64], start: usize, end: usize) {
    mask_tail(v, end);
    for (w, x) in v.iter_mut().enumerate() {
        if (w + 1) * 64 <= start {
            *x = 0;
        } else if w * 64 < start {
            *x &= !0u64 << (start % 64);
        }
    }
}

fn mask_tail(v: &mut [u64], n: usize) {
    for (w, x) in v.iter_mut().enumerate() {
        if w * 64 >= n {
            *x = 0;
        } else if (w + 1) * 64 > n {
            *x &= (1u64 << (n % 64)) - 1;
        }
    }
}

/// A free list of bitmaps (a leaf's worth of words each).
#[derive(Default)]
struct Bits {
    free: Vec<Vec<u64>>,
}

impl Bits {
    fn take(&mut self, words: usize, fill: u64) -> Vec<u64> {
        let mut v = self.free.pop().unwrap_or_default();
        v.clear();
        v.resize(words, fill);
        v
    }
    fn give(&mut self, v: Vec<u64>) {
        self.free.push(v);
    }
}

/// Reading a leaf's columns.
pub(crate) struct LeafView<'a> {
    page: &'a [u8],
    leaf: Leaf,
    /// Per column: where its null bitmap and its values start.
    at: &'a [(usize, usize)],
    pub(crate) schema: &'a Schema,
}

/// A value that cannot be read (an impossible string offset, a bad boolean or UTF-8).
pub(crate) struct Bad;

impl<'a> LeafView<'a> {
    pub(crate) fn null_word(&self, col: usize, w: usize) -> u64 {
        let at = self.at[col].0 + w * 8;
        u64::from_le_bytes(self.page[at..at + 8].try_into().unwrap())
    }
    pub(crate) fn is_null(&self, col: usize, i: usize) -> bool {
        self.page[self.at[col].0 + i / 8] >> (i % 8) & 1 == 1
    }
    pub(crate) fn i64_at(&self, col: usize, i: usize) -> i64 {
        let at = self.at[col].1 + i * 8;
        i64::from_le_bytes(self.page[at..at + 8].try_into().unwrap())
    }
    pub(crate) fn f64_at(&self, col: usize, i: usize) -> f64 {
        f64::from_bits(self.i64_at(col, i) as u64)
    }
    /// Whether any of the rows `sel` (ascending) of `col` is NULL: one word of the bitmap
    /// per 64 rows of their span.
    pub(crate) fn any_null(&self, col: usize, sel: &[u32]) -> bool {
        let (Some(&a), Some(&z)) = (sel.first(), sel.last()) else { return false };
        let (a, z) = (a as usize, z as usize);
        let (wa, wz) = (a / 64, z / 64);
        (wa..=wz).any(|w| {
            let mut x = self.null_word(col, w);
            if w == wa {
                x &= !0u64 << (a % 64);
            }
            if w == wz && z % 64 < 63 {
                x &= (1u64 << (z % 64 + 1)) - 1;
            }
            x != 0
        })
    }
    /// The 8-byte values of `col` at the rows `sel` (ascending), each read as a
    /// little-endian word and mapped by `f`, into `out` (cleared first); a run of consecutive rows is one slice of the column.
    pub(crate) fn gather8<T>(&self, col: usize, sel: &[u32], out: &mut Vec<T>, f: impl Fn(u64) -> T) {
        out.clear();
        let (Some(&a), Some(&z)) = (sel.first(), sel.last()) else { return };
        let at = self.at[col].1;
        if (z - a) as usize + 1 == sel.len() {
            let src = &self.page[at + a as usize * 8..at + (z as usize + 1) * 8];
            out.extend(src.chunks_exact(8).map(|c| f(u64::from_le_bytes(c.try_into().unwrap()))));
        } else {
            let col = &self.page[at..at + (z as usize + 1) * 8];
            out.extend(sel.iter().map(|&i| f(u64::from_le_bytes(col[i as usize * 8..i as usize * 8 + 8].try_into().unwrap()))));
        }
    }
    /// Writes a code of the value of `col` at each row of `sel` into `out` (one per row): a
    /// code that no other value of the column's type shares, in 64 bits (an integer, date or
    /// boolean itself; a string's length and its at most 7 bytes). A row whose value has no
    /// code (NULL, a longer string, an unreadable boolean) gets `false` in `ok`; `false` if
    /// the column's type has no codes at all (doubles).
    pub(crate) fn small_codes(&self, col: usize, sel: &[u32], out: &mut [u64], ok: &mut [bool]) -> bool {
        let at = self.at[col].1;
        let p = self.page;
        match self.schema.columns[col].ty {
            ColumnType::I64 => {
                for (o, &i) in out.iter_mut().zip(sel) {
                    *o = self.i64_at(col, i as usize) as u64;
                }
            }
            ColumnType::Date => {
                for (o, &i) in out.iter_mut().zip(sel) {
                    *o = self.date_at(col, i as usize) as u32 as u64;
                }
            }
            ColumnType::Bool => {
                for ((o, k), &i) in out.iter_mut().zip(ok.iter_mut()).zip(sel) {
                    match self.bool_at(col, i as usize) {
                        Ok(b) => *o = b as u64,
                        Err(Bad) => *k = false,
                    }
                }
            }
            ColumnType::Str | ColumnType::Bytes => {
                let Some(&z) = sel.last() else { return true };
                let Some(headers) = p.get(at..at + (z as usize + 1) * 16) else {
                    ok.fill(false);
                    return true;
                };
                for ((o, k), &i) in out.iter_mut().zip(ok.iter_mut()).zip(sel) {
                    // The 16-byte header: the length, then (at most 12 bytes) the string.
                    // No branch on the length: a longer string's code is not `ok`.
                    let h = i as usize * 16;
                    let w = u128::from_le_bytes(headers[h..h + 16].try_into().unwrap());
                    let len = w as u32;
                    *k &= len <= 7;
                    let bytes = (w >> 32) as u64 & ((1u64 << (8 * len.min(7))) - 1);
                    *o = len as u64 | bytes << 8;
                }
            }
            ColumnType::F64 => return false,
        }
        if self.any_null(col, sel) {
            for (k, &i) in ok.iter_mut().zip(sel) {
                if self.is_null(col, i as usize) {
                    *k = false;
                }
            }
        }
        true
    }
    pub(crate) fn date_at(&self, col: usize, i: usize) -> i32 {
        let at = self.at[col].1 + i * 4;
        i32::from_le_bytes(self.page[at..at + 4].try_into().unwrap())
    }
    pub(crate) fn bool_at(&self, col: usize, i: usize) -> std::result::Result<bool, Bad> {
        match self.page[self.at[col].1 + i] {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(Bad),
        }
    }
    /// The bytes of string (or bytes) value `i` of `col`, borrowed from the page.
    pub(crate) fn bytes_at(&self, col: usize, i: usize) -> std::result::Result<&'a [u8], Bad> {
        let h = self.at[col].1 + i * 16;
        let p = self.page;
        let len = u32::from_le_bytes(p[h..h + 4].try_into().unwrap()) as usize;
        if len <= 12 {
            return Ok(&p[h + 4..h + 4 + len]);
        }
        let off = u64::from_le_bytes(p[h + 8..h + 16].try_into().unwrap()) as usize;
        if off < self.leaf.var || off.checked_add(len).is_none_or(|e| e > p.len()) || p[off..off + 4] != p[h + 4..h + 8] {
            return Err(Bad);
        }
        Ok(&p[off..off + len])
    }
    /// Value `i` of `col` (not NULL) as a [`Value`] (for the general comparisons).
    pub(crate) fn value_at(&self, col: usize, i: usize) -> std::result::Result<Value, Bad> {
        Ok(match self.schema.columns[col].ty {
            ColumnType::I64 => Value::I64(self.i64_at(col, i)),
            ColumnType::F64 => Value::F64(self.f64_at(col, i)),
            ColumnType::Date => Value::Date(self.date_at(col, i)),
            ColumnType::Bool => Value::Bool(self.bool_at(col, i)?),
            ColumnType::Str => Value::Str(std::str::from_utf8(self.bytes_at(col, i)?).map_err(|_| Bad)?.to_owned()),
            ColumnType::Bytes => Value::Bytes(self.bytes_at(col, i)?.to_vec()),
        })
    }

    /// Value `i` of `col` borrowed from the leaf (NULL included).
    pub(crate) fn value_ref_at(&self, col: usize, i: usize) -> std::result::Result<ValueRef<'a>, Bad> {
        if self.is_null(col, i) {
            return Ok(ValueRef::Null);
        }
        Ok(match self.schema.columns[col].ty {
            ColumnType::I64 => ValueRef::I64(self.i64_at(col, i)),
            ColumnType::F64 => ValueRef::F64(self.f64_at(col, i)),
            ColumnType::Date => ValueRef::Date(self.date_at(col, i)),
            ColumnType::Bool => ValueRef::Bool(self.bool_at(col, i)?),
            ColumnType::Str => ValueRef::Str(std::str::from_utf8(self.bytes_at(col, i)?).map_err(|_| Bad)?),
            ColumnType::Bytes => ValueRef::Bytes(self.bytes_at(col, i)?),
        })
    }

    /// Appends the encoding of value `i` of `col` (NULL included; the bytes of
    /// [`encode_ref`] of it) straight from the leaf. A string's bytes go in as they are: no
    /// UTF-8 check per row (an encoded key is checked where it is decoded).
    pub(crate) fn encode_col(&self, col: usize, i: usize, out: &mut Vec<u8>) -> std::result::Result<(), Bad> {
        if self.schema.columns[col].ty == ColumnType::Str && !self.is_null(col, i) {
            encode_str_bytes(self.bytes_at(col, i)?, out);
            return Ok(());
        }
        encode_ref(self.value_ref_at(col, i)?, out);
        Ok(())
    }

    /// Decodes the `cols` of row `i` into `row` (reusing its strings' buffers).
    pub(crate) fn decode(&self, i: usize, cols: &[usize], row: &mut [Value]) -> std::result::Result<(), Bad> {
        for &c in cols {
            let slot = &mut row[c];
            if self.is_null(c, i) {
                *slot = Value::Null;
                continue;
            }
            match self.schema.columns[c].ty {
                ColumnType::I64 => *slot = Value::I64(self.i64_at(c, i)),
                ColumnType::F64 => *slot = Value::F64(self.f64_at(c, i)),
                ColumnType::Date => *slot = Value::Date(self.date_at(c, i)),
                ColumnType::Bool => *slot = Value::Bool(self.bool_at(c, i)?),
                ColumnType::Str => slot.set_str(std::str::from_utf8(self.bytes_at(c, i)?).map_err(|_| Bad)?),
                ColumnType::Bytes => slot.set_bytes(self.bytes_at(c, i)?),
            }
        }
        Ok(())
    }
}

/// Sets bit `i` of `out` for each row `i < n` where `f(i)`.
#[inline]
fn bits_by(n: usize, out: &mut [u64], mut f: impl FnMut(usize) -> bool) {
    for (w, o) in out.iter_mut().enumerate() {
        let base = w * 64;
        let end = (n - base).min(64);
        let mut x = 0u64;
        for j in 0..end {
            x |= (f(base + j) as u64) << j;
        }
        *o = x;
    }
}

/// Sets bit `i` of `out` for each of the first `n` values of `vals` (`N`-byte
/// little-endian words, decoded by `read`) where `pred` holds: the column-at-a-time kernel
/// of the comparisons with a literal. `Err` if the page holds fewer than `n` values.
#[inline]
fn bits_of<const N: usize, T: Copy>(
    vals: &[u8],
    n: usize,
    out: &mut [u64],
    read: impl Fn([u8; N]) -> T,
    pred: impl Fn(T) -> bool,
) -> std::result::Result<(), Bad> {
    let vals = vals.get(..n * N).ok_or(Bad)?;
    for (o, chunk) in out.iter_mut().zip(vals.chunks(64 * N)) {
        let mut x = 0u64;
        for (j, v) in chunk.chunks_exact(N).enumerate() {
            let v: [u8; N] = v.try_into().expect("chunks_exact");
            x |= (pred(read(v)) as u64) << j;
        }
        *o = x;
    }
    Ok(())
}

/// [`bits_of`] for `value op y`, with the operator chosen once for the whole column
/// (`cmp` orders a value against `y`; floats compare as `partial_cmp` does: NaN never
/// satisfies a comparison).
#[inline]
fn cmp_bits<const N: usize, T: Copy + PartialOrd>(
    vals: &[u8],
    n: usize,
    out: &mut [u64],
    read: impl Fn([u8; N]) -> T,
    op: CmpOp,
    y: T,
) -> std::result::Result<(), Bad> {
    match op {
        CmpOp::Eq => bits_of(vals, n, out, read, |v| v == y),
        CmpOp::Ne => bits_of(vals, n, out, read, |v| v.partial_cmp(&y).is_some_and(|o| o != Ordering::Equal)),
        CmpOp::Lt => bits_of(vals, n, out, read, |v| v < y),
        CmpOp::Le => bits_of(vals, n, out, read, |v| v <= y),
        CmpOp::Gt => bits_of(vals, n, out, read, |v| v > y),
        CmpOp::Ge => bits_of(vals, n, out, read, |v| v >= y),
    }
}

/// Sets bit `i` of `out` for each pair of values of `a` and `b` (`N`-byte little-endian
/// words, decoded by `read`, as many as `out` has bits for) where `pred` holds.
#[inline]
fn pairs_bits<const N: usize, T: Copy>(a: &[u8], b: &[u8], out: &mut [u64], read: impl Fn([u8; N]) -> T, pred: impl Fn(T, T) -> bool) {
    for ((o, ca), cb) in out.iter_mut().zip(a.chunks(64 * N)).zip(b.chunks(64 * N)) {
        let mut x = 0u64;
        for (j, (va, vb)) in ca.chunks_exact(N).zip(cb.chunks_exact(N)).enumerate() {
            let (va, vb): ([u8; N], [u8; N]) = (va.try_into().expect("chunks_exact"), vb.try_into().expect("chunks_exact"));
            x |= (pred(read(va), read(vb)) as u64) << j;
        }
        *o = x;
    }
}

/// Sets bit `i` of `out` for each of the first `n` rows where `a[i] op b[i]` (two columns'
/// `N`-byte values; floats compare as `partial_cmp` does). `Err` if the page holds fewer
/// than `n` values of either.
#[inline]
fn cmp_cols_bits<const N: usize, T: Copy + PartialOrd>(
    a: &[u8],
    b: &[u8],
    n: usize,
    out: &mut [u64],
    read: impl Fn([u8; N]) -> T,
    op: CmpOp,
) -> std::result::Result<(), Bad> {
    let (a, b) = (a.get(..n * N).ok_or(Bad)?, b.get(..n * N).ok_or(Bad)?);
    match op {
        CmpOp::Eq => pairs_bits(a, b, out, read, |x, y| x == y),
        CmpOp::Ne => pairs_bits(a, b, out, read, |x, y| x.partial_cmp(&y).is_some_and(|o| o != Ordering::Equal)),
        CmpOp::Lt => pairs_bits(a, b, out, read, |x, y| x < y),
        CmpOp::Le => pairs_bits(a, b, out, read, |x, y| x <= y),
        CmpOp::Gt => pairs_bits(a, b, out, read, |x, y| x > y),
        CmpOp::Ge => pairs_bits(a, b, out, read, |x, y| x >= y),
    }
    Ok(())
}

/// Like [`bits_by`] for a test that can fail.
fn try_bits_by(n: usize, out: &mut [u64], mut f: impl FnMut(usize) -> std::result::Result<bool, Bad>) -> std::result::Result<(), Bad> {
    for (w, o) in out.iter_mut().enumerate() {
        let base = w * 64;
        let end = (n - base).min(64);
        let mut x = 0u64;
        for j in 0..end {
            x |= (f(base + j)? as u64) << j;
        }
        *o = x;
    }
    Ok(())
}

impl VPred {
    /// Appends the columns the predicate reads to `out`.
    fn cols(&self, out: &mut Vec<usize>) {
        match self {
            VPred::Const(_) => {}
            VPred::CmpLit { col, .. } | VPred::IsNull { col, .. } | VPred::BoolCol(col) | VPred::InList { col, .. } | VPred::Like { col, .. } => out.push(*col),
            VPred::CmpCols { a, b, .. } => out.extend([*a, *b]),
            VPred::And(a, b) | VPred::Or(a, b) => {
                a.cols(out);
                b.cols(out);
            }
            VPred::Not(a) => a.cols(out),
        }
    }

    /// (true, unknown) bitmaps over the leaf's rows (bits at and above the row count are
    /// meaningless).
    fn eval(&self, lf: &LeafView<'_>, bits: &mut Bits, words: usize) -> std::result::Result<(Vec<u64>, Vec<u64>), Bad> {
        let n = lf.leaf.count;
        let mut t = bits.take(words, 0);
        let mut u = bits.take(words, 0);
        let nulls = |u: &mut Vec<u64>, col: usize| {
            for (w, x) in u.iter_mut().enumerate() {
                *x = lf.null_word(col, w);
            }
        };
        match self {
            VPred::Const(Some(true)) => t.fill(!0),
            VPred::Const(Some(false)) => {}
            VPred::Const(None) => u.fill(!0),
            VPred::CmpLit { col, op, lit } => {
                let (col, op) = (*col, *op);
                let vals = lf.page.get(lf.at[col].1..).ok_or(Bad)?;
                match (lf.schema.columns[col].ty, lit) {
                    (ColumnType::I64, Value::I64(y)) => cmp_bits(vals, n, &mut t, i64::from_le_bytes, op, *y)?,
                    (ColumnType::F64, Value::F64(y)) => cmp_bits(vals, n, &mut t, f64::from_le_bytes, op, *y)?,
                    // An i64 within ±2^53 converts to f64 exactly, so the comparison is the
                    // exact one of `compare`.
                    (ColumnType::F64, Value::I64(y)) if y.unsigned_abs() <= 1 << 53 => cmp_bits(vals, n, &mut t, f64::from_le_bytes, op, *y as f64)?,
                    (ColumnType::Date, Value::Date(y)) => cmp_bits(vals, n, &mut t, i32::from_le_bytes, op, *y)?,
                    (ColumnType::Str, Value::Str(y)) => {
                        let y = y.as_bytes();
                        try_bits_by(n, &mut t, |i| Ok(lf.is_null(col, i) || op.holds(lf.bytes_at(col, i)?.cmp(y))))?
                    }
                    (ColumnType::Bytes, Value::Bytes(y)) => try_bits_by(n, &mut t, |i| Ok(lf.is_null(col, i) || op.holds(lf.bytes_at(col, i)?.cmp(y))))?,
                    _ => try_bits_by(n, &mut t, |i| Ok(!lf.is_null(col, i) && compare(&lf.value_at(col, i)?, lit).is_some_and(|o| op.holds(o))))?,
                }
                nulls(&mut u, col);
                for (a, x) in t.iter_mut().zip(&u) {
                    *a &= !x;
                }
            }
            VPred::CmpCols { a, op, b } => {
                let (a, b, op) = (*a, *b, *op);
                let (va, vb) = (lf.page.get(lf.at[a].1..).ok_or(Bad)?, lf.page.get(lf.at[b].1..).ok_or(Bad)?);
                match lf.schema.columns[a].ty {
                    ColumnType::I64 => cmp_cols_bits(va, vb, n, &mut t, i64::from_le_bytes, op)?,
                    ColumnType::F64 => cmp_cols_bits(va, vb, n, &mut t, f64::from_le_bytes, op)?,
                    ColumnType::Date => cmp_cols_bits(va, vb, n, &mut t, i32::from_le_bytes, op)?,
                    ColumnType::Str | ColumnType::Bytes => {
                        try_bits_by(n, &mut t, |i| Ok(lf.is_null(a, i) || lf.is_null(b, i) || op.holds(lf.bytes_at(a, i)?.cmp(lf.bytes_at(b, i)?))))?
                    }
                    ColumnType::Bool => {
                        try_bits_by(n, &mut t, |i| Ok(lf.is_null(a, i) || lf.is_null(b, i) || op.holds(lf.bool_at(a, i)?.cmp(&lf.bool_at(b, i)?))))?
                    }
                }
                for (w, x) in u.iter_mut().enumerate() {
                    *x = lf.null_word(a, w) | lf.null_word(b, w);
                }
                for (a, x) in t.iter_mut().zip(&u) {
                    *a &= !x;
                }
            }
            VPred::IsNull { col, negated } => {
                nulls(&mut t, *col);
                if *negated {
                    for x in t.iter_mut() {
                        *x = !*x;
                    }
                }
            }
            VPred::BoolCol(col) => {
                let col = *col;
                try_bits_by(n, &mut t, |i| Ok(!lf.is_null(col, i) && lf.bool_at(col, i)?))?;
                nulls(&mut u, col);
            }
            VPred::InList { col, prefix, lits, has_null, negated } => {
                let col = *col;
                // Bit set: the value equals a constant of the list.
                let mut found = bits.take(words, 0);
                let r = match lf.schema.columns[col].ty {
                    ColumnType::Str | ColumnType::Bytes => {
                        let keys = byte_keys(lits);
                        try_bits_by(n, &mut found, |i| {
                            Ok(!lf.is_null(col, i) && {
                                let b = lf.bytes_at(col, i)?;
                                keys.contains(&char_prefix(b, *prefix))
                            })
                        })
                    }
                    ColumnType::I64 if lits.iter().all(|v| matches!(v, Value::I64(_))) => {
                        let keys: Vec<i64> = lits.iter().filter_map(|v| if let Value::I64(x) = v { Some(*x) } else { None }).collect();
                        bits_by(n, &mut found, |i| keys.contains(&lf.i64_at(col, i)));
                        Ok(())
                    }
                    _ => try_bits_by(n, &mut found, |i| {
                        Ok(!lf.is_null(col, i) && {
                            let v = lf.value_at(col, i)?;
                            lits.iter().any(|l| compare(&v, l) == Some(Ordering::Equal))
                        })
                    }),
                };
                if r.is_err() {
                    bits.give(found);
                    return Err(Bad);
                }
                nulls(&mut u, col);
                in_list_bits(&found, &mut t, &mut u, *has_null, *negated);
                bits.give(found);
            }
            VPred::Like { col, pattern, negated } => {
                let col = *col;
                try_bits_by(n, &mut t, |i| Ok(!lf.is_null(col, i) && (pattern.matches(lf.bytes_at(col, i)?).ok_or(Bad)? != *negated)))?;
                nulls(&mut u, col);
            }
            VPred::And(a, b) | VPred::Or(a, b) => {
                let (ta, ua) = a.eval(lf, bits, words)?;
                let (tb, ub) = b.eval(lf, bits, words)?;
                combine(matches!(self, VPred::And(..)), &ta, &ua, &tb, &ub, &mut t, &mut u);
                for v in [ta, ua, tb, ub] {
                    bits.give(v);
                }
            }
            VPred::Not(a) => {
                let (ta, ua) = a.eval(lf, bits, words)?;
                for w in 0..words {
                    t[w] = !ta[w] & !ua[w];
                    u[w] = ua[w];
                }
                bits.give(ta);
                bits.give(ua);
            }
        }
        Ok((t, u))
    }
}

/// The first `k` characters of the UTF-8 string `b` (all of it if `k` is `None` or more
/// than it has): what `SUBSTRING(b FROM 1 FOR k)` gives, found by counting the bytes that
/// start characters.
pub(super) fn char_prefix(b: &[u8], k: Option<usize>) -> &[u8] {
    let Some(k) = k else { return b };
    let end = b.iter().enumerate().filter(|(_, &c)| c & 0xC0 != 0x80).nth(k).map_or(b.len(), |(i, _)| i);
    &b[..end]
}

/// The string and byte constants of an `IN` list, as bytes.
fn byte_keys(lits: &[Value]) -> Vec<&[u8]> {
    lits.iter()
        .filter_map(|v| match v {
            Value::Str(s) => Some(s.as_bytes()),
            Value::Bytes(b) => Some(&b[..]),
            _ => None,
        })
        .collect()
}

/// The (true, unknown) bitmaps of `a AND b` (`and`) or `a OR b` in three-valued logic,
/// from those of `a` and `b`.
fn combine(and: bool, ta: &[u64], ua: &[u64], tb: &[u64], ub: &[u64], t: &mut [u64], u: &mut [u64]) {
    for w in 0..t.len() {
        let (fa, fb) = (!ta[w] & !ua[w], !tb[w] & !ub[w]);
        let (tt, ff) = if and { (ta[w] & tb[w], fa | fb) } else { (ta[w] | tb[w], fa & fb) };
        t[w] = tt;
        u[w] = !tt & !ff;
    }
}

/// The (true, unknown) bitmaps of `x [NOT] IN (list)` into `t` and `u`, from `found` (the
/// value equals a constant of the list) and the NULL rows (in `u` on entry): a non-NULL
/// value found is `!negated`; else NULL if the list has a NULL, else `negated`.
fn in_list_bits(found: &[u64], t: &mut [u64], u: &mut [u64], has_null: bool, negated: bool) {
    for w in 0..t.len() {
        let (f, nl) = (found[w] & !u[w], u[w]);
        let (tt, uu) = if has_null {
            (if negated { 0 } else { f }, nl | !f)
        } else if negated {
            (!f & !nl, nl)
        } else {
            (f, nl)
        };
        t[w] = tt;
        u[w] = uu;
    }
}

/// Where each column of a PAX leaf with room for `cap` rows starts in the page: its NULL
/// bitmap's offset and its values' offset, into `at` (cleared first).
fn column_offsets(schema: &Schema, cap: usize, at: &mut Vec<(usize, usize)>) {
    at.clear();
    let mut off = crate::access::btree::node::HDR;
    for c in &schema.columns {
        at.push((off, off + pax::bitmap_bytes(cap)));
        off += pax::column_bytes(c.ty, cap);
    }
}

/// The number of columns `plan` produces.
pub fn width(plan: &Plan) -> usize {
    match plan {
        Plan::Scan { table, .. } => table.schema.len(),
        Plan::ColScan(s) => s.table.schema.len(),
        Plan::OneRow { .. } => 0,
        Plan::Project { exprs, .. } => exprs.len(),
        Plan::Filter { input, .. } | Plan::Sort { input, .. } | Plan::Limit { input, .. } | Plan::Exists { input, .. } | Plan::Scalars { input, .. } => {
            width(input)
        }
        Plan::Aggregate { aggs, .. } => aggs.len(),
        Plan::HashAggregate { keys, aggs, .. } => keys.len() + aggs.len(),
        Plan::HashJoin { left, kind, right_width, .. } => match kind {
            JoinKind::Inner | JoinKind::Left => width(left) + right_width,
            JoinKind::Semi | JoinKind::Anti | JoinKind::NotExists => width(left),
        },
    }
}

fn mark(e: &BExpr, need: &mut [bool]) {
    let mut cols = Vec::new();
    e.cols(&mut cols);
    for c in cols {
        if let Some(n) = need.get_mut(c) {
            *n = true;
        }
    }
}

/// Rewrites every table scan of `plan` into a [`ColScan`] that decodes only the columns
/// read above it. `need[i]`: column `i` of `plan`'s rows is used by its consumer (the
/// root's consumer uses them all).
pub fn prune(plan: &mut Plan, need: &[bool]) {
    match plan {
        Plan::Scan { name, table, filter } => {
            let mut n = vec![false; table.schema.len()];
            for (i, x) in need.iter().enumerate().take(n.len()) {
                n[i] = *x;
            }
            *plan = Plan::ColScan(Box::new(ColScan::new(std::mem::take(name), table.clone(), filter.take(), n)));
        }
        Plan::ColScan(_) | Plan::OneRow { .. } => {}
        Plan::Project { input, exprs } => {
            // A plain column that nothing above reads needs no input column and becomes a
            // NULL literal (its slot is set once, not copied per row; EXPLAIN shows it as
            // NULL); any other expression is evaluated, so what it reads is needed.
            let mut n = vec![false; width(input)];
            for (i, e) in exprs.iter_mut().enumerate() {
                if matches!(e, BExpr::Col(..)) && !need.get(i).copied().unwrap_or(true) {
                    *e = BExpr::Lit(Value::Null);
                    continue;
                }
                mark(e, &mut n);
            }
            prune(input, &n);
        }
        Plan::Filter { input, pred } => {
            let mut n = need.to_vec();
            n.resize(width(input), false);
            mark(pred, &mut n);
            prune(input, &n);
        }
        Plan::Aggregate { input, aggs } => {
            let mut n = vec![false; width(input)];
            for a in aggs.iter() {
                if let Some(e) = &a.arg {
                    mark(e, &mut n);
                }
            }
            prune(input, &n);
        }
        Plan::HashAggregate { input, keys, aggs } => {
            let mut n = vec![false; width(input)];
            for e in keys.iter().chain(aggs.iter().filter_map(|a| a.arg.as_ref())) {
                mark(e, &mut n);
            }
            prune(input, &n);
        }
        Plan::Sort { input, keys, .. } => {
            let mut n = need.to_vec();
            n.resize(width(input), false);
            for k in keys.iter() {
                if let Some(x) = n.get_mut(k.col) {
                    *x = true;
                }
            }
            prune(input, &n);
        }
        Plan::Limit { input, .. } => {
            let mut n = need.to_vec();
            n.resize(width(input), false);
            prune(input, &n);
        }
        Plan::Exists { input, sub, .. } => {
            let mut n = need.to_vec();
            n.resize(width(input), false);
            prune(input, &n);
            let ns = vec![false; width(sub)];
            prune(sub, &ns);
        }
        Plan::Scalars { subs, input } => {
            // A scalar subquery's value is its first column; EXISTS reads none.
            for sub in subs.iter_mut() {
                let ns: Vec<bool> = (0..width(&sub.plan)).map(|i| i == 0 && !sub.exists).collect();
                prune(&mut sub.plan, &ns);
            }
            prune(input, need);
        }
        Plan::HashJoin { left, right, left_keys, right_keys, residual, keep, .. } => {
            let (lw, rw) = (width(left), width(right));
            let mut all = need.to_vec();
            all.resize(lw + rw, false);
            if let Some(r) = residual {
                mark(r, &mut all);
            }
            // The join's records carry these columns only.
            keep.clone_from(&all);
            let (mut nl, mut nr) = (all[..lw].to_vec(), all[lw..].to_vec());
            for e in left_keys.iter() {
                mark(e, &mut nl);
            }
            for e in right_keys.iter() {
                mark(e, &mut nr);
            }
            prune(left, &nl);
            prune(right, &nr);
        }
    }
}

/// [`prune`] from the root: every column of the result is used.
pub fn optimize(plan: &mut Plan) {
    let n = vec![true; width(plan)];
    prune(plan, &n);
}

/// Lets every aggregation straight over a vectorized scan in `plan` use `threads` workers.
pub fn set_threads(plan: &mut Plan, threads: usize) {
    if let Plan::ColScan(s) = plan {
        s.threads = threads.max(1);
    }
    for input in plan.inputs_mut() {
        set_threads(input, threads);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sql::rows::encode_value;

    /// The column kernels give the bits of the row-at-a-time comparison (`partial_cmp` and
    /// `CmpOp::holds`) for every operator: NaN, -0.0 and equal values included, row counts
    /// that end inside a word; too few bytes for the rows is an error, not a panic.
    #[test]
    fn column_kernels_agree_with_row_comparisons() {
        let xs = [1.5, -0.0, 0.0, f64::NAN, 2.0, -3.25, 1.5, f64::INFINITY, 7.0, 1e300];
        let (n, words) = (150, 3);
        let a: Vec<f64> = (0..n).map(|i| xs[i % xs.len()]).collect();
        let b: Vec<f64> = (0..n).map(|i| xs[(i * 7 + 3) % xs.len()]).collect();
        let ab: Vec<u8> = a.iter().flat_map(|v| v.to_le_bytes()).collect();
        let bb: Vec<u8> = b.iter().flat_map(|v| v.to_le_bytes()).collect();
        let ai: Vec<u8> = (0..n as i32).flat_map(|i| (i % 9 - 4).to_le_bytes()).collect();
        for op in [CmpOp::Eq, CmpOp::Ne, CmpOp::Lt, CmpOp::Le, CmpOp::Gt, CmpOp::Ge] {
            let holds = |x: f64, y: f64| x.partial_cmp(&y).is_some_and(|o| op.holds(o));
            let bit = |v: &[u64], i: usize| v[i / 64] >> (i % 64) & 1 == 1;
            for y in [1.5, 0.0, -0.0, f64::NAN, 100.0] {
                let mut t = vec![0u64; words];
                cmp_bits(&ab, n, &mut t, f64::from_le_bytes, op, y).ok().unwrap();
                for (i, &x) in a.iter().enumerate() {
                    assert_eq!(bit(&t, i), holds(x, y), "{op:?} {x} vs {y}");
                }
            }
            let mut t = vec![0u64; words];
            cmp_cols_bits(&ab, &bb, n, &mut t, f64::from_le_bytes, op).ok().unwrap();
            for (i, (&x, &y)) in a.iter().zip(&b).enumerate() {
                assert_eq!(bit(&t, i), holds(x, y), "{op:?} {x} vs {y}");
            }
            let mut t = vec![0u64; words];
            cmp_bits(&ai, n, &mut t, i32::from_le_bytes, op, 0).ok().unwrap();
            for i in 0..n {
                assert_eq!(bit(&t, i), op.holds((i as i32 % 9 - 4).cmp(&0)), "{op:?} row {i}");
            }
            assert!(cmp_bits(&ab[..8 * n - 1], n, &mut t, f64::from_le_bytes, op, 0.0).is_err());
            assert!(cmp_cols_bits(&ab, &bb[..8], n, &mut t, f64::from_le_bytes, op).is_err());
        }
    }

    /// A key encoded straight from a leaf's bytes is the encoding of the decoded value, for
    /// every type, NULLs and strings inline and out of line.
    #[test]
    fn keys_encoded_from_the_leaf_equal_encoded_values() {
        let schema = Schema::parse("i:i64,f:f64,d:date,b:bool,s:str,r:bytes").unwrap();
        let rows: Vec<Vec<Value>> = (0..40i64)
            .map(|i| {
                let null = i % 7 == 3;
                vec![
                    if null { Value::Null } else { Value::I64(i * 1_000_003 - 7) },
                    if i % 5 == 0 { Value::F64(if i % 2 == 0 { -0.0 } else { 0.0 }) } else { Value::F64(i as f64 / 3.0) },
                    if null { Value::Null } else { Value::Date(i as i32 - 20) },
                    Value::Bool(i % 2 == 0),
                    if null { Value::Null } else { Value::Str("é".repeat(i as usize % 9)) },
                    Value::Bytes(vec![i as u8; i as usize % 30]),
                ]
            })
            .collect();
        let size = 16 << 10;
        let (n, cap) = pax::plan(&schema, size, &rows);
        assert_eq!(n, rows.len());
        let page = pax::build(size, &schema, 0, cap, &rows);
        let leaf = pax::header(&page[..], &schema).unwrap();
        let mut at = Vec::new();
        column_offsets(&schema, leaf.cap, &mut at);
        let lf = LeafView { page: &page, leaf, at: &at, schema: &schema };
        for (i, row) in rows.iter().enumerate() {
            for (c, v) in row.iter().enumerate() {
                let (mut want, mut got) = (Vec::new(), Vec::new());
                encode_value(v, &mut want);
                encode_ref(lf.value_ref_at(c, i).ok().unwrap(), &mut got);
                assert_eq!(got, want, "row {i} column {c}: {v:?}");
            }
        }
    }
}
