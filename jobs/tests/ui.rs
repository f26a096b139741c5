//! The operator console (`palisade ui`) in a real headless Chromium, driven through
//! chromedriver (WebDriver), against a private Redis holding known state: every page shows the
//! coordinator's numbers, and every action (retry one, delete one, pause, resume, run a
//! delayed job now, a confirmed bulk retry) changes the store as it says.
//!
//! `PALISADE_UI_SCREENSHOTS=dir` also saves a screenshot of each page (docs/console-*.png).

use palisade::{ControlStore, Inspect, QueueAdmin, RecordStore};
use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fantoccini::{Client, ClientBuilder, Locator};
use palisade::{
    Client as Producer, FencingToken, Flow, FlowId, HistorySample, JobId, LeaseStore, NewJob,
    QueueCounts, RedisLeaseStore, RejectionNote, Schedule, Settlement, WorkerBeat,
};
use palisade_testkit::RedisServer;
use palisade_testkit::{free_ports, http_get, wait_for};

const BIN: &str = env!("CARGO_BIN_EXE_palisade");

/// Kills the process when the test ends, pass or fail.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn ui(redis: &RedisServer, port: u16, extra: &[&str]) -> Reaped {
    let child = Command::new(BIN)
        .args(["ui", "--redis", &redis.url(), "--listen"])
        .arg(format!("127.0.0.1:{port}"))
        .args(extra)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    wait_for("the ui to serve", Duration::from_secs(20), || {
        http_get(port, "/healthz").is_some()
    });
    Reaped(child)
}

/// Known state. In `default`: two ready jobs, one running under a long lease, one dead with a
/// reason, one delayed an hour and one waiting an hour for its retry. In `bulk`: [`BULK`] dead
/// jobs. One fence rejection in the journal, one worker heartbeat, one kept schedule and one
/// running flow (its first step ready in `flows`).
struct Seeded {
    flow: FlowId,
    dead: JobId,
    delayed: JobId,
    retry: JobId,
    running: JobId,
    bulk: Vec<JobId>,
    /// Completed on its second attempt (the first retried), its record kept.
    completed: JobId,
}

/// Dead letters of queue `bulk` (one is deleted, then the confirmed retry takes 1,000).
const BULK: usize = 1_001;

async fn seed(redis: &RedisServer, store: &RedisLeaseStore) -> Seeded {
    let job = |to: &str| NewJob::raw("email.send", format!("{{\"to\":\"{to}\"}}"));
    let ids = store
        .enqueue(vec![
            job("a@x"),
            job("b@x"),
            job("c@x"),
            job("d@x"),
            job("e@x"),
        ])
        .await
        .unwrap();
    let claims = store
        .claim("default", "host-1/0", 5, Duration::from_secs(600))
        .await
        .unwrap();
    let by_id = |id: JobId| claims.iter().find(|c| c.job.id == id).unwrap().lease.id;
    let reason = "card declined by the bank".to_owned();
    let settled = store
        .settle(vec![
            (by_id(ids[1]), Settlement::Dead { reason }),
            (
                by_id(ids[3]),
                Settlement::Retry {
                    delay: Duration::from_secs(3600),
                    reason: "smtp timeout".into(),
                },
            ),
            (by_id(ids[2]), Settlement::Release),
            (by_id(ids[4]), Settlement::Release),
        ])
        .await
        .unwrap();
    assert!(settled.iter().all(Result::is_ok), "{settled:?}");
    let delayed = store
        .enqueue(vec![job("later@x").with_delay(Duration::from_secs(3600))])
        .await
        .unwrap()[0];
    // (1,001: one deleted, the confirmed bulk retry below is the whole-set retry of
    // 1,000.)
    let bulk_jobs: Vec<NewJob> = (0..BULK)
        .map(|i| NewJob::raw("report.build", format!("{{\"n\":{i}}}")).with_queue("bulk"))
        .collect();
    store.enqueue(bulk_jobs).await.unwrap();
    let mut bulk = Vec::new();
    while bulk.len() < BULK {
        let claims = store
            .claim("bulk", "host-1/0", 250, Duration::from_secs(600))
            .await
            .unwrap();
        let dead = claims.iter().map(|c| {
            let reason = "no template".to_owned();
            (c.lease.id, Settlement::Dead { reason })
        });
        let settled = store.settle(dead.collect()).await.unwrap();
        assert!(settled.iter().all(Result::is_ok), "{settled:?}");
        // In the order they died: the last is the newest dead letter.
        bulk.extend(claims.iter().map(|c| c.job.id));
    }
    store
        .note_rejections(vec![RejectionNote {
            at_ms: 1_790_000_000_000,
            sink: "ledger".into(),
            scope: "account:42".into(),
            token: FencingToken::new(0, 71).as_u64(),
            reason: "stale_token".into(),
            detail: "stale token 71: the sink already accepted 73".into(),
            trace_id: Some("4bf92f3577b34da6a3ce929d0e0e4736".into()),
            job: Some(ids[0]),
            lease: Some(palisade::LeaseId::new()),
            worker: Some("host-1/0".into()),
        }])
        .await
        .unwrap();
    // One process with two arbiters: two beats, one row on the Busy page.
    for (arbiter, running) in [(0, 1), (1, 2)] {
        store
            .beat(
                WorkerBeat {
                    worker: format!("host-1/{arbiter}"),
                    host: "host-1".into(),
                    pid: 4242,
                    version: "0.1.0".into(),
                    queues: vec!["default".into(), "bulk".into()],
                    concurrency: 16,
                    running,
                    started_ms: 1_790_000_000_000,
                    seen_ms: 0,
                    formats: None,
                    retry: Some("1s doubling to 6h".into()),
                },
                Duration::from_secs(600),
            )
            .await
            .unwrap();
    }
    let spec = Schedule::new(
        "nightly-report",
        "0 3 * * *",
        NewJob::raw("report.build", "{}").with_queue("bulk"),
    )
    .unwrap()
    .spec()
    .clone();
    store.put_schedule(spec).await.unwrap();
    // Two hours of history samples a minute apart: 20 to 50 completions a minute, a death
    // every 13th minute.
    let now = store.now_ms().await.unwrap() as u64;
    let (mut completed, mut died) = (0, 0);
    for minute in 0..120u64 {
        completed += 20 + (minute % 7) * 5;
        died += u64::from(minute % 13 == 0);
        let sample = HistorySample {
            at_ms: now - (119 - minute) * 60_000,
            counts: QueueCounts {
                completed,
                died,
                ..QueueCounts::default()
            },
            oldest_ready_ms: (minute % 11) * 400,
        };
        store.note_history(sample).await.unwrap();
    }
    // A job of queue `kept` that failed once ("flaky upstream") and then completed.
    let completed = store
        .enqueue(vec![job("f@x").with_queue("kept").with_priority(5)])
        .await
        .unwrap()[0];
    for settlement in [
        Settlement::Retry {
            delay: Duration::ZERO,
            reason: "flaky upstream".into(),
        },
        Settlement::completed(),
    ] {
        let c = store
            .claim("kept", "host-1/0", 1, Duration::from_secs(600))
            .await
            .unwrap()
            .remove(0);
        let settled = store.settle(vec![(c.lease.id, settlement)]).await.unwrap();
        assert!(settled.iter().all(Result::is_ok), "{settled:?}");
    }
    let client = Producer::connect(&redis.url(), "palisade").await.unwrap();
    let flow = Flow::chain([
        NewJob::raw("step.one", "{}").with_queue("flows"),
        NewJob::raw("step.two", "{}").with_queue("flows"),
    ]);
    let flow = client.create_flow(&flow).await.unwrap();
    Seeded {
        flow,
        dead: ids[1],
        delayed,
        retry: ids[3],
        running: ids[0],
        bulk,
        completed,
    }
}

async fn cell(c: &Client, queue: &str, state: &str) -> String {
    c.find(Locator::Css(&format!(
        "tr[data-queue='{queue}'] td[data-state='{state}']"
    )))
    .await
    .unwrap()
    .text()
    .await
    .unwrap()
}

async fn text(c: &Client, css: &str) -> String {
    c.find(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("{css}: {e}"))
        .text()
        .await
        .unwrap()
}

/// Sends `request` (HTTP/1.0, so the server closes when done) and returns the whole response.
fn exchange(port: u16, request: &str) -> String {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response
}

/// Issue 58 scope 6: 5,000 queues made the Queues page 5.5 MB and read every queue's counts
/// on each load. It is paged by name, 50 a page, reading only its own queues.
#[test]
fn five_thousand_queues_are_paged_by_name() {
    let redis = RedisServer::start();
    let names: Vec<String> = (0..5000).map(|i| format!("q{i:04}")).collect();
    let mut sadd = vec!["SADD", "{palisade}:queues"];
    sadd.extend(names.iter().map(String::as_str));
    redis.cli(&sadd).unwrap();
    let [port] = free_ports();
    let _ui = ui(&redis, port, &[]);
    let page = |n: usize| {
        let response = exchange(
            port,
            &format!("GET /queues?page={n} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\r\n"),
        );
        assert!(response.starts_with("HTTP/1.0 200"), "{response}");
        response
    };
    let listed = |html: &str| -> Vec<String> {
        html.split("data-queue=\"")
            .skip(1)
            .map(|rest| rest.split('"').next().unwrap().to_owned())
            .collect()
    };
    let first = page(1);
    assert_eq!(listed(&first), names[..50]);
    assert!(first.contains("id=\"next\"") && !first.contains("id=\"prev\""));
    assert!(first.contains("5000 queues by name"), "{first}");
    // (Each row carries its forms; 50 of them, not 5,000.)
    assert!(first.len() < 300_000, "{} bytes", first.len());
    let last = page(100);
    assert_eq!(listed(&last), names[4950..]);
    assert!(!last.contains("id=\"next\"") && last.contains("id=\"prev\""));
}

/// A raw form POST with `extra` header lines (each ending in CRLF); returns the status line.
fn post(port: u16, path: &str, form: &str, extra: &str) -> String {
    let response = exchange(
        port,
        &format!(
            "POST {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n{extra}Content-Type: \
             application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{form}",
            form.len()
        ),
    );
    response.lines().next().unwrap_or_default().to_owned()
}

/// Opens `path`, waits for its heading, and saves a screenshot as
/// `$PALISADE_UI_SCREENSHOTS/console-<name>.png` when that is set (docs/console-*.png).
async fn visit(c: &Client, port: u16, path: &str, name: &str) {
    c.goto(&format!("http://127.0.0.1:{port}{path}"))
        .await
        .unwrap();
    c.wait()
        .at_most(Duration::from_secs(10))
        .for_element(Locator::Css("h1"))
        .await
        .unwrap_or_else(|e| panic!("{path}: {e}"));
    if let Ok(dir) = std::env::var("PALISADE_UI_SCREENSHOTS") {
        let png = c.screenshot().await.unwrap();
        std::fs::write(format!("{dir}/console-{name}.png"), png).unwrap();
    }
}

/// Follows the link `link`, waits for the element `#id` of the page it leads to, and saves a
/// screenshot as `console-<name>.png` as `visit` does.
async fn follow(c: &Client, link: Locator<'_>, id: &str, name: &str) {
    c.find(link).await.unwrap().click().await.unwrap();
    c.wait()
        .at_most(Duration::from_secs(10))
        .for_element(Locator::Id(id))
        .await
        .unwrap_or_else(|e| panic!("#{id} after a link: {e}"));
    if let Ok(dir) = std::env::var("PALISADE_UI_SCREENSHOTS") {
        let png = c.screenshot().await.unwrap();
        std::fs::write(format!("{dir}/console-{name}.png"), png).unwrap();
    }
}

/// Presses the button `id` and waits for the page that says what happened.
async fn press(c: &Client, id: &str) -> String {
    // The page before the click may show a message of its own (the previous action's):
    // the next page's is only looked for once this one is gone.
    let before = c.find(Locator::Css("html")).await.unwrap();
    c.find(Locator::Id(id))
        .await
        .unwrap_or_else(|e| panic!("#{id}: {e}"))
        .click()
        .await
        .unwrap();
    // The click returns before the POST, its redirect and the new page are done. Once the
    // browser left the old page, its element is stale and every call on it fails.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while before.tag_name().await.is_ok() {
        assert!(
            std::time::Instant::now() < deadline,
            "the page after #{id} never came"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    c.wait()
        .at_most(Duration::from_secs(10))
        .for_element(Locator::Css("#msg"))
        .await
        .unwrap_or_else(|e| panic!("the page after #{id}: {e}"));
    text(c, "#msg").await
}

#[tokio::test(flavor = "multi_thread")]
async fn chromium_walks_every_page_and_each_action_changes_the_store() {
    let redis = RedisServer::start();
    let store = RedisLeaseStore::new(
        palisade::store::redis::pool(&redis.url()).unwrap(),
        "palisade",
    );
    let s = seed(&redis, &store).await;
    let [ui_port, driver_port] = free_ports();
    let _ui = ui(&redis, ui_port, &[]);
    let _driver = Reaped(
        Command::new("chromedriver")
            .arg(format!("--port={driver_port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver is installed (.ci/run installs chromium-driver)"),
    );
    wait_for("chromedriver", Duration::from_secs(20), || {
        TcpStream::connect(("127.0.0.1", driver_port)).is_ok()
    });
    let capabilities = serde_json::json!({
        "goog:chromeOptions": {
            "binary": "/usr/bin/chromium",
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                     "--disable-dev-shm-usage", "--window-size=1280,1000"],
        }
    });
    let c = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(capabilities.as_object().unwrap().clone())
        .connect(&format!("http://127.0.0.1:{driver_port}"))
        .await
        .expect("a WebDriver session in headless Chromium");

    // Dashboard: the totals of every queue.
    visit(&c, ui_port, "/", "dashboard").await;
    assert_eq!(c.title().await.unwrap(), "Dashboard · Palisade");
    for (card, n) in [
        ("#total-ready", "3"),   // two ready in default, the flow's first step
        ("#total-delayed", "2"), // the delayed job and the retry
        ("#total-leased", "1"),
        ("#total-dead", "1002"), // one in default, BULK in bulk
        ("#total-workers", "1"),
        ("#total-flows", "1"),
    ] {
        let shown = text(&c, card).await;
        assert!(shown.starts_with(n), "{card}: {shown}");
    }
    assert!(text(&c, "#rejections").await.contains("account:42"));
    // A part of an id finds the job (here a dead letter); text that is no id says what the box
    // takes instead of a bare error.
    let part = s.dead.to_string()[..8].to_owned();
    visit(&c, ui_port, &format!("/job?id={part}"), "search").await;
    let found = text(&c, "#search").await;
    assert!(
        found.contains(&s.dead.to_string()) && found.contains("dead"),
        "{found}"
    );
    visit(&c, ui_port, "/job?id=invoice-7", "search-help").await;
    assert!(text(&c, "#search-help").await.contains("whole job id"));
    visit(&c, ui_port, "/", "dashboard").await;
    // The flow's first step waits in queue flows, which the one live worker does not list.
    let attention = text(&c, "#attention").await;
    assert!(
        attention.contains("flows: no live worker claims it"),
        "{attention}"
    );
    let completed = text(&c, "#chart-completed").await;
    assert!(completed.contains("highest 50.0 jobs/min"), "{completed}");

    // Queues: counts, and pause / resume.
    visit(&c, ui_port, "/queues", "queues").await;
    assert_eq!(cell(&c, "default", "ready").await, "2");
    assert_eq!(cell(&c, "default", "delayed").await, "2");
    assert_eq!(cell(&c, "default", "leased").await, "1");
    assert_eq!(cell(&c, "default", "dead").await, "1");
    assert_eq!(cell(&c, "bulk", "dead").await, BULK.to_string());
    assert_eq!(
        text(&c, "tr[data-kind='email.send'] td[data-state='running']").await,
        "1"
    );
    assert_eq!(press(&c, "pause-default").await, "Paused queue default.");
    assert_eq!(store.paused().await.unwrap(), ["default"]);
    assert!(text(&c, "tr[data-queue='default']")
        .await
        .contains("(paused)"));
    assert_eq!(press(&c, "resume-default").await, "Resumed queue default.");
    assert!(store.paused().await.unwrap().is_empty());

    // Busy: the worker's heartbeat and the live lease with its queue and kind.
    visit(&c, ui_port, "/busy", "busy").await;
    let workers = text(&c, "#workers").await;
    assert!(
        workers.contains("host-1") && workers.contains("4242") && workers.contains("3 / 32"),
        "{workers}"
    );
    let rows = c
        .find_all(Locator::Css("#workers tr[data-pid]"))
        .await
        .unwrap();
    assert_eq!(rows.len(), 1, "one process, one row: {workers}");
    let leases = text(&c, "#leases").await;
    assert!(
        leases.contains("email.send") && leases.contains("default"),
        "{leases}"
    );
    assert!(leases.contains(&s.running.to_string()), "{leases}");

    // Delayed: both, the retry marked; run the delayed one now.
    visit(&c, ui_port, "/delayed?queue=default", "delayed").await;
    let rows = text(&c, "#delayed").await;
    assert!(
        rows.contains(&s.delayed.to_string()) && rows.contains(&s.retry.to_string()),
        "{rows}"
    );
    assert!(text(&c, &format!("tr[data-job='{}']", s.retry))
        .await
        .contains("retry"));
    let before = store.counts("default").await.unwrap();
    let msg = press(&c, &format!("run-{}", s.delayed)).await;
    assert_eq!(msg, format!("Job {} is due now.", s.delayed));
    let after = store.counts("default").await.unwrap();
    assert_eq!(
        (after.ready, after.delayed),
        (before.ready + 1, before.delayed - 1),
        "due now: counted ready"
    );

    // Dead: the reason; retry one, delete one.
    visit(&c, ui_port, "/dead?queue=default", "dead").await;
    assert_eq!(
        text(&c, &format!("tr[data-job='{}'] td.reason", s.dead)).await,
        "card declined by the bank"
    );
    let msg = press(&c, &format!("retry-{}", s.dead)).await;
    assert_eq!(msg, format!("Retried dead job {}.", s.dead));
    assert_eq!(store.counts("default").await.unwrap().dead, 0);
    assert!(store.job(s.dead).await.unwrap().is_some(), "live again");
    visit(&c, ui_port, "/dead?queue=bulk", "dead-bulk").await;
    let newest = s.bulk[BULK - 1];
    let msg = press(&c, &format!("delete-{newest}")).await;
    assert_eq!(msg, format!("Deleted dead job {newest}."));
    assert_eq!(store.counts("bulk").await.unwrap().dead, BULK as u64 - 1);

    // A confirmed bulk retry: the link asks first; the form carries the number confirmed.
    follow(&c, Locator::Id("retry-all"), "confirm", "confirm").await;
    assert_eq!(
        store.counts("bulk").await.unwrap().dead,
        BULK as u64 - 1,
        "not before the confirmation"
    );
    assert_eq!(
        press(&c, "confirm").await,
        format!("Retried {} dead job(s) of queue bulk.", BULK - 1)
    );
    let bulk = store.counts("bulk").await.unwrap();
    assert_eq!((bulk.dead, bulk.ready), (0, BULK as u64 - 1));

    // Issue 57: a queue's ready jobs listed (the Queues page links its count); one deleted,
    // then the queue cleared through its confirm page, which names the number.
    visit(&c, ui_port, "/queues", "queues").await;
    let count = Locator::Css("tr[data-queue='bulk'] td[data-state='ready'] a");
    follow(&c, count, "ready", "ready").await;
    let first_row = |c: &Client| {
        let c = c.clone();
        async move {
            c.find(Locator::Css("#ready tr[data-job]"))
                .await
                .unwrap()
                .attr("data-job")
                .await
                .unwrap()
                .unwrap()
        }
    };
    let first = first_row(&c).await;
    // 1,000 ready: paged, the next page starts elsewhere.
    assert_eq!(text(&c, "#pager").await, "Page 1 Next →");
    follow(&c, Locator::Id("next"), "ready", "ready-page-2").await;
    assert!(text(&c, "#pager").await.starts_with("← Previous Page 2"));
    assert_ne!(first_row(&c).await, first);
    visit(&c, ui_port, "/ready?queue=bulk", "ready").await;
    assert!(text(&c, "#ready").await.contains("report.build"));
    assert_eq!(
        press(&c, &format!("delete-{first}")).await,
        format!("Job {first} cancelled: it is among the dead letters.")
    );
    assert_eq!(store.counts("bulk").await.unwrap().ready, BULK as u64 - 2);
    follow(&c, Locator::Id("clear"), "confirm", "confirm-clear").await;
    assert!(text(&c, "main")
        .await
        .contains(&format!("Cancel all {}", BULK - 2)));
    assert_eq!(
        store.counts("bulk").await.unwrap().ready,
        BULK as u64 - 2,
        "not before"
    );
    assert_eq!(
        press(&c, "confirm").await,
        format!(
            "Cancelled {} job(s) of queue bulk: they are among its dead letters.",
            BULK - 2
        )
    );
    let bulk = store.counts("bulk").await.unwrap();
    assert_eq!((bulk.dead, bulk.ready), (BULK as u64 - 1, 0));

    // A sweep of the dead letters that match: the one deleted from the Ready page (its reason
    // names the operator page), not the 999 cleared, through the confirm page.
    visit(&c, ui_port, "/dead?queue=bulk", "dead-sweep").await;
    c.find(Locator::Css("#sweep input[name='reason']"))
        .await
        .unwrap()
        .send_keys("operator page")
        .await
        .unwrap();
    follow(&c, Locator::Id("sweep-go"), "confirm", "confirm-sweep").await;
    assert!(text(&c, "#filter")
        .await
        .contains("reason contains operator page"));
    assert_eq!(
        store.counts("bulk").await.unwrap().dead,
        BULK as u64 - 1,
        "not before"
    );
    assert_eq!(
        press(&c, "confirm").await,
        format!(
            "Retried 1 dead job(s) of queue bulk matching the filter (of {} read).",
            BULK - 1
        )
    );
    let bulk = store.counts("bulk").await.unwrap();
    assert_eq!((bulk.dead, bulk.ready), (BULK as u64 - 2, 1));
    // An age that does not read is refused before anything is asked.
    visit(
        &c,
        ui_port,
        "/dead/confirm?action=purge&queue=bulk&older=forever",
        "refused",
    )
    .await;
    assert!(text(&c, "#refused").await.contains("not an age"));
    assert!(c.find(Locator::Id("confirm")).await.is_err());

    // Flows, schedules, rejections and a job's own page.
    visit(&c, ui_port, "/flows", "flows").await;
    assert_eq!(text(&c, "#flows-running").await, "1");
    assert!(text(&c, "#flows").await.contains(&s.flow.to_string()));
    // Its row counts its steps: two, one released, none ended, two waiting to end.
    let row = text(&c, &format!("#flows tr[data-flow='{}']", s.flow)).await;
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(
        cells[cells.len() - 6..],
        ["2", "1", "0", "0", "0", "2"],
        "{row}"
    );
    visit(&c, ui_port, &format!("/flow/{}", s.flow), "flow").await;
    assert_eq!(text(&c, "#flow-state").await, "running");
    // Each step in run order with where it is: the first released, the second waiting on it.
    let states = c
        .find_all(Locator::Css("#steps tr[data-step]"))
        .await
        .unwrap();
    let mut shown = Vec::new();
    for row in states {
        shown.push(row.attr("data-state").await.unwrap().unwrap_or_default());
    }
    assert_eq!(
        shown,
        ["released", "waiting"],
        "{}",
        text(&c, "#steps").await
    );
    let msg = press(&c, "flow-cancel").await;
    assert!(
        msg.starts_with(&format!("Flow {} cancelled", s.flow)),
        "{msg}"
    );
    assert_eq!(text(&c, "#flow-state").await, "cancelled");
    visit(&c, ui_port, "/schedules", "schedules").await;
    let schedules = text(&c, "#schedules").await;
    assert!(
        schedules.contains("nightly-report") && schedules.contains("0 3 * * *"),
        "{schedules}"
    );
    let msg = press(&c, "pause-nightly-report").await;
    assert!(msg.starts_with("Schedule nightly-report paused"), "{msg}");
    assert_eq!(store.paused_schedules().await.unwrap(), ["nightly-report"]);
    assert!(text(&c, "tr[data-schedule='nightly-report']")
        .await
        .contains("(paused)"));
    let msg = press(&c, "resume-nightly-report").await;
    assert!(msg.starts_with("Schedule nightly-report resumed"), "{msg}");
    assert!(store.paused_schedules().await.unwrap().is_empty());
    let msg = press(&c, "remove-nightly-report").await;
    assert!(msg.starts_with("Schedule nightly-report removed"), "{msg}");
    assert!(store.schedules().await.unwrap().is_empty());
    visit(&c, ui_port, "/rejections", "rejections").await;
    // A rejection row links the job that wrote and the worker that ran it.
    let job_link = c
        .find(Locator::Css("#rejections td.job a"))
        .await
        .unwrap()
        .attr("href")
        .await
        .unwrap();
    assert_eq!(
        job_link.as_deref(),
        Some(format!("/job/{}", s.running).as_str())
    );
    assert!(text(&c, "#rejections td.worker").await.contains("host-1/0"));
    let rejections = text(&c, "#rejections").await;
    for shown in [
        "account:42",
        "epoch 0 · 71",
        "stale_token",
        "the sink already accepted 73",
    ] {
        assert!(rejections.contains(shown), "{shown} not in {rejections}");
    }
    visit(&c, ui_port, &format!("/job/{}", s.retry), "job").await;
    assert_eq!(text(&c, "#job-state").await, "delayed");
    // A retry says when its next attempt is, as a time (it waits an hour).
    let due_at = text(&c, "#due-at").await;
    assert!(due_at.ends_with('Z') && due_at.contains('T'), "{due_at}");
    assert!(text(&c, "main").await.contains("next attempt in 59m"));
    assert!(text(&c, "#payload").await.contains("d@x"));
    assert!(
        text(&c, "#job").await.contains("1 of"),
        "one attempt so far"
    );
    assert_eq!(text(&c, "#last-error").await, "smtp timeout");
    let attempts = text(&c, "#attempts").await;
    assert!(
        attempts.contains("retried") && attempts.contains("smtp timeout"),
        "{attempts}"
    );

    // Issue 57: a completed job is found by id, with its times and each attempt.
    visit(
        &c,
        ui_port,
        &format!("/job/{}", s.completed),
        "job-completed",
    )
    .await;
    assert_eq!(text(&c, "#job-state").await, "completed");
    assert_eq!(text(&c, "#priority").await, "5");
    for time in ["#enqueued-at", "#completed-at"] {
        let at = text(&c, time).await;
        assert!(at.contains('T') && at.contains("Z ("), "{time}: {at}");
    }
    let attempts = text(&c, "#attempts").await;
    for shown in ["retried", "flaky upstream", "completed"] {
        assert!(attempts.contains(shown), "{shown} not in {attempts}");
    }

    // Issue 57: at a phone's width no page scrolls sideways (a wide table scrolls in its own
    // box; the nav and the search wrap).
    c.set_window_size(420, 900).await.unwrap();
    let flow = format!("/flow/{}", s.flow);
    let job = format!("/job/{}", s.retry);
    let completed = format!("/job/{}", s.completed);
    let pages = [
        ("/", "dashboard"),
        ("/queues", "queues"),
        ("/busy", "busy"),
        ("/delayed", "delayed"),
        ("/ready?queue=default", "ready"),
        ("/dead?queue=default", "dead"),
        ("/flows", "flows"),
        (flow.as_str(), "flow"),
        ("/schedules", "schedules"),
        ("/rejections", "rejections"),
        (job.as_str(), "job"),
        (completed.as_str(), "job-completed"),
    ];
    for (path, name) in pages {
        visit(&c, ui_port, path, &format!("{name}-420")).await;
        let widths = c
            .execute(
                "return [document.documentElement.scrollWidth, window.innerWidth]",
                vec![],
            )
            .await
            .unwrap();
        let (scroll, inner) = (widths[0].as_u64().unwrap(), widths[1].as_u64().unwrap());
        assert!(
            scroll <= 420 && scroll <= inner,
            "{path} scrolls sideways at 420 px: {scroll} px wide in a {inner} px window"
        );
    }
    c.close().await.unwrap();

    // A form from elsewhere (no valid token, or a foreign origin) changes nothing.
    let refused = post(ui_port, "/act/pause", "csrf=guess&queue=default", "");
    assert!(refused.contains("403"), "{refused}");
    assert!(store.paused().await.unwrap().is_empty());
    // Issue 58: with the page's own token, what the API refuses the console refuses too: an
    // opaque origin, a browser's word that the form comes from another site.
    let page = exchange(
        ui_port,
        &format!("GET /queues HTTP/1.0\r\nHost: 127.0.0.1:{ui_port}\r\n\r\n"),
    );
    let token = page
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|t| t.split('"').next())
        .unwrap()
        .to_owned();
    let form = format!("csrf={token}&queue=default");
    for extra in [
        "Origin: null\r\n",
        "Sec-Fetch-Site: cross-site\r\n",
        "Sec-Fetch-Site: same-site\r\n",
    ] {
        let refused = post(ui_port, "/act/pause", &form, extra);
        assert!(refused.contains("403"), "{extra}: {refused}");
        assert!(store.paused().await.unwrap().is_empty(), "{extra}");
    }
    // The same form from the page itself goes through.
    let own = format!("Origin: http://127.0.0.1:{ui_port}\r\nSec-Fetch-Site: same-origin\r\n");
    let done = post(ui_port, "/act/pause", &form, &own);
    assert!(done.contains("303"), "{done}");
    assert_eq!(store.paused().await.unwrap(), ["default"]);
    // A page that rebinds its own name to 127.0.0.1 is not answered (it would be same-origin
    // with the page and could read the token); no one may frame the page; no script runs.
    let rebound = exchange(
        ui_port,
        &format!("GET / HTTP/1.0\r\nHost: evil.example:{ui_port}\r\n\r\n"),
    );
    assert!(rebound.starts_with("HTTP/1.0 421"), "{rebound}");
    assert!(!rebound.contains("csrf"), "{rebound}");
    let own = exchange(
        ui_port,
        &format!("GET /?live=1 HTTP/1.0\r\nHost: 127.0.0.1:{ui_port}\r\n\r\n"),
    );
    let own = own.to_ascii_lowercase();
    assert!(own.contains("x-frame-options: deny") && own.contains("frame-ancestors 'none'"));
    assert!(own.contains("referrer-policy: same-origin"), "{own}");
    assert!(
        own.contains("script-src 'none'") && own.contains("refresh: 5"),
        "{own}"
    );
}

#[test]
fn basic_auth_guards_the_page_and_beyond_loopback_it_is_required() {
    let redis = RedisServer::start();
    let [port] = free_ports();
    let _ui = ui(&redis, port, &["--basic-auth", "ops:s3cret"]);
    let head = |auth: &str| {
        let response = exchange(
            port,
            &format!("GET / HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n{auth}\r\n"),
        );
        response.lines().next().unwrap_or_default().to_owned()
    };
    assert!(head("").contains("401"));
    assert!(head("Authorization: Basic b3BzOndyb25n\r\n").contains("401"));
    // ops:s3cret
    assert!(head("Authorization: Basic b3BzOnMzY3JldA==\r\n").contains("200"));
    // Issue 58 scope 3: ten wrong passwords in a minute, and this address waits out the
    // minute — the right password too is answered 429 with when to come back.
    for _ in 0..9 {
        assert!(head("Authorization: Basic b3BzOndyb25n\r\n").contains("401"));
    }
    let throttled = exchange(
        port,
        &format!(
            "GET / HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Basic b3BzOnMzY3JldA==\r\n\r\n"
        ),
    );
    assert!(
        throttled.starts_with("HTTP/1.0 429")
            && throttled.to_ascii_lowercase().contains("retry-after: "),
        "{throttled}"
    );

    let out = Command::new(BIN)
        .args(["ui", "--redis", &redis.url(), "--listen", "0.0.0.0:0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("needs --basic-auth"), "{stderr}");
    // Issue 58, M3: on loopback behind a proxy (--public-host) it needs a login too: the proxy
    // forwards anyone (it started without one, and served its actions to them).
    let out = Command::new(BIN)
        .args(["ui", "--redis", &redis.url(), "--listen", "127.0.0.1:0"])
        .args(["--public-host", "ops.example.com"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("needs --basic-auth") && stderr.lines().count() == 1,
        "{stderr}"
    );
}
