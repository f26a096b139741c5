//! Metric names (one place, so dashboards and code agree); `palisade::metrics` adds the
//! Prometheus exporter.
//!
//! Labels are low-cardinality only: queue, kind, sink, reason, outcome — never job ids or
//! scopes, which would make a series per job.

use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};

/// Jobs accepted by enqueue. Labels: queue.
pub const JOBS_ENQUEUED: &str = "palisade_jobs_enqueued_total";
/// Leases granted. Labels: queue.
pub const CLAIMS: &str = "palisade_claims_total";
/// Jobs a worker finished running. Labels: queue, kind, outcome
/// (completed|retried|dead|fenced|released|snoozed|expired|timed_out).
pub const JOBS_FINISHED: &str = "palisade_jobs_finished_total";
/// Settlements the coordinator refused because the lease was no longer current. Labels: queue.
pub const SETTLEMENTS_REFUSED: &str = "palisade_settlements_refused_total";
/// Lease renewals. Labels: outcome (renewed|lost|error).
pub const RENEWALS: &str = "palisade_renewals_total";
/// Leases a worker learned it lost (renewal refused, or not confirmed before expiry).
/// Labels: reason (expired|unconfirmed).
pub const LEASES_LOST: &str = "palisade_leases_lost_total";
/// Expired leases reaped. Labels: queue, outcome (requeued|dead).
pub const STALLS: &str = "palisade_stalls_total";
/// Fenced sink writes. Labels: sink, outcome (applied|duplicate|rejected|error).
pub const SINK_WRITES: &str = "palisade_sink_writes_total";
/// Fenced sink refusals. Labels: sink, reason (stale_token|token_conflict).
pub const FENCE_REJECTIONS: &str = "palisade_fence_rejections_total";
/// Handler run time. Labels: queue, kind.
pub const JOB_DURATION: &str = "palisade_job_duration_seconds";
/// Backend operations that failed. Labels: op.
pub const BACKEND_ERRORS: &str = "palisade_backend_errors_total";

/// Outbox entries delivered to their target. Labels: target.
pub const OUTBOX_DELIVERED: &str = "palisade_outbox_delivered_total";
/// Outbox deliveries that failed and will be tried again. Labels: target.
pub const OUTBOX_RETRIED: &str = "palisade_outbox_retried_total";
/// Outbox entries given up on after their last attempt (state `dead`). Labels: target.
pub const OUTBOX_DEAD: &str = "palisade_outbox_dead_total";
/// Follow-up jobs of accepted completions (`JobContext::follow_up`). Labels: outcome
/// (`enqueued` by the delivery an accepted settlement starts, `swept` by the coordinator's
/// sweep, `existing`: a second delivery that added nothing, `dropped`: refused for good by
/// enqueue, logged with the reason).
pub const FOLLOW_UPS: &str = "palisade_follow_ups_total";

/// Stored records a pass met and left in place because this release cannot read them: a
/// later release's format during a rolling deploy, or another program's write. Each pass that
/// meets one counts it again, so the rate stays above zero while any is left. Labels: kind
/// (`follow_ups`, `step_ends`).
pub const RECORDS_UNREADABLE: &str = "palisade_records_unreadable_total";

/// Ends of flow steps' jobs recorded at their flows' homes by the coordinator's flow pass.
/// Labels: end (`completed`, `dead`; a skipped step never ran: see the releases).
pub const FLOW_STEPS: &str = "palisade_flow_steps_total";

/// Flow steps released in their partitions. Labels: action (`run`, `fail`: to the dead
/// letters unrun, `skip`).
pub const FLOW_RELEASES: &str = "palisade_flow_releases_total";

/// Steps added to flows by their steps' accepted completions (`JobContext::add_step`),
/// counted when the coordinator's flow pass adds them (a pass done again counts them again).
/// Labels: outcome (`added`, `dropped`: refused for good, logged with the reason — a store
/// with a smaller payload limit than the worker's, or a flow past `MAX_FLOW_STEPS`).
pub const FLOW_STEPS_ADDED: &str = "palisade_flow_steps_added_total";

/// From a flow step's end to the release of the steps it unblocked (ready to claim), as the
/// coordinator's flow pass delivers it: a callback's latency, less its wait for a claim.
pub const FLOW_RELEASE_LATENCY: &str = "palisade_flow_release_seconds";

/// Flows running (not every step ended), sampled by the worker holding the sampler role.
pub const FLOWS_RUNNING: &str = "palisade_flows_running";

/// Flows created (`Client::create_flow`; a creation done again is not counted).
pub const FLOWS_CREATED: &str = "palisade_flows_created_total";

/// Client round trips to Redis on the hot paths. Labels: op (`claim`, `settle`, `renew`,
/// `reap`, `enqueue`, `settle_and_claim` for the worker's pipelined pair, ...).
pub const REDIS_ROUND_TRIPS: &str = "palisade_redis_round_trips_total";

/// Jobs in a queue by state (ready|waiting|delayed|leased|dead), sampled by the one worker
/// that holds the coordinator's sampler role. Labels: queue, state.
pub const QUEUE_DEPTH: &str = "palisade_queue_depth";
/// Age of the job next in line: since it first became claimable (enqueue time plus delay; a
/// job requeued after a stall, release or retry keeps that time), 0 when nothing is ready.
/// Sampled with [`QUEUE_DEPTH`]. Labels: queue.
pub const QUEUE_OLDEST_READY_AGE: &str = "palisade_queue_oldest_ready_age_seconds";
/// 1 for a paused queue, 0 otherwise ([`QueueAdmin::set_paused`](crate::store::QueueAdmin::set_paused)):
/// `PalisadeNoProgress` stays quiet for a queue paused on purpose. Sampled with
/// [`QUEUE_DEPTH`]. Labels: queue.
pub const QUEUE_PAUSED: &str = "palisade_queue_paused";
/// Ready jobs of a queue's groups ([`NewJob::with_group`](crate::job::NewJob::with_group)), for the
/// [`GROUPS_SAMPLED`] groups with the most, so the series stay few however many groups
/// there are (a group that leaves the top leaves the output when its gauge goes idle).
/// Sampled with [`QUEUE_DEPTH`]. Labels: queue, group.
pub const GROUP_READY: &str = "palisade_group_ready";
/// How many groups per queue [`GROUP_READY`] reports.
pub const GROUPS_SAMPLED: usize = 10;
/// Jobs cancelled in a queue ([`QueueAdmin::cancel`](crate::store::QueueAdmin::cancel), `palisade
/// cancel`, the operator page), whichever process cancelled them: the coordinator counts them
/// and the sampler exports its count, so the series is the fleet's, once. Labels: queue.
pub const JOBS_CANCELLED: &str = "palisade_jobs_cancelled_total";
/// Jobs enqueued to a queue, whichever process enqueued them (the HTTP API, a producer, the
/// CLI, the scheduler): the coordinator counts them and the sampler exports its count, so a
/// worker's scrape shows the fleet's enqueues once ([`JOBS_ENQUEUED`] counts a producer's own,
/// in its process). Follow-up jobs are counted; flow steps are not. Labels: queue.
pub const QUEUE_ENQUEUED: &str = "palisade_queue_enqueued_total";
/// Stalls reaped in a queue, whichever process's reaper took them: the coordinator counts
/// them and the sampler exports its count ([`STALLS`] counts a reaper's own, by outcome, in
/// its process, which may export no metrics). Labels: queue.
pub const QUEUE_STALLS: &str = "palisade_queue_stalls_total";
/// Flows created, whichever process created them (the HTTP API, a producer, a job's
/// follow-ups): the coordinator counts each flow once, where it keeps it, and the sampler
/// exports its count ([`FLOWS_CREATED`] counts a producer's own, in its process).
pub const FLOWS_KEPT: &str = "palisade_flows_kept_total";
/// Requests `palisade api` or `palisade ui` refused before any endpoint ran (an unknown Host,
/// a foreign origin, a missing or wrong credential, a stale form). Labels: surface (`api`,
/// `ui`), reason (the API's error code, or the console's: `unknown_host`, `unauthorized`,
/// `forbidden`).
pub const HTTP_REFUSED: &str = "palisade_http_refused_total";
/// Live worker processes (arbiters) whose heartbeat lists the queue, sampled with
/// [`QUEUE_DEPTH`] for every queue (0: nobody claims it; `PalisadeQueueUnclaimed` fires when
/// it holds ready jobs). Labels: queue.
pub const QUEUE_WORKERS: &str = "palisade_queue_workers";
/// How late a kept schedule's next tick is (0 while none is due): a running scheduler keeps it
/// near 0; it grows while no process holds the scheduler role (`PalisadeScheduleStopped`).
/// Sampled with [`QUEUE_DEPTH`]. Labels: schedule.
pub const SCHEDULE_OVERDUE: &str = "palisade_schedule_overdue_seconds";
/// Age of the oldest running flow (0: none runs), sampled with [`FLOWS_RUNNING`]
/// (`PalisadeFlowStuck`).
pub const FLOW_OLDEST_AGE: &str = "palisade_flow_oldest_running_age_seconds";
/// From sending the claim that granted a lease to its handler starting. Labels: queue.
pub const CLAIM_TO_START: &str = "palisade_claim_to_start_seconds";
/// From a handler returning to the coordinator answering its settlement: the worker's
/// settlement linger plus the round trip (`WorkerConfig::linger`). Labels: queue.
pub const SETTLE_WAIT: &str = "palisade_settle_wait_seconds";
/// One lease renewal round trip (all of a worker's leases in one call).
pub const RENEWAL_DURATION: &str = "palisade_renewal_duration_seconds";
/// Schedule ticks fired by the scheduler role holder. Labels: schedule, outcome (enqueued,
/// or existing: another scheduler had enqueued the tick's job).
pub const SCHEDULE_TICKS: &str = "palisade_schedule_ticks_total";
/// Durable runs' steps (`Durable::step`), sleeps and waits. Labels: kind, outcome (ran: run
/// and journaled now; replayed: the journal answered, nothing ran; refused: the fence refused
/// the step's write, its effect and journal entry both; suspended: a sleep or wait settled
/// the run to resume later).
pub const DURABLE_STEPS: &str = "palisade_durable_steps_total";
/// Waitpoints completed. Labels: outcome (first: this value is kept; already: it was
/// completed before, nothing changed).
pub const WAITPOINTS_COMPLETED: &str = "palisade_waitpoints_completed_total";
/// From a durable sleep's due time, or a waitpoint's completion, to the run going on past it
/// (on the worker's clock; what a suspended run loses to polling and queueing). Labels: kind.
pub const DURABLE_RESUME_DELAY: &str = "palisade_durable_resume_delay_seconds";

/// Histogram buckets of every `_seconds` histogram: a millisecond to ten minutes, so one set
/// fits claim latency, renewals and handler run times alike.
pub const SECONDS_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    120.0, 300.0, 600.0,
];

/// Every metric name above, for dashboards and tests that check they reference real metrics.
pub const ALL: &[&str] = &[
    JOBS_ENQUEUED,
    CLAIMS,
    JOBS_FINISHED,
    SETTLEMENTS_REFUSED,
    RENEWALS,
    LEASES_LOST,
    STALLS,
    SINK_WRITES,
    FENCE_REJECTIONS,
    JOB_DURATION,
    BACKEND_ERRORS,
    REDIS_ROUND_TRIPS,
    OUTBOX_DELIVERED,
    OUTBOX_RETRIED,
    OUTBOX_DEAD,
    FOLLOW_UPS,
    RECORDS_UNREADABLE,
    FLOW_STEPS,
    FLOW_RELEASES,
    FLOW_STEPS_ADDED,
    FLOW_RELEASE_LATENCY,
    FLOWS_RUNNING,
    FLOWS_CREATED,
    QUEUE_DEPTH,
    QUEUE_OLDEST_READY_AGE,
    QUEUE_PAUSED,
    GROUP_READY,
    JOBS_CANCELLED,
    QUEUE_ENQUEUED,
    QUEUE_STALLS,
    FLOWS_KEPT,
    HTTP_REFUSED,
    QUEUE_WORKERS,
    SCHEDULE_OVERDUE,
    FLOW_OLDEST_AGE,
    CLAIM_TO_START,
    SETTLE_WAIT,
    RENEWAL_DURATION,
    SCHEDULE_TICKS,
    DURABLE_STEPS,
    WAITPOINTS_COMPLETED,
    DURABLE_RESUME_DELAY,
];

/// Registers help text for every Palisade metric with the installed recorder.
pub fn describe() {
    describe_counter!(
        DURABLE_STEPS,
        "Durable runs' steps, sleeps and waits, by outcome (ran, replayed, refused, suspended)"
    );
    describe_counter!(
        WAITPOINTS_COMPLETED,
        "Waitpoint completions, by outcome (first: kept; already: completed before)"
    );
    describe_histogram!(
        DURABLE_RESUME_DELAY,
        Unit::Seconds,
        "From a durable sleep's or timed-out wait's due time to the run going on past it"
    );
    describe_counter!(JOBS_ENQUEUED, "Jobs accepted by enqueue");
    describe_counter!(CLAIMS, "Leases granted by claim");
    describe_counter!(JOBS_FINISHED, "Jobs finished by a worker, by outcome");
    describe_counter!(
        SETTLEMENTS_REFUSED,
        "Complete/fail refused because the lease was not current"
    );
    describe_counter!(RENEWALS, "Lease renewals by outcome");
    describe_counter!(LEASES_LOST, "Leases a worker lost, by reason");
    describe_counter!(STALLS, "Expired leases reaped, by outcome");
    describe_counter!(SINK_WRITES, "Fenced sink writes by outcome");
    describe_counter!(FENCE_REJECTIONS, "Fenced sink rejections by reason");
    describe_histogram!(JOB_DURATION, Unit::Seconds, "Handler run time");
    describe_counter!(OUTBOX_DELIVERED, "Outbox entries delivered, by target");
    describe_counter!(
        OUTBOX_RETRIED,
        "Outbox deliveries that failed and will be retried, by target"
    );
    describe_counter!(
        OUTBOX_DEAD,
        "Outbox entries dead after their last attempt, by target"
    );
    describe_counter!(
        FOLLOW_UPS,
        "Follow-up jobs of accepted completions, by how they were enqueued"
    );
    describe_counter!(
        FLOW_STEPS,
        "Ends of flow steps recorded at their flows' homes, by end"
    );
    describe_counter!(
        FLOW_RELEASES,
        "Flow steps released in their partitions, by action"
    );
    describe_counter!(
        FLOW_STEPS_ADDED,
        "Steps added to flows by their steps' completions"
    );
    describe_counter!(FLOWS_CREATED, "Flows created");
    describe_histogram!(
        FLOW_RELEASE_LATENCY,
        Unit::Seconds,
        "From a flow step's end to the release of the steps it unblocked"
    );
    describe_gauge!(
        FLOWS_RUNNING,
        "Flows running, sampled by the worker holding the sampler role"
    );
    describe_counter!(
        RECORDS_UNREADABLE,
        "Stored records a pass left in place because this release cannot read them, counted by every pass that meets one"
    );
    describe_counter!(BACKEND_ERRORS, "Backend operations that failed");
    describe_counter!(
        REDIS_ROUND_TRIPS,
        "Client round trips to Redis, by operation"
    );
    describe_gauge!(
        QUEUE_DEPTH,
        "Jobs in a queue by state, sampled by the worker holding the sampler role"
    );
    describe_gauge!(
        QUEUE_OLDEST_READY_AGE,
        Unit::Seconds,
        "Age of the job next in line, since it first became claimable (0: nothing ready)"
    );
    describe_gauge!(QUEUE_PAUSED, "1 for a paused queue, 0 otherwise");
    describe_gauge!(
        GROUP_READY,
        "Ready jobs of the queue's groups with the most, sampled by the worker holding the sampler role"
    );
    describe_counter!(
        JOBS_CANCELLED,
        "Jobs cancelled in a queue, as the coordinator counts them (sampled)"
    );
    describe_counter!(
        QUEUE_ENQUEUED,
        "Jobs enqueued to a queue by any process, as the coordinator counts them (sampled)"
    );
    describe_counter!(
        QUEUE_STALLS,
        "Stalls reaped in a queue by any process, as the coordinator counts them (sampled)"
    );
    describe_counter!(
        HTTP_REFUSED,
        "Requests the HTTP API or the console refused before any endpoint ran, by reason"
    );
    describe_counter!(
        FLOWS_KEPT,
        "Flows created by any process, as the coordinator counts them (sampled)"
    );
    describe_gauge!(
        QUEUE_WORKERS,
        "Live worker processes whose heartbeat lists the queue (sampled)"
    );
    describe_gauge!(
        SCHEDULE_OVERDUE,
        Unit::Seconds,
        "How late a kept schedule's next tick is, 0 while none is due (sampled)"
    );
    describe_gauge!(
        FLOW_OLDEST_AGE,
        Unit::Seconds,
        "Age of the oldest running flow, 0 when none runs (sampled)"
    );
    describe_histogram!(
        CLAIM_TO_START,
        Unit::Seconds,
        "From sending the claim that granted a lease to its handler starting"
    );
    describe_histogram!(
        SETTLE_WAIT,
        Unit::Seconds,
        "From a handler returning to the coordinator answering its settlement"
    );
    describe_counter!(
        SCHEDULE_TICKS,
        "Schedule ticks fired, by schedule and outcome (enqueued, or existing)"
    );
    describe_histogram!(
        RENEWAL_DURATION,
        Unit::Seconds,
        "One lease renewal round trip"
    );
    // Series that exist from the start read as 0 instead of "no data" in Grafana and let
    // `rate()` see the first increment.
    for reason in ["expired", "unconfirmed"] {
        metrics::counter!(LEASES_LOST, "reason" => reason).increment(0);
    }
    for outcome in ["renewed", "lost", "error"] {
        metrics::counter!(RENEWALS, "outcome" => outcome).increment(0);
    }
}

/// Sums every sample of counter `name` in Prometheus text `text` whose labels include all of
/// `labels` — for summaries and tests that read back what a process exported.
pub fn sample_sum(text: &str, name: &str, labels: &[(&str, &str)]) -> u64 {
    text.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter(|l| {
            labels
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

#[cfg(test)]
mod tests {
    use super::sample_sum;

    #[test]
    fn sums_matching_samples_only() {
        let text = "# HELP x\npalisade_a_total{sink=\"l\",outcome=\"applied\"} 3\n\
                    palisade_a_total{sink=\"l\",outcome=\"duplicate\"} 2\npalisade_ab_total 9\n";
        assert_eq!(sample_sum(text, "palisade_a_total", &[]), 5);
        assert_eq!(
            sample_sum(text, "palisade_a_total", &[("outcome", "applied")]),
            3
        );
        assert_eq!(sample_sum(text, "palisade_ab_total", &[]), 9);
    }
}
