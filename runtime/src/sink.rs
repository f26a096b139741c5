//! `FencedSink`: the actor façade over a [`FencedStore`] backend; counts every outcome.
//!
//! The actor adds no check of its own — the store's single atomic operation is the fence. A
//! check here (read highest, then write) would be exactly the race fencing exists to close.
//!
//! Up to two batches of writes are on their way to the store at once; writes that arrive
//! meanwhile are sent together as the next batch (group commit): under load many handlers'
//! writes share one round trip, while a lone write still goes out at once. Each write stays
//! its own atomic admission + mutation. Two batches may be decided in either order, so a scope
//! with a write on its way holds its next writes back (even with one batch out): one scope's
//! writes are decided in the order they arrived, as with one batch at a time (a handler that
//! sends two writes without awaiting the first included).

use std::collections::HashMap;
use std::sync::Arc;

use actix::prelude::*;
use metrics::counter;

use tokio::sync::oneshot;

use crate::admission::{Admission, Fence};
use crate::error::{Error, Result};
use crate::ids::{FencingToken, Scope};
use crate::metrics as m;
use crate::store::{FencedStore, FencedWrite, Value};

type Reply = oneshot::Sender<Result<Admission>>;

/// A named fenced sink ("ledger") over one backend.
pub struct FencedSink {
    name: Arc<str>,
    store: Arc<dyn FencedStore>,
    queued: Vec<(FencedWrite, Reply)>,
    /// Batches on their way to the store, and the writes in them by scope.
    batches_out: usize,
    scopes_out: HashMap<Scope, usize>,
}

impl FencedSink {
    /// Most writes sent to the store in one batch.
    const MAX_BATCH: usize = 256;

    /// Batches on their way at once: two, so that one is decided while the next is out (one
    /// left the store idle while its answer came back and the next batch went out).
    const BATCHES_OUT: usize = 2;

    /// A sink called `name` (the handler-side name and the metric label).
    pub fn new(name: impl Into<Arc<str>>, store: Arc<dyn FencedStore>) -> Self {
        Self {
            name: name.into(),
            store,
            queued: Vec::new(),
            batches_out: 0,
            scopes_out: HashMap::new(),
        }
    }

    fn flush(&mut self, ctx: &mut Context<Self>) {
        if self.batches_out == Self::BATCHES_OUT || self.queued.is_empty() {
            return;
        }
        // The writes of scopes with none on their way, in arrival order, up to a batch; the
        // others wait, in order, for the batch out to be answered.
        let (mut writes, mut replies) = (Vec::new(), Vec::new());
        let mut rest = Vec::new();
        for (write, reply) in std::mem::take(&mut self.queued) {
            if writes.len() < Self::MAX_BATCH && !self.scopes_out.contains_key(&write.scope) {
                writes.push(write);
                replies.push(reply);
            } else {
                rest.push((write, reply));
            }
        }
        self.queued = rest;
        if writes.is_empty() {
            return;
        }
        self.batches_out += 1;
        let scopes: Vec<Scope> = writes.iter().map(|w| w.scope.clone()).collect();
        for scope in &scopes {
            *self.scopes_out.entry(scope.clone()).or_default() += 1;
        }
        let store = self.store.clone();
        let batch = async move { store.write_batch(writes).await };
        ctx.spawn(batch.into_actor(self).map(move |result, act, ctx| {
            act.batches_out -= 1;
            for scope in &scopes {
                if let Some(n) = act.scopes_out.get_mut(scope) {
                    *n -= 1;
                    if *n == 0 {
                        act.scopes_out.remove(scope);
                    }
                }
            }
            let results: Vec<Result<Admission>> = match result {
                Ok(results) => results,
                Err(e) => {
                    // Every write of the batch gets the batch's error, keeping its class: a
                    // permanent error must not turn retryable on the way to the handler.
                    let (why, retryable) = match &e {
                        Error::Unavailable(why) | Error::Backend(why) => {
                            (why.clone(), e.is_retryable())
                        }
                        other => (other.to_string(), other.is_retryable()),
                    };
                    replies
                        .iter()
                        .map(|_| {
                            Err(if retryable {
                                Error::Unavailable(why.clone())
                            } else {
                                Error::Backend(why.clone())
                            })
                        })
                        .collect()
                }
            };
            for ((result, reply), scope) in results.into_iter().zip(replies).zip(scopes) {
                record(&act.name, &scope, &result);
                let _ = reply.send(result);
            }
            act.flush(ctx);
        }));
        // Writes left over (more than a batch) may fill the second batch now.
        self.flush(ctx);
    }
}

/// Counts and logs one fenced write's outcome under sink `name`, whichever backend decided it.
pub(crate) fn record(name: &str, scope: &Scope, result: &Result<Admission>) {
    let outcome = match result {
        Ok(Admission::Applied) => "applied",
        Ok(Admission::Duplicate) => "duplicate",
        Ok(Admission::Rejected(rejection)) => {
            // (Logged at warn by the run that wrote, with its trace id and tokens:
            // `RunState::note`.)
            tracing::debug!(sink = %name, %scope, %rejection, "fenced write refused");
            counter!(m::FENCE_REJECTIONS, "sink" => name.to_string(), "reason" => rejection.reason())
                .increment(1);
            "rejected"
        }
        Err(e) => {
            tracing::warn!(sink = %name, %scope, error = %e, "fenced write failed");
            "error"
        }
    };
    counter!(m::SINK_WRITES, "sink" => name.to_string(), "outcome" => outcome).increment(1);
}

impl Actor for FencedSink {
    type Context = Context<Self>;

    fn started(&mut self, _: &mut Self::Context) {
        for reason in ["stale_token", "token_conflict", "mutation"] {
            counter!(m::FENCE_REJECTIONS, "sink" => self.name.to_string(), "reason" => reason)
                .increment(0);
        }
    }
}

/// Admits (or refuses) and applies one fenced write.
#[derive(Message)]
#[rtype(result = "Result<Admission>")]
pub struct Write(pub FencedWrite);

impl Handler<Write> for FencedSink {
    type Result = ResponseFuture<Result<Admission>>;

    fn handle(&mut self, msg: Write, ctx: &mut Self::Context) -> Self::Result {
        if let Some(why) = unnamed(&msg.0) {
            let result = Err(Error::InvalidJob(why));
            record(&self.name, &msg.0.scope, &result);
            return Box::pin(async move { result });
        }
        let (reply, answer) = oneshot::channel();
        self.queued.push((msg.0, reply));
        self.flush(ctx);
        Box::pin(async move {
            answer
                .await
                .map_err(|_| Error::Unavailable("fenced sink stopped before answering".into()))?
        })
    }
}

/// Why `write` must not reach the store, if it must not: an empty idempotency key or an empty
/// data key. Either names every other such write as the same one — a later write of the scope
/// with an empty key would answer `Duplicate` and never apply, two writes to the data key ""
/// would overwrite each other — so it is a caller's bug (a name built from a missing value),
/// refused before anything is sent: no fence moves, no data changes.
fn unnamed(write: &FencedWrite) -> Option<String> {
    if write.key.as_str().is_empty() {
        return Some("fenced write: the idempotency key is empty; name the write".into());
    }
    let i = write.mutations.iter().position(|m| m.key().is_empty())?;
    Some(format!("fenced write: mutation {i} has an empty data key"))
}

/// The coordinator's low watermark, passed on by a worker after it settled jobs: the store
/// refuses writes below it and may forget fences below it (see the `admission` module docs).
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct ObserveWatermark(pub FencingToken);

impl Handler<ObserveWatermark> for FencedSink {
    type Result = ();

    fn handle(&mut self, msg: ObserveWatermark, _: &mut Self::Context) {
        self.store.observe_watermark(msg.0);
    }
}

/// Reads one stored value back (unfenced; for checks and status).
#[derive(Message)]
#[rtype(result = "Result<Option<Value>>")]
pub struct ReadValue(pub String);

impl Handler<ReadValue> for FencedSink {
    type Result = ResponseFuture<Result<Option<Value>>>;

    fn handle(&mut self, msg: ReadValue, _: &mut Self::Context) -> Self::Result {
        let store = self.store.clone();
        Box::pin(async move { store.read(&msg.0).await })
    }
}

/// The newest generation the sink accepted for a scope.
#[derive(Message)]
#[rtype(result = "Result<Option<Fence>>")]
pub struct ReadFence(pub Scope);

impl Handler<ReadFence> for FencedSink {
    type Result = ResponseFuture<Result<Option<Fence>>>;

    fn handle(&mut self, msg: ReadFence, _: &mut Self::Context) -> Self::Result {
        let store = self.store.clone();
        Box::pin(async move { store.highest(&msg.0).await })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use async_trait::async_trait;

    use super::*;
    use crate::ids::{IdempotencyKey, LeaseId};
    use crate::{MemoryFencedStore, Mutation, Rejection, Value};

    /// A memory sink whose batches take a while, counting how many are out at once.
    #[derive(Default)]
    struct Slow {
        store: MemoryFencedStore,
        out: AtomicUsize,
        most: AtomicUsize,
        batches: AtomicUsize,
    }

    #[async_trait]
    impl FencedStore for Slow {
        async fn write(&self, write: FencedWrite) -> Result<Admission> {
            self.store.write(write).await
        }

        async fn write_batch(&self, writes: Vec<FencedWrite>) -> Result<Vec<Result<Admission>>> {
            let now = self.out.fetch_add(1, Ordering::SeqCst) + 1;
            self.most.fetch_max(now, Ordering::SeqCst);
            self.batches.fetch_add(1, Ordering::SeqCst);
            // A batch with a write to key `slow` takes ten times as long.
            let slow = writes
                .iter()
                .flat_map(|w| &w.mutations)
                .any(|m| m.key() == "slow");
            tokio::time::sleep(Duration::from_millis(if slow { 50 } else { 5 })).await;
            let results = self.store.write_batch(writes).await;
            self.out.fetch_sub(1, Ordering::SeqCst);
            results
        }

        async fn read(&self, key: &str) -> Result<Option<Value>> {
            self.store.read(key).await
        }

        async fn highest(&self, scope: &Scope) -> Result<Option<Fence>> {
            self.store.highest(scope).await
        }
    }

    /// A sink over a [`Slow`] store, and one writer's fence.
    fn slow_sink() -> (Arc<Slow>, Addr<FencedSink>, Fence) {
        let store = Arc::new(Slow::default());
        let sink = FencedSink::new("ledger", store.clone()).start();
        let fence = Fence {
            token: FencingToken::new(0, 1),
            lease: LeaseId::new(),
        };
        (store, sink, fence)
    }

    /// Many writes at once: two batches go out together, no more, and the rest wait for one
    /// of them and share the next; every write is answered once, each key applied once (fails
    /// with `BATCHES_OUT` not checked, or with the count not given back).
    #[actix::test]
    async fn two_batches_go_out_at_once_and_every_write_is_answered() {
        let (store, sink, fence) = slow_sink();
        let write = |i: usize| FencedWrite {
            scope: Scope::new(format!("s{}", i / 2 % 10)),
            fence,
            key: IdempotencyKey::new(format!("k{}", i / 2)),
            mutations: vec![Mutation::HashIncr {
                key: format!("n{}", i % 10),
                field: "n".into(),
                by: 1,
            }],
        };
        let all = futures_util::future::join_all((0..400).map(|i| sink.send(Write(write(i)))));
        let answers = tokio::time::timeout(Duration::from_secs(10), all)
            .await
            .expect("every write answered");
        let admissions: Vec<Admission> = answers.into_iter().map(|a| a.unwrap().unwrap()).collect();
        let applied = admissions
            .iter()
            .filter(|a| **a == Admission::Applied)
            .count();
        assert_eq!((applied, admissions.len()), (200, 400), "each key once");
        assert_eq!(store.most.load(Ordering::SeqCst), 2, "batches out at once");
        assert!(
            store.batches.load(Ordering::SeqCst) < 400,
            "writes shared batches"
        );
        // The count came back: a later lone write goes out at once.
        let lone = tokio::time::timeout(Duration::from_secs(10), sink.send(Write(write(1000))))
            .await
            .expect("a lone write answered")
            .unwrap()
            .unwrap();
        assert_eq!(lone, Admission::Applied);
    }

    /// An empty idempotency key or data key is refused before the store sees it (a typed
    /// error, counted and logged as the write's error): the scope's fence does not move and
    /// nothing is stored, while the named writes sent with it apply (fails if the check is
    /// dropped: the empty-key write would apply, and a second one answer `Duplicate`).
    #[actix::test]
    async fn a_write_with_an_empty_key_or_data_key_is_refused_before_the_store() {
        let (store, sink, fence) = slow_sink();
        let write = |key: &str, data: &str| FencedWrite {
            scope: Scope::new("s"),
            fence,
            key: IdempotencyKey::new(key),
            mutations: vec![
                Mutation::HashIncr {
                    key: "n".into(),
                    field: "n".into(),
                    by: 1,
                },
                Mutation::Set {
                    key: data.into(),
                    value: "v".into(),
                },
            ],
        };
        let all = futures_util::future::join_all([
            sink.send(Write(write("", "d"))),
            sink.send(Write(write("k", ""))),
            sink.send(Write(write("", "d"))),
        ]);
        for (answer, why) in all.await.into_iter().zip([
            "the idempotency key is empty",
            "mutation 1 has an empty data key",
            "the idempotency key is empty",
        ]) {
            match answer.unwrap() {
                Err(Error::InvalidJob(e)) => assert!(e.contains(why), "{e}"),
                other => panic!("{why}: {other:?}"),
            }
        }
        assert_eq!(store.batches.load(Ordering::SeqCst), 0, "nothing sent");
        assert_eq!(store.highest(&Scope::new("s")).await.unwrap(), None);
        assert_eq!(store.read("n").await.unwrap(), None);
        assert_eq!(
            sink.send(Write(write("k", "d"))).await.unwrap().unwrap(),
            Admission::Applied
        );
        assert_eq!(
            store.read("d").await.unwrap(),
            Some(Value::Text("v".into()))
        );
    }

    /// One write whose mutation does not fit (an increment of a string key), among 300 going
    /// out in two batches at once, is refused alone and changes nothing; every other write
    /// applies once (ARCHITECTURE.md §3, invariant 8, through the actor).
    #[actix::test]
    async fn one_bad_write_among_two_batches_out_fails_only_itself() {
        let (store, sink, fence) = slow_sink();
        let first = FencedWrite {
            scope: Scope::new("setup"),
            fence,
            key: IdempotencyKey::new("text"),
            mutations: vec![Mutation::Set {
                key: "text".into(),
                value: "not a hash".into(),
            }],
        };
        assert_eq!(
            sink.send(Write(first)).await.unwrap().unwrap(),
            Admission::Applied
        );
        let write = |i: usize| FencedWrite {
            scope: Scope::new(format!("s{}", i % 30)),
            fence,
            key: IdempotencyKey::new(format!("k{i}")),
            mutations: vec![Mutation::HashIncr {
                key: if i == 150 { "text".into() } else { "n".into() },
                field: "n".into(),
                by: 1,
            }],
        };
        let all = futures_util::future::join_all((0..300).map(|i| sink.send(Write(write(i)))));
        let answers = tokio::time::timeout(Duration::from_secs(10), all)
            .await
            .expect("every write answered");
        for (i, answer) in answers.into_iter().enumerate() {
            let admission = answer.unwrap().unwrap();
            if i == 150 {
                assert!(
                    matches!(admission, Admission::Rejected(Rejection::Mutation { .. })),
                    "{admission:?}"
                );
            } else {
                assert_eq!(admission, Admission::Applied, "write {i}");
            }
        }
        assert_eq!(
            store.most.load(Ordering::SeqCst),
            2,
            "two batches out at once"
        );
        assert_eq!(
            store.read("n").await.unwrap(),
            Some(Value::Hash([("n".to_string(), "299".to_string())].into()))
        );
        assert_eq!(
            store.read("text").await.unwrap(),
            Some(Value::Text("not a hash".into()))
        );
    }

    /// One scope's writes are decided in the order they came, though two batches are out: a
    /// handler's second write, sent before its first was answered, waits for the batch
    /// carrying the first, where a faster batch would have applied it first (fails with the
    /// scopes out not held back: the key ends at "1").
    #[actix::test]
    async fn a_scope_with_a_write_out_holds_its_next_write_back() {
        let (store, sink, fence) = slow_sink();
        let write = |scope: &str, key: &str, mutation: Mutation| FencedWrite {
            scope: Scope::new(scope),
            fence,
            key: IdempotencyKey::new(key),
            mutations: vec![mutation],
        };
        let set = |key: &str, value: &str| Mutation::Set {
            key: key.into(),
            value: value.into(),
        };
        // Batch 1 (another scope) and batch 2 (the first write, slow) go out; the second
        // write waits, and would go out as batch 3 once batch 1 is answered.
        let other = sink.send(Write(write("b", "w0", set("other", "0"))));
        let slow = Mutation::HashSet {
            key: "slow".into(),
            fields: vec![("x".into(), "1".into())],
        };
        let first = sink.send(Write(FencedWrite {
            mutations: vec![set("k", "1"), slow],
            ..write("a", "w1", set("k", "1"))
        }));
        let second = sink.send(Write(write("a", "w2", set("k", "2"))));
        let (a, b, c) = futures_util::join!(other, first, second);
        for admission in [a, b, c] {
            assert_eq!(admission.unwrap().unwrap(), Admission::Applied);
        }
        let k = store.store.read("k").await.unwrap();
        assert_eq!(
            k,
            Some(Value::Text("2".into())),
            "the second write applied last"
        );
    }
}
