//! The bounded campaign of the structure-aware fuzz targets (issue 17, item 1) under plain
//! `cargo test` on stable Rust; `fuzz/` runs the same targets (`tests/fuzz/targets.rs`)
//! under libFuzzer for longer runs.
//!
//! Per target: every input of the committed corpus `tests/fuzz-corpus/<target>/` (seeds and
//! the regression cases of bugs found), then a count-bounded random part: byte strings from
//! a seeded generator (fresh ones, and mutations of corpus inputs) handed to the target,
//! which reads them through `arbitrary::Unstructured`. Checked per execution:
//! - no panic (`catch_unwind`; the input is reported in hex and saved to a file),
//! - no allocation above [`ALLOC_LIMIT`] (this binary's global allocator refuses it and
//!   names the input: an allocation that large from inputs of a few KiB can only be sized
//!   by an unchecked length field),
//! - no hang: inputs are small and every target bounds its work by construction; the
//!   slowest execution is reported as a diagnostic, never asserted on.
//!
//! Environment: `STRATA_FUZZ_EXECS` (random executions per target; default: the target's
//! own, all targets together well under 30 s in release builds), `STRATA_FUZZ_SEED`,
//! `STRATA_FUZZ_REPORT` (a file to which one JSON line per target is appended).
//! Campaign: `STRATA_FUZZ_EXECS=1000000 cargo test --release -p strata --test fuzz_targets -- --test-threads 1 meta`.

#[path = "fuzz/targets.rs"]
mod targets;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::{Cell, RefCell};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use strata::util::SplitMix64;
use targets::{Target, Verdict};

/// The largest single allocation an execution may make.
const ALLOC_LIMIT: usize = 256 << 20;

thread_local! {
    /// The input being run on this thread and its target (for the allocator's report).
    static CURRENT: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    static CURRENT_TARGET: Cell<&'static str> = const { Cell::new("") };
    /// The message of the last panic on this thread.
    static LAST_PANIC: RefCell<Option<String>> = const { RefCell::new(None) };
    /// Whether an execution is running on this thread (its panics are reported with it).
    static IN_RUN: Cell<bool> = const { Cell::new(false) };
}

struct LimitedAlloc;

/// Writes `s` to stderr without allocating.
fn raw_stderr(s: &[u8]) {
    // SAFETY: writes `s.len()` bytes from a valid slice to fd 2.
    unsafe {
        libc::write(2, s.as_ptr().cast(), s.len());
    }
}

/// An allocation over the limit: report the input (hex, without allocating) and refuse it,
/// which aborts the process with Rust's "memory allocation failed" message.
#[cold]
fn over_limit(size: usize) {
    let mut num = [0u8; 20];
    let mut k = num.len();
    let mut v = size;
    loop {
        k -= 1;
        num[k] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    raw_stderr(b"\nfuzz: an allocation of ");
    raw_stderr(&num[k..]);
    raw_stderr(b" bytes (over the limit) in target ");
    let _ = CURRENT_TARGET.try_with(|t| raw_stderr(t.get().as_bytes()));
    raw_stderr(b"; input (hex): ");
    let _ = CURRENT.try_with(|c| {
        if let Ok(c) = c.try_borrow() {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            for chunk in c.chunks(64) {
                let mut line = [0u8; 128];
                for (i, b) in chunk.iter().enumerate() {
                    line[2 * i] = HEX[(b >> 4) as usize];
                    line[2 * i + 1] = HEX[(b & 15) as usize];
                }
                raw_stderr(&line[..2 * chunk.len()]);
            }
        }
    });
    raw_stderr(b"\n");
}

// SAFETY: forwards to the system allocator; refusing (null) is allowed by the contract.
unsafe impl GlobalAlloc for LimitedAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.size() > ALLOC_LIMIT {
            over_limit(layout.size());
            return std::ptr::null_mut();
        }
        // SAFETY: the caller's contract is passed on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if layout.size() > ALLOC_LIMIT {
            over_limit(layout.size());
            return std::ptr::null_mut();
        }
        // SAFETY: the caller's contract is passed on.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > ALLOC_LIMIT {
            over_limit(new_size);
            return std::ptr::null_mut();
        }
        // SAFETY: the caller's contract is passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract is passed on.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: LimitedAlloc = LimitedAlloc;

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|s| s.replace('_', "").parse().ok())
}

fn corpus_dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz-corpus").join(name)
}

fn corpus(name: &str) -> Vec<(String, Vec<u8>)> {
    let Ok(rd) = std::fs::read_dir(corpus_dir(name)) else { return Vec::new() };
    let mut out: Vec<(String, Vec<u8>)> = rd
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .map(|p| (p.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read(&p).unwrap()))
        .collect();
    out.sort();
    out
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn install_hook() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // Panics are reported by the driver with their input; the import paths that catch
        // panics of a dependency on purpose (Parquet) would only add noise.
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !IN_RUN.with(Cell::get) {
                return default(info);
            }
            let msg = info.payload().downcast_ref::<String>().cloned().or_else(|| info.payload().downcast_ref::<&str>().map(|s| s.to_string()));
            let at = info.location().map(|l| format!(" at {}:{}", l.file(), l.line())).unwrap_or_default();
            let _ = LAST_PANIC.try_with(|p| *p.borrow_mut() = Some(format!("{}{at}", msg.unwrap_or_else(|| "a panic".into()))));
        }));
    });
}

#[derive(Default)]
struct Tally {
    execs: u64,
    accepted: u64,
    refused: u64,
    exhausted: u64,
    slowest: Duration,
    slowest_input: Vec<u8>,
    failures: Vec<String>,
}

fn run_one(t: &'static Target, input: &[u8], what: &str, tally: &mut Tally) {
    if std::env::var_os("STRATA_FUZZ_TRACE").is_some() {
        // Finding a hang: the last line printed names the input that never returned.
        eprintln!("fuzz {}: {what}: {}", t.name, hex(input));
    }
    CURRENT.with(|c| {
        let mut c = c.borrow_mut();
        c.clear();
        c.extend_from_slice(input);
    });
    CURRENT_TARGET.with(|c| c.set(t.name));
    LAST_PANIC.with(|p| p.borrow_mut().take());
    let t0 = Instant::now();
    IN_RUN.with(|f| f.set(true));
    let outcome = catch_unwind(AssertUnwindSafe(|| (t.run)(input)));
    IN_RUN.with(|f| f.set(false));
    let took = t0.elapsed();
    tally.execs += 1;
    if took > Duration::from_secs(1) {
        // A diagnostic only (a loaded machine can be slow): never a failure.
        eprintln!("fuzz {}: slow execution ({:.1} s, {what}), hex: {}", t.name, took.as_secs_f64(), hex(input));
    }
    if took > tally.slowest {
        tally.slowest = took;
        tally.slowest_input = input.to_vec();
    }
    match outcome {
        Ok(Verdict::Accepted) => tally.accepted += 1,
        Ok(Verdict::Refused) => tally.refused += 1,
        Ok(Verdict::Exhausted) => tally.exhausted += 1,
        Err(_) => {
            let msg = LAST_PANIC.with(|p| p.borrow_mut().take()).unwrap_or_default();
            let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("fuzz-failures").join(t.name);
            std::fs::create_dir_all(&dir).unwrap();
            let file = dir.join(format!("crash-{:016x}", crc32c::crc32c(input) as u64 | ((input.len() as u64) << 32)));
            std::fs::write(&file, input).unwrap();
            tally.failures.push(format!("{} ({what}): panicked: {msg}\n  input saved as {}\n  hex: {}", t.name, file.display(), hex(input)));
        }
    }
}

/// Changes a corpus input a little (the random part's second source of inputs).
fn mutate(r: &mut SplitMix64, base: &[u8]) -> Vec<u8> {
    let mut b = base.to_vec();
    for _ in 0..1 + r.below(4) {
        let n = b.len() as u64;
        match r.below(5) {
            0 | 1 if n > 0 => {
                let at = r.below(n) as usize;
                b[at] ^= 1 << r.below(8);
            }
            2 if n > 0 => {
                let at = r.below(n) as usize;
                b[at] = r.below(256) as u8;
            }
            3 if n > 0 => b.truncate(r.below(n) as usize),
            _ => {
                let at = r.below(n + 1) as usize;
                let extra: Vec<u8> = (0..1 + r.below(16)).map(|_| r.below(256) as u8).collect();
                b.splice(at..at, extra);
            }
        }
    }
    b
}

fn campaign(name: &str) {
    install_hook();
    let t = targets::target(name).unwrap();
    let execs = env_u64("STRATA_FUZZ_EXECS").unwrap_or(t.default_execs);
    let seed = env_u64("STRATA_FUZZ_SEED").unwrap_or(0x5eed_f022);
    let corpus = corpus(name);
    let mut tally = Tally::default();
    let start = Instant::now();
    for (file, input) in &corpus {
        run_one(t, input, &format!("corpus file {file}"), &mut tally);
    }
    let mut r = SplitMix64(seed ^ u64::from(crc32c::crc32c(name.as_bytes())) << 16);
    for i in 0..execs {
        let input = if !corpus.is_empty() && r.below(4) == 0 {
            let k = r.below(corpus.len() as u64) as usize;
            mutate(&mut r, &corpus[k].1)
        } else {
            // Mostly short inputs (they are the most diverse per byte), some up to max_len.
            let cap = r.below(t.max_len as u64 + 1) + 1;
            let len = r.below(cap) as usize;
            (0..len).map(|_| r.below(256) as u8).collect()
        };
        run_one(t, &input, &format!("random execution {i}, seed {seed:#x}"), &mut tally);
        if tally.failures.len() >= 5 {
            break;
        }
    }
    let wall = start.elapsed();
    eprintln!(
        "fuzz {name}: {} executions ({} corpus + {execs} random) in {:.1} s: {} accepted, {} refused with an error, {} inputs exhausted; {} failures; slowest execution {:.1} ms",
        tally.execs,
        corpus.len(),
        wall.as_secs_f64(),
        tally.accepted,
        tally.refused,
        tally.exhausted,
        tally.failures.len(),
        tally.slowest.as_secs_f64() * 1e3
    );
    if tally.slowest > Duration::from_secs(1) {
        // A diagnostic only: a loaded machine can be slow, so this never fails the test.
        eprintln!("fuzz {name}: slow input ({:.1} s), hex: {}", tally.slowest.as_secs_f64(), hex(&tally.slowest_input));
    }
    if let Ok(path) = std::env::var("STRATA_FUZZ_REPORT") {
        use std::io::Write;
        let line = format!(
            "{{\"target\":\"{name}\",\"executions\":{},\"corpus\":{},\"random\":{execs},\"seed\":{seed},\"accepted\":{},\"refused\":{},\"exhausted\":{},\"failures\":{},\"wall_s\":{:.1},\"slowest_ms\":{:.1}}}\n",
            tally.execs,
            corpus.len(),
            tally.accepted,
            tally.refused,
            tally.exhausted,
            tally.failures.len(),
            wall.as_secs_f64(),
            tally.slowest.as_secs_f64() * 1e3
        );
        std::fs::OpenOptions::new().create(true).append(true).open(path).unwrap().write_all(line.as_bytes()).unwrap();
    }
    assert!(tally.failures.is_empty(), "fuzz target {name} failed:\n{}", tally.failures.join("\n"));
    assert!(tally.execs == 0 || tally.accepted + tally.refused > 0, "fuzz target {name} never ran an input");
}

macro_rules! targets {
    ($($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                campaign(stringify!($name));
            }
        )*

        /// Every target of the module has its test here.
        #[test]
        fn every_target_is_run() {
            let tested = [$(stringify!($name)),*];
            for t in targets::TARGETS {
                assert!(tested.contains(&t.name), "target {} has no test", t.name);
            }
        }
    };
}

/// The packed-leaf target reaches the compressed-strings encoding (its decoder is fuzzed).
#[test]
fn pax_leaf_reaches_compressed_strings() {
    let mut r = SplitMix64(77);
    for _ in 0..3000 {
        let data: Vec<u8> = (0..r.below(4096)).map(|_| r.below(256) as u8).collect();
        targets::pax_leaf(&data);
    }
    let n = targets::PACKED_COMPRESSED.load(std::sync::atomic::Ordering::Relaxed);
    assert!(n > 10, "{n} packed leaves with compressed strings");
}

targets!(meta, catalog, alloc_table, page_header, wal, doublewrite, btree_node, pax_leaf, edge_list, csr, column, raw_import, csv, parquet, sql, database);

/// Every target has seed inputs in its committed corpus (inputs it accepts, so that the
/// bounded campaign starts from structurally valid ones). With `STRATA_FUZZ_WRITE_SEEDS=1`
/// the test writes seeds (random inputs the target accepted) for the targets that have
/// none instead of failing: `STRATA_FUZZ_WRITE_SEEDS=1 cargo test --release -p strata
/// --test fuzz_targets every_target_has_seeds`.
#[test]
fn every_target_has_seeds() {
    install_hook();
    let write = std::env::var("STRATA_FUZZ_WRITE_SEEDS").is_ok_and(|v| v == "1");
    for t in targets::TARGETS {
        let dir = corpus_dir(t.name);
        if corpus(t.name).iter().any(|(n, _)| n.starts_with("seed-")) {
            continue;
        }
        assert!(write, "target {} has no seed-* inputs in {}: run with STRATA_FUZZ_WRITE_SEEDS=1 to write some", t.name, dir.display());
        std::fs::create_dir_all(&dir).unwrap();
        let mut r = SplitMix64(u64::from(crc32c::crc32c(t.name.as_bytes())));
        let mut kept = 0;
        for _ in 0..20_000 {
            let len = 16 + r.below(t.max_len as u64 / 2) as usize;
            let input: Vec<u8> = (0..len).map(|_| r.below(256) as u8).collect();
            if let Ok(Verdict::Accepted) = catch_unwind(AssertUnwindSafe(|| (t.run)(&input))) {
                std::fs::write(dir.join(format!("seed-{kept}")), &input).unwrap();
                kept += 1;
                if kept == 6 {
                    break;
                }
            }
        }
        eprintln!("{}: {kept} seeds", t.name);
    }
}

/// The whole-database target damages every kind of file: the sample database has them all.
#[test]
fn the_sample_database_has_every_kind_of_file() {
    let names: Vec<&str> = targets::sample().files.iter().map(|(n, _)| n.as_str()).collect();
    for want in ["strata.meta", "catalog.json", "alloc.table", "doublewrite.pages", "wal/checkpoint"] {
        assert!(names.contains(&want), "{want} missing from {names:?}");
    }
    assert!(names.iter().any(|n| n.starts_with("wal/") && n.ends_with(".log")), "no log segment in {names:?}");
    assert!(names.iter().any(|n| n.starts_with("class-") && n.ends_with(".pages")), "no page file in {names:?}");
    let sizes: Vec<(&str, usize)> = targets::sample().files.iter().map(|(n, b)| (n.as_str(), b.len())).collect();
    eprintln!("sample database files: {sizes:?}");
}
