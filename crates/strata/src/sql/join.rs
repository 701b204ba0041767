//! Hash joins whose state lives in temporary pages (inner and left outer equi-joins, and
//! the semi and anti joins of `IN (SELECT ...)` / `NOT IN (SELECT ...)`).
//!
//! The build side (for inner, semi and `NOT EXISTS` joins the side with fewer rows,
//! estimated by [`Plan::estimate`] (filtered scans sampled); otherwise the right side; a semi or anti join
//! that builds on the left marks the entries that right rows match, then gives the
//! marked or unmarked left rows) is written to a [`RowRun`] as `(hash, key, row)`
//! records, rows with a NULL key left out (they match nothing). If it fits an eighth of
//! the pool, it becomes a hash table in one temporary page and the probe side streams past
//! it. Otherwise both sides are hash-partitioned into runs (grace hash join: up to 64
//! partitions, each a run of temporary pages that is evicted to the scratch file under
//! pressure) and joined partition by partition; a pair whose build side still does not fit
//! is partitioned again by the next bits of the hash, recursively; one that cannot be split
//! (a single frequent key) is taken in table-sized chunks, each probed by the whole probe partition,
//! with a bitmap in temporary pages remembering which probe rows matched (for left, semi
//! and anti joins).

use super::exec::Plan;
use super::expr::BExpr;
use super::rows::{
    corrupt, decode_row, decode_row_into, encode_row, encode_value, hash_bytes, not_temp, part_payload, pow2_floor, rd32, rd64, run_payload, work_payload,
    wr32, wr64, Cursor, RowRun,
};
use crate::access::table::Value;
use crate::access::TempPage;
use crate::buffer::BufferManager;
use crate::error::Result;
use crate::ops::spill::shifted;

/// The kinds of join.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JoinKind {
    /// Matching pairs.
    Inner,
    /// Matching pairs, and each left row without a match padded with NULLs.
    Left,
    /// Left rows with at least one match (`x IN (SELECT ...)`), once each.
    Semi,
    /// Left rows for which `x NOT IN (SELECT ...)` is true.
    Anti,
    /// Left rows without a match (a decorrelated `NOT EXISTS`): unlike [`Anti`](Self::Anti),
    /// a NULL key just matches nothing, on either side.
    NotExists,
}

/// A hash join's description (the plan node's fields).
pub struct JoinArgs<'p> {
    pub left: &'p Plan,
    pub right: &'p Plan,
    pub kind: JoinKind,
    pub left_keys: &'p [BExpr],
    pub right_keys: &'p [BExpr],
    pub residual: Option<&'p BExpr>,
    pub right_width: usize,
}

/// Encodes the keys of `row`; `false` if one is NULL.
fn encode_keys(keys: &[BExpr], row: &[Value], out: &mut Vec<u8>) -> Result<bool> {
    out.clear();
    for k in keys {
        let v = k.eval(row)?;
        if matches!(v, Value::Null) {
            return Ok(false);
        }
        encode_value(&v, out);
    }
    Ok(true)
}

/// Splits a `(hash, key length, key, row)` record.
fn split(rec: &[u8]) -> Result<(u64, &[u8], &[u8])> {
    if rec.len() < 12 {
        return Err(corrupt("short join record"));
    }
    let k = rd32(rec, 8) as usize;
    let key = rec.get(12..12 + k).ok_or_else(|| corrupt("join record key"))?;
    Ok((rd64(rec, 0), key, &rec[12 + k..]))
}

/// Entry: next u32, hash u64, key length u32, row length u32, key, row.
const HDR: usize = 20;

/// A chunk of the build side as a hash table in one temporary page.
struct JoinTable<'a> {
    page: TempPage<'a>,
    nslots: usize,
    count: u64,
}

/// The bit of an entry's row length that marks it matched (semi and anti joins that
/// build on the left side).
const MARK: u32 = 1 << 31;

impl<'a> JoinTable<'a> {
    /// The `count` records of `run` from `start` (`bytes` of them with length words).
    fn build(bm: &'a BufferManager, run: &RowRun<'_>, start: Cursor, count: u64, bytes: u64) -> Result<JoinTable<'a>> {
        let nslots = (count.max(1)).next_power_of_two() as usize;
        let payload = nslots * 4 + bytes as usize + count as usize * 8;
        let (page, mut g) = TempPage::alloc(bm, payload)?;
        {
            let d = g.data_mut().ok_or_else(not_temp)?;
            let (mut cur, mut rec, mut at) = (start, Vec::new(), nslots * 4);
            for _ in 0..count {
                if !run.next(&mut cur, &mut rec)? {
                    return Err(corrupt("join build run ended early"));
                }
                let (h, key, row) = split(&rec)?;
                let slot = (h as usize) & (nslots - 1);
                let need = HDR + key.len() + row.len();
                if at + need > d.len() {
                    return Err(corrupt("join table overflow"));
                }
                wr32(d, at, rd32(d, slot * 4));
                wr64(d, at + 4, h);
                wr32(d, at + 12, key.len() as u32);
                wr32(d, at + 16, row.len() as u32);
                d[at + HDR..at + HDR + key.len()].copy_from_slice(key);
                d[at + HDR + key.len()..at + need].copy_from_slice(row);
                wr32(d, slot * 4, (at + 1) as u32);
                at += need;
            }
        }
        drop(g);
        Ok(JoinTable { page, nslots, count })
    }
}

/// One bit per probe row, in temporary pages (matched in an earlier chunk?).
struct TempBits<'a> {
    pages: Vec<TempPage<'a>>,
    per: usize,
}

impl<'a> TempBits<'a> {
    fn new(bm: &'a BufferManager, n: u64) -> Result<TempBits<'a>> {
        let payload = run_payload(bm);
        let per = payload * 8;
        let mut pages = Vec::new();
        for _ in 0..(n as usize).div_ceil(per) {
            let (p, g) = TempPage::alloc(bm, payload)?;
            drop(g);
            pages.push(p);
        }
        Ok(TempBits { pages, per })
    }
    fn get(&self, i: u64) -> Result<bool> {
        let (p, b) = ((i as usize) / self.per, (i as usize) % self.per);
        let g = self.pages.get(p).ok_or_else(|| corrupt("bitmap index"))?.shared()?;
        Ok(g.data()[b / 8] & (1 << (b % 8)) != 0)
    }
    fn set(&self, i: u64) -> Result<()> {
        let (p, b) = ((i as usize) / self.per, (i as usize) % self.per);
        let mut g = self.pages.get(p).ok_or_else(|| corrupt("bitmap index"))?.exclusive()?;
        g.data_mut().ok_or_else(not_temp)?[b / 8] |= 1 << (b % 8);
        Ok(())
    }
}

struct Ctx<'p> {
    kind: JoinKind,
    build_left: bool,
    residual: Option<&'p BExpr>,
    right_width: usize,
    build_has_null: bool,
    build_rows: u64,
    /// A probe's buffers: the matching build row's bytes, the joined row.
    scratch: std::cell::RefCell<(Vec<u8>, Vec<Value>)>,
}

type Sink<'s> = dyn FnMut(&[Value]) -> Result<bool> + 's;

impl Ctx<'_> {
    /// A semi or anti join that builds on its left side: probe rows mark the entries they
    /// match, then the marked (semi) or unmarked (anti) entries are the result.
    fn marks(&self) -> bool {
        self.build_left && matches!(self.kind, JoinKind::Semi | JoinKind::NotExists)
    }

    /// Marks every entry of `table` (left rows) that the probe row (a right row) matches.
    fn mark(&self, table: &JoinTable<'_>, prow: &[Value], key: &[u8], h: u64) -> Result<()> {
        let mut cur = {
            let g = table.page.shared()?;
            rd32(g.data(), (h as usize & (table.nslots - 1)) * 4) as usize
        };
        let (mut brow_bytes, mut out) = (Vec::new(), Vec::new());
        while cur != 0 {
            let o = cur - 1;
            let hit = {
                let g = table.page.shared()?;
                let d = g.data();
                if o + HDR > d.len() {
                    return Err(corrupt("join entry past its page"));
                }
                cur = rd32(d, o) as usize;
                let (klen, rraw) = (rd32(d, o + 12) as usize, rd32(d, o + 16));
                let hit = rraw & MARK == 0 && rd64(d, o + 4) == h && klen == key.len() && d.get(o + HDR..o + HDR + klen) == Some(key);
                if hit && self.residual.is_some() {
                    let rlen = (rraw & !MARK) as usize;
                    brow_bytes.clear();
                    brow_bytes.extend_from_slice(d.get(o + HDR + klen..o + HDR + klen + rlen).ok_or_else(|| corrupt("join entry past its page"))?);
                }
                hit
            };
            if !hit {
                continue;
            }
            if let Some(r) = self.residual {
                out.clear();
                out.extend(decode_row(&brow_bytes)?);
                out.extend_from_slice(prow);
                if !matches!(r.eval(&out)?, Value::Bool(true)) {
                    continue;
                }
            }
            let mut g = table.page.exclusive()?;
            let d = g.data_mut().ok_or_else(not_temp)?;
            let v = rd32(d, o + 16);
            wr32(d, o + 16, v | MARK);
        }
        Ok(())
    }

    /// The left rows of `table` that are the result: marked for a semi join, unmarked for
    /// an anti join.
    fn emit(&self, table: &JoinTable<'_>, sink: &mut Sink<'_>) -> Result<bool> {
        let want = self.kind == JoinKind::Semi;
        let mut at = table.nslots * 4;
        for _ in 0..table.count {
            let (row, marked) = {
                let g = table.page.shared()?;
                let d = g.data();
                if at + HDR > d.len() {
                    return Err(corrupt("join entry past its page"));
                }
                let (klen, rraw) = (rd32(d, at + 12) as usize, rd32(d, at + 16));
                let rlen = (rraw & !MARK) as usize;
                let bytes = d.get(at + HDR + klen..at + HDR + klen + rlen).ok_or_else(|| corrupt("join entry past its page"))?;
                at += HDR + klen + rlen;
                (decode_row(bytes)?, rraw & MARK != 0)
            };
            if marked == want && !sink(&row)? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// A probe row whose key is NULL: it matches nothing.
    fn null_probe(&self, prow: &[Value], sink: &mut Sink<'_>) -> Result<bool> {
        match self.kind {
            JoinKind::Inner | JoinKind::Semi => Ok(true),
            JoinKind::Left => self.padded(prow, sink),
            // NULL NOT IN (empty) is true; NULL NOT IN (anything) is NULL.
            JoinKind::NotExists => sink(prow),
            JoinKind::Anti => {
                if self.build_rows == 0 {
                    sink(prow)
                } else {
                    Ok(true)
                }
            }
        }
    }

    fn padded(&self, prow: &[Value], sink: &mut Sink<'_>) -> Result<bool> {
        let mut out = prow.to_vec();
        out.resize(prow.len() + self.right_width, Value::Null);
        sink(&out)
    }

    /// Probes `table` with one row. `seen`: it matched an earlier chunk; `last`: this is
    /// the last chunk (rows without any match are settled now). Returns (go on, matched
    /// here).
    #[allow(clippy::too_many_arguments)]
    fn probe(&self, table: &JoinTable<'_>, prow: &[Value], key: &[u8], h: u64, seen: bool, last: bool, sink: &mut Sink<'_>) -> Result<(bool, bool)> {
        let mut matched = false;
        let mut cur = {
            let g = table.page.shared()?;
            rd32(g.data(), (h as usize & (table.nslots - 1)) * 4) as usize
        };
        // Reused across probes (a probe's sink is the operator above, never this join).
        let mut scratch = self.scratch.borrow_mut();
        let (brow_bytes, out) = &mut *scratch;
        while cur != 0 {
            let hit = {
                let g = table.page.shared()?;
                let d = g.data();
                let o = cur - 1;
                if o + HDR > d.len() {
                    return Err(corrupt("join entry past its page"));
                }
                cur = rd32(d, o) as usize;
                let (klen, rlen) = (rd32(d, o + 12) as usize, rd32(d, o + 16) as usize);
                let hit = rd64(d, o + 4) == h && klen == key.len() && d.get(o + HDR..o + HDR + klen) == Some(key);
                if hit {
                    brow_bytes.clear();
                    brow_bytes.extend_from_slice(d.get(o + HDR + klen..o + HDR + klen + rlen).ok_or_else(|| corrupt("join entry past its page"))?);
                }
                hit
            };
            if !hit {
                continue;
            }
            out.clear();
            if self.build_left {
                decode_row_into(brow_bytes, out)?;
                out.extend_from_slice(prow);
            } else {
                out.extend_from_slice(prow);
                decode_row_into(brow_bytes, out)?;
            }
            if let Some(r) = self.residual {
                if !matches!(r.eval(out)?, Value::Bool(true)) {
                    continue;
                }
            }
            matched = true;
            match self.kind {
                JoinKind::Inner | JoinKind::Left => {
                    if !sink(out)? {
                        return Ok((false, true));
                    }
                }
                JoinKind::Semi => {
                    if !seen && !sink(prow)? {
                        return Ok((false, true));
                    }
                    return Ok((true, true));
                }
                JoinKind::Anti | JoinKind::NotExists => return Ok((true, true)),
            }
        }
        if last && !seen && !matched {
            let go = match self.kind {
                JoinKind::Left => self.padded(prow, sink)?,
                JoinKind::Anti if !self.build_has_null => sink(prow)?,
                JoinKind::NotExists => sink(prow)?,
                _ => true,
            };
            return Ok((go, false));
        }
        Ok((true, matched))
    }
}

/// Runs a hash join, handing the joined rows (left columns, then right) to `sink`.
pub fn run(bm: &BufferManager, j: &JoinArgs<'_>, sink: &mut Sink<'_>) -> Result<bool> {
    // Inner joins build on the side with fewer rows, and so do semi joins and NOT EXISTS
    // (then the probe rows mark what they match); the others on the right.
    let build_left = matches!(j.kind, JoinKind::Inner | JoinKind::Semi | JoinKind::NotExists) && j.left.estimate_rows(bm)? < j.right.estimate_rows(bm)?;
    let (bplan, bkeys, pplan, pkeys) = if build_left { (j.left, j.left_keys, j.right, j.right_keys) } else { (j.right, j.right_keys, j.left, j.left_keys) };
    let mut ctx =
        Ctx { kind: j.kind, build_left, residual: j.residual, right_width: j.right_width, build_has_null: false, build_rows: 0, scratch: Default::default() };
    let mut brun = RowRun::new(bm, run_payload(bm));
    let (mut kb, mut rb) = (Vec::new(), Vec::new());
    let marks = ctx.marks();
    let go = bplan.run(bm, &mut |row| {
        ctx.build_rows += 1;
        if !encode_keys(bkeys, row, &mut kb)? {
            ctx.build_has_null = true;
            // A left row whose key is NULL matches nothing: NOT EXISTS keeps it.
            return if marks && ctx.kind == JoinKind::NotExists { sink(row) } else { Ok(true) };
        }
        rb.clear();
        encode_row(row, &mut rb);
        brun.append(&[&hash_bytes(&kb).to_le_bytes(), &(kb.len() as u32).to_le_bytes(), &kb, &rb])?;
        Ok(true)
    })?;
    if !go {
        return Ok(false);
    }
    let budget = work_payload(bm) as u64;
    let table_bytes = |count: u64, bytes: u64| count.max(1).next_power_of_two() * 4 + bytes + count * 8;
    if table_bytes(brun.len(), brun.bytes()) <= budget {
        let table = JoinTable::build(bm, &brun, Cursor::default(), brun.len(), brun.bytes())?;
        drop(brun);
        if marks {
            pplan.run(bm, &mut |prow| {
                if encode_keys(pkeys, prow, &mut kb)? {
                    ctx.mark(&table, prow, &kb, hash_bytes(&kb))?;
                }
                Ok(true)
            })?;
            return ctx.emit(&table, sink);
        }
        return pplan.run(bm, &mut |prow| {
            if !encode_keys(pkeys, prow, &mut kb)? {
                return ctx.null_probe(prow, sink);
            }
            Ok(ctx.probe(&table, prow, &kb, hash_bytes(&kb), false, true, sink)?.0)
        });
    }
    // Grace hash join: both sides partitioned by the top bits of the hash.
    super::counters::GRACE_JOINS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let want = brun.bytes().div_ceil(budget / 2).max(2);
    let bits = pow2_floor(want.next_power_of_two()).trailing_zeros().clamp(1, 6);
    let part = |h: u64| (h >> (64 - bits)) as usize;
    let payload = part_payload(bm, 1 << bits);
    let mut bparts: Vec<RowRun<'_>> = (0..1usize << bits).map(|_| RowRun::new(bm, payload)).collect();
    brun.drain(&mut |rec| {
        let (h, _, _) = split(rec)?;
        bparts[part(h)].append(&[rec])
    })?;
    let mut pparts: Vec<RowRun<'_>> = (0..1usize << bits).map(|_| RowRun::new(bm, payload)).collect();
    let go = pplan.run(bm, &mut |prow| {
        if !encode_keys(pkeys, prow, &mut kb)? {
            return if marks { Ok(true) } else { ctx.null_probe(prow, sink) };
        }
        rb.clear();
        encode_row(prow, &mut rb);
        let h = hash_bytes(&kb);
        pparts[part(h)].append(&[&h.to_le_bytes(), &(kb.len() as u32).to_le_bytes(), &kb, &rb])?;
        Ok(true)
    })?;
    if !go {
        return Ok(false);
    }
    for (b, p) in bparts.into_iter().zip(pparts) {
        if !join_pair(bm, &ctx, b, p, budget, bits, sink)? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Joins one pair of partitions whose hashes share their top `consumed` bits: as a table
/// if the build side fits, else partitioned again by the next bits (recursively), else
/// (one key too frequent to split, or no bits left) in chunks.
fn join_pair(bm: &BufferManager, ctx: &Ctx<'_>, b: RowRun<'_>, p: RowRun<'_>, budget: u64, consumed: u32, sink: &mut Sink<'_>) -> Result<bool> {
    let table_bytes = b.len().max(1).next_power_of_two() * 4 + b.bytes() + b.len() * 8;
    if p.is_empty() || table_bytes <= budget || consumed >= 64 {
        return join_partition(bm, ctx, &b, &p, budget, sink);
    }
    let want = b.bytes().div_ceil(budget / 2).max(2);
    let bits = want.next_power_of_two().trailing_zeros().clamp(1, 6).min(64 - consumed);
    let part = |h: u64| (shifted(h, consumed) >> (64 - bits)) as usize;
    let payload = part_payload(bm, 1 << bits);
    let total = b.len();
    let mut bparts: Vec<RowRun<'_>> = (0..1usize << bits).map(|_| RowRun::new(bm, payload)).collect();
    b.drain(&mut |rec| {
        let (h, _, _) = split(rec)?;
        bparts[part(h)].append(&[rec])
    })?;
    if let Some(i) = bparts.iter().position(|r| r.len() == total) {
        // No progress: every build row has the same hash bits here (one frequent key).
        let b = bparts.swap_remove(i);
        return join_partition(bm, ctx, &b, &p, budget, sink);
    }
    let mut pparts: Vec<RowRun<'_>> = (0..1usize << bits).map(|_| RowRun::new(bm, payload)).collect();
    p.drain(&mut |rec| {
        let (h, _, _) = split(rec)?;
        pparts[part(h)].append(&[rec])
    })?;
    super::counters::REPARTITIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    for (b, p) in bparts.into_iter().zip(pparts) {
        if !join_pair(bm, ctx, b, p, budget, consumed + bits, sink)? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Joins one pair of partitions, in chunks of the build side that fit a table.
fn join_partition(bm: &BufferManager, ctx: &Ctx<'_>, b: &RowRun<'_>, p: &RowRun<'_>, budget: u64, sink: &mut Sink<'_>) -> Result<bool> {
    if p.is_empty() && !ctx.marks() {
        return Ok(true);
    }
    // Chunk boundaries: (start, records, bytes), at least one record each.
    let mut chunks = Vec::new();
    {
        let (mut cur, mut rec) = (Cursor::default(), Vec::new());
        let (mut start, mut n, mut bytes) = (cur, 0u64, 0u64);
        loop {
            let before = cur;
            if !b.next(&mut cur, &mut rec)? {
                break;
            }
            let add = rec.len() as u64 + 4;
            let grown = (n + 1).next_power_of_two() * 4 + bytes + add + (n + 1) * 8;
            if n > 0 && grown > budget {
                chunks.push((start, n, bytes));
                start = before;
                n = 0;
                bytes = 0;
            }
            n += 1;
            bytes += add;
        }
        chunks.push((start, n, bytes));
    }
    if chunks.len() > 1 {
        super::counters::CHUNKED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    if ctx.marks() {
        // Each chunk of left rows is probed by every right row, then settled.
        let mut rec = Vec::new();
        for &(start, n, bytes) in &chunks {
            let table = JoinTable::build(bm, b, start, n, bytes)?;
            let mut cur = Cursor::default();
            while p.next(&mut cur, &mut rec)? {
                let (h, key, row) = split(&rec)?;
                ctx.mark(&table, &decode_row(row)?, key, h)?;
            }
            if !ctx.emit(&table, sink)? {
                return Ok(false);
            }
        }
        return Ok(true);
    }
    let bits = if chunks.len() > 1 && ctx.kind != JoinKind::Inner { Some(TempBits::new(bm, p.len())?) } else { None };
    let last_chunk = chunks.len() - 1;
    let mut rec = Vec::new();
    for (ci, &(start, n, bytes)) in chunks.iter().enumerate() {
        let table = JoinTable::build(bm, b, start, n, bytes)?;
        let mut cur = Cursor::default();
        let mut idx = 0u64;
        while p.next(&mut cur, &mut rec)? {
            let (h, key, row) = split(&rec)?;
            let prow = decode_row(row)?;
            let seen = match &bits {
                Some(bs) => bs.get(idx)?,
                None => false,
            };
            let (go, m) = ctx.probe(&table, &prow, key, h, seen, ci == last_chunk, sink)?;
            if m {
                if let Some(bs) = &bits {
                    bs.set(idx)?;
                }
            }
            if !go {
                return Ok(false);
            }
            idx += 1;
        }
    }
    Ok(true)
}
