//! `strata torture soak`: the kill -9 cycle run by strata itself. Each trial starts `strata
//! torture run` on the workload's database, kills it with SIGKILL after a random delay,
//! then recovers the database and verifies it: consistent, and holding every commit the
//! killed process acknowledged (printed). Prints a summary (JSON with `--json`).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::Serialize;
use strata::ops::{torture, torture_tree};
use strata::util::SplitMix64;
use strata::{Config, Database, Error};

use crate::progress;

/// What `soak` was asked to do.
pub struct SoakArgs {
    pub dir: PathBuf,
    pub trials: u64,
    pub workload: String,
    pub pool: u64,
    pub threads: usize,
    pub seed: u64,
    pub max_delay_ms: u64,
    pub json: bool,
}

/// The figures of one workload's trials.
#[derive(Default, Serialize)]
struct Tally {
    trials: u64,
    /// Kills before the run acknowledged any commit (while opening, recovering, setting up).
    early_kills: u64,
    commits_acknowledged: u64,
    /// The largest sequence number that survived a kill.
    max_seq: u64,
}

#[derive(Serialize)]
struct Summary {
    trials: u64,
    bank: Option<Tally>,
    tree: Option<Tally>,
    /// What went wrong (the soak stops at the first failure).
    failures: Vec<String>,
    ok: bool,
    seconds: f64,
}

/// The `committed N` lines a run printed: how many, and the last.
struct Seen {
    count: u64,
    last: Option<u64>,
}

fn read_commits(out: std::process::ChildStdout) -> std::thread::JoinHandle<Result<Seen, String>> {
    std::thread::spawn(move || {
        let mut seen = Seen { count: 0, last: None };
        for line in BufReader::new(out).lines() {
            let line = line.map_err(|e| format!("reading the run's output: {e}"))?;
            let n: u64 = line.strip_prefix("committed ").and_then(|n| n.parse().ok()).ok_or_else(|| format!("unexpected output line {line:?}"))?;
            if seen.last.is_some_and(|l| n <= l) {
                return Err(format!("committed {n} printed after committed {}", seen.last.unwrap_or(0)));
            }
            seen.last = Some(n);
            seen.count += 1;
        }
        Ok(seen)
    })
}

/// Recovers `dir` and verifies its workload: `Ok(Some(last committed))`, `Ok(None)` when the
/// workload does not exist yet, `Err(problem)` when it is not consistent.
fn verify(dir: &Path, pool: u64, workload: &str) -> Result<Option<u64>, String> {
    let db = match Database::open(Config::new(dir).pool_size(pool)) {
        Ok(db) => db,
        // Killed while the database itself was being created.
        Err(Error::NotADatabase { .. }) => return Ok(None),
        Err(e) => return Err(format!("open (recovery) failed: {e}")),
    };
    let r = if workload == "tree" {
        match db.tree(torture_tree::TREE_NAME) {
            Err(Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(e.to_string()),
            Ok(tree) => match torture_tree::verify(db.buffer(), &tree) {
                Ok(v) if v.ok => Ok(Some(v.last_committed)),
                Ok(v) => Err(v.problems.join("; ")),
                Err(e) => Err(e.to_string()),
            },
        }
    } else {
        match torture::verify(db.buffer(), db.locks()) {
            Ok(v) if v.ok => Ok(Some(v.last_committed)),
            Ok(v) => Err(v.problems.join("; ")),
            Err(Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(e.to_string()),
        }
    };
    db.close().map_err(|e| format!("close after verification failed: {e}"))?;
    r
}

/// One trial: run, kill after `delay`, verify. Updates `tally`; `Err` describes a failure.
fn trial(exe: &Path, dir: &Path, a: &SoakArgs, workload: &str, seed: u64, delay: Duration, tally: &mut Tally) -> Result<(), String> {
    let stderr_path = dir.with_extension("stderr");
    let stderr = std::fs::File::create(&stderr_path).map_err(|e| format!("create {}: {e}", stderr_path.display()))?;
    let mut child = Command::new(exe)
        .args(["torture", "run"])
        .arg(dir)
        .args(["--pool", &a.pool.to_string(), "--threads", &a.threads.to_string(), "--seed", &seed.to_string(), "--workload", workload])
        .args(["--accounts", "2000"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .map_err(|e| format!("start {}: {e}", exe.display()))?;
    let reader = read_commits(child.stdout.take().expect("piped"));
    std::thread::sleep(delay);
    if let Ok(Some(status)) = child.try_wait() {
        let err = std::fs::read_to_string(&stderr_path).unwrap_or_default();
        return Err(format!("the run exited by itself ({status}) before the kill: {}", err.trim()));
    }
    child.kill().map_err(|e| format!("kill: {e}"))?;
    let _ = child.wait();
    let seen = reader.join().map_err(|_| "the output reader panicked".to_string())??;
    tally.trials += 1;
    tally.commits_acknowledged += seen.count;
    if seen.count == 0 {
        tally.early_kills += 1;
    }
    match verify(dir, a.pool, workload)? {
        None if seen.count == 0 => Ok(()),
        None => Err(format!("{} commits were acknowledged, but the {workload} workload is gone", seen.count)),
        Some(last) if seen.last.is_some_and(|p| last < p) => {
            Err(format!("committed {} was acknowledged, but only up to {last} survived", seen.last.unwrap_or(0)))
        }
        Some(last) => {
            tally.max_seq = tally.max_seq.max(last);
            Ok(())
        }
    }
}

pub fn soak(a: SoakArgs) -> Result<(), Error> {
    let workloads: &[&str] = match a.workload.as_str() {
        "bank" => &["bank"],
        "tree" => &["tree"],
        "both" => &["bank", "tree"],
        w => return Err(Error::InvalidInput(format!("unknown --workload {w:?}: use bank, tree or both"))),
    };
    if a.threads == 0 || a.max_delay_ms < 30 {
        return Err(Error::InvalidInput("--threads must be at least 1 and --max-delay-ms at least 30".into()));
    }
    let exe = std::env::current_exe().map_err(|e| Error::io("find the strata executable", "/proc/self/exe", e))?;
    std::fs::create_dir_all(&a.dir).map_err(|e| Error::io("create directory", &a.dir, e))?;
    let started = Instant::now();
    let pb = progress::count(a.trials, "kill -9 trials", a.json);
    let mut rng = SplitMix64(a.seed);
    let mut tallies: Vec<Tally> = workloads.iter().map(|_| Tally::default()).collect();
    let mut failures = Vec::new();
    for t in 0..a.trials {
        let w = t as usize % workloads.len();
        let workload = workloads[w];
        let dir = a.dir.join(workload);
        // A quarter of the kills early (opening, recovering, setting up), the rest later;
        // the tree workload verifies its whole tree before running, so its kills come later.
        let max = if rng.below(4) == 0 { 90 } else { a.max_delay_ms };
        let mut delay = 30 + rng.below(max - 29);
        if workload == "tree" {
            delay *= 3;
        }
        let seed = rng.next_u64() >> 1;
        if let Err(problem) = trial(&exe, &dir, &a, workload, seed, Duration::from_millis(delay), &mut tallies[w]) {
            failures.push(format!("trial {t} ({workload}, seed {seed}, kill after {delay} ms): {problem}"));
            break;
        }
        pb.inc(1);
    }
    pb.finish_and_clear();
    let mut tallies = tallies.into_iter();
    let mut take = |name: &str| workloads.contains(&name).then(|| tallies.next()).flatten();
    let bank = take("bank");
    let tree = take("tree");
    let summary = Summary { trials: a.trials, ok: failures.is_empty(), bank, tree, failures, seconds: started.elapsed().as_secs_f64() };
    if a.json {
        crate::cmd::print_json(&summary)?;
    } else {
        for (name, t) in [("bank", &summary.bank), ("tree", &summary.tree)] {
            if let Some(t) = t {
                println!(
                    "{name}: {} trials ({} killed before any commit), {} commits acknowledged, all kept; max seq {}",
                    t.trials, t.early_kills, t.commits_acknowledged, t.max_seq
                );
            }
        }
        println!("{:.1} s", summary.seconds);
    }
    match summary.failures.first() {
        None => Ok(()),
        Some(f) => Err(Error::Inconsistent(format!("torture soak failed: {f} (the database is left in {})", a.dir.display()))),
    }
}
