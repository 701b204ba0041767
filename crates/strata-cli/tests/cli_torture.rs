//! Crash consistency through the binary: `strata torture run` is killed with SIGKILL at random
//! moments (during creation, recovery, setup and transfers), and `strata torture verify` must
//! then find a consistent bank that kept every commit the killed process acknowledged.
//!
//! `STRATA_KILL_TRIALS` sets the number of kills (default 50). A failing trial leaves a copy
//! of the database as it was before verification under `/tmp/torture-fail-<n>`.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::{fails, p, strata};
use serde_json::Value;

const DEFAULT_TRIALS: u64 = 50;

fn trials() -> u64 {
    std::env::var("STRATA_KILL_TRIALS").ok().and_then(|s| s.parse().ok()).unwrap_or(DEFAULT_TRIALS)
}

/// splitmix64 step.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// What a `committed N` reader saw: the numbers in order, or what was wrong with them.
struct Seen {
    count: u64,
    first: Option<u64>,
    last: Option<u64>,
}

/// Reads `committed N` lines from the child's stdout until EOF, checking that N strictly
/// increases.
fn read_commits(child: &mut Child) -> JoinHandle<Result<Seen, String>> {
    let stdout = child.stdout.take().expect("stdout piped");
    std::thread::spawn(move || {
        let mut seen = Seen { count: 0, first: None, last: None };
        for line in BufReader::new(stdout).lines() {
            let line = line.map_err(|e| format!("reading stdout: {e}"))?;
            let n: u64 = line.strip_prefix("committed ").and_then(|n| n.parse().ok()).ok_or_else(|| format!("unexpected stdout line {line:?}"))?;
            if let Some(last) = seen.last {
                if n <= last {
                    return Err(format!("committed {n} printed after committed {last}"));
                }
            }
            seen.first.get_or_insert(n);
            seen.last = Some(n);
            seen.count += 1;
        }
        Ok(seen)
    })
}

fn spawn_run(dir: &Path, extra: &[&str], stderr: &Path) -> Child {
    let mut args = vec!["torture", "run", p(dir), "--pool", "2MiB", "--accounts", "2000", "--threads", "4"];
    args.extend_from_slice(extra);
    Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(stderr).unwrap())
        .spawn()
        .expect("spawn strata torture run")
}

/// `strata torture verify DIR --json`: exit success, the parsed verdict (if one was printed)
/// and stderr.
fn verify(dir: &Path) -> (bool, Option<Value>, String) {
    let out = strata(&["torture", "verify", p(dir), "--json"]);
    let stdout = String::from_utf8(out.stdout).unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    let v = (!stdout.trim().is_empty()).then(|| {
        assert_eq!(stdout.trim().lines().count(), 1, "exactly one JSON object: {stdout}");
        serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("verify printed no JSON ({e}): {stdout}"))
    });
    (out.status.success(), v, stderr)
}

fn num(v: &Value, key: &str) -> u64 {
    v[key].as_u64().unwrap_or_else(|| panic!("{key} missing or not a u64 in {v}"))
}

/// Copies `from` (absent: an empty directory, as a kill before the run created it leaves).
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    if !from.exists() {
        return;
    }
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), &target).unwrap();
        }
    }
}

/// Keeps a copy of `dir` under the first free `/tmp/torture-fail-<n>`.
fn keep_failure(dir: &Path) -> PathBuf {
    let target = (0..).map(|n| PathBuf::from(format!("/tmp/torture-fail-{n}"))).find(|t| !t.exists()).unwrap();
    copy_dir(dir, &target);
    target
}

#[test]
fn torture_kill9_keeps_every_acknowledged_commit() {
    kill_trials("bank", trials());
}

/// The same kill -9 cycle with the B+-tree workload (inserts, updates and removes of values
/// up to 80 KB in one tree): verify checks the tree's structure and every committed key.
#[test]
fn torture_tree_kill9_keeps_every_acknowledged_commit() {
    kill_trials("tree", trials() / 2);
}

fn kill_trials(workload: &str, trials: u64) {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("db");
    let before = t.path().join("before-verify");
    let stderr_file = t.path().join("run.stderr");
    let started = Instant::now();
    let (mut kills, mut max_seq, mut commits, mut bank_exists) = (0u64, 0u64, 0u64, false);
    let (mut early_kills, mut database_exists) = (0, false);
    for trial in 0..trials {
        let r = mix(trial ^ 0x5EED);
        // A quarter of the kills land early (opening, recovering the previous trial's
        // state, setting up); the rest mostly during transfers.
        // The first kills come within milliseconds: before the directory exists, while the
        // database is created (a create without its meta file must be repeatable), while
        // the bank is set up.
        let delay_ms = if trial < 3 {
            2 + 8 * trial + (r >> 8) % 4
        } else if r.is_multiple_of(4) {
            30 + (r >> 8) % 60
        } else {
            90 + (r >> 8) % 511
        };
        // The tree workload starts by verifying the whole tree (larger after each trial), so
        // its kills come later to land among transactions as often.
        let delay_ms = if workload == "tree" && trial > 0 { delay_ms * 3 } else { delay_ms };
        let mut child = spawn_run(&dir, &["--seed", &trial.to_string(), "--workload", workload], &stderr_file);
        let reader = read_commits(&mut child);
        std::thread::sleep(Duration::from_millis(delay_ms));
        if let Some(status) = child.try_wait().unwrap() {
            panic!("trial {trial}: torture run exited by itself ({status}) before the kill: {}", std::fs::read_to_string(&stderr_file).unwrap());
        }
        child.kill().expect("SIGKILL");
        let status = child.wait().unwrap();
        kills += 1;
        let seen = reader.join().unwrap().unwrap_or_else(|e| panic!("trial {trial} (seed {trial}, delay {delay_ms} ms): {e}"));
        commits += seen.count;
        if seen.count == 0 {
            early_kills += 1;
        }
        // Verification recovers and checkpoints: keep the state as the kill left it.
        if before.exists() {
            std::fs::remove_dir_all(&before).unwrap();
        }
        copy_dir(&dir, &before);
        let (success, v, err) = verify(&dir);
        let Some(v) = v else {
            let no_database = !database_exists && err.contains("is not a strata database");
            database_exists |= !no_database;
            // No bank yet: acceptable only when the kill came before the bank's creation
            // committed, so that no commit was ever acknowledged. A kill before or during the
            // create leaves no meta file (no database yet); the next trial's run
            // creates the database again. Once one existed, it must stay one.
            assert!(
                !success && !bank_exists && seen.count == 0 && (err.contains("no bank") || err.contains("no torture bank") || no_database),
                "trial {trial} (seed {trial}, delay {delay_ms} ms, {status}): verify failed: {err} (failed state kept in {})",
                keep_failure(&before).display()
            );
            continue;
        };
        (bank_exists, database_exists) = (true, true);
        let last = num(&v, "last_committed");
        let ok = v["ok"] == Value::Bool(true) && success && (workload == "tree" || num(&v, "total") == num(&v, "expected_total"));
        assert_eq!(v["workload"] == "tree", workload == "tree", "verify recognised the workload: {v}");
        let kept = seen.last.is_none_or(|n| last >= n);
        if !ok || !kept {
            let at = keep_failure(&before);
            panic!(
                "trial {trial}: seed {trial}, kill after {delay_ms} ms; last printed {:?}, verify: {v} (stderr: {}); state before verification kept in {}",
                seen.last,
                err.trim(),
                at.display()
            );
        }
        max_seq = max_seq.max(last);
    }
    eprintln!(
        "torture ({workload}): {trials} trials, {kills} kills ({early_kills} before any commit), {commits} commits acknowledged, max seq {max_seq}, {:.1} s",
        started.elapsed().as_secs_f64()
    );
    assert!(trials == 0 || max_seq > 0, "no transfer ever committed");
}

#[test]
fn torture_clean_shutdown_loses_nothing() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("db");
    let stderr_file = t.path().join("run.stderr");
    let mut last = 0;
    for round in 0..2 {
        let mut child = spawn_run(&dir, &["--seed", "7", "--seconds", "1"], &stderr_file);
        let reader = read_commits(&mut child);
        let status = child.wait().unwrap();
        let err = std::fs::read_to_string(&stderr_file).unwrap();
        assert!(status.success(), "torture run --seconds 1 failed: {err}");
        assert!(err.contains("commits"), "summary line expected on stderr: {err}");
        let seen = reader.join().unwrap().unwrap();
        assert!(seen.count > 0, "round {round}: no commit in a second");
        // Sequence numbers continue where the previous run stopped, without gaps.
        assert_eq!(seen.first, Some(last + 1), "round {round}");
        assert_eq!(seen.last, Some(last + seen.count), "round {round}: gaps in the printed sequence numbers");
        last = seen.last.unwrap();
        let (success, v, err) = verify(&dir);
        let v = v.unwrap_or_else(|| panic!("verify printed nothing: {err}"));
        assert!(success && v["ok"] == Value::Bool(true), "{v} {err}");
        assert_eq!(num(&v, "total"), num(&v, "expected_total"));
        assert_eq!(num(&v, "total"), 2000 * 1000);
        assert_eq!(num(&v, "last_committed"), last, "a clean shutdown keeps exactly what was printed");
        assert_eq!(num(&v, "leaked_pages"), 0);
    }
    // Text output too.
    let out = strata(&["torture", "verify", p(&dir)]);
    assert!(out.status.success());
    assert!(String::from_utf8(out.stdout).unwrap().starts_with(&format!("ok: last committed {last}")));
}

#[test]
fn torture_verify_needs_a_database_with_a_bank() {
    let t = tempfile::tempdir().unwrap();
    let err = fails(&["torture", "verify", p(t.path()), "--json"]);
    assert!(err.contains("not a strata database"), "{err}");
    let err = fails(&["torture", "verify", p(&t.path().join("missing"))]);
    assert!(err.contains("not a strata database"), "{err}");
    // A database without a bank.
    let db = t.path().join("db");
    common::ok(&["create", p(&db), "--min-page", "4KiB"]);
    let err = fails(&["torture", "verify", p(&db), "--json"]);
    assert!(err.contains("no bank"), "{err}");
    // Invalid thread counts are refused before anything runs.
    let err = fails(&["torture", "run", p(&db), "--threads", "0", "--seconds", "0"]);
    assert!(err.contains("threads"), "{err}");
}

#[test]
fn torture_reports_a_broken_bank() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("db");
    let out = strata(&["torture", "run", p(&dir), "--accounts", "100", "--threads", "2", "--seconds", "0.2"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // Take one unit of money out of the bank behind the workload's back.
    {
        let db = strata::Database::open(strata::Config::new(&dir).pool_size(4 << 20)).unwrap();
        let bank = strata::ops::torture::Bank::load(db.buffer(), db.locks()).unwrap();
        let (pid, at) = bank.account(db.buffer(), 7);
        let mut tx = db.begin();
        let v = tx.read_u64(pid, at).unwrap();
        tx.write_u64(pid, at, v.wrapping_sub(1)).unwrap();
        tx.commit().unwrap();
        db.close().unwrap();
    }
    let (success, v, err) = verify(&dir);
    let v = v.expect("the verdict is printed even when not ok");
    assert!(!success && v["ok"] == Value::Bool(false), "{v}");
    assert_eq!(num(&v, "total") + 1, num(&v, "expected_total"));
    assert!(v["problems"].as_array().is_some_and(|p| !p.is_empty()), "{v}");
    assert_eq!(err.trim().lines().count(), 1, "one-line error expected: {err}");
    let out = strata(&["torture", "verify", p(&dir)]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8(out.stdout).unwrap().starts_with("NOT OK"));
    // run refuses to work on it.
    let err = fails(&["torture", "run", p(&dir), "--accounts", "100", "--threads", "2", "--seconds", "0.2"]);
    assert!(err.contains("refusing to run") && err.contains("expected"), "{err}");
}

/// `strata torture soak` runs the kill -9 cycle itself, for both workloads, and prints a
/// summary; a database that a run refuses (a broken bank) fails the soak with exit 1.
#[test]
fn torture_soak_kills_and_verifies_both_workloads() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("soak");
    let out = strata(&["torture", "soak", p(&dir), "--trials", "6", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["ok"], true, "{v}");
    for w in ["bank", "tree"] {
        assert_eq!(num(&v[w], "trials"), 3, "{v}");
    }
    assert!(num(&v["bank"], "commits_acknowledged") > 0, "{v}");
    // Break the bank: the next soak trial's run refuses it, and the soak fails.
    {
        let db = strata::Database::open(strata::Config::new(dir.join("bank")).pool_size(4 << 20)).unwrap();
        let bank = strata::ops::torture::Bank::load(db.buffer(), db.locks()).unwrap();
        let (pid, at) = bank.account(db.buffer(), 3);
        let mut tx = db.begin();
        let v = tx.read_u64(pid, at).unwrap();
        tx.write_u64(pid, at, v + 5).unwrap();
        tx.commit().unwrap();
        db.close().unwrap();
    }
    let err = fails(&["torture", "soak", p(&dir), "--trials", "2", "--workload", "bank", "--max-delay-ms", "2000"]);
    assert!(err.contains("torture soak failed") && err.contains("trial 0"), "{err}");
    let err = fails(&["torture", "soak", p(&dir), "--workload", "queue"]);
    assert!(err.contains("bank, tree or both"), "{err}");
}
