"""The gateway's database in one SQLite file (the default: one gateway; base.py has the SQL)."""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from hearth.gateway.store.base import GatewayStore
from hearth.gateway.store.tx import Tx


class _SqliteTx(Tx):
    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        return self.db.execute(sql, tuple(params)).rowcount

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return list(self.db.execute(sql, tuple(params)).fetchall())


class SqliteStore(GatewayStore):
    """SQLite, one file per gateway. Its statements are small and run on the event loop (WAL;
    a `_SqliteTx` never suspends, so a transaction holds the lock without yielding)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._lock = threading.Lock()
        self.instance = uuid.uuid4().hex

    async def open(self) -> None:
        await self.migrate()
        async with self._tx() as tx:  # the file is this process's: every gateway before it is gone
            await tx.execute("DELETE FROM gateways")
        await super().open()

    async def close(self) -> None:
        self._db.close()

    @contextlib.asynccontextmanager
    async def _tx(self, migrate: bool = False) -> AsyncIterator[Tx]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield _SqliteTx(self._db)
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
