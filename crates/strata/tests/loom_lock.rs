#![cfg(loom)]
//! Loom model of the transaction lock table (`strata::txn::LockTable`: a mutex over the
//! owners plus a condition variable for waiters): (a) transactions acquiring and releasing
//! the same and different pages never hold a lock together, re-acquiring gives `Held`, and
//! every acquire ends (taken or timed out); (b) a transaction that waits for the lock of a
//! page its holder frees (free, then release) is refused it, never granted the lock of an
//! unallocated page; (c) an allocation that takes the lock with `grant_fresh` before it
//! sets the allocation bit, racing an acquire of the same page and the freer's release,
//! never lets the acquirer hold the page together with the allocating transaction; (d) two
//! transactions locking two pages in opposite orders never both block: when their waits
//! would close a cycle, one of them is refused with `Deadlock` and the other goes on.
//!
//! Under loom a timed wait ends at a notification only and the lock table counts each
//! wakeup that finds the lock still taken as one millisecond (see `txn::lock`), so a wait
//! of `n` ms may time out after `n` such wakeups: `LockTimeout` is an allowed outcome
//! wherever a wakeup can find the lock taken again.
//!
//! ```text
//! RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test -p strata --release --test loom_lock
//! ```

use std::time::Duration;

use loom::sync::atomic::{AtomicU64, Ordering::*};
use loom::sync::{Arc, Mutex};
use loom::thread;

use strata::error::Error;
use strata::storage::PageId;
use strata::txn::{Grant, LockTable};

/// Long enough never to run out in these models (a wait lasts this many wakeups).
const LONG: Duration = Duration::from_secs(10);
/// One wakeup.
const SHORT: Duration = Duration::from_millis(1);

fn page(i: u64) -> PageId {
    PageId::new(0, false, i)
}

fn any(_: PageId) -> bool {
    true
}

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    if b.preemption_bound.is_none() {
        b.preemption_bound = Some(3);
    }
    b.check(f);
}

/// Who uses each page now (0: nobody), checked with read-modify-writes that see the latest
/// value: a transaction claims a page after its lock is granted and gives it back before
/// the release.
struct Users(Vec<AtomicU64>);

impl Users {
    fn new(n: usize) -> Users {
        Users((0..n).map(|_| AtomicU64::new(0)).collect())
    }

    fn claim(&self, i: u64, me: u64) {
        let prev = self.0[i as usize].swap(me, SeqCst);
        assert_eq!(prev, 0, "tx {me} was granted page {i} while tx {prev} holds it");
    }

    fn give_back(&self, i: u64, me: u64) {
        let prev = self.0[i as usize].swap(0, SeqCst);
        assert_eq!(prev, me, "tx {me} gave back page {i}, which tx {prev} used");
    }
}

/// (a) Two transactions lock page 0 (waiting as long as it takes); a third locks page 1,
/// then page 0 with a wait of one wakeup. None uses a page while another does, a
/// re-acquire is `Held`, the long waits always end with the lock, the short one with the
/// lock or a timeout, and the table is empty at the end.
#[test]
fn locks_are_exclusive_and_every_acquire_ends() {
    model(|| {
        let t = Arc::new(LockTable::default());
        let users = Arc::new(Users::new(2));
        let waiters: Vec<_> = (1..=2u64)
            .map(|me| {
                let (t, users) = (t.clone(), users.clone());
                thread::spawn(move || {
                    assert_eq!(t.acquire(page(0), me, LONG, &any).unwrap(), Grant::Taken);
                    users.claim(0, me);
                    assert_eq!(t.acquire(page(0), me, LONG, &any).unwrap(), Grant::Held);
                    users.give_back(0, me);
                    t.release(me, &[page(0)]);
                })
            })
            .collect();
        let two = {
            let (t, users) = (t.clone(), users.clone());
            thread::spawn(move || {
                assert_eq!(t.acquire(page(1), 3, SHORT, &any).unwrap(), Grant::Taken);
                users.claim(1, 3);
                let mut held = vec![page(1)];
                match t.acquire(page(0), 3, SHORT, &any) {
                    Ok(Grant::Taken) => {
                        users.claim(0, 3);
                        users.give_back(0, 3);
                        held.push(page(0));
                    }
                    Err(Error::LockTimeout { .. }) => {}
                    r => panic!("tx 3 on page 0: {r:?}"),
                }
                users.give_back(1, 3);
                t.release(3, &held);
            })
        };
        for w in waiters {
            w.join().unwrap();
        }
        two.join().unwrap();
        assert!(t.is_empty(), "a lock outlived its release");
    });
}

/// The allocation bit of the model's page, read and written as `Space::is_allocated` and
/// `Space::mirror_allocated` do (acquire load; release read-modify-writes under the
/// bitmap's lock).
struct Bitmap {
    lock: Mutex<()>,
    bit: AtomicU64,
}

impl Bitmap {
    fn new(allocated: bool) -> Bitmap {
        Bitmap { lock: Mutex::new(()), bit: AtomicU64::new(allocated.into()) }
    }

    fn is_allocated(&self) -> bool {
        self.bit.load(Acquire) != 0
    }

    fn free(&self) {
        let _g = self.lock.lock().unwrap();
        assert_eq!(self.bit.fetch_and(0, Release), 1, "double free");
    }
}

/// Transaction 1 holds page 0's lock (page allocated, in use by 1); a thread it runs on
/// stops using the page, frees it and releases the lock, in that order.
fn held_then_freed() -> (Arc<LockTable>, Arc<Bitmap>, Arc<Users>, thread::JoinHandle<()>) {
    let t = Arc::new(LockTable::default());
    let bm = Arc::new(Bitmap::new(true));
    let users = Arc::new(Users::new(1));
    assert_eq!(t.acquire(page(0), 1, Duration::ZERO, &any).unwrap(), Grant::Taken);
    users.claim(0, 1);
    let freer = {
        let (t, bm, users) = (t.clone(), bm.clone(), users.clone());
        thread::spawn(move || {
            users.give_back(0, 1);
            bm.free();
            t.release(1, &[page(0)]);
        })
    };
    (t, bm, users, freer)
}

/// (b) Transaction 1 holds page 0's lock, frees the page and then releases the lock (the
/// order `Transaction::finish_freeing` keeps). Transaction 2 waits for the lock, 3 tries it
/// without waiting: neither is ever granted the freed page; 2 is refused it (its wait
/// outlasts 1's hold), 3 is refused it or times out.
#[test]
fn a_page_freed_under_its_lock_is_not_granted() {
    model(|| {
        let (t, bm, _users, freer) = held_then_freed();
        let waiters: Vec<_> = [(2u64, LONG), (3, Duration::ZERO)]
            .into_iter()
            .map(|(me, wait)| {
                let (t, bm) = (t.clone(), bm.clone());
                thread::spawn(move || match t.acquire(page(0), me, wait, &|_| bm.is_allocated()) {
                    Ok(Grant::NotAllocated) => {}
                    Err(Error::LockTimeout { .. }) if wait.is_zero() => {}
                    r => panic!("tx {me} acquiring the page tx 1 freed: {r:?}"),
                })
            })
            .collect();
        freer.join().unwrap();
        for w in waiters {
            w.join().unwrap();
        }
        assert!(t.is_empty(), "a lock outlived its release or was granted on a free page");
    });
}

/// (c) Transaction 1 holds page 0's lock, frees the page and releases the lock; an
/// allocator (transaction 3) that finds the page free under the bitmap's lock takes the
/// lock with `grant_fresh` and only then sets the allocation bit, uses the page and
/// releases; transaction 2 acquires the page meanwhile. 2 and 3 never use the page at
/// once: 2 is refused it (it ran before the allocation), or is granted it after 3 released
/// (or times out after one wakeup). 1's release leaves 3's lock alone.
#[test]
fn a_fresh_lock_is_not_shared_with_an_acquirer() {
    model(|| {
        let (t, bm, users, freer) = held_then_freed();
        let allocator = {
            let (t, bm, users) = (t.clone(), bm.clone(), users.clone());
            thread::spawn(move || {
                let g = bm.lock.lock().unwrap();
                if bm.bit.load(Relaxed) != 0 {
                    return; // Not freed yet: this allocation took another page.
                }
                let replaced = t.grant_fresh(page(0), 3);
                assert!(replaced.is_none() || replaced == Some(1), "grant_fresh replaced {replaced:?}");
                bm.bit.fetch_or(1, Release);
                drop(g);
                users.claim(0, 3);
                assert_eq!(t.acquire(page(0), 3, Duration::ZERO, &|_| bm.is_allocated()).unwrap(), Grant::Held);
                users.give_back(0, 3);
                t.release(3, &[page(0)]);
            })
        };
        let acquirer = {
            let (t, bm, users) = (t.clone(), bm.clone(), users.clone());
            thread::spawn(move || match t.acquire(page(0), 2, SHORT, &|_| bm.is_allocated()) {
                Ok(Grant::Taken) => {
                    assert!(bm.is_allocated(), "tx 2 was granted an unallocated page");
                    users.claim(0, 2);
                    users.give_back(0, 2);
                    t.release(2, &[page(0)]);
                }
                Ok(Grant::NotAllocated) | Err(Error::LockTimeout { .. }) => {}
                r => panic!("tx 2: {r:?}"),
            })
        };
        freer.join().unwrap();
        allocator.join().unwrap();
        acquirer.join().unwrap();
        assert!(t.is_empty(), "a lock outlived its release");
    });
}

/// (d) Transactions 1 and 2 lock pages 0 and 1 in opposite orders, each waiting as long as
/// it takes. However their steps interleave, neither waits forever (loom would report the
/// deadlock): either they did not overlap and both are granted both pages, or the one
/// whose wait would close the cycle is refused with `Deadlock` (the cycle: itself, then the
/// other), releases its page, and the other is granted both. They never both fail, never
/// use a page together, and the table is empty at the end.
#[test]
fn opposite_orders_end_with_one_victim_or_none() {
    model(|| {
        let t = Arc::new(LockTable::default());
        let users = Arc::new(Users::new(2));
        let sides: Vec<_> = [(1u64, 0u64, 1u64), (2, 1, 0)]
            .into_iter()
            .map(|(me, first, second)| {
                let (t, users) = (t.clone(), users.clone());
                thread::spawn(move || {
                    let mut held = Vec::new();
                    let mut r = Ok(());
                    for i in [first, second] {
                        match t.acquire(page(i), me, LONG, &any) {
                            Ok(Grant::Taken) => {
                                users.claim(i, me);
                                held.push(i);
                            }
                            Err(Error::Deadlock { pid, txid, cycle }) => {
                                assert_eq!((pid, txid, cycle), (page(i), me, vec![me, 3 - me]));
                                r = Err(());
                                break;
                            }
                            r => panic!("tx {me} on page {i}: {r:?}"),
                        }
                    }
                    for &i in &held {
                        users.give_back(i, me);
                    }
                    t.release(me, &held.iter().map(|&i| page(i)).collect::<Vec<_>>());
                    r
                })
            })
            .collect();
        let failed = sides.into_iter().map(|s| s.join().unwrap()).filter(|r| r.is_err()).count();
        assert!(failed <= 1, "both transactions were refused");
        assert!(t.is_empty(), "a lock outlived its release");
    });
}
