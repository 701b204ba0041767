//! Key-value leaves: lookups and in-place changes (a change that does not fit is left to a
//! split, see the parent module).

use super::node::{self, Src, HDR, SLOT, W_DEAD, W_HEAP, W_KIND_COUNT};
use super::{write_image, BTree};
use crate::buffer::{ExclusiveGuard, Restart};
use crate::error::Result;
use crate::txn::Transaction;

/// Finds `key`: the value's (offset, length), checked against the page.
/// `fences` (the leaf's, from its parent) only guide the search.
pub fn find<S: Src + ?Sized>(s: &S, key: &[u8], fences: node::Fences, buf: &mut Vec<u8>) -> Result<Option<(usize, usize)>, Restart> {
    let h = node::header(s)?;
    let (i, found) = node::lower_bound_in(s, h.count, key, fences, buf)?;
    if !found {
        return Ok(None);
    }
    let (off, len, _, vlen) = node::slot(s, i)?;
    let voff = off + len;
    let vlen = usize::try_from(vlen).map_err(|_| Restart)?;
    if voff.checked_add(vlen).is_none_or(|e| e > s.size()) {
        return Err(Restart);
    }
    Ok(Some((voff, vlen)))
}

fn slot_bytes(off: usize, key: &[u8], vlen: usize) -> [u8; SLOT] {
    let mut b = [0u8; SLOT];
    b[0..8].copy_from_slice(&((off as u64) | ((key.len() as u64) << 32)).to_le_bytes());
    b[8..16].copy_from_slice(&(vlen as u64).to_le_bytes());
    b[16..24].copy_from_slice(&node::prefix(key).to_le_bytes());
    b
}

fn header_word(kind: u8, count: usize) -> [u8; 8] {
    ((kind as u64) | ((count as u64) << 32)).to_le_bytes()
}

/// The latched leaf's header and the position of `key` in it (whether it is there).
fn locate(tx: &Transaction<'_>, g: &ExclusiveGuard<'_>, key: &[u8], buf: &mut Vec<u8>) -> Result<(node::Header, usize, bool)> {
    let corrupt = |_| BTree::corrupt(tx.buffer(), g.pid(), "impossible leaf");
    let h = node::header(g.data()).map_err(corrupt)?;
    let (p, found) = node::lower_bound(g.data(), h.count, key, buf).map_err(corrupt)?;
    Ok((h, p, found))
}

/// Inserts or replaces `key` in the latched leaf if it has room (compacting it if that
/// makes room). Returns false, having changed nothing, when it does not fit.
pub fn upsert(tx: &mut Transaction<'_>, g: &mut ExclusiveGuard<'_>, key: &[u8], value: &[u8], buf: &mut Vec<u8>) -> Result<bool> {
    let (h, p, found) = locate(tx, g, key, buf)?;
    let corrupt = |_| BTree::corrupt(tx.buffer(), g.pid(), "impossible leaf");
    let mut reclaim = h.dead;
    if found {
        let (off, len, _, vlen) = node::slot(g.data(), p).map_err(corrupt)?;
        if vlen as usize == value.len() {
            tx.write_latched(g, off + len, value)?;
            return Ok(true);
        }
        reclaim += len + vlen as usize;
    }
    let free = h.heap - (HDR + h.count * SLOT);
    let add = if found { 0 } else { SLOT } + key.len() + value.len();
    if add <= free {
        let heap = h.heap - key.len() - value.len();
        let mut kv = Vec::with_capacity(key.len() + value.len());
        kv.extend_from_slice(key);
        kv.extend_from_slice(value);
        tx.write_latched(g, heap, &kv)?;
        let new_slot = slot_bytes(heap, key, value.len());
        let count = if found {
            tx.write_latched(g, HDR + p * SLOT, &new_slot)?;
            tx.write_latched(g, W_DEAD, &(reclaim as u64).to_le_bytes())?;
            h.count
        } else {
            let mut slots = Vec::with_capacity((h.count - p + 1) * SLOT);
            slots.extend_from_slice(&new_slot);
            slots.extend_from_slice(&g.data()[HDR + p * SLOT..HDR + h.count * SLOT]);
            tx.write_latched(g, HDR + p * SLOT, &slots)?;
            h.count + 1
        };
        let mut hw = [0u8; 16];
        hw[..8].copy_from_slice(&header_word(h.kind, count));
        hw[8..].copy_from_slice(&(heap as u64).to_le_bytes());
        tx.write_latched(g, W_KIND_COUNT, &hw)?;
        debug_assert_eq!(W_HEAP, 8);
        return Ok(true);
    }
    if add > free + reclaim {
        return Ok(false);
    }
    // Fits once the dead bytes are reclaimed: rebuild the leaf compactly.
    let (_, mut e) = node::decode(g.data()).map_err(corrupt)?;
    if found {
        e.items.remove(p);
    }
    e.insert(p, key, value, value.len() as u64);
    let img = node::build(g.len(), h.kind, &e, 0..e.len(), 0, [0, 0]);
    write_image(tx, g, &img)?;
    Ok(true)
}

/// Removes `key` from the latched leaf; whether it was there.
pub fn remove(tx: &mut Transaction<'_>, g: &mut ExclusiveGuard<'_>, key: &[u8], buf: &mut Vec<u8>) -> Result<bool> {
    let (h, p, found) = locate(tx, g, key, buf)?;
    if !found {
        return Ok(false);
    }
    let d = g.data();
    let (_, len, _, vlen) = node::slot(d, p).map_err(|_| BTree::corrupt(tx.buffer(), g.pid(), "impossible leaf"))?;
    if p + 1 < h.count {
        let rest = d[HDR + (p + 1) * SLOT..HDR + h.count * SLOT].to_vec();
        tx.write_latched(g, HDR + p * SLOT, &rest)?;
    }
    let mut hw = [0u8; 24];
    hw[..8].copy_from_slice(&header_word(h.kind, h.count - 1));
    hw[8..16].copy_from_slice(&(h.heap as u64).to_le_bytes());
    hw[16..].copy_from_slice(&((h.dead + len + vlen as usize) as u64).to_le_bytes());
    tx.write_latched(g, W_KIND_COUNT, &hw)?;
    Ok(true)
}
