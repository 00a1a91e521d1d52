"""Classes through the gateway (hearth.tenants, TENANT_CLASS_HEADER; docs/gateway.md "Tenants"):
the gateway sends each request's client key weight and classes with its tenant, and the node
applies them (capped by the gateway key's own line), so its fair share and preemption see the
gateway's tenants as the tenants they are, not as the one gateway key.

Why the order test cannot flake: the only slot is held inside the engine by the scripted
runner's gate until both waiting requests are in the admission queue (read from the queue
itself); which one the engine admits next is then the admission policy's choice alone, and it
is read from the order in which prompts reach the runner, not from when answers come back."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from hearth.backends.base import ModelCard
from hearth.backends.local.backend import LocalBackend
from hearth.backends.local.model import EngineSettings
from hearth.chat.template import ChatTemplate
from hearth.engine.runner import BatchEntry
from hearth.gateway.app import create_gateway_app
from hearth.gateway.settings import GatewaySettings, Upstream
from hearth.gateway.upstream.headers import upstream_headers
from hearth.models import ModelSpec
from hearth.tenants import OPEN, TENANT_CLASS_HEADER, TENANT_HEADER, ApiKey, Caller
from tests.api.conftest import Harness, serve
from tests.fakes import SMOL, ScriptedRunner
from tests.helpers import until

# The gateway's client keys: a weighted tenant, an operator whose requests run `priority`, a
# batch key whose requests run `flex`.
GW_KEYS = [ApiKey("ka", "alice", "team-a", weight=3),
           ApiKey("ko", "ops", "ops", priority="priority", max_priority="priority"),
           ApiKey("kb", "batch", "batch", priority="flex")]
# The node grants its gateway key up to weight 10 and the priority class.
NODE_KEYS = [ApiKey("node-gw", "gateway", "gateway", role="gateway", weight=10, max_priority="priority"),
             ApiKey("plain-gw", "plain", "plain", role="gateway"), ApiKey("kc", "carol", "team-c")]


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def chat(marker: str, **extra: Any) -> dict[str, Any]:
    return {"model": "smol", "max_tokens": 3, "messages": [{"role": "user", "content": marker}], **extra}


@dataclass(eq=False)
class OrderRunner(ScriptedRunner):
    """Records which prompt each sequence began with, in the order the engine ran them."""

    started: list[str] | None = None

    def decode(self, entries: list[BatchEntry]) -> list[int]:
        for e in entries:  # a prompt's first decode (after any prefix reused from the cache)
            if self.started is not None and e.n_logits and len(e.tokens) > 1:
                self.started.append(bytes(t for t in e.tokens if t < 256).decode(errors="replace"))
        return super().decode(entries)


def one_slot(weights: Path) -> tuple[LocalBackend, OrderRunner]:
    runner = OrderRunner(n_seq_max=1, n_batch=64, started=[])
    runner.answer = b"ok"

    def factory(spec: ModelSpec, settings: EngineSettings) -> Any:
        return runner, ModelCard(spec.id, 0, meta={"n_ctx": 2048, "parallel": 1}), ChatTemplate(SMOL)

    return LocalBackend([ModelSpec("fake", weights)], EngineSettings(parallel=1, batch=64), factory), runner


@contextlib.asynccontextmanager
async def through_gateway(tmp_path: Path, parallel: int = 2) -> AsyncIterator[tuple[httpx.AsyncClient, Harness]]:
    """The real gateway app (client keys GW_KEYS) over one node app (NODE_KEYS) on the scripted runner."""
    weights = tmp_path / "fake.gguf"
    weights.write_bytes(b"fake weights")
    backend, runner = one_slot(weights) if parallel == 1 else (None, None)
    (tmp_path / "node").mkdir()
    async with serve(tmp_path / "node", backend=backend, runner=runner, named_keys=NODE_KEYS,
                     parallel=parallel) as node:
        up = Upstream(name="a", url="http://127.0.0.1:9101", api_key="node-gw", models={"smol": "fake"},
                      max_in_flight=8)
        settings = GatewaySettings(upstreams=[up], data_dir=tmp_path / "gw", named_keys=GW_KEYS,
                                   probe_interval=60, digest_interval=0, heartbeat=0.05)
        app = create_gateway_app(settings, transport=httpx.ASGITransport(app=node.app, raise_app_exceptions=False))
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
            async with httpx.AsyncClient(transport=transport, base_url="http://gw.test", timeout=30) as gw:
                try:
                    yield gw, node
                finally:
                    if node.runner is not None:
                        node.runner.gate = None  # never leave the engine thread held


def fair_of(node: Harness) -> Any:
    assert isinstance(node.backend, LocalBackend)
    return node.backend._set.loaded()["fake"].admission.fair


async def test_each_client_keys_class_and_weight_reach_the_node(tmp_path: Path) -> None:
    async with through_gateway(tmp_path) as (gw, node):
        async def tier(key: str, **asked: str) -> str:
            r = await gw.post("/v1/chat/completions", json=chat("hi", **asked), headers=auth(key))
            assert r.status_code == 200, r.text
            return str(r.json()["service_tier"])

        assert await tier("ka") == "default"
        assert await tier("ka", service_tier="priority") == "default"  # above alice's key's ceiling
        assert await tier("ko") == "priority"  # the ops key's default class
        assert await tier("kb") == "flex"
        assert await tier("kb", service_tier="default") == "default"  # up to its own ceiling
        assert await tier("ka", priority="flex") == "flex"
        snap = fair_of(node).snapshot()
        assert {"team-a", "ops", "batch"} <= snap.keys() and "gateway" not in snap  # three tenants, not one
        assert fair_of(node)._weights["team-a"] == 3 and fair_of(node)._weights["batch"] == 1


async def test_a_nodes_ceiling_is_the_gateway_keys_line(tmp_path: Path) -> None:
    """Sent to the node directly: what a gateway claims is capped by its own key's line, and
    the header is believed only from a gateway's key."""
    async with serve(tmp_path, named_keys=NODE_KEYS) as node:
        async def tier(key: str, claim: str, **asked: str) -> str:
            headers = {**auth(key), TENANT_HEADER: "team-x", TENANT_CLASS_HEADER: claim}
            r = await node.post("/v1/chat/completions", {**chat("hi", **asked), "model": "fake"}, headers=headers)
            assert r.status_code == 200, r.text
            return str(r.json()["service_tier"])

        assert await tier("node-gw", "weight=20;priority=priority;max_priority=priority") == "priority"
        assert fair_of(node)._weights["team-x"] == 10  # capped by the gateway key's weight=10
        assert await tier("plain-gw", "priority=priority;max_priority=priority") == "default"  # its line: default
        assert await tier("plain-gw", "max_priority=priority", service_tier="priority") == "default"
        assert await tier("node-gw", "priority=flex") == "flex"
        # a bad header is a 400 naming it; from a client key it is refused like the tenant header
        r = await node.post("/v1/chat/completions", {**chat("hi"), "model": "fake"},
                            headers={**auth("node-gw"), TENANT_HEADER: "team-x", TENANT_CLASS_HEADER: "weight=0"})
        assert r.status_code == 400 and TENANT_CLASS_HEADER in r.json()["error"]["message"], r.text
        r = await node.post("/v1/chat/completions", {**chat("hi"), "model": "fake"},
                            headers={**auth("kc"), TENANT_CLASS_HEADER: "priority=priority;max_priority=priority"})
        assert r.status_code == 403, r.text


async def hold(gw: httpx.AsyncClient, node: Harness, key: str) -> tuple[asyncio.Task[httpx.Response], threading.Event]:
    """A request of `key` that sits inside the engine, on the only slot, until the gate opens."""
    runner = node.runner
    assert isinstance(runner, OrderRunner)
    runner.gate = gate = threading.Event()
    holder = asyncio.create_task(gw.post("/v1/chat/completions", json=chat("held"), headers=auth(key)))
    assert await asyncio.to_thread(runner.entered.wait, 10)
    return holder, gate


def release(node: Harness, gate: threading.Event) -> None:
    assert node.runner is not None
    node.runner.gate = None
    gate.set()


async def test_two_tenants_through_one_gateway_are_scheduled_as_two(tmp_path: Path) -> None:
    """One slot, held by an ops request (`priority` by its key: nothing preempts it); alice
    (default) queues first, then a second ops request. The node admits ops next: its class came
    through the gateway. (With the gateway key's one class for all, the two would be one class
    and alice, first in line and of the tenant with less work, would go first.)"""
    async with through_gateway(tmp_path, parallel=1) as (gw, node):
        holder, gate = await hold(gw, node, "ko")
        admission = node.backend.model("fake").admission  # type: ignore[attr-defined]
        alice = asyncio.create_task(gw.post("/v1/chat/completions", json=chat("from-alice"), headers=auth("ka")))
        await until(lambda: admission.waiting == 1, "alice queued")
        ops = asyncio.create_task(gw.post("/v1/chat/completions", json=chat("from-ops"), headers=auth("ko")))
        await until(lambda: admission.waiting == 2, "ops queued")
        release(node, gate)
        answers = await asyncio.gather(holder, alice, ops)
        assert [r.status_code for r in answers] == [200, 200, 200], [r.text for r in answers]
        assert isinstance(node.runner, OrderRunner) and node.runner.started is not None
        order = [m for p in node.runner.started for m in ("held", "from-alice", "from-ops") if m in p]
        assert order == ["held", "from-ops", "from-alice"], order
        assert [r.json()["service_tier"] for r in answers] == ["priority", "default", "priority"]


async def test_a_higher_class_through_the_gateway_preempts(tmp_path: Path) -> None:
    """One slot, held by alice's default request: ops's `priority` request is let through at
    once (the engine pauses alice at its next step); a batch key's `flex` one waits its turn."""
    async with through_gateway(tmp_path, parallel=1) as (gw, node):
        holder, gate = await hold(gw, node, "ka")
        admission = node.backend.model("fake").admission  # type: ignore[attr-defined]
        flex = asyncio.create_task(gw.post("/v1/chat/completions", json=chat("from-batch"), headers=auth("kb")))
        await until(lambda: admission.waiting == 1, "the flex request queued")
        ops = asyncio.create_task(gw.post("/v1/chat/completions", json=chat("from-ops"), headers=auth("ko")))
        await until(lambda: admission.in_use == 2, "ops let through beside alice")
        assert admission.waiting == 1  # only the flex request still waits
        release(node, gate)
        answers = await asyncio.gather(holder, flex, ops)
        assert [r.status_code for r in answers] == [200, 200, 200], [r.text for r in answers]
        assert [r.json()["service_tier"] for r in answers] == ["default", "flex", "priority"]


@pytest.mark.parametrize("key", ["ka", "ko"])
async def test_without_keys_at_the_gateway_no_class_is_sent(tmp_path: Path, key: str) -> None:
    """A gateway without a key file is one tenant, as before: it sends its upstream key alone;
    with one, every tenant's request carries its key's class."""
    up = Upstream(name="a", url="http://127.0.0.1:9101", api_key="node-gw", models={"smol": "fake"})
    assert TENANT_CLASS_HEADER not in upstream_headers(up, OPEN)
    who = Caller("team-a", key, weight=3, priority="flex")
    assert upstream_headers(up, who)[TENANT_CLASS_HEADER] == "weight=3;priority=flex;max_priority=default"
