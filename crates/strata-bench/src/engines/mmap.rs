//! `mmap`: the data files mapped read-only with `mmap`; the OS page cache decides what stays
//! in memory (LMDB style). Its memory can be capped only from outside the process: a
//! cgroup v2 `memory.max` ([`CgroupCap`]) where the machine lets us create one; otherwise it
//! runs uncapped and the output says so.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;

use super::open_data;
use crate::dataset::DataFile;
use crate::{EResult, EngineError, IoCounters, Page, PageStore};

struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
    page_size: usize,
    payload_offset: usize,
    pages: u64,
    _file: File,
}

/// The data files, memory-mapped.
pub struct MmapStore {
    maps: Vec<Mapping>,
    cap: serde_json::Map<String, serde_json::Value>,
}

// SAFETY: the mappings are read-only views of files that (by `open`'s contract) nobody
// modifies while the store lives; sharing `&[u8]` views of them between threads is sharing
// immutable memory.
unsafe impl Send for MmapStore {}
// SAFETY: as above.
unsafe impl Sync for MmapStore {}

/// The process's `read_bytes` from `/proc/self/io` (bytes it caused to be read from storage).
fn proc_read_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/io")
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("read_bytes:").and_then(|v| v.trim().parse().ok())))
        .unwrap_or(0)
}

impl MmapStore {
    /// Maps `files` read-only. With `drop_cache`, the files' pages are first dropped from the
    /// OS page cache (`posix_fadvise(DONTNEED)`), so that the engine starts cold.
    ///
    /// # Safety
    /// The files must not be modified or truncated, by this or any other process, while the
    /// store lives (the store hands out `&[u8]` views of the mapped bytes).
    pub unsafe fn open(files: &[DataFile], drop_cache: bool) -> EResult<MmapStore> {
        let mut maps = Vec::new();
        for f in files {
            let (file, _) = open_data(&f.path, false).map_err(|e| EngineError(format!("open {}: {e}", f.path.display())))?;
            let len = file.metadata()?.len() as usize;
            if (len as u64) < f.bytes() {
                return Err(EngineError(format!("{} holds {len} bytes, {} expected", f.path.display(), f.bytes())));
            }
            if drop_cache {
                // SAFETY: advisory call on an open descriptor; it changes no memory of ours.
                unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
            }
            // SAFETY: a fresh shared read-only mapping of an open file at an address of the
            // kernel's choosing; no existing memory is affected. `len > 0` (checked below).
            let p = if len == 0 {
                libc::MAP_FAILED
            } else {
                // SAFETY: see above.
                unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_SHARED, file.as_raw_fd(), 0) }
            };
            if p == libc::MAP_FAILED {
                return Err(EngineError(format!("mmap {}: {}", f.path.display(), std::io::Error::last_os_error())));
            }
            maps.push(Mapping {
                ptr: NonNull::new(p.cast()).expect("mmap returned null"),
                len,
                page_size: f.page_size,
                payload_offset: f.payload_offset,
                pages: f.pages,
                _file: file,
            });
        }
        let mut cap = serde_json::Map::new();
        cap.insert("capped".into(), false.into());
        Ok(MmapStore { maps, cap })
    }

    /// Records how the engine's memory was capped (for [`PageStore::describe`]).
    pub fn set_cap_info(&mut self, info: serde_json::Map<String, serde_json::Value>) {
        self.cap = info;
    }

    /// Bytes of the mappings resident in memory now (`mincore`).
    pub fn resident_bytes(&self) -> u64 {
        let os_page = 4096usize;
        let mut total = 0u64;
        for m in &self.maps {
            let mut vec = vec![0u8; m.len.div_ceil(os_page)];
            // SAFETY: the range is exactly our live mapping; `vec` has one byte per OS page
            // of it, as mincore requires.
            let r = unsafe { libc::mincore(m.ptr.as_ptr().cast(), m.len, vec.as_mut_ptr()) };
            if r == 0 {
                total += vec.iter().filter(|&&b| b & 1 != 0).count() as u64 * os_page as u64;
            }
        }
        total
    }

    fn page_bytes(&self, page: Page) -> EResult<&[u8]> {
        let m = self.maps.get(page.file as usize).ok_or_else(|| EngineError(format!("no data file {}", page.file)))?;
        if page.index >= m.pages {
            return Err(EngineError(format!("page {} of file {} is beyond its {} pages", page.index, page.file, m.pages)));
        }
        let start = page.index as usize * m.page_size;
        // SAFETY: `start + page_size <= pages * page_size <= len`: inside the live mapping,
        // which is read-only and (by `open`'s contract) not modified while the store lives.
        Ok(unsafe { std::slice::from_raw_parts(m.ptr.as_ptr().add(start + m.payload_offset), m.page_size - m.payload_offset) })
    }
}

impl Drop for MmapStore {
    fn drop(&mut self) {
        for m in &self.maps {
            // SAFETY: unmaps exactly a mapping made in `open`; every view borrows the store.
            unsafe { libc::munmap(m.ptr.as_ptr().cast(), m.len) };
        }
    }
}

impl PageStore for MmapStore {
    fn name(&self) -> &'static str {
        "mmap"
    }

    fn page_size(&self, file: u16) -> usize {
        self.maps[file as usize].page_size
    }

    fn read(&self, page: Page, f: &mut dyn FnMut(&[u8])) -> EResult<()> {
        f(self.page_bytes(page)?);
        Ok(())
    }

    fn read_pinned(&self, pages: &[Page], f: &mut dyn FnMut(usize, &[u8])) -> EResult<()> {
        let views = pages.iter().map(|&p| self.page_bytes(p)).collect::<EResult<Vec<_>>>()?;
        for (i, v) in views.into_iter().enumerate() {
            f(i, v);
        }
        Ok(())
    }

    fn counters(&self) -> IoCounters {
        // The page cache keeps no per-mapping counters; the process's storage reads are the
        // mapping's while it is the only engine running.
        IoCounters { hits: None, misses: None, bytes_read: proc_read_bytes() }
    }

    fn describe(&self) -> serde_json::Map<String, serde_json::Value> {
        let mut m = self.cap.clone();
        m.insert("resident_bytes".into(), self.resident_bytes().into());
        m
    }
}

/// A cgroup v2 memory cap on this process: while it lives, the process runs in a child
/// cgroup with `memory.max` set, so the OS page cache of its mappings is limited to it.
/// Dropping it moves the process back to its cgroup and removes the child.
#[derive(Debug)]
pub struct CgroupCap {
    dir: PathBuf,
    home: PathBuf,
    limit: u64,
}

fn cgroup2_root() -> Result<PathBuf, String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").map_err(|e| format!("read /proc/self/mountinfo: {e}"))?;
    for line in info.lines() {
        let Some((pre, post)) = line.split_once(" - ") else {
            continue;
        };
        if post.split_whitespace().next() == Some("cgroup2") {
            if let Some(mp) = pre.split_whitespace().nth(4) {
                return Ok(PathBuf::from(mp));
            }
        }
    }
    Err("no cgroup v2 hierarchy is mounted".into())
}

fn write(path: &Path, what: &str) -> Result<(), String> {
    std::fs::write(path, what).map_err(|e| format!("write {what:?} to {}: {e}", path.display()))
}

impl CgroupCap {
    /// Checks whether a cap can be made, without making one: `Err` says why not.
    pub fn probe() -> Result<(), String> {
        let root = cgroup2_root()?;
        let controllers = std::fs::read_to_string(root.join("cgroup.controllers")).map_err(|e| format!("read {}/cgroup.controllers: {e}", root.display()))?;
        if !controllers.split_whitespace().any(|c| c == "memory") {
            return Err(format!(
                "the cgroup v2 hierarchy at {} has no memory controller (controllers: {}); the memory controller is bound elsewhere (cgroup v1?)",
                root.display(),
                controllers.trim()
            ));
        }
        let own = std::fs::read_to_string("/proc/self/cgroup").map_err(|e| format!("read /proc/self/cgroup: {e}"))?;
        if !own.lines().any(|l| l.starts_with("0::")) {
            return Err("this process is not in a cgroup v2 hierarchy".into());
        }
        let meta = std::fs::metadata(&root).map_err(|e| format!("{}: {e}", root.display()))?;
        if meta.permissions().readonly() {
            return Err(format!("{} is read-only", root.display()));
        }
        Ok(())
    }

    /// Moves this process into a new child cgroup of the v2 root with `memory.max = limit`.
    pub fn enter(limit: u64) -> Result<CgroupCap, String> {
        Self::probe()?;
        let root = cgroup2_root()?;
        let own = std::fs::read_to_string("/proc/self/cgroup").map_err(|e| e.to_string())?;
        let rel = own.lines().find_map(|l| l.strip_prefix("0::")).unwrap_or("/").trim().trim_start_matches('/').to_owned();
        let home = root.join(rel);
        let subtree = std::fs::read_to_string(root.join("cgroup.subtree_control")).unwrap_or_default();
        if !subtree.split_whitespace().any(|c| c == "memory") {
            write(&root.join("cgroup.subtree_control"), "+memory")?;
        }
        let dir = root.join(format!("strata-bench-{}", std::process::id()));
        match std::fs::create_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(format!("create cgroup {}: {e}", dir.display())),
        }
        let cap = CgroupCap { dir, home, limit };
        write(&cap.dir.join("memory.max"), &limit.to_string())?;
        let _ = write(&cap.dir.join("memory.swap.max"), "0");
        write(&cap.dir.join("cgroup.procs"), &std::process::id().to_string())?;
        Ok(cap)
    }

    /// The limit in bytes.
    pub fn limit(&self) -> u64 {
        self.limit
    }
}

impl Drop for CgroupCap {
    fn drop(&mut self) {
        let _ = write(&self.home.join("cgroup.procs"), &std::process::id().to_string());
        let _ = std::fs::remove_dir(&self.dir);
    }
}
