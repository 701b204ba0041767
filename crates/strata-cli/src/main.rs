//! The `strata` command-line tool. The contract it implements is documented in
//! `docs/cli.md`; errors print one line on stderr and exit non-zero.

mod bench_cmd;
mod cmd;
mod gen;
mod graph_cmd;
mod inspect_cmd;
mod progress;
mod query_out;
mod remote_args;
mod shell_cmd;
mod soak_cmd;
mod sql_cmd;
mod table_cmd;
mod torture_cmd;
mod tpch;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// strata: a storage engine with variable-size pages in one memory budget.
#[derive(Parser)]
#[command(name = "strata", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Create a new database in DIR (refuses an existing one).
    Create {
        dir: PathBuf,
        /// Smallest page size (power of two, at least 4KiB).
        #[arg(long, default_value = "64KiB", value_parser = parse_size)]
        min_page: u64,
    },
    /// Append the values of a raw little-endian file to COLUMN (created if absent).
    Import {
        dir: PathBuf,
        column: String,
        /// File to read values from.
        #[arg(long)]
        from: PathBuf,
        /// Value encoding: u32le, u64le or i64le.
        #[arg(long)]
        format: String,
        /// Buffer pool size.
        #[arg(long, default_value = "64MiB", value_parser = parse_size)]
        pool: u64,
        /// Print one JSON object instead of text and progress.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        cleaner: CleanerArgs,
    },
    /// Load a directed graph from a SNAP text edge list (`u v` lines, `#` comments) into GRAPH.
    ImportEdges {
        dir: PathBuf,
        graph: String,
        /// Edge list to read.
        #[arg(long)]
        from: PathBuf,
        /// Buffer pool size.
        #[arg(long, default_value = "64MiB", value_parser = parse_size)]
        pool: u64,
        /// Print one JSON object instead of text and progress.
        #[arg(long)]
        json: bool,
    },
    /// Import a CSV file into TABLE (created if absent; appended to if present, with the
    /// same columns). Every row is checked before any is written.
    ImportCsv(table_cmd::ImportCsvArgs),
    /// Import the eight TPC-H tables from CSVDIR/TABLE.csv (as `gen tpch` writes them), each
    /// with its fixed schema (keys and sizes i64, decimals f64, dates date, text str), into
    /// DIR (created if absent).
    ImportTpch {
        dir: PathBuf,
        /// The directory with region.csv, nation.csv, ..., lineitem.csv.
        #[arg(long)]
        from: PathBuf,
        /// Buffer pool size.
        #[arg(long, default_value = "64MiB", value_parser = parse_size)]
        pool: u64,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Import a Parquet file into TABLE (created if absent; appended to if present).
    ImportParquet(table_cmd::ImportParquetArgs),
    /// Export TABLE as CSV (header, `,`, RFC 4180 quoting, NULL as an empty field).
    Export(table_cmd::ExportArgs),
    /// Verify everything: allocation table, every page's checksum, structures.
    Check {
        dir: PathBuf,
        #[arg(long, default_value = "64MiB", value_parser = parse_size)]
        pool: u64,
        #[arg(long)]
        json: bool,
    },
    /// Sizes per size class, pages allocated, file sizes.
    Stats {
        dir: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Recover DIR after a crash (replay and roll back the log), checkpoint and close.
    Recover {
        dir: PathBuf,
        /// Buffer pool size.
        #[arg(long, default_value = "64MiB", value_parser = parse_size)]
        pool: u64,
        #[arg(long)]
        json: bool,
    },
    /// Inspect the files of a database without changing them.
    Dump {
        #[command(subcommand)]
        what: inspect_cmd::DumpCmd,
    },
    /// Run a query.
    Query {
        dir: PathBuf,
        /// Buffer pool size.
        #[arg(long, value_parser = parse_size)]
        pool: u64,
        /// Worker threads.
        #[arg(long, default_value_t = 1)]
        threads: usize,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        cleaner: CleanerArgs,
        #[command(flatten)]
        remote: remote_args::RemoteArgs,
        #[command(subcommand)]
        op: cmd::QueryOp,
    },
    /// Run one SQL query (SELECT or EXPLAIN) over the tables; rows stream to stdout.
    Sql(sql_cmd::SqlArgs),
    /// An interactive SQL shell (line editing, history, `.tables`, `.schema`, `.timer`);
    /// reads the statements from stdin when it is not a terminal.
    Shell(shell_cmd::ShellArgs),
    /// Generate input data.
    Gen {
        #[command(subcommand)]
        what: gen::GenCmd,
    },
    /// Benchmark strata against baselines measured in the same run: fix, random-read, scan,
    /// mixed-size (hashpool, static-split, mmap, raw), commit and recovery (durability
    /// settings), remote (with and without the Valkey/Redis tier), btree (key-value
    /// workloads: redb, LMDB, BTreeMap).
    Bench(bench_cmd::BenchArgs),
    /// One engine's share of a benchmark, in a process of its own (started by `strata bench`).
    #[command(name = "bench-child", hide = true)]
    BenchChild {
        /// The benchmark.
        name: String,
        /// What to run (JSON).
        spec: String,
    },
    /// Build a small database several times larger than a small pool and run every query.
    Demo {
        /// Where to build it (a previous demo database there is replaced).
        #[arg(long, default_value = "demo-db")]
        dir: PathBuf,
        /// Pool size for the queries (default 8 MiB; 16 MiB with --tpch).
        #[arg(long, value_parser = parse_size)]
        pool: Option<u64>,
        /// Number of values to generate.
        #[arg(long, default_value_t = 8_000_000)]
        count: u64,
        /// Instead: generate TPC-H at scale factor --sf, import it through the pool and run
        /// TPC-H Q1, Q3, Q5, Q6, Q10, Q12, Q14 and Q19 in SQL.
        #[arg(long)]
        tpch: bool,
        /// The TPC-H scale factor of --tpch.
        #[arg(long, default_value_t = 0.1, requires = "tpch")]
        sf: f64,
    },
    /// Crash-consistency torture: concurrent bank transfers to kill at any moment, and the
    /// check of what survived.
    Torture {
        #[command(subcommand)]
        what: torture_cmd::TortureCmd,
    },
}

fn parse_size(s: &str) -> Result<u64, String> {
    strata::util::parse_size(s).ok_or_else(|| format!("invalid size {s:?} (examples: 4096, 64KiB, 64MiB, 1GiB)"))
}

/// The background cleaner's switches (`import`, `query`): it writes dirty pages (imported
/// pages, spilled operator state) just ahead of the clock, so that evictions find clean
/// victims.
#[derive(clap::Args, Debug)]
struct CleanerArgs {
    /// Run the background cleaner (the default; kept for compatibility).
    #[arg(long, conflicts_with = "no_cleaner")]
    cleaner: bool,
    /// Do not run the background cleaner (evictions then write dirty victims themselves).
    #[arg(long)]
    no_cleaner: bool,
}

fn main() -> ExitCode {
    // Keep glibc from reserving a 64 MiB arena per thread: the process should stay close to
    // its pool in both resident and virtual memory.
    // SAFETY: mallopt only tunes the allocator; called before any thread is spawned.
    unsafe { libc_mallopt() };
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => {
            // --help / --version
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            // One line on stderr, as for every other error.
            let msg = e.to_string();
            eprintln!("{}", msg.lines().find(|l| !l.trim().is_empty()).unwrap_or("error: invalid arguments"));
            return ExitCode::from(2);
        }
    };
    let r = match cli.command {
        Command::Create { dir, min_page } => cmd::create(&dir, min_page),
        Command::Import { dir, column, from, format, pool, json, cleaner } => {
            cmd::import(&column, &from, &format, cmd::config(&dir, pool, !cleaner.no_cleaner), json)
        }
        Command::ImportEdges { dir, graph, from, pool, json } => graph_cmd::import_edges(&dir, &graph, &from, pool, json),
        Command::ImportCsv(a) => table_cmd::import_csv(a),
        Command::ImportTpch { dir, from, pool, json } => tpch::import_cmd(&dir, &from, pool, json),
        Command::ImportParquet(a) => table_cmd::import_parquet(a),
        Command::Export(a) => table_cmd::export(a),
        Command::Check { dir, pool, json } => cmd::check(&dir, pool, json),
        Command::Stats { dir, json } => cmd::stats(&dir, json),
        Command::Recover { dir, pool, json } => inspect_cmd::recover(&dir, pool, json),
        Command::Dump { what } => inspect_cmd::dump(what),
        Command::Query { dir, pool, threads, json, cleaner, remote, op } => {
            cmd::query(cmd::config(&dir, pool, !cleaner.no_cleaner), threads, json, &remote, op)
        }
        Command::Sql(a) => sql_cmd::sql(a),
        Command::Shell(a) => shell_cmd::shell(a),
        Command::Bench(args) => bench_cmd::bench(args),
        Command::BenchChild { name, spec } => bench_cmd::bench_child(&name, &spec),
        Command::Gen { what } => gen::run(what),
        Command::Demo { dir, pool, count, tpch: false, .. } => cmd::demo(&dir, pool.unwrap_or(8 << 20), count),
        Command::Demo { dir, pool, tpch: true, sf, .. } => tpch::demo(&dir, pool.unwrap_or(16 << 20), sf),
        Command::Torture { what } => torture_cmd::run(what),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// # Safety
/// Must be called before other threads exist.
unsafe fn libc_mallopt() {
    extern "C" {
        fn mallopt(param: i32, value: i32) -> i32;
    }
    const M_ARENA_MAX: i32 = -8;
    // SAFETY: glibc's mallopt with a documented parameter; forwarded contract.
    unsafe { mallopt(M_ARENA_MAX, 2) };
}
