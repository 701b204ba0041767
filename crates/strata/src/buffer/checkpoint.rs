//! Checkpoints and the double-write area at open: flushing the dirty-page table, storing
//! the allocation table and the checkpoint record, truncating the log; restoring torn pages
//! from the last double-write batch, and refusing a read-only open that needs recovery.

use std::sync::atomic::Ordering;

use super::budget::Backoff;
use super::evict::CLOCK_BATCH;
use super::manager::BufferManager;
use super::space::Space;
use super::state::EVICTED;
use crate::error::{Error, Result};
use crate::storage::page::{self};
use crate::storage::wal::CheckpointInfo;
use crate::storage::{AllocTable, ClassBitmap, PageId};

/// 64 random bits (std's per-process random hash keys, mixed with the time).
fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos()));
    h.write_u32(std::process::id());
    h.finish()
}

impl BufferManager {
    /// The intact images of the last double-write batch whose home copy is torn or older.
    fn stale_double_writes(&self) -> Result<Vec<crate::storage::doublewrite::Saved>> {
        let mut stale = Vec::new();
        for saved in self.dw.saved()? {
            let pid = saved.pid;
            if pid.is_temp() || pid.class() as usize >= self.classes.count() || saved.image.len() as u64 != self.classes.page_size(pid.class()) {
                continue;
            }
            let sp = self.space_or_create(pid.class(), false, None)?;
            let mut home = crate::storage::AlignedBuf::zeroed(saved.image.len());
            let n = sp.file.read_at(home.io(), sp.offset(pid.index())).map_err(|e| Error::io("read page", sp.path(), e))?;
            if n < home.len() || page::verify(&home, pid).map_or(true, |lsn| lsn < saved.lsn) {
                stale.push(saved);
            }
        }
        Ok(stale)
    }

    /// Copies every intact image of the last double-write batch home whose home copy is torn
    /// or older, and makes them durable; returns how many were copied.
    pub(super) fn restore_double_writes(&self) -> Result<u64> {
        let stale = self.stale_double_writes()?;
        let mut touched = Vec::new();
        let mut restored = 0;
        for saved in &stale {
            let pid = saved.pid;
            let sp = self.space_or_create(pid.class(), false, None)?;
            if let Err(e) = sp.file.write_at(&saved.image, sp.offset(pid.index())) {
                let e = Error::io("write page", sp.path(), e);
                // A page that the stored allocation table does not hold was allocated after
                // the checkpoint the log starts from, so the log holds its allocation and every
                // change since: redo rebuilds it (or undo frees it) without this image. On a
                // full disk (where writing into a hole of the file needs space) it is left.
                let durable = self.durable.read().get(pid.class() as usize).is_some_and(|b| b.is_allocated(pid.index()));
                if durable || !matches!(e, Error::DiskFull { .. }) {
                    return Err(e);
                }
                continue;
            }
            restored += 1;
            if !touched.contains(&pid.class()) {
                touched.push(pid.class());
            }
        }
        for class in touched {
            let sp = self.space_or_create(class, false, None)?;
            sp.file.sync().map_err(|e| Error::io("fsync", sp.path(), e))?;
        }
        // Every image is home now, or older than its home copy, or not needed (see above):
        // the area's space is given back before recovery needs any.
        self.dw.clear()?;
        Ok(restored)
    }

    /// For a read-only open: fails with [`Error::RecoveryPending`] when a read-write open
    /// would recover (transaction records in the log from `start`, or stale double-write
    /// images), which a read-only open cannot do.
    pub(super) fn refuse_pending_recovery(&self, start: u64) -> Result<()> {
        let mut records = 0u64;
        for rec in self.durability.wal.reader(start) {
            if rec?.txid != 0 {
                records += 1;
            }
        }
        let stale = self.stale_double_writes()?.len();
        let mut why = Vec::new();
        if records > 0 {
            why.push(format!("the log holds {records} transaction records after the last checkpoint"));
        }
        if stale > 0 {
            why.push(format!("the double-write area holds {stale} page images not yet copied home"));
        }
        if why.is_empty() {
            return Ok(());
        }
        Err(Error::RecoveryPending { dir: self.dir.clone(), reason: why.join("; ") })
    }

    /// Writes every dirty persistent page, fsyncs the data files, persists the allocation
    /// table (atomically) and the log's checkpoint record, and deletes the log segments that
    /// recovery no longer needs. Temporary pages are not written.
    ///
    /// Only the pages in the dirty table are visited (not the whole pool). Transactions may
    /// run meanwhile: pages they dirty after the checkpoint began stay in the dirty table and
    /// keep the log from being truncated past their first change. The calling thread must not
    /// hold page latches (a checkpoint waits for them).
    pub fn checkpoint(&self) -> Result<()> {
        let _one = self.durability.checkpoint_lock.lock();
        self.checkpoint_locked()
    }

    /// Runs a checkpoint if more than the configured volume of log accumulated since the last
    /// one began and no other checkpoint is running (called after commits).
    pub(crate) fn maybe_checkpoint(&self) -> Result<()> {
        if !self.durability.checkpoint_due() {
            return Ok(());
        }
        match self.durability.checkpoint_lock.try_lock() {
            Some(_one) => self.checkpoint_locked(),
            None => Ok(()),
        }
    }

    fn checkpoint_locked(&self) -> Result<()> {
        if self.read_only {
            // Nothing to write unless someone changed a page, which is refused.
            if !self.durability.has_dirty() {
                return Ok(());
            }
            return Err(Error::ReadOnly { dir: self.dir.clone(), op: "checkpointing changed pages" });
        }
        let (began, changed) = self.durability.checkpoint_begins();
        let r = self.checkpoint_from(began, changed);
        if r.is_err() {
            self.durability.checkpoint_failed();
        }
        r
    }

    /// The checkpoint that began at log position `began`; `changed`: whether a page became
    /// dirty since the last stored checkpoint record. Writes nothing when nothing changed.
    fn checkpoint_from(&self, began: u64, changed: bool) -> Result<()> {
        let dirty = self.durability.dirty_before(began);
        for batch in dirty.chunks(CLOCK_BATCH) {
            let mut latched: Vec<(PageId, &Space)> = Vec::new();
            for &pid in batch {
                let Ok(sp) = self.lookup(pid) else { continue };
                let st = sp.state(pid.index());
                let mut backoff = Backoff(0);
                loop {
                    let w = st.load();
                    if w.state() == EVICTED || !w.dirty() {
                        break;
                    }
                    if st.try_lock_exclusive(w) {
                        if st.load().dirty() {
                            latched.push((pid, sp));
                        } else {
                            st.unlock_exclusive_unchanged(false);
                        }
                        break;
                    }
                    backoff.snooze();
                }
            }
            let r = if latched.is_empty() { Ok(()) } else { self.write_back(&latched) };
            for &(pid, sp) in &latched {
                sp.state(pid.index()).unlock_exclusive_unchanged(r.is_ok());
            }
            r?;
        }
        // After a failed fsync the kernel may have dropped the error state of pages written
        // before it (Linux reports it once), so nothing written since the last good sync is
        // known to be durable: refuse to report success again until the database is reopened.
        if let Some(path) = self.sync_failed.lock().clone() {
            return Err(Error::io(
                "fsync",
                path,
                std::io::Error::other("an earlier fsync of this file failed; durability is unknown until the database is reopened and checked"),
            ));
        }
        {
            // Every page write so far is made durable, so the double-write area is no longer
            // needed; no batch may be between its double write and its home fsync meanwhile.
            let _batch = self.dw_lock.lock();
            for class in 0..self.classes.count() {
                if let Some(sp) = self.spaces[class * 2].get() {
                    if let Err(e) = sp.file.sync() {
                        *self.sync_failed.lock() = Some(sp.path());
                        return Err(Error::io("fsync", sp.path(), e));
                    }
                }
            }
            self.dw.clear()?;
        }
        #[cfg(test)]
        crate::testutil::hooks::run(crate::testutil::hooks::Point::CheckpointCopiesBitmaps);
        // A transaction changes the bitmaps after its last log record (frees at commit, the
        // allocations a rollback undid) and ends only then: one that ended before this point
        // is in the copy below, and the log from the start of one still active replays
        // whatever it changes after the copy.
        let oldest_tx = self.durability.oldest_active();
        let mut table = AllocTable::new(self.classes.count());
        for class in 0..self.classes.count() {
            if let Some(sp) = self.spaces[class * 2].get() {
                table.classes[class] = sp.bitmap.lock().clone();
            }
        }
        #[cfg(test)]
        crate::testutil::hooks::run(crate::testutil::hooks::Point::CheckpointCopiedBitmaps);
        // Every allocation in the copy has its record in the log (it is logged under the
        // bitmap's lock); the record must be on disk before the table is.
        self.durability.wal.flush_all()?;
        let table_unchanged = !self.alloc_table_unsure.load(Ordering::Relaxed) && *self.durable.read() == table.classes;
        if !table_unchanged {
            // While the table is replaced, a slot allocated in either version counts as durable.
            {
                let mut durable = self.durable.write();
                durable.resize(self.classes.count(), ClassBitmap::default());
                for (d, t) in durable.iter_mut().zip(&table.classes) {
                    d.union_with(t);
                }
            }
            self.alloc_table_unsure.store(true, Ordering::Relaxed);
            table.store(self.backend.as_ref(), &self.dir)?;
            *self.durable.write() = table.classes;
            self.alloc_table_unsure.store(false, Ordering::Relaxed);
        }
        let start_lsn = self.durability.redo_start(began, oldest_tx);
        if table_unchanged && self.durability.record_unchanged(start_lsn, changed) {
            // Nothing changed since the stored checkpoint: a database that was only read is
            // closed without writing (and so without needing free space).
            return Ok(());
        }
        let nonce = random_u64();
        CheckpointInfo { start_lsn, next_txid: self.durability.next_txid(), nonce }.store(self.backend.as_ref(), &self.dir)?;
        self.durability.nonce.store(nonce, Ordering::Relaxed);
        self.durability.record_stored(start_lsn);
        self.durability.wal.truncate_before(start_lsn)
    }
}
