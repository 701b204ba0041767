//! A backend wrapper for read-only opens: every write is refused before it reaches a file.
//!
//! [`crate::BufferManager::open_read_only`] puts its backend inside a [`ReadOnlyBackend`],
//! so that nothing above it (the buffer manager, the catalog, the log) can change the
//! database, whatever path it takes: files are opened with the inner backend's
//! [`StorageBackend::open_read_only`] (the operating system's read-only access where the
//! backend has one) and wrapped so that writes, syncs and truncations fail with
//! `ErrorKind::ReadOnlyFilesystem`; atomic replacements, removals and directory creation fail
//! the same way; a file that does not exist and would have been created reads as empty.
//! The directory lock is taken shared ([`StorageBackend::lock_dir_shared`]).

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::backend::{OpenMode, ReadReq, StorageBackend, StorageFile, WriteReq};
use super::dirlock::DirLock;
use super::IoBufMut;

/// The error every refused write gets.
fn refused() -> io::Error {
    io::Error::new(io::ErrorKind::ReadOnlyFilesystem, "the database is open read-only")
}

/// Wraps a backend so that nothing can be written through it.
#[derive(Debug)]
pub struct ReadOnlyBackend {
    inner: Arc<dyn StorageBackend>,
}

impl ReadOnlyBackend {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn StorageBackend>) -> ReadOnlyBackend {
        ReadOnlyBackend { inner }
    }
}

/// A file opened through a [`ReadOnlyBackend`]: reads go to the inner file, writes fail.
#[derive(Debug)]
struct ReadOnlyFile {
    inner: Arc<dyn StorageFile>,
}

impl StorageFile for ReadOnlyFile {
    fn read_at(&self, dst: IoBufMut<'_>, offset: u64) -> io::Result<usize> {
        self.inner.read_at(dst, offset)
    }
    fn read_many(&self, reqs: &mut [ReadReq<'_>]) -> io::Result<()> {
        self.inner.read_many(reqs)
    }
    fn queue_depth(&self) -> usize {
        self.inner.queue_depth()
    }
    fn write_at(&self, _src: &[u8], _offset: u64) -> io::Result<()> {
        Err(refused())
    }
    fn write_many(&self, reqs: &mut [WriteReq<'_>]) -> io::Result<()> {
        for req in reqs.iter_mut() {
            req.result = Err(refused());
        }
        Err(refused())
    }
    fn sync(&self) -> io::Result<()> {
        Err(refused())
    }
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }
    fn set_len(&self, _len: u64) -> io::Result<()> {
        Err(refused())
    }
    fn reserve(&self, _offset: u64, _len: u64) -> io::Result<()> {
        Err(refused())
    }
    fn is_direct(&self) -> bool {
        self.inner.is_direct()
    }
    fn path(&self) -> &Path {
        self.inner.path()
    }
}

/// A file a read-write open would have created: empty, and it stays so.
#[derive(Debug)]
struct AbsentFile {
    path: PathBuf,
}

impl StorageFile for AbsentFile {
    fn read_at(&self, _dst: IoBufMut<'_>, _offset: u64) -> io::Result<usize> {
        Ok(0)
    }
    fn write_at(&self, _src: &[u8], _offset: u64) -> io::Result<()> {
        Err(refused())
    }
    fn sync(&self) -> io::Result<()> {
        Err(refused())
    }
    fn len(&self) -> io::Result<u64> {
        Ok(0)
    }
    fn set_len(&self, _len: u64) -> io::Result<()> {
        Err(refused())
    }
    fn reserve(&self, _offset: u64, _len: u64) -> io::Result<()> {
        Err(refused())
    }
    fn is_direct(&self) -> bool {
        false
    }
    fn path(&self) -> &Path {
        &self.path
    }
}

impl StorageBackend for ReadOnlyBackend {
    fn open(&self, path: &Path, mode: OpenMode, create: bool) -> io::Result<Arc<dyn StorageFile>> {
        match self.inner.open_read_only(path, mode) {
            Ok(inner) => Ok(Arc::new(ReadOnlyFile { inner })),
            Err(e) if create && e.kind() == io::ErrorKind::NotFound => Ok(Arc::new(AbsentFile { path: path.to_owned() })),
            Err(e) => Err(e),
        }
    }
    fn open_read_only(&self, path: &Path, mode: OpenMode) -> io::Result<Arc<dyn StorageFile>> {
        self.open(path, mode, false)
    }
    fn read_file(&self, path: &Path) -> io::Result<Vec<u8>> {
        self.inner.read_file(path)
    }
    fn write_atomic(&self, _path: &Path, _bytes: &[u8]) -> io::Result<()> {
        Err(refused())
    }
    fn remove(&self, _path: &Path) -> io::Result<()> {
        Err(refused())
    }
    fn exists(&self, path: &Path) -> bool {
        self.inner.exists(path)
    }
    fn create_dir_all(&self, _path: &Path) -> io::Result<()> {
        Err(refused())
    }
    fn list_dir(&self, path: &Path) -> io::Result<Vec<String>> {
        self.inner.list_dir(path)
    }
    fn sync_dir(&self, _path: &Path) -> io::Result<()> {
        Err(refused())
    }
    fn io_name(&self) -> String {
        format!("{} (read-only)", self.inner.io_name())
    }
    fn free_space(&self, path: &Path) -> Option<u64> {
        self.inner.free_space(path)
    }
    fn lock_dir(&self, dir: &Path) -> crate::Result<Option<DirLock>> {
        self.inner.lock_dir_shared(dir)
    }
    fn lock_dir_shared(&self, dir: &Path) -> crate::Result<Option<DirLock>> {
        self.inner.lock_dir_shared(dir)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::{AlignedBuf, FileBackend};

    #[test]
    fn reads_pass_writes_are_refused_and_change_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, vec![7u8; 8192]).unwrap();
        let ro = ReadOnlyBackend::new(Arc::new(FileBackend::default()));
        for mode in [OpenMode::Direct, OpenMode::Buffered] {
            let f = ro.open(&path, mode, true).unwrap();
            let mut buf = AlignedBuf::zeroed(4096);
            assert_eq!(f.read_at(buf.io(), 4096).unwrap(), 4096);
            assert!(buf.iter().all(|&b| b == 7));
            assert_eq!(f.len().unwrap(), 8192);
            assert_eq!(f.write_at(&buf, 0).unwrap_err().kind(), io::ErrorKind::ReadOnlyFilesystem);
            assert_eq!(f.set_len(0).unwrap_err().kind(), io::ErrorKind::ReadOnlyFilesystem);
            assert_eq!(f.sync().unwrap_err().kind(), io::ErrorKind::ReadOnlyFilesystem);
        }
        assert_eq!(ro.write_atomic(&path, b"x").unwrap_err().kind(), io::ErrorKind::ReadOnlyFilesystem);
        assert_eq!(ro.remove(&path).unwrap_err().kind(), io::ErrorKind::ReadOnlyFilesystem);
        assert!(ro.create_dir_all(&dir.path().join("d")).is_err());
        assert_eq!(std::fs::read(&path).unwrap(), vec![7u8; 8192]);
        // A missing file is not created: it reads as empty, or is an error without `create`.
        let missing = dir.path().join("missing");
        let f = ro.open(&missing, OpenMode::Direct, true).unwrap();
        assert_eq!(f.len().unwrap(), 0);
        assert!(ro.open(&missing, OpenMode::Direct, false).is_err());
        assert!(!missing.exists() && !dir.path().join("d").exists());
    }

    #[test]
    fn the_os_refuses_writes_to_a_file_opened_read_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, vec![1u8; 4096]).unwrap();
        let f = FileBackend::default().open_read_only(&path, OpenMode::Buffered).unwrap();
        assert!(f.write_at(&[2u8; 16], 0).is_err());
        assert_eq!(std::fs::read(&path).unwrap(), vec![1u8; 4096]);
    }
}
