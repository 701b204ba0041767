//! Transaction-duration page locks (strict two-phase locking at page granularity).
//!
//! Latches protect a page for the instant of one access; locks protect it for a whole
//! transaction, so that no other transaction reads or overwrites bytes whose change may
//! still be rolled back (undo restores byte ranges, which is only correct if nobody else
//! changed them meanwhile). Locks are exclusive and taken before any latch; a transaction
//! never waits for a lock while it holds a latch. A wait that exceeds the timeout returns
//! [`Error::LockTimeout`]: that is how deadlocks are broken (the caller aborts and retries).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::error::{Error, Result};
use crate::storage::PageId;

/// The lock table shared by all transactions of a database.
#[derive(Default)]
pub struct LockTable {
    owners: Mutex<HashMap<PageId, u64>>,
    released: Condvar,
}

impl LockTable {
    /// Locks `pid` for transaction `txid`; returns whether it was newly taken (false: the
    /// transaction held it already).
    pub fn acquire(&self, pid: PageId, txid: u64, wait: Duration) -> Result<bool> {
        let start = Instant::now();
        let mut owners = self.owners.lock();
        loop {
            match owners.get(&pid) {
                None => {
                    owners.insert(pid, txid);
                    return Ok(true);
                }
                Some(&o) if o == txid => return Ok(false),
                Some(_) => {
                    let left = wait.saturating_sub(start.elapsed());
                    if left.is_zero() || self.released.wait_for(&mut owners, left).timed_out() && owners.get(&pid).is_some_and(|&o| o != txid) {
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
            if owners.get(pid) == Some(&txid) {
                owners.remove(pid);
            }
        }
        drop(owners);
        self.released.notify_all();
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
