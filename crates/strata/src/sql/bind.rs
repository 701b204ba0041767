//! From sqlparser's AST to a [`Plan`]: names resolved against the catalog, every
//! expression typed, the constructs of this slice turned into plan nodes and everything
//! else refused with an error that names its position.

use sqlparser::ast::{
    self, BinaryOperator as B, CastKind, DataType, DateTimeField, Expr, FunctionArg, FunctionArgExpr, FunctionArguments, GroupByExpr, LimitClause,
    ObjectNamePart, Query, SelectItem, SetExpr, Spanned, Statement, TableFactor, UnaryOperator, Value as SqlValue,
};
use sqlparser::tokenizer::Span;

use super::exec::{AggFunc, AggSpec, Plan, SortKey};
use super::expr::{can_cast, err, tname, ArOp, BExpr, CmpOp, DatePart, Func1, Pos};
use crate::access::catalog::Catalog;
use crate::access::table::text::parse_date;
use crate::access::table::{ColumnType, Schema, Value};
use crate::error::Result;

/// A result column: its name and static type (`None` when it is always NULL).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutColumn {
    pub name: String,
    pub ty: Option<ColumnType>,
}

pub(crate) fn at(span: Span) -> Pos {
    (span.start.line > 0).then_some((span.start.line, span.start.column))
}

fn pos_of(e: &Expr) -> Pos {
    at(e.span())
}

fn unsupported(pos: Pos, what: &str) -> crate::error::Error {
    err(pos, format!("{what} is not supported yet"))
}

/// The table in scope: its name, the alias it has in the query, its columns.
struct Scope {
    name: String,
    alias: Option<String>,
    schema: Schema,
}

impl Scope {
    fn empty() -> Scope {
        Scope { name: String::new(), alias: None, schema: Schema { columns: Vec::new() } }
    }

    /// The column `id`: exact for quoted names; for unquoted ones an exact match, else the
    /// one column whose name matches ignoring case.
    fn column(&self, id: &ast::Ident) -> Result<(usize, ColumnType)> {
        let cols = &self.schema.columns;
        let found = cols.iter().position(|c| c.name == id.value).or_else(|| {
            if id.quote_style.is_some() {
                return None;
            }
            let mut m = cols.iter().enumerate().filter(|(_, c)| c.name.eq_ignore_ascii_case(&id.value));
            match (m.next(), m.next()) {
                (Some((i, _)), None) => Some(i),
                _ => None,
            }
        });
        match found {
            Some(i) => Ok((i, cols[i].ty)),
            None if self.name.is_empty() => Err(err(at(id.span), format!("no column named {:?} (the query has no FROM)", id.value))),
            None => Err(err(at(id.span), format!("no column named {:?} in table {:?}", id.value, self.name))),
        }
    }

    fn qualifies(&self, q: &ast::Ident) -> bool {
        let same = |n: &str| if q.quote_style.is_some() { n == q.value } else { n.eq_ignore_ascii_case(&q.value) };
        match &self.alias {
            Some(a) => same(a),
            None => same(&self.name),
        }
    }
}

/// How aggregates may appear in the expression being bound.
enum Aggs<'a> {
    /// Not at all (WHERE, aggregate arguments).
    No(&'static str),
    /// Collected into the list; the expression refers to them by index.
    Collect { list: &'a mut Vec<AggSpec>, bare_column: &'a mut Option<(Pos, String)>, keys: &'a [GroupKey] },
}

/// A `GROUP BY` key: its text (an expression of the SELECT list with the same text is the
/// key), the input column when it is a plain column, its type.
struct GroupKey {
    text: String,
    col: Option<usize>,
    ty: Option<ColumnType>,
}

/// A typed bound expression.
type Typed = (BExpr, Option<ColumnType>);

fn is_numeric(t: Option<ColumnType>) -> bool {
    matches!(t, None | Some(ColumnType::I64) | Some(ColumnType::F64))
}

fn numeric_result(a: Option<ColumnType>, b: Option<ColumnType>) -> Option<ColumnType> {
    if a == Some(ColumnType::F64) || b == Some(ColumnType::F64) {
        Some(ColumnType::F64)
    } else if a.is_some() || b.is_some() {
        Some(ColumnType::I64)
    } else {
        None
    }
}

fn comparable(a: Option<ColumnType>, b: Option<ColumnType>) -> bool {
    a.is_none() || b.is_none() || a == b || (is_numeric(a) && is_numeric(b))
}

/// A string literal compared with a date is read as a date (`d >= '1995-01-01'`).
fn coerce_to(e: Typed, want: Option<ColumnType>, pos: Pos) -> Result<Typed> {
    match (&e.0, want) {
        (BExpr::Lit(Value::Str(s)), Some(ColumnType::Date)) => {
            let d = parse_date(s).ok_or_else(|| err(pos, format!("{s:?} is not a date (YYYY-MM-DD)")))?;
            Ok((BExpr::Lit(Value::Date(d)), Some(ColumnType::Date)))
        }
        _ => Ok(e),
    }
}

struct Binder<'s> {
    scope: &'s Scope,
}

fn interval_of(iv: &ast::Interval, pos: Pos) -> Result<(i64, DatePart)> {
    let bad = || err(pos, "an interval must be INTERVAL 'n' DAY, MONTH or YEAR");
    let text = match iv.value.as_ref() {
        Expr::Value(v) => match &v.value {
            SqlValue::SingleQuotedString(s) | SqlValue::Number(s, _) => s.clone(),
            _ => return Err(bad()),
        },
        Expr::UnaryOp { op: UnaryOperator::Minus, expr } => match expr.as_ref() {
            Expr::Value(v) => match &v.value {
                SqlValue::Number(s, _) => format!("-{s}"),
                _ => return Err(bad()),
            },
            _ => return Err(bad()),
        },
        _ => return Err(bad()),
    };
    let mut words = text.split_whitespace();
    let n: i64 = words.next().and_then(|w| w.parse().ok()).ok_or_else(bad)?;
    let unit_word = words.next().map(str::to_ascii_lowercase);
    if words.next().is_some() || iv.last_field.is_some() {
        return Err(bad());
    }
    let unit = match (&iv.leading_field, unit_word.as_deref()) {
        (Some(DateTimeField::Day | DateTimeField::Days), None) | (None, Some("day" | "days")) => DatePart::Day,
        (Some(DateTimeField::Month | DateTimeField::Months), None) | (None, Some("month" | "months")) => DatePart::Month,
        (Some(DateTimeField::Year | DateTimeField::Years), None) | (None, Some("year" | "years")) => DatePart::Year,
        _ => return Err(bad()),
    };
    Ok((n, unit))
}

fn column_type(dt: &DataType, pos: Pos) -> Result<ColumnType> {
    Ok(match dt {
        DataType::Int(_) | DataType::Integer(_) | DataType::BigInt(_) | DataType::Int64 | DataType::SmallInt(_) | DataType::Int8(_) => ColumnType::I64,
        DataType::Double(_)
        | DataType::DoublePrecision
        | DataType::Float(_)
        | DataType::Float64
        | DataType::Float8
        | DataType::Real
        | DataType::Decimal(_)
        | DataType::Numeric(_) => ColumnType::F64,
        DataType::Date => ColumnType::Date,
        DataType::Bool | DataType::Boolean => ColumnType::Bool,
        DataType::Varchar(_) | DataType::Char(_) | DataType::Text | DataType::String(_) | DataType::CharVarying(_) | DataType::Character(_) => ColumnType::Str,
        DataType::Bytea | DataType::Blob(_) => ColumnType::Bytes,
        other => return Err(err(pos, format!("type {other} is not supported (types: BIGINT, DOUBLE, DATE, BOOLEAN, VARCHAR, BYTEA)"))),
    })
}

fn agg_func(name: &str) -> Option<AggFunc> {
    Some(match name {
        "count" => AggFunc::Count,
        "sum" => AggFunc::Sum,
        "avg" => AggFunc::Avg,
        "min" => AggFunc::Min,
        "max" => AggFunc::Max,
        _ => return None,
    })
}

impl Binder<'_> {
    fn bool_operand(&self, e: &Expr, what: &str, aggs: &mut Aggs<'_>) -> Result<BExpr> {
        let (b, t) = self.expr(e, aggs)?;
        if !matches!(t, None | Some(ColumnType::Bool)) {
            return Err(err(pos_of(e), format!("{what} needs a bool operand, not {}", tname(t))));
        }
        Ok(b)
    }

    fn expr(&self, e: &Expr, aggs: &mut Aggs<'_>) -> Result<Typed> {
        let pos = pos_of(e);
        if let Aggs::Collect { keys, .. } = aggs {
            if !keys.is_empty() && !matches!(e, Expr::Nested(_) | Expr::Value(_)) {
                let t = e.to_string();
                if let Some(i) = keys.iter().position(|k| k.text == t) {
                    return Ok((BExpr::Col(i, t), keys[i].ty));
                }
            }
        }
        Ok(match e {
            Expr::Identifier(id) => self.column(id, None, aggs)?,
            Expr::CompoundIdentifier(parts) => match parts.as_slice() {
                [q, id] if self.scope.qualifies(q) => self.column(id, Some(q), aggs)?,
                [q, _] => return Err(err(at(q.span), format!("no table named {:?} in this query", q.value))),
                _ => return Err(err(pos, format!("cannot resolve the name {e}"))),
            },
            Expr::Nested(x) => self.expr(x, aggs)?,
            Expr::Value(v) => literal(&v.value, pos)?,
            Expr::TypedString(ts) => match (&ts.data_type, &ts.value.value) {
                (DataType::Date, SqlValue::SingleQuotedString(s)) => {
                    let d = parse_date(s).ok_or_else(|| err(pos, format!("{s:?} is not a date (YYYY-MM-DD)")))?;
                    (BExpr::Lit(Value::Date(d)), Some(ColumnType::Date))
                }
                (dt, _) => return Err(unsupported(pos, &format!("a literal of type {dt}"))),
            },
            Expr::Interval(_) => return Err(err(pos, "an interval can only be added to or subtracted from a date")),
            Expr::UnaryOp { op, expr } => {
                let (x, t) = self.expr(expr, aggs)?;
                match op {
                    UnaryOperator::Minus if is_numeric(t) => (BExpr::Neg(Box::new(x), pos), t),
                    UnaryOperator::Plus if is_numeric(t) => (x, t),
                    UnaryOperator::Minus | UnaryOperator::Plus => return Err(err(pos, format!("cannot negate {}", tname(t)))),
                    UnaryOperator::Not if matches!(t, None | Some(ColumnType::Bool)) => (BExpr::Not(Box::new(x)), Some(ColumnType::Bool)),
                    UnaryOperator::Not => return Err(err(pos, format!("NOT needs a bool operand, not {}", tname(t)))),
                    other => return Err(unsupported(pos, &format!("the operator {other}"))),
                }
            }
            Expr::BinaryOp { left, op, right } => self.binary(left, op, right, pos, aggs)?,
            Expr::IsNull(x) | Expr::IsNotNull(x) => {
                let (b, _) = self.expr(x, aggs)?;
                (BExpr::IsNull(Box::new(b), matches!(e, Expr::IsNotNull(_))), Some(ColumnType::Bool))
            }
            Expr::IsTrue(x) | Expr::IsFalse(x) | Expr::IsNotTrue(x) | Expr::IsNotFalse(x) => {
                let b = self.bool_operand(x, "IS TRUE/FALSE", aggs)?;
                let want = matches!(e, Expr::IsTrue(_) | Expr::IsNotTrue(_));
                let negated = matches!(e, Expr::IsNotTrue(_) | Expr::IsNotFalse(_));
                // x IS TRUE = coalesce(x = true, false)
                let eq = BExpr::Cmp(CmpOp::Eq, Box::new(b), Box::new(BExpr::Lit(Value::Bool(want))));
                let is = BExpr::Coalesce(vec![eq, BExpr::Lit(Value::Bool(false))]);
                (if negated { BExpr::Not(Box::new(is)) } else { is }, Some(ColumnType::Bool))
            }
            Expr::Between { expr, negated, low, high } => {
                let x = self.expr(expr, aggs)?;
                let lo = coerce_to(self.expr(low, aggs)?, x.1, pos_of(low))?;
                let hi = coerce_to(self.expr(high, aggs)?, x.1, pos_of(high))?;
                for (o, oe) in [(&lo, low), (&hi, high)] {
                    if !comparable(x.1, o.1) {
                        return Err(err(pos_of(oe), format!("cannot compare {} and {}", tname(x.1), tname(o.1))));
                    }
                }
                let ge = BExpr::Cmp(CmpOp::Ge, Box::new(x.0.clone()), Box::new(lo.0));
                let le = BExpr::Cmp(CmpOp::Le, Box::new(x.0), Box::new(hi.0));
                let both = BExpr::And(Box::new(ge), Box::new(le));
                (if *negated { BExpr::Not(Box::new(both)) } else { both }, Some(ColumnType::Bool))
            }
            Expr::InList { expr, list, negated } => {
                let x = self.expr(expr, aggs)?;
                let mut items = Vec::with_capacity(list.len());
                for l in list {
                    let v = coerce_to(self.expr(l, aggs)?, x.1, pos_of(l))?;
                    if !comparable(x.1, v.1) {
                        return Err(err(pos_of(l), format!("cannot compare {} and {}", tname(x.1), tname(v.1))));
                    }
                    items.push(v.0);
                }
                (BExpr::InList(Box::new(x.0), items, *negated), Some(ColumnType::Bool))
            }
            Expr::Like { negated, any, expr, pattern, escape_char } => {
                if *any {
                    return Err(unsupported(pos, "LIKE ANY"));
                }
                let (x, xt) = self.expr(expr, aggs)?;
                let (p, pt) = self.expr(pattern, aggs)?;
                for t in [xt, pt] {
                    if !matches!(t, None | Some(ColumnType::Str)) {
                        return Err(err(pos, format!("LIKE needs str operands, not {} and {}", tname(xt), tname(pt))));
                    }
                }
                let escape = match escape_char {
                    None => None,
                    Some(SqlValue::SingleQuotedString(s)) if s.chars().count() == 1 => s.chars().next(),
                    Some(other) => return Err(err(pos, format!("ESCAPE needs one character, not {other}"))),
                };
                (BExpr::Like { expr: Box::new(x), pattern: Box::new(p), escape, negated: *negated, pos }, Some(ColumnType::Bool))
            }
            Expr::Case { operand, conditions, else_result, .. } => {
                let op = operand.as_ref().map(|o| self.expr(o, aggs)).transpose()?;
                let mut whens = Vec::with_capacity(conditions.len());
                let mut results: Vec<(Typed, Pos)> = Vec::new();
                for cw in conditions {
                    let c = match &op {
                        Some(o) => {
                            let v = coerce_to(self.expr(&cw.condition, aggs)?, o.1, pos_of(&cw.condition))?;
                            if !comparable(o.1, v.1) {
                                return Err(err(pos_of(&cw.condition), format!("cannot compare {} and {}", tname(o.1), tname(v.1))));
                            }
                            BExpr::Cmp(CmpOp::Eq, Box::new(o.0.clone()), Box::new(v.0))
                        }
                        None => self.bool_operand(&cw.condition, "WHEN", aggs)?,
                    };
                    whens.push(c);
                    results.push((self.expr(&cw.result, aggs)?, pos_of(&cw.result)));
                }
                let otherwise = match else_result {
                    Some(x) => (self.expr(x, aggs)?, pos_of(x)),
                    None => ((BExpr::Lit(Value::Null), None), pos),
                };
                results.push(otherwise);
                let mut ty: Option<ColumnType> = None;
                for ((_, t), p) in &results {
                    ty = match (ty, *t) {
                        (a, None) => a,
                        (None, b) => b,
                        (Some(a), Some(b)) if a == b => Some(a),
                        (a, b) if is_numeric(a) && is_numeric(b) => Some(ColumnType::F64),
                        (Some(a), Some(b)) => return Err(err(*p, format!("CASE results have different types: {} and {}", a.name(), b.name()))),
                    };
                }
                let mut rs: Vec<BExpr> = results
                    .into_iter()
                    .map(|((b, t), p)| if ty == Some(ColumnType::F64) && t == Some(ColumnType::I64) { BExpr::Cast(Box::new(b), ColumnType::F64, p) } else { b })
                    .collect();
                let otherwise = rs.pop().unwrap_or(BExpr::Lit(Value::Null));
                (BExpr::Case { whens: whens.into_iter().zip(rs).collect(), otherwise: Box::new(otherwise) }, ty)
            }
            Expr::Extract { field, expr, .. } => {
                let part = match field {
                    DateTimeField::Year => DatePart::Year,
                    DateTimeField::Month => DatePart::Month,
                    DateTimeField::Day => DatePart::Day,
                    other => return Err(unsupported(pos, &format!("EXTRACT({other})"))),
                };
                let (x, t) = self.expr(expr, aggs)?;
                if !matches!(t, None | Some(ColumnType::Date)) {
                    return Err(err(pos, format!("EXTRACT needs a date, not {}", tname(t))));
                }
                (BExpr::Extract(part, Box::new(x)), Some(ColumnType::I64))
            }
            Expr::Substring { expr, substring_from, substring_for, .. } => {
                let (x, t) = self.expr(expr, aggs)?;
                if !matches!(t, None | Some(ColumnType::Str)) {
                    return Err(err(pos, format!("SUBSTRING needs a str, not {}", tname(t))));
                }
                let mut int = |a: &Option<Box<Expr>>| -> Result<Option<Box<BExpr>>> {
                    match a {
                        None => Ok(None),
                        Some(a) => {
                            let (b, t) = self.expr(a, aggs)?;
                            if !matches!(t, None | Some(ColumnType::I64)) {
                                return Err(err(pos_of(a), format!("SUBSTRING positions are i64, not {}", tname(t))));
                            }
                            Ok(Some(Box::new(b)))
                        }
                    }
                };
                let from = int(substring_from)?;
                let len = int(substring_for)?;
                (BExpr::Substring { expr: Box::new(x), from, len, pos }, Some(ColumnType::Str))
            }
            Expr::Cast { kind, expr, data_type, format } => {
                if !matches!(kind, CastKind::Cast | CastKind::DoubleColon) || format.is_some() {
                    return Err(unsupported(pos, "this form of CAST"));
                }
                let to = column_type(data_type, pos)?;
                let (x, t) = self.expr(expr, aggs)?;
                if !can_cast(t, to) {
                    return Err(err(pos, format!("cannot cast {} to {}", tname(t), to.name())));
                }
                if t == Some(to) {
                    (x, t)
                } else {
                    (BExpr::Cast(Box::new(x), to, pos), Some(to))
                }
            }
            Expr::Function(f) => self.function(f, pos, aggs)?,
            Expr::InSubquery { .. } | Expr::Subquery(_) | Expr::Exists { .. } => return Err(unsupported(pos, "a subquery")),
            Expr::Wildcard(_) | Expr::QualifiedWildcard(..) => return Err(err(pos, "* is only allowed as a whole SELECT item or in count(*)")),
            other => return Err(unsupported(pos, &format!("the expression {}", short(&other.to_string())))),
        })
    }

    fn column(&self, id: &ast::Ident, q: Option<&ast::Ident>, aggs: &mut Aggs<'_>) -> Result<Typed> {
        let (i, t) = self.scope.column(id)?;
        let name = match q {
            Some(q) => format!("{}.{}", q.value, self.scope.schema.columns[i].name),
            None => self.scope.schema.columns[i].name.clone(),
        };
        if let Aggs::Collect { bare_column, keys, .. } = aggs {
            if !keys.is_empty() {
                return match keys.iter().position(|k| k.col == Some(i)) {
                    Some(k) => Ok((BExpr::Col(k, name), Some(t))),
                    None => Err(err(at(id.span), format!("column {name:?} must appear in the GROUP BY clause or be used in an aggregate function"))),
                };
            }
            if bare_column.is_none() {
                **bare_column = Some((at(id.span), name.clone()));
            }
        }
        Ok((BExpr::Col(i, name), Some(t)))
    }

    fn binary(&self, left: &Expr, op: &B, right: &Expr, pos: Pos, aggs: &mut Aggs<'_>) -> Result<Typed> {
        // Intervals first: they are not values of their own.
        if matches!(op, B::Plus | B::Minus) {
            let iv = match (left, right) {
                (d, Expr::Interval(iv)) => Some((d, iv, matches!(op, B::Minus))),
                (Expr::Interval(iv), d) if matches!(op, B::Plus) => Some((d, iv, false)),
                _ => None,
            };
            if let Some((d, iv, sub)) = iv {
                let (x, t) = self.expr(d, aggs)?;
                if !matches!(t, None | Some(ColumnType::Date)) {
                    return Err(err(
                        pos,
                        format!("cannot {} an interval {} {}", if sub { "subtract" } else { "add" }, if sub { "from" } else { "to" }, tname(t)),
                    ));
                }
                let (n, unit) = interval_of(iv, pos_of(if matches!(left, Expr::Interval(_)) { left } else { right }))?;
                let n = if sub { n.checked_neg().ok_or_else(|| err(pos, "interval out of range"))? } else { n };
                return Ok((BExpr::DateAddInterval { date: Box::new(x), n, unit, pos }, Some(ColumnType::Date)));
            }
        }
        match op {
            B::And | B::Or => {
                let name = if matches!(op, B::And) { "AND" } else { "OR" };
                let (a, at_) = self.expr(left, aggs)?;
                let (b, bt) = self.expr(right, aggs)?;
                if !matches!(at_, None | Some(ColumnType::Bool)) || !matches!(bt, None | Some(ColumnType::Bool)) {
                    return Err(err(pos, format!("{name} needs bool operands, not {} and {}", tname(at_), tname(bt))));
                }
                let (a, b) = (Box::new(a), Box::new(b));
                Ok((if matches!(op, B::And) { BExpr::And(a, b) } else { BExpr::Or(a, b) }, Some(ColumnType::Bool)))
            }
            B::Eq | B::NotEq | B::Lt | B::LtEq | B::Gt | B::GtEq => {
                let cmp = match op {
                    B::Eq => CmpOp::Eq,
                    B::NotEq => CmpOp::Ne,
                    B::Lt => CmpOp::Lt,
                    B::LtEq => CmpOp::Le,
                    B::Gt => CmpOp::Gt,
                    _ => CmpOp::Ge,
                };
                let a = self.expr(left, aggs)?;
                let b = self.expr(right, aggs)?;
                let b = coerce_to(b, a.1, pos_of(right))?;
                let a = coerce_to(a, b.1, pos_of(left))?;
                if !comparable(a.1, b.1) {
                    return Err(err(pos, format!("cannot compare {} and {}", tname(a.1), tname(b.1))));
                }
                Ok((BExpr::Cmp(cmp, Box::new(a.0), Box::new(b.0)), Some(ColumnType::Bool)))
            }
            B::Plus | B::Minus | B::Multiply | B::Divide | B::Modulo => {
                let ar = match op {
                    B::Plus => ArOp::Add,
                    B::Minus => ArOp::Sub,
                    B::Multiply => ArOp::Mul,
                    B::Divide => ArOp::Div,
                    _ => ArOp::Rem,
                };
                let (a, at_) = self.expr(left, aggs)?;
                let (b, bt) = self.expr(right, aggs)?;
                use ColumnType::{Date, I64};
                match (ar, at_, bt) {
                    (_, x, y) if is_numeric(x) && is_numeric(y) => Ok((BExpr::Arith(ar, Box::new(a), Box::new(b), pos), numeric_result(x, y))),
                    (ArOp::Add | ArOp::Sub, Some(Date), Some(I64) | None) => {
                        Ok((BExpr::DateAddDays { date: Box::new(a), days: Box::new(b), sub: ar == ArOp::Sub, pos }, Some(Date)))
                    }
                    (ArOp::Add, Some(I64) | None, Some(Date)) => Ok((BExpr::DateAddDays { date: Box::new(b), days: Box::new(a), sub: false, pos }, Some(Date))),
                    (ArOp::Sub, Some(Date), Some(Date)) => Ok((BExpr::DateDiff(Box::new(a), Box::new(b)), Some(I64))),
                    _ => Err(err(pos, arith_message(ar, at_, bt))),
                }
            }
            B::StringConcat => {
                let (a, at_) = self.expr(left, aggs)?;
                let (b, bt) = self.expr(right, aggs)?;
                if !matches!(at_, None | Some(ColumnType::Str)) || !matches!(bt, None | Some(ColumnType::Str)) {
                    return Err(err(pos, format!("cannot concatenate {} and {}", tname(at_), tname(bt))));
                }
                Ok((BExpr::Concat(Box::new(a), Box::new(b)), Some(ColumnType::Str)))
            }
            other => Err(unsupported(pos, &format!("the operator {other}"))),
        }
    }

    fn function(&self, f: &ast::Function, pos: Pos, aggs: &mut Aggs<'_>) -> Result<Typed> {
        let name = match f.name.0.as_slice() {
            [ObjectNamePart::Identifier(id)] => id.value.to_ascii_lowercase(),
            _ => return Err(err(pos, format!("no function named {}", f.name))),
        };
        if f.over.is_some() || f.filter.is_some() || !f.within_group.is_empty() || f.null_treatment.is_some() {
            return Err(unsupported(pos, &format!("{name}() with OVER, FILTER or WITHIN GROUP")));
        }
        let list = match &f.args {
            FunctionArguments::List(l) => l,
            FunctionArguments::None => return Err(err(pos, format!("no function named {name}"))),
            FunctionArguments::Subquery(_) => return Err(unsupported(pos, "a subquery")),
        };
        if !list.clauses.is_empty() {
            return Err(unsupported(pos, &format!("clauses inside {name}()")));
        }
        let distinct = matches!(list.duplicate_treatment, Some(ast::DuplicateTreatment::Distinct));
        let mut args: Vec<&Expr> = Vec::with_capacity(list.args.len());
        let mut star = false;
        for a in &list.args {
            match a {
                FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) => args.push(e),
                FunctionArg::Unnamed(FunctionArgExpr::Wildcard) => star = true,
                _ => return Err(err(pos, format!("{name}() takes plain arguments"))),
            }
        }
        if let Some(func) = agg_func(&name) {
            if distinct && star {
                return Err(err(pos, format!("{name}(DISTINCT *) is not a thing; name a column")));
            }
            let (list_, nk) = match aggs {
                Aggs::No(place) => return Err(err(pos, format!("aggregate functions are not allowed in {place}"))),
                Aggs::Collect { list, keys, .. } => (list, keys.len()),
            };
            let (func, arg, arg_ty) = match (func, star, args.as_slice()) {
                (AggFunc::Count, true, []) => (AggFunc::CountStar, None, None),
                (_, false, [a]) => {
                    let (b, t) = Binder { scope: self.scope }.expr(a, &mut Aggs::No("the argument of an aggregate function"))?;
                    match (func, t) {
                        (AggFunc::Sum | AggFunc::Avg, t) if is_numeric(t) => {}
                        (AggFunc::Sum | AggFunc::Avg, t) => return Err(err(pos, format!("{name}() needs a number, not {}", tname(t)))),
                        _ => {}
                    }
                    (func, Some(b), t)
                }
                _ => return Err(err(pos, format!("{name}() takes one argument{}", if func == AggFunc::Count { " or *" } else { "" }))),
            };
            let ty = match func {
                AggFunc::CountStar | AggFunc::Count => Some(ColumnType::I64),
                AggFunc::Avg => Some(ColumnType::F64),
                AggFunc::Sum => Some(if arg_ty == Some(ColumnType::F64) { ColumnType::F64 } else { ColumnType::I64 }),
                AggFunc::Min | AggFunc::Max => arg_ty,
            };
            let label = short(&f.to_string());
            let i = nk + list_.len();
            list_.push(AggSpec { func, arg, arg_ty, pos, label: label.clone(), distinct });
            return Ok((BExpr::Col(i, label), ty));
        }
        if star || distinct {
            return Err(err(pos, format!("{name}() does not take * or DISTINCT")));
        }
        let mut bound = Vec::with_capacity(args.len());
        for a in &args {
            bound.push(self.expr(a, aggs)?);
        }
        let one = |bound: &mut Vec<Typed>| -> Result<Typed> {
            match bound.len() {
                1 => Ok(bound.remove(0)),
                n => Err(err(pos, format!("{name}() takes one argument, not {n}"))),
            }
        };
        match name.as_str() {
            "abs" => {
                let (x, t) = one(&mut bound)?;
                if !is_numeric(t) {
                    return Err(err(pos, format!("abs() needs a number, not {}", tname(t))));
                }
                Ok((BExpr::Func1(Func1::Abs, Box::new(x), pos), t))
            }
            "length" | "char_length" => {
                let (x, t) = one(&mut bound)?;
                if !matches!(t, None | Some(ColumnType::Str) | Some(ColumnType::Bytes)) {
                    return Err(err(pos, format!("{name}() needs a str, not {}", tname(t))));
                }
                Ok((BExpr::Func1(Func1::Length, Box::new(x), pos), Some(ColumnType::I64)))
            }
            "upper" | "lower" => {
                let (x, t) = one(&mut bound)?;
                if !matches!(t, None | Some(ColumnType::Str)) {
                    return Err(err(pos, format!("{name}() needs a str, not {}", tname(t))));
                }
                Ok((BExpr::Func1(if name == "upper" { Func1::Upper } else { Func1::Lower }, Box::new(x), pos), Some(ColumnType::Str)))
            }
            "coalesce" => {
                if bound.is_empty() {
                    return Err(err(pos, "coalesce() needs at least one argument"));
                }
                let mut ty = None;
                for (_, t) in &bound {
                    ty = match (ty, *t) {
                        (a, None) => a,
                        (None, b) => b,
                        (Some(a), Some(b)) if a == b => Some(a),
                        (Some(a), Some(b)) => return Err(err(pos, format!("coalesce() arguments have different types: {} and {}", a.name(), b.name()))),
                    };
                }
                Ok((BExpr::Coalesce(bound.into_iter().map(|b| b.0).collect()), ty))
            }
            _ => Err(err(pos, format!("no function named {name}"))),
        }
    }
}

fn arith_message(op: ArOp, a: Option<ColumnType>, b: Option<ColumnType>) -> String {
    let (a, b) = (tname(a), tname(b));
    match op {
        ArOp::Add => format!("cannot add {a} and {b}"),
        ArOp::Sub => format!("cannot subtract {b} from {a}"),
        ArOp::Mul => format!("cannot multiply {a} and {b}"),
        ArOp::Div => format!("cannot divide {a} by {b}"),
        ArOp::Rem => format!("cannot {} {a} and {b}", op.verb()),
    }
}

fn short(s: &str) -> String {
    match s.char_indices().nth(60) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s.to_owned(),
    }
}

fn literal(v: &SqlValue, pos: Pos) -> Result<Typed> {
    Ok(match v {
        SqlValue::Number(s, _) => match s.parse::<i64>() {
            Ok(i) => (BExpr::Lit(Value::I64(i)), Some(ColumnType::I64)),
            Err(_) => match s.parse::<f64>() {
                Ok(f) if f.is_finite() => (BExpr::Lit(Value::F64(f)), Some(ColumnType::F64)),
                _ => return Err(err(pos, format!("the number {} is out of range", short(s)))),
            },
        },
        SqlValue::SingleQuotedString(s) => (BExpr::Lit(Value::Str(s.clone())), Some(ColumnType::Str)),
        SqlValue::Boolean(b) => (BExpr::Lit(Value::Bool(*b)), Some(ColumnType::Bool)),
        SqlValue::Null => (BExpr::Lit(Value::Null), None),
        other => return Err(unsupported(pos, &format!("the literal {}", short(&other.to_string())))),
    })
}

fn const_u64(e: &Expr, what: &str) -> Result<u64> {
    let pos = pos_of(e);
    match e {
        Expr::Value(v) => match &v.value {
            SqlValue::Number(s, _) => s.parse::<u64>().map_err(|_| err(pos, format!("{what} must be a non-negative integer, not {}", short(s)))),
            _ => Err(err(pos, format!("{what} must be a non-negative integer"))),
        },
        _ => Err(err(pos, format!("{what} must be a non-negative integer constant"))),
    }
}

/// A bound statement: the plan and its result columns, or an `EXPLAIN` of one.
pub struct Bound {
    pub plan: Plan,
    pub columns: Vec<OutColumn>,
}

/// Binds one statement.
pub fn statement(catalog: &Catalog, stmt: &Statement) -> Result<(Bound, bool)> {
    match stmt {
        Statement::Query(q) => Ok((query(catalog, q)?, false)),
        Statement::Explain { statement, analyze, .. } => {
            if *analyze {
                return Err(unsupported(at(stmt.span()), "EXPLAIN ANALYZE"));
            }
            match statement.as_ref() {
                Statement::Query(q) => Ok((query(catalog, q)?, true)),
                other => Err(err(at(other.span()), "EXPLAIN needs a SELECT query")),
            }
        }
        other => Err(err(at(other.span()), format!("only SELECT and EXPLAIN are supported (strata sql is read-only), not: {}", short(&other.to_string())))),
    }
}

fn query(catalog: &Catalog, q: &Query) -> Result<Bound> {
    if let Some(w) = &q.with {
        return Err(unsupported(at(w.span()), "WITH"));
    }
    if q.fetch.is_some() || !q.locks.is_empty() || q.for_clause.is_some() || q.settings.is_some() || q.format_clause.is_some() || !q.pipe_operators.is_empty() {
        return Err(unsupported(at(q.span()), "this query clause"));
    }
    let (limit, offset) = match &q.limit_clause {
        None => (None, 0),
        Some(LimitClause::LimitOffset { limit, offset, limit_by }) => {
            if let Some(b) = limit_by.first() {
                return Err(unsupported(pos_of(b), "LIMIT BY"));
            }
            let limit = match limit {
                Some(Expr::Value(v)) if matches!(v.value, SqlValue::Null) => None,
                Some(l) => Some(const_u64(l, "LIMIT")?),
                None => None,
            };
            let offset = offset.as_ref().map(|o| const_u64(&o.value, "OFFSET")).transpose()?.unwrap_or(0);
            (limit, offset)
        }
        Some(LimitClause::OffsetCommaLimit { offset, limit }) => (Some(const_u64(limit, "LIMIT")?), const_u64(offset, "OFFSET")?),
    };
    let select = match q.body.as_ref() {
        SetExpr::Select(s) => s,
        SetExpr::Query(_) => return Err(unsupported(at(q.span()), "a parenthesized query")),
        SetExpr::SetOperation { op, .. } => return Err(unsupported(at(q.span()), &format!("{op}"))),
        other => return Err(unsupported(at(other.span()), "this kind of query")),
    };
    let top = limit.and_then(|l| l.checked_add(offset));
    let mut bound = select_plan(catalog, select, q.order_by.as_ref(), top)?;
    if limit.is_some() || offset > 0 {
        bound.plan = Plan::Limit { input: Box::new(bound.plan), limit, offset };
    }
    Ok(bound)
}

/// The expression a `GROUP BY` item stands for: `GROUP BY 2` is the second SELECT item, and
/// a name that is no column of the input but the alias of a SELECT item is that item.
fn group_item<'e>(g: &'e Expr, projection: &'e [SelectItem], scope: &Scope) -> Result<&'e Expr> {
    let item_expr = |it: &'e SelectItem| match it {
        SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. } => Some(e),
        _ => None,
    };
    match g {
        Expr::Value(v) => match &v.value {
            SqlValue::Number(n, _) => {
                let k: usize = n.parse().map_err(|_| err(pos_of(g), format!("GROUP BY position {n} is not in the select list")))?;
                projection
                    .get(k.wrapping_sub(1))
                    .and_then(item_expr)
                    .ok_or_else(|| err(pos_of(g), format!("GROUP BY position {n} is not an expression of the select list")))
            }
            _ => Ok(g),
        },
        Expr::Identifier(id) if scope.column(id).is_err() => {
            let alias = projection.iter().find_map(|it| match it {
                SelectItem::ExprWithAlias { expr, alias } if alias.value.eq_ignore_ascii_case(&id.value) => Some(expr),
                _ => None,
            });
            Ok(alias.unwrap_or(g))
        }
        _ => Ok(g),
    }
}

/// The output column an `ORDER BY` item names, if it names one: a position, an output
/// column's name, or the text of a SELECT item.
fn order_target(e: &Expr, columns: &[OutColumn], texts: &[Option<String>]) -> Result<Option<usize>> {
    match e {
        Expr::Value(v) => {
            if let SqlValue::Number(n, _) = &v.value {
                return match n.parse::<usize>() {
                    Ok(k) if (1..=columns.len()).contains(&k) => Ok(Some(k - 1)),
                    _ => Err(err(pos_of(e), format!("ORDER BY position {n} is not in the select list"))),
                };
            }
        }
        Expr::Identifier(id) => {
            let mut m =
                columns.iter().enumerate().filter(|(_, c)| if id.quote_style.is_some() { c.name == id.value } else { c.name.eq_ignore_ascii_case(&id.value) });
            if let (Some((i, _)), None) = (m.next(), m.next()) {
                return Ok(Some(i));
            }
        }
        _ => {}
    }
    let t = e.to_string();
    Ok(texts.iter().position(|x| x.as_deref() == Some(t.as_str())))
}

fn select_plan(catalog: &Catalog, s: &ast::Select, order_by: Option<&ast::OrderBy>, top: Option<u64>) -> Result<Bound> {
    let spos = at(s.select_token.0.span);
    let distinct = match &s.distinct {
        None => false,
        Some(ast::Distinct::Distinct) => true,
        Some(ast::Distinct::On(_)) => return Err(unsupported(spos, "DISTINCT ON")),
    };
    if s.top.is_some()
        || s.into.is_some()
        || !s.lateral_views.is_empty()
        || s.prewhere.is_some()
        || s.qualify.is_some()
        || s.connect_by.is_some()
        || !s.named_window.is_empty()
    {
        return Err(unsupported(spos, "this SELECT clause"));
    }
    if !s.cluster_by.is_empty() || !s.distribute_by.is_empty() || !s.sort_by.is_empty() || s.exclude.is_some() || s.value_table_mode.is_some() {
        return Err(unsupported(spos, "this SELECT clause"));
    }
    let group_exprs: &[Expr] = match &s.group_by {
        GroupByExpr::Expressions(e, m) if m.is_empty() => e,
        GroupByExpr::Expressions(e, _) => return Err(unsupported(e.first().map(pos_of).unwrap_or(spos), "GROUP BY with modifiers")),
        GroupByExpr::All(_) => return Err(unsupported(spos, "GROUP BY ALL")),
    };
    // FROM: nothing, or one table.
    let (scope, table) = match s.from.as_slice() {
        [] => (Scope::empty(), None),
        [twj] => {
            if let Some(j) = twj.joins.first() {
                return Err(unsupported(at(j.relation.span()), "JOIN"));
            }
            match &twj.relation {
                TableFactor::Table { name, alias, args, with_hints, version, partitions, sample, json_path, .. } => {
                    if args.is_some() || !with_hints.is_empty() || version.is_some() || !partitions.is_empty() || sample.is_some() || json_path.is_some() {
                        return Err(unsupported(at(twj.relation.span()), "this form of table reference"));
                    }
                    let ident = match name.0.as_slice() {
                        [ObjectNamePart::Identifier(id)] => id,
                        _ => return Err(err(at(name.span()), format!("no table named {name} (table names have one part)"))),
                    };
                    let found = catalog.tables.get(&ident.value).map(|t| (ident.value.clone(), t)).or_else(|| {
                        if ident.quote_style.is_some() {
                            return None;
                        }
                        let mut m = catalog.tables.iter().filter(|(n, _)| n.eq_ignore_ascii_case(&ident.value));
                        match (m.next(), m.next()) {
                            (Some((n, t)), None) => Some((n.clone(), t)),
                            _ => None,
                        }
                    });
                    let (tname_, table) = found.ok_or_else(|| err(at(ident.span), format!("no table named {:?} in this database", ident.value)))?;
                    if let Some(a) = alias {
                        if !a.columns.is_empty() {
                            return Err(unsupported(at(a.name.span), "column aliases in FROM"));
                        }
                    }
                    let scope = Scope { name: tname_.clone(), alias: alias.as_ref().map(|a| a.name.value.clone()), schema: table.schema.clone() };
                    (scope, Some((tname_, table.clone())))
                }
                TableFactor::Derived { .. } => return Err(unsupported(at(twj.relation.span()), "a subquery in FROM")),
                other => return Err(unsupported(at(other.span()), "this kind of FROM item")),
            }
        }
        [_, second, ..] => return Err(unsupported(at(second.relation.span()), "FROM with several tables (joins)")),
    };
    let b = Binder { scope: &scope };
    let filter = match &s.selection {
        Some(w) => {
            let pred = b.bool_operand(w, "WHERE", &mut Aggs::No("WHERE"))?;
            Some(pred)
        }
        None => None,
    };
    // GROUP BY keys, bound against the input.
    let mut keys = Vec::with_capacity(group_exprs.len());
    let mut key_exprs = Vec::with_capacity(group_exprs.len());
    for g in group_exprs {
        let g = group_item(g, &s.projection, &scope)?;
        let (x, t) = b.expr(g, &mut Aggs::No("GROUP BY"))?;
        keys.push(GroupKey { text: g.to_string(), col: if let BExpr::Col(i, _) = &x { Some(*i) } else { None }, ty: t });
        key_exprs.push(x);
    }
    let grouped = !keys.is_empty();
    // The projection, with aggregates collected (after GROUP BY: over the groups' rows).
    let mut aggs = Vec::new();
    let mut bare: Option<(Pos, String)> = None;
    let mut exprs = Vec::new();
    let mut columns = Vec::new();
    let mut texts: Vec<Option<String>> = Vec::new();
    for item in &s.projection {
        match item {
            SelectItem::Wildcard(opts) | SelectItem::QualifiedWildcard(_, opts) => {
                if opts.opt_ilike.is_some()
                    || opts.opt_exclude.is_some()
                    || opts.opt_except.is_some()
                    || opts.opt_replace.is_some()
                    || opts.opt_rename.is_some()
                {
                    return Err(unsupported(at(item.span()), "options of *"));
                }
                if let SelectItem::QualifiedWildcard(kind, _) = item {
                    let ok = match kind {
                        ast::SelectItemQualifiedWildcardKind::ObjectName(n) => matches!(n.0.as_slice(), [ObjectNamePart::Identifier(q)] if scope.qualifies(q)),
                        _ => false,
                    };
                    if !ok {
                        return Err(err(at(item.span()), format!("no table named {kind} in this query")));
                    }
                }
                if scope.name.is_empty() {
                    return Err(err(at(item.span()), "SELECT * needs a FROM"));
                }
                for (i, c) in scope.schema.columns.iter().enumerate() {
                    if bare.is_none() {
                        bare = Some((at(item.span()), c.name.clone()));
                    }
                    let x = if grouped {
                        match keys.iter().position(|k| k.col == Some(i)) {
                            Some(k) => BExpr::Col(k, c.name.clone()),
                            None => {
                                return Err(err(
                                    at(item.span()),
                                    format!("column {:?} must appear in the GROUP BY clause or be used in an aggregate function", c.name),
                                ))
                            }
                        }
                    } else {
                        BExpr::Col(i, c.name.clone())
                    };
                    exprs.push(x);
                    columns.push(OutColumn { name: c.name.clone(), ty: Some(c.ty) });
                    texts.push(None);
                }
            }
            SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. } => {
                let (x, t) = b.expr(e, &mut Aggs::Collect { list: &mut aggs, bare_column: &mut bare, keys: &keys })?;
                let name = match item {
                    SelectItem::ExprWithAlias { alias, .. } => alias.value.clone(),
                    _ => match e {
                        Expr::Identifier(id) => scope.column(id).map(|(i, _)| scope.schema.columns[i].name.clone()).unwrap_or_else(|_| id.value.clone()),
                        Expr::CompoundIdentifier(p) => p.last().map(|id| id.value.clone()).unwrap_or_default(),
                        e => e.to_string(),
                    },
                };
                exprs.push(x);
                columns.push(OutColumn { name, ty: t });
                texts.push(Some(e.to_string()));
            }
        }
    }
    let having = match &s.having {
        Some(h) => Some((b.bool_operand(h, "HAVING", &mut Aggs::Collect { list: &mut aggs, bare_column: &mut bare, keys: &keys })?, pos_of(h))),
        None => None,
    };
    // ORDER BY: an output column, else an expression computed as a hidden column.
    let mut sort_keys = Vec::new();
    let mut hidden = Vec::new();
    if let Some(ob) = order_by {
        let items = match &ob.kind {
            ast::OrderByKind::Expressions(v) => v,
            ast::OrderByKind::All(_) => return Err(unsupported(at(ob.span()).or(spos), "ORDER BY ALL")),
        };
        if ob.interpolate.is_some() {
            return Err(unsupported(at(ob.span()).or(spos), "INTERPOLATE"));
        }
        for it in items {
            if it.with_fill.is_some() {
                return Err(unsupported(pos_of(&it.expr), "WITH FILL"));
            }
            let desc = it.options.asc == Some(false);
            let nulls_first = it.options.nulls_first.unwrap_or(desc);
            let col = match order_target(&it.expr, &columns, &texts)? {
                Some(c) => c,
                None => {
                    if distinct {
                        return Err(err(pos_of(&it.expr), "for SELECT DISTINCT, ORDER BY expressions must appear in the select list"));
                    }
                    let (x, _) = b.expr(&it.expr, &mut Aggs::Collect { list: &mut aggs, bare_column: &mut bare, keys: &keys })?;
                    hidden.push(x);
                    exprs.len() + hidden.len() - 1
                }
            };
            sort_keys.push(SortKey { col, desc, nulls_first });
        }
    }
    let aggregated = grouped || !aggs.is_empty();
    if let (Some((_, hpos)), false) = (&having, aggregated) {
        return Err(unsupported(*hpos, "HAVING without aggregates or GROUP BY"));
    }
    if aggregated && !grouped {
        if let Some((pos, name)) = bare {
            return Err(err(pos, format!("column {name:?} must be inside an aggregate function or appear in GROUP BY")));
        }
    }
    let mut plan = match table {
        Some((name, table)) => Plan::Scan { name, table, filter },
        None => Plan::OneRow { filter },
    };
    if aggregated {
        plan = if grouped || aggs.iter().any(|a| a.distinct) {
            Plan::HashAggregate { input: Box::new(plan), keys: key_exprs, aggs }
        } else {
            Plan::Aggregate { input: Box::new(plan), aggs }
        };
        if let Some((h, _)) = having {
            plan = Plan::Filter { input: Box::new(plan), pred: h };
        }
    }
    let n = exprs.len();
    let width = n + hidden.len();
    exprs.extend(hidden);
    plan = Plan::Project { input: Box::new(plan), exprs };
    if distinct {
        let keys = columns.iter().enumerate().map(|(i, c)| BExpr::Col(i, c.name.clone())).collect();
        plan = Plan::HashAggregate { input: Box::new(plan), keys, aggs: Vec::new() };
    }
    if !sort_keys.is_empty() {
        plan = Plan::Sort { input: Box::new(plan), keys: sort_keys, top };
    }
    if width > n {
        plan = Plan::Project { input: Box::new(plan), exprs: columns.iter().enumerate().map(|(i, c)| BExpr::Col(i, c.name.clone())).collect() };
    }
    Ok(Bound { plan, columns })
}
