//! Transaction-duration page locks (strict two-phase locking at page granularity).
//!
//! Latches protect a page for the instant of one access; locks protect it for a whole
//! transaction, so that no other transaction reads or overwrites bytes whose change may
//! still be rolled back (undo restores byte ranges, which is only correct if nobody else
//! changed them meanwhile). Locks are exclusive and taken before any latch; a transaction
//! never waits for a lock while it holds a latch. A wait that would close a cycle of
//! waiting transactions fails at once with [`Error::Deadlock`], and a wait that exceeds
//! the timeout returns [`Error::LockTimeout`]; either way the caller aborts and retries.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::error::{Error, Result};
use crate::storage::PageId;

/// The lock table shared by all transactions of a database.
#[derive(Default)]
pub struct LockTable {
    owners: Mutex<Owners>,
    released: Condvar,
}

/// Who holds each locked page, and which page each waiting transaction waits for.
#[derive(Default)]
struct Owners {
    held: HashMap<PageId, u64>,
    waiting: HashMap<u64, PageId>,
}

impl Owners {
    /// Whether `txid` waiting for a page held by `owner` closes a cycle of waits.
    fn closes_cycle(&self, txid: u64, mut owner: u64) -> bool {
        // Each transaction waits for at most one page, so the chain has no branches; its
        // length is bounded by the number of waiters.
        for _ in 0..=self.waiting.len() {
            if owner == txid {
                return true;
            }
            match self.waiting.get(&owner).and_then(|p| self.held.get(p)) {
                Some(&next) => owner = next,
                None => return false,
            }
        }
        false
    }
}

impl LockTable {
    /// Locks `pid` for transaction `txid`; returns whether it was newly taken (false: the
    /// transaction held it already).
    pub fn acquire(&self, pid: PageId, txid: u64, wait: Duration) -> Result<bool> {
        let start = Instant::now();
        let mut owners = self.owners.lock();
        loop {
            match owners.held.get(&pid) {
                None => {
                    owners.held.insert(pid, txid);
                    owners.waiting.remove(&txid);
                    return Ok(true);
                }
                Some(&o) if o == txid => return Ok(false),
                Some(&o) => {
                    if owners.closes_cycle(txid, o) {
                        owners.waiting.remove(&txid);
                        return Err(Error::Deadlock { pid });
                    }
                    owners.waiting.insert(txid, pid);
                    let left = wait.saturating_sub(start.elapsed());
                    if left.is_zero() || self.released.wait_for(&mut owners, left).timed_out() && owners.held.get(&pid).is_some_and(|&o| o != txid) {
                        owners.waiting.remove(&txid);
                        return Err(Error::LockTimeout { pid, waited_ms: start.elapsed().as_millis() as u64 });
                    }
                }
            }
        }
    }

    /// Releases the locks `txid` holds on `pids`.
    pub fn release(&self, txid: u64, pids: &[PageId]) {
        if pids.is_empty() {
            return;
        }
        let mut owners = self.owners.lock();
        for pid in pids {
            if owners.held.get(pid) == Some(&txid) {
                owners.held.remove(pid);
            }
        }
        drop(owners);
        self.released.notify_all();
    }

    /// Number of locked pages.
    pub fn len(&self) -> usize {
        self.owners.lock().held.len()
    }

    /// Number of transactions waiting for a lock.
    pub fn waiters(&self) -> usize {
        self.owners.lock().waiting.len()
    }

    /// Whether no page is locked.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn exclusive_reentrant_and_timeout() {
        let t = LockTable::default();
        let p = PageId::new(0, false, 1);
        assert!(t.acquire(p, 1, Duration::ZERO).unwrap());
        assert!(!t.acquire(p, 1, Duration::ZERO).unwrap());
        assert!(matches!(t.acquire(p, 2, Duration::from_millis(20)), Err(Error::LockTimeout { .. })));
        t.release(1, &[p]);
        assert!(t.acquire(p, 2, Duration::ZERO).unwrap());
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn waiter_gets_the_lock_when_released() {
        let t = Arc::new(LockTable::default());
        let p = PageId::new(0, false, 7);
        t.acquire(p, 1, Duration::ZERO).unwrap();
        let t2 = t.clone();
        let waiter = std::thread::spawn(move || t2.acquire(p, 2, Duration::from_secs(10)));
        std::thread::sleep(Duration::from_millis(20));
        t.release(1, &[p]);
        assert!(waiter.join().unwrap().unwrap());
    }
}
