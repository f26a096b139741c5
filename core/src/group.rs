//! Groups ([`NewJob::with_group`](crate::job::NewJob::with_group)): the pure rules a claim applies to
//! them, in memory here and word for word in `claim.lua` (a differential test runs both).
//!
//! A claim of n jobs looks at the n groups of each kind it asks for that were served least
//! recently (the rotation, ordered by *turn*: the claim that last served the group, or the
//! turn after the last claim when it joined — claims count in twos, so a group that joined
//! goes after those served before it and before those served after), and at the jobs
//! without a group as one more lane. Each
//! lane offers its first `share` jobs, limited by what `room` allows the group now; the
//! claim takes candidates round by round — every lane's first, then every lane's second —
//! ungrouped lane first, groups in rotation order. A served group moves to the back of its
//! rotation; one that cannot run now (paused, at its cap, out of rate tokens) leaves the
//! rotation ("parked") until it can, so the groups a claim looks at are ones that can run and
//! a claim's cost does not grow with the number of groups waiting.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::job::RateLimit;

/// What an operator set for a group, across every queue and kind
/// ([`QueueAdmin::set_group_limits`](crate::store::QueueAdmin::set_group_limits)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupLimits {
    /// At most this many of the group's jobs run at once, fleet-wide.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cap: Option<u32>,
    /// At most this many of the group's jobs start per period (a token bucket).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<RateLimit>,
    /// While paused, none of the group's jobs start; they stay where they are.
    #[serde(default)]
    pub paused: bool,
}

impl GroupLimits {
    /// Checks the limits: a cap of at least 1 (pause a group to stop it), a valid rate.
    pub fn validate(&self) -> crate::error::Result<()> {
        if self.cap == Some(0) {
            return Err(crate::error::Error::InvalidJob(
                "a group's concurrency cap must be at least 1 (pause the group to stop it)".into(),
            ));
        }
        if let Some(rate) = &self.rate {
            rate.validate()?;
        }
        Ok(())
    }
}

/// A group as the coordinator sees it now.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupStatus {
    /// Its name.
    pub group: String,
    /// Its ready jobs (in one queue when listed by [`Inspect::groups`](crate::store::Inspect::groups),
    /// in every queue from [`Inspect::group`](crate::store::Inspect::group)).
    pub ready: u64,
    /// Its jobs holding a lease now, counted while it has a cap (as a kind's cap counts:
    /// jobs claimed before the cap was set, or after it was lifted, are not).
    pub running: u32,
    /// What an operator set.
    pub limits: GroupLimits,
    /// Out of the rotation until it can run again (paused, at its cap, out of rate tokens).
    pub parked: bool,
}

/// How many jobs one lane offers a claim of `n` that looks at `lanes` lanes: its share,
/// rounded up, so the claim can still fill when some lanes have fewer.
pub(crate) fn share(n: usize, lanes: usize) -> usize {
    n.div_ceil(lanes.max(1))
}

/// How many groups of a rotation a claim of `n` looks at: n, and 16 more, so that groups it
/// parks (at their cap, paused, out of tokens) leave room for others in the same claim.
pub(crate) fn lanes_looked_at(n: usize) -> usize {
    n.saturating_add(16)
}

/// What a claim may take from a group now.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Room {
    /// Up to this many (at least 1).
    Take(usize),
    /// None: it leaves the rotation; with `wake`, only until its rate bucket holds a whole
    /// token again, that long from now (whole ms).
    Park { wake: Option<Duration> },
}

/// The room a group has, from its limits, its running jobs and its rate bucket's tokens now
/// (`tokens`: `None` without a rate limit), for a lane that offers at most `share`.
pub(crate) fn room(limits: &GroupLimits, running: u32, tokens: Option<f64>, share: usize) -> Room {
    if limits.paused {
        return Room::Park { wake: None };
    }
    let mut take = share as u64;
    if let Some(cap) = limits.cap {
        let left = u64::from(cap).saturating_sub(u64::from(running));
        if left == 0 {
            return Room::Park { wake: None };
        }
        take = take.min(left);
    }
    if let (Some(rate), Some(tokens)) = (limits.rate, tokens) {
        let whole = tokens.floor();
        if whole < 1.0 {
            // ceil((1 - tokens) * per / jobs) ms, at least 1.
            let per = rate.per.as_millis() as f64;
            let wait = ((1.0 - tokens) * per / f64::from(rate.jobs))
                .ceil()
                .max(1.0);
            return Room::Park {
                wake: Some(Duration::from_millis(wait as u64)),
            };
        }
        take = take.min(whole as u64);
    }
    Room::Take(take as usize)
}

/// A rate bucket's tokens `credited_ms` after it held `before`: the arithmetic `claim.lua`
/// uses for a queue's limit (whole milliseconds credited, at most `jobs` kept).
pub(crate) fn refill(rate: &RateLimit, before: f64, credited_ms: u64) -> f64 {
    let per = rate.per.as_millis() as f64;
    f64::from(rate.jobs).min(before + credited_ms as f64 * f64::from(rate.jobs) / per)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(cap: Option<u32>, rate: Option<(u32, u64)>, paused: bool) -> GroupLimits {
        GroupLimits {
            cap,
            rate: rate.map(|(jobs, ms)| RateLimit {
                jobs,
                per: Duration::from_millis(ms),
            }),
            paused,
        }
    }

    #[test]
    fn shares_round_up_and_never_divide_by_zero() {
        assert_eq!(share(10, 3), 4);
        assert_eq!(share(10, 10), 1);
        assert_eq!(share(1, 100), 1);
        assert_eq!(share(5, 0), 5);
    }

    #[test]
    fn a_group_takes_its_share_within_its_cap_and_tokens() {
        assert_eq!(room(&GroupLimits::default(), 0, None, 4), Room::Take(4));
        assert_eq!(
            room(&limits(Some(3), None, false), 1, None, 4),
            Room::Take(2)
        );
        assert_eq!(
            room(&limits(Some(3), None, false), 3, None, 4),
            Room::Park { wake: None }
        );
        // A cap lowered below what runs parks it too.
        assert_eq!(
            room(&limits(Some(1), None, false), 5, None, 4),
            Room::Park { wake: None }
        );
        assert_eq!(
            room(&limits(None, Some((10, 1000)), false), 0, Some(2.5), 4),
            Room::Take(2)
        );
        assert_eq!(
            room(&limits(Some(9), Some((10, 1000)), true), 0, Some(9.0), 4),
            Room::Park { wake: None }
        );
    }

    #[test]
    fn a_group_out_of_tokens_wakes_when_one_is_whole_again() {
        // 10 per second: 0.25 tokens left needs 75 ms more.
        assert_eq!(
            room(&limits(None, Some((10, 1000)), false), 0, Some(0.25), 4),
            Room::Park {
                wake: Some(Duration::from_millis(75))
            }
        );
        // Never less than a millisecond.
        assert_eq!(
            room(&limits(None, Some((1000, 1)), false), 0, Some(0.9999), 4),
            Room::Park {
                wake: Some(Duration::from_millis(1))
            }
        );
    }

    #[test]
    fn buckets_refill_by_whole_milliseconds_up_to_their_size() {
        let rate = RateLimit {
            jobs: 10,
            per: Duration::from_millis(1000),
        };
        assert_eq!(refill(&rate, 0.0, 100), 1.0);
        assert_eq!(refill(&rate, 9.5, 1_000_000), 10.0);
        assert_eq!(refill(&rate, 3.0, 0), 3.0);
    }
}
