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
mod groups;
mod lease;
mod pacing;
mod partitions;
mod queues;

pub use control::*;
pub use fenced::*;
pub use groups::*;
pub use lease::*;
pub use pacing::*;
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
/// (`core/src/store/partitioned/mod.rs`): priority orders claims within a partition only;
/// tokens of different scopes are ordered within a partition only; the watermark stays
/// unpublished until every partition has one (the cancel case expects one after a revoke);
/// rate limits and caps are split into shares of at least 1 each; a debounce key, like a
/// unique key, is one key per partition (a named scope decides where its job goes); a group
/// and a named scope of one job must share a partition.
pub const NOT_FOR_PARTITIONS: &[&str] = &[
    "claim_honours_batch_priority_and_delay",
    "the_watermark_stays_below_every_live_lease",
    "cancel_removes_a_queued_job_and_revokes_a_running_one",
    "a_rate_limited_queue_hands_out_no_more_than_its_rate",
    "a_capped_kind_never_runs_more_than_its_cap",
    "a_debounce_key_of_another_scope_refuses_the_enqueue",
    // A grouped job's named scope must hash to its group's partition (refused otherwise,
    // `a_group_lives_in_one_partition`); this case mixes groups on one scope.
    "groups_keep_scopes_priorities_cancels_and_dead_letters",
    "a_kind_at_its_cap_never_holds_back_another_kinds_groups",
    // A claim rotates over the groups of the partition it takes from (each group lives in
    // one), so a big group's share is its partition's, not the whole layout's.
    "claims_rotate_over_groups_whatever_their_backlog",
    // Listed one partition after another (priority orders claims within a partition only).
    "ready_jobs_are_listed_in_claim_order",
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

/// Every [`LeaseStore`]-and-friends case, on a backend: `lease_store_suite!(make)` makes one
/// test per case, each on the stores `make` (an expression that evaluates to a future of
/// `(Stores, guard)`) builds; `lease_store_suite!(list)` defines `lease_store_cases()`, every
/// case by name, to run them together on one shared backend. The cases are listed in their
/// own files (`lease_cases!`, `queue_cases!`, `control_cases!`, `pacing_cases!`,
/// `group_cases!`), so a new
/// case touches one.
#[macro_export]
macro_rules! lease_store_suite {
    (list) => {
        #[allow(clippy::type_complexity)]
        fn lease_store_cases() -> Vec<(
            &'static str,
            fn(palisade::Stores) -> $crate::futures_util::future::BoxFuture<'static, ()>,
        )> {
            let mut cases = Vec::new();
            $crate::lease_cases!(push cases);
            $crate::queue_cases!(push cases);
            $crate::control_cases!(push cases);
            $crate::pacing_cases!(push cases);
            $crate::group_cases!(push cases);
            cases
        }
    };
    ($make:expr) => {
        mod lease_store {
            use super::*;
            $crate::lease_cases!(test $make);
            $crate::queue_cases!(test $make);
            $crate::control_cases!(test $make);
            $crate::pacing_cases!(test $make);
            $crate::group_cases!(test $make);
        }
    };
}

/// Cases of the lease suite, as entries of a list (`push`) or as tests (`test`): what the
/// per-file case lists expand to.
#[doc(hidden)]
#[macro_export]
macro_rules! lease_store_case {
    (push $cases:ident; $($case:ident),* $(,)?) => {
        $(
            $cases.push((
                stringify!($case),
                (|store: palisade::Stores| -> $crate::futures_util::future::BoxFuture<'static, ()> {
                    Box::pin($crate::suite::$case(store))
                }) as fn(palisade::Stores) -> $crate::futures_util::future::BoxFuture<'static, ()>,
            ));
        )*
    };
    (test $make:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test]
            async fn $case() {
                let (store, _keep): (palisade::Stores, _) = $make.await;
                $crate::suite::$case(store).await;
            }
        )*
    };
}
