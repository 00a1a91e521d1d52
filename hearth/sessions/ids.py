"""Session and snapshot ids: checked before they reach a path, a query or the engine."""

from __future__ import annotations

import re
import uuid
from typing import TypeGuard

from hearth.errors import BadRequest

SESSION_ID = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
SNAPSHOT_ID = re.compile(r"^snap_[0-9a-f]{32}$")


def is_session_id(sid: object) -> TypeGuard[str]:
    """The one rule for session ids, which also name files (swapped KV). "." and ".." match
    the character class but name directories, so they are refused too."""
    return isinstance(sid, str) and SESSION_ID.fullmatch(sid) is not None and set(sid) != {"."}


def check_session_id(sid: object, param: str = "session_id") -> str:
    if not is_session_id(sid):
        raise BadRequest("session ids are 1-128 characters of A-Z a-z 0-9 . _ - (not only dots)",
                         param=param, code="invalid_session_id")
    return sid


def check_snapshot_id(snap: object, param: str = "snapshot_id") -> str:
    if not isinstance(snap, str) or not SNAPSHOT_ID.fullmatch(snap):
        raise BadRequest("snapshot ids look like snap_ followed by 32 hex digits", param=param,
                         code="invalid_snapshot_id")
    return snap


def new_session_id() -> str:
    return f"sess_{uuid.uuid4().hex}"


def new_snapshot_id() -> str:
    return f"snap_{uuid.uuid4().hex}"
