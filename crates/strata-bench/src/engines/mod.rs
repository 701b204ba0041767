//! The engines: strata and the baselines, all implementing [`crate::PageStore`].

mod hashpool;
mod mmap;
mod raw;
mod split;
mod strata_store;

pub use hashpool::{HashPool, Pinned};
pub use mmap::{CgroupCap, MmapStore};
pub use raw::RawStore;
pub use split::StaticSplit;
pub use strata_store::StrataStore;

use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Opens a data file, with `O_DIRECT` where the filesystem allows it (returns whether it
/// did), read-only unless `write`.
pub(crate) fn open_data(path: &Path, write: bool) -> std::io::Result<(File, bool)> {
    let mut opts = OpenOptions::new();
    opts.read(true).write(write);
    let mut direct = opts.clone();
    direct.custom_flags(libc::O_DIRECT);
    match direct.open(path) {
        Ok(f) => Ok((f, true)),
        // tmpfs and friends refuse O_DIRECT: fall back to buffered I/O (and say so).
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok((opts.open(path)?, false)),
        Err(e) => Err(e),
    }
}
