//! Hash aggregation: count, sum, min and max per group, in any pool.
//!
//! [`aggregate`] maps every value of a column to a `u64` group key and folds the values of
//! each group. All operator state lives in temporary pages (tables, partitions, staging
//! buffers; see [`super::spill`]), so it shares the pool with cached data and spills through
//! the scratch file by eviction:
//!
//! 1. **Pre-aggregation** (morsel-driven, `threads` workers): each worker folds the pages it
//!    takes into its own hash table, which fills one temporary page. Once the table is full
//!    its keys stay, and values of other keys go *raw* (4 or 8 bytes) to hash partitions
//!    shared by all workers. If, once full, fewer than a quarter of the values hit the table,
//!    the worker stops probing it and partitions everything (one cache miss less per value).
//! 2. With one worker that never bypassed its table, the table's keys never reached the
//!    partitions: they are complete and emitted. Otherwise the tables are written to the
//!    partitions as partial aggregates ("states"); if nothing spilled at all, the tables are
//!    merged into the first instead (states that find no room there are partitioned).
//! 3. **Partitions** (states and raw values of the same hash range) are aggregated
//!    independently and in parallel, largest first. A partition that fits its table page
//!    twice is copied there and scattered into buckets aggregated with cache-sized tables.
//!    Records whose keys find no room go to sub-partitions on the next hash bits, handled
//!    after the table's (then complete) groups are emitted. A level needs as many entries
//!    as distinct keys, so duplicates never cause recursion, and distinct keys are always
//!    separated eventually (the hash is a bijection).
//!
//! Groups are handed to a [`GroupSink`] per worker; sinks are merged at the end. On top of
//! it: [`groupby_mod_counts`] (`strata query groupby COLUMN --mod M`: the groups go to sorted
//! runs of temporary pages and are merged into remainder order as the counts are read, so
//! even a modulus of 2^24 stays inside the pool) and [`distinct`]
//! (`strata query distinct COLUMN`).

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;

use parking_lot::Mutex;
use serde::Serialize;

use super::spill::{
    cache_bits, drain_all, entries, for_each_raw, hash64, largest_page, payload_of, rd64, scatter, shifted, table_capacity, wr64, Partitions, Plan, Run,
    Stager, Table, WorkPage, BATCH, CACHE_KEYS,
};
use crate::access::extsort::{Merger, Plan as SortPlan, Run as ExtRun, RunWriter};
use crate::access::{Column, TempPage, ValueFormat};
use crate::buffer::BufferManager;
use crate::error::{Error, Result};

/// Which aggregates to compute besides the count (each adds to the state kept per group).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Aggregates {
    /// Exact sum of the values.
    pub sum: bool,
    /// Smallest value.
    pub min: bool,
    /// Largest value.
    pub max: bool,
}

impl Aggregates {
    /// Only the count.
    pub const COUNT: Aggregates = Aggregates { sum: false, min: false, max: false };
    /// Count, sum, min and max.
    pub const ALL: Aggregates = Aggregates { sum: true, min: true, max: true };
}

/// One group's aggregates. Fields not requested in [`Aggregates`] are 0.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Group {
    /// The group key (the key function's output).
    pub key: u64,
    /// Values in the group (at least 1).
    pub count: u64,
    /// Exact sum of the values.
    pub sum: i128,
    /// Smallest value.
    pub min: i128,
    /// Largest value.
    pub max: i128,
}

/// Receives groups. One sink per worker thread; sinks are merged at the end. A sink that
/// keeps what it receives in temporary pages can fail; its error ends the aggregation.
pub trait GroupSink: Send {
    /// Called once per group (in no particular order).
    fn add(&mut self, g: &Group) -> Result<()>;
    /// Folds another worker's sink into this one.
    fn merge(&mut self, other: Self) -> Result<()>
    where
        Self: Sized;
}

/// What spilling an aggregation did (for tests and diagnostics).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpillStats {
    /// Worker threads used.
    pub threads: usize,
    /// Records written to partitions (all levels).
    pub spilled_records: u64,
    /// Partitions created (all levels).
    pub partitions: u64,
    /// Deepest partitioning level (0: everything fitted in memory).
    pub depth: u32,
    /// Partitions aggregated in cache-sized buckets.
    pub cache_partitions: u64,
}

#[derive(Default)]
struct Counters {
    spilled: AtomicU64,
    partitions: AtomicU64,
    depth: AtomicU32,
    cache_partitions: AtomicU64,
}

impl Counters {
    fn partitioned(&self, sp: &Spill<'_>, depth: u32) {
        self.spilled.fetch_add(sp.records(), Ordering::Relaxed);
        self.partitions.fetch_add(sp.states.fanout() as u64, Ordering::Relaxed);
        self.depth.fetch_max(depth, Ordering::Relaxed);
    }
}

/// Byte layout of a group's state: key u64, count u64, then the optional sum (i128), min
/// and max (order-preserving u64 encodings of the values).
#[derive(Clone, Copy)]
struct Layout {
    size: usize,
    sum: usize,
    min: usize,
    max: usize,
    signed: bool,
}

const SIGN: u64 = 1 << 63;

impl Layout {
    fn new(aggs: Aggregates, format: ValueFormat) -> Layout {
        let mut size = 16;
        let mut take = |on: bool, n: usize| {
            if on {
                size += n;
                size - n
            } else {
                0
            }
        };
        let sum = take(aggs.sum, 16);
        let min = take(aggs.min, 8);
        let max = take(aggs.max, 8);
        Layout { size, sum, min, max, signed: format == ValueFormat::I64le }
    }

    /// Order-preserving u64 of a raw value.
    #[inline]
    fn ord(&self, raw: u64) -> u64 {
        if self.signed {
            raw ^ SIGN
        } else {
            raw
        }
    }

    #[inline]
    fn value(&self, raw: u64) -> i128 {
        if self.signed {
            raw as i64 as i128
        } else {
            raw as i128
        }
    }

    #[inline]
    fn unord(&self, o: u64) -> i128 {
        self.value(if self.signed { o ^ SIGN } else { o })
    }

    /// Initialises a new entry's body (the table zeroed it).
    #[inline]
    fn init(&self, e: &mut [u8]) {
        if self.min != 0 {
            wr64(e, self.min, u64::MAX);
        }
    }

    /// Folds (count, sum, min, max) into entry `e`.
    #[inline]
    fn fold(&self, e: &mut [u8], count: u64, sum: i128, min: u64, max: u64) {
        wr64(e, 8, rd64(e, 8) + count);
        if self.sum != 0 {
            let s = rd_i128(e, self.sum) + sum;
            e[self.sum..self.sum + 16].copy_from_slice(&s.to_le_bytes());
        }
        if self.min != 0 && min < rd64(e, self.min) {
            wr64(e, self.min, min);
        }
        if self.max != 0 && max > rd64(e, self.max) {
            wr64(e, self.max, max);
        }
    }

    /// Folds a state record (same layout) into entry `e`.
    #[inline]
    fn fold_record(&self, e: &mut [u8], r: &[u8]) {
        let sum = if self.sum != 0 { rd_i128(r, self.sum) } else { 0 };
        let min = if self.min != 0 { rd64(r, self.min) } else { 0 };
        let max = if self.max != 0 { rd64(r, self.max) } else { 0 };
        self.fold(e, rd64(r, 8), sum, min, max);
    }

    fn group(&self, e: &[u8]) -> Group {
        Group {
            key: rd64(e, 0),
            count: rd64(e, 8),
            sum: if self.sum != 0 { rd_i128(e, self.sum) } else { 0 },
            min: if self.min != 0 { self.unord(rd64(e, self.min)) } else { 0 },
            max: if self.max != 0 { self.unord(rd64(e, self.max)) } else { 0 },
        }
    }
}

#[inline]
fn rd_i128(d: &[u8], o: usize) -> i128 {
    let mut b = [0u8; 16];
    b.copy_from_slice(&d[o..o + 16]);
    i128::from_le_bytes(b)
}

struct Agg<'a, 'c, K> {
    bm: &'a BufferManager,
    column: &'c Column,
    layout: Layout,
    key: K,
    plan: Plan,
    counters: Counters,
}

/// A worker's table page after pre-aggregation.
struct Leftover<'a> {
    page: TempPage<'a>,
    slots: usize,
    len: usize,
    /// Whether values of the table's keys may also have gone to the partitions.
    bypassed: bool,
}

/// Once a pre-aggregation table is full, values are checked in windows of this many: if
/// fewer than a quarter hit the table, probing it is not worth a cache miss per value and
/// the worker sends everything straight to the partitions.
const BYPASS_WINDOW: u32 = 1 << 14;

/// Spilled input of one hash partition set: partial aggregates (`states`, records in the
/// table's layout) and raw values (`raws`, records of the column's width), partitioned alike.
struct Spill<'a> {
    states: Partitions<'a>,
    raws: Partitions<'a>,
}

impl<'a> Spill<'a> {
    fn records(&self) -> u64 {
        self.states.records() + self.raws.records()
    }
    fn next_consumed(&self) -> u32 {
        self.states.consumed + self.states.bits
    }
    /// The (states, raws) runs of every partition.
    fn into_runs(self) -> Vec<(Run<'a>, Run<'a>)> {
        self.states.into_runs().into_iter().zip(self.raws.into_runs()).collect()
    }
}

/// Where records that find no room in a partition's table go: sub-partitions on the next hash
/// bits (created on first use), through one staging page per record kind.
struct Overflow<'a> {
    sub: Option<Spill<'a>>,
    states: Option<Stager<'a>>,
    raws: Option<Stager<'a>>,
    estimate: u64,
    consumed: u32,
}

impl<'a> Overflow<'a> {
    fn new(estimate: u64, consumed: u32) -> Overflow<'a> {
        Overflow { sub: None, states: None, raws: None, estimate, consumed }
    }

    /// Flushes and frees the staging pages; returns the sub-partitions, if any.
    fn finish(self) -> Result<Option<Spill<'a>>> {
        if let Some(sp) = &self.sub {
            if let Some(mut st) = self.states {
                st.flush(&sp.states)?;
            }
            if let Some(mut st) = self.raws {
                st.flush(&sp.raws)?;
            }
        }
        Ok(self.sub)
    }
}

#[inline]
fn raw_at(r: &[u8], width: usize) -> u64 {
    if width == 4 {
        u32::from_le_bytes([r[0], r[1], r[2], r[3]]) as u64
    } else {
        rd64(r, 0)
    }
}

impl<'a, K: Fn(u64) -> u64 + Sync> Agg<'a, '_, K> {
    fn width(&self) -> usize {
        self.column.format.width()
    }

    fn new_spill(&self, records: u64, consumed: u32, sets: usize) -> Result<Spill<'a>> {
        let entries = table_capacity(payload_of(self.plan.ht), self.layout.size);
        let bits = self.plan.fanout_bits(records, entries, self.layout.size, sets, consumed)?;
        // Two partition sets, but appended to one after the other (states, then raws).
        let run_page = self.plan.run_page(1 << bits, sets);
        Ok(Spill {
            states: Partitions::new(self.bm, self.layout.size, consumed, bits, run_page),
            raws: Partitions::new(self.bm, self.width(), consumed, bits, run_page),
        })
    }

    /// Folds one raw value into `table`; `false` if its key is absent and the table is full.
    #[inline]
    fn fold_raw(&self, table: &mut Table<'_>, k: u64, hs: u64, raw: u64) -> bool {
        let l = self.layout;
        match table.upsert(k, hs) {
            Some((o, new)) => {
                let e = &mut table.bytes()[o..o + l.size];
                if new {
                    l.init(e);
                }
                let ord = l.ord(raw);
                l.fold(e, 1, l.value(raw), ord, ord);
                true
            }
            None => false,
        }
    }

    /// Folds one state record into `table`; `false` if its key is absent and the table is full.
    #[inline]
    fn fold_state(&self, table: &mut Table<'_>, hs: u64, r: &[u8]) -> bool {
        let l = self.layout;
        match table.upsert(rd64(r, 0), hs) {
            Some((o, new)) => {
                let e = &mut table.bytes()[o..o + l.size];
                if new {
                    l.init(e);
                }
                l.fold_record(e, r);
                true
            }
            None => false,
        }
    }

    /// Pre-aggregation worker: folds the pages it takes from `next` into its table. Once the
    /// table is full its keys stay, and values of other keys go raw to the shared partitions
    /// (so those keys never meet this table again).
    fn preaggregate(&self, next: &AtomicUsize, shared: &OnceLock<Spill<'a>>) -> Result<Leftover<'a>> {
        let bm = self.bm;
        let w = self.width();
        let mut work = WorkPage::alloc(bm, self.plan.ht)?;
        let mut table = Table::new(work.data_mut()?, self.layout.size, u64::MAX);
        let mut stager: Option<Stager<'a>> = None;
        let (mut seen, mut hits, mut bypassed) = (0u32, 0u32, false);
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some(cp) = self.column.pages.get(i) else { break };
            let cg = bm.fix_shared(cp.page_id())?;
            for_each_raw(self.column.format, cg.data(), cp.count as usize, |raw| {
                let k = (self.key)(raw);
                let h = hash64(k);
                if !bypassed {
                    let full = table.len() >= table.capacity();
                    let hit = self.fold_raw(&mut table, k, h, raw);
                    if full {
                        seen += 1;
                        hits += hit as u32;
                        if seen == BYPASS_WINDOW {
                            bypassed = hits < BYPASS_WINDOW / 4;
                            (seen, hits) = (0, 0);
                        }
                    }
                    if hit {
                        return Ok(());
                    }
                }
                // Every value may be its own group: plan for the column's count.
                let sp = shared.get_or_init(|| {
                    self.new_spill(self.column.count, 0, 1).unwrap_or_else(|_| {
                        let run_page = self.plan.run_page(4, 1);
                        Spill { states: Partitions::new(bm, self.layout.size, 0, 1, run_page), raws: Partitions::new(bm, w, 0, 1, run_page) }
                    })
                });
                if stager.is_none() {
                    stager = Some(Stager::new(bm, self.plan.stage, sp.raws.fanout(), w)?);
                }
                let st = stager.as_mut().ok_or_else(not_temp)?;
                st.push(&sp.raws, sp.raws.part(h), &raw.to_le_bytes()[..w])
            })?;
        }
        if let Some(mut st) = stager {
            st.flush(&shared.get().ok_or_else(not_temp)?.raws)?;
        }
        let (slots, len) = (table.slots(), table.len());
        Ok(Leftover { page: work.unlatch(), slots, len, bypassed })
    }

    /// Aggregates one partition (its runs are freed as read). Keys that find no room in the
    /// table go to sub-partitions on the next hash bits, which are aggregated afterwards; the
    /// table's keys are then complete and emitted.
    fn aggregate_part<S: GroupSink>(&self, states: Run<'a>, raws: Run<'a>, consumed: u32, depth: u32, ht: &mut [u8], sink: &mut S) -> Result<()> {
        let l = self.layout;
        let w = self.width();
        let estimate = states.len() + raws.len();
        let bytes = states.len() as usize * l.size + raws.len() as usize * w;
        let bits = cache_bits(estimate);
        // Room for the records twice plus a table of 4 * CACHE_KEYS slots.
        if bits > 0 && consumed + bits < 64 && 2 * bytes + 4 * CACHE_KEYS as usize * l.size <= ht.len() {
            return self.aggregate_part_in_cache(states, raws, consumed, bits, depth, ht, sink);
        }
        let mut table = Table::new(ht, l.size, estimate);
        let mut of = Overflow::new(estimate, consumed);
        for (run, raw) in [(states, false), (raws, true)] {
            let rec = if raw { w } else { l.size };
            let (mut keys, mut hss) = ([0u64; BATCH], [0u64; BATCH]);
            run.drain(|chunk| {
                for batch in chunk.chunks(rec * BATCH) {
                    let mut touched = 0;
                    for (i, r) in batch.chunks_exact(rec).enumerate() {
                        keys[i] = if raw { (self.key)(raw_at(r, w)) } else { rd64(r, 0) };
                        hss[i] = shifted(hash64(keys[i]), consumed);
                        touched ^= table.peek(hss[i]);
                    }
                    std::hint::black_box(touched);
                    for (i, r) in batch.chunks_exact(rec).enumerate() {
                        self.fold_or_spill(&mut table, &mut of, raw, keys[i], hss[i], r)?;
                    }
                }
                Ok(())
            })?;
        }
        for e in table.entries() {
            sink.add(&l.group(e))?;
        }
        let sub = of.finish()?;
        self.aggregate_sub(sub, depth, table.bytes(), sink)
    }

    /// Folds a record (raw value or state) into `table`, or sends it to the overflow.
    #[inline]
    fn fold_or_spill(&self, table: &mut Table<'_>, of: &mut Overflow<'a>, raw: bool, k: u64, hs: u64, r: &[u8]) -> Result<()> {
        let w = self.width();
        let folded = if raw { self.fold_raw(table, k, hs, raw_at(r, w)) } else { self.fold_state(table, hs, r) };
        if folded {
            return Ok(());
        }
        if of.sub.is_none() {
            of.sub = Some(self.new_spill(of.estimate, of.consumed, self.plan.threads)?);
        }
        let sp = of.sub.as_ref().ok_or_else(not_temp)?;
        let (parts, st, rec) = if raw { (&sp.raws, &mut of.raws, w) } else { (&sp.states, &mut of.states, self.layout.size) };
        if st.is_none() {
            *st = Some(Stager::new(self.bm, self.plan.stage, parts.fanout(), rec)?);
        }
        st.as_mut().ok_or_else(not_temp)?.push(parts, parts.part(hash64(k)), r)
    }

    /// Aggregates the sub-partitions an overflow produced (sequentially, in `ht`).
    fn aggregate_sub<S: GroupSink>(&self, sub: Option<Spill<'a>>, depth: u32, ht: &mut [u8], sink: &mut S) -> Result<()> {
        let Some(sp) = sub else { return Ok(()) };
        self.counters.partitioned(&sp, depth + 1);
        let next = sp.next_consumed();
        for (s, r) in sp.into_runs() {
            if s.len() + r.len() > 0 {
                self.aggregate_part(s, r, next, depth + 1, ht, sink)?;
            }
        }
        Ok(())
    }

    /// [`aggregate_part`](Self::aggregate_part) for a partition whose records fit twice in
    /// the table page beside a small table: they are copied there, scattered into `2^bits`
    /// buckets on the next hash bits, and each bucket is aggregated in a table small enough
    /// to stay in the CPU cache (instead of one big table with a cache miss per record).
    #[allow(clippy::too_many_arguments)]
    fn aggregate_part_in_cache<S: GroupSink>(
        &self,
        states: Run<'a>,
        raws: Run<'a>,
        consumed: u32,
        bits: u32,
        depth: u32,
        ht: &mut [u8],
        sink: &mut S,
    ) -> Result<()> {
        let l = self.layout;
        let (w, size) = (self.width(), l.size);
        self.counters.cache_partitions.fetch_add(1, Ordering::Relaxed);
        let estimate = states.len() + raws.len();
        let (bs, total) = (states.len() as usize * size, states.len() as usize * size + raws.len() as usize * w);
        let split = ht.len() - 2 * total;
        let (tables, scratch) = ht.split_at_mut(split);
        let (lin, scat) = scratch.split_at_mut(total);
        drain_all([states, raws], lin)?;
        let (lin_s, lin_r) = lin.split_at(bs);
        let (scat_s, scat_r) = scat.split_at_mut(bs);
        let bucket = |k: u64| (shifted(hash64(k), consumed) >> (64 - bits)) as usize;
        let key_s = |r: &[u8]| rd64(r, 0);
        let key_r = |r: &[u8]| (self.key)(raw_at(r, w));
        let off_s = scatter(lin_s, scat_s, size, bits, |r| bucket(key_s(r)));
        let off_r = scatter(lin_r, scat_r, w, bits, |r| bucket(key_r(r)));
        let mut of = Overflow::new(estimate, consumed);
        let c2 = consumed + bits;
        for b in 0..1usize << bits {
            let (ss, rs) = (&scat_s[off_s[b] * size..off_s[b + 1] * size], &scat_r[off_r[b] * w..off_r[b + 1] * w]);
            let mut table = Table::new(&mut *tables, size, ((ss.len() / size) + (rs.len() / w)) as u64);
            for r in ss.chunks_exact(size) {
                let k = key_s(r);
                self.fold_or_spill(&mut table, &mut of, false, k, shifted(hash64(k), c2), r)?;
            }
            for r in rs.chunks_exact(w) {
                let k = key_r(r);
                self.fold_or_spill(&mut table, &mut of, true, k, shifted(hash64(k), c2), r)?;
            }
            for e in table.entries() {
                sink.add(&l.group(e))?;
            }
        }
        let sub = of.finish()?;
        self.aggregate_sub(sub, depth, ht, sink)
    }

    /// Aggregates the partitions of a spill in parallel, largest first.
    fn aggregate_spill<S: GroupSink>(&self, sp: Spill<'a>, depth: u32, make_sink: &(impl Fn() -> S + Sync)) -> Result<S> {
        self.counters.partitioned(&sp, depth);
        let consumed = sp.next_consumed();
        let mut parts: Vec<(Run<'a>, Run<'a>)> = sp.into_runs().into_iter().filter(|(s, r)| s.len() + r.len() > 0).collect();
        parts.sort_by_key(|(s, r)| std::cmp::Reverse(s.len() * self.layout.size as u64 + r.len() * self.width() as u64));
        let n = parts.len();
        let queue: Vec<Mutex<Option<(Run<'a>, Run<'a>)>>> = parts.into_iter().map(|p| Mutex::new(Some(p))).collect();
        let next = AtomicUsize::new(0);
        let worker = || -> Result<S> {
            let mut sink = make_sink();
            let mut ht: Option<WorkPage<'a>> = None;
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(slot) = queue.get(i) else { return Ok(sink) };
                let Some((s, r)) = slot.lock().take() else { continue };
                if ht.is_none() {
                    ht = Some(WorkPage::alloc(self.bm, self.plan.ht)?);
                }
                let work = ht.as_mut().ok_or_else(not_temp)?;
                self.aggregate_part(s, r, consumed, depth, work.data_mut()?, &mut sink)?;
            }
        };
        run_workers(self.plan.threads.min(n).max(1), &worker)
    }
}

fn not_temp() -> Error {
    Error::Inconsistent("operator state page is not a temporary page".into())
}

/// Runs `worker` on `threads` threads (the calling thread when 1) and merges the sinks.
fn run_workers<S: GroupSink>(threads: usize, worker: &(impl Fn() -> Result<S> + Sync)) -> Result<S> {
    if threads <= 1 {
        return worker();
    }
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads).map(|_| s.spawn(worker)).collect();
        let mut out: Option<Result<S>> = None;
        for h in handles {
            let r = h.join().unwrap_or_else(|_| Err(Error::Inconsistent("aggregation worker panicked".into())));
            out = Some(match (out, r) {
                (None, r) => r,
                (Some(Err(e)), _) | (Some(Ok(_)), Err(e)) => Err(e),
                (Some(Ok(mut a)), Ok(b)) => a.merge(b).map(|()| a),
            });
        }
        out.unwrap_or_else(|| Err(Error::Inconsistent("no aggregation worker".into())))
    })
}

/// Groups the values of `column` by `key(raw)` and computes the count and the requested
/// aggregates of every group; each group is passed once to one of the sinks `make_sink`
/// creates (one per worker), which are merged and returned.
///
/// `raw` is the value's bits: a u32 zero-extended, a u64 as is, an i64 as its two's
/// complement bits (`raw as i64` is the value). Sums, minima and maxima are of the values
/// themselves. Working memory comes from the buffer manager as temporary pages: any pool that
/// holds a few pages completes, spilling through the scratch file when needed.
pub fn aggregate<K, S, M>(bm: &BufferManager, column: &Column, aggs: Aggregates, key: K, threads: usize, make_sink: M) -> Result<(S, SpillStats)>
where
    K: Fn(u64) -> u64 + Sync,
    S: GroupSink,
    M: Fn() -> S + Sync,
{
    column.check_shape(bm)?;
    let col_page = largest_page(bm, column.pages.iter().map(|p| p.page_id()));
    let plan = Plan::new(bm, col_page, threads);
    let agg = Agg { bm, column, layout: Layout::new(aggs, column.format), key, plan, counters: Counters::default() };
    let workers = plan.threads.min(column.pages.len()).max(1);
    let next = AtomicUsize::new(0);
    let shared: OnceLock<Spill<'_>> = OnceLock::new();
    let leftovers: Vec<Leftover<'_>> = if workers == 1 {
        vec![agg.preaggregate(&next, &shared)?]
    } else {
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..workers).map(|_| s.spawn(|| agg.preaggregate(&next, &shared))).collect();
            handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(Error::Inconsistent("aggregation worker panicked".into())))).collect::<Result<Vec<_>>>()
        })?
    };
    let l = agg.layout;
    let mut sink = make_sink();
    let mut it = leftovers.into_iter();
    let first = it.next().ok_or_else(|| Error::Inconsistent("no aggregation worker".into()))?;
    let rest: Vec<Leftover<'_>> = it.collect();
    let spill = match shared.into_inner() {
        Some(sp) if rest.is_empty() && !first.bypassed => {
            // One worker: its table's keys never went to the partitions; they are complete.
            let g = first.page.shared()?;
            for e in entries(g.data(), l.size, first.slots) {
                sink.add(&l.group(e))?;
            }
            Some(sp)
        }
        Some(sp) => {
            // Several workers (or one that bypassed its table), some spilled: every table
            // goes to the partitions as states.
            let mut st = Stager::new(bm, plan.stage, sp.states.fanout(), l.size)?;
            for t in std::iter::once(&first).chain(&rest) {
                let g = t.page.shared()?;
                for e in entries(g.data(), l.size, t.slots) {
                    st.push(&sp.states, sp.states.part(hash64(rd64(e, 0))), e)?;
                }
            }
            st.flush(&sp.states)?;
            Some(sp)
        }
        None => {
            // Nothing spilled: merge the tables into the first; states that find no room go
            // to partitions, so the first table's keys are complete at the end.
            let estimate = (first.len + rest.iter().map(|t| t.len).sum::<usize>()) as u64;
            let mut g0 = first.page.exclusive()?;
            let mut table = Table::attach(g0.data_mut().ok_or_else(not_temp)?, l.size, first.slots, first.len);
            let mut sub: Option<Spill<'_>> = None;
            let mut st: Option<Stager<'_>> = None;
            for t in &rest {
                let g = t.page.shared()?;
                for e in entries(g.data(), l.size, t.slots) {
                    let h = hash64(rd64(e, 0));
                    if agg.fold_state(&mut table, h, e) {
                        continue;
                    }
                    if sub.is_none() {
                        sub = Some(agg.new_spill(estimate, 0, 1)?);
                    }
                    let sp = sub.as_ref().ok_or_else(not_temp)?;
                    if st.is_none() {
                        st = Some(Stager::new(bm, plan.stage, sp.states.fanout(), l.size)?);
                    }
                    st.as_mut().ok_or_else(not_temp)?.push(&sp.states, sp.states.part(h), e)?;
                }
            }
            if let (Some(mut st), Some(sp)) = (st, sub.as_ref()) {
                st.flush(&sp.states)?;
            }
            for e in table.entries() {
                sink.add(&l.group(e))?;
            }
            sub
        }
    };
    drop(first);
    drop(rest);
    if let Some(sp) = spill {
        sink.merge(agg.aggregate_spill(sp, 1, &make_sink)?)?;
    }
    let c = &agg.counters;
    let stats = SpillStats {
        threads: workers,
        spilled_records: c.spilled.load(Ordering::Relaxed),
        partitions: c.partitions.load(Ordering::Relaxed),
        depth: c.depth.load(Ordering::Relaxed),
        cache_partitions: c.cache_partitions.load(Ordering::Relaxed),
    };
    Ok((sink, stats))
}

/// Largest modulus [`groupby_mod`] accepts (its result has one count per remainder).
pub const MAX_MODULUS: u64 = 1 << 24;

/// Result of [`groupby_mod`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct GroupbyModResult {
    /// Non-empty groups.
    pub groups: u64,
    /// `counts[r]`: values with `v mod M == r` (the non-negative remainder).
    pub counts: Vec<u64>,
}

/// Collects the groups of a worker as (remainder, count) pairs in sorted runs of temporary
/// pages; the heap holds at most one run page's worth of pairs (sorted, then written out).
struct PairRuns<'a> {
    bm: &'a BufferManager,
    run_page: u64,
    cap: usize,
    buf: Vec<u128>,
    runs: Vec<ExtRun<'a>>,
}

impl<'a> PairRuns<'a> {
    fn new(bm: &'a BufferManager, plan: SortPlan) -> PairRuns<'a> {
        let cap = ((plan.run_page as usize).saturating_sub(crate::storage::PAGE_HEADER_SIZE) / 16).max(1);
        PairRuns { bm, run_page: plan.run_page, cap, buf: Vec::new(), runs: Vec::new() }
    }

    fn flush(&mut self) -> Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        self.buf.sort_unstable();
        let mut w = RunWriter::<u128>::new(self.bm, self.run_page);
        w.extend(&self.buf)?;
        self.runs.push(w.finish());
        self.buf.clear();
        Ok(())
    }
}

impl GroupSink for PairRuns<'_> {
    fn add(&mut self, g: &Group) -> Result<()> {
        // The remainder in the high half orders the pairs by remainder.
        self.buf.push(u128::from(g.key) << 64 | u128::from(g.count));
        if self.buf.len() >= self.cap {
            self.flush()?;
        }
        Ok(())
    }
    fn merge(&mut self, mut other: Self) -> Result<()> {
        other.flush()?;
        self.runs.append(&mut other.runs);
        Ok(())
    }
}

/// The counts of a [`groupby_mod_counts`] in remainder order, merged on the fly from sorted
/// runs in temporary pages: a modulus of 2^24 needs no 128 MiB array, only pages of the pool
/// (some latched until the counts are read or this is dropped).
pub struct ModCounts<'a> {
    modulus: u64,
    groups: u64,
    /// The remainder whose count comes next.
    next: u64,
    /// The next non-empty group from the merge (remainder, count).
    ahead: Option<(u64, u64)>,
    merger: Merger<'a, u128>,
}

impl ModCounts<'_> {
    /// The modulus M: [`next_count`](Self::next_count) yields M counts.
    pub fn modulus(&self) -> u64 {
        self.modulus
    }

    /// Non-empty groups.
    pub fn groups(&self) -> u64 {
        self.groups
    }

    /// The count of the next remainder (0, 1, ..., M-1); `None` after the last.
    pub fn next_count(&mut self) -> Result<Option<u64>> {
        if self.next == self.modulus {
            return Ok(None);
        }
        if self.ahead.is_none() {
            self.ahead = self.pull()?;
        }
        let r = self.next;
        self.next += 1;
        match self.ahead {
            Some((k, c)) if k == r => {
                self.ahead = None;
                Ok(Some(c))
            }
            Some((k, _)) if k < r => Err(Error::Inconsistent(format!("group {k} of modulus {} came out of order", self.modulus))),
            _ => Ok(Some(0)),
        }
    }

    /// The next group from the merge (a second pair of the same remainder would mean an
    /// incomplete aggregation: [`next_count`](Self::next_count) reports it as out of order).
    fn pull(&mut self) -> Result<Option<(u64, u64)>> {
        let Some(first) = self.merger.next()? else { return Ok(None) };
        let key = (first >> 64) as u64;
        if key >= self.modulus {
            return Err(Error::Inconsistent(format!("remainder {key} of modulus {}", self.modulus)));
        }
        Ok(Some((key, first as u64)))
    }
}

/// Counts the values of `column` per remainder modulo `m` (`v.rem_euclid(m)` for signed
/// values), with `threads` workers; the counts are read in order from the returned
/// [`ModCounts`] (working memory in the pool, whatever `m`).
pub fn groupby_mod_counts<'a>(bm: &'a BufferManager, column: &Column, m: u64, threads: usize) -> Result<ModCounts<'a>> {
    if m == 0 {
        return Err(Error::InvalidInput("--mod must be at least 1".into()));
    }
    if m > MAX_MODULUS {
        return Err(Error::InvalidInput(format!("--mod {m} is too large: the result holds one count per remainder, at most {MAX_MODULUS}")));
    }
    let signed = column.format == ValueFormat::I64le;
    let plan = SortPlan::new(bm);
    let sink = || PairRuns::new(bm, plan);
    let (mut pairs, _) = if m.is_power_of_two() {
        // Two's complement: the low bits are the non-negative remainder for i64 too.
        let mask = m - 1;
        aggregate(bm, column, Aggregates::COUNT, move |raw| raw & mask, threads, sink)?
    } else if signed {
        let mi = m as i64;
        aggregate(bm, column, Aggregates::COUNT, move |raw| (raw as i64).rem_euclid(mi) as u64, threads, sink)?
    } else if column.format == ValueFormat::U32le {
        let m32 = m as u32;
        aggregate(bm, column, Aggregates::COUNT, move |raw| (raw as u32 % m32) as u64, threads, sink)?
    } else {
        aggregate(bm, column, Aggregates::COUNT, move |raw| raw % m, threads, sink)?
    };
    pairs.flush()?;
    // Every group is complete after the aggregation: one pair per non-empty remainder.
    let groups = pairs.runs.iter().map(|r| r.len()).sum();
    let merger = Merger::new(bm, std::mem::take(&mut pairs.runs), plan, plan.fan_in(plan.budget), false)?;
    Ok(ModCounts { modulus: m, groups, next: 0, ahead: None, merger })
}

/// [`groupby_mod_counts`] with the counts collected into a vector (`m` x 8 bytes of heap).
pub fn groupby_mod(bm: &BufferManager, column: &Column, m: u64, threads: usize) -> Result<GroupbyModResult> {
    let mut it = groupby_mod_counts(bm, column, m, threads)?;
    let mut counts = Vec::with_capacity(m as usize);
    while let Some(c) = it.next_count()? {
        counts.push(c);
    }
    Ok(GroupbyModResult { groups: it.groups(), counts })
}

/// Result of [`distinct`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DistinctResult {
    /// Distinct values.
    pub groups: u64,
    /// The most frequent value, the smallest on ties (`None` for an empty column).
    pub top_value: Option<i128>,
    /// Its count (0 for an empty column).
    pub top_count: u64,
}

struct TopSink {
    signed: bool,
    r: DistinctResult,
}

impl TopSink {
    fn offer(&mut self, value: i128, count: u64) {
        let better = match self.r.top_value {
            None => true,
            Some(v) => count > self.r.top_count || (count == self.r.top_count && value < v),
        };
        if better {
            self.r.top_value = Some(value);
            self.r.top_count = count;
        }
    }
}

impl GroupSink for TopSink {
    fn add(&mut self, g: &Group) -> Result<()> {
        self.r.groups += 1;
        let v = if self.signed { g.key as i64 as i128 } else { g.key as i128 };
        self.offer(v, g.count);
        Ok(())
    }
    fn merge(&mut self, other: Self) -> Result<()> {
        self.r.groups += other.r.groups;
        if let Some(v) = other.r.top_value {
            self.offer(v, other.r.top_count);
        }
        Ok(())
    }
}

/// Counts the distinct values of `column` and finds the most frequent one (the smallest on
/// ties), with `threads` workers.
pub fn distinct(bm: &BufferManager, column: &Column, threads: usize) -> Result<DistinctResult> {
    let signed = column.format == ValueFormat::I64le;
    let (sink, _) = aggregate(bm, column, Aggregates::COUNT, |raw| raw, threads, || TopSink { signed, r: DistinctResult::default() })?;
    Ok(sink.r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Config;
    use std::collections::HashMap;

    #[derive(Debug)]
    struct All(Vec<Group>);
    impl GroupSink for All {
        fn add(&mut self, g: &Group) -> Result<()> {
            self.0.push(*g);
            Ok(())
        }
        fn merge(&mut self, other: Self) -> Result<()> {
            self.0.extend(other.0);
            Ok(())
        }
    }

    fn column(bm: &BufferManager, format: ValueFormat, raw: &[u64]) -> Column {
        let bytes: Vec<u8> =
            raw.iter().flat_map(|&v| if format == ValueFormat::U32le { (v as u32).to_le_bytes().to_vec() } else { v.to_le_bytes().to_vec() }).collect();
        let mut col = Column::new(format);
        col.append(bm, &mut &bytes[..], bytes.len() as u64, &mut |_| {}).unwrap();
        col
    }

    fn reference(format: ValueFormat, raw: &[u64], key: impl Fn(u64) -> u64) -> HashMap<u64, Group> {
        let l = Layout::new(Aggregates::ALL, format);
        let mut m: HashMap<u64, Group> = HashMap::new();
        for &r in raw {
            let v = l.value(r);
            let g = m.entry(key(r)).or_insert(Group { key: key(r), count: 0, sum: 0, min: v, max: v });
            g.count += 1;
            g.sum += v;
            g.min = g.min.min(v);
            g.max = g.max.max(v);
        }
        m
    }

    #[test]
    fn aggregates_match_a_hashmap_in_memory_and_spilled() {
        for (pool, n, distinct, threads) in [(8u64 << 20, 20_000u64, 300u64, 1usize), (512 << 10, 60_000, 50_000, 2), (512 << 10, 60_000, 7, 3)] {
            let dir = tempfile::tempdir().unwrap();
            let bm = BufferManager::create(Config::new(dir.path().join("db")).min_page(4096).pool_size(pool)).unwrap();
            for format in [ValueFormat::U32le, ValueFormat::U64le, ValueFormat::I64le] {
                let raw: Vec<u64> = (0..n)
                    .map(|i| {
                        let k = hash64(i) % distinct;
                        match format {
                            ValueFormat::U32le => k * 7919 % (1 << 32),
                            ValueFormat::U64le => k.wrapping_mul(0x1234_5678_9abc_def1),
                            ValueFormat::I64le => ((k as i64 - distinct as i64 / 2) * 1_000_000_007) as u64,
                        }
                    })
                    .collect();
                let col = column(&bm, format, &raw);
                let key = |r: u64| r % 1000;
                let (all, stats) = aggregate(&bm, &col, Aggregates::ALL, key, threads, || All(Vec::new())).unwrap();
                let want = reference(format, &raw, key);
                assert_eq!(all.0.len(), want.len(), "{format:?} pool {pool}: one group per key");
                for g in &all.0 {
                    assert_eq!(Some(g), want.get(&g.key), "{format:?}");
                }
                let (all, stats2) = aggregate(&bm, &col, Aggregates { sum: false, min: true, max: false }, |r| r, threads, || All(Vec::new())).unwrap();
                let want = reference(format, &raw, |r| r);
                assert_eq!(all.0.len(), want.len());
                for g in &all.0 {
                    let w = want[&g.key];
                    assert_eq!((g.count, g.min, g.sum, g.max), (w.count, w.min, 0, 0));
                }
                if distinct > 10_000 {
                    assert!(stats2.spilled_records > 0 && stats2.depth >= 1, "{stats2:?}");
                }
                let _ = stats;
                assert!(bm.peak_bytes() <= pool);
            }
            assert_eq!(crate::testutil::temp_pages(&bm), 0, "temporary pages freed");
            bm.check_invariants().unwrap();
        }
    }

    #[test]
    fn large_partitions_are_aggregated_in_cache_sized_buckets() {
        let dir = tempfile::tempdir().unwrap();
        let pool = 16 << 20;
        let bm = BufferManager::create(Config::new(dir.path().join("db")).min_page(4096).pool_size(pool)).unwrap();
        let raw: Vec<u64> = (0..600_000u64).map(|i| hash64(i) % 400_000).collect();
        let col = column(&bm, ValueFormat::U64le, &raw);
        let want = reference(ValueFormat::U64le, &raw, |r| r);
        for threads in [1, 2] {
            let aggs = Aggregates { sum: true, min: false, max: true };
            let (all, stats) = aggregate(&bm, &col, aggs, |r| r, threads, || All(Vec::new())).unwrap();
            // One worker: a 4 MiB table page, 4 partitions of ~100 K records.
            assert!(stats.spilled_records > 0 && (threads > 1 || stats.cache_partitions > 0), "{stats:?}");
            assert_eq!(all.0.len(), want.len());
            for g in &all.0 {
                let w = want[&g.key];
                assert_eq!((g.count, g.sum, g.max, g.min), (w.count, w.sum, w.max, 0));
            }
        }
        assert!(bm.peak_bytes() <= pool);
        let mut dst = vec![0u8; 8 * 1000];
        let src: Vec<u8> = (0..1000u64).flat_map(|v| v.to_le_bytes()).collect();
        let start = scatter(&src, &mut dst, 8, 3, |r| (rd64(r, 0) % 8) as usize);
        assert_eq!(start.len(), 9);
        for b in 0..8 {
            assert!(dst[start[b] * 8..start[b + 1] * 8].chunks_exact(8).all(|r| rd64(r, 0) % 8 == b as u64));
        }
    }

    #[test]
    fn cache_buckets_that_overflow_spill_to_sub_partitions() {
        let dir = tempfile::tempdir().unwrap();
        let bm = BufferManager::create(Config::new(dir.path().join("db")).min_page(4096).pool_size(4 << 20)).unwrap();
        let col = Column::new(ValueFormat::U64le);
        let agg = Agg {
            bm: &bm,
            column: &col,
            layout: Layout::new(Aggregates::ALL, col.format),
            key: |r: u64| r / 2,
            plan: Plan::new(&bm, 0, 1),
            counters: Counters::default(),
        };
        let l = agg.layout;
        // 20 000 raw values (10 000 keys) and 3 000 states (of keys 0..3000, count 2, sum 10).
        let mut raws = Run::new(&bm, 8, 4096);
        let raw: Vec<u64> = (0..20_000u64).collect();
        for v in &raw {
            raws.append(&v.to_le_bytes()).unwrap();
        }
        let mut states = Run::new(&bm, l.size, 4096);
        for k in 0..3000u64 {
            let mut e = vec![0u8; l.size];
            wr64(&mut e, 0, k);
            l.init(&mut e);
            l.fold(&mut e, 2, 10, l.ord(1), l.ord(9));
            states.append(&e).unwrap();
        }
        let bytes = 20_000 * 8 + 3000 * l.size;
        let mut ht = vec![0u8; 2 * bytes + (16 << 10)];
        let mut sink = All(Vec::new());
        agg.aggregate_part_in_cache(states, raws, 0, 1, 0, &mut ht, &mut sink).unwrap();
        assert!(agg.counters.partitions.load(Ordering::Relaxed) > 0, "buckets overflowed into sub-partitions");
        let mut want = reference(col.format, &raw, |r| r / 2);
        for k in 0..3000u64 {
            let g = want.get_mut(&k).unwrap();
            g.count += 2;
            g.sum += 10;
            g.min = g.min.min(1);
            g.max = g.max.max(9);
        }
        assert_eq!(sink.0.len(), want.len());
        for g in &sink.0 {
            assert_eq!(Some(g), want.get(&g.key));
        }
        assert_eq!(crate::testutil::temp_pages(&bm), 0);
    }

    #[test]
    fn groupby_mod_and_distinct_on_signed_values() {
        let dir = tempfile::tempdir().unwrap();
        let bm = BufferManager::create(Config::new(dir.path().join("db")).min_page(4096).pool_size(1 << 20)).unwrap();
        let vals: Vec<i64> = vec![-7, -7, 3, 3, -1, 0, 5, i64::MIN, i64::MAX];
        let col = column(&bm, ValueFormat::I64le, &vals.iter().map(|&v| v as u64).collect::<Vec<_>>());
        for m in [1u64, 2, 3, 4, 10] {
            let r = groupby_mod(&bm, &col, m, 2).unwrap();
            let mut want = vec![0u64; m as usize];
            for &v in &vals {
                want[v.rem_euclid(m as i64) as usize] += 1;
            }
            assert_eq!(r.counts, want, "mod {m}");
            assert_eq!(r.groups, want.iter().filter(|&&c| c > 0).count() as u64);
        }
        assert!(groupby_mod(&bm, &col, 0, 1).is_err());
        assert!(groupby_mod(&bm, &col, MAX_MODULUS + 1, 1).is_err());
        let d = distinct(&bm, &col, 1).unwrap();
        assert_eq!(d, DistinctResult { groups: 7, top_value: Some(-7), top_count: 2 });
        let empty = Column::new(ValueFormat::U32le);
        assert_eq!(distinct(&bm, &empty, 4).unwrap(), DistinctResult::default());
        assert_eq!(groupby_mod(&bm, &empty, 5, 4).unwrap(), GroupbyModResult { groups: 0, counts: vec![0; 5] });
    }
}
