//! Pre-aggregation in front of the hash aggregation of [`super::agg`]: a small table on
//! the Rust heap, of at most [`GROUPS`] groups and [`KEY_BYTES`] bytes of keys, merges the
//! rows of the groups it holds as decoded partial states ([`St`]), without the encoding,
//! temporary-page probe and decoding that each row costs [`HashAgg::push`]. When it is full
//! it hands its groups to the hash aggregation (in the order they arrived, so groups reach
//! it in the order of their first rows, as without it) and starts over; when its groups
//! turned out to see fewer than two rows each it steps aside for the rest of the input
//! (nearly unique keys gain nothing from it). Partial states merge (see [`St::merge`]),
//! so the results are those of the hash aggregation alone (f64 sums added in another
//! association; an i64 sum is an error exactly when its value overflows).

use super::agg::{encode_states, AggKind, BatchItem, HashAgg, St};
use super::rows::hash_bytes;
use crate::error::Result;

/// Groups held at most.
pub const GROUPS: usize = 1024;
/// Bytes of keys held at most.
pub const KEY_BYTES: usize = 256 << 10;

const SLOTS: usize = GROUPS * 4;

/// What [`GroupCache::probe`] found.
pub enum Probe {
    /// The group's index.
    Group(usize),
    /// No room for a new group.
    Full,
}

/// The pre-aggregation table.
pub struct GroupCache {
    kinds: Vec<AggKind>,
    /// Open addressing: group index + 1, 0 empty.
    slots: Vec<u32>,
    /// Per group: hash, key offset, key length.
    groups: Vec<(u64, usize, usize)>,
    keys: Vec<u8>,
    /// `kinds.len()` states per group.
    states: Vec<St>,
    rows: u64,
    off: bool,
    /// The groups' keys and encoded states, and where they lie, as [`flush`](Self::flush)
    /// hands them on.
    sb: Vec<u8>,
    items: Vec<BatchItem>,
    /// Times the cache was emptied (group numbers are reused after it).
    generation: u64,
}

impl GroupCache {
    pub fn new(kinds: Vec<AggKind>) -> GroupCache {
        GroupCache {
            kinds,
            slots: vec![0; SLOTS],
            groups: Vec::new(),
            keys: Vec::new(),
            states: Vec::new(),
            rows: 0,
            off: false,
            sb: Vec::new(),
            items: Vec::new(),
            generation: 0,
        }
    }

    /// Whether rows should bypass the cache (go to the hash aggregation one by one).
    pub fn is_off(&self) -> bool {
        self.off
    }

    /// The group of `key` (whose hash is `h`), created with empty states if new and there
    /// is room; [`Probe::Full`] if there is none (then [`make_room`](Self::make_room)).
    /// Only while the cache is on.
    #[inline]
    pub fn probe(&mut self, key: &[u8], h: u64) -> Probe {
        debug_assert!(!self.off);
        let mut s = (h as usize) & (SLOTS - 1);
        loop {
            match self.slots[s] as usize {
                0 => break,
                g => {
                    let (gh, o, l) = self.groups[g - 1];
                    if gh == h && &self.keys[o..o + l] == key {
                        self.rows += 1;
                        return Probe::Group(g - 1);
                    }
                }
            }
            s = (s + 1) & (SLOTS - 1);
        }
        if self.groups.len() >= GROUPS || self.keys.len() + key.len() > KEY_BYTES {
            return Probe::Full;
        }
        self.rows += 1;
        let g = self.groups.len();
        self.groups.push((h, self.keys.len(), key.len()));
        self.keys.extend_from_slice(key);
        self.slots[s] = (g + 1) as u32;
        self.states.extend(self.kinds.iter().map(|k| St::empty(k.kind)));
        Probe::Group(g)
    }

    /// Counts a row found in a group without [`probe`](Self::probe).
    pub fn hit(&mut self) {
        self.rows += 1;
    }

    /// Counts `n` rows found in their groups without [`probe`](Self::probe).
    pub fn hits(&mut self, n: u64) {
        self.rows += n;
    }

    /// Whether the cache holds no group.
    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    /// Every group's states: group `g`'s are `[g * n .. (g + 1) * n]` for `n` aggregates.
    pub fn all_states(&mut self) -> &mut [St] {
        &mut self.states
    }

    /// Hands the groups to `main` to make room; if they saw fewer than two rows each, the
    /// cache turns itself off for the rest of the input.
    pub fn make_room(&mut self, main: &mut HashAgg<'_>) -> Result<()> {
        let (rows, groups) = (self.rows, self.groups.len() as u64);
        self.flush(main)?;
        if rows < 2 * groups {
            self.off = true;
        }
        Ok(())
    }

    /// The states of the group of `key` (created empty if new), flushing into `main` first
    /// when the cache is full. `None`: the cache is off, push the row directly.
    pub fn states(&mut self, key: &[u8], main: &mut HashAgg<'_>) -> Result<Option<&mut [St]>> {
        if self.off {
            return Ok(None);
        }
        let h = hash_bytes(key);
        let g = match self.probe(key, h) {
            Probe::Group(g) => g,
            Probe::Full => {
                self.make_room(main)?;
                if self.off {
                    return Ok(None);
                }
                match self.probe(key, h) {
                    Probe::Group(g) => g,
                    // An empty cache holds any one key of at most KEY_BYTES; a longer one
                    // goes to the hash aggregation directly.
                    Probe::Full => return Ok(None),
                }
            }
        };
        let n = self.kinds.len();
        Ok(Some(&mut self.states[g * n..(g + 1) * n]))
    }

    /// Hands every group to `main` (in arrival order) and empties the cache.
    pub fn flush(&mut self, main: &mut HashAgg<'_>) -> Result<()> {
        let n = self.kinds.len();
        // Every group's key and encoded states in `sb`, pushed as one batch.
        self.sb.clear();
        self.items.clear();
        for (g, &(hash, o, klen)) in self.groups.iter().enumerate() {
            let at = self.sb.len();
            self.sb.extend_from_slice(&self.keys[o..o + klen]);
            encode_states(&self.states[g * n..(g + 1) * n], &mut self.sb);
            self.items.push(BatchItem { hash, at, klen, slen: self.sb.len() - at - klen });
        }
        main.push_batch(&self.sb, &self.items)?;
        self.groups.clear();
        self.keys.clear();
        self.states.clear();
        self.slots.fill(0);
        self.rows = 0;
        self.generation += 1;
        Ok(())
    }

    /// Changes whenever the groups' numbers change meaning (the cache was emptied).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The aggregates' kinds.
    pub fn kinds(&self) -> &[AggKind] {
        &self.kinds
    }
}

// ---- Aggregation straight over a vectorized scan ----
//
// When an aggregation reads a table scan whose whole filter is evaluated leaf-wise, and
// its arguments are arithmetic over i64/f64 columns and constants (and its group keys,
// if any, plain columns), each leaf's passing rows are taken as a batch: every argument
// is computed as a vector (checked i64, f64, NULL propagated) by a small register
// program, then merged row by row into the states. If computing a vector meets an error
// (overflow, division by zero) the leaf is redone row at a time with the row evaluator,
// so the error is the one (and from the row) it always was.

use super::accum;
use super::agg::Kind;
use super::exec::{AggSpec, Plan};
use super::expr::{ArOp, BExpr};
use super::rows::encode_value;
use super::scan::{Batch, ColScan};

mod runs;
use crate::access::table::{ColumnType, Schema, Value};
use crate::buffer::BufferManager;
use runs::Runs;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Rt {
    I,
    F,
}

#[derive(Debug)]
enum Op {
    LoadI { dst: usize, col: usize },
    LoadF { dst: usize, col: usize },
    ConstI { dst: usize, v: i64 },
    ConstF { dst: usize, v: f64 },
    ToF { dst: usize, a: usize },
    ArI { op: ArOp, dst: usize, a: usize, b: usize },
    ArF { op: ArOp, dst: usize, a: usize, b: usize },
    NegI { dst: usize, a: usize },
    NegF { dst: usize, a: usize },
}

/// A register: one value per row of the batch. `nulls` says whether `null` is valid; when
/// it is false no row is NULL (and `null` is stale), so the common case of columns without
/// NULLs costs no null vector at all.
#[derive(Default, Clone)]
struct Reg {
    i: Vec<i64>,
    f: Vec<f64>,
    null: Vec<bool>,
    nulls: bool,
}

impl Reg {
    #[inline]
    fn is_null(&self, k: usize) -> bool {
        self.nulls && self.null[k]
    }
}

/// The arguments of an aggregation as one register program.
struct Prog {
    ops: Vec<Op>,
    regs: Vec<Reg>,
    /// Per aggregate: the register of its argument and its type (`None`: `count(*)`).
    outs: Vec<Option<(usize, Rt)>>,
    lanes: accum::Lanes,
}

/// Registers already computed, by the expression they hold (its [`shape`]): a
/// subexpression shared by several aggregates (TPC-H Q1's `l_extendedprice * (1 -
/// l_discount)`, or a column loaded by several) is computed once per batch.
type Memo = Vec<(String, usize, Rt)>;

/// What an expression computes, without the source positions it carries: the same
/// subexpression written twice has one shape. (Positions only name errors, and an error
/// in a vector sends the batch to the row evaluator, which reports it with its position.)
fn shape(e: &BExpr, out: &mut String) {
    use std::fmt::Write;
    match e {
        BExpr::Col(c, _) => {
            let _ = write!(out, "#{c}");
        }
        BExpr::Neg(x, _) => {
            out.push_str("-(");
            shape(x, out);
            out.push(')');
        }
        BExpr::Arith(op, a, b, _) => {
            let _ = write!(out, "{op:?}(");
            shape(a, out);
            out.push(',');
            shape(b, out);
            out.push(')');
        }
        e => {
            let _ = write!(out, "{e:?}");
        }
    }
}

fn compile(e: &BExpr, schema: &Schema, ops: &mut Vec<Op>, n: &mut usize, memo: &mut Memo) -> Option<(usize, Rt)> {
    let mut key = String::new();
    shape(e, &mut key);
    if let Some(&(_, r, t)) = memo.iter().find(|(k, ..)| *k == key) {
        return Some((r, t));
    }
    let reg = |n: &mut usize| {
        *n += 1;
        *n - 1
    };
    let out = match e {
        BExpr::Col(c, _) => match schema.columns.get(*c)?.ty {
            ColumnType::I64 => {
                let dst = reg(n);
                ops.push(Op::LoadI { dst, col: *c });
                (dst, Rt::I)
            }
            ColumnType::F64 => {
                let dst = reg(n);
                ops.push(Op::LoadF { dst, col: *c });
                (dst, Rt::F)
            }
            _ => return None,
        },
        BExpr::Lit(Value::I64(v)) => {
            let dst = reg(n);
            ops.push(Op::ConstI { dst, v: *v });
            (dst, Rt::I)
        }
        BExpr::Lit(Value::F64(v)) => {
            let dst = reg(n);
            ops.push(Op::ConstF { dst, v: *v });
            (dst, Rt::F)
        }
        BExpr::Neg(x, _) => {
            let (a, t) = compile(x, schema, ops, n, memo)?;
            let dst = reg(n);
            ops.push(if t == Rt::I { Op::NegI { dst, a } } else { Op::NegF { dst, a } });
            (dst, t)
        }
        BExpr::Arith(op, a, b, _) => {
            let (ra, ta) = compile(a, schema, ops, n, memo)?;
            let (rb, tb) = compile(b, schema, ops, n, memo)?;
            let to_f = |r: usize, t: Rt, ops: &mut Vec<Op>, n: &mut usize| {
                if t == Rt::F {
                    return r;
                }
                let dst = reg(n);
                ops.push(Op::ToF { dst, a: r });
                dst
            };
            if ta == Rt::I && tb == Rt::I {
                let dst = reg(n);
                ops.push(Op::ArI { op: *op, dst, a: ra, b: rb });
                (dst, Rt::I)
            } else {
                let a = to_f(ra, ta, ops, n);
                let b = to_f(rb, tb, ops, n);
                let dst = reg(n);
                ops.push(Op::ArF { op: *op, dst, a, b });
                (dst, Rt::F)
            }
        }
        _ => return None,
    };
    memo.push((key, out.0, out.1));
    Some(out)
}

/// `dst.null` = `a.null | b.null` (when either has NULLs).
fn union_nulls(dst: &mut Reg, a: &Reg, b: &Reg, len: usize) {
    dst.null.clear();
    dst.nulls = a.nulls || b.nulls;
    match (a.nulls, b.nulls) {
        (true, true) => dst.null.extend(a.null.iter().zip(&b.null).map(|(x, y)| x | y)),
        (true, false) => dst.null.extend_from_slice(&a.null[..len]),
        (false, true) => dst.null.extend_from_slice(&b.null[..len]),
        (false, false) => {}
    }
}

impl Prog {
    fn new(aggs: &[AggSpec], schema: &Schema) -> Option<Prog> {
        let (mut ops, mut n, mut memo) = (Vec::new(), 0usize, Memo::new());
        let mut outs = Vec::with_capacity(aggs.len());
        for a in aggs {
            if a.distinct {
                return None;
            }
            outs.push(match &a.arg {
                None => None,
                Some(e) => Some(compile(e, schema, &mut ops, &mut n, &mut memo)?),
            });
        }
        Some(Prog { ops, regs: vec![Reg::default(); n], outs, lanes: accum::Lanes::default() })
    }

    /// Computes every register over the batch's rows; `Err` if a value fails (overflow,
    /// division by zero).
    fn eval(&mut self, b: &Batch<'_>) -> std::result::Result<(), ()> {
        let sel = b.sel;
        let len = sel.len();
        for op in &self.ops {
            let dst = match op {
                Op::LoadI { dst, .. }
                | Op::LoadF { dst, .. }
                | Op::ConstI { dst, .. }
                | Op::ConstF { dst, .. }
                | Op::ToF { dst, .. }
                | Op::ArI { dst, .. }
                | Op::ArF { dst, .. }
                | Op::NegI { dst, .. }
                | Op::NegF { dst, .. } => *dst,
            };
            // Operands are earlier registers than `dst`.
            let (done, rest) = self.regs.split_at_mut(dst);
            let d = &mut rest[0];
            match op {
                Op::LoadI { col, .. } | Op::LoadF { col, .. } => {
                    if matches!(op, Op::LoadI { .. }) {
                        b.lf.gather8(*col, sel, &mut d.i, |x| x as i64);
                    } else {
                        b.lf.gather8(*col, sel, &mut d.f, f64::from_bits);
                    }
                    d.nulls = b.lf.any_null(*col, sel);
                    d.null.clear();
                    if d.nulls {
                        d.null.extend(sel.iter().map(|&i| b.lf.is_null(*col, i as usize)));
                    }
                }
                Op::ConstI { v, .. } => {
                    d.i.clear();
                    d.i.resize(len, *v);
                    d.nulls = false;
                }
                Op::ConstF { v, .. } => {
                    d.f.clear();
                    d.f.resize(len, *v);
                    d.nulls = false;
                }
                Op::ToF { a, .. } => {
                    let a = &done[*a];
                    d.f.clear();
                    d.f.extend(a.i.iter().map(|&x| x as f64));
                    d.nulls = a.nulls;
                    d.null.clone_from(&a.null);
                }
                Op::NegI { a, .. } => {
                    let a = &done[*a];
                    d.i.clear();
                    d.nulls = a.nulls;
                    d.null.clone_from(&a.null);
                    for (k, x) in a.i.iter().enumerate() {
                        d.i.push(if a.is_null(k) { 0 } else { x.checked_neg().ok_or(())? });
                    }
                }
                Op::NegF { a, .. } => {
                    let a = &done[*a];
                    d.f.clear();
                    d.f.extend(a.f.iter().map(|&x| -x));
                    d.nulls = a.nulls;
                    d.null.clone_from(&a.null);
                }
                Op::ArI { op, a, b: bb, .. } => {
                    let (a, bb) = (&done[*a], &done[*bb]);
                    union_nulls(d, a, bb, len);
                    d.i.clear();
                    for k in 0..len {
                        d.i.push(if d.is_null(k) {
                            0
                        } else {
                            let (x, y) = (a.i[k], bb.i[k]);
                            match op {
                                ArOp::Add => x.checked_add(y),
                                ArOp::Sub => x.checked_sub(y),
                                ArOp::Mul => x.checked_mul(y),
                                ArOp::Div => x.checked_div(y),
                                ArOp::Rem => x.checked_rem(y),
                            }
                            .ok_or(())?
                        });
                    }
                }
                Op::ArF { op, a, b: bb, .. } => {
                    let (a, bb) = (&done[*a], &done[*bb]);
                    union_nulls(d, a, bb, len);
                    if matches!(op, ArOp::Div | ArOp::Rem) && (0..len).any(|k| bb.f[k] == 0.0 && !d.is_null(k)) {
                        return Err(());
                    }
                    let (x, y) = (&a.f[..len], &bb.f[..len]);
                    d.f.clear();
                    // One loop per operator, so that each is a plain vector loop.
                    match op {
                        ArOp::Add => d.f.extend(x.iter().zip(y).map(|(x, y)| x + y)),
                        ArOp::Sub => d.f.extend(x.iter().zip(y).map(|(x, y)| x - y)),
                        ArOp::Mul => d.f.extend(x.iter().zip(y).map(|(x, y)| x * y)),
                        ArOp::Div => d.f.extend(x.iter().zip(y).map(|(x, y)| x / y)),
                        ArOp::Rem => d.f.extend(x.iter().zip(y).map(|(x, y)| x % y)),
                    }
                }
            }
        }
        Ok(())
    }

    /// Merges rows `rows` of the batch into the states: row `k` into the group
    /// `gids[k - rows.start]` (no `gids`: group 0), whose states are `states[group * n ..
    /// (group + 1) * n]` (`n` aggregates). Aggregate by aggregate, so that each is one loop
    /// of one kind of update; with few groups, counts and sums are taken group by group
    /// over the batch and merged once per group (see [`super::accum`]); otherwise row by
    /// row, the rows of a group in the batch's order.
    fn merge_rows(&mut self, rows: std::ops::Range<usize>, gids: Option<&[u32]>, states: &mut [St], kinds: &[AggKind]) -> Result<()> {
        let n = kinds.len();
        if n == 0 {
            return Ok(());
        }
        if rows.len() >= FEW_MIN_ROWS && states.len() / n <= accum::FEW {
            return self.merge_few(rows, gids, states, kinds);
        }
        let group = |k: usize| gids.map_or(0, |ids| ids[k - rows.start] as usize);
        for (a, (out, kind)) in self.outs.iter().zip(kinds).enumerate() {
            let st = |k: usize| group(k) * n + a;
            let Some((r, t)) = *out else {
                for k in rows.clone() {
                    match &mut states[st(k)] {
                        St::Count(c) => *c += 1,
                        s => s.merge(St::one(kind.kind, Value::Bool(true)), kind)?,
                    }
                }
                continue;
            };
            let reg = &self.regs[r];
            match (kind.kind, t) {
                (Kind::Count, _) => {
                    for k in rows.clone().filter(|&k| !reg.is_null(k)) {
                        match &mut states[st(k)] {
                            St::Count(c) => *c += 1,
                            s => s.merge(St::one(kind.kind, Value::Bool(true)), kind)?,
                        }
                    }
                }
                (Kind::SumF, Rt::F) => {
                    for k in rows.clone().filter(|&k| !reg.is_null(k)) {
                        match &mut states[st(k)] {
                            St::SumF(x) => *x = Some(x.unwrap_or(0.0) + reg.f[k]),
                            s => s.merge(St::one(kind.kind, Value::F64(reg.f[k])), kind)?,
                        }
                    }
                }
                (Kind::AvgF, Rt::F) => {
                    for k in rows.clone().filter(|&k| !reg.is_null(k)) {
                        match &mut states[st(k)] {
                            St::AvgF(x, c) => {
                                *x += reg.f[k];
                                *c += 1;
                            }
                            s => s.merge(St::one(kind.kind, Value::F64(reg.f[k])), kind)?,
                        }
                    }
                }
                (_, Rt::F) => {
                    for k in rows.clone().filter(|&k| !reg.is_null(k)) {
                        states[st(k)].merge(St::one(kind.kind, Value::F64(reg.f[k])), kind)?;
                    }
                }
                (_, Rt::I) => {
                    for k in rows.clone().filter(|&k| !reg.is_null(k)) {
                        states[st(k)].merge(St::one(kind.kind, Value::I64(reg.i[k])), kind)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// [`merge_rows`](Self::merge_rows) for at most [`accum::FEW`] groups: per aggregate, the
    /// counts or sums of each group's rows (see [`accum::Lanes`]), merged into its state as
    /// the state of those rows (min and max row by row).
    fn merge_few(&mut self, rows: std::ops::Range<usize>, gids: Option<&[u32]>, states: &mut [St], kinds: &[AggKind]) -> Result<()> {
        let n = kinds.len();
        let (len, groups) = (rows.len(), states.len() / n);
        let Prog { regs, outs, lanes, .. } = self;
        lanes.count_groups(gids, len, groups);
        for (a, (out, kind)) in outs.iter().zip(kinds).enumerate() {
            let st = |g: usize| g * n + a;
            let Some((r, t)) = *out else {
                // count(*): every row.
                lanes.count(gids, None, groups, |g, c| states[st(g)].merge(St::Count(c), kind))?;
                continue;
            };
            let reg = &regs[r];
            let null = reg.nulls.then(|| &reg.null[rows.clone()]);
            match (kind.kind, t) {
                (Kind::Count, _) => lanes.count(gids, null, groups, |g, c| states[st(g)].merge(St::Count(c), kind))?,
                (Kind::SumF, Rt::F) => lanes.sum_f(&reg.f[rows.clone()], gids, null, groups, |g, s, _| states[st(g)].merge(St::SumF(Some(s)), kind))?,
                (Kind::AvgF, Rt::F) => lanes.sum_f(&reg.f[rows.clone()], gids, null, groups, |g, s, c| states[st(g)].merge(St::AvgF(s, c), kind))?,
                (Kind::AvgI, Rt::I) => lanes.sum_i(&reg.i[rows.clone()], gids, null, groups, |g, s, c| states[st(g)].merge(St::AvgI(s, c), kind))?,
                (Kind::SumI, Rt::I) => lanes.sum_i(&reg.i[rows.clone()], gids, null, groups, |g, s, _| {
                    let s = i64::try_from(s).map_err(|_| super::expr::err(kind.pos, format!("i64 overflow in {}", kind.label)))?;
                    states[st(g)].merge(St::SumI(Some(s)), kind)
                })?,
                _ => {
                    // Min and max (and a type the kinds above do not take): row by row.
                    for k in rows.clone().filter(|&k| !reg.is_null(k)) {
                        let g = gids.map_or(0, |ids| ids[k - rows.start] as usize);
                        let v = match t {
                            Rt::F => Value::F64(reg.f[k]),
                            Rt::I => Value::I64(reg.i[k]),
                        };
                        states[st(g)].merge(St::one(kind.kind, v), kind)?;
                    }
                }
            }
        }
        Ok(())
    }
}

/// Rows of a batch at least for [`Prog::merge_few`] (fewer: row by row).
const FEW_MIN_ROWS: usize = 16;

/// The scan under an aggregation, if the fused path can take it.
fn fusable(input: &Plan) -> Option<&ColScan> {
    match input {
        Plan::ColScan(s) if s.batchable() => Some(s),
        _ => None,
    }
}

/// Rows per morsel of a parallel aggregation at most (and at least [`MORSEL_MIN`]; about
/// [`MORSELS_PER_WORKER`] morsels per worker in between, so that workers finish together).
/// Each morsel is a scan of its own, which starts its own read-ahead ring (I/O threads and
/// buffers; about a millisecond of CPU): few large morsels, not many small ones.
const MORSEL: u64 = 1 << 18;
const MORSEL_MIN: u64 = 1 << 10;
const MORSELS_PER_WORKER: u64 = 4;

/// How [`morsels`] deals `rows` to `threads` workers: the morsel's rows, the number of
/// morsels and of workers (fewer than `threads` when there are fewer morsels).
fn dealing(threads: usize, rows: u64) -> (u64, u64, usize) {
    let morsel = (rows / (threads.max(1) as u64 * MORSELS_PER_WORKER)).clamp(MORSEL_MIN, MORSEL);
    let count = rows.div_ceil(morsel);
    (morsel, count, threads.min(count as usize).max(1))
}

/// The workers [`morsels`] runs for `rows` rows on `threads` threads.
pub(super) fn workers(threads: usize, rows: u64) -> usize {
    dealing(threads, rows).2
}

/// Runs `work(from, to)` over morsels of `0..rows` on `threads` workers (fewer if there are
/// fewer morsels), each with its own state made by `init`; returns the states in worker
/// order. The morsels are dealt in turn
/// (worker `w` takes morsels `w`, `w + threads`, ...), not taken as workers come free: each
/// worker's share, and so the order in which partial states are merged, is the same in
/// every run with that many workers, and floating-point sums computed twice in one query
/// agree to the last bit (a `WITH` query used twice: TPC-H Q15 compares a supplier's
/// revenue with the maximum computed from a second evaluation of the same sums).
pub(super) fn morsels<T: Send>(
    threads: usize,
    rows: u64,
    init: &(dyn Fn() -> T + Sync),
    work: &(dyn Fn(&mut T, u64, u64) -> Result<()> + Sync),
) -> Result<Vec<T>> {
    let (morsel, _, threads) = dealing(threads, rows);
    deal(threads, rows, morsel, init, work)
}

/// [`morsels`] of `0..units` in morsels of `morsel` units (the last one shorter) on
/// `threads` workers (fewer if there are fewer morsels), dealt in turn; the workers'
/// states in worker order.
pub(super) fn deal<T: Send>(
    threads: usize,
    units: u64,
    morsel: u64,
    init: &(dyn Fn() -> T + Sync),
    work: &(dyn Fn(&mut T, u64, u64) -> Result<()> + Sync),
) -> Result<Vec<T>> {
    let morsel = morsel.max(1);
    let count = units.div_ceil(morsel);
    let threads = threads.min(count as usize).max(1);
    // Set when a worker fails: the others stop at their next morsel.
    let failed = std::sync::atomic::AtomicBool::new(false);
    let run = |w: usize| -> Result<T> {
        let mut st = init();
        let mut m = w as u64;
        while m < count && !failed.load(std::sync::atomic::Ordering::Relaxed) {
            let a = m * morsel;
            if let Err(e) = work(&mut st, a, (a + morsel).min(units)) {
                failed.store(true, std::sync::atomic::Ordering::Relaxed);
                return Err(e);
            }
            m += threads as u64;
        }
        Ok(st)
    };
    let run = &run;
    on_threads((0..threads).map(|w| move || run(w)).collect())
}

/// Runs each job on a thread of its own (the first on the calling thread); their results
/// in job order, or the first job's error (a job's panic is resumed here).
pub(super) fn on_threads<T: Send, F: FnOnce() -> Result<T> + Send>(jobs: Vec<F>) -> Result<Vec<T>> {
    std::thread::scope(|s| {
        let mut jobs = jobs.into_iter();
        let first = jobs.next();
        let hs: Vec<_> = jobs.map(|j| s.spawn(j)).collect();
        let mut out = Vec::with_capacity(hs.len() + 1);
        if let Some(j) = first {
            out.push(j());
        }
        for h in hs {
            out.push(h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)));
        }
        out.into_iter().collect()
    })
}

/// One batch into whole-table states.
fn agg_batch(prog: &mut Prog, b: &Batch<'_>, aggs: &[AggSpec], kinds: &[AggKind], states: &mut [St], needed: &[usize], row: &mut [Value]) -> Result<()> {
    if prog.eval(b).is_ok() {
        return prog.merge_rows(0..b.sel.len(), None, states, kinds);
    }
    for &i in b.sel {
        b.decode(i as usize, needed, row)?;
        super::exec::agg_row(aggs, kinds, states, row)?;
    }
    Ok(())
}

/// A whole-table aggregation (no groups) straight over a vectorized scan, into `states`.
/// `Ok(false)`: not applicable, nothing done.
pub fn fused_aggregate(bm: &BufferManager, input: &Plan, aggs: &[AggSpec], kinds: &[AggKind], states: &mut [St]) -> Result<bool> {
    let Some(scan) = fusable(input) else { return Ok(false) };
    let Some(mut prog) = Prog::new(aggs, &scan.table.schema) else { return Ok(false) };
    let needed = scan.needed();
    let width = scan.table.schema.len();
    if scan.threads > 1 {
        let init = || (Prog::new(aggs, &scan.table.schema), kinds.iter().map(|k| St::empty(k.kind)).collect::<Vec<St>>(), vec![Value::Null; width]);
        let work = |st: &mut (Option<Prog>, Vec<St>, Vec<Value>), a: u64, z: u64| -> Result<()> {
            let (Some(prog), states, row) = st else { return Ok(()) };
            scan.run_batches_range(bm, a, z, &mut |b| agg_batch(prog, b, aggs, kinds, states, &needed, row).map(|_| true))?;
            Ok(())
        };
        for (_, part, _) in morsels(scan.threads, scan.table.rows(bm)?, &init, &work)? {
            for ((s, p), k) in states.iter_mut().zip(part).zip(kinds) {
                s.merge(p, k)?;
            }
        }
        return Ok(true);
    }
    let mut row = vec![Value::Null; width];
    scan.run_batches(bm, &mut |b| agg_batch(&mut prog, b, aggs, kinds, states, &needed, &mut row).map(|_| true))?;
    Ok(true)
}

/// What a grouped aggregation over batches works with.
struct Grouping<'k> {
    key_cols: Vec<usize>,
    /// The key is at most two columns of types [`small_codes`](super::scan::LeafView::small_codes) packs.
    small: bool,
    needed: Vec<usize>,
    aggs: &'k [AggSpec],
    kinds: Vec<AggKind>,
}

/// `a == b` for short keys without a call to `memcmp`: a word at a time.
#[inline]
fn same_key(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let (mut ca, mut cb) = (a.chunks_exact(8), b.chunks_exact(8));
    for (x, y) in (&mut ca).zip(&mut cb) {
        if u64::from_le_bytes(x.try_into().unwrap()) != u64::from_le_bytes(y.try_into().unwrap()) {
            return false;
        }
    }
    ca.remainder().iter().zip(cb.remainder()).all(|(x, y)| x == y)
}

/// Buffers a grouped aggregation reuses from batch to batch.
#[derive(Default)]
struct Scratch {
    row: Vec<Value>,
    /// Key bytes (this row's, the row before's).
    kb: Vec<u8>,
    pk: Vec<u8>,
    sts: Vec<St>,
    /// Rows of the batch for the hash aggregation directly (the cache off): keys and
    /// encoded states, and where they lie.
    bb: Vec<u8>,
    items: Vec<BatchItem>,
    /// Per row of the batch: its group in the cache.
    gids: Vec<u32>,
    small: SmallKeys,
    /// Per row of the batch: its key packed (see [`small_keys`]).
    codes: Vec<u128>,
    /// One key column's codes.
    col: Vec<u64>,
    /// Per row of the batch: whether its key packs.
    ok: Vec<bool>,
}

/// Small group keys straight to their group in the cache: a key of at most two columns
/// whose values are integers, dates, booleans or strings of at most 7 bytes packs into a
/// `u128` (one [`small_codes`](super::scan::LeafView::small_codes) code per column, the first in the low half), which this map takes
/// to the group found for it before (the general path encodes the key, hashes it and
/// probes the cache). Valid for one [`GroupCache::generation`].
#[derive(Default)]
struct SmallKeys {
    /// (packed key, group + 1); 0: empty.
    slots: Vec<(u128, u32)>,
    used: usize,
    generation: u64,
}

/// Slots of a [`SmallKeys`] map (filled to half at most).
const SMALL_SLOTS: usize = 1 << 10;

impl SmallKeys {
    /// Forgets every key if the cache's groups changed meaning.
    fn sync(&mut self, generation: u64) {
        if self.slots.is_empty() || self.generation != generation {
            self.slots.clear();
            self.slots.resize(SMALL_SLOTS, (0, 0));
            self.used = 0;
            self.generation = generation;
        }
    }

    #[inline]
    fn slot(k: u128) -> usize {
        let h = ((k as u64) ^ ((k >> 64) as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)).wrapping_mul(0xC2B2_AE3D_27D4_EB4F);
        (h >> (64 - SMALL_SLOTS.trailing_zeros())) as usize
    }

    #[inline]
    fn get(&self, k: u128) -> Option<u32> {
        let mut s = Self::slot(k);
        loop {
            match self.slots[s] {
                (_, 0) => return None,
                (key, g) if key == k => return Some(g - 1),
                _ => s = (s + 1) & (SMALL_SLOTS - 1),
            }
        }
    }

    /// Whether the map took as many keys as it holds (then the key at hand is not looked
    /// up: with that many distinct keys they rarely repeat soon, as in a grouping by order
    /// key, and the general path is the one that pays).
    fn full(&self) -> bool {
        self.used >= SMALL_SLOTS / 2
    }

    fn put(&mut self, k: u128, gid: u32) {
        if self.full() {
            return;
        }
        let mut s = Self::slot(k);
        loop {
            match self.slots[s] {
                (_, 0) => {
                    self.slots[s] = (k, gid + 1);
                    self.used += 1;
                    return;
                }
                (key, _) if key == k => return,
                _ => s = (s + 1) & (SMALL_SLOTS - 1),
            }
        }
    }
}

/// Whether [`small_codes`](super::scan::LeafView::small_codes) packs values of this type.
fn small_type(ty: ColumnType) -> bool {
    matches!(ty, ColumnType::I64 | ColumnType::Date | ColumnType::Bool | ColumnType::Str | ColumnType::Bytes)
}

/// The batch's rows' keys packed (see [`SmallKeys`]) into `x.codes`, and whether each
/// row's key packs into `x.ok` (`false`: a key column's type never packs).
fn small_keys(b: &Batch<'_>, cols: &[usize], x: &mut Scratch) -> bool {
    let n = b.sel.len();
    x.col.resize(n, 0);
    x.ok.clear();
    x.ok.resize(n, true);
    x.codes.clear();
    for (j, &c) in cols.iter().enumerate() {
        if !b.lf.small_codes(c, b.sel, &mut x.col[..n], &mut x.ok) {
            return false;
        }
        if j == 0 {
            x.codes.extend(x.col[..n].iter().map(|&v| v as u128));
        } else {
            x.codes.iter_mut().zip(&x.col).for_each(|(k, &v)| *k |= (v as u128) << 64);
        }
    }
    true
}

impl Scratch {
    fn new(width: usize) -> Scratch {
        Scratch { row: vec![Value::Null; width], ..Scratch::default() }
    }
}

/// One batch into the groups of `cache` and `main`. With the arguments computed as
/// vectors, the rows' groups are found first (keys encoded straight from the leaf), then
/// each aggregate is merged over the rows in one loop; when the cache fills up, the rows
/// so far are merged before it hands its groups on.
fn group_batch(g: &Grouping<'_>, prog: &mut Prog, b: &Batch<'_>, cache: &mut GroupCache, main: &mut HashAgg<'_>, x: &mut Scratch) -> Result<()> {
    let vector = prog.eval(b).is_ok();
    let mut k = 0;
    if vector && !cache.is_off() {
        x.gids.clear();
        let mut from = 0;
        // The group of the row before and its key (in `x.pk`): rows of one group often
        // come together (sorted or clustered input), and a key compare is cheaper than a
        // hash and a probe.
        let mut prev: Option<u32> = None;
        x.small.sync(cache.generation());
        // The rows' keys packed (where they pack), and the last packed key met with its group.
        let codes = g.small && small_keys(b, &g.key_cols, x);
        if codes && !x.small.full() {
            // The rows whose keys the map knows, up to the first it does not: without the
            // branches of the loop below, which mispredict where few groups interleave.
            for (&c, &ok) in x.codes.iter().zip(&x.ok) {
                match x.small.get(c) {
                    Some(gid) if ok => x.gids.push(gid),
                    _ => break,
                }
            }
            k = x.gids.len();
            cache.hits(k as u64);
        }
        let mut last: Option<(u128, u32)> = None;
        while k < b.sel.len() {
            let sk = if codes && x.ok[k] && !x.small.full() { Some(x.codes[k]) } else { None };
            if let Some(gid) = sk.and_then(|sk| match last {
                Some((c, gid)) if c == sk => Some(gid),
                _ => x.small.get(sk),
            }) {
                last = sk.map(|sk| (sk, gid));
                cache.hit();
                x.gids.push(gid);
                k += 1;
                continue;
            }
            x.kb.clear();
            b.encode(b.sel[k] as usize, &g.key_cols, &mut x.kb)?;
            if let Some(gid) = prev.filter(|_| same_key(&x.kb, &x.pk)) {
                cache.hit();
                x.gids.push(gid);
                if let Some(sk) = sk {
                    x.small.put(sk, gid);
                }
                k += 1;
                continue;
            }
            match cache.probe(&x.kb, hash_bytes(&x.kb)) {
                Probe::Group(gid) => {
                    if let Some(sk) = sk {
                        x.small.put(sk, gid as u32);
                    }
                    x.gids.push(gid as u32);
                    prev = Some(gid as u32);
                    std::mem::swap(&mut x.kb, &mut x.pk);
                    k += 1;
                }
                Probe::Full => {
                    if k > from {
                        let gids = &x.gids;
                        prog.merge_rows(from..k, Some(&gids[..]), cache.all_states(), &g.kinds)?;
                        x.gids.clear();
                        from = k;
                    }
                    // Full while empty: a key longer than the cache holds (the row path
                    // hands it to the hash aggregation directly).
                    if cache.is_empty() {
                        break;
                    }
                    cache.make_room(main)?;
                    x.small.sync(cache.generation());
                    prev = None;
                    last = None;
                    if cache.is_off() {
                        break;
                    }
                }
            }
        }
        let gids = &x.gids;
        prog.merge_rows(from..k, Some(&gids[..]), cache.all_states(), &g.kinds)?;
    }
    // Row by row: without vectors, once the cache is off, or for a key it cannot hold.
    for (k, &i) in b.sel.iter().enumerate().skip(k) {
        x.kb.clear();
        if vector {
            b.encode(i as usize, &g.key_cols, &mut x.kb)?;
        } else {
            b.decode(i as usize, &g.needed, &mut x.row)?;
            for &c in &g.key_cols {
                encode_value(&x.row[c], &mut x.kb);
            }
        }
        if !cache.is_off() && !x.items.is_empty() {
            // (the cache may hand groups on: the rows before go first)
            main.push_batch(&x.bb, &x.items)?;
            x.bb.clear();
            x.items.clear();
        }
        let cached = cache.states(&x.kb, main)?;
        let direct = cached.is_none();
        let into: &mut [St] = match cached {
            Some(s) => s,
            None => {
                x.sts.clear();
                x.sts.extend(g.kinds.iter().map(|k| St::empty(k.kind)));
                &mut x.sts[..]
            }
        };
        if vector {
            prog.merge_rows(k..k + 1, None, into, &g.kinds)?;
        } else {
            for ((s, a), kind) in into.iter_mut().zip(g.aggs).zip(&g.kinds) {
                let v = match &a.arg {
                    Some(e) => e.eval(&x.row)?,
                    None => Value::Bool(true),
                };
                s.merge(St::one(kind.kind, v), kind)?;
            }
        }
        if direct {
            // Pushed with the batch's other such rows, in one batch at the end.
            let at = x.bb.len();
            x.bb.extend_from_slice(&x.kb);
            encode_states(&x.sts, &mut x.bb);
            x.items.push(BatchItem { hash: hash_bytes(&x.kb), at, klen: x.kb.len(), slen: x.bb.len() - at - x.kb.len() });
        }
    }
    if !x.items.is_empty() {
        main.push_batch(&x.bb, &x.items)?;
        x.bb.clear();
        x.items.clear();
    }
    Ok(())
}

/// A grouped aggregation (no DISTINCT) straight over a vectorized scan, into `cache` and
/// `main`. `Ok(false)`: not applicable, nothing done. With several threads, each has its
/// own pre-aggregation and hash aggregation (temporary pages of the same pool), whose
/// groups are merged into `main` at the end.
pub fn fused_grouped(bm: &BufferManager, input: &Plan, keys: &[BExpr], aggs: &[AggSpec], cache: &mut GroupCache, main: &mut HashAgg<'_>) -> Result<bool> {
    let Some(scan) = fusable(input) else { return Ok(false) };
    let schema = &scan.table.schema;
    let mut key_cols = Vec::with_capacity(keys.len());
    for k in keys {
        match k {
            BExpr::Col(c, _) if *c < schema.len() => key_cols.push(*c),
            _ => return Ok(false),
        }
    }
    let Some(mut prog) = Prog::new(aggs, schema) else { return Ok(false) };
    let small = key_cols.len() <= 2 && key_cols.iter().all(|&c| small_type(schema.columns[c].ty));
    let stream = runs::streamable(&key_cols, |c| schema.columns[c].ty);
    let date = stream && schema.columns[key_cols[0]].ty == ColumnType::Date;
    let g = Grouping { key_cols, small, needed: scan.needed(), aggs, kinds: cache.kinds().to_vec() };
    // (the side runs of streamed groups in `main`'s pages, so that it can adopt them)
    let abm = main.buffer();
    if scan.threads > 1 {
        type Local<'b, 'c> = (Option<Prog>, GroupCache, HashAgg<'b>, Scratch, Option<Runs<'c>>);
        let rows = scan.table.rows(bm)?;
        let workers = workers(scan.threads, rows);
        let init = || -> Local<'_, '_> {
            (
                Prog::new(aggs, schema),
                GroupCache::new(g.kinds.clone()),
                HashAgg::worker(bm, g.kinds.clone(), workers),
                Scratch::new(schema.len()),
                stream.then(|| Runs::new(abm, date)),
            )
        };
        let work = |st: &mut Local<'_, '_>, a: u64, z: u64| -> Result<()> {
            let (Some(prog), cache, main, x, runs) = st else { return Ok(()) };
            scan.run_batches_range(bm, a, z, &mut |b| batch(&g, prog, b, cache, main, x, runs.as_mut()).map(|_| true))?;
            match runs {
                Some(r) => r.end_morsel(a, main),
                None => Ok(()),
            }
        };
        let locals = morsels(scan.threads, rows, &init, &work)?;
        let proven = runs::proven(&locals.iter().filter_map(|l| l.4.as_ref()).collect::<Vec<_>>());
        // Streamed groups proven distinct are adopted; the others are merged with the
        // worker's hashed groups.
        let mut partials = Vec::with_capacity(locals.len());
        for (_, c, m, _, r) in locals {
            let apart = match r {
                Some(r) if proven => {
                    r.finish(true, main)?;
                    None
                }
                r => r.map(Runs::into_groups),
            };
            partials.push((c, m, apart));
        }
        super::merge::merge_workers(main, partials)?;
        return Ok(true);
    }
    let mut x = Scratch::new(schema.len());
    let mut runs = stream.then(|| Runs::new(abm, date));
    scan.run_batches(bm, &mut |b| batch(&g, &mut prog, b, cache, main, &mut x, runs.as_mut()).map(|_| true))?;
    if let Some(mut r) = runs {
        r.end_morsel(0, main)?;
        let proven = runs::proven(&[&r]);
        r.finish(proven, main)?;
    }
    Ok(true)
}

/// One batch: streamed (see [`runs`]) while `runs` is on, else through the pre-aggregation.
fn batch(
    g: &Grouping<'_>,
    prog: &mut Prog,
    b: &Batch<'_>,
    cache: &mut GroupCache,
    main: &mut HashAgg<'_>,
    x: &mut Scratch,
    runs: Option<&mut Runs<'_>>,
) -> Result<()> {
    if let Some(r) = runs.filter(|r| r.on()) {
        if prog.eval(b).is_ok() {
            return r.batch(g, prog, b, main);
        }
        r.stop(main)?;
    }
    group_batch(g, prog, b, cache, main, x)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sql::exec::AggFunc;

    /// A subexpression written twice (at two source positions) is computed once, and a
    /// column read by several aggregates is loaded once.
    #[test]
    fn shared_subexpressions_are_computed_once() {
        let schema = Schema::parse("a:f64,b:f64,c:f64").unwrap();
        let col = |i: usize, n: &str| BExpr::Col(i, n.into());
        let one = || BExpr::Lit(Value::F64(1.0));
        // a * (1 - b), written at position p.
        let disc = |p: u64| {
            BExpr::Arith(
                ArOp::Mul,
                Box::new(col(0, "a")),
                Box::new(BExpr::Arith(ArOp::Sub, Box::new(one()), Box::new(col(1, "b")), Some((1, p)))),
                Some((1, p + 1)),
            )
        };
        let charge = BExpr::Arith(
            ArOp::Mul,
            Box::new(disc(40)),
            Box::new(BExpr::Arith(ArOp::Add, Box::new(one()), Box::new(col(2, "c")), Some((1, 60)))),
            Some((1, 61)),
        );
        let spec = |arg: BExpr| AggSpec { func: AggFunc::Sum, arg: Some(arg), arg_ty: Some(ColumnType::F64), pos: None, label: "s".into(), distinct: false };
        let prog = Prog::new(&[spec(col(0, "a")), spec(disc(10)), spec(charge)], &schema).unwrap();
        // a, 1, b, 1 - b, a * (1 - b), c, 1 + c, (a * (1 - b)) * (1 + c): the second
        // a * (1 - b) and every second load of a or of the constant 1 are shared.
        assert_eq!(prog.ops.len(), 8, "{:?}", prog.ops);
        assert_eq!(prog.outs[1], Some((4, Rt::F)));
    }
}
