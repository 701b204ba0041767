//! Parallel pipelines (`--threads`): an aggregation over filters, projections and the
//! probes of hash joins, run by several workers on morsels of the scan at the bottom.
//!
//! The pipeline is the chain from a table scan (the *driving* scan: the probe side of the
//! lowest join) up through filters, projections and join probes to an aggregation (with or
//! without groups), to a join's build (its records), or to the marks of a semi join or NOT
//! EXISTS that builds on its left ([`Into::Marks`]). Every join's table is built first,
//! once, by the calling thread, top join first (its build side runs as any plan does: on
//! the workers, if it is such a pipeline itself); then the workers each take morsels of the
//! driving scan's rows (dealt in turn, see [`morsels`]) and push them through their own copy
//! of the pipeline ([`Stage`]: their own joined rows and buffers; the tables only read,
//! under shared latches) into their own partial state: aggregate states for a whole-table
//! aggregation, a pre-aggregation table and a hash aggregation in temporary pages for a
//! grouped one, a run of records for a build. The partial results are merged in worker
//! order (grouped ones partition by partition on several threads, see [`super::merge`]),
//! so a query gives the same floating-point sums in every run with as many workers.
//!
//! A join whose build side does not fit a table (a grace join: both sides partitioned, the
//! pairs joined one by one) becomes the pipeline's source instead of a probe: its probe side
//! runs first (as a pipeline of its own where it is one), then the workers are dealt its
//! partition pairs and push each pair's rows through the stages above (see
//! [`join::grace`]); only inner joins and semi joins that build on their right run so, and
//! on fewer workers (one, if need be) where the workers' partitions would take more than a
//! quarter of the pool.
//!
//! A pipeline runs on one thread when it has one thread, when its bottom is not a scan, or
//! when a join in it cannot run in parallel: a semi join or NOT EXISTS whose probe marks its
//! left side's table (the marked rows come after the probe; that join's own probe side runs
//! on the workers where it is a pipeline, each marking in its own bits, [`Into::Marks`]),
//! or a grace join of another kind (LEFT, anti, NOT EXISTS: their probe rows with NULL keys
//! belong to no pair). Such a grace join found while the tables are built leaves the
//! pipeline to the serial executor, which builds its tables again ([`FALLBACKS`] counts
//! it).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use super::agg::{AggKind, HashAgg, St};
use super::exec::{agg_row, AggSpec, Plan, Projection, RowGroups, Sink};
use super::expr::BExpr;
use super::join::grace::{self, Grace};
use super::join::{self, Build, Built, Joined};
use super::merge::merge_workers;
use super::rows::corrupt;
use super::scan::ColScan;
use super::vagg::{deal, morsels, workers, GroupCache};
use crate::access::table::Value;
use crate::buffer::BufferManager;
use crate::error::Result;

/// Pipelines that ran on several workers, process-wide.
pub static PARALLEL: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// Pipelines that ran on several workers started from this thread: (into an
    /// aggregation, into a join's build).
    static HERE: std::cell::Cell<(u64, u64)> = const { std::cell::Cell::new((0, 0)) };
}

thread_local! {
    /// Grace joins whose pairs were joined on several workers, started from this thread.
    static GRACE_HERE: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    /// Probes of marking joins that ran on several workers, started from this thread.
    static MARKS_HERE: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// How many probes of semi joins or NOT EXISTS that mark their left rows ran on several
/// workers from the calling thread so far. For tests.
pub fn marks_here() -> u64 {
    MARKS_HERE.with(|h| h.get())
}

/// How many grace joins in pipelines started from the calling thread joined their
/// partition pairs on several workers so far (see [`join::grace`]). For tests.
pub fn grace_here() -> u64 {
    GRACE_HERE.with(|h| h.get())
}

/// How many pipelines started from the calling thread ran on several workers so far:
/// (into an aggregation, into a join's build). For tests: unlike [`PARALLEL`], other
/// threads' queries do not count.
pub fn parallel_here() -> (u64, u64) {
    HERE.with(|h| h.get())
}

/// What a parallel pipeline feeds.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Into {
    Aggregation,
    Build,
    /// The probe of a semi join or NOT EXISTS that marks its left rows (see
    /// [`join`]: each worker marks in its own bits).
    Marks,
}
/// Pipelines that found a join too large for a table while their tables were built, and
/// went back to one thread.
pub static FALLBACKS: AtomicU64 = AtomicU64::new(0);

/// What every worker of a pipeline reads: the driving scan, the predicates and
/// expressions, and the joins' built tables.
enum Shape<'p, 'b> {
    Scan(&'p ColScan),
    Filter(&'p BExpr, Box<Shape<'p, 'b>>),
    Project(&'p [BExpr], Box<Shape<'p, 'b>>),
    Probe(Box<Built<'p, 'b>>, Box<Shape<'p, 'b>>),
    /// A grace join's partition pairs (see [`join::grace`]): the source instead of a scan.
    Grace(Box<Grace<'p, 'b>>),
}

/// Where a pipeline's rows come from: morsels of a scan's rows, or a grace join's pairs.
enum Source<'s, 'p, 'b> {
    Scan(&'p ColScan),
    Grace(&'s Grace<'p, 'b>),
}

/// Whether `plan` is a pipeline that could run in parallel (before anything is built).
pub(super) fn parallel_plan(bm: &BufferManager, plan: &Plan) -> Result<bool> {
    Ok(match plan {
        Plan::ColScan(s) => s.threads > 1,
        Plan::Filter { input, .. } | Plan::Project { input, .. } => parallel_plan(bm, input)?,
        Plan::HashJoin { .. } => match plan.join_args() {
            // (A build side estimated larger than a table can hold: a grace join, the
            // pipeline's source if its kind allows, else left to the serial executor from
            // the start: found while the tables were built, it made the pipeline fall back
            // and build every table again, TPC-H Q9's line items twice.)
            Some(j) => match join::parallel_probe_side(bm, &j)? {
                Some((p, _, false)) => parallel_plan(bm, p)?,
                // (A grace join: its pairs are joined in parallel if its probe side runs so.)
                Some((p, _, true)) => grace::parallel_kind(j.kind) && parallel_plan(bm, p)?,
                None => false,
            },
            None => false,
        },
        _ => false,
    })
}

/// `plan` with its joins' tables built; `None` if a join's build side did not fit a table.
fn shape<'p, 'b>(bm: &'b BufferManager, plan: &'p Plan) -> Result<Option<Shape<'p, 'b>>> {
    Ok(match plan {
        Plan::ColScan(s) => Some(Shape::Scan(s)),
        Plan::Filter { input, pred } => shape(bm, input)?.map(|i| Shape::Filter(pred, Box::new(i))),
        Plan::Project { input, exprs } => shape(bm, input)?.map(|i| Shape::Project(exprs, Box::new(i))),
        Plan::HashJoin { .. } => {
            let j = plan.join_args().ok_or_else(|| corrupt("join plan"))?;
            // The side is decided here once more (estimates are cached, but a commit in
            // between may change them): a join that marks is left to the serial executor.
            let Some((_, build_left, _)) = join::parallel_probe_side(bm, &j)? else { return Ok(None) };
            // Only NOT EXISTS joins that mark their left side hand rows on while they build.
            let mut no_rows = |_: &[Value]| Err(corrupt("a parallel join's build handed on a row"));
            let built = match join::build_on(bm, &j, build_left, &mut no_rows)? {
                Build::Table(t) => t,
                Build::Run(ctx, jr, brun) if grace::parallel_kind(j.kind) => {
                    let threads = driving_threads(bm, plan)?;
                    return Ok(Some(Shape::Grace(Box::new(Grace::prepare(bm, &j, build_left, ctx, jr, brun, threads)?))));
                }
                Build::Run(..) | Build::Stopped => return Ok(None),
            };
            shape(bm, built.probe_plan())?.map(|p| Shape::Probe(Box::new(built), Box::new(p)))
        }
        _ => None,
    })
}

/// The threads of the scan that drives the pipeline `plan` (see [`parallel_plan`]).
fn driving_threads(bm: &BufferManager, plan: &Plan) -> Result<usize> {
    Ok(match plan {
        Plan::ColScan(s) => s.threads,
        Plan::Filter { input, .. } | Plan::Project { input, .. } => driving_threads(bm, input)?,
        Plan::HashJoin { .. } => match plan.join_args() {
            Some(j) => match join::parallel_probe_side(bm, &j)? {
                Some((p, _, _)) => driving_threads(bm, p)?,
                None => 1,
            },
            None => 1,
        },
        _ => 1,
    })
}

impl<'p, 'b> Shape<'p, 'b> {
    fn source(&self) -> Source<'_, 'p, 'b> {
        match self {
            Shape::Scan(s) => Source::Scan(s),
            Shape::Grace(g) => Source::Grace(g),
            Shape::Filter(_, i) | Shape::Project(_, i) | Shape::Probe(_, i) => i.source(),
        }
    }
}

/// A worker's copy of a pipeline: its own rows and buffers over the shared [`Shape`].
enum Stage<'s, 'p, 'b> {
    Scan { scan: &'p ColScan },
    Filter { pred: &'p BExpr, input: Box<Stage<'s, 'p, 'b>> },
    Project { out: Projection<'p>, input: Box<Stage<'s, 'p, 'b>> },
    Probe { built: &'s Built<'p, 'b>, jr: Joined, kb: Vec<u8>, input: Box<Stage<'s, 'p, 'b>> },
    Grace { grace: &'s Grace<'p, 'b>, jr: Joined },
}

impl<'s, 'p, 'b> Stage<'s, 'p, 'b> {
    fn of(shape: &'s Shape<'p, 'b>) -> Stage<'s, 'p, 'b> {
        match shape {
            Shape::Scan(scan) => Stage::Scan { scan },
            Shape::Filter(pred, i) => Stage::Filter { pred, input: Box::new(Stage::of(i)) },
            Shape::Project(exprs, i) => Stage::Project { out: Projection::new(exprs), input: Box::new(Stage::of(i)) },
            Shape::Probe(built, i) => Stage::Probe { built, jr: built.joined(), kb: Vec::new(), input: Box::new(Stage::of(i)) },
            Shape::Grace(grace) => Stage::Grace { grace, jr: grace.joined() },
        }
    }

    /// Pushes the units `from..to` of the source (rows of the driving scan, or a grace
    /// join's pairs) through the pipeline into `sink`.
    fn run(&mut self, bm: &BufferManager, from: u64, to: u64, sink: &mut Sink<'_>) -> Result<bool> {
        match self {
            Stage::Scan { scan } => scan.run_range(bm, from, to, sink),
            Stage::Grace { grace, jr } => grace.run(bm, jr, from, to, sink),
            Stage::Filter { pred, input } => input.run(bm, from, to, &mut |row| if pred.holds(row)? { sink(row) } else { Ok(true) }),
            Stage::Project { out, input } => input.run(bm, from, to, &mut |row| sink(out.of(row)?)),
            Stage::Probe { built, jr, kb, input } => {
                if built.leaf_scan().is_some() {
                    return built.probe_leaves(bm, jr, from, to, sink);
                }
                // The table latched for the morsel where a claim allows.
                let (held, _claim) = built.hold(bm)?;
                let d = held.as_ref().map(|g| g.data());
                input.run(bm, from, to, &mut |prow| built.probe_row(d, jr, kb, prow, sink))
            }
        }
    }
}

/// The pipeline `plan`, its tables built, if it runs in parallel.
fn prepared<'p, 'b>(bm: &'b BufferManager, plan: &'p Plan) -> Result<Option<Shape<'p, 'b>>> {
    if !parallel_plan(bm, plan)? {
        return Ok(None);
    }
    let shape = shape(bm, plan)?;
    if shape.is_none() {
        FALLBACKS.fetch_add(1, Relaxed);
    }
    Ok(shape)
}

/// Runs `plan` on the workers of its source (morsels of its driving scan, or the pairs of a
/// grace join) if it is a parallel pipeline feeding `into`: each worker hands its rows to
/// `row` with its own state, made by `init` (given the number of workers that run, for
/// states that share the pool); returns the states in worker order. `None`: not a parallel
/// pipeline (nothing was run).
pub fn run_parallel<T: Send>(
    bm: &BufferManager,
    plan: &Plan,
    into: Into,
    init: &(dyn Fn(usize) -> T + Sync),
    row: &(dyn Fn(&mut T, &[Value]) -> Result<()> + Sync),
) -> Result<Option<Vec<T>>> {
    let Some(shape) = prepared(bm, plan)? else { return Ok(None) };
    let work = |(stage, st): &mut (Stage<'_, '_, '_>, T), a: u64, z: u64| -> Result<()> {
        stage.run(bm, a, z, &mut |r| row(st, r).map(|_| true))?;
        Ok(())
    };
    let states = match shape.source() {
        Source::Scan(scan) => {
            let rows = scan.table.rows(bm)?;
            let n = workers(scan.threads, rows);
            morsels(scan.threads, rows, &|| (Stage::of(&shape), init(n)), &work)?
        }
        // One pair per morsel.
        Source::Grace(g) => {
            let n = g.threads().min(g.units() as usize).max(1);
            if n > 1 {
                GRACE_HERE.with(|h| h.set(h.get() + 1));
            }
            deal(n, g.units(), 1, &|| (Stage::of(&shape), init(n)), &work)?
        }
    };
    if states.len() > 1 {
        PARALLEL.fetch_add(1, Relaxed);
        match into {
            Into::Marks => MARKS_HERE.with(|h| h.set(h.get() + 1)),
            _ => HERE.with(|h| {
                let (a, b) = h.get();
                h.set(if into == Into::Build { (a, b + 1) } else { (a + 1, b) });
            }),
        }
    }
    Ok(Some(states.into_iter().map(|(_, st)| st).collect()))
}

/// A whole-table aggregation over a parallel pipeline, into `states`. `Ok(false)`: not
/// applicable, nothing done.
pub fn aggregate(bm: &BufferManager, input: &Plan, aggs: &[AggSpec], kinds: &[AggKind], states: &mut [St]) -> Result<bool> {
    let init = |_| kinds.iter().map(|k| St::empty(k.kind)).collect::<Vec<St>>();
    let Some(parts) = run_parallel(bm, input, Into::Aggregation, &init, &|sts, row| agg_row(aggs, kinds, sts, row))? else { return Ok(false) };
    for part in parts {
        for ((s, p), k) in states.iter_mut().zip(part).zip(kinds) {
            s.merge(p, k)?;
        }
    }
    Ok(true)
}

/// A grouped aggregation (no DISTINCT) over a parallel pipeline, into `main`: each worker
/// has its own pre-aggregation and hash aggregation, whose groups are merged into `main`
/// (by partition on several threads, see [`super::merge`]). `Ok(false)`: not applicable,
/// nothing done.
pub fn grouped(bm: &BufferManager, input: &Plan, keys: &[BExpr], aggs: &[AggSpec], kinds: &[AggKind], main: &mut HashAgg<'_>) -> Result<bool> {
    type Local<'b, 'k> = (GroupCache, HashAgg<'b>, RowGroups<'k>);
    let init =
        |workers| -> Local<'_, '_> { (GroupCache::new(kinds.to_vec()), HashAgg::worker(bm, kinds.to_vec(), workers), RowGroups::new(keys, aggs, kinds)) };
    let row = |(cache, part, rg): &mut Local<'_, '_>, row: &[Value]| rg.push(Some(cache), part, None, row);
    let Some(parts) = run_parallel(bm, input, Into::Aggregation, &init, &row)? else { return Ok(false) };
    merge_workers(main, parts.into_iter().map(|(cache, part, _)| (cache, part, None)).collect())?;
    Ok(true)
}
