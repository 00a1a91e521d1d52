"""The usage ledger: one durable row per request, written off the request path (docs/api.md,
"Usage ledger").

`Ledger.record` only appends to a bounded in-memory queue and returns: the answer never waits
for the disk. One background thread takes what has queued, up to BATCH rows at a time, and
writes them in one transaction to `usage.db` in the data directory (SQLite, WAL; a file of its
own, so the ledger's writes never queue behind the other stores'). When the queue is full (the
disk cannot keep up) a record is dropped and counted (`dropped`, on /metrics as
`hearth_usage_ledger_dropped_total`): losing a row is better than slowing every request.

The writer lingers (hearth.observability.linger): woken by the first row after a quiet spell,
it waits LINGER seconds for more and writes them in one transaction, so a busy server pays one
thread wakeup and one transaction per LINGER, not per request. `flush()` and `close()` cut the
wait short.

Invariants: rows are only appended, never updated; `at` is wall-clock seconds (the time the
request ended), so rows of different processes and restarts sort together; a query sees every
row recorded before it once `flush()` has returned (tests, shutdown).
"""

from __future__ import annotations

import operator
import sqlite3
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from hearth.db import connect
from hearth.observability.linger import Lingering

QUEUE = 10_000  # rows waiting for the writer at most; more are dropped (and counted)
BATCH = 512  # rows per transaction at most
LINGER = 0.05  # seconds the writer waits for more rows once woken (flush/close: none)
GROUPS = ("day", "key", "model", "tenant")


@dataclass(frozen=True, slots=True)
class UsageRecord:
    """What one request used. `generated` counts every token the model sampled for it (a
    cancelled or disconnected stream: those sampled before the stop), `discarded` the part of
    them no client received (sampled after the last delivery, held back by a stop string)."""

    at: float  # wall clock, when the request ended
    request_id: str
    tenant: str  # "" : the admin, or a node without keys
    key: str | None  # the key's name (never the key); None: no keys on this node
    via: str | None  # a gateway key that spoke for `tenant`: its name
    model: str
    endpoint: str  # chat, completions, messages, responses, embeddings, ollama_chat, ...
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens reused from the prompt cache
    cache_tier: str | None = None  # which tier served them: slot, ram, disk
    generated_tokens: int = 0
    discarded_tokens: int = 0
    finish_reason: str | None = None  # of the first candidate: stop, length, tool_calls, cancelled, error
    cancelled: str | None = None  # why the run was stopped: disconnect, cancel_call, shutdown, ...
    error: str | None = None
    queue_ms: float | None = None  # arrival to admission
    ttft_ms: float | None = None  # arrival to the first generated token
    total_ms: float = 0.0  # arrival to the end


COLUMNS = tuple(f.name for f in fields(UsageRecord))
_ROW = operator.attrgetter(*COLUMNS)  # a record as its row's values, in COLUMNS order
_SCHEMA = """CREATE TABLE IF NOT EXISTS usage (
    at REAL NOT NULL, request_id TEXT NOT NULL, tenant TEXT NOT NULL, key TEXT, via TEXT,
    model TEXT NOT NULL, endpoint TEXT NOT NULL, prompt_tokens INTEGER NOT NULL,
    cached_tokens INTEGER NOT NULL, cache_tier TEXT, generated_tokens INTEGER NOT NULL,
    discarded_tokens INTEGER NOT NULL, finish_reason TEXT, cancelled TEXT, error TEXT,
    queue_ms REAL, ttft_ms REAL, total_ms REAL NOT NULL)"""
_INSERT = f"INSERT INTO usage ({', '.join(COLUMNS)}) VALUES ({', '.join('?' for _ in COLUMNS)})"
_SUMS = ("COUNT(*) AS requests, SUM(prompt_tokens) AS prompt_tokens, SUM(cached_tokens) AS cached_tokens, "
         "SUM(generated_tokens) AS generated_tokens, SUM(discarded_tokens) AS discarded_tokens, "
         "SUM(cancelled IS NOT NULL) AS cancelled")
_GROUP_BY = {"day": "date(at, 'unixepoch')", "key": "key", "model": "model", "tenant": "tenant"}


@dataclass(frozen=True, slots=True)
class UsageFilter:
    tenant: str | None = None  # None: every tenant
    key: str | None = None
    model: str | None = None
    since: float | None = None  # wall-clock seconds, inclusive
    until: float | None = None  # exclusive
    request_id: str | None = None  # one request's row (a gateway settling a cancelled turn)

    def where(self) -> tuple[str, list[Any]]:
        clauses, args = [], []
        for column in ("tenant", "key", "model", "request_id"):
            value = getattr(self, column)
            if value is not None:
                clauses.append(f"{column} = ?")
                args.append(value)
        if self.since is not None:
            clauses.append("at >= ?")
            args.append(self.since)
        if self.until is not None:
            clauses.append("at < ?")
            args.append(self.until)
        return (" WHERE " + " AND ".join(clauses) if clauses else ""), args


class Ledger:
    def __init__(self, path: Path, capacity: int = QUEUE, linger: float = LINGER) -> None:
        self.path = path
        self._db: sqlite3.Connection | None = None
        self._lock = threading.Lock()  # the connection: the writer's batches, the queries
        self._writer: Lingering[UsageRecord] = Lingering(self._write, name="hearth-ledger", linger=linger,
                                                         batch=BATCH, capacity=capacity)
        self.dropped = 0
        self.written = 0

    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            self._db = connect(self.path)
            self._db.execute(_SCHEMA)
            self._db.execute("CREATE INDEX IF NOT EXISTS usage_at ON usage (at)")
            self._db.execute("CREATE INDEX IF NOT EXISTS usage_tenant_at ON usage (tenant, at)")
        return self._db

    # ---- writing ------------------------------------------------------------------------

    def record(self, rec: UsageRecord) -> None:
        """Queue `rec` for the writer; never blocks on the disk (a full queue drops it, counted)."""
        if not self._writer.put(rec):
            self.dropped += 1

    @property
    def depth(self) -> int:
        return self._writer.depth

    @property
    def commits(self) -> int:
        """Transactions the writer made."""
        return self._writer.batches

    def _write(self, batch: list[UsageRecord]) -> None:
        rows = [_ROW(r) for r in batch]
        try:
            with self._lock:
                db = self._conn()
                db.execute("BEGIN")
                db.executemany(_INSERT, rows)
                db.execute("COMMIT")
            self.written += len(rows)
        except sqlite3.Error:
            self.dropped += len(rows)  # a broken disk must not stop the server

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every row recorded so far is committed (or dropped); False on timeout."""
        return self._writer.flush(timeout)

    def close(self) -> None:
        self._writer.close()
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None

    # ---- reading ------------------------------------------------------------------------

    def rows(self, f: UsageFilter, limit: int = 1000) -> list[dict[str, Any]]:
        """The records matching `f`, newest first."""
        where, args = f.where()
        with self._lock:
            cur = self._conn().execute(f"SELECT {', '.join(COLUMNS)} FROM usage{where} ORDER BY at DESC LIMIT ?",
                                       [*args, limit])
            return [dict(zip(COLUMNS, row, strict=True)) for row in cur.fetchall()]

    def totals(self, f: UsageFilter, group: list[str]) -> list[dict[str, Any]]:
        """Sums over the records matching `f`, one row per value of the `group` columns."""
        if any(g not in _GROUP_BY for g in group):
            raise ValueError(f"group must be among {', '.join(GROUPS)}")
        where, args = f.where()
        keys = [f"{_GROUP_BY[g]} AS {g}" for g in group]
        sql = f"SELECT {', '.join([*keys, _SUMS])} FROM usage{where}"
        if group:
            sql += f" GROUP BY {', '.join(group)} ORDER BY {', '.join(group)}"
        with self._lock:
            cur = self._conn().execute(sql, args)
            names = [d[0] for d in cur.description]
            return [{n: (v if v is not None else 0) if n not in group else v for n, v in zip(names, row, strict=True)}
                    for row in cur.fetchall()]

    def per_key(self, since: float) -> list[dict[str, Any]]:
        """For the key accounts after a restart: per (key, via, tenant), the totals, and the
        tokens of each record since `since` (the limits' window)."""
        with self._lock:
            db = self._conn()
            totals = db.execute(
                "SELECT key, via IS NOT NULL, tenant, COUNT(*), SUM(prompt_tokens), SUM(generated_tokens), "
                "SUM(cached_tokens) FROM usage WHERE key IS NOT NULL GROUP BY key, via IS NOT NULL, "
                "CASE WHEN via IS NULL THEN '' ELSE tenant END").fetchall()
            recent = db.execute("SELECT key, via IS NOT NULL, tenant, at, prompt_tokens + generated_tokens "
                                "FROM usage WHERE key IS NOT NULL AND at >= ? ORDER BY at", [since]).fetchall()
        out: dict[tuple[str, str | None], dict[str, Any]] = {}
        for key, via, tenant, n, prompt, completion, cached in totals:
            out[(key, tenant if via else None)] = {"key": key, "tenant": tenant if via else None, "requests": n,
                                                   "prompt_tokens": prompt or 0, "completion_tokens": completion or 0,
                                                   "cached_tokens": cached or 0, "recent": []}
        for key, via, tenant, at, tokens in recent:
            row = out.get((key, tenant if via else None))
            if row is not None:
                row["recent"].append((at, tokens))
        return list(out.values())


class LedgerCounts(Protocol):
    """What a ledger's writer shows on /metrics: the node's (`Ledger`) and the gateway's."""

    @property
    def written(self) -> int: ...
    @property
    def dropped(self) -> int: ...
    @property
    def depth(self) -> int: ...


class LedgerCollector(Collector):
    """The ledger's writer on /metrics: rows written, rows dropped, rows waiting."""

    def __init__(self, ledger: LedgerCounts) -> None:
        self.ledger = ledger

    def collect(self) -> Iterator[Metric]:
        yield CounterMetricFamily("hearth_usage_ledger_written", "Usage ledger rows committed",
                                  value=self.ledger.written)
        yield CounterMetricFamily("hearth_usage_ledger_dropped", "Usage ledger rows dropped (queue full, disk error)",
                                  value=self.ledger.dropped)
        yield GaugeMetricFamily("hearth_usage_ledger_queue_depth", "Usage ledger rows waiting for the writer",
                                value=self.ledger.depth)


def now() -> float:
    return time.time()
