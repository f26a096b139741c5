//! Private `redis-server` processes for tests: each on a free loopback port, stopped by pid
//! when dropped. Tests never touch the shared Redis on 6379.

#![allow(dead_code, missing_docs)]

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct RedisServer {
    pub port: u16,
    pub dir: PathBuf,
    extra: Vec<String>,
    child: Option<Child>,
    /// CA file when the server speaks only TLS.
    tls_ca: Option<PathBuf>,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl RedisServer {
    /// A server that keeps nothing on disk.
    pub fn start() -> Self {
        Self::start_with(&["--save", "", "--appendonly", "no"])
    }

    /// A server with an append-only file fsynced on every write.
    pub fn start_with_aof() -> Self {
        Self::start_with(&[
            "--save",
            "",
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
        ])
    }

    pub fn start_with(extra: &[&str]) -> Self {
        let dir = std::env::temp_dir().join(format!("palisade-redis-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut server = Self {
            port: free_port(),
            dir,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            child: None,
            tls_ca: None,
        };
        server.spawn();
        server
    }

    /// A TLS-only server with a certificate for 127.0.0.1 / localhost signed by a CA made
    /// here with openssl; the CA's PEM is at [`RedisServer::tls_ca`].
    pub fn start_tls() -> Self {
        let dir = std::env::temp_dir().join(format!("palisade-redis-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let openssl = |args: &[&str]| {
            let ok = Command::new("openssl")
                .args(args)
                .current_dir(&dir)
                .stderr(Stdio::null())
                .status();
            assert!(
                ok.expect("openssl is installed").success(),
                "openssl {args:?}"
            );
        };
        openssl(&[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            "1",
            "-subj",
            "/CN=palisade-test-ca",
        ]);
        openssl(&[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=localhost",
        ]);
        std::fs::write(
            dir.join("san.cnf"),
            "subjectAltName=DNS:localhost,IP:127.0.0.1\n",
        )
        .unwrap();
        openssl(&[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.crt",
            "-days",
            "1",
            "-extfile",
            "san.cnf",
        ]);
        let file = |name: &str| dir.join(name).display().to_string();
        let mut server = Self {
            port: free_port(),
            extra: vec![
                "--save".into(),
                "".into(),
                "--appendonly".into(),
                "no".into(),
                "--tls-cert-file".into(),
                file("server.crt"),
                "--tls-key-file".into(),
                file("server.key"),
                "--tls-ca-cert-file".into(),
                file("ca.crt"),
                "--tls-auth-clients".into(),
                "no".into(),
            ],
            tls_ca: Some(dir.join("ca.crt")),
            dir,
            child: None,
        };
        server.spawn();
        server
    }

    pub fn tls_ca(&self) -> &std::path::Path {
        self.tls_ca.as_deref().expect("a TLS server")
    }

    fn spawn(&mut self) {
        let ports = match self.tls_ca {
            Some(_) => [
                "--port".to_string(),
                "0".into(),
                "--tls-port".into(),
                self.port.to_string(),
            ],
            None => [
                "--port".to_string(),
                self.port.to_string(),
                "--bind".into(),
                "127.0.0.1".into(),
            ],
        };
        let child = Command::new("redis-server")
            .args(ports)
            .arg("--dir")
            .arg(&self.dir)
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server is installed (.ci/run installs it)");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if self.cli(&["PING"]).is_some_and(|r| r == "PONG") {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("private redis-server on port {} did not start", self.port);
    }

    pub fn url(&self) -> String {
        match self.tls_ca {
            Some(_) => format!("rediss://127.0.0.1:{}", self.port),
            None => format!("redis://127.0.0.1:{}", self.port),
        }
    }

    /// Runs one command through redis-cli; `None` if the server is not answering.
    pub fn cli(&self, args: &[&str]) -> Option<String> {
        let mut cli = Command::new("redis-cli");
        cli.args(["-p", &self.port.to_string()]);
        if let Some(ca) = &self.tls_ca {
            cli.arg("--tls").arg("--cacert").arg(ca);
        }
        if let Some(i) = self.extra.iter().position(|a| a == "--requirepass") {
            cli.args(["-a", &self.extra[i + 1], "--no-auth-warning"]);
        }
        let out = cli.args(args).output().ok()?;
        let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
        (out.status.success() && !text.starts_with("Could not connect")).then_some(text)
    }

    /// Stops the server by pid (SIGKILL: nothing gets a chance to flush beyond what its
    /// persistence settings already wrote).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops and starts again on the same port and directory.
    pub fn restart(&mut self) {
        self.stop();
        self.spawn();
    }

    /// Stops, wipes its directory, and starts again empty.
    pub fn restart_empty(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
        std::fs::create_dir_all(&self.dir).unwrap();
        self.spawn();
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The machine's PostgreSQL (`.ci/run` starts it): `PALISADE_TEST_POSTGRES_URL`, default
/// `postgres://postgres@127.0.0.1:5432/test`.
pub fn postgres_url() -> String {
    std::env::var("PALISADE_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// A schema name no other test uses, and the sink URL that selects it. Names carry their
/// creation time; the first call of a test process drops test schemas over an hour old,
/// which tests that failed (or never drop theirs) left behind.
pub fn fresh_postgres_schema() -> (String, String) {
    static SWEEP: std::sync::Once = std::sync::Once::new();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    SWEEP.call_once(|| {
        let sql = format!(
            "DO $$ DECLARE s text; BEGIN FOR s IN SELECT nspname FROM pg_namespace \
             WHERE nspname ~ '^ts_[0-9]+_' AND split_part(nspname, '_', 2)::bigint < {} \
             LOOP EXECUTE format('DROP SCHEMA %I CASCADE', s); END LOOP; END $$",
            now.saturating_sub(3600)
        );
        let _ = Command::new("psql")
            .args([postgres_url().as_str(), "-qc", &sql])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    });
    let id = uuid::Uuid::new_v4().simple().to_string();
    let schema = format!("ts_{now}_{}", &id[..12]);
    let url = format!("{}?schema={schema}", postgres_url());
    (schema, url)
}

/// Drops a test's schema (and everything in it) through the sink's own pool.
pub async fn drop_postgres_schema(sink: &palisade::PostgresSink) {
    let client = sink.pool().get().await.unwrap();
    client
        .batch_execute(&format!("DROP SCHEMA IF EXISTS {} CASCADE", sink.schema()))
        .await
        .unwrap();
}
