//! The in-memory fenced sink.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use super::lock;
use crate::admission::{Admission, Fence, Rejection, ScopeFence};
use crate::error::Result;
use crate::ids::{FencingToken, Scope};
use crate::mutation::{apply_all, Value};
use crate::store::{collect_budget, FencedStore, FencedWrite};

/// In-memory [`FencedStore`]: the same rule, watermark and collection as the Redis sink,
/// step for step (the differential test compares them).
#[derive(Debug)]
pub struct MemoryFencedStore {
    state: Mutex<SinkState>,
    retention: Duration,
}

#[derive(Debug, Default)]
struct SinkState {
    fences: HashMap<Scope, ScopeFence>,
    data: HashMap<String, Value>,
    /// The largest watermark applied; `pending` is the largest observed, applied at the
    /// start of the next write call (as the Redis sink learns it with its next script call).
    watermark: FencingToken,
    pending: FencingToken,
    /// Fences to look at once the watermark passes their token, in token order.
    collectable: BTreeSet<(FencingToken, Scope)>,
    /// Applied keys in the order they were applied, for retention by time.
    applied: VecDeque<(Instant, Scope, crate::ids::IdempotencyKey)>,
}

impl Default for MemoryFencedStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryFencedStore {
    /// An empty sink; idempotency keys are kept 24 hours (and at most
    /// [`ScopeFence::MAX_KEYS`] per scope).
    pub fn new() -> Self {
        Self {
            state: Mutex::default(),
            retention: Duration::from_secs(24 * 3600),
        }
    }

    /// Forgets idempotency keys after `retention` (a repeat of such a write after that would
    /// apply again).
    pub fn with_key_retention(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self
    }

    /// Scopes the sink holds state for (fence or keys): what bounded state is measured by.
    pub fn scopes_held(&self) -> usize {
        lock(&self.state).fences.len()
    }
}

impl SinkState {
    /// Applies the pending watermark, then forgets at most `budget` fences below it and at
    /// most `budget` keys past their retention: bounded work per call, amortised over the
    /// writes that created the state.
    fn collect(&mut self, budget: usize, now: Instant, retention: Duration) {
        self.watermark = self.watermark.max(self.pending);
        for _ in 0..budget {
            match self.collectable.first() {
                Some((token, _)) if *token < self.watermark => {}
                _ => break,
            }
            let (_, scope) = self.collectable.pop_first().expect("just looked");
            if let Some(fence) = self.fences.get_mut(&scope) {
                fence.collect(self.watermark);
                if fence.is_empty() {
                    self.fences.remove(&scope);
                }
            }
        }
        for _ in 0..budget {
            match self.applied.front() {
                Some((at, ..)) if now.saturating_duration_since(*at) >= retention => {}
                _ => break,
            }
            let (_, scope, key) = self.applied.pop_front().expect("just looked");
            if let Some(fence) = self.fences.get_mut(&scope) {
                fence.forget_key(&key);
                if fence.is_empty() {
                    self.fences.remove(&scope);
                }
            }
        }
    }

    fn write(&mut self, write: FencedWrite, now: Instant) -> Admission {
        let w = self.watermark;
        let fence = self.fences.get(&write.scope);
        let decided = match fence {
            Some(f) => f.decide(write.fence, &write.key, w),
            None => ScopeFence::default().decide(write.fence, &write.key, w),
        };
        if let Admission::Rejected(_) = decided {
            return decided; // nothing changes, not even an empty entry for the scope
        }
        if decided == Admission::Applied {
            // Applied whole or not at all. A refusal for its content changes no data and
            // records no key, but the writer passed the ownership checks: its token still
            // fences every older lease out (admission::advance).
            if let Err(why) = apply_all(&mut self.data, write.mutations) {
                let fence = self.fences.entry(write.scope.clone()).or_default();
                if fence.refuse_content(write.fence) {
                    self.collectable.insert((write.fence.token, write.scope));
                }
                return Admission::Rejected(Rejection::Mutation { why });
            }
            self.applied
                .push_back((now, write.scope.clone(), write.key.clone()));
        }
        let fence = self.fences.entry(write.scope.clone()).or_default();
        let before = fence.highest;
        let admission = fence.admit(write.fence, &write.key, w);
        if fence.highest != before {
            self.collectable.insert((write.fence.token, write.scope));
        }
        admission
    }
}

#[async_trait]
impl FencedStore for MemoryFencedStore {
    async fn write(&self, write: FencedWrite) -> Result<Admission> {
        let mut out = self.write_batch(vec![write]).await?;
        Ok(out.pop().expect("one write, one answer")?)
    }

    async fn write_batch(&self, writes: Vec<FencedWrite>) -> Result<Vec<Result<Admission>>> {
        let now = crate::clock::now();
        let mut state = lock(&self.state);
        state.collect(collect_budget(writes.len()), now, self.retention);
        Ok(writes
            .into_iter()
            .map(|w| Ok(state.write(w, now)))
            .collect())
    }

    fn observe_watermark(&self, watermark: FencingToken) {
        let mut state = lock(&self.state);
        state.pending = state.pending.max(watermark);
    }

    async fn read(&self, key: &str) -> Result<Option<Value>> {
        Ok(lock(&self.state).data.get(key).cloned())
    }

    async fn highest(&self, scope: &Scope) -> Result<Option<Fence>> {
        Ok(lock(&self.state).fences.get(scope).and_then(|f| f.highest))
    }
}
