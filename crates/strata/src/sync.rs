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
