"""The Batch API through the gateway, in-process (docs/gateway.md, "Batches"): the real gateway
app over two real node apps (scripted backends) joined by ASGI transports. Files and batches
live in the gateway's store; lines go through the gateway's own turn path as `flex`, spread over
the nodes; a node that dies mid-batch costs only its unfinished lines; tenants see only theirs.

Why the node-death test cannot flake: one line runs at a time (`batch_concurrency=1`) and the
runner's test gate holds the batch before line 2 starts, so exactly lines 0 and 1 are recorded
when the node goes down (read from the store, not guessed from timing); the rest must go to the
other node, and every node's requests are counted at the transport."""

from __future__ import annotations

import collections
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from hearth import test_gate
from hearth.gateway.app import create_gateway_app
from hearth.gateway.settings import GatewaySettings, Upstream
from hearth.gateway.state import gateway_of
from hearth.tenants import ApiKey
from tests.api.conftest import Harness, serve
from tests.helpers import until
from tests.helpers.postgres import Postgres

ALICE = {"Authorization": "Bearer ka"}
BOB = {"Authorization": "Bearer kb"}
GW_KEYS = [ApiKey("ka", "alice", "team-a"), ApiKey("kb", "bob", "team-b")]
NODE_KEYS = [ApiKey("node-gw", "gateway", "gateway", role="gateway")]
CHAT = "/v1/chat/completions"
PORTS = {"a": 9101, "b": 9102}


def line(cid: str, **body: Any) -> dict[str, Any]:
    b = {"model": "smol", "max_tokens": 3, "messages": [{"role": "user", "content": f"say {cid}"}], **body}
    return {"custom_id": cid, "method": "POST", "url": CHAT, "body": b}


def jsonl(rows: list[Any]) -> bytes:
    return b"".join((r if isinstance(r, bytes) else json.dumps(r).encode()) + b"\n" for r in rows)


class Fleet(httpx.AsyncBaseTransport):
    """The node apps by port, each request to a generation path counted; a node in `down`
    refuses connections."""

    def __init__(self, nodes: dict[int, Harness]) -> None:
        self.nodes = {port: httpx.ASGITransport(app=h.app, raise_app_exceptions=False) for port, h in nodes.items()}
        self.down: set[int] = set()
        self.served: collections.Counter[int] = collections.Counter()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        port = request.url.port or 0
        if port in self.down:
            raise httpx.ConnectError("connection refused", request=request)
        if request.method == "POST" and request.url.path == CHAT:
            self.served[port] += 1
        return await self.nodes[port].handle_async_request(request)


@dataclass
class World:
    gw: httpx.AsyncClient
    fleet: Fleet
    app: Any

    async def upload(self, content: bytes, who: dict[str, str] = ALICE) -> httpx.Response:
        return await self.gw.post("/v1/files", files={"file": ("in.jsonl", content, "application/jsonl")},
                                  data={"purpose": "batch"}, headers=who)

    async def submit(self, rows: list[Any], who: dict[str, str] = ALICE) -> dict[str, Any]:
        r = await self.upload(jsonl(rows), who)
        assert r.status_code == 200, r.text
        r = await self.gw.post("/v1/batches", json={"input_file_id": r.json()["id"], "endpoint": CHAT,
                                                    "completion_window": "24h"}, headers=who)
        assert r.status_code == 200, r.text
        batch: dict[str, Any] = r.json()
        return batch

    async def done(self, batch_id: str, who: dict[str, str] = ALICE) -> dict[str, Any]:
        await gateway_of(self.app).batches.idle()
        r = await self.gw.get(f"/v1/batches/{batch_id}", headers=who)
        assert r.status_code == 200, r.text
        batch: dict[str, Any] = r.json()
        return batch

    async def output(self, file_id: str | None, who: dict[str, str] = ALICE) -> list[dict[str, Any]]:
        assert file_id is not None
        r = await self.gw.get(f"/v1/files/{file_id}/content", headers=who)
        assert r.status_code == 200, r.text
        return [json.loads(x) for x in r.text.splitlines()]


def held_before(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, index: int) -> tuple[Path, Path]:
    """The test gate's folder, and the hold that keeps a batch before line `index` until removed."""
    folder = tmp_path / "gates"
    folder.mkdir()
    monkeypatch.setenv(test_gate.ENV, str(folder))
    hold = test_gate.hold_path(folder, f"gateway-batch-line-{index}")
    hold.touch()
    return folder, hold


@contextlib.asynccontextmanager
async def world(tmp_path: Path, concurrency: int = 4, database: str | None = None, keys: list[ApiKey] = GW_KEYS,
                gw_dir: Path | None = None, **gateway: Any) -> AsyncIterator[World]:
    """`gateway`: more GatewaySettings (a key file to reload, an admin key)."""
    (tmp_path / "a").mkdir(parents=True)
    (tmp_path / "b").mkdir()
    async with serve(tmp_path / "a", named_keys=NODE_KEYS) as a, serve(tmp_path / "b", named_keys=NODE_KEYS) as b:
        fleet = Fleet({PORTS["a"]: a, PORTS["b"]: b})
        ups = [Upstream(name=n, url=f"http://127.0.0.1:{port}", api_key="node-gw", models={"smol": "fake"},
                        max_in_flight=4) for n, port in PORTS.items()]
        settings = GatewaySettings(upstreams=ups, data_dir=gw_dir or tmp_path / "gw", named_keys=keys,
                                   probe_interval=60, digest_interval=0, heartbeat=0.05, batch_concurrency=concurrency,
                                   database=database, **gateway)
        app = create_gateway_app(settings, transport=fleet)
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
            async with httpx.AsyncClient(transport=transport, base_url="http://gw.test", timeout=30) as gw:
                yield World(gw, fleet, app)


async def test_a_batch_runs_over_both_nodes_as_flex(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        rows = [line(f"r{i}") for i in range(8)]
        batch = await w.submit(rows)
        assert batch["status"] == "validating" and batch["request_counts"] == {"total": 8, "completed": 0, "failed": 0}
        done = await w.done(batch["id"])
        assert done["status"] == "completed" and done["request_counts"] == {"total": 8, "completed": 8, "failed": 0}
        assert done["error_file_id"] is None
        out = await w.output(done["output_file_id"])
        assert [o["custom_id"] for o in out] == [f"r{i}" for i in range(8)]  # input order, each once
        for o in out:
            assert o["error"] is None and o["response"]["status_code"] == 200
            assert o["response"]["body"]["service_tier"] == "flex"  # the node ran it as flex
        assert sum(w.fleet.served.values()) == 8 and len(w.fleet.served) == 2, w.fleet.served  # both nodes
        listed = (await w.gw.get("/v1/batches", headers=ALICE)).json()
        assert [b["id"] for b in listed["data"]] == [batch["id"]]
        files = (await w.gw.get("/v1/files", params={"purpose": "batch_output"}, headers=ALICE)).json()["data"]
        assert [f["id"] for f in files] == [done["output_file_id"]]


async def test_a_nodes_death_reruns_only_its_unfinished_lines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    folder = tmp_path / "gates"
    folder.mkdir()
    monkeypatch.setenv(test_gate.ENV, str(folder))
    hold = test_gate.hold_path(folder, "gateway-batch-line-2")
    hold.touch()
    async with world(tmp_path, concurrency=1) as w:
        rows = [line(f"r{i}") for i in range(6)]
        batch = await w.submit(rows)
        waiting = test_gate.waiting_path(folder, "gateway-batch-line-2")
        await until(waiting.exists, "the batch held before line 2")
        tables = gateway_of(w.app).batches.tables
        assert {r.custom_id for r in await tables.results(batch["id"])} == {"r0", "r1"}
        before = dict(w.fleet.served)
        assert sum(before.values()) == 2
        dead = PORTS["a"]
        w.fleet.down.add(dead)  # node a dies: from now on it refuses every connection
        hold.unlink()
        done = await w.done(batch["id"])
        assert done["status"] == "completed" and done["request_counts"]["completed"] == 6, done
        out = await w.output(done["output_file_id"])
        assert sorted(o["custom_id"] for o in out) == [f"r{i}" for i in range(6)]  # every line, once
        assert w.fleet.served[dead] == before.get(dead, 0)  # nothing more reached the dead node
        assert sum(w.fleet.served.values()) == 6  # no finished line ran twice


async def test_tenants_see_only_their_own_and_errors_are_the_nodes(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        batch = await w.submit([line("a1")])
        done = await w.done(batch["id"])
        for path in (f"/v1/batches/{batch['id']}", f"/v1/files/{done['output_file_id']}",
                     f"/v1/files/{done['output_file_id']}/content", f"/v1/files/{batch['input_file_id']}"):
            r = await w.gw.get(path, headers=BOB)
            assert r.status_code == 404 and r.json()["error"]["code"] == "not_found", (path, r.text)
        assert (await w.gw.get("/v1/batches", headers=BOB)).json()["data"] == []
        assert (await w.gw.get("/v1/files", headers=BOB)).json()["data"] == []
        r = await w.gw.post(f"/v1/batches/{batch['id']}/cancel", headers=BOB)
        assert r.status_code == 404
        r = await w.gw.post(f"/v1/batches/{batch['id']}/cancel", headers=ALICE)
        assert r.status_code == 409 and r.json()["error"]["code"] == "batch_not_cancellable"
        # lines are checked at upload with their line numbers, as on a node
        r = await w.upload(jsonl([line("x"), b"{oops"]))
        assert r.status_code == 400 and r.json()["error"]["message"].startswith("line 2:"), r.text
        fid = (await w.upload(jsonl([line("y")]))).json()["id"]
        r = await w.gw.post("/v1/batches", json={"input_file_id": fid, "endpoint": "/v1/completions",
                                                 "completion_window": "24h"}, headers=ALICE)
        assert r.status_code == 400 and "does not match the batch's endpoint" in r.json()["error"]["message"]
        r = await w.gw.post("/v1/batches", json={"input_file_id": fid, "endpoint": CHAT,
                                                 "completion_window": "1h"}, headers=ALICE)
        assert r.status_code == 400 and r.json()["error"]["param"] == "completion_window"
        r = await w.gw.post("/v1/batches", json={"input_file_id": fid, "endpoint": CHAT,
                                                 "completion_window": "24h"}, headers=BOB)
        assert r.status_code == 404  # alice's file
        r = await w.gw.delete(f"/v1/files/{fid}", headers=ALICE)
        assert r.json() == {"id": fid, "object": "file", "deleted": True}
        assert (await w.gw.get(f"/v1/files/{fid}", headers=ALICE)).status_code == 404


async def test_a_cancelled_batch_keeps_what_finished(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder, hold = held_before(tmp_path, monkeypatch, 1)
    async with world(tmp_path, concurrency=1) as w:
        batch = await w.submit([line(f"c{i}") for i in range(4)])
        await until(test_gate.waiting_path(folder, "gateway-batch-line-1").exists, "held before line 1")
        r = await w.gw.post(f"/v1/batches/{batch['id']}/cancel", headers=ALICE)
        assert r.status_code == 200 and r.json()["status"] == "cancelling"
        hold.unlink()
        done = await w.done(batch["id"])
        assert done["status"] == "cancelled" and done["cancelled_at"] is not None
        assert done["request_counts"] == {"total": 4, "completed": 1, "failed": 0}  # no line starts after
        out = await w.output(done["output_file_id"])
        assert [o["custom_id"] for o in out] == ["c0"] and done["error_file_id"] is None
        assert sum(w.fleet.served.values()) == 1


async def test_two_gateways_on_one_postgres_see_and_cancel_the_same_batch(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, postgres: Postgres) -> None:
    """Gateway 1 runs the batch (held before line 1); gateway 2, on the same database, lists it,
    reads it and cancels it; gateway 1's run sees the cancel before its next line, and gateway 2
    reads the final batch and its output file."""
    folder, hold = held_before(tmp_path, monkeypatch, 1)
    url = postgres.create_database()
    async with world(tmp_path / "one", concurrency=1, database=url) as w1, \
            world(tmp_path / "two", concurrency=1, database=url) as w2:
        batch = await w1.submit([line(f"p{i}") for i in range(3)])
        await until(test_gate.waiting_path(folder, "gateway-batch-line-1").exists, "held before line 1")
        seen = (await w2.gw.get(f"/v1/batches/{batch['id']}", headers=ALICE)).json()
        assert seen["status"] == "in_progress" and seen["request_counts"]["completed"] == 1
        assert [b["id"] for b in (await w2.gw.get("/v1/batches", headers=ALICE)).json()["data"]] == [batch["id"]]
        assert (await w2.gw.get(f"/v1/batches/{batch['id']}", headers=BOB)).status_code == 404
        r = await w2.gw.post(f"/v1/batches/{batch['id']}/cancel", headers=ALICE)
        assert r.status_code == 200 and r.json()["status"] == "cancelling"
        hold.unlink()
        await gateway_of(w1.app).batches.idle()
        done = await w2.done(batch["id"])
        assert done["status"] == "cancelled" and done["request_counts"]["completed"] == 1
        assert [o["custom_id"] for o in await w2.output(done["output_file_id"])] == ["p0"]


async def stopped_for_its_key(w: World, batch_id: str) -> tuple[dict[str, Any], list[Any], list[Any]]:
    """The batch (read from the store: its key can read it no more), its output and error lines."""
    batches = gateway_of(w.app).batches
    await batches.idle()
    row = await batches.tables.batch(batch_id)
    assert row is not None
    done = await batches.public(row)
    files = [b"".join([c async for c in batches.tables.file_chunks(done[k])])
             for k in ("output_file_id", "error_file_id")]
    out, err = ([json.loads(x) for x in (f or b"").splitlines()] for f in files)
    return done, out, err


def assert_stopped_for_its_key(done: dict[str, Any], out: list[Any], err: list[Any]) -> None:
    assert done["status"] == "failed" and done["failed_at"] is not None, done
    [why] = done["errors"]["data"]
    assert why["code"] == "invalid_api_key" and "'alice'" in why["message"] and "no longer configured" in why["message"]
    assert done["request_counts"] == {"total": 4, "completed": 1, "failed": 3}
    assert [o["custom_id"] for o in out] == ["k0"] and out[0]["response"]["status_code"] == 200
    assert [e["custom_id"] for e in err] == ["k1", "k2", "k3"]
    assert all(e["response"] is None and e["error"]["code"] == "invalid_api_key" for e in err)


async def test_a_batch_whose_key_was_removed_stops(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Alice's batch runs line 0, then the gateway stops (held before line 1); it starts again
    with a key file that no longer has her key: it takes the batch up and runs none of its other
    lines: failed, its unrun lines in the error file with the reason."""
    folder, hold = held_before(tmp_path, monkeypatch, 1)
    async with world(tmp_path / "one", concurrency=1, gw_dir=tmp_path / "gw") as w:
        batch = await w.submit([line(f"k{i}") for i in range(4)])
        await until(test_gate.waiting_path(folder, "gateway-batch-line-1").exists, "held before line 1")
    hold.unlink()
    async with world(tmp_path / "two", concurrency=1, keys=[GW_KEYS[1]], gw_dir=tmp_path / "gw") as w:
        assert (await w.gw.get(f"/v1/batches/{batch['id']}", headers=ALICE)).status_code == 401
        assert_stopped_for_its_key(*await stopped_for_its_key(w, batch["id"]))
        assert sum(w.fleet.served.values()) == 0  # nothing more ran


async def test_a_batch_whose_key_one_gateway_lacks_stops_on_every_gateway(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, postgres: Postgres) -> None:
    """Two gateways on one PostgreSQL; the second has no key for alice. The first runs her batch
    (held before line 1) and stops; the second adopts the batch, sees the key gone and stops it;
    both answer it failed (the admin-free read: the store)."""
    folder, hold = held_before(tmp_path, monkeypatch, 1)
    url = postgres.create_database()
    async with world(tmp_path / "two", concurrency=1, database=url, keys=[GW_KEYS[1]]) as w2:
        async with world(tmp_path / "one", concurrency=1, database=url) as w1:
            batch = await w1.submit([line(f"k{i}") for i in range(4)])
            await until(test_gate.waiting_path(folder, "gateway-batch-line-1").exists, "held before line 1")
        hold.unlink()
        await gateway_of(w2.app).batches.adopt()  # as its periodic adoption would
        assert_stopped_for_its_key(*await stopped_for_its_key(w2, batch["id"]))
        assert sum(w2.fleet.served.values()) == 0
        async with world(tmp_path / "three", concurrency=1, database=url) as w3:  # alice's key again
            seen = (await w3.gw.get(f"/v1/batches/{batch['id']}", headers=ALICE)).json()
            assert seen["status"] == "failed" and seen["errors"]["data"][0]["code"] == "invalid_api_key"
