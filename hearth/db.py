"""SQLite under the data directory: one way to open it for every store."""

from __future__ import annotations

import sqlite3
from pathlib import Path


def connect(path: Path) -> sqlite3.Connection:
    """A connection for one store, shared across threads under the store's own lock.

    WAL lets readers run beside the writer; synchronous=NORMAL in WAL mode survives a crash of
    the process (not of the machine) without an fsync per commit; autocommit mode, so a
    store's multi-statement writes use explicit BEGIN/COMMIT."""
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.execute("PRAGMA busy_timeout=5000")
    db.execute("PRAGMA foreign_keys=ON")
    return db


def add_owner_column(db: sqlite3.Connection, table: str) -> None:
    """The migration to owners (hearth.tenants): a table from before them gains `owner`, and
    every row it already holds becomes the admin's (''). Idempotent; run when a store opens.
    `table` is one of the stores' own names, never input."""
    columns = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
    if "owner" not in columns:
        db.execute(f"ALTER TABLE {table} ADD COLUMN owner TEXT NOT NULL DEFAULT ''")
