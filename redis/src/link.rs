//! What every link to Redis shares, whether to one server, a cluster or through sentinels: URLs
//! without their passwords, the TLS roots, and why a link is not ready (kept typed, so waiting
//! for a server decides on its codes, not on an error's text).

use deadpool_redis::redis;

use crate::error::{Error, Result};

/// `url` with any password replaced by `***` — in the userinfo, or a `pass`/`password`
/// query parameter (`redis+unix://` URLs) — for logs, pages and error messages.
pub fn redacted(url: &str) -> String {
    let (url, query) = match url.split_once('?') {
        Some((url, query)) => (url, Some(query)),
        None => (url, None),
    };
    let mut shown = redacted_userinfo(url);
    if let Some(query) = query {
        let params: Vec<String> = query
            .split('&')
            .map(|param| match param.split_once('=') {
                // `pass`, `password`, `sentinel_password`, …
                Some((key, _)) if key == "pass" || key.ends_with("password") => {
                    format!("{key}=***")
                }
                _ => param.to_owned(),
            })
            .collect();
        shown = format!("{shown}?{}", params.join("&"));
    }
    shown
}

fn redacted_userinfo(url: &str) -> String {
    // Without a scheme (a typo), everything before the last '@' is still userinfo.
    let start = url.find("://").map_or(0, |i| i + 3);
    match url.rfind('@') {
        Some(at) if at >= start => {
            let userinfo = &url[start..at];
            let user = userinfo.split_once(':').map_or("", |(user, _)| user);
            let shown = if userinfo.contains(':') {
                format!("{user}:***")
            } else {
                "***".into()
            };
            format!("{}{shown}{}", &url[..start], &url[at..])
        }
        _ => url.to_owned(),
    }
}

/// The certificates every TLS link to Redis trusts: the PEM authority in `ca_file`, or the
/// system's trust store. Installs the process-wide rustls provider (ring) first.
pub(super) fn tls_certificates(
    ca_file: Option<&std::path::Path>,
) -> Result<redis::TlsCertificates> {
    // One process-wide rustls provider; a second install attempt is harmless.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let root_cert = ca_file
        .map(|path| {
            std::fs::read(path)
                .map_err(|e| Error::Config(format!("Redis CA file {}: {e}", path.display())))
        })
        .transpose()?;
    Ok(redis::TlsCertificates {
        client_tls: None,
        root_cert,
    })
}

/// Why a link could not be used, kept typed so that [`ping_until_ready`] decides on the
/// server's codes and redis-rs' error kinds, not on the text of a flattened error.
pub(super) enum Unready {
    /// What Redis or redis-rs said (after what was being reached: "cluster: ", …).
    Redis(String, redis::RedisError),
    /// No answer in time (a pool checkout, a sentinel discovery): a connection accepted and
    /// left unanswered.
    Silent(String),
    /// The node the sentinels named answers as a replica: a failover under way.
    Demoted,
    /// A wrong setting or a broken pool, said as it is.
    Failed(Error),
}

impl Unready {
    /// Whether the server is there but not ready: its "not now" codes (loading its data, busy
    /// with a script, a cluster or master not settled) or a connection left unanswered (a
    /// handshake sent while it loads can hang until the timeout). Not a refused or reset
    /// connection (a plain client at a TLS-only port is reset at once), a name that does not
    /// resolve or a certificate refused: those are a wrong address or setting, said at once.
    pub(super) fn not_now(&self) -> bool {
        match self {
            Self::Redis(_, e) => {
                e.is_timeout()
                    || matches!(
                        e.code(),
                        Some("LOADING" | "BUSY" | "TRYAGAIN" | "MASTERDOWN" | "CLUSTERDOWN")
                    )
                    || wrapped_not_now(e)
            }
            Self::Silent(_) | Self::Demoted => true,
            Self::Failed(_) => false,
        }
    }
}

/// redis-rs wraps two causes in errors of its own that keep only the cause's text: a cluster's
/// first connections ("Failed to create initial connections", the cause's display as detail:
/// "Io: timed out", "BusyLoading: …") and a `SELECT` refused while connecting to a database
/// other than 0 ("Redis server refused to switch database", the server's message without its
/// code as detail: "Redis is loading the dataset in memory"). Only for those two is the
/// detail read, for the not-now causes' own words.
fn wrapped_not_now(e: &redis::RedisError) -> bool {
    const WRAPPERS: [&str; 2] = [
        "Failed to create initial connections",
        "Redis server refused to switch database",
    ];
    const CAUSES: [&str; 8] = [
        "timed out",
        "busyloading",
        "redis is loading",
        "redis is busy",
        "tryagain",
        "masterdown",
        "master is down",
        "clusterdown",
    ];
    let (text, detail) = (e.to_string(), e.detail().unwrap_or_default().to_lowercase());
    WRAPPERS.iter().any(|w| text.starts_with(w)) && CAUSES.iter().any(|c| detail.contains(c))
}

impl From<Unready> for Error {
    fn from(unready: Unready) -> Self {
        match unready {
            Unready::Redis(what, e) => unavailable(format_args!("{what}{e}")),
            Unready::Silent(why) => unavailable(why),
            Unready::Demoted => unavailable("the node the sentinels named is no longer the master"),
            Unready::Failed(e) => e,
        }
    }
}

/// An error of the link to Redis, on one line. A server that is not Redis (an HTTP port, a
/// Postgres) answers bytes redis-rs cannot parse, and its error quotes them over several
/// lines: that is said as what it is.
pub(super) fn unavailable(e: impl std::fmt::Display) -> Error {
    let text = e.to_string();
    if text.contains("Parse error") {
        let first = text.lines().next().unwrap_or_default();
        return Error::Unavailable(format!(
            "redis: the server's reply is not the Redis protocol — is this a Redis port? ({first})"
        ));
    }
    Error::Unavailable(format!("redis: {}", text.replace('\n', " ")))
}
