"""The Batch API's tables in the gateway's database (schema.py, migration 3), so every gateway on
one PostgreSQL sees the same files and batches (gateway/batches/ runs them):

- `batch_files`: each file's object and owner (a tenant): an input file a client uploaded, or a
  batch's output or error file, whose id is derived from the batch's. Its content (JSONL) is in
  `batch_file_chunks` (chunks.py: bounded chunks, written in one transaction with the row, read
  one chunk per transaction, deleted with the row); the old `content` column holds '';
- `batches`: each batch's object (`status` copied out for queries), owner, the caller its lines
  run as (tenant, key name and class, never a key), and the gateway that runs it (`gateway`, one
  of `gateways`: a batch whose gateway is gone is adopted by a live one). Its own copy of the
  input file is in `batch_file_chunks` under the batch's id (copied inside the database when
  the batch is created, so deleting the input file leaves the batch its lines); the old `input`
  column holds '';
- `batch_results`: one row per finished line, keyed by (batch, custom_id): a line is done once
  its row is in, and a second answer for it is never recorded (INSERT ... ON CONFLICT DO
  NOTHING), so a resumed batch neither loses a line nor writes one twice.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import Any

from hearth.gateway.store import chunks
from hearth.gateway.store.base import GatewayStore

LIVE = ("validating", "in_progress", "finalizing", "cancelling")


@dataclass(frozen=True, slots=True)
class BatchRow:
    obj: dict[str, Any]
    owner: str
    caller: dict[str, Any]
    gateway: str


@dataclass(frozen=True, slots=True)
class Result:
    custom_id: str
    ok: bool
    line: dict[str, Any]


class BatchTables:
    def __init__(self, store: GatewayStore) -> None:
        self.store = store

    # ---- files ---------------------------------------------------------------------------------

    async def put_file(self, obj: dict[str, Any], owner: str, content: bytes | Iterable[bytes]) -> dict[str, Any]:
        """Store a file, its row and its chunks in one transaction (a derived output file's id
        again: replaced, never a second one). `content`: the bytes, or pieces of them read as
        they are written (never joined). The object stored: `obj` with `bytes` counted."""
        pieces = [content] if isinstance(content, bytes) else content
        async with self.store._tx() as tx:
            total = await chunks.write(tx, obj["id"], pieces)
            stored = {**obj, "bytes": total}
            await tx.execute("INSERT INTO batch_files VALUES (?, ?, ?, '', ?) ON CONFLICT(id) DO UPDATE SET "
                             "owner = excluded.owner, obj = excluded.obj, content = ''",
                             (obj["id"], owner, json.dumps(stored), time.time()))
        return stored

    async def file(self, file_id: str) -> tuple[dict[str, Any], str] | None:
        """A file's object and owner."""
        async with self.store._tx() as tx:
            row = await tx.fetchone("SELECT obj, owner FROM batch_files WHERE id = ?", (file_id,))
        return (json.loads(row[0]), str(row[1])) if row else None

    async def file_size(self, file_id: str) -> int:
        """The bytes its chunks hold."""
        async with self.store._tx() as tx:
            return await chunks.size(tx, file_id)

    def file_chunks(self, file_id: str) -> AsyncIterator[bytes]:
        """A file's content, chunk by chunk (chunks.read: one transaction each)."""
        return chunks.read(self.store._tx, file_id)

    def file_lines(self, file_id: str) -> AsyncIterator[tuple[int, bytes]]:
        """A file's lines (1-based number, bytes), split as `bytes.split(b"\\n")` would."""
        return chunks.lines(self.file_chunks(file_id))

    async def delete_file(self, file_id: str) -> None:
        """The file's row and every chunk, in one transaction."""
        async with self.store._tx() as tx:
            await tx.execute("DELETE FROM batch_files WHERE id = ?", (file_id,))
            await chunks.drop(tx, file_id)

    async def files(self, owner: str | None) -> list[dict[str, Any]]:
        """The files of `owner` (None: every owner's), newest first."""
        where, params = ("WHERE owner = ?", (owner,)) if owner is not None else ("", ())
        async with self.store._tx() as tx:
            rows = await tx.fetchall(f"SELECT obj FROM batch_files {where} ORDER BY created DESC", params)
        return [json.loads(r[0]) for r in rows]

    # ---- batches -------------------------------------------------------------------------------

    async def create(self, obj: dict[str, Any], owner: str, caller: dict[str, Any], input_file_id: str) -> bool:
        """A new batch, run by this gateway, with its own copy of the input file's chunks (one
        transaction); False, and nothing written, when that file is gone."""
        async with self.store._tx() as tx:
            if await tx.fetchone("SELECT id FROM batch_files WHERE id = ?", (input_file_id,)) is None:
                return False
            await tx.execute("INSERT INTO batches VALUES (?, ?, ?, ?, ?, '', ?, ?)",
                             (obj["id"], owner, json.dumps(caller), obj["status"], json.dumps(obj),
                              self.store.instance, time.time()))
            await chunks.copy(tx, input_file_id, obj["id"])
        return True

    async def batch(self, batch_id: str) -> BatchRow | None:
        async with self.store._tx() as tx:
            row = await tx.fetchone("SELECT obj, owner, caller, gateway FROM batches WHERE id = ?", (batch_id,))
        return BatchRow(json.loads(row[0]), str(row[1]), json.loads(row[2]), str(row[3])) if row else None

    async def batches(self, owner: str | None) -> list[BatchRow]:
        where, params = ("WHERE owner = ?", (owner,)) if owner is not None else ("", ())
        async with self.store._tx() as tx:
            rows = await tx.fetchall(f"SELECT obj, owner, caller, gateway FROM batches {where} "
                                     "ORDER BY created DESC", params)
        return [BatchRow(json.loads(r[0]), str(r[1]), json.loads(r[2]), str(r[3])) for r in rows]

    def input_lines(self, batch_id: str) -> AsyncIterator[tuple[int, bytes]]:
        """The lines of the batch's copy of its input file (1-based number, bytes), read chunk
        by chunk."""
        return chunks.lines(chunks.read(self.store._tx, batch_id))

    async def save(self, obj: dict[str, Any], only_if: tuple[str, ...] | None = None) -> bool:
        """Write the batch's object (and status); with `only_if`, only while its status is one
        of those (a cancel racing a finish: the first write wins). Whether it was written."""
        sql = "UPDATE batches SET obj = ?, status = ? WHERE id = ?"
        params: tuple[Any, ...] = (json.dumps(obj), obj["status"], obj["id"])
        if only_if:
            sql += f" AND status IN ({', '.join('?' for _ in only_if)})"
            params += only_if
        async with self.store._tx() as tx:
            return await tx.execute(sql, params) > 0

    async def adopt(self) -> list[str]:
        """Take over the live batches whose gateway is gone (not in `gateways` any more, or this
        one's before a restart); the ids this gateway now runs."""
        me = self.store.instance
        async with self.store._tx() as tx:
            alive = {r[0] for r in await tx.fetchall("SELECT id FROM gateways WHERE expires > ?", (time.time(),))}
            marks = ", ".join("?" for _ in LIVE)
            rows = await tx.fetchall(f"SELECT id, gateway FROM batches WHERE status IN ({marks})", LIVE)
            mine = []
            claim = "UPDATE batches SET gateway = ? WHERE id = ? AND gateway = ?"
            for batch_id, gateway in rows:
                if gateway == me or (gateway not in alive and await tx.execute(claim, (me, batch_id, gateway))):
                    mine.append(str(batch_id))
        return mine

    # ---- lines ---------------------------------------------------------------------------------

    async def record(self, batch_id: str, custom_id: str, ok: bool, line: dict[str, Any]) -> bool:
        """Note that line `custom_id` finished with output `line`; False if it already had."""
        async with self.store._tx() as tx:
            return await tx.execute("INSERT INTO batch_results VALUES (?, ?, ?, ?, ?) "
                                    "ON CONFLICT(batch_id, custom_id) DO NOTHING",
                                    (batch_id, custom_id, int(ok), json.dumps(line), time.time())) > 0

    async def results(self, batch_id: str) -> list[Result]:
        async with self.store._tx() as tx:
            rows = await tx.fetchall("SELECT custom_id, ok, line FROM batch_results WHERE batch_id = ?", (batch_id,))
        return [Result(str(r[0]), bool(r[1]), json.loads(r[2])) for r in rows]

    async def statuses(self) -> dict[str, int]:
        """How many batches the database holds, by status (for /metrics: one GROUP BY over the
        batches, not their lines)."""
        async with self.store._tx() as tx:
            rows = await tx.fetchall("SELECT status, COUNT(*) FROM batches GROUP BY status", ())
        return {str(r[0]): int(r[1]) for r in rows}

    async def counts(self, batch_id: str) -> tuple[int, int]:
        """(completed, failed) lines so far."""
        async with self.store._tx() as tx:
            rows = await tx.fetchall("SELECT ok, COUNT(*) FROM batch_results WHERE batch_id = ? GROUP BY ok",
                                     (batch_id,))
        by = {bool(r[0]): int(r[1]) for r in rows}
        return by.get(True, 0), by.get(False, 0)
