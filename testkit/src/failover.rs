//! What must hold after the coordinator's Redis master failed over (a cluster's or a Sentinel
//! group's): one check, run by both failover tests.

use std::time::Duration;

use palisade::{
    Admission, Claim, Error, FencedStore, FencedWrite, LeaseStore, Rejection, Settlement,
};

/// `first` was claimed (and wrote through `sink` with `write(first, "a1")`) before the
/// failover, and a job of kind `later` was enqueued with `WAIT`. Now: the job `first` held
/// is claimed again (reaping as its lease expires) in a higher epoch; the new holder's write
/// applies; the old holder's write is refused as stale, its renewal and settlement refused;
/// the `later` job survived.
pub async fn the_old_holder_is_refused(
    store: &impl LeaseStore,
    sink: &impl FencedStore,
    first: &Claim,
    write: impl Fn(&Claim, &str) -> FencedWrite,
    ttl: Duration,
) {
    let kinds = [first.job.kind.clone()];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let second = loop {
        let _ = store.reap(100).await;
        if let Ok(mut claims) = store.claim_kinds("default", &kinds, "B", 1, ttl).await {
            if let Some(claim) = claims.pop() {
                break claim;
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the job never came back: the store did not follow the failover"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(second.job.id, first.job.id);
    assert!(
        second.lease.token.epoch() > first.lease.token.epoch(),
        "{:?} after {:?}",
        second.lease.token,
        first.lease.token
    );
    // The sink's connection may have gone down with the old master: its first write after
    // the failover may fail as `Unavailable` (retryable: a handler's attempt would be
    // retried); the next one finds the new master.
    let applied = match sink.write(write(&second, "b1")).await {
        Err(Error::Unavailable(_)) => sink.write(write(&second, "b1")).await,
        other => other,
    };
    assert_eq!(applied.unwrap(), Admission::Applied);
    match sink.write(write(first, "a2")).await.unwrap() {
        Admission::Rejected(Rejection::StaleToken { presented, highest }) => {
            assert_eq!(presented, first.lease.token);
            assert!(highest >= second.lease.token);
        }
        other => panic!("the old holder's write was not refused: {other:?}"),
    }
    assert_eq!(
        store.renew(&[first.lease.id], ttl).await.unwrap(),
        vec![first.lease.id],
        "the old holder's lease was renewed"
    );
    assert!(matches!(
        store
            .settle(vec![(first.lease.id, Settlement::completed())])
            .await
            .unwrap()[..],
        [Err(Error::LeaseNotCurrent(_))]
    ));
    assert!(store
        .settle(vec![(second.lease.id, Settlement::completed())])
        .await
        .unwrap()[0]
        .is_ok());
    let later = store
        .claim_kinds("default", &["later".to_string()], "B", 1, ttl)
        .await
        .unwrap();
    assert_eq!(
        later.len(),
        1,
        "a job enqueued with WAIT was lost in the failover"
    );
}
