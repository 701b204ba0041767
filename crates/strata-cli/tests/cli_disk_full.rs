//! A real full disk (issue 17, item 2): a 12 MiB tmpfs mounted by the test. An import that
//! fills it fails with the one-line disk-full error; then, with the disk still full,
//! reading commands work (the first one recovers, needing no free space), `check` passes,
//! and once the file system is made larger the same import succeeds. Skipped, with the
//! reason printed, where mounting is not allowed (not root, no tmpfs, a container that
//! forbids it). The library's `tests/disk_full.rs` covers each write path on a simulated
//! small file system everywhere.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{json, ok, p, strata};

/// A tmpfs of `size` mounted at a fresh directory, unmounted on drop.
struct Tmpfs {
    _parent: tempfile::TempDir,
    at: PathBuf,
}

impl Tmpfs {
    fn mount(size: &str) -> Result<Tmpfs, String> {
        let parent = tempfile::tempdir().map_err(|e| e.to_string())?;
        let at = parent.path().join("fs");
        std::fs::create_dir(&at).map_err(|e| e.to_string())?;
        let out = Command::new("mount").args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs", p(&at)]).output().map_err(|e| format!("mount: {e}"))?;
        if !out.status.success() {
            return Err(format!("mount failed: {}", String::from_utf8_lossy(&out.stderr).trim()));
        }
        Ok(Tmpfs { _parent: parent, at })
    }

    fn resize(&self, size: &str) {
        let out = Command::new("mount").args(["-o", &format!("remount,size={size}"), p(&self.at)]).output().unwrap();
        assert!(out.status.success(), "remount: {}", String::from_utf8_lossy(&out.stderr));
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(p(&self.at)).status();
    }
}

fn rows(db: &Path, table: &str) -> u64 {
    let v = json(&["sql", p(db), "--pool", "4MiB", "--json", &format!("SELECT count(*) FROM {table}")]);
    v["rows"][0][0].as_u64().unwrap()
}

fn csv_rows(csv: &Path) -> u64 {
    std::fs::read_to_string(csv).unwrap().lines().count() as u64 - 1
}

#[test]
fn a_full_tmpfs_stops_the_import_and_never_the_readers() {
    let fs = match Tmpfs::mount("12m") {
        Ok(fs) => fs,
        Err(why) => {
            eprintln!("skipped: cannot mount a small tmpfs ({why})");
            return;
        }
    };
    let work = tempfile::tempdir().unwrap();
    let (a, b) = (work.path().join("a.csv"), work.path().join("b.csv"));
    ok(&["gen", "csv", "--size", "1MiB", "--seed", "1", "--out", p(&a)]);
    // 64 MiB of CSV: its text compresses in packed leaves (about 21 MiB stored), still
    // well over the 12 MiB.
    ok(&["gen", "csv", "--size", "64MiB", "--seed", "2", "--out", p(&b)]);
    let db = fs.at.join("db");
    ok(&["create", p(&db)]);
    ok(&["import-csv", p(&db), "a", "--from", p(&a), "--pool", "16MiB"]);

    let out = strata(&["import-csv", p(&db), "b", "--from", p(&b), "--pool", "16MiB"]);
    assert!(!out.status.success(), "a 64 MiB import into 12 MiB succeeded");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("disk full") && err.contains(p(&db)), "{err}");

    // Still full. Readers work: the first recovers without free space.
    assert_eq!(rows(&db, "a"), csv_rows(&a));
    ok(&["query", p(&db), "--pool", "4MiB", "rows", "a"]);
    let check = json(&["check", p(&db), "--json"]);
    assert_eq!(check["ok"], serde_json::json!(true), "{check}");
    // The failed import's new table is gone, with its pages.
    assert_eq!(check["report"]["unreferenced_pages"], serde_json::json!(0), "{check}");
    assert!(check["report"]["tables"].get("b").is_none(), "{check}");
    assert_eq!(rows(&db, "a"), csv_rows(&a));
    let stats = ok(&["stats", p(&db)]);
    assert!(stats.contains("table a"), "{stats}");

    // More space: the import runs to its end, and the first table is whole.
    fs.resize("128m");
    ok(&["import-csv", p(&db), "b", "--from", p(&b), "--pool", "16MiB"]);
    assert_eq!(rows(&db, "b"), csv_rows(&b));
    assert_eq!(rows(&db, "a"), csv_rows(&a));
    ok(&["check", p(&db)]);
}
