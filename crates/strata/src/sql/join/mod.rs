//! Hash joins whose state lives in temporary pages (inner and left outer equi-joins, and
//! the semi and anti joins of `IN (SELECT ...)` / `NOT IN (SELECT ...)`).
//!
//! The build side (for inner, semi and `NOT EXISTS` joins the side whose records take
//! fewer bytes, see [`build_side`]: rows estimated by [`Plan::estimate`] (filtered scans
//! sampled) times the width of the columns kept; otherwise the right side; a semi or anti join
//! that builds on the left marks the entries that right rows match, in a bitmap on the
//! heap (a bit per 20 bytes of the table; the table itself is only read), then gives the
//! marked or unmarked left rows; where its probe side is a parallel pipeline, each worker
//! marks in a bitmap of its own, ORed before the rows are given) is written to a [`RowRun`] as `(hash, key, row)`
//! records, rows with a NULL key left out (they match nothing). A record's row holds only
//! the columns used above the join or by its residual, and a matching record is decoded
//! straight into its slots of one reused output row (see [`slots`]); a probe compares the
//! hash and the key's bytes, and decodes a build record only when they match. If it fits an eighth of
//! the pool, it becomes a hash table in one temporary page and the probe side streams past
//! it. Otherwise both sides are hash-partitioned into runs (grace hash join: up to 64
//! partitions, each a run of temporary pages that is evicted to the scratch file under
//! pressure) and joined partition by partition (inside a parallel pipeline, the pairs on
//! its workers: [`grace`]); a pair whose build side still does not fit
//! is partitioned again by the next bits of the hash, recursively; one that cannot be split
//! (a single frequent key) is taken in table-sized chunks, each probed by the whole probe partition,
//! with a bitmap in temporary pages remembering which probe rows matched (for left, semi
//! and anti joins).

pub(super) mod grace;
mod leaf;
mod slots;
mod table;

use super::exec::Plan;
use super::expr::BExpr;
use super::keyfilter::{self, KeyFilter};
use super::rows::{corrupt, encode_value, hash_bytes, part_payload, pow2_floor, rd32, rd64, run_payload, work_payload, Cursor, Pending, RowRun};
use super::scan::ColScan;
use crate::access::table::Value;
use crate::buffer::{BufferManager, SharedGuard};
use crate::error::Result;
use crate::ops::spill::shifted;
pub(super) use slots::Joined;
use table::{record_head, split, JoinTable, TempBits, HDR};

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
    /// Per column of the left rows then the right ones: read above the join or by the
    /// residual (empty: all are).
    pub keep: &'p [bool],
}

/// Encodes the keys of `row`; `false` if one is NULL. A plain column key is encoded from
/// the row without evaluating an expression.
fn encode_keys(keys: &[BExpr], row: &[Value], out: &mut Vec<u8>) -> Result<bool> {
    out.clear();
    for k in keys {
        if let BExpr::Col(i, _) = k {
            let v = row.get(*i).ok_or_else(|| corrupt("join key column"))?;
            if matches!(v, Value::Null) {
                return Ok(false);
            }
            encode_value(v, out);
            continue;
        }
        let v = k.eval(row)?;
        if matches!(v, Value::Null) {
            return Ok(false);
        }
        encode_value(&v, out);
    }
    Ok(true)
}

/// A probe row: a row of the probe plan, or the kept columns of one, encoded (a grace
/// partition's record).
#[derive(Clone, Copy)]
enum Probe<'r> {
    Row(&'r [Value]),
    Bytes(&'r [u8]),
    /// Row `.1` of a batch of the probe scan (see [`leaf`]).
    Leaf(&'r super::scan::Batch<'r>, usize),
}

pub(super) struct Ctx<'p> {
    kind: JoinKind,
    build_left: bool,
    residual: Option<&'p BExpr>,
    build_has_null: bool,
    build_rows: u64,
}

type Sink<'s> = dyn FnMut(&[Value]) -> Result<bool> + 's;

thread_local! {
    /// Bytes of join tables that this thread's joins keep latched while rows flow (see
    /// [`Claim`]).
    static HELD: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// The share of the pool that join tables kept latched across their probes may take
/// together: `1 / HELD_SHARE`.
const HELD_SHARE: u64 = 8;

/// A join's right to keep its table latched while it probes (a whole probe, a chunk, or a
/// batch of the leaf-wise probe), taken when the tables this thread's joins keep latched
/// leave room: together at most `1 / HELD_SHARE` of the pool. The matches go up to the
/// operators above while the table stays latched, and those allocate pages (and, in a
/// chain of joins, build the tables above); a table is up to an eighth of the pool, so a
/// chain of joins each holding its own would pin one per join (seven of them left a 1 MiB
/// pool without room: found in review). Without a claim a probe latches the table for each
/// walk of a chain only, as row-at-a-time probes always did. Given back when dropped.
pub(super) struct Claim(u64);

impl Claim {
    fn take(bm: &BufferManager, bytes: usize) -> Option<Claim> {
        let bytes = bytes as u64;
        let limit = bm.pool_size() / HELD_SHARE;
        HELD.with(|h| {
            let now = h.get();
            (now + bytes <= limit).then(|| {
                h.set(now + bytes);
                Claim(bytes)
            })
        })
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        HELD.with(|h| h.set(h.get() - self.0));
    }
}

/// `g`, a latch on a table of `bytes`, with a [`Claim`] to keep it; or nothing (no room:
/// the latch is released and the probe latches per chain walk).
fn claimed<G>(bm: &BufferManager, g: G, bytes: usize) -> (Option<G>, Option<Claim>) {
    match Claim::take(bm, bytes) {
        Some(c) => (Some(g), Some(c)),
        None => (None, None),
    }
}

/// `table` latched shared to keep for a probe, if a claim allows (see [`claimed`]).
fn hold<'a>(bm: &BufferManager, table: &JoinTable<'a>) -> Result<(Option<SharedGuard<'a>>, Option<Claim>)> {
    let g = table.page.shared()?;
    let bytes = g.data().len();
    Ok(claimed(bm, g, bytes))
}

/// Puts the probe row's kept columns into their slots, once per probe row.
fn load(jr: &mut Joined, p: Probe<'_>, loaded: &mut bool) -> Result<()> {
    if !*loaded {
        match p {
            Probe::Row(r) => jr.load_probe(r)?,
            Probe::Bytes(b) => jr.decode_probe(b)?,
            Probe::Leaf(b, i) => jr.load_probe_leaf(b, i)?,
        }
        *loaded = true;
    }
    Ok(())
}

impl Ctx<'_> {
    /// A semi or anti join that builds on its left side: probe rows mark the entries they
    /// match, then the marked (semi) or unmarked (anti) entries are the result.
    fn marks(&self) -> bool {
        self.build_left && matches!(self.kind, JoinKind::Semi | JoinKind::NotExists)
    }

    /// Whether a matching build record must be decoded (its columns are output, or the
    /// residual reads them).
    fn decodes(&self, jr: &Joined) -> bool {
        !jr.build_empty() && (self.residual.is_some() || matches!(self.kind, JoinKind::Inner | JoinKind::Left))
    }

    /// Whether the residual holds for the row in `jr` (no residual: true).
    fn passes(&self, jr: &Joined) -> Result<bool> {
        Ok(match self.residual {
            Some(r) => r.holds(jr.all())?,
            None => true,
        })
    }

    /// Marks in `bits` every entry of the table (left rows) that the probe row (a right
    /// row) matches. The table is only read (several workers may probe at once, each with
    /// bits of its own): `held` is its bytes under a shared latch the caller holds, else it
    /// is latched for this row.
    #[allow(clippy::too_many_arguments)]
    fn mark_bits(&self, table: &JoinTable<'_>, held: Option<&[u8]>, jr: &mut Joined, p: Probe<'_>, key: &[u8], h: u64, bits: &mut MarkBits) -> Result<()> {
        let own;
        let d = match held {
            Some(d) => d,
            None => {
                own = table.page.shared()?;
                own.data()
            }
        };
        let mut loaded = false;
        let mut cur = table.head(d, h);
        while cur != 0 {
            let o = cur - 1;
            if o + HDR > d.len() {
                return Err(corrupt("join entry past its page"));
            }
            cur = rd32(d, o) as usize;
            let (klen, rlen) = (rd32(d, o + 12) as usize, rd32(d, o + 16) as usize);
            let hit = !bits.get(o) && rd64(d, o + 4) == h && klen == key.len() && d.get(o + HDR..o + HDR + klen) == Some(key);
            if !hit {
                continue;
            }
            if self.residual.is_some() {
                load(jr, p, &mut loaded)?;
                jr.decode_build(d.get(o + HDR + klen..o + HDR + klen + rlen).ok_or_else(|| corrupt("join entry past its page"))?)?;
                if !self.passes(jr)? {
                    continue;
                }
            }
            bits.set(o);
        }
        Ok(())
    }

    /// The left rows of `table` that are the result: marked in `bits` for a semi join,
    /// unmarked for an anti join.
    fn emit(&self, table: &JoinTable<'_>, jr: &mut Joined, bits: &MarkBits, sink: &mut Sink<'_>) -> Result<bool> {
        let want = self.kind == JoinKind::Semi;
        let mut at = table.nslots * 4;
        for _ in 0..table.count {
            let marked = {
                let g = table.page.shared()?;
                let d = g.data();
                if at + HDR > d.len() {
                    return Err(corrupt("join entry past its page"));
                }
                let (klen, rlen) = (rd32(d, at + 12) as usize, rd32(d, at + 16) as usize);
                let bytes = d.get(at + HDR + klen..at + HDR + klen + rlen).ok_or_else(|| corrupt("join entry past its page"))?;
                let marked = bits.get(at);
                at += HDR + klen + rlen;
                if marked == want {
                    jr.decode_build(bytes)?;
                }
                marked
            };
            if marked == want && !sink(jr.left())? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Hands on the probe row itself (a left row: semi and anti joins that build on the
    /// right).
    fn pass(jr: &mut Joined, p: Probe<'_>, loaded: &mut bool, sink: &mut Sink<'_>) -> Result<bool> {
        match p {
            Probe::Row(r) => sink(r),
            Probe::Bytes(_) | Probe::Leaf(..) => {
                load(jr, p, loaded)?;
                sink(jr.left())
            }
        }
    }

    /// A LEFT join's probe row without a match, padded with NULLs.
    fn padded(jr: &mut Joined, p: Probe<'_>, loaded: &mut bool, sink: &mut Sink<'_>) -> Result<bool> {
        load(jr, p, loaded)?;
        jr.null_build();
        sink(jr.all())
    }

    /// A probe row whose key is NULL: it matches nothing.
    fn null_probe(&self, jr: &mut Joined, p: Probe<'_>, sink: &mut Sink<'_>) -> Result<bool> {
        let mut loaded = false;
        match self.kind {
            JoinKind::Inner | JoinKind::Semi => Ok(true),
            JoinKind::Left => Self::padded(jr, p, &mut loaded, sink),
            // NULL NOT IN (empty) is true; NULL NOT IN (anything) is NULL.
            JoinKind::NotExists => Self::pass(jr, p, &mut loaded, sink),
            JoinKind::Anti => {
                if self.build_rows == 0 {
                    Self::pass(jr, p, &mut loaded, sink)
                } else {
                    Ok(true)
                }
            }
        }
    }

    /// Probes `table` with one row. `seen`: it matched an earlier chunk; `last`: this is
    /// the last chunk (rows without any match are settled now). `held`: the table's bytes
    /// under a shared latch the caller holds (else each walk of the chain latches it).
    /// Returns (go on, matched here).
    #[allow(clippy::too_many_arguments)]
    fn probe(
        &self,
        table: &JoinTable<'_>,
        held: Option<&[u8]>,
        jr: &mut Joined,
        p: Probe<'_>,
        key: &[u8],
        h: u64,
        seen: bool,
        last: bool,
        sink: &mut Sink<'_>,
    ) -> Result<(bool, bool)> {
        let mut matched = false;
        let mut loaded = false;
        let decodes = self.decodes(jr);
        // The chain's next entry (an offset plus one; 0: none); `None`: not read yet.
        let mut cur: Option<usize> = None;
        while cur != Some(0) {
            // Walks the chain under one latch to the next entry whose hash and key match,
            // and decodes that one only.
            let hit = {
                let g;
                let d = match held {
                    Some(d) => d,
                    None => {
                        g = table.page.shared()?;
                        g.data()
                    }
                };
                let mut next = match cur {
                    Some(c) => c,
                    None => table.head(d, h),
                };
                let mut hit = false;
                while next != 0 {
                    let o = next - 1;
                    if o + HDR > d.len() {
                        return Err(corrupt("join entry past its page"));
                    }
                    next = rd32(d, o) as usize;
                    let klen = rd32(d, o + 12) as usize;
                    if rd64(d, o + 4) == h && klen == key.len() && d.get(o + HDR..o + HDR + klen) == Some(key) {
                        if decodes {
                            let rlen = rd32(d, o + 16) as usize;
                            jr.decode_build(d.get(o + HDR + klen..o + HDR + klen + rlen).ok_or_else(|| corrupt("join entry past its page"))?)?;
                        }
                        hit = true;
                        break;
                    }
                }
                cur = Some(next);
                hit
            };
            if !hit {
                break;
            }
            if self.residual.is_some() {
                load(jr, p, &mut loaded)?;
                if !self.passes(jr)? {
                    continue;
                }
            }
            matched = true;
            match self.kind {
                JoinKind::Inner | JoinKind::Left => {
                    load(jr, p, &mut loaded)?;
                    if !sink(jr.all())? {
                        return Ok((false, true));
                    }
                }
                JoinKind::Semi => {
                    if !seen && !Self::pass(jr, p, &mut loaded, sink)? {
                        return Ok((false, true));
                    }
                    return Ok((true, true));
                }
                JoinKind::Anti | JoinKind::NotExists => return Ok((true, true)),
            }
        }
        if last && !seen && !matched {
            let go = match self.kind {
                JoinKind::Left => Self::padded(jr, p, &mut loaded, sink)?,
                JoinKind::Anti if !self.build_has_null => Self::pass(jr, p, &mut loaded, sink)?,
                JoinKind::NotExists => Self::pass(jr, p, &mut loaded, sink)?,
                _ => true,
            };
            return Ok((go, false));
        }
        Ok((true, matched))
    }
}

/// Whether a join builds on its left side, with the estimated bytes of each side's
/// records (see [`super::width::estimate_bytes`]; `keep` as in [`JoinArgs`]). Inner
/// joins build on the side whose records take fewer bytes (the estimated rows times the
/// width of the columns they carry: a side of few but wide rows can be the larger), and
/// so do semi joins and NOT EXISTS (then the probe rows mark what they match); the others
/// on the right.
pub fn build_side(bm: &BufferManager, left: &Plan, right: &Plan, kind: JoinKind, keep: &[bool]) -> Result<(bool, f64, f64)> {
    if !matches!(kind, JoinKind::Inner | JoinKind::Semi | JoinKind::NotExists) {
        return Ok((false, 0.0, 0.0));
    }
    let lw = super::scan::width(left);
    let kept = |i: usize| keep.get(i).copied().unwrap_or(keep.is_empty());
    let l = super::width::estimate_bytes(bm, left, &|i| kept(i))?;
    let r = super::width::estimate_bytes(bm, right, &|i| kept(lw + i))?;
    Ok((l < r, l, r))
}

/// A join's build side as a table in one temporary page (it fits a work share of the
/// pool), ready to be probed: by one thread ([`Built::probe_all`]), or by several at once
/// (the table is only read; see [`super::pipeline`]).
pub(super) struct Built<'p, 'b> {
    ctx: Ctx<'p>,
    table: JoinTable<'b>,
    pplan: &'p Plan,
    pkeys: &'p [BExpr],
    /// The probe scan and its key columns, if the probe can go a leaf at a time.
    leaf: Option<(&'p ColScan, Vec<usize>)>,
    /// Left and right widths and the kept columns, for each prober's [`Joined`].
    widths: (usize, usize),
    keep: &'p [bool],
    /// The join filter pushed into the probe scan, removed when the table is dropped.
    _filter: Option<keyfilter::Installed<'p>>,
}

/// What building a join's table gave.
pub(super) enum Build<'p, 'b> {
    /// The table: probe it.
    Table(Built<'p, 'b>),
    /// Too large for a table: the build records, to be partitioned (grace hash join).
    Run(Ctx<'p>, Joined, RowRun<'b>),
    /// The sink asked to stop (rows of a NOT EXISTS that builds on its left with NULL keys
    /// go to it during the build).
    Stopped,
}

/// The probe side of join `j`, if its rows could flow through a [`Built`] table from
/// several threads at once: its probe rows need nothing of each other (every kind but a
/// semi join or NOT EXISTS that builds on its left: their probe rows mark the table, and
/// the marked rows come after the probe). With it: whether the join builds on its left,
/// and whether its build side is estimated ([`build_side`]) to take more bytes than a
/// table of a work share of the pool holds (it will be a grace join).
pub(super) fn parallel_probe_side<'p>(bm: &BufferManager, j: &JoinArgs<'p>) -> Result<Option<(&'p Plan, bool, bool)>> {
    let (build_left, l, r) = build_side(bm, j.left, j.right, j.kind, j.keep)?;
    let marks = build_left && matches!(j.kind, JoinKind::Semi | JoinKind::NotExists);
    let too_large = (if build_left { l } else { r }) > work_payload(bm) as f64;
    Ok((!marks).then_some((if build_left { j.right } else { j.left }, build_left, too_large)))
}

/// Builds join `j`'s table from its build side, if it fits a work share of the pool.
pub(super) fn build<'p, 'b>(bm: &'b BufferManager, j: &JoinArgs<'p>, sink: &mut Sink<'_>) -> Result<Build<'p, 'b>> {
    let (build_left, _, _) = build_side(bm, j.left, j.right, j.kind, j.keep)?;
    build_on(bm, j, build_left, sink)
}

/// [`build`] on the side given (`build_left`), as [`build_side`] decided it.
pub(super) fn build_on<'p, 'b>(bm: &'b BufferManager, j: &JoinArgs<'p>, build_left: bool, sink: &mut Sink<'_>) -> Result<Build<'p, 'b>> {
    let (bplan, bkeys, pplan, pkeys) = if build_left { (j.left, j.left_keys, j.right, j.right_keys) } else { (j.right, j.right_keys, j.left, j.left_keys) };
    let mut ctx = Ctx { kind: j.kind, build_left, residual: j.residual, build_has_null: false, build_rows: 0 };
    let widths = (super::scan::width(j.left), super::scan::width(j.right));
    let jr = Joined::new(widths.0, widths.1, j.keep, build_left);
    let marks = ctx.marks();
    // The build side's records, on the workers of a parallel pipeline where it is one (a
    // run each, joined in worker order), else here.
    // (Not a NOT EXISTS that builds on its left: its rows with NULL keys go to `sink`.)
    let side = BuildSide { bkeys, jr: &jr };
    let hands_on = marks && ctx.kind == JoinKind::NotExists;
    let parallel = if hands_on {
        None
    } else {
        super::pipeline::run_parallel(bm, bplan, super::pipeline::Into::Build, &|_| side.local(bm), &|l, row| side.add(l, row).map(|_| ()))?
    };
    let brun = match parallel {
        Some(parts) => {
            let mut all = RowRun::new(bm, run_payload(bm));
            for mut l in parts {
                l.pend.flush(&mut l.run)?;
                ctx.build_rows += l.rows;
                ctx.build_has_null |= l.has_null;
                all.append_run(l.run);
            }
            all
        }
        None => {
            let mut l = side.local(bm);
            let go = bplan.run(bm, &mut |row| {
                if side.add(&mut l, row)? {
                    return Ok(true);
                }
                // A left row whose key is NULL matches nothing: NOT EXISTS keeps it.
                if hands_on {
                    sink(row)
                } else {
                    Ok(true)
                }
            })?;
            if !go {
                return Ok(Build::Stopped);
            }
            l.pend.flush(&mut l.run)?;
            ctx.build_rows = l.rows;
            ctx.build_has_null = l.has_null;
            l.run
        }
    };
    if table_bytes(brun.len(), brun.bytes()) > work_payload(bm) as u64 {
        return Ok(Build::Run(ctx, jr, brun));
    }
    // A probe row without a match gives nothing here: the probe scan may drop the rows
    // whose keys are not in the table (see `keyfilter`).
    let filtered = match ctx.kind {
        JoinKind::Inner | JoinKind::Semi => true,
        JoinKind::NotExists => marks,
        JoinKind::Left | JoinKind::Anti => false,
    };
    let target = if filtered { keyfilter::target(pplan, pkeys) } else { None };
    let mut filter = target.as_ref().map(|(_, cols)| KeyFilter::new(brun.len(), cols.clone()));
    let table = JoinTable::build(bm, &brun, Cursor::default(), brun.len(), brun.bytes(), filter.as_mut())?;
    drop(brun);
    let _filter = target.zip(filter).map(|((scan, _), f)| {
        super::counters::JOIN_FILTERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        keyfilter::Installed::new(&scan.keys, f)
    });
    let leaf = if marks { None } else { leaf::target(pplan, pkeys, jr.probe_cols()) };
    Ok(Build::Table(Built { ctx, table, pplan, pkeys, leaf, widths, keep: j.keep, _filter }))
}

/// How a join's build rows become `(hash, key, row)` records.
struct BuildSide<'j> {
    bkeys: &'j [BExpr],
    jr: &'j Joined,
}

/// A builder's records and counts (one per worker of a parallel build).
struct BuildLocal<'b> {
    run: RowRun<'b>,
    pend: Pending,
    kb: Vec<u8>,
    rb: Vec<u8>,
    rows: u64,
    has_null: bool,
}

impl BuildSide<'_> {
    fn local<'b>(&self, bm: &'b BufferManager) -> BuildLocal<'b> {
        BuildLocal { run: RowRun::new(bm, run_payload(bm)), pend: Pending::new(RUN_BATCH), kb: Vec::new(), rb: Vec::new(), rows: 0, has_null: false }
    }

    /// Adds a build row's record; `false` if its key is NULL (no record: it matches nothing).
    fn add(&self, l: &mut BuildLocal<'_>, row: &[Value]) -> Result<bool> {
        l.rows += 1;
        if !encode_keys(self.bkeys, row, &mut l.kb)? {
            l.has_null = true;
            return Ok(false);
        }
        l.rb.clear();
        self.jr.encode_build(row, &mut l.rb)?;
        l.pend.push(&mut l.run, &[&record_head(hash_bytes(&l.kb), &l.kb), &l.kb, &l.rb])?;
        Ok(true)
    }
}

/// The entries of a join table that probe rows matched (see [`Ctx::mark_bits`]): a bit per
/// [`HDR`] bytes of the table's entry area (an entry takes at least that many, so no two
/// share a bit). On the heap: a 160th of the table's page.
#[derive(Clone)]
struct MarkBits {
    base: usize,
    words: Vec<u64>,
}

impl MarkBits {
    fn new(table: &JoinTable<'_>) -> Result<MarkBits> {
        let len = table.page.shared()?.data().len();
        let base = table.nslots * 4;
        Ok(MarkBits { base, words: vec![0; (len.saturating_sub(base) / HDR + 1).div_ceil(64)] })
    }

    fn bit(&self, o: usize) -> (usize, u64) {
        debug_assert!(o >= self.base && (o - self.base) / HDR < self.words.len() * 64, "entry offset {o} outside the table");
        let i = o.saturating_sub(self.base) / HDR;
        (i / 64, 1 << (i % 64))
    }

    fn get(&self, o: usize) -> bool {
        let (w, b) = self.bit(o);
        self.words.get(w).is_some_and(|x| x & b != 0)
    }

    fn set(&mut self, o: usize) {
        let (w, b) = self.bit(o);
        if let Some(x) = self.words.get_mut(w) {
            *x |= b;
        }
    }

    fn or(&mut self, other: &MarkBits) {
        for (a, b) in self.words.iter_mut().zip(&other.words) {
            *a |= b;
        }
    }
}

/// Bytes of a join table of `count` records of `bytes` (with their length words).
fn table_bytes(count: u64, bytes: u64) -> u64 {
    count.max(1).next_power_of_two() * 4 + bytes + count * 8
}

impl<'p> Built<'p, '_> {
    /// A joined row for one prober.
    pub(super) fn joined(&self) -> Joined {
        Joined::new(self.widths.0, self.widths.1, self.keep, self.ctx.build_left)
    }

    /// The probe side's plan.
    pub(super) fn probe_plan(&self) -> &'p Plan {
        self.pplan
    }

    /// The probe scan, if the probe goes a leaf at a time (see [`leaf`]).
    pub(super) fn leaf_scan(&self) -> Option<&'p ColScan> {
        self.leaf.as_ref().map(|(s, _)| *s)
    }

    /// Probes the table with every row of the probe side (then, for a semi join or NOT
    /// EXISTS that marks its left rows, hands on the marked or unmarked ones).
    pub(super) fn probe_all(&self, bm: &BufferManager, jr: &mut Joined, sink: &mut Sink<'_>) -> Result<bool> {
        let (ctx, table) = (&self.ctx, &self.table);
        let mut kb = Vec::new();
        if ctx.marks() {
            // On several workers where the probe side is a parallel pipeline, each marking
            // in its own bits (merged before the emit).
            let none = MarkBits::new(table)?;
            let init = |_| (none.clone(), Vec::new(), self.joined());
            let mark = |(bits, kb, jr): &mut (MarkBits, Vec<u8>, Joined), prow: &[Value]| -> Result<()> {
                if encode_keys(self.pkeys, prow, kb)? {
                    ctx.mark_bits(table, None, jr, Probe::Row(prow), kb, hash_bytes(kb), bits)?;
                }
                Ok(())
            };
            if let Some(workers) = super::pipeline::run_parallel(bm, self.pplan, super::pipeline::Into::Marks, &init, &mark)? {
                let mut all = none;
                for (bits, _, _) in &workers {
                    all.or(bits);
                }
                return ctx.emit(table, jr, &all, sink);
            }
            let mut bits = none;
            {
                // Latched once for the whole probe where a claim allows (see [`Claim`]).
                let (held, _claim) = hold(bm, table)?;
                let d = held.as_ref().map(|g| g.data());
                self.pplan.run(bm, &mut |prow| {
                    if encode_keys(self.pkeys, prow, &mut kb)? {
                        ctx.mark_bits(table, d, jr, Probe::Row(prow), &kb, hash_bytes(&kb), &mut bits)?;
                    }
                    Ok(true)
                })?;
            }
            return ctx.emit(table, jr, &bits, sink);
        }
        if self.leaf.is_some() {
            return self.probe_leaves(bm, jr, 0, u64::MAX, sink);
        }
        // The table latched once for the whole probe where a claim allows (see [`Claim`]).
        let (held, _claim) = hold(bm, table)?;
        let d = held.as_ref().map(|g| g.data());
        self.pplan.run(bm, &mut |prow| self.probe_row(d, jr, &mut kb, prow, sink))
    }

    /// Probes the table with the rows `from..to` of the probe scan, a leaf at a time (only
    /// where [`leaf_scan`](Self::leaf_scan) is some).
    pub(super) fn probe_leaves(&self, bm: &BufferManager, jr: &mut Joined, from: u64, to: u64, sink: &mut Sink<'_>) -> Result<bool> {
        let (scan, kcols) = self.leaf.as_ref().ok_or_else(|| corrupt("leaf probe of a join without a probe scan"))?;
        leaf::probe(bm, scan, kcols, from, to, &self.ctx, &self.table, jr, sink)
    }

    /// The table latched shared for a run of probes, if a claim allows (see [`Claim`]):
    /// its bytes go to [`probe_row`](Self::probe_row).
    pub(super) fn hold(&self, bm: &BufferManager) -> Result<(Option<SharedGuard<'_>>, Option<Claim>)> {
        hold(bm, &self.table)
    }

    /// Probes the table with one probe row (`held`: the table's bytes under a latch the
    /// caller holds; else each walk of a chain latches it). Not for a join that marks.
    pub(super) fn probe_row(&self, held: Option<&[u8]>, jr: &mut Joined, kb: &mut Vec<u8>, prow: &[Value], sink: &mut Sink<'_>) -> Result<bool> {
        if !encode_keys(self.pkeys, prow, kb)? {
            return self.ctx.null_probe(jr, Probe::Row(prow), sink);
        }
        Ok(self.ctx.probe(&self.table, held, jr, Probe::Row(prow), kb, hash_bytes(kb), false, true, sink)?.0)
    }
}

/// Runs a hash join, handing the joined rows (left columns, then right) to `sink`.
pub fn run(bm: &BufferManager, j: &JoinArgs<'_>, sink: &mut Sink<'_>) -> Result<bool> {
    let (ctx, mut jr, brun) = match build(bm, j, sink)? {
        Build::Stopped => return Ok(false),
        Build::Table(t) => {
            let mut jr = t.joined();
            return t.probe_all(bm, &mut jr, sink);
        }
        Build::Run(ctx, jr, brun) => (ctx, jr, brun),
    };
    let pkeys = if ctx.build_left { j.right_keys } else { j.left_keys };
    let pplan = if ctx.build_left { j.right } else { j.left };
    let marks = ctx.marks();
    let budget = work_payload(bm) as u64;
    // Grace hash join: both sides partitioned by the top bits of the hash.
    super::counters::GRACE_JOINS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let want = brun.bytes().div_ceil(budget / 2).max(2);
    let bits = pow2_floor(want.next_power_of_two()).trailing_zeros().clamp(1, 6);
    let part = |h: u64| (h >> (64 - bits)) as usize;
    let bparts = partition(bm, brun, bits, 1, &part)?;
    let mut pparts = Parts::new(bm, bits);
    let (mut kb, mut rb) = (Vec::new(), Vec::new());
    let go = pplan.run(bm, &mut |prow| {
        let Some(h) = probe_record(pkeys, &jr, prow, &mut kb, &mut rb)? else {
            return if marks { Ok(true) } else { ctx.null_probe(&mut jr, Probe::Row(prow), sink) };
        };
        pparts.push(part(h), &[&record_head(h, &kb), &kb, &rb])?;
        Ok(true)
    })?;
    if !go {
        return Ok(false);
    }
    for (b, p) in bparts.into_iter().zip(pparts.finish()?) {
        if !join_pair(bm, &ctx, &mut jr, b, p, budget, bits, (MAX_BITS, 1), sink)? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// A probe row's key (into `kb`) and kept columns (into `rb`) for a partition record, and
/// the key's hash; `None` if the key is NULL (nothing encoded).
fn probe_record(pkeys: &[BExpr], jr: &Joined, prow: &[Value], kb: &mut Vec<u8>, rb: &mut Vec<u8>) -> Result<Option<u64>> {
    if !encode_keys(pkeys, prow, kb)? {
        return Ok(None);
    }
    rb.clear();
    jr.encode_probe(prow, rb)?;
    Ok(Some(hash_bytes(kb)))
}

/// Bytes of build records held on the heap before they go to the build run.
const RUN_BATCH: usize = 32 << 10;
/// Bytes of records held per partition before they go to its run (64 partitions at most:
/// 512 KiB on the heap at most; the workers of a parallel grace join share that, each at
/// least [`PART_BATCH_MIN`] per partition).
const PART_BATCH: usize = 8 << 10;
const PART_BATCH_MIN: usize = 1 << 10;

/// `2^bits` partitions of records in runs of temporary pages, each filled a batch of
/// records at a time ([`Pending`]).
struct Parts<'b> {
    runs: Vec<RowRun<'b>>,
    pend: Vec<Pending>,
}

impl<'b> Parts<'b> {
    fn new(bm: &'b BufferManager, bits: u32) -> Parts<'b> {
        Self::shared(bm, bits, 1)
    }

    /// One of `workers` sets of partitions filled at once: their tail pages together take
    /// what one set's would.
    fn shared(bm: &'b BufferManager, bits: u32, workers: usize) -> Parts<'b> {
        let payload = part_payload(bm, (1 << bits) * workers.max(1));
        let batch = (PART_BATCH / workers.max(1)).max(PART_BATCH_MIN);
        Parts { runs: (0..1usize << bits).map(|_| RowRun::new(bm, payload)).collect(), pend: (0..1usize << bits).map(|_| Pending::new(batch)).collect() }
    }

    /// Adds a record (`parts` one after another) to partition `i`.
    fn push(&mut self, i: usize, parts: &[&[u8]]) -> Result<()> {
        self.pend[i].push(&mut self.runs[i], parts)
    }

    /// The partitions' runs, every record in them.
    fn finish(mut self) -> Result<Vec<RowRun<'b>>> {
        for (p, r) in self.pend.iter_mut().zip(self.runs.iter_mut()) {
            p.flush(r)?;
        }
        Ok(self.runs)
    }
}

/// The `(hash, key, row)` records of `run` in `2^bits` partitions by `part(hash)`.
/// `workers`: how many partition at once (their tail pages share the room of one set's).
fn partition<'b>(bm: &'b BufferManager, run: RowRun<'b>, bits: u32, workers: usize, part: &dyn Fn(u64) -> usize) -> Result<Vec<RowRun<'b>>> {
    let mut parts = Parts::shared(bm, bits, workers);
    run.drain(&mut |rec| {
        let (h, _, _) = split(rec)?;
        parts.push(part(h), &[rec])
    })?;
    parts.finish()
}

/// Bits of the hash one level of grace partitioning takes at most (64 partitions).
const MAX_BITS: u32 = 6;

/// Joins one pair of partitions whose hashes share their top `consumed` bits: as a table
/// if the build side fits, else partitioned again by the next bits (`limit`: at most that
/// many bits a level, by one of that many workers partitioning at once; recursively), else
/// (one key too frequent to split, or no bits left) in chunks.
#[allow(clippy::too_many_arguments)]
fn join_pair(
    bm: &BufferManager,
    ctx: &Ctx<'_>,
    jr: &mut Joined,
    b: RowRun<'_>,
    p: RowRun<'_>,
    budget: u64,
    consumed: u32,
    limit: (u32, usize),
    sink: &mut Sink<'_>,
) -> Result<bool> {
    let (max_bits, workers) = limit;
    if p.is_empty() || table_bytes(b.len(), b.bytes()) <= budget || consumed >= 64 {
        return join_partition(bm, ctx, jr, &b, &p, budget, sink);
    }
    let want = b.bytes().div_ceil(budget / 2).max(2);
    let bits = want.next_power_of_two().trailing_zeros().clamp(1, max_bits.max(1)).min(64 - consumed);
    let part = |h: u64| (shifted(h, consumed) >> (64 - bits)) as usize;
    let total = b.len();
    let mut bparts = partition(bm, b, bits, workers, &part)?;
    if let Some(i) = bparts.iter().position(|r| r.len() == total) {
        // No progress: every build row has the same hash bits here (one frequent key).
        let b = bparts.swap_remove(i);
        return join_partition(bm, ctx, jr, &b, &p, budget, sink);
    }
    let pparts = partition(bm, p, bits, workers, &part)?;
    super::counters::REPARTITIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    for (b, p) in bparts.into_iter().zip(pparts) {
        if !join_pair(bm, ctx, jr, b, p, budget, consumed + bits, limit, sink)? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Joins one pair of partitions, in chunks of the build side that fit a table.
#[allow(clippy::too_many_arguments)]
fn join_partition(bm: &BufferManager, ctx: &Ctx<'_>, jr: &mut Joined, b: &RowRun<'_>, p: &RowRun<'_>, budget: u64, sink: &mut Sink<'_>) -> Result<bool> {
    if p.is_empty() && !ctx.marks() {
        return Ok(true);
    }
    // Chunk boundaries: (start, records, bytes), at least one record each.
    let mut chunks = Vec::new();
    {
        let (mut start, mut n, mut bytes) = (Cursor::default(), 0u64, 0u64);
        b.scan(&mut Cursor::default(), &mut |before, rec| {
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
            Ok(true)
        })?;
        chunks.push((start, n, bytes));
    }
    if chunks.len() > 1 {
        super::counters::CHUNKED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    if ctx.marks() {
        // Each chunk of left rows is probed by every right row, then settled.
        for &(start, n, bytes) in &chunks {
            let table = JoinTable::build(bm, b, start, n, bytes, None)?;
            let mut bits = MarkBits::new(&table)?;
            {
                let (held, _claim) = hold(bm, &table)?;
                let d = held.as_ref().map(|g| g.data());
                p.scan(&mut Cursor::default(), &mut |_, rec| {
                    let (h, key, row) = split(rec)?;
                    ctx.mark_bits(&table, d, jr, Probe::Bytes(row), key, h, &mut bits)?;
                    Ok(true)
                })?;
            }
            if !ctx.emit(&table, jr, &bits, sink)? {
                return Ok(false);
            }
        }
        return Ok(true);
    }
    let bits = if chunks.len() > 1 && ctx.kind != JoinKind::Inner { Some(TempBits::new(bm, p.len())?) } else { None };
    let last_chunk = chunks.len() - 1;
    for (ci, &(start, n, bytes)) in chunks.iter().enumerate() {
        let table = JoinTable::build(bm, b, start, n, bytes, None)?;
        // The probe records are read a page at a time, and the table is latched once for
        // the chunk where a claim allows (see [`Claim`]).
        let (held, _claim) = hold(bm, &table)?;
        let d = held.as_ref().map(|g| g.data());
        let (mut idx, mut go) = (0u64, true);
        p.scan(&mut Cursor::default(), &mut |_, rec| {
            let (h, key, row) = split(rec)?;
            let seen = match &bits {
                Some(bs) => bs.get(idx)?,
                None => false,
            };
            let (more, m) = ctx.probe(&table, d, jr, Probe::Bytes(row), key, h, seen, ci == last_chunk, sink)?;
            if m {
                if let Some(bs) = &bits {
                    bs.set(idx)?;
                }
            }
            idx += 1;
            go = more;
            Ok(more)
        })?;
        if !go {
            return Ok(false);
        }
    }
    Ok(true)
}
