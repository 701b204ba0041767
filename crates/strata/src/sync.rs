//! A tiny facade over the atomics the latch protocol uses, so the same code runs under
//! `loom` (built with `RUSTFLAGS="--cfg loom"`) and with std atomics otherwise.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicU64, Ordering};
#[cfg(loom)]
pub(crate) fn spin_hint() {
    loom::thread::yield_now();
}

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{fence, AtomicU64, Ordering};
#[cfg(not(loom))]
#[inline]
pub(crate) fn spin_hint() {
    std::hint::spin_loop();
}

/// The mutex and condition variable of the lock table ([`crate::txn::LockTable`]):
/// `parking_lot`'s outside loom; under loom, loom's, behind `parking_lot`'s API (a guard the
/// lock returns directly, a timed wait that takes the guard by `&mut`).
#[cfg(not(loom))]
pub(crate) use parking_lot::{Condvar, Mutex};

#[cfg(loom)]
pub(crate) use self::model_lock::{Condvar, Mutex};

#[cfg(loom)]
mod model_lock {
    use std::ops::{Deref, DerefMut};
    use std::time::Duration;

    use loom::sync::WaitTimeoutResult;

    #[derive(Default)]
    pub(crate) struct Mutex<T>(loom::sync::Mutex<T>);

    /// Holds loom's guard in an option so that [`Condvar::wait_for`] can hand it to loom's
    /// `wait_timeout` (which takes it by value) and put back the one it returns.
    pub(crate) struct MutexGuard<'a, T>(Option<loom::sync::MutexGuard<'a, T>>);

    impl<T> Mutex<T> {
        pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
            MutexGuard(Some(self.0.lock().unwrap()))
        }
    }

    impl<T> Deref for MutexGuard<'_, T> {
        type Target = T;
        fn deref(&self) -> &T {
            self.0.as_ref().unwrap()
        }
    }

    impl<T> DerefMut for MutexGuard<'_, T> {
        fn deref_mut(&mut self) -> &mut T {
            self.0.as_mut().unwrap()
        }
    }

    #[derive(Default)]
    pub(crate) struct Condvar(loom::sync::Condvar);

    impl Condvar {
        /// Waits for a notification. Loom 0.7's `wait_timeout` never times out (it is a
        /// plain `wait`): the wait ends at the next notification, and the caller counts
        /// wakeups as time (see `txn::lock`).
        pub(crate) fn wait_for<T>(&self, guard: &mut MutexGuard<'_, T>, timeout: Duration) -> WaitTimeoutResult {
            let g = guard.0.take().unwrap();
            let (g, r) = self.0.wait_timeout(g, timeout).unwrap();
            guard.0 = Some(g);
            r
        }

        pub(crate) fn notify_all(&self) {
            self.0.notify_all();
        }
    }
}
