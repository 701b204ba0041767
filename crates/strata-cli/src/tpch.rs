//! TPC-H: `strata gen tpch` (the eight tables as CSV, by the `tpchgen` crate),
//! `strata import-tpch` (each table with its fixed schema) and the queries that the tests,
//! the demo and `strata sql --file` share (crates/strata/tests/tpch/).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::time::Instant;

use strata::access::table::csv::{read_rows, CsvOptions};
use strata::access::table::Schema;
use strata::{Config, Database, Error};
use tpchgen::csv::{CustomerCsv, LineItemCsv, NationCsv, OrderCsv, PartCsv, PartSuppCsv, RegionCsv, SupplierCsv};
use tpchgen::generators::{
    CustomerGenerator, LineItemGenerator, NationGenerator, OrderGenerator, PartGenerator, PartSuppGenerator, RegionGenerator, SupplierGenerator,
};

/// One line per table: the name, a space, the schema ("name:type,...", decimals as f64).
pub const SCHEMAS: &str = include_str!("../../strata/tests/tpch/schema.txt");

/// The queries (name, text), with the specification's validation parameters.
pub const QUERIES: [(&str, &str); 22] = [
    ("q1", include_str!("../../strata/tests/tpch/q1.sql")),
    ("q2", include_str!("../../strata/tests/tpch/q2.sql")),
    ("q3", include_str!("../../strata/tests/tpch/q3.sql")),
    ("q4", include_str!("../../strata/tests/tpch/q4.sql")),
    ("q5", include_str!("../../strata/tests/tpch/q5.sql")),
    ("q6", include_str!("../../strata/tests/tpch/q6.sql")),
    ("q7", include_str!("../../strata/tests/tpch/q7.sql")),
    ("q8", include_str!("../../strata/tests/tpch/q8.sql")),
    ("q9", include_str!("../../strata/tests/tpch/q9.sql")),
    ("q10", include_str!("../../strata/tests/tpch/q10.sql")),
    ("q11", include_str!("../../strata/tests/tpch/q11.sql")),
    ("q12", include_str!("../../strata/tests/tpch/q12.sql")),
    ("q13", include_str!("../../strata/tests/tpch/q13.sql")),
    ("q14", include_str!("../../strata/tests/tpch/q14.sql")),
    ("q15", include_str!("../../strata/tests/tpch/q15.sql")),
    ("q16", include_str!("../../strata/tests/tpch/q16.sql")),
    ("q17", include_str!("../../strata/tests/tpch/q17.sql")),
    ("q18", include_str!("../../strata/tests/tpch/q18.sql")),
    ("q19", include_str!("../../strata/tests/tpch/q19.sql")),
    ("q20", include_str!("../../strata/tests/tpch/q20.sql")),
    ("q21", include_str!("../../strata/tests/tpch/q21.sql")),
    ("q22", include_str!("../../strata/tests/tpch/q22.sql")),
];

/// The tables with their schemas, in the order of [`SCHEMAS`].
pub fn schemas() -> Result<Vec<(&'static str, Schema)>, Error> {
    SCHEMAS
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let (name, spec) = l.split_once(' ').ok_or_else(|| Error::InvalidInput(format!("bad TPC-H schema line {l:?}")))?;
            Ok((name, Schema::parse(spec.trim())?))
        })
        .collect()
}

fn write_table<T>(out: &Path, name: &str, header: &str, rows: impl Iterator<Item = T>, line: impl Fn(T) -> String) -> Result<u64, Error> {
    let path = out.join(format!("{name}.csv"));
    let file = File::create(&path).map_err(|e| Error::io("create", &path, e))?;
    let mut w = BufWriter::with_capacity(1 << 20, file);
    let mut n = 0u64;
    let mut put = |s: &str| w.write_all(s.as_bytes()).and_then(|_| w.write_all(b"\n")).map_err(|e| Error::io("write", &path, e));
    put(header)?;
    for r in rows {
        put(&line(r))?;
        n += 1;
    }
    w.flush().map_err(|e| Error::io("write", &path, e))?;
    Ok(n)
}

/// The smallest scale factor (one supplier).
pub const MIN_SF: f64 = 0.0001;

/// Writes DIR/{region,nation,...,lineitem}.csv at scale factor `sf` (header row; dates
/// YYYY-MM-DD; decimals as plain numbers). Returns (table, rows) per table.
pub fn generate(sf: f64, out: &Path) -> Result<Vec<(&'static str, u64)>, Error> {
    // Below 0.0001 there is no supplier, and tpchgen divides by the supplier count.
    if !(MIN_SF..=1000.0).contains(&sf) {
        return Err(Error::InvalidInput(format!("--sf must be from {MIN_SF} to 1000, not {sf}")));
    }
    std::fs::create_dir_all(out).map_err(|e| Error::io("create directory", out, e))?;
    Ok(vec![
        ("region", write_table(out, "region", RegionCsv::header(), RegionGenerator::new(sf, 1, 1).iter(), |r| RegionCsv::new(r).to_string())?),
        ("nation", write_table(out, "nation", NationCsv::header(), NationGenerator::new(sf, 1, 1).iter(), |r| NationCsv::new(r).to_string())?),
        ("supplier", write_table(out, "supplier", SupplierCsv::header(), SupplierGenerator::new(sf, 1, 1).iter(), |r| SupplierCsv::new(r).to_string())?),
        ("customer", write_table(out, "customer", CustomerCsv::header(), CustomerGenerator::new(sf, 1, 1).iter(), |r| CustomerCsv::new(r).to_string())?),
        ("part", write_table(out, "part", PartCsv::header(), PartGenerator::new(sf, 1, 1).iter(), |r| PartCsv::new(r).to_string())?),
        ("partsupp", write_table(out, "partsupp", PartSuppCsv::header(), PartSuppGenerator::new(sf, 1, 1).iter(), |r| PartSuppCsv::new(r).to_string())?),
        ("orders", write_table(out, "orders", OrderCsv::header(), OrderGenerator::new(sf, 1, 1).iter(), |r| OrderCsv::new(r).to_string())?),
        ("lineitem", write_table(out, "lineitem", LineItemCsv::header(), LineItemGenerator::new(sf, 1, 1).iter(), |r| LineItemCsv::new(r).to_string())?),
    ])
}

/// Writes the TPC-H CSVs with `strata gen tpch` in a child process: `tpchgen` builds dbgen's
/// 300 MiB text pool for the comments, which would otherwise stay in this process's peak RSS,
/// the figure the demo reports for the engine's work.
fn generate_in_child(sf: f64, csv: &Path) -> Result<(), Error> {
    let exe = std::env::current_exe().map_err(|e| Error::io("find the strata executable", Path::new("strata"), e))?;
    let out = std::process::Command::new(&exe)
        .args(["gen", "tpch", "--sf", &sf.to_string(), "--out"])
        .arg(csv)
        .output()
        .map_err(|e| Error::io("run `strata gen tpch`", &exe, e))?;
    if !out.status.success() {
        let why = String::from_utf8_lossy(&out.stderr);
        return Err(Error::InvalidInput(format!("generating the TPC-H data failed: {}", why.trim().trim_start_matches("error: "))));
    }
    Ok(())
}

/// Loads CSVDIR/TABLE.csv for the eight tables into the database at `dir` (created if
/// absent), each with its fixed schema. Returns (table, rows, seconds) per table.
pub fn import(dir: &Path, csv_dir: &Path, pool: u64) -> Result<Vec<(&'static str, u64, f64)>, Error> {
    let schemas = schemas()?;
    for (name, _) in &schemas {
        let path = csv_dir.join(format!("{name}.csv"));
        if !path.is_file() {
            return Err(Error::InvalidInput(format!("{} is missing (write the tables with `strata gen tpch --out {}`)", path.display(), csv_dir.display())));
        }
    }
    let db = match Database::open(crate::cmd::config(dir, pool, true)) {
        Ok(db) => db,
        Err(Error::NotADatabase { .. }) => {
            std::fs::create_dir_all(dir).map_err(|e| Error::io("create directory", dir, e))?;
            Database::create(Config::new(dir).pool_size(pool))?
        }
        Err(e) => return Err(e),
    };
    let opts = CsvOptions { delimiter: b',', header: true };
    let mut out = Vec::new();
    for (name, schema) in schemas {
        let path = csv_dir.join(format!("{name}.csv"));
        if db.catalog().tables.contains_key(name) {
            return Err(Error::InvalidInput(format!("table {name:?} exists already; import-tpch loads into a database without the TPC-H tables")));
        }
        let t = Instant::now();
        let rows = db.load_table(name, &schema, &mut |sink| read_rows(&path, &opts, &schema, &mut |_| {}, sink), &mut |_| {})?;
        out.push((name, rows, t.elapsed().as_secs_f64()));
    }
    db.close()?;
    Ok(out)
}

/// `strata import-tpch`.
pub fn import_cmd(dir: &Path, csv_dir: &Path, pool: u64, json: bool) -> Result<(), Error> {
    let t = Instant::now();
    let tables = import(dir, csv_dir, pool)?;
    let seconds = t.elapsed().as_secs_f64();
    if json {
        let list: Vec<_> = tables.iter().map(|(name, rows, s)| serde_json::json!({"table": name, "rows": rows, "seconds": s})).collect();
        crate::cmd::print_json(
            &serde_json::json!({"op": "import-tpch", "tables": list, "seconds": seconds, "pool_bytes": pool, "peak_rss_bytes": strata::util::peak_rss_bytes()}),
        )
    } else {
        for (name, rows, s) in &tables {
            println!("imported {rows} rows into {name} in {s:.2} s");
        }
        println!("imported the TPC-H tables in {seconds:.2} s");
        Ok(())
    }
}

/// `strata demo --tpch`: generates TPC-H at `sf` into DIR/csv, imports it into DIR/db
/// through a pool of `pool` bytes and runs the queries, printing results and timings.
pub fn demo(dir: &Path, pool: u64, sf: f64) -> Result<(), Error> {
    crate::cmd::fresh_demo_dir(dir)?;
    let (csv, db_dir) = (dir.join("csv"), dir.join("db"));
    println!("strata demo --tpch: TPC-H at scale factor {sf}, pool {}", strata::util::Bytes(pool));
    let t = Instant::now();
    generate_in_child(sf, &csv)?;
    println!("generated the 8 tables as CSV in {:.2} s (by `strata gen tpch` in a process of its own)", t.elapsed().as_secs_f64());
    let t = Instant::now();
    let rows: u64 = import(&db_dir, &csv, pool)?.iter().map(|(_, n, _)| n).sum();
    let db = Database::open(crate::cmd::config(&db_dir, pool, true))?;
    let data: u64 = db.buffer().stats().classes.iter().map(|c| c.file_bytes).sum();
    println!(
        "imported {rows} rows in {:.2} s: database {} on disk, {:.1}x the pool\n",
        t.elapsed().as_secs_f64(),
        strata::util::Bytes(data),
        data as f64 / pool as f64
    );
    let mut times = Vec::new();
    let mut wrong = Vec::new();
    for (name, sql) in QUERIES {
        println!("-- TPC-H {}", name.to_uppercase());
        let t = Instant::now();
        let q = strata::sql::prepare_in(&db.catalog(), Some(db.buffer()), sql)?;
        let mut rows = Vec::new();
        crate::sql_cmd::print_result(&db, &q, pool, t, Some(&mut rows))?;
        times.push((name, t.elapsed().as_secs_f64()));
        if sf == 1.0 {
            let n: i32 = name[1..].parse().map_err(|_| Error::InvalidInput(format!("query name {name}")))?;
            let answer = tpchgen::q_and_a::answers_sf1::answer(n).ok_or_else(|| Error::InvalidInput(format!("no SF 1 answer for {name}")))?;
            match differs(&rows, answer) {
                None => println!("{} matches the TPC-H answer at SF 1", name.to_uppercase()),
                Some(d) => {
                    println!("{} DIFFERS from the TPC-H answer at SF 1: {d}", name.to_uppercase());
                    wrong.push(name);
                }
            }
        }
        println!();
    }
    let st = db.buffer().stats();
    let line: Vec<String> = times.iter().map(|(n, s)| format!("{n} {s:.3} s")).collect();
    println!("times: {}", line.join(", "));
    let rss = strata::util::peak_rss_bytes().map(|b| strata::util::Bytes(b).to_string()).unwrap_or_else(|| "unknown".into());
    println!(
        "buffer manager: peak resident {} of a {} pool, peak RSS {rss}, read {}, written {} (spills)",
        strata::util::Bytes(st.peak_resident_bytes),
        strata::util::Bytes(st.pool_bytes),
        strata::util::Bytes(st.bytes_read),
        strata::util::Bytes(st.bytes_written)
    );
    println!("the queries are in crates/strata/tests/tpch/; run one with `strata sql {} --pool SIZE --file Q.sql`", db_dir.display());
    db.close()?;
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(Error::InvalidInput(format!("answers differ from the TPC-H SF 1 answers: {}", wrong.join(", "))))
    }
}

/// Where `rows` (values as text) differ from a TPC-H answer in the TBL form of
/// `tpchgen::q_and_a` (a header line, then `|`-separated cells, padded, numbers rounded to
/// two decimals): None if they agree, numbers within the rounding.
pub fn differs(rows: &[Vec<String>], answer: &str) -> Option<String> {
    let want: Vec<Vec<&str>> = answer.lines().filter(|l| !l.trim().is_empty()).skip(1).map(|l| l.split('|').map(str::trim).collect()).collect();
    if rows.len() != want.len() {
        return Some(format!("{} rows, the answer has {}", rows.len(), want.len()));
    }
    for (i, (g, w)) in rows.iter().zip(&want).enumerate() {
        if g.len() != w.len() {
            return Some(format!("row {}: {} columns, the answer has {}", i + 1, g.len(), w.len()));
        }
        for (a, b) in g.iter().zip(w) {
            let same = match (a.trim().parse::<f64>(), b.parse::<f64>()) {
                (Ok(x), Ok(y)) => (x - y).abs() <= 0.005 + 1e-12 * y.abs(),
                _ => a.trim() == *b,
            };
            if !same {
                return Some(format!("row {}: {a:?} where the answer has {b:?}", i + 1));
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::differs;

    #[test]
    fn answers_compare_within_their_rounding() {
        let answer = "\nn_name   |revenue\nINDONESIA  |55502041.17\nVIETNAM |55295087.00\n";
        let rows = |a: &str, b: &str| vec![vec!["INDONESIA".to_owned(), a.to_owned()], vec!["VIETNAM".to_owned(), b.to_owned()]];
        assert_eq!(differs(&rows("55502041.169700064", "55295086.99669998"), answer), None);
        assert!(differs(&rows("55502041.18", "55295087"), answer).unwrap().contains("row 1"));
        assert!(differs(&rows("55502041.17", "55295087")[..1], answer).unwrap().contains("1 rows"));
        let other = vec![vec!["INDIA".to_owned(), "55502041.17".to_owned()], vec!["VIETNAM".to_owned(), "55295087".to_owned()]];
        assert!(differs(&other, answer).is_some());
    }
}
