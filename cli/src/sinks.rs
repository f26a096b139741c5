//! Where each sink a binary declares lives (`--sink NAME=URL`, the environment, or the
//! coordinator's Redis) and how its Postgres ones are connected: shared by `worker` and
//! `relay`, so neither depends on the other.

use std::collections::HashMap;
use std::sync::Arc;

use anyhow::{bail, Context as _};

use palisade::store::postgres::{MigrationPlan, Migrations, PostgresSink};
use palisade::store::redis::redacted;

/// The process's environment, its UTF-8 variables (what the sink lookups read).
pub(super) fn environment() -> HashMap<String, String> {
    std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .collect()
}

/// `PALISADE_SINK_<NAME>_URL` for sink `name`: upper case, anything but letters and digits
/// as `_`.
fn sink_var(name: &str) -> String {
    let var: String = name
        .chars()
        .map(|c| match c.is_ascii_alphanumeric() {
            true => c.to_ascii_uppercase(),
            false => '_',
        })
        .collect();
    format!("PALISADE_SINK_{var}_URL")
}

/// Resolves where each declared sink lives: `--sink NAME=URL`, then
/// `PALISADE_SINK_<NAME>_URL` from `env`, then the coordinator's Redis. A
/// `PALISADE_SINK_*_URL` naming no declared sink is refused, as `--sink typo=…` is: a typo
/// would otherwise send that sink's writes to the coordinator's Redis without a word.
pub(super) fn sink_urls(
    declared: &[String],
    flags: &[String],
    env: &HashMap<String, String>,
    default: &str,
) -> anyhow::Result<Vec<(String, String)>> {
    let known: Vec<String> = declared.iter().map(|d| sink_var(d)).collect();
    let mut stray: Vec<&String> = env
        .keys()
        .filter(|k| k.starts_with("PALISADE_SINK_") && k.ends_with("_URL") && !known.contains(k))
        .collect();
    stray.sort();
    if let Some(var) = stray.first() {
        bail!(
            "{var} names no sink this binary declares (declared: {}; their variables: {})",
            declared.join(", "),
            known.join(", ")
        );
    }
    let mut given = HashMap::new();
    for flag in flags {
        let Some((name, url)) = flag.split_once('=') else {
            bail!("--sink {flag:?}: expected NAME=URL");
        };
        if url.is_empty() {
            bail!("--sink {name}=: the URL is empty");
        }
        if !declared.iter().any(|d| d == name) {
            bail!(
                "--sink {name}: this binary declares no sink of that name (declared: {})",
                declared.join(", ")
            );
        }
        if given.insert(name.to_owned(), url.to_owned()).is_some() {
            bail!("--sink {name} is given twice");
        }
    }
    Ok(declared
        .iter()
        .map(|name| {
            let url = given
                .remove(name)
                .or_else(|| env.get(&sink_var(name)).cloned())
                .unwrap_or_else(|| default.to_owned());
            (name.clone(), url)
        })
        .collect())
}

/// Connects every sink whose URL is `postgres://` or `postgresql://`; one that verifies
/// certificates (`sslmode=verify-ca|verify-full`) and names no `sslrootcert` trusts `ca`
/// (`--ca-file`).
pub(super) async fn postgres_sinks(
    sink_urls: &[(String, String)],
    ca: Option<&std::path::Path>,
    migrations: Migrations,
) -> anyhow::Result<Vec<(String, Arc<PostgresSink>)>> {
    let mut sinks = Vec::new();
    for (name, url) in sink_urls.iter().filter(|(_, url)| is_postgres(url)) {
        let url = &palisade::cli_support::with_default_root(url, ca)?;
        let sink = PostgresSink::connect_with(url, super::STARTUP_PATIENCE, migrations)
            .await
            .with_context(|| format!("sink {name} at {}", redacted(url)))?;
        sinks.push((name.clone(), Arc::new(sink)));
    }
    Ok(sinks)
}

/// `migrate`: the schema migrations of the postgres:// sinks, shown or applied.
#[derive(Clone, Debug, clap::Args)]
#[command(group = clap::ArgGroup::new("what").required(true))]
pub(super) struct MigrateArgs {
    /// Where a declared sink lives, `NAME=postgres://…` (repeatable; also
    /// `PALISADE_SINK_<NAME>_URL`).
    #[arg(long = "sink", value_name = "NAME=URL")]
    sinks: Vec<String>,
    /// Print each sink's schema version and the migrations this binary would apply, with
    /// their SQL; change nothing.
    #[arg(long, group = "what")]
    plan: bool,
    /// Apply them (each once, under a lock; safe while workers run).
    #[arg(long, group = "what")]
    apply: bool,
    /// PEM certificate authority for sinks with sslmode=verify-ca|verify-full and no
    /// sslrootcert of their own.
    #[arg(long, env = "PALISADE_CA_FILE", value_name = "PATH")]
    ca_file: Option<std::path::PathBuf>,
}

/// Runs `migrate --plan` or `migrate --apply`.
pub(super) fn migrate(args: MigrateArgs, declared: &[String]) -> anyhow::Result<()> {
    let urls = postgres_urls(declared, &args.sinks)?;
    if urls.is_empty() {
        bail!("no postgres:// sink given (--sink NAME=postgres://… or PALISADE_SINK_<NAME>_URL)");
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let ca = super::ca_file_or_env(args.ca_file.clone());
        for (name, url) in &urls {
            let url = &palisade::cli_support::with_default_root(url, ca.as_deref())?;
            let at = || format!("sink {name} at {}", redacted(url));
            if args.apply {
                let done = palisade::store::postgres::migrate(url)
                    .await
                    .with_context(at)?;
                println!("{}", applied_line(name, &done));
            } else {
                let plan = palisade::store::postgres::migration_plan(url)
                    .await
                    .with_context(at)?;
                print!("{}", plan_text(name, &plan));
                if plan.newer_needs.is_some_and(|needs| needs > plan.known) {
                    bail!("sink {name}: this binary cannot run against its schema");
                }
            }
        }
        Ok(())
    })
}

/// The postgres:// sinks among those declared, by name, with their URLs.
fn postgres_urls(declared: &[String], flags: &[String]) -> anyhow::Result<Vec<(String, String)>> {
    let urls = sink_urls(declared, flags, &environment(), "")?;
    Ok(urls
        .into_iter()
        .filter(|(_, url)| is_postgres(url))
        .collect())
}

/// One line per postgres:// sink: its schema version and what this binary makes of it (the
/// first line `migrate --plan` prints), or why it could not be read, for `upgrade plan`.
pub(super) async fn schema_lines(
    declared: &[String],
    flags: &[String],
    ca: Option<&std::path::Path>,
) -> anyhow::Result<Vec<anyhow::Result<String>>> {
    let mut lines = Vec::new();
    for (name, url) in postgres_urls(declared, flags)? {
        let line = async {
            let url = &palisade::cli_support::with_default_root(&url, ca)?;
            let plan = palisade::store::postgres::migration_plan(url)
                .await
                .with_context(|| format!("sink {name} at {}", redacted(url)))?;
            let text = plan_text(&name, &plan);
            Ok(text.lines().next().unwrap_or_default().to_owned())
        };
        lines.push(line.await);
    }
    Ok(lines)
}

/// What `migrate --plan` prints for one sink.
fn plan_text(name: &str, plan: &MigrationPlan) -> String {
    let mut text = format!(
        "sink {name}: schema {} at version {}, this binary knows {}",
        plan.schema, plan.current, plan.known
    );
    match (plan.newer_needs, plan.pending.is_empty()) {
        (Some(needs), _) if needs <= plan.known => text.push_str(&format!(
            "; newer, and binaries from version {needs} on run against it: nothing to apply\n"
        )),
        (Some(needs), _) => text.push_str(&format!(
            "; newer, and only binaries from version {needs} on run against it: upgrade this one\n"
        )),
        (None, true) if plan.adds_readers_column => text
            .push_str(": up to date; --apply gives its migrations table the readers_from column\n"),
        (None, true) => text.push_str(": up to date\n"),
        (None, false) => {
            text.push_str(&format!(": {} to apply\n", plan.pending.len()));
            for m in &plan.pending {
                text.push_str(&format!(
                    "-- version {} (binaries from version {} on run against it)\n{}\n",
                    m.version,
                    m.readers_from,
                    m.sql.trim_end()
                ));
            }
        }
    }
    text
}

/// What `migrate --apply` prints for one sink.
fn applied_line(name: &str, done: &MigrationPlan) -> String {
    match done.pending.last() {
        Some(last) => format!(
            "sink {name}: schema {} from version {} to {}",
            done.schema, done.current, last.version
        ),
        None => format!(
            "sink {name}: schema {} at version {}: nothing to apply",
            done.schema, done.current
        ),
    }
}

/// Where a sink URL points, without credentials or connection options, for people to read
/// (which store a sink is, its identity, is what workers compare).
///
/// - `redis://host:port/db` (port 6379 and db 0 filled in; the hosts of a cluster sorted);
/// - `redis+sentinel://<master>/db` (the sentinels are how it is found, not where it is);
/// - `postgres://host:port/database?schema=<schema>` (port 5432, schema `palisade`).
pub(super) fn location(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let scheme = scheme.to_ascii_lowercase();
    let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
    // Each comma-separated part is a URL of its own in a cluster's list; a sentinel's and a
    // Postgres URL's hosts are one list before the path.
    let parts: Vec<&str> = rest.split(',').collect();
    let host_of = |part: &str| {
        let part = part.split_once("://").map_or(part, |(_, r)| r);
        let authority = part.split('/').next().unwrap_or_default();
        let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
        host.to_ascii_lowercase()
    };
    let with_port = |host: String, port: u16| {
        // (An IPv6 literal in brackets keeps its colons: only one after `]` is a port.)
        let has_port = host.rsplit_once(':').is_some_and(|(h, p)| {
            p.bytes().all(|b| b.is_ascii_digit()) && (!h.contains(':') || h.ends_with(']'))
        });
        if has_port || host.is_empty() {
            host
        } else {
            format!("{host}:{port}")
        }
    };
    let path = parts
        .last()
        .and_then(|last| {
            let last = last.split_once("://").map_or(*last, |(_, r)| r);
            last.split_once('/').map(|(_, path)| path.to_owned())
        })
        .unwrap_or_default();
    match scheme.as_str() {
        "redis+sentinel" | "rediss+sentinel" => {
            let mut path = path.trim_end_matches('/').to_owned();
            if !path.contains('/') {
                path.push_str("/0");
            }
            format!("redis+sentinel://{path}")
        }
        "postgres" | "postgresql" => {
            let mut hosts: Vec<String> =
                parts.iter().map(|p| with_port(host_of(p), 5432)).collect();
            hosts.sort();
            let schema = query
                .split('&')
                .find_map(|pair| pair.strip_prefix("schema="))
                .unwrap_or("palisade");
            format!("postgres://{}/{path}?schema={schema}", hosts.join(","))
        }
        _ => {
            let mut hosts: Vec<String> =
                parts.iter().map(|p| with_port(host_of(p), 6379)).collect();
            hosts.sort();
            hosts.dedup();
            let db = if path.is_empty() { "0" } else { path.as_str() };
            format!("redis://{}/{db}", hosts.join(","))
        }
    }
}

/// `sinks list|forget`.
#[derive(Clone, Debug, clap::Subcommand)]
pub(super) enum SinksCommand {
    /// Print each sink's recorded identity and location, one `NAME IDENTITY LOCATION` line
    /// per sink.
    List(super::RedisArgs),
    /// Forget where sink NAME lives: run with every worker stopped, when moving it on purpose
    /// (the next worker to start records its own URL's location).
    Forget {
        #[command(flatten)]
        redis: super::RedisArgs,
        /// The sink.
        name: String,
        /// Forget it though workers are live (each keeps writing where its own URL points;
        /// the next to start records its own).
        #[arg(long)]
        force: bool,
    },
}

/// Runs `sinks ...`.
pub(super) fn sinks(command: SinksCommand) -> anyhow::Result<()> {
    super::runtime()?.block_on(async {
        match command {
            SinksCommand::List(redis) => {
                let target = redis.reachable(&redis.redis, "Redis").await?;
                let all = palisade::store::redis::sink_locations(&target, &redis.prefix).await?;
                if all.is_empty() {
                    eprintln!(
                        "no sink location recorded yet (a worker records its sinks' at start)"
                    );
                }
                // (Each record is "<identity> <location>".)
                super::print_lines(all.into_iter().map(|(name, at)| format!("{name} {at}")))?;
            }
            SinksCommand::Forget { redis, name, force } => {
                let (target, store) = redis.store().await?;
                // A live worker could be the one with the wrong URL: were it to restart now,
                // it would record its own place, the split this record exists to prevent.
                let live = palisade::store::ControlStore::workers(&store).await?;
                if !live.is_empty() && !force {
                    bail!(
                        "{} workers are live (`palisade status` lists them): stop every worker \
                         before moving sink {name}, or add --force",
                        live.len()
                    );
                }
                if palisade::store::redis::forget_sink(&target, &redis.prefix, &name).await? {
                    println!(
                        "sink {name}: location forgotten; the next worker to start records its own"
                    );
                } else {
                    println!("sink {name}: no location was recorded");
                }
            }
        }
        anyhow::Ok(())
    })
}

/// Refuses to start when a sink is another store than the one the installation recorded (the
/// first worker to use a sink records which it is): one line naming both. `identities` holds
/// each sink's name, what its store says it is, and its URL.
pub(super) async fn check_identities(
    coordinator: &palisade::store::redis::Target,
    prefix: &str,
    identities: &[(String, String, String)],
) -> anyhow::Result<()> {
    for (name, identity, url) in identities {
        let here = location(url);
        if let Some(recorded) =
            palisade::store::redis::record_sink(coordinator, prefix, name, identity, &here).await?
        {
            let (theirs, at) = recorded.split_once(' ').unwrap_or((recorded.as_str(), "?"));
            bail!(
                "sink {name}: this worker's is {here} ({identity}), the installation's is {at} \
                 ({theirs}): one sink in two places splits its fence; fix --sink or {var}, or, \
                 to move it on purpose, stop every worker and run `palisade sinks forget {name}`",
                var = sink_var(name)
            );
        }
    }
    Ok(())
}

pub(super) fn is_postgres(url: &str) -> bool {
    url.starts_with("postgres://") || url.starts_with("postgresql://")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One place however it is reached; another place whatever it shares.
    #[test]
    fn a_location_is_where_a_url_points() {
        let same = [
            ("redis://127.0.0.1:6379", "redis://127.0.0.1:6379/0"),
            (
                "rediss://:pw@Cache.Example:6379/0",
                "redis://cache.example:6379/0",
            ),
            ("redis://user:p@ss@h", "redis://h:6379/0"),
            ("redis://h/3", "redis://h:6379/3"),
            ("redis://b:7001,redis://a:7000", "redis://a:7000,b:7001/0"),
            ("redis://[::1]:6380", "redis://[::1]:6380/0"),
            ("redis://[::1]", "redis://[::1]:6379/0"),
            (
                "redis+sentinel://s1,s2:26380/mymaster",
                "redis+sentinel://mymaster/0",
            ),
            (
                "rediss+sentinel://u:p@s9/mymaster/2",
                "redis+sentinel://mymaster/2",
            ),
            (
                "postgres://app:secret@DB:5432/shop?pool_size=4&pooler=transaction",
                "postgres://db:5432/shop?schema=palisade",
            ),
            (
                "postgresql://db/shop?sslmode=require&schema=ledger",
                "postgres://db:5432/shop?schema=ledger",
            ),
        ];
        for (url, want) in same {
            assert_eq!(location(url), want, "{url}");
        }
        assert_ne!(location("redis://h/1"), location("redis://h/2"));
        assert_ne!(location("redis://h:6379"), location("redis://h:6380"));
        assert_ne!(
            location("postgres://h/a?schema=x"),
            location("postgres://h/a")
        );
        assert_ne!(location("postgres://h/a"), location("redis://h"));
    }

    #[test]
    fn sinks_are_configured_by_flag_then_env_then_default() {
        let declared = [
            "ledger".to_owned(),
            "in-ventory".to_owned(),
            "audit".to_owned(),
        ];
        let env = HashMap::from([
            (
                "PALISADE_SINK_IN_VENTORY_URL".to_owned(),
                "redis://inv".to_owned(),
            ),
            ("PALISADE_SINKS".to_owned(), "not ours".to_owned()),
        ]);
        let flags = ["ledger=redis://ledger".to_owned()];
        let urls = sink_urls(&declared, &flags, &env, "redis://coordinator").unwrap();
        assert_eq!(
            urls,
            [
                ("ledger".into(), "redis://ledger".into()),
                ("in-ventory".into(), "redis://inv".into()),
                ("audit".into(), "redis://coordinator".into()),
            ]
        );
        assert!(sink_urls(&declared, &["nope=redis://x".into()], &env, "d").is_err());
        assert!(sink_urls(&declared, &["ledger".into()], &env, "d").is_err());
        let typo = HashMap::from([("PALISADE_SINK_LEDGR_URL".to_owned(), "redis://x".to_owned())]);
        let err = sink_urls(&declared, &[], &typo, "d")
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("PALISADE_SINK_LEDGR_URL names no sink")
                && err.contains("PALISADE_SINK_LEDGER_URL"),
            "{err}"
        );
    }
}
