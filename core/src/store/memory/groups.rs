//! The memory store's groups (`crate::group` has the rules, `claim.lua` the Redis twin):
//! each (queue, kind, group) has a ready set, each (queue, kind) a rotation of the groups
//! with ready jobs by turn, and a group that cannot run now is parked out of every rotation
//! until it can.

use foldhash::{HashMap, HashMapExt};
use std::collections::{BTreeMap, BTreeSet};

use tokio::time::Instant;

use super::{LeaseState, ReadyKey};
use crate::group::{lanes_looked_at, refill, room, share, GroupLimits, GroupStatus, Room};

/// A group's state, across queues and kinds.
#[derive(Debug, Default)]
pub(super) struct GroupState {
    pub(super) limits: GroupLimits,
    /// Its jobs holding a lease.
    pub(super) running: u32,
    /// Its rate bucket: tokens, counted to (with a rate limit).
    pub(super) bucket: Option<(f64, Instant)>,
    /// Out of the rotation: the rotations it left, (queue, kind) -> its turn there.
    pub(super) parked: Option<BTreeMap<(String, String), u64>>,
}

impl GroupState {
    fn idle(&self) -> bool {
        self.limits == GroupLimits::default() && self.running == 0 && self.parked.is_none()
    }
}

/// A queue's grouped ready jobs.
#[derive(Debug, Default)]
pub(super) struct Grouped {
    /// Ready jobs by (kind, group).
    pub(super) ready: BTreeMap<(String, String), BTreeSet<ReadyKey>>,
    /// Per kind, the groups in rotation by (turn, group).
    pub(super) rotation: BTreeMap<String, BTreeSet<(u64, String)>>,
    /// (kind, group) -> its turn in `rotation`.
    pub(super) turns: HashMap<(String, String), u64>,
    /// group -> its ready jobs in the queue (every kind).
    pub(super) depth: BTreeMap<String, u64>,
}

impl Grouped {
    pub(super) fn len(&self) -> u64 {
        self.depth.values().sum()
    }

    fn leave_rotation(&mut self, kind: &str, group: &str) -> Option<u64> {
        let turn = self.turns.remove(&(kind.to_owned(), group.to_owned()))?;
        if let Some(r) = self.rotation.get_mut(kind) {
            r.remove(&(turn, group.to_owned()));
            if r.is_empty() {
                self.rotation.remove(kind);
            }
        }
        Some(turn)
    }

    fn join_rotation(&mut self, kind: &str, group: &str, turn: u64) {
        let key = (kind.to_owned(), group.to_owned());
        if self.turns.contains_key(&key) {
            return;
        }
        self.turns.insert(key, turn);
        self.rotation
            .entry(kind.to_owned())
            .or_default()
            .insert((turn, group.to_owned()));
    }
}

/// One group lane a claim looks at.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Lane {
    pub(super) turn: u64,
    pub(super) group: String,
    pub(super) kind: String,
}

/// What a claim did with its lanes: the jobs started from each.
#[derive(Debug, Default)]
pub(super) struct Served {
    pub(super) started: HashMap<usize, usize>,
}

/// What a claim decided about the lanes it looked at, applied after its grants.
#[derive(Debug, Default)]
pub(super) struct Plan {
    pub(super) lanes: Vec<Lane>,
    /// Lanes (by index) that leave the rotation: parked (with a wake time for a rate limit),
    /// or found empty.
    pub(super) parked: Vec<(usize, Option<Instant>)>,
    pub(super) empty: Vec<usize>,
    /// Each rate-limited group's bucket before this claim: tokens, and the instant they are
    /// counted to (whole milliseconds before now, as Redis counts).
    pub(super) tokens: HashMap<String, (f64, Instant)>,
    /// The candidates each lane offers (by index), in its order.
    pub(super) offers: Vec<(usize, Vec<ReadyKey>)>,
    /// How many more of each group the claim may start (a group's lanes of two kinds share
    /// one room).
    pub(super) left: HashMap<String, usize>,
}

impl LeaseState {
    /// A ready grouped job: into its group's set; its group joins the kind's rotation at the
    /// next turn (or its parked rotations, if it is parked).
    pub(super) fn ready_grouped(&mut self, queue: &str, kind: &str, group: &str, key: ReadyKey) {
        let next = self.turn + 1;
        let parked = self.groups.get_mut(group).and_then(|g| g.parked.as_mut());
        let q = self.queues.entry(queue.to_owned()).or_default();
        let g = &mut q.grouped;
        g.ready
            .entry((kind.to_owned(), group.to_owned()))
            .or_default()
            .insert(key);
        *g.depth.entry(group.to_owned()).or_default() += 1;
        match parked {
            Some(parked) => {
                parked
                    .entry((queue.to_owned(), kind.to_owned()))
                    .or_insert(next);
            }
            None => g.join_rotation(kind, group, next),
        }
    }

    /// A grouped ready job leaves its group's set (claimed, set aside, cancelled); the last
    /// one takes its group out of the kind's rotation (a group is in a rotation exactly while
    /// it has ready jobs of the kind and is not parked).
    pub(super) fn unready_grouped(&mut self, queue: &str, kind: &str, group: &str, key: &ReadyKey) {
        let Some(q) = self.queues.get_mut(queue) else {
            return;
        };
        let g = &mut q.grouped;
        let set_key = (kind.to_owned(), group.to_owned());
        let Some(set) = g.ready.get_mut(&set_key) else {
            return;
        };
        if !set.remove(key) {
            return;
        }
        if set.is_empty() {
            g.ready.remove(&set_key);
            g.leave_rotation(kind, group);
        }
        if let Some(d) = g.depth.get_mut(group) {
            *d -= 1;
            if *d == 0 {
                g.depth.remove(group);
            }
        }
    }

    /// The group's rate bucket as of `now`: tokens, counted to (as `rate_bucket` for queues).
    fn group_bucket(&self, group: &str, now: Instant) -> Option<(f64, Instant)> {
        let g = self.groups.get(group)?;
        let rate = g.limits.rate?;
        let (before, at) = g.bucket.unwrap_or((f64::from(rate.jobs), now));
        let credited = now.saturating_duration_since(at).as_millis() as u64;
        Some((
            refill(&rate, before, credited),
            at + std::time::Duration::from_millis(credited),
        ))
    }

    /// The lanes a claim of `n` looks at in `queue` (of `kinds`, every kind when empty; none
    /// of a kind that is `full`): the `lanes_looked_at(n)` least recently served groups over
    /// those kinds, by (turn, group, kind); and how many jobs each may offer (`room`, capped by
    /// the lane's share), the rest parked or empty.
    pub(super) fn plan_groups(
        &self,
        queue: &str,
        kinds: &[String],
        n: usize,
        ungrouped: bool,
        now: Instant,
        full: impl Fn(&str) -> bool,
    ) -> Plan {
        let mut plan = Plan::default();
        let Some(q) = self.queues.get(queue) else {
            return plan;
        };
        let looked_at = lanes_looked_at(n);
        for (kind, rotation) in &q.grouped.rotation {
            if (!kinds.is_empty() && !kinds.contains(kind)) || full(kind) {
                continue;
            }
            plan.lanes
                .extend(rotation.iter().take(looked_at).map(|(turn, group)| Lane {
                    turn: *turn,
                    group: group.clone(),
                    kind: kind.clone(),
                }));
        }
        plan.lanes.sort();
        plan.lanes.truncate(looked_at);
        let per = share(n, plan.lanes.len().min(n) + usize::from(ungrouped));
        let (mut left, mut offers) = (HashMap::new(), Vec::new());
        for (i, lane) in plan.lanes.iter().enumerate() {
            let state = self.groups.get(&lane.group);
            let bucket = self.group_bucket(&lane.group, now);
            if let Some(bucket) = bucket {
                plan.tokens.insert(lane.group.clone(), bucket);
            }
            let limits = state.map(|g| g.limits).unwrap_or_default();
            let running = state.map_or(0, |g| g.running);
            match room(&limits, running, bucket.map(|b| b.0), per) {
                Room::Park { wake } => plan.parked.push((i, wake.map(|w| now + w))),
                Room::Take(k) => {
                    let heads: Vec<ReadyKey> = q
                        .grouped
                        .ready
                        .get(&(lane.kind.clone(), lane.group.clone()))
                        .map(|set| set.iter().take(k).copied().collect())
                        .unwrap_or_default();
                    if heads.is_empty() {
                        plan.empty.push(i);
                    } else {
                        left.entry(lane.group.clone()).or_insert(k);
                        offers.push((i, heads));
                    }
                }
            }
        }
        plan.offers = offers;
        plan.left = left;
        plan
    }

    /// After a claim's grants: served lanes go to the back of their rotation (or leave it,
    /// emptied), parked and empty ones leave it, rate buckets pay for what started.
    pub(super) fn apply_plan(&mut self, queue: &str, plan: Plan, served: &Served) {
        if plan.lanes.is_empty() {
            return;
        }
        // (In twos: a group that joins between two claims, at the odd turn between them, goes
        // after every group served before it and before every group served after.)
        self.turn += 2;
        let turn = self.turn;
        let mut started: HashMap<&str, usize> = HashMap::new();
        for (i, count) in &served.started {
            *started.entry(plan.lanes[*i].group.as_str()).or_default() += count;
        }
        for (group, (tokens, at)) in &plan.tokens {
            if let Some(g) = self.groups.get_mut(group) {
                let taken = started.get(group.as_str()).copied().unwrap_or(0);
                g.bucket = Some((tokens - taken as f64, *at));
            }
        }
        let q = self.queues.entry(queue.to_owned()).or_default();
        // A served lane with jobs left goes to the back of its rotation (one the claim
        // emptied has left it: `unready_grouped`).
        for i in served.started.keys() {
            let lane = &plan.lanes[*i];
            if q.grouped.leave_rotation(&lane.kind, &lane.group).is_some() {
                q.grouped.join_rotation(&lane.kind, &lane.group, turn);
            }
        }
        for i in &plan.empty {
            let lane = &plan.lanes[*i];
            q.grouped.leave_rotation(&lane.kind, &lane.group);
        }
        let mut parked = Vec::new();
        for (i, wake) in &plan.parked {
            let lane = &plan.lanes[*i];
            if let Some(was) = q.grouped.leave_rotation(&lane.kind, &lane.group) {
                parked.push((lane.clone(), was, *wake));
            }
        }
        for (lane, was, wake) in parked {
            let g = self.groups.entry(lane.group.clone()).or_default();
            g.parked
                .get_or_insert_with(BTreeMap::new)
                .insert((queue.to_owned(), lane.kind.clone()), was);
            if let Some(at) = wake {
                self.wake_at(&lane.group, at);
            }
        }
    }

    /// A grouped lease started.
    pub(super) fn group_started(&mut self, group: &str) {
        self.groups.entry(group.to_owned()).or_default().running += 1;
    }

    /// A grouped lease ended: one fewer running, and the group back in its rotations if that
    /// was what held it.
    pub(super) fn group_ended(&mut self, group: &str, now: Instant) {
        if let Some(g) = self.groups.get_mut(group) {
            g.running = g.running.saturating_sub(1);
        }
        self.unpark(group, now);
    }

    /// Looks at a parked group again at `at` (replacing an earlier time).
    fn wake_at(&mut self, group: &str, at: Instant) {
        if let Some(was) = self.wake_of.insert(group.to_owned(), at) {
            self.wakes.remove(&(was, group.to_owned()));
        }
        self.wakes.insert((at, group.to_owned()));
    }

    /// Parked groups whose rate bucket filled again come back: at most 16 a claim, as
    /// claim.lua.
    pub(super) fn wake_groups(&mut self, now: Instant) {
        for _ in 0..16 {
            match self.wakes.first().cloned() {
                Some((at, group)) if at <= now => {
                    self.wakes.pop_first();
                    self.wake_of.remove(&group);
                    self.unpark(&group, now);
                }
                _ => break,
            }
        }
    }

    /// Brings a parked group back to every rotation it left, at the turn it had there, if
    /// nothing holds it any more; a group without limits, leases or parked rotations is
    /// forgotten.
    pub(super) fn unpark(&mut self, group: &str, now: Instant) {
        let bucket = self.group_bucket(group, now).map(|b| b.0);
        let Some(g) = self.groups.get_mut(group) else {
            return;
        };
        if g.parked.is_none() {
            if g.idle() {
                self.groups.remove(group);
            }
            return;
        }
        match room(&g.limits, g.running, bucket, 1) {
            // Still out of tokens (it was parked for its cap, say): woken when it has one.
            Room::Park { wake: Some(wait) } => {
                self.wake_at(group, now + wait);
            }
            Room::Park { wake: None } => {}
            Room::Take(_) => {
                for ((queue, kind), turn) in g.parked.take().unwrap_or_default() {
                    if let Some(q) = self.queues.get_mut(&queue) {
                        if q.grouped
                            .ready
                            .contains_key(&(kind.clone(), group.to_owned()))
                        {
                            q.grouped.join_rotation(&kind, group, turn);
                        }
                    }
                }
            }
        }
        if self.groups.get(group).is_some_and(GroupState::idle) {
            self.groups.remove(group);
        }
    }

    /// Sets a group's limits (a new rate limit starts full) and unparks it if they allow.
    /// With a cap, its running jobs are counted afresh from the live leases (every one of
    /// them then gives its slot back when it ends): a count an older version left high
    /// heals here.
    pub(super) fn set_group_limits(&mut self, group: &str, limits: GroupLimits, now: Instant) {
        let mut running = 0;
        if limits.cap.is_some() {
            for record in self.leases.values_mut() {
                if self.jobs.get(&record.job).and_then(|j| j.group.as_deref()) == Some(group) {
                    record.group = Some(group.to_owned());
                    running += 1;
                }
            }
        }
        let g = self.groups.entry(group.to_owned()).or_default();
        if limits.cap.is_some() {
            g.running = running;
        }
        if g.limits.rate != limits.rate {
            g.bucket = limits.rate.map(|r| (f64::from(r.jobs), now));
        }
        g.limits = limits;
        self.unpark(group, now);
    }

    /// A group as seen now (`queue`: count its ready jobs there, else everywhere).
    pub(super) fn group_status(&self, group: &str, queue: Option<&str>) -> GroupStatus {
        let g = self.groups.get(group);
        let depth = |q: &super::QueueState| q.grouped.depth.get(group).copied().unwrap_or(0);
        let ready = match queue {
            Some(queue) => self.queues.get(queue).map_or(0, depth),
            None => self.queues.values().map(depth).sum(),
        };
        GroupStatus {
            group: group.to_owned(),
            ready,
            running: g.map_or(0, |g| g.running),
            limits: g.map(|g| g.limits).unwrap_or_default(),
            parked: g.is_some_and(|g| g.parked.is_some()),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::job::{NewJob, Settlement};
    use crate::store::memory::MemoryLeaseStore;
    use crate::store::LeaseStore;

    #[tokio::test]
    async fn a_released_grouped_job_is_claimable_again() {
        let store = MemoryLeaseStore::new();
        store
            .enqueue_all(vec![
                NewJob::raw("k", "1").with_group("g0"),
                NewJob::raw("k", "2").with_group("g1"),
            ])
            .await
            .unwrap();
        let ttl = Duration::from_secs(60);
        let got = store
            .claim_kinds("default", &[], "w", 2, ttl)
            .await
            .unwrap();
        assert_eq!(got.len(), 2);
        let r = store
            .settle(vec![(got[1].lease.id, Settlement::Release)])
            .await
            .unwrap();
        assert!(r[0].is_ok());
        let again = store
            .claim_kinds("default", &[], "w", 1, ttl)
            .await
            .unwrap();
        assert_eq!(again.len(), 1, "{:?}", store.state.lock().unwrap().queues);
    }
}
