//! The disk-space reserve: a file (`DIR/reserve`) whose space a database keeps back for
//! its own recovery, in the spirit of an emergency ballast file.
//!
//! A disk fills up in the middle of some writer's work, and the free space left is then
//! near zero. The data files cannot need more (their pages' space is reserved when the
//! pages are allocated), but recovering from the failed work still writes a little:
//! compensation and abort records, a double-write batch, a new copy of the allocation
//! table next to the old one, the checkpoint record. A database that cannot do that cannot
//! be opened, not even to be read. So every read-write open keeps a reserve file of a few
//! hundred KiB (allocated, not sparse); an open that has to recover gives it back first,
//! and takes it again once recovery is done and space allows (best effort: a missing or
//! short reserve is no error).

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::storage::backend::{OpenMode, StorageBackend};

/// File name of the reserve.
pub const RESERVE_FILE: &str = "reserve";

/// The reserve's size when the configuration does not say.
pub const DEFAULT_RESERVE: u64 = 1 << 20;

fn path(dir: &Path) -> PathBuf {
    dir.join(RESERVE_FILE)
}

/// Makes sure `dir` holds a reserve of `bytes` (0: none). Best effort: on a full disk (or
/// any error) nothing is kept, and the database works without one.
pub fn ensure(backend: &dyn StorageBackend, dir: &Path, bytes: u64) {
    if bytes == 0 {
        return;
    }
    let p = path(dir);
    let Ok(file) = backend.open(&p, OpenMode::Buffered, true) else { return };
    if file.len().unwrap_or(0) >= bytes {
        return;
    }
    let taken = match file.reserve(0, bytes) {
        // Allocated space past the end: make the length say so, so that the next open sees it.
        Ok(()) => file.set_len(bytes).is_ok(),
        // Without fallocate, zeros written take the space.
        Err(e) if e.kind() == std::io::ErrorKind::Unsupported => {
            let zeros = vec![0u8; 64 << 10];
            (0..bytes.div_ceil(zeros.len() as u64)).all(|i| file.write_at(&zeros, i * zeros.len() as u64).is_ok())
        }
        Err(_) => false,
    };
    if !taken || file.sync().is_err() {
        drop(file);
        let _ = backend.remove(&p);
    }
}

/// Gives the reserve's space back to the file system (before recovery writes).
pub fn release(backend: &dyn StorageBackend, dir: &Path) -> Result<()> {
    let p = path(dir);
    if backend.exists(&p) {
        backend.remove(&p).map_err(|e| Error::io("remove", &p, e))?;
    }
    Ok(())
}
