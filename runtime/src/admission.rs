//! The admission rule (DESIGN.md §4): the heart of fencing, as a pure function.
//!
//! No I/O and no clock. Each [`FencedStore`](crate::FencedStore) backend carries this exact
//! decision to its storage in one atomic operation (a critical section in memory, one Lua script
//! in Redis); a read followed by a separate write would re-open the race this rule closes.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};

use crate::ids::{FencingToken, IdempotencyKey, LeaseId};

/// The generation a write presents, or the newest one a sink has accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Fence {
    /// Fencing token of the lease.
    pub token: FencingToken,
    /// Lease that holds the token.
    pub lease: LeaseId,
}

/// What a sink did with one write.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Admission {
    /// The mutation was applied.
    Applied,
    /// Same (scope, token, key) was applied before; nothing was applied now.
    Duplicate,
    /// The writer no longer owns the scope; nothing was applied.
    Rejected(Rejection),
}

impl Admission {
    /// `Ok` for applied or duplicate writes, the rejection otherwise — so a handler can write
    /// `sink.write(..).await?.accepted()?`.
    pub fn accepted(self) -> Result<(), Rejection> {
        match self {
            Self::Applied | Self::Duplicate => Ok(()),
            Self::Rejected(rejection) => Err(rejection),
        }
    }
}

/// Why a sink refused a write. Both sides are carried so the refusal can be acted on (the
/// coordinator reseeds above `highest`) and read in a log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[non_exhaustive]
pub enum Rejection {
    /// A newer generation has already written to this scope.
    #[error("stale token {presented}: the sink already accepted {highest}")]
    StaleToken {
        /// Token the writer presented.
        presented: FencingToken,
        /// Newest token the sink accepted for the scope.
        highest: FencingToken,
    },
    /// Same token, different lease: the coordinator granted one token twice (a counter
    /// regression). Refusing makes the regression visible instead of a silent double writer.
    #[error("token {token} is held by lease {held_by}, not {presented_by}")]
    TokenConflict {
        /// The contested token.
        token: FencingToken,
        /// Lease the sink accepted that token from first.
        held_by: LeaseId,
        /// Lease that presented it now.
        presented_by: LeaseId,
    },
}

impl Rejection {
    /// The newest token the sink holds for the scope; a coordinator must grant above it.
    pub fn highest(&self) -> FencingToken {
        match self {
            Self::StaleToken { highest, .. } => *highest,
            Self::TokenConflict { token, .. } => *token,
        }
    }

    /// Low-cardinality metric label.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::StaleToken { .. } => "stale_token",
            Self::TokenConflict { .. } => "token_conflict",
        }
    }
}

/// A sink's per-scope fencing state: the newest generation it accepted and the idempotency
/// keys applied under it.
///
/// Keys are kept only for the newest token: an older generation can never write again, so its
/// keys are dead weight — which also bounds memory per scope.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScopeFence {
    /// Newest accepted generation, `None` before the first write.
    pub highest: Option<Fence>,
    /// Keys applied under `highest.token`.
    pub keys: HashSet<IdempotencyKey>,
}

impl ScopeFence {
    /// Decides a write without changing anything.
    pub fn decide(&self, presented: Fence, key: &IdempotencyKey) -> Admission {
        let Some(highest) = self.highest else {
            return Admission::Applied;
        };
        if presented.token < highest.token {
            return Admission::Rejected(Rejection::StaleToken {
                presented: presented.token,
                highest: highest.token,
            });
        }
        if presented.token == highest.token {
            if presented.lease != highest.lease {
                return Admission::Rejected(Rejection::TokenConflict {
                    token: presented.token,
                    held_by: highest.lease,
                    presented_by: presented.lease,
                });
            }
            if self.keys.contains(key) {
                return Admission::Duplicate;
            }
        }
        Admission::Applied
    }

    /// Decides a write and, when it is applied, records it. The caller applies the mutation in
    /// the same critical section iff this returns [`Admission::Applied`].
    pub fn admit(&mut self, presented: Fence, key: &IdempotencyKey) -> Admission {
        let admission = self.decide(presented, key);
        if admission == Admission::Applied {
            if self.highest.is_none_or(|h| presented.token > h.token) {
                self.highest = Some(presented);
                self.keys.clear();
            }
            self.keys.insert(key.clone());
        }
        admission
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fence(token: u64, lease: LeaseId) -> Fence {
        Fence {
            token: FencingToken::from_u64(token),
            lease,
        }
    }

    fn key(k: &str) -> IdempotencyKey {
        IdempotencyKey::new(k)
    }

    #[test]
    fn first_write_is_applied_and_becomes_highest() {
        let mut scope = ScopeFence::default();
        let a = LeaseId::new();
        assert_eq!(scope.admit(fence(71, a), &key("k")), Admission::Applied);
        assert_eq!(scope.highest, Some(fence(71, a)));
    }

    #[test]
    fn lower_token_is_stale() {
        let mut scope = ScopeFence::default();
        let (a, b) = (LeaseId::new(), LeaseId::new());
        scope.admit(fence(72, b), &key("k"));
        assert_eq!(
            scope.admit(fence(71, a), &key("other")),
            Admission::Rejected(Rejection::StaleToken {
                presented: FencingToken::from_u64(71),
                highest: FencingToken::from_u64(72),
            })
        );
        assert_eq!(
            scope.highest,
            Some(fence(72, b)),
            "a refusal changes nothing"
        );
    }

    #[test]
    fn equal_token_from_another_lease_conflicts() {
        let mut scope = ScopeFence::default();
        let (a, b) = (LeaseId::new(), LeaseId::new());
        scope.admit(fence(5, a), &key("k"));
        assert_eq!(
            scope.admit(fence(5, b), &key("fresh")),
            Admission::Rejected(Rejection::TokenConflict {
                token: FencingToken::from_u64(5),
                held_by: a,
                presented_by: b,
            })
        );
    }

    #[test]
    fn same_generation_retry_is_a_duplicate() {
        let mut scope = ScopeFence::default();
        let a = LeaseId::new();
        assert_eq!(scope.admit(fence(5, a), &key("k")), Admission::Applied);
        assert_eq!(scope.admit(fence(5, a), &key("k")), Admission::Duplicate);
        assert_eq!(scope.admit(fence(5, a), &key("k2")), Admission::Applied);
    }

    #[test]
    fn higher_token_forgets_old_keys() {
        let mut scope = ScopeFence::default();
        let (a, b) = (LeaseId::new(), LeaseId::new());
        scope.admit(fence(5, a), &key("k"));
        assert_eq!(scope.admit(fence(6, b), &key("k")), Admission::Applied);
        assert_eq!(scope.keys.len(), 1);
        assert_eq!(scope.highest, Some(fence(6, b)));
    }

    #[test]
    fn accepted_maps_rejections_to_err() {
        assert!(Admission::Applied.accepted().is_ok());
        assert!(Admission::Duplicate.accepted().is_ok());
        let r = Rejection::StaleToken {
            presented: FencingToken::from_u64(1),
            highest: FencingToken::from_u64(2),
        };
        assert_eq!(Admission::Rejected(r.clone()).accepted(), Err(r.clone()));
        assert_eq!(r.highest(), FencingToken::from_u64(2));
    }
}
