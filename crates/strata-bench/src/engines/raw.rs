//! `raw`: `O_DIRECT` reads with no cache at all — every access goes to the device. With the
//! same block size and the same number of threads (synchronous reads: queue depth = threads)
//! it is the device's limit for that access pattern; for scans it reads large sequential
//! chunks.
//!
//! [`PageStore::read_batch`] is the device's limit at a queue depth larger than the thread
//! count: each data file is opened a second time through strata's [`UringBackend`], and a
//! batch goes to the device at once with [`StorageFile::read_many`] (io_uring, up to
//! `RING_ENTRIES` reads in flight per thread; where io_uring is unavailable the backend falls
//! back to one `pread` after the other, and `describe()` says so).

use std::cell::RefCell;
use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use strata::storage::backend::OpenMode;
use strata::storage::{AlignedBuf, IoBufMut, ReadReq, StorageBackend, StorageFile, UringBackend};

use super::open_data;
use crate::dataset::DataFile;
use crate::workload::Counter;
use crate::{EResult, EngineError, IoCounters, Page, PageStore};

struct RawFile {
    file: File,
    /// The same file opened through `RawStore::uring`, for batches.
    batch: Arc<dyn StorageFile>,
    page_size: usize,
    payload_offset: usize,
    pages: u64,
}

/// Uncached direct reads of the data files.
pub struct RawStore {
    files: Vec<RawFile>,
    chunk: usize,
    reads: Counter,
    bytes_read: Counter,
    direct: bool,
    /// Whether the batch files bypass the page cache too.
    batch_direct: bool,
    /// The backend of the batch reads (io_uring, or its `pread` fallback).
    uring: UringBackend,
}

thread_local! {
    static BUF: RefCell<Option<AlignedBuf>> = const { RefCell::new(None) };
}

/// Runs `f` with this thread's aligned buffer of at least `len` bytes.
fn with_buf<T>(len: usize, f: impl FnOnce(&mut [u8]) -> T) -> T {
    BUF.with(|b| {
        let mut b = b.borrow_mut();
        if b.as_ref().is_none_or(|buf| buf.len() < len) {
            *b = Some(AlignedBuf::zeroed(len));
        }
        f(&mut b.as_mut().unwrap().as_mut()[..len])
    })
}

impl RawStore {
    /// Opens `files`; scans read `chunk` bytes per request (rounded to whole pages).
    pub fn open(files: &[DataFile], chunk: usize) -> EResult<RawStore> {
        let uring = UringBackend::new();
        let (mut direct, mut batch_direct) = (true, true);
        let mut out = Vec::new();
        for f in files {
            let (file, d) = open_data(&f.path, false).map_err(|e| EngineError(format!("open {}: {e}", f.path.display())))?;
            let batch = uring.open(&f.path, OpenMode::Direct, false).map_err(|e| EngineError(format!("open {} for batches: {e}", f.path.display())))?;
            direct &= d;
            batch_direct &= batch.is_direct();
            out.push(RawFile { file, batch, page_size: f.page_size, payload_offset: f.payload_offset, pages: f.pages });
        }
        Ok(RawStore { files: out, chunk, reads: Counter::default(), bytes_read: Counter::default(), direct, batch_direct, uring })
    }

    fn file(&self, file: u16) -> EResult<&RawFile> {
        self.files.get(file as usize).ok_or_else(|| EngineError(format!("no data file {file}")))
    }

    /// The file of `page`, which must exist and hold the page.
    fn file_of(&self, page: Page) -> EResult<&RawFile> {
        let rf = self.file(page.file)?;
        if page.index >= rf.pages {
            return Err(EngineError(format!("page {} of file {} is beyond its {} pages", page.index, page.file, rf.pages)));
        }
        Ok(rf)
    }

    fn read_into(&self, f: &RawFile, first: u64, buf: &mut [u8]) -> EResult<()> {
        f.file.read_exact_at(buf, first * f.page_size as u64).map_err(|e| EngineError(format!("raw read at page {first}: {e}")))?;
        self.reads.add(1);
        self.bytes_read.add(buf.len() as u64);
        Ok(())
    }
}

impl PageStore for RawStore {
    fn name(&self) -> &'static str {
        "raw"
    }

    fn page_size(&self, file: u16) -> usize {
        self.files[file as usize].page_size
    }

    fn read(&self, page: Page, f: &mut dyn FnMut(&[u8])) -> EResult<()> {
        let rf = self.file(page.file)?;
        if page.index >= rf.pages {
            return Err(EngineError(format!("page {} of file {} is beyond its {} pages", page.index, page.file, rf.pages)));
        }
        with_buf(rf.page_size, |buf| {
            self.read_into(rf, page.index, buf)?;
            f(&buf[rf.payload_offset..]);
            Ok(())
        })
    }

    fn read_pinned(&self, pages: &[Page], f: &mut dyn FnMut(usize, &[u8])) -> EResult<()> {
        // "Holding" pages means having them all in memory at once: one buffer for all.
        let mut offsets = Vec::with_capacity(pages.len());
        let mut total = 0;
        for p in pages {
            let rf = self.file(p.file)?;
            if p.index >= rf.pages {
                return Err(EngineError(format!("page {} of file {} is beyond its {} pages", p.index, p.file, rf.pages)));
            }
            offsets.push(total);
            total += rf.page_size;
        }
        let mut buf = AlignedBuf::zeroed(total.max(1));
        for (p, &at) in pages.iter().zip(&offsets) {
            let rf = self.file(p.file)?;
            self.read_into(rf, p.index, &mut buf.as_mut()[at..at + rf.page_size])?;
        }
        for (i, (p, &at)) in pages.iter().zip(&offsets).enumerate() {
            let rf = self.file(p.file)?;
            f(i, &buf[at + rf.payload_offset..at + rf.page_size]);
        }
        Ok(())
    }

    /// The whole batch goes to the device at once: one `read_many` per data file the batch
    /// touches (io_uring keeps them all in flight), into this thread's buffer (page `i` of the
    /// batch at the sum of the sizes of pages `0..i`), then `f` in batch order.
    fn read_batch(&self, pages: &[Page], f: &mut dyn FnMut(usize, &[u8])) -> EResult<()> {
        let mut files = Vec::with_capacity(pages.len());
        let mut total = 0;
        for &p in pages {
            let rf = self.file_of(p)?;
            files.push(rf);
            total += rf.page_size;
        }
        with_buf(total, |buf| {
            {
                // One disjoint slice of the buffer per page, in batch order.
                let mut slots: Vec<Option<&mut [u8]>> = Vec::with_capacity(pages.len());
                let mut rest = &mut *buf;
                for rf in &files {
                    let (slot, tail) = rest.split_at_mut(rf.page_size);
                    slots.push(Some(slot));
                    rest = tail;
                }
                // Group by file (usually there is one): a read_many per file.
                let mut order: Vec<usize> = (0..pages.len()).collect();
                order.sort_by_key(|&i| pages[i].file);
                for group in order.chunk_by(|&a, &b| pages[a].file == pages[b].file) {
                    let rf = files[group[0]];
                    let mut reqs: Vec<ReadReq<'_>> = group
                        .iter()
                        .map(|&i| {
                            let slot = slots[i].take().expect("each page of the batch has its own slot");
                            ReadReq::new(IoBufMut::from_slice(slot), pages[i].index * rf.page_size as u64)
                        })
                        .collect();
                    let failed = rf.batch.read_many(&mut reqs);
                    for (&i, req) in group.iter().zip(&reqs) {
                        let p = pages[i];
                        match &req.result {
                            Ok(n) if *n == rf.page_size => {}
                            Ok(n) => {
                                return Err(EngineError(format!(
                                    "raw batch read of page {} of file {}: {n} of {} bytes (end of file)",
                                    p.index, p.file, rf.page_size
                                )))
                            }
                            Err(e) => return Err(EngineError(format!("raw batch read of page {} of file {}: {e}", p.index, p.file))),
                        }
                    }
                    failed.map_err(|e| EngineError(format!("raw batch read of file {}: {e}", pages[group[0]].file)))?;
                }
            }
            self.reads.add(pages.len() as u64);
            self.bytes_read.add(total as u64);
            let mut at = 0;
            for (i, rf) in files.iter().enumerate() {
                f(i, &buf[at + rf.payload_offset..at + rf.page_size]);
                at += rf.page_size;
            }
            Ok(())
        })
    }

    fn scan(&self, file: u16, range: Range<u64>, f: &mut dyn FnMut(u64, &[u8])) -> EResult<()> {
        let rf = self.file(file)?;
        if range.end > rf.pages {
            return Err(EngineError(format!("pages {range:?} of file {file} run past its {} pages", rf.pages)));
        }
        let per = (self.chunk / rf.page_size).max(1) as u64;
        with_buf(per as usize * rf.page_size, |buf| {
            let mut at = range.start;
            while at < range.end {
                let n = per.min(range.end - at);
                let bytes = n as usize * rf.page_size;
                self.read_into(rf, at, &mut buf[..bytes])?;
                for k in 0..n as usize {
                    f(at + k as u64, &buf[k * rf.page_size + rf.payload_offset..(k + 1) * rf.page_size]);
                }
                at += n;
            }
            Ok(())
        })
    }

    fn counters(&self) -> IoCounters {
        IoCounters { hits: None, misses: None, bytes_read: self.bytes_read.get() }
    }

    fn describe(&self) -> serde_json::Map<String, serde_json::Value> {
        let mut m = serde_json::Map::new();
        m.insert("direct_io".into(), self.direct.into());
        m.insert("scan_chunk_bytes".into(), self.chunk.into());
        m.insert("reads".into(), self.reads.get().into());
        // How read_batch reaches the device (read and scan are plain preads either way).
        m.insert("batch_direct_io".into(), self.batch_direct.into());
        m.insert("batch_io_uring".into(), self.uring.uses_io_uring().into());
        if let Some(why) = self.uring.fallback_reason() {
            m.insert("batch_io_uring_fallback".into(), why.into());
        }
        let st = self.uring.stats();
        m.insert("batch_ring_calls".into(), st.ring_calls.into());
        m.insert("batch_posix_calls".into(), st.posix_calls.into());
        m
    }
}
