//! The coordinator's store traits by concern and [`Stores`] (all of them), the sink trait
//! [`FencedStore`], and the backends: `memory` (embedded), `redis` (crate `palisade-redis`,
//! feature `redis`), `postgres` (crate `palisade-postgres`, feature `postgres`), `partitioned`
//! and `epoch`. Defined in `palisade-core` and the drivers; gathered here so a user names them
//! in one place.

pub use palisade_core::store::*;
#[cfg(feature = "postgres")]
pub use palisade_postgres as postgres;
#[cfg(feature = "redis")]
pub use palisade_redis as redis;

/// Moves flows on after their steps ended: one pass of what the coordinator does on its own
/// (for tests and tools that drive a store without a coordinator).
pub use crate::flow_driver::advance as advance_flows;

/// Durable epoch sources: somewhere the coordinator's epoch survives when Redis loses its
/// data (a file, a Postgres row).
pub mod epoch {
    pub use palisade_core::store::epoch::*;
    #[cfg(feature = "postgres")]
    pub use palisade_postgres::PostgresEpochSource;
}
