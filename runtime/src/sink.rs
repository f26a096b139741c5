//! `FencedSink`: the actor façade over a [`FencedStore`] backend; counts every outcome.
//!
//! The actor adds no check of its own — the store's single atomic operation is the fence. A
//! check here (read highest, then write) would be exactly the race fencing exists to close.
//!
//! Writes that arrive while a batch is on its way to the store are sent together as the next
//! batch (group commit): under load many handlers' writes share one round trip, while a lone
//! write still goes out at once. Each write stays its own atomic admission + mutation.

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
    in_flight: bool,
}

impl FencedSink {
    /// Most writes sent to the store in one batch.
    const MAX_BATCH: usize = 256;

    /// A sink called `name` (the handler-side name and the metric label).
    pub fn new(name: impl Into<Arc<str>>, store: Arc<dyn FencedStore>) -> Self {
        Self {
            name: name.into(),
            store,
            queued: Vec::new(),
            in_flight: false,
        }
    }

    fn flush(&mut self, ctx: &mut Context<Self>) {
        if self.in_flight || self.queued.is_empty() {
            return;
        }
        self.in_flight = true;
        let rest = self
            .queued
            .split_off(self.queued.len().min(Self::MAX_BATCH));
        let (writes, replies): (Vec<FencedWrite>, Vec<Reply>) =
            std::mem::replace(&mut self.queued, rest)
                .into_iter()
                .unzip();
        let scopes: Vec<Scope> = writes.iter().map(|w| w.scope.clone()).collect();
        let store = self.store.clone();
        let batch = async move { store.write_batch(writes).await };
        ctx.spawn(batch.into_actor(self).map(move |result, act, ctx| {
            act.in_flight = false;
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
