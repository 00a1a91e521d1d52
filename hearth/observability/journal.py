"""The request journal (`--journal`; docs/observability.md, "Replay"): each generation's request
body and answer, kept so that `hearth replay ID` can send the request again and compare.

Off by default: then nothing here exists and nothing is stored. On, each record is one row of
`journal.db` (id, tenant, endpoint, path, model, time, and two content hashes) and its contents
are blobs under `journal/` named by the SHA-256 of their bytes (content-addressed: the same
system prompt or answer sent a thousand times is stored once), gzip-compressed. Writes run on
one background thread behind a bounded queue (a full queue drops the record, counted), as the
usage ledger's do. Retention: records older than `max_age` seconds and, beyond `max_bytes` of
blobs, the oldest records are deleted, with every blob no record still names.

Invariants: contents are never logged; a record is read back only by its tenant or the admin
(the routes check `owner` first, hearth.tenants); a blob is deleted only when no row names it.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import queue
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hearth.db import connect

QUEUE = 1000
_SCHEMA = """CREATE TABLE IF NOT EXISTS journal (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, at REAL NOT NULL, endpoint TEXT NOT NULL, path TEXT NOT NULL,
    model TEXT NOT NULL, request TEXT NOT NULL, answer TEXT NOT NULL, bytes INTEGER NOT NULL)"""


@dataclass(frozen=True, slots=True)
class Entry:
    id: str
    owner: str
    endpoint: str  # the metrics label: chat, completions, messages, responses, ...
    path: str  # the HTTP path it was sent to: /v1/chat/completions, ...
    model: str
    request: bytes  # the body as received
    answer: dict[str, Any]  # protocol-neutral: text, finish_reason, tool_calls, usage


class Journal:
    def __init__(self, root: Path, max_age: float = 30 * 86400.0, max_bytes: int = 1 << 30,
                 capacity: int = QUEUE) -> None:
        self.root, self.blobs = root, root / "journal"
        self.max_age, self.max_bytes = max_age, max_bytes
        self._queue: queue.Queue[Entry | None] = queue.Queue(capacity)
        self._db: sqlite3.Connection | None = None
        self._lock = threading.Lock()
        self._idle = threading.Condition()
        self._pending = 0
        self._writer: threading.Thread | None = None
        self.dropped = 0

    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            self._db = connect(self.root / "journal.db")
            self._db.execute(_SCHEMA)
            self._db.execute("CREATE INDEX IF NOT EXISTS journal_at ON journal (at)")
        return self._db

    def record(self, entry: Entry) -> None:
        with self._idle:
            if self._writer is None:
                self._writer = threading.Thread(target=self._write_loop, name="hearth-journal", daemon=True)
                self._writer.start()
            self._pending += 1
        try:
            self._queue.put_nowait(entry)
        except queue.Full:
            self.dropped += 1
            self._settled(1)

    def _settled(self, n: int) -> None:
        with self._idle:
            self._pending -= n
            self._idle.notify_all()

    def flush(self, timeout: float = 10.0) -> bool:
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout)

    def close(self) -> None:
        if self._writer is not None:
            self._queue.put(None)
            self._writer.join(timeout=10.0)
            self._writer = None
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None

    def _put_blob(self, data: bytes) -> tuple[str, int]:
        digest = hashlib.sha256(data).hexdigest()
        path = self.blobs / digest[:2] / (digest + ".gz")
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(gzip.compress(data, 6))
            tmp.replace(path)  # whole or absent
        return digest, path.stat().st_size

    def _get_blob(self, digest: str) -> bytes:
        return gzip.decompress((self.blobs / digest[:2] / (digest + ".gz")).read_bytes())

    def _write_loop(self) -> None:
        while True:
            entry = self._queue.get()
            if entry is None:
                return
            try:
                req, n1 = self._put_blob(entry.request)
                ans, n2 = self._put_blob(json.dumps(entry.answer, sort_keys=True).encode())
                with self._lock:
                    db = self._conn()
                    db.execute("INSERT OR REPLACE INTO journal VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                               (entry.id, entry.owner, time.time(), entry.endpoint, entry.path, entry.model, req,
                                ans, n1 + n2))
                self._retain()
            except (OSError, sqlite3.Error):
                self.dropped += 1  # a full disk must not stop the server
            finally:
                self._settled(1)

    def _retain(self) -> None:
        """Drop records past their age and, beyond the size budget, the oldest; then the blobs
        no record names any more."""
        with self._lock:
            db = self._conn()
            gone = db.execute("SELECT request, answer FROM journal WHERE at < ?",
                              (time.time() - self.max_age,)).fetchall()
            db.execute("DELETE FROM journal WHERE at < ?", (time.time() - self.max_age,))
            total = db.execute("SELECT COALESCE(SUM(bytes), 0) FROM journal").fetchone()[0]
            while total > self.max_bytes:
                row = db.execute("SELECT id, request, answer, bytes FROM journal ORDER BY at LIMIT 1").fetchone()
                if row is None:
                    break
                db.execute("DELETE FROM journal WHERE id = ?", (row[0],))
                gone.append((row[1], row[2]))
                total -= row[3]
            for digest in {d for pair in gone for d in pair}:
                named = db.execute("SELECT 1 FROM journal WHERE request = ? OR answer = ? LIMIT 1",
                                   (digest, digest)).fetchone()
                if named is None:
                    (self.blobs / digest[:2] / (digest + ".gz")).unlink(missing_ok=True)

    def get(self, rid: str) -> dict[str, Any] | None:
        """A record with its contents, or None. The caller checks `owner` before showing it."""
        with self._lock:
            row = self._conn().execute(
                "SELECT id, owner, at, endpoint, path, model, request, answer FROM journal WHERE id = ?",
                (rid,)).fetchone()
        if row is None:
            return None
        rid, owner, at, endpoint, path, model, req, ans = row
        try:
            body = json.loads(self._get_blob(req))
            answer = json.loads(self._get_blob(ans))
        except (OSError, ValueError):
            return None  # pruned under it, or torn: as if absent
        return {"id": rid, "owner": owner, "at": at, "endpoint": endpoint, "path": path, "model": model,
                "request": body, "answer": answer}
