//! The background cleaner: writes back dirty pages that the clock will evict next, before
//! it gets there, so that evictions find clean victims (a `madvise`, no write, no fsync)
//! and foreground fixes rarely wait for writes.
//!
//! The clock hand marks an untouched page on one lap and evicts it on the next if it is
//! still MARKED. The pages a short stretch ahead of the hand that are MARKED and dirty are
//! therefore exactly the next victims that would cost a write. One round
//! ([`BufferManager::clean_ahead`]) looks at the resident-set slots ahead of the hand until
//! it has seen `target` bytes of pages, try-latches the dirty MARKED ones (never waiting:
//! a latched page is in use, not a victim), writes them back as one batch — the same
//! write-back as an eviction's, so the write-ahead rule, the double-write area and write
//! coalescing all apply — and leaves them MARKED and clean: still first in line for the
//! clock, now free to drop. A page fixed meanwhile is simply not a victim any more; one
//! written again is dirty again (its write was early, not wrong).
//!
//! [`Cleaner`] runs rounds on a thread: after every eviction that had to write dirty victims
//! itself (the manager rings the cleaner's bell), and otherwise every `interval`. It stops
//! and is joined when dropped.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use super::manager::BufferManager;

/// How a [`Cleaner`] works.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CleanerOptions {
    /// Bytes of pages ahead of the clock hand to keep clean (default: a sixteenth of the
    /// pool, at least one smallest page).
    pub target: Option<u64>,
    /// Longest sleep between rounds when no eviction rings (default 10 ms).
    pub interval: Duration,
}

impl Default for CleanerOptions {
    fn default() -> Self {
        CleanerOptions { target: None, interval: Duration::from_millis(10) }
    }
}

/// What a cleaner did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CleanerStats {
    /// Rounds run.
    pub rounds: u64,
    /// Pages it wrote back.
    pub pages_cleaned: u64,
    /// Rounds whose write-back failed (the pages stayed dirty; evictions will report it).
    pub errors: u64,
}

/// The doorbell evictions ring when they had to write dirty victims themselves.
#[derive(Default)]
pub(crate) struct Bell {
    /// A cleaner is running (only then do evictions ring).
    pub(crate) attached: AtomicBool,
    rung: Mutex<bool>,
    cv: Condvar,
}

impl Bell {
    /// Wakes the cleaner, if one is attached.
    pub(crate) fn ring(&self) {
        if self.attached.load(Ordering::Relaxed) {
            *self.rung.lock() = true;
            self.cv.notify_one();
        }
    }

    /// Waits until rung or `timeout`; clears the bell.
    fn wait(&self, timeout: Duration) {
        let mut rung = self.rung.lock();
        if !*rung {
            self.cv.wait_for(&mut rung, timeout);
        }
        *rung = false;
    }
}

struct Shared {
    stop: AtomicBool,
    rounds: AtomicU64,
    cleaned: AtomicU64,
    errors: AtomicU64,
}

/// A background cleaner thread over a buffer manager (see the module documentation).
pub struct Cleaner {
    bm: Arc<BufferManager>,
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Cleaner {
    /// Starts a cleaner over `bm`. Only one cleaner per buffer manager does useful work;
    /// a second one competes for the same pages (harmless, wasteful).
    pub fn start(bm: Arc<BufferManager>, opts: CleanerOptions) -> std::io::Result<Cleaner> {
        let shared = Arc::new(Shared { stop: AtomicBool::new(false), rounds: AtomicU64::new(0), cleaned: AtomicU64::new(0), errors: AtomicU64::new(0) });
        let target = opts.target.unwrap_or(bm.pool_size() / 16).max(bm.classes().min_page());
        bm.bell.attached.store(true, Ordering::Relaxed);
        let (b, sh) = (bm.clone(), shared.clone());
        let thread = std::thread::Builder::new().name("strata-cleaner".into()).spawn(move || {
            while !sh.stop.load(Ordering::Relaxed) {
                match b.clean_ahead(target) {
                    Ok(n) => {
                        sh.cleaned.fetch_add(n as u64, Ordering::Relaxed);
                        sh.rounds.fetch_add(1, Ordering::Relaxed);
                        if n > 0 {
                            continue; // there may be more right behind
                        }
                    }
                    Err(_) => {
                        sh.errors.fetch_add(1, Ordering::Relaxed);
                        sh.rounds.fetch_add(1, Ordering::Relaxed);
                    }
                }
                b.bell.wait(opts.interval);
            }
        });
        let thread = match thread {
            Ok(t) => t,
            Err(e) => {
                bm.bell.attached.store(false, Ordering::Relaxed);
                return Err(e);
            }
        };
        Ok(Cleaner { bm, shared, thread: Some(thread) })
    }

    /// What it did so far.
    pub fn stats(&self) -> CleanerStats {
        let s = &self.shared;
        CleanerStats { rounds: s.rounds.load(Ordering::Relaxed), pages_cleaned: s.cleaned.load(Ordering::Relaxed), errors: s.errors.load(Ordering::Relaxed) }
    }

    /// Stops the thread (after the round under way) and joins it.
    pub fn stop(mut self) -> CleanerStats {
        self.halt();
        self.stats()
    }

    fn halt(&mut self) {
        let Some(t) = self.thread.take() else { return };
        self.shared.stop.store(true, Ordering::Relaxed);
        self.bm.bell.ring();
        if let Err(p) = t.join() {
            std::panic::resume_unwind(p);
        }
        self.bm.bell.attached.store(false, Ordering::Relaxed);
    }
}

impl Drop for Cleaner {
    fn drop(&mut self) {
        self.halt();
    }
}
