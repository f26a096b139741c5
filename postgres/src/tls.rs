//! TLS to Postgres with libpq's `sslmode` and `sslrootcert`, over rustls (ring).
//!
//! tokio-postgres' own URL parser knows only `disable`, `prefer` and `require`, and refuses
//! `verify-ca`, `verify-full` and `sslrootcert`; so both are taken out of the URL here and
//! applied in the TLS setup. The modes mean what they mean to libpq:
//!
//! | `sslmode` | encrypted | certificate checked | host name checked |
//! |---|---|---|---|
//! | `disable` | no | — | — |
//! | `prefer` (the default) | if the server offers it | no | no |
//! | `require` | yes | no (yes with `sslrootcert`, as libpq) | no |
//! | `verify-ca` | yes | yes | no |
//! | `verify-full` | yes | yes | yes |
//!
//! Certificates are checked against `sslrootcert` (a PEM file), else against Mozilla's root
//! store (webpki-roots).

use std::path::PathBuf;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};

use crate::error::{Error, Result};

/// libpq's `sslmode`, as far as a client without client certificates has it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SslMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

/// What a Postgres URL asks of TLS.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Tls {
    pub(crate) mode: SslMode,
    pub(crate) root_cert: Option<PathBuf>,
}

/// Takes `sslmode` and `sslrootcert` out of `url` — a `postgres://` URL's query, or
/// `key=value` words — and returns the rest with what they asked for.
pub(crate) fn split_tls(url: &str) -> Result<(String, Tls)> {
    let mut mode = None;
    let mut root_cert = None;
    let mut take = |key: &str, value: &str| -> Result<bool> {
        match key {
            "sslmode" => {
                mode = Some(match value {
                    "disable" => SslMode::Disable,
                    "prefer" => SslMode::Prefer,
                    "require" => SslMode::Require,
                    "verify-ca" => SslMode::VerifyCa,
                    "verify-full" => SslMode::VerifyFull,
                    other => {
                        return Err(Error::Config(format!(
                            "Postgres sslmode {other:?}: use disable, prefer, require, \
                             verify-ca or verify-full"
                        )))
                    }
                });
                Ok(true)
            }
            "sslrootcert" => {
                root_cert = Some(PathBuf::from(value));
                Ok(true)
            }
            _ => Ok(false),
        }
    };
    let rest = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        match url.split_once('?') {
            None => url.to_owned(),
            Some((base, query)) => {
                let mut kept = Vec::new();
                for pair in query.split('&').filter(|p| !p.is_empty()) {
                    let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
                    // Percent-decoded as a URL is; a '+' stays a '+' (a file name, not a space).
                    let literal = value.replace('+', "%2B");
                    let decoded: String = form_urlencoded::parse(format!("v={literal}").as_bytes())
                        .next()
                        .map(|(_, v)| v.into_owned())
                        .unwrap_or_default();
                    if !take(key, &decoded)? {
                        kept.push(pair);
                    }
                }
                match kept.is_empty() {
                    true => base.to_owned(),
                    false => format!("{base}?{}", kept.join("&")),
                }
            }
        }
    } else {
        let mut kept = Vec::new();
        for (word, key, value) in words(url) {
            if !take(&key, &value)? {
                kept.push(word);
            }
        }
        kept.join(" ")
    };
    let mut mode = mode.unwrap_or(SslMode::Prefer);
    if mode == SslMode::Require && root_cert.is_some() {
        // As libpq: `require` with a root certificate verifies the chain.
        mode = SslMode::VerifyCa;
    }
    Ok((rest, Tls { mode, root_cert }))
}

/// The `key=value` words of a libpq connection string: each with its text as written, its key
/// and its value unquoted (`'…'` with `\'` and `\\` inside), so spaces in quoted values
/// survive and a quoted value can never pass for a word of its own.
fn words(conninfo: &str) -> Vec<(&str, String, String)> {
    let mut out = Vec::new();
    let bytes = conninfo.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        while i < bytes.len() && bytes[i].is_ascii_whitespace() {
            i += 1;
        }
        if i == bytes.len() {
            break;
        }
        let start = i;
        while i < bytes.len() && bytes[i] != b'=' && !bytes[i].is_ascii_whitespace() {
            i += 1;
        }
        let key = conninfo[start..i].to_owned();
        let mut value = String::new();
        if i < bytes.len() && bytes[i] == b'=' {
            i += 1;
            if i < bytes.len() && bytes[i] == b'\'' {
                i += 1;
                let mut chars = conninfo[i..].char_indices();
                loop {
                    match chars.next() {
                        None => {
                            i = bytes.len();
                            break;
                        }
                        Some((at, '\'')) => {
                            i += at + 1;
                            break;
                        }
                        Some((_, '\\')) => {
                            if let Some((_, c)) = chars.next() {
                                value.push(c);
                            }
                        }
                        Some((_, c)) => value.push(c),
                    }
                }
            } else {
                let from = i;
                while i < bytes.len() && !bytes[i].is_ascii_whitespace() {
                    i += 1;
                }
                value = conninfo[from..i].to_owned();
            }
        }
        out.push((&conninfo[start..i], key, value));
    }
    out
}

impl Tls {
    /// tokio-postgres' part of the mode: whether TLS is tried, and whether it must be.
    pub(crate) fn pg_mode(&self) -> tokio_postgres::config::SslMode {
        match self.mode {
            SslMode::Disable => tokio_postgres::config::SslMode::Disable,
            SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
            _ => tokio_postgres::config::SslMode::Require,
        }
    }

    /// The connector for this mode; `None` for `disable`.
    pub(crate) fn connector(&self) -> Result<Option<tokio_postgres_rustls::MakeRustlsConnect>> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::Config(format!("Postgres TLS: {e}")))?;
        if self.mode == SslMode::Disable {
            return Ok(None);
        }
        if self.mode == SslMode::VerifyCa && self.root_cert.is_none() {
            // Any public CA signs certificates for any name anyone registers: a chain check
            // without a name check is only worth something against roots of one's own (libpq
            // refuses this too).
            return Err(Error::Config(
                "Postgres sslmode=verify-ca needs sslrootcert (or --ca-file): against the \
                 public roots, use verify-full"
                    .into(),
            ));
        }
        let verifier =
            WebPkiServerVerifier::builder_with_provider(Arc::new(self.roots()?), provider)
                .build()
                .map_err(|e| Error::Config(format!("Postgres TLS: {e}")))?;
        let verifier: Arc<dyn ServerCertVerifier> = match self.mode {
            SslMode::VerifyFull => verifier,
            mode => Arc::new(Lenient {
                inner: verifier,
                check_chain: mode == SslMode::VerifyCa,
            }),
        };
        let config = builder
            .dangerous()
            .with_custom_certificate_verifier(verifier)
            .with_no_client_auth();
        Ok(Some(tokio_postgres_rustls::MakeRustlsConnect::new(config)))
    }

    fn roots(&self) -> Result<RootCertStore> {
        let mut roots = RootCertStore::empty();
        match &self.root_cert {
            None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
            Some(path) => {
                let bad = |e: &dyn std::fmt::Display| {
                    Error::Config(format!("Postgres sslrootcert {}: {e}", path.display()))
                };
                let certs = CertificateDer::pem_file_iter(path)
                    .map_err(|e| bad(&e))?
                    .collect::<std::result::Result<Vec<_>, _>>()
                    .map_err(|e| bad(&e))?;
                if certs.is_empty() {
                    return Err(bad(&"no PEM certificate in it"));
                }
                for cert in certs {
                    roots.add(cert).map_err(|e| bad(&e))?;
                }
            }
        }
        Ok(roots)
    }
}

/// Whether `url`'s TLS settings (`sslmode`, `sslrootcert`, ...) are ones a link can be made
/// with: the CLI checks a sink's URL at start, before the coordinator is reached.
pub fn check_tls(url: &str) -> Result<()> {
    split_tls(url).map(drop)
}

/// `sslrootcert=` for `url` when it verifies certificates and names none, so one CA option
/// (the CLI's `--ca-file`) serves every link.
pub fn with_default_root(url: &str, ca_file: Option<&std::path::Path>) -> Result<String> {
    let (_, tls) = split_tls(url)?;
    let Some(ca) = ca_file else {
        return Ok(url.to_owned());
    };
    if tls.root_cert.is_some() || !matches!(tls.mode, SslMode::VerifyCa | SslMode::VerifyFull) {
        return Ok(url.to_owned());
    }
    if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
        // A `key=value` string: one more word, quoted.
        let quoted = ca
            .display()
            .to_string()
            .replace('\\', "\\\\")
            .replace('\'', "\\'");
        return Ok(format!("{url} sslrootcert='{quoted}'"));
    }
    let ca: String = form_urlencoded::byte_serialize(ca.as_os_str().as_encoded_bytes()).collect();
    let joiner = if url.contains('?') { '&' } else { '?' };
    Ok(format!("{url}{joiner}sslrootcert={ca}"))
}

/// The verifiers libpq's weaker modes need, around rustls' own: `prefer`/`require`
/// (`check_chain: false`) accept any certificate, `verify-ca` (`true`) checks the chain but
/// not the name. Either way the handshake's own signatures are checked by the inner verifier,
/// so the channel is to whoever holds the key the certificate names.
#[derive(Debug)]
struct Lenient {
    inner: Arc<WebPkiServerVerifier>,
    check_chain: bool,
}

impl ServerCertVerifier for Lenient {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        if !self.check_chain {
            return Ok(ServerCertVerified::assertion());
        }
        // rustls checks the chain and validity before the name: a name error means the rest
        // passed.
        match self.inner.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        ) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn sslmode_and_sslrootcert_are_taken_out_of_the_url() {
        let (rest, tls) = split_tls(
            "postgres://u@h/db?sslmode=verify-full&schema=x&sslrootcert=%2Fca%20dir%2Fca.pem",
        )
        .unwrap();
        assert_eq!(rest, "postgres://u@h/db?schema=x");
        assert_eq!(tls.mode, SslMode::VerifyFull);
        assert_eq!(tls.root_cert.as_deref(), Some(Path::new("/ca dir/ca.pem")));

        let (rest, tls) = split_tls("postgres://u@h/db").unwrap();
        assert_eq!(
            (rest.as_str(), tls.mode),
            ("postgres://u@h/db", SslMode::Prefer)
        );
        let (rest, tls) = split_tls("postgres://u@h/db?sslmode=disable").unwrap();
        assert_eq!(
            (rest.as_str(), tls.mode),
            ("postgres://u@h/db", SslMode::Disable)
        );
        // libpq: `require` with a root certificate verifies the chain.
        let (_, tls) = split_tls("postgres://h/db?sslmode=require&sslrootcert=/ca.pem").unwrap();
        assert_eq!(tls.mode, SslMode::VerifyCa);

        let (rest, tls) = split_tls("host=h user=u sslmode=verify-ca sslrootcert=/ca.pem").unwrap();
        assert_eq!(rest, "host=h user=u");
        assert_eq!(tls.mode, SslMode::VerifyCa);

        let err = split_tls("postgres://h/db?sslmode=verify_full")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("use disable, prefer, require, verify-ca or verify-full"),
            "{err}"
        );
        assert!(!err.contains('\n'));
    }

    #[test]
    fn one_ca_option_serves_urls_that_verify_and_name_none() {
        let ca = Some(Path::new("/etc/ca.pem"));
        let url = "postgres://h/db?sslmode=verify-full";
        assert_eq!(
            with_default_root(url, ca).unwrap(),
            "postgres://h/db?sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem"
        );
        let own = "postgres://h/db?sslmode=verify-ca&sslrootcert=/mine.pem";
        assert_eq!(with_default_root(own, ca).unwrap(), own);
        assert_eq!(
            with_default_root("postgres://h/db", ca).unwrap(),
            "postgres://h/db"
        );
        assert_eq!(with_default_root(url, None).unwrap(), url);
        // A key=value string gets one more quoted word, which reads back.
        let kv = with_default_root(
            "host=h sslmode=verify-full",
            Some(Path::new("/a b/c'a.pem")),
        )
        .unwrap();
        let (_, tls) = split_tls(&kv).unwrap();
        assert_eq!(tls.root_cert.as_deref(), Some(Path::new("/a b/c'a.pem")));
    }

    #[test]
    fn verify_ca_without_a_root_of_ones_own_is_refused() {
        let tls = Tls {
            mode: SslMode::VerifyCa,
            root_cert: None,
        };
        let err = tls.connector().err().unwrap().to_string();
        assert!(err.contains("needs sslrootcert"), "{err}");
    }

    #[test]
    fn a_missing_or_empty_root_file_is_one_clear_line() {
        let tls = Tls {
            mode: SslMode::VerifyFull,
            root_cert: Some("/nonexistent/ca.pem".into()),
        };
        let err = tls.connector().err().unwrap().to_string();
        assert!(err.contains("sslrootcert /nonexistent/ca.pem"), "{err}");
        let empty = std::env::temp_dir().join(format!("empty-{}.pem", uuid::Uuid::new_v4()));
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let tls = Tls {
            mode: SslMode::VerifyCa,
            root_cert: Some(empty.clone()),
        };
        let err = tls.connector().err().unwrap().to_string();
        assert!(err.contains("no PEM certificate"), "{err}");
        let _ = std::fs::remove_file(empty);
    }
}
