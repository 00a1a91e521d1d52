"""Session and snapshot ids: checked before they reach a path, a query or the engine (the
rules themselves are in `hearth.ids`; these raise the API's 400)."""

from __future__ import annotations

import uuid

from hearth.errors import BadRequest
from hearth.ids import is_session_id, is_snapshot_id


def check_session_id(sid: object, param: str = "session_id") -> str:
    if not is_session_id(sid):
        raise BadRequest("session ids are 1-128 characters of A-Z a-z 0-9 . _ - (not only dots)",
                         param=param, code="invalid_session_id")
    return sid


def check_snapshot_id(snap: object, param: str = "snapshot_id") -> str:
    if not is_snapshot_id(snap):
        raise BadRequest("snapshot ids look like snap_ followed by 32 hex digits", param=param,
                         code="invalid_snapshot_id")
    return snap


def new_session_id() -> str:
    return f"sess_{uuid.uuid4().hex}"


def new_snapshot_id() -> str:
    return f"snap_{uuid.uuid4().hex}"
