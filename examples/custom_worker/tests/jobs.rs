//! The handlers' unit tests, written as a user writes them: only `palisade::testing` (no
//! Redis, no test kit), on the harness's own clock.

use std::time::{Duration, Instant};

use custom_worker::{registry, Order, Remind, Reserve, INVENTORY, MAIL, REMIND_AFTER};
use palisade::testing::{assert_enqueued, refute_enqueued, Harness, Outcome};
use palisade::{IdempotencyKey, JobContext, JobError, Mutation, NewJob, Registry, RetryPolicy};
use serde_json::json;

fn harness() -> Harness {
    Harness::new(registry()).with_sink(INVENTORY)
}

fn order(order: u64, sku: u32, qty: i64) -> NewJob {
    NewJob::new("order.place", &Order { order, sku, qty })
        .unwrap()
        .with_scope(format!("sku:{sku}"))
}

#[test]
fn a_reservation_adds_to_the_skus_reserved_count() {
    let h = harness();
    let reserve = Reserve {
        sku: 7,
        qty: 3,
        hold_ms: 0,
    };
    let done = h
        .perform(NewJob::new("stock.reserve", &reserve).unwrap())
        .unwrap();
    assert_eq!(done.outcome, Outcome::Completed);
    assert_eq!(done.writes.len(), 1);
    assert!(done.writes[0].applied(), "{}", done.writes[0]);
    let inventory = h.sink(INVENTORY).unwrap();
    assert_eq!(inventory.field("stock:7", "reserved").as_deref(), Some("3"));
}

#[test]
fn placing_an_order_reserves_and_asks_for_a_reminder_an_hour_later() {
    let h = harness();
    let done = h.perform(order(41, 7, 2)).unwrap();
    assert!(done.completed());
    assert_eq!(done.follow_ups.len(), 1);
    let reminder = assert_enqueued!(
        h,
        kind = "order.remind",
        queue = MAIL,
        payload = json!({"order": 41})
    );
    refute_enqueued!(h, kind = "order.remind", payload = json!({"order": 42}));
    assert_eq!(reminder.attempt, 0, "not run yet");
    let inventory = h.sink(INVENTORY).unwrap();
    assert_eq!(
        inventory.field("order:41", "status").as_deref(),
        Some("reserved")
    );
    assert_eq!(inventory.field("order:41", "reminded"), None);
}

#[test]
fn the_same_order_placed_twice_reserves_once() {
    let h = harness();
    let (first, second) = (
        h.perform(order(9, 1, 5)).unwrap(),
        h.perform(order(9, 1, 5)).unwrap(),
    );
    assert!(first.writes[0].applied());
    assert!(second.writes[0].duplicate(), "{}", second.writes[0]);
    assert_eq!(
        h.sink(INVENTORY)
            .unwrap()
            .field("stock:1", "reserved")
            .as_deref(),
        Some("5")
    );
}

#[test]
fn an_hour_of_delays_and_retries_drains_in_well_under_a_second() {
    let started = Instant::now();
    let h = harness().with_retry(RetryPolicy {
        base: Duration::from_secs(60),
        max: Duration::from_secs(600),
    });
    for n in 1..=20 {
        h.enqueue(order(n, (n % 3) as u32, 1)).unwrap();
    }
    // A reminder the mail server turns away three times: retried with backoff.
    let flaky = Remind {
        order: 99,
        bounces: 3,
    };
    h.enqueue(
        NewJob::new("order.remind", &flaky)
            .unwrap()
            .with_queue(MAIL),
    )
    .unwrap();
    let orders = h.drain("default").unwrap();
    assert_eq!(orders.completed(), 20);
    let mail = h.drain(MAIL).unwrap();
    assert_eq!(mail.completed(), 21, "20 reminders and the flaky one");
    let retries = mail
        .runs
        .iter()
        .filter(|r| matches!(r.outcome, Outcome::Retry { .. }));
    assert_eq!(retries.count(), 3);
    // (Skipped to each due time as it stood: the real milliseconds the runs took count too.)
    assert!(
        mail.skipped + Duration::from_secs(1) >= REMIND_AFTER,
        "skipped {:?}",
        mail.skipped
    );
    let inventory = h.sink(INVENTORY).unwrap();
    let reserved: i64 = (0..3)
        .map(|sku| {
            inventory
                .field(&format!("stock:{sku}"), "reserved")
                .unwrap()
                .parse::<i64>()
                .unwrap()
        })
        .sum();
    assert_eq!(reserved, 20);
    for n in (1..=20).chain([99]) {
        assert_eq!(
            inventory
                .field(&format!("order:{n}"), "reminded")
                .as_deref(),
            Some("yes"),
            "order {n}"
        );
    }
    assert!(h.enqueued().is_empty());
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "took {:?}",
        started.elapsed()
    );
}

#[test]
fn a_bad_payload_or_an_unknown_kind_is_dead_with_its_reason() {
    let h = harness();
    let bad = h
        .perform(NewJob::raw("order.place", r#"{"order": "x"}"#))
        .unwrap();
    assert!(
        matches!(&bad.outcome, Outcome::Dead { reason } if reason.contains("order")),
        "{:?}",
        bad.outcome
    );
    let unknown = h.perform(NewJob::raw("order.cancel", "{}")).unwrap();
    assert!(
        matches!(&unknown.outcome, Outcome::Dead { reason } if reason.contains("unknown job kind")),
        "{:?}",
        unknown.outcome
    );
}

#[test]
fn a_paused_reservation_or_order_never_applies_twice() {
    let h = harness();
    for job in [
        NewJob::new(
            "stock.reserve",
            &Reserve {
                sku: 3,
                qty: 2,
                hold_ms: 0,
            },
        )
        .unwrap(),
        order(5, 3, 2),
    ] {
        let zombie = h.zombie(job).unwrap();
        zombie.assert_fenced();
        assert_eq!(
            zombie.scenarios.len(),
            2,
            "paused before its write, and before settling"
        );
        assert!(
            zombie.refused() >= 1,
            "the woken run's late write was refused"
        );
        for s in &zombie.scenarios {
            let reserved = s.sink(INVENTORY).unwrap().field("stock:3", "reserved");
            assert_eq!(
                reserved.as_deref(),
                Some("2"),
                "paused before write {}",
                s.paused_before
            );
        }
    }
}

/// A handler as a user might get it wrong: a fresh idempotency key on every run.
async fn careless(ctx: JobContext, r: Reserve) -> Result<(), JobError> {
    let key = IdempotencyKey::new(format!("reserve-{}", uuid::Uuid::new_v4()));
    let add = Mutation::HashIncr {
        key: format!("stock:{}", r.sku),
        field: "reserved".into(),
        by: r.qty,
    };
    ctx.sink(INVENTORY)?
        .write_keyed(key, vec![add])
        .await?
        .accepted()?;
    Ok(())
}

#[test]
fn a_handler_with_a_fresh_key_per_run_fails_the_zombie_naming_the_write() {
    let h = Harness::new(Registry::new().register("stock.reserve", careless)).with_sink(INVENTORY);
    let job = NewJob::new(
        "stock.reserve",
        &Reserve {
            sku: 4,
            qty: 1,
            hold_ms: 0,
        },
    )
    .unwrap();
    let zombie = h.zombie(job).unwrap();
    let failed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| zombie.assert_fenced()));
    let message = *failed
        .expect_err("a fresh key per run must fail")
        .downcast::<String>()
        .unwrap();
    assert!(message.contains("applied twice"), "{message}");
    assert!(message.contains("sink \"inventory\""), "{message}");
    assert!(message.contains("key \"reserve-"), "{message}");
    // Paused after its write: the rival's write was applied again.
    let after = &zombie.scenarios[1];
    assert_eq!(
        after
            .sink(INVENTORY)
            .unwrap()
            .field("stock:4", "reserved")
            .as_deref(),
        Some("2")
    );
}
