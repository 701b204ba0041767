//! The database directory's lock: one writer of a database at a time, across processes, or
//! any number of read-only opens.
//!
//! Every read-write open of a database (create, open) takes an exclusive `flock(2)` on the
//! file `DIR/lock` and keeps it until the buffer manager is dropped. A second open, from
//! another process or from the same one (`flock` locks belong to the open file description,
//! not to the process), is refused with [`Error::Locked`] before it reads or writes anything
//! else. Read-only opens ([`crate::BufferManager::open_read_only`]) take the same lock
//! *shared*: they coexist with each other, a read-only open is refused with
//! [`Error::Locked`] while a writer holds the lock, and a writer with
//! [`Error::LockedByReaders`] while readers hold it.
//! The kernel releases the lock when the holder exits, however it exits (`kill -9`
//! included), so a crashed holder never leaves a stale lock behind; the file itself stays
//! and is reused.
//!
//! The holder writes its pid (decimal, one line) into the file so that the refusal can name
//! it. That is information only, never trusted for mutual exclusion: a pid that is absent,
//! unreadable, or of a process that no longer exists is reported as unknown. Readers write
//! nothing into it (a read-only open modifies no file); the only file a reader may create is
//! the lock file itself, empty, in a database made before the lock existed.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// Name of the lock file inside the database directory.
pub const LOCK_FILE: &str = "lock";

/// An exclusive or shared lock on a database directory, held until dropped.
#[derive(Debug)]
pub struct DirLock {
    /// Closing the descriptor (on drop) releases the lock.
    _file: File,
    path: PathBuf,
    shared: bool,
}

/// `flock(fd, op | LOCK_NB)`, retried on EINTR: `Ok(true)` when taken, `Ok(false)` when
/// another holder's lock conflicts.
fn try_flock(file: &File, op: libc::c_int) -> io::Result<bool> {
    loop {
        // SAFETY: flock only takes a descriptor and flags; `file` keeps the descriptor open
        // for the duration of the call.
        let rc = unsafe { libc::flock(file.as_raw_fd(), op | libc::LOCK_NB) };
        if rc == 0 {
            return Ok(true);
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EWOULDBLOCK) => return Ok(false),
            _ => return Err(e),
        }
    }
}

impl DirLock {
    /// Locks `dir` (which must exist), or fails with [`Error::Locked`] naming the holder's
    /// pid where it is known. Never waits.
    pub fn acquire(dir: &Path) -> Result<DirLock> {
        let path = dir.join(LOCK_FILE);
        let mut file = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&path).map_err(|e| Error::io("open", &path, e))?;
        if !try_flock(&file, libc::LOCK_EX).map_err(|e| Error::io("lock", &path, e))? {
            // Held. If a shared lock can be taken, only readers hold it (they write no pid;
            // the one in the file is an earlier writer's). Ours is released when `file` closes.
            if try_flock(&file, libc::LOCK_SH).unwrap_or(false) {
                return Err(Error::LockedByReaders { dir: dir.to_owned() });
            }
            return Err(Error::Locked { dir: dir.to_owned(), pid: holder_pid(&mut file) });
        }
        // Ours now: replace the previous holder's pid with ours (information only, so a
        // failure to write it does not stop the open).
        let _ = file.set_len(0).and_then(|()| (&file).write_all(format!("{}\n", std::process::id()).as_bytes()));
        Ok(DirLock { _file: file, path, shared: false })
    }

    /// Locks `dir` (which must exist) shared, for a read-only open, or fails with
    /// [`Error::Locked`] naming the writer's pid where it is known. Never waits and writes
    /// nothing. Returns `None` (no lock needed) when the lock file is absent and cannot be
    /// created because the filesystem is read-only or the directory is not writable by this
    /// user: no writer of this user can open the database there either.
    pub fn acquire_shared(dir: &Path) -> Result<Option<DirLock>> {
        let path = dir.join(LOCK_FILE);
        let mut file = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                // A database made before the lock existed: an empty lock file holds no data,
                // and without it a writer could not see this reader.
                match OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&path) {
                    Ok(f) => f,
                    Err(e) if matches!(e.raw_os_error(), Some(libc::EROFS) | Some(libc::EACCES) | Some(libc::EPERM)) => return Ok(None),
                    Err(e) => return Err(Error::io("create", &path, e)),
                }
            }
            Err(e) => return Err(Error::io("open", &path, e)),
        };
        if !try_flock(&file, libc::LOCK_SH).map_err(|e| Error::io("lock", &path, e))? {
            return Err(Error::Locked { dir: dir.to_owned(), pid: holder_pid(&mut file) });
        }
        Ok(Some(DirLock { _file: file, path, shared: true }))
    }

    /// Whether this is a reader's shared lock.
    pub fn is_shared(&self) -> bool {
        self.shared
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
    fn readers_share_the_lock_and_exclude_a_writer_and_the_other_way_round() {
        let dir = tempfile::tempdir().unwrap();
        // A writer leaves its pid behind.
        drop(DirLock::acquire(dir.path()).unwrap());
        let before = std::fs::read(dir.path().join(LOCK_FILE)).unwrap();
        let r1 = DirLock::acquire_shared(dir.path()).unwrap().unwrap();
        let r2 = DirLock::acquire_shared(dir.path()).unwrap().unwrap();
        assert!(r1.is_shared() && r2.is_shared());
        match DirLock::acquire(dir.path()) {
            Err(Error::LockedByReaders { dir: d }) => assert_eq!(d, dir.path()),
            other => panic!("expected LockedByReaders, got {other:?}"),
        }
        drop(r1);
        assert!(matches!(DirLock::acquire(dir.path()), Err(Error::LockedByReaders { .. })));
        drop(r2);
        // Readers wrote nothing, and the refused writer did not write its pid either.
        assert_eq!(std::fs::read(dir.path().join(LOCK_FILE)).unwrap(), before);
        let w = DirLock::acquire(dir.path()).unwrap();
        assert!(!w.is_shared());
        match DirLock::acquire_shared(dir.path()) {
            Err(Error::Locked { pid, .. }) => assert_eq!(pid, Some(std::process::id())),
            other => panic!("expected Locked, got {other:?}"),
        }
        drop(w);
        drop(DirLock::acquire_shared(dir.path()).unwrap().unwrap());
    }

    #[test]
    fn a_reader_creates_a_missing_lock_file_empty() {
        let dir = tempfile::tempdir().unwrap();
        let r = DirLock::acquire_shared(dir.path()).unwrap().unwrap();
        assert_eq!(std::fs::read(dir.path().join(LOCK_FILE)).unwrap(), b"");
        assert!(matches!(DirLock::acquire(dir.path()), Err(Error::LockedByReaders { .. })));
        drop(r);
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
