//! `strata torture run|verify`: the crash-consistency workload of [`strata::ops::torture`]
//! (contract: docs/cli.md). `run` prints `committed <seq>` for every acknowledged commit, in
//! increasing order, so that whoever kills it knows what must survive; `verify` recovers the
//! database and checks the bank.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use clap::Subcommand;
use strata::ops::torture::{self, Bank, Outcome, Rng, Verdict};
use strata::txn::DEFAULT_LOCK_WAIT;
use strata::{Config, Database, Error};

use crate::parse_size;

/// Initial balance of every account.
const INITIAL_BALANCE: u64 = 1000;

/// `strata torture ...`
#[derive(Subcommand)]
pub enum TortureCmd {
    /// Run concurrent bank transfers on DIR (created with 4 KiB pages if absent or empty,
    /// otherwise opened and recovered), printing `committed <seq>` after every commit.
    Run {
        dir: PathBuf,
        /// Buffer pool size.
        #[arg(long, default_value = "4MiB", value_parser = parse_size)]
        pool: u64,
        /// Accounts of a new bank (an existing bank keeps its own).
        #[arg(long, default_value_t = 1000)]
        accounts: u64,
        /// Worker threads (one transaction at a time each).
        #[arg(long, default_value_t = 4)]
        threads: usize,
        /// Seed of the workers' random choices.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Stop and close cleanly after this many seconds (default: run until killed).
        #[arg(long)]
        seconds: Option<f64>,
        /// Log volume after which a commit runs a checkpoint (small, so that kills also land
        /// inside checkpoints and log truncation).
        #[arg(long, default_value = "1MiB", value_parser = parse_size)]
        checkpoint_every: u64,
    },
    /// Recover DIR and check its bank: total conserved, scratch pages intact, no leaked page,
    /// and the last committed sequence number. Exits 1 when the bank is not consistent.
    Verify {
        dir: PathBuf,
        /// Buffer pool size.
        #[arg(long, default_value = "4MiB", value_parser = parse_size)]
        pool: u64,
        /// Print one JSON object (the verdict) instead of text.
        #[arg(long)]
        json: bool,
    },
}

pub fn run(cmd: TortureCmd) -> Result<(), Error> {
    match cmd {
        TortureCmd::Run { dir, pool, accounts, threads, seed, seconds, checkpoint_every } => {
            run_bank(&dir, Config::new(&dir).pool_size(pool).checkpoint_every(checkpoint_every), accounts, threads, seed, seconds)
        }
        TortureCmd::Verify { dir, pool, json } => verify(&dir, pool, json),
    }
}

/// Whether `dir` is absent or an empty directory (then `run` creates a database there).
fn absent_or_empty(dir: &Path) -> Result<bool, Error> {
    match std::fs::read_dir(dir) {
        Ok(mut entries) => Ok(entries.next().is_none()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(true),
        Err(e) => Err(Error::io("list", dir, e)),
    }
}

fn problems(v: &Verdict) -> String {
    format!("torture bank verification failed: {}", v.problems.join("; "))
}

/// Prints sequence numbers in increasing order, each once it and every smaller one of this
/// run have returned from their commits.
struct Printer {
    /// The next sequence number to print.
    next: u64,
    /// Returned but not yet printed (some smaller one has not returned yet).
    pending: BTreeSet<u64>,
    /// The last sequence number printed.
    printed: Option<u64>,
}

impl Printer {
    fn committed(&mut self, seq: u64) -> std::io::Result<()> {
        self.pending.insert(seq);
        if self.pending.first() != Some(&self.next) {
            return Ok(());
        }
        let mut out = std::io::stdout().lock();
        while self.pending.first() == Some(&self.next) {
            self.pending.pop_first();
            writeln!(out, "committed {}", self.next)?;
            self.printed = Some(self.next);
            self.next += 1;
        }
        out.flush()
    }
}

#[derive(Default)]
struct Counts {
    commits: AtomicU64,
    aborts: AtomicU64,
    conflicts: AtomicU64,
}

fn run_bank(dir: &Path, config: Config, accounts: u64, threads: usize, seed: u64, seconds: Option<f64>) -> Result<(), Error> {
    if threads == 0 || threads as u64 > torture::MAX_SLOTS {
        return Err(Error::InvalidInput(format!("--threads must be between 1 and {}", torture::MAX_SLOTS)));
    }
    let duration = match seconds {
        None => None,
        Some(s) if s.is_finite() && s >= 0.0 => Some(Duration::from_secs_f64(s)),
        Some(s) => return Err(Error::InvalidInput(format!("--seconds must be a non-negative number, got {s}"))),
    };
    let db = if absent_or_empty(dir)? {
        Database::create(config.min_page(4096))?
    } else {
        match Database::open(config.clone()) {
            // A run killed in the middle of creating the database: create it again (refused
            // unless DIR holds only what an interrupted create leaves).
            Err(Error::NotADatabase { .. }) => Database::create(config.min_page(4096))?,
            r => r?,
        }
    };
    let (bm, locks) = (db.buffer(), db.locks());
    let bank = Bank::setup(bm, locks, accounts, INITIAL_BALANCE, threads as u64)?;
    let verdict = torture::verify(bm, locks)?;
    if !verdict.ok {
        return Err(Error::Inconsistent(format!("{}; refusing to run", problems(&verdict))));
    }
    let start_seq = verdict.last_committed;
    let seq = AtomicU64::new(start_seq);
    let printer = Mutex::new(Printer { next: start_seq + 1, pending: BTreeSet::new(), printed: None });
    let stop = AtomicBool::new(false);
    let failure: Mutex<Option<Error>> = Mutex::new(None);
    let counts = Counts::default();
    let fail = |e: Error| {
        stop.store(true, Ordering::SeqCst);
        failure.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(e);
    };
    let start = Instant::now();
    std::thread::scope(|s| {
        for i in 0..threads {
            let (bank, seq, printer, stop, counts, fail) = (&bank, &seq, &printer, &stop, &counts, &fail);
            s.spawn(move || {
                let mut rng = Rng(seed ^ (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
                while !stop.load(Ordering::SeqCst) && duration.map_or(true, |d| start.elapsed() < d) {
                    match torture::transfer(bm, locks, bank, i, &mut rng, seq, DEFAULT_LOCK_WAIT) {
                        Ok(Outcome::Committed(n)) => {
                            counts.commits.fetch_add(1, Ordering::Relaxed);
                            let r = printer.lock().unwrap_or_else(|p| p.into_inner()).committed(n);
                            if let Err(e) = r {
                                fail(Error::io("write", "stdout", e));
                            }
                        }
                        Ok(Outcome::Aborted) => {
                            counts.aborts.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(Outcome::Conflict) => {
                            counts.conflicts.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => fail(e),
                    }
                }
            });
        }
    });
    let elapsed = start.elapsed().as_secs_f64();
    if let Some(e) = failure.into_inner().unwrap_or_else(|p| p.into_inner()) {
        return Err(e);
    }
    db.close()?;
    let commits = counts.commits.load(Ordering::Relaxed);
    let printed = printer.into_inner().unwrap_or_else(|p| p.into_inner()).printed;
    eprintln!(
        "torture: {commits} commits (last committed {}), {} aborts, {} conflicts in {elapsed:.2} s ({:.0} commits/s)",
        printed.unwrap_or(start_seq),
        counts.aborts.load(Ordering::Relaxed),
        counts.conflicts.load(Ordering::Relaxed),
        commits as f64 / elapsed.max(1e-9),
    );
    Ok(())
}

fn verify(dir: &Path, pool: u64, json: bool) -> Result<(), Error> {
    let db = Database::open(Config::new(dir).pool_size(pool))?;
    let verdict = torture::verify(db.buffer(), db.locks())?;
    db.close()?;
    if json {
        let s = serde_json::to_string(&verdict).map_err(|e| Error::InvalidInput(format!("cannot encode output: {e}")))?;
        println!("{s}");
    } else {
        println!("{}: last committed {}", if verdict.ok { "ok" } else { "NOT OK" }, verdict.last_committed);
        println!("total {} (expected {})", verdict.total, verdict.expected_total);
        println!("{} scratch pages intact, {} leaked pages", verdict.scratch_pages, verdict.leaked_pages);
        for p in &verdict.problems {
            println!("problem: {p}");
        }
    }
    if verdict.ok {
        Ok(())
    } else {
        Err(Error::Inconsistent(problems(&verdict)))
    }
}
