"""Batches on disk, under `<data_dir>/batches/jobs/<batch id>/`:

- `batch.json`: the batch object as last written, its owner and the caller it runs as (the
  tenant and key name, never a key), written atomically (durable.py) at every status change;
- `input.jsonl`: the batch's own copy of its requests, made when it is created (the client may
  delete the input file meanwhile);
- `results.jsonl`: append-only, one record per finished request, `{"custom_id", "ok", "line"}`
  where `line` is its output (or error) line in OpenAI's format. A record is fsynced before the
  next request is counted: this file is the per-line done record a resumed batch skips by.

Ids are `batch_` and 32 hex digits, checked against BATCH_ID before any path is built."""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hearth import jsonsafe
from hearth.api.batches.durable import append_record, read_json, read_records, write_atomic, write_json
from hearth.errors import NotFound
from hearth.http.batches.lines import Line, dumps
from hearth.tenants import Caller

BATCH_ID = re.compile(r"^batch_[0-9a-f]{32}$")
TERMINAL = ("failed", "completed", "expired", "cancelled")
LIVE = ("validating", "in_progress", "finalizing", "cancelling")


def batch_not_found(batch_id: str) -> NotFound:
    return NotFound(f"No such Batch object: {batch_id}", param="batch_id", code="not_found")


def caller_json(who: Caller) -> dict[str, Any]:
    return {"tenant": who.tenant, "key_name": who.key_name, "admin": who.admin,
            "shared_cache": who.shared_cache, "via_gateway": who.via_gateway}


def caller_of(obj: dict[str, Any]) -> Caller:
    return Caller(str(obj.get("tenant", "")), obj.get("key_name"), bool(obj.get("admin")),
                  bool(obj.get("shared_cache")), bool(obj.get("via_gateway")))


@dataclass(slots=True)
class Batch:
    """One batch in memory: its object (what the API shows), who owns it and runs it, and the
    custom_ids already finished (from results.jsonl)."""

    dir: Path
    obj: dict[str, Any]
    owner: str
    caller: Caller
    created_ns: int
    done: set[str] = field(default_factory=set)
    completed: int = 0
    failed: int = 0

    @property
    def id(self) -> str:
        return str(self.obj["id"])

    @property
    def status(self) -> str:
        return str(self.obj["status"])

    def public(self) -> dict[str, Any]:
        total = self.obj["request_counts"]["total"]
        return {**self.obj, "request_counts": {"total": total, "completed": self.completed, "failed": self.failed}}

    def save(self) -> None:
        write_json(self.dir / "batch.json", {"batch": self.public(), "owner": self.owner,
                                             "caller": caller_json(self.caller), "created_ns": self.created_ns})

    def lines(self) -> list[Line]:
        out = []
        for i, raw in enumerate((self.dir / "input.jsonl").read_bytes().splitlines()):
            rec = read_json_line(raw)
            out.append(Line(i, str(rec["custom_id"]), str(rec["url"]), dict(rec["body"])))
        return out

    def record(self, custom_id: str, ok: bool, line: dict[str, Any]) -> None:
        """Durably note that request `custom_id` finished with output `line` (once per custom_id)."""
        if custom_id in self.done:
            return
        append_record(self.dir / "results.jsonl", dumps({"custom_id": custom_id, "ok": ok, "line": line}))
        self.done.add(custom_id)
        if ok:
            self.completed += 1
        else:
            self.failed += 1

    def results(self) -> list[dict[str, Any]]:
        return read_records(self.dir / "results.jsonl")


def read_json_line(raw: bytes) -> dict[str, Any]:
    obj = jsonsafe.loads(raw)
    if not isinstance(obj, dict):
        raise ValueError("not a JSON object")
    return obj


class BatchStore:
    def __init__(self, root: Path) -> None:
        self.root = root
        self._batches: dict[str, Batch] = {}
        self._loaded = False

    def _dir(self, batch_id: str) -> Path:
        if not BATCH_ID.fullmatch(batch_id):
            raise batch_not_found(batch_id)
        return self.root / batch_id

    def load(self) -> list[Batch]:
        """Read every batch on disk (once): each one's object and its finished requests."""
        if not self._loaded:
            self._loaded = True
            if self.root.is_dir():
                for name in sorted(os.listdir(self.root)):
                    if name.startswith(".batch_") and name.endswith(".tmp"):  # a creation the process died in
                        shutil.rmtree(self.root / name, ignore_errors=True)
                    elif BATCH_ID.fullmatch(name) and (b := self._read(self.root / name)) is not None:
                        self._batches[b.id] = b
        return list(self._batches.values())

    @staticmethod
    def _read(path: Path) -> Batch | None:
        try:
            rec = read_json(path / "batch.json")
        except (OSError, ValueError):
            return None  # created but never written whole: nothing was promised to anyone
        if not isinstance(rec, dict) or not isinstance(rec.get("batch"), dict):
            return None
        b = Batch(path, rec["batch"], str(rec.get("owner", "")), caller_of(rec.get("caller") or {}),
                  int(rec.get("created_ns") or 0))
        for r in read_records(path / "results.jsonl"):
            b.done.add(str(r.get("custom_id")))
            if r.get("ok"):
                b.completed += 1
            else:
                b.failed += 1
        return b

    def create(self, obj: dict[str, Any], lines: list[Line], owner: str, caller: Caller, created_ns: int) -> Batch:
        self.load()
        path = self._dir(obj["id"])
        tmp = self.root / f".{obj['id']}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        write_atomic(tmp / "input.jsonl", b"".join(dumps({"custom_id": ln.custom_id, "url": ln.url, "body": ln.body})
                                                   for ln in lines))
        b = Batch(tmp, obj, owner, caller, created_ns)
        b.save()
        os.replace(tmp, path)  # the batch exists whole or not at all
        b.dir = path
        self._batches[b.id] = b
        return b

    def get(self, batch_id: str, who: Caller) -> Batch:
        self._dir(batch_id)
        self.load()
        b = self._batches.get(batch_id)
        if b is None or not who.sees(b.owner):
            raise batch_not_found(batch_id)
        return b

    def list(self, who: Caller) -> list[Batch]:
        """The batches `who` sees, newest first."""
        return sorted((b for b in self.load() if who.sees(b.owner)), key=lambda b: b.created_ns, reverse=True)
