//! An in-memory filesystem implementing [`StorageBackend`] that can produce *crash images*:
//! what a power failure at a given moment could leave on disk. Used by crash-consistency
//! tests: run a workload on a [`SimBackend`], take crash images (by hand with
//! [`SimBackend::crash_image`] or automatically at sync points with
//! [`SimBackend::capture_at_syncs`]), reopen each image as a database and compare it with a
//! model.
//!
//! # Model
//!
//! Files are inodes reached through paths. Every file has
//!
//! * `current`: the bytes reads see;
//! * `durable`: the bytes that survive a crash;
//! * `pending`: the operations since the file's last `sync`, in order: writes
//!   (`offset`, `data`) and truncations ([`StorageFile::set_len`], which changes `current`
//!   at once and is recorded as a pending truncate op).
//!
//! Operations:
//!
//! * [`StorageFile::write_at`] changes `current` (extending it with zeros if needed) and
//!   appends a pending write; [`StorageFile::set_len`] resizes `current` and appends a
//!   pending truncate.
//! * [`StorageFile::sync`] makes `durable = current` and clears `pending`.
//! * [`StorageBackend::write_atomic`] models write-tmp + fsync + rename + fsync dir: the path
//!   gets a new file with `current = durable = bytes` and nothing pending. Handles opened on
//!   the old file keep seeing the old file (like an unlinked inode on POSIX).
//! * Simplification: namespace operations are durable at once. `open(create = true)` of a
//!   missing file creates an empty file that exists in every later crash image;
//!   [`StorageBackend::remove`] unlinks durably at once (a missing file is fine; open handles
//!   keep working on the unlinked file, which no crash image contains);
//!   [`StorageBackend::create_dir_all`] creates directories durably at once;
//!   [`StorageBackend::sync_dir`] is a no-op (but counts as a sync point).
//! * [`StorageBackend::lock_dir`] takes no lock (nothing outside this process can reach the
//!   files).
//! * Like a real filesystem, creating a file (by `open` or `write_atomic`) needs its parent
//!   directory to exist (a path with an empty parent, such as `x`, is at the root, which
//!   always exists); otherwise the error is [`io::ErrorKind::NotFound`]. `open(create =
//!   false)` and `read_file` of a missing file fail with `NotFound`; `list_dir` of a missing
//!   directory fails with `NotFound`. Paths are compared as given (no normalisation).
//! * [`StorageFile::read_at`] copies from `current`; it returns the number of bytes that exist
//!   (0 at or past the end). A frame buffer takes only whole 8-byte words, so when the
//!   buffer's length is a multiple of 8, a read that ends in the middle of a word zero-fills the
//!   rest of that word in the buffer (the returned count is still the true count). [`StorageFile::is_direct`] is false.
//!
//! # Crash images
//!
//! [`SimBackend::crash_image`] returns a new, independent backend whose files are every linked
//! file's `durable` bytes with its `pending` ops replayed according to a [`CrashMode`]:
//! none ([`CrashMode::DropUnsynced`]), all ([`CrashMode::KeepUnsynced`]), or a random subset
//! ([`CrashMode::Torn`]): each op is applied with probability 1/2, in order; an applied write
//! is, with probability 1/2, torn into pieces at `sector`-aligned absolute file offsets, each
//! applied independently with probability 1/2 (so every sector of a write is wholly old or
//! wholly new). The randomness is a small deterministic PRNG (splitmix64) seeded by the
//! caller, so images are reproducible. In an image every file is durable and nothing is
//! pending; directories and the label are copied; sync points and captures start afresh.
//!
//! # Capturing at sync points
//!
//! Calls to [`StorageFile::sync`], [`StorageBackend::write_atomic`] and
//! [`StorageBackend::sync_dir`] are *sync points*, numbered from 1 ([`SimBackend::sync_points`]
//! counts them). After [`SimBackend::capture_at_syncs`]`(every, seed, modes)`, every
//! `every`-th sync point takes one crash image per mode just before the operation and one just
//! after it, each stored as a [`Capture`] with the user label ([`SimBackend::set_label`]) at
//! that moment. The images are built from the state while the backend's lock is held (no
//! re-entrant locking). Every capture copies every file, so memory grows with
//! `captures * total_bytes`: drain them regularly with [`SimBackend::take_captures`].

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::util::SplitMix64;
use parking_lot::Mutex;

use super::backend::{IoBufMut, OpenMode, StorageBackend, StorageFile};

/// How the unsynced operations of each file are treated in a crash image.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CrashMode {
    /// Nothing written since a file's last sync reached the disk.
    DropUnsynced,
    /// Everything written reached the disk.
    KeepUnsynced,
    /// Each unsynced op reached the disk with probability 1/2; a write may be torn into
    /// `sector`-aligned pieces (512 or 4096), each of which reached the disk with probability
    /// 1/2.
    Torn {
        /// The atomic unit of a write, in bytes (must be non-zero).
        sector: usize,
    },
}

/// One crash image taken at a sync point by [`SimBackend::capture_at_syncs`].
#[derive(Debug)]
pub struct Capture {
    /// The label ([`SimBackend::set_label`]) when the image was taken.
    pub label: u64,
    /// The number of the sync point (1-based, see [`SimBackend::sync_points`]).
    pub sync_point: u64,
    /// The crash image.
    pub image: SimBackend,
    /// How unsynced operations were treated.
    pub mode: CrashMode,
    /// Whether the image was taken just after the sync point completed (else just before).
    pub after: bool,
}

/// An operation since a file's last sync.
#[derive(Clone, Debug)]
enum PendingOp {
    Write { offset: u64, data: Vec<u8> },
    Truncate { len: u64 },
}

#[derive(Debug, Default)]
struct SimFile {
    current: Vec<u8>,
    durable: Vec<u8>,
    pending: Vec<PendingOp>,
    /// Whether a path names this file.
    linked: bool,
    /// Open handles.
    handles: usize,
}

impl SimFile {
    fn durable_only(bytes: Vec<u8>) -> SimFile {
        SimFile { current: bytes.clone(), durable: bytes, pending: Vec::new(), linked: true, handles: 0 }
    }

    /// The bytes a crash would leave: `durable` with `pending` replayed per `mode`.
    fn crash_contents(&self, mode: CrashMode, rng: &mut SplitMix64) -> Vec<u8> {
        let mut out = self.durable.clone();
        for op in &self.pending {
            match (mode, op) {
                (CrashMode::DropUnsynced, _) => {}
                (CrashMode::KeepUnsynced, op) => apply_op(&mut out, op),
                (CrashMode::Torn { .. }, PendingOp::Truncate { .. }) => {
                    if rng.coin() {
                        apply_op(&mut out, op);
                    }
                }
                (CrashMode::Torn { sector }, PendingOp::Write { offset, data }) => {
                    assert!(sector > 0, "CrashMode::Torn needs a non-zero sector size");
                    if !rng.coin() {
                        continue;
                    }
                    if rng.coin() {
                        apply_op(&mut out, op);
                        continue;
                    }
                    // Torn: pieces split at sector-aligned absolute offsets.
                    let sector = sector as u64;
                    let end = offset + data.len() as u64;
                    let mut start = *offset;
                    while start < end {
                        let piece_end = ((start / sector + 1) * sector).min(end);
                        if rng.coin() {
                            let from = (start - offset) as usize;
                            let to = (piece_end - offset) as usize;
                            write_into(&mut out, start, &data[from..to]);
                        }
                        start = piece_end;
                    }
                }
            }
        }
        out
    }
}

fn write_into(buf: &mut Vec<u8>, offset: u64, data: &[u8]) {
    let start = offset as usize;
    let end = start + data.len();
    if buf.len() < end {
        buf.resize(end, 0);
    }
    buf[start..end].copy_from_slice(data);
}

fn apply_op(buf: &mut Vec<u8>, op: &PendingOp) {
    match op {
        PendingOp::Write { offset, data } => write_into(buf, *offset, data),
        PendingOp::Truncate { len } => buf.resize(*len as usize, 0),
    }
}

#[derive(Debug)]
struct Arm {
    every: u64,
    seed: u64,
    modes: Vec<CrashMode>,
}

#[derive(Default)]
struct State {
    /// Linked paths to inode numbers.
    paths: BTreeMap<PathBuf, u64>,
    /// Inodes: linked files and unlinked ones that still have open handles.
    inodes: HashMap<u64, SimFile>,
    next_inode: u64,
    dirs: BTreeSet<PathBuf>,
    label: u64,
    sync_points: u64,
    arm: Option<Arm>,
    captures: Vec<Capture>,
}

fn not_found(what: &str, path: &Path) -> io::Error {
    io::Error::new(io::ErrorKind::NotFound, format!("{what} {}: not found (sim)", path.display()))
}

/// Whether `path`'s parent is the root (empty) or a known directory.
fn parent_exists(dirs: &BTreeSet<PathBuf>, path: &Path) -> bool {
    match path.parent() {
        None => true,
        Some(p) if p.as_os_str().is_empty() => true,
        Some(p) => dirs.contains(p),
    }
}

impl State {
    fn new_inode(&mut self, file: SimFile) -> u64 {
        let id = self.next_inode;
        self.next_inode += 1;
        self.inodes.insert(id, file);
        id
    }

    /// Drops the link from `path` (if any), freeing the inode if no handle holds it.
    fn unlink(&mut self, path: &Path) {
        if let Some(id) = self.paths.remove(path) {
            let f = self.inodes.get_mut(&id).expect("linked inode exists");
            f.linked = false;
            if f.handles == 0 {
                self.inodes.remove(&id);
            }
        }
    }

    fn image(&self, seed: u64, mode: CrashMode) -> State {
        let mut rng = SplitMix64(seed);
        let mut image = State { dirs: self.dirs.clone(), label: self.label, ..State::default() };
        // BTreeMap order makes the random choices per file reproducible.
        for (path, id) in &self.paths {
            let bytes = self.inodes[id].crash_contents(mode, &mut rng);
            let new_id = image.new_inode(SimFile::durable_only(bytes));
            image.paths.insert(path.clone(), new_id);
        }
        image
    }

    /// Counts a sync point and takes the "before" images if this one is armed; returns whether
    /// to take the "after" images too (call [`State::capture`] with `after = true`).
    fn begin_sync_point(&mut self) -> bool {
        self.sync_points += 1;
        let armed = self.arm.as_ref().is_some_and(|a| self.sync_points.is_multiple_of(a.every));
        if armed {
            self.capture(false);
        }
        armed
    }

    fn capture(&mut self, after: bool) {
        let Some(arm) = &self.arm else { return };
        let mut new = Vec::with_capacity(arm.modes.len());
        for (i, &mode) in arm.modes.iter().enumerate() {
            let seed = SplitMix64(arm.seed ^ self.sync_points.wrapping_mul(0x2545_F491_4F6C_DD1D) ^ ((i as u64) << 1) ^ u64::from(after)).next_u64();
            let image = SimBackend::from_state(self.image(seed, mode));
            new.push(Capture { label: self.label, sync_point: self.sync_points, image, mode, after });
        }
        self.captures.extend(new);
    }
}

/// An in-memory filesystem with crash images (see the module documentation).
///
/// Cloning is cheap and gives another handle to the same filesystem.
#[derive(Clone, Default)]
pub struct SimBackend {
    state: Arc<Mutex<State>>,
}

impl fmt::Debug for SimBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.state.lock();
        let bytes: usize = s.paths.values().map(|id| s.inodes[id].current.len()).sum();
        f.debug_struct("SimBackend")
            .field("files", &s.paths.len())
            .field("dirs", &s.dirs.len())
            .field("bytes", &bytes)
            .field("sync_points", &s.sync_points)
            .field("label", &s.label)
            .field("captures", &s.captures.len())
            .finish()
    }
}

impl SimBackend {
    /// An empty filesystem.
    pub fn new() -> SimBackend {
        SimBackend::default()
    }

    fn from_state(state: State) -> SimBackend {
        SimBackend { state: Arc::new(Mutex::new(state)) }
    }

    /// A new, independent backend holding what a crash now could leave on disk: every file's
    /// durable bytes with its unsynced ops replayed per `mode` (random choices from
    /// `rng_seed`, so the same seed and state give the same image).
    pub fn crash_image(&self, rng_seed: u64, mode: CrashMode) -> SimBackend {
        SimBackend::from_state(self.state.lock().image(rng_seed, mode))
    }

    /// Arms capturing: on every `every`-th sync point (counted from 1 over the whole life of
    /// the backend), one image per mode is taken just before and one just after the sync.
    /// Replaces an earlier arming. `every` must be non-zero.
    pub fn capture_at_syncs(&self, every: u64, seed: u64, modes: Vec<CrashMode>) {
        assert!(every > 0, "capture_at_syncs: every must be non-zero");
        self.state.lock().arm = Some(Arm { every, seed, modes });
    }

    /// Stops capturing (captures taken so far stay until drained).
    pub fn stop_capturing(&self) {
        self.state.lock().arm = None;
    }

    /// Sets the user label stored with later captures (e.g. the number of committed
    /// transactions).
    pub fn set_label(&self, v: u64) {
        self.state.lock().label = v;
    }

    /// The current user label.
    pub fn label(&self) -> u64 {
        self.state.lock().label
    }

    /// Drains the captures taken so far, oldest first.
    pub fn take_captures(&self) -> Vec<Capture> {
        std::mem::take(&mut self.state.lock().captures)
    }

    /// The number of sync points so far (`sync`, `write_atomic`, `sync_dir` calls).
    pub fn sync_points(&self) -> u64 {
        self.state.lock().sync_points
    }

    /// The sum of the current sizes of all linked files.
    pub fn total_bytes(&self) -> u64 {
        let s = self.state.lock();
        s.paths.values().map(|id| s.inodes[id].current.len() as u64).sum()
    }
}

/// An open file of a [`SimBackend`].
struct SimHandle {
    state: Arc<Mutex<State>>,
    inode: u64,
    path: PathBuf,
}

impl fmt::Debug for SimHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimFile").field("path", &self.path).field("inode", &self.inode).finish()
    }
}

impl SimHandle {
    fn with<R>(&self, f: impl FnOnce(&mut SimFile) -> R) -> R {
        let mut s = self.state.lock();
        f(s.inodes.get_mut(&self.inode).expect("an open file's inode exists"))
    }
}

impl Drop for SimHandle {
    fn drop(&mut self) {
        let mut s = self.state.lock();
        let f = s.inodes.get_mut(&self.inode).expect("an open file's inode exists");
        f.handles -= 1;
        if f.handles == 0 && !f.linked {
            s.inodes.remove(&self.inode);
        }
    }
}

impl StorageFile for SimHandle {
    fn read_at(&self, mut dst: IoBufMut<'_>, offset: u64) -> io::Result<usize> {
        self.with(|f| {
            let len = f.current.len() as u64;
            if offset >= len || dst.is_empty() {
                return Ok(0);
            }
            let start = offset as usize;
            let n = dst.len().min(f.current.len() - start);
            let src = &f.current[start..start + n];
            // Frames (whose length is a multiple of 8) take whole words: pad to a multiple of 8
            // within the buffer. A buffer of another length is no frame and gets exactly `n`.
            let padded = if dst.len().is_multiple_of(8) { n.next_multiple_of(8) } else { n };
            if padded == n {
                dst.copy_from(0, src);
            } else {
                let mut tmp = vec![0u8; padded];
                tmp[..n].copy_from_slice(src);
                dst.copy_from(0, &tmp);
            }
            Ok(n)
        })
    }

    fn write_at(&self, src: &[u8], offset: u64) -> io::Result<()> {
        let end = offset.checked_add(src.len() as u64).filter(|&e| e <= isize::MAX as u64);
        if end.is_none() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "write past the largest file size (sim)"));
        }
        self.with(|f| {
            write_into(&mut f.current, offset, src);
            f.pending.push(PendingOp::Write { offset, data: src.to_vec() });
        });
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        let mut s = self.state.lock();
        let after = s.begin_sync_point();
        let f = s.inodes.get_mut(&self.inode).expect("an open file's inode exists");
        f.durable.clone_from(&f.current);
        f.pending.clear();
        if after {
            s.capture(true);
        }
        Ok(())
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self.with(|f| f.current.len() as u64))
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        if len > isize::MAX as u64 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "length past the largest file size (sim)"));
        }
        self.with(|f| {
            f.current.resize(len as usize, 0);
            f.pending.push(PendingOp::Truncate { len });
        });
        Ok(())
    }

    fn is_direct(&self) -> bool {
        false
    }

    fn path(&self) -> &Path {
        &self.path
    }
}

impl StorageBackend for SimBackend {
    fn free_space(&self, _path: &Path) -> Option<u64> {
        // A simulated file system of unlimited size.
        None
    }
    fn open(&self, path: &Path, _mode: OpenMode, create: bool) -> io::Result<Arc<dyn StorageFile>> {
        let mut s = self.state.lock();
        if s.dirs.contains(path) {
            return Err(io::Error::other(format!("open {}: is a directory (sim)", path.display())));
        }
        let inode = match s.paths.get(path) {
            Some(&id) => id,
            None if !create => return Err(not_found("open", path)),
            None if !parent_exists(&s.dirs, path) => return Err(not_found("create (no parent directory)", path)),
            None => {
                let id = s.new_inode(SimFile { linked: true, ..SimFile::default() });
                s.paths.insert(path.to_owned(), id);
                id
            }
        };
        s.inodes.get_mut(&inode).expect("linked inode exists").handles += 1;
        Ok(Arc::new(SimHandle { state: self.state.clone(), inode, path: path.to_owned() }))
    }

    fn read_file(&self, path: &Path) -> io::Result<Vec<u8>> {
        let s = self.state.lock();
        match s.paths.get(path) {
            Some(id) => Ok(s.inodes[id].current.clone()),
            None => Err(not_found("read", path)),
        }
    }

    fn write_atomic(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        let mut s = self.state.lock();
        if s.dirs.contains(path) {
            return Err(io::Error::other(format!("write {}: is a directory (sim)", path.display())));
        }
        if !parent_exists(&s.dirs, path) {
            return Err(not_found("write (no parent directory)", path));
        }
        let after = s.begin_sync_point();
        s.unlink(path);
        let id = s.new_inode(SimFile::durable_only(bytes.to_vec()));
        s.paths.insert(path.to_owned(), id);
        if after {
            s.capture(true);
        }
        Ok(())
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        let mut s = self.state.lock();
        if s.dirs.contains(path) {
            return Err(io::Error::other(format!("remove {}: is a directory (sim)", path.display())));
        }
        s.unlink(path);
        Ok(())
    }

    fn exists(&self, path: &Path) -> bool {
        let s = self.state.lock();
        s.paths.contains_key(path) || s.dirs.contains(path)
    }

    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        let mut s = self.state.lock();
        let new: Vec<PathBuf> = path.ancestors().filter(|p| !p.as_os_str().is_empty()).map(Path::to_path_buf).collect();
        if let Some(file) = new.iter().find(|p| s.paths.contains_key(p.as_path())) {
            return Err(io::Error::new(io::ErrorKind::AlreadyExists, format!("create directory {}: a file is in the way (sim)", file.display())));
        }
        s.dirs.extend(new);
        Ok(())
    }

    fn list_dir(&self, path: &Path) -> io::Result<Vec<String>> {
        let s = self.state.lock();
        if !s.dirs.contains(path) {
            return Err(not_found("list", path));
        }
        let in_dir = |p: &&PathBuf| p.parent() == Some(path);
        let mut names: Vec<String> =
            s.paths.keys().chain(s.dirs.iter()).filter(in_dir).filter_map(|p| p.file_name()).map(|n| n.to_string_lossy().into_owned()).collect();
        names.sort();
        Ok(names)
    }

    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        let mut s = self.state.lock();
        if !s.dirs.contains(path) {
            return Err(not_found("sync directory", path));
        }
        if s.begin_sync_point() {
            s.capture(true);
        }
        Ok(())
    }

    /// No lock: the simulated files live in this process's memory, where no other process
    /// can open them.
    fn lock_dir(&self, _dir: &Path) -> crate::Result<Option<super::DirLock>> {
        Ok(None)
    }
    fn lock_dir_shared(&self, _dir: &Path) -> crate::Result<Option<super::DirLock>> {
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::backend::AlignedBuf;

    fn read_all(f: &dyn StorageFile) -> Vec<u8> {
        let len = f.len().unwrap() as usize;
        let mut out = vec![0u8; len];
        assert_eq!(f.read_at(IoBufMut::from_slice(&mut out), 0).unwrap(), len);
        out
    }

    fn file_in(be: &SimBackend, path: &str) -> Vec<u8> {
        be.read_file(Path::new(path)).unwrap()
    }

    #[test]
    fn write_sync_read_round_trip() {
        let be = SimBackend::new();
        be.create_dir_all(Path::new("/db")).unwrap();
        let f = be.open(Path::new("/db/a"), OpenMode::Direct, true).unwrap();
        assert!(!f.is_direct());
        assert_eq!(f.path(), Path::new("/db/a"));
        let mut page = AlignedBuf::zeroed(4096);
        page.as_mut()[..5].copy_from_slice(b"hello");
        f.write_at(&page, 4096).unwrap();
        f.sync().unwrap();
        assert_eq!(f.len().unwrap(), 8192);
        let mut back = AlignedBuf::zeroed(8192);
        assert_eq!(f.read_at(back.io(), 4096).unwrap(), 4096, "short read at EOF");
        assert_eq!(&back[..5], b"hello");
        // The hole before the write reads as zeros.
        assert_eq!(f.read_at(back.io(), 0).unwrap(), 8192);
        assert!(back[..4096].iter().all(|&b| b == 0));
        // Reopening sees the same file; read_file sees current contents.
        let g = be.open(Path::new("/db/a"), OpenMode::Buffered, false).unwrap();
        assert_eq!(read_all(g.as_ref()), read_all(f.as_ref()));
        assert_eq!(be.read_file(Path::new("/db/a")).unwrap(), read_all(f.as_ref()));
        assert_eq!(be.total_bytes(), 8192);
        // An unaligned read into a plain slice gets exactly the bytes that exist.
        let mut odd = vec![7u8; 10];
        assert_eq!(f.read_at(IoBufMut::from_slice(&mut odd), 8190).unwrap(), 2);
        assert_eq!(odd, [0, 0, 7, 7, 7, 7, 7, 7, 7, 7]);
    }

    #[test]
    fn unsynced_write_dropped_or_kept() {
        let be = SimBackend::new();
        let f = be.open(Path::new("a"), OpenMode::Direct, true).unwrap();
        f.write_at(b"old!", 0).unwrap();
        f.sync().unwrap();
        f.write_at(b"NEW", 0).unwrap();
        f.write_at(b"tail", 8).unwrap();
        assert_eq!(file_in(&be, "a"), b"NEW!\0\0\0\0tail");
        let dropped = be.crash_image(1, CrashMode::DropUnsynced);
        assert_eq!(file_in(&dropped, "a"), b"old!");
        let kept = be.crash_image(1, CrashMode::KeepUnsynced);
        assert_eq!(file_in(&kept, "a"), b"NEW!\0\0\0\0tail");
        // A file created but never synced exists, empty, in every image.
        let b = be.open(Path::new("b"), OpenMode::Direct, true).unwrap();
        b.write_at(b"x", 0).unwrap();
        assert_eq!(file_in(&be.crash_image(2, CrashMode::DropUnsynced), "b"), b"");
        assert_eq!(file_in(&be.crash_image(2, CrashMode::KeepUnsynced), "b"), b"x");
    }

    #[test]
    fn truncate_is_pending_until_sync() {
        let be = SimBackend::new();
        let f = be.open(Path::new("a"), OpenMode::Direct, true).unwrap();
        f.write_at(&[1u8; 100], 0).unwrap();
        f.sync().unwrap();
        f.set_len(10).unwrap();
        f.write_at(&[2u8; 5], 20).unwrap();
        assert_eq!(f.len().unwrap(), 25);
        assert_eq!(file_in(&be.crash_image(0, CrashMode::DropUnsynced,), "a"), vec![1u8; 100]);
        let mut want = vec![1u8; 10];
        want.resize(20, 0);
        want.extend([2u8; 5]);
        assert_eq!(file_in(&be.crash_image(0, CrashMode::KeepUnsynced), "a"), want);
        // Torn: the truncate and the write each apply or not, in order.
        let mut seen = BTreeSet::new();
        for seed in 0..200 {
            let got = file_in(&be.crash_image(seed, CrashMode::Torn { sector: 512 }), "a");
            let mut cut = vec![1u8; 10];
            cut.resize(20, 0);
            cut.extend([2u8; 5]);
            let mut uncut = vec![1u8; 100];
            uncut[20..25].copy_from_slice(&[2u8; 5]);
            let options = [vec![1u8; 100], vec![1u8; 10], uncut, cut];
            let which = options.iter().position(|o| *o == got).unwrap_or_else(|| panic!("unexpected image {got:?}"));
            seen.insert(which);
        }
        assert_eq!(seen.len(), 4, "every combination of the two ops shows up");
        f.sync().unwrap();
        assert_eq!(file_in(&be.crash_image(0, CrashMode::DropUnsynced), "a"), want);
    }

    #[test]
    fn torn_writes_tear_only_at_sector_boundaries() {
        let be = SimBackend::new();
        let f = be.open(Path::new("a"), OpenMode::Direct, true).unwrap();
        f.write_at(&[0xAA; 8192], 0).unwrap();
        f.sync().unwrap();
        f.write_at(&[0xBB; 4096], 0).unwrap();
        // An unaligned write: tears at absolute 512-byte boundaries (1024, 1536).
        f.write_at(&[0xCC; 1000], 4096 + 700).unwrap();
        let (mut partial, mut whole_new, mut whole_old, mut partial_unaligned) = (0, 0, 0, 0);
        for seed in 0..500 {
            let img = file_in(&be.crash_image(seed, CrashMode::Torn { sector: 512 }), "a");
            assert_eq!(img.len(), 8192);
            let sectors: Vec<bool> = img[..4096]
                .chunks(512)
                .map(|s| {
                    let new = s.iter().all(|&b| b == 0xBB);
                    assert!(new || s.iter().all(|&b| b == 0xAA), "sector mixes old and new bytes (seed {seed})");
                    new
                })
                .collect();
            match sectors.iter().filter(|&&n| n).count() {
                0 => whole_old += 1,
                8 => whole_new += 1,
                _ => partial += 1,
            }
            // Second page: bytes outside the write are old; inside, each absolute 512-byte
            // sector's part of the write is wholly old or wholly new.
            let page = &img[4096..];
            assert!(page[..700].iter().chain(&page[1700..]).all(|&b| b == 0xAA));
            let pieces = [700..1024, 1024..1536, 1536..1700];
            let new: Vec<bool> = pieces
                .iter()
                .map(|r| {
                    let p = &page[r.clone()];
                    let new = p.iter().all(|&b| b == 0xCC);
                    assert!(new || p.iter().all(|&b| b == 0xAA), "piece {r:?} torn inside a sector (seed {seed})");
                    new
                })
                .collect();
            if new.iter().any(|&n| n) && !new.iter().all(|&n| n) {
                partial_unaligned += 1;
            }
        }
        assert!(partial > 0, "some image has a partially applied write");
        assert!(whole_new > 0 && whole_old > 0, "whole writes both survive and vanish");
        assert!(partial_unaligned > 0);
        // Reproducible.
        let a = be.crash_image(42, CrashMode::Torn { sector: 512 });
        let b = be.crash_image(42, CrashMode::Torn { sector: 512 });
        assert_eq!(file_in(&a, "a"), file_in(&b, "a"));
    }

    #[test]
    fn torn_4096_keeps_aligned_pages_whole() {
        let be = SimBackend::new();
        let f = be.open(Path::new("a"), OpenMode::Direct, true).unwrap();
        f.write_at(&[1; 16384], 0).unwrap();
        f.sync().unwrap();
        f.write_at(&[2; 16384], 0).unwrap();
        let mut partial = false;
        for seed in 0..100 {
            let img = file_in(&be.crash_image(seed, CrashMode::Torn { sector: 4096 }), "a");
            let pages: Vec<u8> = img
                .chunks(4096)
                .map(|p| {
                    if p.iter().all(|&b| b == 2) {
                        2
                    } else if p.iter().all(|&b| b == 1) {
                        1
                    } else {
                        0
                    }
                })
                .collect();
            assert!(!pages.contains(&0), "page torn inside (seed {seed})");
            partial |= pages.contains(&1) && pages.contains(&2);
        }
        assert!(partial);
    }

    #[test]
    fn write_atomic_survives_every_crash_image() {
        let be = SimBackend::new();
        be.create_dir_all(Path::new("d")).unwrap();
        let p = Path::new("d/meta");
        be.write_atomic(p, b"one").unwrap();
        be.write_atomic(p, b"two!").unwrap();
        assert_eq!(be.read_file(p).unwrap(), b"two!");
        // Unsynced writes elsewhere do not matter.
        let f = be.open(Path::new("d/data"), OpenMode::Direct, true).unwrap();
        f.write_at(&[9; 4096], 0).unwrap();
        let modes = [CrashMode::DropUnsynced, CrashMode::KeepUnsynced, CrashMode::Torn { sector: 512 }, CrashMode::Torn { sector: 4096 }];
        for seed in 0..50 {
            for mode in modes {
                assert_eq!(be.crash_image(seed, mode).read_file(p).unwrap(), b"two!", "{mode:?} seed {seed}");
            }
        }
        assert_eq!(be.sync_points(), 2);
        // A parentless path fails like on a real filesystem.
        assert_eq!(be.write_atomic(Path::new("nodir/meta"), b"x").unwrap_err().kind(), io::ErrorKind::NotFound);
        assert_eq!(be.open(Path::new("nodir/x"), OpenMode::Direct, true).unwrap_err().kind(), io::ErrorKind::NotFound);
    }

    #[test]
    fn write_atomic_over_an_open_file_leaves_the_old_handle_on_the_old_file() {
        let be = SimBackend::new();
        let f = be.open(Path::new("a"), OpenMode::Buffered, true).unwrap();
        f.write_at(b"old", 0).unwrap();
        be.write_atomic(Path::new("a"), b"new").unwrap();
        assert_eq!(read_all(f.as_ref()), b"old");
        f.write_at(b"OLD", 0).unwrap();
        f.sync().unwrap();
        assert_eq!(be.read_file(Path::new("a")).unwrap(), b"new");
        drop(f);
        assert_eq!(be.state.lock().inodes.len(), 1, "the unlinked file is freed with its last handle");
    }

    #[test]
    fn remove_list_dir_exists() {
        let be = SimBackend::new();
        assert!(!be.exists(Path::new("/db")));
        assert_eq!(be.list_dir(Path::new("/db")).unwrap_err().kind(), io::ErrorKind::NotFound);
        be.create_dir_all(Path::new("/db/tmp")).unwrap();
        assert!(be.exists(Path::new("/db")) && be.exists(Path::new("/db/tmp")) && be.exists(Path::new("/")));
        assert!(be.list_dir(Path::new("/db/tmp")).unwrap().is_empty());
        for name in ["b", "a", "c"] {
            be.open(&Path::new("/db").join(name), OpenMode::Direct, true).unwrap();
        }
        be.open(Path::new("/db/tmp/t0"), OpenMode::Direct, true).unwrap();
        assert_eq!(be.list_dir(Path::new("/db")).unwrap(), ["a", "b", "c", "tmp"]);
        assert_eq!(be.list_dir(Path::new("/db/tmp")).unwrap(), ["t0"]);
        assert_eq!(be.list_dir(Path::new("/")).unwrap(), ["db"]);
        assert!(be.exists(Path::new("/db/b")));
        be.remove(Path::new("/db/b")).unwrap();
        be.remove(Path::new("/db/b")).unwrap(); // missing is fine
        assert!(!be.exists(Path::new("/db/b")));
        assert_eq!(be.list_dir(Path::new("/db")).unwrap(), ["a", "c", "tmp"]);
        assert_eq!(be.open(Path::new("/db/b"), OpenMode::Direct, false).unwrap_err().kind(), io::ErrorKind::NotFound);
        assert_eq!(be.read_file(Path::new("/db/b")).unwrap_err().kind(), io::ErrorKind::NotFound);
        assert!(be.remove(Path::new("/db/tmp")).is_err(), "remove does not remove directories");
        // Removal and creation are durable at once.
        let img = be.crash_image(0, CrashMode::DropUnsynced);
        assert_eq!(img.list_dir(Path::new("/db")).unwrap(), ["a", "c", "tmp"]);
        assert_eq!(img.list_dir(Path::new("/db/tmp")).unwrap(), ["t0"]);
        be.sync_dir(Path::new("/db")).unwrap();
        assert_eq!(be.sync_points(), 1);
    }

    #[test]
    fn removed_file_stays_usable_through_an_open_handle() {
        let be = SimBackend::new();
        let f = be.open(Path::new("t"), OpenMode::Direct, true).unwrap();
        be.remove(Path::new("t")).unwrap();
        f.write_at(b"12345678", 0).unwrap();
        f.sync().unwrap();
        assert_eq!(read_all(f.as_ref()), b"12345678");
        assert!(!be.exists(Path::new("t")));
        assert!(!be.crash_image(0, CrashMode::KeepUnsynced).exists(Path::new("t")));
        assert_eq!(be.total_bytes(), 0);
    }

    #[test]
    fn captures_before_and_after_sync_points_with_labels() {
        let be = SimBackend::new();
        be.create_dir_all(Path::new("d")).unwrap();
        let f = be.open(Path::new("d/wal"), OpenMode::Direct, true).unwrap();
        be.capture_at_syncs(1, 7, vec![CrashMode::DropUnsynced, CrashMode::KeepUnsynced]);
        be.set_label(1);
        f.write_at(b"rec1", 0).unwrap();
        f.sync().unwrap(); // sync point 1
        be.set_label(2);
        be.write_atomic(Path::new("d/meta"), b"m").unwrap(); // sync point 2
        let caps = be.take_captures();
        assert_eq!(caps.len(), 8);
        assert!(be.take_captures().is_empty(), "drained");
        let key: Vec<(u64, u64, bool, CrashMode)> = caps.iter().map(|c| (c.label, c.sync_point, c.after, c.mode)).collect();
        use CrashMode::*;
        assert_eq!(
            key,
            [
                (1, 1, false, DropUnsynced),
                (1, 1, false, KeepUnsynced),
                (1, 1, true, DropUnsynced),
                (1, 1, true, KeepUnsynced),
                (2, 2, false, DropUnsynced),
                (2, 2, false, KeepUnsynced),
                (2, 2, true, DropUnsynced),
                (2, 2, true, KeepUnsynced),
            ]
        );
        let wal = |c: &Capture| c.image.read_file(Path::new("d/wal")).unwrap();
        assert_eq!(wal(&caps[0]), b"", "before the sync the record is not durable");
        assert_eq!(wal(&caps[1]), b"rec1", "but may have reached the disk");
        assert_eq!(wal(&caps[2]), b"rec1", "after the sync it is durable");
        assert!(!caps[4].image.exists(Path::new("d/meta")));
        assert_eq!(caps[6].image.read_file(Path::new("d/meta")).unwrap(), b"m");
        assert_eq!(caps[6].image.label(), 2);
        assert_eq!(caps[6].image.sync_points(), 0, "images start afresh");
        // every = 2: only even sync points; sync_dir counts.
        be.capture_at_syncs(2, 7, vec![CrashMode::Torn { sector: 512 }]);
        be.sync_dir(Path::new("d")).unwrap(); // 3
        f.sync().unwrap(); // 4
        be.sync_dir(Path::new("d")).unwrap(); // 5
        let caps = be.take_captures();
        assert_eq!(caps.iter().map(|c| (c.sync_point, c.after)).collect::<Vec<_>>(), [(4, false), (4, true)]);
        assert_eq!(be.sync_points(), 5);
        be.stop_capturing();
        f.sync().unwrap();
        assert!(be.take_captures().is_empty());
        // Images of captures are independent backends that work as filesystems.
        let img = &caps[0].image;
        let g = img.open(Path::new("d/wal"), OpenMode::Direct, false).unwrap();
        assert_eq!(read_all(g.as_ref()), b"rec1");
    }

    #[test]
    fn frame_read_at_eof_returns_zero() {
        let be = SimBackend::new();
        let f = be.open(Path::new("a"), OpenMode::Direct, true).unwrap();
        f.write_at(&[5u8; 4096], 0).unwrap();
        let mut buf = AlignedBuf::zeroed(4096);
        assert_eq!(f.read_at(buf.io(), 4096).unwrap(), 0);
        assert_eq!(f.read_at(buf.io(), 1 << 20).unwrap(), 0);
        // A frame-style (shared, 8-byte word) buffer: whole-page reads and a short tail read.
        let mut frame_mem = AlignedBuf::zeroed(8192);
        // SAFETY: `frame_mem` is a live, 4096-byte aligned allocation of 8192 bytes that nothing
        // else touches while the returned view exists (each is consumed by one read_at).
        let frame = |m: &mut AlignedBuf| unsafe { IoBufMut::from_frame(m.as_mut().as_mut_ptr(), 8192) };
        assert_eq!(f.read_at(frame(&mut frame_mem), 4096).unwrap(), 0);
        assert_eq!(f.read_at(frame(&mut frame_mem), 4093).unwrap(), 3, "the true count, though whole words are copied");
        assert_eq!(frame_mem[..16], [5, 5, 5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(f.read_at(frame(&mut frame_mem), 0).unwrap(), 4096);
        assert!(frame_mem[..4096].iter().all(|&b| b == 5) && frame_mem[4096..].iter().all(|&b| b == 0));
    }

    #[test]
    fn crash_image_is_independent() {
        let be = SimBackend::new();
        let f = be.open(Path::new("a"), OpenMode::Direct, true).unwrap();
        f.write_at(b"base", 0).unwrap();
        f.sync().unwrap();
        let img = be.crash_image(3, CrashMode::KeepUnsynced);
        let g = img.open(Path::new("a"), OpenMode::Direct, false).unwrap();
        g.write_at(b"IMG!", 0).unwrap();
        g.sync().unwrap();
        img.write_atomic(Path::new("b"), b"only in image").unwrap();
        img.set_label(9);
        assert_eq!(file_in(&be, "a"), b"base");
        assert!(!be.exists(Path::new("b")));
        assert_eq!(be.label(), 0);
        assert_eq!(be.sync_points(), 1);
        f.write_at(b"orig", 0).unwrap();
        assert_eq!(file_in(&img, "a"), b"IMG!");
        // Clones share the filesystem.
        let clone = be.clone();
        assert_eq!(file_in(&clone, "a"), b"orig");
        assert!(format!("{be:?}").contains("SimBackend"));
    }

    #[test]
    fn backend_is_send_sync_and_usable_as_dyn() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<SimBackend>();
        let be: Arc<dyn StorageBackend> = Arc::new(SimBackend::new());
        let f = be.open(Path::new("x"), OpenMode::Direct, true).unwrap();
        std::thread::scope(|s| {
            for t in 0..4u64 {
                let f = &f;
                s.spawn(move || {
                    f.write_at(&t.to_le_bytes(), t * 8).unwrap();
                    f.sync().unwrap();
                });
            }
        });
        assert_eq!(f.len().unwrap(), 32);
    }
}
