//! Fault injection by wrapping one concern: [`Faults`] implements [`LeaseStore`] (the hot
//! path) and nothing else, and [`Faults::around`] puts it in place of a coordinator's hot path
//! while every other store trait goes to the real backend untouched — no forwarding of
//! operations it does not change (tower's `Layer` idea).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use palisade::{
    Claim, Enqueued, Error, FencingToken, FollowUps, JobId, LeaseId, LeaseStore, NewJob, Reaped,
    Result, Scope, Settlement, Stores,
};

/// A hot-path operation that can be made to fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    Enqueue,
    Claim,
    Renew,
    Settle,
    Reap,
}

/// A [`LeaseStore`] that fails the operations it is told to with
/// [`Error::Unavailable`] (as a lost backend would), and passes everything else through.
pub struct Faults {
    inner: Arc<dyn LeaseStore>,
    failing: Mutex<HashSet<Op>>,
    /// How long each claim and settlement takes on top of the backend's own time.
    delay: Mutex<Duration>,
}

impl Faults {
    /// `stores` with its hot path behind a `Faults` (nothing failing yet), and the handle that
    /// switches faults on and off.
    pub fn around(stores: impl Into<Stores>) -> (Arc<Faults>, Stores) {
        let stores = stores.into();
        let faults = Arc::new(Faults {
            inner: stores.lease_store(),
            failing: Mutex::default(),
            delay: Mutex::default(),
        });
        (faults.clone(), stores.with_lease_store(faults))
    }

    /// Makes `op` fail (`true`) or work again (`false`).
    pub fn fail(&self, op: Op, failing: bool) {
        let mut set = self.failing.lock().unwrap();
        match failing {
            true => set.insert(op),
            false => set.remove(&op),
        };
    }

    /// Makes every claim and settlement take `delay` longer (a slow link), so a test can act
    /// while one is in flight.
    pub fn delay(&self, delay: Duration) {
        *self.delay.lock().unwrap() = delay;
    }

    async fn slow(&self) {
        let delay = *self.delay.lock().unwrap();
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
    }

    fn check(&self, op: Op) -> Result<()> {
        match self.failing.lock().unwrap().contains(&op) {
            true => Err(Error::Unavailable(format!("injected {op:?} failure"))),
            false => Ok(()),
        }
    }
}

#[async_trait]
impl LeaseStore for Faults {
    async fn enqueue_all(&self, jobs: Vec<NewJob>) -> Result<Vec<Enqueued>> {
        self.check(Op::Enqueue)?;
        self.inner.enqueue_all(jobs).await
    }
    async fn claim_kinds(
        &self,
        queue: &str,
        kinds: &[String],
        worker: &str,
        n: usize,
        ttl: Duration,
    ) -> Result<Vec<Claim>> {
        self.slow().await;
        self.check(Op::Claim)?;
        self.inner.claim_kinds(queue, kinds, worker, n, ttl).await
    }
    async fn renew(&self, leases: &[LeaseId], ttl: Duration) -> Result<Vec<LeaseId>> {
        self.check(Op::Renew)?;
        self.inner.renew(leases, ttl).await
    }
    async fn settle(&self, settlements: Vec<(LeaseId, Settlement)>) -> Result<Vec<Result<()>>> {
        self.slow().await;
        self.check(Op::Settle)?;
        self.inner.settle(settlements).await
    }
    fn watermark(&self) -> Option<FencingToken> {
        self.inner.watermark()
    }
    async fn reap(&self, max: usize) -> Result<Vec<Reaped>> {
        self.check(Op::Reap)?;
        self.inner.reap(max).await
    }
    async fn follow_ups(&self, older_than: Duration, max: usize) -> Result<Vec<FollowUps>> {
        self.inner.follow_ups(older_than, max).await
    }
    async fn forget_follow_ups(&self, parent: JobId) -> Result<()> {
        self.inner.forget_follow_ups(parent).await
    }
    async fn highest_token(&self, scope: &Scope) -> Result<Option<FencingToken>> {
        self.inner.highest_token(scope).await
    }
    async fn epoch(&self) -> Result<Option<u32>> {
        self.inner.epoch().await
    }
    async fn raise_epoch(&self, at_least: u32) -> Result<u32> {
        self.inner.raise_epoch(at_least).await
    }
}
