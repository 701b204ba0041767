//! Redraws a saved benchmark report: `cargo run --release -p strata-bench --example replot --
//! REPORT.json OUT.png` (the chart `strata bench --plot` draws; partitions and bfs reports
//! get their own charts).

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, report, out] = args.as_slice() else {
        eprintln!("usage: replot REPORT.json OUT.png");
        std::process::exit(2);
    };
    let text = std::fs::read_to_string(report).unwrap_or_else(|e| {
        eprintln!("replot: cannot read {report}: {e}");
        std::process::exit(1);
    });
    let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|e| {
        eprintln!("replot: {report} is not JSON: {e}");
        std::process::exit(1);
    });
    let out = std::path::Path::new(out);
    let drawn = match v["bench"].as_str() {
        Some("partitions") => strata_bench::plot::plot_partitions(&v, out),
        Some("bfs") => strata_bench::plot::plot_bfs(&v, out),
        _ => strata_bench::plot::plot(&v, out),
    };
    if let Err(e) = drawn {
        eprintln!("replot: {e}");
        std::process::exit(1);
    }
}
