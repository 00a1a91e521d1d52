"""Admission: per-node caps, the one bounded wait queue, 429 / 503 with Retry-After."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from hearth.errors import NotFound, TooManyRequests, Unavailable
from hearth.gateway.fleet.pool import Pool
from hearth.gateway.fleet.probes import Prober
from hearth.gateway.metrics import GatewayMetrics
from hearth.gateway.routing.affinity import Affinity
from hearth.gateway.settings import GatewaySettings, Upstream
from hearth.gateway.store.sqlite import SqliteStore
from hearth.gateway.upstream.node_client import NodeClient

NONE = Affinity("none")


# max_wait is long by default: a waiter a test releases itself must not time out first on a slow
# machine; the tests about the wait running out set a short one and never release.
async def make_pool(tmp_path: Path, *, caps: tuple[int, ...] = (1, 1), max_waiting: int = 4, max_wait: float = 60.0,
              default_model: str | None = None) -> Pool:
    ups = [Upstream(name=f"n{i}", url=f"http://127.0.0.1:{9000 + i}", models={"m": "model"}, max_in_flight=c)
           for i, c in enumerate(caps)]
    settings = GatewaySettings(upstreams=ups, data_dir=tmp_path, max_waiting=max_waiting, max_wait=max_wait,
                               default_model=default_model)
    store = SqliteStore(tmp_path / "g.sqlite3")
    await store.open()
    pool = Pool(settings, store, GatewayMetrics(), NodeClient(httpx.AsyncClient()))
    for n in pool.nodes.values():
        n.live.probed(True)
    return pool


async def test_caps_then_wait_then_woken_by_release(tmp_path: Path) -> None:
    pool = await make_pool(tmp_path)
    a = await pool.acquire("m", NONE, [], 10)
    b = await pool.acquire("m", NONE, [], 10)
    assert {a.node.name, b.node.name} == {"n0", "n1"}
    waiter = asyncio.create_task(pool.acquire("m", NONE, [], 10))
    while pool.waiting == 0:
        await asyncio.sleep(0)
    assert not waiter.done()
    pool.release(a, True)
    c = await asyncio.wait_for(waiter, 60)
    assert c.node is a.node and pool.waiting == 0


async def test_a_continuation_does_not_queue_behind_new_requests(tmp_path: Path) -> None:
    # n0 died mid-answer (excluded); n1 is at its cap with a request waiting for it: the stream
    # whose node died goes to n1 now, past the cap, and the new request still waits.
    pool = await make_pool(tmp_path, caps=(1, 1))
    held = await pool.acquire("m", NONE, [], 10, exclude={"n0"})
    waiter = asyncio.create_task(pool.acquire("m", NONE, [], 10, exclude={"n0"}))
    while pool.waiting == 0:
        await asyncio.sleep(0)
    moved = await pool.acquire("m", NONE, [], 10, exclude={"n0"}, urgent=True)
    assert moved.node is held.node and held.node.in_flight == 2 and not waiter.done()
    waiter.cancel()


async def test_full_queue_is_429_with_retry_after(tmp_path: Path) -> None:
    pool = await make_pool(tmp_path, caps=(1,), max_waiting=1)
    await pool.acquire("m", NONE, [], 10)
    waiter = asyncio.create_task(pool.acquire("m", NONE, [], 10))
    while pool.waiting == 0:
        await asyncio.sleep(0)
    with pytest.raises(TooManyRequests) as e:
        await pool.acquire("m", NONE, [], 10)
    assert e.value.code == "queue_full" and e.value.retry_after >= 1
    waiter.cancel()


async def test_wait_runs_out_is_429(tmp_path: Path) -> None:
    pool = await make_pool(tmp_path, caps=(1,), max_wait=0.05)
    await pool.acquire("m", NONE, [], 10)
    with pytest.raises(TooManyRequests) as e:
        await pool.acquire("m", NONE, [], 10)
    assert e.value.code == "queue_timeout"
    assert pool.waiting == 0


async def test_no_live_node_is_503_with_retry_after(tmp_path: Path) -> None:
    pool = await make_pool(tmp_path)
    for n in pool.nodes.values():
        n.live.up = False
    with pytest.raises(Unavailable) as e:
        await pool.acquire("m", NONE, [], 10)
    assert e.value.status == 503 and e.value.retry_after is not None


async def test_draining_cooling_and_open_breaker_nodes_are_skipped(tmp_path: Path) -> None:
    pool = await make_pool(tmp_path, caps=(4, 4, 4, 4))
    pool.nodes["n0"].draining = True
    pool.nodes["n1"].cooling_until = pool.clock() + 60
    for _ in range(3):
        pool.nodes["n2"].breaker.record(False)
    for _ in range(6):
        lease = await pool.acquire("m", NONE, [], 10)
        assert lease.node.name == "n3"
        pool.release(lease, None)


async def test_binding_key_waits_for_its_node_and_is_remembered(tmp_path: Path) -> None:
    pool = await make_pool(tmp_path, caps=(1, 1), max_wait=0.05)
    s = Affinity("session", "s1")
    first = await pool.acquire("m", s, [], 10)
    await pool.remember(s, first.node.name)
    assert await pool.store.node_of("session:s1") == first.node.name
    with pytest.raises(TooManyRequests):  # its node is busy; the free one would split the session
        await pool.acquire("m", s, [], 10)
    pool.release(first, True)
    again = await pool.acquire("m", s, [], 10)
    assert again.node is first.node


async def test_unknown_model_is_model_not_found_unless_a_default_is_set(tmp_path: Path) -> None:
    with pytest.raises(NotFound) as e:
        (await make_pool(tmp_path)).resolve("gpt-4o")
    assert e.value.code == "model_not_found" and e.value.param == "model"
    assert (await make_pool(tmp_path, default_model="m")).resolve("gpt-4o") == "m"


async def test_a_slow_probe_of_a_node_streaming_answers_is_inconclusive(tmp_path: Path) -> None:
    def slow(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("probe timed out")

    pool = await make_pool(tmp_path)
    pool.clock = lambda: 5000.0  # frozen: "just now" stays within BUSY_GRACE however slow the probes run
    prober = Prober(pool.settings, NodeClient(httpx.AsyncClient(transport=httpx.MockTransport(slow))), pool.metrics,
                    lambda: list(pool.nodes.values()), pool.wake, pool.clock)
    busy, idle = pool.nodes["n0"], pool.nodes["n1"]
    busy.in_flight, busy.last_bytes = 1, pool.clock()  # bytes just arrived from it
    for _ in range(10):
        await prober.probe_all()
    assert busy.live.up  # busy, not dead
    assert not idle.live.up  # an idle node that does not answer is down
    busy.last_bytes -= 3600  # a stuck node: in flight, but silent
    for _ in range(3):
        await prober.probe(busy)
    assert not busy.live.up
