"""A test-only hook that holds a model's load while a test looks at the server mid-load.

Read only when the environment variable `HEARTH_TEST_LOAD_GATE` names a folder (never set
in normal use): a load of model `<id>` that finds `<folder>/<id>.hold` writes
`<folder>/<id>.waiting` and waits, in the loader's worker thread, until the `.hold` file is
removed, then loads as usual (and removes `.waiting`). An e2e test can then cancel a request,
or read a stream's opening events, while the load is certainly under way, and decide when it
ends: no race with how long a real load takes.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

ENV = "HEARTH_TEST_LOAD_GATE"
POLL = 0.01  # seconds between looks at the .hold file (in the loader's thread, not the event loop)
MAX_HOLD = 600.0  # a test that died holding the gate must not hang the server's shutdown forever
_SAFE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def hold_path(folder: Path, model_id: str) -> Path:
    return folder / f"{model_id}.hold"


def waiting_path(folder: Path, model_id: str) -> Path:
    return folder / f"{model_id}.waiting"


def wait_at_gate(model_id: str) -> None:
    """Block while the test holds this model's load (see the module's docstring); at once otherwise."""
    folder = os.environ.get(ENV)
    if not folder or not _SAFE_ID.fullmatch(model_id):
        return
    hold, waiting = hold_path(Path(folder), model_id), waiting_path(Path(folder), model_id)
    if not hold.exists():
        return
    waiting.touch()
    try:
        deadline = time.monotonic() + MAX_HOLD
        while hold.exists() and time.monotonic() < deadline:
            time.sleep(POLL)
    finally:
        waiting.unlink(missing_ok=True)
