//! The README's main command, run as a real process: it must exit 0, show the stale write
//! refused, and serve `palisade_` counters on `/metrics` while it runs.

use palisade_testkit::{free_port, http_get};
use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn demo_fences_off_the_paused_worker_and_serves_metrics() {
    let port = free_port();
    let report = std::env::temp_dir().join(format!("palisade-demo-{port}.svg"));
    let child = Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args([
            "demo",
            "--jobs",
            "600",
            "--lease-ms",
            "300",
            "--linger-secs",
            "3",
        ])
        .args(["--metrics", &format!("127.0.0.1:{port}")])
        .arg("--report")
        .arg(&report)
        .stdout(Stdio::piped())
        .spawn()
        .expect("palisade binary runs");

    let wanted = [
        "palisade_claims_total",
        "palisade_jobs_finished_total{queue=\"default\",kind=\"ledger.deposit\",outcome=\"completed\"}",
        "palisade_renewals_total",
        "palisade_leases_lost_total",
        "palisade_fence_rejections_total{sink=\"ledger\",reason=\"stale_token\"}",
        "palisade_sink_writes_total{sink=\"ledger\",outcome=\"applied\"}",
    ];
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = String::new();
    while Instant::now() < deadline {
        if let Some(body) = http_get(port, "/metrics") {
            last = body;
            if wanted.iter().all(|w| last.contains(w)) {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let output = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    for w in wanted {
        assert!(last.contains(w), "/metrics lacks {w}:\n{last}");
    }
    assert!(output.status.success(), "demo failed:\n{stdout}");
    assert!(stdout.contains("stale-rejected 1"), "{stdout}");
    assert!(stdout.contains("write Rejected(StaleToken"), "{stdout}");
    assert!(stdout.contains("0 violations"), "{stdout}");
    let svg = std::fs::read_to_string(&report).expect("the --report SVG was written");
    let _ = std::fs::remove_file(&report);
    assert!(svg.contains("<polyline") && svg.contains("stale writes refused"));
}

#[test]
fn demo_reports_a_busy_metrics_port_clearly() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let output = Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args(["demo", "--jobs", "10", "--metrics", &addr])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(&addr) && stderr.contains("--metrics"),
        "{stderr}"
    );
}
