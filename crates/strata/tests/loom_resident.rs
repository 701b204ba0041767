#![cfg(loom)]
//! Loom model of the resident set's growth protocol (`strata::buffer`'s `resident` module):
//! a partition's slots grow in place (a new segment filled with EMPTY, then a larger mask
//! published with Release) while a load inserts a page under the mask it read and, after
//! the page's latch is handed over, an eviction scans the slots and removes the page by
//! probing under the current mask and then every smaller one.
//!
//! The model is the protocol in miniature, on loom's atomics (the module itself uses
//! `OnceLock`, which loom does not model): 2 slots growing to 4, a page id's home slot is
//! `id & mask`, page 4 sits in slot 0, and page 6 is inserted (home 0 under mask 1, so it
//! probes on to slot 1; home 2 under mask 3). Slots 2 and 3 start as UNFILLED, standing for
//! memory that is not a published segment yet. Every interleaving must have the eviction
//! see no UNFILLED slot under the mask it read, and find page 6 and remove it.
//!
//! ```text
//! RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test -p strata --release --test loom_resident
//! ```

use loom::sync::atomic::{AtomicU64, AtomicUsize, Ordering::*};
use loom::sync::Arc;
use loom::thread;

const EMPTY: u64 = u64::MAX;
const TOMBSTONE: u64 = u64::MAX - 1;
/// Memory outside every published segment (the real set has no slot there at all).
const UNFILLED: u64 = 0;
const FIRST_MASK: usize = 1;

struct Set {
    slots: Vec<AtomicU64>,
    mask: AtomicUsize,
}

impl Set {
    fn new() -> Set {
        let slots = vec![AtomicU64::new(4), AtomicU64::new(EMPTY), AtomicU64::new(UNFILLED), AtomicU64::new(UNFILLED)];
        Set { slots, mask: AtomicUsize::new(FIRST_MASK) }
    }

    fn slot(&self, i: usize) -> u64 {
        let v = self.slots[i].load(Acquire);
        assert_ne!(v, UNFILLED, "slot {i} read before its segment was published");
        v
    }

    fn insert(&self, pid: u64) {
        let mask = self.mask.load(Acquire);
        let mut i = pid as usize & mask;
        loop {
            let cur = self.slot(i);
            if (cur == EMPTY || cur == TOMBSTONE) && self.slots[i].compare_exchange(cur, pid, AcqRel, Relaxed).is_ok() {
                return;
            }
            i = (i + 1) & mask;
        }
    }

    fn remove(&self, pid: u64) -> bool {
        let mut mask = self.mask.load(Acquire);
        loop {
            let mut i = pid as usize & mask;
            for _ in 0..=mask {
                match self.slot(i) {
                    EMPTY => break,
                    v if v == pid => {
                        self.slots[i].store(TOMBSTONE, Release);
                        return true;
                    }
                    _ => i = (i + 1) & mask,
                }
            }
            if mask <= FIRST_MASK {
                return false;
            }
            mask >>= 1;
        }
    }

    fn grow(&self) {
        // The new segment: filled, then published by the mask.
        self.slots[2].store(EMPTY, Relaxed);
        self.slots[3].store(EMPTY, Relaxed);
        self.mask.store(3, Release);
    }

    /// The clock: every page id in the slots under the current mask.
    fn scan(&self) -> Vec<u64> {
        let mask = self.mask.load(Acquire);
        (0..=mask).map(|i| self.slot(i)).filter(|&v| v != EMPTY && v != TOMBSTONE).collect()
    }
}

#[test]
fn growth_loses_no_page_and_exposes_no_unfilled_slot() {
    loom::model(|| {
        let set = Arc::new(Set::new());
        // The page's exclusive latch, handed from the load to the eviction.
        let latch = Arc::new(AtomicU64::new(0));
        let loader = {
            let (set, latch) = (set.clone(), latch.clone());
            thread::spawn(move || {
                set.insert(6);
                latch.store(1, Release);
            })
        };
        let grower = {
            let set = set.clone();
            thread::spawn(move || set.grow())
        };
        // The evictor: scans (before or after the growth), then, holding the latch, removes.
        let seen = set.scan();
        assert!(seen.contains(&4), "{seen:?}");
        while latch.load(Acquire) == 0 {
            thread::yield_now();
        }
        assert!(set.scan().contains(&6));
        assert!(set.remove(6), "page 6 lost");
        assert!(!set.scan().contains(&6));
        loader.join().unwrap();
        grower.join().unwrap();
        assert!(set.remove(4));
        assert!(set.scan().is_empty());
    });
}
