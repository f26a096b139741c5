//! The chaos soak, short: `palisade-soak soak --minutes 2` with real worker processes, a private
//! Redis, the real PostgreSQL and a seeded nemesis; the offline checker must find nothing,
//! and the run must actually have forced stale writes (a soak that never provoked one proves
//! nothing). The checker's own planted-bug tests are in `src/lib.rs`.

use std::process::Command;

#[test]
fn a_two_minute_soak_with_faults_keeps_every_invariant() {
    let out = Command::new(env!("CARGO_BIN_EXE_palisade-soak"))
        .args(["soak", "--minutes", "2", "--seed", "20261130"])
        .output()
        .expect("palisade-soak binary runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.success(),
        "the soak found violations or could not run"
    );
    let count = |label: &str| -> u64 {
        stdout
            .lines()
            .find(|l| l.trim_start().starts_with(label))
            .and_then(|l| l.split_whitespace().last())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no {label:?} line"))
    };
    assert_eq!(count("violations"), 0);
    assert_eq!(count("stale writes accepted"), 0);
    // Each sink must itself have refused stale writes: a sink whose fence was dropped would
    // then accept them, and the checker would see it (commit order of the beats, attempt
    // times) — the beats are keyed per run, so only the fence can refuse them.
    assert!(
        count("stale writes refused by ledger") > 0,
        "Redis sink refused no stale write"
    );
    assert!(
        count("stale writes refused by books") > 0,
        "Postgres sink refused no stale write"
    );
    assert!(count("poison mutation lists refused whole") > 0);
    assert!(count("fault: coordinator wipe") > 0);
    assert!(count("postings acknowledged") > 1000);
}

/// A live run with a bug planted in the workload: the checker must fail it, naming the
/// invariant (its own unit tests plant the same bugs into synthetic evidence).
fn planted(plant: &str, seed: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_palisade-soak"))
        .args([
            "soak",
            // (1.5 minutes: in 0.75, one CI run's faults never left a stale holder writing,
            // so the planted bug had nothing to let through. Still shorter than the
            // two-minute soak beside it.)
            "--minutes",
            "1.5",
            "--seed",
            seed,
            "--plant",
            plant,
        ])
        .output()
        .expect("palisade-soak binary runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    println!("{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(!out.status.success(), "a run with a planted bug passed");
    stdout
}

#[test]
fn a_live_run_with_a_write_around_the_fence_fails_no_stale_write() {
    let stdout = planted("stale", "31");
    assert!(
        stdout.contains("VIOLATION: no_stale_write: beats"),
        "{stdout}"
    );
}

#[test]
fn a_live_run_with_half_applied_postings_fails_all_or_nothing() {
    let stdout = planted("half", "32");
    assert!(stdout.contains("VIOLATION: all_or_nothing"), "{stdout}");
}
