//! Cases for fenced sinks ([`FencedStore`]): the admission rule, all-or-nothing mutations,
//! the watermark.

use super::*;

/// Token `token` of `lease`.
pub fn fence(token: u64, lease: LeaseId) -> Fence {
    Fence {
        token: FencingToken::from_u64(token),
        lease,
    }
}

/// A write of `mutations` to `scope` under `f`, named `key`.
pub fn write(scope: &str, f: Fence, key: &str, mutations: Vec<Mutation>) -> FencedWrite {
    FencedWrite {
        scope: Scope::new(scope),
        fence: f,
        key: IdempotencyKey::new(key),
        mutations,
    }
}

/// One `Set` of `key` to `value`.
pub fn set(key: &str, value: &str) -> Vec<Mutation> {
    vec![Mutation::Set {
        key: key.into(),
        value: value.into(),
    }]
}

pub async fn admission_rule_end_to_end(sink: Arc<dyn FencedStore>, ns: String) {
    let (a, b, c) = (LeaseId::new(), LeaseId::new(), LeaseId::new());
    let k = format!("{ns}v");
    let w = |f, key: &str, v: &str| write(&format!("{ns}s"), f, key, set(&k, v));
    assert_eq!(
        sink.write(w(fence(71, a), "1", "A1")).await.unwrap(),
        Admission::Applied
    );
    assert_eq!(
        sink.write(w(fence(71, a), "1", "A1-again")).await.unwrap(),
        Admission::Duplicate
    );
    // The same logical write re-run by a newer generation is a duplicate — yet it fences.
    assert_eq!(
        sink.write(w(fence(72, b), "1", "B-rerun")).await.unwrap(),
        Admission::Duplicate
    );
    assert_eq!(
        sink.write(w(fence(71, a), "3", "A3")).await.unwrap(),
        Admission::Rejected(Rejection::StaleToken {
            presented: FencingToken::from_u64(71),
            highest: FencingToken::from_u64(72),
        })
    );
    assert_eq!(
        sink.write(w(fence(72, b), "2", "B1")).await.unwrap(),
        Admission::Applied
    );
    assert_eq!(
        sink.write(w(fence(71, a), "2", "A2")).await.unwrap(),
        Admission::Rejected(Rejection::StaleToken {
            presented: FencingToken::from_u64(71),
            highest: FencingToken::from_u64(72),
        })
    );
    assert_eq!(
        sink.write(w(fence(72, c), "9", "C")).await.unwrap(),
        Admission::Rejected(Rejection::TokenConflict {
            token: FencingToken::from_u64(72),
            held_by: b,
            presented_by: c,
        })
    );
    assert_eq!(sink.read(&k).await.unwrap(), Some(Value::Text("B1".into())));
    assert_eq!(
        sink.highest(&Scope::new(format!("{ns}s"))).await.unwrap(),
        Some(fence(72, b))
    );
}

pub async fn mutations_apply_whole_or_not_at_all(sink: Arc<dyn FencedStore>, ns: String) {
    let a = LeaseId::new();
    let (h, t) = (format!("{ns}h"), format!("{ns}t"));
    let muts = vec![
        Mutation::HashSet {
            key: h.clone(),
            fields: vec![("name".into(), "acme".into())],
        },
        Mutation::HashIncr {
            key: h.clone(),
            field: "n".into(),
            by: 5,
        },
        Mutation::HashIncr {
            key: h.clone(),
            field: "n".into(),
            by: -2,
        },
        Mutation::Set {
            key: t.clone(),
            value: "text".into(),
        },
    ];
    let scope = format!("{ns}s");
    assert_eq!(
        sink.write(write(&scope, fence(1, a), "k1", muts))
            .await
            .unwrap(),
        Admission::Applied
    );
    let Some(Value::Hash(hash)) = sink.read(&h).await.unwrap() else {
        panic!("hash missing")
    };
    assert_eq!((hash["name"].as_str(), hash["n"].as_str()), ("acme", "3"));
    // Incrementing a non-integer fails the whole write; the fence moves up to its token
    // (the writer owned the scope), its key is not recorded.
    let bad = vec![
        Mutation::HashIncr {
            key: h.clone(),
            field: "n".into(),
            by: 1,
        },
        Mutation::HashIncr {
            key: h.clone(),
            field: "name".into(),
            by: 1,
        },
    ];
    let refused = LeaseId::new();
    let r = sink
        .write(write(&scope, fence(2, refused), "k2", bad))
        .await;
    assert!(
        matches!(r, Ok(Admission::Rejected(Rejection::Mutation { .. }))),
        "{r:?}"
    );
    let Some(Value::Hash(hash)) = sink.read(&h).await.unwrap() else {
        panic!("hash missing")
    };
    assert_eq!(hash["n"], "3", "a refused write changed data");
    assert_eq!(
        sink.highest(&Scope::new(&*scope)).await.unwrap(),
        Some(fence(2, refused))
    );
    // Type clash: a string key is not a hash.
    let clash = vec![Mutation::HashIncr {
        key: t.clone(),
        field: "f".into(),
        by: 1,
    }];
    assert_eq!(
        sink.write(write(&scope, fence(2, refused), "k3", clash))
            .await
            .unwrap(),
        Admission::Rejected(Rejection::Mutation {
            why: format!("mutation 0: {t} holds a string, not a hash")
        })
    );
    assert_eq!(sink.read(&format!("{ns}missing")).await.unwrap(), None);
}

/// ARCHITECTURE.md invariant 8: a write refused for its content still fences. Its lease passed the
/// ownership checks with token T, which proves every lease below T stale; an older holder
/// that writes after the refusal is refused, while the refused writer's corrected retry (same
/// key: none was recorded) applies. Strictly by token, and only after the ownership checks.
pub async fn a_content_refusal_still_fences(sink: Arc<dyn FencedStore>, ns: String) {
    let (t1, t2, other) = (LeaseId::new(), LeaseId::new(), LeaseId::new());
    let scope = format!("{ns}doc");
    let doc = format!("{ns}d:doc");
    let highest = |sink: Arc<dyn FencedStore>, scope: String| async move {
        sink.highest(&Scope::new(scope)).await.unwrap()
    };
    // The case: T2's [Set doc, HashSet doc] clashes with its own first step.
    let bad = vec![
        Mutation::Set {
            key: doc.clone(),
            value: "v2".into(),
        },
        Mutation::HashSet {
            key: doc.clone(),
            fields: vec![("f".into(), "x".into())],
        },
    ];
    let r = sink.write(write(&scope, fence(2, t2), "t2/0", bad)).await;
    assert!(
        matches!(r, Ok(Admission::Rejected(Rejection::Mutation { .. }))),
        "{r:?}"
    );
    assert_eq!(sink.read(&doc).await.unwrap(), None, "no data changed");
    assert_eq!(
        highest(sink.clone(), scope.clone()).await,
        Some(fence(2, t2))
    );
    // T1 < T2, its lease expired: its write must not apply.
    assert_eq!(
        sink.write(write(&scope, fence(1, t1), "t1/0", set(&doc, "stale")))
            .await
            .unwrap(),
        Admission::Rejected(Rejection::StaleToken {
            presented: FencingToken::from_u64(1),
            highest: FencingToken::from_u64(2),
        })
    );
    // Another lease presenting T2 conflicts, and a bad write of it never replaces the fence.
    let clash = vec![Mutation::HashSet {
        key: doc.clone(),
        fields: vec![],
    }];
    assert!(matches!(
        sink.write(write(&scope, fence(2, other), "o/0", clash))
            .await
            .unwrap(),
        Admission::Rejected(Rejection::TokenConflict { .. })
    ));
    assert_eq!(
        highest(sink.clone(), scope.clone()).await,
        Some(fence(2, t2))
    );
    // A content refusal at the fence's own token (the same lease) leaves it as it is.
    let empty = vec![Mutation::HashSet {
        key: doc.clone(),
        fields: vec![],
    }];
    assert!(matches!(
        sink.write(write(&scope, fence(2, t2), "t2/1", empty))
            .await
            .unwrap(),
        Admission::Rejected(Rejection::Mutation { .. })
    ));
    assert_eq!(
        highest(sink.clone(), scope.clone()).await,
        Some(fence(2, t2))
    );
    // The corrected retry under the same key applies: the refusal recorded no key.
    assert_eq!(
        sink.write(write(&scope, fence(2, t2), "t2/0", set(&doc, "v2")))
            .await
            .unwrap(),
        Admission::Applied
    );
    assert_eq!(
        sink.read(&doc).await.unwrap(),
        Some(Value::Text("v2".into()))
    );

    // In one batch: a refused write fences the older writes decided after it.
    let batch_scope = format!("{ns}batch");
    let batch_key = format!("{ns}d:batch");
    let (t5, t4) = (LeaseId::new(), LeaseId::new());
    let overflow = vec![
        Mutation::HashIncr {
            key: batch_key.clone(),
            field: "n".into(),
            by: i64::MAX,
        },
        Mutation::HashIncr {
            key: batch_key.clone(),
            field: "n".into(),
            by: 1,
        },
    ];
    let replies = sink
        .write_batch(vec![
            write(&batch_scope, fence(5, t5), "t5/0", overflow),
            write(&batch_scope, fence(4, t4), "t4/0", set(&batch_key, "late")),
        ])
        .await
        .unwrap();
    assert!(
        matches!(
            replies[0],
            Ok(Admission::Rejected(Rejection::Mutation { .. }))
        ),
        "{replies:?}"
    );
    assert!(
        matches!(
            replies[1],
            Ok(Admission::Rejected(Rejection::StaleToken { .. }))
        ),
        "{replies:?}"
    );
    assert_eq!(sink.read(&batch_key).await.unwrap(), None);

    // Below the watermark a content refusal is never reached: stale, and nothing moves.
    let low_scope = format!("{ns}low");
    sink.observe_watermark(FencingToken::from_u64(10));
    let bad = vec![Mutation::HashSet {
        key: format!("{ns}d:low"),
        fields: vec![],
    }];
    assert!(matches!(
        sink.write(write(&low_scope, fence(9, LeaseId::new()), "l/0", bad))
            .await
            .unwrap(),
        Admission::Rejected(Rejection::StaleToken { .. })
    ));
    assert_eq!(highest(sink.clone(), low_scope).await, None);
}

pub async fn scopes_are_fenced_independently(sink: Arc<dyn FencedStore>, ns: String) {
    let (a, b) = (LeaseId::new(), LeaseId::new());
    let k = format!("{ns}k");
    let x = format!("{ns}x");
    let y = format!("{ns}y");
    assert_eq!(
        sink.write(write(&x, fence(900, a), "1", set(&k, "x")))
            .await
            .unwrap(),
        Admission::Applied
    );
    assert_eq!(
        sink.write(write(&y, fence(3, b), "1", set(&k, "y")))
            .await
            .unwrap(),
        Admission::Applied
    );
}

/// Many writers of three generations race; the sink's atomicity is what keeps the history
/// clean, so this is the test that catches a read-then-write backend.
pub async fn racing_writers_apply_each_key_once(sink: Arc<dyn FencedStore>, ns: String) {
    let gens: Vec<Fence> = (1..=3).map(|t| fence(t, LeaseId::new())).collect();
    let scope = format!("{ns}race");
    let counter = format!("{ns}counter");
    let mut tasks = Vec::new();
    for i in 0..90 {
        let (sink, g) = (sink.clone(), gens[i % 3]);
        let w = write(
            &scope,
            g,
            &format!("k{}", i % 5),
            vec![Mutation::HashIncr {
                key: counter.clone(),
                field: g.token.to_string(),
                by: 1,
            }],
        );
        tasks.push(tokio::spawn(
            async move { (g, sink.write(w).await.unwrap()) },
        ));
    }
    let mut applied_per_gen = [0usize; 3];
    let mut highest_applied = 0;
    for t in tasks {
        let (g, admission) = t.await.unwrap();
        if admission == Admission::Applied {
            applied_per_gen[g.token.as_u64() as usize - 1] += 1;
            highest_applied = highest_applied.max(g.token.as_u64());
        }
    }
    let Some(Value::Hash(h)) = sink.read(&counter).await.unwrap() else {
        panic!("no counter")
    };
    for (i, n) in applied_per_gen.iter().enumerate() {
        let stored: usize = h
            .get(&(i + 1).to_string())
            .map_or(0, |v| v.parse().unwrap());
        assert_eq!(
            stored,
            *n,
            "generation {} applied {n} but stored {stored}",
            i + 1
        );
    }
    let total: usize = applied_per_gen.iter().sum();
    assert!(
        total <= 5,
        "5 keys, {total} applications: a key applied twice"
    );
    assert_eq!(
        sink.highest(&Scope::new(scope))
            .await
            .unwrap()
            .unwrap()
            .token
            .as_u64(),
        highest_applied
    );
}

/// A batch (group commit) decides every write on its own, in order.
pub async fn batched_writes_are_decided_one_by_one(sink: Arc<dyn FencedStore>, ns: String) {
    let (a, b) = (LeaseId::new(), LeaseId::new());
    let (s1, s2, k) = (format!("{ns}s1"), format!("{ns}s2"), format!("{ns}k"));
    let text = format!("{ns}text");
    sink.write(write(&s2, fence(9, b), "seed", set(&text, "x")))
        .await
        .unwrap();
    let incr = |by| {
        vec![Mutation::HashIncr {
            key: k.clone(),
            field: "n".into(),
            by,
        }]
    };
    let results = sink
        .write_batch(vec![
            write(&s1, fence(1, a), "one", incr(1)),
            write(&s1, fence(1, a), "one", incr(1)),
            write(&s2, fence(8, a), "late", incr(100)),
            write(
                &s1,
                fence(2, b),
                "bad",
                vec![Mutation::HashIncr {
                    key: text.clone(),
                    field: "f".into(),
                    by: 1,
                }],
            ),
            write(&s1, fence(2, b), "two", incr(2)),
        ])
        .await
        .unwrap();
    assert_eq!(results.len(), 5);
    assert_eq!(results[0].as_ref().unwrap(), &Admission::Applied);
    assert_eq!(results[1].as_ref().unwrap(), &Admission::Duplicate);
    assert!(matches!(
        results[2],
        Ok(Admission::Rejected(Rejection::StaleToken { .. }))
    ));
    assert!(
        matches!(
            results[3],
            Ok(Admission::Rejected(Rejection::Mutation { .. }))
        ),
        "{:?}",
        results[3]
    );
    assert_eq!(results[4].as_ref().unwrap(), &Admission::Applied);
    let Some(Value::Hash(h)) = sink.read(&k).await.unwrap() else {
        panic!("counter missing")
    };
    assert_eq!(h["n"], "3");
    assert!(sink.write_batch(vec![]).await.unwrap().is_empty());
}

fn incr(key: &str, field: &str, by: i64) -> Mutation {
    Mutation::HashIncr {
        key: key.into(),
        field: field.into(),
        by,
    }
}

fn hash_set(key: &str, field: &str, value: &str) -> Mutation {
    Mutation::HashSet {
        key: key.into(),
        fields: vec![(field.into(), value.into())],
    }
}

async fn field(sink: &dyn FencedStore, key: &str, field: &str) -> Option<String> {
    match sink.read(key).await.unwrap() {
        Some(Value::Hash(h)) => h.get(field).cloned(),
        other => panic!("{key} is {other:?}"),
    }
}

/// Issue 7, case 1: a later mutation that cannot apply used to leave the earlier ones applied
/// with the fence unmoved, so the stale holder could then write. Now nothing applies, and the
/// stale holder is still refused.
/// `Delete` removes a string or a hash (an absent key: nothing to do), and the steps after it
/// in one list see the key absent: a hash deleted and written again holds only what was
/// written after, and an increment after a delete counts from 0. A delete in a list that is
/// refused for another step removes nothing.
pub async fn a_delete_removes_a_key_whatever_it_holds(sink: Arc<dyn FencedStore>, ns: String) {
    let a = LeaseId::new();
    let (scope, text, hash) = (format!("{ns}s"), format!("{ns}text"), format!("{ns}hash"));
    let w = |key: &str, m| write(&scope, fence(5, a), key, m);
    let del = |key: &str| Mutation::Delete { key: key.into() };
    let put = vec![
        Mutation::Set {
            key: text.clone(),
            value: "t".into(),
        },
        Mutation::HashSet {
            key: hash.clone(),
            fields: vec![("old".into(), "1".into()), ("n".into(), "7".into())],
        },
    ];
    assert_eq!(sink.write(w("put", put)).await.unwrap(), Admission::Applied);
    // Refused whole by its last step (a string is no hash): nothing deleted.
    let refused = vec![
        del(&text),
        del(&hash),
        incr(&format!("{ns}text2"), "n", 1),
        {
            Mutation::HashSet {
                key: text.clone(),
                fields: vec![],
            }
        },
    ];
    assert!(matches!(
        sink.write(w("refused", refused)).await.unwrap(),
        Admission::Rejected(Rejection::Mutation { .. })
    ));
    assert_eq!(
        sink.read(&text).await.unwrap(),
        Some(Value::Text("t".into()))
    );
    let again = vec![
        del(&text),
        del(&hash),
        Mutation::HashSet {
            key: hash.clone(),
            fields: vec![("new".into(), "2".into())],
        },
        incr(&hash, "n", 3),
        del(&format!("{ns}never")),
        // A string deleted may become a hash in the same list.
        incr(&text, "m", 1),
    ];
    assert_eq!(
        sink.write(w("again", again)).await.unwrap(),
        Admission::Applied
    );
    let fields = |pairs: &[(&str, &str)]| {
        Value::Hash(
            pairs
                .iter()
                .map(|(f, v)| (f.to_string(), v.to_string()))
                .collect(),
        )
    };
    assert_eq!(
        sink.read(&hash).await.unwrap(),
        Some(fields(&[("n", "3"), ("new", "2")]))
    );
    assert_eq!(sink.read(&text).await.unwrap(), Some(fields(&[("m", "1")])));
    assert_eq!(sink.read(&format!("{ns}never")).await.unwrap(), None);
    assert_eq!(
        sink.write(w("gone", vec![del(&text)])).await.unwrap(),
        Admission::Applied
    );
    assert_eq!(sink.read(&text).await.unwrap(), None);
}

pub async fn a_bad_step_applies_nothing(sink: Arc<dyn FencedStore>, ns: String) {
    let (a, b) = (LeaseId::new(), LeaseId::new());
    let (scope, doc, bal) = (format!("{ns}s"), format!("{ns}doc"), format!("{ns}bal"));
    let w = |f, key: &str, m| write(&scope, f, key, m);
    assert_eq!(
        sink.write(w(fence(10, a), "a1", set(&doc, "v10")))
            .await
            .unwrap(),
        Admission::Applied
    );
    assert_eq!(
        sink.write(w(fence(11, b), "b1", vec![incr(&bal, "n", i64::MAX - 10)]))
            .await
            .unwrap(),
        Admission::Applied
    );
    let clash = vec![
        Mutation::Set {
            key: doc.clone(),
            value: "v11".into(),
        },
        hash_set(&doc, "f", "x"),
    ];
    assert_eq!(
        sink.write(w(fence(11, b), "b2", clash)).await.unwrap(),
        Admission::Rejected(Rejection::Mutation {
            why: format!("mutation 1: {doc} holds a string, not a hash")
        })
    );
    assert_eq!(
        sink.read(&doc).await.unwrap(),
        Some(Value::Text("v10".into()))
    );
    // Overflow on the second step: the first step's +5 is not kept, however often retried.
    for _ in 0..3 {
        assert_eq!(
            sink.write(w(
                fence(11, b),
                "b3",
                vec![incr(&bal, "n", 5), incr(&bal, "n", 1000)]
            ))
            .await
            .unwrap(),
            Admission::Rejected(Rejection::Mutation {
                why: format!("mutation 1: {bal}.n = 9223372036854775802 + 1000 overflows i64")
            })
        );
    }
    assert_eq!(
        field(&*sink, &bal, "n").await.as_deref(),
        Some("9223372036854775797")
    );
    // The refused writes' keys were not recorded: fixed, they apply.
    assert_eq!(
        sink.write(w(fence(11, b), "b3", vec![incr(&bal, "n", 5)]))
            .await
            .unwrap(),
        Admission::Applied
    );
    assert_eq!(
        sink.write(w(fence(10, a), "a2", set(&doc, "stale")))
            .await
            .unwrap(),
        Admission::Rejected(Rejection::StaleToken {
            presented: FencingToken::from_u64(10),
            highest: FencingToken::from_u64(11),
        })
    );
    assert_eq!(
        sink.read(&doc).await.unwrap(),
        Some(Value::Text("v10".into()))
    );
    assert_eq!(
        sink.highest(&Scope::new(&*scope)).await.unwrap(),
        Some(fence(11, b))
    );
}

/// Issue 7, case 3: integers are exact end to end and follow Redis' own syntax.
pub async fn integers_are_exact_and_strict(sink: Arc<dyn FencedStore>, ns: String) {
    let a = LeaseId::new();
    let (scope, h) = (format!("{ns}s"), format!("{ns}h"));
    let mut n = 0;
    let mut w = |m: Vec<Mutation>| {
        n += 1;
        write(&scope, fence(1, a), &format!("k{n}"), m)
    };
    let big = (1i64 << 53) + 1;
    assert_eq!(
        sink.write(w(vec![incr(&h, "big", big)])).await.unwrap(),
        Admission::Applied
    );
    assert_eq!(field(&*sink, &h, "big").await.unwrap(), big.to_string());
    for (f, by) in [("max", i64::MAX), ("min", i64::MIN), ("neg", -1)] {
        assert_eq!(
            sink.write(w(vec![incr(&h, f, by)])).await.unwrap(),
            Admission::Applied
        );
        assert_eq!(field(&*sink, &h, f).await.unwrap(), by.to_string());
    }
    for (f, by) in [("max", 1), ("min", -1)] {
        assert!(matches!(
            sink.write(w(vec![incr(&h, f, by)])).await.unwrap(),
            Admission::Rejected(Rejection::Mutation { .. })
        ));
    }
    assert_eq!(
        sink.write(w(vec![incr(&h, "neg", i64::MIN + 1)]))
            .await
            .unwrap(),
        Admission::Applied
    );
    assert_eq!(
        field(&*sink, &h, "neg").await.unwrap(),
        i64::MIN.to_string()
    );
    for bad in [
        "007",
        "-0",
        "",
        "+1",
        " 1",
        "1.5",
        "99999999999999999999",
        "9223372036854775808",
    ] {
        assert_eq!(
            sink.write(w(vec![hash_set(&h, "s", bad)])).await.unwrap(),
            Admission::Applied
        );
        assert_eq!(
            sink.write(w(vec![incr(&h, "s", 1)])).await.unwrap(),
            Admission::Rejected(Rejection::Mutation {
                why: format!("mutation 0: {h}.s is not an integer")
            }),
            "{bad:?} taken for an integer"
        );
        assert_eq!(field(&*sink, &h, "s").await.unwrap(), bad);
    }
    // A step sees the effect of the steps before it.
    let steps = vec![
        hash_set(&h, "t", "12"),
        incr(&h, "t", 30),
        incr(&h, "t", -2),
    ];
    assert_eq!(sink.write(w(steps)).await.unwrap(), Admission::Applied);
    assert_eq!(field(&*sink, &h, "t").await.unwrap(), "40");
    let empty = vec![Mutation::HashSet {
        key: h.clone(),
        fields: vec![],
    }];
    assert_eq!(
        sink.write(w(empty)).await.unwrap(),
        Admission::Rejected(Rejection::Mutation {
            why: format!("mutation 0: HashSet of {h} has no fields")
        })
    );
}

/// Issue 7, case 2: one bad write in a group-committed batch fails only itself; every other
/// write gets exactly the answer it would get alone, and stale holders stay refused.
pub async fn one_bad_write_fails_only_itself(sink: Arc<dyn FencedStore>, ns: String) {
    let (a, b) = (LeaseId::new(), LeaseId::new());
    let (s1, s2) = (format!("{ns}s1"), format!("{ns}s2"));
    let (k, text) = (format!("{ns}k"), format!("{ns}text"));
    sink.write(write(&s2, fence(5, a), "seed", set(&text, "x")))
        .await
        .unwrap();
    let results = sink
        .write_batch(vec![
            write(&s1, fence(7, b), "ok1", vec![incr(&k, "n", 1)]),
            write(
                &s1,
                fence(7, b),
                "bad",
                vec![incr(&k, "n", 1), incr(&text, "f", 1)],
            ),
            write(
                &s2,
                fence(6, b),
                "overflow",
                vec![incr(&k, "m", i64::MAX), incr(&k, "m", 1)],
            ),
            write(&s1, fence(7, b), "ok2", vec![incr(&k, "n", 10)]),
            write(&s1, fence(6, a), "stale", vec![incr(&k, "n", 100)]),
        ])
        .await
        .unwrap();
    let outcomes: Vec<String> = results
        .iter()
        .map(|r| match r {
            Ok(Admission::Rejected(r)) => r.reason().to_string(),
            Ok(other) => format!("{other:?}"),
            Err(e) => format!("error: {e}"),
        })
        .collect();
    assert_eq!(
        outcomes,
        ["Applied", "mutation", "mutation", "Applied", "stale_token"]
    );
    assert_eq!(field(&*sink, &k, "n").await.as_deref(), Some("11"));
    assert_eq!(field(&*sink, &k, "m").await, None);
    // s2's fence moved to the refused write's token (its writer owned the scope): the old
    // holder at 5 may no longer write, nor may one below it.
    assert_eq!(
        sink.highest(&Scope::new(&*s2)).await.unwrap(),
        Some(fence(6, b))
    );
    for (token, key) in [(5, "old holder"), (4, "older")] {
        assert!(matches!(
            sink.write(write(&s2, fence(token, a), key, set(&text, "y")))
                .await
                .unwrap(),
            Admission::Rejected(Rejection::StaleToken { .. })
        ));
    }
    assert!(matches!(
        sink.write(write(&s1, fence(6, a), "stale2", set(&text, "y")))
            .await
            .unwrap(),
        Admission::Rejected(Rejection::StaleToken { .. })
    ));
    assert_eq!(
        sink.read(&text).await.unwrap(),
        Some(Value::Text("x".into()))
    );
}

/// Issue 9: a write below the coordinator's low watermark is stale even where the sink keeps
/// no fence, so fences below it can be forgotten; idempotency keys are kept, so a re-run of a
/// job that wrote before it stalled is still a duplicate after the collection.
pub async fn the_watermark_refuses_and_lets_fences_go(sink: Arc<dyn FencedStore>, ns: String) {
    let (a, b, c) = (LeaseId::new(), LeaseId::new(), LeaseId::new());
    // s1 is a default-scoped job's scope (`job:<id>`), the case that used to leave a fence
    // behind per job forever.
    let s1 = Scope::of_job(JobId::new()).to_string();
    let (s2, s3) = (format!("{ns}s2"), format!("{ns}s3"));
    let k = format!("{ns}k");
    assert_eq!(
        sink.write(write(&s1, fence(5, a), "job1/0", set(&k, "a")))
            .await
            .unwrap(),
        Admission::Applied
    );
    assert_eq!(
        sink.write(write(&s2, fence(6, b), "job2/0", set(&k, "b")))
            .await
            .unwrap(),
        Admission::Applied
    );
    sink.observe_watermark(FencingToken::from_u64(7));
    // The next call applies the watermark and collects the fences below it.
    assert_eq!(
        sink.write(write(&s3, fence(8, c), "job3/0", set(&k, "c")))
            .await
            .unwrap(),
        Admission::Applied
    );
    assert_eq!(
        sink.highest(&Scope::new(&*s1)).await.unwrap(),
        None,
        "fence below W kept"
    );
    assert_eq!(sink.highest(&Scope::new(&*s2)).await.unwrap(), None);
    assert_eq!(
        sink.highest(&Scope::new(&*s3)).await.unwrap(),
        Some(fence(8, c))
    );
    // The paused holder of s1 wakes up: no fence, but the watermark refuses it.
    assert_eq!(
        sink.write(write(&s1, fence(5, a), "job1/1", set(&k, "late")))
            .await
            .unwrap(),
        Admission::Rejected(Rejection::StaleToken {
            presented: FencingToken::from_u64(5),
            highest: FencingToken::from_u64(7),
        })
    );
    // The job re-runs under a newer token: its write is still a duplicate, and fences again.
    let rerun = LeaseId::new();
    assert_eq!(
        sink.write(write(&s1, fence(9, rerun), "job1/0", set(&k, "again")))
            .await
            .unwrap(),
        Admission::Duplicate
    );
    assert_eq!(
        sink.highest(&Scope::new(&*s1)).await.unwrap(),
        Some(fence(9, rerun))
    );
    // A lower watermark later changes nothing; the token at W itself is fine.
    sink.observe_watermark(FencingToken::from_u64(3));
    assert!(matches!(
        sink.write(write(&s2, fence(6, b), "job2/1", set(&k, "x")))
            .await
            .unwrap(),
        Admission::Rejected(Rejection::StaleToken { .. })
    ));
    assert_eq!(
        sink.write(write(&s2, fence(7, b), "job2/2", set(&k, "d")))
            .await
            .unwrap(),
        Admission::Applied
    );
    assert_eq!(sink.read(&k).await.unwrap(), Some(Value::Text("d".into())));
}

/// Issue 9's workload: `jobs` default-scoped jobs (`job:<id>`), each with one fenced write,
/// while the coordinator's watermark trails the newest token by a few hundred in-flight
/// leases; then every lease ends (watermark above all), the key retention passes, and a few
/// more calls give the sink the chance to collect. The caller measures what is left.
pub async fn drive_default_scoped_writes(sink: &dyn FencedStore, jobs: u64, retention: Duration) {
    let total = format!("total:{}", LeaseId::new());
    let mut token = 0;
    while token < jobs {
        let batch: Vec<FencedWrite> = (0..1000.min(jobs - token))
            .map(|_| {
                token += 1;
                let id = JobId::new();
                write(
                    Scope::of_job(id).as_str(),
                    fence(token, LeaseId::new()),
                    &format!("{id}/0"),
                    vec![Mutation::HashIncr {
                        key: total.clone(),
                        field: "n".into(),
                        by: 1,
                    }],
                )
            })
            .collect();
        let results = sink.write_batch(batch).await.unwrap();
        assert!(results.iter().all(|r| matches!(r, Ok(Admission::Applied))));
        sink.observe_watermark(FencingToken::from_u64(token.saturating_sub(300)));
    }
    tokio::time::sleep(retention + Duration::from_millis(100)).await;
    sink.observe_watermark(FencingToken::from_u64(token + 1));
    let probe = Scope::of_job(JobId::new());
    for i in 0..100 {
        let nudge: Vec<FencedWrite> = (0..500)
            .map(|k| {
                write(
                    probe.as_str(),
                    fence(token + 1, LeaseId::from(uuid::Uuid::nil())),
                    &format!("n{i}/{k}"),
                    vec![],
                )
            })
            .collect();
        sink.write_batch(nudge).await.unwrap();
    }
    let Some(Value::Hash(h)) = sink.read(&total).await.unwrap() else {
        panic!("no total")
    };
    assert_eq!(h["n"], jobs.to_string(), "every write applied exactly once");
}

#[macro_export]
macro_rules! fenced_store_suite {
    // `fenced_store_cases()`: every case by name, to run them together on one shared backend.
    (list) => {
        $crate::fenced_store_suite!(@with list ());
    };
    // One test per case, each on the sink `$make` makes.
    ($make:expr) => {
        $crate::fenced_store_suite!(@with cases $make);
    };
    (@with $arm:ident $make:tt) => {
        $crate::fenced_store_suite!(@$arm $make;
            admission_rule_end_to_end,
            mutations_apply_whole_or_not_at_all,
            a_content_refusal_still_fences,
            scopes_are_fenced_independently,
            racing_writers_apply_each_key_once,
            batched_writes_are_decided_one_by_one,
            a_bad_step_applies_nothing,
            integers_are_exact_and_strict,
            one_bad_write_fails_only_itself,
            the_watermark_refuses_and_lets_fences_go,
            a_delete_removes_a_key_whatever_it_holds,
        );
    };
    (@list $unused:tt; $($case:ident),* $(,)?) => {
        #[allow(clippy::type_complexity)]
        fn fenced_store_cases() -> Vec<(
            &'static str,
            fn(std::sync::Arc<dyn palisade::FencedStore>, String) -> $crate::futures_util::future::BoxFuture<'static, ()>,
        )> {
            vec![$((stringify!($case), |sink, ns| -> $crate::futures_util::future::BoxFuture<'static, ()> {
                Box::pin($crate::suite::$case(sink, ns))
            })),*]
        }
    };
    (@cases $make:expr; $($case:ident),* $(,)?) => {
        mod fenced_store {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let (sink, _keep): (std::sync::Arc<dyn palisade::FencedStore>, _) = $make.await;
                    let ns = format!("{}:{}:", stringify!($case), palisade::LeaseId::new());
                    $crate::suite::$case(sink, ns).await;
                }
            )*
        }
    };
}
