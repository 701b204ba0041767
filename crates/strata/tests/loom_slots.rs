#![cfg(loom)]
//! Loom model of the frame stash's slot stacks (`strata::buffer::slots::SlotStack`, a
//! tagged Treiber stack): threads move slots between a "full" and an "empty" stack, as
//! evictions (empty -> full) and loads (full -> empty) do. Every interleaving must keep each
//! slot on exactly one stack or in exactly one thread's hands, and a thread that pops a
//! slot must see what the pushing thread wrote into it before the push (the frame it moved
//! there).
//!
//! ```text
//! RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test -p strata --release --test loom_slots
//! ```

use loom::sync::atomic::{AtomicU64, Ordering::*};
use loom::sync::Arc;
use loom::thread;

use strata::buffer::slots::SlotStack;

const SLOTS: usize = 2;

struct Pool {
    full: SlotStack,
    empty: SlotStack,
    /// Who holds each slot now (0: on a stack), checked with read-modify-writes that see
    /// the latest value.
    owner: Vec<AtomicU64>,
    /// What the slot holds: written by the thread that owns it before pushing it.
    content: Vec<AtomicU64>,
}

fn take(p: &Pool, from: &SlotStack, me: u64) -> Option<u32> {
    let slot = from.pop()?;
    let prev = p.owner[slot as usize].swap(me, Relaxed);
    assert_eq!(prev, 0, "slot {slot} popped while thread {prev} holds it");
    Some(slot)
}

fn give(p: &Pool, to: &SlotStack, slot: u32, me: u64, value: u64) {
    p.content[slot as usize].store(value, Relaxed);
    let prev = p.owner[slot as usize].swap(0, Relaxed);
    assert_eq!(prev, me);
    to.push(slot);
}

#[test]
fn slots_move_between_stacks_without_loss_or_sharing() {
    let mut b = loom::model::Builder::new();
    if b.preemption_bound.is_none() {
        b.preemption_bound = Some(3);
    }
    b.check(|| {
        let p = Arc::new(Pool {
            full: SlotStack::new(SLOTS),
            empty: SlotStack::full(SLOTS),
            owner: (0..SLOTS).map(|_| AtomicU64::new(0)).collect(),
            content: (0..SLOTS).map(|_| AtomicU64::new(0)).collect(),
        });
        // Two "evictors" fill a slot each; one "loader" takes whatever is full and checks
        // it sees the evictor's write.
        let evictors: Vec<_> = (1..=2u64)
            .map(|me| {
                let p = p.clone();
                thread::spawn(move || {
                    if let Some(slot) = take(&p, &p.empty, me) {
                        give(&p, &p.full, slot, me, 100 + me);
                    }
                })
            })
            .collect();
        let loader = {
            let p = p.clone();
            thread::spawn(move || {
                if let Some(slot) = take(&p, &p.full, 9) {
                    let v = p.content[slot as usize].load(Relaxed);
                    assert!(v == 101 || v == 102, "popped a full slot without its content: {v}");
                    give(&p, &p.empty, slot, 9, 0);
                }
            })
        };
        for e in evictors {
            e.join().unwrap();
        }
        loader.join().unwrap();
        // Every slot is on exactly one stack.
        let mut seen = [0u32; SLOTS];
        for s in [&p.full, &p.empty] {
            while let Some(slot) = s.pop() {
                seen[slot as usize] += 1;
            }
        }
        assert_eq!(seen, [1; SLOTS], "a slot was lost or duplicated");
    });
}
