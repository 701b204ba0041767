//! [`RemoteError`]: what can go wrong opening the tier. Every variant names the server by its
//! URL with the password replaced by `***`, and reasons taken from the redis client are
//! scrubbed of the password as well.

/// Why [`crate::RedisTier::connect`] (or [`crate::RemoteConfig::new`]) failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RemoteError {
    /// The URL could not be parsed.
    #[error("invalid remote tier URL {url}: {reason}")]
    InvalidUrl {
        /// The URL, anything that may be a password hidden.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A setting is out of range.
    #[error("remote tier {url}: invalid setting: {reason}")]
    InvalidConfig {
        /// The server (redacted URL).
        url: String,
        /// What is wrong.
        reason: String,
    },
    /// `rediss://` without the `tls` feature.
    #[error("remote tier {url}: TLS (rediss://) needs strata-remote built with its `tls` feature")]
    TlsUnsupported {
        /// The server (redacted URL).
        url: String,
    },
    /// The server refused the user or password.
    #[error("remote tier {url}: authentication failed (wrong user or password)")]
    AuthFailed {
        /// The server (redacted URL).
        url: String,
    },
    /// The server requires a password and the URL gives none.
    #[error("remote tier {url}: the server requires authentication (give user and password in the URL)")]
    AuthRequired {
        /// The server (redacted URL).
        url: String,
    },
    /// The server could not be reached (refused, unreachable, timed out, TLS failure).
    #[error("remote tier {url}: cannot connect: {reason}")]
    Connect {
        /// The server (redacted URL).
        url: String,
        /// The client's reason.
        reason: String,
    },
    /// The server answered, but not as expected (not a cluster, cluster down, ...).
    #[error("remote tier {url}: {reason}")]
    Server {
        /// The server (redacted URL).
        url: String,
        /// What it said.
        reason: String,
    },
}

/// `msg` with every occurrence of the password replaced by `***`.
pub(crate) fn scrub(msg: String, password: Option<&str>) -> String {
    match password {
        Some(p) if !p.is_empty() && msg.contains(p) => msg.replace(p, "***"),
        _ => msg,
    }
}

/// Sorts an error of the redis client met while opening the tier into a [`RemoteError`].
pub(crate) fn classify(e: &redis::RedisError, url: String, password: Option<&str>) -> RemoteError {
    let code = e.code().unwrap_or("");
    let text = scrub(e.to_string(), password);
    if code == "NOAUTH" || text.contains("NOAUTH") {
        if password.is_some() {
            return RemoteError::AuthFailed { url };
        }
        return RemoteError::AuthRequired { url };
    }
    if e.kind() == redis::ErrorKind::AuthenticationFailed || code == "WRONGPASS" || text.contains("WRONGPASS") {
        return RemoteError::AuthFailed { url };
    }
    if e.is_io_error() {
        return RemoteError::Connect { url, reason: text };
    }
    RemoteError::Server { url, reason: text }
}
