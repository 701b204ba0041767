//! The bank workload behind `strata torture`: concurrent transactions that move amounts
//! between accounts stored across pages of mixed size classes, allocate and free pages as
//! they go, and leave enough evidence on the pages to check after any crash that every
//! acknowledged commit survived and nothing else did.
//!
//! Layout (all little-endian u64, in page payloads):
//! * **Root** (the first page of the database, class 0): magic, account count, initial
//!   balance, account-page count, slot count, then the account pages' ids, then the slot
//!   pages' ids.
//! * **Account pages** cycle through the size classes (4, 8, 16, 32, 64 KiB with 4 KiB
//!   pages); each holds up to [`ACCOUNTS_PER_PAGE`] balances spread over its whole payload,
//!   so a transfer touches distant sectors of big pages.
//! * **Slot pages**, one per worker thread: the sequence number of the worker's last
//!   committed transaction, the id of its scratch page and the tag written into it.
//! * **Scratch pages** (one per slot): allocated, tagged at both ends, and freed again by
//!   transfers now and then, in the same transaction.
//!
//! Every transfer conserves the total; a transfer's sequence number (taken from a counter
//! just before its commit) is written into its worker's slot, so after recovery the largest
//! slot value is the last committed sequence number.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::Serialize;

use crate::buffer::BufferManager;
use crate::error::{Error, Result};
use crate::storage::PageId;
use crate::txn::{LockTable, Transaction};

/// Balances per account page.
pub const ACCOUNTS_PER_PAGE: u64 = 32;
/// Largest number of worker slots.
pub const MAX_SLOTS: u64 = 256;
const MAGIC: u64 = u64::from_le_bytes(*b"STBANK01");
const ROOT: PageId = PageId::new(0, false, 0);
const CLASSES: u8 = 5;

/// The bank's page directory, read from the root page.
#[derive(Clone, Debug)]
pub struct Bank {
    pub accounts: u64,
    pub initial: u64,
    pub account_pages: Vec<PageId>,
    pub slots: Vec<PageId>,
}

/// What [`verify`] found.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Verdict {
    pub last_committed: u64,
    pub total: u64,
    pub expected_total: u64,
    /// Scratch pages checked (allocated, both tags intact).
    pub scratch_pages: u64,
    /// Allocated pages that the bank does not reference (leaked by a lost free or alloc).
    pub leaked_pages: u64,
    pub ok: bool,
    /// What is wrong, when not ok.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<String>,
}

fn payload_of(bm: &BufferManager, pid: PageId) -> usize {
    bm.payload_size(pid.class())
}

/// Offset of account slot `k` (0..ACCOUNTS_PER_PAGE) in a page with `payload` bytes.
fn account_offset(payload: usize, k: u64) -> usize {
    let stride = (payload / ACCOUNTS_PER_PAGE as usize) & !7;
    k as usize * stride
}

impl Bank {
    /// Where account `i` lives.
    pub fn account(&self, bm: &BufferManager, i: u64) -> (PageId, usize) {
        let pid = self.account_pages[(i / ACCOUNTS_PER_PAGE) as usize];
        (pid, account_offset(payload_of(bm, pid), i % ACCOUNTS_PER_PAGE))
    }

    /// Reads the directory from the root page (`NotFound` if there is no bank).
    pub fn load(bm: &BufferManager, locks: &LockTable) -> Result<Bank> {
        if !bm.is_allocated(ROOT) {
            return Err(Error::NotFound { kind: "bank (run `strata torture run` first)", name: bm.dir().display().to_string() });
        }
        let mut tx = Transaction::begin(bm, locks);
        let mut word = |at: usize| tx.read_u64(ROOT, 8 * at);
        if word(0)? != MAGIC {
            return Err(Error::InvalidInput(format!("{} holds no torture bank (root page has another layout)", bm.dir().display())));
        }
        let (accounts, initial, npages, nslots) = (word(1)?, word(2)?, word(3)?, word(4)?);
        let max_words = payload_of(bm, ROOT) / 8;
        if 5 + npages + nslots > max_words as u64 || nslots > MAX_SLOTS || npages != accounts.div_ceil(ACCOUNTS_PER_PAGE) {
            return Err(Error::Inconsistent(format!("bank root page is malformed ({npages} account pages, {nslots} slots)")));
        }
        let account_pages = (0..npages).map(|i| word(5 + i as usize).map(PageId::from_raw)).collect::<Result<_>>()?;
        let slots = (0..nslots).map(|i| word(5 + (npages + i) as usize).map(PageId::from_raw)).collect::<Result<_>>()?;
        tx.commit()?;
        Ok(Bank { accounts, initial, account_pages, slots })
    }

    /// Creates the bank in an empty database (or loads the existing one), making sure it has
    /// at least `slots` worker slots.
    pub fn setup(bm: &BufferManager, locks: &LockTable, accounts: u64, initial: u64, slots: u64) -> Result<Bank> {
        if slots == 0 || slots > MAX_SLOTS || accounts < 2 {
            return Err(Error::InvalidInput(format!("need at least 2 accounts and 1..={MAX_SLOTS} threads")));
        }
        let mut bank = match Bank::load(bm, locks) {
            Ok(b) => b,
            Err(Error::NotFound { .. }) => {
                if !bm.allocated_pages().is_empty() {
                    return Err(Error::InvalidInput(format!("{} already holds other data; use an empty directory", bm.dir().display())));
                }
                let mut tx = Transaction::begin(bm, locks);
                let root = tx.alloc(payload_of(bm, ROOT))?;
                if root != ROOT {
                    return Err(Error::Inconsistent(format!("first page of a new bank is {root}, expected {ROOT}")));
                }
                let npages = accounts.div_ceil(ACCOUNTS_PER_PAGE);
                if 5 + npages + MAX_SLOTS > (payload_of(bm, ROOT) / 8) as u64 {
                    return Err(Error::InvalidInput(format!("{accounts} accounts do not fit the bank's root page; use fewer")));
                }
                let mut pages = Vec::new();
                for p in 0..npages {
                    let class = (p % CLASSES as u64) as u8;
                    let pid = tx.alloc(bm.payload_size(class.min(bm.classes().count() as u8 - 1)))?;
                    let in_page = ACCOUNTS_PER_PAGE.min(accounts - p * ACCOUNTS_PER_PAGE);
                    for k in 0..in_page {
                        tx.write_u64(pid, account_offset(payload_of(bm, pid), k), initial)?;
                    }
                    tx.write_u64(ROOT, 8 * (5 + p as usize), pid.raw())?;
                    pages.push(pid);
                }
                for (i, v) in [MAGIC, accounts, initial, npages, 0].into_iter().enumerate() {
                    tx.write_u64(ROOT, 8 * i, v)?;
                }
                tx.commit()?;
                Bank { accounts, initial, account_pages: pages, slots: Vec::new() }
            }
            Err(e) => return Err(e),
        };
        if (bank.slots.len() as u64) < slots {
            let mut tx = Transaction::begin(bm, locks);
            let npages = bank.account_pages.len();
            for i in bank.slots.len() as u64..slots {
                let slot = tx.alloc(24)?;
                tx.write_u64(ROOT, 8 * (5 + npages + i as usize), slot.raw())?;
                bank.slots.push(slot);
            }
            tx.write_u64(ROOT, 8 * 4, slots)?;
            tx.commit()?;
        }
        Ok(bank)
    }
}

/// The workload's deterministic generator.
pub use crate::util::SplitMix64 as Rng;

/// What one transfer attempt did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Committed with this sequence number.
    Committed(u64),
    /// Rolled back on purpose (to exercise rollback).
    Aborted,
    /// A lock wait timed out or would have closed a deadlock; rolled back (retry).
    Conflict,
}

/// One transfer by worker `slot`: moves a random amount between two random accounts,
/// sometimes replaces the worker's scratch page, sometimes rolls back on purpose. The
/// sequence number is taken from `seq` just before the commit.
pub fn transfer(bm: &BufferManager, locks: &LockTable, bank: &Bank, slot: usize, rng: &mut Rng, seq: &AtomicU64, lock_wait: Duration) -> Result<Outcome> {
    let a = rng.below(bank.accounts);
    let b = (a + 1 + rng.below(bank.accounts - 1)) % bank.accounts;
    let churn = rng.below(8) == 0;
    let abort = rng.below(16) == 0;
    let (mut pa, mut pb) = (bank.account(bm, a), bank.account(bm, b));
    let mut tx = Transaction::begin(bm, locks);
    tx.set_lock_wait(lock_wait);
    let r = (|| -> Result<Option<u64>> {
        // Lock in page order so that workers never deadlock on account pages.
        if pa.0 > pb.0 {
            std::mem::swap(&mut pa, &mut pb);
        }
        tx.lock(pa.0)?;
        tx.lock(pb.0)?;
        let (ba, bb) = (tx.read_u64(pa.0, pa.1)?, tx.read_u64(pb.0, pb.1)?);
        let amount = rng.below(ba.min(1000) + 1);
        tx.write_u64(pa.0, pa.1, ba - amount)?;
        tx.write_u64(pb.0, pb.1, bb + amount)?;
        let slot_pid = bank.slots[slot];
        if churn {
            let old = PageId::from_raw(tx.read_u64(slot_pid, 8)?);
            let class = rng.below(CLASSES as u64).min(bm.classes().count() as u64 - 1) as u8;
            let size = bm.payload_size(class);
            let fresh = tx.alloc(size)?;
            let tag = rng.next_u64() | 1;
            tx.write_u64(fresh, 0, tag)?;
            tx.write_u64(fresh, (size - 8) & !7, tag)?;
            tx.write_u64(slot_pid, 8, fresh.raw())?;
            tx.write_u64(slot_pid, 16, tag)?;
            if old.raw() != 0 {
                tx.free(old)?;
            }
        }
        if abort {
            return Ok(None);
        }
        let s = seq.fetch_add(1, Ordering::Relaxed) + 1;
        tx.write_u64(slot_pid, 0, s)?;
        Ok(Some(s))
    })();
    finish(tx, r)
}

/// Ends a workload's transaction by what its body returned: `Some(seq)` commits, `None`
/// rolls back on purpose, a lock timeout or deadlock rolls back for a retry; other errors are
/// returned.
pub(crate) fn finish(tx: Transaction<'_>, body: Result<Option<u64>>) -> Result<Outcome> {
    match body {
        Ok(Some(s)) => {
            tx.commit()?;
            Ok(Outcome::Committed(s))
        }
        Ok(None) => {
            tx.abort()?;
            Ok(Outcome::Aborted)
        }
        Err(e) if e.is_lock_conflict() => {
            drop(tx);
            Ok(Outcome::Conflict)
        }
        Err(e) => Err(e),
    }
}

/// Reads the whole bank and checks it: total conserved, scratch pages intact, no page
/// leaked. `last_committed` is the largest sequence number in the slots.
pub fn verify(bm: &BufferManager, locks: &LockTable) -> Result<Verdict> {
    let bank = Bank::load(bm, locks)?;
    let mut tx = Transaction::begin(bm, locks);
    let mut total = 0u64;
    let mut problems = Vec::new();
    for i in 0..bank.accounts {
        let (pid, at) = bank.account(bm, i);
        total = total.wrapping_add(tx.read_u64(pid, at)?);
    }
    let mut last = 0;
    let mut scratch = 0;
    let mut referenced: std::collections::HashSet<PageId> =
        [ROOT].into_iter().chain(bank.account_pages.iter().copied()).chain(bank.slots.iter().copied()).collect();
    for &slot in &bank.slots {
        last = last.max(tx.read_u64(slot, 0)?);
        let pid = PageId::from_raw(tx.read_u64(slot, 8)?);
        if pid.raw() == 0 {
            continue;
        }
        let tag = tx.read_u64(slot, 16)?;
        if !bm.is_allocated(pid) {
            problems.push(format!("scratch page {pid} of slot {slot} is not allocated"));
            continue;
        }
        let size = payload_of(bm, pid);
        let (t0, t1) = (tx.read_u64(pid, 0)?, tx.read_u64(pid, (size - 8) & !7)?);
        if t0 != tag || t1 != tag {
            problems.push(format!("scratch page {pid} carries tags {t0:#x}/{t1:#x}, slot says {tag:#x}"));
        }
        referenced.insert(pid);
        scratch += 1;
    }
    tx.commit()?;
    let leaked = bm.allocated_pages().into_iter().filter(|p| !referenced.contains(p)).count() as u64;
    let expected_total = bank.accounts * bank.initial;
    if total != expected_total {
        problems.push(format!("balances sum to {total}, expected {expected_total}"));
    }
    if leaked > 0 {
        problems.push(format!("{leaked} allocated pages are referenced by nothing"));
    }
    Ok(Verdict { last_committed: last, total, expected_total, scratch_pages: scratch, leaked_pages: leaked, ok: problems.is_empty(), problems })
}
