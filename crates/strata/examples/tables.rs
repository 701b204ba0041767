//! A table from the library side: create it, append rows from several threads (each its own
//! transactions), look rows up by id, scan them, and reopen the database after a simulated
//! crash (everything committed is there, the transaction in flight is not).
//!
//! ```sh
//! cargo run --release -p strata --example tables
//! ```

use std::sync::Arc;

use strata::access::table::{Schema, Value};
use strata::{Config, Database, Result};

fn main() -> Result<()> {
    let dir = std::env::temp_dir().join(format!("strata-tables-example-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    // A 4 MiB pool: the table below is several times larger, so pages come and go.
    let config = || Config::new(&dir).pool_size(4 << 20).min_page(4096);
    let db = Arc::new(Database::create(config())?);
    let schema = Schema::parse("thread:i64,seq:i64,day:date,note:str")?;
    let table = db.create_table("events", schema)?;

    // Four appenders; each transaction appends a batch of rows and commits (appenders take
    // turns on the table's last leaf, so each batch gets consecutive ids).
    let threads: Vec<_> = (0..4i64)
        .map(|t| {
            let (db, table) = (db.clone(), table.clone());
            std::thread::spawn(move || -> Result<()> {
                for batch in 0..50i64 {
                    let rows: Vec<Vec<Value>> = (0..100)
                        .map(|i| {
                            let seq = batch * 100 + i;
                            let note = if seq % 7 == 0 { Value::Null } else { Value::Str(format!("thread {t} says hello #{seq}")) };
                            vec![Value::I64(t), Value::I64(seq), Value::Date(19_000 + (seq % 365) as i32), note]
                        })
                        .collect();
                    let mut tx = db.begin();
                    table.append(&mut tx, &rows)?;
                    tx.commit()?;
                }
                Ok(())
            })
        })
        .collect();
    for t in threads {
        t.join().expect("appender thread")?;
    }
    let rows = table.rows(db.buffer())?;
    println!("{rows} rows appended by 4 threads");

    // Lookups by id and a scan (lock-free readers: they may run beside appenders).
    println!("row 0:    {:?}", table.get(db.buffer(), 0)?);
    println!("row 7777: {:?}", table.get(db.buffer(), 7777)?);
    let mut per_thread = [0u64; 4];
    table.scan(db.buffer(), 0, &mut |_, row| {
        if let Value::I64(t) = row[0] {
            per_thread[t as usize] += 1;
        }
        true
    })?;
    println!("rows per thread by scan: {per_thread:?}");

    // A transaction in flight when the process dies: recovery rolls it back.
    let mut tx = db.begin();
    table.append(&mut tx, &[vec![Value::I64(9), Value::I64(0), Value::Null, Value::Str("never committed".into())]])?;
    std::mem::forget(tx);
    let db = Arc::try_unwrap(db).unwrap_or_else(|_| panic!("threads are done"));
    db.crash();

    let db = Database::open(config())?;
    let table = db.table("events")?;
    println!("after the crash: {} rows (the uncommitted append is gone)", table.rows(db.buffer())?);
    let report = db.check()?;
    println!("check: {:?}", report.tables["events"]);
    db.close()?;
    std::fs::remove_dir_all(&dir).ok();
    Ok(())
}
