//! The operator console's pages: pure functions from what was read to HTML (maud escapes
//! every value). Nothing here reads the coordinator or the request.

use crate::reads::QueueRow;
use std::collections::BTreeMap;
use std::time::Duration;

use maud::{html, Markup, PreEscaped, DOCTYPE};

use super::super::when;
use palisade::store::{HistorySample, LeaseInfo, RejectionNote, WorkerBeat};
use palisade::ScheduleSpec;
use palisade::{DeadJob, JobState, JobView, QueueCounts};
use palisade::{FencingToken, FlowId, JobId};
use palisade::{FlowStatus, StepEnd, StepState, StepStatus};

/// What every page shows around its body.
pub(crate) struct Frame<'a> {
    /// Navigation entry that is current (its path).
    pub active: &'static str,
    /// Heading and title.
    pub title: String,
    /// Where the coordinator is (password redacted) and under which prefix.
    pub source: &'a str,
    /// `--trace-url`: where a trace id links to.
    pub trace_url: Option<&'a str>,
    /// Goes into every form.
    pub csrf: &'a str,
    /// The last action's outcome.
    pub msg: Option<String>,
    /// This page's path and query without `live`, for the live toggle.
    pub here: String,
    /// The page reloads itself (a `Refresh` header the handler sends).
    pub live: bool,
    /// When it was read (Unix ms).
    pub now_ms: u64,
}

const NAV: &[(&str, &str)] = &[
    ("/", "Dashboard"),
    ("/queues", "Queues"),
    ("/busy", "Busy"),
    ("/ready", "Ready"),
    ("/delayed", "Delayed"),
    ("/dead", "Dead"),
    ("/flows", "Flows"),
    ("/schedules", "Schedules"),
    ("/rejections", "Fence rejections"),
];

const STYLE: &str = "body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#222}\
header{background:#2d3142;color:#fff;padding:.5em 1.5em;display:flex;flex-wrap:wrap;\
align-items:center;gap:1em}header a{color:#dfe3f0;text-decoration:none;padding:.2em .5em;\
border-radius:3px}header a.on{background:#4f5d75;color:#fff}header .brand{font-weight:600;\
color:#fff}header form{margin-left:auto}main{padding:0 1.5em 2em}\
h1{font-size:1.3em}h2{font-size:1.1em;margin-top:1.6em}\
table{border-collapse:collapse;margin:.4em 0}td,th{border:1px solid #ccc;padding:.25em .6em;\
text-align:left;vertical-align:top}td.n{text-align:right;font-variant-numeric:tabular-nums}\
th{background:#f3f3f3}.msg{background:#e8f4e8;padding:.5em;border:1px solid #9c9}\
.warn{background:#fbeaea;padding:.5em;border:1px solid #d99}\
.empty{color:#777}form{display:inline}button{margin-right:.4em}code{font-size:.95em}\
.name{display:inline-block;max-width:22em;overflow:hidden;text-overflow:ellipsis;\
white-space:nowrap;vertical-align:bottom}.cards{display:flex;flex-wrap:wrap;gap:.8em}\
.card{border:1px solid #ccc;border-radius:4px;padding:.5em 1em;min-width:7em}\
.card b{display:block;font-size:1.5em;font-variant-numeric:tabular-nums}\
.meta{color:#555}pre{background:#f6f6f6;padding:.5em;overflow:auto;max-height:24em}\
.pages a{margin-right:.5em}input[type=number]{width:6em}figure.chart{margin:.4em 1em .4em 0}.charts{display:flex;flex-wrap:wrap}\
figcaption{font-size:.9em;margin-bottom:.2em}\
table{display:block;max-width:100%;overflow-x:auto}nav{display:flex;flex-wrap:wrap;gap:.2em}\
header form{max-width:100%}input[type=search]{max-width:100%;box-sizing:border-box}\
p,li,.msg,.warn{overflow-wrap:anywhere}figure.chart svg{max-width:100%;height:auto}\
@media (max-width:640px){header{padding:.5em .6em}main{padding:0 .6em 1.5em}\
header form{margin-left:0;width:100%}input[type=search]{width:100%}\
figure.chart{margin:.4em 0}}";

/// A duration as an operator reads it: `850ms`, `12.3s`, `4m 10s`, `2h 5m`.
pub(crate) fn age(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0 => format!("{}ms", d.as_millis()),
        1..=59 => format!("{:.1}s", d.as_secs_f64()),
        60..=3599 => format!("{}m {}s", s / 60, s % 60),
        3600..=172_799 => format!("{}h {}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d {}h", s / 86_400, s % 86_400 / 3600),
    }
}

/// At most `max` characters of `text`, marked when cut.
pub(crate) fn clip(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &text[..i]),
        None => text.to_owned(),
    }
}

/// `text` percent-encoded for a query string.
pub(crate) fn enc(text: &str) -> String {
    form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

/// A name (queue, kind, scope, worker): cut to the column's width, the whole name on hover.
fn name(text: &str) -> Markup {
    html! { span.name title=(text) { (clip(text, 60)) } }
}

/// A fencing token as epoch and counter, the raw number on hover.
fn token(raw: u64) -> Markup {
    let t = FencingToken::from_u64(raw);
    html! { span title={ "token " (raw) } { "epoch " (t.epoch()) " · " (t.counter()) } }
}

/// `at_ms` as a time and how long ago.
fn ago(at_ms: u64, now_ms: u64) -> Markup {
    html! {
        span title=(when(at_ms)) {
            @if at_ms <= now_ms { (age(Duration::from_millis(now_ms - at_ms))) " ago" }
            @else { "in " (age(Duration::from_millis(at_ms - now_ms))) }
        }
    }
}

fn job_link(id: JobId) -> Markup {
    html! { a href={ "/job/" (id) } { code { (id) } } }
}

/// A POST form with the CSRF token, hidden `fields`, and one button.
fn action(csrf: &str, op: &str, fields: &[(&str, &str)], label: &str, id: &str) -> Markup {
    html! {
        form method="post" action={ "/act/" (op) } {
            input type="hidden" name="csrf" value=(csrf);
            @for (k, v) in fields { input type="hidden" name=(k) value=(v); }
            button id=[(!id.is_empty()).then_some(id)] type="submit" { (label) }
        }
    }
}

/// The page around `body`.
pub(crate) fn layout(frame: &Frame, body: Markup) -> Markup {
    let sep = if frame.here.contains('?') { '&' } else { '?' };
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (frame.title) " · Palisade" }
                style { (PreEscaped(STYLE)) }
            }
            body {
                header {
                    span.brand { "Palisade" }
                    nav {
                        @for (path, label) in NAV {
                            a href=(path) class=[(*path == frame.active).then_some("on")] { (label) }
                        }
                    }
                    form method="get" action="/job" {
                        input type="search" name="id" placeholder="job id" size="38" aria-label="job id";
                        " "
                        @if frame.live { a #live href=(frame.here) { "live: on (stop)" } }
                        @else { a #live href={ (frame.here) (sep) "live=1" } { "live: off (start)" } }
                    }
                }
                main {
                    h1 { (frame.title) }
                    p.meta { "Coordinator " code { (frame.source) } ", read at " (when(frame.now_ms))
                        @if frame.live { ", reloading every 5 s" } "." }
                    @if let Some(msg) = &frame.msg { p.msg #msg { (msg) } }
                    (body)
                }
            }
        }
    }
}

/// Counts summed over queues.
pub(crate) fn total(counts: &[QueueCounts]) -> QueueCounts {
    let mut total = QueueCounts::default();
    for c in counts {
        total += *c;
    }
    total
}

/// What the dashboard shows.
pub(crate) struct Dashboard {
    pub queues: Vec<QueueRow>,
    /// Queues left out until repaired, with why (a key another program wrote over).
    pub unreadable: Vec<(String, String)>,
    pub workers: usize,
    /// Queues with ready jobs that no live worker's heartbeat lists.
    pub unclaimed: Vec<String>,
    pub leases: usize,
    pub flows_running: u64,
    /// The newest rejections (the journal's), newest first: the latest are listed, all are
    /// counted per minute.
    pub rejections: Vec<RejectionNote>,
    /// The coordinator's history samples, oldest first.
    pub history: Vec<HistorySample>,
}

/// One chart's points: (end of the interval, value), oldest first.
pub(crate) type Series = Vec<(u64, f64)>;

/// Per-minute rates between consecutive samples (completed, died, fence rejections) and the
/// longest wait for a ready job (seconds) at each sample. Rejections come from the journal,
/// which keeps the newest 1,000: when it is full, minutes before its oldest entry get no
/// rejection bar rather than a false zero.
pub(crate) fn series(history: &[HistorySample], rejections: &[RejectionNote]) -> [Series; 4] {
    let mut out: [Series; 4] = Default::default();
    let journal_from = if rejections.len() >= palisade::store::REJECTION_JOURNAL {
        rejections.iter().map(|r| r.at_ms).min().unwrap_or_default()
    } else {
        0
    };
    for pair in history.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        if b.at_ms <= a.at_ms {
            continue;
        }
        let minutes = (b.at_ms - a.at_ms) as f64 / 60_000.0;
        // (Counts that went down — a queue forgotten, a layout move — read as no change.)
        let rate = |x: u64, y: u64| y.saturating_sub(x) as f64 / minutes;
        let refused = rejections
            .iter()
            .filter(|r| r.at_ms > a.at_ms && r.at_ms <= b.at_ms)
            .count() as u64;
        out[0].push((b.at_ms, rate(a.counts.completed, b.counts.completed)));
        out[1].push((b.at_ms, rate(a.counts.died, b.counts.died)));
        if a.at_ms >= journal_from {
            out[2].push((b.at_ms, rate(0, refused)));
        }
        out[3].push((b.at_ms, b.oldest_ready_ms as f64 / 1000.0));
    }
    out
}

/// A bar chart of `points` over the window `from..=to` (ms), one bar per point at its time,
/// drawn here (SVG, no script), its largest value labelled; each bar says its value and time
/// on hover.
fn chart(
    id: &str,
    title: &str,
    unit: &str,
    points: &[(u64, f64)],
    (from, to): (u64, u64),
) -> Markup {
    // The plot's left gutter (the value scale), its width and height.
    const G: f64 = 56.0;
    const W: f64 = 720.0 - G;
    const H: f64 = 60.0;
    let points: Vec<&(u64, f64)> = points
        .iter()
        .filter(|p| (from..=to).contains(&p.0))
        .collect();
    let max = points.iter().map(|p| p.1).fold(0.0_f64, f64::max);
    let span = to.saturating_sub(from).max(1) as f64;
    // One minute's width, at least a pixel.
    let bar = (W * 60_000.0 / span).max(1.0);
    // Axis labels: the value scale on the left, the window's ends below (UTC, hh:mm).
    // ("2026-12-06T03:40:12Z" → "03:40".)
    let clock = |ms: u64| when(ms).get(11..16).unwrap_or_default().to_owned();
    html! {
        figure.chart id=(id) {
            figcaption { b { (title) } " — highest " (format!("{max:.1}")) " " (unit) }
            svg width="720" height="76" viewBox="0 0 720 76" role="img" aria-label=(title) {
                // The value scale in a gutter on the left; the window's ends below.
                rect x=(G) y="0" width=(W) height="60" fill="#f6f7fb" {}
                line x1=(G) y1="60" x2="720" y2="60" stroke="#999" {}
                text.axis x=(G - 4.0) y="10" font-size="10" fill="#555" text-anchor="end" { (format!("{max:.1}")) }
                text.axis x=(G - 4.0) y="22" font-size="9" fill="#777" text-anchor="end" { (unit) }
                text.axis x=(G - 4.0) y="60" font-size="10" fill="#555" text-anchor="end" { "0" }
                text.axis x=(G) y="73" font-size="10" fill="#555" { (clock(from)) " UTC" }
                text.axis x="720" y="73" font-size="10" fill="#555" text-anchor="end" { (clock(to)) }
                @for (at, v) in points {
                    @let h = if max > 0.0 { (v / max * (H - 2.0)).max(if *v > 0.0 { 1.0 } else { 0.0 }) } else { 0.0 };
                    @let x = G + (at.saturating_sub(from) as f64 / span * W - bar).max(0.0);
                    rect x=(format!("{x:.2}")) y=(format!("{:.2}", H - h))
                        width=(format!("{:.2}", (bar - 0.3).max(0.7))) height=(format!("{h:.2}")) fill="#4f5d75" {
                        title { (format!("{v:.1}")) " " (unit) " — " (when(*at)) }
                    }
                }
            }
        }
    }
}

/// One warning per queue that cannot be read until repaired: left out of the counts below.
fn unreadable(queues: &[(String, String)]) -> Markup {
    html! {
        @for (queue, why) in queues {
            p.warn.unreadable data-queue=(queue) {
                "Queue " (name(queue)) " is left out until repaired: " (why)
            }
        }
    }
}

pub(crate) fn dashboard(frame: &Frame, d: &Dashboard) -> Markup {
    let t = total(&d.queues.iter().map(|q| q.counts).collect::<Vec<_>>());
    let card = |label: &str, n: u64, id: &str| {
        html! { div.card id=(id) { b { (n) } (label) } }
    };
    let stuck: Vec<&QueueRow> = d
        .queues
        .iter()
        .filter(|q| q.oldest.is_some_and(|o| o >= Duration::from_secs(60)) || q.paused)
        .collect();
    layout(
        frame,
        html! {
            (unreadable(&d.unreadable))
            div.cards {
                (card("ready", t.ready, "total-ready"))
                (card("waiting", t.waiting, "total-waiting"))
                (card("delayed", t.delayed, "total-delayed"))
                (card("running", t.leased, "total-leased"))
                (card("dead", t.dead, "total-dead"))
                (card("completed", t.completed, "total-completed"))
                (card("cancelled", t.cancelled, "total-cancelled"))
                (card("worker processes", d.workers as u64, "total-workers"))
                (card("flows running", d.flows_running, "total-flows"))
            }
            h2 { "The last hours" }
            @if d.history.len() < 2 {
                p.empty { "No history yet: every worker's coordinator notes one sample a minute \
                           (the history role); the charts start after two." }
            } @else {
                @let [done, died, refused, waiting] = series(&d.history, &d.rejections);
                // Six hours, or since the first sample of a newer install (its bars fill the
                // chart instead of its last pixels).
                @let first = d.history[0].at_ms.saturating_sub(60_000);
                @let window = (frame.now_ms.saturating_sub(6 * 3_600_000).max(first), frame.now_ms);
                p.meta { "The last six hours, one bar a minute (the coordinator keeps a day of samples; \
                          the first here is from " (when(d.history[0].at_ms)) ")." }
                div.charts {
                    (chart("chart-completed", "Completed per minute", "jobs/min", &done, window))
                    (chart("chart-died", "Dead-lettered per minute", "jobs/min", &died, window))
                    (chart("chart-rejections", "Fence rejections per minute", "writes/min", &refused, window))
                    (chart("chart-waiting", "Longest wait of a ready job", "s", &waiting, window))
                }
            }
            h2 { "Needs a look" }
            @if stuck.is_empty() && d.unclaimed.is_empty() { p.empty { "Every queue with ready work is moving (nothing has waited a minute) and none is paused." } }
            @else {
                ul #attention {
                    @for q in &d.unclaimed {
                        li.unclaimed { a href={ "/queues#q-" (enc(q)) } { (name(q)) } ": "
                            b { "no live worker claims it" } " (no worker's --queues lists it)" }
                    }
                    @for q in &stuck {
                        li { a href={ "/queues#q-" (enc(&q.name)) } { (name(&q.name)) } ": "
                            @if q.paused { "paused" @if q.counts.ready > 0 { ", " (q.counts.ready) " ready" } }
                            @else if let Some(o) = q.oldest { "next ready job has waited " (age(o)) } }
                    }
                }
            }
            h2 { "Latest fence rejections" }
            p { "Writes a fenced sink refused; " a href="/rejections" { "all of them" } "." }
            (rejection_table(&d.rejections[..d.rejections.len().min(5)], frame))
            p.meta { (d.leases) " live lease(s): " a href="/busy" { "who runs what" } "." }
        },
    )
}

pub(crate) struct QueuesView {
    pub queues: Vec<QueueRow>,
    /// Queues left out until repaired, with why.
    pub unreadable: Vec<(String, String)>,
    /// Kind → (cap, running now among the listed leases).
    pub kinds: BTreeMap<String, (Option<u32>, usize)>,
    /// Per queue, its groups with the most ready jobs.
    pub top_groups: Vec<(String, Vec<palisade::GroupStatus>)>,
    /// Groups with a cap, a rate limit or a pause.
    pub limited_groups: Vec<palisade::GroupStatus>,
    /// Which page of the queues (by name) this is, and how many queues there are.
    pub pager: Pager,
    pub total: usize,
}

pub(crate) fn queues(frame: &Frame, v: &QueuesView) -> Markup {
    let csrf = frame.csrf;
    layout(
        frame,
        html! {
            (unreadable(&v.unreadable))
            @if v.queues.is_empty() && v.total == 0 { p.empty { "No queue has had a job yet." } }
            @else {
                table #queues {
                    tr { th { "queue" } th { "ready" } th { "waiting" } th { "delayed" } th { "leased" }
                         th { "dead" } th { "completed" } th { "cancelled" } th { "next ready job waiting" }
                         th { "rate limit" } th { "" } }
                    @for q in &v.queues {
                        @let c = &q.counts;
                        tr id={ "q-" (enc(&q.name)) } data-queue=(q.name) {
                            td { (name(&q.name)) @if q.paused { " " em.paused { "(paused)" } } }
                            td.n data-state="ready" { a href={ "/ready?queue=" (enc(&q.name)) } { (c.ready) } }
                            td.n data-state="waiting" { (c.waiting) }
                            td.n data-state="delayed" { a href={ "/delayed?queue=" (enc(&q.name)) } { (c.delayed) } }
                            td.n data-state="leased" { (c.leased) }
                            td.n data-state="dead" { a href={ "/dead?queue=" (enc(&q.name)) } { (c.dead) } }
                            td.n data-state="completed" { (c.completed) }
                            td.n data-state="cancelled" { (c.cancelled) }
                            td.n { (q.oldest.map(age).unwrap_or_else(|| "-".into())) }
                            td data-state="limit" {
                                form method="post" action="/act/limit" {
                                    input type="hidden" name="csrf" value=(csrf);
                                    input type="hidden" name="queue" value=(q.name);
                                    input type="number" name="jobs" min="1" aria-label="jobs"
                                        value=[q.limit.map(|l| l.jobs)];
                                    " per "
                                    input type="number" name="per" min="0.001" step="any" aria-label="seconds"
                                        value=(q.limit.map_or(1.0, |l| l.per.as_secs_f64()));
                                    " s "
                                    button type="submit" { "set" }
                                }
                                @if q.limit.is_some() { " " (action(csrf, "limit", &[("queue", &q.name), ("jobs", "")], "lift", "")) }
                            }
                            td {
                                @if q.paused { (action(csrf, "resume", &[("queue", &q.name)], "Resume", &format!("resume-{}", q.name))) }
                                @else { (action(csrf, "pause", &[("queue", &q.name)], "Pause", &format!("pause-{}", q.name))) }
                                // Not offered for a paused or limited queue: forgetting it would
                                // drop the pause or the limit with it.
                                @if c.pending() == 0 && c.dead == 0 && !q.paused && q.limit.is_none() {
                                    (action(csrf, "forget", &[("queue", &q.name)], "Forget", &format!("forget-{}", q.name)))
                                }
                            }
                        }
                    }
                }
                (v.pager.links_to(|page| format!("/queues?page={page}")))
                @if v.pager.more || v.pager.page > 1 {
                    p.meta { (v.total) " queues by name, " (v.queues.len()) " on this page." }
                }
                p.meta { "Pausing stops claims from the queue; running jobs finish and new jobs are still \
                          accepted. Forget appears for a queue with no job left that is neither paused \
                          nor limited: it leaves this list (and the metrics) until a job is enqueued to \
                          it again." }
            }
            h2 { "Kinds: concurrency caps" }
            @if v.kinds.is_empty() { p.empty { "No kind is capped or running." } }
            @else {
                table #kinds {
                    tr { th { "kind" } th { "running now" } th { "cap (fleet-wide)" } }
                    @for (kind, (cap, running)) in &v.kinds {
                        tr data-kind=(kind) {
                            td { (name(kind)) }
                            td.n data-state="running" { (running) }
                            td data-state="cap" {
                                form method="post" action="/act/cap" {
                                    input type="hidden" name="csrf" value=(csrf);
                                    input type="hidden" name="kind" value=(kind);
                                    input type="number" name="cap" min="1" aria-label="cap" value=[*cap];
                                    button type="submit" { "set" }
                                }
                                @if cap.is_some() { " " (action(csrf, "cap", &[("kind", kind), ("cap", "")], "lift", "")) }
                            }
                        }
                    }
                }
            }
            h3 { "Cap another kind" }
            form method="post" action="/act/cap" {
                input type="hidden" name="csrf" value=(csrf);
                input type="text" name="kind" placeholder="kind" required aria-label="kind";
                input type="number" name="cap" min="1" placeholder="cap" required aria-label="cap";
                button type="submit" { "set cap" }
            }
            h2 { "Groups" }
            @if v.top_groups.is_empty() && v.limited_groups.is_empty() {
                p.empty { "No job waits in a group (NewJob::with_group)." }
            } @else {
                table #groups {
                    tr { th { "queue" } th { "groups with the most ready jobs" } }
                    @for (queue, top) in &v.top_groups {
                        tr data-queue=(queue) {
                            td { (name(queue)) }
                            td { @for (i, g) in top.iter().enumerate() {
                                @if i > 0 { ", " } (name(&g.group)) " " (g.ready)
                            } }
                        }
                    }
                }
                @if !v.limited_groups.is_empty() {
                    table #limited-groups {
                        tr { th { "group" } th { "ready" } th { "running / cap" } th { "rate limit" } th { "" } }
                        @for g in &v.limited_groups {
                            tr data-group=(g.group) {
                                td { (name(&g.group)) }
                                td.n { (g.ready) }
                                td.n { @if let Some(cap) = g.limits.cap { (g.running) " / " (cap) } @else { "-" } }
                                td { @if let Some(r) = g.limits.rate { (r.jobs) " per " (age(r.per)) } @else { "-" } }
                                td { @if g.limits.paused { em.paused { "(paused)" } }
                                     @if g.parked { " out of the rotation until it can run" } }
                            }
                        }
                    }
                }
                p.meta { "Claims rotate over the groups with ready jobs; change a group's cap, rate \
                          limit or pause with " code { "palisade group" } "." }
            }
        },
    )
}

/// Worker beats grouped by process (host and pid), in the order their first beat is listed.
fn processes(workers: &[WorkerBeat]) -> Vec<Vec<&WorkerBeat>> {
    let mut out: Vec<Vec<&WorkerBeat>> = Vec::new();
    for w in workers {
        match out
            .iter_mut()
            .find(|p| p[0].host == w.host && p[0].pid == w.pid)
        {
            Some(p) => p.push(w),
            None => out.push(vec![w]),
        }
    }
    out
}

pub(crate) fn busy(
    frame: &Frame,
    workers: &[WorkerBeat],
    leases: &[(LeaseInfo, Option<String>)],
) -> Markup {
    layout(
        frame,
        html! {
            h2 { "Worker processes" }
            p.meta { "From their heartbeats (every 5 s; a worker missing three leaves the list). For \
                      display only: a paused worker's jobs are fenced, not trusted to its beat." }
            @if workers.is_empty() { p.empty { "No worker has reported in the last 15 s." } }
            @else {
                p.meta { "One row per process: its arbiters (threads, each a worker of its own) \
                          together. A process that drained leaves at once; one killed, after its \
                          beats lapse." }
                table #workers {
                    tr { th { "process" } th { "host" } th { "pid" } th { "version" } th { "queues" }
                         th { "running" } th { "arbiters" } th { "started" } th { "last beat" } }
                    @for p in processes(workers) {
                        @let first = p[0];
                        tr data-worker=(first.worker) data-pid=(first.pid) {
                            td { @for w in &p { span id={ "w-" (w.worker) } {} }
                                 (name(first.worker.rsplit_once('/').map_or(first.worker.as_str(), |(n, _)| n))) }
                            td { (name(&first.host)) }
                            td.n { (first.pid) }
                            td { (first.version) }
                            td { (name(&first.queues.join(", "))) }
                            td.n { (p.iter().map(|w| w.running).sum::<usize>()) " / "
                                   (p.iter().map(|w| w.concurrency).sum::<usize>()) }
                            td.n { (p.len()) }
                            td { (ago(first.started_ms, frame.now_ms)) }
                            td { (ago(p.iter().map(|w| w.seen_ms).max().unwrap_or(0), frame.now_ms)) }
                        }
                    }
                }
            }
            h2 { "Live leases" }
            @if leases.is_empty() { p.empty { "No job is running." } }
            @else {
                table #leases {
                    tr { th { "job" } th { "queue" } th { "kind" } th { "scope" } th { "token" } th { "age" }
                         th { "expires in" } th { "worker" } th { "progress" } }
                    @for (l, progress) in leases {
                        tr {
                            td { (job_link(l.job)) }
                            td { (name(&l.queue)) }
                            td { (name(&l.kind)) }
                            td { (name(l.scope.as_str())) }
                            td.n { (token(l.token.as_u64())) }
                            td.n { (age(l.age)) }
                            td.n { (age(l.expires_in)) }
                            td { (name(&l.worker)) }
                            td { code { (progress.as_deref().map(|p| clip(p, 120)).unwrap_or_default()) } }
                        }
                    }
                }
            }
        },
    )
}

/// Links to one page per queue, `current` marked.
fn queue_tabs(base: &str, queues: &[(String, u64)], current: Option<&str>) -> Markup {
    html! {
        p.pages {
            "Queue: "
            @for (q, n) in queues {
                @if Some(q.as_str()) == current { b { (name(q)) " (" (n) ")" } }
                @else { a href={ (base) "?queue=" (enc(q)) } { (name(q)) " (" (n) ")" } }
                " "
            }
        }
    }
}

/// Which page of a list of live jobs is shown, and whether another follows.
#[derive(Clone, Copy)]
pub(crate) struct Pager {
    pub page: usize,
    pub more: bool,
}

impl Pager {
    /// "Page N" with links to the previous and the next page of `path` for `queue`.
    fn links(self, path: &str, queue: &str) -> Markup {
        self.links_to(|page| format!("{path}?queue={}&page={page}", enc(queue)))
    }

    /// "Page N" with links to the previous and the next page, each at `to(page)`.
    fn links_to(self, to: impl Fn(usize) -> String) -> Markup {
        html! {
            @if self.page > 1 || self.more {
                p.pages #pager {
                    @if self.page > 1 { a #prev href=(to(self.page - 1)) { "← Previous" } " " }
                    "Page " (self.page)
                    @if self.more { " " a #next href=(to(self.page + 1)) { "Next →" } }
                }
            }
        }
    }
}

pub(crate) fn delayed(
    frame: &Frame,
    queues: &[(String, u64)],
    queue: Option<&str>,
    jobs: &[JobView],
    retries_only: bool,
    pager: Pager,
) -> Markup {
    let csrf = frame.csrf;
    let back = if retries_only { "retries" } else { "delayed" };
    layout(
        frame,
        html! {
            (queue_tabs("/delayed", queues, queue))
            @if let Some(queue) = queue {
                p { @if retries_only {
                        "Showing retries only (attempted before). "
                        a href={ "/delayed?queue=" (enc(queue)) } { "Show every delayed job" }
                    } @else {
                        "Showing every delayed job. "
                        a #retries-only href={ "/delayed?queue=" (enc(queue)) "&retries=1" } { "Show retries only" }
                    } }
                @if jobs.is_empty() { p.empty { "Nothing is delayed here." } }
                @else {
                    table #delayed {
                        tr { th { "due in" } th { "job" } th { "kind" } th { "attempts" } th { "payload" } th { "" } }
                        @for v in jobs {
                            tr data-job=(v.job.id) {
                                td.n { (v.due_in.map(age).unwrap_or_default()) }
                                td { (job_link(v.job.id)) }
                                td { (name(&v.job.kind)) }
                                td.n { (v.job.attempt) " / " (v.job.max_attempts)
                                    @if v.job.attempt > 0 { " " em { "retry" } } }
                                td { code { (clip(&v.job.payload, 160)) } }
                                td {
                                    (action(csrf, "run-now", &[("job", &v.job.id.to_string()), ("queue", queue), ("back", back)], "Run now", &format!("run-{}", v.job.id)))
                                    (action(csrf, "cancel", &[("job", &v.job.id.to_string()), ("queue", queue), ("back", back)], "Delete", &format!("delete-{}", v.job.id)))
                                }
                            }
                        }
                    }
                    @if !retries_only { (pager.links("/delayed", queue)) }
                    p.meta { "Delete cancels the job: it goes to the dead letters with the reason, so it \
                              can still be retried from there." }
                }
            } @else { p.empty { "Choose a queue." } }
        },
    )
}

/// A queue's ready jobs, next to be claimed first, each with how long it has waited; and
/// the way to clear the queue.
pub(crate) fn ready(
    frame: &Frame,
    queues: &[(String, u64)],
    queue: Option<&str>,
    jobs: &[JobView],
    pager: Pager,
) -> Markup {
    let csrf = frame.csrf;
    layout(
        frame,
        html! {
            (queue_tabs("/ready", queues, queue))
            @if let Some(queue) = queue {
                @if jobs.is_empty() { p.empty { "Nothing is ready here (a group's ready jobs are counted on the Queues page, not listed)." } }
                @else {
                    table #ready {
                        tr { th { "waiting" } th { "job" } th { "kind" } th { "priority" } th { "attempts" } th { "payload" } th { "" } }
                        @for v in jobs {
                            tr data-job=(v.job.id) {
                                td.n { @if let Some(ms) = v.details.enqueued_ms { (ago(ms, frame.now_ms)) } }
                                td { (job_link(v.job.id)) }
                                td { (name(&v.job.kind)) }
                                td.n { (v.details.priority) }
                                td.n { (v.job.attempt) " / " (v.job.max_attempts) }
                                td { code { (clip(&v.job.payload, 160)) } }
                                td { (action(csrf, "cancel", &[("job", &v.job.id.to_string()), ("queue", queue), ("back", "ready")], "Delete", &format!("delete-{}", v.job.id))) }
                            }
                        }
                    }
                    (pager.links("/ready", queue))
                    @let counted = queues.iter().find(|(q, _)| q == queue).map_or(0, |(_, n)| *n);
                    p.meta { "Next to be claimed first: " (jobs.len()) " shown of " (counted) " counted ready \
                              (a group's ready jobs, and delayed jobs due but not yet moved, are counted, not \
                              listed here). Delete cancels the job: it goes to the dead letters with the reason, \
                              so it can still be retried from there." }
                }
                p { a #clear href={ "/clear/confirm?queue=" (enc(queue)) } { "Clear this queue…" }
                    " (cancel every ready and delayed job, after a confirmation page that names the number)" }
            } @else { p.empty { "Choose a queue." } }
        },
    )
}

/// Asks before clearing `queue` of its `ready` and `delayed` jobs.
pub(crate) fn confirm_clear(
    frame: &Frame,
    queue: &str,
    ready: u64,
    delayed: u64,
    asof: u64,
) -> Markup {
    let csrf = frame.csrf;
    let n = ready + delayed;
    layout(
        frame,
        html! {
            p.warn { "Cancel all " b { (n) } " job(s) of queue " (name(queue)) " (" (ready) " ready, "
                (delayed) " delayed)? Each goes to the dead letters with the reason \"queue cleared \
                through the console\", where a retry brings it back. Jobs enqueued after this page \
                was shown, a group's ready jobs (counted among the ready) and jobs waiting behind \
                their scope stay." }
            form method="post" action="/act/queue-clear" {
                input type="hidden" name="csrf" value=(csrf);
                input type="hidden" name="queue" value=(queue);
                input type="hidden" name="expected" value=(n);
                input type="hidden" name="asof" value=(asof);
                input type="hidden" name="confirm" value="yes";
                button #confirm type="submit" { "Cancel " (n) " job(s)" }
            }
            a href={ "/ready?queue=" (enc(queue)) } { "Back" }
        },
    )
}

pub(crate) struct DeadView {
    pub queues: Vec<(String, u64)>,
    /// Queues left out until repaired, with why.
    pub unreadable: Vec<(String, String)>,
    pub queue: Option<String>,
    pub search: String,
    /// 1-based page, newest first, and how many pages.
    pub page: usize,
    pub pages: usize,
    pub rows: Vec<DeadJob>,
    /// The search read only the newest this many records.
    pub searched: Option<usize>,
    /// How many of `rows` (the first ones: newest first) are among the queue's newest
    /// [`DEAD_JOB_SEARCH`](palisade::store::DEAD_JOB_SEARCH), which one-job actions reach.
    pub actionable: usize,
}

pub(crate) fn dead(frame: &Frame, v: &DeadView) -> Markup {
    let csrf = frame.csrf;
    let total: u64 = v.queues.iter().map(|(_, n)| n).sum();
    layout(
        frame,
        html! {
            (unreadable(&v.unreadable))
            @if v.queues.is_empty() { p.empty { "No dead jobs." } }
            @else { (queue_tabs("/dead", &v.queues, v.queue.as_deref())) }
            @if v.queue.is_none() && total > 0 { p { "Newest dead jobs of every queue:" } }
            @if let Some(queue) = &v.queue {
                form method="get" action="/dead" {
                    input type="hidden" name="queue" value=(queue);
                    input type="search" name="q" value=(v.search) placeholder="id, kind, reason or payload" aria-label="search";
                    button type="submit" { "Search" }
                }
                @if let Some(n) = v.searched { p.meta { "Searched the newest " (n) " dead jobs of this queue." } }
                p {
                    a #retry-all href={ "/dead/confirm?action=retry&queue=" (enc(queue)) } { "Retry all…" } " · "
                    a #purge-all href={ "/dead/confirm?action=purge&queue=" (enc(queue)) } { "Delete all…" }
                }
                // A sweep of those that match (kind, reason, age), asked on the confirm page.
                form #sweep method="get" action="/dead/confirm" {
                    input type="hidden" name="queue" value=(queue);
                    select name="action" aria-label="action" {
                        option value="retry" { "Retry" } option value="purge" { "Delete" }
                    }
                    " those of kind " input type="text" name="kind" size="12" aria-label="kind";
                    " whose reason contains (as written, case and all) " input type="text" name="reason" size="16" aria-label="reason";
                    " that died more than " input type="text" name="older" size="5" placeholder="2h" aria-label="age";
                    " ago " button #sweep-go type="submit" { "…" }
                }
            }
            @if !v.rows.is_empty() {
                table #dead {
                    tr { th { "died" } th { "queue" } th { "job" } th { "kind" } th { "attempts" } th { "reason" }
                         th { "payload" } th { "" } }
                    @for (i, d) in v.rows.iter().enumerate() {
                        tr data-job=(d.job.id) {
                            td { @if let Some(ms) = d.died_ms { (ago(ms, frame.now_ms)) } @else { "-" } }
                            td { (name(&d.job.queue)) }
                            td { (job_link(d.job.id)) }
                            td { (name(&d.job.kind)) }
                            td.n { (d.job.attempt) }
                            td.reason { (clip(&d.reason, 300)) }
                            td { code { (clip(&d.job.payload, 160)) } }
                            td {
                                @if i < v.actionable {
                                    (action(csrf, "dead-retry", &[("queue", &d.job.queue), ("job", &d.job.id.to_string())], "Retry", &format!("retry-{}", d.job.id)))
                                    (action(csrf, "dead-delete", &[("queue", &d.job.queue), ("job", &d.job.id.to_string())], "Delete", &format!("delete-{}", d.job.id)))
                                } @else {
                                    span.meta title="one-job actions reach the newest 5,000 of a queue; Retry all and Delete all reach every one" { "older than the newest 5,000" }
                                }
                            }
                        }
                    }
                }
            } @else if v.queue.is_some() { p.empty { "No dead job here" @if !v.search.is_empty() { " matches" } "." } }
            @if v.pages > 1 {
                @if let Some(queue) = &v.queue {
                    p.pages #pages {
                        "Page "
                        @for p in 1..=v.pages {
                            @if p == v.page { b { (p) } }
                            @else if p == 1 || p == v.pages || p.abs_diff(v.page) <= 3 {
                                a href={ "/dead?queue=" (enc(queue)) "&q=" (enc(&v.search)) "&page=" (p) } { (p) }
                            }
                            " "
                        }
                    }
                }
            }
        },
    )
}

/// The confirmation a bulk action asks for: how many (with the filter, at most how many), and
/// a form that carries that number and the filter.
pub(crate) fn confirm(
    frame: &Frame,
    queue: &str,
    retry: bool,
    n: u64,
    filter: &super::FilterFields,
) -> Markup {
    let csrf = frame.csrf;
    let verb = if retry { "Retry" } else { "Delete" };
    let field = |v: &Option<String>| v.clone().unwrap_or_default();
    let filtered = filter
        .kind
        .iter()
        .chain(&filter.reason)
        .chain(&filter.older)
        .any(|v| !v.trim().is_empty());
    layout(
        frame,
        html! {
            @if filtered {
                p.warn { (verb) " every dead job of queue " (name(queue)) " that matches" }
                ul #filter {
                    @if let Some(k) = filter.kind.as_deref().filter(|k| !k.trim().is_empty()) { li { "kind " code { (k) } } }
                    @if let Some(r) = filter.reason.as_deref().filter(|r| !r.trim().is_empty()) { li { "reason contains " code { (clip(r, 200)) } } }
                    @if let Some(o) = filter.older.as_deref().filter(|o| !o.trim().is_empty()) { li { "died more than " (clip(o, 40)) " ago" } }
                }
                p.warn { "— at most " b { (n) } " (all its dead letters now); the page after says how many matched. "
                    @if retry { "They become ready with fresh attempts." } @else { "They are gone for good." } }
            } @else {
                p.warn { (verb) " all " b { (n) } " dead job(s) of queue " (name(queue)) "? "
                    @if retry { "They become ready with fresh attempts." }
                    @else { "They are gone for good." } }
            }
            p.meta { "It runs in short steps (one script over at most 250 dead letters each), so Redis is never held long." }
            form method="post" action={ "/act/" (if retry { "dead-retry-all" } else { "dead-purge-all" }) } {
                input type="hidden" name="csrf" value=(csrf);
                input type="hidden" name="queue" value=(queue);
                input type="hidden" name="expected" value=(n);
                input type="hidden" name="confirm" value="yes";
                input type="hidden" name="kind" value=(field(&filter.kind));
                input type="hidden" name="reason" value=(field(&filter.reason));
                input type="hidden" name="older" value=(field(&filter.older));
                button #confirm type="submit" { (verb) @if filtered { " matching" } @else { " " (n) " job(s)" } }
            }
            a href={ "/dead?queue=" (enc(queue)) } { "Cancel" }
        },
    )
}

/// A request the console will not act on, with why and the way back.
pub(crate) fn refused(frame: &Frame, why: &str, back: &str) -> Markup {
    layout(
        frame,
        html! {
            p.warn #refused { (clip(why, 300)) }
            a href=(back) { "Back" }
        },
    )
}

pub(crate) fn flows(
    frame: &Frame,
    running: u64,
    listed: &[(FlowId, u64, Option<FlowStatus>)],
) -> Markup {
    layout(
        frame,
        html! {
            p { b #flows-running { (running) } " flow(s) running. Oldest first:" }
            @if listed.is_empty() { p.empty { "No flow is running." } }
            @else {
                table #flows {
                    tr { th { "flow" } th { "created" } th { "steps" } th { "released" } th { "completed" }
                         th { "dead" } th { "skipped" } th { "waiting" } }
                    @for (id, created, status) in listed {
                        tr data-flow=(id) {
                            td { a href={ "/flow/" (id) } { code { (id) } } }
                            td { (ago(*created, frame.now_ms)) }
                            @if let Some(s) = status {
                                @let ended = s.count(StepEnd::Completed) + s.count(StepEnd::Dead) + s.count(StepEnd::Skipped);
                                td.n { (s.steps) } td.n { (s.released) } td.n { (s.count(StepEnd::Completed)) }
                                td.n { (s.count(StepEnd::Dead)) } td.n { (s.count(StepEnd::Skipped)) }
                                td.n { (s.steps.saturating_sub(ended)) }
                            } @else { td colspan="6" { "not kept here" } }
                        }
                    }
                }
            }
        },
    )
}

/// A flow: its state, and each step in run order with where it is.
pub(crate) fn flow(frame: &Frame, status: &FlowStatus, steps: &[StepStatus]) -> Markup {
    let state = StepState::as_str;
    layout(
        frame,
        html! {
            p { "State " b #flow-state { (format!("{:?}", status.state).to_lowercase()) } ": "
                (status.steps) " step(s), " (status.released) " released, "
                (status.count(StepEnd::Completed)) " completed, " (status.count(StepEnd::Dead)) " dead, "
                (status.count(StepEnd::Skipped)) " skipped." }
            @if status.state == palisade::FlowState::Running {
                (action(frame.csrf, "flow-cancel", &[("flow", &status.id.to_string())], "Cancel this flow", "flow-cancel"))
                p.meta { "Cancelling decides every step not decided yet as dead unrun and cancels the \
                          step jobs running now; steps that ended keep their end." }
            }
            @if !steps.is_empty() {
                table #steps {
                    tr { th { "#" } th { "step" } th { "state" } th { "runs after" } th { "job" } }
                    @for (i, s) in steps.iter().enumerate() {
                        tr data-step=(s.name) data-state=(state(s.state)) {
                            td.n { (i + 1) }
                            td { (name(&s.name)) }
                            td.state { (state(s.state)) }
                            td { @if s.after.is_empty() { "-" } @else {
                                @for (j, a) in s.after.iter().enumerate() {
                                    @if j > 0 { ", " } (name(a))
                                }
                            } }
                            td { (job_link(s.job)) }
                        }
                    }
                }
                p.meta { "In run order: each step after the steps it runs after. Waiting: a step it \
                          runs after has not ended; released: its job is ready, delayed or running \
                          (its page says which)." }
            }
        },
    )
}

/// A schedule row: the spec, when it last fired (handled through), and its next tick.
pub(crate) fn schedules(
    frame: &Frame,
    rows: &[(ScheduleSpec, Option<i64>, Option<i64>)],
    paused: &[String],
) -> Markup {
    let csrf = frame.csrf;
    let at = |ms: Option<i64>| match ms.and_then(|ms| u64::try_from(ms).ok()) {
        Some(ms) => ago(ms, frame.now_ms),
        None => html! { "-" },
    };
    layout(
        frame,
        html! {
            p.meta { "Schedules kept in the coordinator (`palisade schedule add`). A worker binary's \
                      own schedules run from its code and are listed by `palisade schedule list`." }
            @if rows.is_empty() { p.empty { "No schedule is kept." } }
            @else {
                table #schedules {
                    tr { th { "name" } th { "pattern" } th { "time zone" } th { "kind" } th { "queue" }
                         th { "handled through" } th { "next tick" } th { "" } }
                    @for (spec, mark, next) in rows {
                        @let is_paused = paused.contains(&spec.name);
                        tr data-schedule=(spec.name) {
                            td { (name(&spec.name)) @if is_paused { " " em.paused { "(paused)" } } }
                            td { code { (spec.pattern) } }
                            td { (spec.time_zone) }
                            td { (name(&spec.job.kind)) }
                            td { (name(&spec.job.queue)) }
                            td { (at(*mark)) }
                            td { @if is_paused { "paused" } @else { (at(*next)) } }
                            td { (action(csrf, "enqueue-now", &[("schedule", &spec.name)], "Enqueue now", &format!("enqueue-{}", spec.name)))
                                 @if is_paused {
                                     (action(csrf, "schedule-resume", &[("schedule", &spec.name)], "Resume", &format!("resume-{}", spec.name)))
                                 } @else {
                                     (action(csrf, "schedule-pause", &[("schedule", &spec.name)], "Pause", &format!("pause-{}", spec.name)))
                                 }
                                 (action(csrf, "schedule-remove", &[("schedule", &spec.name)], "Remove", &format!("remove-{}", spec.name))) }
                        }
                    }
                }
                p.meta { "Enqueue now adds one job of the schedule outside its ticks; the ticks go on as before. \
                          Remove stops it (a worker whose binary declares it in code keeps it again at start)." }
            }
        },
    )
}

fn rejection_table(rows: &[RejectionNote], frame: &Frame) -> Markup {
    html! {
        @if rows.is_empty() { p.empty { "None recorded." } }
        @else {
            table #rejections {
                tr { th { "when" } th { "sink" } th { "scope" } th { "token presented" } th { "reason" } th { "detail" }
                     th { "job" } th { "lease" } th { "worker" } th { "trace" } }
                @for r in rows {
                    tr {
                        td { (ago(r.at_ms, frame.now_ms)) }
                        td { (name(&r.sink)) }
                        td { (name(&r.scope)) }
                        td.n { (token(r.token)) }
                        td { (r.reason) }
                        td { (clip(&r.detail, 300)) }
                        // (Absent in a note an earlier version wrote.)
                        td.job { @if let Some(job) = r.job { (job_link(job)) } }
                        td.lease { @if let Some(lease) = r.lease { code title=(lease) { (clip(&lease.to_string(), 8)) } } }
                        td.worker { @if let Some(worker) = &r.worker {
                            a href={ "/busy#w-" (enc(worker)) } { (name(worker)) } } }
                        td { (trace_link(r.trace_id.as_deref(), frame.trace_url)) }
                    }
                }
            }
        }
    }
}

/// A trace id, linked where `--trace-url` says traces are shown. Only a 32-hex-digit id is
/// put in a link (a note is data another program could have written).
fn trace_link(trace_id: Option<&str>, url: Option<&str>) -> Markup {
    let Some(id) = trace_id.filter(|id| !id.is_empty()) else {
        return html! {};
    };
    let linkable = id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit());
    html! {
        @match url.filter(|_| linkable) {
            Some(url) => a href=(url.replace("{trace_id}", id)) rel="noreferrer" { code { (id) } },
            None => code { (clip(id, 40)) },
        }
    }
}

/// What the search box found for a text that is not a whole job id.
pub(crate) fn search(
    frame: &Frame,
    text: &str,
    searched: bool,
    found: &[(JobId, &str, String)],
) -> Markup {
    layout(
        frame,
        html! {
            p #search-help { "The box takes a whole job id: 32 hex digits in groups of 8-4-4-4-12, as \
                   every table here prints it (" code { "2f1c9a3e-…" } "). " code { (clip(text, 80)) }
                   " is not one." }
            @if !searched {
                p.empty { "Give at least four hex digits of an id to look for it among the running \
                           jobs and the newest " (crate::reads::DEAD_SCAN) " dead letters of each queue." }
            } @else if found.is_empty() {
                p.empty #search-none { "No running job and none of the newest " (crate::reads::DEAD_SCAN)
                    " dead letters of any queue has an id containing it. A job waiting or delayed is \
                    found by its whole id only (its queue's page lists the delayed ones)." }
            } @else {
                table #search {
                    tr { th { "job" } th { "where" } th { "queue" } }
                    @for (id, state, queue) in found {
                        tr { td { (job_link(*id)) } td { (state) } td { (name(queue)) } }
                    }
                }
            }
        },
    )
}

pub(crate) fn rejections(frame: &Frame, rows: &[RejectionNote]) -> Markup {
    layout(
        frame,
        html! {
            p { "Writes a fenced sink refused: a stale holder (its lease had expired and a newer one \
                 wrote), a token granted twice, or a mutation that did not fit. Newest first. A token \
                 is an epoch (raised when the coordinator may have lost its counters) and a counter \
                 within it; a newer token is a higher epoch, or the same epoch and a higher counter." }
            (rejection_table(rows, frame))
        },
    )
}

/// Everything known about one job.
pub(crate) struct JobPage {
    pub id: JobId,
    pub live: Option<JobView>,
    pub lease: Option<LeaseInfo>,
    pub dead: Option<DeadJob>,
    pub completed: Option<palisade::CompletedJob>,
    pub result: Option<String>,
    pub progress: Option<String>,
}

/// JSON pretty-printed when it parses, as is otherwise.
fn pretty(json: &str) -> String {
    serde_json::from_str::<serde_json::Value>(json)
        .ok()
        .and_then(|v| serde_json::to_string_pretty(&v).ok())
        .unwrap_or_else(|| json.to_owned())
}

pub(crate) fn job(frame: &Frame, p: &JobPage) -> Markup {
    let csrf = frame.csrf;
    let id = p.id.to_string();
    let job = p
        .live
        .as_ref()
        .map(|v| &v.job)
        .or(p.completed.as_ref().map(|c| &c.job))
        .or(p.dead.as_ref().map(|d| &d.job));
    let details = p
        .live
        .as_ref()
        .map(|v| &v.details)
        .or(p.completed.as_ref().map(|c| &c.details))
        .or(p.dead.as_ref().map(|d| &d.details));
    let state = match (&p.live, &p.dead) {
        (Some(v), _) => format!("{:?}", v.state).to_lowercase(),
        _ if p.completed.is_some() => "completed".into(),
        (None, Some(_)) => "dead".into(),
        (None, None) if p.result.is_some() => "completed".into(),
        (None, None) => "not found".into(),
    };
    layout(
        frame,
        html! {
            p { "State " b #job-state { (state) }
                @if let Some(due) = p.live.as_ref().and_then(|v| v.due_in) {
                    @let at = frame.now_ms.saturating_add(u64::try_from(due.as_millis()).unwrap_or(u64::MAX));
                    @let next = if p.live.as_ref().is_some_and(|v| v.job.attempt > 0) { "next attempt" } else { "due" };
                    ", " (next) " in " (age(due)) " (" span #due-at { (when(at)) } ")" } }
            @if let Some(job) = job {
                table #job {
                    tr { th { "queue" } td { (name(&job.queue)) } }
                    tr { th { "kind" } td { (name(&job.kind)) } }
                    tr { th { "scope" } td { (name(job.scope.as_str())) } }
                    @if let Some(d) = details { tr { th { "priority" } td #priority { (d.priority) } } }
                    @if let Some(ms) = details.and_then(|d| d.enqueued_ms) {
                        tr { th { "enqueued" } td #enqueued-at { (when(ms)) " (" (ago(ms, frame.now_ms)) ")" } }
                    }
                    @if let (Some(ms), Some(_)) = (details.and_then(|d| d.started_ms), p.live.as_ref()) {
                        tr { th { "attempt started" } td #started-at { (when(ms)) " (" (ago(ms, frame.now_ms)) ")" } }
                    }
                    @if let Some(c) = &p.completed {
                        tr { th { "completed" } td #completed-at { (when(c.completed_ms)) " (" (ago(c.completed_ms, frame.now_ms)) ")" } }
                    }
                    @if let Some(ms) = p.dead.as_ref().and_then(|d| d.died_ms) {
                        tr { th { "died" } td #died-at { (when(ms)) " (" (ago(ms, frame.now_ms)) ")" } }
                    }
                    tr { th { "attempts" } td { (job.attempt) " of " (job.max_attempts) } }
                    tr { th { "stalls" } td { (job.stalls) " of " (job.max_stalls) " allowed" } }
                    tr { th { "snoozes" } td { (job.snoozes) " of " (job.max_snoozes) " allowed" } }
                    @if let Some(group) = &job.group { tr { th { "group" } td { (name(group)) } } }
                    @if let Some(timeout) = job.timeout {
                        tr { th { "timeout" } td { (age(timeout)) " per attempt" } }
                    }
                    @if let Some(deadline) = job.deadline_ms {
                        tr { th { "deadline" } td { "not started after " (crate::when(deadline)) } }
                    }
                    @if let Some(step) = &job.flow {
                        tr { th { "flow" } td { a href={ "/flow/" (step.flow) } { code { (step.flow) } } " step " (name(&step.step)) } }
                    }
                }
                h2 { "Payload" }
                pre #payload { (pretty(&job.payload)) }
            } @else if p.result.is_none() {
                p.empty { "No live, completed or dead job has this id (completed jobs are kept for the \
                           workers' --keep-completed, a day by default; dead letters are searched among each \
                           queue's newest " (crate::reads::DEAD_SCAN) ")." }
            }
            @if let Some(d) = details.filter(|d| !d.attempts.is_empty()) {
                h2 { "Attempts" }
                table #attempts {
                    tr { th { "#" } th { "started" } th { "took" } th { "outcome" } th { "error" } }
                    @for a in &d.attempts {
                        tr {
                            td { (a.number) }
                            td { @if let Some(ms) = a.started_ms { (when(ms)) } @else { "?" } }
                            td { @if let Some(ms) = a.started_ms { (age(Duration::from_millis(a.ended_ms.saturating_sub(ms)))) } }
                            td.outcome { (a.outcome.as_str()) }
                            td { @if let Some(e) = &a.error { span.warn { (e) } } }
                        }
                    }
                }
                p.meta { "Each ended attempt, oldest first (the newest " (palisade::limits::MAX_ATTEMPTS_KEPT) " are kept, each error clipped)." }
            }
            @if let Some(l) = &p.lease {
                h2 { "Lease" }
                table #lease {
                    tr { th { "lease" } td { code { (l.lease) } } }
                    tr { th { "token" } td { (token(l.token.as_u64())) } }
                    tr { th { "worker" } td { (name(&l.worker)) } }
                    tr { th { "held for" } td { (age(l.age)) } }
                    tr { th { "expires in" } td { (age(l.expires_in)) } }
                }
            }
            @if let Some(error) = p.live.as_ref().and_then(|v| v.last_error.as_ref()) {
                h2 { "Last error" }
                p.warn #last-error { (error) }
                p.meta { "The reason its last retried attempt failed." }
            }
            @if let Some(d) = &p.dead {
                h2 { "Why it died" }
                p.warn #reason { (d.reason) }
                @if let Some(ms) = d.died_ms { p.meta { "Died " (ago(ms, frame.now_ms)) "." } }
            }
            @if let Some(progress) = &p.progress { h2 { "Progress" } pre #progress { (pretty(progress)) } }
            @if let Some(result) = &p.result { h2 { "Result" } pre #result { (pretty(result)) } }
            h2 { "Actions" }
            p {
                @if let Some(v) = &p.live {
                    @if v.state == JobState::Delayed { (action(csrf, "run-now", &[("job", &id)], "Run now", "run-now")) }
                    (action(csrf, "cancel", &[("job", &id)], "Cancel", "cancel"))
                }
                @if let Some(d) = &p.dead {
                    (action(csrf, "dead-retry", &[("queue", &d.job.queue), ("job", &id)], "Retry", "retry"))
                    (action(csrf, "dead-delete", &[("queue", &d.job.queue), ("job", &id)], "Delete", "delete"))
                }
                @if p.live.is_none() && p.dead.is_none() { span.empty { "None: the job is not queued, running or dead." } }
            }
            p.meta { "The console shows a job's current lease; the lease and token of each earlier \
                      attempt are not kept (the fence journal on " a href="/rejections" { "Fence rejections" }
                      " keeps every token it refused)." }
        },
    )
}
