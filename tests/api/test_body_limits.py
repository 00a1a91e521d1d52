"""Body limits hold before the bytes arrive: a declared length past the limit is refused without
reading, and a body without one is read only up to the limit (no 400 MB in RAM for a 400)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from hearth.api.context import node_of
from hearth.http.body import MAX_JSON_BYTES
from tests.api.conftest import Harness

MB = 1 << 20


async def call(h: Harness, path: str, chunks: int, declared: int | None) -> tuple[int, dict[str, Any], int]:
    """POST `chunks` chunks of 1 MiB straight through ASGI; (status, JSON body, chunks the app pulled)."""
    pulled = 0
    chunk = b" " * MB
    headers = [(b"content-type", b"application/json")]
    if declared is not None:
        headers.append((b"content-length", str(declared).encode()))
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        nonlocal pulled
        if pulled >= chunks:
            return {"type": "http.disconnect"}
        pulled += 1
        return {"type": "http.request", "body": chunk, "more_body": pulled < chunks}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "headers": headers,
             "client": ("127.0.0.1", 1), "server": ("hearth", 80)}
    await h.app(scope, receive, send)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return status, json.loads(body), pulled


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages", "/tokenize", "/v1/snapshots/import"])
async def test_a_declared_length_past_the_limit_is_refused_before_reading(h: Harness, path: str) -> None:
    status, body, pulled = await call(h, path, chunks=400, declared=400 * MB * 1000)
    assert status == 413 and pulled == 0
    message = body["error"]["message"]
    assert "limit" in message
    if path == "/v1/messages":
        assert body["type"] == "error" and body["error"]["type"] == "request_too_large"


async def test_a_body_without_a_length_is_read_only_up_to_the_limit(h: Harness) -> None:
    limit_chunks = MAX_JSON_BYTES // MB
    status, body, pulled = await call(h, "/v1/chat/completions", chunks=limit_chunks + 16, declared=None)
    assert status == 413 and "limit" in body["error"]["message"]
    assert pulled == limit_chunks + 1  # the chunk that crossed the limit, and not one more


async def test_snapshot_import_is_bounded_by_what_the_kv_can_hold(h: Harness) -> None:
    limits = await node_of(h.app).sessions.import_limits()
    assert limits.archive_bytes < 256 * MB  # the fake model's KV is tiny: far below the old 64 GiB
    chunks = limits.archive_bytes // MB + 4
    status, _, pulled = await call(h, "/v1/snapshots/import", chunks=chunks, declared=None)
    assert status == 413 and pulled <= limits.archive_bytes // MB + 1
