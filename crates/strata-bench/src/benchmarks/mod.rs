//! The benchmarks. Each builds its data set in a scratch directory, runs every engine on every
//! parameter set (engines alternate within the run, so that a noisy machine affects them
//! alike), and returns one JSON object:
//! `{"bench", "machine", "runs": [{"params", "engines", "ratios"}], "notes"}`.

mod bfs;
mod btree;
mod durability;
mod fix;
mod mixed_size;
mod partitions;
mod random_read;
mod remote;
mod scan;

use std::path::PathBuf;

use serde_json::{json, Map, Value};

use crate::dataset::{DataFile, DataSet, ScratchDir};
use crate::engines::{CgroupCap, HashPool, MmapStore, RawStore, StrataStore};
use crate::harness::engine_value;
use crate::{EResult, EngineError, PageStore};

/// The benchmark names.
pub const BENCHMARKS: &[&str] = &["fix", "random-read", "scan", "mixed-size", "commit", "recovery", "remote", "btree", "partitions", "bfs"];

pub use partitions::DEFAULT_PARTITIONS;

pub use btree::child_main as btree_child;

pub use bfs::edges as bfs_edges;

/// Options shared by the benchmarks; `None` means the benchmark's default (sized to finish in
/// under a minute on a 2-core machine).
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Thread counts to run (default: 1, 2, 4, ... up to the core count, and the core count).
    pub threads: Option<Vec<usize>>,
    /// Memory budget of the cached engines (the pool).
    pub pool: Option<u64>,
    /// Data set size (for `random-read`: the out-of-memory data set; the in-memory one is
    /// 7/8 of the pool).
    pub data: Option<u64>,
    /// Seconds per measurement.
    pub seconds: Option<f64>,
    /// Operations per thread per measurement instead of a duration (deterministic, for tests).
    pub ops: Option<u64>,
    /// Where the scratch directory with the data files goes (default: the system temporary
    /// directory). The scratch directory is removed afterwards.
    pub dir: Option<PathBuf>,
    /// Page sizes (meaning per benchmark; see the docs).
    pub page_sizes: Option<Vec<u64>>,
    /// Print progress lines on stderr.
    pub progress: bool,
    /// `random-read`: the total number of reads in flight to aim for. Where it is larger than
    /// the thread count, each operation of the measured phase reads a batch of
    /// `max(1, queue_depth / threads)` random pages with [`crate::PageStore::read_batch`]
    /// (default: synchronous reads, queue depth = threads). Other benchmarks refuse it.
    pub queue_depth: Option<usize>,
    /// `remote`: URL of the Valkey/Redis server for the remote tier (default: a private
    /// server started and stopped by the benchmark).
    pub remote: Option<String>,
    /// `random-read`, `scan`, `btree`, `bfs`: run only these engines (default: all of the
    /// benchmark's). Ratios need `strata` and the baseline in the same run.
    pub engines: Option<Vec<String>>,
    /// `random-read`, `btree`: run only the `in`-memory or only the `out`-of-memory data set.
    pub memory: Option<String>,
    /// `scan`, `random-read`, `btree`, `bfs`: rounds per engine (each on a freshly opened engine,
    /// engines in rotating order); the median round is reported (default: scan 3,
    /// bfs 3, random-read and btree 1).
    pub rounds: Option<usize>,
    /// `btree`: an executable that runs one engine's share of the benchmark in a process of
    /// its own when called as `EXE bench-child btree SPEC` (the `strata` binary), so that
    /// each engine's peak RSS is its own. Without it every engine runs in this process.
    pub child_exe: Option<PathBuf>,
    /// `partitions`: the resident-set partition counts to compare (each a power of two from
    /// 1 to 64; default [`DEFAULT_PARTITIONS`]).
    pub partitions: Option<Vec<usize>>,
}

impl Options {
    /// The thread counts to run.
    pub fn thread_counts(&self) -> Vec<usize> {
        if let Some(t) = &self.threads {
            return t.iter().copied().filter(|&t| t > 0).collect();
        }
        let cores = crate::machine::cores();
        let mut v = Vec::new();
        let mut t = 1;
        while t < cores {
            v.push(t);
            t *= 2;
        }
        v.push(cores);
        v
    }
}

/// Shared context of one benchmark invocation.
pub(crate) struct Ctx<'a> {
    pub opts: &'a Options,
    pub scratch: ScratchDir,
    pub notes: Vec<String>,
}

impl Ctx<'_> {
    /// The engines of `all` to run: those `--engines` names, else all, in `all`'s order.
    pub fn engines<'e>(&self, all: &[&'e str]) -> Vec<&'e str> {
        self.engines_of(all, all)
    }

    /// The engines of `known` that `--engines` names, else `defaults` (engines that run only
    /// when asked for are in `known` alone).
    pub fn engines_of<'e>(&self, known: &[&'e str], defaults: &[&'e str]) -> Vec<&'e str> {
        match &self.opts.engines {
            Some(want) => known.iter().copied().filter(|e| want.iter().any(|w| w == e)).collect(),
            None => defaults.to_vec(),
        }
    }

    pub fn progress(&self, msg: impl FnOnce() -> String) {
        if self.opts.progress {
            eprintln!("[bench] {}", msg());
        }
    }
}

/// Runs benchmark `name` and returns its JSON object.
pub fn run(name: &str, opts: &Options) -> Result<Value, String> {
    if !BENCHMARKS.contains(&name) {
        return Err(format!("unknown benchmark {name:?} (known: {})", BENCHMARKS.join(", ")));
    }
    if opts.thread_counts().is_empty() {
        return Err("--threads needs at least one positive count".into());
    }
    if let Some(s) = opts.seconds {
        if !(s.is_finite() && s > 0.0) {
            return Err(format!("--seconds must be positive, got {s}"));
        }
    }
    if let Some(q) = opts.queue_depth {
        if q == 0 {
            return Err("--queue-depth must be at least 1".into());
        }
        if name != "random-read" {
            return Err(format!("--queue-depth applies to random-read only, not to {name}"));
        }
    }
    if let Some(want) = &opts.engines {
        let known: &[&str] = match name {
            "random-read" => random_read::ENGINES.as_slice(),
            "scan" => scan::KNOWN.as_slice(),
            "btree" => btree::ENGINES.as_slice(),
            "bfs" => bfs::ENGINES.as_slice(),
            _ => return Err(format!("--engines applies to random-read, scan, btree and bfs only, not to {name}")),
        };
        if want.is_empty() {
            return Err("--engines needs at least one engine".into());
        }
        if let Some(bad) = want.iter().find(|w| !known.contains(&w.as_str())) {
            return Err(format!("{name} has no engine {bad:?} (known: {})", known.join(", ")));
        }
    }
    if let Some(p) = &opts.partitions {
        if name != "partitions" {
            return Err(format!("--partitions applies to partitions only, not to {name}"));
        }
        if p.is_empty() {
            return Err("--partitions needs at least one count".into());
        }
        if let Some(bad) = p.iter().find(|&&n| !n.is_power_of_two() || n > 64) {
            return Err(format!("--partitions: {bad} is not a power of two from 1 to 64"));
        }
    }
    if let Some(r) = opts.rounds {
        if !["scan", "random-read", "btree", "partitions", "bfs"].contains(&name) {
            return Err(format!("--rounds applies to scan, random-read, btree, partitions and bfs only, not to {name}"));
        }
        if r == 0 {
            return Err("--rounds must be at least 1".into());
        }
    }
    if let Some(m) = &opts.memory {
        if !["random-read", "btree", "partitions"].contains(&name) {
            return Err(format!("--memory applies to random-read, btree and partitions only, not to {name}"));
        }
        if m != "in" && m != "out" {
            return Err(format!("--memory must be in or out, got {m:?}"));
        }
    }
    let scratch = ScratchDir::new(opts.dir.as_deref()).map_err(|e| format!("create a scratch directory: {e}"))?;
    let machine = crate::machine::describe(scratch.path());
    let mut ctx = Ctx { opts, scratch, notes: Vec::new() };
    let runs = match name {
        "fix" => fix::run(&mut ctx),
        "random-read" => random_read::run(&mut ctx),
        "scan" => scan::run(&mut ctx),
        "mixed-size" => mixed_size::run(&mut ctx),
        "commit" => durability::run_commit(&mut ctx),
        "recovery" => durability::run_recovery(&mut ctx),
        "remote" => remote::run(&mut ctx),
        "btree" => btree::run(&mut ctx),
        "partitions" => partitions::run(&mut ctx),
        "bfs" => bfs::run(&mut ctx),
        _ => unreachable!(),
    }
    .map_err(|e| format!("{name}: {e}"))?;
    Ok(json!({ "bench": name, "machine": machine, "runs": runs, "notes": ctx.notes }))
}

/// Opens the mmap engine (cold: the files' pages dropped from the page cache first), under a
/// cgroup v2 memory cap of `cap_bytes` where the machine allows, runs `f` on it, and closes
/// it. The engine's figures say whether it was capped.
pub(crate) fn with_mmap<T>(files: &[DataFile], cap_bytes: u64, f: impl FnOnce(&MmapStore) -> T) -> EResult<T> {
    let cap = CgroupCap::enter(cap_bytes);
    // SAFETY: the data files live in this run's private scratch directory; nothing writes or
    // truncates them while they are mapped (the other engines only read them, and each
    // engine is closed before the next is opened).
    let mut store = unsafe { MmapStore::open(files, true) }?;
    let mut info = Map::new();
    match &cap {
        Ok(c) => {
            info.insert("capped".into(), true.into());
            info.insert("cap_bytes".into(), c.limit().into());
            info.insert("cap".into(), "cgroup v2 memory.max".into());
        }
        Err(why) => {
            info.insert("capped".into(), false.into());
            info.insert("uncapped_because".into(), why.clone().into());
        }
    }
    store.set_cap_info(info);
    let r = f(&store);
    drop(store);
    drop(cap);
    Ok(r)
}

/// Opens engine `name` over the data set (cold), runs `f` on it and closes it. `pool` is the
/// memory budget of the cached engines (and mmap's cap where one can be made); `page_size`
/// picks the hashpool's page size; `chunk` is raw's scan request size.
pub(crate) fn with_engine<T>(name: &str, ds: &DataSet, pool: u64, page_size: usize, chunk: usize, f: impl FnOnce(&dyn PageStore) -> EResult<T>) -> EResult<T> {
    match name {
        "strata" => f(&StrataStore::open(ds, pool)?),
        "strata-auto" => f(&StrataStore::open_with(ds, pool, false)?),
        "strata-noprefetch" => f(&StrataStore::open_without_prefetch(ds, pool)?),
        "strata-noring" => f(&StrataStore::open_without_rings(ds, pool)?),
        "strata-recycle" => f(&StrataStore::open_with_recycling(ds, pool)?),
        "hashpool" => f(&HashPool::open(&ds.files, page_size, pool, false)?),
        "mmap" => with_mmap(&ds.files, pool, |m| f(m))?,
        "raw" => f(&RawStore::open(&ds.files, chunk)?),
        other => Err(EngineError(format!("unknown engine {other}"))),
    }
}

/// One engine's figures in each round of one run.
pub(crate) type Rounds = Vec<EResult<Map<String, Value>>>;

/// An engine's figures: those of its median round by `key`, with `"rounds_<key>"` listing
/// every round's; if any round failed, that failure (an engine that cannot complete a run
/// reports `{"failed": reason}`).
/// Fills a page store's cache before a measurement: reads pages `0..min(pages, pool /
/// page_size)` of file `file` once, on `cfg.threads` threads taking pages from a shared
/// cursor (touching each 4 KiB of every page, so that its memory is resident).
pub(crate) fn fill_cache(store: &dyn PageStore, cfg: &crate::harness::RunCfg, file: u16, pages: u64, pool: u64, page_size: u64) -> EResult<()> {
    let fill = pages.min(pool / page_size);
    let cursor = std::sync::atomic::AtomicU64::new(0);
    let fill_cfg = crate::harness::RunCfg { seconds: None, ops: None, ..*cfg };
    crate::harness::measure(
        &fill_cfg,
        |_| (),
        |_| {
            let i = cursor.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if i >= fill {
                return Ok(crate::harness::Step::Done);
            }
            store.read(crate::Page::new(file, i), &mut |d| {
                std::hint::black_box(crate::workload::prefault(d));
            })?;
            Ok(crate::harness::Step::Did { bytes: page_size })
        },
    )?;
    Ok(())
}

pub(crate) fn median_round(rounds: Rounds, key: &str) -> Value {
    let mut ok = match rounds.into_iter().collect::<EResult<Vec<_>>>() {
        Ok(ok) if !ok.is_empty() => ok,
        Ok(_) => return engine_value(Err(EngineError("no round ran".into()))),
        Err(e) => return engine_value(Err(e)),
    };
    let of = |m: &Map<String, Value>| m.get(key).and_then(Value::as_f64).unwrap_or(0.0);
    let all: Vec<f64> = ok.iter().map(of).collect();
    ok.sort_by(|a, b| of(a).total_cmp(&of(b)));
    let mut m = ok.swap_remove(ok.len() / 2);
    m.insert(format!("rounds_{key}"), json!(all));
    Value::Object(m)
}

/// A note for the output when mmap could not be capped.
pub(crate) fn mmap_cap_note(ctx: &mut Ctx<'_>) {
    if let Err(why) = CgroupCap::probe() {
        ctx.notes.push(format!(
            "mmap runs UNCAPPED (\"capped\": false): {why}. The OS page cache may hold the whole data set, so mmap's out-of-memory and warm figures are in-memory figures."
        ));
    }
}

/// `"4KiB"`-style short size.
pub fn short_size(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if v.fract() == 0.0 {
        format!("{}{}", v as u64, UNITS[u])
    } else {
        format!("{v:.1}{}", UNITS[u])
    }
}

/// A short label of a run for tables and plots, from the parameters that vary between runs.
pub fn run_label(params: &Value, varying: &[String]) -> String {
    let mut parts = Vec::new();
    for k in varying {
        let Some(v) = params.get(k) else { continue };
        let s = match (k.as_str(), v) {
            ("threads", v) => format!("t{v}"),
            (k, Value::Number(n)) if k.ends_with("bytes") || k == "page_size" => n.as_u64().map(short_size).unwrap_or_else(|| n.to_string()),
            (_, Value::String(s)) => s.clone(),
            (_, Value::Array(a)) => a.iter().map(|x| x.as_u64().map(short_size).unwrap_or_else(|| x.to_string())).collect::<Vec<_>>().join("+"),
            (_, v) => v.to_string(),
        };
        parts.push(s);
    }
    parts.join(" ")
}

/// The parameter keys whose values differ between the runs of a report (in a fixed order,
/// the most significant first).
pub fn varying_params(report: &Value) -> Vec<String> {
    let runs = report.get("runs").and_then(Value::as_array).cloned().unwrap_or_default();
    let order = ["mode", "page_size", "memory", "data_bytes", "workload", "distribution", "phase", "threads"];
    let mut keys: Vec<String> = Vec::new();
    for k in order {
        let vals: Vec<Option<&Value>> = runs.iter().map(|r| r.get("params").and_then(|p| p.get(k))).collect();
        let mut distinct: Vec<&Value> = vals.iter().flatten().copied().collect();
        distinct.dedup();
        distinct.sort_by_key(|v| v.to_string());
        distinct.dedup();
        if distinct.len() > 1 {
            keys.push(k.to_owned());
        }
    }
    // data_bytes follows memory (in/out) where both vary.
    if keys.iter().any(|k| k == "memory") {
        keys.retain(|k| k != "data_bytes");
    }
    keys
}

/// A plain-text table of a report (what `strata bench` prints without `--json`).
pub fn text_summary(report: &Value) -> String {
    let mut out = String::new();
    let bench = report.get("bench").and_then(Value::as_str).unwrap_or("?");
    let m = &report["machine"];
    out.push_str(&format!(
        "bench {bench} on {} cores, {} memory, kernel {}\n",
        m["cores"],
        m["memory_bytes"].as_u64().map(short_size).unwrap_or_else(|| "?".into()),
        m["kernel"].as_str().unwrap_or("?")
    ));
    let varying = varying_params(report);
    for r in report["runs"].as_array().into_iter().flatten() {
        out.push_str(&format!("{}\n", run_label(&r["params"], &varying)));
        if let Some(engines) = r["engines"].as_object() {
            for (name, e) in engines {
                if let Some(f) = e.get("failed") {
                    out.push_str(&format!("  {name:<13} FAILED: {}\n", f.as_str().unwrap_or("?")));
                    continue;
                }
                if bench == "bfs" {
                    let ratio = r["ratios"].get(name).and_then(Value::as_f64).map(|x| format!("  {name}/strata seconds = {x:.3}")).unwrap_or_default();
                    out.push_str(&format!(
                        "  {name:<18} {:>8.3} s  CPU {:>7.3} s  read {:>9} in {:>6} requests  reached {} max_depth {}{ratio}\n",
                        e["seconds"].as_f64().unwrap_or(0.0),
                        e["cpu_seconds"].as_f64().unwrap_or(0.0),
                        e["bytes_read"].as_u64().map(short_size).unwrap_or_else(|| "?".into()),
                        e["read_requests"],
                        e["reached"],
                        e["max_depth"],
                    ));
                    continue;
                }
                let ops = e["ops_per_sec"].as_f64().unwrap_or(0.0);
                let bps = e["bytes_per_sec"].as_f64().unwrap_or(0.0);
                let ratio = r["ratios"].get(name).and_then(Value::as_f64).map(|x| format!("  strata/{name} = {x:.2}")).unwrap_or_default()
                    + &r.get("speedup_vs_one_partition")
                        .and_then(|s| s.get(name))
                        .and_then(Value::as_f64)
                        .map(|x| format!("  vs strata-p1 = {x:.3}"))
                        .unwrap_or_default();
                let rss = e.get("peak_rss_bytes").and_then(Value::as_u64).map(|b| format!("  peak RSS {:>9}", short_size(b))).unwrap_or_default();
                out.push_str(&format!(
                    "  {name:<13} {ops:>14.0} ops/s {:>10}/s  p50 {:>9.2} us  p99 {:>9.2} us{rss}{ratio}\n",
                    short_size(bps as u64),
                    e["p50_us"].as_f64().unwrap_or(0.0),
                    e["p99_us"].as_f64().unwrap_or(0.0),
                ));
            }
        }
    }
    for n in report["notes"].as_array().into_iter().flatten() {
        out.push_str(&format!("note: {}\n", n.as_str().unwrap_or("")));
    }
    out
}
