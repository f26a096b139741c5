//! Random write histories against the admission rule and the in-memory fenced store.
//!
//! Each invariant of ARCHITECTURE.md §3 that the sink owns is a named check over a recorded
//! history; proptest prints the failing (shrunk) case and its seed so it replays.

use std::collections::{HashMap, HashSet};

use palisade::*;
use proptest::prelude::*;

/// One write attempt: which generation writes, with which key. A small share of writes come
/// from an impostor lease presenting an existing token (a coordinator counter regression).
#[derive(Clone, Debug)]
struct Attempt {
    generation: usize,
    key: u8,
    impostor: bool,
    /// Before this attempt, the coordinator publishes a watermark at this generation's token
    /// (it only grows: a lower one is ignored).
    raise_watermark: Option<usize>,
    /// Before this attempt, the sink collects the scope's fence if it is below the watermark.
    collect: bool,
    /// The write's mutation list does not fit (refused for its content, after the ownership
    /// checks).
    unfit: bool,
}

fn attempts() -> impl Strategy<Value = Vec<Attempt>> {
    prop::collection::vec(
        (
            0usize..6,
            0u8..4,
            prop::bool::weighted(0.1),
            prop::option::weighted(0.15, 0usize..6),
            prop::bool::weighted(0.3),
            prop::bool::weighted(0.2),
        )
            .prop_map(
                |(generation, key, impostor, raise_watermark, collect, unfit)| Attempt {
                    generation,
                    key,
                    impostor,
                    raise_watermark,
                    collect,
                    unfit,
                },
            ),
        1..60,
    )
}

#[derive(Clone, Debug)]
struct Record {
    fence: Fence,
    key: IdempotencyKey,
    admission: Admission,
}

fn generations(n: usize) -> Vec<Fence> {
    (0..n)
        .map(|g| Fence {
            token: FencingToken::new(1, g as u64 + 1),
            lease: LeaseId::new(),
        })
        .collect()
}

fn fence_for(a: &Attempt, gens: &[Fence], impostors: &[LeaseId]) -> Fence {
    let mut fence = gens[a.generation];
    if a.impostor {
        fence.lease = impostors[a.generation];
    }
    fence
}

fn accepted(r: &&Record) -> bool {
    !matches!(r.admission, Admission::Rejected(_))
}

/// Whether the write passed the ownership checks: accepted, or refused for its content only
/// (invariant 8: such a writer still fences).
fn owned(r: &&Record) -> bool {
    accepted(r) || matches!(r.admission, Admission::Rejected(Rejection::Mutation { .. }))
}

/// Invariants 1 and 8: once T passed the ownership checks (applied, seen as a duplicate, or
/// refused for its content), nothing below T is accepted.
fn no_stale_write(history: &[Record]) -> Result<(), String> {
    let mut highest: Option<FencingToken> = None;
    for r in history.iter().filter(owned) {
        if let Some(h) = highest {
            if r.fence.token < h && accepted(&r) {
                return Err(format!("accepted {} after {h}", r.fence.token));
            }
        }
        highest = highest.max(Some(r.fence.token));
    }
    Ok(())
}

/// Invariant 2: a token's accepted writes are all from one lease.
fn no_shared_generation(history: &[Record]) -> Result<(), String> {
    let mut owner: HashMap<FencingToken, LeaseId> = HashMap::new();
    for r in history.iter().filter(accepted) {
        let first = *owner.entry(r.fence.token).or_insert(r.fence.lease);
        if first != r.fence.lease {
            return Err(format!("token {} applied for two leases", r.fence.token));
        }
    }
    Ok(())
}

/// Invariant 5, strengthened: a key applies at most once per scope — within one generation
/// and across the generations of a re-run job.
fn at_most_once_per_key(history: &[Record]) -> Result<(), String> {
    let mut seen = HashSet::new();
    for r in history.iter().filter(|r| r.admission == Admission::Applied) {
        if !seen.insert(r.key.clone()) {
            return Err(format!(
                "{} applied twice (again at {})",
                r.key, r.fence.token
            ));
        }
    }
    Ok(())
}

/// The rule restated over the whole history instead of the compact per-scope state (which
/// may also have forgotten its fence below the watermark): the optimised state must decide
/// exactly like it.
fn reference_decision(
    history: &[Record],
    fence: Fence,
    key: &IdempotencyKey,
    watermark: FencingToken,
) -> Admission {
    if fence.token < watermark {
        return Admission::Rejected(Rejection::StaleToken {
            presented: fence.token,
            highest: watermark,
        });
    }
    let seen: Vec<&Record> = history.iter().filter(owned).collect();
    if let Some(highest) = seen.iter().map(|r| r.fence.token).max() {
        if fence.token < highest {
            return Admission::Rejected(Rejection::StaleToken {
                presented: fence.token,
                highest,
            });
        }
        let holder = seen
            .iter()
            .find(|r| r.fence.token == highest)
            .expect("highest was seen")
            .fence
            .lease;
        if fence.token == highest && holder != fence.lease {
            return Admission::Rejected(Rejection::TokenConflict {
                token: highest,
                held_by: holder,
                presented_by: fence.lease,
            });
        }
    }
    let applied_before = history
        .iter()
        .any(|r| r.admission == Admission::Applied && &r.key == key);
    if applied_before {
        Admission::Duplicate
    } else {
        Admission::Applied
    }
}

fn check_all(history: &[Record]) -> Result<(), String> {
    no_stale_write(history)?;
    no_shared_generation(history)?;
    at_most_once_per_key(history)
}

proptest! {
    #[test]
    fn admission_rule_matches_reference_and_keeps_invariants(attempts in attempts()) {
        let gens = generations(6);
        let impostors: Vec<LeaseId> = (0..6).map(|_| LeaseId::new()).collect();
        let mut scope = ScopeFence::default();
        let mut history = Vec::new();
        let mut watermark = FencingToken::ZERO;
        for a in &attempts {
            if let Some(g) = a.raise_watermark {
                watermark = watermark.max(gens[g].token);
            }
            if a.collect {
                scope.collect(watermark);
            }
            let fence = fence_for(a, &gens, &impostors);
            let key = IdempotencyKey::new(format!("k{}", a.key));
            let mut expected = reference_decision(&history, fence, &key, watermark);
            let admission = if a.unfit && scope.decide(fence, &key, watermark) == Admission::Applied {
                scope.refuse_content(fence);
                Admission::Rejected(Rejection::Mutation { why: "unfit".into() })
            } else {
                scope.admit(fence, &key, watermark)
            };
            if a.unfit && expected == Admission::Applied {
                expected = Admission::Rejected(Rejection::Mutation { why: "unfit".into() });
            }
            prop_assert_eq!(&admission, &expected);
            history.push(Record { fence, key, admission });
        }
        check_all(&history).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn memory_sink_applies_exactly_the_admitted_writes(attempts in attempts()) {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let gens = generations(6);
        let impostors: Vec<LeaseId> = (0..6).map(|_| LeaseId::new()).collect();
        let sink = MemoryFencedStore::new();
        let scope = Scope::new("acct");
        let mut history = Vec::new();
        for a in &attempts {
            let fence = fence_for(a, &gens, &impostors);
            let key = IdempotencyKey::new(format!("k{}", a.key));
            // An unfit write: a HashSet with no fields, refused for its content.
            let mutations = if a.unfit {
                vec![Mutation::HashSet { key: "acct".into(), fields: vec![] }]
            } else {
                vec![Mutation::HashIncr { key: "acct".into(), field: "n".into(), by: 1 }]
            };
            let admission = rt.block_on(sink.write(FencedWrite {
                scope: scope.clone(),
                fence,
                key: key.clone(),
                mutations,
            })).unwrap();
            history.push(Record { fence, key, admission });
        }
        check_all(&history).map_err(TestCaseError::fail)?;
        let applied = history.iter().filter(|r| r.admission == Admission::Applied).count();
        let stored = match rt.block_on(sink.read("acct")).unwrap() {
            Some(Value::Hash(h)) => h["n"].parse::<usize>().unwrap(),
            None => 0,
            other => panic!("unexpected {other:?}"),
        };
        prop_assert_eq!(stored, applied, "mutations applied != writes admitted");
    }
}

/// The checks themselves must be able to fail (a check that cannot fail is a defect).
#[test]
fn invariant_checks_catch_bad_histories() {
    let (a, b) = (LeaseId::new(), LeaseId::new());
    let rec = |t: u64, lease, key: &str| Record {
        fence: Fence {
            token: FencingToken::from_u64(t),
            lease,
        },
        key: IdempotencyKey::new(key),
        admission: Admission::Applied,
    };
    assert!(no_stale_write(&[rec(2, a, "k"), rec(1, b, "k")]).is_err());
    // A content refusal at 2 fences 1 out (the sink that did not advance on it applied 1).
    let refused = Record {
        admission: Admission::Rejected(Rejection::Mutation { why: "x".into() }),
        ..rec(2, a, "k")
    };
    assert!(no_stale_write(&[refused.clone(), rec(1, b, "j")]).is_err());
    assert!(no_stale_write(&[rec(1, b, "j"), refused]).is_ok());
    assert!(no_shared_generation(&[rec(2, a, "k"), rec(2, b, "j")]).is_err());
    assert!(at_most_once_per_key(&[rec(2, a, "k"), rec(2, a, "k")]).is_err());
    assert!(at_most_once_per_key(&[rec(1, a, "k"), rec(2, b, "k")]).is_err());
    assert!(check_all(&[rec(1, a, "k"), rec(2, b, "j"), rec(2, b, "i")]).is_ok());
}
