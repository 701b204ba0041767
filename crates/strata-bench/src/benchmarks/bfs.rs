//! `bfs`: a breadth-first search ([`strata::ops::bfs`]) over a CSR graph several times larger
//! than the pool, with strata's read-ahead on (`strata`: detection of sequential misses, as
//! configured by default) and off (`strata-noprefetch`): the BFS half of the prefetch
//! comparison.
//!
//! The graph is generated deterministically ([`edges`]: vertices `0..n`, out-degrees skewed
//! (a Pareto tail, mean about [`DEGREE`]), destinations uniform) and imported once through
//! the run's pool into a database in the scratch directory. Then, per thread count, round
//! and engine: the database is opened fresh (its files dropped from the OS page cache first,
//! for the case where the filesystem refuses `O_DIRECT`), one BFS from vertex [`SOURCE`]
//! runs (`cold`), then a second on the same open database (`warm`). One operation is one
//! BFS. Every round of every engine must give the same result (reached, max_depth,
//! depth_sum): if not, the benchmark fails.

use std::io::{BufRead, Read};
use std::path::Path;
use std::time::Instant;

use serde_json::{json, Map, Value};
use strata::{Config, Database};

use super::{median_round, short_size, Ctx, Rounds};
use crate::harness::{run_value, usage};
use crate::workload::Rng;
use crate::{EResult, EngineError};

/// The engines (both run by default).
pub(super) const ENGINES: [&str; 2] = ["strata", "strata-noprefetch"];
/// Rounds per engine by default (median reported).
const DEFAULT_ROUNDS: usize = 3;
/// Mean out-degree of the generated graph (before the cap).
pub const DEGREE: u64 = 16;
/// Largest out-degree of the generated graph.
pub const MAX_DEGREE: u64 = 4096;
/// The generator's seed.
pub const SEED: u64 = 0x5EED_0BF5;
/// The BFS source vertex.
pub const SOURCE: u64 = 0;
/// The graph's name in the database.
const GRAPH: &str = "g";
/// Approximate CSR bytes per vertex: 8 bytes of offset plus [`DEGREE`] u32 neighbours.
const CSR_BYTES_PER_VERTEX: u64 = 8 + 4 * DEGREE;

/// The vertex count of a graph whose CSR is about `data_bytes`.
pub(super) fn vertices_for(data_bytes: u64) -> u64 {
    (data_bytes / CSR_BYTES_PER_VERTEX).max(16)
}

/// The benchmark's edges for `vertices` vertices and `seed`, grouped by source, ascending:
/// vertex `u` has `floor(DEGREE / 2 / sqrt(1 - r))` out-edges (`r` uniform in `[0, 1)`; at
/// least `DEGREE / 2`, at most [`MAX_DEGREE`], mean about `DEGREE`), each to a vertex drawn
/// uniformly from `0..vertices`.
pub fn edges(vertices: u64, seed: u64) -> impl Iterator<Item = (u64, u64)> {
    let mut rng = Rng::new(seed);
    (0..vertices).flat_map(move |u| {
        let r = rng.unit();
        let deg = ((DEGREE as f64 / 2.0 / (1.0 - r).sqrt()) as u64).clamp(1, MAX_DEGREE);
        (0..deg).map(|_| (u, rng.below(vertices))).collect::<Vec<_>>()
    })
}

/// [`edges`] as a SNAP text edge list (`u v` per line), generated as it is read.
struct EdgeText<I> {
    edges: I,
    buf: Vec<u8>,
    pos: usize,
}

impl<I: Iterator<Item = (u64, u64)>> Read for EdgeText<I> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        let n = {
            let b = self.fill_buf()?;
            let n = b.len().min(out.len());
            out[..n].copy_from_slice(&b[..n]);
            n
        };
        self.consume(n);
        Ok(n)
    }
}

impl<I: Iterator<Item = (u64, u64)>> BufRead for EdgeText<I> {
    fn fill_buf(&mut self) -> std::io::Result<&[u8]> {
        if self.pos == self.buf.len() {
            self.buf.clear();
            self.pos = 0;
            use std::io::Write;
            while self.buf.len() < 64 << 10 {
                let Some((u, v)) = self.edges.next() else { break };
                writeln!(self.buf, "{u} {v}")?;
            }
        }
        Ok(&self.buf[self.pos..])
    }

    fn consume(&mut self, n: usize) {
        self.pos = (self.pos + n).min(self.buf.len());
    }
}

/// Drops the files of database `dir` from the OS page cache (they are read with `O_DIRECT`
/// where the filesystem allows, which bypasses it; elsewhere this makes the open cold).
fn drop_page_cache(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        if let Ok(f) = std::fs::File::open(e.path()) {
            use std::os::fd::AsRawFd;
            // SAFETY: an advisory call on a descriptor we own; it changes no memory of ours.
            unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        }
    }
}

/// Opens the database for engine `name`.
fn open(name: &str, dir: &Path, pool: u64) -> EResult<Database> {
    let config = Config::new(dir).pool_size(pool);
    let config = match name {
        "strata" => config,
        // No read-ahead at all: no detection of sequential misses (the BFS gives no hints).
        "strata-noprefetch" => config.sequential_readahead(false),
        other => return Err(EngineError(format!("unknown engine {other}"))),
    };
    Ok(Database::open(config)?)
}

fn round_to(x: f64, digits: i32) -> f64 {
    let s = 10f64.powi(digits);
    (x * s).round() / s
}

/// One BFS on `db`: its figures (one operation), the result included.
fn bfs_pass(db: &Database, threads: usize, csr_bytes: u64) -> EResult<Map<String, Value>> {
    let bm = db.buffer();
    let g = db.graph(GRAPH)?;
    let s0 = bm.stats();
    let (_, user0, sys0) = usage();
    let start = Instant::now();
    let r = strata::ops::bfs(bm, &g, SOURCE, threads)?;
    let secs = start.elapsed().as_secs_f64().max(1e-9);
    let (_, user1, sys1) = usage();
    let s1 = bm.stats();
    let (user, sys) = ((user1 - user0).max(0.0), (sys1 - sys0).max(0.0));
    let d = |a: u64, b: u64| b.saturating_sub(a);
    let mut m = Map::new();
    m.insert("ops".into(), 1.into());
    m.insert("seconds".into(), json!(round_to(secs, 6)));
    m.insert("ops_per_sec".into(), json!(round_to(1.0 / secs, 6)));
    // The graph's CSR bytes per second of BFS (not the bytes read: see bytes_read).
    m.insert("bytes_per_sec".into(), json!((csr_bytes as f64 / secs).round()));
    m.insert("p50_us".into(), json!(round_to(secs * 1e6, 1)));
    m.insert("p99_us".into(), json!(round_to(secs * 1e6, 1)));
    m.insert("cpu_user_seconds".into(), json!(round_to(user, 3)));
    m.insert("cpu_sys_seconds".into(), json!(round_to(sys, 3)));
    m.insert("cpu_seconds".into(), json!(round_to(user + sys, 3)));
    m.insert("cpu_us_per_op".into(), json!(round_to((user + sys) * 1e6, 1)));
    m.insert("hits".into(), d(s0.hits, s1.hits).into());
    m.insert("misses".into(), d(s0.misses, s1.misses).into());
    m.insert("pages_read".into(), d(s0.pages_read, s1.pages_read).into());
    m.insert("bytes_read".into(), d(s0.bytes_read, s1.bytes_read).into());
    m.insert("read_requests".into(), d(s0.read_requests, s1.read_requests).into());
    m.insert("sequential_windows".into(), d(s0.sequential_windows, s1.sequential_windows).into());
    m.insert("pages_prefetched".into(), d(s0.pages_prefetched, s1.pages_prefetched).into());
    m.insert("prefetch_hits".into(), d(s0.prefetch_hits, s1.prefetch_hits).into());
    m.insert("prefetch_wasted".into(), d(s0.prefetch_wasted, s1.prefetch_wasted).into());
    m.insert("frames_recycled".into(), d(s0.frames_recycled, s1.frames_recycled).into());
    m.insert("pages_written".into(), d(s0.pages_written, s1.pages_written).into());
    m.insert("bytes_written".into(), d(s0.bytes_written, s1.bytes_written).into());
    m.insert("evictions".into(), d(s0.evictions, s1.evictions).into());
    m.insert("pool_bytes".into(), s1.pool_bytes.into());
    m.insert("peak_resident_bytes".into(), s1.peak_resident_bytes.into());
    m.insert("direct_io".into(), s1.direct_io.into());
    m.insert("reached".into(), r.reached.into());
    m.insert("max_depth".into(), r.max_depth.into());
    m.insert("depth_sum".into(), r.depth_sum.into());
    Ok(m)
}

/// The (reached, max_depth, depth_sum) of a round's figures.
fn result_of(m: &Map<String, Value>) -> (u64, u64, u64) {
    let g = |k: &str| m.get(k).and_then(Value::as_u64).unwrap_or(u64::MAX);
    (g("reached"), g("max_depth"), g("depth_sum"))
}

pub(super) fn run(ctx: &mut Ctx<'_>) -> EResult<Vec<Value>> {
    let o = ctx.opts;
    let pool = o.pool.unwrap_or(64 << 20);
    let target = o.data.unwrap_or(4 * pool);
    let vertices = vertices_for(target);
    let dir = ctx.scratch.path().join("db");
    ctx.progress(|| format!("generating and importing a graph of {vertices} vertices (CSR about {})", short_size(target)));
    let started = Instant::now();
    let (graph, csr_bytes, csr_page) = {
        let db = Database::create(Config::new(&dir).pool_size(pool))?;
        let mut text = EdgeText { edges: edges(vertices, SEED), buf: Vec::new(), pos: 0 };
        let g = db.import_edges(GRAPH, &mut text, &mut |_| {})?;
        let classes = db.buffer().classes();
        let page = |p: &strata::access::ColumnPage| classes.page_size(p.page_id().class());
        let csr: u64 = g.offsets.iter().chain(&g.neighbours).map(page).sum();
        let csr_page = g.neighbours.iter().chain(&g.offsets).map(page).max().unwrap_or(0);
        db.close()?;
        (g, csr, csr_page)
    };
    let import_seconds = started.elapsed().as_secs_f64();
    ctx.progress(|| format!("imported {} edges ({} of CSR in {} pages) in {import_seconds:.1} s", graph.edges, short_size(csr_bytes), short_size(csr_page)));

    let rounds = o.rounds.unwrap_or(DEFAULT_ROUNDS).max(1);
    let engines = ctx.engines(&ENGINES);
    let mut runs = Vec::new();
    for &threads in &o.thread_counts() {
        // [phase][engine] -> one result per round
        let mut results: [Vec<Rounds>; 2] = [vec![Vec::new(); engines.len()], vec![Vec::new(); engines.len()]];
        for round in 0..rounds {
            for k in 0..engines.len() {
                let e = (k + round) % engines.len();
                let name = engines[e];
                ctx.progress(|| format!("t{threads} round {}/{rounds}: {name}", round + 1));
                drop_page_cache(&dir);
                let r = open(name, &dir, pool).and_then(|db| {
                    let cold = bfs_pass(&db, threads, csr_bytes);
                    let warm = bfs_pass(&db, threads, csr_bytes);
                    db.close()?;
                    Ok([cold, warm])
                });
                match r {
                    Ok(phases) => {
                        for (p, r) in phases.into_iter().enumerate() {
                            results[p][e].push(r);
                        }
                    }
                    Err(err) => {
                        for ph in &mut results {
                            ph[e].push(Err(err.clone()));
                        }
                    }
                }
            }
        }
        // Every round of every engine must find the same BFS result.
        let mut seen: Option<(&str, (u64, u64, u64))> = None;
        for by_engine in &results {
            for (name, rs) in engines.iter().zip(by_engine) {
                for m in rs.iter().flatten() {
                    let got = result_of(m);
                    match seen {
                        None => seen = Some((name, got)),
                        Some((first, want)) if want != got => {
                            return Err(EngineError(format!(
                                "the engines disagree on the BFS result (threads {threads}): {first} found (reached, max_depth, depth_sum) = {want:?}, {name} {got:?}"
                            )))
                        }
                        Some(_) => {}
                    }
                }
            }
        }
        for (phase, by_engine) in ["cold", "warm"].into_iter().zip(results) {
            let mut figures = Map::new();
            for (name, rs) in engines.iter().zip(by_engine) {
                figures.insert((*name).into(), median_round(rs, "seconds"));
            }
            let params = json!({
                "threads": threads,
                "page_size": csr_page,
                "pool_bytes": pool,
                "data_bytes": csr_bytes,
                "phase": phase,
                "vertices": graph.vertices,
                "edges": graph.edges,
                "index_space": graph.index_space,
                "generated_vertices": vertices,
                "degree": DEGREE,
                "max_degree": MAX_DEGREE,
                "seed": SEED,
                "source": SOURCE,
                "import_seconds": round_to(import_seconds, 3),
                "rounds": rounds,
            });
            let mut run = run_value(params.as_object().cloned().unwrap_or_default(), figures);
            run["results_agree"] = json!(seen.is_some());
            runs.push(run);
        }
    }
    ctx.notes.push(format!(
        "bfs: one operation = one BFS from vertex {SOURCE} of a generated graph ({} vertices, {} edges, out-degrees skewed with mean about {DEGREE}, destinations uniform, seed {SEED:#x}; CSR {} in pages of {}) through a pool of {}. cold = the first BFS after opening the database (its files dropped from the OS page cache), warm = a second BFS on the same open database. strata reads ahead as configured by default (detection of sequential misses; the BFS gives no hints); strata-noprefetch has no read-ahead at all. bytes_per_sec = CSR bytes / BFS seconds; bytes_read and pages_read are the BFS's reads, bytes_written its spilled temporary runs. Each engine ran {rounds} round(s) (fresh open each, engines in rotating order); its figures are those of its median round by seconds (rounds_seconds lists every round); every round of every engine found the same (reached, max_depth, depth_sum), or the benchmark fails.",
        graph.vertices,
        graph.edges,
        short_size(csr_bytes),
        short_size(csr_page),
        short_size(pool)
    ));
    Ok(runs)
}
