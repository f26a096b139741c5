//! What the operator console and the HTTP API both read the same way: queue rows, dead
//! letters found, and the Host names a server answers to. Shared here so
//! neither imports the other's module.

use std::net::SocketAddr;
use std::time::Duration;

use palisade::store::{Inspect, QueueAdmin, RecordStore, Stores};
use palisade::{DeadJob, JobId, QueueCounts, RateLimit};

/// Dead letters a search or a job lookup reads per queue, newest first.
pub(crate) const DEAD_SCAN: usize = 5_000;

/// One queue's row on the dashboard and the queues page.
pub(crate) struct QueueRow {
    pub name: String,
    pub counts: QueueCounts,
    pub oldest: Option<Duration>,
    pub paused: bool,
    pub limit: Option<RateLimit>,
}

/// Every queue with its counts, age of the next ready job, pause and rate limit; and the
/// queues that cannot be read until repaired, with why (`Error::leaves_queue_out`).
pub(crate) async fn queue_rows(
    store: &Stores,
) -> palisade::Result<(Vec<QueueRow>, Vec<(String, String)>)> {
    let (rows, unreadable, _) = queue_rows_page(store, 0, usize::MAX).await?;
    Ok((rows, unreadable))
}

/// [`queue_rows`] of the queues `offset..offset + limit` by name, and how many queues there
/// are: a page reads its own queues' counts, so its cost does not grow with the queues
/// beyond it (5,000 queues made the console's page take 2 s).
pub(crate) async fn queue_rows_page(
    store: &Stores,
    offset: usize,
    limit: usize,
) -> palisade::Result<(Vec<QueueRow>, Vec<(String, String)>, usize)> {
    let paused = store.paused().await?;
    let mut names = store.queues().await?;
    names.sort_unstable();
    let total = names.len();
    let (mut rows, mut unreadable) = (Vec::new(), Vec::new());
    let read = names.into_iter().skip(offset).take(limit).map(|queue| {
        let is_paused = paused.contains(&queue);
        async move { (queue.clone(), queue_row(store, queue, is_paused).await) }
    });
    for (queue, row) in at_once(read).await {
        match row {
            Ok(row) => rows.push(row),
            Err(e) if e.leaves_queue_out(&queue, "queues") => {
                unreadable.push((queue, e.to_string()))
            }
            Err(e) => return Err(e),
        }
    }
    Ok((rows, unreadable, total))
}

/// How many reads of queues a view keeps in flight at once: a view of thousands of queues
/// waits for a round trip per 16 of them, not per queue (5,000 took 0.6 s one by one).
const IN_FLIGHT: usize = 16;

/// `reads` run [`IN_FLIGHT`] at a time, their answers in their order.
pub(crate) async fn at_once<T>(
    reads: impl Iterator<Item = impl std::future::Future<Output = T>>,
) -> Vec<T> {
    use futures_util::StreamExt as _;
    futures_util::stream::iter(reads)
        .buffered(IN_FLIGHT)
        .collect()
        .await
}

/// Each of `queues` with its counts (or why they could not be read), in order.
pub(crate) async fn counts_of(
    store: &Stores,
    queues: Vec<String>,
) -> Vec<(String, palisade::Result<palisade::QueueCounts>)> {
    at_once(queues.into_iter().map(|queue| async move {
        let counts = store.counts(&queue).await;
        (queue, counts)
    }))
    .await
}

/// One queue's counts, age of the next ready job and rate limit; `paused` as the caller read it.
pub(crate) async fn queue_row(
    store: &Stores,
    name: String,
    paused: bool,
) -> palisade::Result<QueueRow> {
    Ok(QueueRow {
        counts: store.counts(&name).await?,
        oldest: store.oldest_ready(&name).await?,
        paused,
        limit: store.rate_limit(&name).await?,
        name,
    })
}

/// Queues that have dead jobs, with how many; and the queues that cannot be read until
/// repaired, with why (`Error::leaves_queue_out`).
pub(crate) async fn dead_counts(
    store: &Stores,
) -> palisade::Result<(Vec<(String, u64)>, Vec<(String, String)>)> {
    let (mut out, mut unreadable) = (Vec::new(), Vec::new());
    for (queue, counts) in counts_of(store, store.queues().await?).await {
        let dead = match counts {
            Ok(counts) => counts.dead,
            Err(e) if e.leaves_queue_out(&queue, "queues") => {
                unreadable.push((queue, e.to_string()));
                continue;
            }
            Err(e) => return Err(e),
        };
        if dead > 0 {
            out.push((queue, dead));
        }
    }
    Ok((out, unreadable))
}

/// The newest `n` dead jobs of `queue` (at most), newest first.
pub(crate) async fn newest_dead(
    store: &Stores,
    queue: &str,
    total: u64,
    n: usize,
) -> palisade::Result<Vec<DeadJob>> {
    let total = usize::try_from(total).unwrap_or(usize::MAX);
    let mut rows = store.dead_range(queue, total.saturating_sub(n), n).await?;
    rows.reverse();
    Ok(rows)
}

/// Dead job `id`, searched among every queue's newest [`DEAD_SCAN`] dead letters (among
/// `only`'s, when the caller knows its queue).
pub(crate) async fn find_dead(
    store: &Stores,
    id: JobId,
    only: Option<&str>,
) -> palisade::Result<Option<DeadJob>> {
    let queues = match only {
        Some(queue) => vec![(queue.to_owned(), store.counts(queue).await?.dead)],
        None => dead_counts(store).await?.0,
    };
    for (queue, n) in queues {
        if let Some(d) = newest_dead(store, &queue, n, DEAD_SCAN)
            .await?
            .into_iter()
            .find(|d| d.job.id == id)
        {
            return Ok(Some(d));
        }
    }
    Ok(None)
}

/// Jobs [`clear_queue`] lists and cancels per round.
const CLEAR_STEP: usize = 500;

/// Counts a request `surface` (`api`, `ui`) refused before any endpoint ran
/// (`palisade_http_refused_total{surface, reason}`) and logs it — at most once per 10 s per
/// surface and reason, saying how many were held back, with the path cut to 120 bytes: a
/// refusal costs whoever sends it nothing, so it must not cost the server's disk either (300
/// refused requests wrote 17 MiB of log before, issue 58).
pub(crate) fn note_refused(surface: &'static str, reason: &'static str, method: &str, path: &str) {
    metrics::counter!(palisade::metrics::HTTP_REFUSED, "surface" => surface, "reason" => reason)
        .increment(1);
    let mut cut = path.len().min(120);
    while !path.is_char_boundary(cut) {
        cut -= 1;
    }
    let key = format!("{surface}/{reason}")
        .bytes()
        .fold(0u64, |h, b| h.wrapping_mul(131).wrapping_add(u64::from(b)));
    palisade::cli_support::warn_repeated!(key = key; surface, reason, method, path = &path[..cut], "request refused");
}

/// The deepest a page of live jobs reaches: a page past it is refused (each page reads every
/// job before it, so a deep page costs Redis as much as the jobs it skips).
pub(crate) const MAX_LIST_OFFSET: usize = 10_000;

/// A page of queue `queue`'s ready jobs (next first) or, with `ready` false, its delayed ones
/// (soonest first): `limit` after the first `offset`, which is at most [`MAX_LIST_OFFSET`].
pub(crate) async fn live_page(
    store: &Stores,
    queue: &str,
    ready: bool,
    offset: usize,
    limit: usize,
) -> palisade::Result<Vec<palisade::JobView>> {
    if offset > MAX_LIST_OFFSET {
        return Err(palisade::Error::Config(format!(
            "offset {offset}: at most {MAX_LIST_OFFSET}"
        )));
    }
    let through = offset.saturating_add(limit);
    let mut views = if ready {
        store.ready(queue, through).await?
    } else {
        store.delayed(queue, through).await?
    };
    Ok(views.split_off(offset.min(views.len())))
}

/// Cancels the ready and delayed jobs of `queue` (each to the dead letters with `reason`, so
/// `dead retry` brings it back) that were enqueued by `enqueued_by_ms` (the coordinator's
/// clock when the operator was shown the queue; a job of a release that kept no enqueue time
/// counts as enqueued before), in rounds of 500, at most `at_most`. Jobs enqueued meanwhile
/// stay, whatever their priority (found by an attack: a count alone let newer jobs take the
/// confirmed ones' places). A job of a group is neither listed nor cancelled. A job claimed
/// between its listing and its cancel is stopped as `cancel` stops a running job (its lease
/// revoked, its late writes fenced). Returns how many were cancelled.
pub(crate) async fn clear_queue(
    store: &Stores,
    queue: &str,
    reason: &str,
    at_most: u64,
    enqueued_by_ms: u64,
) -> palisade::Result<u64> {
    let mut cancelled = 0u64;
    // How deep each round looks: past newer jobs at the head, doubling up to a bound.
    let mut window = CLEAR_STEP;
    while cancelled < at_most {
        let ready = store.ready(queue, window).await?;
        let delayed = store.delayed(queue, window).await?;
        let full = ready.len() == window || delayed.len() == window;
        let mut round: Vec<JobId> = ready
            .into_iter()
            .chain(delayed)
            .filter(|v| v.details.enqueued_ms.is_none_or(|at| at <= enqueued_by_ms))
            .map(|v| v.job.id)
            .collect();
        round.truncate(usize::try_from(at_most - cancelled).unwrap_or(usize::MAX));
        if round.is_empty() {
            if full && window < MAX_LIST_OFFSET {
                window = (window * 2).min(MAX_LIST_OFFSET);
                continue;
            }
            break;
        }
        let mut progressed = false;
        for id in round {
            if store.cancel(id, reason).await? != palisade::Cancelled::Missing {
                cancelled += 1;
                progressed = true;
            }
        }
        if !progressed {
            break;
        }
    }
    Ok(cancelled)
}

/// Where a job looked up by id was found ([`find_job`]).
pub(crate) enum Found {
    /// Queued or running.
    Live(palisade::JobView),
    /// Among the dead letters.
    Dead(DeadJob),
    /// Completed, its record kept.
    Completed(palisade::CompletedJob),
    /// Completed, its record gone (or never kept) but its result kept.
    Result(String),
}

/// Job `id` wherever the coordinator still knows it: live, else completed, else dead (among
/// the newest [`DEAD_SCAN`] dead letters of `only`, or of every queue), else only its result.
pub(crate) async fn find_job(
    store: &Stores,
    id: JobId,
    only: Option<&str>,
) -> palisade::Result<Option<Found>> {
    if let Some(view) = store.job(id).await? {
        return Ok(Some(Found::Live(view)));
    }
    if let Some(done) = store.completed(id).await? {
        return Ok(Some(Found::Completed(done)));
    }
    if let Some(dead) = find_dead(store, id, only).await? {
        return Ok(Some(Found::Dead(dead)));
    }
    Ok(store.result(id).await?.map(Found::Result))
}

/// The Host header values the page answers to: the listen address, localhost on its port,
/// and the operator's `--public-host` names.
pub(crate) fn allowed_hosts(listen: SocketAddr, public: &[String]) -> Vec<String> {
    let port = listen.port();
    let mut hosts = vec![
        listen.to_string(),
        format!("localhost:{port}"),
        format!("127.0.0.1:{port}"),
        format!("[::1]:{port}"),
    ];
    if port == 80 {
        // Browsers leave the default port out.
        hosts.extend([
            listen.ip().to_string(),
            "localhost".into(),
            "127.0.0.1".into(),
            "[::1]".into(),
        ]);
    }
    for host in public.iter().map(|h| h.to_ascii_lowercase()) {
        // A browser leaves a default port (443 for https, 80 for http) out of the Host it
        // sends: `--public-host jobs.example:443` also matches `jobs.example`.
        if let Some(name) = host
            .strip_suffix(":443")
            .or_else(|| host.strip_suffix(":80"))
        {
            hosts.push(name.to_owned());
        }
        hosts.push(host);
    }
    hosts
}

#[cfg(test)]
mod tests {
    use super::*;
    use palisade::store::{ControlStore, Inspect, LeaseStore};
    use palisade::NewJob;

    /// Found by the attack that filed issue 58: `--public-host name:443` never matched, since
    /// browsers leave the default port out of the Host they send.
    #[test]
    fn a_public_host_on_a_default_port_matches_what_browsers_send() {
        let listen: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        let hosts = allowed_hosts(
            listen,
            &[
                "Jobs.Example:443".into(),
                "plain.example:80".into(),
                "x.example:8443".into(),
            ],
        );
        for host in [
            "jobs.example",
            "jobs.example:443",
            "plain.example",
            "x.example:8443",
        ] {
            assert!(hosts.iter().any(|h| h == host), "{host}: {hosts:?}");
        }
        assert!(!hosts.iter().any(|h| h == "x.example"), "{hosts:?}");
    }

    /// Found by the attack on issue 57: a clear confirmed for two jobs cancelled the two
    /// enqueued after the confirmation instead (at a higher priority, ahead in the queue), and
    /// a group's uncleared jobs in the count let newer jobs in. Only jobs enqueued by the time
    /// the operator was shown the queue go.
    #[test]
    fn a_clear_cancels_only_what_was_there_when_it_was_confirmed() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let store = Stores::from(std::sync::Arc::new(palisade::MemoryLeaseStore::new()));
            let job = |to: &str| NewJob::raw("k", format!("\"{to}\"")).with_queue("q");
            let old = store
                .enqueue(vec![
                    job("old-1"),
                    job("old-2"),
                    job("g").with_group("tenant"),
                ])
                .await
                .unwrap();
            let shown = u64::try_from(store.now_ms().await.unwrap()).unwrap();
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            let new = store
                .enqueue(vec![
                    job("new-1").with_priority(10),
                    job("new-2").with_priority(10),
                ])
                .await
                .unwrap();
            // The count shown: 3 ready (the group's among them).
            let cancelled = clear_queue(&store, "q", "cleared", 3, shown).await.unwrap();
            assert_eq!(cancelled, 2);
            for id in &old[..2] {
                assert!(store.job(*id).await.unwrap().is_none(), "old cancelled");
            }
            for id in new.iter().chain(&old[2..]) {
                assert!(
                    store.job(*id).await.unwrap().is_some(),
                    "new and grouped stay"
                );
            }
        });
    }
}
