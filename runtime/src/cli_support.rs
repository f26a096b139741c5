//! What `palisade-cli` takes from the library's insides, in one place so the list stays short
//! and seen: the name rule and batch checks its commands apply before sending, the one enqueue
//! path, the host name a worker reports, the rate-limited warning, the write deadline its servers
//! keep, and the checks and URL rewrites of its flags. Hidden
//! from the docs and not part of the API: it changes with palisade-cli, in any release.

pub use crate::client::complete_waitpoint;
pub use crate::enqueue::enqueue_counted;
pub use crate::job::{check_name, validate_batch};
pub use crate::worker::hostname;
pub use crate::write_deadline::WriteDeadline;
// (Refusals a server logs at most once per 10 s per reason.)
pub use palisade_core::warn_repeated;

#[cfg(feature = "postgres")]
pub use crate::store::postgres::check_key_part;
#[cfg(feature = "postgres")]
pub use crate::store::postgres::tls::{check_tls, with_default_root};
#[cfg(feature = "redis")]
pub use crate::store::redis::check_prefix;
