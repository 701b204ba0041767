#![cfg(loom)]
//! Loom model of the write-ahead log's group commit (`strata::storage::wal::Wal::flush`).
//!
//! Run with
//!
//! ```text
//! RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test -p strata --release --test loom_wal
//! ```
//!
//! A miniature of the protocol with loom's mutexes, condition variable and atomics in place of
//! parking_lot's and the files: appends take an LSN under the tail mutex; `flush(lsn)` returns
//! at once if the log is durable past `lsn`, else waits on the condition variable while
//! another thread is the flusher, or becomes the flusher itself: it takes everything appended
//! so far, "writes and fsyncs" it (publishes the new durable end), clears the flag and wakes
//! the waiters. Loom checks every interleaving for: a flush returning before its record is
//! durable, two flushers at once, and lost wake-ups (a waiter left asleep is a deadlock,
//! which loom reports).

use loom::sync::atomic::{AtomicU64, AtomicUsize, Ordering::*};
use loom::sync::{Arc, Condvar, Mutex};
use loom::thread;

struct Log {
    /// Next LSN to hand out (the tail buffer's end).
    next: Mutex<u64>,
    flushing: Mutex<bool>,
    flush_done: Condvar,
    /// Every LSN below this is durable.
    flushed: AtomicU64,
    /// Flushers inside the write + fsync section (must never exceed 1).
    flushers: AtomicUsize,
    /// fsyncs issued.
    fsyncs: AtomicUsize,
}

impl Log {
    fn new() -> Log {
        Log {
            next: Mutex::new(0),
            flushing: Mutex::new(false),
            flush_done: Condvar::new(),
            flushed: AtomicU64::new(0),
            flushers: AtomicUsize::new(0),
            fsyncs: AtomicUsize::new(0),
        }
    }

    fn append(&self) -> u64 {
        let mut next = self.next.lock().unwrap();
        let lsn = *next;
        *next += 1;
        lsn
    }

    fn flush(&self, lsn: u64) {
        if lsn < self.flushed.load(Acquire) {
            return;
        }
        {
            let mut flushing = self.flushing.lock().unwrap();
            loop {
                if lsn < self.flushed.load(Acquire) {
                    return;
                }
                if !*flushing {
                    *flushing = true;
                    break;
                }
                flushing = self.flush_done.wait(flushing).unwrap();
            }
        }
        assert_eq!(self.flushers.fetch_add(1, Relaxed), 0, "two flushers at once");
        let end = *self.next.lock().unwrap();
        self.fsyncs.fetch_add(1, Relaxed);
        self.flushed.store(end, Release);
        self.flushers.fetch_sub(1, Relaxed);
        *self.flushing.lock().unwrap() = false;
        self.flush_done.notify_all();
    }
}

#[test]
fn every_commit_returns_durable_and_nobody_sleeps_forever() {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(std::env::var("LOOM_MAX_PREEMPTIONS").ok().and_then(|v| v.parse().ok()).unwrap_or(3));
    b.check(|| {
        let log = Arc::new(Log::new());
        let committers: Vec<_> = (0..3)
            .map(|_| {
                let log = log.clone();
                thread::spawn(move || {
                    let lsn = log.append();
                    log.flush(lsn);
                    assert!(log.flushed.load(Acquire) > lsn, "flush({lsn}) returned before the record was durable");
                })
            })
            .collect();
        for c in committers {
            c.join().unwrap();
        }
        assert_eq!(log.flushed.load(Acquire), 3);
        let fsyncs = log.fsyncs.load(Relaxed);
        assert!((1..=3).contains(&fsyncs), "{fsyncs} fsyncs for 3 commits");
    });
}
