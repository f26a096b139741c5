//! `Sampler`: queue depth and the age of the next ready job, as gauges — sampled by one
//! process per coordinator, not by every worker.
//!
//! A [`Coordinator`](crate::Coordinator) with a sample interval runs one; each tick it asks
//! the store for the `sampler` role (a lease by the coordinator's clock,
//! [`ControlStore::hold_role`]) and only the holder samples. N workers therefore cost one set of counting calls per tick, not N, and
//! a dashboard reads one series per queue and state (a sampler that loses the role stops
//! setting its gauges, which then leave its `/metrics` output: see `metrics::serve`).

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use metrics::gauge;

use crate::metrics as m;
use crate::store::{ControlStore, FlowStore, Inspect, QueueAdmin};

/// The role's name in the store.
const ROLE: &str = "sampler";

/// Samples every queue's depth while it holds the `sampler` role.
pub struct Sampler {
    store: Arc<dyn Inspect>,
    flows: Option<Arc<dyn FlowStore>>,
    admin: Option<Arc<dyn QueueAdmin>>,
    roles: Arc<dyn ControlStore>,
    /// Who asks for the role (unique per process and coordinator).
    holder: String,
    every: Duration,
    in_flight: bool,
}

impl Sampler {
    /// A sampler of `store`'s queues ticking `every`, holding its role in `roles`.
    pub fn new(store: Arc<dyn Inspect>, roles: Arc<dyn ControlStore>, every: Duration) -> Self {
        Self {
            store,
            flows: None,
            admin: None,
            roles,
            holder: format!("{}/{}", std::process::id(), uuid::Uuid::new_v4()),
            every,
            in_flight: false,
        }
    }

    fn tick(&mut self, ctx: &mut Context<Self>) {
        if self.in_flight {
            return;
        }
        self.in_flight = true;
        let (store, roles, holder) = (self.store.clone(), self.roles.clone(), self.holder.clone());
        let (flows, admin) = (self.flows.clone(), self.admin.clone());
        // Three ticks: a holder that misses one keeps the role; one that stops, loses it.
        let ttl = self.every.saturating_mul(3);
        let pass = async move {
            if roles.hold_role(ROLE, &holder, ttl).await? {
                let paused = match admin {
                    Some(admin) => Some(admin.paused().await?),
                    None => None,
                };
                let workers = roles.workers().await?;
                sample(&*store, paused.as_deref(), &workers).await?;
                // Ages by the coordinator's clock, which marks and creation times are in (a
                // sampler host whose clock runs ahead must not read schedules as late).
                let now = roles.now_ms().await?;
                // (Each part on its own: one that fails leaves the others current.)
                if let Err(e) = sample_schedules(&*roles, now).await {
                    tracing::debug!(error = %e, "schedule sample failed; next tick tries again");
                }
                if let Some(flows) = flows {
                    let (running, oldest) = flows.running_flows(1).await?;
                    gauge!(m::FLOWS_RUNNING).set(running as f64);
                    let now = u64::try_from(now).unwrap_or(0);
                    let age = oldest
                        .first()
                        .map_or(0, |(_, created)| now.saturating_sub(*created));
                    gauge!(m::FLOW_OLDEST_AGE).set(age as f64 / 1000.0);
                    // The coordinator's own count, set as is (as the queues' enqueues).
                    if let Some(created) = flows.flows_created().await? {
                        metrics::counter!(m::FLOWS_KEPT).absolute(created);
                    }
                }
            }
            Ok::<(), crate::Error>(())
        };
        ctx.spawn(pass.into_actor(self).map(|result, act, _| {
            act.in_flight = false;
            if let Err(e) = result {
                tracing::debug!(error = %e, "queue depth sample failed; next tick tries again");
                metrics::counter!(m::BACKEND_ERRORS, "op" => "sample").increment(1);
            }
        }));
    }
}

impl Sampler {
    /// Also samples how many flows run ([`FlowStore::running_flows`]).
    pub fn with_flows(mut self, flows: Arc<dyn FlowStore>) -> Self {
        self.flows = Some(flows);
        self
    }

    /// Also samples which queues are paused ([`QueueAdmin::paused`]).
    pub fn with_admin(mut self, admin: Arc<dyn QueueAdmin>) -> Self {
        self.admin = Some(admin);
        self
    }
}

/// One sample of every queue; `paused`, when known, the paused queues. A queue whose read
/// fails for good (a key of it another program wrote over: a permanent error) is said and
/// passed over, so the other queues' depths stay current; a backend that is down ends the
/// pass, to be tried again next tick.
async fn sample(
    store: &dyn Inspect,
    paused: Option<&[String]>,
    workers: &[crate::store::WorkerBeat],
) -> crate::Result<()> {
    for queue in store.queues().await? {
        let claimed_by = workers.iter().filter(|w| w.queues.contains(&queue)).count();
        gauge!(m::QUEUE_WORKERS, "queue" => queue.clone()).set(claimed_by as f64);
        match sample_queue(store, &queue, paused).await {
            Err(e) if e.leaves_queue_out(&queue, "sample") => {}
            other => other?,
        }
    }
    Ok(())
}

/// How late each kept schedule's next tick is at `now` (the coordinator's clock): the tick
/// after the instant its scheduler handled it through (never handled: not late; a schedule
/// no scheduler ever saw cannot be told from a new one).
async fn sample_schedules(roles: &dyn ControlStore, now: i64) -> crate::Result<()> {
    for spec in roles.schedules().await? {
        let name = spec.name.clone();
        let Ok(schedule) = crate::Schedule::try_from(spec) else {
            continue; // (the scheduler warns about it)
        };
        let late = match roles.schedule_mark(&name).await? {
            Some(mark) => schedule
                .next_tick(mark)
                .map_or(0, |next| now.saturating_sub(next).max(0)),
            None => 0,
        };
        gauge!(m::SCHEDULE_OVERDUE, "schedule" => name).set(late as f64 / 1000.0);
    }
    Ok(())
}

/// One queue's share of [`sample`].
async fn sample_queue(
    store: &dyn Inspect,
    queue: &str,
    paused: Option<&[String]>,
) -> crate::Result<()> {
    let counts = store.counts(queue).await?;
    let oldest = store.oldest_ready(queue).await?;
    for (state, n) in [
        ("ready", counts.ready),
        ("waiting", counts.waiting),
        ("delayed", counts.delayed),
        ("leased", counts.leased),
        ("dead", counts.dead),
    ] {
        gauge!(m::QUEUE_DEPTH, "queue" => queue.to_owned(), "state" => state).set(n as f64);
    }
    gauge!(m::QUEUE_OLDEST_READY_AGE, "queue" => queue.to_owned())
        .set(oldest.unwrap_or_default().as_secs_f64());
    // The coordinator's own count, set as is: every sampler in turn reports the same
    // fleet-wide total, which only grows.
    metrics::counter!(m::JOBS_CANCELLED, "queue" => queue.to_owned()).absolute(counts.cancelled);
    metrics::counter!(m::QUEUE_ENQUEUED, "queue" => queue.to_owned()).absolute(counts.enqueued);
    metrics::counter!(m::QUEUE_STALLS, "queue" => queue.to_owned()).absolute(counts.stalled);
    if let Some(paused) = paused {
        let is_paused = paused.iter().any(|p| p == queue);
        gauge!(m::QUEUE_PAUSED, "queue" => queue.to_owned()).set(f64::from(u8::from(is_paused)));
    }
    // The top groups only, so the label set stays bounded however many groups there are
    // (a group that leaves the top is no longer set and leaves the output when its gauge
    // goes idle).
    for g in store.groups(queue, m::GROUPS_SAMPLED).await? {
        gauge!(m::GROUP_READY, "queue" => queue.to_owned(), "group" => g.group).set(g.ready as f64);
    }
    Ok(())
}

impl Actor for Sampler {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        self.tick(ctx);
        ctx.run_interval(self.every, Self::tick);
    }
}

/// Stops the sampler (its coordinator stopped). The role lapses after three intervals.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct StopSampling;

impl Handler<StopSampling> for Sampler {
    type Result = ();

    fn handle(&mut self, _: StopSampling, ctx: &mut Self::Context) {
        ctx.stop();
    }
}
