"""One transaction's statements: what a backend (sqlite.py, postgres.py) lends the store's logic
(base.py, batches.py, chunks.py) and the schema's data steps (schema.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class Tx:
    """One transaction's statements (a backend's cursor behind it)."""

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Run a statement; the number of rows it changed."""
        raise NotImplementedError

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        raise NotImplementedError

    async def fetchone(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        rows = await self.fetchall(sql, params)
        return rows[0] if rows else None
