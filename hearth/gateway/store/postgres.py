"""The gateway's store on PostgreSQL: the state several gateways share (store/base.py holds the
interface, the SQL and the schema's story). psycopg 3, async, over one `AsyncConnectionPool`;
imported only when a gateway names a PostgreSQL database.

A database that goes away fails fast: a connection waits at most POOL_TIMEOUT seconds for the
pool, and any connection error is `Unavailable` (503 + Retry-After in each protocol's envelope).
The pool checks a connection before lending it (`_alive`) and reconnects by itself, so the
gateways recover when the database returns. Each gateway renews its lease in `gateways` every
GATEWAY_TTL / 3 seconds (`keep_alive`).
"""

from __future__ import annotations

import contextlib
import re
import select
from collections.abc import AsyncIterator, Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg_pool import AsyncConnectionPool

from hearth.errors import Unavailable
from hearth.gateway.store.base import GatewayStore
from hearth.gateway.store.tx import Tx

POOL_TIMEOUT = 2.0  # seconds a request waits for a connection before its 503
CONNECT_TIMEOUT = 2  # seconds (libpq's connect_timeout)
POOL_SIZE = 10
RETRY_AFTER = 5
MIGRATION_LOCK = 0x4865617274  # pg_advisory_xact_lock key: b"Heart"
_PLACEHOLDER = re.compile(r"\?")


def redacted(url: str) -> str:
    """The URL with its password replaced (for logs and status: never the password)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)
    user = netloc[0].split(":", 1)[0]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc[1]}"))


def is_postgres(url: str | None) -> bool:
    return url is not None and url.startswith(("postgresql://", "postgres://"))


async def _alive(conn: psycopg.AsyncConnection[Any]) -> None:
    """The pool's check of a connection it lends, without a round trip: an idle connection has
    nothing to read unless the server closed it (it stopped, or ended the session). A round trip
    per check (psycopg_pool's `check_connection`) doubled the database's share of a turn."""
    if not conn.closed and not select.select([conn.fileno()], [], [], 0)[0]:
        return
    await conn.close()  # closed: the pool replaces it (an open one would be lent again)
    raise psycopg.OperationalError("the database closed the connection")


class _PgTx(Tx):
    def __init__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self.conn = conn

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        cur = await self.conn.execute(_PLACEHOLDER.sub("%s", sql), tuple(params))
        return cur.rowcount

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        cur = await self.conn.execute(_PLACEHOLDER.sub("%s", sql), tuple(params))
        return list(await cur.fetchall())


class PostgresStore(GatewayStore):
    day_sql = "to_char(to_timestamp(at) AT TIME ZONE 'UTC', 'YYYY-MM-DD')"

    def __init__(self, url: str, instance: str, pool_size: int = POOL_SIZE) -> None:
        self.url = url
        self.instance = instance
        self._pool: AsyncConnectionPool[psycopg.AsyncConnection[Any]] = AsyncConnectionPool(
            url, min_size=1, max_size=pool_size, open=False, timeout=POOL_TIMEOUT,
            kwargs={"autocommit": True, "connect_timeout": CONNECT_TIMEOUT},
            check=_alive, reconnect_timeout=0, name="hearth-gateway")

    async def open(self) -> None:
        try:
            await self._pool.open(wait=True, timeout=10)
        except psycopg.Error as e:
            raise RuntimeError(f"cannot reach the gateway's database {redacted(self.url)}: {e}") from e
        await super().open()

    async def close(self) -> None:
        with contextlib.suppress(psycopg.Error):
            async with self._tx() as tx:  # a clean stop: its background runs were ended, its lease goes
                await tx.execute("DELETE FROM gateways WHERE id = ?", (self.instance,))
        await self._pool.close()

    @contextlib.asynccontextmanager
    async def _tx(self, migrate: bool = False) -> AsyncIterator[Tx]:
        try:
            async with self._pool.connection() as conn, conn.transaction():
                if migrate:
                    await conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
                yield _PgTx(conn)
        except (psycopg.OperationalError, psycopg.InterfaceError) as e:  # PoolTimeout is one
            raise Unavailable(f"the gateway's database is unavailable ({type(e).__name__}); retry shortly",
                              code="database_unavailable", retry_after=RETRY_AFTER) from e
