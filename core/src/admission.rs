//! The admission rule (ARCHITECTURE.md §4): the heart of fencing, as a pure function.
//!
//! No I/O and no clock. Each [`FencedStore`](crate::store::FencedStore) backend carries this exact
//! decision to its storage in one atomic operation (a critical section in memory, one Lua script
//! in Redis); a read followed by a separate write would re-open the race this rule closes.
//!
//! # The low watermark, and why forgetting a fence is safe
//!
//! The coordinator publishes a low watermark `W`: every lease whose token is below `W` is no
//! longer current (it expired, settled or was revoked), and `W` only grows. It is the smallest
//! token among the coordinator's live leases, or the next token to grant when none is live;
//! new leases get tokens above every earlier one, so a value that was `W` once stays a lower
//! bound of every current lease forever. A sink keeps the largest `W` it has been given (0
//! before any) and refuses every write with `token < W` as [`Rejection::StaleToken`]
//! `{ highest: W }` — first, before looking for the scope's fence at all.
//!
//! *Claim:* a sink may drop the fence `(F, lease)` of a scope once `F < W` without admitting
//! any write the fence would have refused. *Sketch:* the fence refuses exactly the writes with
//! `T < F`, and those with `T == F` from another lease. Every such `T` is `≤ F < W`, so the
//! `W` check — which never forgets, because `W` only grows — refuses them too. The writes the
//! `W` check refuses beyond that (`F ≤ T < W`) come from leases that are no longer current,
//! whose writes must be refused anyway. So after the drop the scope behaves exactly as before,
//! and a later write (`T ≥ W > F`) re-creates the fence as it would have advanced it.
//!
//! Idempotency keys are a different matter: a job that wrote and then stalled is re-run under
//! a *newer* token, above `W`, and its repeated write must still be a
//! [`Admission::Duplicate`]. So keys are not dropped with the fence; they go when their
//! retention (time and count per scope) has passed. Sink state is therefore bounded by the
//! scopes whose fence is at or above `W` (the live ones) plus the retained keys — not by the
//! jobs ever run.

use std::collections::{HashSet, VecDeque};

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
    /// A write with the same (scope, idempotency key) was applied before — by this
    /// generation or an earlier one, within the key retention; nothing was applied now.
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
    /// The mutation list does not fit the stored data or its own earlier steps (type clash,
    /// non-integer field, i64 overflow, empty field list; see the `mutation` module), or — on
    /// Redis Cluster — names a key outside its scope's slot. No data changed and no key was
    /// recorded, so a corrected retry of the same write still applies. The writer did pass the
    /// ownership checks, though: if its token is above the scope's fence, the fence advanced
    /// to it ([`advance`]), so every older lease of the scope is refused from now
    /// on, exactly as if the write had applied.
    #[error("mutation refused: {why}")]
    Mutation {
        /// Which mutation, and why.
        why: String,
    },
}

impl Rejection {
    /// The newest token this refusal names, if it names one (a stale token's).
    pub fn highest_token(&self) -> Option<u64> {
        match self {
            Rejection::StaleToken { highest, .. } => Some(highest.as_u64()),
            Rejection::TokenConflict { .. } | Rejection::Mutation { .. } => None,
        }
    }

    /// The newest token the sink holds for the scope, which a coordinator must grant above;
    /// `None` for a refusal that says nothing about ownership (a bad mutation).
    pub fn highest(&self) -> Option<FencingToken> {
        match self {
            Self::StaleToken { highest, .. } => Some(*highest),
            Self::TokenConflict { token, .. } => Some(*token),
            Self::Mutation { .. } => None,
        }
    }

    /// Low-cardinality metric label.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::StaleToken { .. } => "stale_token",
            Self::TokenConflict { .. } => "token_conflict",
            Self::Mutation { .. } => "mutation",
        }
    }
}

/// The admission rule of ARCHITECTURE.md §4 on the facts a backend has read under its lock: the
/// scope's newest generation (`None` if the sink keeps no fence for it), whether the write's
/// idempotency key was applied before, and the sink's low watermark. Decides without
/// changing anything; every backend calls this, so there is one rule.
pub fn decide(
    highest: Option<Fence>,
    presented: Fence,
    key_applied: bool,
    watermark: FencingToken,
) -> Admission {
    if presented.token < watermark {
        return Admission::Rejected(Rejection::StaleToken {
            presented: presented.token,
            highest: watermark,
        });
    }
    if let Some(highest) = highest {
        if presented.token < highest.token {
            return Admission::Rejected(Rejection::StaleToken {
                presented: presented.token,
                highest: highest.token,
            });
        }
        if presented.token == highest.token && presented.lease != highest.lease {
            return Admission::Rejected(Rejection::TokenConflict {
                token: presented.token,
                held_by: highest.lease,
                presented_by: presented.lease,
            });
        }
    }
    if key_applied {
        return Admission::Duplicate;
    }
    Admission::Applied
}

/// The fence a scope holds after a write that passed the ownership checks of [`decide`] (it
/// was not refused as stale or conflicting) — whether it then applied, was a duplicate, or was
/// refused for its content: the presented generation if its token is above the held one,
/// otherwise the held one unchanged. Strictly by token: an equal token never replaces the
/// lease holding it (that writer is the same lease, or it was refused as a conflict).
///
/// Why a refused write still fences: its lease was granted token T, which proves that every
/// lease of the scope below T is stale (the coordinator grants a scope's tokens in order and
/// only while no other lease of it is live) — as a producer-epoch bump does in Kafka. Leaving
/// the fence behind would let an expired holder with T' < T apply after T was refused.
pub fn advance(highest: Option<Fence>, presented: Fence) -> Option<Fence> {
    match highest {
        Some(h) if presented.token <= h.token => Some(h),
        _ => Some(presented),
    }
}

/// A sink's per-scope fencing state: the newest generation it has seen and the idempotency
/// keys of the writes it applied.
///
/// Keys are kept across generations (a first design forgot them when the token advanced; see
/// below why this does not). A job that wrote and then stalled before it settled — paused,
/// killed, or cut off from the coordinator — runs again under a newer token; if its writes
/// are keyed by job (the default derived key is job id + write sequence), the re-run's writes
/// are `Duplicate`s instead of second applications. Memory stays bounded: the oldest keys
/// beyond [`ScopeFence::MAX_KEYS`] are forgotten (the Redis sink also forgets keys after a
/// retention time).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScopeFence {
    /// Newest generation seen, `None` before the first write.
    pub highest: Option<Fence>,
    keys: HashSet<IdempotencyKey>,
    order: VecDeque<IdempotencyKey>,
}

impl ScopeFence {
    /// Idempotency keys remembered per scope.
    pub const MAX_KEYS: usize = 10_000;

    /// Decides a write without changing anything; `watermark` is the largest low watermark
    /// the sink has been given (0 before any, see the module docs).
    pub fn decide(
        &self,
        presented: Fence,
        key: &IdempotencyKey,
        watermark: FencingToken,
    ) -> Admission {
        decide(self.highest, presented, self.keys.contains(key), watermark)
    }

    /// Decides a write and records it. The caller applies the mutation in the same critical
    /// section iff this returns [`Admission::Applied`].
    ///
    /// A duplicate from a newer generation still advances `highest`: the sink has now seen
    /// that generation, so every older one must be refused from here on.
    pub fn admit(
        &mut self,
        presented: Fence,
        key: &IdempotencyKey,
        watermark: FencingToken,
    ) -> Admission {
        let admission = self.decide(presented, key, watermark);
        if let Admission::Rejected(_) = admission {
            return admission;
        }
        self.highest = advance(self.highest, presented);
        if admission == Admission::Applied {
            self.keys.insert(key.clone());
            self.order.push_back(key.clone());
            if self.order.len() > Self::MAX_KEYS {
                if let Some(oldest) = self.order.pop_front() {
                    self.keys.remove(&oldest);
                }
            }
        }
        admission
    }

    /// Records that a write [`decide`] admitted was refused for its content
    /// ([`Rejection::Mutation`]): the fence advances as for an applied write, no key is
    /// recorded. Returns whether the fence moved (the caller queues it for collection).
    pub fn refuse_content(&mut self, presented: Fence) -> bool {
        let before = self.highest;
        self.highest = advance(self.highest, presented);
        self.highest != before
    }

    /// Forgets the fence if its token is below `watermark` (safe: see the module docs); the
    /// keys stay. Returns whether it did.
    pub fn collect(&mut self, watermark: FencingToken) -> bool {
        let below = self.highest.is_some_and(|h| h.token < watermark);
        if below {
            self.highest = None;
        }
        below
    }

    /// Forgets one idempotency key (its retention has passed).
    pub fn forget_key(&mut self, key: &IdempotencyKey) {
        if self.keys.remove(key) {
            self.order.retain(|k| k != key);
        }
    }

    /// Neither a fence nor a key left: the scope's state can go.
    pub fn is_empty(&self) -> bool {
        self.highest.is_none() && self.keys.is_empty()
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

    const NO_W: FencingToken = FencingToken::ZERO;

    /// A key forgotten by retention leaves the count retention working on the others
    /// (a mutation test found `forget_key` could wreck the trim order unnoticed).
    #[test]
    fn forgetting_a_key_keeps_the_oldest_first_trim() {
        let mut scope = ScopeFence::default();
        let a = LeaseId::new();
        for k in ["k0", "k1", "k2"] {
            assert_eq!(scope.admit(fence(1, a), &key(k), NO_W), Admission::Applied);
        }
        scope.forget_key(&key("k1"));
        assert_eq!(
            scope.decide(fence(1, a), &key("k1"), NO_W),
            Admission::Applied
        );
        // Fill up to the limit: the oldest remaining key (k0) goes first, k2 stays.
        for i in 0..ScopeFence::MAX_KEYS - 2 {
            scope.admit(fence(1, a), &key(&format!("n{i}")), NO_W);
        }
        assert_eq!(
            scope.decide(fence(1, a), &key("k2"), NO_W),
            Admission::Duplicate
        );
        scope.admit(fence(1, a), &key("last"), NO_W);
        assert_eq!(
            scope.decide(fence(1, a), &key("k0"), NO_W),
            Admission::Applied
        );
        assert_eq!(
            scope.decide(fence(1, a), &key("k2"), NO_W),
            Admission::Duplicate
        );
        assert_eq!(scope.keys.len(), ScopeFence::MAX_KEYS);
    }

    #[test]
    fn below_the_watermark_is_stale_even_without_a_fence() {
        let mut scope = ScopeFence::default();
        let a = LeaseId::new();
        let w = FencingToken::from_u64(50);
        assert_eq!(
            scope.admit(fence(49, a), &key("k"), w),
            Admission::Rejected(Rejection::StaleToken {
                presented: FencingToken::from_u64(49),
                highest: w,
            })
        );
        assert_eq!(scope, ScopeFence::default(), "a refusal changes nothing");
        assert_eq!(scope.admit(fence(50, a), &key("k"), w), Admission::Applied);
        // The watermark check comes first: it refuses even a key the scope already has.
        assert!(matches!(
            scope.admit(fence(50, a), &key("k"), FencingToken::from_u64(51)),
            Admission::Rejected(Rejection::StaleToken { .. })
        ));
    }

    #[test]
    fn collecting_a_fence_below_the_watermark_keeps_keys_and_refusals() {
        let mut scope = ScopeFence::default();
        let (a, b) = (LeaseId::new(), LeaseId::new());
        scope.admit(fence(7, a), &key("job/0"), NO_W);
        let w = FencingToken::from_u64(9);
        assert!(!scope.collect(FencingToken::from_u64(7)), "not below yet");
        assert!(scope.collect(w));
        assert_eq!(scope.highest, None);
        assert!(!scope.is_empty(), "keys outlive the fence");
        // Everything the fence refused is still refused, by the watermark.
        assert!(matches!(
            scope.admit(fence(7, a), &key("late"), w),
            Admission::Rejected(Rejection::StaleToken { .. })
        ));
        // A re-run under a newer token is still a duplicate, and fences again.
        assert_eq!(
            scope.admit(fence(12, b), &key("job/0"), w),
            Admission::Duplicate
        );
        assert_eq!(scope.highest, Some(fence(12, b)));
        scope.forget_key(&key("job/0"));
        assert!(scope.collect(FencingToken::from_u64(13)));
        assert!(scope.is_empty());
    }

    #[test]
    fn first_write_is_applied_and_becomes_highest() {
        let mut scope = ScopeFence::default();
        let a = LeaseId::new();
        assert_eq!(
            scope.admit(fence(71, a), &key("k"), NO_W),
            Admission::Applied
        );
        assert_eq!(scope.highest, Some(fence(71, a)));
    }

    #[test]
    fn lower_token_is_stale() {
        let mut scope = ScopeFence::default();
        let (a, b) = (LeaseId::new(), LeaseId::new());
        scope.admit(fence(72, b), &key("k"), NO_W);
        assert_eq!(
            scope.admit(fence(71, a), &key("other"), NO_W),
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
        scope.admit(fence(5, a), &key("k"), NO_W);
        assert_eq!(
            scope.admit(fence(5, b), &key("fresh"), NO_W),
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
        assert_eq!(
            scope.admit(fence(5, a), &key("k"), NO_W),
            Admission::Applied
        );
        assert_eq!(
            scope.admit(fence(5, a), &key("k"), NO_W),
            Admission::Duplicate
        );
        assert_eq!(
            scope.admit(fence(5, a), &key("k2"), NO_W),
            Admission::Applied
        );
    }

    #[test]
    fn rerun_under_a_newer_token_is_a_duplicate_that_still_fences() {
        let mut scope = ScopeFence::default();
        let (a, b) = (LeaseId::new(), LeaseId::new());
        // A applied, then stalled before settling; B re-runs the job with the same key.
        assert_eq!(
            scope.admit(fence(5, a), &key("job-1/0"), NO_W),
            Admission::Applied
        );
        assert_eq!(
            scope.admit(fence(6, b), &key("job-1/0"), NO_W),
            Admission::Duplicate
        );
        assert_eq!(
            scope.highest,
            Some(fence(6, b)),
            "the newer generation is fenced in"
        );
        assert!(matches!(
            scope.admit(fence(5, a), &key("job-1/1"), NO_W),
            Admission::Rejected(Rejection::StaleToken { .. })
        ));
    }

    #[test]
    fn keys_are_bounded() {
        let mut scope = ScopeFence::default();
        let a = LeaseId::new();
        for i in 0..=ScopeFence::MAX_KEYS {
            scope.admit(fence(1, a), &key(&i.to_string()), NO_W);
        }
        assert_eq!(scope.keys.len(), ScopeFence::MAX_KEYS);
        assert_eq!(
            scope.admit(fence(1, a), &key("0"), NO_W),
            Admission::Applied,
            "oldest forgotten"
        );
        // Re-admitting "0" pushed out "1"; "2" is still remembered.
        assert_eq!(
            scope.admit(fence(1, a), &key("2"), NO_W),
            Admission::Duplicate
        );
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
        assert_eq!(r.highest(), Some(FencingToken::from_u64(2)));
        assert_eq!(Rejection::Mutation { why: "x".into() }.highest(), None);
    }

    /// Killed mutants (issue 23's mutation run): `advance` never lowers a fence, even when
    /// asked with an older generation (a caller that skipped `decide`), and `refuse_content`
    /// says whether the fence moved, which decides whether it is queued for collection.
    #[test]
    fn advance_never_lowers_and_refuse_content_says_whether_it_moved() {
        let (a, b) = (LeaseId::new(), LeaseId::new());
        assert_eq!(advance(Some(fence(5, a)), fence(3, b)), Some(fence(5, a)));
        assert_eq!(advance(Some(fence(5, a)), fence(5, b)), Some(fence(5, a)));
        assert_eq!(advance(Some(fence(5, a)), fence(6, b)), Some(fence(6, b)));
        assert_eq!(advance(None, fence(1, b)), Some(fence(1, b)));
        let mut scope = ScopeFence::default();
        assert!(scope.refuse_content(fence(2, a)), "a first fence moves");
        assert!(!scope.refuse_content(fence(2, a)), "the same one does not");
        assert!(!scope.refuse_content(fence(1, b)), "an older one does not");
        assert!(scope.refuse_content(fence(3, b)), "a newer one does");
    }

    /// Killed mutants: every rejection names its reason as the metrics and the journal label it.
    #[test]
    fn rejections_name_their_reasons() {
        let stale = Rejection::StaleToken {
            presented: FencingToken::from_u64(1),
            highest: FencingToken::from_u64(2),
        };
        let conflict = Rejection::TokenConflict {
            token: FencingToken::from_u64(2),
            held_by: LeaseId::new(),
            presented_by: LeaseId::new(),
        };
        let mutation = Rejection::Mutation {
            why: "overflow".into(),
        };
        assert_eq!(
            [stale.reason(), conflict.reason(), mutation.reason()],
            ["stale_token", "token_conflict", "mutation"]
        );
    }
}
