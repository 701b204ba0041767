//! Hash aggregation whose state lives in temporary pages of the pool (`GROUP BY`,
//! `DISTINCT`, `count(DISTINCT x)`).
//!
//! A group is an entry of a hash table that fills one temporary page (an eighth of the pool;
//! each worker of a parallel aggregation has its share of that, [`HashAgg::worker`]):
//! a slot array of `u32` chain heads, then the entries, bump-allocated: the key's bytes (see
//! [`super::rows::encode_value`]) and the partial aggregates' bytes. Every input row arrives
//! as a partial aggregate of one row and is merged into its group. When the page is full,
//! the whole table is flushed as `(hash, key, partial state)` records into 16 partition runs
//! ([`RowRun`]s, by 4 bits of the hash) and cleared; at the end, if anything was flushed,
//! the table is flushed too and each partition is aggregated the same way (its own table,
//! sub-partitions by the next 4 bits if it still overflows), one after the other. Partials
//! merge (counts add, sums add, averages keep sum and count, min/max compare), so a group
//! split over several flushes comes out whole. The workers of a parallel aggregation each
//! have their own, merged partition by partition on several threads ([`super::merge`]).
//! Rust memory: the partitions' page lists,
//! small buffers of records on their way into them, and one decoded group at a time.
//!
//! Groups may come in batches ([`HashAgg::push_batch`]): the page is latched once for
//! many, and the slots and chain entries of the groups a few places ahead are prefetched
//! while one is merged. A flush walks the entries in the order they were allocated (not
//! slot by slot, which jumps around the page; so a spilled aggregation's groups come out
//! in another order than before, an unspilled one's still slot by slot). A table that
//! merged almost nothing before it filled up (unique keys, say) is bypassed for a while:
//! the groups go to the partitions directly, as its flush would have sent them a little
//! later.

use super::expr::{arith, compare, err, ArOp, Pos};
use super::rows::{
    corrupt, decode_value, encode_value, hash_bytes, not_temp, part_payload, pow2_floor, rd32, rd64, records, work_share, wr32, wr64, Pending, RowRun,
};
use crate::access::table::{ColumnType, Value};
use crate::access::TempPage;
use crate::buffer::BufferManager;
use crate::error::{Error, Result};
use crate::ops::spill::shifted;

/// What an aggregate keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Count,
    SumI,
    SumF,
    AvgI,
    AvgF,
    Min,
    Max,
}

/// An aggregate's kind with what its errors name.
#[derive(Clone, Debug)]
pub struct AggKind {
    pub kind: Kind,
    pub pos: Pos,
    pub label: String,
}

impl AggKind {
    /// The kind for `func` over an argument of type `ty`.
    pub fn of(func: super::exec::AggFunc, ty: Option<ColumnType>, pos: Pos, label: &str) -> AggKind {
        use super::exec::AggFunc as F;
        let f64_ = ty == Some(ColumnType::F64);
        let kind = match func {
            F::CountStar | F::Count => Kind::Count,
            F::Sum if f64_ => Kind::SumF,
            F::Sum => Kind::SumI,
            F::Avg if f64_ => Kind::AvgF,
            F::Avg => Kind::AvgI,
            F::Min => Kind::Min,
            F::Max => Kind::Max,
        };
        AggKind { kind, pos, label: label.to_owned() }
    }
}

/// A partial aggregate.
#[derive(Clone, Debug)]
pub enum St {
    Count(i64),
    SumI(Option<i64>),
    SumF(Option<f64>),
    AvgI(i128, i64),
    AvgF(f64, i64),
    /// Min or max so far (NULL: none).
    Ext(Value),
}

fn as_f64(v: &Value) -> Option<f64> {
    match v {
        Value::I64(i) => Some(*i as f64),
        Value::F64(f) => Some(*f),
        _ => None,
    }
}

impl St {
    /// The state of no rows.
    pub fn empty(k: Kind) -> St {
        match k {
            Kind::Count => St::Count(0),
            Kind::SumI => St::SumI(None),
            Kind::SumF => St::SumF(None),
            Kind::AvgI => St::AvgI(0, 0),
            Kind::AvgF => St::AvgF(0.0, 0),
            Kind::Min | Kind::Max => St::Ext(Value::Null),
        }
    }

    /// The state of one row whose argument is `v` (NULL counts as no row).
    pub fn one(k: Kind, v: Value) -> St {
        if matches!(v, Value::Null) {
            return St::empty(k);
        }
        match k {
            Kind::Count => St::Count(1),
            Kind::SumI => St::SumI(match v {
                Value::I64(i) => Some(i),
                _ => None,
            }),
            Kind::SumF => St::SumF(as_f64(&v)),
            Kind::AvgI => match v {
                Value::I64(i) => St::AvgI(i128::from(i), 1),
                _ => St::AvgI(0, 0),
            },
            Kind::AvgF => match as_f64(&v) {
                Some(f) => St::AvgF(f, 1),
                None => St::AvgF(0.0, 0),
            },
            Kind::Min | Kind::Max => St::Ext(v),
        }
    }

    /// Adds `o` (a partial of the same aggregate) into `self`.
    pub fn merge(&mut self, o: St, a: &AggKind) -> Result<()> {
        match (self, o) {
            (St::Count(x), St::Count(y)) => *x += y,
            (St::SumI(x), St::SumI(y)) => {
                if let Some(y) = y {
                    *x = Some(match *x {
                        None => y,
                        Some(s) => match arith(ArOp::Add, &Value::I64(s), &Value::I64(y), a.pos) {
                            Ok(Value::I64(r)) => r,
                            _ => return Err(err(a.pos, format!("i64 overflow in {}", a.label))),
                        },
                    })
                }
            }
            (St::SumF(x), St::SumF(y)) => {
                if let Some(y) = y {
                    *x = Some(x.unwrap_or(0.0) + y)
                }
            }
            (St::AvgI(s, n), St::AvgI(t, m)) => {
                *s += t;
                *n += m;
            }
            (St::AvgF(s, n), St::AvgF(t, m)) => {
                *s += t;
                *n += m;
            }
            (St::Ext(x), St::Ext(y)) => {
                if !matches!(y, Value::Null) {
                    let want = if a.kind == Kind::Min { std::cmp::Ordering::Less } else { std::cmp::Ordering::Greater };
                    if matches!(x, Value::Null) || compare(&y, x) == Some(want) {
                        *x = y;
                    }
                }
            }
            _ => return Err(corrupt("aggregate states of different kinds")),
        }
        Ok(())
    }

    /// The aggregate's value.
    pub fn finish(self) -> Value {
        match self {
            St::Count(n) => Value::I64(n),
            St::SumI(s) => s.map_or(Value::Null, Value::I64),
            St::SumF(s) => s.map_or(Value::Null, Value::F64),
            St::AvgI(_, 0) | St::AvgF(_, 0) => Value::Null,
            St::AvgI(s, n) => Value::F64(s as f64 / n as f64),
            St::AvgF(s, n) => Value::F64(s / n as f64),
            St::Ext(v) => v,
        }
    }

    fn encode(&self, out: &mut Vec<u8>) {
        let opt = |out: &mut Vec<u8>, b: Option<u64>| match b {
            None => out.extend_from_slice(&[0; 9]),
            Some(b) => {
                out.push(1);
                out.extend_from_slice(&b.to_le_bytes());
            }
        };
        match self {
            St::Count(n) => out.extend_from_slice(&n.to_le_bytes()),
            St::SumI(s) => opt(out, s.map(|s| s as u64)),
            St::SumF(s) => opt(out, s.map(f64::to_bits)),
            St::AvgI(s, n) => {
                out.extend_from_slice(&s.to_le_bytes());
                out.extend_from_slice(&n.to_le_bytes());
            }
            St::AvgF(s, n) => {
                out.extend_from_slice(&s.to_bits().to_le_bytes());
                out.extend_from_slice(&n.to_le_bytes());
            }
            St::Ext(v) => encode_value(v, out),
        }
    }

    fn decode(k: Kind, b: &mut &[u8]) -> Result<St> {
        let mut take = |n: usize| -> Result<&[u8]> {
            if b.len() < n {
                return Err(corrupt("truncated aggregate state"));
            }
            let (h, t) = b.split_at(n);
            *b = t;
            Ok(h)
        };
        let w = |s: &[u8]| rd64(s, 0);
        Ok(match k {
            Kind::Count => St::Count(w(take(8)?) as i64),
            Kind::SumI => {
                let s = take(9)?;
                St::SumI((s[0] == 1).then(|| rd64(s, 1) as i64))
            }
            Kind::SumF => {
                let s = take(9)?;
                St::SumF((s[0] == 1).then(|| f64::from_bits(rd64(s, 1))))
            }
            Kind::AvgI => {
                let s = take(24)?;
                let mut a = [0u8; 16];
                a.copy_from_slice(&s[..16]);
                St::AvgI(i128::from_le_bytes(a), rd64(s, 16) as i64)
            }
            Kind::AvgF => {
                let s = take(16)?;
                St::AvgF(f64::from_bits(rd64(s, 0)), rd64(s, 8) as i64)
            }
            Kind::Min | Kind::Max => St::Ext(decode_value(b)?),
        })
    }
}

/// Encodes a list of partial aggregates.
pub fn encode_states(sts: &[St], out: &mut Vec<u8>) {
    for s in sts {
        s.encode(out);
    }
}

/// Decodes the partial aggregates of `kinds`.
pub fn decode_states(kinds: &[AggKind], mut b: &[u8]) -> Result<Vec<St>> {
    let mut v = Vec::with_capacity(kinds.len());
    for k in kinds {
        v.push(St::decode(k.kind, &mut b)?);
    }
    if !b.is_empty() {
        return Err(corrupt("aggregate state has trailing bytes"));
    }
    Ok(v)
}

/// Appends the final values of the encoded partial aggregates of `kinds` to `out` (what
/// [`decode_states`] and [`St::finish`] give, without a vector of states).
pub fn finish_states_into(kinds: &[AggKind], mut b: &[u8], out: &mut Vec<Value>) -> Result<()> {
    for k in kinds {
        out.push(St::decode(k.kind, &mut b)?.finish());
    }
    if !b.is_empty() {
        return Err(corrupt("aggregate state has trailing bytes"));
    }
    Ok(())
}

/// Merges the encoded partial states `inc` into the encoded states `cur`, the result
/// encoded into `out` (cleared first): one aggregate at a time, decoded, [`St::merge`]d
/// and encoded again, with no allocation for the fixed-size states (counts, sums,
/// averages). The same bytes and errors as [`decode_states`], merging and
/// [`encode_states`].
fn merge_encoded(kinds: &[AggKind], mut cur: &[u8], mut inc: &[u8], out: &mut Vec<u8>) -> Result<()> {
    out.clear();
    for k in kinds {
        let mut s = St::decode(k.kind, &mut cur)?;
        s.merge(St::decode(k.kind, &mut inc)?, k)?;
        s.encode(out);
    }
    if !cur.is_empty() || !inc.is_empty() {
        return Err(corrupt("aggregate state has trailing bytes"));
    }
    Ok(())
}

#[cfg(test)]
fn merge_all(into: &mut [St], from: Vec<St>, kinds: &[AggKind]) -> Result<()> {
    for ((s, o), k) in into.iter_mut().zip(from).zip(kinds) {
        s.merge(o, k)?;
    }
    Ok(())
}

/// Receives a table entry: hash, key bytes, state bytes; `false` stops.
type EntryFn<'f> = dyn FnMut(u64, &[u8], &[u8]) -> Result<bool> + 'f;

/// Receives a finished group: key bytes, aggregates; `false` stops.
pub type GroupFn<'f> = dyn FnMut(&[u8], Vec<St>) -> Result<bool> + 'f;

/// Receives a finished group: key bytes, encoded aggregates (see [`encode_states`]);
/// `false` stops.
pub(super) type EncodedFn<'f> = dyn FnMut(&[u8], &[u8]) -> Result<bool> + 'f;

/// Entry header: hash u64, next u32, key length u32, state length u32, state capacity u32.
const HDR: usize = 24;

/// Set in an entry's state capacity word once its state grew and the entry was copied to
/// the end: the walk in allocation order ([`AggTable::for_each`]) skips it.
const MOVED: u32 = 1 << 31;

/// Bytes of entries [`AggTable::for_each`] copies under one latch.
const FOR_EACH_BATCH: usize = 32 << 10;

/// How many groups ahead [`AggTable::upsert_batch`] prefetches: slots `3 * AHEAD` ahead,
/// the chains' first entries `2 * AHEAD` ahead, their second entries `AHEAD` ahead.
const AHEAD: usize = 8;

/// A group of a batch (see [`HashAgg::push_batch`]): its hash, and where its key (`klen`
/// bytes) and right after it its encoded partial states (`slen` bytes) lie in the batch's
/// buffer.
#[derive(Clone, Copy, Debug)]
pub struct BatchItem {
    pub hash: u64,
    pub at: usize,
    pub klen: usize,
    pub slen: usize,
}

impl BatchItem {
    fn key<'b>(&self, buf: &'b [u8]) -> &'b [u8] {
        &buf[self.at..self.at + self.klen]
    }

    fn states<'b>(&self, buf: &'b [u8]) -> &'b [u8] {
        &buf[self.at + self.klen..self.at + self.klen + self.slen]
    }
}

/// What [`Fill::upsert`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fit {
    /// Merged into its group, or a new group.
    Merged,
    /// Nothing changed: a new group without room.
    NoRoom,
    /// Nothing changed: the group's merged state (left in the scratch buffer) is larger
    /// than its entry and has no room.
    Outgrown,
}

/// The layout and fill of an [`AggTable`]'s page.
struct Fill {
    payload: usize,
    nslots: usize,
    bump: usize,
    groups: usize,
}

impl Fill {
    fn slot(&self, hash: u64) -> usize {
        (hash as usize) & (self.nslots - 1)
    }

    /// Merges `inc` into the group of `key` in the page's bytes `d` (see [`Fit`]).
    #[inline]
    fn upsert(&mut self, d: &mut [u8], key: &[u8], hash: u64, inc: &[u8], kinds: &[AggKind], scratch: &mut Vec<u8>) -> Result<Fit> {
        let slot = self.slot(hash);
        let mut link = slot * 4;
        let mut cur = rd32(d, link) as usize;
        while cur != 0 {
            let o = cur - 1;
            let klen = rd32(d, o + 12) as usize;
            if rd64(d, o) == hash && klen == key.len() && &d[o + HDR..o + HDR + klen] == key {
                let (slen, scap) = (rd32(d, o + 16) as usize, rd32(d, o + 20) as usize);
                let s0 = o + HDR + klen;
                merge_encoded(kinds, &d[s0..s0 + slen], inc, scratch)?;
                if scratch.len() <= scap {
                    d[s0..s0 + scratch.len()].copy_from_slice(scratch);
                    wr32(d, o + 16, scratch.len() as u32);
                    return Ok(Fit::Merged);
                }
                if s0 + scap == self.bump && s0 + scratch.len() <= self.payload {
                    // Grown, the last entry: it grows in place.
                    d[s0..s0 + scratch.len()].copy_from_slice(scratch);
                    wr32(d, o + 16, scratch.len() as u32);
                    wr32(d, o + 20, scratch.len() as u32);
                    self.bump = s0 + scratch.len();
                    return Ok(Fit::Merged);
                }
                // Grown (a longer min/max): a new copy at the end, linked in its place.
                let need = HDR + klen + scratch.len();
                if self.bump + need > self.payload {
                    return Ok(Fit::Outgrown);
                }
                let n = self.bump;
                d.copy_within(o..o + HDR + klen, n);
                wr32(d, n + 16, scratch.len() as u32);
                wr32(d, n + 20, scratch.len() as u32);
                d[n + HDR + klen..n + need].copy_from_slice(scratch);
                wr32(d, link, (n + 1) as u32);
                wr32(d, o + 20, scap as u32 | MOVED);
                self.bump += need;
                return Ok(Fit::Merged);
            }
            link = o + 8;
            cur = rd32(d, link) as usize;
        }
        let need = HDR + key.len() + inc.len();
        if self.bump + need > self.payload {
            return Ok(Fit::NoRoom);
        }
        let n = self.bump;
        wr64(d, n, hash);
        wr32(d, n + 8, rd32(d, slot * 4));
        wr32(d, n + 12, key.len() as u32);
        wr32(d, n + 16, inc.len() as u32);
        wr32(d, n + 20, inc.len() as u32);
        d[n + HDR..n + HDR + key.len()].copy_from_slice(key);
        d[n + HDR + key.len()..n + need].copy_from_slice(inc);
        wr32(d, slot * 4, (n + 1) as u32);
        self.bump += need;
        self.groups += 1;
        Ok(Fit::Merged)
    }
}

/// Prefetches the header (and the key's first bytes) of the entry at `cur` (offset + 1;
/// 0: none) of page bytes `d`.
#[inline(always)]
fn prefetch_entry(d: &[u8], cur: u32) {
    if cur != 0 {
        let p = d.as_ptr().wrapping_add(cur as usize - 1);
        crate::util::prefetch(p);
        crate::util::prefetch(p.wrapping_add(HDR + 16));
    }
}

/// The hash table of one aggregation level: one temporary page, not latched between calls.
struct AggTable<'a> {
    page: TempPage<'a>,
    fill: Fill,
}

impl<'a> AggTable<'a> {
    fn new(bm: &'a BufferManager, payload: usize) -> Result<AggTable<'a>> {
        let (page, g) = TempPage::alloc(bm, payload)?;
        let payload = g.data().len();
        drop(g);
        let nslots = pow2_floor((payload / 64) as u64) as usize;
        Ok(AggTable { page, fill: Fill { payload, nslots, bump: nslots * 4, groups: 0 } })
    }

    fn is_empty(&self) -> bool {
        self.fill.bump == self.fill.nslots * 4
    }

    /// Merges `inc` into the group of `key` (see [`Fit`]).
    fn upsert(&mut self, key: &[u8], hash: u64, inc: &[u8], kinds: &[AggKind], scratch: &mut Vec<u8>) -> Result<Fit> {
        let mut g = self.page.exclusive()?;
        let d = g.data_mut().ok_or_else(not_temp)?;
        self.fill.upsert(d, key, hash, inc, kinds, scratch)
    }

    /// [`upsert`](Self::upsert) of each group of `items` in order, under one latch, with
    /// the slots and chain entries of the groups a few places ahead prefetched: how many
    /// were merged before the first that found no room (all: `items.len()`).
    fn upsert_batch(&mut self, buf: &[u8], items: &[BatchItem], kinds: &[AggKind], scratch: &mut Vec<u8>) -> Result<usize> {
        let mut g = self.page.exclusive()?;
        let d = g.data_mut().ok_or_else(not_temp)?;
        let f = &mut self.fill;
        // Hints only: what they read may change before the group's turn (an insert ahead
        // of it), which costs a miss, never a wrong answer.
        for it in items.iter().take(3 * AHEAD) {
            crate::util::prefetch(d.as_ptr().wrapping_add(f.slot(it.hash) * 4));
        }
        for it in items.iter().take(2 * AHEAD) {
            prefetch_entry(d, rd32(d, f.slot(it.hash) * 4));
        }
        for (i, it) in items.iter().enumerate() {
            if let Some(a) = items.get(i + 3 * AHEAD) {
                crate::util::prefetch(d.as_ptr().wrapping_add(f.slot(a.hash) * 4));
            }
            if let Some(a) = items.get(i + 2 * AHEAD) {
                prefetch_entry(d, rd32(d, f.slot(a.hash) * 4));
            }
            if let Some(a) = items.get(i + AHEAD) {
                // The chain's second entry: the first's `next` word.
                let head = rd32(d, f.slot(a.hash) * 4) as usize;
                if let Some(next) = head.checked_sub(1).and_then(|o| d.get(o + 8..o + 12)) {
                    prefetch_entry(d, rd32(next, 0));
                }
            }
            if f.upsert(d, it.key(buf), it.hash, it.states(buf), kinds, scratch)? != Fit::Merged {
                return Ok(i);
            }
        }
        Ok(items.len())
    }

    /// Calls `f(hash, key, state)` for every group: in chain order (slot by slot) when
    /// `by_slot`, else in the order the entries were allocated (a sequential walk of the
    /// page).
    /// Entries are copied a batch at a time (up to [`FOR_EACH_BATCH`] bytes under one
    /// latch), then handed on with the page unlatched.
    fn for_each(&self, by_slot: bool, f: &mut EntryFn<'_>) -> Result<bool> {
        // (hash, key length, entry length) per entry of the batch; its bytes in `buf`.
        let (mut buf, mut ents) = (Vec::new(), Vec::new());
        let past = || corrupt("group entry past its page");
        // Where to resume: by slot, the slot and the chain's next entry (offset + 1; 0: the
        // slot's head); else the next entry's offset.
        let (mut slot, mut cur) = (0usize, 0usize);
        let mut at = self.fill.nslots * 4;
        let end = self.fill.bump;
        while if by_slot { slot < self.fill.nslots } else { at < end } {
            buf.clear();
            ents.clear();
            {
                let g = self.page.shared()?;
                let d = g.data();
                if by_slot {
                    while slot < self.fill.nslots && buf.len() < FOR_EACH_BATCH {
                        if cur == 0 {
                            cur = rd32(d, slot * 4) as usize;
                        }
                        while cur != 0 && buf.len() < FOR_EACH_BATCH {
                            let o = cur - 1;
                            if o + HDR > d.len() {
                                return Err(past());
                            }
                            let (klen, slen) = (rd32(d, o + 12) as usize, rd32(d, o + 16) as usize);
                            buf.extend_from_slice(d.get(o + HDR..o + HDR + klen + slen).ok_or_else(past)?);
                            ents.push((rd64(d, o), klen, klen + slen));
                            cur = rd32(d, o + 8) as usize;
                        }
                        if cur == 0 {
                            slot += 1;
                        }
                    }
                } else {
                    while at < end && buf.len() < FOR_EACH_BATCH {
                        let o = at;
                        if o + HDR > end.min(d.len()) {
                            return Err(past());
                        }
                        let (klen, slen, scap) = (rd32(d, o + 12) as usize, rd32(d, o + 16) as usize, rd32(d, o + 20));
                        at = o + HDR + klen + (scap & !MOVED) as usize;
                        if scap & MOVED == 0 {
                            buf.extend_from_slice(d.get(o + HDR..o + HDR + klen + slen).ok_or_else(past)?);
                            ents.push((rd64(d, o), klen, klen + slen));
                        }
                    }
                }
            }
            let mut at = 0;
            for &(hash, klen, len) in &ents {
                let e = &buf[at..at + len];
                at += len;
                if !f(hash, &e[..klen], &e[klen..])? {
                    return Ok(false);
                }
            }
        }
        Ok(true)
    }

    fn clear(&mut self) -> Result<()> {
        let mut g = self.page.exclusive()?;
        g.data_mut().ok_or_else(not_temp)?[..self.fill.nslots * 4].fill(0);
        self.fill.bump = self.fill.nslots * 4;
        self.fill.groups = 0;
        Ok(())
    }
}

/// A table payload with room for one entry of `bytes` (key and state) besides its slots
/// (a sixteenth of the payload, see [`AggTable::new`]).
fn room_for(bytes: usize) -> usize {
    (HDR + bytes + 64) * 17 / 16 + 64
}

/// Bits of the hash per level of partitioning.
const BITS: u32 = 4;

/// Partitions per level of partitioning.
pub const PARTITIONS: usize = 1 << BITS;

/// Partition records buffered per partition before they are copied into its run.
const PART_BUF: usize = 4 << 10;

/// Statistics of an aggregation (for tests and `EXPLAIN`-like reports).
#[derive(Clone, Copy, Debug, Default)]
pub struct AggStats {
    /// Times a full table was flushed to partitions.
    pub flushes: u64,
    /// Deepest level of partitioning reached.
    pub depth: u32,
    /// Groups written to partitions directly, past the table (see [`HashAgg::push`]).
    pub passed: u64,
    /// Groups taken as they are, without a table (see [`HashAgg::adopt`]).
    pub adopted: u64,
}

/// One level of hash aggregation (see the module documentation).
pub struct HashAgg<'a> {
    bm: &'a BufferManager,
    kinds: Vec<AggKind>,
    consumed: u32,
    /// How many aggregations of one parallel pipeline share the pool (1: this one alone):
    /// its table page takes that share of a table's, its partitions' tail pages at most
    /// that share of theirs (they are at least the smallest page, at most 64 KiB).
    share: usize,
    table: Option<AggTable<'a>>,
    parts: Vec<RowRun<'a>>,
    /// Per partition, records not yet copied into its run (empty between calls of `push`,
    /// `push_batch` and `flush`).
    part_bufs: Vec<Pending>,
    scratch: Vec<u8>,
    /// Groups merged into the table since it was last empty.
    pushes: u64,
    /// Groups still to write to the partitions directly (the table merged too few).
    pass: u64,
    /// Table flushes in a row that found too few merges.
    idle_flushes: u32,
    /// Groups known to be distinct from one another and from every other group of this
    /// aggregation (see [`adopt`](Self::adopt)), handed to [`finish`](Self::finish) as they are.
    distinct: Vec<Distinct<'a>>,
    pub stats: AggStats,
}

/// Finished groups in a run of temporary pages, each record the key's length (`u32`), the
/// key and the encoded states (also what a partition of a parallel merge gives,
/// [`super::merge`]): groups that an aggregation over input sorted by its key
/// emits when the key changes (see `super::vagg`). Once proven distinct from every other
/// group they are [`HashAgg::adopt`]ed (no hash table); otherwise
/// [`HashAgg::merge_in`] pushes them like any other group.
pub struct Distinct<'a> {
    run: RowRun<'a>,
    /// Records not yet in `run`.
    pend: Pending,
    rec: Vec<u8>,
    /// Groups pushed (in `run` or still in `pend`).
    groups: u64,
}

/// Bytes of records [`Distinct`] frames on the heap before copying them into its run.
const DISTINCT_BUF: usize = 64 << 10;

impl<'a> Distinct<'a> {
    pub fn new(bm: &'a BufferManager) -> Distinct<'a> {
        Distinct { run: RowRun::new(bm, super::rows::run_payload(bm)), pend: Pending::new(DISTINCT_BUF), rec: Vec::new(), groups: 0 }
    }

    /// Groups held.
    pub fn len(&self) -> u64 {
        self.groups
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Adds a group.
    pub fn push(&mut self, key: &[u8], states: &[St]) -> Result<()> {
        let mut rec = std::mem::take(&mut self.rec);
        rec.clear();
        encode_states(states, &mut rec);
        let r = self.push_encoded(key, &rec);
        self.rec = rec;
        r
    }

    /// Adds a group whose states are encoded (see [`encode_states`]).
    pub fn push_encoded(&mut self, key: &[u8], states: &[u8]) -> Result<()> {
        self.groups += 1;
        self.pend.push(&mut self.run, &[&(key.len() as u32).to_le_bytes(), key, states])
    }

    /// The run with every record in it.
    fn into_run(mut self) -> Result<RowRun<'a>> {
        self.pend.flush(&mut self.run)?;
        Ok(self.run)
    }
}

/// The key and the encoded states of a [`Distinct`] record (the key starting at `at + 4`).
fn distinct_record(rec: &[u8]) -> Result<(&[u8], &[u8])> {
    if rec.len() < 4 {
        return Err(corrupt("short distinct group record"));
    }
    let klen = rd32(rec, 0) as usize;
    if 4 + klen > rec.len() {
        return Err(corrupt("distinct group record key"));
    }
    Ok((&rec[4..4 + klen], &rec[4 + klen..]))
}

impl<'a> HashAgg<'a> {
    /// An aggregation of `kinds` (none: `DISTINCT`).
    pub fn new(bm: &'a BufferManager, kinds: Vec<AggKind>) -> HashAgg<'a> {
        Self::at(bm, kinds, 0, 1)
    }

    /// The partial aggregation of one of `workers` workers of a parallel pipeline: its
    /// table page takes a `workers`th of an aggregation's, its partition tails at most that
    /// (the workers' tables are all in use at once; at a full share each, sixteen of them
    /// would take twice a pool and evict one another's pages on every few pushes).
    pub fn worker(bm: &'a BufferManager, kinds: Vec<AggKind>, workers: usize) -> HashAgg<'a> {
        Self::at(bm, kinds, 0, workers)
    }

    /// An aggregation of groups whose hashes share their first `consumed` bits, one of
    /// `share` that use the pool at once.
    fn at(bm: &'a BufferManager, kinds: Vec<AggKind>, consumed: u32, share: usize) -> HashAgg<'a> {
        HashAgg {
            bm,
            kinds,
            consumed,
            share: share.max(1),
            table: None,
            parts: Vec::new(),
            part_bufs: Vec::new(),
            scratch: Vec::new(),
            pushes: 0,
            pass: 0,
            idle_flushes: 0,
            distinct: Vec::new(),
            stats: AggStats::default(),
        }
    }

    /// The buffer manager whose pages it uses.
    pub fn buffer(&self) -> &'a BufferManager {
        self.bm
    }

    /// What it aggregates.
    pub fn kinds(&self) -> &[AggKind] {
        &self.kinds
    }

    /// Takes the groups of `d` as they are: the caller has proven that no two of them, and
    /// none of them and any group pushed before or after, share a key. [`finish`](Self::finish)
    /// hands them on after the others.
    pub fn adopt(&mut self, d: Distinct<'a>) -> Result<()> {
        self.stats.adopted += d.len();
        self.distinct.push(d);
        Ok(())
    }

    /// Pushes every group of `d` (see [`push_batch`](Self::push_batch)), a page of them at a time.
    pub fn merge_in(&mut self, d: Distinct<'_>) -> Result<()> {
        let mut items = Vec::new();
        d.into_run()?.drain_pages(&mut |recs| {
            items.clear();
            for rec in records(recs) {
                let (at, rec) = rec?;
                let (key, st) = distinct_record(rec)?;
                items.push(BatchItem { hash: hash_bytes(key), at: at + 4, klen: key.len(), slen: st.len() });
            }
            self.push_batch(recs, &items)
        })
    }

    /// Adds the partial aggregate `states` (encoded, see [`encode_states`]) to the group of
    /// `key` (whose hash is `hash`).
    ///
    /// After a flush of a table whose groups nearly all came once (fewer pushes merged into
    /// a group already there than an eighth of its groups), the groups of the next pushes
    /// (four tables' worth, twice as many after each such flush in a row, up to 64) go to
    /// the partitions directly: merging them in the table would only have delayed the
    /// same records.
    pub fn push(&mut self, key: &[u8], hash: u64, states: &[u8]) -> Result<()> {
        self.push_one(key, hash, states)?;
        self.spill_part_bufs()
    }

    fn push_one(&mut self, key: &[u8], hash: u64, states: &[u8]) -> Result<()> {
        loop {
            if self.pass > 0 {
                self.pass -= 1;
                self.stats.passed += 1;
                return self.part_record(hash, key, states);
            }
            if self.table.is_none() {
                self.table = Some(AggTable::new(self.bm, work_share(self.bm, self.share).max(room_for(key.len() + states.len())))?);
            }
            let t = self.table.as_mut().ok_or_else(|| corrupt("no table"))?;
            let fit = t.upsert(key, hash, states, &self.kinds, &mut self.scratch)?;
            if fit == Fit::Merged {
                self.pushes += 1;
                return Ok(());
            }
            if fit == Fit::Outgrown && t.fill.groups == 1 {
                // The table's one group outgrew it: a larger table with its merged state
                // (flushing it would only move the same merge a level down).
                let merged = std::mem::take(&mut self.scratch);
                self.table = None;
                let want = room_for(2 * (key.len() + merged.len()));
                let one = room_for(key.len() + merged.len());
                let mut t = match AggTable::new(self.bm, want) {
                    Ok(t) => t,
                    Err(_) => AggTable::new(self.bm, one)?,
                };
                let fit = t.upsert(key, hash, &merged, &self.kinds, &mut self.scratch)?;
                self.table = Some(t);
                if fit != Fit::Merged {
                    return Err(corrupt("a group does not fit a table made for it"));
                }
                self.pushes += 1;
                return Ok(());
            }
            if t.is_empty() {
                // One group larger than the page: a larger page.
                self.table = None;
                // (its state may grow: twice the room, if the pool has it)
                let want = room_for(2 * (key.len() + states.len()));
                let one = room_for(key.len() + states.len());
                self.table = Some(match AggTable::new(self.bm, want) {
                    Ok(t) => t,
                    Err(_) => AggTable::new(self.bm, one)?,
                });
                continue;
            }
            self.flush()?;
        }
    }

    /// [`push`](Self::push) of each group of `items` in order (keys and states in `buf`),
    /// the table's page latched once for many of them.
    pub fn push_batch(&mut self, buf: &[u8], items: &[BatchItem]) -> Result<()> {
        let mut i = 0;
        while i < items.len() {
            let done = match self.table.as_mut() {
                Some(t) if self.pass == 0 => t.upsert_batch(buf, &items[i..], &self.kinds, &mut self.scratch)?,
                _ => 0,
            };
            self.pushes += done as u64;
            i += done;
            // The first group without room (or all while passing them on), one at a time.
            while let Some(it) = items.get(i) {
                self.push_one(it.key(buf), it.hash, it.states(buf))?;
                i += 1;
                if self.pass == 0 {
                    break;
                }
            }
        }
        self.spill_part_bufs()
    }

    /// Appends the record of a group to its partition's buffer, copying the buffer into
    /// the partition's run when full.
    fn part_record(&mut self, hash: u64, key: &[u8], st: &[u8]) -> Result<()> {
        let p = (shifted(hash, self.consumed) >> (64 - BITS)) as usize;
        self.part_bufs[p].push(&mut self.parts[p], &[&hash.to_le_bytes(), &(key.len() as u32).to_le_bytes(), key, st])
    }

    /// Copies the partitions' buffered records into their runs.
    fn spill_part_bufs(&mut self) -> Result<()> {
        for (b, run) in self.part_bufs.iter_mut().zip(&mut self.parts) {
            b.flush(run)?;
        }
        Ok(())
    }

    /// Moves every group of the table into the partitions and empties it: the table is
    /// full, or the aggregation ends after it spilled (counted as a spill).
    fn flush(&mut self) -> Result<()> {
        self.stats.flushes += 1;
        super::counters::AGG_FLUSHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.move_to_partitions()
    }

    /// Moves every group of the table into the partitions (made if there are none yet) and
    /// empties it.
    fn move_to_partitions(&mut self) -> Result<()> {
        if self.consumed + BITS > 64 {
            return Err(Error::Inconsistent("hash aggregation: more groups with one 64-bit hash than a table holds".into()));
        }
        if self.parts.is_empty() {
            let payload = part_payload(self.bm, (1 << BITS) * self.share);
            self.parts = (0..1 << BITS).map(|_| RowRun::new(self.bm, payload)).collect();
            self.part_bufs = (0..1 << BITS).map(|_| Pending::new(PART_BUF)).collect();
        }
        // (Taken out of `self` while its groups go to the partitions through `self`.)
        let Some(mut t) = self.table.take() else { return Ok(()) };
        let groups = t.fill.groups as u64;
        let r = t.for_each(false, &mut |hash, key, st| self.part_record(hash, key, st).map(|_| true)).and_then(|_| self.spill_part_bufs());
        let r = r.and_then(|_| t.clear());
        self.table = Some(t);
        r?;
        if self.pushes < groups + groups / 8 {
            self.pass = groups.saturating_mul(4) << self.idle_flushes.min(4);
            self.idle_flushes += 1;
        } else {
            self.idle_flushes = 0;
        }
        self.pushes = 0;
        Ok(())
    }

    /// Hands every group to `f` (key bytes, its aggregates); `f` returns `false` to stop.
    /// Returns `false` if stopped.
    pub fn finish(self, f: &mut GroupFn<'_>) -> Result<bool> {
        self.finish_with_stats(f).map(|(go, _)| go)
    }

    /// [`finish`](Self::finish), also returning how much it spilled.
    pub fn finish_with_stats(mut self, f: &mut GroupFn<'_>) -> Result<(bool, AggStats)> {
        let go = self.finish_inner(f)?;
        Ok((go, self.stats))
    }

    fn finish_inner(&mut self, f: &mut GroupFn<'_>) -> Result<bool> {
        let kinds = self.kinds.clone();
        self.finish_encoded(&mut |key, st| f(key, decode_states(&kinds, st)?))
    }

    /// [`finish_inner`](Self::finish_inner) with the states as they are encoded.
    pub(super) fn finish_encoded(&mut self, f: &mut EncodedFn<'_>) -> Result<bool> {
        if !self.finish_hashed(f)? {
            return Ok(false);
        }
        for d in std::mem::take(&mut self.distinct) {
            let mut go = true;
            d.into_run()?.drain(&mut |rec| {
                if go {
                    let (key, st) = distinct_record(rec)?;
                    go = f(key, st)?;
                }
                Ok(())
            })?;
            if !go {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// [`finish_encoded`](Self::finish_encoded) of the groups pushed (not those adopted).
    fn finish_hashed(&mut self, f: &mut EncodedFn<'_>) -> Result<bool> {
        if self.parts.is_empty() {
            return match self.table.take() {
                None => Ok(true),
                // By slot at the top level (the order of earlier versions for an aggregation that
                // does not spill), else in allocation order (a sequential walk).
                Some(t) => t.for_each(self.consumed == 0, &mut |_, key, st| f(key, st)),
            };
        }
        self.flush()?;
        for run in self.take_partitions() {
            // (With this one's share: partition aggregations of a parallel merge run at once.)
            let mut sub = HashAgg::at(self.bm, self.kinds.clone(), self.consumed + BITS, self.share);
            sub.push_partition(run)?;
            let go = sub.finish_encoded(f)?;
            self.stats.flushes += sub.stats.flushes;
            self.stats.passed += sub.stats.passed;
            self.stats.depth = self.stats.depth.max(sub.stats.depth + 1);
            if !go {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// The groups pushed so far, moved into partitions (the table's too, and the
    /// partitions made if there were none): [`PARTITIONS`] runs of `(hash, key, encoded
    /// states)` records, the `p`th with the groups whose hash has `p` in the 4 bits after
    /// the `consumed` ones. A group may be in its partition several times, its partial
    /// states in the order they were pushed. Groups adopted are not included. For the
    /// merge of the workers of a parallel aggregation ([`super::merge`]), which is no
    /// spill: not counted as a flush.
    pub(super) fn into_partitions(mut self) -> Result<Vec<RowRun<'a>>> {
        debug_assert!(self.distinct.is_empty(), "adopted groups are not partitioned");
        self.move_to_partitions()?;
        Ok(self.take_partitions())
    }

    /// The partitions, after the table's last flush into them (none left here).
    fn take_partitions(&mut self) -> Vec<RowRun<'a>> {
        self.table = None;
        std::mem::take(&mut self.parts)
    }

    /// An aggregation of the groups of one partition (see
    /// [`into_partitions`](Self::into_partitions)), one of `workers` that run at once (its
    /// table and partition tails take that share, see [`worker`](Self::worker)).
    pub(super) fn of_partition(bm: &'a BufferManager, kinds: Vec<AggKind>, workers: usize) -> HashAgg<'a> {
        Self::at(bm, kinds, BITS, workers)
    }

    /// Pushes every record of a partition run (see [`into_partitions`](Self::into_partitions))
    /// into this aggregation, a page of them as one batch.
    pub(super) fn push_partition(&mut self, run: RowRun<'_>) -> Result<()> {
        let mut items = Vec::new();
        run.drain_pages(&mut |recs| {
            items.clear();
            for rec in records(recs) {
                let (at, rec) = rec?;
                if rec.len() < 12 {
                    return Err(corrupt("short partition record"));
                }
                let klen = rd32(rec, 8) as usize;
                if 12 + klen > rec.len() {
                    return Err(corrupt("partition record key"));
                }
                items.push(BatchItem { hash: rd64(rec, 0), at: at + 12, klen, slen: rec.len() - 12 - klen });
            }
            self.push_batch(recs, &items)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sql::rows::decode_row;
    use crate::Config;
    use std::collections::BTreeMap;

    /// Merging encoded states gives the bytes (and the errors) of decoding, merging and
    /// encoding again.
    #[test]
    fn encoded_states_merge_as_decoded_states_do() {
        let kind = |k: Kind| AggKind { kind: k, pos: None, label: format!("{k:?}") };
        let kinds: Vec<AggKind> = [Kind::Count, Kind::SumI, Kind::SumF, Kind::AvgI, Kind::AvgF].into_iter().map(kind).collect();
        let mut r = crate::util::SplitMix64(5);
        let state = |r: &mut crate::util::SplitMix64| -> Vec<St> {
            let f = |r: &mut crate::util::SplitMix64| match r.below(4) {
                0 => -0.0,
                1 => 0.5,
                _ => r.below(1000) as f64 / 7.0 - 50.0,
            };
            let i = |r: &mut crate::util::SplitMix64| match r.below(8) {
                0 => i64::MAX - 3,
                1 => i64::MIN + 3,
                _ => r.below(1000) as i64 - 500,
            };
            vec![
                St::Count(r.below(100) as i64),
                St::SumI((r.below(3) != 0).then(|| i(r))),
                St::SumF((r.below(3) != 0).then(|| f(r))),
                St::AvgI(i128::from(i(r)) * 3, r.below(9) as i64),
                St::AvgF(f(r), r.below(9) as i64),
            ]
        };
        let (mut errors, mut merged) = (0, 0);
        for _ in 0..2000 {
            let (a, b) = (state(&mut r), state(&mut r));
            let (mut da, mut db) = (Vec::new(), Vec::new());
            encode_states(&a, &mut da);
            encode_states(&b, &mut db);
            let mut want = decode_states(&kinds, &da).unwrap();
            let want = merge_all(&mut want, decode_states(&kinds, &db).unwrap(), &kinds).map(|_| {
                let mut w = Vec::new();
                encode_states(&want, &mut w);
                w
            });
            let mut got = Vec::new();
            match (merge_encoded(&kinds, &da, &db, &mut got), want) {
                (Ok(()), Ok(w)) => {
                    assert_eq!(got, w, "{a:?} + {b:?}");
                    merged += 1;
                }
                (Err(e), Err(w)) => {
                    assert_eq!(e.to_string(), w.to_string());
                    errors += 1;
                }
                (g, w) => panic!("{a:?} + {b:?}: {g:?} vs {w:?}"),
            }
        }
        assert!(errors > 0 && merged > 1000, "{errors} errors, {merged} merged");
        // Min and max (variable-size states, here strings) merge the same way.
        let mm = [kind(Kind::Count), kind(Kind::Max)];
        let (mut d1, mut d2, mut got) = (Vec::new(), Vec::new(), Vec::new());
        encode_states(&[St::Count(1), St::Ext(Value::Str("abc".into()))], &mut d1);
        encode_states(&[St::Count(2), St::Ext(Value::Str("abd".into()))], &mut d2);
        merge_encoded(&mm, &d1, &d2, &mut got).unwrap();
        let mut want = Vec::new();
        encode_states(&[St::Count(3), St::Ext(Value::Str("abd".into()))], &mut want);
        assert_eq!(got, want);
        // Trailing bytes are an error.
        d2.push(0);
        assert!(merge_encoded(&mm, &d1, &d2, &mut got).is_err());
    }

    #[test]
    fn groups_spill_and_match_a_map() {
        let dir = tempfile::tempdir().unwrap();
        let bm = BufferManager::create(Config::new(dir.path().join("db")).min_page(4096).pool_size(256 << 10)).unwrap();
        let kinds = vec![
            AggKind { kind: Kind::Count, pos: None, label: "c".into() },
            AggKind { kind: Kind::SumI, pos: None, label: "s".into() },
            AggKind { kind: Kind::Max, pos: None, label: "m".into() },
        ];
        let mut agg = HashAgg::new(&bm, kinds.clone());
        let mut want: BTreeMap<String, (i64, i64, String)> = BTreeMap::new();
        let mut r = crate::util::SplitMix64(3);
        let (mut kb, mut sb) = (Vec::new(), Vec::new());
        for i in 0..40_000i64 {
            let k = format!("k{}{}", r.below(30_000), "x".repeat(r.below(30) as usize));
            let m = "m".repeat(r.below(20) as usize);
            kb.clear();
            encode_value(&Value::Str(k.clone()), &mut kb);
            sb.clear();
            encode_states(&[St::one(Kind::Count, Value::I64(1)), St::one(Kind::SumI, Value::I64(i)), St::one(Kind::Max, Value::Str(m.clone()))], &mut sb);
            agg.push(&kb, hash_bytes(&kb), &sb).unwrap();
            let e = want.entry(k).or_insert((0, 0, String::new()));
            e.0 += 1;
            e.1 += i;
            e.2 = e.2.clone().max(m);
        }
        assert!(agg.stats.flushes > 0);
        let mut got = BTreeMap::new();
        let (_, stats) = agg
            .finish_with_stats(&mut |k, st| {
                let k = match decode_row(k).unwrap().remove(0) {
                    Value::Str(s) => s,
                    _ => panic!(),
                };
                let v: Vec<Value> = st.into_iter().map(St::finish).collect();
                let (Value::I64(c), Value::I64(s), Value::Str(m)) = (&v[0], &v[1], &v[2]) else { panic!("{v:?}") };
                assert!(got.insert(k, (*c, *s, m.clone())).is_none(), "a group came out twice");
                Ok(true)
            })
            .unwrap();
        assert!(stats.depth >= 2, "partitions of partitions: {stats:?}");
        assert_eq!(got, want);
        assert_eq!(crate::testutil::temp_pages(&bm), 0);
    }

    /// Sixteen workers' partial aggregations in use at once (pushed in turn, as the workers
    /// of a parallel pipeline push), each over the same many groups: their tables and
    /// partition tails share the pool, so they do not evict one another's pages (hardly
    /// anything is read back while they are filled; at a full share each, sixteen tables of
    /// an eighth of the pool evict one another at every turn), and merged in worker order
    /// they give every group's totals.
    #[test]
    fn worker_aggregations_share_the_pool() {
        let dir = tempfile::tempdir().unwrap();
        let bm = BufferManager::create(Config::new(dir.path().join("db")).min_page(4096).pool_size(4 << 20)).unwrap();
        let kinds = vec![AggKind { kind: Kind::Count, pos: None, label: "c".into() }, AggKind { kind: Kind::SumI, pos: None, label: "s".into() }];
        let workers = 16;
        let mut parts: Vec<HashAgg<'_>> = (0..workers).map(|_| HashAgg::worker(&bm, kinds.clone(), workers)).collect();
        let mut want: BTreeMap<i64, (i64, i64)> = BTreeMap::new();
        let mut r = crate::util::SplitMix64(11);
        let (mut kb, mut sb) = (Vec::new(), Vec::new());
        let before = bm.stats().pages_read;
        for turn in 0..200 {
            for (w, part) in parts.iter_mut().enumerate() {
                for i in 0..100i64 {
                    let k = r.below(20_000) as i64;
                    let v = turn * 1000 + i + w as i64;
                    kb.clear();
                    encode_value(&Value::I64(k), &mut kb);
                    sb.clear();
                    encode_states(&[St::one(Kind::Count, Value::I64(1)), St::one(Kind::SumI, Value::I64(v))], &mut sb);
                    part.push(&kb, hash_bytes(&kb), &sb).unwrap();
                    let e = want.entry(k).or_insert((0, 0));
                    e.0 += 1;
                    e.1 += v;
                }
            }
        }
        assert!(parts.iter().all(|p| p.stats.flushes > 0), "every worker's table filled");
        // (a few partition tails are evicted before they fill and read back: 30 reads for
        // 2566 evictions here; at a full share each, 3093 for 3358)
        let st = bm.stats();
        assert!((st.pages_read - before) * 10 < st.evictions, "the workers evicted one another's pages: {st:?}");
        let mut main = HashAgg::new(&bm, kinds.clone());
        for part in parts {
            part.finish(&mut |k, st| {
                sb.clear();
                encode_states(&st, &mut sb);
                main.push(k, hash_bytes(k), &sb)?;
                Ok(true)
            })
            .unwrap();
        }
        let mut got = BTreeMap::new();
        main.finish(&mut |k, st| {
            let Value::I64(k) = decode_row(k).unwrap().remove(0) else { panic!() };
            let v: Vec<Value> = st.into_iter().map(St::finish).collect();
            let (Value::I64(c), Value::I64(s)) = (&v[0], &v[1]) else { panic!("{v:?}") };
            assert!(got.insert(k, (*c, *s)).is_none(), "a group came out twice");
            Ok(true)
        })
        .unwrap();
        assert_eq!(got, want);
        assert_eq!(crate::testutil::temp_pages(&bm), 0);
    }

    /// Batches through a 1 MiB pool: unique keys in order (the table merges nothing, so
    /// groups pass it by), then keys that repeat (in one batch too, side by side), string
    /// minima and maxima that grow (one group's beyond the table's page), NULL arguments,
    /// and single pushes in between, against states merged in a map.
    #[test]
    fn batches_spill_and_match_a_map() {
        let dir = tempfile::tempdir().unwrap();
        let bm = BufferManager::create(Config::new(dir.path().join("db")).min_page(4096).pool_size(1 << 20)).unwrap();
        let kinds: Vec<AggKind> = [Kind::Count, Kind::SumI, Kind::SumF, Kind::AvgI, Kind::Min, Kind::Max]
            .into_iter()
            .map(|k| AggKind { kind: k, pos: None, label: format!("{k:?}") })
            .collect();
        let mut agg = HashAgg::new(&bm, kinds.clone());
        let mut want: BTreeMap<Vec<u8>, Vec<St>> = BTreeMap::new();
        let mut r = crate::util::SplitMix64(11);
        let (mut buf, mut items, mut kb) = (Vec::new(), Vec::new(), Vec::new());
        // One row of key `k`: its states, also merged into `want`.
        let mut row = |r: &mut crate::util::SplitMix64, k: i64, big: bool, kb: &mut Vec<u8>| -> Vec<St> {
            kb.clear();
            encode_value(&Value::I64(k), kb);
            let null = r.below(5) == 0;
            let v = |x: Value| if null { Value::Null } else { x };
            let s = if big {
                // Grows by 10 KiB a row, past the 128 KiB table page.
                let n = want.get(&kb[..]).map_or(0, |w| match &w[5] {
                    St::Ext(Value::Str(s)) => s.len(),
                    _ => 0,
                });
                "z".repeat(n + (10 << 10))
            } else {
                format!("s{}", "y".repeat(r.below(40) as usize))
            };
            let sts = vec![
                St::one(Kind::Count, v(Value::I64(1))),
                St::one(Kind::SumI, v(Value::I64(r.below(1000) as i64 - 500))),
                St::one(Kind::SumF, v(Value::F64(r.below(100) as f64))),
                St::one(Kind::AvgI, v(Value::I64(r.below(100) as i64))),
                St::one(Kind::Min, v(Value::Str(s.clone()))),
                St::one(Kind::Max, v(Value::Str(s))),
            ];
            let e = want.entry(kb.clone()).or_insert_with(|| kinds.iter().map(|k| St::empty(k.kind)).collect());
            for ((w, s), k) in e.iter_mut().zip(sts.clone()).zip(&kinds) {
                w.merge(s, k).unwrap();
            }
            sts
        };
        let batch = |agg: &mut HashAgg<'_>, buf: &mut Vec<u8>, items: &mut Vec<BatchItem>| {
            agg.push_batch(buf, items).unwrap();
            buf.clear();
            items.clear();
        };
        let add = |buf: &mut Vec<u8>, items: &mut Vec<BatchItem>, kb: &[u8], sts: &[St], hash: u64| {
            let at = buf.len();
            buf.extend_from_slice(kb);
            encode_states(sts, buf);
            items.push(BatchItem { hash, at, klen: kb.len(), slen: buf.len() - at - kb.len() });
        };
        // Unique keys in order, a few twice in a row.
        for k in 0..60_000 {
            for _ in 0..1 + (k % 50 == 0) as usize {
                let sts = row(&mut r, k, false, &mut kb);
                add(&mut buf, &mut items, &kb, &sts, hash_bytes(&kb));
            }
            if items.len() > r.below(600) as usize {
                batch(&mut agg, &mut buf, &mut items);
            }
        }
        batch(&mut agg, &mut buf, &mut items);
        assert!(agg.stats.passed > 0, "{:?}", agg.stats);
        // Repeating keys, some the first phase's, and the big group.
        for i in 0..40_000 {
            let k = 50_000 + r.below(20_000) as i64;
            let sts = row(&mut r, k, false, &mut kb);
            if i % 10 == 3 {
                agg.push(&kb, hash_bytes(&kb), &encode(&sts)).unwrap();
                continue;
            }
            add(&mut buf, &mut items, &kb, &sts, hash_bytes(&kb));
            if i % 1500 == 0 {
                let sts = row(&mut r, -1, true, &mut kb);
                add(&mut buf, &mut items, &kb, &sts, hash_bytes(&kb));
            }
            if items.len() > r.below(600) as usize {
                batch(&mut agg, &mut buf, &mut items);
            }
        }
        batch(&mut agg, &mut buf, &mut items);
        kb.clear();
        encode_value(&Value::I64(-1), &mut kb);
        assert!(matches!(&want[&kb][5], St::Ext(Value::Str(s)) if s.len() > crate::sql::rows::work_payload(&bm)), "the big group outgrows a table page");
        let mut got = BTreeMap::new();
        let (_, stats) = agg
            .finish_with_stats(&mut |k, st| {
                assert!(got.insert(k.to_vec(), st).is_none(), "a group came out twice");
                Ok(true)
            })
            .unwrap();
        assert!(stats.flushes > 0 && stats.passed > 0, "{stats:?}");
        let fin = |m: BTreeMap<Vec<u8>, Vec<St>>| -> Vec<(Vec<u8>, Vec<Value>)> {
            m.into_iter().map(|(k, s)| (k, s.into_iter().map(St::finish).collect())).collect()
        };
        let (got, want) = (fin(got), fin(want));
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(&want) {
            assert!(g == w, "{:?} vs {:?}", g.0, w.0);
        }
        assert_eq!(crate::testutil::temp_pages(&bm), 0);
    }

    fn encode(sts: &[St]) -> Vec<u8> {
        let mut b = Vec::new();
        encode_states(sts, &mut b);
        b
    }
}
