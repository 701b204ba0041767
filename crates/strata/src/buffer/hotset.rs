//! Two-tier fast restart: a snapshot of the pool's hot set in the remote tier.
//!
//! At `close` (after the final checkpoint, so every resident page is clean and equal to its
//! disk copy) the images of the resident persistent pages are put into the remote tier and a
//! snapshot — the pages' ids and checksums, stamped with the nonce of that checkpoint — is
//! stored next to them. At `open`, if the stamp equals the nonce of the database's current
//! checkpoint (so nothing changed since: every durable change goes through a checkpoint, and
//! every checkpoint draws a new random nonce), the checksums are trusted as the current
//! versions and the pages are loaded, from the remote tier where it still has them (each
//! image verified as usual) and from disk where not. A stale, foreign or damaged snapshot is
//! ignored: the restart is simply cold.
//!
//! Snapshot format (little-endian): magic `SHS1`, nonce u64, count u64, then per page its
//! id u64 and image CRC u32, then a CRC-32C of everything before it.

use std::sync::atomic::Ordering;
use std::time::Instant;

use serde::Serialize;

use super::manager::BufferManager;
use super::state::EVICTED;
use crate::error::{Error, Result};
use crate::storage::PageId;

/// Pages fetched per round trip while warming.
const WARM_BATCH: usize = 32;
/// Name of the snapshot in the remote tier.
pub const SNAPSHOT: &str = "hot-set";
const MAGIC: &[u8; 4] = b"SHS1";

/// What a warm restart did.
#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq)]
pub struct WarmReport {
    /// Pages listed in a valid snapshot.
    pub listed: u64,
    /// Pages loaded into the pool (from the remote tier or the disk).
    pub loaded: u64,
    /// Of which served by the remote tier.
    pub from_remote: u64,
    /// Seconds spent.
    pub seconds: f64,
    /// Whether a snapshot matching this database's last checkpoint was found.
    pub valid: bool,
}

fn remote_err(op: &str, e: String) -> Error {
    Error::InvalidInput(format!("remote tier: {op} failed: {e}"))
}

impl BufferManager {
    /// Puts the images of the resident, clean persistent pages into the remote tier and
    /// stores the snapshot of their ids. Call after a checkpoint (`close` does). Returns the
    /// number of pages in the snapshot.
    pub fn save_hot_set(&self) -> Result<u64> {
        let Some(tier) = &self.remote else { return Ok(0) };
        let mut pids = Vec::new();
        self.resident.for_each(|pid| {
            if !pid.is_temp() {
                pids.push(pid);
            }
        });
        pids.sort();
        let mut out = Vec::with_capacity(20 + 12 * pids.len() + 4);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&self.durability.nonce.load(Ordering::Relaxed).to_le_bytes());
        out.extend_from_slice(&0u64.to_le_bytes());
        let mut count = 0u64;
        for pid in pids {
            let Ok(sp) = self.lookup(pid) else { continue };
            let st = sp.state(pid.index());
            let w = st.load();
            if w.state() == EVICTED || w.dirty() || !st.try_lock_shared(w) {
                continue;
            }
            // SAFETY: we hold a shared latch on a resident clean page: nobody writes the
            // frame, which holds the page's sealed disk image.
            let image = unsafe { std::slice::from_raw_parts(sp.frame(pid.index()), sp.page_size() as usize) };
            let crc = u32::from_le_bytes(image[0..4].try_into().unwrap());
            tier.put(pid, image);
            self.remote_versions.insert(pid, crc);
            st.unlock_shared();
            out.extend_from_slice(&pid.raw().to_le_bytes());
            out.extend_from_slice(&crc.to_le_bytes());
            count += 1;
        }
        out[12..20].copy_from_slice(&count.to_le_bytes());
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        tier.sync().map_err(|e| remote_err("storing the hot set", e))?;
        tier.put_meta(SNAPSHOT, &out).map_err(|e| remote_err("storing the hot-set snapshot", e))?;
        Ok(count)
    }

    /// Fetches the latched, reserved pages from the tier in one round trip and installs the
    /// verified ones; the others are left evicted (read from disk when first fixed).
    fn warm_install(&self, tier: &dyn super::tier::RemoteTier, latched: &[(PageId, &super::space::Space)], report: &mut WarmReport) {
        if latched.is_empty() {
            return;
        }
        let request: Vec<(PageId, usize)> = latched.iter().map(|&(pid, sp)| (pid, sp.page_size() as usize)).collect();
        for (&(pid, sp), answer) in latched.iter().zip(tier.get_many(&request)) {
            let st = sp.state(pid.index());
            if self.install_remote(sp, pid.index(), answer) {
                self.install(sp, pid.index());
                st.unlock_exclusive_unchanged(false);
                report.loaded += 1;
            } else {
                self.release(sp.page_size());
                st.unlock_still_evicted();
            }
        }
    }

    /// What the warm restart at open did (`None`: none was configured, or the tier failed).
    pub fn warm_report(&self) -> Option<WarmReport> {
        *self.warm_report.lock()
    }

    /// Loads the hot set saved by the last `close`, if the database is unchanged since.
    pub fn warm_from_remote(&self) -> Result<WarmReport> {
        let start = Instant::now();
        let mut report = WarmReport::default();
        let Some(tier) = &self.remote else { return Ok(report) };
        let Some(b) = tier.get_meta(SNAPSHOT).map_err(|e| remote_err("reading the hot-set snapshot", e))? else { return Ok(report) };
        let nonce = self.durability.nonce.load(Ordering::Relaxed);
        let valid = b.len() >= 24
            && &b[0..4] == MAGIC
            && crc32c::crc32c(&b[..b.len() - 4]).to_le_bytes() == b[b.len() - 4..]
            && u64::from_le_bytes(b[4..12].try_into().unwrap()) == nonce
            && nonce != 0;
        let count = if valid { u64::from_le_bytes(b[12..20].try_into().unwrap()) } else { 0 };
        if !valid || b.len() as u64 != 24 + 12 * count {
            return Ok(report);
        }
        report.valid = true;
        report.listed = count;
        let entries: Vec<(PageId, u32)> = b[20..b.len() - 4]
            .chunks_exact(12)
            .map(|e| (PageId::from_raw(u64::from_le_bytes(e[0..8].try_into().unwrap())), u32::from_le_bytes(e[8..12].try_into().unwrap())))
            .filter(|(pid, _)| self.is_allocated(*pid))
            .collect();
        for &(pid, crc) in entries.iter() {
            self.remote_versions.insert(pid, crc);
        }
        let hits = self.counters.remote_hits.get();
        'batches: for batch in entries.chunks(WARM_BATCH) {
            // Latch and reserve the batch's evicted pages, fetch them in one round trip.
            let mut latched = Vec::new();
            for &(pid, _) in batch {
                let Ok(sp) = self.lookup(pid) else { continue };
                let st = sp.state(pid.index());
                if !st.try_lock_evicted(st.load()) {
                    continue;
                }
                if self.try_reserve(sp.page_size()).is_err() {
                    // The pool is full (the snapshot came from a larger pool): stop here.
                    st.unlock_still_evicted();
                    self.warm_install(tier.as_ref(), &latched, &mut report);
                    break 'batches;
                }
                latched.push((pid, sp));
            }
            self.warm_install(tier.as_ref(), &latched, &mut report);
        }
        report.from_remote = self.counters.remote_hits.get() - hits;
        report.seconds = start.elapsed().as_secs_f64();
        Ok(report)
    }
}
