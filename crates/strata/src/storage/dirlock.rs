//! The database directory's lock: one open of a database at a time, across processes.
//!
//! Every open of a database (create, open) takes an exclusive `flock(2)` on the file
//! `DIR/lock` and keeps it until the buffer manager is dropped. A second open, from another
//! process or from the same one (`flock` locks belong to the open file description, not to
//! the process), is refused with [`Error::Locked`] before it reads or writes anything else.
//! The kernel releases the lock when the holder exits, however it exits (`kill -9`
//! included), so a crashed holder never leaves a stale lock behind; the file itself stays
//! and is reused.
//!
//! The holder writes its pid (decimal, one line) into the file so that the refusal can name
//! it. That is information only, never trusted for mutual exclusion: a pid that is absent,
//! unreadable, or of a process that no longer exists is reported as unknown.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// Name of the lock file inside the database directory.
pub const LOCK_FILE: &str = "lock";

/// An exclusive lock on a database directory, held until dropped.
#[derive(Debug)]
pub struct DirLock {
    /// Closing the descriptor (on drop) releases the lock.
    _file: File,
    path: PathBuf,
}

impl DirLock {
    /// Locks `dir` (which must exist), or fails with [`Error::Locked`] naming the holder's
    /// pid where it is known. Never waits.
    pub fn acquire(dir: &Path) -> Result<DirLock> {
        let path = dir.join(LOCK_FILE);
        let mut file = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&path).map_err(|e| Error::io("open", &path, e))?;
        loop {
            // SAFETY: flock only takes a descriptor and flags; `file` keeps the descriptor
            // open for the duration of the call.
            let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
            if rc == 0 {
                break;
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EWOULDBLOCK) => return Err(Error::Locked { dir: dir.to_owned(), pid: holder_pid(&mut file) }),
                _ => return Err(Error::io("lock", &path, e)),
            }
        }
        // Ours now: replace the previous holder's pid with ours (information only, so a
        // failure to write it does not stop the open).
        let _ = file.set_len(0).and_then(|()| (&file).write_all(format!("{}\n", std::process::id()).as_bytes()));
        Ok(DirLock { _file: file, path })
    }

    /// The lock file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// The pid the holder wrote into the lock file, if it is readable and names a live process.
fn holder_pid(file: &mut File) -> Option<u32> {
    let mut text = String::new();
    // A holder writes at most a pid and a newline; anything longer is not ours.
    file.take(32).read_to_string(&mut text).ok()?;
    let pid: u32 = text.trim().parse().ok()?;
    let pid_t = libc::pid_t::try_from(pid).ok().filter(|&p| p > 0)?;
    // SAFETY: kill with signal 0 sends nothing; it only checks that the process exists.
    let rc = unsafe { libc::kill(pid_t, 0) };
    let alive = rc == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
    alive.then_some(pid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_lock_is_refused_with_our_pid_and_released_on_drop() {
        let dir = tempfile::tempdir().unwrap();
        let first = DirLock::acquire(dir.path()).unwrap();
        assert_eq!(first.path(), dir.path().join(LOCK_FILE));
        match DirLock::acquire(dir.path()) {
            Err(Error::Locked { dir: d, pid }) => {
                assert_eq!(d, dir.path());
                assert_eq!(pid, Some(std::process::id()));
            }
            other => panic!("expected Locked, got {other:?}"),
        }
        drop(first);
        let again = DirLock::acquire(dir.path()).unwrap();
        drop(again);
    }

    #[test]
    fn garbage_or_dead_pid_in_the_file_is_unknown() {
        let dir = tempfile::tempdir().unwrap();
        let _held = DirLock::acquire(dir.path()).unwrap();
        let mut f = OpenOptions::new().read(true).open(dir.path().join(LOCK_FILE)).unwrap();
        std::fs::write(dir.path().join(LOCK_FILE), "not a pid\n").unwrap();
        assert_eq!(holder_pid(&mut f), None);
        let mut f = OpenOptions::new().read(true).open(dir.path().join(LOCK_FILE)).unwrap();
        // Beyond the kernel's pid limit (2^22): no such process.
        std::fs::write(dir.path().join(LOCK_FILE), "2000000000\n").unwrap();
        assert_eq!(holder_pid(&mut f), None);
    }
}
