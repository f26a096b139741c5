//! A TCP fault proxy between a client under test and its server (Redis, Postgres): latency
//! and jitter, connections dropped, a blackhole (a partition: nothing moves either way, the
//! sockets stay open, held bytes arrive when it heals, as TCP retransmits them), and replies
//! cut half-way — the server acted, the client never learns it.
//!
//! Every fault decision comes from a seeded RNG per connection and direction (seed, the
//! connection's number, the direction), drawn once per chunk forwarded, so a failing run
//! replays its decisions from its seed; where a chunk boundary falls still depends on timing.
//! The seed is printed when the proxy starts.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The faults in force; change them at any time with [`FaultProxy::set`].
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LinkFaults {
    /// Added before each chunk is forwarded, either way.
    pub latency: Duration,
    /// Up to this much more, uniformly drawn per chunk.
    pub jitter: Duration,
    /// Chance per chunk, either way, that the connection is closed instead of forwarding it
    /// (client to server: the request never arrives; server to client: a lost reply).
    pub drop: f64,
    /// Chance per server-to-client chunk that only its first half is forwarded and the
    /// connection is then closed: a reply cut half-way through, after the server acted.
    pub cut_reply: f64,
}

/// What the proxy did, for a test to show its faults were exercised.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProxyStats {
    /// Connections accepted.
    pub connections: u64,
    /// Connections closed by [`LinkFaults::drop`].
    pub dropped: u64,
    /// Replies cut by [`LinkFaults::cut_reply`].
    pub cut: u64,
    /// Connections closed by [`FaultProxy::cut_all`].
    pub cut_by_hand: u64,
}

struct Shared {
    upstream: u16,
    seed: u64,
    faults: Mutex<LinkFaults>,
    blackhole: AtomicBool,
    /// Server-to-client chunks still to cut, whatever the faults in force, and what a chunk
    /// must contain to be cut (empty: any).
    cut_next: AtomicU64,
    cut_pattern: Mutex<Vec<u8>>,
    stopped: AtomicBool,
    /// Each open connection's two sockets, by connection number.
    open: Mutex<HashMap<u64, [TcpStream; 2]>>,
    connections: AtomicU64,
    dropped: AtomicU64,
    cut: AtomicU64,
    cut_by_hand: AtomicU64,
}

/// A fault proxy on a free loopback port in front of `127.0.0.1:upstream`; stops (closing
/// every connection) when dropped.
pub struct FaultProxy {
    port: u16,
    shared: Arc<Shared>,
}

impl FaultProxy {
    /// A proxy to `127.0.0.1:upstream` with no fault in force.
    pub fn start(upstream: u16, seed: u64) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the fault proxy");
        let port = listener.local_addr().unwrap().port();
        eprintln!("fault proxy :{port} -> :{upstream}, seed {seed}");
        let shared = Arc::new(Shared {
            upstream,
            seed,
            faults: Mutex::new(LinkFaults::default()),
            blackhole: AtomicBool::new(false),
            cut_next: AtomicU64::new(0),
            cut_pattern: Mutex::new(Vec::new()),
            stopped: AtomicBool::new(false),
            open: Mutex::new(HashMap::new()),
            connections: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            cut: AtomicU64::new(0),
            cut_by_hand: AtomicU64::new(0),
        });
        let accepting = shared.clone();
        std::thread::spawn(move || accept(listener, accepting));
        Self { port, shared }
    }

    /// The proxy's port: point the client here.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn redis_url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The seed its decisions come from.
    pub fn seed(&self) -> u64 {
        self.shared.seed
    }

    /// Puts `faults` in force for every chunk from now on.
    pub fn set(&self, faults: LinkFaults) {
        *self.shared.faults.lock().unwrap() = faults;
    }

    /// Starts (`true`) or heals a partition: while on, no byte moves either way and new
    /// connections are accepted but go nowhere; held bytes move once it heals.
    pub fn blackhole(&self, on: bool) {
        self.shared.blackhole.store(on, Ordering::SeqCst);
    }

    /// Cuts the next `n` replies (server-to-client chunks) that contain `pattern` half-way,
    /// on whichever connections they come: "the server acted, the reply was lost", for the
    /// very reply a test means (`b"$36\r\n"`: a reply carrying a job id, not a PING's).
    pub fn cut_next_replies(&self, n: u64, pattern: &[u8]) {
        *self.shared.cut_pattern.lock().unwrap() = pattern.to_vec();
        self.shared.cut_next.store(n, Ordering::SeqCst);
    }

    /// Closes every open connection now, both ways.
    pub fn cut_all(&self) {
        let open = std::mem::take(&mut *self.shared.open.lock().unwrap());
        for [client, server] in open.into_values() {
            let _ = server.shutdown(Shutdown::Both);
            if client.shutdown(Shutdown::Both).is_ok() {
                self.shared.cut_by_hand.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// What it did so far.
    pub fn stats(&self) -> ProxyStats {
        let s = &self.shared;
        ProxyStats {
            connections: s.connections.load(Ordering::Relaxed),
            dropped: s.dropped.load(Ordering::Relaxed),
            cut: s.cut.load(Ordering::Relaxed),
            cut_by_hand: s.cut_by_hand.load(Ordering::Relaxed),
        }
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.shared.stopped.store(true, Ordering::SeqCst);
        self.blackhole(false);
        self.cut_all();
        // Wakes the accept loop so it sees `stopped`.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

fn accept(listener: TcpListener, shared: Arc<Shared>) {
    for client in listener.incoming() {
        if shared.stopped.load(Ordering::SeqCst) {
            return;
        }
        let Ok(client) = client else { continue };
        let number = shared.connections.fetch_add(1, Ordering::Relaxed);
        let shared = shared.clone();
        std::thread::spawn(move || connect(client, number, shared));
    }
}

/// Joins one client to the upstream and pumps both ways.
fn connect(client: TcpStream, number: u64, shared: Arc<Shared>) {
    // In a partition the upstream is not reached either: wait it out with the client held.
    while shared.blackhole.load(Ordering::SeqCst) && !shared.stopped.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(5));
    }
    let Ok(server) = TcpStream::connect(("127.0.0.1", shared.upstream)) else {
        let _ = client.shutdown(Shutdown::Both);
        return;
    };
    let _ = (client.set_nodelay(true), server.set_nodelay(true));
    let (Ok(c2), Ok(s2), Ok(c3), Ok(s3)) = (
        client.try_clone(),
        server.try_clone(),
        client.try_clone(),
        server.try_clone(),
    ) else {
        return;
    };
    shared.open.lock().unwrap().insert(number, [c3, s3]);
    let up = shared.clone();
    std::thread::spawn(move || pump(c2, s2, false, number, up));
    pump(server, client, true, number, shared.clone());
    shared.open.lock().unwrap().remove(&number);
}

/// Forwards `from` to `to` (`reply`: server to client) under the faults in force, until
/// either side closes.
fn pump(mut from: TcpStream, mut to: TcpStream, reply: bool, number: u64, shared: Arc<Shared>) {
    let mut rng = StdRng::seed_from_u64(
        shared.seed ^ number.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ u64::from(reply),
    );
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let faults = *shared.faults.lock().unwrap();
        // One draw of each kind per chunk, whatever is in force, so the sequence of draws
        // (and so the replay) does not depend on when faults were changed.
        let (jitter, drop, cut) = (
            rng.random::<f64>(),
            rng.random::<f64>(),
            rng.random::<f64>(),
        );
        let delay = faults.latency + faults.jitter.mul_f64(jitter);
        if !delay.is_zero() {
            std::thread::sleep(delay);
        }
        while shared.blackhole.load(Ordering::SeqCst) && !shared.stopped.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(5));
        }
        if drop < faults.drop {
            shared.dropped.fetch_add(1, Ordering::Relaxed);
            break;
        }
        let cut_now = reply
            && shared.cut_next.load(Ordering::SeqCst) > 0
            && contains(&buf[..n], &shared.cut_pattern.lock().unwrap())
            && shared
                .cut_next
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
        if reply && (cut_now || cut < faults.cut_reply) {
            shared.cut.fetch_add(1, Ordering::Relaxed);
            let _ = to.write_all(&buf[..n / 2]);
            break;
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = (from.shutdown(Shutdown::Both), to.shutdown(Shutdown::Both));
}

fn contains(chunk: &[u8], pattern: &[u8]) -> bool {
    pattern.is_empty() || chunk.windows(pattern.len()).any(|w| w == pattern)
}
