//! `commit` and `recovery`: what durability costs.
//!
//! * **commit** — commit throughput of small transactions: each locks two random 8-byte
//!   slots on random pages (of a few hundred 4 KiB pages, all resident), increments both and
//!   commits (a durable commit: one log flush). Engines `group-commit` (the default
//!   configuration: concurrent committers share one log fsync) and `no-group-commit`
//!   (`Config::group_commit(false)`: every commit fsyncs by itself), alternating in rounds on
//!   the same database. Log fsyncs are counted by a storage backend that wraps strata's file
//!   backend (the log's own statistics are not public).
//! * **recovery** — recovery time against log size: committed transactions (slot increments
//!   plus 1 KiB range writes, so that the log grows fast) until the log since the last
//!   checkpoint holds about the target size, with every page resident (so nothing is written
//!   back before the crash: everything since the checkpoint is only in the log), some
//!   transactions left uncommitted (losers), then a "crash" (`Database::crash`: the open
//!   database is leaked, no rollback, no checkpoint, no close), and `Database::open` timed with a pool
//!   8x smaller than the pages (it runs analysis, redo with eviction, undo and a checkpoint).
//!   Baseline engine `clean-open`: the same database opened after a clean close (nothing to
//!   replay). Every committed value (and the losers' absence) is checked after both opens.

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsStr;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use serde_json::{json, Map, Value};
use strata::storage::backend::{IoBufMut, OpenMode, StorageBackend, StorageFile};
use strata::storage::FileBackend;
use strata::{Config, Database, PageId, Transaction, PAGE_HEADER_SIZE};

use super::Ctx;
use crate::harness::{figures, measure, RunCfg, Step};
use crate::workload::{mix64, sum_words, Rng};
use crate::{EResult, EngineError};

// ------------------------------------------------------------------ I/O counting backend

/// Counters of the I/O strata does through [`CountingBackend`].
#[derive(Debug, Default)]
struct IoCount {
    log_syncs: AtomicU64,
    log_dir_syncs: AtomicU64,
    log_bytes_written: AtomicU64,
    log_bytes_read: AtomicU64,
    data_syncs: AtomicU64,
    data_bytes_written: AtomicU64,
    data_bytes_read: AtomicU64,
    checkpoint_records: AtomicU64,
}

/// A snapshot of [`IoCount`].
#[derive(Clone, Copy, Debug, Default)]
struct IoSnap {
    log_syncs: u64,
    log_dir_syncs: u64,
    log_bytes_written: u64,
    log_bytes_read: u64,
    data_syncs: u64,
    data_bytes_written: u64,
    data_bytes_read: u64,
    checkpoint_records: u64,
}

impl IoCount {
    fn snap(&self) -> IoSnap {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        IoSnap {
            log_syncs: g(&self.log_syncs),
            log_dir_syncs: g(&self.log_dir_syncs),
            log_bytes_written: g(&self.log_bytes_written),
            log_bytes_read: g(&self.log_bytes_read),
            data_syncs: g(&self.data_syncs),
            data_bytes_written: g(&self.data_bytes_written),
            data_bytes_read: g(&self.data_bytes_read),
            checkpoint_records: g(&self.checkpoint_records),
        }
    }
}

impl IoSnap {
    fn since(&self, e: &IoSnap) -> IoSnap {
        IoSnap {
            log_syncs: self.log_syncs - e.log_syncs,
            log_dir_syncs: self.log_dir_syncs - e.log_dir_syncs,
            log_bytes_written: self.log_bytes_written - e.log_bytes_written,
            log_bytes_read: self.log_bytes_read - e.log_bytes_read,
            data_syncs: self.data_syncs - e.data_syncs,
            data_bytes_written: self.data_bytes_written - e.data_bytes_written,
            data_bytes_read: self.data_bytes_read - e.data_bytes_read,
            checkpoint_records: self.checkpoint_records - e.checkpoint_records,
        }
    }
}

fn in_wal_dir(path: &Path) -> bool {
    path.parent().and_then(Path::file_name) == Some(OsStr::new(strata::storage::wal::WAL_DIR))
}

/// strata's [`FileBackend`] with every byte and fsync counted, log segments
/// (`wal/*.log`) apart from everything else.
#[derive(Debug)]
struct CountingBackend {
    inner: FileBackend,
    count: Arc<IoCount>,
}

#[derive(Debug)]
struct CountingFile {
    inner: Arc<dyn StorageFile>,
    log: bool,
    count: Arc<IoCount>,
}

impl StorageFile for CountingFile {
    fn read_at(&self, dst: IoBufMut<'_>, offset: u64) -> io::Result<usize> {
        let n = self.inner.read_at(dst, offset)?;
        let c = if self.log { &self.count.log_bytes_read } else { &self.count.data_bytes_read };
        c.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
    fn write_at(&self, src: &[u8], offset: u64) -> io::Result<()> {
        self.inner.write_at(src, offset)?;
        let c = if self.log { &self.count.log_bytes_written } else { &self.count.data_bytes_written };
        c.fetch_add(src.len() as u64, Ordering::Relaxed);
        Ok(())
    }
    fn sync(&self) -> io::Result<()> {
        self.inner.sync()?;
        let c = if self.log { &self.count.log_syncs } else { &self.count.data_syncs };
        c.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.inner.set_len(len)
    }
    fn is_direct(&self) -> bool {
        self.inner.is_direct()
    }
    fn path(&self) -> &Path {
        self.inner.path()
    }
}

impl StorageBackend for CountingBackend {
    fn open(&self, path: &Path, mode: OpenMode, create: bool) -> io::Result<Arc<dyn StorageFile>> {
        let inner = self.inner.open(path, mode, create)?;
        let log = in_wal_dir(path) && path.extension() == Some(OsStr::new("log"));
        Ok(Arc::new(CountingFile { inner, log, count: self.count.clone() }))
    }
    fn read_file(&self, path: &Path) -> io::Result<Vec<u8>> {
        self.inner.read_file(path)
    }
    fn write_atomic(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        if in_wal_dir(path) {
            // The log's checkpoint record (`wal/checkpoint`): one per checkpoint.
            self.count.checkpoint_records.fetch_add(1, Ordering::Relaxed);
        }
        self.inner.write_atomic(path, bytes)
    }
    fn remove(&self, path: &Path) -> io::Result<()> {
        self.inner.remove(path)
    }
    fn exists(&self, path: &Path) -> bool {
        self.inner.exists(path)
    }
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        self.inner.create_dir_all(path)
    }
    fn list_dir(&self, path: &Path) -> io::Result<Vec<String>> {
        self.inner.list_dir(path)
    }
    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        self.inner.sync_dir(path)?;
        if path.file_name() == Some(OsStr::new(strata::storage::wal::WAL_DIR)) {
            self.count.log_dir_syncs.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }
}

/// A configuration for the database in `dir` whose I/O is counted in `count`.
fn counted_config(dir: &Path, count: &Arc<IoCount>, pool: u64, page_size: u64) -> Config {
    Config::new(dir).pool_size(pool).min_page(page_size).backend(Arc::new(CountingBackend { inner: FileBackend::default(), count: count.clone() }))
}

/// Drops the (clean) OS page-cache pages of the database's files (the data files use
/// `O_DIRECT` anyway; this matters for the log, which is written buffered), so that an open
/// reads the log from the device as after a machine crash.
fn drop_page_cache(dir: &Path) {
    use std::os::fd::AsRawFd;
    for d in [dir.to_owned(), dir.join(strata::storage::wal::WAL_DIR)] {
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        for e in entries.flatten() {
            if !e.file_type().is_ok_and(|t| t.is_file()) {
                continue;
            }
            if let Ok(f) = std::fs::File::open(e.path()) {
                // SAFETY: posix_fadvise takes an open descriptor (kept open by `f` for the
                // call) and plain integers; it reads or writes no memory of this process.
                unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
            }
        }
    }
}

const PLOT_NOTE: &str = "--plot draws ops_per_sec per engine with the generic chart, whose legend always lists a 'strata' entry first: it has no bars here (both engines are strata, configured or opened differently).";

fn secs(x: f64) -> Value {
    json!((x * 1e6).round() / 1e6)
}

fn ratio(a: f64, b: f64) -> Value {
    if b > 0.0 && a.is_finite() {
        json!(((a / b) * 1e4).round() / 1e4)
    } else {
        Value::Null
    }
}

fn tmpfs_note(ctx: &mut Ctx<'_>, what: &str) {
    if crate::machine::describe(ctx.scratch.path())["data_fs"] == "tmpfs" {
        ctx.notes.push(format!("WARNING: the scratch directory is on tmpfs, where fsync costs almost nothing: {what} Rerun with --dir on a real disk."));
    }
}

/// Allocates `pages` zeroed pages of `page_size` bytes in transactions of up to 1024 pages.
fn alloc_pages(db: &Database, pages: u64, page_size: u64) -> EResult<Vec<PageId>> {
    let payload = page_size as usize - PAGE_HEADER_SIZE;
    let mut pids = Vec::with_capacity(pages as usize);
    while (pids.len() as u64) < pages {
        let mut tx = db.begin();
        for _ in 0..(pages - pids.len() as u64).min(1024) {
            let pid = tx.alloc(payload)?;
            if pid.class() != 0 {
                return Err(EngineError(format!("a {payload}-byte allocation got page {pid}, expected the smallest class")));
            }
            pids.push(pid);
        }
        tx.commit()?;
    }
    Ok(pids)
}

// --------------------------------------------------------------------------- commit

const COMMIT_ENGINES: [(&str, bool); 2] = [("group-commit", true), ("no-group-commit", false)];

/// Increments the u64 slots `slots` (distinct) in one transaction, locking the pages in
/// ascending order first (so that these transactions never deadlock one another), and
/// commits. On an error the transaction is aborted (rolled back) and the error returned.
fn bump(db: &Database, mut slots: [(PageId, usize); 2]) -> strata::Result<()> {
    slots.sort();
    let mut tx = db.begin();
    let work = |tx: &mut Transaction<'_>| -> strata::Result<()> {
        for &(pid, _) in &slots {
            tx.lock(pid)?;
        }
        for &(pid, at) in &slots {
            let v = tx.read_u64(pid, at)?;
            tx.write_u64(pid, at, v.wrapping_add(1))?;
        }
        Ok(())
    };
    match work(&mut tx) {
        Ok(()) => tx.commit(),
        Err(e) => {
            // After a failed write the transaction has already rolled itself back; abort
            // then only says so.
            let _ = tx.abort();
            Err(e)
        }
    }
}

/// Sum of every word of every page: each committed bump adds 2.
fn sum_all(db: &Database, pids: &[PageId]) -> EResult<u64> {
    let bm = db.buffer();
    let mut s = 0u64;
    for &pid in pids {
        s = s.wrapping_add(sum_words(bm.fix_shared(pid)?.data()));
    }
    Ok(s)
}

struct CommitSetup<'a> {
    dir: &'a Path,
    count: &'a Arc<IoCount>,
    pool: u64,
    page_size: u64,
    pids: &'a [PageId],
    /// Commits so far (all measurements): the pages' words sum to twice this.
    committed: &'a AtomicU64,
}

/// Opens the database with group commit on or off, runs the bumps, checks the page sums,
/// closes it, and returns the engine's figures.
fn commit_measure(s: &CommitSetup<'_>, group: bool, cfg: &RunCfg, seed: u64) -> EResult<Map<String, Value>> {
    let db = Database::open(counted_config(s.dir, s.count, s.pool, s.page_size).group_commit(group))?;
    let words = (s.page_size as usize - PAGE_HEADER_SIZE) / 8;
    let n = s.pids.len() as u64;
    let retries = AtomicU64::new(0);
    let before = s.count.snap();
    let out = measure(
        cfg,
        |t| Rng::new(seed ^ ((t as u64 + 1) << 40)),
        |rng| {
            let a = (s.pids[rng.below(n) as usize], 8 * rng.below(words as u64) as usize);
            let mut b = (s.pids[rng.below(n) as usize], 8 * rng.below(words as u64) as usize);
            if a == b {
                b.1 = (b.1 + 8) % (8 * words);
            }
            loop {
                match bump(&db, [a, b]) {
                    Ok(()) => return Ok(Step::Did { bytes: 16 }),
                    Err(e) if e.is_lock_conflict() => {
                        retries.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => return Err(EngineError::from(e)),
                }
            }
        },
    )?;
    let io = s.count.snap().since(&before);
    let total = s.committed.fetch_add(out.ops, Ordering::Relaxed) + out.ops;
    let sum = sum_all(&db, s.pids)?;
    db.close()?;
    let commits = out.ops.max(1) as f64;
    let secs = out.seconds.max(1e-9);
    let mut m = figures(&out, None);
    m.insert("commits_per_sec".into(), m["ops_per_sec"].clone());
    m.insert("mean_us".into(), json!((out.hist.mean() / 10.0).round() / 100.0));
    m.insert("lock_timeout_retries".into(), retries.load(Ordering::Relaxed).into());
    m.insert("log_fsyncs".into(), io.log_syncs.into());
    m.insert("log_fsyncs_per_commit".into(), json!((io.log_syncs as f64 / commits * 1e4).round() / 1e4));
    m.insert("log_bytes_written".into(), io.log_bytes_written.into());
    m.insert("log_bytes_per_commit".into(), json!((io.log_bytes_written as f64 / commits).round()));
    m.insert("log_bytes_per_sec".into(), json!((io.log_bytes_written as f64 / secs).round()));
    m.insert("data_bytes_written".into(), io.data_bytes_written.into());
    m.insert("checkpoints".into(), io.checkpoint_records.into());
    m.insert("group_commit".into(), group.into());
    let ok = sum == total.wrapping_mul(2);
    m.insert("verified".into(), ok.into());
    if !ok {
        return Err(EngineError(format!("after {total} commits the pages' words sum to {sum}, expected {}", total.wrapping_mul(2))));
    }
    Ok(m)
}

pub(super) fn run_commit(ctx: &mut Ctx<'_>) -> EResult<Vec<Value>> {
    let o = ctx.opts;
    let page_size = o.page_sizes.as_ref().and_then(|v| v.first().copied()).unwrap_or(4096);
    let pages = (o.data.unwrap_or(1 << 20) / page_size).max(2);
    let data = pages * page_size;
    let pool = o.pool.unwrap_or((2 * data).max(8 << 20));
    let threads: Vec<usize> = o.threads.clone().unwrap_or_else(|| vec![1, 4, 16]).into_iter().filter(|&t| t > 0).collect();
    let seconds = o.seconds.unwrap_or(2.0);
    let rounds = if o.ops.is_some() { 1 } else { 3 };
    let dir = ctx.scratch.path().join("commit-db");
    let count = Arc::new(IoCount::default());
    ctx.progress(|| format!("creating {pages} pages of {}", super::short_size(page_size)));
    let db = Database::create(counted_config(&dir, &count, pool, page_size))?;
    let pids = alloc_pages(&db, pages, page_size)?;
    db.close()?;
    let committed = AtomicU64::new(0);
    let setup = CommitSetup { dir: &dir, count: &count, pool, page_size, pids: &pids, committed: &committed };

    let mut runs = Vec::new();
    for &t in &threads {
        ctx.progress(|| format!("commit t{t}"));
        let cfg = RunCfg { threads: t, seconds: o.ops.is_none().then_some(seconds / rounds as f64), ops: o.ops, sample_every: 1 };
        let mut results: Vec<Vec<EResult<Map<String, Value>>>> = vec![Vec::new(), Vec::new()];
        for round in 0..rounds {
            // Rotate the engine order: this machine is shared and noisy.
            for j in 0..COMMIT_ENGINES.len() {
                let e = (j + round) % COMMIT_ENGINES.len();
                let seed = 0xC0_4417 ^ (t as u64) << 8 ^ round as u64;
                results[e].push(commit_measure(&setup, COMMIT_ENGINES[e].1, &cfg, seed));
            }
        }
        let mut engines = Map::new();
        for ((name, _), rs) in COMMIT_ENGINES.iter().zip(results) {
            engines.insert((*name).into(), super::median_round(rs, "ops_per_sec"));
        }
        let rate = |n: &str| engines.get(n).and_then(|e| e.get("ops_per_sec")).and_then(Value::as_f64);
        let mut ratios = Map::new();
        if let (Some(g), Some(n)) = (rate("group-commit"), rate("no-group-commit")) {
            ratios.insert("group-commit/no-group-commit".into(), ratio(g, n));
        }
        let verified = engines.values().all(|e| e.get("verified") == Some(&Value::Bool(true)));
        let params = json!({
            "threads": t,
            "page_size": page_size,
            "pool_bytes": pool,
            "data_bytes": data,
            "pages": pages,
            "slots_per_commit": 2,
            "distribution": "uniform",
        });
        runs.push(json!({ "params": params, "engines": engines, "ratios": ratios, "verified": verified }));
    }
    ctx.notes.push(format!(
        "commit: each transaction locks two random 8-byte slots on random pages (pages locked in ascending order, so the transactions never deadlock one another), increments both and commits durably. ops_per_sec = commits/s; bytes_per_sec counts the 16 payload bytes changed per commit; latencies are of whole transactions including lock waits and retries (every one timed). log_fsyncs counts fsyncs of log segment files, through a storage backend that wraps strata's file backend (strata's log statistics are not public). Each run: {rounds} round(s) per engine with the engine order rotated, database reopened per round, the median round reported (rounds_ops_per_sec lists all). 'verified': the pages' words sum to twice the commits after every round. Threads may exceed the cores: committers mostly wait for fsync."
    ));
    ctx.notes.push(PLOT_NOTE.into());
    tmpfs_note(ctx, "group commit has little to save there, so the ratio says nothing about a real disk.");
    Ok(runs)
}

// ------------------------------------------------------------------------- recovery

/// Range writes per committed transaction of the recovery workload.
const RANGE_WRITES: usize = 8;
/// Slot increments per committed transaction.
const SLOT_WRITES: usize = 2;
const RANGE: usize = 1024;
/// Pages only the losers write (the committed workload never touches them).
const LOSERS: u64 = 4;
const PAGES_PER_LOSER: u64 = 4;

/// Where things live in a page payload: `ranges` aligned 1 KiB ranges, then `slots` u64s.
#[derive(Clone, Copy)]
struct Layout {
    ranges: usize,
    slot_base: usize,
    slots: usize,
}

impl Layout {
    fn new(payload: usize) -> Layout {
        let ranges = (payload - 512) / RANGE;
        let slot_base = ranges * RANGE;
        Layout { ranges, slot_base, slots: (payload - slot_base) / 8 }
    }
}

/// The 1 KiB content written with `seed`.
fn range_bytes(seed: u64) -> Vec<u8> {
    (0..RANGE / 8).flat_map(|w| mix64(seed ^ (w as u64) << 48).to_le_bytes()).collect()
}

/// What the committed transactions left: expected content per (page index, range) and per
/// (page index, slot); anything absent is zero.
#[derive(Default)]
struct Shadow {
    ranges: HashMap<(u64, usize), u64>,
    slots: HashMap<(u64, usize), u64>,
}

/// A location in a page payload: a 1 KiB range or a u64 slot.
#[derive(Clone, Copy, Debug)]
enum Loc {
    Range(usize),
    Slot(usize),
}

/// The recovery workload on one database.
struct RecState {
    pids: Vec<PageId>,
    layout: Layout,
    shadow: Shadow,
    /// Locations the losers wrote (page index, location).
    loser_touched: Vec<(u64, Loc)>,
    rng: Rng,
    seq: u64,
}

impl RecState {
    /// One committed transaction on random non-loser pages.
    fn committed_tx(&mut self, db: &Database) -> EResult<()> {
        let n = self.pids.len() as u64 - LOSERS * PAGES_PER_LOSER;
        let mut tx = db.begin();
        let mut ranges = Vec::new();
        let mut slots = Vec::new();
        for _ in 0..RANGE_WRITES {
            let i = LOSERS * PAGES_PER_LOSER + self.rng.below(n);
            let k = self.rng.below(self.layout.ranges as u64) as usize;
            self.seq += 1;
            let seed = mix64(self.seq) | 1;
            tx.write(self.pids[i as usize], k * RANGE, &range_bytes(seed))?;
            ranges.push(((i, k), seed));
        }
        for _ in 0..SLOT_WRITES {
            let i = LOSERS * PAGES_PER_LOSER + self.rng.below(n);
            let k = self.rng.below(self.layout.slots as u64) as usize;
            let pid = self.pids[i as usize];
            let at = self.layout.slot_base + 8 * k;
            let v = tx.read_u64(pid, at)?.wrapping_add(1);
            tx.write_u64(pid, at, v)?;
            slots.push(((i, k), v));
        }
        tx.commit()?;
        self.shadow.ranges.extend(ranges);
        self.shadow.slots.extend(slots);
        Ok(())
    }

    /// Begins loser `j`: a range and a slot written on each of its pages; not committed.
    fn loser<'a>(&mut self, db: &'a Database, j: u64) -> EResult<Transaction<'a>> {
        let mut tx = db.begin();
        for i in j * PAGES_PER_LOSER..(j + 1) * PAGES_PER_LOSER {
            let pid = self.pids[i as usize];
            let k = self.rng.below(self.layout.ranges as u64) as usize;
            tx.write(pid, k * RANGE, &range_bytes(0xBAD0_0000 ^ i))?;
            let s = self.rng.below(self.layout.slots as u64) as usize;
            tx.write_u64(pid, self.layout.slot_base + 8 * s, 0xBAD)?;
            self.loser_touched.push((i, Loc::Range(k)));
            self.loser_touched.push((i, Loc::Slot(s)));
        }
        Ok(tx)
    }

    /// Checks every committed location and every location a loser wrote; returns the
    /// number of mismatches.
    fn verify(&self, db: &Database) -> EResult<u64> {
        let mut by_page: BTreeMap<u64, Vec<(Loc, u64)>> = BTreeMap::new();
        for (&(i, k), &seed) in &self.shadow.ranges {
            by_page.entry(i).or_default().push((Loc::Range(k), seed));
        }
        for (&(i, k), &v) in &self.shadow.slots {
            by_page.entry(i).or_default().push((Loc::Slot(k), v));
        }
        for &(i, loc) in &self.loser_touched {
            // Losers' pages are never committed to: every location they wrote must be zero.
            by_page.entry(i).or_default().push((loc, 0));
        }
        let bm = db.buffer();
        let zero = vec![0u8; RANGE];
        let mut bad = 0;
        for (i, checks) in by_page {
            let g = bm.fix_shared(self.pids[i as usize])?;
            let d = g.data();
            for (loc, want) in checks {
                let ok = match loc {
                    Loc::Range(k) => {
                        let got = &d[k * RANGE..(k + 1) * RANGE];
                        if want == 0 {
                            got == zero.as_slice()
                        } else {
                            got == range_bytes(want).as_slice()
                        }
                    }
                    Loc::Slot(s) => {
                        let at = self.layout.slot_base + 8 * s;
                        u64::from_le_bytes(d[at..at + 8].try_into().unwrap()) == want
                    }
                };
                bad += u64::from(!ok);
            }
        }
        Ok(bad)
    }
}

/// Times `Database::open` of `dir` (page cache dropped first); returns the open database,
/// the seconds, and the I/O the open did.
fn timed_open(dir: &Path, count: &Arc<IoCount>, pool: u64, page_size: u64) -> EResult<(Database, f64, IoSnap)> {
    drop_page_cache(dir);
    let before = count.snap();
    let t0 = Instant::now();
    let db = Database::open(counted_config(dir, count, pool, page_size))?;
    let secs = t0.elapsed().as_secs_f64();
    Ok((db, secs, count.snap().since(&before)))
}

fn open_figures(db: &Database, open_secs: f64, io: &IoSnap, replayed: u64) -> Map<String, Value> {
    let st = db.buffer().stats();
    let secs_c = open_secs.max(1e-9);
    let us = (open_secs * 1e6 * 1000.0).round() / 1000.0;
    let mut m = Map::new();
    m.insert("open_seconds".into(), secs(open_secs));
    // One sample: the open. ops_per_sec = opens per second, so that the generic table and
    // plot show "higher is better" like every other benchmark.
    m.insert("ops".into(), 1.into());
    m.insert("ops_per_sec".into(), json!((1.0 / secs_c * 1e3).round() / 1e3));
    m.insert("bytes_per_sec".into(), json!((replayed as f64 / secs_c).round()));
    m.insert("p50_us".into(), json!(us));
    m.insert("p99_us".into(), json!(us));
    m.insert("log_bytes_replayed".into(), replayed.into());
    m.insert("log_mb_per_sec".into(), json!((replayed as f64 / secs_c / 1e6 * 100.0).round() / 100.0));
    m.insert("log_bytes_read".into(), io.log_bytes_read.into());
    m.insert("log_fsyncs".into(), io.log_syncs.into());
    m.insert("data_bytes_read".into(), io.data_bytes_read.into());
    m.insert("data_bytes_written".into(), io.data_bytes_written.into());
    m.insert("data_fsyncs".into(), io.data_syncs.into());
    m.insert("checkpoints".into(), io.checkpoint_records.into());
    m.insert("pages_read".into(), st.pages_read.into());
    m.insert("pages_written".into(), st.pages_written.into());
    m.insert("evictions".into(), st.evictions.into());
    m
}

pub(super) fn run_recovery(ctx: &mut Ctx<'_>) -> EResult<Vec<Value>> {
    let o = ctx.opts;
    let page_size = o.page_sizes.as_ref().and_then(|v| v.first().copied()).unwrap_or(4096);
    let pool = o.pool.unwrap_or(8 << 20);
    let pages = (8 * pool / page_size).max(64);
    let largest = o.data.unwrap_or(16 << 20).max(64 << 10);
    let mut targets: Vec<u64> = [largest / 16, largest / 4, largest].iter().map(|&t| t.max(64 << 10)).collect();
    targets.dedup();
    let payload = page_size as usize - PAGE_HEADER_SIZE;
    if payload < RANGE + 512 {
        return Err(EngineError(format!("recovery needs pages of at least 2 KiB, got {page_size}")));
    }
    let dir = ctx.scratch.path().join("recovery-db");
    let count = Arc::new(IoCount::default());
    // Building the pages and running the workload with every page resident keeps them fast
    // (no write-back of dirty pages under a small pool before the crash); the timed opens
    // use the small pool.
    let work_pool = pool.max(pages * page_size + (8 << 20));
    ctx.progress(|| format!("creating {} of {}-byte pages", super::short_size(pages * page_size), page_size));
    let db = Database::create(counted_config(&dir, &count, work_pool, page_size))?;
    let pids = alloc_pages(&db, pages, page_size)?;
    db.close()?;
    let mut st = RecState { pids, layout: Layout::new(payload), shadow: Shadow::default(), loser_touched: Vec::new(), rng: Rng::new(0x5EC0_7E55), seq: 0 };

    let mut runs = Vec::new();
    for &target in &targets {
        ctx.progress(|| format!("recovery: writing {} of log", super::short_size(target)));
        // The database was closed (or recovered and closed): the log since its last
        // checkpoint is empty.
        let db = Database::open(counted_config(&dir, &count, work_pool, page_size))?;
        let start = count.snap();
        let t0 = Instant::now();
        // Two losers begin before the workload (their records sit in the log from its start,
        // so undo walks back through all of it), two after it.
        let early: Vec<Transaction<'_>> = (0..LOSERS / 2).map(|j| st.loser(&db, j)).collect::<EResult<_>>()?;
        let mut committed = 0u64;
        loop {
            let done = match o.ops {
                Some(n) => committed >= n,
                None => count.snap().since(&start).log_bytes_written >= target,
            };
            if done {
                break;
            }
            st.committed_tx(&db)?;
            committed += 1;
        }
        let late: Vec<Transaction<'_>> = (LOSERS / 2..LOSERS).map(|j| st.loser(&db, j)).collect::<EResult<_>>()?;
        // A last committed transaction: its commit flushes the late losers' records too.
        st.committed_tx(&db)?;
        committed += 1;
        let work = count.snap().since(&start);
        let workload_seconds = t0.elapsed().as_secs_f64();
        // The crash: nothing of the open database runs any more (no rollback of the losers,
        // no checkpoint, no close). Its memory and file descriptors are leaked; its
        // directory lock is released, as at a process's death.
        for tx in early.into_iter().chain(late) {
            std::mem::forget(tx);
        }
        db.crash();

        ctx.progress(|| format!("recovery: opening after a crash with {} of log", super::short_size(work.log_bytes_written)));
        let (db, rec_secs, rec_io) = timed_open(&dir, &count, pool, page_size)?;
        let mut rec = open_figures(&db, rec_secs, &rec_io, work.log_bytes_written);
        let bad_rec = st.verify(&db)?;
        rec.insert("verified".into(), (bad_rec == 0).into());
        db.close()?;

        let (db, clean_secs, clean_io) = timed_open(&dir, &count, pool, page_size)?;
        let mut clean = open_figures(&db, clean_secs, &clean_io, 0);
        let bad_clean = st.verify(&db)?;
        clean.insert("verified".into(), (bad_clean == 0).into());
        db.close()?;
        if bad_rec + bad_clean > 0 {
            return Err(EngineError(format!(
                "recovery lost or kept the wrong data: {bad_rec} wrong locations after recovery, {bad_clean} after the clean reopen"
            )));
        }

        let mut engines = Map::new();
        engines.insert("recovery".into(), Value::Object(rec));
        engines.insert("clean-open".into(), Value::Object(clean));
        let mut ratios = Map::new();
        ratios.insert("recovery/clean-open".into(), ratio(rec_secs, clean_secs));
        let params = json!({
            "data_bytes": target,
            "log_target_bytes": target,
            "log_bytes": work.log_bytes_written,
            "page_size": page_size,
            "pool_bytes": pool,
            "workload_pool_bytes": work_pool,
            "database_bytes": pages * page_size,
            "threads": 1,
            "committed_txns": committed,
            "losers": LOSERS,
            "range_writes_per_txn": RANGE_WRITES,
            "slot_writes_per_txn": SLOT_WRITES,
            "workload_seconds": secs(workload_seconds),
            "workload_log_fsyncs": work.log_syncs,
            "workload_pages_written_bytes": work.data_bytes_written,
            "checkpoints_during_workload": work.checkpoint_records,
        });
        runs.push(json!({ "params": params, "engines": engines, "ratios": ratios, "verified": bad_rec + bad_clean == 0 }));
    }
    ctx.notes.push(
        "recovery: per log size, committed transactions (8 writes of 1 KiB and 2 u64 increments on random pages of database_bytes, 8x pool_bytes, each) until the log written since the last checkpoint reaches data_bytes (--data sets the largest; --ops N: exactly N transactions instead), run in a pool that holds every page (workload_pool_bytes: nothing is written back before the crash, so redo has every change to apply; steal of uncommitted changes is exercised by strata's crash tests, not here), 4 losers (2 begun before the workload, 2 after) left uncommitted, then a crash (Database::crash: the open database is leaked, no rollback, no checkpoint, no close; its directory lock is released as at a process's death) and Database::open timed with pool_bytes (recovery evicts) and the log and data files dropped from the OS page cache (posix_fadvise DONTNEED). The open includes strata's analysis, redo, undo and the checkpoint after recovery. Baseline clean-open: the same database opened after a clean close (nothing to replay). ops_per_sec = opens per second (one open each; p50_us = p99_us = that open), bytes_per_sec and log_mb_per_sec = log bytes written since the checkpoint / open time. Records redone are not observable from outside strata (its recovery report is private); log_bytes_read, pages_read and pages_written show the work. 'verified': every committed value present and every loser change absent after recovery and after the clean reopen (checked, the run fails otherwise). checkpoints_during_workload > 0 means strata checkpointed by itself and the log replayed is shorter than log_bytes.".into(),
    );
    ctx.notes.push(PLOT_NOTE.into());
    tmpfs_note(ctx, "recovery's log reads and fsyncs cost less there than on a disk.");
    Ok(runs)
}
