//! Data sets: a strata database whose class files every engine reads.
//!
//! The builder writes the pages through strata's own buffer manager (so they carry strata's
//! header and checksum and strata can open them); since page `i` of a class lives at byte
//! `i * page_size` of that class's file, the baselines read the very same files by offset and
//! hand out the same payload (the bytes after the 32-byte header).

use std::path::{Path, PathBuf};
use std::time::Instant;

use strata::storage::layout::class_file;
use strata::{BufferManager, Config, PAGE_HEADER_SIZE};

use crate::workload::fill_payload;
use crate::EngineError;

/// A scratch directory removed (with everything in it) when dropped.
#[derive(Debug)]
pub struct ScratchDir {
    path: PathBuf,
}

impl ScratchDir {
    /// A new, empty directory `strata-bench-<pid>-<n>` under `parent` (the system temporary
    /// directory when `None`).
    pub fn new(parent: Option<&Path>) -> std::io::Result<ScratchDir> {
        let parent = parent.map(Path::to_owned).unwrap_or_else(std::env::temp_dir);
        std::fs::create_dir_all(&parent)?;
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
        for n in 0..1000u32 {
            let path = parent.join(format!("strata-bench-{}-{}", std::process::id(), nanos.wrapping_add(n)));
            match std::fs::create_dir(&path) {
                Ok(()) => return Ok(ScratchDir { path }),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            }
        }
        Err(std::io::Error::other("could not create a scratch directory"))
    }
    /// Its path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// One data file to build: `pages` pages of `page_size` bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileSpec {
    /// Page size (a power of two, at least the data set's smallest page).
    pub page_size: u64,
    /// Number of pages.
    pub pages: u64,
}

/// One data file of a data set.
#[derive(Clone, Debug)]
pub struct DataFile {
    /// The file (a strata class file).
    pub path: PathBuf,
    /// Its page size in bytes, header included.
    pub page_size: usize,
    /// Its number of pages.
    pub pages: u64,
    /// strata's size class of its pages.
    pub class: u8,
    /// Where the payload starts in a page image (strata's header size).
    pub payload_offset: usize,
}

impl DataFile {
    /// Payload bytes per page.
    pub fn payload_len(&self) -> usize {
        self.page_size - self.payload_offset
    }
    /// Bytes in the file.
    pub fn bytes(&self) -> u64 {
        self.pages * self.page_size as u64
    }
}

/// A strata database plus the description of its data files, in the order of the specs it
/// was built from ([`crate::Page::file`] indexes this list).
#[derive(Debug)]
pub struct DataSet {
    /// The database directory.
    pub db_dir: PathBuf,
    /// Its smallest page size.
    pub min_page: u64,
    /// The data files.
    pub files: Vec<DataFile>,
    /// Seconds the build took.
    pub build_seconds: f64,
}

impl DataSet {
    /// Builds a new database in `dir` (which must not exist) with one data file per spec,
    /// each of a distinct page size. Page `i` of file `k` holds
    /// [`crate::workload::content_word`]`(k, i, w)` at payload word `w`.
    pub fn build(dir: &Path, min_page: u64, specs: &[FileSpec]) -> Result<DataSet, EngineError> {
        let start = Instant::now();
        let gen_pool = 64u64 << 20;
        let max_page = specs.iter().map(|s| s.page_size).max().unwrap_or(min_page);
        let bm = BufferManager::create(Config::new(dir).pool_size(gen_pool.max(4 * max_page)).min_page(min_page))?;
        let classes = bm.classes();
        let mut files = Vec::new();
        for (k, spec) in specs.iter().enumerate() {
            let class = classes
                .class_for(spec.page_size)
                .filter(|&c| classes.page_size(c) == spec.page_size)
                .ok_or_else(|| EngineError(format!("page size {} is not a size class of a database with {min_page}-byte pages", spec.page_size)))?;
            if files.iter().any(|f: &DataFile| f.class == class) {
                return Err(EngineError(format!("two data files with page size {}", spec.page_size)));
            }
            let payload = spec.page_size as usize - PAGE_HEADER_SIZE;
            let mut buf = vec![0u8; payload];
            for i in 0..spec.pages {
                let mut g = bm.alloc(payload)?;
                let pid = g.pid();
                if pid.class() != class || pid.index() != i {
                    return Err(EngineError(format!("fresh database allocated page {pid} where class {class} index {i} was expected")));
                }
                fill_payload(k as u16, i, &mut buf);
                g.write(0, &buf);
            }
            files.push(DataFile {
                path: class_file(dir, class),
                page_size: spec.page_size as usize,
                pages: spec.pages,
                class,
                payload_offset: PAGE_HEADER_SIZE,
            });
        }
        bm.close()?;
        Ok(DataSet { db_dir: dir.to_owned(), min_page, files, build_seconds: start.elapsed().as_secs_f64() })
    }

    /// Bytes in all data files.
    pub fn bytes(&self) -> u64 {
        self.files.iter().map(DataFile::bytes).sum()
    }
}
