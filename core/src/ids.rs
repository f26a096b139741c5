//! Identities and the lease a claim hands out.
//!
//! Everything here is plain data: no I/O, no clocks beyond the `Instant` a lease carries.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use uuid::Uuid;

macro_rules! uuid_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(Uuid);

        impl $name {
            /// A fresh random (v4) id.
            pub fn new() -> Self {
                Self(Uuid::new_v4())
            }

            /// The underlying UUID.
            pub fn as_uuid(&self) -> &Uuid {
                &self.0
            }
        }

        impl Default for $name {
            fn default() -> Self {
                Self::new()
            }
        }

        impl From<Uuid> for $name {
            fn from(id: Uuid) -> Self {
                Self(id)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({})", stringify!($name), self.0)
            }
        }
    };
}

uuid_id!(
    /// Identifies one enqueued job for its whole life (ready → leased → completed / dead).
    JobId
);

uuid_id!(
    /// Identifies one flow ([`Flow`](crate::flow::Flow)) for its whole life.
    FlowId
);

uuid_id!(
    /// Opaque id of one successful claim, used to renew, complete, fail or release it.
    ///
    /// It is random (UUID v4) on purpose: knowing one lease id tells nothing about the next,
    /// so a stale holder cannot guess its way back into a claim.
    LeaseId
);

/// Strictly increasing per scope: `epoch << 40 | counter`.
///
/// Stored and compared as a plain `u64`, so a sink (Lua, SQL `BIGINT`) needs no knowledge of
/// the split. The epoch moves whenever the coordinator cannot prove its counters survived; the
/// counter never wraps — running out of counter moves to the next epoch instead.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct FencingToken(u64);

impl FencingToken {
    /// Bits reserved for the per-epoch counter.
    pub const COUNTER_BITS: u32 = 40;
    /// Largest counter value inside one epoch.
    pub const MAX_COUNTER: u64 = (1 << Self::COUNTER_BITS) - 1;
    /// Largest epoch; keeps every token inside a signed 64-bit integer (Postgres `BIGINT`).
    pub const MAX_EPOCH: u32 = (1 << 23) - 1;

    /// Builds a token from its parts.
    ///
    /// # Panics
    /// If `counter` exceeds [`Self::MAX_COUNTER`] or `epoch` exceeds [`Self::MAX_EPOCH`]; both
    /// are programming errors in a backend, never caused by input.
    pub fn new(epoch: u32, counter: u64) -> Self {
        assert!(epoch <= Self::MAX_EPOCH, "epoch {epoch} out of range");
        assert!(
            counter <= Self::MAX_COUNTER,
            "counter {counter} out of range"
        );
        Self((u64::from(epoch) << Self::COUNTER_BITS) | counter)
    }

    /// Builds a token from parts read back from storage: `None` when either is out of range
    /// (a corrupt record), so a reply can never panic the reader.
    pub fn try_new(epoch: u64, counter: u64) -> Option<Self> {
        (epoch <= u64::from(Self::MAX_EPOCH) && counter <= Self::MAX_COUNTER)
            .then(|| Self::new(epoch as u32, counter))
    }

    /// The token at `counter` in `epoch` where `counter` may be one past the last
    /// (`MAX_COUNTER + 1`, which is the next epoch's token 0): the form a low watermark takes
    /// when it is "the next token to grant". `None` when out of range.
    #[doc(hidden)]
    pub fn watermark_at(epoch: u64, counter: u64) -> Option<Self> {
        (epoch <= u64::from(Self::MAX_EPOCH) && counter <= Self::MAX_COUNTER + 1)
            .then(|| Self((epoch << Self::COUNTER_BITS) + counter))
    }

    /// The smallest token: below every token ever granted (a watermark before any is known).
    pub const ZERO: Self = Self(0);

    /// Reinterprets a stored integer.
    pub fn from_u64(raw: u64) -> Self {
        Self(raw)
    }

    /// The stored integer form.
    pub fn as_u64(&self) -> u64 {
        self.0
    }

    /// The epoch part.
    pub fn epoch(&self) -> u32 {
        (self.0 >> Self::COUNTER_BITS) as u32
    }

    /// The counter part.
    pub fn counter(&self) -> u64 {
        self.0 & Self::MAX_COUNTER
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl fmt::Debug for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FencingToken({}:{})", self.epoch(), self.counter())
    }
}

macro_rules! string_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            /// Wraps a string.
            pub fn new(value: impl Into<String>) -> Self {
                Self(value.into())
            }

            /// The string form.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({:?})", stringify!($name), self.0)
            }
        }

        impl From<&str> for $name {
            fn from(value: &str) -> Self {
                Self::new(value)
            }
        }

        impl From<String> for $name {
            fn from(value: String) -> Self {
                Self(value)
            }
        }
    };
}

string_id!(
    /// The protected resource a lease covers ("account:42"). Coordinator and sink use the same
    /// string; a job without an explicit scope gets its default scope `job:<id>`.
    Scope
);

impl Scope {
    /// The reserved prefix of default scopes: `job:` followed by a job id.
    const JOB_PREFIX: &'static str = "job:";

    /// The default scope of a job enqueued without one: `job:<id>`. It lives in a namespace
    /// of its own — [`NewJob::validate`](crate::job::NewJob::validate) refuses a named scope of
    /// this form — so a named scope can never collide with another job's default scope (two
    /// live leases on one scope, ARCHITECTURE.md invariant 3).
    pub fn of_job(id: JobId) -> Self {
        Self(format!("{}{id}", Self::JOB_PREFIX))
    }

    /// The job whose default scope this is, if it is one.
    pub fn job(&self) -> Option<JobId> {
        let id = self.0.strip_prefix(Self::JOB_PREFIX)?;
        Uuid::try_parse(id).ok().map(JobId::from)
    }
}

string_id!(
    /// Names one logical write of a job; a second write with the same (scope, key) is a
    /// duplicate, not applied twice — a same-token retry and the same write repeated by a
    /// re-run under a newer token alike (kept across generations, within the retention).
    IdempotencyKey
);

/// One successful claim: who holds which scope, with which token, until when.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    /// Opaque id for renew / complete / fail.
    pub id: LeaseId,
    /// The generation this claim writes under.
    pub token: FencingToken,
    /// The resource it covers.
    pub scope: Scope,
    /// Local deadline, measured from *before* the claim request was sent, so it can only be
    /// earlier than the coordinator's own expiry, never later.
    pub expires_at: Instant,
}

impl Lease {
    /// Time left before the lease may be granted to someone else (zero once expired).
    pub fn remaining(&self) -> Duration {
        self.expires_at
            .saturating_duration_since(crate::clock::now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_orders_by_epoch_then_counter() {
        let a = FencingToken::new(1, FencingToken::MAX_COUNTER);
        let b = FencingToken::new(2, 1);
        assert!(a < b);
        assert_eq!(b.epoch(), 2);
        assert_eq!(b.counter(), 1);
        assert_eq!(FencingToken::from_u64(b.as_u64()), b);
    }

    #[test]
    fn max_token_fits_a_signed_bigint() {
        let max = FencingToken::new(FencingToken::MAX_EPOCH, FencingToken::MAX_COUNTER);
        assert!(max.as_u64() <= i64::MAX as u64);
    }
}
