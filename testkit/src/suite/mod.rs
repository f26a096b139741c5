//! One conformance suite for every backend (openraft `Suite` style): each backend's test file
//! calls [`lease_store_suite!`](crate::lease_store_suite) and
//! [`fenced_store_suite!`](crate::fenced_store_suite) with an expression that builds a
//! fresh, isolated store, so no backend can quietly differ from another.
//!
//! Time here is real and short (hundreds of milliseconds), because a remote backend keeps its
//! own clock.

use std::sync::Arc;
use std::time::Duration;

use palisade::*;

mod control;
mod fenced;
mod lease;
mod partitions;
mod queues;

pub use control::*;
pub use fenced::*;
pub use lease::*;
pub use partitions::*;
pub use queues::*;

pub const TTL: Duration = Duration::from_millis(400);

pub fn job(kind: &str) -> NewJob {
    NewJob::raw(kind, "null")
}

async fn claim(store: &Stores, n: usize) -> Vec<Claim> {
    store.claim("default", "suite", n, TTL).await.unwrap()
}

async fn settle(store: &Stores, lease: LeaseId, s: Settlement) -> Result<()> {
    store.settle(vec![(lease, s)]).await.unwrap().pop().unwrap()
}

/// Cases whose property a partitioned coordinator does not keep, by design
/// (`runtime/src/store/partitioned.rs`): priority orders claims within a partition only;
/// tokens of different scopes are ordered within a partition only; the watermark stays
/// unpublished until every partition has one (the cancel case expects one after a revoke);
/// rate limits and caps are split into shares of at least 1 each.
pub const NOT_FOR_PARTITIONS: &[&str] = &[
    "claim_honours_batch_priority_and_delay",
    "the_watermark_stays_below_every_live_lease",
    "cancel_removes_a_queued_job_and_revokes_a_running_one",
    "a_rate_limited_queue_hands_out_no_more_than_its_rate",
    "a_capped_kind_never_runs_more_than_its_cap",
];

/// Runs named cases `parallel` at a time, each as its own task, and fails with the name and
/// message of every case that failed.
pub async fn run_together(
    runs: Vec<(String, futures_util::future::BoxFuture<'static, ()>)>,
    parallel: usize,
) {
    let total = runs.len();
    let gate = Arc::new(tokio::sync::Semaphore::new(parallel));
    let handles: Vec<_> = runs
        .into_iter()
        .map(|(name, run)| {
            let gate = gate.clone();
            let handle = tokio::spawn(async move {
                let _turn = gate.acquire_owned().await.unwrap();
                run.await
            });
            (name, handle)
        })
        .collect();
    let mut failed = Vec::new();
    for (name, handle) in handles {
        if let Err(e) = handle.await {
            failed.push(format!("{name}: {e}"));
        }
    }
    assert!(
        failed.is_empty(),
        "{} of {total} cases failed:\n{}",
        failed.len(),
        failed.join("\n")
    );
}

#[macro_export]
macro_rules! lease_store_suite {
    // `lease_store_cases()`: every case by name, to run them together on one shared backend.
    (list) => {
        $crate::lease_store_suite!(@with list ());
    };
    // One test per case, each on the store `$make` makes.
    ($make:expr) => {
        $crate::lease_store_suite!(@with cases $make);
    };
    (@with $arm:ident $make:tt) => {
        $crate::lease_store_suite!(@$arm $make;
            claim_honours_batch_priority_and_delay,
            one_live_lease_per_scope,
            tokens_grow_per_scope,
            renew_extends_and_reports_lost,
            stale_lease_is_powerless,
            stalls_requeue_then_bury,
            retry_and_dead_settlements,
            fenced_settlement_reseeds_above_the_sink,
            status_views_and_dead_letter_retry,
            enqueue_rejects_bad_jobs_whole,
            names_are_checked_and_default_scopes_are_private,
            a_held_scope_blocks_only_itself,
            release_gives_the_job_back_uncharged,
            epoch_limit_and_dead_purge,
            one_settlement_per_lease_per_batch,
            claims_only_the_kinds_asked_for,
            the_watermark_stays_below_every_live_lease,
            operator_views_oldest_ready_role_and_journal,
            unique_keys_make_enqueue_idempotent,
            a_paused_queue_hands_out_nothing_and_loses_nothing,
            kept_schedules_and_their_marks,
            results_and_progress_are_kept_for_their_time,
            a_rate_limited_queue_hands_out_no_more_than_its_rate,
            cancel_removes_a_queued_job_and_revokes_a_running_one,
            a_capped_kind_never_runs_more_than_its_cap,
        );
    };
    (@list $unused:tt; $($case:ident),* $(,)?) => {
        #[allow(clippy::type_complexity)]
        fn lease_store_cases() -> Vec<(
            &'static str,
            fn(palisade::Stores) -> $crate::futures_util::future::BoxFuture<'static, ()>,
        )> {
            vec![$((stringify!($case), |store| -> $crate::futures_util::future::BoxFuture<'static, ()> {
                Box::pin($crate::suite::$case(store))
            })),*]
        }
    };
    (@cases $make:expr; $($case:ident),* $(,)?) => {
        mod lease_store {
            use super::*;
            $(
                #[tokio::test]
                async fn $case() {
                    let (store, _keep): (palisade::Stores, _) = $make.await;
                    $crate::suite::$case(store).await;
                }
            )*
        }
    };
}
