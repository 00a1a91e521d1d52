"""Batch files in bounded chunks (hearth/gateway/store/chunks.py, migration 5), on SQLite and on a
real PostgreSQL: cut at fixed byte offsets (a file exactly at a chunk boundary, an empty file, a
UTF-8 character cut in two), read back byte for byte a chunk at a time, lines rejoined across
chunks (a line longer than a chunk), a delete that takes every chunk with the row, and a
database of before migration 5 whose whole-value files and batch inputs move into chunks."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from hearth.gateway.store import chunks
from hearth.gateway.store.base import GatewayStore
from hearth.gateway.store.batches import BatchTables
from hearth.gateway.store.postgres import PostgresStore
from hearth.gateway.store.schema import MIGRATIONS, VERSION
from hearth.gateway.store.sqlite import SqliteStore
from hearth.http.batches.lines import Splitter
from tests.helpers.postgres import Postgres

SIZE = 8  # bytes per chunk in these tests


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(chunks, "CHUNK_BYTES", SIZE)


def _new(kind: str, tmp_path: Path, request: pytest.FixtureRequest, instance: str = "g1") -> GatewayStore:
    """A store on the test's database (a second call: the same database)."""
    if kind == "sqlite":
        return SqliteStore(tmp_path / "gateway.sqlite3")
    pg: Postgres = request.getfixturevalue("postgres")
    url = getattr(request.node, "_database", None) or pg.create_database()
    request.node._database = url
    return PostgresStore(url, instance)


@pytest.fixture(params=["sqlite", "postgres"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[GatewayStore]:
    s = _new(request.param, tmp_path, request)
    await s.open()
    yield s
    await s.close()


async def _rows(store: GatewayStore, blob: str) -> list[bytes]:
    async with store._tx() as tx:
        rows = await tx.fetchall("SELECT data FROM batch_file_chunks WHERE file_id = ? ORDER BY idx", (blob,))
    return [bytes(r[0]) for r in rows]


async def _content(t: BatchTables, file_id: str) -> bytes:
    return b"".join([c async for c in t.file_chunks(file_id)])


def test_cut_at_fixed_offsets() -> None:
    assert list(chunks.cut([])) == [] and list(chunks.cut([b"", b""])) == []
    assert list(chunks.cut([b"abcd", b"efgh"])) == [b"abcdefgh"]  # exactly one chunk: no empty one after
    assert list(chunks.cut([b"abcdefghijklmnop"])) == [b"abcdefgh", b"ijklmnop"]  # exactly two
    assert list(chunks.cut([b"a", b"bcdefghi", b"j"])) == [b"abcdefgh", b"ij"]


def test_the_splitter_is_bytes_split_whatever_the_pieces() -> None:
    content = b"one\n\ntwo is a longer line than any piece\nthree\n\xc3\xa9\nlast"
    for step in (1, 2, 3, 5, 8, len(content)):
        split = Splitter()
        got = [x for i in range(0, len(content), step) for x in split.feed(content[i:i + step])]
        got.append(split.end())
        assert got == list(enumerate(content.split(b"\n"), start=1)), step
    split = Splitter()
    assert list(split.feed(b"")) == [] and split.end() == (1, b"")  # an empty file: one empty line


@pytest.mark.parametrize("content", [
    b"",  # no chunks at all
    b"12345678",  # exactly one chunk
    b"1234567\n12345678",  # exactly two
    "{\"a\":\"1234é\"}\n".encode(),  # é's two bytes cut in two by the first boundary
    b"x" * (5 * SIZE + 3) + b"\nshort\n",  # a line five chunks long
])
async def test_a_file_reads_back_byte_for_byte_a_chunk_at_a_time(store: GatewayStore, content: bytes) -> None:
    t = BatchTables(store)
    stored = await t.put_file({"id": "file-1", "bytes": 0}, "team-a", iter([content[:3], content[3:]]))
    assert stored["bytes"] == len(content) and await t.file_size("file-1") == len(content)
    rows = await _rows(store, "file-1")
    assert b"".join(rows) == content and all(len(r) == SIZE for r in rows[:-1]) and all(rows)
    assert len(rows) == -(-len(content) // SIZE)
    got = [c async for c in t.file_chunks("file-1")]
    assert got == rows  # streamed as stored, one chunk per read
    assert [x async for x in t.file_lines("file-1")] == list(enumerate(content.split(b"\n"), start=1))


async def test_a_replaced_file_has_only_its_new_chunks(store: GatewayStore) -> None:
    t = BatchTables(store)
    await t.put_file({"id": "file-1"}, "team-a", b"a" * (3 * SIZE))
    await t.put_file({"id": "file-1"}, "team-a", b"short")
    assert await _rows(store, "file-1") == [b"short"] and await _content(t, "file-1") == b"short"


async def test_delete_removes_every_chunk_with_the_row(store: GatewayStore) -> None:
    t = BatchTables(store)
    await t.put_file({"id": "file-1"}, "team-a", b"z" * (4 * SIZE + 1))
    await t.put_file({"id": "file-2"}, "team-a", b"kept")
    assert len(await _rows(store, "file-1")) == 5
    await t.delete_file("file-1")
    assert await t.file("file-1") is None and await _rows(store, "file-1") == []
    assert await _rows(store, "file-2") == [b"kept"]  # another file's chunks stay


async def test_a_batch_copies_its_input_inside_the_database(store: GatewayStore) -> None:
    t = BatchTables(store)
    content = b"".join(json.dumps({"custom_id": f"c{i}", "body": {"n": "é" * i}}).encode() + b"\n" for i in range(5))
    await t.put_file({"id": "file-in"}, "team-a", content)
    assert await t.create({"id": "batch_1", "status": "validating"}, "team-a", {}, "file-in")
    await t.delete_file("file-in")
    assert b"".join(await _rows(store, "batch_1")) == content
    assert [x async for x in t.input_lines("batch_1")] == list(enumerate(content.split(b"\n"), start=1))


async def _at_version_4(store: GatewayStore) -> None:
    """The schema as the code before chunks left it (migrations 1-4)."""
    async with store._tx(migrate=True) as tx:
        await tx.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
        for number, steps in MIGRATIONS:
            if number <= 4:
                for step in steps:
                    assert isinstance(step, str)
                    await tx.execute(step)
                await tx.execute("INSERT INTO schema_version VALUES (?)", (number,))


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_a_database_of_before_chunks_moves_its_files_into_chunks(
        kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    old = _new(kind, tmp_path, request)
    if isinstance(old, PostgresStore):
        await old._pool.open(wait=True)
    await _at_version_4(old)
    text = "{\"custom_id\":\"a\",\"body\":{\"q\":\"café über ✓\"}}\n{\"custom_id\":\"b\",\"body\":{}}\n"
    obj = {"id": "file-old", "object": "file", "bytes": len(text.encode()), "purpose": "batch"}
    async with old._tx() as tx:  # as the code of then wrote them: the whole content in one TEXT value
        await tx.execute("INSERT INTO batch_files VALUES (?, ?, ?, ?, ?)",
                         ("file-old", "team-a", json.dumps(obj), text, 1.0))
        await tx.execute("INSERT INTO batch_files VALUES (?, ?, ?, ?, ?)", ("file-empty", "team-a", "{}", "", 2.0))
        await tx.execute("INSERT INTO batches VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                         ("batch_old", "team-a", "{}", "in_progress", "{}", text, "g0", 1.0))
    await old.close()

    store = _new(kind, tmp_path, request, "g2")
    await store.open()
    try:
        t = BatchTables(store)
        assert await t.file("file-old") == (obj, "team-a")
        assert await _content(t, "file-old") == text.encode() and await t.file_size("file-old") == obj["bytes"]
        assert all(len(r) <= SIZE for r in await _rows(store, "file-old"))
        assert await _content(t, "file-empty") == b""
        assert b"".join([x + b"\n" async for _, x in t.input_lines("batch_old")]) == text.encode() + b"\n"
        async with store._tx() as tx:  # the old columns are emptied, the version recorded
            assert await tx.fetchall("SELECT id FROM batch_files WHERE content <> ''") == []
            assert await tx.fetchall("SELECT id FROM batches WHERE input <> ''") == []
            assert (await tx.fetchone("SELECT MAX(version) FROM schema_version") or [0])[0] == VERSION
        assert await store.migrate() == VERSION and await _content(t, "file-old") == text.encode()  # once only
    finally:
        await store.close()
