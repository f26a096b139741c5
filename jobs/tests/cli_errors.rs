//! Bad input to the `palisade` binary: a clear one-line error and exit code 2, before anything
//! is sent anywhere (the Redis URL points at a closed port on purpose).

use std::process::Command;

fn enqueue(args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_palisade"))
        .arg("enqueue")
        .args(["--redis", "redis://:s3cret@127.0.0.1:1"])
        .args(args)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!text.contains("s3cret"), "{text}");
    (out.status.code(), text)
}

#[test]
fn bad_jobs_are_refused_with_a_reason() {
    let (code, err) = enqueue(&["ledger.withdraw", "{}"]);
    assert_eq!(code, Some(2));
    assert!(
        err.contains("unknown job kind \"ledger.withdraw\"") && err.contains("ledger.deposit"),
        "{err}"
    );

    let (code, err) = enqueue(&["ledger.deposit", "{not json"]);
    assert_eq!(code, Some(2));
    assert!(err.contains("does not decode"), "{err}");

    let (code, err) = enqueue(&[
        "ledger.deposit",
        r#"{"account":1,"cents":5}"#,
        "--max-payload-bytes",
        "10",
    ]);
    assert_eq!(code, Some(2));
    assert!(err.contains("the limit is 10"), "{err}");

    let (code, err) = enqueue(&["ledger.deposit", r#"{"account":1,"cents":5}"#]);
    assert_eq!(code, Some(2));
    assert!(
        err.contains("cannot reach Redis at redis://:***@127.0.0.1:1"),
        "{err}"
    );
}

#[test]
fn bad_worker_flags_are_refused() {
    let worker = |lease: &str| {
        Command::new(env!("CARGO_BIN_EXE_palisade"))
            .args(["worker", "--redis", "redis://127.0.0.1:1", "--lease", lease])
            .output()
            .unwrap()
    };
    let out = worker("10ms");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--lease must be at least"));
    assert_eq!(
        worker("soon").status.code(),
        Some(2),
        "clap rejects an unparsable duration"
    );
}
