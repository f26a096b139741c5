//! The live leases and the two orders the store reads them in: by expiry (the reaper, the
//! console's list) and by token (the low watermark).
//!
//! Both orders are kept lazily. An order's entry is not removed when its lease ends or is
//! renewed; it is skipped, and dropped, when it is met at the front, or when a rebuild from
//! the live leases finds it gone. Leases are granted in token order (tokens only grow) and
//! nearly always in expiry order (one ttl per worker), so adding to either order is one
//! comparison, and nothing is searched when a lease ends: two B-tree sets, each searched from
//! its root on every grant and every end, were a sizeable share of the embedded
//! coordinator's instructions a job (docs/performance.md, settings the code cites).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use foldhash::HashMap;
use tokio::time::Instant;

use super::LeaseRecord;
use crate::ids::{FencingToken, LeaseId};

/// Entries of an order beyond the live leases (ended or renewed since) are dropped once they
/// outnumber the leases and this many more: a rebuild is linear in the leases, and the next
/// one is at least this many entries away, so the work per lease stays constant.
const SLACK: usize = 1024;

#[derive(Debug, Default)]
pub(super) struct Leases {
    records: HashMap<LeaseId, LeaseRecord>,
    /// Every lease's current expiry, and stale ones; the earliest first, ties in token
    /// order, so that reaping is deterministic given the same calls at the same (virtual)
    /// times — lease ids are random.
    by_expiry: BinaryHeap<Reverse<(Instant, FencingToken, LeaseId)>>,
    /// Every live lease's token, and ended ones, in the order granted: token order.
    by_token: VecDeque<(FencingToken, LeaseId)>,
}

impl Leases {
    pub(super) fn get(&self, lease: &LeaseId) -> Option<&LeaseRecord> {
        self.records.get(lease)
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (&LeaseId, &LeaseRecord)> {
        self.records.iter()
    }

    /// The records, to change what they count against. (Not their expiry or token: the
    /// orders hold those; `renew` moves an expiry.)
    pub(super) fn values_mut(&mut self) -> impl Iterator<Item = &mut LeaseRecord> {
        self.records.values_mut()
    }

    /// Adds a lease; its token is above every token granted before.
    pub(super) fn insert(&mut self, lease: LeaseId, record: LeaseRecord) {
        debug_assert!(self.by_token.back().is_none_or(|(t, _)| *t < record.token));
        self.by_expiry
            .push(Reverse((record.expires_at, record.token, lease)));
        self.by_token.push_back((record.token, lease));
        self.records.insert(lease, record);
        self.compact();
    }

    /// Drops the orders' stale entries once they outnumber the live leases by [`SLACK`].
    fn compact(&mut self) {
        let records = &self.records;
        if self.by_expiry.len() > 2 * records.len() + SLACK {
            self.by_expiry.retain(|Reverse((at, _, lease))| {
                records.get(lease).is_some_and(|r| r.expires_at == *at)
            });
        }
        if self.by_token.len() > 2 * records.len() + SLACK {
            self.by_token
                .retain(|(_, lease)| records.contains_key(lease));
        }
    }

    /// Ends a lease.
    pub(super) fn remove(&mut self, lease: &LeaseId) -> Option<LeaseRecord> {
        self.records.remove(lease)
    }

    /// Moves the expiry of a lease still current at `now` to `until`; false if `lease` is
    /// not current (ended, or expired and not reaped yet).
    pub(super) fn renew(&mut self, lease: LeaseId, now: Instant, until: Instant) -> bool {
        let Some(record) = self.records.get_mut(&lease).filter(|r| r.expires_at > now) else {
            return false;
        };
        // (Renewed to the expiry it has — a paused clock — its entry is in already: a second
        // would be due twice and kept by every compaction.)
        if record.expires_at != until {
            record.expires_at = until;
            self.by_expiry.push(Reverse((until, record.token, lease)));
            self.compact();
        }
        true
    }

    /// The lowest live token.
    pub(super) fn lowest_token(&mut self) -> Option<FencingToken> {
        while let Some(&(token, lease)) = self.by_token.front() {
            if self.records.contains_key(&lease) {
                return Some(token);
            }
            self.by_token.pop_front();
        }
        None
    }

    /// Up to `max` live leases whose expiry is at or before `now`, the earliest first (ties
    /// in token order), taken out of the expiry order: the caller ends them.
    pub(super) fn due(&mut self, now: Instant, max: usize) -> Vec<LeaseId> {
        let mut due = Vec::new();
        while due.len() < max {
            let Some(&Reverse((at, _, lease))) = self.by_expiry.peek() else {
                break;
            };
            if at > now {
                break;
            }
            self.by_expiry.pop();
            if self.records.get(&lease).is_some_and(|r| r.expires_at == at) {
                due.push(lease);
            }
        }
        due
    }

    /// Up to `limit` live leases, the earliest expiry first (ties in token order).
    pub(super) fn by_expiry(&self, limit: usize) -> Vec<(&LeaseId, &LeaseRecord)> {
        let mut all: Vec<_> = self.records.iter().collect();
        all.sort_by_key(|(lease, r)| (r.expires_at, r.token, **lease));
        all.truncate(limit);
        all
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::ids::JobId;

    fn record(token: u64, expires_at: Instant) -> LeaseRecord {
        LeaseRecord {
            job: JobId::new(),
            expires_at,
            claimed_at: expires_at,
            worker: Arc::from("w"),
            token: FencingToken::new(0, token),
            capped: None,
            group: None,
        }
    }

    /// Leases are due in expiry order, ties in token order, each once at its current expiry:
    /// not at an expiry it was renewed away from, not after it ended (fails with the expiry
    /// check in `due` out, or with `renew` not moving the order).
    #[test]
    fn leases_fall_due_at_their_current_expiry_in_order() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let mut leases = Leases::default();
        let ids: Vec<LeaseId> = (0..5).map(|_| LeaseId::new()).collect();
        // Granted in token order; expiries 30, 10, 10, 20, 40 ms.
        for (i, ms) in [30, 10, 10, 20, 40].into_iter().enumerate() {
            leases.insert(ids[i], record(i as u64 + 1, at(ms)));
        }
        assert!(leases.renew(ids[1], t0, at(50)), "renewed past the others");
        assert!(
            leases.renew(ids[1], t0, at(50)),
            "renewed to the same time: due once"
        );
        assert!(
            !leases.renew(ids[0], at(30), at(60)),
            "an expired lease is not renewed"
        );
        leases.remove(&ids[3]);
        assert!(
            !leases.renew(ids[3], t0, at(60)),
            "an ended lease is not renewed"
        );
        assert_eq!(leases.due(at(9), 10), vec![]);
        assert_eq!(
            leases.due(at(30), 1),
            vec![ids[2]],
            "at most the number asked"
        );
        assert_eq!(
            leases.due(at(30), 10),
            vec![ids[0]],
            "not at 10 ms: renewed"
        );
        for lease in [ids[0], ids[2]] {
            leases.remove(&lease);
        }
        assert_eq!(leases.due(at(100), 10), vec![ids[4], ids[1]]);
        let order: Vec<LeaseId> = leases.by_expiry(10).iter().map(|(l, _)| **l).collect();
        assert_eq!(
            order,
            vec![ids[4], ids[1]],
            "the console's list in expiry order"
        );
    }

    /// The lowest live token is the watermark's; a lease held for long at the front (a
    /// paused holder) keeps it there while thousands of later leases come and go, and the
    /// orders stay in step with the live leases, not with every lease ever granted (fails
    /// with `compact` out).
    #[test]
    fn the_lowest_token_holds_and_the_orders_stay_bounded() {
        let t0 = Instant::now();
        let mut leases = Leases::default();
        assert_eq!(leases.lowest_token(), None);
        let held = LeaseId::new();
        leases.insert(held, record(1, t0 + Duration::from_secs(3600)));
        let mut live = VecDeque::new();
        for token in 2..20_000u64 {
            let lease = LeaseId::new();
            leases.insert(lease, record(token, t0 + Duration::from_millis(token)));
            live.push_back(lease);
            if live.len() > 50 {
                leases.remove(&live.pop_front().unwrap());
            }
            // The held lease renews as a renewal actor would, many times over.
            assert!(leases.renew(
                held,
                t0,
                t0 + Duration::from_secs(3600) + Duration::from_millis(token)
            ));
            assert_eq!(leases.lowest_token(), Some(FencingToken::new(0, 1)));
        }
        let bound = 2 * leases.records.len() + SLACK + 1;
        assert!(
            leases.by_expiry.len() <= bound,
            "{}",
            leases.by_expiry.len()
        );
        assert!(leases.by_token.len() <= bound, "{}", leases.by_token.len());
        leases.remove(&held);
        let first_live = leases.get(&live[0]).unwrap().token;
        assert_eq!(leases.lowest_token(), Some(first_live));
        for lease in live {
            leases.remove(&lease);
        }
        assert_eq!(leases.lowest_token(), None);
    }
}
