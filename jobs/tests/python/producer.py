"""A producer in another language: plain HTTP (urllib, no SDK) against Palisade's API.

Run by jobs/tests/api.rs with PALISADE_API (the base URL) and PALISADE_API_TOKEN set, while a
Rust worker process of the sample binary runs the jobs. It validates the served OpenAPI
document (openapi-spec-validator), checks every request it makes is documented, enqueues
report.part jobs one by one (one of them resent under its Idempotency-Key) and as a batch,
creates a flow, waits for every result, and checks that forged requests are refused.
Prints "producer: ok" on success; any failure raises.
"""

import json
import os
import re
import sys
import time
import urllib.error
import urllib.request

from openapi_spec_validator import validate

BASE = os.environ["PALISADE_API"].rstrip("/")
TOKEN = os.environ["PALISADE_API_TOKEN"]
USED = set()  # (method, documented path) of every request made


def call(method, path, body=None, headers=None, token=True, content_type="application/json",
         raw=None):
    """(status, parsed JSON body) of one request."""
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    request = urllib.request.Request(BASE + path, data=data, method=method)
    if content_type and method != "GET":
        request.add_header("Content-Type", content_type)
    if token:
        request.add_header("Authorization", "Bearer " + TOKEN)
    for k, v in (headers or {}).items():
        request.add_header(k, v)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            status, text = response.status, response.read()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read()
    return status, json.loads(text)


def documented(spec, method, path):
    """The document's path template that `path` matches for `method`, or None."""
    for template, item in spec["paths"].items():
        pattern = "^" + re.sub(r"\{[^}]+\}", "[^/]+", template) + "$"
        if re.match(pattern, path.split("?")[0]) and method.lower() in item:
            return template
    return None


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def main():
    status, spec = call("GET", "/api/v1/openapi.json", token=False)
    check(status == 200, f"the document: {status}")
    check(spec["openapi"].startswith("3.1"), f"OpenAPI {spec['openapi']}")
    validate(spec)  # raises on an invalid document

    def api(method, path, body=None, **kw):
        template = documented(spec, method, path)
        check(template is not None, f"{method} {path} is not in the OpenAPI document")
        USED.add((method, template))
        return call(method, path, body, **kw)

    # Refused: no token; a form post (what a cross-site page can send); a foreign Origin.
    job = {"kind": "report.part", "payload": {"n": 1}}
    status, err = api("POST", "/api/v1/jobs", job, token=False)
    check(status == 401 and err["error"]["code"] == "unauthorized", f"no token: {status} {err}")
    status, err = api("POST", "/api/v1/jobs", raw=b"kind=report.part", content_type="text/plain")
    check(status == 415 and err["error"]["code"] == "unsupported_media_type", f"form: {err}")
    status, err = api("POST", "/api/v1/jobs", job, headers={"Origin": "https://evil.example"})
    check(status == 403 and err["error"]["code"] == "forbidden", f"origin: {err}")
    # Bad input: a clear error, nothing added.
    status, err = api("POST", "/api/v1/jobs", {"kind": "no.such.kind", "payload": {}})
    check(status == 422 and err["error"]["code"] == "unknown_kind", f"kind: {err}")
    check(err["error"]["retryable"] is False, "a bad request is not retryable")
    status, err = api("POST", "/api/v1/jobs", {"kind": "report.part", "payload": {"n": "seven"}})
    check(status == 422 and err["error"]["code"] == "invalid_payload", f"payload: {err}")
    status, err = api("POST", "/api/v1/jobs", {"kind": "report.part", "payload": {"n": 1},
                                               "priority": 99999})
    check(status == 422 and err["error"]["code"] == "invalid_job", f"priority: {err}")

    # One by one; the fifth sent twice under its key (a retried request): one job.
    ids = {}
    for n in range(1, 11):
        status, done = api("POST", "/api/v1/jobs",
                           {"kind": "report.part", "payload": {"n": n}, "queue": "polyglot"},
                           headers={"Idempotency-Key": f"python-{n}"})
        check(status == 201 and done["created"], f"enqueue {n}: {status} {done}")
        ids[done["id"]] = n
    status, again = api("POST", "/api/v1/jobs",
                        {"kind": "report.part", "payload": {"n": 5}, "queue": "polyglot"},
                        headers={"Idempotency-Key": "python-5"})
    check(status == 200 and not again["created"] and ids.get(again["id"]) == 5,
          f"the retried request: {status} {again}")
    # A batch, all or nothing.
    batch = [{"kind": "report.part", "payload": {"n": n}, "queue": "polyglot"}
             for n in range(11, 21)]
    status, done = api("POST", "/api/v1/jobs/batch", {"jobs": batch})
    check(status == 200 and len(done["jobs"]) == 10, f"batch: {status} {done}")
    for n, item in zip(range(11, 21), done["jobs"]):
        ids[item["id"]] = n
    # A flow: b runs after a.
    status, flow = api("POST", "/api/v1/flows", {"steps": [
        {"name": "a", "job": {"kind": "report.part", "payload": {"n": 100}}},
        {"name": "b", "job": {"kind": "report.part", "payload": {"n": 200}},
         "after": [{"step": "a"}]},
    ]}, headers={"Idempotency-Key": "python-flow"})
    check(status == 201, f"flow: {status} {flow}")

    status, q = api("GET", "/api/v1/queues/polyglot")
    check(status == 200 and q["name"] == "polyglot", f"queue: {q}")

    # Every result, from the Rust worker.
    deadline = time.time() + 90
    pending = dict(ids)
    while pending and time.time() < deadline:
        for job_id, n in list(pending.items()):
            status, job = api("GET", f"/api/v1/jobs/{job_id}")
            check(status in (200, 404), f"job {job_id}: {status} {job}")
            if status == 200 and job["state"] == "completed":
                check(job["result"] == n, f"job {job_id} of n={n} returned {job['result']}")
                # Its record kept: what it was, when, and each attempt.
                check(job["queue"] == "polyglot" and job["kind"] == "report.part"
                      and job["payload"] == {"n": n}, f"completed record: {job}")
                attempts = job["attempts"]
                check(attempts and attempts[-1]["outcome"] == "completed"
                      and attempts[-1]["ended_ms"] == job["completed_ms"]
                      and job["enqueued_ms"] <= attempts[-1]["started_ms"] <= job["completed_ms"],
                      f"completed times: {job}")
                del pending[job_id]
            elif status == 200:
                check(job["state"] in ("ready", "waiting", "leased", "delayed"),
                      f"job {job_id}: {job}")
        time.sleep(0.2)
    check(not pending, f"jobs never completed: {pending}")
    while time.time() < deadline:
        status, f = api("GET", f"/api/v1/flows/{flow['id']}")
        check(status == 200, f"flow: {status} {f}")
        if f["state"] != "running":
            break
        time.sleep(0.2)
    check(f["state"] == "succeeded" and f["ended"] == {"a": "completed", "b": "completed"},
          f"flow: {f}")
    # Every step in run order with where it is: b runs after a.
    check([(s["name"], s["state"], s["after"]) for s in f["step_list"]]
          == [("a", "completed", []), ("b", "completed", ["a"])], f"flow steps: {f}")
    status, q = api("GET", "/api/v1/queues/polyglot")
    check(q["counts"]["completed"] == 20 and q["counts"]["ready"] == 0, f"counts: {q}")
    print(f"producer: ok ({len(ids)} jobs and a flow; used {len(USED)} operations)")


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # one line for the Rust test's report
        print(f"producer: FAILED: {e!r}", file=sys.stderr)
        raise
