"""The Batch API's tables (hearth/gateway/store/batches.py) on SQLite and on a real PostgreSQL:
files and batches as written, a line recorded once whatever answers it twice, counts, and
several gateways on one database: each sees the same batch, and a live gateway adopts the
batches of one whose lease ran out (never those of a live one)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from hearth.gateway.store.base import GatewayStore
from hearth.gateway.store.batches import BatchTables
from hearth.gateway.store.postgres import PostgresStore
from hearth.gateway.store.sqlite import SqliteStore
from tests.helpers.postgres import Postgres

BATCH = {"id": "batch_1", "object": "batch", "status": "in_progress", "request_counts": {"total": 2}}


async def _open(kind: str, tmp_path: Path, request: pytest.FixtureRequest, instance: str) -> GatewayStore:
    if kind == "sqlite":
        s: GatewayStore = SqliteStore(tmp_path / "gateway.sqlite3")
        s.instance = instance
    else:
        pg: Postgres = request.getfixturevalue("postgres")
        url = getattr(request.node, "_database", None) or pg.create_database()
        request.node._database = url  # a second gateway of the same test opens the same database
        s = PostgresStore(url, instance)
    await s.open()
    return s


@pytest.fixture(params=["sqlite", "postgres"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[GatewayStore]:
    s = await _open(request.param, tmp_path, request, "g1")
    yield s
    await s.close()


async def _empty(t: BatchTables) -> str:
    """An input file for a batch whose lines the test does not run."""
    await t.put_file({"id": "file-in"}, "team-a", b"")
    return "file-in"


async def _content(t: BatchTables, file_id: str) -> bytes:
    return b"".join([chunk async for chunk in t.file_chunks(file_id)])


async def test_files_and_batches_as_written(store: GatewayStore) -> None:
    t = BatchTables(store)
    obj = {"id": "file-1", "object": "file", "bytes": 0, "purpose": "batch"}
    stored = await t.put_file(obj, "team-a", "{\"é\": 1}\n".encode())
    assert stored == {**obj, "bytes": 10} and await t.file("file-1") == (stored, "team-a")
    assert await _content(t, "file-1") == "{\"é\": 1}\n".encode() and await t.file_size("file-1") == 10
    assert await t.files("team-a") == [stored] and await t.files("team-b") == [] and await t.files(None) == [stored]
    await t.put_file(obj, "team-a", b"{}")  # the same id again: replaced
    assert (await t.file("file-1") or ({}, ""))[0]["bytes"] == 2 and await _content(t, "file-1") == b"{}"

    line = b"{\"custom_id\": \"x\"}\n"
    await t.put_file({**obj, "id": "file-2"}, "team-a", line)
    assert await t.create(BATCH, "team-a", {"tenant": "team-a"}, "file-2")
    await t.delete_file("file-2")  # the batch keeps its own copy of its input
    assert await t.file("file-2") is None and await _content(t, "file-2") == b""
    row = await t.batch("batch_1")
    assert row is not None and row.obj == BATCH and row.owner == "team-a" and row.gateway == store.instance
    assert [x async for x in t.input_lines("batch_1")] == [(1, line[:-1]), (2, b"")]
    assert not await t.create({**BATCH, "id": "batch_2"}, "team-a", {}, "file-2")  # its input is gone
    assert await t.batch("batch_2") is None
    assert [r.obj["id"] for r in await t.batches("team-a")] == ["batch_1"] and await t.batches("team-b") == []
    assert await t.save({**BATCH, "status": "cancelling"}, only_if=("in_progress",))
    assert not await t.save({**BATCH, "status": "completed"}, only_if=("in_progress",))  # it moved on
    assert (await t.batch("batch_1") or row).obj["status"] == "cancelling"


async def test_a_line_is_recorded_once(store: GatewayStore) -> None:
    t = BatchTables(store)
    await t.create(BATCH, "team-a", {}, await _empty(t))
    assert await t.record("batch_1", "a", True, {"custom_id": "a", "n": 1})
    assert not await t.record("batch_1", "a", True, {"custom_id": "a", "n": 2})  # a second answer: not kept
    assert await t.record("batch_1", "b", False, {"custom_id": "b"})
    assert await t.counts("batch_1") == (1, 1)
    got = {r.custom_id: r.line for r in await t.results("batch_1")}
    assert got == {"a": {"custom_id": "a", "n": 1}, "b": {"custom_id": "b"}}


async def test_gateways_on_one_postgres_share_batches_and_adopt_a_gone_ones(
        request: pytest.FixtureRequest, tmp_path: Path) -> None:
    g1 = await _open("postgres", tmp_path, request, "g1")
    g2 = await _open("postgres", tmp_path, request, "g2")
    try:
        t1, t2 = BatchTables(g1), BatchTables(g2)
        await t1.create(BATCH, "team-a", {}, await _empty(t1))
        await t1.record("batch_1", "a", True, {})
        seen = await t2.batch("batch_1")
        assert seen is not None and seen.gateway == "g1" and await t2.counts("batch_1") == (1, 0)
        assert await t2.adopt() == []  # g1 is alive: its batch stays its
        async with g1._tx() as tx:  # g1's lease runs out (it was killed: it renews no more)
            await tx.execute("UPDATE gateways SET expires = ? WHERE id = ?", (time.time() - 1, "g1"))
        assert await t2.adopt() == ["batch_1"]
        assert (await t1.batch("batch_1") or seen).gateway == "g2"
        assert await t1.adopt() == []  # g2 runs it now (and is alive)
        await t2.save({**BATCH, "status": "completed"})
        assert await t2.adopt() == []  # finished: nobody runs it
    finally:
        await g1.close()
        await g2.close()


async def test_on_sqlite_a_restarted_gateway_takes_back_its_batches(tmp_path: Path) -> None:
    first = SqliteStore(tmp_path / "gateway.sqlite3")
    await first.open()
    t = BatchTables(first)
    await t.create(BATCH, "team-a", {}, await _empty(t))
    await first.close()
    again = SqliteStore(tmp_path / "gateway.sqlite3")  # a new instance id: the file is its own
    await again.open()
    try:
        assert await BatchTables(again).adopt() == ["batch_1"]
    finally:
        await again.close()
