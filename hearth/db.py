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
