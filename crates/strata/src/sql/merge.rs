//! The merge of the partial grouped aggregations of a parallel pipeline's workers, on
//! several threads.
//!
//! Each worker of a parallel `GROUP BY` ends with its own pre-aggregation and hash
//! aggregation ([`super::pipeline::grouped`], [`super::vagg::fused_grouped`]). When every
//! worker has seen most of the keys (TPC-H Q13: orders by customer), merging them one
//! worker after the other into one aggregation is as much work as the whole input, on one
//! thread, and it grows with the workers. Here it takes two parallel steps:
//!
//! 1. each worker moves its groups into its aggregation's [`PARTITIONS`] partitions by
//!    hash ([`HashAgg::into_partitions`]: the records are copied, nothing is merged);
//! 2. the partitions are merged, each on one thread, taken as threads come free:
//!    partition `p` of every worker, in worker order (so a group's partial states merge in
//!    the same order in every run with as many workers, and f64 sums agree to the last
//!    bit), into an aggregation of its own whose finished groups go to a [`Distinct`] run.
//!
//! Partitions hold disjoint keys, so the main aggregation adopts their runs as they are, in
//! partition order. All state stays in temporary pages of the pool: each step runs as many
//! threads at once as let their partition tails (at least a smallest page each) take a
//! quarter of the pool, and the partition aggregations' tables take a share each.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::Mutex;

use super::agg::{encode_states, Distinct, HashAgg, PARTITIONS};
use super::rows::{hash_bytes, RowRun};
use super::vagg::{on_threads, GroupCache};
use crate::error::Result;

thread_local! {
    /// Merges of several workers' partial aggregations started from this thread.
    static HERE: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// How many merges of several workers' partial aggregations (by partition, on several
/// threads) the queries run from the calling thread made so far. For tests.
pub fn merges_here() -> u64 {
    HERE.with(|h| h.get())
}

/// One worker's partial aggregation: its pre-aggregation, its hash aggregation, and groups
/// it kept apart that still need merging (streamed runs not proven distinct).
pub(super) type Partial<'b, 'c> = (GroupCache, HashAgg<'b>, Option<Distinct<'c>>);

/// Merges the workers' partial aggregations into `main` (which must hold no groups yet of
/// the same keys: the merged groups are adopted as distinct from every other). One
/// worker's groups are pushed into `main` as they are.
pub(super) fn merge_workers<'a>(main: &mut HashAgg<'a>, mut workers: Vec<Partial<'_, '_>>) -> Result<()> {
    let n = workers.len();
    if n <= 1 {
        return match workers.pop() {
            Some(one) => merge_one(one, main),
            None => Ok(()),
        };
    }
    HERE.with(|h| h.set(h.get() + 1));
    let bm = main.buffer();
    let kinds = main.kinds().to_vec();
    // Each thread appends to up to PARTITIONS runs at once, each with a tail page of at least
    // the smallest page: as many threads at once as let those take a quarter of the pool.
    let at_once = (bm.pool_size() / 4 / (PARTITIONS as u64 * bm.classes().min_page())).max(1) as usize;
    // Step 1: every worker's groups in its partitions.
    let mut jobs: Vec<_> = workers.into_iter().map(|w| move || into_partitions(w)).collect();
    let mut parts: Vec<Vec<RowRun<'_>>> = Vec::with_capacity(n);
    while !jobs.is_empty() {
        let rest = jobs.split_off(at_once.min(jobs.len()));
        parts.extend(on_threads(jobs)?);
        jobs = rest;
    }
    let mut by_part: Vec<Vec<RowRun<'_>>> = (0..PARTITIONS).map(|_| Vec::with_capacity(n)).collect();
    for worker in parts {
        for (p, run) in worker.into_iter().enumerate() {
            by_part.get_mut(p).ok_or_else(|| super::rows::corrupt("partition count"))?.push(run);
        }
    }
    // Step 2: each partition merged on its own, as threads come free.
    let mergers = n.min(PARTITIONS).min(at_once);
    let todo: Vec<Mutex<Vec<RowRun<'_>>>> = by_part.into_iter().map(Mutex::new).collect();
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let (todo, next, failed, kinds) = (&todo, &next, &failed, &kinds);
    let merger = move || -> Result<Vec<(usize, Distinct<'a>)>> {
        let mut done = Vec::new();
        loop {
            let p = next.fetch_add(1, Relaxed);
            if p >= todo.len() || failed.load(Relaxed) {
                return Ok(done);
            }
            let runs = std::mem::take(&mut *todo[p].lock().unwrap_or_else(|e| e.into_inner()));
            match merge_partition(bm, kinds, mergers, runs) {
                Ok(d) => done.push((p, d)),
                Err(e) => {
                    failed.store(true, Relaxed);
                    return Err(e);
                }
            }
        }
    };
    let mut merged: Vec<(usize, Distinct<'a>)> = on_threads(vec![merger; mergers])?.into_iter().flatten().collect();
    merged.sort_unstable_by_key(|(p, _)| *p);
    for (_, d) in merged {
        if !d.is_empty() {
            main.adopt(d)?;
        }
    }
    Ok(())
}

/// A single worker's partial aggregation pushed into `main`, group by group.
fn merge_one((mut cache, mut part, apart): Partial<'_, '_>, main: &mut HashAgg<'_>) -> Result<()> {
    cache.flush(&mut part)?;
    let mut sb = Vec::new();
    part.finish(&mut |key, states| {
        sb.clear();
        encode_states(&states, &mut sb);
        main.push(key, hash_bytes(key), &sb)?;
        Ok(true)
    })?;
    match apart {
        Some(d) => main.merge_in(d),
        None => Ok(()),
    }
}

/// Step 1 for one worker.
fn into_partitions<'b>((mut cache, mut part, apart): Partial<'b, '_>) -> Result<Vec<RowRun<'b>>> {
    cache.flush(&mut part)?;
    if let Some(d) = apart {
        part.merge_in(d)?;
    }
    part.into_partitions()
}

/// Step 2 for one partition: the workers' runs of it (in worker order) merged, its groups
/// in a [`Distinct`] run.
fn merge_partition<'a>(bm: &'a crate::buffer::BufferManager, kinds: &[super::agg::AggKind], workers: usize, runs: Vec<RowRun<'_>>) -> Result<Distinct<'a>> {
    let mut agg = HashAgg::of_partition(bm, kinds.to_vec(), workers);
    for run in runs {
        agg.push_partition(run)?;
    }
    let mut out = Distinct::new(bm);
    agg.finish_encoded(&mut |key, states| out.push_encoded(key, states).map(|_| true))?;
    Ok(out)
}
