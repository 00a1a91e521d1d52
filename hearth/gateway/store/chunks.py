"""The content of the Batch API's files in bounded chunks (`batch_file_chunks`, schema.py
migration 5): rows (blob, idx, data) of at most CHUNK_BYTES bytes each, idx 0, 1, 2, ... in
order; the content is their concatenation. A blob is a file's id (an upload, a batch's output or
error file) or a batch's id (the batch's own copy of its input file). No chunks: empty content.

Decisions:
- Bytes (BYTEA; SQLite gives that name NUMERIC affinity, which stores a bytes value as a BLOB
  untouched), cut at fixed byte offsets, not on line boundaries: a download is the stored bytes
  exactly, whatever they are, and a line reader must carry a partial line across chunks anyway
  (a line may be longer than a chunk), so aligning chunks to lines would buy nothing. A UTF-8
  character cut in two is rejoined by the reader, which only decodes whole lines.
- Written in one transaction with the file's row (batches.py), so a file is all there or not
  at all, and a crash leaves no orphan chunks to sweep; read one chunk per transaction, so no
  transaction is held across a client's download or a batch's run.
- Files stored by the code before migration 5 (one TEXT value per file in `batch_files.content`,
  and a batch's input in `batches.input`) are moved into chunks by `move_legacy`, once, inside
  the migration's transaction (on PostgreSQL under the migration lock, so one gateway does it);
  the old columns then hold ''. It reads each old value whole (one at a time): that value was
  written whole by the code of then, and SQL slicing of a 200 MB value re-reads it per slice.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from contextlib import AbstractAsyncContextManager

from hearth.gateway.store.tx import Tx
from hearth.http.batches.lines import Splitter

CHUNK_BYTES = 1024 * 1024  # read where used (tests make it small)


def cut(pieces: Iterable[bytes], size: int | None = None) -> Iterator[bytes]:
    """The chunks of the concatenation of `pieces`: each `size` bytes (CHUNK_BYTES), the last
    one shorter (none for empty content). Holds at most one chunk plus one piece."""
    size = size or CHUNK_BYTES
    buf = bytearray()
    for piece in pieces:
        buf += piece
        while len(buf) >= size:
            yield bytes(buf[:size])
            del buf[:size]
    if buf:
        yield bytes(buf)


async def write(tx: Tx, blob: str, pieces: Iterable[bytes], size: int | None = None) -> int:
    """Replace the blob's chunks with the content `pieces` make (in `tx`); its length in bytes."""
    await tx.execute("DELETE FROM batch_file_chunks WHERE file_id = ?", (blob,))
    total = 0
    for idx, chunk in enumerate(cut(pieces, size)):
        # ON CONFLICT: two gateways writing one derived file at once (a batch adopted while its
        # old gateway finalized it) write the same bytes; the second waits, then overwrites
        await tx.execute("INSERT INTO batch_file_chunks (file_id, idx, data) VALUES (?, ?, ?) "
                         "ON CONFLICT (file_id, idx) DO UPDATE SET data = excluded.data", (blob, idx, chunk))
        total += len(chunk)
    return total


async def copy(tx: Tx, src: str, dst: str) -> None:
    """Blob `dst` becomes a copy of `src`, inside the database (no chunk passes through here)."""
    await tx.execute("DELETE FROM batch_file_chunks WHERE file_id = ?", (dst,))
    await tx.execute("INSERT INTO batch_file_chunks (file_id, idx, data) SELECT ?, idx, data FROM batch_file_chunks "
                     "WHERE file_id = ?", (dst, src))


async def drop(tx: Tx, blob: str) -> None:
    await tx.execute("DELETE FROM batch_file_chunks WHERE file_id = ?", (blob,))


async def size(tx: Tx, blob: str) -> int:
    row = await tx.fetchone("SELECT COALESCE(SUM(LENGTH(data)), 0) FROM batch_file_chunks WHERE file_id = ?", (blob,))
    return int(row[0]) if row else 0


async def read(begin: Callable[[], AbstractAsyncContextManager[Tx]], blob: str) -> AsyncIterator[bytes]:
    """The blob's chunks in order, each read in its own transaction (`begin`). A blob replaced
    or deleted while it is read ends at the first chunk missing."""
    idx = 0
    while True:
        async with begin() as tx:
            row = await tx.fetchone("SELECT data FROM batch_file_chunks WHERE file_id = ? AND idx = ?", (blob, idx))
        if row is None:
            return
        yield bytes(row[0])
        idx += 1
        await asyncio.sleep(0)  # SQLite's reads never suspend: let the loop run between chunks


async def lines(chunks: AsyncIterator[bytes]) -> AsyncIterator[tuple[int, bytes]]:
    """(1-based line number, the line without its b"\\n") for every line of the content, split
    as `bytes.split(b"\\n")` would (lines.Splitter). Holds one chunk and the line being completed."""
    split = Splitter()
    async for chunk in chunks:
        for numbered in split.feed(chunk):
            yield numbered
    yield split.end()


# ---- migration 5's data step ---------------------------------------------------------------------


def _encoded(text: str) -> Iterator[bytes]:
    step = CHUNK_BYTES
    for i in range(0, len(text), step):
        yield text[i:i + step].encode("utf-8")


async def move_legacy(tx: Tx) -> None:
    """Every file's content and every batch's input, stored whole before migration 5, into chunks."""
    for table, column in (("batch_files", "content"), ("batches", "input")):
        ids = [r[0] for r in await tx.fetchall(f"SELECT id FROM {table} WHERE {column} <> ''")]
        for blob in ids:
            row = await tx.fetchone(f"SELECT {column} FROM {table} WHERE id = ?", (blob,))
            await write(tx, str(blob), _encoded(str(row[0]) if row else ""))
            await tx.execute(f"UPDATE {table} SET {column} = '' WHERE id = ?", (blob,))
