"""The id rules every layer shares. Pure predicates (no errors, no I/O), so the engine can
check the ids that name its files without importing the HTTP-facing `sessions` package."""

from __future__ import annotations

import re
from typing import TypeGuard

SESSION_ID = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
SNAPSHOT_ID = re.compile(r"^snap_[0-9a-f]{32}$")


def is_session_id(sid: object) -> TypeGuard[str]:
    """The one rule for session ids, which also name files (swapped KV). "." and ".." match
    the character class but name directories, so they are refused too."""
    return isinstance(sid, str) and SESSION_ID.fullmatch(sid) is not None and set(sid) != {"."}


def is_snapshot_id(snap: object) -> TypeGuard[str]:
    return isinstance(snap, str) and SNAPSHOT_ID.fullmatch(snap) is not None
