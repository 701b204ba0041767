//! External sorting building blocks over temporary pages: sorted runs, run generation in a
//! large temporary workspace, and a k-way merge (multi-pass when there are too many runs).
//!
//! All working memory comes from the buffer manager:
//!
//! * **Run generation** ([`RunGen`]). Records are collected in one large temporary page
//!   (the *workspace*, used as a typed array through [`ExclusiveGuard::data_mut`]), sorted
//!   in place when it is full, and appended to a [`Run`]: a list of small temporary pages
//!   that are evicted to the scratch file when the pool is full and freed as they are read.
//! * **Merge** ([`Merger`]). One latched page per input run; yields the records in order.
//!   With more runs than the fan-in, the smallest runs are first merged into longer ones
//!   (multi-pass) until the rest can be merged at once.
//!
//! Sizes come from the pool ([`Plan`]): what a sort keeps latched (workspaces, one page per
//! merged run, the output page) stays within half of the pool left after the buffer
//! manager's metadata, so the other half always remains evictable. The heap holds only
//! bookkeeping: the page ids of each run and one heap entry per merged run.
//!
//! [`Run`]s are `Send` (unlike [`super::TempRun`], which keeps its tail page latched while
//! appending), so runs made by worker threads can be merged by another thread.

use std::marker::PhantomData;

use crate::buffer::{BufferManager, ExclusiveGuard};
use crate::error::Result;
use crate::storage::{PageId, PAGE_HEADER_SIZE};

/// A fixed-size record an external sort can order: a plain unsigned integer.
///
/// # Safety
/// Implementors are plain integers: every bit pattern is a valid value, there is no padding,
/// and their alignment divides 32 (workspaces are viewed as `[Self]` in place).
pub(crate) unsafe trait Record: Copy + Ord + Default + Send + Sync + std::fmt::Debug + 'static {
    /// Bytes per record in a run page (little-endian).
    const SIZE: usize;
    /// The largest value.
    const MAX: Self;
    /// Decodes the little-endian image at the start of `b`.
    fn load(b: &[u8]) -> Self;
    /// Encodes into the start of `b`, little-endian.
    fn store(self, b: &mut [u8]);
    /// As u64 (truncating for u128; used by callers that know the value fits).
    fn to_u64(self) -> u64;
    /// From u64 (truncating for u32; used by callers that know the value fits).
    fn from_u64(v: u64) -> Self;
    /// Byte `i` (0 = least significant), a digit of the radix sort.
    fn byte(self, i: usize) -> u8;
}

macro_rules! record {
    ($t:ty, $n:expr) => {
        // SAFETY: a primitive unsigned integer: no padding, every bit pattern valid, alignment
        // at most 16.
        unsafe impl Record for $t {
            const SIZE: usize = $n;
            const MAX: Self = <$t>::MAX;
            #[inline]
            fn load(b: &[u8]) -> Self {
                <$t>::from_le_bytes(b[..$n].try_into().unwrap())
            }
            #[inline]
            fn store(self, b: &mut [u8]) {
                b[..$n].copy_from_slice(&self.to_le_bytes());
            }
            #[inline]
            fn to_u64(self) -> u64 {
                self as u64
            }
            #[inline]
            fn from_u64(v: u64) -> Self {
                v as $t
            }
            #[inline(always)]
            fn byte(self, i: usize) -> u8 {
                (self >> (8 * i)) as u8
            }
        }
    };
}
record!(u32, 4);
record!(u64, 8);
record!(u128, 16);

/// Views a workspace payload as records.
#[inline]
fn records_mut<T: Record>(bytes: &mut [u8]) -> &mut [T] {
    // SAFETY: `T: Record` is a plain integer (every bit pattern valid, no padding, no drop
    // glue), so reinterpreting initialised bytes as `T` is sound; `align_to_mut` only hands
    // out the correctly aligned middle part, and the exclusive borrow of `bytes` carries over.
    let (pre, mid, _) = unsafe { bytes.align_to_mut::<T>() };
    assert!(pre.is_empty(), "page payloads are 32-byte aligned");
    mid
}

/// Size (header included) of the largest power-of-two page that is at most `bytes`, and at
/// least the smallest page.
pub(crate) fn page_at_most(bm: &BufferManager, bytes: u64) -> u64 {
    let min = bm.classes().min_page();
    if bytes <= min {
        return min;
    }
    1u64 << (63 - bytes.leading_zeros())
}

/// Memory a sort may keep latched: half of the pool left after the buffer manager's
/// metadata.
pub(crate) fn latch_budget(bm: &BufferManager) -> u64 {
    let meta = bm.stats().metadata_bytes;
    bm.pool_size().saturating_sub(meta) / 2
}

/// How a sort uses the pool. All sizes are page sizes (header included).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Plan {
    /// Bytes the sort may keep latched in total.
    pub budget: u64,
    /// Pages of runs.
    pub run_page: u64,
}

impl Plan {
    /// The plan for `bm`'s current pool.
    pub(crate) fn new(bm: &BufferManager) -> Plan {
        let budget = latch_budget(bm);
        // Run pages: small enough that a merge of 32+ runs fits the budget, large enough to
        // make reasonable I/Os (and never more than 1 MiB).
        let run_page = page_at_most(bm, (budget / 64).min(1 << 20));
        Plan { budget, run_page }
    }
    /// Runs that can be merged at once with `bytes` of latched memory (one page per input
    /// run plus the output page); at least 2.
    pub(crate) fn fan_in(&self, bytes: u64) -> usize {
        ((bytes / self.run_page).saturating_sub(1) as usize).max(2)
    }
    /// A workspace page size that fits `bytes`.
    pub(crate) fn workspace(&self, bm: &BufferManager, bytes: u64) -> u64 {
        page_at_most(bm, bytes)
    }
}

/// Payload bytes to request from `alloc_temp` for a page of exactly `page` bytes.
#[inline]
fn payload_of(page: u64) -> usize {
    page as usize - PAGE_HEADER_SIZE
}

// ------------------------------------------------------------------------------ runs

/// A finished run: temporary pages holding records in order. Frees its pages when dropped.
/// `Send`: it only names pages (none is latched).
pub(crate) struct Run<'a> {
    bm: &'a BufferManager,
    pages: Vec<(PageId, u32)>,
    len: u64,
}

impl<'a> Run<'a> {
    /// Number of records.
    pub(crate) fn len(&self) -> u64 {
        self.len
    }
    /// The pages and the records in each, in order.
    pub(crate) fn pages(&self) -> &[(PageId, u32)] {
        &self.pages
    }
    /// A reader that yields the records in order and frees each page once read.
    pub(crate) fn cursor<T: Record>(mut self) -> RunCursor<'a, T> {
        let pages = std::mem::take(&mut self.pages);
        RunCursor { bm: self.bm, pages, next_page: 0, cur: None, count: 0, pos: 0, _t: PhantomData }
    }
}

impl Drop for Run<'_> {
    fn drop(&mut self) {
        for &(pid, _) in &self.pages {
            let _ = self.bm.free(pid);
        }
    }
}

/// Appends records to a new run; one page latched at a time.
pub(crate) struct RunWriter<'a, T: Record> {
    bm: &'a BufferManager,
    payload: usize,
    per_page: usize,
    pages: Vec<(PageId, u32)>,
    tail: Option<ExclusiveGuard<'a>>,
    tail_count: usize,
    len: u64,
    _t: PhantomData<T>,
}

impl<'a, T: Record> RunWriter<'a, T> {
    /// A writer whose pages are `page` bytes (header included).
    pub(crate) fn new(bm: &'a BufferManager, page: u64) -> RunWriter<'a, T> {
        let payload = payload_of(page);
        RunWriter { bm, payload, per_page: payload / T::SIZE, pages: Vec::new(), tail: None, tail_count: 0, len: 0, _t: PhantomData }
    }

    fn tail(&mut self) -> Result<&mut ExclusiveGuard<'a>> {
        if self.tail.is_none() {
            self.tail = Some(self.bm.alloc_temp(self.payload)?);
            self.tail_count = 0;
        }
        Ok(self.tail.as_mut().expect("tail page"))
    }

    fn seal_if_full(&mut self) {
        if self.tail_count == self.per_page {
            let g = self.tail.take().expect("tail page");
            self.pages.push((g.pid(), self.tail_count as u32));
            self.tail_count = 0;
        }
    }

    /// Appends one record.
    #[inline]
    pub(crate) fn push(&mut self, v: T) -> Result<()> {
        let at = self.tail_count * T::SIZE;
        let g = self.tail()?;
        v.store(&mut g.data_mut().expect("temporary page")[at..at + T::SIZE]);
        self.tail_count += 1;
        self.len += 1;
        self.seal_if_full();
        Ok(())
    }

    /// Appends records in bulk.
    pub(crate) fn extend(&mut self, mut vals: &[T]) -> Result<()> {
        while !vals.is_empty() {
            let start = self.tail_count;
            let take = vals.len().min(self.per_page - start);
            let g = self.tail()?;
            let bytes = &mut g.data_mut().expect("temporary page")[start * T::SIZE..(start + take) * T::SIZE];
            for (c, &v) in bytes.chunks_exact_mut(T::SIZE).zip(&vals[..take]) {
                v.store(c);
            }
            self.tail_count += take;
            self.len += take as u64;
            vals = &vals[take..];
            self.seal_if_full();
        }
        Ok(())
    }

    /// Records appended so far.
    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    /// Finishes the run.
    pub(crate) fn finish(mut self) -> Run<'a> {
        if let Some(g) = self.tail.take() {
            self.pages.push((g.pid(), self.tail_count as u32));
        }
        Run { bm: self.bm, pages: std::mem::take(&mut self.pages), len: self.len }
    }
}

impl<T: Record> Drop for RunWriter<'_, T> {
    fn drop(&mut self) {
        if let Some(g) = self.tail.take() {
            let _ = g.free();
        }
        for &(pid, _) in &self.pages {
            let _ = self.bm.free(pid);
        }
    }
}

/// Reads a run in order, one latched page at a time, freeing each page once read.
pub(crate) struct RunCursor<'a, T: Record> {
    bm: &'a BufferManager,
    pages: Vec<(PageId, u32)>,
    next_page: usize,
    cur: Option<ExclusiveGuard<'a>>,
    count: usize,
    pos: usize,
    _t: PhantomData<T>,
}

impl<'a, T: Record> RunCursor<'a, T> {
    /// The next record.
    #[inline]
    pub(crate) fn next(&mut self) -> Result<Option<T>> {
        if self.pos < self.count {
            let g = self.cur.as_ref().expect("current page");
            let at = self.pos * T::SIZE;
            self.pos += 1;
            return Ok(Some(T::load(&g.data()[at..at + T::SIZE])));
        }
        self.next_page()
    }

    #[cold]
    fn next_page(&mut self) -> Result<Option<T>> {
        loop {
            if let Some(g) = self.cur.take() {
                g.free()?;
            }
            let Some(&(pid, count)) = self.pages.get(self.next_page) else { return Ok(None) };
            self.next_page += 1;
            self.cur = Some(self.bm.fix_exclusive(pid)?);
            self.count = count as usize;
            self.pos = 0;
            if self.count > 0 {
                return self.next();
            }
        }
    }
}

impl<T: Record> Drop for RunCursor<'_, T> {
    fn drop(&mut self) {
        if let Some(g) = self.cur.take() {
            let _ = g.free();
        }
        for &(pid, _) in &self.pages[self.next_page..] {
            let _ = self.bm.free(pid);
        }
    }
}

// ------------------------------------------------------------------------- generation

/// Run generation: records are collected in the first half of one large temporary page,
/// sorted (LSD radix sort with the second half as scratch) and deduplicated if asked when it
/// is full, and appended to a new [`Run`].
pub(crate) struct RunGen<'a, T: Record> {
    bm: &'a BufferManager,
    ws: Option<ExclusiveGuard<'a>>,
    cap: usize,
    n: usize,
    run_page: u64,
    dedup: bool,
    runs: Vec<Run<'a>>,
    _t: PhantomData<T>,
}

impl<'a, T: Record> RunGen<'a, T> {
    /// A generator with a workspace page of `workspace` bytes writing runs of `run_page`-byte
    /// pages. The workspace is allocated on the first record.
    pub(crate) fn new(bm: &'a BufferManager, workspace: u64, run_page: u64, dedup: bool) -> RunGen<'a, T> {
        // Half of the workspace holds records, the other half is the sort's scratch space.
        let cap = (payload_of(workspace) / T::SIZE / 2).max(1);
        RunGen { bm, ws: None, cap, n: 0, run_page, dedup, runs: Vec::new(), _t: PhantomData }
    }

    /// Free space of the workspace (sorting and spilling it first if it is full); fill a
    /// prefix and [`advance`](Self::advance) by its length.
    #[inline]
    pub(crate) fn space(&mut self) -> Result<&mut [T]> {
        if self.n == self.cap {
            self.spill()?;
        }
        if self.ws.is_none() {
            self.ws = Some(self.bm.alloc_temp(2 * self.cap * T::SIZE)?);
        }
        let ws = self.ws.as_mut().expect("workspace");
        let recs = records_mut::<T>(ws.data_mut().expect("temporary page"));
        Ok(&mut recs[self.n..self.cap])
    }

    /// Marks `k` records of [`space`](Self::space) as filled.
    #[inline]
    pub(crate) fn advance(&mut self, k: usize) {
        debug_assert!(self.n + k <= self.cap);
        self.n += k;
    }

    /// Adds one record.
    #[inline]
    pub(crate) fn push(&mut self, v: T) -> Result<()> {
        self.space()?[0] = v;
        self.n += 1;
        Ok(())
    }

    /// Sorts the workspace and appends it to a new run.
    fn spill(&mut self) -> Result<()> {
        if self.n == 0 {
            return Ok(());
        }
        let ws = self.ws.as_mut().expect("workspace");
        let (data, scratch) = records_mut::<T>(ws.data_mut().expect("temporary page"))[..2 * self.cap].split_at_mut(self.cap);
        let recs = radix_sort(&mut data[..self.n], &mut scratch[..self.n]);
        let m = if self.dedup { dedup_sorted(recs) } else { recs.len() };
        let mut w = RunWriter::<T>::new(self.bm, self.run_page);
        w.extend(&recs[..m])?;
        self.runs.push(w.finish());
        self.n = 0;
        Ok(())
    }

    /// Spills what is left, frees the workspace and returns the runs.
    pub(crate) fn finish(mut self) -> Result<Vec<Run<'a>>> {
        self.spill()?;
        if let Some(ws) = self.ws.take() {
            ws.free()?;
        }
        Ok(std::mem::take(&mut self.runs))
    }
}

impl<T: Record> Drop for RunGen<'_, T> {
    fn drop(&mut self) {
        if let Some(ws) = self.ws.take() {
            let _ = ws.free();
        }
    }
}

/// Sorts `data` (LSD radix sort, one byte per pass, skipping bytes that are the same in
/// every record) using `scratch` (as long as `data`); returns the slice that holds the
/// result.
pub(crate) fn radix_sort<'s, T: Record>(data: &'s mut [T], scratch: &'s mut [T]) -> &'s mut [T] {
    let n = data.len();
    assert_eq!(scratch.len(), n);
    if n < 256 {
        data.sort_unstable();
        return data;
    }
    // One pass for all histograms (bookkeeping: 256 counters per byte).
    let mut counts = vec![[0usize; 256]; T::SIZE];
    for &v in data.iter() {
        for (d, c) in counts.iter_mut().enumerate() {
            c[v.byte(d) as usize] += 1;
        }
    }
    let (mut src, mut dst) = (data, scratch);
    for (d, c) in counts.iter().enumerate() {
        if c.contains(&n) {
            continue; // every record has the same byte d
        }
        let mut offs = [0usize; 256];
        let mut sum = 0;
        for (o, &k) in offs.iter_mut().zip(c) {
            *o = sum;
            sum += k;
        }
        for &v in src.iter() {
            let b = v.byte(d) as usize;
            dst[offs[b]] = v;
            offs[b] += 1;
        }
        std::mem::swap(&mut src, &mut dst);
    }
    src
}

/// Removes adjacent duplicates in place; returns the new length.
fn dedup_sorted<T: Record>(v: &mut [T]) -> usize {
    if v.is_empty() {
        return 0;
    }
    let mut w = 1;
    for r in 1..v.len() {
        if v[r] != v[w - 1] {
            v[w] = v[r];
            w += 1;
        }
    }
    w
}

// ------------------------------------------------------------------------------ merge

/// Yields the records of several runs in order (without duplicates if asked), with a tree
/// of losers that keeps each match's loser (key and run) in its node: one comparison, no
/// branch, per level and record.
///
/// An exhausted run's leaf holds the largest key. If such a leaf wins, every remaining
/// record is the largest key too, and the rest is drained run by run.
pub(crate) struct Merger<'a, T: Record> {
    cursors: Vec<RunCursor<'a, T>>,
    done: Vec<bool>,
    /// Runs not yet exhausted.
    active: usize,
    /// Loser (key, run) of the match at each inner node `1..leaves`; `leaves` is a power of
    /// two (padding leaves are exhausted runs).
    tree: Vec<(T, u32)>,
    winner: (T, u32),
    dedup: bool,
    last: Option<T>,
    /// Once draining: heads (all the largest key) of unexhausted runs not yet returned.
    pending_heads: Option<usize>,
}

impl<'a, T: Record> Merger<'a, T> {
    /// Merges `runs`, first merging the smallest ones into longer runs (of `plan.run_page`
    /// pages) until at most `fan_in` are left.
    pub(crate) fn new(bm: &'a BufferManager, mut runs: Vec<Run<'a>>, plan: Plan, fan_in: usize, dedup: bool) -> Result<Merger<'a, T>> {
        let fan_in = fan_in.max(2);
        while runs.len() > fan_in {
            // Merging the k smallest runs into one leaves runs.len() - k + 1; merge just
            // enough (at most fan_in) to approach fan_in with the least copying.
            runs.sort_by_key(|r| std::cmp::Reverse(r.len()));
            let k = (runs.len() - fan_in + 1).min(fan_in);
            let group: Vec<Run<'a>> = runs.split_off(runs.len() - k);
            let mut m = Merger::<T>::open(group, dedup)?;
            let mut w = RunWriter::<T>::new(bm, plan.run_page);
            while let Some(v) = m.next()? {
                w.push(v)?;
            }
            drop(m);
            runs.push(w.finish());
        }
        Merger::open(runs, dedup)
    }

    fn open(runs: Vec<Run<'a>>, dedup: bool) -> Result<Merger<'a, T>> {
        let mut cursors: Vec<RunCursor<'a, T>> = runs.into_iter().map(|r| r.cursor()).collect();
        let leaves = cursors.len().next_power_of_two();
        let mut heads = vec![T::MAX; leaves];
        let mut done = vec![true; cursors.len()];
        let mut active = 0;
        for (i, c) in cursors.iter_mut().enumerate() {
            if let Some(v) = c.next()? {
                heads[i] = v;
                done[i] = false;
                active += 1;
            }
        }
        let mut m = Merger { cursors, done, active, tree: vec![(T::MAX, 0); leaves], winner: (T::MAX, 0), dedup, last: None, pending_heads: None };
        m.winner = m.build(1, &heads);
        Ok(m)
    }

    /// Plays the matches below `node`; returns the winner.
    fn build(&mut self, node: usize, heads: &[T]) -> (T, u32) {
        let leaves = heads.len();
        if node >= leaves {
            let i = node - leaves;
            return (heads[i], i as u32);
        }
        let (a, b) = (self.build(2 * node, heads), self.build(2 * node + 1, heads));
        let (win, lose) = if b.0 < a.0 { (b, a) } else { (a, b) };
        self.tree[node] = lose;
        win
    }

    /// The next record in order.
    #[inline]
    pub(crate) fn next(&mut self) -> Result<Option<T>> {
        loop {
            let (key, w) = self.winner;
            let w = w as usize;
            if self.done.get(w).copied().unwrap_or(true) {
                return self.drain();
            }
            let next = match self.cursors[w].next()? {
                Some(v) => v,
                None => {
                    self.done[w] = true;
                    self.active -= 1;
                    T::MAX
                }
            };
            // Replay the matches from the leaf up.
            let mut cur = (next, w as u32);
            let mut node = (w + self.tree.len()) / 2;
            while node > 0 {
                let t = self.tree[node];
                // Branch-free (the outcome is unpredictable): index a pair instead of `if`.
                let pair = [t, cur];
                let swap = (t.0 < cur.0) as usize;
                self.tree[node] = pair[swap];
                cur = pair[swap ^ 1];
                node /= 2;
            }
            self.winner = cur;
            if self.dedup {
                if self.last == Some(key) {
                    continue;
                }
                self.last = Some(key);
            }
            return Ok(Some(key));
        }
    }

    /// An exhausted run won: whatever is left is the largest key: first the pending head of
    /// each run not yet exhausted, then the rest of those runs.
    #[cold]
    fn drain(&mut self) -> Result<Option<T>> {
        let pending = self.pending_heads.get_or_insert(self.active);
        loop {
            let v = if *pending > 0 {
                *pending -= 1;
                T::MAX
            } else {
                let Some(i) = self.done.iter().position(|d| !d) else { return Ok(None) };
                match self.cursors[i].next()? {
                    Some(v) => v,
                    None => {
                        self.done[i] = true;
                        self.active -= 1;
                        continue;
                    }
                }
            };
            debug_assert!(v == T::MAX);
            if self.dedup && self.last == Some(v) {
                continue;
            }
            self.last = Some(v);
            return Ok(Some(v));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::testutil::{bm, rng, temp_pages};

    #[test]
    fn radix_sort_sorts_every_record_type() {
        let mut seed = 5;
        for n in [0usize, 1, 255, 256, 1000, 70_000] {
            for spread in [3u64, u64::MAX] {
                let v64: Vec<u64> = (0..n).map(|_| rng(&mut seed) % spread.max(1)).collect();
                let mut data = v64.clone();
                let mut scratch = vec![0u64; n];
                let mut want = v64.clone();
                want.sort_unstable();
                assert_eq!(radix_sort(&mut data, &mut scratch), &want[..]);
                let v32: Vec<u32> = v64.iter().map(|&v| (v ^ (v >> 32)) as u32).collect();
                let (mut data, mut scratch, mut want) = (v32.clone(), vec![0u32; n], v32);
                want.sort_unstable();
                assert_eq!(radix_sort(&mut data, &mut scratch), &want[..]);
                let v128: Vec<u128> = v64.iter().map(|&v| ((v as u128) << 64) | (rng(&mut seed) % 1000) as u128).collect();
                let (mut data, mut scratch, mut want) = (v128.clone(), vec![0u128; n], v128);
                want.sort_unstable();
                assert_eq!(radix_sort(&mut data, &mut scratch), &want[..]);
            }
        }
    }

    #[test]
    fn merge_handles_largest_keys_and_empty_runs() {
        let (_d, bm) = bm(1 << 20, 4096);
        let plan = Plan { budget: 256 << 10, run_page: 4096 };
        for dedup in [false, true] {
            let lists: Vec<Vec<u32>> = vec![vec![1, u32::MAX, u32::MAX], vec![], vec![u32::MAX], vec![0, 5, 5, u32::MAX], vec![2]];
            let runs: Vec<Run> = lists
                .iter()
                .map(|l| {
                    let mut w = RunWriter::<u32>::new(&bm, 4096);
                    w.extend(l).unwrap();
                    w.finish()
                })
                .collect();
            let mut want: Vec<u32> = lists.concat();
            want.sort_unstable();
            if dedup {
                want.dedup();
            }
            let mut m = Merger::<u32>::new(&bm, runs, plan, 3, dedup).unwrap();
            let mut got = Vec::new();
            while let Some(v) = m.next().unwrap() {
                got.push(v);
            }
            assert_eq!(got, want, "dedup {dedup}");
        }
        let mut m = Merger::<u64>::new(&bm, Vec::new(), plan, 3, false).unwrap();
        assert_eq!(m.next().unwrap(), None);
        drop(m);
        assert_eq!(temp_pages(&bm), 0);
    }

    #[test]
    fn runs_round_trip_and_free_their_pages() {
        let (_d, bm) = bm(1 << 20, 4096);
        let mut w = RunWriter::<u64>::new(&bm, 4096);
        w.extend(&(0..1000).collect::<Vec<u64>>()).unwrap();
        for v in 1000..1500u64 {
            w.push(v).unwrap();
        }
        let run = w.finish();
        assert_eq!(run.len(), 1500);
        assert_eq!(run.pages().len(), 1500usize.div_ceil((4096 - 32) / 8));
        let mut c = run.cursor::<u64>();
        for want in 0..1500u64 {
            assert_eq!(c.next().unwrap(), Some(want));
        }
        assert_eq!(c.next().unwrap(), None);
        drop(c);
        assert_eq!(temp_pages(&bm), 0);
        // Unread runs and half-read cursors free their pages too.
        let mut w = RunWriter::<u32>::new(&bm, 4096);
        w.extend(&[5u32; 3000]).unwrap();
        let mut c = w.finish().cursor::<u32>();
        c.next().unwrap();
        drop(c);
        let mut w = RunWriter::<u128>::new(&bm, 4096);
        w.push(7).unwrap();
        drop(w);
        assert_eq!(temp_pages(&bm), 0);
        bm.check_invariants().unwrap();
    }

    #[test]
    fn multi_pass_merge_with_dedup_through_a_tiny_pool() {
        let (_d, bm) = bm(256 << 10, 4096);
        let plan = Plan { budget: 64 << 10, run_page: 4096 };
        assert_eq!(plan.fan_in(plan.budget), 15);
        let mut seed = 1;
        let mut all = Vec::new();
        let mut gen = RunGen::<u64>::new(&bm, 8192, 4096, true);
        for _ in 0..100_000 {
            let v = rng(&mut seed) % 5000;
            all.push(v);
            gen.push(v).unwrap();
        }
        let runs = gen.finish().unwrap();
        assert!(runs.len() > 40, "{} runs", runs.len());
        let mut m = Merger::<u64>::new(&bm, runs, plan, plan.fan_in(plan.budget), true).unwrap();
        all.sort_unstable();
        all.dedup();
        let mut got = Vec::new();
        while let Some(v) = m.next().unwrap() {
            got.push(v);
        }
        assert_eq!(got, all);
        drop(m);
        assert_eq!(temp_pages(&bm), 0);
        assert!(bm.peak_bytes() <= bm.pool_size());
        bm.check_invariants().unwrap();
    }
}
