"""Usage and limits per API key in-process (hearth/http/key_usage.py): a key over its limit gets
429 with Retry-After in its protocol's envelope while other keys go on being served; usage per
key on /metrics and /admin/keys/usage. The accounts' clock is the test's: nothing depends on
how fast the machine runs."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from hearth.api.context import node_of
from hearth.api.wire import usage as usage_wire
from hearth.tenants import ApiKey
from tests.api.conftest import Harness, serve
from tests.helpers import sample

ALICE = {"Authorization": "Bearer ka"}
BOB = {"Authorization": "Bearer kb"}
ADMIN = {"Authorization": "Bearer adm"}
CHAT = {"model": "fake", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}
MESSAGES = {"model": "fake", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


async def limited(tmp_path: Path, clock: Clock, **limits: int) -> AsyncIterator[Harness]:
    alice = ApiKey("ka", "alice", "team-a", concurrent=limits.get("concurrent"), rpm=limits.get("rpm"),
                   tpm=limits.get("tpm"))
    keys = [alice, ApiKey("kb", "bob", "team-b")]
    async with serve(tmp_path, named_keys=keys, admin_key="adm") as h:
        node_of(h.app).keys._clock = clock
        yield h


async def test_requests_per_minute(tmp_path: Path, clock: Clock) -> None:
    async for h in limited(tmp_path, clock, rpm=2):
        for _ in range(2):
            assert (await h.post("/v1/chat/completions", CHAT, headers=ALICE)).status_code == 200
        clock.now += 15
        r = await h.post("/v1/chat/completions", CHAT, headers=ALICE)
        assert r.status_code == 429 and r.headers["retry-after"] == "45", r.text
        assert r.json()["error"]["code"] == "rate_limit_exceeded" and "rpm=2" in r.json()["error"]["message"]
        r = await h.post("/v1/messages", MESSAGES, headers=ALICE)  # Anthropic's envelope on its path
        assert r.status_code == 429 and r.json()["type"] == "error", r.text
        assert r.json()["error"]["type"] == "rate_limit_error"
        for _ in range(3):  # another key is served meanwhile, every time
            assert (await h.post("/v1/chat/completions", CHAT, headers=BOB)).status_code == 200
        assert (await h.post("/v1/chat/completions", CHAT, headers=ADMIN)).status_code == 200  # never limited
        clock.now += 45
        assert (await h.post("/v1/chat/completions", CHAT, headers=ALICE)).status_code == 200


async def test_tokens_per_minute(tmp_path: Path, clock: Clock) -> None:
    async for h in limited(tmp_path, clock, tpm=10):
        r = await h.post("/v1/chat/completions", CHAT, headers=ALICE)
        assert r.status_code == 200
        assert r.json()["usage"]["total_tokens"] >= 10  # one request takes the key past its budget
        clock.now += 20
        r = await h.post("/v1/chat/completions", CHAT, headers=ALICE)
        assert r.status_code == 429 and r.headers["retry-after"] == "40" and "tpm=10" in r.text, r.text
        assert (await h.post("/v1/chat/completions", CHAT, headers=BOB)).status_code == 200
        clock.now += 40
        assert (await h.post("/v1/chat/completions", CHAT, headers=ALICE)).status_code == 200


async def test_concurrent_requests(tmp_path: Path, clock: Clock) -> None:
    async for h in limited(tmp_path, clock, concurrent=1):
        assert h.runner is not None
        h.runner.gate = gate = threading.Event()
        h.runner.entered.clear()
        held = asyncio.create_task(h.post("/v1/chat/completions", CHAT, headers=ALICE))
        try:
            assert await asyncio.to_thread(h.runner.entered.wait, 10)
            r = await h.post("/v1/chat/completions", CHAT, headers=ALICE)
            assert r.status_code == 429 and r.headers["retry-after"] == "1" and "concurrent=1" in r.text, r.text
            assert (await h.client.get("/v1/models", headers=ALICE)).status_code == 429  # every request counts
            assert (await h.client.get("/v1/models", headers=BOB)).status_code == 200  # another key: served
            bob = asyncio.create_task(h.post("/v1/chat/completions", CHAT, headers=BOB))  # admitted, queued
        finally:
            gate.set()  # the engine thread is held in alice's decode: bob's run follows it
        assert (await held).status_code == 200 and (await bob).status_code == 200
        assert (await h.post("/v1/chat/completions", CHAT, headers=ALICE)).status_code == 200  # released


async def test_usage_per_key_on_metrics_and_the_admin_route(tmp_path: Path, clock: Clock) -> None:
    async for h in limited(tmp_path, clock, rpm=2):
        answers = [(await h.post("/v1/chat/completions", CHAT, headers=ALICE)).json() for _ in range(2)]
        assert (await h.post("/v1/chat/completions", CHAT, headers=ALICE)).status_code == 429
        r = await h.post("/v1/responses", {"model": "fake", "input": "hi", "max_output_tokens": 3}, headers=BOB)
        assert r.status_code == 200
        text = (await h.client.get("/metrics", headers=ADMIN)).text
        assert sample(text, "hearth_key_requests_total", key="alice", tenant="team-a") == 2
        assert sample(text, "hearth_key_limited_requests_total", key="alice", tenant="team-a") == 1
        prompt = sum(a["usage"]["prompt_tokens"] for a in answers)
        assert sample(text, "hearth_key_prompt_tokens_total", key="alice", tenant="team-a") == prompt
        assert sample(text, "hearth_key_completion_tokens_total", key="alice", tenant="team-a") == sum(
            a["usage"]["completion_tokens"] for a in answers)
        assert sample(text, "hearth_key_completion_tokens_total", key="bob", tenant="team-b") == (
            r.json()["usage"]["output_tokens"])
        assert 'key="ka"' not in text and 'key="kb"' not in text  # names, never the keys
        assert (await h.client.get("/admin/keys/usage", headers=ALICE)).status_code == 403
        listed = (await h.client.get("/admin/keys/usage", headers=ADMIN)).json()
        usage_wire.KeyUsageList.model_validate(listed)
        data = {row["name"]: row for row in listed["data"]}
        assert data["alice"]["requests"] == 2 and data["alice"]["limited"] == 1 and data["alice"]["in_flight"] == 0
        assert data["alice"]["prompt_tokens"] == prompt and data["alice"]["limits"]["rpm"] == 2
        assert data["bob"]["requests"] == 1 and data["bob"]["limits"] == {"concurrent": None, "rpm": None, "tpm": None}
