//! Postgres over TLS: a private server started here that accepts TLS connections only, with
//! certificates made in the test. Each `sslmode` does what it does for libpq; a wrong CA, a
//! host name the certificate does not carry, or a plain connection is refused with one clear
//! line.

use palisade::*;
use palisade_testkit::tls::Certificates;
use palisade_testkit::PostgresTls;

async fn start() -> PostgresTls {
    tokio::task::spawn_blocking(PostgresTls::start)
        .await
        .unwrap()
}

/// Whether the sink's own connection is encrypted, as the server sees it.
async fn encrypted(sink: &PostgresSink) -> bool {
    let client = sink.pool().get().await.unwrap();
    client
        .query_one(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

fn one_line(err: &Error) -> String {
    let msg = err.to_string();
    assert!(!msg.contains('\n'), "more than one line: {msg}");
    msg
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_sslmode_connects_or_refuses_as_libpq_would() {
    let server = start().await;
    let ca = server.certs.ca.display().to_string();

    // verify-full with the right CA and a name the certificate carries: a fenced write works.
    let url = server.url(
        "localhost",
        &format!("sslmode=verify-full&sslrootcert={ca}"),
    );
    let sink = PostgresSink::connect(&url)
        .await
        .expect("verify-full connects");
    assert!(encrypted(&sink).await);
    let store = PostgresFencedStore::new(std::sync::Arc::new(sink));
    let write = FencedWrite {
        scope: Scope::new("acct:1"),
        fence: Fence {
            token: FencingToken::from_u64(5),
            lease: LeaseId::new(),
        },
        key: IdempotencyKey::new("k1"),
        mutations: vec![Mutation::Set {
            key: "balance".into(),
            value: "10".into(),
        }],
    };
    assert_eq!(
        store.write(write.clone()).await.unwrap(),
        Admission::Applied
    );
    let older = FencedWrite {
        fence: Fence {
            token: FencingToken::from_u64(4),
            lease: LeaseId::new(),
        },
        key: IdempotencyKey::new("k2"),
        ..write
    };
    assert!(matches!(
        store.write(older).await.unwrap(),
        Admission::Rejected(Rejection::StaleToken { .. })
    ));

    // verify-ca checks the chain but not the name: 127.0.0.2 is not in the certificate.
    let other_host = server.url("127.0.0.2", &format!("sslmode=verify-ca&sslrootcert={ca}"));
    let sink = PostgresSink::connect(&other_host)
        .await
        .expect("verify-ca connects");
    assert!(encrypted(&sink).await);
    // verify-full refuses that name.
    let wrong_name = server.url(
        "127.0.0.2",
        &format!("sslmode=verify-full&sslrootcert={ca}"),
    );
    let err = PostgresSink::connect(&wrong_name).await.err().unwrap();
    let msg = one_line(&err);
    assert!(msg.to_lowercase().contains("certificate"), "{msg}");

    // A CA that signed nothing here is refused, in both verifying modes.
    let dir = std::env::temp_dir().join(format!("palisade-wrong-ca-{}", LeaseId::new()));
    let wrong = Certificates::authority(&dir, "wrong").display().to_string();
    for mode in ["verify-ca", "verify-full"] {
        let url = server.url("localhost", &format!("sslmode={mode}&sslrootcert={wrong}"));
        let err = PostgresSink::connect(&url).await.err().unwrap();
        let msg = one_line(&err);
        assert!(msg.to_lowercase().contains("certificate"), "{mode}: {msg}");
    }
    // Without sslrootcert, verification is against Mozilla's roots, which never signed ours.
    let url = server.url("localhost", "sslmode=verify-full");
    assert!(PostgresSink::connect(&url).await.is_err());
    // libpq: `require` with sslrootcert verifies the chain too.
    let url = server.url("localhost", &format!("sslmode=require&sslrootcert={wrong}"));
    assert!(PostgresSink::connect(&url).await.is_err());

    // require and prefer encrypt without checking the certificate (libpq's meaning).
    for mode in ["require", "prefer"] {
        let url = server.url("127.0.0.2", &format!("sslmode={mode}"));
        let sink = PostgresSink::connect(&url).await.unwrap();
        assert!(encrypted(&sink).await, "{mode}");
    }
    // The default is prefer, as for libpq.
    let sink = PostgresSink::connect(&server.url("localhost", ""))
        .await
        .unwrap();
    assert!(encrypted(&sink).await);

    // disable sends no TLS: this server rejects plain connections (pg_hba `hostnossl reject`).
    let url = server.url("localhost", "sslmode=disable");
    let err = PostgresSink::connect(&url).await.err().unwrap();
    let msg = one_line(&err);
    assert!(
        msg.contains("no encryption") || msg.contains("pg_hba"),
        "{msg}"
    );

    // The epoch source and its own connections take the same settings.
    let url = server.url(
        "localhost",
        &format!("sslmode=verify-full&sslrootcert={ca}"),
    );
    let source = PostgresEpochSource::connect(&url, "tls").await.unwrap();
    assert_eq!(source.next_epoch(0).await.unwrap(), 1);
    let url = server.url(
        "localhost",
        &format!("sslmode=verify-full&sslrootcert={wrong}"),
    );
    assert!(PostgresEpochSource::connect(&url, "tls").await.is_err());

    // A Unix socket carries no TLS: libpq ignores sslmode there, and so does the sink (rustls
    // could not even name the server).
    let socket = format!(
        "host={} port={} user=postgres dbname=postgres",
        server.socket_dir().display(),
        server.port
    );
    let sink = PostgresSink::connect(&socket)
        .await
        .expect("a Unix socket connects");
    assert!(!encrypted(&sink).await);
    // verify-ca against the public roots is refused (any public CA signs any name).
    let err = PostgresSink::connect(&server.url("localhost", "sslmode=verify-ca"))
        .await
        .err()
        .unwrap();
    assert!(one_line(&err).contains("needs sslrootcert"), "{err}");

    // A bad mode, and a root file that is not there, fail before connecting.
    let err = PostgresSink::connect(&server.url("localhost", "sslmode=verify_full"))
        .await
        .err()
        .unwrap();
    assert!(matches!(err, Error::Config(_)), "{err:?}");
    let err =
        PostgresSink::connect(&server.url("localhost", "sslmode=verify-ca&sslrootcert=/nope.pem"))
            .await
            .err()
            .unwrap();
    assert!(one_line(&err).contains("sslrootcert /nope.pem"), "{err}");
    let _ = std::fs::remove_dir_all(dir);
}
