"""Stop means stop: cancel endpoint, time caps, request ids, metrics, through the real server."""

from __future__ import annotations

import asyncio
import collections
import json
import threading
from typing import Any

import httpx
import pytest

from tests.e2e.test_http import chat_body, wait_idle
from tests.helpers import Server

pytestmark = pytest.mark.slow


def long_body(**kw: Any) -> dict[str, Any]:
    return chat_body(max_tokens=1500, ignore_eos=True, **kw)


def read_stream(lines: Any, on_token: Any = None) -> tuple[int, str | None, bool]:
    """Count content chunks; return (tokens, finish_reason, saw [DONE]). Takes one line iterator
    for the whole response: leaving an httpx line iterator early closes the connection."""
    n, finish, done = 0, None, False
    for line in lines:
        if line == "data: [DONE]":
            done = True
        elif line.startswith("data: {"):
            for ch in json.loads(line[6:])["choices"]:
                if ch["delta"].get("content"):
                    n += 1
                    if on_token is not None:
                        on_token(n)
                finish = ch["finish_reason"] or finish
    return n, finish, done


def cancel(server: Server, **body: Any) -> int:
    r = httpx.post(f"{server.base_url}/cancel", json=body, timeout=10)
    assert r.status_code == 200, r.text
    return int(r.json()["cancelled"])


def test_cancel_id_stops_a_stream_which_ends_cleanly(server: Server) -> None:
    """The run stops within the engine step the cancel found it in. Counted on the server, not by
    what the client has read (the server runs ahead of a client by a machine-dependent margin):
    with speculative decoding off a step emits one token per sequence, and the engine applies an
    abort at the top of the next step, so at most one token is generated after /v1/cancel has
    answered, on any machine."""
    wait_idle(server)
    result: list[int] = []
    at_cancel: list[float] = []

    def on_token(n: int) -> None:
        if n == 5:
            result.append(cancel(server, cancel_id="run-a"))
            at_cancel.append(server.metric("hearth_generated_tokens_total"))

    with httpx.stream("POST", f"{server.base_url}/chat/completions", timeout=60,
                      json=long_body(stream=True, cancel_id="run-a", speculative=False)) as r:
        n, finish, done = read_stream(r.iter_lines(), on_token)
    assert result == [1]
    assert finish == "cancelled" and done
    assert 5 <= n < 1500
    wait_idle(server)
    assert server.metric("hearth_generated_tokens_total") - at_cancel[0] <= 1
    server.wait_metric("hearth_cancel_registry_runs", lambda v: v == 0)


def test_cancel_by_completion_id(server: Server) -> None:
    wait_idle(server)
    with httpx.stream("POST", f"{server.base_url}/chat/completions", timeout=60,
                      json=long_body(stream=True)) as r:
        lines = r.iter_lines()
        cid = next(json.loads(line[6:])["id"] for line in lines if line.startswith("data: {"))
        assert cancel(server, completion_id=cid) == 1
        _, finish, done = read_stream(lines)
    assert finish == "cancelled" and done
    assert cancel(server, completion_id=cid) == 0  # it is gone from the registry


def test_non_streaming_cancel_returns_the_text_so_far(server: Server) -> None:
    wait_idle(server)
    out: dict[str, Any] = {}

    def call() -> None:
        out["r"] = httpx.post(f"{server.base_url}/chat/completions", timeout=60,
                              json=long_body(cancel_id="ns-1")).json()

    before = server.metric("hearth_generated_tokens_total")
    t = threading.Thread(target=call)
    t.start()
    server.wait_metric("hearth_generated_tokens_total", lambda v: v > before)  # it runs and has text
    assert cancel(server, cancel_id="ns-1") == 1
    t.join(120)
    choice = out["r"]["choices"][0]
    assert choice["finish_reason"] == "cancelled"
    assert choice["message"]["content"] and out["r"]["usage"]["completion_tokens"] < 1500


def test_a_cancel_that_arrives_before_its_request_is_applied(server: Server) -> None:
    wait_idle(server)
    assert cancel(server, cancel_id="early-bird") == 0
    assert server.metric("hearth_cancel_registry_pending") >= 1
    r = httpx.post(f"{server.base_url}/chat/completions", json=long_body(cancel_id="early-bird"), timeout=60)
    body = r.json()
    assert body["choices"][0]["finish_reason"] == "cancelled"
    assert body["usage"]["completion_tokens"] <= 1


def test_cancel_naming_nothing_is_a_400(server: Server) -> None:
    r = httpx.post(f"{server.base_url}/cancel", json={}, timeout=10)
    assert r.status_code == 400 and "name what to cancel" in r.json()["error"]["message"]


def test_time_cap_ends_generation_as_length(server: Server) -> None:
    # 1,500 tokens of this 135M model are ~400 GFLOP: seconds of a 2-thread CPU at its peak, so
    # the run cannot reach its budget inside the 0.4 s cap (counted from the first token) on any
    # machine. It ends as the protocol's own `length`, with Hearth's stop_reason saying why.
    wait_idle(server)
    body = httpx.post(f"{server.base_url}/chat/completions", json=long_body(timeout=0.4), timeout=60).json()
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["choices"][0]["stop_reason"] == "timeout"
    assert body["usage"]["completion_tokens"] < 1500
    too_long = httpx.post(f"{server.base_url}/chat/completions", json=chat_body(timeout=10**6), timeout=10)
    assert too_long.status_code == 400 and too_long.json()["error"]["param"] == "timeout"
    assert server.metric('hearth_cancellations_total{cause="timeout"}') >= 1


def test_request_ids_are_honoured_or_generated(server: Server) -> None:
    r = httpx.get(f"{server.base_url}/models", headers={"x-request-id": "my-trace-42"})
    assert r.headers["x-request-id"] == "my-trace-42"
    r = httpx.get(f"{server.base_url}/models")
    assert r.headers["x-request-id"].startswith("req_")
    r = httpx.get(f"{server.base_url}/models", headers={"x-request-id": "bad id with spaces"})
    assert r.headers["x-request-id"].startswith("req_")


def test_metrics_expose_latency_histograms_and_request_counts(server: Server) -> None:
    httpx.post(f"{server.base_url}/chat/completions", json=chat_body(max_tokens=4, stream=True), timeout=60)
    text = httpx.get(f"{server.url}/metrics").text
    for name in ("hearth_time_to_first_token_seconds_bucket", "hearth_inter_token_latency_seconds_bucket",
                 "hearth_request_duration_seconds_bucket", "hearth_queue_time_seconds_bucket",
                 'hearth_http_requests_total{endpoint="/v1/chat/completions",status="200"}',
                 'hearth_cancellations_total{cause="cancel_call"}', "hearth_kv_tokens"):
        assert name in text, name


async def test_racing_cancels_and_disconnects_leave_nothing_behind(server: Server) -> None:
    """Cancels sent before, during and after registration, and clients that leave: afterwards no
    run is registered, no slot is held, and every request that was not abandoned ended cancelled."""
    wait_idle(server)
    finishes: list[str | None] = []

    async def run(client: httpx.AsyncClient, i: int) -> None:
        body = chat_body(max_tokens=400, ignore_eos=True, stream=True, cancel_id=f"race-{i}")
        try:
            async with client.stream("POST", f"{server.base_url}/chat/completions", json=body) as r:
                if r.status_code == 429:  # more than --max-waiting queued: backpressure, not a failure
                    assert r.headers["retry-after"].isdigit()
                    finishes.append("429")
                    return
                if i % 5 == 4:  # this client leaves after its first chunk
                    async for _ in r.aiter_lines():
                        return
                finish = None
                async for line in r.aiter_lines():
                    if line.startswith("data: {"):
                        for ch in json.loads(line[6:])["choices"]:
                            finish = ch["finish_reason"] or finish
                finishes.append(finish)
        except httpx.HTTPError:
            finishes.append("transport-error")

    async def canceller(client: httpx.AsyncClient, i: int) -> None:
        await asyncio.sleep((i % 7) * 0.003)
        await client.post(f"{server.base_url}/cancel", json={"cancel_id": f"race-{i}"})

    n = 100
    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=300)) as client:
        await asyncio.gather(*(run(client, i) for i in range(n)), *(canceller(client, i) for i in range(n)))
    wait_idle(server)
    counts = collections.Counter(finishes)
    assert n - n // 5 <= len(finishes) <= n and set(counts) <= {"cancelled", "429"}, counts
    assert counts["cancelled"] >= 40, counts
    server.wait_metric("hearth_cancel_registry_runs", lambda v: v == 0)
    server.wait_metric("hearth_kv_slots_busy", lambda v: v == 0)


def test_shutdown_ends_open_streams_cleanly(tmp_path: Any) -> None:
    from tests.helpers import start_server

    s = start_server(tmp_path, "--parallel", "2", "--ctx", "1024")
    try:
        with httpx.stream("POST", f"{s.base_url}/chat/completions", timeout=60,
                          json=chat_body(stream=True, max_tokens=900, ignore_eos=True)) as r:
            lines = r.iter_lines()
            next(line for line in lines if '"content":"' in line and '"role"' not in line)
            s.proc.terminate()
            _, finish, done = read_stream(lines)
        assert finish == "cancelled" and done
        # uvicorn re-raises the signal once it has shut down cleanly
        assert s.proc.wait(20) in (0, -15)
        assert "Application shutdown complete" in s.log.read_text()
    finally:
        if s.proc.poll() is None:
            s.proc.kill()
