//! `FencedSink`: the actor façade over a [`FencedStore`] backend; counts every outcome.
//!
//! The actor adds no check of its own — the store's single atomic operation is the fence. A
//! check here (read highest, then write) would be exactly the race fencing exists to close.

use std::sync::Arc;

use actix::prelude::*;
use metrics::counter;

use crate::admission::{Admission, Fence};
use crate::error::Result;
use crate::ids::Scope;
use crate::metrics as m;
use crate::store::{FencedStore, FencedWrite, Value};

/// A named fenced sink ("ledger") over one backend.
pub struct FencedSink {
    name: Arc<str>,
    store: Arc<dyn FencedStore>,
}

impl FencedSink {
    /// A sink called `name` (the handler-side name and the metric label).
    pub fn new(name: impl Into<Arc<str>>, store: Arc<dyn FencedStore>) -> Self {
        Self {
            name: name.into(),
            store,
        }
    }
}

impl Actor for FencedSink {
    type Context = Context<Self>;

    fn started(&mut self, _: &mut Self::Context) {
        for reason in ["stale_token", "token_conflict"] {
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

    fn handle(&mut self, msg: Write, _: &mut Self::Context) -> Self::Result {
        let (name, store) = (self.name.clone(), self.store.clone());
        Box::pin(async move {
            let scope = msg.0.scope.clone();
            let result = store.write(msg.0).await;
            let outcome = match &result {
                Ok(Admission::Applied) => "applied",
                Ok(Admission::Duplicate) => "duplicate",
                Ok(Admission::Rejected(rejection)) => {
                    tracing::warn!(sink = %name, %scope, %rejection, "fenced write refused");
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
            result
        })
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
