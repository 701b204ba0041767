//! Page ids and size classes.
//!
//! Class `k` holds pages of `min_page << k` bytes. A [`PageId`] packs the class (6 bits, as
//! in Umbra), a temporary-page flag (1 bit) and the index of the page within its class
//! (57 bits). Page `i` of a class lives at byte offset `i * page_size` of that class's file
//! and at `base + i * page_size` in that class's virtual reservation, so translating an id
//! to an address or a file offset is arithmetic.

use std::fmt;
use std::path::{Path, PathBuf};

/// Number of size classes a page id can name.
pub const MAX_CLASSES: usize = 64;
/// Smallest allowed `min_page` (log2).
pub const MIN_PAGE_SHIFT: u32 = 12;
/// Largest allowed page size (log2): 64 GiB.
pub const MAX_PAGE_SHIFT: u32 = 36;

const CLASS_SHIFT: u32 = 58;
const TEMP_BIT: u64 = 1 << 57;
const INDEX_MASK: u64 = TEMP_BIT - 1;

/// Identifies one page: its size class, whether it is a temporary page, and its index.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PageId(u64);

impl PageId {
    /// Largest index a page id can carry.
    pub const MAX_INDEX: u64 = INDEX_MASK;

    /// Packs a page id. `class < 64`, `index <= MAX_INDEX`.
    pub const fn new(class: u8, temp: bool, index: u64) -> PageId {
        debug_assert!((class as usize) < MAX_CLASSES && index <= INDEX_MASK);
        PageId(((class as u64) << CLASS_SHIFT) | if temp { TEMP_BIT } else { 0 } | (index & INDEX_MASK))
    }
    /// Reconstructs a page id from its raw 64-bit form (any value is a syntactically valid id;
    /// whether it names an allocated page is checked by the buffer manager).
    pub const fn from_raw(raw: u64) -> PageId {
        PageId(raw)
    }
    /// The raw 64-bit form.
    pub const fn raw(self) -> u64 {
        self.0
    }
    /// The size class.
    pub const fn class(self) -> u8 {
        (self.0 >> CLASS_SHIFT) as u8
    }
    /// Whether this is a temporary page (never persistent).
    pub const fn is_temp(self) -> bool {
        self.0 & TEMP_BIT != 0
    }
    /// Index of the page within its class.
    pub const fn index(self) -> u64 {
        self.0 & INDEX_MASK
    }
    /// Dense number of the (class, temp) space the page belongs to.
    pub const fn space(self) -> usize {
        self.class() as usize * 2 + self.is_temp() as usize
    }
}

impl fmt::Display for PageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}:{}", if self.is_temp() { "t" } else { "c" }, self.class(), self.index())
    }
}

/// Parses what [`PageId`]'s `Display` prints (`c3:17` for page 17 of class 3, `t3:17` for a
/// temporary page) or a raw 64-bit id (decimal, or hexadecimal after `0x`).
impl std::str::FromStr for PageId {
    type Err = String;

    fn from_str(s: &str) -> Result<PageId, String> {
        let bad = || format!("{s:?} is not a page id: expected CLASS:INDEX as in c3:17 (t3:17 for a temporary page) or a raw 64-bit id");
        let s = s.trim();
        if let Some(hex) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
            return u64::from_str_radix(hex, 16).map(PageId::from_raw).map_err(|_| bad());
        }
        if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
            return s.parse::<u64>().map(PageId::from_raw).map_err(|_| bad());
        }
        let (temp, rest) = match s.as_bytes().first() {
            Some(b'c') => (false, &s[1..]),
            Some(b't') => (true, &s[1..]),
            _ => return Err(bad()),
        };
        let (class, index) = rest.split_once(':').ok_or_else(bad)?;
        let digits = |t: &str| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit());
        if !digits(class) || !digits(index) {
            return Err(bad());
        }
        let class: u8 = class
            .parse()
            .ok()
            .filter(|&c| (c as usize) < MAX_CLASSES)
            .ok_or_else(|| format!("{s:?} is not a page id: the class must be below {MAX_CLASSES}"))?;
        let index: u64 = index
            .parse()
            .ok()
            .filter(|&i| i <= PageId::MAX_INDEX)
            .ok_or_else(|| format!("{s:?} is not a page id: the index must be at most {}", PageId::MAX_INDEX))?;
        Ok(PageId::new(class, temp, index))
    }
}

impl fmt::Debug for PageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PageId({self})")
    }
}

/// The size classes of one database: class `k` holds pages of `min_page << k` bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SizeClasses {
    min_shift: u32,
}

impl SizeClasses {
    /// `min_page` must be a power of two between 4 KiB and 64 GiB.
    pub fn new(min_page: u64) -> Option<SizeClasses> {
        if !min_page.is_power_of_two() {
            return None;
        }
        let shift = min_page.trailing_zeros();
        (MIN_PAGE_SHIFT..=MAX_PAGE_SHIFT).contains(&shift).then_some(SizeClasses { min_shift: shift })
    }
    /// The smallest page size.
    pub fn min_page(&self) -> u64 {
        1 << self.min_shift
    }
    /// log2 of the smallest page size.
    pub fn min_shift(&self) -> u32 {
        self.min_shift
    }
    /// Number of classes (the largest page is 64 GiB).
    pub fn count(&self) -> usize {
        (MAX_PAGE_SHIFT - self.min_shift + 1) as usize
    }
    /// Page size of class `class`.
    pub fn page_size(&self, class: u8) -> u64 {
        1 << (self.min_shift + class as u32)
    }
    /// log2 of the page size of `class`.
    pub fn page_shift(&self, class: u8) -> u32 {
        self.min_shift + class as u32
    }
    /// The smallest class whose pages hold `bytes` bytes in total (header included).
    pub fn class_for(&self, bytes: u64) -> Option<u8> {
        let size = bytes.max(1).checked_next_power_of_two()?.max(self.min_page());
        let class = size.trailing_zeros() - self.min_shift;
        ((class as usize) < self.count()).then_some(class as u8)
    }
}

/// File of the persistent pages of `class` inside the database directory.
pub fn class_file(dir: &Path, class: u8) -> PathBuf {
    dir.join(format!("class-{class:02}.pages"))
}

/// Scratch file of the temporary pages of `class` (removed on open and close).
pub fn temp_file(dir: &Path, class: u8) -> PathBuf {
    dir.join("tmp").join(format!("temp-{class:02}.pages"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_id_parses_its_display_form_and_raw_ids() {
        for pid in [PageId::new(0, false, 0), PageId::new(3, false, 17), PageId::new(63, true, PageId::MAX_INDEX)] {
            assert_eq!(pid.to_string().parse::<PageId>(), Ok(pid));
            assert_eq!(pid.raw().to_string().parse::<PageId>(), Ok(pid));
            assert_eq!(format!("{:#x}", pid.raw()).parse::<PageId>(), Ok(pid));
        }
        for bad in ["", "c", "c3", "c3:", "c:3", "x3:1", "c3:-1", "c64:1", "c3:1x", "-5", "0xZZ", "99999999999999999999", "c3:144115188075855872"] {
            assert!(bad.parse::<PageId>().is_err(), "{bad:?} must not parse");
        }
    }

    #[test]
    fn page_id_packs_class_temp_and_index() {
        let p = PageId::new(5, true, 123_456);
        assert_eq!((p.class(), p.is_temp(), p.index()), (5, true, 123_456));
        assert_eq!(p.space(), 11);
        let q = PageId::new(63, false, PageId::MAX_INDEX);
        assert_eq!((q.class(), q.is_temp(), q.index()), (63, false, PageId::MAX_INDEX));
        assert_eq!(PageId::from_raw(q.raw()), q);
        assert_eq!(p.to_string(), "t5:123456");
    }

    #[test]
    fn size_classes_pick_the_smallest_fit() {
        let c = SizeClasses::new(64 << 10).unwrap();
        assert_eq!(c.class_for(1), Some(0));
        assert_eq!(c.class_for(64 << 10), Some(0));
        assert_eq!(c.class_for((64 << 10) + 1), Some(1));
        assert_eq!(c.page_size(3), 512 << 10);
        assert_eq!(c.class_for(1 << 30), Some(14));
        assert_eq!(c.class_for(1 << 37), None);
        assert!(SizeClasses::new(3000).is_none());
        assert!(SizeClasses::new(2048).is_none());
        assert_eq!(SizeClasses::new(4096).unwrap().count(), 25);
    }
}
