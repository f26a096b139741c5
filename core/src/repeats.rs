//! Warnings that repeat while a link is down — a claim, a reaper pass, a scheduler pass, a
//! renewal failing every few hundred milliseconds — are logged at most once per
//! `Repeats::EVERY` per call site, each saying how many were held back since the last one.
//! An operator still sees the first failure at once and the error's text; the log is not
//! flooded (a worker with Redis down logged about 7 lines a second before).

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One call site's record, per key (a partition, a worker; 0 where the site has one): when it
/// last logged, and how many it held back since.
#[doc(hidden)]
pub struct Repeats {
    state: Mutex<Vec<(u64, Instant, u64)>>,
}

impl Repeats {
    /// At most one line per call site in this time.
    pub(crate) const EVERY: Duration = Duration::from_secs(10);

    #[doc(hidden)]
    pub const fn new() -> Self {
        Self {
            state: Mutex::new(Vec::new()),
        }
    }

    /// Whether an occurrence of `key` at `now` is logged: `Some(held back since its last
    /// line)`, or `None` (counted, to be reported by its next line). Keys are few (partitions,
    /// workers of one process): a list serves.
    #[doc(hidden)]
    pub fn admit(&self, key: u64, now: Instant) -> Option<u64> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let Some((_, last, held)) = state.iter_mut().find(|(k, _, _)| *k == key) else {
            state.push((key, now, 0));
            return Some(0);
        };
        if now.saturating_duration_since(*last) < Self::EVERY {
            *held += 1;
            return None;
        }
        *last = now;
        Some(std::mem::take(held))
    }
}

/// `tracing::warn!` at most once per [`Repeats::EVERY`] at this call site (and, with
/// `key = <u64>;` first, per key: one partition's failures never hide another's), with a
/// `suppressed` field counting the lines held back since the last one.
#[macro_export]
#[doc(hidden)]
macro_rules! warn_repeated {
    (key = $key:expr; $($arg:tt)+) => {{
        static REPEATS: $crate::repeats::Repeats = $crate::repeats::Repeats::new();
        if let Some(suppressed) = REPEATS.admit($key as u64, std::time::Instant::now()) {
            tracing::warn!(suppressed, $($arg)+);
        }
    }};
    ($($arg:tt)+) => {
        $crate::repeats::warn_repeated!(key = 0u64; $($arg)+)
    };
}
pub use warn_repeated;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_is_logged_then_one_per_period_with_the_count_held_back() {
        let repeats = Repeats::new();
        let t0 = Instant::now();
        assert_eq!(repeats.admit(0, t0), Some(0));
        for ms in [1, 500, 9_999] {
            assert_eq!(repeats.admit(0, t0 + Duration::from_millis(ms)), None);
        }
        assert_eq!(repeats.admit(0, t0 + Repeats::EVERY), Some(3));
        assert_eq!(repeats.admit(0, t0 + Repeats::EVERY * 2), Some(0));
        // A clock that seems to go back (another thread's earlier `now`) holds it back.
        assert_eq!(repeats.admit(0, t0), None);
    }

    #[test]
    fn each_key_has_its_own_period() {
        let repeats = Repeats::new();
        let t0 = Instant::now();
        assert_eq!(repeats.admit(0, t0), Some(0));
        assert_eq!(
            repeats.admit(2, t0),
            Some(0),
            "partition 2 is not hidden by partition 0"
        );
        assert_eq!(repeats.admit(0, t0), None);
        assert_eq!(repeats.admit(2, t0 + Repeats::EVERY), Some(0));
    }
}
