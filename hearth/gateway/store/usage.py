"""The gateway's usage ledger: one durable row per generation turn in the gateway's store
(`usage`, schema.py migration 3), so several gateways on one PostgreSQL keep one ledger
(docs/gateway.md, "Usage ledger").

`GatewayLedger.record` only appends to a bounded in-memory queue: the answer never waits for the
database. One background task takes what has queued, up to BATCH rows, and writes them in one
transaction (multi-row INSERTs of CHUNK rows: one round trip each on PostgreSQL). It lingers as
the node's writer does (hearth/observability/linger.py): woken by the first row after a quiet
spell, it waits LINGER seconds for more before it writes, so a busy gateway makes one
transaction per LINGER, not one per wakeup (on SQLite each is a commit on the event loop, which
every request in flight waits behind). `flush()` and `close()` cut the wait short. A full queue
(the database cannot keep up, or is away) drops the row and counts it (`dropped`); a failed
write drops its batch, counted too: losing a row beats slowing or failing every request.

Invariants: rows are only appended; `at` is wall-clock seconds (when the turn ended), so rows of
different gateways sort together; a query sees every row recorded before it once `flush()` has
returned. A failed-over turn is one row: its node's usage counts the partial answer before the
cut as output (`partial_is_output`, failover/cuts/base.py), so `generated_tokens` holds both
parts, once; `failovers` and `nodes` say where it ran.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging
from collections.abc import Awaitable, Mapping
from dataclasses import astuple, dataclass, fields
from typing import Any

from hearth.gateway.store.base import GatewayStore
from hearth.observability.ledger import UsageFilter  # the node's filters, one spelling

log = logging.getLogger("hearth.gateway")

SETTLE_AT_CLOSE = 2.0  # seconds a stopping gateway waits for the node counts of cancelled turns
QUEUE = 10_000  # rows waiting for the writer at most; more are dropped (and counted)
BATCH = 512  # rows per transaction at most
LINGER = 0.05  # seconds the writer waits for more rows once woken (flush/close: none), as the node's
CHUNK = 64  # rows per INSERT statement
GROUPS = ("day", "key", "model", "tenant", "node")


@dataclass(frozen=True, slots=True)
class TurnUsage:
    """What one turn through the gateway used, as its nodes reported it."""

    at: float  # wall clock, when the turn ended
    request_id: str  # the answer's id (the node's row has the same), else the gateway's request id
    gateway: str  # the gateway that relayed it (its store instance id)
    tenant: str  # "": the admin, or a gateway without keys
    key: str | None  # the client key's name (never the key)
    via: str | None  # a key that spoke for `tenant` (`on_behalf`): its name
    model: str  # the alias the client asked for
    endpoint: str  # chat, completions, messages, responses, ollama_chat, ollama_generate, embeddings, ollama_embed,
    # ollama_embeddings (turn/watch.py, ENDPOINTS)
    node: str | None  # the node that ended it (None: none answered)
    nodes: str  # every node it ran on, in order, comma-separated (retries and failovers)
    failovers: int = 0  # times it went on on another node mid-answer
    retries: int = 0  # nodes that failed before the first byte
    prompt_tokens: int = 0
    cached_tokens: int = 0
    generated_tokens: int = 0  # both parts of a failed-over answer, once
    discarded_tokens: int = 0  # generated after the last delivery (a cancelled stream, from its node's ledger)
    finish_reason: str | None = None
    cancelled: str | None = None  # disconnect: the client left before the end
    error: str | None = None
    status: int | None = None  # the HTTP status the client got
    ttft_ms: float | None = None  # arrival to the first byte relayed
    total_ms: float = 0.0


COLUMNS = tuple(f.name for f in fields(TurnUsage))
_SUMS = ("COUNT(*) AS requests, SUM(prompt_tokens) AS prompt_tokens, SUM(cached_tokens) AS cached_tokens, "
         "SUM(generated_tokens) AS generated_tokens, SUM(discarded_tokens) AS discarded_tokens, "
         "SUM(failovers) AS failovers, "
         "SUM(CASE WHEN cancelled IS NULL THEN 0 ELSE 1 END) AS cancelled")
_SUM_NAMES = ("requests", "prompt_tokens", "cached_tokens", "generated_tokens", "discarded_tokens", "failovers",
              "cancelled")


class GatewayLedger:
    def __init__(self, store: GatewayStore, capacity: int = QUEUE, linger: float = LINGER) -> None:
        self.store = store
        self.capacity = capacity
        self.linger = linger
        self._queue: collections.deque[TurnUsage] = collections.deque()
        self._wake = asyncio.Event()
        self._hurry = asyncio.Event()  # flush() or close(): write now, no linger
        self._idle = asyncio.Event()
        self._idle.set()
        self._writing = 0  # rows taken by the writer, not yet committed
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._settling: set[asyncio.Task[None]] = set()
        self.dropped = 0
        self.written = 0
        self.batches = 0  # transactions written

    # ---- writing ------------------------------------------------------------------------------

    def start(self) -> None:
        if self._task is None:
            self._stopping = False
            self._task = asyncio.get_running_loop().create_task(self._write_loop(), name="hearth-gateway-ledger")

    def record(self, row: TurnUsage) -> None:
        """Queue `row` for the writer; never waits (a full queue drops it, counted)."""
        if len(self._queue) >= self.capacity:
            self.dropped += 1
            return
        self._queue.append(row)
        self._idle.clear()
        self._wake.set()

    def settle(self, row: TurnUsage, counts: Awaitable[Mapping[str, Any] | None]) -> None:
        """Queue `row` once `counts` (its node's own counts of the turn: prompt, cached,
        generated and discarded tokens; None: keep the row's) has answered, in a task of its own
        (turn/settle.py: a cancelled stream)."""
        task = asyncio.get_running_loop().create_task(self._settle(row, counts))
        self._settling.add(task)
        task.add_done_callback(self._settling.discard)

    async def _settle(self, row: TurnUsage, counts: Awaitable[Mapping[str, Any] | None]) -> None:
        found: Mapping[str, Any] | None = None
        try:
            found = await counts
        except Exception as e:
            log.warning("usage ledger: a cancelled turn's node counts could not be read: %s", e)
        finally:  # cancelled at shutdown too: the row goes in with what the gateway saw
            if found:
                row = dataclasses.replace(
                    row, prompt_tokens=_count(found, "prompt_tokens"), cached_tokens=_count(found, "cached_tokens"),
                    generated_tokens=_count(found, "generated_tokens"),
                    discarded_tokens=_count(found, "discarded_tokens"))
            self.record(row)

    @property
    def settling(self) -> int:
        return len(self._settling)

    @property
    def depth(self) -> int:
        return len(self._queue)

    async def _write_loop(self) -> None:
        more = False  # rows were left after the last batch: write them at once
        while True:
            if not self._queue:
                self._idle.set()
                if self._stopping:
                    return
                self._hurry.clear()  # what a flush waited for is written
                self._wake.clear()
                await self._wake.wait()
                continue
            if not (more or self._stopping or self._hurry.is_set()):
                with contextlib.suppress(TimeoutError):  # linger: let the rows of a busy spell gather
                    await asyncio.wait_for(self._hurry.wait(), self.linger)
            batch = [self._queue.popleft() for _ in range(min(BATCH, len(self._queue)))]
            more = bool(self._queue)
            self._writing = len(batch)
            try:
                await self._write(batch)
                self.written += len(batch)
                self.batches += 1
            except Exception as e:  # the database went away: the gateway goes on
                self.dropped += len(batch)
                log.warning("usage ledger: %d rows dropped: %s", len(batch), e)
            finally:
                self._writing = 0

    async def _write(self, batch: list[TurnUsage]) -> None:
        async with self.store._tx() as tx:  # the store package's own transaction
            for i in range(0, len(batch), CHUNK):
                part = batch[i:i + CHUNK]
                marks = "(" + ", ".join("?" for _ in COLUMNS) + ")"
                await tx.execute(f"INSERT INTO usage ({', '.join(COLUMNS)}) VALUES "
                                 + ", ".join(marks for _ in part), [v for r in part for v in astuple(r)])

    async def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every row recorded so far is committed (or dropped); False on timeout."""
        if self._task is None:
            return not self._queue
        if not self._idle.is_set():
            self._hurry.set()
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            return False
        return True

    async def close(self) -> None:
        """Write what is queued, then stop the writer."""
        if self._settling:
            _, late = await asyncio.wait(set(self._settling), timeout=SETTLE_AT_CLOSE)
            for t in late:
                t.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await t
        task, self._task = self._task, None
        if task is None:
            return
        self._stopping = True
        self._hurry.set()
        self._wake.set()
        try:
            await asyncio.wait_for(task, 10.0)
        except TimeoutError:
            log.warning("usage ledger: %d rows not written at shutdown", len(self._queue))

    # ---- reading ------------------------------------------------------------------------------

    async def rows(self, q: UsageFilter, limit: int = 1000) -> list[dict[str, Any]]:
        """The rows matching `q`, newest first."""
        where, args = q.where()
        async with self.store._tx() as tx:
            found = await tx.fetchall(f"SELECT {', '.join(COLUMNS)} FROM usage{where} ORDER BY at DESC LIMIT ?",
                                      [*args, limit])
        return [dict(zip(COLUMNS, row, strict=True)) for row in found]

    async def totals(self, q: UsageFilter, group: list[str]) -> list[dict[str, Any]]:
        """Sums over the rows matching `q`, one per value of the `group` columns."""
        if any(g not in GROUPS for g in group):
            raise ValueError(f"group must be among {', '.join(GROUPS)}")
        where, args = q.where()
        keys = [f"{self.store.day_sql if g == 'day' else g} AS {g}" for g in group]
        sql = f"SELECT {', '.join([*keys, _SUMS])} FROM usage{where}"
        if group:
            sql += f" GROUP BY {', '.join(group)} ORDER BY {', '.join(group)}"
        async with self.store._tx() as tx:
            found = await tx.fetchall(sql, args)
        names = [*group, *_SUM_NAMES]
        return [{n: v if n in group else int(v or 0) for n, v in zip(names, row, strict=True)} for row in found]


def _count(row: Mapping[str, Any], name: str) -> int:
    value = row.get(name)
    return value if isinstance(value, int) and value >= 0 else 0
