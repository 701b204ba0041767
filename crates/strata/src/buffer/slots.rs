//! A lock-free stack of slot numbers (a Treiber stack over an index array), used by the
//! frame stash ([`super::recycle`]) for its full and empty slots, so that handing a frame
//! from an evicting thread to a loading one takes no lock.
//!
//! The head word packs a tag (high 32 bits, bumped by every successful push and pop) and
//! `top + 1` (low 32 bits; 0 is the empty stack). The tag makes a pop that read a stale
//! `next` fail its compare-and-swap even if the same slot is back on top (ABA): between the
//! pop's load of the head and its CAS, any other push or pop changes the tag. It wraps after
//! 2^32 operations, which a thread would have to sleep through between two instructions.
//!
//! Memory ordering: a push stores the slot's `next` and then publishes the slot with a
//! Release CAS of the head; a pop loads the head with Acquire, so it reads that `next`
//! (and whatever the pusher did to the slot before pushing, such as moving a frame into it).
//! A pop's `next` load may also race with a later push of the same slot by another thread
//! (after a pop and push cycle), but then the head's tag changed and the CAS fails.

use crate::sync::{AtomicU64, Ordering};

const EMPTY: u64 = 0;
const LOW: u64 = u32::MAX as u64;

/// A stack of distinct slot numbers `0..capacity`.
pub struct SlotStack {
    head: AtomicU64,
    next: Box<[AtomicU64]>,
}

impl SlotStack {
    /// An empty stack for slots `0..capacity` (`capacity < 2^32 - 1`).
    pub fn new(capacity: usize) -> SlotStack {
        assert!((capacity as u64) < LOW, "slot stack of {capacity} slots");
        SlotStack { head: AtomicU64::new(EMPTY), next: (0..capacity).map(|_| AtomicU64::new(EMPTY)).collect() }
    }

    /// A stack holding every slot `0..capacity`.
    pub fn full(capacity: usize) -> SlotStack {
        let s = SlotStack::new(capacity);
        for slot in (0..capacity as u32).rev() {
            s.push(slot);
        }
        s
    }

    /// Number of slots the stack can hold.
    pub fn capacity(&self) -> usize {
        self.next.len()
    }

    /// Pushes `slot`, which the caller owns (popped before, or never pushed): a slot must
    /// never be on the stack twice.
    pub fn push(&self, slot: u32) {
        let mut head = self.head.load(Ordering::Relaxed);
        loop {
            self.next[slot as usize].store(head & LOW, Ordering::Relaxed);
            let new = (head & !LOW).wrapping_add(1 << 32) | (slot as u64 + 1);
            match self.head.compare_exchange_weak(head, new, Ordering::Release, Ordering::Relaxed) {
                Ok(_) => return,
                Err(h) => head = h,
            }
        }
    }

    /// Pops a slot (which the caller then owns), or `None` if the stack is empty.
    pub fn pop(&self) -> Option<u32> {
        let mut head = self.head.load(Ordering::Acquire);
        loop {
            let top = head & LOW;
            if top == EMPTY {
                return None;
            }
            let next = self.next[(top - 1) as usize].load(Ordering::Relaxed);
            let new = (head & !LOW).wrapping_add(1 << 32) | next;
            match self.head.compare_exchange_weak(head, new, Ordering::Acquire, Ordering::Acquire) {
                Ok(_) => return Some((top - 1) as u32),
                Err(h) => head = h,
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn pops_what_was_pushed_last_first() {
        let s = SlotStack::new(4);
        assert_eq!(s.pop(), None);
        s.push(2);
        s.push(0);
        assert_eq!(s.pop(), Some(0));
        assert_eq!(s.pop(), Some(2));
        assert_eq!(s.pop(), None);
        let f = SlotStack::full(3);
        assert_eq!((f.pop(), f.pop(), f.pop(), f.pop()), (Some(0), Some(1), Some(2), None));
    }

    /// Threads move slots between two stacks at random; at the end every slot is on exactly
    /// one of them and no thread ever owned a slot another thread owned at the same time.
    #[test]
    fn concurrent_moves_lose_and_duplicate_nothing() {
        const SLOTS: usize = 64;
        let a = Arc::new(SlotStack::full(SLOTS));
        let b = Arc::new(SlotStack::new(SLOTS));
        let owners: Arc<Vec<std::sync::atomic::AtomicU32>> = Arc::new((0..SLOTS).map(|_| std::sync::atomic::AtomicU32::new(0)).collect());
        let threads: Vec<_> = (0..4u32)
            .map(|t| {
                let (a, b, owners) = (a.clone(), b.clone(), owners.clone());
                std::thread::spawn(move || {
                    let mut x = 0x9E37_79B9u32.wrapping_mul(t + 1);
                    for _ in 0..50_000 {
                        x ^= x << 13;
                        x ^= x >> 17;
                        x ^= x << 5;
                        let (from, to) = if x & 1 == 0 { (&a, &b) } else { (&b, &a) };
                        if let Some(slot) = from.pop() {
                            let prev = owners[slot as usize].swap(t + 1, std::sync::atomic::Ordering::SeqCst);
                            assert_eq!(prev, 0, "slot {slot} owned by two threads");
                            owners[slot as usize].store(0, std::sync::atomic::Ordering::SeqCst);
                            to.push(slot);
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let mut seen = [false; SLOTS];
        for s in [&a, &b] {
            while let Some(slot) = s.pop() {
                assert!(!seen[slot as usize], "slot {slot} on the stacks twice");
                seen[slot as usize] = true;
            }
        }
        assert!(seen.iter().all(|&s| s), "a slot was lost");
    }
}
