//! Data generators, so anyone can reproduce the benchmarks: seeded and deterministic.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::PathBuf;

use clap::Subcommand;
use strata::Error;

#[derive(Subcommand)]
pub enum GenCmd {
    /// Pseudo-random integers, uniform in [0, max).
    Ints {
        #[arg(long)]
        count: u64,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        #[arg(long)]
        out: PathBuf,
        /// u32le or u64le.
        #[arg(long, default_value = "u32le")]
        format: String,
        /// Exclusive upper bound (default: the format's full range).
        #[arg(long)]
        max: Option<u64>,
    },
}

/// SplitMix64: small, fast, and good enough for benchmark data.
pub struct SplitMix(pub u64);

impl SplitMix {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [0, bound) (bound > 0), by multiply-shift.
    pub fn below(&mut self, bound: u64) -> u64 {
        ((self.next_u64() as u128 * bound as u128) >> 64) as u64
    }
}

pub fn run(cmd: GenCmd) -> Result<(), Error> {
    match cmd {
        GenCmd::Ints { count, seed, out, format, max } => ints(count, seed, &out, &format, max),
    }
}

/// Writes `count` integers to `out`.
pub fn ints(count: u64, seed: u64, out: &PathBuf, format: &str, max: Option<u64>) -> Result<(), Error> {
    let (width, full) = match format {
        "u32le" => (4, 1u64 << 32),
        "u64le" => (8, 0),
        _ => return Err(Error::InvalidInput(format!("unknown format {format:?} for gen ints (u32le or u64le)"))),
    };
    let bound = match max {
        Some(0) => return Err(Error::InvalidInput("--max must be at least 1".into())),
        Some(m) if width == 4 && m > full => return Err(Error::InvalidInput(format!("--max {m} does not fit u32le"))),
        Some(m) => m,
        None => full,
    };
    let f = File::create(out).map_err(|e| Error::io("create", out, e))?;
    let mut w = BufWriter::with_capacity(1 << 20, f);
    let mut rng = SplitMix(seed);
    for _ in 0..count {
        let v = if bound == 0 { rng.next_u64() } else { rng.below(bound) };
        let r = if width == 4 { w.write_all(&(v as u32).to_le_bytes()) } else { w.write_all(&v.to_le_bytes()) };
        r.map_err(|e| Error::io("write", out, e))?;
    }
    w.flush().map_err(|e| Error::io("write", out, e))
}
