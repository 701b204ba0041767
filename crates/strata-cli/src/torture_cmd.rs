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
use strata::ops::torture_tree;
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
        /// `bank` (transfers between accounts on pages of several classes) or `tree`
        /// (inserts, updates and removes in a key-value B+-tree, values up to 80 KB). A
        /// database holds one workload; `verify` recognises which.
        #[arg(long, default_value = "bank")]
        workload: String,
    },
    /// The kill -9 cycle, run by strata: start `torture run` on DIR/bank or DIR/tree, kill it
    /// with SIGKILL after a random delay, recover and verify, TRIALS times; prints a summary.
    /// Exits 1 at the first trial whose database is inconsistent or lost an acknowledged
    /// commit (the database is left as the failure found it).
    Soak {
        dir: PathBuf,
        /// Kill trials.
        #[arg(long, default_value_t = 100)]
        trials: u64,
        /// `bank`, `tree`, or `both` (alternating, one database each).
        #[arg(long, default_value = "both")]
        workload: String,
        /// Buffer pool of the runs and of verification.
        #[arg(long, default_value = "2MiB", value_parser = parse_size)]
        pool: u64,
        /// Worker threads of each run.
        #[arg(long, default_value_t = 4)]
        threads: usize,
        /// Seed of the delays and of the runs' seeds.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Longest delay before a kill (tree runs wait three times as long).
        #[arg(long, default_value_t = 600)]
        max_delay_ms: u64,
        /// Print one JSON object (the summary) instead of text and progress.
        #[arg(long)]
        json: bool,
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
        TortureCmd::Run { dir, pool, accounts, threads, seed, seconds, checkpoint_every, workload } => {
            let config = Config::new(&dir).pool_size(pool).checkpoint_every(checkpoint_every);
            match workload.as_str() {
                "bank" => run_bank(&dir, config, accounts, threads, seed, seconds),
                "tree" => run_tree(&dir, config, threads, seed, seconds),
                w => Err(Error::InvalidInput(format!("unknown --workload {w:?}: use bank or tree"))),
            }
        }
        TortureCmd::Verify { dir, pool, json } => verify(&dir, pool, json),
        TortureCmd::Soak { dir, trials, workload, pool, threads, seed, max_delay_ms, json } => {
            crate::soak_cmd::soak(crate::soak_cmd::SoakArgs { dir, trials, workload, pool, threads, seed, max_delay_ms, json })
        }
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

/// `--threads` and `--seconds`, checked.
fn run_limits(threads: usize, max: u64, seconds: Option<f64>) -> Result<Option<Duration>, Error> {
    if threads == 0 || threads as u64 > max {
        return Err(Error::InvalidInput(format!("--threads must be between 1 and {max}")));
    }
    match seconds {
        None => Ok(None),
        Some(s) if s.is_finite() && s >= 0.0 => Ok(Some(Duration::from_secs_f64(s))),
        Some(s) => Err(Error::InvalidInput(format!("--seconds must be a non-negative number, got {s}"))),
    }
}

/// Creates the database with 4 KiB pages when DIR is absent or empty (or holds only what an
/// interrupted create leaves), else opens (recovers) it.
fn create_or_open(dir: &Path, config: Config) -> Result<Database, Error> {
    if absent_or_empty(dir)? {
        return Database::create(config.min_page(4096));
    }
    match Database::open(config.clone()) {
        // A run killed in the middle of creating the database: create it again (refused
        // unless DIR holds only what an interrupted create leaves).
        Err(Error::NotADatabase { .. }) => Database::create(config.min_page(4096)),
        r => r,
    }
}

fn run_bank(dir: &Path, config: Config, accounts: u64, threads: usize, seed: u64, seconds: Option<f64>) -> Result<(), Error> {
    let duration = run_limits(threads, torture::MAX_SLOTS, seconds)?;
    let db = create_or_open(dir, config)?;
    let (bm, locks) = (db.buffer(), db.locks());
    let bank = Bank::setup(bm, locks, accounts, INITIAL_BALANCE, threads as u64)?;
    let verdict = torture::verify(bm, locks)?;
    if !verdict.ok {
        return Err(Error::Inconsistent(format!("{}; refusing to run", problems(&verdict))));
    }
    let start_seq = verdict.last_committed;
    let step = |i: usize| {
        let bank = &bank;
        move |rng: &mut Rng, seq: &AtomicU64| torture::transfer(bm, locks, bank, i, rng, seq, DEFAULT_LOCK_WAIT)
    };
    let printed = drive(threads, seed, start_seq, duration, &step)?;
    db.close()?;
    printed.report(start_seq);
    Ok(())
}

/// Lock wait of the tree workload's transactions: short, so that a writer stuck behind a
/// long transaction gives up quickly and retries (deadlocks between writers of shared
/// leaves are refused at once, without waiting for it).
const TREE_LOCK_WAIT: Duration = Duration::from_millis(100);

fn run_tree(dir: &Path, config: Config, threads: usize, seed: u64, seconds: Option<f64>) -> Result<(), Error> {
    let duration = run_limits(threads, torture_tree::MAX_SLOTS, seconds)?;
    let db = create_or_open(dir, config)?;
    let tree = match db.tree(torture_tree::TREE_NAME) {
        Ok(t) => t,
        Err(Error::NotFound { .. }) => {
            let catalog = db.catalog();
            if catalog.contains("") || !(catalog.columns.is_empty() && catalog.graphs.is_empty() && catalog.trees.is_empty() && catalog.tables.is_empty()) {
                return Err(Error::InvalidInput(format!("{} already holds other data; use an empty directory", dir.display())));
            }
            // A run killed between the tree's creation commit and the catalog update left
            // its pages allocated but unnamed: free them (the catalog names nothing else).
            let orphans = db.buffer().allocated_pages();
            if !orphans.is_empty() {
                let mut tx = db.begin();
                for pid in orphans {
                    tx.free(pid)?;
                }
                tx.commit()?;
            }
            db.create_tree(torture_tree::TREE_NAME)?
        }
        Err(e) => return Err(e),
    };
    let bm = db.buffer();
    let verdict = torture_tree::verify(bm, &tree)?;
    if !verdict.ok {
        return Err(Error::Inconsistent(format!("torture tree verification failed: {}; refusing to run", verdict.problems.join("; "))));
    }
    let start_seq = verdict.last_committed;
    let locks = db.locks();
    // Each slot's committed transactions so far: its next transaction's operations.
    let done: Vec<u64> = (0..threads as u64).map(|i| torture_tree::progress(bm, &tree, i).map(|(_, n)| n)).collect::<Result<_, Error>>()?;
    let step = |i: usize| {
        let tree = &tree;
        let mut done = done[i];
        move |rng: &mut Rng, seq: &AtomicU64| torture_tree::run_tx(bm, locks, tree, i as u64, &mut done, rng.below(16) == 0, seq, TREE_LOCK_WAIT)
    };
    let printed = drive(threads, seed, start_seq, duration, &step)?;
    db.close()?;
    printed.report(start_seq);
    Ok(())
}

/// What [`drive`] did.
struct Driven {
    commits: u64,
    aborts: u64,
    conflicts: u64,
    printed: Option<u64>,
    elapsed: f64,
}

impl Driven {
    fn report(&self, start_seq: u64) {
        eprintln!(
            "torture: {} commits (last committed {}), {} aborts, {} conflicts in {:.2} s ({:.0} commits/s)",
            self.commits,
            self.printed.unwrap_or(start_seq),
            self.aborts,
            self.conflicts,
            self.elapsed,
            self.commits as f64 / self.elapsed.max(1e-9),
        );
    }
}

/// Runs `threads` workers, each repeating the transaction that `step(worker)` makes, until
/// `duration` has passed (or forever), printing `committed SEQ` in order after commits
/// return. An error in any worker stops all of them and is returned.
fn drive<F, W>(threads: usize, seed: u64, start_seq: u64, duration: Option<Duration>, step: &F) -> Result<Driven, Error>
where
    F: Fn(usize) -> W + Sync,
    W: FnMut(&mut Rng, &AtomicU64) -> Result<Outcome, Error>,
{
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
            let (seq, printer, stop, counts, fail) = (&seq, &printer, &stop, &counts, &fail);
            s.spawn(move || {
                let mut rng = Rng(seed ^ (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
                let mut work = step(i);
                while !stop.load(Ordering::SeqCst) && duration.is_none_or(|d| start.elapsed() < d) {
                    match work(&mut rng, seq) {
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
    if let Some(e) = failure.into_inner().unwrap_or_else(|p| p.into_inner()) {
        return Err(e);
    }
    Ok(Driven {
        commits: counts.commits.load(Ordering::Relaxed),
        aborts: counts.aborts.load(Ordering::Relaxed),
        conflicts: counts.conflicts.load(Ordering::Relaxed),
        printed: printer.into_inner().unwrap_or_else(|p| p.into_inner()).printed,
        elapsed: start.elapsed().as_secs_f64(),
    })
}

fn verify(dir: &Path, pool: u64, json: bool) -> Result<(), Error> {
    let db = Database::open(Config::new(dir).pool_size(pool))?;
    if let Ok(tree) = db.tree(torture_tree::TREE_NAME) {
        return verify_tree(db, &tree, json);
    }
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

fn verify_tree(db: Database, tree: &strata::access::btree::BTree, json: bool) -> Result<(), Error> {
    let verdict = torture_tree::verify(db.buffer(), tree)?;
    db.close()?;
    if json {
        let s = serde_json::to_string(&verdict).map_err(|e| Error::InvalidInput(format!("cannot encode output: {e}")))?;
        println!("{s}");
    } else {
        println!("{}: last committed {}", if verdict.ok { "ok" } else { "NOT OK" }, verdict.last_committed);
        println!(
            "{} commits of {} slots, {} keys, tree height {}, {} leaked pages",
            verdict.commits, verdict.slots, verdict.keys, verdict.height, verdict.leaked_pages
        );
        for p in &verdict.problems {
            println!("problem: {p}");
        }
    }
    if verdict.ok {
        Ok(())
    } else {
        Err(Error::Inconsistent(format!("torture tree verification failed: {}", verdict.problems.join("; "))))
    }
}
