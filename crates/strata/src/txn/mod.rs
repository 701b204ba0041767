//! Transactions: atomic, durable changes of any number of pages of any sizes.
//!
//! ```no_run
//! # fn demo(db: &strata::Database) -> strata::Result<()> {
//! let mut tx = db.begin();
//! let page = tx.alloc(100)?;               // logged allocation, locked by `tx`
//! tx.write(page, 0, &42u64.to_le_bytes())?;
//! tx.commit()?;                             // durable when this returns
//! # Ok(()) }
//! ```
//!
//! * **Isolation.** Every page a transaction reads or writes is locked (exclusively) until it
//!   ends ([`lock`]); a lock wait that times out returns [`Error::LockTimeout`], one that
//!   would close a cycle of waiting transactions returns [`Error::Deadlock`] at once, and
//!   the caller should abort and retry ([`Error::is_lock_conflict`]).
//! * **Atomicity.** Every change is logged before it is applied (byte range, before and
//!   after image); a rollback applies the before-images in reverse, logging compensation
//!   records. Pages may be evicted (written) before commit (steal): the log is flushed up to
//!   a page's LSN before the page is written.
//! * **Durability.** `commit` appends a commit record and waits until the log is durable up
//!   to it, sharing the fsync with concurrent committers (group commit). Pages are not
//!   written at commit (no-force); checkpoints and eviction write them later.
//! * **Frees** take effect at commit (after the commit is durable), so a page freed by a
//!   transaction that rolls back was never reused.
//!
//! Writes through [`crate::ExclusiveGuard`] outside transactions (bulk import) are not
//! logged: they become durable at the next checkpoint, as before. Do not mix both on one page
//! between two checkpoints: recovery replays only the logged changes.
//!
//! Dropping an active transaction rolls it back. A failed rollback (the disk is failing)
//! leaves its pages locked until the database is reopened, which recovers them.

pub mod lock;

use std::collections::HashSet;
use std::time::Duration;

use crate::buffer::{BufferManager, ExclusiveGuard};
use crate::error::{Error, Result};
use crate::storage::wal::{Body, Record};
use crate::storage::PageId;
pub use lock::{Grant, LockTable};

/// Default time a transaction waits for a page lock before giving up.
pub const DEFAULT_LOCK_WAIT: Duration = Duration::from_secs(2);

/// One transaction. Not `Send`-restricted, but used by one thread at a time.
pub struct Transaction<'a> {
    bm: &'a BufferManager,
    locks: &'a LockTable,
    txid: u64,
    last_lsn: u64,
    undo: Vec<Record>,
    /// The atomic section of each record of `undo` (see [`begin_section`](Self::begin_section)).
    sections: Vec<u64>,
    section: u64,
    held: Vec<PageId>,
    /// The same pages as `held`, for [`holds`](Self::holds).
    held_set: HashSet<PageId>,
    frees: Vec<PageId>,
    /// Words to publish at commit: (page, from, to, mark) (see
    /// [`publish_at_commit`](Self::publish_at_commit)).
    publish: Vec<(PageId, usize, usize, u64)>,
    active: bool,
    lock_wait: Duration,
}

impl<'a> Transaction<'a> {
    /// Begins a transaction on `bm`, isolated by `locks` (one table per database).
    pub fn begin(bm: &'a BufferManager, locks: &'a LockTable) -> Transaction<'a> {
        let txid = bm.tx_begin();
        Transaction {
            bm,
            locks,
            txid,
            last_lsn: 0,
            undo: Vec::new(),
            sections: Vec::new(),
            section: 0,
            held: Vec::new(),
            held_set: HashSet::new(),
            frees: Vec::new(),
            publish: Vec::new(),
            active: true,
            lock_wait: DEFAULT_LOCK_WAIT,
        }
    }

    /// Sets how long lock waits last before [`Error::LockTimeout`].
    pub fn set_lock_wait(&mut self, wait: Duration) {
        self.lock_wait = wait;
    }

    /// The transaction's id.
    pub fn id(&self) -> u64 {
        self.txid
    }

    fn check_active(&self) -> Result<()> {
        if !self.active {
            return Err(Error::TransactionEnded { txid: self.txid, reason: "it failed earlier and was rolled back" });
        }
        // A failed log refuses all work; say so at once rather than after a lock wait on a
        // page that a transaction that could not roll back still holds.
        self.bm.durability.wal.check_failed()
    }

    /// Locks `pid` until the transaction ends. A page that is not allocated (or that the
    /// transaction holding its lock freed while this one waited) is not locked:
    /// [`Error::InvalidPageId`].
    pub fn lock(&mut self, pid: PageId) -> Result<()> {
        if self.lock_within(pid, self.lock_wait)? {
            Ok(())
        } else {
            Err(Error::InvalidPageId { pid, reason: "page is not allocated (a transaction whose lock on it was waited for may have freed it)" })
        }
    }

    /// [`lock`](Self::lock) for a caller that restarts from a fresh descent after the wait
    /// anyway (the B+-tree): returns whether the page is locked now; `false` (nothing
    /// locked) when it is no longer allocated, as for a node merged away and freed by the
    /// transaction whose lock on it was waited for. The restart does not lead there again.
    pub(crate) fn lock_if_allocated(&mut self, pid: PageId) -> Result<bool> {
        self.lock_within(pid, self.lock_wait)
    }

    /// Locks `pid` if no other transaction holds it, without waiting; returns whether the
    /// transaction holds it now (for best-effort work such as merging B+-tree leaves, which
    /// is skipped rather than waited for; also `false` for a page no longer allocated).
    pub(crate) fn try_lock(&mut self, pid: PageId) -> Result<bool> {
        // A wait of zero never waits, so it is refused with a timeout, never a deadlock.
        match self.lock_within(pid, Duration::ZERO) {
            Err(Error::LockTimeout { .. }) => Ok(false),
            r => r,
        }
    }

    /// Locks `pid` until the transaction ends, waiting at most `wait` for another holder;
    /// returns `false` (nothing locked) if the page is not allocated when its lock is free.
    fn lock_within(&mut self, pid: PageId, wait: Duration) -> Result<bool> {
        self.check_active()?;
        if pid.is_temp() {
            return Err(Error::InvalidPageId { pid, reason: "temporary pages are private and not transactional" });
        }
        let bm = self.bm;
        match self.locks.acquire(pid, self.txid, wait, &|p| bm.is_allocated(p))? {
            Grant::Taken => {
                self.held.push(pid);
                self.held_set.insert(pid);
                Ok(true)
            }
            Grant::Held => Ok(true),
            Grant::NotAllocated => Ok(false),
        }
    }

    /// Starts an atomic section: the changes logged until the next section are made under
    /// latches held together (readers see all or none of them), so a rollback undoes them
    /// under the latches of all their pages at once, too. Every [`write`](Self::write) and
    /// [`alloc`](Self::alloc) is a section of its own.
    pub(crate) fn begin_section(&mut self) {
        self.section += 1;
    }

    fn push_undo(&mut self, rec: Record) {
        self.undo.push(rec);
        self.sections.push(self.section);
    }

    /// Whether the transaction holds the lock on `pid`.
    pub fn holds(&self, pid: PageId) -> bool {
        self.held_set.contains(&pid)
    }

    /// The buffer manager the transaction works on.
    pub(crate) fn buffer(&self) -> &'a BufferManager {
        self.bm
    }

    /// Logs and applies a change of payload bytes `at..at + src.len()` of a page that the
    /// caller has latched exclusively and that this transaction has locked (access methods
    /// that find their pages with optimistic latches use this). If logging fails the
    /// transaction is rolled back once the caller has released its latches, and must not be
    /// used further.
    pub(crate) fn write_latched(&mut self, g: &mut ExclusiveGuard<'_>, at: usize, src: &[u8]) -> Result<()> {
        self.check_active()?;
        debug_assert!(self.holds(g.pid()), "write of page {} without its lock", g.pid());
        match self.bm.log_write(g, self.txid, self.last_lsn, at, src) {
            Ok(rec) => {
                self.last_lsn = rec.lsn;
                self.push_undo(rec);
                Ok(())
            }
            Err(e) => {
                // The rollback needs the latches the caller holds: defer it to the drop.
                Err(e)
            }
        }
    }

    /// Like [`alloc`](Self::alloc), but returns the new page still latched.
    pub(crate) fn alloc_latched(&mut self, bytes: usize) -> Result<ExclusiveGuard<'a>> {
        self.check_active()?;
        let (g, rec) = self.log_alloc(bytes)?;
        self.last_lsn = rec.lsn;
        self.push_undo(rec);
        Ok(g)
    }

    /// Reads payload bytes `at..at + dst.len()` of `pid` (locking it).
    pub fn read(&mut self, pid: PageId, at: usize, dst: &mut [u8]) -> Result<()> {
        self.lock(pid)?;
        let g = self.bm.fix_shared(pid)?;
        let src = at
            .checked_add(dst.len())
            .and_then(|end| g.data().get(at..end))
            .ok_or_else(|| Error::InvalidInput(format!("read of {} bytes at {at} lies outside the {}-byte payload of page {pid}", dst.len(), g.len())))?;
        dst.copy_from_slice(src);
        Ok(())
    }

    /// Reads the little-endian u64 at payload offset `at` of `pid`.
    pub fn read_u64(&mut self, pid: PageId, at: usize) -> Result<u64> {
        let mut b = [0u8; 8];
        self.read(pid, at, &mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    /// Changes payload bytes `at..at + src.len()` of `pid` to `src` (locking it). If this
    /// fails the transaction is rolled back and must not be used further.
    pub fn write(&mut self, pid: PageId, at: usize, src: &[u8]) -> Result<()> {
        match self.write_unfailed(pid, at, src) {
            Ok(()) => Ok(()),
            Err(e @ (Error::InvalidInput(_) | Error::InvalidPageId { .. })) => Err(e),
            Err(e) => Err(self.fail(e)),
        }
    }

    /// [`write`](Self::write) without the rollback on failure (for a caller that fails the
    /// transaction itself).
    fn write_unfailed(&mut self, pid: PageId, at: usize, src: &[u8]) -> Result<()> {
        self.lock(pid)?;
        self.begin_section();
        let rec = self.bm.fix_exclusive(pid).and_then(|mut g| self.bm.log_write(&mut g, self.txid, self.last_lsn, at, src))?;
        self.last_lsn = rec.lsn;
        self.push_undo(rec);
        Ok(())
    }

    /// At commit, just before the commit record, copies the little-endian u64 at payload
    /// offset `from` of `pid` to offset `to`, or-ed with `mark` (a logged write like any
    /// other: rolled back with the transaction, redone by recovery if it committed). Locks
    /// `pid` now. Registering the same `(pid, to)` again changes nothing. Tables publish their
    /// committed row count this way: readers see a transaction's rows only once it commits.
    pub(crate) fn publish_at_commit(&mut self, pid: PageId, from: usize, to: usize, mark: u64) -> Result<()> {
        self.lock(pid)?;
        if !self.publish.iter().any(|&(p, _, t, _)| p == pid && t == to) {
            self.publish.push((pid, from, to, mark));
        }
        Ok(())
    }

    /// Writes a little-endian u64 at payload offset `at` of `pid`.
    pub fn write_u64(&mut self, pid: PageId, at: usize, v: u64) -> Result<()> {
        self.write(pid, at, &v.to_le_bytes())
    }

    /// Allocates a zeroed persistent page whose payload holds at least `bytes` (locked by
    /// this transaction; freed again if it rolls back).
    pub fn alloc(&mut self, bytes: usize) -> Result<PageId> {
        self.check_active()?;
        self.begin_section();
        let (g, rec) = match self.log_alloc(bytes) {
            Ok(x) => x,
            Err(e @ (Error::InvalidInput(_) | Error::PoolTooSmall { .. })) => return Err(e),
            Err(e) => return Err(self.fail(e)),
        };
        let pid = g.pid();
        drop(g);
        self.last_lsn = rec.lsn;
        self.push_undo(rec);
        Ok(pid)
    }

    /// Allocates and logs a page, locked by this transaction: the lock is taken while the
    /// allocator holds the class's bitmap lock, before the page's allocation is visible, so
    /// it never waits and no other transaction can lock the page first (a transaction that
    /// tries is refused the unallocated page, or waits for this one: see [`lock`]).
    fn log_alloc(&mut self, bytes: usize) -> Result<(ExclusiveGuard<'a>, Record)> {
        let (locks, txid) = (self.locks, self.txid);
        let (g, rec) = self.bm.log_alloc(bytes, txid, self.last_lsn, &|pid| {
            locks.grant_fresh(pid, txid);
        })?;
        let pid = g.pid();
        self.held.push(pid);
        self.held_set.insert(pid);
        Ok((g, rec))
    }

    /// Frees `pid` when the transaction commits (locking it now).
    pub fn free(&mut self, pid: PageId) -> Result<()> {
        self.lock(pid)?;
        if !self.bm.is_allocated(pid) || self.frees.contains(&pid) {
            return Err(Error::InvalidPageId { pid, reason: "page is not allocated (or already freed by this transaction)" });
        }
        self.frees.push(pid);
        Ok(())
    }

    /// Commits: returns once the transaction is durable. On error the outcome is not
    /// acknowledged: the transaction is rolled back in memory if possible (and recovery rolls
    /// it back on the next open if its commit record did not reach the disk).
    pub fn commit(mut self) -> Result<()> {
        self.check_active()?;
        let r = self.commit_inner();
        if let Err(e) = r {
            return Err(self.fail(e));
        }
        let frees = std::mem::take(&mut self.frees);
        // The commit is durable: the pages can go, then the locks (the free records are in
        // the log, so recovery redoes the frees if the bitmap was not stored yet).
        self.finish_freeing(frees, Ok(()))?;
        // Bound recovery time and log size. The commit is durable whatever happens here; a
        // checkpoint that fails (disk full) leaves the log longer, and the next explicit
        // checkpoint or close reports the error.
        let _ = self.bm.maybe_checkpoint();
        Ok(())
    }

    fn commit_inner(&mut self) -> Result<()> {
        for (pid, from, to, mark) in std::mem::take(&mut self.publish) {
            let v = self.read_u64(pid, from)?;
            self.write_unfailed(pid, to, &(v | mark).to_le_bytes())?;
        }
        if self.last_lsn == 0 && self.frees.is_empty() {
            // Read-only: nothing to make durable.
            return Ok(());
        }
        for i in 0..self.frees.len() {
            self.last_lsn = self.bm.durability.wal.append(self.txid, self.last_lsn, &Body::Free { pid: self.frees[i] })?;
        }
        let lsn = self.bm.durability.wal.append(self.txid, self.last_lsn, &Body::Commit)?;
        self.last_lsn = lsn;
        self.bm.durability.wal.flush(lsn)
    }

    /// Rolls back every change of the transaction.
    pub fn abort(mut self) -> Result<()> {
        self.check_active()?;
        self.rollback()
    }

    fn rollback(&mut self) -> Result<()> {
        self.publish.clear();
        let mut freed = Vec::new();
        // Pages this transaction allocated are freed when their allocation is undone: their
        // updates need neither a page write nor a compensation record (whose before-image
        // would cost as much log as the change). After a crash in between, recovery skips
        // them the same way (their last allocation belongs to a loser).
        let own: HashSet<PageId> = self.undo.iter().filter_map(|r| if let Body::Alloc { pid } = r.body { Some(pid) } else { None }).collect();
        while let Some(&section) = self.sections.last() {
            // The records of one atomic section, undone under the latches of all its pages.
            let start = self.sections.iter().rposition(|&s| s != section).map_or(0, |i| i + 1);
            let group: Vec<Record> = self.undo.drain(start..).filter(|r| !matches!(r.body, Body::Update { pid, .. } if own.contains(&pid))).collect();
            self.sections.truncate(start);
            if let Err(e) = self.undo_section(&group, &mut freed) {
                // Keep the locks: the pages hold changes nobody may see or overwrite
                // until recovery rolls them back on the next open.
                self.active = false;
                self.held.clear();
                self.held_set.clear();
                self.undo.clear();
                self.sections.clear();
                return Err(e);
            }
        }
        let r = if self.last_lsn != 0 { self.bm.durability.wal.append(self.txid, self.last_lsn, &Body::Abort).map(|_| ()) } else { Ok(()) };
        // The pages this transaction allocated go before its locks are released.
        self.finish_freeing(freed, r)
    }

    /// Undoes one atomic section (its records in reverse), holding the exclusive latches of
    /// all the pages it changed at once. Latches are only tried, never waited for while
    /// another is held: if one is taken, all are released and the attempt repeated.
    fn undo_section(&mut self, group: &[Record], freed: &mut Vec<PageId>) -> Result<()> {
        let mut pids: Vec<PageId> = group
            .iter()
            .filter_map(|r| match &r.body {
                Body::Update { pid, .. } if self.bm.is_allocated(*pid) => Some(*pid),
                _ => None,
            })
            .collect();
        pids.sort_unstable();
        pids.dedup();
        let mut guards = Vec::with_capacity(pids.len());
        let mut spins = 0u32;
        while guards.len() < pids.len() {
            match self.bm.try_fix_exclusive(pids[guards.len()])? {
                Some(g) => guards.push(g),
                None => {
                    // Unchanged so far: release without a version change and try again.
                    for g in guards.drain(..) {
                        g.release_unchanged();
                    }
                    spins += 1;
                    if spins.is_multiple_of(64) {
                        std::thread::sleep(Duration::from_micros(50));
                    } else {
                        std::thread::yield_now();
                    }
                }
            }
        }
        for rec in group.iter().rev() {
            let lsn = match &rec.body {
                Body::Update { pid, .. } => match pids.binary_search(pid) {
                    Ok(i) => self.bm.undo_latched(rec, self.last_lsn, &mut guards[i])?,
                    // A page no longer allocated: log the compensation, nothing to write.
                    Err(_) => self.bm.undo(rec, self.last_lsn)?,
                },
                _ => self.bm.undo_deferring(rec, self.last_lsn, Some(freed))?,
            };
            self.last_lsn = lsn;
        }
        Ok(())
    }

    /// Rolls back after an error and returns the error.
    fn fail(&mut self, e: Error) -> Error {
        let _ = self.rollback();
        self.active = false;
        e
    }

    /// Ends the transaction: frees `pages` (frees it committed, or allocations its rollback
    /// undid), then releases its locks, and only then leaves the active set.
    ///
    /// A page is freed while its lock is still held (the transaction holds the lock of
    /// every page it frees or allocated): a transaction waiting for that lock is granted it
    /// only after the page is free, and is refused it then (locks are granted for allocated
    /// pages only, see [`lock`]); released first, the lock would go to the waiter, which
    /// would keep the lock of a page about to be freed and make the next allocation of the
    /// id wait for it. An allocation of the id between the free and the release takes the
    /// lock over without waiting ([`LockTable::grant_fresh`]), and the release below leaves
    /// it alone.
    ///
    /// The transaction must stay active until its frees are in the bitmaps: a checkpoint
    /// copies the bitmaps and lets the log start after every transaction that ended before
    /// the copy, so a free still to come after that would be neither in the stored table
    /// nor in the log recovery reads, and the page would stay allocated, referenced by
    /// nothing. Returns `r`, else the first failed free (the locks are released in any
    /// case).
    fn finish_freeing(&mut self, pages: Vec<PageId>, r: Result<()>) -> Result<()> {
        self.active = false;
        self.undo.clear();
        self.sections.clear();
        #[cfg(test)]
        crate::testutil::hooks::run(crate::testutil::hooks::Point::FreesPending);
        let mut first_error = r.err();
        for pid in pages {
            if let Err(e) = self.bm.free_if_allocated(pid) {
                first_error.get_or_insert(e);
            }
        }
        #[cfg(test)]
        crate::testutil::hooks::run(crate::testutil::hooks::Point::LocksPending);
        self.locks.release(self.txid, &self.held);
        self.held.clear();
        self.held_set.clear();
        self.bm.tx_end(self.txid);
        first_error.map_or(Ok(()), Err)
    }
}

impl Drop for Transaction<'_> {
    fn drop(&mut self) {
        if self.active {
            let _ = self.rollback();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::{mpsc, Arc};

    use super::*;
    use crate::buffer::Config;
    use crate::testutil::hooks::{self, Point};

    const POOL: u64 = 4 << 20;

    fn reopen(dir: &Path) -> BufferManager {
        BufferManager::open(Config::new(dir).min_page(4096).pool_size(POOL)).unwrap()
    }

    /// Kills the manager (nothing more of it runs) once the test holds its only reference.
    fn crash(bm: Arc<BufferManager>) {
        match Arc::try_unwrap(bm) {
            Ok(bm) => bm.crash(),
            Err(_) => panic!("the manager is still shared"),
        }
    }

    /// A database with two committed pages, `keep` and `gone`, checkpointed.
    fn two_pages() -> (tempfile::TempDir, Arc<BufferManager>, LockTable, PageId, PageId) {
        let (t, bm) = crate::testutil::bm(POOL, 4096);
        let locks = LockTable::default();
        let mut tx = Transaction::begin(&bm, &locks);
        let keep = tx.alloc(100).unwrap();
        let gone = tx.alloc(100).unwrap();
        tx.commit().unwrap();
        bm.checkpoint().unwrap();
        (t, Arc::new(bm), locks, keep, gone)
    }

    /// A transaction that frees `gone` and writes `keep`, committed.
    fn free_one(bm: &BufferManager, locks: &LockTable, keep: PageId, gone: PageId) {
        let mut tx = Transaction::begin(bm, locks);
        tx.write(keep, 0, b"still here").unwrap();
        tx.free(gone).unwrap();
        tx.commit().unwrap();
    }

    /// A checkpoint between a commit and its frees (the committer has released its locks
    /// and not yet cleared the bitmap bit) stores the page as allocated; the log it keeps
    /// must still replay the free, or the page is allocated after a crash and referenced by
    /// nothing (found by `strata torture soak` on the tree workload).
    #[test]
    fn a_checkpoint_before_a_commits_frees_keeps_them_in_the_log() {
        let (t, bm, locks, keep, gone) = two_pages();
        let dir = bm.dir().to_path_buf();
        let hook_bm = Arc::clone(&bm);
        hooks::set(Point::FreesPending, move || hook_bm.checkpoint().unwrap());
        free_one(&bm, &locks, keep, gone);
        assert_eq!(bm.allocated_pages(), vec![keep]);
        crash(bm);
        let bm = reopen(&dir);
        assert_eq!(bm.allocated_pages(), vec![keep], "the committed free was lost");
        let g = bm.fix_shared(keep).unwrap();
        assert_eq!(&g.data()[..10], b"still here");
        drop(g);
        bm.close().unwrap();
        drop(t);
    }

    /// The same race across threads: the checkpoint copies the bitmaps while the commit's
    /// frees are pending, and the transaction ends before the checkpoint decides where the
    /// log must start. The transaction was active when the bitmaps were copied, so the
    /// start must not pass its records.
    #[test]
    fn a_transaction_ending_during_a_checkpoint_keeps_its_frees_in_the_log() {
        let (t, bm, locks, keep, gone) = two_pages();
        let dir = bm.dir().to_path_buf();
        let (durable_tx, durable_rx) = mpsc::channel::<()>();
        let (copied_tx, copied_rx) = mpsc::channel::<()>();
        let (done_tx, done_rx) = mpsc::channel::<()>();
        let (b, l) = (&*bm, &locks);
        std::thread::scope(|s| {
            s.spawn(move || {
                hooks::set(Point::FreesPending, move || {
                    durable_tx.send(()).unwrap();
                    copied_rx.recv().unwrap();
                });
                free_one(b, l, keep, gone);
                done_tx.send(()).unwrap();
            });
            s.spawn(move || {
                durable_rx.recv().unwrap();
                hooks::set(Point::CheckpointCopiedBitmaps, move || {
                    copied_tx.send(()).unwrap();
                    done_rx.recv().unwrap();
                });
                b.checkpoint().unwrap();
            });
        });
        crash(bm);
        let bm = reopen(&dir);
        assert_eq!(bm.allocated_pages(), vec![keep], "the committed free was lost");
        bm.close().unwrap();
        drop(t);
    }

    /// A transaction waiting for the lock of a page that its holder frees must not be
    /// granted the lock of the freed page, and the next allocation of that id must take its
    /// lock at once. (The committer used to release its locks before freeing its pages: the
    /// waiter was granted the lock of a page about to be freed and kept it, and the
    /// allocation that reused the id waited behind it, then went on without the lock.) The
    /// outcome does not depend on whether the waiter is already waiting when the freer
    /// commits.
    #[test]
    fn a_waiter_is_not_granted_the_lock_of_a_page_freed_meanwhile() {
        let (t, bm, locks, _keep, gone) = two_pages();
        let (b, l) = (&*bm, &locks);
        let mut freer = Transaction::begin(b, l);
        freer.free(gone).unwrap();
        let (waiting_tx, waiting_rx) = mpsc::channel::<()>();
        std::thread::scope(|s| {
            let waiter = s.spawn(move || {
                let mut w = Transaction::begin(b, l);
                w.set_lock_wait(Duration::from_secs(10));
                waiting_tx.send(()).unwrap();
                let r = w.lock(gone);
                (w, r)
            });
            waiting_rx.recv().unwrap();
            std::thread::sleep(Duration::from_millis(50));
            freer.commit().unwrap();
            let (mut w, r) = waiter.join().unwrap();
            assert!(!bm.is_allocated(gone));
            // The allocator reuses the id; its lock must be free for the new page.
            // No lock wait at all: an allocation that had to wait for its page's lock fails.
            let mut a = Transaction::begin(b, l);
            a.set_lock_wait(Duration::ZERO);
            let p = a.alloc(100).expect("the allocation of a fresh page waited for its lock");
            assert_eq!(p, gone, "the allocator did not reuse the freed id");
            assert!(matches!(r, Err(Error::InvalidPageId { .. })), "the waiter was granted the lock of freed page {gone}: {r:?}");
            assert!(!w.holds(gone), "the waiter holds the lock of freed page {gone}");
            assert!(matches!(w.try_lock(gone), Ok(false)), "the waiter can lock the allocator's new page {gone}");
            a.commit().unwrap();
            w.commit().unwrap();
        });
        assert!(locks.is_empty());
        drop(t);
    }

    /// The freed page is allocated again between its free and its freer's release of the
    /// locks: the allocation takes the lock at once, over the freer's entry, and keeps it
    /// when the freer releases its locks.
    #[test]
    fn an_allocation_between_a_free_and_the_release_keeps_its_lock() {
        let (t, bm, locks, keep, gone) = two_pages();
        let (b, l) = (&*bm, &locks);
        let (freed_tx, freed_rx) = mpsc::channel::<()>();
        let (allocated_tx, allocated_rx) = mpsc::channel::<()>();
        let (released_tx, released_rx) = mpsc::channel::<()>();
        std::thread::scope(|s| {
            s.spawn(move || {
                hooks::set(Point::LocksPending, move || {
                    freed_tx.send(()).unwrap();
                    allocated_rx.recv().unwrap();
                });
                free_one(b, l, keep, gone);
                released_tx.send(()).unwrap();
            });
            freed_rx.recv().unwrap();
            assert!(!bm.is_allocated(gone));
            // No lock wait at all: an allocation that had to wait for its page's lock fails.
            let mut a = Transaction::begin(b, l);
            a.set_lock_wait(Duration::ZERO);
            let p = a.alloc(100).expect("the allocation of a fresh page waited for its lock");
            assert_eq!(p, gone, "the allocator did not reuse the freed id");
            assert_eq!(locks.owner(p), Some(a.id()));
            allocated_tx.send(()).unwrap();
            released_rx.recv().unwrap();
            assert_eq!(locks.owner(p), Some(a.id()), "the freer's release dropped the new owner's lock");
            let mut w = Transaction::begin(b, l);
            assert!(matches!(w.try_lock(p), Ok(false)));
            a.write(p, 0, b"new").unwrap();
            a.commit().unwrap();
            assert!(w.try_lock(p).unwrap());
            w.commit().unwrap();
        });
        assert!(locks.is_empty());
        drop(t);
    }

    /// Threads allocate, free (committing or rolling back) and lock pages of one size
    /// class at random, so that freed ids are allocated again at once, and check the lock
    /// table's invariants: a lock is granted and kept only for an allocated page (no
    /// transaction keeps the lock of a page freed by another), the lock of a fresh page is
    /// its allocator's at once, and no lock is left at the end.
    #[test]
    fn stress_locks_of_freed_and_reallocated_pages() {
        const THREADS: u64 = 4;
        const ROUNDS: usize = 300;
        let (t, bm) = crate::testutil::bm(POOL, 4096);
        let locks = LockTable::default();
        let live = parking_lot::Mutex::new(Vec::new());
        {
            let mut tx = Transaction::begin(&bm, &locks);
            for _ in 0..8 {
                live.lock().push(tx.alloc(100).unwrap());
            }
            tx.commit().unwrap();
        }
        let (b, l, pages) = (&bm, &locks, &live);
        std::thread::scope(|s| {
            for thread in 0..THREADS {
                s.spawn(move || {
                    let mut seed = thread + 1;
                    let mut rng = move || crate::testutil::rng(&mut seed);
                    for _ in 0..ROUNDS {
                        let mut tx = Transaction::begin(b, l);
                        tx.set_lock_wait(Duration::from_secs(20));
                        let me = tx.id();
                        let roll_back = rng() % 4 == 0;
                        match rng() % 3 {
                            0 => {
                                // A fresh page's lock is never waited for: no wait at all.
                                tx.set_lock_wait(Duration::ZERO);
                                let p = tx.alloc(100).expect("the allocation of a fresh page waited for its lock");
                                assert_eq!(l.owner(p), Some(me), "fresh page {p} is not locked by its allocator");
                                tx.write(p, 0, &me.to_le_bytes()).unwrap();
                                if roll_back {
                                    tx.abort().unwrap();
                                } else {
                                    tx.commit().unwrap();
                                    pages.lock().push(p);
                                }
                            }
                            1 => {
                                let p = {
                                    let mut v = pages.lock();
                                    if v.len() < 4 {
                                        continue;
                                    }
                                    let i = rng() as usize % v.len();
                                    v.swap_remove(i)
                                };
                                tx.free(p).unwrap();
                                if roll_back {
                                    tx.abort().unwrap();
                                    pages.lock().push(p);
                                } else {
                                    tx.commit().unwrap();
                                }
                            }
                            _ => {
                                let p = {
                                    let v = pages.lock();
                                    v[rng() as usize % v.len()]
                                };
                                match tx.lock(p) {
                                    Ok(()) => {
                                        assert!(b.is_allocated(p), "locked page {p} is not allocated");
                                        std::thread::sleep(Duration::from_micros(rng() % 300));
                                        assert_eq!(l.owner(p), Some(me), "the lock of page {p} was taken over");
                                        assert!(b.is_allocated(p), "locked page {p} was freed");
                                        tx.write(p, 8, &me.to_le_bytes()).unwrap();
                                    }
                                    Err(Error::InvalidPageId { .. }) => assert!(!tx.holds(p)),
                                    Err(e) => panic!("lock of page {p}: {e}"),
                                }
                                if roll_back {
                                    tx.abort().unwrap();
                                } else {
                                    tx.commit().unwrap();
                                }
                            }
                        }
                    }
                });
            }
        });
        assert!(locks.is_empty(), "{} locks left", locks.len());
        let mut left = live.into_inner();
        left.sort_unstable();
        assert_eq!(bm.allocated_pages(), left);
        drop(t);
    }

    /// An allocation logged while a checkpoint runs, before it copies the bitmaps, is in
    /// the stored table: its record must be on disk before the table is, or after a crash
    /// the page is allocated with no record to roll its transaction back.
    #[test]
    fn an_allocation_in_a_stored_table_has_its_record_on_disk() {
        let (t, bm, locks, keep, gone) = two_pages();
        let dir = bm.dir().to_path_buf();
        let hook_bm = Arc::clone(&bm);
        let locks = Arc::new(locks);
        let hook_locks = Arc::clone(&locks);
        hooks::set(Point::CheckpointCopiesBitmaps, move || {
            // Never committed: the process dies with the transaction open.
            let mut tx = Transaction::begin(&hook_bm, &hook_locks);
            tx.alloc(100).unwrap();
            std::mem::forget(tx);
        });
        bm.checkpoint().unwrap();
        assert_eq!(bm.allocated_pages().len(), 3);
        crash(bm);
        let bm = reopen(&dir);
        assert_eq!(bm.allocated_pages(), vec![keep, gone], "the loser's page was kept");
        bm.close().unwrap();
        drop(t);
    }
}
