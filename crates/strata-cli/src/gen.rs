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
    /// A Graph500-style R-MAT graph (a, b, c, d = 0.57, 0.19, 0.19, 0.05; vertex ids
    /// scrambled) as a SNAP text edge list: 2^scale vertex ids, edgefactor * 2^scale edges.
    Rmat {
        #[arg(long)]
        scale: u32,
        #[arg(long, default_value_t = 16)]
        edgefactor: u64,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        #[arg(long)]
        out: PathBuf,
    },
    /// A CSV table of every column type (id, amount, day, flag, name, comment, blob), with
    /// NULLs, quoted fields with commas and quotes, and strings of every length class, until
    /// the file has `--size` bytes.
    Csv {
        #[arg(long, value_parser = crate::parse_size)]
        size: u64,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        #[arg(long)]
        out: PathBuf,
    },
    /// The eight TPC-H tables as OUT/TABLE.csv (header row, dates YYYY-MM-DD, decimals as
    /// plain numbers), by the `tpchgen` crate (the same rows as dbgen).
    Tpch {
        /// Scale factor (1 = about 6 million lineitems, 1 GB of CSV).
        #[arg(long)]
        sf: f64,
        /// Directory to write the files into (created if absent).
        #[arg(long)]
        out: PathBuf,
    },
}

/// SplitMix64 (the library's): small, fast, and good enough for benchmark data; `below` is
/// multiply-shift, which fixes the values `gen ints` writes for a seed.
pub use strata::util::SplitMix64 as SplitMix;

pub fn run(cmd: GenCmd) -> Result<(), Error> {
    match cmd {
        GenCmd::Ints { count, seed, out, format, max } => ints(count, seed, &out, &format, max),
        GenCmd::Rmat { scale, edgefactor, seed, out } => rmat(scale, edgefactor, seed, &out),
        GenCmd::Csv { size, seed, out } => {
            let rows = csv(size, seed, &out)?;
            eprintln!("wrote {rows} rows to {}", out.display());
            Ok(())
        }
        GenCmd::Tpch { sf, out } => {
            for (table, rows) in crate::tpch::generate(sf, &out)? {
                eprintln!("wrote {rows} rows to {}", out.join(format!("{table}.csv")).display());
            }
            Ok(())
        }
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

/// A bijection of `[0, 2^bits)` (odd multipliers and xor-shifts), to scramble vertex ids.
fn scramble(x: u64, bits: u32, k1: u64, k2: u64) -> u64 {
    let mask = if bits == 64 { u64::MAX } else { (1u64 << bits) - 1 };
    let r = bits / 2 + 1;
    let mut x = x.wrapping_mul(k1 | 1) & mask;
    x ^= x >> r;
    x = x.wrapping_mul(k2 | 1) & mask;
    x ^ (x >> r)
}

/// Writes an R-MAT edge list (Graph500 parameters) to `out`.
pub fn rmat(scale: u32, edgefactor: u64, seed: u64, out: &PathBuf) -> Result<(), Error> {
    if !(1..=40).contains(&scale) {
        return Err(Error::InvalidInput(format!("--scale {scale} must be between 1 and 40")));
    }
    let edges = edgefactor
        .checked_mul(1u64 << scale)
        .filter(|&e| e > 0)
        .ok_or_else(|| Error::InvalidInput(format!("--edgefactor {edgefactor} must be at least 1 and edgefactor * 2^scale fit in 64 bits")))?;
    // Quadrant thresholds as fractions of 2^64: a, a + b, a + b + c.
    const A: u64 = (0.57 * 18446744073709551616.0) as u64;
    const AB: u64 = (0.76 * 18446744073709551616.0) as u64;
    const ABC: u64 = (0.95 * 18446744073709551616.0) as u64;
    let f = File::create(out).map_err(|e| Error::io("create", out, e))?;
    let mut w = BufWriter::with_capacity(1 << 20, f);
    let mut rng = SplitMix(seed);
    let (k1, k2) = (rng.next_u64(), rng.next_u64());
    let mut write = |s: &str| w.write_all(s.as_bytes()).map_err(|e| Error::io("write", out, e));
    write(&format!(
        "# R-MAT graph (Graph500 a,b,c,d = 0.57,0.19,0.19,0.05), scale {scale}, edgefactor {edgefactor}, seed {seed}\n# Nodes: {} Edges: {edges}\n# FromNodeId\tToNodeId\n",
        1u64 << scale
    ))?;
    let mut line = String::with_capacity(64);
    for _ in 0..edges {
        let (mut u, mut v) = (0u64, 0u64);
        for _ in 0..scale {
            let r = rng.next_u64();
            let (du, dv) = if r < A {
                (0, 0)
            } else if r < AB {
                (0, 1)
            } else if r < ABC {
                (1, 0)
            } else {
                (1, 1)
            };
            u = (u << 1) | du;
            v = (v << 1) | dv;
        }
        line.clear();
        use std::fmt::Write as _;
        let _ = writeln!(line, "{}\t{}", scramble(u, scale, k1, k2), scramble(v, scale, k1, k2));
        write(&line)?;
    }
    w.flush().map_err(|e| Error::io("write", out, e))
}

/// Writes a CSV file of at most `size` bytes (whole rows, at least one; see
/// [`GenCmd::Csv`]). Returns the number of rows.
pub fn csv(size: u64, seed: u64, out: &PathBuf) -> Result<u64, Error> {
    use std::fmt::Write as _;
    const WORDS: [&str; 10] = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa"];
    let file = File::create(out).map_err(|e| Error::io("create", out, e))?;
    let mut w = BufWriter::with_capacity(1 << 20, file);
    let put = |w: &mut BufWriter<File>, s: &str| w.write_all(s.as_bytes()).map_err(|e| Error::io("write", out, e));
    let header = "id,amount,day,flag,name,comment,blob\n";
    put(&mut w, header)?;
    let mut written = header.len() as u64;
    let mut r = SplitMix(seed);
    let mut line = String::new();
    let mut rows = 0u64;
    loop {
        line.clear();
        let day = (r.below(20_000) as i32) - 5_000;
        // Amounts in the shortest round-trip form, so that an export gives the same bytes.
        let amount = strata::access::table::text::format_f64(r.below(100_000_000) as f64 / 100.0);
        let _ = write!(line, "{rows},{amount},{},", strata::access::table::text::format_date(day));
        if r.below(10) > 0 {
            line.push_str(if r.coin() { "true" } else { "false" });
        }
        line.push(',');
        line.push_str(WORDS[r.below(10) as usize]);
        line.push(',');
        match r.below(20) {
            0 => {}                                           // NULL
            1 => line.push_str("\"\""),                       // the empty string
            2 => line.push_str("\"said \"\"hi\"\", twice\""), // quotes and a comma
            _ => {
                let most = if r.below(50) == 0 { 200 } else { 12 };
                let n = 1 + r.below(most);
                for i in 0..n {
                    if i > 0 {
                        line.push(' ');
                    }
                    line.push_str(WORDS[r.below(10) as usize]);
                }
            }
        }
        line.push(',');
        if r.below(4) == 0 {
            let _ = write!(line, "\\x{:016x}", r.next_u64());
        }
        line.push('\n');
        if written + line.len() as u64 > size && rows > 0 {
            break;
        }
        put(&mut w, &line)?;
        written += line.len() as u64;
        rows += 1;
    }
    w.flush().map_err(|e| Error::io("write", out, e))?;
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scramble_is_a_bijection() {
        for bits in [1u32, 2, 5, 10] {
            let mut seen: Vec<u64> = (0..1u64 << bits).map(|x| scramble(x, bits, 0x1234_5678_9abc, 0xfeed_beef)).collect();
            seen.sort_unstable();
            assert_eq!(seen, (0..1u64 << bits).collect::<Vec<_>>(), "bits {bits}");
        }
    }
}
