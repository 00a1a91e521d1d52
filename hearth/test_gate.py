"""A test-only hook that holds the server at a named point while a test looks at it there.

Read only when the environment variable `HEARTH_TEST_GATE` names a folder (never set in normal
use): code that reaches `wait_at_gate(point)` and finds `<folder>/<point>.hold` writes
`<folder>/<point>.waiting` and waits, in its own (worker) thread, until the `.hold` file is
removed, then goes on as usual (and removes `.waiting`). An e2e test can then act while the
server is certainly at that point (cancel a request mid-load, kill the process mid-write) and
decide when it goes on: no race with how long the real work takes.

The points: a model's id (its load, `backends/local/model.py`); `snapshot-write` (a snapshot's
files written to its temporary folder, before its manifest and rename, `sessions/snapshots.py`);
`ollama-line-<i>` (before line i of an Ollama NDJSON stream, `api/ollama/replies.py`);
`prefill-chunk-<k>` (the engine thread, after a step that ran some request's k-th prompt chunk
with more of its prompt to go, `engine/engine.py`: what arrives meanwhile meets that prompt
half done at the next step boundary).
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

ENV = "HEARTH_TEST_GATE"
POLL = 0.01  # seconds between looks at the .hold file (in the waiting thread, never the event loop)
MAX_HOLD = 600.0  # a test that died holding the gate must not hang the server's shutdown forever
_SAFE_POINT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
SNAPSHOT_WRITE = "snapshot-write"


def hold_path(folder: Path, point: str) -> Path:
    return folder / f"{point}.hold"


def waiting_path(folder: Path, point: str) -> Path:
    return folder / f"{point}.waiting"


def wait_at_gate(point: str) -> None:
    """Block while the test holds this point (see the module's docstring); at once otherwise."""
    folder = os.environ.get(ENV)
    if not folder or not _SAFE_POINT.fullmatch(point):
        return
    hold, waiting = hold_path(Path(folder), point), waiting_path(Path(folder), point)
    if not hold.exists():
        return
    waiting.touch()
    try:
        deadline = time.monotonic() + MAX_HOLD
        while hold.exists() and time.monotonic() < deadline:
            time.sleep(POLL)
    finally:
        waiting.unlink(missing_ok=True)
