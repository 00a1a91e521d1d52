"""Stored Responses: each response object with the input items it answered, in SQLite.

The database is `<data_dir>/hearth.db` in WAL mode. Rows hold JSON text only (never pickle).
Ids are checked against RESPONSE_ID (ITEM_ID for items) before any query, and every query is
parameterized. A chain (`previous_response_id`) is replayed by walking the links back to the
first response.

An `item_reference` input item names an output item (`msg_…`, `fc_…`, `rs_…`) of a stored
response: `response_items` maps each output item's id to the response that holds it, written
with the response's final state. The item itself is read from that response's row, so an item
lives exactly as long as its response: deleting the response (or never storing it, `store:
false`) makes its items unknown. Responses stored before the index existed have no entries.

Each row records its owner (hearth.tenants). Every read takes `scope`, the owner the caller is
limited to (None: the admin, who sees all): a row of another owner is not found, exactly as a
missing one, and a chain stops at a link it may not see. `ScopedResponses` binds one caller's
scope, so a route cannot forget it. Rows from before owners are the admin's ('').
"""

from __future__ import annotations

import contextlib
import json
import re
import sqlite3
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hearth.db import add_owner_column, connect
from hearth.protocols.responses_log import ORPHAN_ERROR
from hearth.tenants import ADMIN, Caller

RESPONSE_ID = re.compile(r"^resp_[0-9a-f]{32}$")
ITEM_ID = re.compile(r"^[A-Za-z0-9_-]{1,128}$")
MAX_CHAIN = 10_000  # links followed back through previous_response_id

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY,
    created_at REAL NOT NULL,
    previous_response_id TEXT,
    input TEXT NOT NULL,
    response TEXT NOT NULL
)""",
    """CREATE TABLE IF NOT EXISTS response_items (
    item_id TEXT PRIMARY KEY,
    response_id TEXT NOT NULL
)""",
    "CREATE INDEX IF NOT EXISTS response_items_by_response ON response_items (response_id)",
)


# A response still `queued` or `in_progress` when the store opens (a background one, or a plain
# stored one whose process was killed mid-answer) belongs to a run of an earlier process (one node
# owns its data dir, and this runs before this process stores any): that run is gone, so the
# response is failed, not left running forever.
_ORPHANS = """UPDATE responses SET response = json_set(response, '$.status', 'failed', '$.error', json(?))
WHERE json_extract(response, '$.status') IN ('queued', 'in_progress')"""


def valid_id(response_id: str) -> bool:
    return RESPONSE_ID.fullmatch(response_id) is not None


def _index(db: sqlite3.Connection, response: dict[str, Any]) -> None:
    """Map the response's output items to it."""
    ids = [(item["id"], response["id"]) for item in response.get("output") or []
           if isinstance(item, dict) and isinstance(item.get("id"), str) and ITEM_ID.fullmatch(item["id"])]
    db.executemany("INSERT OR REPLACE INTO response_items (item_id, response_id) VALUES (?, ?)", ids)


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
            for statement in _SCHEMA:
                self._conn.execute(statement)
            add_owner_column(self._conn, "responses")
            self._conn.execute(_ORPHANS, (json.dumps(ORPHAN_ERROR),))
        return self._conn

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One transaction, under the lock: a row and its items change together."""
        with self._lock:
            db = self._db
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()

    def put(self, response: dict[str, Any], input_items: list[dict[str, Any]], owner: str = ADMIN) -> None:
        """Insert or replace the row for `response["id"]`, owned by `owner`."""
        rid = response["id"]
        if not valid_id(rid):
            raise ValueError(f"invalid response id {rid!r}")
        with self._write() as db:
            db.execute(
                "INSERT OR REPLACE INTO responses (id, created_at, previous_response_id, input, response, owner) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (rid, float(response.get("created_at") or time.time()), response.get("previous_response_id"),
                 json.dumps(input_items, ensure_ascii=False), json.dumps(response, ensure_ascii=False), owner))
            _index(db, response)

    def update(self, response: dict[str, Any]) -> bool:
        """Replace the response object of an existing row; False if the row is gone (a response
        deleted while it ran stays deleted)."""
        with self._write() as db:
            cur = db.execute("UPDATE responses SET response = ? WHERE id = ?",
                             (json.dumps(response, ensure_ascii=False), response["id"]))
            if cur.rowcount > 0:
                _index(db, response)
        return cur.rowcount > 0

    def item(self, item_id: str, scope: str | None = None) -> dict[str, Any] | None:
        """The output item `item_id` of a stored response within `scope`, or None."""
        if not ITEM_ID.fullmatch(item_id):
            return None
        with self._lock:
            row = self._db.execute("SELECT r.response, r.owner FROM response_items i JOIN responses r "
                                   "ON r.id = i.response_id WHERE i.item_id = ?", (item_id,)).fetchone()
        if row is None or (scope is not None and row[1] != scope):
            return None
        output = json.loads(row[0]).get("output") or []
        return next((it for it in output if isinstance(it, dict) and it.get("id") == item_id), None)

    def get(self, response_id: str, scope: str | None = None) -> StoredResponse | None:
        if not valid_id(response_id):
            return None
        with self._lock:
            row = self._db.execute("SELECT response, input, previous_response_id, owner FROM responses WHERE id = ?",
                                   (response_id,)).fetchone()
        if row is None or (scope is not None and row[3] != scope):
            return None
        return StoredResponse(json.loads(row[0]), json.loads(row[1]), row[2])

    def delete(self, response_id: str, scope: str | None = None) -> bool:
        if not valid_id(response_id):
            return False
        with self._write() as db:
            if scope is None:
                cur = db.execute("DELETE FROM responses WHERE id = ?", (response_id,))
            else:
                cur = db.execute("DELETE FROM responses WHERE id = ? AND owner = ?", (response_id, scope))
            if cur.rowcount > 0:
                db.execute("DELETE FROM response_items WHERE response_id = ?", (response_id,))
        return cur.rowcount > 0

    def chain(self, response_id: str, scope: str | None = None) -> list[dict[str, Any]] | None:
        """Every item of the conversation up to and including `response_id`, oldest first: each
        response's input items followed by its output items. None if `response_id` is unknown;
        a link deleted further back ends the chain there."""
        links: list[StoredResponse] = []
        rid: str | None = response_id
        seen: set[str] = set()
        while rid is not None and rid not in seen and len(links) < MAX_CHAIN:
            seen.add(rid)
            stored = self.get(rid, scope)
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


@dataclass(frozen=True, slots=True)
class ScopedResponses:
    """The store as one caller sees it: reads limited to its scope, writes owned by its tenant."""

    store: ResponseStore
    caller: Caller

    def put(self, response: dict[str, Any], input_items: list[dict[str, Any]]) -> None:
        self.store.put(response, input_items, self.caller.tenant)

    def update(self, response: dict[str, Any]) -> bool:
        return self.store.update(response)  # by id: the row was put by this caller

    def get(self, response_id: str) -> StoredResponse | None:
        return self.store.get(response_id, self.caller.scope)

    def item(self, item_id: str) -> dict[str, Any] | None:
        return self.store.item(item_id, self.caller.scope)

    def chain(self, response_id: str) -> list[dict[str, Any]] | None:
        return self.store.chain(response_id, self.caller.scope)

    def delete(self, response_id: str) -> bool:
        return self.store.delete(response_id, self.caller.scope)
