//! Crash recovery (ARIES, simplified by page-level transaction locks): analysis, redo,
//! undo, from the checkpoint's start LSN.
//!
//! * **Analysis** reads the log once: transactions without a commit or abort record are
//!   losers; committed ones are remembered (only their frees are redone).
//! * **Redo** repeats history: every update and compensation whose LSN is above the page's
//!   LSN is applied; allocations set the bitmap bit and start the page from zeros unless its
//!   disk copy already carries a newer LSN (a torn or never-written page is rebuilt from the
//!   log this way, and a freed slot's old bytes are never mistaken for the new page's: pages
//!   are reused only within their class, so a slot's LSN is always a page LSN of that slot).
//!   Frees of committed transactions clear the bit; compensations redo what they record.
//! * **Undo** rolls each loser back along its record chain, logging compensation records
//!   (whose `undo_next` skips what is already undone, so a crash during recovery resumes
//!   where it stopped), then an abort record.
//!
//! Pages are fixed through the ordinary buffer manager, so recovery works in a pool much
//! smaller than the data it touches; the caller checkpoints afterwards.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::manager::BufferManager;
use crate::error::{Error, Result};
use crate::storage::wal::{Body, Compensation, Record};
use crate::storage::PageId;

/// What recovery did when a database was opened ([`BufferManager::recovery_report`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Report {
    /// Transaction records read from the log after the last checkpoint (flush marks not
    /// counted); 0 when there was nothing to recover.
    pub records: u64,
    /// Records applied to pages during redo.
    pub redone: u64,
    /// Transactions rolled back (they had neither committed nor aborted).
    pub losers: u64,
    /// Page images of the last double-write batch copied home because their home copy was
    /// torn or older.
    pub pages_restored: u64,
    /// Pages allocated by rolled-back transactions, freed without rebuilding their contents.
    pub pages_discarded: u64,
}

pub(crate) fn recover(bm: &BufferManager, start: u64) -> Result<Report> {
    let mut report = Report::default();
    let mut open: BTreeMap<u64, u64> = BTreeMap::new();
    let mut committed = HashSet::new();
    // Per page, how its allocation last changed in the log.
    let mut fate: HashMap<PageId, Fate> = HashMap::new();
    let mut max_txid = 0;
    for rec in bm.durability.wal.reader(start) {
        let rec = rec?;
        if rec.txid == 0 {
            continue;
        }
        report.records += 1;
        max_txid = max_txid.max(rec.txid);
        match rec.body {
            Body::Commit => {
                open.remove(&rec.txid);
                committed.insert(rec.txid);
            }
            Body::Abort => {
                open.remove(&rec.txid);
            }
            Body::Alloc { pid } => {
                fate.insert(pid, Fate::AllocatedBy { owner: rec.txid, freed: false });
                open.insert(rec.txid, rec.lsn);
            }
            Body::Free { pid } => {
                // A free takes effect only if its transaction commits.
                match fate.get_mut(&pid) {
                    Some(Fate::AllocatedBy { owner, freed }) if *owner == rec.txid => *freed = true,
                    _ => {
                        fate.insert(pid, Fate::FreedBy(rec.txid));
                    }
                }
                open.insert(rec.txid, rec.lsn);
            }
            Body::Clr { action: Compensation::Free { pid }, .. } => {
                fate.insert(pid, Fate::Compensated { freed: true });
                open.insert(rec.txid, rec.lsn);
            }
            Body::Clr { action: Compensation::Reclaim { pid }, .. } => {
                fate.insert(pid, Fate::Compensated { freed: false });
                open.insert(rec.txid, rec.lsn);
            }
            _ => {
                open.insert(rec.txid, rec.lsn);
            }
        }
    }
    bm.durability.saw_txid(max_txid);
    if report.records == 0 {
        return Ok(report);
    }
    // Pages that end up free after recovery are never rebuilt, neither by redo nor by undo
    // (which would log before-images for nothing): rolling back a large failed import, or
    // replaying the drop of a table, e.g. after the disk filled up, then costs neither pool
    // memory nor page writes nor log space. Their allocation bits are still set and cleared
    // as the records say.
    let doomed: HashSet<PageId> = fate.into_iter().filter(|(_, f)| f.ends_free(&committed, &open)).map(|(pid, _)| pid).collect();
    report.pages_discarded = doomed.len() as u64;
    for rec in bm.durability.wal.reader(start) {
        let rec = rec?;
        if redo(bm, &rec, &committed, &doomed)? {
            report.redone += 1;
        }
    }
    let mut reader = bm.durability.wal.reader(start);
    for (&txid, &last) in &open {
        let mut prev = last;
        let mut next = last;
        while next != 0 {
            if next < start {
                return Err(Error::corruption(
                    bm.dir().join("wal"),
                    None,
                    format!("transaction {txid} has a log record at {next}, before the checkpoint start {start}"),
                ));
            }
            let rec = reader.record_at(next)?;
            next = match &rec.body {
                Body::Clr { undo_next, .. } => *undo_next,
                Body::Update { pid, .. } if doomed.contains(pid) => {
                    // The page is freed when its allocation is undone; no compensation is
                    // needed (undoing this again after a crash is the same no-op).
                    rec.prev_lsn
                }
                Body::Update { .. } | Body::Alloc { .. } | Body::Free { .. } => {
                    prev = bm.undo(&rec, prev)?;
                    rec.prev_lsn
                }
                _ => rec.prev_lsn,
            };
        }
        bm.durability.wal.append(txid, prev, &Body::Abort)?;
        report.losers += 1;
    }
    bm.durability.wal.flush_all()?;
    Ok(report)
}

/// How a page's allocation last changed in the log (analysis).
enum Fate {
    /// Allocated by `owner`, which may have freed it again (`freed`); no other transaction
    /// touched it since (the owner holds the page's lock until it ends).
    AllocatedBy { owner: u64, freed: bool },
    /// Freed by this transaction (not the one that allocated it last).
    FreedBy(u64),
    /// A compensation freed it (undo of an allocation) or took it back (undo of a free).
    Compensated { freed: bool },
}

impl Fate {
    /// Whether the page is free once recovery is done: its last allocation is undone (the
    /// owner is a loser, whose later records, a free included, are undone too), or freed by
    /// its committed owner, its free committed, or a compensation freed it.
    fn ends_free(&self, committed: &HashSet<u64>, losers: &BTreeMap<u64, u64>) -> bool {
        match *self {
            Fate::AllocatedBy { owner, freed } => losers.contains_key(&owner) || (freed && committed.contains(&owner)),
            Fate::FreedBy(txid) => committed.contains(&txid),
            Fate::Compensated { freed } => freed,
        }
    }
}

/// Redoes one record; returns whether a page changed.
fn redo(bm: &BufferManager, rec: &Record, committed: &HashSet<u64>, doomed: &HashSet<PageId>) -> Result<bool> {
    match &rec.body {
        Body::Update { pid, .. } | Body::Alloc { pid } | Body::Clr { action: Compensation::Write { pid, .. }, .. } if doomed.contains(pid) => {
            check_pid(bm, *pid, rec.lsn)?;
            Ok(false)
        }
        Body::Update { pid, offset, after, .. } => redo_write(bm, rec.lsn, *pid, *offset, after),
        Body::Clr { action: Compensation::Write { pid, offset, bytes }, .. } => redo_write(bm, rec.lsn, *pid, *offset, bytes),
        Body::Alloc { pid } => {
            check_pid(bm, *pid, rec.lsn)?;
            bm.set_allocated(*pid)?;
            let (mut g, intact) = bm.fix_for_recovery(*pid)?;
            if intact && g.page_lsn() >= rec.lsn {
                g.release_unchanged();
                return Ok(false);
            }
            g.zero();
            g.set_page_lsn(rec.lsn);
            Ok(true)
        }
        Body::Free { pid } if committed.contains(&rec.txid) => {
            bm.free_if_allocated(*pid)?;
            Ok(true)
        }
        Body::Clr { action: Compensation::Free { pid }, .. } => {
            bm.free_if_allocated(*pid)?;
            Ok(true)
        }
        Body::Clr { action: Compensation::Reclaim { pid }, .. } => {
            check_pid(bm, *pid, rec.lsn)?;
            bm.set_allocated(*pid)?;
            Ok(true)
        }
        _ => Ok(false),
    }
}

fn check_pid(bm: &BufferManager, pid: PageId, lsn: u64) -> Result<()> {
    if pid.is_temp() || pid.class() as usize >= bm.classes().count() || pid.index() > PageId::MAX_INDEX {
        return Err(Error::corruption(bm.dir().join("wal"), None, format!("log record at {lsn} names page {pid}, which cannot exist in this database")));
    }
    Ok(())
}

fn redo_write(bm: &BufferManager, lsn: u64, pid: PageId, offset: u32, bytes: &[u8]) -> Result<bool> {
    check_pid(bm, pid, lsn)?;
    // A page that is free here is freed by a later record (its owner held it locked until
    // then), so the change would be dropped anyway.
    if !bm.is_allocated(pid) {
        return Ok(false);
    }
    let (mut g, intact) = bm.fix_for_recovery(pid)?;
    if !intact {
        return Err(Error::corruption(
            crate::storage::layout::class_file(bm.dir(), pid.class()),
            Some(pid),
            format!("page is damaged on disk and the log from the checkpoint on holds no allocation of it to rebuild it from (record at {lsn})"),
        ));
    }
    if g.page_lsn() >= lsn {
        g.release_unchanged();
        return Ok(false);
    }
    let at = offset as usize;
    if at + bytes.len() > g.len() {
        return Err(Error::corruption(bm.dir().join("wal"), Some(pid), format!("log record at {lsn} writes past the end of the page")));
    }
    g.write(at, bytes);
    g.set_page_lsn(lsn);
    Ok(true)
}
