//! Real Prometheus scraping a real `/metrics`, plus checks that the shipped dashboards and
//! alert rules are valid and reference only metrics Palisade exports.

mod common;

use common::{free_ports, http_get};
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

fn referenced_metrics(text: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("palisade_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        names.push(tail[..end].to_string());
        rest = &tail[end..];
    }
    names
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
        assert!(
            palisade::metrics::ALL.contains(&name.as_str()),
            "{name} is not a metric Palisade exports"
        );
    }
    let status = Command::new("promtool")
        .args(["check", "rules"])
        .arg(repo().join("dashboards/prometheus/alerts.yml"))
        .status()
        .expect("promtool is installed (.ci/run installs prometheus)");
    assert!(status.success(), "promtool rejected alerts.yml");
}

/// A private Prometheus scraping `target` every second. Another test may take the chosen port
/// between our probe and Prometheus' bind; Prometheus then exits, and we try another port.
fn start_prometheus(target: u16) -> (Reaped, u16, PathBuf) {
    for _ in 0..5 {
        let [port] = free_ports();
        let dir = std::env::temp_dir().join(format!("palisade-prom-{port}"));
        std::fs::create_dir_all(&dir).unwrap();
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global: {{scrape_interval: 1s}}\nscrape_configs:\n  - job_name: palisade\n    \
                 static_configs: [{{targets: ['127.0.0.1:{target}']}}]\n"
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
    let _demo = Reaped(
        Command::new(env!("CARGO_BIN_EXE_palisade"))
            .args([
                "demo",
                "--jobs",
                "400",
                "--lease-ms",
                "300",
                "--linger-secs",
                "30",
            ])
            .args(["--metrics", &format!("127.0.0.1:{demo_port}")])
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let (mut prometheus, prom_port, dir) = start_prometheus(demo_port);
    let query =
        "/api/v1/query?query=sum(palisade_fence_rejections_total%7Breason%3D%22stale_token%22%7D)";
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = String::new();
    while Instant::now() < deadline {
        if let Some(status) = prometheus.0.try_wait().unwrap() {
            panic!("prometheus exited ({status})");
        }
        if let Some(body) = http_get(prom_port, query) {
            let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
            if v["data"]["result"][0]["value"][1] == "1" {
                let _ = std::fs::remove_dir_all(&dir);
                return;
            }
            last = body;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    panic!("Prometheus never saw the stale rejection; last answer: {last}");
}
