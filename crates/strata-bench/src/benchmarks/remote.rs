//! `remote`: strata with a Valkey/Redis second memory tier (`strata-remote`) against strata
//! alone, on the same database.
//!
//! * **reads** — a database of `--data` (default 4x the pool) in pages of `--page-size`
//!   (default 64 KiB), pool `--pool` (default 16 MiB). Engines `strata-disk` (no tier) and
//!   `strata-remote` (a `RedisTier`), each opened fresh per round: a warm-up pass
//!   reads every page once in random order (this is what puts the evicted pages into the
//!   tier; the tier's queue is then flushed), then uniform random single-page reads
//!   (`fix_shared`, page number and two more words checked) for `--seconds` (default 3,
//!   split over 3 rounds per engine with the order alternating, the median round reported)
//!   or `--ops N` per thread (one round), on each thread count (default 1, 2). Ratio
//!   `strata-remote/strata-disk` of reads/s.
//! * **restart** — restart to a warm pool. The hot set is a random set of pages filling 3/4
//!   of the pool's frames. A priming open (tier, `warm_restart`) reads the hot set and closes,
//!   which stores the resident pages and their snapshot in the tier. Engines: `cold` (open
//!   without the tier, then read the hot set: every read goes to the disk) and `warm` (open
//!   with the tier and `warm_restart(true)`: the open loads the snapshot's pages from the
//!   tier; then the same reads). Timed: the open plus the reads; 5 rounds (one with
//!   `--ops`), the median reported. Ratio `warm/cold` of those seconds.
//!
//! Without `--remote URL` the benchmark starts a private server (`valkey-server` if on PATH,
//! else `redis-server`) on a unix socket in the scratch directory, with no persistence,
//! `maxmemory` 8x the pool and `allkeys-lru`, and kills it at the end.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};
use strata::buffer::RemoteStats;
use strata::{BufferManager, Config, PageId};
use strata_remote::{RedisTier, RemoteConfig};

use super::{short_size, Ctx};
use crate::dataset::{DataSet, FileSpec};
use crate::harness::{figures, measure, RunCfg, Step};
use crate::workload::{content_word, mix64, word, Rng};
use crate::{EResult, EngineError, IoCounters};

const DISK: &str = "strata-disk";
const REMOTE: &str = "strata-remote";

// ------------------------------------------------------------------ private server

fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(name)).find(|p| p.is_file())
}

/// One command over RESP on a unix socket; the reply's first line, or a bulk string's bytes.
fn raw_command(sock: &Path, args: &[&str]) -> std::io::Result<String> {
    let mut s = UnixStream::connect(sock)?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    s.set_write_timeout(Some(Duration::from_secs(2)))?;
    let mut req = format!("*{}\r\n", args.len());
    for a in args {
        req.push_str(&format!("${}\r\n{a}\r\n", a.len()));
    }
    s.write_all(req.as_bytes())?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        let n = s.read(&mut chunk)?;
        if n == 0 {
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "the server closed the connection"));
        }
        buf.extend_from_slice(&chunk[..n]);
        let Some(eol) = buf.windows(2).position(|w| w == b"\r\n") else { continue };
        let line = String::from_utf8_lossy(&buf[..eol]).into_owned();
        if let Some(len) = line.strip_prefix('$') {
            let Ok(len) = len.parse::<usize>() else { return Ok(line) };
            if buf.len() >= eol + 2 + len {
                return Ok(String::from_utf8_lossy(&buf[eol + 2..eol + 2 + len]).into_owned());
            }
            continue;
        }
        return Ok(line);
    }
}

/// A private Valkey/Redis server on a unix socket, killed on drop.
struct Server {
    child: Child,
    binary: PathBuf,
    sock: PathBuf,
    log: PathBuf,
    maxmemory: u64,
}

impl Server {
    fn start(dir: &Path, maxmemory: u64) -> EResult<Server> {
        let binary = which("valkey-server").or_else(|| which("redis-server")).ok_or_else(|| {
            EngineError(
                "the remote benchmark needs a Valkey or Redis server: neither valkey-server nor redis-server is on PATH. \
                 Install redis-server (Debian/Ubuntu: apt-get install redis-server) or valkey-server, or pass --remote URL of a running server"
                    .into(),
            )
        })?;
        std::fs::create_dir_all(dir)?;
        let mut sock = dir.join("redis.sock");
        if sock.as_os_str().len() > 100 {
            // sun_path holds 108 bytes: a deep --dir gets its socket in the temp directory.
            let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
            sock = std::env::temp_dir().join(format!("strata-bench-{}-{nanos}.sock", std::process::id()));
        }
        let log = dir.join("server.log");
        let out = std::fs::File::create(&log)?;
        let mut args: Vec<String> = ["--save", "", "--appendonly", "no", "--maxmemory"].map(String::from).to_vec();
        args.push(maxmemory.to_string());
        args.extend(["--maxmemory-policy", "allkeys-lru", "--daemonize", "no", "--port", "0", "--unixsocketperm", "700"].map(String::from));
        args.extend(["--dir".to_owned(), dir.display().to_string(), "--unixsocket".to_owned(), sock.display().to_string()]);
        let child = Command::new(&binary)
            .args(&args)
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .map_err(|e| EngineError(format!("start {}: {e}", binary.display())))?;
        let mut server = Server { child, binary, sock, log, maxmemory };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(Some(status)) = server.child.try_wait() {
                return Err(EngineError(format!("{} exited ({status}) at start:\n{}", server.binary.display(), server.log_tail())));
            }
            if raw_command(&server.sock, &["PING"]).is_ok_and(|r| r == "+PONG") {
                return Ok(server);
            }
            if Instant::now() > deadline {
                return Err(EngineError(format!("{} did not answer PING within 10 s:\n{}", server.binary.display(), server.log_tail())));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn log_tail(&self) -> String {
        let s = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = s.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    fn url(&self) -> String {
        format!("unix://{}", self.sock.display())
    }

    /// A field of `INFO section` (`redis_version`, `used_memory`, ...).
    fn info(&self, section: &str, field: &str) -> Option<String> {
        let info = raw_command(&self.sock, &["INFO", section]).ok()?;
        info.lines().find_map(|l| l.strip_prefix(field).and_then(|r| r.strip_prefix(':'))).map(|v| v.trim().to_owned())
    }

    fn describe(&self) -> String {
        let name = self.binary.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let version = self.info("server", "valkey_version").or_else(|| self.info("server", "redis_version")).unwrap_or_else(|| "?".into());
        format!("{name} {version} (private, unix socket, maxmemory {}, allkeys-lru, no persistence)", short_size(self.maxmemory))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.sock);
    }
}

// ------------------------------------------------------------------ counters

/// The buffer manager's counters that the benchmark reports, as differences.
#[derive(Clone, Copy, Debug, Default)]
struct Snap {
    hits: u64,
    misses: u64,
    pages_read: u64,
    pages_prefetched: u64,
    bytes_read: u64,
    evictions: u64,
    resident_bytes: u64,
    remote: RemoteStats,
}

fn snap(bm: &BufferManager) -> Snap {
    let s = bm.stats();
    Snap {
        hits: s.hits,
        misses: s.misses,
        pages_read: s.pages_read,
        pages_prefetched: s.pages_prefetched,
        bytes_read: s.bytes_read,
        evictions: s.evictions,
        resident_bytes: s.resident_bytes,
        remote: s.remote.unwrap_or_default(),
    }
}

impl Snap {
    fn since(&self, e: &Snap) -> Snap {
        let (r, q) = (&self.remote, &e.remote);
        Snap {
            hits: self.hits - e.hits,
            misses: self.misses - e.misses,
            pages_read: self.pages_read - e.pages_read,
            pages_prefetched: self.pages_prefetched - e.pages_prefetched,
            bytes_read: self.bytes_read - e.bytes_read,
            evictions: self.evictions - e.evictions,
            resident_bytes: self.resident_bytes,
            remote: RemoteStats {
                hits: r.hits - q.hits,
                misses: r.misses - q.misses,
                rejected: r.rejected - q.rejected,
                errors: r.errors - q.errors,
                puts: r.puts - q.puts,
                dropped: r.dropped - q.dropped,
                bytes_sent: r.bytes_sent - q.bytes_sent,
                bytes_received: r.bytes_received - q.bytes_received,
            },
        }
    }
}

/// The remote counters of a window, flattened into `m` as `remote_*`.
fn insert_remote(m: &mut Map<String, Value>, d: &Snap) {
    let r = &d.remote;
    for (k, v) in [
        ("remote_hits", r.hits),
        ("remote_misses", r.misses),
        ("remote_rejected", r.rejected),
        ("remote_errors", r.errors),
        ("remote_puts", r.puts),
        ("remote_dropped", r.dropped),
        ("remote_bytes_sent", r.bytes_sent),
        ("remote_bytes_received", r.bytes_received),
    ] {
        m.insert(k.into(), v.into());
    }
    if d.misses > 0 {
        m.insert("remote_hit_rate_of_misses".into(), json!((r.hits as f64 / d.misses as f64 * 1e4).round() / 1e4));
    }
}

fn tier_counters(t: &RedisTier) -> Value {
    let c = t.counters();
    json!({
        "stored_pages": c.stored_pages,
        "stored_bytes": c.stored_bytes,
        "pages_sent": c.pages_sent,
        "dropped_full": c.dropped_full,
        "dropped_offline": c.dropped_offline,
        "write_errors": c.write_errors,
        "get_errors": c.get_errors,
        "reconnects": c.reconnects,
        "budget_evictions": c.budget_evictions,
    })
}

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

/// A permutation of `0..n`.
fn shuffled(n: u64, seed: u64) -> Vec<u64> {
    let mut rng = Rng::new(seed);
    let mut v: Vec<u64> = (0..n).collect();
    for i in (1..v.len()).rev() {
        v.swap(i, rng.below(i as u64 + 1) as usize);
    }
    v
}

// ------------------------------------------------------------------ the database

struct Setup {
    dir: PathBuf,
    pool: u64,
    page_size: u64,
    pids: Vec<PageId>,
    remote: RemoteConfig,
    /// Pages read whose contents were not what the builder wrote (all engines, all runs).
    mismatches: AtomicU64,
}

impl Setup {
    /// Opens the database, with a freshly connected tier (and `warm_restart`) or without.
    fn open(&self, tier: bool, warm_restart: bool) -> EResult<(BufferManager, Option<Arc<RedisTier>>)> {
        self.open_timed(tier, warm_restart).map(|(bm, t, _)| (bm, t))
    }

    /// [`Setup::open`], also returning the seconds the tier's connection took.
    fn open_timed(&self, tier: bool, warm_restart: bool) -> EResult<(BufferManager, Option<Arc<RedisTier>>, f64)> {
        let mut config = Config::new(&self.dir).pool_size(self.pool).min_page(self.page_size);
        let mut t = None;
        let t0 = Instant::now();
        if tier {
            let tier = Arc::new(RedisTier::connect(self.remote.clone()).map_err(|e| EngineError(e.to_string()))?);
            config = config.remote_tier(tier.clone()).warm_restart(warm_restart);
            t = Some(tier);
        }
        let connect = t0.elapsed().as_secs_f64();
        Ok((BufferManager::open(config)?, t, connect))
    }

    /// Reads page `i` and checks its page number and two more words; a mismatch is counted.
    #[inline]
    fn read(&self, bm: &BufferManager, i: u64, salt: u64) -> EResult<u64> {
        let g = bm.fix_shared(self.pids[i as usize])?;
        let d = g.data();
        let words = d.len() / 8;
        let w = 1 + (salt % (words as u64 - 1)) as usize;
        let ok = word(d, 0) == content_word(0, i, 0) && word(d, w) == content_word(0, i, w) && word(d, words - 1) == content_word(0, i, words - 1);
        if !ok {
            self.mismatches.fetch_add(1, Ordering::Relaxed);
        }
        Ok(word(d, w))
    }

    fn n(&self) -> u64 {
        self.pids.len() as u64
    }
}

// ------------------------------------------------------------------ reads

/// One engine of the reads run: open, warm-up pass over every page, measurement, close.
fn reads_engine(s: &Setup, tier: bool, cfg: &RunCfg, seed: u64) -> EResult<Map<String, Value>> {
    let (bm, t) = s.open(tier, false)?;
    let bad_before = s.mismatches.load(Ordering::Relaxed);
    let n = s.n();
    let ps = s.page_size;

    // Warm-up: every page once, in random order, on the run's threads.
    let order = shuffled(n, seed ^ 0x3A3B);
    let cursor = AtomicU64::new(0);
    let before = snap(&bm);
    let t0 = Instant::now();
    measure(
        &RunCfg { seconds: None, ops: None, ..*cfg },
        |_| (),
        |_| {
            let k = cursor.fetch_add(1, Ordering::Relaxed);
            if k >= n {
                return Ok(Step::Done);
            }
            std::hint::black_box(s.read(&bm, order[k as usize], mix64(k))?);
            Ok(Step::Did { bytes: ps })
        },
    )?;
    let pass_seconds = t0.elapsed().as_secs_f64();
    // The evicted pages' puts are queued: let the writer store them before measuring.
    let flushed = t.as_ref().map(|t| t.flush(Duration::from_secs(60)));
    let warm_seconds = t0.elapsed().as_secs_f64();
    let w = snap(&bm).since(&before);

    let before = snap(&bm);
    let out = measure(
        cfg,
        |th| Rng::new(seed ^ ((th as u64 + 1) << 40)),
        |rng| {
            let i = rng.below(n);
            let salt = rng.next_u64();
            std::hint::black_box(s.read(&bm, i, salt)?);
            Ok(Step::Did { bytes: ps })
        },
    )?;
    let d = snap(&bm).since(&before);
    let mut m = figures(&out, Some(IoCounters { hits: Some(d.hits), misses: Some(d.misses), bytes_read: d.bytes_read }));
    m.insert("reads_per_sec".into(), m["ops_per_sec"].clone());
    m.insert("pages_read_from_disk".into(), d.pages_read.into());
    m.insert("pages_prefetched".into(), d.pages_prefetched.into());
    m.insert("evictions".into(), d.evictions.into());
    m.insert("resident_bytes".into(), d.resident_bytes.into());
    let mut warm = Map::new();
    warm.insert("seconds".into(), secs(warm_seconds));
    warm.insert("pass_seconds".into(), secs(pass_seconds));
    warm.insert("pages".into(), n.into());
    warm.insert("pages_read_from_disk".into(), w.pages_read.into());
    warm.insert("evictions".into(), w.evictions.into());
    if let Some(t) = &t {
        insert_remote(&mut m, &d);
        insert_remote(&mut warm, &w);
        warm.insert("tier_flushed".into(), flushed.unwrap_or(false).into());
        m.insert("tier".into(), tier_counters(t));
    }
    m.insert("warmup".into(), Value::Object(warm));
    m.insert("remote_tier".into(), tier.into());
    m.insert("direct_io".into(), bm.stats().direct_io.into());
    bm.close()?;
    drop(t);
    let bad = s.mismatches.load(Ordering::Relaxed) - bad_before;
    m.insert("mismatches".into(), bad.into());
    m.insert("verified".into(), (bad == 0).into());
    if bad > 0 {
        return Err(EngineError(format!("{bad} page reads returned the wrong contents")));
    }
    Ok(m)
}

// ------------------------------------------------------------------ restart

/// Reads the hot set in `order`; returns the seconds.
fn read_hot(s: &Setup, bm: &BufferManager, order: &[u64]) -> EResult<f64> {
    let t0 = Instant::now();
    for (k, &i) in order.iter().enumerate() {
        std::hint::black_box(s.read(bm, i, mix64(k as u64 ^ i))?);
    }
    Ok(t0.elapsed().as_secs_f64())
}

/// Opens with the tier and `warm_restart`, reads the hot set and closes: the close stores the
/// resident pages and their snapshot in the tier. Returns the pages the close left resident.
fn prime(s: &Setup, hot: &[u64]) -> EResult<u64> {
    let (bm, t) = s.open(true, true)?;
    read_hot(s, &bm, hot)?;
    let resident = bm.stats().resident_bytes / s.page_size;
    bm.close()?;
    drop(t);
    Ok(resident)
}

/// One restart: open (warm: with the tier and `warm_restart`, which loads the hot set from
/// the tier), then read the hot set. Timed together.
fn restart_engine(s: &Setup, warm: bool, hot: &[u64], primed_pages: u64) -> EResult<Map<String, Value>> {
    let bad_before = s.mismatches.load(Ordering::Relaxed);
    let t0 = Instant::now();
    let (bm, t, connect_seconds) = s.open_timed(warm, warm)?;
    let open_seconds = t0.elapsed().as_secs_f64();
    let at_open = snap(&bm);
    let read_seconds = read_hot(s, &bm, hot)?;
    let total = t0.elapsed().as_secs_f64();
    let reads = snap(&bm).since(&at_open);
    let mut m = Map::new();
    m.insert("seconds".into(), secs(total));
    m.insert("open_seconds".into(), secs(open_seconds));
    m.insert("read_seconds".into(), secs(read_seconds));
    m.insert("connect_seconds".into(), secs(connect_seconds));
    // One sample: the restart. ops_per_sec = restarts per second, so that the generic table
    // and plot show "higher is better" like the reads runs.
    let us = (total * 1e9).round() / 1e3;
    m.insert("ops".into(), 1.into());
    m.insert("ops_per_sec".into(), json!((1.0 / total.max(1e-9) * 1e3).round() / 1e3));
    m.insert("bytes_per_sec".into(), json!(((hot.len() as u64 * s.page_size) as f64 / total.max(1e-9)).round()));
    m.insert("p50_us".into(), json!(us));
    m.insert("p99_us".into(), json!(us));
    m.insert("hot_set_pages".into(), (hot.len() as u64).into());
    // During the open (the warm-up from the tier, for warm).
    m.insert("open_pages_loaded".into(), (at_open.resident_bytes / s.page_size).into());
    m.insert("open_pages_read_from_disk".into(), at_open.pages_read.into());
    m.insert("open_remote_hits".into(), at_open.remote.hits.into());
    m.insert("open_remote_misses".into(), at_open.remote.misses.into());
    m.insert("open_remote_rejected".into(), at_open.remote.rejected.into());
    m.insert("open_remote_errors".into(), at_open.remote.errors.into());
    m.insert("open_remote_bytes_received".into(), at_open.remote.bytes_received.into());
    // During the reads of the hot set.
    m.insert("read_hits".into(), reads.hits.into());
    m.insert("read_misses".into(), reads.misses.into());
    m.insert("read_pages_from_disk".into(), reads.pages_read.into());
    m.insert("remote_tier".into(), warm.into());
    if warm {
        // Not timed: the snapshot as the manager sees it (read again; the pages listed are
        // resident by now, so this loads nothing).
        let again = bm.warm_from_remote()?;
        m.insert("snapshot_valid".into(), again.valid.into());
        m.insert("snapshot_pages".into(), again.listed.into());
        // Resident when the priming close stored the hot set.
        m.insert("primed_resident_pages".into(), primed_pages.into());
    }
    bm.close()?;
    drop(t);
    let bad = s.mismatches.load(Ordering::Relaxed) - bad_before;
    m.insert("mismatches".into(), bad.into());
    m.insert("verified".into(), (bad == 0).into());
    if bad > 0 {
        return Err(EngineError(format!("{bad} page reads after the {} restart returned the wrong contents", if warm { "warm" } else { "cold" })));
    }
    Ok(m)
}

/// The round with the median `key`, with every round's value added as `rounds_<key>`.
fn median_by(mut rs: Vec<Map<String, Value>>, key: &str) -> Map<String, Value> {
    let get = |m: &Map<String, Value>| m.get(key).and_then(Value::as_f64).unwrap_or(0.0);
    let all: Vec<f64> = rs.iter().map(get).collect();
    rs.sort_by(|a, b| get(a).total_cmp(&get(b)));
    let mut m = rs.swap_remove(rs.len() / 2);
    m.insert(format!("rounds_{key}"), json!(all));
    m
}

// ------------------------------------------------------------------ the benchmark

pub(super) fn run(ctx: &mut Ctx<'_>) -> EResult<Vec<Value>> {
    let o = ctx.opts;
    let page_size = o.page_sizes.as_ref().and_then(|v| v.first().copied()).unwrap_or(64 << 10);
    let pool = o.pool.unwrap_or(16 << 20);
    let pages = (o.data.unwrap_or(4 * pool) / page_size).max(2);
    let data = pages * page_size;
    let seconds = o.seconds.unwrap_or(3.0);
    let threads: Vec<usize> = o.threads.clone().unwrap_or_else(|| vec![1, 2]).into_iter().filter(|&t| t > 0).collect();
    // Rounds per engine (reads: the measurement time split between them; restart: whole
    // restarts), the median round reported.
    let rounds = if o.ops.is_some() { 1 } else { 3 };
    let restart_rounds = if o.ops.is_some() { 1 } else { 5 };

    // The server: the one given, or a private one.
    let server = match &o.remote {
        Some(_) => None,
        None => {
            ctx.progress(|| "starting a private Valkey/Redis server".into());
            Some(Server::start(&ctx.scratch.path().join("server"), 8 * pool)?)
        }
    };
    let url = o.remote.clone().or_else(|| server.as_ref().map(Server::url)).unwrap_or_default();
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0);
    let prefix = format!("strata-bench:{}-{:x}", std::process::id(), mix64(nanos) & 0xFFFF_FFFF);
    // At most two copies of the data set's pages (what the tier may leave on a shared server).
    let budget = 2 * data;
    let remote = RemoteConfig::new(&url).map_err(|e| EngineError(e.to_string()))?.prefix(prefix.clone()).budget(budget);
    // Fail before building anything when the server cannot be reached.
    drop(RedisTier::connect(remote.clone()).map_err(|e| EngineError(e.to_string()))?);
    let server_desc = match &server {
        Some(s) => s.describe(),
        None => format!("{} (given with --remote)", remote.redacted_url()),
    };

    ctx.progress(|| format!("building {} of {}-byte pages", short_size(data), page_size));
    let ds = DataSet::build(&ctx.scratch.path().join("db"), page_size, &[FileSpec { page_size, pages }])?;
    let class = ds.files[0].class;
    let setup = Setup {
        dir: ds.db_dir.clone(),
        pool,
        page_size,
        pids: (0..pages).map(|i| PageId::new(class, false, i)).collect(),
        remote,
        mismatches: AtomicU64::new(0),
    };

    let mut runs = Vec::new();
    for (k, &t) in threads.iter().enumerate() {
        let cfg = RunCfg { threads: t, seconds: o.ops.is_none().then_some(seconds / rounds as f64), ops: o.ops, sample_every: 1 };
        let (mut disk_rs, mut remote_rs) = (Vec::new(), Vec::new());
        for round in 0..rounds {
            let seed = 0x4E3_07E ^ ((t as u64) << 8) ^ ((round as u64) << 20);
            // Alternate which engine goes first (this machine may be shared and noisy).
            let order = if (k + round) % 2 == 0 { [false, true] } else { [true, false] };
            for tier in order {
                let name = if tier { REMOTE } else { DISK };
                ctx.progress(|| format!("reads t{t} round {}/{rounds}: {name}", round + 1));
                let m = reads_engine(&setup, tier, &cfg, seed)?;
                if tier { &mut remote_rs } else { &mut disk_rs }.push(m);
            }
        }
        let mut sorted = Map::new();
        sorted.insert(DISK.into(), Value::Object(median_by(disk_rs, "ops_per_sec")));
        sorted.insert(REMOTE.into(), Value::Object(median_by(remote_rs, "ops_per_sec")));
        let rate = |n: &str| sorted[n]["ops_per_sec"].as_f64().unwrap_or(0.0);
        let p50 = |n: &str| sorted[n]["p50_us"].as_f64().unwrap_or(0.0);
        let mut ratios = Map::new();
        ratios.insert(format!("{REMOTE}/{DISK}"), ratio(rate(REMOTE), rate(DISK)));
        ratios.insert(format!("p50_us {REMOTE}/{DISK}"), ratio(p50(REMOTE), p50(DISK)));
        let verified = sorted.values().all(|e| e["verified"] == Value::Bool(true));
        let params = json!({
            "threads": t,
            "phase": "reads",
            "page_size": page_size,
            "pool_bytes": pool,
            "data_bytes": data,
            "pages": pages,
            "data_to_pool": (data as f64 / pool as f64 * 1000.0).round() / 1000.0,
            "distribution": "uniform",
            "queue_depth": t,
            "server": server_desc,
            "remote_budget_bytes": budget,
            "rounds": rounds,
            "seconds_per_round": cfg.seconds,
        });
        runs.push(json!({ "params": params, "engines": sorted, "ratios": ratios, "verified": verified }));
    }

    // Restart to a warm pool.
    let frames = {
        let (bm, _) = setup.open(false, false)?;
        let meta = bm.stats().metadata_bytes;
        bm.close()?;
        pool.saturating_sub(meta) / page_size
    };
    let hot_n = (frames * 3 / 4).clamp(1, pages);
    let mut hot = shuffled(pages, 0x407_5E7);
    hot.truncate(hot_n as usize);
    ctx.progress(|| format!("restart: hot set of {hot_n} pages ({}), {restart_rounds} round(s)", short_size(hot_n * page_size)));
    let (mut warm_rs, mut cold_rs) = (Vec::new(), Vec::new());
    for round in 0..restart_rounds {
        // The warm restart needs the snapshot of the close right before it (any later close,
        // such as the cold engine's, checkpoints and so makes it stale): prime, then warm.
        // The cold engine goes first in odd rounds.
        if round % 2 == 1 {
            cold_rs.push(restart_engine(&setup, false, &hot, 0)?);
        }
        let primed = prime(&setup, &hot)?;
        warm_rs.push(restart_engine(&setup, true, &hot, primed)?);
        if round % 2 == 0 {
            cold_rs.push(restart_engine(&setup, false, &hot, 0)?);
        }
    }
    let (warm, cold) = (median_by(warm_rs, "seconds"), median_by(cold_rs, "seconds"));
    let (ws, cs) = (warm["seconds"].as_f64().unwrap_or(0.0), cold["seconds"].as_f64().unwrap_or(0.0));
    let mut ratios = Map::new();
    ratios.insert("warm/cold".into(), ratio(ws, cs));
    ratios.insert("open_seconds warm/cold".into(), ratio(warm["open_seconds"].as_f64().unwrap_or(0.0), cold["open_seconds"].as_f64().unwrap_or(0.0)));
    let verified = warm["verified"] == Value::Bool(true) && cold["verified"] == Value::Bool(true);
    let mut engines = Map::new();
    engines.insert("cold".into(), Value::Object(cold));
    engines.insert("warm".into(), Value::Object(warm));
    let params = json!({
        "threads": 1,
        "phase": "restart",
        "page_size": page_size,
        "pool_bytes": pool,
        "data_bytes": data,
        "pages": pages,
        "hot_set_pages": hot_n,
        "hot_set_bytes": hot_n * page_size,
        "rounds": restart_rounds,
        "server": server_desc,
    });
    runs.push(json!({ "params": params, "engines": engines, "ratios": ratios, "verified": verified }));

    let mismatches = setup.mismatches.load(Ordering::Relaxed);
    if mismatches > 0 {
        return Err(EngineError(format!("{mismatches} page reads returned the wrong contents")));
    }
    if let Some(s) = &server {
        if let Some(used) = s.info("memory", "used_memory") {
            ctx.notes.push(format!("remote: the private server used {used} bytes of memory at the end (maxmemory {}).", s.maxmemory));
        }
    }
    ctx.notes.push(format!(
        "remote, reads: engines strata-disk (no tier) and strata-remote (strata_remote::RedisTier, key prefix {prefix}), the same database of {pages} pages of {} ({}) under a {} pool. Per thread count {rounds} round(s) per engine, the engine order alternating, each engine opened fresh per round; the median round is reported (rounds_ops_per_sec lists all). Each round: warm-up: every page read once in random order on the run's threads (evicted clean pages are offered to the tier), then the tier's queue flushed (warmup.seconds includes the flush). Then uniform random single-page reads (fix_shared; the page number and two more words checked against what was written, every read) for {} per round. Latency: every read timed. hits/misses/bytes_read are the pool's; pages_read_from_disk counts disk reads; remote_* are the core's stats().remote over the window (hits/misses/rejected/errors of tier lookups, puts offered on eviction, bytes sent/received by the tier client); tier: the client's own counters at the end. ratio strata-remote/strata-disk: reads/s (and p50 latency).",
        short_size(page_size),
        short_size(data),
        short_size(pool),
        match o.ops {
            Some(n) => format!("{n} reads per thread"),
            None => format!("{:.3} s", seconds / rounds as f64),
        },
    ));
    ctx.notes.push(format!(
        "remote, restart: hot set = {hot_n} random pages (3/4 of the pool's frames). Each round: a priming open (tier, warm_restart) reads the hot set and closes (close checkpoints, then stores the resident pages' images and the hot-set snapshot in the tier); warm = open with the tier and warm_restart(true) (the open loads the snapshot's pages from the tier, verified) + reading the hot set; cold = open without the tier + reading the hot set (all from disk). seconds = open (for warm including the tier's connection, connect_seconds) + reads (ops_per_sec = 1/seconds, restarts per second; p50_us = p99_us = that restart). open_* = what the open did (open_remote_hits: pages the warm-up took from the tier), read_* = the reads after it. snapshot_valid/snapshot_pages: warm_from_remote called again after the timing (open discards its WarmReport). {restart_rounds} round(s), the cold engine first in odd rounds, median reported (rounds_seconds lists all). ratio warm/cold: seconds (lower is better)."
    ));
    ctx.notes.push("--plot draws ops_per_sec per engine with the generic chart (log scale): reads/s for the reads runs, restarts/s for the restart run; its legend always lists a 'strata' entry first, which has no bars here.".into());
    let m = crate::machine::describe(ctx.scratch.path());
    if m["data_fs"] == "tmpfs" || m["direct_io"] == false {
        ctx.notes.push(
            "WARNING: the scratch directory is on tmpfs or does not take O_DIRECT: strata-disk's reads are memory copies there, so the ratios say nothing about a real disk. Rerun with --dir on a real disk.".into(),
        );
    } else {
        ctx.notes.push(
            "strata's data files use O_DIRECT (direct_io: true in each engine's figures): strata-disk's misses are device reads, not OS page-cache hits."
                .into(),
        );
    }
    if o.remote.is_some() {
        ctx.notes.push(format!(
            "--remote: the benchmark's pages stay on that server under the key prefix {prefix} (at most remote_budget_bytes of page images plus the {prefix}:meta:hot-set snapshot) until the server evicts them; delete them with: redis-cli --scan --pattern '{prefix}:*' | xargs redis-cli unlink"
        ));
    }
    drop(server);
    Ok(runs)
}
