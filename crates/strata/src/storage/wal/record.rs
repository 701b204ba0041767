//! Log records and their byte format.
//!
//! Every record starts with a 33-byte header (little-endian):
//!
//! | bytes  | field                                                             |
//! |--------|-------------------------------------------------------------------|
//! | 0..4   | CRC-32C of bytes 4..len                                           |
//! | 4..8   | len: the record's total length in bytes                           |
//! | 8..16  | LSN: the record's own position in the log (catches misplacement)  |
//! | 16..24 | transaction id (0 for records of no transaction)                  |
//! | 24..32 | LSN of the transaction's previous record (0: none)                |
//! | 32     | kind                                                              |
//!
//! followed by the kind's body. Updates carry a byte range of one page's payload with its
//! before- and after-image, so changing 8 bytes of a 1 MiB page logs 8 + 8 bytes, not the page.
//! An update whose before-image is all zeros (filling a newly allocated page, the common
//! case of loads) is written as kind "update over zeros" without the before-image, which
//! halves the log volume of bulk loads.

use std::borrow::Cow;

use crate::storage::PageId;

/// Bytes of the record header.
pub const HEADER_LEN: usize = 33;
/// The largest record the log accepts (a whole 1 GiB page before and after would not fit a
/// u32 length; updates are split by callers long before that).
pub const MAX_RECORD_LEN: usize = u32::MAX as usize;

const KIND_UPDATE: u8 = 1;
const KIND_ALLOC: u8 = 2;
const KIND_FREE: u8 = 3;
const KIND_COMMIT: u8 = 4;
const KIND_ABORT: u8 = 5;
const KIND_CLR_WRITE: u8 = 6;
const KIND_CLR_FREE: u8 = 7;
const KIND_CLR_RECLAIM: u8 = 8;
const KIND_FLUSH: u8 = 9;
const KIND_UPDATE_ZEROS: u8 = 10;

/// Whether an update's before-image is all zeros (written without it).
fn all_zero(b: &[u8]) -> bool {
    let (head, words, tail) = {
        // SAFETY: every bit pattern is a valid u64; align_to only splits the slice.
        unsafe { b.align_to::<u64>() }
    };
    head.iter().all(|&x| x == 0) && words.iter().all(|&x| x == 0) && tail.iter().all(|&x| x == 0)
}

/// What a compensation record (written while undoing) redoes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Compensation<'a> {
    /// Put `bytes` back at payload offset `offset` of `pid` (an update's before-image).
    Write { pid: PageId, offset: u32, bytes: Cow<'a, [u8]> },
    /// Free `pid` again (undoes an allocation).
    Free { pid: PageId },
    /// Mark `pid` allocated again, keeping its bytes (undoes a free).
    Reclaim { pid: PageId },
}

/// The body of a log record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Body<'a> {
    /// Bytes `offset..offset+len` of the payload of `pid` changed from `before` to `after`.
    Update { pid: PageId, offset: u32, before: Cow<'a, [u8]>, after: Cow<'a, [u8]> },
    /// `pid` was allocated (and starts zeroed).
    Alloc { pid: PageId },
    /// `pid` is freed when its transaction commits.
    Free { pid: PageId },
    /// The transaction committed.
    Commit,
    /// The transaction was rolled back completely (all its changes were compensated).
    Abort,
    /// Redo-only record of one undo step; `undo_next` is the next record of the transaction
    /// still to undo (0: none), so undo never undoes an undo after a crash.
    Clr { undo_next: u64, action: Compensation<'a> },
    /// Written at the end of every flushed chunk: the log was durable up to `durable_before`
    /// before this chunk was written. Tells a torn tail (after the last durable point) from
    /// corruption in the durable part.
    Flush { durable_before: u64 },
}

/// A decoded log record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub lsn: u64,
    pub txid: u64,
    pub prev_lsn: u64,
    pub body: Body<'static>,
}

impl Body<'_> {
    /// The page this record changes, if any.
    pub fn page(&self) -> Option<PageId> {
        match self {
            Body::Update { pid, .. } | Body::Alloc { pid } | Body::Free { pid } => Some(*pid),
            Body::Clr { action, .. } => Some(match action {
                Compensation::Write { pid, .. } | Compensation::Free { pid } | Compensation::Reclaim { pid } => *pid,
            }),
            Body::Commit | Body::Abort | Body::Flush { .. } => None,
        }
    }

    /// Encoded length of the body (without the header).
    pub fn encoded_len(&self) -> usize {
        match self {
            Body::Update { before, .. } if all_zero(before) => 8 + 4 + 4 + before.len(),
            Body::Update { before, .. } => 8 + 4 + 4 + 2 * before.len(),
            Body::Alloc { .. } | Body::Free { .. } | Body::Flush { .. } => 8,
            Body::Commit | Body::Abort => 0,
            Body::Clr { action: Compensation::Write { bytes, .. }, .. } => 8 + 8 + 4 + 4 + bytes.len(),
            Body::Clr { .. } => 8 + 8,
        }
    }
}

/// Appends the encoding of a record to `out`; returns its length.
///
/// # Panics
/// If an update's before- and after-images differ in length (a caller bug).
pub fn encode(out: &mut Vec<u8>, lsn: u64, txid: u64, prev_lsn: u64, body: &Body<'_>) -> usize {
    let len = HEADER_LEN + body.encoded_len();
    let start = out.len();
    out.reserve(len);
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&(len as u32).to_le_bytes());
    out.extend_from_slice(&lsn.to_le_bytes());
    out.extend_from_slice(&txid.to_le_bytes());
    out.extend_from_slice(&prev_lsn.to_le_bytes());
    let pid = |out: &mut Vec<u8>, p: &PageId| out.extend_from_slice(&p.raw().to_le_bytes());
    match body {
        Body::Update { pid: p, offset, before, after } => {
            assert_eq!(before.len(), after.len(), "update images differ in length");
            let zeros = all_zero(before);
            out.push(if zeros { KIND_UPDATE_ZEROS } else { KIND_UPDATE });
            pid(out, p);
            out.extend_from_slice(&offset.to_le_bytes());
            out.extend_from_slice(&(before.len() as u32).to_le_bytes());
            if !zeros {
                out.extend_from_slice(before);
            }
            out.extend_from_slice(after);
        }
        Body::Alloc { pid: p } => {
            out.push(KIND_ALLOC);
            pid(out, p);
        }
        Body::Free { pid: p } => {
            out.push(KIND_FREE);
            pid(out, p);
        }
        Body::Commit => out.push(KIND_COMMIT),
        Body::Abort => out.push(KIND_ABORT),
        Body::Flush { durable_before } => {
            out.push(KIND_FLUSH);
            out.extend_from_slice(&durable_before.to_le_bytes());
        }
        Body::Clr { undo_next, action } => {
            let kind = match action {
                Compensation::Write { .. } => KIND_CLR_WRITE,
                Compensation::Free { .. } => KIND_CLR_FREE,
                Compensation::Reclaim { .. } => KIND_CLR_RECLAIM,
            };
            out.push(kind);
            out.extend_from_slice(&undo_next.to_le_bytes());
            match action {
                Compensation::Write { pid: p, offset, bytes } => {
                    pid(out, p);
                    out.extend_from_slice(&offset.to_le_bytes());
                    out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
                    out.extend_from_slice(bytes);
                }
                Compensation::Free { pid: p } | Compensation::Reclaim { pid: p } => pid(out, p),
            }
        }
    }
    debug_assert_eq!(out.len() - start, len);
    let crc = crc32c::crc32c(&out[start + 4..]);
    out[start..start + 4].copy_from_slice(&crc.to_le_bytes());
    len
}

/// Why bytes do not hold a valid record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Invalid {
    /// Fewer bytes than the header or the length field says.
    Short,
    /// Checksum, length or LSN field wrong (torn or corrupted).
    Damaged(&'static str),
}

/// The length a record at the start of `bytes` claims, if the header is there and sane.
pub fn claimed_len(bytes: &[u8]) -> Option<usize> {
    if bytes.len() < HEADER_LEN {
        return None;
    }
    let len = u32::from_le_bytes(bytes[4..8].try_into().unwrap()) as usize;
    (len >= HEADER_LEN).then_some(len)
}

/// Decodes the record at the start of `bytes`, which should sit at log position `lsn`.
pub fn decode(bytes: &[u8], lsn: u64) -> Result<Record, Invalid> {
    if bytes.len() < HEADER_LEN {
        return Err(Invalid::Short);
    }
    let len = claimed_len(bytes).ok_or(Invalid::Damaged("length below the header size"))?;
    if len > bytes.len() {
        return Err(Invalid::Short);
    }
    let rec = &bytes[..len];
    let stored = u32::from_le_bytes(rec[0..4].try_into().unwrap());
    if crc32c::crc32c(&rec[4..]) != stored {
        return Err(Invalid::Damaged("checksum mismatch"));
    }
    let u64_at = |at: usize| u64::from_le_bytes(rec[at..at + 8].try_into().unwrap());
    if u64_at(8) != lsn {
        return Err(Invalid::Damaged("record names another log position"));
    }
    let (txid, prev_lsn, kind) = (u64_at(16), u64_at(24), rec[32]);
    let b = &rec[HEADER_LEN..];
    let bad = Invalid::Damaged("malformed body");
    let u64_in = |at: usize| b.get(at..at + 8).map(|s| u64::from_le_bytes(s.try_into().unwrap())).ok_or(bad.clone());
    let u32_in = |at: usize| b.get(at..at + 4).map(|s| u32::from_le_bytes(s.try_into().unwrap())).ok_or(bad.clone());
    let pid_in = |at: usize| u64_in(at).map(PageId::from_raw);
    let exact = |n: usize| if b.len() == n { Ok(()) } else { Err(bad.clone()) };
    let body = match kind {
        KIND_UPDATE => {
            let (pid, offset, n) = (pid_in(0)?, u32_in(8)?, u32_in(12)? as usize);
            // An all-zero before-image is written as an update over zeros since that kind
            // exists; builds before it wrote it in full, so such a record re-encodes shorter
            // than it is: the log readers step by the length field, not the re-encoding.
            exact(16 + 2 * n)?;
            Body::Update { pid, offset, before: Cow::Owned(b[16..16 + n].to_vec()), after: Cow::Owned(b[16 + n..].to_vec()) }
        }
        KIND_UPDATE_ZEROS => {
            let (pid, offset, n) = (pid_in(0)?, u32_in(8)?, u32_in(12)? as usize);
            // The length is checked against the record before the zeros are allocated.
            exact(16 + n)?;
            Body::Update { pid, offset, before: Cow::Owned(vec![0; n]), after: Cow::Owned(b[16..].to_vec()) }
        }
        KIND_ALLOC => {
            exact(8)?;
            Body::Alloc { pid: pid_in(0)? }
        }
        KIND_FREE => {
            exact(8)?;
            Body::Free { pid: pid_in(0)? }
        }
        KIND_COMMIT => {
            exact(0)?;
            Body::Commit
        }
        KIND_ABORT => {
            exact(0)?;
            Body::Abort
        }
        KIND_FLUSH => {
            exact(8)?;
            Body::Flush { durable_before: u64_in(0)? }
        }
        KIND_CLR_WRITE => {
            let (undo_next, pid, offset, n) = (u64_in(0)?, pid_in(8)?, u32_in(16)?, u32_in(20)? as usize);
            exact(24 + n)?;
            Body::Clr { undo_next, action: Compensation::Write { pid, offset, bytes: Cow::Owned(b[24..].to_vec()) } }
        }
        KIND_CLR_FREE | KIND_CLR_RECLAIM => {
            exact(16)?;
            let (undo_next, pid) = (u64_in(0)?, pid_in(8)?);
            let action = if kind == KIND_CLR_FREE { Compensation::Free { pid } } else { Compensation::Reclaim { pid } };
            Body::Clr { undo_next, action }
        }
        _ => return Err(Invalid::Damaged("unknown record kind")),
    };
    Ok(Record { lsn, txid, prev_lsn, body })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_kinds() -> Vec<Body<'static>> {
        let pid = PageId::new(3, false, 41);
        vec![
            Body::Update { pid, offset: 17, before: Cow::Owned(vec![1, 2, 3]), after: Cow::Owned(vec![4, 5, 6]) },
            Body::Update { pid, offset: 9, before: Cow::Owned(vec![0; 21]), after: Cow::Owned((1..=21).collect()) },
            Body::Update { pid, offset: 0, before: Cow::Owned(vec![0, 0, 0, 1]), after: Cow::Owned(vec![0; 4]) },
            Body::Alloc { pid },
            Body::Free { pid },
            Body::Commit,
            Body::Abort,
            Body::Flush { durable_before: 99 },
            Body::Clr { undo_next: 7, action: Compensation::Write { pid, offset: 5, bytes: Cow::Owned(vec![9; 10]) } },
            Body::Clr { undo_next: 0, action: Compensation::Free { pid } },
            Body::Clr { undo_next: 3, action: Compensation::Reclaim { pid } },
        ]
    }

    #[test]
    fn every_kind_round_trips() {
        let mut lsn = 1000;
        let mut out = Vec::new();
        let mut at = Vec::new();
        for body in all_kinds() {
            at.push((out.len(), lsn));
            lsn += encode(&mut out, lsn, 12, 34, &body) as u64;
        }
        for ((pos, lsn), body) in at.into_iter().zip(all_kinds()) {
            let rec = decode(&out[pos..], lsn).unwrap();
            assert_eq!(rec, Record { lsn, txid: 12, prev_lsn: 34, body });
        }
    }

    /// An update over zeros is written without its before-image.
    #[test]
    fn a_full_update_over_zeros_decodes_with_its_own_length() {
        // Kind "update" with a zero before-image, as builds before kind 10 wrote it: it
        // decodes, and its length is its length field, not that of its re-encoding (which
        // is an update over zeros, shorter; found by fuzzing).
        let pid = PageId::new(0, false, 5);
        let mut out = Vec::new();
        encode(&mut out, 64, 1, 0, &Body::Update { pid, offset: 0, before: Cow::Owned(vec![1; 4]), after: Cow::Owned(vec![2; 4]) });
        out[HEADER_LEN + 16..HEADER_LEN + 20].fill(0);
        let crc = crc32c::crc32c(&out[4..]);
        out[..4].copy_from_slice(&crc.to_le_bytes());
        let rec = decode(&out, 64).unwrap();
        assert_eq!(rec.body, Body::Update { pid, offset: 0, before: Cow::Owned(vec![0; 4]), after: Cow::Owned(vec![2; 4]) });
        assert_eq!(claimed_len(&out), Some(out.len()));
        assert!(HEADER_LEN + rec.body.encoded_len() < out.len());
    }

    #[test]
    fn updates_over_zeros_log_the_after_image_only() {
        let pid = PageId::new(0, false, 5);
        let over = |before: Vec<u8>| Body::Update { pid, offset: 8, after: Cow::Owned(vec![7; before.len()]), before: Cow::Owned(before) };
        let mut out = Vec::new();
        let zeros = encode(&mut out, 64, 1, 0, &over(vec![0; 4096]));
        let mut out2 = Vec::new();
        let data = encode(&mut out2, 64, 1, 0, &over(vec![1; 4096]));
        assert_eq!(zeros, HEADER_LEN + 16 + 4096);
        assert_eq!(data, HEADER_LEN + 16 + 2 * 4096);
        assert_eq!(decode(&out, 64).unwrap().body, over(vec![0; 4096]));
        // A damaged length cannot make the decoder allocate more than the record holds.
        let mut bad = out.clone();
        bad[HEADER_LEN + 12..HEADER_LEN + 16].copy_from_slice(&u32::MAX.to_le_bytes());
        let crc = crc32c::crc32c(&bad[4..]);
        bad[..4].copy_from_slice(&crc.to_le_bytes());
        assert!(decode(&bad, 64).is_err());
    }

    #[test]
    fn damage_is_detected_never_decoded() {
        let mut out = Vec::new();
        let body = &all_kinds()[0];
        let len = encode(&mut out, 64, 1, 0, body);
        assert_eq!(decode(&out[..len - 1], 64), Err(Invalid::Short));
        assert!(matches!(decode(&out, 65), Err(Invalid::Damaged(_))), "wrong position");
        for i in 0..len {
            let mut bad = out.clone();
            bad[i] ^= 0x10;
            assert!(decode(&bad, 64).is_err(), "flipped byte {i} went unnoticed");
        }
    }
}
