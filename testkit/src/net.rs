//! Helpers shared by the binary's process tests.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A loopback port nobody listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `N` distinct loopback ports nobody listens on right now: all are held until the last is
/// bound, so two calls in a row cannot hand out the same port (the kernel may reuse a port as
/// soon as its listener closes).
pub fn free_ports<const N: usize>() -> [u16; N] {
    let held: Vec<TcpListener> = (0..N)
        .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    std::array::from_fn(|i| held[i].local_addr().unwrap().port())
}

/// A plain HTTP/1.0 GET (1.0, so no server answers in chunks); returns the body, or `None`
/// if the server is not up (yet).
pub fn http_get(port: u16, path: &str) -> Option<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    Some(response.split_once("\r\n\r\n")?.1.to_string())
}

/// Polls `ok` every 50 ms until it holds, or panics naming `what` after `limit`.
pub fn wait_for(what: &str, limit: Duration, ok: impl FnMut() -> bool) {
    assert!(poll_until(limit, ok), "timed out waiting for {what}");
}

/// Polls `ok` every 50 ms until it holds or `limit` passes; whether it held. For a caller
/// that says more than [`wait_for`] when it does not (a process's log, say).
pub fn poll_until(limit: Duration, mut ok: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

/// One request a [`http_receiver`] got.
pub struct Request {
    /// 0-based, in the order connections were accepted.
    pub number: u64,
    /// Its `Idempotency-Key` header, if any.
    pub key: Option<String>,
    /// Its body.
    pub body: String,
}

/// A local HTTP/1.1 endpoint standing in for an outbox target: `answer` gets every request
/// (one connection each) and returns the status line to send back, e.g. `"200 OK"`. Returns
/// the port.
pub fn http_receiver(answer: impl Fn(Request) -> &'static str + Send + Sync + 'static) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let answer = Arc::new(answer);
    std::thread::spawn(move || {
        for (number, stream) in (0u64..).zip(listener.incoming()) {
            let Ok(mut stream) = stream else { continue };
            let answer = answer.clone();
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let (mut key, mut length) = (None, 0usize);
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    let line = line.trim_end();
                    if line.is_empty() {
                        break;
                    }
                    if let Some((name, value)) = line.split_once(':') {
                        match name.to_ascii_lowercase().as_str() {
                            "idempotency-key" => key = Some(value.trim().to_owned()),
                            "content-length" => length = value.trim().parse().unwrap_or(0),
                            _ => {}
                        }
                    }
                }
                let mut body = vec![0; length];
                let _ = reader.read_exact(&mut body);
                let body = String::from_utf8_lossy(&body).into_owned();
                let status = answer(Request { number, key, body });
                let _ = write!(
                    stream,
                    "HTTP/1.1 {status}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                );
            });
        }
    });
    port
}
