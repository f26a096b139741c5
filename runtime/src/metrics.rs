//! Metric names (one place, so dashboards and code agree) and the Prometheus exporter
//! ([`serve`], [`Health`]).
//!
//! Labels are low-cardinality only: queue, kind, sink, reason, outcome — never job ids or
//! scopes, which would make a series per job.

pub use crate::exporter::{serve, serve_prometheus, Health};
/// What [`serve`] and [`serve_prometheus`] return (`render()` gives the `/metrics` text),
/// re-exported so a caller needs no version-matched exporter dependency to name it.
pub use metrics_exporter_prometheus::PrometheusHandle;
pub use palisade_core::metrics::*;

/// What a process will count, so that [`start_at_zero`] can put each of its counters in the
/// output at 0 before anything happens: an alert on `increase(...) > 0` (or a dashboard's
/// `rate`) then sees the first event, which a series born at 1 hides (Prometheus has no sample
/// before it to increase from).
#[derive(Clone, Debug, Default)]
pub struct Expected {
    /// Queues it claims from or enqueues to.
    pub queues: Vec<String>,
    /// Job kinds it runs.
    pub kinds: Vec<String>,
    /// Fenced sinks it writes to.
    pub sinks: Vec<String>,
    /// Outbox targets it relays to.
    pub targets: Vec<String>,
    /// Schedules it may fire.
    pub schedules: Vec<String>,
}

/// Registers every counter `expected` names at 0 (with the label values the code uses), and
/// the label-free counters and histograms of the flow pass and renewals, with the recorder
/// installed by [`serve`]. Counting later adds to the same series.
pub fn start_at_zero(expected: &Expected) {
    use metrics::{counter, histogram};
    let zero = |c: metrics::Counter| c.increment(0);
    for queue in &expected.queues {
        let q = || queue.clone();
        zero(counter!(JOBS_ENQUEUED, "queue" => q()));
        zero(counter!(CLAIMS, "queue" => q()));
        zero(counter!(SETTLEMENTS_REFUSED, "queue" => q()));
        for outcome in ["requeued", "dead"] {
            zero(counter!(STALLS, "queue" => q(), "outcome" => outcome));
        }
        for kind in &expected.kinds {
            // (Refused only: a durable step refused is what an alert watches for.)
            zero(counter!(DURABLE_STEPS, "kind" => kind.clone(), "outcome" => "refused"));
            for outcome in ["completed", "retried", "dead", "fenced", "timed_out"] {
                zero(
                    counter!(JOBS_FINISHED, "queue" => q(), "kind" => kind.clone(), "outcome" => outcome),
                );
            }
        }
    }
    for sink in &expected.sinks {
        for outcome in ["applied", "duplicate", "rejected", "error"] {
            zero(counter!(SINK_WRITES, "sink" => sink.clone(), "outcome" => outcome));
        }
        for reason in ["stale_token", "token_conflict"] {
            zero(counter!(FENCE_REJECTIONS, "sink" => sink.clone(), "reason" => reason));
        }
    }
    for target in &expected.targets {
        zero(counter!(OUTBOX_DELIVERED, "target" => target.clone()));
        zero(counter!(OUTBOX_RETRIED, "target" => target.clone()));
        zero(counter!(OUTBOX_DEAD, "target" => target.clone()));
    }
    for schedule in &expected.schedules {
        for outcome in ["enqueued", "existing"] {
            zero(counter!(SCHEDULE_TICKS, "schedule" => schedule.clone(), "outcome" => outcome));
        }
    }
    for op in [
        "claim",
        "settle",
        "reap",
        "beat",
        "sample",
        "flows",
        "follow_ups",
        "schedule",
    ] {
        zero(counter!(BACKEND_ERRORS, "op" => op));
    }
    for outcome in ["renewed", "lost", "error"] {
        zero(counter!(RENEWALS, "outcome" => outcome));
    }
    for reason in ["expired", "unconfirmed"] {
        zero(counter!(LEASES_LOST, "reason" => reason));
    }
    zero(counter!(FLOWS_CREATED));
    for outcome in ["first", "already"] {
        zero(counter!(WAITPOINTS_COMPLETED, "outcome" => outcome));
    }
    for end in ["completed", "dead"] {
        zero(counter!(FLOW_STEPS, "end" => end));
    }
    for action in ["run", "fail", "skip"] {
        zero(counter!(FLOW_RELEASES, "action" => action));
    }
    for outcome in ["added", "dropped"] {
        zero(counter!(FLOW_STEPS_ADDED, "outcome" => outcome));
    }
    // (A histogram registered without a sample is rendered with empty buckets.)
    drop(histogram!(RENEWAL_DURATION));
    drop(histogram!(FLOW_RELEASE_LATENCY));
}
