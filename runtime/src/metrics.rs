//! Metric names (one place, so dashboards and code agree) and the Prometheus exporter.
//!
//! Labels are low-cardinality only: queue, kind, sink, reason, outcome — never job ids or
//! scopes, which would make a series per job.

use std::net::SocketAddr;

use metrics::{describe_counter, describe_histogram, Unit};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

use crate::error::{Error, Result};

/// Jobs accepted by enqueue. Labels: queue.
pub const JOBS_ENQUEUED: &str = "palisade_jobs_enqueued_total";
/// Leases granted. Labels: queue.
pub const CLAIMS: &str = "palisade_claims_total";
/// Jobs a worker finished running. Labels: queue, kind, outcome
/// (completed|retried|dead|fenced).
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

/// Client round trips to Redis on the hot paths. Labels: op.
pub const REDIS_ROUND_TRIPS: &str = "palisade_redis_round_trips_total";

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
];

/// Registers help text for every Palisade metric with the installed recorder.
pub fn describe() {
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
    describe_counter!(BACKEND_ERRORS, "Backend operations that failed");
    describe_counter!(
        REDIS_ROUND_TRIPS,
        "Client round trips to Redis, by operation"
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

/// Installs the global Prometheus recorder and serves `/metrics` on `addr` from a thread of
/// its own, so a busy or paused worker arbiter cannot starve scrapes. Returns a handle that
/// renders the same text in-process.
///
/// Call it once per process. Fails if `addr` cannot be bound or a recorder is already set.
pub fn serve_prometheus(addr: SocketAddr) -> Result<PrometheusHandle> {
    let fail =
        |e: &dyn std::fmt::Display| Error::Config(format!("metrics exporter on {addr}: {e}"));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| fail(&e))?;
    let (recorder, exporter) = {
        let _guard = runtime.enter();
        PrometheusBuilder::new()
            .with_http_listener(addr)
            .build()
            .map_err(|e| fail(&e))?
    };
    let handle = recorder.handle();
    metrics::set_global_recorder(recorder).map_err(|e| fail(&e))?;
    std::thread::Builder::new()
        .name("palisade-metrics".into())
        .spawn(move || {
            if let Err(e) = runtime.block_on(exporter) {
                tracing::error!(error = ?e, "metrics exporter stopped");
            }
        })
        .map_err(|e| fail(&e))?;
    describe();
    Ok(handle)
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
