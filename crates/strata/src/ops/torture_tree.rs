//! The B+-tree workload of `strata torture --workload tree`: concurrent transactions that
//! insert, replace and remove keys of one key-value tree (values from 24 bytes to 80 KB, so
//! that leaves of several size classes split, grow and shrink), some rolled back on purpose,
//! with enough evidence in the tree to check after any crash that every acknowledged commit
//! survived, whole, and nothing else did.
//!
//! Each worker slot `s` owns the keys `t<s>/<k>` and a progress key `t<s>/progress` holding
//! (sequence number of its last commit, number of its commits). The operations of the slot's
//! `n`-th committed transaction are a pure function of `(s, n)` ([`ops`]), and every value
//! is a pure function of `(s, n, k, length)` ([`value`]), so [`verify`] rebuilds each
//! slot's expected keys from its commit count alone and compares them with the tree, value
//! by value, after checking the tree's structure. A transaction rolled back (on purpose or
//! by a lock timeout) is retried with the same operations.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::Serialize;

use super::torture::{Outcome, Rng};
use crate::access::btree::BTree;
use crate::buffer::BufferManager;
use crate::error::{Error, Result};
use crate::storage::PageId;
use crate::txn::{LockTable, Transaction};

/// The catalog name of the workload's tree.
pub const TREE_NAME: &str = "torture-tree";
/// Keys per slot.
pub const KEYS_PER_SLOT: u64 = 2000;
/// Largest number of worker slots.
pub const MAX_SLOTS: u64 = 256;

fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The progress key of slot `s` (sorts after the slot's data keys, so that slots share no
/// leaf through their progress keys).
pub fn meta_key(s: u64) -> Vec<u8> {
    format!("t{s:03}/progress").into_bytes()
}

/// Data key `k` of slot `s`.
pub fn data_key(s: u64, k: u64) -> Vec<u8> {
    format!("t{s:03}/{k:06}").into_bytes()
}

/// The value that transaction `n` of slot `s` writes under key `k`: `len` bytes (at least
/// 24), starting with `s`, `n`, `k`.
pub fn value(s: u64, n: u64, k: u64, len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(len.max(24));
    for w in [s, n, k] {
        v.extend_from_slice(&w.to_le_bytes());
    }
    let mut x = mix(s << 48 ^ n << 16 ^ k);
    while v.len() < len {
        x = mix(x);
        v.extend_from_slice(&x.to_le_bytes()[..(len - v.len()).min(8)]);
    }
    v
}

/// The operations of the `n`-th committed transaction of slot `s`: key index and the new
/// value's length, or `None` to remove the key.
pub fn ops(s: u64, n: u64) -> Vec<(u64, Option<usize>)> {
    let mut r = Rng(mix(s << 40 ^ n));
    let count = 1 + r.below(10);
    (0..count)
        .map(|_| {
            let k = r.below(KEYS_PER_SLOT);
            if r.below(10) < 3 {
                return (k, None);
            }
            let len = match r.below(60) {
                0 => 20_000 + r.below(60_000),
                1..=5 => 1_000 + r.below(5_000),
                _ => 24 + r.below(250),
            };
            (k, Some(len as usize))
        })
        .collect()
}

/// A slot's progress: (sequence number of its last commit, its commits).
pub fn progress(bm: &BufferManager, tree: &BTree, s: u64) -> Result<(u64, u64)> {
    let mut v = Vec::new();
    if !tree.get(bm, &meta_key(s), &mut v)? {
        return Ok((0, 0));
    }
    if v.len() != 16 {
        return Err(Error::Inconsistent(format!("progress key of slot {s} holds {} bytes, not 16", v.len())));
    }
    Ok((u64::from_le_bytes(v[..8].try_into().unwrap()), u64::from_le_bytes(v[8..].try_into().unwrap())))
}

/// One transaction of slot `s`, whose committed transactions so far are `*done`: applies
/// [`ops`]`(s, *done)`, sometimes rolls back on purpose (`abort`), else takes a sequence
/// number from `seq` just before committing and counts the commit in `*done`.
#[allow(clippy::too_many_arguments)]
pub fn run_tx(
    bm: &BufferManager,
    locks: &LockTable,
    tree: &BTree,
    s: u64,
    done: &mut u64,
    abort: bool,
    seq: &AtomicU64,
    lock_wait: Duration,
) -> Result<Outcome> {
    let mut tx = Transaction::begin(bm, locks);
    tx.set_lock_wait(lock_wait);
    let n = *done;
    let r = (|| -> Result<Option<u64>> {
        // The progress key first, with a placeholder: the transaction then holds its leaf's
        // lock, so that the final in-place write of the sequence number cannot wait for a
        // lock (a sequence number, once taken, must be committed).
        let mut meta = [0u8; 16];
        meta[8..].copy_from_slice(&(n + 1).to_le_bytes());
        tree.insert(&mut tx, &meta_key(s), &meta)?;
        for (k, len) in ops(s, n) {
            match len {
                Some(len) => tree.insert(&mut tx, &data_key(s, k), &value(s, n, k, len))?,
                None => {
                    tree.remove(&mut tx, &data_key(s, k))?;
                }
            }
        }
        if abort {
            return Ok(None);
        }
        let q = seq.fetch_add(1, Ordering::Relaxed) + 1;
        meta[..8].copy_from_slice(&q.to_le_bytes());
        tree.insert(&mut tx, &meta_key(s), &meta).map_err(|e| match e {
            e if e.is_lock_conflict() => Error::Inconsistent("the progress key's leaf was not locked by its transaction".into()),
            e => e,
        })?;
        Ok(Some(q))
    })();
    let outcome = super::torture::finish(tx, r)?;
    if let Outcome::Committed(_) = outcome {
        *done = n + 1;
    }
    Ok(outcome)
}

/// What [`verify`] found.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Verdict {
    /// Always `"tree"`.
    pub workload: &'static str,
    /// The largest sequence number that survived.
    pub last_committed: u64,
    /// Slots with at least one commit.
    pub slots: u64,
    /// Commits over all slots.
    pub commits: u64,
    /// Keys in the tree (progress keys included).
    pub keys: u64,
    /// Height of the tree.
    pub height: u32,
    /// Allocated pages that the tree does not reference.
    pub leaked_pages: u64,
    pub ok: bool,
    /// What is wrong, when not ok.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<String>,
}

/// Checks the tree's structure ([`BTree::check`]), then every slot's keys and values against
/// the ones its commit count implies, and that no allocated page is unreferenced.
pub fn verify(bm: &BufferManager, tree: &BTree) -> Result<Verdict> {
    let mut problems = Vec::new();
    let mut referenced = std::collections::HashSet::new();
    let report = tree.check(bm, &mut |pid| {
        referenced.insert(pid);
    })?;
    let mut actual: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    tree.scan(bm, b"", &mut |k, v| {
        actual.insert(k.to_vec(), v.to_vec());
        true
    })?;
    let (mut last, mut slots, mut commits) = (0, 0, 0);
    let mut expected: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    for s in 0..MAX_SLOTS {
        let Some(meta) = actual.get(&meta_key(s)) else { continue };
        let (q, count) = match <[u8; 16]>::try_from(meta.as_slice()) {
            Ok(b) => (u64::from_le_bytes(b[..8].try_into().unwrap()), u64::from_le_bytes(b[8..].try_into().unwrap())),
            Err(_) => {
                problems.push(format!("progress key of slot {s} holds {} bytes", meta.len()));
                continue;
            }
        };
        expected.insert(meta_key(s), meta.clone());
        last = last.max(q);
        slots += 1;
        commits += count;
        let mut keys: BTreeMap<u64, Option<(u64, usize)>> = BTreeMap::new();
        for n in 0..count {
            for (k, len) in ops(s, n) {
                keys.insert(k, len.map(|l| (n, l)));
            }
        }
        for (k, v) in keys {
            if let Some((n, len)) = v {
                expected.insert(data_key(s, k), value(s, n, k, len));
            }
        }
    }
    for (k, v) in &expected {
        match actual.get(k) {
            None => problems.push(format!("key {} is missing", String::from_utf8_lossy(k))),
            Some(a) if a != v => {
                problems.push(format!("key {} holds a {}-byte value, expected another {}-byte value", String::from_utf8_lossy(k), a.len(), v.len()))
            }
            Some(_) => {}
        }
        if problems.len() > 20 {
            break;
        }
    }
    for k in actual.keys().filter(|k| !expected.contains_key(*k)).take(20) {
        problems.push(format!("key {} should not exist (written by no committed transaction)", String::from_utf8_lossy(k)));
    }
    let leaked = bm.allocated_pages().into_iter().filter(|p: &PageId| !referenced.contains(p)).count() as u64;
    if leaked > 0 {
        problems.push(format!("{leaked} allocated pages are referenced by nothing"));
    }
    Ok(Verdict {
        workload: "tree",
        last_committed: last,
        slots,
        commits,
        keys: actual.len() as u64,
        height: report.height,
        leaked_pages: leaked,
        ok: problems.is_empty(),
        problems,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operations_and_values_are_pure_functions() {
        assert_eq!(ops(3, 17), ops(3, 17));
        assert_ne!(ops(3, 17), ops(3, 18));
        assert_eq!(value(1, 2, 3, 100), value(1, 2, 3, 100));
        assert_ne!(value(1, 2, 3, 100), value(1, 3, 3, 100));
        assert_eq!(value(1, 2, 3, 30).len(), 30);
        assert!(data_key(3, KEYS_PER_SLOT - 1) < meta_key(3) && meta_key(3) < data_key(4, 0));
        let lens: Vec<usize> = (0..2000).flat_map(|n| ops(0, n)).filter_map(|(_, l)| l).collect();
        assert!(lens.iter().any(|&l| l > 20_000) && lens.iter().any(|&l| l < 100));
    }
}
