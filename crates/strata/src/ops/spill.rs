//! Building blocks for operators whose state may outgrow the pool: all of it lives in
//! temporary pages (one budget with the cached data; written to the scratch file when
//! evicted).
//!
//! * [`Plan`]: page sizes and thread count derived from the pool, so that the pages a query
//!   keeps latched stay within half of it whatever the pool (a few MiB or many GiB).
//! * [`Table`]: an open-addressing hash table (linear probing) over the `&mut [u8]` payload
//!   of one temporary page. Entries start with a `u64` key and a `u64` count; a zero count
//!   marks an empty slot.
//! * [`Run`], [`Partitions`], [`Stager`]: hash partitions of fixed-size records. A run is a
//!   list of temporary pages whose last page may be partial; between appends **no page of a
//!   run is latched**, so any number of partitions coexist in a small pool (an evicted tail
//!   is loaded back when appended to). Records reach the runs through a [`Stager`], one
//!   temporary page per writer cut into a slot per partition, flushed a slot at a time.
//!
//! Hashing: [`hash64`] is a bijection (the MurmurHash3 finaliser), so distinct keys have
//! distinct hashes. A partition at depth `d` is defined by the top `consumed` bits of the
//! hash; its tables and its own sub-partitions use the bits below (`h << consumed`). Every
//! level of partitioning consumes at least one bit, so recursion ends: once all 64 bits are
//! consumed a partition holds a single key.

use parking_lot::Mutex;

use crate::access::{TempPage, ValueFormat};
use crate::buffer::{BufferManager, ExclusiveGuard};
use crate::error::{Error, Result};
use crate::storage::{PageId, PAGE_HEADER_SIZE};

/// MurmurHash3's 64-bit finaliser: a bijection on u64 with good avalanche.
#[inline]
pub(crate) fn hash64(k: u64) -> u64 {
    let mut h = k;
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// The hash bits not yet used by partitioning, moved to the top.
#[inline]
pub(crate) fn shifted(h: u64, consumed: u32) -> u64 {
    h.checked_shl(consumed).unwrap_or(0)
}

/// Reads the little-endian u64 at byte `o`.
#[inline]
pub(crate) fn rd64(d: &[u8], o: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&d[o..o + 8]);
    u64::from_le_bytes(b)
}

/// Writes `v` little-endian at byte `o`.
#[inline]
pub(crate) fn wr64(d: &mut [u8], o: usize, v: u64) {
    d[o..o + 8].copy_from_slice(&v.to_le_bytes());
}

/// Calls `f` with the raw bits of every value of a packed page (u32 zero-extended, i64 as
/// its two's complement bits).
#[inline]
pub(crate) fn for_each_raw(format: ValueFormat, bytes: &[u8], n: usize, mut f: impl FnMut(u64) -> Result<()>) -> Result<()> {
    let bytes = &bytes[..n * format.width()];
    match format {
        ValueFormat::U32le => {
            for c in bytes.chunks_exact(4) {
                f(u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as u64)?;
            }
        }
        ValueFormat::U64le | ValueFormat::I64le => {
            for c in bytes.chunks_exact(8) {
                f(rd64(c, 0))?;
            }
        }
    }
    Ok(())
}

/// Largest power of two `<= x` (0 for 0).
pub(crate) fn pow2_floor(x: u64) -> u64 {
    if x == 0 {
        0
    } else {
        1 << (63 - x.leading_zeros())
    }
}

/// Payload bytes to request for a page of `size` bytes (a power of two).
pub(crate) fn payload_of(size: u64) -> usize {
    size as usize - PAGE_HEADER_SIZE
}

/// Largest page size among `pages` (0 if none).
pub(crate) fn largest_page(bm: &BufferManager, pages: impl IntoIterator<Item = PageId>) -> u64 {
    pages.into_iter().map(|p| bm.classes().page_size(p.class())).max().unwrap_or(0)
}

/// Page sizes and parallelism for one operator, derived from the pool.
///
/// Each worker keeps latched at most: one input page (`col_page`), its table page (`ht`),
/// its staging page (`stage`; two in the rare overflow paths, which hold no input page) and
/// two run pages (`<= run_cap`: one read, one appended to); `threads * that <= pool / 2`
/// whenever the pool allows more than the minimum sizes. The thread count is cut until each
/// worker's minimum fits its share.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Plan {
    pub pool: u64,
    pub min: u64,
    pub threads: usize,
    pub col_page: u64,
    /// Table page size per worker.
    pub ht: u64,
    /// Staging page size per writer.
    pub stage: u64,
    /// Largest run page.
    pub run_cap: u64,
}

impl Plan {
    pub(crate) fn new(bm: &BufferManager, col_page: u64, threads: usize) -> Plan {
        let pool = bm.pool_size();
        let min = bm.classes().min_page();
        let share = (pool / 2).max(min);
        let need = col_page + 5 * min;
        let t = (threads.max(1) as u64).min((share / need).max(1));
        let per = share / t;
        let stage = pow2_floor(per / 8).clamp(min, (256 << 10).max(min));
        let run_cap = (stage / 2).max(min);
        let rest = per.saturating_sub(col_page + stage + 2 * run_cap);
        let ht = pow2_floor(rest).max(min);
        Plan { pool, min, threads: t as usize, col_page, ht, stage, run_cap }
    }

    /// One table page for all workers (they read it shared while each holds an input page).
    pub(crate) fn shared_ht(&self) -> u64 {
        let share = (self.pool / 2).max(self.min);
        pow2_floor(share.saturating_sub(self.threads as u64 * self.col_page)).max(self.min)
    }

    /// Partition bits for `records` records of `rec` bytes, so that a partition's keys fit a
    /// table of `table_entries`; `sets` partition sets are written at the same time.
    pub(crate) fn fanout_bits(&self, records: u64, table_entries: usize, rec: usize, sets: usize, consumed: u32) -> Result<u32> {
        if consumed >= 64 {
            return Err(Error::Inconsistent("hash partitioning exhausted all 64 hash bits with more than one key left".into()));
        }
        let target = (table_entries as u64 * 3 / 4).max(1);
        let want = records.div_ceil(target).clamp(2, 1 << 20).next_power_of_two().trailing_zeros();
        // At least 4 records per staging slot, and the partitions' tail pages (one per
        // partition) within a quarter of the pool.
        let by_stage = pow2_floor(((payload_of(self.stage) / (rec * 4)) as u64).max(1)).trailing_zeros();
        let by_tails = pow2_floor((self.pool / 4 / (self.min * sets.max(1) as u64)).max(1)).trailing_zeros();
        let limit = by_stage.min(by_tails).clamp(1, 10);
        Ok(want.min(limit).min(64 - consumed).max(1))
    }

    /// Run page size for `fanout` partitions, `sets` sets of them written at once.
    pub(crate) fn run_page(&self, fanout: usize, sets: usize) -> u64 {
        pow2_floor(self.pool / 4 / (fanout.max(1) * sets.max(1)) as u64).clamp(self.min, self.run_cap)
    }
}

/// Entries a table over `bytes` bytes with `entry`-byte entries can hold.
pub(crate) fn table_capacity(bytes: usize, entry: usize) -> usize {
    max_entries(bytes / entry)
}

fn max_entries(slots: usize) -> usize {
    // Load factor 0.7, and always one empty slot so probing ends.
    (slots * 7 / 10).min(slots.saturating_sub(1))
}

/// Keys per bucket below which a table stays in a core's cache (16 K entries of up to 48
/// bytes at load 1/2: at most 1.5 MiB, usually 512 KiB).
pub(crate) const CACHE_KEYS: u64 = 16 << 10;

/// Hash bits to split a partition of `records` records into cache-sized buckets (0: none).
pub(crate) fn cache_bits(records: u64) -> u32 {
    if records <= 2 * CACHE_KEYS {
        0
    } else {
        records.div_ceil(CACHE_KEYS).next_power_of_two().trailing_zeros().min(8)
    }
}

/// Copies the `rec`-byte records of `src` into `dst` grouped by `bucket(record)` (a counting
/// sort); returns the start of every bucket in records, plus the end.
pub(crate) fn scatter(src: &[u8], dst: &mut [u8], rec: usize, bits: u32, bucket: impl Fn(&[u8]) -> usize) -> Vec<usize> {
    let n = 1usize << bits;
    let mut start = vec![0usize; n + 1];
    for r in src.chunks_exact(rec) {
        start[bucket(r) + 1] += 1;
    }
    for b in 0..n {
        start[b + 1] += start[b];
    }
    let mut pos = start.clone();
    for r in src.chunks_exact(rec) {
        let b = bucket(r);
        dst[pos[b] * rec..(pos[b] + 1) * rec].copy_from_slice(r);
        pos[b] += 1;
    }
    start
}

/// Records handled per batch in hot loops (see [`Table::peek`]).
pub(crate) const BATCH: usize = 16;

/// Open addressing with linear probing over a byte slice (a temporary page's payload).
pub(crate) struct Table<'d> {
    d: &'d mut [u8],
    entry: usize,
    n: usize,
    len: usize,
    max: usize,
}

impl<'d> Table<'d> {
    /// A cleared table sized for up to `expected` entries (at most what `d` holds).
    pub(crate) fn new(d: &'d mut [u8], entry: usize, expected: u64) -> Table<'d> {
        let cap = d.len() / entry;
        // Load at most 1/2 when `expected` keys arrive (short probes); `max_entries` still
        // allows 0.7 of the slots.
        let want = (expected.min(cap as u64) as usize).saturating_mul(2) + 2;
        let n = want.min(cap).max(2.min(cap));
        d[..n * entry].fill(0);
        Table { d, entry, n, len: 0, max: max_entries(n) }
    }

    /// Re-attaches to a table built earlier in the same bytes.
    pub(crate) fn attach(d: &'d mut [u8], entry: usize, n: usize, len: usize) -> Table<'d> {
        Table { d, entry, n, len, max: max_entries(n) }
    }

    /// Slots in use (for [`attach`](Self::attach)).
    pub(crate) fn slots(&self) -> usize {
        self.n
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Most entries this table takes.
    pub(crate) fn capacity(&self) -> usize {
        self.max
    }

    /// The entry of `key` (hash bits `hs`, see [`shifted`]), inserted with a zero body if
    /// absent; `None` when absent and the table is full. The caller must give a new entry a
    /// non-zero count before the next call.
    #[inline]
    pub(crate) fn upsert(&mut self, key: u64, hs: u64) -> Option<(usize, bool)> {
        if self.max == 0 {
            return None;
        }
        let mut i = ((hs as u128 * self.n as u128) >> 64) as usize;
        loop {
            let o = i * self.entry;
            if rd64(self.d, o + 8) == 0 {
                if self.len >= self.max {
                    return None;
                }
                wr64(self.d, o, key);
                self.len += 1;
                return Some((o, true));
            }
            if rd64(self.d, o) == key {
                return Some((o, false));
            }
            i += 1;
            if i == self.n {
                i = 0;
            }
        }
    }

    /// Loads the first word of `hs`'s home slot: touching a batch of home slots before
    /// working on them lets their cache misses overlap.
    #[inline]
    pub(crate) fn peek(&self, hs: u64) -> u64 {
        if self.n == 0 {
            return 0;
        }
        rd64(self.d, ((hs as u128 * self.n as u128) >> 64) as usize * self.entry)
    }

    /// The entry of `key`, if present.
    #[inline]
    pub(crate) fn get(&self, key: u64, hs: u64) -> Option<usize> {
        lookup(self.d, self.entry, self.n, key, hs)
    }

    /// The bytes, read-only.
    #[inline]
    pub(crate) fn view(&self) -> &[u8] {
        self.d
    }

    /// The bytes (entries are at the offsets `upsert` returns).
    #[inline]
    pub(crate) fn bytes(&mut self) -> &mut [u8] {
        self.d
    }

    /// Empties the table.
    #[cfg(test)]
    pub(crate) fn clear(&mut self) {
        self.d[..self.n * self.entry].fill(0);
        self.len = 0;
    }

    /// The occupied entries.
    pub(crate) fn entries(&self) -> impl Iterator<Item = &[u8]> + '_ {
        entries(self.d, self.entry, self.n)
    }
}

/// The occupied entries of a table of `n` slots stored in `d`.
pub(crate) fn entries(d: &[u8], entry: usize, n: usize) -> impl Iterator<Item = &[u8]> + '_ {
    d[..n * entry].chunks_exact(entry).filter(|e| rd64(e, 8) != 0)
}

/// Looks `key` up in a table of `n` slots stored in `d` (read-only; for shared probing).
#[inline]
pub(crate) fn lookup(d: &[u8], entry: usize, n: usize, key: u64, hs: u64) -> Option<usize> {
    if n == 0 {
        return None;
    }
    let mut i = ((hs as u128 * n as u128) >> 64) as usize;
    loop {
        let o = i * entry;
        if rd64(d, o + 8) == 0 {
            return None;
        }
        if rd64(d, o) == key {
            return Some(o);
        }
        i += 1;
        if i == n {
            i = 0;
        }
    }
}

/// A sequence of `rec`-byte records in temporary pages (unordered once drained). No page is
/// latched between calls; dropping it frees its pages.
pub(crate) struct Run<'a> {
    bm: &'a BufferManager,
    rec: usize,
    page_payload: usize,
    per_page: usize,
    pages: Vec<(PageId, u32)>,
    len: u64,
}

impl<'a> Run<'a> {
    pub(crate) fn new(bm: &'a BufferManager, rec: usize, page_size: u64) -> Run<'a> {
        let page_payload = payload_of(page_size);
        Run { bm, rec, page_payload, per_page: page_payload / rec, pages: Vec::new(), len: 0 }
    }

    /// Number of records.
    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    /// Appends whole records.
    pub(crate) fn append(&mut self, bytes: &[u8]) -> Result<()> {
        debug_assert_eq!(bytes.len() % self.rec, 0);
        let rec = self.rec;
        let mut off = 0;
        if let Some(last) = self.pages.last_mut() {
            let have = last.1 as usize;
            if have < self.per_page {
                let mut g = self.bm.fix_exclusive(last.0)?;
                let d = g.data_mut().ok_or_else(not_temp)?;
                let n = ((self.per_page - have) * rec).min(bytes.len());
                d[have * rec..have * rec + n].copy_from_slice(&bytes[..n]);
                last.1 += (n / rec) as u32;
                self.len += (n / rec) as u64;
                off = n;
            }
        }
        while off < bytes.len() {
            let mut g = self.bm.alloc_temp(self.page_payload)?;
            let n = (self.per_page * rec).min(bytes.len() - off);
            g.data_mut().ok_or_else(not_temp)?[..n].copy_from_slice(&bytes[off..off + n]);
            self.pages.push((g.pid(), (n / rec) as u32));
            self.len += (n / rec) as u64;
            off += n;
        }
        Ok(())
    }

    /// Calls `f` with the records of each page (a whole number of records) until it returns
    /// false; returns whether every page was seen. Keeps the pages.
    pub(crate) fn for_each(&self, mut f: impl FnMut(&[u8]) -> bool) -> Result<bool> {
        for &(pid, count) in &self.pages {
            let g = self.bm.fix_shared(pid)?;
            if !f(&g.data()[..count as usize * self.rec]) {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Calls `f` with the records of each page, freeing each page once read (in no
    /// particular order).
    pub(crate) fn drain(mut self, mut f: impl FnMut(&[u8]) -> Result<()>) -> Result<()> {
        while let Some(&(pid, count)) = self.pages.last() {
            {
                let g = self.bm.fix_shared(pid)?;
                f(&g.data()[..count as usize * self.rec])?;
            }
            self.pages.pop();
            self.bm.free(pid)?;
        }
        Ok(())
    }
}

/// Drains `runs` one after the other into `dst`, which must be exactly as long as all their
/// records together (checked: a run holding more or fewer records than counted is reported).
pub(crate) fn drain_all(runs: [Run<'_>; 2], dst: &mut [u8]) -> Result<()> {
    let mut at = 0;
    for run in runs {
        run.drain(|c| {
            let end = at + c.len();
            dst.get_mut(at..end).ok_or_else(|| Error::Inconsistent("partition holds more records than it counted".into()))?.copy_from_slice(c);
            at = end;
            Ok(())
        })?;
    }
    if at != dst.len() {
        return Err(Error::Inconsistent("partition holds fewer records than it counted".into()));
    }
    Ok(())
}

impl Drop for Run<'_> {
    fn drop(&mut self) {
        for &(pid, _) in &self.pages {
            let _ = self.bm.free(pid);
        }
    }
}

fn not_temp() -> Error {
    Error::Inconsistent("operator state page is not a temporary page".into())
}

/// `2^bits` runs of records partitioned by hash bits `consumed..consumed+bits`; shared by
/// writer threads (a mutex per partition, taken once per staging slot flushed).
pub(crate) struct Partitions<'a> {
    pub consumed: u32,
    pub bits: u32,
    runs: Vec<Mutex<Run<'a>>>,
}

impl<'a> Partitions<'a> {
    pub(crate) fn new(bm: &'a BufferManager, rec: usize, consumed: u32, bits: u32, run_page: u64) -> Partitions<'a> {
        debug_assert!(bits >= 1 && consumed + bits <= 64);
        let runs = (0..1usize << bits).map(|_| Mutex::new(Run::new(bm, rec, run_page))).collect();
        Partitions { consumed, bits, runs }
    }

    pub(crate) fn fanout(&self) -> usize {
        self.runs.len()
    }

    /// The partition of hash `h`.
    #[inline]
    pub(crate) fn part(&self, h: u64) -> usize {
        (shifted(h, self.consumed) >> (64 - self.bits)) as usize
    }

    fn append(&self, p: usize, bytes: &[u8]) -> Result<()> {
        self.runs[p].lock().append(bytes)
    }

    /// Total records.
    pub(crate) fn records(&self) -> u64 {
        self.runs.iter().map(|r| r.lock().len()).sum()
    }

    /// The runs, in partition order.
    pub(crate) fn into_runs(self) -> Vec<Run<'a>> {
        self.runs.into_iter().map(Mutex::into_inner).collect()
    }
}

/// A temporary page its owner keeps latched; freed when dropped.
pub(crate) struct WorkPage<'a> {
    // Declared first: dropped (unlatched) before the page is freed, which waits for latches.
    g: ExclusiveGuard<'a>,
    page: TempPage<'a>,
}

impl<'a> WorkPage<'a> {
    /// A zeroed temporary page of `size` bytes (a power of two), latched.
    pub(crate) fn alloc(bm: &'a BufferManager, size: u64) -> Result<WorkPage<'a>> {
        let (page, g) = TempPage::alloc(bm, payload_of(size))?;
        Ok(WorkPage { g, page })
    }

    /// The payload.
    pub(crate) fn data(&self) -> &[u8] {
        self.g.data()
    }

    /// The payload, writable.
    pub(crate) fn data_mut(&mut self) -> Result<&mut [u8]> {
        self.g.data_mut().ok_or_else(not_temp)
    }

    /// Unlatches it (it may then be evicted); it is still freed when the result is dropped.
    pub(crate) fn unlatch(self) -> TempPage<'a> {
        let WorkPage { g, page } = self;
        drop(g);
        page
    }
}

/// One writer's staging page: a slot per partition, flushed to its run when full. Holds its
/// page latched while it lives.
pub(crate) struct Stager<'a> {
    page: WorkPage<'a>,
    rec: usize,
    slot: usize,
    fill: Vec<usize>,
}

impl<'a> Stager<'a> {
    pub(crate) fn new(bm: &'a BufferManager, page_size: u64, fanout: usize, rec: usize) -> Result<Stager<'a>> {
        let payload = payload_of(page_size);
        let slot = payload / fanout / rec * rec;
        if slot == 0 {
            return Err(Error::Inconsistent(format!("staging page of {page_size} bytes cannot hold {fanout} partitions of {rec}-byte records")));
        }
        Ok(Stager { page: WorkPage::alloc(bm, page_size)?, rec, slot, fill: vec![0; fanout] })
    }

    /// Adds one record to partition `p`.
    #[inline]
    pub(crate) fn push(&mut self, parts: &Partitions<'_>, p: usize, rec: &[u8]) -> Result<()> {
        debug_assert_eq!(rec.len(), self.rec);
        if self.fill[p] + self.rec > self.slot {
            self.flush_one(parts, p)?;
        }
        let at = p * self.slot + self.fill[p];
        let d = self.page.data_mut()?;
        d[at..at + rec.len()].copy_from_slice(rec);
        self.fill[p] += self.rec;
        Ok(())
    }

    fn flush_one(&mut self, parts: &Partitions<'_>, p: usize) -> Result<()> {
        let n = self.fill[p];
        if n > 0 {
            let at = p * self.slot;
            parts.append(p, &self.page.data()[at..at + n])?;
            self.fill[p] = 0;
        }
        Ok(())
    }

    /// Writes every slot to its run (call before the runs are read).
    pub(crate) fn flush(&mut self, parts: &Partitions<'_>) -> Result<()> {
        for p in 0..self.fill.len() {
            self.flush_one(parts, p)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Config;

    #[test]
    fn hash_is_a_bijection_on_samples_and_partitions_use_disjoint_bits() {
        let mut seen = std::collections::HashSet::new();
        for k in 0..100_000u64 {
            assert!(seen.insert(hash64(k.wrapping_mul(0x9E37_79B9))));
        }
        assert_eq!(shifted(u64::MAX, 64), 0);
        assert_eq!(shifted(1, 63), 1 << 63);
    }

    #[test]
    fn table_counts_like_a_hashmap_and_reports_full() {
        let mut buf = vec![0u8; 16 * 100];
        let mut t = Table::new(&mut buf, 16, u64::MAX);
        assert_eq!(t.capacity(), 70);
        let mut want = std::collections::HashMap::new();
        for i in 0..1000u64 {
            let k = i % 70;
            let (o, _) = t.upsert(k, shifted(hash64(k), 0)).unwrap();
            let c = rd64(t.bytes(), o + 8);
            wr64(t.bytes(), o + 8, c + 1);
            *want.entry(k).or_insert(0u64) += 1;
        }
        assert!(t.upsert(1000, hash64(1000)).is_none(), "full");
        for (&k, &c) in &want {
            let o = t.get(k, hash64(k)).unwrap();
            assert_eq!(rd64(t.bytes(), o + 8), c);
        }
        assert_eq!(t.entries().count(), 70);
        t.clear();
        assert_eq!(t.entries().count(), 0);
        assert!(t.get(5, hash64(5)).is_none());
    }

    #[test]
    fn partitions_spill_and_come_back_whole() {
        let dir = tempfile::tempdir().unwrap();
        let bm = BufferManager::create(Config::new(dir.path().join("db")).min_page(4096).pool_size(256 << 10)).unwrap();
        let parts = Partitions::new(&bm, 8, 0, 4, 4096);
        let mut st = Stager::new(&bm, 16 << 10, parts.fanout(), 8).unwrap();
        let n = 200_000u64;
        for k in 0..n {
            let h = hash64(k);
            st.push(&parts, parts.part(h), &k.to_le_bytes()).unwrap();
        }
        st.flush(&parts).unwrap();
        drop(st);
        assert_eq!(parts.records(), n);
        assert!(bm.stats().evictions > 0, "1.6 MB of records through a 256 KiB pool");
        let mut sum = 0u64;
        let mut count = 0u64;
        for (p, run) in parts.into_runs().into_iter().enumerate() {
            let mut again = 0u64;
            assert!(run
                .for_each(|c| {
                    again += (c.len() / 8) as u64;
                    true
                })
                .unwrap());
            assert_eq!(again, run.len());
            run.drain(|c| {
                for r in c.chunks_exact(8) {
                    let k = rd64(r, 0);
                    assert_eq!((hash64(k) >> 60) as usize, p);
                    sum += k;
                    count += 1;
                }
                Ok(())
            })
            .unwrap();
        }
        assert_eq!((count, sum), (n, n * (n - 1) / 2));
        assert_eq!(crate::testutil::temp_pages(&bm), 0, "all freed");
        assert!(bm.peak_bytes() <= 256 << 10);
        bm.check_invariants().unwrap();
    }
}
