//! Equi-join of two columns on value: the number of matching pairs and the wrapping sum of
//! the matched values over all pairs (`strata query join A B`).
//!
//! Only counts leave the join, so a hash table maps each build value to its multiplicity:
//! its size is the number of *distinct* build values, however many duplicates there are.
//!
//! * **In memory** (build side's distinct values fit one table of about half the pool):
//!   the smaller column is folded into a table in one temporary page; then `threads` workers
//!   take probe pages (morsels) and look every value up, all holding the table shared.
//! * **Grace** (the table overflows): both columns are hash-partitioned in parallel into runs
//!   of temporary pages ([`super::spill`]); partition pairs are joined in parallel, building
//!   on the smaller side of each pair. A pair whose build side's distinct values still do not
//!   fit is partitioned again on the next hash bits, recursively. A value with a huge
//!   multiplicity takes one table entry, so duplicates never cause recursion; distinct values
//!   are always separated eventually (the hash is a bijection). A pair that fits its table
//!   page twice is copied there and scattered into buckets joined with cache-sized tables.
//!   (The first in-memory attempt reads the build column until its table overflows: with
//!   many distinct values that is soon; with heavy duplicates the table fits.)
//!
//! Values compare mathematically across formats: an i64 column joined with a u32/u64
//! column matches only on values both can hold.

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};

use parking_lot::Mutex;
use serde::Serialize;

use super::spill::{
    cache_bits, drain_all, for_each_raw, hash64, largest_page, payload_of, rd64, scatter, shifted, table_capacity, wr64, Partitions, Plan, Run, Stager, Table,
    WorkPage, CACHE_KEYS,
};
use crate::access::{Column, ValueFormat};
use crate::buffer::BufferManager;
use crate::error::{Error, Result};

/// Result of [`join_count`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct JoinResult {
    /// Pairs `(a, b)` with `a == b`.
    pub matches: u128,
    /// Sum of the matched value over all pairs, mod 2^64 (i64 values as two's complement).
    pub checksum: u64,
}

impl JoinResult {
    #[inline]
    fn add(&mut self, key: u64, count: u64) {
        self.matches += count as u128;
        self.checksum = self.checksum.wrapping_add(key.wrapping_mul(count));
    }
    fn merge(&mut self, o: JoinResult) {
        self.matches += o.matches;
        self.checksum = self.checksum.wrapping_add(o.checksum);
    }
}

/// How a join ran (for tests and diagnostics).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct JoinStats {
    /// Worker threads.
    pub threads: usize,
    /// Whether the build side fitted one table (no partitioning).
    pub in_memory: bool,
    /// Partitions created (all levels, both sides count once).
    pub partitions: u64,
    /// Records written to partitions (all levels, both sides).
    pub spilled_records: u64,
    /// Deepest partitioning level.
    pub depth: u32,
    /// Partition pairs joined in cache-sized buckets.
    pub cache_partitions: u64,
}

const ENTRY: usize = 16;
const SIGN: u64 = 1 << 63;

/// The join key of a raw value, or `None` if it cannot match any value of the other side.
#[inline]
fn key_of(format: ValueFormat, mixed: bool, raw: u64) -> Option<u64> {
    if mixed {
        // One side signed, the other unsigned: only 0..2^63 is common to both.
        match format {
            ValueFormat::I64le if raw & SIGN != 0 => return None,
            ValueFormat::U64le if raw >= SIGN => return None,
            _ => {}
        }
    }
    Some(raw)
}

#[inline]
fn rd_key(r: &[u8], width: usize) -> u64 {
    if width == 4 {
        u32::from_le_bytes([r[0], r[1], r[2], r[3]]) as u64
    } else {
        rd64(r, 0)
    }
}

struct Join<'a> {
    bm: &'a BufferManager,
    plan: Plan,
    /// Record width in partitions: 4 when both columns are u32, else 8.
    width: usize,
    mixed: bool,
    spilled: AtomicU64,
    partitions: AtomicU64,
    depth: AtomicU32,
    cache_partitions: AtomicU64,
}

impl<'a> Join<'a> {
    fn counted(&self, parts: &Partitions<'_>, depth: u32) {
        self.spilled.fetch_add(parts.records(), Ordering::Relaxed);
        self.partitions.fetch_add(parts.fanout() as u64, Ordering::Relaxed);
        self.depth.fetch_max(depth, Ordering::Relaxed);
    }

    /// Folds `build` into one table; returns the table page and its slots, or `None` if its
    /// distinct values do not fit.
    fn build_in_memory(&self, build: &Column) -> Result<Option<(crate::access::TempPage<'a>, usize)>> {
        let mut work = WorkPage::alloc(self.bm, self.plan.shared_ht())?;
        let mut table = Table::new(work.data_mut()?, ENTRY, build.count);
        let mut ok = true;
        for cp in &build.pages {
            let g = self.bm.fix_shared(cp.page_id())?;
            for_each_raw(build.format, g.data(), cp.count as usize, |raw| {
                if !ok {
                    return Ok(());
                }
                if let Some(k) = key_of(build.format, self.mixed, raw) {
                    match table.upsert(k, hash64(k)) {
                        Some((o, _)) => {
                            let c = rd64(table.view(), o + 8);
                            wr64(table.bytes(), o + 8, c + 1);
                        }
                        None => ok = false,
                    }
                }
                Ok(())
            })?;
            if !ok {
                return Ok(None);
            }
        }
        let slots = table.slots();
        Ok(Some((work.unlatch(), slots)))
    }

    /// Probes `probe` against the table in `page` with the workers.
    fn probe_in_memory(&self, probe: &Column, page: &crate::access::TempPage<'a>, slots: usize) -> Result<JoinResult> {
        let next = AtomicUsize::new(0);
        let worker = || -> Result<JoinResult> {
            let mut acc = JoinResult::default();
            let ht = page.shared()?;
            let d = ht.data();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(cp) = probe.pages.get(i) else { return Ok(acc) };
                let g = self.bm.fix_shared(cp.page_id())?;
                for_each_raw(probe.format, g.data(), cp.count as usize, |raw| {
                    if let Some(k) = key_of(probe.format, self.mixed, raw) {
                        if let Some(o) = super::spill::lookup(d, ENTRY, slots, k, hash64(k)) {
                            acc.add(k, rd64(d, o + 8));
                        }
                    }
                    Ok(())
                })?;
            }
        };
        run_workers(self.plan.threads.min(probe.pages.len()).max(1), &worker)
    }

    /// Hash-partitions the values of `col` into `parts` with the workers.
    fn partition_column(&self, col: &Column, parts: &Partitions<'a>) -> Result<()> {
        let next = AtomicUsize::new(0);
        let w = self.width;
        let worker = || -> Result<JoinResult> {
            let mut st = Stager::new(self.bm, self.plan.stage, parts.fanout(), w)?;
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(cp) = col.pages.get(i) else { break };
                let g = self.bm.fix_shared(cp.page_id())?;
                for_each_raw(col.format, g.data(), cp.count as usize, |raw| {
                    if let Some(k) = key_of(col.format, self.mixed, raw) {
                        st.push(parts, parts.part(hash64(k)), &k.to_le_bytes()[..w])?;
                    }
                    Ok(())
                })?;
            }
            st.flush(parts)?;
            Ok(JoinResult::default())
        };
        run_workers(self.plan.threads.min(col.pages.len()).max(1), &worker).map(|_| ())
    }

    /// Moves the records of `run` into `parts` (freeing the run as it is read).
    fn repartition(&self, run: Run<'a>, parts: &Partitions<'a>) -> Result<()> {
        let w = self.width;
        let mut st = Stager::new(self.bm, self.plan.stage, parts.fanout(), w)?;
        run.drain(|chunk| {
            for r in chunk.chunks_exact(w) {
                st.push(parts, parts.part(hash64(rd_key(r, w))), r)?;
            }
            Ok(())
        })?;
        st.flush(parts)
    }

    /// Joins one pair of partitions whose keys share the top `consumed` hash bits.
    fn join_pair(&self, a: Run<'a>, b: Run<'a>, consumed: u32, depth: u32, ht: &mut [u8], acc: &mut JoinResult) -> Result<()> {
        if a.len() == 0 || b.len() == 0 {
            return Ok(());
        }
        let w = self.width;
        let (build, probe) = if a.len() <= b.len() { (a, b) } else { (b, a) };
        let bits = cache_bits(build.len());
        let bytes = (build.len() + probe.len()) as usize * w;
        // Room for both sides' records twice plus a table of 4 * CACHE_KEYS slots.
        if bits > 0 && consumed + bits < 64 && 2 * bytes + 4 * CACHE_KEYS as usize * ENTRY <= ht.len() {
            return self.join_pair_in_cache(build, probe, consumed, bits, depth, ht, acc);
        }
        {
            let mut table = Table::new(&mut *ht, ENTRY, build.len());
            let fits = build.for_each(|chunk| {
                for r in chunk.chunks_exact(w) {
                    let k = rd_key(r, w);
                    match table.upsert(k, shifted(hash64(k), consumed)) {
                        Some((o, _)) => {
                            let c = rd64(table.view(), o + 8);
                            wr64(table.bytes(), o + 8, c + 1);
                        }
                        None => return false,
                    }
                }
                true
            })?;
            if fits {
                drop(build);
                let table = &table;
                return probe.drain(|chunk| {
                    for r in chunk.chunks_exact(w) {
                        let k = rd_key(r, w);
                        if let Some(o) = table.get(k, shifted(hash64(k), consumed)) {
                            acc.add(k, rd64(table.view(), o + 8));
                        }
                    }
                    Ok(())
                });
            }
        }
        // The build side's distinct values do not fit: split both sides on the next bits.
        let entries = table_capacity(ht.len(), ENTRY);
        let sets = self.plan.threads;
        let bits = self.plan.fanout_bits(build.len(), entries, w, sets, consumed)?;
        let run_page = self.plan.run_page(1 << bits, sets);
        let pb = Partitions::new(self.bm, w, consumed, bits, run_page);
        self.repartition(build, &pb)?;
        let pp = Partitions::new(self.bm, w, consumed, bits, run_page);
        self.repartition(probe, &pp)?;
        self.counted(&pb, depth + 1);
        self.spilled.fetch_add(pp.records(), Ordering::Relaxed);
        for (x, y) in pb.into_runs().into_iter().zip(pp.into_runs()) {
            self.join_pair(x, y, consumed + bits, depth + 1, ht, acc)?;
        }
        Ok(())
    }

    /// [`join_pair`](Self::join_pair) for a pair whose records fit twice in the table page
    /// beside a small table: both sides are copied there and scattered into `2^bits` buckets
    /// on the next hash bits; each bucket is joined with a table that stays in the CPU cache.
    #[allow(clippy::too_many_arguments)]
    fn join_pair_in_cache(&self, build: Run<'a>, probe: Run<'a>, consumed: u32, bits: u32, depth: u32, ht: &mut [u8], acc: &mut JoinResult) -> Result<()> {
        let w = self.width;
        self.cache_partitions.fetch_add(1, Ordering::Relaxed);
        let (records, page_len) = (build.len(), ht.len());
        let nb = build.len() as usize * w;
        let total = nb + probe.len() as usize * w;
        let split = ht.len() - 2 * total;
        let (tables, scratch) = ht.split_at_mut(split);
        let (lin, scat) = scratch.split_at_mut(total);
        drain_all([build, probe], lin)?;
        let (lin_b, lin_p) = lin.split_at(nb);
        let (scat_b, scat_p) = scat.split_at_mut(nb);
        let bucket = |r: &[u8]| (shifted(hash64(rd_key(r, w)), consumed) >> (64 - bits)) as usize;
        let off_b = scatter(lin_b, scat_b, w, bits, bucket);
        let off_p = scatter(lin_p, scat_p, w, bits, bucket);
        let c2 = consumed + bits;
        // Buckets whose distinct build values do not fit (only with extreme skew) are
        // partitioned again, both sides.
        let mut spill: Option<(Partitions<'a>, Partitions<'a>, Stager<'a>, Stager<'a>)> = None;
        for b in 0..1usize << bits {
            let bs = &scat_b[off_b[b] * w..off_b[b + 1] * w];
            let ps = &scat_p[off_p[b] * w..off_p[b + 1] * w];
            if bs.is_empty() || ps.is_empty() {
                continue;
            }
            let mut table = Table::new(&mut *tables, ENTRY, (bs.len() / w) as u64);
            let mut fits = true;
            for r in bs.chunks_exact(w) {
                let k = rd_key(r, w);
                match table.upsert(k, shifted(hash64(k), c2)) {
                    Some((o, _)) => {
                        let c = rd64(table.view(), o + 8);
                        wr64(table.bytes(), o + 8, c + 1);
                    }
                    None => {
                        fits = false;
                        break;
                    }
                }
            }
            if fits {
                for r in ps.chunks_exact(w) {
                    let k = rd_key(r, w);
                    if let Some(o) = table.get(k, shifted(hash64(k), c2)) {
                        acc.add(k, rd64(table.view(), o + 8));
                    }
                }
                continue;
            }
            if spill.is_none() {
                let sets = self.plan.threads;
                let sub_bits = self.plan.fanout_bits(records, table_capacity(page_len, ENTRY), w, sets, consumed)?;
                let run_page = self.plan.run_page(1 << sub_bits, sets);
                let pb = Partitions::new(self.bm, w, consumed, sub_bits, run_page);
                let pp = Partitions::new(self.bm, w, consumed, sub_bits, run_page);
                let sb = Stager::new(self.bm, self.plan.stage, pb.fanout(), w)?;
                let sp = Stager::new(self.bm, self.plan.stage, pp.fanout(), w)?;
                spill = Some((pb, pp, sb, sp));
            }
            let (pb, pp, sb, sp) = spill.as_mut().ok_or_else(|| Error::Inconsistent("no spill".into()))?;
            for r in bs.chunks_exact(w) {
                sb.push(pb, pb.part(hash64(rd_key(r, w))), r)?;
            }
            for r in ps.chunks_exact(w) {
                sp.push(pp, pp.part(hash64(rd_key(r, w))), r)?;
            }
        }
        let Some((pb, pp, mut sb, mut sp)) = spill else { return Ok(()) };
        sb.flush(&pb)?;
        sp.flush(&pp)?;
        drop((sb, sp));
        self.counted(&pb, depth + 1);
        self.spilled.fetch_add(pp.records(), Ordering::Relaxed);
        let next = pb.consumed + pb.bits;
        for (x, y) in pb.into_runs().into_iter().zip(pp.into_runs()) {
            self.join_pair(x, y, next, depth + 1, ht, acc)?;
        }
        Ok(())
    }

    /// Partitions both columns and joins the pairs in parallel.
    fn grace(&self, build: &Column, probe: &Column) -> Result<JoinResult> {
        let w = self.width;
        let entries = table_capacity(payload_of(self.plan.ht), ENTRY);
        let bits = self.plan.fanout_bits(build.count, entries, w, 1, 0)?;
        let run_page = self.plan.run_page(1 << bits, 1);
        let pb = Partitions::new(self.bm, w, 0, bits, run_page);
        self.partition_column(build, &pb)?;
        let pp = Partitions::new(self.bm, w, 0, bits, run_page);
        self.partition_column(probe, &pp)?;
        self.counted(&pb, 1);
        self.spilled.fetch_add(pp.records(), Ordering::Relaxed);
        let mut pairs: Vec<(Run<'a>, Run<'a>)> = pb.into_runs().into_iter().zip(pp.into_runs()).filter(|(x, y)| x.len() > 0 && y.len() > 0).collect();
        pairs.sort_by_key(|(x, y)| std::cmp::Reverse(x.len() + y.len()));
        let n = pairs.len();
        let queue: Vec<Mutex<Option<(Run<'a>, Run<'a>)>>> = pairs.into_iter().map(|p| Mutex::new(Some(p))).collect();
        let next = AtomicUsize::new(0);
        let worker = || -> Result<JoinResult> {
            let mut acc = JoinResult::default();
            let mut ht: Option<WorkPage<'a>> = None;
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(slot) = queue.get(i) else { return Ok(acc) };
                let Some((x, y)) = slot.lock().take() else { continue };
                if ht.is_none() {
                    ht = Some(WorkPage::alloc(self.bm, self.plan.ht)?);
                }
                let work = ht.as_mut().ok_or_else(|| Error::Inconsistent("no table page".into()))?;
                self.join_pair(x, y, bits, 1, work.data_mut()?, &mut acc)?;
            }
        };
        run_workers(self.plan.threads.min(n).max(1), &worker)
    }
}

fn run_workers(threads: usize, worker: &(impl Fn() -> Result<JoinResult> + Sync)) -> Result<JoinResult> {
    if threads <= 1 {
        return worker();
    }
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads).map(|_| s.spawn(worker)).collect();
        let mut acc = JoinResult::default();
        let mut err = None;
        for h in handles {
            match h.join().unwrap_or_else(|_| Err(Error::Inconsistent("join worker panicked".into()))) {
                Ok(r) => acc.merge(r),
                Err(e) => {
                    err.get_or_insert(e);
                }
            }
        }
        err.map_or(Ok(acc), Err)
    })
}

/// Joins `a` and `b` on value: counts the pairs `(x, y)` with `x == y` and sums the matched
/// values over all pairs (wrapping), with `threads` workers. Builds on the smaller column;
/// working memory comes from the buffer manager as temporary pages (any pool that holds a
/// few pages completes, spilling through the scratch file when needed).
pub fn join_count(bm: &BufferManager, a: &Column, b: &Column, threads: usize) -> Result<JoinResult> {
    join_count_with_stats(bm, a, b, threads).map(|(r, _)| r)
}

/// [`join_count`], also reporting how it ran.
pub fn join_count_with_stats(bm: &BufferManager, a: &Column, b: &Column, threads: usize) -> Result<(JoinResult, JoinStats)> {
    a.check_shape(bm)?;
    b.check_shape(bm)?;
    let (build, probe) = if a.count <= b.count { (a, b) } else { (b, a) };
    let col_page = largest_page(bm, a.pages.iter().chain(&b.pages).map(|p| p.page_id()));
    let plan = Plan::new(bm, col_page, threads);
    let width = if a.format == ValueFormat::U32le && b.format == ValueFormat::U32le { 4 } else { 8 };
    let mixed = (a.format == ValueFormat::I64le) != (b.format == ValueFormat::I64le);
    let join = Join {
        bm,
        plan,
        width,
        mixed,
        spilled: AtomicU64::new(0),
        partitions: AtomicU64::new(0),
        depth: AtomicU32::new(0),
        cache_partitions: AtomicU64::new(0),
    };
    let mut stats = JoinStats { threads: plan.threads, ..Default::default() };
    if build.count == 0 || probe.count == 0 {
        stats.in_memory = true;
        return Ok((JoinResult::default(), stats));
    }
    let result = match join.build_in_memory(build)? {
        Some((page, slots)) => {
            stats.in_memory = true;
            join.probe_in_memory(probe, &page, slots)?
        }
        None => join.grace(build, probe)?,
    };
    stats.partitions = join.partitions.load(Ordering::Relaxed);
    stats.spilled_records = join.spilled.load(Ordering::Relaxed);
    stats.depth = join.depth.load(Ordering::Relaxed);
    stats.cache_partitions = join.cache_partitions.load(Ordering::Relaxed);
    Ok((result, stats))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Config;
    use std::collections::HashMap;

    fn column(bm: &BufferManager, format: ValueFormat, raw: &[u64]) -> Column {
        let bytes: Vec<u8> =
            raw.iter().flat_map(|&v| if format == ValueFormat::U32le { (v as u32).to_le_bytes().to_vec() } else { v.to_le_bytes().to_vec() }).collect();
        let mut col = Column::new(format);
        col.append(bm, &mut &bytes[..], bytes.len() as u64, &mut |_| {}).unwrap();
        col
    }

    fn value(format: ValueFormat, raw: u64) -> i128 {
        if format == ValueFormat::I64le {
            raw as i64 as i128
        } else {
            raw as i128
        }
    }

    fn reference(fa: ValueFormat, a: &[u64], fb: ValueFormat, b: &[u64]) -> JoinResult {
        let mut m: HashMap<i128, u64> = HashMap::new();
        for &r in b {
            *m.entry(value(fb, r)).or_default() += 1;
        }
        let mut out = JoinResult::default();
        for &r in a {
            if let Some(&c) = m.get(&value(fa, r)) {
                out.add(value(fa, r) as u64, c);
            }
        }
        out
    }

    #[test]
    fn joins_match_a_hashmap_in_memory_and_partitioned() {
        for (pool, n, distinct, threads, spills) in
            [(4u64 << 20, 5_000u64, 1_000u64, 2usize, false), (512 << 10, 60_000, 40_000, 2, true), (512 << 10, 60_000, 3, 1, false)]
        {
            let dir = tempfile::tempdir().unwrap();
            let bm = BufferManager::create(Config::new(dir.path().join("db")).min_page(4096).pool_size(pool)).unwrap();
            for format in [ValueFormat::U32le, ValueFormat::U64le, ValueFormat::I64le] {
                let gen = |seed: u64, n: u64| -> Vec<u64> {
                    (0..n)
                        .map(|i| {
                            let k = hash64(i ^ (seed << 40)) % distinct;
                            if format == ValueFormat::I64le {
                                (k as i64 - distinct as i64 / 2) as u64
                            } else {
                                k * 3
                            }
                        })
                        .collect()
                };
                let a = gen(1, n);
                let b = gen(2, n / 2);
                let (ca, cb) = (column(&bm, format, &a), column(&bm, format, &b));
                let (r, stats) = join_count_with_stats(&bm, &ca, &cb, threads).unwrap();
                assert_eq!(r, reference(format, &a, format, &b), "{format:?} pool {pool} {stats:?}");
                assert_eq!(stats.in_memory, !spills, "{stats:?}");
                assert!(bm.peak_bytes() <= pool);
            }
            assert_eq!(crate::testutil::temp_pages(&bm), 0, "temporary pages freed");
            bm.check_invariants().unwrap();
        }
    }

    #[test]
    fn cache_buckets_that_overflow_are_partitioned_again() {
        let dir = tempfile::tempdir().unwrap();
        let bm = BufferManager::create(Config::new(dir.path().join("db")).min_page(4096).pool_size(4 << 20)).unwrap();
        let join = Join {
            bm: &bm,
            plan: Plan::new(&bm, 0, 1),
            width: 8,
            mixed: false,
            spilled: AtomicU64::new(0),
            partitions: AtomicU64::new(0),
            depth: AtomicU32::new(0),
            cache_partitions: AtomicU64::new(0),
        };
        let (mut a, mut b) = (Run::new(&bm, 8, 4096), Run::new(&bm, 8, 4096));
        let (av, bv): (Vec<u64>, Vec<u64>) = ((0..10_000u64).map(|i| i * 3).collect(), (0..12_000u64).map(|i| i * 2 % 15_000).collect());
        for v in &av {
            a.append(&v.to_le_bytes()).unwrap();
        }
        for v in &bv {
            b.append(&v.to_le_bytes()).unwrap();
        }
        // Scratch for both sides twice plus a 16 KiB table area: ~700 entries per bucket
        // table, 5 000 distinct build values per bucket.
        let mut ht = vec![0u8; 2 * 22_000 * 8 + (16 << 10)];
        let mut acc = JoinResult::default();
        join.join_pair_in_cache(a, b, 0, 1, 1, &mut ht, &mut acc).unwrap();
        assert!(join.partitions.load(Ordering::Relaxed) > 0, "the overflowing buckets were partitioned");
        assert_eq!(acc, reference(ValueFormat::U64le, &av, ValueFormat::U64le, &bv));
        assert_eq!(crate::testutil::temp_pages(&bm), 0);
    }

    #[test]
    fn mixed_formats_match_on_common_values_only() {
        let dir = tempfile::tempdir().unwrap();
        let bm = BufferManager::create(Config::new(dir.path().join("db")).min_page(4096).pool_size(1 << 20)).unwrap();
        let s: Vec<u64> = [-1i64, 0, 5, 5, i64::MAX, -5].iter().map(|&v| v as u64).collect();
        let u: Vec<u64> = vec![u64::MAX, 0, 5, i64::MAX as u64, 1 << 63];
        let cs = column(&bm, ValueFormat::I64le, &s);
        let cu = column(&bm, ValueFormat::U64le, &u);
        let c32 = column(&bm, ValueFormat::U32le, &[5, 0, 7, u32::MAX as u64]);
        assert_eq!(join_count(&bm, &cs, &cu, 1).unwrap(), reference(ValueFormat::I64le, &s, ValueFormat::U64le, &u));
        assert_eq!(join_count(&bm, &cu, &cs, 2).unwrap().matches, 4);
        assert_eq!(join_count(&bm, &c32, &cs, 1).unwrap(), JoinResult { matches: 3, checksum: 10 });
        assert_eq!(join_count(&bm, &c32, &cu, 1).unwrap(), JoinResult { matches: 2, checksum: 5 });
        let empty = Column::new(ValueFormat::U32le);
        assert_eq!(join_count(&bm, &empty, &c32, 3).unwrap(), JoinResult::default());
    }
}
