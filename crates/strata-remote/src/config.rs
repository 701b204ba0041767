//! [`RemoteConfig`]: where the tier's server is (parsed from a URL) and how much it may hold,
//! built fluently in the style of `strata::Config`. Secrets never leave this module in clear:
//! `Debug`, `Display` and every error show the URL with the password replaced by `***`.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use crate::error::RemoteError;

/// Key namespace used when the caller sets none (see [`prefix_for_dir`] for one per database).
pub const DEFAULT_PREFIX: &str = "strata";
/// Default limit on page bytes waiting in the put queue: 64 MiB.
pub const DEFAULT_QUEUE: u64 = 64 << 20;
/// Default limit on opening a connection (TCP connect plus handshake): 200 ms.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_millis(200);
/// Default limit on waiting for a reply: 500 ms.
pub const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_millis(500);
/// Default pause between attempts to reach a server that is gone: 200 ms.
pub const DEFAULT_RETRY_INTERVAL: Duration = Duration::from_millis(200);
/// Default port of `redis://` URLs without one.
pub const DEFAULT_PORT: u16 = 6379;

/// One server address.
#[derive(Clone, PartialEq, Eq)]
pub(crate) enum Addr {
    Tcp { host: String, port: u16 },
    Unix(PathBuf),
}

/// What a URL names, secrets included (never printed).
#[derive(Clone)]
pub(crate) struct Endpoint {
    pub(crate) cluster: bool,
    pub(crate) tls: bool,
    pub(crate) nodes: Vec<Addr>,
    pub(crate) db: i64,
    pub(crate) user: Option<String>,
    pub(crate) password: Option<String>,
}

impl Endpoint {
    /// The URL with the password replaced by `***`.
    pub(crate) fn redacted(&self) -> String {
        let auth = match (&self.user, &self.password) {
            (None, None) => String::new(),
            (Some(u), None) => format!("{}@", encode(u)),
            (u, Some(_)) => format!("{}:***@", u.as_deref().map(encode).unwrap_or_default()),
        };
        if let [Addr::Unix(path)] = self.nodes.as_slice() {
            let mut query = Vec::new();
            if self.db != 0 {
                query.push(format!("db={}", self.db));
            }
            if let Some(u) = &self.user {
                query.push(format!("user={}", encode(u)));
            }
            if self.password.is_some() {
                query.push("password=***".to_owned());
            }
            let query = if query.is_empty() { String::new() } else { format!("?{}", query.join("&")) };
            return format!("unix://{}{query}", path.display());
        }
        let scheme = match (self.tls, self.cluster) {
            (false, false) => "redis",
            (true, false) => "rediss",
            (false, true) => "redis+cluster",
            (true, true) => "rediss+cluster",
        };
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|a| match a {
                Addr::Tcp { host, port } if host.contains(':') => format!("[{host}]:{port}"),
                Addr::Tcp { host, port } => format!("{host}:{port}"),
                Addr::Unix(p) => p.display().to_string(),
            })
            .collect();
        let db = if self.db != 0 { format!("/{}", self.db) } else { String::new() };
        format!("{scheme}://{auth}{}{db}", hosts.join(","))
    }
}

/// How to reach the remote tier and how much of it to use.
///
/// ```
/// use strata_remote::RemoteConfig;
/// let config = RemoteConfig::new("redis://cache:hunter2@127.0.0.1:6380/2").unwrap().prefix("db7").budget(1 << 30);
/// assert_eq!(config.to_string(), "redis://cache:***@127.0.0.1:6380/2");
/// assert!(!format!("{config:?}").contains("hunter2"));
/// ```
#[derive(Clone)]
pub struct RemoteConfig {
    pub(crate) endpoint: Endpoint,
    pub(crate) prefix: String,
    pub(crate) budget: u64,
    pub(crate) queue: u64,
    pub(crate) connect_timeout: Duration,
    pub(crate) response_timeout: Duration,
    pub(crate) retry_interval: Duration,
    pub(crate) tls_ca: Option<PathBuf>,
}

impl RemoteConfig {
    /// Parses a server URL, with default settings otherwise:
    ///
    /// * `redis://[user[:password]@]host[:port][/db]` (port 6379 by default; IPv6 hosts in
    ///   brackets),
    /// * `unix:///path/to/socket[?db=N&user=U&password=P]` (also `redis+unix://`),
    /// * `redis+cluster://[user[:password]@]host:port,host:port,...` (Redis/Valkey Cluster;
    ///   the nodes listed are only the first ones asked for the slot map),
    /// * `rediss://` and `rediss+cluster://`: the same over TLS, only when the crate is built
    ///   with its `tls` feature.
    ///
    /// User and password may be percent-encoded (`%40` for `@`, ...).
    pub fn new(url: &str) -> Result<RemoteConfig, RemoteError> {
        let endpoint = parse(url).map_err(|reason| RemoteError::InvalidUrl { url: redact_raw(url), reason })?;
        if endpoint.tls && !cfg!(feature = "tls") {
            return Err(RemoteError::TlsUnsupported { url: endpoint.redacted() });
        }
        Ok(RemoteConfig {
            endpoint,
            prefix: DEFAULT_PREFIX.to_owned(),
            budget: u64::MAX,
            queue: DEFAULT_QUEUE,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            response_timeout: DEFAULT_RESPONSE_TIMEOUT,
            retry_interval: DEFAULT_RETRY_INTERVAL,
            tls_ca: None,
        })
    }

    /// The key namespace: objects are stored as `{prefix}:{<page id hex>}:<chunk>`. Give each
    /// database its own (see [`prefix_for_dir`]); default [`DEFAULT_PREFIX`]. It may not
    /// contain `{`, `}`, spaces or control characters (braces would change the Cluster hash
    /// tag that keeps a page's chunks on one node).
    pub fn prefix(mut self, prefix: impl Into<String>) -> RemoteConfig {
        self.prefix = prefix.into();
        self
    }

    /// Page bytes this client may keep on the server (default: no limit of its own, leaving
    /// it to the server's `maxmemory`). Over it, the oldest pages stored are deleted first.
    /// Counted are the images' bytes; the server adds roughly 100 bytes per object.
    pub fn budget(mut self, bytes: u64) -> RemoteConfig {
        self.budget = bytes;
        self
    }

    /// Page bytes that may wait in the put queue (default [`DEFAULT_QUEUE`]); when it is full,
    /// further pages are dropped (and counted), never waited for.
    pub fn queue(mut self, bytes: u64) -> RemoteConfig {
        self.queue = bytes;
        self
    }

    /// Limit on opening a connection (default [`DEFAULT_CONNECT_TIMEOUT`]).
    pub fn connect_timeout(mut self, timeout: Duration) -> RemoteConfig {
        self.connect_timeout = timeout;
        self
    }

    /// Limit on waiting for a reply (default [`DEFAULT_RESPONSE_TIMEOUT`]).
    pub fn response_timeout(mut self, timeout: Duration) -> RemoteConfig {
        self.response_timeout = timeout;
        self
    }

    /// Pause between attempts to reach a server that is gone (default
    /// [`DEFAULT_RETRY_INTERVAL`]); meanwhile lookups fail at once and puts are dropped.
    pub fn retry_interval(mut self, interval: Duration) -> RemoteConfig {
        self.retry_interval = interval;
        self
    }

    /// For `rediss://`: trust exactly the certificates in this PEM file (a private CA) instead
    /// of the system's roots.
    #[cfg(feature = "tls")]
    pub fn tls_ca_file(mut self, pem: impl Into<PathBuf>) -> RemoteConfig {
        self.tls_ca = Some(pem.into());
        self
    }

    /// The URL with the password replaced by `***`.
    pub fn redacted_url(&self) -> String {
        self.endpoint.redacted()
    }

    /// The key namespace.
    pub fn key_prefix(&self) -> &str {
        &self.prefix
    }

    /// The budget in bytes (`u64::MAX`: none).
    pub fn budget_bytes(&self) -> u64 {
        self.budget
    }

    /// The put queue's limit in bytes.
    pub fn queue_bytes(&self) -> u64 {
        self.queue
    }

    /// Whether the URL names a Redis/Valkey Cluster.
    pub fn is_cluster(&self) -> bool {
        self.endpoint.cluster
    }

    /// Checks the settings that the builder methods take unchecked.
    pub(crate) fn validate(&self) -> Result<(), RemoteError> {
        let invalid = |reason: String| Err(RemoteError::InvalidConfig { url: self.redacted_url(), reason });
        if self.prefix.is_empty() || self.prefix.len() > 200 {
            return invalid(format!("the key prefix must be 1 to 200 bytes long (is {})", self.prefix.len()));
        }
        if let Some(c) = self.prefix.chars().find(|&c| c == '{' || c == '}' || c.is_whitespace() || c.is_control()) {
            return invalid(format!("the key prefix {:?} contains {c:?} (no braces, spaces or control characters)", self.prefix));
        }
        if self.queue == 0 {
            return invalid("the put queue must hold at least one byte".to_owned());
        }
        for (name, d) in [("connect", self.connect_timeout), ("response", self.response_timeout), ("retry interval", self.retry_interval)] {
            if d.is_zero() {
                return invalid(format!("the {name} timeout must not be zero"));
            }
        }
        Ok(())
    }
}

impl FromStr for RemoteConfig {
    type Err = RemoteError;
    fn from_str(url: &str) -> Result<RemoteConfig, RemoteError> {
        RemoteConfig::new(url)
    }
}

impl fmt::Display for RemoteConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted_url())
    }
}

impl fmt::Debug for RemoteConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RemoteConfig")
            .field("url", &self.redacted_url())
            .field("prefix", &self.prefix)
            .field("budget", &self.budget)
            .field("queue", &self.queue)
            .field("connect_timeout", &self.connect_timeout)
            .field("response_timeout", &self.response_timeout)
            .field("retry_interval", &self.retry_interval)
            .field("tls_ca", &self.tls_ca)
            .finish()
    }
}

/// A key prefix for the database in `dir`: `strata:` and 16 hex digits of a hash of its
/// absolute path, so databases sharing a server do not overwrite each other's objects (which
/// would cost hits, never correctness: the core verifies every object).
pub fn prefix_for_dir(dir: &Path) -> String {
    let path = std::fs::canonicalize(dir).unwrap_or_else(|_| std::path::absolute(dir).unwrap_or_else(|_| dir.to_owned()));
    // FNV-1a, 64 bits: stable across builds and platforms, unlike std's hasher.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in path.as_os_str().as_encoded_bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{DEFAULT_PREFIX}:{h:016x}")
}

/// Percent-encodes the characters that would break a URL's user part.
fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn decode(s: &str) -> Result<String, String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok()).and_then(|h| u8::from_str_radix(h, 16).ok());
            let Some(v) = hex else { return Err("bad percent-encoding in the user or password".to_owned()) };
            out.push(v);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| "user or password is not UTF-8 after percent-decoding".to_owned())
}

/// A URL that failed to parse, with anything that may be a password hidden: the part between
/// `://` and the last `@` before the path, and `password`/`pass` query values.
pub(crate) fn redact_raw(url: &str) -> String {
    let (head, query) = match url.split_once('?') {
        Some((h, q)) => (h, Some(q)),
        None => (url, None),
    };
    let mut out = match head.split_once("://") {
        Some((scheme, rest)) => match rest.rfind('@') {
            Some(at) => format!("{scheme}://***{}", &rest[at..]),
            None => head.to_owned(),
        },
        None if head.contains('@') => "***".to_owned(),
        None => head.to_owned(),
    };
    if let Some(q) = query {
        let parts: Vec<String> = q
            .split('&')
            .map(|kv| match kv.split_once('=') {
                Some((k, _)) if k.eq_ignore_ascii_case("password") || k.eq_ignore_ascii_case("pass") => format!("{k}=***"),
                _ => kv.to_owned(),
            })
            .collect();
        out.push('?');
        out.push_str(&parts.join("&"));
    }
    out
}

fn parse_host(s: &str) -> Result<Addr, String> {
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let (host, after) = rest.split_once(']').ok_or("unclosed '[' in an IPv6 host")?;
        match after {
            "" => (host, None),
            _ => (host, Some(after.strip_prefix(':').ok_or_else(|| format!("unexpected {after:?} after the IPv6 host"))?)),
        }
    } else {
        match s.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (s, None),
        }
    };
    if host.is_empty() {
        return Err("missing host".to_owned());
    }
    let port = match port {
        None => DEFAULT_PORT,
        Some(p) => p.parse::<u16>().ok().filter(|&p| p != 0).ok_or_else(|| format!("invalid port {p:?}"))?,
    };
    Ok(Addr::Tcp { host: host.to_owned(), port })
}

fn parse(url: &str) -> Result<Endpoint, String> {
    let (scheme, rest) = url.split_once("://").ok_or("expected redis://, unix:// or redis+cluster://")?;
    let (cluster, tls, unix) = match scheme.to_ascii_lowercase().as_str() {
        "redis" => (false, false, false),
        "rediss" => (false, true, false),
        "redis+cluster" => (true, false, false),
        "rediss+cluster" => (true, true, false),
        "unix" | "redis+unix" => (false, false, true),
        other => return Err(format!("unknown scheme {other:?} (redis, rediss, unix, redis+cluster, rediss+cluster)")),
    };
    let mut ep = Endpoint { cluster, tls, nodes: Vec::new(), db: 0, user: None, password: None };
    let parse_db = |s: &str| s.parse::<i64>().ok().filter(|&d| d >= 0).ok_or_else(|| format!("invalid database number {s:?}"));
    if unix {
        let (path, query) = match rest.split_once('?') {
            Some((p, q)) => (p, q),
            None => (rest, ""),
        };
        if !path.starts_with('/') {
            return Err("a unix socket URL needs an absolute path (unix:///path/to/socket)".to_owned());
        }
        for kv in query.split('&').filter(|kv| !kv.is_empty()) {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            match k {
                "db" => ep.db = parse_db(v)?,
                "user" | "username" => ep.user = Some(decode(v)?).filter(|u| !u.is_empty()),
                "password" | "pass" => ep.password = Some(decode(v)?),
                _ => return Err(format!("unknown query parameter {k:?} (db, user, password)")),
            }
        }
        ep.nodes.push(Addr::Unix(PathBuf::from(path)));
        return Ok(ep);
    }
    let (authority, path) = match rest.find(['/', '?']) {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    let hosts = match authority.rsplit_once('@') {
        Some((userinfo, hosts)) => {
            let (user, password) = match userinfo.split_once(':') {
                Some((u, p)) => (u, Some(p)),
                None => (userinfo, None),
            };
            ep.user = Some(decode(user)?).filter(|u| !u.is_empty());
            ep.password = password.map(decode).transpose()?;
            hosts
        }
        None => authority,
    };
    for h in hosts.split(',') {
        ep.nodes.push(parse_host(h)?);
    }
    if ep.nodes.len() > 1 && !cluster {
        return Err("several hosts are only allowed with redis+cluster://".to_owned());
    }
    if path.starts_with('?') {
        return Err("query parameters are only supported for unix:// URLs".to_owned());
    }
    match path.trim_start_matches('/') {
        "" => {}
        db if cluster => return Err(format!("a cluster has no database numbers (got /{db})")),
        db => ep.db = parse_db(db)?,
    }
    Ok(ep)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(s: &str) -> RemoteConfig {
        RemoteConfig::new(s).unwrap()
    }

    #[test]
    fn parses_and_redacts() {
        let c = url("redis://alice:p%40ss:word@10.0.0.1:6380/3");
        assert_eq!(c.endpoint.user.as_deref(), Some("alice"));
        assert_eq!(c.endpoint.password.as_deref(), Some("p@ss:word"));
        assert_eq!(c.endpoint.db, 3);
        assert!(c.endpoint.nodes == [Addr::Tcp { host: "10.0.0.1".into(), port: 6380 }]);
        assert_eq!(c.to_string(), "redis://alice:***@10.0.0.1:6380/3");
        assert!(!format!("{c:?}").contains("word"));

        let c = url("redis://:secret@localhost");
        assert_eq!(c.endpoint.user, None);
        assert_eq!(c.to_string(), "redis://:***@localhost:6379");

        let c = url("unix:///tmp/r.sock?db=2&password=s3");
        assert!(c.endpoint.nodes == [Addr::Unix("/tmp/r.sock".into())]);
        assert_eq!(c.to_string(), "unix:///tmp/r.sock?db=2&password=***");

        let c = url("redis+cluster://u:pw@127.0.0.1:7000,127.0.0.1:7001,[::1]:7002");
        assert!(c.is_cluster());
        assert_eq!(c.endpoint.nodes.len(), 3);
        assert_eq!(c.to_string(), "redis+cluster://u:***@127.0.0.1:7000,127.0.0.1:7001,[::1]:7002");
    }

    #[test]
    fn rejects_bad_urls_without_showing_secrets() {
        for bad in [
            "http://u:topsecret@h:1",
            "redis://u:topsecret@h:99999",
            "redis://u:topsecret@h:1,h:2",
            "redis+cluster://u:topsecret@h:1/2",
            "unix://relative?password=topsecret",
            "redis://u:top%zzsecret@h",
            "nonsense",
        ] {
            let e = RemoteConfig::new(bad).unwrap_err().to_string();
            assert!(!e.contains("topsecret") && !e.contains("top%zz"), "{e}");
            assert!(e.starts_with("invalid remote tier URL"), "{e}");
        }
        #[cfg(not(feature = "tls"))]
        assert!(RemoteConfig::new("rediss://u:topsecret@h").unwrap_err().to_string().contains("`tls` feature"));
    }

    #[test]
    fn validates_prefix() {
        let c = url("redis://h").prefix("a{b}");
        assert!(c.validate().unwrap_err().to_string().contains("prefix"));
        assert!(url("redis://h").prefix("db:7").validate().is_ok());
        let p = prefix_for_dir(Path::new("/tmp"));
        assert!(p.starts_with("strata:") && p.len() == 23 && url("redis://h").prefix(p).validate().is_ok());
    }
}
