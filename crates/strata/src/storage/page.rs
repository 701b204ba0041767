//! The on-disk page format.
//!
//! Every page, of every size, starts with a 32-byte header (all fields little-endian):
//!
//! | bytes  | field                                                      |
//! |--------|------------------------------------------------------------|
//! | 0..4   | CRC-32C of bytes 4..page_size                              |
//! | 4..8   | magic `SPG1`                                               |
//! | 8..16  | the page's own id (catches misdirected reads and writes)   |
//! | 16..24 | LSN of the last logged change (0 until the WAL exists)     |
//! | 24..32 | reserved, zero                                             |
//!
//! The payload handed to users is `page[32..]`. A page whose checksum, magic or id does not
//! match is reported as [`crate::Error::Corruption`], never returned as data.

use super::PageId;

/// Bytes at the start of every page reserved for the header.
pub const PAGE_HEADER_SIZE: usize = 32;

const MAGIC: u32 = u32::from_le_bytes(*b"SPG1");

/// What is wrong with a page read from disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PageFault {
    /// Never written: all bytes zero (a hole in a sparse file).
    Blank,
    /// Wrong magic number.
    BadMagic(u32),
    /// The header names another page (a misdirected write or read).
    WrongPage(u64),
    /// Checksum mismatch (torn or corrupted page).
    BadChecksum { stored: u32, computed: u32 },
}

impl std::fmt::Display for PageFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PageFault::Blank => write!(f, "page was never written (all zero)"),
            PageFault::BadMagic(m) => write!(f, "bad page magic {m:#010x}"),
            PageFault::WrongPage(p) => write!(f, "page header names another page ({})", PageId::from_raw(*p)),
            PageFault::BadChecksum { stored, computed } => {
                write!(f, "checksum mismatch (stored {stored:#010x}, computed {computed:#010x}): torn or corrupted page")
            }
        }
    }
}

/// The header fields of a page image as stored, whether or not they verify (for
/// inspection; [`verify`] is what reads use).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// Bytes 0..4: the stored CRC-32C of bytes 4..page_size.
    pub checksum: u32,
    /// Bytes 4..8: [`Header::MAGIC`] in every written page.
    pub magic: u32,
    /// Bytes 8..16: the raw id of the page the image claims to be.
    pub page_id: u64,
    /// Bytes 16..24: the LSN of the page's last logged change.
    pub lsn: u64,
    /// Bytes 24..32: reserved, zero.
    pub reserved: u64,
}

impl Header {
    /// The magic number of every page (`SPG1`, little-endian).
    pub const MAGIC: u32 = MAGIC;

    /// The header of `image` (at least [`PAGE_HEADER_SIZE`] bytes).
    pub fn parse(image: &[u8]) -> Header {
        let word = |at: usize| u64::from_le_bytes(image[at..at + 8].try_into().unwrap());
        Header {
            checksum: u32::from_le_bytes(image[0..4].try_into().unwrap()),
            magic: u32::from_le_bytes(image[4..8].try_into().unwrap()),
            page_id: word(8),
            lsn: word(16),
            reserved: word(24),
        }
    }
}

/// The checksum `image` (a whole page) should carry: CRC-32C of its bytes 4..
pub fn computed_checksum(image: &[u8]) -> u32 {
    crc32c::crc32c(&image[4..])
}

/// Fills in the header fields of a page image before it is written (the checksum last).
/// Returns the 4 header words (bytes 0..32) to store; the caller stores them.
pub fn header_words(pid: PageId, lsn: u64, body_crc: impl FnOnce(&[u8; 28]) -> u32) -> [u64; 4] {
    let mut head = [0u8; 28];
    head[0..4].copy_from_slice(&MAGIC.to_le_bytes());
    head[4..12].copy_from_slice(&pid.raw().to_le_bytes());
    head[12..20].copy_from_slice(&lsn.to_le_bytes());
    let crc = body_crc(&head);
    let mut all = [0u8; 32];
    all[0..4].copy_from_slice(&crc.to_le_bytes());
    all[4..32].copy_from_slice(&head);
    let mut words = [0u64; 4];
    for (w, c) in words.iter_mut().zip(all.chunks_exact(8)) {
        *w = u64::from_le_bytes(c.try_into().unwrap());
    }
    words
}

/// Computes the checksum of a page whose header (bytes 4..32) is `head` and whose payload
/// is `payload` (bytes 32..).
pub fn checksum(head: &[u8; 28], payload: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(head), payload)
}

/// Writes a complete header into an exclusively owned page image.
pub fn seal(image: &mut [u8], pid: PageId, lsn: u64) {
    let (head, payload) = image.split_at_mut(PAGE_HEADER_SIZE);
    let words = header_words(pid, lsn, |h| checksum(h, payload));
    for (c, w) in head.chunks_exact_mut(8).zip(words) {
        c.copy_from_slice(&w.to_le_bytes());
    }
}

/// Whether the header of `image` (at least [`PAGE_HEADER_SIZE`] bytes) is a page's and
/// names page `pid` (its checksum not verified: for partial reads, whose reader verifies
/// the bytes it read with checksums of its own).
pub fn names(image: &[u8], pid: PageId) -> bool {
    let magic = u32::from_le_bytes(image[4..8].try_into().unwrap());
    let id = u64::from_le_bytes(image[8..16].try_into().unwrap());
    magic == MAGIC && id == pid.raw()
}

/// Verifies a page image read from disk as page `pid`.
pub fn verify(image: &[u8], pid: PageId) -> Result<u64, PageFault> {
    let stored = u32::from_le_bytes(image[0..4].try_into().unwrap());
    let magic = u32::from_le_bytes(image[4..8].try_into().unwrap());
    if magic != MAGIC {
        if image.iter().all(|&b| b == 0) {
            return Err(PageFault::Blank);
        }
        return Err(PageFault::BadMagic(magic));
    }
    let head: &[u8; 28] = image[4..32].try_into().unwrap();
    let computed = checksum(head, &image[PAGE_HEADER_SIZE..]);
    if computed != stored {
        return Err(PageFault::BadChecksum { stored, computed });
    }
    let id = u64::from_le_bytes(image[8..16].try_into().unwrap());
    if id != pid.raw() {
        return Err(PageFault::WrongPage(id));
    }
    Ok(u64::from_le_bytes(image[16..24].try_into().unwrap()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seal_then_verify_and_detect_damage() {
        let pid = PageId::new(2, false, 77);
        let mut img = vec![0u8; 4096];
        img[100] = 42;
        seal(&mut img, pid, 9);
        assert_eq!(verify(&img, pid), Ok(9));
        assert!(matches!(verify(&img, PageId::new(2, false, 78)), Err(PageFault::WrongPage(_))));
        img[4000] ^= 1;
        assert!(matches!(verify(&img, pid), Err(PageFault::BadChecksum { .. })));
        assert_eq!(verify(&vec![0u8; 4096], pid), Err(PageFault::Blank));
    }

    #[test]
    fn header_parses_what_seal_wrote() {
        let pid = PageId::new(1, false, 5);
        let mut img = vec![3u8; 8192];
        seal(&mut img, pid, 1234);
        let h = Header::parse(&img);
        assert_eq!((h.magic, h.page_id, h.lsn, h.reserved), (Header::MAGIC, pid.raw(), 1234, 0));
        assert_eq!(h.checksum, computed_checksum(&img));
        img[5000] ^= 0x10;
        assert_ne!(Header::parse(&img).checksum, computed_checksum(&img));
    }
}
