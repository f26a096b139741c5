//! Redis backends: the coordinator many worker processes share, and a fenced sink.
//!
//! Every operation is one Lua script (`runtime/lua/`), loaded once and run by EVALSHA (redis-rs
//! reloads it on NOSCRIPT), so each is atomic and costs one round trip however many jobs or
//! leases it covers. Times are the Redis server's clock (`TIME`), so worker clocks never
//! decide whether a lease is current.

mod connection;
mod fenced;
mod lease;
mod scripts;

/// The connection pool [`pool`] returns, re-exported so users need no version-matched
/// `deadpool-redis` dependency of their own to name it.
pub use deadpool_redis::Pool;

pub use connection::{cluster, ping, pool, pool_with_ca, redacted, Cluster, Target};
pub use fenced::RedisFencedStore;
pub use lease::RedisLeaseStore;
