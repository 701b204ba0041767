//! Small helpers shared by every layer: human-readable sizes and their parsing.

use std::fmt;

/// A byte count that prints as `64.0 MiB`, `4 KiB`, `512 B`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Bytes(pub u64);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
        let mut v = self.0 as f64;
        let mut u = 0;
        while v >= 1024.0 && u + 1 < UNITS.len() {
            v /= 1024.0;
            u += 1;
        }
        if u == 0 {
            write!(f, "{} B", self.0)
        } else if v.fract() == 0.0 {
            write!(f, "{} {}", v as u64, UNITS[u])
        } else {
            write!(f, "{:.1} {}", v, UNITS[u])
        }
    }
}

/// Parses `4096`, `64KiB`, `64MiB`, `1GiB` (also `KB`/`MB`/`GB`/`K`/`M`/`G`, all binary).
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num.parse().ok()?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return None,
    };
    n.checked_mul(1u64 << shift)
}

/// The process's peak resident set size (`VmHWM` from `/proc/self/status`), if known.
pub fn peak_rss_bytes() -> Option<u64> {
    proc_status_kib("VmHWM:").map(|k| k * 1024)
}

/// The process's current resident set size (`VmRSS`), if known.
pub fn current_rss_bytes() -> Option<u64> {
    proc_status_kib("VmRSS:").map(|k| k * 1024)
}

fn proc_status_kib(key: &str) -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with(key))?;
    line[key.len()..].trim().trim_end_matches("kB").trim().parse().ok()
}

/// Asks the CPU to load the cache line at `p` (no effect where the architecture has no
/// prefetch instruction here).
#[inline(always)]
pub(crate) fn prefetch(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is only a hint: it never faults, whatever the address, and changes
    // no memory.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast::<i8>())
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// The indexes of the set bits of a bitmap (bit `i` in word `i / 64`), ascending.
pub(crate) fn set_bits(words: &[u64]) -> SetBits<'_> {
    SetBits { words, at: 0, cur: words.first().copied().unwrap_or(0) }
}

/// The iterator of [`set_bits`].
pub(crate) struct SetBits<'a> {
    words: &'a [u64],
    /// The word `cur` came from.
    at: usize,
    /// Its bits not handed out yet.
    cur: u64,
}

impl Iterator for SetBits<'_> {
    type Item = usize;

    #[inline]
    fn next(&mut self) -> Option<usize> {
        while self.cur == 0 {
            self.at += 1;
            self.cur = *self.words.get(self.at)?;
        }
        let i = self.at * 64 + self.cur.trailing_zeros() as usize;
        self.cur &= self.cur - 1;
        Some(i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_bits_lists_every_set_bit_in_order() {
        let words = [0b1011u64, 0, 1 << 63, u64::MAX];
        let want: Vec<usize> = [0, 1, 3, 191].into_iter().chain(192..256).collect();
        assert_eq!(set_bits(&words).collect::<Vec<_>>(), want);
        assert_eq!(set_bits(&[]).count(), 0);
        assert_eq!(set_bits(&[0, 0]).count(), 0);
    }

    #[test]
    fn sizes_parse_and_print() {
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("64KiB"), Some(65536));
        assert_eq!(parse_size("64MiB"), Some(64 << 20));
        assert_eq!(parse_size("1GiB"), Some(1 << 30));
        assert_eq!(parse_size("1 g"), Some(1 << 30));
        assert_eq!(parse_size("12XB"), None);
        assert_eq!(parse_size(""), None);
        assert_eq!(parse_size("99999999999999999999GiB"), None);
        assert_eq!(Bytes(64 << 20).to_string(), "64 MiB");
        assert_eq!(Bytes(1536).to_string(), "1.5 KiB");
        assert_eq!(Bytes(12).to_string(), "12 B");
    }
}

/// SplitMix64: a tiny, fast, deterministic generator for test data, benchmark data and
/// workload choices (not for anything that needs unpredictability).
#[derive(Clone, Debug)]
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, bound)` by multiply-shift (0 when `bound` is 0).
    pub fn below(&mut self, bound: u64) -> u64 {
        ((self.next_u64() as u128 * bound as u128) >> 64) as u64
    }

    /// A fair coin.
    pub fn coin(&mut self) -> bool {
        self.next_u64() >> 63 == 1
    }
}
