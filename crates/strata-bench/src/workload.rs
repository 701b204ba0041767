//! Workload generation: a small fast RNG, a Zipf sampler, page contents, and helpers shared
//! by the engines (a cheap hasher, a striped counter).

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crossbeam_utils::CachePadded;

/// SplitMix64 finaliser: a good 64-bit mix.
#[inline]
pub fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// xoshiro256** : fast, statistically good, deterministic per seed.
#[derive(Clone, Debug)]
pub struct Rng([u64; 4]);

impl Rng {
    /// A generator seeded from `seed` (any value).
    pub fn new(seed: u64) -> Rng {
        let mut s = [0u64; 4];
        let mut x = seed;
        for w in &mut s {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            *w = mix64(x);
        }
        Rng(s)
    }
    /// The next 64 random bits.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.0;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }
    /// Uniform in `0..n` (`n > 0`), by multiply-shift (bias below 2^-32 for n < 2^32).
    #[inline]
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }
    /// Uniform in `[0, 1)`.
    #[inline]
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// How pages are chosen.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Distribution {
    /// Every page equally likely.
    Uniform,
    /// Zipf with exponent `theta` (0.99 in the benchmarks), hot pages scattered over the file.
    Zipf(f64),
}

impl Distribution {
    /// The name used in the JSON output.
    pub fn name(&self) -> &'static str {
        match self {
            Distribution::Uniform => "uniform",
            Distribution::Zipf(_) => "zipf",
        }
    }
}

/// Samples page numbers in `0..n` from a [`Distribution`]. Shared read-only by all threads;
/// each thread brings its own [`Rng`].
#[derive(Clone, Debug)]
pub struct Sampler {
    n: u64,
    zipf: Option<Zipf>,
}

/// Gray et al.'s "Quickly generating billion-record synthetic databases" Zipf generator (as
/// in YCSB): O(n) set-up, O(1) per sample.
#[derive(Clone, Debug)]
struct Zipf {
    theta: f64,
    zetan: f64,
    alpha: f64,
    eta: f64,
    half_pow_theta: f64,
    /// Scramble: rank r goes to page (r * mult) mod n, a permutation (gcd(mult, n) == 1), so
    /// that hot pages are not all at the start of the file.
    mult: u64,
}

fn zeta(n: u64, theta: f64) -> f64 {
    (1..=n).map(|i| 1.0 / (i as f64).powf(theta)).sum()
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

impl Sampler {
    /// A sampler over `0..n` (`n > 0`).
    pub fn new(n: u64, dist: Distribution) -> Sampler {
        assert!(n > 0, "empty sample space");
        let zipf = match dist {
            Distribution::Uniform => None,
            Distribution::Zipf(theta) => {
                let zetan = zeta(n, theta);
                let zeta2 = zeta(2.min(n), theta);
                let alpha = 1.0 / (1.0 - theta);
                let eta = if n <= 1 { 0.0 } else { (1.0 - (2.0 / n as f64).powf(1.0 - theta)) / (1.0 - zeta2 / zetan) };
                let mut mult = 0x9E37_79B9_7F4A_7C15 % n.max(1);
                while n > 1 && (mult == 0 || gcd(mult, n) != 1) {
                    mult = (mult + 1) % n;
                }
                Some(Zipf { theta, zetan, alpha, eta, half_pow_theta: 0.5f64.powf(theta), mult: mult.max(1) })
            }
        };
        Sampler { n, zipf }
    }

    /// The size of the sample space.
    pub fn len(&self) -> u64 {
        self.n
    }

    /// Never true.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// The next page number.
    #[inline]
    pub fn sample(&self, rng: &mut Rng) -> u64 {
        match &self.zipf {
            None => rng.below(self.n),
            Some(z) => {
                let u = rng.unit();
                let uz = u * z.zetan;
                let rank = if uz < 1.0 {
                    0
                } else if uz < 1.0 + z.half_pow_theta {
                    1
                } else {
                    ((self.n as f64 * (z.eta * u - z.eta + 1.0).powf(z.alpha)) as u64).min(self.n - 1)
                };
                let _ = z.theta;
                ((rank as u128 * z.mult as u128) % self.n as u128) as u64
            }
        }
    }
}

/// The expected payload word `word` of page `index` of data file `file`: what the data-set
/// builder writes and what the correctness tests check.
#[inline]
pub fn content_word(file: u16, index: u64, word: usize) -> u64 {
    if word == 0 {
        // The first word names the page: a misdirected read is visible at a glance.
        ((file as u64) << 48) | index
    } else {
        mix64(((file as u64) << 56) ^ (index << 20) ^ word as u64)
    }
}

/// Fills `buf` (a page payload, length a multiple of 8) with the contents of page `index` of
/// file `file`.
pub fn fill_payload(file: u16, index: u64, buf: &mut [u8]) {
    for (w, c) in buf.chunks_exact_mut(8).enumerate() {
        c.copy_from_slice(&content_word(file, index, w).to_le_bytes());
    }
}

/// Reads the little-endian word at word offset `w` of a payload.
#[inline]
pub fn word(payload: &[u8], w: usize) -> u64 {
    u64::from_le_bytes(payload[8 * w..8 * w + 8].try_into().unwrap())
}

/// What a random-access benchmark does with a page it holds: reads the first word and one
/// word chosen by `salt` (two dependent cache lines, like a key lookup in a page).
#[inline]
pub fn touch(payload: &[u8], salt: u64) -> u64 {
    let words = payload.len() / 8;
    word(payload, 0) ^ word(payload, (salt % words as u64) as usize)
}

/// What a random page read does with the page: a binary search over its words, steered by
/// the bits of `key` (as a lookup in a sorted page): `log2(words)` dependent reads spread
/// over the page (9 for 4 KiB, 13 for 64 KiB).
#[inline]
pub fn probe(payload: &[u8], key: u64) -> u64 {
    let (mut lo, mut hi) = (0usize, payload.len() / 8);
    let mut acc = word(payload, 0);
    let mut bits = key;
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        let w = word(payload, mid);
        acc ^= w;
        // Dependent on the loaded word as in a real search, and on the key's bits.
        if (w ^ bits) & 1 == 0 {
            lo = mid;
        } else {
            hi = mid;
        }
        bits = bits.rotate_right(1);
    }
    acc
}

/// Touches every OS page (4 KiB) of a payload: a warm-up that leaves an mmap'ed page fully
/// mapped.
#[inline]
pub fn prefault(payload: &[u8]) -> u64 {
    payload.iter().step_by(4096).fold(0u64, |a, &b| a.wrapping_add(b as u64)) ^ payload.last().copied().unwrap_or(0) as u64
}

/// What a scan does with a page: sums all its words (wrapping), as a column scan would.
#[inline]
pub fn sum_words(payload: &[u8]) -> u64 {
    payload.chunks_exact(8).fold(0u64, |acc, c| acc.wrapping_add(u64::from_le_bytes(c.try_into().unwrap())))
}

/// A fast non-cryptographic hasher for integer keys (FxHash), as buffer pools use their own
/// cheap hash functions rather than SipHash.
#[derive(Default, Clone, Copy)]
pub struct FxHasher(u64);

impl std::hash::Hasher for FxHasher {
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(5) ^ b as u64).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
        }
    }
    #[inline]
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

/// `BuildHasher` for [`FxHasher`].
pub type FxBuild = std::hash::BuildHasherDefault<FxHasher>;

const STRIPES: usize = 16;

/// A counter striped over cache lines (threads add to their own stripe), like strata's.
#[derive(Default)]
pub struct Counter([CachePadded<AtomicU64>; STRIPES]);

fn stripe() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local!(static MINE: Cell<usize> = const { Cell::new(usize::MAX) });
    MINE.with(|m| {
        if m.get() == usize::MAX {
            m.set(NEXT.fetch_add(1, Ordering::Relaxed) % STRIPES);
        }
        m.get()
    })
}

impl Counter {
    /// Adds `n`.
    #[inline]
    pub fn add(&self, n: u64) {
        self.0[stripe()].fetch_add(n, Ordering::Relaxed);
    }
    /// The sum over the stripes.
    pub fn get(&self) -> u64 {
        self.0.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_covers_the_range() {
        let s = Sampler::new(10, Distribution::Uniform);
        let mut r = Rng::new(1);
        let mut seen = [0u32; 10];
        for _ in 0..10_000 {
            seen[s.sample(&mut r) as usize] += 1;
        }
        assert!(seen.iter().all(|&c| c > 800 && c < 1200), "{seen:?}");
    }

    #[test]
    fn zipf_is_skewed_and_in_range() {
        let n = 10_000;
        let s = Sampler::new(n, Distribution::Zipf(0.99));
        let mut r = Rng::new(2);
        let mut counts = std::collections::HashMap::new();
        for _ in 0..100_000 {
            let p = s.sample(&mut r);
            assert!(p < n);
            *counts.entry(p).or_insert(0u32) += 1;
        }
        let mut c: Vec<u32> = counts.values().copied().collect();
        c.sort_unstable_by(|a, b| b.cmp(a));
        // The hottest page of 10k gets ~10% of accesses under Zipf(0.99); uniform would give 0.01%.
        assert!(c[0] > 5_000, "top count {}", c[0]);
        let top100: u32 = c.iter().take(100).sum();
        assert!(top100 > 40_000, "top-100 share {top100}");
        // The permutation scatters the hot pages: the hottest is not page 0..10 in general,
        // but every sampled page is valid and many distinct pages appear.
        assert!(counts.len() > 3_000);
    }

    #[test]
    fn content_names_its_page() {
        let mut b = vec![0u8; 4064];
        fill_payload(3, 77, &mut b);
        assert_eq!(word(&b, 0), (3u64 << 48) | 77);
        assert_eq!(word(&b, 5), content_word(3, 77, 5));
    }
}
