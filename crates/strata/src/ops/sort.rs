//! External sort of a column (`sort COLUMN [--top K]`).
//!
//! Run generation is parallel and morsel-driven: each of `threads` workers takes the next
//! column page, decodes its values into its own workspace (one large temporary page sized
//! from the pool, see [`crate::access::extsort::Plan`]), and sorts and spills the workspace
//! to a run of small temporary pages whenever it is full. The runs are then k-way merged
//! (multi-pass if there are more than the pool allows at once); the merged stream is folded
//! into the result without being materialised ([`SortStream`]): the first K values as they
//! come, the last K set aside in a run of temporary pages (their positions are known from the
//! column's length), and the position-weighted checksum. Working memory is the buffer
//! manager's, never the heap's, whatever K: a pool of a few MiB sorts columns many times its
//! size.
//!
//! i64 values are sorted as u64 keys with the sign bit flipped (which maps signed order onto
//! unsigned order).

use std::sync::atomic::{AtomicUsize, Ordering};

use serde::Serialize;

use crate::access::extsort::{Merger, Plan, Record, Run, RunCursor, RunGen, RunWriter};
use crate::access::{Column, ValueFormat};
use crate::buffer::BufferManager;
use crate::error::{Error, Result};

/// Result of [`sort_column`] (contract: `sort COLUMN [--top K]`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SortResult {
    /// The K smallest values, ascending.
    pub first: Vec<i128>,
    /// The K largest values, ascending.
    pub last: Vec<i128>,
    /// Sum over i of (i+1) * v_i mod 2^64 over the sorted sequence (i64 values as their
    /// two's complement u64).
    pub checksum: u64,
}

const SIGN: u64 = 1 << 63;

/// Sorts `column` completely (ascending; i64 columns as signed) with `threads` threads and
/// returns its `top` smallest and largest values and the position-weighted checksum
/// ([`sort_column_stream`] with the values collected: 2 x `top` values of heap).
pub fn sort_column(bm: &BufferManager, column: &Column, top: usize, threads: usize) -> Result<SortResult> {
    let mut s = sort_column_stream(bm, column, top, threads)?;
    let mut out = SortResult { first: Vec::with_capacity(s.top()), last: Vec::with_capacity(s.top()), checksum: 0 };
    while let Some(v) = s.next_first()? {
        out.first.push(v);
    }
    while let Some(v) = s.next_last()? {
        out.last.push(v);
    }
    out.checksum = s.checksum()?;
    Ok(out)
}

/// The sorted stream of a [`sort_column_stream`]: its `top` smallest values are read while
/// the merge runs, the `top` largest are set aside in a run of temporary pages as the merge
/// passes them (their positions are known: the column's length is), and the checksum is
/// complete once the merge is. Working memory is the pool's whatever `top` is.
pub struct SortStream<'a> {
    bm: &'a BufferManager,
    plan: Plan,
    merger: Merge<'a>,
    format: ValueFormat,
    n: u64,
    keep: u64,
    /// Values taken from the merge so far (= the position of the next one).
    taken: u64,
    /// First values handed out.
    firsts: u64,
    checksum: u64,
    /// The largest `keep` values (as stored words) while the merge passes them...
    tail: Option<RunWriter<'a, u64>>,
    /// ... and once it is done, to be read back.
    last: Option<RunCursor<'a, u64>>,
}

/// The merge of the runs of one key type; yields each value as its stored 64-bit word.
enum Merge<'a> {
    U32(Merger<'a, u32>),
    U64(Merger<'a, u64>),
    /// i64 as u64 keys with the sign bit flipped.
    I64(Merger<'a, u64>),
}

impl Merge<'_> {
    #[inline]
    fn next_word(&mut self) -> Result<Option<u64>> {
        Ok(match self {
            Merge::U32(m) => m.next()?.map(u64::from),
            Merge::U64(m) => m.next()?,
            Merge::I64(m) => m.next()?.map(|k| k ^ SIGN),
        })
    }
}

impl SortStream<'_> {
    /// Values in the column.
    pub fn len(&self) -> u64 {
        self.n
    }

    /// Whether the column is empty.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// How many values [`next_first`](Self::next_first) and [`next_last`](Self::next_last)
    /// each yield: `top`, or the column's length if smaller.
    pub fn top(&self) -> usize {
        self.keep as usize
    }

    fn value(&self, word: u64) -> i128 {
        match self.format {
            ValueFormat::I64le => word as i64 as i128,
            _ => word as i128,
        }
    }

    /// Takes the next value from the merge into the checksum (and the tail run if it is one
    /// of the largest); its word.
    fn take(&mut self) -> Result<Option<u64>> {
        let Some(w) = self.merger.next_word()? else { return Ok(None) };
        self.taken += 1;
        self.checksum = self.checksum.wrapping_add(self.taken.wrapping_mul(w));
        if self.taken > self.n - self.keep {
            if self.tail.is_none() {
                self.tail = Some(RunWriter::new(self.bm, self.plan.run_page));
            }
            self.tail.as_mut().expect("tail run").push(w)?;
        }
        Ok(Some(w))
    }

    /// The next of the `top` smallest values, ascending; `None` after the last.
    pub fn next_first(&mut self) -> Result<Option<i128>> {
        if self.firsts == self.keep {
            return Ok(None);
        }
        let w = self.take()?.ok_or_else(|| short(self.taken, self.n))?;
        self.firsts += 1;
        Ok(Some(self.value(w)))
    }

    /// Runs the merge to its end (skipping what [`next_first`](Self::next_first) has not
    /// handed out).
    fn finish_merge(&mut self) -> Result<()> {
        if self.last.is_some() {
            return Ok(());
        }
        self.firsts = self.keep;
        while self.take()?.is_some() {}
        if self.taken != self.n {
            return Err(short(self.taken, self.n));
        }
        let run = self.tail.take().map(RunWriter::finish);
        self.last = Some(match run {
            Some(r) => r.cursor(),
            None => RunWriter::<u64>::new(self.bm, self.plan.run_page).finish().cursor(),
        });
        Ok(())
    }

    /// The next of the `top` largest values, ascending; `None` after the last. The first
    /// call completes the merge.
    pub fn next_last(&mut self) -> Result<Option<i128>> {
        self.finish_merge()?;
        let w = self.last.as_mut().expect("merge finished").next()?;
        Ok(w.map(|w| self.value(w)))
    }

    /// Sum over i of (i+1) * v_i mod 2^64 over the sorted sequence; completes the merge.
    pub fn checksum(&mut self) -> Result<u64> {
        self.finish_merge()?;
        Ok(self.checksum)
    }
}

fn short(taken: u64, n: u64) -> Error {
    Error::Inconsistent(format!("the sort's merge ended after {taken} of {n} values"))
}

/// Sorts `column` (ascending; i64 columns as signed) with `threads` threads into runs of
/// temporary pages and returns the merge of them, read in order through [`SortStream`].
pub fn sort_column_stream<'a>(bm: &'a BufferManager, column: &Column, top: usize, threads: usize) -> Result<SortStream<'a>> {
    column.check_shape(bm)?;
    let plan = Plan::new(bm);
    // The merge keeps one page per run and the output page (of the tail run) latched.
    let fan_in = plan.fan_in(plan.budget);
    let (merger, n) = match column.format {
        ValueFormat::U32le => {
            let runs = column_runs(bm, column, threads, plan, u32::load)?;
            let n = runs.iter().map(|r| r.len()).sum();
            (Merge::U32(Merger::new(bm, runs, plan, fan_in, false)?), n)
        }
        ValueFormat::U64le => {
            let runs = column_runs(bm, column, threads, plan, u64::load)?;
            let n = runs.iter().map(|r| r.len()).sum();
            (Merge::U64(Merger::new(bm, runs, plan, fan_in, false)?), n)
        }
        ValueFormat::I64le => {
            // Flipping the sign bit maps i64 order onto u64 order.
            let runs = column_runs(bm, column, threads, plan, |b| u64::load(b) ^ SIGN)?;
            let n = runs.iter().map(|r| r.len()).sum();
            (Merge::I64(Merger::new(bm, runs, plan, fan_in, false)?), n)
        }
    };
    let keep = (top as u64).min(n);
    Ok(SortStream { bm, plan, merger, format: column.format, n, keep, taken: 0, firsts: 0, checksum: 0, tail: None, last: None })
}

/// Sorts the values of `column` (decoded to keys by `key`) into runs with `threads` threads.
fn column_runs<'a, T: Record>(bm: &'a BufferManager, column: &Column, threads: usize, plan: Plan, key: impl Fn(&[u8]) -> T + Sync) -> Result<Vec<Run<'a>>> {
    let width = column.format.width();
    let col_page = column.pages.iter().map(|p| bm.classes().page_size(p.page_id().class())).max().unwrap_or(0);
    // Each thread keeps latched: its workspace, one column page and one run page.
    let fixed = col_page + plan.run_page;
    let min_ws = 4 * bm.classes().min_page();
    let threads = threads.clamp(1, (plan.budget / (fixed + min_ws)).max(1) as usize).min(column.pages.len().max(1));
    let workspace = plan.workspace(bm, (plan.budget / threads as u64).saturating_sub(fixed));
    let next = AtomicUsize::new(0);
    let worker = || -> Result<Vec<Run<'a>>> {
        let mut gen = RunGen::<T>::new(bm, workspace, plan.run_page, false);
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some(page) = column.pages.get(i) else { break };
            let g = bm.fix_shared(page.page_id())?;
            let mut src = &g.data()[..page.count as usize * width];
            while !src.is_empty() {
                let dst = gen.space()?;
                let k = dst.len().min(src.len() / width);
                for (d, c) in dst[..k].iter_mut().zip(src.chunks_exact(width)) {
                    *d = key(c);
                }
                gen.advance(k);
                src = &src[k * width..];
            }
        }
        gen.finish()
    };
    if threads == 1 {
        return worker();
    }
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads).map(|_| s.spawn(worker)).collect();
        let mut runs = Vec::new();
        let mut first_err = None;
        for h in handles {
            match h.join().expect("sort worker panicked") {
                Ok(r) => runs.extend(r),
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(runs),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::testutil::{bm, rng, temp_pages};

    #[test]
    fn column_sort_matches_a_reference_for_every_format() {
        let (_d, bm) = bm(1 << 20, 4096);
        let mut seed = 7;
        for format in [ValueFormat::U32le, ValueFormat::U64le, ValueFormat::I64le] {
            for n in [0usize, 1, 5, 70_000] {
                let vals: Vec<i128> = (0..n)
                    .map(|_| match format {
                        ValueFormat::U32le => (rng(&mut seed) as u32) as i128,
                        ValueFormat::U64le => rng(&mut seed) as i128,
                        ValueFormat::I64le => (rng(&mut seed) as i64 % 1000) as i128,
                    })
                    .collect();
                let bytes: Vec<u8> = vals
                    .iter()
                    .flat_map(|&v| match format {
                        ValueFormat::U32le => (v as u32).to_le_bytes().to_vec(),
                        _ => (v as u64).to_le_bytes().to_vec(),
                    })
                    .collect();
                let mut col = Column::new(format);
                col.append(&bm, &mut &bytes[..], bytes.len() as u64, &mut |_| {}).unwrap();
                let mut sorted = vals.clone();
                sorted.sort_unstable();
                let checksum = sorted.iter().enumerate().fold(0u64, |s, (i, &v)| s.wrapping_add((i as u64 + 1).wrapping_mul(v as u64)));
                for threads in [1, 3] {
                    let r = sort_column(&bm, &col, 10, threads).unwrap();
                    assert_eq!(r.first, sorted[..n.min(10)], "{format:?} n {n}");
                    assert_eq!(r.last, sorted[n - n.min(10)..], "{format:?} n {n}");
                    assert_eq!(r.checksum, checksum, "{format:?} n {n} threads {threads}");
                }
                assert_eq!(temp_pages(&bm), 0);
            }
        }
        bm.check_invariants().unwrap();
    }
}
