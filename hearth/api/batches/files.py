"""Files of the Batch API under `<data_dir>/batches/files/`: `<id>.jsonl` (the content) and
`<id>.json` (the file object and its owner). Ids are `file-` and 32 hex digits, checked against
FILE_ID before any path is built from one. Both parts are written atomically (durable.py),
content first: a file whose object exists is whole. Each file records its owner (a tenant,
hearth.tenants); a caller who may not see it gets the same 404 as for a missing one."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

from hearth.api.batches.durable import read_json, write_atomic, write_json
from hearth.errors import NotFound
from hearth.http.batches.requests import new_file_id
from hearth.tenants import Caller

FILE_ID = re.compile(r"^file-[0-9a-f]{32}$")
PURPOSES = ("batch", "batch_output")  # what a client uploads; what a batch writes
MAX_FILENAME = 255


def file_not_found(file_id: str) -> NotFound:
    return NotFound(f"No such File object: {file_id}", param="file_id", code="not_found")


class FileStore:
    def __init__(self, root: Path) -> None:
        self.root = root

    def _paths(self, file_id: str) -> tuple[Path, Path]:
        if not FILE_ID.fullmatch(file_id):
            raise file_not_found(file_id)
        return self.root / f"{file_id}.jsonl", self.root / f"{file_id}.json"

    def create(self, content: bytes, filename: str, purpose: str, owner: str,
               file_id: str | None = None) -> dict[str, Any]:
        """Store `content` as a new file (or as `file_id`, replacing it); its public object."""
        self.root.mkdir(parents=True, exist_ok=True)
        fid = file_id or new_file_id()
        data, meta = self._paths(fid)
        write_atomic(data, content)
        obj = {"id": fid, "object": "file", "bytes": len(content), "created_at": int(time.time()),
               "expires_at": None, "filename": filename[:MAX_FILENAME], "purpose": purpose,
               "status": "processed", "status_details": None}
        write_json(meta, {"file": obj, "owner": owner, "created_ns": time.time_ns()})
        return obj

    def _record(self, file_id: str) -> dict[str, Any] | None:
        data, meta = self._paths(file_id)
        try:
            rec = read_json(meta)
        except (OSError, ValueError):
            return None
        return rec if isinstance(rec, dict) and data.exists() else None

    def get(self, file_id: str, who: Caller) -> dict[str, Any]:
        """The file object, if `who` may see it (else 404, as for a missing one)."""
        rec = self._record(file_id)
        if rec is None or not who.sees(str(rec.get("owner"))):
            raise file_not_found(file_id)
        obj: dict[str, Any] = rec["file"]
        return obj

    def content_path(self, file_id: str, who: Caller) -> Path:
        self.get(file_id, who)
        return self._paths(file_id)[0]

    def read(self, file_id: str, who: Caller) -> bytes:
        return self.content_path(file_id, who).read_bytes()

    def delete(self, file_id: str, who: Caller) -> None:
        self.get(file_id, who)
        data, meta = self._paths(file_id)
        meta.unlink(missing_ok=True)  # the object first: a file without it is never listed
        data.unlink(missing_ok=True)

    def list(self, who: Caller) -> list[dict[str, Any]]:
        """The files `who` sees, newest first."""
        if not self.root.is_dir():
            return []
        out: list[tuple[int, dict[str, Any]]] = []
        for name in os.listdir(self.root):
            if not name.endswith(".json") or not FILE_ID.fullmatch(name[:-5]):
                continue
            rec = self._record(name[:-5])
            if rec is not None and who.sees(str(rec.get("owner"))):
                out.append((int(rec.get("created_ns") or 0), rec["file"]))
        out.sort(key=lambda r: r[0], reverse=True)
        return [f for _, f in out]
