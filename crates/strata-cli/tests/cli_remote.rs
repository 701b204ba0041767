//! `strata query --remote`: the second memory tier through the binary, against a private
//! Redis/Valkey server (CI installs redis-server; without a server binary this test fails and
//! says so). Results must be the same with and without the tier; the JSON reports the tier's
//! counters; a wrong password is a one-line error that does not show the password;
//! `--warm-restart` fills the pool from the server at the next start.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{fails, json, ok, p};

struct Server {
    child: Child,
    socket: PathBuf,
}

impl Server {
    fn start(dir: &Path, extra: &[&str]) -> Server {
        let bin = ["valkey-server", "redis-server"]
            .into_iter()
            .find(|b| Command::new(b).arg("--version").stdout(Stdio::null()).status().is_ok_and(|s| s.success()))
            .expect("no valkey-server or redis-server on PATH: install redis-server (apt-get install redis-server); CI does");
        let socket = dir.join("redis.sock");
        let mut args: Vec<String> =
            ["--port", "0", "--unixsocket", p(&socket), "--save", "", "--appendonly", "no", "--maxmemory", "256mb", "--maxmemory-policy", "allkeys-lru"]
                .iter()
                .map(|s| s.to_string())
                .collect();
        args.extend(extra.iter().map(|s| s.to_string()));
        let child = Command::new(bin).args(&args).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
        // A bound that only a server that never starts exceeds, however loaded the machine.
        let deadline = Instant::now() + Duration::from_secs(120);
        while !socket.exists() {
            assert!(Instant::now() < deadline, "server did not start in 120 s");
            std::thread::sleep(Duration::from_millis(20));
        }
        Server { child, socket }
    }
    fn url(&self) -> String {
        format!("unix://{}", self.socket.display())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn query_with_the_remote_tier_gives_the_same_results() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("db");
    let data = tmp.path().join("ints");
    ok(&["gen", "ints", "--count", "2000000", "--seed", "3", "--out", p(&data)]);
    ok(&["create", p(&db)]);
    ok(&["import", p(&db), "v", "--from", p(&data), "--format", "u32le", "--pool", "4MiB"]);
    let server = Server::start(tmp.path(), &[]);
    let url = server.url();
    let q = |extra: &[&str]| {
        let mut args = vec!["query", p(&db), "--pool", "1MiB", "--json"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["groupby", "v", "--mod", "7"]);
        json(&args)
    };
    let plain = q(&[]);
    assert!(plain.get("remote").is_none());
    let first = q(&["--remote", &url, "--warm-restart"]);
    assert_eq!(first["result"], plain["result"]);
    assert!(first["remote"]["puts"].as_u64().unwrap() > 0, "{first}");
    // The second run starts warm: the pool is filled from the server at open.
    let second = q(&["--remote", &url, "--warm-restart"]);
    assert_eq!(second["result"], plain["result"]);
    assert!(second["remote"]["hits"].as_u64().unwrap() > 0, "{second}");
}

#[test]
fn wrong_password_is_a_clear_error_without_the_password() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("db");
    ok(&["create", p(&db)]);
    let server = Server::start(tmp.path(), &["--requirepass", "right-horse"]);
    let url = format!("unix://{}?password=wrong-battery", server.socket.display());
    let err = fails(&["query", p(&db), "--pool", "1MiB", "--remote", &url, "scan", "v", "--gt", "0"]);
    assert!(err.contains("authentication") && !err.contains("wrong-battery") && !err.contains("right-horse"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    let err = fails(&["query", p(&db), "--pool", "1MiB", "--remote", "redis://nowhere.invalid:1", "scan", "v", "--gt", "0"]);
    assert!(err.contains("remote tier"), "{err}");
}
