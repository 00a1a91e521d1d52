"""Session records and transcripts in SQLite (`<data_dir>/sessions.db`, WAL).

Each completed turn is one transaction (its messages and the session's new last-used
time), committed before the turn's stream is closed, so a kill -9 after a turn ends never
loses it. WAL with synchronous=NORMAL survives a process crash (not a power cut), which is
what "a crash of the server" means here. Rows hold JSON text only.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from pathlib import Path

from hearth.chat.types import Message
from hearth.db import add_owner_column, connect
from hearth.sessions.transcript import message_from_json, message_to_json
from hearth.tenants import ADMIN
from hearth.text import scrub_value

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    model TEXT NOT NULL,
    created_at REAL NOT NULL,
    last_used_at REAL NOT NULL,
    max_seq_len INTEGER NOT NULL,
    owner TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS messages (
    session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    idx INTEGER NOT NULL,
    message TEXT NOT NULL,
    PRIMARY KEY (session_id, idx)
);
"""


@dataclass(slots=True)
class SessionRow:
    id: str
    model: str
    created_at: float
    last_used_at: float
    max_seq_len: int
    messages: list[Message] = field(default_factory=list)
    owner: str = ADMIN  # the tenant that created it (hearth.tenants)


class SessionStore:
    """One connection under a lock; statements are small, so they run inline."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._db = connect(path)
        self._db.executescript(_SCHEMA)
        add_owner_column(self._db, "sessions")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def load_all(self) -> list[SessionRow]:
        with self._lock:
            rows = self._db.execute(
                "SELECT id, model, created_at, last_used_at, max_seq_len, owner FROM sessions").fetchall()
            out = {r[0]: SessionRow(r[0], r[1], r[2], r[3], r[4], owner=r[5]) for r in rows}
            query = "SELECT session_id, message FROM messages ORDER BY session_id, idx"
            for sid, text in self._db.execute(query):
                if sid in out:  # scrubbed: an older server could store lone surrogates (hearth.text)
                    out[sid].messages.append(message_from_json(scrub_value(json.loads(text))))
        return list(out.values())

    def save(self, row: SessionRow, *, replace_messages: bool = False, append: list[Message] | None = None) -> None:
        """Upsert the session row; then either rewrite its whole transcript or append
        `append` (the new tail of `row.messages`). One transaction."""
        with self._lock:
            db = self._db
            db.execute("BEGIN IMMEDIATE")
            try:
                # The owner is set once, when the row is made: no later write changes it.
                db.execute("INSERT INTO sessions (id, model, created_at, last_used_at, max_seq_len, owner) VALUES "
                           "(?, ?, ?, ?, ?, ?) ON CONFLICT(id) DO UPDATE SET last_used_at=excluded.last_used_at, "
                           "max_seq_len=excluded.max_seq_len",
                           (row.id, row.model, row.created_at, row.last_used_at, row.max_seq_len, row.owner))
                if replace_messages:
                    db.execute("DELETE FROM messages WHERE session_id = ?", (row.id,))
                    tail, start = row.messages, 0
                else:
                    tail = append or []
                    start = len(row.messages) - len(tail)
                db.executemany("INSERT INTO messages (session_id, idx, message) VALUES (?, ?, ?)",
                               [(row.id, start + i, json.dumps(message_to_json(m))) for i, m in enumerate(tail)])
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise

    def delete(self, sid: str) -> None:
        with self._lock:
            self._db.execute("DELETE FROM sessions WHERE id = ?", (sid,))
