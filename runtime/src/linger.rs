//! When a batch that fills over time goes out: the rule behind the worker's settlement and
//! claim batches, kept apart from the actor so it can be tested without one.
//!
//! Handlers that await I/O finish one at a time, spread out. Sending each settlement (and
//! asking for each freed slot's replacement) as soon as it appears costs a round trip per job;
//! waiting a little lets several share one. The wait is bounded twice: a batch goes out at once
//! when it is full or when nothing more can join it, and otherwise once its first item has
//! waited `linger`. So a job is never held back longer than `linger`, and a worker whose jobs
//! all finish together (no-op or CPU-bound handlers) never waits at all.

use std::time::Duration;

use tokio::time::Instant;

/// Whether a batch goes out now or later.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Due {
    /// Send it now.
    Now,
    /// Look again after this long (the first item's linger runs out then).
    In(Duration),
}

/// A batch that fills over time: when its first item arrived.
#[derive(Debug, Default)]
pub(crate) struct Linger {
    since: Option<Instant>,
    /// A wake-up is already scheduled (at most one at a time).
    armed: bool,
}

impl Linger {
    /// An item joined the batch (the first one starts the clock).
    pub(crate) fn joined(&mut self) {
        self.since.get_or_insert_with(Instant::now);
    }

    /// The batch went out (or emptied): the next item starts a new clock.
    pub(crate) fn sent(&mut self) {
        self.since = None;
    }

    /// Whether a batch of `items` goes out: at once when it holds `full` items, when
    /// `more_coming` is false (nothing else can join it) or when its first item has waited
    /// `linger`; otherwise the wait left.
    pub(crate) fn due(
        &self,
        items: usize,
        full: usize,
        more_coming: bool,
        linger: Duration,
    ) -> Due {
        decide(
            items,
            full,
            more_coming,
            self.since.map(|s| s.elapsed()),
            linger,
        )
    }

    /// Arms the one wake-up; false if one is already scheduled.
    pub(crate) fn arm(&mut self) -> bool {
        !std::mem::replace(&mut self.armed, true)
    }

    /// The scheduled wake-up fired.
    pub(crate) fn fired(&mut self) {
        self.armed = false;
    }
}

/// tokio's timer resolution: a wake-up asked for in `d` comes up to this much later.
const TICK: Duration = Duration::from_millis(1);

/// The rule itself, on plain values: `waited` is how long the first item has waited (`None`:
/// it has only now arrived). The wake-up is asked for one tick early and a batch within a
/// tick of its linger goes at once, so no item waits longer than `linger` (and a linger of a
/// tick or less is no linger).
fn decide(
    items: usize,
    full: usize,
    more_coming: bool,
    waited: Option<Duration>,
    linger: Duration,
) -> Due {
    let waited = waited.unwrap_or_default();
    if items >= full.max(1) || !more_coming || waited + TICK >= linger {
        Due::Now
    } else {
        Due::In(linger - waited - TICK)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_full_batch_or_one_nothing_can_join_goes_at_once() {
        assert_eq!(decide(10, 10, true, None, 2 * MS), Due::Now);
        assert_eq!(decide(11, 10, true, Some(MS / 2), 2 * MS), Due::Now);
        assert_eq!(decide(1, 10, false, None, 2 * MS), Due::Now);
    }

    #[test]
    fn otherwise_the_first_item_waits_at_most_the_linger() {
        // Woken a tick early (the timer may be a tick late), and sent within a tick of it.
        assert_eq!(decide(3, 10, true, None, 2 * MS), Due::In(MS));
        assert_eq!(
            decide(3, 10, true, Some(MS / 2), 3 * MS),
            Due::In(3 * MS / 2)
        );
        assert_eq!(decide(3, 10, true, Some(MS), 2 * MS), Due::Now);
        assert_eq!(decide(3, 10, true, Some(2 * MS), 2 * MS), Due::Now);
        assert_eq!(decide(3, 10, true, Some(5 * MS), 2 * MS), Due::Now);
    }

    #[test]
    fn no_linger_is_the_old_rule_send_whatever_there_is() {
        assert_eq!(decide(1, 10, true, None, Duration::ZERO), Due::Now);
        // Within one timer tick no wait can be kept to: none is started.
        assert_eq!(decide(1, 10, true, None, MS), Due::Now);
        // A batch size of 0 is treated as 1: one item is always a full batch.
        assert_eq!(decide(1, 0, true, None, 2 * MS), Due::Now);
    }

    #[tokio::test(start_paused = true)]
    async fn the_clock_starts_with_the_first_item_and_one_wake_up_is_armed_at_a_time() {
        let mut batch = Linger::default();
        batch.joined();
        tokio::time::advance(MS).await;
        batch.joined(); // a second item does not restart the clock
        assert_eq!(batch.due(2, 10, true, 3 * MS), Due::In(MS));
        assert!(batch.arm());
        assert!(!batch.arm());
        batch.fired();
        assert!(batch.arm());
        tokio::time::advance(MS).await;
        assert_eq!(batch.due(2, 10, true, 3 * MS), Due::Now);
        batch.sent();
        batch.joined();
        assert_eq!(batch.due(1, 10, true, 3 * MS), Due::In(2 * MS));
    }
}
