//! A storage backend whose page-data files do their I/O through io_uring.
//!
//! [`UringBackend`] implements [`StorageBackend`]: the small files (meta, allocation table,
//! log segments, everything opened [`OpenMode::Buffered`]) go to a [`FileBackend`]; data
//! files ([`OpenMode::Direct`]) are `UringFile`s, opened with `O_DIRECT` and falling back to
//! buffered I/O on `EINVAL` exactly as [`FileBackend`] does. Their `read_at`, `write_at`,
//! `sync` (an `IORING_OP_FSYNC` with `DATASYNC`), [`StorageFile::read_many`] and
//! [`StorageFile::write_many`] go through
//! io_uring; `len`, `set_len`, `path` and `is_direct` are the plain file calls.
//! The batches are where io_uring pays: they keep up to [`RING_ENTRIES`] requests in flight with
//! one system call per round of completions, where a loop of `pread`s waits for each read in
//! turn.
//!
//! # Rings: one per thread
//!
//! Every call is synchronous (it returns when its I/O is done), so a ring is busy only
//! while one call of one thread uses it. Each thread therefore gets its own ring, created
//! lazily on its first I/O and kept in a thread-local until the thread exits: no lock, no
//! contention between threads, no completion that could belong to another caller (every
//! completion in a ring is for the call running on it), and the ring can be created with
//! `IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN` (falling back to a plain ring
//! on kernels without them). The alternative, a small pool of rings behind a mutex, would
//! bound the number of rings (one fd and about 12 KiB each) when there are many I/O threads,
//! at the price of a lock round trip per call and of callers queueing behind one another
//! when the pool is smaller than the number of threads doing I/O; strata's I/O threads are
//! its callers' threads, few and long-lived, so per-thread rings are the better trade. A
//! thread whose ring cannot be created (`RLIMIT_MEMLOCK` on kernels before 5.12, too many
//! files) does that call with `pread`/`pwrite`/`fdatasync` instead of failing, and tries to
//! create its ring again a second later. A ring inherited through `fork` belongs to the
//! parent (its queues are shared memory): a child drops it and creates its own.
//!
//! # Nothing is in flight when a call returns
//!
//! The buffers are borrowed only for the call (an [`IoBufMut`] or `&[u8]` argument, the
//! requests of `read_many`); the kernel holds raw pointers into them while a request is in
//! flight. If a call could return (or be cancelled, or unwind) with a request still in the
//! kernel, the caller could free or reuse the memory while the kernel still reads or writes
//! it: this is the use-after-free of foyer issue #1286, where the buffer was moved into a
//! future that user code could drop while the read was still in flight. Here every call
//! submits its requests and then waits for **every** completion it submitted before it
//! returns, on every path:
//!
//! * results are per request: a failed request records its error and the others go on;
//!   short reads and writes are resubmitted for the rest (a read stops at end of file, a
//!   completion of 0 bytes); `-EINTR`/`-EAGAIN` completions are resubmitted; a wait
//!   interrupted by a signal (`io_uring_enter` failing with `EINTR`) is retried;
//! * the in-flight requests are counted by a guard (`Batch`) whose `Drop` waits for the
//!   rest, so even a panic between submission and completion cannot unwind past
//!   outstanding requests;
//! * if `io_uring_enter` itself fails for good (not `EINTR`/`EAGAIN`/`EBUSY`) while none of
//!   the call's requests has been taken by the kernel, the ring is dropped at once (its
//!   queued entries are never read) and the call finishes with `pread`/`pwrite`; if some had
//!   been taken, nothing could prove the kernel is done with the buffers, so the process
//!   aborts rather than return. That would need a broken ring fd; it is not expected in
//!   practice.
//!
//! # Fallback
//!
//! [`UringBackend::new`] probes io_uring once: it creates a ring, checks that the kernel
//! supports the read, write and fsync operations, and runs a `NOP` through it (seccomp
//! filters can allow `io_uring_setup` and deny `io_uring_enter`). If anything fails (`ENOSYS`
//! on old kernels, `EPERM` from seccomp or `kernel.io_uring_disabled`) it returns a backend
//! that is exactly a [`FileBackend`] and says why in [`UringBackend::fallback_reason`].
//! [`UringBackend::forced_fallback`], or `STRATA_IO=posix` in the environment, forces that
//! fallback (to test it where io_uring works, or to rule io_uring out when chasing a bug).

use std::cell::RefCell;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use io_uring::{opcode, squeue, types, IoUring, Probe};

use super::backend::{first_error, first_write_error, FileBackend, IoBufMut, OpenMode, ReadReq, StorageBackend, StorageFile, WriteReq};

/// Entries of each thread's ring: the most requests one call keeps in flight.
pub const RING_ENTRIES: u32 = 64;

/// The environment variable that forces the fallback when set to `posix`.
pub const ENV_VAR: &str = "STRATA_IO";

/// The most bytes Linux transfers in one read or write (`MAX_RW_COUNT`); longer requests
/// are issued in pieces.
const MAX_RW: usize = 0x7fff_f000;

/// How long a thread whose ring could not be created waits before trying again.
const RETRY_RING_AFTER: Duration = Duration::from_secs(1);

/// How many calls of a backend's files were served by io_uring and how many by the
/// `pread`/`pwrite` fallback of a thread without a ring.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UringStats {
    /// Calls (`read_at`, `write_at`, `sync`, `read_many`) whose I/O went through a ring.
    pub ring_calls: u64,
    /// Calls done with `pread`/`pwrite`/`fdatasync` because the thread had no ring.
    pub posix_calls: u64,
}

#[derive(Debug, Default)]
struct Counters {
    ring_calls: AtomicU64,
    posix_calls: AtomicU64,
}

/// The real filesystem, with page data read and written through io_uring (see the module
/// documentation), or exactly a [`FileBackend`] where io_uring is not available.
#[derive(Debug)]
pub struct UringBackend {
    files: FileBackend,
    fallback: Option<String>,
    counters: Arc<Counters>,
}

impl Default for UringBackend {
    fn default() -> Self {
        UringBackend::new()
    }
}

impl UringBackend {
    /// Probes io_uring and returns a backend that uses it, or (with the reason recorded in
    /// [`UringBackend::fallback_reason`]) one that behaves exactly like [`FileBackend`].
    /// `STRATA_IO=posix` in the environment forces the fallback.
    pub fn new() -> UringBackend {
        if std::env::var(ENV_VAR).is_ok_and(|v| v.eq_ignore_ascii_case("posix")) {
            return UringBackend::with_fallback(format!("forced by {ENV_VAR}=posix"));
        }
        // The kernel's answer does not change while the process runs: probe once.
        static PROBED: OnceLock<Result<(), String>> = OnceLock::new();
        match PROBED.get_or_init(|| probe().map(drop)) {
            Ok(()) => UringBackend { files: FileBackend::default(), fallback: None, counters: Arc::default() },
            Err(reason) => UringBackend::with_fallback(reason.clone()),
        }
    }

    /// A backend that never uses io_uring (exactly a [`FileBackend`]), for tests of the
    /// fallback on machines where io_uring works.
    pub fn forced_fallback() -> UringBackend {
        UringBackend::with_fallback("forced by UringBackend::forced_fallback".to_owned())
    }

    fn with_fallback(reason: String) -> UringBackend {
        UringBackend { files: FileBackend::default(), fallback: Some(reason), counters: Arc::default() }
    }

    /// Why this backend does not use io_uring, or `None` when it does.
    pub fn fallback_reason(&self) -> Option<&str> {
        self.fallback.as_deref()
    }

    /// Whether data files use io_uring.
    pub fn uses_io_uring(&self) -> bool {
        self.fallback.is_none()
    }

    /// How the calls on this backend's data files were served so far.
    pub fn stats(&self) -> UringStats {
        UringStats { ring_calls: self.counters.ring_calls.load(Ordering::Relaxed), posix_calls: self.counters.posix_calls.load(Ordering::Relaxed) }
    }
}

impl StorageBackend for UringBackend {
    fn open(&self, path: &Path, mode: OpenMode, create: bool) -> io::Result<Arc<dyn StorageFile>> {
        if mode != OpenMode::Direct || self.fallback.is_some() {
            return self.files.open(path, mode, create);
        }
        let mut opts = OpenOptions::new();
        opts.read(true).write(true).create(create);
        let mut direct = opts.clone();
        direct.custom_flags(libc::O_DIRECT);
        let (file, is_direct) = match direct.open(path) {
            Ok(file) => (file, true),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => (opts.open(path)?, false), // tmpfs and friends
            Err(e) => return Err(e),
        };
        Ok(Arc::new(UringFile { file, path: path.to_owned(), direct: is_direct, counters: self.counters.clone() }))
    }
    fn read_file(&self, path: &Path) -> io::Result<Vec<u8>> {
        self.files.read_file(path)
    }
    fn write_atomic(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        self.files.write_atomic(path, bytes)
    }
    fn remove(&self, path: &Path) -> io::Result<()> {
        self.files.remove(path)
    }
    fn exists(&self, path: &Path) -> bool {
        self.files.exists(path)
    }
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        self.files.create_dir_all(path)
    }
    fn list_dir(&self, path: &Path) -> io::Result<Vec<String>> {
        self.files.list_dir(path)
    }
    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        self.files.sync_dir(path)
    }
    fn lock_dir(&self, dir: &Path) -> crate::Result<Option<super::DirLock>> {
        self.files.lock_dir(dir)
    }
    fn lock_dir_shared(&self, dir: &Path) -> crate::Result<Option<super::DirLock>> {
        self.files.lock_dir_shared(dir)
    }
    /// Read-only opens (inspection) read with `pread`: they read little, and need no ring.
    fn open_read_only(&self, path: &Path, mode: OpenMode) -> io::Result<Arc<dyn StorageFile>> {
        self.files.open_read_only(path, mode)
    }
    fn io_name(&self) -> String {
        match &self.fallback {
            None => "io_uring".to_owned(),
            Some(why) => format!("posix (io_uring not used: {why})"),
        }
    }
}

/// A data file whose reads, writes and syncs go through this thread's ring.
#[derive(Debug)]
struct UringFile {
    file: File,
    path: PathBuf,
    direct: bool,
    counters: Arc<Counters>,
}

impl UringFile {
    /// Does `ops` through this thread's ring, or with plain system calls where the thread
    /// has none; every op has its result afterwards and nothing is in flight.
    fn run(&self, ops: &mut [Op]) {
        let fd = self.file.as_raw_fd();
        if with_thread_ring(|ring| run_on_ring(ring, fd, self.direct, ops)) {
            self.counters.ring_calls.fetch_add(1, Ordering::Relaxed);
        } else {
            self.counters.posix_calls.fetch_add(1, Ordering::Relaxed);
        }
        // Whatever the ring did not finish (all of it without a ring; the rest, from where it
        // stopped, after a ring failure) is done with plain system calls.
        for op in ops.iter_mut().filter(|op| op.result.is_none()) {
            run_posix(fd, self.direct, op);
        }
    }
}

impl StorageFile for UringFile {
    fn read_at(&self, mut dst: IoBufMut<'_>, offset: u64) -> io::Result<usize> {
        let mut ops = [Op::new(Kind::Read, dst.as_mut_ptr(), dst.len(), offset)];
        self.run(&mut ops);
        let [op] = ops;
        op.into_result()
    }

    fn write_at(&self, src: &[u8], offset: u64) -> io::Result<()> {
        // The kernel only reads a write's buffer.
        let mut ops = [Op::new(Kind::Write, src.as_ptr().cast_mut(), src.len(), offset)];
        self.run(&mut ops);
        let [op] = ops;
        op.into_result().map(drop)
    }

    fn sync(&self) -> io::Result<()> {
        let mut ops = [Op::new(Kind::Sync, std::ptr::null_mut(), 0, 0)];
        self.run(&mut ops);
        let [op] = ops;
        op.into_result().map(drop)
    }

    fn read_many(&self, reqs: &mut [ReadReq<'_>]) -> io::Result<()> {
        let mut ops: Vec<Op> = reqs.iter_mut().map(|r| Op::new(Kind::Read, r.buf.as_mut_ptr(), r.buf.len(), r.offset)).collect();
        self.run(&mut ops);
        for (req, op) in reqs.iter_mut().zip(ops) {
            req.result = op.into_result();
        }
        first_error(reqs)
    }

    fn write_many(&self, reqs: &mut [WriteReq<'_>]) -> io::Result<()> {
        // The kernel only reads a write's buffer.
        let mut ops: Vec<Op> = reqs.iter().map(|r| Op::new(Kind::Write, r.buf.as_ptr().cast_mut(), r.buf.len(), r.offset)).collect();
        self.run(&mut ops);
        for (req, op) in reqs.iter_mut().zip(ops) {
            req.result = op.into_result().map(drop);
        }
        first_write_error(reqs)
    }

    fn queue_depth(&self) -> usize {
        RING_ENTRIES as usize
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.file.set_len(len)
    }

    fn reserve(&self, offset: u64, len: u64) -> io::Result<()> {
        super::backend::reserve_space(&self.file, offset, len)
    }

    fn is_direct(&self) -> bool {
        self.direct
    }

    fn path(&self) -> &Path {
        &self.path
    }
}

// ---------------------------------------------------------------------------------------
// Operations and their progress.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Read,
    Write,
    Sync,
}

/// One operation of a call and how far it got.
///
/// `ptr` is valid (for writes of `len` bytes for a read; for reads of `len` bytes for a
/// write) for the whole call that built the op: it comes from a borrow the caller holds
/// until the call returns.
struct Op {
    kind: Kind,
    ptr: *mut u8,
    len: usize,
    offset: u64,
    /// Bytes transferred so far.
    done: usize,
    /// Set when the op is finished.
    result: Option<io::Result<usize>>,
}

impl Op {
    fn new(kind: Kind, ptr: *mut u8, len: usize, offset: u64) -> Op {
        // Empty reads and writes need no system call (pread of 0 bytes reads 0).
        let result = (kind != Kind::Sync && len == 0).then_some(Ok(0));
        Op { kind, ptr, len, offset, done: 0, result }
    }

    fn into_result(self) -> io::Result<usize> {
        self.result.unwrap_or_else(|| Err(io::Error::other("I/O operation was not performed")))
    }

    /// Bytes to ask for in the next piece.
    fn chunk(&self) -> usize {
        (self.len - self.done).min(MAX_RW)
    }

    /// Accounts for one attempt that returned `res` (bytes, or a negated errno); returns
    /// whether the op must be issued again (for the rest, or after an interruption).
    fn advance(&mut self, res: i64, direct: bool) -> bool {
        if res < 0 {
            let errno = i32::try_from(-res).unwrap_or(libc::EIO);
            if errno == libc::EINTR || errno == libc::EAGAIN {
                return true;
            }
            if errno == libc::EINVAL && direct && self.kind == Kind::Read && self.done > 0 {
                // The rest of a short direct read starts at an end of file that is not
                // aligned for O_DIRECT: the read did reach the end.
                self.result = Some(Ok(self.done));
                return false;
            }
            self.result = Some(Err(io::Error::from_raw_os_error(errno)));
            return false;
        }
        let n = res as usize;
        match self.kind {
            Kind::Sync => {
                self.result = Some(Ok(0));
                false
            }
            Kind::Read => {
                self.done += n;
                if n == 0 || self.done >= self.len {
                    self.result = Some(Ok(self.done));
                    return false;
                }
                true
            }
            Kind::Write => {
                if n == 0 {
                    self.result = Some(Err(io::ErrorKind::WriteZero.into()));
                    return false;
                }
                self.done += n;
                if self.done >= self.len {
                    self.result = Some(Ok(self.done));
                    return false;
                }
                true
            }
        }
    }

    /// The submission for the op's next piece, tagged with `tag`.
    fn entry(&self, fd: RawFd, tag: u64) -> squeue::Entry {
        let fd = types::Fd(fd);
        let at = self.offset + self.done as u64;
        // Pieces are at most MAX_RW bytes, which fits in u32.
        let len = self.chunk() as u32;
        let sqe = match self.kind {
            Kind::Read => opcode::Read::new(fd, self.ptr.wrapping_add(self.done), len).offset(at).build(),
            Kind::Write => opcode::Write::new(fd, self.ptr.wrapping_add(self.done).cast_const(), len).offset(at).build(),
            Kind::Sync => opcode::Fsync::new(fd).flags(types::FsyncFlags::DATASYNC).build(),
        };
        sqe.user_data(tag)
    }
}

/// Finishes `op` with plain system calls, from where it stopped.
fn run_posix(fd: RawFd, direct: bool, op: &mut Op) {
    while op.result.is_none() {
        let at = (op.offset + op.done as u64) as libc::off_t;
        let res = match op.kind {
            // SAFETY: `op.ptr` is valid for writes of `op.len` bytes for the whole call (Op's
            // invariant) and `done + chunk <= len`; no other thread writes the buffer
            // (IoBufMut's contract); pread writes at most `chunk` bytes.
            Kind::Read => unsafe { libc::pread(fd, op.ptr.add(op.done).cast(), op.chunk(), at) as i64 },
            // SAFETY: `op.ptr` is valid for reads of `op.len` bytes for the call (a borrowed
            // `&[u8]`); pwrite reads at most `chunk` bytes from `ptr + done`.
            Kind::Write => unsafe { libc::pwrite(fd, op.ptr.add(op.done).cast_const().cast(), op.chunk(), at) as i64 },
            // SAFETY: fdatasync takes only a file descriptor.
            Kind::Sync => unsafe { libc::fdatasync(fd) as i64 },
        };
        let res = if res < 0 { -i64::from(io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)) } else { res };
        op.advance(res, direct);
    }
}

// ---------------------------------------------------------------------------------------
// The thread's ring.

/// A thread's ring, created on first use.
struct Slot {
    ring: Option<IoUring>,
    /// The process that created `ring` (a forked child must not use its parent's ring).
    pid: u32,
    /// When creating a ring last failed in this thread.
    failed_at: Option<Instant>,
    /// Tests: make ring creation fail in this thread.
    #[cfg(test)]
    fail_creation: bool,
}

thread_local! {
    static RING: RefCell<Slot> = const {
        RefCell::new(Slot {
            ring: None,
            pid: 0,
            failed_at: None,
            #[cfg(test)]
            fail_creation: false,
        })
    };
}

impl Slot {
    fn install(&mut self, ring: IoUring) {
        self.ring = Some(ring);
        self.pid = std::process::id();
        self.failed_at = None;
    }

    /// Makes sure the thread has a usable ring; false when it has none.
    fn ensure(&mut self) -> bool {
        if self.ring.is_some() && self.pid != std::process::id() {
            // Inherited through fork: the queues are shared with the parent. Dropping it
            // unmaps and closes only this process's copy.
            self.ring = None;
            self.failed_at = None;
        }
        if self.ring.is_some() {
            return true;
        }
        if self.failed_at.is_some_and(|t| t.elapsed() < RETRY_RING_AFTER) {
            return false;
        }
        #[cfg(test)]
        if self.fail_creation {
            self.failed_at = Some(Instant::now());
            return false;
        }
        match create_ring() {
            Ok(ring) => {
                self.install(ring);
                true
            }
            Err(_) => {
                self.failed_at = Some(Instant::now());
                false
            }
        }
    }
}

/// Runs `f` on this thread's ring; false when the thread has no ring (it cannot be
/// created, or the thread is exiting) or `f` gave it up.
fn with_thread_ring(f: impl FnOnce(&mut Option<IoUring>) -> bool) -> bool {
    RING.try_with(|cell| {
        // Never re-entered (nothing here calls back into a file), but a failed borrow is
        // simply "no ring".
        let Ok(mut slot) = cell.try_borrow_mut() else { return false };
        if !slot.ensure() {
            return false;
        }
        let ok = f(&mut slot.ring);
        if slot.ring.is_none() {
            // `f` dropped a failed ring: do not create another at once.
            slot.failed_at = Some(Instant::now());
        }
        ok
    })
    .unwrap_or(false)
}

fn create_ring() -> io::Result<IoUring> {
    // One issuer (this thread) and completions run only when it waits: fewer interrupts
    // and context switches. Kernels before 6.1 refuse these flags; then a plain ring.
    IoUring::builder().setup_single_issuer().setup_defer_taskrun().build(RING_ENTRIES).or_else(|_| IoUring::new(RING_ENTRIES))
}

/// Creates a ring and checks it can do what the files need; the reason when it cannot.
fn probe() -> Result<IoUring, String> {
    let mut ring = create_ring().map_err(|e| format!("io_uring_setup failed: {e}"))?;
    let mut probe = Probe::new();
    ring.submitter().register_probe(&mut probe).map_err(|e| format!("io_uring opcode probe failed (kernel before 5.6?): {e}"))?;
    for (code, name) in [(opcode::Read::CODE, "READ"), (opcode::Write::CODE, "WRITE"), (opcode::Fsync::CODE, "FSYNC")] {
        if !probe.is_supported(code) {
            return Err(format!("the kernel's io_uring lacks IORING_OP_{name}"));
        }
    }
    // A NOP round trip: seccomp filters may allow io_uring_setup and deny io_uring_enter.
    let nop = opcode::Nop::new().build().user_data(0);
    // SAFETY: a NOP references no memory, so it may stay queued or in flight for any time
    // (if this fails, the ring is dropped with it, which is harmless).
    unsafe { ring.submission().push(&nop) }.map_err(|_| "io_uring submission queue full on a new ring".to_owned())?;
    let cqe = loop {
        if let Some(cqe) = ring.completion().next() {
            break cqe;
        }
        match ring.submit_and_wait(1) {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
            Err(e) => return Err(format!("io_uring_enter failed: {e}")),
        }
    };
    if cqe.result() < 0 {
        return Err(format!("io_uring NOP failed: {}", io::Error::from_raw_os_error(-cqe.result())));
    }
    Ok(ring)
}

// ---------------------------------------------------------------------------------------
// One call's requests on a ring.

/// The requests of one call that are in the ring: submitted (or queued for submission)
/// and not yet reaped. Its `Drop` waits for all of them, so no path out of the call (a
/// panic included) leaves a request in the kernel.
struct Batch<'r> {
    /// `None` once the ring was given up (see [`Batch::abandon`]).
    ring: &'r mut Option<IoUring>,
    in_flight: usize,
}

impl Batch<'_> {
    fn ring(&mut self) -> &mut IoUring {
        self.ring.as_mut().expect("the ring of a live batch")
    }

    /// Queues `sqe` for submission.
    ///
    /// # Safety
    /// The memory `sqe` refers to must stay valid (and unused by anything that would race
    /// with the kernel) until its completion is reaped by [`Batch::pop`].
    unsafe fn push(&mut self, sqe: &squeue::Entry) {
        // SAFETY: forwarded to our caller.
        let queued = unsafe { self.ring().submission().push(sqe) };
        // Cannot fail: every queued entry counts in `in_flight`, and callers keep that at or
        // below the capacity.
        assert!(queued.is_ok(), "io_uring submission queue full");
        self.in_flight += 1;
    }

    /// The next completion: (tag, result).
    fn pop(&mut self) -> Option<(u64, i32)> {
        let cqe = self.ring().completion().next()?;
        self.in_flight = self.in_flight.saturating_sub(1);
        Some((cqe.user_data(), cqe.result()))
    }

    /// Submits what is queued and waits for at least one completion. `Err` only when the
    /// ring failed while none of our requests is in the kernel (then [`Batch::abandon`]).
    fn wait(&mut self) -> io::Result<()> {
        #[cfg(test)]
        if test_hooks::enter_fails_now() {
            let in_flight = self.in_flight;
            if self.ring().submission().len() == in_flight {
                return Err(io::Error::from_raw_os_error(libc::EBADF));
            }
        }
        loop {
            let in_flight = self.in_flight;
            let ring = self.ring();
            let Err(e) = ring.submit_and_wait(1) else { return Ok(()) };
            let has_completions = !ring.completion().is_empty();
            match e.raw_os_error() {
                Some(libc::EINTR) => {}
                Some(libc::EAGAIN) | Some(libc::EBUSY) => {
                    if has_completions {
                        return Ok(());
                    }
                    std::thread::yield_now();
                }
                _ if has_completions => return Ok(()),
                _ if ring.submission().len() == in_flight => return Err(e), // the kernel took none
                _ => {
                    // Requests are in the kernel and the ring cannot be waited on: returning
                    // would let the kernel write into memory the caller is about to free.
                    eprintln!("strata: io_uring_enter failed with requests in flight ({e}); aborting to avoid a use-after-free");
                    std::process::abort();
                }
            }
        }
    }

    /// Gives the ring up while none of our requests is in the kernel: dropping it unmaps
    /// its queues and closes it, so the entries still queued are never read.
    fn abandon(&mut self) {
        *self.ring = None;
        self.in_flight = 0;
    }
}

impl Drop for Batch<'_> {
    fn drop(&mut self) {
        // Normally nothing is left; after a panic, wait for the kernel to be done.
        while self.in_flight > 0 {
            if self.wait().is_err() {
                self.abandon();
                break;
            }
            while self.pop().is_some() {}
        }
    }
}

/// Runs `ops` on `ring` (keeping at most its capacity in flight) until each is finished or
/// the ring fails; false (with the ring dropped) in the latter case: the ops without a result
/// are then finished by the caller from where they stopped. Returns with nothing in flight.
fn run_on_ring(ring: &mut Option<IoUring>, fd: RawFd, direct: bool, ops: &mut [Op]) -> bool {
    let Some(r) = ring.as_mut() else { return false };
    debug_assert!(r.completion().is_empty(), "a completion left over from an earlier call");
    let depth = r.submission().capacity();
    let mut batch = Batch { ring, in_flight: 0 };
    let mut next = 0;
    loop {
        while next < ops.len() && batch.in_flight < depth {
            let op = &ops[next];
            if op.result.is_none() {
                // SAFETY: the op's buffer is valid for the whole call (Op's invariant), and the
                // request is reaped before this function returns: the loop ends only with
                // `in_flight == 0` (or after `abandon`, with none of them in the kernel), and
                // on unwinding `Batch::drop` waits for the rest.
                unsafe { batch.push(&op.entry(fd, next as u64)) };
            }
            next += 1;
        }
        if batch.in_flight == 0 {
            return true;
        }
        #[cfg(test)]
        if test_hooks::PANIC_IN_FLIGHT.with(|c| c.replace(false)) {
            // A caller unwinding (a panic, a cancelled task) right after handing its requests
            // to the kernel.
            let _ = batch.ring().submit();
            panic!("injected panic with {} requests in flight", batch.in_flight);
        }
        if batch.wait().is_err() {
            batch.abandon();
            return false;
        }
        while let Some((tag, res)) = batch.pop() {
            let Some(op) = ops.get_mut(tag as usize) else { continue };
            if op.advance(i64::from(res), direct) {
                // SAFETY: as above: the same op, its buffer still borrowed for the call; `pop`
                // made room for it.
                unsafe { batch.push(&op.entry(fd, tag)) };
            }
        }
    }
}

#[cfg(test)]
mod test_hooks {
    use std::cell::Cell;

    thread_local! {
        /// Fail the n-th wait from now in this thread as if `io_uring_enter` had failed
        /// before taking any request (0: off).
        pub static FAIL_ENTER_AT: Cell<u32> = const { Cell::new(0) };
        /// Panic right after the next submission in this thread (once).
        pub static PANIC_IN_FLIGHT: Cell<bool> = const { Cell::new(false) };
    }

    pub fn enter_fails_now() -> bool {
        FAIL_ENTER_AT.with(|c| match c.get() {
            0 => false,
            1 => {
                c.set(0);
                true
            }
            n => {
                c.set(n - 1);
                false
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::AlignedBuf;

    fn uring_or_skip() -> Option<UringBackend> {
        let be = UringBackend::new();
        match be.fallback_reason() {
            None => Some(be),
            Some(why) => {
                eprintln!("io_uring unavailable here ({why}); ring paths not exercised");
                None
            }
        }
    }

    #[test]
    fn thread_without_a_ring_falls_back_to_pread_for_that_call() {
        let Some(be) = uring_or_skip() else { return };
        let dir = tempfile::tempdir().unwrap();
        let f = be.open(&dir.path().join("x"), OpenMode::Direct, true).unwrap();
        std::thread::spawn(move || {
            RING.with(|c| {
                let mut slot = c.borrow_mut();
                slot.ring = None;
                slot.fail_creation = true;
            });
            let mut buf = AlignedBuf::zeroed(8192);
            buf.as_mut()[..4].copy_from_slice(b"abcd");
            f.write_at(&buf, 0).unwrap();
            f.sync().unwrap();
            let mut back = AlignedBuf::zeroed(8192);
            assert_eq!(f.read_at(back.io(), 0).unwrap(), 8192);
            assert_eq!(&back[..4], b"abcd");
            let mut a = AlignedBuf::zeroed(4096);
            let mut b = AlignedBuf::zeroed(4096);
            let mut reqs = [ReadReq::new(a.io(), 0), ReadReq::new(b.io(), 8192)];
            f.read_many(&mut reqs).unwrap();
            assert_eq!(reqs[0].result.as_ref().unwrap(), &4096);
            assert_eq!(reqs[1].result.as_ref().unwrap(), &0, "past the end");
            drop(reqs);
            assert_eq!(&a[..4], b"abcd");
        })
        .join()
        .unwrap();
        let st = be.stats();
        assert_eq!(st.posix_calls, 4, "{st:?}");
        assert_eq!(st.ring_calls, 0, "{st:?}");
    }

    #[test]
    fn ring_failing_mid_call_is_dropped_and_the_call_finishes_with_pread() {
        let Some(be) = uring_or_skip() else { return };
        let dir = tempfile::tempdir().unwrap();
        let f = be.open(&dir.path().join("x"), OpenMode::Direct, true).unwrap();
        let mut data = AlignedBuf::zeroed(3 << 20);
        for (i, b) in data.as_mut().iter_mut().enumerate() {
            *b = (i % 253) as u8;
        }
        let be = Arc::new(be);
        let (be2, f2) = (be.clone(), f.clone());
        std::thread::spawn(move || {
            f2.write_at(&data, 0).unwrap();
            assert_eq!(be2.stats().ring_calls, 1);
            // The read is short (3 of 4 MiB), the rest is resubmitted, and the wait for it
            // fails: the ring is given up with that request never taken by the kernel, and
            // pread finishes it (end of file).
            test_hooks::FAIL_ENTER_AT.with(|c| c.set(2));
            let mut back = AlignedBuf::zeroed(4 << 20);
            assert_eq!(f2.read_at(back.io(), 0).unwrap(), 3 << 20);
            assert_eq!(&back[..3 << 20], &data[..]);
            RING.with(|c| assert!(c.borrow().ring.is_none(), "the failed ring was dropped"));
            assert_eq!(be2.stats(), UringStats { ring_calls: 1, posix_calls: 1 });
            // Failing the first wait: nothing was taken by the kernel, all done by pwrite.
            RING.with(|c| c.borrow_mut().failed_at = None);
            test_hooks::FAIL_ENTER_AT.with(|c| c.set(1));
            f2.write_at(&data[..4096], 1 << 20).unwrap();
            assert_eq!(be2.stats(), UringStats { ring_calls: 1, posix_calls: 2 });
            // A second later (here: at once) the thread gets a new ring.
            RING.with(|c| c.borrow_mut().failed_at = None);
            f2.sync().unwrap();
            assert_eq!(be2.stats(), UringStats { ring_calls: 2, posix_calls: 2 });
        })
        .join()
        .unwrap();
    }

    /// A call that unwinds while its requests are in the kernel (foyer #1286 freed the
    /// buffer of a read still in flight when its future was dropped): the batch's guard waits
    /// for every completion before the unwinding leaves the call, so once `catch_unwind`
    /// returns the kernel never touches the buffers again, and the ring is clean for the
    /// next call.
    #[test]
    fn unwinding_with_requests_in_flight_waits_for_them_all() {
        let Some(be) = uring_or_skip() else { return };
        let dir = tempfile::tempdir().unwrap();
        let f = be.open(&dir.path().join("x"), OpenMode::Direct, true).unwrap();
        const N: usize = 48;
        const LEN: usize = 64 << 10;
        let mut data = AlignedBuf::zeroed(N * LEN);
        for (i, b) in data.as_mut().iter_mut().enumerate() {
            *b = (i % 249) as u8 | 1; // never 0
        }
        f.write_at(&data, 0).unwrap();
        f.sync().unwrap();
        std::thread::spawn(move || {
            for round in 0..5 {
                let mut bufs: Vec<AlignedBuf> = (0..N).map(|_| AlignedBuf::zeroed(LEN)).collect();
                test_hooks::PANIC_IN_FLIGHT.with(|c| c.set(true));
                let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    let mut reqs: Vec<ReadReq<'_>> = bufs.iter_mut().enumerate().map(|(i, b)| ReadReq::new(b.io(), (i * LEN) as u64)).collect();
                    let _ = f.read_many(&mut reqs);
                }));
                assert!(unwound.is_err(), "round {round}: the injected panic did not fire");
                // Nothing may write into the buffers from now on: overwrite them with zeros
                // and look again after a while.
                for b in &mut bufs {
                    b.as_mut().fill(0);
                }
                std::thread::sleep(std::time::Duration::from_millis(5));
                assert!(bufs.iter().all(|b| b.iter().all(|&x| x == 0)), "round {round}: the kernel wrote a buffer after the call returned");
                RING.with(|c| {
                    let mut slot = c.borrow_mut();
                    let ring = slot.ring.as_mut().expect("the ring survives an unwinding call");
                    assert!(ring.completion().is_empty(), "round {round}: a completion was left behind");
                });
                // The next call on the same ring works and reads the right bytes.
                let mut back = AlignedBuf::zeroed(LEN);
                assert_eq!(f.read_at(back.io(), 3 * LEN as u64).unwrap(), LEN);
                assert_eq!(&back[..], &data[3 * LEN..4 * LEN]);
            }
        })
        .join()
        .unwrap();
    }

    #[test]
    fn forked_ring_is_not_reused() {
        let Some(_be) = uring_or_skip() else { return };
        RING.with(|c| {
            let mut slot = c.borrow_mut();
            assert!(slot.ensure());
            // Pretend the ring was created by another process.
            slot.pid = slot.pid.wrapping_add(1);
            assert!(slot.ensure());
            assert_eq!(slot.pid, std::process::id(), "a fresh ring for this process");
        });
    }

    #[test]
    fn long_requests_are_split_and_short_reads_resumed() {
        let Some(be) = uring_or_skip() else { return };
        let dir = tempfile::tempdir().unwrap();
        let f = be.open(&dir.path().join("x"), OpenMode::Direct, true).unwrap();
        let mut data = AlignedBuf::zeroed(3 << 20);
        for (i, b) in data.as_mut().iter_mut().enumerate() {
            *b = (i * 31 % 251) as u8;
        }
        f.write_at(&data, 0).unwrap();
        // A read of more than the file: one short read (or several), then end of file.
        let mut back = AlignedBuf::zeroed(4 << 20);
        assert_eq!(f.read_at(back.io(), 0).unwrap(), 3 << 20);
        assert_eq!(&back[..3 << 20], &data[..]);
        // A zero-length read and write do nothing.
        assert_eq!(f.read_at(IoBufMut::from_slice(&mut []), 0).unwrap(), 0);
        f.write_at(&[], 0).unwrap();
        assert_eq!(be.stats().posix_calls, 0);
    }

    #[test]
    fn advance_handles_interruptions_eof_and_errors() {
        let mut buf = [0u8; 100];
        let mut op = Op::new(Kind::Read, buf.as_mut_ptr(), 100, 0);
        assert!(op.advance(-i64::from(libc::EINTR), true));
        assert!(op.advance(-i64::from(libc::EAGAIN), true));
        assert!(op.advance(40, true), "short read: resubmit the rest");
        assert_eq!(op.chunk(), 60);
        assert!(!op.advance(0, true));
        assert_eq!(op.result.take().unwrap().unwrap(), 40, "EOF after 40 bytes");

        let mut op = Op::new(Kind::Read, buf.as_mut_ptr(), 100, 0);
        assert!(op.advance(12, true));
        assert!(!op.advance(-i64::from(libc::EINVAL), true));
        assert_eq!(op.into_result().unwrap(), 12, "unaligned end of file under O_DIRECT");

        let mut op = Op::new(Kind::Read, buf.as_mut_ptr(), 100, 0);
        assert!(!op.advance(-i64::from(libc::EIO), true));
        assert_eq!(op.into_result().unwrap_err().raw_os_error(), Some(libc::EIO));

        let mut op = Op::new(Kind::Write, buf.as_mut_ptr(), 100, 0);
        assert!(op.advance(30, false), "short write: resubmit the rest");
        assert!(!op.advance(70, false));
        assert_eq!(op.into_result().unwrap(), 100);

        let mut op = Op::new(Kind::Write, buf.as_mut_ptr(), 100, 0);
        assert!(!op.advance(0, false));
        assert_eq!(op.into_result().unwrap_err().kind(), io::ErrorKind::WriteZero);
    }
}
