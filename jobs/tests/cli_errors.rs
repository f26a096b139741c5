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
    assert!(String::from_utf8_lossy(&out.stderr).contains("10ms is outside 300ms..=1day"));
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
        // Issue 22: durations out of sane bounds, prefixes against the name rules.
        (&["--lease", "1000y"], "1000years is outside 300ms..=1day"),
        (&["--drain", "2days"], "2days is outside 0s..=1day"),
        // Issue 24: the settlement linger is bounded by itself and by the lease.
        (&["--linger", "2s"], "2s is outside 0s..=1s"),
        (
            &["--linger", "500ms", "--lease", "1s"],
            "at most a tenth of --lease",
        ),
        (&["--prefix", "{x}"], "no braces"),
        (&["--prefix", "a\nb"], "control character"),
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

/// What clap or the binary printed as the error, asserted to be one line: everything but
/// blank lines and clap's "For more information" hint.
fn one_error_line(text: &str) -> String {
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with("For more information"))
        .collect();
    assert_eq!(lines.len(), 1, "one line expected: {text}");
    lines[0].to_owned()
}

/// Issue 22: each link or name a careless configuration gets wrong is refused at once, exit
/// code 2, with one line that says what is wrong.
#[test]
fn bad_links_are_refused_with_one_line() {
    use std::io::{Read, Write};
    // A port that answers like an HTTP server.
    let http = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let http_port = http.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in http.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut buf = [0u8; 512];
            let _ = stream.read(&mut buf);
            let _ = stream
                .write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 11\r\n\r\n<html></html>");
        }
    });
    let http_url = format!("redis://127.0.0.1:{http_port}");
    type Case<'a> = (Vec<String>, Vec<(&'a str, &'a str)>, &'a str);
    let cases: Vec<Case> = vec![
        (
            vec![
                "worker".into(),
                "--redis".into(),
                "http://127.0.0.1:1".into(),
            ],
            vec![],
            "http://127.0.0.1:1 is not a Redis URL",
        ),
        (
            vec!["status".into(), "--redis".into(), http_url.clone()],
            vec![],
            "is not the Redis protocol — is this a Redis port?",
        ),
        (
            vec![
                "worker".into(),
                "--redis".into(),
                "redis://127.0.0.1:1".into(),
            ],
            vec![("PALISADE_SINK_TYPO_URL", "redis://127.0.0.1:1")],
            "PALISADE_SINK_TYPO_URL names no sink this binary declares",
        ),
        (
            vec![
                "worker".into(),
                "--redis".into(),
                "redis://127.0.0.1:1".into(),
                "--sink".into(),
                "ledger=postgres://u@127.0.0.1:1/db?sslmode=verify_full".into(),
            ],
            vec![],
            "use disable, prefer, require, verify-ca or verify-full",
        ),
        (
            vec![
                "worker".into(),
                "--redis-cluster".into(),
                "--redis".into(),
                "redis+sentinel://127.0.0.1:1/m".into(),
            ],
            vec![],
            "names sentinels, not cluster nodes",
        ),
        (
            vec![
                "status".into(),
                "--redis".into(),
                "redis+sentinel://127.0.0.1:1".into(),
            ],
            vec![],
            "no master name",
        ),
        (
            vec![
                "relay".into(),
                "--redis".into(),
                "redis://127.0.0.1:1".into(),
                "--outbox-lease".into(),
                "0s".into(),
            ],
            vec![],
            "0s is outside 1s..=1day",
        ),
        (
            vec![
                "status".into(),
                "--redis".into(),
                "redis://127.0.0.1:1".into(),
                "--prefix".into(),
                "{x}".into(),
            ],
            vec![],
            "no braces",
        ),
    ];
    for (args, env, why) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (code, text) = palisade(&args, &env);
        assert_eq!(code, Some(2), "{args:?}: {text}");
        let line = one_error_line(&text);
        assert!(line.contains(why), "{args:?}: expected {why:?} in {line}");
    }
}

/// Issue 22: `--prefix c1-p0.3` used to open installation c1's partition directly. A name the
/// layouts derive from an installation that exists is refused with what to use instead; one
/// that only looks derived, with no such installation, still works.
#[test]
fn a_prefix_naming_another_installations_partition_is_refused() {
    let redis = palisade_testkit::RedisServer::start();
    let url = redis.url();
    let status = |prefix: &str| palisade(&["status", "--redis", &url, "--prefix", prefix], &[]);
    assert_eq!(
        status("c1").0,
        Some(0),
        "the installation c1 records its layout"
    );
    for derived in ["c1-p0.3", "c1-g2", "c1-g2-p1.7"] {
        let (code, text) = status(derived);
        assert_eq!(code, Some(2), "{derived}: {text}");
        let line = one_error_line(&text);
        assert!(
            line.contains("partition or layout generation of the installation \"c1\"")
                && line.contains("--prefix c1"),
            "{derived}: {line}"
        );
    }
    assert_eq!(
        status("acme-p1").0,
        Some(0),
        "no installation acme: a plain name"
    );
}
