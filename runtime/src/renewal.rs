//! `Renewal`: keeps one worker's leases alive with one batched call every ttl/3, and tells the
//! worker which ones it lost.
//!
//! A lease counts as lost in two ways: the coordinator says it is not current, or its local
//! deadline passed without a confirmed renewal (coordinator unreachable, or this process was
//! paused). The second matters: a worker that cannot *prove* it still holds a lease must act
//! as if it does not.

use std::time::Duration;

use foldhash::{HashMap, HashMapExt};

use actix::prelude::*;
use metrics::{counter, histogram};
use tokio::time::Instant;

use crate::coordinator::{Coordinator, RenewLeases};
use crate::ids::{Lease, LeaseId};
use crate::metrics as m;

/// Renews every lease one worker holds.
pub(crate) struct Renewal {
    coordinator: Addr<Coordinator>,
    worker: Recipient<LeaseLost>,
    ttl: Duration,
    /// Lease → local deadline (last confirmed renewal's send time + ttl).
    held: HashMap<LeaseId, Instant>,
    in_flight: bool,
    suspended: bool,
}

impl Renewal {
    /// Renews for `worker` at `coordinator`, extending by `ttl` each time.
    pub fn new(
        coordinator: Addr<Coordinator>,
        worker: Recipient<LeaseLost>,
        ttl: Duration,
    ) -> Self {
        Self {
            coordinator,
            worker,
            ttl,
            held: HashMap::new(),
            in_flight: false,
            suspended: false,
        }
    }

    fn lose(&mut self, lease: LeaseId, reason: LossReason) {
        if self.held.remove(&lease).is_some() {
            counter!(m::LEASES_LOST, "reason" => reason.label()).increment(1);
            self.worker.do_send(LeaseLost { lease, reason });
        }
    }

    fn tick(&mut self, ctx: &mut Context<Self>) {
        if self.suspended {
            return;
        }
        let now = Instant::now();
        let overdue: Vec<LeaseId> = self
            .held
            .iter()
            .filter(|(_, deadline)| **deadline <= now)
            .map(|(lease, _)| *lease)
            .collect();
        for lease in overdue {
            self.lose(lease, LossReason::Unconfirmed);
        }
        if self.in_flight || self.held.is_empty() {
            return;
        }
        self.in_flight = true;
        let leases: Vec<LeaseId> = self.held.keys().copied().collect();
        let request = self.coordinator.send(RenewLeases {
            leases: leases.clone(),
            ttl: self.ttl,
        });
        ctx.spawn(request.into_actor(self).map(move |result, act, _| {
            act.in_flight = false;
            // Failed and slow renewals count too: they are the ones worth seeing.
            histogram!(m::RENEWAL_DURATION).record(now.elapsed());
            match result {
                Ok(Ok(lost)) => {
                    for lease in &lost {
                        act.lose(*lease, LossReason::Expired);
                    }
                    let deadline = now + act.ttl;
                    let mut renewed = 0;
                    for lease in &leases {
                        if let Some(d) = act.held.get_mut(lease) {
                            *d = deadline;
                            renewed += 1;
                        }
                    }
                    counter!(m::RENEWALS, "outcome" => "renewed").increment(renewed);
                    counter!(m::RENEWALS, "outcome" => "lost").increment(lost.len() as u64);
                }
                Ok(Err(e)) => {
                    crate::repeats::warn_repeated!(error = %e, leases = leases.len(), "lease renewal failed");
                    counter!(m::RENEWALS, "outcome" => "error").increment(1);
                }
                Err(e) => {
                    crate::repeats::warn_repeated!(error = %e, "coordinator unreachable for renewal");
                    counter!(m::RENEWALS, "outcome" => "error").increment(1);
                }
            }
        }));
    }
}

impl Actor for Renewal {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        // ttl/3 leaves two more chances to renew before expiry if one call is slow or lost.
        ctx.run_interval(self.ttl / 3, Self::tick);
    }
}

/// Starts renewing leases (a claim's batch: one message, not one a job).
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct TrackLeases(pub Vec<Lease>);

impl Handler<TrackLeases> for Renewal {
    type Result = ();

    fn handle(&mut self, msg: TrackLeases, _: &mut Self::Context) {
        self.held
            .extend(msg.0.into_iter().map(|lease| (lease.id, lease.expires_at)));
    }
}

/// Stops renewing leases (their jobs settled: a settlement batch's).
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct ForgetLeases(pub Vec<LeaseId>);

impl Handler<ForgetLeases> for Renewal {
    type Result = ();

    fn handle(&mut self, msg: ForgetLeases, _: &mut Self::Context) {
        for lease in msg.0 {
            self.held.remove(&lease);
        }
    }
}

/// Fault injection (feature `testing`): stop (`true`) or resume (`false`) renewing, as a
/// paused process would.
#[cfg(feature = "testing")]
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct SuspendRenewals(pub bool);

#[cfg(feature = "testing")]
impl Handler<SuspendRenewals> for Renewal {
    type Result = ();

    fn handle(&mut self, msg: SuspendRenewals, _: &mut Self::Context) {
        self.suspended = msg.0;
    }
}

/// Why a worker considers a lease lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LossReason {
    /// The coordinator said it is not current.
    Expired,
    /// Its deadline passed without a confirmed renewal.
    Unconfirmed,
}

impl LossReason {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Expired => "expired",
            Self::Unconfirmed => "unconfirmed",
        }
    }
}

/// The lease of a running job is gone; its handler's cancellation token fires.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct LeaseLost {
    /// The lost lease.
    pub lease: LeaseId,
    /// How it was lost.
    pub reason: LossReason,
}
