//! The write-ahead log: an append-only sequence of [records](record) in segment files
//! `wal/<first LSN, 16 hex digits>.log`.
//!
//! * **LSN.** A record's log sequence number is its byte position in the log since the
//!   database was created; segment `S` holds the records with `S <= LSN < next segment`,
//!   at file offset `LSN - S`. LSN 0 means "none".
//! * **Append** copies the record into an in-memory tail under a short mutex and returns
//!   its LSN. Nothing is on disk yet.
//! * **Flush** (group commit): `flush(lsn)` returns once every record up to and including
//!   `lsn` is durable. One thread at a time is the flusher: it takes the whole tail (the
//!   records of everyone who appended meanwhile), writes it, and fsyncs once; threads that
//!   were waiting find their records already durable and return without an fsync of their
//!   own. Each flushed chunk ends with a [`Body::Flush`] record that names the LSN the log
//!   was durable up to before the chunk.
//! * **End of log** at open: records are read from the checkpoint's start LSN until the first
//!   one that is short or damaged. If a valid flush record *after* it says the log had been
//!   durable beyond the damaged record, that record was lost after it had been fsynced:
//!   [`Error::Corruption`], never silent loss of committed work. Otherwise it is the torn
//!   tail of a flush the crash interrupted (no commit in it was acknowledged): the log is
//!   cut there, durably, so stale bytes never reappear behind later records.
//! * **Failure.** A failed log write or fsync poisons the log: later appends and flushes
//!   fail with [`Error::LogFailed`] until the database is reopened (after a failed fsync the
//!   kernel may have dropped the dirty data and cleared the error, so nothing after it can be
//!   trusted). The bytes of the failed write are cut off the file where possible.
//! * **Truncation.** Segments that end at or before a checkpoint's start LSN are deleted.

pub mod record;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

pub use record::{Body, Compensation, Record};

use crate::error::{Error, Result};
use crate::storage::backend::{OpenMode, StorageBackend, StorageFile};
use crate::storage::IoBufMut;

/// Directory of the log inside the database directory.
pub const WAL_DIR: &str = "wal";
/// LSN of the first record of a new database.
pub const FIRST_LSN: u64 = 1;
/// Default segment size.
pub const DEFAULT_SEGMENT_SIZE: u64 = 16 << 20;

/// The smallest segment size an open picks on a small disk (an eighth of the free space, but
/// not less than this; never more than configured).
pub const MIN_SEGMENT_ON_SMALL_DISK: u64 = 256 << 10;
/// An appender flushes the tail itself once it holds this many bytes.
const TAIL_FLUSH_BYTES: usize = 4 << 20;
const CHECKPOINT_FILE: &str = "checkpoint";
const CHECKPOINT_MAGIC: &[u8; 4] = b"SCK1";

fn segment_name(start: u64) -> String {
    format!("{start:016x}.log")
}

fn parse_segment_name(name: &str) -> Option<u64> {
    let hex = name.strip_suffix(".log")?;
    (hex.len() == 16).then(|| u64::from_str_radix(hex, 16).ok()).flatten()
}

/// Log statistics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct WalStats {
    /// Records appended.
    pub records: u64,
    /// Bytes appended.
    pub bytes: u64,
    /// Chunks written and fsynced (one per group commit).
    pub flushes: u64,
}

struct Tail {
    /// LSN the next record gets.
    next: u64,
    /// First LSN of the segment the next record goes to.
    segment: u64,
    /// Unflushed records, starting at `buf_start`.
    buf: Vec<u8>,
    buf_start: u64,
    /// Segments that start inside `buf`.
    new_segments: Vec<u64>,
}

struct Writer {
    segment: u64,
    file: Arc<dyn StorageFile>,
}

/// The write-ahead log of one database. `Send + Sync`.
pub struct Wal {
    backend: Arc<dyn StorageBackend>,
    dir: PathBuf,
    segment_size: u64,
    group_commit: bool,
    tail: Mutex<Tail>,
    /// Every record below this LSN is durable.
    flushed: AtomicU64,
    writer: Mutex<Writer>,
    /// Whether a flush is in progress; committers whose records it covers wait on
    /// `flush_done` (not on `writer`, which the flusher holds through its fsync: waiting there
    /// would make every waiter start an fsync of its own after the one that covered it).
    flushing: Mutex<bool>,
    flush_done: Condvar,
    segments: Mutex<BTreeSet<u64>>,
    failed: Mutex<Option<String>>,
    /// Opened by [`Wal::open_read_only`]: every append and flush is refused.
    read_only: bool,
    records: AtomicU64,
    bytes: AtomicU64,
    flushes: AtomicU64,
}

/// How the log is configured.
#[derive(Clone, Copy, Debug)]
pub struct WalOptions {
    /// Size at which a new segment is started.
    pub segment_size: u64,
    /// Share fsyncs between concurrent committers (off: every flush fsyncs by itself; only
    /// for measuring what group commit saves).
    pub group_commit: bool,
}

impl Default for WalOptions {
    fn default() -> Self {
        WalOptions { segment_size: DEFAULT_SEGMENT_SIZE, group_commit: true }
    }
}

/// The log's checkpoint record, kept in `wal/checkpoint` (replaced atomically): where
/// recovery starts reading, and the next transaction id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CheckpointInfo {
    /// Recovery reads the log from here (every change of a page that was dirty at the
    /// checkpoint, and every record of a transaction active at it, is at or after it).
    pub start_lsn: u64,
    /// Transaction ids below this were used.
    pub next_txid: u64,
    /// Random for every checkpoint: any change that became durable since a checkpoint went
    /// through a later one, so an equal nonce means the same, unchanged database (what a
    /// remote hot-set snapshot is stamped with).
    pub nonce: u64,
}

impl CheckpointInfo {
    fn path(dir: &Path) -> PathBuf {
        dir.join(WAL_DIR).join(CHECKPOINT_FILE)
    }

    /// Loads the checkpoint record of database `dir` (`None` when the log is new).
    pub fn load(backend: &dyn StorageBackend, dir: &Path) -> Result<Option<CheckpointInfo>> {
        let path = Self::path(dir);
        if !backend.exists(&path) {
            return Ok(None);
        }
        let b = backend.read_file(&path).map_err(|e| Error::io("read", &path, e))?;
        if b.len() != 32 || &b[0..4] != CHECKPOINT_MAGIC || crc32c::crc32c(&b[..28]).to_le_bytes() != b[28..32] {
            return Err(Error::corruption(path, None, "log checkpoint record is damaged"));
        }
        let word = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
        Ok(Some(CheckpointInfo { start_lsn: word(4), next_txid: word(12), nonce: word(20) }))
    }

    /// Stores it atomically.
    pub fn store(&self, backend: &dyn StorageBackend, dir: &Path) -> Result<()> {
        let mut b = Vec::with_capacity(32);
        b.extend_from_slice(CHECKPOINT_MAGIC);
        b.extend_from_slice(&self.start_lsn.to_le_bytes());
        b.extend_from_slice(&self.next_txid.to_le_bytes());
        b.extend_from_slice(&self.nonce.to_le_bytes());
        let crc = crc32c::crc32c(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        let path = Self::path(dir);
        backend.write_atomic(&path, &b).map_err(|e| Error::io("write", &path, e))
    }
}

impl Wal {
    /// Opens the log of database `dir` (creating its directory if missing), finds its end
    /// reading from `start` (cutting a torn tail), and positions appends there.
    pub fn open(backend: Arc<dyn StorageBackend>, dir: &Path, start: u64, opts: WalOptions) -> Result<Wal> {
        let wal_dir = dir.join(WAL_DIR);
        if !backend.exists(&wal_dir) {
            backend.create_dir_all(&wal_dir).map_err(|e| Error::io("create directory", &wal_dir, e))?;
            backend.sync_dir(dir).map_err(|e| Error::io("fsync directory", dir, e))?;
        }
        let mut segments: BTreeSet<u64> = BTreeSet::new();
        for name in backend.list_dir(&wal_dir).map_err(|e| Error::io("list", &wal_dir, e))? {
            if let Some(s) = parse_segment_name(&name) {
                segments.insert(s);
            }
        }
        let end = find_end(backend.as_ref(), &wal_dir, &segments, start)?;
        // Cut everything after the end: a torn tail, and segments begun by the lost flush.
        let segment = segments.range(..=end).next_back().copied().unwrap_or(end);
        let mut removed = false;
        for &s in segments.range(segment + 1..) {
            let p = wal_dir.join(segment_name(s));
            backend.remove(&p).map_err(|e| Error::io("remove", &p, e))?;
            removed = true;
        }
        segments.retain(|&s| s <= segment);
        let path = wal_dir.join(segment_name(segment));
        let created = !segments.contains(&segment);
        let file = backend.open(&path, OpenMode::Buffered, true).map_err(|e| Error::io("open", &path, e))?;
        if file.len().map_err(|e| Error::io("stat", &path, e))? != end - segment {
            file.set_len(end - segment).map_err(|e| Error::io("truncate", &path, e))?;
            file.sync().map_err(|e| Error::io("fsync", &path, e))?;
        }
        if created || removed {
            backend.sync_dir(&wal_dir).map_err(|e| Error::io("fsync directory", &wal_dir, e))?;
        }
        segments.insert(segment);
        // On a small disk, smaller segments: truncation gives space back a segment at a time.
        let segment_size = match backend.free_space(&wal_dir) {
            Some(free) => opts.segment_size.min((free / 8).max(MIN_SEGMENT_ON_SMALL_DISK)),
            None => opts.segment_size,
        };
        Ok(Wal::at_end(backend, wal_dir, segment_size.max(4096), opts.group_commit, segments, (segment, file), end, false))
    }

    /// A log whose next record goes to `end`, in the open segment file `current`.
    #[allow(clippy::too_many_arguments)]
    fn at_end(
        backend: Arc<dyn StorageBackend>,
        dir: PathBuf,
        segment_size: u64,
        group_commit: bool,
        segments: BTreeSet<u64>,
        (segment, file): (u64, Arc<dyn StorageFile>),
        end: u64,
        read_only: bool,
    ) -> Wal {
        Wal {
            backend,
            dir,
            segment_size,
            group_commit,
            tail: Mutex::new(Tail { next: end, segment, buf: Vec::new(), buf_start: end, new_segments: Vec::new() }),
            flushed: AtomicU64::new(end),
            writer: Mutex::new(Writer { segment, file }),
            flushing: Mutex::new(false),
            flush_done: Condvar::new(),
            segments: Mutex::new(segments),
            failed: Mutex::new(None),
            read_only,
            records: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            flushes: AtomicU64::new(0),
        }
    }

    /// Opens the log of database `dir` for reading only: finds its end reading from `start`
    /// as [`open`](Self::open) does, but changes nothing (a torn tail and the segments after
    /// it are left as they are and never read; a missing log directory is an empty log).
    /// Appends and flushes fail with [`Error::ReadOnly`].
    pub fn open_read_only(backend: Arc<crate::storage::ReadOnlyBackend>, dir: &Path, start: u64) -> Result<Wal> {
        let wal_dir = dir.join(WAL_DIR);
        let mut segments: BTreeSet<u64> = BTreeSet::new();
        if backend.exists(&wal_dir) {
            for name in backend.list_dir(&wal_dir).map_err(|e| Error::io("list", &wal_dir, e))? {
                if let Some(s) = parse_segment_name(&name) {
                    segments.insert(s);
                }
            }
        }
        let end = find_end(backend.as_ref(), &wal_dir, &segments, start)?;
        let segment = segments.range(..=end).next_back().copied().unwrap_or(end);
        segments.retain(|&s| s <= segment);
        let path = wal_dir.join(segment_name(segment));
        // Through the read-only backend: never created, never written.
        let file = backend.open(&path, OpenMode::Buffered, true).map_err(|e| Error::io("open", &path, e))?;
        Ok(Wal::at_end(backend, wal_dir, DEFAULT_SEGMENT_SIZE, true, segments, (segment, file), end, true))
    }

    /// The LSN the next record will get (one past the last appended byte).
    pub fn end(&self) -> u64 {
        self.tail.lock().next
    }

    /// Every record below this LSN is durable.
    pub fn flushed(&self) -> u64 {
        self.flushed.load(Ordering::Acquire)
    }

    /// Statistics.
    pub fn stats(&self) -> WalStats {
        WalStats { records: self.records.load(Ordering::Relaxed), bytes: self.bytes.load(Ordering::Relaxed), flushes: self.flushes.load(Ordering::Relaxed) }
    }

    /// Fails with [`Error::LogFailed`] if an earlier write or fsync of the log failed.
    pub fn check_failed(&self) -> Result<()> {
        if self.read_only {
            let dir = self.dir.parent().unwrap_or(&self.dir).to_owned();
            return Err(Error::ReadOnly { dir, op: "writing the log" });
        }
        match &*self.failed.lock() {
            Some(reason) => Err(Error::LogFailed(reason.clone())),
            None => Ok(()),
        }
    }

    fn append_locked(&self, t: &mut Tail, txid: u64, prev_lsn: u64, body: &Body<'_>) -> u64 {
        let len = (record::HEADER_LEN + body.encoded_len()) as u64;
        if t.next > t.segment && t.next - t.segment + len > self.segment_size {
            t.segment = t.next;
            t.new_segments.push(t.next);
        }
        let lsn = t.next;
        record::encode(&mut t.buf, lsn, txid, prev_lsn, body);
        t.next += len;
        lsn
    }

    /// Appends a record; returns its LSN. It is durable only after [`flush`](Self::flush).
    pub fn append(&self, txid: u64, prev_lsn: u64, body: &Body<'_>) -> Result<u64> {
        self.check_failed()?;
        if record::HEADER_LEN + body.encoded_len() > record::MAX_RECORD_LEN {
            return Err(Error::InvalidInput("log record larger than 4 GiB; split the update".into()));
        }
        let (lsn, big) = {
            let mut t = self.tail.lock();
            let lsn = self.append_locked(&mut t, txid, prev_lsn, body);
            (lsn, t.buf.len() >= TAIL_FLUSH_BYTES)
        };
        self.records.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add((record::HEADER_LEN + body.encoded_len()) as u64, Ordering::Relaxed);
        if big {
            self.flush(lsn)?;
        }
        Ok(lsn)
    }

    /// Returns once the record at `lsn` (and everything before it) is durable.
    pub fn flush(&self, lsn: u64) -> Result<()> {
        if self.group_commit && lsn < self.flushed() {
            return Ok(());
        }
        {
            let mut flushing = self.flushing.lock();
            loop {
                if self.group_commit && lsn < self.flushed() {
                    return Ok(());
                }
                self.check_failed()?;
                if !*flushing {
                    *flushing = true;
                    break;
                }
                self.flush_done.wait(&mut flushing);
            }
        }
        let r = self.flush_as_leader(lsn);
        *self.flushing.lock() = false;
        self.flush_done.notify_all();
        r
    }

    /// Writes and fsyncs the whole tail; the caller is the only flusher.
    fn flush_as_leader(&self, lsn: u64) -> Result<()> {
        let mut w = self.writer.lock();
        let (start, buf, new_segments) = {
            let mut t = self.tail.lock();
            if lsn >= t.next {
                return Err(Error::InvalidInput(format!("flush of log position {lsn}, which was never written (log ends at {})", t.next)));
            }
            if !t.buf.is_empty() {
                let durable_before = self.flushed();
                self.append_locked(&mut t, 0, 0, &Body::Flush { durable_before });
            }
            let start = t.buf_start;
            t.buf_start = t.next;
            (start, std::mem::take(&mut t.buf), std::mem::take(&mut t.new_segments))
        };
        let end = start + buf.len() as u64;
        if let Err(e) = self.write_chunk(&mut w, start, &buf, &new_segments) {
            *self.failed.lock() = Some(e.to_string());
            return Err(e);
        }
        self.flushes.fetch_add(1, Ordering::Relaxed);
        self.flushed.store(end, Ordering::Release);
        Ok(())
    }

    /// Flushes everything appended so far.
    pub fn flush_all(&self) -> Result<()> {
        let end = self.end();
        if end > self.flushed() {
            self.flush(end - 1)?;
        }
        Ok(())
    }

    fn write_chunk(&self, w: &mut Writer, start: u64, buf: &[u8], new_segments: &[u64]) -> Result<()> {
        let mut at = start;
        let mut rest = buf;
        let mut bounds = new_segments.iter().copied().peekable();
        loop {
            let piece_end = bounds.peek().copied().unwrap_or(at + rest.len() as u64);
            let (piece, tail) = rest.split_at((piece_end - at) as usize);
            if !piece.is_empty() {
                let off = at - w.segment;
                if let Err(e) = w.file.write_at(piece, off) {
                    // Cut whatever part of the chunk reached the file, so that no record of
                    // a failed flush (a commit reported as failed) can become durable later.
                    let _ = w.file.set_len(off);
                    let _ = w.file.sync();
                    return Err(Error::io("write log", w.file.path(), e));
                }
            }
            at = piece_end;
            rest = tail;
            let Some(next) = bounds.next() else { break };
            // The old segment is complete: make it durable before moving on.
            w.file.sync().map_err(|e| Error::io("fsync log", w.file.path(), e))?;
            let path = self.dir.join(segment_name(next));
            w.file = self.backend.open(&path, OpenMode::Buffered, true).map_err(|e| Error::io("create log segment", &path, e))?;
            w.segment = next;
            self.segments.lock().insert(next);
        }
        w.file.sync().map_err(|e| Error::io("fsync log", w.file.path(), e))?;
        if !new_segments.is_empty() {
            self.backend.sync_dir(&self.dir).map_err(|e| Error::io("fsync directory", &self.dir, e))?;
        }
        Ok(())
    }

    /// Deletes the segments that hold only records below `lsn`. When `lsn` is the end of
    /// the log (nothing after it, all durable), the current segment is dead too: an empty
    /// one starting at `lsn` replaces it, so that its space goes back to the file system
    /// (on a small disk, a checkpoint after a failed import gives the import's log back).
    pub fn truncate_before(&self, lsn: u64) -> Result<()> {
        self.restart_at(lsn)?;
        let doomed: Vec<u64> = {
            let segs = self.segments.lock();
            let keep_from = segs.range(..=lsn).next_back().copied();
            segs.iter().copied().filter(|&s| Some(s) != keep_from && s < lsn).collect()
        };
        for s in &doomed {
            let p = self.dir.join(segment_name(*s));
            self.backend.remove(&p).map_err(|e| Error::io("remove", &p, e))?;
            self.segments.lock().remove(s);
        }
        Ok(())
    }

    /// Starts a new, empty segment at `lsn` if it is the end of the log, nothing is waiting
    /// to be flushed and the current segment began before it (see
    /// [`truncate_before`](Self::truncate_before), which then removes the old one). The new
    /// segment is created and its directory entry made durable first: after a crash the
    /// checkpoint record's start (`lsn`) finds it, whether or not the old one is gone.
    fn restart_at(&self, lsn: u64) -> Result<()> {
        if self.read_only {
            return Ok(());
        }
        // Writer before tail, as a flush takes them: no flush or append runs meanwhile.
        let mut w = self.writer.lock();
        let mut t = self.tail.lock();
        if t.next != lsn || !t.buf.is_empty() || self.flushed() != lsn || w.segment >= lsn || t.segment >= lsn {
            return Ok(());
        }
        let path = self.dir.join(segment_name(lsn));
        let file = self.backend.open(&path, OpenMode::Buffered, true).map_err(|e| Error::io("create log segment", &path, e))?;
        self.backend.sync_dir(&self.dir).map_err(|e| Error::io("fsync directory", &self.dir, e))?;
        w.file = file;
        w.segment = lsn;
        t.segment = lsn;
        self.segments.lock().insert(lsn);
        Ok(())
    }

    /// Bytes that may still be written on the log's file system, if known.
    pub fn free_space(&self) -> Option<u64> {
        self.backend.free_space(&self.dir)
    }

    /// Bytes of log on disk (all segments).
    pub fn disk_bytes(&self) -> u64 {
        let segs: Vec<u64> = self.segments.lock().iter().copied().collect();
        match (segs.first(), self.flushed()) {
            (Some(&first), flushed) => flushed.saturating_sub(first),
            (None, _) => 0,
        }
    }

    /// A reader of the durable records from `from` on.
    pub fn reader(&self, from: u64) -> Reader<'_> {
        Reader { wal: self, start: from, pos: from, cache: None }
    }
}

/// Reads durable records, sequentially or at given LSNs (caching one segment).
pub struct Reader<'a> {
    wal: &'a Wal,
    /// Nothing before this is read (segments are read from here, not from their start).
    start: u64,
    pos: u64,
    /// A segment's first LSN, the LSN of `bytes[0]`, and its bytes from there on.
    cache: Option<(u64, u64, Vec<u8>)>,
}

impl Reader<'_> {
    fn segment_of(&mut self, lsn: u64) -> Result<&[u8]> {
        let seg = self.wal.segments.lock().range(..=lsn).next_back().copied();
        let Some(seg) = seg else {
            return Err(Error::corruption(&self.wal.dir, None, format!("no log segment holds position {lsn}")));
        };
        if !self.cache.as_ref().is_some_and(|c| c.0 == seg && c.1 <= lsn) {
            let from = if lsn >= self.start { seg.max(self.start) } else { seg };
            let bytes = read_segment(self.wal.backend.as_ref(), &self.wal.dir, seg, from)?;
            self.cache = Some((seg, from, bytes));
        }
        Ok(&self.cache.as_ref().unwrap().2)
    }

    /// The record at `lsn`, which must be durable.
    pub fn record_at(&mut self, lsn: u64) -> Result<Record> {
        self.record_and_len(lsn).map(|(rec, _)| rec)
    }

    /// The record at `lsn` and its length in the log (its length field, which a record
    /// written before updates over zeros had their own kind can exceed the length of its
    /// re-encoding).
    fn record_and_len(&mut self, lsn: u64) -> Result<(Record, usize)> {
        if lsn >= self.wal.flushed() {
            return Err(Error::InvalidInput(format!("log position {lsn} is not durable yet")));
        }
        let dir = self.wal.dir.clone();
        // Read through the segment first so the cache can be borrowed.
        self.segment_of(lsn)?;
        let (_, base, bytes) = self.cache.as_ref().unwrap();
        let at = bytes.get((lsn - base) as usize..).unwrap_or(&[]);
        let rec = record::decode(at, lsn).map_err(|why| Error::corruption(dir, None, format!("log record at {lsn} unreadable: {why:?}")))?;
        Ok((rec, record::claimed_len(at).expect("a decoded record has a length")))
    }
}

impl Iterator for Reader<'_> {
    type Item = Result<Record>;

    fn next(&mut self) -> Option<Result<Record>> {
        let end = self.wal.flushed();
        if self.pos >= end {
            return None;
        }
        Some(match self.record_and_len(self.pos) {
            Ok((rec, len)) => {
                self.pos += len as u64;
                Ok(rec)
            }
            Err(e) => {
                self.pos = end;
                Err(e)
            }
        })
    }
}

/// The bytes of segment `seg` from log position `from` (>= `seg`) to its end.
fn read_segment(backend: &dyn StorageBackend, dir: &Path, seg: u64, from: u64) -> Result<Vec<u8>> {
    let path = dir.join(segment_name(seg));
    let file = backend.open(&path, OpenMode::Buffered, false).map_err(|e| Error::io("open", &path, e))?;
    let len = file.len().map_err(|e| Error::io("stat", &path, e))?;
    let skip = (from - seg).min(len);
    let mut bytes = vec![0u8; (len - skip) as usize];
    let n = file.read_at(IoBufMut::from_slice(&mut bytes), skip).map_err(|e| Error::io("read log", &path, e))?;
    bytes.truncate(n);
    Ok(bytes)
}

/// Finds the end of the valid log from `start` (see the module docs).
fn find_end(backend: &dyn StorageBackend, dir: &Path, segments: &BTreeSet<u64>, start: u64) -> Result<u64> {
    let Some(&first) = segments.range(..=start).next_back() else {
        return match segments.iter().next() {
            // Only segments after the start: the one holding it is gone.
            Some(&s) if s > start => Err(Error::corruption(dir, None, format!("log segment holding the checkpoint position {start} is missing"))),
            _ => Ok(start),
        };
    };
    let segs: Vec<u64> = segments.range(first..).copied().collect();
    let mut pos = start;
    for (i, &seg) in segs.iter().enumerate() {
        if seg != first && seg != pos {
            // A gap, or the previous segment ended early: the records there are missing.
            return check_torn(backend, dir, &segs[i..], pos, pos, &[]);
        }
        // The first segment is read from the start position only.
        let base = if seg == first { start } else { seg };
        let bytes = read_segment(backend, dir, seg, base)?;
        loop {
            let off = (pos - base) as usize;
            if off >= bytes.len() {
                break;
            }
            match record::decode(&bytes[off..], pos) {
                // Stepped by the record's own length field (see `Reader::record_and_len`).
                Ok(_) => pos += record::claimed_len(&bytes[off..]).expect("a decoded record has a length") as u64,
                Err(_) => return check_torn(backend, dir, &segs[i + 1..], pos, base, &bytes),
            }
        }
    }
    Ok(pos)
}

/// `bad` holds no valid record. It is the end of the log unless a later flush record says
/// the log had been durable past it (then committed work was lost: corruption). `bytes` are
/// the log from position `seg` on (up to the end of `bad`'s segment).
fn check_torn(backend: &dyn StorageBackend, dir: &Path, later: &[u64], bad: u64, seg: u64, bytes: &[u8]) -> Result<u64> {
    let found = |seg: u64, bytes: &[u8], from: usize| -> Option<u64> {
        (from..bytes.len().saturating_sub(record::HEADER_LEN - 1)).find_map(|p| {
            let lsn = seg + p as u64;
            if u64::from_le_bytes(bytes[p + 8..p + 16].try_into().unwrap()) != lsn {
                return None;
            }
            match record::decode(&bytes[p..], lsn) {
                Ok(Record { body: Body::Flush { durable_before }, .. }) if durable_before > bad => Some(durable_before),
                _ => None,
            }
        })
    };
    let mut hit = found(seg, bytes, (bad - seg) as usize + 1);
    for &s in later {
        if hit.is_some() {
            break;
        }
        hit = found(s, &read_segment(backend, dir, s, s)?, 0);
    }
    match hit {
        Some(durable) => Err(Error::corruption(
            dir,
            None,
            format!(
                "log record at {bad} is damaged, but the log had been made durable up to {durable}: committed changes would be lost; restore from a backup"
            ),
        )),
        None => Ok(bad),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::{FaultyBackend, FileBackend, PageId};
    use std::borrow::Cow;

    fn update(n: usize) -> Body<'static> {
        Body::Update { pid: PageId::new(0, false, 1), offset: 8, before: Cow::Owned(vec![1; n]), after: Cow::Owned(vec![2; n]) }
    }

    fn open(dir: &Path, start: u64, segment: u64) -> Result<Wal> {
        Wal::open(Arc::new(FileBackend::default()), dir, start, WalOptions { segment_size: segment, group_commit: true })
    }

    #[test]
    fn records_survive_reopen_across_segments() {
        let dir = tempfile::tempdir().unwrap();
        let wal = open(dir.path(), FIRST_LSN, 4096).unwrap();
        let mut lsns = Vec::new();
        for i in 0..100 {
            lsns.push(wal.append(i, 0, &update(50 + i as usize)).unwrap());
        }
        wal.flush(*lsns.last().unwrap()).unwrap();
        assert!(wal.segments.lock().len() > 1, "4 KiB segments must roll over");
        let end = wal.end();
        drop(wal);
        let wal = open(dir.path(), FIRST_LSN, 4096).unwrap();
        assert_eq!(wal.end(), end);
        let recs: Vec<Record> = wal.reader(FIRST_LSN).collect::<Result<_>>().unwrap();
        let updates: Vec<&Record> = recs.iter().filter(|r| matches!(r.body, Body::Update { .. })).collect();
        assert_eq!(updates.len(), 100);
        for (i, r) in updates.iter().enumerate() {
            assert_eq!(r.lsn, lsns[i]);
            assert_eq!(r.txid, i as u64);
        }
        assert_eq!(wal.reader(FIRST_LSN).record_at(lsns[57]).unwrap().txid, 57);
    }

    #[test]
    fn torn_tail_is_cut_and_later_appends_do_not_resurrect_it() {
        let dir = tempfile::tempdir().unwrap();
        let wal = open(dir.path(), FIRST_LSN, 1 << 20).unwrap();
        let a = wal.append(1, 0, &update(100)).unwrap();
        wal.flush(a).unwrap();
        let durable_end = wal.end();
        let b = wal.append(2, 0, &update(100)).unwrap();
        let c = wal.append(3, 0, &update(100)).unwrap();
        wal.flush(c).unwrap();
        drop(wal);
        // Tear record b (a crash in the middle of its flush) but keep c and the flush mark.
        let seg = dir.path().join(WAL_DIR).join(segment_name(FIRST_LSN));
        let mut bytes = std::fs::read(&seg).unwrap();
        bytes[(b - FIRST_LSN) as usize + 40] ^= 0xff;
        std::fs::write(&seg, &bytes).unwrap();
        let wal = open(dir.path(), FIRST_LSN, 1 << 20).unwrap();
        assert_eq!(wal.end(), durable_end, "log ends before the torn record");
        assert_eq!(std::fs::metadata(&seg).unwrap().len(), durable_end - FIRST_LSN, "the tail was cut");
        let d = wal.append(4, 0, &update(10)).unwrap();
        wal.flush(d).unwrap();
        drop(wal);
        let wal = open(dir.path(), FIRST_LSN, 1 << 20).unwrap();
        let txids: Vec<u64> = wal.reader(FIRST_LSN).map(|r| r.unwrap()).filter(|r| r.txid != 0).map(|r| r.txid).collect();
        assert_eq!(txids, vec![1, 4]);
    }

    #[test]
    fn damage_before_a_later_durable_point_is_corruption() {
        let dir = tempfile::tempdir().unwrap();
        let wal = open(dir.path(), FIRST_LSN, 1 << 20).unwrap();
        let a = wal.append(1, 0, &update(100)).unwrap();
        wal.flush(a).unwrap();
        let b = wal.append(2, 0, &update(100)).unwrap();
        wal.flush(b).unwrap();
        drop(wal);
        let seg = dir.path().join(WAL_DIR).join(segment_name(FIRST_LSN));
        let mut bytes = std::fs::read(&seg).unwrap();
        bytes[(a - FIRST_LSN) as usize + 50] ^= 1;
        std::fs::write(&seg, &bytes).unwrap();
        let err = open(dir.path(), FIRST_LSN, 1 << 20).err().expect("corruption must be reported");
        assert!(matches!(err, Error::Corruption { .. }), "{err}");
        assert!(err.to_string().contains("durable"), "{err}");
    }

    #[test]
    fn failed_write_poisons_and_leaves_no_partial_record() {
        let dir = tempfile::tempdir().unwrap();
        let be = Arc::new(FaultyBackend::new(Arc::new(FileBackend::default())));
        let wal = Wal::open(be.clone(), dir.path(), FIRST_LSN, WalOptions::default()).unwrap();
        let a = wal.append(1, 0, &update(10)).unwrap();
        wal.flush(a).unwrap();
        let end = wal.end();
        let b = wal.append(2, 0, &update(10)).unwrap();
        be.faults.write_errno.store(libc::ENOSPC as u64, Ordering::Relaxed);
        assert!(matches!(wal.flush(b), Err(Error::DiskFull { .. })));
        be.faults.write_errno.store(0, Ordering::Relaxed);
        assert!(matches!(wal.append(3, 0, &Body::Commit), Err(Error::LogFailed(_))));
        assert!(matches!(wal.flush(b), Err(Error::LogFailed(_))));
        drop(wal);
        let wal = Wal::open(be, dir.path(), FIRST_LSN, WalOptions::default()).unwrap();
        assert_eq!(wal.end(), end);
    }

    #[test]
    fn truncation_keeps_the_segment_holding_the_start() {
        let dir = tempfile::tempdir().unwrap();
        let wal = open(dir.path(), FIRST_LSN, 4096).unwrap();
        let mut last = 0;
        for i in 0..60 {
            last = wal.append(i, 0, &update(200)).unwrap();
        }
        wal.flush(last).unwrap();
        let keep = wal.reader(FIRST_LSN).nth(30).unwrap().unwrap().lsn;
        let before = wal.segments.lock().len();
        wal.truncate_before(keep).unwrap();
        assert!(wal.segments.lock().len() < before);
        drop(wal);
        let wal = open(dir.path(), keep, 4096).unwrap();
        let first = wal.reader(keep).next().unwrap().unwrap();
        assert_eq!(first.lsn, keep);
        assert!(matches!(open(dir.path(), FIRST_LSN, 4096), Err(Error::Corruption { .. })), "start before the oldest segment");
    }

    #[test]
    fn checkpoint_info_round_trips_and_detects_damage() {
        let dir = tempfile::tempdir().unwrap();
        let be = FileBackend::default();
        be.create_dir_all(&dir.path().join(WAL_DIR)).unwrap();
        assert_eq!(CheckpointInfo::load(&be, dir.path()).unwrap(), None);
        let cp = CheckpointInfo { start_lsn: 777, next_txid: 12, nonce: 3 };
        cp.store(&be, dir.path()).unwrap();
        assert_eq!(CheckpointInfo::load(&be, dir.path()).unwrap(), Some(cp));
        let p = CheckpointInfo::path(dir.path());
        let mut b = std::fs::read(&p).unwrap();
        b[6] ^= 1;
        std::fs::write(&p, b).unwrap();
        assert!(matches!(CheckpointInfo::load(&be, dir.path()), Err(Error::Corruption { .. })));
    }
}
