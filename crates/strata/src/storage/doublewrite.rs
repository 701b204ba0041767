//! The double-write area: makes in-place page writes safe against torn writes.
//!
//! A power failure in the middle of overwriting a page leaves a mix of old and new sectors
//! at its home location: the checksum catches it, but the log holds only byte-range changes,
//! not a base image to redo them on. So before pages whose durable copy would be destroyed
//! are overwritten in place, the buffer manager writes the batch here and fsyncs it; only then
//! does it write the pages home (and fsyncs them before the area is reused). After a crash,
//! every intact image of the last batch whose home copy is torn or older (lower LSN) is copied
//! home before recovery reads any page (InnoDB's doublewrite buffer; PostgreSQL logs full
//! page images instead, which would log a whole 1 MiB page for an 8-byte change).
//!
//! File `doublewrite.pages`: a header of whole 4 KiB blocks (little-endian): magic `SDW1`,
//! CRC-32C of the rest of the header, entry count u32, header length u32, then per entry the
//! page id u64, the page's offset in this file u64 and its length u64; the page images follow, 4 KiB aligned,
//! each sealed with its own checksum and id. A torn header means the batch never reached
//! home locations; a torn image fails its checksum and is skipped.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::storage::backend::{AlignedBuf, OpenMode, StorageBackend, StorageFile, DIRECT_IO_ALIGN};
use crate::storage::{page, PageId};

/// File name of the double-write area.
pub const DOUBLEWRITE_FILE: &str = "doublewrite.pages";
const MAGIC: &[u8; 4] = b"SDW1";
const FIXED: usize = 16;
const ENTRY: usize = 24;

/// The double-write area of one database.
#[derive(Debug)]
pub struct DoubleWrite {
    file: Arc<dyn StorageFile>,
    path: PathBuf,
}

/// An intact page image found in the area.
pub struct Saved {
    pub pid: PageId,
    pub lsn: u64,
    pub image: AlignedBuf,
}

fn header_len(count: usize) -> usize {
    (FIXED + ENTRY * count).next_multiple_of(DIRECT_IO_ALIGN)
}

impl DoubleWrite {
    /// Opens (creating) the area of database `dir`.
    pub fn open(backend: &dyn StorageBackend, dir: &Path) -> Result<DoubleWrite> {
        let path = dir.join(DOUBLEWRITE_FILE);
        let file = backend.open(&path, OpenMode::Direct, true).map_err(|e| Error::io("open", &path, e))?;
        Ok(DoubleWrite { file, path })
    }

    /// Writes `pages` (sealed images, each a multiple of 4 KiB and 4 KiB aligned in memory)
    /// as one batch and makes it durable. The caller serialises batches and must not reuse
    /// the area before the batch's home writes are durable.
    pub fn write(&self, pages: &[(PageId, &[u8])]) -> Result<()> {
        let hlen = header_len(pages.len());
        let mut header = AlignedBuf::zeroed(hlen);
        let h = header.as_mut();
        h[0..4].copy_from_slice(MAGIC);
        h[8..12].copy_from_slice(&(pages.len() as u32).to_le_bytes());
        h[12..16].copy_from_slice(&(hlen as u32).to_le_bytes());
        let mut off = hlen as u64;
        for (i, (pid, image)) in pages.iter().enumerate() {
            let e = FIXED + ENTRY * i;
            h[e..e + 8].copy_from_slice(&pid.raw().to_le_bytes());
            h[e + 8..e + 16].copy_from_slice(&off.to_le_bytes());
            h[e + 16..e + 24].copy_from_slice(&(image.len() as u64).to_le_bytes());
            off += image.len() as u64;
        }
        let crc = crc32c::crc32c(&h[8..hlen]);
        h[4..8].copy_from_slice(&crc.to_le_bytes());
        let io = |e| Error::io("write double-write area", &self.path, e);
        self.file.write_at(&header, 0).map_err(io)?;
        let mut off = hlen as u64;
        for (_, image) in pages {
            self.file.write_at(image, off).map_err(io)?;
            off += image.len() as u64;
        }
        self.file.sync().map_err(|e| Error::io("fsync", &self.path, e))
    }

    /// Empties the area durably (after a checkpoint made every page's home copy durable).
    /// Whether the area holds nothing (no batch since the last [`clear`](Self::clear)).
    pub fn is_empty(&self) -> Result<bool> {
        Ok(self.file.len().map_err(|e| Error::io("stat", &self.path, e))? == 0)
    }

    pub fn clear(&self) -> Result<()> {
        if self.file.len().map_err(|e| Error::io("stat", &self.path, e))? == 0 {
            // Already empty: leave the file (and its mtime) alone.
            return Ok(());
        }
        self.file.set_len(0).map_err(|e| Error::io("truncate", &self.path, e))?;
        self.file.sync().map_err(|e| Error::io("fsync", &self.path, e))
    }

    /// The intact images of the last batch (none if its header is torn or the area empty).
    pub fn saved(&self) -> Result<Vec<Saved>> {
        let io = |e| Error::io("read double-write area", &self.path, e);
        let len = self.file.len().map_err(io)?;
        if len < DIRECT_IO_ALIGN as u64 {
            return Ok(Vec::new());
        }
        let mut first = AlignedBuf::zeroed(DIRECT_IO_ALIGN);
        self.file.read_at(first.io(), 0).map_err(io)?;
        let count = u32::from_le_bytes(first[8..12].try_into().unwrap()) as usize;
        let hlen = u32::from_le_bytes(first[12..16].try_into().unwrap()) as usize;
        if &first[0..4] != MAGIC || hlen != header_len(count) || hlen as u64 > len {
            return Ok(Vec::new());
        }
        let mut header = AlignedBuf::zeroed(hlen);
        if self.file.read_at(header.io(), 0).map_err(io)? < hlen {
            return Ok(Vec::new());
        }
        if crc32c::crc32c(&header[8..hlen]).to_le_bytes() != header[4..8] {
            return Ok(Vec::new());
        }
        let mut out = Vec::new();
        for i in 0..count {
            let e = FIXED + ENTRY * i;
            let pid = PageId::from_raw(u64::from_le_bytes(header[e..e + 8].try_into().unwrap()));
            let off = u64::from_le_bytes(header[e + 8..e + 16].try_into().unwrap());
            let size = u64::from_le_bytes(header[e + 16..e + 24].try_into().unwrap());
            if size == 0 || size % DIRECT_IO_ALIGN as u64 != 0 || off.checked_add(size).is_none_or(|end| end > len) {
                continue;
            }
            let size = size as usize;
            let mut image = AlignedBuf::zeroed(size);
            if self.file.read_at(image.io(), off).map_err(io)? < size {
                continue;
            }
            if let Ok(lsn) = page::verify(&image, pid) {
                out.push(Saved { pid, lsn, image });
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::FileBackend;

    fn sealed(pid: PageId, lsn: u64, fill: u8, size: usize) -> AlignedBuf {
        let mut b = AlignedBuf::zeroed(size);
        b.as_mut()[64..].fill(fill);
        page::seal(b.as_mut(), pid, lsn);
        b
    }

    #[test]
    fn batch_round_trips_and_torn_images_are_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let dw = DoubleWrite::open(&FileBackend::default(), dir.path()).unwrap();
        assert!(dw.saved().unwrap().is_empty());
        let pages: Vec<(PageId, AlignedBuf)> = (0..300u32)
            .map(|i| {
                let pid = PageId::new((i % 3) as u8, false, i as u64);
                (pid, sealed(pid, i as u64 + 1, i as u8, 4096 << (i % 3)))
            })
            .collect();
        let refs: Vec<(PageId, &[u8])> = pages.iter().map(|(p, b)| (*p, &b[..])).collect();
        dw.write(&refs).unwrap();
        let saved = dw.saved().unwrap();
        assert_eq!(saved.len(), 300);
        for (s, (pid, img)) in saved.iter().zip(&pages) {
            assert_eq!((s.pid, &s.image[..]), (*pid, &img[..]));
            assert_eq!(s.lsn, pid.index() + 1);
        }
        // Tear one image: it is skipped, the others survive.
        let raw = std::fs::read(dir.path().join(DOUBLEWRITE_FILE)).unwrap();
        let mut torn = raw.clone();
        let off = header_len(300) + 4096 * 2; // inside the image of page 1
        torn[off + 100] ^= 1;
        std::fs::write(dir.path().join(DOUBLEWRITE_FILE), &torn).unwrap();
        let saved = dw.saved().unwrap();
        assert_eq!(saved.len(), 299);
        assert!(saved.iter().all(|s| s.pid != pages[1].0));
        // A torn header voids the batch.
        let mut torn = raw;
        torn[20] ^= 1;
        std::fs::write(dir.path().join(DOUBLEWRITE_FILE), &torn).unwrap();
        assert!(dw.saved().unwrap().is_empty());
        dw.clear().unwrap();
        assert!(dw.saved().unwrap().is_empty());
    }

    #[test]
    fn a_small_batch_after_a_big_one_reads_back_exactly() {
        let dir = tempfile::tempdir().unwrap();
        let dw = DoubleWrite::open(&FileBackend::default(), dir.path()).unwrap();
        let big: Vec<(PageId, AlignedBuf)> = (0..8).map(|i| (PageId::new(2, false, i), sealed(PageId::new(2, false, i), 5, 1, 16384))).collect();
        dw.write(&big.iter().map(|(p, b)| (*p, &b[..])).collect::<Vec<_>>()).unwrap();
        // The file keeps the old batch's tail; the last entry must still be read at its size.
        let small = [
            (PageId::new(0, false, 3), sealed(PageId::new(0, false, 3), 9, 2, 4096)),
            (PageId::new(1, false, 1), sealed(PageId::new(1, false, 1), 9, 3, 8192)),
        ];
        dw.write(&small.iter().map(|(p, b)| (*p, &b[..])).collect::<Vec<_>>()).unwrap();
        let saved = dw.saved().unwrap();
        assert_eq!(saved.iter().map(|s| (s.pid, s.image.len())).collect::<Vec<_>>(), vec![(small[0].0, 4096), (small[1].0, 8192)]);
    }
}
