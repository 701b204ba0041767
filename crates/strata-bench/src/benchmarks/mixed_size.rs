//! `mixed-size`: demand shifting between small and large pages under one total memory:
//! strata (one budget for every size) vs static-split (a 4 KiB pool with 75 % of the memory
//! and a 256 KiB pool with 25 %, Kùzu before its variable-size buffer manager).
//!
//! Both engines live through three phases in order (the shift is the point):
//!
//! 1. `large-heavy`: a working set of 80 % of the memory, 90 % of its bytes in large pages.
//! 2. `small-heavy`: the same with 90 % of the bytes in small pages.
//! 3. `large-pinned`: each operation holds large pages worth half of the memory (split over
//!    the threads) at once, as an operator keeping a hash table or sort runs resident.
//!
//! Phases 1 and 2 first read every page of the new working set once (`shift_seconds`: how
//! long the engine takes to adapt), then read pages at random, weighted by bytes. An engine
//! that cannot hold what a phase needs reports `{"failed": reason}` for it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};

use super::{short_size, Ctx};
use crate::dataset::{DataSet, FileSpec};
use crate::engines::{StaticSplit, StrataStore};
use crate::harness::{engine_value, measure, measure_store, run_value, RunCfg, Step};
use crate::workload::{prefault, probe, Rng};
use crate::{EResult, Page, PageStore};

const SMALL_FRACTION: f64 = 0.75;

#[derive(Clone, Copy)]
struct Phase {
    name: &'static str,
    /// Working set: pages 0..small of the small file and 0..large of the large file.
    small: u64,
    large: u64,
    /// Large pages held at once per operation (pinned phase), else 0.
    group: u64,
}

pub(super) fn run(ctx: &mut Ctx<'_>) -> EResult<Vec<Value>> {
    let o = ctx.opts;
    let pool = o.pool.unwrap_or(32 << 20);
    let (small, large) = match o.page_sizes.as_deref() {
        Some([a, b, ..]) => ((*a).min(*b), (*a).max(*b)),
        Some([a]) => (4096.min(*a), 4096.max(*a)),
        _ => (4 << 10, 256 << 10),
    };
    let seconds = o.seconds.unwrap_or(1.0);
    let main = pool / 100 * 72; // 90 % of a working set of 80 % of the memory
    let minor = pool / 100 * 8;
    let small_pages = (main / small).max(1);
    let large_pages = (main / large).max(1);
    let small_minor = (minor / small).clamp(1, small_pages);
    let large_minor = (minor / large).clamp(1, large_pages);
    ctx.progress(|| format!("building {} small and {} large pages", small_pages, large_pages));
    let ds = DataSet::build(
        &ctx.scratch.path().join("db"),
        small,
        &[FileSpec { page_size: small, pages: small_pages }, FileSpec { page_size: large, pages: large_pages }],
    )?;
    let phases = |threads: u64| {
        [
            Phase { name: "large-heavy", small: small_minor, large: large_pages, group: 0 },
            Phase { name: "small-heavy", small: small_pages, large: large_minor, group: 0 },
            Phase { name: "large-pinned", small: 0, large: large_pages, group: (pool / 2 / threads / large).clamp(1, large_pages) },
        ]
    };

    let mut runs = Vec::new();
    for &threads in &o.thread_counts() {
        ctx.progress(|| format!("t{threads}: opening both engines"));
        let strata = StrataStore::open(&ds, pool);
        let split = StaticSplit::open(&ds.files, pool, small as usize, large as usize, SMALL_FRACTION);
        for ph in phases(threads as u64) {
            let mut engines = Map::new();
            for (name, store) in [("strata", strata.as_ref().map(|s| s as &dyn PageStore)), ("static-split", split.as_ref().map(|s| s as &dyn PageStore))] {
                ctx.progress(|| format!("t{threads} {}: {name}", ph.name));
                let r = store
                    .map_err(|e| e.clone())
                    .and_then(|store| sampled(store, [small, large], || run_phase(store, ph, small, large, threads, seconds, o.ops)));
                engines.insert(name.into(), engine_value(r));
            }
            let ws = ph.small * small + ph.large * large;
            let mut params = json!({
                "threads": threads,
                "page_size": [small, large],
                "pool_bytes": pool,
                "data_bytes": ds.bytes(),
                "phase": ph.name,
                "split": format!("static-split: {:.0}% for {} pages, {:.0}% for {} pages", SMALL_FRACTION * 100.0, short_size(small), (1.0 - SMALL_FRACTION) * 100.0, short_size(large)),
            });
            if ph.group > 0 {
                params["pinned_bytes_per_thread"] = json!(ph.group * large);
                params["pinned_bytes"] = json!(ph.group * large * threads as u64);
            } else {
                params["working_set_bytes"] = json!(ws);
                params["large_bytes_share"] = json!(((ph.large * large) as f64 / ws as f64 * 100.0).round() / 100.0);
                params["distribution"] = json!("uniform-by-bytes");
            }
            runs.push(run_value(params.as_object().cloned().unwrap_or_default(), engines));
        }
    }
    ctx.notes.push("mixed-size: both engines live through the phases in order (large-heavy, small-heavy, large-pinned) with the same total memory; shift_seconds is the time to read the new working set once after the shift. An operation reads one page (pinned phase: holds a group of large pages at once).".into());
    Ok(runs)
}

/// How often [`sampled`] records the engine's memory.
const SAMPLE_EVERY: Duration = Duration::from_millis(25);

/// Runs `phase` while a second thread records `store`'s memory every [`SAMPLE_EVERY`], and
/// adds the series to its figures as `memory_timeline`: `samples` of `[seconds since the
/// phase started, resident bytes of each of page_sizes..., virtual bytes]` (physical memory
/// of resident pages by page size, and the virtual memory reserved for frames).
fn sampled(store: &dyn PageStore, page_sizes: [u64; 2], phase: impl FnOnce() -> EResult<Map<String, Value>>) -> EResult<Map<String, Value>> {
    let done = AtomicBool::new(false);
    let start = Instant::now();
    let sample = |samples: &mut Vec<Value>| {
        if let Some(m) = store.memory() {
            let mut row = vec![json!((start.elapsed().as_secs_f64() * 1e3).round() / 1e3)];
            row.extend(page_sizes.iter().map(|&s| json!(m.resident_of(s))));
            row.push(json!(m.virtual_bytes));
            samples.push(Value::Array(row));
        }
    };
    let (result, samples) = std::thread::scope(|sc| {
        let sampler = sc.spawn(|| {
            let mut samples = Vec::new();
            while !done.load(Ordering::Acquire) {
                sample(&mut samples);
                std::thread::park_timeout(SAMPLE_EVERY);
            }
            samples
        });
        let result = phase();
        done.store(true, Ordering::Release);
        sampler.thread().unpark();
        let mut samples = sampler.join().unwrap_or_default();
        sample(&mut samples);
        (result, samples)
    });
    let mut m = result?;
    if samples.len() > 1 {
        m.insert(
            "memory_timeline".into(),
            json!({"page_sizes": page_sizes, "columns": ["seconds", "resident_small_bytes", "resident_large_bytes", "virtual_bytes"], "samples": samples}),
        );
    }
    Ok(m)
}

fn run_phase(store: &dyn PageStore, ph: Phase, small: u64, large: u64, threads: usize, seconds: f64, ops: Option<u64>) -> EResult<Map<String, Value>> {
    let cfg = RunCfg { threads, seconds: ops.is_none().then_some(seconds), ops, sample_every: 4 };
    let make = |t: usize| (Rng::new(0x313D ^ ((t as u64) << 36)), 0u64);
    if ph.group > 0 {
        return measure_store(store, &cfg, make, |st| {
            let start = st.0.below(ph.large);
            let salt = st.0.next_u64();
            let pages: Vec<Page> = (0..ph.group).map(|j| Page::new(1, (start + j) % ph.large)).collect();
            store.read_pinned(&pages, &mut |_, d| st.1 ^= probe(d, salt))?;
            std::hint::black_box(st.1);
            Ok(Step::Did { bytes: ph.group * large })
        });
    }
    // The shift: read every page of the new working set once, in parallel.
    let total = ph.small + ph.large;
    let cursor = AtomicU64::new(0);
    let shift = measure(
        &RunCfg { threads, seconds: None, ops: None, sample_every: 1 },
        |_| (),
        |_| {
            let i = cursor.fetch_add(1, Ordering::Relaxed);
            if i >= total {
                return Ok(Step::Done);
            }
            let (page, bytes) = if i < ph.large { (Page::new(1, i), large) } else { (Page::new(0, i - ph.large), small) };
            store.read(page, &mut |d| {
                std::hint::black_box(prefault(d));
            })?;
            Ok(Step::Did { bytes })
        },
    )?;
    let large_bytes = ph.large * large;
    let ws = large_bytes + ph.small * small;
    let mut m = measure_store(store, &cfg, make, |st| {
        let r = st.0.below(ws);
        let salt = st.0.next_u64();
        let (page, bytes) = if r < large_bytes { (Page::new(1, r / large), large) } else { (Page::new(0, (r - large_bytes) / small), small) };
        store.read(page, &mut |d| st.1 ^= probe(d, salt))?;
        std::hint::black_box(st.1);
        Ok(Step::Did { bytes })
    })?;
    m.insert("shift_seconds".into(), json!((shift.seconds * 1e6).round() / 1e6));
    Ok(m)
}
