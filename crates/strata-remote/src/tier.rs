//! [`RedisTier`]: the [`RemoteTier`] over Valkey/Redis (one server or a cluster).
//!
//! Two paths share nothing but the configuration and the counters:
//!
//! * **Writes** (`put`, `remove`) go through a channel to one background writer thread, which
//!   drains it in batches and sends each batch as one pipeline (`SET` per chunk, `UNLINK` for
//!   removed pages and for pages pushed out by the budget) on its own connection. The callers
//!   only copy the image into the channel; when the bytes waiting exceed the queue limit, the
//!   page is dropped instead. While the server is unreachable the writer discards what it
//!   takes from the channel and tries to reconnect at most once per retry interval.
//! * **Reads** (`get`) run on the caller's thread on a connection taken from a small pool
//!   (one `GET`, or one `MGET` for a chunked page). A miss of the pool (`get_into`) on a
//!   single server over TCP or a unix socket takes a faster path of its own
//!   ([`crate::raw`]): its own pool of connections, and the reply's payload read straight
//!   into the frame, with no intermediate buffer; TLS and cluster endpoints use `get` (the
//!   redis crate, which follows `MOVED`/`ASK`) and copy. A connection that fails marks the
//!   server down: until the retry interval has passed, lookups fail at once without
//!   touching the network, and then a single caller probes it while the others keep failing
//!   fast.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use redis::{Cmd, ConnectionAddr, ConnectionInfo, RedisConnectionInfo, RedisError, RedisResult, Value};
use strata::buffer::{Fetched, RemoteStats, RemoteTier};
use strata::storage::IoBufMut;
use strata::PageId;

use crate::config::{Addr, Endpoint, RemoteConfig};
use crate::error::{classify, scrub, RemoteError};
use crate::raw::{Handshake, RawConn, RawError};

/// Largest object stored: pages above it are split into chunks of this size.
pub const CHUNK_SIZE: usize = 1 << 20;
/// The writer sends at most this many page bytes in one pipeline...
const MAX_BATCH_BYTES: u64 = 4 << 20;
/// ...and at most this many operations.
const MAX_BATCH_OPS: usize = 256;
/// Idle read connections kept for reuse.
const MAX_IDLE: usize = 16;

/// Number of objects a page of `len` bytes is stored in.
pub fn chunk_count(len: usize) -> usize {
    len.div_ceil(CHUNK_SIZE).max(1)
}

/// The key of chunk `chunk` of page `pid`: `{prefix}:{<pid hex>}:<chunk>`. The braces are a
/// Redis Cluster hash tag: all chunks of a page hash to one slot, so one `MGET` reads them.
pub fn object_key(prefix: &str, pid: PageId, chunk: usize) -> String {
    format!("{prefix}:{{{:x}}}:{chunk}", pid.raw())
}

/// The tier's own counters (see [`RedisTier::counters`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TierCounters {
    /// Page bytes the server acknowledged storing.
    pub bytes_sent: u64,
    /// Page bytes read back by lookups.
    pub bytes_received: u64,
    /// Pages acknowledged stored.
    pub pages_sent: u64,
    /// Puts dropped because the queue was full.
    pub dropped_full: u64,
    /// Puts dropped because the server was unreachable or the pipeline carrying them failed.
    pub dropped_offline: u64,
    /// Write pipelines that failed (connection lost, or an error reply such as `OOM`).
    pub write_errors: u64,
    /// Lookups that failed (server gone, timeout, error reply).
    pub get_errors: u64,
    /// Of those, the ones that failed at once, without touching the network, because the
    /// server was marked down and the retry interval had not passed (or another lookup was
    /// probing it). The rest waited on a connection or a connection attempt.
    pub gets_failed_fast: u64,
    /// Connections replaced after the server closed one or had been found gone (writer and
    /// lookups).
    pub reconnects: u64,
    /// Pages deleted to stay within the budget.
    pub budget_evictions: u64,
    /// Page bytes this client believes it keeps on the server (what the budget limits).
    pub stored_bytes: u64,
    /// Pages this client believes it keeps on the server.
    pub stored_pages: u64,
    /// Page bytes waiting in the put queue.
    pub queued_bytes: u64,
}

#[derive(Default)]
struct Counters {
    bytes_sent: AtomicU64,
    bytes_received: AtomicU64,
    pages_sent: AtomicU64,
    dropped_full: AtomicU64,
    dropped_offline: AtomicU64,
    write_errors: AtomicU64,
    get_errors: AtomicU64,
    gets_failed_fast: AtomicU64,
    reconnects: AtomicU64,
    budget_evictions: AtomicU64,
    stored_bytes: AtomicU64,
    stored_pages: AtomicU64,
}

fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A connection to the server or the cluster.
enum Conn {
    Single(redis::Connection),
    Cluster(Box<redis::cluster::ClusterConnection>),
}

impl Conn {
    fn query(&mut self, cmd: &Cmd) -> RedisResult<Value> {
        match self {
            Conn::Single(c) => cmd.query(c),
            Conn::Cluster(c) => cmd.query(c.as_mut()),
        }
    }
}

/// A pipeline of the kind that fits the connection.
enum Pipe {
    Single(redis::Pipeline),
    Cluster(redis::cluster::ClusterPipeline),
}

impl Pipe {
    fn new(cluster: bool) -> Pipe {
        if cluster {
            Pipe::Cluster(redis::cluster::cluster_pipe())
        } else {
            Pipe::Single(redis::pipe())
        }
    }
    fn add(&mut self, cmd: Cmd) {
        match self {
            Pipe::Single(p) => {
                p.add_command(cmd);
            }
            Pipe::Cluster(p) => {
                p.add_command(cmd);
            }
        }
    }
    fn exec(&self, conn: &mut Conn) -> RedisResult<()> {
        match (self, conn) {
            (Pipe::Single(p), Conn::Single(c)) => p.query::<()>(c),
            (Pipe::Cluster(p), Conn::Cluster(c)) => p.query::<()>(c),
            _ => unreachable!("pipeline and connection are made from the same endpoint"),
        }
    }
    /// Runs the pipeline and returns one reply per command.
    fn replies(&self, conn: &mut Conn) -> RedisResult<Vec<Value>> {
        match (self, conn) {
            (Pipe::Single(p), Conn::Single(c)) => p.query::<Vec<Value>>(c),
            (Pipe::Cluster(p), Conn::Cluster(c)) => p.query::<Vec<Value>>(c),
            _ => unreachable!("pipeline and connection are made from the same endpoint"),
        }
    }
}

enum Client {
    Single(redis::Client),
    Cluster(redis::cluster::ClusterClient),
}

fn connection_info(ep: &Endpoint, addr: &Addr) -> ConnectionInfo {
    let addr = match addr {
        #[cfg(feature = "tls")]
        Addr::Tcp { host, port } if ep.tls => ConnectionAddr::TcpTls { host: host.clone(), port: *port, insecure: false, tls_params: None },
        Addr::Tcp { host, port } => ConnectionAddr::Tcp(host.clone(), *port),
        Addr::Unix(path) => ConnectionAddr::Unix(path.clone()),
    };
    let redis = RedisConnectionInfo { db: ep.db, username: ep.user.clone(), password: ep.password.clone(), ..Default::default() };
    ConnectionInfo { addr, redis }
}

/// Whether the connection that returned `e` must be replaced.
fn fatal(e: &RedisError) -> bool {
    e.is_io_error() || e.is_unrecoverable_error()
}

/// Whether the server closed or reset the connection (a pooled connection to a restarted
/// server): worth one fresh attempt.
fn dropped(e: &RedisError) -> bool {
    e.is_connection_dropped()
}

/// How [`Shared::request`] treats a failed request: `dropped` (the server closed a pooled
/// connection: one fresh attempt), `keep` (the connection is still good: it goes back to the
/// pool; otherwise the server is marked down), and the error's message.
struct Rules<D, K, M> {
    dropped: D,
    keep: K,
    message: M,
}

/// Why [`Shared::fresh_with`] gave no connection.
struct NoConn {
    message: String,
    /// Refused without a connection attempt: the server is marked down.
    at_once: bool,
}

struct Health {
    /// Consecutive failures to reach the server (0: healthy).
    failures: u32,
    /// No new connection is tried before this.
    until: Instant,
    /// A lookup is trying to reconnect; the others fail at once.
    probing: bool,
}

enum Op {
    Put(PageId, Vec<u8>),
    Remove(PageId),
    Flush(mpsc::Sender<()>),
}

/// What the writer believes this client stores: the budget's FIFO of (page, bytes).
struct Ledger {
    limit: u64,
    stored: u64,
    seq: u64,
    /// Page -> (bytes, sequence number of its newest FIFO entry).
    pages: HashMap<PageId, (u64, u64)>,
    /// Oldest first; entries whose sequence number is not the page's current one are stale.
    fifo: VecDeque<(PageId, u64)>,
}

impl Ledger {
    fn new(limit: u64) -> Ledger {
        Ledger { limit, stored: 0, seq: 0, pages: HashMap::new(), fifo: VecDeque::new() }
    }

    fn stored(&mut self, pid: PageId, bytes: u64) {
        self.seq += 1;
        if let Some((old, _)) = self.pages.insert(pid, (bytes, self.seq)) {
            self.stored -= old;
        }
        self.stored += bytes;
        self.fifo.push_back((pid, self.seq));
        if self.fifo.len() > 2 * self.pages.len() + 1024 {
            let pages = &self.pages;
            self.fifo.retain(|(p, s)| pages.get(p).is_some_and(|e| e.1 == *s));
        }
    }

    fn removed(&mut self, pid: PageId) -> Option<u64> {
        let (bytes, _) = self.pages.remove(&pid)?;
        self.stored -= bytes;
        Some(bytes)
    }

    /// The oldest page to delete while over the budget.
    fn over_budget(&mut self) -> Option<(PageId, u64)> {
        while self.stored > self.limit {
            let (pid, seq) = self.fifo.pop_front()?;
            if self.pages.get(&pid).is_some_and(|e| e.1 == seq) {
                return self.removed(pid).map(|b| (pid, b));
            }
        }
        None
    }
}

struct Shared {
    config: RemoteConfig,
    url: String,
    client: Client,
    counters: Counters,
    queued: AtomicU64,
    closing: AtomicBool,
    pool: Mutex<Vec<Conn>>,
    /// The lookup fast path's address and handshake: single servers without TLS only.
    raw: Option<(Addr, Handshake)>,
    /// Its idle connections.
    raw_pool: Mutex<Vec<RawConn>>,
    health: Mutex<Health>,
}

impl Shared {
    fn password(&self) -> Option<&str> {
        self.config.endpoint.password.as_deref()
    }

    fn message(&self, e: &RedisError) -> String {
        scrub(format!("{}: {e}", self.url), self.password())
    }

    /// Opens a connection with the configured timeouts.
    fn open(&self) -> RedisResult<Conn> {
        let response = Some(self.config.response_timeout);
        match &self.client {
            Client::Single(client) => {
                let c = client.get_connection_with_timeout(self.config.connect_timeout)?;
                c.set_read_timeout(response)?;
                c.set_write_timeout(response)?;
                Ok(Conn::Single(c))
            }
            Client::Cluster(client) => {
                let c = client.get_connection()?;
                c.set_read_timeout(response)?;
                c.set_write_timeout(response)?;
                Ok(Conn::Cluster(Box::new(c)))
            }
        }
    }

    /// A new connection made by `open`, unless the server is known to be down.
    fn fresh_with<C>(&self, open: impl FnOnce() -> Result<C, String>) -> Result<C, NoConn> {
        {
            let mut h = lock(&self.health);
            if h.failures > 0 {
                if h.probing || Instant::now() < h.until {
                    let message = format!("{}: server unreachable (retrying every {:?})", self.url, self.config.retry_interval);
                    return Err(NoConn { message, at_once: true });
                }
                h.probing = true;
            }
        }
        let opened = open();
        let mut h = lock(&self.health);
        h.probing = false;
        match opened {
            Ok(c) => {
                if h.failures > 0 {
                    add(&self.counters.reconnects, 1);
                }
                h.failures = 0;
                Ok(c)
            }
            Err(message) => {
                h.failures += 1;
                h.until = Instant::now() + self.config.retry_interval;
                Err(NoConn { message, at_once: false })
            }
        }
    }

    fn mark_down(&self) {
        {
            let mut h = lock(&self.health);
            h.failures = h.failures.max(1);
            h.until = Instant::now() + self.config.retry_interval;
        }
        lock(&self.pool).clear();
        lock(&self.raw_pool).clear();
    }

    /// A connection for one request: an idle one of `pool` (then `true`), else a fresh one
    /// made by `open` unless the server is known to be down (counted as failed at once).
    fn checkout<C>(&self, pool: &Mutex<Vec<C>>, open: impl FnOnce() -> Result<C, String>) -> Result<(C, bool), String> {
        if let Some(c) = lock(pool).pop() {
            return Ok((c, true));
        }
        match self.fresh_with(open) {
            Ok(c) => Ok((c, false)),
            Err(no) => {
                if no.at_once {
                    add(&self.counters.gets_failed_fast, 1);
                }
                Err(no.message)
            }
        }
    }

    /// Gives a healthy connection back to `pool` (kept while it has fewer than
    /// [`MAX_IDLE`]).
    fn checkin<C>(pool: &Mutex<Vec<C>>, conn: C) {
        let mut pool = lock(pool);
        if pool.len() < MAX_IDLE {
            pool.push(conn);
        }
    }

    /// Runs a lookup command: on a pooled connection if there is one (once more on a fresh
    /// one if the pooled one was closed by the server), else on a fresh one.
    fn lookup(&self, cmd: &Cmd) -> Result<Value, String> {
        self.lookup_with(|conn| conn.query(cmd))
    }

    /// [`lookup`](Self::lookup) for any request (a pipeline of lookups).
    fn lookup_with<T>(&self, run: impl Fn(&mut Conn) -> RedisResult<T>) -> Result<T, String> {
        let rules = Rules { dropped, keep: |e: &RedisError| !fatal(e), message: |e: &RedisError| self.message(e) };
        self.request(&self.pool, || self.open().map_err(|e| self.message(&e)), run, rules)
    }

    /// One request on a connection of `pool` (made by `open` when none is idle), with the
    /// health rules of both kinds of connection: a pooled connection the server closed gets
    /// one fresh attempt; an error `rules.keep` accepts (an error reply) gives the
    /// connection back, any other marks the server down.
    fn request<C, T, E>(
        &self,
        pool: &Mutex<Vec<C>>,
        open: impl Fn() -> Result<C, String>,
        mut run: impl FnMut(&mut C) -> Result<T, E>,
        rules: Rules<impl Fn(&E) -> bool, impl Fn(&E) -> bool, impl Fn(&E) -> String>,
    ) -> Result<T, String> {
        let (mut conn, was_pooled) = self.checkout(pool, &open)?;
        let mut result = run(&mut conn);
        if was_pooled && result.as_ref().err().is_some_and(&rules.dropped) {
            lock(pool).clear();
            conn = self.fresh_with(&open).map_err(|no| no.message)?;
            add(&self.counters.reconnects, 1);
            result = run(&mut conn);
        }
        match result {
            Ok(v) => {
                Self::checkin(pool, conn);
                Ok(v)
            }
            Err(e) => {
                if (rules.keep)(&e) {
                    Self::checkin(pool, conn);
                } else {
                    self.mark_down();
                }
                Err((rules.message)(&e))
            }
        }
    }

    /// A new connection of the lookup fast path.
    fn open_raw(&self, addr: &Addr, hs: &Handshake) -> Result<RawConn, String> {
        RawConn::open(addr, hs, self.config.connect_timeout, self.config.response_timeout).map_err(|e| self.raw_message(&e))
    }

    fn raw_message(&self, e: &RawError) -> String {
        scrub(format!("{}: {}", self.url, e.message()), self.password())
    }

    /// [`lookup_with`](Self::lookup_with) on the fast path's connections (the same health
    /// rules: a pooled connection the server closed gets one fresh attempt; an I/O failure
    /// or a reply out of step marks the server down; an error reply keeps the connection).
    fn raw_lookup<T>(&self, addr: &Addr, hs: &Handshake, run: impl FnMut(&mut RawConn) -> Result<T, RawError>) -> Result<T, String> {
        let rules = Rules {
            dropped: |e: &RawError| matches!(e, RawError::Dropped(_)),
            keep: |e: &RawError| matches!(e, RawError::Reply(_)),
            message: |e: &RawError| self.raw_message(e),
        };
        self.request(&self.raw_pool, || self.open_raw(addr, hs), run, rules)
    }

    /// The writer thread: drains the queue in batches until the tier is dropped.
    fn run_writer(&self, rx: mpsc::Receiver<Op>) {
        let mut conn: Option<Conn> = None;
        let mut next_attempt = Instant::now();
        let mut was_down = false;
        let mut ledger = Ledger::new(self.config.budget);
        let mut batch: Vec<Op> = Vec::new();
        while let Ok(first) = rx.recv() {
            let op_bytes = |op: &Op| match op {
                Op::Put(_, img) => img.len() as u64,
                _ => 0,
            };
            let mut bytes = op_bytes(&first);
            batch.push(first);
            while bytes < MAX_BATCH_BYTES && batch.len() < MAX_BATCH_OPS {
                match rx.try_recv() {
                    Ok(op) => {
                        bytes += op_bytes(&op);
                        batch.push(op);
                    }
                    Err(_) => break,
                }
            }
            let puts = batch.iter().filter(|op| matches!(op, Op::Put(..))).count() as u64;
            let closing = self.closing.load(Ordering::Relaxed);
            if !closing && conn.is_none() && Instant::now() >= next_attempt {
                match self.open() {
                    Ok(c) => {
                        if was_down {
                            add(&self.counters.reconnects, 1);
                        }
                        was_down = false;
                        conn = Some(c);
                    }
                    Err(_) => {
                        was_down = true;
                        next_attempt = Instant::now() + self.config.retry_interval;
                    }
                }
            }
            match conn.as_mut().filter(|_| !closing) {
                Some(c) => {
                    let (pipe, sent) = self.build_batch(&batch, &mut ledger);
                    let mut result = pipe.as_ref().map_or(Ok(()), |p| p.exec(c));
                    if let (Err(e), Some(p)) = (&result, &pipe) {
                        // The server closed the connection (restarted, or dropped an idle
                        // client): one more try on a fresh one before giving up the batch.
                        if dropped(e) {
                            result = self.open().and_then(|mut fresh| {
                                p.exec(&mut fresh)?;
                                *c = fresh;
                                add(&self.counters.reconnects, 1);
                                Ok(())
                            });
                        }
                    }
                    match result {
                        Ok(()) => {
                            add(&self.counters.bytes_sent, sent);
                            add(&self.counters.pages_sent, puts);
                        }
                        Err(e) => {
                            add(&self.counters.write_errors, 1);
                            add(&self.counters.dropped_offline, puts);
                            if fatal(&e) {
                                conn = None;
                                was_down = true;
                                next_attempt = Instant::now() + self.config.retry_interval;
                            }
                        }
                    }
                }
                None => add(&self.counters.dropped_offline, puts),
            }
            self.counters.stored_bytes.store(ledger.stored, Ordering::Relaxed);
            self.counters.stored_pages.store(ledger.pages.len() as u64, Ordering::Relaxed);
            self.queued.fetch_sub(bytes, Ordering::Relaxed);
            for op in batch.drain(..) {
                if let Op::Flush(done) = op {
                    let _ = done.send(());
                }
            }
        }
    }

    /// The pipeline for one batch (`None`: nothing to send) and the page bytes it stores.
    /// The ledger is updated as if it succeeds: a page whose `SET` fails stays counted until
    /// the budget deletes it (deleting a missing key is harmless), so the budget errs on the
    /// side of deleting early.
    fn build_batch(&self, batch: &[Op], ledger: &mut Ledger) -> (Option<Pipe>, u64) {
        let prefix = &self.config.prefix;
        let mut pipe = Pipe::new(self.config.endpoint.cluster);
        let mut empty = true;
        let unlink = |pipe: &mut Pipe, pid: PageId, bytes: u64| {
            for chunk in 0..chunk_count(bytes as usize) {
                let mut cmd = redis::cmd("UNLINK");
                cmd.arg(object_key(prefix, pid, chunk));
                pipe.add(cmd);
            }
        };
        let mut sent = 0u64;
        for op in batch {
            match op {
                Op::Put(pid, image) => {
                    for (chunk, part) in image.chunks(CHUNK_SIZE).enumerate() {
                        let mut cmd = redis::cmd("SET");
                        cmd.arg(object_key(prefix, *pid, chunk)).arg(part);
                        pipe.add(cmd);
                        empty = false;
                    }
                    ledger.stored(*pid, image.len() as u64);
                    sent += image.len() as u64;
                }
                Op::Remove(pid) => {
                    // Only pages this client stored (and has not deleted since) have objects.
                    if let Some(bytes) = ledger.removed(*pid) {
                        unlink(&mut pipe, *pid, bytes);
                        empty = false;
                    }
                }
                Op::Flush(_) => {}
            }
        }
        let mut evicted = 0;
        while let Some((pid, bytes)) = ledger.over_budget() {
            unlink(&mut pipe, pid, bytes);
            evicted += 1;
            empty = false;
        }
        add(&self.counters.budget_evictions, evicted);
        ((!empty).then_some(pipe), sent)
    }
}

/// A second memory tier in Valkey/Redis: see the [crate documentation](crate).
pub struct RedisTier {
    shared: Arc<Shared>,
    tx: Option<mpsc::Sender<Op>>,
    writer: Option<JoinHandle<()>>,
}

impl RedisTier {
    /// Connects, authenticates and `PING`s the server (for a cluster: reads the slot map and
    /// checks `cluster_state:ok`), then starts the writer thread. A wrong password, an
    /// unreachable server or a cluster that is not ready is a [`RemoteError`] here, not a
    /// stream of lookup errors later.
    pub fn connect(config: RemoteConfig) -> Result<RedisTier, RemoteError> {
        config.validate()?;
        #[cfg(feature = "tls")]
        if config.endpoint.tls {
            // The redis crate's rustls needs a process-wide crypto provider; another one
            // installed first is fine too.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        let url = config.redacted_url();
        let password = config.endpoint.password.clone();
        let fail = |e: RedisError| classify(&e, url.clone(), password.as_deref());
        let ep = &config.endpoint;
        #[cfg(feature = "tls")]
        let certs = match &config.tls_ca {
            Some(path) if ep.tls => {
                let pem = std::fs::read(path)
                    .map_err(|e| RemoteError::InvalidConfig { url: url.clone(), reason: format!("cannot read the TLS CA file {}: {e}", path.display()) })?;
                Some(redis::TlsCertificates { client_tls: None, root_cert: Some(pem) })
            }
            _ => None,
        };
        let client = if ep.cluster {
            let nodes: Vec<ConnectionInfo> = ep.nodes.iter().map(|a| connection_info(ep, a)).collect();
            #[allow(unused_mut)]
            let mut builder = redis::cluster::ClusterClientBuilder::new(nodes)
                .connection_timeout(config.connect_timeout)
                .response_timeout(config.response_timeout)
                // Few, short retries (MOVED/ASK after a resharding; the defaults wait seconds).
                .retries(2)
                .min_retry_wait(10)
                .max_retry_wait(100);
            #[cfg(feature = "tls")]
            if let Some(certs) = certs {
                builder = builder.certs(certs);
            }
            Client::Cluster(builder.build().map_err(fail)?)
        } else {
            let info = connection_info(ep, &ep.nodes[0]);
            #[cfg(feature = "tls")]
            if let Some(certs) = certs {
                return RedisTier::start(config, Client::Single(redis::Client::build_with_tls(info, certs).map_err(fail)?));
            }
            Client::Single(redis::Client::open(info).map_err(fail)?)
        };
        RedisTier::start(config, client)
    }

    /// Checks the server and starts the writer.
    fn start(config: RemoteConfig, client: Client) -> Result<RedisTier, RemoteError> {
        let url = config.redacted_url();
        let password = config.endpoint.password.clone();
        let fail = |e: RedisError| classify(&e, url.clone(), password.as_deref());
        let health = Health { failures: 0, until: Instant::now(), probing: false };
        let ep = &config.endpoint;
        let raw = (!ep.cluster && !ep.tls).then(|| {
            let hs = Handshake { user: ep.user.clone(), password: ep.password.clone(), db: ep.db };
            (ep.nodes[0].clone(), hs)
        });
        let shared = Arc::new(Shared {
            url: url.clone(),
            client,
            counters: Counters::default(),
            queued: AtomicU64::new(0),
            closing: AtomicBool::new(false),
            pool: Mutex::new(Vec::new()),
            raw,
            raw_pool: Mutex::new(Vec::new()),
            health: Mutex::new(health),
            config,
        });
        let mut conn = shared.open().map_err(fail)?;
        let pong = conn.query(&redis::cmd("PING")).map_err(fail)?;
        if !matches!(&pong, Value::SimpleString(s) if s == "PONG") {
            return Err(RemoteError::Server { url, reason: format!("unexpected reply to PING: {}", describe(&pong)) });
        }
        if shared.config.endpoint.cluster {
            let info = conn.query(redis::cmd("CLUSTER").arg("INFO")).map_err(fail)?;
            let text = match &info {
                Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                Value::VerbatimString { text, .. } => text.clone(),
                other => describe(other),
            };
            if !text.lines().any(|l| l.trim() == "cluster_state:ok") {
                let state = text.lines().find(|l| l.starts_with("cluster_state:")).unwrap_or("no cluster_state").trim().to_owned();
                return Err(RemoteError::Server { url, reason: format!("the cluster is not ready ({state})") });
            }
        }
        Shared::checkin(&shared.pool, conn);
        let (tx, rx) = mpsc::channel();
        let writer_shared = shared.clone();
        let writer = std::thread::Builder::new()
            .name("strata-remote-writer".into())
            .spawn(move || writer_shared.run_writer(rx))
            .map_err(|e| RemoteError::Connect { url, reason: format!("cannot start the writer thread: {e}") })?;
        Ok(RedisTier { shared, tx: Some(tx), writer: Some(writer) })
    }

    /// The configuration it was opened with.
    pub fn config(&self) -> &RemoteConfig {
        &self.shared.config
    }

    /// The server's URL with the password replaced by `***`.
    pub fn url(&self) -> &str {
        &self.shared.url
    }

    /// All counters of this client.
    pub fn counters(&self) -> TierCounters {
        let c = &self.shared.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        TierCounters {
            bytes_sent: get(&c.bytes_sent),
            bytes_received: get(&c.bytes_received),
            pages_sent: get(&c.pages_sent),
            dropped_full: get(&c.dropped_full),
            dropped_offline: get(&c.dropped_offline),
            write_errors: get(&c.write_errors),
            get_errors: get(&c.get_errors),
            gets_failed_fast: get(&c.gets_failed_fast),
            reconnects: get(&c.reconnects),
            budget_evictions: get(&c.budget_evictions),
            stored_bytes: get(&c.stored_bytes),
            stored_pages: get(&c.stored_pages),
            queued_bytes: get(&self.shared.queued),
        }
    }

    /// The lookup of one page: GET, or MGET of its chunks.
    fn lookup_cmd(&self, pid: PageId, len: usize) -> Cmd {
        let n = chunk_count(len);
        let mut cmd = redis::cmd(if n == 1 { "GET" } else { "MGET" });
        for chunk in 0..n {
            cmd.arg(object_key(&self.shared.config.prefix, pid, chunk));
        }
        cmd
    }

    /// The page image in a lookup's reply. Any missing chunk makes the page missing
    /// (`Ok(None)`). Chunks of an unexpected length are returned concatenated as they are:
    /// the core then rejects the image (and counts it as rejected, which makes damage visible
    /// instead of passing for a miss).
    fn image(&self, reply: Value, len: usize) -> Result<Option<Vec<u8>>, String> {
        let shared = &self.shared;
        let n = chunk_count(len);
        let fail = |msg: String| {
            add(&shared.counters.get_errors, 1);
            Err(msg)
        };
        let image = match reply {
            Value::Nil => return Ok(None),
            Value::BulkString(b) if n == 1 => b,
            Value::Array(parts) if n > 1 && parts.len() == n => {
                let mut out = Vec::with_capacity(len);
                for part in parts {
                    match part {
                        Value::Nil => return Ok(None),
                        Value::BulkString(b) => out.extend_from_slice(&b),
                        other => return fail(format!("{}: unexpected reply to MGET: {}", shared.url, describe(&other))),
                    }
                }
                out
            }
            other => return fail(format!("{}: unexpected reply to a lookup: {}", shared.url, describe(&other))),
        };
        add(&shared.counters.bytes_received, image.len() as u64);
        Ok(Some(image))
    }

    /// Waits until everything queued before this call has been written (or dropped), at most
    /// `timeout`; false if that did not happen in time. For tests, benchmarks and shutdown.
    pub fn flush(&self, timeout: Duration) -> bool {
        let (done, wait) = mpsc::channel();
        match &self.tx {
            Some(tx) if tx.send(Op::Flush(done)).is_ok() => wait.recv_timeout(timeout).is_ok(),
            _ => false,
        }
    }
}

/// A short description of a reply (never its bytes).
fn describe(v: &Value) -> String {
    match v {
        Value::Nil => "nil".into(),
        Value::Int(i) => format!("integer {i}"),
        Value::BulkString(b) => format!("{} bytes", b.len()),
        Value::SimpleString(s) => format!("{s:?}"),
        Value::Okay => "OK".into(),
        Value::Array(a) => format!("array of {}", a.len()),
        _ => "an unexpected reply".into(),
    }
}

impl RemoteTier for RedisTier {
    fn put(&self, pid: PageId, image: &[u8]) {
        let c = &self.shared.counters;
        let len = image.len() as u64;
        let before = self.shared.queued.fetch_add(len, Ordering::Relaxed);
        if before + len > self.shared.config.queue {
            self.shared.queued.fetch_sub(len, Ordering::Relaxed);
            add(&c.dropped_full, 1);
            return;
        }
        let sent = self.tx.as_ref().is_some_and(|tx| tx.send(Op::Put(pid, image.to_vec())).is_ok());
        if !sent {
            self.shared.queued.fetch_sub(len, Ordering::Relaxed);
            add(&c.dropped_offline, 1);
        }
    }

    /// See `RedisTier::image` for what a reply becomes.
    fn get(&self, pid: PageId, len: usize) -> Result<Option<Vec<u8>>, String> {
        match self.shared.lookup(&self.lookup_cmd(pid, len)) {
            Ok(reply) => self.image(reply, len),
            Err(msg) => {
                add(&self.shared.counters.get_errors, 1);
                Err(msg)
            }
        }
    }

    /// Single servers without TLS: the fast path of the `raw` module (the payload read
    /// straight into `dst`); otherwise `get` and a copy.
    fn get_into(&self, pid: PageId, mut dst: IoBufMut<'_>) -> Result<Fetched, String> {
        let shared = &self.shared;
        let Some((addr, hs)) = &shared.raw else {
            return match self.get(pid, dst.len())? {
                None => Ok(Fetched::Missing),
                Some(image) if image.len() == dst.len() => {
                    dst.copy_from(0, &image);
                    Ok(Fetched::Filled)
                }
                Some(_) => Ok(Fetched::WrongSize),
            };
        };
        match shared.raw_lookup(addr, hs, |conn| conn.get_page(&shared.config.prefix, pid, &mut dst)) {
            Ok(fetched) => {
                if fetched == Fetched::Filled {
                    add(&shared.counters.bytes_received, dst.len() as u64);
                }
                Ok(fetched)
            }
            Err(msg) => {
                add(&shared.counters.get_errors, 1);
                Err(msg)
            }
        }
    }

    /// All lookups in one pipelined round trip.
    fn get_many(&self, pages: &[(PageId, usize)]) -> Vec<Result<Option<Vec<u8>>, String>> {
        let mut pipe = Pipe::new(self.shared.config.is_cluster());
        for &(pid, len) in pages {
            pipe.add(self.lookup_cmd(pid, len));
        }
        match self.shared.lookup_with(|conn| pipe.replies(conn)) {
            Ok(replies) if replies.len() == pages.len() => replies.into_iter().zip(pages).map(|(r, &(_, len))| self.image(r, len)).collect(),
            Ok(replies) => {
                add(&self.shared.counters.get_errors, 1);
                let msg = format!("{}: {} replies to a pipeline of {} lookups", self.shared.url, replies.len(), pages.len());
                pages.iter().map(|_| Err(msg.clone())).collect()
            }
            Err(msg) => {
                add(&self.shared.counters.get_errors, 1);
                pages.iter().map(|_| Err(msg.clone())).collect()
            }
        }
    }

    fn remove(&self, pid: PageId) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(Op::Remove(pid));
        }
    }

    /// Stored as `{prefix}:meta:{name}` with a plain SET on the caller's thread. Under
    /// `allkeys-lru` the server may drop it like any page: the next start is then cold.
    fn put_meta(&self, name: &str, bytes: &[u8]) -> Result<(), String> {
        let mut cmd = redis::cmd("SET");
        cmd.arg(format!("{}:meta:{name}", self.shared.config.prefix)).arg(bytes);
        match self.shared.lookup(&cmd)? {
            Value::Okay => Ok(()),
            other => Err(format!("{}: unexpected reply to SET: {}", self.shared.url, describe(&other))),
        }
    }

    fn get_meta(&self, name: &str) -> Result<Option<Vec<u8>>, String> {
        let mut cmd = redis::cmd("GET");
        cmd.arg(format!("{}:meta:{name}", self.shared.config.prefix));
        match self.shared.lookup(&cmd)? {
            Value::Nil => Ok(None),
            Value::BulkString(b) => Ok(Some(b)),
            other => Err(format!("{}: unexpected reply to GET: {}", self.shared.url, describe(&other))),
        }
    }

    fn sync(&self) -> Result<(), String> {
        if self.flush(Duration::from_secs(30)) {
            Ok(())
        } else {
            Err(format!("{}: queued pages were not written within 30 s", self.shared.url))
        }
    }

    fn stats(&self) -> RemoteStats {
        let c = self.counters();
        RemoteStats { dropped: c.dropped_full + c.dropped_offline, bytes_sent: c.bytes_sent, bytes_received: c.bytes_received, ..RemoteStats::default() }
    }
}

impl fmt::Debug for RedisTier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisTier").field("url", &self.shared.url).field("prefix", &self.shared.config.prefix).finish_non_exhaustive()
    }
}

impl Drop for RedisTier {
    fn drop(&mut self) {
        // Whatever is still queued is discarded: the tier only ever holds copies.
        self.shared.closing.store(true, Ordering::Relaxed);
        drop(self.tx.take());
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::raw::fake::{bulk, image, Act, Fake};
    use std::sync::atomic::AtomicUsize;

    /// A fake server that answers the redis crate's handshake and `GET`s: the `GET`s whose
    /// number is in `cut` get half a reply and a closed connection.
    fn fake_server(img: Vec<u8>, cut: &'static [usize]) -> (Fake, Arc<AtomicUsize>) {
        let gets = Arc::new(AtomicUsize::new(0));
        let seen = gets.clone();
        let fake = Fake::start(move |_, args| match args[0].to_ascii_uppercase().as_slice() {
            b"PING" => Act::Reply(b"+PONG\r\n".to_vec(), 0),
            b"GET" => {
                let reply = bulk(&img);
                if cut.contains(&seen.fetch_add(1, Ordering::SeqCst)) {
                    Act::ReplyClose(reply[..reply.len() / 2].to_vec())
                } else {
                    Act::Reply(reply, 0)
                }
            }
            _ => Act::Reply(b"+OK\r\n".to_vec(), 0),
        });
        (fake, gets)
    }

    #[test]
    fn lookups_reconnect_after_a_connection_dropped_mid_reply() {
        const LEN: usize = 64 << 10;
        let img = image(LEN, 3);
        // GET 0 (a fresh connection) and GET 2 (a pooled one) are cut off.
        let (fake, gets) = fake_server(img.clone(), &[0, 2]);
        let retry = Duration::from_millis(300);
        let config = RemoteConfig::new(&format!("unix://{}", fake.path.display())).unwrap().retry_interval(retry);
        let tier = RedisTier::connect(config).unwrap();
        let pid = PageId::from_raw(7);
        let mut dst = vec![0u8; LEN];
        let get = |dst: &mut Vec<u8>| tier.get_into(pid, IoBufMut::from_slice(dst));

        // Cut off on a fresh connection: an error, and the server counts as down...
        assert!(get(&mut dst).is_err());
        let start = Instant::now();
        // ...so the next lookup fails at once (unless the retry interval has passed).
        let fast = get(&mut dst);
        if start.elapsed() < retry {
            assert!(fast.is_err());
            assert_eq!(tier.counters().gets_failed_fast, 1);
        }
        std::thread::sleep(retry + Duration::from_millis(50));
        assert_eq!(get(&mut dst), Ok(Fetched::Filled));
        assert!(dst == img);
        let c = tier.counters();
        assert!(c.reconnects >= 1 && c.get_errors >= 1, "{c:?}");
        assert_eq!(gets.load(Ordering::SeqCst), 2);

        // Cut off on a pooled connection: one fresh attempt in the same lookup, which works.
        dst.fill(0);
        assert_eq!(get(&mut dst), Ok(Fetched::Filled));
        assert!(dst == img);
        assert_eq!(gets.load(Ordering::SeqCst), 4);
        assert_eq!(tier.counters().reconnects, c.reconnects + 1);
        assert_eq!(tier.counters().bytes_received, 2 * LEN as u64);
    }

    #[test]
    fn keys_and_chunks() {
        let pid = PageId::from_raw(0x2a_0000_0000_0007);
        assert_eq!(object_key("db", pid, 3), "db:{2a000000000007}:3");
        assert_eq!(chunk_count(4096), 1);
        assert_eq!(chunk_count(CHUNK_SIZE), 1);
        assert_eq!(chunk_count(2 * CHUNK_SIZE), 2);
        assert_eq!(chunk_count(2 * CHUNK_SIZE + 1), 3);
    }

    #[test]
    fn ledger_deletes_oldest_first() {
        let p = PageId::from_raw;
        let mut l = Ledger::new(300);
        l.stored(p(1), 100);
        l.stored(p(2), 100);
        l.stored(p(3), 100);
        assert_eq!(l.over_budget(), None);
        l.stored(p(1), 100); // re-stored: now the newest
        l.stored(p(4), 100);
        assert_eq!(l.over_budget(), Some((p(2), 100)));
        assert_eq!(l.over_budget(), None);
        assert_eq!(l.removed(p(3)), Some(100));
        assert_eq!(l.removed(p(3)), None);
        l.stored(p(5), 100);
        l.stored(p(6), 100);
        assert_eq!(l.over_budget(), Some((p(1), 100)));
        assert_eq!(l.stored, 300);
        // Stale FIFO entries are compacted away.
        let mut l = Ledger::new(u64::MAX);
        for _ in 0..10_000 {
            l.stored(p(9), 1);
        }
        assert!(l.fifo.len() <= 1026);
    }
}
