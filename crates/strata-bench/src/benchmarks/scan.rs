//! `scan`: a sequential scan of a file of pages 4x the pool (a column), summing every word,
//! cold (engine just opened, file dropped from the OS page cache) and then warm (a second
//! pass on the same engine): strata vs mmap vs raw (raw = `O_DIRECT` reads of whole
//! morsels, the device's sequential limit).
//!
//! Threads take morsels (consecutive runs of pages, 1 MiB by default) from a shared cursor;
//! one operation is one morsel. Every engine must produce the same sum of all words, which
//! the run checks (`checksums_agree`).

use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::{json, Map, Value};

use super::{median_round, mmap_cap_note, short_size, with_engine, Ctx, Rounds};
use crate::dataset::{DataSet, FileSpec};
use crate::harness::{measure_store, run_value, RunCfg, Step};
use crate::workload::sum_words;
use crate::{EResult, PageStore};

pub(super) const ENGINES: [&str; 4] = ["strata", "strata-auto", "mmap", "raw"];
/// Engines that run when `--engines` names them: `strata-noprefetch` (no read-ahead at all,
/// the "prefetch off" side of the prefetch comparison) and `strata-noring` (read-ahead into
/// frames: scan rings off, the "rings off" side of the ring comparison).
pub(super) const KNOWN: [&str; 6] = ["strata", "strata-auto", "strata-noprefetch", "strata-noring", "mmap", "raw"];
const MORSEL: u64 = 1 << 20;
/// Rounds per engine by default: the median of three smooths a shared machine's noise.
const DEFAULT_ROUNDS: usize = 3;

/// One pass over the file: threads take morsels from a shared cursor and sum every word.
/// Figures plus `"checksum"`, the sum.
fn scan_pass(store: &dyn PageStore, threads: usize, ops: Option<u64>, pages: u64, morsel_pages: u64, ps: u64) -> EResult<Map<String, Value>> {
    let cursor = AtomicU64::new(0);
    let sum = AtomicU64::new(0);
    let limit = ops.map(|x| x * threads as u64).unwrap_or(u64::MAX).min(pages.div_ceil(morsel_pages));
    let cfg = RunCfg { threads, seconds: None, ops: None, sample_every: 1 };
    let mut m = measure_store(
        store,
        &cfg,
        |_| (),
        |_| {
            let m = cursor.fetch_add(1, Ordering::Relaxed);
            if m >= limit {
                return Ok(Step::Done);
            }
            let first = m * morsel_pages;
            let end = (first + morsel_pages).min(pages);
            let mut s = 0u64;
            store.scan(0, first..end, &mut |_, d| s = s.wrapping_add(sum_words(d)))?;
            sum.fetch_add(s, Ordering::Relaxed);
            Ok(Step::Did { bytes: (end - first) * ps })
        },
    )?;
    m.insert("checksum".into(), sum.load(Ordering::Relaxed).into());
    Ok(m)
}

pub(super) fn run(ctx: &mut Ctx<'_>) -> EResult<Vec<Value>> {
    let o = ctx.opts;
    let pool = o.pool.unwrap_or(32 << 20);
    let ps = o.page_sizes.as_ref().and_then(|v| v.first().copied()).unwrap_or(64 << 10);
    let pages = (o.data.unwrap_or(4 * pool) / ps).max(1);
    let data = pages * ps;
    let morsel_pages = (MORSEL / ps).max(1);
    ctx.progress(|| format!("building {} of {} pages", short_size(data), short_size(ps)));
    let ds = DataSet::build(&ctx.scratch.path().join("db"), ps, &[FileSpec { page_size: ps, pages }])?;
    mmap_cap_note(ctx);

    let rounds = o.rounds.unwrap_or(DEFAULT_ROUNDS).max(1);
    let engines = ctx.engines_of(&KNOWN, &ENGINES);
    let mut runs = Vec::new();
    for &threads in &o.thread_counts() {
        // [phase][engine] -> one result per round
        let mut results: [Vec<Rounds>; 2] = [vec![Vec::new(); engines.len()], vec![Vec::new(); engines.len()]];
        for round in 0..rounds {
            // Alternate the order, so that no engine always runs right after another one
            // read the file (a virtual disk's host cache may still hold it).
            for k in 0..engines.len() {
                let e = (k + round) % engines.len();
                let name = engines[e];
                ctx.progress(|| format!("t{threads} round {}/{rounds}: {name}", round + 1));
                let r = with_engine(name, &ds, pool, ps as usize, (morsel_pages * ps) as usize, |store: &dyn PageStore| {
                    Ok([scan_pass(store, threads, o.ops, pages, morsel_pages, ps), scan_pass(store, threads, o.ops, pages, morsel_pages, ps)])
                });
                match r {
                    Ok(phases) => {
                        for (p, r) in phases.into_iter().enumerate() {
                            results[p][e].push(r);
                        }
                    }
                    Err(err) => {
                        for ph in &mut results {
                            ph[e].push(Err(err.clone()));
                        }
                    }
                }
            }
        }
        for (phase, by_engine) in ["cold", "warm"].into_iter().zip(results) {
            let mut figures = Map::new();
            let mut sums = Vec::new();
            for (name, rs) in engines.iter().zip(by_engine) {
                let v = median_round(rs, "bytes_per_sec");
                if let Some(c) = v.get("checksum").and_then(Value::as_u64) {
                    sums.push(c);
                }
                figures.insert((*name).into(), v);
            }
            let params = json!({
                "threads": threads,
                "page_size": ps,
                "pool_bytes": pool,
                "data_bytes": data,
                "distribution": "sequential",
                "phase": phase,
                "queue_depth": threads,
                "morsel_bytes": morsel_pages * ps,
                "rounds": rounds,
            });
            let mut run = run_value(params.as_object().cloned().unwrap_or_default(), figures);
            run["checksums_agree"] = json!(sums.windows(2).all(|w| w[0] == w[1]));
            runs.push(run);
        }
    }
    ctx.notes.push(format!(
        "scan: one operation = one morsel of {} (latencies are per morsel); cold = first pass after opening the engine with the file dropped from the page cache, warm = second pass on the same engine. strata fixes page by page (shared latch) behind a read-ahead stream; strata-auto fixes page by page with no hint at all (its sequential misses are detected and read ahead in windows); strata-noprefetch (only when named) reads no page ahead at all; strata-noring (only when named) is strata with scan rings off (read ahead into frames; strata itself reads the pages not in memory into its stream's scan ring where rings are on, see its scan_rings, ring_pages and ring_hits); raw reads each morsel with one O_DIRECT request. Each engine ran {rounds} round(s) (fresh engine each, engines alternating in rotating order); its figures are those of its median round by bytes/s, and rounds_bytes_per_sec lists every round.",
        short_size(morsel_pages * ps)
    ));
    Ok(runs)
}
