//! The threads that scan rings read with ([`super::ring`]): kept after a ring is done and
//! given the next ring's I/O loops, instead of a new thread per loop (each start costs a
//! clone, a stack mapping and, on the first read, an io_uring set up for the thread; a
//! TPC-H query at SF 1 made some 50 rings, two loops each). A thread idle for
//! [`IDLE`] ends; when the manager is dropped they all end once their work is done.
//!
//! There is no bound on the number of threads: a job runs at once, on an idle thread or a
//! new one, never queued behind other jobs. A ring's loops wait for its consumer to give
//! buffers back, and a consumer may hold one ring while it reads another (a join probe
//! inside a scan): queued behind the outer ring's loops, the inner ring's would never run.

use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

/// How long a thread waits for work before it ends.
pub(super) const IDLE: Duration = Duration::from_secs(2);

/// Work for a thread.
pub(super) type Job = Box<dyn FnOnce() + Send + 'static>;

/// The kept threads of one buffer manager.
pub(super) struct IoWorkers {
    inner: Arc<Inner>,
    idle_for: Duration,
}

#[derive(Default)]
struct Inner {
    state: Mutex<State>,
    cv: Condvar,
}

#[derive(Default)]
struct State {
    /// Jobs handed to idle threads, not yet taken by one.
    jobs: VecDeque<Job>,
    /// Threads waiting for a job.
    idle: usize,
    /// Threads running (working or waiting).
    threads: usize,
    /// Threads started so far.
    started: u64,
    /// The manager is gone: threads end when there is no job left.
    closed: bool,
}

impl Default for IoWorkers {
    fn default() -> IoWorkers {
        IoWorkers::with_idle(IDLE)
    }
}

impl IoWorkers {
    /// Workers whose threads end after `idle_for` without work.
    pub(super) fn with_idle(idle_for: Duration) -> IoWorkers {
        IoWorkers { inner: Arc::default(), idle_for }
    }

    /// Runs `job` on an idle thread, or on a new one; false if there was none and none could
    /// be started (the job is dropped without running).
    pub(super) fn run(&self, job: Job) -> bool {
        {
            let mut st = self.inner.state.lock();
            // Each idle thread takes one job: hand this one over only if an idle thread is
            // left after those already handed over.
            if st.idle > st.jobs.len() {
                st.jobs.push_back(job);
                self.inner.cv.notify_one();
                return true;
            }
            // Counted before it starts (it counts itself out when it ends).
            st.threads += 1;
            st.started += 1;
        }
        let inner = self.inner.clone();
        let idle_for = self.idle_for;
        let spawned = std::thread::Builder::new().name("strata-ring".into()).spawn(move || {
            work(&inner, job, idle_for);
            inner.state.lock().threads -= 1;
        });
        if spawned.is_err() {
            let mut st = self.inner.state.lock();
            st.threads -= 1;
            st.started -= 1;
        }
        spawned.is_ok()
    }

    /// Threads started so far.
    pub(super) fn started(&self) -> u64 {
        self.inner.state.lock().started
    }

    /// (Threads running, threads idle) now.
    #[cfg(test)]
    pub(super) fn threads(&self) -> (usize, usize) {
        let st = self.inner.state.lock();
        (st.threads, st.idle)
    }

    /// Waits (at most 20 s, else panics) until `done(threads running, threads idle)`.
    #[cfg(test)]
    pub(super) fn wait_until(&self, done: impl Fn(usize, usize) -> bool) {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while !done(self.threads().0, self.threads().1) {
            assert!(std::time::Instant::now() < deadline, "I/O threads never got there: {:?}", self.threads());
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

impl Drop for IoWorkers {
    fn drop(&mut self) {
        self.inner.state.lock().closed = true;
        self.inner.cv.notify_all();
    }
}

/// A thread: runs `first`, then the jobs handed to it, until it waited `idle_for` for one
/// or the workers are closed.
fn work(inner: &Inner, first: Job, idle_for: Duration) {
    let mut job = Some(first);
    while let Some(j) = job.take() {
        // A job that panics is its owner's to report (a ring keeps the payload for its
        // consumer); the thread goes on.
        let _ = std::panic::catch_unwind(AssertUnwindSafe(j));
        let mut st = inner.state.lock();
        job = loop {
            if let Some(j) = st.jobs.pop_front() {
                break Some(j);
            }
            if st.closed {
                break None;
            }
            st.idle += 1;
            let timed_out = inner.cv.wait_for(&mut st, idle_for).timed_out();
            st.idle -= 1;
            // (A job handed over as the wait timed out is taken on the next turn.)
            if timed_out && st.jobs.is_empty() {
                break None;
            }
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::mpsc;

    fn thread_id_of(w: &IoWorkers) -> std::thread::ThreadId {
        let (tx, rx) = mpsc::channel();
        assert!(w.run(Box::new(move || tx.send(std::thread::current().id()).unwrap())));
        rx.recv().unwrap()
    }

    #[test]
    fn jobs_one_after_another_run_on_the_same_thread() {
        // (Idle threads wait far longer than the test needs.)
        let w = IoWorkers::with_idle(Duration::from_secs(60));
        let first = thread_id_of(&w);
        for _ in 0..20 {
            // The thread is idle again once its job sent: wait until it waits for work.
            w.wait_until(|_, idle| idle == 1);
            assert_eq!(thread_id_of(&w), first);
        }
        assert_eq!(w.started(), 1);
    }

    /// Jobs that wait for one another (a ring's loops waiting for a consumer that waits for
    /// another ring) all run: a job never waits for a thread.
    #[test]
    fn a_job_never_waits_for_another_to_finish() {
        let w = IoWorkers::default();
        let n = 8;
        let (tx, rx) = mpsc::channel::<usize>();
        let gate = Arc::new((Mutex::new(0usize), Condvar::new()));
        for i in 0..n {
            let (tx, gate) = (tx.clone(), gate.clone());
            assert!(w.run(Box::new(move || {
                // Each job waits until all have started.
                let (m, cv) = &*gate;
                let mut started = m.lock();
                *started += 1;
                cv.notify_all();
                while *started < n {
                    cv.wait(&mut started);
                }
                tx.send(i).unwrap();
            })));
        }
        let mut done: Vec<usize> = (0..n).map(|_| rx.recv_timeout(Duration::from_secs(20)).expect("a job never ran")).collect();
        done.sort_unstable();
        assert_eq!(done, (0..n).collect::<Vec<_>>());
        assert_eq!(w.started(), n as u64);
    }

    /// Four threads hand over 400 jobs each; every fifth job waits until the submitter's
    /// next job has started (as a ring's loops wait for a consumer who then starts another
    /// ring), and the idle timeout (200 us) races the hand-offs. Every job runs exactly
    /// once, and none waits for a thread.
    #[test]
    fn jobs_from_many_threads_with_racing_idle_timeouts_all_run_once() {
        use std::sync::atomic::AtomicBool;
        const SUBMITTERS: usize = 4;
        const JOBS: usize = 400;
        let w = IoWorkers::with_idle(Duration::from_micros(200));
        let runs: Arc<Vec<AtomicU64>> = Arc::new((0..SUBMITTERS * JOBS).map(|_| AtomicU64::new(0)).collect());
        let started: Arc<Vec<AtomicBool>> = Arc::new((0..SUBMITTERS * JOBS + 1).map(|_| AtomicBool::new(false)).collect());
        std::thread::scope(|scope| {
            for t in 0..SUBMITTERS {
                let (w, runs, started) = (&w, runs.clone(), started.clone());
                scope.spawn(move || {
                    let mut rng = 0x9E37_79B9_7F4A_7C15u64 ^ t as u64;
                    for i in 0..JOBS {
                        let id = t * JOBS + i;
                        let (runs, started) = (runs.clone(), started.clone());
                        // The last job of a submitter has no next one to wait for.
                        let waits = id.is_multiple_of(5) && i + 1 < JOBS;
                        assert!(w.run(Box::new(move || {
                            started[id].store(true, Ordering::Release);
                            if waits {
                                let deadline = std::time::Instant::now() + Duration::from_secs(20);
                                while !started[id + 1].load(Ordering::Acquire) {
                                    assert!(std::time::Instant::now() < deadline, "job {id} waited for a job that never got a thread");
                                    std::thread::yield_now();
                                }
                            }
                            runs[id].fetch_add(1, Ordering::AcqRel);
                        })));
                        rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                        if rng >> 61 == 0 {
                            // Now and then a pause: idle threads time out around it.
                            std::thread::sleep(Duration::from_micros(rng >> 52 & 511));
                        }
                    }
                });
            }
        });
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while runs.iter().any(|r| r.load(Ordering::Acquire) == 0) {
            assert!(
                std::time::Instant::now() < deadline,
                "jobs never ran: {:?}",
                runs.iter().enumerate().filter(|(_, r)| r.load(Ordering::Acquire) == 0).map(|(i, _)| i).take(8).collect::<Vec<_>>()
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(runs.iter().all(|r| r.load(Ordering::Acquire) == 1), "a job ran twice");
    }

    #[test]
    fn a_panicking_job_leaves_its_thread_working() {
        let w = IoWorkers::with_idle(Duration::from_secs(60));
        assert!(w.run(Box::new(|| panic!("a job's panic"))));
        // The thread survived its job's panic: it waits for work, and takes the next job.
        w.wait_until(|threads, idle| threads == 1 && idle == 1);
        thread_id_of(&w);
        assert_eq!(w.started(), 1);
    }

    #[test]
    fn idle_threads_end_and_dropped_workers_end_theirs() {
        let w = IoWorkers::with_idle(Duration::from_millis(50));
        thread_id_of(&w);
        // Idle past `idle_for`: the thread ends, and the next job starts another.
        w.wait_until(|threads, _| threads == 0);
        thread_id_of(&w);
        assert_eq!(w.started(), 2);
        // Dropped: the threads end at once, however long they would wait for work.
        let w = IoWorkers::with_idle(Duration::from_secs(600));
        thread_id_of(&w);
        let inner = w.inner.clone();
        drop(w);
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while inner.state.lock().threads > 0 {
            assert!(std::time::Instant::now() < deadline, "a thread of dropped workers did not end");
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}
