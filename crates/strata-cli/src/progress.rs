//! Progress bars: shown only on a terminal and never under `--json`.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressStyle};

/// A byte-count progress bar, hidden unless stderr is a terminal and `quiet` is false.
pub fn bytes(total: u64, msg: &str, quiet: bool) -> ProgressBar {
    if quiet || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new(total);
    pb.set_style(
        ProgressStyle::with_template("{msg} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}").expect("valid template").progress_chars("=> "),
    );
    pb.set_message(msg.to_owned());
    pb
}

/// A count progress bar (rows, items), hidden unless stderr is a terminal and `quiet` is false.
pub fn count(total: u64, msg: &str, quiet: bool) -> ProgressBar {
    if quiet || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new(total);
    pb.set_style(ProgressStyle::with_template("{msg} [{bar:40}] {human_pos}/{human_len} {per_sec} eta {eta}").expect("valid template").progress_chars("=> "));
    pb.set_message(msg.to_owned());
    pb
}
