//! The meta file `strata.meta`: identifies a directory as a strata database and fixes its
//! format version and smallest page size. 32 bytes, little-endian, written atomically
//! (temp file + fsync + rename + fsync of the directory).
//!
//! | bytes  | field                     |
//! |--------|---------------------------|
//! | 0..8   | magic `STRATADB`          |
//! | 8..12  | format version            |
//! | 12..16 | log2 of the smallest page |
//! | 16..24 | creation time (unix s)    |
//! | 24..28 | reserved, zero            |
//! | 28..32 | CRC-32C of bytes 0..28    |

use std::path::{Path, PathBuf};

use super::backend::StorageBackend;
use super::layout::SizeClasses;
use crate::error::{Error, Result};

/// Name of the meta file inside the database directory.
pub const META_FILE: &str = "strata.meta";
/// The format version this build writes and the newest it reads. Version 2: packed table
/// leaves have a column directory (a database of version 1 keeps writing leaves without
/// one, which builds that know only version 1 read; this build reads both).
pub const FORMAT_VERSION: u32 = 2;
const MAGIC: &[u8; 8] = b"STRATADB";
const LEN: usize = 32;

/// The decoded meta file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Meta {
    /// Format version of the database.
    pub version: u32,
    /// The size classes (fixed by the smallest page size).
    pub classes: SizeClasses,
    /// Creation time, seconds since the epoch.
    pub created: u64,
}

impl Meta {
    /// Path of the meta file of database `dir`.
    pub fn path(dir: &Path) -> PathBuf {
        dir.join(META_FILE)
    }

    /// Encodes to the on-disk form.
    pub fn encode(&self) -> [u8; LEN] {
        let mut b = [0u8; LEN];
        b[0..8].copy_from_slice(MAGIC);
        b[8..12].copy_from_slice(&self.version.to_le_bytes());
        b[12..16].copy_from_slice(&self.classes.min_shift().to_le_bytes());
        b[16..24].copy_from_slice(&self.created.to_le_bytes());
        let crc = crc32c::crc32c(&b[..28]);
        b[28..32].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decodes and validates; `path` only names the file in errors.
    pub fn decode(bytes: &[u8], path: &Path) -> Result<Meta> {
        if bytes.len() < 8 || &bytes[0..8] != MAGIC {
            return Err(Error::NotADatabase { path: path.parent().unwrap_or(path).to_owned() });
        }
        if bytes.len() != LEN {
            return Err(Error::corruption(path, None, format!("meta file is {} bytes, expected {LEN}", bytes.len())));
        }
        let stored = u32::from_le_bytes(bytes[28..32].try_into().unwrap());
        if crc32c::crc32c(&bytes[..28]) != stored {
            return Err(Error::corruption(path, None, "meta file checksum mismatch"));
        }
        let version = u32::from_le_bytes(bytes[8..12].try_into().unwrap());
        if version > FORMAT_VERSION || version == 0 {
            return Err(Error::UnsupportedVersion { path: path.to_owned(), found: version, supported: FORMAT_VERSION });
        }
        let shift = u32::from_le_bytes(bytes[12..16].try_into().unwrap());
        let classes =
            1u64.checked_shl(shift).and_then(SizeClasses::new).ok_or_else(|| Error::corruption(path, None, format!("invalid smallest page size 2^{shift}")))?;
        let created = u64::from_le_bytes(bytes[16..24].try_into().unwrap());
        Ok(Meta { version, classes, created })
    }

    /// Reads the meta file of database `dir`.
    pub fn load(backend: &dyn StorageBackend, dir: &Path) -> Result<Meta> {
        let path = Meta::path(dir);
        if !backend.exists(&path) {
            return Err(Error::NotADatabase { path: dir.to_owned() });
        }
        let bytes = backend.read_file(&path).map_err(|e| Error::io("read", &path, e))?;
        Meta::decode(&bytes, &path)
    }

    /// Writes the meta file of database `dir` atomically.
    pub fn store(&self, backend: &dyn StorageBackend, dir: &Path) -> Result<()> {
        let path = Meta::path(dir);
        backend.write_atomic(&path, &self.encode()).map_err(|e| Error::io("write", &path, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_rejections() {
        let m = Meta { version: 1, classes: SizeClasses::new(4096).unwrap(), created: 5 };
        let p = Path::new("/db/strata.meta");
        assert_eq!(Meta::decode(&m.encode(), p).unwrap(), m);
        let mut bad = m.encode();
        bad[20] ^= 1;
        assert!(matches!(Meta::decode(&bad, p), Err(Error::Corruption { .. })));
        assert!(matches!(Meta::decode(b"hello world", p), Err(Error::NotADatabase { .. })));
        let newer = Meta { version: 9, ..m }.encode();
        assert!(matches!(Meta::decode(&newer, p), Err(Error::UnsupportedVersion { found: 9, .. })));
        assert!(matches!(Meta::decode(&m.encode()[..20], p), Err(Error::Corruption { .. })));
    }
}
