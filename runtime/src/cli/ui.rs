//! `ui`: the operator page — queues and their depth, live leases, recent fence rejections and
//! dead jobs with their reasons, with buttons to retry or purge a queue's dead jobs.
//!
//! Server-side rendered (maud), no script: what the page shows is one [`Snapshot`] of the
//! coordinator, read when the page is requested, and [`render`] is a pure function of it.
//! Buttons are POST forms carrying a per-process CSRF token, so another site cannot make an
//! operator's browser press them (with basic auth the browser would send the credentials).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::{bail, Context as _};
use axum::extract::{Path, Query, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Form, Router};
use base64::Engine as _;
use maud::{html, Markup, DOCTYPE};
use serde::Deserialize;
use subtle::ConstantTimeEq as _;

use super::{redacted, when, RedisArgs};
use crate::job::{DeadJob, QueueCounts};
use crate::store::{
    Inspect, LeaseInfo, QueueAdmin, RecordStore, RejectionNote, Stores, MAX_DEAD_RETENTION,
};

/// `ui` flags.
#[derive(Clone, Debug, clap::Args)]
pub(super) struct UiArgs {
    #[command(flatten)]
    redis: RedisArgs,
    /// Address to serve the page on. Anything but a loopback address requires --basic-auth.
    #[arg(long, default_value = "127.0.0.1:8080", value_name = "ADDR")]
    listen: SocketAddr,
    /// `user:password` the page asks for (HTTP basic auth; use TLS in front of it off the
    /// host).
    #[arg(
        long,
        env = "PALISADE_UI_AUTH",
        hide_env_values = true,
        value_name = "USER:PASSWORD"
    )]
    basic_auth: Option<String>,
    /// Rows shown per table (live leases, rejections, dead jobs per queue).
    #[arg(long, default_value_t = 50)]
    rows: usize,
    /// A host name (with port, as browsers send it: `ops.example:8080`) the page may be
    /// reached by besides the listen address and localhost; repeatable. Requests naming any
    /// other host are refused (DNS rebinding).
    #[arg(long = "public-host", value_name = "HOST:PORT")]
    public_hosts: Vec<String>,
}

/// Everything the page shows, read from the coordinator at one request.
#[derive(Debug, Default)]
pub(crate) struct Snapshot {
    /// Where it was read from (password redacted) and under which prefix.
    pub source: String,
    /// Queues with their counts and how long the next ready job has waited.
    pub queues: Vec<(String, QueueCounts, Option<Duration>)>,
    /// Paused queues.
    pub paused: Vec<String>,
    /// Live leases, soonest to expire first, with their jobs' latest progress.
    pub leases: Vec<(LeaseInfo, Option<String>)>,
    /// Recent fence rejections, newest first.
    pub rejections: Vec<RejectionNote>,
    /// Dead jobs by queue, oldest first.
    pub dead: Vec<(String, Vec<DeadJob>)>,
}

/// Reads a [`Snapshot`].
async fn snapshot(store: &Stores, source: &str, rows: usize) -> crate::Result<Snapshot> {
    let mut snap = Snapshot {
        source: source.to_owned(),
        ..Snapshot::default()
    };
    for queue in store.queues().await? {
        let counts = store.counts(&queue).await?;
        let oldest = store.oldest_ready(&queue).await?;
        if counts.dead > 0 {
            snap.dead
                .push((queue.clone(), store.dead(&queue, rows).await?));
        }
        snap.queues.push((queue, counts, oldest));
    }
    snap.paused = store.paused().await?;
    for lease in store.leases(rows).await? {
        let progress = store.progress(lease.job).await?;
        snap.leases.push((lease, progress));
    }
    snap.rejections = store.rejections(rows).await?;
    Ok(snap)
}

/// A duration as an operator reads it: `850ms`, `12.3s`, `4m 10s`, `2h 5m`.
fn age(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0 => format!("{}ms", d.as_millis()),
        1..=59 => format!("{:.1}s", d.as_secs_f64()),
        60..=3599 => format!("{}m {}s", s / 60, s % 60),
        _ => format!("{}h {}m", s / 3600, s % 3600 / 60),
    }
}

/// At most `max` characters of `text`, marked when cut.
fn clip(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &text[..i]),
        None => text.to_owned(),
    }
}

const STYLE: &str = "body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}\
h1{font-size:1.3em}h2{font-size:1.1em;margin-top:1.6em}\
table{border-collapse:collapse;margin:.4em 0}td,th{border:1px solid #ccc;padding:.25em .6em;\
text-align:left;vertical-align:top}td.n{text-align:right;font-variant-numeric:tabular-nums}\
th{background:#f3f3f3}.msg{background:#e8f4e8;padding:.5em;border:1px solid #9c9}\
.empty{color:#777}form{display:inline}button{margin-right:.4em}code{font-size:.95em}";

/// The page for `snap`; `csrf` goes into every form, `msg` is the last action's outcome.
pub(crate) fn render(snap: &Snapshot, csrf: &str, msg: Option<&str>) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                title { "Palisade" }
                style { (STYLE) }
            }
            body {
                h1 { "Palisade" }
                p { "Coordinator " code { (snap.source) } ", read at "
                    (humantime::format_rfc3339_seconds(SystemTime::now())) ". Reload for fresh numbers." }
                @if let Some(msg) = msg { p.msg #msg { (msg) } }

                h2 { "Queues" }
                @if snap.queues.is_empty() { p.empty { "No queue has had a job yet." } }
                @else {
                    table #queues {
                        tr { th { "queue" } th { "ready" } th { "waiting" } th { "delayed" }
                             th { "leased" } th { "dead" } th { "completed" } th { "next ready job waiting" } }
                        @for (queue, c, oldest) in &snap.queues {
                            tr data-queue=(queue) {
                                td { (queue) @if snap.paused.contains(queue) { " " em.paused { "(paused)" } } }
                                td.n data-state="ready" { (c.ready) }
                                td.n data-state="waiting" { (c.waiting) }
                                td.n data-state="delayed" { (c.delayed) }
                                td.n data-state="leased" { (c.leased) }
                                td.n data-state="dead" { (c.dead) }
                                td.n data-state="completed" { (c.completed) }
                                td.n { (oldest.map(age).unwrap_or_else(|| "-".into())) }
                            }
                        }
                    }
                }

                h2 { "Live leases" }
                @if snap.leases.is_empty() { p.empty { "No job is running." } }
                @else {
                    table #leases {
                        tr { th { "job" } th { "scope" } th { "token (epoch:counter)" } th { "age" }
                             th { "expires in" } th { "worker" } th { "progress" } }
                        @for (l, progress) in &snap.leases {
                            tr {
                                td { code { (l.job) } }
                                td { (l.scope) }
                                td.n { (l.token.epoch()) ":" (l.token.counter()) }
                                td.n { (age(l.age)) }
                                td.n { (age(l.expires_in)) }
                                td { (l.worker) }
                                td { code { (progress.as_deref().map(|p| clip(p, 120)).unwrap_or_default()) } }
                            }
                        }
                    }
                }

                h2 { "Recent fence rejections" }
                p { "Writes a fenced sink refused: a stale holder (its lease had expired and a newer \
                     one wrote), a token granted twice, or a mutation that did not fit. Newest first." }
                @if snap.rejections.is_empty() { p.empty { "None recorded." } }
                @else {
                    table #rejections {
                        tr { th { "when (UTC)" } th { "sink" } th { "scope" } th { "token" }
                             th { "reason" } th { "detail" } }
                        @for r in &snap.rejections {
                            tr {
                                td { (when(r.at_ms)) }
                                td { (r.sink) }
                                td { (r.scope) }
                                td.n { (r.token >> 40) ":" (r.token & ((1 << 40) - 1)) }
                                td { (r.reason) }
                                td { (r.detail) }
                            }
                        }
                    }
                }

                h2 { "Dead jobs" }
                @if snap.dead.is_empty() { p.empty { "No dead jobs." } }
                @for (queue, jobs) in &snap.dead {
                    h3 { "Queue " (queue) }
                    form method="post" action="/dead/retry" {
                        input type="hidden" name="csrf" value=(csrf);
                        input type="hidden" name="queue" value=(queue);
                        button #{"retry-" (queue)} type="submit" { "Retry all dead jobs of " (queue) }
                    }
                    form method="post" action="/dead/purge" {
                        input type="hidden" name="csrf" value=(csrf);
                        input type="hidden" name="queue" value=(queue);
                        button #{"purge-" (queue)} type="submit" { "Purge all dead jobs of " (queue) }
                    }
                    table.dead data-queue=(queue) {
                        tr { th { "job" } th { "kind" } th { "attempt" } th { "reason" } th { "payload" } }
                        @for d in jobs {
                            tr {
                                td { code { (d.job.id) } }
                                td { (d.job.kind) }
                                td.n { (d.job.attempt) }
                                td.reason { (d.reason) }
                                td { code { (clip(&d.job.payload, 200)) } }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The server's state.
struct Ui {
    store: Stores,
    source: String,
    rows: usize,
    /// Random per process: a form from an earlier run (or another site) is refused.
    csrf: String,
    /// `Basic <base64(user:password)>`, when the page asks for it.
    authorization: Option<String>,
    /// Host header values accepted (lower case).
    hosts: Vec<String>,
    /// Outcomes of recent actions, shown once after the redirect: the page shows only text
    /// it wrote itself, never text from the URL.
    flash: std::sync::Mutex<std::collections::VecDeque<(String, String)>>,
}

impl Ui {
    /// Keeps `msg` for the redirect and returns its id.
    fn flash(&self, msg: String) -> String {
        let id = uuid::Uuid::new_v4().simple().to_string();
        let mut flash = self.flash.lock().unwrap_or_else(|p| p.into_inner());
        flash.push_back((id.clone(), msg));
        while flash.len() > 64 {
            flash.pop_front();
        }
        id
    }

    fn take_flash(&self, id: &str) -> Option<String> {
        let mut flash = self.flash.lock().unwrap_or_else(|p| p.into_inner());
        let i = flash.iter().position(|(k, _)| k == id)?;
        flash.remove(i).map(|(_, msg)| msg)
    }
}

#[derive(Deserialize)]
struct PageQuery {
    flash: Option<String>,
}

#[derive(Deserialize)]
struct DeadForm {
    csrf: String,
    queue: String,
}

async fn page(State(ui): State<Arc<Ui>>, Query(q): Query<PageQuery>) -> Response {
    match snapshot(&ui.store, &ui.source, ui.rows).await {
        Ok(snap) => {
            let msg = q.flash.as_deref().and_then(|id| ui.take_flash(id));
            render(&snap, &ui.csrf, msg.as_deref()).into_response()
        }
        Err(e) => {
            tracing::warn!(error = %e, "ui: reading the coordinator failed");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                format!("cannot read the coordinator: {e}\n"),
            )
                .into_response()
        }
    }
}

/// Checks the form's CSRF token, and that a browser that names the form's origin names this
/// host.
fn checked(ui: &Ui, headers: &HeaderMap, form: &DeadForm) -> bool {
    let token_ok: bool = form.csrf.as_bytes().ct_eq(ui.csrf.as_bytes()).into();
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    let origin_ok = match headers.get(header::ORIGIN).and_then(|o| o.to_str().ok()) {
        None | Some("null") => true,
        Some(origin) => host.is_some_and(|h| origin.split("://").nth(1) == Some(h)),
    };
    token_ok && origin_ok
}

fn refused() -> Response {
    (
        StatusCode::FORBIDDEN,
        "refused: stale or foreign form; reload the page\n",
    )
        .into_response()
}

/// `POST /dead/retry` and `/dead/purge`: every dead job of the form's queue.
async fn dead_jobs(
    State(ui): State<Arc<Ui>>,
    Path(action): Path<String>,
    headers: HeaderMap,
    Form(form): Form<DeadForm>,
) -> Response {
    if !checked(&ui, &headers, &form) {
        return refused();
    }
    let (outcome, done) = match action.as_str() {
        "retry" => (
            ui.store.retry_dead(&form.queue, MAX_DEAD_RETENTION).await,
            "Retried",
        ),
        "purge" => (
            ui.store.purge_dead(&form.queue, MAX_DEAD_RETENTION).await,
            "Purged",
        ),
        _ => return StatusCode::NOT_FOUND.into_response(),
    };
    let msg = match outcome {
        Ok(n) => {
            tracing::info!(queue = %form.queue, n, action = done, "ui: dead jobs");
            format!("{done} {n} dead job(s) of queue {}.", form.queue)
        }
        Err(e) => format!("{done} nothing: {e}"),
    };
    // POST-redirect-GET: a reload does not repeat the action.
    Redirect::to(&format!("/?flash={}", ui.flash(msg))).into_response()
}

/// Every response: refuses a Host this page is not served as (a DNS-rebinding page would
/// otherwise be same-origin with it), and forbids framing (clickjacking) and caching.
async fn guard(State(ui): State<Arc<Ui>>, request: Request, next: Next) -> Response {
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .map(str::to_ascii_lowercase);
    if !host.is_some_and(|h| ui.hosts.contains(&h)) {
        return (
            StatusCode::MISDIRECTED_REQUEST,
            "unknown host; add it with --public-host\n",
        )
            .into_response();
    }
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    headers.insert(header::X_FRAME_OPTIONS, "DENY".parse().expect("static"));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        "frame-ancestors 'none'; script-src 'none'"
            .parse()
            .expect("static"),
    );
    headers.insert(header::CACHE_CONTROL, "no-store".parse().expect("static"));
    response
}

/// The Host header values the page answers to: the listen address, localhost on its port,
/// and the operator's `--public-host` names.
fn allowed_hosts(listen: SocketAddr, public: &[String]) -> Vec<String> {
    let port = listen.port();
    let mut hosts = vec![
        listen.to_string(),
        format!("localhost:{port}"),
        format!("127.0.0.1:{port}"),
        format!("[::1]:{port}"),
    ];
    if port == 80 {
        // Browsers leave the default port out.
        hosts.extend([
            listen.ip().to_string(),
            "localhost".into(),
            "127.0.0.1".into(),
        ]);
    }
    hosts.extend(public.iter().map(|h| h.to_ascii_lowercase()));
    hosts
}

/// Asks for basic auth when it is configured.
async fn authorize(State(ui): State<Arc<Ui>>, request: Request, next: Next) -> Response {
    if let Some(expected) = &ui.authorization {
        let given = request
            .headers()
            .get(header::AUTHORIZATION)
            .map(|h| h.as_bytes())
            .unwrap_or_default();
        if !bool::from(given.ct_eq(expected.as_bytes())) {
            return (
                StatusCode::UNAUTHORIZED,
                [(header::WWW_AUTHENTICATE, "Basic realm=\"palisade\"")],
                "authorization required\n",
            )
                .into_response();
        }
    }
    next.run(request).await
}

/// The page's routes over `store`.
fn router(ui: Arc<Ui>) -> Router {
    Router::new()
        .route("/", get(page))
        .route("/dead/{action}", post(dead_jobs))
        .route_layer(axum::middleware::from_fn_with_state(ui.clone(), authorize))
        .route("/healthz", get(|| async { "ok\n" }))
        .layer(axum::middleware::from_fn_with_state(ui.clone(), guard))
        .with_state(ui)
}

/// The `Authorization` header value `user:password` asks for; checks the flag's form.
fn basic_authorization(user_password: &str) -> anyhow::Result<String> {
    match user_password.split_once(':') {
        Some((user, password)) if !user.is_empty() && !password.is_empty() => Ok(format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(user_password)
        )),
        _ => bail!("--basic-auth wants user:password, both non-empty"),
    }
}

/// Serves the page until SIGINT / SIGTERM.
pub(super) fn run(args: UiArgs) -> anyhow::Result<()> {
    let authorization = args
        .basic_auth
        .as_deref()
        .map(basic_authorization)
        .transpose()?;
    if !args.listen.ip().is_loopback() && authorization.is_none() {
        bail!(
            "--listen {}: serving beyond this host needs --basic-auth (the page can retry and \
             purge jobs)",
            args.listen
        );
    }
    super::runtime()?.block_on(async {
        let (_, store) = args.redis.store().await?;
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .with_context(|| format!("binding {} (choose another with --listen)", args.listen))?;
        let bound = listener.local_addr()?;
        let ui = Arc::new(Ui {
            store,
            source: format!(
                "{} prefix {}",
                redacted(&args.redis.redis),
                args.redis.prefix
            ),
            rows: args.rows.max(1),
            csrf: uuid::Uuid::new_v4().simple().to_string(),
            authorization,
            hosts: allowed_hosts(bound, &args.public_hosts),
            flash: Default::default(),
        });
        println!("palisade ui: http://{bound}/");
        tracing::info!(listen = %args.listen, "operator page serving");
        axum::serve(listener, router(ui))
            .with_graceful_shutdown(super::shutdown_signal())
            .await
            .context("serving the page")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_escapes_what_users_wrote() {
        let mut snap = Snapshot::default();
        snap.rejections.push(RejectionNote {
            at_ms: 0,
            sink: "<b>ledger".into(),
            scope: "a\"b".into(),
            token: (3 << 40) | 7,
            reason: "stale_token".into(),
            detail: "<script>alert(1)</script>".into(),
        });
        let page = render(&snap, "tok", Some("<i>done</i>")).into_string();
        assert!(!page.contains("<script>alert"), "{page}");
        assert!(!page.contains("<b>ledger") && !page.contains("<i>done"));
        assert!(page.contains("&lt;script&gt;") && page.contains("3:7"));
    }

    #[test]
    fn a_journal_time_past_year_9999_is_shown_raw() {
        assert_eq!(when(0), "1970-01-01T00:00:00Z");
        assert_eq!(when(u64::MAX), format!("{} ms", u64::MAX));
        assert_eq!(when(253_402_300_800_000), "253402300800000 ms");
        assert_eq!(when(253_402_300_799_000), "9999-12-31T23:59:59Z");
    }

    #[test]
    fn the_page_answers_only_to_its_own_hosts() {
        let hosts = allowed_hosts(
            "127.0.0.1:8080".parse().unwrap(),
            &["Ops.Example:443".into()],
        );
        for ok in [
            "127.0.0.1:8080",
            "localhost:8080",
            "[::1]:8080",
            "ops.example:443",
        ] {
            assert!(hosts.contains(&ok.to_owned()), "{ok}");
        }
        assert!(!hosts.contains(&"evil.example:8080".to_owned()));
    }

    #[test]
    fn durations_and_clipping_read_well() {
        assert_eq!(age(Duration::from_millis(850)), "850ms");
        assert_eq!(age(Duration::from_millis(12_340)), "12.3s");
        assert_eq!(age(Duration::from_secs(250)), "4m 10s");
        assert_eq!(age(Duration::from_secs(7500)), "2h 5m");
        assert_eq!(clip("ééé", 2), "éé…");
        assert_eq!(clip("ab", 2), "ab");
    }

    #[test]
    fn basic_auth_wants_both_parts() {
        assert_eq!(
            basic_authorization("ops:s3cret").unwrap(),
            "Basic b3BzOnMzY3JldA=="
        );
        for bad in ["ops", ":x", "ops:", ""] {
            assert!(basic_authorization(bad).is_err(), "{bad:?}");
        }
    }
}
