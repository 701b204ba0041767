//! `fix`: fixing and reading resident pages — strata's optimistic, shared and exclusive
//! latches — against the classic hash-table pool and plain memory (the same bytes in one
//! array: the cost of no buffer manager at all). Every operation picks a page uniformly at
//! random, latches it, reads its first word and one other word (exclusive: and writes it),
//! and releases it.

use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::{json, Map, Value};
use strata::PageId;

use super::Ctx;
use crate::dataset::{DataSet, FileSpec};
use crate::engines::{HashPool, StrataStore};
use crate::harness::{measure, measure_store, run_value, RunCfg, Step};
use crate::workload::{content_word, touch, word, Rng};
use crate::{EResult, EngineError, Page, PageStore};

const MODES: [&str; 3] = ["optimistic", "shared", "exclusive"];
const ROUNDS: usize = 3;

/// One engine's measurement of one round.
type Runner<'a> = dyn Fn(&RunCfg) -> EResult<Map<String, Value>> + 'a;

struct Memory {
    words: Vec<AtomicU64>,
    per_page: usize,
}

pub(super) fn run(ctx: &mut Ctx<'_>) -> EResult<Vec<Value>> {
    let o = ctx.opts;
    let page_size = o.page_sizes.as_ref().and_then(|v| v.first().copied()).unwrap_or(4096);
    let pages = (o.data.unwrap_or(16 << 20) / page_size).max(1);
    let data = pages * page_size;
    let pool = o.pool.unwrap_or(2 * data);
    let seconds = o.seconds.unwrap_or(1.0);
    ctx.progress(|| format!("building {} of {}-byte pages", super::short_size(data), page_size));
    let ds = DataSet::build(&ctx.scratch.path().join("db"), page_size, &[FileSpec { page_size, pages }])?;
    let file = &ds.files[0];
    let payload_words = file.payload_len() / 8;

    // Engines stay open for the whole benchmark: the pages are resident after one pass.
    let strata = StrataStore::open(&ds, pool).and_then(|s| {
        for i in 0..pages {
            s.read(Page::new(0, i), &mut |_| {})?;
        }
        let before = s.counters();
        for i in 0..pages {
            s.read(Page::new(0, i), &mut |_| {})?;
        }
        let missed = s.counters().since(&before).misses.unwrap_or(0);
        if missed > 0 {
            return Err(EngineError(format!("fix measures resident pages, but {missed} of {pages} pages did not stay resident in a {pool}-byte strata pool")));
        }
        Ok(s)
    });
    let hashpool = HashPool::open(&ds.files, page_size as usize, pool, true).and_then(|h| {
        if (h.capacity() as u64) < pages {
            return Err(EngineError(format!("fix measures resident pages, but a {pool}-byte hashpool has {} frames for {pages} pages", h.capacity())));
        }
        for i in 0..pages {
            h.read(Page::new(0, i), &mut |_| {})?;
        }
        Ok(h)
    });
    let memory =
        Memory { words: (0..pages).flat_map(|i| (0..payload_words).map(move |w| AtomicU64::new(content_word(0, i, w)))).collect(), per_page: payload_words };
    let class = file.class;

    let mut runs = Vec::new();
    for mode in MODES {
        for &threads in &o.thread_counts() {
            ctx.progress(|| format!("{mode} t{threads}"));
            let cfg = RunCfg { threads, seconds: o.ops.is_none().then_some(seconds), ops: o.ops, sample_every: 64 };
            let make = |t: usize| (Rng::new(0xF1C5 ^ (t as u64) << 32), 0u64);
            let pick = |st: &mut (Rng, u64)| {
                let i = st.0.below(pages);
                let salt = st.0.next_u64();
                // A word other than the first (which names the page), for the write.
                let w = 1 + (salt % (payload_words as u64 - 1)) as usize;
                (i, salt, w)
            };
            let strata_run = |cfg: &RunCfg| match &strata {
                Err(e) => Err(e.clone()),
                Ok(s) => {
                    let bm = s.bm();
                    measure_store(s, cfg, make, |st| {
                        let (i, salt, w) = pick(st);
                        let pid = PageId::new(class, false, i);
                        let v = match mode {
                            "optimistic" => bm.read_optimistic(pid, |g| Ok(g.read_u64(0) ^ g.read_u64(8 * w)))?,
                            "shared" => touch(bm.fix_shared(pid)?.data(), salt),
                            _ => {
                                let mut g = bm.fix_exclusive(pid)?;
                                let v = word(g.data(), 0);
                                g.write_u64(8 * w, v ^ salt);
                                v
                            }
                        };
                        st.1 ^= std::hint::black_box(v);
                        Ok(Step::Did { bytes: 16 })
                    })
                }
            };
            let hashpool_run = |cfg: &RunCfg| match &hashpool {
                Err(e) => Err(e.clone()),
                Ok(h) => measure_store(h, cfg, make, |st| {
                    let (i, salt, w) = pick(st);
                    let page = Page::new(0, i);
                    if mode == "exclusive" {
                        h.write(page, &mut |d| {
                            let v = word(d, 0);
                            d[8 * w..8 * w + 8].copy_from_slice(&(v ^ salt).to_le_bytes());
                            st.1 ^= v;
                        })?;
                    } else {
                        h.read(page, &mut |d| st.1 ^= touch(d, salt))?;
                    }
                    std::hint::black_box(st.1);
                    Ok(Step::Did { bytes: 16 })
                })
                .map(|mut m| {
                    let latch = if mode == "exclusive" { "exclusive content lock" } else { "shared content lock (the design has no optimistic reads)" };
                    m.insert("latch".into(), latch.into());
                    m
                }),
            };
            let memory_run = |cfg: &RunCfg| {
                measure(cfg, make, |st| {
                    let (i, salt, w) = pick(st);
                    let base = i as usize * memory.per_page;
                    let first = memory.words[base].load(Ordering::Relaxed);
                    let v = if mode == "exclusive" {
                        memory.words[base + w].store(first ^ salt, Ordering::Relaxed);
                        first
                    } else {
                        first ^ memory.words[base + w].load(Ordering::Relaxed)
                    };
                    st.1 ^= std::hint::black_box(v);
                    Ok(Step::Did { bytes: 16 })
                })
                .map(|o| crate::harness::figures(&o, None))
            };
            // Rounds, rotating the engine order, and the median round reported: this machine
            // is shared and noisy, and alternating engines exposes them to the same noise.
            let runners: [(&str, &Runner<'_>); 3] = [("strata", &strata_run), ("hashpool", &hashpool_run), ("memory", &memory_run)];
            let round_cfg = RunCfg { seconds: cfg.seconds.map(|s| s / ROUNDS as f64), ..cfg };
            let mut results: Vec<Vec<EResult<Map<String, Value>>>> = (0..runners.len()).map(|_| Vec::new()).collect();
            for round in 0..ROUNDS {
                for j in 0..runners.len() {
                    let e = (j + round) % runners.len();
                    results[e].push((runners[e].1)(&round_cfg));
                }
            }
            let mut engines = Map::new();
            for ((name, _), rs) in runners.iter().zip(results) {
                engines.insert((*name).into(), super::median_round(rs, "ops_per_sec"));
            }

            let params = json!({
                "mode": mode,
                "threads": threads,
                "page_size": page_size,
                "pool_bytes": pool,
                "data_bytes": data,
                "distribution": "uniform",
                "phase": "warm",
                "bytes_per_op": 16,
            });
            runs.push(run_value(params.as_object().cloned().unwrap_or_default(), engines));
        }
    }
    ctx.notes.push("fix: every page is resident (checked); bytes_per_sec counts the 16 bytes each operation reads. 'memory' is the same payload bytes in one array with no latch at all (writes: relaxed atomic stores). hashpool has no optimistic latch, so its optimistic-mode figures use its shared content lock. Each run is 3 rounds with the engine order rotated; the median round is reported (rounds_ops_per_sec lists all).".into());
    Ok(runs)
}
