//! Transaction-duration page locks (strict two-phase locking at page granularity).
//!
//! Latches protect a page for the instant of one access; locks protect it for a whole
//! transaction, so that no other transaction reads or overwrites bytes whose change may
//! still be rolled back (undo restores byte ranges, which is only correct if nobody else
//! changed them meanwhile). Locks are exclusive and taken before any latch; a transaction
//! never waits for a lock while it holds a latch. A wait that exceeds the timeout returns
//! [`Error::LockTimeout`]: that is how deadlocks are broken (the caller aborts and retries).
//!
//! # Locks of freed pages
//! Only an allocated page can be locked: [`LockTable::acquire`] checks, under the table's
//! mutex, that the page is allocated when it grants the lock, and refuses it
//! ([`Grant::NotAllocated`]) otherwise. A transaction frees pages while it still holds their
//! locks and releases them after, so a transaction that waited for one of them finds it
//! free and unallocated and is refused, rather than keeping the lock of a page that is no
//! longer there. A newly allocated page is locked with [`LockTable::grant_fresh`] before its
//! allocation is visible (the allocator calls it under the class's bitmap lock, before it
//! sets the page's allocation bit): it never waits, and it replaces the entry of the
//! transaction that freed the page, which is ending and has no use for it. So an
//! `acquire` that sees the page unallocated ran before the allocation locked it, and one
//! that runs after waits for the allocating transaction, like for any other lock.

use std::collections::HashMap;
use std::time::Duration;
#[cfg(not(loom))]
use std::time::Instant;

use crate::error::{Error, Result};
use crate::storage::PageId;
use crate::sync::{Condvar, Mutex};

/// The clock of [`LockTable::acquire`]'s waits under loom, where a wait's time is counted in
/// wakeups: one millisecond per wakeup that found the lock still taken, so a wait of `n`
/// ms gives up after `n` such wakeups, and `Duration::ZERO` at once, as it does outside
/// loom. Loom's timed wait never times out (it returns at a notification only) and a real
/// clock would make a model's executions differ from one run to the next, which loom
/// cannot replay; counting wakeups keeps the executions deterministic and still lets a
/// model reach the timeout (a wakeup that finds the lock taken again, by a third
/// transaction or by a fresh allocation). A holder that never releases is not modelled:
/// its waiter would never wake, which loom reports as a deadlock.
#[cfg(loom)]
struct Instant(std::cell::Cell<u32>);

#[cfg(loom)]
impl Instant {
    fn now() -> Instant {
        Instant(std::cell::Cell::new(0))
    }

    fn elapsed(&self) -> Duration {
        Duration::from_millis(self.0.get().into())
    }

    fn woke(&self) {
        self.0.set(self.0.get() + 1);
    }
}

/// The lock table shared by all transactions of a database.
#[derive(Default)]
pub struct LockTable {
    owners: Mutex<HashMap<PageId, u64>>,
    released: Condvar,
}

/// What [`LockTable::acquire`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Grant {
    /// The lock was free and is the transaction's now.
    Taken,
    /// The transaction held the lock already.
    Held,
    /// The lock was free but the page is not allocated (a transaction this one waited for
    /// freed it): nothing was locked.
    NotAllocated,
}

impl LockTable {
    /// Locks `pid` for transaction `txid`, waiting at most `wait` for another holder.
    /// `allocated` says whether a page is allocated; it is asked under the table's mutex
    /// before a free lock is granted, and a page it denies is not locked.
    pub fn acquire(&self, pid: PageId, txid: u64, wait: Duration, allocated: &dyn Fn(PageId) -> bool) -> Result<Grant> {
        let start = Instant::now();
        let mut owners = self.owners.lock();
        loop {
            match owners.get(&pid) {
                None if !allocated(pid) => return Ok(Grant::NotAllocated),
                None => {
                    owners.insert(pid, txid);
                    return Ok(Grant::Taken);
                }
                Some(&o) if o == txid => return Ok(Grant::Held),
                Some(_) => {
                    let left = wait.saturating_sub(start.elapsed());
                    if left.is_zero() {
                        return Err(Error::LockTimeout { pid, waited_ms: start.elapsed().as_millis() as u64 });
                    }
                    // Timed out or not, the loop looks again (and gives up when the wait is
                    // spent and the lock still taken).
                    let _ = self.released.wait_for(&mut owners, left);
                    #[cfg(loom)]
                    start.woke();
                }
            }
        }
    }

    /// Locks the newly allocated page `pid` for `txid`, without waiting. The caller (the
    /// allocator) calls it before the page's allocation is visible to
    /// [`acquire`](Self::acquire)'s `allocated`. An entry it finds belongs to the transaction
    /// that freed the page and is ending (it frees its pages before it releases their
    /// locks): it is replaced, and that transaction's release leaves the new owner's lock
    /// alone. Returns the replaced owner.
    pub fn grant_fresh(&self, pid: PageId, txid: u64) -> Option<u64> {
        self.owners.lock().insert(pid, txid).filter(|&o| o != txid)
    }

    /// Releases the locks `txid` holds on `pids`.
    pub fn release(&self, txid: u64, pids: &[PageId]) {
        if pids.is_empty() {
            return;
        }
        let mut owners = self.owners.lock();
        for pid in pids {
            if owners.get(pid) == Some(&txid) {
                owners.remove(pid);
            }
        }
        drop(owners);
        self.released.notify_all();
    }

    /// The transaction holding the lock of `pid`.
    #[cfg(test)]
    pub(crate) fn owner(&self, pid: PageId) -> Option<u64> {
        self.owners.lock().get(&pid).copied()
    }

    /// Number of locked pages.
    pub fn len(&self) -> usize {
        self.owners.lock().len()
    }

    /// Whether no page is locked.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    fn any(_: PageId) -> bool {
        true
    }

    #[test]
    fn exclusive_reentrant_and_timeout() {
        let t = LockTable::default();
        let p = PageId::new(0, false, 1);
        assert_eq!(t.acquire(p, 1, Duration::ZERO, &any).unwrap(), Grant::Taken);
        assert_eq!(t.acquire(p, 1, Duration::ZERO, &any).unwrap(), Grant::Held);
        assert!(matches!(t.acquire(p, 2, Duration::from_millis(20), &any), Err(Error::LockTimeout { .. })));
        t.release(1, &[p]);
        assert_eq!(t.acquire(p, 2, Duration::ZERO, &any).unwrap(), Grant::Taken);
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn waiter_gets_the_lock_when_released() {
        let t = Arc::new(LockTable::default());
        let p = PageId::new(0, false, 7);
        t.acquire(p, 1, Duration::ZERO, &any).unwrap();
        let t2 = t.clone();
        let waiter = std::thread::spawn(move || t2.acquire(p, 2, Duration::from_secs(10), &any));
        std::thread::sleep(Duration::from_millis(20));
        t.release(1, &[p]);
        assert_eq!(waiter.join().unwrap().unwrap(), Grant::Taken);
    }

    /// The lock of a page that is not allocated is never granted.
    #[test]
    fn an_unallocated_page_is_not_locked() {
        let t = LockTable::default();
        let p = PageId::new(0, false, 3);
        assert_eq!(t.acquire(p, 1, Duration::ZERO, &|_| false).unwrap(), Grant::NotAllocated);
        assert!(t.is_empty());
    }

    /// Transaction 1 frees the page whose lock 2 waits for, then releases its locks (the
    /// order `Transaction::finish_freeing` keeps): 2 is refused, and holds nothing.
    #[test]
    fn a_waiter_for_a_page_freed_by_its_holder_is_refused() {
        let t = Arc::new(LockTable::default());
        let allocated = Arc::new(AtomicBool::new(true));
        let p = PageId::new(0, false, 7);
        t.acquire(p, 1, Duration::ZERO, &any).unwrap();
        let (t2, a2) = (t.clone(), allocated.clone());
        let waiter = std::thread::spawn(move || t2.acquire(p, 2, Duration::from_secs(10), &|_| a2.load(Ordering::SeqCst)));
        std::thread::sleep(Duration::from_millis(20));
        allocated.store(false, Ordering::SeqCst);
        t.release(1, &[p]);
        assert_eq!(waiter.join().unwrap().unwrap(), Grant::NotAllocated);
        assert!(t.is_empty());
    }

    /// The freed page is allocated again before its freer released its lock: the new
    /// owner's lock is granted at once, the freer's release leaves it alone, and the waiter
    /// for the old page waits for the new owner like for any other lock.
    #[test]
    fn a_fresh_page_is_locked_at_once_over_its_freers_entry() {
        let t = Arc::new(LockTable::default());
        let allocated = Arc::new(AtomicBool::new(true));
        let p = PageId::new(0, false, 7);
        t.acquire(p, 1, Duration::ZERO, &any).unwrap();
        let (t2, a2) = (t.clone(), allocated.clone());
        let waiter = std::thread::spawn(move || t2.acquire(p, 2, Duration::from_millis(200), &|_| a2.load(Ordering::SeqCst)));
        std::thread::sleep(Duration::from_millis(20));
        allocated.store(false, Ordering::SeqCst);
        assert_eq!(t.grant_fresh(p, 3), Some(1));
        allocated.store(true, Ordering::SeqCst);
        t.release(1, &[p]);
        assert!(matches!(waiter.join().unwrap(), Err(Error::LockTimeout { .. })));
        assert_eq!(t.acquire(p, 3, Duration::ZERO, &any).unwrap(), Grant::Held);
        t.release(3, &[p]);
        assert_eq!(t.acquire(p, 2, Duration::ZERO, &any).unwrap(), Grant::Taken);
    }
}
