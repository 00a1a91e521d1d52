"""What a gateway does for the others on its store (leases.py): the moves a killed gateway left
are settled (finished when the session was already reassigned, else rolled back), and a drain
on one gateway is a drain on all of them."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
from starlette.testclient import TestClient

from hearth.gateway.store.sqlite import SqliteStore
from tests.helpers import wait_until
from tests.helpers.fake_fleet import Fleet, gateway, pool_of
from tests.helpers.postgres import Postgres

NAMES = {9101: "a", 9102: "b"}


@pytest.fixture
def fleet() -> Fleet:
    return Fleet()


async def _left_half_done(path: Path) -> None:
    """What a gateway killed in the middle of two moves leaves in its store."""
    store = SqliteStore(path)
    await store.open()
    await store.assign("session:done", "a")
    assert await store.begin_move("done", "a", "b")
    await store.move_saved("done", "snap_d")
    await store.move_assigned("done", "b")  # killed after the reassignment: the move is finished
    await store.assign("session:half", "a")
    assert await store.begin_move("half", "a", "b")
    await store.move_saved("half", "snap_h")  # killed while copying: the move is rolled back
    await store.close()


def test_a_gateway_settles_the_moves_a_killed_one_left(tmp_path: Path, fleet: Fleet) -> None:
    asyncio.run(_left_half_done(tmp_path / "gateway.sqlite3"))
    fleet.behave["a"] = fleet.behave["b"] = lambda r: httpx.Response(200, json={"deleted": True})
    with gateway(tmp_path, fleet) as c:
        store = pool_of(c).store
        wait_until(lambda: c.portal.call(store.moves) == [], "the moves to be settled")
        deleted = sorted((NAMES[r.url.port or 0], r.url.path) for r in fleet.seen if r.method == "DELETE")
        assert deleted == [("a", "/v1/sessions/done"), ("a", "/v1/snapshots/snap_d"), ("a", "/v1/snapshots/snap_h"),
                           ("b", "/v1/sessions/half"), ("b", "/v1/snapshots/snap_d"), ("b", "/v1/snapshots/snap_h")]
        assert c.portal.call(store.node_of, "session:done") == "b"
        assert c.portal.call(store.node_of, "session:half") == "a"
        metrics = c.get("/metrics").text
        assert 'hearth_gateway_migrations_total{outcome="finished"} 1.0' in metrics
        assert 'hearth_gateway_migrations_total{outcome="rolled_back"} 1.0' in metrics


def test_a_drain_on_one_gateway_is_a_drain_on_every_gateway_of_the_database(
        tmp_path: Path, fleet: Fleet, postgres: Postgres) -> None:
    url = postgres.create_database()
    fleet.behave["a"] = fleet.behave["b"] = lambda r: httpx.Response(200, json={"object": "list", "data": []})
    with gateway(tmp_path / "1", fleet, database=url, lease_ttl=0.6) as c1, \
            gateway(tmp_path / "2", fleet, database=url, lease_ttl=0.6) as c2:

        def draining(c: TestClient, name: str) -> bool:
            return pool_of(c).nodes[name].draining

        assert c1.post("/admin/nodes/a/drain").json()["draining"] is True
        wait_until(lambda: draining(c2, "a"), "the other gateway to stop routing to a")
        assert not draining(c2, "b")
        r = c2.post("/v1/chat/completions", json={"model": "smol", "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 200 and r.headers["x-hearth-upstream"] == "b"
        assert c2.post("/admin/nodes/a/undrain").json()["draining"] is False
        wait_until(lambda: not draining(c1, "a"), "the first gateway to route to a again")


async def _left_draining(path: Path) -> None:
    store = SqliteStore(path)
    await store.open()
    await store.assign("session:s2", "b")  # it continued on b while a was down: a's copy is stale
    await store.set_drain("a", "running")  # killed while it moved a's sessions off
    await store.close()


def test_a_drain_a_killed_gateway_left_running_is_continued(tmp_path: Path, fleet: Fleet) -> None:
    asyncio.run(_left_draining(tmp_path / "gateway.sqlite3"))

    def node(r: httpx.Request) -> httpx.Response:
        if r.method == "GET" and r.url.path == "/v1/sessions":
            return httpx.Response(200, json={"object": "list", "data": [{"session_id": "s2"}]})
        return httpx.Response(200, json={"deleted": True})

    fleet.behave["a"] = fleet.behave["b"] = node
    with gateway(tmp_path, fleet) as c:
        store = pool_of(c).store
        assert pool_of(c).nodes["a"].draining  # out of routing before it serves
        wait_until(lambda: c.portal.call(store.drains) == {"a": ("drained", store.instance)}, "the drain to end")
        assert [(NAMES[r.url.port or 0], r.method, r.url.path) for r in fleet.seen if r.method == "DELETE"] == [
            ("a", "DELETE", "/v1/sessions/s2")]
        assert c.portal.call(store.node_of, "session:s2") == "b"
