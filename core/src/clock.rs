//! The time the memory stores, the worker's deadline checks and the harness read: the real
//! clocks, plus a skip that only `palisade::testing`'s harness moves.
//!
//! The skip is kept per thread, as tokio keeps a paused clock per runtime: a harness runs its
//! jobs, its memory stores and its coordinator on the thread of the test that made it, so two
//! tests running side by side each move only their own time, and a process that never skips
//! reads the real clocks (the skip is zero) at the cost of one thread-local read.
//!
//! Only time kept *in* the process moves: a Redis or Postgres store reads its server's clock,
//! and tokio timers (a handler's own `sleep`, its timeout) keep real time.

use std::cell::Cell;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

thread_local! {
    static SKIPPED: Cell<Duration> = const { Cell::new(Duration::ZERO) };
}

/// The monotonic now: tokio's (the real one, or a paused runtime's) plus this thread's skip.
pub fn now() -> Instant {
    let now = Instant::now();
    now.checked_add(skipped()).unwrap_or(now)
}

/// Milliseconds since the Unix epoch, plus this thread's skip (0 for a clock before 1970).
pub fn unix_ms() -> u64 {
    SystemTime::now()
        .checked_add(skipped())
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_millis() as u64)
}

/// How far this thread's time has been moved on.
pub fn skipped() -> Duration {
    SKIPPED.with(Cell::get)
}

/// Moves this thread's time on by `by` (never back). For the testing harness: every later
/// [`now`] and [`unix_ms`] on this thread reads that much later.
#[doc(hidden)]
pub fn skip(by: Duration) {
    SKIPPED.with(|s| s.set(s.get().saturating_add(by).min(MAX_SKIP)));
}

/// Sets this thread's skip back to `saved` (a [`skipped`] read earlier): for the harness's
/// zombie, whose worlds each run from the same time and are thrown away after.
#[doc(hidden)]
pub fn restore(saved: Duration) {
    SKIPPED.with(|s| s.set(saved.min(MAX_SKIP)));
}

/// The most a thread's time is moved on: a century, so `now() + skip` never overflows and
/// time never seems to go back to the real clock.
const MAX_SKIP: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_skip_moves_both_clocks_of_its_own_thread_only() {
        let (mono, wall) = (now(), unix_ms());
        skip(Duration::from_secs(3600));
        assert!(now().duration_since(mono) >= Duration::from_secs(3600));
        assert!(unix_ms() - wall >= 3_600_000);
        let other = std::thread::spawn(|| (skipped(), unix_ms()))
            .join()
            .unwrap();
        assert_eq!(other.0, Duration::ZERO, "another thread keeps real time");
        assert!(other.1 < wall + 3_600_000);
    }
}
