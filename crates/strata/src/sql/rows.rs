//! Rows as bytes, and runs of them in temporary pages: the state of the SQL operators that
//! may outgrow memory (hash aggregation, sort, hash join) lives in these, inside the pool.
//!
//! * [`encode_value`] / [`decode_row`]: a value is a tag byte and its payload; a row is its
//!   values one after the other. Floats are canonical (`-0.0` is `0.0`, one NaN), so that
//!   two keys are equal in SQL (`GROUP BY`, `DISTINCT`, join keys) exactly when their bytes
//!   are.
//! * [`encode_sort_key`]: an order-preserving encoding (memcmp order is the SQL order,
//!   `DESC` and the place of NULLs included).
//! * [`RowRun`]: variable-size records appended to temporary pages; no page stays latched
//!   between calls, so any number of runs coexist in a small pool (unlatched pages are
//!   evicted to the scratch file and read back when needed). A record larger than the run's
//!   pages gets a page of its own of the size it needs.

use crate::access::table::Value;
use crate::buffer::BufferManager;
use crate::error::{Error, Result};
use crate::ops::spill::hash64;
use crate::storage::{PageId, PAGE_HEADER_SIZE};

const T_NULL: u8 = 0;
pub(crate) const T_I64: u8 = 1;
const T_F64: u8 = 2;
pub(crate) const T_DATE: u8 = 3;
const T_FALSE: u8 = 4;
const T_TRUE: u8 = 5;
const T_STR: u8 = 6;
const T_BYTES: u8 = 7;

pub(crate) fn corrupt(what: &str) -> Error {
    Error::Inconsistent(format!("SQL operator state: {what}"))
}

fn canon(f: f64) -> f64 {
    if f == 0.0 {
        0.0
    } else if f.is_nan() {
        f64::NAN
    } else {
        f
    }
}

/// A value borrowed from where it is stored (a leaf's bytes), for encoding without
/// building a [`Value`].
#[derive(Clone, Copy, Debug)]
pub(crate) enum ValueRef<'a> {
    Null,
    I64(i64),
    F64(f64),
    Date(i32),
    Bool(bool),
    Str(&'a str),
    Bytes(&'a [u8]),
}

/// Appends `v`'s encoding to `out`.
pub fn encode_value(v: &Value, out: &mut Vec<u8>) {
    encode_ref(
        match v {
            Value::Null => ValueRef::Null,
            Value::I64(i) => ValueRef::I64(*i),
            Value::F64(f) => ValueRef::F64(*f),
            Value::Date(d) => ValueRef::Date(*d),
            Value::Bool(b) => ValueRef::Bool(*b),
            Value::Str(s) => ValueRef::Str(s),
            Value::Bytes(b) => ValueRef::Bytes(b),
        },
        out,
    )
}

/// The encoding of an `i64` value, as an array (for keys built on the stack).
#[inline]
pub(crate) fn i64_code(i: i64) -> [u8; 9] {
    let mut b = [T_I64; 9];
    b[1..].copy_from_slice(&i.to_le_bytes());
    b
}

/// The encoding of a double, as an array.
#[inline]
pub(crate) fn f64_code(f: f64) -> [u8; 9] {
    let mut b = [T_F64; 9];
    b[1..].copy_from_slice(&canon(f).to_bits().to_le_bytes());
    b
}

/// The encoding of a date, as an array.
#[inline]
pub(crate) fn date_code(d: i32) -> [u8; 5] {
    let mut b = [T_DATE; 5];
    b[1..].copy_from_slice(&d.to_le_bytes());
    b
}

/// Appends the encoding of `v` (the same bytes as [`encode_value`] of the owned value).
#[inline]
pub(crate) fn encode_ref(v: ValueRef<'_>, out: &mut Vec<u8>) {
    match v {
        ValueRef::Null => out.push(T_NULL),
        ValueRef::I64(i) => out.extend_from_slice(&i64_code(i)),
        ValueRef::F64(f) => out.extend_from_slice(&f64_code(f)),
        ValueRef::Date(d) => out.extend_from_slice(&date_code(d)),
        ValueRef::Bool(b) => out.push(if b { T_TRUE } else { T_FALSE }),
        ValueRef::Str(s) => encode_str_bytes(s.as_bytes(), out),
        ValueRef::Bytes(b) => {
            out.push(T_BYTES);
            out.extend_from_slice(&(b.len() as u32).to_le_bytes());
            out.extend_from_slice(b);
        }
    }
}

/// Appends the encoding of a string given as its bytes, as [`encode_ref`] of the string
/// (bytes that are not UTF-8 are caught where the encoding is decoded).
#[inline]
pub(crate) fn encode_str_bytes(b: &[u8], out: &mut Vec<u8>) {
    out.push(T_STR);
    out.extend_from_slice(&(b.len() as u32).to_le_bytes());
    out.extend_from_slice(b);
}

/// Appends the encoding of every value of `row`.
pub fn encode_row(row: &[Value], out: &mut Vec<u8>) {
    for v in row {
        encode_value(v, out);
    }
}

fn take<'b>(b: &mut &'b [u8], n: usize) -> Result<&'b [u8]> {
    if b.len() < n {
        return Err(corrupt("truncated value"));
    }
    let (h, t) = b.split_at(n);
    *b = t;
    Ok(h)
}

/// Decodes one value from the front of `b`, advancing it.
pub fn decode_value(b: &mut &[u8]) -> Result<Value> {
    let tag = take(b, 1)?[0];
    let arr8 = |s: &[u8]| {
        let mut a = [0u8; 8];
        a.copy_from_slice(s);
        a
    };
    Ok(match tag {
        T_NULL => Value::Null,
        T_I64 => Value::I64(i64::from_le_bytes(arr8(take(b, 8)?))),
        T_F64 => Value::F64(f64::from_bits(u64::from_le_bytes(arr8(take(b, 8)?)))),
        T_DATE => {
            let s = take(b, 4)?;
            Value::Date(i32::from_le_bytes([s[0], s[1], s[2], s[3]]))
        }
        T_FALSE => Value::Bool(false),
        T_TRUE => Value::Bool(true),
        T_STR | T_BYTES => {
            let s = take(b, 4)?;
            let n = u32::from_le_bytes([s[0], s[1], s[2], s[3]]) as usize;
            let data = take(b, n)?;
            if tag == T_STR {
                Value::Str(String::from_utf8(data.to_vec()).map_err(|_| corrupt("string is not UTF-8"))?)
            } else {
                Value::Bytes(data.to_vec())
            }
        }
        _ => return Err(corrupt("unknown value tag")),
    })
}

/// Decodes one value from the front of `b` into `slot`, advancing `b`; a string or byte
/// string reuses the buffer `slot` already holds (no allocation once it is large enough).
pub fn decode_value_into(slot: &mut Value, b: &mut &[u8]) -> Result<()> {
    let tag = *b.first().ok_or_else(|| corrupt("truncated value"))?;
    if tag != T_STR && tag != T_BYTES {
        *slot = decode_value(b)?;
        return Ok(());
    }
    *b = &b[1..];
    let s = take(b, 4)?;
    let n = u32::from_le_bytes([s[0], s[1], s[2], s[3]]) as usize;
    let data = take(b, n)?;
    if tag == T_STR {
        slot.set_str(std::str::from_utf8(data).map_err(|_| corrupt("string is not UTF-8"))?);
    } else {
        slot.set_bytes(data);
    }
    Ok(())
}

/// Sets `slot` to a copy of `v`, reusing the string or byte buffer `slot` already holds.
pub fn assign(slot: &mut Value, v: &Value) {
    match (slot, v) {
        (Value::Str(a), Value::Str(b)) => a.clone_from(b),
        (Value::Bytes(a), Value::Bytes(b)) => a.clone_from(b),
        (slot, v) => *slot = v.clone(),
    }
}

/// Decodes all values of `b`.
pub fn decode_row(b: &[u8]) -> Result<Vec<Value>> {
    let mut out = Vec::new();
    decode_row_into(b, &mut out)?;
    Ok(out)
}

/// Decodes all values of `b`, appending them to `out`.
pub fn decode_row_into(mut b: &[u8], out: &mut Vec<Value>) -> Result<()> {
    while !b.is_empty() {
        out.push(decode_value(&mut b)?);
    }
    Ok(())
}

/// A 64-bit hash of `b` (word-at-a-time mixing, MurmurHash3's finaliser).
#[inline]
pub fn hash_bytes(b: &[u8]) -> u64 {
    let mut h = 0x9E37_79B9_7F4A_7C15u64 ^ (b.len() as u64).wrapping_mul(0xC2B2_AE3D_27D4_EB4F);
    let mut chunks = b.chunks_exact(8);
    for c in &mut chunks {
        let mut w = [0u8; 8];
        w.copy_from_slice(c);
        h = (h ^ u64::from_le_bytes(w)).wrapping_mul(0xff51_afd7_ed55_8ccd).rotate_left(31);
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let mut w = [0u8; 8];
        w[..rest.len()].copy_from_slice(rest);
        h = (h ^ u64::from_le_bytes(w)).wrapping_mul(0xff51_afd7_ed55_8ccd).rotate_left(31);
    }
    hash64(h)
}

fn escape(b: &[u8], out: &mut Vec<u8>) {
    for &x in b {
        out.push(x);
        if x == 0 {
            out.push(0xFF);
        }
    }
    out.extend_from_slice(&[0, 0]);
}

/// Appends an order-preserving encoding of `v`: byte-wise comparison of two encodings is
/// SQL's order (numbers by value, strings by their bytes), reversed for `desc`, with NULL
/// first or last as asked.
pub fn encode_sort_key(v: &Value, desc: bool, nulls_first: bool, out: &mut Vec<u8>) {
    let start = out.len();
    match v {
        Value::Null => out.push(if nulls_first != desc { 0 } else { 2 }),
        v => {
            out.push(1);
            match v {
                Value::I64(i) => out.extend_from_slice(&((*i as u64) ^ (1 << 63)).to_be_bytes()),
                Value::F64(f) => {
                    let b = canon(*f).to_bits();
                    let k = if b >> 63 == 1 { !b } else { b | (1 << 63) };
                    out.extend_from_slice(&k.to_be_bytes());
                }
                Value::Date(d) => out.extend_from_slice(&((*d as u32) ^ (1 << 31)).to_be_bytes()),
                Value::Bool(b) => out.push(u8::from(*b)),
                Value::Str(s) => escape(s.as_bytes(), out),
                Value::Bytes(b) => escape(b, out),
                Value::Null => {}
            }
        }
    }
    if desc {
        for x in &mut out[start..] {
            *x = !*x;
        }
    }
}

pub(crate) fn rd32(d: &[u8], o: usize) -> u32 {
    u32::from_le_bytes([d[o], d[o + 1], d[o + 2], d[o + 3]])
}

pub(crate) fn wr32(d: &mut [u8], o: usize, v: u32) {
    d[o..o + 4].copy_from_slice(&v.to_le_bytes());
}

pub(crate) fn rd64(d: &[u8], o: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&d[o..o + 8]);
    u64::from_le_bytes(a)
}

pub(crate) fn wr64(d: &mut [u8], o: usize, v: u64) {
    d[o..o + 8].copy_from_slice(&v.to_le_bytes());
}

/// Largest power of two `<= x` (1 for 0).
pub(crate) fn pow2_floor(x: u64) -> u64 {
    if x <= 1 {
        1
    } else {
        1 << (63 - x.leading_zeros())
    }
}

/// Payload bytes of the pages of runs: a 64th of the pool, between the smallest page and
/// 64 KiB.
pub(crate) fn run_payload(bm: &BufferManager) -> usize {
    let min = bm.classes().min_page();
    (pow2_floor(bm.pool_size() / 64).clamp(min, (64 << 10).max(min)) as usize) - PAGE_HEADER_SIZE
}

/// Payload bytes of the pages of `fanout` runs appended to at the same time (partitions):
/// their tail pages together take at most a quarter of the pool (when the smallest page
/// allows), so that appending rarely meets an evicted tail.
pub(crate) fn part_payload(bm: &BufferManager, fanout: usize) -> usize {
    let min = bm.classes().min_page();
    (pow2_floor(bm.pool_size() / 4 / fanout.max(1) as u64).clamp(min, (64 << 10).max(min)) as usize) - PAGE_HEADER_SIZE
}

/// Payload bytes of one operator's working page (hash table, sort buffer, join build): an
/// eighth of the pool, at least the smallest page.
pub(crate) fn work_payload(bm: &BufferManager) -> usize {
    work_share(bm, 1)
}

/// [`work_payload`] of each of `workers` operators that run at once (the workers of a
/// parallel pipeline, each with its own hash table): together they take an eighth of the
/// pool, each at least the smallest page.
pub(crate) fn work_share(bm: &BufferManager, workers: usize) -> usize {
    let min = bm.classes().min_page();
    (pow2_floor(bm.pool_size() / 8 / workers.max(1) as u64).max(min) as usize) - PAGE_HEADER_SIZE
}

pub(crate) fn not_temp() -> Error {
    corrupt("operator state page is not a temporary page")
}

/// Variable-size records (each `u32` length + bytes) in temporary pages; freed on drop.
pub struct RowRun<'a> {
    bm: &'a BufferManager,
    payload: usize,
    pages: Vec<(PageId, u32)>,
    len: u64,
    bytes: u64,
}

/// Records on their way to a [`RowRun`], framed in a heap buffer and handed over when it
/// holds `batch` bytes ([`RowRun::extend`]: one latch per page instead of one per record);
/// a record larger than `batch` goes to the run directly (after those held), so the buffer
/// stays under twice `batch`. [`flush`](Self::flush) before the run is read or measured.
pub struct Pending {
    buf: Vec<u8>,
    batch: usize,
}

impl Pending {
    pub fn new(batch: usize) -> Pending {
        Pending { buf: Vec::new(), batch }
    }

    /// Adds one record (`parts` one after another).
    pub fn push(&mut self, run: &mut RowRun<'_>, parts: &[&[u8]]) -> Result<()> {
        if 4 + parts.iter().map(|p| p.len()).sum::<usize>() > self.batch {
            self.flush(run)?;
            return run.append(parts);
        }
        frame_record(&mut self.buf, parts);
        if self.buf.len() >= self.batch {
            self.flush(run)?;
        }
        Ok(())
    }

    /// Hands the records held to `run`.
    pub fn flush(&mut self, run: &mut RowRun<'_>) -> Result<()> {
        if !self.buf.is_empty() {
            run.extend(&self.buf)?;
            self.buf.clear();
        }
        Ok(())
    }
}

/// A position in a [`RowRun`] (see [`RowRun::next`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct Cursor {
    page: usize,
    off: usize,
}

/// Appends one record framed as a run keeps it (a `u32` length, then `parts` one after
/// another) to `out`: a batch of such records goes to [`RowRun::extend`].
pub fn frame_record(out: &mut Vec<u8>, parts: &[&[u8]]) {
    let n: usize = parts.iter().map(|p| p.len()).sum();
    out.extend_from_slice(&(n as u32).to_le_bytes());
    for p in parts {
        out.extend_from_slice(p);
    }
}

/// The framed records of `recs` (a page of a run, see [`RowRun::drain_pages`], or a batch
/// of [`frame_record`]s), in order, each with the offset of its bytes in `recs`.
pub fn records(recs: &[u8]) -> impl Iterator<Item = Result<(usize, &[u8])>> + '_ {
    let mut o = 0;
    std::iter::from_fn(move || {
        if o >= recs.len() {
            return None;
        }
        let at = o + 4;
        match recs.get(o..at).and_then(|w| recs.get(at..at + rd32(w, 0) as usize)) {
            Some(rec) => {
                o = at + rec.len();
                Some(Ok((at, rec)))
            }
            None => {
                o = recs.len();
                Some(Err(corrupt("record runs past its page")))
            }
        }
    })
}

impl<'a> RowRun<'a> {
    /// An empty run whose pages have `payload` bytes (records larger get their own page).
    pub fn new(bm: &'a BufferManager, payload: usize) -> RowRun<'a> {
        RowRun { bm, payload, pages: Vec::new(), len: 0, bytes: 0 }
    }

    /// Records appended.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes of the records (with their length words).
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Appends the records of `other` after this run's (its pages move over; nothing is
    /// copied). A page of `other` holds whole records, so the runs' page boundaries stay.
    pub fn append_run(&mut self, mut other: RowRun<'a>) {
        self.pages.append(&mut other.pages);
        self.len += std::mem::take(&mut other.len);
        self.bytes += std::mem::take(&mut other.bytes);
    }

    /// Appends the record made of `parts` one after the other.
    pub fn append(&mut self, parts: &[&[u8]]) -> Result<()> {
        let n: usize = parts.iter().map(|p| p.len()).sum();
        let need = n + 4;
        let put = |d: &mut [u8], at: usize| {
            wr32(d, at, n as u32);
            let mut o = at + 4;
            for p in parts {
                d[o..o + p.len()].copy_from_slice(p);
                o += p.len();
            }
        };
        if let Some(last) = self.pages.last_mut() {
            let cap = self.bm.payload_size(last.0.class());
            if last.1 as usize + need <= cap {
                let mut g = self.bm.fix_exclusive(last.0)?;
                put(g.data_mut().ok_or_else(not_temp)?, last.1 as usize);
                last.1 += need as u32;
                self.len += 1;
                self.bytes += need as u64;
                return Ok(());
            }
        }
        let mut g = self.bm.alloc_temp(need.max(self.payload))?;
        put(g.data_mut().ok_or_else(not_temp)?, 0);
        self.pages.push((g.pid(), need as u32));
        self.len += 1;
        self.bytes += need as u64;
        Ok(())
    }

    /// Appends the records of `recs` (each a `u32` length and its bytes, as
    /// [`append`](Self::append) writes them): as many as fit copied into a page under one
    /// latch.
    pub fn extend(&mut self, mut recs: &[u8]) -> Result<()> {
        while !recs.is_empty() {
            let first = 4 + rd32(recs, 0) as usize;
            if first > recs.len() {
                return Err(corrupt("record runs past its batch"));
            }
            let Some(last) = self.pages.last_mut().filter(|l| l.1 as usize + first <= self.bm.payload_size(l.0.class())) else {
                let g = self.bm.alloc_temp(first.max(self.payload))?;
                self.pages.push((g.pid(), 0));
                continue;
            };
            let (used, cap) = (last.1 as usize, self.bm.payload_size(last.0.class()));
            // The records that fit.
            let (mut span, mut n) = (first, 1);
            while span + 4 <= recs.len() {
                let need = 4 + rd32(recs, span) as usize;
                if used + span + need > cap || span + need > recs.len() {
                    break;
                }
                span += need;
                n += 1;
            }
            let mut g = self.bm.fix_exclusive(last.0)?;
            g.data_mut().ok_or_else(not_temp)?[used..used + span].copy_from_slice(&recs[..span]);
            last.1 += span as u32;
            self.len += n;
            self.bytes += span as u64;
            recs = &recs[span..];
        }
        Ok(())
    }

    /// Calls `f(position, record)` for the records from `cur` on, a page at a time under
    /// one shared latch (`f` must not latch this run's pages exclusively), until `f` returns `false` or
    /// the run ends; `cur` is then past the last record handed to `f`.
    pub fn scan(&self, cur: &mut Cursor, f: &mut dyn FnMut(Cursor, &[u8]) -> Result<bool>) -> Result<()> {
        while let Some(&(pid, used)) = self.pages.get(cur.page) {
            if cur.off >= used as usize {
                cur.page += 1;
                cur.off = 0;
                continue;
            }
            let g = self.bm.fix_shared(pid)?;
            let d = g.data().get(..used as usize).ok_or_else(|| corrupt("run page shorter than its records"))?;
            while cur.off < d.len() {
                let len = d.get(cur.off..cur.off + 4).ok_or_else(|| corrupt("record runs past its page"))?;
                let n = u32::from_le_bytes(len.try_into().expect("4 bytes")) as usize;
                let rec = d.get(cur.off + 4..cur.off + 4 + n).ok_or_else(|| corrupt("record runs past its page"))?;
                let at = *cur;
                cur.off += 4 + n;
                if !f(at, rec)? {
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    /// Copies the record at `cur` into `out` and advances; `false` at the end.
    pub fn next(&self, cur: &mut Cursor, out: &mut Vec<u8>) -> Result<bool> {
        loop {
            let Some(&(pid, used)) = self.pages.get(cur.page) else { return Ok(false) };
            if cur.off >= used as usize {
                cur.page += 1;
                cur.off = 0;
                continue;
            }
            let g = self.bm.fix_shared(pid)?;
            let d = g.data();
            let n = rd32(d, cur.off) as usize;
            let rec = d.get(cur.off + 4..cur.off + 4 + n).ok_or_else(|| corrupt("record runs past its page"))?;
            out.clear();
            out.extend_from_slice(rec);
            cur.off += 4 + n;
            return Ok(true);
        }
    }

    /// Calls `f` with every record, freeing each page once read. A page's records are
    /// copied out first (`buf`, at most a page), so no page is latched while `f` runs.
    pub fn drain(self, f: &mut dyn FnMut(&[u8]) -> Result<()>) -> Result<()> {
        self.drain_pages(&mut |recs| {
            for rec in records(recs) {
                f(rec?.1)?;
            }
            Ok(())
        })
    }

    /// Calls `f` with the records of each page (each a `u32` length and its bytes), freeing
    /// the page once read. They are copied out first (`buf`, at most a page), so no page
    /// is latched while `f` runs.
    pub fn drain_pages(mut self, f: &mut dyn FnMut(&[u8]) -> Result<()>) -> Result<()> {
        let mut buf = Vec::new();
        let pages = std::mem::take(&mut self.pages);
        let mut rest = pages.into_iter();
        while let Some((pid, used)) = rest.next() {
            {
                let g = self.bm.fix_shared(pid)?;
                buf.clear();
                buf.extend_from_slice(&g.data()[..used as usize]);
            }
            self.bm.free(pid)?;
            if let Err(e) = f(&buf) {
                self.pages = rest.collect();
                return Err(e);
            }
        }
        Ok(())
    }
}

impl Drop for RowRun<'_> {
    fn drop(&mut self) {
        for &(pid, _) in &self.pages {
            let _ = self.bm.free(pid);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Config;

    #[test]
    fn values_round_trip_and_sort_keys_order() {
        let vals = [
            Value::Null,
            Value::I64(-5),
            Value::F64(-0.0),
            Value::Date(-3),
            Value::Bool(true),
            Value::Str("".into()),
            Value::Str("ab\0c".into()),
            Value::Bytes(vec![0, 1]),
        ];
        let mut b = Vec::new();
        encode_row(&vals, &mut b);
        let back = decode_row(&b).unwrap();
        assert_eq!(back.len(), vals.len());
        assert_eq!(back[2], Value::F64(0.0));
        assert_eq!(back[6], vals[6]);
        let key = |v: &Value, desc: bool| {
            let mut o = Vec::new();
            encode_sort_key(v, desc, desc, &mut o);
            o
        };
        let ints = [Value::I64(i64::MIN), Value::I64(-1), Value::I64(0), Value::I64(7), Value::I64(i64::MAX), Value::Null];
        for w in ints.windows(2) {
            assert!(key(&w[0], false) < key(&w[1], false));
            assert!(key(&w[0], true) > key(&w[1], true) || matches!(w[1], Value::Null));
        }
        assert!(key(&Value::Null, true) < key(&Value::I64(i64::MAX), true));
        let fl = [f64::NEG_INFINITY, -2.5, -0.0, 0.0, 1e-300, 3.0, f64::INFINITY, f64::NAN];
        for w in fl.windows(2) {
            assert!(key(&Value::F64(w[0]), false) <= key(&Value::F64(w[1]), false), "{w:?}");
        }
        let strs = ["", "\0", "a", "a\0", "ab", "b"];
        for w in strs.windows(2) {
            assert!(key(&Value::Str(w[0].into()), false) < key(&Value::Str(w[1].into()), false), "{w:?}");
        }
    }

    #[test]
    fn values_decode_into_slots_reusing_buffers() {
        let vals = [
            Value::Str("a longer string than the slot had".into()),
            Value::Str(String::new()),
            Value::Bytes(vec![1, 2, 3]),
            Value::I64(7),
            Value::Null,
            Value::Str("x".into()),
            Value::Date(-3),
        ];
        let mut b = Vec::new();
        encode_row(&vals, &mut b);
        // Slots holding values of other types and sizes, strings among them.
        let mut slots = vec![
            Value::Str("old".into()),
            Value::I64(1),
            Value::Str("s".into()),
            Value::Null,
            Value::Str("t".into()),
            Value::Bytes(vec![9]),
            Value::Bool(true),
        ];
        let mut rest = &b[..];
        for s in slots.iter_mut() {
            decode_value_into(s, &mut rest).unwrap();
        }
        assert!(rest.is_empty());
        assert_eq!(slots, vals);
        assert!(decode_value_into(&mut slots[0], &mut &b[..3]).is_err(), "a truncated string is an error");
        let mut copies = vec![Value::Str("zz".into()), Value::Bytes(Vec::new()), Value::Null, Value::Str("q".into()), Value::I64(0), Value::Null, Value::Null];
        for (c, v) in copies.iter_mut().zip(&vals) {
            assign(c, v);
        }
        assert_eq!(copies, vals);
    }

    #[test]
    fn runs_spill_and_come_back() {
        let dir = tempfile::tempdir().unwrap();
        let bm = BufferManager::create(Config::new(dir.path().join("db")).min_page(4096).pool_size(256 << 10)).unwrap();
        let mut run = RowRun::new(&bm, run_payload(&bm));
        let rec = |i: u64| -> Vec<u8> { (0..(i * 37 % 9000) as usize).map(|j| (i as usize + j) as u8).collect() };
        for i in 0..300u64 {
            run.append(&[&i.to_le_bytes(), &rec(i)]).unwrap();
        }
        assert!(bm.stats().evictions > 0);
        let (mut cur, mut out, mut i) = (Cursor::default(), Vec::new(), 0u64);
        while run.next(&mut cur, &mut out).unwrap() {
            assert_eq!(rd64(&out, 0), i);
            assert_eq!(&out[8..], &rec(i)[..]);
            i += 1;
        }
        assert_eq!(i, 300);
        // A page-at-a-time scan hands out the same records with their positions, from a
        // position in the middle, and stops where told (its cursor past the last one).
        let mut mid = Cursor::default();
        for _ in 0..120 {
            assert!(run.next(&mut mid, &mut out).unwrap());
        }
        let (mut cur, mut seen) = (mid, Vec::new());
        run.scan(&mut cur, &mut |at, r| {
            let mut again = at;
            assert!(run.next(&mut again, &mut out).unwrap());
            assert_eq!(out, r, "the record at its position");
            seen.push(rd64(r, 0));
            Ok(seen.len() < 100)
        })
        .unwrap();
        assert_eq!(seen, (120..220).collect::<Vec<u64>>());
        assert!(run.next(&mut cur, &mut out).unwrap());
        assert_eq!(rd64(&out, 0), 220);
        let mut rest = 0;
        run.scan(&mut mid, &mut |_, _| {
            rest += 1;
            Ok(true)
        })
        .unwrap();
        assert_eq!(rest, 180);
        let mut n = 0;
        run.drain(&mut |r| {
            assert_eq!(rd64(r, 0), n);
            n += 1;
            Ok(())
        })
        .unwrap();
        assert_eq!(crate::testutil::temp_pages(&bm), 0);
    }

    /// Records copied in batches ([`RowRun::extend`]), some larger than a page, come back
    /// as appended ones do, in order, among records appended one by one.
    #[test]
    fn runs_extended_in_batches_come_back_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let bm = BufferManager::create(Config::new(dir.path().join("db")).min_page(4096).pool_size(256 << 10)).unwrap();
        let payload = run_payload(&bm);
        let mut run = RowRun::new(&bm, payload);
        let rec = |i: u64| -> Vec<u8> {
            let n = if i % 97 == 5 { payload + 100 } else { (i * 37 % 700) as usize };
            let mut r = i.to_le_bytes().to_vec();
            r.extend((0..n).map(|j| (i as usize + j) as u8));
            r
        };
        let (mut batch, mut i) = (Vec::new(), 0u64);
        while i < 600 {
            if i % 7 == 0 {
                run.append(&[&rec(i)]).unwrap();
                i += 1;
                continue;
            }
            batch.clear();
            for _ in 0..(i % 13 + 1) {
                let r = rec(i);
                batch.extend_from_slice(&(r.len() as u32).to_le_bytes());
                batch.extend_from_slice(&r);
                i += 1;
            }
            run.extend(&batch).unwrap();
        }
        assert_eq!(run.len(), i);
        let mut n = 0;
        run.drain(&mut |r| {
            assert_eq!(r, &rec(n)[..]);
            n += 1;
            Ok(())
        })
        .unwrap();
        assert_eq!(n, i);
        assert_eq!(crate::testutil::temp_pages(&bm), 0);
    }
}
