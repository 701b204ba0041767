//! Logged page operations: the buffer manager's half of transactions.
//!
//! Transactions (in [`crate::txn`]) decide *what* to change and hold their page locks; this
//! module makes each change follow the write-ahead protocol: a change of a latched page is
//! appended to the log (byte range, before- and after-image) before it is applied, and the
//! page's LSN is set to the record's, so write-back flushes the log first. Undo applies a
//! record's inverse and logs it as a compensation record (ARIES CLR), both for a rollback
//! and for recovery's losers, so a crash in the middle of either never undoes twice.
//!
//! The manager also keeps the table of active transactions (id -> LSN at which each
//! began), which bounds how far a checkpoint may truncate the log.

use std::borrow::Cow;

use super::guard::ExclusiveGuard;
use super::manager::BufferManager;
use crate::error::{Error, Result};
use crate::storage::wal::{Body, Compensation, Record};
use crate::storage::PageId;

impl BufferManager {
    /// Registers a new transaction and returns its id.
    pub(crate) fn tx_begin(&self) -> u64 {
        self.durability.begin()
    }

    /// Forgets a transaction that committed or rolled back.
    pub(crate) fn tx_end(&self, txid: u64) {
        self.durability.end(txid);
    }

    /// Logs and applies the change of payload bytes `at..at + src.len()` of the latched page
    /// to `src`, as part of transaction `txid` whose previous record is `prev_lsn`. Returns
    /// the record (for the transaction's undo list; its after-image is left empty).
    pub(crate) fn log_write(&self, g: &mut ExclusiveGuard<'_>, txid: u64, prev_lsn: u64, at: usize, src: &[u8]) -> Result<Record> {
        let pid = g.pid();
        if pid.is_temp() {
            return Err(Error::InvalidInput(format!("page {pid} is temporary; temporary pages are not logged")));
        }
        if at.checked_add(src.len()).is_none_or(|end| end > g.len()) {
            return Err(Error::InvalidInput(format!("write of {} bytes at {at} lies outside the {}-byte payload of page {pid}", src.len(), g.len())));
        }
        let before = g.data()[at..at + src.len()].to_vec();
        let body = Body::Update { pid, offset: at as u32, before: Cow::Borrowed(&before), after: Cow::Borrowed(src) };
        let lsn = self.durability.wal.append(txid, prev_lsn, &body)?;
        g.write(at, src);
        g.set_page_lsn(lsn);
        let before = Cow::Owned(before);
        // Undo needs the before-image only; the after-image is in the log.
        Ok(Record { lsn, txid, prev_lsn, body: Body::Update { pid, offset: at as u32, before, after: Cow::Owned(Vec::new()) } })
    }

    /// Logs a transaction's allocation of a page whose payload holds `bytes`; returns it
    /// zeroed and latched, with the record. `logged` is called with the new id once the
    /// record is appended, under the class's bitmap lock and before the page's allocation
    /// bit is set (the transaction locks the page there: see `txn::lock`); it must not wait.
    pub(crate) fn log_alloc(&self, bytes: usize, txid: u64, prev_lsn: u64, logged: &dyn Fn(PageId)) -> Result<(ExclusiveGuard<'_>, Record)> {
        let (g, lsn) = self.alloc_logged(bytes, &|pid| {
            let lsn = self.durability.wal.append(txid, prev_lsn, &Body::Alloc { pid })?;
            logged(pid);
            Ok(lsn)
        })?;
        let pid = g.pid();
        Ok((g, Record { lsn, txid, prev_lsn, body: Body::Alloc { pid } }))
    }

    /// Undoes one record of a transaction (rollback or recovery): logs the compensation,
    /// whose `undo_next` is the record's predecessor, then applies it. `prev_lsn` is the
    /// transaction's latest record. Returns the compensation record's LSN.
    pub(crate) fn undo(&self, rec: &Record, prev_lsn: u64) -> Result<u64> {
        self.undo_deferring(rec, prev_lsn, None)
    }

    /// [`undo`](Self::undo), but a page whose allocation is undone is pushed to `freed`
    /// instead of being freed at once, when `freed` is given: a rolling-back transaction
    /// frees the pages it allocated when it ends, with its other frees, just before it
    /// releases its locks (the compensation record is logged here, so recovery frees them
    /// in any case).
    pub(crate) fn undo_deferring(&self, rec: &Record, prev_lsn: u64, freed: Option<&mut Vec<PageId>>) -> Result<u64> {
        let clr = |action: Compensation<'_>| self.durability.wal.append(rec.txid, prev_lsn, &Body::Clr { undo_next: rec.prev_lsn, action });
        match &rec.body {
            Body::Update { pid, offset, before, .. } => {
                let lsn = clr(Compensation::Write { pid: *pid, offset: *offset, bytes: Cow::Borrowed(before) })?;
                if self.is_allocated(*pid) {
                    let mut g = self.fix_exclusive(*pid)?;
                    g.write(*offset as usize, before);
                    g.set_page_lsn(lsn);
                }
                Ok(lsn)
            }
            Body::Alloc { pid } => {
                let lsn = clr(Compensation::Free { pid: *pid })?;
                match freed {
                    Some(later) => later.push(*pid),
                    None => self.free_if_allocated(*pid)?,
                }
                Ok(lsn)
            }
            Body::Free { pid } => {
                let lsn = clr(Compensation::Reclaim { pid: *pid })?;
                self.set_allocated(*pid)?;
                Ok(lsn)
            }
            other => Err(Error::Inconsistent(format!("log record {other:?} at {} cannot be undone", rec.lsn))),
        }
    }

    /// Undoes an update record on a page the caller has latched (rollback of an atomic
    /// section, whose pages are latched together so that no reader sees half of it).
    pub(crate) fn undo_latched(&self, rec: &Record, prev_lsn: u64, g: &mut ExclusiveGuard<'_>) -> Result<u64> {
        let Body::Update { pid, offset, before, .. } = &rec.body else {
            return Err(Error::Inconsistent(format!("log record {:?} at {} is not an update", rec.body, rec.lsn)));
        };
        debug_assert_eq!(*pid, g.pid());
        let action = Compensation::Write { pid: *pid, offset: *offset, bytes: Cow::Borrowed(before) };
        let lsn = self.durability.wal.append(rec.txid, prev_lsn, &Body::Clr { undo_next: rec.prev_lsn, action })?;
        g.write(*offset as usize, before);
        g.set_page_lsn(lsn);
        Ok(lsn)
    }

    /// Frees `pid` unless it is free already (redo and undo must be idempotent).
    pub(crate) fn free_if_allocated(&self, pid: PageId) -> Result<()> {
        if !self.is_allocated(pid) {
            return Ok(());
        }
        match self.free(pid) {
            Err(Error::InvalidPageId { .. }) => Ok(()),
            r => r,
        }
    }
}
