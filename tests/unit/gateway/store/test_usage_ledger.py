"""The gateway's usage ledger (store/usage.py) on both databases: rows written off the caller's
path in batches, sums grouped as the node's, a tenant filter, a full queue that drops and
counts, and two gateways on one PostgreSQL that keep one ledger."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from hearth.gateway.store.base import GatewayStore
from hearth.gateway.store.usage import GatewayLedger, TurnUsage
from hearth.observability.ledger import UsageFilter
from tests.helpers import until
from tests.unit.gateway.store.test_store import _open

DAY = 86_400.0
T0 = 1_790_000_000.0  # 2026-09-21, a fixed day (not "today": the grouping by day is checked)


def row(n: int, tenant: str = "team-a", key: str = "alice", model: str = "smol", node: str = "a",
        at: float = T0, **kw: object) -> TurnUsage:
    fields: dict[str, object] = {"nodes": node, **kw}
    return TurnUsage(at=at + n, request_id=f"chatcmpl-{n}", gateway="g1", tenant=tenant, key=key, via=None,
                     model=model, endpoint="chat", node=node, prompt_tokens=10, cached_tokens=4,
                     generated_tokens=n, total_ms=1.0, **fields)  # type: ignore[arg-type]


@pytest.fixture(params=["sqlite", "postgres"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[GatewayStore]:
    s = await _open(request.param, tmp_path, request)
    yield s
    await s.close()


async def test_rows_are_written_in_the_background_and_summed(store: GatewayStore) -> None:
    ledger = GatewayLedger(store)
    ledger.start()
    try:
        ledger.record(row(1))
        ledger.record(row(2, key="alice-ci"))
        ledger.record(row(3, tenant="team-b", key="bob", node="b", cancelled="disconnect"))
        ledger.record(row(4, model="big", at=T0 + DAY, failovers=1, nodes="a,b", node="b"))
        assert await ledger.flush()
        assert ledger.written == 4 and ledger.dropped == 0 and ledger.depth == 0
        rows = await ledger.rows(UsageFilter())
        assert [r["request_id"] for r in rows] == ["chatcmpl-4", "chatcmpl-3", "chatcmpl-2", "chatcmpl-1"]
        assert rows[0]["nodes"] == "a,b" and rows[0]["failovers"] == 1 and rows[1]["cancelled"] == "disconnect"
        by_day = await ledger.totals(UsageFilter(), ["day"])
        assert by_day == [
            {"day": "2026-09-21", "requests": 3, "prompt_tokens": 30, "cached_tokens": 12, "generated_tokens": 6,
             "discarded_tokens": 0, "failovers": 0, "cancelled": 1},
            {"day": "2026-09-22", "requests": 1, "prompt_tokens": 10, "cached_tokens": 4, "generated_tokens": 4,
             "discarded_tokens": 0, "failovers": 1, "cancelled": 0}]
        assert [(r["tenant"], r["node"], r["requests"]) for r in await ledger.totals(UsageFilter(), ["tenant", "node"])
                ] == [("team-a", "a", 2), ("team-a", "b", 1), ("team-b", "b", 1)]
        mine = await ledger.totals(UsageFilter(tenant="team-a", since=T0, until=T0 + DAY), ["key"])
        assert [(r["key"], r["generated_tokens"]) for r in mine] == [("alice", 1), ("alice-ci", 2)]
        assert await ledger.totals(UsageFilter(tenant="nobody"), []) == [
            {"requests": 0, "prompt_tokens": 0, "cached_tokens": 0, "generated_tokens": 0, "discarded_tokens": 0,
             "failovers": 0, "cancelled": 0}]
        with pytest.raises(ValueError, match="group"):
            await ledger.totals(UsageFilter(), ["prompt"])
    finally:
        await ledger.close()


async def test_a_full_queue_drops_and_counts_and_close_writes_what_is_queued(store: GatewayStore) -> None:
    ledger = GatewayLedger(store, capacity=3)
    for n in range(5):  # no writer yet: the queue fills
        ledger.record(row(n))
    assert ledger.depth == 3 and ledger.dropped == 2
    ledger.start()
    await ledger.close()  # a clean stop writes what is queued
    assert ledger.written == 3
    assert [r["requests"] for r in await ledger.totals(UsageFilter(), [])] == [3]


async def test_a_batch_larger_than_one_statement(store: GatewayStore) -> None:
    ledger = GatewayLedger(store)
    ledger.start()
    try:
        for n in range(700):  # more than BATCH (512) and many CHUNKs
            ledger.record(row(n, at=time.time()))
        assert await ledger.flush()
        [total] = await ledger.totals(UsageFilter(), [])
        assert total["requests"] == 700 and total["generated_tokens"] == sum(range(700))
    finally:
        await ledger.close()


async def test_the_writer_lingers_then_writes_a_busy_spell_in_one_transaction(store: GatewayStore) -> None:
    ledger = GatewayLedger(store, linger=600)  # it lingers until flushed: what the writer does is not timed
    ledger.start()
    try:
        for n in range(20):  # rows that come one wakeup apart, as requests end
            ledger.record(row(n))
            await asyncio.sleep(0)  # a yield to the loop, no time: the writer wakes between rows
        assert (ledger.batches, ledger.written, ledger.depth) == (0, 0, 20)  # none written per wakeup
        assert await ledger.flush()  # cuts the linger short
        assert (ledger.batches, ledger.written, ledger.depth) == (1, 20, 0)
        ledger.record(row(20))
        await asyncio.sleep(0)
        assert await ledger.flush()
        assert (ledger.batches, ledger.written) == (2, 21)
        for n in range(21, 25):
            ledger.record(row(n))
        await asyncio.sleep(0)
    finally:
        await ledger.close()  # the lingering rows are written, not lost
    assert (ledger.batches, ledger.written, ledger.dropped) == (3, 25, 0)
    assert [r["requests"] for r in await ledger.totals(UsageFilter(), [])] == [25]


async def test_rows_are_written_without_a_flush(store: GatewayStore) -> None:
    ledger = GatewayLedger(store)  # the default linger: written a moment after they come
    ledger.start()
    try:
        ledger.record(row(1))
        ledger.record(row(2))
        await until(lambda: ledger.written == 2, "the rows to be written")
        assert ledger.batches == 1
    finally:
        await ledger.close()


async def test_two_gateways_on_one_postgres_keep_one_ledger(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    one = await _open("postgres", tmp_path, request, instance="g1")
    two = await _open("postgres", tmp_path, request, instance="g2")
    first, second = GatewayLedger(one), GatewayLedger(two)
    first.start()
    second.start()
    try:
        first.record(row(1))
        second.record(TurnUsage(**{**_fields(row(2)), "gateway": "g2"}))
        assert await first.flush() and await second.flush()
        for ledger in (first, second):  # each sees both
            rows = await ledger.rows(UsageFilter())
            assert sorted((r["gateway"], r["generated_tokens"]) for r in rows) == [("g1", 1), ("g2", 2)]
    finally:
        await first.close()
        await second.close()
        await one.close()
        await two.close()


def _fields(r: TurnUsage) -> dict[str, object]:
    return {name: getattr(r, name) for name in r.__dataclass_fields__}
