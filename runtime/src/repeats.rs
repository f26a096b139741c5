//! Warnings that repeat while a link is down — a claim, a reaper pass, a scheduler pass, a
//! renewal failing every few hundred milliseconds — are logged at most once per
//! [`Repeats::EVERY`] per call site, each saying how many were held back since the last one.
//! An operator still sees the first failure at once and the error's text; the log is not
//! flooded (a worker with Redis down logged about 7 lines a second before).

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One call site's record: when it last logged, and how many it held back since.
pub(crate) struct Repeats {
    state: Mutex<(Option<Instant>, u64)>,
}

impl Repeats {
    /// At most one line per call site in this time.
    pub(crate) const EVERY: Duration = Duration::from_secs(10);

    pub(crate) const fn new() -> Self {
        Self {
            state: Mutex::new((None, 0)),
        }
    }

    /// Whether an occurrence at `now` is logged: `Some(held back since the last line)`, or
    /// `None` (counted, to be reported by the next line).
    pub(crate) fn admit(&self, now: Instant) -> Option<u64> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let (last, held) = &mut *state;
        match last {
            Some(at) if now.saturating_duration_since(*at) < Self::EVERY => {
                *held += 1;
                None
            }
            _ => {
                *last = Some(now);
                Some(std::mem::take(held))
            }
        }
    }
}

/// `tracing::warn!` at most once per [`Repeats::EVERY`] at this call site, with a
/// `suppressed` field counting the lines held back since the last one.
macro_rules! warn_repeated {
    ($($arg:tt)+) => {{
        static REPEATS: $crate::repeats::Repeats = $crate::repeats::Repeats::new();
        if let Some(suppressed) = REPEATS.admit(std::time::Instant::now()) {
            tracing::warn!(suppressed, $($arg)+);
        }
    }};
}
pub(crate) use warn_repeated;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_is_logged_then_one_per_period_with_the_count_held_back() {
        let repeats = Repeats::new();
        let t0 = Instant::now();
        assert_eq!(repeats.admit(t0), Some(0));
        for ms in [1, 500, 9_999] {
            assert_eq!(repeats.admit(t0 + Duration::from_millis(ms)), None);
        }
        assert_eq!(repeats.admit(t0 + Repeats::EVERY), Some(3));
        assert_eq!(repeats.admit(t0 + Repeats::EVERY * 2), Some(0));
        // A clock that seems to go back (another thread's earlier `now`) holds it back.
        assert_eq!(repeats.admit(t0), None);
    }
}
