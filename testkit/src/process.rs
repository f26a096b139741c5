//! A worker binary under test as a child process: started with `--metrics` on a free port
//! and waited for until `/metrics` answers, sent real signals, killed when dropped — and the
//! binary's one-shot commands (`enqueue`, `status --json`, ...) run against a Redis URL.

use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use crate::net::{free_port, http_get, poll_until};

/// A running worker process; killed (SIGKILL) when dropped.
pub struct Process {
    child: Child,
    metrics_port: u16,
    /// Where its stderr goes: the caller's file, or one of ours (removed when dropped), so a
    /// worker that exits badly can say why ([`terminate_cleanly`](Self::terminate_cleanly)).
    log: Option<(PathBuf, bool)>,
}

impl Process {
    /// Starts `bin worker <args> --metrics 127.0.0.1:<free port>` with `RUST_LOG=<log>`, and
    /// waits (up to 20 s) until its `/metrics` answers.
    pub fn worker(bin: &str, args: &[&str], log: &str) -> Self {
        Self::worker_with_env(bin, args, log, &[])
    }

    /// [`worker`](Self::worker) with more environment (a skewed clock's, say).
    pub fn worker_with_env(bin: &str, args: &[&str], log: &str, env: &[(String, String)]) -> Self {
        let file =
            std::env::temp_dir().join(format!("palisade-worker-{}.log", uuid::Uuid::new_v4()));
        Self::worker_to(bin, args, log, env, (file, true))
    }

    /// [`worker_with_env`](Self::worker_with_env) writing its log (stderr) to `log_file`.
    pub fn worker_logging(
        bin: &str,
        args: &[&str],
        log: &str,
        env: &[(String, String)],
        log_file: &std::path::Path,
    ) -> Self {
        Self::worker_to(bin, args, log, env, (log_file.to_owned(), false))
    }

    fn worker_to(
        bin: &str,
        args: &[&str],
        log: &str,
        env: &[(String, String)],
        (log_file, ours): (PathBuf, bool),
    ) -> Self {
        let stderr = Stdio::from(std::fs::File::create(&log_file).unwrap());
        let metrics_port = free_port();
        let child = Command::new(bin)
            .arg("worker")
            .args(args)
            .args(["--metrics", &format!("127.0.0.1:{metrics_port}")])
            .env("RUST_LOG", log)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .unwrap_or_else(|e| panic!("{bin} runs: {e}"));
        let process = Self {
            child,
            metrics_port,
            log: Some((log_file, ours)),
        };
        // (Not `wait_for`: a worker that never serves says why, from its log, before the
        // log is removed with it.)
        assert!(
            poll_until(Duration::from_secs(20), || process.metrics().is_some()),
            "worker {} never served /metrics; its log ends:\n{}",
            process.pid(),
            process.log_tail()
        );
        process
    }

    /// Starts `bin <args>` without a metrics endpoint (nothing to wait for).
    pub fn spawn(bin: &str, args: &[&str], log: &str) -> Self {
        Self::spawn_with_env(bin, args, log, &[])
    }

    /// [`spawn`](Self::spawn) with more environment.
    pub fn spawn_with_env(bin: &str, args: &[&str], log: &str, env: &[(String, String)]) -> Self {
        let child = Command::new(bin)
            .args(args)
            .env("RUST_LOG", log)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{bin} runs: {e}"));
        Self {
            child,
            metrics_port: 0,
            log: None,
        }
    }

    /// Its pid.
    pub fn pid(&self) -> String {
        self.child.id().to_string()
    }

    /// Sends `signal` (`-STOP`, `-CONT`, `-KILL`, `-TERM`) with `kill`.
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.pid()])
            .status()
            .unwrap();
        assert!(status.success(), "kill {signal} {} failed", self.pid());
    }

    /// Its `/metrics` page, if it answers.
    pub fn metrics(&self) -> Option<String> {
        http_get(self.metrics_port, "/metrics")
    }

    /// Its metrics port.
    pub fn metrics_port(&self) -> u16 {
        self.metrics_port
    }

    /// The sum of a counter's samples with the given labels (0 if it does not answer).
    pub fn counter(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        palisade::metrics::sample_sum(&self.metrics().unwrap_or_default(), name, labels)
    }

    /// Whether it has exited.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().unwrap()
    }

    /// SIGTERM, then waits (up to 20 s) for it to exit.
    pub fn terminate(mut self) -> ExitStatus {
        match self.sigterm() {
            Some(status) => status,
            None => panic!(
                "process {} did not exit after SIGTERM; its log ends:\n{}",
                self.pid(),
                self.log_tail()
            ),
        }
    }

    /// [`terminate`](Self::terminate), and panics unless it exited successfully, with the end
    /// of its log: a drain that fails says why (say, jobs it could not settle).
    pub fn terminate_cleanly(mut self) {
        match self.sigterm() {
            Some(status) if status.success() => {}
            status => panic!(
                "worker {} did not exit cleanly after SIGTERM ({status:?}); its log ends:\n{}",
                self.pid(),
                self.log_tail()
            ),
        }
    }

    /// SIGTERM, and its exit status if it exits within 20 s.
    fn sigterm(&mut self) -> Option<ExitStatus> {
        self.signal("-TERM");
        let mut status = None;
        poll_until(Duration::from_secs(20), || {
            status = self.try_wait();
            status.is_some()
        });
        status
    }

    /// The last 40 lines of its stderr, if it was kept: what a test prints when it fails.
    pub fn log_tail(&self) -> String {
        let Some((file, _)) = &self.log else {
            return "(not kept)".into();
        };
        let text = std::fs::read_to_string(file).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some((file, true)) = &self.log {
            let _ = std::fs::remove_file(file);
        }
    }
}

/// Runs `bin <args>` with `PALISADE_REDIS_URL=<redis_url>` and returns its stdout; panics
/// (with its stderr) if it fails.
pub fn run(bin: &str, redis_url: &str, args: &[&str]) -> String {
    let out = Command::new(bin)
        .args(args)
        .env("PALISADE_REDIS_URL", redis_url)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{bin} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// [`run`] with `input` on its stdin (`enqueue --stdin`, say).
pub fn run_with_stdin(bin: &str, redis_url: &str, args: &[&str], input: &str) -> String {
    use std::io::Write as _;
    let mut child = Command::new(bin)
        .args(args)
        .env("PALISADE_REDIS_URL", redis_url)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let text = input.to_owned();
    // Written from a thread: a child that answers as it reads must not block on a full pipe.
    let writer = std::thread::spawn(move || stdin.write_all(text.as_bytes()));
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    assert!(
        out.status.success(),
        "{bin} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}
