//! From sqlparser's AST to a [`Plan`]: names resolved against the catalog, every
//! expression typed, the constructs of this slice turned into plan nodes and everything
//! else refused with an error that names its position.

use sqlparser::ast::{
    self, BinaryOperator as B, CastKind, DataType, DateTimeField, Expr, FunctionArg, FunctionArgExpr, FunctionArguments, GroupByExpr, LimitClause,
    ObjectNamePart, Query, SelectItem, SetExpr, Spanned, Statement, TableFactor, UnaryOperator, Value as SqlValue,
};
use sqlparser::tokenizer::Span;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;

use super::agg::{AggKind, St};
use super::exec::{join_estimate, AggFunc, AggSpec, Plan, SortKey};
use super::expr::{can_cast, err, tname, ArOp, BExpr, CmpOp, DatePart, Func1, Pos};
use super::join::JoinKind;
use super::sample::{sampled_domain, sampled_widths};
use super::subquery::{Param, ScalarSub};
use super::width::{col_widths, RECORD};
use crate::access::catalog::Catalog;
use crate::access::table::text::parse_date;
use crate::access::table::{ColumnType, Value};
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

/// A relation of FROM: its name (a table's, or the alias of a subquery), its alias, its
/// columns and where they start in the joined row. `hidden`: a decorrelated subquery's
/// groups, joined after FROM's relations (not part of `*`).
#[derive(Clone)]
struct Rel {
    name: String,
    alias: Option<String>,
    cols: Vec<(String, Option<ColumnType>)>,
    offset: usize,
    hidden: bool,
}

impl Rel {
    /// The column `id`: exact for quoted names; for unquoted ones an exact match, else the
    /// one column whose name matches ignoring case.
    fn find(&self, id: &ast::Ident) -> Option<usize> {
        self.cols.iter().position(|c| c.0 == id.value).or_else(|| {
            if id.quote_style.is_some() {
                return None;
            }
            let mut m = self.cols.iter().enumerate().filter(|(_, c)| c.0.eq_ignore_ascii_case(&id.value));
            match (m.next(), m.next()) {
                (Some((i, _)), None) => Some(i),
                _ => None,
            }
        })
    }

    fn qualifies(&self, q: &ast::Ident) -> bool {
        let same = |n: &str| if q.quote_style.is_some() { n == q.value } else { n.eq_ignore_ascii_case(&q.value) };
        match &self.alias {
            Some(a) => same(a),
            None => same(&self.name),
        }
    }

    fn shown(&self) -> String {
        format!("{:?}", self.alias.as_ref().unwrap_or(&self.name))
    }
}

/// The relations in scope; a row is their columns one after the other. In a subquery,
/// the first `local_from` relations are the enclosing query's: a name is looked up in the
/// subquery's own relations first, then in those.
#[derive(Clone)]
struct Scope {
    rels: Vec<Rel>,
    local_from: usize,
}

impl Scope {
    fn new(rels: Vec<Rel>) -> Scope {
        Scope { rels, local_from: 0 }
    }

    /// `local` inside `outer`: the row is the outer row, then the local one.
    fn nest(outer: &Scope, local: &Scope) -> Scope {
        let w = outer.width();
        let mut rels = outer.rels.clone();
        rels.extend(local.rels.iter().map(|r| Rel { offset: r.offset + w, ..r.clone() }));
        Scope { rels, local_from: outer.rels.len() }
    }

    fn width(&self) -> usize {
        self.rels.iter().map(|r| r.cols.len()).sum()
    }

    /// The width of the relations of FROM (the hidden ones come after them).
    fn visible_width(&self) -> usize {
        self.rels.iter().filter(|r| !r.hidden).map(|r| r.cols.len()).sum()
    }

    /// The relations that names are looked up in, the enclosing query's last.
    fn layers(&self) -> [std::ops::Range<usize>; 2] {
        [self.local_from..self.rels.len(), 0..self.local_from]
    }

    fn shown_rels(&self) -> Vec<&Rel> {
        self.rels[self.local_from..].iter().filter(|r| !r.hidden).collect()
    }

    /// The relation of column `i`.
    fn rel_of(&self, i: usize) -> usize {
        self.rels.iter().rposition(|r| r.offset <= i).unwrap_or(0)
    }

    fn col_name(&self, i: usize) -> String {
        let r = &self.rels[self.rel_of(i)];
        r.cols[i - r.offset].0.clone()
    }

    fn col_type(&self, i: usize) -> Option<ColumnType> {
        let r = &self.rels[self.rel_of(i)];
        r.cols[i - r.offset].1
    }

    /// The column `id` of whichever relation has it (an error if none or several do).
    fn column(&self, id: &ast::Ident) -> Result<(usize, Option<ColumnType>)> {
        let mut hits: Vec<(usize, usize)> = Vec::new();
        for layer in self.layers() {
            if hits.is_empty() {
                hits = layer.filter_map(|r| self.rels[r].find(id).map(|c| (r, c))).collect();
            }
        }
        let shown = self.shown_rels();
        match hits.as_slice() {
            [(r, c)] => Ok((self.rels[*r].offset + c, self.rels[*r].cols[*c].1)),
            [] if shown.is_empty() => Err(err(at(id.span), format!("no column named {:?} (the query has no FROM)", id.value))),
            [] if shown.len() == 1 => Err(err(at(id.span), format!("no column named {:?} in table {}", id.value, shown[0].shown()))),
            [] => Err(err(at(id.span), format!("no column named {:?} in tables {}", id.value, shown.iter().map(|r| r.shown()).collect::<Vec<_>>().join(", ")))),
            [(a, _), (b, _), ..] => Err(err(
                at(id.span),
                format!("column name {:?} is ambiguous (tables {} and {} have it); qualify it", id.value, self.rels[*a].shown(), self.rels[*b].shown()),
            )),
        }
    }

    /// The relation `q` names.
    fn rel_named(&self, q: &ast::Ident) -> Result<usize> {
        for layer in self.layers() {
            let mut m = layer.filter(|r| !self.rels[*r].hidden && self.rels[*r].qualifies(q));
            match (m.next(), m.next()) {
                (Some(i), None) => return Ok(i),
                (None, _) => {}
                _ => return Err(err(at(q.span), format!("table name {:?} is given twice in FROM; use aliases", q.value))),
            }
        }
        Err(err(at(q.span), format!("no table named {:?} in this query", q.value)))
    }

    /// The column `q.id`.
    fn qualified(&self, q: &ast::Ident, id: &ast::Ident) -> Result<(usize, Option<ColumnType>)> {
        let r = &self.rels[self.rel_named(q)?];
        match r.find(id) {
            Some(c) => Ok((r.offset + c, r.cols[c].1)),
            None => Err(err(at(id.span), format!("no column named {:?} in table {}", id.value, r.shown()))),
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

/// What the binding of one statement shares: the catalog, the uncorrelated subqueries
/// computed before the rows ([`Plan::Scalars`]), the `WITH` queries in scope.
struct Cx<'c> {
    catalog: &'c Catalog,
    /// The buffer manager, when given: inner joins are ordered by sampled row estimates.
    bm: Option<&'c crate::buffer::BufferManager>,
    scalars: RefCell<Vec<ScalarSub>>,
    /// The parameter of each subquery bound as one, by its place in the text (a subquery
    /// looked at twice, or a `WITH` query inlined twice, is computed once).
    memo: RefCell<HashMap<MemoKey, Typed>>,
    ctes: RefCell<Vec<Rc<ast::Cte>>>,
    queries: Cell<usize>,
    /// The scopes of the queries around the one being bound (for messages).
    enclosing: RefCell<Vec<Scope>>,
}

/// The most (sub)queries a statement may bind, `WITH` queries counted each time they are
/// inlined (so that `WITH` cannot make planning exponential).
pub const MAX_SUBQUERIES: usize = 1000;

impl Cx<'_> {
    /// The `WITH` query `id` names (the innermost), and its place in the stack.
    fn cte(&self, id: &ast::Ident) -> Option<(usize, Rc<ast::Cte>)> {
        let ctes = self.ctes.borrow();
        let same = |n: &str| if id.quote_style.is_some() { n == id.value } else { n.eq_ignore_ascii_case(&id.value) };
        ctes.iter().enumerate().rev().find(|(_, c)| same(&c.alias.name.value)).map(|(i, c)| (i, c.clone()))
    }
}

/// A subquery's place in the text (start and end line and column), and whether it is an `EXISTS`.
type MemoKey = (bool, u64, u64, u64, u64);

fn memo_key(q: &Query, exists: bool) -> Option<MemoKey> {
    let sp = q.span();
    (sp.start.line > 0).then_some((exists, sp.start.line, sp.start.column, sp.end.line, sp.end.column))
}

/// Expressions are bound against `scope`; a subquery in them has `own` as its enclosing
/// query's scope (the same, except for the conditions of a subquery's WHERE, bound with the
/// enclosing query's relations in front).
#[derive(Clone, Copy)]
struct Binder<'s> {
    cx: &'s Cx<'s>,
    scope: &'s Scope,
    own: &'s Scope,
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

    /// Binds `e`, folding its constant subexpressions ([`BExpr::fold_constants`]).
    fn expr(&self, e: &Expr, aggs: &mut Aggs<'_>) -> Result<Typed> {
        let (mut b, t) = self.expr_unfolded(e, aggs)?;
        b.fold_constants();
        Ok((b, t))
    }

    fn expr_unfolded(&self, e: &Expr, aggs: &mut Aggs<'_>) -> Result<Typed> {
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
                [q, id] => self.column(id, Some(q), aggs)?,
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
            Expr::Subquery(q) => self.subquery_value(q, pos, false)?,
            Expr::Exists { subquery, negated } => {
                let (p, t) = self.subquery_value(subquery, pos, true)?;
                (if *negated { BExpr::Not(Box::new(p)) } else { p }, t)
            }
            Expr::InSubquery { .. } => return Err(unsupported(pos, "x IN (SELECT ...) other than as a condition of WHERE (joined to the others by AND)")),
            Expr::Wildcard(_) | Expr::QualifiedWildcard(..) => return Err(err(pos, "* is only allowed as a whole SELECT item or in count(*)")),
            other => return Err(unsupported(pos, &format!("the expression {}", short(&other.to_string())))),
        })
    }

    fn column(&self, id: &ast::Ident, q: Option<&ast::Ident>, aggs: &mut Aggs<'_>) -> Result<Typed> {
        let found = match q {
            Some(q) => self.scope.qualified(q, id),
            None => self.scope.column(id),
        };
        let (i, t) = found.map_err(|e| self.enclosing_hint(e, id, q))?;
        let name = match q {
            Some(q) => format!("{}.{}", q.value, self.scope.col_name(i)),
            None => self.scope.col_name(i),
        };
        if let Aggs::Collect { bare_column, keys, .. } = aggs {
            if !keys.is_empty() {
                return match keys.iter().position(|k| k.col == Some(i)) {
                    Some(k) => Ok((BExpr::Col(k, name), t)),
                    None => Err(err(at(id.span), format!("column {name:?} must appear in the GROUP BY clause or be used in an aggregate function"))),
                };
            }
            if bare_column.is_none() {
                **bare_column = Some((at(id.span), name.clone()));
            }
        }
        Ok((BExpr::Col(i, name), t))
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
        if let Some(folded) = decimal_fold(left, op, right) {
            return literal(&SqlValue::Number(folded, false), pos);
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
                    let (b, t) = self.expr(a, &mut Aggs::No("the argument of an aggregate function"))?;
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

/// A decimal number literal as (digits, digits after the point), or None.
fn decimal_of(e: &Expr) -> Option<(i128, u32)> {
    let mut e = e;
    while let Expr::Nested(x) = e {
        e = x;
    }
    let s = match e {
        Expr::Value(v) => match &v.value {
            SqlValue::Number(s, _) => s.as_str(),
            _ => return None,
        },
        Expr::UnaryOp { op: UnaryOperator::Minus, expr } => return decimal_of(expr).and_then(|(m, k)| Some((m.checked_neg()?, k))),
        _ => return None,
    };
    let (int, frac) = s.split_once('.').unwrap_or((s, ""));
    if int.len() + frac.len() > 30 || !int.bytes().chain(frac.bytes()).all(|b| b.is_ascii_digit()) || int.len() + frac.len() == 0 {
        return None;
    }
    Some((format!("{int}{frac}").parse().ok()?, frac.len() as u32))
}

/// `a + b`, `a - b` or `a * b` of two number literals with a decimal point, computed
/// exactly and given as the literal text of the result: so that `0.06 + 0.01` is the `f64`
/// nearest 0.07, as a column's 0.07 is (TPC-H Q6's `BETWEEN 0.06 - 0.01 AND 0.06 + 0.01`),
/// not the sum of two rounded `f64`s. Integer literals are left to the `i64` arithmetic.
fn decimal_fold(left: &Expr, op: &B, right: &Expr) -> Option<String> {
    if !matches!(op, B::Plus | B::Minus | B::Multiply) {
        return None;
    }
    let ((a, ka), (b, kb)) = (decimal_of(left)?, decimal_of(right)?);
    if ka == 0 && kb == 0 {
        return None;
    }
    let (m, k) = match op {
        B::Multiply => (a.checked_mul(b)?, ka + kb),
        _ => {
            let k = ka.max(kb);
            let a = a.checked_mul(10i128.checked_pow(k - ka)?)?;
            let b = b.checked_mul(10i128.checked_pow(k - kb)?)?;
            (if matches!(op, B::Plus) { a.checked_add(b)? } else { a.checked_sub(b)? }, k)
        }
    };
    let digits = m.unsigned_abs().to_string();
    let k = k as usize;
    let digits = if digits.len() <= k { format!("{}{digits}", "0".repeat(k + 1 - digits.len())) } else { digits };
    let (int, frac) = digits.split_at(digits.len() - k);
    Some(format!("{}{int}.{frac}", if m < 0 { "-" } else { "" }))
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
pub fn statement<'c>(catalog: &'c Catalog, bm: Option<&'c crate::buffer::BufferManager>, stmt: &Statement) -> Result<(Bound, bool)> {
    let cx = Cx {
        catalog,
        bm,
        scalars: RefCell::new(Vec::new()),
        memo: RefCell::new(HashMap::new()),
        ctes: RefCell::new(Vec::new()),
        queries: Cell::new(0),
        enclosing: RefCell::new(Vec::new()),
    };
    let (mut bound, explain) = match stmt {
        Statement::Query(q) => (query(&cx, q)?, false),
        Statement::Explain { statement, analyze, .. } => {
            if *analyze {
                return Err(unsupported(at(stmt.span()), "EXPLAIN ANALYZE"));
            }
            match statement.as_ref() {
                Statement::Query(q) => (query(&cx, q)?, true),
                other => return Err(err(at(other.span()), "EXPLAIN needs a SELECT query")),
            }
        }
        other => {
            return Err(err(at(other.span()), format!("only SELECT and EXPLAIN are supported (strata sql is read-only), not: {}", short(&other.to_string()))))
        }
    };
    let subs = cx.scalars.into_inner();
    if !subs.is_empty() {
        bound.plan = Plan::Scalars { subs, input: Box::new(bound.plan) };
    }
    Ok((bound, explain))
}

/// A query bound inside another: its plan, or, when its WHERE reads the enclosing query's
/// columns, what the enclosing query needs to decorrelate it.
enum Sub<'q> {
    Plain(Bound),
    Corr(Corr<'q>),
}

/// A correlated subquery: the rows of its FROM filtered by the conditions of its WHERE that
/// are its own, the conditions that read the enclosing query's columns (bound over the
/// enclosing row followed by the subquery's), its SELECT, and whether that aggregates.
struct Corr<'q> {
    fw: FromWhere,
    select: &'q ast::Select,
    aggregated: bool,
    pos: Pos,
}

/// A query that reads no enclosing query.
fn query(cx: &Cx<'_>, q: &Query) -> Result<Bound> {
    match query_in(cx, q, None)? {
        Sub::Plain(b) => Ok(b),
        Sub::Corr(c) => Err(err(c.pos, "a correlated subquery without an enclosing query")),
    }
}

/// A query, inside the query whose scope is `outer` if any.
fn query_in<'q>(cx: &Cx<'_>, q: &'q Query, outer: Option<&Scope>) -> Result<Sub<'q>> {
    cx.queries.set(cx.queries.get() + 1);
    if cx.queries.get() > MAX_SUBQUERIES {
        return Err(err(at(q.span()), format!("the query has more than {MAX_SUBQUERIES} subqueries (WITH queries count each time they are used)")));
    }
    let mark = cx.ctes.borrow().len();
    if let Some(w) = &q.with {
        if w.recursive {
            return Err(unsupported(at(w.span()), "WITH RECURSIVE"));
        }
        for (k, cte) in w.cte_tables.iter().enumerate() {
            let name = &cte.alias.name;
            if w.cte_tables[..k].iter().any(|o| o.alias.name.value.eq_ignore_ascii_case(&name.value)) {
                cx.ctes.borrow_mut().truncate(mark);
                return Err(err(at(name.span), format!("WITH names {:?} twice", name.value)));
            }
            if cte.from.is_some() {
                cx.ctes.borrow_mut().truncate(mark);
                return Err(unsupported(at(name.span), "WITH ... FROM"));
            }
            cx.ctes.borrow_mut().push(Rc::new(cte.clone()));
        }
    }
    if let Some(o) = outer {
        cx.enclosing.borrow_mut().push(o.clone());
    }
    let r = query_body(cx, q, outer);
    if outer.is_some() {
        cx.enclosing.borrow_mut().pop();
    }
    cx.ctes.borrow_mut().truncate(mark);
    r
}

fn query_body<'q>(cx: &Cx<'_>, q: &'q Query, outer: Option<&Scope>) -> Result<Sub<'q>> {
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
    let mut bound = match select_plan(cx, select, q.order_by.as_ref(), top, outer)? {
        Sub::Plain(b) => b,
        Sub::Corr(mut c) => {
            if q.order_by.is_some() || limit.is_some() || offset > 0 {
                return Err(unsupported(at(q.span()), "ORDER BY, LIMIT or OFFSET in a correlated subquery"));
            }
            c.pos = at(q.span());
            return Ok(Sub::Corr(c));
        }
    };
    if limit.is_some() || offset > 0 {
        bound.plan = Plan::Limit { input: Box::new(bound.plan), limit, offset };
    }
    Ok(Sub::Plain(bound))
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

fn select_plan<'q>(cx: &Cx<'_>, s: &'q ast::Select, order_by: Option<&ast::OrderBy>, top: Option<u64>, outer: Option<&Scope>) -> Result<Sub<'q>> {
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
    // FROM: the relations, then the joins planned with WHERE's conjuncts.
    // The words of the query: the columns it may read (to weigh join estimates by width).
    let mut text = s.to_string();
    if let Some(o) = order_by {
        text.push(' ');
        text.push_str(&o.to_string());
    }
    let used: std::collections::HashSet<String> =
        text.split(|c: char| !(c.is_alphanumeric() || c == '_')).filter(|w| !w.is_empty()).map(str::to_lowercase).collect();
    let fw = from_where(cx, &s.from, s.selection.as_ref(), outer, &used)?;
    if let (false, Some(outer)) = (fw.corr.is_empty(), outer) {
        // A correlated subquery: what it is joined by is left to the enclosing query.
        if !group_exprs.is_empty() || s.having.is_some() {
            return Err(unsupported(spos, "GROUP BY or HAVING in a correlated subquery"));
        }
        let full = Scope::nest(outer, &fw.scope);
        let b = Binder { cx, scope: &full, own: &fw.scope };
        let (mut aggs, mut bare) = (Vec::new(), None);
        for item in &s.projection {
            if let SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. } = item {
                b.expr(e, &mut Aggs::Collect { list: &mut aggs, bare_column: &mut bare, keys: &[] })?;
            }
        }
        return Ok(Sub::Corr(Corr { aggregated: !aggs.is_empty(), fw, select: s, pos: spos }));
    }
    let scope = fw.scope;
    let b = Binder { cx, scope: &scope, own: &scope };
    let mut plan = fw.plan;
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
                let range = match item {
                    SelectItem::QualifiedWildcard(kind, _) => {
                        let r = match kind {
                            ast::SelectItemQualifiedWildcardKind::ObjectName(n) => match n.0.as_slice() {
                                [ObjectNamePart::Identifier(q)] => scope.rel_named(q).ok(),
                                _ => None,
                            },
                            _ => None,
                        };
                        let r = r.ok_or_else(|| err(at(item.span()), format!("no table named {kind} in this query")))?;
                        scope.rels[r].offset..scope.rels[r].offset + scope.rels[r].cols.len()
                    }
                    _ => 0..scope.visible_width(),
                };
                if scope.rels.is_empty() {
                    return Err(err(at(item.span()), "SELECT * needs a FROM"));
                }
                for i in range {
                    let (name, ty) = (scope.col_name(i), scope.col_type(i));
                    if bare.is_none() {
                        bare = Some((at(item.span()), name.clone()));
                    }
                    let x = if grouped {
                        match keys.iter().position(|k| k.col == Some(i)) {
                            Some(k) => BExpr::Col(k, name.clone()),
                            None => {
                                return Err(err(
                                    at(item.span()),
                                    format!("column {name:?} must appear in the GROUP BY clause or be used in an aggregate function"),
                                ))
                            }
                        }
                    } else {
                        BExpr::Col(i, name.clone())
                    };
                    exprs.push(x);
                    columns.push(OutColumn { name, ty });
                    texts.push(None);
                }
            }
            SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. } => {
                let (x, t) = b.expr(e, &mut Aggs::Collect { list: &mut aggs, bare_column: &mut bare, keys: &keys })?;
                let name = match item {
                    SelectItem::ExprWithAlias { alias, .. } => alias.value.clone(),
                    _ => match e {
                        Expr::Identifier(id) => scope.column(id).map(|(i, _)| scope.col_name(i)).unwrap_or_else(|_| id.value.clone()),
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
    Ok(Sub::Plain(Bound { plan, columns }))
}

/// One step of FROM: relation `rel` joined (`kind`, `on`) to the relations before it.
struct Step<'q> {
    rel: usize,
    kind: JoinKind,
    on: Option<&'q Expr>,
}

fn rename_cols(rel: &mut Rel, a: &ast::TableAlias) -> Result<()> {
    if a.columns.len() > rel.cols.len() {
        return Err(err(at(a.name.span), format!("{} has {} columns, the alias names {}", rel.shown(), rel.cols.len(), a.columns.len())));
    }
    for (c, n) in rel.cols.iter_mut().zip(&a.columns) {
        c.0 = n.name.value.clone();
    }
    Ok(())
}

/// A table or a subquery of FROM, and its plan.
fn table_factor(cx: &Cx<'_>, tf: &TableFactor) -> Result<(Rel, Plan)> {
    match tf {
        TableFactor::Table { name, alias, args, with_hints, version, partitions, sample, json_path, .. } => {
            if args.is_some() || !with_hints.is_empty() || version.is_some() || !partitions.is_empty() || sample.is_some() || json_path.is_some() {
                return Err(unsupported(at(tf.span()), "this form of table reference"));
            }
            let ident = match name.0.as_slice() {
                [ObjectNamePart::Identifier(id)] => id,
                _ => return Err(err(at(name.span()), format!("no table named {name} (table names have one part)"))),
            };
            if let Some((i, cte)) = cx.cte(ident) {
                // A WITH query, inlined: bound where it is used, seeing the WITH queries before it.
                let later = cx.ctes.borrow_mut().split_off(i);
                let bound = query(cx, &cte.query);
                cx.ctes.borrow_mut().extend(later);
                let bound = bound?;
                let cols = bound.columns.iter().map(|c| (c.name.clone(), c.ty)).collect();
                let mut rel = Rel { name: cte.alias.name.value.clone(), alias: alias.as_ref().map(|a| a.name.value.clone()), cols, offset: 0, hidden: false };
                rename_cols(&mut rel, &cte.alias)?;
                if let Some(a) = alias {
                    rename_cols(&mut rel, a)?;
                }
                return Ok((rel, bound.plan));
            }
            let found = cx.catalog.tables.get(&ident.value).map(|t| (ident.value.clone(), t)).or_else(|| {
                if ident.quote_style.is_some() {
                    return None;
                }
                let mut m = cx.catalog.tables.iter().filter(|(n, _)| n.eq_ignore_ascii_case(&ident.value));
                match (m.next(), m.next()) {
                    (Some((n, t)), None) => Some((n.clone(), t)),
                    _ => None,
                }
            });
            let (tname_, table) = found.ok_or_else(|| err(at(ident.span), format!("no table named {:?} in this database", ident.value)))?;
            let cols = table.schema.columns.iter().map(|c| (c.name.clone(), Some(c.ty))).collect();
            let mut rel = Rel { name: tname_.clone(), alias: alias.as_ref().map(|a| a.name.value.clone()), cols, offset: 0, hidden: false };
            if let Some(a) = alias {
                rename_cols(&mut rel, a)?;
            }
            Ok((rel, Plan::Scan { name: tname_, table: table.clone(), filter: None }))
        }
        TableFactor::Derived { lateral, subquery, alias, .. } => {
            if *lateral {
                return Err(unsupported(at(tf.span()), "LATERAL"));
            }
            let bound = query(cx, subquery)?;
            let name = alias.as_ref().map_or_else(|| "subquery".to_owned(), |a| a.name.value.clone());
            let mut rel = Rel { name, alias: None, cols: bound.columns.iter().map(|c| (c.name.clone(), c.ty)).collect(), offset: 0, hidden: false };
            if let Some(a) = alias {
                rename_cols(&mut rel, a)?;
            }
            Ok((rel, bound.plan))
        }
        TableFactor::NestedJoin { .. } => Err(unsupported(at(tf.span()), "a parenthesized join")),
        other => Err(unsupported(at(other.span()), "this kind of FROM item")),
    }
}

/// The relations of FROM (in the order written) with their plans, and the join steps.
fn from_clause<'q>(cx: &Cx<'_>, from: &'q [ast::TableWithJoins]) -> Result<(Scope, Vec<Plan>, Vec<Step<'q>>)> {
    let (mut rels, mut plans, mut steps) = (Vec::new(), Vec::new(), Vec::new());
    let mut offset = 0;
    let mut add = |tf: &TableFactor, rels: &mut Vec<Rel>| -> Result<usize> {
        let (mut rel, plan) = table_factor(cx, tf)?;
        rel.offset = offset;
        offset += rel.cols.len();
        rels.push(rel);
        plans.push(plan);
        Ok(rels.len() - 1)
    };
    for twj in from {
        let r = add(&twj.relation, &mut rels)?;
        steps.push(Step { rel: r, kind: JoinKind::Inner, on: None });
        for j in &twj.joins {
            use ast::{JoinConstraint as C, JoinOperator as O};
            let (kind, c) = match &j.join_operator {
                O::Join(c) | O::Inner(c) | O::CrossJoin(c) => (JoinKind::Inner, c),
                O::Left(c) | O::LeftOuter(c) => (JoinKind::Left, c),
                _ => return Err(unsupported(at(j.relation.span()), "this kind of join (inner, LEFT [OUTER] and CROSS are)")),
            };
            let on = match c {
                C::On(e) => Some(e),
                C::None => None,
                C::Using(_) => return Err(unsupported(at(j.relation.span()), "JOIN ... USING")),
                C::Natural => return Err(unsupported(at(j.relation.span()), "NATURAL JOIN")),
            };
            if kind == JoinKind::Left && on.is_none() {
                return Err(err(at(j.relation.span()), "LEFT JOIN needs ON"));
            }
            let r = add(&j.relation, &mut rels)?;
            steps.push(Step { rel: r, kind, on });
        }
    }
    Ok((Scope::new(rels), plans, steps))
}

/// A bound conjunct of WHERE or ON: the predicate, the relations it reads, and its two
/// sides if it is an equality (a join key candidate).
struct Conj {
    pred: BExpr,
    rels: Vec<usize>,
    equi: Option<(BExpr, Vec<usize>, BExpr, Vec<usize>)>,
    /// The type of both sides of `equi`.
    equi_ty: Option<ColumnType>,
    applied: bool,
    pos: Pos,
}

impl Conj {
    /// The conjunct of a subquery's WHERE bound over the enclosing row (`ko` relations,
    /// `wo` columns) then the subquery's, as a conjunct of the subquery's row alone.
    fn shifted(mut self, ko: usize, wo: usize) -> Conj {
        let down = |e: &mut BExpr| e.map_cols(&|i| i - wo);
        down(&mut self.pred);
        self.rels.iter_mut().for_each(|r| *r -= ko);
        if let Some((x, rx, y, ry)) = &mut self.equi {
            down(x);
            down(y);
            rx.iter_mut().chain(ry.iter_mut()).for_each(|r| *r -= ko);
        }
        self
    }

    /// For a conjunct over the enclosing row (`ko` relations) then the subquery's: its two
    /// sides (enclosing, subquery's) if it is an equality of an expression of each.
    fn split(&self, ko: usize) -> Option<(&BExpr, &BExpr)> {
        let (x, rx, y, ry) = self.equi.as_ref()?;
        let outer = |r: &Vec<usize>| r.iter().all(|q| *q < ko);
        let inner = |r: &Vec<usize>| r.iter().all(|q| *q >= ko);
        if outer(rx) && inner(ry) {
            Some((x, y))
        } else if outer(ry) && inner(rx) {
            Some((y, x))
        } else {
            None
        }
    }
}

fn split_and<'e>(e: &'e Expr, out: &mut Vec<&'e Expr>) {
    match e {
        Expr::BinaryOp { left, op: B::And, right } => {
            split_and(left, out);
            split_and(right, out);
        }
        Expr::Nested(x) if matches!(x.as_ref(), Expr::BinaryOp { op: B::And, .. } | Expr::Nested(_)) => split_and(x, out),
        _ => out.push(e),
    }
}

fn rels_of(scope: &Scope, e: &BExpr) -> Vec<usize> {
    let mut cols = Vec::new();
    e.cols(&mut cols);
    let mut r: Vec<usize> = cols.into_iter().map(|c| scope.rel_of(c)).collect();
    r.sort_unstable();
    r.dedup();
    r
}

fn bind_conj(b: &Binder<'_>, e: &Expr, place: &'static str) -> Result<Conj> {
    let pred = b.bool_operand(e, place, &mut Aggs::No(place))?;
    let rels = rels_of(b.scope, &pred);
    let mut inner = e;
    while let Expr::Nested(x) = inner {
        inner = x;
    }
    let (equi, equi_ty) = match inner {
        Expr::BinaryOp { left, op: B::Eq, right } => {
            let x = b.expr(left, &mut Aggs::No(place))?;
            let y = b.expr(right, &mut Aggs::No(place))?;
            equi_sides(b.scope, x, y, pos_of(left), pos_of(right))
        }
        _ => (None, None),
    };
    Ok(Conj { pred, rels, equi, equi_ty, applied: false, pos: pos_of(e) })
}

type Equi = (Option<(BExpr, Vec<usize>, BExpr, Vec<usize>)>, Option<ColumnType>);

/// The sides of an equality as join keys (of one type: an i64 side with an f64 one is cast),
/// if each reads some relation.
fn equi_sides(scope: &Scope, (x, tx): Typed, (y, ty): Typed, xpos: Pos, ypos: Pos) -> Equi {
    let (rx, ry) = (rels_of(scope, &x), rels_of(scope, &y));
    let num = |t| matches!(t, Some(ColumnType::I64) | Some(ColumnType::F64));
    if rx.is_empty() || ry.is_empty() || !(tx == ty || (num(tx) && num(ty))) {
        (None, None)
    } else if tx == ty {
        (Some((x, rx, y, ry)), tx)
    } else if tx == Some(ColumnType::I64) {
        (Some((BExpr::Cast(Box::new(x), ColumnType::F64, xpos), rx, y, ry)), Some(ColumnType::F64))
    } else {
        (Some((x, rx, BExpr::Cast(Box::new(y), ColumnType::F64, ypos), ry)), Some(ColumnType::F64))
    }
}

/// `a op b` as a conjunct (types checked as for a comparison in the text).
fn compare_conj(scope: &Scope, op: CmpOp, a: Typed, b: Typed, (pos, apos, bpos): (Pos, Pos, Pos)) -> Result<Conj> {
    let b = coerce_to(b, a.1, bpos)?;
    let a = coerce_to(a, b.1, apos)?;
    if !comparable(a.1, b.1) {
        return Err(err(pos, format!("cannot compare {} and {}", tname(a.1), tname(b.1))));
    }
    let pred = BExpr::Cmp(op, Box::new(a.0.clone()), Box::new(b.0.clone()));
    let rels = rels_of(scope, &pred);
    let (equi, equi_ty) = if op == CmpOp::Eq { equi_sides(scope, a, b, apos, bpos) } else { (None, None) };
    Ok(Conj { pred, rels, equi, equi_ty, applied: false, pos })
}

fn and_all(mut preds: Vec<BExpr>) -> Option<BExpr> {
    let first = if preds.is_empty() { return None } else { preds.remove(0) };
    Some(preds.into_iter().fold(first, |a, b| BExpr::And(Box::new(a), Box::new(b))))
}

fn remapped(e: &BExpr, map: &[usize]) -> BExpr {
    let mut e = e.clone();
    e.map_cols(&|i| map[i]);
    e
}

fn add_filter(plan: &mut Plan, pred: BExpr) {
    let p = std::mem::replace(plan, Plan::OneRow { filter: None });
    *plan = match p {
        Plan::Scan { name, table, filter } => Plan::Scan {
            name,
            table,
            filter: Some(match filter {
                Some(f) => BExpr::And(Box::new(f), Box::new(pred)),
                None => pred,
            }),
        },
        p => Plan::Filter { input: Box::new(p), pred },
    };
}

/// Where each column of the joined row (in FROM's order) is in a row of `layout`'s
/// relations.
fn layout_map(scope: &Scope, layout: &[usize]) -> Vec<usize> {
    let mut map = vec![usize::MAX; scope.width()];
    let mut at = 0;
    for &r in layout {
        let rel = &scope.rels[r];
        for c in 0..rel.cols.len() {
            map[rel.offset + c] = at + c;
        }
        at += rel.cols.len();
    }
    map
}

/// A subquery of WHERE: `x [NOT] IN (SELECT ...)` or `[NOT] EXISTS (SELECT ...)`, either
/// uncorrelated or decorrelated into a semi or anti join.
enum SubFilter {
    In { x: BExpr, plan: Plan, negated: bool },
    Exists { plan: Plan, negated: bool },
    Join { plan: Plan, kind: JoinKind, left_keys: Vec<BExpr>, right_keys: Vec<BExpr>, residual: Option<BExpr>, right_width: usize },
}

/// The one SELECT item of a subquery.
fn single_item<'q>(s: &'q ast::Select, pos: Pos, what: &str) -> Result<&'q Expr> {
    match s.projection.as_slice() {
        [SelectItem::UnnamedExpr(e)] | [SelectItem::ExprWithAlias { expr: e, .. }] => Ok(e),
        items => Err(err(
            pos,
            format!("the subquery of {what} must return one column, not {}", if items.len() == 1 { "*".to_owned() } else { items.len().to_string() }),
        )),
    }
}

/// `x` and `y` as keys of one type (an i64 side with an f64 one is cast).
fn aligned((x, tx): Typed, (y, ty): Typed, pos: Pos) -> Result<(BExpr, BExpr)> {
    if !comparable(tx, ty) {
        return Err(err(pos, format!("cannot compare {} and {}", tname(tx), tname(ty))));
    }
    Ok(match (tx, ty) {
        (Some(ColumnType::I64), Some(ColumnType::F64)) => (BExpr::Cast(Box::new(x), ColumnType::F64, pos), y),
        (Some(ColumnType::F64), Some(ColumnType::I64)) => (x, BExpr::Cast(Box::new(y), ColumnType::F64, pos)),
        _ => (x, y),
    })
}

fn sub_filter(cx: &Cx<'_>, b: &Binder<'_>, e: &Expr, negated: bool) -> Result<Option<SubFilter>> {
    Ok(match e {
        Expr::InSubquery { expr, subquery, negated: n } => {
            let negated = negated != *n;
            let x = b.expr(expr, &mut Aggs::No("WHERE"))?;
            match query_in(cx, subquery, Some(b.own))? {
                Sub::Plain(sub) => {
                    if sub.columns.len() != 1 {
                        return Err(err(pos_of(e), format!("the subquery of IN must return one column, not {}", sub.columns.len())));
                    }
                    let col = (BExpr::Col(0, sub.columns[0].name.clone()), sub.columns[0].ty);
                    let (x, y) = aligned(x, col, pos_of(e))?;
                    let plan = if matches!(y, BExpr::Col(..)) { sub.plan } else { Plan::Project { input: Box::new(sub.plan), exprs: vec![y] } };
                    Some(SubFilter::In { x, plan, negated })
                }
                Sub::Corr(c) => {
                    if negated {
                        return Err(unsupported(pos_of(e), "NOT IN with a correlated subquery (NOT EXISTS is)"));
                    }
                    let item = single_item(c.select, c.pos, "IN")?;
                    let cb = Binder { cx, scope: &c.fw.scope, own: &c.fw.scope };
                    let y = cb.expr(item, &mut Aggs::No("a correlated IN subquery"))?;
                    let keys = aligned(x, y, pos_of(e))?;
                    Some(decorrelate(c, b.own, JoinKind::Semi, Some(keys)))
                }
            }
        }
        Expr::Exists { subquery, negated: n } => {
            let negated = negated != *n;
            match query_in(cx, subquery, Some(b.own))? {
                Sub::Plain(sub) => Some(SubFilter::Exists { plan: sub.plan, negated }),
                Sub::Corr(c) => {
                    if c.aggregated {
                        return Err(unsupported(c.pos, "EXISTS over a correlated subquery with aggregates (it always has a row)"));
                    }
                    Some(decorrelate(c, b.own, if negated { JoinKind::NotExists } else { JoinKind::Semi }, None))
                }
            }
        }
        Expr::UnaryOp { op: UnaryOperator::Not, expr } => sub_filter(cx, b, expr, !negated)?,
        Expr::Nested(x) => sub_filter(cx, b, x, negated)?,
        _ => None,
    })
}

/// A correlated `[NOT] EXISTS` / `IN` as a semi or anti join of the enclosing query's rows
/// (scope `outer`) with the subquery's: its equalities between an expression of each are
/// the keys (with `extra`, IN's `x = y`), its other correlated conditions the residual
/// (over the enclosing row followed by the subquery's). The subquery's rows keep only the
/// columns the keys and the residual read.
fn decorrelate(c: Corr<'_>, outer: &Scope, kind: JoinKind, extra: Option<(BExpr, BExpr)>) -> SubFilter {
    let (ko, wo) = (outer.rels.len(), outer.width());
    let (mut lk, mut rk, mut resid) = (Vec::new(), Vec::new(), Vec::new());
    if let Some((x, y)) = extra {
        lk.push(x);
        rk.push(y);
    }
    for conj in &c.fw.corr {
        match conj.split(ko) {
            Some((o, i)) => {
                lk.push(o.clone());
                let mut i = i.clone();
                i.map_cols(&|k| k - wo);
                rk.push(i);
            }
            None => resid.push(conj.pred.clone()),
        }
    }
    let mut need = Vec::new();
    for k in &rk {
        k.cols(&mut need);
    }
    for r in &resid {
        let mut v = Vec::new();
        r.cols(&mut v);
        need.extend(v.into_iter().filter(|&i| i >= wo).map(|i| i - wo));
    }
    need.sort_unstable();
    need.dedup();
    let at_ = |i: usize| need.binary_search(&i).unwrap_or(0);
    for k in rk.iter_mut() {
        k.map_cols(&at_);
    }
    let residual = and_all(resid).map(|mut r| {
        r.map_cols(&|i| if i < wo { i } else { wo + at_(i - wo) });
        r
    });
    let exprs = need.iter().map(|&i| BExpr::Col(i, c.fw.scope.col_name(i))).collect();
    let plan = Plan::Project { input: Box::new(c.fw.plan), exprs };
    SubFilter::Join { plan, kind, left_keys: lk, right_keys: rk, residual, right_width: need.len() }
}

/// `x op (SELECT ...)` or `(SELECT ...) op x`: (x, op, the subquery, whether it is on the left).
fn scalar_comparison(e: &Expr) -> Option<(&Expr, CmpOp, &Query, bool)> {
    let mut e = e;
    while let Expr::Nested(x) = e {
        e = x;
    }
    let Expr::BinaryOp { left, op, right } = e else { return None };
    let op = match op {
        B::Eq => CmpOp::Eq,
        B::NotEq => CmpOp::Ne,
        B::Lt => CmpOp::Lt,
        B::LtEq => CmpOp::Le,
        B::Gt => CmpOp::Gt,
        B::GtEq => CmpOp::Ge,
        _ => return None,
    };
    match (left.as_ref(), right.as_ref()) {
        (x, Expr::Subquery(q)) => Some((x, op, q, false)),
        (Expr::Subquery(q), x) => Some((x, op, q, true)),
        _ => None,
    }
}

/// A correlated scalar subquery as a relation: its rows grouped by the subquery's sides of
/// its correlated equalities, each group one row of those keys and the subquery's value.
struct Derived {
    /// The subquery's rows (before grouping), its sides of the equalities, its aggregates,
    /// and its value over the row of keys and aggregates.
    input: Plan,
    inner_keys: Vec<BExpr>,
    aggs: Vec<AggSpec>,
    value: BExpr,
    /// The enclosing query's sides of the equalities (over its row).
    outer_keys: Vec<BExpr>,
    key_types: Vec<Option<ColumnType>>,
    value_ty: Option<ColumnType>,
}

impl Derived {
    /// The plan: one row per group of keys, the keys then the value. With `restrict` (a
    /// plan of key rows), only the groups whose keys it has (a semi join before grouping).
    fn plan(self, restrict: Option<Plan>) -> Plan {
        let nk = self.inner_keys.len();
        let input = match restrict {
            Some(r) => Plan::HashJoin {
                left: Box::new(self.input),
                right: Box::new(r),
                kind: JoinKind::Semi,
                left_keys: self.inner_keys.clone(),
                right_keys: (0..nk).map(|i| BExpr::Col(i, format!("#key{}", i + 1))).collect(),
                residual: None,
                right_width: nk,
                keep: Vec::new(),
            },
            None => self.input,
        };
        let mut exprs: Vec<BExpr> = (0..nk).map(|i| BExpr::Col(i, format!("#key{}", i + 1))).collect();
        exprs.push(self.value);
        Plan::Project { input: Box::new(Plan::HashAggregate { input: Box::new(input), keys: self.inner_keys, aggs: self.aggs }), exprs }
    }
}

/// The subquery of `x op (SELECT ...)` in the WHERE of the query whose scope is `outer`:
/// `None` if it is uncorrelated (then it is bound as a parameter, computed once), else
/// grouped by its correlation keys. Its value over no rows must be NULL (`sum`, `avg`,
/// `min`, `max`, not `count`), so that an inner join (which drops the rows of no group)
/// gives what the comparison with NULL would.
fn correlated_scalar(cx: &Cx<'_>, q: &Query, outer: &Scope) -> Result<Option<Derived>> {
    let c = match query_in(cx, q, Some(outer))? {
        Sub::Plain(b) => {
            register_param(cx, q, b, false, at(q.span()))?;
            return Ok(None);
        }
        Sub::Corr(c) => c,
    };
    let (ko, wo) = (outer.rels.len(), outer.width());
    let (mut okeys, mut ikeys, mut key_types) = (Vec::new(), Vec::new(), Vec::new());
    for conj in &c.fw.corr {
        let (o, i) = conj.split(ko).ok_or_else(|| {
            err(conj.pos, "a correlated scalar subquery can only be correlated by equalities between its own columns and the enclosing query's; this condition is not one")
        })?;
        okeys.push(o.clone());
        let mut i = i.clone();
        i.map_cols(&|k| k - wo);
        ikeys.push(i);
        key_types.push(conj.equi_ty);
    }
    let item = single_item(c.select, c.pos, "a scalar comparison")?;
    if !c.aggregated {
        return Err(unsupported(
            c.pos,
            "a correlated scalar subquery without an aggregate (one that gives one value per row of the enclosing query, like max(x), is)",
        ));
    }
    let scope = &c.fw.scope;
    let b = Binder { cx, scope, own: scope };
    // The keys match no text of the SELECT item: only columns that are keys may appear bare.
    let keys: Vec<GroupKey> = ikeys
        .iter()
        .zip(&key_types)
        .map(|(k, t)| GroupKey { text: "\0correlation key".into(), col: if let BExpr::Col(i, _) = k { Some(*i) } else { None }, ty: *t })
        .collect();
    let (mut aggs, mut bare) = (Vec::new(), None);
    let (value, value_ty) = b.expr(item, &mut Aggs::Collect { list: &mut aggs, bare_column: &mut bare, keys: &keys })?;
    let mut empty: Vec<Value> = vec![Value::Null; ikeys.len()];
    empty.extend(aggs.iter().map(|a| St::empty(AggKind::of(a.func, a.arg_ty, a.pos, &a.label).kind).finish()));
    if !matches!(value.eval(&empty), Ok(Value::Null)) {
        return Err(unsupported(c.pos, "a correlated scalar subquery whose value over no rows is not NULL (as with count)"));
    }
    Ok(Some(Derived { input: c.fw.plan, inner_keys: ikeys, aggs, value, outer_keys: okeys, key_types, value_ty }))
}

/// An uncorrelated subquery as a parameter of the statement: computed once, before the rows.
fn register_param(cx: &Cx<'_>, q: &Query, b: Bound, exists: bool, pos: Pos) -> Result<Typed> {
    if !exists && b.columns.len() != 1 {
        return Err(err(pos, format!("a scalar subquery must return one column, not {}", b.columns.len())));
    }
    let mut scalars = cx.scalars.borrow_mut();
    let param = Arc::new(Param::new(scalars.len() + 1));
    let ty = if exists { Some(ColumnType::Bool) } else { b.columns[0].ty };
    scalars.push(ScalarSub { param: param.clone(), plan: b.plan, exists, pos });
    let t = (BExpr::Param(param), ty);
    if let Some(k) = memo_key(q, exists) {
        cx.memo.borrow_mut().insert(k, t.clone());
    }
    Ok(t)
}

impl Binder<'_> {
    /// A name that is no column here but one of an enclosing query's (which is read only
    /// in the WHERE of the subquery directly inside it): `e` says so.
    fn enclosing_hint(&self, e: crate::error::Error, id: &ast::Ident, q: Option<&ast::Ident>) -> crate::error::Error {
        let absent = matches!(&e, crate::error::Error::Sql { msg, .. } if msg.starts_with("no column named") || msg.starts_with("no table named"));
        let enclosing = self.cx.enclosing.borrow().iter().any(|s| match q {
            Some(q) => s.qualified(q, id).is_ok(),
            None => s.column(id).is_ok(),
        });
        if !(absent && enclosing) {
            return e;
        }
        let name = q.map_or_else(|| id.value.clone(), |q| format!("{}.{}", q.value, id.value));
        err(
            at(q.map_or(id.span, |q| q.span)),
            format!("{name:?} is a column of an enclosing query; a subquery reads those only in its WHERE, and only of the query directly around it"),
        )
    }

    /// A subquery as a value: `(SELECT ...)` (`exists`: `EXISTS (SELECT ...)`), uncorrelated.
    fn subquery_value(&self, q: &Query, pos: Pos, exists: bool) -> Result<Typed> {
        if let Some(t) = memo_key(q, exists).and_then(|k| self.cx.memo.borrow().get(&k).cloned()) {
            return Ok(t);
        }
        match query_in(self.cx, q, Some(self.own))? {
            Sub::Plain(b) => register_param(self.cx, q, b, exists, pos),
            Sub::Corr(_) => Err(err(
                pos,
                "a correlated subquery is not supported here (only as a condition of WHERE joined by AND: [NOT] EXISTS (...), x IN (...), x op (SELECT aggregate ...))",
            )),
        }
    }
}

fn split_or<'e>(e: &'e Expr, out: &mut Vec<&'e Expr>) {
    match e {
        Expr::BinaryOp { left, op: B::Or, right } => {
            split_or(left, out);
            split_or(right, out);
        }
        Expr::Nested(x) if matches!(x.as_ref(), Expr::BinaryOp { op: B::Or, .. } | Expr::Nested(_)) => split_or(x, out),
        _ => out.push(e),
    }
}

fn and_exprs(mut es: Vec<Expr>) -> Option<Expr> {
    let first = if es.is_empty() { return None } else { es.remove(0) };
    Some(es.into_iter().fold(first, |a, x| Expr::BinaryOp { left: Box::new(a), op: B::And, right: Box::new(x) }))
}

/// Conjuncts that an `OR` of WHERE implies, so that joins and scans can use them (the `OR`
/// itself is still applied): each conjunct common to every branch (as in TPC-H Q19, where
/// `p_partkey = l_partkey` in each branch becomes the hash-join key instead of a cross
/// join), and, for a relation that every branch restricts by conjuncts of its own, the
/// `OR` over the branches of those conjuncts (pushed into that relation's scan). Only for
/// an `OR` over several relations; branches are compared as text.
fn or_implied(b: &Binder<'_>, e: &Expr) -> Result<Vec<Expr>> {
    let mut inner = e;
    while let Expr::Nested(x) = inner {
        inner = x;
    }
    if !matches!(inner, Expr::BinaryOp { op: B::Or, .. }) {
        return Ok(Vec::new());
    }
    if bind_conj(b, e, "WHERE")?.rels.len() < 2 {
        return Ok(Vec::new());
    }
    let mut branches = Vec::new();
    split_or(inner, &mut branches);
    let conjuncts: Vec<Vec<&Expr>> = branches
        .iter()
        .map(|br| {
            let mut v = Vec::new();
            split_and(br, &mut v);
            v
        })
        .collect();
    let texts: Vec<Vec<String>> = conjuncts.iter().map(|cs| cs.iter().map(|c| c.to_string()).collect()).collect();
    let common: Vec<String> = texts[0].iter().filter(|t| texts[1..].iter().all(|o| o.contains(t))).cloned().collect();
    let mut out: Vec<Expr> = Vec::new();
    for (c, t) in conjuncts[0].iter().zip(&texts[0]) {
        if common.contains(t) && !out.iter().any(|o| o.to_string() == *t) {
            out.push((*c).clone());
        }
    }
    // Per relation: the branches' own conjuncts on it (those not common to all).
    let mut own: Vec<Vec<(Vec<usize>, &Expr)>> = Vec::new();
    for (cs, ts) in conjuncts.iter().zip(&texts) {
        let mut v = Vec::new();
        for (c, t) in cs.iter().zip(ts) {
            if !common.contains(t) {
                v.push((bind_conj(b, c, "WHERE")?.rels, *c));
            }
        }
        own.push(v);
    }
    let mut rels: Vec<usize> = own[0].iter().filter(|(r, _)| r.len() == 1).map(|(r, _)| r[0]).collect();
    rels.dedup();
    for r in rels {
        let per: Vec<Option<Expr>> =
            own.iter().map(|v| and_exprs(v.iter().filter(|(q, _)| q.as_slice() == [r]).map(|(_, c)| Expr::Nested(Box::new((*c).clone()))).collect())).collect();
        if per.iter().all(|p| p.is_some()) {
            let ors = per.into_iter().flatten().map(|p| Expr::Nested(Box::new(p)));
            if let Some(any) = ors.reduce(|a, x| Expr::BinaryOp { left: Box::new(a), op: B::Or, right: Box::new(x) }) {
                out.push(Expr::Nested(Box::new(any)));
            }
        }
    }
    Ok(out)
}

/// A query's FROM and WHERE: the rows (FROM's columns in FROM's order, then those of the
/// hidden relations of decorrelated scalar subqueries), the scope, and, for a subquery, the
/// conjuncts of WHERE that read the enclosing query's columns (bound over the enclosing row
/// followed by this one; for the enclosing query to join by).
struct FromWhere {
    plan: Plan,
    scope: Scope,
    corr: Vec<Conj>,
}

/// The plan of FROM and WHERE: relations joined by hash joins on the equalities of WHERE
/// and ON (inner joins in an order that follows the equalities; LEFT joins as written),
/// each conjunct applied as soon as its relations are joined (one relation's: in its scan),
/// then the subquery filters. A comparison with a correlated aggregate subquery joins that
/// subquery, grouped by its correlation keys, as one more relation.
/// `used`: the words of the query (see [`join_tree`]).
fn from_where(
    cx: &Cx<'_>,
    from: &[ast::TableWithJoins],
    selection: Option<&Expr>,
    outer: Option<&Scope>,
    used: &std::collections::HashSet<String>,
) -> Result<FromWhere> {
    let (mut scope, plans, mut steps) = from_clause(cx, from)?;
    let mut plans: Vec<Plan> = plans;
    let mut parts = Vec::new();
    if let Some(w) = selection {
        split_and(w, &mut parts);
    }
    let mut derived: Vec<Option<(usize, Derived)>> = Vec::with_capacity(parts.len());
    for e in &parts {
        let mut d = None;
        if let (Some((_, _, q, _)), false) = (scalar_comparison(e), steps.is_empty()) {
            if let Some(dv) = correlated_scalar(cx, q, &scope)? {
                let r = scope.rels.len();
                let offset = scope.width();
                let mut cols: Vec<(String, Option<ColumnType>)> = dv.key_types.iter().enumerate().map(|(i, t)| (format!("#key{}", i + 1), *t)).collect();
                cols.push(("#value".into(), dv.value_ty));
                scope.rels.push(Rel { name: "#subquery".into(), alias: None, cols, offset, hidden: true });
                plans.push(Plan::OneRow { filter: None }); // the grouped subquery, below
                d = Some((r, dv));
            }
        }
        derived.push(d);
    }
    // Joined after FROM's relations (a step of their own, for the join order to place).
    let hidden_from = steps.len();
    for r in (0..scope.rels.len()).filter(|r| scope.rels[*r].hidden) {
        steps.push(Step { rel: r, kind: JoinKind::Inner, on: None });
    }
    let full = match outer {
        Some(o) => Scope::nest(o, &scope),
        None => scope.clone(),
    };
    let (ko, wo) = outer.map_or((0, 0), |o| (o.rels.len(), o.width()));
    let (mut conjs, mut subs, mut corr, mut keyed) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut plan = {
        let bf = Binder { cx, scope: &full, own: &scope };
        let bl = Binder { cx, scope: &scope, own: &scope };
        let mut classify = |c: Conj| {
            if c.rels.iter().any(|r| *r < ko) {
                corr.push(c);
            } else {
                conjs.push(c.shifted(ko, wo));
            }
        };
        for (e, d) in parts.iter().zip(&derived) {
            if let Some((r, dv)) = d {
                let rel = &scope.rels[*r];
                for (i, ok) in dv.outer_keys.iter().enumerate() {
                    let key = (BExpr::Col(rel.offset + i, format!("#key{}", i + 1)), dv.key_types[i]);
                    keyed.push(compare_conj(&scope, CmpOp::Eq, (ok.clone(), dv.key_types[i]), key, (pos_of(e), pos_of(e), pos_of(e)))?);
                }
                let Some((x, op, _, sub_left)) = scalar_comparison(e) else { return Err(err(pos_of(e), "subquery comparison")) };
                let x = bf.expr(x, &mut Aggs::No("WHERE"))?;
                let v = (BExpr::Col(wo + rel.offset + dv.key_types.len(), "(subquery)".into()), dv.value_ty);
                let (a, b) = if sub_left { (v, x) } else { (x, v) };
                classify(compare_conj(&full, op, a, b, (pos_of(e), pos_of(e), pos_of(e)))?);
            } else if let Some(sf) = sub_filter(cx, &bl, e, false)? {
                subs.push(sf);
            } else {
                for implied in or_implied(&bf, e)? {
                    classify(bind_conj(&bf, &implied, "WHERE")?);
                }
                classify(bind_conj(&bf, e, "WHERE")?);
            }
        }
        // Each grouped subquery keeps only the groups whose keys the enclosing query can
        // have: when its keys come from one relation of FROM that WHERE restricts (TPC-H
        // Q17's part of one brand and container), the subquery's rows are first semi-joined
        // with that relation's keys under those restrictions (it is scanned twice).
        for (r, dv) in derived.into_iter().flatten() {
            let mut from: Vec<usize> = dv.outer_keys.iter().flat_map(|k| rels_of(&scope, k)).collect();
            from.sort_unstable();
            from.dedup();
            let restrict = match from.as_slice() {
                [k] if matches!(plans[*k], Plan::Scan { .. }) && !steps.iter().any(|s| s.rel == *k && s.kind == JoinKind::Left) => {
                    let off = scope.rels[*k].offset;
                    let local = |e: &BExpr| {
                        let mut e = e.clone();
                        e.map_cols(&|i| i - off);
                        e
                    };
                    let filters: Vec<BExpr> = conjs.iter().filter(|c| c.rels.as_slice() == [*k]).map(|c| local(&c.pred)).collect();
                    and_all(filters).map(|f| {
                        let mut p = plans[*k].clone();
                        add_filter(&mut p, f);
                        Plan::Project { input: Box::new(p), exprs: dv.outer_keys.iter().map(local).collect() }
                    })
                }
                _ => None,
            };
            plans[r] = dv.plan(restrict);
        }
        conjs.append(&mut keyed);
        if steps.is_empty() {
            let filter = and_all(conjs.drain(..).map(|c| c.pred).collect());
            Plan::OneRow { filter }
        } else {
            for st in steps[..hidden_from].iter().filter(|s| s.kind == JoinKind::Inner) {
                if let Some(on) = st.on {
                    let mut ps = Vec::new();
                    split_and(on, &mut ps);
                    for e in ps {
                        conjs.push(bind_conj(&bl, e, "ON")?);
                    }
                }
            }
            // `x IN (SELECT ...)` / `x NOT IN (SELECT ...)` with `x` over one relation (not
            // one a LEFT join pads) filters that relation before it is joined (TPC-H Q18:
            // orders, before its joins with customer and lineitem), not the joined rows.
            let padded = |r: usize| steps.iter().any(|s| s.rel == r && s.kind == JoinKind::Left);
            let mut pushed = Vec::new();
            for sf in std::mem::take(&mut subs) {
                match sf {
                    SubFilter::In { x, plan: sub, negated } => match rels_of(&scope, &x).as_slice() {
                        [r] if !scope.rels[*r].hidden && !padded(*r) && matches!(plans[*r], Plan::Scan { .. }) => {
                            let off = scope.rels[*r].offset;
                            let mut x = x;
                            x.map_cols(&|i| i - off);
                            pushed.push((*r, x, sub, negated));
                        }
                        _ => subs.push(SubFilter::In { x, plan: sub, negated }),
                    },
                    sf => subs.push(sf),
                }
            }
            join_tree(&bl, plans, &steps, conjs, used, pushed)?
        }
    };
    for sf in subs {
        plan = match sf {
            SubFilter::In { x, plan: sub, negated } => in_join(plan, x, sub, negated),
            SubFilter::Exists { plan: sub, negated } => Plan::Exists { input: Box::new(plan), sub: Box::new(sub), negated },
            SubFilter::Join { plan: sub, kind, left_keys, right_keys, residual, right_width } => {
                Plan::HashJoin { left: Box::new(plan), right: Box::new(sub), kind, left_keys, right_keys, residual, right_width, keep: Vec::new() }
            }
        };
    }
    Ok(FromWhere { plan, scope, corr })
}

/// An equality joining a relation: the distinct values on its side and on the other's
/// (`None`: key-like), and the other side's relation.
type Edge = (Option<f64>, Option<f64>, usize, Option<usize>);

/// The columns an equality of two plain columns equates.
fn col_pair(c: &Conj) -> Option<(usize, usize)> {
    match c.equi.as_ref()? {
        (BExpr::Col(a, _), _, BExpr::Col(b, _), _) => Some((*a, *b)),
        _ => None,
    }
}

/// Whether `a` and `b` are the same column.
fn same_col(a: &BExpr, b: &BExpr) -> bool {
    matches!((a, b), (BExpr::Col(i, _), BExpr::Col(j, _)) if i == j)
}

/// Whether columns `a` and `b` are equal in every row that reaches this point: an equality
/// of the two has been applied (as a join key or a filter) below.
fn equated(pool: &[Conj], a: &BExpr, b: &BExpr) -> bool {
    let (BExpr::Col(a, _), BExpr::Col(b, _)) = (a, b) else { return false };
    pool.iter().any(|c| c.applied && col_pair(c).is_some_and(|p| p == (*a, *b) || p == (*b, *a)))
}

/// The equalities of columns of different relations that the others imply (`a = b` and
/// `b = c`: `a = c`), added to `pool`, so that the join order can join `a`'s relation to
/// `c`'s directly (TPC-H Q5: customer to nation, before supplier). Returns, per conjunct
/// of `pool`, the class of columns its equality is in (equalities of one class bound the
/// rows of a join once, not once each).
fn implied_equalities(scope: &Scope, pool: &mut Vec<Conj>) -> Vec<Option<usize>> {
    let mut classes: Vec<Vec<usize>> = Vec::new();
    for c in pool.iter().filter(|c| !c.applied && c.rels.len() == 2) {
        let Some((a, b)) = col_pair(c) else { continue };
        let ia = classes.iter().position(|k| k.contains(&a));
        let ib = classes.iter().position(|k| k.contains(&b));
        match (ia, ib) {
            (Some(i), Some(j)) if i != j => {
                let moved = classes.remove(j.max(i));
                classes[j.min(i)].extend(moved);
            }
            (Some(_), Some(_)) => {}
            (Some(i), None) => classes[i].push(b),
            (None, Some(j)) => classes[j].push(a),
            (None, None) => classes.push(vec![a, b]),
        }
    }
    let direct = |pool: &[Conj], a: usize, b: usize| pool.iter().any(|c| col_pair(c).is_some_and(|(x, y)| (x, y) == (a, b) || (x, y) == (b, a)));
    for k in classes.iter().filter(|k| k.len() <= 6) {
        let Some(model) = pool.iter().find(|c| col_pair(c).is_some_and(|(x, _)| k.contains(&x))) else { continue };
        let (ty, pos) = (model.equi_ty, model.pos);
        let mut add = Vec::new();
        for (n, &a) in k.iter().enumerate() {
            for &b in &k[n + 1..] {
                let (ra, rb) = (scope.rel_of(a), scope.rel_of(b));
                if ra == rb || direct(pool, a, b) {
                    continue;
                }
                let named =
                    |c: usize, r: usize| BExpr::Col(c, format!("{}.{}", scope.rels[r].alias.as_ref().unwrap_or(&scope.rels[r].name), scope.col_name(c)));
                let (x, y) = (named(a, ra), named(b, rb));
                add.push(Conj {
                    pred: BExpr::Cmp(CmpOp::Eq, Box::new(x.clone()), Box::new(y.clone())),
                    rels: vec![ra.min(rb), ra.max(rb)],
                    equi: Some((x, vec![ra], y, vec![rb])),
                    equi_ty: ty,
                    applied: false,
                    pos,
                });
            }
        }
        pool.extend(add);
    }
    pool.iter().map(|c| col_pair(c).filter(|_| !c.applied).and_then(|(a, _)| classes.iter().position(|k| k.contains(&a)))).collect()
}

/// The equalities that join relation `r` to those in `order`, each as the numbers of
/// distinct values on `r`'s side and on the other side when they repeat in a sample of
/// the table (see [`sampled_domain`]; `None`: key-like values), with the other side's
/// relation. Empty when the planner has no buffer manager.
fn edges(b: &Binder<'_>, plans: &[Option<Plan>], pool: &[Conj], class_of: &[Option<usize>], order: &[usize], r: usize) -> Result<Vec<Edge>> {
    let Some(bm) = b.cx.bm else { return Ok(Vec::new()) };
    let scope = b.scope;
    let domain = |e: &BExpr, q: usize| -> Result<Option<f64>> {
        let Some(table) = plans.get(q).and_then(|p| p.as_ref()).and_then(scanned) else { return Ok(None) };
        let off = scope.rels[q].offset;
        let mut e = e.clone();
        e.map_cols(&|i| i - off);
        sampled_domain(bm, table, &e)
    };
    let mut out = Vec::new();
    for (c, class) in pool.iter().zip(class_of).filter(|(c, _)| !c.applied) {
        let Some((x, lx, y, ly)) = c.equi.as_ref() else { continue };
        let (mine, other, oq) = if ly.as_slice() == [r] && lx.len() == 1 && order.contains(&lx[0]) {
            (y, x, lx[0])
        } else if lx.as_slice() == [r] && ly.len() == 1 && order.contains(&ly[0]) {
            (x, y, ly[0])
        } else {
            continue;
        };
        out.push((domain(mine, r)?, domain(other, oq)?, oq, *class));
    }
    Ok(out)
}

/// The bytes a relation's rows take in a join: the widths (see [`sampled_widths`]) of its
/// columns whose names are among the words of the query (`used`: the columns it may read;
/// an over-estimate, as a column read only by its scan's filter counts too).
fn rel_width(bm: &crate::buffer::BufferManager, rel: &Rel, plan: Option<&Plan>, used: &std::collections::HashSet<String>) -> Result<f64> {
    let widths = match plan {
        Some(Plan::Scan { table, .. }) => sampled_widths(bm, table)?,
        Some(p) => col_widths(bm, p)?,
        None => Vec::new(),
    };
    Ok(rel.cols.iter().enumerate().filter(|(_, (name, _))| used.contains(&name.to_lowercase())).map(|(i, _)| widths.get(i).copied().unwrap_or(9.0)).sum())
}

/// A semi or anti join of one relation with a subquery's rows: the relation, the key over
/// its columns, the subquery's plan, `NOT IN`?
type Pushed = (usize, BExpr, Plan, bool);

/// The semi (anti: `negated`) join of `plan`'s rows whose `x` is (not) in the first
/// column of `sub`'s rows.
fn in_join(plan: Plan, x: BExpr, sub: Plan, negated: bool) -> Plan {
    Plan::HashJoin {
        left: Box::new(plan),
        right: Box::new(sub),
        kind: if negated { JoinKind::Anti } else { JoinKind::Semi },
        left_keys: vec![x],
        right_keys: vec![BExpr::Col(0, "subquery".into())],
        residual: None,
        right_width: 1,
        keep: Vec::new(),
    }
}

/// The table a relation's plan scans, below the semi and anti joins that filter it.
fn scanned(p: &Plan) -> Option<&crate::access::table::Table> {
    match p {
        Plan::Scan { table, .. } => Some(table),
        Plan::HashJoin { left, kind: JoinKind::Semi | JoinKind::Anti, .. } => scanned(left),
        _ => None,
    }
}

/// `pushed`: semi and anti joins with subqueries that filter one relation (after its
/// scan's filter, before it is joined).
fn join_tree(
    b: &Binder<'_>,
    plans: Vec<Plan>,
    steps: &[Step<'_>],
    mut pool: Vec<Conj>,
    used: &std::collections::HashSet<String>,
    pushed: Vec<Pushed>,
) -> Result<Plan> {
    let scope = b.scope;
    let n = scope.rels.len();
    let null_supplied: Vec<bool> = (0..n).map(|r| steps.iter().any(|s| s.rel == r && s.kind == JoinKind::Left)).collect();
    let has_left = null_supplied.iter().any(|x| *x);
    let mut rel_plans: Vec<Option<Plan>> = plans.into_iter().map(Some).collect();
    let local = |e: &BExpr, r: usize| {
        let off = scope.rels[r].offset;
        let mut e = e.clone();
        e.map_cols(&|i| i - off);
        e
    };
    // One relation's conjuncts go into its scan (not below a LEFT join that pads it).
    for c in pool.iter_mut() {
        let r = c.rels.first().copied().unwrap_or(steps[0].rel);
        if c.rels.len() <= 1 && !null_supplied[r] {
            if let Some(p) = rel_plans[r].as_mut() {
                add_filter(p, local(&c.pred, r));
            }
            c.applied = true;
        }
    }
    for (r, x, sub, negated) in pushed {
        if let Some(p) = rel_plans[r].take() {
            rel_plans[r] = Some(in_join(p, x, sub, negated));
        }
    }
    // The order: as written with LEFT joins. Else, with the buffer manager at hand, by
    // estimates of the relations' rows after their filters (see `Plan::estimate`): first
    // the relation with the fewest, then each time the relation that an equality connects
    // to those joined so far whose join gives the fewest estimated rows (a cross product
    // only when no relation is connected). Without it: each next relation one that an
    // equality connects to those joined so far (the first written, if none is).
    let class_of = if has_left { vec![None; pool.len()] } else { implied_equalities(scope, &mut pool) };
    let mut order: Vec<usize> = Vec::with_capacity(n);
    let connects = |r: usize, c: &Conj, order: &[usize]| {
        c.equi.as_ref().is_some_and(|(_, lx, _, ly)| {
            (lx.iter().all(|x| order.contains(x)) && ly.as_slice() == [r]) || (ly.iter().all(|y| order.contains(y)) && lx.as_slice() == [r])
        })
    };
    // With the estimates, each relation's row width in bytes (see `rel_width`).
    let (est, wid): (Option<Vec<(f64, f64)>>, Vec<f64>) = match (has_left, b.cx.bm) {
        (false, Some(bm)) => {
            let (mut v, mut w) = (Vec::with_capacity(n), Vec::with_capacity(n));
            for (r, p) in rel_plans.iter().enumerate() {
                v.push(p.as_ref().map_or(Ok((1.0, 1.0)), |p| p.estimate(bm))?);
                w.push(rel_width(bm, &scope.rels[r], p.as_ref(), used)?);
            }
            (Some(v), w)
        }
        _ => (None, Vec::new()),
    };
    if has_left {
        order.extend(steps.iter().map(|s| s.rel));
    } else if let Some(est) = &est {
        let smallest = |rs: &mut dyn Iterator<Item = usize>| rs.min_by(|a, b| est[*a].0.total_cmp(&est[*b].0).then(a.cmp(b)));
        // The greedy order from one first relation, and its cost: the sum of the estimated
        // bytes of its joins (rows times the width of the columns read of the relations
        // joined, plus a record's overhead; a many-to-many join's counted twice), so that
        // wide rows are joined late, when fewer.
        let greedy = |first: usize| -> Result<(Vec<usize>, f64)> {
            let mut order = vec![first];
            let (mut cur, mut cost, mut cur_w) = (est[first], 0.0, wid[first]);
            while order.len() < n {
                let rest: Vec<usize> = (0..n).filter(|r| !order.contains(r)).collect();
                let connected: Vec<usize> = rest.iter().copied().filter(|&r| pool.iter().any(|c| !c.applied && connects(r, c, &order))).collect();
                let mut joined = Vec::with_capacity(connected.len());
                for &r in &connected {
                    // Rows: cur * r / divisor, the product of the divisors of the
                    // relations joined to (the largest of a relation's equalities): a
                    // key (values that do not repeat in a sample) joined with a foreign key
                    // divides by the key's table's rows (each row of the other side finds
                    // at most one; neither side repeating: the smaller table's rows, a
                    // foreign key's repeats can hide in a sample); values that repeat on both sides divide by the number
                    // of distinct values each side's filters keep (weighed at twice the
                    // estimate when no key bounds it: a less certain guess than a key's).
                    let share = |(rows, base): (f64, f64)| (rows / base.max(1.0)).min(1.0);
                    let mut per: Vec<(usize, f64, f64)> = Vec::new();
                    let mut classes: Vec<(usize, usize)> = Vec::new();
                    for (dr, dq, q, class) in edges(b, &rel_plans, &pool, &class_of, &order, r)? {
                        let (d, w) = match (dr, dq) {
                            (Some(dr), Some(dq)) => ((dr * share(est[r])).max(dq * share(cur)).max(1.0), 2.0),
                            (None, Some(_)) => (est[r].1, 1.0),
                            (Some(_), None) => (est[q].1, 1.0),
                            (None, None) => (est[r].1.min(est[q].1), 1.0),
                        };
                        // Several equalities with one relation (a composite key), or of
                        // one class of equal columns: the largest divisor; with different
                        // relations: they multiply.
                        let q = match class.and_then(|k| classes.iter().find(|(c, _)| *c == k)) {
                            Some(&(_, first)) => first,
                            None => {
                                if let Some(k) = class {
                                    classes.push((k, q));
                                }
                                q
                            }
                        };
                        match per.iter_mut().find(|(p, ..)| *p == q) {
                            Some(e) if d > e.1 => *e = (q, d, w),
                            Some(_) => {}
                            None => per.push((q, d, w)),
                        }
                    }
                    let div = per.iter().fold(None, |acc: Option<(f64, f64)>, &(_, d, w)| Some(acc.map_or((d, w), |(x, v)| (x * d, v.min(w)))));
                    joined.push(match div {
                        Some((d, w)) => ((cur.0 * est[r].0 / d.max(1.0)).max(1.0), cur.1.max(est[r].1), w),
                        None => {
                            let (rows, base) = join_estimate(cur, est[r], true);
                            (rows, base, 1.0)
                        }
                    });
                }
                let weighed = |i: usize| joined[i].0 * (cur_w + wid[connected[i]] + RECORD) * joined[i].2;
                let next = (0..connected.len()).min_by(|&a, &b| {
                    weighed(a).total_cmp(&weighed(b)).then(est[connected[a]].0.total_cmp(&est[connected[b]].0)).then(connected[a].cmp(&connected[b]))
                });
                let (next, after, w) = match next {
                    Some(i) => (connected[i], (joined[i].0, joined[i].1), joined[i].2),
                    None => {
                        let r = smallest(&mut rest.iter().copied()).unwrap_or(rest[0]);
                        (r, join_estimate(cur, est[r], false), 1.0)
                    }
                };
                cur = after;
                cur_w += wid[next];
                cost += cur.0 * (cur_w + RECORD) * w;
                order.push(next);
            }
            Ok((order, cost))
        };
        // Every relation as the first (few relations: cheap), the smallest first at equal
        // costs.
        let mut firsts: Vec<usize> = (0..n).collect();
        firsts.sort_by(|a, b| est[*a].0.total_cmp(&est[*b].0).then(a.cmp(b)));
        let mut best: Option<(Vec<usize>, f64)> = None;
        for f in firsts {
            let (o, c) = greedy(f)?;
            if best.as_ref().is_none_or(|(_, bc)| c < *bc) {
                best = Some((o, c));
            }
        }
        order = best.map(|(o, _)| o).unwrap_or_default();
    } else {
        order.push(steps[0].rel);
        while order.len() < n {
            let rest: Vec<usize> = (0..n).filter(|r| !order.contains(r)).collect();
            let next = rest.iter().copied().find(|&r| pool.iter().any(|c| !c.applied && connects(r, c, &order))).unwrap_or(rest[0]);
            order.push(next);
        }
    }
    let take = |rel_plans: &mut Vec<Option<Plan>>, r: usize| rel_plans[r].take().ok_or_else(|| err(None, "a relation is joined twice"));
    let mut layout = vec![order[0]];
    let mut plan = take(&mut rel_plans, order[0])?;
    let apply_ready = |plan: &mut Plan, layout: &[usize], pool: &mut Vec<Conj>| {
        let map = layout_map(scope, layout);
        for c in pool.iter_mut().filter(|c| !c.applied && c.rels.iter().all(|r| layout.contains(r))) {
            add_filter(plan, remapped(&c.pred, &map));
            c.applied = true;
        }
    };
    apply_ready(&mut plan, &layout, &mut pool);
    for &r in &order[1..] {
        let step = steps.iter().find(|s| s.rel == r).ok_or_else(|| err(None, "join step"))?;
        let mut right = take(&mut rel_plans, r)?;
        let left_map = layout_map(scope, &layout);
        let (mut lk, mut rk, mut residual) = (Vec::new(), Vec::new(), Vec::new());
        let key_sides = |c: &Conj, layout: &[usize]| -> Option<(BExpr, BExpr)> {
            let (x, lx, y, ly) = c.equi.as_ref()?;
            let inl = |v: &Vec<usize>| v.iter().all(|q| layout.contains(q));
            if inl(lx) && ly.as_slice() == [r] {
                Some((x.clone(), y.clone()))
            } else if inl(ly) && lx.as_slice() == [r] {
                Some((y.clone(), x.clone()))
            } else {
                None
            }
        };
        if step.kind == JoinKind::Left {
            let mut ps = Vec::new();
            if let Some(on) = step.on {
                split_and(on, &mut ps);
            }
            for e in ps {
                let c = bind_conj(b, e, "ON")?;
                if let Some(&q) = c.rels.iter().find(|q| **q != r && !layout.contains(q)) {
                    return Err(err(pos_of(e), format!("ON of a LEFT JOIN refers to {}, which is joined later", scope.rels[q].shown())));
                }
                if let Some((x, y)) = key_sides(&c, &layout) {
                    lk.push(remapped(&x, &left_map));
                    rk.push(local(&y, r));
                } else if c.rels.as_slice() == [r] {
                    add_filter(&mut right, local(&c.pred, r));
                } else {
                    residual.push(c.pred);
                }
            }
        } else {
            let sides: Vec<(usize, BExpr, BExpr)> =
                pool.iter().enumerate().filter(|(_, c)| !c.applied).filter_map(|(i, c)| key_sides(c, &layout).map(|(x, y)| (i, x, y))).collect();
            for (n, (i, x, y)) in sides.iter().enumerate() {
                // `x = y` is implied by an earlier key `x' = y` when the rows on the left
                // already have x = x' (TPC-H Q9: ps_suppkey = l_suppkey after
                // s_suppkey = l_suppkey, with ps_suppkey = s_suppkey applied below): a key
                // fewer to hash and compare per row.
                if !sides[..n].iter().any(|(_, x1, y1)| same_col(y1, y) && equated(&pool, x1, x)) {
                    lk.push(remapped(x, &left_map));
                    rk.push(local(y, r));
                }
                pool[*i].applied = true;
            }
        }
        layout.push(r);
        let map = layout_map(scope, &layout);
        let residual = and_all(residual.iter().map(|e| remapped(e, &map)).collect());
        plan = Plan::HashJoin {
            left: Box::new(plan),
            right: Box::new(right),
            kind: step.kind,
            left_keys: lk,
            right_keys: rk,
            residual,
            right_width: scope.rels[r].cols.len(),
            keep: Vec::new(),
        };
        apply_ready(&mut plan, &layout, &mut pool);
    }
    if layout.windows(2).any(|w| w[0] > w[1]) {
        let map = layout_map(scope, &layout);
        plan = Plan::Project { input: Box::new(plan), exprs: (0..scope.width()).map(|g| BExpr::Col(map[g], scope.col_name(g))).collect() };
    }
    Ok(plan)
}
