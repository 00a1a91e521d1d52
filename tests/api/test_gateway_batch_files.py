"""The gateway's batch files in bounded chunks, in-process (docs/gateway.md, "Batches", storage):
an upload of many chunks stored and read back byte for byte, `/content` sent as one body message
per stored chunk, a batch over a many-chunk file that runs every line exactly once, upload errors
with their line numbers past a chunk boundary and nothing stored for a refused file. The chunk
size is made small (4 KiB) so a file of a few lines spans several chunks, except in the test of
real 1 MiB chunks."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from hearth.gateway.state import gateway_of
from hearth.gateway.store import chunks
from hearth.http.batches import requests as batch_requests
from tests.api.test_gateway_batches import ALICE, CHAT, World, jsonl, line, world
from tests.helpers.postgres import Postgres

SMALL = 4096


def _rows_sql(file_id: str) -> tuple[str, tuple[str]]:
    return "SELECT LENGTH(data) FROM batch_file_chunks WHERE file_id = ? ORDER BY idx", (file_id,)


async def chunk_sizes(w: World, file_id: str) -> list[int]:
    """The sizes of a file's chunks as stored."""
    async with gateway_of(w.app).store._tx() as tx:
        return [int(r[0]) for r in await tx.fetchall(*_rows_sql(file_id))]


async def body_messages(w: World, path: str, headers: dict[str, str]) -> tuple[int, list[bytes]]:
    """GET `path` on the gateway's ASGI app directly: the status and each body message's bytes
    (httpx's ASGI transport joins them)."""
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(k.lower().encode(), v.encode()) for k, v in {"host": "gw.test", **headers}.items()],
             "client": ("127.0.0.1", 50000), "server": ("gw.test", 80)}
    asked = False
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        nonlocal asked
        if not asked:
            asked = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await asyncio.Event().wait()  # the client stays connected
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await w.app(scope, receive, send)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    return status, [m.get("body", b"") for m in sent if m["type"] == "http.response.body" and m.get("body")]


def many_chunks_file(n: int) -> bytes:
    """`n` lines, a blank one among them, one line several chunks long made of 3-byte characters,
    so that chunk boundaries fall inside lines and inside a character."""
    rows: list[Any] = [line(f"r{i}") for i in range(n)]
    rows[3] = json.dumps(line("r3", messages=[{"role": "user", "content": "✓" * SMALL}]), ensure_ascii=False).encode()
    rows.insert(5, b"")
    return jsonl(rows)


async def test_a_file_of_many_chunks_round_trips_and_its_batch_runs_every_line_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(chunks, "CHUNK_BYTES", SMALL)
    content = many_chunks_file(40)
    boundaries = range(SMALL, len(content), SMALL)
    assert any(content[k] & 0xC0 == 0x80 for k in boundaries)  # a boundary cuts a character in two
    async with world(tmp_path) as w:
        r = await w.upload(content)
        assert r.status_code == 200, r.text
        fid = r.json()["id"]
        assert r.json()["bytes"] == len(content)
        sizes = await chunk_sizes(w, fid)
        assert len(sizes) == len(boundaries) + 1 and sizes[:-1] == [SMALL] * len(boundaries)
        got = await w.gw.get(f"/v1/files/{fid}/content", headers=ALICE)
        assert got.status_code == 200 and got.content == content
        assert got.headers["content-length"] == str(len(content))
        status, bodies = await body_messages(w, f"/v1/files/{fid}/content", ALICE)
        assert status == 200 and [len(b) for b in bodies] == sizes and b"".join(bodies) == content

        r = await w.gw.post("/v1/batches", json={"input_file_id": fid, "endpoint": CHAT, "completion_window": "24h"},
                            headers=ALICE)
        assert r.status_code == 200 and r.json()["request_counts"]["total"] == 40, r.text
        assert (await w.gw.delete(f"/v1/files/{fid}", headers=ALICE)).status_code == 200
        assert await chunk_sizes(w, fid) == []  # the file's chunks went with it; the batch has its copy
        done = await w.done(r.json()["id"])
        # r3 is longer than the fake model's context: its answer (a 400) goes to the error file
        assert done["status"] == "completed" and done["request_counts"] == {"total": 40, "completed": 39, "failed": 1}
        out = await w.output(done["output_file_id"])
        assert [o["custom_id"] for o in out] == [f"r{i}" for i in range(40) if i != 3]  # input order, each once
        [err] = await w.output(done["error_file_id"])
        assert err["custom_id"] == "r3" and err["response"]["body"]["error"]["code"] == "context_length_exceeded"
        assert sum(w.fleet.served.values()) == 40  # every line sent once: none twice, none lost
        raw = (await w.gw.get(f"/v1/files/{done['output_file_id']}/content", headers=ALICE)).content
        meta = (await w.gw.get(f"/v1/files/{done['output_file_id']}", headers=ALICE)).json()
        out_sizes = await chunk_sizes(w, done["output_file_id"])
        assert len(out_sizes) > 1 and sum(out_sizes) == len(raw) == meta["bytes"]


async def test_a_file_of_real_chunks_round_trips_byte_for_byte(tmp_path: Path) -> None:
    content = real_chunks_file()
    async with world(tmp_path) as w:
        r = await w.upload(content)
        assert r.status_code == 200, r.text
        fid = r.json()["id"]
        sizes = await chunk_sizes(w, fid)
        whole, rest = divmod(len(content), chunks.CHUNK_BYTES)
        assert whole >= 3 and sizes == [chunks.CHUNK_BYTES] * whole + [rest]
        got = await w.gw.get(f"/v1/files/{fid}/content", headers=ALICE)
        assert got.status_code == 200 and got.content == content


async def test_two_gateways_on_one_postgres_read_the_same_chunks(tmp_path: Path, postgres: Postgres) -> None:
    """Uploaded through one gateway, read whole through the other, deleted there: gone for both."""
    content = real_chunks_file()
    url = postgres.create_database()
    async with world(tmp_path / "one", database=url) as w1, world(tmp_path / "two", database=url) as w2:
        r = await w1.upload(content)
        assert r.status_code == 200, r.text
        fid = r.json()["id"]
        assert len(await chunk_sizes(w2, fid)) == -(-len(content) // chunks.CHUNK_BYTES)
        got = await w2.gw.get(f"/v1/files/{fid}/content", headers=ALICE)
        assert got.status_code == 200 and got.content == content
        assert (await w2.gw.delete(f"/v1/files/{fid}", headers=ALICE)).status_code == 200
        assert (await w1.gw.get(f"/v1/files/{fid}/content", headers=ALICE)).status_code == 404
        assert await chunk_sizes(w1, fid) == []


def real_chunks_file() -> bytes:
    """About 3.6 MB: 30 lines of about 120 kB of 1-, 2- and 3-byte characters."""
    one = json.dumps(line("x", messages=[{"role": "user", "content": "é✓ " * 20_000}]), ensure_ascii=False).encode()
    return b"".join(one.replace(b'"x"', f'"x{i}"'.encode()) + b"\n" for i in range(30))


async def test_upload_errors_keep_their_line_numbers_and_store_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(chunks, "CHUNK_BYTES", SMALL)
    good = many_chunks_file(30)
    assert good.count(b"\n") == 31 and len(good) > 3 * SMALL
    async with world(tmp_path) as w:
        for bad, message in ((good + b"{oops\n", "line 32: not acceptable JSON"),
                             (good + json.dumps(line("r1")).encode(), "line 32: duplicate custom_id 'r1'"),
                             (b"\n\n", "the file holds no requests")):
            r = await w.upload(bad)
            assert r.status_code == 400 and r.json()["error"]["message"].startswith(message), r.text
        monkeypatch.setattr(batch_requests, "MAX_FILE_BYTES", len(good) - 1)
        monkeypatch.setattr("hearth.gateway.edge.batches.MAX_FILE_BYTES", len(good) - 1)
        r = await w.upload(good)
        assert r.status_code == 413 and r.json()["error"]["param"] == "file", r.text
        async with gateway_of(w.app).store._tx() as tx:  # a refused file left nothing behind
            assert await tx.fetchall("SELECT file_id FROM batch_file_chunks") == []
            assert await tx.fetchall("SELECT id FROM batch_files") == []
