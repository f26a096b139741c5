//! Real Prometheus scraping a real `/metrics`, plus checks that the shipped dashboards and
//! alert rules are valid and reference only metrics Palisade exports.

use palisade_testkit::process::run_with_stdin;
use palisade_testkit::{free_ports, http_get, referenced_metrics, wait_for, Process, RedisServer};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Kills the process when the test ends, pass or fail.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn dashboards_and_alerts_reference_only_exported_metrics() {
    let dashboard =
        std::fs::read_to_string(repo().join("dashboards/grafana/palisade.json")).unwrap();
    let parsed: serde_json::Value = serde_json::from_str(&dashboard).expect("dashboard is JSON");
    assert!(parsed["panels"].as_array().is_some_and(|p| p.len() >= 6));
    let alerts = std::fs::read_to_string(repo().join("dashboards/prometheus/alerts.yml")).unwrap();
    let names = [referenced_metrics(&dashboard), referenced_metrics(&alerts)].concat();
    assert!(names.len() > 10);
    for name in names {
        // A histogram is exported as its _bucket, _sum and _count series.
        let base = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suffix| name.strip_suffix(suffix))
            .filter(|base| palisade::metrics::ALL.contains(base))
            .unwrap_or(&name);
        assert!(
            palisade::metrics::ALL.contains(&base),
            "{name} is not a metric Palisade exports"
        );
    }
    assert_eq!(
        parsed["uid"], "palisade-overview",
        "the uid links and alerts point at"
    );
    let variables: Vec<&str> = parsed["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v["name"].as_str())
        .collect();
    for wanted in ["datasource", "instance", "queue", "kind"] {
        assert!(variables.contains(&wanted), "no ${wanted} variable");
    }
    let status = Command::new("promtool")
        .args(["check", "rules"])
        .arg(repo().join("dashboards/prometheus/alerts.yml"))
        .status()
        .expect("promtool is installed (.ci/run installs prometheus)");
    assert!(status.success(), "promtool rejected alerts.yml");
}

/// A private Prometheus scraping `target` every second and evaluating the shipped alert rules
/// every second. Another test may take the chosen port between our probe and Prometheus'
/// bind; Prometheus then exits, and we try another port.
fn start_prometheus(target: u16) -> (Reaped, u16, PathBuf) {
    for _ in 0..5 {
        let [port] = free_ports();
        let dir = std::env::temp_dir().join(format!("palisade-prom-{port}"));
        std::fs::create_dir_all(&dir).unwrap();
        let config = dir.join("prometheus.yml");
        let rules = repo().join("dashboards/prometheus/alerts.yml");
        std::fs::write(
            &config,
            format!(
                "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\n\
                 rule_files: ['{}']\nscrape_configs:\n  - job_name: palisade\n    \
                 static_configs: [{{targets: ['127.0.0.1:{target}']}}]\n",
                rules.display()
            ),
        )
        .unwrap();
        let mut child = Reaped(
            Command::new("prometheus")
                .arg(format!("--config.file={}", config.display()))
                .arg(format!(
                    "--storage.tsdb.path={}",
                    dir.join("data").display()
                ))
                .arg(format!("--web.listen-address=127.0.0.1:{port}"))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("prometheus is installed (.ci/run installs it)"),
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline && child.0.try_wait().unwrap().is_none() {
            if http_get(port, "/-/ready").is_some_and(|body| body.contains("Prometheus")) {
                return (child, port, dir);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
    panic!("no private Prometheus came up after five tries");
}

#[test]
fn prometheus_scrapes_the_demo_and_sees_the_stale_rejection() {
    let [demo_port] = free_ports();
    // The demo's own account of the run, shown if Prometheus never sees the stale write.
    let demo_log = std::env::temp_dir().join(format!("palisade-demo-{demo_port}.log"));
    let _demo = Reaped(
        Command::new(env!("CARGO_BIN_EXE_palisade"))
            .args([
                "demo",
                // Enough jobs that the paused worker surely meets a deposit before the others
                // have done them all (with 400, a fast run could finish without a stale write).
                "--jobs",
                "3000",
                "--seed",
                "7",
                "--lease-ms",
                "1000",
                "--linger-secs",
                "120",
            ])
            .args(["--metrics", &format!("127.0.0.1:{demo_port}")])
            .stdout(std::fs::File::create(&demo_log).unwrap())
            .spawn()
            .unwrap(),
    );
    let (mut prometheus, prom_port, dir) = start_prometheus(demo_port);
    let query =
        "/api/v1/query?query=sum(palisade_fence_rejections_total%7Breason%3D%22stale_token%22%7D)";
    // Generous: on a loaded machine the demo's takeover of the paused worker's job can be slow.
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut last = String::new();
    while Instant::now() < deadline {
        if let Some(status) = prometheus.0.try_wait().unwrap() {
            panic!("prometheus exited ({status})");
        }
        if let Some(body) = http_get(prom_port, query) {
            let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
            if v["data"]["result"][0]["value"][1] == "1" {
                // The sampler's gauges and the histograms have had a few scrapes by now.
                std::thread::sleep(Duration::from_secs(8));
                every_panel_and_alert_evaluates(prom_port);
                every_exported_metric_has_help(demo_port);
                let _ = std::fs::remove_dir_all(&dir);
                let _ = std::fs::remove_file(&demo_log);
                return;
            }
            last = body;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    let told = std::fs::read_to_string(&demo_log).unwrap_or_default();
    panic!("Prometheus never saw the stale rejection; last answer: {last}\ndemo:\n{told}");
}

/// Percent-encodes a query parameter.
fn encode(text: &str) -> String {
    form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

/// Every target of every dashboard panel (and the annotation queries), with the variables as
/// Grafana fills them for "All", goes through the private Prometheus' query API: each must be
/// valid PromQL, and the fencing, queue and latency panels must show data from the run. Every
/// alert rule must evaluate without error.
fn every_panel_and_alert_evaluates(prom_port: u16) {
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(repo().join("dashboards/grafana/palisade.json")).unwrap(),
    )
    .unwrap();
    let mut row = String::new();
    let mut queries = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        if panel["type"] == "row" {
            row = panel["title"].as_str().unwrap_or_default().to_owned();
            continue;
        }
        for target in panel["targets"].as_array().into_iter().flatten() {
            let title = panel["title"].as_str().unwrap_or_default().to_owned();
            queries.push((
                row.clone(),
                title,
                target["expr"].as_str().unwrap().to_owned(),
            ));
        }
    }
    for annotation in dashboard["annotations"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        if let Some(expr) = annotation["expr"].as_str() {
            queries.push(("annotations".into(), "annotation".into(), expr.to_owned()));
        }
    }
    assert!(queries.len() >= 20, "{} queries", queries.len());
    let mut failures = Vec::new();
    for (row, title, expr) in &queries {
        let filled = expr
            .replace("$instance", ".*")
            .replace("$queue", ".*")
            .replace("$kind", ".*")
            .replace("$__rate_interval", "1m")
            .replace("$__range", "1h");
        let body = http_get(
            prom_port,
            &format!("/api/v1/query?query={}", encode(&filled)),
        )
        .unwrap_or_default();
        let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        if v["status"] != "success" {
            failures.push(format!("{row} / {title}: {filled}: {body}"));
            continue;
        }
        let must_show = ["Fencing", "Queues", "Latency"].contains(&row.as_str());
        let empty = v["data"]["result"].as_array().is_none_or(|r| r.is_empty());
        if must_show && empty {
            failures.push(format!("{row} / {title}: no data: {filled}"));
        }
    }
    // The shipped rules, loaded by this Prometheus, evaluated every second against the run.
    let body = http_get(prom_port, "/api/v1/rules").unwrap_or_default();
    let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
    let rules: Vec<&serde_json::Value> = v["data"]["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|g| g["rules"].as_array().into_iter().flatten())
        .collect();
    assert!(rules.len() >= 9, "alert rules not loaded: {body}");
    for rule in rules {
        if rule["health"] != "ok" {
            failures.push(format!(
                "alert {}: {} {}",
                rule["name"], rule["health"], rule["lastError"]
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn promtool_unit_tests_cover_every_alert() {
    let alerts = std::fs::read_to_string(repo().join("dashboards/prometheus/alerts.yml")).unwrap();
    let tests =
        std::fs::read_to_string(repo().join("dashboards/prometheus/alerts_test.yml")).unwrap();
    for line in alerts.lines() {
        if let Some(name) = line.trim().strip_prefix("- alert: ") {
            assert!(
                tests.contains(&format!("alertname: {name}")),
                "no promtool test for {name}"
            );
        }
    }
    let out = Command::new("promtool")
        .args(["test", "rules"])
        .arg(repo().join("dashboards/prometheus/alerts_test.yml"))
        .output()
        .expect("promtool is installed (.ci/run installs prometheus)");
    assert!(
        out.status.success(),
        "promtool test rules failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Every metric family in the process' `/metrics` has HELP text, and every family is one of
/// Palisade's named metrics.
fn every_exported_metric_has_help(port: u16) {
    let text = http_get(port, "/metrics").expect("the demo serves /metrics");
    let families: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert!(families.len() >= 10, "{text}");
    for family in families {
        assert!(
            text.contains(&format!("# HELP {family} ")),
            "{family} is exported without HELP"
        );
        assert!(
            palisade::metrics::ALL.contains(&family),
            "{family} is exported but not in metrics::ALL"
        );
    }
}

/// The value of `key: "..."` (or `'...'`) in the KEDA manifest.
fn manifest_value<'a>(manifest: &'a str, key: &str) -> &'a str {
    let line = manifest
        .lines()
        .map(str::trim)
        .find_map(|l| l.strip_prefix(&format!("{key}: ")))
        .unwrap_or_else(|| panic!("the manifest has no {key}"));
    let quote = line.chars().next().unwrap();
    let rest = &line[1..];
    &rest[..rest.rfind(quote).unwrap()]
}

/// The autoscaling recipe (examples/deploy/keda/scaledobject.yaml) against real parts: jobs
/// queued with no worker serving their queue, a worker that exports the depth, a real
/// Prometheus scraping it, and `palisade api`. The manifest's PromQL query and its metrics-api
/// path and value location each read the number queued, and follow it when more are queued.
#[test]
fn the_keda_recipe_reads_the_queue_depth() {
    const BIN: &str = env!("CARGO_BIN_EXE_palisade");
    let manifest =
        std::fs::read_to_string(repo().join("examples/deploy/keda/scaledobject.yaml")).unwrap();
    let query = manifest_value(&manifest, "query");
    let url = manifest_value(&manifest, "url");
    // The Host KEDA sends: the API must be told it (--public-host), as the manifest says.
    let host = url.trim_start_matches("http://").split('/').next().unwrap();
    let path = &url[url.find("/api/").unwrap()..];
    assert!(
        manifest.contains(&format!("--public-host {host}")),
        "the manifest names {host}"
    );
    assert!(manifest.contains("authMode: \"bearer\""));
    let token = "keda-test-token-0123456789";
    let location = manifest_value(&manifest, "valueLocation");
    let redis = RedisServer::start();
    // Jobs that run ten minutes: the two the worker takes stay leased.
    let enqueue = |n: usize| {
        let lines: String = (0..n)
            .map(|i| format!("{{\"to\":\"u{i}@x\",\"millis\":600000}}\n"))
            .collect();
        run_with_stdin(
            BIN,
            &redis.url(),
            &["enqueue", "email.send", "--stdin"],
            &lines,
        );
    };
    enqueue(7);
    // It runs two at a time and samples every queue: 5 ready and 2 leased.
    let worker = Process::worker(
        BIN,
        &[
            "--redis",
            &redis.url(),
            "--concurrency",
            "2",
            "--arbiters",
            "1",
        ],
        "warn",
    );
    let (mut prometheus, prom_port, dir) = start_prometheus(worker.metrics_port());
    let [api_port] = free_ports();
    let _api = Reaped(
        Command::new(BIN)
            .args(["api", "--redis", &redis.url(), "--listen"])
            .arg(format!("127.0.0.1:{api_port}"))
            .args(["--public-host", host, "--api-token", token])
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_for("the API to serve", Duration::from_secs(20), || {
        http_get(api_port, "/healthz").is_some()
    });
    let promql = format!("/api/v1/query?query={}", encode(query));
    let from_api = || {
        let out = Command::new("curl")
            .args(["-sS", "--max-time", "10", "-H", &format!("Host: {host}")])
            .args(["-H", &format!("Authorization: Bearer {token}")])
            .arg(format!("http://127.0.0.1:{api_port}{path}"))
            .output()
            .expect("curl is installed (.ci/run installs it)");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        location.split('.').fold(v, |v, key| v[key].clone())
    };
    // (ready, ready + leased): the API's value is the ready jobs, the query's also counts the
    // running ones (dropping `leased` from it reads 10, not 12).
    for (ready, expected) in [(5, 7), (10, 12)] {
        if expected == 12 {
            enqueue(5);
        }
        wait_for("the worker's two claims", Duration::from_secs(30), || {
            from_api() == ready
        });
        let mut last = String::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = prometheus.0.try_wait().unwrap() {
                panic!("prometheus exited ({status})");
            }
            let body = http_get(prom_port, &promql).unwrap_or_default();
            let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
            if v["data"]["result"][0]["value"][1].as_str() == Some(&*expected.to_string()) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "Prometheus never read {expected} from {query}; last answer: {last}"
            );
            last = body;
            std::thread::sleep(Duration::from_millis(250));
        }
        assert_eq!(from_api(), ready, "{url} at {location}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
