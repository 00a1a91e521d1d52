"""What the gateway remembers across restarts, in SQLite under its data dir:

- `affinity`: binding keys (a session, a response chain) → the node that holds them;
- `transcripts`: every session's conversation as its node last reported it (OpenAI-shaped
  messages, the node's `/history`), so a session whose node died continues elsewhere,
  re-prefilled from it;
- `responses`: each stored Responses turn on a Hearth node (its input items and output items,
  and the response it continued), so a `previous_response_id` chain whose node died is replayed
  as input items on another node;
- `background`: the response object of each background response the gateway runs
  (`background.py`): `in_progress` while it runs, final once it ended, so a GET answers after
  its events expired or the gateway restarted. Rows still running when the store opens belong
  to a gateway that was killed: they are failed then (`server_restarted`, as a node's);
- `members`: the nodes that joined the fleet at run time (`hearth serve --join`), each with its
  address, what the gateway needs to route to it (`spec`) and when its registration lapses
  (`expires`, unix time). Every gateway on the same database reads it (`membership.py`).

Writes are single small statements (WAL): cheap enough for the event loop.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from hearth.api.openai.responses_store import ORPHAN_ERROR

SCHEMA = """
CREATE TABLE IF NOT EXISTS affinity (key TEXT PRIMARY KEY, node TEXT NOT NULL, updated REAL NOT NULL);
CREATE TABLE IF NOT EXISTS transcripts (session_id TEXT PRIMARY KEY, model TEXT NOT NULL,
                                        messages TEXT NOT NULL, updated REAL NOT NULL);
CREATE TABLE IF NOT EXISTS responses (id TEXT PRIMARY KEY, previous TEXT, items TEXT NOT NULL,
                                      updated REAL NOT NULL);
CREATE TABLE IF NOT EXISTS background (id TEXT PRIMARY KEY, status TEXT NOT NULL, response TEXT NOT NULL,
                                       updated REAL NOT NULL);
CREATE TABLE IF NOT EXISTS members (name TEXT PRIMARY KEY, url TEXT NOT NULL, spec TEXT NOT NULL,
                                    expires REAL NOT NULL);
"""
RUNNING = ("queued", "in_progress")
MAX_CHAIN = 1000


class TranscriptStore:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.executescript(SCHEMA)
        self._lock = threading.Lock()
        self.orphans = self._fail_orphans()

    def close(self) -> None:
        self._db.close()

    # ---- binding keys --------------------------------------------------------------------------

    def node_of(self, key: str) -> str | None:
        with self._lock:
            row = self._db.execute("SELECT node FROM affinity WHERE key = ?", (key,)).fetchone()
        return row[0] if row else None

    def assign(self, key: str, node: str) -> None:
        with self._lock:
            self._db.execute("INSERT INTO affinity VALUES (?, ?, ?) ON CONFLICT(key) DO UPDATE SET "
                             "node = excluded.node, updated = excluded.updated", (key, node, time.time()))

    def forget(self, key: str) -> None:
        with self._lock:
            self._db.execute("DELETE FROM affinity WHERE key = ?", (key,))

    def keys_on(self, node: str, prefix: str = "session:") -> list[str]:
        with self._lock:
            rows = self._db.execute("SELECT key FROM affinity WHERE node = ? AND key LIKE ? ORDER BY updated",
                                    (node, prefix + "%")).fetchall()
        return [r[0] for r in rows]

    def counts(self, prefix: str = "session:") -> dict[str, int]:
        with self._lock:
            rows = self._db.execute("SELECT node, COUNT(*) FROM affinity WHERE key LIKE ? GROUP BY node",
                                    (prefix + "%",)).fetchall()
        return {r[0]: int(r[1]) for r in rows}

    # ---- transcripts ---------------------------------------------------------------------------

    def transcript(self, session_id: str) -> tuple[str, list[dict[str, Any]]] | None:
        """(model alias, messages) or None."""
        with self._lock:
            row = self._db.execute("SELECT model, messages FROM transcripts WHERE session_id = ?",
                                   (session_id,)).fetchone()
        if row is None:
            return None
        messages = json.loads(row[1])
        return row[0], messages if isinstance(messages, list) else []

    def save_transcript(self, session_id: str, model: str, messages: list[dict[str, Any]]) -> None:
        with self._lock:
            self._db.execute("INSERT INTO transcripts VALUES (?, ?, ?, ?) ON CONFLICT(session_id) DO UPDATE SET "
                             "model = excluded.model, messages = excluded.messages, updated = excluded.updated",
                             (session_id, model, json.dumps(messages, ensure_ascii=False), time.time()))

    def drop_transcript(self, session_id: str) -> None:
        with self._lock:
            self._db.execute("DELETE FROM transcripts WHERE session_id = ?", (session_id,))

    # ---- response chains -----------------------------------------------------------------------

    def save_response(self, response_id: str, previous: str | None, items: list[Any]) -> None:
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?)",
                             (response_id, previous, json.dumps(items, ensure_ascii=False), time.time()))

    def chain(self, response_id: str) -> list[Any] | None:
        """Every item of the chain ending at `response_id`, oldest first; None if a link is missing."""
        parts: list[list[Any]] = []
        rid: str | None = response_id
        with self._lock:
            while rid is not None and len(parts) < MAX_CHAIN:
                row = self._db.execute("SELECT previous, items FROM responses WHERE id = ?", (rid,)).fetchone()
                if row is None:
                    return None
                parts.append(json.loads(row[1]))
                rid = row[0]
        return [item for part in reversed(parts) for item in part]

    # ---- background responses ------------------------------------------------------------------

    def save_background(self, response: dict[str, Any]) -> None:
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO background VALUES (?, ?, ?, ?)",
                             (response["id"], str(response.get("status")), json.dumps(response, ensure_ascii=False),
                              time.time()))

    def background(self, response_id: str) -> dict[str, Any] | None:
        with self._lock:
            row = self._db.execute("SELECT response FROM background WHERE id = ?", (response_id,)).fetchone()
        response = json.loads(row[0]) if row else None
        return response if isinstance(response, dict) else None

    def drop_background(self, response_id: str) -> bool:
        with self._lock:
            return self._db.execute("DELETE FROM background WHERE id = ?", (response_id,)).rowcount > 0

    # ---- fleet membership ----------------------------------------------------------------------

    async def renew_member(self, name: str, url: str, spec: dict[str, Any], ttl: float) -> None:
        """Register a node, or renew its registration, for `ttl` seconds from now."""
        with self._lock:
            self._db.execute("INSERT INTO members VALUES (?, ?, ?, ?) ON CONFLICT(name) DO UPDATE SET "
                             "url = excluded.url, spec = excluded.spec, expires = excluded.expires",
                             (name, url, json.dumps(spec, ensure_ascii=False), time.time() + ttl))

    async def members(self) -> list[dict[str, Any]]:
        """Every registered node, lapsed ones too: {"name", "url", "spec", "expires"}."""
        with self._lock:
            rows = self._db.execute("SELECT name, url, spec, expires FROM members ORDER BY name").fetchall()
        out = []
        for name, url, spec, expires in rows:
            parsed = json.loads(spec)
            out.append({"name": name, "url": url, "spec": parsed if isinstance(parsed, dict) else {},
                        "expires": float(expires)})
        return out

    async def remove_member(self, name: str) -> bool:
        with self._lock:
            return self._db.execute("DELETE FROM members WHERE name = ?", (name,)).rowcount > 0

    def _fail_orphans(self) -> int:
        """Runs left `queued` / `in_progress` by a gateway that stopped without ending them
        (killed): failed, as a node fails its own (`responses_store.ORPHAN_ERROR`)."""
        with self._lock:
            rows = self._db.execute(f"SELECT response FROM background WHERE status IN {RUNNING}").fetchall()
            for (raw,) in rows:
                response = json.loads(raw)
                response.update(status="failed", error=dict(ORPHAN_ERROR))
                self._db.execute("UPDATE background SET status = 'failed', response = ?, updated = ? WHERE id = ?",
                                 (json.dumps(response, ensure_ascii=False), time.time(), response["id"]))
        return len(rows)
