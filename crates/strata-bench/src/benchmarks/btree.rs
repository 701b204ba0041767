//! `btree`: YCSB-style key-value workloads on 8-byte keys and 100-byte values
//! ([`crate::kv`]): strata's B+-tree against redb, LMDB (heed) and an in-memory `BTreeMap`,
//! each given the same memory (the pool).
//!
//! For each data set (`in`: entries of half the pool; `out`: 4x the pool, or `--data`) and
//! thread count, each engine runs in a **child process of its own** (the `strata` binary's
//! hidden `bench-child` command; [`crate::Options::child_exe`]), so that its peak RSS is its
//! own: a fresh store, then these phases in order, each measured with the same threads:
//!
//! * `load`: the N entries inserted in transactions of [`LOAD_BATCH`] (batches of random
//!   keys, each sorted: concurrent loaders lock leaves in one order); `ops` are entries,
//!   latencies are per transaction;
//! * `C` uniform and `C` zipf: lookups (Zipf 0.99, hot keys scattered);
//! * `E` zipf: scans of 10..=100 entries from a key drawn from Zipf 0.99 (YCSB's E);
//! * `B` zipf: 95 % lookups, 5 % updates, each update a durable transaction of its own;
//! * `insert-only`: new keys, each a durable transaction of its own (at most N of them).
//!
//! Before each measured read phase the workload runs unmeasured for half the time (another
//! random sequence). Peak RSS is taken per phase: the child resets its `VmHWM` (`echo 5 >
//! /proc/self/clear_refs`) before the measurement and reads it after. Every lookup checks
//! what it found (`not_found`, `wrong_values`: the value must name its key), every scan its
//! order and values, and after the last phase a full scan checks that every entry ever
//! inserted is there exactly once with a valid value (`verified_keys`, `verify_missing`,
//! `verify_wrong`). With `--rounds N` every child runs N times (engines in rotating order)
//! and each phase reports its median round by ops/s.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use super::{median_round, short_size, Ctx, Rounds};
use crate::engines::CgroupCap;
use crate::harness::{engine_value, measure, measure_cpu, run_value, RunCfg, Step};
use crate::kv::{entry_ok, index_of, key_of, value_of, BTreeMapStore, Key, KvSession, KvStore, LmdbStore, RedbStore, StrataKv, Val, ENTRY_BYTES};
use crate::workload::{Distribution, Rng, Sampler};
use crate::{EResult, EngineError};

pub(super) const ENGINES: [&str; 4] = ["strata", "redb", "lmdb", "btreemap"];

/// Entries per transaction of the load.
pub const LOAD_BATCH: u64 = 1000;
/// Scan lengths of workload E: uniform in this range.
const SCAN_LEN: std::ops::RangeInclusive<u64> = 10..=100;
/// Percentage of updates in workload B.
const UPDATE_PERCENT: u64 = 5;
/// Zipf exponent of the skewed phases.
const THETA: f64 = 0.99;

/// The phases, in the order one engine instance runs them: (workload, distribution).
pub const PHASES: [(&str, Option<&str>); 6] =
    [("load", None), ("C", Some("uniform")), ("C", Some("zipf")), ("E", Some("zipf")), ("B", Some("zipf")), ("insert-only", None)];

fn phase_id(workload: &str, dist: Option<&str>) -> String {
    match dist {
        Some(d) => format!("{workload}/{d}"),
        None => workload.to_owned(),
    }
}

/// What a child process runs: one engine, one data set, one thread count.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ChildSpec {
    /// Engine name ([`ENGINES`]).
    pub engine: String,
    /// `in` or `out` (for the output only; `keys` sets the size).
    pub memory: String,
    /// Threads of every phase.
    pub threads: usize,
    /// Memory of the engine: strata's pool, redb's cache, LMDB's cgroup cap.
    pub pool: u64,
    /// strata's smallest page size.
    pub page_size: u64,
    /// Entries loaded.
    pub keys: u64,
    /// Seconds per measured phase (None: `ops`).
    pub seconds: Option<f64>,
    /// Operations per thread per measured phase instead of a duration.
    pub ops: Option<u64>,
    /// An empty directory for the engine's files.
    pub dir: PathBuf,
}

/// The child side: runs `spec` (JSON of a [`ChildSpec`]) in this process and returns
/// `{"phases": {phase: figures | {"failed": reason}}, "verify": {...}}`, or
/// `{"failed": reason}` when the engine could not even be opened.
pub fn child_main(spec: &str) -> Result<Value, String> {
    let spec: ChildSpec = serde_json::from_str(spec).map_err(|e| format!("bad bench-child spec: {e}"))?;
    Ok(run_child(&spec))
}

/// Resets this process's peak RSS (`VmHWM`) to its current RSS; false where the kernel
/// does not allow it.
fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// One thread's state in a phase.
struct St<'a> {
    s: EResult<Box<dyn KvSession + 'a>>,
    rng: Rng,
    out: Vec<u8>,
    batch: Vec<(Key, Val)>,
}

impl<'a> St<'a> {
    fn new(store: &'a dyn KvStore, seed: u64) -> St<'a> {
        St { s: store.session(), rng: Rng::new(seed), out: Vec::with_capacity(128), batch: Vec::new() }
    }
}

fn session<'s, 'a>(s: &'s mut EResult<Box<dyn KvSession + 'a>>) -> EResult<&'s mut (dyn KvSession + 'a)> {
    match s {
        Ok(s) => Ok(s.as_mut()),
        Err(e) => Err(e.clone()),
    }
}

/// Shared checks of a phase (only incremented on a problem, or rarely).
#[derive(Default)]
struct Checks {
    not_found: AtomicU64,
    wrong: AtomicU64,
    updates: AtomicU64,
}

/// Looks entry `i` up and checks what was found.
fn lookup(st: &mut St<'_>, i: u64, checks: &Checks) -> EResult<Step> {
    let k = key_of(i);
    if session(&mut st.s)?.get(&k, &mut st.out)? {
        if !entry_ok(&k, &st.out) {
            checks.wrong.fetch_add(1, Ordering::Relaxed);
        }
    } else {
        checks.not_found.fetch_add(1, Ordering::Relaxed);
    }
    Ok(Step::Did { bytes: ENTRY_BYTES })
}

/// One measured window of a phase: peak RSS reset before, read after; the engine's counters
/// and description added.
fn window<'a, M, O>(store: &'a dyn KvStore, cfg: &RunCfg, make: M, op: O) -> EResult<(crate::harness::Outcome, Map<String, Value>)>
where
    M: Fn(usize) -> St<'a> + Sync,
    O: Fn(&mut St<'a>) -> EResult<Step> + Sync,
{
    let reset = reset_peak_rss();
    let before = store.counters();
    let (o, mut m) = measure_cpu(cfg, make, op)?;
    if let (Some(b), Some(a)) = (before, store.counters()) {
        for (k, v) in crate::harness::figures(&o, Some(a.since(&b))) {
            m.insert(k, v);
        }
    }
    m.insert("peak_rss_bytes".into(), json!(strata::util::peak_rss_bytes()));
    m.insert("rss_bytes".into(), json!(strata::util::current_rss_bytes()));
    if !reset {
        m.insert("peak_rss_since".into(), "process start (clear_refs not writable)".into());
    }
    for (k, v) in store.describe() {
        m.entry(k).or_insert(v);
    }
    Ok((o, m))
}

fn open_store(spec: &ChildSpec, cap: &mut Option<CgroupCap>) -> EResult<Box<dyn KvStore>> {
    let data = spec.keys * ENTRY_BYTES;
    Ok(match spec.engine.as_str() {
        "strata" => Box::new(StrataKv::create(&spec.dir, spec.pool, spec.page_size)?),
        "redb" => Box::new(RedbStore::create(&spec.dir, spec.pool)?),
        "lmdb" => {
            let mut info = Map::new();
            match CgroupCap::enter(spec.pool) {
                Ok(c) => {
                    info.insert("capped".into(), true.into());
                    info.insert("cap_bytes".into(), c.limit().into());
                    info.insert("cap".into(), "cgroup v2 memory.max (the whole child process)".into());
                    *cap = Some(c);
                }
                Err(why) => {
                    info.insert("capped".into(), false.into());
                    info.insert("uncapped_because".into(), why.into());
                }
            }
            // Address space only: room for the data twice over (insert-only may double it)
            // with B-tree slack and copy-on-write garbage.
            let map = (16 * data).max(64 << 20).next_multiple_of(1 << 20);
            let mut s = LmdbStore::create(&spec.dir, map, spec.threads as u32 + 8)?;
            s.set_cap_info(info);
            Box::new(s)
        }
        "btreemap" => Box::new(BTreeMapStore::new()),
        other => return Err(EngineError(format!("unknown engine {other}"))),
    })
}

/// Runs every phase of `spec` in this process.
pub fn run_child(spec: &ChildSpec) -> Value {
    // Declared first, dropped last: the store is closed before the process leaves the cgroup.
    let mut cap: Option<CgroupCap> = None;
    let store = match open_store(spec, &mut cap) {
        Ok(s) => s,
        Err(e) => return json!({ "failed": e.0 }),
    };
    let mut phases = Map::new();
    let mut failed: Option<String> = None;
    let mut inserted = 0u64;
    for (w, d) in PHASES {
        let id = phase_id(w, d);
        let r = match &failed {
            Some(why) => Err(EngineError(format!("not run: {why}"))),
            None => run_phase(store.as_ref(), spec, w, d, &mut inserted),
        };
        if let Err(e) = &r {
            failed.get_or_insert_with(|| format!("{id} failed: {e}"));
        }
        phases.insert(id, engine_value(r));
    }
    let mut out = json!({ "phases": phases });
    if failed.is_none() {
        out["verify"] = match verify(store.as_ref(), spec.keys + inserted) {
            Ok(v) => Value::Object(v),
            Err(e) => json!({ "failed": e.0 }),
        };
    }
    drop(store);
    drop(cap);
    out
}

fn run_phase(store: &dyn KvStore, spec: &ChildSpec, workload: &str, dist: Option<&str>, inserted: &mut u64) -> EResult<Map<String, Value>> {
    let n = spec.keys;
    let threads = spec.threads;
    let read_sample = if spec.memory == "in" { 4 } else { 1 };
    let cfg = RunCfg { threads, seconds: spec.ops.is_none().then_some(spec.seconds.unwrap_or(0.5)), ops: spec.ops, sample_every: read_sample };
    let warm = RunCfg { seconds: cfg.seconds.map(|s| s / 2.0), ops: cfg.ops.map(|x| (x / 2).max(1)), ..cfg };
    let salt = n ^ ((threads as u64) << 48);
    let make = |t: usize| St::new(store, 0x5EED ^ salt ^ ((t as u64) << 40) ^ (workload.len() as u64) << 32);
    let make_warm = |t: usize| St::new(store, 0x3A3B ^ salt ^ ((t as u64) << 40) ^ (workload.len() as u64) << 32);
    let sampler = match dist {
        Some("zipf") => Sampler::new(n, Distribution::Zipf(THETA)),
        _ => Sampler::new(n, Distribution::Uniform),
    };
    let checks = Checks::default();
    let mut m = match workload {
        "load" => {
            let cursor = AtomicU64::new(0);
            let load = RunCfg { threads, seconds: None, ops: None, sample_every: 1 };
            let (o, mut m) = window(store, &load, make, |st| {
                let b = cursor.fetch_add(LOAD_BATCH, Ordering::Relaxed);
                if b >= n {
                    return Ok(Step::Done);
                }
                let end = (b + LOAD_BATCH).min(n);
                st.batch.clear();
                st.batch.extend((b..end).map(|i| (key_of(i), value_of(i, 0))));
                // In key order (for every engine): concurrent loaders then lock leaves in
                // the same order and wait for each other instead of deadlocking.
                st.batch.sort_unstable_by_key(|x| x.0);
                session(&mut st.s)?.put(&st.batch)?;
                Ok(Step::Did { bytes: (end - b) * ENTRY_BYTES })
            })?;
            // An operation is an entry; latencies are per transaction.
            let secs = o.seconds.max(1e-9);
            m.insert("txns".into(), o.ops.into());
            m.insert("txns_per_sec".into(), json!((o.ops as f64 / secs).round()));
            m.insert("ops".into(), n.into());
            m.insert("ops_per_sec".into(), json!((n as f64 / secs).round()));
            m.insert("latency_per".into(), format!("transaction of up to {LOAD_BATCH} inserts").into());
            if n > 0 {
                let cpu = m.get("cpu_user_seconds").and_then(Value::as_f64).unwrap_or(0.0) + m.get("cpu_sys_seconds").and_then(Value::as_f64).unwrap_or(0.0);
                m.insert("cpu_us_per_op".into(), json!((cpu * 1e6 / n as f64 * 1e3).round() / 1e3));
            }
            m
        }
        "C" => {
            let op = |st: &mut St<'_>| {
                let i = sampler.sample(&mut st.rng);
                lookup(st, i, &checks)
            };
            measure(&warm, make_warm, op)?;
            checks.not_found.store(0, Ordering::Relaxed);
            checks.wrong.store(0, Ordering::Relaxed);
            window(store, &cfg, make, op)?.1
        }
        "E" => {
            let op = |st: &mut St<'_>| {
                let start = key_of(sampler.sample(&mut st.rng));
                let len = SCAN_LEN.start() + st.rng.below(SCAN_LEN.end() - SCAN_LEN.start() + 1);
                let mut last: Option<Key> = None;
                let mut bad = 0u64;
                let seen = session(&mut st.s)?.scan(&start, len as usize, &mut |k, v| {
                    let Ok(k) = <Key>::try_from(k) else {
                        bad += 1;
                        return;
                    };
                    if k < start || last.is_some_and(|l| l >= k) || !entry_ok(&k, v) {
                        bad += 1;
                    }
                    last = Some(k);
                })?;
                if bad > 0 {
                    checks.wrong.fetch_add(bad, Ordering::Relaxed);
                }
                Ok(Step::Did { bytes: seen as u64 * ENTRY_BYTES })
            };
            measure(&warm, make_warm, op)?;
            checks.wrong.store(0, Ordering::Relaxed);
            let mut m = window(store, &cfg, make, op)?.1;
            let bps = m.get("bytes_per_sec").and_then(Value::as_f64).unwrap_or(0.0);
            m.insert("keys_per_sec".into(), json!((bps / ENTRY_BYTES as f64).round()));
            m
        }
        "B" => {
            let op = |st: &mut St<'_>| {
                let i = sampler.sample(&mut st.rng);
                if st.rng.below(100) < UPDATE_PERCENT {
                    let v = value_of(i, st.rng.next_u64());
                    st.batch.clear();
                    st.batch.push((key_of(i), v));
                    session(&mut st.s)?.put(&st.batch)?;
                    checks.updates.fetch_add(1, Ordering::Relaxed);
                    Ok(Step::Did { bytes: ENTRY_BYTES })
                } else {
                    lookup(st, i, &checks)
                }
            };
            measure(&warm, make_warm, op)?;
            checks.not_found.store(0, Ordering::Relaxed);
            checks.wrong.store(0, Ordering::Relaxed);
            checks.updates.store(0, Ordering::Relaxed);
            let mut m = window(store, &cfg, make, op)?.1;
            m.insert("updates".into(), checks.updates.load(Ordering::Relaxed).into());
            m
        }
        "insert-only" => {
            let next = AtomicU64::new(n);
            let write = RunCfg { sample_every: 1, ..cfg };
            let (_, mut m) = window(store, &write, make, |st| {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= 2 * n {
                    return Ok(Step::Done);
                }
                st.batch.clear();
                st.batch.push((key_of(i), value_of(i, 0)));
                session(&mut st.s)?.put(&st.batch)?;
                Ok(Step::Did { bytes: ENTRY_BYTES })
            })?;
            *inserted = next.load(Ordering::Relaxed).min(2 * n) - n;
            m.insert("inserted".into(), (*inserted).into());
            m
        }
        other => return Err(EngineError(format!("unknown workload {other}"))),
    };
    m.insert("not_found".into(), checks.not_found.load(Ordering::Relaxed).into());
    m.insert("wrong_values".into(), checks.wrong.load(Ordering::Relaxed).into());
    Ok(m)
}

/// A full scan in key order: every entry `0..total` present exactly once, in order, with a
/// valid value.
fn verify(store: &dyn KvStore, total: u64) -> EResult<Map<String, Value>> {
    let t0 = Instant::now();
    let mut s = store.session()?;
    let mut seen = vec![0u64; total.div_ceil(64) as usize];
    let (mut found, mut wrong) = (0u64, 0u64);
    let mut start: Key = [0; 8];
    let mut last: Option<Key> = None;
    const CHUNK: usize = 10_000;
    loop {
        let got = s.scan(&start, CHUNK, &mut |k, v| {
            let Ok(k) = <Key>::try_from(k) else {
                wrong += 1;
                return;
            };
            if last.is_some_and(|l| l >= k) {
                wrong += 1;
            }
            last = Some(k);
            match index_of(v).filter(|&i| i < total && key_of(i) == k) {
                Some(i) if seen[(i / 64) as usize] & (1 << (i % 64)) == 0 => {
                    seen[(i / 64) as usize] |= 1 << (i % 64);
                    found += 1;
                }
                _ => wrong += 1,
            }
        })?;
        let Some(l) = last else { break };
        if got < CHUNK {
            break;
        }
        match u64::from_be_bytes(l).checked_add(1) {
            Some(next) => start = next.to_be_bytes(),
            None => break,
        }
    }
    let mut m = Map::new();
    m.insert("verified_keys".into(), found.into());
    m.insert("verify_missing".into(), (total - found).into());
    m.insert("verify_wrong".into(), wrong.into());
    m.insert("verify_seconds".into(), json!((t0.elapsed().as_secs_f64() * 1e3).round() / 1e3));
    Ok(m)
}

/// Runs `spec` in a child process (`exe bench-child btree SPEC`), or here without `exe`.
fn run_isolated(exe: Option<&Path>, spec: &ChildSpec, timeout: Duration) -> Value {
    let Some(exe) = exe else { return run_child(spec) };
    let arg = serde_json::to_string(spec).expect("a spec serialises");
    let child = Command::new(exe).args(["bench-child", "btree", &arg]).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn();
    let child = match child {
        Ok(c) => c,
        Err(e) => return json!({ "failed": format!("start {}: {e}", exe.display()) }),
    };
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let out = match rx.recv_timeout(timeout) {
        Ok(Ok(out)) => out,
        Ok(Err(e)) => return json!({ "failed": format!("wait for the child process: {e}") }),
        Err(_) => {
            // SAFETY: signals the child this function started (not yet reaped: its waiter
            // thread is still blocked in wait).
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
            let _ = rx.recv();
            return json!({ "failed": format!("the child process ran longer than {} s and was killed", timeout.as_secs()) });
        }
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        // A panic's location and message, else the last line (an `error: ...`), not the
        // backtrace hint.
        let lines: Vec<&str> = stderr.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with("note:")).collect();
        let why = match lines.iter().position(|l| l.contains("panicked")) {
            Some(i) => lines[i..(i + 2).min(lines.len())].join(" "),
            None => lines.last().copied().unwrap_or("no message").to_owned(),
        };
        return json!({ "failed": format!("child process {}: {why}", out.status) });
    }
    match stdout.lines().rev().find(|l| !l.trim().is_empty()).map(serde_json::from_str::<Value>) {
        Some(Ok(v)) => v,
        _ => json!({ "failed": format!("child process printed no JSON: {:?}", stdout.chars().take(200).collect::<String>()) }),
    }
}

/// The figures of one phase from a child's output, with the final check added.
fn phase_figures(child: &Value, id: &str) -> EResult<Map<String, Value>> {
    if let Some(f) = child.get("failed") {
        return Err(EngineError(f.as_str().unwrap_or("failed").to_owned()));
    }
    let p = child.get("phases").and_then(|p| p.get(id)).ok_or_else(|| EngineError(format!("no figures for phase {id}")))?;
    if let Some(f) = p.get("failed") {
        return Err(EngineError(f.as_str().unwrap_or("failed").to_owned()));
    }
    let mut m = p.as_object().cloned().unwrap_or_default();
    match child.get("verify") {
        Some(v) if v.get("failed").is_some() => return Err(EngineError(format!("final check failed: {}", v["failed"].as_str().unwrap_or("?")))),
        Some(Value::Object(v)) => {
            for (k, x) in v {
                m.insert(k.clone(), x.clone());
            }
        }
        _ => {}
    }
    Ok(m)
}

pub(super) fn run(ctx: &mut Ctx<'_>) -> EResult<Vec<Value>> {
    let o = ctx.opts;
    let pool = o.pool.unwrap_or(32 << 20);
    let page_size = match o.page_sizes.as_deref() {
        None => 4096,
        Some([p]) => *p,
        Some(_) => return Err(EngineError("takes one --page-size (strata's smallest page)".into())),
    };
    let data_in = pool / 2;
    let data_out = o.data.unwrap_or(4 * pool);
    let rounds = o.rounds.unwrap_or(1).max(1);
    let seconds = o.ops.is_none().then_some(o.seconds.unwrap_or(0.5));
    let names = ctx.engines(&ENGINES);
    if names.contains(&"lmdb") {
        if let Err(why) = CgroupCap::probe() {
            ctx.notes.push(format!(
                "lmdb runs UNCAPPED (\"capped\": false): {why}. The OS page cache may hold its whole file, so its out-of-memory figures are in-memory figures."
            ));
        }
    }
    let isolated = o.child_exe.is_some();
    let mut runs: Vec<(usize, usize, usize, Value)> = Vec::new();
    for (mi, (memory, data)) in [("in", data_in), ("out", data_out)].into_iter().enumerate() {
        if o.memory.as_deref().is_some_and(|m| m != memory) {
            continue;
        }
        let keys = (data / ENTRY_BYTES).max(1);
        let here: Vec<&str> = names.iter().copied().filter(|&e| !(memory == "out" && e == "btreemap")).collect();
        if here.is_empty() {
            continue;
        }
        // Generous: a load at 2k entries/s, every phase and its warm-up ten times over.
        let timeout = Duration::from_secs_f64(120.0 + keys as f64 / 2000.0 + 10.0 * 1.5 * PHASES.len() as f64 * seconds.unwrap_or(2.0));
        for &threads in &o.thread_counts() {
            let mut results: Vec<Vec<Value>> = vec![Vec::new(); here.len()];
            for round in 0..rounds {
                for j in 0..here.len() {
                    let e = (j + round) % here.len();
                    let engine = here[e];
                    ctx.progress(|| {
                        format!("{memory} ({} keys, {}) t{threads}: {engine} (round {}/{rounds})", keys, short_size(keys * ENTRY_BYTES), round + 1)
                    });
                    let dir = ctx.scratch.path().join(format!("{engine}-{memory}-t{threads}-r{round}"));
                    let out = match std::fs::create_dir_all(&dir) {
                        Ok(()) => {
                            let spec = ChildSpec {
                                engine: engine.into(),
                                memory: memory.into(),
                                threads,
                                pool,
                                page_size,
                                keys,
                                seconds,
                                ops: o.ops,
                                dir: dir.clone(),
                            };
                            run_isolated(o.child_exe.as_deref(), &spec, timeout)
                        }
                        Err(e) => json!({ "failed": format!("create {}: {e}", dir.display()) }),
                    };
                    let _ = std::fs::remove_dir_all(&dir);
                    results[e].push(out);
                }
            }
            for (pi, (w, d)) in PHASES.into_iter().enumerate() {
                let id = phase_id(w, d);
                let mut engines = Map::new();
                for (name, outs) in here.iter().zip(&results) {
                    let rs: Rounds = outs.iter().map(|c| phase_figures(c, &id)).collect();
                    let v = if rounds == 1 { engine_value(rs.into_iter().next().expect("one round")) } else { median_round(rs, "ops_per_sec") };
                    engines.insert((*name).into(), v);
                }
                let mut params = json!({
                    "threads": threads,
                    "page_size": page_size,
                    "pool_bytes": pool,
                    "data_bytes": keys * ENTRY_BYTES,
                    "keys": keys,
                    "key_bytes": crate::kv::KEY_LEN,
                    "value_bytes": crate::kv::VALUE_LEN,
                    "memory": memory,
                    "data_to_pool": ((keys * ENTRY_BYTES) as f64 / pool as f64 * 1000.0).round() / 1000.0,
                    "workload": w,
                });
                match w {
                    "load" => params["tx_batch"] = json!(LOAD_BATCH),
                    "B" => {
                        params["update_percent"] = json!(UPDATE_PERCENT);
                        params["tx_batch"] = json!(1);
                    }
                    "E" => params["scan_length"] = json!(format!("{}..={}", SCAN_LEN.start(), SCAN_LEN.end())),
                    "insert-only" => params["tx_batch"] = json!(1),
                    _ => {}
                }
                if let Some(d) = d {
                    params["distribution"] = json!(d);
                    if d == "zipf" {
                        params["zipf_theta"] = json!(THETA);
                    }
                }
                if rounds > 1 {
                    params["rounds"] = json!(rounds);
                }
                params["rss"] = json!(if isolated { "per engine: one child process per engine and run" } else { "shared: every engine in this process" });
                runs.push((mi, pi, threads, run_value(params.as_object().cloned().unwrap_or_default(), engines)));
            }
        }
    }
    runs.sort_by_key(|(m, p, t, _)| (*m, *p, *t));
    if !isolated {
        ctx.notes.push("btree ran every engine in this process (no child executable given): peak_rss_bytes is reset (clear_refs) before each measurement but includes memory the allocator kept from earlier engines.".into());
    }
    if names.contains(&"btreemap") && o.memory.as_deref() != Some("in") {
        ctx.notes.push("btreemap (the in-memory upper bound) runs with the in-memory data set only.".into());
    }
    ctx.notes.push(format!(
        "btree: 8-byte keys (random order), 100-byte values; in = entries of half the pool, out = {}; each engine runs in a fresh store per thread count and round, phases in the order load, C uniform, C zipf, E, B, insert-only (each read phase warmed for half its time first); load commits {LOAD_BATCH} inserts per transaction (each batch's keys sorted), B's updates and insert-only's inserts one per durable transaction; redb and lmdb keep a read transaction for 64 operations; redb's file is dropped from the OS page cache every 50 ms; verify_* is a full scan after the last phase.",
        if o.data.is_some() { format!("{} (--data)", short_size(data_out)) } else { "4x the pool".into() }
    ));
    Ok(runs.into_iter().map(|(_, _, _, v)| v).collect())
}
