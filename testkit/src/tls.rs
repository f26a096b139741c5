//! Certificates made in the test with openssl: a CA of the test's own and a server
//! certificate it signed for `localhost` and `127.0.0.1`, so TLS servers (Redis, Postgres)
//! can be started privately and clients checked against the right CA, and refused with a
//! wrong one.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// PEM files in one directory: `ca` signed `cert` (its key `key`).
#[derive(Clone, Debug)]
pub struct Certificates {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

fn openssl(dir: &Path, args: &[&str]) {
    let ok = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stderr(Stdio::null())
        .stdout(Stdio::null())
        .status();
    assert!(
        ok.expect("openssl is installed").success(),
        "openssl {args:?}"
    );
}

impl Certificates {
    /// A new CA and a server certificate for localhost / 127.0.0.1 in `dir` (created).
    pub fn make(dir: &Path) -> Self {
        std::fs::create_dir_all(dir).unwrap();
        let ca = Self::authority(dir, "ca");
        #[rustfmt::skip]
        openssl(dir, &["req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key",
            "-out", "server.csr", "-subj", "/CN=localhost"]);
        std::fs::write(
            dir.join("san.cnf"),
            "subjectAltName=DNS:localhost,IP:127.0.0.1\n",
        )
        .unwrap();
        #[rustfmt::skip]
        openssl(dir, &["x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", "server.crt", "-days", "1", "-extfile", "san.cnf"]);
        Self {
            ca,
            cert: dir.join("server.crt"),
            key: dir.join("server.key"),
        }
    }

    /// A self-signed CA `<name>.crt` (key `<name>.key`) in `dir` that signed nothing: the
    /// wrong CA a client must be refused with.
    pub fn authority(dir: &Path, name: &str) -> PathBuf {
        std::fs::create_dir_all(dir).unwrap();
        let (key, crt) = (format!("{name}.key"), format!("{name}.crt"));
        let subject = format!("/CN=palisade-test-{name}");
        #[rustfmt::skip]
        openssl(dir, &["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", &key,
            "-out", &crt, "-days", "1", "-subj", &subject]);
        dir.join(crt)
    }
}
