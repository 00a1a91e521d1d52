"""Session and snapshot ids: checked before they reach a path, a query or the engine (the
rules themselves are in `hearth.ids`; these raise the API's 400)."""

from __future__ import annotations

import uuid

from hearth.errors import BadRequest
from hearth.ids import is_session_id, is_snapshot_id
from hearth.tenants import Caller, session_prefix


def check_session_id(sid: object, param: str = "session_id") -> str:
    if not is_session_id(sid):
        raise BadRequest("session ids are 1-128 characters of A-Z a-z 0-9 . _ - (not only dots)",
                         param=param, code="invalid_session_id")
    return sid


def stored_session_id(caller: Caller, sid: object, param: str = "session_id") -> str:
    """The stored id of the session `caller` names `sid` (hearth.tenants, `Caller.session_key`),
    checked: an id too long to hold its tenant's prefix is a 400, whatever any tenant holds."""
    key = caller.session_key(check_session_id(sid, param))
    if not is_session_id(key):
        room = 128 - len(session_prefix(caller.tenant))
        raise BadRequest(f"a session id chosen with a tenant's key is at most {room} characters", param=param,
                         code="invalid_session_id")
    return key


def check_snapshot_id(snap: object, param: str = "snapshot_id") -> str:
    if not is_snapshot_id(snap):
        raise BadRequest("snapshot ids look like snap_ followed by 32 hex digits", param=param,
                         code="invalid_snapshot_id")
    return snap


def new_session_id() -> str:
    return f"sess_{uuid.uuid4().hex}"


def new_snapshot_id() -> str:
    return f"snap_{uuid.uuid4().hex}"
