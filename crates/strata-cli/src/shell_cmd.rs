//! `strata shell DIR [--pool SIZE]`: an interactive SQL shell, as `sqlite3` and `duckdb`
//! have. In a terminal: line editing and history (the `rustyline` crate; the history is
//! kept in ~/.strata_history). Statements end with `;` and may span lines; each result is
//! printed as an aligned table (as `strata sql` prints it); a bad statement prints its
//! error and the shell goes on. Dot commands: `.help`, `.tables`, `.schema [TABLE]`,
//! `.timer on|off`, `.quit`. When stdin is not a terminal, the statements are read from
//! it (no prompts), so `strata shell DIR < script.sql` runs a script; then the exit status
//! is non-zero if a statement failed.

use std::io::{self, BufRead, BufWriter, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::Args;
use rustyline::error::ReadlineError;
use strata::access::table::{ColumnType, Value};
use strata::{Database, Error};

use crate::sql_cmd::{stdout_err, Out};

/// `strata shell`.
#[derive(Args)]
pub struct ShellArgs {
    dir: PathBuf,
    /// Buffer pool size.
    #[arg(long, value_parser = crate::parse_size, default_value = "64MiB")]
    pool: u64,
}

const HELP: &str = "\
Statements end with ; and may span lines (SELECT ... or EXPLAIN SELECT ...).
.help           this text
.tables         the tables
.schema [T]     the columns of every table, or of table T
.timer on|off   print each statement's time (off at the start)
.quit           leave (also .exit, or Ctrl-D)";

/// The shell's state between statements.
struct Shell {
    db: Database,
    pool: u64,
    timer: bool,
    failed: u64,
}

/// Where the first statement of `text` ends (just after its `;`), if it is complete: a `;`
/// outside quotes (`'...'`, `"..."`) and comments (`-- ...` to the end of the line,
/// `/* ... */`).
fn statement_end(text: &str) -> Option<usize> {
    let b = text.as_bytes();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            q @ (b'\'' | b'"') => {
                // A doubled quote inside is the quote itself: the scan just goes on.
                i += 1;
                while i < b.len() && b[i] != q {
                    i += 1;
                }
            }
            b'-' if b.get(i + 1) == Some(&b'-') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                i += 2;
                while i + 1 < b.len() && !(b[i] == b'*' && b[i + 1] == b'/') {
                    i += 1;
                }
                i += 1;
            }
            b';' => return Some(i + 1),
            _ => {}
        }
        i += 1;
    }
    None
}

/// Whether `text` holds nothing but blanks, `;` and comments.
fn is_blank(text: &str) -> bool {
    let mut rest = text.trim_start_matches(|c: char| c.is_whitespace() || c == ';');
    loop {
        if let Some(r) = rest.strip_prefix("--") {
            rest = r.split_once('\n').map_or("", |x| x.1);
        } else if let Some(r) = rest.strip_prefix("/*") {
            rest = r.split_once("*/").map_or("", |x| x.1);
        } else {
            return rest.is_empty();
        }
        rest = rest.trim_start_matches(|c: char| c.is_whitespace() || c == ';');
    }
}

fn sql_type(t: ColumnType) -> &'static str {
    match t {
        ColumnType::I64 => "BIGINT",
        ColumnType::F64 => "DOUBLE",
        ColumnType::Str => "VARCHAR",
        ColumnType::Date => "DATE",
        ColumnType::Bool => "BOOLEAN",
        ColumnType::Bytes => "BYTEA",
    }
}

impl Shell {
    /// Runs one statement, printing its result (or its error, on stderr).
    fn statement(&mut self, sql: &str) {
        if let Err(e) = self.run(sql) {
            self.failed += 1;
            eprintln!("error: {e}");
        }
    }

    fn run(&self, sql: &str) -> Result<(), Error> {
        let started = Instant::now();
        let q = strata::sql::prepare_in(&self.db.catalog(), Some(self.db.buffer()), sql)?;
        let stdout = io::stdout();
        if q.is_explain() {
            let mut out = stdout.lock();
            q.execute(self.db.buffer(), &mut |row| {
                if let Some(Value::Str(line)) = row.first() {
                    writeln!(out, "{line}").map_err(stdout_err)?;
                }
                Ok(true)
            })?;
            return out.flush().map_err(stdout_err);
        }
        let mut out = Out::new(BufWriter::new(stdout.lock()), &q.columns, false, false).map_err(stdout_err)?;
        let mut rows = 0u64;
        let r = q.execute(self.db.buffer(), &mut |row| {
            rows += 1;
            out.row(row).map_err(stdout_err)?;
            Ok(true)
        });
        if let Err(e) = r {
            let _ = out.finish_partial();
            return Err(e);
        }
        let peak = self.db.buffer().stats().peak_resident_bytes;
        out.finish_timed(rows, started.elapsed().as_secs_f64(), self.timer, self.pool, peak).map_err(stdout_err)
    }

    /// A dot command; `false` to leave.
    fn dot(&mut self, line: &str) -> bool {
        let mut words = line.split_whitespace();
        let cmd = words.next().unwrap_or("");
        let args: Vec<&str> = words.collect();
        let r: Result<(), String> = match (cmd, args.as_slice()) {
            (".quit" | ".exit", []) => return false,
            (".help", []) => {
                println!("{HELP}");
                Ok(())
            }
            (".timer", [on @ ("on" | "off")]) => {
                self.timer = *on == "on";
                Ok(())
            }
            (".timer", _) => Err("usage: .timer on|off".into()),
            (".tables", []) => {
                for name in self.db.catalog().tables.keys() {
                    println!("{name}");
                }
                Ok(())
            }
            (".schema", [] | [_]) => {
                let catalog = self.db.catalog();
                let mut any = false;
                for (name, t) in &catalog.tables {
                    if args.first().is_some_and(|want| !want.eq_ignore_ascii_case(name)) {
                        continue;
                    }
                    any = true;
                    let cols: Vec<String> = t.schema.columns.iter().map(|c| format!("{} {}", c.name, sql_type(c.ty))).collect();
                    println!("CREATE TABLE {name} ({});", cols.join(", "));
                }
                match (any, args.first()) {
                    (false, Some(t)) => Err(format!("no table named {t:?}")),
                    _ => Ok(()),
                }
            }
            _ => Err(format!("unknown command or arguments: {line:?}; .help lists the commands")),
        };
        if let Err(e) = r {
            self.failed += 1;
            eprintln!("error: {e}");
        }
        let _ = io::stdout().flush();
        true
    }

    /// Takes one line of input into `pending`: a dot command (at the start of a
    /// statement) runs at once, complete statements run in order. `false` to leave.
    fn line(&mut self, pending: &mut String, line: &str) -> bool {
        if is_blank(pending) && line.trim_start().starts_with('.') {
            pending.clear();
            return self.dot(line.trim());
        }
        pending.push_str(line);
        pending.push('\n');
        while let Some(end) = statement_end(pending) {
            let stmt: String = pending.drain(..end).collect();
            if !is_blank(&stmt) {
                self.statement(&stmt);
            }
        }
        if is_blank(pending) {
            pending.clear();
        }
        true
    }
}

fn history_file() -> Option<PathBuf> {
    std::env::var_os("HOME").filter(|h| !h.is_empty()).map(|h| Path::new(&h).join(".strata_history"))
}

pub fn shell(a: ShellArgs) -> Result<(), Error> {
    let db = Database::open(crate::cmd::config(&a.dir, a.pool, true))?;
    let mut sh = Shell { db, pool: a.pool, timer: false, failed: 0 };
    let mut pending = String::new();
    if io::stdin().is_terminal() {
        println!("strata shell: {} with a {} pool; statements end with ';', .help for help", a.dir.display(), strata::util::Bytes(a.pool));
        let config = rustyline::Config::builder().auto_add_history(false).max_history_size(10_000).map_err(|e| Error::InvalidInput(e.to_string()))?.build();
        let mut ed: rustyline::Editor<(), rustyline::history::FileHistory> =
            rustyline::Editor::with_config(config).map_err(|e| Error::InvalidInput(format!("terminal: {e}")))?;
        let hist = history_file();
        if let Some(h) = &hist {
            let _ = ed.load_history(h);
        }
        loop {
            let prompt = if is_blank(&pending) { "strata> " } else { "   ...> " };
            match ed.readline(prompt) {
                Ok(line) => {
                    if !line.trim().is_empty() {
                        let _ = ed.add_history_entry(line.as_str());
                    }
                    if !sh.line(&mut pending, &line) {
                        break;
                    }
                }
                // Ctrl-C drops the statement being typed.
                Err(ReadlineError::Interrupted) => pending.clear(),
                Err(ReadlineError::Eof) => break,
                Err(e) => {
                    eprintln!("error: {e}");
                    break;
                }
            }
        }
        if let Some(h) = &hist {
            let _ = ed.save_history(h);
        }
        return sh.db.close();
    }
    // Not a terminal: statements from stdin, no prompts; a last statement without `;` runs too.
    let stdin = io::stdin();
    let mut buf = String::new();
    let mut lock = stdin.lock();
    loop {
        buf.clear();
        if lock.read_line(&mut buf).map_err(|e| Error::io("read", "stdin", e))? == 0 {
            break;
        }
        if !sh.line(&mut pending, buf.trim_end_matches(['\n', '\r'])) {
            pending.clear();
            break;
        }
    }
    if !is_blank(&pending) {
        let stmt = std::mem::take(&mut pending);
        sh.statement(&stmt);
    }
    let failed = sh.failed;
    sh.db.close()?;
    if failed > 0 {
        return Err(Error::InvalidInput(format!("{failed} statement{} failed", if failed == 1 { "" } else { "s" })));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{is_blank, statement_end};

    #[test]
    fn statements_end_at_a_semicolon_outside_quotes_and_comments() {
        assert_eq!(statement_end("SELECT 1; SELECT 2;"), Some(9));
        assert_eq!(statement_end("SELECT ';' AS x"), None);
        assert_eq!(statement_end("SELECT 'it''s;' AS x;"), Some(21));
        assert_eq!(statement_end("SELECT 1 -- a; comment\n, 2;"), Some(27));
        assert_eq!(statement_end("SELECT /* ; */ 1"), None);
        assert_eq!(statement_end("SELECT \"a;b\" FROM t;"), Some(20));
        assert!(is_blank("  ;; -- nothing\n /* at all */ "));
        assert!(!is_blank("-- c\nSELECT 1"));
    }
}
