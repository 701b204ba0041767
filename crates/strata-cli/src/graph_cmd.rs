//! `strata import-edges DIR GRAPH --from FILE [--pool SIZE] [--json]`: load a directed graph
//! from a SNAP text edge list into CSR pages (contract: docs/cli.md).

use std::fs::File;
use std::io::BufReader;
use std::path::Path;
use std::time::Instant;

use strata::{Config, Database, Error};

use crate::progress;

pub fn import_edges(dir: &Path, graph: &str, from: &Path, pool: u64, json: bool) -> Result<(), Error> {
    let file = File::open(from).map_err(|e| Error::io("open", from, e))?;
    let len = file.metadata().map_err(|e| Error::io("stat", from, e))?.len();
    let db = Database::open(Config::new(dir).pool_size(pool))?;
    let st = db.buffer().stats();
    if !st.direct_io && !st.classes.is_empty() && !json {
        eprintln!("warning: the filesystem refused O_DIRECT; using buffered I/O (the OS page cache may hold extra copies)");
    }
    let start = Instant::now();
    let pb = progress::bytes(len, "importing edges", json);
    let mut reader = BufReader::with_capacity(256 << 10, file);
    let g = db.import_edges(graph, &mut reader, &mut |done| pb.set_position(done)).map_err(|e| match e {
        // Name the file in input errors (they name the line).
        Error::InvalidInput(msg) => Error::InvalidInput(format!("{}: {msg}", from.display())),
        e => e,
    })?;
    pb.finish_and_clear();
    let st = db.buffer().stats();
    db.close()?;
    let seconds = start.elapsed().as_secs_f64();
    let pages = g.pages().count();
    if json {
        let s = serde_json::to_string(&serde_json::json!({
            "op": "import-edges", "graph": graph, "vertices": g.vertices, "edges": g.edges,
            "index_space": g.index_space, "renumbered": g.renumbered, "pages": pages,
            "seconds": seconds, "pool_bytes": pool, "peak_resident_bytes": st.peak_resident_bytes,
            "bytes_read": st.bytes_read, "bytes_written": st.bytes_written,
            "peak_rss_bytes": strata::util::peak_rss_bytes(),
        }))
        .map_err(|e| Error::InvalidInput(format!("cannot encode output: {e}")))?;
        println!("{s}");
    } else {
        println!(
            "imported graph {graph}: {} vertices, {} edges ({} ids, {pages} pages) in {seconds:.2} s",
            g.vertices,
            g.edges,
            if g.renumbered { "sparse ids renumbered" } else { "dense" },
        );
    }
    Ok(())
}
