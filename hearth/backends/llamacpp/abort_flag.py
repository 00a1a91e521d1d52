"""A flag that stops a running `llama_decode` from any thread, without the GIL.

llama.cpp calls its abort callback on the compute thread after every graph node (hundreds of
times per decode). A ctypes Python callback would take the GIL each time, racing the event
loop for it; instead the callback is three lines of C (`abort_flag.c`) that read one int, and
`AbortFlag.set()` writes that int from whichever thread wants the decode to stop.

The shared library is compiled once by `scripts/setup.sh` (`python -m hearth.backends.llamacpp.abort_flag`)
into `$HEARTH_CACHE/native/` (default `~/.cache/hearth/native/`), named by the source's hash so
an edit rebuilds it. If it is missing at run time it is built then (a C compiler takes well
under a second); without a compiler the runner simply cannot stop a decode midway, and
cancellation falls back to the next step boundary.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

log = logging.getLogger("hearth.llamacpp")

SOURCE = Path(__file__).with_name("abort_flag.c")
SYMBOL = "hearth_abort_requested"

_lock = threading.Lock()
_address: int | None = None
_tried = False


def cache_dir() -> Path:
    root = os.environ.get("HEARTH_CACHE")
    return (Path(root) if root else Path.home() / ".cache" / "hearth") / "native"


def library_path() -> Path:
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    return cache_dir() / f"hearth_abort-{digest}.so"


def build() -> Path:
    """Compile the library unless the cached one exists; return its path. Raises RuntimeError
    when there is no C compiler or it fails."""
    path = library_path()
    if path.is_file():
        return path
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise RuntimeError("no C compiler (cc or gcc) to build the decode abort flag")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        proc = subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(tmp), str(SOURCE)],
                              capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            raise RuntimeError(f"{cc} failed to build {SOURCE.name}: {proc.stderr.strip()[-500:]}")
        os.replace(tmp, path)  # atomic: a concurrent build never sees half a library
    finally:
        tmp.unlink(missing_ok=True)
    return path


def callback_address() -> int | None:
    """The C callback's address (built and loaded once per process); None if unavailable."""
    global _address, _tried
    with _lock:
        if not _tried:
            _tried = True
            try:
                lib = ctypes.CDLL(str(build()))
                _address = ctypes.cast(getattr(lib, SYMBOL), ctypes.c_void_p).value
            except (OSError, RuntimeError, subprocess.SubprocessError, AttributeError) as e:
                log.warning("decode abort flag unavailable (cancel waits for the step to end): %s", e)
        return _address


class AbortFlag:
    """One int in native memory: `set()` from any thread makes the running decode stop after
    its current graph node; `clear()` (the engine thread, after the decode) re-arms it."""

    def __init__(self) -> None:
        self._value = ctypes.c_int(0)

    @property
    def address(self) -> int:
        return ctypes.addressof(self._value)

    def set(self) -> None:
        self._value.value = 1

    def clear(self) -> None:
        self._value.value = 0

    def is_set(self) -> bool:
        return self._value.value != 0


if __name__ == "__main__":  # scripts/setup.sh: build (or find) the cached library
    try:
        print(build())
    except RuntimeError as e:
        print(f"abort_flag: {e}", file=sys.stderr)
        sys.exit(1)
