//! `partitions`: uniform random page reads through strata with its resident set and clock in
//! 1, 2, 4, 8 partitions (`Config::clock_partitions`; `--partitions` picks others), at each
//! thread count, over a data set that fits in the pool ("in": 7/8 of the pool, the clock
//! idle) and one 4x the pool ("out": every read past the warm-up is likely a miss, so
//! every thread inserts into the resident set and runs the clock). The engines are
//! `strata-p1`, `strata-p2`, ... (strata with that many partitions, otherwise as the
//! `strata` engine of `random-read`); each is opened cold, filled, warmed (out) and
//! measured exactly as in `random-read` (see there), engines in rotating order per round.
//!
//! Each run's `speedup_vs_one_partition` maps every engine to its ops/s divided by
//! `strata-p1`'s in the same run (when `strata-p1` ran); every engine's figures carry its
//! `clock_partitions` and strata's `contention` counters (`clock_moves`: clock batches
//! that found no victim in a partition and moved on to the next one).

use serde_json::{json, Map, Value};

use super::{median_round, Ctx, Rounds};
use crate::dataset::{DataSet, FileSpec};
use crate::engines::StrataStore;
use crate::harness::{engine_value, measure, measure_store, run_value, RunCfg, Step};
use crate::workload::{probe, Distribution, Rng, Sampler};
use crate::{EResult, Page, PageStore};

/// The partition counts run by default.
pub const DEFAULT_PARTITIONS: [usize; 4] = [1, 2, 4, 8];

pub(super) fn run(ctx: &mut Ctx<'_>) -> EResult<Vec<Value>> {
    let o = ctx.opts;
    let pool = o.pool.unwrap_or(32 << 20);
    let ps = o.page_sizes.as_ref().and_then(|s| s.first().copied()).unwrap_or(4 << 10);
    let data_out = o.data.unwrap_or(4 * pool);
    let data_in = pool / 8 * 7;
    let seconds = o.seconds.unwrap_or(0.3);
    let parts = o.partitions.clone().unwrap_or_else(|| DEFAULT_PARTITIONS.to_vec());
    let specs = [FileSpec { page_size: ps, pages: (data_out.max(data_in) / ps).max(1) }];
    ctx.progress(|| format!("building a file of {}", super::short_size(data_out.max(data_in))));
    let ds = DataSet::build(&ctx.scratch.path().join("db"), ps, &specs)?;
    let rounds = o.rounds.unwrap_or(1).max(1);
    let names: Vec<String> = parts.iter().map(|p| format!("strata-p{p}")).collect();
    let mut runs = Vec::new();
    for (memory, data) in [("in", data_in), ("out", data_out)] {
        if o.memory.as_deref().is_some_and(|m| m != memory) {
            continue;
        }
        let n = (data / ps).max(1);
        let sampler = Sampler::new(n, Distribution::Uniform);
        for &threads in &o.thread_counts() {
            let cfg = RunCfg { threads, seconds: o.ops.is_none().then_some(seconds), ops: o.ops, sample_every: if memory == "in" { 8 } else { 1 } };
            let warm = RunCfg { seconds: cfg.seconds.map(|s| s / 2.0), ops: cfg.ops.map(|x| x / 2), ..cfg };
            let make = |t: usize| (Rng::new(0x5EED ^ ((t as u64) << 40) ^ n), 0u64);
            let make_warm = |t: usize| (Rng::new(0x3A3B ^ ((t as u64) << 40) ^ n), 0u64);
            let mut results: Vec<Rounds> = vec![Vec::new(); parts.len()];
            for round in 0..rounds {
                for j in 0..parts.len() {
                    let e = (j + round) % parts.len();
                    ctx.progress(|| format!("{memory} t{threads}: {} (round {}/{rounds})", names[e], round + 1));
                    let store = StrataStore::open_with_partitions(&ds, pool, parts[e])?;
                    let op = |st: &mut (Rng, u64)| {
                        let i = sampler.sample(&mut st.0);
                        let salt = st.0.next_u64();
                        store.read(Page::new(0, i), &mut |d| st.1 ^= probe(d, salt))?;
                        std::hint::black_box(st.1);
                        Ok(Step::Did { bytes: ps })
                    };
                    let r = (|| {
                        // Fill (in: every page; out: a pool's worth) in parallel, then (out)
                        // let the workload shape the pool's contents.
                        super::fill_cache(&store, &cfg, 0, n, pool, ps)?;
                        if memory == "out" {
                            measure(&warm, make_warm, op)?;
                        }
                        let before = store.bm().stats().contention;
                        let mut m = measure_store(&store, &cfg, make, op)?;
                        let after = store.bm().stats().contention;
                        m.insert("clock_partitions".into(), json!(store.bm().clock_partitions()));
                        // The counters of the measured phase alone (`contention` in the
                        // engine's description counts since open).
                        m.insert(
                            "measured_contention".into(),
                            json!({
                                "latch_waits": after.latch_waits - before.latch_waits,
                                "reservation_waits": after.reservation_waits - before.reservation_waits,
                                "resident_set_waits": after.resident_set_waits - before.resident_set_waits,
                                "clock_moves": after.clock_moves - before.clock_moves,
                            }),
                        );
                        EResult::Ok(m)
                    })();
                    results[e].push(r);
                }
            }
            let mut engines = Map::new();
            for (name, rs) in names.iter().zip(results) {
                let v = if rounds == 1 { engine_value(rs.into_iter().next().expect("one round")) } else { median_round(rs, "ops_per_sec") };
                engines.insert(name.clone(), v);
            }
            let ops = |v: &Value| v.get("ops_per_sec").and_then(Value::as_f64).filter(|&x| x > 0.0);
            let mut speedup = Map::new();
            if let Some(base) = engines.get("strata-p1").and_then(ops) {
                for (name, v) in &engines {
                    if let Some(x) = ops(v) {
                        speedup.insert(name.clone(), json!((x / base * 1000.0).round() / 1000.0));
                    }
                }
            }
            let mut params = super::random_read::read_params(threads, ps, pool, n, memory, "uniform");
            params["partitions"] = json!(parts);
            if rounds > 1 {
                params["rounds"] = json!(rounds);
            }
            let mut run = run_value(params.as_object().cloned().unwrap_or_default(), engines);
            run["speedup_vs_one_partition"] = Value::Object(speedup);
            runs.push(run);
        }
    }
    ctx.notes.push(format!(
        "partitions: strata with its resident set and clock in {parts:?} partitions (engines strata-pN); uniform random reads of {} pages; in = data 7/8 of the pool, out = 4x the pool; each engine opened cold per run, filled, warmed (out: half the measured time), then measured for {seconds} s; {rounds} round(s) per engine (rotating order; median by ops/s, rounds_ops_per_sec lists every round). speedup_vs_one_partition = ops/s / strata-p1's ops/s in the same run; measured_contention = strata's contention counters during the measured phase only.",
        super::short_size(ps)
    ));
    Ok(runs)
}
