//! Helpers shared by the CLI test files: run the `strata` binary and check its contract
//! (success, one-line errors, exactly one JSON object).
#![allow(dead_code)] // each test file uses a subset

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

/// Runs `strata` with `args`.
pub fn strata(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_strata")).args(args).output().expect("run strata")
}

/// Runs `strata`, asserts success, returns stdout.
pub fn ok(args: &[&str]) -> String {
    let out = strata(args);
    assert!(out.status.success(), "strata {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// Runs `strata`, asserts failure with a one-line message, returns it.
pub fn fails(args: &[&str]) -> String {
    let out = strata(args);
    assert!(!out.status.success(), "strata {args:?} should fail");
    let err = String::from_utf8(out.stderr).unwrap();
    assert_eq!(err.trim().lines().count(), 1, "one-line error expected: {err}");
    err
}

/// Runs `strata`, asserts it printed exactly one JSON object, returns it.
pub fn json(args: &[&str]) -> Value {
    let s = ok(args);
    assert_eq!(s.trim().lines().count(), 1, "exactly one JSON object: {s}");
    serde_json::from_str(&s).unwrap()
}

/// A path as a command-line argument.
pub fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}
