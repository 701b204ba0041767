//! A grace hash join inside a parallel pipeline: its partition pairs joined on the
//! pipeline's workers.
//!
//! When a join's build side is too large for a table (TPC-H Q9's orders, Q18's customers,
//! Q20's part suppliers through 64 MiB), [`super::run`] partitions both sides and joins the
//! pairs one after the other, on one thread, and everything above the join with it. Here the
//! join becomes the *source* of the pipeline above it instead (see
//! [`super::super::pipeline`]): its build records are partitioned (by the top bits of the
//! hash, two per worker where the pool has room, see [`Grace::prepare`]), its probe side runs as a pipeline of its own
//! (on the workers where it is one, each into its own partitions, joined per partition in
//! worker order), and then the pairs are dealt to the workers in turn, each joined as
//! [`super::join_pair`] joins it (a table of a worker's share of the pool; a pair that
//! does not fit is partitioned again or taken in chunks) with its rows flowing through the
//! worker's copy of the stages above. The dealing is fixed, so with as many workers every
//! run sends the same rows to the same workers in the same order.
//!
//! Only kinds whose probe rows with a NULL key give nothing (inner joins, and semi joins
//! that build on their right) run so: the others' NULL-keyed rows belong to no pair.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Mutex;

use super::super::exec::Plan;
use super::super::pipeline::{self, Into};
use super::super::rows::{corrupt, work_share, RowRun};
use super::table::record_head;
use super::{join_pair, partition, probe_record, Ctx, JoinArgs, JoinKind, Joined, Parts, Sink};
use crate::access::table::Value;
use crate::buffer::BufferManager;
use crate::error::Result;

/// Whether a grace join of `kind` can join its partition pairs on several workers (its
/// probe rows with a NULL key give nothing). Marking joins never reach here (see
/// [`super::parallel_probe_side`]).
pub(in crate::sql) fn parallel_kind(kind: JoinKind) -> bool {
    matches!(kind, JoinKind::Inner | JoinKind::Semi)
}

/// How many partitions each of `threads` workers may append to at once: their tail pages
/// (at least the smallest page each) take at most a quarter of the pool together.
fn tails(bm: &BufferManager, threads: usize) -> u64 {
    bm.pool_size() / 4 / bm.classes().min_page() / threads.max(1) as u64
}

/// A grace join's partition pairs, ready to be joined by up to `threads` workers.
pub(in crate::sql) struct Grace<'p, 'b> {
    ctx: Ctx<'p>,
    jr: Joined,
    /// Hash bits the partitions consumed, and the most a worker's repartitioning of a pair
    /// takes a level.
    bits: u32,
    max_bits: u32,
    /// Bytes of a worker's join table.
    budget: u64,
    threads: usize,
    /// (build, probe) partition runs, each taken once.
    pairs: Vec<Mutex<Option<(RowRun<'b>, RowRun<'b>)>>>,
}

impl<'p, 'b> Grace<'p, 'b> {
    /// Partitions the build records `brun` of join `j` (built on its left if `build_left`)
    /// and runs its probe side into partitions of the same bits, for `threads` workers.
    ///
    /// Every worker appends to partitions of its own at once (its probe rows, then a
    /// pair's repartitioning), each with a tail page of at least the smallest page: the
    /// partitions are as many as let all those tails take at most a quarter of the pool,
    /// and where not even two per worker fit, one worker does it all (the probe side on
    /// the calling thread, the pairs too: as the serial executor would, with nothing built
    /// again).
    pub(in crate::sql) fn prepare(
        bm: &'b BufferManager,
        j: &JoinArgs<'p>,
        build_left: bool,
        ctx: Ctx<'p>,
        jr: Joined,
        brun: RowRun<'b>,
        threads: usize,
    ) -> Result<Grace<'p, 'b>> {
        debug_assert!(parallel_kind(ctx.kind) && !ctx.marks());
        let (pplan, pkeys): (&Plan, _) = if build_left { (j.right, j.right_keys) } else { (j.left, j.left_keys) };
        let threads = if tails(bm, threads) >= 2 { threads.max(1) } else { 1 };
        let max_bits = (63 - tails(bm, threads).max(2).leading_zeros()).min(super::MAX_BITS);
        super::super::counters::GRACE_JOINS.fetch_add(1, Relaxed);
        let budget = work_share(bm, threads) as u64;
        // Pairs that fit a worker's table (else each is partitioned again on its worker),
        // and at least two per worker, as the tails allow.
        let want = brun.bytes().div_ceil(budget / 2).max(2 * threads as u64);
        let bits = want.next_power_of_two().trailing_zeros().clamp(1, max_bits);
        let part = |h: u64| (h >> (64 - bits)) as usize;
        let bparts = partition(bm, brun, bits, 1, &part)?;
        type Local<'b> = (Parts<'b>, Vec<u8>, Vec<u8>);
        let init = |workers: usize| -> Local<'b> { (Parts::shared(bm, bits, workers), Vec::new(), Vec::new()) };
        let row = |(parts, kb, rb): &mut Local<'b>, prow: &[Value]| -> Result<()> {
            // (A NULL key matches nothing, and these kinds give nothing for it.)
            match probe_record(pkeys, &jr, prow, kb, rb)? {
                Some(h) => parts.push(part(h), &[&record_head(h, kb), kb, rb]),
                None => Ok(()),
            }
        };
        let parallel = if threads > 1 { pipeline::run_parallel(bm, pplan, Into::Build, &init, &row)? } else { None };
        let locals = match parallel {
            Some(locals) => locals,
            None => {
                let mut l = init(1);
                pplan.run(bm, &mut |prow| row(&mut l, prow).map(|_| true))?;
                vec![l]
            }
        };
        // Each partition: the workers' runs of it, in worker order.
        let mut pparts: Vec<RowRun<'b>> = Vec::new();
        for (parts, _, _) in locals {
            let runs = parts.finish()?;
            if pparts.is_empty() {
                pparts = runs;
            } else {
                for (all, run) in pparts.iter_mut().zip(runs) {
                    all.append_run(run);
                }
            }
        }
        if pparts.len() != bparts.len() {
            return Err(corrupt("grace join partitions"));
        }
        let pairs = bparts.into_iter().zip(pparts).map(|pair| Mutex::new(Some(pair))).collect();
        Ok(Grace { ctx, jr, bits, max_bits, budget, threads, pairs })
    }

    /// The partition pairs (the units the workers are dealt).
    pub(in crate::sql) fn units(&self) -> u64 {
        self.pairs.len() as u64
    }

    /// The workers that may join pairs at once.
    pub(in crate::sql) fn threads(&self) -> usize {
        self.threads
    }

    /// A joined row for one worker.
    pub(in crate::sql) fn joined(&self) -> Joined {
        self.jr.clone()
    }

    /// Joins the pairs `from..to` into `sink` (each pair once: a pair is taken).
    pub(in crate::sql) fn run(&self, bm: &BufferManager, jr: &mut Joined, from: u64, to: u64, sink: &mut Sink<'_>) -> Result<bool> {
        let workers = self.threads.min(self.pairs.len());
        for i in from..to {
            let pair = self.pairs.get(i as usize).and_then(|m| m.lock().unwrap_or_else(|e| e.into_inner()).take());
            let (b, p) = pair.ok_or_else(|| corrupt("grace join pair joined twice"))?;
            if !join_pair(bm, &self.ctx, jr, b, p, self.budget, self.bits, (self.max_bits, workers), sink)? {
                return Ok(false);
            }
        }
        Ok(true)
    }
}
