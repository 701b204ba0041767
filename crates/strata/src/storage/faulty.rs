//! A storage backend that injects faults: failing reads, writes, syncs and metadata
//! replacements with a chosen errno, and a file system of limited size that fills up as a
//! real one does. Test machinery: built with the `testing` feature (and for the library's
//! own unit tests), not in the default build.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use super::backend::{first_error, first_write_error, IoBufMut, OpenMode, ReadReq, StorageBackend, StorageFile, WriteReq};
use super::dirlock::DirLock;

/// Which operations a [`FaultyBackend`] fails.
#[derive(Debug, Default)]
pub struct Faults {
    /// Fail every page write (data files) with this errno while set (0 = off).
    pub write_errno: AtomicU64,
    /// Fail every page read with this errno while set (0 = off).
    pub read_errno: AtomicU64,
    /// Fail `sync` with EIO while set.
    pub fail_sync: AtomicBool,
    /// Fail atomic metadata writes with this errno while set (0 = off).
    pub meta_errno: AtomicU64,
    /// Fail only writes whose offset is at or past this many bytes (u64::MAX = all offsets
    /// when write_errno is set).
    pub write_from_offset: AtomicU64,
    /// A file system of limited size (see [`Faults::limit_space`]).
    space: parking_lot::Mutex<SpaceModel>,
}

/// The bytes a small file system has left and what each file holds of them, for tests of
/// a disk that really fills up (rather than failing every write): a write past what its
/// file holds, a reservation past it, and an atomic replacement (both versions exist until
/// the rename) take space; truncation and removal give it back; what does not fit fails
/// with `ENOSPC`, as a full file system would. Holes are not modelled: a file holds every
/// byte up to the furthest written or reserved.
#[derive(Debug, Default)]
struct SpaceModel {
    /// Bytes left; `None`: unlimited (files are still tracked).
    left: Option<u64>,
    /// Bytes each file holds, once this model has seen it (else its length on disk).
    held: std::collections::HashMap<PathBuf, u64>,
}

fn enospc() -> io::Error {
    io::Error::from_raw_os_error(libc::ENOSPC)
}

impl Faults {
    /// From now on the file system has `bytes` left (`None`: unlimited): files grow into
    /// them, and truncations and removals give space back.
    pub fn limit_space(&self, bytes: Option<u64>) {
        self.space.lock().left = bytes;
    }

    /// The bytes left (`None`: unlimited).
    pub fn space_left(&self) -> Option<u64> {
        self.space.lock().left
    }

    /// File `path` (now `len` bytes on disk if not seen before) grows to hold `end` bytes.
    fn grow(&self, path: &Path, len: impl FnOnce() -> u64, end: u64) -> io::Result<()> {
        let mut m = self.space.lock();
        let m = &mut *m;
        if !m.held.contains_key(path) {
            m.held.insert(path.to_owned(), len());
        }
        let held = m.held.get_mut(path).expect("inserted above");
        if end > *held {
            if let Some(left) = &mut m.left {
                let need = end - *held;
                if need > *left {
                    return Err(enospc());
                }
                *left -= need;
            }
            *held = end;
        }
        Ok(())
    }

    /// File `path` is cut to `len` bytes (its space past them given back), or removed
    /// (`None`); `old` is its length on disk if not seen before.
    fn shrink(&self, path: &Path, old: u64, len: Option<u64>) {
        let mut m = self.space.lock();
        let held = m.held.get(path).copied().unwrap_or(old);
        let kept = len.unwrap_or(0).min(held);
        match len {
            Some(_) => m.held.insert(path.to_owned(), kept),
            None => m.held.remove(path),
        };
        if let Some(left) = &mut m.left {
            *left += held - kept;
        }
    }

    /// File `path` (`old` bytes on disk if not seen before) is replaced by `new` bytes.
    fn replace(&self, path: &Path, old: u64, new: u64) -> io::Result<()> {
        let mut m = self.space.lock();
        let held = m.held.get(path).copied().unwrap_or(old);
        if let Some(left) = &mut m.left {
            if new > *left {
                return Err(enospc());
            }
            *left = *left - new + held;
        }
        m.held.insert(path.to_owned(), new);
        Ok(())
    }
}

fn disk_len(path: &Path) -> u64 {
    fs::metadata(path).map_or(0, |m| m.len())
}

/// Wraps a backend and fails chosen operations, for tests of error paths (disk full,
/// failing reads) that must lose nothing.
#[derive(Debug)]
pub struct FaultyBackend {
    inner: Arc<dyn StorageBackend>,
    /// The switches; flip them at any time.
    pub faults: Arc<Faults>,
}

impl FaultyBackend {
    /// Wraps `inner` with all faults off.
    pub fn new(inner: Arc<dyn StorageBackend>) -> FaultyBackend {
        let faults = Arc::new(Faults::default());
        faults.write_from_offset.store(0, Ordering::Relaxed);
        FaultyBackend { inner, faults }
    }
}

#[derive(Debug)]
struct FaultyFile {
    inner: Arc<dyn StorageFile>,
    faults: Arc<Faults>,
}

fn errno_err(e: u64) -> io::Result<()> {
    if e == 0 {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(e as i32))
    }
}

impl StorageFile for FaultyFile {
    fn read_at(&self, dst: IoBufMut<'_>, offset: u64) -> io::Result<usize> {
        errno_err(self.faults.read_errno.load(Ordering::Relaxed))?;
        self.inner.read_at(dst, offset)
    }
    fn read_many(&self, reqs: &mut [ReadReq<'_>]) -> io::Result<()> {
        let errno = self.faults.read_errno.load(Ordering::Relaxed);
        if errno != 0 {
            for req in reqs.iter_mut() {
                req.result = Err(io::Error::from_raw_os_error(errno as i32));
            }
            return first_error(reqs);
        }
        self.inner.read_many(reqs)
    }
    fn queue_depth(&self) -> usize {
        self.inner.queue_depth()
    }
    fn write_at(&self, src: &[u8], offset: u64) -> io::Result<()> {
        if offset >= self.faults.write_from_offset.load(Ordering::Relaxed) {
            errno_err(self.faults.write_errno.load(Ordering::Relaxed))?;
        }
        self.faults.grow(self.inner.path(), || self.inner.len().unwrap_or(0), offset + src.len() as u64)?;
        self.inner.write_at(src, offset)
    }
    fn write_many(&self, reqs: &mut [WriteReq<'_>]) -> io::Result<()> {
        if self.faults.write_errno.load(Ordering::Relaxed) == 0 && self.faults.space_left().is_none() {
            let r = self.inner.write_many(reqs);
            for req in reqs.iter() {
                if req.result.is_ok() {
                    let _ = self.faults.grow(self.inner.path(), || self.inner.len().unwrap_or(0), req.offset + req.buf.len() as u64);
                }
            }
            return r;
        }
        // Faults on: each request on its own, so that each meets its own fault.
        for req in reqs.iter_mut() {
            req.result = self.write_at(req.buf, req.offset);
        }
        first_write_error(reqs)
    }
    fn sync(&self) -> io::Result<()> {
        if self.faults.fail_sync.load(Ordering::Relaxed) {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        self.inner.sync()
    }
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        let old = self.inner.len()?;
        if len > old {
            // Sparse: holds no more than before.
            return self.inner.set_len(len);
        }
        self.inner.set_len(len)?;
        self.faults.shrink(self.inner.path(), old, Some(len));
        Ok(())
    }
    fn reserve(&self, offset: u64, len: u64) -> io::Result<()> {
        match self.inner.reserve(offset, len) {
            // The modelled file system can reserve even where the one below cannot, so that
            // tests behave alike on every host.
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Unsupported => {}
            Err(e) => return Err(e),
        }
        self.faults.grow(self.inner.path(), || self.inner.len().unwrap_or(0), offset + len)
    }
    fn is_direct(&self) -> bool {
        self.inner.is_direct()
    }
    fn path(&self) -> &Path {
        self.inner.path()
    }
}

impl StorageBackend for FaultyBackend {
    fn open(&self, path: &Path, mode: OpenMode, create: bool) -> io::Result<Arc<dyn StorageFile>> {
        let inner = self.inner.open(path, mode, create)?;
        Ok(Arc::new(FaultyFile { inner, faults: self.faults.clone() }))
    }
    fn read_file(&self, path: &Path) -> io::Result<Vec<u8>> {
        self.inner.read_file(path)
    }
    fn write_atomic(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        errno_err(self.faults.meta_errno.load(Ordering::Relaxed))?;
        self.faults.replace(path, disk_len(path), bytes.len() as u64)?;
        self.inner.write_atomic(path, bytes)
    }
    fn remove(&self, path: &Path) -> io::Result<()> {
        let old = disk_len(path);
        self.inner.remove(path)?;
        self.faults.shrink(path, old, None);
        Ok(())
    }
    fn exists(&self, path: &Path) -> bool {
        self.inner.exists(path)
    }
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        self.inner.create_dir_all(path)
    }
    fn list_dir(&self, path: &Path) -> io::Result<Vec<String>> {
        self.inner.list_dir(path)
    }
    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        if self.faults.fail_sync.load(Ordering::Relaxed) {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        self.inner.sync_dir(path)
    }
    fn io_name(&self) -> String {
        format!("{} with injected faults", self.inner.io_name())
    }
    fn lock_dir(&self, dir: &Path) -> crate::Result<Option<DirLock>> {
        self.inner.lock_dir(dir)
    }
    fn lock_dir_shared(&self, dir: &Path) -> crate::Result<Option<DirLock>> {
        self.inner.lock_dir_shared(dir)
    }
    fn open_read_only(&self, path: &Path, mode: OpenMode) -> io::Result<Arc<dyn StorageFile>> {
        let inner = self.inner.open_read_only(path, mode)?;
        Ok(Arc::new(FaultyFile { inner, faults: self.faults.clone() }))
    }
    fn free_space(&self, path: &Path) -> Option<u64> {
        match (self.faults.space_left(), self.inner.free_space(path)) {
            (Some(left), Some(real)) => Some(left.min(real)),
            (Some(left), None) => Some(left),
            (None, real) => real,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::FileBackend;

    #[test]
    fn faulty_backend_injects_enospc() {
        let dir = tempfile::tempdir().unwrap();
        let be = FaultyBackend::new(Arc::new(FileBackend::default()));
        let f = be.open(&dir.path().join("x"), OpenMode::Buffered, true).unwrap();
        f.write_at(b"ok", 0).unwrap();
        be.faults.write_errno.store(libc::ENOSPC as u64, Ordering::Relaxed);
        let e = f.write_at(b"no", 0).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOSPC));
        be.faults.write_errno.store(0, Ordering::Relaxed);
        f.write_at(b"ok", 2).unwrap();
    }
}
