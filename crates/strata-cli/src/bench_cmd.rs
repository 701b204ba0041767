//! `strata bench NAME [--json] [--plot FILE.png] [options]`: the benchmark harness of the
//! `strata-bench` crate (strata against its baselines, measured in the same run).

use std::path::PathBuf;

use clap::Args;
use strata::Error;

/// Arguments of `strata bench`.
#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Benchmark: fix, random-read, scan, mixed-size, commit, recovery, remote, btree,
    /// partitions or bfs.
    pub name: String,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Also draw the throughputs as a PNG chart.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Thread counts, comma-separated (default: 1, 2, 4, ... up to the core count).
    #[arg(long, value_delimiter = ',')]
    pub threads: Option<Vec<usize>>,
    /// Memory budget of the cached engines (default per benchmark, 32MiB for most).
    #[arg(long, value_parser = crate::parse_size)]
    pub pool: Option<u64>,
    /// Data set size (random-read: the out-of-memory data set; bfs: the graph's CSR, about;
    /// default 4x the pool).
    #[arg(long, value_parser = crate::parse_size)]
    pub data: Option<u64>,
    /// Seconds per measurement.
    #[arg(long)]
    pub seconds: Option<f64>,
    /// Operations per thread per measurement instead of a duration (scan: morsels).
    #[arg(long)]
    pub ops: Option<u64>,
    /// Directory for the data files (a scratch directory is made in it and removed after).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Page sizes, comma-separated (fix, scan, commit, recovery, remote: one; random-read: several; mixed-size: small,large).
    #[arg(long = "page-size", value_delimiter = ',', value_parser = crate::parse_size)]
    pub page_size: Option<Vec<u64>>,
    /// random-read: total reads in flight (default: the thread count). Larger than the thread
    /// count, each thread reads batches of queue-depth/threads random pages at once (raw:
    /// io_uring; strata: one batch load; the other engines read a batch page by page).
    #[arg(long = "queue-depth")]
    pub queue_depth: Option<usize>,
    /// random-read, scan, btree, bfs: only these engines, comma-separated (default: all of them;
    /// ratios need strata and the baseline).
    #[arg(long = "engines", value_delimiter = ',')]
    pub engines: Option<Vec<String>>,
    /// random-read, btree: only the in-memory (in) or only the out-of-memory (out) data set.
    #[arg(long = "memory")]
    pub memory: Option<String>,
    /// scan, random-read, btree, bfs: rounds per engine (fresh engine each, engines
    /// alternating); the median round is reported (default: scan and bfs 3, others 1).
    #[arg(long = "rounds")]
    pub rounds: Option<usize>,
    /// remote: the Valkey/Redis server of the remote tier (redis://[USER:PASSWORD@]HOST:PORT,
    /// unix:///PATH or redis+cluster://...; default: a private valkey-server or redis-server
    /// started on a unix socket and stopped afterwards).
    #[arg(long)]
    pub remote: Option<String>,
    /// partitions: resident-set partition counts to compare, comma-separated (default
    /// 1,2,4,8; each a power of two from 1 to 64).
    #[arg(long, value_delimiter = ',')]
    pub partitions: Option<Vec<usize>>,
}

/// Runs a benchmark and prints its report (JSON or a table), optionally plotting it.
pub fn bench(a: BenchArgs) -> Result<(), Error> {
    if let Some(sizes) = &a.page_size {
        if let Some(bad) = sizes.iter().find(|s| !s.is_power_of_two() || **s < 4096) {
            return Err(Error::InvalidInput(format!("--page-size {bad} is not a power of two of at least 4KiB")));
        }
    }
    let opts = strata_bench::Options {
        threads: a.threads,
        pool: a.pool,
        data: a.data,
        seconds: a.seconds,
        ops: a.ops,
        dir: a.dir,
        page_sizes: a.page_size,
        progress: !a.json,
        remote: a.remote,
        queue_depth: a.queue_depth,
        engines: a.engines,
        memory: a.memory,
        rounds: a.rounds,
        // btree runs each engine in a child process of this binary (`bench-child`), so that
        // each engine's peak RSS is its own.
        child_exe: std::env::current_exe().ok(),
        partitions: a.partitions,
    };
    let report = strata_bench::run(&a.name, &opts).map_err(Error::InvalidInput)?;
    if let Some(path) = &a.plot {
        if a.name == "partitions" {
            strata_bench::plot::plot_partitions(&report, path).map_err(Error::InvalidInput)?;
        } else if a.name == "bfs" {
            strata_bench::plot::plot_bfs(&report, path).map_err(Error::InvalidInput)?;
        } else {
            strata_bench::plot::plot(&report, path).map_err(Error::InvalidInput)?;
        }
        if a.name == "mixed-size" {
            strata_bench::plot::plot_memory(&report, &memory_plot_path(path)).map_err(Error::InvalidInput)?;
        }
    }
    if a.json {
        println!("{report}");
    } else {
        print!("{}", strata_bench::benchmarks::text_summary(&report));
        if let Some(path) = &a.plot {
            println!("plot written to {}", path.display());
            if a.name == "mixed-size" {
                println!("memory timeline written to {}", memory_plot_path(path).display());
            }
        }
    }
    Ok(())
}

/// `strata bench-child NAME SPEC` (hidden): one engine's share of benchmark NAME, run by the
/// benchmark in a process of its own; prints one JSON object.
pub fn bench_child(name: &str, spec: &str) -> Result<(), Error> {
    let out = match name {
        "btree" => strata_bench::benchmarks::btree_child(spec).map_err(Error::InvalidInput)?,
        other => return Err(Error::InvalidInput(format!("no child side for benchmark {other:?}"))),
    };
    println!("{out}");
    Ok(())
}

/// Where `bench mixed-size --plot FILE.png` draws its memory timeline: FILE-memory.png.
fn memory_plot_path(plot: &std::path::Path) -> std::path::PathBuf {
    let stem = plot.file_stem().map_or_else(|| "plot".into(), |s| s.to_string_lossy().into_owned());
    plot.with_file_name(format!("{stem}-memory.png"))
}
