//! The scan filter's leaf-wise conjuncts evaluated on a packed leaf's columns as stored,
//! before (and often instead of) expanding them.
//!
//! A packed column holds bit-packed numbers `u` that stand for the values through a
//! non-decreasing function (`base + u` for integers and dates, `(base + u) / 10^s` for
//! decimals) or index a dictionary of strings. So a comparison with a constant becomes a
//! range of `u` found once per leaf (a binary search over the function for decimals), tested
//! on the unpacked numbers with one subtraction and one comparison each; a string predicate
//! is evaluated once per dictionary entry and looked up by code. Columns that a leaf
//! stores otherwise (plain or compressed strings), comparisons of two columns, and literal
//! types without an exact translation are left to the expanded leaf ([`VPred::eval`]):
//! [`VPred::eval_stored`] says so by returning `None`.
//!
//! The results are the same bitmaps (true, unknown) as [`VPred::eval`] computes on the
//! expanded leaf, bit for bit: the tests compare the two on random leaves of every encoding.

use crate::access::table::packed::{Column, PackedLeaf};
use crate::access::table::{ColumnType, Value};
use crate::buffer::Restart;

use super::super::expr::CmpOp;
use super::{byte_keys, cmp_bits, combine, in_list_bits, Bad, Bits, VPred};

/// A predicate's (true, unknown) bitmaps.
type Bitmaps = (Vec<u64>, Vec<u64>);

/// The values `u` that pass a comparison: `lo <= u < lo + span`, or the others if `neg`.
#[derive(Clone, Copy, Debug)]
struct URange {
    lo: u64,
    span: u64,
    neg: bool,
}

impl URange {
    /// The range `lo .. hi` of a `universe` of `u` (`1 << w`); `neg`: its complement.
    fn new(lo: u128, hi: u128, neg: bool, universe: u128) -> URange {
        let (lo, hi) = (lo.min(universe), hi.min(universe).max(lo.min(universe)));
        if hi - lo > u64::MAX as u128 {
            // The whole universe of w = 64: every u is in it. An empty span passes nothing,
            // so its complement passes everything.
            return URange { lo: 0, span: 0, neg: !neg };
        }
        URange { lo: lo as u64, span: (hi - lo) as u64, neg }
    }

    #[inline(always)]
    fn test(&self, u: u64) -> bool {
        (u.wrapping_sub(self.lo) < self.span) != self.neg
    }
}

impl URange {
    /// The range as bounds `lo .. hi` (`None` for a complement other than "everything").
    fn bounds(&self) -> Option<(u128, u128)> {
        match (self.neg, self.span) {
            (false, _) => Some((self.lo as u128, self.lo as u128 + self.span as u128)),
            (true, 0) => Some((0, u128::MAX)),
            (true, _) => None,
        }
    }
}

/// The range of `u` where `f(u) op y` holds, for a non-decreasing `f` over `0 .. universe`,
/// from the first `u` with `f(u) >= y` and the first with `f(u) > y` (`universe` if none).
fn op_range(op: CmpOp, ge: u128, gt: u128, universe: u128) -> URange {
    match op {
        CmpOp::Eq => URange::new(ge, gt, false, universe),
        CmpOp::Ne => URange::new(ge, gt, true, universe),
        CmpOp::Lt => URange::new(0, ge, false, universe),
        CmpOp::Le => URange::new(0, gt, false, universe),
        CmpOp::Gt => URange::new(gt, universe, false, universe),
        CmpOp::Ge => URange::new(ge, universe, false, universe),
    }
}

/// The first `u` in `0 .. universe` where the monotone `holds` (false, then true) is true;
/// `universe` if none.
fn first_where(universe: u128, holds: impl Fn(u64) -> bool) -> u128 {
    let (mut lo, mut hi) = (0u128, universe);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if holds(mid as u64) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    lo
}

/// A numeric literal as the exact integer an integer, date or boolean column compares with.
fn int_lit(ty: ColumnType, lit: &Value) -> Option<i128> {
    match (ty, lit) {
        (ColumnType::I64, Value::I64(y)) => Some(*y as i128),
        (ColumnType::Date, Value::Date(y)) => Some(*y as i128),
        (ColumnType::Bool, Value::Bool(y)) => Some(*y as i128),
        _ => None,
    }
}

/// A literal as the double an `f64` column compares with (as [`VPred::eval`] does: an
/// integer within ±2^53 converts exactly); `None` for NaN (kept to the expanded path).
fn f64_lit(lit: &Value) -> Option<f64> {
    match lit {
        Value::F64(y) if !y.is_nan() => Some(*y),
        Value::I64(y) if y.unsigned_abs() <= 1 << 53 => Some(*y as f64),
        _ => None,
    }
}

/// The range of stored `u` where `value op lit` holds, for a numeric column as stored.
fn num_range(col: &Column<'_>, ty: ColumnType, op: CmpOp, lit: &Value) -> Option<URange> {
    match *col {
        Column::Ints { base, w, .. } => {
            let universe = 1u128 << w;
            let k = int_lit(ty, lit)? - base as i128;
            let clamp = |x: i128| x.clamp(0, universe as i128) as u128;
            Some(op_range(op, clamp(k), clamp(k + 1), universe))
        }
        Column::Decimals { base, w, scale, .. } => {
            let y = f64_lit(lit)?;
            let universe = 1u128 << w;
            let ge = first_where(universe, |u| Column::decimal(base, scale, u) >= y);
            let gt = first_where(universe, |u| Column::decimal(base, scale, u) > y);
            Some(op_range(op, ge, gt, universe))
        }
        _ => None,
    }
}

/// Sets bit `i` of `out` for each of the leaf's `n` rows whose stored `u` passes `pass`.
#[inline]
fn u_bits(col: &Column<'_>, n: usize, out: &mut [u64], pass: impl Fn(u64) -> bool) -> Result<(), Bad> {
    col.chunks(n, |at, vals| {
        // Chunks start at multiples of 64 rows.
        for (o, word) in out[at / 64..].iter_mut().zip(vals.chunks(64)) {
            let mut x = 0u64;
            for (j, &u) in word.iter().enumerate() {
                x |= (pass(u) as u64) << j;
            }
            *o = x;
        }
        Ok(())
    })
    .map_err(|_: Restart| Bad)
}

/// Sets bit `i` of `out` for each row whose dictionary entry passes: `tab[code]` is 1 for
/// an entry that passes, 0 for one that does not, 2 for one that cannot be read (or a code
/// past the entries): an error if a non-NULL row has it.
fn dict_bits(col: &Column<'_>, n: usize, tab: &[u8], nulls: Option<&[u8]>, out: &mut [u64]) -> Result<(), Bad> {
    let mut bad = 0u8;
    col.chunks(n, |at, vals| {
        for (o, word) in out[at / 64..].iter_mut().zip(vals.chunks(64)) {
            let mut x = 0u64;
            for (j, &u) in word.iter().enumerate() {
                let e = tab[u as usize];
                bad |= e;
                x |= ((e & 1) as u64) << j;
            }
            *o = x;
        }
        Ok(())
    })
    .map_err(|_: Restart| Bad)?;
    if bad & 2 != 0 {
        // Which rows: only a non-NULL one is an error (NULL rows hold code 0).
        let mut i = 0;
        col.chunks(n, |at, vals| {
            for (j, &u) in vals.iter().enumerate() {
                i = at + j;
                if tab[u as usize] == 2 && nulls.is_none_or(|b| b[i / 8] >> (i % 8) & 1 == 0) {
                    return Err(Restart);
                }
            }
            Ok(())
        })
        .map_err(|_: Restart| Bad)?;
    }
    Ok(())
}

/// The dictionary's per-code table for `pass` (see [`dict_bits`]); `None` if the codes are
/// too wide for a table.
fn dict_table(col: &Column<'_>, pass: impl Fn(&[u8]) -> Option<bool>) -> Option<Vec<u8>> {
    let Column::Dict { entries, w, .. } = col else { return None };
    if *w > 12 {
        return None;
    }
    let mut tab = vec![2u8; 1 << *w];
    for (t, e) in tab.iter_mut().zip(entries.iter()) {
        *t = match pass(e) {
            Some(b) => b as u8,
            None => 2,
        };
    }
    Some(tab)
}

/// The NULL bits of word `w` of a packed column's bitmap.
fn null_word(nulls: Option<&[u8]>, w: usize) -> u64 {
    nulls.map_or(0, |b| b.get(w * 8..w * 8 + 8).map_or(0, |x| u64::from_le_bytes(x.try_into().expect("8 bytes"))))
}

/// Top-level conjuncts `preds`, each a comparison of the same numeric column with a
/// constant other than `<>`, evaluated together as one range of the stored values: the
/// rows where all of them are true (`None` if the column is not stored so or a constant
/// has no exact translation). Only the rows of `live` (the rows still passing) are
/// evaluated if they are few: the bits of the others are cleared.
pub(super) fn eval_range<'v>(
    preds: impl Iterator<Item = &'v VPred> + Clone,
    st: &mut Stored<'_, '_>,
    schema: &crate::access::table::Schema,
    bits: &mut Bits,
    words: usize,
    live: &[u64],
) -> Result<Option<Vec<u64>>, Bad> {
    let Some(VPred::CmpLit { col: c, .. }) = preds.clone().next() else { return Ok(None) };
    let c = *c;
    let ty = schema.columns[c].ty;
    let n = st.leaf.header.count;
    let nulls = st.leaf.nulls(c).map_err(|_| Bad)?;
    let column = st.col(c, ty)?;
    let universe = match *column {
        Column::Ints { w, .. } | Column::Decimals { w, .. } => 1u128 << w,
        _ => return Ok(None),
    };
    let (mut lo, mut hi) = (0u128, u128::MAX);
    for p in preds {
        let VPred::CmpLit { col, op, lit } = p else { return Ok(None) };
        if *col != c || *op == CmpOp::Ne {
            return Ok(None);
        }
        let Some((a, z)) = num_range(column, ty, *op, lit).and_then(|r| r.bounds()) else { return Ok(None) };
        (lo, hi) = (lo.max(a), hi.min(z));
    }
    let r = URange::new(lo, hi.max(lo), false, universe);
    let mut t = bits.take(words, 0);
    let passed: usize = live.iter().map(|w| w.count_ones() as usize).sum();
    if passed * SPARSE_EVAL <= n {
        for i in crate::util::set_bits(live).take_while(|&i| i < n) {
            t[i / 64] |= (r.test(column.at(i)) as u64) << (i % 64);
        }
    } else if let Err(e) = u_bits(column, n, &mut t, |x| r.test(x)) {
        bits.give(t);
        return Err(e);
    }
    for (w, x) in t.iter_mut().enumerate() {
        *x &= !null_word(nulls, w);
    }
    Ok(Some(t))
}

/// Rows still passing per leaf row below which [`eval_range`] evaluates only those rows
/// (1 in 8).
const SPARSE_EVAL: usize = 8;

/// The stored columns of a leaf, opened once each (a dictionary's entries are listed).
pub(super) struct Stored<'a, 'p> {
    pub(super) leaf: &'a PackedLeaf<'p>,
    cols: Vec<Option<Column<'p>>>,
}

impl<'a, 'p> Stored<'a, 'p> {
    pub(super) fn new(leaf: &'a PackedLeaf<'p>, ncols: usize) -> Self {
        Stored { leaf, cols: (0..ncols).map(|_| None).collect() }
    }

    fn col(&mut self, c: usize, ty: ColumnType) -> Result<&Column<'p>, Bad> {
        if self.cols[c].is_none() {
            self.cols[c] = Some(self.leaf.column(c, ty).map_err(|_| Bad)?);
        }
        Ok(self.cols[c].as_ref().expect("just opened"))
    }
}

impl VPred {
    /// [`VPred::eval`] on the columns as stored in a packed leaf, if every part of the
    /// predicate can be (else `None`, and the bitmaps taken are given back).
    pub(super) fn eval_stored(
        &self,
        st: &mut Stored<'_, '_>,
        schema: &crate::access::table::Schema,
        bits: &mut Bits,
        words: usize,
    ) -> Result<Option<Bitmaps>, Bad> {
        let n = st.leaf.header.count;
        let mut t = bits.take(words, 0);
        let mut u = bits.take(words, 0);
        let nulls_into = |u: &mut Vec<u64>, nulls: Option<&[u8]>| {
            for (w, x) in u.iter_mut().enumerate() {
                *x = null_word(nulls, w);
            }
        };
        // A comparison's NULL rows: unknown, not true.
        let unknown_if_null = |t: &mut Vec<u64>, u: &mut Vec<u64>, nulls: Option<&[u8]>| {
            nulls_into(u, nulls);
            for (a, x) in t.iter_mut().zip(u.iter()) {
                *a &= !x;
            }
        };
        let done = match self {
            VPred::Const(Some(true)) => {
                t.fill(!0);
                true
            }
            VPred::Const(Some(false)) => true,
            VPred::Const(None) => {
                u.fill(!0);
                true
            }
            VPred::CmpLit { col, op, lit } => {
                let (c, op) = (*col, *op);
                let ty = schema.columns[c].ty;
                let nulls = st.leaf.nulls(c).map_err(|_| Bad)?;
                let column = st.col(c, ty)?;
                let ok = match column {
                    Column::Ints { .. } | Column::Decimals { .. } => match num_range(column, ty, op, lit) {
                        Some(r) => u_bits(column, n, &mut t, |x| r.test(x)).map(|_| true)?,
                        None => false,
                    },
                    Column::Raw(body) => match f64_lit(lit) {
                        Some(y) => cmp_bits(body, n, &mut t, f64::from_le_bytes, op, y).map(|_| true)?,
                        None => false,
                    },
                    Column::Dict { .. } => {
                        let y: Option<&[u8]> = match (ty, lit) {
                            (ColumnType::Str, Value::Str(s)) => Some(s.as_bytes()),
                            (ColumnType::Bytes, Value::Bytes(b)) => Some(b),
                            _ => None,
                        };
                        match y.and_then(|y| dict_table(column, |e| Some(op.holds(e.cmp(y))))) {
                            Some(tab) => dict_bits(column, n, &tab, nulls, &mut t).map(|_| true)?,
                            None => false,
                        }
                    }
                    Column::Strings => false,
                };
                if ok {
                    unknown_if_null(&mut t, &mut u, nulls);
                }
                ok
            }
            VPred::CmpCols { .. } => false,
            VPred::IsNull { col, negated } => {
                nulls_into(&mut t, st.leaf.nulls(*col).map_err(|_| Bad)?);
                if *negated {
                    t.iter_mut().for_each(|x| *x = !*x);
                }
                true
            }
            VPred::BoolCol(c) => {
                let nulls = st.leaf.nulls(*c).map_err(|_| Bad)?;
                let column = st.col(*c, ColumnType::Bool)?;
                match num_range(column, ColumnType::Bool, CmpOp::Eq, &Value::Bool(true)) {
                    Some(r) => {
                        u_bits(column, n, &mut t, |x| r.test(x))?;
                        unknown_if_null(&mut t, &mut u, nulls);
                        true
                    }
                    None => false,
                }
            }
            VPred::InList { col, prefix, lits, has_null, negated } => {
                let c = *col;
                let ty = schema.columns[c].ty;
                let nulls = st.leaf.nulls(c).map_err(|_| Bad)?;
                let column = st.col(c, ty)?;
                let mut found = bits.take(words, 0);
                let ok = match column {
                    Column::Ints { .. } | Column::Decimals { .. } if prefix.is_none() => {
                        let ranges: Option<Vec<URange>> = lits.iter().map(|l| num_range(column, ty, CmpOp::Eq, l)).collect();
                        match ranges {
                            Some(rs) => u_bits(column, n, &mut found, |x| rs.iter().any(|r| r.test(x))).map(|_| true),
                            None => Ok(false),
                        }
                    }
                    Column::Dict { .. } if matches!(ty, ColumnType::Str | ColumnType::Bytes) => {
                        let keys = byte_keys(lits);
                        match dict_table(column, |e| Some(keys.contains(&super::char_prefix(e, *prefix)))) {
                            Some(tab) => dict_bits(column, n, &tab, nulls, &mut found).map(|_| true),
                            None => Ok(false),
                        }
                    }
                    _ => Ok(false),
                };
                let ok = match ok {
                    Ok(ok) => ok,
                    Err(e) => {
                        bits.give(found);
                        bits.give(t);
                        bits.give(u);
                        return Err(e);
                    }
                };
                if ok {
                    nulls_into(&mut u, nulls);
                    in_list_bits(&found, &mut t, &mut u, *has_null, *negated);
                }
                bits.give(found);
                ok
            }
            VPred::Like { col, pattern, negated } => {
                let c = *col;
                let nulls = st.leaf.nulls(c).map_err(|_| Bad)?;
                let column = st.col(c, schema.columns[c].ty)?;
                match dict_table(column, |e| pattern.matches(e).map(|m| m != *negated)) {
                    Some(tab) => {
                        dict_bits(column, n, &tab, nulls, &mut t)?;
                        unknown_if_null(&mut t, &mut u, nulls);
                        true
                    }
                    None => false,
                }
            }
            VPred::And(a, b) | VPred::Or(a, b) => match a.eval_stored(st, schema, bits, words)? {
                None => false,
                Some((ta, ua)) => match b.eval_stored(st, schema, bits, words)? {
                    None => {
                        bits.give(ta);
                        bits.give(ua);
                        false
                    }
                    Some((tb, ub)) => {
                        combine(matches!(self, VPred::And(..)), &ta, &ua, &tb, &ub, &mut t, &mut u);
                        for v in [ta, ua, tb, ub] {
                            bits.give(v);
                        }
                        true
                    }
                },
            },
            VPred::Not(a) => match a.eval_stored(st, schema, bits, words)? {
                None => false,
                Some((ta, ua)) => {
                    for w in 0..words {
                        t[w] = !ta[w] & !ua[w];
                        u[w] = ua[w];
                    }
                    bits.give(ta);
                    bits.give(ua);
                    true
                }
            },
        };
        if done {
            Ok(Some((t, u)))
        } else {
            bits.give(t);
            bits.give(u);
            Ok(None)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{column_offsets, LeafView, Pattern};
    use super::*;
    use crate::access::table::packed::{self, tests::mixed_rows};
    use crate::util::SplitMix64;

    /// A random literal for column `c`: a value of the column, one next to it, or an
    /// extreme; sometimes of another type (then the stored path declines).
    fn literal(r: &mut SplitMix64, rows: &[Vec<Value>], c: usize) -> Value {
        let v = rows[r.below(rows.len() as u64) as usize][c].clone();
        match (v, r.below(8)) {
            (Value::Null, _) => Value::I64(0),
            (Value::I64(x), 0) => Value::I64(x.saturating_add(1)),
            (Value::I64(_), 1) => Value::I64([i64::MIN, i64::MAX, 0][r.below(3) as usize]),
            (Value::I64(x), 2) => Value::F64(x as f64 + 0.5),
            (Value::F64(x), 0) => Value::F64(x + 0.001),
            (Value::F64(_), 1) => Value::F64([f64::INFINITY, f64::NEG_INFINITY, -0.0, f64::NAN, 1e300][r.below(5) as usize]),
            (Value::F64(x), 2) => Value::I64(x as i64),
            (Value::Date(x), 0) => Value::Date(x + 1),
            (Value::Date(_), 1) => Value::Date([i32::MIN, i32::MAX][r.below(2) as usize]),
            (Value::Str(s), 0) => Value::Str(format!("{s}a")),
            (Value::Str(s), 1) => Value::Str(s.chars().take(2).collect()),
            (v, _) => v,
        }
    }

    /// A random leaf-wise predicate over the mixed columns.
    fn predicate(r: &mut SplitMix64, rows: &[Vec<Value>], depth: u32) -> VPred {
        let ops = [CmpOp::Eq, CmpOp::Ne, CmpOp::Lt, CmpOp::Le, CmpOp::Gt, CmpOp::Ge];
        let c = r.below(8) as usize;
        match r.below(if depth == 0 { 6 } else { 9 }) {
            0 | 1 => VPred::CmpLit { col: c, op: ops[r.below(6) as usize], lit: literal(r, rows, c) },
            2 => {
                // On a string column, half the time its first 0-3 characters (SUBSTRING),
                // against such prefixes of its values.
                let prefix = (c >= 6 && r.below(2) == 0).then(|| r.below(4) as usize);
                let lits = (0..1 + r.below(4))
                    .map(|_| match (literal(r, rows, c), prefix) {
                        (Value::Str(s), Some(k)) => Value::Str(s.chars().take(k).collect()),
                        (v, _) => v,
                    })
                    .collect();
                VPred::InList { col: c, prefix, lits, has_null: r.below(4) == 0, negated: r.below(2) == 0 }
            }
            3 => {
                let c = 6 + r.below(2) as usize;
                let p = ["%", "AIR%", "%IN%", "_IR", "DELIVER IN PERSON", "%-1%", "é%"][r.below(7) as usize];
                VPred::Like { col: c, pattern: Pattern::compile(p, None), negated: r.below(2) == 0 }
            }
            4 => VPred::IsNull { col: c, negated: r.below(2) == 0 },
            5 => VPred::BoolCol(5),
            6 => VPred::And(Box::new(predicate(r, rows, depth - 1)), Box::new(predicate(r, rows, depth - 1))),
            7 => VPred::Or(Box::new(predicate(r, rows, depth - 1)), Box::new(predicate(r, rows, depth - 1))),
            _ => VPred::Not(Box::new(predicate(r, rows, depth - 1))),
        }
    }

    fn masked(v: &[u64], n: usize) -> Vec<u64> {
        v.iter().enumerate().map(|(w, &x)| if (w + 1) * 64 > n { x & ((1u64 << (n % 64)) - 1) } else { x }).collect()
    }

    /// On random packed leaves of every encoding, a predicate evaluated on the stored
    /// columns gives the bitmaps (true, unknown) that it gives on the expanded leaf, and
    /// ranges of comparisons give the rows where all of them are true (dense and sparse).
    #[test]
    fn stored_evaluation_agrees_with_the_expanded_leaf() {
        let mut r = SplitMix64(77);
        let (mut stored, mut declined, mut ranges) = (0, 0, 0);
        for trial in 0..60 {
            let rows_wanted = 1 + r.below(900) as usize;
            let (schema, rows) = mixed_rows(&mut r, rows_wanted, trial % 3 == 0);
            let size = 64 << 10;
            let (n, _) = packed::fit(&schema, size, &rows, true);
            let rows = &rows[..n];
            let page = packed::encode(size, &schema, 0, rows, false, true);
            let mut img = Vec::new();
            let leaf = packed::expand(&page, &schema, None, &mut img).unwrap();
            let mut at = Vec::new();
            column_offsets(&schema, leaf.cap, &mut at);
            let lf = LeafView { page: &img, leaf, at: &at, schema: &schema };
            let pl = PackedLeaf::open(&page, &schema).unwrap();
            let mut st = Stored::new(&pl, schema.len());
            let mut bits = Bits::default();
            let words = n.div_ceil(64);
            for _ in 0..150 {
                let p = predicate(&mut r, rows, 2);
                let want = p.eval(&lf, &mut bits, words);
                match p.eval_stored(&mut st, &schema, &mut bits, words) {
                    Ok(Some((t, u))) => {
                        stored += 1;
                        let Ok((wt, wu)) = want else { panic!("{p:?}: only the stored evaluation succeeded") };
                        assert_eq!(masked(&t, n), masked(&wt, n), "true bits of {p:?}, trial {trial}");
                        assert_eq!(masked(&u, n), masked(&wu, n), "unknown bits of {p:?}, trial {trial}");
                    }
                    Ok(None) => declined += 1,
                    Err(_) => panic!("{p:?}: the stored evaluation failed on a good leaf"),
                }
            }
            // Ranges: 1 to 3 comparisons (not <>) of one numeric column.
            for _ in 0..60 {
                let c = [0, 1, 2, 3, 4, 5][r.below(6) as usize];
                let ops = [CmpOp::Eq, CmpOp::Lt, CmpOp::Le, CmpOp::Gt, CmpOp::Ge];
                let preds: Vec<VPred> =
                    (0..1 + r.below(3)).map(|_| VPred::CmpLit { col: c, op: ops[r.below(5) as usize], lit: literal(&mut r, rows, c) }).collect();
                let live: Vec<u64> =
                    if r.below(2) == 0 { vec![!0; words] } else { (0..words).map(|_| r.next_u64() & r.next_u64() & r.next_u64() & r.next_u64()).collect() };
                let Some(t) = eval_range(preds.iter(), &mut st, &schema, &mut bits, words, &live).ok().unwrap() else { continue };
                ranges += 1;
                let mut want = vec![!0u64; words];
                for p in &preds {
                    let (wt, _) = p.eval(&lf, &mut bits, words).ok().unwrap();
                    want.iter_mut().zip(&wt).for_each(|(a, b)| *a &= b);
                }
                let and = |v: &[u64]| masked(&v.iter().zip(&live).map(|(a, b)| a & b).collect::<Vec<_>>(), n);
                assert_eq!(and(&t), and(&want), "{preds:?} on live rows, trial {trial}");
            }
        }
        // Most predicates are evaluated stored; those on plain or compressed strings, of
        // two columns or with literals of another type are not.
        assert!(stored > 2 * declined, "stored {stored}, declined {declined}");
        assert!(ranges > 1000, "ranges {ranges}");
    }
}
