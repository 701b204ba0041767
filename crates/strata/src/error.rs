//! The library's one error type. Every message names the problem and, where there is one,
//! what to do about it (modelled on DuckDB's buffer-manager messages).

use std::io;
use std::path::PathBuf;

use crate::storage::PageId;
use crate::util::Bytes;

/// Result alias used throughout the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in strata.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An operating-system I/O call failed.
    #[error("I/O error during {op} on {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    /// The disk is full; the operation was abandoned and nothing already stored was lost.
    #[error("disk full while writing {}: free some space and retry", path.display())]
    DiskFull { path: PathBuf },

    /// The directory does not hold a strata database.
    #[error("{} is not a strata database (no valid meta file); create one with `strata create`", path.display())]
    NotADatabase { path: PathBuf },

    /// Another open of the database (in this or another process) holds its directory lock.
    #[error(
        "database {} is in use by {}: only one process may open a database at a time; wait for it to finish (or stop it) and retry",
        dir.display(),
        pid.map(|p| format!("process {p}")).unwrap_or_else(|| "another process".to_owned())
    )]
    Locked { dir: PathBuf, pid: Option<u32> },

    /// Read-only opens (`strata stats`, `check`, `dump`) hold the database's directory lock
    /// shared; a writer is refused while they run.
    #[error(
        "database {} is in use by read-only processes (strata stats, check or dump): only one process may open a database at a time for writing; wait for them to finish and retry",
        dir.display()
    )]
    LockedByReaders { dir: PathBuf },

    /// A read-only open found work for recovery (log records after the last checkpoint, or
    /// pages of an unfinished double-write batch): it changes nothing, so it cannot go on.
    #[error("database {} needs recovery ({reason}); read-only commands never change a database: run `strata recover {}` first", dir.display(), dir.display())]
    RecoveryPending { dir: PathBuf, reason: String },

    /// A change was asked of a database opened read-only.
    #[error("database {} is open read-only: {op} is not allowed", dir.display())]
    ReadOnly { dir: PathBuf, op: &'static str },

    /// `create` refuses to overwrite.
    #[error("{} already holds a database or other files; refusing to overwrite", path.display())]
    AlreadyExists { path: PathBuf },

    /// The database was written by a newer format version.
    #[error("{} has format version {found}, this build reads up to {supported}", path.display())]
    UnsupportedVersion { path: PathBuf, found: u32, supported: u32 },

    /// A page, the meta file, the allocation table or the catalog failed verification.
    #[error("corruption in {}{}: {reason}", file.display(), page.map(|p| format!(" at page {p}")).unwrap_or_default())]
    Corruption { file: PathBuf, page: Option<PageId>, reason: String },

    /// The configuration is not usable.
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),

    /// A page id that is out of range, was never allocated, or has been freed.
    #[error("invalid page id {pid}: {reason}")]
    InvalidPageId { pid: PageId, reason: &'static str },

    /// The pool cannot hold even the requested page (plus the buffer manager's metadata).
    #[error("pool too small: {} needed, pool is {}; raise the pool size", Bytes(*needed), Bytes(*pool))]
    PoolTooSmall { needed: u64, pool: u64 },

    /// Every resident page is pinned and none was released within the wait.
    #[error(
        "out of memory: could not make room for {} in the buffer pool ({} of {} in use, {} pinned by live guards, waited {waited_ms} ms); \
         release page guards sooner or raise the pool size (--pool / set_pool_size)",
        Bytes(*requested), Bytes(*used), Bytes(*limit), Bytes(*pinned)
    )]
    OutOfMemory { requested: u64, used: u64, limit: u64, pinned: u64, waited_ms: u64 },

    /// A named object (column, graph) does not exist.
    #[error("no {kind} named {name:?} in this database")]
    NotFound { kind: &'static str, name: String },

    /// Input given by the user is malformed.
    #[error("invalid input: {0}")]
    InvalidInput(String),

    /// An earlier write or fsync of the write-ahead log failed; no change is accepted until
    /// the database is reopened (which recovers it to its last durable state).
    #[error("the write-ahead log failed earlier ({0}); no further changes are accepted: reopen the database to recover")]
    LogFailed(String),

    /// A transaction waited too long for a page another transaction holds; it should abort
    /// and retry.
    #[error("lock wait on page {pid} timed out after {waited_ms} ms (held by another transaction): abort and retry")]
    LockTimeout { pid: PageId, waited_ms: u64 },

    /// Transaction `txid` asked for the lock of `pid`, and waiting for it would have closed
    /// a cycle of transactions each waiting for the next (`cycle`: `txid` first, each
    /// waiting for the one after it, the last for `txid`), none of which could ever go on.
    /// The requester was chosen as the victim: it should roll back (which releases its
    /// locks and lets the others go on) and retry.
    #[error(
        "deadlock: transaction {txid} waiting for page {pid} would close the waits-for cycle {}; \
         it was chosen as the victim: roll it back and retry",
        Cycle(cycle)
    )]
    Deadlock { pid: PageId, txid: u64, cycle: Vec<u64> },

    /// The transaction can no longer be used (it failed or was already ended).
    #[error("transaction {txid} is no longer active: {reason}")]
    TransactionEnded { txid: u64, reason: &'static str },

    /// A SQL query that cannot run: a syntax error, an unknown table or column, a type
    /// error, something not supported yet, or an error while evaluating it (overflow,
    /// division by zero, a bad cast). `pos` is the (line, column), both from 1, of the
    /// part of the query it is about, where known.
    #[error("SQL error{}: {msg}", pos.map(|(l, c)| format!(" at {l}:{c}")).unwrap_or_default())]
    Sql { pos: Option<(u64, u64)>, msg: String },

    /// The structure is internally inconsistent (found by `check`).
    #[error("inconsistent database: {0}")]
    Inconsistent(String),
}

impl Error {
    /// Wraps an I/O error, turning `ENOSPC`/`EDQUOT` into [`Error::DiskFull`].
    pub fn io(op: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        let path = path.into();
        match source.raw_os_error() {
            Some(libc::ENOSPC) | Some(libc::EDQUOT) => Error::DiskFull { path },
            _ => Error::Io { op, path, source },
        }
    }

    /// Whether the error is a lost lock conflict ([`Error::LockTimeout`] or
    /// [`Error::Deadlock`]): nothing is wrong with the transaction's work, another one was
    /// in the way. Roll the transaction back and retry it.
    pub fn is_lock_conflict(&self) -> bool {
        matches!(self, Error::LockTimeout { .. } | Error::Deadlock { .. })
    }

    /// Builds a [`Error::Corruption`].
    pub fn corruption(file: impl Into<PathBuf>, page: Option<PageId>, reason: impl Into<String>) -> Self {
        Error::Corruption { file: file.into(), page, reason: reason.into() }
    }
}

/// Shows a waits-for cycle as `7 -> 9 -> 7` (back to its first transaction).
struct Cycle<'a>(&'a [u64]);

impl std::fmt::Display for Cycle<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for t in self.0 {
            write!(f, "{t} -> ")?;
        }
        match self.0.first() {
            Some(t) => write!(f, "{t}"),
            None => Ok(()),
        }
    }
}
