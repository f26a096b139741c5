//! Palisade's own test machinery, shared by every crate's tests (never published):
//!
//! - [`servers`]: private `redis-server` processes and clusters on free loopback ports, and
//!   throw-away PostgreSQL schemas — tests never touch the shared Redis on 6379.
//! - [`tls`]: a CA and server certificates made in the test, for TLS servers.
//! - [`net`]: free ports, a bare HTTP GET, a polling wait, a recording HTTP receiver.
//! - [`process`]: a worker binary under test as a child process (signals, `/metrics`, kill on
//!   drop).
//! - [`proxy`]: a seeded TCP fault proxy (latency, drops, partitions, replies cut half-way)
//!   between a client under test and its server.
//! - [`suite`]: one conformance suite per store trait, run against every backend
//!   ([`lease_store_suite!`], [`fenced_store_suite!`]).
//! - [`clock`]: a process's wall clock skewed and jumped at will (libfaketime).
//! - [`failover`]: what must hold after the coordinator's master failed over.
//! - [`faults`]: a [`LeaseStore`](palisade::LeaseStore) wrapper that makes chosen operations
//!   fail, to force the failure paths; it implements only the trait it changes.

#![allow(missing_docs)]

pub mod clock;
pub mod failover;
pub mod faults;
pub mod net;
pub mod otlp;
pub mod process;
pub mod proxy;
pub mod servers;
pub mod suite;
pub mod tls;

/// For the suite macros' expansions.
#[doc(hidden)]
pub use futures_util;

pub use clock::SkewedClock;
pub use faults::{Faults, Op};
pub use net::{free_port, free_ports, http_get, http_receiver, wait_for, Request};
pub use otlp::{OtlpReceiver, ReceivedSpan};
pub use process::Process;
pub use proxy::{FaultProxy, LinkFaults, ProxyStats};
pub use servers::{
    drop_postgres_schema, fresh_postgres_schema, postgres_url, PgBouncer, PostgresTls,
    RedisCluster, RedisSentinels, RedisServer,
};

/// Every `palisade_…` metric name `text` (a dashboard, an alert rule file) mentions, in order,
/// with repeats.
pub fn referenced_metrics(text: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("palisade_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        names.push(tail[..end].to_string());
        rest = &tail[end..];
    }
    names
}
