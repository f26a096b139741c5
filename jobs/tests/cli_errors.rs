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

fn palisade(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args(args)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    (out.status.code(), text)
}

/// Found by trying the CLI as a careless user: each of these used to be accepted, panic, leak
/// a password or fail much later. Each must end at once with exit code 2, no panic, no secret.
#[test]
fn careless_worker_configurations_are_refused_up_front() {
    let redis = ["worker", "--redis", "redis://127.0.0.1:1"];
    let cases: &[(&[&str], &str)] = &[
        (&["--concurrency", "0"], "concurrency"),
        (&["--concurrency", "100000000"], "concurrency"),
        (&["--queues", "a,a"], "twice"),
        (&["--queues", "a:3,a:2"], "twice"),
        (&["--sink", "ledger=x", "--sink", "ledger=y"], "twice"),
        (&["--sink", "ledger="], "empty"),
        (&["--sink", "nope=redis://x"], "declares no sink"),
        (&["--name", "a\nb"], "control character"),
        (&["--prefix", ""], "prefix is empty"),
    ];
    for (extra, why) in cases {
        let args: Vec<&str> = redis.iter().chain(extra.iter()).copied().collect();
        let (code, text) = palisade(&args, &[]);
        assert_eq!(code, Some(2), "{extra:?}: {text}");
        assert!(text.contains(why), "{extra:?}: expected {why:?} in {text}");
        assert!(!text.contains("panicked"), "{extra:?}: {text}");
    }
    // A corrupt durable epoch file stops the worker before it connects to anything.
    let file = std::env::temp_dir().join(format!("palisade-epoch-{}", std::process::id()));
    std::fs::write(&file, "garbage").unwrap();
    let path = file.to_string_lossy().to_string();
    let (code, text) = palisade(&[&redis[..], &["--epoch-file", &path]].concat(), &[]);
    std::fs::remove_file(&file).unwrap();
    assert_eq!(code, Some(2), "{text}");
    assert!(text.contains("does not hold an epoch"), "{text}");
}

#[test]
fn secrets_stay_out_of_help_and_errors() {
    let env = [
        ("PALISADE_REDIS_URL", "redis://u:hunter2@h:1"),
        ("PALISADE_EPOCH_POSTGRES_URL", "postgres://pg:pgsecret@db/x"),
    ];
    for command in ["worker", "enqueue", "status"] {
        let (code, text) = palisade(&[command, "--help"], &env);
        assert_eq!(code, Some(0));
        assert!(
            !text.contains("hunter2") && !text.contains("pgsecret"),
            "{command}: {text}"
        );
    }
    let (code, text) = palisade(&["status", "--redis", "u:pw123@127.0.0.1:6405"], &[]);
    assert_eq!(code, Some(2));
    assert!(!text.contains("pw123"), "{text}");
}

/// A cron pattern that never fires (30 February) would cost its scheduler a search to the
/// year 5000 on every pass: refused, while one that fires rarely (29 February) is kept.
#[test]
fn schedules_that_never_fire_are_refused() {
    let add = |pattern: &str| {
        palisade(
            &[
                "schedule",
                "add",
                "--redis",
                "redis://127.0.0.1:1",
                "x",
                pattern,
                "email.send",
                r#"{"to":"ops@example.com","millis":1}"#,
            ],
            &[],
        )
    };
    for pattern in ["0 0 30 2 *", "0 0 0 30 2 *"] {
        let (code, text) = add(pattern);
        assert_eq!(code, Some(2), "{pattern}: {text}");
        assert!(text.contains("never fires"), "{pattern}: {text}");
    }
    // Accepted: it gets as far as the (closed) Redis port.
    let (code, text) = add("0 0 29 2 *");
    assert_eq!(code, Some(2), "{text}");
    assert!(text.contains("cannot reach Redis"), "{text}");
}
