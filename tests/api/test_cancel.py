"""Cancellation in-process: by cancel_id before the run exists, by id while it runs, by a
disconnect; every protocol reports it as `cancelled` and the slot comes back."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

from starlette.types import Message

from hearth.api.context import node_of
from tests.api.conftest import Harness
from tests.helpers import sample, until

CHAT = {"model": "fake", "messages": [{"role": "user", "content": "Hi"}], "temperature": 0}


async def test_an_early_cancel_id_cancels_the_run_that_registers_later(h: Harness) -> None:
    assert (await h.post("/v1/cancel", {"cancel_id": "c1"})).json() == {"cancelled": 0}
    metrics = (await h.client.get("/metrics")).text
    assert sample(metrics, "hearth_cancel_registry_pending") == 1
    body = (await h.post("/v1/chat/completions", {**CHAT, "cancel_id": "c1"})).json()
    assert body["choices"][0]["finish_reason"] == "cancelled" and body["choices"][0]["message"]["content"] == ""


async def gated_run(h: Harness, path: str, body: dict[str, Any]) -> tuple[asyncio.Task[Any], threading.Event]:
    """Start a request whose run is held inside the engine; the gate opens once it is cancelled."""
    assert h.runner is not None
    h.runner.gate = gate = threading.Event()
    h.runner.entered.clear()
    task = asyncio.create_task(h.post(path, body))
    assert await asyncio.to_thread(h.runner.entered.wait, 10)
    [run] = node_of(h.app).cancels._runs
    run.token.on_cancel(gate.set)
    return task, gate


async def test_cancel_by_response_id_on_every_protocol(h: Harness) -> None:
    cases = [("/v1/chat/completions", CHAT, "completion_id",
              lambda r: r["choices"][0]["finish_reason"]),
             ("/v1/completions", {"model": "fake", "prompt": "x", "max_tokens": 50}, "completion_id",
              lambda r: r["choices"][0]["finish_reason"]),
             ("/v1/messages", {**CHAT, "max_tokens": 50}, "message_id", lambda r: r["stop_reason"]),
             ("/v1/responses", {"model": "fake", "input": "Hi"}, "response_id",
              lambda r: r["incomplete_details"]["reason"])]
    for path, body, field, outcome in cases:
        task, _ = await gated_run(h, path, body)
        [run] = node_of(h.app).cancels._runs
        [rid] = run.ids
        assert (await h.post("/v1/cancel", {field: rid})).json() == {"cancelled": 1}, path
        r = await task
        assert r.status_code == 200 and outcome(r.json()) == "cancelled", (path, r.text)
    h.runner.gate = None  # type: ignore[union-attr]
    assert len(node_of(h.app).cancels) == 0
    assert (await h.post("/v1/chat/completions", CHAT)).json()["choices"][0]["finish_reason"] == "stop"


async def test_a_disconnect_aborts_the_run_and_frees_the_slot(h: Harness) -> None:
    """Driven through raw ASGI: the client says http.disconnect while its run is in the engine."""
    assert h.runner is not None
    h.runner.gate = gate = threading.Event()
    gone = asyncio.Event()
    sent: list[Message] = []
    body = json.dumps({**CHAT, "stream": True}).encode()
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> Message:
        if messages:
            return messages.pop(0)
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions",
             "query_string": b"", "headers": [(b"content-type", b"application/json")], "http_version": "1.1",
             "scheme": "http", "server": ("test", 80), "client": ("test", 1), "root_path": "", "app": h.app}
    task = asyncio.create_task(h.app(scope, receive, send))
    assert await asyncio.to_thread(h.runner.entered.wait, 10)
    [run] = node_of(h.app).cancels._runs
    run.token.on_cancel(gate.set)
    gone.set()
    await asyncio.wait_for(task, 10)
    assert run.token.reason == "disconnect"
    await until(lambda: h.backend.stats()["fake"].cancelled == 1)  # the engine took the abort
    metrics = (await h.client.get("/metrics")).text
    assert sample(metrics, "hearth_requests_cancelled_total") == 1
    assert sample(metrics, 'hearth_cancellations_total{cause="disconnect"}') == 1
    await until(lambda: h.backend.stats()["fake"].slots_busy == 0)
    assert len(node_of(h.app).cancels) == 0
