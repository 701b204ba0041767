//! Durability: the write-ahead log and the bookkeeping that decides how much of it a crash
//! needs, kept apart from the buffer manager's memory management.
//!
//! The buffer manager holds one [`Durability`] and talks to it through a narrow interface:
//!
//! * **WAL before data**: before a page image goes to disk, [`Durability::flush_for`]
//!   makes the log durable up to the page's LSN;
//! * **dirty-page table**: a page that becomes dirty is [noted](Durability::note_dirty)
//!   with the first LSN whose change its disk copy lacks, and [cleared](Durability::page_clean)
//!   when it is written or freed; checkpoints flush [the pages dirty before they
//!   began](Durability::dirty_before);
//! * **transactions**: [`begin`](Durability::begin)/[`end`](Durability::end) keep the table of
//!   active transactions (id -> LSN at which each began), which, with the dirty table, bounds
//!   how far a checkpoint may truncate the log ([`redo_start`](Durability::redo_start));
//! * **checkpoint scheduling**: [`checkpoint_due`](Durability::checkpoint_due) after commits.
//!
//! Transactions ([`crate::txn`]) append their records to [`Durability::wal`] and recovery
//! reads it; the page-level protocol (logged writes, undo, recovery's redo) stays in the
//! buffer layer, which owns the latches.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::error::Result;
use crate::sharded::PageMap;
use crate::storage::wal::Wal;
use crate::storage::PageId;

/// Log bytes between two probes of the file system's free space (see
/// [`Durability::checkpoint_due`]).
const SPACE_PROBE_EVERY: u64 = 256 << 10;

/// Less log than this never triggers a checkpoint for lack of space (no checkpoint storm
/// on a disk that is full for other reasons).
const MIN_SPACE_CHECKPOINT: u64 = 256 << 10;

/// The write-ahead log with its dirty-page table, active transactions and checkpoint state.
pub(crate) struct Durability {
    /// The write-ahead log.
    pub(crate) wal: Wal,
    /// Every dirty persistent page, with the LSN from which the log may hold changes not yet
    /// on its disk copy.
    dirty: PageMap<u64>,
    /// Active transactions: id -> LSN at which they began (log truncation must keep it).
    active: Mutex<BTreeMap<u64, u64>>,
    next_txid: AtomicU64,
    /// The nonce of the last checkpoint (see `CheckpointInfo::nonce`); 0 before the first.
    pub(crate) nonce: AtomicU64,
    /// One checkpoint at a time.
    pub(crate) checkpoint_lock: Mutex<()>,
    /// The log position where the last checkpoint began, and how much log may accumulate
    /// before a commit triggers the next.
    last_checkpoint: AtomicU64,
    checkpoint_every: u64,
    /// The log position at which `checkpoint_due` next asks the file system for its free
    /// space (every [`SPACE_PROBE_EVERY`] bytes of log).
    next_space_probe: AtomicU64,
    /// The start LSN of the checkpoint record on disk (`None` before the first).
    stored_start: Mutex<Option<u64>>,
    /// Whether a persistent page became dirty since the last checkpoint that stored a record
    /// (a checkpoint that finds nothing changed writes nothing, so that closing a database
    /// that was only read needs no free space and keeps every file's bytes and mtime).
    changed: AtomicBool,
}

impl Durability {
    /// Durability over `wal`, whose last checkpoint (if any) started at `stored_start` and
    /// recorded `next_txid` and `nonce`.
    pub(crate) fn new(wal: Wal, stored_start: Option<u64>, next_txid: u64, nonce: u64, checkpoint_every: u64) -> Durability {
        let end = wal.end();
        Durability {
            wal,
            dirty: PageMap::default(),
            active: Mutex::new(BTreeMap::new()),
            next_txid: AtomicU64::new(next_txid),
            nonce: AtomicU64::new(nonce),
            checkpoint_lock: Mutex::new(()),
            last_checkpoint: AtomicU64::new(end),
            checkpoint_every,
            next_space_probe: AtomicU64::new(end),
            stored_start: Mutex::new(stored_start),
            changed: AtomicBool::new(false),
        }
    }

    // ------------------------------------------------------------ transactions

    /// Registers a new transaction and returns its id.
    pub(crate) fn begin(&self) -> u64 {
        let txid = self.next_txid.fetch_add(1, Ordering::Relaxed);
        let mut active = self.active.lock();
        // Taken under the table's lock, so a checkpoint that sees the table sees a start no
        // later than any record this transaction will write.
        active.insert(txid, self.wal.end());
        txid
    }

    /// Forgets a transaction that committed or rolled back.
    pub(crate) fn end(&self, txid: u64) {
        self.active.lock().remove(&txid);
    }

    /// The id the next transaction will get.
    pub(crate) fn next_txid(&self) -> u64 {
        self.next_txid.load(Ordering::Relaxed)
    }

    /// Recovery saw transaction ids up to `max`: later ones must be larger.
    pub(crate) fn saw_txid(&self, max: u64) {
        self.next_txid.fetch_max(max + 1, Ordering::Relaxed);
    }

    // ------------------------------------------------------------ dirty pages

    /// Persistent page `pid` became dirty: the log may hold changes not on its disk copy
    /// from `lsn` on (`None`: from the current end of the log, for unlogged writes).
    pub(crate) fn note_dirty(&self, pid: PageId, lsn: Option<u64>) {
        let lsn = lsn.unwrap_or_else(|| self.wal.end());
        // Loaded first: writers dirtying pages do not all store to one cache line.
        if !self.changed.load(Ordering::Relaxed) {
            self.changed.store(true, Ordering::Relaxed);
        }
        self.dirty.insert_if_absent(pid, lsn);
    }

    /// Page `pid` was written (or freed): its disk copy lacks nothing.
    pub(crate) fn page_clean(&self, pid: PageId) {
        self.dirty.remove(pid);
    }

    /// Whether any page is dirty.
    pub(crate) fn has_dirty(&self) -> bool {
        !self.dirty.is_empty()
    }

    /// The pages dirty since before log position `began`, ascending.
    pub(crate) fn dirty_before(&self, began: u64) -> Vec<PageId> {
        let mut pages: Vec<PageId> = self.dirty.entries().into_iter().filter(|&(_, lsn)| lsn <= began).map(|(p, _)| p).collect();
        pages.sort();
        pages
    }

    /// Lockings of the dirty table that met another thread (contention).
    pub(crate) fn dirty_waits(&self) -> u64 {
        self.dirty.waits()
    }

    // ------------------------------------------------------------ WAL before data

    /// Makes the log durable up to `lsn` (the largest LSN of pages about to be written; 0:
    /// none of them was logged).
    pub(crate) fn flush_for(&self, lsn: u64) -> Result<()> {
        if lsn > 0 && lsn >= self.wal.flushed() {
            self.wal.flush(lsn)?;
        }
        Ok(())
    }

    // ------------------------------------------------------------ checkpoints

    /// Whether more than the configured volume of log accumulated since the last checkpoint
    /// began, or (on a small or nearly full disk) more than a quarter of the free space: the
    /// log must not fill the disk before a checkpoint lets it be truncated. `u64::MAX` as
    /// the configured volume turns automatic checkpoints off altogether.
    pub(crate) fn checkpoint_due(&self) -> bool {
        let end = self.wal.end();
        let since = end.saturating_sub(self.last_checkpoint.load(Ordering::Relaxed));
        if since >= self.checkpoint_every {
            return true;
        }
        if self.checkpoint_every == u64::MAX || since < MIN_SPACE_CHECKPOINT || end < self.next_space_probe.load(Ordering::Relaxed) {
            return false;
        }
        self.next_space_probe.store(end + SPACE_PROBE_EVERY, Ordering::Relaxed);
        self.wal.free_space().is_some_and(|free| since >= free / 4)
    }

    /// A checkpoint begins now: returns the log position it starts from, and whether a
    /// page became dirty since the last stored checkpoint (the flag is reset: a checkpoint
    /// that fails must call [`checkpoint_failed`](Self::checkpoint_failed)).
    pub(crate) fn checkpoint_begins(&self) -> (u64, bool) {
        let changed = self.changed.swap(false, Ordering::Relaxed);
        let began = self.wal.end();
        self.last_checkpoint.store(began, Ordering::Relaxed);
        (began, changed)
    }

    /// The checkpoint that began failed: the next one must store a record.
    pub(crate) fn checkpoint_failed(&self) {
        self.changed.store(true, Ordering::Relaxed);
    }

    /// Whether a checkpoint whose record would start at `start_lsn` may skip storing it:
    /// no page changed since the stored record was written (`changed` from
    /// [`checkpoint_begins`](Self::checkpoint_begins)) and that record starts at the same
    /// position (so no log record was written since, and none may be truncated).
    pub(crate) fn record_unchanged(&self, start_lsn: u64, changed: bool) -> bool {
        !changed && *self.stored_start.lock() == Some(start_lsn)
    }

    /// A checkpoint record starting at `start_lsn` is on disk.
    pub(crate) fn record_stored(&self, start_lsn: u64) {
        *self.stored_start.lock() = Some(start_lsn);
    }

    /// The log position at which the oldest active transaction began (`u64::MAX` if none).
    pub(crate) fn oldest_active(&self) -> u64 {
        self.active.lock().values().copied().min().unwrap_or(u64::MAX)
    }

    /// Where recovery must start reading after a checkpoint that began at `began`: the
    /// oldest of that, the first unwritten change of a dirty page and `oldest_tx`, the
    /// [`oldest_active`](Self::oldest_active) transaction's start, taken before the
    /// checkpoint copied the allocation bitmaps.
    pub(crate) fn redo_start(&self, began: u64, oldest_tx: u64) -> u64 {
        let oldest_dirty = self.dirty.entries().into_iter().map(|(_, lsn)| lsn).min().unwrap_or(u64::MAX);
        began.min(oldest_dirty).min(oldest_tx)
    }
}
