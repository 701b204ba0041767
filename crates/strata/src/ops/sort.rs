//! External sort of a column (`sort COLUMN [--top K]`).
//!
//! Run generation is parallel and morsel-driven: each of `threads` workers takes the next
//! column page, decodes its values into its own workspace (one large temporary page sized
//! from the pool, see [`crate::access::extsort::Plan`]), and sorts and spills the workspace
//! to a run of small temporary pages whenever it is full. The runs are then k-way merged
//! (multi-pass if there are more than the pool allows at once); the merged stream is folded
//! into the result without being materialised: the first K values, a ring of the last K,
//! and the position-weighted checksum. Working memory is the buffer manager's, never the
//! heap's: a pool of a few MiB sorts columns many times its size.
//!
//! i64 values are sorted as u64 keys with the sign bit flipped (which maps signed order onto
//! unsigned order).

use std::sync::atomic::{AtomicUsize, Ordering};

use serde::Serialize;

use crate::access::extsort::{Merger, Plan, Record, Run, RunGen};
use crate::access::{Column, ValueFormat};
use crate::buffer::BufferManager;
use crate::error::Result;

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
/// returns its `top` smallest and largest values and the position-weighted checksum.
pub fn sort_column(bm: &BufferManager, column: &Column, top: usize, threads: usize) -> Result<SortResult> {
    match column.format {
        ValueFormat::U32le => sort_impl::<u32>(bm, column, top, threads, u32::load, |k| k as i128, |k| k as u64),
        ValueFormat::U64le => sort_impl::<u64>(bm, column, top, threads, u64::load, |k| k as i128, |k| k),
        // Flipping the sign bit maps i64 order onto u64 order.
        ValueFormat::I64le => sort_impl::<u64>(bm, column, top, threads, |b| u64::load(b) ^ SIGN, |k| (k ^ SIGN) as i64 as i128, |k| k ^ SIGN),
    }
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

fn sort_impl<T: Record>(
    bm: &BufferManager,
    column: &Column,
    top: usize,
    threads: usize,
    key: impl Fn(&[u8]) -> T + Sync,
    value: impl Fn(T) -> i128,
    word: impl Fn(T) -> u64,
) -> Result<SortResult> {
    let plan = Plan::new(bm);
    let runs = column_runs(bm, column, threads, plan, key)?;
    let n: u64 = runs.iter().map(|r| r.len()).sum();
    let keep = (top as u64).min(n) as usize;
    let mut merger = Merger::<T>::new(bm, runs, plan, plan.fan_in(plan.budget), false)?;
    let mut out = SortResult { first: Vec::with_capacity(keep), last: Vec::with_capacity(keep), checksum: 0 };
    let tail = n - keep as u64;
    let mut i = 0u64;
    while let Some(k) = merger.next()? {
        if i < keep as u64 {
            out.first.push(value(k));
        }
        if i >= tail {
            out.last.push(value(k));
        }
        i += 1;
        out.checksum = out.checksum.wrapping_add(i.wrapping_mul(word(k)));
    }
    debug_assert_eq!(i, n);
    Ok(out)
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
