//! Pre-aggregation in front of the hash aggregation of [`super::agg`]: a small table on
//! the Rust heap, of at most [`GROUPS`] groups and [`KEY_BYTES`] bytes of keys, merges the
//! rows of the groups it holds as decoded partial states ([`St`]), without the encoding,
//! temporary-page probe and decoding that each row costs [`HashAgg::push`]. When it is full
//! it hands its groups to the hash aggregation (in the order they arrived, so groups reach
//! it in the order of their first rows, as without it) and starts over; when its groups
//! turned out to see fewer than two rows each it steps aside for the rest of the input
//! (nearly unique keys gain nothing from it). Partial states merge (see [`St::merge`]),
//! so the results are those of the hash aggregation alone (f64 sums added in another
//! association; an i64 sum is an error exactly when its value overflows).

use super::agg::{encode_states, AggKind, HashAgg, St};
use super::rows::hash_bytes;
use crate::error::Result;

/// Groups held at most.
pub const GROUPS: usize = 1024;
/// Bytes of keys held at most.
pub const KEY_BYTES: usize = 256 << 10;

const SLOTS: usize = GROUPS * 4;

/// The pre-aggregation table.
pub struct GroupCache {
    kinds: Vec<AggKind>,
    /// Open addressing: group index + 1, 0 empty.
    slots: Vec<u32>,
    /// Per group: hash, key offset, key length.
    groups: Vec<(u64, usize, usize)>,
    keys: Vec<u8>,
    /// `kinds.len()` states per group.
    states: Vec<St>,
    rows: u64,
    off: bool,
    sb: Vec<u8>,
}

impl GroupCache {
    pub fn new(kinds: Vec<AggKind>) -> GroupCache {
        GroupCache { kinds, slots: vec![0; SLOTS], groups: Vec::new(), keys: Vec::new(), states: Vec::new(), rows: 0, off: false, sb: Vec::new() }
    }

    /// Whether rows should bypass the cache (go to the hash aggregation one by one).
    pub fn is_off(&self) -> bool {
        self.off
    }

    /// The states of the group of `key` (created empty if new), flushing into `main` first
    /// when the cache is full. `None`: the cache is off, push the row directly.
    pub fn states(&mut self, key: &[u8], main: &mut HashAgg<'_>) -> Result<Option<&mut [St]>> {
        if self.off {
            return Ok(None);
        }
        let h = hash_bytes(key);
        let mut s = (h as usize) & (SLOTS - 1);
        loop {
            match self.slots[s] as usize {
                0 => break,
                g => {
                    let (gh, o, l) = self.groups[g - 1];
                    if gh == h && &self.keys[o..o + l] == key {
                        self.rows += 1;
                        let n = self.kinds.len();
                        return Ok(Some(&mut self.states[(g - 1) * n..g * n]));
                    }
                }
            }
            s = (s + 1) & (SLOTS - 1);
        }
        if self.groups.len() >= GROUPS || self.keys.len() + key.len() > KEY_BYTES {
            let (rows, groups) = (self.rows, self.groups.len() as u64);
            self.flush(main)?;
            if rows < 2 * groups {
                self.off = true;
                return Ok(None);
            }
            return self.states(key, main);
        }
        self.rows += 1;
        let g = self.groups.len();
        self.groups.push((h, self.keys.len(), key.len()));
        self.keys.extend_from_slice(key);
        self.slots[s] = (g + 1) as u32;
        let n = self.kinds.len();
        self.states.extend(self.kinds.iter().map(|k| St::empty(k.kind)));
        Ok(Some(&mut self.states[g * n..(g + 1) * n]))
    }

    /// Hands every group to `main` (in arrival order) and empties the cache.
    pub fn flush(&mut self, main: &mut HashAgg<'_>) -> Result<()> {
        let n = self.kinds.len();
        for (g, &(h, o, l)) in self.groups.iter().enumerate() {
            self.sb.clear();
            encode_states(&self.states[g * n..(g + 1) * n], &mut self.sb);
            main.push(&self.keys[o..o + l], h, &self.sb)?;
        }
        self.groups.clear();
        self.keys.clear();
        self.states.clear();
        self.slots.fill(0);
        self.rows = 0;
        Ok(())
    }

    /// The aggregates' kinds.
    pub fn kinds(&self) -> &[AggKind] {
        &self.kinds
    }
}
