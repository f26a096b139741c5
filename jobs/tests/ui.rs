//! The operator page (`palisade ui`) in a real headless Chromium, driven through chromedriver
//! (WebDriver), against a private Redis holding known state: the numbers shown are the
//! coordinator's, and pressing "retry" makes the dead job ready again.
//!
//! `PALISADE_UI_SCREENSHOT=path.png` also saves a screenshot of the page (docs/operator-page.png).

use palisade::{Inspect, RecordStore};
use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fantoccini::{Client, ClientBuilder, Locator};
use palisade::{FencingToken, LeaseStore, NewJob, RedisLeaseStore, RejectionNote, Settlement};
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

/// Known state: in `default`, one ready job, one running under a long lease, one dead with a
/// reason; one fence rejection in the journal.
async fn seed(store: &RedisLeaseStore) {
    let job = |to: &str| NewJob::raw("email.send", format!("{{\"to\":\"{to}\"}}"));
    store
        .enqueue(vec![job("a@x"), job("b@x"), job("c@x")])
        .await
        .unwrap();
    let claims = store
        .claim("default", "host-1/0", 2, Duration::from_secs(600))
        .await
        .unwrap();
    let reason = "card declined by the bank".to_owned();
    let settled = store
        .settle(vec![(claims[1].lease.id, Settlement::Dead { reason })])
        .await
        .unwrap();
    assert!(settled[0].is_ok());
    store
        .note_rejections(vec![RejectionNote {
            at_ms: 1_790_000_000_000,
            sink: "ledger".into(),
            scope: "account:42".into(),
            token: FencingToken::new(0, 71).as_u64(),
            reason: "stale_token".into(),
            detail: "stale token 71: the sink already accepted 73".into(),
        }])
        .await
        .unwrap();
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

/// A raw form POST; returns the status line.
fn post(port: u16, path: &str, form: &str) -> String {
    let response = exchange(
        port,
        &format!(
            "POST {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\nContent-Type: \
             application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{form}",
            form.len()
        ),
    );
    response.lines().next().unwrap_or_default().to_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn chromium_shows_the_coordinator_and_retries_a_dead_job() {
    let redis = RedisServer::start();
    let store = RedisLeaseStore::new(
        palisade::store::redis::pool(&redis.url()).unwrap(),
        "palisade",
    );
    seed(&store).await;
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
                     "--disable-dev-shm-usage", "--window-size=1280,1400"],
        }
    });
    let c = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(capabilities.as_object().unwrap().clone())
        .connect(&format!("http://127.0.0.1:{driver_port}"))
        .await
        .expect("a WebDriver session in headless Chromium");

    let page = format!("http://127.0.0.1:{ui_port}/");
    c.goto(&page).await.unwrap();
    assert_eq!(c.title().await.unwrap(), "Palisade");
    assert_eq!(cell(&c, "default", "ready").await, "1");
    assert_eq!(cell(&c, "default", "leased").await, "1");
    assert_eq!(cell(&c, "default", "dead").await, "1");
    let leases = text(&c, "#leases").await;
    assert!(leases.contains("host-1/0"), "{leases}");
    let rejections = text(&c, "#rejections").await;
    for shown in [
        "account:42",
        "0:71",
        "stale_token",
        "the sink already accepted 73",
    ] {
        assert!(rejections.contains(shown), "{shown} not in {rejections}");
    }
    assert_eq!(
        text(&c, "table.dead[data-queue='default'] td.reason").await,
        "card declined by the bank"
    );
    if let Ok(path) = std::env::var("PALISADE_UI_SCREENSHOT") {
        std::fs::write(&path, c.screenshot().await.unwrap()).unwrap();
    }

    // A form from elsewhere (no valid token) changes nothing.
    let refused = post(ui_port, "/dead/retry", "csrf=guess&queue=default");
    assert!(refused.contains("403"), "{refused}");
    // A page that rebinds its own name to 127.0.0.1 is not answered (it would be same-origin
    // with the page and could read the token); no one may frame the page.
    let rebound = exchange(
        ui_port,
        &format!("GET / HTTP/1.0\r\nHost: evil.example:{ui_port}\r\n\r\n"),
    );
    assert!(rebound.starts_with("HTTP/1.0 421"), "{rebound}");
    assert!(!rebound.contains("csrf"), "{rebound}");
    let own = exchange(
        ui_port,
        &format!("GET / HTTP/1.0\r\nHost: 127.0.0.1:{ui_port}\r\n\r\n"),
    );
    let own = own.to_ascii_lowercase();
    assert!(own.contains("x-frame-options: deny") && own.contains("frame-ancestors 'none'"));
    assert_eq!(store.counts("default").await.unwrap().dead, 1);

    // The operator presses retry: the dead job is ready again.
    c.find(Locator::Id("retry-default"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    // The click returns before the POST, its redirect and the new page are done: wait for
    // the page that says what happened.
    c.wait()
        .at_most(Duration::from_secs(10))
        .for_element(Locator::Css("#msg"))
        .await
        .expect("the page after the retry");
    assert_eq!(
        text(&c, "#msg").await,
        "Retried 1 dead job(s) of queue default."
    );
    assert_eq!(cell(&c, "default", "ready").await, "2");
    assert_eq!(cell(&c, "default", "dead").await, "0");
    let counts = store.counts("default").await.unwrap();
    assert_eq!((counts.ready, counts.dead, counts.leased), (2, 0, 1));
    c.close().await.unwrap();
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

    let out = Command::new(BIN)
        .args(["ui", "--redis", &redis.url(), "--listen", "0.0.0.0:0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("needs --basic-auth"), "{stderr}");
}
