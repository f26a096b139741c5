//! `Historian`: one sample of the fleet's counts a minute, kept in the coordinator
//! ([`ControlStore::note_history`]) for the operator console's charts — by one process per
//! coordinator (the `history` role), whichever holds it.
//!
//! Prometheus keeps the real history; this is the console's own, bounded (a day), so the
//! page has something to draw where no Prometheus runs, and costs one small write a minute.

use std::time::Duration;

use actix::prelude::*;

use crate::store::{ControlStore, HistorySample, Inspect, QueueAdmin, Stores};

/// The role's name in the store.
const ROLE: &str = "history";

/// Notes a [`HistorySample`] every interval while it holds the `history` role.
pub struct Historian {
    store: Stores,
    /// Who asks for the role (unique per process and coordinator).
    holder: String,
    every: Duration,
    in_flight: bool,
}

impl Historian {
    /// A historian of `store` noting a sample `every` (clamped to a second ..= an hour; the
    /// console draws one a minute, the default).
    pub fn new(store: impl Into<Stores>, every: Duration) -> Self {
        Self {
            store: store.into(),
            holder: format!("{}/{}", std::process::id(), uuid::Uuid::new_v4()),
            every: every.clamp(Duration::from_secs(1), Duration::from_secs(3600)),
            in_flight: false,
        }
    }

    fn tick(&mut self, ctx: &mut Context<Self>) {
        if self.in_flight {
            return;
        }
        self.in_flight = true;
        let (store, holder) = (self.store.clone(), self.holder.clone());
        // Three intervals: a holder that misses one keeps the role; one that stops, loses it.
        let ttl = self.every.saturating_mul(3);
        let pass = async move {
            if store.hold_role(ROLE, &holder, ttl).await? {
                let sample = sample(&store).await?;
                store.note_history(sample).await?;
            }
            Ok::<(), crate::Error>(())
        };
        ctx.spawn(pass.into_actor(self).map(|result, act, _| {
            act.in_flight = false;
            if let Err(e) = result {
                tracing::debug!(error = %e, "history sample failed; the next one tries again");
                metrics::counter!(crate::metrics::BACKEND_ERRORS, "op" => "history").increment(1);
            }
        }));
    }
}

/// The fleet's counts now; the longest wait among queues not paused (a queue paused on
/// purpose waits by design, as `PalisadeNoProgress` knows).
pub(crate) async fn sample(store: &Stores) -> crate::Result<HistorySample> {
    let mut sample = HistorySample {
        at_ms: u64::try_from(store.now_ms().await?).unwrap_or_default(),
        ..HistorySample::default()
    };
    let paused = store.paused().await?;
    for queue in store.queues().await? {
        sample.counts += store.counts(&queue).await?;
        if !paused.contains(&queue) {
            let oldest = store.oldest_ready(&queue).await?.unwrap_or_default();
            sample.oldest_ready_ms = sample.oldest_ready_ms.max(oldest.as_millis() as u64);
        }
    }
    Ok(sample)
}

impl Actor for Historian {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        self.tick(ctx);
        ctx.run_interval(self.every, Self::tick);
    }
}

/// Stops the historian (its coordinator stopped). The role lapses after three intervals.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct StopHistory;

impl Handler<StopHistory> for Historian {
    type Result = ();

    fn handle(&mut self, _: StopHistory, ctx: &mut Self::Context) {
        ctx.stop();
    }
}
