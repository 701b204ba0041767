//! The subcommands that work on a database.

use std::cell::RefCell;
use std::fs::File;
use std::io::BufReader;
use std::path::Path;
use std::time::Instant;

use clap::Subcommand;
use serde::Serialize;
use strata::access::ValueFormat;
use strata::ops::{bfs, distinct, groupby_mod_counts, join_count, scan_gt, sort_column_stream, ScanResult};
use strata::util::Bytes;
use strata::{Config, Database, Error};

use crate::progress;
use crate::query_out::{print_query_json, Body, CountsOut, Outcome, SortedOut};

/// A query operation.
#[derive(Subcommand, Clone)]
pub enum QueryOp {
    /// Count and sum the values of COLUMN greater than X.
    Scan {
        column: String,
        #[arg(long, allow_negative_numbers = true)]
        gt: i128,
    },
    /// Sort COLUMN completely (ascending): its K smallest and largest values and a checksum.
    Sort {
        column: String,
        #[arg(long, default_value_t = 10)]
        top: usize,
    },
    /// Breadth-first search over GRAPH from vertex V: reached vertices and hop distances.
    Bfs {
        graph: String,
        #[arg(long)]
        source: u64,
    },
    /// Count the values of COLUMN per remainder modulo M (non-negative remainder).
    Groupby {
        column: String,
        #[arg(long = "mod")]
        modulus: u64,
    },
    /// Group COLUMN by value: number of distinct values and the most frequent one.
    Distinct { column: String },
    /// Equi-join COLUMN_A and COLUMN_B on value: matching pairs and the sum of matched values.
    Join { column_a: String, column_b: String },
    /// Row N of TABLE (0-based, in insertion order).
    Get {
        table: String,
        #[arg(long)]
        row: u64,
    },
    /// The number of rows of TABLE.
    Rows { table: String },
}

/// The JSON object of `query ... get` (contract: `{"row": {"col": value, ...}}`).
#[derive(Serialize)]
struct GetOut<'a> {
    op: &'static str,
    table: &'a str,
    row_id: u64,
    row: crate::table_cmd::RowJson<'a>,
    seconds: f64,
    pool_bytes: u64,
    peak_resident_bytes: u64,
    peak_rss_bytes: Option<u64>,
}

/// Row `id` of `table`, or an error naming how many rows it has.
fn table_row(db: &Database, table: &str, id: u64) -> Result<(strata::access::table::Table, Vec<strata::access::table::Value>), Error> {
    let t = db.table(table)?;
    match t.get(db.buffer(), id)? {
        Some(r) => Ok((t, r)),
        None => Err(Error::InvalidInput(format!("table {table:?} has {} rows: there is no row {id} (rows are numbered from 0)", t.rows(db.buffer())?))),
    }
}

/// The fields of a query's JSON object (contract: docs/cli.md) after `op` and `result`,
/// which are written first (a result may be streamed; see [`print_query_json`]).
#[derive(Serialize)]
struct QueryTail {
    seconds: f64,
    pool_bytes: u64,
    peak_resident_bytes: u64,
    bytes_read: u64,
    bytes_written: u64,
    threads: usize,
    /// The whole process's peak resident set size (VmHWM), for checking the memory cap.
    peak_rss_bytes: Option<u64>,
    /// The remote tier's counters, with `--remote`.
    #[serde(skip_serializing_if = "Option::is_none")]
    remote: Option<strata::buffer::RemoteStats>,
    /// How the pages reached the device.
    io: IoOutput,
}

/// The `"io"` object of a query's JSON: requests, coalescing, queue depths, prefetch use.
#[derive(Serialize)]
struct IoOutput {
    backend: String,
    read_requests: u64,
    pages_read: u64,
    pages_prefetched: u64,
    prefetch_hits: u64,
    prefetch_wasted: u64,
    read_queue_depth: Vec<strata::buffer::Bucket>,
    read_request_bytes: Vec<strata::buffer::Bucket>,
    write_requests: u64,
    pages_written: u64,
    write_queue_depth: Vec<strata::buffer::Bucket>,
    write_request_bytes: Vec<strata::buffer::Bucket>,
    sequential_windows: u64,
    dirty_victims: u64,
    pages_cleaned: u64,
    madvise_failures: u64,
    frame_recycling: String,
    frames_recycled: u64,
    frame_moves_failed: u64,
    stashed_bytes: u64,
    ring_pages: u64,
    ring_hits: u64,
    ring_bytes: u64,
    ring_threads_started: u64,
}

impl IoOutput {
    fn of(st: &strata::buffer::Stats) -> IoOutput {
        IoOutput {
            backend: st.io.backend.clone(),
            read_requests: st.read_requests,
            pages_read: st.pages_read,
            pages_prefetched: st.pages_prefetched,
            prefetch_hits: st.prefetch_hits,
            prefetch_wasted: st.prefetch_wasted,
            read_queue_depth: st.io.read_queue_depth.clone(),
            read_request_bytes: st.io.read_request_bytes.clone(),
            write_requests: st.write_requests,
            pages_written: st.pages_written,
            write_queue_depth: st.io.write_queue_depth.clone(),
            write_request_bytes: st.io.write_request_bytes.clone(),
            sequential_windows: st.sequential_windows,
            dirty_victims: st.dirty_victims,
            pages_cleaned: st.pages_cleaned,
            madvise_failures: st.madvise_failures,
            frame_recycling: st.frame_recycling.clone(),
            frames_recycled: st.frames_recycled,
            frame_moves_failed: st.frame_moves_failed,
            stashed_bytes: st.stashed_bytes,
            ring_pages: st.ring_pages,
            ring_hits: st.ring_hits,
            ring_bytes: st.ring_bytes,
            ring_threads_started: st.ring_threads_started,
        }
    }
}

pub fn print_json<T: Serialize>(v: &T) -> Result<(), Error> {
    let s = serde_json::to_string(v).map_err(|e| Error::InvalidInput(format!("cannot encode output: {e}")))?;
    println!("{s}");
    Ok(())
}

fn warn_if_buffered(db: &Database, json: bool) {
    let st = db.buffer().stats();
    if !st.direct_io && !st.classes.is_empty() && !json {
        eprintln!("warning: the filesystem refused O_DIRECT; using buffered I/O (the OS page cache may hold extra copies)");
    }
}

pub fn create(dir: &Path, min_page: u64) -> Result<(), Error> {
    let db = Database::create(Config::new(dir).min_page(min_page).pool_size(min_page.max(1 << 20) * 4))?;
    db.close()?;
    println!("created database {} (smallest page {})", dir.display(), Bytes(min_page));
    Ok(())
}

/// The configuration of a command that opens `dir` with a pool of `pool` bytes, with a
/// background cleaner unless `cleaner` is false (`--no-cleaner`): commands that write or
/// spill run one by default, so that a thread that needs memory finds clean victims.
pub fn config(dir: &Path, pool: u64, cleaner: bool) -> Config {
    let c = Config::new(dir).pool_size(pool);
    if cleaner {
        c.cleaner(strata::buffer::CleanerOptions::default())
    } else {
        c
    }
}

pub fn import(column: &str, from: &Path, format: &str, config: Config, json: bool) -> Result<(), Error> {
    let pool = config.pool();
    let format = ValueFormat::parse(format).ok_or_else(|| Error::InvalidInput(format!("unknown format {format:?}: use u32le, u64le or i64le")))?;
    let file = File::open(from).map_err(|e| Error::io("open", from, e))?;
    let len = file.metadata().map_err(|e| Error::io("stat", from, e))?.len();
    if len % format.width() as u64 != 0 {
        return Err(Error::InvalidInput(format!(
            "{} is {len} bytes, not a multiple of the {}-byte width of {}",
            from.display(),
            format.width(),
            format.name()
        )));
    }
    let db = Database::open(config)?;
    warn_if_buffered(&db, json);
    let start = Instant::now();
    let pb = progress::bytes(len, "importing", json);
    let mut reader = BufReader::with_capacity(1 << 20, file);
    let col = db.import(column, format, &mut reader, len, &mut |done| pb.set_position(done))?;
    pb.finish_and_clear();
    let st = db.buffer().stats();
    db.close()?;
    let seconds = start.elapsed().as_secs_f64();
    if json {
        print_json(&serde_json::json!({
            "op": "import", "column": column, "values": len / format.width() as u64,
            "column_values": col.count, "pages": col.pages.len(), "seconds": seconds,
            "pool_bytes": pool, "peak_resident_bytes": st.peak_resident_bytes,
            "bytes_read": st.bytes_read, "bytes_written": st.bytes_written,
            "peak_rss_bytes": strata::util::peak_rss_bytes(),
        }))
    } else {
        println!("imported {} values into {column} ({} values in {} pages) in {seconds:.2} s", len / format.width() as u64, col.count, col.pages.len());
        Ok(())
    }
}

pub fn check(dir: &Path, pool: u64, json: bool) -> Result<(), Error> {
    // Read-only: never recovers, checkpoints or writes (docs/cli.md, "Inspection").
    let db = Database::open_read_only(crate::inspect_cmd::read_only_config(dir, Some(pool))?)?;
    let report = db.check()?;
    if json {
        print_json(&serde_json::json!({"ok": true, "report": report}))?;
    } else {
        println!(
            "ok: {} pages verified, {} columns, {} graphs, {} tables and {} key-value trees consistent{}",
            report.pages_verified,
            report.columns,
            report.graphs,
            report.tables.len(),
            report.trees.len(),
            if report.unreferenced_pages > 0 {
                format!(", {} unreferenced pages (from an interrupted import; harmless)", report.unreferenced_pages)
            } else {
                String::new()
            }
        );
    }
    Ok(())
}

pub fn stats(dir: &Path, json: bool) -> Result<(), Error> {
    let db = Database::open_read_only(crate::inspect_cmd::read_only_config(dir, None)?)?;
    let st = db.buffer().stats();
    let catalog = db.catalog();
    if json {
        let columns: serde_json::Map<String, serde_json::Value> = catalog
            .columns
            .iter()
            .map(|(n, c)| (n.clone(), serde_json::json!({"format": c.format.name(), "values": c.count, "pages": c.pages.len()})))
            .collect();
        let classes: Vec<_> = st
            .classes
            .iter()
            .map(|c| {
                serde_json::json!({"class": c.class, "page_size": c.page_size, "pages_allocated": c.allocated_pages,
                "bytes_allocated": c.allocated_pages * c.page_size, "file_bytes": c.file_bytes})
            })
            .collect();
        let mut tables = serde_json::Map::new();
        for (name, t) in &catalog.tables {
            let r = t.shape(db.buffer())?;
            tables.insert(
                name.clone(),
                serde_json::json!({"rows": r.entries, "schema": t.schema.to_spec(), "height": r.height, "inner_nodes": r.inner_nodes,
                "leaves_per_class": r.leaves_per_class, "bytes": r.bytes}),
            );
        }
        let mut trees = serde_json::Map::new();
        for (name, t) in &catalog.trees {
            let r = t.shape(db.buffer())?;
            trees.insert(
                name.clone(),
                serde_json::json!({"height": r.height, "inner_nodes": r.inner_nodes, "leaves_per_class": r.leaves_per_class, "bytes": r.bytes}),
            );
        }
        return print_json(&serde_json::json!({
            "tables": tables,
            "trees": trees,
            "min_page": db.buffer().classes().min_page(),
            "classes": classes,
            "pages_allocated": st.classes.iter().map(|c| c.allocated_pages).sum::<u64>(),
            "total_pages_allocated": st.classes.iter().map(|c| c.allocated_pages).sum::<u64>(),
            "total_file_bytes": st.classes.iter().map(|c| c.file_bytes).sum::<u64>(),
            "columns": columns,
            "graphs": catalog.graphs.iter().map(|(n, g)| (n.clone(), serde_json::json!({"vertices": g.vertices, "edges": g.edges,
                "index_space": g.index_space, "renumbered": g.renumbered, "pages": g.pages().count()}))).collect::<serde_json::Map<_, _>>(),
        }));
    }
    println!("database {} (smallest page {})", dir.display(), Bytes(db.buffer().classes().min_page()));
    println!("{:>5}  {:>10}  {:>12}  {:>12}", "class", "page size", "pages", "file size");
    for c in &st.classes {
        println!("{:>5}  {:>10}  {:>12}  {:>12}", c.class, Bytes(c.page_size).to_string(), c.allocated_pages, Bytes(c.file_bytes).to_string());
    }
    for (name, c) in &catalog.columns {
        println!("column {name}: {} {} values in {} pages", c.count, c.format.name(), c.pages.len());
    }
    for (name, g) in &catalog.graphs {
        println!("graph {name}: {} vertices, {} edges in {} pages", g.vertices, g.edges, g.pages().count());
    }
    let classes = db.buffer().classes();
    let leaves = |per_class: &[u64]| {
        let parts: Vec<String> =
            per_class.iter().enumerate().filter(|(_, &n)| n > 0).map(|(c, n)| format!("{n} of {}", Bytes(classes.page_size(c as u8)))).collect();
        if parts.is_empty() {
            "none".to_string()
        } else {
            parts.join(", ")
        }
    };
    for (name, t) in &catalog.tables {
        let r = t.shape(db.buffer())?;
        println!(
            "table {name}: {} rows ({}), tree height {}, {} inner nodes, leaves {}, {}",
            r.entries,
            t.schema.to_spec(),
            r.height,
            r.inner_nodes,
            leaves(&r.leaves_per_class),
            Bytes(r.bytes)
        );
    }
    for (name, t) in &catalog.trees {
        let r = t.shape(db.buffer())?;
        println!("tree {name}: height {}, {} inner nodes, leaves {}, {}", r.height, r.inner_nodes, leaves(&r.leaves_per_class), Bytes(r.bytes));
    }
    Ok(())
}

fn to_json<'a, T: Serialize>(v: &T) -> Result<Body<'a>, Error> {
    serde_json::to_value(v).map(Body::Value).map_err(|e| Error::InvalidInput(format!("cannot encode result: {e}")))
}

/// Runs one query operation.
fn run_query<'a>(db: &'a Database, op: &QueryOp, threads: usize) -> Result<Outcome<'a>, Error> {
    match op {
        QueryOp::Scan { column, gt } => {
            let col = db.column(column)?;
            let r: ScanResult = scan_gt(db.buffer(), &col, *gt, threads)?;
            Ok(Outcome { op: "scan", result: to_json(&r)?, text: Some(format!("count {} sum {}", r.count, r.sum)) })
        }
        QueryOp::Sort { column, top } => {
            let col = db.column(column)?;
            let stream = sort_column_stream(db.buffer(), &col, *top, threads)?;
            Ok(Outcome { op: "sort", result: Body::Sorted(Box::new(RefCell::new(SortedOut { stream, failed: None }))), text: None })
        }
        QueryOp::Bfs { graph, source } => {
            let g = db.graph(graph)?;
            let r = bfs(db.buffer(), &g, *source, threads)?;
            let text = format!("reached {} max_depth {} depth_sum {}", r.reached, r.max_depth, r.depth_sum);
            Ok(Outcome { op: "bfs", result: to_json(&r)?, text: Some(text) })
        }
        QueryOp::Groupby { column, modulus } => {
            if *modulus == 0 {
                return Err(Error::InvalidInput("--mod must be at least 1 (remainders modulo 0 are undefined)".into()));
            }
            let col = db.column(column)?;
            let counts = CountsOut::new(groupby_mod_counts(db.buffer(), &col, *modulus, threads)?)?;
            Ok(Outcome { op: "groupby", result: Body::Counts(Box::new(RefCell::new(counts))), text: None })
        }
        QueryOp::Distinct { column } => {
            let col = db.column(column)?;
            let r = distinct(db.buffer(), &col, threads)?;
            let top = r.top_value.map_or_else(|| "none".to_string(), |v| v.to_string());
            let text = format!("groups {} top_value {top} top_count {}", r.groups, r.top_count);
            Ok(Outcome { op: "distinct", result: to_json(&r)?, text: Some(text) })
        }
        QueryOp::Join { column_a, column_b } => {
            let a = db.column(column_a)?;
            let b = db.column(column_b)?;
            let r = join_count(db.buffer(), &a, &b, threads)?;
            Ok(Outcome { op: "join", result: to_json(&r)?, text: Some(format!("matches {} checksum {}", r.matches, r.checksum)) })
        }
        QueryOp::Get { table, row } => {
            let (t, r) = table_row(db, table, *row)?;
            let text = crate::table_cmd::row_text(&t.schema, &r);
            Ok(Outcome { op: "get", result: Body::Value(serde_json::Value::Null), text: Some(text) })
        }
        QueryOp::Rows { table } => {
            let n = db.table(table)?.rows(db.buffer())?;
            Ok(Outcome { op: "rows", result: to_json(&n)?, text: Some(format!("{n} rows")) })
        }
    }
}

pub fn query(config: Config, threads: usize, json: bool, remote: &crate::remote_args::RemoteArgs, op: QueryOp) -> Result<(), Error> {
    if threads == 0 {
        return Err(Error::InvalidInput("--threads must be at least 1".into()));
    }
    let pool = config.pool();
    let db = Database::open(remote.apply(config)?)?;
    warn_if_buffered(&db, json);
    let start = Instant::now();
    if json {
        // The table queries' objects (contract: `{"row": {...}}`, `{"rows": n}`).
        let tail = || (start.elapsed().as_secs_f64(), db.buffer().stats().peak_resident_bytes, strata::util::peak_rss_bytes());
        match &op {
            QueryOp::Get { table, row } => {
                let (t, r) = table_row(&db, table, *row)?;
                let (seconds, peak_resident_bytes, peak_rss_bytes) = tail();
                let row_json = crate::table_cmd::RowJson { schema: &t.schema, row: &r };
                print_json(&GetOut { op: "get", table, row_id: *row, row: row_json, seconds, pool_bytes: pool, peak_resident_bytes, peak_rss_bytes })?;
                return db.close();
            }
            QueryOp::Rows { table } => {
                let n = db.table(table)?.rows(db.buffer())?;
                let (seconds, peak_resident_bytes, peak_rss_bytes) = tail();
                print_json(&serde_json::json!({"op": "rows", "table": table, "rows": n, "seconds": seconds, "pool_bytes": pool,
                    "peak_resident_bytes": peak_resident_bytes, "peak_rss_bytes": peak_rss_bytes}))?;
                return db.close();
            }
            _ => {}
        }
    }
    // The outcome (a groupby's merge latches temporary pages) ends before the database.
    {
        let outcome = run_query(&db, &op, threads)?;
        if json {
            print_query_json(outcome.op, &outcome.result, || {
                let st = db.buffer().stats();
                QueryTail {
                    seconds: start.elapsed().as_secs_f64(),
                    pool_bytes: pool,
                    peak_resident_bytes: st.peak_resident_bytes,
                    bytes_read: st.bytes_read,
                    bytes_written: st.bytes_written,
                    threads,
                    peak_rss_bytes: strata::util::peak_rss_bytes(),
                    io: IoOutput::of(&st),
                    remote: st.remote,
                }
            })?;
        } else {
            let name = outcome.op;
            let text = outcome.into_text()?;
            let seconds = start.elapsed().as_secs_f64();
            let st = db.buffer().stats();
            println!("{name}: {text} ({seconds:.3} s, peak resident {} of {} pool, read {})", Bytes(st.peak_resident_bytes), Bytes(pool), Bytes(st.bytes_read));
            if let Some(r) = st.remote {
                println!("remote tier: {r}");
            }
        }
    }
    db.close()
}

/// Replaces the demo directory `dir` (only one that a demo made) with an empty one.
pub fn fresh_demo_dir(dir: &Path) -> Result<(), Error> {
    if dir.exists() {
        if !dir.join("STRATA-DEMO").exists() {
            return Err(Error::AlreadyExists { path: dir.to_owned() });
        }
        std::fs::remove_dir_all(dir).map_err(|e| Error::io("remove", dir, e))?;
    }
    std::fs::create_dir_all(dir).map_err(|e| Error::io("create directory", dir, e))?;
    std::fs::write(dir.join("STRATA-DEMO"), b"built by `strata demo`; replaced by the next demo run\n").map_err(|e| Error::io("write", dir, e))
}

pub fn demo(dir: &Path, pool: u64, count: u64) -> Result<(), Error> {
    fresh_demo_dir(dir)?;
    // Generated inputs live beside the database, which is db/.
    let db_dir = dir.join("db");
    let half = (count / 2).max(1);
    let (v, a, b, edges) = (dir.join("v.u32"), dir.join("a.u32"), dir.join("b.u32"), dir.join("rmat.txt"));
    println!("strata demo: {count} pseudo-random u32 values ({}), two join columns of {half}, an R-MAT graph; pool {}", Bytes(count * 4), Bytes(pool));
    crate::gen::ints(count, 42, &v, "u32le", None)?;
    // Join columns drawn from a range of `count` values, so that there are matches.
    crate::gen::ints(half, 43, &a, "u32le", Some(count.clamp(1, u32::MAX as u64)))?;
    crate::gen::ints(half, 44, &b, "u32le", Some(count.clamp(1, u32::MAX as u64)))?;
    crate::gen::rmat(16, 16, 45, &edges)?;
    Database::create(Config::new(&db_dir).min_page(64 << 10).pool_size(pool))?.close()?;
    let t = Instant::now();
    for (name, file) in [("v", &v), ("a", &a), ("b", &b)] {
        import(name, file, "u32le", Config::new(&db_dir).pool_size(pool), false)?;
    }
    crate::graph_cmd::import_edges(&db_dir, "g", &edges, pool, false)?;
    let import_s = t.elapsed().as_secs_f64();
    let db = Database::open(Config::new(&db_dir).pool_size(pool))?;
    let data: u64 = db.buffer().stats().classes.iter().map(|c| c.file_bytes).sum();
    println!("imported in {import_s:.2} s: database {} on disk, {:.1}x the pool\n", Bytes(data), data as f64 / pool as f64);
    let threads = 2;
    let queries = [
        QueryOp::Scan { column: "v".into(), gt: 1 << 31 },
        QueryOp::Groupby { column: "v".into(), modulus: 256 },
        QueryOp::Distinct { column: "v".into() },
        QueryOp::Sort { column: "v".into(), top: 3 },
        QueryOp::Join { column_a: "a".into(), column_b: "b".into() },
        QueryOp::Bfs { graph: "g".into(), source: 0 },
    ];
    println!("{:<10} {:>8}  result ({threads} threads)", "query", "seconds");
    for q in &queries {
        let t = Instant::now();
        let out = run_query(&db, q, threads)?;
        let op = out.op;
        let mut text = out.into_text()?;
        if text.len() > 100 {
            text.truncate(97);
            text.push_str("...");
        }
        println!("{op:<10} {:>8.3}  {text}", t.elapsed().as_secs_f64());
    }
    let st = db.buffer().stats();
    println!();
    println!(
        "buffer manager: peak resident {} of a {} pool ({:.0}%), hits {}, misses {}, evictions {}, read {}, written {} (spills), direct I/O: {}",
        Bytes(st.peak_resident_bytes),
        Bytes(st.pool_bytes),
        100.0 * st.peak_resident_bytes as f64 / st.pool_bytes as f64,
        st.hits,
        st.misses,
        st.evictions,
        Bytes(st.bytes_read),
        Bytes(st.bytes_written),
        st.direct_io
    );
    if let Some(rss) = strata::util::peak_rss_bytes() {
        println!("process peak RSS (VmHWM): {}", Bytes(rss));
    }
    let report = db.check()?;
    println!("check: {} pages verified, {} columns, {} graphs", report.pages_verified, report.columns, report.graphs);
    db.close()
}
