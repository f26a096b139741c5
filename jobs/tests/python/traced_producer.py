"""A producer in another language continues its own trace into the Rust worker's spans.

Run by jobs/tests/otel.rs with PALISADE_API (the base URL) set. It makes a W3C trace context
by hand (no OpenTelemetry SDK: a random trace id and span id, sampled), sends it as the
`traceparent` and `tracestate` headers of an enqueue through the HTTP API, and waits for the
job's result. Prints one JSON line: {"trace_id", "span_id", "job"}. Any failure raises.
"""

import json
import os
import secrets
import time
import urllib.request

BASE = os.environ["PALISADE_API"].rstrip("/")


def call(method, path, body=None, headers=None):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(BASE + path, data=data, method=method)
    if body is not None:
        request.add_header("Content-Type", "application/json")
    for k, v in (headers or {}).items():
        request.add_header(k, v)
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.status, json.loads(response.read())


def main():
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    headers = {
        "traceparent": f"00-{trace_id}-{span_id}-01",
        "tracestate": "python=producer",
    }
    status, done = call("POST", "/api/v1/jobs",
                        {"kind": "report.part", "payload": {"n": 42}, "queue": "polyglot"},
                        headers)
    if status != 201:
        raise AssertionError(f"enqueue: {status} {done}")
    deadline = time.time() + 30
    while True:
        status, job = call("GET", f"/api/v1/jobs/{done['id']}?queue=polyglot")
        if job.get("state") == "completed":
            break
        if time.time() > deadline:
            raise AssertionError(f"the job did not complete: {job}")
        time.sleep(0.1)
    if job.get("result") != 42:
        raise AssertionError(f"result: {job}")
    print(json.dumps({"trace_id": trace_id, "span_id": span_id, "job": done["id"]}))


main()
