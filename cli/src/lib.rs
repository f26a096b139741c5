//! `palisade_cli::App`: the whole command line of a user's worker binary, built from the
//! user's [`Registry`] and the names of the fenced sinks its handlers write to.
//!
//! ```no_run
//! # mod my_jobs { pub fn registry() -> palisade::Registry { palisade::Registry::new() } }
//! fn main() -> std::process::ExitCode {
//!     palisade_cli::App::new(my_jobs::registry()).sink("inventory").run()
//! }
//! ```
//!
//! The binary then has `worker`, `enqueue`, `status`, `dead list|retry|purge` and `relay`,
//! plus any subcommand the user adds with [`App::subcommand`]. Where each sink lives is
//! configuration, not code: `--sink inventory=redis://…` or `--sink
//! orders=postgres://…?schema=orders`, or `PALISADE_SINK_INVENTORY_URL`, and by default the
//! coordinator's own Redis.
//!
//! # Layout
//! - this file: [`App`], the connection flags every subcommand shares, logging, exit codes.
//! - `worker`: `worker` — N [`Worker`](palisade::Worker)s on N arbiters, the named sinks, the
//!   `/metrics` `/healthz` `/readyz` listener, and the drain on SIGTERM.
//! - `admin`: `enqueue`, `status`, `dead list|retry|purge`.
//! - `relay`: `relay` and `worker --relay` — outbox relays for the Postgres sinks.
//!
//! # Exit codes
//! - `0`: the command succeeded (a worker: it drained cleanly after SIGTERM / SIGINT).
//! - `1`: reserved for a user subcommand's own "ran, but the check failed".
//! - `2`: bad usage, bad configuration or input, or a backend that cannot be reached; one line
//!   on stderr says which (`palisade <command>: …`, passwords shown as `***`).

mod admin;
mod flow;

#[cfg(feature = "ui")]
mod api;
// (`job` reads through it too; without the console, the rest of it is unused.)
#[cfg_attr(not(feature = "ui"), allow(dead_code))]
mod reads;
mod relay;
#[cfg(feature = "ui")]
mod serve;
mod sinks;
#[cfg(feature = "ui")]
mod ui;
mod upgrade;
mod worker;

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::{ArgMatches, FromArgMatches, Subcommand};

use palisade::store::redis::{cluster_with_ca, pool_with_ca, redacted, sentinel, Target};
use palisade::store::Stores;
use palisade::RedisLeaseStore;
use palisade::Registry;

/// A user's worker binary: built from their [`Registry`] and sink names, run from `main`.
pub struct App {
    registry: Registry,
    sinks: Vec<String>,
    /// Recurring jobs given in code; a bad one is reported when the binary runs.
    schedules: Vec<palisade::Result<palisade::Schedule>>,
    name: String,
    about: String,
    version: String,
    extra: Vec<Extra>,
}

/// The clap version [`App::subcommand`] takes a `Command` of, so a worker crate needs no
/// version-matched `clap` dependency of its own.
pub use clap;

/// A subcommand of the user's own, on its parsed arguments.
type PlainRun = Box<dyn FnOnce(&ArgMatches) -> ExitCode>;
/// A subcommand of the user's own, on its parsed arguments and the installation they name.
type InstalledRun = Box<dyn FnOnce(&Installation, &ArgMatches) -> ExitCode>;

enum Run {
    Plain(PlainRun),
    Installed(InstalledRun),
}

struct Extra {
    command: clap::Command,
    run: Run,
    /// An argument of the user's command that clashes with an installation flag
    /// ([`App::subcommand_with`]): reported when the binary runs.
    clash: Option<String>,
}

/// The installation flags [`App::subcommand_with`] adds: (argument id, long name).
const INSTALLATION_FLAGS: [(&str, &str); 6] = [
    ("redis", "redis"),
    ("prefix", "prefix"),
    ("ca_file", "ca-file"),
    ("redis_cluster", "redis-cluster"),
    ("partitions", "partitions"),
    ("sinks", "sink"),
];

/// The installation a subcommand of the user's own runs against, from the same flags and
/// environment as the built-in ones (`--redis`, `--prefix`, `--partitions`,
/// `--ca-file`, `--redis-cluster`, `--sink NAME=URL`, and their `PALISADE_*`
/// variables).
pub struct Installation {
    redis: RedisArgs,
    /// Every sink the binary declares, and where it lives.
    sinks: Vec<(String, String)>,
}

/// The flags a subcommand of the user's own gets ([`App::subcommand_with`]).
#[derive(clap::Args)]
struct InstallationArgs {
    #[command(flatten)]
    redis: RedisArgs,
    /// Where a declared fenced sink lives: `NAME=URL` (repeatable). Also
    /// `PALISADE_SINK_<NAME>_URL`; default: the coordinator's Redis.
    #[arg(long = "sink", value_name = "NAME=URL")]
    sinks: Vec<String>,
}

impl Installation {
    /// The installation's key prefix (`--prefix`).
    pub fn prefix(&self) -> &str {
        &self.redis.prefix
    }

    /// The coordinator, reached and checked as the built-in commands reach it (its layout
    /// generation and number of partitions included).
    pub async fn stores(&self) -> anyhow::Result<Stores> {
        Ok(self.redis.store().await?.1)
    }

    /// A [`Client`](palisade::Client) of the coordinator.
    pub async fn client(&self) -> anyhow::Result<palisade::Client> {
        Ok(palisade::Client::new(self.stores().await?))
    }

    /// Where each sink the binary declares ([`App::sink`]) lives, as `worker` resolves it.
    pub fn sink_urls(&self) -> &[(String, String)] {
        &self.sinks
    }

    /// The declared sink `name` as the workers write it (the same keys or schema: on Redis
    /// under `<prefix>-<name>`), for reads of the user's own ([`FencedStore::read`],
    /// [`FencedStore::highest`]).
    ///
    /// [`FencedStore::read`]: palisade::FencedStore::read
    /// [`FencedStore::highest`]: palisade::FencedStore::highest
    pub async fn sink(
        &self,
        name: &str,
    ) -> anyhow::Result<std::sync::Arc<dyn palisade::FencedStore>> {
        let Some((_, url)) = self.sinks.iter().find(|(n, _)| n == name) else {
            anyhow::bail!("this binary declares no sink {name:?}");
        };
        if sinks::is_postgres(url) {
            let ca = self.redis.ca_file();
            let pg = sinks::postgres_sinks(
                &[(name.to_owned(), url.clone())],
                ca.as_deref(),
                Default::default(),
            )
            .await?;
            let (_, pg) = pg.into_iter().next().expect("one postgres:// sink");
            return Ok(std::sync::Arc::new(palisade::PostgresFencedStore::new(pg)));
        }
        let target = self
            .redis
            .reachable(url, &format!("the Redis of sink {name}"))
            .await?;
        let prefix = format!("{}-{name}", self.redis.prefix);
        Ok(std::sync::Arc::new(palisade::RedisFencedStore::new(
            target, &prefix,
        )))
    }
}

#[derive(Subcommand)]
enum Builtin {
    /// Run workers against Redis until SIGTERM / SIGINT, then drain.
    Worker(worker::WorkerArgs),
    /// Enqueue one job (or one per line of stdin); prints the job ids.
    Enqueue(admin::EnqueueArgs),
    /// Show queue counts, live leases with their age, and a scope's newest token.
    Status(admin::StatusArgs),
    /// List a queue's ready or delayed jobs, one JSON object per line (next to run first).
    Jobs(admin::JobsArgs),
    /// Show one job by id, as JSON: queued or running, completed (kept a day by default:
    /// `worker --keep-completed`) or dead, with its times and each attempt's outcome and error.
    Job(admin::JobArgs),
    /// Clear a queue: cancel every ready and delayed job of it (each goes to the dead letters
    /// with the reason, where `dead retry` brings it back); asks for --yes.
    Clear(admin::ClearArgs),
    /// List the job kinds this binary handles, each with an example payload to copy (what
    /// `enqueue` and the API's `kind` and `payload` take).
    Kinds(admin::KindsArgs),
    /// List, retry or purge dead-lettered jobs.
    #[command(subcommand)]
    Dead(admin::DeadCommand),
    /// Deliver the outboxes of the postgres:// sinks until SIGTERM / SIGINT.
    Relay(relay::RelayCommand),
    /// List or retry the outbox entries of the postgres:// sinks.
    #[command(subcommand)]
    Outbox(relay::OutboxCommand),
    /// Show (--plan) or apply (--apply) the schema migrations of the postgres:// sinks.
    Migrate(sinks::MigrateArgs),
    /// List, add or remove recurring schedules (those kept in Redis; `list` also shows the
    /// ones this binary declares).
    #[command(subcommand)]
    Schedule(admin::ScheduleCommand),
    /// Cancel a job: queued, it goes to the dead letters; running, its lease is revoked.
    Cancel(admin::CancelArgs),
    /// Show or cancel a flow (a DAG of jobs created with `Client::create_flow`).
    #[command(subcommand)]
    Flow(flow::FlowCommand),
    /// Complete or show a waitpoint (what a durable run's `wait_for` waits for).
    #[command(subcommand)]
    Waitpoint(admin::WaitpointCommand),
    /// Show a durable run: its job's state and its journal (each step, sleep and wait with
    /// its result or outcome and the token of the claim that recorded it), as JSON.
    #[command(subcommand)]
    Run(admin::RunCommand),
    /// Cap (or uncap) how many jobs of a kind run at once across every worker.
    Cap(admin::CapArgs),
    /// Show a group (`NewJob::with_group`), or change its cap, rate limit or pause.
    Group(admin::GroupArgs),
    /// Show, check or finalize the installation's format level across a rolling deploy.
    #[command(subcommand)]
    Upgrade(upgrade::UpgradeCommand),
    /// Move to another number of coordinator partitions without lowering any scope's tokens
    /// (run with every worker stopped and the old layout drained).
    Partitions(admin::PartitionsArgs),
    /// Set or lift a queue's rate limit (claims per period, shared by every worker).
    Limit(admin::LimitArgs),
    /// Stop claims from a queue (running jobs finish; nothing is moved or lost).
    Pause(admin::QueueArgs),
    /// Let workers claim from a paused queue again.
    Resume(admin::QueueArgs),
    /// Forget a queue that holds no job (it leaves `status`, the page and the metrics until a
    /// job is enqueued to it again); refused while it holds one.
    Forget(admin::QueueArgs),
    /// Show where the installation keeps each sink (recorded by the first worker to use it;
    /// a worker whose sink URL points elsewhere is refused), or forget one to move it.
    #[command(subcommand)]
    Sinks(sinks::SinksCommand),
    /// Serve the operator console (queues, workers, delayed and dead jobs, flows, schedules,
    /// fence rejections, a page per job) on 127.0.0.1:8080 until SIGTERM / SIGINT.
    #[cfg(feature = "ui")]
    Ui(ui::UiArgs),
    /// Serve the HTTP API alone (JSON under /api/v1, its OpenAPI document at
    /// /api/v1/openapi.json) on 127.0.0.1:8081 until SIGTERM / SIGINT; `ui` serves it too.
    #[cfg(feature = "ui")]
    Api(api::ApiArgs),
}

impl App {
    /// The command line for the jobs in `registry`.
    pub fn new(registry: Registry) -> Self {
        let name = std::env::args_os()
            .next()
            .map(PathBuf::from)
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .unwrap_or_else(|| "palisade".into());
        Self {
            registry,
            sinks: Vec::new(),
            schedules: Vec::new(),
            name,
            about: "Fenced job workers built on Palisade.".into(),
            version: format!(
                "(palisade {}, format levels {}..={})",
                env!("CARGO_PKG_VERSION"),
                palisade::format::LEVELS.start(),
                palisade::format::LEVELS.end()
            ),
            extra: Vec::new(),
        }
    }

    /// Declares a fenced sink by the name handlers use (`ctx.sink("inventory")`). Where it
    /// lives is configured at run time: `--sink inventory=redis://…`,
    /// `PALISADE_SINK_INVENTORY_URL`, or by default the coordinator's Redis. Its keys start
    /// with `<prefix>-<name>:`.
    pub fn sink(mut self, name: impl Into<String>) -> Self {
        self.sinks.push(name.into());
        self
    }

    /// A recurring job: `job` is enqueued at every tick of the cron `pattern` (5 fields, or 6
    /// with seconds first; UTC), exactly once per tick however many workers run — every
    /// `worker` may take the scheduler role (see [`Scheduler`](palisade::Scheduler)). For a time
    /// zone or a catch-up policy, use [`App::schedule_with`]. A bad pattern makes every
    /// subcommand fail with the reason.
    pub fn schedule(
        mut self,
        name: impl Into<String>,
        pattern: &str,
        job: palisade::NewJob,
    ) -> Self {
        self.schedules
            .push(palisade::Schedule::new(name, pattern, job));
        self
    }

    /// A recurring job built with [`Schedule`](palisade::Schedule)'s options.
    pub fn schedule_with(mut self, schedule: palisade::Result<palisade::Schedule>) -> Self {
        self.schedules.push(schedule);
        self
    }

    /// The binary's name in `--help` (default: the executable's file name).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// The version `--version` prints (e.g. `env!("CARGO_PKG_VERSION")` of your crate); by
    /// default the Palisade library's.
    pub fn version(mut self, version: impl Into<String>) -> Self {
        self.version = version.into();
        self
    }

    /// The one-line description in `--help`.
    pub fn about(mut self, about: impl Into<String>) -> Self {
        self.about = about.into();
        self
    }

    /// Adds a subcommand of the user's own: `command` describes its arguments (clap), `run`
    /// gets the parsed matches and returns the exit code. Logging is set up before `run` is
    /// called (errors only, unless `RUST_LOG` says otherwise).
    pub fn subcommand(
        mut self,
        command: clap::Command,
        run: impl FnOnce(&ArgMatches) -> ExitCode + 'static,
    ) -> Self {
        self.extra.push(Extra {
            command,
            run: Run::Plain(Box::new(run)),
            clash: None,
        });
        self
    }

    /// [`subcommand`](Self::subcommand) run against this installation: `command` gets the
    /// built-in commands' coordinator flags (`--redis`, `--prefix`, ...), and `run` the
    /// [`Installation`] they name — so a command of the user's own reaches the same
    /// coordinator as `worker` and `status` without parsing them again. `run` builds its own
    /// runtime (`tokio::runtime::Runtime`) for the async calls.
    ///
    /// The flags are the command's own, so they go before a subcommand of it. `command` must
    /// not define arguments named `redis`, `prefix`, `ca_file`, `redis_cluster`,
    /// `partitions` or `sinks`, nor the long flags `--redis`, `--prefix`, `--ca-file`,
    /// `--redis-cluster`, `--partitions` or `--sink`: a binary that does refuses to run
    /// (exit 2, naming the argument), rather than read the wrong installation.
    pub fn subcommand_with(
        mut self,
        command: clap::Command,
        run: impl FnOnce(&Installation, &ArgMatches) -> ExitCode + 'static,
    ) -> Self {
        use clap::Args as _;
        let clash = command.get_arguments().find_map(|arg| {
            let (id, long) = (arg.get_id().as_str(), arg.get_long());
            INSTALLATION_FLAGS
                .iter()
                .find(|(flag_id, flag)| id == *flag_id || long == Some(*flag))
                .map(|(_, flag)| format!("its argument {id:?} clashes with the flag --{flag}"))
        });
        let command = match clash {
            Some(_) => command,
            None => InstallationArgs::augment_args(command),
        };
        self.extra.push(Extra {
            command,
            run: Run::Installed(Box::new(run)),
            clash,
        });
        self
    }

    /// Parses the process's arguments and runs the chosen subcommand.
    pub fn run(self) -> ExitCode {
        self.run_from(std::env::args_os())
    }

    /// Parses `args` (the first is the binary's name) and runs the chosen subcommand.
    pub fn run_from<I, T>(self, args: I) -> ExitCode
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString> + Clone,
    {
        let mut command = Builtin::augment_subcommands(
            clap::Command::new(self.name.clone())
                .about(self.about.clone())
                .version(self.version.clone())
                .subcommand_required(true)
                .arg(
                    clap::Arg::new("log-format")
                        .long("log-format")
                        .global(true)
                        .value_parser(["text", "json"])
                        .default_value("text")
                        .help("Log lines as plain text or as JSON objects (one per line)"),
                )
                .arg(
                    clap::Arg::new("otlp-endpoint")
                        .long("otlp-endpoint")
                        .global(true)
                        .value_name("URL")
                        .help(
                            "Export traces over OTLP to this collector (a base URL, as \
                             OTEL_EXPORTER_OTLP_ENDPOINT; the protocol from \
                             OTEL_EXPORTER_OTLP_PROTOCOL). Needs palisade-cli's `otel` feature",
                        ),
                ),
        );
        for extra in &self.extra {
            if let Some(clash) = &extra.clash {
                eprintln!(
                    "{}: subcommand {}: {clash} that App::subcommand_with adds",
                    self.name,
                    extra.command.get_name()
                );
                return ExitCode::from(2);
            }
            command = command.subcommand(extra.command.clone());
        }
        let matches = match command.try_get_matches_from(args) {
            Ok(matches) => matches,
            Err(e) => {
                let _ = e.print();
                return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
            }
        };
        let json = matches.get_one::<String>("log-format").map(String::as_str) == Some("json");
        let otlp = matches.get_one::<String>("otlp-endpoint").cloned();
        let (sub, sub_matches) = matches.subcommand().expect("a subcommand is required");
        let App {
            registry,
            sinks,
            extra,
            name,
            schedules,
            ..
        } = self;
        // Checked before any subcommand runs, the user's own included: a bad schedule makes
        // every subcommand fail, not only the ones that use it.
        let schedules = match schedules.into_iter().collect::<palisade::Result<Vec<_>>>() {
            Ok(schedules) => schedules,
            Err(e) => {
                eprintln!("{name}: a schedule given in code is invalid: {e}");
                return ExitCode::from(2);
            }
        };
        let mut names: Vec<&str> = schedules.iter().map(|s| s.name()).collect();
        names.sort_unstable();
        if let Some(dup) = names.windows(2).find(|w| w[0] == w[1]) {
            eprintln!("{name}: two schedules given in code are named {:?}", dup[0]);
            return ExitCode::from(2);
        }
        if let Some(extra) = extra.into_iter().find(|e| e.command.get_name() == sub) {
            let _export = match init_logging("error", json, otlp.as_deref()) {
                Ok(export) => export,
                Err(e) => {
                    eprintln!("{name} {sub}: {e:#}");
                    return ExitCode::from(2);
                }
            };
            return match extra.run {
                Run::Plain(run) => run(sub_matches),
                Run::Installed(run) => match InstallationArgs::from_arg_matches(sub_matches) {
                    Ok(args) => match sinks::sink_urls(
                        &sinks,
                        &args.sinks,
                        &sinks::environment(),
                        &args.redis.redis,
                    ) {
                        Ok(sinks) => run(
                            &Installation {
                                redis: args.redis,
                                sinks,
                            },
                            sub_matches,
                        ),
                        Err(e) => {
                            if json {
                                tracing::error!(command = sub, "{name} {sub}: {e:#}");
                            } else {
                                eprintln!("{name} {sub}: {e:#}");
                            }
                            ExitCode::from(2)
                        }
                    },
                    Err(e) => {
                        let _ = e.print();
                        ExitCode::from(2)
                    }
                },
            };
        }
        let builtin = match Builtin::from_arg_matches(&matches) {
            Ok(builtin) => builtin,
            Err(e) => {
                let _ = e.print();
                return ExitCode::from(2);
            }
        };
        // Held to the end: dropping it sends the spans not sent yet.
        let _export = match init_logging(
            if matches!(builtin, Builtin::Worker(_) | Builtin::Relay(_)) {
                "info"
            } else {
                "warn"
            },
            json,
            otlp.as_deref(),
        ) {
            Ok(export) => export,
            Err(e) => {
                eprintln!("{name} {sub}: {e:#}");
                return ExitCode::from(2);
            }
        };
        let result = match builtin {
            Builtin::Worker(args) => worker::run(args, registry, &sinks, schedules),
            Builtin::Schedule(command) => admin::schedule(command, &registry, &schedules),
            Builtin::Enqueue(args) => admin::enqueue(args, &registry),
            Builtin::Status(args) => admin::status(args),
            Builtin::Kinds(args) => admin::kinds(args, &registry),
            Builtin::Jobs(args) => admin::jobs(args),
            Builtin::Job(args) => admin::job(args),
            Builtin::Clear(args) => admin::clear(args),
            Builtin::Dead(command) => admin::dead(command),
            Builtin::Relay(args) => relay::run(args, &sinks),
            Builtin::Outbox(command) => relay::outbox(command, &sinks),
            Builtin::Migrate(args) => sinks::migrate(args, &sinks),
            #[cfg(feature = "ui")]
            Builtin::Ui(args) => ui::run(args, registry),
            #[cfg(feature = "ui")]
            Builtin::Api(args) => api::run(args, registry),
            Builtin::Limit(args) => admin::limit(args),
            Builtin::Cap(args) => admin::cap(args, &registry),
            Builtin::Group(args) => admin::group(args),
            Builtin::Forget(args) => admin::forget(args),
            Builtin::Sinks(command) => sinks::sinks(command),
            Builtin::Partitions(args) => admin::partitions(args),
            Builtin::Upgrade(command) => upgrade::upgrade(command, &sinks),
            Builtin::Cancel(args) => admin::cancel(args),
            Builtin::Flow(command) => flow::flow(command),
            Builtin::Waitpoint(command) => admin::waitpoint(command),
            Builtin::Run(command) => admin::run(command, &sinks),
            Builtin::Pause(args) => admin::set_paused(args, true),
            Builtin::Resume(args) => admin::set_paused(args, false),
        };
        match result {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                if json {
                    // One more JSON line for the log shipper, not a stray text line.
                    tracing::error!(command = sub, "{name} {sub}: {e:#}");
                } else {
                    eprintln!("{name} {sub}: {e:#}");
                }
                ExitCode::from(2)
            }
        }
    }
}

/// Logs to stderr at `default` level unless `RUST_LOG` says otherwise; `json` writes one JSON
/// object per line (for log shippers), with the fields of the spans it is in (an attempt's
/// `trace_id`, `span_id`, job and fence). With the `otel` feature, spans also go out over OTLP
/// when `otlp` or the standard variables ask for it ([`palisade::otel::Export::from_env`]), at
/// info and above whatever `RUST_LOG` says of the log. A second call (tests) keeps the first
/// subscriber.
fn init_logging(default: &str, json: bool, otlp: Option<&str>) -> anyhow::Result<Option<Export>> {
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    use tracing_subscriber::{EnvFilter, Layer as _};
    // tokio-postgres logs server NOTICEs ("schema already exists, skipping") at info;
    // redis-rs warns once per node for every failed cluster connection, which our own error
    // already reports with its cause (one line instead of one per node).
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        EnvFilter::new(format!(
            "{default},tokio_postgres=warn,redis::cluster_handling=error"
        ))
    });
    // Every line an attempt logs carries the attempt's span (its job, fence and trace id),
    // whatever level the log is at, unless RUST_LOG says otherwise of that span. A span
    // prints nothing of its own.
    let filter = match std::env::var("RUST_LOG") {
        Ok(asked) if asked.contains("palisade::job") => filter,
        _ => filter.add_directive("palisade::job=info".parse().expect("a valid directive")),
    };
    use std::io::IsTerminal as _;
    let fmt = tracing_subscriber::fmt::layer()
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let fmt = if json {
        fmt.json().boxed()
    } else {
        // One short line per event: its own fields, not every field of the spans around it
        // (an attempt's span holds a dozen trace attributes; JSON lines keep them all).
        fmt.event_format(ShortLine).boxed()
    };
    let export = export(otlp)?;
    #[cfg(feature = "otel")]
    let otel = export.as_ref().map(|e| e.layer());
    #[cfg(not(feature = "otel"))]
    let otel: Option<tracing_subscriber::layer::Identity> = None;
    let _ = tracing_subscriber::registry()
        .with(fmt.with_filter(filter))
        .with(otel)
        .try_init();
    Ok(export)
}

/// The text log's line: time, level, target, the message and the event's own fields.
struct ShortLine;

impl<S, N> tracing_subscriber::fmt::FormatEvent<S, N> for ShortLine
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    N: for<'a> tracing_subscriber::fmt::FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &tracing_subscriber::fmt::FmtContext<'_, S, N>,
        mut writer: tracing_subscriber::fmt::format::Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        use tracing_log::NormalizeEvent as _;
        use tracing_subscriber::fmt::time::FormatTime as _;
        tracing_subscriber::fmt::time::SystemTime.format_time(&mut writer)?;
        // (A `log` record's own target and level, not the bridge's.)
        let normalized = event.normalized_metadata();
        let meta = normalized.as_ref().unwrap_or_else(|| event.metadata());
        write!(writer, " {:>5} {}: ", meta.level(), meta.target())?;
        ctx.field_format().format_fields(writer.by_ref(), event)?;
        writeln!(writer)
    }
}

#[cfg(feature = "otel")]
type Export = palisade::otel::Export;
/// Without the `otel` feature nothing is exported.
#[cfg(not(feature = "otel"))]
type Export = std::convert::Infallible;

/// The exporter `--otlp-endpoint` and the `OTEL_*` variables ask for.
#[cfg(feature = "otel")]
fn export(otlp: Option<&str>) -> anyhow::Result<Option<Export>> {
    Ok(palisade::otel::Export::from_env(otlp)?)
}

/// Without the `otel` feature: a refusal for `--otlp-endpoint`, a warning for the variables
/// (a binary that silently exported nothing would leave its operator guessing).
#[cfg(not(feature = "otel"))]
fn export(otlp: Option<&str>) -> anyhow::Result<Option<Export>> {
    if otlp.is_some() {
        anyhow::bail!(
            "--otlp-endpoint: this binary was built without palisade-cli's `otel` feature \
             (add features = [\"otel\"] to its palisade-cli dependency)"
        );
    }
    for var in [
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    ] {
        if std::env::var_os(var).is_some_and(|v| !v.is_empty()) {
            eprintln!(
                "warning: {var} is set, but this binary was built without palisade-cli's \
                 `otel` feature: no traces are exported"
            );
        }
    }
    Ok(None)
}

/// Where the coordinator lives: flags every subcommand shares.
#[derive(Clone, Debug, clap::Args)]
struct RedisArgs {
    /// Redis URL: redis://[user:password@]host[:port][/db], or rediss:// for TLS; behind
    /// Sentinel, redis+sentinel://[user:password@]host[:port],host[:port].../master-name[/db]
    /// (rediss+sentinel:// for TLS). The password never appears in logs or output.
    #[arg(
        long,
        env = "PALISADE_REDIS_URL",
        hide_env_values = true,
        value_name = "URL"
    )]
    redis: String,
    /// Key prefix of this Palisade installation (several can share one Redis). Every process
    /// of one installation — workers and producers — must use the same prefix.
    #[arg(long, env = "PALISADE_PREFIX", default_value = "palisade")]
    prefix: String,
    /// PEM certificate authority every TLS link trusts: rediss:// URLs (coordinator, sinks,
    /// cluster nodes, sentinels) and Postgres URLs with sslmode=verify-ca|verify-full and no
    /// sslrootcert of their own (default: the system's roots for Redis, Mozilla's for
    /// Postgres). Also --redis-ca-file and PALISADE_REDIS_CA_FILE, its former names.
    #[arg(
        long,
        alias = "redis-ca-file",
        env = "PALISADE_CA_FILE",
        value_name = "PATH"
    )]
    ca_file: Option<PathBuf>,
    /// Every Redis URL (coordinator and sinks) names nodes of a Redis Cluster: one node, or
    /// several separated by commas; the rest of the cluster is learned from them.
    #[arg(long, env = "PALISADE_REDIS_CLUSTER", value_parser = clap::builder::BoolishValueParser::new())]
    redis_cluster: bool,
    /// Partitions of the coordinator (1..=256), each with its own hash tag, epoch and token
    /// counter, so a Redis Cluster spreads the coordinator's work over its masters. Every
    /// process of one installation must use the same number; changing it is a migration
    /// (docs/redis.md, "Partitions").
    #[arg(long, env = "PALISADE_PARTITIONS", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=256))]
    partitions: u16,
}

impl RedisArgs {
    /// `--ca-file`, or the variable of its former name.
    pub(crate) fn ca_file(&self) -> Option<PathBuf> {
        ca_file_or_env(self.ca_file.clone())
    }

    fn pool(&self, url: &str) -> anyhow::Result<Target> {
        if url == self.redis {
            redis_url(url, self.redis_cluster).map_err(|e| anyhow::anyhow!("--redis: {e}"))?;
        }
        // The one CA serves the TLS links; a plain link beside them (a redis:// sink next to
        // a TLS Postgres) just does not use it.
        let ca = self.ca_file().filter(|_| url.starts_with("rediss"));
        let ca = ca.as_deref();
        if url.starts_with("redis+sentinel://") || url.starts_with("rediss+sentinel://") {
            if self.redis_cluster {
                anyhow::bail!(
                    "--redis-cluster: {} names sentinels, not cluster nodes",
                    redacted(url)
                );
            }
            return Ok(sentinel(url, ca)?.into());
        }
        if self.redis_cluster {
            let nodes: Vec<&str> = url.split(',').map(str::trim).collect();
            return Ok(cluster_with_ca(&nodes, ca)?.into());
        }
        Ok(pool_with_ca(url, ca)?.into())
    }

    /// A pool for `url` that has answered a PING (waiting up to [`STARTUP_PATIENCE`] for a
    /// server that is there but not ready: loading its data, say).
    async fn reachable(&self, url: &str, what: &str) -> anyhow::Result<Target> {
        let pool = self.pool(url)?;
        palisade::store::redis::ping_until_ready(pool.clone(), STARTUP_PATIENCE)
            .await
            .with_context(|| format!("cannot reach {what} at {}", redacted(url)))?;
        Ok(pool)
    }

    async fn store(&self) -> anyhow::Result<(Target, Stores)> {
        self.store_with(palisade::DEFAULT_MAX_PAYLOAD_BYTES, |s| s)
            .await
    }

    /// The coordinator (in `--partitions` partitions), each partition set up by `configure`.
    async fn store_with(
        &self,
        max_payload_bytes: usize,
        configure: impl Fn(RedisLeaseStore) -> RedisLeaseStore,
    ) -> anyhow::Result<(Target, Stores)> {
        // Names first: a bad prefix is refused without waiting on a connection.
        palisade::cli_support::check_prefix(&self.prefix)?;
        let target = self.reachable(&self.redis, "Redis").await?;
        let generation = palisade::store::redis::check_layout(
            target.clone(),
            &self.prefix,
            usize::from(self.partitions),
        )
        .await?;
        let store = palisade::store::redis::coordinator(
            target.clone(),
            &self.prefix,
            usize::from(self.partitions),
            generation,
            max_payload_bytes,
            configure,
        )?;
        Ok((target, store))
    }
}

/// How long a command waits at start for a Redis or Postgres that is there but not ready
/// (loading its data, starting up, a link dropping its first connections); a refused
/// connection or a wrong setting fails at once.
pub(crate) const STARTUP_PATIENCE: Duration = Duration::from_secs(60);

/// A journal time (ms since the Unix epoch) in UTC, to the second; the raw number if it is
/// not a date RFC 3339 can write (the journal is data anyone with Redis access can write).
pub(crate) fn when(at_ms: u64) -> String {
    const YEAR_10000_MS: u64 = 253_402_300_800_000;
    if at_ms >= YEAR_10000_MS {
        return format!("{at_ms} ms");
    }
    humantime::format_rfc3339_seconds(
        std::time::UNIX_EPOCH + std::time::Duration::from_millis(at_ms),
    )
    .to_string()
}

/// Resolves at the first SIGTERM or SIGINT: when a long-running subcommand stops.
async fn shutdown_signal() {
    Signals::listen().recv().await
}

/// SIGTERM and SIGINT, listened for from the moment this is made: a signal that arrives while
/// a process is still starting is heard (the worker and the relay then stop before they claim
/// anything) instead of killing it by the default action.
pub(crate) struct Signals {
    term: Option<tokio::signal::unix::Signal>,
    interrupt: Option<tokio::signal::unix::Signal>,
}

impl Signals {
    /// Installs the handlers now (inside a tokio runtime).
    pub(crate) fn listen() -> Self {
        use tokio::signal::unix::{signal, SignalKind};
        let install = |kind: SignalKind, what: &str| {
            signal(kind)
                .inspect_err(|e| tracing::warn!(error = %e, "no {what} handler: {what} stops this process at once"))
                .ok()
        };
        Self {
            term: install(SignalKind::terminate(), "SIGTERM"),
            interrupt: install(SignalKind::interrupt(), "SIGINT"),
        }
    }

    /// The next SIGTERM or SIGINT (forever, when neither handler could be installed).
    pub(crate) async fn recv(&mut self) {
        async fn next(signal: &mut Option<tokio::signal::unix::Signal>) {
            match signal {
                Some(signal) => {
                    signal.recv().await;
                }
                None => std::future::pending().await,
            }
        }
        tokio::select! {
            () = next(&mut self.term) => {}
            () = next(&mut self.interrupt) => {}
        }
    }
}

/// `--ca-file` as given, else the variable of its former name; an empty value is none.
pub(crate) fn ca_file_or_env(flag: Option<PathBuf>) -> Option<PathBuf> {
    flag.or_else(|| std::env::var_os("PALISADE_REDIS_CA_FILE").map(PathBuf::from))
        .filter(|path| !path.as_os_str().is_empty())
}

/// A `--redis` value: a Redis URL (or, with `cluster`, comma-separated ones), refused with one
/// line otherwise — before a sink that defaults to it would take the blame. (Not a clap value
/// parser: clap quotes a refused value whole, password and all.)
pub(crate) fn redis_url(text: &str, cluster: bool) -> Result<String, String> {
    const SCHEMES: [&str; 6] = [
        "redis://",
        "rediss://",
        "redis+unix://",
        "unix://",
        "redis+sentinel://",
        "rediss+sentinel://",
    ];
    let is_redis = |url: &str| SCHEMES.iter().any(|s| url.trim().starts_with(s));
    let sentinel = text.starts_with("redis+sentinel://") || text.starts_with("rediss+sentinel://");
    // A comma splits nodes only on a cluster: elsewhere it may be part of a password.
    let nodes = match cluster {
        true => text.split(',').all(is_redis),
        false => is_redis(text),
    };
    if sentinel || (!text.is_empty() && nodes) {
        return Ok(text.to_owned());
    }
    Err(format!(
        "{} is not a Redis URL (redis://, rediss://, redis+unix://, redis+sentinel://; a cluster's \
         nodes separated by commas)",
        redacted(text)
    ))
}

/// One day, and one year: the longest a lease, drain or outbox lease (a day) and a delay,
/// unique key or grace period (a year) may sensibly be. Longer is a typo (`--lease 1000y`
/// was accepted, and its expiry printed as 31557599998.5 s).
pub(crate) const DAY: Duration = Duration::from_secs(24 * 3600);
pub(crate) const YEAR: Duration = Duration::from_secs(365 * 24 * 3600);

/// A value parser for a duration flag (humantime: `300ms`, `30s`, `2h`) between `min` and
/// `max`, refusing others with one line that gives the bounds.
pub(crate) fn duration_within(
    min: Duration,
    max: Duration,
) -> impl Fn(&str) -> Result<Duration, String> + Clone + Send + Sync + 'static {
    move |text| {
        let d =
            humantime::parse_duration(text).map_err(|e| format!("{e} (e.g. 300ms, 30s, 2h)"))?;
        if d < min || d > max {
            return Err(format!(
                "{} is outside {}..={}",
                humantime::format_duration(d),
                humantime::format_duration(min),
                humantime::format_duration(max)
            ));
        }
        Ok(d)
    }
}

/// A current-thread runtime for the short admin commands.
fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}

/// Each kind that is capped or running: its fleet-wide cap and how many of `leases` run it
/// (`status` and the console's Queues page).
pub(crate) fn kind_load(
    caps: Vec<(String, u32)>,
    leases: &[palisade::store::LeaseInfo],
) -> std::collections::BTreeMap<String, (Option<u32>, usize)> {
    let mut kinds = std::collections::BTreeMap::<String, (Option<u32>, usize)>::new();
    for (kind, cap) in caps {
        kinds.entry(kind).or_default().0 = Some(cap);
    }
    for lease in leases.iter().filter(|l| !l.kind.is_empty()) {
        kinds.entry(lease.kind.clone()).or_default().1 += 1;
    }
    kinds
}

/// Prints one line each to stdout; a closed pipe ends the output quietly, like any Unix tool.
pub(crate) fn print_lines(lines: impl Iterator<Item = String>) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    for line in lines {
        match writeln!(out, "{line}") {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(()),
            other => other?,
        }
    }
    match out.flush() {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => Ok(other?),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn app() -> App {
        App::new(Registry::new().register("k", |_: palisade::JobContext, _: ()| async { Ok(()) }))
            .sink("ledger")
    }

    /// Found by the attack review of issue 21: a user's argument named like an installation
    /// flag made clap panic (debug) or read the wrong installation (release).
    #[test]
    fn a_users_argument_that_clashes_with_an_installation_flag_is_refused() {
        for arg in [
            clap::Arg::new("prefix"),
            clap::Arg::new("url").long("redis"),
            clap::Arg::new("where").long("sink"),
            clap::Arg::new("sinks"),
        ] {
            let command = clap::Command::new("mine").arg(arg);
            let ran = std::rc::Rc::new(std::cell::Cell::new(false));
            let flag = ran.clone();
            let code = app()
                .subcommand_with(command, move |_, _| {
                    flag.set(true);
                    ExitCode::SUCCESS
                })
                .run_from(["bin", "mine", "x"]);
            assert_eq!(code, ExitCode::from(2));
            assert!(!ran.get(), "the command ran on a clashing argument");
        }
    }

    #[test]
    fn a_users_command_gets_the_installation_the_flags_name() {
        let seen = std::rc::Rc::new(std::cell::RefCell::new(None));
        let out = seen.clone();
        let command = clap::Command::new("mine").arg(clap::Arg::new("what").required(true));
        let code = app()
            .subcommand_with(command, move |installation, args| {
                *out.borrow_mut() = Some((
                    installation.prefix().to_owned(),
                    installation.sink_urls().to_vec(),
                    args.get_one::<String>("what").cloned(),
                ));
                ExitCode::SUCCESS
            })
            .run_from([
                "bin",
                "mine",
                "--redis",
                "redis://coordinator",
                "--prefix",
                "shop",
                "--sink",
                "ledger=redis://ledger",
                "thing",
            ]);
        assert_eq!(code, ExitCode::SUCCESS);
        assert_eq!(
            seen.borrow().clone(),
            Some((
                "shop".to_owned(),
                vec![("ledger".to_owned(), "redis://ledger".to_owned())],
                Some("thing".to_owned())
            ))
        );
        // A sink the binary does not declare is refused before the command runs.
        let code = app()
            .subcommand_with(clap::Command::new("mine"), |_, _| ExitCode::SUCCESS)
            .run_from([
                "bin",
                "mine",
                "--redis",
                "redis://c",
                "--sink",
                "nope=redis://x",
            ]);
        assert_eq!(code, ExitCode::from(2));
    }
}
