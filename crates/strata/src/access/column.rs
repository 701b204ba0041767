//! Columns of fixed-width little-endian integers.
//!
//! A column is a list of pages, each holding `count` values packed from the start of its
//! payload. Each import appends pages of one size class chosen for the size of what it
//! imports: large pages for large columns (fewer I/Os and fixes), never more than a
//! sixteenth of the pool (so a scan always finds room) and never more than 1 MiB.

use std::io::Read;

use serde::{Deserialize, Serialize};

use crate::buffer::BufferManager;
use crate::error::{Error, Result};
use crate::storage::{PageId, PAGE_HEADER_SIZE};

/// How values are encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ValueFormat {
    /// Unsigned 32-bit little-endian.
    U32le,
    /// Unsigned 64-bit little-endian.
    U64le,
    /// Signed 64-bit little-endian.
    I64le,
}

impl ValueFormat {
    /// Bytes per value.
    pub fn width(self) -> usize {
        match self {
            ValueFormat::U32le => 4,
            ValueFormat::U64le | ValueFormat::I64le => 8,
        }
    }
    /// Parses `u32le`, `u64le`, `i64le`.
    pub fn parse(s: &str) -> Option<ValueFormat> {
        match s {
            "u32le" => Some(ValueFormat::U32le),
            "u64le" => Some(ValueFormat::U64le),
            "i64le" => Some(ValueFormat::I64le),
            _ => None,
        }
    }
    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            ValueFormat::U32le => "u32le",
            ValueFormat::U64le => "u64le",
            ValueFormat::I64le => "i64le",
        }
    }
    /// Decodes value `i` of a packed byte slice as i128 (exact for every format).
    #[inline]
    pub fn get(self, bytes: &[u8], i: usize) -> i128 {
        match self {
            ValueFormat::U32le => u32::from_le_bytes(bytes[4 * i..4 * i + 4].try_into().unwrap()) as i128,
            ValueFormat::U64le => u64::from_le_bytes(bytes[8 * i..8 * i + 8].try_into().unwrap()) as i128,
            ValueFormat::I64le => i64::from_le_bytes(bytes[8 * i..8 * i + 8].try_into().unwrap()) as i128,
        }
    }
}

/// One page of a column.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ColumnPage {
    /// The page (raw id).
    pub pid: u64,
    /// Values stored in it.
    pub count: u32,
}

impl ColumnPage {
    /// The page id.
    pub fn page_id(&self) -> PageId {
        PageId::from_raw(self.pid)
    }
}

/// A column's metadata (kept in the catalog).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Column {
    /// Value encoding.
    pub format: ValueFormat,
    /// Total number of values.
    pub count: u64,
    /// Pages in order.
    pub pages: Vec<ColumnPage>,
}

impl Column {
    /// An empty column.
    pub fn new(format: ValueFormat) -> Column {
        Column { format, count: 0, pages: Vec::new() }
    }

    /// Checks the page list against itself (no page is read): valid size classes, no page
    /// claiming more values than it holds, and the counts adding up to `count`. The counts
    /// come from the catalog, and the operators slice pages by them: each checks this first,
    /// so that a damaged entry is an error, not a panic.
    pub fn check_shape(&self, bm: &BufferManager) -> Result<()> {
        let mut total = 0u64;
        for p in &self.pages {
            let pid = p.page_id();
            if pid.class() as usize >= bm.classes().count() {
                return Err(Error::Inconsistent(format!("column page {pid} has an invalid size class")));
            }
            let capacity = bm.payload_size(pid.class()) / self.format.width();
            if p.count as usize > capacity {
                return Err(Error::Inconsistent(format!("column claims {} values in page {pid}, which holds {capacity}", p.count)));
            }
            total += p.count as u64;
        }
        if total != self.count {
            return Err(Error::Inconsistent(format!("column claims {} values, its pages hold {total}", self.count)));
        }
        Ok(())
    }

    /// Payload bytes per page chosen for an import of `bytes` bytes under `pool`.
    pub fn page_payload_for(bm: &BufferManager, bytes: u64) -> usize {
        let min = bm.classes().min_page();
        let cap = (bm.pool_size() / 16).clamp(min, 1 << 20);
        let cap = 1u64 << (63 - cap.leading_zeros()); // largest power of two <= cap
        let want = (bytes / 64).max(1).next_power_of_two().clamp(min, cap);
        want as usize - PAGE_HEADER_SIZE
    }

    /// Appends the values read from `input` (exactly `len` bytes, a multiple of the value
    /// width) in new pages. `progress` is called with the bytes imported so far. On error
    /// the pages allocated by this call are freed and the column is unchanged.
    pub fn append(&mut self, bm: &BufferManager, input: &mut dyn Read, len: u64, progress: &mut dyn FnMut(u64)) -> Result<()> {
        let width = self.format.width();
        if !len.is_multiple_of(width as u64) {
            return Err(Error::InvalidInput(format!("input is {len} bytes, not a multiple of the {}-byte width of {}", width, self.format.name())));
        }
        let payload = Column::page_payload_for(bm, len);
        let per_page = payload / width;
        let mut buf = vec![0u8; per_page * width];
        let mut added: Vec<ColumnPage> = Vec::new();
        let mut done = 0u64;
        let result = (|| -> Result<()> {
            while done < len {
                let want = ((len - done) as usize).min(buf.len());
                input.read_exact(&mut buf[..want]).map_err(|e| Error::io("read input", "<import input>", e))?;
                let mut g = bm.alloc(payload)?;
                g.write(0, &buf[..want]);
                added.push(ColumnPage { pid: g.pid().raw(), count: (want / width) as u32 });
                drop(g);
                done += want as u64;
                progress(done);
            }
            Ok(())
        })();
        match result {
            Ok(()) => {
                self.count += added.iter().map(|p| p.count as u64).sum::<u64>();
                self.pages.extend(added);
                Ok(())
            }
            Err(e) => {
                for p in added {
                    let _ = bm.free(p.page_id());
                }
                Err(e)
            }
        }
    }
}
