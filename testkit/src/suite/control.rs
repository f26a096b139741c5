//! Cases for the clock, roles and schedules ([`ControlStore`]) and the records
//! ([`RecordStore`]).

use super::*;

/// Every one of the clock, role, schedule and record cases in this file: add a new one here too.
#[doc(hidden)]
#[macro_export]
macro_rules! control_cases {
    ($($how:tt)*) => {
        $crate::lease_store_case!($($how)*;
            operator_views_oldest_ready_role_and_journal,
            kept_schedules_and_their_marks,
            results_and_progress_are_kept_for_their_time,
            worker_beats_list_the_live_workers,
            history_keeps_the_newest_samples,
            waitpoints_are_completed_once,
        );
    };
}

/// The sampler's and the operator page's views: how long the next job has waited, one holder
/// per role, and the journal of fence rejections (newest first, bounded).
pub async fn operator_views_oldest_ready_role_and_journal(store: Stores) {
    assert_eq!(store.oldest_ready("default").await.unwrap(), None);
    store.enqueue(vec![job("a")]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await;
    let age = store.oldest_ready("default").await.unwrap().unwrap();
    assert!(
        age >= Duration::from_millis(100) && age < Duration::from_secs(5),
        "{age:?}"
    );
    // Released, it is next in line again and still counts from when it first became ready.
    let lease = claim(&store, 1).await.pop().unwrap().lease.id;
    assert_eq!(store.oldest_ready("default").await.unwrap(), None);
    settle(&store, lease, Settlement::Release).await.unwrap();
    let again = store.oldest_ready("default").await.unwrap().unwrap();
    assert!(again >= age, "{again:?} < {age:?}");
    // A delayed job counts from when it falls due.
    store
        .enqueue(vec![job("b")
            .with_queue("later")
            .with_delay(Duration::from_millis(100))])
        .await
        .unwrap();
    assert_eq!(store.oldest_ready("later").await.unwrap(), None);
    tokio::time::sleep(Duration::from_millis(250)).await;
    let due = store.oldest_ready("later").await.unwrap().unwrap();
    assert!(
        due >= Duration::from_millis(100) && due < Duration::from_millis(1000),
        "{due:?}"
    );

    for bad in [Duration::ZERO, Duration::MAX, store::MAX_ROLE_TTL * 2] {
        assert!(
            matches!(
                store.hold_role("sampler", "a", bad).await,
                Err(Error::Config(_))
            ),
            "{bad:?}"
        );
    }
    let ttl = Duration::from_millis(200);
    assert!(store.hold_role("sampler", "a", ttl).await.unwrap());
    assert!(!store.hold_role("sampler", "b", ttl).await.unwrap());
    assert!(store.hold_role("sampler", "a", ttl).await.unwrap());
    assert!(store.hold_role("other", "b", ttl).await.unwrap());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(store.hold_role("sampler", "b", ttl).await.unwrap());
    assert!(!store.hold_role("sampler", "a", ttl).await.unwrap());

    let note = |i: u64| store::RejectionNote {
        at_ms: i,
        sink: "ledger".into(),
        scope: format!("s{i}"),
        token: i,
        reason: "stale_token".into(),
        detail: format!("stale token {i}"),
        // Kept as written, present or not.
        trace_id: (i % 2 == 1).then(|| format!("{i:032x}")),
        job: i
            .is_multiple_of(2)
            .then(|| JobId::from(uuid::Uuid::from_u128(u128::from(i)))),
        lease: i
            .is_multiple_of(3)
            .then(|| LeaseId::from(uuid::Uuid::from_u128(u128::from(i) << 64))),
        worker: i.is_multiple_of(2).then(|| format!("w{i}")),
    };
    assert!(store.rejections(10).await.unwrap().is_empty());
    store.note_rejections(vec![note(1), note(2)]).await.unwrap();
    store.note_rejections(vec![note(3)]).await.unwrap();
    assert_eq!(store.rejections(2).await.unwrap(), vec![note(3), note(2)]);
    let many: Vec<_> = (10..10 + store::REJECTION_JOURNAL as u64 + 5)
        .map(note)
        .collect();
    store.note_rejections(many).await.unwrap();
    let kept = store.rejections(usize::MAX).await.unwrap();
    assert_eq!(kept.len(), store::REJECTION_JOURNAL);
    assert_eq!(kept[0].token, 10 + store::REJECTION_JOURNAL as u64 + 4);
}

/// Schedules kept in the coordinator, and each schedule's mark, which never goes back.
pub async fn kept_schedules_and_their_marks(store: Stores) {
    let now = store.now_ms().await.unwrap();
    let wall = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    assert!((now - wall).abs() < 5_000, "{now} vs {wall}");

    let spec = |name: &str, pattern: &str| ScheduleSpec {
        name: name.to_owned(),
        ..Schedule::new("x", "* * * * *", job("report"))
            .unwrap()
            .spec()
            .clone()
            .with_pattern(pattern)
    };
    assert!(store.schedules().await.unwrap().is_empty());
    store.put_schedule(spec("b", "0 7 * * 1-5")).await.unwrap();
    store
        .put_schedule(spec("a", "*/5 * * * * *"))
        .await
        .unwrap();
    store
        .put_schedule(spec("a", "*/10 * * * * *"))
        .await
        .unwrap(); // replaces
    let kept = store.schedules().await.unwrap();
    let names: Vec<(&str, &str)> = kept
        .iter()
        .map(|s| (s.name.as_str(), s.pattern.as_str()))
        .collect();
    assert_eq!(names, vec![("a", "*/10 * * * * *"), ("b", "0 7 * * 1-5")]);
    for bad in [spec("c", "not cron"), spec("", "* * * * *")] {
        assert!(matches!(
            store.put_schedule(bad).await,
            Err(Error::InvalidJob(_))
        ));
    }
    store.advance_schedule("a", 7).await.unwrap();
    assert!(store.remove_schedule("a").await.unwrap());
    assert!(!store.remove_schedule("a").await.unwrap());
    assert_eq!(
        store.schedule_mark("a").await.unwrap(),
        None,
        "added again, it starts afresh"
    );
    assert_eq!(store.schedules().await.unwrap().len(), 1);

    assert_eq!(store.schedule_mark("b").await.unwrap(), None);
    store.advance_schedule("b", 1_000).await.unwrap();
    store.advance_schedule("b", 500).await.unwrap(); // a woken scheduler cannot send it back
    assert_eq!(store.schedule_mark("b").await.unwrap(), Some(1_000));
    store.advance_schedule("b", 2_000).await.unwrap();
    assert_eq!(store.schedule_mark("b").await.unwrap(), Some(2_000));
}

/// Results and progress records: kept, replaced, and gone after their time.
pub async fn results_and_progress_are_kept_for_their_time(store: Stores) {
    let (a, b) = (JobId::new(), JobId::new());
    assert_eq!(store.result(a).await.unwrap(), None);
    store
        .put_result(a, r#"{"ok":1}"#.into(), Duration::from_millis(200))
        .await
        .unwrap();
    store
        .put_result(b, r#"{"ok":2}"#.into(), Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(
        store.result(a).await.unwrap().as_deref(),
        Some(r#"{"ok":1}"#)
    );
    store.put_progress(a, "1".into()).await.unwrap();
    store.put_progress(a, "2".into()).await.unwrap();
    assert_eq!(store.progress(a).await.unwrap().as_deref(), Some("2"));
    assert_eq!(store.progress(b).await.unwrap(), None);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(store.result(a).await.unwrap(), None, "kept past its time");
    assert_eq!(
        store.result(b).await.unwrap().as_deref(),
        Some(r#"{"ok":2}"#)
    );
}

/// Worker heartbeats: each worker listed once with what it last said, stamped by the
/// coordinator's clock; a beat that lapses drops its worker.
pub async fn worker_beats_list_the_live_workers(store: Stores) {
    assert!(store.workers().await.unwrap().is_empty());
    let beat = |worker: &str, running: usize| WorkerBeat {
        worker: worker.into(),
        host: "host-1".into(),
        pid: 42,
        version: "0.1.0".into(),
        queues: vec!["default".into(), "mail".into()],
        concurrency: 8,
        running,
        started_ms: 1,
        seen_ms: 0,
        formats: None,
        retry: None,
    };
    let long = Duration::from_secs(60);
    store.beat(beat("w-b", 1), long).await.unwrap();
    store.beat(beat("w-a", 2), long).await.unwrap();
    store.beat(beat("w-b", 3), long).await.unwrap();
    store
        .beat(beat("w-short", 0), Duration::from_millis(150))
        .await
        .unwrap();
    let now = store.now_ms().await.unwrap() as u64;
    let workers = store.workers().await.unwrap();
    let names: Vec<&str> = workers.iter().map(|w| w.worker.as_str()).collect();
    assert_eq!(names, ["w-a", "w-b", "w-short"]);
    assert_eq!(workers[1].running, 3, "the latest beat");
    assert_eq!(workers[1].queues, ["default", "mail"]);
    assert!(workers
        .iter()
        .all(|w| w.seen_ms <= now && w.seen_ms + 10_000 > now));
    tokio::time::sleep(Duration::from_millis(400)).await;
    let names: Vec<String> = store
        .workers()
        .await
        .unwrap()
        .into_iter()
        .map(|w| w.worker)
        .collect();
    assert_eq!(names, ["w-a", "w-b"], "the short beat lapsed");
    assert!(
        store.beat(beat("", 0), long).await.is_err(),
        "a name is checked"
    );
}

/// The console's history: samples come back newest first, as many as asked, at most
/// `HISTORY_SAMPLES` kept.
pub async fn history_keeps_the_newest_samples(store: Stores) {
    assert!(store.history(10).await.unwrap().is_empty());
    let sample = |at_ms: u64| HistorySample {
        at_ms,
        counts: QueueCounts {
            completed: at_ms / 10,
            ..QueueCounts::default()
        },
        oldest_ready_ms: 7,
    };
    for at in [1_000, 2_000, 3_000] {
        store.note_history(sample(at)).await.unwrap();
    }
    let newest: Vec<u64> = store
        .history(2)
        .await
        .unwrap()
        .iter()
        .map(|s| s.at_ms)
        .collect();
    assert_eq!(newest, [3_000, 2_000]);
    assert_eq!(store.history(10).await.unwrap()[2], sample(1_000));
    assert!(store.history(0).await.unwrap().is_empty());
    for at in 0..HISTORY_SAMPLES as u64 {
        store.note_history(sample(10_000 + at)).await.unwrap();
    }
    let all = store.history(usize::MAX).await.unwrap();
    assert_eq!(all.len(), HISTORY_SAMPLES, "bounded");
    assert_eq!(all[0].at_ms, 10_000 + HISTORY_SAMPLES as u64 - 1);
}

/// A waitpoint keeps its first value: a second completion changes nothing and is told the
/// kept one; a run that asks first is noted as the waiter its completion names; an event that
/// arrives before the wait is kept for it. Bad ids and values are refused, changing nothing.
pub async fn waitpoints_are_completed_once(store: Stores) {
    use palisade::store::Completion;
    let id = format!("approval:{}", uuid::Uuid::new_v4());
    let run = palisade::JobId::new();
    assert_eq!(store.waitpoint(&id).await.unwrap(), None);
    // Asked first: nothing yet, and the run is the waiter.
    assert_eq!(store.await_waitpoint(&id, run).await.unwrap(), None);
    let kept = store.waitpoint(&id).await.unwrap().unwrap();
    assert_eq!((kept.value, kept.waiter), (None, Some(run)));
    assert_eq!(
        store
            .complete_waitpoint(&id, r#"{"approved":true}"#.into())
            .await
            .unwrap(),
        Completion::First { waiter: Some(run) }
    );
    // Twice, with another value: the first stays.
    assert_eq!(
        store
            .complete_waitpoint(&id, r#"{"approved":false}"#.into())
            .await
            .unwrap(),
        Completion::Already {
            value: r#"{"approved":true}"#.into()
        }
    );
    assert_eq!(
        store.await_waitpoint(&id, run).await.unwrap().as_deref(),
        Some(r#"{"approved":true}"#)
    );
    // Completed before anyone waits: kept, and no waiter to wake.
    let early = format!("webhook:{}", uuid::Uuid::new_v4());
    assert_eq!(
        store.complete_waitpoint(&early, "42".into()).await.unwrap(),
        Completion::First { waiter: None }
    );
    assert_eq!(
        store
            .await_waitpoint(&early, palisade::JobId::new())
            .await
            .unwrap()
            .as_deref(),
        Some("42")
    );
    // Refused before anything is kept.
    assert!(store.complete_waitpoint("", "1".into()).await.is_err());
    let bad = format!("bad:{}", uuid::Uuid::new_v4());
    assert!(store
        .complete_waitpoint(&bad, "not json".into())
        .await
        .is_err());
    assert_eq!(store.waitpoint(&bad).await.unwrap(), None);
}
