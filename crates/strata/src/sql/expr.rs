//! Bound scalar expressions and their evaluation: SQL's three-valued logic, checked `i64`
//! arithmetic, dates, `LIKE`, `SUBSTRING`, `CAST`.
//!
//! Every type is decided when the query is bound (see [`super::bind`]), so evaluation
//! meets only the combinations the binder let through; the errors left for run time are
//! those that depend on values: overflow, division by zero, a cast of text that does not
//! parse, a date out of range. They name the position of the operator in the query.

use std::cmp::Ordering;
use std::fmt;

use crate::access::table::text::{civil_from_days, days_from_civil, days_in_month, format_date, parse_bool, parse_date, value_to_text};
use crate::access::table::{ColumnType, Value};
use crate::error::{Error, Result};

/// A position in the query text: (line, column), both from 1.
pub type Pos = Option<(u64, u64)>;

pub(crate) fn err(pos: Pos, msg: impl Into<String>) -> Error {
    Error::Sql { pos, msg: msg.into() }
}

/// The name of a static type in messages (`NULL` for the type of a bare NULL).
pub(crate) fn tname(t: Option<ColumnType>) -> &'static str {
    t.map_or("NULL", |t| t.name())
}

/// Arithmetic operators.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArOp {
    Add,
    Sub,
    Mul,
    Div,
    Rem,
}

impl ArOp {
    fn sym(self) -> &'static str {
        match self {
            ArOp::Add => "+",
            ArOp::Sub => "-",
            ArOp::Mul => "*",
            ArOp::Div => "/",
            ArOp::Rem => "%",
        }
    }
    pub(crate) fn verb(self) -> &'static str {
        match self {
            ArOp::Add => "add",
            ArOp::Sub => "subtract",
            ArOp::Mul => "multiply",
            ArOp::Div => "divide",
            ArOp::Rem => "take the remainder of",
        }
    }
}

/// Comparison operators.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CmpOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl CmpOp {
    pub(crate) fn flip(self) -> CmpOp {
        match self {
            CmpOp::Lt => CmpOp::Gt,
            CmpOp::Le => CmpOp::Ge,
            CmpOp::Gt => CmpOp::Lt,
            CmpOp::Ge => CmpOp::Le,
            o => o,
        }
    }
    fn sym(self) -> &'static str {
        match self {
            CmpOp::Eq => "=",
            CmpOp::Ne => "<>",
            CmpOp::Lt => "<",
            CmpOp::Le => "<=",
            CmpOp::Gt => ">",
            CmpOp::Ge => ">=",
        }
    }
    pub(crate) fn holds(self, o: Ordering) -> bool {
        match self {
            CmpOp::Eq => o == Ordering::Equal,
            CmpOp::Ne => o != Ordering::Equal,
            CmpOp::Lt => o == Ordering::Less,
            CmpOp::Le => o != Ordering::Greater,
            CmpOp::Gt => o == Ordering::Greater,
            CmpOp::Ge => o != Ordering::Less,
        }
    }
}

/// A part of a date: `EXTRACT(part FROM d)`, and the unit of an interval.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DatePart {
    Year,
    Month,
    Day,
}

/// A bound expression. Column references are indexes into the row it is evaluated on.
#[derive(Clone, Debug)]
pub enum BExpr {
    /// Column `i` of the input row.
    Col(usize, String),
    /// A constant.
    Lit(Value),
    /// `-x` (i64 checked, f64).
    Neg(Box<BExpr>, Pos),
    /// `NOT x`.
    Not(Box<BExpr>),
    /// Arithmetic on numbers (i64 checked; i64 with f64 gives f64).
    Arith(ArOp, Box<BExpr>, Box<BExpr>, Pos),
    /// date ± days (an i64) → date; `sub` for minus.
    DateAddDays {
        date: Box<BExpr>,
        days: Box<BExpr>,
        sub: bool,
        pos: Pos,
    },
    /// date ± an interval of `n` months or days → date.
    DateAddInterval {
        date: Box<BExpr>,
        n: i64,
        unit: DatePart,
        pos: Pos,
    },
    /// date - date → days (i64).
    DateDiff(Box<BExpr>, Box<BExpr>),
    /// `a || b` on strings.
    Concat(Box<BExpr>, Box<BExpr>),
    /// A comparison of two values of comparable types.
    Cmp(CmpOp, Box<BExpr>, Box<BExpr>),
    And(Box<BExpr>, Box<BExpr>),
    Or(Box<BExpr>, Box<BExpr>),
    /// `x IS NULL` (`negated`: `IS NOT NULL`).
    IsNull(Box<BExpr>, bool),
    /// `x [NOT] IN (list)`.
    InList(Box<BExpr>, Vec<BExpr>, bool),
    /// `x [NOT] LIKE pattern [ESCAPE c]`.
    Like {
        expr: Box<BExpr>,
        pattern: Box<BExpr>,
        escape: Option<char>,
        negated: bool,
        pos: Pos,
    },
    /// `CASE WHEN c THEN r ... ELSE e END` (a `CASE x WHEN v` form is bound to comparisons).
    Case {
        whens: Vec<(BExpr, BExpr)>,
        otherwise: Box<BExpr>,
    },
    /// `EXTRACT(part FROM d)` → i64.
    Extract(DatePart, Box<BExpr>),
    /// `SUBSTRING(s FROM start [FOR len])`, 1-based, in characters.
    Substring {
        expr: Box<BExpr>,
        from: Option<Box<BExpr>>,
        len: Option<Box<BExpr>>,
        pos: Pos,
    },
    /// `CAST(x AS type)`.
    Cast(Box<BExpr>, ColumnType, Pos),
    /// `COALESCE(a, b, ...)`.
    Coalesce(Vec<BExpr>),
    /// A function of one argument: `abs`, `length`, `upper`, `lower`.
    Func1(Func1, Box<BExpr>, Pos),
    /// The value of an uncorrelated subquery, computed once per run before the rows are
    /// (see [`super::subquery`]).
    Param(std::sync::Arc<super::subquery::Param>),
}

/// Functions of one argument.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Func1 {
    Abs,
    Length,
    Upper,
    Lower,
}

fn truth(v: &Value) -> Option<bool> {
    match v {
        Value::Bool(b) => Some(*b),
        _ => None,
    }
}

fn from_truth(b: Option<bool>) -> Value {
    b.map_or(Value::Null, Value::Bool)
}

/// Compares two non-NULL values of comparable types (numbers with numbers, else the same
/// type); `None` when they are not comparable (NaN, or types the binder would refuse).
pub fn compare(a: &Value, b: &Value) -> Option<Ordering> {
    match (a, b) {
        (Value::I64(x), Value::I64(y)) => Some(x.cmp(y)),
        (Value::F64(x), Value::F64(y)) => x.partial_cmp(y),
        (Value::I64(x), Value::F64(y)) => cmp_i64_f64(*x, *y),
        (Value::F64(x), Value::I64(y)) => cmp_i64_f64(*y, *x).map(Ordering::reverse),
        (Value::Date(x), Value::Date(y)) => Some(x.cmp(y)),
        (Value::Bool(x), Value::Bool(y)) => Some(x.cmp(y)),
        (Value::Str(x), Value::Str(y)) => Some(x.cmp(y)),
        (Value::Bytes(x), Value::Bytes(y)) => Some(x.cmp(y)),
        _ => None,
    }
}

/// i64 vs f64 exactly (not through a rounding conversion of the i64).
fn cmp_i64_f64(x: i64, y: f64) -> Option<Ordering> {
    if y.is_nan() {
        return None;
    }
    // 2^63 as f64 is exact; anything at or beyond it is larger than every i64.
    if y >= 9_223_372_036_854_775_808.0 {
        return Some(Ordering::Less);
    }
    if y < -9_223_372_036_854_775_808.0 {
        return Some(Ordering::Greater);
    }
    let t = y.trunc();
    // In range: t converts exactly.
    let ti = t as i64;
    match x.cmp(&ti) {
        Ordering::Equal => 0.0f64.partial_cmp(&(y - t)),
        o => Some(o),
    }
}

fn f64_of(v: &Value) -> Option<f64> {
    match v {
        Value::I64(i) => Some(*i as f64),
        Value::F64(f) => Some(*f),
        _ => None,
    }
}

/// Adds `months` to `days` (a date), keeping the day of the month where it exists and
/// otherwise taking the month's last day (2024-01-31 + 1 month = 2024-02-29).
fn add_months(days: i32, months: i64) -> Option<i32> {
    let (y, m, d) = civil_from_days(i64::from(days));
    let total = y.checked_mul(12)?.checked_add(i64::from(m) - 1)?.checked_add(months)?;
    let (ny, nm) = (total.div_euclid(12), (total.rem_euclid(12) + 1) as u32);
    if ny.unsigned_abs() > 6_000_000 {
        return None;
    }
    let nd = d.min(days_in_month(ny, nm));
    i32::try_from(days_from_civil(ny, nm, nd)).ok()
}

fn date_plus(days: i32, delta: i64) -> Option<i32> {
    i32::try_from(i64::from(days).checked_add(delta)?).ok()
}

/// Whether `text` matches the LIKE `pattern` (`%` any run of characters, `_` one
/// character, `escape` makes the next pattern character literal). Iterative with one
/// backtrack point, so O(len(text) · len(pattern)) at worst.
pub fn like(text: &str, pattern: &str, escape: Option<char>) -> bool {
    #[derive(Clone, Copy, PartialEq)]
    enum P {
        Any,
        One,
        Ch(char),
    }
    let mut pat = Vec::with_capacity(pattern.len());
    let mut it = pattern.chars();
    while let Some(c) = it.next() {
        pat.push(match c {
            c if Some(c) == escape => P::Ch(it.next().unwrap_or(c)),
            '%' => P::Any,
            '_' => P::One,
            c => P::Ch(c),
        });
    }
    let t: Vec<char> = text.chars().collect();
    let (mut ti, mut pi) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        match pat.get(pi) {
            Some(P::Any) => {
                star = Some((pi, ti));
                pi += 1;
            }
            Some(P::One) => {
                ti += 1;
                pi += 1;
            }
            Some(P::Ch(c)) if *c == t[ti] => {
                ti += 1;
                pi += 1;
            }
            _ => match star {
                Some((sp, st)) => {
                    pi = sp + 1;
                    ti = st + 1;
                    star = Some((sp, st + 1));
                }
                None => return false,
            },
        }
    }
    pat[pi..].iter().all(|p| *p == P::Any)
}

/// `CAST(v AS to)`; `v` is not NULL.
pub fn cast(v: Value, to: ColumnType, pos: Pos) -> Result<Value> {
    let from = tname(v.ty());
    let bad = |what: &str| err(pos, format!("cannot cast {what} to {}", to.name()));
    Ok(match (v, to) {
        (v, t) if v.ty() == Some(t) => v,
        (Value::F64(f), ColumnType::I64) => {
            let r = f.round();
            if !(-9_223_372_036_854_775_808.0..9_223_372_036_854_775_808.0).contains(&r) {
                return Err(bad(&format!("f64 {f} (out of the range of i64)")));
            }
            Value::I64(r as i64)
        }
        (Value::I64(i), ColumnType::F64) => Value::F64(i as f64),
        (Value::Bool(b), ColumnType::I64) => Value::I64(i64::from(b)),
        (Value::I64(i), ColumnType::Bool) => Value::Bool(i != 0),
        (Value::Str(s), ColumnType::I64) => s.trim().parse().map(Value::I64).map_err(|_| bad(&format!("str {:?}", cut(&s))))?,
        (Value::Str(s), ColumnType::F64) => s.trim().parse().map(Value::F64).map_err(|_| bad(&format!("str {:?}", cut(&s))))?,
        (Value::Str(s), ColumnType::Date) => parse_date(s.trim()).map(Value::Date).ok_or_else(|| bad(&format!("str {:?} (dates are YYYY-MM-DD)", cut(&s))))?,
        (Value::Str(s), ColumnType::Bool) => parse_bool(s.trim()).map(Value::Bool).ok_or_else(|| bad(&format!("str {:?}", cut(&s))))?,
        (Value::Str(s), ColumnType::Bytes) => Value::Bytes(s.into_bytes()),
        (v, ColumnType::Str) => Value::Str(value_to_text(&v).unwrap_or_default()),
        _ => return Err(bad(from)),
    })
}

/// Whether the binder allows `CAST(from AS to)`.
pub fn can_cast(from: Option<ColumnType>, to: ColumnType) -> bool {
    use ColumnType::*;
    match from {
        None => true,
        Some(f) if f == to => true,
        Some(f) => matches!((f, to), (F64, I64) | (I64, F64) | (Bool, I64) | (I64, Bool) | (Str, _) | (_, Str)),
    }
}

fn cut(s: &str) -> &str {
    match s.char_indices().nth(40) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

impl BExpr {
    /// The direct subexpressions.
    pub fn children_mut(&mut self) -> Vec<&mut BExpr> {
        match self {
            BExpr::Col(..) | BExpr::Lit(_) | BExpr::Param(_) => Vec::new(),
            BExpr::Neg(x, _) | BExpr::Not(x) | BExpr::IsNull(x, _) | BExpr::Extract(_, x) | BExpr::Cast(x, _, _) | BExpr::Func1(_, x, _) => vec![x],
            BExpr::DateAddInterval { date, .. } => vec![date],
            BExpr::Arith(_, a, b, _) | BExpr::DateDiff(a, b) | BExpr::Concat(a, b) | BExpr::Cmp(_, a, b) | BExpr::And(a, b) | BExpr::Or(a, b) => vec![a, b],
            BExpr::DateAddDays { date, days, .. } => vec![date, days],
            BExpr::InList(x, list, _) => std::iter::once(&mut **x).chain(list.iter_mut()).collect(),
            BExpr::Like { expr, pattern, .. } => vec![expr, pattern],
            BExpr::Case { whens, otherwise } => whens.iter_mut().flat_map(|(c, r)| [c, r]).chain(std::iter::once(&mut **otherwise)).collect(),
            BExpr::Substring { expr, from, len, .. } => {
                std::iter::once(&mut **expr).chain(from.iter_mut().map(|b| &mut **b)).chain(len.iter_mut().map(|b| &mut **b)).collect()
            }
            BExpr::Coalesce(list) => list.iter_mut().collect(),
        }
    }

    /// Replaces every subexpression that reads no column by its value, computed once here
    /// instead of once per row (`DATE '1994-01-01' + INTERVAL '1' YEAR` in a filter cost
    /// TPC-H Q6 4 % of its time). A subexpression whose evaluation fails (`1 / 0`) is left
    /// as it is, so that the error is raised when a row evaluates it, as before (and not at
    /// all on an empty input).
    pub fn fold_constants(&mut self) {
        let mut constant = true;
        for c in self.children_mut() {
            c.fold_constants();
            constant &= matches!(c, BExpr::Lit(_));
        }
        if !constant || matches!(self, BExpr::Col(..) | BExpr::Lit(_) | BExpr::Param(_)) {
            return;
        }
        // Every operand is a literal, so no column of the (empty) row is read.
        if let Ok(v) = self.eval(&[]) {
            *self = BExpr::Lit(v);
        }
    }

    /// Replaces every column index `i` by `f(i)`.
    pub fn map_cols(&mut self, f: &dyn Fn(usize) -> usize) {
        if let BExpr::Col(i, _) = self {
            *i = f(*i);
        }
        for c in self.children_mut() {
            c.map_cols(f);
        }
    }

    /// Adds the column indexes the expression reads to `out`.
    pub fn cols(&self, out: &mut Vec<usize>) {
        // (children_mut needs &mut; a clone keeps this simple and it runs at planning only)
        let mut c = self.clone();
        c.visit_cols(out);
    }

    fn visit_cols(&mut self, out: &mut Vec<usize>) {
        if let BExpr::Col(i, _) = self {
            out.push(*i);
        }
        for c in self.children_mut() {
            c.visit_cols(out);
        }
    }

    /// Whether the expression is true on `row` (false for false and for NULL), as
    /// [`eval`](Self::eval) says; a comparison of columns and constants (or an AND of two)
    /// is decided on the row's values in place, without cloning them into new values
    /// (HAVING over 1.5 M groups: TPC-H Q18).
    pub fn holds(&self, row: &[Value]) -> Result<bool> {
        match self {
            BExpr::Cmp(..) => {
                if let Some(t) = self.compared(row) {
                    return Ok(t == Some(true));
                }
            }
            BExpr::And(a, b) => {
                if let (Some(x), Some(y)) = (a.compared(row), b.compared(row)) {
                    return Ok(x == Some(true) && y == Some(true));
                }
            }
            _ => {}
        }
        Ok(matches!(self.eval(row)?, Value::Bool(true)))
    }

    /// A column or a constant, in place.
    fn operand<'r>(&'r self, row: &'r [Value]) -> Option<&'r Value> {
        match self {
            BExpr::Col(i, _) => row.get(*i),
            BExpr::Lit(v) => Some(v),
            _ => None,
        }
    }

    /// The truth of a comparison of two operands (`None` inside: NULL), without evaluating
    /// anything that could fail; `None` if this is not such a comparison.
    fn compared(&self, row: &[Value]) -> Option<Option<bool>> {
        let BExpr::Cmp(op, a, b) = self else { return None };
        let (a, b) = (a.operand(row)?, b.operand(row)?);
        Some(if matches!(a, Value::Null) || matches!(b, Value::Null) { None } else { Some(compare(a, b).is_some_and(|o| op.holds(o))) })
    }

    /// Evaluates the expression on `row`.
    pub fn eval(&self, row: &[Value]) -> Result<Value> {
        Ok(match self {
            BExpr::Col(i, _) => row[*i].clone(),
            BExpr::Lit(v) => v.clone(),
            BExpr::Param(p) => p.get(),
            BExpr::Neg(x, pos) => match x.eval(row)? {
                Value::I64(i) => Value::I64(i.checked_neg().ok_or_else(|| err(*pos, format!("i64 overflow: -({i})")))?),
                Value::F64(f) => Value::F64(-f),
                _ => Value::Null,
            },
            BExpr::Not(x) => from_truth(truth(&x.eval(row)?).map(|b| !b)),
            BExpr::Arith(op, a, b, pos) => {
                let (a, b) = (a.eval(row)?, b.eval(row)?);
                arith(*op, &a, &b, *pos)?
            }
            BExpr::DateAddDays { date, days, sub, pos } => match (date.eval(row)?, days.eval(row)?) {
                (Value::Date(d), Value::I64(n)) => {
                    let n = if *sub { n.checked_neg() } else { Some(n) };
                    Value::Date(n.and_then(|n| date_plus(d, n)).ok_or_else(|| err(*pos, "date out of range"))?)
                }
                _ => Value::Null,
            },
            BExpr::DateAddInterval { date, n, unit, pos } => match date.eval(row)? {
                Value::Date(d) => {
                    let r = match unit {
                        DatePart::Day => date_plus(d, *n),
                        DatePart::Month => add_months(d, *n),
                        DatePart::Year => n.checked_mul(12).and_then(|m| add_months(d, m)),
                    };
                    Value::Date(r.ok_or_else(|| err(*pos, "date out of range"))?)
                }
                _ => Value::Null,
            },
            BExpr::DateDiff(a, b) => match (a.eval(row)?, b.eval(row)?) {
                (Value::Date(x), Value::Date(y)) => Value::I64(i64::from(x) - i64::from(y)),
                _ => Value::Null,
            },
            BExpr::Concat(a, b) => match (a.eval(row)?, b.eval(row)?) {
                (Value::Str(mut x), Value::Str(y)) => {
                    x.push_str(&y);
                    Value::Str(x)
                }
                _ => Value::Null,
            },
            BExpr::Cmp(op, a, b) => {
                let (a, b) = (a.eval(row)?, b.eval(row)?);
                if matches!(a, Value::Null) || matches!(b, Value::Null) {
                    Value::Null
                } else {
                    Value::Bool(compare(&a, &b).is_some_and(|o| op.holds(o)))
                }
            }
            BExpr::And(a, b) => {
                let x = truth(&a.eval(row)?);
                if x == Some(false) {
                    return Ok(Value::Bool(false));
                }
                match (x, truth(&b.eval(row)?)) {
                    (_, Some(false)) => Value::Bool(false),
                    (Some(true), Some(true)) => Value::Bool(true),
                    _ => Value::Null,
                }
            }
            BExpr::Or(a, b) => {
                let x = truth(&a.eval(row)?);
                if x == Some(true) {
                    return Ok(Value::Bool(true));
                }
                match (x, truth(&b.eval(row)?)) {
                    (_, Some(true)) => Value::Bool(true),
                    (Some(false), Some(false)) => Value::Bool(false),
                    _ => Value::Null,
                }
            }
            BExpr::IsNull(x, negated) => Value::Bool(matches!(x.eval(row)?, Value::Null) != *negated),
            BExpr::InList(x, list, negated) => {
                let v = x.eval(row)?;
                if matches!(v, Value::Null) {
                    return Ok(Value::Null);
                }
                let mut unknown = false;
                for e in list {
                    let w = e.eval(row)?;
                    if matches!(w, Value::Null) {
                        unknown = true;
                    } else if compare(&v, &w) == Some(Ordering::Equal) {
                        return Ok(Value::Bool(!*negated));
                    }
                }
                if unknown {
                    Value::Null
                } else {
                    Value::Bool(*negated)
                }
            }
            BExpr::Like { expr, pattern, escape, negated, .. } => match (expr.eval(row)?, pattern.eval(row)?) {
                (Value::Str(t), Value::Str(p)) => Value::Bool(like(&t, &p, *escape) != *negated),
                _ => Value::Null,
            },
            BExpr::Case { whens, otherwise } => {
                for (c, r) in whens {
                    if truth(&c.eval(row)?) == Some(true) {
                        return r.eval(row);
                    }
                }
                otherwise.eval(row)?
            }
            BExpr::Extract(part, x) => match x.eval(row)? {
                Value::Date(d) => {
                    let (y, m, d) = civil_from_days(i64::from(d));
                    Value::I64(match part {
                        DatePart::Year => y,
                        DatePart::Month => i64::from(m),
                        DatePart::Day => i64::from(d),
                    })
                }
                _ => Value::Null,
            },
            BExpr::Substring { expr, from, len, pos } => {
                let s = match expr.eval(row)? {
                    Value::Str(s) => s,
                    _ => return Ok(Value::Null),
                };
                let start = match from {
                    Some(f) => match f.eval(row)? {
                        Value::I64(i) => i,
                        _ => return Ok(Value::Null),
                    },
                    None => 1,
                };
                let end = match len {
                    Some(l) => match l.eval(row)? {
                        Value::I64(l) if l < 0 => return Err(err(*pos, format!("negative substring length {l}"))),
                        Value::I64(l) => Some(start.saturating_add(l)),
                        _ => return Ok(Value::Null),
                    },
                    None => None,
                };
                // Characters at 1-based positions [start, end).
                let skip = usize::try_from(start.max(1) - 1).unwrap_or(usize::MAX);
                let take = match end {
                    Some(e) => usize::try_from((e - start.max(1)).max(0)).unwrap_or(usize::MAX),
                    None => usize::MAX,
                };
                Value::Str(s.chars().skip(skip).take(take).collect())
            }
            BExpr::Cast(x, to, pos) => match x.eval(row)? {
                Value::Null => Value::Null,
                v => cast(v, *to, *pos)?,
            },
            BExpr::Coalesce(list) => {
                for e in list {
                    let v = e.eval(row)?;
                    if !matches!(v, Value::Null) {
                        return Ok(v);
                    }
                }
                Value::Null
            }
            BExpr::Func1(f, x, pos) => match (f, x.eval(row)?) {
                (_, Value::Null) => Value::Null,
                (Func1::Abs, Value::I64(i)) => Value::I64(i.checked_abs().ok_or_else(|| err(*pos, format!("i64 overflow: abs({i})")))?),
                (Func1::Abs, Value::F64(f)) => Value::F64(f.abs()),
                (Func1::Length, Value::Str(s)) => Value::I64(s.chars().count() as i64),
                (Func1::Length, Value::Bytes(b)) => Value::I64(b.len() as i64),
                (Func1::Upper, Value::Str(s)) => Value::Str(s.to_uppercase()),
                (Func1::Lower, Value::Str(s)) => Value::Str(s.to_lowercase()),
                _ => Value::Null,
            },
        })
    }
}

/// `a op b` for numbers (the binder has checked the types); NULL if either is NULL.
pub fn arith(op: ArOp, a: &Value, b: &Value, pos: Pos) -> Result<Value> {
    Ok(match (a, b) {
        (Value::I64(x), Value::I64(y)) => {
            let (x, y) = (*x, *y);
            if matches!(op, ArOp::Div | ArOp::Rem) && y == 0 {
                return Err(err(pos, format!("division by zero: {x} {} 0", op.sym())));
            }
            let r = match op {
                ArOp::Add => x.checked_add(y),
                ArOp::Sub => x.checked_sub(y),
                ArOp::Mul => x.checked_mul(y),
                ArOp::Div => x.checked_div(y),
                ArOp::Rem => x.checked_rem(y),
            };
            Value::I64(r.ok_or_else(|| err(pos, format!("i64 overflow: {x} {} {y}", op.sym())))?)
        }
        (Value::Null, _) | (_, Value::Null) => Value::Null,
        (a, b) => match (f64_of(a), f64_of(b)) {
            (Some(x), Some(y)) => {
                if matches!(op, ArOp::Div | ArOp::Rem) && y == 0.0 {
                    return Err(err(pos, format!("division by zero: {x:?} {} 0", op.sym())));
                }
                Value::F64(match op {
                    ArOp::Add => x + y,
                    ArOp::Sub => x - y,
                    ArOp::Mul => x * y,
                    ArOp::Div => x / y,
                    ArOp::Rem => x % y,
                })
            }
            _ => Value::Null,
        },
    })
}

impl fmt::Display for BExpr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BExpr::Col(_, name) => write!(f, "{name}"),
            BExpr::Lit(v) => match v {
                Value::Null => write!(f, "NULL"),
                Value::Str(s) => write!(f, "'{}'", s.replace('\'', "''")),
                Value::Date(d) => write!(f, "DATE '{}'", format_date(*d)),
                v => write!(f, "{}", value_to_text(v).unwrap_or_default()),
            },
            BExpr::Neg(x, _) => write!(f, "(-{x})"),
            BExpr::Not(x) => write!(f, "(NOT {x})"),
            BExpr::Arith(op, a, b, _) => write!(f, "({a} {} {b})", op.sym()),
            BExpr::DateAddDays { date, days, sub, .. } => write!(f, "({date} {} {days})", if *sub { "-" } else { "+" }),
            BExpr::DateAddInterval { date, n, unit, .. } => write!(f, "({date} + INTERVAL '{n}' {unit:?})"),
            BExpr::DateDiff(a, b) => write!(f, "({a} - {b})"),
            BExpr::Concat(a, b) => write!(f, "({a} || {b})"),
            BExpr::Cmp(op, a, b) => write!(f, "({a} {} {b})", op.sym()),
            BExpr::And(a, b) => write!(f, "({a} AND {b})"),
            BExpr::Or(a, b) => write!(f, "({a} OR {b})"),
            BExpr::IsNull(x, n) => write!(f, "({x} IS {}NULL)", if *n { "NOT " } else { "" }),
            BExpr::InList(x, list, n) => {
                write!(f, "({x} {}IN (", if *n { "NOT " } else { "" })?;
                for (i, e) in list.iter().enumerate() {
                    write!(f, "{}{e}", if i > 0 { ", " } else { "" })?;
                }
                write!(f, "))")
            }
            BExpr::Like { expr, pattern, negated, .. } => write!(f, "({expr} {}LIKE {pattern})", if *negated { "NOT " } else { "" }),
            BExpr::Case { whens, otherwise } => {
                write!(f, "CASE")?;
                for (c, r) in whens {
                    write!(f, " WHEN {c} THEN {r}")?;
                }
                write!(f, " ELSE {otherwise} END")
            }
            BExpr::Extract(p, x) => write!(f, "EXTRACT({p:?} FROM {x})"),
            BExpr::Substring { expr, from, len, .. } => {
                write!(f, "SUBSTRING({expr}")?;
                if let Some(x) = from {
                    write!(f, " FROM {x}")?;
                }
                if let Some(x) = len {
                    write!(f, " FOR {x}")?;
                }
                write!(f, ")")
            }
            BExpr::Cast(x, t, _) => write!(f, "CAST({x} AS {})", t.name()),
            BExpr::Coalesce(list) => {
                write!(f, "COALESCE(")?;
                for (i, e) in list.iter().enumerate() {
                    write!(f, "{}{e}", if i > 0 { ", " } else { "" })?;
                }
                write!(f, ")")
            }
            BExpr::Func1(func, x, _) => write!(f, "{}({x})", format!("{func:?}").to_lowercase()),
            BExpr::Param(p) => write!(f, "${}", p.id),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn holds_agrees_with_eval_on_comparisons_and_conjunctions() {
        let mut r = crate::util::SplitMix64(3);
        let value = |r: &mut crate::util::SplitMix64| match r.below(5) {
            0 => Value::Null,
            1 => Value::I64(r.below(5) as i64 - 2),
            2 => Value::F64((r.below(9) as f64 - 4.0) / 2.0),
            3 => Value::Str(["", "a", "b"][r.below(3) as usize].to_owned()),
            _ => Value::Date(r.below(3) as i32),
        };
        let ops = [CmpOp::Eq, CmpOp::Ne, CmpOp::Lt, CmpOp::Le, CmpOp::Gt, CmpOp::Ge];
        for _ in 0..20_000 {
            let row: Vec<Value> = (0..3).map(|_| value(&mut r)).collect();
            let operand = |r: &mut crate::util::SplitMix64| if r.below(2) == 0 { BExpr::Col(r.below(3) as usize, "c".into()) } else { BExpr::Lit(value(r)) };
            let cmp = |r: &mut crate::util::SplitMix64| BExpr::Cmp(ops[r.below(6) as usize], Box::new(operand(r)), Box::new(operand(r)));
            let e = if r.below(2) == 0 { cmp(&mut r) } else { BExpr::And(Box::new(cmp(&mut r)), Box::new(cmp(&mut r))) };
            // Mixed types are refused by the binder; eval and holds must agree where eval answers.
            if let Ok(v) = e.eval(&row) {
                assert_eq!(e.holds(&row).unwrap(), matches!(v, Value::Bool(true)), "{e} on {row:?}");
            }
        }
    }

    use super::*;

    #[test]
    fn like_patterns() {
        assert!(like("hello", "h%o", None));
        assert!(like("hello", "h_llo", None));
        assert!(!like("hello", "h_lo", None));
        assert!(like("", "%", None));
        assert!(!like("", "_", None));
        assert!(like("a%b", "a\\%b", Some('\\')));
        assert!(!like("axb", "a\\%b", Some('\\')));
        assert!(like("東京タワー", "東_タ%", None));
        assert!(like("aaaaaaaaaaaaaaaaaaab", "%a%a%a%a%b", None));
        assert!(!like("aaaaaaaaaaaaaaaaaaaa", "%a%a%a%a%b", None));
    }

    #[test]
    fn months_clamp_to_the_last_day() {
        let d = |s| parse_date(s).unwrap();
        assert_eq!(add_months(d("2024-01-31"), 1), Some(d("2024-02-29")));
        assert_eq!(add_months(d("2023-01-31"), 1), Some(d("2023-02-28")));
        assert_eq!(add_months(d("2024-03-15"), -3), Some(d("2023-12-15")));
        assert_eq!(add_months(d("2024-02-29"), 12), Some(d("2025-02-28")));
        assert_eq!(add_months(0, i64::MAX), None);
    }

    #[test]
    fn i64_f64_comparison_is_exact() {
        assert_eq!(cmp_i64_f64(i64::MAX, 9_223_372_036_854_775_807.0), Some(Ordering::Less));
        assert_eq!(cmp_i64_f64(3, 3.0), Some(Ordering::Equal));
        assert_eq!(cmp_i64_f64(3, 3.5), Some(Ordering::Less));
        assert_eq!(cmp_i64_f64(-3, -3.5), Some(Ordering::Greater));
        assert_eq!(cmp_i64_f64(0, f64::NAN), None);
    }

    #[test]
    fn arithmetic_errors() {
        assert!(arith(ArOp::Add, &Value::I64(i64::MAX), &Value::I64(1), None).is_err());
        assert!(arith(ArOp::Div, &Value::I64(i64::MIN), &Value::I64(-1), None).is_err());
        assert!(arith(ArOp::Div, &Value::I64(1), &Value::I64(0), None).is_err());
        assert!(arith(ArOp::Div, &Value::F64(1.0), &Value::I64(0), None).is_err());
        assert_eq!(arith(ArOp::Div, &Value::I64(7), &Value::I64(-2), None).unwrap(), Value::I64(-3));
        assert_eq!(arith(ArOp::Add, &Value::I64(1), &Value::F64(0.5), None).unwrap(), Value::F64(1.5));
        assert_eq!(arith(ArOp::Add, &Value::I64(1), &Value::Null, None).unwrap(), Value::Null);
    }
}
