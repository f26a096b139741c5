//! What a worker does with a job's pace: a timeout (the token fires, the attempt is retried,
//! a handler that ignores its token is aborted and its slot freed), a deadline (a job claimed
//! late is dead as expired, never run) and a snooze (run again later, no attempt spent, at
//! most `max_snoozes`). Each scenario runs on the memory coordinator and on a private Redis,
//! in real time.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use actix::prelude::*;
use palisade::*;
use palisade_testkit::RedisServer;

struct Setup {
    /// The private server, if any, stopped when the test ends.
    _redis: Option<RedisServer>,
    store: Stores,
    coordinator: Addr<Coordinator>,
}

fn memory() -> Setup {
    setup(Arc::new(MemoryLeaseStore::new()).into(), None)
}

fn redis() -> Setup {
    let server = RedisServer::start();
    let pool = store::redis::pool(&server.url()).unwrap();
    setup(
        Arc::new(RedisLeaseStore::new(pool, "pacing")).into(),
        Some(server),
    )
}

fn setup(store: Stores, redis: Option<RedisServer>) -> Setup {
    let coordinator = Coordinator::new(store.clone())
        .with_reap_interval(Duration::from_millis(50))
        .start();
    Setup {
        _redis: redis,
        store,
        coordinator,
    }
}

impl Setup {
    fn worker(&self, registry: Registry, concurrency: usize) -> Addr<Worker> {
        let config = WorkerConfig {
            lease_ttl: Duration::from_secs(5),
            poll_interval: Duration::from_millis(10),
            concurrency,
            timeout_grace: Duration::from_millis(300),
            retry: RetryPolicy {
                base: Duration::from_millis(20),
                max: Duration::from_millis(40),
            },
            ..WorkerConfig::new("pacer")
        };
        Worker::new(config, self.coordinator.clone(), registry, Sinks::new())
            .expect("valid config")
            .start()
    }

    async fn enqueue(&self, jobs: Vec<NewJob>) -> Vec<JobId> {
        self.coordinator.send(Enqueue(jobs)).await.unwrap().unwrap()
    }

    /// Waits until the default queue has nothing pending (at most 10 s).
    async fn settled(&self) -> QueueCounts {
        for _ in 0..1000 {
            let counts = self.store.counts("default").await.unwrap();
            if counts.pending() == 0 {
                return counts;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("never settled: {:?}", self.store.counts("default").await);
    }

    async fn dead_reason(&self, id: JobId) -> String {
        let dead = self.store.dead("default", 100).await.unwrap();
        let d = dead
            .iter()
            .find(|d| d.job.id == id)
            .unwrap_or_else(|| panic!("job {id} is not dead: {dead:?}"));
        d.reason.clone()
    }
}

/// One test of `scenario` on the memory coordinator and one on a private Redis.
macro_rules! on_both {
    ($scenario:ident) => {
        mod $scenario {
            #[actix::test]
            async fn on_memory() {
                super::$scenario(super::memory()).await;
            }

            #[actix::test]
            async fn on_redis() {
                super::$scenario(super::redis()).await;
            }
        }
    };
}

/// Sends `()` when dropped: tells the test that a handler's future was dropped (aborted).
struct Dropped(Option<tokio::sync::oneshot::Sender<()>>);

impl Drop for Dropped {
    fn drop(&mut self) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(());
        }
    }
}

/// A kind's timeout fires the token of a handler that listens (its attempt is retried as
/// "timed out", whatever it returns then); a job's own timeout overrides its kind's; a
/// handler that ignores its token is aborted after the grace period, which frees its slot
/// (concurrency 1: the next job runs), and its job dies once its attempts are spent.
async fn timeouts(s: Setup) {
    let polite_runs = Arc::new(AtomicU32::new(0));
    let (aborted_tx, aborted_rx) = tokio::sync::oneshot::channel();
    let aborted_tx = Arc::new(Mutex::new(Some(aborted_tx)));
    let registry = {
        let runs = polite_runs.clone();
        Registry::new()
            .register("polite", move |ctx: JobContext, _: ()| {
                let runs = runs.clone();
                async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    // Stops when told, and even says it succeeded: still timed out.
                    ctx.cancellation().cancelled().await;
                    Ok(())
                }
            })
            .register("stubborn", move |_: JobContext, _: ()| {
                let guard = Dropped(aborted_tx.lock().unwrap().take());
                async move {
                    let _guard = guard;
                    tokio::time::sleep(Duration::from_secs(60)).await;
                    Ok(())
                }
            })
            .register("quick", |_: JobContext, _: ()| async { Ok(()) })
            .register("strict", |ctx: JobContext, _: ()| async move {
                // Told to stop, it gives up for good: a fatal error is kept as it is.
                ctx.cancellation().cancelled().await;
                Err(JobError::fatal("cut short; not worth retrying"))
            })
            .with_timeout("strict", Duration::from_millis(50))
            .with_timeout("polite", Duration::from_millis(150))
    };
    s.worker(registry, 1);
    let started = std::time::Instant::now();
    let ids = s
        .enqueue(vec![
            NewJob::raw("polite", "null").with_max_attempts(2),
            NewJob::raw("stubborn", "null")
                .with_timeout(Duration::from_millis(100))
                .with_max_attempts(1),
            NewJob::raw("quick", "null"),
            NewJob::raw("strict", "null").with_max_attempts(3),
        ])
        .await;
    tokio::time::timeout(Duration::from_secs(5), aborted_rx)
        .await
        .expect("the stubborn handler was aborted")
        .unwrap();
    let counts = s.settled().await;
    assert_eq!((counts.completed, counts.dead), (1, 3), "{counts:?}");
    assert_eq!(polite_runs.load(Ordering::SeqCst), 2, "retried once");
    assert_eq!(s.dead_reason(ids[3]).await, "cut short; not worth retrying");
    let polite = s.dead_reason(ids[0]).await;
    assert!(
        polite.contains("2 attempts failed; last: timed out after 150ms")
            && !polite.contains("aborted"),
        "{polite}"
    );
    let stubborn = s.dead_reason(ids[1]).await;
    assert!(
        stubborn.contains("timed out after 100ms")
            && stubborn.contains("did not stop within 300ms")
            && stubborn.contains("aborted"),
        "{stubborn}"
    );
    // Two polite attempts (150 ms each, a short backoff) and an aborted one (100 + 300 ms),
    // one at a time: well under the stubborn handler's minute.
    assert!(started.elapsed() < Duration::from_secs(5));
}

on_both!(timeouts);

/// A job claimed after its deadline is dead as "expired" and its handler never runs — a
/// delayed job due after its deadline too; a job whose deadline is ahead runs.
async fn deadlines(s: Setup) {
    let ran = Arc::new(Mutex::new(Vec::new()));
    let registry = {
        let ran = ran.clone();
        Registry::new().register("report", move |ctx: JobContext, _: ()| {
            let ran = ran.clone();
            async move {
                ran.lock().unwrap().push(ctx.job().id);
                Ok(())
            }
        })
    };
    let now = SystemTime::now();
    let ids = s
        .enqueue(vec![
            NewJob::raw("report", "null").with_deadline(now - Duration::from_secs(1)),
            NewJob::raw("report", "null")
                .with_delay(Duration::from_millis(300))
                .with_deadline(now + Duration::from_millis(100)),
            NewJob::raw("report", "null").with_deadline(now + Duration::from_secs(60)),
        ])
        .await;
    s.worker(registry, 4);
    let counts = s.settled().await;
    assert_eq!((counts.completed, counts.dead), (1, 2), "{counts:?}");
    assert_eq!(
        *ran.lock().unwrap(),
        vec![ids[2]],
        "only the timely job ran"
    );
    for id in &ids[..2] {
        let reason = s.dead_reason(*id).await;
        assert!(
            reason.starts_with("expired: attempt 1 not started by its deadline"),
            "{reason}"
        );
    }
}

/// Handlers of kind `work` that take `ms(job)` milliseconds each, and the most that ran at
/// once.
fn counted(ms: fn(&Job) -> u64) -> (Registry, Arc<AtomicU32>) {
    let (running, most) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
    let seen = most.clone();
    let registry = Registry::new().register("work", move |ctx: JobContext, _: ()| {
        let (running, most) = (running.clone(), most.clone());
        async move {
            let now = running.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(ms(ctx.job()))).await;
            running.fetch_sub(1, Ordering::SeqCst);
            Ok(())
        }
    });
    (registry, seen)
}

/// A job that expires unrun at the head of a claim batch frees no slot the batch's other jobs
/// take: the worker never runs more handlers than its concurrency.
async fn expired_jobs_never_overfill_the_worker(s: Setup) {
    let (registry, most) = counted(|_| 100);
    let past = SystemTime::now() - Duration::from_secs(1);
    let mut jobs = vec![NewJob::raw("work", "null").with_deadline(past)];
    jobs.extend((0..6).map(|_| NewJob::raw("work", "null")));
    s.enqueue(jobs).await;
    s.worker(registry, 2);
    let counts = s.settled().await;
    assert_eq!((counts.completed, counts.dead), (6, 1), "{counts:?}");
    assert_eq!(
        most.load(Ordering::SeqCst),
        2,
        "at most its concurrency ran at once"
    );
}

on_both!(expired_jobs_never_overfill_the_worker);

/// Handlers of spread lengths free slots a few at a time, so a worker keeps two claims on
/// their way at once: each asks only for the slots neither running nor asked for by the
/// other, and the worker never runs more handlers than its concurrency (fails with the
/// claims in flight left out of a claim's room).
async fn two_claims_out_never_overfill_the_worker(s: Setup) {
    // 0 to 7 ms, from the job id's random bits.
    let (registry, most) = counted(|job| (job.id.as_uuid().as_u128() % 8) as u64);
    s.enqueue((0..600).map(|_| NewJob::raw("work", "null")).collect())
        .await;
    s.worker(registry, 8);
    let counts = s.settled().await;
    assert_eq!(counts.completed, 600, "{counts:?}");
    let most = most.load(Ordering::SeqCst);
    assert!(most <= 8, "{most} handlers ran at once, concurrency 8");
}

on_both!(two_claims_out_never_overfill_the_worker);

on_both!(deadlines);

/// A handler that snoozes runs again after the snooze without spending attempts (one
/// attempt, three runs) and sees its count; one that snoozes past its `max_snoozes` is dead
/// with the count as its reason.
async fn snoozes(s: Setup) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let registry = {
        let seen = seen.clone();
        Registry::new().register("poll", move |ctx: JobContext, _: ()| {
            let seen = seen.clone();
            async move {
                let job = ctx.job();
                seen.lock()
                    .unwrap()
                    .push((job.id, job.attempt, job.snoozes));
                if job.snoozes < 2 {
                    return Err(JobError::snooze(Duration::from_millis(50)));
                }
                Ok(())
            }
        })
    };
    let ids = s
        .enqueue(vec![
            NewJob::raw("poll", "null").with_max_attempts(1),
            NewJob::raw("poll", "null")
                .with_max_attempts(1)
                .with_max_snoozes(1),
        ])
        .await;
    s.worker(registry, 1);
    let counts = s.settled().await;
    assert_eq!((counts.completed, counts.dead), (1, 1), "{counts:?}");
    let seen = seen.lock().unwrap().clone();
    let runs = |id: JobId| -> Vec<(u32, u32)> {
        seen.iter()
            .filter(|r| r.0 == id)
            .map(|r| (r.1, r.2))
            .collect()
    };
    assert_eq!(runs(ids[0]), [(1, 0), (1, 1), (1, 2)]);
    assert_eq!(runs(ids[1]), [(1, 0), (1, 1)]);
    let reason = s.dead_reason(ids[1]).await;
    assert!(
        reason.contains("snoozed 1 times (max_snoozes = 1)"),
        "{reason}"
    );
}

on_both!(snoozes);
