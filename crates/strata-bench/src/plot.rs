//! `--plot FILE.png`: a grouped bar chart of every engine's throughput (operations per
//! second, log scale) per run of a benchmark report, with each bar's peak RSS written above
//! it where the engines report one. Text is drawn with an embedded font
//! (DejaVu Sans from the `dejavu` crate, rendered by ab_glyph), so no system fonts are needed.

use std::path::Path;
use std::sync::Once;

use plotters::prelude::*;
use plotters::style::FontTransform;
use serde_json::Value;

use crate::benchmarks::{run_label, short_size, varying_params};

const FONT: &str = "sans-serif";

const COLORS: [RGBColor; 6] = [
    RGBColor(0x1f, 0x77, 0xb4), // strata: blue
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
    RGBColor(0x7f, 0x7f, 0x7f),
];

fn register_font() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let _ = plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular());
    });
}

fn fmt_ops(v: f64) -> String {
    if v >= 1e9 {
        format!("{:.0}G", v / 1e9)
    } else if v >= 1e6 {
        format!("{:.0}M", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.0}k", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}

/// Draws `report` (one benchmark's JSON object) as a PNG at `path`.
pub fn plot(report: &Value, path: &Path) -> Result<(), String> {
    register_font();
    let runs = report.get("runs").and_then(Value::as_array).cloned().unwrap_or_default();
    if runs.is_empty() {
        return Err("nothing to plot: the report has no runs".into());
    }
    // Engines in order of first appearance, strata first.
    let mut engines: Vec<String> = vec!["strata".into()];
    for r in &runs {
        for k in r["engines"].as_object().into_iter().flatten().map(|(k, _)| k) {
            if !engines.contains(k) {
                engines.push(k.clone());
            }
        }
    }
    // Batched random reads (`--queue-depth`) count batches as operations; their pages/s
    // compare across thread counts.
    let (metric, unit) = if runs.iter().any(|r| r["engines"].as_object().into_iter().flatten().any(|(_, v)| v.get("pages_per_sec").is_some())) {
        ("pages_per_sec", "pages")
    } else {
        ("ops_per_sec", "operations")
    };
    let varying = varying_params(report);
    let labels: Vec<String> = runs.iter().map(|r| run_label(&r["params"], &varying)).collect();
    let values: Vec<Vec<Option<f64>>> = runs
        .iter()
        .map(|r| engines.iter().map(|e| r["engines"].get(e).and_then(|x| x.get(metric)).and_then(Value::as_f64).filter(|&v| v > 0.0)).collect())
        .collect();
    let all: Vec<f64> = values.iter().flatten().flatten().copied().collect();
    // Room above the tallest bar for its peak-RSS label, where engines report one.
    let with_rss = runs.iter().any(|r| r["engines"].as_object().into_iter().flatten().any(|(_, v)| v.get("peak_rss_bytes").is_some()));
    let headroom = if with_rss { 30.0 } else { 3.0 };
    let ymax = all.iter().copied().fold(1.0, f64::max) * headroom;
    let ymin = (all.iter().copied().fold(f64::INFINITY, f64::min) / 3.0).max(0.1).min(ymax / 10.0);

    let n = runs.len();
    let width = (160 + 26 * engines.len() as u32 * n as u32 + 12 * n as u32).max(900);
    let longest = labels.iter().map(String::len).max().unwrap_or(4) as u32;
    let label_area = 24 + 7 * longest;
    let height = 560 + label_area;
    let e = |e: DrawingAreaErrorKind<_>| format!("plot {}: {e}", path.display());
    let root = BitMapBackend::new(path, (width, height)).into_drawing_area();
    root.fill(&WHITE).map_err(e)?;
    let bench = report["bench"].as_str().unwrap_or("?");
    let m = &report["machine"];
    let title = format!(
        "strata bench {bench}: {unit}/s per engine (log scale){} — {} cores, {}, kernel {}",
        if with_rss { ", peak RSS above each bar" } else { "" },
        m["cores"],
        m["memory_bytes"].as_u64().map(short_size).unwrap_or_else(|| "?".into()),
        m["kernel"].as_str().unwrap_or("?")
    );
    let mut chart = ChartBuilder::on(&root)
        .caption(title, (FONT, 18))
        .margin(12)
        .x_label_area_size(label_area)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..n as f64, (ymin..ymax).log_scale())
        .map_err(e)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(0)
        // A log axis with the default light lines draws a dense grey band at some decades.
        .y_max_light_lines(0)
        .y_desc(format!("{unit} / s"))
        .y_label_formatter(&|v| fmt_ops(*v))
        .label_style((FONT, 14))
        .axis_desc_style((FONT, 15))
        .draw()
        .map_err(e)?;
    let k = engines.len() as f64;
    for (j, name) in engines.iter().enumerate() {
        let color = COLORS[j % COLORS.len()];
        let bars: Vec<_> = values
            .iter()
            .enumerate()
            .filter_map(|(i, v)| {
                let v = v[j]?;
                let x0 = i as f64 + 0.1 + 0.8 * j as f64 / k;
                Some(Rectangle::new([(x0, ymin), (x0 + 0.8 / k, v)], color.filled()))
            })
            .collect();
        chart
            .draw_series(bars)
            .map_err(e)?
            .label(if runs.iter().any(|r| r["engines"][name.as_str()]["capped"] == Value::Bool(false)) { format!("{name} (uncapped)") } else { name.clone() })
            .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 14, y + 6)], color.filled()));
        // Failed runs: a red cross where the bar would be.
        let fails: Vec<_> = runs
            .iter()
            .enumerate()
            .filter(|(_, r)| r["engines"].get(name).is_some_and(|x| x.get("failed").is_some()))
            .map(|(i, _)| Cross::new((i as f64 + 0.1 + 0.8 * (j as f64 + 0.5) / k, ymin * 2.0), 6, RED.stroke_width(3)))
            .collect();
        chart.draw_series(fails).map_err(e)?;
        // Peak RSS above the bar where the engine reports it (bench btree).
        let rss_style = TextStyle::from((FONT, 11).into_font()).transform(FontTransform::Rotate270).color(&BLACK);
        let rss: Vec<_> = runs
            .iter()
            .enumerate()
            .filter_map(|(i, r)| {
                let b = r["engines"].get(name)?.get("peak_rss_bytes")?.as_u64()?;
                let v = values[i][j]?;
                let x = i as f64 + 0.1 + 0.8 * (j as f64 + 0.5) / k;
                Some(Text::new(short_size(b), (x, v * 1.15), rss_style.clone()))
            })
            .collect();
        chart.draw_series(rss).map_err(e)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font((FONT, 15))
        .draw()
        .map_err(e)?;
    // Run labels, rotated, under each group of bars.
    for (i, label) in labels.iter().enumerate() {
        let (px, py) = chart.backend_coord(&(i as f64 + 0.5, ymin));
        let style = TextStyle::from((FONT, 14).into_font()).transform(FontTransform::Rotate90).color(&BLACK);
        root.draw(&Text::new(label.clone(), (px - 7, py + 8), style)).map_err(e)?;
    }
    if runs.iter().any(|r| r["engines"].as_object().is_some_and(|m| m.values().any(|x| x.get("failed").is_some()))) {
        root.draw(&Text::new("red x = engine failed the run", (80, 40), (FONT, 14).into_font().color(&RED))).map_err(e)?;
    }
    root.present().map_err(e)?;
    Ok(())
}

/// One engine's memory timeline across the phases of a run: samples `(seconds since the
/// first phase started, small bytes, large bytes, virtual bytes)` and where each phase began.
struct Timeline {
    samples: Vec<(f64, f64, f64, f64)>,
    phases: Vec<(f64, String)>,
}

/// The memory timelines (`memory_timeline` of mixed-size) of each engine over the runs of
/// the report's first thread count, phase after phase.
fn timelines(runs: &[Value]) -> Vec<(String, Timeline)> {
    let threads = runs.first().map(|r| r["params"]["threads"].clone());
    let mut out: Vec<(String, Timeline)> = Vec::new();
    for r in runs.iter().filter(|r| Some(&r["params"]["threads"]) == threads.as_ref()) {
        let phase = r["params"]["phase"].as_str().unwrap_or("?").to_string();
        for (name, e) in r["engines"].as_object().into_iter().flatten() {
            let i = match out.iter().position(|(n, _)| n == name) {
                Some(i) => i,
                None => {
                    out.push((name.clone(), Timeline { samples: Vec::new(), phases: Vec::new() }));
                    out.len() - 1
                }
            };
            let t = &mut out[i].1;
            let offset = t.samples.last().map_or(0.0, |s| s.0);
            let failed = e.get("failed").is_some();
            t.phases.push((offset, if failed { format!("{phase}: failed") } else { phase.clone() }));
            for row in e["memory_timeline"]["samples"].as_array().into_iter().flatten() {
                let v = |k: usize| row.get(k).and_then(Value::as_f64).unwrap_or(0.0);
                t.samples.push((offset + v(0), v(1), v(2), v(3)));
            }
        }
    }
    out
}

/// Draws the memory timelines of a `mixed-size` report as a PNG at `path`: per engine, the
/// physical memory of resident small and large pages (stacked) over the phases, against
/// the pool. Other reports have no timeline: an error says so.
pub fn plot_memory(report: &Value, path: &Path) -> Result<(), String> {
    register_font();
    let runs = report.get("runs").and_then(Value::as_array).cloned().unwrap_or_default();
    let engines: Vec<(String, Timeline)> = timelines(&runs).into_iter().filter(|(_, t)| t.samples.len() > 1).collect();
    if engines.is_empty() {
        return Err("nothing to plot: the report has no memory timelines (bench mixed-size records them)".into());
    }
    let p = &runs[0]["params"];
    let pool = p["pool_bytes"].as_f64().unwrap_or(0.0) / MIB;
    let sizes: Vec<u64> = p["page_size"].as_array().into_iter().flatten().filter_map(Value::as_u64).collect();
    let (small, large) = (sizes.first().copied().unwrap_or(0), sizes.get(1).copied().unwrap_or(0));
    let ymax = engines.iter().flat_map(|(_, t)| t.samples.iter().map(|s| (s.1 + s.2) / MIB)).fold(pool, f64::max) * 1.6;
    let e = |e: DrawingAreaErrorKind<_>| format!("plot {}: {e}", path.display());
    let root = BitMapBackend::new(path, (560 * engines.len() as u32, 520)).into_drawing_area();
    root.fill(&WHITE).map_err(e)?;
    let title = format!(
        "strata bench mixed-size: memory of resident pages over the phases ({} threads, {} + {} pages, pool {})",
        p["threads"],
        short_size(small),
        short_size(large),
        short_size(p["pool_bytes"].as_u64().unwrap_or(0))
    );
    let (top, panels) = root.split_vertically(36);
    top.titled(&title, (FONT, 17)).map_err(e)?;
    for ((name, t), area) in engines.iter().zip(panels.split_evenly((1, engines.len()))) {
        let xmax = t.samples.last().map_or(1.0, |s| s.0).max(0.001);
        let (vmin, vmax) = t.samples.iter().fold((f64::MAX, 0f64), |(a, b), s| (a.min(s.3), b.max(s.3)));
        let caption = format!(
            "{name} (virtual reserved {}{})",
            short_size(vmin as u64),
            if vmax > vmin { format!("..{}", short_size(vmax as u64)) } else { String::new() }
        );
        let mut chart = ChartBuilder::on(&area)
            .caption(caption, (FONT, 15))
            .margin(10)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(0f64..xmax, 0f64..ymax)
            .map_err(e)?;
        chart
            .configure_mesh()
            .max_light_lines(0)
            .x_desc("seconds (phases one after the other)")
            .y_desc("MiB resident")
            .label_style((FONT, 13))
            .axis_desc_style((FONT, 14))
            .draw()
            .map_err(e)?;
        let large_color = COLORS[0];
        let small_color = COLORS[1];
        // (Areas and lines as polygons and paths: plotters' series types need features the
        // workspace does not build.)
        let large_area: Vec<(f64, f64)> = [(0.0, 0.0)].into_iter().chain(t.samples.iter().map(|s| (s.0, s.2 / MIB))).chain([(xmax, 0.0)]).collect();
        chart
            .draw_series([Polygon::new(large_area, large_color.mix(0.45))])
            .map_err(e)?
            .label(format!("{} pages", short_size(large)))
            .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 14, y + 6)], large_color.mix(0.45).filled()));
        // Small pages stacked on the large ones: the band between the two lines.
        let small_band: Vec<(f64, f64)> = t.samples.iter().map(|s| (s.0, s.2 / MIB)).chain(t.samples.iter().rev().map(|s| (s.0, (s.1 + s.2) / MIB))).collect();
        chart
            .draw_series([Polygon::new(small_band, small_color.mix(0.45))])
            .map_err(e)?
            .label(format!("{} pages (stacked)", short_size(small)))
            .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 14, y + 6)], small_color.mix(0.45).filled()));
        chart
            .draw_series([PathElement::new(t.samples.iter().map(|s| (s.0, (s.1 + s.2) / MIB)).collect::<Vec<_>>(), small_color.stroke_width(2))])
            .map_err(e)?;
        chart
            .draw_series([PathElement::new(vec![(0.0, pool), (xmax, pool)], RED.stroke_width(2))])
            .map_err(e)?
            .label("pool")
            .legend(|(x, y)| PathElement::new([(x, y), (x + 14, y)], RED.stroke_width(2)));
        // Phase boundaries, each phase named just above the pool line (a phase the engine
        // failed has no samples: its name sits at the end of the timeline, in red).
        for (at, phase) in &t.phases {
            chart.draw_series([PathElement::new(vec![(*at, 0.0), (*at, pool * 1.12)], BLACK.mix(0.5))]).map_err(e)?;
            let (x, color) = if phase.ends_with("failed") { ((*at).min(xmax * 0.7), RED) } else { (*at + xmax * 0.01, BLACK) };
            chart.draw_series([Text::new(phase.clone(), (x, pool * 1.1), (FONT, 13).into_font().color(&color))]).map_err(e)?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .margin(30)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font((FONT, 13))
            .draw()
            .map_err(e)?;
    }
    root.present().map_err(e)?;
    Ok(())
}

const MIB: f64 = (1u64 << 20) as f64;

/// Draws a `partitions` report as a PNG at `path`: per data set (in and out of memory), a
/// panel of throughput (ops/s) against the thread count, one line per partition count.
pub fn plot_partitions(report: &Value, path: &Path) -> Result<(), String> {
    register_font();
    let runs = report.get("runs").and_then(Value::as_array).cloned().unwrap_or_default();
    if runs.is_empty() {
        return Err("nothing to plot: the report has no runs".into());
    }
    let mut memories: Vec<String> = Vec::new();
    let mut engines: Vec<String> = Vec::new();
    for r in &runs {
        let m = r["params"]["memory"].as_str().unwrap_or("?").to_string();
        if !memories.contains(&m) {
            memories.push(m);
        }
        for k in r["engines"].as_object().into_iter().flatten().map(|(k, _)| k) {
            if !engines.contains(k) {
                engines.push(k.clone());
            }
        }
    }
    // strata-p1, strata-p2, ... in numeric order.
    engines.sort_by_key(|e| e.trim_start_matches("strata-p").parse::<u64>().unwrap_or(u64::MAX));
    let p0 = &runs[0]["params"];
    let e = |e: DrawingAreaErrorKind<_>| format!("plot {}: {e}", path.display());
    let root = BitMapBackend::new(path, (560 * memories.len() as u32, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(e)?;
    let title = format!(
        "strata bench partitions: uniform random reads of {} pages, pool {}, by clock partitions",
        short_size(p0["page_size"].as_u64().unwrap_or(0)),
        short_size(p0["pool_bytes"].as_u64().unwrap_or(0))
    );
    let (top, panels) = root.split_vertically(36);
    top.titled(&title, (FONT, 17)).map_err(e)?;
    for (memory, area) in memories.iter().zip(panels.split_evenly((1, memories.len()))) {
        let rs: Vec<&Value> = runs.iter().filter(|r| r["params"]["memory"].as_str() == Some(memory)).collect();
        let threads: Vec<f64> = rs.iter().filter_map(|r| r["params"]["threads"].as_f64()).collect();
        let xmax = threads.iter().copied().fold(1.0, f64::max);
        let point = |r: &Value, name: &str| r["engines"].get(name).and_then(|x| x.get("ops_per_sec")).and_then(Value::as_f64).filter(|&v| v > 0.0);
        let ymax = rs.iter().flat_map(|r| engines.iter().filter_map(|n| point(r, n))).fold(1.0, f64::max) * 1.25;
        let data = rs.first().and_then(|r| r["params"]["data_bytes"].as_u64()).unwrap_or(0);
        let caption = format!("{} (data {})", if memory == "out" { "out of memory" } else { "in memory" }, short_size(data));
        let mut chart = ChartBuilder::on(&area)
            .caption(caption, (FONT, 15))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(64)
            .build_cartesian_2d(0.5f64..xmax + 0.5, 0f64..ymax)
            .map_err(e)?;
        chart
            .configure_mesh()
            .max_light_lines(0)
            .x_labels(xmax as usize + 1)
            .x_label_formatter(&|x| if x.fract() == 0.0 && *x >= 1.0 { format!("{x:.0}") } else { String::new() })
            .y_label_formatter(&|y| fmt_ops(*y))
            .x_desc("threads")
            .y_desc("reads per second")
            .label_style((FONT, 13))
            .axis_desc_style((FONT, 14))
            .draw()
            .map_err(e)?;
        for (i, name) in engines.iter().enumerate() {
            let color = COLORS[i % COLORS.len()];
            let pts: Vec<(f64, f64)> = rs.iter().filter_map(|r| Some((r["params"]["threads"].as_f64()?, point(r, name)?))).collect();
            let label = format!("{} partition{}", name.trim_start_matches("strata-p"), if name == "strata-p1" { "" } else { "s" });
            chart
                .draw_series([PathElement::new(pts.clone(), color.stroke_width(2))])
                .map_err(e)?
                .label(label)
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 14, y)], color.stroke_width(2)));
            chart.draw_series(pts.iter().map(|&p| Circle::new(p, 4, color.filled()))).map_err(e)?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .margin(20)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font((FONT, 13))
            .draw()
            .map_err(e)?;
    }
    root.present().map_err(e)?;
    Ok(())
}

/// Draws a `bfs` report as a PNG at `path`: per run (phase and thread count) one bar per
/// engine of the seconds per BFS (linear scale, labelled), with the BFS's CPU seconds (the
/// whole process) as a narrower dark bar inside it, and the pool and graph in the title.
pub fn plot_bfs(report: &Value, path: &Path) -> Result<(), String> {
    register_font();
    let runs = report.get("runs").and_then(Value::as_array).cloned().unwrap_or_default();
    if runs.is_empty() {
        return Err("nothing to plot: the report has no runs".into());
    }
    let mut engines: Vec<String> = Vec::new();
    for r in &runs {
        for k in r["engines"].as_object().into_iter().flatten().map(|(k, _)| k) {
            if !engines.contains(k) {
                engines.push(k.clone());
            }
        }
    }
    let varying = varying_params(report);
    let labels: Vec<String> = runs.iter().map(|r| run_label(&r["params"], &varying)).collect();
    let get = |r: &Value, name: &str, key: &str| r["engines"].get(name).and_then(|x| x.get(key)).and_then(Value::as_f64);
    let ymax = runs.iter().flat_map(|r| engines.iter().filter_map(|n| get(r, n, "seconds"))).fold(0.1, f64::max) * 1.25;
    let n = runs.len();
    let width = (160 + 70 * engines.len() as u32 * n as u32).max(900);
    let e = |e: DrawingAreaErrorKind<_>| format!("plot {}: {e}", path.display());
    let root = BitMapBackend::new(path, (width, 600)).into_drawing_area();
    root.fill(&WHITE).map_err(e)?;
    let p0 = &runs[0]["params"];
    let m = &report["machine"];
    let title = "strata bench bfs: seconds per BFS, lower is better (dark inner bar: CPU seconds of the process)";
    let subtitle = format!(
        "graph: {} vertices, {} edges, CSR {} in {} pages; pool {}; {} cores, kernel {}",
        p0["vertices"],
        p0["edges"],
        p0["data_bytes"].as_u64().map(short_size).unwrap_or_else(|| "?".into()),
        p0["page_size"].as_u64().map(short_size).unwrap_or_else(|| "?".into()),
        p0["pool_bytes"].as_u64().map(short_size).unwrap_or_else(|| "?".into()),
        m["cores"],
        m["kernel"].as_str().unwrap_or("?")
    );
    let (top, body) = root.split_vertically(56);
    top.draw(&Text::new(title, (14, 8), (FONT, 18).into_font().color(&BLACK))).map_err(e)?;
    top.draw(&Text::new(subtitle, (14, 32), (FONT, 14).into_font().color(&BLACK))).map_err(e)?;
    let mut chart = ChartBuilder::on(&body).margin(12).x_label_area_size(40).y_label_area_size(60).build_cartesian_2d(0f64..n as f64, 0f64..ymax).map_err(e)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(0)
        .y_max_light_lines(0)
        .y_desc("seconds per BFS (lower is better)")
        .label_style((FONT, 14))
        .axis_desc_style((FONT, 15))
        .draw()
        .map_err(e)?;
    let k = engines.len() as f64;
    for (j, name) in engines.iter().enumerate() {
        let color = COLORS[j % COLORS.len()];
        let x0 = |i: usize| i as f64 + 0.1 + 0.8 * j as f64 / k;
        let bars: Vec<_> = runs
            .iter()
            .enumerate()
            .filter_map(|(i, r)| Some(Rectangle::new([(x0(i), 0.0), (x0(i) + 0.8 / k, get(r, name, "seconds")?)], color.mix(0.55).filled())))
            .collect();
        chart.draw_series(bars).map_err(e)?.label(name.clone()).legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 14, y + 6)], color.mix(0.55).filled()));
        let cpu: Vec<_> = runs
            .iter()
            .enumerate()
            .filter_map(|(i, r)| Some(Rectangle::new([(x0(i) + 0.2 / k, 0.0), (x0(i) + 0.6 / k, get(r, name, "cpu_seconds")?)], color.filled())))
            .collect();
        chart.draw_series(cpu).map_err(e)?;
        let text: Vec<_> = runs
            .iter()
            .enumerate()
            .filter_map(|(i, r)| {
                let s = get(r, name, "seconds")?;
                let c = get(r, name, "cpu_seconds").unwrap_or(0.0);
                Some(Text::new(format!("{s:.2} s ({c:.2})"), (x0(i) + 0.02 / k, s + ymax * 0.015), (FONT, 12).into_font().color(&BLACK)))
            })
            .collect();
        chart.draw_series(text).map_err(e)?;
        let fails: Vec<_> = runs
            .iter()
            .enumerate()
            .filter(|(_, r)| r["engines"].get(name).is_some_and(|x| x.get("failed").is_some()))
            .map(|(i, _)| Cross::new((x0(i) + 0.4 / k, ymax * 0.05), 6, RED.stroke_width(3)))
            .collect();
        chart.draw_series(fails).map_err(e)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font((FONT, 15))
        .draw()
        .map_err(e)?;
    for (i, label) in labels.iter().enumerate() {
        let (px, py) = chart.backend_coord(&(i as f64 + 0.5, 0.0));
        root.draw(&Text::new(label.clone(), (px - 4 * label.len() as i32, py + 10), (FONT, 14).into_font().color(&BLACK))).map_err(e)?;
    }
    root.present().map_err(e)?;
    Ok(())
}
