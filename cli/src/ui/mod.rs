//! `ui`: the operator console — dashboard, queues (pause, rate limits, caps), busy workers
//! and leases, delayed jobs, dead letters (search, pages, one or all retried or deleted),
//! flows, schedules, fence rejections and a page per job.
//!
//! Server-side rendered (maud, `pages.rs`), no script at all: each page is read from the
//! coordinator when it is requested, and "live" reloads it with a `Refresh` header, so the
//! Content-Security-Policy forbids every script. Buttons are POST forms carrying a
//! per-process CSRF token and checked for their origin, so another site cannot make an
//! operator's browser press them (with basic auth the browser would send the credentials);
//! every action redirects to a page of its own choosing (POST-redirect-GET, no redirect to a
//! place the request names).

mod logins;
mod pages;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context as _};
use axum::extract::{Path, Query, RawQuery, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Form, Router};
use base64::Engine as _;
use maud::Markup;
use serde::Deserialize;
use subtle::ConstantTimeEq as _;

use super::{redacted, RedisArgs};
use crate::reads::{allowed_hosts, dead_counts, newest_dead, queue_rows, Found, DEAD_SCAN};
use pages::Frame;
use palisade::store::{
    ControlStore, FlowStore, Inspect, QueueAdmin, RecordStore, Stores, DEAD_JOB_SEARCH,
};
use palisade::{DeadJob, RateLimit};
use palisade::{FlowId, JobId};

/// Most rows a table shows (`--rows`): a page stays small enough to read and render.
const MAX_ROWS: usize = 1_000;

/// History samples the dashboard draws (six hours of one a minute).
const HISTORY_SHOWN: usize = 360;

/// Live leases read for the busy page and the per-kind running counts.
const LEASE_SCAN: usize = 10_000;

/// Groups the queues page lists per queue (those with the most ready jobs), and groups with
/// limits it lists.
const GROUPS_LISTED: usize = 10;

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
    /// Rows shown per table (live leases, rejections, a page of dead or delayed jobs), at most
    /// 1,000.
    #[arg(long, default_value_t = 50)]
    rows: usize,
    /// A host name (with port, as browsers send it: `ops.example:8080`) the page may be
    /// reached by besides the listen address and localhost; repeatable. Requests naming any
    /// other host are refused (DNS rebinding).
    #[arg(long = "public-host", value_name = "HOST:PORT")]
    public_hosts: Vec<String>,
    /// Where a trace is shown, with `{trace_id}` for its id (`https://tempo.example/trace/{trace_id}`):
    /// each fence rejection links to the trace of the run that wrote.
    #[arg(long, env = "PALISADE_TRACE_URL", value_name = "URL", value_parser = trace_url)]
    trace_url: Option<String>,
    #[command(flatten)]
    api: super::api::ApiFlags,
}

/// A trace link template: http(s), with the `{trace_id}` placeholder.
fn trace_url(s: &str) -> Result<String, String> {
    if !(s.starts_with("https://") || s.starts_with("http://")) || !s.contains("{trace_id}") {
        return Err("an http(s) URL with {trace_id} in it".into());
    }
    Ok(s.to_owned())
}
/// The server's state.
struct Ui {
    store: Stores,
    source: String,
    rows: usize,
    /// `--trace-url`.
    trace_url: Option<String>,
    /// Random per process: a form from an earlier run (or another site) is refused.
    csrf: String,
    /// `Basic <base64(user:password)>`, when the page asks for it.
    authorization: Option<String>,
    /// Host header values accepted (lower case).
    hosts: Vec<String>,
    /// `--body-timeout`: a form's body arrives whole within it.
    body_timeout: std::time::Duration,
    /// Failed logins per client address.
    logins: logins::Logins,
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

    /// The frame of a page at `path` (with its raw query).
    async fn frame(
        &self,
        active: &'static str,
        title: String,
        path: &str,
        query: Option<&str>,
    ) -> palisade::Result<Frame<'_>> {
        let mut live = false;
        let mut msg = None;
        let mut kept = Vec::new();
        for (k, v) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
            match &*k {
                "live" => live = v == "1",
                "flash" => msg = self.take_flash(&v),
                _ => kept.push((k.into_owned(), v.into_owned())),
            }
        }
        let here = if kept.is_empty() {
            path.to_owned()
        } else {
            let query: String = form_urlencoded::Serializer::new(String::new())
                .extend_pairs(kept)
                .finish();
            format!("{path}?{query}")
        };
        Ok(Frame {
            active,
            title,
            source: &self.source,
            trace_url: self.trace_url.as_deref(),
            csrf: &self.csrf,
            msg,
            here,
            live,
            now_ms: u64::try_from(self.store.now_ms().await?).unwrap_or_default(),
        })
    }
}

/// A page, or the error that kept it from being read.
fn respond(page: palisade::Result<Markup>, live: bool) -> Response {
    match page {
        Ok(markup) => {
            let mut response = markup.into_response();
            if live {
                // Reloads the page without a script: the policy forbids every script.
                response
                    .headers_mut()
                    .insert(header::REFRESH, HeaderValue::from_static("5"));
            }
            response
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

/// Whether the raw query asks for live reloading.
fn is_live(query: Option<&str>) -> bool {
    form_urlencoded::parse(query.unwrap_or_default().as_bytes())
        .any(|(k, v)| k == "live" && v == "1")
}

async fn dashboard(State(ui): State<Arc<Ui>>, RawQuery(q): RawQuery) -> Response {
    let page = async {
        let frame = ui.frame("/", "Dashboard".into(), "/", q.as_deref()).await?;
        let (queues, unreadable) = queue_rows(&ui.store).await?;
        let beats = ui.store.workers().await?;
        let unclaimed = queues
            .iter()
            .filter(|q| q.counts.ready + q.counts.waiting > 0)
            .filter(|q| !beats.iter().any(|w| w.queues.contains(&q.name)))
            .map(|q| q.name.clone())
            .collect();
        let d = pages::Dashboard {
            queues,
            unreadable,
            // Processes (each arbiter of one beats on its own).
            workers: {
                let mut processes: Vec<(&str, u32)> =
                    beats.iter().map(|w| (w.host.as_str(), w.pid)).collect();
                processes.sort_unstable();
                processes.dedup();
                processes.len()
            },
            unclaimed,
            leases: ui.store.leases(LEASE_SCAN).await?.len(),
            flows_running: ui.store.running_flows(0).await?.0,
            rejections: ui
                .store
                .rejections(palisade::store::REJECTION_JOURNAL)
                .await?,
            // Six hours of one a minute, oldest first.
            // (A history that cannot be read costs the charts, not the page.)
            history: match ui.store.history(HISTORY_SHOWN).await {
                Ok(mut h) => {
                    h.reverse();
                    h
                }
                Err(e) => {
                    tracing::warn!(error = %e, "ui: reading the history failed");
                    Vec::new()
                }
            },
        };
        Ok(pages::dashboard(&frame, &d))
    };
    respond(page.await, is_live(q.as_deref()))
}

async fn queues(
    State(ui): State<Arc<Ui>>,
    Query(lq): Query<ListQuery>,
    RawQuery(q): RawQuery,
) -> Response {
    let page = async {
        let frame = ui
            .frame("/queues", "Queues".into(), "/queues", q.as_deref())
            .await?;
        let kinds = super::kind_load(
            ui.store.concurrency_caps().await?,
            &ui.store.leases(LEASE_SCAN).await?,
        );
        // A page of queues by name, `rows` a page: its cost is its own queues', however many
        // there are.
        let rows = ui.rows.max(1);
        let page = lq.page.max(1);
        let (queues, unreadable, total) =
            crate::reads::queue_rows_page(&ui.store, (page - 1).saturating_mul(rows), rows).await?;
        let pager = pages::Pager {
            page,
            more: total > page.saturating_mul(rows),
        };
        // Groups: each queue's with the most ready jobs, and those with limits (bounded
        // reads: GROUPS_LISTED each).
        let mut top_groups = Vec::new();
        for q in &queues {
            let top = ui.store.groups(&q.name, GROUPS_LISTED).await?;
            if !top.is_empty() {
                top_groups.push((q.name.clone(), top));
            }
        }
        let mut limited_groups = Vec::new();
        for (group, _) in ui.store.limited_groups(GROUPS_LISTED).await?.into_iter() {
            limited_groups.push(ui.store.group(&group).await?);
        }
        let v = pages::QueuesView {
            queues,
            unreadable,
            kinds,
            top_groups,
            limited_groups,
            pager,
            total,
        };
        Ok(pages::queues(&frame, &v))
    };
    respond(page.await, is_live(q.as_deref()))
}

async fn busy(State(ui): State<Arc<Ui>>, RawQuery(q): RawQuery) -> Response {
    let page = async {
        let frame = ui
            .frame("/busy", "Busy".into(), "/busy", q.as_deref())
            .await?;
        let workers = ui.store.workers().await?;
        let mut leases = Vec::new();
        for lease in ui.store.leases(ui.rows).await? {
            let progress = ui.store.progress(lease.job).await?;
            leases.push((lease, progress));
        }
        Ok(pages::busy(&frame, &workers, &leases))
    };
    respond(page.await, is_live(q.as_deref()))
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct ListQuery {
    queue: Option<String>,
    q: String,
    page: usize,
    retries: Option<String>,
}

impl Ui {
    /// Every readable queue with the count `count` picks (one broken queue is left out, not
    /// the page), and the queue to show: `chosen`, or the first with a non-zero count.
    async fn tabs(
        &self,
        chosen: Option<&str>,
        count: impl Fn(&palisade::QueueCounts) -> u64,
    ) -> palisade::Result<(Vec<(String, u64)>, Option<String>)> {
        let mut queues = Vec::new();
        let names = self.store.queues().await?;
        for (queue, counts) in crate::reads::counts_of(&self.store, names).await {
            match counts {
                Ok(counts) => queues.push((queue, count(&counts))),
                Err(e) if e.leaves_queue_out(&queue, "queues") => {}
                Err(e) => return Err(e),
            }
        }
        let queue = chosen
            .map(str::to_owned)
            .or_else(|| queues.iter().find(|(_, n)| *n > 0).map(|(q, _)| q.clone()));
        Ok((queues, queue))
    }

    /// Page `page` (from 1) of `queue`'s ready or delayed jobs, `rows` a page, as deep as
    /// [`crate::reads::MAX_LIST_OFFSET`] reaches (a page past it shows the last one).
    async fn live_page(
        &self,
        queue: &str,
        ready: bool,
        page: usize,
    ) -> palisade::Result<(Vec<palisade::JobView>, pages::Pager)> {
        let rows = self.rows.max(1);
        let last = crate::reads::MAX_LIST_OFFSET / rows + 1;
        let page = page.clamp(1, last);
        // One more than a page: whether a next page exists.
        let mut jobs =
            crate::reads::live_page(&self.store, queue, ready, (page - 1) * rows, rows + 1).await?;
        let more = jobs.len() > rows && page < last;
        jobs.truncate(rows);
        Ok((jobs, pages::Pager { page, more }))
    }
}

async fn delayed(
    State(ui): State<Arc<Ui>>,
    Query(lq): Query<ListQuery>,
    RawQuery(q): RawQuery,
) -> Response {
    let page = async {
        let frame = ui
            .frame(
                "/delayed",
                "Delayed and retries".into(),
                "/delayed",
                q.as_deref(),
            )
            .await?;
        let (queues, queue) = ui.tabs(lq.queue.as_deref(), |c| c.delayed).await?;
        let retries_only = lq.retries.is_some();
        let (mut jobs, pager) = match &queue {
            // (Retries only: the first of the soonest 20 pages, not paged.)
            Some(queue) if retries_only => (
                ui.store.delayed(queue, ui.rows.saturating_mul(20)).await?,
                pages::Pager {
                    page: 1,
                    more: false,
                },
            ),
            Some(queue) => ui.live_page(queue, false, lq.page).await?,
            None => (
                Vec::new(),
                pages::Pager {
                    page: 1,
                    more: false,
                },
            ),
        };
        if retries_only {
            jobs.retain(|v| v.job.attempt > 0);
            jobs.truncate(ui.rows);
        }
        Ok(pages::delayed(
            &frame,
            &queues,
            queue.as_deref(),
            &jobs,
            retries_only,
            pager,
        ))
    };
    respond(page.await, is_live(q.as_deref()))
}

async fn ready(
    State(ui): State<Arc<Ui>>,
    Query(lq): Query<ListQuery>,
    RawQuery(q): RawQuery,
) -> Response {
    let page = async {
        let frame = ui
            .frame("/ready", "Ready jobs".into(), "/ready", q.as_deref())
            .await?;
        let (queues, queue) = ui.tabs(lq.queue.as_deref(), |c| c.ready).await?;
        let (jobs, pager) = match &queue {
            Some(queue) => ui.live_page(queue, true, lq.page).await?,
            None => (
                Vec::new(),
                pages::Pager {
                    page: 1,
                    more: false,
                },
            ),
        };
        Ok(pages::ready(
            &frame,
            &queues,
            queue.as_deref(),
            &jobs,
            pager,
        ))
    };
    respond(page.await, is_live(q.as_deref()))
}

#[derive(Deserialize)]
struct ClearQuery {
    queue: String,
}

async fn confirm_clear(
    State(ui): State<Arc<Ui>>,
    Query(cq): Query<ClearQuery>,
    RawQuery(q): RawQuery,
) -> Response {
    let page = async {
        let frame = ui
            .frame(
                "/ready",
                "Clear a queue".into(),
                "/clear/confirm",
                q.as_deref(),
            )
            .await?;
        if let Err(e) = palisade::cli_support::check_name("queue", &cq.queue) {
            return Ok(pages::refused(
                &frame,
                &format!("Nothing to clear: {e}"),
                "/ready",
            ));
        }
        let asof = u64::try_from(ui.store.now_ms().await?).unwrap_or(0);
        let counts = ui.store.counts(&cq.queue).await?;
        Ok(pages::confirm_clear(
            &frame,
            &cq.queue,
            counts.ready,
            counts.delayed,
            asof,
        ))
    };
    respond(page.await, false)
}

async fn dead(
    State(ui): State<Arc<Ui>>,
    Query(lq): Query<ListQuery>,
    RawQuery(q): RawQuery,
) -> Response {
    let page = async {
        let frame = ui
            .frame("/dead", "Dead jobs".into(), "/dead", q.as_deref())
            .await?;
        let (queues, unreadable) = dead_counts(&ui.store).await?;
        let rows = ui.rows;
        let mut v = pages::DeadView {
            unreadable,
            queue: lq.queue.clone(),
            search: lq.q.trim().to_owned(),
            page: lq.page.max(1),
            pages: 1,
            rows: Vec::new(),
            searched: None,
            actionable: 0,
            queues,
        };
        match &v.queue {
            None => {
                // Every queue's newest, merged by time of death.
                for (queue, n) in &v.queues {
                    v.rows
                        .extend(newest_dead(&ui.store, queue, *n, rows).await?);
                }
                v.rows.sort_by_key(|d| std::cmp::Reverse(d.died_ms));
                v.rows.truncate(rows);
                v.actionable = v.rows.len(); // each among its queue's newest `rows`
            }
            Some(queue) => {
                let total = ui.store.counts(queue).await?.dead;
                if v.search.is_empty() {
                    let total = usize::try_from(total).unwrap_or(usize::MAX);
                    v.pages = total.div_ceil(rows).max(1);
                    v.page = v.page.min(v.pages);
                    // Newest first: page 1 is the end of the list.
                    let end = total.saturating_sub((v.page - 1) * rows);
                    let mut page = ui
                        .store
                        .dead_range(queue, end.saturating_sub(rows), end.min(rows))
                        .await?;
                    page.reverse();
                    // Newest first: this page starts that many records from the newest.
                    v.actionable = DEAD_JOB_SEARCH.saturating_sub((v.page - 1) * rows);
                    v.rows = page;
                } else {
                    let needle = v.search.to_lowercase();
                    let scanned = newest_dead(&ui.store, queue, total, DEAD_SCAN).await?;
                    v.searched = Some(scanned.len());
                    let hits: Vec<DeadJob> = scanned
                        .into_iter()
                        .filter(|d| {
                            d.job.id.to_string().contains(&needle)
                                || d.job.kind.to_lowercase().contains(&needle)
                                || d.reason.to_lowercase().contains(&needle)
                                || d.job.payload.to_lowercase().contains(&needle)
                        })
                        .collect();
                    v.pages = hits.len().div_ceil(rows).max(1);
                    v.page = v.page.min(v.pages);
                    v.rows = hits
                        .into_iter()
                        .skip((v.page - 1) * rows)
                        .take(rows)
                        .collect();
                    v.actionable = v.rows.len(); // found among the newest DEAD_SCAN
                }
            }
        }
        Ok(pages::dead(&frame, &v))
    };
    respond(page.await, is_live(q.as_deref()))
}

#[derive(Deserialize)]
struct ConfirmQuery {
    queue: String,
    action: String,
    #[serde(flatten)]
    filter: FilterFields,
}

/// The dead-letter filter of the console's forms: every field may be empty (no condition).
#[derive(Clone, Debug, Default, Deserialize)]
pub(crate) struct FilterFields {
    #[serde(default)]
    pub(crate) kind: Option<String>,
    #[serde(default)]
    pub(crate) reason: Option<String>,
    /// An age as humantime reads it: `30m`, `2h`, `7d`.
    #[serde(default)]
    pub(crate) older: Option<String>,
}

impl FilterFields {
    /// The fields given (empty ones left out). The reason's text is matched as written, its
    /// spaces too (" out" must not match "outage"); only one of nothing but spaces is none.
    fn given(&self) -> (Option<&str>, Option<&str>, Option<&str>) {
        fn f(v: &Option<String>) -> Option<&str> {
            v.as_deref().map(str::trim).filter(|v| !v.is_empty())
        }
        let reason = self.reason.as_deref().filter(|r| !r.trim().is_empty());
        (f(&self.kind), reason, f(&self.older))
    }

    /// As the store's filter (ages by this host's clock), or why not.
    fn filter(&self) -> Result<palisade::DeadFilter, String> {
        let (kind, reason, older) = self.given();
        if let Some(kind) = kind {
            palisade::cli_support::check_name("kind", kind)
                .map_err(|e| format!("Nothing done: {e}"))?;
        }
        let died_before_ms = match older {
            Some(age) => {
                let age = humantime::parse_duration(age)
                    .ok()
                    .filter(|d| *d <= Duration::from_secs(3_650 * 86_400))
                    .ok_or_else(|| {
                        format!(
                            "Nothing done: {:?} is not an age of at most 3650 days (30m, 2h, 7d).",
                            pages::clip(age, 40)
                        )
                    })?;
                let age = u64::try_from(age.as_millis()).unwrap_or(u64::MAX);
                Some(palisade::store::unix_ms().saturating_sub(age))
            }
            None => None,
        };
        Ok(palisade::DeadFilter {
            kind: kind.map(str::to_owned),
            reason: reason.map(str::to_owned),
            died_before_ms,
        })
    }
}

async fn confirm(
    State(ui): State<Arc<Ui>>,
    Query(cq): Query<ConfirmQuery>,
    RawQuery(q): RawQuery,
) -> Response {
    let retry = match cq.action.as_str() {
        "retry" => true,
        "purge" => false,
        _ => return StatusCode::NOT_FOUND.into_response(),
    };
    let page = async {
        let filtered = cq.filter.given() != (None, None, None);
        let title = match (retry, filtered) {
            (true, false) => "Retry all dead jobs",
            (false, false) => "Delete all dead jobs",
            (true, true) => "Retry the dead jobs that match",
            (false, true) => "Delete the dead jobs that match",
        };
        let frame = ui
            .frame("/dead", title.into(), "/dead/confirm", q.as_deref())
            .await?;
        if let Err(e) = palisade::cli_support::check_name("queue", &cq.queue) {
            return Ok(pages::refused(
                &frame,
                &format!("Nothing to do: {e}"),
                "/dead",
            ));
        }
        let n = ui.store.counts(&cq.queue).await?.dead;
        // (A filter that does not read is refused here, before anything is asked.)
        if let Err(why) = cq.filter.filter() {
            return Ok(pages::refused(
                &frame,
                &why,
                &format!("/dead?queue={}", pages::enc(&cq.queue)),
            ));
        }
        Ok(pages::confirm(&frame, &cq.queue, retry, n, &cq.filter))
    };
    respond(page.await, false)
}

async fn flows(State(ui): State<Arc<Ui>>, RawQuery(q): RawQuery) -> Response {
    let page = async {
        let frame = ui
            .frame("/flows", "Flows".into(), "/flows", q.as_deref())
            .await?;
        let (running, listed) = ui.store.running_flows(ui.rows).await?;
        // Each listed flow's steps as its home keeps them (a bounded read: one per row).
        let mut rows = Vec::with_capacity(listed.len());
        for (id, created) in listed {
            rows.push((id, created, ui.store.flow(id).await?));
        }
        Ok(pages::flows(&frame, running, &rows))
    };
    respond(page.await, is_live(q.as_deref()))
}

async fn flow(
    State(ui): State<Arc<Ui>>,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
) -> Response {
    let Ok(id) = id.parse::<uuid::Uuid>().map(FlowId::from) else {
        return (StatusCode::NOT_FOUND, "not a flow id\n").into_response();
    };
    let page = async {
        let frame = ui
            .frame(
                "/flows",
                format!("Flow {id}"),
                &format!("/flow/{id}"),
                q.as_deref(),
            )
            .await?;
        match ui.store.flow(id).await? {
            Some(status) => {
                let steps = ui.store.flow_steps(id).await?;
                Ok(Some(pages::flow(&frame, &status, &steps)))
            }
            None => Ok(None),
        }
    };
    match page.await {
        Ok(Some(markup)) => respond(Ok(markup), is_live(q.as_deref())),
        Ok(None) => (
            StatusCode::NOT_FOUND,
            "no such flow (or it finished and expired)\n",
        )
            .into_response(),
        Err(e) => respond(Err(e), false),
    }
}

async fn schedules(State(ui): State<Arc<Ui>>, RawQuery(q): RawQuery) -> Response {
    let page = async {
        let frame = ui
            .frame("/schedules", "Schedules".into(), "/schedules", q.as_deref())
            .await?;
        let now = ui.store.now_ms().await?;
        let mut rows = Vec::new();
        for spec in ui.store.schedules().await? {
            let mark = ui.store.schedule_mark(&spec.name).await?;
            // A kept spec that no longer parses still shows, without a next tick.
            let next = palisade::Schedule::try_from(spec.clone())
                .ok()
                .and_then(|s| s.next_fired(mark, now));
            rows.push((spec, mark, next));
        }
        let paused = ui.store.paused_schedules().await?;
        Ok(pages::schedules(&frame, &rows, &paused))
    };
    respond(page.await, is_live(q.as_deref()))
}

async fn rejections(State(ui): State<Arc<Ui>>, RawQuery(q): RawQuery) -> Response {
    let page = async {
        let frame = ui
            .frame(
                "/rejections",
                "Fence rejections".into(),
                "/rejections",
                q.as_deref(),
            )
            .await?;
        Ok(pages::rejections(
            &frame,
            &ui.store.rejections(ui.rows).await?,
        ))
    };
    respond(page.await, is_live(q.as_deref()))
}

#[derive(Deserialize)]
struct FindQuery {
    id: String,
}

/// `GET /job?id=…`: the search box in the header. A whole id opens the job's page; anything
/// else gets a page that says what the box takes and lists the running jobs and the newest
/// dead letters whose ids contain the text.
async fn find_job(
    State(ui): State<Arc<Ui>>,
    Query(f): Query<FindQuery>,
    RawQuery(q): RawQuery,
) -> Response {
    let text = f.id.trim().to_ascii_lowercase();
    if let Ok(id) = text.parse::<uuid::Uuid>() {
        return Redirect::to(&format!("/job/{id}")).into_response();
    }
    let page = async {
        let frame = ui
            .frame("", "Find a job".into(), "/job", q.as_deref())
            .await?;
        let mut found = Vec::new();
        // (A few characters would match everything: at least four, hex digits and dashes.)
        let searchable =
            text.len() >= 4 && text.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-');
        if searchable {
            for l in ui.store.leases(LEASE_SCAN).await? {
                if l.job.to_string().contains(&text) {
                    found.push((l.job, "running", l.queue));
                }
            }
            for (queue, n) in dead_counts(&ui.store).await?.0 {
                for d in newest_dead(&ui.store, &queue, n, DEAD_SCAN).await? {
                    if d.job.id.to_string().contains(&text) {
                        found.push((d.job.id, "dead", queue.clone()));
                    }
                }
            }
        }
        found.truncate(ui.rows);
        Ok(pages::search(&frame, &text, searchable, &found))
    };
    let mut response = respond(page.await, false);
    *response.status_mut() = StatusCode::BAD_REQUEST;
    response
}

async fn job(State(ui): State<Arc<Ui>>, Path(id): Path<String>, RawQuery(q): RawQuery) -> Response {
    let Ok(id) = id.parse::<uuid::Uuid>().map(JobId::from) else {
        return (StatusCode::NOT_FOUND, "not a job id\n").into_response();
    };
    let page = async {
        let frame = ui
            .frame("", format!("Job {id}"), &format!("/job/{id}"), q.as_deref())
            .await?;
        // Where the job is, in `find_job`'s order (the CLI's and the API's too).
        let (mut live, mut completed, mut dead, mut result) = (None, None, None, None);
        match crate::reads::find_job(&ui.store, id, None).await? {
            Some(Found::Live(v)) => live = Some(v),
            Some(Found::Completed(c)) => completed = Some(c),
            Some(Found::Dead(d)) => dead = Some(d),
            Some(Found::Result(r)) => result = Some(r),
            None => {}
        }
        let lease = match live.as_ref().and_then(|v| v.lease) {
            Some(lease) => ui
                .store
                .leases(LEASE_SCAN)
                .await?
                .into_iter()
                .find(|l| l.lease == lease),
            None => None,
        };
        // (Only a job found by its result alone has it read already.)
        let result = match result {
            Some(r) => Some(r),
            None => ui.store.result(id).await?,
        };
        let p = pages::JobPage {
            id,
            live,
            lease,
            dead,
            completed,
            result,
            progress: ui.store.progress(id).await?,
        };
        Ok(pages::job(&frame, &p))
    };
    respond(page.await, is_live(q.as_deref()))
}

/// Every action's fields; each action reads the ones it needs.
#[derive(Deserialize)]
struct ActionForm {
    csrf: String,
    queue: Option<String>,
    kind: Option<String>,
    job: Option<String>,
    jobs: Option<String>,
    per: Option<String>,
    cap: Option<String>,
    schedule: Option<String>,
    flow: Option<String>,
    expected: Option<String>,
    confirm: Option<String>,
    back: Option<String>,
    reason: Option<String>,
    older: Option<String>,
    asof: Option<String>,
}

/// Checks the form's CSRF token, and that a browser that names the form's origin names this
/// host.
fn checked(ui: &Ui, headers: &HeaderMap, form: &ActionForm) -> bool {
    let token_ok: bool = form.csrf.as_bytes().ct_eq(ui.csrf.as_bytes()).into();
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    // As the API refuses them (issue 58): `Origin: null` (a sandboxed frame, a file page, a
    // cross-origin redirect) and a browser's word that the request comes from another site.
    let origin_ok = match headers.get(header::ORIGIN).and_then(|o| o.to_str().ok()) {
        None => true,
        Some(origin) => host.is_some_and(|h| origin.split("://").nth(1) == Some(h)),
    };
    let site_ok = headers
        .get("sec-fetch-site")
        .is_none_or(|s| matches!(s.to_str(), Ok("same-origin" | "none")));
    token_ok && origin_ok && site_ok
}

fn refused() -> Response {
    (
        StatusCode::FORBIDDEN,
        "refused: stale or foreign form; reload the page\n",
    )
        .into_response()
}

/// A form field the action needs, as sent (a name may begin or end with a space: trimmed,
/// `"orders "` would act on `"orders"`), or the message saying it is missing.
fn field<'a>(value: &'a Option<String>, what: &str) -> Result<&'a str, String> {
    value
        .as_deref()
        .filter(|v| !v.is_empty())
        .ok_or_else(|| format!("Nothing done: {what} is missing."))
}

fn job_field(form: &ActionForm) -> Result<JobId, String> {
    field(&form.job, "the job")?
        .trim()
        .parse::<uuid::Uuid>()
        .map(JobId::from)
        .map_err(|_| "Nothing done: the job is not a job id.".to_owned())
}

/// `POST /act/{op}`: one operator action, then back to the page that shows its effect.
async fn act(
    State(ui): State<Arc<Ui>>,
    Path(op): Path<String>,
    headers: HeaderMap,
    Form(form): Form<ActionForm>,
) -> Response {
    if !checked(&ui, &headers, &form) {
        crate::reads::note_refused("ui", "forbidden", "POST", &format!("/act/{op}"));
        return refused();
    }
    let (msg, back) = match perform(&ui, &op, &form).await {
        Ok(Some(done)) => done,
        Ok(None) => return StatusCode::NOT_FOUND.into_response(),
        Err(msg) => (msg, "/".to_owned()),
    };
    tracing::info!(op = %op, outcome = %msg, "ui: operator action");
    // POST-redirect-GET: a reload does not repeat the action.
    Redirect::to(&location(&back, &ui.flash(msg))).into_response()
}

/// `back` with the flash id in its query, before any fragment (after `#` the browser would
/// keep it to itself).
fn location(back: &str, flash: &str) -> String {
    let (path, fragment) = back.split_once('#').unwrap_or((back, ""));
    let sep = if path.contains('?') { '&' } else { '?' };
    let hash = if fragment.is_empty() { "" } else { "#" };
    format!("{path}{sep}flash={flash}{hash}{fragment}")
}

/// Does `op`; the message to show and the page to show it on, `None` for an unknown op.
async fn perform(ui: &Ui, op: &str, form: &ActionForm) -> Result<Option<(String, String)>, String> {
    let store = &ui.store;
    let failed = |e: palisade::Error| format!("Nothing done: {e}");
    let queue_page = |q: &str| format!("/queues#q-{}", pages::enc(q));
    let dead_page = |q: &str| format!("/dead?queue={}", pages::enc(q));
    let done = match op {
        "pause" | "resume" => {
            let queue = field(&form.queue, "the queue")?;
            store
                .set_paused(queue, op == "pause")
                .await
                .map_err(failed)?;
            let what = if op == "pause" { "Paused" } else { "Resumed" };
            (format!("{what} queue {queue}."), "/queues".to_owned())
        }
        "limit" => {
            let queue = field(&form.queue, "the queue")?;
            let limit = match form
                .jobs
                .as_deref()
                .map(str::trim)
                .filter(|j| !j.is_empty())
            {
                None => None,
                Some(jobs) => {
                    let jobs: u32 = jobs.parse().map_err(|_| {
                        format!("Nothing done: {jobs:?} jobs is not a whole number.")
                    })?;
                    let per: f64 =
                        field(&form.per, "the period")?
                            .trim()
                            .parse()
                            .map_err(|_| {
                                "Nothing done: the period is not a number of seconds.".to_owned()
                            })?;
                    let per = Duration::try_from_secs_f64(per).map_err(|_| {
                        "Nothing done: the period is not a number of seconds.".to_owned()
                    })?;
                    Some(RateLimit { jobs, per })
                }
            };
            store.set_rate_limit(queue, limit).await.map_err(failed)?;
            let msg = match limit {
                Some(l) => format!(
                    "Queue {queue} limited to {} job(s) per {:?}.",
                    l.jobs, l.per
                ),
                None => format!("Queue {queue} has no rate limit now."),
            };
            (msg, queue_page(queue))
        }
        "forget" => {
            let queue = field(&form.queue, "the queue")?;
            if store
                .paused()
                .await
                .map_err(failed)?
                .iter()
                .any(|q| q == queue)
                || store.rate_limit(queue).await.map_err(failed)?.is_some()
            {
                return Err(format!(
                    "Kept queue {queue}: it is paused or rate-limited, and forgetting it would drop that; resume it or lift the limit first."
                ));
            }
            let msg = if store.forget_queue(queue).await.map_err(failed)? {
                format!("Forgot queue {queue}.")
            } else {
                format!("Kept queue {queue}: it still holds jobs.")
            };
            (msg, "/queues".to_owned())
        }
        "cap" => {
            let kind = field(&form.kind, "the kind")?;
            let cap = match form.cap.as_deref().map(str::trim).filter(|c| !c.is_empty()) {
                None => None,
                Some(cap) => Some(
                    cap.parse::<u32>()
                        .map_err(|_| format!("Nothing done: cap {cap:?} is not a whole number."))?,
                ),
            };
            store.set_concurrency_cap(kind, cap).await.map_err(failed)?;
            let msg = match cap {
                Some(cap) => format!("Kind {kind} capped at {cap} running at once."),
                None => format!("Kind {kind} is not capped now."),
            };
            (msg, "/queues#kinds".to_owned())
        }
        "run-now" => {
            let job = job_field(form)?;
            let msg = if store.run_now(job).await.map_err(failed)? {
                format!("Job {job} is due now.")
            } else {
                format!("Job {job} was not delayed: nothing done.")
            };
            (msg, back_to(form, job))
        }
        "cancel" => {
            let job = job_field(form)?;
            let msg = match store
                .cancel(job, "cancelled from the operator page")
                .await
                .map_err(failed)?
            {
                palisade::Cancelled::Removed => {
                    format!("Job {job} cancelled: it is among the dead letters.")
                }
                palisade::Cancelled::Revoked => format!(
                    "Job {job} was running: its lease is revoked and it is among the dead letters."
                ),
                palisade::Cancelled::Missing => {
                    format!("Job {job} is not queued or running: nothing done.")
                }
            };
            (msg, back_to(form, job))
        }
        "dead-retry" | "dead-delete" => {
            let queue = field(&form.queue, "the queue")?;
            let job = job_field(form)?;
            let done = if op == "dead-retry" {
                store.retry_dead_job(queue, job).await
            } else {
                store.purge_dead_job(queue, job).await
            }
            .map_err(failed)?;
            let msg = match (done, op == "dead-retry") {
                (true, true) => format!("Retried dead job {job}."),
                (true, false) => format!("Deleted dead job {job}."),
                (false, _) => format!("Dead job {job} is not among the newest {DEAD_JOB_SEARCH} dead letters of {queue}, or its id is live again: nothing done."),
            };
            (msg, dead_page(queue))
        }
        "dead-retry-all" | "dead-purge-all" => {
            let queue = field(&form.queue, "the queue")?;
            if form.confirm.as_deref() != Some("yes") {
                return Err("Nothing done: a bulk action needs its confirmation.".into());
            }
            // At most the number the operator confirmed: jobs that die again meanwhile wait
            // for the next press.
            let expected: usize = field(&form.expected, "the number confirmed")?
                .trim()
                .parse()
                .map_err(|_| {
                    "Nothing done: the number confirmed is not a whole number.".to_owned()
                })?;
            let retry = op == "dead-retry-all";
            let fields = FilterFields {
                kind: form.kind.clone(),
                reason: form.reason.clone(),
                older: form.older.clone(),
            };
            let filter = fields.filter()?;
            let action = if retry {
                palisade::DeadAction::Retry
            } else {
                palisade::DeadAction::Purge
            };
            // Every one up to the number confirmed, past any whose id is live again (kept
            // dead, and said so).
            let last = std::sync::Mutex::new(palisade::DeadSweep::default());
            let done = store
                .dead_where(queue, &filter, action, expected as u64, &|s| {
                    *last
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner) = s;
                })
                .await;
            let s = *last
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Err(e) = done {
                return Ok(Some((
                    format!("Stopped after {} job(s): {e}", s.done),
                    dead_page(queue),
                )));
            }
            let verb = if retry { "Retried" } else { "Deleted" };
            let kept = if s.kept > 0 {
                format!(" {} stay dead: their ids name live jobs again.", s.kept)
            } else {
                String::new()
            };
            let matching = match fields.given() {
                (None, None, None) => String::new(),
                _ => format!(" matching the filter (of {} read)", s.scanned),
            };
            (
                format!(
                    "{verb} {} dead job(s) of queue {queue}{matching}.{kept}",
                    s.done
                ),
                dead_page(queue),
            )
        }
        "queue-clear" => {
            let queue = field(&form.queue, "the queue")?;
            if form.confirm.as_deref() != Some("yes") {
                return Err("Nothing done: clearing a queue needs its confirmation.".into());
            }
            // At most the number the operator confirmed: jobs enqueued meanwhile stay.
            let expected: u64 = field(&form.expected, "the number confirmed")?
                .trim()
                .parse()
                .map_err(|_| {
                    "Nothing done: the number confirmed is not a whole number.".to_owned()
                })?;
            // Only jobs enqueued by the time the page was shown (the coordinator's clock then).
            let asof: u64 = field(&form.asof, "the time the page was shown")?
                .trim()
                .parse()
                .map_err(|_| "Nothing done: the page's time is not a whole number.".to_owned())?;
            let cancelled = crate::reads::clear_queue(
                store,
                queue,
                "queue cleared through the console",
                expected,
                asof,
            )
            .await
            .map_err(failed)?;
            tracing::info!(queue, cancelled, "console: queue cleared");
            (
                format!(
                    "Cancelled {cancelled} job(s) of queue {queue}: they are among its dead letters."
                ),
                format!("/ready?queue={}", pages::enc(queue)),
            )
        }
        "enqueue-now" => {
            let name = field(&form.schedule, "the schedule")?;
            let Some(spec) = store
                .schedules()
                .await
                .map_err(failed)?
                .into_iter()
                .find(|s| s.name == name)
            else {
                return Err(format!("Nothing done: no kept schedule is named {name}."));
            };
            // The one enqueue path: an id kept across retries, counted, and (feature `otel`) a
            // trace of its own.
            let done = palisade::cli_support::enqueue_counted(store, vec![spec.job])
                .await
                .map_err(failed)?;
            let id = done.first().map(|e| e.id().to_string()).unwrap_or_default();
            (
                format!("Enqueued job {id} of schedule {name}."),
                "/schedules".to_owned(),
            )
        }
        "schedule-remove" => {
            let name = field(&form.schedule, "the schedule")?;
            let removed = store.remove_schedule(name).await.map_err(failed)?;
            let msg = if removed {
                format!(
                    "Schedule {name} removed: it fires no more (a worker whose binary declares \
                     it in code keeps it again when it starts)."
                )
            } else {
                format!("Nothing done: no kept schedule is named {name}.")
            };
            (msg, "/schedules".to_owned())
        }
        "schedule-pause" | "schedule-resume" => {
            let name = field(&form.schedule, "the schedule")?;
            let pause = op == "schedule-pause";
            // Only a schedule the coordinator keeps (a worker keeps its binary's too): a name
            // paused before its schedule exists would start it paused, unnoticed.
            let known = store
                .schedules()
                .await
                .map_err(failed)?
                .iter()
                .any(|s| s.name == name);
            if pause && !known {
                return Err(format!(
                    "Nothing done: no kept schedule is named {}.",
                    pages::clip(name, 80)
                ));
            }
            let changed = store.pause_schedule(name, pause).await.map_err(failed)?;
            let msg = match (pause, changed) {
                (true, true) => format!(
                    "Schedule {name} paused: its ticks are skipped, not saved up, until it is resumed."
                ),
                (false, true) => format!("Schedule {name} resumed: it fires from its next tick."),
                (true, false) => format!("Nothing done: schedule {name} was paused already."),
                (false, false) => format!("Nothing done: schedule {name} was not paused."),
            };
            tracing::info!(schedule = name, pause, "console: schedule pause set");
            (msg, "/schedules".to_owned())
        }
        "flow-cancel" => {
            let flow = field(&form.flow, "the flow")?;
            let Ok(id) = flow.parse::<uuid::Uuid>().map(FlowId::from) else {
                return Err("Nothing done: that is not a flow id.".into());
            };
            let msg = match palisade::Client::new(store.clone())
                .cancel_flow(id)
                .await
                .map_err(failed)?
            {
                Some(stopped) => format!(
                    "Flow {id} cancelled: its steps not decided yet are dead unrun; {stopped} \
                     running step job(s) cancelled."
                ),
                None => format!("Nothing done: flow {id} is not kept (never created, or finished and forgotten)."),
            };
            (msg, format!("/flow/{id}"))
        }
        _ => return Ok(None),
    };
    Ok(Some(done))
}

/// Where a job action returns: the delayed list it was pressed on (its queue, and whether
/// it showed retries only), or the job's page.
fn back_to(form: &ActionForm, job: JobId) -> String {
    match (form.back.as_deref(), &form.queue) {
        (Some(back @ ("delayed" | "retries")), Some(queue)) => {
            let retries = if back == "retries" { "&retries=1" } else { "" };
            format!("/delayed?queue={}{retries}", pages::enc(queue))
        }
        (Some("ready"), Some(queue)) => format!("/ready?queue={}", pages::enc(queue)),
        _ => format!("/job/{job}"),
    }
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
        let method = request.method().as_str();
        crate::reads::note_refused("ui", "unknown_host", method, request.uri().path());
        return (
            StatusCode::MISDIRECTED_REQUEST,
            "unknown host; add it with --public-host\n",
        )
            .into_response();
    }
    // A form is small: read whole within the body timeout, at most 64 KiB (what the console
    // echoes back in a message is cut far below that).
    let (method, path) = (request.method().clone(), request.uri().path().to_owned());
    let mut response = match crate::serve::buffered(request, MAX_FORM_BYTES, ui.body_timeout).await
    {
        Ok(request) => next.run(request).await,
        Err(refused) => {
            let (status, reason) = refused.status();
            crate::reads::note_refused("ui", reason, method.as_str(), &path);
            (
                status,
                [(header::CONNECTION, "close")],
                format!("{refused}\n"),
            )
                .into_response()
        }
    };
    let headers = response.headers_mut();
    headers.insert(header::X_FRAME_OPTIONS, "DENY".parse().expect("static"));
    // (A page's URL names queues, jobs and searches: no other site is told it.)
    headers.insert(
        header::REFERRER_POLICY,
        "same-origin".parse().expect("static"),
    );
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        "frame-ancestors 'none'; script-src 'none'; form-action 'self'; base-uri 'none'"
            .parse()
            .expect("static"),
    );
    headers.insert(header::CACHE_CONTROL, "no-store".parse().expect("static"));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        "nosniff".parse().expect("static"),
    );
    response
}

/// The most bytes a console form's body may hold.
const MAX_FORM_BYTES: usize = 64 * 1024;

/// Asks for basic auth when it is configured.
async fn authorize(State(ui): State<Arc<Ui>>, request: Request, next: Next) -> Response {
    if let Some(expected) = &ui.authorization {
        let peer = request
            .extensions()
            .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
            .map(|c| c.0.ip());
        let now = std::time::Instant::now();
        if let Some(wait) = peer.and_then(|p| ui.logins.wait(p, now)) {
            let method = request.method().as_str();
            crate::reads::note_refused("ui", "throttled", method, request.uri().path());
            let seconds = wait.as_secs().max(1).to_string();
            return (
                StatusCode::TOO_MANY_REQUESTS,
                [(header::RETRY_AFTER, seconds)],
                "too many failed logins from this address; try again later\n",
            )
                .into_response();
        }
        let given = request
            .headers()
            .get(header::AUTHORIZATION)
            .map(|h| h.as_bytes())
            .unwrap_or_default();
        if !bool::from(given.ct_eq(expected.as_bytes())) {
            // (A browser's first request carries no credentials: that is asking, not failing.)
            if !given.is_empty() {
                let method = request.method().as_str();
                crate::reads::note_refused("ui", "unauthorized", method, request.uri().path());
                if let Some(peer) = peer {
                    ui.logins.failed(peer, now);
                }
            }
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
        .route("/", get(dashboard))
        .route("/queues", get(queues))
        .route("/busy", get(busy))
        .route("/ready", get(ready))
        .route("/clear/confirm", get(confirm_clear))
        .route("/delayed", get(delayed))
        .route("/dead", get(dead))
        .route("/dead/confirm", get(confirm))
        .route("/flows", get(flows))
        .route("/flow/{id}", get(flow))
        .route("/schedules", get(schedules))
        .route("/rejections", get(rejections))
        .route("/job", get(find_job))
        .route("/job/{id}", get(job))
        .route("/act/{op}", post(act))
        .route_layer(axum::middleware::from_fn_with_state(ui.clone(), authorize))
        .route("/healthz", get(|| async { "ok\n" }))
        // Its own, so that merging the API's routes never hands the console's unknown paths
        // to the API's guard.
        .fallback(|| async { (StatusCode::NOT_FOUND, "not found\n") })
        .layer(axum::middleware::from_fn_with_state(ui.clone(), guard))
        .with_state(ui)
}

/// The `Authorization` header value `user:password` asks for; checks the flag's form.
fn basic_authorization(user_password: &str) -> anyhow::Result<String> {
    match user_password.split_once(':') {
        // (Printable, no control characters: a header value cannot carry them, and a flag
        // with one is a pasting mistake.)
        Some((user, password))
            if !user.is_empty()
                && !password.is_empty()
                && user_password
                    .chars()
                    .all(|c| c == ' ' || c.is_ascii_graphic()) =>
        {
            Ok(format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(user_password)
            ))
        }
        _ => bail!("--basic-auth wants user:password, both non-empty, printable ASCII"),
    }
}

/// Serves the page until SIGINT / SIGTERM.
pub(super) fn run(args: UiArgs, registry: palisade::Registry) -> anyhow::Result<()> {
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
    // Behind a proxy the page answers whoever the proxy forwards: anyone could read the CSRF
    // token off a page and then retry, delete, cancel and pause (issue 58, M3).
    if !args.public_hosts.is_empty() && authorization.is_none() {
        bail!(
            "--public-host {}: the console behind a proxy answers whoever it forwards; it needs \
             --basic-auth (the page can retry and purge jobs)",
            args.public_hosts.join(",")
        );
    }
    let exposed = authorization.is_some() || !args.public_hosts.is_empty();
    // A bad API token is refused before anything connects.
    args.api.checked(args.listen, exposed)?;
    args.api.serve_metrics()?;
    super::runtime()?.block_on(async {
        let (_, store) = args
            .redis
            .store_with(args.api.max_payload_bytes, |s| s)
            .await?;
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
            rows: args.rows.clamp(1, MAX_ROWS),
            trace_url: args.trace_url.clone(),
            csrf: uuid::Uuid::new_v4().simple().to_string(),
            authorization,
            hosts: allowed_hosts(bound, &args.public_hosts),
            body_timeout: args.api.body_timeout,
            logins: Default::default(),
            flash: Default::default(),
        });
        let api = super::api::router(
            ui.store.clone(),
            registry,
            &args.api,
            bound,
            ui.hosts.clone(),
            exposed,
        )?;
        println!("palisade ui: http://{bound}/ (API: http://{bound}/api/v1/)");
        tracing::info!(listen = %args.listen, "operator page serving");
        let app = router(ui).merge(api);
        let limits = args.api.limits();
        crate::serve::serve(listener, app, limits, "ui", super::shutdown_signal())
            .await
            .context("serving the page")
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reads::QueueRow;

    fn frame(msg: Option<&str>) -> Frame<'static> {
        Frame {
            active: "/",
            title: "T<i>".into(),
            source: "redis://x",
            trace_url: Some("https://tempo.example/t/{trace_id}?x=<y>"),
            csrf: "tok",
            msg: msg.map(str::to_owned),
            here: "/dead?queue=%3Cq%3E".into(),
            live: false,
            now_ms: 10_000,
        }
    }

    #[test]
    fn render_escapes_what_users_wrote() {
        let note = palisade::store::RejectionNote {
            at_ms: 0,
            sink: "<b>ledger".into(),
            scope: "a\"b".into(),
            token: (3 << 40) | 7,
            reason: "stale_token".into(),
            detail: "<script>alert(1)</script>".into(),
            trace_id: Some("4bf92f3577b34da6a3ce929d0e0e4736".into()),
            worker: Some("<w>".into()),
            ..Default::default()
        };
        let forged = palisade::store::RejectionNote {
            trace_id: Some("\"><script>x</script>".into()),
            ..note.clone()
        };
        let page = pages::rejections(&frame(Some("<i>done</i>")), &[note, forged]).into_string();
        // A trace id links where --trace-url says (the template escaped as any value); one
        // that is no trace id is text, never part of a link.
        assert!(
            page.contains(
                r#"href="https://tempo.example/t/4bf92f3577b34da6a3ce929d0e0e4736?x=&lt;y&gt;""#
            ),
            "{page}"
        );
        assert!(
            !page.contains("<script>x") && page.contains("&lt;script&gt;x"),
            "{page}"
        );
        assert_eq!(
            page.matches(r#"<a href="https://tempo.example"#).count(),
            1,
            "only the real trace id is linked: {page}"
        );
        assert!(!page.contains("<script>alert"), "{page}");
        assert!(!page.contains("<b>ledger") && !page.contains("<i>done") && !page.contains("T<i>"));
        assert!(page.contains("&lt;script&gt;"), "{page}");
        // Tokens read as epoch and counter, the raw number on hover.
        assert!(
            page.contains("epoch 3 · 7") && page.contains("token 3298534883335"),
            "{page}"
        );
        // A long name is cut, whole on hover; a name in a link is percent-encoded.
        let long = "q".repeat(512);
        let row = QueueRow {
            name: long.clone(),
            counts: Default::default(),
            oldest: None,
            paused: false,
            limit: None,
        };
        let view = pages::QueuesView {
            queues: vec![row],
            unreadable: vec![(
                "<b>broken".into(),
                "PALISADE_CORRUPT {palisade}:q:<b>broken:delayed is a string".into(),
            )],
            kinds: Default::default(),
            top_groups: vec![(
                "q".into(),
                vec![palisade::GroupStatus {
                    group: "<tenant>".into(),
                    ready: 7,
                    ..Default::default()
                }],
            )],
            limited_groups: Vec::new(),
            pager: pages::Pager {
                page: 1,
                more: false,
            },
            total: 1,
        };
        let page = pages::queues(&frame(None), &view).into_string();
        assert!(
            page.contains(&format!("title=\"{long}\"")),
            "the whole name on hover"
        );
        assert!(page.contains(&format!("{}…", "q".repeat(60))), "cut");
        assert!(page.contains("&lt;tenant&gt;"), "a group's name, escaped");
        // A queue left out until repaired is said, its name and the error escaped.
        assert!(
            page.contains("left out until repaired") && page.contains("q:&lt;b&gt;broken:delayed"),
            "{page}"
        );
        assert!(!page.contains("<b>broken"), "{page}");
        let dead = pages::DeadView {
            queues: vec![("a&b\"<".into(), 1)],
            unreadable: vec![(
                "broken".into(),
                "{palisade}:q:broken:dead is a string".into(),
            )],
            queue: Some("a&b\"<".into()),
            search: "\"><script>".into(),
            page: 1,
            pages: 2,
            rows: Vec::new(),
            searched: None,
            actionable: 0,
        };
        let page = pages::dead(&frame(None), &dead).into_string();
        assert!(page.contains("queue=a%26b%22%3C"), "{page}");
        assert!(
            page.contains("left out until repaired: {palisade}:q:broken:dead is a string"),
            "{page}"
        );
        // Rows past the newest 5,000 have no one-job buttons (those would not reach them).
        let row = |n: u32| DeadJob {
            job: palisade::Job {
                id: JobId::new(),
                queue: "q".into(),
                kind: "k".into(),
                payload: "{}".into(),
                scope: palisade::Scope::new("s"),
                attempt: n,
                stalls: 0,
                snoozes: 0,
                max_snoozes: 0,
                timeout: None,
                deadline_ms: None,
                max_attempts: 1,
                max_stalls: 0,
                flow: None,
                tick: None,
                trace: None,
                group: None,
            },
            reason: "r".into(),
            died_ms: None,
            details: Default::default(),
        };
        let paged = pages::DeadView {
            queues: vec![("q".into(), 2)],
            unreadable: Vec::new(),
            queue: Some("q".into()),
            search: String::new(),
            page: 1,
            pages: 1,
            rows: vec![row(1), row(2)],
            searched: None,
            actionable: 1,
        };
        let page = pages::dead(&frame(None), &paged).into_string();
        assert_eq!(page.matches("submit\">Retry<").count(), 1, "{page}");
        assert_eq!(page.matches("older than the newest 5,000").count(), 1);
        assert!(!page.contains("\"><script>"), "{page}");
    }

    #[test]
    fn the_live_toggle_keeps_the_query_and_drops_the_flash() {
        let ui = Ui {
            store: Stores::from(std::sync::Arc::new(palisade::MemoryLeaseStore::new())),
            source: String::new(),
            rows: 10,
            trace_url: None,
            csrf: "t".into(),
            authorization: None,
            hosts: Vec::new(),
            body_timeout: std::time::Duration::from_secs(30),
            logins: Default::default(),
            flash: Default::default(),
        };
        let id = ui.flash("done".into());
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let f = rt
            .block_on(ui.frame(
                "/dead",
                "x".into(),
                "/dead",
                Some(&format!("queue=a%26b&live=1&flash={id}")),
            ))
            .unwrap();
        assert!(f.live);
        assert_eq!(f.here, "/dead?queue=a%26b");
        assert_eq!(f.msg.as_deref(), Some("done"));
        let page = pages::layout(&f, maud::html! {}).into_string();
        assert!(
            page.contains("href=\"/dead?queue=a%26b\""),
            "stop keeps the queue: {page}"
        );
    }

    /// Rates between samples, per minute; rejections counted in the minute they fell in; a
    /// count that went down reads as no change.
    #[test]
    fn history_turns_into_per_minute_series() {
        use palisade::store::HistorySample;
        let at = |min: u64, completed: u64, died: u64| HistorySample {
            at_ms: 1_000_000 + min * 60_000,
            counts: palisade::QueueCounts {
                completed,
                died,
                ..Default::default()
            },
            oldest_ready_ms: min * 1000,
        };
        let history = [at(0, 100, 5), at(1, 160, 5), at(3, 100, 9)];
        let note = |ms: u64| palisade::store::RejectionNote {
            at_ms: ms,
            sink: "s".into(),
            scope: "x".into(),
            token: 1,
            reason: "stale_token".into(),
            detail: String::new(),
            ..Default::default()
        };
        let rejections = [note(1_000_000 + 30_000), note(1_000_000 + 90_000), note(1)];
        let [done, died, refused, waiting] = pages::series(&history, &rejections);
        let values = |s: &pages::Series| s.iter().map(|p| p.1).collect::<Vec<_>>();
        assert_eq!(values(&done), [60.0, 0.0]);
        assert_eq!(values(&died), [0.0, 2.0]);
        assert_eq!(values(&refused), [1.0, 0.5]);
        assert_eq!(values(&waiting), [1.0, 3.0]);
        assert_eq!(done[1].0, 1_000_000 + 180_000);
        // Read right after the last sample (charts draw the six hours before "now").
        let mut read = frame(None);
        read.now_ms = 1_000_000 + 180_000;
        let page = pages::dashboard(
            &read,
            &pages::Dashboard {
                queues: Vec::new(),
                unreadable: Vec::new(),
                workers: 0,
                unclaimed: Vec::new(),
                leases: 0,
                flows_running: 0,
                rejections: rejections.to_vec(),
                history: history.to_vec(),
            },
        )
        .into_string();
        assert!(
            page.contains("id=\"chart-completed\"") && page.contains("highest 60.0"),
            "{page}"
        );
        // A full journal reaches back only so far: no rejection bar before its oldest note.
        let full: Vec<_> = (0..palisade::store::REJECTION_JOURNAL as u64)
            .map(|i| note(1_000_000 + 60_000 + i))
            .collect();
        let [_, _, refused, _] = pages::series(&history, &full);
        assert_eq!(
            values(&refused),
            [499.5],
            "only the interval after the oldest note"
        );
    }

    #[test]
    fn the_flash_goes_in_the_query_before_the_fragment() {
        assert_eq!(location("/queues", "f"), "/queues?flash=f");
        assert_eq!(location("/dead?queue=a", "f"), "/dead?queue=a&flash=f");
        assert_eq!(location("/queues#q-a%20b", "f"), "/queues?flash=f#q-a%20b");
    }

    /// A name is acted on as sent: `"orders "` is not `"orders"`.
    #[test]
    fn actions_take_names_as_sent() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let ui = Ui {
            store: Stores::from(std::sync::Arc::new(palisade::MemoryLeaseStore::new())),
            source: String::new(),
            rows: 10,
            trace_url: None,
            csrf: "t".into(),
            authorization: None,
            hosts: Vec::new(),
            body_timeout: std::time::Duration::from_secs(30),
            logins: Default::default(),
            flash: Default::default(),
        };
        let form = ActionForm {
            csrf: "t".into(),
            queue: Some("orders ".into()),
            kind: None,
            job: None,
            jobs: Some(" 5 ".into()),
            per: Some("2".into()),
            cap: None,
            schedule: None,
            flow: None,
            expected: None,
            confirm: None,
            back: None,
            reason: None,
            older: None,
            asof: None,
        };
        rt.block_on(async {
            perform(&ui, "pause", &form).await.unwrap();
            perform(&ui, "limit", &form).await.unwrap();
            assert_eq!(ui.store.paused().await.unwrap(), ["orders "]);
            assert!(ui.store.rate_limit("orders ").await.unwrap().is_some());
            assert_eq!(ui.store.rate_limit("orders").await.unwrap(), None);
            // Forgetting a paused or limited queue would drop that: refused, whatever the
            // page offered.
            let msg = perform(&ui, "forget", &form).await.unwrap_err();
            assert!(msg.contains("paused or rate-limited"), "{msg}");
            assert_eq!(ui.store.paused().await.unwrap(), ["orders "]);
            // A bulk action without its confirmation does nothing.
            let msg = perform(&ui, "dead-retry-all", &form).await.unwrap_err();
            assert!(msg.contains("confirmation"), "{msg}");
            assert!(perform(&ui, "no-such-op", &form).await.unwrap().is_none());
        });
    }

    #[test]
    fn a_journal_time_past_year_9999_is_shown_raw() {
        use super::super::when;
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
        use pages::{age, clip};
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
