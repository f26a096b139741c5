//! The fenced sink on Redis: admission rule, whole-list mutation check, mutation and
//! idempotency record in one script (`redis/lua/fenced_write.lua`) per batch of writes.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use async_trait::async_trait;
use deadpool_redis::redis::{self, Script};
use serde::Serialize;

use super::connection::{garbage, key_slot, parse, round_trip, slot_tag, Link, Target};
use crate::admission::{Admission, Fence, Rejection};
use crate::error::{Error, Result};
use crate::ids::{FencingToken, LeaseId, Scope};
use crate::mutation::{Mutation, Value};
use crate::store::{collect_budget, FencedStore, FencedWrite};

/// Longest idempotency-key retention (100 years).
const MAX_KEY_RETENTION: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

static FENCED_WRITE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/fenced_write.lua")));

/// The same script for one call carrying several slots of one cluster master. Redis 7 lets a
/// script flagged so reach the undeclared keys of every slot its node serves, and refuses it
/// any other node's with an error (which the script probes for). Redis 6 refuses the flag
/// line itself: a cluster of Redis 6 gets one call per slot, as before.
static FENCED_WRITE_ACROSS: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "#!lua flags=allow-cross-slot-keys\n{}",
        include_str!("../lua/fenced_write.lua")
    ))
});

/// How long a cluster's map of slots to masters is trusted before it is read again (a call
/// that finds it behind a move reads it again at once).
const SLOT_MAP_AGE: Duration = Duration::from_secs(10);

/// Slot ranges and the id of the master serving each, as `CLUSTER SLOTS` tells them.
type SlotMap = Vec<(u16, u16, String)>;

/// A slot map (`None`: unreadable, so per slot) and when it was read.
type KnownSlots = Option<(std::time::Instant, Option<Arc<SlotMap>>)>;

/// A script call that failed, and whether the server refused it before running any of it (a
/// redirect, a slot being moved: its slots may go again one by one).
type Failed = (Error, bool);

/// The writes of one slot (`None`: one server), each with the reason it is refused for its
/// content, if it is.
type SlotWrites<'a> = (Option<u16>, Vec<(&'a FencedWrite, Option<String>)>);

/// A fenced sink on Redis: admission, mutation and idempotency record in one script.
///
/// Keys, for `RedisFencedStore::new(pool, "ledger")`: `ledger:{<scope>}:fence` (a string
/// "token TAB lease") and `ledger:{<scope>}:keys` per scope (hash-tagged by scope), data
/// under `ledger:d:<key>`, and the sink's low watermark `ledger:watermark` with its
/// collection queue `ledger:collect` (fences forgotten once the watermark passes them). A sink serves one coordinator
/// (tokens of two coordinators are not comparable, and one's watermark would refuse the
/// other's leases; `palisade_cli::App` gives every installation prefix its own sink prefix).
///
/// On a Redis Cluster each slot has its own watermark and collection queue
/// (`ledger:{<slot tag>}:watermark`, `ledger:{<slot tag>}:collect`), a batch goes out as one
/// script call per master that serves its slots (Redis 7; per slot on Redis 6), and a write's
/// data keys must share its scope's slot: name them with
/// the scope in braces (`{invoice:42}:total` for scope `invoice:42`). A write whose keys span
/// slots is refused ([`Rejection::Mutation`]) without touching its data keys: it still goes
/// to its scope's slot to be decided for ownership, and advances the fence there as any
/// content refusal does.
#[derive(Clone)]
pub struct RedisFencedStore {
    link: Link,
    prefix: String,
    retention: Duration,
    max_keys: usize,
    /// The largest coordinator watermark observed; sent with the next script call.
    watermark: Arc<AtomicU64>,
    /// On a cluster: the slots' masters as last read, and when, so that a batch goes out as
    /// one call per master rather than per slot; cleared when a call finds it behind.
    slot_map: Arc<std::sync::Mutex<KnownSlots>>,
    /// False once the cluster refused the grouped script (Redis 6): one call per slot.
    across: Arc<AtomicBool>,
}

impl RedisFencedStore {
    /// A sink whose keys start with `prefix:`, on one Redis server (a
    /// [`Pool`](super::Pool)) or a Redis [`Cluster`](super::Cluster); idempotency keys are
    /// kept 24 hours.
    pub fn new(target: impl Into<Target>, prefix: &str) -> Self {
        Self {
            link: Link::new(target.into()),
            prefix: prefix.to_owned(),
            retention: Duration::from_secs(24 * 3600),
            max_keys: 10_000,
            watermark: Arc::default(),
            slot_map: Arc::default(),
            across: Arc::new(AtomicBool::new(true)),
        }
    }

    /// Which sink this is, however it is reached (direct, through a proxy, by another host
    /// name): `redis:<uuid>`, a random id the first caller keeps in the sink's Redis
    /// (`{<prefix>}:sink-id`, never expiring). Workers compare it to find one sink configured
    /// in two places. A Redis that lost its data has a new one.
    pub async fn identity(&self) -> Result<String> {
        let key = format!("{{{}}}:sink-id", self.prefix);
        let mut conn = self.link.get().await?;
        let (id,): (String,) = redis::pipe()
            .cmd("SET")
            .arg(&key)
            .arg(uuid::Uuid::new_v4().to_string())
            .arg("NX")
            .ignore()
            .cmd("GET")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .map_err(|e| self.link.broken(e))?;
        Ok(format!("redis:{id}"))
    }

    /// Bounds the idempotency record per scope: keys older than `retention`, and all but the
    /// newest `max_keys`, are forgotten (a repeat of such a write after that would apply
    /// again). Keys are kept across tokens, so a re-run under a newer token is still a
    /// duplicate. Clamped to at most 100 years and 2^40 keys: larger numbers would reach the
    /// script as doubles in exponent form, which Redis refuses halfway through a write.
    pub fn with_key_retention(mut self, retention: Duration, max_keys: usize) -> Self {
        self.retention = retention.clamp(Duration::from_millis(1), MAX_KEY_RETENTION);
        self.max_keys = max_keys.clamp(1, 1 << 40);
        self
    }

    fn data_prefix(&self) -> String {
        format!("{}:d:", self.prefix)
    }

    fn fence_key(&self, scope: &Scope) -> String {
        format!("{}:{{{scope}}}:fence", self.prefix)
    }

    fn keys_key(&self, scope: &Scope) -> String {
        format!("{}:{{{scope}}}:keys", self.prefix)
    }

    /// The calls for a batch touching `slots` of a cluster: the slots of one master together
    /// where the map of slots is known and the cluster runs the grouped script, else one call
    /// per slot.
    async fn plan(&self, slots: Vec<u16>) -> Vec<Vec<u16>> {
        let map = match slots.len() > 1 && self.across.load(Ordering::Relaxed) {
            true => self.slot_map().await,
            false => None,
        };
        let Some(map) = map else {
            return slots.into_iter().map(|slot| vec![slot]).collect();
        };
        let mut by_master: BTreeMap<&str, Vec<u16>> = BTreeMap::new();
        let mut alone = Vec::new();
        for slot in slots {
            match map.iter().find(|(lo, hi, _)| (*lo..=*hi).contains(&slot)) {
                Some((_, _, master)) => by_master.entry(master.as_str()).or_default().push(slot),
                None => alone.push(vec![slot]),
            }
        }
        by_master.into_values().chain(alone).collect()
    }

    fn known_slots(&self) -> std::sync::MutexGuard<'_, KnownSlots> {
        self.slot_map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The cluster's slots and their masters, read at most every [`SLOT_MAP_AGE`]; `None`
    /// when they cannot be read (the batch then goes out per slot).
    async fn slot_map(&self) -> Option<Arc<SlotMap>> {
        let known = self
            .known_slots()
            .as_ref()
            .filter(|(at, _)| at.elapsed() < SLOT_MAP_AGE)
            .map(|(_, map)| map.clone());
        if let Some(map) = known {
            return map;
        }
        let reply = match self.link.get().await {
            Ok(mut conn) => redis::cmd("CLUSTER")
                .arg("SLOTS")
                .query_async::<redis::Value>(&mut conn)
                .await
                .ok(),
            Err(_) => None,
        };
        // (An unreadable map is kept as such too, so that a batch does not ask for it again
        // before its time.)
        let map = reply.and_then(|r| slot_ranges(&r)).map(Arc::new);
        *self.known_slots() = Some((std::time::Instant::now(), map.clone()));
        map
    }

    /// Why `write` cannot run on a cluster as one script in `slot` (its scope's), if it    /// Why `write` cannot run on a cluster as one script in `slot` (its scope's), if it
    /// cannot: one of its data keys lives in another slot.
    fn off_slot(&self, write: &FencedWrite, slot: u16) -> Option<String> {
        let prefix = self.data_prefix();
        write.mutations.iter().enumerate().find_map(|(i, m)| {
            let theirs = key_slot(&format!("{prefix}{}", m.key()));
            (theirs != slot).then(|| {
                format!(
                    "mutation {i}: on Redis Cluster a write's keys must share its scope's slot \
                     ({slot}), and {} is in slot {theirs}: name it with the scope in braces, \
                     \"{{{}}}...\"",
                    m.key(),
                    write.scope
                )
            })
        })
    }

    /// One script call for `writes`, which all live in `slot` on a cluster (`None`: one
    /// server, where the watermark and the collection queue are shared by every scope; on a
    /// cluster each slot has its own pair, so every call stays in one slot).
    ///
    /// A write paired with a reason is refused for its content by the script (after the
    /// ownership checks, so its fence still advances) instead of applied.
    async fn run(
        &self,
        slot: Option<u16>,
        writes: &[(&FencedWrite, Option<String>)],
    ) -> Result<Vec<Result<Admission>>> {
        let replies = self
            .call(&FENCED_WRITE, &[(slot, writes.to_vec())])
            .await
            .map_err(|(e, _)| e)?;
        Ok(replies
            .into_iter()
            .map(|r| {
                r.unwrap_or_else(|| Err(garbage("a write of its own slot answered elsewhere")))
            })
            .collect())
    }

    /// One script call for the writes of several slots of one cluster master (`slots`, each
    /// with its writes): the first slot's keys declared, the others' passed along and probed
    /// by the script. A write answers `None` where its slot was not on the node the call
    /// reached.
    async fn call(
        &self,
        script: &Script,
        slots: &[SlotWrites<'_>],
    ) -> std::result::Result<Vec<Option<Result<Admission>>>, Failed> {
        let records = |slot: Option<u16>| match slot {
            None => format!("{}:", self.prefix),
            Some(slot) => format!("{}:{{{}}}:", self.prefix, slot_tag(slot)),
        };
        let keys_of = |slot: Option<u16>, writes: &[(&FencedWrite, Option<String>)]| {
            let records = records(slot);
            let mut keys = vec![format!("{records}watermark"), format!("{records}collect")];
            for (write, _) in writes {
                keys.push(self.fence_key(&write.scope));
                keys.push(self.keys_key(&write.scope));
            }
            keys
        };
        let mut invocation = script.prepare_invoke();
        let watermark = FencingToken::from_u64(self.watermark.load(Ordering::Relaxed));
        let (first, first_writes) = &slots[0];
        for key in keys_of(*first, first_writes) {
            invocation.key(key);
        }
        invocation
            .arg(self.retention.as_millis() as u64)
            .arg(self.max_keys)
            .arg(self.data_prefix())
            .arg(format!("{}:", self.prefix))
            .arg(padded(watermark))
            .arg(collect_budget(
                slots.iter().map(|(_, w)| w.len()).max().unwrap_or(0),
            ))
            .arg(slots.len());
        for (_, writes) in slots {
            invocation.arg(writes.len());
        }
        for (slot, writes) in &slots[1..] {
            for key in keys_of(*slot, writes) {
                invocation.arg(key);
            }
        }
        let all: Vec<&(&FencedWrite, Option<String>)> =
            slots.iter().flat_map(|(_, writes)| writes).collect();
        for (write, refuse) in &all {
            let mutations = match refuse {
                None => wire(&write.mutations),
                Some(why) => serde_json::json!({ "refuse": why }).to_string(),
            };
            invocation
                .arg(padded(write.fence.token))
                .arg(write.fence.lease.to_string())
                .arg(write.key.as_str())
                .arg(mutations);
        }
        round_trip("fenced_write");
        let mut conn = self.link.get().await.map_err(|e| (e, false))?;
        let replies: Vec<Vec<String>> = invocation.invoke_async(&mut conn).await.map_err(|e| {
            let unrun = matches!(
                e.code(),
                Some("MOVED" | "ASK" | "TRYAGAIN" | "CROSSSLOT" | "CLUSTERDOWN")
            );
            (self.link.broken(e), unrun)
        })?;
        if replies.len() != all.len() {
            let e = garbage(format_args!(
                "{} replies for {} writes",
                replies.len(),
                all.len()
            ));
            return Err((e, false));
        }
        Ok(all
            .iter()
            .zip(replies)
            .map(|((write, _), reply)| match reply.as_slice() {
                [e] if e == "elsewhere" => None,
                reply => Some(decode(write, reply)),
            })
            .collect())
    }
}

/// `CLUSTER SLOTS`' reply as ranges and their masters' node ids; `None` for a reply of another
/// shape.
fn slot_ranges(reply: &redis::Value) -> Option<SlotMap> {
    use redis::Value;
    let text = |v: &Value| match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    };
    let number = |v: &Value| match v {
        Value::Int(n) => u16::try_from(*n).ok(),
        _ => None,
    };
    let Value::Array(ranges) = reply else {
        return None;
    };
    ranges
        .iter()
        .map(|range| {
            let Value::Array(parts) = range else {
                return None;
            };
            let Some(Value::Array(master)) = parts.get(2) else {
                return None;
            };
            // (The node id: a master's address may be unknown to the client's view.)
            let id = text(master.get(2)?)?;
            Some((number(parts.first()?)?, number(parts.get(1)?)?, id))
        })
        .collect()
}

/// Whether an error of a grouped call says the cluster cannot run the grouped script at all
/// (Redis 6 refuses its flag line when loading it), rather than that this call failed.
fn cannot_group(e: &Error) -> bool {
    let text = e.to_string();
    text.contains("compiling script") || text.contains("shebang")
}

/// Tokens travel as 20-digit zero-padded decimals: string order is numeric order, and Lua's
/// doubles never see them as numbers.
fn padded(token: FencingToken) -> String {
    format!("{:020}", token.as_u64())
}

/// One mutation as the script reads it: a tagged list with `by` as a decimal string, so no
/// integer ever passes through a Lua double (cjson decodes JSON numbers to doubles, which
/// would round 2^53 + 1 and wrap `i64::MAX`).
#[derive(Serialize)]
#[serde(untagged)]
enum Wire<'a> {
    Set(&'static str, &'a str, &'a str),
    HashSet(&'static str, &'a str, Vec<&'a str>),
    HashIncr(&'static str, &'a str, &'a str, String),
    Delete(&'static str, &'a str),
}

fn wire(mutations: &[Mutation]) -> String {
    let list: Vec<Wire<'_>> = mutations
        .iter()
        .map(|m| match m {
            Mutation::Set { key, value } => Wire::Set("S", key, value),
            Mutation::HashSet { key, fields } => Wire::HashSet(
                "H",
                key,
                fields
                    .iter()
                    .flat_map(|(f, v)| [f.as_str(), v.as_str()])
                    .collect(),
            ),
            Mutation::HashIncr { key, field, by } => {
                Wire::HashIncr("I", key, field, by.to_string())
            }
            Mutation::Delete { key } => Wire::Delete("D", key),
        })
        .collect();
    serde_json::to_string(&list).expect("strings and lists always encode")
}

/// Decodes one write's reply; a reply of an unknown shape fails that write alone.
fn decode(write: &FencedWrite, reply: &[String]) -> Result<Admission> {
    let token = |s: &str| parse::<u64>(s).map(FencingToken::from_u64);
    let lease = |s: &str| parse::<uuid::Uuid>(s).map(LeaseId::from);
    Ok(match reply {
        [a] if a == "applied" => Admission::Applied,
        [d] if d == "duplicate" => Admission::Duplicate,
        [s, highest, _] if s == "stale" => Admission::Rejected(Rejection::StaleToken {
            presented: write.fence.token,
            highest: token(highest)?,
        }),
        [c, t, held_by] if c == "conflict" => Admission::Rejected(Rejection::TokenConflict {
            token: token(t)?,
            held_by: lease(held_by)?,
            presented_by: write.fence.lease,
        }),
        [m, why] if m == "mutation" => {
            Admission::Rejected(Rejection::Mutation { why: why.clone() })
        }
        [e, why] if e == "error" => {
            return Err(garbage(format_args!("scope {}: {why}", write.scope)))
        }
        // A slot being moved between cluster nodes: the write was not decided; again later.
        [m, why] if m == "moving" => {
            return Err(Error::Unavailable(format!("scope {}: {why}", write.scope)))
        }
        other => return Err(garbage(format_args!("unexpected reply {other:?}"))),
    })
}

#[async_trait]
impl FencedStore for RedisFencedStore {
    async fn write(&self, write: FencedWrite) -> Result<Admission> {
        self.write_batch(vec![write])
            .await?
            .pop()
            .unwrap_or_else(|| Err(garbage("empty reply")))
    }

    async fn write_batch(&self, writes: Vec<FencedWrite>) -> Result<Vec<Result<Admission>>> {
        if writes.is_empty() {
            return Ok(Vec::new());
        }
        if !self.link.is_cluster() {
            let all: Vec<_> = writes.iter().map(|w| (w, None)).collect();
            return self.run(None, &all).await;
        }
        // On a cluster the batch goes out as one script call per master (below), all at
        // once, each slot decided on its own. A write whose keys span slots cannot be applied
        // atomically: it is refused for its content in its scope's slot (ownership decided,
        // fence advanced, its data keys never touched).
        let mut out: Vec<Option<Result<Admission>>> = writes.iter().map(|_| None).collect();
        let mut groups: BTreeMap<u16, Vec<(usize, Option<String>)>> = BTreeMap::new();
        for (i, write) in writes.iter().enumerate() {
            let slot = key_slot(&self.fence_key(&write.scope));
            if key_slot(&self.keys_key(&write.scope)) != slot {
                // Only a scope that starts with '}' (an empty hash tag) splits them.
                out[i] = Some(Err(Error::Config(format!(
                    "scope {:?} cannot be fenced on Redis Cluster: its fence and key records \
                     would hash to different slots",
                    write.scope.as_str()
                ))));
                continue;
            }
            let refuse = self.off_slot(write, slot);
            groups.entry(slot).or_default().push((i, refuse));
        }
        // One call per master that serves several of the batch's slots (Redis 7), else per
        // slot. A slot a grouped call did not find on its node (the map behind a move) goes
        // again in a call of its own.
        let batch_of = |slot: u16| -> Vec<(&FencedWrite, Option<String>)> {
            groups[&slot]
                .iter()
                .map(|(i, refuse)| (&writes[*i], refuse.clone()))
                .collect()
        };
        let plan = self.plan(groups.keys().copied().collect()).await;
        let calls = plan.iter().map(|slots| {
            let parts: Vec<_> = slots
                .iter()
                .map(|&slot| (Some(slot), batch_of(slot)))
                .collect();
            let script = if parts.len() == 1 {
                &FENCED_WRITE
            } else {
                &FENCED_WRITE_ACROSS
            };
            async move { self.call(script, &parts).await }
        });
        let replies = futures_util::future::join_all(calls).await;
        let mut failed = None;
        let mut any_reply = out.iter().any(Option::is_some);
        let mut again = Vec::new();
        let mut settle = |slot: u16, reply: Result<Vec<Option<Result<Admission>>>>| match reply {
            Ok(admissions) => {
                any_reply = true;
                for (&(i, _), admission) in groups[&slot].iter().zip(admissions) {
                    out[i] = admission;
                }
            }
            Err(e) => {
                for &(i, _) in &groups[&slot] {
                    out[i] = Some(Err(e.same_class()));
                }
                failed.get_or_insert(e);
            }
        };
        for (slots, reply) in plan.iter().zip(replies) {
            match reply {
                Ok(admissions) => {
                    let mut admissions = admissions.into_iter();
                    for &slot in slots {
                        let mine: Vec<_> = admissions.by_ref().take(groups[&slot].len()).collect();
                        if mine.iter().any(Option::is_none) {
                            again.push(slot);
                        } else {
                            settle(slot, Ok(mine));
                        }
                    }
                }
                Err((e, _)) if slots.len() > 1 && cannot_group(&e) => {
                    tracing::info!(error = %e, "this Redis Cluster cannot run the grouped fenced write (Redis 6?): one call per slot");
                    self.across.store(false, Ordering::Relaxed);
                    again.extend(slots);
                }
                // Refused before it ran (its first slot being moved, or redirected): each
                // slot goes again alone, so one moving slot fails only its own writes.
                Err((_, true)) if slots.len() > 1 => again.extend(slots),
                Err((e, _)) => {
                    for &slot in slots {
                        settle(slot, Err(e.same_class()));
                    }
                }
            }
        }
        if !again.is_empty() {
            *self.known_slots() = None;
            let calls = again.iter().map(|&slot| {
                let parts = [(Some(slot), batch_of(slot))];
                async move { self.call(&FENCED_WRITE, &parts).await }
            });
            let replies = futures_util::future::join_all(calls).await;
            for (&slot, reply) in again.iter().zip(replies) {
                settle(slot, reply.map_err(|(e, _)| e));
            }
        }
        // Nothing answered at all: the batch failed as a whole, as on a single server.
        if let (Some(e), false) = (failed, any_reply) {
            return Err(e);
        }
        Ok(out
            .into_iter()
            .map(|o| o.unwrap_or_else(|| Err(garbage("no reply"))))
            .collect())
    }

    fn observe_watermark(&self, watermark: FencingToken) {
        self.watermark
            .fetch_max(watermark.as_u64(), Ordering::Relaxed);
    }

    async fn read(&self, key: &str) -> Result<Option<Value>> {
        let key = format!("{}{key}", self.data_prefix());
        let mut conn = self.link.get().await?;
        let kind: String = redis::cmd("TYPE")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .map_err(|e| self.link.broken(e))?;
        Ok(match kind.as_str() {
            "none" => None,
            "string" => Some(Value::Text(
                redis::cmd("GET")
                    .arg(&key)
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| self.link.broken(e))?,
            )),
            "hash" => Some(Value::Hash(
                redis::cmd("HGETALL")
                    .arg(&key)
                    .query_async::<BTreeMap<String, String>>(&mut conn)
                    .await
                    .map_err(|e| self.link.broken(e))?,
            )),
            other => return Err(garbage(format_args!("{key} is a {other}"))),
        })
    }

    async fn highest(&self, scope: &Scope) -> Result<Option<Fence>> {
        let mut conn = self.link.get().await?;
        let held: Option<String> = redis::cmd("GET")
            .arg(self.fence_key(scope))
            .query_async(&mut conn)
            .await
            .map_err(|e| self.link.broken(e))?;
        let Some(held) = held else {
            return Ok(None);
        };
        let (token, lease) = held
            .split_once('\t')
            .ok_or_else(|| garbage(format_args!("bad fence {held:?}")))?;
        Ok(Some(Fence {
            token: FencingToken::from_u64(parse(token)?),
            lease: LeaseId::from(parse::<uuid::Uuid>(lease)?),
        }))
    }
}

#[cfg(test)]
mod golden {
    use super::*;

    /// Pinned: the sink script compares tokens as strings, and a previous release's script
    /// reads what this one stores (fences, journals). Never update the literals to make it
    /// pass.
    #[test]
    fn tokens_travel_as_twenty_digit_zero_padded_decimals() {
        assert_eq!(padded(FencingToken::ZERO), "00000000000000000000");
        assert_eq!(padded(FencingToken::new(5, 7)), "00000005497558138887");
        assert_eq!(
            padded(FencingToken::from_u64(i64::MAX as u64)),
            "09223372036854775807"
        );
        assert_eq!(
            padded(FencingToken::from_u64(u64::MAX)),
            "18446744073709551615"
        );
    }
}
