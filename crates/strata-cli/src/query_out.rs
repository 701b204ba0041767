//! A query's outcome and its JSON object, written to stdout as it is produced: the large
//! results (a groupby's counts, a sort's first and last values) are read from temporary
//! pages of the pool while they are written, so they never sit in the heap, as values or as
//! text, however large `--mod` or `--top` is.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::io::{BufWriter, Write};
use std::path::PathBuf;

use serde::ser::{SerializeSeq, SerializeStruct};
use serde::{Serialize, Serializer};
use strata::ops::{ModCounts, SortStream};
use strata::Error;

/// How many values of a long list the line for people shows.
const SHOWN: usize = 16;

/// A query's outcome: its name in the contract, the `result` object, and (for the small
/// results) the line for people.
pub struct Outcome<'a> {
    pub op: &'static str,
    pub result: Body<'a>,
    pub text: Option<String>,
}

impl Outcome<'_> {
    /// The line for people (reads what is left of a streamed result).
    pub fn into_text(self) -> Result<String, Error> {
        if let Some(t) = self.text {
            return Ok(t);
        }
        match self.result {
            Body::Value(v) => Ok(v.to_string()),
            Body::Counts(c) => {
                let c = c.into_inner();
                let more = if c.rest.modulus() > c.head.len() as u64 { " ..." } else { "" };
                Ok(format!("groups {} counts {:?}{more}", c.rest.groups(), c.head))
            }
            Body::Sorted(s) => {
                let mut s = s.into_inner().stream;
                let k = s.top();
                let mut first = Vec::new();
                while let Some(v) = s.next_first()? {
                    if first.len() < SHOWN {
                        first.push(v);
                    }
                }
                let mut last = VecDeque::new();
                while let Some(v) = s.next_last()? {
                    if last.len() == SHOWN {
                        last.pop_front();
                    }
                    last.push_back(v);
                }
                let (f, l) = if k > SHOWN { (" ...", "... ") } else { ("", "") };
                Ok(format!("first {first:?}{f} last {l}{:?} checksum {}", Vec::from(last), s.checksum()?))
            }
        }
    }
}

/// A query's `result` object: a small value, or a streamed one.
pub enum Body<'a> {
    Value(serde_json::Value),
    /// `{"groups", "counts"}` of a groupby.
    Counts(Box<RefCell<CountsOut<'a>>>),
    /// `{"first", "last", "checksum"}` of a sort.
    Sorted(Box<RefCell<SortedOut<'a>>>),
}

/// The counts of a `groupby`: the first few already read (for the line for people), the rest
/// still in the merge.
pub struct CountsOut<'a> {
    pub head: Vec<u64>,
    pub rest: ModCounts<'a>,
    /// Why reading the rest failed (the JSON writer only carries a message).
    pub failed: Option<Error>,
}

impl<'a> CountsOut<'a> {
    /// Reads the first counts (for the line for people) and keeps the rest for the JSON.
    pub fn new(mut rest: ModCounts<'a>) -> Result<CountsOut<'a>, Error> {
        let mut head = Vec::new();
        while head.len() < SHOWN {
            let Some(c) = rest.next_count()? else { break };
            head.push(c);
        }
        Ok(CountsOut { head, rest, failed: None })
    }
}

/// A sort's merge, read as its JSON is written.
pub struct SortedOut<'a> {
    pub stream: SortStream<'a>,
    /// Why reading it failed.
    pub failed: Option<Error>,
}

impl Body<'_> {
    /// The error that stopped streaming the result, if one did.
    fn take_error(&self) -> Option<Error> {
        match self {
            Body::Value(_) => None,
            Body::Counts(c) => c.borrow_mut().failed.take(),
            Body::Sorted(s) => s.borrow_mut().failed.take(),
        }
    }
}

/// Keeps `e` for [`Body::take_error`] and turns it into the serializer's error.
fn fail<E: serde::ser::Error>(slot: &mut Option<Error>, e: Error) -> E {
    let msg = e.to_string();
    *slot = Some(e);
    E::custom(msg)
}

impl Serialize for Body<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Body::Value(v) => v.serialize(s),
            Body::Counts(c) => {
                let groups = c.borrow().rest.groups();
                let mut st = s.serialize_struct("GroupbyModResult", 2)?;
                st.serialize_field("groups", &groups)?;
                st.serialize_field("counts", &Counts(c))?;
                st.end()
            }
            Body::Sorted(o) => {
                let mut st = s.serialize_struct("SortResult", 3)?;
                st.serialize_field("first", &Values { out: o, last: false })?;
                st.serialize_field("last", &Values { out: o, last: true })?;
                let sum = {
                    let mut o = o.borrow_mut();
                    let SortedOut { stream, failed } = &mut *o;
                    stream.checksum().map_err(|e| fail(failed, e))?
                };
                st.serialize_field("checksum", &sum)?;
                st.end()
            }
        }
    }
}

/// `[count of remainder 0, ...]`, read from the merge as it is written.
struct Counts<'c, 'a>(&'c RefCell<CountsOut<'a>>);

impl Serialize for Counts<'_, '_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut c = self.0.borrow_mut();
        let CountsOut { head, rest, failed } = &mut *c;
        let mut seq = s.serialize_seq(Some(rest.modulus() as usize))?;
        for v in std::mem::take(head) {
            seq.serialize_element(&v)?;
        }
        while let Some(v) = rest.next_count().map_err(|e| fail(failed, e))? {
            seq.serialize_element(&v)?;
        }
        seq.end()
    }
}

/// The sort's K smallest values (`last` false), read from the merge as they are written, or
/// its K largest (the merge is completed first).
struct Values<'c, 'a> {
    out: &'c RefCell<SortedOut<'a>>,
    last: bool,
}

impl Serialize for Values<'_, '_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut o = self.out.borrow_mut();
        let SortedOut { stream, failed } = &mut *o;
        let mut seq = s.serialize_seq(Some(stream.top()))?;
        loop {
            let next = if self.last { stream.next_last() } else { stream.next_first() };
            match next.map_err(|e| fail(failed, e))? {
                Some(v) => seq.serialize_element(&v)?,
                None => break,
            }
        }
        seq.end()
    }
}

/// Writes a query's JSON object to stdout: `op` and `result` first (streamed), then the
/// fields of `tail()`, computed once the result has been written (so the time and the
/// statistics include producing it). `tail` must serialize as a non-empty object.
pub fn print_query_json<T: Serialize>(op: &str, result: &Body<'_>, tail: impl FnOnce() -> T) -> Result<(), Error> {
    let stdout = std::io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    let encode = |e: serde_json::Error| match (e.io_error_kind(), result.take_error()) {
        // Reading the result back failed: that error, typed.
        (_, Some(failed)) => failed,
        (Some(_), None) => Error::Io { op: "write", path: PathBuf::from("<stdout>"), source: e.into() },
        (None, None) => Error::InvalidInput(format!("cannot encode output: {e}")),
    };
    let io = |e: std::io::Error| Error::Io { op: "write", path: PathBuf::from("<stdout>"), source: e };
    write!(out, "{{\"op\":").map_err(io)?;
    serde_json::to_writer(&mut out, op).map_err(encode)?;
    write!(out, ",\"result\":").map_err(io)?;
    serde_json::to_writer(&mut out, result).map_err(encode)?;
    let tail = serde_json::to_string(&tail()).map_err(encode)?;
    // `tail` is a non-empty object: its fields continue this one.
    let fields = tail.strip_prefix('{').filter(|f| f.len() > 1).ok_or_else(|| Error::Inconsistent(format!("query tail is not a non-empty object: {tail}")))?;
    writeln!(out, ",{fields}").map_err(io)?;
    out.flush().map_err(io)
}
