"""Stored Responses: each response object with the input items it answered, in SQLite.

The database is `<data_dir>/hearth.db` in WAL mode. Rows hold JSON text only (never pickle).
Ids are checked against RESPONSE_ID before any query, and every query is parameterized.
A chain (`previous_response_id`) is replayed by walking the links back to the first response.
"""

from __future__ import annotations

import json
import re
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hearth.db import connect

RESPONSE_ID = re.compile(r"^resp_[0-9a-f]{32}$")
MAX_CHAIN = 10_000  # links followed back through previous_response_id

_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY,
    created_at REAL NOT NULL,
    previous_response_id TEXT,
    input TEXT NOT NULL,
    response TEXT NOT NULL
)
"""


def valid_id(response_id: str) -> bool:
    return RESPONSE_ID.fullmatch(response_id) is not None


@dataclass(slots=True)
class StoredResponse:
    response: dict[str, Any]
    input: list[dict[str, Any]]  # this request's own input items (not the replayed chain)
    previous_response_id: str | None


class ResponseStore:
    """One connection shared under a lock: every statement is a small single-row read or
    write, so calls are made inline from the event loop. The database is opened by the first
    call that needs it: a node that never stores a response creates none."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None

    @property
    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            self._conn = connect(self.path)
            self._conn.execute(_SCHEMA)
        return self._conn

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()

    def put(self, response: dict[str, Any], input_items: list[dict[str, Any]]) -> None:
        """Insert or replace the row for `response["id"]`."""
        rid = response["id"]
        if not valid_id(rid):
            raise ValueError(f"invalid response id {rid!r}")
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO responses (id, created_at, previous_response_id, input, response) "
                "VALUES (?, ?, ?, ?, ?)",
                (rid, float(response.get("created_at") or time.time()), response.get("previous_response_id"),
                 json.dumps(input_items, ensure_ascii=False), json.dumps(response, ensure_ascii=False)))

    def update(self, response: dict[str, Any]) -> bool:
        """Replace the response object of an existing row; False if the row is gone (a response
        deleted while it ran stays deleted)."""
        with self._lock:
            cur = self._db.execute("UPDATE responses SET response = ? WHERE id = ?",
                                   (json.dumps(response, ensure_ascii=False), response["id"]))
        return cur.rowcount > 0

    def get(self, response_id: str) -> StoredResponse | None:
        if not valid_id(response_id):
            return None
        with self._lock:
            row = self._db.execute("SELECT response, input, previous_response_id FROM responses WHERE id = ?",
                                   (response_id,)).fetchone()
        if row is None:
            return None
        return StoredResponse(json.loads(row[0]), json.loads(row[1]), row[2])

    def delete(self, response_id: str) -> bool:
        if not valid_id(response_id):
            return False
        with self._lock:
            cur = self._db.execute("DELETE FROM responses WHERE id = ?", (response_id,))
        return cur.rowcount > 0

    def chain(self, response_id: str) -> list[dict[str, Any]] | None:
        """Every item of the conversation up to and including `response_id`, oldest first: each
        response's input items followed by its output items. None if `response_id` is unknown;
        a link deleted further back ends the chain there."""
        links: list[StoredResponse] = []
        rid: str | None = response_id
        seen: set[str] = set()
        while rid is not None and rid not in seen and len(links) < MAX_CHAIN:
            seen.add(rid)
            stored = self.get(rid)
            if stored is None:
                if not links:
                    return None
                break
            links.append(stored)
            rid = stored.previous_response_id
        items: list[dict[str, Any]] = []
        for stored in reversed(links):
            items.extend(stored.input)
            items.extend(stored.response.get("output") or [])
        return items
