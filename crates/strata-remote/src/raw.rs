//! The lookup fast path: a minimal, strict RESP2 client for one thing, reading a page into
//! its frame with no intermediate buffer.
//!
//! The reply to `GET key` for a page of `len` bytes is, when the tier holds the page,
//! exactly `$<len>\r\n<len bytes>\r\n` (for `MGET` of a chunked page:
//! `*<n>\r\n$<c0>\r\n<c0 bytes>\r\n$<c1>\r\n...`). Every byte of it but the payload is known
//! before it arrives, so the reply is read with `readv` into a scatter list: the framing
//! into a small scratch buffer, the payload straight into the destination frame (the kernel
//! writes it, as it does for an `O_DIRECT` disk read). The framing received is compared with
//! the framing expected; at the first difference (the key is missing: `$-1`, an error reply,
//! an object of another length, garbage) the bytes received so far and the rest of the reply
//! go through a small general parser instead, which never writes the frame again and never
//! reports the page as found.
//!
//! Only one command is ever in flight on a connection, so every byte read belongs to its
//! reply: the scatter list never reads past it. A reply that does not parse, or has bytes
//! after its end, leaves the connection out of step: it is an error, and the connection is
//! dropped (never a panic).
//!
//! Used for single servers over TCP or a unix socket; TLS and cluster endpoints take the
//! redis crate's path (which follows `MOVED`/`ASK` redirections).

use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use strata::buffer::Fetched;
use strata::storage::IoBufMut;
use strata::PageId;

use crate::config::Addr;
use crate::tier::{chunk_count, CHUNK_SIZE};

/// Longest line (error message, header) the general parser accepts.
const MAX_LINE: usize = 64 << 10;
/// Largest bulk string the general parser skips (Redis's own limit).
const MAX_BULK: i64 = 512 << 20;
/// Largest array it accepts.
const MAX_ARRAY: i64 = 1 << 20;
/// At most this many segments of the scatter list per `readv`.
const MAX_IOV: usize = 64;

/// Why a lookup on a raw connection failed.
#[derive(Debug)]
pub(crate) enum RawError {
    /// The server closed or reset the connection: worth one attempt on a fresh one.
    Dropped(String),
    /// Any other I/O failure, a timeout included: the server counts as down.
    Io(String),
    /// A reply this client did not expect: the connection is out of step.
    Protocol(String),
    /// An error reply (`-ERR ...`): the connection is still in step.
    Reply(String),
}

impl RawError {
    fn from_io(e: io::Error) -> RawError {
        match e.kind() {
            io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionAborted | io::ErrorKind::BrokenPipe => {
                RawError::Dropped(e.to_string())
            }
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => RawError::Io(format!("no reply in time ({e})")),
            _ => RawError::Io(e.to_string()),
        }
    }

    fn eof() -> RawError {
        RawError::Dropped("the server closed the connection".into())
    }

    /// The message, for the lookup's error.
    pub(crate) fn message(&self) -> &str {
        match self {
            RawError::Dropped(m) | RawError::Io(m) | RawError::Protocol(m) | RawError::Reply(m) => m,
        }
    }
}

enum Stream {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Stream {
    fn fd(&self) -> RawFd {
        match self {
            Stream::Unix(s) => s.as_raw_fd(),
            Stream::Tcp(s) => s.as_raw_fd(),
        }
    }

    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.read(buf),
            Stream::Tcp(s) => s.read(buf),
        }
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        match self {
            Stream::Unix(s) => s.write_all(buf),
            Stream::Tcp(s) => s.write_all(buf),
        }
    }
}

/// What to send on a new connection before it is used.
#[derive(Clone)]
pub(crate) struct Handshake {
    pub(crate) user: Option<String>,
    pub(crate) password: Option<String>,
    pub(crate) db: i64,
}

/// One piece of the expected reply: framing bytes (at `at` in `RawConn::expect`) or
/// payload (at `at` in the destination).
#[derive(Clone, Copy)]
enum Seg {
    Known { at: usize, len: usize },
    Payload { at: usize, len: usize },
}

impl Seg {
    fn len(self) -> usize {
        match self {
            Seg::Known { len, .. } | Seg::Payload { len, .. } => len,
        }
    }
}

/// A connection of the lookup fast path (see the [module documentation](self)).
pub(crate) struct RawConn {
    stream: Stream,
    /// The command being sent.
    cmd: Vec<u8>,
    /// The framing expected, and where the framing received lands.
    expect: Vec<u8>,
    got: Vec<u8>,
    segs: Vec<Seg>,
}

impl RawConn {
    /// Connects (TCP: with `connect_timeout`, `TCP_NODELAY`), sets `response_timeout` on
    /// reads and writes, then authenticates and selects the database.
    pub(crate) fn open(addr: &Addr, hs: &Handshake, connect_timeout: Duration, response_timeout: Duration) -> Result<RawConn, RawError> {
        let io = RawError::from_io;
        let stream = match addr {
            Addr::Unix(path) => {
                let s = UnixStream::connect(path).map_err(io)?;
                s.set_read_timeout(Some(response_timeout)).map_err(io)?;
                s.set_write_timeout(Some(response_timeout)).map_err(io)?;
                Stream::Unix(s)
            }
            Addr::Tcp { host, port } => {
                let mut last = None;
                let mut found = None;
                for a in (host.as_str(), *port).to_socket_addrs().map_err(io)? {
                    match TcpStream::connect_timeout(&a, connect_timeout) {
                        Ok(s) => {
                            found = Some(s);
                            break;
                        }
                        Err(e) => last = Some(e),
                    }
                }
                let Some(s) = found else {
                    return Err(RawError::Io(last.map_or_else(|| format!("{host} resolves to no address"), |e| e.to_string())));
                };
                s.set_nodelay(true).map_err(io)?;
                s.set_read_timeout(Some(response_timeout)).map_err(io)?;
                s.set_write_timeout(Some(response_timeout)).map_err(io)?;
                Stream::Tcp(s)
            }
        };
        let mut conn = RawConn { stream, cmd: Vec::with_capacity(256), expect: Vec::new(), got: Vec::new(), segs: Vec::new() };
        if let Some(password) = &hs.password {
            match &hs.user {
                Some(user) => conn.simple(&[b"AUTH", user.as_bytes(), password.as_bytes()])?,
                None => conn.simple(&[b"AUTH", password.as_bytes()])?,
            }
        }
        if hs.db != 0 {
            conn.simple(&[b"SELECT", hs.db.to_string().as_bytes()])?;
        }
        Ok(conn)
    }

    /// Sends a command whose reply must be `+OK`.
    fn simple(&mut self, args: &[&[u8]]) -> Result<(), RawError> {
        self.cmd.clear();
        push_header(&mut self.cmd, b'*', args.len());
        for a in args {
            push_bulk(&mut self.cmd, a);
        }
        self.stream.write_all(&self.cmd).map_err(RawError::from_io)?;
        let mut p = Parser { conn: self, buf: Vec::new(), pos: 0 };
        let line = p.line()?;
        let ok = line == b"+OK";
        let text = String::from_utf8_lossy(&line).into_owned();
        p.finish()?;
        match text.strip_prefix('-') {
            _ if ok => Ok(()),
            // AUTH's errors never repeat the password; the caller scrubs anyway.
            Some(err) => Err(RawError::Reply(err.to_owned())),
            None => Err(RawError::Protocol(format!("unexpected reply to {}: {}", String::from_utf8_lossy(args[0]), describe(&text)))),
        }
    }

    /// Looks up page `pid` (stored under `prefix` in `chunk_count(dst.len())` objects) and
    /// reads its image into `dst`: `Filled` only when every object has exactly its expected
    /// length and the whole reply is well formed. `dst` may have been written whatever the
    /// outcome.
    pub(crate) fn get_page(&mut self, prefix: &str, pid: PageId, dst: &mut IoBufMut<'_>) -> Result<Fetched, RawError> {
        let len = dst.len();
        let n = chunk_count(len);
        // The command.
        self.cmd.clear();
        push_header(&mut self.cmd, b'*', n + 1);
        push_bulk(&mut self.cmd, if n == 1 { b"GET" } else { b"MGET" });
        let mut key = String::with_capacity(prefix.len() + 24);
        for chunk in 0..n {
            use std::fmt::Write as _;
            key.clear();
            // object_key's format, without its allocation.
            let _ = write!(key, "{prefix}:{{{:x}}}:{chunk}", pid.raw());
            push_bulk(&mut self.cmd, key.as_bytes());
        }
        // The reply expected.
        self.expect.clear();
        self.segs.clear();
        if n > 1 {
            push_header(&mut self.expect, b'*', n);
        }
        for chunk in 0..n {
            let at = chunk * CHUNK_SIZE;
            let clen = CHUNK_SIZE.min(len - at);
            if chunk > 0 {
                self.expect.extend_from_slice(b"\r\n");
            }
            push_header(&mut self.expect, b'$', clen);
            let known = self.known_since();
            self.segs.push(known);
            self.segs.push(Seg::Payload { at, len: clen });
        }
        self.expect.extend_from_slice(b"\r\n");
        let known = self.known_since();
        self.segs.push(known);
        self.got.clear();
        self.got.resize(self.expect.len(), 0);

        self.stream.write_all(&self.cmd).map_err(RawError::from_io)?;
        match self.scatter(dst)? {
            None => Ok(Fetched::Filled),
            Some(received) => {
                let mut p = Parser { conn: self, buf: received, pos: 0 };
                let outcome = p.lookup_reply(n, len)?;
                p.finish()?;
                Ok(outcome)
            }
        }
    }

    /// The segment of framing bytes pushed to `expect` since the last segment.
    fn known_since(&self) -> Seg {
        let at = self.segs.iter().map(|s| if let Seg::Known { len, .. } = s { *len } else { 0 }).sum::<usize>();
        Seg::Known { at, len: self.expect.len() - at }
    }

    /// Reads the expected reply into the scatter list. `None`: it came exactly as expected.
    /// `Some(bytes)`: it differs; `bytes` is what was received so far (all of it part of the
    /// reply), for the general parser.
    fn scatter(&mut self, dst: &mut IoBufMut<'_>) -> Result<Option<Vec<u8>>, RawError> {
        let total: usize = self.segs.iter().map(|s| s.len()).sum();
        let base = dst.as_mut_ptr();
        let fd = self.stream.fd();
        let (mut seg, mut off, mut done) = (0usize, 0usize, 0usize);
        while done < total {
            let mut iov = [libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; MAX_IOV];
            let mut count = 0;
            for (i, s) in self.segs[seg..].iter().take(MAX_IOV).enumerate() {
                let skip = if i == 0 { off } else { 0 };
                let ptr = match *s {
                    // SAFETY: `at + len <= got.len()` (the segments partition `expect`, and
                    // `got` has its length); `skip < len`.
                    Seg::Known { at, .. } => unsafe { self.got.as_mut_ptr().add(at + skip) },
                    // SAFETY: the payload segments partition `0..dst.len()`; `skip < len`.
                    Seg::Payload { at, .. } => unsafe { base.add(at + skip) },
                };
                iov[i] = libc::iovec { iov_base: ptr.cast(), iov_len: s.len() - skip };
                count = i + 1;
            }
            // SAFETY: every iovec points into memory valid for writes of its length that
            // nothing else writes meanwhile: `got` (ours) or `dst` (IoBufMut's contract: no
            // other writer for its lifetime; the kernel's stores, like DMA, are outside the
            // Rust memory model). `count <= MAX_IOV`.
            let n = unsafe { libc::readv(fd, iov.as_ptr(), count as libc::c_int) };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(RawError::from_io(e));
            }
            if n == 0 {
                return Err(RawError::eof());
            }
            let mut left = n as usize;
            let mut differs = false;
            while left > 0 {
                let s = self.segs[seg];
                let take = (s.len() - off).min(left);
                if let Seg::Known { at, .. } = s {
                    differs |= self.got[at + off..at + off + take] != self.expect[at + off..at + off + take];
                }
                off += take;
                left -= take;
                done += take;
                if off == s.len() {
                    seg += 1;
                    off = 0;
                }
            }
            if differs {
                // What arrived, in order.
                let mut received = Vec::with_capacity(done.min(1 << 16));
                let mut rest = done;
                for s in &self.segs {
                    let take = s.len().min(rest);
                    match *s {
                        Seg::Known { at, .. } => received.extend_from_slice(&self.got[at..at + take]),
                        Seg::Payload { at, .. } => {
                            // SAFETY: `at + take <= dst.len()`; those bytes were just written
                            // by the kernel on this thread's behalf, and no one else writes
                            // `dst` (optimistic readers of a frame only load).
                            received.extend_from_slice(unsafe { std::slice::from_raw_parts(base.add(at), take) });
                        }
                    }
                    rest -= take;
                    if rest == 0 {
                        break;
                    }
                }
                return Ok(Some(received));
            }
        }
        Ok(None)
    }
}

/// The general parser: the bytes of a reply received so far, and the connection for more.
struct Parser<'c> {
    conn: &'c mut RawConn,
    buf: Vec<u8>,
    pos: usize,
}

impl Parser<'_> {
    /// Reads more of the reply.
    fn more(&mut self) -> Result<(), RawError> {
        if self.pos > 0 && self.pos == self.buf.len() {
            self.buf.clear();
            self.pos = 0;
        }
        let mut chunk = [0u8; 16 << 10];
        loop {
            match self.conn.stream.read(&mut chunk) {
                Ok(0) => return Err(RawError::eof()),
                Ok(n) => {
                    self.buf.extend_from_slice(&chunk[..n]);
                    return Ok(());
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(RawError::from_io(e)),
            }
        }
    }

    /// One line, without its `\r\n`.
    fn line(&mut self) -> Result<Vec<u8>, RawError> {
        // Bytes after `pos` already searched (less one: a `\r` may end them).
        let mut scanned = 0;
        loop {
            let from = self.pos + scanned;
            if let Some(i) = self.buf[from..].windows(2).position(|w| w == b"\r\n") {
                let end = from + i;
                let line = self.buf[self.pos..end].to_vec();
                self.pos = end + 2;
                return Ok(line);
            }
            if self.buf.len() - self.pos > MAX_LINE {
                return Err(RawError::Protocol(format!("a reply line longer than {MAX_LINE} bytes")));
            }
            scanned = (self.buf.len() - self.pos).saturating_sub(1);
            self.more()?;
        }
    }

    /// Skips `n` bytes of payload and the `\r\n` after them (holding at most one read's
    /// worth of them at a time).
    fn skip_bulk(&mut self, n: usize) -> Result<(), RawError> {
        let mut left = n;
        loop {
            let take = (self.buf.len() - self.pos).min(left);
            self.pos += take;
            left -= take;
            if left == 0 {
                break;
            }
            self.more()?;
        }
        while self.buf.len() - self.pos < 2 {
            self.more()?;
        }
        if &self.buf[self.pos..self.pos + 2] != b"\r\n" {
            return Err(RawError::Protocol("a bulk string without its terminator".into()));
        }
        self.pos += 2;
        Ok(())
    }

    /// The reply to the lookup of a page of `len` bytes in `n` objects, which did not come
    /// as expected: never `Filled`.
    fn lookup_reply(&mut self, n: usize, len: usize) -> Result<Fetched, RawError> {
        let line = self.line()?;
        match line.first() {
            Some(b'-') => Err(RawError::Reply(String::from_utf8_lossy(&line[1..]).into_owned())),
            Some(b'$') if n == 1 => match int(&line[1..], MAX_BULK)? {
                -1 => Ok(Fetched::Missing),
                size => {
                    self.skip_bulk(size as usize)?;
                    if size as usize == len {
                        // Exactly the expected framing would have matched.
                        return Err(RawError::Protocol("a reply that differs from its expected form only in its terminator".into()));
                    }
                    Ok(Fetched::WrongSize)
                }
            },
            Some(b'*') if n > 1 => {
                let count = int(&line[1..], MAX_ARRAY)?;
                if count != n as i64 {
                    return Err(RawError::Protocol(format!("an array of {count} replies to an MGET of {n} keys")));
                }
                let (mut missing, mut wrong) = (false, false);
                for chunk in 0..n {
                    let clen = CHUNK_SIZE.min(len - chunk * CHUNK_SIZE);
                    let line = self.line()?;
                    if line.first() != Some(&b'$') {
                        return Err(RawError::Protocol(format!("unexpected element of an MGET reply: {}", describe(&String::from_utf8_lossy(&line)))));
                    }
                    match int(&line[1..], MAX_BULK)? {
                        -1 => missing = true,
                        size => {
                            self.skip_bulk(size as usize)?;
                            wrong |= size as usize != clen;
                        }
                    }
                }
                if missing {
                    return Ok(Fetched::Missing);
                }
                if wrong {
                    return Ok(Fetched::WrongSize);
                }
                Err(RawError::Protocol("an MGET reply that differs from its expected form only in its terminators".into()))
            }
            _ => Err(RawError::Protocol(format!("unexpected reply to a lookup: {}", describe(&String::from_utf8_lossy(&line))))),
        }
    }

    /// The reply is over: nothing may follow it.
    fn finish(&self) -> Result<(), RawError> {
        if self.pos != self.buf.len() {
            return Err(RawError::Protocol(format!("{} unexpected bytes after a reply", self.buf.len() - self.pos)));
        }
        Ok(())
    }
}

/// A RESP integer (`-1`, or digits without a sign or leading zeros) at most `max`.
fn int(text: &[u8], max: i64) -> Result<i64, RawError> {
    let bad = || RawError::Protocol(format!("malformed length {:?} in a reply", String::from_utf8_lossy(&text[..text.len().min(32)])));
    if text == b"-1" {
        return Ok(-1);
    }
    if text.is_empty() || text.len() > 12 || !text.iter().all(u8::is_ascii_digit) || (text.len() > 1 && text[0] == b'0') {
        return Err(bad());
    }
    let v = text.iter().fold(0i64, |v, d| v * 10 + i64::from(d - b'0'));
    if v > max {
        return Err(bad());
    }
    Ok(v)
}

/// A short description of a reply line (never a payload).
fn describe(line: &str) -> String {
    let short: String = line.chars().take(40).collect();
    if short.len() < line.len() {
        format!("{short:?}...")
    } else {
        format!("{short:?}")
    }
}

/// `*<n>\r\n` or `$<n>\r\n`.
fn push_header(out: &mut Vec<u8>, kind: u8, n: usize) {
    out.push(kind);
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    let mut v = n;
    loop {
        i -= 1;
        digits[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
    out.extend_from_slice(b"\r\n");
}

/// One argument of a command: `$<len>\r\n<bytes>\r\n`.
fn push_bulk(out: &mut Vec<u8>, bytes: &[u8]) {
    push_header(out, b'$', bytes.len());
    out.extend_from_slice(bytes);
    out.extend_from_slice(b"\r\n");
}

/// A scripted fake server on a unix socket, for the reader's tests (here and in `tier`).
#[cfg(test)]
pub(crate) mod fake {
    use std::io::{BufRead, BufReader, Read, Write};
    use std::os::unix::net::{UnixListener, UnixStream};
    use std::path::PathBuf;
    use std::sync::{Arc, Mutex};

    /// What the server does with a command.
    pub(crate) enum Act {
        /// Sends these bytes, in pieces of at most `piece` bytes (0: at once).
        Reply(Vec<u8>, usize),
        /// Sends these bytes, then closes the connection.
        ReplyClose(Vec<u8>),
    }

    /// The server: `script(connection number, command)` says what to do.
    pub(crate) struct Fake {
        pub(crate) _dir: tempfile::TempDir,
        pub(crate) path: PathBuf,
        /// Commands received, per connection.
        pub(crate) log: Arc<Mutex<Log>>,
    }

    type Script = dyn Fn(usize, &[Vec<u8>]) -> Act + Send + Sync;
    /// Commands received: (connection number, arguments).
    pub(crate) type Log = Vec<(usize, Vec<Vec<u8>>)>;

    impl Fake {
        pub(crate) fn start(script: impl Fn(usize, &[Vec<u8>]) -> Act + Send + Sync + 'static) -> Fake {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("fake.sock");
            let listener = UnixListener::bind(&path).unwrap();
            let log = Arc::new(Mutex::new(Vec::new()));
            let script: Arc<Script> = Arc::new(script);
            let log2 = log.clone();
            std::thread::spawn(move || {
                for (n, stream) in listener.incoming().enumerate() {
                    let Ok(stream) = stream else { return };
                    let (script, log) = (script.clone(), log2.clone());
                    std::thread::spawn(move || serve(n, stream, &*script, &log));
                }
            });
            Fake { _dir: dir, path, log }
        }
    }

    fn serve(n: usize, stream: UnixStream, script: &Script, log: &Mutex<Log>) {
        let mut out = stream.try_clone().unwrap();
        let mut r = BufReader::new(stream);
        loop {
            let mut line = String::new();
            if r.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            let count: usize = line.trim_end().trim_start_matches('*').parse().unwrap();
            let mut args = Vec::new();
            for _ in 0..count {
                line.clear();
                r.read_line(&mut line).unwrap();
                let len: usize = line.trim_end().trim_start_matches('$').parse().unwrap();
                let mut arg = vec![0; len + 2];
                r.read_exact(&mut arg).unwrap();
                arg.truncate(len);
                args.push(arg);
            }
            log.lock().unwrap().push((n, args.clone()));
            match script(n, &args) {
                Act::Reply(bytes, piece) => {
                    for part in bytes.chunks(if piece == 0 { bytes.len().max(1) } else { piece }) {
                        if out.write_all(part).is_err() {
                            return;
                        }
                        if piece != 0 {
                            std::thread::sleep(std::time::Duration::from_micros(200));
                        }
                    }
                }
                Act::ReplyClose(bytes) => {
                    let _ = out.write_all(&bytes);
                    return;
                }
            }
        }
    }

    /// `$<len>\r\n<bytes>\r\n`.
    pub(crate) fn bulk(bytes: &[u8]) -> Vec<u8> {
        let mut v = format!("${}\r\n", bytes.len()).into_bytes();
        v.extend_from_slice(bytes);
        v.extend_from_slice(b"\r\n");
        v
    }

    /// A page image: byte `i` is `(i * 7 + seed) as u8`.
    pub(crate) fn image(len: usize, seed: u8) -> Vec<u8> {
        (0..len).map(|i| (i * 7) as u8 ^ seed).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::fake::{bulk, image, Act, Fake};
    use super::*;

    const LEN: usize = 64 << 10;
    const TIMEOUT: Duration = Duration::from_secs(10);

    fn open(fake: &Fake, hs: &Handshake) -> Result<RawConn, RawError> {
        RawConn::open(&Addr::Unix(fake.path.clone()), hs, TIMEOUT, TIMEOUT)
    }

    fn plain() -> Handshake {
        Handshake { user: None, password: None, db: 0 }
    }

    fn get(conn: &mut RawConn, dst: &mut [u8]) -> Result<Fetched, RawError> {
        conn.get_page("p", PageId::from_raw(0x2a), &mut IoBufMut::from_slice(dst))
    }

    /// One connection whose `i`-th command gets `replies[i]`.
    fn scripted(replies: Vec<Act>) -> Fake {
        let replies = std::sync::Mutex::new(replies.into_iter());
        Fake::start(move |_, _| replies.lock().unwrap().next().expect("no more replies scripted"))
    }

    #[test]
    fn hit_lands_in_the_buffer_and_the_command_is_a_get() {
        let img = image(LEN, 1);
        let fake = scripted(vec![Act::Reply(bulk(&img), 0), Act::Reply(bulk(&image(LEN, 2)), 1000)]);
        let mut conn = open(&fake, &plain()).unwrap();
        let mut dst = vec![0u8; LEN];
        assert!(matches!(get(&mut conn, &mut dst), Ok(Fetched::Filled)));
        assert!(dst == img);
        // The reply trickling in, in small pieces, is read the same.
        assert!(matches!(get(&mut conn, &mut dst), Ok(Fetched::Filled)));
        assert!(dst == image(LEN, 2));
        let log = fake.log.lock().unwrap();
        assert_eq!(log[0].1, vec![b"GET".to_vec(), crate::tier::object_key("p", PageId::from_raw(0x2a), 0).into_bytes()]);
    }

    #[test]
    fn nil_error_and_wrong_sizes_keep_the_connection_in_step() {
        let mut longer = image(LEN + 8, 3);
        longer[0] = b'$';
        let fake = scripted(vec![
            Act::Reply(b"$-1\r\n".to_vec(), 0),
            Act::Reply(b"-ERR something went wrong\r\n".to_vec(), 0),
            Act::Reply(bulk(b"short"), 0),
            Act::Reply(bulk(&longer), 0),
            Act::Reply(bulk(&[]), 0),
            Act::Reply(bulk(&image(LEN - 1, 4)), 0),
            Act::Reply(bulk(&image(LEN, 5)), 0),
        ]);
        let mut conn = open(&fake, &plain()).unwrap();
        let mut dst = vec![0u8; LEN];
        assert!(matches!(get(&mut conn, &mut dst), Ok(Fetched::Missing)));
        match get(&mut conn, &mut dst) {
            Err(RawError::Reply(m)) => assert_eq!(m, "ERR something went wrong"),
            other => panic!("{other:?}"),
        }
        for _ in 0..4 {
            assert!(matches!(get(&mut conn, &mut dst), Ok(Fetched::WrongSize)));
        }
        assert!(matches!(get(&mut conn, &mut dst), Ok(Fetched::Filled)));
        assert!(dst == image(LEN, 5));
    }

    #[test]
    fn garbled_replies_are_errors_not_panics() {
        let mut bad_tail = bulk(&image(LEN, 6));
        let n = bad_tail.len();
        bad_tail[n - 2] = b'X';
        let cases: Vec<Vec<u8>> = vec![
            b"+OK\r\n".to_vec(),
            b":12\r\n".to_vec(),
            b"$abc\r\n".to_vec(),
            b"$-2\r\n".to_vec(),
            b"$0065536\r\n".to_vec(),
            b"$99999999999999\r\n".to_vec(),
            b"*1\r\n$-1\r\n".to_vec(),
            b"_\r\n".to_vec(),
            bad_tail,
            b"$5\r\nshortXY".to_vec(),
        ];
        for case in cases {
            let fake = scripted(vec![Act::Reply(case.clone(), 0)]);
            let mut conn = open(&fake, &plain()).unwrap();
            let mut dst = vec![0u8; LEN];
            match get(&mut conn, &mut dst) {
                Err(RawError::Protocol(_)) => {}
                other => panic!("{:?}: {other:?}", String::from_utf8_lossy(&case[..case.len().min(20)])),
            }
        }
        // Bytes after a complete reply: out of step. (Sent with the reply, so that they are
        // there when the reply is parsed: a reply that does not come as expected.)
        let mut nil_extra = b"$-1\r\n".to_vec();
        nil_extra.extend_from_slice(b"$-1\r\n");
        let fake = scripted(vec![Act::Reply(nil_extra, 0)]);
        let mut conn = open(&fake, &plain()).unwrap();
        let mut dst = vec![0u8; LEN];
        assert!(matches!(get(&mut conn, &mut dst), Err(RawError::Protocol(_))));
    }

    #[test]
    fn connection_dropped_mid_reply_is_an_error() {
        let full = bulk(&image(LEN, 8));
        for cut in [0, 3, 100, full.len() - 1] {
            let fake = scripted(vec![Act::ReplyClose(full[..cut].to_vec())]);
            let mut conn = open(&fake, &plain()).unwrap();
            let mut dst = vec![0u8; LEN];
            match get(&mut conn, &mut dst) {
                Err(RawError::Dropped(_)) => {}
                other => panic!("cut at {cut}: {other:?}"),
            }
        }
    }

    #[test]
    fn chunked_pages_are_one_mget() {
        let len = CHUNK_SIZE + 4096;
        let img = image(len, 9);
        let array = |parts: &[Vec<u8>]| {
            let mut v = format!("*{}\r\n", parts.len()).into_bytes();
            for p in parts {
                v.extend_from_slice(p);
            }
            v
        };
        let (a, b) = (bulk(&img[..CHUNK_SIZE]), bulk(&img[CHUNK_SIZE..]));
        let fake = scripted(vec![
            Act::Reply(array(&[a.clone(), b.clone()]), 0),
            Act::Reply(array(&[a.clone(), b"$-1\r\n".to_vec()]), 0),
            Act::Reply(array(&[b"$-1\r\n".to_vec(), bulk(b"tiny")]), 0),
            Act::Reply(array(&[a.clone(), bulk(&img[CHUNK_SIZE + 8..])]), 0),
            Act::Reply(array(std::slice::from_ref(&a)), 0),
        ]);
        let mut conn = open(&fake, &plain()).unwrap();
        let mut dst = vec![0u8; len];
        assert!(matches!(get(&mut conn, &mut dst), Ok(Fetched::Filled)));
        assert!(dst == img);
        assert!(matches!(get(&mut conn, &mut dst), Ok(Fetched::Missing)));
        assert!(matches!(get(&mut conn, &mut dst), Ok(Fetched::Missing)));
        assert!(matches!(get(&mut conn, &mut dst), Ok(Fetched::WrongSize)));
        assert!(matches!(get(&mut conn, &mut dst), Err(RawError::Protocol(_))));
        let log = fake.log.lock().unwrap();
        let key = |c| crate::tier::object_key("p", PageId::from_raw(0x2a), c).into_bytes();
        assert_eq!(log[0].1, vec![b"MGET".to_vec(), key(0), key(1)]);
    }

    #[test]
    fn handshake_authenticates_and_selects() {
        let fake = Fake::start(|_, args| match args[0].as_slice() {
            b"AUTH" if args.len() == 3 && args[2] == b"pw" => Act::Reply(b"+OK\r\n".to_vec(), 0),
            b"AUTH" => Act::Reply(b"-WRONGPASS invalid username-password pair\r\n".to_vec(), 0),
            b"SELECT" => Act::Reply(b"+OK\r\n".to_vec(), 0),
            _ => Act::Reply(b"$-1\r\n".to_vec(), 0),
        });
        let good = Handshake { user: Some("u".into()), password: Some("pw".into()), db: 3 };
        let mut conn = open(&fake, &good).unwrap();
        let mut dst = vec![0u8; LEN];
        assert!(matches!(get(&mut conn, &mut dst), Ok(Fetched::Missing)));
        let log = fake.log.lock().unwrap().clone();
        assert_eq!(log[0].1, vec![b"AUTH".to_vec(), b"u".to_vec(), b"pw".to_vec()]);
        assert_eq!(log[1].1, vec![b"SELECT".to_vec(), b"3".to_vec()]);
        let bad = Handshake { user: Some("u".into()), password: Some("nope".into()), db: 0 };
        match open(&fake, &bad) {
            Err(RawError::Reply(m)) => assert!(m.starts_with("WRONGPASS") && !m.contains("nope"), "{m}"),
            Err(e) => panic!("{e:?}"),
            Ok(_) => panic!("a wrong password was accepted"),
        }
    }

    #[test]
    fn integers_are_strict() {
        assert_eq!(int(b"0", 10).unwrap(), 0);
        assert_eq!(int(b"-1", 10).unwrap(), -1);
        assert_eq!(int(b"65536", MAX_BULK).unwrap(), 65536);
        for bad in [&b""[..], b"-2", b"+1", b"01", b"1a", b" 1", b"99999999999999"] {
            assert!(int(bad, MAX_BULK).is_err(), "{bad:?}");
        }
        let mut v = Vec::new();
        push_header(&mut v, b'$', 0);
        push_header(&mut v, b'*', 1234567);
        assert_eq!(v, b"$0\r\n*1234567\r\n");
    }
}
