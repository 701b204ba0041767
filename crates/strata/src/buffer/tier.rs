//! The interface to a second memory tier: a cache of clean page images on other machines
//! (Valkey/Redis in `strata-remote`), between the pool and the disk. The core has no network
//! code; it only calls this trait, and it never trusts what comes back.
//!
//! * **Victim caching.** When a clean persistent page leaves the pool, its sealed image is
//!   offered with [`RemoteTier::put`] (the implementation queues it; the evicting thread never
//!   waits for the network). The manager remembers the image's checksum.
//! * **Misses** of pages it remembers try [`RemoteTier::get_into`] (straight into the frame)
//!   before the disk. What comes back is used only if it verifies as that page (checksum,
//!   id) *and* its checksum is the one remembered for the page's current disk version;
//!   anything else (an object from an older version, another database, a tampered or
//!   truncated value) is counted as rejected and the page is read from disk. Errors count
//!   and fall back to the disk too.
//! * **Safety.** Only clean pages go to the tier, so it never holds the only copy of
//!   anything: a server that evicts keys, restarts or disappears costs speed, never data.
//!   When a page's disk copy changes (write-back) or the page is freed, the manager forgets
//!   its checksum first and then asks the tier to drop the object.
//! * **Restart.** The remembered checksums are not persisted, so after a restart nothing in
//!   the tier is trusted until pages are evicted again.

use std::fmt;

use serde::Serialize;

use crate::storage::{IoBufMut, PageId};

/// What [`RemoteTier::get_into`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fetched {
    /// The tier holds an object of exactly the buffer's length; the buffer holds it now.
    Filled,
    /// The tier holds no object for the page (or lost part of a chunked one).
    Missing,
    /// The tier holds an object of another length (truncated or damaged). The buffer's
    /// contents are unspecified.
    WrongSize,
}

/// A second tier of memory for clean page images.
pub trait RemoteTier: Send + Sync + fmt::Debug {
    /// Offers a copy of the sealed image of a clean page that leaves the pool. Must not wait
    /// for the network: queue it, or drop it when the queue is full.
    fn put(&self, pid: PageId, image: &[u8]);
    /// The stored image of `pid`, if the tier has one (`len`: the page size).
    fn get(&self, pid: PageId, len: usize) -> Result<Option<Vec<u8>>, String>;
    /// [`get`](Self::get) straight into `dst` (the page's frame; `dst.len()` is the page
    /// size), so that a hit costs no intermediate buffer. Whatever it returns, `dst` may
    /// have been written: the caller verifies a [`Fetched::Filled`] image and discards the
    /// frame otherwise. Default: `get`, then one copy.
    fn get_into(&self, pid: PageId, mut dst: IoBufMut<'_>) -> Result<Fetched, String> {
        match self.get(pid, dst.len())? {
            None => Ok(Fetched::Missing),
            Some(image) if image.len() == dst.len() => {
                dst.copy_from(0, &image);
                Ok(Fetched::Filled)
            }
            Some(_) => Ok(Fetched::WrongSize),
        }
    }
    /// Several lookups at once (one round trip where the tier can): one result per page, in
    /// order. Default: one `get` after the other.
    fn get_many(&self, pages: &[(PageId, usize)]) -> Vec<Result<Option<Vec<u8>>, String>> {
        pages.iter().map(|&(pid, len)| self.get(pid, len)).collect()
    }
    /// Drops the stored image of `pid` (best effort, must not wait for the network).
    fn remove(&self, pid: PageId);
    /// Stores a small named blob of this database (the hot-set snapshot) and returns once it
    /// is stored. Default: unsupported.
    fn put_meta(&self, _name: &str, _bytes: &[u8]) -> Result<(), String> {
        Err("this remote tier cannot store snapshots".into())
    }
    /// The blob stored under `name`, if any. Default: none.
    fn get_meta(&self, _name: &str) -> Result<Option<Vec<u8>>, String> {
        Ok(None)
    }
    /// Returns once every queued `put` is stored (or dropped). Default: nothing queued.
    fn sync(&self) -> Result<(), String> {
        Ok(())
    }
    /// The tier's own counters (bytes sent, queue drops, ...), for `stats`.
    fn stats(&self) -> RemoteStats {
        RemoteStats::default()
    }
}

/// Counters of a remote tier, as the buffer manager and the implementation see it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RemoteStats {
    /// Misses served from the tier.
    pub hits: u64,
    /// Lookups of remembered pages that the tier did not have.
    pub misses: u64,
    /// Objects returned that failed verification or were stale (then read from disk).
    pub rejected: u64,
    /// Lookups that failed (server gone, timeout); served from disk.
    pub errors: u64,
    /// Page images offered on eviction.
    pub puts: u64,
    /// Page images dropped because the queue was full (implementation).
    pub dropped: u64,
    /// Bytes sent to the tier (implementation).
    pub bytes_sent: u64,
    /// Bytes received from the tier (implementation).
    pub bytes_received: u64,
}

impl fmt::Display for RemoteStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} hits, {} misses, {} rejected, {} errors, {} puts", self.hits, self.misses, self.rejected, self.errors, self.puts)
    }
}
