//! The shared structure-aware fuzz targets (see `crates/strata/tests/fuzz/targets.rs`).

use std::cell::RefCell;
use std::panic::{catch_unwind, AssertUnwindSafe};

#[path = "../../crates/strata/tests/fuzz/targets.rs"]
pub mod targets;

thread_local! {
    static LAST_PANIC: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Replaces libFuzzer's panic hook (which aborts at once) by one that only records the
/// message, so that the panics strata catches on purpose (the `parquet` crate's, turned into
/// import errors) unwind to strata's `catch_unwind` as they do outside the fuzzer. A panic
/// that reaches [`run`] is still a crash: it prints the message and aborts.
pub fn init() {
    std::panic::set_hook(Box::new(|info| {
        let msg = info.payload().downcast_ref::<String>().cloned().or_else(|| info.payload().downcast_ref::<&str>().map(|s| s.to_string()));
        let at = info.location().map(|l| format!(" at {}:{}", l.file(), l.line())).unwrap_or_default();
        let _ = LAST_PANIC.try_with(|p| *p.borrow_mut() = Some(format!("{}{at}", msg.unwrap_or_else(|| "a panic".into()))));
    }));
}

/// Runs one target on one input; an escaping panic aborts (a crash for libFuzzer).
pub fn run(target: fn(&[u8]) -> targets::Verdict, data: &[u8]) {
    if catch_unwind(AssertUnwindSafe(|| target(data))).is_err() {
        let msg = LAST_PANIC.with(|p| p.borrow_mut().take()).unwrap_or_default();
        eprintln!("panicked: {msg}");
        std::process::abort();
    }
}
