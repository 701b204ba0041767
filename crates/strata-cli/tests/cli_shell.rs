//! `strata shell` with its statements piped in (stdin is not a terminal): statements that
//! span lines or share one, results as aligned tables, dot commands, errors that are
//! printed while the shell goes on, and the exit status.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::{ok, p};

fn setup(dir: &Path) -> PathBuf {
    let db = dir.join("db");
    ok(&["create", p(&db), "--min-page", "4KiB"]);
    let csv = dir.join("t.csv");
    let mut text = String::from("id,k,name\n");
    for i in 0..500 {
        text.push_str(&format!("{i},{},n{}\n", i % 7, i * 3));
    }
    std::fs::write(&csv, text).unwrap();
    ok(&["import-csv", p(&db), "t", "--from", p(&csv), "--schema", "id:i64,k:i64,name:str", "--pool", "1MiB"]);
    db
}

/// Runs `strata shell DB` with `input` on stdin: (exit success, stdout, stderr).
fn shell(db: &Path, input: &str) -> (bool, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["shell", p(db), "--pool", "1MiB"])
        .env("HOME", db) // no history file is written when not in a terminal, but keep it away
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    (out.status.success(), String::from_utf8(out.stdout).unwrap(), String::from_utf8(out.stderr).unwrap())
}

#[test]
fn piped_statements_print_tables_and_errors_do_not_stop_the_shell() {
    let tmp = tempfile::tempdir().unwrap();
    let db = setup(tmp.path());
    // The expected sums, computed here.
    let sum = |k: i64| (0..500i64).filter(|i| i % 7 == k).sum::<i64>();
    let input = "\
.tables
.schema t
SELECT k, count(*) AS n,
       sum(id) AS total
  FROM t
 WHERE k < 2   -- a comment; with a semicolon
 GROUP BY k ORDER BY k;
SELECT nope FROM t; SELECT 'a;b' AS s;
.timer on
SELECT max(id) FROM t WHERE id < (SELECT avg(id) FROM t);
.timer off
.bogus
SELECT count(*) FROM t WHERE name LIKE 'n1%'
";
    let (success, out, err) = shell(&db, input);
    let want = format!(
        "t\n\
         CREATE TABLE t (id BIGINT, k BIGINT, name VARCHAR);\n\
         k |  n | total\n\
         --+----+------\n\
         0 | 72 | {}\n\
         1 | 72 | {}\n\
         (2 rows)\n\
         s\n\
         ---\n\
         a;b\n\
         (1 row)\n",
        sum(0),
        sum(1)
    );
    assert!(out.starts_with(&want), "{out}\n--- expected to start with ---\n{want}");
    // The timed statement: its footer has the seconds; the next (timer off) has none.
    let rest = &out[want.len()..];
    let lines: Vec<&str> = rest.lines().collect();
    assert_eq!(&lines[..3], ["max(id)", "-------", "    249"], "{rest}");
    assert!(lines[3].starts_with("(1 row, ") && lines[3].ends_with(" s)"), "{rest}");
    let n1 = (0..500).filter(|i| format!("n{}", i * 3).starts_with("n1")).count();
    assert_eq!(&lines[4..], ["count(*)", "--------", &format!("{n1:>8}"), "(1 row)"], "{rest}");
    // Each error on a line of its own, on stderr; the exit status says statements failed.
    let errs: Vec<&str> = err.lines().collect();
    assert_eq!(errs.len(), 3, "{err}");
    assert!(errs[0].contains("no column named \"nope\" in table \"t\""), "{err}");
    assert!(errs[1].contains("unknown command or arguments: \".bogus\""), "{err}");
    assert!(errs[2].contains("2 statements failed"), "{err}");
    assert!(!success);
}

#[test]
fn quit_help_and_a_clean_exit() {
    let tmp = tempfile::tempdir().unwrap();
    let db = setup(tmp.path());
    let (success, out, err) = shell(&db, ".help\nSELECT 1 AS one;\n.quit\nSELECT nope;\n");
    assert!(success, "{err}");
    assert!(out.contains(".timer on|off") && out.contains(".schema [T]"), "{out}");
    assert!(out.ends_with("one\n---\n  1\n(1 row)\n"), "{out}");
    assert_eq!(err, "");
    // An EXPLAIN prints the plan's lines; nothing at all is fine too.
    let (success, out, _) = shell(&db, "EXPLAIN SELECT id FROM t WHERE k = 3;\n\n");
    assert!(success);
    assert!(out.starts_with("Project id\n  Scan t filter (k = 3)"), "{out}");
    let (success, out, _) = shell(&db, "");
    assert!(success && out.is_empty());
}
