//! The chaos soak, short: `palisade-soak soak --minutes 2` with real worker processes, a private
//! Redis, the real PostgreSQL and a seeded nemesis; the offline checker must find nothing,
//! and the run must actually have forced stale writes (a soak that never provoked one proves
//! nothing). The checker's own planted-bug tests are in `src/lib.rs`.

use std::process::{Command, Stdio};

/// A live run: its exit and its output (stdout, then stderr).
#[derive(Debug)]
struct Run {
    success: bool,
    stdout: String,
}

/// Runs `palisade-soak` with each argument list at once and waits for all of them. They are
/// processes that spend most of their minutes waiting on faults, so together they take as long
/// as the longest, not the sum (CI's time, .ci/run). Their output goes to files, not pipes,
/// which no one would read until its turn came.
fn live_runs(runs: &[&[&str]]) -> Vec<Run> {
    let started: Vec<_> = runs
        .iter()
        .enumerate()
        .map(|(i, args)| {
            let log =
                std::env::temp_dir().join(format!("palisade-soak-test-{}-{i}", std::process::id()));
            let file = |suffix| std::fs::File::create(log.with_extension(suffix)).unwrap();
            let child = Command::new(env!("CARGO_BIN_EXE_palisade-soak"))
                .args(*args)
                .stdout(Stdio::from(file("out")))
                .stderr(Stdio::from(file("err")))
                .spawn()
                .expect("palisade-soak binary runs");
            (child, log)
        })
        .collect();
    started
        .into_iter()
        .map(|(mut child, log)| {
            let success = child.wait().unwrap().success();
            let read = |suffix| {
                let file = log.with_extension(suffix);
                let text = std::fs::read_to_string(&file).unwrap_or_default();
                let _ = std::fs::remove_file(file);
                text
            };
            let (stdout, stderr) = (read("out"), read("err"));
            println!("{stdout}\n{stderr}");
            Run { success, stdout }
        })
        .collect()
}

/// The two-minute soak must pass, and two live runs with a bug planted in the workload must
/// fail, naming the invariant (the checker's own unit tests plant the same bugs into synthetic
/// evidence).
#[test]
fn a_soak_with_faults_keeps_every_invariant_and_live_runs_with_planted_bugs_fail() {
    // (The planted runs take 1.5 minutes: in 0.75, one CI run's faults never left a stale
    // holder writing, so the planted bug had nothing to let through. Each run's books sinks
    // hold at most 4 connections: three soaks at 8 peaked at 91 of Postgres's 100.)
    let pool = ["--books-pool", "4"];
    let soak = ["soak", "--minutes", "2", "--seed", "20261130"];
    let stale = [
        "soak",
        "--minutes",
        "1.5",
        "--seed",
        "31",
        "--plant",
        "stale",
    ];
    let half = [
        "soak",
        "--minutes",
        "1.5",
        "--seed",
        "32",
        "--plant",
        "half",
    ];
    let [soak, stale, half] = <[Run; 3]>::try_from(live_runs(&[
        &[&soak[..], &pool].concat(),
        &[&stale[..], &pool].concat(),
        &[&half[..], &pool].concat(),
    ]))
    .expect("three runs");

    assert!(soak.success, "the soak found violations or could not run");
    let count = |label: &str| -> u64 {
        soak.stdout
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

    // A write around the fence: the checker finds the stale beat.
    assert!(!stale.success, "a run with a stale write planted passed");
    assert!(
        stale.stdout.contains("VIOLATION: no_stale_write: beats"),
        "{}",
        stale.stdout
    );
    // Postings applied by halves: the checker finds the torn write.
    assert!(
        !half.success,
        "a run with half-applied postings planted passed"
    );
    assert!(
        half.stdout.contains("VIOLATION: all_or_nothing"),
        "{}",
        half.stdout
    );
}
