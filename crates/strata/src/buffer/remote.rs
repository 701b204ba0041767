//! The buffer manager's side of the second memory tier ([`super::tier`]): clean victims are
//! offered to it, a miss asks it first, and a page whose disk copy changes is forgotten
//! there. `remote_versions` records the checksum of the image the tier holds of each page.

use super::manager::BufferManager;
use super::space::Space;
use super::tier::Fetched;
use crate::error::Result;
use crate::storage::{IoBufMut, PageId};

impl BufferManager {
    /// Offers the clean persistent victims (latched, about to be dropped) to the remote tier.
    pub(super) fn offer_to_remote(&self, victims: &[(PageId, &Space)]) {
        let Some(tier) = &self.remote else { return };
        let image = |pid: PageId, sp: &Space| -> &[u8] {
            // SAFETY: the evictor holds the victim's exclusive latch; the page is clean, so
            // its frame holds exactly its sealed disk image; others only load from it.
            unsafe { std::slice::from_raw_parts(sp.frame(pid.index()), sp.page_size() as usize) }
        };
        let mut offer = Vec::new();
        for &(pid, sp) in victims.iter().filter(|(pid, _)| !pid.is_temp()) {
            let crc = u32::from_le_bytes(image(pid, sp)[0..4].try_into().unwrap());
            // The tier holds this very image already (the page came from there, or was
            // offered before and has not changed): do not send it again.
            if self.remote_versions.insert(pid, crc) != Some(crc) {
                offer.push((pid, sp));
            }
        }
        for (pid, sp) in offer {
            tier.put(pid, image(pid, sp));
            self.counters.remote_puts.add(1);
        }
    }

    /// The page's disk copy is about to change or the page is freed: the remote tier's
    /// image of it must never be used again.
    pub(super) fn forget_remote(&self, pid: PageId) {
        if let Some(tier) = &self.remote {
            if self.remote_versions.remove(pid).is_some() {
                tier.remove(pid);
            }
        }
    }

    /// The remote tier as a source of a miss: fills the frame of page `index` (latched and
    /// charged by the caller) if the tier holds a verified image of the page's current
    /// version; false otherwise (the caller reads the disk). The tier writes the image
    /// straight into the frame ([`RemoteTier::get_into`](super::tier::RemoteTier::get_into)).
    pub(super) fn fill_from_remote(&self, sp: &Space, index: u64) -> bool {
        let Some(tier) = &self.remote else { return false };
        let pid = sp.pid(index);
        if !self.remote_versions.contains(pid) {
            return false;
        }
        let size = sp.page_size() as usize;
        // SAFETY: the caller holds the page's exclusive latch (no other writer); the frame is
        // mapped, aligned and `size` bytes long; optimistic readers only load from it.
        let buf = unsafe { IoBufMut::from_frame(sp.frame(index), size) };
        let answer = tier.get_into(pid, buf);
        let Some(crc) = self.remote_versions.get(pid) else {
            sp.frames.discard(index, 1);
            return false;
        };
        // SAFETY: as above: latched, mapped, `size` bytes; we only read what we wrote.
        let head = unsafe { std::slice::from_raw_parts(sp.frame(index), 4) };
        match answer {
            Ok(Fetched::Filled) if head == crc.to_le_bytes() => {
                if self.verify_frame(sp, index).is_ok() {
                    self.counters.remote_hits.add(1);
                    return true;
                }
                self.reject_remote(sp, index);
            }
            Ok(Fetched::Filled | Fetched::WrongSize) => self.reject_remote(sp, index),
            Ok(Fetched::Missing) => {
                sp.frames.discard(index, 1);
                self.counters.remote_misses.add(1);
                self.remote_versions.remove(pid);
            }
            Err(_) => {
                sp.frames.discard(index, 1);
                self.counters.remote_errors.add(1);
            }
        }
        false
    }

    /// The tier answered page `index` (latched) with an image that is not the page's
    /// current one: gives the frame back as a non-resident page's is (unbacked: zeros),
    /// counts it, and forgets the page there, so that the next eviction offers it again.
    fn reject_remote(&self, sp: &Space, index: u64) {
        sp.frames.discard(index, 1);
        self.counters.remote_rejected.add(1);
        self.forget_remote(sp.pid(index));
    }

    /// Puts what the tier answered for page `index` (latched by the caller) into its frame if
    /// it is the image of the page's current version and verifies there; counts the outcome.
    pub(super) fn install_remote(&self, sp: &Space, index: u64, answer: Result<Option<Vec<u8>>, String>) -> bool {
        let pid = sp.pid(index);
        let Some(crc) = self.remote_versions.get(pid) else { return false };
        let size = sp.page_size() as usize;
        match answer {
            Ok(Some(bytes)) if bytes.len() == size && bytes[0..4] == crc.to_le_bytes() => {
                // SAFETY: the caller holds the page's exclusive latch (no other writer); the
                // frame is mapped, aligned and `size` bytes long; optimistic readers only load.
                let mut buf = unsafe { IoBufMut::from_frame(sp.frame(index), size) };
                buf.copy_from(0, &bytes);
                if self.verify_frame(sp, index).is_ok() {
                    self.counters.remote_hits.add(1);
                    return true;
                }
                self.reject_remote(sp, index);
                false
            }
            Ok(Some(_)) => {
                // Forget it, so that the next eviction offers the page again.
                self.counters.remote_rejected.add(1);
                self.forget_remote(pid);
                false
            }
            Ok(None) => {
                self.counters.remote_misses.add(1);
                self.remote_versions.remove(pid);
                false
            }
            Err(_) => {
                self.counters.remote_errors.add(1);
                false
            }
        }
    }
}
