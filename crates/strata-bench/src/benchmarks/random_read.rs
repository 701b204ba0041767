//! `random-read`: random page reads, uniform and Zipf(0.99), over a data set that fits in the
//! pool ("in": 7/8 of the pool, so that every engine's metadata fits too) and one 4x the pool
//! ("out"), for each page size and thread count: strata vs hashpool vs mmap vs raw.
//!
//! An operation reads one page and does a binary search over its words (`log2(words)`
//! dependent reads spread over the page, as a lookup in a sorted page would).
//!
//! Each engine is opened cold for each run and warmed: a parallel pass loads every page (in)
//! or a pool's worth of pages (out), then (out) the workload itself runs for half the
//! measurement time with a different random sequence; then it is measured. Synchronous reads:
//! the queue depth is the thread count, for every engine.
//!
//! `--queue-depth N` ([`crate::Options::queue_depth`]) with N larger than the thread count
//! makes every operation of the *measured* phase a batch: each thread draws
//! `batch = max(1, N / threads)` random pages and reads them with
//! [`PageStore::read_batch`], probing each page as above, so that about N reads can be in
//! flight at once. `raw` sends a batch to the device at once (io_uring, see
//! [`crate::engines::RawStore`]); `strata` loads a batch's missing pages with one
//! `BufferManager::prefetch` and then fixes them one by one; hashpool and mmap keep the
//! default `read_batch`, page after page (their queue depth stays the thread count). An
//! operation is then a batch: `ops`, `ops_per_sec` and the latencies are per batch, and each
//! engine's figures add `pages_per_sec`; `params` record the effective total depth
//! (`queue_depth` = batch x threads) and `batch`. Fill and warm-up are unchanged (one page
//! per operation).

use serde_json::{json, Map, Value};

use super::{median_round, mmap_cap_note, short_size, with_engine, Ctx, Rounds};
use crate::dataset::{DataSet, FileSpec};
use crate::harness::{engine_value, measure, measure_store, run_value, RunCfg, Step};
use crate::workload::{probe, Distribution, Rng, Sampler};
use crate::{EResult, Page, PageStore};

/// `strata-recycle` is strata with frame recycling for every page size
/// (`Config::frame_recycling(Some(0))`; by default only pages of 256 KiB and more).
pub(super) const ENGINES: [&str; 5] = ["strata", "strata-recycle", "hashpool", "mmap", "raw"];

pub(super) fn run(ctx: &mut Ctx<'_>) -> EResult<Vec<Value>> {
    let o = ctx.opts;
    let pool = o.pool.unwrap_or(32 << 20);
    let sizes = o.page_sizes.clone().unwrap_or_else(|| vec![4 << 10, 64 << 10]);
    let data_out = o.data.unwrap_or(4 * pool);
    let data_in = pool / 8 * 7;
    let seconds = o.seconds.unwrap_or(0.3);
    let min_page = sizes.iter().copied().min().unwrap_or(4096);
    let specs: Vec<FileSpec> = sizes.iter().map(|&ps| FileSpec { page_size: ps, pages: (data_out.max(data_in) / ps).max(1) }).collect();
    ctx.progress(|| format!("building {} files of {}", specs.len(), short_size(data_out.max(data_in))));
    let ds = DataSet::build(&ctx.scratch.path().join("db"), min_page, &specs)?;
    mmap_cap_note(ctx);

    // A thread's random state; `pages`/`salts` hold the batch being read (batched runs).
    struct St {
        rng: Rng,
        acc: u64,
        pages: Vec<Page>,
        salts: Vec<u64>,
    }
    let rounds = o.rounds.unwrap_or(1).max(1);
    let mut runs = Vec::new();
    for (k, &ps) in sizes.iter().enumerate() {
        for (memory, data) in [("in", data_in), ("out", data_out)] {
            if o.memory.as_deref().is_some_and(|m| m != memory) {
                continue;
            }
            let n = (data / ps).max(1);
            for dist in [Distribution::Uniform, Distribution::Zipf(0.99)] {
                let sampler = Sampler::new(n, dist);
                for &threads in &o.thread_counts() {
                    // Pages per operation of the measured phase (1: synchronous reads).
                    let batch = match o.queue_depth {
                        Some(q) if q > threads => (q / threads).max(1),
                        _ => 1,
                    };
                    let batched = o.queue_depth.is_some_and(|q| q > threads);
                    let cfg = RunCfg { threads, seconds: o.ops.is_none().then_some(seconds), ops: o.ops, sample_every: if memory == "in" { 8 } else { 1 } };
                    let warm = RunCfg { seconds: cfg.seconds.map(|s| s / 2.0), ops: cfg.ops.map(|x| x / 2), ..cfg };
                    // Warm-up and measurement draw different page sequences (else the
                    // measurement would replay the warm-up and hit what it just loaded).
                    let st = |seed: u64| St { rng: Rng::new(seed), acc: 0, pages: Vec::with_capacity(batch), salts: Vec::with_capacity(batch) };
                    let make = |t: usize| st(0x5EED ^ ((t as u64) << 40) ^ n);
                    let make_warm = |t: usize| st(0x3A3B ^ ((t as u64) << 40) ^ n);
                    let names = ctx.engines(&ENGINES);
                    let mut results: Vec<Rounds> = vec![Vec::new(); names.len()];
                    for round in 0..rounds {
                        for j in 0..names.len() {
                            // Rotating order, so that no engine always follows the same one.
                            let e = (j + round) % names.len();
                            let name = names[e];
                            ctx.progress(|| format!("{} {memory} {} t{threads}: {name} (round {}/{rounds})", short_size(ps), dist.name(), round + 1));
                            let r = with_engine(name, &ds, pool, ps as usize, 1 << 20, |store: &dyn PageStore| {
                                let op = |st: &mut St| {
                                    let i = sampler.sample(&mut st.rng);
                                    let salt = st.rng.next_u64();
                                    store.read(Page::new(k as u16, i), &mut |d| st.acc ^= probe(d, salt))?;
                                    std::hint::black_box(st.acc);
                                    Ok(Step::Did { bytes: ps })
                                };
                                // The same per page, `batch` pages per operation through read_batch.
                                let op_batch = |st: &mut St| {
                                    st.pages.clear();
                                    st.salts.clear();
                                    for _ in 0..batch {
                                        st.pages.push(Page::new(k as u16, sampler.sample(&mut st.rng)));
                                        st.salts.push(st.rng.next_u64());
                                    }
                                    let (acc, salts) = (&mut st.acc, &st.salts);
                                    store.read_batch(&st.pages, &mut |j, d| *acc ^= probe(d, salts[j]))?;
                                    std::hint::black_box(st.acc);
                                    Ok(Step::Did { bytes: batch as u64 * ps })
                                };
                                if name != "raw" {
                                    // Fill the cache (in: every page; out: a pool's worth), in
                                    // parallel, then (out) let the workload shape its contents.
                                    super::fill_cache(store, &cfg, k as u16, n, pool, ps)?;
                                    if memory == "out" {
                                        measure(&warm, make_warm, op)?;
                                    }
                                }
                                if batched {
                                    let mut m = measure_store(store, &cfg, make, op_batch)?;
                                    let batches = m.get("ops_per_sec").and_then(Value::as_f64).unwrap_or(0.0);
                                    m.insert("pages_per_sec".into(), json!((batches * batch as f64).round()));
                                    if let Some(c) = m.get("cpu_us_per_op").and_then(Value::as_f64) {
                                        m.insert("cpu_us_per_page".into(), json!((c / batch as f64 * 1e3).round() / 1e3));
                                    }
                                    Ok(m)
                                } else {
                                    measure_store(store, &cfg, make, op)
                                }
                            });
                            results[e].push(r);
                        }
                    }
                    let mut engines = Map::new();
                    for (name, rs) in names.iter().zip(results) {
                        let v = if rounds == 1 { engine_value(rs.into_iter().next().expect("one round")) } else { median_round(rs, "ops_per_sec") };
                        engines.insert((*name).into(), v);
                    }
                    let mut params = read_params(threads, ps, pool, n, memory, dist.name());
                    params["queue_depth"] = json!(batch * threads);
                    if o.queue_depth.is_some() {
                        params["batch"] = json!(batch);
                    }
                    if rounds > 1 {
                        params["rounds"] = json!(rounds);
                    }
                    if let Distribution::Zipf(theta) = dist {
                        params["zipf_theta"] = json!(theta);
                    }
                    runs.push(run_value(params.as_object().cloned().unwrap_or_default(), engines));
                }
            }
        }
    }
    if let Some(q) = o.queue_depth {
        ctx.notes.push(format!(
            "random-read --queue-depth {q}: where {q} is larger than the thread count, each measured operation reads a batch of max(1, {q} / threads) random pages (params: batch, queue_depth = batch x threads), so ops, ops_per_sec, cpu_us_per_op and latencies are per batch and pages_per_sec = ops_per_sec x batch (cpu_us_per_page = cpu_us_per_op / batch); raw reads a batch through io_uring (batch_io_uring says whether it could), strata with one batch load (prefetch) then a fix per page, hashpool and mmap page after page (their queue depth stays the thread count); fill and warm-up read one page per operation. Where {q} is not larger than the thread count the reads are synchronous (batch 1, queue_depth = threads)."
        ));
    }
    ctx.notes.push(format!(
        "random-read: in = data 7/8 of the pool (fits with every engine's metadata), out = 4x the pool; each engine opened cold per run, warmed, then measured for {seconds} s; raw is never warmed (it has no cache). Latency sampled every 8th op in memory, every op out of memory. {rounds} round(s) per engine and run (engines in rotating order, each round on a freshly opened engine); with more than one, an engine's figures are its median round by ops/s and rounds_ops_per_sec lists every round."
    ));
    Ok(runs)
}

/// The parameters of a random-read measurement (also `partitions`'): `n` pages of `ps`
/// bytes read through a pool of `pool` bytes, measured warm.
pub(super) fn read_params(threads: usize, ps: u64, pool: u64, n: u64, memory: &str, distribution: &str) -> Value {
    json!({
        "threads": threads,
        "page_size": ps,
        "pool_bytes": pool,
        "data_bytes": n * ps,
        "memory": memory,
        "data_to_pool": ((n * ps) as f64 / pool as f64 * 1000.0).round() / 1000.0,
        "distribution": distribution,
        "phase": "warm",
    })
}
