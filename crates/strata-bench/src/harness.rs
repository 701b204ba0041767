//! Running an operation on N threads for a time or a number of operations, with latency
//! percentiles from an HDR histogram, and turning outcomes into the JSON figures.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde_json::{json, Map, Value};

use crate::{EResult, EngineError, IoCounters, PageStore};

/// What one call of an operation did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// One operation that moved `bytes` bytes.
    Did {
        /// Bytes read (or written) by the operation.
        bytes: u64,
    },
    /// No work left (for finite workloads such as a scan).
    Done,
}

/// How long to run and on how many threads.
#[derive(Clone, Copy, Debug)]
pub struct RunCfg {
    /// Worker threads.
    pub threads: usize,
    /// Stop after this many seconds (None: run until every thread is done or `ops` is hit).
    pub seconds: Option<f64>,
    /// Stop each thread after this many operations.
    pub ops: Option<u64>,
    /// Time one operation in this many (1: all). Reading the clock costs ~20-40 ns, which
    /// would distort operations that take about as long.
    pub sample_every: u64,
}

/// What a measurement produced.
#[derive(Debug)]
pub struct Outcome {
    /// Operations completed (all threads).
    pub ops: u64,
    /// Bytes moved (all threads).
    pub bytes: u64,
    /// Wall-clock seconds from the common start to the last thread's end.
    pub seconds: f64,
    /// Latencies of the timed operations, in nanoseconds.
    pub hist: Histogram<u64>,
    /// Every how many operations one was timed.
    pub sample_every: u64,
    /// Threads used.
    pub threads: usize,
}

fn new_hist() -> Histogram<u64> {
    // 1 ns .. 100 s at 3 significant digits.
    Histogram::new_with_bounds(1, 100_000_000_000, 3).expect("histogram bounds")
}

/// Runs `op` on `cfg.threads` threads, each with its own state from `make(thread_index)`,
/// all released together by a barrier. The first error stops every thread and is returned.
pub fn measure<S, M, O>(cfg: &RunCfg, make: M, op: O) -> EResult<Outcome>
where
    M: Fn(usize) -> S + Sync,
    O: Fn(&mut S) -> EResult<Step> + Sync,
{
    let threads = cfg.threads.max(1);
    let stop = AtomicBool::new(false);
    let finished = AtomicUsize::new(0);
    let barrier = Barrier::new(threads + 1);
    let error: Mutex<Option<EngineError>> = Mutex::new(None);
    let sample = cfg.sample_every.max(1);
    let limit = cfg.ops.unwrap_or(u64::MAX);
    let (results, start) = std::thread::scope(|sc| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (stop, finished, barrier, error, make, op) = (&stop, &finished, &barrier, &error, &make, &op);
                sc.spawn(move || {
                    let mut state = make(t);
                    let mut hist = new_hist();
                    let (mut ops, mut bytes) = (0u64, 0u64);
                    barrier.wait();
                    let begin = Instant::now();
                    while ops < limit && !stop.load(Ordering::Relaxed) {
                        let t0 = (ops % sample == 0).then(Instant::now);
                        match op(&mut state) {
                            Ok(Step::Did { bytes: b }) => {
                                if let Some(t0) = t0 {
                                    hist.saturating_record(t0.elapsed().as_nanos() as u64);
                                }
                                ops += 1;
                                bytes += b;
                            }
                            Ok(Step::Done) => break,
                            Err(e) => {
                                error.lock().unwrap().get_or_insert(e);
                                stop.store(true, Ordering::Relaxed);
                                break;
                            }
                        }
                    }
                    let end = Instant::now();
                    finished.fetch_add(1, Ordering::Release);
                    (ops, bytes, hist, begin, end)
                })
            })
            .collect();
        barrier.wait();
        let start = Instant::now();
        if let Some(secs) = cfg.seconds {
            let until = start + Duration::from_secs_f64(secs.max(0.0));
            while finished.load(Ordering::Acquire) < threads {
                let now = Instant::now();
                if now >= until {
                    break;
                }
                std::thread::sleep((until - now).min(Duration::from_millis(2)));
            }
            stop.store(true, Ordering::Relaxed);
        }
        let results: Vec<_> = handles.into_iter().map(|h| h.join().expect("benchmark thread panicked")).collect();
        (results, start)
    });
    if let Some(e) = error.into_inner().unwrap() {
        return Err(e);
    }
    let mut hist = new_hist();
    let (mut ops, mut bytes) = (0, 0);
    // From the first thread's start to the last thread's end (a thread may finish a short
    // run before the coordinating thread even reads the clock).
    let (mut begin, mut end) = (start, start);
    for (o, b, h, s, e) in results {
        ops += o;
        bytes += b;
        hist.add(&h).expect("same histogram bounds");
        begin = begin.min(s);
        end = end.max(e);
    }
    Ok(Outcome { ops, bytes, seconds: (end - begin).as_secs_f64(), hist, sample_every: sample, threads })
}

/// This process's resource usage so far: (minor page faults, user CPU seconds, system CPU
/// seconds), all threads together (an engine's background I/O threads included).
pub(crate) fn usage() -> (u64, f64, f64) {
    // SAFETY: getrusage fills the zeroed struct we pass; RUSAGE_SELF is always valid.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return (0, 0.0, 0.0);
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    (ru.ru_minflt as u64, secs(ru.ru_utime), secs(ru.ru_stime))
}

fn us(ns: u64) -> f64 {
    (ns as f64 / 1000.0 * 1000.0).round() / 1000.0
}

/// The JSON figures of an outcome: throughput, latency percentiles, and the engine's counters
/// over the measurement window.
pub fn figures(o: &Outcome, io: Option<IoCounters>) -> Map<String, Value> {
    let secs = o.seconds.max(1e-9);
    let mut m = Map::new();
    m.insert("ops".into(), o.ops.into());
    m.insert("seconds".into(), json!((o.seconds * 1e6).round() / 1e6));
    m.insert("ops_per_sec".into(), json!((o.ops as f64 / secs).round()));
    m.insert("bytes_per_sec".into(), json!((o.bytes as f64 / secs).round()));
    m.insert("p50_us".into(), json!(us(o.hist.value_at_quantile(0.50))));
    m.insert("p99_us".into(), json!(us(o.hist.value_at_quantile(0.99))));
    m.insert("p999_us".into(), json!(us(o.hist.value_at_quantile(0.999))));
    m.insert("max_us".into(), json!(us(o.hist.max())));
    m.insert("latency_sampled_every".into(), o.sample_every.into());
    if let Some(io) = io {
        if let (Some(h), Some(mi)) = (io.hits, io.misses) {
            m.insert("hits".into(), h.into());
            m.insert("misses".into(), mi.into());
            if h + mi > 0 {
                m.insert("hit_rate".into(), json!(((h as f64 / (h + mi) as f64) * 1e4).round() / 1e4));
            }
        }
        m.insert("bytes_read".into(), io.bytes_read.into());
    }
    m
}

/// [`measure`], with the figures of the outcome ([`figures`], no counters) plus the page
/// faults and CPU time of the whole process in the window.
pub fn measure_cpu<S, M, O>(cfg: &RunCfg, make: M, op: O) -> EResult<(Outcome, Map<String, Value>)>
where
    M: Fn(usize) -> S + Sync,
    O: Fn(&mut S) -> EResult<Step> + Sync,
{
    let (faults0, user0, sys0) = usage();
    let o = measure(cfg, make, op)?;
    let (faults1, user1, sys1) = usage();
    let mut m = figures(&o, None);
    // Page faults taken by the process in the window (only this engine runs): the cost of
    // handing frames back to the OS and faulting them in again shows here.
    m.insert("minor_faults".into(), faults1.saturating_sub(faults0).into());
    // CPU time of the whole process in the window: what an operation costs the machine,
    // whatever the device's speed (throughput alone mixes the two).
    let (user, sys) = ((user1 - user0).max(0.0), (sys1 - sys0).max(0.0));
    m.insert("cpu_user_seconds".into(), json!((user * 1e3).round() / 1e3));
    m.insert("cpu_sys_seconds".into(), json!((sys * 1e3).round() / 1e3));
    if o.ops > 0 {
        m.insert("cpu_us_per_op".into(), json!(((user + sys) * 1e6 / o.ops as f64 * 1e3).round() / 1e3));
    }
    Ok((o, m))
}

/// Measures `op` against `store`, adding its counters over the window and its description.
pub fn measure_store<S, M, O>(store: &dyn PageStore, cfg: &RunCfg, make: M, op: O) -> EResult<Map<String, Value>>
where
    M: Fn(usize) -> S + Sync,
    O: Fn(&mut S) -> EResult<Step> + Sync,
{
    let before = store.counters();
    let (o, mut m) = measure_cpu(cfg, make, op)?;
    let io = store.counters().since(&before);
    for (k, v) in figures(&o, Some(io)) {
        m.insert(k, v);
    }
    for (k, v) in store.describe() {
        m.entry(k).or_insert(v);
    }
    Ok(m)
}

/// `{"failed": reason}` for an engine that could not complete a run, else its figures.
pub fn engine_value(r: EResult<Map<String, Value>>) -> Value {
    match r {
        Ok(m) => Value::Object(m),
        Err(e) => json!({ "failed": e.0 }),
    }
}

/// strata's throughput divided by each baseline's, for the baselines (and strata) that
/// completed.
pub fn ratios(engines: &Map<String, Value>) -> Map<String, Value> {
    let mut r = Map::new();
    let Some(s) = engines.get("strata").and_then(|v| v.get("ops_per_sec")).and_then(Value::as_f64) else {
        return r;
    };
    for (name, v) in engines {
        if name == "strata" {
            continue;
        }
        if let Some(b) = v.get("ops_per_sec").and_then(Value::as_f64) {
            if b > 0.0 {
                r.insert(name.clone(), json!(significant4(s / b)));
            }
        }
    }
    r
}

/// `x` rounded to 4 significant digits (a ratio far below 1, such as strata's durable
/// inserts against an in-memory `BTreeMap`, must not round to 0).
fn significant4(x: f64) -> f64 {
    if x == 0.0 || !x.is_finite() {
        return x;
    }
    let scale = 10f64.powi(3 - x.abs().log10().floor() as i32);
    (x * scale).round() / scale
}

/// One run of a benchmark: its parameters, every engine's figures, and the ratios.
pub fn run_value(params: Map<String, Value>, engines: Map<String, Value>) -> Value {
    let ratios = ratios(&engines);
    json!({ "params": params, "engines": engines, "ratios": ratios })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_ops_and_stops_on_ops_limit() {
        let cfg = RunCfg { threads: 3, seconds: None, ops: Some(100), sample_every: 1 };
        let o = measure(
            &cfg,
            |_| 0u64,
            |n| {
                *n += 1;
                Ok(Step::Did { bytes: 10 })
            },
        )
        .unwrap();
        assert_eq!(o.ops, 300);
        assert_eq!(o.bytes, 3000);
        assert_eq!(o.hist.len(), 300);
    }

    #[test]
    fn finite_work_ends_with_done_and_errors_propagate() {
        let cfg = RunCfg { threads: 2, seconds: Some(30.0), ops: None, sample_every: 4 };
        let o = measure(
            &cfg,
            |_| 0u32,
            |n| {
                *n += 1;
                Ok(if *n > 10 { Step::Done } else { Step::Did { bytes: 1 } })
            },
        )
        .unwrap();
        assert_eq!(o.ops, 20);
        let e = measure(&cfg, |_| (), |_| Err::<Step, _>(EngineError("boom".into()))).unwrap_err();
        assert_eq!(e.0, "boom");
    }

    #[test]
    fn ratios_skip_failed_engines() {
        let mut engines = Map::new();
        engines.insert("strata".into(), json!({"ops_per_sec": 200.0}));
        engines.insert("hashpool".into(), json!({"ops_per_sec": 100.0}));
        engines.insert("static-split".into(), json!({"failed": "no frame"}));
        let r = ratios(&engines);
        assert_eq!(r.get("hashpool").and_then(Value::as_f64), Some(2.0));
        assert!(!r.contains_key("static-split"));
    }

    #[test]
    fn ratios_keep_four_significant_digits() {
        let mut engines = Map::new();
        engines.insert("strata".into(), json!({"ops_per_sec": 100.0}));
        engines.insert("btreemap".into(), json!({"ops_per_sec": 7_654_321.0}));
        engines.insert("hashpool".into(), json!({"ops_per_sec": 3.0}));
        let r = ratios(&engines);
        assert_eq!(r.get("btreemap").and_then(Value::as_f64), Some(0.00001306));
        assert_eq!(r.get("hashpool").and_then(Value::as_f64), Some(33.33));
    }
}
