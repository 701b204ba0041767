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

use super::{mmap_cap_note, short_size, with_engine, Ctx};
use crate::dataset::{DataSet, FileSpec};
use crate::harness::{engine_value, measure_store, run_value, RunCfg, Step};
use crate::workload::sum_words;
use crate::{EResult, PageStore};

const ENGINES: [&str; 3] = ["strata", "mmap", "raw"];
const MORSEL: u64 = 1 << 20;

pub(super) fn run(ctx: &mut Ctx<'_>) -> EResult<Vec<Value>> {
    let o = ctx.opts;
    let pool = o.pool.unwrap_or(32 << 20);
    let ps = o.page_sizes.as_ref().and_then(|v| v.first().copied()).unwrap_or(64 << 10);
    let pages = (o.data.unwrap_or(4 * pool) / ps).max(1);
    let data = pages * ps;
    let morsel_pages = (MORSEL / ps).max(1);
    let morsels = pages.div_ceil(morsel_pages);
    ctx.progress(|| format!("building {} of {} pages", short_size(data), short_size(ps)));
    let ds = DataSet::build(&ctx.scratch.path().join("db"), ps, &[FileSpec { page_size: ps, pages }])?;
    mmap_cap_note(ctx);

    let mut runs = Vec::new();
    for &threads in &o.thread_counts() {
        // phase -> engine -> figures
        let mut by_phase: [Map<String, Value>; 2] = [Map::new(), Map::new()];
        let mut sums: [Vec<u64>; 2] = [Vec::new(), Vec::new()];
        for name in ENGINES {
            ctx.progress(|| format!("t{threads}: {name}"));
            let r = with_engine(name, &ds, pool, ps as usize, (morsel_pages * ps) as usize, |store: &dyn PageStore| {
                let mut out = Vec::new();
                for _phase in 0..2 {
                    let cursor = AtomicU64::new(0);
                    let sum = AtomicU64::new(0);
                    let limit = o.ops.map(|x| x * threads as u64).unwrap_or(u64::MAX).min(morsels);
                    let cfg = RunCfg { threads, seconds: None, ops: None, sample_every: 1 };
                    let r = measure_store(
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
                    );
                    out.push(r.map(|mut m| {
                        m.insert("checksum".into(), sum.load(Ordering::Relaxed).into());
                        m
                    }));
                }
                Ok(out)
            });
            match r {
                Ok(phases) => {
                    for (p, r) in phases.into_iter().enumerate() {
                        if let Ok(m) = &r {
                            sums[p].push(m["checksum"].as_u64().unwrap_or(0));
                        }
                        by_phase[p].insert(name.into(), engine_value(r));
                    }
                }
                Err(e) => {
                    for ph in &mut by_phase {
                        ph.insert(name.into(), engine_value(Err(e.clone())));
                    }
                }
            }
        }
        for (p, (phase, engines)) in ["cold", "warm"].into_iter().zip(by_phase).enumerate() {
            let params = json!({
                "threads": threads,
                "page_size": ps,
                "pool_bytes": pool,
                "data_bytes": data,
                "distribution": "sequential",
                "phase": phase,
                "queue_depth": threads,
                "morsel_bytes": morsel_pages * ps,
            });
            let mut run = run_value(params.as_object().cloned().unwrap_or_default(), engines);
            run["checksums_agree"] = json!(sums[p].windows(2).all(|w| w[0] == w[1]));
            runs.push(run);
        }
    }
    ctx.notes.push(format!(
        "scan: one operation = one morsel of {} (latencies are per morsel); cold = first pass after opening the engine with the file dropped from the page cache, warm = second pass on the same engine. strata fixes page by page (shared latch); raw reads each morsel with one O_DIRECT request.",
        short_size(morsel_pages * ps)
    ));
    Ok(runs)
}
