//! A second memory tier for strata in Valkey or Redis: clean page images that leave the
//! buffer pool are copied to a server (or a Redis Cluster) on other machines, and misses try
//! there before the disk.
//!
//! ```no_run
//! use std::sync::Arc;
//! use strata_remote::{prefix_for_dir, RedisTier, RemoteConfig};
//!
//! let dir = std::path::Path::new("/data/db");
//! let remote = RemoteConfig::new("redis://cache:secret@10.1.2.3:6379")?.prefix(prefix_for_dir(dir)).budget(8 << 30);
//! let tier = Arc::new(RedisTier::connect(remote)?); // fails at once on a wrong password
//! let db = strata::Database::open(strata::Config::new(dir).remote_tier(tier.clone()))?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # What the core guarantees, and what is left here
//!
//! The core (`strata::buffer::RemoteTier`) only offers images of *clean* pages (also on
//! disk), remembers each image's checksum, and verifies whatever [`RedisTier`]'s `get` returns
//! (checksum, page id, and the checksum of the page's current version). So this crate never
//! decides what is stale, and a server that evicts, restarts, is flushed, tampered with or
//! shared by another database costs speed, never correctness. What it must do: never block
//! the evicting thread ([`put`](strata::buffer::RemoteTier::put) and `remove` only queue), and
//! fail fast when the server is gone.
//!
//! # Objects
//!
//! A page of up to [`CHUNK_SIZE`] (1 MiB) is one string value; a larger one is split into
//! 1 MiB chunks. Chunk `n` of page `pid` is stored under `{prefix}:{<pid hex>}:<n>`
//! ([`object_key`]): the braces are a Redis Cluster hash tag, so all chunks of a page live in
//! one slot and one `MGET` reads them. A lookup with any chunk missing is a miss (`Ok(None)`);
//! chunks of an unexpected length are returned as they are and the core rejects the image
//! (counted as `rejected`, so damage is visible, unlike a miss).
//!
//! # Writes, budget, failures
//!
//! `put` copies the image into a channel (dropped and counted when more than the `queue`
//! setting's bytes are waiting); one writer thread drains it in batches of up to 4 MiB and
//! sends each batch as one pipeline of `SET`s, with `UNLINK`s for removed pages. The writer
//! keeps a FIFO of the pages it stored; over the `budget`, it deletes the oldest first. The
//! budget counts image bytes as this client sees them (the server adds about 100 bytes per
//! object, and may itself evict or lose objects); size the server's `maxmemory` with
//! `allkeys-lru` as the hard limit.
//!
//! Lookups run on the caller's thread (one `GET`, or `MGET` for chunks) on pooled
//! connections with a response timeout (500 ms by default). A pool miss's lookup on a single
//! server over TCP or a unix socket speaks RESP itself and reads the reply's payload straight
//! into the page's frame (no intermediate buffer, no copy); over TLS or on a cluster it goes
//! through the redis crate (which follows `MOVED`/`ASK`) and is copied once. When a connection fails, the
//! server is marked down: for the retry interval (200 ms) lookups fail at once, then one
//! caller probes while the others keep failing. The writer meanwhile discards what it takes
//! from the queue and reconnects at most once per interval; once the server is back, both
//! resume by themselves. Counters: [`RedisTier::counters`], and `bytes_sent`,
//! `bytes_received` and `dropped` (queue full or server down) in the core's `stats().remote`.
//!
//! # Secrets
//!
//! Passwords never appear in `Debug`, `Display` or error messages: URLs are shown as
//! `redis://user:***@host:port`, and reasons from the redis client are scrubbed.
//!
//! # TLS
//!
//! `rediss://` and `rediss+cluster://` need the `tls` cargo feature (off by default, so
//! that default builds and CI do not compile rustls and ring):
//! `cargo build -p strata-remote --features tls`, or
//! `strata-remote = { path = "...", features = ["tls"] }` in a dependent crate. Server
//! certificates are verified against the system's roots (`SSL_CERT_FILE` and `SSL_CERT_DIR`
//! are honoured), or only against a private CA given with `RemoteConfig::tls_ca_file`. Its
//! test: `cargo test --release -p strata-remote --features tls --test tls`.
//!
//! # Choices
//!
//! * [`redis`] 0.32, sync API: the newest line whose minimum Rust (1.80) matches the
//!   workspace's, and the sync client needs no async runtime in a library whose callers are
//!   plain threads. Features: `cluster` (the sync cluster client, which follows `MOVED`/`ASK`
//!   and routes `MGET` of one hash tag to its node) and `tcp_nodelay` (no Nagle delay on
//!   small replies). Default features off: streams, geo, scripting are not used.
//! * `std::sync::mpsc` for the put queue: since Rust 1.72 its `Sender` is `Sync` and its
//!   implementation is crossbeam's, so `crossbeam-channel` would add a dependency for
//!   nothing; the byte limit is an atomic counter beside it.
//! * [`thiserror`] for [`RemoteError`], as in the core.
//! * With `tls`: the redis crate's rustls, and `rustls` itself only to install the `ring`
//!   crypto provider (no cmake or nasm needed, unlike aws-lc-rs).
//!
//! # Tests
//!
//! The integration tests start private servers (`valkey-server` if it is on PATH, else
//! `redis-server`, and `redis-cli --cluster create` for a 3-node cluster on loopback); they
//! fail, saying so, when neither is installed.

mod config;
mod error;
mod raw;
mod tier;

pub use config::{
    prefix_for_dir, RemoteConfig, DEFAULT_CONNECT_TIMEOUT, DEFAULT_PORT, DEFAULT_PREFIX, DEFAULT_QUEUE, DEFAULT_RESPONSE_TIMEOUT, DEFAULT_RETRY_INTERVAL,
};
pub use error::RemoteError;
pub use tier::{chunk_count, object_key, RedisTier, TierCounters, CHUNK_SIZE};
