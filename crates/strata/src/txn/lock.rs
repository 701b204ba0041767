//! Transaction-duration page locks (strict two-phase locking at page granularity).
//!
//! Latches protect a page for the instant of one access; locks protect it for a whole
//! transaction, so that no other transaction reads or overwrites bytes whose change may
//! still be rolled back (undo restores byte ranges, which is only correct if nobody else
//! changed them meanwhile). Locks are exclusive and taken before any latch; a transaction
//! never waits for a lock while it holds a latch. A wait that exceeds the timeout returns
//! [`Error::LockTimeout`] (the caller aborts and retries).
//!
//! # Deadlocks
//! Transactions that lock pages in different orders (B+-tree inserts of random keys from
//! several threads) can wait for each other in a cycle. Such a wait is refused at once
//! with [`Error::Deadlock`] rather than left to time out: since locks are exclusive, a
//! waiting transaction waits for exactly one other, the holder of the page it asked for,
//! so the table keeps, under its mutex, the page each waiting transaction waits for (the
//! waits-for graph, in which every transaction has at most one outgoing edge) and, before
//! a transaction waits and at each of its wakeups, follows the chain of holders from the
//! page it wants. A chain that leads back to the requester is a cycle, and the requester,
//! the transaction that would close it, is the victim: it holds no latch while it asks
//! (see above), so it can roll back at once, which releases its locks and lets the others
//! go on. Every cycle is found this way, by the transaction whose wait would close it: a
//! cycle's last edge appears either when a transaction starts to wait (and looks first) or
//! when a transaction takes a page others wait for (it is running then, not waiting, and
//! looks when it asks for a lock of theirs).
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
    table: Mutex<Table>,
    released: Condvar,
}

/// The state behind [`LockTable`]'s mutex.
#[derive(Default)]
struct Table {
    /// The holder of each locked page.
    owners: HashMap<PageId, u64>,
    /// The page each waiting transaction waits for: its edge of the waits-for graph leads
    /// to that page's holder in `owners`. Kept as the page rather than the holder, so that
    /// the edge follows the lock when it changes hands while the waiter sleeps (released
    /// to another waiter, or replaced by [`LockTable::grant_fresh`]).
    waits: HashMap<u64, PageId>,
}

impl Table {
    /// The waits-for cycle that `txid` would close by waiting for `holder`: `txid`, then
    /// each transaction in the chain of holders that leads back to it; `None` if the chain
    /// ends at a transaction that is not waiting (or at a page that is free now). The walk
    /// takes at most one step per waiting transaction, so a cycle that does not pass
    /// through `txid` (only possible for a moment, before its own closer looks) cannot keep
    /// it going.
    fn cycle(&self, txid: u64, holder: u64) -> Option<Vec<u64>> {
        // The walk allocates nothing (it runs under the table's mutex at every wait and
        // wakeup); the cycle is written out only once found, by walking it again.
        let next = |t: u64| self.waits.get(&t).and_then(|p| self.owners.get(p)).copied();
        let mut t = holder;
        let mut steps = 0;
        while t != txid {
            if steps > self.waits.len() {
                return None;
            }
            t = next(t)?;
            steps += 1;
        }
        let mut cycle = Vec::with_capacity(steps + 1);
        cycle.push(txid);
        let mut t = holder;
        while t != txid {
            cycle.push(t);
            t = next(t)?;
        }
        Some(cycle)
    }
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
    /// before a free lock is granted, and a page it denies is not locked. A wait that would
    /// close a cycle of waiting transactions is refused with [`Error::Deadlock`] (`txid` is
    /// the victim: it should roll back); a wait of `Duration::ZERO` never waits, so it
    /// times out rather than reporting a deadlock.
    pub fn acquire(&self, pid: PageId, txid: u64, wait: Duration, allocated: &dyn Fn(PageId) -> bool) -> Result<Grant> {
        let start = Instant::now();
        let mut table = self.table.lock();
        let mut waited = false;
        let r = loop {
            match table.owners.get(&pid) {
                None if !allocated(pid) => break Ok(Grant::NotAllocated),
                None => {
                    table.owners.insert(pid, txid);
                    break Ok(Grant::Taken);
                }
                Some(&o) if o == txid => break Ok(Grant::Held),
                Some(&o) => {
                    let left = wait.saturating_sub(start.elapsed());
                    if left.is_zero() {
                        break Err(Error::LockTimeout { pid, waited_ms: start.elapsed().as_millis() as u64 });
                    }
                    // Looked at again at each wakeup: the holder may have changed meanwhile.
                    if let Some(cycle) = table.cycle(txid, o) {
                        break Err(Error::Deadlock { pid, txid, cycle });
                    }
                    table.waits.insert(txid, pid);
                    waited = true;
                    // Timed out or not, the loop looks again (and gives up when the wait is
                    // spent and the lock still taken).
                    let _ = self.released.wait_for(&mut table, left);
                    #[cfg(loom)]
                    start.woke();
                }
            }
        };
        if waited {
            table.waits.remove(&txid);
        }
        r
    }

    /// Locks the newly allocated page `pid` for `txid`, without waiting. The caller (the
    /// allocator) calls it before the page's allocation is visible to
    /// [`acquire`](Self::acquire)'s `allocated`. An entry it finds belongs to the transaction
    /// that freed the page and is ending (it frees its pages before it releases their
    /// locks): it is replaced, and that transaction's release leaves the new owner's lock
    /// alone. Returns the replaced owner.
    pub fn grant_fresh(&self, pid: PageId, txid: u64) -> Option<u64> {
        self.table.lock().owners.insert(pid, txid).filter(|&o| o != txid)
    }

    /// Releases the locks `txid` holds on `pids`.
    pub fn release(&self, txid: u64, pids: &[PageId]) {
        if pids.is_empty() {
            return;
        }
        let mut table = self.table.lock();
        for pid in pids {
            if table.owners.get(pid) == Some(&txid) {
                table.owners.remove(pid);
            }
        }
        drop(table);
        self.released.notify_all();
    }

    /// The transaction holding the lock of `pid`.
    #[cfg(test)]
    pub(crate) fn owner(&self, pid: PageId) -> Option<u64> {
        self.table.lock().owners.get(&pid).copied()
    }

    /// Number of locked pages.
    pub fn len(&self) -> usize {
        self.table.lock().owners.len()
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

    /// Long enough that a test that finishes did not wait for it.
    const LONG: Duration = Duration::from_secs(30);

    /// Waits until `txid` sleeps in a lock wait.
    fn until_waiting(t: &LockTable, txid: u64) {
        while !t.table.lock().waits.contains_key(&txid) {
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Two transactions lock two pages in opposite orders: the second to ask closes the
    /// cycle and is refused at once with the cycle (itself, then the other); once it
    /// releases its lock, the other is granted it.
    #[test]
    fn opposite_orders_deadlock_and_one_goes_on() {
        let t = Arc::new(LockTable::default());
        let (a, b) = (PageId::new(0, false, 1), PageId::new(0, false, 2));
        let barrier = Arc::new(std::sync::Barrier::new(2));
        let run = |me: u64, first: PageId, second: PageId| {
            let (t, barrier) = (t.clone(), barrier.clone());
            std::thread::spawn(move || {
                assert_eq!(t.acquire(first, me, LONG, &any).unwrap(), Grant::Taken);
                barrier.wait();
                let r = t.acquire(second, me, LONG, &any);
                t.release(me, &[first, second]);
                r
            })
        };
        let (one, two) = (run(1, a, b), run(2, b, a));
        let results = [one.join().unwrap(), two.join().unwrap()];
        let victims: Vec<u64> = results
            .iter()
            .filter_map(|r| match r {
                Err(Error::Deadlock { txid, cycle, .. }) => {
                    assert_eq!(*cycle, vec![*txid, 3 - *txid]);
                    Some(*txid)
                }
                Ok(g) => {
                    assert_eq!(*g, Grant::Taken);
                    None
                }
                Err(e) => panic!("{e}"),
            })
            .collect();
        assert_eq!(victims.len(), 1, "{results:?}");
        assert!(t.is_empty() && t.table.lock().waits.is_empty());
    }

    /// Page `i` of the chain tests.
    fn page(i: u64) -> PageId {
        PageId::new(0, false, i)
    }

    /// Transactions 1, 2 and 3 hold pages 1, 2 and 3; 1 waits for page 2 and 2 for page 3
    /// (each in a thread that, once granted, releases both of its pages); returns the two
    /// threads once both wait.
    fn chain_of_two_waiters(t: &Arc<LockTable>) -> (std::thread::JoinHandle<Result<Grant>>, std::thread::JoinHandle<Result<Grant>>) {
        for me in 1..=3 {
            t.acquire(page(me), me, Duration::ZERO, &any).unwrap();
        }
        let waiter = |me: u64| {
            let t = t.clone();
            std::thread::spawn(move || {
                let r = t.acquire(page(me + 1), me, LONG, &any);
                t.release(me, &[page(me), page(me + 1)]);
                r
            })
        };
        let one = waiter(1);
        until_waiting(t, 1);
        let two = waiter(2);
        until_waiting(t, 2);
        (one, two)
    }

    /// 1 waits for 2, 2 for 3: 3 asking for 1's page closes a cycle of three.
    #[test]
    fn a_cycle_of_three_is_found() {
        let (t, p) = (Arc::new(LockTable::default()), page);
        let (one, two) = chain_of_two_waiters(&t);
        match t.acquire(p(1), 3, LONG, &any) {
            Err(Error::Deadlock { pid, txid: 3, cycle }) => {
                assert_eq!(pid, p(1));
                assert_eq!(cycle, vec![3, 1, 2]);
            }
            r => panic!("{r:?}"),
        }
        // The victim rolls back: the others go on.
        t.release(3, &[p(3)]);
        assert_eq!(two.join().unwrap().unwrap(), Grant::Taken);
        assert_eq!(one.join().unwrap().unwrap(), Grant::Taken);
        assert!(t.is_empty());
    }

    /// 1 waits for 2, which waits for 3, which is not waiting: a chain, not a cycle. A
    /// fourth transaction asking for 2's page times out (its wait is short) rather than
    /// being told of a deadlock, and once 3 releases, everyone is granted their lock.
    #[test]
    fn a_chain_is_not_a_deadlock() {
        let (t, p) = (Arc::new(LockTable::default()), page);
        let (one, two) = chain_of_two_waiters(&t);
        assert!(matches!(t.acquire(p(2), 4, Duration::from_millis(20), &any), Err(Error::LockTimeout { .. })));
        assert_eq!(t.acquire(p(4), 3, LONG, &any).unwrap(), Grant::Taken);
        t.release(3, &[p(3), p(4)]);
        assert_eq!(two.join().unwrap().unwrap(), Grant::Taken);
        assert_eq!(one.join().unwrap().unwrap(), Grant::Taken);
        assert!(t.is_empty() && t.table.lock().waits.is_empty());
    }

    /// A waiter's edge follows the lock of its page: 2 waits for page 7, whose freer 1's
    /// entry a fresh allocation by 3 replaces; 3 asking for 2's page then closes a cycle
    /// with 2, not with 1.
    #[test]
    fn the_waits_for_edge_follows_a_fresh_lock() {
        let t = Arc::new(LockTable::default());
        let (p, q) = (PageId::new(0, false, 7), PageId::new(0, false, 8));
        t.acquire(p, 1, Duration::ZERO, &any).unwrap();
        t.acquire(q, 2, Duration::ZERO, &any).unwrap();
        let t2 = t.clone();
        let waiter = std::thread::spawn(move || {
            let r = t2.acquire(p, 2, LONG, &any);
            t2.release(2, &[p, q]);
            r
        });
        until_waiting(&t, 2);
        assert_eq!(t.grant_fresh(p, 3), Some(1));
        t.release(1, &[p]);
        match t.acquire(q, 3, LONG, &any) {
            Err(Error::Deadlock { cycle, .. }) => assert_eq!(cycle, vec![3, 2]),
            r => panic!("{r:?}"),
        }
        t.release(3, &[p]);
        assert_eq!(waiter.join().unwrap().unwrap(), Grant::Taken);
        assert!(t.is_empty());
    }

    /// A cycle that does not pass through the requester (only possible for a moment) ends
    /// the walk rather than keeping it going.
    #[test]
    fn a_cycle_beside_the_requester_ends_the_walk() {
        let (a, b) = (PageId::new(0, false, 1), PageId::new(0, false, 2));
        let table = Table { owners: HashMap::from([(a, 1), (b, 2)]), waits: HashMap::from([(1, b), (2, a)]) };
        assert_eq!(table.cycle(3, 1), None);
        assert_eq!(table.cycle(1, 2), Some(vec![1, 2]));
    }

    /// A wait of zero (`Transaction::try_lock`) never waits, so it is never a deadlock.
    #[test]
    fn a_zero_wait_times_out_rather_than_deadlocks() {
        let t = Arc::new(LockTable::default());
        let (a, b) = (PageId::new(0, false, 1), PageId::new(0, false, 2));
        t.acquire(a, 1, Duration::ZERO, &any).unwrap();
        t.acquire(b, 2, Duration::ZERO, &any).unwrap();
        let t2 = t.clone();
        let waiter = std::thread::spawn(move || t2.acquire(b, 1, LONG, &any));
        until_waiting(&t, 1);
        assert!(matches!(t.acquire(a, 2, Duration::ZERO, &any), Err(Error::LockTimeout { .. })));
        t.release(2, &[b]);
        assert_eq!(waiter.join().unwrap().unwrap(), Grant::Taken);
    }
}
