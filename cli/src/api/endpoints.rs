//! The endpoints under `/api/v1`. Each is registered with its OpenAPI entry in one step
//! (`routes!` reads the handler's `#[utoipa::path]`), so no route is served without one.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::model::{
    idempotency_key, idempotent_flow_id, parse, ApiError, BatchEnqueued, BatchRequest,
    CancelOutcome, CancelResult, ClearRequest, Cleared, DeadPage, DeadQuery, Empty, Enqueued,
    ErrorBody, FlowCancelled, FlowCreated, FlowRequest, FlowView, JobQuery, JobRequest, JobStatus,
    JobsPage, JobsQuery, LiveState, Paused, Purged, QueueList, QueueStatus, Retried, RetryRequest,
    UnreadableQueue, WaitpointCompleted, WaitpointOutcome, WaitpointRequest, WaitpointView,
    MAX_BATCH, MAX_DEAD_OFFSET,
};
use super::model::{rows, IdempotencyKey, Name};
use super::Api;
use palisade::cli_support::check_name;
use palisade::store::{FlowStore, Inspect, QueueAdmin, RecordStore};
use palisade::{FlowId, JobId};

/// The document's fixed parts: title, version, the bearer scheme, the shared error schema.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "Palisade",
        description = "Enqueue fenced jobs and watch them from any language. Every failure is \
                       `{\"error\": {\"code\", \"message\", \"retryable\"}}`. Requests that \
                       change anything send `Content-Type: application/json`; off loopback \
                       every request but this document's carries `Authorization: Bearer <token>`."
    ),
    modifiers(&BearerAuth),
    security(("bearer" = [])),
    components(schemas(ErrorBody, IdempotencyKey, LiveState, Name)),
    tags(
        (name = "jobs", description = "Enqueue jobs, read their state and results, cancel them"),
        (name = "queues", description = "Counts (queue depth), pause and resume, dead letters"),
        (name = "flows", description = "DAGs of jobs created all or nothing"),
        (name = "waitpoints", description = "What durable runs wait for: complete one (an approval, a webhook's event) to resume its run"),
    )
)]
struct Doc;

/// Declares the bearer scheme the document's `security` names.
struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// Every operation's refusals and failures: every request passes the one guard and answers
/// every failure as an [`ErrorBody`], so each entry lists them from here rather than each
/// handler's repeating them.
struct Errors;

impl utoipa::Modify for Errors {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::{ContentBuilder, Ref, RefOr, ResponseBuilder};
        let error = |description: &str| {
            let body = ContentBuilder::new()
                .schema(Some(RefOr::Ref(Ref::from_schema_name("ErrorBody"))))
                .build();
            RefOr::T(
                ResponseBuilder::new()
                    .description(description)
                    .content("application/json", body)
                    .build(),
            )
        };
        for item in openapi.paths.paths.values_mut() {
            for op in [
                &mut item.get,
                &mut item.post,
                &mut item.put,
                &mut item.delete,
                &mut item.patch,
            ]
            .into_iter()
            .flatten()
            {
                let responses = &mut op.responses.responses;
                responses
                    .entry("4XX".into())
                    .or_insert_with(|| error("Refused: nothing was added, changed or created"));
                responses.entry("5XX".into()).or_insert_with(|| {
                    error("Failed; `retryable` says whether to send the same request again")
                });
            }
        }
    }
}

/// Every endpoint, and the document with each one's entry.
pub(super) fn split() -> (axum::Router<Arc<Api>>, utoipa::openapi::OpenApi) {
    let (router, mut doc) = routes().split_for_parts();
    // After the routes: the derive's own modifiers run before any path is added.
    utoipa::Modify::modify(&Errors, &mut doc);
    (router, doc)
}

/// Every endpoint with its entry.
fn routes() -> OpenApiRouter<Arc<Api>> {
    OpenApiRouter::with_openapi(Doc::openapi())
        .routes(routes!(openapi))
        .routes(routes!(enqueue))
        .routes(routes!(enqueue_batch))
        .routes(routes!(job))
        .routes(routes!(cancel))
        .routes(routes!(queues))
        .routes(routes!(queue))
        .routes(routes!(pause))
        .routes(routes!(resume))
        .routes(routes!(dead))
        .routes(routes!(queue_jobs))
        .routes(routes!(clear_queue))
        .routes(routes!(retry_dead))
        .routes(routes!(purge_dead))
        .routes(routes!(retry_dead_job))
        .routes(routes!(create_flow))
        .routes(routes!(flow))
        .routes(routes!(cancel_flow))
        .routes(routes!(complete_waitpoint, waitpoint))
}

/// The request's body, or a 413 / 400 saying why it could not be read.
fn body(api: &Api, body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "too_large",
                format!(
                    "the request body is larger than {} bytes",
                    super::body_limit(api.max_payload_bytes)
                ),
            )
        } else {
            ApiError::invalid(format!("request body: {e}"))
        }
    })
}

/// An action's body: `{}` or nothing; a field (a typo'd option, a reason the action does not
/// take) is refused rather than ignored.
fn no_fields(api: &Api, raw: Result<Bytes, BytesRejection>) -> Result<(), ApiError> {
    let _: Empty = parse(&body(api, raw)?)?;
    Ok(())
}

/// The `Idempotency-Key` header, if sent.
fn idempotency(headers: &HeaderMap) -> Result<Option<&str>, ApiError> {
    headers
        .get("idempotency-key")
        .map(|v| {
            v.to_str()
                .map_err(|_| ApiError::invalid("Idempotency-Key is not visible ASCII"))
        })
        .transpose()
}

/// The W3C trace context the request carries (`traceparent`, `tracestate`): the jobs it makes
/// continue that trace. One that is not valid is ignored, as W3C Trace Context says.
fn trace(headers: &HeaderMap) -> Option<palisade::TraceContext> {
    let text = |name| headers.get(name).and_then(|v| v.to_str().ok());
    palisade::TraceContext::from_w3c(text("traceparent")?, text("tracestate"))
}

fn job_id(id: &str) -> Result<JobId, ApiError> {
    id.parse::<uuid::Uuid>()
        .map(JobId::from)
        .map_err(|_| ApiError::not_found(format!("{id:?} is not a job id (a UUID)")))
}

/// The 404 of a flow the coordinator does not keep.
fn flow_not_kept(id: FlowId) -> ApiError {
    ApiError::not_found(format!(
        "flow {id} is not kept (never created, or finished and forgotten)"
    ))
}

fn flow_id(id: &str) -> Result<FlowId, ApiError> {
    id.parse::<uuid::Uuid>()
        .map(FlowId::from)
        .map_err(|_| ApiError::not_found(format!("{id:?} is not a flow id (a UUID)")))
}

/// A queue named in the path, by the library's name rules (a name with a trailing space is
/// refused, never taken for another).
fn queue_name(queue: &str) -> Result<(), ApiError> {
    Ok(check_name("queue", queue)?)
}

/// This document.
#[utoipa::path(get, path = "/api/v1/openapi.json", tag = "jobs", security(()),
    responses(
        (status = 200, description = "The OpenAPI 3.1 document", content_type = "application/json"),
    ))]
async fn openapi(State(api): State<Arc<Api>>) -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        api.openapi.clone(),
    )
        .into_response()
}

/// Enqueue one job. With an `Idempotency-Key` header a retried request (a lost reply, a
/// client timeout) adds nothing and answers the first job's id with `created: false`; the
/// same key with a different job is refused (422 `idempotency_key_reused`).
#[utoipa::path(post, path = "/api/v1/jobs", tag = "jobs",
    request_body = JobRequest,
    params(("Idempotency-Key" = Option<IdempotencyKey>, Header,
        description = "Makes the request idempotent for a day (the job's unique key)"),
        ("traceparent" = Option<String>, Header, description = "W3C trace context: the job's attempts are spans in this trace"),
        ("tracestate" = Option<String>, Header, description = "W3C trace state, with traceparent")),
    responses(
        (status = 201, description = "Added", body = Enqueued),
        (status = 200, description = "Nothing added: another job holds the key or id, or the job was debounced into a pending one", body = Enqueued),
    ))]
async fn enqueue(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    raw: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<Enqueued>), ApiError> {
    let request: JobRequest = parse(&body(&api, raw)?)?;
    let unique = idempotency(&headers)?
        .map(|k| idempotency_key(k, None))
        .transpose()?;
    let idempotent = unique.is_some() || request.is_idempotent();
    let mut job = request.job(&api.registry, api.max_payload_bytes, unique)?;
    job.trace = trace(&headers);
    let done: Enqueued = palisade::cli_support::enqueue_counted(&api.store, vec![job])
        .await
        .map_err(|e| ApiError::from(e).unless_idempotent(idempotent))?
        .into_iter()
        .next()
        .ok_or_else(|| ApiError::from(palisade::Error::Backend("enqueue answered no job".into())))?
        .into();
    let status = if done.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(done)))
}

/// Enqueue up to 1,000 jobs all or nothing, in one round trip. One bad job refuses the batch
/// and the error names it (`jobs[3]: ...`). Under an `Idempotency-Key` the same batch again
/// answers its jobs; a different batch (a job changed, added or left out) is refused whole
/// (422 `idempotency_key_reused`).
#[utoipa::path(post, path = "/api/v1/jobs/batch", tag = "jobs",
    request_body = BatchRequest,
    params(("Idempotency-Key" = Option<IdempotencyKey>, Header,
        description = "Makes the request idempotent for a day (job i's unique key is the key and i)"),
        ("traceparent" = Option<String>, Header, description = "W3C trace context: the job's attempts are spans in this trace"),
        ("tracestate" = Option<String>, Header, description = "W3C trace state, with traceparent")),
    responses(
        (status = 200, description = "Each job added or found", body = BatchEnqueued),
    ))]
async fn enqueue_batch(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Json<BatchEnqueued>, ApiError> {
    let request: BatchRequest = parse(&body(&api, raw)?)?;
    if request.jobs.is_empty() || request.jobs.len() > MAX_BATCH {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_job",
            format!("{} jobs; a batch has 1 to {MAX_BATCH}", request.jobs.len()),
        ));
    }
    let key = idempotency(&headers)?;
    let trace = trace(&headers);
    let mut jobs = Vec::with_capacity(request.jobs.len());
    for (i, r) in request.jobs.iter().enumerate() {
        let unique = key.map(|k| idempotency_key(k, Some(i))).transpose()?;
        let mut job = r
            .job(&api.registry, api.max_payload_bytes, unique)
            .map_err(|e| e.within(&format!("jobs[{i}]")))?;
        job.trace = trace.clone();
        jobs.push(job);
    }
    // Under a header key every job carries the batch's fingerprint: another batch under the
    // key (one job changed, one more or one fewer) is refused whole, not half matched.
    if key.is_some() {
        // (Each job carries its own already, `JobRequest::job`'s: of its canonical payload.)
        let batch = palisade::rules::batch_fingerprint(
            jobs.iter()
                .filter_map(|j| j.unique.as_ref()?.fingerprint.as_deref()),
        );
        for job in &mut jobs {
            if let Some(u) = job.unique.as_mut() {
                u.fingerprint = Some(batch.clone());
            }
        }
    }
    palisade::cli_support::validate_batch(&jobs, api.max_payload_bytes)?;
    let idempotent = key.is_some() || request.jobs.iter().all(JobRequest::is_idempotent);
    let done = palisade::cli_support::enqueue_counted(&api.store, jobs)
        .await
        .map_err(|e| ApiError::from(e).unless_idempotent(idempotent))?;
    Ok(Json(BatchEnqueued {
        jobs: done.into_iter().map(Enqueued::from).collect(),
    }))
}

/// A job's state, times, attempts, result and progress. A completed job is kept for the
/// workers' `--keep-completed` (a day, at most 10,000, by default), and after that known by its
/// result alone (kept a day, for kinds registered with one); a dead one is found among its
/// queue's newest 5,000 dead letters (every queue's, unless `queue` names it: a poller that
/// knows the queue should say it, the search reads those records).
#[utoipa::path(get, path = "/api/v1/jobs/{id}", tag = "jobs",
    params(("id" = String, Path, description = "The job's id"), JobQuery),
    responses(
        (status = 200, description = "Done", body = JobStatus),
        (status = 404, description = "No live, completed or dead job has this id", body = ErrorBody),
    ))]
async fn job(
    State(api): State<Arc<Api>>,
    Path(id): Path<String>,
    query: Result<Query<JobQuery>, QueryRejection>,
) -> Result<Json<JobStatus>, ApiError> {
    let id = job_id(&id)?;
    let Query(q) = query.map_err(|e| ApiError::invalid(e.body_text()))?;
    let store = &api.store;
    let Some(found) = crate::reads::find_job(store, id, q.queue.as_deref()).await? else {
        return Err(ApiError::not_found(format!(
            "no live, completed or dead job has id {id} (a completed job is kept for the \
             workers' --keep-completed, a day by default)"
        )));
    };
    let progress = store.progress(id).await?;
    Ok(Json(JobStatus::of(id, found, progress)))
}

/// Cancel a job: queued, it goes to the dead letters; running, its lease is revoked, so its
/// late fenced writes are refused.
#[utoipa::path(post, path = "/api/v1/jobs/{id}/cancel", tag = "jobs",
    request_body(content = Empty, content_type = "application/json", description = "`{}` (an empty body is read as `{}`); the Content-Type is required"),
    params(("id" = String, Path, description = "The job's id")),
    responses(
        (status = 200, description = "Done", body = CancelResult),
        (status = 404, description = "Not queued or running (unknown, completed or dead)", body = ErrorBody),
    ))]
async fn cancel(
    State(api): State<Arc<Api>>,
    Path(id): Path<String>,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Json<CancelResult>, ApiError> {
    let id = job_id(&id)?;
    no_fields(&api, raw)?;
    let outcome = match api
        .store
        .cancel(id, "cancelled through the HTTP API")
        .await?
    {
        palisade::Cancelled::Removed => CancelOutcome::Removed,
        palisade::Cancelled::Revoked => CancelOutcome::Revoked,
        palisade::Cancelled::Missing => {
            return Err(ApiError::not_found(format!(
                "job {id} is not queued or running: nothing done"
            )))
        }
    };
    Ok(Json(CancelResult { outcome }))
}

/// Every queue the coordinator knows, with its counts.
#[utoipa::path(get, path = "/api/v1/queues", tag = "queues",
    responses((status = 200, description = "Done", body = QueueList)))]
async fn queues(State(api): State<Arc<Api>>) -> Result<Json<QueueList>, ApiError> {
    let (rows, unreadable) = crate::reads::queue_rows(&api.store).await?;
    Ok(Json(QueueList {
        queues: rows.into_iter().map(QueueStatus::from).collect(),
        unreadable: unreadable
            .into_iter()
            .map(|(queue, error)| UnreadableQueue { queue, error })
            .collect(),
    }))
}

/// One queue's counts: `counts.ready` is the depth an autoscaler scales on. A queue no job
/// was ever enqueued to answers zeros (an autoscaler reads 0, not an error).
#[utoipa::path(get, path = "/api/v1/queues/{queue}", tag = "queues",
    params(("queue" = Name, Path, description = "The queue's name (percent-encoded)")),
    responses((status = 200, description = "Done", body = QueueStatus)))]
async fn queue(
    State(api): State<Arc<Api>>,
    Path(queue): Path<String>,
) -> Result<Json<QueueStatus>, ApiError> {
    queue_name(&queue)?;
    let paused = api.store.paused().await?.contains(&queue);
    let row = crate::reads::queue_row(&api.store, queue, paused).await?;
    Ok(Json(row.into()))
}

/// Stop claims from a queue (running jobs finish; nothing is moved or lost).
#[utoipa::path(post, path = "/api/v1/queues/{queue}/pause", tag = "queues",
    request_body(content = Empty, content_type = "application/json", description = "`{}` (an empty body is read as `{}`); the Content-Type is required"),
    params(("queue" = Name, Path, description = "The queue's name")),
    responses((status = 200, description = "Done", body = Paused)))]
async fn pause(
    State(api): State<Arc<Api>>,
    Path(queue): Path<String>,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Json<Paused>, ApiError> {
    no_fields(&api, raw)?;
    set_paused(&api, queue, true).await
}

/// Let workers claim from a paused queue again.
#[utoipa::path(post, path = "/api/v1/queues/{queue}/resume", tag = "queues",
    request_body(content = Empty, content_type = "application/json", description = "`{}` (an empty body is read as `{}`); the Content-Type is required"),
    params(("queue" = Name, Path, description = "The queue's name")),
    responses((status = 200, description = "Done", body = Paused)))]
async fn resume(
    State(api): State<Arc<Api>>,
    Path(queue): Path<String>,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Json<Paused>, ApiError> {
    no_fields(&api, raw)?;
    set_paused(&api, queue, false).await
}

async fn set_paused(api: &Api, queue: String, paused: bool) -> Result<Json<Paused>, ApiError> {
    queue_name(&queue)?;
    api.store.set_paused(&queue, paused).await?;
    tracing::info!(queue = %queue, paused, "api: queue paused or resumed");
    Ok(Json(Paused { queue, paused }))
}

/// Clear a queue: cancel every ready and delayed job it holds as the request comes (each goes to
/// the dead letters with the reason, where a dead-letter retry brings it back); jobs enqueued
/// meanwhile, a group's ready jobs and jobs waiting behind their scope stay, and are counted in
/// the answer.
#[utoipa::path(post, path = "/api/v1/queues/{queue}/clear", tag = "queues",
    params(("queue" = Name, Path, description = "The queue's name")),
    request_body(content = ClearRequest, content_type = "application/json", description = "`{}` or `{\"reason\": ...}` (an empty body is read as `{}`); the Content-Type is required"),
    responses((status = 200, description = "Done", body = Cleared)))]
async fn clear_queue(
    State(api): State<Arc<Api>>,
    Path(queue): Path<String>,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Json<Cleared>, ApiError> {
    queue_name(&queue)?;
    let raw = body(&api, raw)?;
    let request: ClearRequest = if raw.is_empty() {
        ClearRequest::default()
    } else {
        parse(&raw)?
    };
    let reason = match request.reason {
        Some(r) if r.trim().is_empty() || r.len() > 1000 => {
            return Err(ApiError::invalid(
                "reason: 1 to 1000 bytes, not only spaces",
            ))
        }
        Some(r) => r,
        None => "queue cleared through the HTTP API".to_owned(),
    };
    // What the queue holds as the request comes: jobs enqueued meanwhile stay.
    let now = u64::try_from(palisade::store::ControlStore::now_ms(&api.store).await?).unwrap_or(0);
    let before = api.store.counts(&queue).await?;
    let at_most = before.ready + before.delayed;
    let cancelled = crate::reads::clear_queue(&api.store, &queue, &reason, at_most, now).await?;
    let after = api.store.counts(&queue).await?;
    tracing::info!(queue = %queue, cancelled, "api: queue cleared");
    Ok(Json(Cleared {
        cancelled,
        ready: after.ready,
        delayed: after.delayed,
        waiting: after.waiting,
    }))
}

/// A queue's ready jobs (next to be claimed first; a group's are not listed) or its delayed
/// ones (soonest due first).
#[utoipa::path(get, path = "/api/v1/queues/{queue}/jobs", tag = "queues",
    params(("queue" = Name, Path, description = "The queue's name"), JobsQuery),
    responses((status = 200, description = "Done", body = JobsPage)))]
async fn queue_jobs(
    State(api): State<Arc<Api>>,
    Path(queue): Path<String>,
    query: Result<Query<JobsQuery>, QueryRejection>,
) -> Result<Json<JobsPage>, ApiError> {
    queue_name(&queue)?;
    let Query(q) = query.map_err(|e| ApiError::invalid(e.body_text()))?;
    let limit = rows(q.limit)?;
    let offset = q.offset.unwrap_or(0);
    if offset > crate::reads::MAX_LIST_OFFSET {
        return Err(ApiError::invalid(format!(
            "offset {offset}: at most {}",
            crate::reads::MAX_LIST_OFFSET
        )));
    }
    let ready = matches!(q.state, None | Some(LiveState::Ready));
    let views = crate::reads::live_page(&api.store, &queue, ready, offset, limit).await?;
    let jobs = views
        .into_iter()
        .map(|v| JobStatus::of(v.job.id, crate::reads::Found::Live(v), None))
        .collect();
    Ok(Json(JobsPage { jobs }))
}

/// A page of a queue's dead letters, newest first.
#[utoipa::path(get, path = "/api/v1/queues/{queue}/dead", tag = "queues",
    params(("queue" = Name, Path, description = "The queue's name"), DeadQuery),
    responses((status = 200, description = "Done", body = DeadPage)))]
async fn dead(
    State(api): State<Arc<Api>>,
    Path(queue): Path<String>,
    query: Result<Query<DeadQuery>, QueryRejection>,
) -> Result<Json<DeadPage>, ApiError> {
    queue_name(&queue)?;
    let Query(q) = query.map_err(|e| ApiError::invalid(e.body_text()))?;
    let limit = rows(q.limit)?;
    let offset = q.offset.unwrap_or(0);
    if offset > MAX_DEAD_OFFSET {
        return Err(ApiError::invalid(format!(
            "offset {offset}: at most {MAX_DEAD_OFFSET}"
        )));
    }
    let total = api.store.counts(&queue).await?.dead;
    let end = usize::try_from(total)
        .unwrap_or(usize::MAX)
        .saturating_sub(offset);
    let start = end.saturating_sub(limit);
    let mut jobs = api.store.dead_range(&queue, start, end - start).await?;
    jobs.reverse();
    Ok(Json(DeadPage {
        total,
        jobs: jobs.into_iter().map(Into::into).collect(),
    }))
}

/// Move a queue's dead letters that the filters take back to it, oldest first, in short
/// steps (each one script over at most 250 records): at most `limit`, by default every one
/// it holds now.
#[utoipa::path(post, path = "/api/v1/queues/{queue}/dead/retry", tag = "queues",
    params(("queue" = Name, Path, description = "The queue's name")),
    request_body = RetryRequest,
    responses((status = 200, description = "Done", body = Retried)))]
async fn retry_dead(
    State(api): State<Arc<Api>>,
    Path(queue): Path<String>,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Json<Retried>, ApiError> {
    let sweep = sweep_dead(&api, &queue, raw, palisade::DeadAction::Retry).await?;
    tracing::info!(queue = %queue, retried = sweep.done, "api: dead letters retried");
    Ok(Json(Retried {
        retried: usize::try_from(sweep.done).unwrap_or(usize::MAX),
        read: Some(sweep.scanned),
        kept: Some(sweep.kept),
    }))
}

/// Delete a queue's dead letters that the filters take for good, oldest first, as `retry`
/// takes them.
#[utoipa::path(post, path = "/api/v1/queues/{queue}/dead/purge", tag = "queues",
    params(("queue" = Name, Path, description = "The queue's name")),
    request_body = RetryRequest,
    responses((status = 200, description = "Done", body = Purged)))]
async fn purge_dead(
    State(api): State<Arc<Api>>,
    Path(queue): Path<String>,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Json<Purged>, ApiError> {
    let sweep = sweep_dead(&api, &queue, raw, palisade::DeadAction::Purge).await?;
    tracing::info!(queue = %queue, purged = sweep.done, "api: dead letters deleted");
    Ok(Json(Purged {
        purged: sweep.done,
        read: sweep.scanned,
    }))
}

/// A whole-set retry or purge as a request asks it.
async fn sweep_dead(
    api: &Api,
    queue: &str,
    raw: Result<Bytes, BytesRejection>,
    action: palisade::DeadAction,
) -> Result<palisade::DeadSweep, ApiError> {
    queue_name(queue)?;
    let request: RetryRequest = parse(&body(api, raw)?)?;
    let filter = request
        .filter()
        .map_err(|e| ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_filter", e))?;
    // At most what the queue holds now: jobs that die again meanwhile wait for the next call
    // (a huge limit on a queue whose jobs keep dying would otherwise never end).
    let dead = api.store.counts(queue).await?.dead;
    let limit = request.limit.map_or(dead, |n| (n as u64).min(dead));
    let last = std::sync::Mutex::new(palisade::DeadSweep::default());
    let done = api
        .store
        .dead_where(queue, &filter, action, limit, &|s| {
            *last
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = s;
        })
        .await;
    done.map_err(|e| {
        // What moved stays moved: say how far it got.
        let s = *last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        ApiError::from(e).within(&format!("after {} done", s.done))
    })
}

/// Move one dead letter back to its queue (found among the queue's newest 5,000).
#[utoipa::path(post, path = "/api/v1/queues/{queue}/dead/{id}/retry", tag = "queues",
    request_body(content = Empty, content_type = "application/json", description = "`{}` (an empty body is read as `{}`); the Content-Type is required"),
    params(("queue" = Name, Path, description = "The queue's name"),
        ("id" = String, Path, description = "The dead job's id")),
    responses(
        (status = 200, description = "Done", body = Retried),
        (status = 404, description = "Not among the newest 5,000 dead letters, or live again", body = ErrorBody),
    ))]
async fn retry_dead_job(
    State(api): State<Arc<Api>>,
    Path((queue, id)): Path<(String, String)>,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Json<Retried>, ApiError> {
    queue_name(&queue)?;
    let id = job_id(&id)?;
    no_fields(&api, raw)?;
    if !api.store.retry_dead_job(&queue, id).await? {
        return Err(ApiError::not_found(format!(
            "dead job {id} is not among the newest {} dead letters of {queue}, or its id is \
             live again: nothing done",
            palisade::store::DEAD_JOB_SEARCH
        )));
    }
    Ok(Json(Retried {
        retried: 1,
        read: None,
        kept: None,
    }))
}

/// Create a flow all or nothing: no step runs before the whole flow exists. Creating the same
/// flow again (the same `id` or `Idempotency-Key`) adds nothing and answers 201 with its id
/// as well; another flow under them (other steps, or steps that run after others) is
/// refused (422 `idempotency_key_reused`).
#[utoipa::path(post, path = "/api/v1/flows", tag = "flows",
    request_body = FlowRequest,
    params(("Idempotency-Key" = Option<IdempotencyKey>, Header,
        description = "Names the flow: the same key, the same flow"),
        ("traceparent" = Option<String>, Header, description = "W3C trace context: the job's attempts are spans in this trace"),
        ("tracestate" = Option<String>, Header, description = "W3C trace state, with traceparent")),
    responses(
        (status = 201, description = "Done", body = FlowCreated),
    ))]
async fn create_flow(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    raw: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<FlowCreated>), ApiError> {
    let request: FlowRequest = parse(&body(&api, raw)?)?;
    let key = idempotency(&headers)?;
    let keyed = key.map(idempotent_flow_id).transpose()?;
    let idempotent = keyed.is_some() || request.is_idempotent();
    let mut flow = request.flow(&api.registry, api.max_payload_bytes, keyed)?;
    if let Some(trace) = trace(&headers) {
        flow.inherit_trace(&trace);
    }
    let id = palisade::Client::new(api.store.clone())
        .create_flow(&flow)
        .await
        .map_err(|e| match (e, key) {
            // (The flow's id is the key's: name the key the client sent.)
            (palisade::Error::Conflict(m), Some(key)) => {
                palisade::Error::Conflict(format!("Idempotency-Key {key:?}: {m}"))
            }
            (e, _) => e,
        })
        .map_err(|e| ApiError::from(e).unless_idempotent(idempotent))?;
    Ok((
        StatusCode::CREATED,
        Json(FlowCreated { id: id.to_string() }),
    ))
}

/// A flow's state, how each ended step ended, and every step in run order with where it is.
#[utoipa::path(get, path = "/api/v1/flows/{id}", tag = "flows",
    params(("id" = String, Path, description = "The flow's id")),
    responses(
        (status = 200, description = "Done", body = FlowView),
        (status = 404, description = "Never created, or finished and forgotten", body = ErrorBody),
    ))]
async fn flow(
    State(api): State<Arc<Api>>,
    Path(id): Path<String>,
) -> Result<Json<FlowView>, ApiError> {
    let id = flow_id(&id)?;
    match api.store.flow(id).await? {
        Some(status) => {
            let steps = api.store.flow_steps(id).await?;
            Ok(Json(FlowView::of(status, steps)))
        }
        None => Err(flow_not_kept(id)),
    }
}

/// Cancel a flow: steps not started go to the dead letters unrun, ready and running ones are
/// cancelled (a running one's lease revoked).
#[utoipa::path(post, path = "/api/v1/flows/{id}/cancel", tag = "flows",
    request_body(content = Empty, content_type = "application/json", description = "`{}` (an empty body is read as `{}`); the Content-Type is required"),
    params(("id" = String, Path, description = "The flow's id")),
    responses(
        (status = 200, description = "Done", body = FlowCancelled),
        (status = 404, description = "Never created, or finished and forgotten", body = ErrorBody),
    ))]
async fn cancel_flow(
    State(api): State<Arc<Api>>,
    Path(id): Path<String>,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Json<FlowCancelled>, ApiError> {
    let id = flow_id(&id)?;
    no_fields(&api, raw)?;
    match palisade::Client::new(api.store.clone())
        .cancel_flow(id)
        .await?
    {
        Some(stopped) => Ok(Json(FlowCancelled { stopped })),
        None => Err(flow_not_kept(id)),
    }
}

/// Complete a waitpoint: the durable run waiting for it (`Durable::wait_for`) resumes with
/// `value`. Completed once: the first value stays, and a later request (a retry, a second
/// click, a webhook delivered twice) changes nothing and answers the kept value with
/// `outcome: already`; `same` says whether it equals this request's. A value sent before the
/// run reaches its wait is kept for it (30 days).
#[utoipa::path(post, path = "/api/v1/waitpoints/{id}", tag = "waitpoints",
    request_body = WaitpointRequest,
    params(("id" = String, Path, description = "The waitpoint's id, as the run names it (1-200 bytes)"),
        ("Idempotency-Key" = Option<IdempotencyKey>, Header,
        description = "Accepted, not needed: a waitpoint is completed once by its id, so a retried request answers `already` with `same: true`")),
    responses(
        (status = 201, description = "Completed with this value", body = WaitpointCompleted),
        (status = 200, description = "Completed before: nothing changed", body = WaitpointCompleted),
    ))]
async fn complete_waitpoint(
    State(api): State<Arc<Api>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    raw: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<WaitpointCompleted>), ApiError> {
    palisade::store::waitpoint::check_waitpoint_id(&id)?;
    // Checked as an enqueue's key is (the document's one schema), then not needed: the
    // waitpoint's id makes the completion idempotent.
    if let Some(key) = idempotency(&headers)? {
        idempotency_key(key, None)?;
    }
    let request: WaitpointRequest = parse(&body(&api, raw)?)?;
    let client = palisade::Client::new(api.store.clone());
    let done = client.complete_waitpoint(&id, &request.value).await?;
    let (status, outcome, value, woke) = match done {
        palisade::store::Completion::First { waiter } => (
            StatusCode::CREATED,
            WaitpointOutcome::Completed,
            request.value.clone(),
            waiter.map(|j| j.to_string()),
        ),
        palisade::store::Completion::Already { value } => (
            StatusCode::OK,
            WaitpointOutcome::Already,
            serde_json::from_str(&value).unwrap_or(serde_json::Value::String(value)),
            None,
        ),
    };
    let same = value == request.value;
    Ok((
        status,
        Json(WaitpointCompleted {
            outcome,
            value,
            same,
            woke,
        }),
    ))
}

/// A waitpoint as kept: its value once completed, and the job whose run waits for it.
#[utoipa::path(get, path = "/api/v1/waitpoints/{id}", tag = "waitpoints",
    params(("id" = String, Path, description = "The waitpoint's id")),
    responses(
        (status = 200, description = "Done", body = WaitpointView),
        (status = 404, description = "Neither completed nor waited for (or past its 30 days)", body = ErrorBody),
    ))]
async fn waitpoint(
    State(api): State<Arc<Api>>,
    Path(id): Path<String>,
) -> Result<Json<WaitpointView>, ApiError> {
    palisade::store::waitpoint::check_waitpoint_id(&id)?;
    let Some(kept) = api.store.waitpoint(&id).await? else {
        return Err(ApiError::not_found(format!(
            "waitpoint {id:?} was neither completed nor waited for"
        )));
    };
    Ok(Json(WaitpointView {
        completed: kept.value.is_some(),
        value: kept
            .value
            .map(|v| serde_json::from_str(&v).unwrap_or(serde_json::Value::String(v))),
        waiter: kept.waiter.map(|j| j.to_string()),
        id: kept.id,
    }))
}
