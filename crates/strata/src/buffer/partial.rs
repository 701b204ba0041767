//! Partial page reads: a scan that needs only some bytes of each page (the blocks of the
//! columns a query names) reads those, not the page.
//!
//! The buffer manager knows nothing of page formats. A reader that knows its pages'
//! format describes the part it needs ([`PartialRead`]): from the first bytes of a page,
//! the byte ranges it will read; and it verifies those ranges itself, since the page's own
//! checksum covers the whole page (a format that is read partially keeps checksums of its
//! parts). A scan ring ([`super::ring`]) reads pages so: it predicts the disk sectors a
//! page needs from the pages before it ([`SectorPlan`]: pages of one table are laid out
//! alike), reads those, reads what a page needed beyond the prediction in a second round,
//! and hands the scan an image of which only the ranges it asked for are the page's.

use std::ops::Range;

/// The unit of partial reads: a disk sector (the alignment of direct I/O).
pub const SECTOR: usize = 4096;

/// Runs of sectors at most this many sectors apart are read as one request (the sectors
/// between them too): a request costs the I/O thread and the device more than reading a
/// few sectors more.
pub(super) const MERGE_GAP: usize = 2;

/// What a reader needs of a page's payload (the bytes after the page header, as a guard's
/// `data()` shows them), and how it verifies them.
pub trait PartialRead: Sync {
    /// Appends to `out` the payload ranges the reader needs, found from `head`: the
    /// payload's first bytes as read from the disk (not verified: anything may be there,
    /// so this must not trust them beyond bounds checks). Returns false if the reader needs
    /// the whole page (it is not of the kind it reads partially, or `head` is too short to
    /// tell); `out` is then ignored.
    fn ranges(&self, head: &[u8], out: &mut Vec<Range<usize>>) -> bool;

    /// Whether the payload's ranges that [`ranges`](Self::ranges) named (only those bytes
    /// were read; the others are anything) are the page's: the format's own checksums of
    /// them verify.
    fn verify(&self, payload: &[u8]) -> bool;
}

/// The sectors of a page (`bool` per [`SECTOR`] of the page image, page header included)
/// that hold the payload `ranges`, marked in `out` (sector 0, which holds the page header,
/// always); false if a range lies beyond the page.
pub(super) fn mark_sectors(ranges: &[Range<usize>], header: usize, out: &mut [bool]) -> bool {
    let Some(first) = out.first_mut() else { return false };
    *first = true;
    let len = out.len() * SECTOR;
    for r in ranges {
        let (start, end) = (r.start.saturating_add(header), r.end.saturating_add(header));
        if end > len || start > end {
            return false;
        }
        if start < end {
            for s in &mut out[start / SECTOR..end.div_ceil(SECTOR)] {
                *s = true;
            }
        }
    }
    true
}

/// Runs of consecutive marked sectors, as `first..end` sector ranges.
pub(super) fn runs(sectors: &[bool]) -> impl Iterator<Item = Range<usize>> + '_ {
    let mut i = 0;
    std::iter::from_fn(move || {
        while i < sectors.len() && !sectors[i] {
            i += 1;
        }
        if i == sectors.len() {
            return None;
        }
        let start = i;
        while i < sectors.len() && sectors[i] {
            i += 1;
        }
        Some(start..i)
    })
}

/// A ring's prediction of the sectors a page needs: at first the page header's sector
/// only (the rest a page needs is read in a second round), then the union of what the
/// pages of its last batch needed (pages of one table are laid out alike), single-sector
/// gaps filled (a sector more costs less than a request more). `None`: read whole pages
/// (after a page that needed all of itself, or when the prediction is most of a page).
pub(super) struct SectorPlan {
    sectors: Option<Vec<bool>>,
}

/// A prediction is used only while it leaves out at least a third of a page: reading
/// most of a page in pieces costs the I/O threads more (a request per piece, where whole
/// adjacent pages are read as one) than the bytes it saves.
const WORTH: (usize, usize) = (2, 3);

impl SectorPlan {
    /// The plan of a ring whose pages have `sectors` sectors: the first only.
    pub(super) fn new(sectors: usize) -> SectorPlan {
        SectorPlan { sectors: Some((0..sectors).map(|i| i == 0).collect()) }
    }

    /// The sectors to read first, if partial reads are worth it.
    pub(super) fn get(&self) -> Option<&[bool]> {
        self.sectors.as_deref()
    }

    /// Learns from a batch: `needed` per page read (`None`: it needed the whole page).
    pub(super) fn learn<'n>(&mut self, sectors: usize, needed: impl Iterator<Item = Option<&'n [bool]>>) {
        let mut union = vec![false; sectors];
        let mut any = false;
        for n in needed {
            let Some(n) = n else {
                self.sectors = None;
                return;
            };
            any = true;
            for (u, &x) in union.iter_mut().zip(n) {
                *u |= x;
            }
        }
        if !any {
            return;
        }
        let mut last: Option<usize> = None;
        for i in 0..sectors {
            if union[i] {
                if let Some(l) = last {
                    if i - l - 1 <= MERGE_GAP {
                        for x in &mut union[l + 1..i] {
                            *x = true;
                        }
                    }
                }
                last = Some(i);
            }
        }
        let marked = union.iter().filter(|&&x| x).count();
        self.sectors = (marked * WORTH.1 <= sectors * WORTH.0).then_some(union);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[allow(clippy::single_range_in_vec_init, clippy::reversed_empty_ranges)] // lists of one range
    fn ranges_mark_their_sectors_and_the_header_sector() {
        let mut s = vec![false; 16];
        assert!(mark_sectors(&[5000..5001, 20_000..30_000], 32, &mut s));
        let marked: Vec<usize> = (0..16).filter(|&i| s[i]).collect();
        assert_eq!(marked, vec![0, 1, 4, 5, 6, 7]);
        assert_eq!(runs(&s).collect::<Vec<_>>(), vec![0..2, 4..8]);
        // A range beyond the page, or reversed: the whole page.
        assert!(!mark_sectors(&[0..16 * SECTOR], 32, &mut s));
        assert!(!mark_sectors(&[9..3], 32, &mut s));
        // An empty range marks nothing but the header's sector.
        let mut s = vec![false; 4];
        assert!(mark_sectors(&[100..100], 0, &mut s));
        assert_eq!(s, vec![true, false, false, false]);
    }

    #[test]
    fn a_plan_is_the_union_of_a_batch_with_small_gaps_filled_while_it_saves_a_third() {
        let mut plan = SectorPlan::new(8);
        assert_eq!(plan.get().unwrap(), &[true, false, false, false, false, false, false, false]);
        let a = [true, true, false, false, false, false, false, false];
        let b = [true, false, true, false, false, false, true, false];
        plan.learn(8, [Some(&a[..]), Some(&b[..])].into_iter());
        // Sectors 0, 1, 2 and 6 (the gap of three, 3 to 5, stays).
        assert_eq!(plan.get().unwrap(), &[true, true, true, false, false, false, true, false]);
        // A gap of two is filled.
        let d = [true, false, false, true, false, false, false, false];
        plan.learn(8, [Some(&d[..])].into_iter());
        assert_eq!(plan.get().unwrap(), &[true, true, true, true, false, false, false, false]);
        // Six of eight sectors saves less than a third: whole pages.
        let e = [true, true, true, true, true, true, false, false];
        plan.learn(8, [Some(&e[..])].into_iter());
        assert!(plan.get().is_none());
        let c = [true, false, true, false, true, false, true, false];
        plan.learn(8, [Some(&c[..])].into_iter());
        // Gaps 1, 3, 5 filled: 7 of 8 sectors is not worth it.
        assert!(plan.get().is_none());
        plan.learn(8, [Some(&a[..])].into_iter());
        assert!(plan.get().is_some());
        // A page that needed all of itself: whole pages again.
        plan.learn(8, [Some(&a[..]), None].into_iter());
        assert!(plan.get().is_none());
        // A batch with nothing read keeps the plan.
        plan.learn(8, [Some(&a[..])].into_iter());
        plan.learn(8, std::iter::empty());
        assert!(plan.get().is_some());
    }
}
