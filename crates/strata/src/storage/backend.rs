//! The storage-backend trait: every byte strata writes or reads goes through it, so tests
//! can inject faults (and later rebuild crash images) and later backends can use io_uring.
//!
//! [`FileBackend`] opens data files with `O_DIRECT` (the OS page cache would otherwise double
//! the memory use and hide misses) and falls back to buffered I/O where the filesystem
//! refuses it (tmpfs), recording that in [`StorageFile::is_direct`].

use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::marker::PhantomData;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::dirlock::DirLock;

/// Alignment required of buffers and offsets for direct I/O.
pub const DIRECT_IO_ALIGN: usize = 4096;

/// How a file is opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpenMode {
    /// Page data: direct I/O when the filesystem allows it.
    Direct,
    /// Small metadata files: ordinary buffered I/O.
    Buffered,
}

/// A destination for a read: either an ordinary exclusive slice or a frame of the buffer
/// pool that optimistic readers may be reading at the same time.
///
/// Frames are written only with whole, aligned 8-byte atomic stores (or by the kernel), never
/// through a `&mut [u8]`, so a concurrent optimistic reader (which reads with 8-byte atomic
/// loads, see `buffer::guard`) never races with a non-atomic write.
pub struct IoBufMut<'a> {
    ptr: NonNull<u8>,
    len: usize,
    shared: bool,
    _borrow: PhantomData<&'a mut [u8]>,
}

// SAFETY: IoBufMut is a (possibly shared-with-atomic-readers) mutable view of memory; it is
// only a pointer and a length and may be moved to another thread like `&mut [u8]`.
unsafe impl Send for IoBufMut<'_> {}

impl<'a> IoBufMut<'a> {
    /// A view of an ordinary slice this thread owns exclusively.
    pub fn from_slice(buf: &'a mut [u8]) -> Self {
        IoBufMut { ptr: NonNull::from(&mut *buf).cast(), len: buf.len(), shared: false, _borrow: PhantomData }
    }

    /// A view of a buffer-pool frame.
    ///
    /// # Safety
    /// `ptr` must be valid for writes of `len` bytes for `'a`, 8-byte aligned with `len` a
    /// multiple of 8, and no other thread may write it during `'a` (other threads may read
    /// it with 8-byte atomic loads).
    pub unsafe fn from_frame(ptr: *mut u8, len: usize) -> Self {
        debug_assert!((ptr as usize).is_multiple_of(8) && len.is_multiple_of(8));
        IoBufMut { ptr: NonNull::new(ptr).expect("null frame"), len, shared: true, _borrow: PhantomData }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Raw pointer for a system call that writes into the buffer (the kernel's stores are
    /// outside the Rust memory model, like DMA).
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Copies `src` to offset `at` of the buffer. For frames, `at` and `src.len()` must be
    /// multiples of 8; the copy uses 8-byte atomic stores.
    // Copying memory through words must keep the bytes in memory order: native endianness.
    #[allow(clippy::host_endian_bytes)]
    pub fn copy_from(&mut self, at: usize, src: &[u8]) {
        assert!(at + src.len() <= self.len, "copy past the end of an I/O buffer");
        if self.shared {
            assert!(at.is_multiple_of(8) && src.len().is_multiple_of(8), "frame copies must be word-aligned");
            for (i, chunk) in src.chunks_exact(8).enumerate() {
                let word = u64::from_ne_bytes(chunk.try_into().unwrap());
                // SAFETY: the frame is valid and 8-byte aligned for `len` bytes (from_frame's
                // contract) and `at + 8*i + 8 <= len`; the store is atomic, so concurrent
                // atomic loads by optimistic readers do not race with it.
                unsafe { atomic_word(self.ptr.as_ptr().add(at + 8 * i)).store(word, Ordering::Relaxed) };
            }
        } else {
            // SAFETY: `from_slice` borrowed the memory exclusively for 'a; bounds checked above.
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.as_ptr().add(at), src.len()) };
        }
    }

    /// Zeroes `len` bytes from `at` (same alignment rules as [`IoBufMut::copy_from`]).
    pub fn zero(&mut self, at: usize, len: usize) {
        assert!(at + len <= self.len);
        if self.shared {
            assert!(at.is_multiple_of(8) && len.is_multiple_of(8));
            for i in (at..at + len).step_by(8) {
                // SAFETY: as in copy_from.
                unsafe { atomic_word(self.ptr.as_ptr().add(i)).store(0, Ordering::Relaxed) };
            }
        } else {
            // SAFETY: exclusive borrow, bounds checked.
            unsafe { std::ptr::write_bytes(self.ptr.as_ptr().add(at), 0, len) };
        }
    }
}

/// # Safety
/// `p` must be 8-byte aligned and valid for 8 bytes for the returned lifetime.
pub(crate) unsafe fn atomic_word<'a>(p: *mut u8) -> &'a AtomicU64 {
    // SAFETY: caller guarantees alignment and validity; AtomicU64 has the layout of u64.
    unsafe { AtomicU64::from_ptr(p.cast::<u64>()) }
}

/// A heap buffer aligned for direct I/O.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: AlignedBuf owns its allocation like a Vec<u8>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only reads.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A zeroed buffer of `len` bytes (rounded up to the alignment), aligned to 4 KiB.
    pub fn zeroed(len: usize) -> AlignedBuf {
        let len = len.max(1).next_multiple_of(DIRECT_IO_ALIGN);
        let layout = std::alloc::Layout::from_size_align(len, DIRECT_IO_ALIGN).expect("buffer layout");
        // SAFETY: layout has non-zero size.
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        AlignedBuf { ptr, len }
    }
    /// An exclusive I/O view.
    pub fn io(&mut self) -> IoBufMut<'_> {
        IoBufMut::from_slice(self.as_mut())
    }
}

impl std::ops::Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr is a live allocation of len initialised (zeroed) bytes.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl AsMut<[u8]> for AlignedBuf {
    fn as_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in deref, and &mut self gives exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        let layout = std::alloc::Layout::from_size_align(self.len, DIRECT_IO_ALIGN).expect("buffer layout");
        // SAFETY: allocated in `zeroed` with this very layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) };
    }
}

/// One read of a [`StorageFile::read_many`] batch: where to read into, from where, and (after
/// the call) what happened.
pub struct ReadReq<'a> {
    /// The destination; its length is the number of bytes wanted.
    pub buf: IoBufMut<'a>,
    /// Byte offset in the file.
    pub offset: u64,
    /// Filled by `read_many`: the bytes read (short only at end of file, 0 past it) or this
    /// read's own error.
    pub result: io::Result<usize>,
}

impl<'a> ReadReq<'a> {
    /// A request to read `buf.len()` bytes at `offset` (its result starts as `Ok(0)`).
    pub fn new(buf: IoBufMut<'a>, offset: u64) -> ReadReq<'a> {
        ReadReq { buf, offset, result: Ok(0) }
    }

    /// The destination, reborrowed for one call (such as [`StorageFile::read_at`]).
    pub fn buf_mut(&mut self) -> IoBufMut<'_> {
        // A reborrow: the original view cannot be used while the returned one lives, so the
        // exclusivity (or frame) contract of `buf` carries over unchanged.
        IoBufMut { ptr: self.buf.ptr, len: self.buf.len, shared: self.buf.shared, _borrow: PhantomData }
    }
}

impl fmt::Debug for ReadReq<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReadReq").field("len", &self.buf.len()).field("offset", &self.offset).field("result", &self.result).finish()
    }
}

/// One write of a [`StorageFile::write_many`] batch: what to write where, and (after the
/// call) whether it was written.
pub struct WriteReq<'a> {
    /// The bytes to write, all of them.
    pub buf: &'a [u8],
    /// Byte offset in the file.
    pub offset: u64,
    /// Filled by `write_many`: this write's outcome.
    pub result: io::Result<()>,
}

impl<'a> WriteReq<'a> {
    /// A request to write `buf` at `offset` (its result starts as `Ok(())`).
    pub fn new(buf: &'a [u8], offset: u64) -> WriteReq<'a> {
        WriteReq { buf, offset, result: Ok(()) }
    }
}

impl fmt::Debug for WriteReq<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WriteReq").field("len", &self.buf.len()).field("offset", &self.offset).field("result", &self.result).finish()
    }
}

/// A copy of an I/O error for a second owner (`io::Error` is not `Clone`).
fn copy_io_error(e: &io::Error) -> io::Error {
    match e.raw_os_error() {
        Some(code) => io::Error::from_raw_os_error(code),
        None => io::Error::new(e.kind(), e.to_string()),
    }
}

/// `fallocate(FALLOC_FL_KEEP_SIZE)` of `offset..offset + len` of `file` (see
/// [`StorageFile::reserve`]); file systems without it give `ErrorKind::Unsupported`.
pub(crate) fn reserve_space(file: &File, offset: u64, len: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let (Ok(off), Ok(n)) = (libc::off_t::try_from(offset), libc::off_t::try_from(len)) else {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    };
    loop {
        // SAFETY: fallocate on a descriptor this `File` owns and keeps open for the call; it
        // touches no memory of this process.
        let r = unsafe { libc::fallocate(file.as_raw_fd(), libc::FALLOC_FL_KEEP_SIZE, off, n) };
        if r == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) => return Err(io::Error::new(io::ErrorKind::Unsupported, e)),
            _ => return Err(e),
        }
    }
}

/// One open file.
#[allow(clippy::len_without_is_empty)] // a file's length is fallible; nobody asks emptiness
pub trait StorageFile: Send + Sync + fmt::Debug {
    /// Reads up to `dst.len()` bytes at `offset`; returns the number read (short only at EOF).
    fn read_at(&self, dst: IoBufMut<'_>, offset: u64) -> io::Result<usize>;
    /// Writes all of `src` at `offset`.
    fn write_at(&self, src: &[u8], offset: u64) -> io::Result<()>;
    /// Makes everything written so far durable.
    fn sync(&self) -> io::Result<()>;
    /// Current length in bytes.
    fn len(&self) -> io::Result<u64>;
    /// Cuts (or extends with zeros) the file to `len` bytes; durable after the next `sync`.
    fn set_len(&self, len: u64) -> io::Result<()>;
    /// Reserves disk space for bytes `offset..offset + len` without changing the file's
    /// length (`fallocate` with `FALLOC_FL_KEEP_SIZE`), so that writing them later cannot
    /// fail for lack of space. `ErrorKind::Unsupported` where the file system cannot; the
    /// default (files without a disk behind them) reserves nothing and succeeds.
    fn reserve(&self, offset: u64, len: u64) -> io::Result<()> {
        let _ = (offset, len);
        Ok(())
    }
    /// Whether the file bypasses the OS page cache.
    fn is_direct(&self) -> bool;
    /// The path it was opened with (for error messages).
    fn path(&self) -> &Path;

    /// Issues every read of `reqs` (at most a queue depth of them in flight at once, where
    /// the file supports that) and fills each request's `result`: the bytes read (short only
    /// at end of file) or that read's own error. All reads have finished when it returns,
    /// whatever the outcome. Returns `Ok(())` when every read succeeded, else a copy of the
    /// first failed request's error (the other requests' results are still filled).
    ///
    /// The default reads them one after the other with [`StorageFile::read_at`] (see
    /// [`StorageFile::queue_depth`]).
    fn read_many(&self, reqs: &mut [ReadReq<'_>]) -> io::Result<()> {
        for req in reqs.iter_mut() {
            let offset = req.offset;
            req.result = self.read_at(req.buf_mut(), offset);
        }
        first_error(reqs)
    }

    /// Issues every write of `reqs` (at most a queue depth of them in flight at once, where
    /// the file supports that) and fills each request's `result`. All writes have finished
    /// (or failed) when it returns, whatever the outcome; nothing is durable before a
    /// [`StorageFile::sync`]. Returns `Ok(())` when every write succeeded, else a copy of the
    /// first failed request's error.
    ///
    /// The default writes them one after the other with [`StorageFile::write_at`].
    fn write_many(&self, reqs: &mut [WriteReq<'_>]) -> io::Result<()> {
        for req in reqs.iter_mut() {
            req.result = self.write_at(req.buf, req.offset);
        }
        first_write_error(reqs)
    }

    /// How many requests of one [`StorageFile::read_many`] are in flight at once at most
    /// (1 for the default, which reads them in turn).
    fn queue_depth(&self) -> usize {
        1
    }
}

/// `Ok(())`, or a copy of the first error among the requests' results.
pub(crate) fn first_error(reqs: &[ReadReq<'_>]) -> io::Result<()> {
    match reqs.iter().find_map(|r| r.result.as_ref().err()) {
        Some(e) => Err(copy_io_error(e)),
        None => Ok(()),
    }
}

/// `Ok(())`, or a copy of the first error among the write requests' results.
pub(crate) fn first_write_error(reqs: &[WriteReq<'_>]) -> io::Result<()> {
    match reqs.iter().find_map(|r| r.result.as_ref().err()) {
        Some(e) => Err(copy_io_error(e)),
        None => Ok(()),
    }
}

/// The temporary file [`StorageBackend::write_atomic`] of a filesystem writes before renaming
/// it over `path`: `path` with `.tmp-write` appended, so that files differing only in their
/// extension (`alloc.table`, `alloc.json`) never share one, and so that what a killed write
/// leaves is recognisably `path`'s (an interrupted create is told apart from foreign files by
/// the names it leaves).
pub fn atomic_write_temp(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".tmp-write");
    PathBuf::from(name)
}

/// A filesystem as strata sees it.
pub trait StorageBackend: Send + Sync + fmt::Debug {
    /// Opens (and with `create`, creates) a file.
    fn open(&self, path: &Path, mode: OpenMode, create: bool) -> io::Result<Arc<dyn StorageFile>>;
    /// Reads a whole small file.
    fn read_file(&self, path: &Path) -> io::Result<Vec<u8>>;
    /// Replaces `path` atomically: write a temporary file, fsync it, rename it over `path`,
    /// fsync the directory.
    fn write_atomic(&self, path: &Path, bytes: &[u8]) -> io::Result<()>;
    /// Removes a file (missing is fine).
    fn remove(&self, path: &Path) -> io::Result<()>;
    /// Whether a path exists.
    fn exists(&self, path: &Path) -> bool;
    /// Creates a directory and its parents.
    fn create_dir_all(&self, path: &Path) -> io::Result<()>;
    /// Lists the names in a directory.
    fn list_dir(&self, path: &Path) -> io::Result<Vec<String>>;
    /// Makes the directory's entries (files created or removed in it) durable.
    fn sync_dir(&self, path: &Path) -> io::Result<()>;
    /// How data files do their I/O, for statistics and logs: `posix` (pread/pwrite), or
    /// `io_uring`, or what a wrapper adds.
    fn io_name(&self) -> String {
        "posix".to_owned()
    }
    /// Takes the exclusive lock on the database directory `dir` (which exists), held until
    /// the returned value is dropped; fails with [`crate::Error::Locked`] while another open
    /// holds it. The default locks the real directory ([`DirLock`]); a backend whose files
    /// are not on the real filesystem (the simulation) returns `None`, as do wrappers of it.
    fn lock_dir(&self, dir: &Path) -> crate::Result<Option<DirLock>> {
        DirLock::acquire(dir).map(Some)
    }
    /// Takes the lock on `dir` shared, for a read-only open (see [`DirLock::acquire_shared`]);
    /// fails with [`crate::Error::Locked`] while a writer holds it. Backends that take no lock
    /// return `None`.
    fn lock_dir_shared(&self, dir: &Path) -> crate::Result<Option<DirLock>> {
        DirLock::acquire_shared(dir)
    }
    /// Opens an existing file for reading only (where the backend can, with the operating
    /// system's read-only access, so that no write through it can succeed). The default opens
    /// it as [`open`](Self::open) does without creating it.
    fn open_read_only(&self, path: &Path, mode: OpenMode) -> io::Result<Arc<dyn StorageFile>> {
        self.open(path, mode, false)
    }
    /// Bytes an unprivileged writer may still write on the file system that holds `path`
    /// (`statvfs`: available blocks x fragment size), if known. Lets the log keep itself
    /// small on a small disk.
    fn free_space(&self, path: &Path) -> Option<u64> {
        statvfs_free(path)
    }
}

/// `statvfs(path)`'s available bytes.
pub(crate) fn statvfs_free(path: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `c` is a NUL-terminated path that outlives the call; `st` is a properly sized
    // and aligned out-parameter that statvfs fills on success (and only then is it read).
    let r = unsafe { libc::statvfs(c.as_ptr(), st.as_mut_ptr()) };
    if r != 0 {
        return None;
    }
    // SAFETY: statvfs returned 0, so it initialised `st`.
    let st = unsafe { st.assume_init() };
    // The field types are u64 on 64-bit Linux, narrower elsewhere.
    #[allow(clippy::unnecessary_cast)]
    let (blocks, size) = (st.f_bavail as u64, st.f_frsize as u64);
    Some(blocks.saturating_mul(size))
}

/// The real filesystem, with `O_DIRECT` for page data.
#[derive(Debug, Default)]
pub struct FileBackend {
    /// Never use O_DIRECT (for filesystems that accept the flag but perform badly with it).
    pub buffered_only: bool,
}

#[derive(Debug)]
struct PosixFile {
    file: File,
    path: PathBuf,
    direct: bool,
}

impl StorageFile for PosixFile {
    fn read_at(&self, mut dst: IoBufMut<'_>, offset: u64) -> io::Result<usize> {
        let mut done = 0;
        while done < dst.len() {
            // SAFETY: dst points to `len` writable bytes for the duration of the call and no
            // other thread writes them (IoBufMut's contract); pread writes at most len-done.
            let n = unsafe {
                libc::pread(
                    std::os::fd::AsRawFd::as_raw_fd(&self.file),
                    dst.as_mut_ptr().add(done).cast(),
                    dst.len() - done,
                    (offset + done as u64) as libc::off_t,
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                if matches!(e.kind(), io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock) {
                    continue;
                }
                return Err(e);
            }
            if n == 0 {
                break;
            }
            done += n as usize;
        }
        Ok(done)
    }

    fn write_at(&self, src: &[u8], offset: u64) -> io::Result<()> {
        // write_all_at retries on EINTR and short writes.
        self.file.write_all_at(src, offset)
    }

    fn sync(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.file.set_len(len)
    }

    fn reserve(&self, offset: u64, len: u64) -> io::Result<()> {
        reserve_space(&self.file, offset, len)
    }

    fn is_direct(&self) -> bool {
        self.direct
    }

    fn path(&self) -> &Path {
        &self.path
    }
}

impl FileBackend {
    fn open_with(&self, path: &Path, mode: OpenMode, opts: OpenOptions) -> io::Result<Arc<dyn StorageFile>> {
        if mode == OpenMode::Direct && !self.buffered_only {
            let mut direct = opts.clone();
            direct.custom_flags(libc::O_DIRECT);
            match direct.open(path) {
                Ok(file) => return Ok(Arc::new(PosixFile { file, path: path.to_owned(), direct: true })),
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {} // tmpfs and friends
                Err(e) => return Err(e),
            }
        }
        let file = opts.open(path)?;
        Ok(Arc::new(PosixFile { file, path: path.to_owned(), direct: false }))
    }
}

impl StorageBackend for FileBackend {
    fn open(&self, path: &Path, mode: OpenMode, create: bool) -> io::Result<Arc<dyn StorageFile>> {
        let mut opts = OpenOptions::new();
        opts.read(true).write(true).create(create);
        self.open_with(path, mode, opts)
    }

    fn open_read_only(&self, path: &Path, mode: OpenMode) -> io::Result<Arc<dyn StorageFile>> {
        let mut opts = OpenOptions::new();
        opts.read(true);
        self.open_with(path, mode, opts)
    }

    fn read_file(&self, path: &Path) -> io::Result<Vec<u8>> {
        fs::read(path)
    }

    fn write_atomic(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        let dir = path.parent().unwrap_or(Path::new("."));
        let tmp = atomic_write_temp(path);
        let written = File::create(&tmp).and_then(|mut f| {
            f.write_all(bytes)?;
            f.sync_all()
        });
        if let Err(e) = written.and_then(|()| fs::rename(&tmp, path)) {
            // A full disk (or any failure) leaves the old file as it was and no temporary
            // file behind.
            let _ = fs::remove_file(&tmp);
            return Err(e);
        }
        File::open(dir)?.sync_all()
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        match fs::remove_file(path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            r => r,
        }
    }

    fn exists(&self, path: &Path) -> bool {
        path.exists()
    }

    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        fs::create_dir_all(path)
    }

    fn list_dir(&self, path: &Path) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for e in fs::read_dir(path)? {
            names.push(e?.file_name().to_string_lossy().into_owned());
        }
        names.sort();
        Ok(names)
    }

    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        File::open(path)?.sync_all()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn direct_file_round_trip_and_short_read_at_eof() {
        let dir = tempfile::tempdir().unwrap();
        let be = FileBackend::default();
        let f = be.open(&dir.path().join("x"), OpenMode::Direct, true).unwrap();
        let mut buf = AlignedBuf::zeroed(8192);
        buf.as_mut()[..5].copy_from_slice(b"hello");
        f.write_at(&buf, 4096).unwrap();
        f.sync().unwrap();
        let mut back = AlignedBuf::zeroed(8192);
        assert_eq!(f.read_at(back.io(), 4096).unwrap(), 8192);
        assert_eq!(&back[..5], b"hello");
        let mut tail = AlignedBuf::zeroed(8192);
        assert_eq!(f.read_at(tail.io(), 8192).unwrap(), 4096, "short read at EOF");
        assert_eq!(f.len().unwrap(), 12288);
    }

    #[test]
    fn atomic_write_temp_names_are_the_paths_own() {
        let t = atomic_write_temp(Path::new("/db/alloc.table"));
        assert_eq!(t, Path::new("/db/alloc.table.tmp-write"));
        assert_ne!(t, atomic_write_temp(Path::new("/db/alloc.json")));
        assert_eq!(atomic_write_temp(Path::new("meta")), Path::new("meta.tmp-write"));
    }

    #[test]
    fn atomic_write_replaces_whole_file() {
        let dir = tempfile::tempdir().unwrap();
        let be = FileBackend::default();
        let p = dir.path().join("meta");
        be.write_atomic(&p, b"one").unwrap();
        be.write_atomic(&p, b"two!").unwrap();
        assert_eq!(be.read_file(&p).unwrap(), b"two!");
        assert!(!be.exists(&atomic_write_temp(&p)));
        // A replacement that fails (here the rename: the target is a non-empty directory;
        // on a full disk, the write) leaves no temporary file behind.
        let d = dir.path().join("taken");
        std::fs::create_dir_all(d.join("inside")).unwrap();
        assert!(be.write_atomic(&d, b"three").is_err());
        assert!(!be.exists(&atomic_write_temp(&d)));
    }
}
