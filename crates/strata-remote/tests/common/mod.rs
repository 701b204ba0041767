//! Test harness: private Valkey/Redis servers (unix socket or loopback port, or a 3-node
//! cluster on loopback), killed on drop, and strata databases with data several times their
//! pool.
//!
//! The servers are `valkey-server` when it is on PATH, else `redis-server`; when neither is,
//! the tests fail and say so (CI installs redis-server).

#![allow(dead_code)]

use std::io::Read;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use strata::access::{Column, ValueFormat};
use strata::{Config, Database, PageId};
use strata_remote::{RedisTier, RemoteConfig, TierCounters};

/// Bound on anything these tests wait for (a server starting, the writer draining, the
/// tier coming back): far beyond what it takes on any machine, however loaded, so that it
/// fails only on a real hang. No test asserts how long something took.
pub const HANG: Duration = Duration::from_secs(120);

/// Waits until `cond` holds, trying it again every few milliseconds; fails (naming `what`)
/// only after [`HANG`].
pub fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + HANG;
    while !cond() {
        assert!(Instant::now() < deadline, "{what}: not after {HANG:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Fails the whole test process if it is not dropped within [`HANG`]: turns a hang of the
/// code it covers into a failure instead of a stuck CI job.
pub struct HangGuard(Option<std::sync::mpsc::Sender<()>>);

pub fn hang_guard(what: &'static str) -> HangGuard {
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(HANG) {
            eprintln!("{what}: still running after {HANG:?}, hung; aborting");
            std::process::abort();
        }
    });
    HangGuard(Some(tx))
}

impl Drop for HangGuard {
    fn drop(&mut self) {
        // Dropping the sender wakes the guard thread (disconnected), which then exits.
        self.0.take();
    }
}

/// Asserts that lookups failed fast between two snapshots of the tier's counters taken
/// `elapsed` apart while the server was unreachable (gone or frozen): some lookups failed at
/// once, and the others, those that waited on a connection or a connection attempt, are at
/// most the connections that may have been in use when the server was found down plus one
/// probe per `retry` interval (the tier's promise). The allowance grows with the time the
/// pass took, so a slow machine cannot fail this; a tier that waited on the network for
/// every lookup would exceed it.
pub fn assert_failed_fast(before: &TierCounters, after: &TierCounters, elapsed: Duration, retry: Duration) {
    let fast = after.gets_failed_fast - before.gets_failed_fast;
    let waited = (after.get_errors - after.gets_failed_fast) - (before.get_errors - before.gets_failed_fast);
    let probes = (elapsed.as_secs_f64() / retry.as_secs_f64()).ceil() as u64 + 1;
    // 16 pooled connections (the tier keeps at most that many idle) plus a few lookups in
    // flight on other threads.
    let in_use = 16 + 8;
    assert!(fast > 0, "no lookup failed fast: {after:?}");
    assert!(
        waited <= in_use + probes,
        "{waited} lookups waited on the network in {elapsed:?} ({fast} failed fast): more than {in_use} + one probe per {retry:?}"
    );
}

/// Finds `name` on PATH.
fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(name)).find(|p| p.is_file())
}

/// The server and client binaries: Valkey's if installed, else Redis's.
pub fn binaries() -> (PathBuf, PathBuf) {
    if let (Some(s), Some(c)) = (which("valkey-server"), which("valkey-cli")) {
        return (s, c);
    }
    if let (Some(s), Some(c)) = (which("redis-server"), which("redis-cli")) {
        return (s, c);
    }
    panic!(
        "strata-remote's tests need a Valkey or Redis server: neither valkey-server/valkey-cli nor redis-server/redis-cli is on PATH. \
         Install redis-server (Debian/Ubuntu: apt-get install redis-server; CI installs it) or valkey-server."
    );
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Where a server listens.
#[derive(Clone, Debug)]
pub enum Listen {
    Unix(PathBuf),
    Tcp(u16),
    /// TLS only, on this loopback port (the certificate arguments are the caller's).
    Tls(u16),
}

/// A private server, killed on drop.
pub struct Server {
    child: Option<Child>,
    pub dir: tempfile::TempDir,
    pub listen: Listen,
    args: Vec<String>,
    password: Option<String>,
}

impl Server {
    /// A server on a unix socket in a temporary directory.
    pub fn unix(maxmemory: u64) -> Server {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("redis.sock");
        Server::start(dir, Listen::Unix(sock), maxmemory, &[])
    }

    /// A server on a free loopback port, with extra arguments.
    pub fn tcp(maxmemory: u64, extra: &[&str]) -> Server {
        Server::start(tempfile::tempdir().unwrap(), Listen::Tcp(free_port()), maxmemory, extra)
    }

    /// A server that speaks only TLS on a free loopback port (`extra`: the `--tls-*` files).
    pub fn tls(maxmemory: u64, extra: &[&str]) -> Server {
        Server::start(tempfile::tempdir().unwrap(), Listen::Tls(free_port()), maxmemory, extra)
    }

    fn start(dir: tempfile::TempDir, listen: Listen, maxmemory: u64, extra: &[&str]) -> Server {
        let mut args: Vec<String> = ["--save", "", "--appendonly", "no", "--maxmemory"].iter().map(|s| s.to_string()).collect();
        args.push(maxmemory.to_string());
        args.extend(["--maxmemory-policy", "allkeys-lru", "--daemonize", "no"].iter().map(|s| s.to_string()));
        args.extend(["--dir".to_string(), dir.path().display().to_string()]);
        match &listen {
            Listen::Unix(sock) => args.extend(["--port", "0", "--unixsocket", &sock.display().to_string(), "--unixsocketperm", "700"].map(String::from)),
            Listen::Tcp(port) => args.extend(["--port", &port.to_string(), "--bind", "127.0.0.1"].map(String::from)),
            Listen::Tls(port) => args.extend(["--port", "0", "--tls-port", &port.to_string(), "--bind", "127.0.0.1"].map(String::from)),
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        let password = extra.iter().position(|a| *a == "--requirepass").map(|i| extra[i + 1].to_string());
        let mut s = Server { child: None, dir, listen, args, password };
        s.spawn();
        s
    }

    fn spawn(&mut self) {
        let (server, _) = binaries();
        let log = std::fs::File::create(self.dir.path().join("server.log")).unwrap();
        let child = Command::new(server).args(&self.args).stdin(Stdio::null()).stdout(log.try_clone().unwrap()).stderr(log).spawn().expect("start the server");
        self.child = Some(child);
        let deadline = Instant::now() + HANG;
        loop {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("the server exited ({status}) at start:\n{}", self.log());
            }
            let ready = match self.listen {
                Listen::Tls(port) => std::net::TcpStream::connect(("127.0.0.1", port)).is_ok(),
                _ => self.raw().ok().and_then(|mut c| redis::cmd("PING").query::<String>(&mut c).ok()).is_some(),
            };
            if ready {
                return;
            }
            assert!(Instant::now() < deadline, "the server did not answer PING within {HANG:?}:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn log(&self) -> String {
        let mut s = String::new();
        let _ = std::fs::File::open(self.dir.path().join("server.log")).map(|mut f| f.read_to_string(&mut s));
        s
    }

    /// `unix:///path` or `redis://127.0.0.1:port`.
    pub fn url(&self) -> String {
        match &self.listen {
            Listen::Unix(p) => format!("unix://{}", p.display()),
            Listen::Tcp(port) => format!("redis://127.0.0.1:{port}"),
            Listen::Tls(port) => format!("rediss://127.0.0.1:{port}"),
        }
    }

    pub fn port(&self) -> u16 {
        match self.listen {
            Listen::Tcp(p) | Listen::Tls(p) => p,
            Listen::Unix(_) => panic!("not a TCP server"),
        }
    }

    fn raw(&self) -> redis::RedisResult<redis::Connection> {
        let addr = match &self.listen {
            Listen::Unix(p) => redis::ConnectionAddr::Unix(p.clone()),
            Listen::Tcp(port) => redis::ConnectionAddr::Tcp("127.0.0.1".into(), *port),
            Listen::Tls(_) => panic!("the harness has no direct connection to a TLS server"),
        };
        let redis = redis::RedisConnectionInfo { password: self.password.clone(), ..Default::default() };
        redis::Client::open(redis::ConnectionInfo { addr, redis })?.get_connection_with_timeout(HANG)
    }

    /// A direct connection (behind the tier's back).
    pub fn conn(&self) -> redis::Connection {
        self.raw().expect("connect to the test server")
    }

    /// Runs one command on a direct connection.
    pub fn cmd<T: redis::FromRedisValue>(&self, args: &[&[u8]]) -> T {
        let mut cmd = redis::cmd(std::str::from_utf8(args[0]).unwrap());
        for a in &args[1..] {
            cmd.arg(*a);
        }
        cmd.query(&mut self.conn()).unwrap()
    }

    pub fn dbsize(&self) -> u64 {
        self.cmd(&[b"DBSIZE"])
    }

    /// A field of `INFO memory` (`used_memory`, `used_memory_dataset`, ...).
    pub fn memory(&self, field: &str) -> u64 {
        let info: String = self.cmd(&[b"INFO", b"memory"]);
        info.lines()
            .find_map(|l| l.strip_prefix(field).and_then(|r| r.strip_prefix(':')))
            .unwrap_or_else(|| panic!("no {field} in {info}"))
            .trim()
            .parse()
            .unwrap()
    }

    /// Kills the server (SIGKILL) and removes its socket file.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if let Listen::Unix(p) = &self.listen {
            let _ = std::fs::remove_file(p);
        }
    }

    /// Freezes the server (SIGSTOP): connections stay open, nothing answers.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Thaws it (SIGCONT).
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, sig: &str) {
        let pid = self.child.as_ref().expect("server running").id().to_string();
        assert!(Command::new("kill").args([sig, &pid]).status().unwrap().success());
    }

    /// Starts it again where it listened, empty.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Three masters on loopback, slots spread by `--cluster create`.
pub struct Cluster {
    pub nodes: Vec<Server>,
}

impl Cluster {
    pub fn start(maxmemory: u64) -> Cluster {
        let nodes: Vec<Server> = (0..3)
            .map(|_| {
                let dir = tempfile::tempdir().unwrap();
                let port = free_port();
                let conf = dir.path().join(format!("nodes-{port}.conf")).display().to_string();
                let extra = ["--cluster-enabled", "yes", "--cluster-config-file", &conf, "--cluster-node-timeout", "5000"];
                Server::start(dir, Listen::Tcp(port), maxmemory, &extra)
            })
            .collect();
        let (_, cli) = binaries();
        let mut cmd = Command::new(cli);
        cmd.arg("--cluster").arg("create");
        for n in &nodes {
            cmd.arg(format!("127.0.0.1:{}", n.port()));
        }
        let out = cmd.args(["--cluster-replicas", "0", "--cluster-yes"]).stdin(Stdio::null()).output().expect("run redis-cli --cluster create");
        assert!(out.status.success(), "cluster create failed:\n{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        let deadline = Instant::now() + HANG;
        for n in &nodes {
            loop {
                let info: String = n.cmd(&[b"CLUSTER", b"INFO"]);
                if info.lines().any(|l| l.trim() == "cluster_state:ok") {
                    break;
                }
                assert!(Instant::now() < deadline, "cluster not ok after {HANG:?}:\n{info}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Cluster { nodes }
    }

    pub fn url(&self) -> String {
        let hosts: Vec<String> = self.nodes.iter().map(|n| format!("127.0.0.1:{}", n.port())).collect();
        format!("redis+cluster://{}", hosts.join(","))
    }
}

/// A tier for `url` with fast retries.
pub fn tier(url: &str, prefix: &str) -> Arc<RedisTier> {
    tier_with(RemoteConfig::new(url).unwrap().prefix(prefix))
}

pub fn tier_with(config: RemoteConfig) -> Arc<RedisTier> {
    Arc::new(RedisTier::connect(config).expect("connect the tier"))
}

/// Pool size of the column tests: 1 MiB of 64 KiB pages.
pub const POOL: u64 = 1 << 20;
/// Column size: 16 MiB of u64 values (256 pages of 64 KiB).
pub const VALUES: usize = 2 << 20;

/// A database of 64 KiB pages in a 1 MiB pool, with or without the tier.
pub fn database(dir: &Path, tier: Option<Arc<RedisTier>>) -> Database {
    let mut config = Config::new(dir.join("db")).pool_size(POOL).min_page(64 << 10);
    if let Some(t) = tier {
        config = config.remote_tier(t);
    }
    Database::create(config).unwrap()
}

/// Deterministic pseudo-random values (xorshift64*), below 2^40.
pub fn values(n: usize, seed: u64) -> Vec<u64> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 24
        })
        .collect()
}

/// A permutation of 0..n.
pub fn shuffled(n: usize, seed: u64) -> Vec<usize> {
    let r = values(n, seed);
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        order.swap(i, (r[i] % (i as u64 + 1)) as usize);
    }
    order
}

pub fn import(db: &Database, name: &str, vals: &[u64]) -> Column {
    let bytes: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
    db.import(name, ValueFormat::U64le, &mut &bytes[..], bytes.len() as u64, &mut |_| {}).unwrap()
}

/// Reads the column's pages in `order` through `fix_shared`; per page (index, sum of values).
pub fn read_pages(db: &Database, col: &Column, order: &[usize]) -> Vec<(usize, u128)> {
    let mut out: Vec<(usize, u128)> = order
        .iter()
        .map(|&i| {
            let p = col.pages[i];
            let g = db.buffer().fix_shared(p.page_id()).unwrap();
            let sum = g.data()[..p.count as usize * 8].chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap()) as u128).sum();
            (i, sum)
        })
        .collect();
    out.sort_unstable();
    out
}

/// The expected per-page sums.
pub fn page_sums(col: &Column, vals: &[u64]) -> Vec<(usize, u128)> {
    let mut at = 0;
    col.pages
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let n = p.count as usize;
            let s = vals[at..at + n].iter().map(|&v| v as u128).sum();
            at += n;
            (i, s)
        })
        .collect()
}

/// `scan_gt` with one page per morsel (4 workers in a 1 MiB pool), so every page goes through
/// a fix and a miss can be served by the tier (the prefetch of multi-page morsels reads the
/// disk directly).
pub fn scan(db: &Database, col: &Column, gt: i128) -> strata::ops::scan::ScanResult {
    strata::ops::scan_gt(db.buffer(), col, gt, 4).unwrap()
}

pub fn expected_scan(vals: &[u64], gt: i128) -> (u64, i128) {
    vals.iter().filter(|&&v| v as i128 > gt).fold((0, 0), |(c, s), &v| (c + 1, s + v as i128))
}

pub fn remote(db: &Database) -> strata::buffer::RemoteStats {
    db.buffer().stats().remote.expect("a tier is configured")
}

/// Waits until the writer has sent everything queued.
pub fn settle(tier: &RedisTier) {
    assert!(tier.flush(HANG), "the tier's writer did not drain its queue in {HANG:?}");
}

/// Key of chunk `chunk` of `pid` under `prefix`.
pub fn key(prefix: &str, pid: PageId, chunk: usize) -> String {
    strata_remote::object_key(prefix, pid, chunk)
}
