//! `rediss://` against a private TLS server with its own CA (only with the `tls` feature:
//! `cargo test --release -p strata-remote --features tls --test tls`; needs `openssl`).
#![cfg(feature = "tls")]

mod common;

use std::path::Path;
use std::process::Command;

use common::*;
use strata_remote::{RedisTier, RemoteConfig, RemoteError};

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl").args(args).current_dir(dir).output().expect("run openssl (needed by the TLS test)");
    assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn rediss_with_a_private_ca() {
    let certs = tempfile::tempdir().unwrap();
    let d = certs.path();
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
    openssl(d, &[&["req", "-x509"][..], &ec, &["-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=strata test CA"]].concat());
    openssl(d, &[&["req"][..], &ec, &["-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1"]].concat());
    std::fs::write(d.join("ext.cnf"), "subjectAltName=IP:127.0.0.1,DNS:localhost\n").unwrap();
    #[rustfmt::skip]
    openssl(d, &["x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-out", "server.crt", "-days", "2", "-extfile", "ext.cnf"]);
    let file = |f: &str| d.join(f).display().to_string();
    let (crt, key, ca) = (file("server.crt"), file("server.key"), file("ca.crt"));
    let server = Server::tls(
        256 << 20,
        &["--tls-cert-file", &crt, "--tls-key-file", &key, "--tls-ca-cert-file", &ca, "--tls-auth-clients", "no", "--requirepass", "tls-pw-123"],
    );
    let url = server.url().replace("rediss://", "rediss://:tls-pw-123@");

    // The system's roots do not know this CA: a clear connect error.
    let e = RedisTier::connect(RemoteConfig::new(&url).unwrap()).unwrap_err();
    assert!(matches!(e, RemoteError::Connect { .. }) && !e.to_string().contains("tls-pw-123"), "{e}");

    // With the CA: a database round trip over TLS.
    let tier = tier_with(RemoteConfig::new(&url).unwrap().prefix("tls").tls_ca_file(d.join("ca.crt")));
    let vals = values(VALUES / 4, 12);
    let dir = tempfile::tempdir().unwrap();
    let db = database(dir.path(), Some(tier.clone()));
    let col = import(&db, "v", &vals);
    let order = shuffled(col.pages.len(), 12);
    assert_eq!(read_pages(&db, &col, &order), page_sums(&col, &vals));
    settle(&tier);
    assert_eq!(read_pages(&db, &col, &order), page_sums(&col, &vals));
    let r = remote(&db);
    assert!(r.hits > 0 && r.errors == 0, "{r:?}");
}
