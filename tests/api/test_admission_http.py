"""Admission over HTTP, in-process: the two 429s (`queue_full`, `queue_timeout`) with their
envelope and Retry-After, on every protocol's error shape.

Why these cannot flake: the slot holder's run is held inside the engine by the scripted runner's
gate (tests/fakes.py), so it cannot end, whatever the machine's speed, until the test opens the
gate; queue state is read from the admission queue itself, not guessed from timing."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from hearth.backends.base import ModelCard
from hearth.backends.local.backend import LocalBackend
from hearth.backends.local.model import EngineSettings
from hearth.chat.template import ChatTemplate
from hearth.models import ModelSpec
from tests.api.conftest import Harness, serve
from tests.fakes import SMOL, ScriptedRunner
from tests.helpers import until

CHAT = {"model": "fake", "messages": [{"role": "user", "content": "Hi"}], "temperature": 0, "max_tokens": 50}


def one_slot_backend(weights: Path, max_waiting: int, max_wait: float) -> tuple[LocalBackend, ScriptedRunner]:
    """tests.fakes.scripted_backend with one slot and the given queue limits."""
    runner = ScriptedRunner(n_seq_max=1, n_batch=64)
    runner.answer = b"Hello there."

    def factory(spec: ModelSpec, settings: EngineSettings) -> Any:
        return runner, ModelCard(spec.id, 0, meta={"n_ctx": 2048, "parallel": 1}), ChatTemplate(SMOL)

    settings = EngineSettings(parallel=1, batch=64, max_waiting=max_waiting, max_wait=max_wait)
    return LocalBackend([ModelSpec("fake", weights)], settings, factory), runner


@contextlib.asynccontextmanager
async def one_slot(tmp_path: Path, max_waiting: int, max_wait: float) -> AsyncIterator[Harness]:
    weights = tmp_path / "fake.gguf"
    weights.write_bytes(b"fake weights")
    backend, runner = one_slot_backend(weights, max_waiting, max_wait)
    async with serve(tmp_path, backend=backend, runner=runner, parallel=1) as h:
        try:
            yield h
        finally:
            runner.gate = None  # never leave the engine thread held


async def hold_the_slot(h: Harness) -> tuple[asyncio.Task[Any], threading.Event]:
    """A run that sits inside the engine (so on the only slot) until the returned gate opens."""
    assert h.runner is not None
    h.runner.gate = gate = threading.Event()
    h.runner.entered.clear()
    task = asyncio.create_task(h.post("/v1/chat/completions", CHAT))
    assert await asyncio.to_thread(h.runner.entered.wait, 10)
    return task, gate


def admission(h: Harness) -> Any:
    return h.backend.model("fake").admission  # type: ignore[attr-defined]


async def test_a_queued_request_that_gets_no_slot_in_max_wait_is_a_429_queue_timeout(tmp_path: Path) -> None:
    async with one_slot(tmp_path, max_waiting=4, max_wait=0.2) as h:
        holder, gate = await hold_the_slot(h)
        for path, body in [("/v1/chat/completions", CHAT), ("/v1/messages", CHAT)]:
            r = await h.post(path, body)
            assert r.status_code == 429, r.text
            assert int(r.headers["retry-after"]) >= 1
            err = r.json()["error"]
            if path == "/v1/messages":
                assert r.json()["type"] == "error" and err["type"] == "rate_limit_error"
            else:
                assert (err["type"], err["code"]) == ("rate_limit_error", "queue_timeout")
            assert "within 0.2 s" in err["message"]
            assert admission(h).waiting == 0  # it left the queue
        assert not holder.done()  # the slot was held the whole time
        gate.set()
        r = await holder
        assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "stop"
        h.runner.gate = None  # type: ignore[union-attr]
        assert (await h.post("/v1/chat/completions", CHAT)).status_code == 200  # the slot came back


async def test_a_request_meeting_a_full_queue_is_a_429_queue_full_at_once(tmp_path: Path) -> None:
    async with one_slot(tmp_path, max_waiting=1, max_wait=60) as h:
        holder, gate = await hold_the_slot(h)
        waiter = asyncio.create_task(h.post("/v1/chat/completions", CHAT))
        await until(lambda: admission(h).waiting == 1)
        r = await h.post("/v1/chat/completions", {**CHAT, "stream": True})  # refused before any stream starts
        assert r.status_code == 429 and r.headers["content-type"].startswith("application/json"), r.text
        assert r.json()["error"]["code"] == "queue_full" and int(r.headers["retry-after"]) >= 1
        assert not holder.done() and not waiter.done()
        gate.set()
        h.runner.gate = None  # type: ignore[union-attr]
        assert (await holder).status_code == 200
        assert (await waiter).status_code == 200  # the queued request got the freed slot
