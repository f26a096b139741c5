//! Actors + in-memory stores, in virtual time (`tokio::time::pause`): lease expiry scenarios
//! run in milliseconds and never depend on the machine's speed.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::prelude::*;
use palisade::*;
use palisade_testkit::{Faults, Op};
use tokio::sync::{mpsc, Notify};

const TTL: Duration = Duration::from_secs(3);

struct Harness {
    store: Arc<MemoryLeaseStore>,
    coordinator: Addr<Coordinator>,
    sink_store: Arc<MemoryFencedStore>,
    sinks: Sinks,
}

fn harness() -> Harness {
    harness_with(Arc::new(MemoryLeaseStore::new()))
}

fn harness_with(store: Arc<MemoryLeaseStore>) -> Harness {
    let coordinator = Coordinator::new(store.clone())
        .with_reap_interval(Duration::from_millis(100))
        .start();
    let sink_store = Arc::new(MemoryFencedStore::new());
    let sink = FencedSink::new("ledger", sink_store.clone()).start();
    Harness {
        store,
        coordinator,
        sink_store,
        sinks: Sinks::new().with("ledger", sink),
    }
}

fn config(name: &str) -> WorkerConfig {
    WorkerConfig {
        lease_ttl: TTL,
        poll_interval: Duration::from_millis(20),
        retry: RetryPolicy {
            base: Duration::from_millis(100),
            max: Duration::from_secs(1),
        },
        ..WorkerConfig::new(name)
    }
}

impl Harness {
    fn worker(&self, name: &str, registry: Registry) -> Addr<Worker> {
        Worker::new(
            config(name),
            self.coordinator.clone(),
            registry,
            self.sinks.clone(),
        )
        .expect("valid config")
        .start()
    }

    async fn enqueue(&self, job: NewJob) -> JobId {
        self.coordinator
            .send(Enqueue(vec![job]))
            .await
            .unwrap()
            .unwrap()[0]
    }

    async fn counts(&self) -> QueueCounts {
        self.coordinator
            .send(CountJobs("default".into()))
            .await
            .unwrap()
            .unwrap()
    }

    /// Asserts no accepted completion's follow-up jobs are still waiting to be enqueued.
    async fn no_follow_ups_kept(&self) {
        let kept = self.store.follow_ups(Duration::ZERO, 10).await.unwrap();
        assert!(kept.is_empty(), "{kept:?}");
    }

    /// Waits (in virtual time) until the default queue has nothing pending.
    async fn settle_all(&self) -> QueueCounts {
        for _ in 0..10_000 {
            let counts = self.counts().await;
            if counts.pending() == 0 {
                return counts;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("jobs never settled: {:?}", self.counts().await);
    }

    /// Moves `scope`'s token counter to `last` by running claims through the store, so the
    /// scenario can use the same numbers as the story (A gets 71, B gets 72).
    async fn burn_tokens(&self, scope: &str, last: u64) {
        for _ in 0..last {
            self.store
                .enqueue(vec![NewJob::raw("warmup", "{}")
                    .with_queue("warmup")
                    .with_scope(scope)])
                .await
                .unwrap();
            let claims = self.store.claim("warmup", "t", 1, TTL).await.unwrap();
            let lease = claims[0].lease.id;
            self.store
                .settle(vec![(lease, Settlement::completed())])
                .await
                .unwrap();
        }
    }
}

/// Receives the next report, failing (in virtual time, so instantly) instead of hanging.
async fn next<T>(rx: &mut mpsc::UnboundedReceiver<T>) -> T {
    tokio::time::timeout(Duration::from_secs(600), rx.recv())
        .await
        .expect("no report within 600 virtual seconds")
        .expect("channel closed")
}

fn set(key: &str, value: &str) -> Vec<Mutation> {
    vec![Mutation::Set {
        key: key.into(),
        value: value.into(),
    }]
}

#[derive(Debug)]
struct Seen {
    who: &'static str,
    token: FencingToken,
    lease: LeaseId,
    admission: Option<Admission>,
}

/// The story: A claims token 71, pauses past its lease, B claims 72 and writes, A wakes up
/// and writes. A's write and A's completion must both be refused.
#[actix::test]
async fn stale_holder_is_fenced_off_at_the_sink_and_the_coordinator() {
    tokio::time::pause();
    let h = harness();
    h.burn_tokens("account:42", 70).await;
    let job = h
        .enqueue(NewJob::raw("transfer", "null").with_scope("account:42"))
        .await;

    let (seen_tx, mut seen) = mpsc::unbounded_channel::<Seen>();
    let release_a = Arc::new(Notify::new());

    // One handler for both workers; A's is held at a gate between its claim and its write.
    let registry = |who: &'static str, gate: Option<Arc<Notify>>| {
        let tx = seen_tx.clone();
        Registry::new().register("transfer", move |ctx: JobContext, _: ()| {
            let (tx, gate) = (tx.clone(), gate.clone());
            async move {
                let lease = ctx.lease().clone();
                let seen = |admission| Seen {
                    who,
                    token: lease.token,
                    lease: lease.id,
                    admission,
                };
                if let Some(gate) = gate {
                    tx.send(seen(None)).unwrap();
                    // "GC pause": A does not look at its cancellation token — a paused
                    // process can't.
                    gate.notified().await;
                }
                let admission = ctx.sink("ledger")?.write(set("account:42", who)).await?;
                tx.send(seen(Some(admission.clone()))).unwrap();
                admission.accepted()?;
                Ok(())
            }
        })
    };
    let (registry_a, registry_b) = (registry("A", Some(release_a.clone())), registry("B", None));

    let worker_a = h.worker("A", registry_a);
    let a = next(&mut seen).await;
    assert_eq!(a.who, "A");
    assert_eq!(a.token, FencingToken::new(0, 71));

    // A's process pauses: no more renewals, no more claims.
    worker_a.send(Freeze(true)).await.unwrap();
    let _worker_b = h.worker("B", registry_b);

    // Time passes beyond A's lease; the reaper stalls the job and B claims it.
    let b = next(&mut seen).await;
    assert_eq!(b.who, "B");
    assert_eq!(b.token, FencingToken::new(0, 72));
    assert_eq!(b.admission, Some(Admission::Applied));
    let counts = h.settle_all().await;
    assert_eq!(counts.completed, 1);

    // A wakes up and writes with its old token.
    worker_a.send(Freeze(false)).await.unwrap();
    release_a.notify_one();
    let late = next(&mut seen).await;
    assert_eq!(late.who, "A");
    // Refused by the sink's low watermark: B settled, so no lease below 73 is current any
    // more (the coordinator published it with B's settlement, B's worker passed it on). The
    // fence at 72 would refuse it too.
    assert_eq!(
        late.admission,
        Some(Admission::Rejected(Rejection::StaleToken {
            presented: FencingToken::new(0, 71),
            highest: FencingToken::new(0, 73),
        }))
    );

    // A's completion is refused, atomically and without touching anything.
    let refused = h
        .store
        .settle(vec![(a.lease, Settlement::completed())])
        .await
        .unwrap();
    assert!(matches!(refused[..], [Err(Error::LeaseNotCurrent(l))] if l == a.lease));

    // Let A's worker report its own (refused) settlement, then check the end state.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let counts = h.counts().await;
    assert_eq!(
        counts,
        QueueCounts {
            completed: 1,
            // Enqueued once; stalled once (A's lease expired while it was paused).
            enqueued: 1,
            stalled: 1,
            ..QueueCounts::default()
        },
        "{job}"
    );
    assert_eq!(
        h.sink_store.read("account:42").await.unwrap(),
        Some(Value::Text("B".into()))
    );
    // The refusal reached the coordinator's journal, for operators (`palisade ui`).
    let journal = h.store.rejections(10).await.unwrap();
    assert!(
        matches!(&journal[..], [n] if n.sink == "ledger" && n.scope == "account:42"
            && n.token == FencingToken::new(0, 71).as_u64() && n.reason == "stale_token"),
        "{journal:?}"
    );
    // B's fence (72) is below the watermark (73) by now: the sink forgot it, since the
    // watermark refuses everything the fence would (bounded state, ARCHITECTURE.md §4).
    assert_eq!(
        h.sink_store
            .highest(&Scope::new("account:42"))
            .await
            .unwrap(),
        None
    );
    let _ = b.lease;
}

#[actix::test]
async fn same_token_retry_is_applied_once() {
    tokio::time::pause();
    let h = harness();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let registry = Registry::new().register("deposit", move |ctx: JobContext, cents: i64| {
        let tx = tx.clone();
        async move {
            let ledger = ctx.sink("ledger")?;
            let incr = vec![Mutation::HashIncr {
                key: "acct".into(),
                field: "balance".into(),
                by: cents,
            }];
            // The first reply is "lost" and the client retries the same logical write.
            let key = IdempotencyKey::new(format!("{}/deposit", ctx.job().id));
            let first = ledger.write_keyed(key.clone(), incr.clone()).await?;
            let retry = ledger.write_keyed(key, incr).await?;
            tx.send((first, retry)).unwrap();
            Ok(())
        }
    });
    h.worker("w", registry);
    h.enqueue(NewJob::new("deposit", &250).unwrap().with_scope("acct"))
        .await;
    let (first, retry) = next(&mut rx).await;
    assert_eq!(first, Admission::Applied);
    assert_eq!(retry, Admission::Duplicate);
    h.settle_all().await;
    let Some(Value::Hash(acct)) = h.sink_store.read("acct").await.unwrap() else {
        panic!("acct missing");
    };
    assert_eq!(acct["balance"], "250");
}

#[actix::test]
async fn independent_scopes_do_not_interfere() {
    tokio::time::pause();
    let h = harness();
    h.burn_tokens("busy", 40).await;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let registry = Registry::new().register("w", move |ctx: JobContext, key: String| {
        let tx = tx.clone();
        async move {
            let a = ctx.sink("ledger")?.write(set(&key, "x")).await?;
            tx.send((ctx.lease().scope.clone(), ctx.lease().token, a))
                .unwrap();
            Ok(())
        }
    });
    h.worker("w", registry);
    h.enqueue(NewJob::new("w", &"k-busy").unwrap().with_scope("busy"))
        .await;
    h.enqueue(NewJob::new("w", &"k-quiet").unwrap().with_scope("quiet"))
        .await;
    let mut got = [next(&mut rx).await, next(&mut rx).await];
    got.sort_by_key(|(scope, ..)| scope.clone());
    // Each scope is fenced on its own: the busy scope's 41 writes and fences do not touch the
    // quiet one. (Tokens come from one counter per coordinator, as on Redis, so the quiet
    // scope's first token is 42; the sink suite's `scopes_are_fenced_independently` shows a
    // lower token in another scope is still applied.)
    assert_eq!(
        got[0],
        (
            Scope::new("busy"),
            FencingToken::new(0, 41),
            Admission::Applied
        )
    );
    assert_eq!(
        got[1],
        (
            Scope::new("quiet"),
            FencingToken::new(0, 42),
            Admission::Applied
        )
    );
}

#[actix::test]
async fn jobs_sharing_a_scope_never_overlap() {
    tokio::time::pause();
    let h = harness();
    let live = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let tokens = Arc::new(Mutex::new(Vec::new()));
    let registry = {
        let (live, peak, tokens) = (live.clone(), peak.clone(), tokens.clone());
        Registry::new().register("slow", move |ctx: JobContext, _: ()| {
            let (live, peak, tokens) = (live.clone(), peak.clone(), tokens.clone());
            async move {
                let now = live.fetch_add(1, Ordering::SeqCst) + 1;
                peak.fetch_max(now, Ordering::SeqCst);
                tokens.lock().unwrap().push(ctx.lease().token);
                tokio::time::sleep(Duration::from_millis(50)).await;
                live.fetch_sub(1, Ordering::SeqCst);
                Ok(())
            }
        })
    };
    for _ in 0..20 {
        h.enqueue(NewJob::raw("slow", "null").with_scope("shared"))
            .await;
    }
    h.worker("w1", registry.clone());
    h.worker("w2", registry);
    let counts = h.settle_all().await;
    assert_eq!(counts.completed, 20);
    assert_eq!(
        peak.load(Ordering::SeqCst),
        1,
        "two leases on one scope were live at once"
    );
    let tokens = tokens.lock().unwrap();
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens must grow: {tokens:?}"
    );
}

#[actix::test]
async fn failing_renewal_cancels_the_handler() {
    tokio::time::pause();
    let (faults, store) = Faults::around(Arc::new(MemoryLeaseStore::new()));
    let coordinator = Coordinator::new(store).start();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let registry = Registry::new().register("wait", move |ctx: JobContext, _: ()| {
        let tx = tx.clone();
        async move {
            tx.send(("started", tokio::time::Instant::now())).unwrap();
            ctx.cancellation().cancelled().await;
            tx.send(("cancelled", tokio::time::Instant::now())).unwrap();
            Err(JobError::retry("lease lost"))
        }
    });
    let _w = Worker::new(config("w"), coordinator.clone(), registry, Sinks::new())
        .unwrap()
        .start();
    coordinator
        .send(Enqueue(vec![NewJob::raw("wait", "null")]))
        .await
        .unwrap()
        .unwrap();
    let (_, started) = next(&mut rx).await;
    // Renewals work for a while: no cancellation across several lease lengths.
    tokio::time::sleep(TTL * 3).await;
    assert!(rx.try_recv().is_err(), "cancelled while renewals succeeded");
    faults.fail(Op::Renew, true);
    let (what, at) = next(&mut rx).await;
    assert_eq!(what, "cancelled");
    assert!(at - started > TTL * 3);
}

#[actix::test]
async fn bad_jobs_are_dead_lettered_with_a_reason() {
    tokio::time::pause();
    let h = harness();
    let registry = Registry::new()
        .register("typed", |_: JobContext, _n: u32| async { Ok(()) })
        .register("fatal", |_: JobContext, _: ()| async {
            Err(JobError::fatal("invalid account"))
        })
        .register("panics", |_: JobContext, _: ()| async { panic!("boom") });
    h.worker("w", registry);
    h.enqueue(NewJob::raw("typed", "\"not a number\"")).await;
    h.enqueue(NewJob::raw("fatal", "null")).await;
    h.enqueue(NewJob::raw("panics", "null").with_max_attempts(2))
        .await;
    let counts = h.settle_all().await;
    assert_eq!(counts.dead, 3);
    // A kind this worker has no handler for is never claimed by it: it waits for a worker
    // that has one (a mixed fleet mid-deploy), instead of being dead-lettered as unknown.
    h.enqueue(NewJob::raw("nobody-handles-this", "{}")).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let counts = h.counts().await;
    assert_eq!((counts.ready, counts.leased, counts.dead), (1, 0, 3));
    // A worker that does handle it takes it.
    let seen = Arc::new(AtomicU32::new(0));
    let handled = seen.clone();
    h.worker(
        "newer",
        Registry::new().register(
            "nobody-handles-this",
            move |_: JobContext, _: serde_json::Value| {
                let handled = handled.clone();
                async move {
                    handled.fetch_add(1, Ordering::SeqCst);
                    Ok(())
                }
            },
        ),
    );
    let counts = h.settle_all().await;
    assert_eq!((counts.completed, seen.load(Ordering::SeqCst)), (1, 1));
    let dead = h
        .coordinator
        .send(ListDead {
            queue: "default".into(),
            limit: 10,
        })
        .await
        .unwrap()
        .unwrap();
    let reason = |kind: &str| {
        dead.iter()
            .find(|d| d.job.kind == kind)
            .unwrap()
            .reason
            .clone()
    };
    assert!(reason("typed").contains("does not decode"));
    assert_eq!(reason("fatal"), "invalid account");
    assert!(
        reason("panics").contains("handler panicked: boom"),
        "{}",
        reason("panics")
    );
    assert_eq!(
        dead.iter()
            .find(|d| d.job.kind == "panics")
            .unwrap()
            .job
            .attempt,
        2
    );
}

#[actix::test]
async fn retries_back_off_then_succeed() {
    tokio::time::pause();
    let h = harness();
    let attempts = Arc::new(Mutex::new(Vec::new()));
    let registry = {
        let attempts = attempts.clone();
        Registry::new().register("flaky", move |ctx: JobContext, _: ()| {
            let attempts = attempts.clone();
            async move {
                attempts
                    .lock()
                    .unwrap()
                    .push((ctx.job().attempt, tokio::time::Instant::now()));
                if ctx.job().attempt < 3 {
                    return Err(JobError::retry("not yet"));
                }
                Ok(())
            }
        })
    };
    h.worker("w", registry);
    h.enqueue(NewJob::raw("flaky", "null").with_max_attempts(3))
        .await;
    assert_eq!(h.settle_all().await.completed, 1);
    let attempts = attempts.lock().unwrap();
    assert_eq!(attempts.iter().map(|a| a.0).collect::<Vec<_>>(), [1, 2, 3]);
    // Backoff: ≥ 50ms before the 2nd attempt, ≥ 100ms before the 3rd (half-ceiling floor).
    assert!(attempts[1].1 - attempts[0].1 >= Duration::from_millis(50));
    assert!(attempts[2].1 - attempts[1].1 >= Duration::from_millis(100));
}

#[actix::test]
async fn stalled_jobs_come_back_then_die_after_max_stalls() {
    tokio::time::pause();
    let h = harness();
    let runs = Arc::new(AtomicUsize::new(0));
    let registry = {
        let runs = runs.clone();
        Registry::new().register("hang", move |_: JobContext, _: ()| {
            let runs = runs.clone();
            async move {
                runs.fetch_add(1, Ordering::SeqCst);
                std::future::pending::<()>().await;
                Ok(())
            }
        })
    };
    let worker = h.worker("w", registry);
    worker.send(Freeze(true)).await.unwrap();
    h.enqueue(NewJob::raw("hang", "null").with_max_stalls(2))
        .await;
    // Each round: thaw to claim, freeze (no renewals) so the lease expires and stalls.
    for round in 1..=3 {
        worker.send(Freeze(false)).await.unwrap();
        while runs.load(Ordering::SeqCst) < round {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        worker.send(Freeze(true)).await.unwrap();
        tokio::time::sleep(TTL * 2).await;
    }
    let counts = h.counts().await;
    assert_eq!(counts.dead, 1, "{counts:?}");
    let dead = h.store.dead("default", 1).await.unwrap();
    assert_eq!(dead[0].job.stalls, 3);
    assert_eq!(dead[0].job.attempt, 3);
    assert!(dead[0].reason.contains("expired 3 times"));
}

#[actix::test]
async fn drain_waits_for_running_handlers() {
    tokio::time::pause();
    let h = harness();
    let registry = Registry::new().register("nap", |_: JobContext, ms: u64| async move {
        tokio::time::sleep(Duration::from_millis(ms)).await;
        Ok(())
    });
    let worker = h.worker("w", registry);
    for _ in 0..5 {
        h.enqueue(NewJob::new("nap", &200u64).unwrap()).await;
    }
    while h.counts().await.leased < 5 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let drained = worker
        .send(Drain {
            deadline: Duration::from_secs(5),
        })
        .await
        .unwrap();
    assert_eq!(drained, Drained::default());
    assert_eq!(h.counts().await.completed, 5);
}

/// Issue 24 (found by review): a drain that begins while a settlement and a claim are on
/// their way together. The claim's jobs are given back unstarted (ready, nothing charged),
/// counted as released, and the worker stops only after that — none stays leased to a
/// stopped worker.
#[actix::test]
async fn a_drain_gives_back_what_a_claim_in_flight_brings() {
    tokio::time::pause();
    let (faults, store) = Faults::around(Arc::new(MemoryLeaseStore::new()));
    let coordinator = Coordinator::new(store.clone()).start();
    let started = Arc::new(AtomicUsize::new(0));
    let registry = Registry::new().register("quick", {
        let started = started.clone();
        move |_: JobContext, _: ()| {
            started.fetch_add(1, Ordering::SeqCst);
            async { Ok(()) }
        }
    });
    let single = WorkerConfig {
        concurrency: 1,
        batch: 1,
        ..config("w")
    };
    coordinator
        .send(Enqueue(vec![NewJob::raw("quick", "null"); 2]))
        .await
        .unwrap()
        .unwrap();
    faults.delay(Duration::from_millis(100));
    let worker = Worker::new(single, coordinator.clone(), registry, Sinks::new())
        .unwrap()
        .start();
    // The first job runs; its settlement goes with the claim for the freed slot, slowly.
    while started.load(Ordering::SeqCst) < 1 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    tokio::time::sleep(Duration::from_millis(10)).await;
    let drained = worker
        .send(Drain {
            deadline: Duration::from_secs(5),
        })
        .await
        .unwrap();
    assert_eq!(
        started.load(Ordering::SeqCst),
        1,
        "a job started during the drain"
    );
    assert_eq!(drained.released, 1, "{drained:?}");
    let counts = coordinator
        .send(CountJobs("default".into()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (counts.completed, counts.ready, counts.leased),
        (1, 1, 0),
        "{counts:?}"
    );
    let again = store.claim("default", "next", 1, TTL).await.unwrap();
    assert_eq!((again[0].job.attempt, again[0].job.stalls), (1, 0));
}

/// Counts runs per job kind.
fn counting(kinds: &[&'static str], runs: &Arc<Mutex<HashMap<String, usize>>>) -> Registry {
    kinds.iter().fold(Registry::new(), |registry, &kind| {
        let runs = runs.clone();
        registry.register(kind, move |_: JobContext, _: ()| {
            *runs.lock().unwrap().entry(kind.to_owned()).or_default() += 1;
            async { Ok(()) }
        })
    })
}

/// Issue 25, scope 4: a handler's follow-up jobs exist once its completion is accepted —
/// not after a failed attempt, and once only however often the job ran.
#[actix::test]
async fn follow_ups_run_once_after_their_parent_completes() {
    tokio::time::pause();
    let h = harness();
    let runs = Arc::new(Mutex::new(HashMap::new()));
    let attempts = Arc::new(AtomicU32::new(0));
    let registry = counting(&["child"], &runs).register("fan", {
        let attempts = attempts.clone();
        move |ctx: JobContext, _: ()| {
            let attempt = attempts.fetch_add(1, Ordering::SeqCst) + 1;
            async move {
                ctx.follow_up(NewJob::raw("child", "null"))?;
                if attempt == 1 {
                    return Err(JobError::retry("first attempt fails after asking"));
                }
                Ok(())
            }
        }
    });
    let _w = h.worker("w", registry);
    h.enqueue(NewJob::raw("fan", "null")).await;
    let counts = h.settle_all().await;
    assert_eq!(attempts.load(Ordering::SeqCst), 2);
    assert_eq!(counts.completed, 2, "the parent and one child: {counts:?}");
    assert_eq!(runs.lock().unwrap().get("child"), Some(&1));
    // Past the sweep's grace: nothing is delivered a second time.
    tokio::time::sleep(FOLLOW_UP_GRACE * 2).await;
    assert_eq!(h.counts().await.pending(), 0);
    h.no_follow_ups_kept().await;
}

/// Issue 28: the follow-up jobs and the flow a handler asks for continue its job's trace
/// (the flow's steps through the held jobs of its creation), and a job enqueued without one
/// has none.
#[actix::test]
async fn follow_ups_and_started_flows_continue_the_parents_trace() {
    tokio::time::pause();
    let h = harness();
    let seen = Arc::new(Mutex::new(HashMap::new()));
    let record = |kind: &'static str| {
        let seen = seen.clone();
        move |ctx: JobContext, _: ()| {
            let trace = ctx.job().trace.as_ref().map(|t| t.trace_id().to_owned());
            seen.lock().unwrap().insert(kind.to_owned(), trace);
            async { Ok(()) }
        }
    };
    let registry = Registry::new()
        .register("child", record("child"))
        .register("step", record("step"))
        .register("plain", record("plain"))
        .register("fan", |ctx: JobContext, _: ()| async move {
            ctx.follow_up(NewJob::raw("child", "null"))?;
            ctx.start_flow(Flow::new().step("s", NewJob::raw("step", "null")))?;
            Ok(())
        });
    let _w = h.worker("w", registry);
    let trace = TraceContext::from_w3c(
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        None,
    )
    .unwrap();
    h.enqueue(NewJob::raw("fan", "null").with_trace(trace.clone()))
        .await;
    h.enqueue(NewJob::raw("plain", "null")).await;
    let counts = h.settle_all().await;
    assert_eq!(counts.completed, 4, "{counts:?}");
    let seen = seen.lock().unwrap();
    let id = Some(trace.trace_id().to_owned());
    assert_eq!(seen.get("child"), Some(&id), "{seen:?}");
    assert_eq!(seen.get("step"), Some(&id), "{seen:?}");
    assert_eq!(seen.get("plain"), Some(&None), "{seen:?}");
}

/// Issue 25 (review): a job enqueued again under the same id gets new follow-ups (their ids
/// come from the run's lease, not the job's id); one follow-up the coordinator refuses for
/// good (its payload over this coordinator's smaller limit) is dropped alone.
#[actix::test]
async fn follow_ups_of_a_reused_id_run_again_and_one_bad_one_drops_alone() {
    tokio::time::pause();
    let h = harness_with(Arc::new(
        MemoryLeaseStore::new().with_max_payload_bytes(200),
    ));
    let runs = Arc::new(Mutex::new(HashMap::new()));
    let registry =
        counting(&["child", "big"], &runs).register("fan", |ctx: JobContext, _: ()| async move {
            ctx.follow_up(NewJob::raw("child", "null"))?;
            let big = format!("\"{}\"", "x".repeat(1000));
            ctx.follow_up(NewJob::raw("big", big))?;
            Ok(())
        });
    let _w = h.worker("w", registry);
    let id = JobId::new();
    let parent = || {
        NewJob::raw("fan", "null")
            .with_unique_key("fan", Duration::ZERO)
            .with_id(id)
    };
    h.enqueue(parent()).await;
    h.settle_all().await;
    h.enqueue(parent()).await;
    let counts = h.settle_all().await;
    assert_eq!(counts.completed, 4, "two parents, two children: {counts:?}");
    let runs = runs.lock().unwrap();
    assert_eq!(runs.get("child"), Some(&2));
    assert_eq!(runs.get("big"), None);
}

/// Issue 25 (review): a follow-up asked for by a task the handler left running, after the
/// handler returned, is refused (its completion went without it), not silently lost.
#[actix::test]
async fn a_follow_up_after_the_handler_returned_is_refused() {
    tokio::time::pause();
    let h = harness();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let registry = Registry::new().register("fan", move |ctx: JobContext, _: ()| {
        let tx = tx.clone();
        async move {
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(50)).await;
                tx.send(ctx.follow_up(NewJob::raw("late", "null"))).unwrap();
            });
            Ok(())
        }
    });
    let _w = h.worker("w", registry);
    h.enqueue(NewJob::raw("fan", "null")).await;
    let late = next(&mut rx).await;
    assert!(
        matches!(&late, Err(Error::InvalidJob(why)) if why.contains("ended")),
        "{late:?}"
    );
    let counts = h.settle_all().await;
    assert_eq!(counts.completed, 1);
}

/// Issue 25: `follow_up` refuses an empty kind and an id asked for twice (colliding
/// follow-ups) at once, keeping nothing of them; a raw payload that is not JSON is kept, like
/// any raw enqueue, and its job ends dead with the reason when its handler cannot decode it.
/// The good ones asked for beside them run, once each.
#[actix::test]
async fn follow_up_refuses_bad_jobs_and_keeps_the_good_ones() {
    tokio::time::pause();
    let h = harness();
    let runs = Arc::new(Mutex::new(HashMap::new()));
    let (tx, mut rx) = mpsc::unbounded_channel();
    let registry = counting(&["child"], &runs).register("fan", move |ctx: JobContext, _: ()| {
        let tx = tx.clone();
        async move {
            let id = JobId::new();
            let asked = vec![
                ctx.follow_up(NewJob::raw("", "null")).map(drop),
                ctx.follow_up(NewJob::raw("child", "{not json")).map(drop),
                ctx.follow_up(NewJob::raw("child", "null").with_id(id))
                    .map(drop),
                ctx.follow_up(NewJob::raw("child", "null").with_id(id))
                    .map(drop),
                ctx.follow_up(NewJob::raw("child", "null")).map(drop),
            ];
            tx.send(asked).unwrap();
            Ok(())
        }
    });
    let _w = h.worker("w", registry);
    h.enqueue(NewJob::raw("fan", "null")).await;
    let asked = next(&mut rx).await;
    assert!(matches!(asked[0], Err(Error::InvalidJob(_))), "{asked:?}");
    assert!(
        asked[1].is_ok() && asked[2].is_ok() && asked[4].is_ok(),
        "{asked:?}"
    );
    assert!(
        matches!(&asked[3], Err(Error::InvalidJob(why)) if why.contains("twice")),
        "{asked:?}"
    );
    let counts = h.settle_all().await;
    assert_eq!((counts.completed, counts.dead), (3, 1), "{counts:?}");
    assert_eq!(runs.lock().unwrap().get("child"), Some(&2));
    let dead = h.store.dead("default", 10).await.unwrap();
    assert!(dead[0].reason.contains("payload"), "{dead:?}");
}

/// Issue 25: a paused holder's follow-up jobs never appear: its completion is refused, and
/// with it what it carried. (A's child has an id of its own, so a wrongly kept one could not
/// hide behind B's.)
#[actix::test]
async fn a_stale_holders_follow_ups_never_appear() {
    tokio::time::pause();
    let h = harness();
    let runs = Arc::new(Mutex::new(HashMap::new()));
    let (started_tx, mut started) = mpsc::unbounded_channel::<()>();
    let gate = Arc::new(Notify::new());
    let registry_a = counting(&["child-a", "child-b"], &runs).register("fan", {
        let gate = gate.clone();
        move |ctx: JobContext, _: ()| {
            let (gate, started_tx) = (gate.clone(), started_tx.clone());
            async move {
                started_tx.send(()).unwrap();
                gate.notified().await; // paused past its lease
                ctx.follow_up(NewJob::raw("child-a", "null").with_id(JobId::new()))?;
                Ok(())
            }
        }
    });
    let registry_b = counting(&["child-a", "child-b"], &runs).register(
        "fan",
        |ctx: JobContext, _: ()| async move {
            ctx.follow_up(NewJob::raw("child-b", "null"))?;
            Ok(())
        },
    );
    h.enqueue(NewJob::raw("fan", "null")).await;
    let worker_a = h.worker("A", registry_a);
    next(&mut started).await;
    worker_a.send(Freeze(true)).await.unwrap();
    let _worker_b = h.worker("B", registry_b);
    while runs.lock().unwrap().get("child-b").is_none() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    worker_a.send(Freeze(false)).await.unwrap();
    gate.notify_one();
    tokio::time::sleep(FOLLOW_UP_GRACE * 2).await;
    let counts = h.counts().await;
    assert_eq!(
        (counts.completed, counts.pending(), counts.dead),
        (2, 0, 0),
        "{counts:?}"
    );
    let runs = runs.lock().unwrap();
    assert_eq!(runs.get("child-b"), Some(&1));
    assert_eq!(
        runs.get("child-a"),
        None,
        "the stale holder's follow-up ran"
    );
}

/// Issue 25: follow-up jobs kept with an accepted completion that were never delivered (the
/// process killed right after it) are enqueued by the coordinator's sweep after the grace, once.
#[actix::test]
async fn the_sweep_enqueues_follow_ups_never_delivered() {
    tokio::time::pause();
    let h = harness();
    h.enqueue(NewJob::raw("fan", "null")).await;
    let c = h
        .store
        .claim("default", "gone", 1, TTL)
        .await
        .unwrap()
        .remove(0);
    let child = NewJob::raw("child", "null").with_id(JobId::new());
    let done = Settlement::Complete {
        result: None,
        then: palisade::Then {
            jobs: vec![child.clone()],
            ..Default::default()
        },
    };
    h.store.settle(vec![(c.lease.id, done)]).await.unwrap()[0]
        .as_ref()
        .unwrap();
    assert_eq!(h.counts().await.ready, 0, "kept, not enqueued yet");
    tokio::time::sleep(FOLLOW_UP_GRACE + Duration::from_secs(2)).await;
    let counts = h.counts().await;
    assert_eq!((counts.ready, counts.completed), (1, 1), "{counts:?}");
    h.no_follow_ups_kept().await;
    // Delivered again (a sweep racing a late worker): the same job, nothing added.
    let again = h.store.enqueue_all(vec![child]).await.unwrap();
    assert!(matches!(again[..], [Enqueued::Existing(_)]), "{again:?}");
}

/// Two schedulers on one coordinator (real time: schedules fire by the coordinator's wall
/// clock): one job per tick, not two, and the mark follows.
#[actix::test]
async fn two_schedulers_fire_each_tick_once() {
    let store = Arc::new(MemoryLeaseStore::new());
    let every_second = || {
        Schedule::new(
            "tick",
            "* * * * * *",
            NewJob::raw("report", "null").with_queue("cron"),
        )
        .unwrap()
    };
    // Kept in the coordinator (as `palisade worker` keeps its binary's schedules): whichever
    // scheduler holds the role fires it too.
    let kept = Schedule::new(
        "kept",
        "* * * * * *",
        NewJob::raw("report", "null").with_queue("kept"),
    )
    .unwrap();
    store.put_schedule(kept.spec().clone()).await.unwrap();
    let started = store.now_ms().await.unwrap();
    let _a = Scheduler::new(store.clone(), vec![every_second()])
        .with_interval(Duration::from_millis(20))
        .start();
    let _b = Scheduler::new(store.clone(), vec![every_second()])
        .with_interval(Duration::from_millis(20))
        .start();
    tokio::time::sleep(Duration::from_millis(3_300)).await;
    let ended = store.now_ms().await.unwrap();
    // Whole seconds in (started, ended]: each fired once (give or take the last look).
    let ticks = (ended / 1000 - started / 1000) as u64;
    let ready = store.counts("cron").await.unwrap().ready;
    assert!(
        ready == ticks || ready + 1 == ticks,
        "{ready} jobs for {ticks} ticks"
    );
    let mark = store.schedule_mark("tick").await.unwrap().unwrap();
    assert!(mark > started && mark <= ended, "{mark}");
    let kept = store.counts("kept").await.unwrap().ready;
    assert!(
        kept == ticks || kept + 1 == ticks,
        "{kept} kept jobs for {ticks} ticks"
    );
    // Each job knows its tick: which schedule, and the instant (whole seconds, one each).
    let claims = store
        .claim("cron", "w", 100, Duration::from_secs(60))
        .await
        .unwrap();
    let mut at: Vec<i64> = claims
        .iter()
        .map(|c| {
            let tick = c.job.tick.as_ref().expect("a scheduled job knows its tick");
            assert_eq!(tick.schedule, "tick");
            tick.at_ms
        })
        .collect();
    at.sort_unstable();
    at.dedup();
    assert_eq!(at.len(), claims.len(), "one job per tick: {at:?}");
    assert!(
        at.iter()
            .all(|t| t % 1000 == 0 && *t > started - 1000 && *t <= ended),
        "{at:?} within {started}..={ended}"
    );
}

/// A paused schedule (a code one and a kept one) fires nothing, though its mark moves on;
/// resumed, it fires from its next tick and not the ticks of the pause.
#[actix::test]
async fn a_paused_schedule_skips_its_ticks_and_resumes_without_a_backlog() {
    let store = Arc::new(MemoryLeaseStore::new());
    let every_second = |name: &str, queue: &str| {
        let job = NewJob::raw("report", "null").with_queue(queue);
        // (Catch up everything: a resumed schedule must still not fire the pause's ticks.)
        Schedule::new(name, "* * * * * *", job)
            .unwrap()
            .with_catch_up(palisade::CatchUp::All(100))
    };
    let kept = every_second("kept", "kept");
    store.put_schedule(kept.spec().clone()).await.unwrap();
    assert!(store.pause_schedule("code", true).await.unwrap());
    assert!(store.pause_schedule("kept", true).await.unwrap());
    assert!(
        !store.pause_schedule("kept", true).await.unwrap(),
        "already"
    );
    assert_eq!(store.paused_schedules().await.unwrap(), ["code", "kept"]);
    let started = store.now_ms().await.unwrap();
    let _s = Scheduler::new(store.clone(), vec![every_second("code", "code")])
        .with_interval(Duration::from_millis(20))
        .start();
    tokio::time::sleep(Duration::from_millis(2_300)).await;
    for queue in ["code", "kept"] {
        assert_eq!(
            store.counts(queue).await.unwrap().ready,
            0,
            "{queue} paused"
        );
        let mark = store.schedule_mark(queue).await.unwrap().unwrap();
        assert!(
            mark >= started - 1000,
            "{queue}: the mark moves on while paused"
        );
    }
    let resumed = store.now_ms().await.unwrap();
    assert!(store.pause_schedule("code", false).await.unwrap());
    assert!(store.pause_schedule("kept", false).await.unwrap());
    assert!(store.paused_schedules().await.unwrap().is_empty());
    // Resuming raised the marks to now: a tick of the pause the scheduler had not passed yet
    // cannot fire after it.
    for queue in ["code", "kept"] {
        let mark = store.schedule_mark(queue).await.unwrap().unwrap();
        assert!(
            mark >= resumed,
            "{queue}: mark {mark} below the resume {resumed}"
        );
    }
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    for queue in ["code", "kept"] {
        let claims = store
            .claim(queue, "w", 100, Duration::from_secs(60))
            .await
            .unwrap();
        assert!(!claims.is_empty(), "{queue} fires again once resumed");
        for c in &claims {
            let at = c.job.tick.as_ref().unwrap().at_ms;
            assert!(
                at > resumed - 1000,
                "{queue}: a tick of the pause fired ({at} < {resumed})"
            );
        }
    }
    // Removing a kept schedule forgets its pause too.
    store.pause_schedule("kept", true).await.unwrap();
    store.remove_schedule("kept").await.unwrap();
    assert!(store.paused_schedules().await.unwrap().is_empty());
}

/// A handler's result comes back through `Client::wait`; its progress is visible while it
/// runs; a result too large to keep is a clear error, not a silent loss.
#[actix::test]
async fn results_and_progress_reach_the_client() {
    #[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq)]
    struct Total {
        cents: i64,
    }
    let h = harness();
    let gate = Arc::new(Notify::new());
    let registry = {
        let gate = gate.clone();
        Registry::new()
            .register_with_result("sum", move |ctx: JobContext, n: Vec<i64>| {
                let gate = gate.clone();
                async move {
                    ctx.progress(&serde_json::json!({"done": 0, "of": n.len()}));
                    gate.notified().await;
                    Ok(Total {
                        cents: n.iter().sum(),
                    })
                }
            })
            .register_with_result("huge", |_: JobContext, _: ()| async {
                Ok("x".repeat(MAX_RESULT_BYTES + 1))
            })
    };
    let _worker = h.worker("results", registry);
    let client = Client::new(h.store.clone());
    let sum = client
        .enqueue(NewJob::new("sum", &vec![1, 2, 39]).unwrap())
        .await
        .unwrap();
    let mut seen = None;
    for _ in 0..200 {
        seen = client.progress(sum).await.unwrap();
        if seen.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(seen, Some(serde_json::json!({"done": 0, "of": 3})));
    assert_eq!(client.result::<Total>(sum).await.unwrap(), None);
    gate.notify_one();
    let total: Option<Total> = client.wait(sum, Duration::from_secs(5)).await.unwrap();
    assert_eq!(total, Some(Total { cents: 42 }));
    // Asking for the wrong type says so.
    assert!(matches!(
        client.result::<String>(sum).await,
        Err(Error::Payload(_))
    ));

    let huge = client.enqueue(NewJob::raw("huge", "null")).await.unwrap();
    let mut answer = Ok(None);
    for _ in 0..200 {
        answer = client.result::<String>(huge).await;
        if !matches!(answer, Ok(None)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        matches!(&answer, Err(Error::Payload(why)) if why.contains("the limit is")),
        "{answer:?}"
    );
    // Nothing waited for comes: `wait` gives up at its deadline.
    let never = client
        .wait::<Total>(JobId::new(), Duration::from_millis(50))
        .await
        .unwrap();
    assert_eq!(never, None);
}

/// `Client::cancel` on a running job: its lease is revoked, the handler's cancellation token
/// fires at the next renewal, and the job is dead with the reason — not run again.
#[actix::test]
async fn cancelling_a_running_job_stops_its_handler() {
    tokio::time::pause();
    let h = harness();
    let (started_tx, mut started) = mpsc::unbounded_channel::<()>();
    let (stopped_tx, mut stopped) = mpsc::unbounded_channel::<()>();
    let registry = Registry::new().register("long", move |ctx: JobContext, _: ()| {
        let (started_tx, stopped_tx) = (started_tx.clone(), stopped_tx.clone());
        async move {
            started_tx.send(()).unwrap();
            ctx.cancellation().cancelled().await;
            stopped_tx.send(()).unwrap();
            Err(JobError::retry("stopped by cancellation"))
        }
    });
    let _worker = h.worker("cancel", registry);
    let client = Client::new(h.store.clone());
    let id = client.enqueue(NewJob::raw("long", "null")).await.unwrap();
    next(&mut started).await;
    assert_eq!(client.cancel(id).await.unwrap(), Cancelled::Revoked);
    // The next renewal (a third of the lease) learns the lease is gone.
    tokio::time::timeout(TTL * 2, next(&mut stopped))
        .await
        .expect("the handler was cancelled");
    tokio::time::sleep(TTL).await;
    let counts = client.counts("default").await.unwrap();
    assert_eq!(
        (counts.dead, counts.ready, counts.leased),
        (1, 0, 0),
        "{counts:?}"
    );
    assert_eq!(
        client.dead("default", 1).await.unwrap()[0].reason,
        "cancelled"
    );
    assert_eq!(client.cancel(id).await.unwrap(), Cancelled::Missing);
}

/// Issue 25, scope 4: fan-out from a flow step's handler is fenced. Step `split` is run by A,
/// paused past its lease, then by B; both add steps to the flow (`add_step`) and start a
/// flow of their own (`start_flow`). Only B's appear: A's completion is refused, and with it
/// what it carried. `sum` runs after `split`, so it waits for B's parts too, and reads them.
#[actix::test]
async fn a_stale_holders_fan_out_never_appears() {
    tokio::time::pause();
    let h = harness();
    let runs = Arc::new(Mutex::new(HashMap::new()));
    let (started_tx, mut started) = mpsc::unbounded_channel::<()>();
    let gate = Arc::new(Notify::new());
    let sums = Arc::new(Mutex::new(Vec::new()));
    let base = |runs: &Arc<Mutex<HashMap<String, usize>>>| {
        let sums = sums.clone();
        counting(&["child-a", "child-b", "stale-part"], runs)
            .register_with_result("part", |_: JobContext, n: i64| async move { Ok(n) })
            .register("sum", move |ctx: JobContext, _: ()| {
                let sums = sums.clone();
                async move {
                    // `split` returned how many parts it added; each part's result is read.
                    let parts: i64 = ctx.dependency("split").await?.unwrap_or(-1);
                    let mut total = 0;
                    for i in 0..parts {
                        let part = added_step_name("split", &format!("part-{i}"));
                        total += ctx.dependency::<i64>(&part).await?.unwrap_or(-1000);
                    }
                    sums.lock().unwrap().push((parts, total));
                    Ok(())
                }
            })
    };
    let registry_a = base(&runs).register("split", {
        let gate = gate.clone();
        move |ctx: JobContext, _: ()| {
            let (gate, started_tx) = (gate.clone(), started_tx.clone());
            async move {
                started_tx.send(()).unwrap();
                gate.notified().await; // paused past its lease
                ctx.add_step("stale", NewJob::raw("stale-part", "null"), [])?;
                ctx.start_flow(Flow::new().step("only", NewJob::raw("child-a", "null")))?;
                Ok(())
            }
        }
    });
    let registry_b =
        base(&runs).register_with_result("split", |ctx: JobContext, _: ()| async move {
            for i in 0..3i64 {
                ctx.add_step(
                    &format!("part-{i}"),
                    NewJob::new("part", &(i * 10 + 1))?,
                    [],
                )?;
            }
            ctx.start_flow(Flow::new().step("only", NewJob::raw("child-b", "null")))?;
            Ok(3i64)
        });
    let flow = Flow::new()
        .step("split", NewJob::raw("split", "null"))
        .step_after("sum", NewJob::raw("sum", "null"), &["split"]);
    let client = Client::new(store::Stores::from(h.store.clone()));
    let id = client.create_flow(&flow).await.unwrap();
    let worker_a = h.worker("A", registry_a);
    next(&mut started).await;
    worker_a.send(Freeze(true)).await.unwrap();
    let _worker_b = h.worker("B", registry_b);
    let done = client
        .wait_flow(id, Duration::from_secs(60))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(done.state, FlowState::Succeeded, "{done:?}");
    worker_a.send(Freeze(false)).await.unwrap();
    gate.notify_one();
    tokio::time::sleep(FOLLOW_UP_GRACE * 2).await;
    let status = client.flow(id).await.unwrap().unwrap();
    assert_eq!(
        status.steps, 5,
        "split, sum and B's three parts: {status:?}"
    );
    assert_eq!(*sums.lock().unwrap(), [(3, 1 + 11 + 21)]);
    let counts = h.settle_all().await;
    assert_eq!((counts.completed, counts.dead), (6, 0), "{counts:?}");
    h.no_follow_ups_kept().await;
    let runs = runs.lock().unwrap();
    assert_eq!(runs.get("child-b"), Some(&1));
    assert_eq!(
        runs.get("child-a"),
        None,
        "the stale holder's flow was created"
    );
    assert_eq!(
        runs.get("stale-part"),
        None,
        "the stale holder's step was added"
    );
}

/// `add_step` and `start_flow` refuse what no store could keep, at once: a job that is no
/// flow step adding a step, a step after one it did not add, a name added twice, a flow that
/// does not validate; the good ones beside them happen.
#[actix::test]
async fn bad_fan_out_is_refused_when_asked() {
    tokio::time::pause();
    let h = harness();
    let runs = Arc::new(Mutex::new(HashMap::new()));
    let (errors_tx, mut errors) = mpsc::unbounded_channel::<Vec<String>>();
    let registry = counting(&["child"], &runs).register("fan", move |ctx: JobContext, _: ()| {
        let errors_tx = errors_tx.clone();
        async move {
            let mut seen = Vec::new();
            let mut note = |r: Result<()>| {
                if let Err(e) = r {
                    seen.push(e.to_string());
                }
            };
            note(
                ctx.add_step("x", NewJob::raw("child", "null"), [])
                    .map(drop),
            );
            note(ctx.start_flow(Flow::new()).map(drop));
            let cycle = Flow::new()
                .step_after("a", NewJob::raw("child", "null"), &["b"])
                .step_after("b", NewJob::raw("child", "null"), &["a"]);
            note(ctx.start_flow(cycle).map(drop));
            note(
                ctx.start_flow(Flow::new().step("ok", NewJob::raw("child", "null")))
                    .map(drop),
            );
            errors_tx.send(seen).unwrap();
            Ok(())
        }
    });
    h.enqueue(NewJob::raw("fan", "null")).await;
    let _worker = h.worker("W", registry);
    let seen = next(&mut errors).await;
    assert_eq!(seen.len(), 3, "{seen:?}");
    assert!(seen[0].contains("no flow step"), "{seen:?}");
    assert!(seen[2].contains("cycle"), "{seen:?}");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let counts = h.settle_all().await;
    assert_eq!(
        counts.completed, 2,
        "the parent and the good flow's one step"
    );
    assert_eq!(runs.lock().unwrap().get("child"), Some(&1));

    // Inside a flow: a step after one not added, a name added twice.
    let (errors_tx, mut errors) = mpsc::unbounded_channel::<Vec<String>>();
    let registry = counting(&["child"], &runs).register("split", move |ctx: JobContext, _: ()| {
        let errors_tx = errors_tx.clone();
        async move {
            let mut seen = Vec::new();
            let child = || NewJob::raw("child", "null");
            ctx.add_step("a", child(), [])?;
            for r in [
                ctx.add_step("b", child(), [("nope", OnDead::Fail)]),
                ctx.add_step("a", child(), []),
                ctx.add_step("", child(), []),
                ctx.add_step("x/y", child(), []),
                ctx.add_step("c", child().with_id(JobId::new()), []),
            ] {
                if let Err(e) = r {
                    seen.push(e.to_string());
                }
            }
            ctx.add_step("d", child(), [("a", OnDead::Run)])?;
            errors_tx.send(seen).unwrap();
            Ok(())
        }
    });
    let client = Client::new(store::Stores::from(h.store.clone()));
    let id = client
        .create_flow(&Flow::new().step("split", NewJob::raw("split", "null")))
        .await
        .unwrap();
    let _worker = h.worker("W2", registry);
    let seen = next(&mut errors).await;
    assert_eq!(seen.len(), 5, "{seen:?}");
    let done = client
        .wait_flow(id, Duration::from_secs(60))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (done.state, done.steps),
        (FlowState::Succeeded, 3),
        "{done:?}"
    );
    assert_eq!(runs.lock().unwrap().get("child"), Some(&3));
}
