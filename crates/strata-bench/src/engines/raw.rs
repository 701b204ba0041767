//! `raw`: `O_DIRECT` reads with no cache at all — every access goes to the device. With the
//! same block size and the same number of threads (synchronous reads: queue depth = threads)
//! it is the device's limit for that access pattern; for scans it reads large sequential
//! chunks.

use std::cell::RefCell;
use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;

use strata::storage::AlignedBuf;

use super::open_data;
use crate::dataset::DataFile;
use crate::workload::Counter;
use crate::{EResult, EngineError, IoCounters, Page, PageStore};

struct RawFile {
    file: File,
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
}

thread_local! {
    static BUF: RefCell<Option<AlignedBuf>> = const { RefCell::new(None) };
}

/// Runs `f` with this thread's aligned buffer of at least `len` bytes.
fn with_buf<T>(len: usize, f: impl FnOnce(&mut [u8]) -> T) -> T {
    BUF.with(|b| {
        let mut b = b.borrow_mut();
        if b.as_ref().map_or(true, |buf| buf.len() < len) {
            *b = Some(AlignedBuf::zeroed(len));
        }
        f(&mut b.as_mut().unwrap().as_mut()[..len])
    })
}

impl RawStore {
    /// Opens `files`; scans read `chunk` bytes per request (rounded to whole pages).
    pub fn open(files: &[DataFile], chunk: usize) -> EResult<RawStore> {
        let mut direct = true;
        let mut out = Vec::new();
        for f in files {
            let (file, d) = open_data(&f.path, false).map_err(|e| EngineError(format!("open {}: {e}", f.path.display())))?;
            direct &= d;
            out.push(RawFile { file, page_size: f.page_size, payload_offset: f.payload_offset, pages: f.pages });
        }
        Ok(RawStore { files: out, chunk, reads: Counter::default(), bytes_read: Counter::default(), direct })
    }

    fn file(&self, file: u16) -> EResult<&RawFile> {
        self.files.get(file as usize).ok_or_else(|| EngineError(format!("no data file {file}")))
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
        m
    }
}
