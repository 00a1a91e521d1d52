"""Writing files so that a crash (or `kill -9`) leaves either the old or the new whole file:
write a temporary file in the same folder, fsync it, rename it over the target, fsync the
folder. And an append-only record file whose torn last line (a crash mid-append) is dropped on
reading, never taken for a record."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from hearth import jsonsafe


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def write_json(path: Path, obj: Any) -> None:
    write_atomic(path, json.dumps(obj, ensure_ascii=False, indent=1).encode())


def read_json(path: Path) -> Any:
    return jsonsafe.loads(path.read_bytes())


def append_record(path: Path, line: bytes) -> None:
    """Append one newline-terminated record and fsync it: once this returns, it is on disk."""
    with open(path, "ab") as f:
        f.write(line)
        f.flush()
        os.fsync(f.fileno())


def read_records(path: Path) -> list[dict[str, Any]]:
    """The whole records of an append-only file. A torn tail (no newline, or not JSON: the
    process died mid-append) is cut off the file, so the next append starts a clean line."""
    if not path.exists():
        return []
    data = path.read_bytes()
    out: list[dict[str, Any]] = []
    good = 0
    for raw in data.split(b"\n")[:-1]:  # the part after the last newline is never a whole record
        try:
            rec = jsonsafe.loads(raw)
        except jsonsafe.JSONRejected:
            break
        if not isinstance(rec, dict):
            break
        out.append(rec)
        good += len(raw) + 1
    if good != len(data):
        with open(path, "r+b") as f:
            f.truncate(good)
            os.fsync(f.fileno())
    return out
