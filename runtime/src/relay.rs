//! `OutboxRelay`: delivers the effects fenced transactions recorded in a Postgres sink's
//! outbox, at least once each.
//!
//! The outbox entry exists only if the transaction that pushed it committed, and a stale
//! generation's transaction never commits, so a stale holder cannot even *record* an effect;
//! the relay then only has to be reliable. Each round it leases up to `batch` due entries of
//! its targets (row leases: several relays never deliver one entry at once, and a relay that
//! dies leaves its entries to be taken again once the lease runs out), delivers them
//! concurrently and marks each: delivered, retried later with exponential backoff and jitter,
//! or dead after `max_attempts` (or at once, when the receiver refuses the request itself).
//!
//! Targets:
//! - [`OutboxTarget::Http`]: `POST <url>` with the payload as JSON and `Idempotency-Key:
//!   <scope>/<key>` — the same for every attempt and every run of the job, so the receiver can
//!   drop repeats (the relay is at least once by nature: it may deliver and die before it marks).
//! - [`OutboxTarget::Enqueue`]: enqueues a Palisade job (`{"kind": .., "payload": .., "scope": ..}`),
//!   so a job can fence its follow-up jobs. The follow-up goes by an id derived from the entry
//!   (a name-based UUID of its sink, target, scope and key), so a delivery repeated after a
//!   relay died before marking it, or after an answer that never came, is the same job, not a
//!   second one (for [`ID_RETENTION`](crate::ID_RETENTION) after the first enqueue).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use metrics::counter;
use rand::Rng as _;
use serde::Deserialize;

use crate::client::Client;
use crate::error::{chain, Error, Result};
use crate::job::NewJob;
use crate::metrics as m;
use crate::store::postgres::{OutboxEntry, PostgresSink};

/// Where the entries of one outbox target go.
#[derive(Clone)]
#[non_exhaustive]
pub enum OutboxTarget {
    /// `POST` to this `http://` or `https://` URL.
    Http(String),
    /// Enqueue the entry as a job into `queue` through `client`.
    Enqueue {
        /// The coordinator to enqueue into.
        client: Client,
        /// Queue for the follow-up jobs.
        queue: String,
    },
}

/// What an [`OutboxTarget::Enqueue`] entry's payload holds.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FollowUp {
    kind: String,
    #[serde(default)]
    payload: serde_json::Value,
    scope: Option<String>,
}

/// Pace and patience of a relay, and the name of its sink.
#[derive(Clone, Debug)]
pub struct RelayConfig {
    /// The sink's name as the workers know it (`--sink NAME=…`): part of every follow-up
    /// job's id, so one job's entries of the same key in two sinks are two follow-ups. Give
    /// each sink's relay its own, and keep it (a renamed sink's undelivered entries would be
    /// enqueued again under new ids).
    pub sink: String,
    /// Most entries leased per round.
    pub batch: usize,
    /// How long a leased entry is this relay's; a delivery times out at half of it.
    pub lease: Duration,
    /// Pause between rounds that found nothing to do.
    pub poll: Duration,
    /// Attempts before an entry is dead.
    pub max_attempts: u32,
    /// Delay before the second attempt; doubles per attempt up to `max_backoff`, each delay
    /// jittered down to half at random so failed entries do not retry in lock step.
    pub backoff: Duration,
    /// Longest delay between attempts.
    pub max_backoff: Duration,
    /// Delivered entries are deleted this long after delivery (a few hundred per round).
    pub keep_delivered: Duration,
    /// A PEM certificate authority `https://` targets are trusted by, besides Mozilla's
    /// roots (a receiver with a certificate of the user's own CA).
    pub ca_file: Option<std::path::PathBuf>,
}

impl Default for RelayConfig {
    fn default() -> Self {
        Self {
            sink: String::new(),
            batch: 64,
            lease: Duration::from_secs(60),
            poll: Duration::from_millis(200),
            max_attempts: 12,
            backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(600),
            keep_delivered: Duration::from_secs(7 * 24 * 3600),
            ca_file: None,
        }
    }
}

impl RelayConfig {
    /// The delay before attempt `attempts + 1`, jittered to [½, 1] of the exponential value.
    fn delay_after(&self, attempts: i32) -> Duration {
        let doublings = u32::try_from(attempts.saturating_sub(1))
            .unwrap_or(0)
            .min(30);
        let full = self
            .backoff
            .saturating_mul(1 << doublings)
            .min(self.max_backoff);
        full.mul_f64(rand::rng().random_range(0.5..=1.0))
    }
}

/// Delivers one Postgres sink's outbox (see the module docs).
pub struct OutboxRelay {
    sink: Arc<PostgresSink>,
    targets: Arc<HashMap<String, OutboxTarget>>,
    names: Arc<[String]>,
    config: RelayConfig,
    http: reqwest::Client,
    busy: bool,
}

/// How one delivery attempt went.
enum Attempt {
    Delivered,
    /// Worth another attempt later.
    Failed(String),
    /// The receiver refused the request itself; repeating it would get the same answer.
    Refused(String),
}

impl OutboxRelay {
    /// A relay for `targets` of `sink`'s outbox. Entries of other targets are left to other
    /// relays.
    pub fn new(
        sink: Arc<PostgresSink>,
        targets: HashMap<String, OutboxTarget>,
        config: RelayConfig,
    ) -> Result<Self> {
        if targets.is_empty() {
            return Err(Error::Config(
                "an outbox relay needs at least one target".into(),
            ));
        }
        if config.batch == 0 || config.max_attempts == 0 || config.lease < Duration::from_secs(1) {
            return Err(Error::Config(
                "relay batch and max attempts must be positive, the lease at least 1s".into(),
            ));
        }
        for (name, target) in &targets {
            if let OutboxTarget::Http(url) = target {
                if reqwest::Url::parse(url)
                    .map_or(true, |u| !matches!(u.scheme(), "http" | "https"))
                {
                    return Err(Error::Config(format!(
                        "outbox target {name}: {url:?} is not an http:// or https:// URL"
                    )));
                }
            }
        }
        // reqwest's rustls comes without a crypto provider so that the one the Redis TLS path
        // already uses (ring) serves both; install it unless the process chose another.
        let _ = rustls::crypto::ring::default_provider().install_default();
        // A delivery must end well inside the lease, or a second relay could take the entry
        // while the first is still sending it.
        let mut http = reqwest::Client::builder();
        if let Some(path) = &config.ca_file {
            let bad = |e: &dyn std::fmt::Display| {
                Error::Config(format!("outbox CA file {}: {e}", path.display()))
            };
            let pem = std::fs::read(path).map_err(|e| bad(&e))?;
            let certs = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| bad(&e))?;
            if certs.is_empty() {
                return Err(bad(&"no PEM certificate in it"));
            }
            for cert in certs {
                http = http.add_root_certificate(cert);
            }
        }
        let http = http
            .timeout(config.lease / 2)
            // A redirect would turn the POST into a body-less GET (301/302/303) and could be
            // taken for a delivery; a moved receiver is a configuration matter.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| Error::Config(format!("HTTP client: {e}")))?;
        let mut names: Vec<String> = targets.keys().cloned().collect();
        names.sort();
        Ok(Self {
            sink,
            targets: Arc::new(targets),
            names: names.into(),
            config,
            http,
            busy: false,
        })
    }

    fn round(&mut self, ctx: &mut Context<Self>) {
        if self.busy {
            return;
        }
        self.busy = true;
        let (sink, targets, names) = (self.sink.clone(), self.targets.clone(), self.names.clone());
        let (config, http) = (self.config.clone(), self.http.clone());
        let work = async move {
            let entries = match sink.claim_outbox(&names, config.batch, config.lease).await {
                Ok(entries) => entries,
                Err(e) => {
                    crate::repeats::warn_repeated!(error = %e, "outbox relay: claiming entries failed");
                    return 0;
                }
            };
            let n = entries.len();
            if let Err(e) = sink.prune_outbox(config.keep_delivered, 256).await {
                crate::repeats::warn_repeated!(error = %e, "outbox relay: pruning delivered entries failed");
            }
            let deliveries = entries.into_iter().map(|entry| {
                let target = targets[&entry.target].clone();
                let (sink, config, http) = (sink.clone(), config.clone(), http.clone());
                async move {
                    let attempt = deliver(&target, &http, &config, &entry).await;
                    settle(&sink, &config, &entry, attempt).await;
                }
            });
            futures_util::future::join_all(deliveries).await;
            n
        };
        ctx.spawn(work.into_actor(self).map(|n, act, ctx| {
            act.busy = false;
            // A full batch suggests more is due: go again without waiting for the poll.
            if n == act.config.batch {
                act.round(ctx);
            }
        }));
    }
}

/// One attempt at one entry.
async fn deliver(
    target: &OutboxTarget,
    http: &reqwest::Client,
    config: &RelayConfig,
    entry: &OutboxEntry,
) -> Attempt {
    let (timeout, sink) = (config.lease / 2, config.sink.as_str());
    match target {
        OutboxTarget::Http(url) => {
            let sent = http
                .post(url)
                .header("Idempotency-Key", entry.idempotency_key())
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(entry.payload.to_string())
                .send()
                .await;
            match sent {
                Ok(response) if response.status().is_success() => Attempt::Delivered,
                Ok(response) => {
                    let status = response.status();
                    let why = format!("{url} answered {status}");
                    // 408, 425 and 429 ask to come back later, and 409 is what a receiver
                    // that dedupes by Idempotency-Key answers while it still processes the
                    // same key; any other 4xx refuses the request itself, and a redirect
                    // means the target is misconfigured.
                    let later = [408, 409, 425, 429].contains(&status.as_u16());
                    if status.is_redirection() || (status.is_client_error() && !later) {
                        Attempt::Refused(why)
                    } else {
                        Attempt::Failed(why)
                    }
                }
                // A request that cannot even be built will never be sent.
                // The cause travels with the error (timed out, refused, a certificate), so an
                // operator can tell what would help; the URL is said once, first.
                Err(e) if e.is_builder() => {
                    Attempt::Refused(format!("{url}: {}", chain(&e.without_url())))
                }
                Err(e) if e.is_timeout() => Attempt::Failed(format!(
                    "{url}: timed out after {timeout:?} (half the outbox lease: a longer \
                     lease gives a delivery longer): {}",
                    chain(&e.without_url())
                )),
                Err(e) => Attempt::Failed(format!("{url}: {}", chain(&e.without_url()))),
            }
        }
        OutboxTarget::Enqueue { client, queue } => {
            let follow_up: FollowUp = match serde_json::from_value(entry.payload.clone()) {
                Ok(f) => f,
                Err(e) => {
                    return Attempt::Refused(format!(
                        "not a follow-up job ({{\"kind\", \"payload\", \"scope\"}}): {e}"
                    ))
                }
            };
            let mut job = NewJob::raw(follow_up.kind, follow_up.payload.to_string())
                .with_queue(queue.clone())
                .with_id(follow_up_id(sink, entry));
            if let Some(scope) = follow_up.scope {
                job = job.with_scope(scope);
            }
            match client.enqueue_unique(job).await {
                Ok(crate::Enqueued::Existing(id)) => {
                    // A repeated delivery (or a collision, which the id's parts rule out
                    // unless two relays share a sink name): said, since it means an earlier
                    // attempt's answer was lost or its relay died before marking.
                    tracing::info!(entry = entry.id, job = %id, "follow-up job already enqueued; not again");
                    Attempt::Delivered
                }
                // Added, or folded into a pending job (debounced): delivered.
                Ok(_) => Attempt::Delivered,
                Err(e) if e.is_retryable() => Attempt::Failed(e.to_string()),
                Err(e) => Attempt::Refused(e.to_string()),
            }
        }
    }
}

/// The id of an entry's follow-up job: the same for every delivery of the entry, and
/// different for every other entry (its scope and key name the job, the transaction and the
/// push).
fn follow_up_id(sink: &str, entry: &OutboxEntry) -> crate::JobId {
    /// Palisade's namespace for follow-up job ids (a random UUID, fixed forever: changing it
    /// would let an upgraded relay enqueue an entry a second time).
    const FOLLOW_UPS: uuid::Uuid = uuid::Uuid::from_u128(0x5b0f6f0e_3c2a_4f8e_9a51_6c1d2b7e4a90);
    let name = format!("{sink}\n{}\n{}", entry.target, entry.idempotency_key());
    uuid::Uuid::new_v5(&FOLLOW_UPS, name.as_bytes()).into()
}

/// Marks the entry after an attempt and counts it.
async fn settle(sink: &PostgresSink, config: &RelayConfig, entry: &OutboxEntry, attempt: Attempt) {
    let target = entry.target.clone();
    let marked = match attempt {
        Attempt::Delivered => {
            counter!(m::OUTBOX_DELIVERED, "target" => target).increment(1);
            sink.outbox_delivered(entry).await
        }
        Attempt::Failed(why) if entry.attempts < config.max_attempts as i32 => {
            counter!(m::OUTBOX_RETRIED, "target" => target).increment(1);
            tracing::info!(id = entry.id, attempts = entry.attempts, error = %why, "outbox delivery failed; will retry");
            let delay = config.delay_after(entry.attempts);
            sink.outbox_failed(entry, &why, Some(delay)).await
        }
        Attempt::Failed(why) | Attempt::Refused(why) => {
            counter!(m::OUTBOX_DEAD, "target" => target).increment(1);
            tracing::warn!(id = entry.id, attempts = entry.attempts, error = %why, "outbox entry is dead");
            sink.outbox_failed(entry, &why, None).await
        }
    };
    match marked {
        Ok(true) => {}
        // Our lease ran out first: another relay may deliver it again (at least once).
        Ok(false) => tracing::warn!(
            id = entry.id,
            "outbox lease lost before the entry was marked"
        ),
        Err(e) => tracing::warn!(id = entry.id, error = %e, "outbox entry could not be marked"),
    }
}

impl Actor for OutboxRelay {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        for target in self.names.iter() {
            for metric in [m::OUTBOX_DELIVERED, m::OUTBOX_RETRIED, m::OUTBOX_DEAD] {
                counter!(metric, "target" => target.clone()).increment(0);
            }
        }
        self.round(ctx);
        ctx.run_interval(self.config.poll, |act, ctx| act.round(ctx));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pinned: a previous release's relay computes the same id for the same entry, so an
    /// entry delivered by one release and again by the next adds one job. Computed apart from
    /// this code (Python's `uuid.uuid5` over the namespace and `"<sink>\n<target>\n<scope>/<key>"`).
    /// Never update the literal to make it pass.
    #[test]
    fn golden_a_follow_up_id_is_uuid5_of_sink_target_and_key() {
        let entry = OutboxEntry {
            id: 1,
            target: "receipts.send".into(),
            scope: "orders:7".into(),
            key: "receipt".into(),
            payload: serde_json::Value::Null,
            attempts: 1,
            lease: uuid::Uuid::nil(),
        };
        assert_eq!(entry.idempotency_key(), "orders:7/receipt");
        assert_eq!(
            follow_up_id("pg", &entry).to_string(),
            "8f185d36-dcad-5553-b956-49d591329a29"
        );
    }

    #[test]
    fn a_follow_up_id_is_the_same_for_every_delivery_of_an_entry_and_only_for_it() {
        let entry = OutboxEntry {
            id: 7,
            target: "jobs".into(),
            scope: "order:1".into(),
            key: "job/tx/ship/next".into(),
            payload: serde_json::Value::Null,
            attempts: 1,
            lease: uuid::Uuid::new_v4(),
        };
        // Another attempt, by another relay, under another lease: the same job.
        let again = OutboxEntry {
            id: 7,
            attempts: 5,
            lease: uuid::Uuid::new_v4(),
            ..entry.clone()
        };
        assert_eq!(
            follow_up_id("billing", &entry),
            follow_up_id("billing", &again)
        );
        // The same key in another sink, target or scope, or another key: another job.
        let mut others = vec![follow_up_id("shipping", &entry)];
        for change in [
            |e: &mut OutboxEntry| e.target = "jobs2".into(),
            |e: &mut OutboxEntry| e.scope = "order:2".into(),
            |e: &mut OutboxEntry| e.key = "job/tx/ship/other".into(),
        ] {
            let mut e = entry.clone();
            change(&mut e);
            others.push(follow_up_id("billing", &e));
        }
        others.push(follow_up_id("billing", &entry));
        let distinct: std::collections::HashSet<_> = others.iter().collect();
        assert_eq!(distinct.len(), others.len(), "{others:?}");
    }

    #[test]
    fn backoff_doubles_is_capped_and_jittered_down_to_half() {
        let config = RelayConfig {
            backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(1000),
            ..RelayConfig::default()
        };
        for _ in 0..100 {
            let first = config.delay_after(1);
            assert!((50..=100).contains(&first.as_millis()), "{first:?}");
            let fourth = config.delay_after(4);
            assert!((400..=800).contains(&fourth.as_millis()), "{fourth:?}");
            let late = config.delay_after(i32::MAX);
            assert!((500..=1000).contains(&late.as_millis()), "{late:?}");
        }
    }
}
