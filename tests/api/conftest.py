"""In-process API tests: the real app on a LocalBackend over the scripted fake runner, driven
through httpx.ASGITransport. No port, no model: the whole suite runs in seconds."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette

from hearth.api.app import create_app
from hearth.api.context import node_of
from hearth.backends.base import Backend
from hearth.config import Settings
from hearth.observability.tracing import Tracing
from tests.fakes import ScriptedRunner, scripted_backend
from tests.helpers import until

ANSWER = "Hello there, friend."


@dataclass
class Harness:
    app: Starlette
    backend: Backend
    runner: ScriptedRunner | None
    client: httpx.AsyncClient

    async def post(self, path: str, body: dict[str, Any] | None = None, **kw: Any) -> httpx.Response:
        return await self.client.post(path, json=body, **kw)

    async def sse(self, path: str, body: dict[str, Any]) -> list[tuple[str | None, Any]]:
        """(event name or None, parsed data) for each SSE event of a streamed answer."""
        r = await self.post(path, {**body, "stream": True})
        assert r.status_code == 200, r.text
        assert r.headers["content-type"].startswith("text/event-stream")
        return parse_sse(r.text)


def parse_sse(text: str) -> list[tuple[str | None, Any]]:
    out: list[tuple[str | None, Any]] = []
    for block in text.split("\n\n"):
        if not block.strip() or block.startswith(":"):
            continue
        event, data = None, []
        for line in block.splitlines():
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: "):
                data.append(line[6:])
        payload = "\n".join(data)
        out.append((event, payload if payload == "[DONE]" else json.loads(payload)))
    return out


@contextlib.asynccontextmanager
async def serve(tmp_path: Path, backend: Backend | None = None, runner: ScriptedRunner | None = None,
                answer: str = ANSWER, tracing: Tracing | None = None, **settings: Any) -> AsyncIterator[Harness]:
    """The app on `backend` (default: a scripted LocalBackend answering `answer`), started."""
    if backend is None:
        weights = tmp_path / "fake.gguf"
        weights.write_bytes(b"fake weights")
        backend, runner = scripted_backend(answer, parallel=settings.get("parallel", 2), path=weights)
    app = create_app(backend, Settings(data_dir=tmp_path, **settings), tracing)
    await backend.start()
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://hearth.test", timeout=30) as client:
            yield Harness(app, backend, runner, client)
    finally:
        await node_of(app).background.shutdown()  # as the app's lifespan does, before the backend stops
        await backend.stop()
        node_of(app).sessions.close()
        if (ledger := node_of(app).ledger) is not None:
            ledger.close()


@pytest.fixture
async def h(tmp_path: Path) -> AsyncIterator[Harness]:
    async with serve(tmp_path) as harness:
        yield harness


async def past_the_time_cap(h: Harness, path: str, body: dict[str, Any], cap: float) -> httpx.Response:
    """POST a run that is still going when its time cap passes. Why this cannot flake: the run
    is held in its first decode after its first token (the fake runner's gate) until the cap
    has certainly passed (the cap counts from that token, sampled before that decode began), so
    it can neither finish inside the cap on a fast machine nor depend on how many tokens a slow
    one decodes in `cap` seconds; the engine then ends it at its next step."""
    assert h.runner is not None
    h.runner.gate = gate = threading.Event()
    h.runner.gate_generating = True
    task = asyncio.create_task(h.post(path, body))
    try:
        assert await asyncio.to_thread(h.runner.entered.wait, 30), "the run never reached the engine"
        passed = time.monotonic() + cap
        await until(lambda: time.monotonic() > passed, "the time cap to pass")
    finally:
        gate.set()
    try:
        return await task
    finally:
        h.runner.gate, h.runner.gate_generating = None, False
