//! What a handler sees: [`JobContext`] with its lease, cancellation token and sink handles,
//! and the [`Registry`] that maps job kinds to handlers.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use actix::Addr;
use futures_util::future::BoxFuture;
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;

use crate::admission::{Admission, Fence};
use crate::error::{Error, Result};
use crate::ids::{IdempotencyKey, Lease};
use crate::job::{Job, JobError};
use crate::sink::{FencedSink, Write};
use crate::store::{FencedWrite, Mutation};

/// The fenced sinks a worker's handlers may write to, by name.
#[derive(Clone, Default)]
pub struct Sinks(Arc<HashMap<String, Addr<FencedSink>>>);

impl Sinks {
    /// No sinks.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a sink under `name`.
    pub fn with(mut self, name: impl Into<String>, sink: Addr<FencedSink>) -> Self {
        Arc::make_mut(&mut self.0).insert(name.into(), sink);
        self
    }

    /// Passes the coordinator's low watermark on to every sink.
    pub(crate) fn observe_watermark(&self, watermark: crate::ids::FencingToken) {
        for sink in self.0.values() {
            sink.do_send(crate::sink::ObserveWatermark(watermark));
        }
    }
}

/// Everything a handler needs about the claim it runs under.
pub struct JobContext {
    job: Arc<Job>,
    lease: Lease,
    cancel: CancellationToken,
    sinks: Sinks,
    writes: Arc<AtomicU32>,
}

impl JobContext {
    pub(crate) fn new(
        job: Arc<Job>,
        lease: Lease,
        cancel: CancellationToken,
        sinks: Sinks,
    ) -> Self {
        Self {
            job,
            lease,
            cancel,
            sinks,
            writes: Arc::default(),
        }
    }

    /// The job being run.
    pub fn job(&self) -> &Job {
        &self.job
    }

    /// The lease it runs under.
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// Fired when the worker learns the lease is lost or is shutting down past its drain
    /// deadline. Advisory: a paused process cannot observe it in time — the sink is the fence.
    pub fn cancellation(&self) -> &CancellationToken {
        &self.cancel
    }

    /// A handle to the sink called `name`, whose writes carry this lease's fence.
    pub fn sink(&self, name: &str) -> Result<SinkHandle> {
        let addr = self
            .sinks
            .0
            .get(name)
            .cloned()
            .ok_or_else(|| Error::UnknownSink(name.to_owned()))?;
        Ok(SinkHandle {
            addr,
            fence: Fence {
                token: self.lease.token,
                lease: self.lease.id,
            },
            lease: self.lease.clone(),
            job: self.job.id,
            writes: self.writes.clone(),
        })
    }
}

/// Writes to one fenced sink under one lease.
#[derive(Clone)]
pub struct SinkHandle {
    addr: Addr<FencedSink>,
    fence: Fence,
    lease: Lease,
    job: crate::ids::JobId,
    writes: Arc<AtomicU32>,
}

impl SinkHandle {
    /// Writes `mutations` under a derived idempotency key: job id + the write's sequence
    /// number in this run of the handler. Deterministic across runs, so a job that re-runs
    /// after a stall (its earlier run wrote, then paused or died before settling) and repeats
    /// the same writes in the same order gets `Duplicate`s, not second applications. A handler
    /// whose writes differ between runs should name them with [`SinkHandle::write_keyed`].
    pub async fn write(&self, mutations: Vec<Mutation>) -> Result<Admission> {
        let seq = self.writes.fetch_add(1, Ordering::Relaxed);
        let key = IdempotencyKey::new(format!("{}/{seq}", self.job));
        self.write_keyed(key, mutations).await
    }

    /// Writes `mutations` under a caller-chosen idempotency key.
    pub async fn write_keyed(
        &self,
        key: IdempotencyKey,
        mutations: Vec<Mutation>,
    ) -> Result<Admission> {
        self.addr
            .send(Write(FencedWrite {
                scope: self.lease.scope.clone(),
                fence: self.fence,
                key,
                mutations,
            }))
            .await?
    }
}

pub(crate) type ErasedHandler =
    Arc<dyn Fn(JobContext, &str) -> BoxFuture<'static, Result<(), JobError>> + Send + Sync>;

type PayloadCheck = Arc<dyn Fn(&str) -> Result<(), String> + Send + Sync>;

/// Maps job kinds to handlers.
#[derive(Clone, Default)]
pub struct Registry(HashMap<String, (ErasedHandler, PayloadCheck)>);

impl Registry {
    /// No handlers.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers `handler` for jobs of `kind` whose payload decodes as `T`. A payload that
    /// does not decode is dead-lettered with the decode error, never retried.
    pub fn register<T, F, Fut>(mut self, kind: impl Into<String>, handler: F) -> Self
    where
        T: DeserializeOwned + Send + 'static,
        F: Fn(JobContext, T) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), JobError>> + Send + 'static,
    {
        let kind = kind.into();
        let name = kind.clone();
        let erased: ErasedHandler = Arc::new(
            move |ctx, payload: &str| match serde_json::from_str::<T>(payload) {
                Ok(value) => Box::pin(handler(ctx, value)),
                Err(e) => {
                    let reason = format!("payload does not decode for kind {name:?}: {e}");
                    Box::pin(async move { Err(JobError::Fatal(reason)) })
                }
            },
        );
        let check: PayloadCheck = Arc::new(|payload: &str| {
            serde_json::from_str::<T>(payload)
                .map(drop)
                .map_err(|e| e.to_string())
        });
        self.0.insert(kind, (erased, check));
        self
    }

    pub(crate) fn get(&self, kind: &str) -> Option<&ErasedHandler> {
        self.0.get(kind).map(|(handler, _)| handler)
    }

    /// Checks, before enqueueing, that `kind` is registered and `payload` decodes for it — so
    /// a producer hears about a typo now instead of finding a dead-letter entry later.
    pub fn check(&self, kind: &str, payload: &str) -> Result<()> {
        let (_, check) = self.0.get(kind).ok_or_else(|| {
            let mut known: Vec<&str> = self.kinds().collect();
            known.sort_unstable();
            Error::InvalidJob(format!(
                "unknown job kind {kind:?}; known kinds: {}",
                known.join(", ")
            ))
        })?;
        check(payload)
            .map_err(|e| Error::Payload(format!("payload for {kind:?} does not decode: {e}")))
    }

    /// Registered kinds.
    pub fn kinds(&self) -> impl Iterator<Item = &str> {
        self.0.keys().map(String::as_str)
    }
}
